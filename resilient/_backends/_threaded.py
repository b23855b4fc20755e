"""
An async backend that runs a sync backend's calls in worker threads.

For event loops a driver's own async client cannot serve (redis-py's and
psycopg's async clients are asyncio only, so trio uses this), and for
stores with no async client. Every call of the sync backend is bounded in
time by the backend itself, so a worker thread never outlives its call's
limit; a cancelled caller stops waiting at once and the call finishes (or
times out) on its own in the thread, its outcome unknown to the caller, as
with any request whose reply is lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import anyio.to_thread


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        Busy,
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
    `AsyncLockBackend` over a `LockBackend` (made for it, closed with it):
    one worker thread a call.
    """

    def __init__(self, backend: LockBackend) -> None:
        self._backend = backend
        self.scheme = backend.scheme
        self.max_renew_batch = backend.max_renew_batch

    def __repr__(self) -> str:
        return f"ThreadedAsyncBackend({self._backend!r})"

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        return await anyio.to_thread.run_sync(
            self._backend.acquire, key, owner, ttl, abandon_on_cancel=True
        )

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
        return self._backend.watch(key, notify)

    async def aclose(self) -> None:
        """Close the sync backend this one was made with (it owns it)."""
        await anyio.to_thread.run_sync(self._backend.close)
