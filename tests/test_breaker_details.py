"""
Breaker details (issue 7, item 10): `CircuitOpen` and the opening
transition carry the failure that opened the breaker; a metrics-only mode
counts, changes state and reports, but never rejects.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import pickle
import weakref
from typing import TYPE_CHECKING, Any

import pytest

import resilient
from resilient import (
    BreakerConfig,
    BreakerTransition,
    CircuitOpen,
    ConfigError,
    ConfigTypeError,
)
from tests.breakers import (
    CLOSED,
    FORCED_OPEN,
    FORMS,
    HALF_OPEN,
    OPEN,
    fail_with,
    ok,
    small,
    through,
)


if TYPE_CHECKING:
    from tests.conftest import Driver, Telemetry


class Refused(ConnectionError):
    """A dependency's own failure, with an attribute of its own."""

    def __init__(self, message: str, *, host: str) -> None:
        super().__init__(message)
        self.host = host


def _trip(
    driver: Driver, cb: resilient.CircuitBreaker, form: str = "decorator"
) -> Refused:
    """Open *cb* (two failures of `small`); the last failure raised."""
    last = None
    for i in range(2):
        with pytest.raises(Refused) as info:
            through(driver, cb, fail_with(Refused(f"no {i}", host="db")), form)
        last = info.value
    assert cb.state is OPEN
    assert last is not None
    return last


def _rejection(
    driver: Driver, cb: resilient.CircuitBreaker, form: str = "decorator"
) -> CircuitOpen:
    with pytest.raises(CircuitOpen) as info:
        through(driver, cb, ok, form)
    return info.value


# The failure that opened it.


@FORMS
def test_circuit_open_carries_the_opening_failure(
    driver: Driver, clock: Any, form: str
) -> None:
    """A rejection's opened_by is the failure that opened the breaker: its
    class, message and attributes, without its traceback; the caller's own
    exception keeps its traceback."""
    cb = resilient.breaker("carry", small())
    last = _trip(driver, cb, form)
    opened_by = _rejection(driver, cb, form).opened_by
    assert type(opened_by) is Refused
    assert str(opened_by) == "no 1"
    assert opened_by.host == "db"
    assert opened_by.__traceback__ is None
    assert opened_by is not last
    assert last.__traceback__ is not None


def test_transition_carries_the_opening_failure(
    driver: Driver, clock: Any
) -> None:
    """Listeners get the opening failure on the transition to open, and
    None on the others; a failed probe's failure re-opens it."""
    cb = resilient.breaker("told", small(half_open_probes=1))
    seen: list[BreakerTransition] = []
    cb.add_listener(seen.append)
    _trip(driver, cb)
    clock.advance(10)
    with pytest.raises(TimeoutError):
        through(driver, cb, fail_with(TimeoutError("probe")))
    assert [(t.new, type(t.opened_by)) for t in seen] == [
        (OPEN, Refused),
        (HALF_OPEN, type(None)),
        (OPEN, TimeoutError),
    ]
    assert _rejection(driver, cb).opened_by.args == ("probe",)  # type: ignore[union-attr]


def test_opened_by_is_cleared_by_closing(clock: Any) -> None:
    """Once closed, and when forced open, no failure is carried."""
    cb = resilient.breaker("cleared", small())
    for _ in range(2):
        cb.acquire().failure(ConnectionError("down"))
    cb.reset()
    cb.force_open()
    with pytest.raises(CircuitOpen) as info:
        cb.acquire()
    assert info.value.opened_by is None
    assert info.value.state == "forced_open"


def test_opened_by_keeps_no_frame_alive(clock: Any) -> None:
    """An open breaker does not keep the failed call's frames (and their
    locals) alive."""
    cb = resilient.breaker("frames", small())

    class Big:
        """A local of the failing frame."""

    refs: list[weakref.ref[Big]] = []

    @cb
    def call() -> None:
        big = Big()
        refs.append(weakref.ref(big))
        raise ConnectionError("down")

    for _ in range(2):
        with contextlib.suppress(ConnectionError):
            call()
    gc.collect()
    assert cb.state is OPEN
    assert cb._m.opened_by is not None
    assert [r() for r in refs] == [None, None]


def test_opened_by_in_a_group_is_detached(clock: Any) -> None:
    """A group that opened the breaker is kept with detached leaves."""
    cb = resilient.breaker("grouped", small())
    for _ in range(2):
        try:
            try:
                raise ConnectionError("leaf")
            except ConnectionError as leaf:
                raise ExceptionGroup("tasks", [leaf]) from None
        except ExceptionGroup as group:
            cb.acquire().failure(group)
    with pytest.raises(CircuitOpen) as info:
        cb.acquire()
    opened_by = info.value.opened_by
    assert isinstance(opened_by, ExceptionGroup)
    (leaf,) = opened_by.exceptions
    assert leaf.args == ("leaf",)
    assert leaf.__traceback__ is None


