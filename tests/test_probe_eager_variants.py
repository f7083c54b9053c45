"""benchmarks/probes/probe_eager_variants.py's figure: twin avg / variant avg over every cell, its interval from
resampling repetitions (each a fresh server), judged by the one rule (synthetic cells, no server)."""

from __future__ import annotations

import pytest

from benchmarks.probes import probe_eager_variants as probe


def _cells(eager, quiet):
    out = []
    for k, server in enumerate((1.0, 1.02, 0.98)):  # each repetition's server runs all policies a bit apart
        for load in (0.4, 0.9):
            out += [{"load": load, "rep": k, "policy": "triton_0us_twin", "avg_ms": 10 * server},
                    {"load": load, "rep": k, "policy": "eager", "avg_ms": 10 * server * eager[k]},
                    {"load": load, "rep": k, "policy": "eager_quiet", "avg_ms": 10 * server * quiet[k]}]
    return out


def test_a_variant_slower_in_every_repetition_is_behind_and_one_that_straddles_is_level():
    cells = _cells(eager=(1.1, 1.1, 1.1), quiet=(1.01, 0.99, 1.0))
    slow, quiet = probe.pooled(cells, "eager"), probe.pooled(cells, "eager_quiet")
    assert slow["ratio"] == pytest.approx(1 / 1.1) and slow["hi"] < 1.0 and slow["verdict"] == "missed"
    assert quiet["draws"] == 3 and quiet["lo"] < 1.0 < quiet["hi"] and quiet["verdict"] == "tie"
