"""Batching policies behind one interface (see base.Policy)."""

from .backend_hooks import InlineHooks, inline_hooks
from .base import DEFAULT_MAX_BATCH_SIZE, Policy
from .cellular import CellularBatching
from .eager import EagerBatching
from .graph_batching import GraphBatching, Serial
from .lazy import LazyBatching, OracleLazyBatching
from .monitor import BatchLatencyModel, BatchMonitor, MaxBatchUnderDeadline, preferred_batch_size
from .registry import DEFAULT_POLICY, sla_aware
from .spec import POLICY_NAMES, PolicySpec, parse_policy

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "Policy", "InlineHooks", "inline_hooks", "CellularBatching", "EagerBatching", "GraphBatching", "Serial", "LazyBatching", "OracleLazyBatching",
           "BatchLatencyModel", "BatchMonitor", "MaxBatchUnderDeadline", "preferred_batch_size", "POLICY_NAMES",
           "PolicySpec", "parse_policy", "DEFAULT_POLICY", "sla_aware"]
