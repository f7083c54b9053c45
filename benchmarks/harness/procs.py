"""A served run's processes, read from /proc: tritonserver's Python backend stubs by model, the cores a process may
run on, and its threads' nice values (set by hand for a reference line, and watched to show what each configuration
ran at)."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator


def cores(pid: int) -> str | None:
    """The CPUs a process may run on (``Cpus_allowed_list`` from /proc, e.g. "0-1"); None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def processes(server_pid: int) -> dict[str, int]:
    """tritonserver and its Python backend stubs (one per model instance), by model name."""
    out = {"tritonserver": server_pid}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and cmd and cmd[0].endswith(b"triton_python_backend_stub") and len(cmd) > 1:
            out[Path(cmd[1].decode()).parent.parent.name] = int(d.name)  # MODEL/1/model.py
    return out


@contextmanager
def _every(look: Callable[[], None], every_s: float, name: str) -> Iterator[None]:
    """``look`` now, every ``every_s`` in a thread of its own while the block runs, and once more at its end."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            look()

    look()
    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        look()


@contextmanager
def niced(pids: Iterable[int], nice: int, *, every_s: float = 0.2) -> Iterator[None]:
    """Every thread of these processes at ``nice`` for the block (threads started meanwhile too, looked for every
    ``every_s``), then each back at the nice it had: a static weight set by hand from outside the server, as an
    operator would with ``renice``. Raising a thread back needs CAP_SYS_NICE (a root benchmark has it)."""
    from lazybatch.backend.os_weights import read_weight, threads

    pids = list(pids)
    before: dict[int, int] = {}  # thread -> the nice it had

    def lower() -> None:
        for pid in pids:
            try:
                tids = threads(pid)
            except OSError:  # the process ended
                continue
            for tid in tids:
                try:
                    before.setdefault(tid, read_weight(tid, pid).nice)
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                except OSError:  # the thread ended
                    pass

    try:
        with _every(lower, every_s, "niced"):
            yield
    finally:
        for tid, was in before.items():
            try:
                os.setpriority(os.PRIO_PROCESS, tid, was)
            except OSError:
                pass


@contextmanager
def watched_nices(pids: dict[str, int], *, every_s: float = 0.05) -> Iterator[dict[str, set[int]]]:
    """The nice values every thread of these processes (name -> pid) took during the block, read from /proc every
    ``every_s``: what shows that a configuration ran unweighted, or at the weight it was given."""
    from lazybatch.backend.os_weights import thread_nices

    seen: dict[str, set[int]] = {name: set() for name in pids}

    def look() -> None:
        for name, pid in pids.items():
            try:
                seen[name] |= thread_nices(pid)
            except OSError:  # the process ended
                pass

    with _every(look, every_s, "watched-nices"):
        yield seen
