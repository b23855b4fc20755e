"""
Timeouts and cancellation scopes: `resilient.timeout` and `timeout_at`, sync
and async, nesting, cancellation from other threads, the main-thread
interrupt, and the deadline header helpers.

Virtual time wherever it can be: the `clock` fixture (FakeClock) for sync
and async scopes, trio's MockClock for anyio cancel scopes on trio. Where a
real wait is the point (another thread waking a sleep, SIGALRM), the target
is a 5 s sleep stopped after about 10 ms, and the check is only that it
woke well before its end.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import resilient
from resilient import _timeout
from resilient._core import _clock
from resilient.testing import FakeClock

from .conftest import Driver


REAL_SLEEP = 5.0  # What a woken sleep would have waited.
PROMPTLY = 1.0  # "Woke at once", with room for a loaded machine.

needs_alarm = pytest.mark.skipif(
    not hasattr(signal, "setitimer"), reason="no SIGALRM on this platform"
)


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """Every test leaves no scope, deadline, handler or timer behind."""
    handler = signal.getsignal(signal.SIGALRM) if _has_alarm() else None
    yield
    assert _clock._SCOPE.get() is None
    assert _clock.current_deadline() == math.inf
    assert _timeout._ALARMS == []
    if _has_alarm():
        assert signal.getsignal(signal.SIGALRM) is handler
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def _has_alarm() -> bool:
    return hasattr(signal, "setitimer")


def run_in_scopes(
    driver: Driver,
    scopes: list[resilient.TimeoutScope],
    clock: FakeClock,
    seconds: float,
) -> None:
    """Enter *scopes* (outermost first) and sleep *seconds* on *clock*."""
    if not driver.is_async:
        with contextlib.ExitStack() as stack:
            for scope in scopes:
                stack.enter_context(scope)
            clock.sleep(seconds)
        return

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for scope in scopes:
                await stack.enter_async_context(scope)
            await clock.asleep(seconds)

    anyio.run(main, backend=driver.kind)


# -- One scenario, three shells, virtual time --------------------------------


def test_timeout_fires_in_virtual_time(
    driver: Driver, clock: FakeClock
) -> None:
    """
    A sleep past the scope's deadline stops at the deadline and the scope
    raises TimedOut (a TimeoutError and a DeadlineExceeded) naming itself.
    """
    scope = resilient.timeout(2.0)
    with pytest.raises(resilient.TimedOut) as info:
        run_in_scopes(driver, [scope], clock, 10.0)
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, resilient.DeadlineExceeded)
    assert info.value.scope is scope
    assert info.value.deadline == scope.at == 1002.0
    assert clock.now() == 1002.0
    assert scope.cancelled_caught
    assert scope.expired
    assert not scope.cancelled


def test_sleep_within_the_deadline_returns(
    driver: Driver, clock: FakeClock
) -> None:
    """A sleep that ends before the deadline is untouched."""
    scope = resilient.timeout(2.0)
    run_in_scopes(driver, [scope], clock, 1.5)
    assert clock.now() == 1001.5
    assert not scope.cancelled_caught
    assert scope.remaining() == 0.5


def test_outer_firing_raises_for_the_outer(
    driver: Driver, clock: FakeClock
) -> None:
    """
    An inner scope with more time is cut short by the outer one; the outer
    one raises, and the inner one did not catch anything.
    """
    outer, inner = resilient.timeout(1.0), resilient.timeout(5.0)
    with pytest.raises(resilient.TimedOut) as info:
        run_in_scopes(driver, [outer, inner], clock, 10.0)
    assert info.value.scope is outer
    assert outer.cancelled_caught
    assert not inner.cancelled_caught
    assert inner.at == outer.at == 1001.0
    assert clock.now() == 1001.0


def test_inner_firing_raises_for_the_inner(
    driver: Driver, clock: FakeClock
) -> None:
    """A shorter inner scope raises for itself; the outer sees it pass."""
    outer, inner = resilient.timeout(5.0), resilient.timeout(1.0)
    with pytest.raises(resilient.TimedOut) as info:
        run_in_scopes(driver, [outer, inner], clock, 10.0)
    assert info.value.scope is inner
    assert inner.cancelled_caught
    assert not outer.cancelled_caught


def test_same_deadline_belongs_to_the_outer(
    driver: Driver, clock: FakeClock
) -> None:
    """Two scopes ending at the same instant: the outer one owns it."""
    outer, inner = resilient.timeout_at(1003.0), resilient.timeout_at(1003.0)
    with pytest.raises(resilient.TimedOut) as info:
        run_in_scopes(driver, [outer, inner], clock, 10.0)
    assert info.value.scope is outer


def test_plain_deadline_between_scopes_raises_deadline_exceeded(
    driver: Driver, clock: FakeClock
) -> None:
    """
    A cooperative `resilient.deadline()` between two scopes that is the
    first to pass raises a plain DeadlineExceeded, not either scope's
    TimedOut.
    """
    outer, inner = resilient.timeout(10.0), resilient.timeout(5.0)
    with pytest.raises(resilient.DeadlineExceeded) as info:
        if driver.is_async:

            async def main() -> None:
                async with outer:
                    with resilient.deadline(1.0):
                        async with inner:
                            await clock.asleep(10.0)

            anyio.run(main, backend=driver.kind)
        else:
            with outer, resilient.deadline(1.0), inner:
                clock.sleep(10.0)
    assert type(info.value) is resilient.DeadlineExceeded
    assert info.value.deadline == 1001.0
    assert not outer.cancelled_caught


def test_cancel_before_sleep_ends_the_block_quietly(
    driver: Driver, clock: FakeClock
) -> None:
    """
    After cancel() the next sleep raises at once without moving the clock,
    and the scope ends its block without an exception.
    """
    reached: list[str] = []
    scope = resilient.timeout(None)

    def body() -> None:
        scope.cancel()
        reached.append("before")

    if driver.is_async:

        async def main() -> None:
            async with scope:
                body()
                await clock.asleep(3.0)
                reached.append("after")

        anyio.run(main, backend=driver.kind)
    else:
        with scope:
            body()
            clock.sleep(3.0)
            reached.append("after")
    assert reached == ["before"]
    assert clock.now() == 1000.0
    assert scope.cancelled
    assert scope.cancelled_caught
    assert scope.remaining() == 0.0


def test_cancelling_the_outer_scope_stops_the_inner_block(
    driver: Driver, clock: FakeClock
) -> None:
    """Cancelling an outer scope stops a sleep in an inner one; the outer
    scope catches it and the inner one lets it through."""
    outer, inner = resilient.timeout(None), resilient.timeout(5.0)
    outer.cancel()  # Before entry: the scope starts cancelled.
    run_in_scopes(driver, [outer, inner], clock, 3.0)
    assert clock.now() == 1000.0
    assert outer.cancelled_caught
    assert not inner.cancelled_caught
    assert inner.cancelled


def test_checkpoint_raises_the_scope_timeout(clock: FakeClock) -> None:
    """
    `resilient.checkpoint()` after the scope's deadline (virtual time)
    stops the block, and the scope turns it into its own TimedOut.
    """
    with pytest.raises(resilient.TimedOut) as info, resilient.timeout(1) as s:
        clock.advance(1.0)
        resilient.checkpoint()
    assert info.value.scope is s
    assert isinstance(info.value.__cause__, resilient.DeadlineExceeded)


def test_inner_plain_deadline_passes_through(clock: FakeClock) -> None:
    """A shorter cooperative deadline inside a scope raises its own
    DeadlineExceeded, which the scope leaves alone."""
    with (
        pytest.raises(resilient.DeadlineExceeded) as info,
        resilient.timeout(5) as s,
        resilient.deadline(1),
    ):
        clock.advance(2.0)
        resilient.checkpoint()
    assert type(info.value) is resilient.DeadlineExceeded
    assert not s.cancelled_caught


def test_late_body_keeps_its_result(clock: FakeClock) -> None:
    """
    Sync code that overruns without waiting or checking is not stopped
    (without `interrupt`): the block finishes and nothing is raised, but
    the scope says it expired.
    """
    with resilient.timeout(1.0) as scope:
        clock.advance(5.0)  # Busy work that never checks.
        result = "done"
    assert result == "done"
    assert scope.expired
    assert not scope.cancelled_caught


# -- Deadlines: only shrink, seen underneath, reset on exit ------------------


def test_scope_sets_the_deadline_and_resets_it(clock: FakeClock) -> None:
    """Inside: `remaining()` is the scope's; outside: as before."""
    assert resilient.remaining() == math.inf
    with resilient.timeout(timedelta(seconds=3)) as scope:
        assert resilient.remaining() == 3.0
        assert scope.remaining() == 3.0
        assert _clock.current_deadline() == scope.at == 1003.0
        assert _clock._SCOPE.get() is scope
    assert resilient.remaining() == math.inf
    assert _clock._SCOPE.get() is None


