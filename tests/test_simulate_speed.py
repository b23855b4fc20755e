"""
What the simulator's and the retry machine's speed-ups must keep: the
same draws, the same order of events, the same windows, and memory for
the calls in flight only.
"""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from resilient import simulation as sim
from resilient._core import _backoff
from resilient._core._backoff import (
    EqualJitter,
    Exponential,
    FullJitter,
    exponential_ceiling,
)
from resilient._retry import RetryMachine
from resilient._simulate import _calendar, _engine


def _ceiling_by_ldexp(base: float, cap: float, retry: int) -> float:
    """min(cap, base * 2**retry) by ldexp, as before the table."""
    if retry >= 2100:
        return cap
    try:
        window = math.ldexp(base, retry)
    except OverflowError:
        return cap
    return min(window, cap)


_bases = st.floats(min_value=5e-324, max_value=1e300, allow_nan=False)
_retries = st.one_of(
    st.integers(min_value=-5, max_value=1100),
    st.integers(min_value=1000, max_value=1030),
    st.integers(min_value=2090, max_value=2200),
)


class TestTheWindowTable:
    @given(
        base=_bases,
        factor=st.floats(min_value=1.0, max_value=1e300),
        retry=_retries,
    )
    def test_the_ceiling_is_ldexps(
        self, base: float, factor: float, retry: int
    ) -> None:
        """
        `exponential_ceiling` by the table of powers of two is the ldexp
        computation float for float, for every base, cap and retry number,
        negative ones and those past the table (1024) included.
        """
        cap = min(base * factor, 1.7e308)
        assert exponential_ceiling(base, cap, retry) == _ceiling_by_ldexp(
            base, cap, retry
        )

    @given(
        base=st.floats(min_value=1e-6, max_value=10.0),
        factor=st.floats(min_value=1.0, max_value=1e6),
        retry=_retries,
        seed=st.integers(0, 2**32),
    )
    def test_full_jitter_draws_the_same_delay(
        self, base: float, factor: float, retry: int, seed: int
    ) -> None:
        """
        `FullJitter.delay` is the window by ldexp times one draw, exactly
        as before the table; `EqualJitter` and `Exponential` agree with
        the same ceiling.
        """
        cap = base * factor
        window = _ceiling_by_ldexp(base, cap, retry)
        full = FullJitter(base=base, cap=cap).delay(
            retry, 0.0, random.Random(seed)
        )
        assert full == window * random.Random(seed).random()
        assert (
            Exponential(base=base, cap=cap).delay(
                retry, 0.0, random.Random(seed)
            )
            == window
        )
        equal = EqualJitter(base=base, cap=cap).delay(
            retry, 0.0, random.Random(seed)
        )
        assert equal == window / 2 + random.Random(seed).uniform(
            0.0, window / 2
        )

    def test_the_table_is_every_power_of_two_a_float_holds(self) -> None:
        """The table holds 2**0 to 2**1023, each exact."""
        table = _backoff._POWERS_OF_TWO
        assert len(table) == 1024
        assert all(p == math.ldexp(1.0, n) for n, p in enumerate(table))


class TestTheCalendarWheel:
    def test_slots_past_the_wheel_keep_heap_order(self) -> None:
        """
        Events in the wheel (the first 2**21 slots), past it (hours away)
        and too far for a slot of their own, first ones and pushed ones,
        come out in (time, push order), as from a heap.
        """
        wheel_end = _calendar._WHEEL_SLOTS / _calendar._SLOTS_PER_SECOND
        times = [3.0, wheel_end + 1.0, 0.5, wheel_end - 1e-6, 1e9, 1e308, 0.5]
        calendar = _calendar._Calendar(times)
        pushed = [
            (wheel_end + 1.0, 100),
            (2.0, 101),
            (1e9, 102),
            (4000.0, 103),
            (1e308 * 10, 104),
        ]
        for at, what in pushed:
            calendar.add(at, what, _calendar._slot(at))
        out = []
        while (events := calendar.next_slot()) is not None:
            out += events
        expected = sorted(
            [(at, n) for n, at in enumerate(times)] + pushed,
            key=lambda event: event[0],
        )
        assert out == expected

    def test_a_slot_is_the_floor_of_its_time(self) -> None:
        """
        A slot's number is an int, ``floor(time * 1024)``; a time whose
        product is infinite goes to the last slot, above every other.
        """
        assert _calendar._slot(0.0) == 0
        assert _calendar._slot(1.0 - 2**-40) == 1023
        assert _calendar._slot(1.0) == 1024
        assert _calendar._slot(1e308) == _calendar._LAST_SLOT
        assert _calendar._slot(1e305) < _calendar._LAST_SLOT


class TestTheEngine:
    def test_arrivals_are_the_exponential_draws(self) -> None:
        """
        The steady calls' start times, drawn with expovariate's formula
        inline, are expovariate's draws from the same seeded stream.
        """
        config = sim.SimulationConfig(
            clients=1, rate=2000, rate_until=2.0, seed=7
        )
        run = _engine._Run(config, _engine._VirtualClock())
        arrivals = random.Random("7:arrivals")
        expected = []
        at = arrivals.expovariate(2000)
        while at < 2.0:
            expected.append(at)
            at += arrivals.expovariate(2000)
        assert run.times[1:] == expected

    def test_only_calls_in_flight_keep_a_machine(self) -> None:
        """
        A call that ended (served or given up) keeps its number of
        attempts, not its `RetryMachine`; the calls still going when the
        duration stops the run keep theirs; `calls()` reads both.
        """
        config = sim.SimulationConfig(rate=2000, rate_until=8.0, duration=7.0)
        run = _engine._Run(config, _engine._VirtualClock())
        run.run()
        kept = [
            m
            for m, r in zip(run.machines, run.reasons, strict=True)
            if r != "unfinished"
        ]
        assert kept
        assert not any(isinstance(m, RetryMachine) for m in kept)
        going = [
            m
            for m, r in zip(run.machines, run.reasons, strict=True)
            if r == "unfinished"
        ]
        assert any(isinstance(m, RetryMachine) for m in going)
        attempts = run.calls().attempts
        assert sum(attempts) >= len(attempts)
        assert max(attempts) == config.policy.attempts


class TestTheSummary:
    def test_latencies_are_the_succeeded_calls_durations(self) -> None:
        """
        The latencies, taken by C iterators over the columns, are the
        durations of the calls that succeeded, in call order; a succeeded
        call with no end (which the engine never makes) is left out, as
        the loop over the calls left it.
        """
        from resilient._simulate._result import Calls, _latencies

        calls = Calls(
            [0.0, 1.0, 2.0, 3.0],
            [0.5, 4.0, None, 3.25],
            [1, 3, 2, 1],
            [None, "attempts", "unfinished", None],
        )
        assert _latencies(calls) == [0.5, 0.25]
        gap = Calls(
            [0.0, 1.0, 2.0],
            [None, 1.5, 2.5],
            [1, 1, 1],
            [None, None, "budget"],
        )
        assert _latencies(gap) == [0.5]
