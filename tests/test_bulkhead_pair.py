"""
The pipeline's breaker-then-bulkhead pair (`resilient._bulkhead._pair`),
which does the bulkhead machine's take and release inline: it counts,
frees, serves the queue and survives an exception landing at any point
where one can land, as the machine's own steps do.
"""

from __future__ import annotations

import contextlib
import dis
import gc
import inspect
import itertools
import signal
import threading
import types
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

import resilient
from resilient._breaker import breaker as get_breaker
from resilient._bulkhead import Bulkhead, BulkheadPermit, get_bulkhead
from resilient._bulkhead._pair import BreakerBulkhead
from resilient._core._config_breaker import BreakerConfig
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._core._done import DONE
from resilient._pipeline import _run
from resilient._pipeline._guards import Guards
from tests.inject import Landed, at_line
from tests.storm import unlocked


_names = itertools.count()


def _policy(*, max_waiting: int = 0) -> resilient.Policy:
    return resilient.Policy(
        name=f"pair-{next(_names)}",
        attempts=3,
        budget=None,
        backoff=resilient.Constant(seconds=0),
        retry_on=ValueError,
        breaker=BreakerConfig(minimum_calls=10**6),
        bulkhead=BulkheadConfig(
            max_concurrent=1, max_waiting=max_waiting, max_wait=0
        ),
    )


@pytest.fixture(autouse=True)
def _warm() -> None:
    """A call first: the very first one in a process checks the telemetry
    environment and so takes the full path, not the bare one."""
    resilient.retry(_policy())(lambda: None)()


def _pair(policy: resilient.Policy) -> tuple[BreakerBulkhead, Bulkhead]:
    guards = Guards.of(policy)
    assert guards is not None
    pair = guards.bare
    assert isinstance(pair, BreakerBulkhead)
    return pair, get_bulkhead(policy.name, policy.bulkhead)


def _counts(bh: Bulkhead) -> tuple[int, int, int]:
    gc.collect()
    s = bh.statistics()
    assert unlocked(bh._machine._lock)
    return s.in_use, s.acquired, s.released


def run_to_end(coro: Coroutine[Any, Any, Any]) -> None:
    """Run a coroutine that never suspends to its end, outside a loop."""
    with pytest.raises(StopIteration):
        coro.send(None)


def test_the_permit_carries_the_breaker_ticket() -> None:
    """The pair's ticket is one permit: it holds the slot and carries the
    breaker's closed ticket; a settle frees the slot and counts the
    attempt in the breaker (a success, then a failure the breaker counts),
    a drop afterwards changes nothing."""
    policy = _policy()
    pair, bh = _pair(policy)
    cb = get_breaker(policy.name)
    permit = pair.fast_admit()
    assert isinstance(permit, BulkheadPermit)
    assert permit._outer[0] == cb.fast_admit()[0]  # type: ignore[index]
    assert pair.fast_admit() is None  # One slot only.
    assert _counts(bh) == (1, 1, 0)
    pair.fast_settle(permit, None)
    assert permit.released
    assert _counts(bh) == (0, 1, 1)
    assert cb.statistics().calls == 1
    pair.fast_drop(permit)
    assert _counts(bh) == (0, 1, 1)
    permit = pair.fast_admit()
    assert permit is not None
    pair.fast_settle(permit, ConnectionError())
    stats = cb.statistics()
    assert (stats.calls, stats.failures) == (2, 1)
    assert _counts(bh) == (0, 2, 2)


def test_the_async_settle_frees_then_hands_the_breaker_settle() -> None:
    """The async settle frees the slot at once and returns the breaker's
    own settle to await (a failure too); while cancelled it counts
    nothing and returns `DONE`."""
    policy = _policy()
    pair, bh = _pair(policy)
    cb = get_breaker(policy.name)
    for exc in (None, ConnectionError()):
        permit = pair.fast_admit()
        assert permit is not None
        pending = pair.afast_settle(permit, exc)
        assert _counts(bh)[0] == 0
        assert isinstance(pending, Coroutine)
        run_to_end(pending)
    stats = cb.statistics()
    assert (stats.calls, stats.failures) == (2, 1)
    permit = pair.fast_admit()
    assert permit is not None
    assert pair.afast_settle(permit, KeyboardInterrupt()) is DONE
    assert cb.statistics().calls == 2
    assert _counts(bh) == (0, 3, 3)


