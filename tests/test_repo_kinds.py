"""`lazybatch repo default --model` offers exactly the kinds the repository builder knows.

The CLI lists them literally (importing lazybatch.repo would load the backend for every command); this keeps the two
lists from drifting apart, as they would have when the Transformer became a kind."""

from __future__ import annotations

import argparse

from lazybatch.cli import build_parser
from lazybatch.repo import KIND_MAX_BATCH, KIND_SLA_MS, MODEL_KINDS


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def test_repo_default_offers_every_model_kind() -> None:
    default = _subparser(_subparser(build_parser(), "repo"), "default")
    model = next(a for a in default._actions if a.dest == "model")
    assert tuple(model.choices) == MODEL_KINDS
    assert set(KIND_MAX_BATCH) == set(KIND_SLA_MS) == set(MODEL_KINDS)
