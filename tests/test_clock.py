"""
The clock seam and deadlines: the fake and real clocks, deadline scopes that
nest and propagate through tasks and threads, and immunity of deadlines to
wall-clock jumps.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import math
import threading
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest
import time_machine

import resilient
from resilient._core import _clock
from resilient._core._clock import (
    DEFAULT_CLOCK,
    current_deadline,
    get_clock,
    set_clock,
)
from resilient.testing import FakeClock


# --- FakeClock


def test_fake_clock_stands_still() -> None:
    """A fake clock reads its start until something moves it."""
    clock = FakeClock(start=12.5)
    assert clock.now() == 12.5
    assert clock.now() == 12.5
    assert FakeClock().now() == 0.0
    assert FakeClock(start=3).now() == 3.0
    assert repr(clock) == "FakeClock(now=12.5)"


def test_fake_clock_advance() -> None:
    """`advance` moves the clock forward without recording a sleep."""
    clock = FakeClock()
    clock.advance(1.5)
    clock.advance(0)
    assert clock.now() == 1.5
    assert clock.sleeps == []


@pytest.mark.parametrize("seconds", [-1.0, -1e-9, math.nan])
def test_fake_clock_never_goes_back(seconds: float) -> None:
    """`advance` refuses negative and NaN steps and leaves the clock."""
    clock = FakeClock(start=5.0)
    with pytest.raises(ValueError, match=r"FakeClock\.advance"):
        clock.advance(seconds)
    assert clock.now() == 5.0


def test_fake_clock_sleep_records_and_advances() -> None:
    """A sync sleep returns at once, advances the clock and is recorded."""
    clock = FakeClock(start=100.0)
    clock.sleep(2.0)
    clock.sleep(0.0)
    clock.sleep(0.5)
    assert clock.now() == 102.5
    assert clock.sleeps == [2.0, 0.0, 0.5]


def test_fake_clock_negative_sleep_is_recorded_but_does_not_move() -> None:
    """A negative sleep is recorded as asked and does not move time back."""
    clock = FakeClock(start=1.0)
    clock.sleep(-3.0)
    assert clock.now() == 1.0
    assert clock.sleeps == [-3.0]


def test_fake_clock_nan_sleep_does_not_poison_the_clock() -> None:
    """A NaN sleep, like a real one, does not move the clock."""
    clock = FakeClock(start=1.0)
    clock.sleep(math.nan)
    assert clock.now() == 1.0


def test_fake_clock_is_thread_safe() -> None:
    """Sleeps from many threads at once all count, none is lost."""
    clock = FakeClock()

    def work() -> None:
        for _ in range(500):
            clock.sleep(0.25)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.now() == 8 * 500 * 0.25
    assert len(clock.sleeps) == 8 * 500


@pytest.mark.anyio
async def test_fake_clock_asleep_advances() -> None:
    """An async sleep advances the clock, records the sleep, returns."""
    clock = FakeClock(start=10.0)
    await clock.asleep(2.5)
    await clock.asleep(0)
    assert clock.now() == 12.5
    assert clock.sleeps == [2.5, 0]


@pytest.mark.anyio
async def test_fake_clock_asleep_is_a_checkpoint() -> None:
    """
    An async fake sleep yields once, so a cancelled scope stops it; the
    clock still counts the sleep that was asked.
    """
    clock = FakeClock()
    reached = False
    with anyio.CancelScope() as scope:
        scope.cancel()
        await clock.asleep(1.0)
        reached = True
    assert scope.cancelled_caught
    assert not reached
    assert clock.sleeps == [1.0]


# --- MonotonicClock


def test_monotonic_clock_reads_time_monotonic() -> None:
    """The real clock is `time.monotonic`, and never goes back."""
    clock = resilient.MonotonicClock()
    before = time.monotonic()
    first = clock.now()
    second = clock.now()
    after = time.monotonic()
    assert before <= first <= second <= after
    assert repr(clock) == "MonotonicClock()"


def test_monotonic_clock_sleep_accepts_non_positive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Zero and negative sleeps return at once without asking the system
    (`time.sleep` would raise on a negative); a positive one is passed on."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = resilient.MonotonicClock()
    clock.sleep(0)
    clock.sleep(-1.0)
    assert slept == []
    clock.sleep(0.001)
    assert slept == [0.001]


@pytest.mark.anyio
async def test_monotonic_clock_asleep() -> None:
    """A real async sleep waits in the event loop; zero is a checkpoint."""
    clock = resilient.MonotonicClock()
    await clock.asleep(0.001)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await clock.asleep(0)
    assert scope.cancelled_caught
    with anyio.CancelScope() as scope:
        scope.cancel()
        await clock.asleep(30)  # Wakes at once when cancelled.
    assert scope.cancelled_caught


def test_get_and_set_clock() -> None:
    """`set_clock` installs a clock process-wide and returns the old one."""
    assert get_clock() is DEFAULT_CLOCK
    fake = FakeClock()
    previous = set_clock(fake)
    try:
        assert previous is DEFAULT_CLOCK
        assert get_clock() is fake
    finally:
        assert set_clock(previous) is fake
    assert get_clock() is DEFAULT_CLOCK


def test_clock_is_seen_by_other_threads(clock: FakeClock) -> None:
    """The installed clock is process-wide: threads see the fake one too."""
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(get_clock()))
    t.start()
    t.join()
    assert seen == [clock]


# --- remaining, checkpoint, deadline


def is_expired(d: resilient.Deadline) -> bool:
    """Read `expired` afresh (mypy would keep a narrowed value)."""
    return d.expired


def test_no_deadline_outside_any_scope(clock: FakeClock) -> None:
    """Outside every deadline nothing limits: inf left, checkpoints pass."""
    assert resilient.remaining() == math.inf
    assert current_deadline() == math.inf
    resilient.checkpoint()
    clock.advance(1e9)
    resilient.checkpoint()


def test_deadline_counts_down(clock: FakeClock) -> None:
    """Inside a deadline, `remaining` counts down and never goes negative."""
    with resilient.deadline(5) as d:
        assert d.at == 1005.0
        assert current_deadline() == 1005.0
        assert resilient.remaining() == 5.0
        assert d.remaining() == 5.0
        clock.advance(2)
        assert resilient.remaining() == 3.0
        assert not is_expired(d)
        clock.advance(10)
        assert resilient.remaining() == 0.0
        assert d.remaining() == 0.0
        assert is_expired(d)
    assert resilient.remaining() == math.inf


def test_checkpoint_raises_after_expiry(clock: FakeClock) -> None:
    """
    `checkpoint` passes before the deadline and raises `DeadlineExceeded`,
    a `TimeoutError`, from the moment it is reached.
    """
    with resilient.deadline(1.0) as d:
        clock.advance(0.5)
        resilient.checkpoint()
        clock.advance(0.5)
        with pytest.raises(resilient.DeadlineExceeded) as info:
            resilient.checkpoint()
    exc = info.value
    assert isinstance(exc, TimeoutError)
    assert isinstance(exc, resilient.ResilientError)
    assert exc.deadline == d.at == 1001.0
    assert str(exc) == "deadline exceeded"


def test_zero_deadline_is_expired_at_once(clock: FakeClock) -> None:
    """A zero deadline leaves no time at all."""
    with resilient.deadline(0) as d:
        assert d.expired
        assert resilient.remaining() == 0.0
        with pytest.raises(resilient.DeadlineExceeded):
            resilient.checkpoint()


def test_inner_deadline_can_only_shrink(clock: FakeClock) -> None:
    """
    Nested deadlines: an inner one shorter than the outer shortens the time
    left; a longer one does not extend it; leaving restores the outer.
    """
    with resilient.deadline(10):
        with resilient.deadline(3) as inner:
            assert resilient.remaining() == 3.0
            assert inner.at == 1003.0
        assert resilient.remaining() == 10.0
        with resilient.deadline(60) as longer:
            assert resilient.remaining() == 10.0
            assert longer.at == 1010.0
            clock.advance(10)
            assert longer.expired
            with pytest.raises(resilient.DeadlineExceeded):
                resilient.checkpoint()
        with resilient.deadline(None) as unlimited:
            assert unlimited.at == 1010.0
    assert resilient.remaining() == math.inf


def test_none_means_no_limit(clock: FakeClock) -> None:
    """``deadline(None)`` adds no limit of its own."""
    with resilient.deadline(None) as d:
        assert resilient.remaining() == math.inf
        assert d.at == math.inf
        assert d.remaining() == math.inf
        assert not d.expired
        resilient.checkpoint()


def test_deadline_restored_after_an_exception(clock: FakeClock) -> None:
    """Leaving a deadline by an exception restores the outer one."""
    with resilient.deadline(10):
        with pytest.raises(KeyError), resilient.deadline(1):
            raise KeyError
        assert resilient.remaining() == 10.0
    assert resilient.remaining() == math.inf


def test_reentering_a_deadline_raises(clock: FakeClock) -> None:
    """A deadline that is entered cannot be entered again."""
    d = resilient.deadline(5)
    with d:
        with pytest.raises(RuntimeError, match="already entered"):
            d.__enter__()
        assert resilient.remaining() == 5.0
    assert resilient.remaining() == math.inf


def test_a_deadline_can_be_used_again_after_exit(clock: FakeClock) -> None:
    """Once left, a deadline scope may be entered again, from that time."""
    d = resilient.deadline(5)
    with d:
        pass
    clock.advance(100)
    with d:
        assert d.at == 1105.0
        assert resilient.remaining() == 5.0


def test_exit_without_enter_is_harmless(clock: FakeClock) -> None:
    """Leaving a scope that was never entered changes nothing."""
    with resilient.deadline(5):
        resilient.deadline(1).__exit__(None, None, None)
        assert resilient.remaining() == 5.0


def test_an_unentered_deadline_has_none(clock: FakeClock) -> None:
    """Before entry a scope has no deadline yet."""
    d = resilient.deadline(5)
    assert d.at == math.inf
    assert d.remaining() == math.inf
    assert not d.expired
    assert repr(d) == "Deadline(seconds=5.0, at=inf)"
    with d:
        assert repr(d) == "Deadline(seconds=5.0, at=1005.0)"


@pytest.mark.parametrize(
    ("seconds", "error"),
    [
        (-1, ValueError),
        (-1e-9, ValueError),
        (math.nan, ValueError),
        (-math.inf, ValueError),
        (True, TypeError),
        ("5", TypeError),
        ([5], TypeError),
    ],
    ids=repr,
)
def test_bad_seconds_are_refused(seconds: Any, error: type) -> None:
    """`deadline` refuses negative, NaN and non-number seconds."""
    with pytest.raises(error, match=r"deadline\(seconds=\.\.\.\)"):
        resilient.deadline(seconds)


def test_good_seconds(clock: FakeClock) -> None:
    """Ints, floats and inf are accepted."""
    assert resilient.deadline(3)._seconds == 3.0
    with resilient.deadline(math.inf):
        assert resilient.remaining() == math.inf


def test_deadline_takes_a_timedelta(clock: FakeClock) -> None:
    """A `timedelta` is accepted as the seconds, like every duration."""
    with resilient.deadline(dt.timedelta(seconds=90)):
        assert resilient.remaining() == 90.0


# --- propagation


@pytest.mark.anyio
async def test_deadline_follows_spawned_tasks(clock: FakeClock) -> None:
    """
    Tasks spawned inside a deadline see it, even when their task group was
    opened outside it; tasks spawned outside do not.
    """
    seen: dict[str, float] = {}

    async def child(name: str) -> None:
        await clock.asleep(0)
        seen[name] = current_deadline()

    async with anyio.create_task_group() as tg:
        tg.start_soon(child, "outside")
        with resilient.deadline(10):
            tg.start_soon(child, "inside")
            async with anyio.create_task_group() as inner:
                inner.start_soon(child, "nested")
    assert seen == {"outside": math.inf, "inside": 1010.0, "nested": 1010.0}


@pytest.mark.anyio
async def test_deadline_in_a_task_does_not_leak(clock: FakeClock) -> None:
    """A deadline set inside a child task is invisible to its parent."""

    async def child() -> None:
        with resilient.deadline(1):
            await clock.asleep(0)
        # Deliberately not left before the task ends:
        resilient.deadline(2).__enter__()

    async with anyio.create_task_group() as tg:
        tg.start_soon(child)
    assert resilient.remaining() == math.inf


@pytest.mark.anyio
async def test_deadline_follows_to_thread(clock: FakeClock) -> None:
    """
    `anyio.to_thread.run_sync` copies the context: the worker thread sees
    the deadline, and its checkpoint raises once the deadline has passed.
    """
    with resilient.deadline(10):
        assert await anyio.to_thread.run_sync(resilient.remaining) == 10.0
        clock.advance(4)
        assert await anyio.to_thread.run_sync(resilient.remaining) == 6.0
        clock.advance(6)
        with pytest.raises(resilient.DeadlineExceeded):
            await anyio.to_thread.run_sync(resilient.checkpoint)


def test_deadline_follows_copied_context_only(clock: FakeClock) -> None:
    """
    A plain thread starts with a fresh context and sees no deadline; one
    run in a copied context sees it.
    """
    seen: dict[str, float] = {}

    def record(name: str) -> None:
        seen[name] = resilient.remaining()

    with resilient.deadline(5):
        plain = threading.Thread(target=record, args=("plain",))
        ctx = contextvars.copy_context()
        copied = threading.Thread(target=ctx.run, args=(record, "copied"))
        for t in (plain, copied):
            t.start()
            t.join()
    assert seen == {"plain": math.inf, "copied": 5.0}


# --- wall-clock jumps


@pytest.mark.parametrize(
    "destination",
    [
        dt.datetime(1999, 12, 31, 23, 59, tzinfo=dt.UTC),
        dt.datetime(2099, 1, 1, tzinfo=dt.UTC),
    ],
    ids=["back", "forward"],
)
def test_wall_clock_jumps_change_nothing(destination: dt.datetime) -> None:
    """
    Deadlines on the real clock are measured on `time.monotonic`: moving
    the wall clock decades, then shifting it by days, neither expires a
    deadline nor adds time to it.
    """
    assert isinstance(get_clock(), resilient.MonotonicClock)
    with resilient.deadline(3600) as d:
        before = resilient.remaining()
        with time_machine.travel(destination, tick=False) as traveller:
            assert abs(time.time() - destination.timestamp()) < 1.0
            traveller.shift(dt.timedelta(days=3))
            assert time.time() >= destination.timestamp() + 3 * 86400
            resilient.checkpoint()
            assert not d.expired
            left = resilient.remaining()
            assert 0.0 < left <= before
            assert left > 3000.0  # Not moved by days, either way.


@pytest.mark.anyio
async def test_real_async_sleep_under_time_machine() -> None:
    """
    With the wall clock frozen by time-machine 3.x, real async sleeps on
    the monotonic clock still end (2.13 froze monotonic time and stalled
    them).
    """
    clock = resilient.MonotonicClock()
    when = dt.datetime(2001, 1, 1, tzinfo=dt.UTC)
    with time_machine.travel(when, tick=False), resilient.deadline(60):
        with anyio.fail_after(30):
            await clock.asleep(0.002)
        assert resilient.remaining() > 0.0


def test_deadline_reads_the_installed_clock() -> None:
    """Deadlines read the clock installed when they are entered."""
    fake = FakeClock(start=50.0)
    previous = set_clock(fake)
    try:
        with resilient.deadline(5) as d:
            assert d.at == 55.0
            assert _clock.remaining() == 5.0
    finally:
        set_clock(previous)


# --- sleeps inside a timeout scope


def test_fake_sleep_stops_at_an_enclosing_timeout(clock: FakeClock) -> None:
    """
    A fake sleep inside `resilient.timeout` moves the clock only up to the
    scope's deadline and ends the scope, recording the sleep as asked.
    """
    with pytest.raises(resilient.TimedOut), resilient.timeout(5):
        clock.sleep(60)
    assert clock.now() == 1005.0
    assert clock.sleeps == [60]


def test_fake_sleep_within_a_timeout_is_untouched(clock: FakeClock) -> None:
    """A sleep that ends before the scope's deadline runs in full."""
    with resilient.timeout(5):
        clock.sleep(2)
        assert resilient.remaining() == 3.0
    assert clock.now() == 1002.0