def test_inner_scope_only_shrinks(clock: FakeClock) -> None:
    """A longer inner scope keeps the outer deadline; a shorter one wins."""
    with resilient.timeout(2.0) as outer:
        with resilient.timeout(10.0) as longer:
            assert longer.at == outer.at == 1002.0
            assert resilient.remaining() == 2.0
        with resilient.timeout_at(1001.0) as shorter:
            assert shorter.at == 1001.0
            assert resilient.remaining() == 1.0
        assert resilient.remaining() == 2.0


def test_scope_inside_a_plain_deadline_is_clipped(clock: FakeClock) -> None:
    """The scope nests with the foundation's `resilient.deadline()`."""
    with resilient.deadline(1.0), resilient.timeout(5.0) as scope:
        assert scope.at == 1001.0
        assert scope.remaining() == 1.0


def test_no_limit_scope(clock: FakeClock) -> None:
    """timeout(None) and timeout_at(None) add no deadline but can cancel."""
    for scope in (resilient.timeout(None), resilient.timeout_at(None)):
        with scope:
            assert scope.remaining() == math.inf
            assert not scope.expired
            clock.sleep(1e6)
        assert not scope.cancelled_caught


def test_scope_state_is_reset_after_an_exception(clock: FakeClock) -> None:
    """An exception leaving the block resets the deadline and the scope."""
    with pytest.raises(KeyError), resilient.timeout(1.0):
        raise KeyError
    assert _clock._SCOPE.get() is None
    assert resilient.remaining() == math.inf


