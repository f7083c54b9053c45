"""A model's place in its device group, with the group's arbiter started only once a second member appears.

Why: every lazybatch model joins its device's group by default (docs/colocation.md), and most servers run one
model, or several of which one is driven at a time. A model alone must cost nothing: no arbiter process (about
90 ms to start one on this 2-core machine, and one more process per test server), no message per job, its inline
route on. So the first member holds the group's *solo* lock file and schedules exactly as an ungrouped model, with
no gate at all. A second member that finds that lock held starts the arbiter (``connection.connect``) and joins; the
solo member sees the arbiter's socket appear (it looks every ``SOLO_POLL_S``), connects and joins on its scheduler
thread, between two jobs, and lets the lock go. From then on the arbiter's solo lease keeps a member that is alone
in time as cheap as one alone in the server.

Until the solo member has joined (at most ``SOLO_POLL_S`` plus a round trip after the arbiter opened its socket),
the two models share the device as ungrouped models do (processor sharing). Models load before requests come, so
in practice the group is formed before its first request.
"""

from __future__ import annotations

import fcntl
import functools
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from . import protocol as P
from .client import ArbiterGate, check_lanes
from .connection import connect, try_connect

SOLO_POLL_S = 0.05  # how often a solo member looks for the arbiter a second member started


class Membership:
    """One model instance in its device group: solo (no arbiter, no gate) or joined (``gate``)."""

    def __init__(self, runtime: Any, group: str, repository: str | Path, name: str, *, weight: float = 1.0,
                 priority: int = 0, max_queue_size: int = 0, inline_ok: bool = False, lanes: int = 1,
                 on_gate: Callable[[ArbiterGate], None] | None = None) -> None:
        self.runtime = runtime
        self.group = group
        self.name = name
        self.path, self.lock = P.group_paths(repository, group)
        self.gate: ArbiterGate | None = None
        self._gate_args = dict(weight=weight, priority=priority, max_queue_size=max_queue_size,
                               route=runtime.route, inline_ok=inline_ok, rejoin_paths=(self.path, self.lock),
                               lanes=lanes)
        self._on_gate = on_gate
        self._solo: Any = None  # the locked solo file while this member is alone and no arbiter runs
        self._closed = threading.Event()
        sock = try_connect(self.path)
        if sock is not None:
            _checked(sock, self.path, group, lanes)
        else:
            self.lock.parent.mkdir(parents=True, exist_ok=True)
            f = open(P.solo_path(self.lock), "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another member is solo: start the arbiter, and it joins once it sees it
                f.close()
                solo_lanes(P.solo_path(self.lock), group, lanes)  # a differing device_lanes fails this load
                try:
                    sock = connect(self.path, self.lock, lanes=lanes)
                except (OSError, RuntimeError) as e:  # no arbiter: this model schedules alone, as ungrouped
                    print(f"lazybatch: {name}: cannot start the arbiter of device group {group!r} ({e}); the "
                          "model schedules alone, sharing the device as an ungrouped model", file=sys.stderr)
                    return
            else:
                f.truncate(0)
                f.write(f"{lanes}\n")  # the group's device_lanes, for the member that starts the arbiter
                f.flush()
                self._solo = f
                threading.Thread(target=self._watch, name=f"{name}-device-group", daemon=True).start()
                return
        self._attach(sock)

    @property
    def solo(self) -> bool:
        return self._solo is not None

    def alone(self) -> bool:
        """Whether no other member may run now: no arbiter joined (solo, or none could start: the model then
        shares the device as an ungrouped one does), or the arbiter's solo lease held and not revoked. The
        runtime's whole-graph passes wider than the lane ask this (``BackendRuntime``'s ``alone``, which the model
        builds to ask the membership)."""
        gate = self.gate
        return gate is None or (gate.leased and not gate.revoked)

    def close(self) -> None:
        """The model is unloaded (its scheduler's close has sent the gate's leave): stop looking, free the lock."""
        self._closed.set()
        self._unlock()

    def _watch(self) -> None:
        while not self._closed.wait(SOLO_POLL_S):
            if self.path.exists():
                sock = try_connect(self.path)
                if sock is not None:
                    self.runtime.post(functools.partial(self._attach_posted, sock))
                    return

    def _attach_posted(self, sock: Any) -> None:
        """Scheduler thread, between two jobs (an inline pass in flight holds its lock): join now."""
        if self._closed.is_set() or self.runtime.scheduler.closed:
            sock.close()
            return
        self._attach(sock)
        self._unlock()

    def _attach(self, sock: Any) -> None:
        rt = self.runtime
        self.gate = ArbiterGate(sock, rt.scheduler, rt.post, self.name, **self._gate_args)
        if self._on_gate is not None:
            self._on_gate(self.gate)

    def _unlock(self) -> None:
        f, self._solo = self._solo, None
        if f is not None:
            f.close()  # closing the file releases its lock


def _checked(sock: Any, path: Path, group: str, lanes: int) -> None:
    """``check_lanes`` against a running arbiter; the socket is closed when the load fails."""
    try:
        check_lanes(path, group, lanes)
    except BaseException:
        sock.close()
        raise


def solo_lanes(solo: Path, group: str, lanes: int) -> None:
    """The solo member wrote its ``device_lanes`` in its lock file; the second member, which starts the group's
    arbiter, must have the same (the error is ``check_lanes``'s)."""
    from lazybatch.batcher.errors import ConfigError

    try:
        text = solo.read_text().strip()
    except OSError:
        return
    if text.isdigit() and int(text) != lanes:
        raise ConfigError(f"device_lanes {lanes} differs from the {int(text)} lane(s) of device group {group!r} (set "
                          "by the model already loaded in it); set device_lanes alike on every model of the group",
                          field="parameters.device_lanes")
