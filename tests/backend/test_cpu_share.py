"""The CPU share (backend/cpu_share.py) between real processes, each thread's nice read back from /proc: a model
beside a more urgent active one is lowered, every thread of it, and put back when the urgent one goes idle, is
killed with ``kill -9`` or leaves; equal ranks stay equal; a thread started while lowered comes back too; and an
unprivileged process lowers nothing and says so once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from lazybatch.backend.os_weights import Privileges, read_weight, thread_nices, threads
from lazybatch.batcher.cpu_rank import NICE_STEPS

MEMBER = Path(__file__).with_name("cpu_share_member.py")
LOWERED = NICE_STEPS[1]
needs_privilege = pytest.mark.skipif(not Privileges.probe().cap_sys_nice,
                                     reason="needs CAP_SYS_NICE to put a lowered thread back (CI runs as root); the "
                                            "unprivileged path is tested below")


class Member:
    def __init__(self, folder: Path, name: str, sla: str, role: str = "auto", *extra: str) -> None:
        self.p = subprocess.Popen([sys.executable, str(MEMBER), str(folder), name, sla, role, *extra],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.ask(None)["pid"]

    def ask(self, cmd: str | None) -> dict:
        if cmd is not None:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def send(self, cmd: str) -> None:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def nices(self) -> set[int]:
        return thread_nices(self.pid)

    def cores(self) -> set[frozenset[int]]:
        """Each thread's cores, as the kernel reports them (a thread gone meanwhile is left out)."""
        out = set()
        for tid in threads(self.pid):
            try:
                out.add(frozenset(os.sched_getaffinity(tid)))
            except OSError:
                continue
        return out

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


def _until(pred, timeout: float = 5.0) -> float:
    """Seconds until ``pred()`` holds (fails past ``timeout``)."""
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)
    return time.monotonic() - t0


@pytest.fixture
def folder():
    d = Path(tempfile.mkdtemp(prefix="cpu-share-"))  # not under pytest's root-only tmp_path: nobody writes here too
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_privilege
def test_a_model_is_lowered_beside_a_more_urgent_active_one_and_put_back_when_it_goes_idle(folder):
    urgent, other = Member(folder, "small", "10"), Member(folder, "large", "100")
    try:
        time.sleep(0.2)
        assert urgent.nices() == other.nices() == {0}  # both idle since they joined: nobody lowered
        urgent.send("active")
        _until(lambda: other.nices() == {LOWERED})  # every thread of it
        assert urgent.nices() == {0}
        born = other.ask("thread")["tid"]  # started by a lowered thread: born lowered
        assert read_weight(born, other.pid).nice == LOWERED
        urgent.send("idle")
        took = _until(lambda: other.nices() == {0})  # back, the thread born lowered included
        assert took < 2.0
        state = other.ask("state")
        assert state["lowerings"] == 1 and state["changes"] > 0 and state["refused"] == 0 and state["said"] == []
        assert state["lowered_s"] > 0 and state["nice"] == 0
        # each change is a WEIGHT decision in the share's log, saying which model set it
        assert [d for d in state["decisions"] if d[0] == "weight"] == [
            ["weight", float(LOWERED), f"nice {LOWERED}: below small (active, more urgent)"],
            ["weight", 0.0, "nice 0: no more urgent member active"]]
        mine = urgent.ask("state")
        assert mine["changes"] == 0 and mine["decisions"] == []  # the urgent one never touched its threads: the other
        # was never active, so the urgent one kept every core
    finally:
        urgent.stop()
        other.stop()


