"""A member of a CPU share in a process of its own, driven by lines on stdin (tests/backend/test_cpu_share.py).

    python cpu_share_member.py FOLDER NAME SLA_MS ROLE [nobody | nosplit]

Lines: ``active`` (a request now, and every 50 ms after), ``idle`` (no more), ``thread`` (start a thread; prints its
id), ``state`` (prints the share's nice, lowerings and counts), ``close`` (the model is unloaded).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time


def main() -> None:
    folder, name, sla, role = sys.argv[1:5]
    from lazybatch.backend.cpu_share import CpuShare  # before a drop to nobody, who may not read this venv
    from lazybatch.batcher.cpu_rank import ShareMember

    if sys.argv[5:] == ["nobody"]:  # an unprivileged server: RLIMIT_NICE 0, and not root
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

    said: list[str] = []
    share = CpuShare(ShareMember(name, float(sla) if sla != "-" else None, role, sys.argv[5:] != ["nosplit"]),
                     folder=folder, poll_s=0.02, window_s=0.3, log=said.append)
    stop = threading.Event()
    active = threading.Event()
    for _ in range(3):  # a pool's idle workers
        threading.Thread(target=stop.wait, daemon=True).start()

    def requests() -> None:
        while not stop.is_set():
            if active.is_set():
                share.note_active()
            time.sleep(0.05)

    threading.Thread(target=requests, daemon=True).start()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "active":
            active.set()
        elif cmd == "idle":
            active.clear()
        elif cmd == "thread":
            got: list[int] = []
            ready = threading.Event()

            def run() -> None:
                got.append(threading.get_native_id())
                ready.set()
                stop.wait()

            threading.Thread(target=run, daemon=True).start()
            ready.wait(5)
            print(json.dumps({"tid": got[0]}), flush=True)
        elif cmd == "state":
            print(json.dumps({"nice": share.nice, "lowerings": share.lowerings, "changes": share.weights.changes,
                              "refused": share.weights.refused, "said": said,
                              "lowered_s": share.lowered_seconds(), "confined": share.confined,
                              "confinements": share.confinements,
                              "decisions": [[d.kind, d.value, d.reason] for d in share.log]}), flush=True)
        elif cmd == "close":
            share.close()
            print(json.dumps({"closed": True, "file": share.file.exists()}), flush=True)
    stop.set()


if __name__ == "__main__":
    main()
