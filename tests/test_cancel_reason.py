"""
`TimeoutScope.cancel(reason)`: a scope cancelled with a reason stops its
block like a plain cancel, `checkpoint()` inside raises the reason, and
leaving the scope raises it unless the block is already raising something
else; sync (from this or another thread), asyncio and trio (from another
task or another thread). What the distributed locks build on to stop a
block whose lease is lost.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient import _timeout
from resilient._core import _clock
from resilient.testing import FakeClock


REAL_SLEEP = 5.0  # What a woken sleep would have waited.
PROMPTLY = 1.0  # "Woke at once", with room for a loaded machine.


class LeaseLost(Exception):
    """Stands for the lock helper's LockLost."""


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """Every test leaves no scope or deadline behind."""
    yield
    assert _clock._SCOPE.get() is None
    assert _clock.current_deadline() == math.inf
    assert _timeout._ALARMS == []


def _cancel_soon(
    scope: resilient.TimeoutScope, reason: BaseException
) -> threading.Thread:
    """Cancel *scope* with *reason* from another thread, shortly."""

    def later() -> None:
        time.sleep(0.01)
        scope.cancel(reason)

    thread = threading.Thread(target=later)
    thread.start()
    return thread


# -- Sync --------------------------------------------------------------------


def test_a_woken_sleep_leaves_with_the_reason(clock: FakeClock) -> None:
    """A sleep inside a scope cancelled with a reason wakes, and leaving
    raises the reason, not a timeout; `cancel_reason` tells it."""
    reason = LeaseLost("lease lost")
    with pytest.raises(LeaseLost) as info, resilient.timeout(10) as scope:
        scope.cancel(reason)
        clock.sleep(REAL_SLEEP)
        pytest.fail("the sleep did not wake")  # pragma: no cover
    assert info.value is reason
    assert scope.cancel_reason is reason
    assert scope.cancelled_caught
    assert scope.cancelled
    assert not scope.expired
    assert not isinstance(info.value, resilient.TimedOut)
    assert clock.now() == 1000.0


def test_checkpoint_raises_the_reason(clock: FakeClock) -> None:
    """`resilient.checkpoint()` inside the scope raises the reason itself."""
    reason = LeaseLost("gone")
    seen: list[BaseException] = []
    with pytest.raises(LeaseLost), resilient.timeout(None) as scope:
        scope.cancel(reason)
        try:
            resilient.checkpoint()
        except LeaseLost as exc:
            seen.append(exc)
            raise
    assert seen == [reason]


def test_checkpoint_in_an_inner_scope_raises_the_outer_reason(
    clock: FakeClock,
) -> None:
    """An inner scope lets the outer scope's reason through untouched."""
    reason = LeaseLost("outer")
    with (
        pytest.raises(LeaseLost) as info,
        resilient.timeout(None) as outer,
        resilient.timeout(5) as inner,
    ):
        outer.cancel(reason)
        clock.sleep(1)
    assert info.value is reason
    assert not inner.cancelled_caught
    assert outer.cancelled_caught


def test_a_block_that_ends_leaves_with_the_reason(clock: FakeClock) -> None:
    """A block that never waits still leaves with the reason."""
    reason = LeaseLost("late")
    with pytest.raises(LeaseLost), resilient.timeout(None) as scope:
        scope.cancel(reason)
    assert not scope.cancelled_caught


def test_the_block_own_error_wins(clock: FakeClock) -> None:
    """A block already raising another exception keeps it."""
    with pytest.raises(KeyError), resilient.timeout(None) as scope:
        scope.cancel(LeaseLost("ignored"))
        raise KeyError("mine")


def test_the_first_reason_wins(clock: FakeClock) -> None:
    """A later reason, or a plain cancel, does not replace the first."""
    first, second = LeaseLost("first"), LeaseLost("second")
    with pytest.raises(LeaseLost) as info, resilient.timeout(None) as scope:
        scope.cancel(first)
        scope.cancel()
        scope.cancel(second)
    assert info.value is first


def test_a_reason_before_entry_applies(clock: FakeClock) -> None:
    """A scope cancelled with a reason before it is entered stops at its
    first wait and leaves with the reason."""
    reason = LeaseLost("early")
    scope = resilient.timeout(None)
    scope.cancel(reason)
    with pytest.raises(LeaseLost), scope:
        clock.sleep(REAL_SLEEP)
    assert clock.now() == 1000.0


def test_a_reason_after_exit_does_nothing(clock: FakeClock) -> None:
    """Cancelling a scope that was left, with a reason, changes nothing."""
    with resilient.timeout(None) as scope:
        pass
    scope.cancel(LeaseLost("after"))
    assert scope.cancel_reason is not None
    assert not scope.cancelled_caught


def test_the_own_deadline_first_is_a_timeout(clock: FakeClock) -> None:
    """A scope whose deadline fired before the reason came times out."""
    with pytest.raises(resilient.TimedOut), resilient.timeout(1) as scope:
        try:
            clock.sleep(5)
        except resilient.ScopeCancelled:
            scope.cancel(LeaseLost("too late"))
            raise


def test_a_plain_cancel_is_unchanged(clock: FakeClock) -> None:
    """Without a reason, the scope still ends quietly."""
    with resilient.timeout(None) as scope:
        scope.cancel()
        clock.sleep(REAL_SLEEP)
    assert scope.cancelled_caught
    assert scope.cancel_reason is None


@pytest.mark.parametrize("bad", ["lost", LeaseLost, 3])
def test_a_reason_must_be_an_exception(bad: object) -> None:
    """A reason that is not an exception instance is refused, and the
    scope is not cancelled."""
    scope = resilient.timeout(None)
    with pytest.raises(TypeError, match="exception instance"):
        scope.cancel(bad)  # type: ignore[arg-type]
    assert not scope.cancelled


