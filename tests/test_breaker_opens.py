"""
A closed breaker opens on the call that brings its window to
*minimum_calls*, whatever that call's outcome, in every form a call takes:
the decorator (functions and generators), ``with`` / ``async with``, a
permit, a policy with a breaker, and a policy with a breaker and a
bulkhead (the fused pair), sync and on asyncio and trio.

Issue 15, section 2: from 530b243 to 4f15275 calls F, F, F, S, S with
``CountWindow(10)``, ``minimum_calls=5``, ``failure_rate=0.5`` left the
breaker closed at 60 % failures: a closed success went to the lock-free
inbox, which is counted without the threshold check, even when it was the
call that brought the window to *minimum_calls*.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient import (
    BreakerConfig,
    BreakerState,
    BulkheadConfig,
    CountWindow,
    TimeWindow,
)
from resilient._breaker import breaker as get_breaker
from tests.conftest import Driver


_names = itertools.count()

SHAPES = [
    "decorator",
    "with",
    "permit",
    "stream",
    "policy",
    "policy+bulkhead",
    "policy-block",
]


def _config(window: Any) -> BreakerConfig:
    return BreakerConfig(
        window=window, minimum_calls=5, failure_rate=0.5, open_interval=30
    )


def _guarded(
    shape: str, driver: Driver, config: BreakerConfig
) -> tuple[str, Callable[[bool], None]]:
    """A breaker's name and a call through it in *shape*: the call fails
    (a `ConnectionError`, a dependency failure) when given False."""
    name = f"opens-{shape}-{next(_names)}"
    cb = get_breaker(name, config)
    policy = resilient.Policy(
        name=name,
        attempts=1,
        budget=None,
        breaker=config,
        bulkhead=(
            BulkheadConfig(max_concurrent=4, max_waiting=0, max_wait=0)
            if shape == "policy+bulkhead"
            else None
        ),
    )

    def body(ok: bool) -> str:
        if not ok:
            raise ConnectionError("down")
        return "ok"

    def run(ok: bool) -> None:
        if shape in {"decorator", "policy", "policy+bulkhead"}:
            guard: Any = cb if shape == "decorator" else policy
            driver.call(guard, body, ok)
        elif shape == "with":
            if not driver.is_async:
                with cb:
                    body(ok)
                return

            async def main() -> None:
                async with cb:
                    await anyio.lowlevel.checkpoint()
                    body(ok)

            anyio.run(main, backend=driver.kind)
        elif shape == "permit":
            if not driver.is_async:
                permit = cb.acquire()
                if ok:
                    permit.success()
                else:
                    permit.failure(ConnectionError("down"))
                    raise ConnectionError("down")
                return

            async def amain() -> None:
                permit = await cb.aacquire()
                await anyio.lowlevel.checkpoint()
                if ok:
                    await permit.asuccess()
                else:
                    await permit.afailure(ConnectionError("down"))
                    raise ConnectionError("down")

            anyio.run(amain, backend=driver.kind)
        elif shape == "stream":
            if not driver.is_async:

                @cb
                def items() -> Iterator[int]:
                    yield 1
                    body(ok)

                list(items())
                return

            @cb
            async def aitems() -> Any:
                yield 1
                await anyio.lowlevel.checkpoint()
                body(ok)

            async def smain() -> None:
                async for _ in aitems():
                    pass

            anyio.run(smain, backend=driver.kind)
        else:  # policy-block
            driver.block(policy, lambda attempt: body(ok))

    return name, run


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "window", [CountWindow(10), TimeWindow(60)], ids=["count", "time"]
)
def test_the_success_that_reaches_minimum_calls_opens(
    shape: str, window: Any, driver: Driver, clock: Any
) -> None:
    """
    F, F, F, S, S: the second success brings the window to 5 calls, 3 of
    them failed (60 % >= 50 %), so the breaker opens on it; before it, 4
    calls are under *minimum_calls* and it stays closed.
    """
    name, run = _guarded(shape, driver, _config(window))
    for ok in (False, False, False, True):
        if ok:
            run(ok)
        else:
            with pytest.raises(ConnectionError):
                run(ok)
        assert get_breaker(name).state is BreakerState.CLOSED
    run(True)
    cb = get_breaker(name)
    s = cb.statistics()
    assert (s.state, s.calls, s.failures) == (BreakerState.OPEN, 5, 3)
    assert s.times_opened == 1
    if not shape.startswith("policy"):  # A policy waits the breaker out.
        with pytest.raises(resilient.CircuitOpen):
            run(True)


@pytest.mark.parametrize("shape", SHAPES)
def test_successes_past_minimum_calls_are_counted(
    shape: str, driver: Driver, clock: Any
) -> None:
    """
    Successes once the window holds *minimum_calls* calls (the lock-free
    ones) are counted: S x 5, then F x 5 is 50 % of 10, which opens; F x 4
    is 40 % and does not.
    """
    name, run = _guarded(shape, driver, _config(CountWindow(10)))
    for _ in range(5):
        run(True)
    for _ in range(4):
        with pytest.raises(ConnectionError):
            run(False)
    s = get_breaker(name).statistics()
    assert (s.state, s.calls, s.failures) == (BreakerState.CLOSED, 9, 4)
    with pytest.raises(ConnectionError):
        run(False)
    assert get_breaker(name).state is BreakerState.OPEN


def test_a_success_after_a_bucket_left_is_checked(
    driver: Driver, clock: Any
) -> None:
    """
    In a time window a bucket that leaves can take successes with it and
    leave fewer calls than *minimum_calls*; the next success is checked as
    any call: S x 3 at 0 s, F x 3 and S at 30 s (7 calls, 43 %), then at
    60.5 s the first bucket has left (4 calls) and a success makes 5 calls,
    3 failed: 60 %, which opens at ``failure_rate=0.6``.
    """
    config = BreakerConfig(
        window=TimeWindow(60), minimum_calls=5, failure_rate=0.6
    )
    cb = get_breaker(f"bucket-left-{next(_names)}", config)

    def body(ok: bool) -> str:
        if not ok:
            raise ConnectionError("down")
        return "ok"

    start = clock.now()
    clock.advance(-start % 60 + 0.25)  # Early in a bucket.
    for ok in (True, True, True):
        driver.call(cb, body, ok)
    clock.advance(30)
    for _ in range(3):
        with pytest.raises(ConnectionError):
            driver.call(cb, body, False)
    driver.call(cb, body, True)
    assert cb.statistics().calls == 7
    clock.advance(30.25)
    driver.call(cb, body, True)
    assert cb.state is BreakerState.OPEN


@pytest.mark.parametrize(
    ("rate", "calls", "bad"), [(0.3, 10, 3), (0.7, 10, 7), (0.6, 5, 3)]
)
@pytest.mark.parametrize("slow", [False, True], ids=["failed", "slow"])
def test_a_rate_reached_exactly_opens(
    rate: float, calls: int, bad: int, slow: bool, clock: Any
) -> None:
    """
    "At least this fraction": *bad* of *calls* at a rate of exactly
    ``bad / calls`` opens (at 4f15275, ``failures >= calls * rate`` read
    3 of 10 as under 0.3, since ``10 * 0.3`` is 3.0000000000000004).
    """
    config = BreakerConfig(
        window=CountWindow(calls),
        minimum_calls=calls,
        failure_rate=rate,
        slow_call_rate=rate,
        slow_call_duration=1.0 if slow else None,
    )
    cb = get_breaker(f"exact-{next(_names)}", config)
    for i in range(calls):
        permit = cb.acquire()
        if i < bad and slow:
            clock.advance(1.0)
            permit.success()
        elif i < bad:
            permit.failure(ConnectionError("down"))
        else:
            permit.success()
    assert cb.state is BreakerState.OPEN
    assert cb.statistics().times_opened == 1


@pytest.mark.parametrize("shape", ["decorator", "with", "permit", "policy"])
@pytest.mark.parametrize("op", ["force_open", "trip"])
def test_successes_queued_lock_free_survive_an_opening(
    shape: str, op: str, driver: Driver, clock: Any
) -> None:
    """
    Successes counted lock-free (the inbox) are in the window an open
    breaker shows: S x 7 then `force_open()` shows 7 calls, and S x 7 then
    F x 5 opens at 5 failures of 12 (at 4f15275 the inbox was dropped with
    the closed state: 0 calls shown after `force_open`).
    """
    config = BreakerConfig(
        window=CountWindow(20), minimum_calls=2, failure_rate=5 / 12
    )
    name, run = _guarded(shape, driver, config)
    for _ in range(7):
        run(True)
    cb = get_breaker(name)
    if op == "force_open":
        cb.force_open()
        s = cb.statistics()
        assert (s.state, s.calls, s.failures) == (
            BreakerState.FORCED_OPEN,
            7,
            0,
        )
        return
    for _ in range(4):
        with pytest.raises(ConnectionError):
            run(False)
    assert cb.state is BreakerState.CLOSED
    with pytest.raises(ConnectionError):
        run(False)
    s = cb.statistics()
    assert (s.state, s.calls, s.failures) == (BreakerState.OPEN, 12, 5)