def test_a_scope_is_entered_once(clock: FakeClock) -> None:
    """Entering a scope a second time is a programming error."""
    scope = resilient.timeout(1.0)
    with scope:
        pass
    with pytest.raises(RuntimeError, match="only once"), scope:
        pass  # pragma: no cover


def test_repr(clock: FakeClock) -> None:
    """The repr shows what was asked and the scope's state."""
    scope = resilient.timeout(1.5)
    assert repr(scope) == "<TimeoutScope seconds=1.5 new>"
    with scope:
        assert "entered" in repr(scope)
    assert repr(resilient.timeout_at(7)) == "<TimeoutScope at=7.0 new>"


def test_cancel_after_exit_is_harmless(clock: FakeClock) -> None:
    """cancel() on a finished scope only marks it."""
    with resilient.timeout(1.0) as scope:
        pass
    scope.cancel()
    assert scope.cancelled
    assert not scope.cancelled_caught


# -- Configuration -----------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan])
def test_bad_seconds(bad: float) -> None:
    """A negative or NaN timeout is refused, naming the setting."""
    with pytest.raises(resilient.ConfigError, match=r"timeout\(seconds\)"):
        resilient.timeout(bad)


@pytest.mark.parametrize("bad", ["1", True, [1]])
def test_bad_seconds_type(bad: Any) -> None:
    """A timeout that is not a number, timedelta or None is refused."""
    with pytest.raises(resilient.ConfigTypeError, match=r"timeout\(seconds"):
        resilient.timeout(bad)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (math.nan, resilient.ConfigError),
        ("soon", resilient.ConfigTypeError),
        (False, resilient.ConfigTypeError),
    ],
)
def test_bad_absolute_deadline(bad: Any, error: type[Exception]) -> None:
    """timeout_at() refuses NaN and non-numbers."""
    with pytest.raises(error, match=r"timeout_at\(deadline\)"):
        resilient.timeout_at(bad)


def test_bad_interrupt_flag() -> None:
    """interrupt= takes a bool only."""
    with pytest.raises(resilient.ConfigTypeError, match="interrupt"):
        resilient.timeout(1, interrupt=1)  # type: ignore[arg-type]


# -- Retry inside a scope ----------------------------------------------------


def _failing_policy(**kwargs: Any) -> resilient.Policy:
    return resilient.Policy(
        name="scoped",
        attempts=10,
        backoff=resilient.Constant(1.0),
        retry_on=(ConnectionError,),
        **kwargs,
    )


def test_retry_clips_to_the_scope(driver: Driver, clock: FakeClock) -> None:
    """
    Retry reads the scope's deadline: it never starts a wait past it and
    gives up with the last error instead.
    """
    calls: list[float] = []

    def body() -> None:
        calls.append(clock.now())
        raise ConnectionError

    fn = resilient.retry(_failing_policy())(driver.fn(body))
    with pytest.raises(ConnectionError):
        if driver.is_async:

            async def main() -> None:
                async with resilient.timeout(2.5):
                    await fn()

            anyio.run(main, backend=driver.kind)
        else:
            with resilient.timeout(2.5):
                fn()
    assert calls == [1000.0, 1001.0, 1002.0]


