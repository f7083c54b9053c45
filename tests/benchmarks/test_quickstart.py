"""benchmarks/quickstart.py's verdicts, from synthetic windows (no server): a load whose noise floor strayed has no
verdict, a window whose answers came after it ended is not sustained, and a ratio that needs an unsustained cell
says which; the page renders from its raw data alone."""

from __future__ import annotations

import json

import numpy as np

from benchmarks import quickstart
from benchmarks.reports import quickstart as qs


def window(latency_ms: float, *, rate: float = 100.0, duration: float = 2.0, late_ms: float = 0.0,
           **key: object) -> dict:
    """One window's record: ``rate`` x ``duration`` requests sent evenly, each answered after ``latency_ms`` plus
    ``late_ms`` per second of its send offset (a queue growing through the window)."""
    n = int(rate * duration)
    sends = np.arange(n) / rate
    lat = [latency_ms + late_ms * t for t in sends]
    return {**key, "busy": 0.5, "steal": 0.0, "sent": n, "ok": n, "errors": 0, "latencies": lat,
            "records": [(float(t), float(v), True) for t, v in zip(sends, lat)], "send_rate": rate,
            "duration": duration}


def alone_runs(ours: list[float], triton: list[float], copy: list[float]) -> list[dict]:
    """Question 1 at each load: one window per configuration and repetition, at the given averages."""
    return [window(ms, question=1, load=f, rep=k, config=name, model=f"mlp_{name}")
            for f in qs.LOADS for name, per_rep in (("lazybatch", ours), ("Triton 0 ms", triton), ("copy", copy))
            for k, ms in enumerate(per_rep)]


def verdicts(lines: list[str]) -> dict[str, str]:
    """load -> verdict cell of question 1's verdict table."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| 40%")
            or line.startswith("| 70%")]
    return {r[0]: r[3] for r in rows if len(r) == 5}


def test_a_faster_default_is_ahead_only_where_the_copy_settled():
    lines = qs.first_table(alone_runs([5.0, 5.0, 5.0], [6.0, 6.0, 6.0], [6.0, 6.1, 5.9]), 5.0)
    assert set(verdicts(lines).values()) == {"lazybatch ahead"}
    strayed = qs.first_table(alone_runs([5.0, 5.0, 5.0], [6.0, 6.0, 6.0], [6.0, 7.0, 6.0]), 5.0)
    assert all(v.startswith("no verdict: the noise floor read 0.86-1.00") for v in verdicts(strayed).values())


def test_a_level_default_is_a_tie():
    lines = qs.first_table(alone_runs([6.1, 5.9, 6.0], [6.0, 6.0, 6.0], [6.0, 6.0, 6.0]), 5.0)
    assert set(verdicts(lines).values()) == {"level (a tie)"}


def test_answers_after_their_window_are_not_sustained():
    steady = qs.cell([window(5.0, rep=0)], 10.0)
    assert steady["sustained"] and steady["in_window"] > 0.99
    # a queue growing through the window: every answer 1 s later per second sent, its second half far slower
    growing = qs.cell([window(5.0, late_ms=1000.0, rep=0)], 10.0)
    assert not growing["sustained"] and growing["in_window"] < 0.95
    # a steady but long latency (an average of 40% of the window): a 2 s window cannot call it sustained
    long = qs.cell([window(800.0, rep=0)], 1000.0)
    assert long["drift"] == 1.0 and not long["sustained"] and "not sustained" in qs.latency(long)


def pair_runs(neighbour_late_ms: float = 0.0) -> list[dict]:
    runs = []
    for k in range(3):
        for cfg, small_ms in (("lazybatch", 2.0), ("Triton 0 ms", 4.0), ("copy", 4.0), (qs.HAND, 2.2)):
            late = neighbour_late_ms if cfg == "Triton 0 ms" else 0.0
            runs += [window(small_ms, question=2, mode="together", rep=k, config=cfg, role="small", model="t"),
                     window(20.0, late_ms=late, question=2, mode="together", rep=k, config=cfg, role="large",
                            model="m")]
        runs += [window(1.25, question=2, mode="alone", rep=k, config=cfg, role="small", model="t")
                 for cfg in ("lazybatch", "Triton 0 ms")]
    return runs


META = {"slas_ms": {"small": 5.0, "large": 100.0}, "t1_ms": {"small": 0.5, "large": 5.0},
        "pair": {"small": "tiny", "large": "mlp"}, "rates": {"small": 600.0, "large": 100.0},
        "loads": {"small": 0.3, "large": 0.5}}


def figure(lines: list[str], start: str) -> list[str]:
    row = next(line for line in lines if line.startswith(f"| {start}"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_the_pair_is_judged_only_where_every_model_sustained_its_load():
    lines = qs.second_table(pair_runs(), META)
    assert figure(lines, "tiny beside the MLP, Triton 0 ms and its copy / lazybatch")[-1] == "ahead"
    assert figure(lines, "tiny beside the MLP / alone, lazybatch")[-1] == "avg missed, p99 missed"  # 2.0 / 1.25
    hand = figure(lines, "tiny beside the MLP, hand-set nice / lazybatch")
    assert hand[1].startswith("1.10x") and hand[-1] == "ahead"  # lazybatch faster than the line set by hand
    grown = qs.second_table(pair_runs(neighbour_late_ms=1000.0), META)
    assert figure(grown, "tiny beside the MLP, Triton 0 ms and its copy / lazybatch")[-1] == \
        "no verdict: not sustained under Triton 0 ms (the MLP)"
    carried = figure(grown, "the MLP beside tiny, Triton 0 ms and its copy / lazybatch")
    assert carried[1].startswith("throughput") and carried[-1].startswith("no verdict")


def test_the_page_renders_from_its_raw_data(tmp_path, capsys):
    data = {"meta": {**META, "alone_t1_ms": 5.0, "phases_s": {"server start": 5.0}, "commit": "abc1234",
                     "cpu": "test", "cores": 2},
            "runs": alone_runs([5.0] * 3, [6.0] * 3, [6.0] * 3) + pair_runs()}
    raw = tmp_path / "quickstart.json"
    raw.write_text(json.dumps(data))
    assert quickstart.main(["--from-data", str(raw), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Measured at commit abc1234" in out and "**2. What does a latency-critical model keep" in out
    assert out.count("lazybatch ahead") == 2


def test_the_committed_page_renders_from_its_raw_data(tmp_path):
    from benchmarks.harness.meta import ROOT

    page = tmp_path / "results" / "quickstart.md"
    assert quickstart.main(["--from-data", "docs/data/quickstart.json", "--page", str(page)]) == 0
    want = (ROOT / "docs/results/quickstart.md").read_text().split("\n")
    got = page.read_text().split("\n")
    assert got[0] == want[0] and got[3:] == want[3:]  # the generated-by line names the page it was asked for
    assert (tmp_path / "img" / "quickstart_cdf.png").stat().st_size > 10_000


def test_bad_options_name_what_to_give(tmp_path, capsys):
    import pytest

    for argv, words in ((["--scale", "0"], "--scale must be above 0"), (["--reps", "0"], "--reps at least 1"),
                        (["--from-data", str(tmp_path / "none.json")], "a run writes"),
                        (["--kinds", "small=tiny"], "--kinds: give small=KIND,large=KIND")):
        with pytest.raises(SystemExit) as err:
            quickstart.main(argv)
        assert err.value.code != 0 and words in capsys.readouterr().err + str(err.value.code)
