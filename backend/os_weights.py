"""A model's threads' scheduling weights through the operating system: nice values and SCHED_IDLE / SCHED_BATCH.

Why: on a CPU the kernel preempts in microseconds, and its fair scheduler shares the cores by per-thread weights.
A device scheduler that sees several co-located models can aim that preemption (lower a best-effort model's threads
while urgent work runs) instead of emulating a non-preemptive device with turns at stage boundaries. This module
is the lever only: which threads, what they may be set to, and putting them back. When and how far to pull it is
the device scheduler's.

What the kernel allows (Linux, sched(7), setpriority(2), getrlimit(2)):

- Any thread may raise its own nice value (lower its weight) and enter SCHED_BATCH or SCHED_IDLE.
- Lowering nice again (raising the weight), or leaving SCHED_IDLE, needs CAP_SYS_NICE, or an RLIMIT_NICE soft limit
  that allows the target value (nice >= 20 - rlimit). Without either, a lowered thread stays lowered.
- Per-thread: ``setpriority(PRIO_PROCESS, tid, ...)`` and ``sched_setscheduler(tid, ...)`` act on one thread.
- With the kernel's autogroup on, nice ranks threads within one session's group: a tritonserver and its Python
  stubs are one group, so their threads compete by nice among themselves.

So without the privilege a change that cannot be undone is refused here, not made: ``ThreadWeights.set`` lowers a
thread only where it could put it back (``Privileges.can_restore``), says why once (``Privileges.explain``: what
to grant, ``cap_add: [SYS_NICE]`` or ``ulimits: nice`` in a compose file), and never raises.

The CPU share (backend/cpu_share.py) pulls it: when, and how far, is its rank rule's (batcher/cpu_rank.py).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from typing import Iterable

NORMAL, BATCH, IDLE = "normal", "batch", "idle"
_POLICY_OF = {os.SCHED_OTHER: NORMAL, os.SCHED_BATCH: BATCH, os.SCHED_IDLE: IDLE}
_CODE_OF = {v: k for k, v in _POLICY_OF.items()}
CAP_SYS_NICE = 23  # capability bit (linux/capability.h)


@dataclass(frozen=True)
class Weight:
    """One thread's scheduling class and nice value."""

    policy: str = NORMAL
    nice: int = 0


@dataclass(frozen=True)
class Privileges:
    """What this process may do to its threads' weights."""

    cap_sys_nice: bool
    rlimit_nice: int  # the soft RLIMIT_NICE: nice values down to 20 - this may be set again

    @classmethod
    def probe(cls) -> "Privileges":
        soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
        return cls(cap_sys_nice=_has_cap_sys_nice(), rlimit_nice=max(0, int(soft)) if soft != resource.RLIM_INFINITY
                   else 40)

    def can_set_nice(self, nice: int, current: int) -> bool:
        """Whether a thread at ``current`` may be set to ``nice`` (raising nice is always allowed)."""
        return nice >= current or self.cap_sys_nice or nice >= 20 - self.rlimit_nice

    def can_restore(self, before: Weight, after: Weight) -> bool:
        """Whether a thread moved from ``before`` to ``after`` could be put back."""
        if not self.can_set_nice(before.nice, after.nice):
            return False
        if after.policy == IDLE and before.policy != IDLE:  # leaving SCHED_IDLE: as lowering nice
            return self.cap_sys_nice or before.nice >= 20 - self.rlimit_nice
        return True

    def explain(self) -> str:
        if self.cap_sys_nice:
            return "CAP_SYS_NICE: threads may be lowered and raised back"
        return (f"no CAP_SYS_NICE and RLIMIT_NICE {self.rlimit_nice}: a thread lowered past nice "
                f"{20 - self.rlimit_nice} could not be raised back, so it is not lowered; grant cap_add: [SYS_NICE] "
                "or ulimits: nice (docker-compose.yml), or run the server as root")