def test_cancel_with_a_reason_from_another_thread() -> None:
    """A real sleep wakes when another thread cancels with a reason; the
    scope leaves with it."""
    reason = LeaseLost("from the renewer")
    start = time.monotonic()
    with pytest.raises(LeaseLost) as info, resilient.timeout(None) as scope:
        thread = _cancel_soon(scope, reason)
        _clock.get_clock().sleep(REAL_SLEEP)
    thread.join()
    assert info.value is reason
    assert time.monotonic() - start < PROMPTLY


def test_wakers_fire_on_cancel_with_a_reason(clock: FakeClock) -> None:
    """Other primitives' waits (`wake_on_cancel`) wake on a reason too."""
    woken: list[str] = []
    with pytest.raises(LeaseLost), resilient.timeout(None) as scope:
        with _timeout.wake_on_cancel(lambda: woken.append("woken")):
            scope.cancel(LeaseLost())
        assert woken == ["woken"]
        _timeout.check_scope()


def test_retry_inside_is_not_retried(clock: FakeClock) -> None:
    """A retried call inside a scope cancelled with a reason stops at its
    backoff sleep; the reason comes out, with no further attempt."""
    calls: list[int] = []
    reason = LeaseLost("lost")

    @resilient.Policy(name="cancel-reason", attempts=5)
    def work() -> None:
        calls.append(1)
        scope.cancel(reason)
        raise ConnectionError("flaky")

    with pytest.raises(LeaseLost), resilient.timeout(None) as scope:
        work()
    assert calls == [1]


@pytest.mark.skipif(
    not hasattr(__import__("signal"), "setitimer"), reason="no SIGALRM"
)
def test_an_interrupting_scope_leaves_with_the_reason() -> None:
    """An interrupting scope cancelled with a reason from another thread
    interrupts a plain `time.sleep` and leaves with the reason."""
    reason = LeaseLost("interrupted")
    start = time.monotonic()
    with (
        pytest.raises(LeaseLost) as info,
        resilient.timeout(None, interrupt=True) as scope,
    ):
        thread = _cancel_soon(scope, reason)
        time.sleep(REAL_SLEEP)
    thread.join()
    assert info.value is reason
    assert time.monotonic() - start < PROMPTLY


# -- Async -------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_cancel_with_a_reason() -> None:
    """`async with`: the block is cancelled and the reason comes out."""
    reason = LeaseLost("async")
    with pytest.raises(LeaseLost) as info:
        async with resilient.timeout(None) as scope:
            scope.cancel(reason)
            await anyio.sleep(REAL_SLEEP)
            pytest.fail("not cancelled")  # pragma: no cover
    assert info.value is reason
    assert scope.cancelled_caught
    assert not isinstance(info.value, resilient.TimedOut)


@pytest.mark.anyio
async def test_async_cancel_from_another_task() -> None:
    """Another task cancels the scope with a reason; the sleeping block is
    cancelled and leaves with it."""
    reason = LeaseLost("other task")
    scopes: list[resilient.TimeoutScope] = []
    caught: list[BaseException] = []
    ready = anyio.Event()

    async def guarded() -> None:
        try:
            async with resilient.timeout(None) as scope:
                scopes.append(scope)
                ready.set()
                await anyio.sleep(REAL_SLEEP)
        except LeaseLost as exc:
            caught.append(exc)

    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(guarded)
        await ready.wait()
        scopes[0].cancel(reason)
    assert caught == [reason]
    assert time.monotonic() - start < PROMPTLY


@pytest.mark.anyio
async def test_async_cancel_from_another_thread() -> None:
    """Another thread cancels the async scope with a reason (through the
    loop's thread-safe hand-off); the block leaves with it."""
    reason = LeaseLost("other thread")
    start = time.monotonic()
    with pytest.raises(LeaseLost) as info:
        async with resilient.timeout(None) as scope:
            thread = _cancel_soon(scope, reason)
            await anyio.sleep(REAL_SLEEP)
    thread.join()
    assert info.value is reason
    assert time.monotonic() - start < PROMPTLY


@pytest.mark.anyio
async def test_async_checkpoint_raises_the_reason() -> None:
    """`resilient.checkpoint()` in async code raises the reason too."""
    reason = LeaseLost("checked")
    with pytest.raises(LeaseLost) as info:
        async with resilient.timeout(None) as scope:
            scope.cancel(reason)
            resilient.checkpoint()
    assert info.value is reason


@pytest.mark.anyio
async def test_async_block_own_error_wins() -> None:
    """An async block already raising another exception keeps it."""
    with pytest.raises(KeyError):
        async with resilient.timeout(None) as scope:
            scope.cancel(LeaseLost())
            raise KeyError("mine")


@pytest.mark.anyio
async def test_async_block_that_ends_leaves_with_the_reason() -> None:
    """An async block that finishes before the cancellation is delivered
    still leaves with the reason."""
    with pytest.raises(LeaseLost):
        async with resilient.timeout(None) as scope:
            scope.cancel(LeaseLost())


@pytest.mark.anyio
async def test_async_inner_scope_lets_the_reason_through() -> None:
    """An inner async scope does not claim the outer scope's reason."""
    reason = LeaseLost("outer")
    with pytest.raises(LeaseLost) as info:
        async with (
            resilient.timeout(None) as outer,
            resilient.timeout(REAL_SLEEP) as inner,
        ):
            outer.cancel(reason)
            await anyio.sleep(REAL_SLEEP)
    assert info.value is reason
    assert not inner.cancelled_caught
    await anyio.lowlevel.checkpoint()
