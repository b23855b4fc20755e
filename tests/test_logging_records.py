"""
What a log record says, whole: one line, even for an exception whose
message has several (httpx's status errors have two), and a fallback's
answer said as such, not as a give-up.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

import resilient
from resilient import Constant, Policy
from tests.conftest import Driver
from tests.observed import flaky


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """resilient's records, in order."""
    return [r for r in caplog.records if r.name.startswith("resilient")]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture everything resilient logs, DEBUG included."""
    caplog.set_level(logging.DEBUG, logger="resilient")
    return caplog


def _unavailable() -> None:
    """An httpx 503, raised the way httpx raises it (two-line message)."""
    request = httpx.Request("GET", "https://api.example/items")
    httpx.Response(503, request=request).raise_for_status()


def test_an_httpx_status_error_is_logged_on_one_line(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """
    httpx's ``HTTPStatusError`` message is two lines ("Server error ...",
    "For more information check: ..."); each retry and give-up record is
    one line, the two joined with a space, in the message and in the
    ``exception_message`` field.
    """
    with pytest.raises(httpx.HTTPStatusError) as info:
        _unavailable()
    assert "\n" in str(info.value)
    policy = Policy(name="api", attempts=2, backoff=Constant(seconds=0.1))
    with pytest.raises(httpx.HTTPStatusError):
        driver.call(resilient.retry(policy), _unavailable)
    got = records(logs)
    assert len(got) == 2
    joined = " ".join(str(info.value).split("\n"))
    for record in got:
        assert "\n" not in record.getMessage()
        assert "\r" not in record.getMessage()
        assert record.exception_message == joined  # type: ignore[attr-defined]
        assert joined in record.getMessage()


def test_blank_and_windows_line_breaks_are_collapsed(
    clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """``\\r\\n`` breaks, blank lines and indentation make no extra lines
    or runs of spaces."""

    def body() -> None:
        raise ConnectionError("first\r\n\n   second  \rthird")

    policy = Policy(name="db", attempts=1)
    with pytest.raises(ConnectionError):
        resilient.retry(policy)(body)()
    (record,) = records(logs)
    assert record.getMessage().endswith(
        "raised ConnectionError: first second third; not retried (1 attempt)"
    )


def test_a_fallbacks_answer_is_logged_as_such(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """
    Retry runs out, and the fallback answers: the last record says the
    fallback answered (a WARNING, the dependency failed), with the
    attempts, the reason and the error it answered for, and no record
    says "gave up".
    """
    policy = Policy(
        name="prices",
        attempts=2,
        backoff=Constant(seconds=0.1),
        fallback=lambda exc: "cached",
    )
    assert driver.call(resilient.retry(policy), flaky(5)) == "cached"
    retry, answered = records(logs)
    assert retry.getMessage().startswith("resilient: 'prices' attempt 1")
    assert answered.levelno == logging.WARNING
    assert answered.getMessage() == (
        "resilient: the fallback answered for 'prices' after 2 attempts in "
        "0.100 s (attempts); the call raised ConnectionError: down 2"
    )
    assert answered.resilient_fallback is True  # type: ignore[attr-defined]
    assert answered.resilient_reason == "attempts"  # type: ignore[attr-defined]
    assert not any("gave up" in r.getMessage() for r in records(logs))


def test_a_fallback_that_raises_leaves_the_give_up(
    driver: Driver, clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A fallback that raises did not answer: the give-up is logged as
    without one; so is an error *fallback_on* does not hand over."""

    def refuse(exc: Exception) -> str:
        raise KeyError("no cache")

    for fallback_on in ((Exception,), (KeyError,)):
        logs.clear()
        policy = Policy(
            name="prices",
            attempts=2,
            backoff=Constant(seconds=0.1),
            fallback=refuse,
            fallback_on=fallback_on,
        )
        with pytest.raises((KeyError, ConnectionError)):
            driver.call(resilient.retry(policy), flaky(5))
        last = records(logs)[-1]
        assert last.getMessage().startswith(
            "resilient: gave up on 'prices' after 2 attempts"
        )
        assert not any("fallback" in r.getMessage() for r in records(logs))


def test_an_open_breakers_fallback_answer_names_the_rejection(
    clock: Any, logs: pytest.LogCaptureFixture
) -> None:
    """A call an open breaker refuses, answered by the fallback, is logged
    as the fallback's answer for `CircuitOpen`."""
    name = "fallback-breaker"
    breaker = resilient.BreakerConfig(
        window=resilient.CountWindow(2), minimum_calls=2, open_interval=60
    )
    policy = Policy(
        name=name,
        attempts=1,
        breaker=breaker,
        fallback=lambda exc: "cached",
    )
    for _ in range(2):
        assert policy.call(flaky(1)) == "cached"
    logs.clear()
    assert policy.call(flaky(1)) == "cached"
    messages = [r.getMessage() for r in records(logs)]
    assert messages[-1].startswith(
        f"resilient: the fallback answered for {name!r}"
    )
    assert "CircuitOpen" in messages[-1]
    assert not any("gave up" in m for m in messages)
