"""Seq2seq serving: the encoder/decoder-step loop of an exported encoder-decoder, driven by the scheduler.

A seq2seq stage directory (``lazybatch export gnmt|transformer`` + ``lazybatch split``) holds an encoder (a per-token
ENCODER step for GNMT, STATIC stages run once for the Transformer) and a DECODER step whose carried state (LSTM h/c,
attention feed, KV caches, positions) is a graph input and output with the batch first. The manifest's ``seq2seq``
section says which output feeds which input on the next step (see docs/formats.md); ``Seq2SeqRunner`` in
``lazybatch.onnx_tools.seq2seq`` is the reference loop this module must agree with.

Why it is shaped this way:

- Every state tensor lives *per request* (a row of the batch that produced it). A stage job over requests at
  different timesteps gathers their rows into one batch, runs the stage, and scatters the outputs back as rows:
  a request's result never depends on who shared its batches (positions and masks are per row in the graphs, and
  the memory is a fixed ``[max_source_length, d]`` block masked by each row's ``src_len``, so no re-padding is
  needed when sources of different lengths meet).
- The executor reports the end of each sequence (end token, the request's ``max_output_len``, or the model's
  ``max_length``) in ``StageResult.loop_exits``; the scheduler's requests carry no ``dec_steps``.
- Graph batching keeps finished sequences in the batch until the longest one ends (``StageJob.batch_size`` >
  ``len(requests)``): the executor pads the batch with copies of a live row, so its cost is that of a whole-graph
  run, and throws the padding away.

The served interface (config.pbtxt, written by ``lazybatch repo add``): inputs ``src_tokens`` (INT64 ``[-1]``, the
source ids, 1..max_source_length of them), optional ``src_len`` (INT64 ``[1]``, the row's true length when rows of
one request are padded to a common length), optional ``max_output_len`` (INT64 ``[1]``), optional ``ignore_eos``
(BOOL ``[1]``: decode exactly ``max_output_len`` tokens; random weights never make a meaningful end token, so
benchmarks fix output lengths this way); outputs ``output_tokens`` (INT64 ``[-1]``, padded with -1 past each row's
end) and ``output_len`` (INT64 ``[1]``).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.interfaces import StageJob, StageResult
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.base import Policy
from lazybatch.batcher.policies.spec import PolicySpec
from lazybatch.batcher.request import Request, Status

from .rows import Parent, Row, Sample
from .runtime import BackendRuntime
from .runtime_stats import RuntimeStats
from .seq2seq_spec import IGNORE_EOS, MAX_OUT, OUT_LEN, OUT_TOKENS, PAD, SRC_LEN, TOKENS, Seq2SeqSpec
from .stages import StageRunner

# a streamed part: the request it answers (its Triton handle) and the outputs of the non-final response
Part = tuple[Any, dict[str, np.ndarray]]


class _Seq(Sample):
    """One sequence (a row of a client request) and everything it carries between steps."""

    __slots__ = ("inputs", "state", "enc_done", "enc_steps", "encoded", "enc_out", "tokens", "limit", "stop_at_eos",
                 "sent")

    def __init__(self, parent: Parent, row: int, spec: Seq2SeqSpec) -> None:
        super().__init__(parent, row)
        t = parent.inputs
        tok = t[TOKENS][row]
        n = int(t[SRC_LEN][row, 0]) if SRC_LEN in t else tok.shape[0]
        src = np.zeros((1, spec.max_source_length), np.int64)
        src[0, :tok.shape[0]] = tok
        self.inputs: dict[str, Row] = {TOKENS: (src, 0), SRC_LEN: (np.array([n], np.int64), 0)}
        self.state = spec.init_state(spec.enc_state)
        self.enc_done = 0
        self.enc_steps = n if spec.per_token else 1
        self.encoded = False
        self.enc_out: dict[str, Row] = {}
        self.tokens: list[int] = []
        self.limit = min(int(t[MAX_OUT][row, 0]), spec.max_length) if MAX_OUT in t else spec.max_length
        self.stop_at_eos = not (IGNORE_EOS in t and bool(t[IGNORE_EOS][row, 0]))
        self.sent = 0  # tokens already streamed to the client (decoupled models)

    def value(self, name: str, spec: Seq2SeqSpec) -> Row:
        """A stage input that comes "from the model": carried state, a request input, or a bound tensor."""
        v = self.state.get(name) or self.inputs.get(name)
        if v is not None:
            return v
        for b in spec.bind:
            if b["input"] == name:
                return self.enc_out[b["encoder_output"]] if "encoder_output" in b else self.inputs[b["request_input"]]
        raise KeyError(f"no value for stage input {name!r}")


FIRST_PART_KEPT = 10_000  # server-side first-part times a model's stats keep (the most recent)


@dataclass
class Seq2SeqStats(RuntimeStats):
    """RuntimeStats plus what shows that decoder steps of requests at different timesteps shared a batch."""

    decoder_steps: int = 0  # decoder-step jobs (one per batched step)
    mixed_timestep_steps: int = 0  # of those, how many held rows at different timesteps
    max_timestep_spread: int = 0  # largest (max - min) timestep within one batched step
    tokens: int = 0
    padded_rows: int = 0  # rows added to graph-batching runs for sequences that already ended
    finished_eos: int = 0  # sequences the end token ended (before their length limit, or at it)
    finished_length: int = 0  # sequences that reached max_output_len or the model's max_length
    streamed: int = 0  # non-final responses sent (decoupled models)
    # decoupled models: from execute's hand-off to each request's first part sent (server-side time to first token;
    # a request answered in its final response alone has none)
    first_part_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=FIRST_PART_KEPT))

    def as_dict(self) -> dict[str, Any]:
        first = sorted(self.first_part_s)
        return {**super().as_dict(), "decoder_steps": self.decoder_steps,
                "mixed_timestep_steps": self.mixed_timestep_steps, "max_timestep_spread": self.max_timestep_spread,
                "tokens": self.tokens, "padded_rows": self.padded_rows, "finished_eos": self.finished_eos,
                "finished_length": self.finished_length, "streamed": self.streamed,
                "first_part": {"n": len(first), "mean_ms": sum(first) / len(first) * 1e3 if first else None,
                               "p50_ms": first[len(first) // 2] * 1e3 if first else None,
                               "p99_ms": first[int(0.99 * len(first))] * 1e3 if first else None,
                               "max_ms": first[-1] * 1e3 if first else None}}


class Seq2SeqRuntime(BackendRuntime):
    """The backend runtime with per-request seq2seq state and loop exits (see the module docstring)."""

    stats_class = Seq2SeqStats

    def __init__(self, runner: StageRunner, table: LatencyTable, policy: Policy, respond: Any, *,
                 spec: Seq2SeqSpec, stream_every: int = 0, **kw: Any) -> None:
        self.spec = spec
        # decoupled models: a row's new tokens go out once it holds this many unsent ones (0: one final answer)
        self.stream_every = stream_every
        super().__init__(runner, table, policy, respond, **kw)

    def _sample_args(self, parent: Parent, row: int) -> dict[str, Any]:
        seq = _Seq(parent, row, self.spec)
        return {"payload": seq, "enc_steps": seq.enc_steps}

    def _run(self, job: StageJob) -> StageResult | None:
        reqs = [r for r in job.requests if not r.cancelled]
        if not reqs:
            return None
        pad = max(0, job.batch_size - len(job.requests))
        errors: dict[int, str] = {}
        exits: set[int] = set()
        parts: list[Part] = []
        metrics = self.metrics
        try:
            exits = self._run_batch(job.stage, reqs, parts, pad)
        except Exception as e:
            if metrics is not None:  # as in the base runtime: a failed batched run and each failed rerun count
                metrics.stage_failed(job.stage)
            if len(reqs) == 1:
                errors[reqs[0].id] = f"{type(e).__name__}: {e}"
            else:  # nothing was written back: run each alone, so only the ones that fail on their own fail
                for r in reqs:
                    try:
                        exits |= self._run_batch(job.stage, [r], parts, 0)
                    except Exception as e1:
                        if metrics is not None:
                            metrics.stage_failed(job.stage)
                        errors[r.id] = f"{type(e1).__name__}: {e1}"
        if job.stage == self.spec.dec_last:
            return StageResult(loop_exits=exits, errors=errors or None, parts=parts)
        return StageResult(errors=errors) if errors else None

    def _run_batch(self, stage: int, reqs: list[Request], parts: list[Part],  # type: ignore[override]
                   pad: int = 0) -> set[int]:
        """Gather the rows, run the stage, scatter the rows back; returns the ids whose sequence ended, and adds to
        ``parts`` the tokens a decoupled model streams after this step (``_stream``)."""
        spec = self.spec
        runner = self.runner
        stats: Seq2SeqStats = self.stats  # type: ignore[assignment]
        t0 = time.perf_counter()
        seqs: list[_Seq] = [r.payload for r in reqs]
        feeds: dict[str, Any] = {}
        for inp in runner.manifest.stages[stage].inputs:
            rows = [s.value(inp.name, spec) if inp.source is None else s.tensors[inp.name] for s in seqs]
            # graph batching's padding: copies of the last live row (host numpy or the device, runner.join)
            feeds[inp.name] = runner.join(rows + rows[-1:] * pad)
        t1 = time.perf_counter()
        if self.fault is not None:  # fault injection (tests, drills): as in the base runtime
            self.fault.check(stage, [r.id for r in reqs])
        outs = runner.run_resident(stage, feeds)  # state stays on the device between steps where the path is on
        t2 = time.perf_counter()
        exits: set[int] = set()
        mixed = eos = 0
        for k, s in enumerate(seqs):
            for name, arr in outs.items():
                s.tensors[name] = (arr, k)
        if stage == spec.dec_first:  # counted once the step ran: a failed batched run and its reruns are one step
            stats.decoder_steps += 1
            steps = [len(s.tokens) for s in seqs]
            if len(set(steps)) > 1:
                mixed = 1
                stats.mixed_timestep_steps += 1
                stats.max_timestep_spread = max(stats.max_timestep_spread, max(steps) - min(steps))
        if stage == spec.enc_last:
            for s in seqs:
                self._end_encoder_step(s)
        elif stage == spec.dec_last:
            tok = outs[spec.token_output]
            if runner.resident is not None:  # the step's tokens, the one tensor the loop reads on the host
                tok = runner.to_host([(tok, k) for k in range(len(seqs))])
            for k, (r, s) in enumerate(zip(reqs, seqs)):
                t = int(tok[k])
                s.tokens.append(t)
                s.state = {st.input: s.tensors[st.output] for st in spec.dec_state}
                s.tensors = {}
                if s.stop_at_eos and t == spec.end_token:
                    exits.add(r.id)
                    eos += 1
                elif len(s.tokens) >= s.limit:
                    exits.add(r.id)
            stats.tokens += len(seqs)
            stats.finished_eos += eos
            stats.finished_length += len(exits) - eos
            if self.stream_every:
                parts += self._stream(reqs, exits)
        t3 = time.perf_counter()
        stats.stage_runs += 1
        stats.batch_hist[len(reqs)] = stats.batch_hist.get(len(reqs), 0) + 1
        stats.padded_rows += pad
        stats.ort_s += t2 - t1
        stats.io_s += (t1 - t0) + (t3 - t2)
        if self.metrics is not None:  # the loop's own metrics (backend/metrics.py SEQ2SEQ_FAMILIES)
            last = stage == spec.dec_last
            self.metrics.seq2seq_run(decoder_step=stage == spec.dec_first, mixed=bool(mixed),
                                     tokens=len(seqs) if last else 0, eos=eos, length=len(exits) - eos,
                                     padded_rows=pad)
        if self.on_batch is not None:  # the per-batch log counts executed rows, graph padding included
            self.on_batch(stage, len(reqs) + pad, t2 - t1)
        self._calibrate(stage, len(reqs) + pad, t3 - t0)  # the table's time is for the executed rows, padding too
        return exits

    def _end_encoder_step(self, s: _Seq) -> None:
        spec = self.spec
        s.enc_done += 1
        if s.enc_done < s.enc_steps:
            s.state = {st.input: s.tensors[st.output] for st in spec.enc_state}
        else:  # the encoder is done: keep its outputs (the attention memory), start the decoder
            s.enc_out = {n: s.tensors[n] for n in spec.enc_outputs if n in s.tensors}
            s.state = spec.init_state(spec.dec_state, s.enc_out)
            s.enc_out = {n: s.enc_out[n] for n in spec.bound_outputs if n in s.enc_out}  # the rest is state now
            s.encoded = True
        s.tensors = {}

    def _stream(self, reqs: list[Request], exits: set[int]) -> list[Part]:
        """The parts to stream: the new tokens of each request that holds ``stream_every`` unsent ones in some row,
        unless this step ends its last row: the final answer then carries them (one response fewer, and the final
        flag comes with data, which every client sees; an empty final response reaches gRPC clients only on
        request). The scheduler's next step returns them (``Step.parts``) and the runtime sends them."""
        out: list[Part] = []
        ending: dict[int, int] = {}
        parents: dict[int, Parent] = {}
        for r in reqs:
            parent = r.payload.parent
            parents[id(parent)] = parent
            if r.id in exits:
                ending[id(parent)] = ending.get(id(parent), 0) + 1
        k = self.stream_every
        for key, parent in parents.items():
            if parent.answered or parent.remaining - ending.get(key, 0) <= 0:
                continue
            seqs: list[_Seq] = [x.payload for x in parent.samples]
            if max(len(s.tokens) - s.sent for s in seqs) >= k:
                self.stats.streamed += 1  # type: ignore[attr-defined]
                if not any(s.sent for s in seqs):
                    self.stats.first_part_s.append(self.clock.now() - parent.samples[0].arrival)  # type: ignore
                out.append((parent.handle, _token_rows([s.tokens[s.sent:] for s in seqs])))
                for s in seqs:
                    s.sent = len(s.tokens)
        return out

    def _on_sample_done(self, r: Request) -> None:
        seq: _Seq = r.payload
        parent = seq.parent
        if parent.answered:
            return
        if r.status is not Status.OK:
            super()._on_sample_done(r)
            return
        parent.rows[seq.row] = seq.tokens  # type: ignore[assignment]
        seq.state, seq.enc_out, seq.tensors = {}, {}, {}
        parent.remaining -= 1
        if parent.remaining:
            return
        rows: list[list[int]] = parent.rows  # type: ignore[assignment]
        if self.stream_every:  # what was not streamed yet
            rows = [t[x.payload.sent:] for t, x in zip(rows, parent.samples)]
        self._answer(parent, _token_rows(rows), Status.OK, None)


