"""
`BreakerConfig` and its windows refuse, at construction and naming the
field, what would fail or mislead at call time.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import resilient
from resilient import (
    BreakerConfig,
    ConfigError,
    ConfigTypeError,
    CountWindow,
    TimeWindow,
)
from resilient._core._config_breaker import Outcome


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: TimeWindow(1e-310), "TimeWindow.seconds"),
        (lambda: TimeWindow(1e-4), "TimeWindow.seconds"),
        (lambda: TimeWindow(1e12), "TimeWindow.seconds"),
        (lambda: CountWindow(10**12), "CountWindow.size"),
        (lambda: CountWindow(1_000_001), "CountWindow.size"),
        (
            lambda: BreakerConfig(open_interval_growth=1e300),
            "BreakerConfig.open_interval_growth",
        ),
        (
            lambda: BreakerConfig(failure_rate=10**400),
            "BreakerConfig.failure_rate",
        ),
        (
            lambda: BreakerConfig(slow_call_rate=10**400),
            "BreakerConfig.slow_call_rate",
        ),
    ],
)
def test_out_of_range_refused(make: Any, field: str) -> None:
    """
    A window too short for its buckets, too large for memory, or a ratio
    beyond its maximum: `ConfigError` naming the field, never an
    OverflowError or MemoryError later.
    """
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field


def test_the_limits_themselves_are_accepted() -> None:
    """The documented bounds are inclusive and work at call time."""
    for window in (TimeWindow(1e-3), TimeWindow(1e9), CountWindow(1_000_000)):
        cb = resilient.CircuitBreaker("edge", BreakerConfig(window=window))
        with cb:
            pass
        assert cb.statistics().calls == 1
    assert BreakerConfig(open_interval_growth=1000).open_interval_growth == 1e3


@pytest.mark.parametrize(
    "field", ["failure_rate", "slow_call_rate", "open_interval_growth"]
)
def test_a_ratio_is_not_a_duration(field: str) -> None:
    """A timedelta for a ratio is refused, naming the field."""
    with pytest.raises(ConfigTypeError) as info:
        BreakerConfig(**{field: dt.timedelta(seconds=0.5)})
    assert info.value.field == f"BreakerConfig.{field}"


def test_ints_still_accepted_for_ratios() -> None:
    """An int ratio is a float."""
    config = BreakerConfig(failure_rate=1, open_interval_growth=2)
    assert (config.failure_rate, config.open_interval_growth) == (1.0, 2.0)


async def _async_predicate(exc: Exception) -> bool:
    return False  # pragma: no cover - refused before it is ever called


class _AsyncCall:
    async def __call__(self, exc: Exception) -> bool:
        return False  # pragma: no cover - refused before it is ever called


@pytest.mark.parametrize("predicate", [_async_predicate, _AsyncCall()])
def test_async_predicates_refused(predicate: Any) -> None:
    """
    ``failure_on`` as ``async def`` (or an object whose ``__call__`` is)
    would read as always true: refused at construction, naming the field.
    """
    with pytest.raises(ConfigTypeError, match="sync") as info:
        BreakerConfig(failure_on=predicate)
    assert info.value.field == "BreakerConfig.failure_on"


def test_outcome_and_verdict_agree() -> None:
    """`BreakerConfig.outcome` is the enum; `verdict` its name."""
    config = BreakerConfig(failure_on=ConnectionError, ignore_on=KeyError)
    cases = {
        ConnectionError(): Outcome.FAILURE,
        ValueError(): Outcome.SUCCESS,
        KeyError(): Outcome.IGNORE,
        KeyboardInterrupt(): Outcome.IGNORE,
    }
    for exc, outcome in cases.items():
        assert config.outcome(exc) is outcome
        assert config.verdict(exc) == outcome.verdict == outcome.name.lower()
