"""The scheduler core of lazybatch (installed as ``lazybatch.batcher``).

It imports neither Triton nor onnxruntime: the Triton backend and the simulator drive the same ``Scheduler`` by its
step loop (``arrive``, ``schedule``, ``update``), each running the jobs it returns on its own clock.
"""

from .admission import QueuePolicy  # noqa: F401  (re-exported)
from .decisions import Decision, DecisionLog
from .errors import ConfigError, LazyBatchError
from .graph import ModelGraph, Stage, StageType
from .interfaces import Clock, StageJob, StageResult
from .latency_table import LatencyTable
from .lengths import LengthHistogram
from .policies import (BatchLatencyModel, BatchMonitor, CellularBatching, GraphBatching, LazyBatching, MaxBatchUnderDeadline,
                       OracleLazyBatching, Policy, Serial, parse_policy)
from .request import Request, Status
from .scheduler import Scheduler, Step
from .slack import SlackPredictor, slack

__all__ = [
    "BatchLatencyModel", "BatchMonitor", "CellularBatching", "MaxBatchUnderDeadline", "Clock", "ConfigError", "Decision", "DecisionLog", "GraphBatching", "LatencyTable", "LazyBatchError",
    "LazyBatching", "LengthHistogram", "ModelGraph", "OracleLazyBatching", "Policy", "Request", "Scheduler", "Step",
    "Serial", "SlackPredictor", "Stage", "StageJob", "StageResult", "StageType", "Status", "parse_policy", "slack",
]
