"""
The whole pipeline a Policy describes: budget -> retry (with retry budget)
-> breaker -> bulkhead -> attempt timeout -> call, against the sync and the
async shells, in both forms, in virtual time.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient import Constant, Policy
from resilient._breaker import breaker as get_breaker
from resilient._bulkhead import get_bulkhead
from resilient._core._config_breaker import BreakerConfig, CountWindow
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._core._config_retry_budget import RetryBudgetConfig
from resilient.exceptions import BulkheadFull, CircuitOpen
from tests.conftest import Driver


_names = itertools.count()


def fresh(prefix: str) -> str:
    """A dependency name no other test uses (registries are per process)."""
    return f"{prefix}-{next(_names)}"


def tripping_breaker(open_interval: float = 10.0) -> BreakerConfig:
    """A breaker that opens after 2 failures of the last 2 calls."""
    return BreakerConfig(
        window=CountWindow(size=2),
        minimum_calls=2,
        failure_rate=1.0,
        open_interval=open_interval,
        half_open_probes=1,
    )


def failing(times: int) -> tuple[Any, list[int]]:
    calls: list[int] = []

    def body() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise ConnectionError(len(calls))
        return "ok"

    return body, calls


class TestBreakerStage:
    def test_retry_outwaits_open_breaker(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        When the breaker opens, retry waits until it admits a probe (not a
        backoff against the open breaker), then the probe succeeds.
        """
        policy = Policy(
            name=fresh("outwait"),
            attempts=5,
            budget=60,
            backoff=Constant(seconds=1),
            breaker=tripping_breaker(open_interval=10),
        )
        body, calls = failing(2)
        assert driver.call(policy, body) == "ok"
        # Two failures (1 s backoff between) open the breaker; retry does
        # not try into it but waits out the 10 s open interval, spread over
        # [10, 20] s so a fleet does not return at once, plus its own
        # backoff; then the probe succeeds.
        assert len(calls) == 3
        first, wait = clock.sleeps
        assert first == 1.0
        assert 11.0 <= wait <= 21.0
        cb = get_breaker(policy.name)
        assert cb.state.value == "closed"

    def test_cannot_outwait_gives_up_without_calling(
        self, driver: Driver, clock: Any
    ) -> None:
        """An open breaker that will not admit in time ends retry at once."""
        policy = Policy(
            name=fresh("noway"),
            attempts=10,
            budget=5,
            backoff=Constant(seconds=1),
            breaker=tripping_breaker(open_interval=30),
        )
        body, calls = failing(100)
        # The second failure opens the breaker: rather than retry into it,
        # retry gives up with the dependency's own error.
        with pytest.raises(ConnectionError) as info:
            driver.call(policy, body)
        assert len(calls) == 2
        assert clock.sleeps == [1.0]
        assert "(breaker open)" in info.value.__notes__[0]
        # A later call is rejected at once; the dependency is not touched.
        with pytest.raises(CircuitOpen) as rejected:
            driver.call(policy, body)
        assert len(calls) == 2
        assert rejected.value.retry_after == pytest.approx(30.0)
        assert "(breaker open)" in rejected.value.__notes__[0]

    def test_block_form_outwaits_breaker(
        self, driver: Driver, clock: Any
    ) -> None:
        """The block form waits out the breaker the same way."""
        policy = Policy(
            name=fresh("block"),
            attempts=5,
            budget=60,
            backoff=Constant(seconds=1),
            breaker=tripping_breaker(open_interval=7),
        )
        body, calls = failing(2)
        assert driver.block(policy, lambda a: body()) == "ok"
        first, wait = clock.sleeps
        assert first == 1.0
        assert 8.0 <= wait <= 15.0

    def test_block_form_outwaits_a_rejection(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        In the block form a breaker already open when the loop starts
        rejects in the iterator; the iterator waits it out and hands over an
        attempt that is admitted as the probe.
        """
        policy = Policy(
            name=fresh("block-open"),
            attempts=3,
            budget=60,
            backoff=Constant(seconds=0),
            breaker=tripping_breaker(open_interval=5),
        )
        opener = policy.evolve(attempts=1)
        for _ in range(2):
            with pytest.raises(ConnectionError):
                driver.call(opener, failing(1)[0])
        assert get_breaker(policy.name).state.value == "open"
        numbers: list[int] = []

        def block(attempt: resilient.Attempt) -> str:
            numbers.append(attempt.number)
            return "probe ok"

        assert driver.block(policy, block) == "probe ok"
        assert numbers == [1]  # the rejection was not an attempt
        (wait,) = clock.sleeps
        assert 5.0 <= wait <= 10.0
        assert get_breaker(policy.name).state.value == "closed"

    def test_non_failures_not_counted(
        self, driver: Driver, clock: Any
    ) -> None:
        """Exceptions the breaker does not count leave it closed."""
        policy = Policy(
            name=fresh("ignored"),
            attempts=1,
            breaker=BreakerConfig(
                window=CountWindow(size=2),
                minimum_calls=2,
                failure_rate=1.0,
                failure_on=ConnectionError,
            ),
        )

        def body() -> None:
            raise KeyError("not the dependency's fault")

        for _ in range(5):
            with pytest.raises(KeyError):
                driver.call(policy, body)
        stats = get_breaker(policy.name).statistics()
        assert stats.state.value == "closed"

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_caller_cancellation_not_counted(self, kind: str) -> None:
        """Cancelling the caller releases the permit without a failure."""
        policy = Policy(
            name=fresh("cancel"),
            budget=None,
            breaker=tripping_breaker(),
        )

        @policy
        async def body() -> None:
            await anyio.sleep(30)

        async def main() -> None:
            for _ in range(3):
                with anyio.move_on_after(0.002):
                    await body()

        anyio.run(main, backend=kind)
        stats = get_breaker(policy.name).statistics()
        assert stats.state.value == "closed"

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_own_timeout_counts_budget_expiry_does_not(
        self, kind: str
    ) -> None:
        """
        An attempt's own timeout is the dependency's failure; running out of
        the caller's budget is not.
        """
        slow = Policy(
            name=fresh("timeout"),
            attempts=1,
            timeout=0.002,
            budget=None,
            breaker=tripping_breaker(),
        )
        budget_only = slow.evolve(
            name=fresh("budget"), timeout=None, budget=0.002
        )

        async def hang() -> None:
            await anyio.sleep(30)

        async def main() -> None:
            for policy in (slow, budget_only):
                for _ in range(2):
                    with pytest.raises(resilient.DeadlineExceeded):
                        await resilient.retry(policy)(hang)()

        anyio.run(main, backend=kind)
        assert get_breaker(slow.name).state.value == "open"
        assert get_breaker(budget_only.name).state.value == "closed"

    def test_rejections_are_not_attempts(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        A CircuitOpen rejection (here from a breaker the call uses inside)
        is outwaited with jitter, is not counted as an attempt and spends
        no retry budget; at most `attempts` rejections are tolerated.
        """
        policy = Policy(
            name=fresh("nested"),
            attempts=2,
            budget=None,
            backoff=Constant(seconds=0.5),
            retry_budget=RetryBudgetConfig(ratio=0.0, min_per_second=0),
        )
        outcomes = iter(
            [CircuitOpen("inner", 3.0), CircuitOpen("inner", 3.0), "ok"]
        )

        def body() -> str:
            outcome = next(outcomes)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        assert driver.call(policy, body) == "ok"
        assert len(clock.sleeps) == 2
        assert all(3.5 <= s <= 6.5 for s in clock.sleeps)
        outcomes = iter([CircuitOpen("inner", 1.0)] * 3)
        with pytest.raises(CircuitOpen) as info:
            driver.call(policy, body)
        assert "(attempts)" in info.value.__notes__[0]

    def test_forced_open_breaker_gives_up_at_once(
        self, driver: Driver, clock: Any
    ) -> None:
        """A forced-open breaker cannot be outwaited: no wait, no call."""
        policy = Policy(name=fresh("forced"), breaker=BreakerConfig())
        body, calls = failing(0)
        fn = driver.fn(body)
        wrapped = policy(fn)
        get_breaker(policy.name).force_open()
        with pytest.raises(CircuitOpen) as info:
            driver.run(wrapped)
        assert calls == []
        assert clock.sleeps == []
        assert "(breaker open)" in info.value.__notes__[0]


class TestBareFirstAttempt:
    """A policy whose only guard is a closed breaker runs its first
    attempt without the loop's machinery; it must count the same."""

    def policy(self, name: str, **changes: Any) -> Policy:
        return Policy(
            name=fresh(name),
            budget=None,
            backoff=Constant(seconds=0),
            breaker=BreakerConfig(
                window=CountWindow(size=10), minimum_calls=5
            ),
            **changes,
        )

    def test_success_and_failure_are_counted(
        self, driver: Driver, clock: Any
    ) -> None:
        """A first-attempt success counts once; a failure then a success
        count twice, one of them failed."""
        policy = self.policy("bare")
        assert driver.call(policy, lambda: "ok") == "ok"
        stats = get_breaker(policy.name).statistics()
        assert (stats.calls, stats.failures) == (1, 0)
        body, calls = failing(1)
        assert driver.call(policy, body) == "ok"
        stats = get_breaker(policy.name).statistics()
        assert (stats.calls, stats.failures) == (3, 1)

    def test_an_open_breaker_takes_the_full_path(
        self, driver: Driver, clock: Any
    ) -> None:
        """With the breaker forced open the call is rejected, untouched."""
        policy = self.policy("bare-open")
        fn = policy(driver.fn(lambda: "never"))
        get_breaker(policy.name).force_open()
        with pytest.raises(CircuitOpen):
            driver.run(fn)

    def test_a_callers_deadline_is_not_the_dependencys_failure(
        self, driver: Driver, clock: Any
    ) -> None:
        """A DeadlineExceeded from the call (the caller's own deadline,
        no attempt timeout) is not counted against the dependency."""
        policy = self.policy("bare-deadline", retry_on=lambda exc: False)

        def body() -> None:
            raise resilient.DeadlineExceeded(0.0)

        for _ in range(3):
            with pytest.raises(resilient.DeadlineExceeded):
                driver.call(policy, body)
        stats = get_breaker(policy.name).statistics()
        assert (stats.calls, stats.state.value) == (0, "closed")


class TestBulkheadStage:
    def test_full_bulkhead_rejects_without_counting(self, clock: Any) -> None:
        """A full bulkhead raises BulkheadFull; the breaker is not told."""
        name = fresh("full")
        policy = Policy(
            name=name,
            attempts=3,
            backoff=Constant(seconds=0),
            bulkhead=BulkheadConfig(max_concurrent=1, max_waiting=0),
            breaker=tripping_breaker(),
        )
        held = get_bulkhead(name, policy.bulkhead).acquire_nowait()
        calls: list[int] = []
        try:
            for _ in range(3):
                with pytest.raises(BulkheadFull):
                    policy(lambda: calls.append(1))()
        finally:
            held.release()
        assert calls == []
        assert get_breaker(name).statistics().state.value == "closed"
        assert policy(lambda: "free")() == "free"
        assert get_bulkhead(name).statistics().in_use == 0

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_async_bulkhead_bounds_tasks(self, kind: str) -> None:
        """At most max_concurrent tasks are inside the call at once."""
        name = fresh("tasks")
        policy = Policy(
            name=name,
            budget=None,
            bulkhead=BulkheadConfig(
                max_concurrent=3, max_waiting=100, max_wait=None
            ),
        )
        inside = 0
        peak = 0

        @policy
        async def body() -> None:
            nonlocal inside, peak
            inside += 1
            peak = max(peak, inside)
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            inside -= 1

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(body)

        anyio.run(main, backend=kind)
        assert peak == 3
        assert get_bulkhead(name).statistics().in_use == 0

    def test_block_form_with_bulkhead(self, driver: Driver) -> None:
        """The block form takes and returns bulkhead slots."""
        name = fresh("blockbh")
        policy = Policy(
            name=name,
            backoff=Constant(seconds=0),
            bulkhead=BulkheadConfig(max_concurrent=1),
        )
        body, calls = failing(1)
        assert driver.block(policy, lambda a: body()) == "ok"
        stats = get_bulkhead(name).statistics()
        assert stats.in_use == 0
        assert stats.acquired == 2


class TestRetryBudgetStage:
    def test_budget_refuses_retries(self, driver: Driver, clock: Any) -> None:
        """
        With no floor and a 50 % ratio, the first call may retry once; a
        refused retry re-raises the error with a note saying why.
        """
        policy = Policy(
            name=fresh("rb"),
            attempts=10,
            backoff=Constant(seconds=0),
            retry_budget=RetryBudgetConfig(ratio=0.5, min_per_second=0),
        )
        body, calls = failing(100)
        with pytest.raises(ConnectionError) as info:
            driver.call(policy, body)
        notes = info.value.__notes__
        assert "(retry budget)" in notes[0]
        assert len(notes) == 2
        assert len(calls) == 1  # 0.5 tokens: no whole retry yet
        calls.clear()
        with pytest.raises(ConnectionError):
            driver.call(policy, body)
        assert len(calls) == 2  # 1.0 tokens now: one retry


class TestConcurrency:
    def test_no_lock_held_around_the_call(self) -> None:
        """
        32 threads are inside one closed breaker and one bulkhead at the
        same time: a barrier of 32 inside the call only opens if nothing
        serialises the calls.
        """
        name = fresh("barrier")
        barrier = threading.Barrier(32, timeout=10)
        policy = Policy(
            name=name,
            attempts=1,
            breaker=BreakerConfig(),
            bulkhead=BulkheadConfig(max_concurrent=32, max_waiting=0),
        )

        @policy
        def call() -> int:
            return barrier.wait()

        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(call()))
            for _ in range(32)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == list(range(32))

    def test_counts_add_up_under_contention(self) -> None:
        """
        32 threads x 10,000 calls through one breaker and one bulkhead:
        successes + failures + rejections == calls, exactly, and the
        bulkhead's limit is never exceeded.
        """
        name = fresh("stress")
        limit = 4
        policy = Policy(
            name=name,
            attempts=1,
            budget=None,
            breaker=BreakerConfig(
                window=CountWindow(size=50),
                minimum_calls=20,
                failure_rate=0.6,
                open_interval=0.001,
                half_open_probes=2,
            ),
            bulkhead=BulkheadConfig(
                max_concurrent=limit, max_waiting=0, max_wait=0
            ),
        )
        lock = threading.Lock()
        inside = 0
        peak = 0
        per_thread = 10_000

        @policy
        def call(i: int) -> int:
            nonlocal inside, peak
            with lock:
                inside += 1
                peak = max(peak, inside)
            try:
                if i % 3 == 0:
                    raise ConnectionError
                return i
            finally:
                with lock:
                    inside -= 1

        totals = {"ok": 0, "failed": 0, "open": 0, "full": 0}

        def worker(seed: int) -> None:
            mine = dict.fromkeys(totals, 0)
            for i in range(per_thread):
                try:
                    call(i + seed)
                    mine["ok"] += 1
                except ConnectionError:
                    mine["failed"] += 1
                except CircuitOpen:
                    mine["open"] += 1
                except BulkheadFull:
                    mine["full"] += 1
            with lock:
                for k, v in mine.items():
                    totals[k] += v

        threads = [
            threading.Thread(target=worker, args=(n,)) for n in range(32)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(totals.values()) == 32 * per_thread
        assert peak <= limit
        assert totals["ok"] > 0
        assert totals["failed"] > 0
        bh = get_bulkhead(name).statistics()
        assert bh.in_use == 0
        assert bh.rejected == totals["full"]
        assert bh.acquired == totals["ok"] + totals["failed"]
        assert bh.acquired == bh.released
        cb = get_breaker(name).statistics()
        # A rejection is not an attempt: retry outwaits an open breaker
        # (here 1 ms) and tries again, so a rejection reaches the caller
        # only when that is not allowed; never more than the breaker made.
        assert totals["open"] <= cb.rejected