def test_retry_sleep_wakes_when_the_scope_is_cancelled(
    driver: Driver, clock: FakeClock
) -> None:
    """
    A scope cancelled while retry is about to sleep stops the call at once:
    no more attempts, no time passes, and the scope ends quietly.
    """
    scope = resilient.timeout(60.0)
    calls: list[int] = []

    def body() -> None:
        calls.append(1)
        raise ConnectionError

    def before_sleep(event: resilient.RetryEvent) -> None:
        scope.cancel()

    policy = _failing_policy(before_sleep=before_sleep)
    fn = resilient.retry(policy)(driver.fn(body))
    if driver.is_async:

        async def main() -> None:
            async with scope:
                await fn()

        anyio.run(main, backend=driver.kind)
    else:
        with scope:
            fn()
    assert calls == [1]
    assert clock.now() == 1000.0
    assert scope.cancelled_caught


def test_block_form_sleep_wakes_when_cancelled(clock: FakeClock) -> None:
    """The block form's backoff sleep is a wait the scope stops too."""
    attempts: list[int] = []
    with resilient.timeout(None) as scope:
        for attempt in resilient.retrying(_failing_policy()):
            with attempt:
                attempts.append(attempt.number)
                scope.cancel()
                raise ConnectionError
    assert attempts == [1]
    assert scope.cancelled_caught


# -- Async: anyio cancel scopes ----------------------------------------------


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio-mock-clock"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """asyncio with tiny real timeouts; trio in virtual time."""
    if request.param == "trio":
        return (
            "trio",
            {"clock": trio.testing.MockClock(autojump_threshold=0)},
        )
    return "asyncio"


TINY = 0.005  # Real seconds on asyncio; virtual on trio.


@pytest.mark.anyio
async def test_async_timeout_cancels_a_real_wait() -> None:
    """
    `async with timeout()` stops an awaiting block with TimedOut; the
    deadline is visible inside and gone after.
    """
    with pytest.raises(resilient.TimedOut) as info:
        async with resilient.timeout(TINY) as scope:
            assert 0 < resilient.remaining() <= TINY
            await anyio.sleep(REAL_SLEEP)
    assert info.value.scope is scope
    assert scope.cancelled_caught
    assert resilient.remaining() == math.inf


@pytest.mark.anyio
async def test_plain_with_works_in_async_code() -> None:
    """A plain `with` in async code is the same anyio cancel scope."""
    with pytest.raises(resilient.TimedOut), resilient.timeout(TINY):
        await anyio.sleep(REAL_SLEEP)


@pytest.mark.anyio
async def test_async_nesting_outer_fires() -> None:
    """On a real event loop too, the outer scope raises for itself."""
    with pytest.raises(resilient.TimedOut) as info:
        async with (
            resilient.timeout(TINY) as outer,
            resilient.timeout(REAL_SLEEP * 2) as inner,
        ):
            await anyio.sleep(REAL_SLEEP)
    assert info.value.scope is outer
    assert not inner.cancelled_caught


@pytest.mark.anyio
async def test_async_nesting_inner_fires() -> None:
    """The inner scope's TimedOut can be caught inside the outer one."""
    async with resilient.timeout(REAL_SLEEP * 2) as outer:
        with pytest.raises(resilient.TimedOut) as info:
            async with resilient.timeout(TINY) as inner:
                await anyio.sleep(REAL_SLEEP)
        assert info.value.scope is inner
    assert not outer.cancelled_caught


@pytest.mark.anyio
async def test_async_cancel_ends_quietly() -> None:
    """cancel() stops the block at its next await; no exception."""
    async with resilient.timeout(None) as scope:
        scope.cancel()
        await anyio.sleep(REAL_SLEEP)
        pytest.fail("not cancelled")  # pragma: no cover
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_async_outer_cancel_lets_an_enclosing_timeout_through() -> None:
    """
    Cancellation by anyio from outside our scopes (a task group being
    cancelled) passes through the scope untouched.
    """
    async with (
        anyio.create_task_group() as tg,
        resilient.timeout(REAL_SLEEP * 2) as scope,
    ):
        tg.cancel_scope.cancel()
        await anyio.sleep(REAL_SLEEP)
    assert not scope.cancelled_caught


