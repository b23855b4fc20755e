"""
Circuit breakers under storms of asynchronous exceptions: thrown into worker
threads with ``PyThreadState_SetAsyncExc``, fired in the main thread by
``timeout(interrupt=True)``, and cancellations of asyncio and trio tasks at
random points. Afterwards the lock is free, no half-open probe is left in
flight, and every call the callers saw end was counted exactly once.
"""

from __future__ import annotations

import gc
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient import BreakerConfig, CircuitBreaker, CountWindow, TimeWindow

from .storm import interrupt_storm, storm


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """Fresh registries after each test (conftest's storm fixture takes
    the garbage-collector callbacks away during it)."""
    yield
    resilient.testing.reset_registries()


def _never_opens(name: str, *, timed: bool = False) -> CircuitBreaker:
    """
    A breaker that never opens and whose window holds every call: a count
    window of 1,000,000 calls, or (*timed*) a time window of 10**9 s, which
    holds any number (a thread storm makes over a million calls on a fast
    machine: a count window would drop the oldest).
    """
    return resilient.breaker(
        name,
        BreakerConfig(
            window=TimeWindow(1e9) if timed else CountWindow(1_000_000),
            minimum_calls=1_000_000,
            failure_rate=1.0,
            failure_on=ConnectionError,
            ignore_on=resilient.TimedOut,
        ),
    )


def _cycling(name: str) -> CircuitBreaker:
    """
    A breaker that opens on 2 failures of 4 and half-opens after 0.1 ms of
    real time: calls keep it moving through every state. Its probes never
    time out during a test, so only settling (or a dropped permit) frees a
    probe's slot.
    """
    return resilient.breaker(
        name,
        BreakerConfig(
            window=CountWindow(4),
            minimum_calls=2,
            open_interval=1e-4,
            max_open_interval=1e-4,
            half_open_probes=2,
            probe_timeout=3600.0,
            failure_on=ConnectionError,
            ignore_on=resilient.TimedOut,
        ),
    )


class _Tally(threading.local):
    """One thread's view: what its calls did, as it saw them."""

    def __init__(self) -> None:
        self.i = 0
        self.ran_ok = 0  # The protected function returned.
        self.ran_failed = 0  # It raised ConnectionError.
        self.ok = 0  # The call through the breaker returned.
        self.failed = 0  # It raised ConnectionError.
        self.rejected = 0


