"""
An async backend that runs a sync backend's calls in worker threads.

For event loops a driver's own async client cannot serve (redis-py's and
psycopg's async clients are asyncio only, so trio uses this), and for
stores with no async client. Every call of the sync backend is bounded in
time by the backend itself, so a worker thread never outlives its call's
limit; a cancelled caller stops waiting at once and the call finishes (or
times out) on its own in the thread, its outcome unknown to the caller, as
with any request whose reply is lost.

The sync backend is the process's own for the URL (`open_backend`), shared
with threads and with every event loop that runs through it: a trio run
opens no connection of its own, so none outlives it. Its acquires and
watches stand in the lock's line as the calling task (`acquire_as`,
`watch_as`), not as the worker thread that happens to run them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, final

import anyio.to_thread
import sniffio

from resilient._backends._base import Busy


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        Grant,
        LockBackend,
        LockKey,
        OwnerToken,
        ReleaseResult,
        Renewal,
    )


__all__ = ["ThreadedAsyncBackend"]


@final
class ThreadedAsyncBackend:
    """
    `AsyncLockBackend` over a `LockBackend`: one worker thread a call.
    It closes the sync backend only if it *owns* it.
    """

    def __init__(self, backend: LockBackend, *, owns: bool = True) -> None:
        self._backend = backend
        self._owns = owns
        self.scheme = backend.scheme
        self.max_renew_batch = backend.max_renew_batch

    def __repr__(self) -> str:
        return f"ThreadedAsyncBackend({self._backend!r})"

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        acquire_as = getattr(self._backend, "acquire_as", None)
        if acquire_as is None:
            return await anyio.to_thread.run_sync(
                self._backend.acquire, key, owner, ttl, abandon_on_cancel=True
            )
        who = _task()
        # Asked here, in the loop's thread, so that the line is joined in
        # the order the tasks came, not the order worker threads ran.
        if self._backend.queued(key, who):  # type: ignore[attr-defined]
            return _QUEUED
        answer: Grant | Busy = await anyio.to_thread.run_sync(
            acquire_as, key, owner, ttl, who, abandon_on_cancel=True
        )
        return answer

    async def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        return await anyio.to_thread.run_sync(
            self._backend.renew, batch, abandon_on_cancel=True
        )

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        return await anyio.to_thread.run_sync(
            self._backend.release, key, owner, abandon_on_cancel=True
        )

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        watch_as = getattr(self._backend, "watch_as", None)
        if watch_as is None:
            return self._backend.watch(key, notify)
        stop: Callable[[], None] = watch_as(key, notify, _task())
        return stop

    async def aclose(self) -> None:
        """Close the sync backend this one was made with, if it owns it."""
        if self._owns:
            await anyio.to_thread.run_sync(self._backend.close)


_QUEUED: Final = Busy(None, queued=True)


def _task() -> object:
    """The running task (trio's or asyncio's): who waits in a line."""
    if sniffio.current_async_library() == "trio":
        import trio  # noqa: PLC0415

        return trio.lowlevel.current_task()
    return asyncio.current_task()
