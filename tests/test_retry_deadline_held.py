"""
A retried call's deadline and garbage: what the zero-delay retry path may
skip and what it must still do.

With no attempt timeout every attempt's deadline is the call's, so a failed
attempt leaves it current until the next (`Call.end_attempt`); these tests
pin that each attempt, each hook and the fallback still see the deadline
they saw before, that none stays current after the call on any way out, and
that a call that retries leaves no reference cycle behind (its errors are
freed by reference counting, with the garbage collector off).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import math
import weakref
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._pipeline import _drive, _flow, _lazy, _run
from resilient._pipeline._call import Call
from resilient._timeout import _watchdog
from tests.inject import Landed, at_line, nth_line


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


_names = itertools.count()


def _policy(**kw: Any) -> resilient.Policy:
    return resilient.Policy(
        name=f"held-{next(_names)}",
        backoff=resilient.Constant(seconds=0),
        retry_on=ValueError,
        **kw,
    )


class _Failure(ValueError):
    """A ValueError that can be referenced weakly."""


def _failure(errors: list[weakref.ref[_Failure]]) -> _Failure:
    exc = _Failure()
    errors.append(weakref.ref(exc))
    return exc


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The garbage collector off for the test: only reference counting
    frees what the calls leave. (The retry log records are off too: the
    test's captured records would keep the errors they name.)"""
    gc.collect()
    was = gc.isenabled()
    logger = logging.getLogger("resilient")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    gc.disable()
    try:
        yield
    finally:
        logger.setLevel(level)
        if was:
            gc.enable()


def _call(colour: str, fn: Callable[[], Any]) -> Any:
    """Call *fn* (a decorated target) in *colour*: sync, asyncio or trio."""
    if colour == "sync":
        return fn()

    async def main() -> Any:
        return await fn()

    return anyio.run(main, backend=colour)


def _target(
    colour: str, policy: resilient.Policy, body: Callable[[], Any]
) -> Any:
    """*body* decorated with *policy*, sync or async."""
    if colour == "sync":
        return resilient.retry(policy)(body)

    async def abody() -> Any:
        return body()

    return resilient.retry(policy)(abody)


COLOURS = ["sync", "asyncio", "trio"]
GUARDS = {
    "no guards": {},
    "bulkhead": {"bulkhead": BulkheadConfig(max_concurrent=4, max_wait=0)},
}


@pytest.mark.parametrize("colour", COLOURS)
@pytest.mark.parametrize("guards", list(GUARDS))
def test_a_retried_call_leaves_no_cycle(
    colour: str, guards: str, no_gc: None
) -> None:
    """Every error of a call that failed three times and then returned is
    freed once the call returns, with the garbage collector off: nothing
    of the call (the bare first attempt's frame, the flow, the driver)
    holds one in a reference cycle."""
    errors: list[weakref.ref[_Failure]] = []

    def body() -> int:
        if len(errors) < 3:
            # No local names it: the frame its traceback keeps does not.
            raise _failure(errors)
        return 1

    fn = _target(colour, _policy(**GUARDS[guards]), body)
    assert _call(colour, fn) == 1
    assert len(errors) == 3
    assert [ref() for ref in errors] == [None, None, None]


@pytest.mark.parametrize("colour", COLOURS)
@pytest.mark.parametrize("guards", list(GUARDS))
def test_each_attempt_and_hook_sees_the_calls_deadline(
    colour: str, guards: str, clock: resilient.testing.FakeClock
) -> None:
    """Under a 30 s budget with no attempt timeout, every attempt of a
    call that retries at once sees the budget's deadline (30 s left on a
    clock that does not move), the give-up hook sees it too, the fallback
    runs under the enclosing deadline (none) and none is current after
    the call."""
    seen: list[tuple[str, float]] = []

    def body() -> int:
        seen.append(("attempt", resilient.remaining()))
        raise ValueError

    def on_give_up(event: object) -> None:
        seen.append(("give up", resilient.remaining()))

    def fallback(exc: BaseException) -> int:
        seen.append(("fallback", resilient.remaining()))
        return 7

    policy = _policy(
        attempts=3,
        budget=30.0,
        on_give_up=on_give_up,
        fallback=fallback,
        **GUARDS[guards],
    )
    fn = _target(colour, policy, body)
    assert _call(colour, fn) == 7
    at = 30.0
    assert seen == [
        ("attempt", at),
        ("attempt", at),
        ("attempt", at),
        ("give up", at),
        ("fallback", math.inf),
    ]
    assert resilient.remaining() == math.inf


