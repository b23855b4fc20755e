"""
Singleflight under storms: exceptions thrown into threads at random
bytecodes (``PyThreadState_SetAsyncExc``) while they lead, join, wait for
and leave flights, threads and an event loop sharing one key, and random
task cancellations (with random deadlines) in asyncio and trio.

Afterwards no thread or task is left behind, the in-flight map is empty,
nobody waits, and every caller that was not cancelled got the object an
execution returned or raised.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

import resilient
from resilient.exceptions import DeadlineExceeded
from tests.storm import storm, untraced


pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="PyThreadState_SetAsyncExc"
)


@pytest.fixture(autouse=True)
def _no_foreign_finalizers() -> Iterator[None]:
    """
    Collect other tests' garbage first and keep the cyclic collector off
    during the storm: a finalizer run mid-storm would swallow the exception
    that lands in it (an unraisable error unrelated to singleflight).
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def empty(group: resilient.SingleFlight) -> None:
    """Nothing in flight, nobody waiting, the map empty, the lock free."""
    s = group.statistics()
    assert (s.in_flight, s.running, s.waiting) == (0, 0, 0), s
    assert group._machine.flights == {}
    assert not group._machine._lock.locked()


@untraced
def test_thread_storm_leaves_nothing_behind() -> None:
    """
    1,000 exceptions thrown at random points into 4 threads sharing one
    key (leading, joining, waiting, leaving): each lands as itself, no
    thread hangs or is left running, executions were shared, and the map
    ends empty.
    """
    group = resilient.SingleFlight(name="storm")

    def work() -> int:
        total = 0
        for i in range(300):
            total += i
        return total

    def body() -> None:
        assert group.call("k", work) == 44850

    # The threads alive before, not their count: a thread an earlier test
    # left (a renewer, an executor's worker) may end during this one.
    before = set(threading.enumerate())
    result = storm(body, exceptions=1_000, threads=4, seed=1, patience=5.0)
    result.check()
    assert result.iterations > 0
    assert group.statistics().joined > 0
    assert set(threading.enumerate()) <= before
    empty(group)


@untraced
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_threads_and_tasks_sharing_a_key_under_a_storm(backend: str) -> None:
    """
    Stormed threads and the tasks of an event loop in another thread call
    one key, so flights led by either are joined by both (the wake-ups
    cross threads, and the last thread to leave an async execution
    cancels it): every exception lands, every task gets the execution's
    value or is cancelled, and nothing is left behind.
    """
    group = resilient.SingleFlight(name="mixed")
    rng = random.Random(5)
    served = {"tasks": 0}

    async def awork() -> int:
        for _ in range(rng.randrange(3)):
            await anyio.lowlevel.checkpoint()
        return 7

    def swork() -> int:
        return 7

    async def tasks(stop: threading.Event) -> None:
        while not stop.is_set():
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(one_task)
                await anyio.lowlevel.checkpoint()
                if rng.random() < 0.3:
                    tg.cancel_scope.cancel()
            await anyio.sleep(0.0002)

    async def one_task() -> None:
        assert await group.acall("k", awork) == 7
        served["tasks"] += 1

    def body() -> None:
        assert group.call("k", swork) == 7

    stop = threading.Event()
    with anyio.from_thread.start_blocking_portal(backend) as portal:
        before = portal.call(_tasks, backend)
        running = portal.start_task_soon(tasks, stop)
        result = storm(body, exceptions=600, threads=2, seed=6, patience=5.0)
        stop.set()
        running.result(30)
        after = portal.call(_settled, backend)
    result.check()
    assert served["tasks"] > 0
    assert after == before
    empty(group)


async def _settled(backend: str) -> int:
    """The tasks alive once cancelled executions had time to unwind."""
    for _ in range(10):
        await anyio.lowlevel.checkpoint()
    return _tasks(backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_task_cancellation_storm(backend: str) -> None:
    """
    3,000 tasks over 3 keys, cancelled at random points (joining, waiting,
    leading, while the execution runs) and with random deadlines: each
    task not cancelled gets its key's execution's own object or exception
    or its own `DeadlineExceeded`, no execution outlives its callers, and
    no task or map entry is left behind.
    """
    rng = random.Random(11)
    group = resilient.SingleFlight(name="tasks")
    produced: set[int] = set()
    running = {"now": 0}
    problems: list[object] = []

    async def work(key: int) -> object:
        running["now"] += 1
        try:
            for _ in range(rng.randrange(5)):
                await anyio.lowlevel.checkpoint()
            out: Any = ValueError(key) if rng.random() < 0.3 else object()
            produced.add(id(out))
            if isinstance(out, ValueError):
                raise out
            return out
        finally:
            running["now"] -= 1

    async def caller(key: int, scope: anyio.CancelScope) -> None:
        limit = rng.choice([None, None, 0.0, 1e-4])
        with scope, resilient.deadline(limit):
            try:
                got: object = await group.acall(key, work, key)
            except ValueError as exc:
                got = exc
            except DeadlineExceeded:
                return
            if id(got) not in produced:  # pragma: no cover - a failure
                problems.append(got)

    async def main() -> int:
        baseline = _tasks(backend)
        for _ in range(100):
            async with anyio.create_task_group() as tg:
                scopes = [anyio.CancelScope() for _ in range(30)]
                for i, scope in enumerate(scopes):
                    tg.start_soon(caller, i % 3, scope)
                for _ in range(rng.randrange(6)):
                    await anyio.lowlevel.checkpoint()
                    for scope in rng.sample(scopes, rng.randrange(8)):
                        scope.cancel()
        for _ in range(10):  # Let cancelled executions unwind.
            await anyio.lowlevel.checkpoint()
        return _tasks(backend) - baseline

    assert anyio.run(main, backend=backend) == 0
    assert problems == []
    assert running["now"] == 0
    s = group.statistics()
    assert s.executions >= 300
    assert s.joined > 0
    assert s.abandoned > 0
    empty(group)


def _tasks(backend: str) -> int:
    if backend == "trio":
        import trio

        return int(trio.lowlevel.current_statistics().tasks_living)
    return len(asyncio.all_tasks())
