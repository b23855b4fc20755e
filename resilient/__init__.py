"""
resilient: retries, circuit breakers, timeouts, bulkheads, singleflight and
locks for Python backends, sync and async, configured by one policy object.
"""

from __future__ import annotations

import typing as _typing

from resilient import lowlevel
from resilient._backends import ReleaseResult
from resilient._breaker import (
    BreakerPermit,
    BreakerState,
    BreakerStatistics,
    BreakerTransition,
    CircuitBreaker,
    breaker,
    set_breaker_defaults,
)
from resilient._bulkhead import (
    Bulkhead,
    BulkheadPermit,
    BulkheadStatistics,
    bulkhead,
)
from resilient._core._backoff import (
    Constant,
    Custom,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    schedule,
)
from resilient._core._clock import (
    Deadline,
    MonotonicClock,
    checkpoint,
    deadline,
    remaining,
    remaining_or_none,
)
from resilient._core._config_breaker import (
    BreakerConfig,
    CountWindow,
    TimeWindow,
)
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._core._config_retry_budget import RetryBudgetConfig
from resilient._core._decisions import RetryEvent
from resilient._core._hints import default_retry_after, parse_retry_after
from resilient._core._result import retry_if_status
from resilient._core._telemetry import configure_telemetry
from resilient._core._transient import (
    DependencyFailure,
    Transient,
    http_status,
)
from resilient._fence import fence_guard, fenced_update
from resilient._fence_redis import afenced_redis_set, fenced_redis_set
from resilient._lock import Lease, Lock, LockConfig, lock
from resilient._pipeline._block import Attempt
from resilient._policy import Policy, Retrying, retry, retrying
from resilient._retry_budget import (
    RetryBudget,
    RetryBudgetStatistics,
    retry_budget,
)
from resilient._singleflight import (
    SingleFlight,
    SingleFlightStatistics,
    singleflight,
)
from resilient._timeout import (
    TimeoutScope,
    deadline_from_header,
    deadline_header,
    parse_deadline_header,
    timeout,
    timeout_at,
)
from resilient.exceptions import (
    BulkheadFull,
    CircuitOpen,
    ConfigError,
    ConfigTypeError,
    DeadlineExceeded,
    GaveUpOnResult,
    LockBackendError,
    LockLost,
    LockNotAcquired,
    Rejected,
    ResilientError,
    ScopeCancelled,
    TimedOut,
)


__all__ = [
    "Attempt",
    "BreakerConfig",
    "BreakerPermit",
    "BreakerState",
    "BreakerStatistics",
    "BreakerTransition",
    "Bulkhead",
    "BulkheadConfig",
    "BulkheadFull",
    "BulkheadPermit",
    "BulkheadStatistics",
    "CircuitBreaker",
    "CircuitOpen",
    "ConfigError",
    "ConfigTypeError",
    "Constant",
    "CountWindow",
    "Custom",
    "Deadline",
    "DeadlineExceeded",
    "DecorrelatedJitter",
    "DependencyFailure",
    "EqualJitter",
    "Exponential",
    "FullJitter",
    "GaveUpOnResult",
    "Lease",
    "Lock",
    "LockBackendError",
    "LockConfig",
    "LockLost",
    "LockNotAcquired",
    "MonotonicClock",
    "Policy",
    "Rejected",
    "ReleaseResult",
    "ResilientError",
    "RetryBudget",
    "RetryBudgetConfig",
    "RetryBudgetStatistics",
    "RetryEvent",
    "Retrying",
    "ScopeCancelled",
    "SingleFlight",
    "SingleFlightStatistics",
    "TimeWindow",
    "TimedOut",
    "TimeoutScope",
    "Transient",
    "afenced_redis_set",
    "breaker",
    "bulkhead",
    "checkpoint",
    "configure_telemetry",
    "deadline",
    "deadline_from_header",
    "deadline_header",
    "default_retry_after",
    "fence_guard",
    "fenced_redis_set",
    "fenced_update",
    "http_status",
    "lock",
    "parse_deadline_header",
    "parse_retry_after",
    "remaining",
    "remaining_or_none",
    "retry",
    "retry_budget",
    "retry_if_status",
    "retrying",
    "schedule",
    "set_breaker_defaults",
    "singleflight",
    "timeout",
    "timeout_at",
]


def _fix_module_names() -> None:
    """Show public paths (``resilient.Policy``) in reprs and docs."""
    import contextlib  # noqa: PLC0415 - not to be left in the namespace

    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("resilient._"):
            with contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = "resilient"


_fix_module_names()
# The namespace holds the public API: no helper of this module, nor the
# names its own imports bound (the private subpackages, which the import
# system binds here, are hidden by `__dir__`).
del _fix_module_names, annotations


def __dir__() -> list[str]:
    """The public API, the public submodules loaded, and the dunders."""
    return sorted(
        name
        for name, value in globals().items()
        if name in __all__
        or (name.startswith("__") and name.endswith("__"))
        or (type(value) is type(_typing) and not name.startswith("_"))
    )


def __getattr__(name: str) -> _typing.Any:
    if name == "__version__":
        import importlib.metadata  # noqa: PLC0415

        return importlib.metadata.version("resilient")
    if name == "RetryMachine":
        import warnings  # noqa: PLC0415

        warnings.warn(
            "resilient.RetryMachine moved to resilient.lowlevel.RetryMachine",
            DeprecationWarning,
            stacklevel=2,
        )
        return lowlevel.RetryMachine
    raise AttributeError(f"module 'resilient' has no attribute {name!r}")
