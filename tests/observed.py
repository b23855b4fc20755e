"""
Helpers shared by the tests of what resilient tells an operator, its log
records (test_logging) and its spans and metrics (test_telemetry): a body
that fails a few times, a breaker that opens quickly, and a retried call
that a full bulkhead ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import resilient
from resilient import Constant, Policy
from tests.conftest import Driver


def flaky(
    times: int, exc: type[Exception] = ConnectionError
) -> Callable[[], str]:
    """A body that raises *exc* on its first *times* calls, then says ok."""
    calls: list[int] = []

    def body() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc(f"down {len(calls)}")
        return "ok"

    return body


def quick_breaker() -> resilient.BreakerConfig:
    """A breaker that opens on 2 failures in its last 2 calls, for 1 s."""
    return resilient.BreakerConfig(
        minimum_calls=2,
        window=resilient.CountWindow(size=2),
        open_interval=1.0,
        half_open_probes=1,
    )


def retry_into_a_full_bulkhead(driver: Driver) -> None:
    """
    A call of policy ``pool`` that fails, and whose retry finds the
    bulkhead ``pool`` full (a hook takes its one slot before the retry):
    the call ends with `BulkheadFull`. The slot is given back after.
    """
    config = resilient.BulkheadConfig(max_concurrent=1, max_wait=0)
    held: list[Any] = []

    def hold(event: object) -> None:
        held.append(resilient.bulkhead("pool", config).acquire())

    policy = Policy(
        name="pool",
        bulkhead=config,
        retry_on=(ConnectionError,),
        backoff=Constant(seconds=0),
        before_sleep=hold,
    )
    try:
        with pytest.raises(resilient.BulkheadFull):
            driver.call(policy, flaky(5))
    finally:
        for permit in held:
            permit.release()
    assert held, "the hook never ran: no retry was attempted"


def retry_into_a_non_retryable_error(driver: Driver, last: Exception) -> None:
    """
    A call of policy ``users`` whose first attempt fails with a retryable
    `ConnectionError` and whose retry raises *last*, which it does not
    retry: the call ends raising *last*.
    """
    replies: list[Exception] = [ConnectionError("reset"), last]

    def body() -> None:
        raise replies.pop(0)

    policy = Policy(
        name="users", retry_on=(ConnectionError,), backoff=Constant(seconds=0)
    )
    with pytest.raises(type(last)) as raised:
        driver.call(resilient.retry(policy), body)
    assert raised.value is last
    assert replies == []


def retry_past_a_breaker_that_opens(driver: Driver) -> None:
    """
    A call of policy ``outer`` (4 attempts, no budget, no backoff) whose
    function enters breaker ``inner`` itself: two failures open it, the
    third attempt is rejected, retry outwaits it and the fourth says ok.
    """
    breaker = resilient.breaker("inner", quick_breaker())
    replies = ["fail", "fail", "ok"]

    def body() -> str:
        with breaker:  # A rejection leaves the reply for the next attempt.
            reply = replies.pop(0)
            if reply == "fail":
                raise ConnectionError("refused")
            return reply

    policy = Policy(
        name="outer", attempts=4, budget=None, backoff=Constant(seconds=0)
    )
    assert driver.call(resilient.retry(policy), body) == "ok"
    assert replies == []
