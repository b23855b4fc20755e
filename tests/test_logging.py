"""
Logs (issue 7 item 8): scheduled retries, give-ups and breaker state changes
on the standard library's `logging`, with structured ``extra`` fields, and
nothing built when the level is off. No OpenTelemetry SDK is configured.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

import resilient
import resilient.testing
from resilient import Constant, Policy
from resilient._core import _logging, _telemetry
from tests.conftest import Driver
from tests.observed import (
    flaky,
    quick_breaker,
    retry_into_a_full_bulkhead,
    retry_into_a_non_retryable_error,
    retry_past_a_breaker_that_opens,
)


class Unavailable(Exception):
    """A 503 from an HTTP client, with the response it carries."""

    def __init__(self, message: str = "service unavailable") -> None:
        super().__init__(message)
        self.status_code = 503


class NotFound(Exception):
    """A 404: the policy below does not retry it."""


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """resilient's records, in order."""
    return [r for r in caplog.records if r.name.startswith("resilient")]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture everything resilient logs, DEBUG included."""
    caplog.set_level(logging.DEBUG, logger="resilient")
    return caplog


def test_a_scheduled_retry_is_a_warning(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """Each scheduled retry is one WARNING on resilient.retry, with the
    policy, attempt, delay and its source, and the exception's type and
    message as fields."""
    policy = Policy(name="payments", backoff=Constant(seconds=0.5))
    assert driver.call(resilient.retry(policy), flaky(2)) == "ok"
    got = records(logs)
    assert [(r.name, r.levelno) for r in got] == [
        ("resilient.retry", logging.WARNING),
        ("resilient.retry", logging.WARNING),
    ]
    first = got[0]
    assert first.getMessage() == (
        "resilient: 'payments' attempt 1 raised ConnectionError: down 1; "
        "retrying in 0.500 s (backoff)"
    )
    fields = {k: v for k, v in vars(first).items() if k.startswith(_FIELDS)}
    assert fields == {
        "resilient_policy": "payments",
        "resilient_attempt": 1,
        "resilient_elapsed": 0.0,
        "resilient_delay": 0.5,
        "resilient_delay_source": "backoff",
        "exception_type": "ConnectionError",
        "exception_message": "down 1",
    }
    assert got[1].resilient_attempt == 2  # type: ignore[attr-defined]
    assert got[1].resilient_elapsed == 0.5  # type: ignore[attr-defined]
    assert first.exc_info is None  # No traceback per retry.


_FIELDS = ("resilient_", "exception_", "http_")


def test_a_give_up_is_a_warning_with_its_reason(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """Running out of attempts logs one give-up WARNING with the reason
    and the last error, after the retries' records."""
    policy = Policy(name="db", attempts=2, backoff=Constant(seconds=0.1))
    with pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), flaky(5))
    retry, give_up = records(logs)
    assert retry.levelno == logging.WARNING
    assert give_up.levelno == logging.WARNING
    assert give_up.name == "resilient.retry"
    assert give_up.getMessage() == (
        "resilient: gave up on 'db' after 2 attempts in 0.100 s (attempts); "
        "the last attempt raised ConnectionError: down 2"
    )
    assert give_up.resilient_reason == "attempts"  # type: ignore[attr-defined]
    assert give_up.resilient_attempt == 2  # type: ignore[attr-defined]
    assert give_up.exception_type == "ConnectionError"  # type: ignore[attr-defined]
    assert not hasattr(give_up, "resilient_delay")


