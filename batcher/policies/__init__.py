"""Batching policies behind one interface (see base.Policy)."""

from .base import DEFAULT_MAX_BATCH_SIZE, Policy
from .graph_batching import GraphBatching, Serial
from .lazy import LazyBatching, OracleLazyBatching
from .spec import POLICY_NAMES, parse_policy

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "Policy", "GraphBatching", "Serial", "LazyBatching", "OracleLazyBatching",
           "POLICY_NAMES", "parse_policy"]
