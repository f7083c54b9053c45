"""Online recalibration of a latency table from the stage runs a server observes.

A latency table is profiled once, usually alone on the machine; served next to other work the stages run slower,
and not uniformly: a loaded CPU (shared caches, memory bandwidth, fewer free cores for a thread pool) slows a large
matrix multiply differently from a small one. One model-wide factor (the backend's former ``time_scale``) is then
right on average and wrong at the batch sizes that matter: the slack predictor reads single-input times, the
policies compare batch sizes, and a factor fitted mostly on batch-1 runs mispredicts a batch of 16. So the
calibrator keeps a ratio observed / profiled per stage and per profiled batch size and rewrites the table's dense
rows from them.

Pure Python, no I/O; not thread-safe: call it from the thread that runs the scheduler (the one that reads the
table).
"""

from __future__ import annotations

import math
from typing import Any

from .latency_table import LatencyTable, monotone_row

DEFAULT_WEIGHT = 0.1
DEFAULT_REFRESH_EVERY = 64
DEFAULT_MOVE_THRESHOLD = 0.10
MIN_RATIO = 0.25
MAX_RATIO = 20.0


class OnlineCalibrator:
    """Per (stage, batch-size bucket) moving average of observed / profiled stage time, written back into ``table``.

    Buckets are the table's profiled batch sizes; a run of batch ``b`` counts for the largest profiled size ``<= b``
    (its ratio is taken against the profiled time at ``b`` itself, interpolated as the table does). Each bucket keeps
    an exponentially weighted moving average (``weight``, default 0.1) of the ratio, each observation clamped to
    ``[min_ratio, max_ratio]`` (default [0.25, 20]: a run stalled by a page fault or a descheduled thread is evidence
    of load, not of a 100x slower stage). A bucket's average starts from the value the table already used for it,
    so its first run moves it by ``weight`` and not all the way.

    ``observe`` returns True when it rewrote the table: after every ``refresh_every`` observations (default 64), or
    at once when a bucket's ratio moved more than ``move_threshold`` (10%) from the value last written. A rewrite
    sets, for every stage, the value at each profiled size to ``profiled * ratio`` (a bucket never observed takes
    the stage's run-weighted mean observed ratio, else the model-wide ``scale``, else 1.0), fits the row with
    ``monotone_row`` (non-decreasing, non-increasing per sample) and interpolates linearly in between exactly as the
    table densifies its measurements; ``table.dense`` rows and ``table.single`` are updated in place (so every
    holder of those lists sees the new values) and ``version`` increments. ``table.measured`` (what ``save``
    writes) is left as profiled.

    Values are always recomputed from ``self.profiled``, the profile as it was at construction, never from the
    rewritten table, so drift never compounds: observing the profiled time again brings the table back to the
    profile.

    The caller (the backend runtime) calls ``policy.table_changed()`` when ``observe`` returns True, so policies
    that cache values derived from the table (single-input sums, prefix sums) recompute them. The table is shared:
    the calibrator must be given the very table the policy reads, and nothing else should rely on it staying as
    profiled.
    """

    def __init__(self, table: LatencyTable, *, weight: float = DEFAULT_WEIGHT,
                 refresh_every: int = DEFAULT_REFRESH_EVERY, move_threshold: float = DEFAULT_MOVE_THRESHOLD,
                 min_ratio: float = MIN_RATIO, max_ratio: float = MAX_RATIO) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight!r}")
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1, got {refresh_every!r}")
        if not 0.0 < min_ratio <= 1.0 <= max_ratio:
            raise ValueError(f"need 0 < min_ratio <= 1 <= max_ratio, got {min_ratio!r}, {max_ratio!r}")
        self.table = table
        self.weight = float(weight)
        self.refresh_every = int(refresh_every)
        self.move_threshold = float(move_threshold)
        self.min_ratio = float(min_ratio)
        self.max_ratio = float(max_ratio)
        self.batch_sizes: tuple[int, ...] = tuple(table.batch_sizes)
        n, m = table.graph.n, len(self.batch_sizes)
        #: the profiled dense rows (seconds at every batch size 1..max), as they were at construction
        self.profiled: list[list[float]] = [list(row) for row in table.dense]
        self._points: list[list[float]] = [list(row) for row in table.measured]  # profiled, at the profiled sizes
        self.ratio: list[list[float | None]] = [[None] * m for _ in range(n)]  # None: never observed
        self.runs: list[list[int]] = [[0] * m for _ in range(n)]
        self._applied: list[list[float]] = [[1.0] * m for _ in range(n)]  # ratio in force per bucket
        self._bucket = [0] * (self.batch_sizes[-1] + 1)
        k = 0
        for b in range(1, len(self._bucket)):
            while k + 1 < m and self.batch_sizes[k + 1] <= b:
                k += 1
            self._bucket[b] = k
        self.version = 0
        self.observations = 0
        self.ignored = 0
        self._since_refresh = 0

    # ------------------------------------------------------------------ observations
    def bucket(self, batch: int) -> int:
        """Index (into ``batch_sizes``) of the largest profiled size at or below ``batch``."""
        return self._bucket[batch]

    def observe(self, stage: int, batch: int, seconds: float, *, refresh: bool = True) -> bool:
        """Record one measured run of ``stage`` on ``batch`` samples that took ``seconds``; True when the table was
        rewritten (the caller then tells the policy: ``policy.table_changed()``). Runs with a batch outside the
        table (< 1 or above its largest size) or a time that is not a positive finite number are ignored (counted
        in ``ignored``). ``refresh=False``: True means a rewrite is due, and the caller calls ``refresh`` when it
        suits it (a rewrite costs a pass over the whole table: a server does it at most a few times a second)."""
        if not 0 <= stage < len(self.profiled):
            raise ValueError(f"stage {stage} outside 0..{len(self.profiled) - 1}")
        if not 1 <= batch < len(self._bucket) or not (isinstance(seconds, (int, float)) and math.isfinite(seconds)
                                                      and seconds > 0.0):
            self.ignored += 1
            return False
        expected = self.profiled[stage][batch]
        if expected <= 0.0:
            self.ignored += 1
            return False
        r = min(self.max_ratio, max(self.min_ratio, seconds / expected))
        k = self._bucket[batch]
        row = self.ratio[stage]
        cur = row[k]
        if cur is None:
            cur = self._applied[stage][k]  # what the table already assumed for this bucket
        new = cur + self.weight * (r - cur)
        row[k] = new
        self.runs[stage][k] += 1
        self.observations += 1
        self._since_refresh += 1
        if (self._since_refresh >= self.refresh_every
                or abs(new / self._applied[stage][k] - 1.0) > self.move_threshold):
            if refresh:
                self.refresh()
            return True
        return False

    def observe_span(self, start: int, stop: int, batch: int, seconds: float, *, refresh: bool = True,
                     runs: int = 1) -> bool:
        """One run of stages ``start..stop-1`` as a single call (a fused span, a whole-graph pass) on ``batch``
        samples that took ``seconds``: each stage is observed as ``observe`` would be, with the time shared in
        proportion to the stages' times in the table now. The same result as a loop of ``observe`` calls, in one
        (an inline pass in Triton's ``execute`` runs it on the request's path: 20 calls cost a 4 ms MobileNet
        request 2%). True when a rewrite is due or done, as ``observe``.

        ``runs``: that many runs whose mean took ``seconds``, observed at once (exactly ``runs`` observations of
        ``seconds`` each): the inline passes since the scheduler thread's last look, one call per batch size
        rather than one per pass (per pass, this bookkeeping was a fast model's served gap to Triton's batcher,
        docs/results/default.md)."""
        if not 0 <= start < stop <= len(self.profiled):
            raise ValueError(f"span {start}..{stop} outside 0..{len(self.profiled)}")
        if not 1 <= batch < len(self._bucket) or not (isinstance(seconds, (int, float)) and math.isfinite(seconds)
                                                      and seconds > 0.0):
            self.ignored += (stop - start) * runs
            return False
        dense = self.table.dense
        total = 0.0
        for s in range(start, stop):
            total += dense[s][batch]
        if total <= 0.0:
            self.ignored += (stop - start) * runs
            return False
        share = seconds / total
        k = self._bucket[batch]
        w1, lo, hi, threshold = self.weight, self.min_ratio, self.max_ratio, self.move_threshold
        # ``runs`` steps of the moving average towards the same ratio, in one; the steps between lie between the
        # first and the last, so those two say whether any of them moved the bucket past the threshold
        w = w1 if runs == 1 else 1.0 - (1.0 - w1) ** runs
        moved = False
        for s in range(start, stop):
            expected = self.profiled[s][batch]
            if expected <= 0.0:
                self.ignored += runs
                continue
            r = share * dense[s][batch] / expected
            r = hi if r > hi else lo if r < lo else r
            row = self.ratio[s]
            cur = row[k]
            applied = self._applied[s][k]
            if cur is None:
                cur = applied
            new = cur + w * (r - cur)
            row[k] = new
            self.runs[s][k] += runs
            self.observations += runs
            self._since_refresh += runs
            if abs(new / applied - 1.0) > threshold or (
                    runs != 1 and abs((cur + w1 * (r - cur)) / applied - 1.0) > threshold):
                moved = True
        if moved or self._since_refresh >= self.refresh_every:
            if refresh:
                self.refresh()
            return True
        return False

    # ------------------------------------------------------------------ derived ratios
    @property
    def scale(self) -> float:
        """Model-wide observed / profiled ratio: the buckets' ratios weighted by runs x profiled seconds (so it
        approximates observed time / profiled time over everything run); 1.0 before any observation."""
        num = den = 0.0
        for s, row in enumerate(self.ratio):
            for k, r in enumerate(row):
                if r is not None:
                    w = self.runs[s][k] * self._points[s][k]
                    num += w * r
                    den += w
        return num / den if den > 0.0 else 1.0

    def stage_ratio(self, stage: int) -> float | None:
        """The stage's run-weighted mean observed ratio over its observed buckets; None if never observed."""
        num = den = 0.0
        for r, n in zip(self.ratio[stage], self.runs[stage]):
            if r is not None:
                num += n * r
                den += n
        return num / den if den > 0.0 else None

    def ratios_in_force(self, stage: int) -> list[float]:
        """The ratio the next rewrite uses at each profiled size of ``stage`` (observed, else the fallbacks)."""
        fallback = self.stage_ratio(stage)
        if fallback is None:
            fallback = self.scale
        return [fallback if r is None else r for r in self.ratio[stage]]

    # ------------------------------------------------------------------ the rewrite
    def refresh(self) -> None:
        """Rewrite ``table.dense`` (in place) and ``table.single`` from the profile and the current ratios."""
        table = self.table
        sizes = list(self.batch_sizes)
        for s in range(len(self.profiled)):
            eff = self.ratios_in_force(s)
            fitted = monotone_row(sizes, [p * r for p, r in zip(self._points[s], eff)])
            table.dense[s][:] = table._densify(fitted)
            self._applied[s] = eff
        table.single[:] = [row[1] for row in table.dense]
        self.version += 1
        self._since_refresh = 0

    def as_dict(self) -> dict[str, Any]:
        """Statistics (JSON-ready): per stage, runs and ratio (None: never observed) per profiled batch size."""
        return {
            "version": self.version,
            "observations": self.observations,
            "ignored": self.ignored,
            "scale": self.scale,
            "weight": self.weight,
            "refresh_every": self.refresh_every,
            "batch_sizes": list(self.batch_sizes),
            "stages": [
                {"name": st.name, "runs": list(self.runs[st.index]), "ratio": list(self.ratio[st.index])}
                for st in self.table.graph.stages
            ],
        }
