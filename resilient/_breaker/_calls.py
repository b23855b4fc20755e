"""
The decorator's shells: one closure per guarded function, sync or async.

A closed breaker's call runs in the closure itself, with no call into the
breaker before or after it: the machine's `gate` (the closed epoch and its
inbox, one read) admits it, and a success that was not slow goes to the
inbox in one atomic append (see `_BreakerMachine.absorb`). Everything
else (failures, slow calls, a breaker that is not closed) goes through the
breaker's methods, under its lock, but for the common rejection (open,
within its interval: see `CircuitBreaker._rejection`). A rejection is
raised from the closure, so that its traceback has one frame of ours and
no frame holds it in a variable (no reference cycle for the garbage
collector).

A closed call holds nothing, so an asynchronous exception anywhere in it
leaves nothing behind: before its outcome is recorded the call is not
counted, after, counted once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from resilient._breaker._machine import _OPEN as OPEN
from resilient._breaker._now import DEFAULT, monotonic
from resilient._core import _clock
from resilient.exceptions import CircuitOpen


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._breaker._breaker import CircuitBreaker


INBOX_LIMIT: Final = 256
"""Successes an inbox holds before the one who fills it empties it."""


def sync_wrapper(  # noqa: C901 - the hot path, written out
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
            got, events = cb._admission()  # noqa: SLF001
            if events:
                cb._notify(events)  # noqa: SLF001
                if type(got) is CircuitOpen:  # A rejection that changed state.
                    raise got
            return cb._call(fn, args, kwargs, got)  # type: ignore[arg-type]  # noqa: SLF001
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
        inbox = gate[1]
        inbox.append(end)
        if len(inbox) >= INBOX_LIMIT:
            cb._absorb()  # noqa: SLF001
        return result

    return guarded


def async_wrapper(  # noqa: C901 - the hot path, written out
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
            got, events = cb._admission()  # noqa: SLF001
            if events:
                await cb._anotify(events)  # noqa: SLF001
                if type(got) is CircuitOpen:  # A rejection that changed state.
                    raise got
            return await cb._acall(fn, args, kwargs, got)  # type: ignore[arg-type]  # noqa: SLF001
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
        inbox = gate[1]
        inbox.append(end)
        if len(inbox) >= INBOX_LIMIT:
            cb._absorb()  # noqa: SLF001
        return result

    return guarded
