"""
A Hypothesis state machine drives one breaker through random outcomes, clock
jumps, forced states and concurrent probes (permits held while others are
asked for), and checks its promises after every step:

- half-open probes in flight never exceed ``half_open_probes``;
- every permit is released or recorded: a probe slot is held only by an
  unsettled permit, settling twice changes nothing, and once every permit
  is settled no slot is held;
- ``retry_after() == 0`` exactly when a call would be admitted, and a
  rejection carries the same wait;
- once the open interval has passed, a call is always admitted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import resilient.testing
from resilient import (
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    TimeWindow,
)
from resilient._breaker import BreakerPermit


@st.composite
def configs(draw: st.DrawFn) -> BreakerConfig:
    """Small breakers that open, probe and close often."""
    if draw(st.booleans()):
        size = draw(st.integers(1, 6))
        window: CountWindow | TimeWindow = CountWindow(size)
        minimum = draw(st.integers(1, size))
    else:
        window = TimeWindow(draw(st.sampled_from([1.0, 10.0, 60.0])))
        minimum = draw(st.integers(1, 6))
    interval = draw(st.sampled_from([1.0, 5.0, 30.0]))
    return BreakerConfig(
        window=window,
        minimum_calls=minimum,
        failure_rate=draw(st.sampled_from([0.2, 0.5, 1.0])),
        slow_call_duration=draw(st.sampled_from([None, 0.5, 3.0])),
        slow_call_rate=draw(st.sampled_from([0.5, 1.0])),
        open_interval=interval,
        open_interval_growth=draw(st.sampled_from([1.0, 2.0])),
        max_open_interval=interval * draw(st.sampled_from([1, 4])),
        half_open_probes=draw(st.integers(1, 4)),
        probe_timeout=draw(st.sampled_from([0.5, 2.0, 10.0])),
        failure_on=ConnectionError,
        ignore_on=KeyError,
    )


OUTCOMES = st.sampled_from(
    [
        "success",
        "failure",
        "other_exception",
        "ignored_exception",
        "cancelled",
        "ignore",
    ]
)


class BreakerStates(RuleBasedStateMachine):
    """Random walks through one breaker's life."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = resilient.testing.FakeClock(start=1000.0)
        self.restore = resilient.testing.use_clock(self.clock)
        self.cb: CircuitBreaker | None = None
        self.held: list[BreakerPermit] = []
        self.settled: list[BreakerPermit] = []
        self.transitions = 0

    @property
    def breaker(self) -> CircuitBreaker:
        assert self.cb is not None
        return self.cb

    @initialize(config=configs())
    def make(self, config: BreakerConfig) -> None:
        self.cb = CircuitBreaker("stateful", config)
        self.cb.add_listener(self._heard)

    def _heard(self, event: Any) -> None:
        assert event.old is not event.new
        self.transitions += 1

    def teardown(self) -> None:
        try:
            if self.cb is not None:
                self.settle_everything()
        finally:
            self.restore.__exit__(None, None, None)

    # Rules.

    @rule()
    def acquire(self) -> None:
        cb = self.breaker
        expected = cb.retry_after()
        if expected > 0:
            with pytest.raises(CircuitOpen) as info:
                cb.acquire()
            assert info.value.retry_after == expected
            assert info.value.name == "stateful"
        else:
            self.held.append(cb.acquire())

    @rule(calls=st.integers(1, 6))
    def rush(self, calls: int) -> None:
        """Several callers arrive at once (concurrent probes when half-open),
        each holding its permit."""
        for _ in range(calls):
            self.acquire()

    @rule(took=st.sampled_from([0.0, 1.0, 5.0]))
    def fail_until_open(self, took: float) -> None:
        """Failing calls in a row, until the breaker stops admitting."""
        cb = self.breaker
        for _ in range(cb.config.minimum_calls + 6):
            try:
                permit = cb.acquire()
            except CircuitOpen:
                return
            self.clock.advance(took)
            permit.failure(ConnectionError())
            self.settled.append(permit)

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 1000), outcome=OUTCOMES)
    def settle(self, index: int, outcome: str) -> None:
        permit = self.held.pop(index % len(self.held))
        self._settle(permit, outcome)
        self.settled.append(permit)
        m = self.breaker._m
        if permit.probe and permit.epoch == m.epoch:
            assert permit.probe not in m.probes

    @precondition(lambda self: self.settled)
    @rule(index=st.integers(0, 1000), outcome=OUTCOMES)
    def settle_again(self, index: int, outcome: str) -> None:
        """Settling a permit a second time changes nothing."""
        before = self.breaker.statistics()
        self._settle(self.settled[index % len(self.settled)], outcome)
        assert self.breaker.statistics() == before

    @rule(seconds=st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 9.9, 30.0, 61.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def wait_out_the_open_interval(self) -> None:
        """Once the open interval has passed, a call is always admitted."""
        cb = self.breaker
        if cb.state is not BreakerState.OPEN:
            return
        self.clock.advance(cb.retry_after())
        self.held.append(cb.acquire())

    @rule(action=st.sampled_from(["force_open", "reset"]))
    def manual(self, action: str) -> None:
        """force_open() and reset(), one rule so they are not too common."""
        if action == "force_open":
            self.breaker.force_open()
            assert self.breaker.state is BreakerState.FORCED_OPEN
        else:
            self.breaker.reset()
            assert self.breaker.state is BreakerState.CLOSED

    # Invariants.

    @invariant()
    def probes_never_exceed_the_cap(self) -> None:
        if self.cb is None:
            return
        s = self.cb.statistics()
        cap = self.cb.config.half_open_probes
        event(f"{s.state.value}, {s.probes_in_flight} of {cap} probes")
        assert s.probes_in_flight <= cap
        if s.state is not BreakerState.HALF_OPEN:
            assert s.probes_in_flight == 0

    @invariant()
    def slots_held_only_by_unsettled_permits(self) -> None:
        if self.cb is None:
            return
        m = self.cb._m
        holders = {p.probe for p in self.held if p.epoch == m.epoch}
        assert set(m.probes) <= holders
        assert m.outbox == []

    @invariant()
    def window_is_consistent(self) -> None:
        if self.cb is None:
            return
        s = self.cb.statistics()
        assert 0 <= s.failures <= s.calls
        assert 0 <= s.slow_calls <= s.calls
        assert s.retry_after >= 0
        assert s.times_opened <= self.transitions

    # Helpers.

    def _settle(self, permit: BreakerPermit, outcome: str) -> None:
        if outcome == "success":
            permit.success()
        elif outcome == "failure":
            permit.failure(ConnectionError())
        elif outcome == "other_exception":
            permit.failure(ValueError())
        elif outcome == "ignored_exception":
            permit.failure(KeyError())
        elif outcome == "cancelled":
            permit.failure(asyncio.CancelledError())
        else:
            permit.ignore()

    def settle_everything(self) -> None:
        """Every permit settled: no probe slot is left held."""
        while self.held:
            self.held.pop().success()
        assert self.breaker._m.probes == {}
        assert self.breaker.statistics().probes_in_flight == 0


BreakerStates.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
TestBreakerStates = BreakerStates.TestCase


@pytest.mark.parametrize("jump", [0.0, 3.0, 100.0])
def test_probe_after_a_stuck_one(jump: float) -> None:
    """A stuck probe frees its breaker: after the probe timeout and the
    re-opened interval, a new probe is admitted (a fixed walk the state
    machine also finds)."""
    clock = resilient.testing.FakeClock(start=0.0)
    with resilient.testing.use_clock(clock):
        cb = CircuitBreaker(
            "stuck",
            BreakerConfig(
                window=CountWindow(1),
                minimum_calls=1,
                open_interval=5.0,
                half_open_probes=1,
                probe_timeout=2.0,
            ),
        )
        cb.acquire().failure(ConnectionError())
        clock.advance(5.0)
        stuck = cb.acquire()
        clock.advance(2.0 + jump)
        with pytest.raises(CircuitOpen):
            cb.acquire()
        clock.advance(cb.retry_after())
        probe = cb.acquire()
        stuck.success()
        probe.success()
        assert cb.state is BreakerState.CLOSED
