"""
Retry budget: the sliding window in virtual time, the floor and the ratio,
thread safety, the registry, configuration and telemetry.
"""

from __future__ import annotations

import datetime as dt
import gc
import math
import random
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import resilient.testing
from resilient._core._config_retry_budget import RetryBudgetConfig
from resilient._retry_budget import (
    BUCKETS,
    RETRY_BUDGETS,
    RetryBudget,
    RetryBudgetMachine,
    get_retry_budget,
)
from resilient.exceptions import ConfigError, ConfigTypeError
from tests.conftest import Driver, Telemetry


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Every test starts with no budgets."""
    RETRY_BUDGETS.clear()
    yield
    RETRY_BUDGETS.clear()


def budget(**knobs: Any) -> RetryBudget:
    return RetryBudget("dep", RetryBudgetConfig(**knobs))


def spend(b: RetryBudget, n: int) -> int:
    """Ask for *n* retries; how many were allowed."""
    return sum(b.try_acquire_retry() for _ in range(n))


class TestAllowance:
    def test_floor_without_traffic(self, clock: Any) -> None:
        """With no calls, the floor allows min_per_second * window
        retries."""
        b = budget(ratio=0.2, min_per_second=1.0, window=10.0)
        assert spend(b, 12) == 10
        s = b.statistics()
        assert (s.retries, s.refused, s.available) == (10, 2, 0)

    def test_ratio_of_calls(self, clock: Any) -> None:
        """Without a floor, retries are ratio times the calls."""
        b = budget(ratio=0.2, min_per_second=0.0)
        assert not b.try_acquire_retry()
        for _ in range(10):
            b.record_call()
        assert spend(b, 5) == 2
        for _ in range(5):
            b.record_call()
        assert spend(b, 5) == 1
        s = b.statistics()
        assert (s.calls, s.retries, s.total_retries, s.refused) == (
            15,
            3,
            3,
            8,
        )

    @pytest.mark.parametrize(
        ("ratio", "calls", "allowed"),
        [(0.1, 10, 1), (0.1, 30, 3), (0.3, 10, 3), (0.2, 4, 0), (2.0, 3, 6)],
    )
    def test_exact_boundaries(
        self, clock: Any, ratio: float, calls: int, allowed: int
    ) -> None:
        """Float error never costs or grants a retry at the boundary."""
        b = budget(ratio=ratio, min_per_second=0.0)
        for _ in range(calls):
            b.record_call()
        assert spend(b, 10) == allowed

    def test_ratio_zero_leaves_floor(self, clock: Any) -> None:
        """ratio=0 allows only the floor, however many calls."""
        b = budget(ratio=0.0, min_per_second=0.5, window=4.0)
        for _ in range(100):
            b.record_call()
        assert spend(b, 5) == 2

    def test_no_budget_at_all(self, clock: Any) -> None:
        """ratio=0 and no floor refuses every retry."""
        b = budget(ratio=0.0, min_per_second=0.0)
        b.record_call()
        assert spend(b, 3) == 0
        assert b.statistics().refused == 3


class TestWindow:
    def test_calls_leave_the_window(self, clock: Any) -> None:
        """Calls older than the window no longer earn retries."""
        b = budget(ratio=0.5, min_per_second=0.0, window=10.0)
        for _ in range(10):
            b.record_call()
        clock.advance(9.0)
        assert b.statistics().calls == 10
        clock.advance(1.0)
        s = b.statistics()
        assert (s.calls, s.available) == (0, 0)
        assert not b.try_acquire_retry()

    def test_retries_leave_the_window(self, clock: Any) -> None:
        """Spent retries are forgotten after the window: the floor
        refills."""
        b = budget(ratio=0.0, min_per_second=1.0, window=2.0)
        assert spend(b, 3) == 2
        clock.advance(2.0)
        assert b.statistics().retries == 0
        assert spend(b, 3) == 2

    def test_window_slides_bucket_by_bucket(self, clock: Any) -> None:
        """Old calls leave one bucket at a time, not all at once."""
        b = budget(ratio=1.0, min_per_second=0.0, window=2.0)
        width = 2.0 / BUCKETS
        start = math.floor(clock.now() / width) * width
        clock.advance(start + width * 0.5 - clock.now())
        b.record_call()
        clock.advance(width)
        b.record_call()
        clock.advance(width * (BUCKETS - 1))
        assert b.statistics().calls == 1  # the first bucket left
        clock.advance(width)
        assert b.statistics().calls == 0

    def test_clock_swap_starts_afresh(self) -> None:
        """Swapping in a clock behind the budget's start resets the
        window instead of freezing it."""
        b = budget(ratio=1.0, min_per_second=0.0)
        b.record_call()
        with resilient.testing.use_clock(resilient.testing.FakeClock(0.0)):
            s = b.statistics()
            assert (s.calls, s.total_calls) == (0, 1)
            b.record_call()
            assert b.try_acquire_retry()

    def test_late_reading_counts_in_current_bucket(self, clock: Any) -> None:
        """A reading a little behind the window's head (a thread that read
        the clock late) counts in the current bucket, resetting nothing."""
        b = budget(ratio=1.0, min_per_second=0.0, window=2.0)
        b.record_call()
        behind = resilient.testing.FakeClock(clock.now() - 3 * 2.0 / BUCKETS)
        with resilient.testing.use_clock(behind):
            b.record_call()
            assert b.try_acquire_retry()
        s = b.statistics()
        assert (s.calls, s.retries) == (2, 1)

    def test_outage_bounds_load(self, clock: Any) -> None:
        """A 60 s outage at 100 calls/s with 4 attempts each: the budget
        keeps the load near 1.2x the traffic plus the floor, not 4x."""
        b = get_retry_budget("outage")
        sent = 0
        for _ in range(60 * 100):
            clock.advance(0.01)
            b.record_call()
            sent += 1
            for _attempt in range(3):
                if not b.try_acquire_retry():
                    break
                sent += 1
        calls = 60 * 100
        # 0.2 * 6000 calls + 10 retries/s * 60 s, against 18000 unbudgeted.
        assert b.statistics().total_retries == 1800
        assert sent == calls + 1800


class TestConcurrency:
    def test_threads_never_overspend(self, clock: Any) -> None:
        """8 threads recording calls and asking for retries at random:
        the retries allowed never exceed what the calls earned, and every
        request is counted once."""
        b = budget(ratio=0.25, min_per_second=1.0, window=10.0)
        asked = [0] * 8

        def worker(i: int) -> None:
            rng = random.Random(i)
            for _ in range(2000):
                if rng.random() < 0.5:
                    b.record_call()
                else:
                    asked[i] += 1
                    b.try_acquire_retry()

        threads = [
            threading.Thread(target=worker, args=(i,)) for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        s = b.statistics()
        assert s.total_calls + sum(asked) == 16000
        assert s.total_retries + s.refused == sum(asked)
        assert s.total_retries <= math.floor(0.25 * s.total_calls + 10)

    def test_threads_spend_exactly_what_was_earned(self, clock: Any) -> None:
        """Calls first, then retries from 8 threads: exactly the earned
        number is allowed."""
        b = budget(ratio=0.1, min_per_second=0.5, window=10.0)

        def calls() -> None:
            for _ in range(1000):
                b.record_call()

        def retries() -> None:
            for _ in range(500):
                b.try_acquire_retry()

        for target in (calls, retries):
            threads = [threading.Thread(target=target) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        s = b.statistics()
        assert (s.total_calls, s.total_retries, s.refused) == (
            8000,
            805,
            4000 - 805,
        )

    def test_shared_by_sync_and_async(
        self, driver: Driver, clock: Any
    ) -> None:
        """Code of any colour draws from the one budget of a name."""
        get_retry_budget("dep", ratio=0.5, min_per_second=0.0)

        def body() -> int:
            b = get_retry_budget("dep")
            for _ in range(4):
                b.record_call()
            return spend(b, 3)

        assert driver.run(driver.fn(body)) == 2
        assert get_retry_budget("dep").statistics().refused == 1

    @pytest.mark.anyio
    async def test_tasks_share_one_budget(self, clock: Any) -> None:
        """Concurrent tasks spend one budget: 10 tasks, 2 retries earned."""
        b = get_retry_budget("dep", ratio=0.2, min_per_second=0.0)
        allowed: list[bool] = []

        async def task() -> None:
            b.record_call()
            await anyio.lowlevel.checkpoint()
            allowed.append(b.try_acquire_retry())

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(task)
        assert sum(allowed) <= 2
        assert b.statistics().total_calls == 10


class TestRegistry:
    def test_one_per_name(self) -> None:
        """The same name gives the same budget, shared process-wide."""
        a = get_retry_budget("dep", ratio=0.3)
        assert get_retry_budget("dep") is a
        assert get_retry_budget("dep", RetryBudgetConfig(ratio=0.3)) is a
        assert get_retry_budget("other") is not a
        assert get_retry_budget("other").config == RetryBudgetConfig()

    def test_conflicting_config(self) -> None:
        """A different configuration for an existing name is refused,
        naming the field that differs."""
        get_retry_budget("dep", ratio=0.3)
        with pytest.raises(
            ConfigError, match=r"retry_budget\('dep'\).*ratio: 0.3 != 0.4"
        ):
            get_retry_budget("dep", ratio=0.4)

    def test_config_and_knobs(self) -> None:
        """A config object and keywords together are refused."""
        with pytest.raises(TypeError, match="not both"):
            get_retry_budget("dep", RetryBudgetConfig(), ratio=0.1)

    def test_bad_config_type(self) -> None:
        """A config that is not a RetryBudgetConfig is refused."""
        with pytest.raises(ConfigTypeError, match="retry_budget"):
            get_retry_budget("dep", 0.2)  # type: ignore[arg-type]

    def test_held_budget_is_never_duplicated(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Regression: past the registry's limit a budget still in use was
        forgotten and the next lookup made a second one with an empty
        window. Now the same name finds the same budget while it is held;
        budgets nobody holds are forgotten."""
        monkeypatch.setattr(RETRY_BUDGETS, "limit", 3)
        first = get_retry_budget("first")
        for i in range(5):
            get_retry_budget(f"b{i}")
        gc.collect()
        assert len(RETRY_BUDGETS) == 4  # 3 kept + the one still held
        assert get_retry_budget("first") is first
        del first
        for i in range(5, 10):
            get_retry_budget(f"b{i}")
        gc.collect()
        assert len(RETRY_BUDGETS) == 3

    def test_lookup_without_config_then_configured(self, clock: Any) -> None:
        """A budget made by a lookup without configuration takes the first
        explicit one while it has counted nothing; then conflicts."""
        assert get_retry_budget("dep").statistics().available == 100
        b = get_retry_budget("dep", ratio=0.5, min_per_second=0.0)
        assert b.config.ratio == 0.5
        b.record_call()
        other = get_retry_budget("other")
        other.record_call()
        with pytest.raises(ConfigError, match=r"ratio: 0\.2 != 0\.5"):
            get_retry_budget("other", ratio=0.5)

    def test_reset_starts_a_fresh_window(self, clock: Any) -> None:
        """reset_registries() resets a budget a holder keeps, in place."""
        b = get_retry_budget("dep", ratio=0.0, min_per_second=0.1)
        assert spend(b, 2) == 1
        resilient.testing.reset_registries()
        s = b.statistics()
        assert (s.retries, s.total_retries, s.refused) == (0, 0, 0)
        assert spend(b, 1) == 1


