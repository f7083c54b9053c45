"""A seq2seq model's served interface, from its stage manifest's ``seq2seq`` section (docs/formats.md): which stages
encode and which decode, which decoder output feeds which input on the next step, the tensors a request sends and
gets back, and the check of a request and of config.pbtxt against them. Read once at load; the runtime that runs the
loop is ``backend/seq2seq.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.formats.stage_manifest import Manifest, TensorSpec

from .rows import Row

TOKENS = "src_tokens"
SRC_LEN = "src_len"
MAX_OUT = "max_output_len"
IGNORE_EOS = "ignore_eos"
OUT_TOKENS = "output_tokens"
OUT_LEN = "output_len"
PAD = -1  # output_tokens past a row's end
OPTIONAL = (SRC_LEN, MAX_OUT, IGNORE_EOS)


@dataclass(frozen=True)
class _State:
    input: str
    output: str
    init: Any  # a constant, or None where the state starts as an encoder output
    init_from: str | None = None  # that encoder output (a decoder-only model's prefill: KV cache, last token)


class Seq2SeqSpec:
    """The manifest's seq2seq section, checked once, in the form the runtime needs."""

    def __init__(self, manifest: Manifest, source: str = "manifest.json") -> None:
        raw = manifest.raw
        src = source
        sec = raw.get("seq2seq")
        if not isinstance(sec, Mapping):
            raise ConfigError("the stage manifest has no seq2seq section", source=src)
        try:
            self.enc_stages: list[int] = list(sec["encoder"]["stages"])
            self.dec_stages: list[int] = list(sec["decoder"]["stages"])
            self.per_token = sec["encoder"].get("runs") == "per_token"
            self.steps_input: str | None = sec["encoder"].get("steps_input")
            self.enc_outputs: list[str] = list(sec["encoder"]["outputs"])
            self.enc_state = [_State(s["input"], s["output"], s.get("init"), s.get("init_from"))
                              for s in sec["encoder"]["state"]]
            self.dec_state = [_State(s["input"], s["output"], s.get("init"), s.get("init_from"))
                              for s in sec["decoder"]["state"]]
            self.bind: list[dict[str, str]] = list(sec.get("bind", []))
            self.token_output: str = sec["token_output"]
            self.end_token: int = int(sec["end_token_id"])
            self.max_length: int = int(sec["max_length"])
            self.max_source_length: int = int(sec["max_source_length"])
            self.decoder_only = bool(sec.get("decoder_only", False))  # the "source" is a prompt to continue
            self.length_histogram: str | None = sec.get("length_histogram")  # shipped lengths clients draw from
            request_inputs = list(sec["request_inputs"])
        except (KeyError, TypeError) as e:
            raise ConfigError(f"the seq2seq section lacks {e}; re-run `lazybatch split` on the export",
                              source=src) from None
        for st in self.enc_state + self.dec_state:
            if (st.init is None) == (st.init_from is None):
                raise ConfigError(f"seq2seq state {st.input!r} needs exactly one of init (a constant) and init_from "
                                  "(an encoder output)", source=src)
            if st.init_from is not None and (st in self.enc_state or st.init_from not in self.enc_outputs):
                raise ConfigError(f"seq2seq state {st.input!r}: init_from {st.init_from!r} must name an encoder "
                                  f"output ({self.enc_outputs}) and belong to the decoder", source=src)
        if not self.enc_stages or not self.dec_stages or self.enc_stages[-1] >= self.dec_stages[0]:
            raise ConfigError("seq2seq: encoder stages must come first, then decoder stages", source=src)
        graph_inputs = {e["name"]: e for e in raw.get("graph_inputs") or raw.get("inputs") or []}
        self.graph_inputs = graph_inputs
        if TOKENS not in request_inputs or TOKENS not in graph_inputs:
            raise ConfigError(f"seq2seq: the served model needs a {TOKENS!r} request input", source=src)
        lo, hi = graph_inputs[TOKENS].get("range", [0, None])
        if hi is None:
            raise ConfigError(f"seq2seq: the manifest gives no id range for {TOKENS!r}", source=src)
        self.vocab_size = int(hi) + 1
        self.min_token = int(lo)
        if SRC_LEN not in graph_inputs:
            raise ConfigError(f"seq2seq: the graphs need a {SRC_LEN!r} input (the source length)", source=src)
        self.bound_outputs = {b["encoder_output"] for b in self.bind if "encoder_output" in b}
        self.enc_last = self.enc_stages[-1]
        self.dec_first = self.dec_stages[0]
        self.dec_last = self.dec_stages[-1]
        self._init_cache: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ served interface
    def served_inputs(self) -> list[tuple[TensorSpec, bool]]:
        """(tensor, optional) of config.pbtxt's input section."""
        i64 = np.dtype(np.int64)
        return [(TensorSpec(TOKENS, i64, (-1,)), False), (TensorSpec(SRC_LEN, i64, (1,)), True),
                (TensorSpec(MAX_OUT, i64, (1,)), True), (TensorSpec(IGNORE_EOS, np.dtype(np.bool_), (1,)), True)]

    def served_outputs(self) -> list[TensorSpec]:
        i64 = np.dtype(np.int64)
        return [TensorSpec(OUT_TOKENS, i64, (-1,)), TensorSpec(OUT_LEN, i64, (1,))]

    def info_parameters(self) -> dict[str, str]:
        info = {"max_source_length": str(self.max_source_length), "max_output_length": str(self.max_length),
                "vocab_size": str(self.vocab_size)}
        if self.length_histogram:
            info["length_histogram"] = self.length_histogram
        return info

    def check_config(self, inputs: list[TensorSpec], outputs: list[TensorSpec], params: Mapping[str, str],
                     source: str) -> None:
        want_in = {t.name: (t.dtype, t.dims) for t, _ in self.served_inputs()}
        want_out = {t.name: (t.dtype, t.dims) for t in self.served_outputs()}
        have_in = {t.name: (t.dtype, t.dims) for t in inputs}
        have_out = {t.name: (t.dtype, t.dims) for t in outputs}
        if have_in.get(TOKENS) != want_in[TOKENS] or any(have_in[k] != want_in.get(k) for k in have_in):
            raise ConfigError(f"config.pbtxt inputs {have_in} do not match the seq2seq model's {want_in} (src_tokens "
                              "required, the others optional); re-run `lazybatch repo add`", field="input",
                              source=source)
        if have_out != want_out:
            raise ConfigError(f"config.pbtxt outputs {have_out} differ from the seq2seq model's {want_out}; re-run "
                              "`lazybatch repo add`", field="output", source=source)
        for k, v in self.info_parameters().items():
            if k in params and params[k] != v:
                raise ConfigError(f"parameter {k} is {params[k]!r} but the stage manifest says {v}; re-run "
                                  "`lazybatch repo add`", field=f"parameters.{k}", source=source)

    # ------------------------------------------------------------------ requests
    def validate(self, tensors: Mapping[str, np.ndarray], max_batch_size: int) -> tuple[int, str | None]:
        """Check one request: (batch size, None) or (0, what is wrong and what to send instead)."""
        if TOKENS not in tensors:
            return 0, f"missing input {TOKENS!r} (INT64 [batch, length], the source token ids)"
        extra = sorted(set(tensors) - {TOKENS, *OPTIONAL})
        if extra:
            return 0, f"unexpected input(s) {extra}; this seq2seq model takes {TOKENS} and optionally {list(OPTIONAL)}"
        tok = tensors[TOKENS]
        if tok.dtype.kind not in "iu":
            return 0, f"input {TOKENS!r} has dtype {tok.dtype}, expected int64 token ids"
        if tok.ndim != 2 or tok.shape[0] < 1:
            return 0, f"input {TOKENS!r} has shape {list(tok.shape)}, expected [batch, length]"
        batch, length = int(tok.shape[0]), int(tok.shape[1])
        if batch > max_batch_size:
            return 0, f"batch size {batch} exceeds the model's max_batch_size {max_batch_size}"
        if not 1 <= length <= self.max_source_length:
            what = "prompt" if self.decoder_only else "source"
            return 0, (f"{what} length {length} is out of range: send 1..{self.max_source_length} tokens "
                       "(the model's max_source_length)")
        bad = (tok < self.min_token) | (tok >= self.vocab_size)
        if bad.any():
            r, c = (int(v[0]) for v in np.nonzero(bad))
            return 0, (f"token id {int(tok[r, c])} at row {r}, position {c} of {TOKENS!r} is outside the vocabulary "
                       f"{self.min_token}..{self.vocab_size - 1}")
        for name, lo, hi in ((SRC_LEN, 1, length), (MAX_OUT, 1, self.max_length)):
            if name not in tensors:
                continue
            a = tensors[name]
            if a.dtype.kind not in "iu" or a.shape != (batch, 1):
                return 0, f"input {name!r} must be integers of shape [{batch}, 1], got {a.dtype} {list(a.shape)}"
            if ((a < lo) | (a > hi)).any():
                what = "the row's source length (at most the src_tokens length)" if name == SRC_LEN else \
                    "the number of tokens to generate (at most the model's max_length)"
                return 0, f"input {name!r} holds {a.reshape(-1).tolist()}: each value must be in {lo}..{hi}, {what}"
        if IGNORE_EOS in tensors:
            a = tensors[IGNORE_EOS]
            if a.shape != (batch, 1):
                return 0, f"input {IGNORE_EOS!r} must have shape [{batch}, 1], got {list(a.shape)}"
            if a.astype(bool).any() and MAX_OUT not in tensors:
                return 0, f"{IGNORE_EOS} needs {MAX_OUT}: say how many tokens to generate"
        return batch, None

    def init_state(self, states: list[_State], enc_out: Mapping[str, Row] | None = None) -> dict[str, Row]:
        """Initial carried state of one request (shared, read-only arrays, or the encoder's output rows)."""
        out: dict[str, Row] = {}
        for s in states:
            if s.init_from is not None:
                out[s.input] = (enc_out or {})[s.init_from]
                continue
            a = self._init_cache.get(s.input)
            if a is None:
                spec = self.graph_inputs[s.input]
                a = np.full([1] + [max(d, 1) for d in spec["dims"]], s.init, dtype=spec["dtype"])
                self._init_cache[s.input] = a
            out[s.input] = (a, 0)
        return out
