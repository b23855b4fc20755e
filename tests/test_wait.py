"""Waiting shared by threads and tasks (resilient._wait, _core._loops)."""

from __future__ import annotations

import asyncio
import math
import threading

import anyio
import pytest

from resilient._core import _loops
from resilient._wait import POLL_INTERVAL, TaskWaiter, ThreadWaiter, wait_slice


def test_thread_waiter_wakes_from_another_thread() -> None:
    """A thread blocked on its waiter wakes when another thread wakes it."""
    waiter = ThreadWaiter()
    threading.Timer(0.001, waiter.wake).start()
    assert waiter.wait() is True


def test_thread_waiter_keeps_an_early_wake() -> None:
    """A wake-up before the wait is not lost; repeated wakes are one."""
    waiter = ThreadWaiter()
    waiter.wake()
    waiter.wake()
    assert waiter.wait(0) is True
    assert waiter.wait(0) is False


def test_thread_waiter_times_out() -> None:
    """Without a wake-up the wait ends at its timeout, never negative."""
    waiter = ThreadWaiter()
    assert waiter.wait(0.001) is False
    assert waiter.wait(-5) is False


async def test_task_waiter_wakes_in_its_own_thread(anyio_backend: str) -> None:
    """A task is woken by another task of its loop."""
    waiter = TaskWaiter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_wake_soon, waiter)
        assert await waiter.wait() is True
    assert waiter.woken


async def _wake_soon(waiter: TaskWaiter) -> None:
    await anyio.lowlevel.checkpoint()
    waiter.wake()


async def test_task_waiter_wakes_from_another_thread(
    anyio_backend: str,
) -> None:
    """A thread wakes a task through the loop's thread-safe hand-off."""
    waiter = TaskWaiter()
    thread = threading.Thread(target=waiter.wake)
    thread.start()
    assert await waiter.wait(5.0) is True
    thread.join()


async def test_task_waiter_times_out(anyio_backend: str) -> None:
    """A task's wait ends at its timeout, reporting no wake-up."""
    waiter = TaskWaiter()
    assert await waiter.wait(0.001) is False
    assert not waiter.woken


def test_task_waiter_of_a_closed_loop_ignores_wakes() -> None:
    """Waking a task whose event loop has closed is harmless."""

    async def make() -> TaskWaiter:
        return TaskWaiter()

    waiter = asyncio.run(make())
    thread = threading.Thread(target=waiter.wake)
    thread.start()
    thread.join()
    assert not waiter.woken


@pytest.mark.parametrize(
    ("deadline", "now", "exact", "expected"),
    [
        (10.0, 4.0, True, 6.0),
        (1.0, 4.0, True, 0.0),
        (math.inf, 4.0, True, math.inf),
        (10.0, 4.0, False, POLL_INTERVAL),
        (1e300, 0.0, True, threading.TIMEOUT_MAX),
    ],
)
def test_wait_slice(
    deadline: float, now: float, exact: bool, expected: float
) -> None:
    """How long to block: to the deadline on a real clock, never negative,
    at most a lock's limit; a short poll on a virtual clock."""
    assert wait_slice(deadline, now, exact=exact) == expected


def test_no_async_library_in_plain_threads() -> None:
    """Sync code runs no event loop; refusing to block is a no-op."""
    assert _loops.current_async_library() is None
    _loops.refuse_blocking("a wait", "the async form")


async def test_refuse_blocking_inside_an_event_loop(
    anyio_backend: str,
) -> None:
    """A blocking wait on a loop's thread raises, naming what to use."""
    assert _loops.current_async_library() == anyio_backend
    with pytest.raises(RuntimeError, match=r"use `async for`.*worker thread"):
        _loops.refuse_blocking("a sync retry", "`async for`")


async def test_worker_threads_may_block(anyio_backend: str) -> None:
    """Sync code in a worker thread of the loop may block."""
    got = await anyio.to_thread.run_sync(_loops.current_async_library)
    assert got is None


async def test_loop_caller_runs_in_the_loop(anyio_backend: str) -> None:
    """Another thread hands a call to the loop, which runs it in its own
    thread."""
    call = _loops.loop_caller(anyio_backend)
    done = anyio.Event()
    seen: list[int] = []

    def in_loop() -> None:
        seen.append(threading.get_ident())
        done.set()

    thread = threading.Thread(target=call, args=(in_loop,))
    thread.start()
    with anyio.fail_after(5):
        await done.wait()
    thread.join()
    assert seen == [threading.get_ident()]