def test_real_sleep_wakes_when_its_timeout_fires() -> None:
    """
    A real sleep inside `resilient.timeout` wakes when the scope fires
    instead of sleeping on (five real milliseconds here, not ten seconds).
    """
    with pytest.raises(resilient.TimedOut), resilient.timeout(0.005):
        resilient.MonotonicClock().sleep(10)


@pytest.mark.anyio
async def test_async_with_deadline_is_the_same_scope(clock: FakeClock) -> None:
    """
    ``async with resilient.deadline(...)`` works (it was a TypeError) and
    means what ``with`` means: the task sees the time left, a policy call
    inside is bounded by it, nesting only shrinks, and leaving restores
    the outer deadline, also on an exception.
    """
    policy = resilient.Policy(attempts=100, backoff=resilient.Constant(1.0))
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    async with resilient.deadline(10) as outer:
        assert outer.at == 1010.0
        assert resilient.remaining() == 10.0
        async with resilient.deadline(60):
            assert resilient.remaining() == 10.0
        with pytest.raises(KeyError):
            async with resilient.deadline(2.5) as inner:
                assert resilient.remaining() == 2.5
                assert inner.at == 1002.5
                with pytest.raises(ConnectionError):
                    await policy.acall(flaky)
                raise KeyError
        assert calls == 3  # retries at 1001 and 1002; 1003 is past 1002.5
        assert resilient.remaining() == 10.0 - 2.0
    assert resilient.remaining() == math.inf
