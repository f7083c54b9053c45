"""The stub's connection to its device group's arbiter: found, or started first where none answers (one stub of
those that load at once starts it, under a lock file), and the join's J/W handshake. Used at a member's join
(``join.py``, ``client.attach``) and at each rejoin after the arbiter died (``reconnect.py``).
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import protocol as P

CONNECT_TIMEOUT_S = 20.0  # the first stub starts the arbiter and waits this long for its socket
# the join waits this long for the arbiter's W (leased or not), then the gate schedules alone
JOIN_TIMEOUT_S = 5.0


def _python() -> str:
    """The interpreter to start the arbiter with: inside Triton's stub, ``sys.executable`` may be the stub."""
    exe = sys.executable or ""
    if "python" in Path(exe).name:
        return exe
    return shutil.which("python3") or shutil.which("python") or "python3"


def try_connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return s
    except OSError:
        s.close()
        return None


def connect(path: Path, lock: Path, *, lanes: int = 1, timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A socket to the group's arbiter, starting it first when none answers. The lock file makes sure that of the
    stubs that load at once, one starts it and the others connect to it."""
    s = try_connect(path)
    if s is not None:
        return s
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            s = try_connect(path)
            if s is not None:
                return s
            # its own session: unloading the model whose stub started it must not take it down
            proc = subprocess.Popen([_python(), "-m", "lazybatch.backend.arbiter.server", str(path), str(lanes)],
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                s = try_connect(path)
                if s is not None:
                    return s
                if proc.poll() is not None:
                    raise RuntimeError(f"the device group's arbiter exited with {proc.returncode} at start")
                time.sleep(0.01)
            raise RuntimeError(f"the device group's arbiter did not open {path} within {timeout:g} s")
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def handshake(sock: socket.socket, msg: bytes, timeout: float = JOIN_TIMEOUT_S) -> tuple[int, float] | None:
    """Send the join ``msg`` and read the arbiter's W: (leased, sibling's last active instant), or None when the
    connection closed or no W came within ``timeout`` (an arbiter that died, or one that is dying: a retry after
    its death may still reach its listener)."""
    got = b""
    size = P.REPLY_SIZES[P.WELCOME]
    try:
        sock.sendall(msg)
        sock.settimeout(timeout)
        while len(got) < size:
            data = sock.recv(size - len(got))
            if not data:
                break
            got += data
        sock.settimeout(None)
    except OSError:
        return None
    if len(got) < size or got[:1] != P.WELCOME:
        return None
    leased, sibling = P.ANSWER_BODY.unpack_from(got, 1)
    return leased, sibling
