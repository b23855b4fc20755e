"""
Numbers past a float's range, and blocking sleeps on an event loop's thread.

Both were fixed in the hardening issue (item 9 and item 11) but had no test
of their own: an int like ``10**400`` used to raise `OverflowError` deep in
the scope, and `MonotonicClock.sleep` on a loop's thread used to block it.
"""

from __future__ import annotations

import math
import time

import anyio
import pytest

import resilient
from resilient import MonotonicClock
from resilient._core import _loops


HUGE = 10**400


def test_timeout_of_a_huge_int_sets_no_limit() -> None:
    """timeout(10**400) is a scope with no limit, not an OverflowError."""
    with resilient.timeout(HUGE) as scope:
        assert resilient.remaining() == math.inf
        assert resilient.remaining_or_none() is None
    assert not scope.cancelled_caught


def test_timeout_at_a_huge_int_sets_no_limit() -> None:
    """timeout_at(10**400) is a deadline that never comes."""
    with resilient.timeout_at(HUGE):
        assert resilient.remaining() == math.inf


def test_timeout_at_a_huge_negative_int_is_past() -> None:
    """timeout_at(-10**400) is a deadline already past: the block stops at
    its first checkpoint with TimedOut."""
    with pytest.raises(resilient.TimedOut):  # noqa: SIM117 - two scopes.
        with resilient.timeout_at(-HUGE):
            resilient.checkpoint()


def test_policy_refuses_a_huge_attempt_timeout_by_field() -> None:
    """Policy(timeout=10**400) is refused naming the field, not with an
    OverflowError: a policy's limits are finite, None means none."""
    with pytest.raises(resilient.ConfigError, match=r"Policy\.timeout.*None"):
        resilient.Policy(name="huge", timeout=HUGE)


async def test_huge_timeout_in_async_code(anyio_backend: str) -> None:
    """An async block under timeout(10**400) runs to its end."""
    with resilient.timeout(HUGE):
        assert resilient.remaining_or_none() is None


async def test_blocking_sleep_on_the_loop_thread_is_refused(
    anyio_backend: str,
) -> None:
    """MonotonicClock.sleep on a loop's thread raises and names asleep."""
    with pytest.raises(RuntimeError, match=r"asleep"):
        MonotonicClock().sleep(0.001)


async def test_zero_sleep_on_the_loop_thread_is_allowed(
    anyio_backend: str,
) -> None:
    """A zero sleep never blocks, so it is not refused."""
    assert _loops.current_async_library() == anyio_backend  # On the loop.
    before = time.monotonic()
    assert MonotonicClock().sleep(0) is None
    assert time.monotonic() - before < 0.5


async def test_async_sleep_on_the_loop_thread_works(
    anyio_backend: str,
) -> None:
    """The async form is what the refusal points to, and it works: even a
    zero wait is a checkpoint, so a cancelled scope stops at it."""
    reached = False
    with anyio.CancelScope() as scope:
        scope.cancel()
        await MonotonicClock().asleep(0)
        reached = True
    assert scope.cancelled_caught
    assert not reached
