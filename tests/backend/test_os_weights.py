"""The OS lever of co-location (backend/os_weights.py) on real threads, read back from /proc: a thread lowered (nice,
SCHED_IDLE) and put back as root; as an unprivileged user (a forked child that drops to nobody, RLIMIT_NICE 0),
a change that could not be undone is refused with one explanation, never raised, and a harmless one is made."""

from __future__ import annotations

import os
import resource
import threading

import pytest

from lazybatch.backend.os_weights import IDLE, NORMAL, Privileges, ThreadWeights, Weight, read_weight, threads


def _sleeper() -> tuple[int, threading.Event]:
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(30)

    threading.Thread(target=run, daemon=True).start()
    ready.wait(5)
    return tid[0], stop


def test_proc_reads_what_the_kernel_reports():
    me = threading.get_native_id()
    assert me in threads()
    assert read_weight(me) == Weight(NORMAL, os.getpriority(os.PRIO_PROCESS, me))


@pytest.mark.skipif(not Privileges.probe().cap_sys_nice,
                    reason="needs CAP_SYS_NICE to raise a thread back (CI runs as root); the unprivileged path is tested "
                           "below")
def test_a_thread_is_lowered_and_put_back_with_the_privilege():
    tid, stop = _sleeper()
    try:
        w = ThreadWeights()
        assert w.set([tid], Weight(NORMAL, 19)) == 1 and read_weight(tid) == Weight(NORMAL, 19)
        assert w.set([tid], Weight(IDLE, 19)) == 1 and read_weight(tid).policy == IDLE
        assert read_weight(threading.get_native_id()) == Weight(NORMAL, 0)  # the others untouched
        assert w.restore() == [] and read_weight(tid) == Weight(NORMAL, 0)
        assert w.original == {} and w.refused == 0 and w.changes >= 3
    finally:
        stop.set()


def test_an_ended_thread_is_forgotten_not_a_failure():
    tid, stop = _sleeper()
    w = ThreadWeights(Privileges(cap_sys_nice=True, rlimit_nice=0))
    assert w.set([tid], Weight(NORMAL, 5)) == 1
    stop.set()
    for t in threading.enumerate():
        if t.native_id == tid:
            t.join(5)
    assert w.restore() == [] and w.original == {}


def test_the_rules_of_an_unprivileged_process():
    p = Privileges(cap_sys_nice=False, rlimit_nice=0)
    assert p.can_restore(Weight(NORMAL, 5), Weight(NORMAL, 5))
    assert not p.can_restore(Weight(NORMAL, 0), Weight(NORMAL, 19))  # nice 19 -> 0 needs the privilege
    assert not p.can_restore(Weight(NORMAL, 0), Weight(IDLE, 0))  # leaving SCHED_IDLE too
    raised = Privileges(cap_sys_nice=False, rlimit_nice=20)  # ulimits: nice 20: back down to nice 0
    assert raised.can_restore(Weight(NORMAL, 0), Weight(NORMAL, 19)) and raised.can_restore(Weight(NORMAL, 0),
                                                                                              Weight(IDLE, 0))
    assert not raised.can_restore(Weight(NORMAL, -5), Weight(NORMAL, 10))
    assert "SYS_NICE" in p.explain() and "ulimits: nice" in p.explain()


def test_unprivileged_it_refuses_what_it_could_not_undo_and_never_raises():
    """A forked child with RLIMIT_NICE 0 (as a default container), dropped to nobody where it starts as root (as CI
    does; another user is unprivileged already), asks for nice 19 (refused: it could never come back), SCHED_IDLE
    (refused) and nice 0 (already so: made, as nothing). It reports through a pipe; the parent checks it."""
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest from here on
        code = 1
        try:
            os.close(r)
            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            tid, stop = _sleeper()
            w = ThreadWeights()
            out = [w.privileges.cap_sys_nice, w.set([tid], Weight(NORMAL, 19)), w.set([tid], Weight(IDLE, 0)),
                   read_weight(tid) == Weight(NORMAL, 0), w.refused, w.said is not None,
                   w.set([tid], Weight(NORMAL, 0)), w.restore()]
            os.write(wfd, repr(out).encode())
            stop.set()
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    text = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    cap, lowered, idled, untouched, refused, said, same, stuck = eval(text)
    assert (cap, lowered, idled, untouched, refused, said, same, stuck) == (False, 0, 0, True, 2, True, 1, [])