ALL = frozenset(os.sched_getaffinity(0))
FIRST, REST = frozenset(sorted(ALL)[:max(1, len(ALL) // 2)]), frozenset(sorted(ALL)[max(1, len(ALL) // 2):])
needs_two_cores = pytest.mark.skipif(len(ALL) < 2, reason="a split needs two cores; this process may use one")


@needs_two_cores
def test_the_cores_are_split_while_both_ranks_are_active_and_given_back_after(folder):
    """No privilege needed: a process moves its own threads between the cores it may use, both ways."""
    urgent, other = Member(folder, "small", "10"), Member(folder, "large", "100")
    try:
        urgent.send("active")
        _until(lambda: other.cores() == {REST})  # below an active, more urgent member: the rest, every thread
        born = other.ask("thread")["tid"]
        assert os.sched_getaffinity(born) == REST  # born confined, as its parent
        assert urgent.cores() == {ALL}  # the urgent one keeps every core while nobody below it is active
        other.send("active")
        _until(lambda: urgent.cores() == {FIRST})  # both active: the urgent one takes the first half
        assert other.cores() == {REST}
        urgent.send("idle")
        took = _until(lambda: other.cores() == {ALL})  # no more urgent member active: every core again
        assert took < 2.0  # the window (0.3 s here) and a poll
        assert urgent.cores() == {FIRST}  # idle, it keeps its part while a member below it is active: its next
        other.send("idle")  # request finds its cores free, and it gives them back once nobody below is active
        _until(lambda: urgent.cores() == {ALL})
        state, mine = other.ask("state"), urgent.ask("state")
        assert state["confined"] is None and state["confinements"] == 1 and mine["confinements"] == 1
        assert [d[2] for d in state["decisions"] if d[0] == "cores"] == [
            f"cores {','.join(map(str, sorted(REST)))}: split by rank beside another active member",
            f"cores {','.join(map(str, sorted(ALL)))}: every core"]
    finally:
        urgent.stop()
        other.stop()


@needs_two_cores
def test_a_member_with_split_false_takes_no_part_and_leaves_none(folder):
    urgent, other = Member(folder, "small", "10"), Member(folder, "large", "100", "auto", "nosplit")
    try:
        urgent.send("active")
        other.send("active")
        time.sleep(0.3)
        assert other.cores() == {ALL}  # cpu_share_split false: only the nice
        assert urgent.cores() == {ALL}  # and the urgent one keeps every core: a member below that does not split
        # takes no part of its own
    finally:
        urgent.stop()
        other.stop()


@pytest.fixture
def lowered(folder):
    """(urgent, other): a tight-SLA member with requests and a loose one, every thread of it lowered."""
    urgent, other = Member(folder, "small", "10"), Member(folder, "large", "100")
    try:
        urgent.send("active")
        _until(lambda: other.nices() == {LOWERED})
        yield urgent, other
    finally:
        urgent.stop()
        other.stop()


@needs_privilege
def test_a_killed_urgent_member_lowers_nobody_within_a_poll(lowered):
    urgent, other = lowered
    os.kill(urgent.pid, signal.SIGKILL)
    urgent.p.wait(5)
    took = _until(lambda: other.nices() == {0})
    assert took < 1.0  # its process gone: ignored at the next look (poll 20 ms here), not after the window


@needs_privilege
def test_closing_puts_every_thread_back_and_leaves_the_folder(lowered, folder):
    _, other = lowered
    assert other.ask("close") == {"closed": True, "file": False}
    assert other.nices() == {0}
    assert len(list(folder.glob("*.json"))) == 1  # the urgent one's file only


def test_equal_ranks_stay_equal(folder):
    a, b = Member(folder, "a", "50"), Member(folder, "b", "50")
    try:
        a.send("active")
        b.send("active")
        time.sleep(0.5)
        assert a.nices() == b.nices() == {0}
        assert a.cores() == b.cores() == {ALL} and a.ask("state")["confinements"] == 0  # no cores split either
        assert a.ask("state")["changes"] == b.ask("state")["changes"] == 0
    finally:
        a.stop()
        b.stop()


def test_unprivileged_nothing_is_lowered_and_it_says_so_once(folder):
    """RLIMIT_NICE 0 and not root (dropped to nobody where the test runs as root): a lowered thread could never be
    put back, so none is lowered; the log line names what to grant."""
    urgent, other = Member(folder, "small", "10"), Member(folder, "large", "100", "auto", "nobody")
    try:
        urgent.send("active")
        _until(lambda: other.ask("state")["refused"] > 0)
        time.sleep(0.2)
        assert other.nices() == {0}
        state = other.ask("state")
        assert state["nice"] == 0 and state["lowerings"] == 0 and state["changes"] == 0
        assert len(state["said"]) == 1 and "SYS_NICE" in state["said"][0] and "ulimits: nice" in state["said"][0]
    finally:
        urgent.stop()
        other.stop()


def test_a_bad_cpu_share_fails_the_load_saying_the_choices(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError

    from test_backend import CONFIG

    def settings(value: str | None):
        extra = "" if value is None else f'parameters {{ key: "cpu_share" value {{ string_value: "{value}" }} }}\n'
        return BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)

    assert settings(None).cpu_share == "auto"  # on by default: a model alone is never lowered
    assert settings("none").cpu_share == "none"  # opted out
    assert settings("Best_Effort").cpu_share == "best_effort"
    with pytest.raises(ConfigError, match="cpu_share must be none, latency_critical, auto, best_effort, got 'urgent'"):
        settings("urgent")


def test_cpu_share_nice_sets_the_step_under_one_more_urgent_model(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.cpu_rank import ShareMember, nice_for, nice_steps
    from lazybatch.batcher.errors import ConfigError

    from test_backend import CONFIG

    def settings(value: str | None):
        extra = "" if value is None else f'parameters {{ key: "cpu_share_nice" value {{ string_value: "{value}" }} }}\n'
        return BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)

    assert settings(None).cpu_share_nice == NICE_STEPS[1] and settings(" 5 ").cpu_share_nice == 5
    for bad in ("0", "20", "five", "-3"):
        with pytest.raises(ConfigError, match="cpu_share_nice must be an integer 1..19"):
            settings(bad)
    me, one, two = ShareMember("large", 100.0), ShareMember("small", 10.0), ShareMember("tiny", 5.0)
    assert [nice_for(me, peers, nice_steps(5)) for peers in ([], [one], [one, two])] == [0, 5, 19]
    assert nice_for(me, [one, two], nice_steps(19)) == 19 and nice_steps() == NICE_STEPS


def test_a_cpu_share_member_keeps_the_process_pool_unless_told(tmp_path):
    """The process pool keeps a split model's workers warm from stage to stage; a member parks it while idle
    instead of taking pools per session (docs/colocation.md, "Parked pools"). The parameter still wins."""
    from lazybatch.backend.arbiter.sizing import per_session_threads
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text

    from test_backend import CONFIG

    def settings(**params: str):
        extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
        return BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)

    assert settings().cpu_share_park and not settings(cpu_share_park="false").cpu_share_park
    assert not per_session_threads(settings(), "CPU", "cpu")
    assert not per_session_threads(settings(cpu_share="best_effort"), "KIND_CPU", "cpu")
    assert per_session_threads(settings(cpu_share="auto", use_per_session_threads="true"), "CPU", "cpu")
    assert not per_session_threads(settings(use_per_session_threads="false"), "CPU", "cpu")
