"""In-place residual stages: a stage whose output may be written over its residual-shortcut input.

Why: in the whole ResNet graph, onnxruntime's fused NCHWc ``Conv`` with a ``Sum`` input (what
``--graph-optimization-level all`` makes of a residual block: conv + add + relu) writes its output over the
shortcut's buffer; its allocation planner aliases the two because the shortcut has no later reader. In a stage the
shortcut is a graph input, which onnxruntime must not touch, so it copies it first (40-140 us per identity block of
ResNet-50 at batch 1, about 5% of the model). When the caller owns the input array and nothing reads it afterwards,
binding that same array as the stage's input and as its output buffer (IOBinding) gives onnxruntime back the
aliasing it does in the whole graph. docs/onnx.md has the measurements.

Which stages (``inplace_plan``): the stage has a single output of the same shape and dtype as one of its inputs;
that input is not a model input or output and no later stage reads it; and the node producing the output takes it
directly as an operand it may update in place: an NCHWc ``Conv`` (domain com.microsoft.nchwc) whose 4th input
(``Sum``) it is, or an elementwise ``Add``. Anything else is not eligible.

Safety net (``verified``): this leans on onnxruntime's kernel contract (the NCHWc Conv accumulates into its output
and skips the copy when the output already is the Sum buffer; Add reads each element before writing the same
element) rather than on a documented API promise, so each eligible stage is run once both ways on random data when
its session is created and keeps in-place only if the outputs are equal bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

NCHWC_DOMAIN = "com.microsoft.nchwc"


@dataclass(frozen=True)
class InPlace:
    """Stage output ``output`` may be written over stage input ``input`` (same shape and dtype)."""

    input: str
    output: str
    shape: tuple[Any, ...]  # manifest shape: ints, or names for symbolic dims (the batch)
    dtype: str


def _producer_aliases(model_path: Path, output: str) -> set[str]:
    """Names of the tensors the node producing ``output`` may update in place (see module docstring)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    for node in graph.node:
        if output in node.output:
            if node.op_type == "Conv" and node.domain == NCHWC_DOMAIN and len(node.input) >= 4 and node.input[3]:
                return {node.input[3]}
            if node.op_type == "Add" and node.domain in ("", "ai.onnx"):
                return {n for n in node.input[:2] if n}
            return set()
    return set()


def inplace_plan(directory: str | Path, manifest: Mapping[str, Any]) -> dict[int, InPlace]:
    """Stage index -> the input its output may overwrite, for the stages eligible by structure (not yet run)."""
    d = Path(directory)
    stages: Sequence[Mapping[str, Any]] = manifest["stages"]
    model_io = {t["name"] for key in ("graph_inputs", "graph_outputs", "inputs", "outputs")
                for t in manifest.get(key) or []}
    plan: dict[int, InPlace] = {}
    for k, st in enumerate(stages):
        outs = st.get("outputs") or []
        if len(outs) != 1 or "shape" not in outs[0] or "dtype" not in outs[0]:
            continue
        out = outs[0]
        later = {i["name"] for s in stages[k + 1:] for i in s.get("inputs") or []}
        candidates = [i for i in st.get("inputs") or []
                      if i.get("from", "model") != "model" and i["name"] not in model_io and i["name"] not in later
                      and i.get("shape") == out["shape"] and i.get("dtype") == out["dtype"]]
        if not candidates:
            continue
        aliases = _producer_aliases(d / st["file"], out["name"])
        for i in candidates:
            if i["name"] in aliases:
                plan[k] = InPlace(i["name"], out["name"], tuple(out["shape"]), str(out["dtype"]))
                break
    return plan


def usable(arr: Any, step: InPlace) -> bool:
    """Whether ``arr`` may be overwritten: a writable, C-contiguous numpy array of the stage's dtype."""
    return (isinstance(arr, np.ndarray) and arr.flags.c_contiguous and arr.flags.writeable
            and arr.dtype == np.dtype(step.dtype) and arr.size > 0)


def run_inplace(session: Any, step: InPlace, feeds: Mapping[str, np.ndarray], run_options: Any = None) -> np.ndarray:
    """Run the stage with ``feeds[step.input]`` bound as its input and as its output buffer; returns that array,
    which now holds the output. The caller must own the array and read its old value no more."""
    import onnxruntime as ort

    target = feeds[step.input]
    io = session.io_binding()
    shared = ort.OrtValue.ortvalue_from_numpy(target)  # wraps the numpy memory, no copy
    keep = [shared]  # the OrtValues must outlive the run
    for name, arr in feeds.items():
        if name == step.input:
            io.bind_ortvalue_input(name, shared)
        else:
            v = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))
            keep.append(v)
            io.bind_ortvalue_input(name, v)
    io.bind_ortvalue_output(step.output, shared)
    try:
        session.run_with_iobinding(io, run_options)
    except Exception as e:  # the input may be half overwritten: whoever retries must not read it again
        raise InPlaceRunError(f"{type(e).__name__}: {e} (in-place stage: its input buffer was consumed)") from e
    del keep
    return target


class InPlaceRunError(RuntimeError):
    """An in-place run failed after it may have written over its input: the batch cannot be rerun from it."""


def _random(shape: Sequence[Any], dtype: str, rng: np.random.Generator, batch: int) -> np.ndarray:
    dims = [d if isinstance(d, int) and d > 0 else (batch if j == 0 else 1) for j, d in enumerate(shape)]
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(dims).astype(dt)
    return rng.integers(0, 10, size=dims).astype(dt)


def verified(session: Any, step: InPlace, input_specs: Sequence[Mapping[str, Any]], seed: int = 0,
             batch: int = 2) -> bool:
    """Run the stage once plainly and once in place on the same random data; True only if the outputs are equal
    bit for bit (and the in-place run did not fail). ``input_specs``: the stage's manifest inputs."""
    rng = np.random.default_rng(seed)
    try:
        feeds = {i["name"]: _random(i["shape"], i["dtype"], rng, batch) for i in input_specs}
        ref = session.run([step.output], feeds)[0]
        own = {k: v.copy() for k, v in feeds.items()}
        got = run_inplace(session, step, own)
    except Exception:  # noqa: BLE001 - any failure means: do not use in-place for this stage
        return False
    return ref.shape == got.shape and ref.dtype == got.dtype and ref.tobytes() == got.tobytes()


def verified_plan(directory: str | Path, manifest: Mapping[str, Any], sessions: Sequence[Any]) -> dict[int, InPlace]:
    """``inplace_plan`` minus the stages whose in-place run does not reproduce the plain run bit for bit."""
    plan = inplace_plan(directory, manifest)
    stages = manifest["stages"]
    return {k: step for k, step in plan.items() if verified(sessions[k], step, stages[k]["inputs"])}
