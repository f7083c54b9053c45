"""The arbiter process: a ``SharedDevice`` whose members stand for co-located stubs' schedulers.

One process per device group and server, started by the first stub that needs it (``connection.connect``). It is
single-threaded: one ``selectors`` loop reads every stub's socket and runs the device's decisions, so the device is
only ever touched by one thread, as the scheduler core requires. A member's "scheduler" is a ``StubProxy``: its
clock is the host's monotonic clock, its policy's ``least_slack`` comes from the instant the stub sent with its
acquire, and ``granted`` writes a grant to the stub's socket.

A stub whose socket closes (unloaded, crashed, ``kill -9``) leaves the device at once: a lane it held is freed and
handed on in the same loop turn, so the other models wait for nothing it left behind. The process exits once it
has had no member for ``IDLE_EXIT_S``.

The solo lease (protocol.py): a grant made while every other member is idle is a lease, revoked (V) as soon as
another member asks; the holder acknowledges with F once its job or inline pass in flight is done. Lease time is
counted in the member's device time and in its virtual time, as every job is in batcher/device.py. Not charging it
(nobody else wanted the device meanwhile: the rule until 2026-11-28) left the holder's virtual time behind every
sibling's, and a sibling waking from idle is brought up only to the least active virtual time (the holder's), so
it carried its own past use as a debt: the fair share then put it behind the holder's stages while the holder had
a backlog (served, the quickstart pair: the small model got half the contended device time, between ResNet-50's
batch-8 stages, and its average went from a few ms to 70-300 ms).
"""

from __future__ import annotations

import json
import math
import os
import selectors
import socket
import sys
import time
from pathlib import Path
from typing import Any

from lazybatch.batcher.decisions import DEVICE, DecisionLog
from lazybatch.batcher.device import GRANTED, IDLE, RUNNING, DeviceMember, SharedDevice
from lazybatch.batcher.seat import DeviceSeat

from . import protocol as P

IDLE_EXIT_S = 60.0  # no member for this long: the server it served is gone (or has no group model loaded)
LOG_RECORDS = 256  # decision records kept per member (the query returns the newest)
STATES = ("idle", "waiting", "granted", "running")  # a member's state (batcher/device.py), named in the stats


class _Clock:
    @staticmethod
    def now() -> float:
        return time.monotonic()


class _Slack:
    """The member's policy as the device sees it: only ``least_slack``, from the stub's last acquire."""

    __slots__ = ("latest_start",)

    def __init__(self) -> None:
        self.latest_start = math.inf

    def least_slack(self, now: float) -> float:
        return self.latest_start - now


class _Table:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class StubProxy:
    """What ``SharedDevice`` reads of a ``Scheduler``, for a stub at the other end of a socket."""

    clock = _Clock()

    def __init__(self, conn: socket.socket, name: str) -> None:
        self.conn = conn
        self.policy = _Slack()
        self.table = _Table(name)
        self.log = DecisionLog(LOG_RECORDS)
        self.seat = DeviceSeat()  # the member ``SharedDevice.join`` made for this stub, as a Scheduler's
        self.held = 0  # samples the stub last said it holds (A, N, H): the device-wide bound (device_max_queue_size)
        self.device: SharedDevice | None = None
        self.lost = False
        self.leased = False  # holds the solo lease (protocol.py)
        self.revoking = False  # V sent, F not yet back
        self.leases = 0
        self.revokes = 0
        self.messages = 0  # messages received from this member (its cost: none per job under a lease)
        # when it last asked for the device (A), took arrivals under the device-wide bound (H), ended a granted job
        # (F), or, under a lease, ended its last job (I, sent with the give-back): its last activity. Not N, R or
        # the give-back itself: a holder revoked while idle answers at once, and counting that answer as activity put
        # the member it handed the device to in the sibling window (one-stage jobs, no inline pass for 1 s) though
        # nobody had run for longer than that (the quickstart pair's large model alone, 2026-11-28)
        self.active_at = 0.0

    def sibling_active(self) -> float:
        """The last instant another member was active (0.0: never): sent with a lease (protocol.py, ``sibling``).
        Called only when every other member is idle, so each one's ``active_at`` marks its last activity."""
        if self.device is None:
            return 0.0
        return max((o.scheduler.active_at for o in self.device.members  # type: ignore[attr-defined]
                    if o is not self.gate), default=0.0)

    @property
    def gate(self) -> DeviceMember | None:
        """The member ``SharedDevice.join`` seated for this stub (None before the join)."""
        return self.seat.gate

    def alone(self) -> bool:
        """Every other member is idle (none waits, holds or runs): a grant now is a lease."""
        return self.device is not None and all(o.state == IDLE for o in self.device.members if o is not self.gate)

    def granted(self) -> None:
        flags, sibling = 0, 0.0
        if self.alone():
            flags, sibling = P.LEASE, self.sibling_active()
            self.leased, self.revoking = True, False
            self.leases += 1
        elif self.device is not None and self.device.shared:
            flags = P.SHARED
        self.send(P.grant_message(flags, sibling, self.gate.budget if self.gate is not None else 0.0))

    def revoke(self) -> None:
        if self.leased and not self.revoking:
            self.revoking = True
            self.revokes += 1
            self.send(P.REVOKE)

    def send(self, msg: bytes) -> None:
        try:
            self.conn.sendall(msg)
        except OSError:  # its socket closed: the loop sees it and the member leaves (freeing its grant)
            self.lost = True