@pytest.mark.anyio
async def test_async_retry_stops_at_the_scope() -> None:
    """
    An async retry inside a scope: when the scope fires mid-attempt the
    call stops and the scope raises its own TimedOut.
    """
    calls: list[int] = []

    @resilient.retry(_failing_policy(timeout=REAL_SLEEP * 10, budget=None))
    async def call() -> None:
        calls.append(1)
        await anyio.sleep(REAL_SLEEP)

    with pytest.raises(resilient.TimedOut) as info:
        async with resilient.timeout(TINY) as scope:
            await call()
    assert info.value.scope is scope
    assert calls == [1]


@pytest.mark.anyio
async def test_async_scope_with_fake_clock(clock: FakeClock) -> None:
    """The FakeClock's async sleep fires the scope in virtual time."""
    with pytest.raises(resilient.TimedOut):
        async with resilient.timeout(2.0):
            await clock.asleep(10.0)
    assert clock.now() == 1002.0


# -- Threads: cancel() from elsewhere wakes real sleeps ----------------------


def _cancel_soon(scope: resilient.TimeoutScope) -> threading.Timer:
    timer = threading.Timer(0.01, scope.cancel)
    timer.start()
    return timer


def test_cancel_from_another_thread_wakes_a_real_sleep() -> None:
    """A sync sleep on the real clock wakes at once when another thread
    cancels its scope; the scope ends quietly."""
    clock = _clock.get_clock()
    with resilient.timeout(None) as scope:
        _cancel_soon(scope)
        start = time.monotonic()
        clock.sleep(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY
    assert scope.cancelled_caught


def test_real_sleep_wakes_at_the_deadline() -> None:
    """A real sync sleep inside a short scope raises TimedOut at once."""
    clock = _clock.get_clock()
    start = time.monotonic()
    with pytest.raises(resilient.TimedOut), resilient.timeout(0.01):
        clock.sleep(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY


def test_real_sleep_shorter_than_the_scope_returns() -> None:
    """A real sleep inside a scope with time to spare just sleeps."""
    clock = _clock.get_clock()
    with resilient.timeout(REAL_SLEEP) as scope:
        clock.sleep(0.001)
        clock.sleep(0)
    assert not scope.cancelled_caught


def test_cancel_reaches_a_thread_that_copied_the_context() -> None:
    """
    A thread running in a copy of the scope's context sees the scope: its
    sleep wakes on cancel() and raises ScopeCancelled there.
    """
    clock = _clock.get_clock()
    seen: list[BaseException] = []

    def work() -> None:
        try:
            clock.sleep(REAL_SLEEP)
        except BaseException as exc:
            seen.append(exc)

    with resilient.timeout(None) as scope:
        ctx = contextvars.copy_context()
        thread = threading.Thread(target=ctx.run, args=(work,))
        start = time.monotonic()
        thread.start()
        _cancel_soon(scope)
        thread.join()
    assert time.monotonic() - start < PROMPTLY
    assert len(seen) == 1
    assert isinstance(seen[0], resilient.ScopeCancelled)
    assert seen[0].scope is scope


def test_retry_real_sleep_wakes_on_cancel_from_another_thread() -> None:
    """
    The retry decorator's backoff sleep (5 s here) wakes as soon as another
    thread cancels the enclosing scope.
    """
    calls: list[int] = []

    @resilient.retry(
        resilient.Policy(
            name="slow-backoff",
            attempts=3,
            backoff=resilient.Constant(REAL_SLEEP),
            retry_on=(ConnectionError,),
        )
    )
    def call() -> None:
        calls.append(1)
        raise ConnectionError

    with resilient.timeout(None) as scope:
        _cancel_soon(scope)
        start = time.monotonic()
        call()
    assert time.monotonic() - start < PROMPTLY
    assert calls == [1]
    assert scope.cancelled_caught


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_async_cancel_from_another_thread() -> None:
    """cancel() from a plain thread reaches the event loop's cancel scope."""
    start = time.monotonic()
    async with resilient.timeout(None) as scope:
        _cancel_soon(scope)
        await anyio.sleep(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY
    assert scope.cancelled_caught


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_worker_thread_sleep_wakes_with_the_async_scope() -> None:
    """
    Sync code run with `anyio.to_thread.run_sync` inside an async scope
    (it copies the context) has its sleep woken by the scope's deadline.
    """
    clock = _clock.get_clock()
    start = time.monotonic()
    with pytest.raises(resilient.TimedOut):
        async with resilient.timeout(0.01):
            await anyio.to_thread.run_sync(clock.sleep, REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY


# -- The main-thread interrupt -----------------------------------------------


@needs_alarm
def test_interrupt_stops_blocking_code_in_the_main_thread() -> None:
    """
    With interrupt=True a plain `time.sleep` (which never asks resilient
    anything) is interrupted by SIGALRM at the deadline, and `except
    Exception` in the blocking code does not swallow it.
    """
    start = time.monotonic()
    with (
        pytest.raises(resilient.TimedOut) as info,
        resilient.timeout(0.01, interrupt=True) as scope,
    ):
        assert scope.interrupting
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
        try:
            time.sleep(REAL_SLEEP)
        except Exception:  # pragma: no cover - must not catch it
            pytest.fail("the interrupt was swallowed")
    assert info.value.scope is scope
    assert time.monotonic() - start < PROMPTLY
    assert not scope.interrupting


@needs_alarm
def test_interrupt_is_off_by_default() -> None:
    """Without interrupt=True no handler or timer is installed."""
    before = signal.getsignal(signal.SIGALRM)
    with resilient.timeout(1.0) as scope:
        assert not scope.interrupting
        assert signal.getsignal(signal.SIGALRM) is before
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_alarm
def test_nested_interrupts_restore_each_other() -> None:
    """
    An inner interrupting scope fires for itself, then the outer one's
    handler and timer are back; on leaving the outer one, the original.
    """
    original = signal.getsignal(signal.SIGALRM)
    with resilient.timeout(REAL_SLEEP, interrupt=True):
        outer_handler = signal.getsignal(signal.SIGALRM)
        assert outer_handler is not original
        with (
            pytest.raises(resilient.TimedOut) as info,
            resilient.timeout(0.01, interrupt=True) as inner,
        ):
            time.sleep(REAL_SLEEP)
        assert info.value.scope is inner
        assert signal.getsignal(signal.SIGALRM) == outer_handler
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < left <= REAL_SLEEP
    assert signal.getsignal(signal.SIGALRM) is original


@needs_alarm
def test_interrupt_outer_fires_inside_inner() -> None:
    """The outer interrupting scope's deadline interrupts the inner block
    and raises for the outer scope."""
    start = time.monotonic()
    with (
        pytest.raises(resilient.TimedOut) as info,
        resilient.timeout(0.01, interrupt=True) as outer,
        resilient.timeout(REAL_SLEEP * 2, interrupt=True),
    ):
        time.sleep(REAL_SLEEP)
    assert info.value.scope is outer
    assert time.monotonic() - start < PROMPTLY


@needs_alarm
def test_interrupt_keeps_a_foreign_alarm() -> None:
    """
    A SIGALRM handler and timer the application set up before the scope
    are back afterwards, the timer still counting down.
    """
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 60.0)
        with resilient.timeout(0.5, interrupt=True):
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 0.5
        assert signal.getsignal(signal.SIGALRM) is handler
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60.0
        assert fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@needs_alarm
def test_foreign_alarm_due_inside_the_scope_still_fires() -> None:
    """An application timer falling due inside the scope reaches its own
    handler, and the scope carries on."""
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        with resilient.timeout(REAL_SLEEP, interrupt=True) as scope:
            deadline = time.monotonic() + PROMPTLY
            while not fired and time.monotonic() < deadline:
                time.sleep(0.001)
        assert fired == [signal.SIGALRM]
        assert not scope.cancelled_caught
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)


@needs_alarm
def test_cancel_from_another_thread_interrupts_the_main_thread() -> None:
    """
    With interrupt=True, cancel() from another thread interrupts even a
    plain `time.sleep` in the main thread; the scope ends quietly.
    """
    start = time.monotonic()
    with resilient.timeout(None, interrupt=True) as scope:
        _cancel_soon(scope)
        time.sleep(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY
    assert scope.cancelled_caught


@needs_alarm
def test_interrupt_falls_back_outside_the_main_thread() -> None:
    """In another thread interrupt=True arms nothing: the scope is
    cooperative there, and the main thread's handler is untouched."""
    result: list[bool] = []

    def work() -> None:
        with resilient.timeout(1.0, interrupt=True) as scope:
            result.append(scope.interrupting)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert result == [False]


@needs_alarm
def test_interrupt_is_not_used_in_async_code() -> None:
    """In async code the anyio cancel scope does the work; no SIGALRM."""

    seen: list[bool] = []

    async def main() -> None:
        async with resilient.timeout(1.0, interrupt=True) as scope:
            seen.append(scope.interrupting)

    anyio.run(main)
    assert seen == [False]


@needs_alarm
def test_cancelling_an_unrelated_scope_leaves_the_main_thread_alone() -> None:
    """
    Another thread cancelling its own scope does not interrupt the main
    thread's interrupting scope.
    """
    done: list[bool] = []

    def work() -> None:
        with resilient.timeout(None) as mine:
            mine.cancel()
            _clock.get_clock().sleep(REAL_SLEEP)
        done.append(mine.cancelled_caught)

    with resilient.timeout(REAL_SLEEP, interrupt=True) as scope:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        time.sleep(0.001)
    assert done == [True]
    assert not scope.cancelled_caught


@needs_alarm
def test_a_late_signal_after_exit_does_nothing() -> None:
    """The handler of a scope that has been left ignores a stray signal."""
    with resilient.timeout(REAL_SLEEP, interrupt=True):
        handler = signal.getsignal(signal.SIGALRM)
    assert callable(handler)
    handler(signal.SIGALRM, None)


@needs_alarm
def test_an_ignored_foreign_alarm_stays_ignored() -> None:
    """
    An application timer whose SIGALRM is ignored (SIG_IGN) falls due
    inside the scope: nothing happens, and SIG_IGN is back afterwards.
    """
    previous = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.002)
        with resilient.timeout(REAL_SLEEP, interrupt=True) as scope:
            time.sleep(0.02)
        assert not scope.cancelled_caught
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_cancel_makes_checkpoint_raise(clock: FakeClock) -> None:
    """After cancel(), the next `resilient.checkpoint()` stops the block."""
    reached: list[str] = []
    with resilient.timeout(None) as scope:
        scope.cancel()
        resilient.checkpoint()
        reached.append("after")
    assert reached == []


# -- Request headers ---------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "header"),
    [
        (0.0, "0n"),
        (0.05, "50000000n"),
        (1.5, "1500000u"),
        (0.3, "300000u"),
        (100.0, "100000m"),
        (3600.0, "3600000m"),
        (10**6, "1000000S"),
        (10**9, "16666666M"),
        (10**12, "99999999H"),
    ],
)
def test_header_encoding(seconds: float, header: str) -> None:
    """The finest gRPC unit that fits in 8 digits, rounded down."""
    assert resilient.deadline_header(seconds) == header


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("3S", 3.0),
        ("4m", 0.004),
        ("5u", 5e-6),
        ("6n", 6e-9),
        (" 7S ", 7.0),
        (b"8m", 0.008),
        ("00000009S", 9.0),
    ],
)
def test_header_parsing(header: str | bytes, seconds: float) -> None:
    """Every gRPC unit is read, from str or bytes."""
    assert resilient.parse_deadline_header(header) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "garbage",
    ["", "S", "12", "1s", "1.5S", "-1S", "123456789m", "1 S", "\u0661S"],
)
def test_header_garbage_is_rejected(garbage: str) -> None:
    """Anything that is not 1-8 ASCII digits and a unit: ValueError naming
    the value and the expected form."""
    with pytest.raises(ValueError, match="bad deadline header") as info:
        resilient.parse_deadline_header(garbage)
    assert repr(garbage) in str(info.value)


