"""Client side of seq2seq models (backend/seq2seq.py): request tensors, and source/output lengths for load tests.

A served seq2seq model takes ``src_tokens`` (INT64 [batch, length]) and optionally ``max_output_len`` and
``ignore_eos`` (INT64/BOOL [batch, 1]); it answers ``output_tokens`` and ``output_len``. Its config.pbtxt carries
``max_source_length``, ``max_output_length`` and ``vocab_size`` parameters (written by ``lazybatch repo add``) so that
a client can draw valid requests. Models with random weights never produce a meaningful end token: load tests fix
each request's output length with ``ignore_eos`` (the default here), drawing lengths from a histogram.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.formats.histograms import shipped_histogram

OUTPUT = "output_tokens"
FIRST_TOKEN = 3  # ids 0..2 are pad, start and end in the exports; sources use ordinary words


@dataclass(frozen=True)
class Seq2SeqInfo:
    max_source_length: int
    max_output_length: int
    vocab_size: int
    length_histogram: str | None = None  # the shipped histogram the model is served with ("chat"; None: "wmt")


def info_from_parameters(params: Mapping[str, str]) -> Seq2SeqInfo | None:
    """The model's seq2seq limits from its config parameters; None for a model that is not seq2seq."""
    keys = ("max_source_length", "max_output_length", "vocab_size")
    if not all(k in params for k in keys):
        return None
    try:
        return Seq2SeqInfo(*(int(params[k]) for k in keys), length_histogram=params.get("length_histogram") or None)
    except ValueError:
        raise ConfigError(f"the model's seq2seq parameters {dict((k, params[k]) for k in keys)} are not "
                          "integers; re-run `lazybatch repo add`") from None


def grpc_parameters(config_response: Any) -> dict[str, str]:
    cfg = getattr(config_response, "config", config_response)
    return {k: v.string_value for k, v in cfg.parameters.items()}


def http_parameters(config: Mapping[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}


def make_request(rng: np.random.Generator, info: Seq2SeqInfo, src_len: int, output_len: int | None = None, *,
                 batch: int = 1, ignore_eos: bool = True) -> dict[str, np.ndarray]:
    """Random source ids of ``src_len`` tokens; with ``output_len``, decode that many tokens (exactly, with
    ``ignore_eos``; at most, stopping at the end token, without)."""
    if not 1 <= src_len <= info.max_source_length:
        raise ConfigError(f"source length {src_len} must be in 1..{info.max_source_length}", field="--src-len")
    lo = FIRST_TOKEN if info.vocab_size > FIRST_TOKEN else 0
    feeds = {"src_tokens": rng.integers(lo, info.vocab_size, size=(batch, src_len)).astype(np.int64)}
    if output_len is not None:
        if not 1 <= output_len <= info.max_output_length:
            raise ConfigError(f"output length {output_len} must be in 1..{info.max_output_length}",
                              field="--max-output-len")
        feeds["max_output_len"] = np.full((batch, 1), output_len, np.int64)
        if ignore_eos:
            feeds["ignore_eos"] = np.ones((batch, 1), np.bool_)
    return feeds


class LengthSampler:
    """Source and output lengths drawn independently from a length histogram (``lazybatch.length_histogram/1``),
    clipped to the model's limits; the same seed gives the same lengths."""

    def __init__(self, info: Seq2SeqInfo, histogram: str | Path | None = None, seed: int = 0) -> None:
        path = Path(histogram) if histogram else shipped_histogram(info.length_histogram)
        self.hist = LengthHistogram.load(path)
        self.info = info
        self.rng = random.Random(seed)

    def draw(self) -> tuple[int, int]:
        s, o = self.hist.sample(self.rng, 2)
        return min(s, self.info.max_source_length), min(o, self.info.max_output_length)


def perf_input_data(info: Seq2SeqInfo, n: int = 100, *, seed: int = 0, histogram: str | Path | None = None,
                    ignore_eos: bool = True) -> dict[str, Any]:
    """perf_analyzer ``--input-data`` JSON for a seq2seq model: ``n`` requests whose source and output lengths are
    drawn like ``lazybatch load`` draws them (perf_analyzer's ``random`` data would send ids outside the
    vocabulary). Every input is given (optional ones too), one batch row each."""
    sampler = LengthSampler(info, histogram, seed)
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(n):
        src_len, out_len = sampler.draw()
        feeds = make_request(rng, info, src_len, out_len, ignore_eos=ignore_eos)
        data.append({"src_tokens": {"content": feeds["src_tokens"][0].tolist(), "shape": [src_len]},
                     "src_len": [src_len], "max_output_len": [out_len], "ignore_eos": [bool(ignore_eos)]})
    return {"data": data}
