"""Seeded Poisson arrivals for perf_analyzer (lazybatch/perf.py): its own schedule replays one fixed sequence on
every run, so `lazybatch perf --poisson-seed` draws the gaps here and hands them over as --request-intervals."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.perf import command, poisson_intervals, write_intervals


def test_gaps_are_exponential_at_the_rate_and_fixed_by_the_seed():
    gaps = poisson_intervals(40.0, 20000, seed=3)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(25_000, rel=0.03)  # us: 1/40 s
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    assert poisson_intervals(40.0, 50, seed=3) == gaps[:50]  # a seed is one sequence
    assert poisson_intervals(40.0, 50, seed=4) != gaps[:50]
    assert poisson_intervals(40.0, 50, seed=[3, 1]) != poisson_intervals(40.0, 50, seed=[3, 0])
    assert min(poisson_intervals(1e7, 1000, seed=0)) >= 1  # perf_analyzer reads whole microseconds


def test_a_rate_that_is_not_positive_is_refused():
    with pytest.raises(ConfigError, match="positive"):
        poisson_intervals(0.0, 10, seed=0)


def test_the_file_outlasts_every_window_perf_analyzer_may_take(tmp_path):
    path = write_intervals(tmp_path / "iv.txt", 50.0, 7, measurement_ms=1000, max_trials=3)
    gaps = [int(v) for v in path.read_text().split()]
    assert sum(gaps) / 1e6 > (3 + 2) * 1.0  # past the end it would loop and repeat arrivals
    assert gaps == poisson_intervals(50.0, len(gaps), 7)


def test_the_command_gives_the_file_instead_of_the_poisson_rate(tmp_path):
    iv = tmp_path / "iv.txt"
    cmd = command(Path("perf_analyzer"), "m", "127.0.0.1:8001", [30.0], request_intervals=iv)
    assert cmd[cmd.index("--request-intervals") + 1] == str(iv)
    assert "--request-rate-range" not in cmd and "--request-distribution" not in cmd and "--async" in cmd
    plain = command(Path("perf_analyzer"), "m", "127.0.0.1:8001", [30.0])
    assert plain[plain.index("--request-rate-range") + 1] == "30" and "--request-intervals" not in plain
    with pytest.raises(ConfigError, match="one rate"):
        command(Path("perf_analyzer"), "m", "127.0.0.1:8001", [30.0, 60.0], request_intervals=iv)