def test_header_of_the_wrong_type() -> None:
    """A header that is neither str nor bytes is a TypeError."""
    with pytest.raises(TypeError, match="str or bytes"):
        resilient.parse_deadline_header(15)  # type: ignore[arg-type]


def test_header_round_trip(clock: FakeClock) -> None:
    """
    A caller's remaining budget, passed on in a header, opens a scope in
    the callee with the same time left.
    """
    assert resilient.deadline_header() is None
    with resilient.timeout(1.5):
        clock.advance(0.25)
        header = resilient.deadline_header()
    assert header == "1250000u"
    with resilient.deadline_from_header(header) as scope:
        assert scope.remaining() == 1.25
        assert resilient.deadline_header() == header


def test_header_of_an_expired_deadline(clock: FakeClock) -> None:
    """An expired budget is sent as zero, and a zero header has expired."""
    with resilient.timeout(1.0):
        clock.advance(2.0)
        assert resilient.deadline_header() == "0n"
    with (
        pytest.raises(resilient.TimedOut) as info,
        resilient.deadline_from_header("0n") as scope,
    ):
        assert scope.expired
        clock.sleep(1.0)
    assert info.value.scope is scope


def test_header_from_a_request_is_clamped(clock: FakeClock) -> None:
    """
    cap= bounds what a caller may ask, enclosing deadlines still win, and
    no header gives no limit of its own (or the cap).
    """
    with resilient.deadline_from_header("1H", cap=30) as scope:
        assert scope.remaining() == 30.0
    with resilient.timeout(2.0), resilient.deadline_from_header("1H") as s:
        assert s.remaining() == 2.0
    with resilient.deadline_from_header(None) as scope:
        assert scope.remaining() == math.inf
    with resilient.deadline_from_header("", cap=5) as scope:
        assert scope.remaining() == 5.0


