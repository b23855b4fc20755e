"""
The breaker's windows (`resilient._breaker._windows`) and its timings when
the clock is swapped for one that reads lower.
"""

from __future__ import annotations

from typing import Any

import pytest

import resilient
from resilient import BreakerConfig, BreakerState, CountWindow, TimeWindow
from resilient._breaker._windows import BUCKETS, CountRing, TimeRing
from resilient.testing import FakeClock, use_clock


def test_count_ring_keeps_the_last_n() -> None:
    """A full ring drops its oldest entry for each new one."""
    ring = CountRing(3)
    for code in (1, 1, 0, 2):
        ring.add(code, 0.0)
    assert (ring.calls, ring.failures, ring.slow) == (3, 1, 1)
    ring.clear()
    assert (ring.calls, ring.failures, ring.slow) == (0, 0, 0)


def test_time_ring_counts_a_late_reader_in_the_newest_bucket() -> None:
    """A time a little lower than the newest bucket still counts."""
    ring = TimeRing(60.0)
    ring.add(1, 100.0)
    ring.add(1, 99.0)  # a thread that read the clock a moment earlier
    assert (ring.calls, ring.failures) == (2, 2)
    ring.expire(159.5)
    assert ring.calls == 2
    ring.expire(161.0)
    assert ring.calls == 0


def test_time_ring_restarts_on_a_much_lower_clock() -> None:
    """
    A time a whole window lower than the newest bucket (a swapped clock)
    starts a fresh window that then slides with the new clock.
    """
    ring = TimeRing(60.0)
    ring.add(1, 1_000_000.0)
    ring.add(1, 5.0)
    assert (ring.calls, ring.failures) == (1, 1)
    ring.expire(5.0 + 61.0)
    assert ring.calls == 0
    assert BUCKETS == 60


def test_window_slides_after_swapping_to_a_lower_clock(clock: Any) -> None:
    """
    Calls counted on a clock far ahead, then a clock that reads lower: the
    window keeps sliding (the old code froze it until the new clock caught
    up, so old failures opened the breaker much later).
    """
    cb = resilient.breaker(
        "swap",
        BreakerConfig(window=TimeWindow(60), minimum_calls=3),
    )
    clock.advance(1_000_000)
    for _ in range(2):
        cb.acquire().failure(ConnectionError())
    low = FakeClock(start=10.0)
    with use_clock(low):
        cb.acquire().failure(ConnectionError())
        assert cb.statistics().calls == 1
        low.advance(61)
        cb.acquire().success()
        low.advance(61)
        assert cb.statistics().calls == 0
        for _ in range(3):
            cb.acquire().failure(ConnectionError())
        assert cb.state is BreakerState.OPEN


def test_open_interval_restarts_on_a_lower_clock(clock: Any) -> None:
    """
    A breaker opened on a clock far ahead, then a clock that reads lower:
    it stays open for one open interval of the new clock, not for the gap.
    """
    cb = resilient.breaker(
        "swap-open",
        BreakerConfig(
            window=CountWindow(2), minimum_calls=2, open_interval=30
        ),
    )
    clock.advance(1_000_000)
    for _ in range(2):
        cb.acquire().failure(ConnectionError())
    low = FakeClock(start=0.0)
    with use_clock(low):
        assert cb.retry_after() == 30.0
        low.advance(30)
        with cb:
            pass
        assert cb.state is BreakerState.HALF_OPEN


def test_probe_started_on_a_higher_clock_still_times_out(clock: Any) -> None:
    """
    A probe admitted on a clock far ahead does not block half-open forever
    once the clock reads lower: it is timed from the new clock.
    """
    cb = resilient.breaker(
        "swap-probe",
        BreakerConfig(
            window=CountWindow(2),
            minimum_calls=2,
            open_interval=1,
            half_open_probes=1,
            probe_timeout=5,
        ),
    )
    clock.advance(1_000_000)
    for _ in range(2):
        cb.acquire().failure(ConnectionError())
    clock.advance(1)
    stuck = cb.acquire()
    low = FakeClock(start=0.0)
    with use_clock(low):
        assert cb.statistics().probes_in_flight == 1
        low.advance(5)
        assert cb.retry_after() > 0
        with pytest.raises(resilient.CircuitOpen):
            cb.acquire()
        assert cb.state is BreakerState.OPEN
    stuck.ignore()


@pytest.mark.parametrize(
    "times",
    [
        [0.5, 0.6, 1.5, 1.6, 1.7, 30.0, 61.0],
        [5.0, 4.99, 5.0, 3.0, 200.0, 10.0, 10.5],
        [1e3 + i / 7 for i in range(400)],
    ],
    ids=["forward", "late-and-swapped", "many"],
)
@pytest.mark.parametrize("kind", ["count", "time"])
def test_take_matches_adding_one_by_one(times: list[float], kind: str) -> None:
    """Taking an inbox of successes in bulk leaves a window exactly as
    adding them one at a time does."""
    import collections

    def make() -> CountRing | TimeRing:
        return CountRing(50) if kind == "count" else TimeRing(60.0)

    one, bulk = make(), make()
    one.add(1, times[0])
    bulk.add(1, times[0])
    for t in times:
        one.add(0, t)
    inbox = collections.deque(times)
    bulk.take(inbox)
    assert not inbox
    assert (bulk.calls, bulk.failures, bulk.slow) == (
        one.calls,
        one.failures,
        one.slow,
    )
    later = times[-1] + 30.0
    one.expire(later)
    bulk.expire(later)
    assert (bulk.calls, bulk.failures) == (one.calls, one.failures)
