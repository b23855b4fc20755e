"""
Circuit breakers: the configuration, the pure machine fed outcomes and times,
and every scenario against the sync shell and the async shell (asyncio and
trio), as a decorator and as a context manager, in virtual time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import doctest
import gc
import inspect
import logging
import math
import pathlib
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from opentelemetry import trace as otel_trace

import resilient
import resilient.testing
from resilient import (
    BreakerConfig,
    BreakerState,
    BreakerTransition,
    CircuitBreaker,
    CircuitOpen,
    ConfigError,
    ConfigTypeError,
    CountWindow,
    TimeWindow,
)
from resilient._breaker import (
    _REGISTRY,
    FAILURE,
    IGNORE,
    SUCCESS,
    BreakerPermit,
    Reject,
    _BreakerMachine,
    get_breaker,
)
from tests.conftest import Driver, Telemetry


CLOSED = BreakerState.CLOSED
OPEN = BreakerState.OPEN
HALF_OPEN = BreakerState.HALF_OPEN
FORCED_OPEN = BreakerState.FORCED_OPEN


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Every test starts and ends with no breakers and no defaults."""
    _REGISTRY.clear()
    yield
    _REGISTRY.clear()
    _REGISTRY.limit = 1024


def small(**changes: Any) -> BreakerConfig:
    """A breaker that opens on 2 failures of the last 4 calls."""
    base: dict[str, Any] = {
        "window": CountWindow(4),
        "minimum_calls": 2,
        "open_interval": 10.0,
        "half_open_probes": 2,
        "probe_timeout": 5.0,
    }
    base.update(changes)
    return BreakerConfig(**base)


def machine(**changes: Any) -> _BreakerMachine:
    return _BreakerMachine(small(**changes), "m", owner=None)


def admit(m: _BreakerMachine, now: float) -> BreakerPermit:
    got = m.admit(now)
    assert isinstance(got, BreakerPermit), got
    return got


def settle(
    m: _BreakerMachine, p: BreakerPermit, outcome: int, now: float
) -> BreakerTransition | None:
    return m.record(p, outcome, now - p.start, now)


def call(
    m: _BreakerMachine, outcome: int, now: float, took: float = 0.0
) -> BreakerTransition | None:
    """Admit and settle one call ending at *now* after *took* seconds."""
    p = admit(m, now - took)
    return settle(m, p, outcome, now)


# The shells: one scenario, a body written once, run through a form.


def through(
    driver: Driver,
    cb: CircuitBreaker,
    body: Callable[[], Any],
    form: str = "decorator",
) -> Any:
    """Run *body* guarded by *cb*, as a decorator or a context manager."""
    if form == "decorator":
        return driver.call(cb, body)
    if not driver.is_async:
        with cb:
            return body()

    async def main() -> Any:
        async with cb:
            await anyio.lowlevel.checkpoint()
            return body()

    return anyio.run(main, backend=driver.kind)


def fail_with(exc: BaseException) -> Callable[[], Any]:
    def body() -> Any:
        raise exc

    return body


def ok() -> str:
    return "ok"


FORMS = pytest.mark.parametrize("form", ["decorator", "context"])


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
        assert c.failure_on == (Exception,)
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


