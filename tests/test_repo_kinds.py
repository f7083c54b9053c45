"""`lazybatch repo default --model` offers exactly the kinds the repository builder knows.

The CLI lists them literally (importing lazybatch.repo would load the backend for every command); this keeps the two
lists from drifting apart, as they would have when the Transformer became a kind."""

from __future__ import annotations

import argparse

from lazybatch.cli import build_parser
from lazybatch.shipped import KIND_MAX_BATCH, KIND_SLA_MS, SHIPPED_MODELS


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def test_repo_default_offers_every_model_kind() -> None:
    default = _subparser(_subparser(build_parser(), "repo"), "default")
    model = next(a for a in default._actions if a.dest == "model")
    assert tuple(model.choices) == SHIPPED_MODELS
    assert set(KIND_MAX_BATCH) == set(KIND_SLA_MS) == set(SHIPPED_MODELS)


def test_per_suffix_parameters_reach_only_that_models_config(tmp_path) -> None:
    """A per-suffix parameter (here a device group) reaches that suffix's config only; Triton's models of the same
    build do not get it, and ``replace`` rewrites a directory that exists."""
    from lazybatch.backend.config_pbtxt import load_config
    from lazybatch.shipped import PAIR_OURS, build_default_repository

    group = "pair"
    repo = tmp_path / "repo"
    policies = {PAIR_OURS: "eager", "triton_0us": "triton:0"}
    build_default_repository(repo, kind="tiny", policies=policies, profile_reps=1, log=lambda *a: None)
    assert "device_group" not in load_config(repo / f"tiny_{PAIR_OURS}" / "config.pbtxt").parameters
    build_default_repository(repo, kind="tiny", policies=policies, profile_reps=1, log=lambda *a: None,
                             parameters={PAIR_OURS: {"device_group": group}})
    # an existing model directory is kept as it is unless asked to replace it
    assert "device_group" not in load_config(repo / f"tiny_{PAIR_OURS}" / "config.pbtxt").parameters
    build_default_repository(repo, kind="tiny", policies=policies, profile_reps=1, log=lambda *a: None,
                             parameters={PAIR_OURS: {"device_group": group}}, replace=True)
    grouped = load_config(repo / f"tiny_{PAIR_OURS}" / "config.pbtxt").parameters
    assert grouped["device_group"].string_value == group
    assert "device_group" not in load_config(repo / "tiny_triton_0us" / "config.pbtxt").parameters
    default = _subparser(_subparser(build_parser(), "repo"), "default")
    assert default.parse_args(["--pair"]).pair and not default.parse_args([]).pair
