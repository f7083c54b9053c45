"""Where to cut: the stage plan for a (batchable, shape-inferred) ONNX graph.

Rules, in order:
1. Constant subgraphs (initializers, Constant nodes, nodes computed only from constants such as the
   ConstantOfShape weights of the onnx model zoo's light_* files) are not placed: each stage gets its own copy of
   the constants it uses, so weights shared by several stages simply appear in each.
2. The remaining nodes keep the graph's topological order (seq2seq: encoder part first, then decoder part). A cut
   between two consecutive nodes is *allowed* if every activation crossing it has the batch as its first
   dimension, and its *width* is the number of activations crossing it.
3. Candidate cuts have the smallest width found between two heavy nodes (Conv, MatMul, Gemm, ...) of the same
   part, or at most ``max_cross``. Inside a residual block the shortcut keeps the width at 2, so a block is never
   cut; between blocks the width is 1.
4. Granularity: by default a piece without a heavy node joins its neighbour (a lone Relu is no stage);
   ``max_stages`` balances FLOPs over exactly that many stages; ``min_stage_cost`` grows stages to a FLOP floor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import onnx

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import StageType

from .batchable import BATCH, shape_table

HEAVY = {"Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN", "Einsum", "MatMulInteger",
         "QLinearConv", "QLinearMatMul", "ConvInteger", "Attention", "MultiHeadAttention",
         # onnxruntime's fused contrib ops, found in graphs cut after --graph-optimization-level
         "FusedConv", "NhwcConv", "FusedGemm", "FusedMatMul", "QGemm", "DynamicQuantizeMatMul"}
NODE_COST = 1e4  # FLOP-equivalents per node: keeps zero-FLOP pieces from looking free


@dataclass
class Plan:
    model: onnx.ModelProto
    active: list[onnx.NodeProto]           # placed nodes, in execution order
    const_nodes: list[onnx.NodeProto]      # nodes computed from constants only, copied where needed
    part: list[int]                        # part (0 = encoder / whole model, 1 = decoder) of each active node
    stages: list[list[int]]                # active-node positions of each stage
    stage_types: list[StageType]
    flops: list[float]                     # per active node, batch 1
    max_stages: int                        # the finest split the graph allows (number of candidate pieces)
    shapes: dict[str, tuple[int, Any]] = field(default_factory=dict)
    widths: list[int] = field(default_factory=list)  # width of the cut before each stage (0 for stage 0)


def parse_cost(text: str | float) -> float:
    """'5e6', '50M', '1.5G' (FLOPs per sample) -> float."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]?)\s*(?:flops?)?\s*", str(text))
    if not m:
        raise ConfigError(f"--min-stage-cost {text!r} is not a number of FLOPs; write e.g. 5e8, 500M or 1.5G")
    mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    return float(m.group(1)) * mult


def _numel(dims: Any) -> float:
    if not dims:
        return 1.0
    return float(math.prod(d if isinstance(d, int) and d > 0 else 1 for d in dims))


def node_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, Any]]) -> float:
    """Rough per-sample FLOPs (2 per multiply-add) from inferred shapes; batch and unknown dims count as 1."""
    def dims(name: str) -> Any:
        return shapes.get(name, (0, None))[1]
    out = dims(node.output[0]) if node.output else None
    if node.op_type in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "FusedConv"):
        w = dims(node.input[3] if node.op_type == "QLinearConv" else node.input[1])
        ref = dims(node.input[0]) if node.op_type == "ConvTranspose" else out
        return 2.0 * _numel(ref) * (_numel(w[1:]) if w else 1.0)
    if node.op_type in ("MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "FusedGemm", "FusedMatMul", "QGemm"):
        a = dims(node.input[0])
        k = 1
        if a:
            trans_a = (node.op_type in ("Gemm", "FusedGemm", "QGemm")
                       and any(x.name == "transA" and x.i for x in node.attribute))
            kd = a[0] if trans_a else a[-1]
            k = kd if isinstance(kd, int) and kd > 0 else 1
        return 2.0 * _numel(out) * k
    return _numel(out)


def _const_split(graph: onnx.GraphProto) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto], set[str]]:
    const = {t.name for t in graph.initializer}
    const_nodes, active = [], []
    for node in graph.node:
        ins = [i for i in node.input if i]
        is_const = (not node.op_type.startswith("Random") and (ins or node.op_type == "Constant")
                    and all(i in const for i in ins))
        if is_const:
            const.update(o for o in node.output if o)
            const_nodes.append(node)
        else:
            active.append(node)
    return const_nodes, active, const


