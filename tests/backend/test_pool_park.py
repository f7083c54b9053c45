"""Parked pools (backend/pool_park.py) on real threads, each thread's scheduling class read back from /proc: parked
in SCHED_IDLE and back to the normal class at the nice it kept; never parked where it could not come back; a thread
that ended is forgotten; the workers are the native threads onnxruntime starts with a process pool; a pool parks
only while another member of the CPU share is active, and an idle pool follows that activity."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lazybatch.backend.os_weights import IDLE, NORMAL, Privileges, Weight, read_weight
from lazybatch.backend.pool_park import PoolPark

needs_privilege = pytest.mark.skipif(not Privileges.probe().cap_sys_nice,
                                     reason="needs CAP_SYS_NICE to leave SCHED_IDLE (CI runs as root)")


def _threads(n: int) -> tuple[list[int], threading.Event]:
    stop = threading.Event()
    tids: list[int] = []
    ready = threading.Barrier(n + 1)

    def run() -> None:
        tids.append(threading.get_native_id())
        ready.wait()
        stop.wait()

    for _ in range(n):
        threading.Thread(target=run, daemon=True).start()
    ready.wait()
    return tids, stop


@needs_privilege
def test_park_and_unpark_move_the_workers_and_keep_their_nice():
    tids, stop = _threads(2)
    try:
        os.setpriority(os.PRIO_PROCESS, tids[0], 10)  # lowered by the share meanwhile: parking keeps it
        park = PoolPark(tids)
        assert park.allowed
        park.set_neighbours_active(True)  # beside an active member of the share: the only time a pool parks
        park.park()
        assert [read_weight(t).policy for t in tids] == [IDLE, IDLE]
        park.park()  # already parked: no syscall
        assert park.syscalls == 2 and park.parks == 1
        park.unpark()
        assert [read_weight(t) for t in tids] == [Weight(NORMAL, 10), Weight(NORMAL, 0)]
        park.park()
        park.close()  # unloaded: back, and never parked again
        assert [read_weight(t).policy for t in tids] == [NORMAL, NORMAL]
        park.park()
        assert read_weight(tids[1]).policy == NORMAL and park.parks == 2
    finally:
        stop.set()


@needs_privilege
def test_workers_beyond_the_cores_the_share_leaves_stay_parked_while_the_model_runs():
    """A pool of three (two workers and the caller) confined to one core: two surplus workers; to two: one."""
    tids, stop = _threads(2)
    try:
        park = PoolPark(tids)
        park.set_cores(1)
        assert [read_weight(t).policy for t in tids] == [IDLE, IDLE] and park.surplus == tids
        park.set_cores(2)
        assert [read_weight(t).policy for t in tids] == [IDLE, NORMAL]
        park.set_neighbours_active(True)
        park.park()  # idle beside a neighbour: every worker parked, the surplus already was (no syscall for it)
        assert [read_weight(t).policy for t in tids] == [IDLE, IDLE] and park.syscalls == 4
        park.unpark()  # running again: the surplus stays parked
        assert [read_weight(t).policy for t in tids] == [IDLE, NORMAL]
        park.set_cores(None)  # every core again: every worker back
        assert [read_weight(t).policy for t in tids] == [NORMAL, NORMAL] and park.surplus == []
        park.set_cores(1)
        park.close()  # unloaded while confined: no worker stays parked
        assert [read_weight(t).policy for t in tids] == [NORMAL, NORMAL]
        park.set_cores(1)  # closed: never parked again
        assert [read_weight(t).policy for t in tids] == [NORMAL, NORMAL]
        unprivileged = PoolPark(tids, privileges=Privileges(cap_sys_nice=False, rlimit_nice=0))
        unprivileged.set_cores(1)  # it could not put them back: it parks none
        assert [read_weight(t).policy for t in tids] == [NORMAL, NORMAL] and unprivileged.surplus == []
    finally:
        stop.set()


def test_without_the_privilege_nothing_is_parked():
    tids, stop = _threads(1)
    try:
        park = PoolPark(tids, privileges=Privileges(cap_sys_nice=False, rlimit_nice=0))
        assert not park.allowed
        park.set_neighbours_active(True)
        park.park()
        assert read_weight(tids[0]).policy == NORMAL and park.syscalls == 0
        assert not PoolPark([]).allowed  # no workers (a pool of one thread): nothing to park
    finally:
        stop.set()


@needs_privilege
def test_a_worker_that_ended_is_forgotten():
    tids, stop = _threads(2)
    park = PoolPark(tids)
    park.set_neighbours_active(True)
    stop.set()
    deadline = time.monotonic() + 10  # Python lets go of a thread a moment before the kernel does
    while any(os.path.exists(f"/proc/self/task/{t}") for t in tids) and time.monotonic() < deadline:
        time.sleep(0.01)
    park.park()
    park.unpark()
    assert park.workers == [] and park.allowed


def test_the_workers_are_the_native_threads_a_process_pool_starts():
    """In a process of its own: the threads onnxruntime starts with its process pool, none of Python's."""
    code = textwrap.dedent("""
        import os, threading
        from lazybatch.backend.os_weights import threads
        from lazybatch.backend.pool_park import new_native_threads
        from lazybatch.sessions.threads import use_global_thread_pool, session_options
        before = threads()
        use_global_thread_pool(2)
        import onnx, onnxruntime as ort
        from onnx import helper, TensorProto
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        s = ort.InferenceSession(m.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
        stop = threading.Event()
        py = threading.Thread(target=stop.wait)  # a Python thread started meanwhile: not a worker
        py.start()
        workers = new_native_threads(before, threads())
        stop.set()
        print(len(workers), py.native_id in workers, threading.get_native_id() in workers)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    n, python_thread, main = out.stdout.split()
    assert int(n) >= 1 and python_thread == "False" and main == "False"


@needs_privilege
def test_a_pool_parks_only_while_a_neighbour_is_active(tmp_path):
    """Parking costs the model itself (backend/pool_park.py): a share member alone, or beside idle members, never
    parks; beside an active member it does, and stops again once that member has been idle for the window."""
    from lazybatch.backend.cpu_share import CpuShare
    from lazybatch.batcher.cpu_rank import ShareMember

    tids, stop = _threads(1)
    park = PoolPark(tids)
    share = CpuShare(ShareMember("small", 10.0, "auto"), folder=tmp_path, park=park, poll_s=60.0,
                     log=lambda text: None)
    try:
        share.step()
        park.park()
        assert not park.neighbours_active and not park.parked and park.syscalls == 0  # alone: nothing to buy
        other = tmp_path / f"{os.getppid()}.json"  # a live process other than this one: a second member
        other.write_text('{"pid": %d, "name": "large", "sla_ms": 5000, "role": "auto"}' % os.getppid())
        os.utime(other, (0, 0))  # idle since long ago
        share.step()
        park.park()
        assert not park.neighbours_active and not park.parked  # beside an idle member: still nothing
        now = time.time()
        os.utime(other, (now, now))  # it has a request
        share.step()
        assert park.neighbours_active
        park.park()
        assert park.parked and read_weight(tids[0]).policy == IDLE  # a less urgent neighbour counts as well
        park.unpark()
        os.utime(other, (0, 0))
        share.step()
        park.park()
        assert not park.neighbours_active and not park.parked
    finally:
        share.close()
        stop.set()


@needs_privilege
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a split needs two cores; this process may use one")
def test_a_confined_member_keeps_its_surplus_workers_parked_while_it_runs(tmp_path):
    """Beside a more urgent active member the share confines this process to the rest of the cores (one of two) and
    its pool of two (one worker and the caller) keeps its worker parked; once that member is idle, back."""
    from lazybatch.backend.cpu_share import CpuShare
    from lazybatch.batcher.cpu_rank import ShareMember

    tids, stop = _threads(1)
    park = PoolPark(tids)
    share = CpuShare(ShareMember("large", 100.0, "auto"), folder=tmp_path, park=park, poll_s=60.0,
                     log=lambda text: None)
    try:
        urgent = tmp_path / f"{os.getppid()}.json"
        urgent.write_text('{"pid": %d, "name": "small", "sla_ms": 10, "role": "auto", "split": true}' % os.getppid())
        now = time.time()
        os.utime(urgent, (now, now))
        share.step()
        assert share.confined is not None and len(share.confined) < len(share.cores)
        assert park.surplus == tids and read_weight(tids[0]).policy == IDLE  # running, all the same parked
        assert os.sched_getaffinity(tids[0]) == set(share.confined)
        os.utime(urgent, (0, 0))
        share.step()
        assert share.confined is None and park.surplus == [] and read_weight(tids[0]).policy == NORMAL
        assert os.sched_getaffinity(tids[0]) == set(share.cores)
    finally:
        share.close()
        stop.set()


@needs_privilege
def test_an_idle_pool_follows_its_neighbours_activity():
    """A model that went idle before its neighbour became active parks once the watcher sees the neighbour (it
    does not wait for a next busy period), and is back once no neighbour is; a model that is running is never
    parked by the watcher."""
    tids, stop = _threads(1)
    park = PoolPark(tids)
    try:
        park.park()  # its work ended while alone
        assert not park.parked
        park.set_neighbours_active(True)
        assert park.parked and read_weight(tids[0]).policy == IDLE and park.parks == 1
        park.set_neighbours_active(False)
        assert not park.parked and read_weight(tids[0]).policy == NORMAL
        park.unpark()  # about to run: the watcher leaves a running model alone
        park.set_neighbours_active(True)
        assert not park.parked and read_weight(tids[0]).policy == NORMAL
        park.park()
        assert park.parked and park.parks == 2
    finally:
        park.close()
        stop.set()
