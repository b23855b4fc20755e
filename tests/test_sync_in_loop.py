"""
A sync guard that could block, used on a thread that runs an event loop, is
refused at its first call (issue 15, section 6, item 5), with the error a
blocking wait there raises (`RuntimeError`, naming the async form), not
only once it would block: on 4f15275 a sync-decorated function called from
a coroutine passed every test that did not fail, and the first outage in
production raised. asyncio and trio.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import resilient


def _policy(**kw: Any) -> resilient.Policy:
    base: dict[str, Any] = {
        "name": "sync-in-loop",
        "attempts": 3,
        "backoff": resilient.Constant(0.01),
    }
    return resilient.Policy(**{**base, **kw})


def test_sync_decorated_call_in_a_loop_is_refused_at_once(
    anyio_backend: str,
) -> None:
    """A sync function under a retrying policy, called from a coroutine,
    raises before it runs, even though it would succeed."""
    ran: list[int] = []

    @_policy()
    def fetch() -> str:
        ran.append(1)
        return "ok"

    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"'sync-in-loop'.*event loop"):
            fetch()
        with pytest.raises(RuntimeError, match="event loop"):
            _policy().call(fetch.__wrapped__)  # type: ignore[attr-defined]

    anyio.run(main, backend=anyio_backend)
    assert ran == []


def test_sync_block_form_in_a_loop_is_refused_at_once(
    anyio_backend: str,
) -> None:
    """``for attempt in retrying(policy)`` in a coroutine raises at its
    first iteration."""
    entered: list[int] = []

    async def main() -> None:
        with pytest.raises(RuntimeError, match="event loop"):
            for attempt in resilient.retrying(_policy()):
                with attempt:
                    entered.append(1)

    anyio.run(main, backend=anyio_backend)
    assert entered == []


def test_what_cannot_block_is_allowed(anyio_backend: str) -> None:
    """A policy that never waits (one attempt, no bulkhead), and a
    retrying one called from a worker thread, run as before."""

    @_policy(attempts=1)
    def once() -> str:
        return "once"

    @_policy()
    def retried() -> str:
        return "retried"

    async def main() -> None:
        assert once() == "once"
        assert await anyio.to_thread.run_sync(retried) == "retried"

    anyio.run(main, backend=anyio_backend)
    assert retried() == "retried"  # No loop here.


def test_sync_bulkhead_in_a_loop_is_refused_at_once(
    anyio_backend: str,
) -> None:
    """
    A sync ``with bulkhead``, `Bulkhead.acquire` or sync function under a
    bulkhead that queues, on a loop's thread, raises at once, though a
    slot is free; one that never queues (``max_wait=0``), and
    `acquire_nowait`, are allowed.
    """
    queues = resilient.bulkhead(
        f"queues-{anyio_backend}", max_concurrent=2, max_wait=1.0
    )
    never = resilient.bulkhead(
        f"never-{anyio_backend}", max_concurrent=2, max_wait=0
    )
    ran: list[int] = []

    async def main() -> None:
        with pytest.raises(RuntimeError, match="event loop"), queues:
            ran.append(1)
        with pytest.raises(RuntimeError, match="event loop"):
            queues.acquire()
        with pytest.raises(RuntimeError, match="event loop"):
            queues(lambda: ran.append(1))()
        with queues.acquire_nowait(), never:
            ran.append(2)
        queues.acquire(timeout=0).release()

    anyio.run(main, backend=anyio_backend)
    assert ran == [2]
    assert queues.statistics().in_use == 0
