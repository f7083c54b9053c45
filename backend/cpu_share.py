"""The CPU share: co-located lazybatch models of one server aim the kernel's preemption through their threads' nice
values (docs/colocation.md, "The CPU through the operating system").

Why: on a CPU the kernel preempts in microseconds. A model whose turn must wait for another's layer to end (the
device group's arbiter, which models a non-preemptive accelerator) waits longer than one that takes the cores at
once. So each model's stub lowers its own threads while a more urgent model (``batcher/cpu_rank.py``) is active,
and puts them back when it is not; an idle member's pool waits parked while another member is active
(backend/pool_park.py); and while a more urgent and a less urgent member are both active, the cores are split
between them, each stub moving its own threads (``cpu_rank.cores_for``, ``cpu_share_split``: weights alone did not
keep a 1 ms model's p99 beside a neighbour batching on both cores, and a core per model did:
docs/results/colocation_capacity.md). Served on the quickstart's pair (docs/results/cpu_share.md) both models'
averages were lower than under Triton's best, and a model alone is never lowered, parked nor confined, so the share
is on by default for lazybatch models on a CPU (``cpu_share: auto``; ``none`` opts a model out; docs/colocation.md,
"On by default").

How the members meet, without an arbiter: each writes one small file in a folder of its server's (``registry_dir``:
per tritonserver process, the stubs' parent). The file's mtime says when the model last had a request:
``note_active`` touches it at most every ``TOUCH_S``, one syscall at most that often, none per request otherwise. A
watcher thread in every stub looks every ``POLL_S`` (every ``IDLE_POLL_S`` while its model is idle and not lowered)
at the other members: those ranked above its own set its nice, any active one lets its pool park (the folder listed
again only when its mtime moves, or every ``RESCAN_S``). It ignores members whose process is gone (a stub killed
with ``kill -9`` stops lowering its peers within ``POLL_S``) and members idle for ``ACTIVE_WINDOW_S``, and moves
every thread of its own process (onnxruntime's pools, the scheduler, the responder, Triton's stub threads) to the
nice the rank rule gives; a thread already set is not read again, and a thread started later is born at its parent's
nice (the threads are listed again every ``RESCAN_S`` all the same). A stub changes only its own threads, so a dead
stub leaves nothing lowered behind it. What it costs per request: docs/results/cpu_share_cost.md (its benchmark retired,
kept by git at e15d6b6).

Privileges (backend/os_weights.py): putting a thread back from nice 10 to 0 needs CAP_SYS_NICE or an RLIMIT_NICE
of at least 20. Without either, no thread is lowered at all (it could never come back): the share says so once in
the log and in ``lazybatch_cpu_share_refused_total``, and the model serves as an unshared one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from lazybatch.batcher.cpu_rank import NICE_STEPS, ShareMember, cores_for, nice_for
from lazybatch.batcher.decisions import CORES, WEIGHT, DecisionLog

from .os_weights import ThreadWeights, Weight, process_state, read_weight, set_cores, threads
from .pool_park import PoolPark

POLL_S = 0.1
ACTIVE_WINDOW_S = 1.0  # a member with a request this recently is active
TOUCH_S = 0.1  # a member marks itself active at most this often
RESCAN_S = 1.0  # the folder is listed again at least this often, whatever its mtime says
# an idle member that is not lowered looks this seldom (its threads sleep: lowering them would change nothing), so
# that a server's idle models do not wake ten times a second each; its next request wakes the watcher at once
IDLE_POLL_S = 1.0
LOG_RECORDS = 256  # WEIGHT decisions kept (every one is counted)


def registry_dir(server_pid: int | None = None) -> Path:
    """Where the models of one server meet: one folder per tritonserver process (the stub's parent)."""
    pid = os.getppid() if server_pid is None else server_pid
    return Path(tempfile.gettempdir()) / f"lazybatch-cpu-share-{os.getuid()}" / str(pid)


def _alive(pid: int) -> bool:
    """Whether the process runs: a stub killed but not yet reaped by its server is a zombie, and counts as gone."""
    return process_state(pid) not in (None, "Z", "X")


class CpuShare:
    """This stub's member of its server's CPU share: its file, and the watcher that sets its threads' nice."""

    def __init__(self, me: ShareMember, *, folder: Path | None = None, weights: ThreadWeights | None = None,
                 poll_s: float = POLL_S, window_s: float = ACTIVE_WINDOW_S, steps: tuple[int, ...] = NICE_STEPS,
                 log: Callable[[str], None] | None = None, park: PoolPark | None = None) -> None:
        self.me = me
        # the cores the process may use, split between the most urgent active member and the rest while both are
        # active (cpu_rank.cores_for; its member's cpu_share_split), or () where it does not split
        self.cores = tuple(sorted(os.sched_getaffinity(0))) if me.split else ()
        self.confined: tuple[int, ...] | None = None  # the cores its threads keep now (None: every one of them)
        self.confinements = 0  # times it went from every core to a part
        self._cored: set[int] = set()  # threads already confined to ``confined``
        self._cores_listed = 0.0  # when its threads were last listed while confined (time.monotonic)
        self.park = park  # its onnxruntime workers, parked while the model is idle (pool_park.py), or None
        self.steps = steps  # the nice under 0, 1, 2+ more urgent active members (its cpu_share_nice)
        self.folder = registry_dir() if folder is None else Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.file = self.folder / f"{self.pid}.json"
        # what every thread of the process comes back to: the weight of the thread that loads the model
        self.base = read_weight(threading.get_native_id())
        self.weights = ThreadWeights(baseline=self.base) if weights is None else weights
        self.poll_s, self.window_s = poll_s, window_s
        self._log = log or (lambda text: print(f"lazybatch: {me.name}: {text}", file=sys.stderr))
        self.nice = 0  # the nice the rank rule gives now (what the threads have where allowed)
        self.lowered_s = 0.0  # seconds spent lowered
        self.lowerings = 0  # times it went from 0 to a higher nice
        self._lowered_since: float | None = None
        self._touched = 0.0
        self._said: str | None = None  # the one explanation logged
        self._known: dict[str, ShareMember] = {}  # file name -> the member it describes
        self._others: list[tuple[int, str, ShareMember]] = []  # (pid, file, member): every other member
        self._folder_mtime, self._scanned = -1, 0.0  # the folder as last listed, and when
        self._set: set[int] = set()  # threads at the nice the rule gives now (a new thread is born at its parent's)
        self._listed = 0.0  # when this process's threads were last listed while lowered (time.monotonic)
        # every change of the nice and the cores the rank rule gives, and why (WEIGHT and CORES decisions;
        # lazybatch_decisions_total)
        self.log = DecisionLog(capacity=LOG_RECORDS)
        self.log.counts.setdefault(WEIGHT, 0)
        if self.cores:
            self.log.counts.setdefault(CORES, 0)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by the first request after an idle spell: look now
        self._lock = threading.Lock()
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": self.pid, "name": me.name, "sla_ms": me.sla_ms, "role": me.role,
                                  "split": me.split}))
        os.utime(tmp, (0, 0))  # idle until its first request
        os.replace(tmp, self.file)
        self._thread = threading.Thread(target=self._watch, name=f"{me.name}-cpu-share", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the request path
    def note_active(self) -> None:
        """A request came: touch the file if the last touch is older than TOUCH_S (no syscall otherwise)."""
        now = time.time()
        if now - self._touched >= TOUCH_S:
            if now - self._touched >= self.window_s:  # the first request after an idle spell
                self._wake.set()
            self._touched = now
            try:
                os.utime(self.file, (now, now))
            except OSError:
                pass

    # ------------------------------------------------------------------ the watcher
    def peers(self, now: float | None = None) -> list[ShareMember]:
        """The other members more urgent than this one that had a request within the window and whose process
        lives: the only ones the rank rule counts."""
        return self._above(self.active_members(now, everyone=False))

    def _above(self, members: list[ShareMember]) -> list[ShareMember]:
        return [m for m in members if m.rank() < self.me.rank()]

    def active_members(self, now: float | None = None, *, everyone: bool = True) -> list[ShareMember]:
        """The other members (``everyone=False``: only those ranked above this one) that had a request within the
        window and whose process lives. The folder is listed again only when its mtime moved (a member joined or
        left) or every RESCAN_S; a look then costs one stat of the folder, one of each member's file it asks
        about, and a /proc stat of each active one."""
        now = time.time() if now is None else now
        self._rescan(now)
        out = []
        for pid, path, member in self._others:
            if not everyone and member.rank() >= self.me.rank():
                continue
            try:
                if now - os.stat(path).st_mtime > self.window_s or not _alive(pid):
                    continue
            except OSError:  # gone: the next listing drops it
                continue
            out.append(member)
        return out

    def _rescan(self, now: float) -> None:
        """The other members, from the folder, where it may have changed."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except OSError:
            self._others = []
            return
        if mtime == self._folder_mtime and now - self._scanned < RESCAN_S:
            return
        self._folder_mtime, self._scanned = mtime, now
        others = []
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            entries = []
        for e in entries:
            try:
                stem, ext = os.path.splitext(e.name)
                if ext != ".json" or not stem.isdigit() or int(stem) == self.pid:
                    continue
                member = self._known.get(e.name)
                if member is None:  # a member's file is written once (os.replace): read it once
                    with open(e.path) as f:
                        d = json.load(f)
                    member = self._known[e.name] = ShareMember(str(d["name"]), d.get("sla_ms"),
                                                               str(d.get("role", "auto")), bool(d.get("split")))
                others.append((int(stem), e.path, member))
            except (OSError, ValueError, KeyError):
                continue  # a file being replaced, or gone
        self._others = others

    def step(self, now: float | None = None) -> int:
        """One look: the nice the rank rule gives, applied to every thread of this process; returns it. Nothing to
        do (not lowered, and nothing to lower) costs no per-thread syscall. The pool is parked (when idle) only while
        some other member is active: alone, or beside idle members, parking would cost this model and buy nobody
        anything (backend/pool_park.py). A member with no pool to park asks only about those ranked above it."""
        parks = self.park is not None and self.park.allowed
        active = self.active_members(now, everyone=parks or bool(self.cores))
        peers = self._above(active)
        if parks:
            self.park.set_neighbours_active(bool(active))
        want = nice_for(self.me, peers, self.steps)
        cores = cores_for(self.me, active, self.cores) if self.cores else None
        moved = False  # whether a weight was set this look: it sets the class too, which parked workers must keep
        with self._lock:
            t = time.monotonic()
            self._confine(cores, t)
            if want > 0:
                if want != self.nice or t - self._listed >= RESCAN_S:
                    # threads started since the last listing are lowered too: a thread is born at its parent's
                    # nice, so a new one is already lowered where every thread is, and the listing is a safety net
                    tids = threads()
                    self._listed = t
                    if want != self.nice:
                        self._set.clear()
                    fresh = [tid for tid in tids if tid not in self._set]  # weights set are not read again
                    if fresh:
                        self.weights.set(fresh, Weight(self.base.policy, max(want, self.base.nice)))
                        self._set = set(tids)
                        moved = True
                if self.weights.said is not None and not self.weights.original:  # refused: nothing could be lowered
                    want = 0
                    self._set.clear()
            elif self._lowered_since is not None or self.weights.original:
                # back: threads it lowered, and threads they started meanwhile (born lowered)
                self.weights.set(threads(), self.base)
                self.weights.restore()
                self._set.clear()
                moved = True
            if want > 0 and self._lowered_since is None:
                self._lowered_since = t
                self.lowerings += 1
            elif want == 0 and self._lowered_since is not None:
                self.lowered_s += t - self._lowered_since
                self._lowered_since = None
            said_before = self._said
            self._said = self.weights.said
            if want != self.nice:
                self.log.add(t, WEIGHT, 0, len(peers), self._why(want, peers), float(want))
            self.nice = want
            if moved and self.park is not None:
                self.park.reassert()
        if self._said is not None and said_before is None:
            self._log(f"cpu_share: threads are not lowered beside more urgent models ({self._said})")
        return want

    def _confine(self, cores: tuple[int, ...] | None, t: float) -> None:
        """Move every thread of this process to ``cores`` (None: back to every core), each thread once per change;
        while confined, threads started since are moved at the next listing (a thread is born with its parent's
        cores, so this is a safety net, as for the nice). Nothing to do costs no syscall."""
        if cores == self.confined and (cores is None or t - self._cores_listed < RESCAN_S):
            return
        tids = threads()
        self._cores_listed = t
        if cores != self.confined:
            self._cored.clear()
            if cores is not None and self.confined is None:
                self.confinements += 1
            self.log.add(t, CORES, 0, 0, f"cores {','.join(map(str, cores or self.cores))}: "
                         + ("split by rank beside another active member" if cores else "every core"),
                         float(len(cores or self.cores)))
        set_cores([tid for tid in tids if tid not in self._cored], cores or self.cores)
        self._cored = set(tids) if cores is not None else set()
        if self.park is not None and cores != self.confined:
            self.park.set_cores(len(cores) if cores else None)  # a pool wider than its cores parks the surplus
        self.confined = cores

    def _why(self, nice: int, peers: list[ShareMember]) -> str:
        """A WEIGHT decision's reason: the nice, and the more urgent active members (``peers``) that set it."""
        above = sorted(m.name for m in peers)
        if nice > 0:
            return f"nice {nice}: below {', '.join(above)} (active, more urgent)"
        if above:  # lowering was refused (no privilege)
            return f"nice 0: lowering refused ({self._said})"
        return "nice 0: no more urgent member active"

    def lowered_seconds(self) -> float:
        with self._lock:
            extra = time.monotonic() - self._lowered_since if self._lowered_since is not None else 0.0
            return self.lowered_s + extra

    def _watch(self) -> None:
        while not self._stop.is_set():
            idle = self.nice == 0 and self.confined is None and time.time() - self._touched >= self.window_s
            self._wake.wait(max(self.poll_s, IDLE_POLL_S) if idle else self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except Exception as e:  # never take the model down: say it and keep looking
                self._log(f"cpu_share: {type(e).__name__}: {e}")

    def close(self) -> None:
        """The model is unloaded: stop watching, put every thread back, leave the folder."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2 * self.poll_s + 1.0)
        with self._lock:
            if self.park is not None:
                self.park.close()
            self.weights.restore()
            if self.confined is not None:
                self._confine(None, time.monotonic())
            if self._lowered_since is not None:
                self.lowered_s += time.monotonic() - self._lowered_since
                self._lowered_since = None
            if self.nice != 0:
                self.log.add(time.monotonic(), WEIGHT, 0, 0, "nice 0: the model is unloaded", 0.0)
            self.nice = 0
        try:
            self.file.unlink()
        except OSError:
            pass
