"""Co-located load on a real tritonserver: `lazybatch load --together` and `lazybatch perf --together`
drive two of the session server's models at once, a few seconds each. Per-model counts add up to the aggregate
row, every request is answered exactly once (the client's counts, perf_analyzer's export and Triton's own
statistics agree), the two models are served over the same time, and a bad mix is refused before any load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from lazybatch.cli import main
from lazybatch.client.load import AGGREGATE

MODELS = ("mlp_lazy", "mlp_triton0")
MIX = "mlp_lazy=0.7,mlp_triton0=0.3"


def _successes(served) -> dict[str, tuple[int, int]]:
    """Triton's own statistics per model: requests that succeeded and that failed."""
    c = grpcclient.InferenceServerClient(served.grpc)
    out = {}
    for m in MODELS:
        st = c.get_inference_statistics(m).model_stats[0].inference_stats
        out[m] = (st.success.count, st.fail.count)
    return out


def _drive(served, argv: list[str], capsys) -> tuple[dict, dict, str, list[dict], dict]:
    """Run the command; Triton's counts before and after, its printout, and its rows (a row per model, in the order
    given, at its share of the aggregate 60/s, then the aggregate row)."""
    before = _successes(served)
    assert main([*argv, "--together", "--mix", MIX, "--url", served.grpc]) == 0
    after = _successes(served)
    text = capsys.readouterr().out
    out = argv[argv.index("--out") + 1]
    rows = json.loads((Path(out) / f"{argv[0]}.json").read_text())
    assert [r["model"] for r in rows] == [*MODELS, AGGREGATE]
    rate = "offered_rate" if argv[0] == "load" else "request_rate"
    assert [r[rate] for r in rows] == pytest.approx([42.0, 18.0, 60.0])
    return before, after, text, rows[:2], rows[2]


def test_load_together_drives_both_models_at_once_and_answers_every_request_once(served, tmp_path, capsys):
    out = tmp_path / "load"
    before, after, text, each, agg = _drive(served, ["load", *MODELS, "--rate", "60", "--duration", "2", "--sla-ms",
                                                     "mlp_lazy=200,mlp_triton0=300", "--out", str(out)], capsys)
    assert [r["sla_ms"] for r in each] == [200.0, 300.0]
    for key in ("sent", "ok", "errors", "lost", "duplicated"):
        assert agg[key] == sum(r[key] for r in each), key
    assert agg["throughput"] == pytest.approx(sum(r["throughput"] for r in each))
    for r in [*each, agg]:
        assert r["sent"] > 10 and r["ok"] == r["sent"] and r["errors"] == r["lost"] == r["duplicated"] == 0, r
    # the server answered each request once: its successes are the client's answers, plus one warm-up a model
    for m, r in zip(MODELS, each):
        assert after[m][0] - before[m][0] == r["ok"] + 1 and after[m][1] == before[m][1], (m, before, after)
    # served concurrently: both schedules started together (in turn, the second would start after the first's 2 s)
    starts = [r["start_unix"] for r in each]
    assert max(starts) - min(starts) < 0.5, starts
    assert "(all)" in text and "p99/alone" in text and "SLA viol" in text
    assert (out / "load.csv").read_text().startswith("model,")


def test_perf_together_runs_one_perf_analyzer_per_model_at_once(served, tmp_path, capsys):
    out = tmp_path / "perf"
    before, after, text, each, agg = _drive(
        served, ["perf", *MODELS, "--rates", "60", "--measurement-ms", "1500", "--max-trials", "3",
                 "--stability-percentage", "1000", "--poisson-seed", "3", "--sla-ms", "200", "--out", str(out)], capsys)
    for key in ("throughput", "requests", "unanswered_requests", "duplicated_requests"):
        assert agg[key] == pytest.approx(sum(r[key] for r in each)), key
    spans = []
    for m, r in zip(MODELS, each):
        assert r["requests"] > 10 and r["unanswered_requests"] == 0 and r["duplicated_requests"] == 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["throughput"] > 0.5 * r["request_rate"], r
        log = (out / f"perf_{m}.log").read_text()
        assert "--request-intervals" in log and "--profile-export-file" in log and "sla_ms:200:int" in log
        assert "error" not in log.lower().replace("standard deviation", "")
        # Triton served at least every request perf_analyzer kept (its warm-up and trials beyond), none failed
        assert after[m][0] - before[m][0] >= r["requests"] and after[m][1] == before[m][1]
        reqs = [q for e in json.loads((out / f"perf_{m}_export.json").read_text())["experiments"]
                for q in e["requests"]]
        spans.append((min(q["timestamp"] for q in reqs), max(q["response_timestamps"][-1] for q in reqs)))
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans  # the two request spans overlap
    assert agg["p50_ms"] <= agg["p99_ms"] and min(r["avg_ms"] for r in each) <= agg["avg_ms"] <= max(
        r["avg_ms"] for r in each)
    assert "(all)" in text and "unanswered" in text


def test_a_bad_mix_is_refused_before_any_load(served, capsys):
    before = _successes(served)
    for cmd in (["load", *MODELS, "--rate", "20", "--duration", "1"], ["perf", *MODELS, "--rates", "20"]):
        assert main([*cmd, "--together", "--mix", "mlp_lazy=0.7,mlp_triton0=0.2", "--url", served.grpc]) == 2
        assert "the shares must add up to 1, got 0.9 (0.7 + 0.2)" in capsys.readouterr().err
    assert _successes(served) == before
