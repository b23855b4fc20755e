"""
The lock backend contract, as a reusable suite.

Every backend must pass it. A test module subclasses `BackendContract` and
provides three fixtures:

* ``lock_backend_url``: the URL of a fresh, namespaced store;
* ``delete_lease``: a function ``(url, key) -> None`` that deletes a lease
  behind its holder's back (a lease lost to an operator, a flush, a
  failover);
* ``count_rows``: a function ``(url) -> int`` counting the lease rows or
  keys the store keeps (for the bounded-storage test), or None to skip it.

Set the class attribute ``watches = False`` for a store whose ``watch``
cannot tell when a lease is freed, and ``kept_rows`` to the most rows of
released leases a store keeps before it sweeps them (0: a release deletes).
Real time, short TTLs: every test ends within a fraction of a second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
    async_backend,
    open_backend,
)


#: A TTL short enough to wait out in a test, long enough to outlast a
#: loaded machine's scheduling delays between two calls.
SHORT_TTL = 0.2


def fresh_key(prefix: str = "contract") -> LockKey:
    """A lock name no other test uses."""
    return LockKey.of(f"{prefix}-{uuid.uuid4()}")


def acquire_soon(
    backend: Any, key: LockKey, owner: OwnerToken, ttl: float
) -> Grant | Busy:
    """
    Acquire a lease that is free, allowing the store a short moment (it
    may keep a just-freed lease for a waiter it is waking: the embedded
    store does for up to 50 ms): retries while told to look again within
    100 ms, for up to a second.
    """
    end = time.monotonic() + 1.0
    while True:
        answer = backend.acquire(key, owner, ttl)
        if (
            isinstance(answer, Grant)
            or answer.expires_in is None
            or answer.expires_in > 0.1
            or time.monotonic() > end
        ):
            return answer
        time.sleep(0.005)


def settle_watch(woken: threading.Event) -> None:
    """Let a new watch start (it may wake its watcher once, spuriously, as
    it begins to listen), then forget that wake-up."""
    woken.wait(0.2)
    woken.clear()


class BackendContract:
    """What every lock backend does; subclass and give the fixtures."""

    watches = True
    kept_rows = 0

    # -- acquire ------------------------------------------------------------

    def test_grants_a_free_lock_and_refuses_another_owner(
        self, lock_backend_url: str
    ) -> None:
        """A free lock is granted; while held, another owner gets Busy with
        the holder's remaining TTL."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        grant = backend.acquire(key, OwnerToken(), 10.0)
        assert isinstance(grant, Grant)
        assert grant.ttl >= 10.0
        busy = backend.acquire(key, OwnerToken(), 10.0)
        assert isinstance(busy, Busy)
        assert busy.expires_in is None or 0 < busy.expires_in <= 10.0

    def test_fence_rises_on_every_grant(self, lock_backend_url: str) -> None:
        """The fencing token rises strictly on every grant of a name: after a
        release (the row is gone), after an expiry and on a re-grant."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        fences = []
        for _ in range(5):
            owner = OwnerToken()
            grant = backend.acquire(key, owner, 10.0)
            assert isinstance(grant, Grant)
            fences.append(grant.fence)
            assert backend.release(key, owner) is ReleaseResult.RELEASED
        owner = OwnerToken()
        grant = backend.acquire(key, owner, SHORT_TTL)
        assert isinstance(grant, Grant)
        fences.append(grant.fence)
        time.sleep(SHORT_TTL * 1.5)
        taken = backend.acquire(key, OwnerToken(), 10.0)
        assert isinstance(taken, Grant)
        fences.append(taken.fence)
        assert fences == sorted(set(fences))
        assert all(isinstance(f, int) for f in fences)

    def test_fence_never_repeats_across_names_sharing_a_store(
        self, lock_backend_url: str
    ) -> None:
        """Deleting one name's row never lets another name's next fence fall
        below what the first had (the floor is per store)."""
        backend = open_backend(lock_backend_url)
        a, b = fresh_key("a"), fresh_key("b")
        last = 0
        for key in (a, b, a, b):
            owner = OwnerToken()
            grant = backend.acquire(key, owner, 10.0)
            assert isinstance(grant, Grant)
            assert grant.fence > last
            last = grant.fence
            backend.release(key, owner)

    def test_the_holder_acquiring_again_is_granted(
        self, lock_backend_url: str
    ) -> None:
        """An acquire by the owner that holds the lease (a retry after a lost
        reply) is granted again with a token at least the first."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        first = backend.acquire(key, owner, 10.0)
        again = backend.acquire(key, owner, 10.0)
        assert isinstance(first, Grant)
        assert isinstance(again, Grant)
        assert again.fence >= first.fence

    def test_an_expired_lease_is_granted_to_the_next(
        self, lock_backend_url: str
    ) -> None:
        """Once the holder's TTL has passed without renewal, the next owner is
        granted the lock."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        assert isinstance(backend.acquire(key, OwnerToken(), SHORT_TTL), Grant)
        time.sleep(SHORT_TTL * 1.5)
        assert isinstance(backend.acquire(key, OwnerToken(), 10.0), Grant)

    def test_names_are_independent(self, lock_backend_url: str) -> None:
        """Distinct names, even NFC and NFD spellings of one text or names
        with glob and SQL characters, never block each other."""
        backend = open_backend(lock_backend_url)
        tag = uuid.uuid4().hex
        names = [
            f"\u00e9t\u00e9-{tag}",
            f"e\u0301te\u0301-{tag}",
            f"*-{tag}",
            f"%'; DROP TABLE leases; --{tag}",
            f"{{{tag}}}",
            f"../../{tag}",
        ]
        for name in names:
            grant = backend.acquire(LockKey.of(name), OwnerToken(), 10.0)
            assert isinstance(grant, Grant), name

    # -- renew ------------------------------------------------------------

    def test_renew_is_a_compare_and_set_on_the_owner(
        self, lock_backend_url: str
    ) -> None:
        """Renewal extends our lease and answers per request, in order: not a
        lease of another owner, nor one released."""
        backend = open_backend(lock_backend_url)
        mine, theirs, gone = fresh_key(), fresh_key(), fresh_key()
        me, them = OwnerToken(), OwnerToken()
        backend.acquire(mine, me, SHORT_TTL)
        backend.acquire(theirs, them, 10.0)
        backend.acquire(gone, me, 10.0)
        backend.release(gone, me)
        result = backend.renew(
            [
                Renewal(mine, me, 10.0),
                Renewal(theirs, me, 10.0),
                Renewal(gone, me, 10.0),
            ]
        )
        assert list(result) == [True, False, False]
        time.sleep(SHORT_TTL * 1.5)
        # Renewed to 10 s: still ours past the first TTL.
        assert isinstance(backend.acquire(mine, OwnerToken(), 10.0), Busy)

    def test_an_expired_lease_is_not_renewed(
        self, lock_backend_url: str
    ) -> None:
        """A lease whose TTL ran out on the store cannot be renewed back."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        backend.acquire(key, owner, SHORT_TTL)
        time.sleep(SHORT_TTL * 1.5)
        assert list(backend.renew([Renewal(key, owner, 10.0)])) == [False]

    def test_many_leases_renew_in_one_call(
        self, lock_backend_url: str
    ) -> None:
        """A batch as large as the backend's ``max_renew_batch`` (capped at
        200 here) renews every lease in one call."""
        backend = open_backend(lock_backend_url)
        owner = OwnerToken()
        keys = [fresh_key() for _ in range(min(backend.max_renew_batch, 200))]
        for key in keys:
            backend.acquire(key, owner, 10.0)
        result = backend.renew([Renewal(k, owner, 10.0) for k in keys])
        assert list(result) == [True] * len(keys)

    # -- release ------------------------------------------------------------

    def test_release_is_a_compare_and_delete(
        self, lock_backend_url: str
    ) -> None:
        """Only the owner releases; a second release is harmless and says
        the lease is not held."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        backend.acquire(key, owner, 10.0)
        assert backend.release(key, OwnerToken()) is ReleaseResult.NOT_HELD
        assert isinstance(backend.acquire(key, OwnerToken(), 10.0), Busy)
        assert backend.release(key, owner) is ReleaseResult.RELEASED
        assert backend.release(key, owner) is ReleaseResult.NOT_HELD
        assert isinstance(backend.acquire(key, OwnerToken(), 10.0), Grant)

    def test_a_released_lease_cannot_be_taken_back_by_its_old_owner(
        self, lock_backend_url: str
    ) -> None:
        """After another owner took an expired lease, the old owner's
        release does not free it."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        old, new = OwnerToken(), OwnerToken()
        backend.acquire(key, old, SHORT_TTL)
        time.sleep(SHORT_TTL * 1.5)
        assert isinstance(backend.acquire(key, new, 10.0), Grant)
        assert backend.release(key, old) is ReleaseResult.NOT_HELD
        assert isinstance(backend.acquire(key, OwnerToken(), 10.0), Busy)

    def test_a_lease_deleted_behind_its_back_is_not_renewed(
        self,
        lock_backend_url: str,
        delete_lease: Callable[[str, LockKey], None],
    ) -> None:
        """When the store loses a lease (deleted by someone else), renewal
        says so and the next owner gets a higher fence."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        first = backend.acquire(key, owner, 10.0)
        delete_lease(lock_backend_url, key)
        assert list(backend.renew([Renewal(key, owner, 10.0)])) == [False]
        second = acquire_soon(backend, key, OwnerToken(), 10.0)
        assert isinstance(first, Grant)
        assert isinstance(second, Grant)
        assert second.fence > first.fence

    def test_the_release_of_a_lease_deleted_behind_its_back_is_not_held(
        self,
        lock_backend_url: str,
        delete_lease: Callable[[str, LockKey], None],
    ) -> None:
        """A release whose lease the store lost (deleted by someone else)
        answers NOT_HELD, never RELEASED: it is how leaving a block finds a
        loss no renewal saw (the shells raise `LockLost` on it)."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        assert isinstance(backend.acquire(key, owner, 10.0), Grant)
        delete_lease(lock_backend_url, key)
        assert backend.release(key, owner) is ReleaseResult.NOT_HELD

    # -- watch ------------------------------------------------------------

    def test_watch_wakes_on_release(self, lock_backend_url: str) -> None:
        """A watcher is told when the holder releases (after at most one
        spurious wake-up as the watch starts, which the protocol allows),
        not while the lease is held, and not after it stops watching."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        backend.acquire(key, owner, 10.0)
        woken = threading.Event()
        stop = backend.watch(key, woken.set)
        try:
            if not self.watches:
                pytest.skip("this store cannot tell when a lease is freed")
            settle_watch(woken)
            assert not woken.wait(0.05)
            assert backend.release(key, owner) is ReleaseResult.RELEASED
            assert woken.wait(5.0)
        finally:
            stop()
        woken.clear()
        again = OwnerToken()
        assert isinstance(acquire_soon(backend, key, again, 10.0), Grant)
        assert backend.release(key, again) is ReleaseResult.RELEASED
        assert not woken.wait(0.1)

    def test_watchers_of_one_lock_first_wakes_and_others_do_not(
        self, lock_backend_url: str
    ) -> None:
        """The first watcher of a released lock is told (threads of one
        process share the store's wake-ups; a store may wake the others
        only in turn, as the server stores do); a watcher of another lock
        is not."""
        backend = open_backend(lock_backend_url)
        key, other = fresh_key(), fresh_key()
        owner = OwnerToken()
        backend.acquire(key, owner, 10.0)
        backend.acquire(other, OwnerToken(), 10.0)
        events = [threading.Event() for _ in range(3)]
        unrelated = threading.Event()
        stops = [backend.watch(key, e.set) for e in events]
        stops.append(backend.watch(other, unrelated.set))
        try:
            if not self.watches:
                pytest.skip("this store cannot tell when a lease is freed")
            for event in (*events, unrelated):
                settle_watch(event)
            assert backend.release(key, owner) is ReleaseResult.RELEASED
            assert events[0].wait(5.0)
            assert not unrelated.wait(0.1)
        finally:
            for stop in stops:
                stop()

    @pytest.mark.parametrize("library", ["asyncio", "trio"])
    def test_async_watch_wakes_a_waiting_task(
        self, lock_backend_url: str, library: str
    ) -> None:
        """The async twin's watch wakes a task waiting on an event (the
        notify comes from another thread) when the lease is released."""

        async def main() -> bool:
            from resilient._core._loops import loop_caller
            from resilient._lock._lock import _loop_token

            backend = async_backend(lock_backend_url, _loop_token(library))
            key, owner = fresh_key(), OwnerToken()
            await backend.acquire(key, owner, 10.0)
            call = loop_caller(library)
            woken = anyio.Event()
            stop = backend.watch(key, lambda: call(woken.set))
            try:
                await anyio.sleep(0.2)  # the watch's start may wake it once
                woken = anyio.Event()
                with anyio.move_on_after(0.05):
                    await woken.wait()
                assert not woken.is_set()
                await backend.release(key, owner)
                with anyio.move_on_after(5.0):
                    await woken.wait()
                return woken.is_set()
            finally:
                stop()
                await backend.aclose()

        if not self.watches:
            pytest.skip("this store cannot tell when a lease is freed")
        assert anyio.run(main, backend=library)

    # -- storage ------------------------------------------------------------

    def test_storage_stays_bounded(
        self, lock_backend_url: str, count_rows: Callable[[str], int] | None
    ) -> None:
        """Released leases leave (almost) nothing behind: 300 names, or
        three times the rows the store may keep, acquired and released add
        no more than ``kept_rows`` rows (no counter per name kept for
        ever)."""
        if count_rows is None:
            pytest.skip("no row count for this store")
        backend = open_backend(lock_backend_url)
        before = count_rows(lock_backend_url)
        for _ in range(max(300, 3 * self.kept_rows)):
            key, owner = fresh_key(), OwnerToken()
            backend.acquire(key, owner, 10.0)
            backend.release(key, owner)
        assert count_rows(lock_backend_url) <= before + self.kept_rows

    # -- secrecy ------------------------------------------------------------

    def test_records_never_show_the_owner_token(
        self, lock_backend_url: str
    ) -> None:
        """No repr of the backend or its records shows the owner token."""
        backend = open_backend(lock_backend_url)
        key = fresh_key()
        owner = OwnerToken()
        shown = [
            repr(backend),
            repr(backend.acquire(key, owner, 10.0)),
            repr(Renewal(key, owner, 1.0)),
            repr(owner),
            str(owner),
            repr(backend.release(key, owner)),
        ]
        for text in shown:
            assert owner.hex not in text
            assert repr(owner.secret) not in text

    # -- the async twin ----------------------------------------------------

    @pytest.mark.parametrize("library", ["asyncio", "trio"])
    def test_async_twin_keeps_the_contract(
        self, lock_backend_url: str, library: str
    ) -> None:
        """The async backend grants, refuses, renews, mints rising fences and
        releases like the sync one, on asyncio and trio."""

        async def main() -> list[Any]:
            from resilient._lock._lock import _loop_token

            backend = async_backend(lock_backend_url, _loop_token(library))
            key = fresh_key()
            owner = OwnerToken()
            first = await backend.acquire(key, owner, 10.0)
            busy = await backend.acquire(key, OwnerToken(), 10.0)
            renewed = await backend.renew([Renewal(key, owner, 10.0)])
            released = await backend.release(key, owner)
            again = await backend.release(key, owner)
            second = await backend.acquire(key, OwnerToken(), 10.0)
            await backend.aclose()
            return [first, busy, list(renewed), released, again, second]

        first, busy, renewed, released, again, second = anyio.run(
            main, backend=library
        )
        assert isinstance(first, Grant)
        assert isinstance(busy, Busy)
        assert renewed == [True]
        assert released is ReleaseResult.RELEASED
        assert again is ReleaseResult.NOT_HELD
        assert isinstance(second, Grant)
        assert second.fence > first.fence
