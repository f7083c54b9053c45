"""Where the default's served gap to Triton's batcher on a fast model sits (docs/results/default.md: tiny, eager
0.87-0.90x of Triton 0 ms in every settled cell at 109d33e).

    python -m benchmarks.probes.probe_served_gap                        # tiny at 90%, 12 rounds of 2 s turns
    python -m benchmarks.probes.probe_served_gap --out docs/data/probe_served_gap.txt
    python -m benchmarks.probes.probe_served_gap --variant noshare:cpu_share=none --variant nometrics:metrics=false

One tritonserver serves the guard's repository of the model (eager and Triton 0 ms, from
``build_default_repository``); the two take turns in 2 s segments of `lazybatch load` (Poisson), and a segment the
hypervisor stole from (benchmarks/harness/method.py) is left out. Per model it prints, per request: the client's
average; Triton's own split of the server side (its statistics extension: queue, compute input, compute infer,
which is the Python stub's ``execute`` as Triton sees it, and compute output); and the CPU the model's stub process
used, its main thread (where ``execute`` runs) apart from the others (the scheduler, metrics, CPU-share and
responder threads), and how the main thread waited: runnable without a core (schedstat), blocked (voluntary context
switches: a lock, the interpreter, the IPC with Triton) or preempted. ``--variant name:key=value[,key=value]`` adds a copy of the default with those config.pbtxt
parameters (``<model>_eager_<name>``), to see what a part of it costs; such copies share the server's CPU share
with the default, so each counts the other as an active neighbour in the first second of its turn (its pool parked
between passes, backend/pool_park.py): compare copies with ``cpu_share=none`` to each other, not to the default. A probe, not a results page: it prints and
writes what it printed to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from benchmarks.harness import start_server, static_t1
from benchmarks.harness.method import cpu_times, steal_between, stolen
from lazybatch.client.load import run_load
from lazybatch.shipped import build_default_repository

TICK = os.sysconf("SC_CLK_TCK")
POLICIES = {"triton_0us": "triton:0", "eager": "eager"}
SPLIT = ("queue", "compute_input", "compute_infer", "compute_output")


def stub_pid(model: str) -> int | None:
    """The Python backend stub process serving ``model`` (its command line names the model's model.py)."""
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(f"/{model}/1/model.py".encode()) for a in cmd):
                return int(p)
    return None


def thread_ticks(pid: int) -> dict[int, int]:
    """CPU ticks (user + system) so far of each thread of ``pid``."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            st = Path(f"/proc/{pid}/task/{t}/stat").read_text()
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        out[int(t)] = int(f[11]) + int(f[12])
    return out


def main_thread_waits(pid: int) -> tuple[int, int, int]:
    """The stub's main thread so far: nanoseconds runnable but waiting for a core (schedstat), and its voluntary
    (it blocked: a lock, the interpreter, a condition) and involuntary (preempted) context switches."""
    wait_ns = int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1])
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return wait_ns, int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])


def server_split(client, model: str) -> dict[str, tuple[int, int]]:
    s = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    return {k: (int(v.get("count", 0)), int(v.get("ns", 0))) for k, v in s.items()}


def variants(specs: list[str]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """POLICIES plus, per ``name:key=value[,key=value]``, an eager copy ``eager_<name>`` with those parameters."""
    policies = dict(POLICIES)
    parameters: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, pairs = spec.partition(":")
        if not name or not pairs or any("=" not in kv for kv in pairs.split(",")):
            raise SystemExit(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE]")
        policies[f"eager_{name}"] = "eager"
        parameters[f"eager_{name}"] = dict(kv.split("=", 1) for kv in pairs.split(","))
    return policies, parameters


def main(argv: list[str] | None = None) -> int:
    import tritonclient.grpc as grpcclient

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--load", type=float, default=0.9, help="fraction of the batch-1 rate")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--segment", type=float, default=2.0)
    ap.add_argument("--work", default="lazybatch-results/probe_served_gap")
    ap.add_argument("--out", default=None)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="a copy of the default with these config.pbtxt parameters (repeatable)")
    args = ap.parse_args(argv)
    work = Path(args.work)
    policies, parameters = variants(args.variant)
    # the models asked for and no others: an earlier run's variants, loaded beside them, would be CPU-share members
    # active within the window of each turn (backend/cpu_share.py); the split and profile in ``build`` are kept
    shutil.rmtree(work / "repo", ignore_errors=True)
    repo = build_default_repository(work / "repo", kind=args.model, work=work / "build", policies=policies,
                                    parameters=parameters, profile_reps=5, replace=True)
    server = start_server(repo, work / "tritonserver.log")
    lines: list[str] = []
    try:
        url = server.endpoints.grpc
        t1 = static_t1(url, args.model)
        client = grpcclient.InferenceServerClient(url)
        models = [f"{args.model}_{p}" for p in policies]
        pids = {m: stub_pid(m) for m in models}
        acc = {m: {"ok": 0, "lat": 0.0, "req": 0, "main": 0, "other": 0, "runq": 0, "vol": 0, "invol": 0,
                   **{k: 0 for k in SPLIT}} for m in models}
        left_out = 0
        for r in range(args.rounds):
            for m in models if r % 2 == 0 else models[::-1]:
                b_split, b_ticks, b_cpu = server_split(client, m), thread_ticks(pids[m]), cpu_times()
                b_waits = main_thread_waits(pids[m])
                res = run_load(url, m, args.load / t1, args.segment, seed=r)
                a_split, a_ticks = server_split(client, m), thread_ticks(pids[m])
                a_waits = main_thread_waits(pids[m])
                if stolen(steal_between(b_cpu, cpu_times())):
                    left_out += 1
                    continue
                a = acc[m]
                a["ok"] += res.ok
                a["lat"] += sum(res.latencies_ms)
                a["req"] += a_split["success"][0] - b_split["success"][0]
                for k in SPLIT:
                    a[k] += a_split[k][1] - b_split[k][1]
                for k, before, after in zip(("runq", "vol", "invol"), b_waits, a_waits):
                    a[k] += after - before
                for t, ticks in a_ticks.items():
                    a["main" if t == pids[m] else "other"] += ticks - b_ticks.get(t, 0)
        lines.append(f"{args.model} at {args.load:.0%} of its batch-1 rate (t1 {t1 * 1e3:.2f} ms), {args.rounds} "
                     f"rounds of {args.segment:g} s turns; {left_out} segments left out for steal")
        for m, a in acc.items():
            n = max(a["req"], 1)
            split = ", ".join(f"{k} {a[k] / n / 1e3:.1f}" for k in SPLIT)
            lines.append(f"{m}: {a['req']} requests, client average {a['lat'] / max(a['ok'], 1):.3f} ms; server per "
                         f"request (us): {split}; stub CPU per request (us): main thread {a['main'] / TICK / n * 1e6:.1f}, "
                         f"other threads {a['other'] / TICK / n * 1e6:.1f}; main thread per request: "
                         f"{a['runq'] / n / 1e3:.1f} us waiting for a core, {a['vol'] / n:.2f} blocking and "
                         f"{a['invol'] / n:.2f} preempted context switches")
    finally:
        server.stop()
    print("\n".join(lines))
    if args.out:
        from benchmarks.harness import command_line, machine_meta

        meta = machine_meta()
        Path(args.out).write_text(f"# {command_line()}\n# commit {meta['commit']}, {meta['cpu']} ({meta['cores']} "
                                  f"cores), onnxruntime {meta['onnxruntime']}\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
