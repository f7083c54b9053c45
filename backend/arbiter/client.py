"""The stub's side of the arbiter: the gate a co-located model's ``Scheduler`` asks, over the arbiter's socket.

``ArbiterGate`` has the five calls of ``batcher.device.DeviceMember`` (``acquire``, ``started``, ``release``,
``finished``, ``admit``, and ``leave``), each a few bytes or nothing on the socket, so the scheduler core does not
know the device is in another process. Grants come back asynchronously: a reader thread puts them on the scheduler
thread's inbox (``post``), and that thread delivers ``Scheduler.granted()``, so the scheduler stays single-threaded.

Faults: a send that fails, or the socket closing under the reader (the arbiter was killed), turns the gate into
"always granted": the scheduler is detached from it and schedules alone, as a model without ``device_group`` does,
within one inbox turn. Nothing it holds is lost: a grant it was waiting for is replaced by a dispatch of its own.

The solo lease (protocol.py, docs/colocation.md): while the gate holds it, every call answers locally (nothing is
sent per job) and the model's inline route is on where its config allows it, so a model alone on its device runs
as an ungrouped one. A revoke (V) turns the inline route off at once; the lease goes back (F with the lease's device
seconds, then A or N) as soon as the job in flight is done, or at once when none is (an inline pass in flight holds
the scheduler thread's lock, so the revoke is only handled once it ends).

After a fallback, ``reconnect.Reconnector`` restarts the arbiter or finds the one another stub restarted, and
the gate rejoins on the scheduler thread through the same J/W handshake (``_join``: the rejoin may be leased); the
lease state is dropped with the dead connection (``_fail``), and replies of that connection (an older ``epoch``:
grants, revokes, its close) are dropped.
"""

from __future__ import annotations

import functools
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lazybatch.batcher.device import DEVICE_QUEUE_FULL, device_queue_full_message, span_stop
from lazybatch.batcher.interfaces import StageJob

from . import protocol as P
from .connection import connect, handshake
from .reconnect import Reconnector

if TYPE_CHECKING:  # pragma: no cover
    from lazybatch.batcher.scheduler import Scheduler

    from ..inline import InlineRoute

IDLE, WAITING, GRANTED, RUNNING = 0, 1, 2, 3
# an acquire while already waiting is sent again only when the most urgent request must start this much earlier
SLACK_RESEND_S = 1e-4
# an admission asked of the arbiter (device_max_queue_size) waits this long for its answer, then admits
ADMIT_TIMEOUT_S = 1.0


