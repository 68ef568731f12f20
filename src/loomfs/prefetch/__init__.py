"""Plan-driven prefetch and eviction policies of a spoke cache (spoke layer, pure Python).

Nothing here does I/O: the spoke cache calls these policies, and ``bench/cachesim.py`` replays
workloads through the same code.
"""

from .adaptive import (
    AdaptivePolicy,
    Forecast,
    HistoryPredictor,
    Predictor,
    SequentialPredictor,
    StridePredictor,
)
from .plan import Plan, Schedule
from .planned import PlanPolicy
from .policy import EvictionPolicy, Key, LRUPolicy

__all__ = [
    "AdaptivePolicy",
    "EvictionPolicy",
    "Forecast",
    "HistoryPredictor",
    "Key",
    "LRUPolicy",
    "Plan",
    "PlanPolicy",
    "Predictor",
    "Schedule",
    "SequentialPredictor",
    "StridePredictor",
]
