"""The CPU share on a real tritonserver run as an unprivileged user (docs/colocation.md, "Privileges"): uid nobody,
without CAP_SYS_NICE. With RLIMIT_NICE 0 (a user's default) nothing is lowered, since a lowered thread could never
be put back: the stub says so once in the server's log, counts the refusals in ``lazybatch_cpu_share_refused_total``
and serves every request. Granted CAP_SYS_NICE alone (as an ambient capability: ``AmbientCapabilities=CAP_SYS_NICE``
in a systemd unit, ``setpriv --ambient-caps``), the same user lowers the loose model beside the tight one and puts it
back. Every thread's nice is read from /proc. The other grant, an RLIMIT_NICE of 20, is tested between processes
(tests/backend/test_cpu_share.py): raising a hard limit needs CAP_SYS_RESOURCE, which this machine's root lacks.

The server is started as root and drops to nobody with ``setpriv`` before tritonserver runs. Its interpreter lives
under /root, which nobody cannot enter, so nobody keeps one capability, CAP_DAC_READ_SEARCH (read any file): it
does not let a process raise a thread's weight, so the path under test is the unprivileged one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import onnx
import pytest

from lazybatch.backend.cpu_share import ACTIVE_WINDOW_S, POLL_S
from lazybatch.backend.os_weights import CAP_SYS_NICE, thread_nices
from lazybatch.batcher.cpu_rank import NICE_STEPS
from lazybatch.client.soak import scrape
from lazybatch.formats.prometheus import parse_samples
from lazybatch.repo import add_model
from lazybatch.serving import TritonServer, free_port
from lazybatch.staging import make_mlp, split_model

from test_arbiter_faults import Sender, _until  # noqa: E402  (numbered requests, each answer counted)
from triton_models import stub_pid

NOBODY = 65534
MODELS = {"co_small": (32, 4, 1, 100), "co_large": (512, 8, 2, 5000)}  # width, depth, seed, sla_ms
LOWERED = NICE_STEPS[1]
BACK_BOUND_S = ACTIVE_WINDOW_S + 20 * POLL_S + 3.0
REFUSED = "threads are not lowered beside more urgent models"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="starts tritonserver as nobody: needs root and util-linux's setpriv (CI runs as root)")


@pytest.fixture(scope="module")
def repo_root():
    root = Path(tempfile.mkdtemp(prefix="cpu-share-nobody-"))  # not pytest's root-only tmp_path: nobody reads it
    repo = root / "repo"
    graphs = {}
    for name, (width, depth, seed, sla) in MODELS.items():
        model = make_mlp(root / f"{name}.onnx", in_dim=32, width=width, depth=depth, out_dim=10, seed=seed)
        relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
        stages = split_model(model, root / f"{name}_stages", cut_after=relus)
        add_model(model, repo, name=name, policy="eager", sla_ms=sla, max_batch_size=8, stages=stages,
                  profile_reps=1, execution_provider="cpu", parameters={"cpu_share": "auto"})
        graphs[name] = model
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    try:
        yield root, repo, graphs
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def served_as_nobody(root: Path, repo: Path, sys_nice: bool, tag: str):
    caps = "+dac_read_search" + (",+sys_nice" if sys_nice else "")
    launcher = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                f"--inh-caps=-all,{caps}", f"--ambient-caps={caps}", "--no-new-privs"]
    log = root / f"tritonserver_{tag}.log"
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=log, launcher=launcher)
    server.start(timeout=240)
    try:
        for name in MODELS:  # the stubs really are nobody's, CAP_SYS_NICE as asked, RLIMIT_NICE 0
            status = Path(f"/proc/{stub_pid(repo, name)}/status").read_text().splitlines()
            uid = next(line for line in status if line.startswith("Uid:")).split()[1:]
            cap = int(next(line for line in status if line.startswith("CapEff:")).split()[1], 16)
            assert uid == [str(NOBODY)] * 4 and bool(cap >> CAP_SYS_NICE & 1) == sys_nice, (uid, hex(cap))
            limits = Path(f"/proc/{stub_pid(repo, name)}/limits").read_text()
            nice_line = next(line for line in limits.splitlines() if line.startswith("Max nice priority"))
            assert nice_line.split()[3] == "0", nice_line
        yield server, log
    finally:
        server.stop()


def _metric(server, name: str) -> dict[str, float]:
    return {lab["model"]: v for lab, v in parse_samples(scrape(server.endpoints.metrics), name)}


def test_without_a_raised_nice_limit_nothing_is_lowered_it_says_so_once_and_every_request_is_answered(repo_root):
    root, repo, graphs = repo_root
    with served_as_nobody(root, repo, False, "unprivileged") as (server, log):
        large = Sender(server, "co_large", graphs["co_large"], 1).start()
        small = Sender(server, "co_small", graphs["co_small"], 2).start()
        try:
            _until(lambda: _metric(server, "lazybatch_cpu_share_refused_total").get("co_large", 0) > 0, 30,
                   "co_large's lowering refused beside the active co_small")
            pid = stub_pid(repo, "co_large")
            end = time.monotonic() + 2 * ACTIVE_WINDOW_S
            while time.monotonic() < end:  # never lowered, while the tight model keeps it wanting to be
                assert thread_nices(pid) == {0}
                time.sleep(POLL_S / 2)
            _until(lambda: small.ok() >= 30 and large.ok() >= 30, 60, "both models serve")
        finally:
            small.stop()
            large.stop()
        assert _metric(server, "lazybatch_cpu_share_nice") == {"co_small": 0.0, "co_large": 0.0}
        assert _metric(server, "lazybatch_cpu_share_weight_changes_total").get("co_large") == 0
        said = [line for line in log.read_text(errors="replace").splitlines() if REFUSED in line]
    assert len(said) == 1 and "co_large" in said[0], said  # once, by the model that would have been lowered
    assert "SYS_NICE" in said[0] and "ulimits: nice" in said[0]
    for s in (small, large):
        ok, errors = s.check()
        assert ok >= 30 and not errors


def test_granted_sys_nice_the_same_user_lowers_and_puts_back(repo_root):
    root, repo, graphs = repo_root
    with served_as_nobody(root, repo, True, "sys_nice") as (server, log):
        large = Sender(server, "co_large", graphs["co_large"], 3).start()
        try:
            small = Sender(server, "co_small", graphs["co_small"], 4).start()
            try:
                _until(lambda: thread_nices(stub_pid(repo, "co_large")) == {LOWERED}, 30,
                       "co_large lowered beside the active co_small")
                assert thread_nices(stub_pid(repo, "co_small")) == {0}
                # enough answers to judge by below (lowered within a few requests, it had sent 7 once)
                _until(lambda: small.ok() >= 10 and large.ok() >= 10, 60, "both models serve")
            finally:
                small.stop()
            _until(lambda: thread_nices(stub_pid(repo, "co_large")) == {0}, BACK_BOUND_S,
                   "co_large back once co_small is idle")
        finally:
            large.stop()
        assert sum(_metric(server, "lazybatch_cpu_share_refused_total").values()) == 0
        assert _metric(server, "lazybatch_cpu_share_weight_changes_total")["co_large"] >= 2
        assert REFUSED not in log.read_text(errors="replace")
    for s in (small, large):
        ok, errors = s.check()
        assert ok >= 10 and not errors
