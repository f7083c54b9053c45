"""Per-stage latency lookup table: stage x batch size -> seconds.

This is the one file format that ties the project together: ``lazybatch profile`` writes it from onnxruntime
measurements, the NPU model writes it from its timing model, the simulator's executor and the slack predictor read
it. Two encodings carry the same content (see docs/formats.md):

JSON::

    {"format": "lazybatch.latency_table/1", "model": "resnet50", "unit": "s",
     "provenance": "where the numbers come from",
     "batch_sizes": [1, 2, 4, 8],
     "stages": [{"name": "stem", "type": "STATIC", "latency": [0.0011, 0.0012, 0.0013, 0.0016]}, ...]}

CSV (one row per stage and measured batch size, stages in graph order)::

    stage,type,batch_size,latency_s
    stem,STATIC,1,0.0011

Batch sizes between measured ones are linearly interpolated; the table answers up to its largest measured size.

``LatencyTable.monotone()`` (and the row function ``monotone_row``) fits a table to the two shapes a batched stage
has: latency non-decreasing in batch size, latency per sample non-increasing. Profiles taken on a busy machine have
isolated spikes, and the scheduler compares batch sizes, so an unfitted row makes it prefer odd sizes.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import ConfigError
from .graph import ModelGraph, Stage, StageType

FORMAT = "lazybatch.latency_table/1"
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def isotonic(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """Least-squares non-decreasing fit of ``values`` (pool adjacent violators; equal weights unless given).

    Why: one spike in a profiled row (a burst of background load during one batch size) would otherwise claim that
    a larger batch is cheaper than a smaller one, and a scheduler comparing batch sizes would chase that dip. PAV
    replaces every decreasing run by its (weighted) mean, so a single spike is spread over the sizes it disagrees
    with instead of being kept or dropped; a row that is already non-decreasing comes back unchanged. O(n)."""
    vals = [float(v) for v in values]
    ws = [1.0] * len(vals) if weights is None else [float(w) for w in weights]
    if len(ws) != len(vals):
        raise ValueError(f"{len(ws)} weights for {len(vals)} values")
    # blocks of pooled values: [mean, total weight, count]
    blocks: list[list[float]] = []
    for v, w in zip(vals, ws):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks[-1]
            tw = w1 + w2
            blocks[-1] = [(m1 * w1 + m2 * w2) / tw if tw > 0 else (m1 + m2) / 2, tw, n1 + n2]
    out: list[float] = []
    for m, _, n in blocks:
        out.extend([m] * int(n))
    return out


def monotone_row(batch_sizes: Sequence[int], values: Sequence[float]) -> list[float]:
    """One stage row (``values[k]`` at increasing ``batch_sizes[k]``) fitted to what batching can do: the isotonic
    fit (latency never falls as the batch grows), then ``v[k] <= v[k-1] * b[k] / b[k-1]`` from small to large (a
    larger batch never costs more per sample than a smaller one: it could at worst run as smaller batches).

    The clamp keeps the row non-decreasing (it lowers ``v[k]`` at most to ``v[k-1]`` times a factor >= 1), and
    linear interpolation between two such points keeps both properties at every batch size in between, so the dense
    table satisfies them too."""
    if len(batch_sizes) != len(values):
        raise ValueError(f"{len(values)} values for {len(batch_sizes)} batch sizes")
    if any(b1 <= b0 for b0, b1 in zip(batch_sizes, batch_sizes[1:])):
        raise ValueError(f"batch sizes must increase: {list(batch_sizes)}")
    out = isotonic(values)
    for k in range(1, len(out)):
        cap = out[k - 1] * batch_sizes[k] / batch_sizes[k - 1]
        if out[k] > cap:
            out[k] = cap
    return out


class LatencyTable:
    """Latencies of every stage at every batch size from 1 to ``max_batch_size``.

    ``dense[s][b]`` is the latency in seconds of stage ``s`` at batch size ``b`` (index 0 unused), precomputed so
    that the simulator and the predictors pay one list lookup per query.
    """

    __slots__ = ("graph", "batch_sizes", "measured", "dense", "single", "provenance", "meta")

    def __init__(
        self,
        graph: ModelGraph,
        batch_sizes: Sequence[int],
        latencies: Sequence[Sequence[float]],
        *,
        provenance: str = "",
        meta: Mapping[str, Any] | None = None,
        source: str | None = None,
    ) -> None:
        sizes = list(batch_sizes)
        if not sizes:
            raise ConfigError("at least one batch size is needed, and it must include 1", field="batch_sizes",
                              source=source)
        for b in sizes:
            if not isinstance(b, int) or isinstance(b, bool) or b < 1:
                raise ConfigError(f"batch sizes must be positive integers, got {b!r}", field="batch_sizes",
                                  source=source)
        if len(set(sizes)) != len(sizes):
            raise ConfigError(f"batch sizes repeat: {sizes}", field="batch_sizes", source=source)
        if 1 not in sizes:
            raise ConfigError("batch size 1 is missing; the slack predictor needs single-input latencies",
                              field="batch_sizes", source=source)
        if len(latencies) != graph.n:
            raise ConfigError(f"{len(latencies)} latency rows for {graph.n} stages", field="stages", source=source)
        order = sorted(range(len(sizes)), key=sizes.__getitem__)
        sizes_sorted = [sizes[i] for i in order]
        measured: list[list[float]] = []
        for s, row in enumerate(latencies):
            name = graph.stages[s].name
            if len(row) != len(sizes):
                raise ConfigError(
                    f"stage {name!r} has {len(row)} latencies for {len(sizes)} batch sizes {sizes}",
                    field=f"stages[{s}].latency", source=source)
            vals = []
            for b, v in zip(sizes, row):
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                    raise ConfigError(f"stage {name!r} at batch size {b}: latency must be a positive number, "
                                      f"got {v!r}", field=f"stages[{s}].latency", source=source)
                vals.append(float(v))
            measured.append([vals[i] for i in order])
        self.graph = graph
        self.batch_sizes: tuple[int, ...] = tuple(sizes_sorted)
        self.measured = measured
        self.provenance = provenance
        self.meta = dict(meta or {})
        self.dense: list[list[float]] = [self._densify(row) for row in measured]
        self.single: list[float] = [row[1] for row in self.dense]

    # ------------------------------------------------------------------ queries
    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    @property
    def name(self) -> str:
        return self.graph.name

    def latency(self, stage: int, batch_size: int) -> float:
        if not 1 <= batch_size <= self.max_batch_size:
            raise ValueError(f"batch size {batch_size} outside the table's range 1..{self.max_batch_size} "
                             f"for {self.name}; profile larger batch sizes or lower max_batch_size")
        return self.dense[stage][batch_size]

    def whole_graph_latency(self, batch_size: int = 1, enc_steps: int = 1, dec_steps: int = 1) -> float:
        return sum(self.dense[s][batch_size] for s in self.graph.stage_visits(enc_steps, dec_steps))

    def _densify(self, row: list[float]) -> list[float]:
        sizes = self.batch_sizes
        out = [0.0] * (sizes[-1] + 1)
        for k in range(len(sizes)):
            out[sizes[k]] = row[k]
            if k + 1 < len(sizes):
                b0, b1, v0, v1 = sizes[k], sizes[k + 1], row[k], row[k + 1]
                for b in range(b0 + 1, b1):
                    out[b] = v0 + (v1 - v0) * (b - b0) / (b1 - b0)
        return out

    def monotone(self) -> "LatencyTable":
        """A new table whose every stage row is fitted by ``monotone_row``: non-decreasing in batch size, and
        non-increasing in latency per sample (same graph, batch sizes and provenance; ``meta`` gains
        ``"monotone_fit": true``). A row that already has both shapes is kept exactly.

        Why: a profile on a busy machine has isolated spikes (one batch size measured during a burst of other work).
        The scheduler decides by comparing batch sizes (how long a sub-batch of b takes against b single-input
        runs, whether merging pays), so a non-monotone row makes it prefer odd batch sizes that only looked cheap
        while the machine was quiet."""
        sizes = list(self.batch_sizes)
        rows = [monotone_row(sizes, row) for row in self.measured]
        return LatencyTable(self.graph, sizes, rows, provenance=self.provenance,
                            meta={**self.meta, "monotone_fit": True})

    def bucketed(self, buckets: Sequence[int], stages: Sequence[int] | None = None) -> "LatencyTable":
        """A new table in which each of ``stages`` (default: all) costs at batch size b what it costs at the smallest
        bucket >= b: a step function, as a stage that replays one CUDA graph per bucket, padded, costs. Sizes above
        the largest bucket keep their own latency. ``meta`` gains ``"buckets"``."""
        steps = sorted(buckets)
        pick = set(range(self.graph.n) if stages is None else stages)
        sizes = list(range(1, self.max_batch_size + 1))

        def at(s: int, b: int) -> float:
            if s in pick:
                b = next((k for k in steps if k >= b and k <= self.max_batch_size), b)
            return self.dense[s][b]

        rows = [[at(s, b) for b in sizes] for s in range(self.graph.n)]
        return LatencyTable(self.graph, sizes, rows, provenance=self.provenance,
                            meta={**self.meta, "buckets": steps})

    def is_monotone(self, rel_tol: float = 1e-9) -> bool:
        """True when every row is non-decreasing and non-increasing per sample (within ``rel_tol``)."""
        sizes = self.batch_sizes
        for row in self.measured:
            for k in range(1, len(row)):
                if row[k] < row[k - 1] * (1 - rel_tol):
                    return False
                if row[k] / sizes[k] > row[k - 1] / sizes[k - 1] * (1 + rel_tol):
                    return False
        return True

    def check_covers(self, max_batch_size: int) -> None:
        if max_batch_size > self.max_batch_size:
            raise ConfigError(
                f"the latency table of {self.name} covers batch sizes up to {self.max_batch_size}, but "
                f"max_batch_size is {max_batch_size}; profile larger batch sizes or lower max_batch_size",
                field="max_batch_size")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.graph.name,
            "unit": "s",
            "provenance": self.provenance,
            **({"meta": self.meta} if self.meta else {}),
            "batch_sizes": list(self.batch_sizes),
            "stages": [
                {"name": st.name, "type": st.type.value, "latency": [float(v) for v in self.measured[st.index]]}
                for st in self.graph.stages
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> "LatencyTable":
        if not isinstance(data, Mapping):
            raise ConfigError("expected a JSON object", source=source)
        fmt = data.get("format", FORMAT)
        if fmt != FORMAT:
            raise ConfigError(f"unsupported format {fmt!r}; expected {FORMAT!r}", field="format", source=source)
        unit = data.get("unit", "s")
        if unit not in _UNITS:
            raise ConfigError(f"unknown unit {unit!r}; use one of {', '.join(_UNITS)}", field="unit", source=source)
        scale = _UNITS[unit]
        stages = data.get("stages")
        if not isinstance(stages, list) or not stages:
            raise ConfigError("a non-empty list of stages is required", field="stages", source=source)
        sizes = data.get("batch_sizes")
        if not isinstance(sizes, list):
            raise ConfigError("a list of batch sizes is required", field="batch_sizes", source=source)
        built, rows = [], []
        for i, st in enumerate(stages):
            if not isinstance(st, Mapping):
                raise ConfigError("each stage must be an object with name, type and latency",
                                  field=f"stages[{i}]", source=source)
            for key in ("name", "latency"):
                if key not in st:
                    raise ConfigError(f"missing {key!r}", field=f"stages[{i}].{key}", source=source)
            stype = StageType.parse(st.get("type", "STATIC"), field=f"stages[{i}].type", source=source)
            built.append(Stage(i, str(st["name"]), stype))
            lat = st["latency"]
            if isinstance(lat, Mapping):  # {"1": 0.001, "2": ...} is accepted too
                missing = [b for b in sizes if str(b) not in lat and b not in lat]
                if missing:
                    raise ConfigError(f"stage {st['name']!r} has no latency for batch sizes {missing}",
                                      field=f"stages[{i}].latency", source=source)
                lat = [lat.get(str(b), lat.get(b)) for b in sizes]
            if not isinstance(lat, list):
                raise ConfigError("latency must be a list (one value per batch size)",
                                  field=f"stages[{i}].latency", source=source)
            rows.append([v * scale if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in lat])
        try:
            graph = ModelGraph(str(data.get("model", "model")), built)
        except ConfigError as e:
            raise e.at(source) from None
        return cls(graph, sizes, rows, provenance=str(data.get("provenance", "")), meta=data.get("meta"),
                   source=source)

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["stage", "type", "batch_size", "latency_s"])
        for st in self.graph.stages:
            for b, v in zip(self.batch_sizes, self.measured[st.index]):
                w.writerow([st.name, st.type.value, b, repr(v)])
        return buf.getvalue()

    @classmethod
    def from_csv(cls, text: str, *, model: str = "model", source: str | None = None) -> "LatencyTable":
        reader = csv.DictReader(io.StringIO(text))
        need = {"stage", "batch_size", "latency_s"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise ConfigError(f"CSV header must contain {sorted(need)} (and optionally 'type'), got "
                              f"{reader.fieldnames}", field="header", source=source)
        order: list[str] = []
        types: dict[str, str] = {}
        values: dict[str, dict[int, float]] = {}
        for line, row in enumerate(reader, start=2):
            name = (row.get("stage") or "").strip()
            if not name:
                raise ConfigError(f"line {line}: empty stage name", field="stage", source=source)
            try:
                b = int(row["batch_size"])
                v = float(row["latency_s"])
            except (TypeError, ValueError):
                raise ConfigError(f"line {line}: batch_size must be an integer and latency_s a number, got "
                                  f"{row.get('batch_size')!r}, {row.get('latency_s')!r}",
                                  field="batch_size/latency_s", source=source) from None
            if name not in values:
                order.append(name)
                values[name] = {}
                types[name] = (row.get("type") or "STATIC").strip()
            values[name][b] = v
        if not order:
            raise ConfigError("no rows", field="stages", source=source)
        sizes = sorted({b for d in values.values() for b in d})
        for name in order:
            missing = [b for b in sizes if b not in values[name]]
            if missing:
                raise ConfigError(f"stage {name!r} has no latency for batch sizes {missing}",
                                  field="batch_size", source=source)
        try:
            graph = ModelGraph(model, [(n, StageType.parse(types[n], source=source)) for n in order])
        except ConfigError as e:
            raise e.at(source) from None
        return cls(graph, sizes, [[values[n][b] for b in sizes] for n in order], source=source)

    @classmethod
    def load(cls, path: str | Path) -> "LatencyTable":
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read latency table: {e.strerror}", source=str(p)) from None
        if p.suffix.lower() == ".csv":
            return cls.from_csv(text, model=p.stem, source=str(p))
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); a latency table "
                              "is a .json or .csv file", source=str(p)) from None
        return cls.from_dict(data, source=str(p))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_csv() if p.suffix.lower() == ".csv" else json.dumps(self.to_dict(), indent=1) + "\n")
        return p
