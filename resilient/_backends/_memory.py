"""
``memory://``: leases in this process's memory, for tests and one process.

The same semantics as every other backend (the contract tests run on it),
with expiry on resilient's clock, so a `resilient.testing.FakeClock` moves
it. ``memory://`` is one store per process; ``memory://<name>`` gives
separate stores.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Final, final

from resilient._backends._base import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
)
from resilient._core import _clock


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


EXTRA: Final = None


@final
class _Lease:
    __slots__ = ("expires", "fence", "owner")

    def __init__(self, owner: OwnerToken, fence: int, expires: float) -> None:
        self.owner = owner
        self.fence = fence
        self.expires = expires


@final
class MemoryStore:
    """
    The store behind one ``memory://`` URL: a dict of live leases under a
    lock, the fence floor, and the watchers.
    """

    scheme: Final = "memory"
    max_renew_batch: Final = 1 << 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[bytes, _Lease] = {}
        self._floor = 0
        self._watchers: dict[bytes, list[Callable[[], None]]] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore {len(self._leases)} leases>"

    def _drop(self, digest: bytes, lease: _Lease) -> None:
        """Delete a row, folding its fence into the floor."""
        del self._leases[digest]
        self._floor = max(self._floor, lease.fence)

    def _sweep(self, now: float) -> None:
        """Delete expired rows so storage stays bounded by live leases."""
        for digest, lease in list(self._leases.items()):
            if lease.expires <= now:
                self._drop(digest, lease)

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        now = _clock.get_clock().now()
        with self._lock:
            lease = self._leases.get(key.digest)
            if lease is not None and lease.expires > now:  # noqa: SIM102
                if lease.owner != owner:
                    return Busy(expires_in=lease.expires - now)
            if len(self._leases) > 64 and lease is None:
                self._sweep(now)
            wall = time.time_ns() // 1000
            fence = max(
                self._floor + 1,
                wall,
                0 if lease is None else lease.fence + 1,
            )
            self._leases[key.digest] = _Lease(owner, fence, now + ttl)
        return Grant(fence=fence, ttl=ttl)

    def renew(self, batch: Sequence[Renewal]) -> list[bool]:
        """See `LockBackend.renew`."""
        now = _clock.get_clock().now()
        done = []
        with self._lock:
            for item in batch:
                lease = self._leases.get(item.key.digest)
                ok = (
                    lease is not None
                    and lease.expires > now
                    and lease.owner == item.owner
                )
                if ok:
                    lease.expires = now + item.ttl  # type: ignore[union-attr]
                done.append(ok)
        return done

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        now = _clock.get_clock().now()
        with self._lock:
            lease = self._leases.get(key.digest)
            if lease is None or lease.owner != owner:
                return ReleaseResult.NOT_HELD
            self._drop(key.digest, lease)
            expired = lease.expires <= now
            watchers = list(self._watchers.get(key.digest, ()))
        for notify in watchers:
            notify()
        return ReleaseResult.NOT_HELD if expired else ReleaseResult.RELEASED

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """See `LockBackend.watch`: released leases notify at once."""
        with self._lock:
            self._watchers.setdefault(key.digest, []).append(notify)

        def stop() -> None:
            with self._lock:
                watchers = self._watchers.get(key.digest)
                if watchers is not None and notify in watchers:
                    watchers.remove(notify)
                    if not watchers:
                        del self._watchers[key.digest]

        return stop

    def delete(self, key: LockKey) -> bool:
        """
        Delete *key*'s lease whoever holds it (tests: a lease lost behind
        its holder's back); whether there was one.
        """
        with self._lock:
            lease = self._leases.get(key.digest)
            if lease is None:
                return False
            self._drop(key.digest, lease)
            return True

    def rows(self) -> int:
        """How many lease rows the store keeps (tests: bounded storage)."""
        with self._lock:
            return len(self._leases)

    def close(self) -> None:
        """Nothing to let go of."""


@final
class AsyncMemoryStore:
    """The async twin: the same store, called inline (it never blocks)."""

    scheme: Final = "memory"
    max_renew_batch: Final = MemoryStore.max_renew_batch

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<AsyncMemoryStore {len(self.store._leases)} leases>"  # noqa: SLF001

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        return self.store.acquire(key, owner, ttl)

    async def renew(self, batch: Sequence[Renewal]) -> list[bool]:
        """See `LockBackend.renew`."""
        return self.store.renew(batch)

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        return self.store.release(key, owner)

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """See `LockBackend.watch`."""
        return self.store.watch(key, notify)

    async def aclose(self) -> None:
        """Nothing to let go of."""


_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def store(url: str) -> MemoryStore:
    """The one store of *url* in this process."""
    with _STORES_LOCK:
        found = _STORES.get(url)
        if found is None:
            found = _STORES[url] = MemoryStore()
        return found


def sync_backend(url: str) -> MemoryStore:
    """The sync backend of *url*."""
    return store(url)


def async_backend(url: str) -> AsyncMemoryStore:
    """The async backend of *url*: the same store."""
    return AsyncMemoryStore(store(url))
