"""The model as the scheduler sees it: an ordered chain of stages, each STATIC, ENCODER or DECODER.

A run of consecutive ENCODER (or DECODER) stages is one loop body: it repeats once per encoder (decoder) timestep
of the request, as in Algorithm 1 of the LazyBatching paper. STATIC stages run once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

from .errors import ConfigError


class StageType(str, Enum):
    STATIC = "STATIC"
    ENCODER = "ENCODER"
    DECODER = "DECODER"

    @classmethod
    def parse(cls, value: object, *, field: str = "type", source: str | None = None) -> "StageType":
        if isinstance(value, StageType):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            raise ConfigError(
                f"unknown stage type {value!r}; use one of STATIC, ENCODER, DECODER", field=field, source=source
            ) from None


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    name: str
    type: StageType = StageType.STATIC


class ModelGraph:
    """An ordered list of stages plus the loop structure derived from their types.

    ``block_start[s]``/``block_end[s]`` give the first/last stage of the loop body that holds stage ``s`` (a STATIC
    stage is its own body); ``loop_type[s]`` is None for STATIC stages.
    """

    __slots__ = ("name", "stages", "n", "block_start", "block_end", "loop_type", "is_loop_end", "is_seq2seq")

    def __init__(self, name: str, stages: Iterable[Stage | tuple[str, StageType | str] | str]) -> None:
        built: list[Stage] = []
        for i, s in enumerate(stages):
            if isinstance(s, Stage):
                built.append(Stage(i, s.name, s.type))
            elif isinstance(s, str):
                built.append(Stage(i, s, StageType.STATIC))
            else:
                stage_name, stage_type = s
                built.append(Stage(i, str(stage_name), StageType.parse(stage_type, field=f"stages[{i}].type")))
        if not built:
            raise ConfigError("a model graph needs at least one stage", field="stages")
        names = [s.name for s in built]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"stage names must be unique; repeated: {', '.join(dupes)}", field="stages")
        self.name = name
        self.stages: tuple[Stage, ...] = tuple(built)
        self.n = len(built)
        self.block_start: list[int] = [0] * self.n
        self.block_end: list[int] = [0] * self.n
        self.loop_type: list[StageType | None] = [None] * self.n
        i = 0
        while i < self.n:
            t = built[i].type
            j = i
            if t is not StageType.STATIC:
                while j + 1 < self.n and built[j + 1].type is t:
                    j += 1
            for k in range(i, j + 1):
                self.block_start[k] = i
                self.block_end[k] = j
                self.loop_type[k] = None if t is StageType.STATIC else t
            i = j + 1
        self.is_loop_end: list[bool] = [
            self.loop_type[s] is not None and self.block_end[s] == s for s in range(self.n)
        ]
        self.is_seq2seq = any(t is not None for t in self.loop_type)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"ModelGraph({self.name!r}, {self.n} stages{', seq2seq' if self.is_seq2seq else ''})"

    def stage(self, ref: int | str) -> Stage:
        if isinstance(ref, int):
            return self.stages[ref]
        for s in self.stages:
            if s.name == ref:
                return s
        raise KeyError(f"no stage named {ref!r} in {self.name}")

    def stage_visits(self, enc_steps: int, dec_steps: int) -> list[int]:
        """The stage indices one request executes, in order (its whole program)."""
        out: list[int] = []
        s = 0
        while s < self.n:
            t = self.loop_type[s]
            end = self.block_end[s]
            reps = 1 if t is None else (enc_steps if t is StageType.ENCODER else dec_steps)
            body = list(range(s, end + 1))
            for _ in range(reps):
                out.extend(body)
            s = end + 1
        return out

    @staticmethod
    def from_stages(name: str, stages: Sequence[Stage]) -> "ModelGraph":
        return ModelGraph(name, stages)