@pytest.mark.parametrize("colour", COLOURS)
def test_a_retry_hook_and_the_next_attempt_see_the_calls_deadline(
    colour: str, clock: resilient.testing.FakeClock
) -> None:
    """A ``before_sleep`` hook between two attempts (which ends the hold
    of the deadline) and the attempt after it both see the call's deadline;
    after the call none is current, and an error that gives up leaves none
    current either."""
    seen: list[tuple[str, float]] = []
    fails = iter([True, False, True, True])

    def body() -> int:
        seen.append(("attempt", resilient.remaining()))
        if next(fails):
            raise ValueError
        return 1

    def before_sleep(event: object) -> None:
        seen.append(("hook", resilient.remaining()))

    policy = _policy(attempts=2, budget=30.0, before_sleep=before_sleep)
    fn = _target(colour, policy, body)
    assert _call(colour, fn) == 1
    at = 30.0
    assert seen == [("attempt", at), ("hook", at), ("attempt", at)]
    assert resilient.remaining() == math.inf
    seen.clear()
    with pytest.raises(ValueError):
        _call(colour, fn)
    assert seen == [("attempt", at), ("hook", at), ("attempt", at)]
    assert resilient.remaining() == math.inf


def _cancel_state(backend: str) -> object:
    """The task's pending cancellations (asyncio), or its cancel status
    (trio): what a call must leave as it found."""
    if backend == "asyncio":
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()
    import trio

    return trio.lowlevel.current_task()._cancel_status


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_exception_at_each_line_of_the_unguarded_retry_path(
    backend: str,
) -> None:
    """
    An exception landing at each line in turn of the path a policy with no
    guards takes (the shell's bare first attempt under the budget, the
    driver's fused wait and attempt, the flow holding the deadline between
    attempts, the forwarder of an attempt that suspends) ends the call with
    it or lets it finish, and every time leaves no deadline current,
    nothing armed, no cancellation pending, and the attempt's coroutine,
    if it began to wait, closed.
    """
    policy = _policy(attempts=4, budget=30.0)
    calls: list[int] = []
    waits: list[str] = []

    @resilient.retry(policy)
    async def body() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError
        waits.append("begun")
        try:
            for _ in range(2):
                await anyio.sleep(0.001)
        finally:
            waits.append("ended")
        return "ok"

    functions = [
        _run.call_async,
        _drive.adrive,
        _flow.flow,
        _lazy.suspended,
        Call.start_attempt,
        Call.end_attempt,
        Call.exit_deadline,
    ]

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
            assert resilient.remaining() == math.inf, (n, tracer.frames)
            assert _cancel_state(backend) == before, (n, tracer.frames)
            await anyio.lowlevel.checkpoint()
            if backend == "asyncio":
                dog = _watchdog._DOGS.get(asyncio.get_running_loop())
                heap = [] if dog is None else dog.heap
                assert all(e[_watchdog.TASK] is None for e in heap), n
            if not tracer.fired:
                return n

    assert anyio.run(main, backend=backend) > 80


def test_an_exception_at_each_line_of_the_unguarded_sync_path() -> None:
    """The sync twin: an exception at each line in turn of `call_sync`,
    `drive`, the flow and the deadline's hold (a first attempt and a retry
    that fail, a third that succeeds, no guards) leaves no deadline
    current."""
    policy = _policy(attempts=4, budget=30.0)
    calls: list[int] = []

    @resilient.retry(policy)
    def body() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError
        return "ok"

    functions = [
        _run.call_sync,
        _drive.drive,
        _flow.flow,
        Call.start_attempt,
        Call.end_attempt,
        Call.exit_deadline,
    ]
    n = 0
    while True:
        n += 1
        calls.clear()
        nth = nth_line(n)

        kept: list[BaseException] = []  # Alive: nothing may rely on GC.
        try:
            with at_line(functions, nth) as tracer:
                assert body() == "ok"
        except Landed as exc:
            kept.append(exc)
        assert resilient.remaining() == math.inf, (n, tracer.frames)
        if not tracer.fired:
            break
    assert n > 40