def test_bad_header_arguments() -> None:
    """A negative cap or seconds are refused like any setting."""
    with pytest.raises(resilient.ConfigError, match="cap"):
        resilient.deadline_from_header("1S", cap=-1)
    with pytest.raises(resilient.ConfigError, match="seconds"):
        resilient.deadline_header(-1.0)


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_header_never_promises_more(seconds: float) -> None:
    """Encoding rounds down, and loses less than 1e-5 of the time (or a
    nanosecond)."""
    header = resilient.deadline_header(seconds)
    assert header is not None
    decoded = resilient.parse_deadline_header(header)
    assert decoded <= seconds * (1 + 1e-12) + 1e-18
    assert seconds - decoded <= max(seconds * 1e-5, 1e-9)


# -- Exceptions --------------------------------------------------------------


def test_timed_out_pickles() -> None:
    """TimedOut crosses process boundaries (the scope does not)."""
    exc = resilient.TimedOut(12.5, object())
    back = pickle.loads(pickle.dumps(exc))  # noqa: S301
    assert type(back) is resilient.TimedOut
    assert back.deadline == 12.5
    assert back.scope is None


def test_scope_cancelled_is_not_an_exception() -> None:
    """ScopeCancelled escapes `except Exception`, like trio's Cancelled."""
    assert not issubclass(resilient.ScopeCancelled, Exception)
    assert issubclass(resilient.TimedOut, TimeoutError)


