"""Time to first token under perf_analyzer, read from its --profile-export-file (lazybatch/perf.py), on a file
shaped like perf_analyzer 2.41 writes it (timestamps in ns)."""

from __future__ import annotations

import json

import pytest

from lazybatch.perf import stream_timing

MS = 1_000_000  # ns


def request(sent_ms: float, parts_ms: list[float]) -> dict:
    return {"timestamp": int(sent_ms * MS), "response_timestamps": [int(t * MS) for t in parts_ms]}


def test_first_response_and_the_gaps_after_it_per_rate(tmp_path):
    export = {"version": "2.41.0", "experiments": [
        {"experiment": {"mode": "request_rate", "value": 4.0}, "window_boundaries": [0, 10**12],
         "requests": [request(0, [10, 12, 14, 16]),  # TTFT 10, 2 ms a token
                      request(100, [130, 136]),  # TTFT 30, 6 ms
                      request(200, [220]),  # one token: a TTFT, no time per token
                      {"timestamp": 300 * MS, "response_timestamps": []}]},  # never answered: left out
        {"experiment": {"mode": "request_rate", "value": 8.0}, "window_boundaries": [0, 10**12],
         "requests": [request(0, [5, 6])]}]}
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    timing = stream_timing(path)
    assert set(timing) == {4.0, 8.0}
    four = timing[4.0]
    assert four["streamed_requests"] == 3 and four["unanswered_requests"] == 1
    assert four["ttft_avg_ms"] == pytest.approx(20.0) and four["ttft_p50_ms"] == pytest.approx(20.0)
    assert 20.0 < four["ttft_p99_ms"] <= 30.0
    assert four["tpot_avg_ms"] == pytest.approx(4.0)  # (2 + 6) / 2: the one-token request has no gap
    assert timing[8.0]["ttft_avg_ms"] == pytest.approx(5.0) and timing[8.0]["tpot_avg_ms"] == pytest.approx(1.0)


def test_an_experiment_without_answers_gives_no_row(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"experiments": [{"experiment": {"mode": "request_rate", "value": 2.0},
                                                 "requests": [{"timestamp": 0, "response_timestamps": []}]}]}))
    assert stream_timing(path) == {}