def test_a_first_non_retryable_error_is_no_give_up(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A 404 on the first attempt is not a give-up: one DEBUG record says
    why it was not retried, nothing at WARNING."""
    policy = Policy(name="users", retry_on=(ConnectionError,))

    def body() -> None:
        raise NotFound("no user 7")

    with pytest.raises(NotFound):
        driver.call(resilient.retry(policy), body)
    (record,) = records(logs)
    assert record.levelno == logging.DEBUG
    assert record.resilient_reason == "not_retryable"  # type: ignore[attr-defined]
    assert record.exception_type == "tests.test_logging.NotFound"  # type: ignore[attr-defined]
    assert "not retried" in record.getMessage()


def test_a_non_retryable_error_after_retries_is_a_give_up(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A non-retryable error after a retry ends a retried call: a give-up
    WARNING with reason not_retryable."""
    retry_into_a_non_retryable_error(driver, NotFound("gone"))
    retry, give_up = records(logs)
    assert give_up.levelno == logging.WARNING
    assert give_up.resilient_reason == "not_retryable"  # type: ignore[attr-defined]
    assert "(not retryable)" in give_up.getMessage()


def test_a_retried_response_logs_its_status(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A retry on a result names the result's type and HTTP status, never
    its content; the give-up that keeps the last result says so too."""

    class Response:
        status_code = 503
        text = "secret body"

    policy = Policy(
        name="api",
        attempts=2,
        retry_if_result=lambda r: r.status_code == 503,
        backoff=Constant(seconds=0),
    )
    driver.call(resilient.retry(policy), Response)
    retry, give_up = records(logs)
    kind = f"{Response.__module__}.{Response.__qualname__}"
    assert retry.getMessage() == (
        f"resilient: 'api' attempt 1 returned {kind} (status 503); "
        "retrying in 0.000 s (backoff)"
    )
    assert retry.http_status_code == 503  # type: ignore[attr-defined]
    assert retry.resilient_result_type == kind  # type: ignore[attr-defined]
    assert not hasattr(retry, "exception_type")
    assert give_up.resilient_reason == "attempts"  # type: ignore[attr-defined]
    assert give_up.getMessage().endswith(f"returned {kind} (status 503)")
    assert all("secret body" not in r.getMessage() for r in records(logs))


def test_a_server_hint_is_the_delay_source(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A delay a server asked for (the exception's Retry-After) is logged
    as a hint, with the error's HTTP status."""

    class Throttled(Unavailable):
        retry_after = 2.0

    policy = Policy(name="api", retry_on=(Unavailable,), attempts=2)
    with pytest.raises(Throttled):
        driver.call(resilient.retry(policy), flaky(5, Throttled))
    retry = records(logs)[0]
    assert retry.resilient_delay == 2.0  # type: ignore[attr-defined]
    assert retry.resilient_delay_source == "hint"  # type: ignore[attr-defined]
    assert retry.http_status_code == 503  # type: ignore[attr-defined]
    assert retry.getMessage().endswith("retrying in 2.000 s (hint)")


def test_messages_are_left_out_on_request(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """With record_messages=False no exception message reaches a log
    record, neither its text nor its fields: only the type."""
    secret = "postgresql://app:s3cr3t@db/prod"  # noqa: S105 - a fake one

    def body() -> None:
        raise ConnectionError(f"cannot connect to {secret}")

    resilient.configure_telemetry(record_messages=False)
    try:
        policy = Policy(name="db", attempts=2, backoff=Constant(seconds=0))
        with pytest.raises(ConnectionError):
            driver.call(resilient.retry(policy), body)
    finally:
        resilient.configure_telemetry()
    got = records(logs)
    assert len(got) == 2
    for record in got:
        assert "s3cr3t" not in record.getMessage()
        assert "s3cr3t" not in repr(vars(record))
        assert record.exception_type == "ConnectionError"  # type: ignore[attr-defined]
        assert not hasattr(record, "exception_message")


def test_a_long_message_is_bounded(
    clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """An exception message is cut to TEXT_LIMIT characters in logs too."""

    def body() -> None:
        raise ConnectionError("x" * 10_000)

    policy = Policy(name="db", attempts=2, backoff=Constant(seconds=0))
    with pytest.raises(ConnectionError):
        resilient.retry(policy)(body)()
    got = records(logs)
    assert len(got) == 2
    for record in got:
        message = record.exception_message  # type: ignore[attr-defined]
        assert message == "x" * _telemetry.TEXT_LIMIT + "\u2026"
        assert len(record.getMessage()) < _telemetry.TEXT_LIMIT + 200


def test_an_unprintable_exception_is_logged_by_its_type(
    clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """An exception whose __str__ raises is logged, named by its type."""

    class Broken(ConnectionError):
        def __str__(self) -> str:
            raise RuntimeError

    def body() -> None:
        raise Broken

    policy = Policy(name="db", attempts=2, backoff=Constant(seconds=0))
    with pytest.raises(Broken):
        resilient.retry(policy)(body)()
    retry = records(logs)[0]
    assert retry.exception_message.startswith("<unprintable ")  # type: ignore[attr-defined]


def test_nothing_is_built_when_the_level_is_off(
    driver: Driver,
    clock: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With resilient's loggers above WARNING, a retried and given-up call
    logs nothing and builds no record's fields."""

    def refuse(*args: object) -> None:
        raise AssertionError("fields built while the level is off")

    monkeypatch.setattr(_logging, "_base", refuse)
    caplog.set_level(logging.ERROR, logger="resilient")
    policy = Policy(name="db", attempts=2, backoff=Constant(seconds=0))
    with pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), flaky(5))
    assert records(caplog) == []


def test_the_library_configures_no_handler() -> None:
    """No handler on resilient's loggers (not even a NullHandler, which
    would hide warnings from a script that configures no logging) and
    records propagate to the application's."""
    for name in ("resilient", "resilient.retry", "resilient.breaker"):
        log = logging.getLogger(name)
        assert log.handlers == []
        assert log.propagate


def test_the_block_form_logs_the_same(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """The block form's retries are logged like the decorator's."""
    policy = Policy(name="blk", backoff=Constant(seconds=0.25))
    body = flaky(1)
    assert driver.block(policy, lambda a: body()) == "ok"
    (record,) = records(logs)
    assert record.levelno == logging.WARNING
    assert record.resilient_policy == "blk"  # type: ignore[attr-defined]
    assert record.resilient_delay == 0.25  # type: ignore[attr-defined]


def test_testing_mode_still_logs(
    driver: Driver, logs: pytest.LogCaptureFixture
) -> None:
    """In testing mode retries are logged with their zero delay and the
    source that would have applied."""
    policy = Policy(name="t", backoff=Constant(seconds=3))
    with resilient.testing.set_testing(True):
        assert driver.call(resilient.retry(policy), flaky(1)) == "ok"
    (record,) = records(logs)
    assert record.resilient_delay == 0.0  # type: ignore[attr-defined]
    assert record.resilient_delay_source == "backoff"  # type: ignore[attr-defined]


# -- Breakers ---------------------------------------------------------------


def test_breaker_transitions_are_logged(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """Opening is a WARNING on resilient.breaker; half-opening and closing
    are INFO; each with the breaker, both states, the reason and the wait
    as fields."""
    breaker = resilient.breaker("users", quick_breaker())

    def fail() -> None:
        raise ConnectionError("refused")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            driver.call(breaker, fail)
    clock.advance(1.0)
    assert driver.call(breaker, lambda: "ok") == "ok"
    got = [r for r in records(logs) if r.name == "resilient.breaker"]
    assert [(r.levelno, r.resilient_breaker_state) for r in got] == [  # type: ignore[attr-defined]
        (logging.WARNING, "open"),
        (logging.INFO, "half_open"),
        (logging.INFO, "closed"),
    ]
    opened = got[0]
    assert opened.getMessage() == (
        "resilient: breaker 'users' closed -> open (failure rate) after "
        "ConnectionError: refused; next probe in 1.000 s"
    )
    fields = {k: v for k, v in vars(opened).items() if k.startswith(_FIELDS)}
    assert fields == {
        "resilient_breaker": "users",
        "resilient_breaker_from": "closed",
        "resilient_breaker_state": "open",
        "resilient_breaker_reason": "failure_rate",
        "resilient_breaker_retry_after": 1.0,
        "exception_type": "ConnectionError",
        "exception_message": "refused",
    }
    assert got[2].getMessage() == (
        "resilient: breaker 'users' half_open -> closed (probes succeeded)"
    )


def test_a_forced_open_breaker_is_logged_until_reset(
    logs: pytest.LogCaptureFixture,
) -> None:
    """Forcing a breaker open is a WARNING that says it waits for a reset;
    the reset is INFO."""
    breaker = resilient.breaker("forced", quick_breaker())
    breaker.force_open()
    breaker.reset()
    forced, reset = records(logs)
    assert forced.levelno == logging.WARNING
    assert forced.getMessage().endswith("(forced); until reset")
    assert reset.levelno == logging.INFO
    assert reset.resilient_breaker_reason == "reset"  # type: ignore[attr-defined]


def test_an_outwaited_rejection_is_info(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """An attempt an open breaker rejected, which retry outwaits, is an
    INFO record naming the breaker (its opening was the warning)."""
    retry_past_a_breaker_that_opens(driver)
    rejected = [r for r in records(logs) if r.levelno == logging.INFO]
    rejected = [r for r in rejected if r.name == "resilient.retry"]
    (record,) = rejected
    assert record.resilient_breaker == "inner"  # type: ignore[attr-defined]
    assert record.resilient_delay_source == "admission"  # type: ignore[attr-defined]
    assert record.exception_type == "resilient.exceptions.CircuitOpen"  # type: ignore[attr-defined]
    assert record.resilient_attempt == 3  # type: ignore[attr-defined]
    assert "rejected by breaker 'inner' (open)" in record.getMessage()


def test_a_bulkhead_rejection_names_the_bulkhead() -> None:
    """The words and fields for a stage's rejection name a bulkhead, or
    the rejection's type for any other stage."""
    extra: dict[str, object] = {}
    full = resilient.BulkheadFull("pool", "full", 2, 0.0)
    assert _logging._stage(extra, full) == "bulkhead 'pool' (full)"
    assert extra == {"resilient_bulkhead": "pool"}
    other = resilient.Rejected()
    assert _logging._stage({}, other) == "resilient.exceptions.Rejected"
    assert _logging._stage({}, None) == "a stage"


def test_one_allowed_attempt_is_no_give_up(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A policy that allows one attempt logs its failure at DEBUG, not as
    a give-up."""
    policy = Policy(name="once", attempts=1)
    with pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), flaky(5))
    (record,) = records(logs)
    assert record.levelno == logging.DEBUG
    assert record.resilient_reason == "attempts"  # type: ignore[attr-defined]
    assert record.getMessage().endswith("; not retried (1 attempt)")


def test_the_failure_that_opened_a_breaker_is_logged(
    logs: pytest.LogCaptureFixture,
) -> None:
    """A transition that says which failure opened the breaker
    (``opened_by``) is logged with that failure's type, status and
    message, and without the message when messages are left out."""
    event = types.SimpleNamespace(
        name="users",
        old=resilient.BreakerState.CLOSED,
        new=resilient.BreakerState.OPEN,
        reason="failure_rate",
        at=0.0,
        retry_after=30.0,
        opened_by=Unavailable("503 from users"),
    )
    _logging.breaker_transition(event)  # type: ignore[arg-type]
    resilient.configure_telemetry(record_messages=False)
    try:
        _logging.breaker_transition(event)  # type: ignore[arg-type]
    finally:
        resilient.configure_telemetry()
    full, bare = records(logs)
    assert full.getMessage() == (
        "resilient: breaker 'users' closed -> open (failure rate) after "
        "tests.test_logging.Unavailable: 503 from users; "
        "next probe in 30.000 s"
    )
    assert full.exception_type == "tests.test_logging.Unavailable"  # type: ignore[attr-defined]
    assert full.http_status_code == 503  # type: ignore[attr-defined]
    assert "503 from users" not in bare.getMessage()
    assert not hasattr(bare, "exception_message")


def test_a_full_bulkhead_that_ends_a_retried_call_is_logged(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A policy's bulkhead that refuses a retry ends the call with a
    give-up record naming the bulkhead."""
    retry_into_a_full_bulkhead(driver)
    give_up = records(logs)[-1]
    assert give_up.levelno == logging.WARNING
    assert give_up.resilient_bulkhead == "pool"  # type: ignore[attr-defined]
    assert give_up.exception_type == "resilient.exceptions.BulkheadFull"  # type: ignore[attr-defined]


def test_a_breaker_that_will_not_admit_in_time_is_a_give_up(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A retry that an open breaker would hold past the budget gives up
    with reason breaker_open, naming the breaker."""
    breaker = resilient.breaker("slowpoke", quick_breaker())
    breaker.force_open()

    def body() -> str:
        with breaker:
            return "ok"

    policy = Policy(name="outer", budget=5.0, backoff=Constant(seconds=0))
    with pytest.raises(resilient.CircuitOpen):
        driver.call(resilient.retry(policy), body)
    give_up = records(logs)[-1]
    assert give_up.resilient_reason == "breaker_open"  # type: ignore[attr-defined]
    assert give_up.resilient_breaker == "slowpoke"  # type: ignore[attr-defined]


class Raising(logging.Handler):
    """A handler whose emit raises, as a broken network handler does."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.calls = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.calls += 1
        raise RuntimeError("the log shipper is down")

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        # Not through Handler.handle's lock only: emit raises through it.
        self.emit(record)
        return True


@pytest.fixture
def raising(
    capsys: pytest.CaptureFixture[str],
) -> Any:
    """A raising handler on resilient's logger, every level on."""
    handler = Raising()
    logger = logging.getLogger("resilient")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_a_raising_handler_changes_no_retry(
    driver: Driver, clock: Any, raising: Raising
) -> None:
    """
    A handler that raises while resilient logs a retry, a rejection, a
    give-up, a breaker's change or a hook's failure changes nothing: the
    retries go on and the call ends as it would have (on 4f15275 the
    handler's error ended the call at the first retry's record).
    """
    policy = Policy(name="logged", attempts=3, backoff=Constant(seconds=0))
    assert driver.call(policy, flaky(2)) == "ok"
    with pytest.raises(ConnectionError, match="down 3"):
        driver.call(policy, flaky(3))

    def bad_hook(event: object) -> None:
        raise ValueError("hook")

    hooked = policy.evolve(before_sleep=bad_hook)
    assert driver.call(hooked, flaky(1)) == "ok"
    retry_past_a_breaker_that_opens(driver)
    assert raising.calls >= 6
