"""
Singleflight's cheap common case and what it must not cost: on asyncio the
tasks that wait with no deadline share one future, which a cancelled one
cancels for all (the others must wait on, and only the cancelled one
leave); and telemetry is read once per flight, when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

import pytest

import resilient
from tests.conftest import Telemetry
from tests.test_singleflight import (
    Callers,
    group_caller,
    quiet,
    wait_until,
    waiting,
)


@pytest.fixture(params=["sync", "asyncio", "trio"])
def colours(request: pytest.FixtureRequest) -> Iterator[Callers]:
    """Callers of each colour: threads, asyncio tasks, trio tasks."""
    c = Callers(request.param)
    yield c
    c.close()


async def _until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until *predicate* holds (a bounded number of turns)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")  # pragma: no cover


def _gated() -> tuple[asyncio.Event, object, Callable[[], Awaitable[object]]]:
    """An event, a value, and work that returns the value once it is set."""
    release = asyncio.Event()
    value = object()

    async def work() -> object:
        await release.wait()
        return value

    return release, value, work


def test_a_cancelled_follower_leaves_the_others_waiting_on_asyncio() -> None:
    """
    Followers sharing one future: cancelling two of them (one at a time)
    cancels the future under the others, who wait on and get the leader's
    object; the group counts only the cancelled ones gone.
    """

    async def main() -> None:
        group = resilient.SingleFlight()
        release, value, work = _gated()

        tasks = [asyncio.create_task(group.acall("k", work)) for _ in range(6)]
        await _until(lambda: group.statistics().waiting == 6)
        for gone in tasks[1:3]:
            gone.cancel()
            await _until(gone.done)
            assert gone.cancelled()
        await _until(lambda: group.statistics().waiting == 4)
        assert not any(t.done() for t in tasks[3:])
        release.set()
        for t in (tasks[0], *tasks[3:]):
            assert await t is value
        quiet(group)

    asyncio.run(main())


def test_a_task_with_an_old_cancel_request_is_not_cancelled_by_anothers() -> (
    None
):
    """
    A follower whose task once swallowed a cancellation (its `cancelling()`
    count stays 1) is not taken for the cancelled one when another
    follower's cancellation wakes everyone on the shared future: it waits
    on and gets the value.
    """

    async def main() -> None:
        group = resilient.SingleFlight()
        release, value, work = _gated()

        async def stale() -> object:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            # Swallowed without `uncancel()`: the count stays.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
            assert task.cancelling() == 1
            return await group.acall("k", work)

        leader = asyncio.create_task(group.acall("k", work))
        await _until(lambda: group.statistics().waiting == 1)
        old = asyncio.create_task(stale())
        other = asyncio.create_task(group.acall("k", work))
        await _until(lambda: group.statistics().waiting == 3)
        other.cancel()
        await _until(other.done)
        assert other.cancelled()
        await _until(lambda: group.statistics().waiting == 2)
        assert not old.done()
        release.set()
        assert await old is value
        assert await leader is value
        quiet(group)

    asyncio.run(main())


def test_telemetry_is_decided_when_a_flight_starts(colours: Callers) -> None:
    """
    Telemetry configured while a flight runs: callers that join it record
    nothing (a flight is recorded whole or not at all, and a joining
    caller does not look for telemetry); the next flight records.
    """
    callers = colours
    group = resilient.SingleFlight(name="late")
    t = Telemetry()
    try:
        work = callers.work()
        call = group_caller(callers, group, "k", work)
        leader = callers.start(call)
        waiting(group, 1)
        resilient.configure_telemetry(
            tracer_provider=t.tracer_provider, meter_provider=t.meter_provider
        )
        followers = callers.many(2, call)
        waiting(group, 3)
        work.latch.open()
        for f in (leader, *followers):
            assert f.result(10) is work.results[0]
        quiet(group)
        assert t.spans() == []
        assert t.metrics() == {}
        later = callers.work()
        later.latch.open()
        again = callers.start(group_caller(callers, group, "k", later))
        assert again.result(10) is later.results[0]
        wait_until(lambda: len(t.spans()) == 1)
        (span,) = t.spans()
        assert span.attributes["resilient.singleflight.role"] == "leader"
        assert t.metrics()["resilient.singleflight.executions"] == 1
    finally:
        resilient.configure_telemetry()
        t.tracer_provider.shutdown()
        t.meter_provider.shutdown()
    quiet(group)
