"""Run a split model with onnxruntime: the whole graph, the chained stages, or one stage at a time.

Used by ``--verify`` and ``lazybatch profile``; the Triton backend can use the same chaining rule (a stage input
comes from the model's inputs or from the named earlier stage's outputs, as the manifest says).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

from .device_tensors import DeviceTensors
from .inplace import InPlace, run_inplace, usable, verified_plan
from .ort_optimize import check_host


def make_session(path: Path | bytes, providers: Sequence[str], threads: int = 0, spinning: bool = False) -> Any:
    """An onnxruntime session: on the process's global thread pool where it has one (threads.py), otherwise with a
    pool of its own whose spinning is off unless asked (idle per-stage pools would busy-wait on the cores the next
    stage needs)."""
    import onnxruntime as ort

    from .threads import session_options

    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise ConfigError(f"execution provider(s) {', '.join(missing)} are not available in this onnxruntime "
                          f"({ort.__version__}); available: {', '.join(available)}. Install onnxruntime-gpu for "
                          "CUDAExecutionProvider, or use CPUExecutionProvider")
    ort.set_default_logger_severity(4)  # failures surface as exceptions with our own message
    so = session_options(threads, spinning=spinning, log_severity_level=4)
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), sess_options=so,
                                providers=list(providers))


def example_dims(spec: Mapping[str, Any]) -> list[int]:
    """Per-sample sizes of a manifest input: its ``example_dims`` where split recorded them, else ``dims`` with 1
    for each -1 (manifests written before example_dims existed)."""
    ex = spec.get("example_dims")
    if isinstance(ex, list) and len(ex) == len(spec["dims"]) and all(isinstance(d, int) and d > 0 for d in ex):
        return [int(d) for d in ex]
    return [d if d > 0 else 1 for d in spec["dims"]]


def random_feeds(specs: Sequence[Mapping[str, Any]], batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs for the manifest's graph_inputs: floats ~ N(0, 1), integers uniform in their declared range;
    dynamic (-1) dims take the input's ``example_dims`` (the sizes split ran the model at), else 1."""
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        dims = [batch] + example_dims(spec)
        dt = spec["dtype"]
        if dt.startswith("float"):
            feeds[spec["name"]] = rng.standard_normal(dims).astype(dt)
        elif dt == "bool":
            feeds[spec["name"]] = rng.random(dims) < 0.5
        elif dt.startswith(("int", "uint")):
            lo, hi = spec.get("range", [0, 1])
            feeds[spec["name"]] = rng.integers(lo, hi + 1, size=dims).astype(dt)
        else:
            raise ConfigError(f"cannot make random data for input {spec['name']!r} of type {dt}; --verify and profile "
                              "handle numeric and bool inputs only: split without --verify and time it yourself")
    return feeds


class StageChain:
    """onnxruntime sessions for the whole model and for every stage of a split directory.

    ``inplace``: stages whose output may overwrite their residual-shortcut input do so (inplace.py says which and
    why); the outputs are the same bit for bit. Off, every stage runs with a plain ``session.run``.

    ``device_tensors``: stage tensors stay OrtValues on the provider's device between stages (device_tensors.py),
    as the Triton backend serves them off the CPU; ``run_stage`` then leaves device tensors in ``env`` and
    ``run_chain`` / ``run_whole`` still answer host arrays. Off, numpy arrays pass between stages.
    """

    def __init__(self, directory: str | Path, manifest: Mapping[str, Any],
                 providers: Sequence[str] = ("CPUExecutionProvider",), threads: int = 0, whole: bool = True,
                 spinning: bool = False, inplace: bool = True, device_tensors: bool = False,
                 whole_model: str | None = None) -> None:
        d = Path(directory)
        check_host(manifest, f"the stages in {d}")
        self.manifest = manifest
        self.tensors = DeviceTensors(providers) if device_tensors else None
        # ``whole_model``: another file of the folder as the whole graph (verify: the optimized one, where it is)
        self.whole = make_session(d / (whole_model or manifest["whole_model"]), providers, threads, spinning) \
            if whole else None
        self.stages = [make_session(d / st["file"], providers, threads, spinning) for st in manifest["stages"]]
        self.inplace: dict[int, InPlace] = verified_plan(d, manifest, self.stages) if inplace else {}

    def run_whole(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self.whole is not None
        names = [o.name for o in self.whole.get_outputs()]
        if self.tensors is not None:
            return {n: self.tensors.host(v) for n, v in self.run_whole_resident(feeds).items()}
        return dict(zip(names, self.whole.run(names, dict(feeds))))

    def run_whole_resident(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The whole graph with its outputs left on the device (what a served whole-graph span does before the
        answers are copied out); host arrays in ``feeds`` are uploaded once per array. Device mode only."""
        assert self.whole is not None and self.tensors is not None
        names = [o.name for o in self.whole.get_outputs()]
        return dict(zip(names, self.tensors.run(self.whole, dict(feeds), names)))

    def stage_feeds(self, k: int, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {i["name"]: env[i["name"]] for i in self.manifest["stages"][k]["inputs"]}

    def run_stage(self, k: int, env: dict[str, np.ndarray], inplace: bool = True) -> None:
        """Run stage ``k`` on ``env`` and add its outputs. An in-place stage (unless ``inplace`` is False) writes
        its output over its input's array in ``env`` when that array is writable and C-contiguous: the caller
        gives up that tensor (no later stage reads it; model inputs are never overwritten)."""
        st = self.manifest["stages"][k]
        feeds = self.stage_feeds(k, env)
        step = self.inplace.get(k) if inplace else None
        names = [o["name"] for o in st["outputs"]]
        if self.tensors is not None:  # a device tensor made by an earlier stage is the caller's to give up
            over = feeds[step.input] if step is not None else None
            where = (step.output, over) if over is not None and not isinstance(over, np.ndarray) else None
            env.update(zip(names, self.tensors.run(self.stages[k], feeds, names, over=where)))
            return
        if step is not None and usable(feeds[step.input], step):
            env[step.output] = run_inplace(self.stages[k], step, feeds)
            return
        env.update(zip(names, self.stages[k].run(names, feeds)))

    def run_chain(self, feeds: Mapping[str, np.ndarray], keep_all: bool = False) -> dict[str, np.ndarray]:
        """Model outputs of the chained stages (with ``keep_all``, every tensor passed between stages too, which
        in-place stages would overwrite: they then run plainly)."""
        env = dict(feeds)
        for k in range(len(self.stages)):
            self.run_stage(k, env, inplace=not keep_all)
        if keep_all:
            return env if self.tensors is None else {n: self.tensors.host(v) for n, v in env.items()}
        outs = {o["name"]: env[o["name"]] for o in self.manifest["graph_outputs"]}
        return outs if self.tensors is None else {n: self.tensors.host(v) for n, v in outs.items()}
