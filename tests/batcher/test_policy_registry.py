"""The policy registry (batcher/policies/registry.py) is the one list: every entry parses under its name and
aliases, builds, labels, runs, and shows up in the config help and the CLI's; adding an entry is enough."""

from __future__ import annotations

import pytest

from lazybatch.backend.parameters import PARAMETERS, DEFAULT_POLICY as CONFIG_DEFAULT
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies import POLICY_NAMES, Policy, parse_policy, sla_aware
from lazybatch.batcher.policies import registry
from lazybatch.batcher.policies.graph_batching import Serial
from lazybatch.cli import build_parser
from lazybatch.repo import TritonPolicy, parse_repo_policy
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import paper_tables
from lazybatch.simulator.engine import Simulation
from lazybatch.simulator.workload import poisson, requests


def _help(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])


@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda e: e.name)
def test_every_entry_parses_builds_labels_and_runs(entry: registry.PolicyEntry) -> None:
    for name in (entry.name, *entry.aliases, entry.name.upper()):
        spec = parse_policy(name)
        assert spec.kind == entry.name and spec.entry is entry and spec.sla_aware is entry.sla_aware
        assert sla_aware(name) is entry.sla_aware
    assert parse_policy(entry.name).label == entry.label({})
    for table in (paper_tables.resnet50(), paper_tables.gnmt()):
        policy = parse_policy(entry.name).build(max_batch_size=8, length_histogram=LengthHistogram.load(shipped_histogram()))
        assert isinstance(policy, Policy)
        reqs = requests(poisson(200.0, 20, 0, graph=table.graph, lengths=LengthHistogram.load(shipped_histogram())), 1.0)
        Simulation(table, policy).run(reqs)
        assert all(r.status is not None for r in reqs)
    if "max_batch_size" in entry.params:
        spec = parse_policy(f"{entry.name}:max_batch_size=4")
        assert spec.params == {"max_batch_size": 4} and spec.build(max_batch_size=8).max_batch_size == 4
        assert "b4" in spec.label
    with pytest.raises(ConfigError, match=f"policy '{entry.name}' has no parameter 'nope'"):
        parse_policy(f"{entry.name}:nope=1")


@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda e: e.name)
def test_every_entry_is_in_the_config_help_and_the_clis(entry: registry.PolicyEntry, capsys) -> None:
    assert entry.name in POLICY_NAMES
    assert entry.name in PARAMETERS["policy"]
    for argv in (["repo", "add"], ["simulate"]):
        _help(argv)
        assert entry.name in capsys.readouterr().out


def test_adding_an_entry_is_enough(monkeypatch) -> None:
    """A new policy: one entry (and its class); parsing, labels, building and SLA-awareness follow."""
    class Fifo(Serial):
        name = "fifo"

    entry = registry.PolicyEntry("fifo", "first in, first out", {"depth": registry.INT},
                                 lambda p, a: Fifo(), lambda p: f"Fifo({p.get('depth', 0)})", sla_aware=True,
                                 aliases=("queue",))
    monkeypatch.setitem(registry.BY_NAME, "fifo", entry)
    monkeypatch.setitem(registry.ALIASES, "queue", "fifo")
    spec = parse_policy("queue:depth=3")
    assert spec.kind == "fifo" and spec.params == {"depth": 3} and spec.label == "Fifo(3)" and spec.sla_aware
    assert isinstance(spec.build(max_batch_size=8), Fifo)
    with pytest.raises(ConfigError, match="not a valid number"):
        parse_policy("fifo:depth=x")


def test_one_default_policy() -> None:
    """`repo add` writes the registry's default, and a config.pbtxt without a policy parameter gets the same one."""
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text

    assert CONFIG_DEFAULT is registry.DEFAULT_POLICY == "eager"
    from lazybatch.backend.parameters import BY_NAME

    assert BY_NAME["policy"].value == CONFIG_DEFAULT and f"`{CONFIG_DEFAULT}`" in BY_NAME["policy"].default
    args = build_parser().parse_args(["repo", "add", "m.onnx"])
    assert args.policy == registry.DEFAULT_POLICY
    cfg = parse_config_text('name: "m" backend: "python" max_batch_size: 4 '
                            'input { name: "x" data_type: TYPE_FP32 dims: [ 8 ] } '
                            'output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }')
    assert BackendSettings.from_config(cfg, "/nonexistent").policy == registry.DEFAULT_POLICY


def test_tritons_batcher_is_an_entry_too() -> None:
    assert parse_repo_policy("triton:5000") == TritonPolicy(5000)
    assert parse_repo_policy("triton") == TritonPolicy(0) and parse_repo_policy("triton:off") == TritonPolicy(None)
    assert not sla_aware("triton:0") and TritonPolicy(5000).label == "Triton(5000us)"
    with pytest.raises(ConfigError, match="expects an integer"):
        parse_repo_policy("triton:soon")
    with pytest.raises(ConfigError, match=">= 0"):
        parse_repo_policy("triton:-1")
    assert "triton:<us>" in registry.policy_choices(triton=True)
    assert parse_repo_policy("eager").kind == "eager"
    with pytest.raises(ConfigError, match="unknown policy 'triton:5'"):
        parse_policy("triton:5")  # the scheduler's policies only: Triton's batcher is not one
