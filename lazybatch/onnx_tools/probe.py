"""Sizes for the dimensions a model leaves dynamic, and the shapes onnx shape inference could not give.

The splitter runs the model in onnxruntime to fill in shapes, for ``--verify`` and for profiling, and each run
needs concrete inputs. The batch is chosen by each caller; every *other* dynamic dimension (the height and width
of an image in detection and OCR exports, written as -1, left unnamed, or named by a dim_param) needs a size the
model accepts: a 1x1 image makes most detectors fail, and even where it runs it says nothing about the latency of
a real image. :func:`choose_examples` takes the sizes the user gives (``--input-shape NAME=3,640,640``) or tries a
few until the model runs; the manifest records them per input (``example_dims``) so that verify, profile and the
backend's warm-up all use the same ones.

:func:`probe` then runs the model at those sizes. It must not freeze a dynamic dimension: a tensor that is
``[batch, 16, 80, 80]`` at a 320x320 example is ``[batch, 16, H/4, W/4]`` in general, so a dimension is written
as fixed into the stage files only if it stays the same when the dynamic input dimensions change.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from lazybatch.batcher.errors import ConfigError

from .batchable import BATCH, real_inputs

Shapes = dict[str, tuple[int, Any]]  # tensor name -> (elem_type, dims) as batchable.shape_table gives
# Sizes tried, in order, for dynamic dimensions the user did not size: moderate first (an image of 64x64 runs
# through most conv nets; a sequence of 64 through most encoders), then larger, then smaller ones. Nothing larger:
# a failed try can allocate most of a run's memory before the node that refuses the size.
DEFAULT_FILLS = (64, 128, 224, 32, 256, 16, 8, 4, 2, 1)
ALT_SCALES = (2.0, 1.5)  # how the probe perturbs the example to tell fixed dimensions from dynamic ones
MAX_PROBE_BYTES = 2_000_000_000 - 50_000_000  # a model must serialise to bytes to be run from memory


def per_sample_dims(vi: onnx.ValueInfoProto) -> list[int | None]:
    """The dimensions after the batch: positive ints, None where dynamic (-1, unnamed or a dim_param)."""
    dims = list(vi.type.tensor_type.shape.dim)[1:]
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]


def dynamic_inputs(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Graph inputs with a dynamic dimension besides the batch: name -> per-sample dims (None = dynamic)."""
    out = {}
    for vi in real_inputs(model.graph):
        dims = per_sample_dims(vi)
        if any(d is None for d in dims):
            out[vi.name] = dims
    return out


def parse_input_shapes(texts: Sequence[str] | None) -> dict[str, list[int]]:
    """``['x=3,640,640', 'mask=640,640']`` -> per-sample sizes by input name (the batch is not written)."""
    out: dict[str, list[int]] = {}
    for text in texts or ():
        name, eq, dims = str(text).rpartition("=")
        try:
            sizes = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            sizes = []
        if not eq or not name or not sizes or min(sizes) < 1:
            raise ConfigError(f"--input-shape {text!r} is not NAME=D1,D2,...: write the input's name and its size per "
                              "sample without the batch, e.g. --input-shape images=3,640,640", field="--input-shape")
        out[name] = sizes
    return out


def random_array(dims: Sequence[int], elem_type: int, rng: np.random.Generator,
                 value_range: Sequence[int] | None = None) -> np.ndarray:
    """Random data of an ONNX element type: floats ~ N(0, 1), integers uniform in ``value_range`` (default 0..1)."""
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    if np.issubdtype(dt, np.floating):
        return rng.standard_normal(list(dims)).astype(dt)
    if dt == np.bool_:
        return rng.random(list(dims)) < 0.5
    lo, hi = value_range or (0, 1)
    return rng.integers(lo, hi + 1, size=list(dims)).astype(dt)


def _feeds(model: onnx.ModelProto, examples: Mapping[str, Sequence[int]], batch: int, seed: int,
           ranges: Mapping[str, list[int]] | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in real_inputs(model.graph):
        sample = examples.get(vi.name) or [d if d is not None else 1 for d in per_sample_dims(vi)]
        feeds[vi.name] = random_array([batch, *sample], vi.type.tensor_type.elem_type, rng,
                                      (ranges or {}).get(vi.name))
    return feeds


def _session(model: onnx.ModelProto) -> Any:
    """A CPU session of ``model`` from memory, or None for a model too large to serialise (over 2 GB). No arena:
    a probe asks for every activation at once, and an arena would keep that peak for the rest of the split."""
    import onnxruntime as ort

    from lazybatch.sessions.threads import session_options

    if model.ByteSize() > MAX_PROBE_BYTES:
        return None
    ort.set_default_logger_severity(4)
    so = session_options(log_severity_level=4)
    so.enable_cpu_mem_arena = False
    return ort.InferenceSession(model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])


