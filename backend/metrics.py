"""Prometheus metrics of a lazybatch model, exported as Triton custom metrics (``pb_utils.MetricFamily``).

Two halves, so that the bookkeeping is testable without a server:

- ``ModelMetrics`` (no Triton): counters, gauges and cumulative histograms kept in this process. The scheduler
  thread updates it (a few integer additions per request and per stage); it never talks to the server.
- ``TritonMetricsExporter``: a background thread that, every ``metrics_interval_ms``, pushes what changed since the
  last push to Triton's metric families (one ``increment``/``set`` per changed series). Every pb_utils metric call
  is a round trip to the server process, so one call per observation would put that round trip on the scheduler
  thread at every stage; pushing deltas keeps the cost per interval bounded however heavy the traffic.

Histograms are exported the way Prometheus lays them out: ``<name>_bucket{le="..."}`` (cumulative), ``<name>_sum``
and ``<name>_count``, each a Triton COUNTER family. Triton 2.51's Python backend also has a HISTOGRAM kind, but it
takes one ``observe`` call (one round trip) per value and cannot take a batch of them, which is what the push of
deltas needs. ``histogram_quantile()`` works on these series as on any Prometheus histogram; the scrape shows
``# TYPE ... counter`` for them. Names and labels: docs/operations.md.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
import threading
import time
from typing import Any, NamedTuple, Sequence

from lazybatch.batcher.decisions import CORES, WEIGHT

# request outcomes (label "outcome" of lazybatch_requests_total)
OK, REJECTED, CANCELLED, ERROR, UNAVAILABLE, INVALID = "ok", "rejected", "cancelled", "error", "unavailable", \
    "invalid"
OUTCOMES = (OK, REJECTED, CANCELLED, ERROR, UNAVAILABLE, INVALID)
SECONDS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

COUNTER, GAUGE = "counter", "gauge"

# name -> (kind, help)
FAMILIES: dict[str, tuple[str, str]] = {
    "lazybatch_requests_total": (COUNTER, "Client requests answered, by outcome (ok, rejected, cancelled, error, "
                                          "unavailable = unloaded while held, invalid = refused by validation)"),
    "lazybatch_sla_total": (COUNTER, "Requests answered OK that had a deadline, by result (met, missed)"),
    "lazybatch_rejected_total": (COUNTER, "Requests refused at admission, by reason (queue_full, deadline, closed)"),
    "lazybatch_queue_delay_seconds_bucket": (COUNTER, "Arrival to the first stage run, cumulative buckets (le)"),
    "lazybatch_queue_delay_seconds_sum": (COUNTER, "Sum of queue delays in seconds"),
    "lazybatch_queue_delay_seconds_count": (COUNTER, "Number of queue delays observed"),
    "lazybatch_request_latency_seconds_bucket": (COUNTER, "Arrival to response of OK requests, cumulative buckets"),
    "lazybatch_request_latency_seconds_sum": (COUNTER, "Sum of end-to-end latencies in seconds"),
    "lazybatch_request_latency_seconds_count": (COUNTER, "Number of end-to-end latencies observed"),
    "lazybatch_stage_batch_size_bucket": (COUNTER, "Samples per executed stage run, cumulative buckets (le)"),
    "lazybatch_stage_batch_size_sum": (COUNTER, "Sum of executed stage batch sizes"),
    "lazybatch_stage_batch_size_count": (COUNTER, "Number of executed stage runs"),
    "lazybatch_stage_failures_total": (COUNTER, "Stage runs in which onnxruntime raised"),
    "lazybatch_decisions_total": (COUNTER, "Scheduler decisions by kind (dispatch, preempt, merge, split, "
                                                 "reject; device in a device group, weight in the CPU share)"),
    "lazybatch_dispatch_reasons_total": (COUNTER, "Dispatches by reason (numbers in the reason replaced by N)"),
    "lazybatch_preferred_batch_size": (GAUGE, "BatchMonitor's current preferred batch size"),
    "lazybatch_queue_samples": (GAUGE, "Samples the scheduler holds (queued or in a sub-batch)"),
}
# Seq2seq models only (backend/seq2seq.py): what the decoder loop did. Exported by models whose ModelMetrics was made
# with seq2seq=True, so that a static model's scrape keeps exactly its own families.
SEQ2SEQ_FAMILIES: dict[str, tuple[str, str]] = {
    "lazybatch_decoder_steps_total": (COUNTER, "Batched decoder steps run (one per decoder-step job; seq2seq)"),
    "lazybatch_mixed_timestep_steps_total": (COUNTER, "Decoder steps whose batch held sequences at different "
                                                      "timesteps (seq2seq)"),
    "lazybatch_tokens_total": (COUNTER, "Tokens generated (seq2seq)"),
    "lazybatch_sequences_total": (COUNTER, "Sequences that finished decoding, by end (eos: the end token ended it "
                                           "early; length: max_output_len or the model's max_length) (seq2seq)"),
    "lazybatch_padded_rows_total": (COUNTER, "Rows of already finished sequences carried in graph-batching stage "
                                             "runs (seq2seq)"),
}
FAMILIES.update(SEQ2SEQ_FAMILIES)
# device_group models only (backend/arbiter): the model's use of the shared device, from its gate's own bookkeeping
# (no round trip to the arbiter). Its share of the device: rate(device_time) over the sum of every model's.
DEVICE_FAMILIES: dict[str, tuple[str, str]] = {
    "lazybatch_device_time_seconds_total": (COUNTER, "Seconds this model's stage jobs held the shared device "
                                                     "(device_group); share = its rate over the group's sum"),
    "lazybatch_device_wait_seconds_total": (COUNTER, "Seconds this model waited for the shared device between asking "
                                                     "and its grant (device_group)"),
    "lazybatch_device_grants_total": (COUNTER, "Grants of the shared device to this model (device_group)"),
}
FAMILIES.update(DEVICE_FAMILIES)
# CPU-share models only (backend/cpu_share.py): how the model's threads yielded the cores to more urgent models
CPU_SHARE_FAMILIES: dict[str, tuple[str, str]] = {
    "lazybatch_cpu_share_nice": (GAUGE, "The nice value the CPU share gives the model's threads now (0: not "
                                        "lowered)"),
    "lazybatch_cpu_share_lowered_seconds_total": (COUNTER, "Seconds the model's threads were lowered beside more "
                                                           "urgent models"),
    "lazybatch_cpu_share_weight_changes_total": (COUNTER, "Thread weight changes made (setpriority calls)"),
    "lazybatch_cpu_share_refused_total": (COUNTER, "Thread weight changes not made: they could not have been undone "
                                                   "without CAP_SYS_NICE or RLIMIT_NICE (the log says what to grant)"),
    "lazybatch_cpu_share_parks_total": (COUNTER, "Times the idle model's onnxruntime workers were parked in "
                                                 "SCHED_IDLE (cpu_share_park)"),
}
FAMILIES.update(CPU_SHARE_FAMILIES)

_NUMBER = re.compile(r"\d+(\.\d+)?")


def reason_label(reason: str) -> str:
    """A bounded label from a decision's reason text: the part before ':' or '(', numbers replaced by N."""
    head = reason.split(":", 1)[0].split("(", 1)[0].strip()
    return _NUMBER.sub("N", head) or "unspecified"


class Histogram:
    """Prometheus-style histogram: per-bucket counts (upper bounds ``bounds`` and +Inf), sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le), ending with +Inf = count."""
        out, run = [], 0
        for b, c in zip(self.bounds, self.counts):
            run += c
            out.append((f"{b:g}", run))
        out.append(("+Inf", self.count))
        return out


class Sample(NamedTuple):
    family: str
    labels: tuple[tuple[str, str], ...]
    value: float


def batch_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to max_batch_size (included): the sizes the latency table was profiled at."""
    from .stage_profile import profile_batch_sizes

    return profile_batch_sizes(max_batch_size)


class ModelMetrics:
    """The metrics of one model (see the module docstring); thread-safe, cheap to update."""

    def __init__(self, model: str, stages: Sequence[str], max_batch_size: int, *, seq2seq: bool = False,
                 device: bool = False, cpu_share: Any = None) -> None:
        self.model = model
        self.cpu_share = cpu_share  # its CpuShare (backend/cpu_share.py), read at each collect; None: no families
        # device_group models: the families of DEVICE_FAMILIES, read from ``device_source`` (the arbiter gate, which
        # keeps device_s, wait_s and grants) at each collect; given once the gate is attached (read_device_from)
        self.device = device
        self.device_source: Any = None
        self.stages = list(stages)
        # the decoder loop's counters (SEQ2SEQ_FAMILIES), for encoder-decoder models only
        self.seq2seq: dict[str, int] | None = ({"decoder_steps": 0, "mixed_timestep_steps": 0, "tokens": 0, "eos": 0,
                                                "length": 0, "padded_rows": 0} if seq2seq else None)
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.sla = {"met": 0, "missed": 0}
        self.rejected: dict[str, int] = {}
        self.queue_delay = Histogram(SECONDS_BUCKETS)
        self.latency = Histogram(SECONDS_BUCKETS)
        bb = batch_buckets(max_batch_size)
        self.batch = [Histogram(bb) for _ in self.stages]
        self.stage_failures = [0] * len(self.stages)
        self.decisions: dict[str, int] = {}
        self.reasons: dict[str, int] = {}
        self.gauges: dict[str, float] = {"lazybatch_queue_samples": 0.0}
        self._log_seen = 0  # decisions of the log already read
        self._last_sync = 0.0

    # ------------------------------------------------------------------ updates (any thread)
    def read_device_from(self, gate: Any) -> None:
        """The device group's gate this model now holds (a new one after an arbiter's restart): its device time,
        wait and grants are read at each collect."""
        self.device_source = gate

    def answered(self, samples: Sequence[Any], outcome: str, *, reject_reason: str | None = None) -> None:
        """One answered client request (its scheduler samples): outcome, and for OK its latency, queue delay and
        whether it met its SLA."""
        if outcome != OK:
            self.request_done(outcome, reject_reason=reject_reason)
            return
        now = time.monotonic()
        first = samples[0]
        starts = [r.start for r in samples if r.start is not None]
        deadline = min(r.deadline for r in samples)
        self.request_done(OK, latency=now - first.arrival, queue_delay=min(starts) - first.arrival if starts else None,
                          sla_met=None if deadline == float("inf") else now <= deadline)

    def request_done(self, outcome: str, *, latency: float | None = None, queue_delay: float | None = None,
                     sla_met: bool | None = None, reject_reason: str | None = None) -> None:
        with self._lock:
            self.requests[outcome] += 1
            if latency is not None:
                self.latency.observe(latency)
            if queue_delay is not None:
                self.queue_delay.observe(queue_delay)
            if sla_met is not None:
                self.sla["met" if sla_met else "missed"] += 1
            if reject_reason is not None:
                self.rejected[reject_reason] = self.rejected.get(reject_reason, 0) + 1

    def stage_run(self, stage: int, batch_size: int) -> None:
        with self._lock:
            self.batch[stage].observe(batch_size)

    def passes_done(self, n_stages: int, batch_size: int, answered: Sequence[tuple[float, int]],
                    failed: int = 0) -> None:
        """Whole-graph passes of ``batch_size`` samples each, one (seconds after execute began, requests answered)
        per pass in ``answered``, and ``failed`` more requests that failed alone in them: what ``stage_run`` for
        every stage and ``request_done`` for every request record, under one lock with one bucket lookup each
        (the scheduler thread applies an interval's inline passes at once, backend/inline_passes.py)."""
        with self._lock:
            passes = len(answered)
            if n_stages and passes:
                i = bisect.bisect_left(self.batch[0].bounds, batch_size)
                for s in range(n_stages):
                    h = self.batch[s]
                    h.counts[i] += passes
                    h.sum += batch_size * passes
                    h.count += passes
            lat = self.latency
            bounds = lat.bounds
            total = 0
            for latency, ok in answered:
                if ok:
                    lat.counts[bisect.bisect_left(bounds, latency)] += ok
                    lat.sum += latency * ok
                    total += ok
            if total:
                lat.count += total
                self.requests[OK] += total
                q = self.queue_delay
                q.counts[bisect.bisect_left(q.bounds, 0.0)] += total
                q.count += total
            if failed:
                self.requests[ERROR] += failed

    def stage_failed(self, stage: int) -> None:
        with self._lock:
            self.stage_failures[stage] += 1

    def seq2seq_run(self, *, decoder_step: bool = False, mixed: bool = False, tokens: int = 0, eos: int = 0,
                    length: int = 0, padded_rows: int = 0) -> None:
        """One successful stage run of a seq2seq model: a decoder step started (its first stage), tokens made and
        sequences ended (its last stage: ``eos`` at the end token, ``length`` at their length limit), graph padding."""
        c = self.seq2seq
        if c is None:
            return
        with self._lock:
            c["decoder_steps"] += decoder_step
            c["mixed_timestep_steps"] += mixed
            c["tokens"] += tokens
            c["eos"] += eos
            c["length"] += length
            c["padded_rows"] += padded_rows

    def family_names(self) -> list[str]:
        """The metric families this model exports (the seq2seq ones only for a seq2seq model)."""
        return [f for f in FAMILIES if (self.seq2seq is not None or f not in SEQ2SEQ_FAMILIES)
                and (self.device or f not in DEVICE_FAMILIES)
                and (self.cpu_share is not None or f not in CPU_SHARE_FAMILIES)]

    def sync_scheduler(self, log: Any, *, held: int, policy: Any = None, now: float | None = None,
                       min_interval: float = 0.0) -> None:
        """Copy the decision log's counts and the new dispatch reasons, the queue gauge and BatchMonitor's preferred
        batch size. Call it on the thread that owns the scheduler (it reads the log's ring buffer)."""
        now = time.monotonic() if now is None else now
        if now - self._last_sync < min_interval:
            return
        self._last_sync = now
        total = sum(log.counts.values())
        new = total - self._log_seen
        reasons: dict[str, int] = {}
        if new > 0:
            records = log.records
            for d in itertools.islice(reversed(records), min(new, len(records))):
                if d.kind == "dispatch":
                    lab = reason_label(d.reason)
                    reasons[lab] = reasons.get(lab, 0) + 1
        self._log_seen = total
        with self._lock:
            self.decisions = dict(log.counts)
            for lab, c in reasons.items():
                self.reasons[lab] = self.reasons.get(lab, 0) + c
            self.gauges["lazybatch_queue_samples"] = float(held)
            pbs = getattr(policy, "pbs", None)
            if pbs is not None:
                self.gauges["lazybatch_preferred_batch_size"] = float(pbs)

    # ------------------------------------------------------------------ reading
    def collect(self) -> list[Sample]:
        """Every series with its current (cumulative) value."""
        m = (("model", self.model),)
        out: list[Sample] = []
        with self._lock:
            out += [Sample("lazybatch_requests_total", m + (("outcome", k),), v) for k, v in self.requests.items()]
            out += [Sample("lazybatch_sla_total", m + (("result", k),), v) for k, v in self.sla.items()]
            out += [Sample("lazybatch_rejected_total", m + (("reason", k),), v) for k, v in self.rejected.items()]
            out += _hist("lazybatch_queue_delay_seconds", m, self.queue_delay)
            out += _hist("lazybatch_request_latency_seconds", m, self.latency)
            for name, h, fails in zip(self.stages, self.batch, self.stage_failures):
                lab = m + (("stage", name),)
                out += _hist("lazybatch_stage_batch_size", lab, h)
                out.append(Sample("lazybatch_stage_failures_total", lab, fails))
            out += [Sample("lazybatch_decisions_total", m + (("kind", k),), v) for k, v in self.decisions.items()]
            if self.cpu_share is not None:  # the CPU share's own decisions (its nice and cores changes)
                counts = self.cpu_share.log.counts  # its log counts the scheduler's kinds too, at 0: only its own
                out += [Sample("lazybatch_decisions_total", m + (("kind", k),), counts[k])
                        for k in (WEIGHT, CORES) if k in counts]
            out += [Sample("lazybatch_dispatch_reasons_total", m + (("reason", k),), v)
                    for k, v in self.reasons.items()]
            out += [Sample(k, m, v) for k, v in self.gauges.items()]
            c = self.seq2seq
            if c is not None:
                out += [Sample("lazybatch_decoder_steps_total", m, c["decoder_steps"]),
                        Sample("lazybatch_mixed_timestep_steps_total", m, c["mixed_timestep_steps"]),
                        Sample("lazybatch_tokens_total", m, c["tokens"]),
                        Sample("lazybatch_sequences_total", m + (("end", "eos"),), c["eos"]),
                        Sample("lazybatch_sequences_total", m + (("end", "length"),), c["length"]),
                        Sample("lazybatch_padded_rows_total", m, c["padded_rows"])]
        g = self.device_source
        if self.device and g is not None:
            out += [Sample("lazybatch_device_time_seconds_total", m, g.device_s),
                    Sample("lazybatch_device_wait_seconds_total", m, g.wait_s),
                    Sample("lazybatch_device_grants_total", m, g.grants)]
        share = self.cpu_share
        if share is not None:
            out += [Sample("lazybatch_cpu_share_nice", m, share.nice),
                    Sample("lazybatch_cpu_share_lowered_seconds_total", m, share.lowered_seconds()),
                    Sample("lazybatch_cpu_share_weight_changes_total", m, share.weights.changes),
                    Sample("lazybatch_cpu_share_refused_total", m, share.weights.refused),
                    Sample("lazybatch_cpu_share_parks_total", m, share.park.parks if share.park is not None else 0)]
        return out

    def to_prometheus(self) -> str:
        """The same series in Prometheus' text format (what a scrape of Triton's metrics port shows)."""
        lines, typed = [], set()
        for s in self.collect():
            if s.family not in typed:
                typed.add(s.family)
                kind, help_ = FAMILIES[s.family]
                lines += [f"# HELP {s.family} {help_}", f"# TYPE {s.family} {kind}"]
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels)
            lines.append(f"{s.family}{{{labels}}} {s.value:g}")
        return "\n".join(lines) + "\n"


