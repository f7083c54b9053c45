"""Back onto a restarted arbiter: a stub whose arbiter died keeps serving alone and rejoins the group in the
background.

Why: without it, one ``kill -9`` of the arbiter (or its crash) leaves every model of the group scheduling alone
until each is reloaded, so the device is contended blindly from then on. ``connection.connect`` already starts an
arbiter under the group's file lock when none answers, so the first stub to retry starts a fresh one and the others
connect to it; nothing else has to choose a leader.

How: ``Reconnector.start`` (called by the gate when it falls back, on the scheduler thread) runs one background
thread that tries ``connect`` at once, then after ``FIRST_DELAY_S`` doubling to ``MAX_DELAY_S`` between tries. A
socket it gets joins (the first join's J/W handshake, ``connection.handshake``: name, weight, priority level; the
device-wide bound travels with each admission as before) and is handed with its W to the scheduler thread
(``BackendRuntime.post``), where ``rejoin`` applies the W (the rejoin may hold the solo lease) and puts the gate back on
the scheduler. That thread is the only one that touches the scheduler, so nothing it holds is lost or run
twice: a job started while alone finishes alone (the arbiter never saw its grant, so nothing is reported), and
the next dispatch asks the new arbiter. Replies of the dead connection still on the inbox carry an older epoch and
are dropped.

The bound (docs/colocation.md, "Faults"): the models run unscheduled across one another from the arbiter's death
until the rejoin, that is the job each was running (it sees the socket close at its next inbox turn), plus the
arbiter's start (a Python process: about 0.3-1 s, at most ``connection.CONNECT_TIMEOUT_S`` before a retry), plus one
inbox turn. While no arbiter can be started, a retry every ``MAX_DELAY_S`` (plus the connect timeout).

A stub that is the group's only member left restarts the arbiter too (it does not go back to ``join.py``'s solo
lock): a group whose second member left already runs one arbiter with one member, and the rejoin's W gives the
lone member the lease, so it sends nothing per job (docs/colocation.md, "A restart with one member left").
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import protocol as P

if TYPE_CHECKING:  # pragma: no cover
    from .client import ArbiterGate

FIRST_DELAY_S = 0.2  # after a failed first try (at once), the wait before the next one ...
MAX_DELAY_S = 2.0  # ... doubling up to this
# a connection that lived less than this before it died again does not reset the backoff (an arbiter that dies at
# each join is not restarted in a tight loop)
STABLE_S = 10.0


class Reconnector:
    """One gate's way back to its group's arbiter (module docstring). ``start`` and ``rejoin`` run on the scheduler
    thread, ``stop`` there too (``ArbiterGate.leave``); the tries run on a thread of its own."""

    def __init__(self, gate: "ArbiterGate", path: Path, lock: Path, *, lanes: int = 1) -> None:
        self.gate = gate
        self.path = path
        self.lock_file = lock
        self.lanes = lanes
        self.mutex = threading.Lock()  # guards ``stopped`` and ``pending`` (the retry thread and the scheduler's)
        self.stopped = False
        self.trying = False  # a retry thread is under way (until it hands a socket over or stops)
        # connected and joined (the arbiter's W: leased, sibling's instant), not yet taken by ``rejoin``
        self.pending: tuple[socket.socket, tuple[int, float]] | None = None
        self.wake = threading.Event()  # set by ``stop``: a wait between tries ends at once
        self.delay = 0.0  # the wait before the next try (0: at once)
        self.rejoined_at = -STABLE_S
        self.rejoins = 0
        self.tries = 0

    def start(self) -> None:
        """The gate fell back: try to rejoin in the background (a no-op while a try is under way or after stop)."""
        with self.mutex:
            if self.stopped or self.trying or self.pending is not None:
                return
            self.trying = True
            if time.monotonic() - self.rejoined_at >= STABLE_S:
                self.delay = 0.0
        threading.Thread(target=self._run, name=f"{self.gate.name}-rejoin", daemon=True).start()

    def stop(self) -> None:
        """The model leaves (unloaded): no more tries, and a socket not yet taken is closed."""
        with self.mutex:
            self.stopped = True
            pending, self.pending = self.pending, None
        self.wake.set()
        if pending is not None:
            pending[0].close()

    def _over(self) -> bool:
        """No more tries: stopped by ``leave``, or the scheduler closed (a detached gate is no longer the
        scheduler's, so ``Scheduler.close`` does not call its ``leave``)."""
        return self.stopped or self.gate.left or self.gate.scheduler.closed

    def _run(self) -> None:
        from .connection import connect, handshake

        while True:
            end = time.monotonic() + self.delay
            while not self._over() and end - time.monotonic() > 0:  # closing ends the wait within 0.1 s
                self.wake.wait(min(end - time.monotonic(), 0.1))
            with self.mutex:
                if self._over():
                    self.trying = False
                    return
            self.tries += 1
            self.delay = min(max(self.delay * 2, FIRST_DELAY_S), MAX_DELAY_S)
            try:
                sock = connect(self.path, self.lock_file, lanes=self.lanes)
            except (OSError, RuntimeError) as e:
                print(f"lazybatch: {self.gate.name}: the device group's arbiter could not be restarted ({e}); "
                      f"scheduling alone, next try in {self.delay:g} s", file=sys.stderr)
                continue
            # the join's J/W here, off the scheduler thread: a retry right after the death may reach the dying
            # arbiter's listener (its connections close before it), which resets it; that is one more try, not a
            # fallback. The W's lease holds from now: a V it is revoked by waits in the socket for the reader.
            welcome = handshake(sock, P.join_message(self.gate.name, self.gate.weight, self.gate.priority))
            if welcome is None:
                sock.close()
                continue
            with self.mutex:
                self.trying = False
                if self._over():
                    sock.close()
                    return
                self.pending = sock, welcome
            self.gate.post(self.rejoin)
            return

    def rejoin(self) -> None:
        """Scheduler thread: put the gate back on the group with the socket the retry thread got."""
        with self.mutex:
            pending, self.pending = self.pending, None
        gate = self.gate
        sched = gate.scheduler
        if pending is None:
            return
        sock, welcome = pending
        if gate.left or sched.closed:
            sock.close()
            return
        gate.reset(sock)  # a new connection: nothing asked, held or owed, and the scheduler asks it again
        gate.welcome(*welcome)  # the W the retry thread read: leased, or per job
        gate.start_reader()
        self.rejoins += 1
        self.rejoined_at = time.monotonic()
        print(f"lazybatch: {gate.name}: rejoined the device group's arbiter after {self.tries} "
              f"{'try' if self.tries == 1 else 'tries'}", file=sys.stderr)
        self.tries = 0
        if not sched.busy:
            sched.granted()  # what it holds asks the new arbiter now (its next step sends the acquire)
