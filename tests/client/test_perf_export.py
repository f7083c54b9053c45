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


def test_a_failure_on_random_token_ids_says_which_input_data_to_pass(tmp_path):
    """perf_analyzer's default random bytes are no valid token ids (BERT's Gather refuses them): the error says what
    to pass. A stand-in binary prints what perf_analyzer 2.41 printed on the BERT model and exits as it did."""
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.perf import run

    fake = tmp_path / "perf_analyzer"
    fake.write_text("#!/bin/sh\necho \"Thread [0] had error: onnxruntime failed: INVALID_ARGUMENT : Non-zero status "
                    "code returned while running Gather node. Status Message: indices element out of data bounds, "
                    "idx=-1420042007188224409 must be within the inclusive range [-30522,30521]\"\nexit 99\n")
    fake.chmod(0o755)
    with pytest.raises(ConfigError, match="(?s)exit 99.*--input-data zero"):
        run(fake, "bert_eager", "127.0.0.1:1", [4.0], tmp_path / "out")
    # with input data given, the failure is reported as it is: no advice about data the user already chose
    with pytest.raises(ConfigError) as e:
        run(fake, "bert_eager", "127.0.0.1:1", [4.0], tmp_path / "out", input_data="zero")
    assert "--input-data zero" not in str(e.value)
