"""Small pure functions of the planner."""

from __future__ import annotations

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.onnx_tools.plan import _balanced, parse_cost


def test_parse_cost_units() -> None:
    assert parse_cost("500M") == 5e8
    assert parse_cost("1.5G") == 1.5e9
    assert parse_cost("2e9") == 2e9
    assert parse_cost("750k flops") == 7.5e5
    with pytest.raises(ConfigError, match="500M"):
        parse_cost("a lot")


def test_balanced_groups_minimise_the_largest() -> None:
    starts = _balanced([1, 1, 1, 10, 1, 1, 1], 3)
    assert len(starts) == 3 and starts[0] == 0
    bounds = starts + [7]
    sums = [sum([1, 1, 1, 10, 1, 1, 1][a:b]) for a, b in zip(bounds, bounds[1:])]
    assert max(sums) == 10  # the big piece alone; nothing else can do better
    assert _balanced([5, 5, 5, 5], 4) == [0, 1, 2, 3]