class TestMachine:
    def test_opens_on_failure_rate_after_minimum_calls(self) -> None:
        """Below minimum_calls nothing opens; at it, a failure rate at or
        above the threshold opens, with the reason and the wait."""
        m = machine(minimum_calls=3)
        assert call(m, FAILURE, 1.0) is None
        assert call(m, FAILURE, 2.0) is None
        t = call(m, SUCCESS, 3.0)
        assert t is not None
        assert (t.old, t.new, t.reason) == (CLOSED, OPEN, "failure_rate")
        assert (t.at, t.retry_after) == (3.0, 10.0)
        assert m.outbox == [t]

    def test_rate_below_threshold_stays_closed(self) -> None:
        """1 failure in 4 calls is under 50%: the breaker stays closed."""
        m = machine(minimum_calls=4)
        for outcome in (SUCCESS, FAILURE, SUCCESS, SUCCESS, SUCCESS):
            assert call(m, outcome, 1.0) is None
        assert m.state is CLOSED

    def test_count_window_forgets_old_calls(self) -> None:
        """Only the last *size* calls count: old failures fall out."""
        m = machine(window=CountWindow(4), minimum_calls=4)
        for outcome in (FAILURE, SUCCESS, SUCCESS, SUCCESS):
            call(m, outcome, 1.0)
        stats = m.statistics(1.0)
        assert (stats.calls, stats.failures) == (4, 1)
        for _ in range(4):
            call(m, SUCCESS, 1.0)
        assert (m.statistics(1.0).calls, m.statistics(1.0).failures) == (
            4,
            0,
        )

    def test_time_window_forgets_old_calls(self) -> None:
        """Calls older than the time window no longer count."""
        m = machine(window=TimeWindow(60.0), minimum_calls=2)
        call(m, FAILURE, 0.5)
        assert m.statistics(30.0).calls == 1
        assert m.statistics(61.0).calls == 0
        assert call(m, FAILURE, 61.0) is None  # The old failure is gone.
        assert m.state is CLOSED
        assert call(m, FAILURE, 90.0) is not None
        assert m.state is OPEN

    def test_time_window_slides_bucket_by_bucket(self) -> None:
        """Calls leave the window one bucket (1/60 of it) at a time."""
        m = machine(window=TimeWindow(60.0), minimum_calls=10)
        for t in range(5):
            call(m, FAILURE, 100.0 + t)
        assert m.statistics(104.0).failures == 5
        assert m.statistics(161.5).failures == 3
        assert m.statistics(165.0).failures == 0
        m.window.expire(10.0)  # Time never runs backward; this is a no-op.
        assert m.statistics(165.0).calls == 0

    def test_slow_calls_open(self) -> None:
        """Calls at or over slow_call_duration count as slow; at the slow
        rate the breaker opens even though every call succeeded."""
        m = machine(slow_call_duration=2.0, slow_call_rate=0.5)
        assert call(m, SUCCESS, 10.0, took=2.0) is None
        t = call(m, SUCCESS, 11.0, took=2.5)
        assert t is not None
        assert t.reason == "slow_call_rate"
        assert m.statistics(11.0).slow_calls == 2

    def test_ignored_outcomes_do_not_count(self) -> None:
        """IGNORE leaves the window untouched."""
        m = machine()
        for _ in range(5):
            assert call(m, IGNORE, 1.0) is None
        assert m.statistics(1.0).calls == 0

    def test_open_rejects_then_admits_a_probe(self) -> None:
        """An open breaker rejects with the time left, then admits a
        probe once the interval has passed."""
        m = machine()
        call(m, FAILURE, 0.0)
        call(m, FAILURE, 0.0)
        r = m.admit(4.0)
        assert r == Reject(6.0, OPEN)
        assert m.retry_after(4.0) == 6.0
        p = admit(m, 10.0)
        assert p.probe > 0
        assert m.state is HALF_OPEN
        assert m.outbox[-1].reason == "open_interval_passed"
        assert m.rejected == 1

    def _half_open(self, **changes: Any) -> _BreakerMachine:
        m = machine(**changes)
        call(m, FAILURE, 0.0)
        call(m, FAILURE, 0.0)
        return m

    def test_half_open_caps_concurrent_probes(self) -> None:
        """At most half_open_probes run at once; the rejection says when
        the oldest probe times out."""
        m = self._half_open()
        held = [admit(m, 10.0), admit(m, 11.0)]
        assert m.admit(12.0) == Reject(3.0, HALF_OPEN)
        assert m.retry_after(12.0) == 3.0
        assert [p.probe for p in held] == [1, 2]  # still in flight

    def test_probes_succeeding_close(self) -> None:
        """half_open_probes successes close the breaker and empty the
        window."""
        m = self._half_open()
        p1, p2 = admit(m, 10.0), admit(m, 10.0)
        assert settle(m, p1, SUCCESS, 11.0) is None
        assert m.retry_after(11.0) == 0.0
        t = settle(m, p2, SUCCESS, 11.0)
        assert t is not None
        assert (t.old, t.new, t.reason) == (
            HALF_OPEN,
            CLOSED,
            "probes_succeeded",
        )
        assert m.statistics(11.0).calls == 0

    def test_probe_failure_reopens_with_growth(self) -> None:
        """A failed probe re-opens; the interval grows by the factor up to
        the cap, and goes back to the base once closed."""
        m = self._half_open(open_interval_growth=3.0, max_open_interval=50.0)
        t = settle(m, admit(m, 10.0), FAILURE, 10.0)
        assert t is not None
        assert (t.reason, t.retry_after) == ("probe_failed", 30.0)
        t = settle(m, admit(m, 40.0), FAILURE, 40.0)
        assert t is not None
        assert t.retry_after == 50.0
        for _ in range(2):
            settle(m, admit(m, 90.0), SUCCESS, 90.0)
        assert m.state is CLOSED
        call(m, FAILURE, 91.0)
        t = call(m, FAILURE, 91.0)
        assert t is not None
        assert t.retry_after == 10.0

    def test_slow_probe_fails(self) -> None:
        """A probe slower than slow_call_duration counts as failed."""
        m = self._half_open(slow_call_duration=1.0)
        t = settle(m, admit(m, 10.0), SUCCESS, 11.5)
        assert t is not None
        assert t.reason == "probe_failed"

    def test_stuck_probe_reaped_on_admit(self) -> None:
        """A probe out for probe_timeout re-opens the breaker on the next
        admission; its late outcome then counts for nothing."""
        m = self._half_open()
        stuck = admit(m, 10.0)
        assert m.retry_after(15.0) == 10.0  # It will re-open.
        assert m.admit(15.0) == Reject(10.0, OPEN)
        assert m.outbox[-1].reason == "probe_timeout"
        assert settle(m, stuck, SUCCESS, 16.0) is None
        assert m.state is OPEN
        assert m.probes == {}

    def test_overtime_probe_fails_on_record(self) -> None:
        """A probe that ends after probe_timeout fails, success or not."""
        m = self._half_open()
        t = settle(m, admit(m, 10.0), SUCCESS, 15.0)
        assert t is not None
        assert t.reason == "probe_timeout"

    def test_ignored_probe_frees_its_slot(self) -> None:
        """An ignored probe frees its slot without counting."""
        m = self._half_open()
        p1, p2 = admit(m, 10.0), admit(m, 10.0)
        assert settle(m, p1, IGNORE, 10.0) is None
        assert m.successes == 0
        assert admit(m, 10.0).probe == 3
        assert settle(m, p2, SUCCESS, 10.0) is None

    def test_stale_permit_counts_for_nothing(self) -> None:
        """A call admitted before a state change does not count after it."""
        m = machine()
        old = admit(m, 0.0)
        call(m, FAILURE, 0.0)
        call(m, FAILURE, 0.0)
        admit(m, 10.0)
        assert settle(m, old, FAILURE, 10.0) is None
        assert settle(m, old, IGNORE, 10.0) is None
        assert m.state is HALF_OPEN
        assert len(m.probes) == 1

    def test_force_open_and_reset(self) -> None:
        """force_open rejects with no end until reset; both are no-ops when
        already there, and reset empties the window."""
        m = machine()
        t = m.force_open(1.0)
        assert t is not None
        assert (t.new, t.retry_after) == (FORCED_OPEN, math.inf)
        assert m.force_open(2.0) is None
        assert m.admit(1e9) == Reject(math.inf, FORCED_OPEN)
        t = m.reset(3.0)
        assert t is not None
        assert (t.old, t.new, t.reason) == (FORCED_OPEN, CLOSED, "reset")
        call(m, FAILURE, 4.0)
        assert m.reset(5.0) is None
        assert m.statistics(5.0).calls == 0

    def test_statistics_snapshot(self) -> None:
        """statistics() is a frozen snapshot of the window and counters."""
        m = machine(minimum_calls=4)
        call(m, FAILURE, 1.0)
        call(m, SUCCESS, 1.0)
        s = m.statistics(1.0)
        assert (s.calls, s.failures, s.failure_rate) == (2, 1, 0.5)
        assert (s.state, s.retry_after, s.times_opened) == (CLOSED, 0.0, 0)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            s.calls = 3  # type: ignore[misc]
        empty = machine().statistics(0.0)
        assert (empty.failure_rate, empty.slow_call_rate) == (0.0, 0.0)


