"""
Singleflight under schedules and storms (RELIABILITY test 19, the
singleflight points): Hypothesis schedules of random cancellations in
asyncio and trio (waiting, just joined, the leader mid-execution), 32
threads with random deadlines, and asynchronous KeyboardInterrupts
(``PyThreadState_SetAsyncExc``) landing at random points in callers.

Each ends at quiescence with the in-flight map empty, nobody waiting,
tasks and threads at baseline, and no exception lost or invented.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilient
from resilient.exceptions import DeadlineExceeded


@attrs.frozen
class Caller:
    """When a caller arrives, and when (if ever) it is cancelled."""

    start: int
    cancel_after: int | None  # Steps after its start; 0: just joined.


@attrs.frozen
class Schedule:
    callers: list[Caller]
    duration: int  # Steps each execution takes.
    fails: bool  # Whether executions raise (a fresh error each) or return.


schedules = st.builds(
    Schedule,
    callers=st.lists(
        st.builds(
            Caller,
            start=st.integers(0, 6),
            cancel_after=st.none() | st.integers(0, 6),
        ),
        min_size=1,
        max_size=7,
    ),
    duration=st.integers(1, 5),
    fails=st.booleans(),
)

STEP_YIELDS = 8  # Checkpoints per step: enough for a cancel to unwind.


def _living(backend: str) -> int:
    if backend == "trio":
        import trio

        return trio.lowlevel.current_statistics().tasks_living
    return len(asyncio.all_tasks())


async def _run_schedule(
    schedule: Schedule, backend: str
) -> resilient.SingleFlightStatistics:
    group = resilient.SingleFlight()
    step = 0
    produced: list[object] = []  # Every value returned, error raised.
    live = {"running": 0, "cancelled": 0, "started": 0}

    async def work() -> object:
        live["started"] += 1
        live["running"] += 1
        try:
            until = step + schedule.duration
            while step < until:
                await anyio.lowlevel.checkpoint()
            out: Any = ValueError("shared") if schedule.fails else object()
            produced.append(out)
            if schedule.fails:
                raise out
            return out
        except anyio.get_cancelled_exc_class():
            live["cancelled"] += 1
            raise
        finally:
            live["running"] -= 1

    outcomes: dict[int, object] = {}

    async def call(i: int, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                outcomes[i] = await group.acall("k", work)
            except ValueError as exc:
                outcomes[i] = exc
        if scope.cancelled_caught:
            outcomes[i] = "cancelled"

    baseline = _living(backend)
    scopes = [anyio.CancelScope() for _ in schedule.callers]
    last = max(c.start + (c.cancel_after or 0) for c in schedule.callers)
    async with anyio.create_task_group() as tg:
        for step in range(last + schedule.duration + 2):
            for i, c in enumerate(schedule.callers):
                if c.start == step:
                    tg.start_soon(call, i, scopes[i])
                # 0: cancelled at its first checkpoint, just after joining.
                if c.cancel_after is not None and (
                    c.start + c.cancel_after == step
                ):
                    scopes[i].cancel()
            for _ in range(STEP_YIELDS):
                await anyio.lowlevel.checkpoint()
            # At most one execution per key that nobody cancelled.
            assert live["running"] <= 1
            assert group.statistics().running <= 1
        step += 10**6  # Let every execution end.
    for _ in range(STEP_YIELDS):
        await anyio.lowlevel.checkpoint()

    s = group.statistics()
    assert (s.in_flight, s.running, s.waiting) == (0, 0, 0)
    assert live["running"] == 0
    # Each abandoned execution was cancelled, or never started at all.
    assert live["cancelled"] <= s.abandoned
    assert s.executions - live["started"] == s.abandoned - live["cancelled"]
    assert _living(backend) == baseline
    for i, c in enumerate(schedule.callers):
        got = outcomes[i]
        if c.cancel_after is None:
            # Never cancelled: the real value or exception of an execution.
            assert any(got is p for p in produced), (i, got)
        else:
            assert got == "cancelled" or any(got is p for p in produced)
    return s


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=1000, deadline=None)
@given(schedule=schedules)
def test_random_cancellations_leave_nothing_behind(
    backend: str, schedule: Schedule
) -> None:
    """
    Whoever is cancelled when, the callers left get an execution's own
    result or exception object, at most one uncancelled execution runs per
    key, an execution is cancelled only when its last caller left, and at
    the end no map entry, waiter or task remains.
    """
    stats = anyio.run(_run_schedule, schedule, backend, backend=backend)
    assert (stats.in_flight, stats.running, stats.waiting) == (0, 0, 0)
    assert stats.executions >= 1


def test_thirty_two_threads_with_random_deadlines() -> None:
    """
    32 threads calling one key with random deadlines: one execution at a
    time, every caller gets an execution's object or its own deadline,
    and the map is empty at the end.
    """
    group = resilient.SingleFlight()
    lock = threading.Lock()
    state = {"running": 0, "most": 0}
    produced: list[object] = []
    rng = random.Random(19)

    def work() -> object:
        with lock:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        try:
            time.sleep(0.0005)
            out: Any = ValueError("shared") if rng.random() < 0.3 else object()
            produced.append(out)
            if isinstance(out, ValueError):
                raise out
            return out
        finally:
            with lock:
                state["running"] -= 1

    problems: list[object] = []

    def body(seed: int) -> None:
        local = random.Random(seed)
        for _ in range(60):
            limit = local.choice([None, 0.0, 0.0002, 0.002])
            try:
                with resilient.deadline(limit):
                    got = group.call("k", work)
            except ValueError as exc:
                got = exc
            except DeadlineExceeded:
                continue
            if not any(got is p for p in produced):  # pragma: no cover
                problems.append(got)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert problems == []
    assert state["most"] == 1
    s = group.statistics()
    assert (s.in_flight, s.running, s.waiting) == (0, 0, 0)


def _raise_in(thread: threading.Thread, exc: type[BaseException]) -> int:
    """Schedule *exc* in *thread* at its next bytecode boundary."""
    assert thread.ident is not None
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(exc)
    )


def test_keyboard_interrupts_at_random_points_leave_nothing_behind() -> None:
    """
    KeyboardInterrupts land at random bytecodes in leaders and followers
    (joining, running, waiting, leaving): every one reaches its caller,
    no caller hangs, and at the end the map is empty and nobody waits.

    The storm runs in a fresh interpreter: under a line tracer (coverage)
    interrupts land in the tracer's own callbacks, which is not a place
    the library can defend.
    """
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("COVERAGE_PROCESS_START", None)
    done = subprocess.run(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", f"import {__name__} as t; t.storm()"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    injected, delivered, joined = map(int, done.stdout.split())
    assert delivered == injected >= 20
    assert joined > 0


def storm(callers: int = 12, seconds: float = 1.5) -> None:
    """The storm itself: prints injected, delivered and joined counts."""
    group = resilient.SingleFlight()
    stop = threading.Event()
    delivered = [0] * callers

    def work() -> int:
        total = 0
        for i in range(200):
            total += i
        return total

    def body(i: int) -> None:
        while True:
            try:
                while not stop.is_set():
                    try:
                        group.call("k", work)
                    except KeyboardInterrupt:
                        delivered[i] += 1
                return
            except KeyboardInterrupt:
                delivered[i] += 1

    sys.setswitchinterval(1e-5)
    gc.callbacks.clear()  # An interrupt in a gc callback is "ignored".
    threads = [
        threading.Thread(target=body, args=(i,)) for i in range(callers)
    ]
    try:
        for t in threads:
            t.start()
        rng = random.Random(8)
        end = time.monotonic() + seconds
        injected = 0
        while time.monotonic() < end and injected < 300:
            i = rng.randrange(len(threads))
            before = delivered[i]
            assert _raise_in(threads[i], KeyboardInterrupt) == 1
            injected += 1
            limit = time.monotonic() + 5
            while delivered[i] == before:  # Never lost, never swallowed.
                assert time.monotonic() < limit, "an interrupt vanished"
                time.sleep(0)
            time.sleep(rng.random() * 0.0005)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not any(t.is_alive() for t in threads), "a caller hangs"
    s = group.statistics()
    assert (s.in_flight, s.running, s.waiting) == (0, 0, 0), s
    print(injected, sum(delivered), s.joined)  # noqa: T201