@pytest.mark.parametrize("colour", ["sync", "async"])
def test_a_settle_serves_the_first_waiter(colour: str) -> None:
    """The slot the pair frees goes to the caller queued for it (granted
    and woken), not back to the free slots: a newcomer cannot overtake."""
    pair, bh = _pair(_policy(max_waiting=1))
    m = bh._machine
    permit = pair.fast_admit()
    assert permit is not None
    woken: list[int] = []
    waiter = BulkheadPermit(bh)
    assert (
        m.enqueue(waiter, 0.0, 10.0, "timeout", lambda: woken.append(1))
        is None
    )
    assert not woken
    if colour == "sync":
        pair.fast_settle(permit, None)
    else:
        run_to_end(pair.afast_settle(permit, None))  # type: ignore[arg-type]
    assert woken == [1]
    assert m.settle(waiter, 0.0) is True
    assert pair.fast_admit() is None
    waiter.release()
    assert _counts(bh) == (0, 2, 2)


def _landing_lines(fn: Callable[..., Any]) -> frozenset[int]:
    """
    The lines of *fn* where an asynchronous exception can land: its first
    line, and the line after each call (CPython checks for one when a call
    returns, at a function's entry and on a backward jump, and the pair's
    code has no loop). Between two such points its code runs as one step:
    a tracer raising there would land where no interrupt can (and where
    the machine's own steps would not survive one either).
    """
    code = fn.__code__
    calls = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
    lines: set[int] = set()
    ins = [i for i in dis.get_instructions(code) if i.opname != "RESUME"]
    at = {i.offset: k for k, i in enumerate(ins)}
    lines.add(ins[0].positions.lineno)  # type: ignore[union-attr,arg-type]
    for k, i in enumerate(ins):
        if i.opname not in calls:
            continue
        here = i.positions.lineno  # type: ignore[union-attr]
        j = k + 1
        while j < len(ins):
            if ins[j].opname == "JUMP_FORWARD":
                # The line that runs next, not the handler laid out next
                # (after the unlock in a ``finally``).
                j = at[ins[j].argval]
                continue
            line = ins[j].positions.lineno  # type: ignore[union-attr]
            if line is not None and line != here:
                lines.add(line)
                break
            j += 1
    # The line after the last call of a ``with`` block can be the
    # statement's own line, where its exit begins: an exception landing
    # after that call is inside the block (its exit runs), but a tracer
    # raising at that line event would skip the exit.
    src, start = inspect.getsourcelines(fn)
    return frozenset(
        n for n in lines if not src[n - start].lstrip().startswith("with ")
    )


_PAIR = [
    BreakerBulkhead.fast_admit,
    BreakerBulkhead.fast_settle,
    BreakerBulkhead.afast_settle,
    BreakerBulkhead.fast_drop,
]


def _nth_landing(n: int) -> Callable[[types.FrameType], bool]:
    """True at the *n*-th line event, counting every line of the drivers
    and the pair's landing lines."""
    allowed = {f.__code__: _landing_lines(f) for f in _PAIR}
    count = itertools.count(1)

    def when(frame: types.FrameType) -> bool:
        lines = allowed.get(frame.f_code)
        if lines is not None and frame.f_lineno not in lines:
            return False
        return next(count) == n

    return when


def test_landing_lines_are_after_calls() -> None:
    """The sweep's notion of where an exception can land: the pair's
    admission lands at its first line, after the breaker's admission,
    after the weak reference is made and after it is added, never between
    (where the counts change with no call)."""
    src, start = _source_lines(BreakerBulkhead.fast_admit)
    lines = {
        src[n - start].strip()
        for n in _landing_lines(BreakerBulkhead.fast_admit)
    }
    assert "permit._ref = ref  # noqa: SLF001" in lines
    assert "return permit" in lines
    assert "m.acquired += 1" not in lines
    assert "holders.add(ref)" not in lines


def _source_lines(fn: Callable[..., Any]) -> tuple[list[str], int]:
    src, start = inspect.getsourcelines(fn)
    return src, start


def _sweep(call: Callable[[], Any], bh: Bulkhead) -> int:
    """*call* with an exception landing at each landing point in turn;
    after each, once the exception is dropped, no slot is held and the
    counts add up. The number of points tried."""
    n = 0
    while True:
        n += 1
        with (
            at_line([_run.call_sync, *_PAIR], _nth_landing(n)) as tracer,
            contextlib.suppress(Landed),
        ):
            assert call() == "ok"
        in_use, acquired, released = _counts(bh)
        assert in_use == 0, (n, tracer.frames)
        assert acquired == released, (n, tracer.frames)
        if not tracer.fired:
            return n