class TestMachine:
    def test_driven_in_its_own_time(self) -> None:
        """The pure machine takes the time as an argument: a simulator
        drives it in virtual time without touching the process clock."""
        m = RetryBudgetMachine(
            RetryBudgetConfig(ratio=0.5, min_per_second=0.0, window=10.0),
            now=100.0,
        )
        for t in (100.0, 101.0):
            m.record_call(t)
        assert m.try_acquire_retry(102.0)
        assert not m.try_acquire_retry(102.0)
        assert m.available(109.0) == 0
        # Both calls leave the window 10 s after they were counted.
        assert m.statistics("dep", 111.5).calls == 0
        assert (m.total_calls, m.total_retries, m.refused) == (2, 1, 1)

    def test_shell_reads_a_given_clock(self) -> None:
        """RetryBudget(clock=...) reads that clock, not the process's."""
        clock = resilient.testing.FakeClock(start=0.0)
        b = RetryBudget(
            "dep",
            RetryBudgetConfig(ratio=0.0, min_per_second=0.1, window=10.0),
            clock=clock,
        )
        assert b.try_acquire_retry()
        assert not b.try_acquire_retry()
        clock.advance(10.0)
        assert b.try_acquire_retry()

    def test_advance_cut_off_half_way_stays_consistent(self) -> None:
        """An exception between two buckets of a window move (a loop's back
        edge is where asynchronous exceptions land) leaves totals that
        match the buckets; the next step finishes the move."""
        m = RetryBudgetMachine(
            RetryBudgetConfig(ratio=1.0, min_per_second=0.0, window=2.0),
            now=0.0,
        )
        for i in range(BUCKETS):
            m.record_call(i * 0.1)
        calls = list(m._calls)

        class Cut(BaseException):
            pass

        class Buckets(list[int]):
            cuts = 0

            def __setitem__(self, i: Any, v: Any) -> None:
                super().__setitem__(i, v)
                if Buckets.cuts == 0:
                    Buckets.cuts += 1
                    raise Cut

        m._retries = Buckets(m._retries)
        with pytest.raises(Cut):
            m.record_call(2.5)
        assert m._window_calls == sum(m._calls) < sum(calls)
        m.record_call(2.5)
        assert m._window_calls == sum(m._calls)
        assert m.statistics("dep", 2.5).calls == sum(m._calls)


