"""Parked pools: an idle model's onnxruntime workers wait in SCHED_IDLE, so that their spinning takes no CPU from a
busy neighbour (docs/colocation.md, "Parked pools").

Why: one pool per process (sessions/threads.py) keeps a split model's workers warm from stage to stage, which a
model alone needs (pools per session wake their workers at every stage: served alone, ResNet-50 past its capacity
took 1067 ms on them against 826 parked and Triton 0 ms's 951, docs/results/cpu_share_levers.md). But after its last operator a worker spins for a while before it sleeps, and onnxruntime's Python API cannot
turn that off for a process pool. Beside a model that runs all the time, a light model at 30% of its rate spins
most of the time it is idle, on the cores its neighbour needs. Parked in SCHED_IDLE, a spinning worker runs only
on a core nobody else wants: alone, nothing changes; co-located, the neighbour keeps its cores. The pool is parked
when the model's last work ends and put back before its next run, both on the thread that holds the scheduler's
lock (backend/runtime.py, backend/inline.py): at most one syscall per worker each way per busy period, none per
request within one.

Only beside a busy neighbour: the pool is parked only while another member of the server's CPU share had a request
within its active window (the share's watcher says so, ``neighbours_active``). The watcher also moves an idle pool
when that changes: a model that went idle before its neighbour got busy parks then, and comes back once no
neighbour is active. Parking is not free for the model
itself: a pool that waited in SCHED_IDLE runs its next request slower wherever other threads want the cores (the
load generator, Triton's own threads): 5-15% in-process beside two busy processes, and served alone the MLP's
average was 0.73-0.93x Triton 0 ms's with its pool parked against 0.93-0.99x unparked (docs/colocation.md, "On by
default"). What parking buys a neighbour is paid only where there is one.

While the CPU share splits the cores (backend/cpu_share.py), a pool wider than the cores its threads keep parks the
surplus workers even while the model runs (``set_cores``): on one core a spinning worker doubled a pass.

Putting a worker back from SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE of at least 20 (sched(7)); without
either, the pool is never parked (``allowed`` is False), as the CPU share lowers nothing it could not put back.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Iterable

from .os_weights import IDLE, NORMAL, Privileges, Weight


def new_native_threads(before: Iterable[int], now: Iterable[int]) -> list[int]:
    """The threads started between two listings that Python did not start: onnxruntime's pool workers, where the
    listings bracket the creation of the model's first sessions."""
    python = {t.native_id for t in threading.enumerate()}
    old = set(before)
    return sorted(t for t in now if t not in old and t not in python)