class TestShells:
    @FORMS
    def test_opens_rejects_probes_and_closes(
        self, driver: Driver, clock: Any, form: str
    ) -> None:
        """Failures open the breaker; while open the call is not run and
        CircuitOpen says which breaker and when; after the interval probes
        run and close it."""
        cb = resilient.breaker("svc", small())
        runs: list[int] = []

        def failing() -> Any:
            runs.append(1)
            raise ConnectionError("down")

        for _ in range(2):
            with pytest.raises(ConnectionError, match="down"):
                through(driver, cb, failing, form)
        assert cb.state is OPEN
        clock.advance(4.0)
        with pytest.raises(CircuitOpen) as info:
            through(driver, cb, failing, form)
        assert len(runs) == 2
        assert (info.value.name, info.value.retry_after) == ("svc", 6.0)
        assert info.value.state == "open"
        assert "'svc'" in str(info.value)
        clock.advance(6.0)
        assert cb.retry_after() == 0.0
        assert through(driver, cb, ok, form) == "ok"
        assert cb.state is HALF_OPEN
        assert through(driver, cb, ok, form) == "ok"
        assert cb.state is CLOSED

    @FORMS
    def test_exception_propagates_unchanged(
        self, driver: Driver, clock: Any, form: str
    ) -> None:
        """The call's own exception comes out, the same object."""
        cb = resilient.breaker("same", small())
        exc = ConnectionError("x")
        with pytest.raises(ConnectionError) as info:
            through(driver, cb, fail_with(exc), form)
        assert info.value is exc
        assert cb.statistics().failures == 1

    @FORMS
    def test_what_counts(self, driver: Driver, clock: Any, form: str) -> None:
        """Exceptions outside failure_on count as successes (the
        dependency answered); ignore_on ones do not count at all."""
        cb = resilient.breaker(
            "counts",
            small(
                minimum_calls=3, failure_on=ConnectionError, ignore_on=KeyError
            ),
        )
        for exc in (ValueError(), KeyError(), ConnectionError()):
            with pytest.raises(type(exc)):
                through(driver, cb, fail_with(exc), form)
        s = cb.statistics()
        assert (s.calls, s.failures, s.state) == (2, 1, CLOSED)

    @pytest.mark.parametrize("form", ["decorator", "context"])
    def test_interrupts_never_count(self, clock: Any, form: str) -> None:
        """KeyboardInterrupt and SystemExit pass through and do not count."""
        cb = resilient.breaker("intr", small())
        for exc in (KeyboardInterrupt(), SystemExit(1)):
            with pytest.raises(type(exc)):
                through(Driver("sync"), cb, fail_with(exc), form)
        assert cb.statistics().calls == 0

    @pytest.mark.anyio
    @pytest.mark.parametrize("form", ["decorator", "context"])
    async def test_cancellation_never_counts(
        self, clock: Any, form: str
    ) -> None:
        """A call cancelled from outside is not a failure, nor a success,
        and a cancelled probe frees its slot."""
        cb = resilient.breaker("cancel", small(half_open_probes=1))

        async def body() -> None:
            await anyio.sleep_forever()

        async def guarded() -> None:
            if form == "decorator":
                await cb(body)()
            else:
                async with cb:
                    await body()

        for _ in range(3):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await guarded()
        assert cb.statistics().calls == 0
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await guarded()
        s = cb.statistics()
        assert (s.state, s.probes_in_flight) == (HALF_OPEN, 0)

    @FORMS
    def test_no_lock_held_during_the_call(
        self, driver: Driver, clock: Any, form: str
    ) -> None:
        """The breaker's lock is free while the call runs, so the call may
        use the same breaker (and other threads are never blocked)."""
        cb = resilient.breaker("free", small())
        seen: list[bool] = []

        def body() -> str:
            seen.append(cb._lock.locked())
            cb.statistics()
            cb.acquire().success()
            return "ok"

        assert through(driver, cb, body, form) == "ok"
        assert seen == [False]

    def test_nested_same_breaker(self, clock: Any) -> None:
        """Entering one breaker twice in one task settles each permit."""
        cb = resilient.breaker("nest", small())
        with cb as outer:
            with pytest.raises(ConnectionError), cb as inner:
                raise ConnectionError
            assert inner is not outer
        s = cb.statistics()
        assert (s.calls, s.failures) == (2, 1)

    @pytest.mark.anyio
    async def test_async_with_is_per_task(self, clock: Any) -> None:
        """Concurrent tasks in one breaker each settle their own permit."""
        cb = resilient.breaker(
            "tasks", small(window=CountWindow(10), minimum_calls=10)
        )

        async def one(fail: bool) -> None:
            async with cb:
                await anyio.lowlevel.checkpoint()
                if fail:
                    raise ConnectionError

        async def guarded(fail: bool) -> None:
            with contextlib.suppress(ConnectionError):
                await one(fail)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(guarded, i % 3 == 0)
        s = cb.statistics()
        assert (s.calls, s.failures) == (6, 2)

    def test_exit_without_enter(self) -> None:
        """Exiting a breaker never entered in this context is an error."""
        cb = resilient.breaker("exit")
        with pytest.raises(RuntimeError, match="exited more often"):
            cb.__exit__(None, None, None)
        with pytest.raises(RuntimeError, match="exited more often"):
            anyio.run(cb.__aexit__, None, None, None)

    def test_decorator_keeps_signature_and_methods(self, clock: Any) -> None:
        """The decorated function keeps its signature; methods work."""
        cb = resilient.breaker("sig")

        def add(a: int, b: int = 2) -> int:
            return a + b

        plain = inspect.signature(add)
        add = cb(add)

        class Client:
            @cb
            def get(self, x: int) -> int:
                return x * 2

        assert add(1) == 3
        assert inspect.signature(add) == plain
        assert Client().get(4) == 8


