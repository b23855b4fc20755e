"""
The interrupting scope (`timeout(..., interrupt=True)`) and the
application's own ``SIGALRM`` timer: the application's periodic timer keeps
ticking through the scope and after it (interval included), its handler
gets the ticks due inside the scope, and a handler that raises does not
disarm the scope (issue 6 item 7). Real time, tens of milliseconds, main
thread only.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

import resilient
from resilient import _timeout
from resilient._core import _clock


pytestmark = pytest.mark.skipif(
    not hasattr(signal, "setitimer"), reason="no SIGALRM on this platform"
)

TICK = 0.01  # The application's timer: 100 Hz.


@pytest.fixture(autouse=True)
def _app_timer() -> Iterator[None]:
    """Each test installs its own handler and timer; put everything back
    and check no scope or alarm is left."""
    previous = signal.getsignal(signal.SIGALRM)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    assert _timeout._ALARMS == []
    assert _clock._SCOPE.get() is None
    assert _clock.current_deadline() == math.inf


def _wait_for(cond: Any, seconds: float = 1.0) -> bool:
    """Sleep in small steps until *cond()* or *seconds* pass."""
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.001)
    return bool(cond())


def test_a_periodic_timer_ticks_through_and_after_the_scope() -> None:
    """
    A 100 Hz application timer ticks inside an interrupting scope (its
    handler gets the ticks that fall due first), and after the scope it is
    still armed with its interval and keeps ticking.
    """
    ticks: list[float] = []
    signal.signal(signal.SIGALRM, lambda s, f: ticks.append(time.monotonic()))
    signal.setitimer(signal.ITIMER_REAL, TICK, TICK)
    with resilient.timeout(5.0, interrupt=True):
        assert _wait_for(lambda: len(ticks) >= 3)
    inside = len(ticks)
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    assert interval == pytest.approx(TICK)
    assert 0 < left <= TICK
    assert _wait_for(lambda: len(ticks) >= inside + 3)


def test_a_periodic_timer_survives_a_firing_scope() -> None:
    """The application's interval is back after the scope times out too."""
    ticks: list[float] = []
    signal.signal(signal.SIGALRM, lambda s, f: ticks.append(time.monotonic()))
    signal.setitimer(signal.ITIMER_REAL, TICK, TICK)
    with (
        pytest.raises(resilient.TimedOut),
        resilient.timeout(TICK * 3, interrupt=True),
    ):
        time.sleep(5.0)
    assert signal.getitimer(signal.ITIMER_REAL)[1] == pytest.approx(TICK)
    before = len(ticks)
    assert _wait_for(lambda: len(ticks) >= before + 2)


def test_a_raising_handler_does_not_disarm_the_scope() -> None:
    """
    The application's handler raises inside the scope: its exception
    reaches the block, and the scope still fires at its own deadline
    (a 50 ms timeout does not run the 300 ms the block would take).
    """

    class AppAlarm(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise AppAlarm

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.005)
    seen: list[str] = []
    with (
        pytest.raises(resilient.TimedOut),
        resilient.timeout(0.05, interrupt=True),
    ):
        try:
            time.sleep(5.0)
        except AppAlarm:
            seen.append("app")
        time.sleep(0.3)
        seen.append("ran to the end")  # pragma: no cover - must not
    assert seen == ["app"]


def test_a_handler_that_rearms_itself_keeps_its_timer() -> None:
    """A one-shot handler that re-arms its timer each time keeps ticking
    inside the scope and after it."""
    ticks: list[float] = []

    def handler(signum: int, frame: object) -> None:
        ticks.append(time.monotonic())
        signal.setitimer(signal.ITIMER_REAL, TICK)

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, TICK)
    with resilient.timeout(5.0, interrupt=True):
        assert _wait_for(lambda: len(ticks) >= 3)
    inside = len(ticks)
    assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= TICK
    assert _wait_for(lambda: len(ticks) >= inside + 2)


def test_a_later_periodic_timer_keeps_its_time_and_interval() -> None:
    """An application timer due after the scope ends is back with the
    time it had left and its interval, and never fired inside."""
    ticks: list[float] = []
    signal.signal(signal.SIGALRM, lambda s, f: ticks.append(time.monotonic()))
    signal.setitimer(signal.ITIMER_REAL, 60.0, 30.0)
    with resilient.timeout(0.5, interrupt=True):
        time.sleep(0.001)
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    assert 59.0 < left <= 60.0
    assert interval == 30.0
    assert ticks == []


def test_nested_scopes_keep_a_periodic_timer() -> None:
    """Two nested interrupting scopes: the application's ticks go on in
    the inner one and its interval is back after both."""
    ticks: list[float] = []
    signal.signal(signal.SIGALRM, lambda s, f: ticks.append(time.monotonic()))
    signal.setitimer(signal.ITIMER_REAL, TICK, TICK)
    with (
        resilient.timeout(5.0, interrupt=True),
        resilient.timeout(4.0, interrupt=True),
    ):
        assert _wait_for(lambda: len(ticks) >= 3)
    assert signal.getitimer(signal.ITIMER_REAL)[1] == pytest.approx(TICK)
    before = len(ticks)
    assert _wait_for(lambda: len(ticks) >= before + 2)


def test_the_inner_scope_still_fires_amid_ticks() -> None:
    """With a 100 Hz application timer running, a nested scope's own
    deadline still interrupts a blocking sleep."""
    signal.signal(signal.SIGALRM, lambda s, f: None)
    signal.setitimer(signal.ITIMER_REAL, TICK, TICK)
    with resilient.timeout(5.0, interrupt=True):
        with (
            pytest.raises(resilient.TimedOut) as info,
            resilient.timeout(0.03, interrupt=True) as inner,
        ):
            time.sleep(5.0)
        assert info.value.scope is inner


def test_the_timer_is_clamped_for_huge_deadlines() -> None:
    """A huge but finite timeout arms a timer the OS accepts (no error)
    and leaves nothing armed."""
    with resilient.timeout(1e300, interrupt=True) as scope:
        assert scope.interrupting
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