def _parts(active: list[onnx.NodeProto], seq2seq: dict[str, Any] | None) -> list[int]:
    if not seq2seq:
        return [0] * len(active)
    producer = {o: i for i, n in enumerate(active) for o in n.output if o}

    def ancestors(outputs: list[str]) -> set[int]:
        seen: set[int] = set()
        stack = [producer[o] for o in outputs if o in producer]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(producer[t] for t in active[i].input if t in producer)
        return seen

    enc = ancestors(list(seq2seq["encoder"]["outputs"]))
    dec = ancestors(list(seq2seq["decoder"]["outputs"]))
    both = enc & dec
    if both:
        n = active[min(both)]
        raise ConfigError(f"node {n.name!r} feeds both encoder and decoder outputs; the lazybatch.seq2seq metadata "
                          "must name disjoint encoder and decoder graphs")
    return [1 if i in dec else 0 for i in range(len(active))]


def _balanced(costs: list[float], k: int) -> list[int]:
    """Split costs (one part) into exactly k contiguous groups minimising the largest group; returns group starts."""
    def greedy(cap: float) -> list[int]:
        starts, acc = [0], 0.0
        for i, c in enumerate(costs):
            if acc + c > cap and i > starts[-1]:
                starts.append(i)
                acc = 0.0
            acc += c
        return starts
    lo, hi = max(costs), sum(costs)
    for _ in range(60):
        mid = (lo + hi) / 2
        if len(greedy(mid)) <= k:
            hi = mid
        else:
            lo = mid
    starts = greedy(hi)
    while len(starts) < k:  # split the costliest multi-piece group until there are exactly k
        bounds = starts + [len(costs)]
        best = max((j for j in range(len(starts)) if bounds[j + 1] - bounds[j] > 1),
                   key=lambda j: sum(costs[bounds[j]:bounds[j + 1]]))
        a, b = bounds[best], bounds[best + 1]
        total, acc, cut = sum(costs[a:b]), 0.0, a + 1
        for i in range(a, b - 1):
            acc += costs[i]
            if acc >= total / 2:
                cut = i + 1
                break
        starts = sorted(set(starts + [cut]))
    return starts


def _cut_widths(active: list[onnx.NodeProto], shapes: dict[str, tuple[int, Any]]) -> tuple[list[int], list[bool]]:
    """width[c]: activations crossing the cut before position c; forbidden[c]: one of them lacks a batch dim."""
    n = len(active)
    producer = {o: i for i, nd in enumerate(active) for o in nd.output if o}
    last_use: dict[str, int] = {}
    for i, nd in enumerate(active):
        for t in nd.input:
            if t in producer:
                if producer[t] > i:
                    raise ConfigError(f"node {nd.name!r} uses {t!r} before it is computed; the graph is not in "
                                      "topological order: re-export it, or sort its nodes topologically")
                last_use[t] = i
    width = [0] * (n + 1)
    forbidden = [False] * (n + 1)
    for t, p in producer.items():
        end = last_use.get(t, p)
        if end <= p:
            continue
        dims = shapes.get(t, (0, None))[1]
        batchy = dims is None or (len(dims) > 0 and (dims[0] == BATCH or dims[0] is None
                                                     or (isinstance(dims[0], str) and dims[0].startswith("unk"))))
        for c in range(p + 1, end + 1):
            width[c] += 1
            if not batchy:
                forbidden[c] = True
    return width, forbidden


def _candidate_cuts(part: list[int], heavy: list[bool], width: list[int], forbidden: list[bool],
                    max_cross: int | None) -> list[int]:
    """Cuts at the narrowest width between heavy nodes of each part (or width <= max_cross), plus part borders."""
    n = len(part)
    cuts = {c for c in range(1, n) if part[c] != part[c - 1]}
    for q in sorted(set(part)):
        idx = [i for i in range(n) if part[i] == q]
        lo_i, hi_i = idx[0], idx[-1]
        inner = [c for c in range(lo_i + 1, hi_i + 1) if not forbidden[c]]
        if max_cross is not None:
            cuts.update(c for c in inner if width[c] <= max_cross)
            continue
        between = [c for c in inner if any(heavy[lo_i:c]) and any(heavy[c:hi_i + 1])]
        if between:
            m = min(width[c] for c in between)
            cuts.update(c for c in inner if width[c] <= m)
    return sorted(cuts)


def _group(qp: list[int], cost: list[float], piece_heavy: list[bool], *, k: int | None,
           min_stage_cost: float | None) -> list[list[int]]:
    """Group the pieces ``qp`` of one part into stages by one of the three granularity rules."""
    if k is not None:
        starts = _balanced([cost[j] for j in qp], k)
        return [qp[a:b] for a, b in zip(starts, starts[1:] + [len(qp)])]
    groups: list[list[int]] = []
    if min_stage_cost is not None:
        cur: list[int] = []
        acc = 0.0
        for j in qp:
            cur.append(j)
            acc += cost[j]
            if acc >= min_stage_cost:
                groups.append(cur)
                cur, acc = [], 0.0
        if cur:
            if groups:
                groups[-1] += cur
            else:
                groups.append(cur)
        return groups
    for j in qp:
        if groups and (not piece_heavy[j] or not any(piece_heavy[x] for x in groups[-1])):
            groups[-1].append(j)  # a light piece joins its predecessor; a leading light piece, the first heavy one
        else:
            groups.append([j])
    return groups