class TestConfig:
    def test_defaults(self) -> None:
        """Defaults are Finagle's: 20 %, 10 per second, 10 s window."""
        c = RetryBudgetConfig()
        assert (c.ratio, c.min_per_second, c.window) == (0.2, 10.0, 10.0)

    def test_conversions(self) -> None:
        """Ints and timedeltas are accepted."""
        c = RetryBudgetConfig(
            ratio=1, min_per_second=2, window=dt.timedelta(seconds=30)
        )
        assert (c.ratio, c.min_per_second, c.window) == (1.0, 2.0, 30.0)
        assert isinstance(c.ratio, float)

    @pytest.mark.parametrize(
        ("field", "value", "error"),
        [
            ("ratio", -0.1, ConfigError),
            ("ratio", 1000.5, ConfigError),
            ("ratio", True, ConfigTypeError),
            ("ratio", "0.2", ConfigTypeError),
            ("ratio", float("nan"), ConfigError),
            ("min_per_second", -1.0, ConfigError),
            ("min_per_second", float("inf"), ConfigError),
            ("window", 0.0, ConfigError),
            ("window", 0.05, ConfigError),
            ("window", 3601.0, ConfigError),
            ("window", None, ConfigTypeError),
            # Regressions: these raised OverflowError (at construction, or
            # at the first retry for a floor too large to floor()).
            ("ratio", 10**400, ConfigError),
            ("min_per_second", 10**400, ConfigError),
            ("min_per_second", 1e308, ConfigError),
            ("window", 10**400, ConfigError),
            ("ratio", dt.timedelta(seconds=1), ConfigTypeError),
            ("min_per_second", dt.timedelta(seconds=1), ConfigTypeError),
        ],
    )
    def test_bad_values(
        self, field: str, value: object, error: type[Exception]
    ) -> None:
        """Bad values raise naming RetryBudgetConfig.<field> and the
        value."""
        with pytest.raises(error) as info:
            RetryBudgetConfig(**{field: value})
        assert f"RetryBudgetConfig.{field}" in str(info.value)
        # An int too large for a float is shown as the infinity it becomes.
        big = isinstance(value, int) and value > 10**308
        assert ("got inf" if big else repr(value)) in str(info.value)


class TestReporting:
    def test_refusal_note_and_repr(self, clock: Any) -> None:
        """The note names the budget and its figures."""
        b = budget(ratio=0.2, min_per_second=0.0, window=10.0)
        for _ in range(5):
            b.record_call()
        spend(b, 2)
        assert b.refusal_note() == (
            "retry refused by the retry budget of 'dep': 1 retries for 5 "
            "calls in the last 10 s (allowed: 0.2 per call + 0 per second)"
        )
        assert (
            repr(b)
            == "<RetryBudget 'dep': 1 retries for 5 calls, 0 available>"
        )

    def test_refusals_metric(self, telemetry: Telemetry, clock: Any) -> None:
        """Each refusal adds to resilient.retry_budget.refused."""
        b = budget(ratio=0.0, min_per_second=0.0)
        spend(b, 3)
        assert telemetry.metrics()["resilient.retry_budget.refused"] == 3

    def test_no_sdk(self, clock: Any) -> None:
        """Without a meter provider, a refusal records nothing."""
        b = budget(ratio=0.0, min_per_second=0.0)
        assert not b.try_acquire_retry()