# -- Hooks for other primitives' waits ---------------------------------------


def test_condition_wait_wakes_on_cancel_from_another_thread() -> None:
    """
    A wait on a condition variable (what a bulkhead or lock does) wakes
    when another thread cancels the scope, through `wake_on_cancel`, and
    `check_scope` then stops the block.
    """
    cond = threading.Condition()

    def wake() -> None:
        with cond:
            cond.notify_all()

    start = time.monotonic()
    with resilient.timeout(None) as scope:
        _cancel_soon(scope)
        with _timeout.wake_on_cancel(wake), cond:
            while True:
                _timeout.check_scope()
                cond.wait(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY
    assert scope.cancelled_caught


def test_wake_on_cancel_bookkeeping(clock: FakeClock) -> None:
    """
    The callback runs at once if the scope is already cancelled, runs when
    an enclosing scope is cancelled, and is forgotten after its block.
    Outside scopes both helpers do nothing.
    """
    calls: list[str] = []
    with _timeout.wake_on_cancel(lambda: calls.append("none")):
        _timeout.check_scope()
    with resilient.timeout(None) as outer, resilient.timeout(5):
        with _timeout.wake_on_cancel(lambda: calls.append("inner")):
            outer.cancel()
        outer.cancel()  # Once more: the callback is gone.
        with _timeout.wake_on_cancel(lambda: calls.append("late")):
            pass
    assert calls == ["inner", "late"]


def test_check_scope_raises_after_the_deadline(clock: FakeClock) -> None:
    """check_scope() sees the deadline in virtual time, like a sleep."""
    with (
        pytest.raises(resilient.TimedOut),
        resilient.timeout(1.0),
    ):
        _timeout.check_scope()
        clock.advance(1.0)
        _timeout.check_scope()


@needs_alarm
def test_cancelling_an_inner_scope_interrupts_the_main_thread() -> None:
    """
    Inside an interrupting scope, cancelling a cooperative inner scope from
    another thread interrupts the main thread's blocking call too.
    """
    start = time.monotonic()
    with (
        resilient.timeout(REAL_SLEEP * 2, interrupt=True) as outer,
        resilient.timeout(None) as inner,
    ):
        _cancel_soon(inner)
        time.sleep(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY
    assert inner.cancelled_caught
    assert not outer.cancelled_caught


@needs_alarm
def test_a_handler_installed_from_c_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When SIGALRM belongs to C code (Python sees None), no interrupt."""
    monkeypatch.setattr(signal, "getsignal", lambda signum: None)
    with resilient.timeout(1.0, interrupt=True) as scope:
        assert not scope.interrupting