def test_an_exception_at_each_landing_point_of_the_sync_pair() -> None:
    """An exception landing at each point in turn of `call_sync` and of
    the pair's steps (a first attempt that fails bare, a retry on the full
    path that succeeds; then a first attempt that succeeds bare) leaves no
    slot held once it is dropped, and the bulkhead admits again."""
    policy = _policy()
    _, bh = _pair(policy)
    calls: list[int] = []

    @resilient.retry(policy)
    def body() -> str:
        calls.append(1)
        if len(calls) % 2:
            raise ValueError
        return "ok"

    def failing_first() -> str:
        calls.clear()
        return body()

    def succeeding_first() -> str:
        calls[:] = [1]
        return body()

    assert _sweep(failing_first, bh) > 20
    assert _sweep(succeeding_first, bh) > 10
    with bh:
        pass
    assert _counts(bh)[0] == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_exception_at_each_landing_point_of_the_async_pair(
    backend: str,
) -> None:
    """The async twin: at each point of `call_async` and the pair's steps,
    a first attempt that succeeds bare, or fails bare and succeeds on
    retry, leaves no slot held once the exception is dropped."""
    policy = _policy()
    _, bh = _pair(policy)
    calls: list[int] = []

    @resilient.retry(policy)
    async def body() -> str:
        calls.append(1)
        if len(calls) % 2:
            raise ValueError
        return "ok"

    async def main() -> list[int]:
        tried = []
        for first in ([], [1]):
            n = 0
            while True:
                n += 1
                calls[:] = first
                with (
                    at_line(
                        [_run.call_async, *_PAIR], _nth_landing(n)
                    ) as tracer,
                    contextlib.suppress(Landed),
                ):
                    assert await body() == "ok"
                in_use, acquired, released = _counts(bh)
                assert in_use == 0, (n, tracer.frames)
                assert acquired == released, (n, tracer.frames)
                if not tracer.fired:
                    break
            tried.append(n)
        return tried

    tried = anyio.run(main, backend=backend)
    assert tried[0] > 20
    assert tried[1] > 10


def test_the_sweep_reaches_the_pair() -> None:
    """The sweeps above do land inside the pair: its admission's landing
    point after the grant is reached (the permit then lost with the
    exception, its slot given back once it is freed)."""
    policy = _policy()
    _, bh = _pair(policy)
    fn = resilient.retry(policy)(lambda: "ok")
    target = {
        n
        for n in _landing_lines(BreakerBulkhead.fast_admit)
        if "return permit" in _line(BreakerBulkhead.fast_admit, n)
    }

    def when(frame: types.FrameType) -> bool:
        return (
            frame.f_code is BreakerBulkhead.fast_admit.__code__
            and frame.f_lineno in target
        )

    with at_line([BreakerBulkhead.fast_admit], when) as tracer:
        with pytest.raises(Landed) as landed:
            fn()
        del landed
    assert tracer.fired
    assert _counts(bh) == (0, 1, 1)


def _line(fn: Callable[..., Any], n: int) -> str:
    src, start = _source_lines(fn)
    return src[n - start]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="SIGALRM")
@pytest.mark.parametrize("step", ["admit", "settle"])
def test_an_interrupted_wait_for_the_lock_frees_nobody_elses(
    step: str,
) -> None:
    """
    A signal whose handler raises while the pair waits for the machine's
    lock (another thread holds it) ends the wait with that exception, not
    another: the pair does not release the other thread's hold (it takes
    the lock without ``with``, and releases only its own), and changes
    nothing; an admission took no slot, a settle's slot is freed by the
    drop that follows.
    """
    policy = _policy()
    pair, bh = _pair(policy)
    m = bh._machine
    permit = pair.fast_admit() if step == "settle" else None
    held, go = threading.Event(), threading.Event()

    def holder() -> None:
        with m._lock:
            held.set()
            go.wait(10)

    worker = threading.Thread(target=holder)
    worker.start()

    def interrupt(signum: int, frame: object) -> None:
        raise Landed

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert held.wait(10)
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        with pytest.raises(Landed):
            if permit is None:
                pair.fast_admit()
            else:
                pair.fast_settle(permit, None)
        # The other thread's hold is intact.
        assert not m._lock.acquire(blocking=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        go.set()
        worker.join()
    if permit is None:
        assert _counts(bh) == (0, 0, 0)
    else:
        assert not permit.released
        assert _counts(bh) == (1, 1, 0)
        pair.fast_drop(permit)
        assert _counts(bh) == (0, 1, 1)