def _token_rows(rows: list[list[int]]) -> dict[str, np.ndarray]:
    """output_tokens (rows padded with -1) and output_len of a response."""
    width = max(len(t) for t in rows)
    out = np.full((len(rows), width), PAD, np.int64)
    for i, t in enumerate(rows):
        out[i, :len(t)] = t
    return {OUT_TOKENS: out, OUT_LEN: np.array([[len(t)] for t in rows], np.int64)}


def _length_histogram(s2s: Seq2SeqSpec, table: LatencyTable):
    """The decode-length histogram the table was profiled with (``meta["length_histogram"]``, where that file is
    here), else the shipped one the model names (the WMT-like one by default, as ``lazybatch profile`` and the
    clients use); None where neither loads."""
    from pathlib import Path

    from lazybatch.batcher.lengths import LengthHistogram
    from lazybatch.formats.histograms import shipped_histogram

    profiled = table.meta.get("length_histogram")
    try:
        path = Path(profiled) if profiled and Path(profiled).is_file() else shipped_histogram(s2s.length_histogram)
        return LengthHistogram.load(path)
    except (ConfigError, OSError, ValueError):
        return None


def build_policy(spec: PolicySpec, s2s: Seq2SeqSpec, table: LatencyTable, *, max_batch_size: int | None,
                 dec_timesteps: int | None, coverage: float, decoupled: bool = False) -> Policy:
    """The policy, with the decoder steps Algorithm 1 assumes: the policy's own dec_timesteps, else the config's,
    else the latency table's (``dec_timesteps_90`` of its length histogram), capped at the model's max_length.
    Eager gets the length histogram itself (``_length_histogram``: its admission conditions the predicted length on
    each row's progress). Up to commit 5d24c6a eager got neither, and predicted one more step for every row (so it
    admitted up to the batch cap wherever that step kept the deadlines). A decoupled model's eager admits up to the
    batch cap (``admission=first_token``: its users weigh the first token; batcher/policies/eager.py says why)
    unless the policy names its admission."""
    entry = spec.entry  # the registry's traits, never the policy's name
    if decoupled and entry.takes_length_histogram and entry.takes("admission") and "admission" not in spec.params:
        spec = PolicySpec(spec.kind, {**spec.params, "admission": "first_token"}, spec.text)
    hist = None
    if entry.takes_length_histogram and "dec_timesteps" not in spec.params:
        hist = _length_histogram(s2s, table)
    if hist is None and entry.takes("dec_timesteps") and "dec_timesteps" not in spec.params:
        dec = dec_timesteps or table.meta.get("dec_timesteps") or table.meta.get("dec_timesteps_90")
        if dec:
            spec = PolicySpec(spec.kind, {**spec.params, "dec_timesteps": min(int(dec), s2s.max_length)}, spec.text)
    return spec.build(max_batch_size=max_batch_size, dec_timesteps_coverage=coverage, length_histogram=hist)


def warm_up(runner: StageRunner, spec: Seq2SeqSpec) -> None:
    """One run of every stage on valid inputs (the first onnxruntime run is slow)."""
    from lazybatch.sessions.chain import random_feeds

    feeds = random_feeds(list(spec.graph_inputs.values()), 1, np.random.default_rng(0))
    runner.run_all(feeds)
