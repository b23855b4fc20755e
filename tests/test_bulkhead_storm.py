"""
Bulkheads under a storm of asynchronous exceptions: exceptions thrown into
worker threads at random points (``PyThreadState_SetAsyncExc``) while they
take and give back slots through every form, ``timeout(interrupt=True)``
firings in the main thread, and random cancellations of asyncio and trio
tasks that wait or hold. Afterwards no slot is leaked, the counts add up
exactly, the lock is free and the queue is empty.
"""

from __future__ import annotations

import contextlib
import gc
import random
import sys
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient._bulkhead import Bulkhead, BulkheadStatistics, bulkhead
from tests.storm import interrupt_storm, storm, unlocked


pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="PyThreadState_SetAsyncExc"
)


@pytest.fixture(autouse=True)
def _no_foreign_finalizers() -> Iterator[None]:
    """
    Collect other tests' garbage first and keep the cyclic collector off
    during the storm: a finalizer of some leftover object that the
    collector happened to run mid-storm would swallow the exception that
    lands in it (an unraisable error that has nothing to do with the
    bulkhead). Permits in reference cycles are collected afterwards.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def settled(bh: Bulkhead) -> BulkheadStatistics:
    """The statistics once every dropped permit has been collected."""
    gc.collect()
    s = bh.statistics()
    assert unlocked(bh._machine._lock)
    return s


def clean(s: BulkheadStatistics) -> None:
    """No slot leaked, nobody queued, the counts exact."""
    assert s.in_use == 0, s
    assert s.waiting == 0, s
    assert s.acquired == s.released, s


def test_thread_storm_every_form() -> None:
    """2,000 exceptions thrown at random points into 3 threads that go
    through ``with bulkhead``, the decorator and acquire()/release(), with
    waits (2 slots for 3 threads): no slot leaks and the invariant holds."""
    bh = bulkhead("storm", max_concurrent=2, max_waiting=10, max_wait=5.0)

    @bh
    def decorated() -> None:
        pass

    def body() -> None:
        with bh:
            pass
        decorated()
        permit = bh.acquire()
        try:
            pass
        finally:
            permit.release()

    result = storm(body, exceptions=1_500, threads=3, seed=1)
    result.check()
    assert result.iterations > 0
    clean(settled(bh))


def test_main_thread_interrupt_storm() -> None:
    """400 ``timeout(interrupt=True)`` firings land at random points of
    ``with bulkhead`` and the decorator in the main thread: no slot leaks
    (the issue saw 62 % of 400 firings leak one)."""
    bh = bulkhead("alarm", max_concurrent=1, max_wait=0)

    @bh
    def decorated() -> None:
        pass

    def body() -> None:
        # A permit dropped at the exit's first line holds its slot until it
        # is freed, which for a traceback in a reference cycle is the next
        # pass of the cyclic collector: meanwhile the bulkhead is full.
        with contextlib.suppress(resilient.BulkheadFull):
            with bh:
                pass
            decorated()

    result = interrupt_storm(body, firings=400, max_delay=3e-4, seed=2)
    result.check()
    clean(settled(bh))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_task_cancellation_storm(backend: str) -> None:
    """Tasks that wait for and hold slots are cancelled at random points
    (500 tasks over 2 slots): no slot leaks, no waiter stays queued."""
    bh = bulkhead("tasks", max_concurrent=2, max_waiting=50, max_wait=None)
    rng = random.Random(3)

    async def worker() -> None:
        async with bh:
            for _ in range(rng.randrange(3)):
                await anyio.lowlevel.checkpoint()

    async def decorated_worker() -> None:
        await bh(anyio.lowlevel.checkpoint)()

    async def main() -> None:
        for _ in range(50):
            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(worker if i % 2 else decorated_worker)
                for _ in range(rng.randrange(4)):
                    await anyio.lowlevel.checkpoint()
                tg.cancel_scope.cancel()

    anyio.run(main, backend=backend)
    s = settled(bh)
    clean(s)
    assert s.cancelled > 0


def test_unprotected_exit_window_is_recovered() -> None:
    """An exception at the very first line of the block's exit (before it
    could release) is the one window no try/finally can close: the
    block's permit is dropped with the block and gives its slot back."""
    bh = bulkhead("window", max_concurrent=1, max_wait=0)

    class Boom(BaseException):
        pass

    previous = sys.gettrace()  # coverage's, in CI: put it back after

    def trace(frame: object, event: str, arg: object) -> object:
        code = getattr(frame, "f_code", None)
        if event == "call" and getattr(code, "co_name", "") == "_exit_block":
            sys.settrace(previous)
            raise Boom
        return None

    sys.settrace(trace)
    try:
        with pytest.raises(Boom), bh:
            pass
    finally:
        sys.settrace(previous)
    clean(settled(bh))
    bh.acquire_nowait().release()


