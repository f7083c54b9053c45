"""Optimise-then-split: let onnxruntime rewrite the whole graph first, then cut the rewritten graph.

Why: onnxruntime optimises each stage session on its own. At level ``all`` on CPU it converts convolutions to its
blocked NCHWc layout and fuses the residual ``Add`` + ``Relu`` into the last convolution of a block, but only
where it sees both inputs in that layout. A stage boundary hides that: every stage converts its input to NCHWc
and its output back (``ReorderInput``/``ReorderOutput``), and the shortcut ``Add``/``Relu`` run as separate
kernels. Cutting the already-optimised graph keeps the fusions and passes tensors in the blocked layout, so a
stage costs what its nodes cost inside the whole graph.

The price: the stage files use onnxruntime's contrib operators (``com.microsoft``, ``com.microsoft.nchwc``) and,
at level ``all``, a layout that depends on this CPU's vector width and this onnxruntime version. The manifest
records both (``ort_optimization``) and :func:`check_host` refuses to run such stages elsewhere.
"""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from lazybatch.batcher.errors import ConfigError

if TYPE_CHECKING:
    import onnx

LEVELS = ("basic", "extended", "all")
OPTIMIZED_WHOLE = "ort_optimized.onnx"
_CPU_FEATURES = ("avx512f", "avx512bw", "avx512vnni", "avx2", "avx", "fma", "sse4_1", "asimd", "sve")


def _ort_level(level: str) -> Any:
    import onnxruntime as ort

    return {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]


def host_signature() -> dict[str, Any]:
    """What an ``all``-level graph depends on: onnxruntime's version and the CPU's vector extensions."""
    import onnxruntime as ort

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
                break
    except OSError:  # not Linux: the machine name and version must do
        pass
    return {"onnxruntime": ort.__version__, "machine": platform.machine(),
            "cpu_features": [f for f in _CPU_FEATURES if f in flags]}


def optimize_model(model: onnx.ModelProto, level: str, external: bool) -> onnx.ModelProto:
    """The graph onnxruntime's CPU provider runs after optimising ``model`` at ``level`` (as a ModelProto)."""
    import onnx
    import onnxruntime as ort

    if level not in LEVELS:
        raise ConfigError(f"--graph-optimization-level must be one of {', '.join(LEVELS)}, got {level!r}")
    with tempfile.TemporaryDirectory(prefix="lazybatch_ortopt_") as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "optimized.onnx"
        big = external or model.ByteSize() > 1_800_000_000
        if big:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)  # saving as external data rewrites the tensors of the proto it is given
            onnx.save_model(copy, str(src), save_as_external_data=True, all_tensors_to_one_file=True,
                            location="in.onnx.data", size_threshold=1024)
        else:
            onnx.save_model(model, str(src))
        from .threads import session_options

        so = session_options()  # the process's global thread pool, if it has one: onnxruntime insists
        so.graph_optimization_level = _ort_level(level)
        so.optimized_model_filepath = str(dst)
        so.log_severity_level = 4  # onnxruntime warns that an 'all' graph is hardware specific: we record that
        if big:
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                        "optimized.onnx.data")
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        try:
            ort.InferenceSession(str(src), sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types
            raise ConfigError(f"onnxruntime cannot optimise the model at level {level!r} "
                              f"({str(e).splitlines()[0][:300]}); split without --graph-optimization-level") from None
        out = onnx.load(str(dst))  # loads the external data too, before the directory goes
    del out.metadata_props[:]
    out.metadata_props.extend(model.metadata_props)  # e.g. the seq2seq description the splitter reads
    out.graph.name = model.graph.name
    return out


def manifest_entry(level: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"level": level, "whole_model": OPTIMIZED_WHOLE}
    entry.update(host_signature())
    entry["hardware_specific"] = level == "all"
    return entry


def check_host(manifest: Mapping[str, Any], where: str = "") -> None:
    """Refuse stages cut from an ``all``-level graph on a host whose onnxruntime or CPU differ from the one that
    optimised them: NCHWc weights are blocked for one vector width, and running them elsewhere is wrong."""
    opt = manifest.get("ort_optimization")
    if not opt or not opt.get("hardware_specific"):
        return
    here = host_signature()
    diff = [k for k in ("onnxruntime", "machine", "cpu_features") if opt.get(k) != here[k]]
    if diff:
        raise ConfigError(f"{where or 'these stages'} were split from a graph onnxruntime optimised for another host "
                          f"(--graph-optimization-level all; differs in {', '.join(diff)}: "
                          f"{', '.join(f'{k}={opt.get(k)} here {here[k]}' for k in diff)}); split the model again on "
                          "this machine, or split with --graph-optimization-level extended (portable) or without it")
