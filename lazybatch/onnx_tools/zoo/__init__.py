"""The paper's benchmark models (Table II and section VI-C) built with onnx.helper and seeded random weights.

``export_model`` writes one ONNX file. Seq2seq models (gnmt, transformer, and the decoder-only gpt2) hold their encoder and decoder-step
graphs side by side in that one file, with a ``lazybatch.seq2seq`` metadata entry that tells ``lazybatch split``
which outputs belong to which part and how the decoder's state is carried between steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import onnx

from lazybatch.batcher.errors import ConfigError

from ..builder import GraphBuilder
from ..fsutil import check_target, move_files_into_place, staging_dir
from .decoder_lm import gpt2
from .gnmt import gnmt
from .nlp import bert, transformer
from .vision import mobilenet_v1, resnet50, vgg16

# Protobuf cannot serialise a single message over 2 GiB; above this many weight bytes we write external data.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


@dataclass(frozen=True)
class ZooEntry:
    build: Callable[..., Any]
    description: str
    seq2seq: bool = False


MODELS: dict[str, ZooEntry] = {
    "resnet50": ZooEntry(resnet50, "ResNet-50 v1.5, 224x224, 1000 classes (~25.6M parameters)"),
    "vgg16": ZooEntry(vgg16, "VGG-16 (configuration D), 224x224 (~138M parameters, ~550 MB)"),
    "mobilenet_v1": ZooEntry(mobilenet_v1, "MobileNet-v1 1.0, 224x224 (~4.3M parameters)"),
    "bert": ZooEntry(bert, "BERT-base encoder, sequence length 128 (~110M parameters)"),
    "gnmt": ZooEntry(gnmt, "GNMT-like 4+4 LSTM encoder/decoder steps with attention, hidden 1024 (~173M params)",
                     True),
    "transformer": ZooEntry(transformer, "Transformer base: encoder + decoder step, KV cache of 80 (~93M params)",
                            True),
    "gpt2": ZooEntry(gpt2, "GPT-2-small-like decoder-only LM: prompt prefill + decoder step, KV cache of 512 (~124M "
                           "params)", True),
}


def build_model(name: str, *, small: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Build the named model in memory (checked by onnx.checker)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    entry = MODELS[name]
    built = entry.build(seed=seed, small=small)
    meta: dict[str, Any] = {"lazybatch.seed": str(seed), "lazybatch.variant": "small" if small else "full"}
    if entry.seq2seq:
        g, seq2seq = built
        meta["lazybatch.seq2seq"] = seq2seq
    else:
        g = built
    assert isinstance(g, GraphBuilder)
    model = g.model(meta, doc=f"lazybatch export {name}{' --small' if small else ''} --seed {seed}: "
                              f"{entry.description}; random weights, not trained")
    onnx.checker.check_model(model)
    return model


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save_model_atomic(model: onnx.ModelProto, out: Path, *, external_data: bool | None = None,
                      force: bool = False) -> list[Path]:
    """Save ``model`` to ``out`` (plus ``out.name + '.data'`` when weights go to external data); returns files."""
    out = Path(out)
    check_target(out, force)
    if external_data is None:
        external_data = weight_bytes(model) > EXTERNAL_DATA_THRESHOLD
    data_name = out.name + ".data"
    with staging_dir(out) as tmp:
        if external_data:
            onnx.save_model(model, str(tmp / out.name), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=1024)
            names = [data_name, out.name] if (tmp / data_name).exists() else [out.name]
        else:
            onnx.save_model(model, str(tmp / out.name))
            names = [out.name]
        move_files_into_place(tmp, names, out.parent)
    return [out.parent / n for n in names]


def export_model(name: str, out: Path, *, small: bool = False, seed: int = 0, external_data: bool | None = None,
                 force: bool = False) -> list[Path]:
    model = build_model(name, small=small, seed=seed)
    return save_model_atomic(model, Path(out), external_data=external_data, force=force)


def seq2seq_spec(model: onnx.ModelProto) -> dict[str, Any] | None:
    for p in model.metadata_props:
        if p.key == "lazybatch.seq2seq":
            return json.loads(p.value)
    return None
