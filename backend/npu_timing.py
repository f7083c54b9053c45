"""The ``npu_timing`` Triton model: NPU latency queries over gRPC/HTTP (docs/npu.md: the plug-in as a Python API, as tables, and as this model).

A request names what to time, either

- ``model`` (BYTES [1]): a model of the same Triton repository that has a stage directory (``<model>/<version>/
  stages/manifest.json``, as `lazybatch repo add` writes), or
- ``layer`` (BYTES [n]): layer descriptors ``conv:H,W,C,R,S,M,STRIDE`` / ``gemm:M,K,N`` (one "stage" each),

plus ``batch`` (INT32 [k], required) and optionally ``stage`` (INT32 [m]: stage ids; default every stage). The
answer holds ``latency_us`` (FP64 [m, k]), ``cycles`` (INT64 [m, k]), ``energy_uj`` (FP64 [m, k]) and
``stage_name`` (BYTES [m]) on the NPU the ``npu_config`` parameter describes (a JSON file in the version folder,
keys as `lazybatch npu config` prints; default: the LazyBatching paper's Table I).

Every request is answered on its own: a bad one (unknown model, stage out of range, batch <= 0, malformed
descriptor, both or neither of model/layer) gets an INVALID_ARG error naming the problem; the others in the same
``execute`` call are answered normally.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from lazybatch.batcher.errors import ConfigError

try:  # only importable inside the Triton Python backend stub
    import triton_python_backend_utils as pb_utils  # type: ignore
except ImportError:  # pragma: no cover - unit tests import this module without Triton
    pb_utils = None

PARAMETERS = {"npu_config": "NPU configuration JSON, relative to the version folder (default: Table I)"}


def repository_models(repo: Path) -> dict[str, Path]:
    """Model name -> its stage directory (highest numbered version that has one)."""
    out: dict[str, Path] = {}
    if not repo.is_dir():
        return out
    for mdir in sorted(p for p in repo.iterdir() if p.is_dir()):
        versions = sorted((v for v in mdir.iterdir() if v.is_dir() and v.name.isdigit()), key=lambda v: int(v.name))
        for v in reversed(versions):
            if (v / "stages" / "manifest.json").exists():
                out[mdir.name] = v / "stages"
                break
    return out


def load_npu_config(version_dir: Path, text: str | None):
    from lazybatch.npu_model import NPUConfig

    if not text:
        return NPUConfig()
    p = version_dir / text
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the NPU configuration: {e.strerror}", field="parameters.npu_config",
                          source=str(p)) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"NPU configuration is not valid JSON ({e.msg})", field="parameters.npu_config",
                          source=str(p)) from None
    return NPUConfig.from_dict(data, source=str(p))


def _strings(arr: np.ndarray | None) -> list[str]:
    if arr is None:
        return []
    return [x.decode() if isinstance(x, bytes) else str(x) for x in np.asarray(arr, dtype=object).reshape(-1)]


class TimingService:
    """The query logic behind the Triton model (no Triton in here): model lookup, caching, one answer per query."""

    def __init__(self, repo: Path, cfg: Any, self_name: str) -> None:
        self.repo = repo
        self.cfg = cfg
        self.self_name = self_name
        self._sets: dict[str, Any] = {}

    def stage_set(self, model: str) -> Any:
        from lazybatch.npu_model.query import StageSet

        if model not in self._sets:
            known = repository_models(self.repo)  # re-read: models may be added to the repository while serving
            if model not in known:
                raise ConfigError(f"unknown model {model!r}: models with stages in this repository: "
                                  f"{sorted(known) or 'none'} (or send layer descriptors in 'layer')", field="model")
            self._sets[model] = StageSet.from_split(known[model], name=model)
        return self._sets[model]

    def answer(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from lazybatch.npu_model.query import StageSet

        unknown = sorted(set(tensors) - {"model", "layer", "stage", "batch"})
        if unknown:
            raise ConfigError(f"unexpected input(s) {unknown}; inputs are model or layer, batch, stage", field="input")
        models = _strings(tensors.get("model"))
        layers = _strings(tensors.get("layer"))
        if bool(models) == bool(layers):
            raise ConfigError("send exactly one of 'model' (a model name of this repository) and 'layer' "
                              "(layer descriptors)", field="model/layer")
        if len(models) > 1:
            raise ConfigError(f"'model' holds {len(models)} names; send one per request", field="model")
        if "batch" not in tensors:
            raise ConfigError("missing input 'batch' (INT32 batch sizes)", field="batch")
        target = self.stage_set(models[0]) if models else StageSet.from_layers(layers)
        stage = tensors.get("stage")
        ans = target.query(None if stage is None else np.asarray(stage).reshape(-1).tolist(),
                           np.asarray(tensors["batch"]).reshape(-1).tolist(), self.cfg)
        return {"latency_us": np.asarray(ans.latency_us, dtype=np.float64),
                "cycles": np.asarray(ans.cycles, dtype=np.int64),
                "energy_uj": np.asarray(ans.energy_uj, dtype=np.float64),
                "stage_name": np.asarray([n.encode() for n in ans.stage_names], dtype=np.object_)}


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        unknown = sorted(set(params) - set(PARAMETERS))
        if unknown:
            raise ConfigError(f"unknown parameters {unknown}; known: {', '.join(PARAMETERS)}", field="parameters")
        model_dir = Path(args["model_repository"])
        version_dir = model_dir / str(args["model_version"])
        self.service = TimingService(model_dir.parent, load_npu_config(version_dir, params.get("npu_config")),
                                     cfg.get("name", model_dir.name))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tensors = {t.name(): t.as_numpy() for t in request.inputs()}
            try:
                out = self.service.answer(tensors)
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in out.items()]))
            except ConfigError as e:
                responses.append(_error(str(e), "INVALID_ARG"))
            except Exception as e:  # a bug or an unreadable model: this query fails, the others go on
                traceback.print_exc()
                responses.append(_error(f"{type(e).__name__}: {e}", "INTERNAL"))
        return responses


def _error(message: str, code_name: str) -> Any:
    te = pb_utils.TritonError
    code = getattr(te, code_name, None)
    return pb_utils.InferenceResponse(output_tensors=[], error=te(message, code) if code is not None else te(message))