class Arbiter:
    """The loop: accept stubs, read their messages, run the device."""

    def __init__(self, path: Path, *, lanes: int = 1) -> None:
        self.path = path
        self.device = SharedDevice(lanes=lanes)
        self.sel = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytearray] = {}
        self.proxies: dict[socket.socket, StubProxy] = {}
        self.joined = 0  # members that ever joined (stats)
        self.left = 0
        self.refused = 0  # admissions refused by the device-wide bound
        self.departed: list[dict[str, Any]] = []  # the last figures of members that left
        self.last_member_at = time.monotonic()
        self.grant_owed = False  # a lease ended in the read being handled: grant at its end
        if path.exists():
            path.unlink()  # a stale socket of a dead arbiter (the caller holds the group's lock)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.sel.register(self.listener, selectors.EVENT_READ)

    def serve(self) -> None:
        try:
            while True:
                for key, _ in self.sel.select(timeout=1.0):
                    if key.fileobj is self.listener:
                        conn, _ = self.listener.accept()
                        self.buffers[conn] = bytearray()
                        self.sel.register(conn, selectors.EVENT_READ)
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                for conn, proxy in list(self.proxies.items()):
                    if proxy.lost:
                        self._drop(conn)
                if self.device.members:
                    self.last_member_at = time.monotonic()
                elif time.monotonic() - self.last_member_at > IDLE_EXIT_S:
                    return
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf = self.buffers[conn]
        buf += data
        while buf:
            code = bytes(buf[:1])
            if code == P.JOIN:
                if len(buf) < 1 + P.JOIN_HEAD.size:
                    break
                weight, priority, n = P.JOIN_HEAD.unpack_from(buf, 1)
                end = 1 + P.JOIN_HEAD.size + n
                if len(buf) < end:
                    break
                self._join(conn, bytes(buf[1 + P.JOIN_HEAD.size:end]).decode(errors="replace"), weight, priority)
            else:
                end = P.SIZES.get(code, 0)
                if not end:
                    print(f"lazybatch arbiter: unknown message {code!r}; dropping that connection", file=sys.stderr)
                    self._drop(conn)
                    return
                if len(buf) < end:
                    break
                self._handle(conn, code, buf, end)
            del buf[:end]
        if self.grant_owed:
            self.grant_owed = False
            self.device._grant()

    def _handle(self, conn: socket.socket, code: bytes, buf: bytearray, end: int) -> None:
        if code == P.QUERY:
            body = json.dumps(self.stats()).encode()
            conn.sendall(P.QUERY + P.U32.pack(len(body)) + body)
            return
        proxy = self.proxies.get(conn)
        if proxy is None or proxy.gate is None:
            return  # not joined: ignore
        m = proxy.gate
        proxy.messages += 1
        if code in (P.ACQUIRE, P.ADMIT) or (code == P.FINISHED and not proxy.leased):
            proxy.active_at = time.monotonic()  # it asked, took arrivals, or ran a granted job: see ``active_at``
        if code == P.IDLE_SINCE:  # a lease goes back (the F follows): when its last job under the lease ended
            proxy.active_at = max(proxy.active_at, time.monotonic() - P.F64.unpack_from(buf, 1)[0])
        elif code == P.ACQUIRE:
            proxy.policy.latest_start, proxy.held = P.ACQUIRE_BODY.unpack_from(buf, 1)
            if proxy.leased and m.state == GRANTED:  # the holder asks (a stub's gate never does): lease given back
                proxy.leased = proxy.revoking = False
                m._free_lane()
            for other in self.proxies.values():  # another member asks: the lease holder gives it back
                if other is not proxy:
                    other.revoke()
            m.acquire(True)
        elif code == P.NOTHING:
            proxy.held = 0
            m.acquire(False)
        elif code == P.ADMIT:
            n, held, cap = P.ADMIT_BODY.unpack_from(buf, 1)
            others = sum(p.held for p in self.proxies.values() if p is not proxy)
            before = others + held - n
            full = bool(cap) and before + n > cap
            proxy.held = held - n if full else held
            self.refused += full
            try:
                conn.sendall(P.BOUND + P.BOUND_BODY.pack(full, max(before, 0), len(self.proxies)))
            except OSError:
                proxy.lost = True
        elif code == P.RELEASE:
            m.release()
        elif code == P.FINISHED and proxy.leased:  # the lease given back: its time charged as any job's (module doc)
            ran = P.F64.unpack_from(buf, 1)[0]
            m.device_time += ran
            m.vt += ran / m.weight
            self.device.busy_time += ran
            if m.state in (GRANTED, RUNNING):
                m.state = GRANTED
                m._free_lane()
        elif code == P.FINISHED:
            if m.state == GRANTED:  # the arbiter sees no start: the job ran from its grant to now
                m.state = RUNNING
                m.began = time.monotonic() - P.F64.unpack_from(buf, 1)[0]
                m.finished(None)  # type: ignore[arg-type]
        elif code == P.LEAVE:
            self._leave(conn)
        if proxy.leased and m.state not in (GRANTED, RUNNING):  # F, N, R or L freed its lane: the lease ended
            proxy.leased = proxy.revoking = False
            # the lane goes to a waiting member once the whole read is handled (``_read``): the F that gives a lease
            # back comes with the holder's A or N, and a grant between the two would find the new holder alone
            self.grant_owed = True

    def _join(self, conn: socket.socket, name: str, weight: float, priority: int) -> None:
        if conn in self.proxies:
            return
        proxy = StubProxy(conn, name)
        proxy.device = self.device
        m = self.device.join(proxy, name, weight=weight, priority=priority)  # type: ignore[arg-type]
        self.proxies[conn] = proxy
        self.joined += 1
        leased = self.device.free > 0 and proxy.alone()  # nobody else active: it schedules alone from the start
        if leased:
            self.device.lease_lane(m)
            proxy.leased = True
            proxy.leases += 1
        proxy.send(P.answer(P.WELCOME, leased, proxy.sibling_active() if leased else 0.0))

    def _leave(self, conn: socket.socket) -> None:
        """The member leaves the device (unloaded, or its socket closed): a lane it holds is freed and handed on."""
        proxy = self.proxies.pop(conn, None)
        if proxy is None or proxy.gate is None:
            return
        m = proxy.gate
        if m.state == RUNNING:
            m.state = GRANTED
        self.device.members.remove(m)
        m.leave()  # frees a lane it was granted, then grants the next waiting member
        self.left += 1
        self.departed.append(m.stats() | {"decisions": proxy.log.counts.get(DEVICE, 0), "leases": proxy.leases,
                                          "revokes": proxy.revokes, "messages": proxy.messages})

    def _drop(self, conn: socket.socket) -> None:
        self._leave(conn)
        self.buffers.pop(conn, None)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def stats(self) -> dict[str, Any]:
        """Per member: device time and share, grants, wait at the device, its cross-model (``device``) decisions,
        and its state now (``granted`` or ``running``: it holds a lane); members that left keep their last figures
        under ``departed``."""
        members = []
        for proxy in self.proxies.values():
            m = proxy.gate
            if m is None:
                continue
            recent = [r.reason for r in list(proxy.log)[-5:]]
            members.append(m.stats() | {"decisions": proxy.log.counts.get(DEVICE, 0), "recent": recent,
                                        "leased": proxy.leased, "leases": proxy.leases, "revokes": proxy.revokes,
                                        "messages": proxy.messages, "state": STATES[m.state]})
        return {"pid": os.getpid(), "lanes": self.device.lanes, "joined": self.joined, "left": self.left,
                "held": sum(p.held for p in self.proxies.values()), "refused": self.refused, "members": members,
                "departed": self.departed[-16:]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0])
    lanes = int(args[1]) if len(args) > 1 else 1
    Arbiter(path, lanes=lanes).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