class TestPermits:
    def test_settles_once(self, clock: Any) -> None:
        """A second settlement of a permit is a no-op."""
        cb = resilient.breaker("once", small())
        p = cb.acquire()
        p.failure(ConnectionError())
        p.failure(ConnectionError())
        p.success()
        p.ignore()
        assert cb.statistics().calls == 1
        assert "settled" in repr(p)

    def test_failure_decides_by_config(self, clock: Any) -> None:
        """permit.failure(exc) counts exc as the config says; cancellation
        is ignored."""
        import asyncio

        cb = resilient.breaker(
            "decide", small(minimum_calls=4, failure_on=OSError)
        )
        cb.acquire().failure(ValueError())
        cb.acquire().failure(OSError())
        cb.acquire().failure(asyncio.CancelledError())
        s = cb.statistics()
        assert (s.calls, s.failures) == (2, 1)

    def test_ignore_releases_a_probe(self, clock: Any) -> None:
        """ignore() releases a half-open probe slot without counting."""
        cb = resilient.breaker("rel", small(half_open_probes=1))
        cb.force_open()
        cb.reset()
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        p = cb.acquire()
        assert "probe 1" in repr(p)
        with pytest.raises(CircuitOpen) as info:
            cb.acquire()
        assert info.value.state == "half_open"
        assert info.value.retry_after == 5.0
        p.ignore()
        cb.acquire().success()
        assert cb.state is CLOSED

    @pytest.mark.anyio
    async def test_async_twins(self, clock: Any) -> None:
        """aacquire and the a-settlements behave like the sync ones."""
        cb = resilient.breaker("twins", small())
        p = await cb.aacquire()
        await p.afailure(ConnectionError())
        await p.asuccess()
        await (await cb.aacquire()).aignore()
        await (await cb.aacquire()).asuccess()
        s = cb.statistics()
        assert (s.calls, s.failures) == (2, 1)

    def test_forced_open(self, clock: Any) -> None:
        """force_open rejects with an infinite wait until reset."""
        cb = resilient.breaker("forced")
        cb.force_open()
        assert cb.state is FORCED_OPEN
        assert cb.retry_after() == math.inf
        with pytest.raises(CircuitOpen, match="until it is reset") as info:
            cb.acquire()
        assert info.value.retry_after == math.inf
        cb.reset()
        cb.acquire().success()
        assert cb.statistics().rejected == 1

    def test_circuit_open_pickles(self) -> None:
        """CircuitOpen survives pickling with its attributes."""
        data = pickle.dumps(CircuitOpen("db", 2.5, "half_open"))
        exc = pickle.loads(data)  # noqa: S301
        assert (exc.name, exc.retry_after, exc.state) == (
            "db",
            2.5,
            "half_open",
        )
        assert "half-open; next probe in 2.500 s" in str(exc)