def _shapes(sess: Any, targets: list[str], feeds: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """(shape, dtype) of each target in one run; the arrays themselves are dropped at once."""
    return {t: (tuple(int(d) for d in a.shape), a.dtype) for t, a in zip(targets, sess.run(targets, feeds))}


def choose_examples(model: onnx.ModelProto, given: Mapping[str, Sequence[int]] | None = None,
                    ranges: Mapping[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Per-sample sizes for every input with a dynamic dimension besides the batch.

    ``given`` (``--input-shape``) wins; other dynamic dimensions take the first of ``DEFAULT_FILLS`` at which the
    whole model runs at batch 1 (all of them the same size: the height and width of an image, say). If none runs,
    the first is kept and ``--verify`` reports onnxruntime's error with a hint to give the sizes."""
    given = dict(given or {})
    inputs = {vi.name: vi for vi in real_inputs(model.graph)}
    for name, sizes in given.items():
        if name not in inputs:
            raise ConfigError(f"--input-shape names {name!r}, which is not an input of the model; its inputs are "
                              f"{', '.join(repr(n) for n in inputs)}", field="--input-shape")
        want = per_sample_dims(inputs[name])
        if len(sizes) != len(want) or any(w is not None and w != s for w, s in zip(want, sizes)):
            shown = ",".join("?" if w is None else str(w) for w in want)
            raise ConfigError(f"--input-shape {name}={','.join(map(str, sizes))} does not fit input {name!r}, whose "
                              f"size per sample is {shown} (? = dynamic; the batch is not written)",
                              field="--input-shape")
    dyn = dynamic_inputs(model)
    if not dyn:
        return {}
    if all(n in given for n in dyn):
        return {n: list(given[n]) for n in dyn}

    def fill(size: int) -> dict[str, list[int]]:
        return {n: list(given[n]) if n in given else [d if d is not None else size for d in dims]
                for n, dims in dyn.items()}

    try:
        sess = _session(model)
    except Exception:  # a model onnxruntime cannot load: verify reports that with its own message
        sess = None
    if sess is not None:
        for size in DEFAULT_FILLS:
            cand = fill(size)
            try:
                sess.run(None, _feeds(model, cand, 1, 0, ranges))
                return cand
            except Exception:  # onnxruntime's own exception types: this size does not fit, try the next
                continue
    return fill(DEFAULT_FILLS[0])


def _unknown(dims: Any) -> bool:
    return dims is None or any(d is None or (isinstance(d, str) and d.startswith("unk")) for d in dims)


def _symbolic(dims: Any) -> bool:
    """Some dimension after the first is not a number (a dim_param or unknown): its size depends on the inputs."""
    return dims is None or any(not isinstance(d, int) for d in dims[1:])


def _alternative(model: onnx.ModelProto, sess: Any, examples: Mapping[str, Sequence[int]], targets: list[str],
                 ranges: Mapping[str, list[int]] | None) -> dict[str, tuple[tuple[int, ...], Any]] | None:
    """Shapes of the targets at batch 1 with every dynamic input dimension scaled (x2, else x1.5), or None when
    the model accepts neither size."""
    dyn = dynamic_inputs(model)
    for scale in ALT_SCALES:
        alt = {n: [s if dyn[n][k] is not None else max(s + 1, math.ceil(s * scale)) for k, s in enumerate(sizes)]
               for n, sizes in examples.items()}
        try:
            return _shapes(sess, targets, _feeds(model, alt, 1, 3, ranges))
        except Exception:
            continue
    return None


def probe(model: onnx.ModelProto, shapes: Shapes, ranges: Mapping[str, list[int]] | None = None,
          examples: Mapping[str, Sequence[int]] | None = None) -> tuple[Shapes, dict[str, list[int]]]:
    """Fill in what onnx shape inference left unknown by running the model in onnxruntime; also the size of each
    activation at the example (for FLOP estimates) where inference left it symbolic.

    Shapes computed at run time (``Reshape(x, Concat(Shape(x)[0], -1))``, as PyTorch exports flatten) defeat
    static inference; the stage files still need typed, shaped inputs and outputs. The model runs at batch 1 and
    2 on the example sizes: a dimension that is 1 then 2 in position 0 is the batch. With dynamic input dimensions
    besides the batch it also runs once with those scaled; a dimension is fixed only if it never changes (if the
    model accepts no other size, every dimension but the batch stays dynamic: None). Returns (shapes, sizes).
    """
    examples = dict(examples or {})
    activations = [o for nd in model.graph.node for o in nd.output if o]
    todo = [t for t in activations if _unknown(shapes.get(t, (0, None))[1])]
    sized = [t for t in activations if examples and t not in todo and _symbolic(shapes.get(t, (0, None))[1])]
    targets = todo + sized
    if not targets or model.ByteSize() > MAX_PROBE_BYTES:
        return shapes, {}
    pm = onnx.ModelProto()
    pm.CopyFrom(model)
    have = {o.name for o in pm.graph.output}
    for t in targets:
        if t not in have:
            pm.graph.output.append(onnx.ValueInfoProto(name=t))
    try:
        sess = _session(pm)
        one = _shapes(sess, targets, _feeds(model, examples, 1, 1, ranges))
        two = _shapes(sess, todo, _feeds(model, examples, 2, 2, ranges)) if todo else {}
    except Exception:  # best effort: the caller reports tensors that stay unknown
        return shapes, {}
    alt = _alternative(model, sess, examples, todo, ranges) if todo and examples else None
    out = dict(shapes)
    for t in todo:
        (a, dtype), (b, _) = one[t], two[t]
        c = alt[t][0] if alt is not None else None
        same_rank = len(a) == len(b) and (c is None or len(c) == len(a))
        dims: list[int | str | None] | None = None
        if same_rank:
            dims = []
            for k, (x, y) in enumerate(zip(a, b)):
                # with dynamic input dims a size is fixed only if the scaled run kept it (no such run: unknown)
                fixed = x == y and (c[k] == x if c is not None else not examples)
                dims.append(BATCH if (k == 0 and x == 1 and y == 2) else (x if fixed else None))
        out[t] = (int(onnx.helper.np_dtype_to_tensor_dtype(dtype)), dims)
    sizes = {t: list(one[t][0]) for t in targets}
    return out, sizes
