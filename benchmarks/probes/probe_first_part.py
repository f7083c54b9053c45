"""Where a streamed first token waits: the client's time to first token against the backend's own (execute's
hand-off to the first part sent) and Triton's queue before execute, for the decoupled LM under eager at 90% load,
with the cancellation watcher asking at a given ``cancel_poll_ms``.

    python -m benchmarks.probes.probe_first_part lazybatch-results/streaming-r3/repos/lm/lm_eager --cancel-poll-ms 100

Serves a hard-linked copy of the given model folder (bench_streaming.py's repo) with ``cancel_poll_ms`` set, and
two 25 s cells of Poisson load at ``--load`` x 1/``--t1-ms`` after a 5 s warm-up; the backend's figures come from
its stats file (LAZYBATCH_STATS_DIR), Triton's from its metrics."""
import argparse, json, os, re, shutil, tempfile, urllib.request
from pathlib import Path
from lazybatch.backend.config import config_to_text, load_config
from lazybatch.client.load import run_load
from benchmarks.harness import served

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("model_dir", type=Path)
ap.add_argument("--cancel-poll-ms", default="auto")
ap.add_argument("--load", type=float, default=0.9)
ap.add_argument("--t1-ms", type=float, default=265.8, help="the batch-1 latency the load is a fraction of")
args = ap.parse_args()
work = Path(tempfile.mkdtemp())
name = args.model_dir.name
shutil.copytree(args.model_dir, work / "repo" / name, copy_function=os.link)
cfg = load_config(args.model_dir / "config.pbtxt")
cfg.parameters["cancel_poll_ms"].string_value = args.cancel_poll_ms
(work / "repo" / name / "config.pbtxt").unlink()  # a hard link to the original: replaced, not written through
(work / "repo" / name / "config.pbtxt").write_text(config_to_text(cfg))


def queue_ms(url: str) -> tuple[float, float]:
    txt = urllib.request.urlopen(url).read().decode()
    get = lambda m: float(re.search(rf'^{m}{{model="{name}",version="1"}} (\S+)', txt, re.M).group(1))
    return get("nv_inference_queue_duration_us") / 1e3, get("nv_inference_request_success")


with served(work / "repo", work / "server.log", stats_dir=work / "stats") as srv:
    run_load(srv.endpoints.grpc, name, 2.0, 5, sla_ms=5000, seed=7, streaming=True, timeout_s=600)  # warm-up
    for rep in range(2):
        q0, n0 = queue_ms(srv.endpoints.metrics)
        r = run_load(srv.endpoints.grpc, name, args.load / args.t1_ms * 1e3, 25, sla_ms=5000, seed=50 + rep,
                     streaming=True, timeout_s=600)
        q1, n1 = queue_ms(srv.endpoints.metrics)
        print(f"cancel_poll_ms {args.cancel_poll_ms}, rep {rep}: {r.sent} sent, client TTFT avg {r.ttft_avg_ms:.1f} "
              f"p50 {r.ttft_p50_ms:.1f} p99 {r.ttft_p99_ms:.1f} ms; Triton queue before execute "
              f"{(q1 - q0) / max(n1 - n0, 1):.2f} ms", flush=True)
d = json.loads((work / "stats" / f"{name}.json").read_text())
print(f"cancel_poll_ms {args.cancel_poll_ms}, backend (warm-up and both reps): first part "
      + ", ".join(f"{k} {v:.1f}" for k, v in d["first_part"].items())
      + f"; execute to scheduler {d['admit_wait_mean_ms']:.2f} ms mean; {d['cancel_checks']} cancel asks "
        f"({d['cancel_check_ms']:.0f} ms)")
