"""
A `DeadlineExceeded` that ended a policy's attempt says which policy, which
attempt, which of its limits (the attempt timeout, the budget, a deadline
around the call) and how long that limit was (issue 7 item 4: the audit
found only "attempt deadline exceeded" or "deadline exceeded").

Sync attempts see their deadline at `resilient.checkpoint`; async ones are
cancelled at it (asyncio's watchdog, trio's cancel scope), both on the
fake clock: the clock is moved past the deadline before the attempt first
suspends, so the deadline fires at that checkpoint without a real wait.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import resilient
from resilient.exceptions import DeadlineExceeded


if TYPE_CHECKING:
    from resilient.testing import FakeClock
    from tests.conftest import Driver


def _policy(**kw: Any) -> resilient.Policy:
    kw.setdefault("backoff", resilient.Constant(0))
    return resilient.Policy(name="payments", **kw)


def _raised(fn: Any, *args: Any, **kwargs: Any) -> DeadlineExceeded:
    with pytest.raises(DeadlineExceeded) as info:
        fn(*args, **kwargs)
    return info.value


def test_sync_attempt_timeout_names_policy_attempt_and_seconds(
    clock: FakeClock,
) -> None:
    """A sync attempt past the policy's timeout (seen at a checkpoint)
    fails with a message naming the policy, the attempt and the timeout's
    length, and the same in attributes."""
    seen: list[str] = []

    @_policy(attempts=2, timeout=0.5)
    def charge() -> None:
        clock.advance(1.0)
        try:
            resilient.checkpoint()
        except DeadlineExceeded as exc:
            seen.append(str(exc))  # What the attempt itself sees.
            raise

    exc = _raised(charge)
    assert str(exc) == (
        "attempt timeout of 0.500 s exceeded (policy 'payments', attempt 2)"
    )
    assert (exc.policy, exc.attempt, exc.limit, exc.seconds) == (
        "payments",
        2,
        "timeout",
        0.5,
    )
    assert seen == ["deadline exceeded"] * 2


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_async_attempt_timeout_names_policy_attempt_and_seconds(
    kind: str, clock: FakeClock
) -> None:
    """An async attempt cancelled at the policy's timeout (the watchdog on
    asyncio, a cancel scope on trio) fails with the policy, the attempt
    and the timeout's length in its message, for every attempt."""
    errors: list[str] = []

    def hook(event: resilient.RetryEvent) -> None:
        errors.append(str(event.exception))

    @_policy(attempts=3, timeout=0.25, before_sleep=hook)
    async def charge() -> None:
        clock.advance(1.0)
        await anyio.sleep(1)  # Cancelled at once: the deadline is past.

    exc = _raised(anyio.run, charge, backend=kind)
    assert [*errors, str(exc)] == [
        f"attempt timeout of 0.250 s exceeded (policy 'payments', attempt {n})"
        for n in (1, 2, 3)
    ]
    assert (exc.limit, exc.seconds, exc.attempt) == ("timeout", 0.25, 3)


def test_budget_names_the_policy_and_its_length(
    driver: Driver, clock: FakeClock
) -> None:
    """The policy's budget running out during an attempt (the bare first
    attempt included: no timeout, so it runs without the call's state)
    says it was the budget, and how long, sync and async alike."""

    def body() -> None:
        clock.advance(31.0)
        resilient.checkpoint()

    exc = _raised(driver.call, _policy(attempts=3, budget=30.0), body)
    assert str(exc) == (
        "budget of 30.000 s exceeded (policy 'payments', attempt 1)"
    )
    assert (exc.limit, exc.seconds) == ("budget", 30.0)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_async_budget_cancellation_names_the_budget(
    kind: str, clock: FakeClock
) -> None:
    """An async attempt cancelled at the budget (armed by the bare first
    attempt, no call state made on the way) is the budget's error, with
    its length."""

    @_policy(attempts=3, budget=30.0)
    async def charge() -> None:
        clock.advance(31.0)
        await anyio.sleep(1)

    exc = _raised(anyio.run, charge, backend=kind)
    assert str(exc) == (
        "budget of 30.000 s exceeded (policy 'payments', attempt 1)"
    )