def test_pipeline_rejection_carries_the_opening_failure(clock: Any) -> None:
    """A policy's breaker stage hands the attempt's failure over too."""
    policy = resilient.Policy(
        name="piped", attempts=1, breaker=small(), budget=1.0
    )

    @policy
    def call() -> None:
        raise Refused("piped", host="api")

    for _ in range(2):
        with pytest.raises(Refused):
            call()
    with pytest.raises(CircuitOpen) as info:
        call()
    assert type(info.value.opened_by) is Refused


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_circuit_open_round_trips_with_opened_by(how: str) -> None:
    """CircuitOpen pickles and copies with its opened_by; one that does not
    survive pickling (keyword-only arguments) is None in a pickle."""
    trips = {
        "pickle": lambda e: pickle.loads(pickle.dumps(e)),  # noqa: S301
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
    }
    back = trips[how](CircuitOpen("db", 2.5, "open", ConnectionError("x")))
    assert (back.name, back.retry_after, back.state) == ("db", 2.5, "open")
    assert type(back.opened_by) is ConnectionError
    assert back.opened_by.args == ("x",)
    refused = Refused("x", host="h")
    odd = trips[how](CircuitOpen("db", 2.5, "open", refused))
    assert odd.opened_by is (None if how == "pickle" else refused)


def test_circuit_open_keywords_and_defaults() -> None:
    """CircuitOpen built by keyword reads back its fields; state defaults
    to open and opened_by to None."""
    exc = CircuitOpen(name="db", retry_after=1.5)
    assert (exc.name, exc.retry_after, exc.state, exc.opened_by) == (
        "db",
        1.5,
        "open",
        None,
    )
    assert str(exc) == "circuit breaker 'db' is open; next probe in 1.500 s"


# Metrics-only mode.


def _metrics_only(name: str, **changes: Any) -> resilient.CircuitBreaker:
    return resilient.breaker(name, small(metrics_only=True, **changes))


def test_metrics_only_never_rejects_yet_reports_open(
    driver: Driver, clock: Any
) -> None:
    """A metrics-only breaker opens, half-opens and closes as usual, and
    every call runs: none raises CircuitOpen."""
    cb = _metrics_only("shadow", half_open_probes=1)
    seen: list[tuple[Any, Any]] = []
    cb.add_listener(lambda t: seen.append((t.new, t.reason)))
    for _ in range(2):
        with pytest.raises(ConnectionError):
            through(driver, cb, fail_with(ConnectionError()))
    assert cb.state is OPEN
    for _ in range(3):
        assert through(driver, cb, ok) == "ok"
    stats = cb.statistics()
    assert stats.state is OPEN
    assert stats.rejected == 3
    assert stats.retry_after == 10.0
    assert cb.retry_after() == 0.0
    clock.advance(10)
    assert through(driver, cb, ok) == "ok"
    assert seen == [
        (OPEN, "failure_rate"),
        (HALF_OPEN, "open_interval_passed"),
        (CLOSED, "probes_succeeded"),
    ]


@FORMS
def test_metrics_only_calls_it_would_reject_count_for_nothing(
    driver: Driver, clock: Any, form: str
) -> None:
    """Calls let through an open metrics-only breaker are not counted:
    failures among them neither extend nor re-open anything."""
    cb = _metrics_only("uncounted")
    for _ in range(2):
        with pytest.raises(ConnectionError):
            through(driver, cb, fail_with(ConnectionError()), form)
    for _ in range(3):
        with pytest.raises(ConnectionError):
            through(driver, cb, fail_with(ConnectionError()), form)
    stats = cb.statistics()
    assert (stats.times_opened, stats.rejected) == (1, 3)


def test_metrics_only_admits_by_permit_and_forced(clock: Any) -> None:
    """acquire() and a forced opening never reject either."""
    cb = _metrics_only("permits")
    cb.force_open()
    assert cb.state is FORCED_OPEN
    permit = cb.acquire()
    permit.failure(ConnectionError())
    assert cb.statistics().rejected == 1
    assert cb.state is FORCED_OPEN


def test_metrics_only_rejections_are_reported(
    driver: Driver, clock: Any, telemetry: Telemetry
) -> None:
    """Would-be rejections are counted and are span events, marked
    metrics-only."""
    cb = _metrics_only("told-shadow")
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("outer"):
        for _ in range(2):
            with pytest.raises(ConnectionError):
                through(driver, cb, fail_with(ConnectionError("down")))
        through(driver, cb, ok)
    (span,) = telemetry.spans()
    change, rejected = span.events
    assert change.attributes["exception.type"] == "ConnectionError"
    assert rejected.name == "resilient.breaker.rejected"
    assert rejected.attributes["resilient.breaker.metrics_only"] == "true"
    assert telemetry.metrics()["resilient.breaker.rejections"] == 1


def test_metrics_only_refusals() -> None:
    """A metrics_only that is not a bool is refused naming the field, and
    so is switching an existing breaker's mode under the same name."""
    with pytest.raises(ConfigTypeError) as info:
        BreakerConfig(metrics_only=1)  # type: ignore[arg-type]
    assert info.value.field == "BreakerConfig.metrics_only"
    cb = resilient.breaker("mode", BreakerConfig())
    cb.acquire().success()
    with pytest.raises(ConfigError, match="metrics_only"):
        resilient.breaker("mode", BreakerConfig(metrics_only=True))


def test_metrics_only_policy_never_waits(clock: Any) -> None:
    """A policy over an open metrics-only breaker neither waits for it nor
    is rejected: each attempt runs."""
    calls: list[int] = []
    started = clock.now()
    policy = resilient.Policy(
        name="shadow-policy",
        attempts=3,
        backoff=resilient.Constant(0),
        breaker=small(metrics_only=True),
        budget=None,
    )

    @policy
    def call() -> str:
        calls.append(1)
        if len(calls) <= 4:
            raise ConnectionError
        return "ok"

    with pytest.raises(ConnectionError):
        call()
    assert resilient.breaker("shadow-policy").state is OPEN
    assert call() == "ok"
    assert len(calls) == 5
    assert clock.now() == started
