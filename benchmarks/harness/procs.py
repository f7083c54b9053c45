"""A served run's processes, read from /proc: tritonserver's Python backend stubs by model, and a process's CPU time
(what the probes that weigh the backend's own cost count)."""

from __future__ import annotations

from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (clock ticks)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
