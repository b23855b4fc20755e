"""
Circuit breakers: the pure machine (`_machine`), its state changes
(`_transitions`), the records it hands out (`_records`) and its windows
(`_windows`); the shell, `CircuitBreaker` (`_breaker`), with its decorator
(`_calls`), blocks (`_blocks`), rejection path (`_rejecting`), settling
(`_settling`) and reporting (`_notify`, `_report`); and the breakers by name
(`_registry`).
"""

from __future__ import annotations

from resilient._breaker._breaker import CircuitBreaker, Listener, Ticket
from resilient._breaker._machine import _BreakerMachine
from resilient._breaker._records import (
    _VERDICTS,
    FAILURE,
    IGNORE,
    SUCCESS,
    BreakerPermit,
    BreakerState,
    BreakerStatistics,
    BreakerTransition,
    Reject,
    TransitionReason,
)
from resilient._breaker._registry import (
    DEFAULT_MAX_BREAKERS,
    REGISTRY,
    breaker,
    get_breaker,
    set_breaker_defaults,
)
from resilient._breaker._settling import attempt_outcome
from resilient._breaker._windows import CountRing, TimeRing


_REGISTRY = REGISTRY
_CountRing = CountRing
_TimeRing = TimeRing

__all__ = [
    "DEFAULT_MAX_BREAKERS",
    "FAILURE",
    "IGNORE",
    "REGISTRY",
    "SUCCESS",
    "_REGISTRY",
    "_VERDICTS",
    "BreakerPermit",
    "BreakerState",
    "BreakerStatistics",
    "BreakerTransition",
    "CircuitBreaker",
    "CountRing",
    "Listener",
    "Reject",
    "Ticket",
    "TimeRing",
    "TransitionReason",
    "_BreakerMachine",
    "_CountRing",
    "_TimeRing",
    "attempt_outcome",
    "breaker",
    "get_breaker",
    "set_breaker_defaults",
]