def test_storm_leaves_a_usable_bulkhead() -> None:
    """After a storm the bulkhead admits up to its limit again."""
    bh = bulkhead("after", max_concurrent=2, max_wait=0)

    def body() -> None:
        with bh:
            resilient.checkpoint()

    storm(body, exceptions=150, threads=2, seed=4).check()
    settled(bh)
    a, b = bh.acquire_nowait(), bh.acquire_nowait()
    with pytest.raises(resilient.BulkheadFull):
        bh.acquire_nowait()
    a.release()
    b.release()


# The pipeline's bulkhead: a policy's first attempt takes its slot on the
# bare path (`BulkheadMachine.take_new`, one call, given back by
# `BulkheadMachine.release`), a retry or a full bulkhead on the full path.


def _policy(name: str, *, breaker: bool) -> resilient.Policy:
    return resilient.Policy(
        name=name,
        attempts=3,
        budget=None,
        backoff=resilient.Constant(0),
        retry_on=ConnectionError,
        # A short wait: with the collector off, a permit in a reference
        # cycle (a traceback through the flow's frames) holds its slot
        # until the end of the storm, and the others are refused.
        bulkhead=resilient.BulkheadConfig(
            max_concurrent=2, max_waiting=10, max_wait=0.01
        ),
        breaker=(
            resilient.BreakerConfig(minimum_calls=10**6) if breaker else None
        ),
    )


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
def test_thread_storm_through_a_policy(breaker: bool) -> None:
    """1,500 exceptions thrown at random points into 3 threads that call a
    function under a policy with a bulkhead of 2 slots (alone, or after a
    breaker): first attempts on the bare path, retries and queued calls
    on the full path. No slot leaks (once the permits in reference cycles
    are collected), the counts add up, and the bulkhead still admits to
    its limit."""
    name = f"storm-policy-{breaker}"
    rng = random.Random(7)

    @_policy(name, breaker=breaker)
    def call() -> None:
        if rng.random() < 0.2:
            raise ConnectionError

    def body() -> None:
        with contextlib.suppress(ConnectionError, resilient.BulkheadFull):
            call()

    body()  # Makes the policy's parts before the storm.
    result = storm(body, exceptions=1_500, threads=3, seed=8)
    result.check()
    assert result.iterations > 0
    bh = resilient.bulkhead(name)
    clean(settled(bh))
    a, b = bh.acquire_nowait(), bh.acquire_nowait()
    with pytest.raises(resilient.BulkheadFull):
        bh.acquire_nowait()
    a.release()
    b.release()


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
def test_interrupt_storm_through_a_policy(breaker: bool) -> None:
    """400 ``timeout(interrupt=True)`` firings land at random points of a
    call under a policy with a one-slot bulkhead that never queues, in the
    main thread: no slot leaks."""
    name = f"alarm-policy-{breaker}"
    policy = resilient.Policy(
        name=name,
        attempts=2,
        budget=None,
        backoff=resilient.Constant(0),
        bulkhead=resilient.BulkheadConfig(max_concurrent=1, max_wait=0),
        breaker=resilient.BreakerConfig() if breaker else None,
    )

    @policy
    def call() -> None:
        pass

    def body() -> None:
        # A permit dropped with a traceback in a reference cycle holds its
        # slot until the cyclic collector frees it: meanwhile it is full.
        with contextlib.suppress(resilient.BulkheadFull):
            call()

    body()
    result = interrupt_storm(body, firings=400, max_delay=3e-4, seed=9)
    result.check()
    clean(settled(resilient.bulkhead(name)))


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_task_cancellation_storm_through_a_policy(
    backend: str, breaker: bool
) -> None:
    """Tasks calling a coroutine function under a policy with a bulkhead of
    2 slots (alone, or after a breaker) are cancelled at random points,
    holding a slot on the bare path or waiting on the full one (500 tasks):
    no slot leaks, no waiter stays queued."""
    name = f"tasks-policy-{backend}-{breaker}"
    rng = random.Random(10)

    @_policy(name, breaker=breaker)
    async def call() -> None:
        for _ in range(rng.randrange(3)):
            await anyio.lowlevel.checkpoint()
        if rng.random() < 0.2:
            raise ConnectionError

    async def worker() -> None:
        with contextlib.suppress(ConnectionError, resilient.BulkheadFull):
            await call()

    async def main() -> None:
        for _ in range(50):
            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(worker)
                for _ in range(rng.randrange(4)):
                    await anyio.lowlevel.checkpoint()
                tg.cancel_scope.cancel()

    anyio.run(main, backend=backend)
    s = settled(resilient.bulkhead(name))
    clean(s)
    assert s.cancelled > 0
