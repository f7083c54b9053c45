"""The inline route: whole-graph passes run in Triton's ``execute`` call, beside the scheduler thread.

Why: a request that goes through the scheduler costs a hand-off to its thread, another to the response thread and a
response round trip of its own, on the cores onnxruntime needs (docs/results/default.md: the served gap to Triton's
batcher was that cost, not the decisions). Passes run inline only where they are the ones the scheduler would run:
nothing held, and the policy would start these requests so, with no decision point in their passes
(``InlineHooks.inline_batch``, batcher/policies/backend_hooks.py). Triton's dynamic batcher queues what arrives
meanwhile and hands it to the next ``execute`` as one group: its own behaviour with no queue delay.

An inline pass holds the lock the scheduler thread holds whenever it is awake (``lock``, the runtime's ``busy``)
throughout, so that the policy and the table are only ever touched by one thread at a time. The route reads the
runtime's inbox state (``pending``, ``closed``, ``idle``) and tells the scheduler thread's loop when a pass answered
(``note_answer``, ``note_pass``, ``note_work``); it writes none of the loop's or the runtime's fields.
"""

from __future__ import annotations

from array import array
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from lazybatch.batcher.policies.backend_hooks import inline_hooks
from lazybatch.batcher.policies.base import Policy

from .request_parsing import RequestOptions, sample_classes
from .stages import StageRunner

if TYPE_CHECKING:
    from .scheduler_loop import SchedulerLoop
    from .runtime import BackendRuntime

# An inline pass waits at most this long for the scheduler thread to finish the bookkeeping of its last job (it
# answered everything and holds nothing, but has not gone back to sleep): longer, and the requests go to it instead.
INLINE_LOCK_WAIT_S = 0.002
# ... and, where it holds no job, this long for its idle hook (statistics, metrics, memory given back: a few ms,
# longer on a busy core): a group refused for it went through the scheduler, whose answers cost a response round
# trip each and whose jobs made the next groups follow (4-7 refusals a probe cell, docs/data/probe_routes_mobilenet.txt)
INLINE_BOOKKEEPING_WAIT_S = 0.05
# A group that finds the scheduler busy with work it could only follow (InlineHooks.inline_wait) waits in execute at
# most twice the predicted rest of that work plus this, then runs inline; past that, it goes to the scheduler.
INLINE_WAIT_SLACK_S = 0.005

_monotonic = time.monotonic  # bound once: run_one's path
_perf_counter = time.perf_counter
Outputs = dict[str, np.ndarray]
Early = Callable[[int, "Outputs | str"], None]


