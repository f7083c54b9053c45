"""Latency queries: stage ids x batch sizes of a split model, or of single-layer descriptors, on one NPU.

What the Triton ``npu_timing`` model (``lazybatch.backend.npu_timing``) answers, kept free of Triton so that it is
tested and used on its own. Every bad query raises ``ConfigError`` naming what was wrong; nothing is cached that a
bad query could spoil.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from lazybatch.batcher.errors import ConfigError

from .config import NPUConfig
from .cost import Cost
from .systolic import ConvLayer, Gemm, conv_cost, gemm_cost

MAX_BATCH = 65536  # a query above this is almost surely a typo (and would make shape inference allocate a lot)
LAYER_FORMS = "conv:H,W,C,R,S,M,STRIDE (padded input HxW, C channels, RxS kernel, M filters) or gemm:M,K,N"


@dataclass
class Answer:
    """``latency_us[i][j]``: stage ``stages[i]`` at ``batches[j]`` (cycles and energy alike)."""

    stage_names: list[str]
    stages: list[int]
    batches: list[int]
    latency_us: list[list[float]]
    cycles: list[list[int]]
    energy_uj: list[list[float]]


def _ints(text: str, n: int, what: str) -> list[int]:
    try:
        v = [int(x) for x in text.split(",")]
    except ValueError:
        v = []
    if len(v) != n or any(x < 1 for x in v):
        raise ConfigError(f"layer {what!r}: expected {n} positive integers after the colon; layers are "
                          f"{LAYER_FORMS}", field="layer")
    return v


def parse_layer(text: str) -> Callable[[int, NPUConfig], Cost]:
    """'conv:58,58,64,3,3,64,1' or 'gemm:1,1024,4096' -> cost(batch, cfg), as `lazybatch npu layer` prices them."""
    kind, sep, rest = str(text).strip().partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in ("conv", "gemm"):
        raise ConfigError(f"layer {text!r}: expected {LAYER_FORMS}", field="layer")
    if kind == "conv":
        h, w, c, r, s, m, stride = _ints(rest, 7, text)
        if r > h or s > w:
            raise ConfigError(f"layer {text!r}: the kernel is larger than the (padded) input", field="layer")
        layer = ConvLayer("conv", h, w, r, s, c, m, stride)
        return lambda b, cfg: conv_cost(layer, cfg, b)
    mm, k, n = _ints(rest, 3, text)
    return lambda b, cfg: gemm_cost(Gemm(m=mm * b, k=k, n=n), cfg)


class StageSet:
    """Named stages, each costable at any batch size: a split model's stages or a list of layer descriptors."""

    def __init__(self, name: str, names: list[str], cost: Callable[[int, int, NPUConfig], Cost]) -> None:
        self.name = name
        self.names = names
        self._cost = cost

    @classmethod
    def from_split(cls, stage_dir: str | Path, name: str | None = None) -> "StageSet":
        from .tables import load_stages

        model_name, stages = load_stages(stage_dir)
        return cls(name or model_name, [s.name for s in stages],
                   lambda i, b, cfg: stages[i].model.cost(b, cfg))

    @classmethod
    def from_layers(cls, descriptors: Sequence[str]) -> "StageSet":
        if not descriptors:
            raise ConfigError(f"no layer descriptors given; layers are {LAYER_FORMS}", field="layer")
        fns = [parse_layer(d) for d in descriptors]
        return cls("layers", [str(d).strip() for d in descriptors], lambda i, b, cfg: fns[i](b, cfg))

    def query(self, stages: Sequence[int] | None, batches: Sequence[int], cfg: NPUConfig) -> Answer:
        n = len(self.names)
        ids = list(range(n)) if stages is None or len(stages) == 0 else [int(s) for s in stages]
        bad = [s for s in ids if not 0 <= s < n]
        if bad:
            raise ConfigError(f"stage id(s) {bad} out of range: {self.name} has {n} stage(s), ids 0..{n - 1}",
                              field="stage")
        bs = [int(b) for b in batches]
        if not bs:
            raise ConfigError("no batch sizes given: send at least one in 'batch'", field="batch")
        badb = [b for b in bs if not 1 <= b <= MAX_BATCH]
        if badb:
            raise ConfigError(f"batch size(s) {badb} invalid: each must be in 1..{MAX_BATCH}", field="batch")
        costs = [[self._cost(s, b, cfg) for b in bs] for s in ids]
        return Answer([self.names[s] for s in ids], ids, bs,
                      [[c.microseconds(cfg) for c in row] for row in costs],
                      [[int(round(c.cycles)) for c in row] for row in costs],
                      [[c.energy_pj * 1e-6 for c in row] for row in costs])
