"""Fault injection for tests and drills: make one stage's onnxruntime run raise, on purpose.

Off unless the model's config.pbtxt sets ``parameters { key: "fault_injection" value { string_value: "..." } }``:

    stage=<index|name>,every=<N>[,mode=sample|run]

- ``mode=sample`` (default): every N-th sample (scheduler request) is poisoned; any run of that stage that holds it
  raises, the way an input that onnxruntime chokes on does. The runtime then reruns the sub-batch one request at a
  time, so only the poisoned requests fail (INTERNAL, with the error text) and the rest of the sub-batch goes on.
- ``mode=run``: every N-th run of the stage raises, a transient fault: the rerun one request at a time succeeds,
  so no client sees it (only ``lazybatch_stage_failures_total`` does).

Seq2seq models (backend/seq2seq.py) take the same parameter: ``stage`` names an encoder or a decoder stage of the
manifest (index or name). A sample there is one sequence (a row of a client request; sequences are numbered in
arrival order), so ``mode=sample`` poisons every N-th sequence, which fails at its first run of that stage (its
first encoder step, or its first decoder step) and fails its client request once (the request's other rows leave
it). ``mode=run`` counts runs of the stage: every encoder step of a per-token encoder stage, every decoder step of a
decoder stage.
"""

from __future__ import annotations

from typing import Sequence

from lazybatch.batcher.errors import ConfigError

FIELD = "parameters.fault_injection"


class InjectedFault(RuntimeError):
    """What an injected fault raises (its text reaches the client). ``stage``: the stage it was injected in, which the
    metrics count the failure against even where a job spans several stages."""

    def __init__(self, message: str, stage: int) -> None:
        super().__init__(message)
        self.stage = stage


class FaultInjector:
    __slots__ = ("stage", "every", "mode", "runs", "stage_name")

    def __init__(self, stage: int, every: int, mode: str = "sample", stage_name: str = "") -> None:
        self.stage = stage
        self.every = every
        self.mode = mode
        self.runs = 0
        self.stage_name = stage_name or str(stage)

    @classmethod
    def parse(cls, text: str | None, stage_names: Sequence[str]) -> "FaultInjector | None":
        if not text or not text.strip():
            return None
        kv: dict[str, str] = {}
        for item in text.split(","):
            k, eq, v = item.partition("=")
            if not eq:
                raise ConfigError(f"expected key=value items (stage=..,every=..[,mode=sample|run]), got {item!r}",
                                  field=FIELD)
            kv[k.strip()] = v.strip()
        unknown = set(kv) - {"stage", "every", "mode"}
        if unknown or "stage" not in kv or "every" not in kv:
            raise ConfigError(f"give stage=<index|name> and every=<N> (and optionally mode=sample|run); got {text!r}",
                              field=FIELD)
        st = kv["stage"]
        if st in stage_names:
            stage = list(stage_names).index(st)
        else:
            try:
                stage = int(st)
            except ValueError:
                stage = -1
            if not 0 <= stage < len(stage_names):
                raise ConfigError(f"stage {st!r} is neither a stage name nor an index in 0..{len(stage_names) - 1}",
                                  field=FIELD)
        try:
            every = int(kv["every"])
        except ValueError:
            every = 0
        if every < 1:
            raise ConfigError(f"every must be a positive integer, got {kv['every']!r}", field=FIELD)
        mode = kv.get("mode", "sample")
        if mode not in ("sample", "run"):
            raise ConfigError(f"mode must be sample or run, got {mode!r}", field=FIELD)
        return cls(stage, every, mode, stage_names[stage])

    def check(self, stage: int, ids: Sequence[int]) -> None:
        """Raise InjectedFault if this run of ``stage`` on the samples ``ids`` is to fail."""
        if stage != self.stage:
            return
        if self.mode == "run":
            self.runs += 1
            if self.runs % self.every == 0 and len(ids) > 1:  # a lone rerun passes: the fault is transient
                raise InjectedFault(f"injected fault in stage {self.stage_name!r} (run {self.runs}; "
                                    "parameter fault_injection)", self.stage)
            return
        bad = [i for i in ids if (i + 1) % self.every == 0]
        if bad:
            raise InjectedFault(f"injected fault in stage {self.stage_name!r} for sample {bad[0]} "
                                "(parameter fault_injection)", self.stage)