class ArbiterGate:
    """A ``Scheduler``'s gate whose device lives in the arbiter process (module docstring). Every call but the
    reader thread's is made on the scheduler thread."""

    def __init__(self, sock: socket.socket, scheduler: "Scheduler", post: Callable[[Callable[[], None]], None],
                 name: str, *, weight: float = 1.0, priority: int = 0, max_queue_size: int = 0,
                 route: "InlineRoute | None" = None, inline_ok: bool = False,
                 rejoin_paths: tuple[Path, Path] | None = None, lanes: int = 1) -> None:
        self.sock = sock
        self.max_queue_size = max_queue_size  # the device-wide bound (0: none, no H message is ever sent)
        self.answers: "queue.Queue[tuple[bool, int, int] | None]" = queue.Queue()  # B answers, from the reader
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        self.scheduler = scheduler
        self.post = post
        self.name = name
        self.weight = weight  # sent with each join (a rejoin after the arbiter's restart too)
        self.priority = priority
        self.epoch = 0  # the connection's number: a reply posted by an older one's reader is dropped
        self.reconnect: Any = None  # reconnect.Reconnector: back onto a restarted arbiter after a fallback
        self.state = IDLE
        self.shared = False  # the last grant said other models share the device: cut spans to ``budget``
        self.budget = 0.0  # device seconds the granted job may span (G's budget; 0: one stage)
        self.sent_start = 0.0  # the latest start sent with the pending acquire
        self.drained = True  # the arbiter was told this model holds nothing
        self.owed = b""  # a FINISHED sent with the next message (one write per stage boundary)
        self.began = 0.0
        self.dead = False
        self.left = False
        self.grants = 0
        self.fallbacks = 0
        # the model's use of the device, kept here (the Prometheus metrics read them: no round trip per job)
        self.device_s = 0.0  # seconds its jobs ran on a grant
        self.wait_s = 0.0  # seconds from asking to the grant
        self.wait_since = 0.0
        # the solo lease: no message per job, inline passes allowed (route.on) while it is held
        self.route = route  # the runtime's InlineRoute (None: no inline route to switch)
        self.inline_ok = inline_ok  # the model's config allows inline passes (model.py _inline_allowed)
        self.leased = False
        self.sibling_until = 0.0  # under the lease, until then (scheduler's clock): one-stage jobs, no inline pass
        self.revoked = False  # V received: the lease goes back once the job in flight is done
        self.lease_s = 0.0  # device seconds used under the current lease, not yet reported (F at its end)
        self.last_end = 0.0  # when its last job or inline pass under a lease ended (I at the lease's end)
        self.leases = 0
        self.sent = 0  # messages sent after the join (tests: none per job under a lease)
        if route is not None:
            route.tell_passes_to(self._inline_ran)
        if rejoin_paths is not None:  # set before the join: a join that fails already retries
            self.reconnect = Reconnector(self, *rejoin_paths, lanes=lanes)  # a restarted arbiter keeps the lanes
        scheduler.seat.take(self)  # type: ignore[arg-type]
        self._join(P.join_message(name, weight, priority))
        if not self.dead:
            self.start_reader()

    def reset(self, sock: socket.socket) -> None:
        """A rejoin (reconnect.py, scheduler thread): the old connection closed (its reader, if still reading,
        ends: its replies are an older epoch) and this one used from now on. The arbiter is new: nothing asked,
        nothing held, nothing owed (a job running now started alone); the scheduler asks this gate again."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.epoch += 1
        self.sock = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        self.state, self.drained, self.owed, self.shared, self.sent_start = IDLE, True, b"", False, 0.0
        while not self.answers.empty():
            self.answers.get_nowait()
        self.dead = False
        self.scheduler.seat.take(self)  # type: ignore[arg-type]

    def start_reader(self) -> None:
        """The reader thread of the current connection (at the join, and at each rejoin), after its W was read."""
        self.reader = threading.Thread(target=self._read, args=(self.sock, self.epoch), name=f"{self.name}-arbiter",
                                       daemon=True)
        self.reader.start()

    def _join(self, msg: bytes) -> None:
        """J, and the arbiter's W (``handshake``): leased (schedule alone from the first request) or not (ask per
        job). No W: the arbiter is gone, the gate falls back."""
        welcome = handshake(self.sock, msg)
        if welcome is None:
            self._fail()
        else:
            self.welcome(*welcome)

    def welcome(self, leased: int, sibling: float) -> None:
        """The join's answer, W (the first join's, or a rejoin's: ``reconnect.py``), on the scheduler thread."""
        if leased:
            self._lease(sibling)
        else:
            self._inline(False)

    def _lease(self, sibling: float) -> None:
        """The solo lease from now; ``sibling``: the last instant another member was active (the window below)."""
        self.leased, self.revoked = True, False
        self.leases += 1
        self.grants += 1
        self.shared = False
        self.sibling_until = sibling + P.SIBLING_WINDOW_S if sibling else 0.0  # 0.0: no sibling was ever active
        self._inline(self.inline_ok)
        if self.route is not None:
            self.route.hold(self.sibling_until)  # no inline pass until then (InlineRoute.run)

    def near_sibling(self) -> bool:
        """Leased, but another member was active less than ``SIBLING_WINDOW_S`` ago: it may ask again any moment,
        so jobs stay one stage long (``started``) and the inline route stays off, and its wait for this holder is
        one stage, not a whole span or pass (docs/colocation.md, "The newcomer's wait")."""
        return self.leased and self.scheduler.clock.now() < self.sibling_until

    def _inline(self, on: bool) -> None:
        if self.route is not None and self.route.on != on:
            self.route.switch(on)

    # ------------------------------------------------------------------ the Scheduler's gate
    def acquire(self, wants: bool) -> bool:
        if self.dead:
            return True
        if self.leased:  # alone on the device: granted here, nothing sent
            self.state = GRANTED if wants else IDLE
            return wants
        if self.state == GRANTED:
            if wants:
                return True
            self.state = IDLE
            self.drained = True
            return not self._send(P.NOTHING)
        if wants:
            now = self.scheduler.clock.now()
            start = now + self.scheduler.policy.least_slack(now)
            if self.state == IDLE or start < self.sent_start - SLACK_RESEND_S:
                if self.state == IDLE:
                    self.wait_since = time.monotonic()
                self.state = WAITING
                self.drained = False
                self.sent_start = start
                return not self._send(P.acquire_message(start, self.scheduler.held))
        elif self.state == IDLE and not self.drained:
            self.drained = True
            return not self._send(P.NOTHING)
        return False  # waiting: the grant comes through the inbox (on_grant)

    def started(self, job: StageJob) -> None:
        if self.dead:
            return
        self.state = RUNNING
        self.began = time.monotonic()
        if job.stop > job.stage + 1:
            if self.near_sibling():
                job.stop = job.stage + 1
            elif self.shared:  # as far as the models waiting at the grant can afford (batcher/device.py, rule 3)
                job.stop = span_stop(job, self.scheduler, self.budget)

    def release(self) -> None:
        if self.state == GRANTED and not self.dead:
            self.state = IDLE
            if not self.leased:
                self._send(P.RELEASE)

    def finished(self, job: StageJob) -> None:
        if self.state == RUNNING and not self.dead:
            self.state = IDLE
            ran = time.monotonic() - self.began
            self.device_s += ran
            if not self.leased:
                self.owed = P.FINISHED + P.F64.pack(ran)  # sent with the next acquire
                return
            self.lease_s += ran
            self.last_end = time.monotonic()
            if self.revoked:
                self._give_back()

    def _inline_ran(self, seconds: float) -> None:
        """An inline pass ran (execute's thread, under the scheduler thread's lock): device time, under the lease."""
        self.device_s += seconds
        if self.leased:
            self.lease_s += seconds
            self.last_end = time.monotonic()

    def _give_back(self) -> None:
        """The lease ends: I (how long ago its last job ended) and F (its device seconds) go with the next message
        (the scheduler's next acquire, A or N, which follows at once), and from now on the gate asks per job."""
        self.owed = P.give_back_message(self.lease_s, time.monotonic() - self.last_end)
        self.lease_s = 0.0
        self.leased = self.revoked = False
        self.drained = False  # so that an acquire with nothing held still sends N (and the owed F with it)
        self.shared = True
        self.budget = 0.0

    def admit(self, n: int) -> tuple[str, str] | None:
        """The device-wide bound (``device_max_queue_size``) for ``n`` new samples (already counted in this
        scheduler's ``held``): one round trip to the arbiter, which sums every member's held samples. No bound, or
        no arbiter (gone, or no answer within ``ADMIT_TIMEOUT_S``): admitted, the model's own bound still applies."""
        cap = self.max_queue_size
        if not cap or self.dead:
            return None
        while not self.answers.empty():  # a late answer of an admission that timed out
            self.answers.get_nowait()
        held = min(self.scheduler.held, 0xFFFFFFFF)
        if not self._send(P.ADMIT + P.ADMIT_BODY.pack(min(n, held), held, cap)):
            return None
        try:
            answer = self.answers.get(timeout=ADMIT_TIMEOUT_S)
        except queue.Empty:
            return None
        if answer is None or not answer[0]:
            return None
        _, before, members = answer
        return DEVICE_QUEUE_FULL, device_queue_full_message(before, members, cap)

    def leave(self) -> None:
        self.left = True
        if self.reconnect is not None:
            self.reconnect.stop()
        if not self.dead:
            self._send(P.LEAVE)
        try:
            self.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ the scheduler thread, from the inbox
    def on_grant(self, flags: int, sibling: float = 0.0, epoch: int = 0, budget: float = 0.0) -> None:
        if self.dead or self.left or epoch != self.epoch:
            return
        if self.state != WAITING:  # not asked for (cannot happen by the protocol): hand it back
            self._send(P.RELEASE)
            return
        self.wait_s += time.monotonic() - self.wait_since
        self.state = GRANTED
        if flags & P.LEASE:
            self._lease(sibling)
        else:
            self.grants += 1
            self.shared = bool(flags & P.SHARED)
            self.budget = budget
        self.scheduler.granted()

    def on_revoke(self, epoch: int = 0) -> None:
        """Another member asked for the device: no more inline passes; the lease goes back now, or when the job in
        flight is done (``finished``)."""
        if self.dead or self.left or epoch != self.epoch or not self.leased or self.revoked:
            return
        self.revoked = True
        self._inline(False)
        if self.state == RUNNING:
            return
        self.state = IDLE
        self._give_back()
        sched = self.scheduler
        if not sched.busy and not sched.closed:
            sched.granted()  # its acquire sends the F, with A (it holds requests) or N

    def on_lost(self, epoch: int = 0) -> None:
        """The arbiter's socket closed: schedule alone until a rejoin (lease dropped, inline route as ungrouped);
        a grant waited for is not waited for."""
        if self.dead or self.left or epoch != self.epoch:
            return
        self._fail()
        sched = self.scheduler
        if not sched.busy and not sched.closed:
            sched.granted()

    # ------------------------------------------------------------------ internals
    def _send(self, msg: bytes) -> bool:
        """Send ``msg`` (after a FINISHED owed); False, and detached from the scheduler, when the arbiter is gone."""
        if self.owed:
            msg, self.owed = self.owed + msg, b""
        self.sent += 1
        try:
            self.sock.sendall(msg)
            return True
        except OSError:
            if not self.left:
                self._fail()
            return False

    def _fail(self) -> None:
        """The arbiter is gone: detached, the scheduler schedules alone as an ungrouped model (inline route included,
        where allowed); a lease of the dead connection is gone with it (the rejoin's W may grant a new one)."""
        self.leased = self.revoked = False
        self.lease_s = 0.0
        if self.route is not None:
            self.route.hold(0.0)  # schedules alone: no sibling to leave room for
        self._inline(self.inline_ok)
        if not self.dead:
            self.dead = True
            self.fallbacks += 1
            print(f"lazybatch: {self.name}: the device group's arbiter is gone; scheduling alone until it is back",
                  file=sys.stderr)
        self.scheduler.seat.leave(self)  # type: ignore[arg-type]
        if self.reconnect is not None and not self.left:
            self.reconnect.start()

    def _read(self, sock: socket.socket, epoch: int) -> None:
        """Reader thread of connection ``epoch``: each grant onto the scheduler thread's inbox; the socket closing,
        a fallback."""
        buf = b""
        try:
            while True:
                data = sock.recv(256)
                if not data:
                    break
                buf += data
                i = 0
                while i < len(buf):
                    code = buf[i:i + 1]
                    size = P.REPLY_SIZES.get(code)
                    if size is None:
                        raise OSError(f"unknown message {code!r} from the arbiter")
                    if len(buf) - i < size:
                        break
                    if code == P.GRANT:
                        flags, sibling, budget = P.GRANT_BODY.unpack_from(buf, i + 1)
                        self.post(functools.partial(self.on_grant, flags, sibling, epoch, budget))
                    elif code == P.REVOKE:
                        self.post(functools.partial(self.on_revoke, epoch))
                    elif code == P.WELCOME:  # only ever the answer to the join, read there
                        pass
                    else:  # BOUND: the answer to the admission the scheduler thread waits for
                        full, held, members = P.BOUND_BODY.unpack_from(buf, i + 1)
                        self.answers.put((bool(full), held, members))
                    i += size
                buf = buf[i:]
        except OSError:
            pass
        if epoch == self.epoch:
            self.answers.put(None)  # an admission waiting for an answer admits
        if not self.left:
            self.post(functools.partial(self.on_lost, epoch))


