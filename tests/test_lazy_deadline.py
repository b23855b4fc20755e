"""
The async attempt deadline armed only once the attempt suspends
(`resilient._pipeline._lazy`): an attempt that never suspends arms
nothing; one that suspends is interrupted at its deadline as before (on
trio from inside scopes, nurseries and shields of its own), a deadline
already past at the first suspension cancels it there, and the driving
by hand keeps what ``await`` gives: tracebacks, ``close``, the caller's
cancellation, exceptions landing between two steps.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import traceback
import types
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient._pipeline import _lazy, _run
from resilient._timeout import _watchdog
from resilient.exceptions import DeadlineExceeded
from resilient.testing import FakeClock, use_clock
from tests.inject import Landed, at_line, nth_line


BACKENDS = ["asyncio", "trio"]
_names = itertools.count()


def _policy(**kw: Any) -> resilient.Policy:
    kw.setdefault("attempts", 3)
    return resilient.Policy(
        name=f"lazy-{next(_names)}",
        backoff=resilient.Constant(seconds=0),
        retry_on=ValueError,
        **kw,
    )


@pytest.fixture
def arms(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The deadlines the drivers arm (seconds left), in order."""
    armed: list[float] = []
    real = _lazy.arm

    def counting(left: float, base: Any = None) -> Any:
        armed.append(left)
        return real(left, base)

    monkeypatch.setattr(_lazy, "arm", counting)
    return armed


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_attempt_that_never_suspends_arms_nothing(
    backend: str, arms: list[float]
) -> None:
    """Attempts under a budget that return or raise without suspending (a
    first one that succeeds, one that fails and the retry that succeeds)
    arm no deadline; one that suspends arms one, at its suspension."""
    calls: list[int] = []

    @resilient.retry(_policy(budget=30.0))
    async def at_once() -> str:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError
        return "ok"

    @resilient.retry(_policy(budget=30.0))
    async def suspends() -> str:
        await anyio.lowlevel.checkpoint()
        return "slept"

    async def main() -> None:
        assert await at_once() == "ok"
        assert await at_once() == "ok"  # Failed, then retried.
        assert arms == []
        assert await suspends() == "slept"
        assert len(arms) == 1
        assert 29.0 < arms[0] <= 30.0

    anyio.run(main, backend=backend)
    assert len(calls) == 3


def test_nothing_armed_leaves_no_watchdog() -> None:
    """asyncio: calls under a budget that never suspend make no watchdog
    for the loop at all."""

    @resilient.retry(_policy(budget=30.0))
    async def at_once() -> int:
        return 1

    async def main() -> None:
        for _ in range(10):
            await at_once()
        assert asyncio.get_running_loop() not in _watchdog._DOGS

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("retried", [False, True], ids=["bare", "retried"])
def test_a_deadline_past_at_the_first_suspension_cancels_there(
    backend: str, retried: bool
) -> None:
    """An attempt that spends its whole budget before it first suspends
    is cancelled at that checkpoint (even a bare yield, which asyncio
    resumes at once): the code after it never runs."""
    clock = FakeClock()
    after: list[int] = []
    calls: list[int] = []

    @resilient.retry(_policy(budget=10.0, attempts=2))
    async def body() -> None:
        calls.append(1)
        if retried and len(calls) == 1:
            raise ValueError
        clock.advance(11.0)  # The budget spent, without suspending.
        await anyio.lowlevel.checkpoint()
        after.append(1)  # pragma: no cover - cancelled at the checkpoint

    with use_clock(clock), pytest.raises(DeadlineExceeded):
        anyio.run(body, backend=backend)
    assert after == []
    assert len(calls) == (2 if retried else 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_deadline_reaches_into_the_attempts_own_scopes(
    backend: str,
) -> None:
    """The deadline armed at the first suspension interrupts an attempt
    suspended inside cancel scopes it entered first (a `move_on_after`
    that does not fire, then a task group with a sleeping child): the
    attempt, its child and the scopes all end at the deadline."""
    ended: list[str] = []

    @resilient.retry(_policy(budget=0.05, attempts=1))
    async def body() -> None:
        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_sleeper, ended)
                try:
                    await anyio.sleep(5)
                finally:
                    ended.append("body")

    with pytest.raises(DeadlineExceeded):
        anyio.run(body, backend=backend)
    assert sorted(ended) == ["body", "child"]


