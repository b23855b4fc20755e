"""
Circuit breakers: the pure machine (`_machine`), its windows (`_windows`),
the sync and async shells (`_breaker`), and the breakers by name
(`_registry`).
"""

from __future__ import annotations

from resilient._breaker._breaker import (
    CircuitBreaker,
    Listener,
    Ticket,
    attempt_outcome,
)
from resilient._breaker._machine import (
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
    _BreakerMachine,
)
from resilient._breaker._registry import (
    DEFAULT_MAX_BREAKERS,
    REGISTRY,
    breaker,
    get_breaker,
    set_breaker_defaults,
)
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
