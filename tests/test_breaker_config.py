"""
`BreakerConfig` and its windows refuse, at construction and naming the
field, what would fail or mislead at call time.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import attrs
import pytest

import resilient
import resilient.testing
from resilient import (
    BreakerConfig,
    ConfigError,
    ConfigTypeError,
    CountWindow,
    TimeWindow,
)
from resilient._breaker import _REGISTRY
from resilient._core._config_breaker import Outcome
from tests.breakers import CLOSED, OPEN, fail_with, ok, through
from tests.conftest import Driver


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Every test starts and ends with no breakers and no defaults."""
    _REGISTRY.clear()
    yield
    _REGISTRY.clear()


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
    """The documented bounds are inclusive and work at call time (in
    virtual time: on the real clock a loaded machine let the call leave a
    1 ms window before the statistics were read)."""
    for window in (TimeWindow(1e-3), TimeWindow(1e9), CountWindow(1_000_000)):
        with resilient.testing.use_clock(resilient.testing.FakeClock()):
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


class TestConfig:
    def test_defaults(self) -> None:
        """The defaults are the documented ones: a 60 s time window, half
        of at least 5 calls failing, 30 s open, 3 probes, 10 s probe
        timeout, every Exception a failure, slow calls not tracked."""
        c = BreakerConfig()
        assert c.window == TimeWindow(60.0)
        assert c.failure_rate == 0.5
        assert c.minimum_calls == 5
        assert c.slow_call_duration is None
        assert c.slow_call_rate == 1.0
        assert c.open_interval == 30.0
        assert c.open_interval_growth == 1.0
        assert c.max_open_interval == 300.0
        assert c.half_open_probes == 3
        assert c.probe_timeout == 10.0
        assert c.failure_on == resilient.DependencyFailure()
        assert c.ignore_on == ()

    def test_five_failures_in_a_minute_open_for_thirty_seconds(
        self, clock: Any
    ) -> None:
        """With the defaults, 5 failures within 60 s open the breaker for
        30 s, and 3 successful probes close it."""
        cb = resilient.breaker("sheet")
        for _ in range(5):
            with pytest.raises(ConnectionError):
                through(Driver("sync"), cb, fail_with(ConnectionError()))
            clock.advance(10.0)
        assert cb.state is OPEN
        assert cb.retry_after() == 30.0 - 10.0
        clock.advance(20.0)
        for _ in range(3):
            assert through(Driver("sync"), cb, ok) == "ok"
        assert cb.state is CLOSED

    @pytest.mark.parametrize(
        ("changes", "field", "error"),
        [
            ({"window": 60}, "BreakerConfig.window", ConfigTypeError),
            ({"failure_rate": 0.0}, "BreakerConfig.failure_rate", ConfigError),
            ({"failure_rate": 1.5}, "BreakerConfig.failure_rate", ConfigError),
            (
                {"failure_rate": math.nan},
                "BreakerConfig.failure_rate",
                ConfigError,
            ),
            (
                {"failure_rate": "half"},
                "BreakerConfig.failure_rate",
                ConfigTypeError,
            ),
            ({"minimum_calls": 0}, "BreakerConfig.minimum_calls", ConfigError),
            (
                {"minimum_calls": True},
                "BreakerConfig.minimum_calls",
                ConfigTypeError,
            ),
            (
                {"slow_call_duration": -1.0},
                "BreakerConfig.slow_call_duration",
                ConfigError,
            ),
            (
                {"slow_call_rate": 0.0},
                "BreakerConfig.slow_call_rate",
                ConfigError,
            ),
            (
                {"open_interval": 0.0},
                "BreakerConfig.open_interval",
                ConfigError,
            ),
            (
                {"open_interval": math.inf},
                "BreakerConfig.open_interval",
                ConfigError,
            ),
            (
                {"open_interval_growth": 0.5},
                "BreakerConfig.open_interval_growth",
                ConfigError,
            ),
            (
                {"max_open_interval": 10.0},
                "BreakerConfig.max_open_interval",
                ConfigError,
            ),
            (
                {"half_open_probes": 0},
                "BreakerConfig.half_open_probes",
                ConfigError,
            ),
            (
                {"probe_timeout": None},
                "BreakerConfig.probe_timeout",
                ConfigTypeError,
            ),
            (
                {"failure_on": "boom"},
                "BreakerConfig.failure_on",
                ConfigTypeError,
            ),
            (
                {"failure_on": (int,)},
                "BreakerConfig.failure_on",
                ConfigTypeError,
            ),
            (
                {"failure_on": KeyboardInterrupt},
                "BreakerConfig.failure_on",
                ConfigError,
            ),
            (
                {"ignore_on": lambda e: True},
                "BreakerConfig.ignore_on",
                ConfigTypeError,
            ),
            (
                {"window": CountWindow(3), "minimum_calls": 4},
                "BreakerConfig.minimum_calls",
                ConfigError,
            ),
        ],
    )
    def test_bad_values_rejected(
        self, changes: dict[str, Any], field: str, error: type[Exception]
    ) -> None:
        """A bad value is refused at construction, naming field and value."""
        with pytest.raises(error) as info:
            BreakerConfig(**changes)
        assert info.type is error
        assert info.value.field == field  # type: ignore[attr-defined]
        shown = str(info.value)
        assert field in shown
        value = info.value.value  # type: ignore[attr-defined]
        assert repr(value) in shown

    @pytest.mark.parametrize(
        ("make", "field"),
        [
            (lambda: CountWindow(0), "CountWindow.size"),
            (lambda: CountWindow(2.5), "CountWindow.size"),  # type: ignore[arg-type]
            (lambda: TimeWindow(-1.0), "TimeWindow.seconds"),
            (lambda: TimeWindow(math.inf), "TimeWindow.seconds"),
        ],
    )
    def test_bad_windows_rejected(
        self, make: Callable[[], object], field: str
    ) -> None:
        """Windows validate their own fields the same way."""
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            make()

    def test_conversions(self) -> None:
        """Durations take timedelta and ints; one exception class or a list
        stands for a tuple."""
        c = BreakerConfig(
            window=TimeWindow(dt.timedelta(minutes=2)),
            open_interval=dt.timedelta(seconds=45),
            max_open_interval=600,
            failure_on=ConnectionError,
            ignore_on=[KeyError, ValueError],
        )
        assert c.window == TimeWindow(120.0)
        assert c.open_interval == 45.0
        assert c.max_open_interval == 600.0
        assert c.failure_on == (ConnectionError,)
        assert c.ignore_on == (KeyError, ValueError)

    def test_frozen_and_evolve(self) -> None:
        """A config is frozen; evolve makes a validated copy."""
        c = BreakerConfig()
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            c.open_interval = 1.0  # type: ignore[misc]
        assert c.evolve(open_interval=5).open_interval == 5.0
        with pytest.raises(ConfigError, match="open_interval"):
            c.evolve(open_interval=-5)

    @pytest.mark.parametrize(
        ("exc", "verdict"),
        [
            (ConnectionError(), "failure"),
            (ValueError(), "success"),
            (KeyError("k"), "ignore"),
            (anyio.get_cancelled_exc_class, "ignore"),
            (KeyboardInterrupt(), "ignore"),
            (SystemExit(), "ignore"),
        ],
    )
    def test_verdict_by_classes(self, exc: Any, verdict: str) -> None:
        """failure_on classes fail, ignore_on and non-Exceptions are
        ignored, anything else counts as a success."""
        c = BreakerConfig(failure_on=OSError, ignore_on=KeyError)
        if callable(exc) and not isinstance(exc, BaseException):
            import asyncio

            exc = asyncio.CancelledError()
        assert c.verdict(exc) == verdict

    def test_verdict_by_predicate(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A failure_on predicate decides; one that raises is logged and
        counts as a failure."""

        def is_5xx(exc: Exception) -> bool:
            if isinstance(exc, ZeroDivisionError):
                raise RuntimeError("bad predicate")
            return getattr(exc, "status", 0) >= 500

        class HTTPError(Exception):
            def __init__(self, status: int) -> None:
                self.status = status

        c = BreakerConfig(failure_on=is_5xx)
        assert c.verdict(HTTPError(503)) == "failure"
        assert c.verdict(HTTPError(404)) == "success"
        with caplog.at_level(logging.ERROR, logger="resilient"):
            assert c.verdict(ZeroDivisionError()) == "failure"
        assert "failure_on predicate" in caplog.text