def attach(runtime: Any, group: str, repository: str | Path, name: str, *, weight: float = 1.0,
           priority: int = 0, max_queue_size: int = 0, inline_ok: bool = False, lanes: int = 1) -> ArbiterGate:
    """Put a ``BackendRuntime``'s scheduler on its device group's arbiter (started here, with ``lanes``, when none
    runs), and back on it after the arbiter dies (``reconnect.py``). An arbiter already running with other lanes
    fails the load (``check_lanes``). ``inline_ok``: the model's config allows inline passes (on while the gate holds
    the solo lease, or schedules alone)."""
    path, lock = P.group_paths(repository, group)
    sock = connect(path, lock, lanes=lanes)
    try:
        check_lanes(path, group, lanes)
    except BaseException:
        sock.close()
        raise
    return ArbiterGate(sock, runtime.scheduler, runtime.post, name, weight=weight, priority=priority,
                       max_queue_size=max_queue_size, route=runtime.route, inline_ok=inline_ok,
                       rejoin_paths=(path, lock), lanes=lanes)


def check_lanes(path: Path, group: str, lanes: int) -> None:
    """The group's device has one number of lanes, the first member's (the arbiter is started with it). A model
    configured otherwise fails its load rather than logging a warning: it would otherwise serve with a number of
    concurrent jobs its own config.pbtxt contradicts, and the server would report it READY. One query at load (a
    connection of its own), nothing per job."""
    from lazybatch.batcher.errors import ConfigError

    from .server import IDLE_EXIT_S

    stats = query(path)
    running = int(stats.get("lanes", 1))
    if running != lanes:
        members = ", ".join(m["model"] for m in stats.get("members", [])) or "none now"
        raise ConfigError(f"device_lanes {lanes} differs from the {running} lane(s) of device group {group!r}'s "
                          f"arbiter (started with the value of the group's first model to load; members: "
                          f"{members}); set device_lanes alike on every model of the group (an arbiter left with "
                          f"no member exits after {IDLE_EXIT_S:g} s, and the next load starts one anew)",
                          field="parameters.device_lanes")


def query(path: Path, timeout: float = 5.0) -> dict[str, Any]:
    """The arbiter's figures (``Arbiter.stats``): members, grants, device shares, cross-model decisions."""
    import json

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(P.QUERY)
        buf = b""
        while len(buf) < 5 or len(buf) < 5 + P.U32.unpack_from(buf, 1)[0]:
            data = s.recv(65536)
            if not data:
                raise ConnectionError("the arbiter closed the connection before answering")
            buf += data
        return json.loads(buf[5:5 + P.U32.unpack_from(buf, 1)[0]])