def test_enclosing_deadline_is_named_as_such(
    driver: Driver, clock: FakeClock
) -> None:
    """A deadline around the call that ends an attempt is not called the
    policy's timeout: the message says it was an enclosing deadline and
    how far into the call it came."""
    policy = _policy(attempts=3, timeout=60.0, budget=120.0)

    def body() -> None:
        clock.advance(10.0)
        resilient.checkpoint()

    def run() -> Any:
        with resilient.deadline(5.0):
            return driver.call(policy, body)

    exc = _raised(run)
    assert str(exc) == (
        "enclosing deadline exceeded 5.000 s into the call "
        "(policy 'payments', attempt 1)"
    )
    assert (exc.limit, exc.seconds) == ("deadline", 5.0)


def test_block_form_names_the_timeout(
    driver: Driver, clock: FakeClock
) -> None:
    """The block form's attempts (`for attempt in retrying(...)`) carry
    the same message as the decorator's, sync and async."""

    def body(attempt: resilient.Attempt) -> None:
        clock.advance(1.0)
        resilient.checkpoint()

    exc = _raised(driver.block, _policy(attempts=2, timeout=0.5), body)
    assert str(exc) == (
        "attempt timeout of 0.500 s exceeded (policy 'payments', attempt 2)"
    )


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_async_block_form_cancelled_at_the_timeout(kind: str) -> None:
    """An async block cancelled at the policy's timeout (its own cancel
    scope, on the real clock: 5 ms) names the timeout and its length."""
    policy = _policy(attempts=2, timeout=0.005)

    async def main() -> None:
        async for attempt in resilient.retrying(policy):
            async with attempt:
                await anyio.sleep(1)

    exc = _raised(anyio.run, main, backend=kind)
    assert str(exc) == (
        "attempt timeout of 0.005 s exceeded (policy 'payments', attempt 2)"
    )


def test_the_innermost_policy_that_owns_the_limit_names_it(
    clock: FakeClock,
) -> None:
    """A policy inside another's attempt sees the outer timeout as a
    deadline around its call; once the error reaches the outer policy,
    whose timeout it is, the outer one names it."""
    inner = resilient.Policy(name="inner", attempts=1)
    outer = resilient.Policy(
        name="outer", attempts=1, timeout=2.0, retry_on=ValueError
    )
    seen: list[str] = []

    @inner
    def query() -> None:
        clock.advance(3.0)
        resilient.checkpoint()

    @outer
    def handler() -> None:
        try:
            query()
        except DeadlineExceeded as exc:
            seen.append(str(exc))
            raise

    exc = _raised(handler)
    assert seen == [
        (
            "enclosing deadline exceeded 2.000 s into the call "
            "(policy 'inner', attempt 1)"
        )
    ]
    assert str(exc) == (
        "attempt timeout of 2.000 s exceeded (policy 'outer', attempt 1)"
    )


def test_the_description_pickles_and_plain_deadlines_are_unchanged(
    clock: FakeClock,
) -> None:
    """The policy's account survives pickling (the message and the
    attributes); a deadline no policy's attempt ran into keeps its plain
    message and None attributes."""

    @_policy(attempts=1, timeout=0.5)
    def charge() -> None:
        clock.advance(1.0)
        resilient.checkpoint()

    exc = _raised(charge)
    back = pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes
    assert str(back) == str(exc)
    assert (back.policy, back.attempt, back.limit, back.seconds) == (
        "payments",
        1,
        "timeout",
        0.5,
    )

    def plain() -> None:
        with resilient.deadline(1.0):
            clock.advance(2.0)
            resilient.checkpoint()

    exc = _raised(plain)
    assert str(exc) == "deadline exceeded"
    assert (exc.policy, exc.attempt, exc.limit, exc.seconds) == (None,) * 4
