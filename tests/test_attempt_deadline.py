"""
The async attempt deadline without a cancel scope per attempt (issue 7,
"Performance: the async attempt deadline"): the loop's watchdog on asyncio,
trio's own cancel scope on trio. The attempt is interrupted at its
deadline, the caller's own cancellation is never taken for a timeout,
deadlines nest, and nothing is armed when there is no deadline.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
import weakref
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
from resilient._pipeline import _lazy
from resilient._timeout import _watchdog
from resilient.exceptions import DeadlineExceeded, TimedOut


BACKENDS = ["asyncio", "trio"]


def _policy(**kw: Any) -> resilient.Policy:
    return resilient.Policy(
        attempts=3, backoff=resilient.Constant(0), retry_on=ValueError, **kw
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_budget_interrupts_a_first_attempt(backend: str) -> None:
    """A first attempt (the bare path) that overruns the call's budget is
    interrupted at the deadline and the call raises DeadlineExceeded."""
    calls: list[int] = []

    @resilient.retry(_policy(budget=0.02))
    async def body() -> None:
        calls.append(1)
        await anyio.sleep(5)

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        anyio.run(body, backend=backend)
    assert time.monotonic() - started < 2.0
    assert calls == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_the_attempt_that_overran_is_interrupted(backend: str) -> None:
    """Two calls in flight with different deadlines: the one that overran
    raises, the other one (earlier deadline passed while it ran) returns."""
    results: dict[str, object] = {}

    @resilient.retry(_policy(budget=0.03))
    async def slow() -> str:
        await anyio.sleep(5)
        return "slow"

    @resilient.retry(_policy(budget=10.0))
    async def quick() -> str:
        await anyio.sleep(0.06)
        return "quick"

    async def run(name: str, fn: Any) -> None:
        try:
            results[name] = await fn()
        except DeadlineExceeded as exc:
            results[name] = exc

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "slow", slow)
            tg.start_soon(run, "quick", quick)

    anyio.run(main, backend=backend)
    assert isinstance(results["slow"], DeadlineExceeded)
    assert results["quick"] == "quick"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_callers_cancellation_is_not_a_timeout(backend: str) -> None:
    """The caller cancelling a call in its attempt gets its cancellation,
    not DeadlineExceeded, and the call is not retried."""
    calls: list[int] = []
    seen: list[BaseException] = []
    kinds: list[type[BaseException]] = []

    @resilient.retry(_policy(budget=10.0))
    async def body() -> None:
        calls.append(1)
        await anyio.sleep(5)

    async def call() -> None:
        try:
            await body()
        except BaseException as exc:
            seen.append(exc)
            kinds.append(anyio.get_cancelled_exc_class())
            raise

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(0.01)
                scope.cancel()
        assert scope.cancelled_caught

    anyio.run(main, backend=backend)
    assert calls == [1]
    assert len(seen) == 1
    assert isinstance(seen[0], kinds[0])


def test_a_cancellation_with_the_deadline_stays_the_callers() -> None:
    """asyncio: the caller's cancel that lands in the same loop iteration as
    the watchdog's is the caller's: disarm does not claim it, and the
    task's cancellation count is left at the caller's one."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        armed = _watchdog.arm(-1.0)  # Past: fires next iteration.
        loop.call_soon(task.cancel)  # The caller's, in the same iteration.
        caught: list[bool] = []
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            caught.append(_watchdog.disarm(armed, exc))
            raise
        finally:
            assert armed[_watchdog.FIRED]
            assert caught == [False]
            assert task.cancelling() == 1

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_the_watchdogs_own_cancellation_is_taken_back() -> None:
    """asyncio: an attempt stopped by its deadline alone is claimed
    (disarm is True) and leaves no cancellation pending on the task."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        armed = _watchdog.arm(0.001)
        caught: list[bool] = []
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError as exc:
            caught.append(_watchdog.disarm(armed, exc))
        assert caught == [True]
        assert task.cancelling() == 0
        await asyncio.sleep(0)  # Nothing left to deliver.

    asyncio.run(main())


def test_an_attempt_that_swallows_its_cancellation_returns() -> None:
    """asyncio: an attempt that catches the deadline's cancellation and
    returns keeps its result, and the cancellation is taken back."""

    @resilient.retry(_policy(budget=0.005))
    async def body() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "kept"
        return "slept"  # pragma: no cover - interrupted

    async def main() -> None:
        assert await body() == "kept"
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_policies_stop_at_the_outer_deadline(backend: str) -> None:
    """A policy inside another one is clipped to the outer deadline: the
    inner attempt is interrupted there, and the outer call raises
    DeadlineExceeded, each attempted once."""
    inner_calls: list[int] = []
    outer_calls: list[int] = []

    @resilient.retry(_policy(budget=30.0))
    async def inner() -> None:
        inner_calls.append(1)
        await anyio.sleep(5)

    @resilient.retry(_policy(budget=0.02))
    async def outer() -> None:
        outer_calls.append(1)
        await inner()

    with pytest.raises(DeadlineExceeded):
        anyio.run(outer, backend=backend)
    assert inner_calls == [1]
    assert outer_calls == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_enclosing_timeout_scope_raises_timed_out(backend: str) -> None:
    """A `resilient.timeout` around a call under the default budget raises
    TimedOut at its own deadline, as before."""

    @resilient.retry(_policy())
    async def body() -> None:
        await anyio.sleep(5)

    async def main() -> None:
        async with resilient.timeout(0.02):
            await body()

    with pytest.raises(TimedOut):
        anyio.run(main, backend=backend)


def test_nothing_is_armed_without_a_deadline() -> None:
    """asyncio: a call with no budget and no enclosing deadline makes no
    watchdog and arms no timer; one with a budget does."""

    unbounded = resilient.retry(_policy(budget=None))(asyncio.sleep)
    bounded = resilient.retry(_policy(budget=30.0))(asyncio.sleep)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await unbounded(0)
        assert loop not in _watchdog._DOGS
        await bounded(0)
        dog = _watchdog._DOGS[loop]
        assert dog.handle is not None
        assert dog.armed < math.inf

    asyncio.run(main())


def test_the_heap_stays_bounded() -> None:
    """asyncio: the entries of attempts that ended are dropped, so many
    calls under a long budget leave the heap within its limit."""
    bounded = resilient.retry(_policy(budget=30.0))(asyncio.sleep)

    async def main() -> None:
        for _ in range(1000):
            await bounded(0)
        dog = _watchdog._DOGS[asyncio.get_running_loop()]
        assert len(dog.heap) <= _watchdog._MIN_COMPACT
        assert all(e[_watchdog.TASK] is None for e in dog.heap)

    asyncio.run(main())


def test_an_earlier_deadline_re_arms_the_timer() -> None:
    """asyncio: a deadline earlier than the armed one re-arms the timer for
    it; a later one leaves the timer alone."""

    async def main() -> None:
        late = _watchdog.arm(30.0)
        dog = _watchdog._DOGS[asyncio.get_running_loop()]
        first = dog.armed
        later = _watchdog.arm(60.0)
        assert dog.armed == first
        early = _watchdog.arm(10.0)
        assert dog.armed < first
        for armed in (early, later, late):
            assert not _watchdog.disarm(armed, None)

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_form_attempt_interrupted_at_the_budget(backend: str) -> None:
    """The block form's attempt uses the same deadline: interrupted at the
    budget, it raises DeadlineExceeded out of the loop."""
    entered: list[int] = []

    async def main() -> None:
        async for attempt in resilient.retrying(_policy(budget=0.02)):
            async with attempt:
                entered.append(attempt.number)
                await anyio.sleep(5)

    with pytest.raises(DeadlineExceeded):
        anyio.run(main, backend=backend)
    assert entered == [1]


def test_each_loop_has_its_own_watchdog() -> None:
    """asyncio: two event loops used in turn each keep their own watchdog,
    found again when a loop comes back."""
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()

    async def dog() -> object:
        armed = _watchdog.arm(30.0)
        _watchdog.disarm(armed, None)
        return _watchdog._DOGS[asyncio.get_running_loop()]

    try:
        a = first.run_until_complete(dog())
        b = second.run_until_complete(dog())
        again = first.run_until_complete(dog())
    finally:
        first.close()
        second.close()
    assert a is again
    assert a is not b


def test_an_arm_cut_off_leaves_a_dead_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asyncio: an exception while registering (an asynchronous one, here
    raised by the heap) leaves the entry dead: the watchdog never cancels
    the task for it."""

    def cut_off(heap: list[Any], entry: list[Any]) -> None:
        heap.append(entry)
        raise KeyboardInterrupt

    async def main() -> None:
        monkeypatch.setattr(_watchdog, "heappush", cut_off)
        with pytest.raises(KeyboardInterrupt):
            _watchdog.arm(0.001)
        monkeypatch.undo()
        dog = _watchdog._DOGS[asyncio.get_running_loop()]
        assert [e[_watchdog.TASK] for e in dog.heap] == [None]
        await asyncio.sleep(0.01)  # Not cancelled.

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancellation_at_a_zero_delay_checkpoint(backend: str) -> None:
    """The caller's cancellation delivered at a zero-delay retry's
    checkpoint ends the call there: no further attempt."""
    calls: list[int] = []
    scopes: list[anyio.CancelScope] = []

    @resilient.retry(_policy(budget=None))
    async def body() -> None:
        calls.append(1)
        scopes[0].cancel()
        raise ValueError

    async def main() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await body()
        assert scope.cancelled_caught

    anyio.run(main, backend=backend)
    assert calls == [1]


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "retried"])
def test_a_deadline_that_raises_on_exit_is_the_attempts_error(
    bare: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trio: an error from leaving the attempt's deadline (trio's scope
    exit raising, as on a misnested scope) is the attempt's outcome, in the
    bare first attempt and in a retried one (an attempt that suspends, so
    that its deadline is armed)."""
    calls: list[int] = []

    def broken(armed: Any, exc: BaseException | None) -> bool:
        armed.__exit__(None, None, None)
        raise LookupError

    @resilient.retry(_policy(budget=30.0))
    async def body() -> str:
        calls.append(1)
        if not bare and len(calls) == 1:
            raise ValueError
        if len(calls) == (1 if bare else 2):
            monkeypatch.setattr(_lazy, "disarm", broken)
        await anyio.lowlevel.checkpoint()
        return "ok"

    with pytest.raises(LookupError):
        anyio.run(body, backend="trio")
    assert len(calls) == (1 if bare else 2)


def test_a_closed_loop_is_freed() -> None:
    """asyncio: a loop closed with a deadline timer still armed is freed
    (nothing of its watchdog holds it) and leaves the watchdogs' map."""
    bounded = resilient.retry(_policy(budget=30.0))(asyncio.sleep)
    gc.collect()  # The loops of earlier tests, gone first.
    loop = asyncio.new_event_loop()
    loop.run_until_complete(bounded(0))
    assert loop in _watchdog._DOGS
    count = len(_watchdog._DOGS)
    freed = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert freed() is None
    assert len(_watchdog._DOGS) == count - 1


def test_a_past_deadline_of_an_attempt_that_ended_cancels_nothing() -> None:
    """asyncio: a deadline armed already past (the watchdog's next-callback
    path) for code that ends before the loop runs it, without suspending
    (a block with no await, a future already done), cancels nothing: the
    task neither counts a cancellation nor receives one later."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        armed = _watchdog.arm(-1.0)
        assert not _watchdog.disarm(armed, None)
        await asyncio.sleep(0.01)  # Would raise CancelledError.
        assert task.cancelling() == 0

    asyncio.run(main())
