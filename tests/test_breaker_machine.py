"""
The breaker's pure machine (`resilient._breaker._machine`), fed outcomes
and times by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from resilient import (
    CountWindow,
    TimeWindow,
)
from resilient._breaker import (
    _REGISTRY,
    FAILURE,
    IGNORE,
    SUCCESS,
    Reject,
    _BreakerMachine,
)
from tests.breakers import (
    CLOSED,
    FORCED_OPEN,
    HALF_OPEN,
    OPEN,
    admit,
    call,
    machine,
    settle,
)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Every test starts and ends with no breakers and no defaults."""
    _REGISTRY.clear()
    yield
    _REGISTRY.clear()
    _REGISTRY.limit = 1024


class TestMachine:
    def test_opens_on_failure_rate_after_minimum_calls(self) -> None:
        """Below minimum_calls nothing opens; at it, a failure rate at or
        above the threshold opens, with the reason and the wait."""
        m = machine(minimum_calls=3)
        assert call(m, FAILURE, 1.0) is None
        assert call(m, FAILURE, 2.0) is None
        t = call(m, SUCCESS, 3.0)
        assert t is not None
        assert (t.old, t.new, t.reason) == (CLOSED, OPEN, "failure_rate")
        assert (t.at, t.retry_after) == (3.0, 10.0)
        assert m.outbox == [t]

    def test_rate_below_threshold_stays_closed(self) -> None:
        """1 failure in 4 calls is under 50%: the breaker stays closed."""
        m = machine(minimum_calls=4)
        for outcome in (SUCCESS, FAILURE, SUCCESS, SUCCESS, SUCCESS):
            assert call(m, outcome, 1.0) is None
        assert m.state is CLOSED

    def test_count_window_forgets_old_calls(self) -> None:
        """Only the last *size* calls count: old failures fall out."""
        m = machine(window=CountWindow(4), minimum_calls=4)
        for outcome in (FAILURE, SUCCESS, SUCCESS, SUCCESS):
            call(m, outcome, 1.0)
        stats = m.statistics(1.0)
        assert (stats.calls, stats.failures) == (4, 1)
        for _ in range(4):
            call(m, SUCCESS, 1.0)
        assert (m.statistics(1.0).calls, m.statistics(1.0).failures) == (
            4,
            0,
        )

    def test_time_window_forgets_old_calls(self) -> None:
        """Calls older than the time window no longer count."""
        m = machine(window=TimeWindow(60.0), minimum_calls=2)
        call(m, FAILURE, 0.5)
        assert m.statistics(30.0).calls == 1
        assert m.statistics(61.0).calls == 0
        assert call(m, FAILURE, 61.0) is None  # The old failure is gone.
        assert m.state is CLOSED
        assert call(m, FAILURE, 90.0) is not None
        assert m.state is OPEN

    def test_time_window_slides_bucket_by_bucket(self) -> None:
        """Calls leave the window one bucket (1/60 of it) at a time."""
        m = machine(window=TimeWindow(60.0), minimum_calls=10)
        for t in range(5):
            call(m, FAILURE, 100.0 + t)
        assert m.statistics(104.0).failures == 5
        assert m.statistics(161.5).failures == 3
        assert m.statistics(165.0).failures == 0
        m.window.expire(10.0)  # Time never runs backward; this is a no-op.
        assert m.statistics(165.0).calls == 0

    def test_slow_calls_open(self) -> None:
        """Calls at or over slow_call_duration count as slow; at the slow
        rate the breaker opens even though every call succeeded."""
        m = machine(slow_call_duration=2.0, slow_call_rate=0.5)
        assert call(m, SUCCESS, 10.0, took=2.0) is None
        t = call(m, SUCCESS, 11.0, took=2.5)
        assert t is not None
        assert t.reason == "slow_call_rate"
        assert m.statistics(11.0).slow_calls == 2

    def test_ignored_outcomes_do_not_count(self) -> None:
        """IGNORE leaves the window untouched."""
        m = machine()
        for _ in range(5):
            assert call(m, IGNORE, 1.0) is None
        assert m.statistics(1.0).calls == 0

    def test_open_rejects_then_admits_a_probe(self) -> None:
        """An open breaker rejects with the time left, then admits a
        probe once the interval has passed."""
        m = machine()
        call(m, FAILURE, 0.0)
        call(m, FAILURE, 0.0)
        r = m.admit(4.0)
        assert r == Reject(6.0, OPEN)
        assert m.retry_after(4.0) == 6.0
        p = admit(m, 10.0)
        assert p.probe > 0
        assert m.state is HALF_OPEN
        assert m.outbox[-1].reason == "open_interval_passed"
        assert m.rejected == 1

    def _half_open(self, **changes: Any) -> _BreakerMachine:
        m = machine(**changes)
        call(m, FAILURE, 0.0)
        call(m, FAILURE, 0.0)
        return m

    def test_half_open_caps_concurrent_probes(self) -> None:
        """At most half_open_probes run at once; the rejection says when
        the oldest probe times out."""
        m = self._half_open()
        held = [admit(m, 10.0), admit(m, 11.0)]
        assert m.admit(12.0) == Reject(3.0, HALF_OPEN)
        assert m.retry_after(12.0) == 3.0
        assert [p.probe for p in held] == [1, 2]  # still in flight

    def test_probes_succeeding_close(self) -> None:
        """half_open_probes successes close the breaker and empty the
        window."""
        m = self._half_open()
        p1, p2 = admit(m, 10.0), admit(m, 10.0)
        assert settle(m, p1, SUCCESS, 11.0) is None
        assert m.retry_after(11.0) == 0.0
        t = settle(m, p2, SUCCESS, 11.0)
        assert t is not None
        assert (t.old, t.new, t.reason) == (
            HALF_OPEN,
            CLOSED,
            "probes_succeeded",
        )
        assert m.statistics(11.0).calls == 0

    def test_probe_failure_reopens_with_growth(self) -> None:
        """A failed probe re-opens; the interval grows by the factor up to
        the cap, and goes back to the base once closed."""
        m = self._half_open(open_interval_growth=3.0, max_open_interval=50.0)
        t = settle(m, admit(m, 10.0), FAILURE, 10.0)
        assert t is not None
        assert (t.reason, t.retry_after) == ("probe_failed", 30.0)
        t = settle(m, admit(m, 40.0), FAILURE, 40.0)
        assert t is not None
        assert t.retry_after == 50.0
        for _ in range(2):
            settle(m, admit(m, 90.0), SUCCESS, 90.0)
        assert m.state is CLOSED
        call(m, FAILURE, 91.0)
        t = call(m, FAILURE, 91.0)
        assert t is not None
        assert t.retry_after == 10.0

    def test_slow_probe_fails(self) -> None:
        """A probe slower than slow_call_duration counts as failed."""
        m = self._half_open(slow_call_duration=1.0)
        t = settle(m, admit(m, 10.0), SUCCESS, 11.5)
        assert t is not None
        assert t.reason == "probe_failed"

    def test_stuck_probe_reaped_on_admit(self) -> None:
        """A probe out for probe_timeout re-opens the breaker on the next
        admission; its late outcome then counts for nothing."""
        m = self._half_open()
        stuck = admit(m, 10.0)
        assert m.retry_after(15.0) == 10.0  # It will re-open.
        assert m.admit(15.0) == Reject(10.0, OPEN)
        assert m.outbox[-1].reason == "probe_timeout"
        assert settle(m, stuck, SUCCESS, 16.0) is None
        assert m.state is OPEN
        assert m.probes == {}

    def test_overtime_probe_fails_on_record(self) -> None:
        """A probe that ends after probe_timeout fails, success or not."""
        m = self._half_open()
        t = settle(m, admit(m, 10.0), SUCCESS, 15.0)
        assert t is not None
        assert t.reason == "probe_timeout"

    def test_ignored_probe_frees_its_slot(self) -> None:
        """An ignored probe frees its slot without counting."""
        m = self._half_open()
        p1, p2 = admit(m, 10.0), admit(m, 10.0)
        assert settle(m, p1, IGNORE, 10.0) is None
        assert m.successes == 0
        assert admit(m, 10.0).probe == 3
        assert settle(m, p2, SUCCESS, 10.0) is None

    def test_stale_permit_counts_for_nothing(self) -> None:
        """A call admitted before a state change does not count after it."""
        m = machine()
        old = admit(m, 0.0)
        call(m, FAILURE, 0.0)
        call(m, FAILURE, 0.0)
        admit(m, 10.0)
        assert settle(m, old, FAILURE, 10.0) is None
        assert settle(m, old, IGNORE, 10.0) is None
        assert m.state is HALF_OPEN
        assert len(m.probes) == 1

    def test_force_open_and_reset(self) -> None:
        """force_open rejects with no end until reset; both are no-ops when
        already there, and reset empties the window."""
        m = machine()
        t = m.force_open(1.0)
        assert t is not None
        assert (t.new, t.retry_after) == (FORCED_OPEN, math.inf)
        assert m.force_open(2.0) is None
        assert m.admit(1e9) == Reject(math.inf, FORCED_OPEN)
        t = m.reset(3.0)
        assert t is not None
        assert (t.old, t.new, t.reason) == (FORCED_OPEN, CLOSED, "reset")
        call(m, FAILURE, 4.0)
        assert m.reset(5.0) is None
        assert m.statistics(5.0).calls == 0

    def test_statistics_snapshot(self) -> None:
        """statistics() is a frozen snapshot of the window and counters."""
        m = machine(minimum_calls=4)
        call(m, FAILURE, 1.0)
        call(m, SUCCESS, 1.0)
        s = m.statistics(1.0)
        assert (s.calls, s.failures, s.failure_rate) == (2, 1, 0.5)
        assert (s.state, s.retry_after, s.times_opened) == (CLOSED, 0.0, 0)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            s.calls = 3  # type: ignore[misc]
        empty = machine().statistics(0.0)
        assert (empty.failure_rate, empty.slow_call_rate) == (0.0, 0.0)
