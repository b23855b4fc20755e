"""
Concurrent callers of one colour, for scenarios written once and run by
threads, asyncio tasks or trio tasks.

`Actors` runs callers as threads (``sync``) or as tasks of an asyncio or
trio event loop that runs in a helper thread (an anyio blocking portal).
A scenario is plain code in the test thread: it starts callers, waits for
them to queue (`wait_until`), changes the state (releases a slot, advances
a fake clock) and reads their outcomes as `concurrent.futures.Future`s.
Because the event loop is in another thread, a test thread that releases
what a task waits for exercises the cross-thread wake-up; same-thread
hand-offs need a plain async test.

Usage, for any primitive with a sync and an async way to wait::

    def test_waiter_gets_released_slot(actors: Actors) -> None:
        held = actors.call(bh.acquire, bh.aacquire)
        fut = actors.start(bh.acquire, bh.aacquire)
        wait_until(lambda: bh.statistics().waiting == 1)
        held.release()
        fut.result(timeout=10).release()

The ``actors`` fixture (in ``tests/conftest.py``) runs a test once per
colour.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Final, TypeVar, final

import anyio.from_thread

import resilient


T = TypeVar("T")

KINDS: Final = ("sync", "asyncio", "trio")
"""The colours of callers: threads, asyncio tasks, trio tasks."""


def wait_until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll *predicate* (real time, 1 ms steps) until it holds."""
    end = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > end:  # pragma: no cover (a hang)
            raise AssertionError("condition never held")
        time.sleep(0.001)


@final
class Actors:
    """
    Concurrent callers of one colour: threads (``sync``) or tasks in an
    asyncio or trio event loop running in a helper thread.

    Args:
        kind: ``"sync"``, ``"asyncio"`` or ``"trio"``.
    """

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self._portal_cm: Any = None
        self.portal: Any = None
        """The anyio blocking portal of the event loop (None for sync)."""
        if kind != "sync":
            self._portal_cm = anyio.from_thread.start_blocking_portal(kind)
            self.portal = self._portal_cm.__enter__()

    def __repr__(self) -> str:
        return f"Actors({self.kind})"

    def close(self) -> None:
        """Stop the event loop (tasks still running are cancelled)."""
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)
            self._portal_cm = None

    def call(
        self,
        sync: Callable[..., T],
        async_: Callable[..., Awaitable[T]],
        *args: Any,
    ) -> T:
        """Call in this colour, blocking the test until it returns."""
        if self.kind == "sync":
            return sync(*args)
        return self.portal.call(async_, *args)  # type: ignore[no-any-return]

    def start(
        self,
        sync: Callable[..., T],
        async_: Callable[..., Awaitable[T]],
        *args: Any,
        deadline: float | None = None,
    ) -> Future[T]:
        """
        Start one caller (inside ``resilient.deadline(deadline)``) in a new
        thread or task; its outcome.
        """
        if self.kind == "sync":
            fut: Future[T] = Future()

            def body() -> None:
                try:
                    with resilient.deadline(deadline):
                        fut.set_result(sync(*args))
                except BaseException as exc:
                    fut.set_exception(exc)

            threading.Thread(target=body, daemon=True).start()
            return fut

        async def abody() -> T:
            with resilient.deadline(deadline):
                return await async_(*args)

        return self.portal.start_task_soon(abody)  # type: ignore[no-any-return]
