"""
The decorator's shells: one closure per guarded function, sync or async.

A closed breaker's call runs in the closure itself, with no call into the
breaker before or after it: the machine's `gate` (the closed epoch and its
inbox, one read) admits it, and a success that was not slow goes to the
inbox in one atomic append when the machine's `free_until` says it cannot
open the breaker (see `_BreakerMachine._free_inbox`). Everything
else (failures, slow calls, a breaker that is not closed) goes through the
breaker's methods, under its lock, but for the common rejection (open,
within its interval: see `CircuitBreaker._rejection`). A rejection is
raised from the closure, so that its traceback has one frame of ours and
no frame holds it in a variable (no reference cycle for the garbage
collector).

A closed call holds nothing, so an asynchronous exception anywhere in it
leaves nothing behind: before its outcome is recorded the call is not
counted, after, counted once.

The two shells are twins on purpose. What they share is the hot path
itself (the gate, the plain rejection, the timing, the inbox), and the
``await`` of the guarded call stands in its middle: a helper for the
parts before and after it would add a Python call (or two) to every
guarded call. What is not hot is not twinned: a breaker
that is not closed and does not simply reject goes to
`CircuitBreaker._call` / ``_acall`` (admission under the lock, the
listeners, the permit's settling), and the rare slow or failed call to the
breaker's methods. ``_call`` and ``_acall`` live here too (`call`,
`acall`), bound in the breaker's class body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from resilient._breaker._now import DEFAULT, monotonic
from resilient._breaker._records import _OPEN as OPEN
from resilient._breaker._records import SUCCESS, UNCOUNTED
from resilient._core import _clock


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._breaker._breaker import CircuitBreaker
    from resilient._breaker._records import BreakerPermit


INBOX_LIMIT: Final = 256
"""Successes an inbox holds before the one who fills it empties it."""


def sync_wrapper(
    cb: CircuitBreaker, fn: Callable[..., Any]
) -> Callable[..., Any]:
    """The sync function *fn* guarded by *cb*."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        m = cb._m  # noqa: SLF001
        gate = m.gate
        if gate is None:
            c = _clock._clock  # noqa: SLF001
            t = monotonic() if c is DEFAULT else c.now()
            if (
                m.state is OPEN
                and m.enforcing
                and cb._pinned  # noqa: SLF001 - else heal it (slow path)
                and m.opened_at <= t < m.open_until
            ):
                raise cb._rejection(m, t)  # noqa: SLF001
            # Not closed, no plain rejection: admission under the lock.
            return cb._call(fn, args, kwargs)  # noqa: SLF001
        if m.timed:
            c = _clock._clock  # noqa: SLF001
            start = monotonic() if c is DEFAULT else c.now()
        else:
            start = 0.0
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            cb._failed(gate[0], start, 0, None, exc)  # noqa: SLF001
            raise
        if m.stamped:
            c = _clock._clock  # noqa: SLF001
            end = monotonic() if c is DEFAULT else c.now()
            if end - start >= m.slow:
                cb._settle_closed(gate[0], start, 0)  # noqa: SLF001
                return result
        else:
            end = 0.0
        if end >= m.free_until:  # It may open the breaker: the lock.
            cb._settle_closed(gate[0], start, 0)  # noqa: SLF001
            return result
        inbox = gate[1]
        inbox.append(end)
        if len(inbox) >= INBOX_LIMIT:
            cb._absorb()  # noqa: SLF001
        return result

    return guarded


def async_wrapper(
    cb: CircuitBreaker, fn: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    """The coroutine function *fn* guarded by *cb*."""

    async def guarded(*args: Any, **kwargs: Any) -> Any:
        m = cb._m  # noqa: SLF001
        gate = m.gate
        if gate is None:
            c = _clock._clock  # noqa: SLF001
            t = monotonic() if c is DEFAULT else c.now()
            if (
                m.state is OPEN
                and m.enforcing
                and cb._pinned  # noqa: SLF001 - else heal it (slow path)
                and m.opened_at <= t < m.open_until
            ):
                raise cb._rejection(m, t)  # noqa: SLF001
            # Not closed, no plain rejection: admission under the lock.
            return await cb._acall(fn, args, kwargs)  # noqa: SLF001
        if m.timed:
            c = _clock._clock  # noqa: SLF001
            start = monotonic() if c is DEFAULT else c.now()
        else:
            start = 0.0
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            await cb._afailed(gate[0], start, 0, None, exc)  # noqa: SLF001
            raise
        if m.stamped:
            c = _clock._clock  # noqa: SLF001
            end = monotonic() if c is DEFAULT else c.now()
            if end - start >= m.slow:
                await cb._asettle_closed(gate[0], start, 0)  # noqa: SLF001
                return result
        else:
            end = 0.0
        if end >= m.free_until:  # It may open the breaker: the lock.
            await cb._asettle_closed(gate[0], start, 0)  # noqa: SLF001
            return result
        inbox = gate[1]
        inbox.append(end)
        if len(inbox) >= INBOX_LIMIT:
            cb._absorb()  # noqa: SLF001
        return result

    return guarded


def call(
    self: CircuitBreaker,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    permit: BreakerPermit | None = None,
) -> Any:
    """One call under *permit* (taken here when None)."""
    if permit is None:
        permit = self.acquire()
    if permit.epoch == UNCOUNTED:
        return fn(*args, **kwargs)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        self._failed(permit.epoch, permit.start, permit.probe, permit, exc)
        raise
    self._settle(permit, SUCCESS)
    return result


async def acall(
    self: CircuitBreaker,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    permit: BreakerPermit | None = None,
) -> Any:
    """`_call` from async code."""
    if permit is None:
        permit = await self.aacquire()
    if permit.epoch == UNCOUNTED:
        return await fn(*args, **kwargs)
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        await self._afailed(
            permit.epoch, permit.start, permit.probe, permit, exc
        )
        raise
    await self._asettle(permit, SUCCESS)
    return result