class PoolPark:
    """Parks and unparks one process's onnxruntime workers; counts what it costs.

    Two threads move it: the model's (``park`` when its work ends, ``unpark`` before it runs, under the scheduler's
    lock) and the CPU share's watcher (``set_neighbours_active``), which parks an idle pool once a neighbour becomes
    active and puts it back once none is: a model that went idle before its neighbour got busy parks all the same.
    One small lock of its own orders the two where a neighbour is active; a model alone takes no lock. The syscalls
    stay at most one per worker each way per change."""

    def __init__(self, workers: Iterable[int], privileges: Privileges | None = None) -> None:
        self.workers = list(workers)
        p = Privileges.probe() if privileges is None else privileges
        self.allowed = bool(self.workers) and p.can_restore(Weight(NORMAL, 0), Weight(IDLE, 0))
        self.parked = False
        # whether another member of the share is active (CpuShare's watcher): parking buys a neighbour its cores, and
        # a model with none pays nothing for it
        self.neighbours_active = False
        self.idle = False  # the model's work ended and it has not run since
        # workers kept in SCHED_IDLE while the model runs, because the share confined its threads to fewer cores than
        # the pool is wide (``set_cores``): a spinning worker on its caller's one core halves a stage's speed
        self.surplus: list[int] = []
        self.parks = 0  # parkings: busy periods ended with the pool parked, or idle pools parked by the watcher
        self.syscalls = 0
        self.syscall_s = 0.0  # time spent in them (docs/results/cpu_share_cost.md)
        self._lock = threading.Lock()

    def set_neighbours_active(self, active: bool) -> None:
        """The share's watcher saw whether another member is active: parking is worth its cost only then. An idle
        pool follows at once (parked beside a newly active neighbour, back once none is)."""
        if active == self.neighbours_active:  # the common case: no change, no lock
            return
        with self._lock:
            self.neighbours_active = active
            if self.idle:
                self._park_if_wanted() if active else self._unpark()

    def park(self) -> None:
        """The model's work ended: its workers wait in SCHED_IDLE while a neighbour is active (nothing where not
        allowed, with no active neighbour, or already parked)."""
        self.idle = True  # first, then the neighbours: either this sees the watcher's True or it sees idle
        if not self.neighbours_active:  # a model alone (the common case): no lock, no syscall
            return
        with self._lock:
            self._park_if_wanted()

    def unpark(self) -> None:
        """The model is about to run: its workers back in the normal class, at the nice they kept."""
        if not self.idle:  # ran since its last park(): the watcher parks only idle pools (idle is ours to write)
            return
        self.idle = False  # first, then the neighbours: either this sees the watcher's True or the watcher sees it
        if not self.neighbours_active and not self.parked:  # a model alone (the common case): no lock
            return
        with self._lock:
            self.idle = False
            self._unpark()

    def set_cores(self, cores: int | None) -> None:
        """The share confined this process's threads to ``cores`` cores (None: every core again). While the pool
        (its workers and the calling thread) is wider than that, the surplus workers wait in SCHED_IDLE even while
        the model runs: on one core, onnxruntime's spinning worker doubled a pass (the 8 x 2048 MLP, a pool of two
        on one core: 15.9 ms at batch 1, 8.2 with its worker parked, 7.5 with a pool of one).
        The calling thread then runs the blocks the parked workers do not take. Nothing where not allowed."""
        want = max(0, len(self.workers) + 1 - cores) if cores and self.allowed else 0
        with self._lock:
            new = self.workers[:want]
            if not self.parked:  # a parked pool keeps every worker parked; _unpark leaves the surplus
                self._set(os.SCHED_IDLE, [t for t in new if t not in self.surplus])
                self._set(os.SCHED_OTHER, [t for t in self.surplus if t not in new])
            self.surplus = new

    def reassert(self) -> None:
        """The share set its threads' weights (a nice, in the normal class): the workers that should wait in
        SCHED_IDLE (all of them while parked, else the surplus) go back there, at the nice they were given."""
        with self._lock:
            self._set(os.SCHED_IDLE, self.workers if self.parked else self.surplus)

    def close(self) -> None:
        """Unloaded: no worker stays parked."""
        with self._lock:
            surplus, self.surplus = self.surplus, []
            if self.parked:
                self._unpark()  # every worker, the surplus included
            else:
                self._set(os.SCHED_OTHER, surplus)
            self.allowed = False

    def _park_if_wanted(self) -> None:
        if self.allowed and self.neighbours_active and not self.parked:
            self._set(os.SCHED_IDLE, [t for t in self.workers if t not in self.surplus])
            self.parked = True
            self.parks += 1

    def _unpark(self) -> None:
        if self.parked:
            self._set(os.SCHED_OTHER, [t for t in self.workers if t not in self.surplus])
            self.parked = False

    def _set(self, policy: int, tids: list[int]) -> None:
        if not tids:
            return
        t0 = time.perf_counter()
        gone = []
        for tid in tids:
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))  # keeps the thread's nice
            except ProcessLookupError:
                gone.append(tid)
            except PermissionError:  # the privilege went away: never park again
                self.allowed = False
            self.syscalls += 1
        for tid in gone:
            self.workers.remove(tid)
            if tid in self.surplus:
                self.surplus.remove(tid)
        self.syscall_s += time.perf_counter() - t0
