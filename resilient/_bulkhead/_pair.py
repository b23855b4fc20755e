"""
The pipeline's bare first attempt through a closed breaker and then a
bulkhead with a free slot, one frame each way.

A policy with both guards admits its first attempt through the breaker's
closed ticket and a slot of the bulkhead's machine (`Guards.bare`,
`resilient._pipeline._guards`). Called as two stages, each with its own
step on the machine (`BulkheadMachine.take_new`, then `release`), the
slot costs two Python frames, a tuple pairing the two tickets, and the
breaker's settle called with its ticket unpacked (``*ticket``); inside the
pipeline, whose own code already fills the processor's caches, each of
those costs more than the same step in a bare ``@bulkhead`` call. So
`BreakerBulkhead` does the machine's two steps inline, in its own admit
and settle, and the permit carries the breaker's ticket (no pair).

The inline steps are `BulkheadMachine.take_new` and the held case of
`BulkheadMachine.release`, written as those are (see the machine's
comment on grants): the weak reference made first, then the state and
the count stored with no call in between, then the reference added; on
release the state first, then the reference discarded and the queue
served. A permit lost before it reaches the pipeline (an exception after
the grant) gives its slot back once it is freed, as any permit.

The machine's lock is taken without ``with`` (its two bound methods and
its exit's argument tuple cost about as much again as the acquire and
the release): ``lock.acquire()`` is the first call inside a ``try``
whose ``finally`` releases it. CPython checks for an asynchronous
exception only once a call has returned, so none lands between the
``try`` and the acquire; one that lands later finds the lock held, and
the ``finally`` releases it. The lock is a `threading.RLock` for its
owner: a wait for it that a signal handler's exception cuts short (while
another thread holds it) leaves it unheld by this thread, and the release
then raises `RuntimeError`, which the ``finally`` ignores, where a plain
lock, which has no owner, would release the other thread's hold.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Final, final

from resilient._breaker import SUCCESS, attempt_outcome
from resilient._bulkhead._machine import (
    _HELD,
    _RELEASED,
    BulkheadPermit,
    _new_permit,
)
from resilient._core._done import DONE


if TYPE_CHECKING:
    from collections.abc import Awaitable

    from resilient._breaker import CircuitBreaker
    from resilient._bulkhead._shells import Bulkhead


_ref: Final = weakref.ref


@final
class BreakerBulkhead:
    """
    The `FastStage` of a breaker then a bulkhead: a closed ticket and a
    free slot, taken as one ticket (the permit, carrying the breaker's
    closed ticket), settled innermost first (the slot freed, then the
    attempt counted as `BreakerStage.fast_settle` counts it).

    Args:
        cb: The breaker.
        bulkhead: The bulkhead.
    """

    __slots__ = (
        "_admit",
        "_asettle_closed",
        "_bulkhead",
        "_cb",
        "_holders",
        "_lock",
        "_m",
        "_settle_closed",
        "_waiters",
    )

    def __init__(self, cb: CircuitBreaker, bulkhead: Bulkhead) -> None:
        self._cb = cb
        self._admit = cb.fast_admit
        self._settle_closed = cb._settle_closed  # noqa: SLF001
        self._asettle_closed = cb._asettle_closed  # noqa: SLF001
        self._bulkhead = bulkhead
        m = bulkhead._machine  # noqa: SLF001
        self._m = m
        # The machine's lock, queue and holders are made once, with it.
        self._lock = m._lock  # noqa: SLF001
        self._holders = m._holders  # noqa: SLF001
        self._waiters = m._waiters  # noqa: SLF001

    def fast_admit(self) -> BulkheadPermit | None:
        """A permit holding a free slot and the breaker's closed ticket,
        or None (the breaker is not closed, or no slot is free at once)."""
        ticket = self._admit()
        if ticket is None:
            return None
        permit = _new_permit(BulkheadPermit)
        permit._bulkhead = self._bulkhead  # noqa: SLF001
        permit._outer = ticket  # noqa: SLF001
        # The reference before the lock: nothing is allocated while it is
        # held (a collection could run a finalizer there).
        ref = _ref(permit)
        permit._ref = ref  # noqa: SLF001
        m = self._m
        holders = self._holders
        lock = self._lock
        try:
            lock.acquire()
            # `BulkheadMachine.take_new`, inline.
            if len(holders) < m._limit and not self._waiters:  # noqa: SLF001
                permit._state = _HELD  # noqa: SLF001
                m.acquired += 1
                holders.add(ref)
                return permit
        finally:
            try:
                lock.release()
            except RuntimeError:  # See the module's docstring.
                pass  # Not held: its acquire was interrupted.
        return None

    def fast_settle(
        self, permit: BulkheadPermit, exc: BaseException | None
    ) -> None:
        """Free the slot, then count the attempt (never its own timeout:
        a bare attempt has none)."""
        lock = self._lock
        try:
            lock.acquire()
            # `BulkheadMachine.release`, inline: a permit of this pair is
            # held or already released (never queued).
            if permit._state == _HELD:  # noqa: SLF001
                permit._state = _RELEASED  # noqa: SLF001
                self._holders.discard(permit._ref)  # noqa: SLF001
                if self._waiters:
                    self._m._serve()  # noqa: SLF001
        finally:
            try:
                lock.release()
            except RuntimeError:  # See the module's docstring.
                pass  # Not held: its acquire was interrupted.
        # The ticket's two fields as arguments: no ``*ticket`` (a call
        # that builds its arguments' tuple).
        ticket = permit._outer  # noqa: SLF001
        if exc is None:
            self._settle_closed(ticket[0], ticket[1], SUCCESS)  # type: ignore[index]
            return
        outcome = attempt_outcome(self._cb, exc, own_timeout=False)
        self._settle_closed(ticket[0], ticket[1], outcome, exc)  # type: ignore[index]

    def afast_settle(
        self, permit: BulkheadPermit, exc: BaseException | None
    ) -> Awaitable[None]:
        """Free the slot, then the breaker's settle to await, or `DONE`
        when cancelled (`BreakerStage.afast_settle`)."""
        lock = self._lock
        try:
            lock.acquire()
            # As in `fast_settle`.
            if permit._state == _HELD:  # noqa: SLF001
                permit._state = _RELEASED  # noqa: SLF001
                self._holders.discard(permit._ref)  # noqa: SLF001
                if self._waiters:
                    self._m._serve()  # noqa: SLF001
        finally:
            try:
                lock.release()
            except RuntimeError:  # See the module's docstring.
                pass  # Not held: its acquire was interrupted.
        ticket = permit._outer  # noqa: SLF001
        if exc is None:
            return self._asettle_closed(ticket[0], ticket[1], SUCCESS)  # type: ignore[index]
        outcome = attempt_outcome(self._cb, exc, own_timeout=False)
        if not isinstance(exc, Exception):
            self._settle_closed(ticket[0], ticket[1], outcome, exc)  # type: ignore[index]
            return DONE
        return self._asettle_closed(ticket[0], ticket[1], outcome, exc)  # type: ignore[index]

    def fast_drop(self, permit: BulkheadPermit) -> None:
        """Free the slot uncounted (nothing, once settled)."""
        self._m.release(permit)