async def _sleeper(ended: list[str]) -> None:
    try:
        await anyio.sleep(5)
    finally:
        ended.append("child")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_attempts_own_scope_is_its_own(backend: str) -> None:
    """A scope of the attempt's that fires first stops only its own block:
    the attempt goes on and returns, which is no timeout."""

    @resilient.retry(_policy(budget=30.0))
    async def body() -> str:
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(5)
        assert scope.cancelled_caught
        return "moved on"

    assert anyio.run(body, backend=backend) == "moved on"


def test_a_shield_of_the_attempts_holds_off_the_deadline() -> None:
    """trio: a shielded scope the attempt entered before it suspended is
    not interrupted by the deadline spliced in above it; the next
    checkpoint outside it is. (On asyncio the watchdog cancels the task,
    as `asyncio.timeout` does, which no anyio shield holds off.)"""
    done: list[str] = []

    @resilient.retry(_policy(budget=0.02, attempts=1))
    async def body() -> None:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.06)
            done.append("shielded")
        await anyio.lowlevel.checkpoint()
        done.append("after")  # pragma: no cover - cancelled at the checkpoint

    with pytest.raises(DeadlineExceeded):
        anyio.run(body, backend="trio")
    assert done == ["shielded"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_a_suspended_call_closes_its_attempt(backend: str) -> None:
    """A call dropped while its attempt is suspended (its coroutine
    closed, as when a task is destroyed) closes the attempt's coroutine,
    whose clean-up runs, and leaves no deadline armed behind."""
    cleaned: list[int] = []

    @resilient.retry(_policy(budget=0.05))
    async def body() -> None:
        try:
            await anyio.sleep(5)
        finally:
            cleaned.append(1)

    async def main() -> None:
        before = _cancel_state(backend)
        call = body()
        call.send(None)  # Up to the attempt's first suspension.
        call.close()
        assert cleaned == [1]
        assert _cancel_state(backend) == before
        await anyio.sleep(0.1)  # Past the deadline: not cancelled for it.
        if backend == "asyncio":
            dog = _watchdog._DOGS[asyncio.get_running_loop()]
            assert all(e[_watchdog.TASK] is None for e in dog.heap)

    anyio.run(main, backend=backend)


def _cancel_state(backend: str) -> object:
    """The task's pending cancellations (asyncio), or its cancel status
    (trio)."""
    if backend == "asyncio":
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()
    import trio

    return trio.lowlevel.current_task()._cancel_status


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("suspend", [False, True], ids=["at-once", "later"])
def test_the_attempts_frames_stay_in_the_traceback(
    backend: str, suspend: bool
) -> None:
    """An error raised by the attempt, at once or after it suspended,
    carries the attempt's own frames in its traceback."""

    @resilient.retry(_policy(budget=30.0, attempts=1))
    async def body() -> None:
        if suspend:
            await anyio.lowlevel.checkpoint()
        await _deep()

    with pytest.raises(KeyError) as raised:
        anyio.run(body, backend=backend)
    names = [f.name for f in traceback.extract_tb(raised.value.__traceback__)]
    assert "body" in names
    assert "_deep" in names


async def _deep() -> None:
    raise KeyError("deep")


class _Awaitable:
    """An awaitable that is no coroutine: it sleeps for *seconds*."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __await__(self) -> Any:
        return anyio.sleep(self.seconds).__await__()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("retried", [False, True], ids=["bare", "retried"])
def test_an_awaitable_that_is_no_coroutine_is_armed_first(
    backend: str, retried: bool, arms: list[float]
) -> None:
    """An async callable whose awaitable is no coroutine (a compiled
    coroutine, a future: it cannot be stepped by hand) has its deadline
    armed before it starts, and is interrupted at it."""
    calls: list[int] = []

    def body() -> Any:
        calls.append(1)
        if retried and len(calls) == 1:
            raise ValueError
        return _Awaitable(5)

    _, shell = _run.shells(_policy(budget=0.03), None)

    async def main() -> None:
        await shell(body, (), {})

    with pytest.raises(DeadlineExceeded):
        anyio.run(main, backend=backend)
    assert len(arms) == 1


def test_a_future_is_armed_first(arms: list[float]) -> None:
    """asyncio: a function that returns a future gets its result, under a
    deadline armed before the wait."""

    _, shell = _run.shells(_policy(budget=30.0), None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        loop.call_later(0.01, future.set_result, "done")
        assert await shell(lambda: future, (), {}) == "done"

    asyncio.run(main())
    assert len(arms) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_exceptions_landing_between_steps_leave_nothing_armed(
    backend: str,
) -> None:
    """An exception landing at each line of the forwarding generator in
    turn (the attempt suspended three times) ends the call with it, after
    the attempt's clean-up ran once, and leaves no deadline armed and no
    cancellation pending."""
    cleaned: list[int] = []

    @resilient.retry(_policy(budget=30.0))
    async def body() -> str:
        try:
            for _ in range(3):
                await anyio.sleep(0.001)
        finally:
            cleaned.append(1)
        return "ok"

    async def main() -> int:
        n = 0
        while True:
            n += 1
            before = _cancel_state(backend)
            cleaned.clear()
            nth = nth_line(n)

            try:
                with at_line([_lazy.suspended], nth) as tracer:
                    result = await body()
            except Landed:
                pass
            else:
                assert result == "ok"
            assert cleaned == [1], n
            assert _cancel_state(backend) == before, n
            await anyio.lowlevel.checkpoint()  # Nothing pending here.
            if backend == "asyncio":
                dog = _watchdog._DOGS.get(asyncio.get_running_loop())
                heap = [] if dog is None else dog.heap
                assert all(e[_watchdog.TASK] is None for e in heap), n
            if not tracer.fired:
                return n

    lines = anyio.run(main, backend=backend)
    assert lines > 10


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step", [1, 2], ids=["first-step", "later-step"])
def test_an_exception_right_after_a_step_goes_into_the_attempt(
    backend: str, step: int
) -> None:
    """An exception landing right after a step of the attempt returned
    (where CPython checks for asynchronous ones after a call; injected as
    the ``c_return`` profile event of ``coro.send``), with the attempt
    suspended and what it yielded not yet passed on, is thrown into the
    attempt: its clean-up runs there and then, the exception ends the call,
    and nothing is left armed."""
    cleaned: list[int] = []
    coros: list[Any] = []

    async def attempt() -> str:
        try:
            for _ in range(3):
                await anyio.sleep(0.001)
        finally:
            cleaned.append(1)
        return "ok"  # pragma: no cover - interrupted

    def fn() -> Any:
        coro = attempt()
        coros.append(coro)
        return coro

    _, shell = _run.shells(_policy(budget=30.0), None)
    sends = itertools.count(1)

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if (
            event == "c_return"
            and getattr(arg, "__name__", "") == "send"
            and coros
            and getattr(arg, "__self__", None) is coros[0]
            and next(sends) == step
        ):
            raise Landed

    async def main() -> None:
        before = _cancel_state(backend)
        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            with pytest.raises(Landed):
                await shell(fn, (), {})
        finally:
            sys.setprofile(previous)
        assert cleaned == [1]
        assert coros[0].cr_frame is None
        assert _cancel_state(backend) == before
        await anyio.lowlevel.checkpoint()
        if backend == "asyncio":
            dog = _watchdog._DOGS.get(asyncio.get_running_loop())
            heap = [] if dog is None else dog.heap
            assert all(e[_watchdog.TASK] is None for e in heap)

    anyio.run(main, backend=backend)