def make_plan(model: onnx.ModelProto, seq2seq: dict[str, Any] | None = None, *, max_stages: int | None = None,
              min_stage_cost: float | None = None, max_cross: int | None = None,
              shapes: dict[str, tuple[int, Any]] | None = None,
              sizes: dict[str, list[int]] | None = None) -> Plan:
    """Where to cut ``model`` (see the module docstring); raises ConfigError for graphs that cannot be split.

    ``sizes``: concrete dims at the example input sizes (probe.probe) for tensors whose ``shapes`` are symbolic;
    FLOPs are counted on them, so that an image model with a dynamic height and width is balanced by its real
    per-layer cost rather than by channel counts alone."""
    g = model.graph
    shapes = shapes if shapes is not None else shape_table(model)
    flop_shapes = dict(shapes)
    for t, dims in (sizes or {}).items():
        flop_shapes[t] = (shapes.get(t, (0, None))[0], dims)
    const_nodes, active, _const = _const_split(g)
    part = _parts(active, seq2seq)
    order = sorted(range(len(active)), key=lambda i: (part[i], i))  # stable: encoder first, then decoder
    active = [active[i] for i in order]
    part = [part[i] for i in order]
    n = len(active)
    if n == 0:
        raise ConfigError("the graph computes nothing from its inputs (every node is constant); there is nothing "
                          "to split: serve it as it is")
    produced_by_nodes = {o for nd in active for o in nd.output if o}
    for vi in g.output:
        if vi.name not in produced_by_nodes:
            raise ConfigError(f"graph output {vi.name!r} is a constant or a graph input passed straight through, "
                              "not computed by any stage; remove it from the outputs (or compute it) and split "
                              "again")
    flops = [node_flops(nd, flop_shapes) for nd in active]
    heavy = [nd.op_type in HEAVY for nd in active]
    width, forbidden = _cut_widths(active, shapes)
    bounds = [0] + _candidate_cuts(part, heavy, width, forbidden, max_cross) + [n]
    pieces = [list(range(bounds[j], bounds[j + 1])) for j in range(len(bounds) - 1)]
    cost = [sum(flops[i] + NODE_COST for i in p) for p in pieces]
    piece_heavy = [any(heavy[i] for i in p) for p in pieces]
    piece_part = [part[p[0]] for p in pieces]
    parts = sorted(set(piece_part))
    if max_stages is not None:
        if max_stages < len(parts):
            raise ConfigError(f"--max-stages {max_stages} is fewer than the {len(parts)} separate graphs (encoder "
                              f"and decoder) in this model; ask for at least {len(parts)}")
        if max_stages > len(pieces):
            raise ConfigError(f"--max-stages {max_stages} is more than this graph allows: it can be cut into at most "
                              f"{len(pieces)} stages at layer boundaries; ask for {len(pieces)} or fewer")
        share = _share(max_stages, [sum(c for c, q in zip(cost, piece_part) if q == r) for r in parts],
                       [piece_part.count(r) for r in parts])
    groups: list[list[int]] = []  # lists of piece indices
    for qi, q in enumerate(parts):
        qp = [j for j in range(len(pieces)) if piece_part[j] == q]
        groups += _group(qp, cost, piece_heavy, k=share[qi] if max_stages is not None else None,
                         min_stage_cost=min_stage_cost)
    stages = [[i for j in grp for i in pieces[j]] for grp in groups]
    stype: list[StageType] = []
    for st in stages:
        if seq2seq and part[st[0]] == 1:
            stype.append(StageType.DECODER)
        elif seq2seq and seq2seq["encoder"].get("runs") == "per_token":
            stype.append(StageType.ENCODER)
        else:
            stype.append(StageType.STATIC)
    widths = [0] + [width[st[0]] for st in stages[1:]]
    return Plan(model, active, const_nodes, part, stages, stype, flops, len(pieces), shapes, widths)


def _share(k: int, part_costs: list[float], part_pieces: list[int]) -> list[int]:
    """Distribute k stages over parts in proportion to cost (each part >= 1, <= its pieces)."""
    total = sum(part_costs) or 1.0
    share = [max(1, min(p, round(k * c / total))) for c, p in zip(part_costs, part_pieces)]
    while sum(share) > k:
        j = max((i for i in range(len(share)) if share[i] > 1), key=lambda i: share[i] / part_costs[i])
        share[j] -= 1
    while sum(share) < k:
        j = min((i for i in range(len(share)) if share[i] < part_pieces[i]),
                key=lambda i: share[i] / max(part_costs[i], 1e-9))
        share[j] += 1
    return share
