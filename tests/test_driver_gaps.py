"""
The drivers keep their state when an exception lands between two of their
statements (an interrupt, ``PyThreadState_SetAsyncExc``), each test at the
exact point where an earlier driver lost something:

- the bare first attempt's admission ticket (a bulkhead slot) taken before
  the ``try`` that settles it;
- the attempt's deadline armed before the ``try`` that disarms it (a live
  watchdog entry that later cancels the task; on trio a scope left
  entered);
- the block form's flow, suspended when such an exception left its
  driving loop, released only when the garbage collector freed it.

The exception is injected with a line tracer (`tests.inject`), and kept
alive while the state is checked: a frame in its traceback holds the
driver's locals, so nothing here may rely on them being freed. (On
CPython 3.11 the first two points are reached by a tracer only: no
eval-breaker check, where asynchronous exceptions are delivered, lies
between the call that took the ticket or armed the deadline and the
store of its result, nor before the ``try``. The third is reached after
any call of the loop returns.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import types
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient._bulkhead import get_bulkhead
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._pipeline import _block, _lazy, _run
from resilient._pipeline._flow import READY, RUN
from resilient._timeout import _watchdog
from tests.inject import Landed, at_line, nth_line


_names = itertools.count()


def _policy(**kw: Any) -> resilient.Policy:
    return resilient.Policy(
        name=f"gaps-{next(_names)}",
        attempts=3,
        backoff=resilient.Constant(seconds=0),
        retry_on=ValueError,
        **kw,
    )


@pytest.fixture(autouse=True)
def _warm() -> None:
    """A call first: the very first one in a process checks the telemetry
    environment and so takes the full path, not the bare one."""
    resilient.retry(_policy())(lambda: None)()


def _holds_ticket(frame: types.FrameType) -> bool:
    return frame.f_locals.get("ticket") is not None


@pytest.mark.parametrize("colour", ["sync", "asyncio", "trio"])
def test_a_ticket_taken_is_settled_when_an_exception_lands(
    colour: str,
) -> None:
    """An exception landing in the bare first attempt right after its
    admission took a bulkhead slot gives the slot back at once (not when
    the exception, whose traceback holds the ticket, is freed)."""
    policy = _policy(
        budget=None, bulkhead=BulkheadConfig(max_concurrent=1, max_wait=0)
    )
    bulkhead = get_bulkhead(policy.name, policy.bulkhead)

    def sync_body() -> str:
        return "ok"  # pragma: no cover - the exception lands first

    async def async_body() -> str:
        return "ok"  # pragma: no cover - the exception lands first

    with (
        at_line([_run.call_sync, _run.call_async], _holds_ticket) as tracer,
        pytest.raises(Landed) as landed,
    ):
        if colour == "sync":
            resilient.retry(policy)(sync_body)()
        else:
            anyio.run(resilient.retry(policy)(async_body), backend=colour)
    assert tracer.fired
    assert landed.value is not None  # Alive: its frames hold the ticket.
    assert bulkhead.statistics().in_use == 0


def _armed_live(frame: types.FrameType) -> bool:
    armed = frame.f_locals.get("armed")
    if type(armed) is list:
        return armed[_watchdog.TASK] is not None
    return armed is not None and armed._cancel_status is not None


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("retried", [False, True], ids=["bare", "retried"])
def test_a_deadline_armed_is_undone_when_an_exception_lands(
    backend: str, retried: bool
) -> None:
    """An exception landing at the line right after an attempt's deadline
    was armed (the first attempt, or a retried one) leaves nothing armed:
    on asyncio no live watchdog entry (it would cancel the task later, for
    nothing), on trio no scope left entered (trio would see its scopes
    misnested). (The old driver's next line was the ``try:`` that disarms,
    where only a tracer can raise: see `tests.inject`.)"""
    calls: list[int] = []

    @resilient.retry(_policy(budget=0.05))
    async def body() -> str:
        calls.append(1)
        if retried and len(calls) == 1:
            raise ValueError
        await anyio.lowlevel.checkpoint()
        return "ok"  # pragma: no cover - the exception lands first

    functions = [_run.call_async, _run.adrive, _lazy.suspended]

    async def main() -> None:
        before = _cancel_state(backend)
        with (
            at_line(functions, _armed_live, skip_try=False) as tracer,
            contextlib.suppress(Landed),
        ):
            await body()
        assert tracer.fired
        assert _cancel_state(backend) == before
        await anyio.sleep(0.1)  # Past the deadline: not cancelled for it.
        if backend == "asyncio":
            dog = _watchdog._DOGS[asyncio.get_running_loop()]
            assert all(e[_watchdog.TASK] is None for e in dog.heap)

    anyio.run(main, backend=backend)


def _cancel_state(backend: str) -> object:
    """The task's pending cancellations (asyncio), or its cancel status
    (trio): what an attempt must leave as it found."""
    if backend == "asyncio":
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()
    import trio

    return trio.lowlevel.current_task()._cancel_status


@pytest.mark.parametrize("colour", ["sync", "asyncio"])
@pytest.mark.parametrize("point", ["ready", "enter"])
def test_the_block_forms_flow_is_released_when_an_exception_lands(
    colour: str, point: str
) -> None:
    """An exception landing in the block form's driver while the flow
    holds an admitted attempt (its bulkhead slot), as the iterator hands
    the attempt out or as the attempt is entered, releases the slot at
    once: the flow is closed there, not when it is freed."""
    policy = _policy(
        budget=None, bulkhead=BulkheadConfig(max_concurrent=1, max_wait=0)
    )
    bulkhead = get_bulkhead(policy.name, policy.bulkhead)
    if point == "ready":
        functions: list[Any] = [_block._step, _block._astep]

        def when(frame: types.FrameType) -> bool:
            return frame.f_locals.get("op") == READY

    else:
        functions = [_block.Attempt._enter]

        def when(frame: types.FrameType) -> bool:
            stop = frame.f_locals.get("stop")
            return stop is not None and stop[0] == RUN

    def sync_loop() -> None:
        for attempt in resilient.retrying(policy):
            with attempt:
                pass  # pragma: no cover - the exception lands first

    async def async_loop() -> None:
        async for attempt in resilient.retrying(policy):
            async with attempt:
                pass  # pragma: no cover - the exception lands first

    with at_line(functions, when) as tracer, pytest.raises(Landed) as landed:
        if colour == "sync":
            sync_loop()
        else:
            asyncio.run(async_loop())
    assert tracer.fired
    assert landed.value is not None  # Alive: its frames hold the flow.
    assert bulkhead.statistics().in_use == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_exception_at_each_line_of_the_async_driver(backend: str) -> None:
    """
    An exception landing at each line in turn of the async drivers and the
    forwarder (a call whose first attempt fails at once and whose retry
    suspends three times, through a bulkhead, under a budget) ends the
    call with it or lets it finish, and every time leaves things as they
    were: the slot free, no deadline current, nothing armed, no
    cancellation pending, and the attempt's coroutine, if it began to
    wait, closed.
    """
    policy = _policy(
        budget=30.0, bulkhead=BulkheadConfig(max_concurrent=1, max_wait=0)
    )
    bulkhead = get_bulkhead(policy.name, policy.bulkhead)
    calls: list[int] = []
    waits: list[str] = []

    @resilient.retry(policy)
    async def body() -> str:
        calls.append(1)
        if len(calls) % 2:
            raise ValueError
        waits.append("begun")
        try:
            for _ in range(3):
                await anyio.sleep(0.001)
        finally:
            waits.append("ended")
        return "ok"

    functions = [_run.call_async, _run.adrive, _lazy.suspended]

    async def main() -> int:
        n = 0
        while True:
            n += 1
            calls.clear()
            waits.clear()
            before = _cancel_state(backend)
            nth = nth_line(n)

            kept: list[BaseException] = []  # Alive: nothing may rely on GC.
            try:
                with at_line(functions, nth) as tracer:
                    assert await body() == "ok"
            except Landed as exc:
                kept.append(exc)
            assert waits.count("begun") == waits.count("ended"), (
                n,
                tracer.frames,
            )
            assert bulkhead.statistics().in_use == 0, (n, tracer.frames)
            assert resilient.remaining() == math.inf, (n, tracer.frames)
            assert _cancel_state(backend) == before, (n, tracer.frames)
            await anyio.lowlevel.checkpoint()
            if backend == "asyncio":
                dog = _watchdog._DOGS.get(asyncio.get_running_loop())
                heap = [] if dog is None else dog.heap
                assert all(e[_watchdog.TASK] is None for e in heap), n
            if not tracer.fired:
                return n

    assert anyio.run(main, backend=backend) > 50


def test_an_exception_at_each_line_of_the_sync_driver() -> None:
    """The sync twin of the sweep above: an exception at each line in turn
    of `call_sync` and `drive` (a first attempt that fails, a retry that
    succeeds, through a bulkhead) leaves the slot free and no deadline
    current."""
    policy = _policy(
        budget=30.0, bulkhead=BulkheadConfig(max_concurrent=1, max_wait=0)
    )
    bulkhead = get_bulkhead(policy.name, policy.bulkhead)
    calls: list[int] = []

    @resilient.retry(policy)
    def body() -> str:
        calls.append(1)
        if len(calls) % 2:
            raise ValueError
        return "ok"

    n = 0
    while True:
        n += 1
        calls.clear()
        nth = nth_line(n)

        kept: list[BaseException] = []  # Alive: nothing may rely on GC.
        try:
            with at_line([_run.call_sync, _run.drive], nth) as tracer:
                assert body() == "ok"
        except Landed as exc:
            kept.append(exc)
        assert bulkhead.statistics().in_use == 0, (n, tracer.frames)
        assert resilient.remaining() == math.inf, (n, tracer.frames)
        if not tracer.fired:
            break
    assert n > 20