def _hist(name: str, labels: tuple[tuple[str, str], ...], h: Histogram) -> list[Sample]:
    out = [Sample(f"{name}_bucket", labels + (("le", le),), c) for le, c in h.cumulative()]
    out += [Sample(f"{name}_sum", labels, h.sum), Sample(f"{name}_count", labels, h.count)]
    return out


class TritonMetricsExporter:
    """Pushes a ``ModelMetrics`` to Triton's custom metric families from a background thread.

    Every series carries a ``stub_pid`` label (this model instance's process). Why: Triton's core hands two metrics
    with the same family name and labels the same Prometheus series, but counts references per family object, so
    when one of them is deleted the series is freed under the other. That happens on every in-place reload (Triton
    starts the new instance, then finalizes the old one, whose series have the same model label): the server then
    wrote to freed memory and died (``corrupted double-linked list``, ``malloc(): unaligned fastbin chunk
    detected``; tests/triton/test_ops_server.py reloads a model in place). Two instances of one model
    (``instance_group`` count > 1) shared their series the same way, and overwrote each other's gauges. With the
    process in the labels no two live instances share a series; ``sum by (model)`` adds them up.
    """

    def __init__(self, metrics: ModelMetrics, pb_utils: Any, interval_s: float = 1.0) -> None:
        self.metrics = metrics
        self.pb = pb_utils
        self.interval_s = interval_s
        self._instance = (("stub_pid", str(os.getpid())),)
        kinds = {COUNTER: pb_utils.MetricFamily.COUNTER, GAUGE: pb_utils.MetricFamily.GAUGE}
        self.families = {name: pb_utils.MetricFamily(name=name, description=FAMILIES[name][1],
                                                     kind=kinds[FAMILIES[name][0]])
                         for name in metrics.family_names()}
        self._series: dict[tuple[str, tuple], Any] = {}
        self._pushed: dict[tuple[str, tuple], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{metrics.model}-metrics", daemon=True)
        self._thread.start()

    def push(self) -> None:
        for s in self.metrics.collect():
            key = (s.family, s.labels)
            last = self._pushed.get(key)
            if last == s.value:
                continue
            metric = self._series.get(key)
            if metric is None:
                metric = self.families[s.family].Metric(labels=dict(s.labels + self._instance))
                self._series[key] = metric
            if FAMILIES[s.family][0] == GAUGE:
                metric.set(float(s.value))
            else:
                delta = float(s.value) - (last or 0.0)
                if delta > 0:
                    metric.increment(delta)
            self._pushed[key] = s.value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._safe_push()

    def _safe_push(self) -> None:
        try:
            self.push()
        except Exception as e:  # metrics are never worth a failed request
            import sys

            print(f"lazybatch: pushing metrics failed: {e}", file=sys.stderr)

    def close(self) -> None:
        """Stop the thread, push once more, and release the metrics before their families (pb_utils requires it)."""
        self._stop.set()
        self._thread.join(5.0)
        self._safe_push()
        self._series.clear()
        self.families.clear()


def outcome_of(status: str, *, rejected: bool = False) -> str:
    """The metrics outcome of an answer's scheduler status (``Status.name``); an UNAVAILABLE answer given while
    admitting is a rejection."""
    if rejected:
        return REJECTED
    return {"OK": OK, "CANCELLED": CANCELLED, "ERROR": ERROR}.get(status, UNAVAILABLE)