class TestListeners:
    def _trip(self, driver: Driver, cb: CircuitBreaker) -> None:
        for _ in range(2):
            with pytest.raises(ConnectionError):
                through(driver, cb, fail_with(ConnectionError()))

    def test_sync_listeners_hear_every_change(
        self, driver: Driver, clock: Any
    ) -> None:
        """Sync listeners get each transition, in sync and async code."""
        cb = resilient.breaker("hear", small(half_open_probes=1))
        heard: list[tuple[BreakerState, BreakerState, str]] = []
        cb.add_listener(lambda t: heard.append((t.old, t.new, t.reason)))
        self._trip(driver, cb)
        clock.advance(10.0)
        through(driver, cb, ok)
        assert heard == [
            (CLOSED, OPEN, "failure_rate"),
            (OPEN, HALF_OPEN, "open_interval_passed"),
            (HALF_OPEN, CLOSED, "probes_succeeded"),
        ]

    def test_raising_listener_changes_nothing(
        self, driver: Driver, clock: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A listener that raises is logged; later listeners still run and
        the call's outcome is untouched."""
        cb = resilient.breaker("raise", small())
        after: list[BreakerTransition] = []

        def bad(t: BreakerTransition) -> None:
            raise RuntimeError("listener bug")

        async def abad(t: BreakerTransition) -> None:
            raise RuntimeError("async listener bug")

        cb.add_listener(bad)
        cb.add_listener(abad)
        cb.add_listener(after.append)
        with caplog.at_level(logging.ERROR, logger="resilient"):
            self._trip(driver, cb)
        assert cb.state is OPEN
        assert len(after) == 1
        assert "listener bug" in caplog.text

    def test_async_listeners_awaited_in_async_code(
        self, driver: Driver, clock: Any
    ) -> None:
        """Async listeners are awaited when the change happens in async
        code, and skipped when it happens in sync code."""
        cb = resilient.breaker("await", small())
        heard: list[str] = []

        async def listener(t: BreakerTransition) -> None:
            await anyio.lowlevel.checkpoint()
            heard.append(t.reason)

        cb.add_listener(listener)
        self._trip(driver, cb)
        assert heard == (["failure_rate"] if driver.is_async else [])

    def test_remove_listener_and_bad_listener(self, clock: Any) -> None:
        """A removed listener hears nothing more; a non-callable is
        refused."""
        cb = resilient.breaker("remove")
        heard: list[BreakerTransition] = []
        cb.add_listener(heard.append)
        cb.remove_listener(heard.append)
        cb.remove_listener(print)
        cb.force_open()
        assert heard == []
        with pytest.raises(ConfigTypeError, match="listener"):
            cb.add_listener("nope")  # type: ignore[arg-type]


class TestTelemetry:
    def test_span_events_and_metrics(
        self, driver: Driver, clock: Any, telemetry: Telemetry
    ) -> None:
        """State changes and rejections are events on the current span and
        counted in metrics."""
        cb = resilient.breaker("tele", small())
        tracer = telemetry.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("outer"):
            for _ in range(2):
                with pytest.raises(ConnectionError):
                    through(driver, cb, fail_with(ConnectionError()))
            with pytest.raises(CircuitOpen):
                through(driver, cb, ok)
        (span,) = telemetry.spans()
        names = [e.name for e in span.events]
        assert names == [
            "resilient.breaker.state_change",
            "resilient.breaker.rejected",
        ]
        change = span.events[0].attributes
        assert change["resilient.breaker"] == "tele"
        assert change["resilient.breaker.state"] == "open"
        assert change["resilient.breaker.from"] == "closed"
        assert span.events[1].attributes["resilient.breaker.retry_after"] == 10
        metrics = telemetry.metrics()
        assert metrics["resilient.breaker.transitions"] == 1
        assert metrics["resilient.breaker.rejections"] == 1

    def test_without_sdk_nothing_breaks(self, clock: Any) -> None:
        """With no SDK configured, reporting is skipped silently."""
        cb = resilient.breaker("nosdk", small())
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        with pytest.raises(CircuitOpen):
            cb.acquire()
        assert not otel_trace.get_current_span().is_recording()


class TestRegistry:
    def test_one_breaker_per_name(self) -> None:
        """The same name gives the same breaker; get_breaker is breaker."""
        a = resilient.breaker("db")
        assert resilient.breaker("db") is a
        assert get_breaker("db") is a
        assert resilient.breaker("db", BreakerConfig()) is a
        assert resilient.breaker("other") is not a
        assert repr(a) == "<CircuitBreaker 'db' closed>"

    def test_different_config_refused(self) -> None:
        """Asking for an existing breaker with another config raises."""
        resilient.breaker("db", small())
        assert resilient.breaker("db", small()).config == small()
        with pytest.raises(ConfigError, match=r"breaker\('db'\)\.config"):
            resilient.breaker("db", BreakerConfig())

    @pytest.mark.parametrize(
        ("name", "config", "error", "match"),
        [
            (3, None, ConfigTypeError, "breaker.name."),
            ("  ", None, ConfigError, "must not be empty"),
            ("x", {"open_interval": 1}, ConfigTypeError, "BreakerConfig"),
        ],
    )
    def test_bad_arguments(
        self, name: Any, config: Any, error: type[Exception], match: str
    ) -> None:
        """A bad name or config is refused, naming it."""
        with pytest.raises(error, match=match):
            resilient.breaker(name, config)
        with pytest.raises(error, match=match):
            CircuitBreaker(name, config)

    def test_registered_defaults(self) -> None:
        """Breakers made without a config take the name's defaults, then
        the global ones, then BreakerConfig(); existing ones keep theirs."""
        early = resilient.breaker("early")
        resilient.set_breaker_defaults(small())
        resilient.set_breaker_defaults(
            small(open_interval=99.0), name="payments"
        )
        assert resilient.breaker("payments").config.open_interval == 99.0
        assert resilient.breaker("search").config == small()
        assert early.config == BreakerConfig()
        with pytest.raises(ConfigTypeError):
            resilient.set_breaker_defaults("x")  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            resilient.set_breaker_defaults(small(), name="")

    def test_bounded_but_open_breakers_kept(self, clock: Any) -> None:
        """Past the bound, the least recently used closed breakers are let
        go; open ones never are."""
        _REGISTRY.limit = 3
        hot = resilient.breaker("hot", small())
        for _ in range(2):
            hot.acquire().failure(ConnectionError())
        for i in range(5):
            resilient.breaker(f"b{i}")
        kept = _REGISTRY.kept()
        # The bound keeps the 3 most recent; the open one is pinned too.
        assert kept == ["b2", "b3", "b4", "hot"]
        gc.collect()
        assert resilient.breaker("hot") is hot

    def test_held_breaker_still_found(self) -> None:
        """A breaker let go by the bound but still held elsewhere is the
        one the name gives: one name never has two live breakers."""
        _REGISTRY.limit = 1
        held = resilient.breaker("held")
        resilient.breaker("next")
        assert "held" not in _REGISTRY.kept()
        assert resilient.breaker("held") is held

    def test_breaker_opening_is_kept(self, clock: Any) -> None:
        """A breaker that opens after being let go is kept again."""
        _REGISTRY.limit = 1
        cb = resilient.breaker("later", small())
        resilient.breaker("next")
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        assert "later" in _REGISTRY.kept()
        stray = CircuitBreaker("stray", small())
        stray.force_open()
        assert "stray" not in _REGISTRY.kept()
        _REGISTRY.clear()  # Forgotten by the registry, still held here:
        cb.reset()
        cb.force_open()  # opening does not bring it back.
        assert _REGISTRY.kept() == []


class TestThreads:
    def test_probes_never_exceed_the_cap(self, clock: Any) -> None:
        """Threads racing into a half-open breaker: at most
        half_open_probes are admitted while the probes are in flight."""
        cb = resilient.breaker("race", small(half_open_probes=3))
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        admitted: list[Any] = []
        rejected: list[CircuitOpen] = []
        start = threading.Barrier(8)

        def worker() -> None:
            start.wait()
            try:
                admitted.append(cb.acquire())
            except CircuitOpen as exc:
                rejected.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (len(admitted), len(rejected)) == (3, 5)
        for p in admitted:
            p.success()
        assert cb.state is CLOSED

    def test_counts_stay_consistent_under_threads(self, clock: Any) -> None:
        """Threads hammering one breaker lose no update: the window's
        totals always match its contents."""
        cb = resilient.breaker(
            "hammer",
            BreakerConfig(
                window=CountWindow(50), minimum_calls=50, failure_rate=1.0
            ),
        )
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)

        start = threading.Barrier(4)

        def worker(seed: int) -> None:
            start.wait()
            for i in range(10_000):
                permit = cb.acquire()
                if (i + seed) % 3:
                    permit.success()
                else:
                    permit.failure(ConnectionError())

        try:
            threads = [
                threading.Thread(target=worker, args=(n,)) for n in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(old)
        ring = cb._m.window._ring  # type: ignore[union-attr]
        s = cb.statistics()
        assert s.state is CLOSED
        assert s.calls == 50
        assert s.failures == sum(b & FAILURE for b in ring)


class TestTasks:
    @pytest.mark.anyio
    async def test_probes_never_exceed_the_cap(self, clock: Any) -> None:
        """Tasks racing into a half-open breaker: at most half_open_probes
        run at once, the others are rejected; the probes' successes close
        it."""
        cb = resilient.breaker("tasks-race", small(half_open_probes=2))
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        release = anyio.Event()
        running: list[int] = []
        peak: list[int] = [0]
        rejected: list[CircuitOpen] = []

        @cb
        async def probe() -> None:
            running.append(1)
            peak[0] = max(peak[0], len(running))
            await release.wait()
            running.pop()

        async def caller() -> None:
            try:
                await probe()
            except CircuitOpen as exc:
                rejected.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(caller)
            while len(running) + len(rejected) < 6:
                await anyio.lowlevel.checkpoint()
            release.set()
        assert (peak[0], len(rejected)) == (2, 4)
        assert cb.state is CLOSED


def test_docs_examples_run(clock: Any) -> None:
    """The examples in docs/breaker.md run as written, on a fake clock."""
    path = pathlib.Path(__file__).parent.parent / "docs" / "breaker.md"
    result = doctest.testfile(
        str(path),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
        globs={"resilient": resilient, "clock": clock},
    )
    assert result.attempted > 0
    assert result.failed == 0


class TestDecoratorClosedPath:
    """The decorator's closed path takes no permit object; it must still
    count exactly what a permit would."""

    def test_a_call_that_outlives_a_state_change_is_not_counted(
        self, driver: Driver, clock: Any
    ) -> None:
        """A call admitted while closed and ended after a reset (a new
        epoch) counts for nothing, failure or success."""
        cb = resilient.breaker("stale", small())

        def body() -> None:
            cb.force_open()  # two state changes while the call runs:
            cb.reset()  # a new epoch, an empty window
            raise ConnectionError

        for _ in range(3):
            with pytest.raises(ConnectionError):
                driver.call(cb, body)
        stats = cb.statistics()
        assert stats.state is BreakerState.CLOSED
        assert (stats.calls, stats.failures) == (0, 0)

    def test_failures_through_the_decorator_open_it(
        self, driver: Driver, clock: Any
    ) -> None:
        """Failures counted on the closed path open the breaker, and a
        failed probe through the decorator opens it again."""
        cb = resilient.breaker("opens", small())
        for _ in range(2):
            with pytest.raises(ConnectionError):
                driver.call(cb, fail_with(ConnectionError()))
        assert cb.state is BreakerState.OPEN
        clock.advance(10.0)
        with pytest.raises(ConnectionError):
            driver.call(cb, fail_with(ConnectionError()))
        assert cb.state is BreakerState.OPEN

    def test_cancellation_on_the_closed_path_is_not_counted(
        self, anyio_backend: str
    ) -> None:
        """A cancelled call through the async decorator counts nothing."""
        cb = resilient.breaker("cancelled", small())

        @cb
        async def body() -> None:
            await anyio.sleep(30)

        async def main() -> None:
            for _ in range(3):
                with anyio.move_on_after(0.001):
                    await body()

        anyio.run(main, backend=anyio_backend)
        assert cb.statistics().calls == 0

    def test_rejection_with_a_tracer_only_outside_spans(
        self, clock: Any
    ) -> None:
        """With a tracer but no meter, and no span recording, a rejection
        still raises CircuitOpen and records nothing."""
        from opentelemetry.sdk.trace import TracerProvider

        resilient.configure_telemetry(tracer_provider=TracerProvider())
        try:
            cb = resilient.breaker("quiet", small())
            cb.force_open()
            with pytest.raises(resilient.CircuitOpen, match="forced-open"):
                cb(ok)()
        finally:
            resilient.configure_telemetry()
