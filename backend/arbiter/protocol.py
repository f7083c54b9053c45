"""The arbiter's wire protocol: one-byte codes, a few bytes each, over a Unix stream socket.

Why this small: a message crosses at most once per stage boundary in each direction, and the device scheduler's
own cost must stay near 2% of a small model's batch-1 time (the device cost goal, docs/colocation.md), so nothing is shipped that the arbiter does
not need to decide: a stub sends when its most urgent request must start (``least_slack`` turned into an absolute
``time.monotonic()`` instant, which every process on the host shares) and how long its job ran; the arbiter answers
with a grant.

stub -> arbiter                                     arbiter -> stub
  J weight:f64 priority:i16 len:u16 name   join       W leased:u8 sibling:f64  the answer to J (leased: the solo
                                                                      lease from now)
  A latest_start:f64 held:u32              acquire    G flags:u8 sibling:f64 budget:f64  the device is granted
                                                                      (SHARED: spans cut to ``budget`` device
                                                                      seconds, one stage at 0; LEASE: the solo
                                                                      lease, see below)
                                                      V               revoke the lease: another member asked
                                                      Q len:u32 json  the answer to Q
  N                                        acquire(False): holds nothing (frees a grant; held 0)
  H n:u32 held:u32 cap:u32                 admission  B full:u8 held:u32 members:u16  its answer
  R                                        release: granted, but the policy has nothing to run now
  F ran:f64                                the job in flight finished after ``ran`` seconds
  I idle:f64                               sent before the F that gives a lease back: its last job under the lease
                                           ended ``idle`` seconds ago (0: the job in flight just did)
  L                                        leave (the model is unloaded)
  Q                                        stats query (tests, operators; any connection, no join needed)

``held`` is the samples the stub holds (queued or in flight). The arbiter keeps each member's last figure (from A,
N and H: a completion lowers it at the member's next A or N, so the sum only ever overestimates) for the
device-wide bound ``device_max_queue_size``: a stub with that bound sends H for each arrival of ``n`` samples (its
held counting them) and waits for B; ``full`` says the device-wide held would pass ``cap`` (B's ``held`` is the
samples held across the ``members`` before these n). A stub without the bound never sends H.

The solo lease (docs/colocation.md): a grant made while no other member waits, holds or runs (or the answer to a J
that finds it so) is a lease. Its holder schedules alone, as an ungrouped model: it sends nothing per job and may
run inline passes, until the arbiter sends V because another member sent A. The holder then finishes the job or
inline pass in flight and answers with F (the device seconds used under the lease, charged to its fair share as any
job's: server.py says why) followed by A or N, and asks per job from then on. Any F, N, R or L from
the holder ends the lease.

``sibling`` (with a lease): the last instant (``time.monotonic()``) at which another member was active (waiting,
granted or running; 0.0: never). While ``now < sibling + SIBLING_WINDOW_S`` the holder still sends nothing per job,
but cuts its spans to one stage and keeps its inline route off, so that a sibling that asks again soon (the
co-located case: its requests come every few ms) waits for one stage of the holder's, not its whole span or pass.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

JOIN, ACQUIRE, NOTHING, RELEASE, FINISHED, LEAVE, QUERY, GRANT = b"J", b"A", b"N", b"R", b"F", b"L", b"Q", b"G"
ADMIT, BOUND = b"H", b"B"
IDLE_SINCE = b"I"
WELCOME, REVOKE = b"W", b"V"
SHARED, LEASE = 1, 2  # the flags of G
# a lease holder whose sibling was active this recently keeps to one-stage jobs and no inline passes (above): long
# beside a co-located sibling's gaps between requests (ms), short beside a benchmark that drives one model at a time
SIBLING_WINDOW_S = 1.0
F64 = struct.Struct("<d")
ANSWER_BODY = struct.Struct("<Bd")  # W: leased, and the sibling's last active instant
GRANT_BODY = struct.Struct("<Bdd")  # G: flags, the sibling's last active instant, the span budget (batcher/device.py)
ACQUIRE_BODY = struct.Struct("<dI")
ADMIT_BODY = struct.Struct("<III")
BOUND_BODY = struct.Struct("<BIH")
JOIN_HEAD = struct.Struct("<dhH")
U32 = struct.Struct("<I")
# the size of each fixed-size message from a stub, code byte included (JOIN is JOIN_HEAD + its name)
SIZES = {ACQUIRE: 1 + ACQUIRE_BODY.size, NOTHING: 1, RELEASE: 1, FINISHED: 1 + F64.size, LEAVE: 1, QUERY: 1,
         ADMIT: 1 + ADMIT_BODY.size, IDLE_SINCE: 1 + F64.size}
# the size of each message from the arbiter to a member
REPLY_SIZES = {GRANT: 1 + GRANT_BODY.size, BOUND: 1 + BOUND_BODY.size, WELCOME: 1 + ANSWER_BODY.size, REVOKE: 1}


def give_back_message(lease_s: float, idle_s: float) -> bytes:
    """I and F: a lease goes back after ``lease_s`` device seconds under it, its last job ended ``idle_s`` ago."""
    return IDLE_SINCE + F64.pack(max(idle_s, 0.0)) + FINISHED + F64.pack(lease_s)


def acquire_message(latest_start: float, held: int) -> bytes:
    return ACQUIRE + ACQUIRE_BODY.pack(latest_start, min(max(held, 0), 0xFFFFFFFF))


def answer(code: bytes, flags: int, sibling: float = 0.0) -> bytes:
    """W (flags: leased 0/1), with the sibling's last active instant."""
    return code + ANSWER_BODY.pack(flags, sibling)


def grant_message(flags: int, sibling: float = 0.0, budget: float = 0.0) -> bytes:
    """G (flags: SHARED, LEASE), with the sibling's last active instant and the span budget in device seconds
    (``SharedDevice.span_budget``: what the members waiting can afford; 0: one stage)."""
    return GRANT + GRANT_BODY.pack(flags, sibling, budget)


def join_message(name: str, weight: float, priority: int) -> bytes:
    raw = name.encode()[:1024]
    return JOIN + JOIN_HEAD.pack(weight, priority, len(raw)) + raw


def solo_path(lock: Path) -> Path:
    """The file a group's only member holds locked while no arbiter runs (backend/arbiter/join.py): a second member
    that finds it locked starts the arbiter."""
    return lock.with_suffix(".solo")


def group_paths(repository: str | os.PathLike[str], group: str) -> tuple[Path, Path]:
    """(socket, lock file) of one device group of one model repository: every stub of that server's group derives
    the same pair, and nothing else does (a Unix socket path must stay under 108 bytes, hence the digest)."""
    key = f"{os.path.realpath(repository)}\0{group}".encode()
    digest = hashlib.sha1(key).hexdigest()[:16]
    base = Path(os.environ.get("LAZYBATCH_ARBITER_DIR") or tempfile.gettempdir()) / f"lazybatch-arbiter-{digest}"
    return base.with_suffix(".sock"), base.with_suffix(".lock")