def _has_cap_sys_nice() -> bool:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def threads(pid: int | None = None) -> list[int]:
    """The thread ids of a process (this one by default), from /proc."""
    return sorted(int(t) for t in os.listdir(f"/proc/{pid or os.getpid()}/task"))


def set_cores(tids: Iterable[int], cores: Iterable[int]) -> int:
    """Confine each of ``tids`` to ``cores`` (``sched_setaffinity`` on a thread id acts on that thread); returns how
    many were set. A process may move its own threads between the cores its cpuset allows with no privilege, both
    ways, so unlike a weight this is never refused; a thread gone meanwhile is skipped."""
    mask, done = set(cores), 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, mask)
            done += 1
        except OSError:
            continue
    return done


def read_weight(tid: int, pid: int | None = None) -> Weight:
    """A thread's weight as the kernel reports it in /proc (stat fields 19, nice, and 41, policy): what tests and
    operators read, independent of what this module believes it set."""
    fields = _stat_fields(f"/proc/{pid or os.getpid()}/task/{tid}/stat")
    return Weight(_POLICY_OF.get(int(fields[38]), str(fields[38])), int(fields[16]))


def process_state(pid: int) -> str | None:
    """A process's state letter from /proc (R, S, D, Z zombie, X dead, ...), or None where it is gone."""
    try:
        return _stat_fields(f"/proc/{pid}/stat")[0]
    except OSError:
        return None


def _stat_fields(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name, which may hold spaces (field 3, the state, first)."""
    with open(path) as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()


def thread_nices(pid: int | None = None) -> set[int]:
    """The nice values of every thread of a process (this one by default), as the kernel reports them: what an
    operator or a test reads to see whether a model is lowered."""
    out = set()
    for tid in threads(pid):
        try:
            out.add(read_weight(tid, pid).nice)
        except OSError:  # the thread ended
            pass
    return out


@dataclass
class ThreadWeights:
    """Sets the weights of some of this process's threads and puts them back; remembers each thread's original."""

    privileges: Privileges = field(default_factory=Privileges.probe)
    original: dict[int, Weight] = field(default_factory=dict)
    refused: int = 0  # changes not made because they could not be undone (or the kernel said no)
    changes: int = 0  # syscalls made
    said: str | None = None  # the one explanation logged, where something was refused
    # the original of a thread first seen (None: its weight then). A thread started by a lowered thread inherits
    # the lowered weight, so a caller that lowers a whole process names the weight its threads come back to
    baseline: Weight | None = None

    def set(self, tids: Iterable[int], weight: Weight) -> int:
        """Move these threads to ``weight`` where that can be undone; returns how many now have it."""
        done = 0
        for tid in tids:
            try:
                now = read_weight(tid)
            except OSError:  # the thread ended
                continue
            before = self.original.get(tid, self.baseline or now)
            if not self.privileges.can_restore(before, weight):
                self._refuse()
                continue
            if self._apply(tid, now, weight):
                self.original.setdefault(tid, before)
                done += 1
        return done

    def restore(self, tids: Iterable[int] | None = None) -> list[int]:
        """Put threads back to their originals (all that were changed by default); returns those that could not be
        (ended threads are forgotten, not failures)."""
        stuck = []
        for tid in list(self.original if tids is None else tids):
            before = self.original.get(tid)
            if before is None:
                continue
            try:
                now = read_weight(tid)
            except OSError:
                del self.original[tid]
                continue
            if self._apply(tid, now, before):
                del self.original[tid]
            else:
                stuck.append(tid)
        return stuck

    def _apply(self, tid: int, now: Weight, want: Weight) -> bool:
        try:
            if now.policy != want.policy:
                os.sched_setscheduler(tid, _CODE_OF[want.policy], os.sched_param(0))
                self.changes += 1
            if now.nice != want.nice:
                os.setpriority(os.PRIO_PROCESS, tid, want.nice)
                self.changes += 1
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            self._refuse()
            return False

    def _refuse(self) -> None:
        self.refused += 1
        if self.said is None:
            self.said = self.privileges.explain()