class InlineRoute:
    """Runs groups that find the scheduler idle as whole-graph passes on the caller's thread (``run``)."""

    def __init__(self, rt: BackendRuntime, policy: Policy, loop: SchedulerLoop, lock: threading.Lock, *,
                 on: bool = False) -> None:
        self.rt = rt
        self.hooks = inline_hooks(policy)  # the inline route's questions, where the policy answers them
        self._needs_classes = self.hooks is not None and self.hooks.needs_classes  # a trait of the policy as built
        self.on = on  # run allowed (BackendRuntime.inline; a device group's gate switches it with its lease)
        # ... but not before this instant (time.monotonic()): a lease holder whose co-located sibling was active
        # within the window keeps to stage jobs, so the sibling waits one stage, not a pass (arbiter/client.py)
        self.hold_until = 0.0
        # told each run's pass time, under ``lock`` (the device group's gate: device time under its solo lease)
        self.on_pass: Callable[[float], None] | None = None
        # run_one's straight line applies: on, no hold, not wider than a lane, no classes for the policy to see
        # (set by _restraighten at the end of this constructor, and at each change)
        self._straight = False
        # held by the scheduler thread whenever it is not asleep on the inbox; an inline pass holds it throughout,
        # so that the policy and the table are only ever touched by one thread at a time
        self.lock = lock
        self.idle = rt.idle  # set while the scheduler holds nothing (an inline pass may wait for it)
        # inline passes' counters, metrics and calibration, applied by the scheduler thread at its idle hook
        # (take_deferred)
        self.deferred = array("d")  # PASS_FIELDS numbers a pass (backend/inline_passes.py)
        self._loop = loop
        self._live = rt.live
        self._stats = rt.stats
        # what run_one calls, bound once (each lookup on the lone request's path delays its answer)
        self._inline_batch = self.hooks.inline_batch if self.hooks is not None else None
        self._inline_done = self.hooks.inline_done if self.hooks is not None else None
        self._whole_run = rt.whole_runner.run if rt.whole_runner is not None else None
        self._restraighten()

    def switch(self, on: bool) -> None:
        """Allow inline passes or stop them (a device group's gate, with its lease); the scheduler thread, which may
        sleep with no timeout, is woken: from now on it looks in on their bookkeeping, or stops looking."""
        self.on = bool(on)
        self._restraighten()
        self.rt.wake()

    def hold(self, until: float) -> None:
        """No inline pass before ``until`` (time.monotonic(); 0.0: none held): a device group's lease holder whose
        sibling was active within the window (arbiter/client.py)."""
        self.hold_until = until
        self._restraighten()

    def tell_passes_to(self, on_pass: Callable[[float], None] | None) -> None:
        """Each pass's time goes to ``on_pass`` from now on, under ``lock`` (a device group's gate: its device time
        under the solo lease)."""
        self.on_pass = on_pass
        self._restraighten()

    def _restraighten(self) -> None:
        self._straight = (self.on and not self.hold_until and self.on_pass is None and not self._needs_classes
                          and not self.rt.whole_wide and self.rt.whole_runner is not None)

    def run(self, requests: list[tuple[Outputs, int]], early: Early | None = None,
            options: Sequence[RequestOptions] | None = None) -> list[Outputs | str | None] | None:
        """Run these validated requests now, on the caller's thread (Triton's ``execute``), as whole-graph passes,
        and return each one's outputs, or the error it failed with (a batch that fails is rerun request by
        request, so that only the requests that fail alone get the error); None: they must all go to the
        scheduler (``submit``). Where the policy serves the group in several passes one after the other, the
        requests of all but the last pass are handed to ``early`` (index, outputs or error) as soon as their pass
        ends, and their entries in the list are None.

        ``options``: each request's scheduling options (SLA, priority level), which tell the policy the classes of
        the traffic (an urgent member may need the scheduler, and boundaries kept for the next one)."""
        rt = self.rt
        hooks = self.hooks
        if rt.whole_runner is None or not self.on or hooks is None:
            return None
        lock = self.lock
        loop = self._loop
        # the common case first, kept short (every line here delays the answer): the scheduler thread asleep and
        # holding nothing; else wait for it where the policy says these requests could only follow its work
        if lock.acquire(False):
            if rt.closed or rt.job is not None or self._live or rt.pending or rt.scheduler.held:
                lock.release()
                if not self._take_turn():
                    return None
        elif not self._take_turn():
            return None
        park = rt.park
        try:
            if not self.on:  # switched off meanwhile (the device group's lease revoked)
                return self.refuse("inline route off")
            if rt.whole_wide and not rt.alone():  # wider than the lane: only alone on the device (runtime.whole_wide)
                return self.refuse("the device is shared: the stages run at the lane's width")
            if self.hold_until and time.monotonic() < self.hold_until:  # a co-located sibling active just now
                return self.refuse("a co-located model was active within the window")
            one = len(requests) == 1
            n = requests[0][1] if one else sum(b for _, b in requests)
            start = time.monotonic()
            k = hooks.inline_batch(start, n, sample_classes([b for _, b in requests], options)
                                   if options is not None and self._needs_classes else None)
            if k <= 0 or (k < n and early is None and not one):
                return self.refuse("a boundary may pay")
            self._stats.inline_groups += 1
            if park is not None:
                park.unpark()
            if k >= n or one:  # one pass (a lone request is never split)
                results = self._pass(requests, range(len(requests)), n, start)
            else:
                results = self._passes(requests, k, early, start)  # type: ignore[arg-type]
            end = time.monotonic()
            loop.note_work(end)
            hooks.inline_done(start, end, n)
            if self.on_pass is not None:
                self.on_pass(end - start)
            return results
        finally:
            if park is not None:
                rt.park_if_idle()
            lock.release()

    def run_one(self, feeds: Outputs, n: int, options: RequestOptions) -> Outputs | str | None:
        """``run`` for the common case below capacity, as a straight line: one request of ``n`` samples with the
        scheduling ``options``, the scheduler thread asleep holding nothing. Its
        outputs, or the error it failed with; None: it goes to the scheduler. Anything else (a busy scheduler, a
        device group's lease or window, a policy that reads classes) takes ``run``'s way. Why a line of its own:
        each line on this path delays the answer, and at 90% load on a 1 ms model the general path's bookkeeping
        (about 17 us a request in-process, ad hoc) was the default's gap to Triton's batcher
        (docs/results/default_guard.md). A device group's member (a hold, a gate told each pass) takes ``run``."""
        lock = self.lock
        if not self._straight or not lock.acquire(False):
            return self._one_by_run(feeds, n, options)
        rt = self.rt
        loop = self._loop
        if not self._straight or rt.pending or rt.job is not None or self._live or rt.scheduler.held or rt.closed:
            lock.release()
            return self._one_by_run(feeds, n, options)
        park = rt.park
        try:
            start = _monotonic()
            if self._inline_batch(start, n, None) <= 0:
                return self.refuse("a boundary may pay")
            self._stats.inline_groups += 1
            if park is not None:
                park.unpark()
            t0 = _perf_counter()
            try:
                out: Outputs | str = self._whole_run(0, feeds)
                took = _perf_counter() - t0
                end = _monotonic()
                # _count's record, written here: (samples, answered, latency, failed, took, onnxruntime, join)
                self.deferred.extend((n, 1, end - start, 0, took, took, 0.0))
                if rt.on_batch is not None:
                    rt.on_batch(0, n, took)
            except Exception as e:  # onnxruntime failure: this request fails, the server goes on
                if rt.metrics is not None:
                    rt.metrics.stage_failed(0)
                out = f"{type(e).__name__}: {e}"
                self._count(0, n, 0.0, 0.0, start, failed=1, took=0.0)
                end = _monotonic()
            loop.note_pass(end)
            self._inline_done(start, end, n)
            return out
        finally:
            if park is not None and rt.job is None and not self._live and not rt.pending:
                park.park()  # (BackendRuntime.park_if_idle, without the call)
            lock.release()

    def _one_by_run(self, feeds: Outputs, n: int, options: RequestOptions) -> Outputs | str | None:
        out = self.run([(feeds, n)], None, (options,))
        return None if out is None else out[0]

    def run_group(self, requests: list[tuple[Outputs, int]], early: Early,
                  options: Sequence[RequestOptions]) -> list[Outputs | str | None] | None:
        """``run`` for a group of requests that Triton handed over together (they queued while the previous
        execute ran: most groups at 90% load), as ``run_one``'s straight line: one pass of the whole group where
        the policy takes every sample at once and nothing else is held. Anything else takes ``run``'s way. Why:
        half the requests come in groups at 90% load on a 0.7 ms model, where a group cost 6-11 us more than
        under Triton's batcher (concatenate, run, split), in-process, ad hoc; this line takes about 1 us of that
        (the policy's question and the pass's bookkeeping are the rest)."""
        lock = self.lock
        if not self._straight or not lock.acquire(False):
            return self.run(requests, early, options)
        rt = self.rt
        loop = self._loop
        if not self._straight or rt.pending or rt.job is not None or self._live or rt.scheduler.held or rt.closed:
            lock.release()
            return self.run(requests, early, options)
        n = 0
        for _, b in requests:
            n += b
        start = _monotonic()
        k = self._inline_batch(start, n, None)
        if 0 < k < n:  # the policy serves it in several passes: run's way (its answers go early)
            lock.release()
            return self.run(requests, early, options)
        park = rt.park
        try:
            if k <= 0:
                return self.refuse("a boundary may pay")
            self._stats.inline_groups += 1
            if park is not None:
                park.unpark()
            results = self._pass(requests, range(len(requests)), n, start)
            end = _monotonic()
            loop.note_work(end)
            self._inline_done(start, end, n)
            return results
        finally:
            if park is not None and rt.job is None and not self._live and not rt.pending:
                park.park()
            lock.release()

    def _take_turn(self) -> bool:
        """Take ``lock`` with the scheduler holding nothing, where the scheduler thread is awake or holds work:
        wait in execute for it where these requests could only follow that work (``_await_idle``), and for its
        bookkeeping (``_acquire``). False (the refusal counted, the lock not held): the scheduler takes them."""
        rt = self.rt
        if self.hold_until and time.monotonic() < self.hold_until:  # no wait for a turn that would be refused
            self.refuse("a co-located model was active within the window")
            return False
        if (rt.job is not None or self._live or rt.pending) and not self._await_idle():
            return False
        if not self._acquire():
            self.refuse("scheduler thread's bookkeeping")
            return False
        if rt.closed or rt.job is not None or self._live or rt.pending or rt.scheduler.held:
            self.lock.release()
            self.refuse("scheduler busy")
            return False
        return True

    def _passes(self, requests: list[tuple[Outputs, int]], k: int, early: Early,
                start: float) -> list[Outputs | str | None]:
        """The group in passes of at most ``k`` samples (whole requests; a larger request alone), one after the
        other; all but the last pass's answers go to ``early`` as soon as their pass ends."""
        chunks: list[list[int]] = [[]]
        size = 0
        for i, (_, b) in enumerate(requests):
            if chunks[-1] and size + b > k:
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += b
        results: list[Outputs | str | None] = [None] * len(requests)
        for c, idx in enumerate(chunks):
            outs = self._pass(requests, idx, sum(requests[i][1] for i in idx), start)
            last = c == len(chunks) - 1
            for i, out in zip(idx, outs):
                if last:
                    results[i] = out
                else:
                    early(i, out)  # type: ignore[arg-type]
        return results

    def _pass(self, requests: list[tuple[Outputs, int]], idx: Sequence[int], m: int,
              start: float) -> list[Outputs | str | None]:
        """One whole-graph pass of the requests ``idx`` (``m`` samples): each one's outputs, or its error (a
        batch that fails is rerun request by request)."""
        whole = self.rt.whole_runner
        names = whole.input_names  # type: ignore[union-attr]
        t0 = t1 = time.perf_counter()
        try:
            # one request: its validated inputs, which are the model's inputs by name
            feeds = requests[idx[0]][0] if len(idx) == 1 else \
                {name: np.concatenate([requests[i][0][name] for i in idx]) for name in names}
            t1 = time.perf_counter()
            outs = whole.run(0, feeds)  # type: ignore[union-attr]
        except Exception as e:  # each request alone: only the ones that fail on their own get the error
            if self.rt.metrics is not None:
                self.rt.metrics.stage_failed(0)
            results: list[Outputs | str | None] = [
                self._run_alone(whole, names, requests[i][0]) for i in idx] if len(idx) > 1 else \
                [f"{type(e).__name__}: {e}"]
            failed = sum(1 for r in results if isinstance(r, str))
            self._count(len(idx) - failed, m, 0.0, 0.0, start, failed=failed, took=0.0)
            return results
        t2 = time.perf_counter()
        if len(idx) == 1:
            results = [outs]
        else:
            results = []
            row = 0
            for i in idx:
                b = requests[i][1]
                results.append({o: v[row:row + b] for o, v in outs.items()})
                row += b
        t3 = time.perf_counter()
        self._count(len(idx), m, t1 - t0 + t3 - t2, t2 - t1, start, took=t3 - t0)
        return results

    def _acquire(self) -> bool:
        """Take the scheduler thread's lock: briefly where it may be between jobs, longer where it holds no job
        and can only be at its idle hook."""
        if self.lock.acquire(timeout=INLINE_LOCK_WAIT_S):
            return True
        rt = self.rt
        if rt.job is not None or rt.running is not None or self._live or rt.pending:
            return False
        return self.lock.acquire(timeout=INLINE_BOOKKEEPING_WAIT_S)

    def _await_idle(self) -> bool:
        """Wait (in execute) for the scheduler to hold nothing where these requests could only follow its work
        (``InlineHooks.inline_wait``); True once it holds nothing."""
        left = self.hooks.inline_wait(time.monotonic(), self.rt.running, self.rt.pending)  # type: ignore[union-attr]
        if left is None:
            self.refuse("scheduler busy")
            return False
        if not self.idle.wait(2.0 * left + INLINE_WAIT_SLACK_S):
            self.refuse("scheduler busy past its predicted end")
            return False
        self._stats.inline_waits += 1
        return True

    def refuse(self, reason: str) -> None:
        """Count why a group goes to the scheduler instead (statistics ``inline_refused``); ``run`` returns this
        None."""
        refused = self._stats.inline_refused
        refused[reason] = refused.get(reason, 0) + 1

    def _run_alone(self, whole: StageRunner, names: list[str], inputs: Outputs) -> Outputs | str:
        try:
            return whole.run(0, {name: inputs[name] for name in names})
        except Exception as e:  # onnxruntime failure: this request fails, the server goes on
            if self.rt.metrics is not None:
                self.rt.metrics.stage_failed(0)
            return f"{type(e).__name__}: {e}"

    def _count(self, requests: int, n: int, io_s: float, ort_s: float, start: float, *,
               failed: int = 0, took: float) -> None:
        """One inline pass of ``requests`` answered (and ``failed`` that failed alone), ``n`` samples in all, that
        took ``took`` seconds (0: it failed). Only the record is kept now; the counters, the metrics and the
        calibration of the table are left to the scheduler thread (``take_deferred``): every line here delays the
        answer, which Triton sends when ``execute`` returns (done here, the metrics cost 4% of a 3.5 ms MobileNet
        pass, the retired probe_idle_cost, `git show 555b6b3:benchmarks/probes/probe_idle_cost.py`, and this
        route's Python was most of a fast model's served gap, docs/data/probe_served_gap.txt)."""
        self._loop.note_answer()
        on_batch = self.rt.on_batch
        if on_batch is not None and ort_s:
            on_batch(0, n, ort_s)
        # from execute: Triton's own queue time is in its nv_inference_*
        self.deferred.extend((n, requests, time.monotonic() - start, failed, took, ort_s, io_s))

    def take_deferred(self) -> array:
        """The inline passes' rows recorded since the last look (``_count``), taken under ``lock`` (a pass appends
        under it): the scheduler thread tallies them outside it (backend/inline_passes.py)."""
        deferred = self.deferred
        if deferred:
            self.deferred = array("d")
        return deferred
