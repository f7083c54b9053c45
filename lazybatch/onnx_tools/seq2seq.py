"""Greedy decoding over a split seq2seq model, one batched step at a time, following the manifest's seq2seq section.

This is the reference for how a server runs encoder and decoder steps of *different* requests, at different
timesteps, in one batch: every carried state tensor is a per-row input, so a batch is just the rows of the
requests that take this step, concatenated. The tests check that a request's results do not depend on which
other requests shared its batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

from lazybatch.sessions.chain import StageChain


@dataclass
class Seq2SeqRequest:
    inputs: dict[str, np.ndarray]            # request inputs, each with a leading batch dimension of 1
    state: dict[str, np.ndarray] = field(default_factory=dict)
    phase: str = "encoder"                   # "encoder", "decoder" or "done"
    enc_steps: int = 1
    enc_done: int = 0
    enc_outputs: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


class Seq2SeqRunner:
    def __init__(self, chain: StageChain) -> None:
        self.chain = chain
        self.m = chain.manifest
        if "seq2seq" not in self.m:
            raise ConfigError("this split model has no seq2seq section, so it is not an encoder-decoder export; run "
                              "static models with StageChain.run_chain")
        self.sec = self.m["seq2seq"]
        self.spec = {s["name"]: s for s in self.m["graph_inputs"]}

    def _init_state(self, part: str, enc_outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """A state entry starts as a constant (``init``) or as an encoder output (``init_from``: a decoder-only
        model's prefill hands over its KV cache, last token and position)."""
        out = {}
        for s in self.sec[part]["state"]:
            if "init_from" in s:
                out[s["input"]] = (enc_outputs or {})[s["init_from"]]
                continue
            spec = self.spec[s["input"]]
            out[s["input"]] = np.full([1] + [max(d, 1) for d in spec["dims"]], s["init"], dtype=spec["dtype"])
        return out

    def start(self, inputs: Mapping[str, np.ndarray]) -> Seq2SeqRequest:
        req = Seq2SeqRequest({k: np.asarray(v) for k, v in inputs.items()}, self._init_state("encoder"))
        enc = self.sec["encoder"]
        req.enc_steps = int(req.inputs[enc["steps_input"]].reshape(-1)[0]) if enc.get("runs") == "per_token" else 1
        return req

    def _model_inputs(self, stages: Sequence[int]) -> list[str]:
        names: list[str] = []
        for k in stages:
            for i in self.m["stages"][k]["inputs"]:
                if i["from"] == "model" and i["name"] not in names:
                    names.append(i["name"])
        return names

    def _row_value(self, req: Seq2SeqRequest, name: str) -> np.ndarray:
        if name in req.state:
            return req.state[name]
        if name in req.inputs:
            return req.inputs[name]
        for b in self.sec.get("bind", []):
            if b["input"] == name:
                return req.enc_outputs[b["encoder_output"]] if "encoder_output" in b else req.inputs[b["request_input"]]
        raise ConfigError(f"no value for stage input {name!r}: not a request input, state, or bound input; add it "
                          "to the manifest's seq2seq state or bind list (or to the request)")

    def step(self, reqs: Sequence[Seq2SeqRequest]) -> None:
        """One batched step for requests that are all in the same phase (encoder or decoder)."""
        phase = reqs[0].phase
        assert all(r.phase == phase for r in reqs) and phase in ("encoder", "decoder")
        stages = self.sec[phase]["stages"]
        env = {n: np.concatenate([self._row_value(r, n) for r in reqs], axis=0) for n in self._model_inputs(stages)}
        for k in stages:
            self.chain.run_stage(k, env)
        carried = {s["output"]: s["input"] for s in self.sec[phase]["state"]}
        for i, r in enumerate(reqs):
            for out_name, in_name in carried.items():
                r.state[in_name] = env[out_name][i:i + 1]
            if phase == "encoder":
                r.enc_done += 1
                if r.enc_done >= r.enc_steps:
                    r.enc_outputs = {n: env[n][i:i + 1] for n in self.sec["encoder"]["outputs"]}
                    r.phase, r.state = "decoder", self._init_state("decoder", r.enc_outputs)
            else:
                tok = int(env[self.sec["token_output"]][i])
                r.tokens.append(tok)
                r.logits.append(env[self.sec["logits_output"]][i].copy())
                if tok == self.sec["end_token_id"] or len(r.tokens) >= self.sec["max_length"]:
                    r.phase = "done"
