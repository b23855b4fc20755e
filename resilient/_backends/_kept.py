"""
A server backend's connection and its only strong reference (`Kept`),
and the count of a backend's open connections against its limit
(`Count`): shared by the Redis and PostgreSQL backends, which keep their
own connections out of their client libraries' pools.

How many calls may hold a connection at once is `Slots` (threads) or
`AsyncSlots` (one asyncio loop): a bounded pool, in which releases and
renewals have `RESERVED` connections acquirers never take.

A `Kept` is held by the backend's idle list or by the one call using it.
It is closed by that owner, or else when the last reference to it goes
(`__del__`): an interrupt that lands between an ``idle.pop()`` and the
``try`` that owns what it returned drops the popped value from the stack,
and CPython frees it there and then (a `Kept` is in no reference cycle,
where redis-py's connections are). So a connection is idle, in use, or
closed and uncounted; never lost, never left to the client library's
finaliser (psycopg's warns), never held after its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from typing import Any, ClassVar, Final


__all__ = [
    "DEFAULT_MAX",
    "RESERVED",
    "AsyncSlots",
    "Count",
    "Kept",
    "Slot",
    "Slots",
    "fresh_after_fork",
]


class Count:
    """
    The connections a backend has open, against its *limit*. Updated by
    plain ``+=``/``-=`` statements, which have no call or backward jump:
    CPython checks for a signal, an asynchronous exception or a thread
    switch at neither, so no update is ever half done or lost to another
    thread.
    """

    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0


class Kept:
    """
    One connection, and the place it takes in *count* (if the backend
    counts them). `shut` names the connection's method that closes it.
    """

    __slots__ = ("conn", "count")

    shut: ClassVar[str] = "close"

    def __init__(self, conn: Any, count: Count | None = None) -> None:
        # No call between the count and the assignment that `close` reads:
        # an interrupt lands before both (at this method's start) or after.
        self.count = count
        if count is not None:
            count.open += 1
        self.conn = conn

    def close(self) -> None:
        """Close the connection and give its place back, once."""
        conn, self.conn = self.conn, None  # Taken with no call: atomic.
        if conn is None:
            return
        count = self.count
        if count is not None:
            count.open -= 1
        try:
            getattr(conn, self.shut)()
        except BaseException:
            # An interrupt stopped the first one at its start or midway.
            getattr(conn, self.shut)()
            raise

    def __del__(self) -> None:
        # Not contextlib.suppress: a finaliser makes as few calls as it can.
        try:  # noqa: SIM105
            self.close()
        except Exception:  # noqa: BLE001, S110 - at exit, or half made
            pass


#: Connections of a pool that only releases and renewals may use: a
#: release never waits behind acquirers (with a pool of at least two).
RESERVED: Final = 1

#: Connections a server store opens per process (sync) or event loop
#: (async) and URL, when the URL does not say (``max_connections``).
DEFAULT_MAX: Final = 10


class Slot:
    """
    One call's place among its pool's busy connections. The pool counts
    the places of live slots that are `held` (through weak references with
    no callback), so a place is given back by the call's ``finally``
    (`give`) or, if an interrupt skipped that, when the call's frame drops
    the slot: no finaliser runs, no count can be left wrong.
    """

    __slots__ = ("__weakref__", "held", "pool")

    def __init__(self, pool: Slots | AsyncSlots) -> None:
        self.pool = pool
        self.held = False

    def give(self) -> None:
        """Give the place back (once: a second call does nothing)."""
        if self.held:
            self.held = False
            self.pool.freed()


#: How often a waiter for a place looks again when nobody tells it (a
#: place freed by a dropped slot tells nobody).
LOOK_AGAIN: Final = 0.05


class _Places:
    """The held slots of a pool, by weak reference, and its caps."""

    __slots__ = ("_held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: list[weakref.ref[Slot]] = []

    @property
    def busy(self) -> int:
        """Places held by live slots (the dead and given are dropped)."""
        held = [r for r in self._held if (s := r()) is not None and s.held]
        self._held = held
        return len(held)

    def _cap(self, urgent: bool) -> int:
        return self.limit if urgent else max(self.limit - RESERVED, 1)

    def _hold(self, slot: Slot) -> None:
        slot.held = True
        self._held.append(weakref.ref(slot))


class Slots(_Places):
    """
    The bound of a sync pool: at most `limit` calls hold a connection at
    once (so at most `limit` connections are open: a call makes one only
    when none is idle), of which acquirers (`urgent` False) take at most
    ``limit - RESERVED``; the others wait, within their call's limit.
    """

    __slots__ = ("_cond",)

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._cond = threading.Condition(threading.Lock())

    def take(self, slot: Slot, seconds: float, *, urgent: bool) -> bool:
        """Wait up to *seconds* for a place; False if none came."""
        cap = self._cap(urgent)
        deadline = time.monotonic() + max(seconds, 0.0)
        with self._cond:
            while self.busy >= cap:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, LOOK_AGAIN))
            self._hold(slot)
            return True

    def freed(self) -> None:
        """A place was given back: wake the waiters."""
        with self._cond:
            self._cond.notify_all()


class AsyncSlots(_Places):
    """`Slots` for the calls of one asyncio event loop: urgent waiters
    (releases, renewals) go ahead of acquirers."""

    __slots__ = ("_freed", "_urgent")

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._urgent = 0
        self._freed: asyncio.Event | None = None

    async def take(self, slot: Slot, *, urgent: bool) -> None:
        """Wait for a place (the caller bounds the wait in time)."""
        cap = self._cap(urgent)
        while self.busy >= cap or (self._urgent and not urgent):
            freed = self._freed
            if freed is None:
                freed = self._freed = asyncio.Event()
            self._urgent += urgent
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), LOOK_AGAIN)
            finally:
                self._urgent -= urgent
        self._hold(slot)

    def freed(self) -> None:
        """A place was given back: wake the waiters."""
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()


# Backends whose bound starts afresh in a forked child: the parent's calls
# in flight at the fork hold places the child would never get back.
_OWNERS: Final[weakref.WeakSet[Any]] = weakref.WeakSet()


def fresh_after_fork(backend: Any) -> None:
    """Give *backend*'s ``_slots`` a fresh bound in a forked child."""
    _OWNERS.add(backend)


def _after_fork_in_child() -> None:  # pragma: no cover - in a forked child
    for backend in list(_OWNERS):
        slots = backend._slots  # noqa: SLF001
        backend._slots = type(slots)(slots.limit)  # noqa: SLF001


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