def _body(cb: CircuitBreaker, tally: _Tally) -> Callable[[], None]:
    """One call per run, cycling through the three sync forms."""

    @cb
    def through(fn: Callable[[], int]) -> int:
        return fn()

    def body() -> None:
        t = tally
        i = t.i
        t.i = i + 1
        fail = i % 2 == 1

        def fn() -> int:
            if fail:
                t.ran_failed += 1
                raise ConnectionError
            t.ran_ok += 1
            return 1

        form = (i // 2) % 3
        try:
            if form == 0:
                with cb:
                    fn()
            elif form == 1:
                through(fn)
            else:
                permit = cb.acquire()
                try:
                    fn()
                except BaseException as exc:
                    permit.failure(exc)
                    raise
                permit.success()
        except ConnectionError:
            t.failed += 1
            return
        except resilient.CircuitOpen:
            t.rejected += 1
            return
        t.ok += 1

    return body


def _check_free(cb: CircuitBreaker) -> None:
    """The lock is free and no probe is in flight once permits are gone."""
    gc.collect()
    lock = cb._lock
    assert lock.acquire(blocking=False), "the breaker's lock is held"
    lock.release()
    assert cb.statistics().probes_in_flight == 0


def _check_counts(cb: CircuitBreaker, tallies: list[dict[str, int]]) -> None:
    """
    Every call a caller saw succeed or fail was counted, and nothing was
    counted that did not run to its end, so none twice: exactly.

    (An exception that lands between the protected function's end and the
    caller's tally leaves a call counted that the caller did not see, so
    the bounds are a range: from what the callers saw to what ran.)
    """
    stats = cb.statistics()
    successes = stats.calls - stats.failures
    total = {k: sum(t[k] for t in tallies) for k in tallies[0]}
    assert total["ok"] <= successes <= total["ran_ok"], (stats, total)
    assert total["failed"] <= stats.failures <= total["ran_failed"], (
        stats,
        total,
    )
    assert total["ok"] > 1000


def test_thread_storm_counts_exactly() -> None:
    """
    700 asynchronous exceptions thrown into 2 threads calling through
    one breaker (with, decorator, permit): the lock is free afterwards and
    the counts agree with what the callers saw.
    """
    cb = _never_opens("storm-count", timed=True)
    tallies: list[dict[str, int]] = []
    tally = _Tally()
    body = _body(cb, tally)
    result = storm(
        body,
        exceptions=700,
        threads=2,
        seed=11,
        finish=lambda: tallies.append(dict(vars(tally))),
    )
    result.check()
    _check_free(cb)
    _check_counts(cb, tallies)


def test_thread_storm_through_every_state() -> None:
    """
    700 asynchronous exceptions into 2 threads whose calls open,
    half-open and close the breaker over and over: no lock held, no probe
    slot leaked, and the breaker still admits calls afterwards.
    """
    cb = _cycling("storm-cycle")
    tally = _Tally()
    result = storm(_body(cb, tally), exceptions=700, threads=2, seed=12)
    result.check()
    _check_free(cb)
    assert cb.statistics().times_opened > 10
    cb.reset()
    with cb:
        pass


def test_interrupt_storm_in_the_main_thread() -> None:
    """
    1,000 firings of ``timeout(interrupt=True)`` at random points of calls
    through a cycling breaker and a counting one: both locks free, no probe
    left, counts exact.
    """
    cycling = _cycling("interrupt-cycle")
    counting = _never_opens("interrupt-count")
    tally = _Tally()
    a, b = _body(cycling, _Tally()), _body(counting, tally)

    def body() -> None:
        a()
        b()

    result = interrupt_storm(body, firings=1_000, max_delay=3e-4, seed=13)
    result.check()
    for cb in (cycling, counting):
        _check_free(cb)
    _check_counts(counting, [dict(vars(tally))])


@pytest.mark.anyio
async def test_task_cancellation_storm() -> None:
    """
    8 tasks make 300 calls each through two breakers (``async with`` and
    the async decorator), each call under a cancel scope that expires at a
    random point, with an async listener awaited on every state change:
    locks free, no probe left, counts exact.
    """
    cycling = _cycling("tasks-cycle")
    counting = _never_opens("tasks-count")
    heard: list[Any] = []

    async def listener(event: Any) -> None:
        await anyio.lowlevel.checkpoint()
        heard.append(event)

    cycling.add_listener(listener)
    tallies = {
        cb: {"ran_ok": 0, "ran_failed": 0, "ok": 0, "failed": 0}
        for cb in (cycling, counting)
    }

    def protected(cb: CircuitBreaker) -> Callable[[bool, int], Any]:
        tally = tallies[cb]

        async def fn(fail: bool, waits: int) -> int:
            for _ in range(waits):
                await anyio.lowlevel.checkpoint()
            if fail:
                tally["ran_failed"] += 1
                raise ConnectionError
            tally["ran_ok"] += 1
            return 1

        return fn

    plain = {cb: protected(cb) for cb in (cycling, counting)}
    guarded = {cb: cb(plain[cb]) for cb in (cycling, counting)}

    async def one(cb: CircuitBreaker, rng: random.Random) -> None:
        fail, waits = rng.random() < 0.5, rng.randrange(3)
        tally = tallies[cb]
        try:
            if rng.random() < 0.5:
                async with cb:
                    await plain[cb](fail, waits)
            else:
                await guarded[cb](fail, waits)
        except ConnectionError:
            tally["failed"] += 1
            return
        except resilient.CircuitOpen:
            return
        tally["ok"] += 1

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            cb = rng.choice((cycling, counting))
            with anyio.CancelScope() as scope:
                if rng.random() < 0.7:
                    scope.deadline = anyio.current_time() + rng.choice(
                        (0.0, 1e-5, 1e-4)
                    )
                await one(cb, rng)

    async with anyio.create_task_group() as tg:
        for n in range(8):
            tg.start_soon(worker, n)
    for cb in (cycling, counting):
        _check_free(cb)
    stats = counting.statistics()
    successes = stats.calls - stats.failures
    tally = tallies[counting]
    assert tally["ok"] <= successes <= tally["ran_ok"]
    assert tally["failed"] <= stats.failures <= tally["ran_failed"]
    assert heard
    assert cycling.statistics().times_opened > 0
