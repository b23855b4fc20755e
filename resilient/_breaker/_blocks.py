"""
How ``with`` and ``async with`` blocks keep their breaker permits.

Each block keeps its permit on an object of its own, a cell the block's
``__exit__`` is bound to (see `ExitSlot`), so that an exception landing
anywhere in ``__exit__``, even at its first instruction, leaves nothing
behind for a later block to mistake for its own, and so that no name costs
the thread's context an entry. Blocks entered by calling ``__enter__`` by
hand fall back to one module-level context variable holding a stack of
(breaker, permit) entries, one key for every breaker.
"""

from __future__ import annotations

import contextvars
import threading
import types
import weakref
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

from resilient._breaker._calls import INBOX_LIMIT
from resilient._breaker._now import DEFAULT, monotonic, now
from resilient._breaker._records import SUCCESS, BreakerPermit
from resilient._core import _clock


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._breaker._breaker import CircuitBreaker


_Stack: TypeAlias = "tuple[CircuitBreaker, BreakerPermit, _Stack] | None"

_ENTERED: Final[contextvars.ContextVar[_Stack]] = contextvars.ContextVar(
    "resilient_breaker_entered", default=None
)
"""Permits entered by calling ``__enter__`` by hand, innermost first."""


class _Pending(threading.local):
    """Per thread: the exit a ``with`` statement just looked up, weakly."""

    exit: weakref.ref[types.MethodType] | None = None


_pending: Final = _Pending()


@final
class ExitSlot(property):
    """
    ``CircuitBreaker.__exit__`` (and ``__aexit__``): each lookup on a
    breaker makes a fresh cell, ``[breaker, permit]``, and returns the exit
    bound to it.

    A ``with`` statement looks ``__exit__`` up before it calls
    ``__enter__``, with no other code of ours in between, and keeps the
    bound exit on its frame until the block ends: `take_cell` gives
    ``__enter__`` the cell that was just made (found through a weak
    reference, so a stale one is never taken) to put its permit in. So each
    block settles its own permit, and a block whose exit never ran leaves
    nothing behind: its cell goes with it, and a probe's slot with the
    permit.

    A property, so that the lookup runs in C up to the one function that
    makes the cell. Looked up on the class (`contextlib.ExitStack` does),
    it is the exit itself, called ``(breaker, exc_type, exc, tb)``: the
    permit was then kept in the context's stack.
    """

    def __init__(self, exit_: Callable[..., Any]) -> None:
        def bind(cb: CircuitBreaker) -> Callable[..., Any]:
            bound = types.MethodType(exit_, [cb, None])
            _pending.exit = weakref.ref(bound)
            return bound

        super().__init__(bind)
        self._exit = exit_

    def __call__(self, cb: CircuitBreaker, *args: Any) -> Any:
        """The exit looked up on the class, called with its breaker."""
        return self._exit([cb, None], *args)


def take_cell(cb: CircuitBreaker) -> list[Any] | None:
    """
    The cell the ``with`` statement entering *cb* just made; None when
    ``__enter__`` was called by hand (the last exit looked up is gone, or
    is not for *cb*, or has a permit already).
    """
    ref = _pending.exit
    _pending.exit = None
    bound = None if ref is None else ref()
    if bound is None:
        return None
    cell: list[Any] = bound.__self__  # type: ignore[assignment]
    if cell[1] is not None:
        return None
    owner = cell[0]
    if owner is None:  # Looked up on the class (contextlib.ExitStack).
        cell[0] = cb
    elif owner is not cb:
        return None
    return cell


_new_permit: Final = BreakerPermit.__new__


def closed_permit(
    cb: CircuitBreaker, epoch: int, start: float
) -> BreakerPermit:
    """A closed call's permit, made without running ``__init__``."""
    permit = _new_permit(BreakerPermit)
    permit._breaker = cb  # noqa: SLF001
    permit._done = False  # noqa: SLF001
    permit.epoch = epoch
    permit.start = start
    permit.probe = 0
    return permit


def enter_block(cb: CircuitBreaker) -> BreakerPermit:
    """
    ``CircuitBreaker.__enter__``: admit, and keep the permit in the cell
    the ``with`` statement just made (`take_cell` and `closed_permit`,
    written out: this is the block form's hot path).
    """
    ref = _pending.exit
    _pending.exit = None
    cell: list[Any] | None = None
    if ref is not None:
        bound = ref()
        if bound is not None:
            cell = bound.__self__  # type: ignore[assignment]
            owner = cell[0]  # type: ignore[index]
            if cell[1] is not None or (owner is not None and owner is not cb):  # type: ignore[index]
                cell = None
            elif owner is None:  # Looked up on the class (ExitStack).
                cell[0] = cb  # type: ignore[index]
    m = cb._m  # noqa: SLF001
    gate = m.gate
    if gate is None:
        permit = cb.acquire()
    else:
        permit = _new_permit(BreakerPermit)
        permit._breaker = cb  # noqa: SLF001
        permit._done = False  # noqa: SLF001
        permit.epoch = gate[0]
        permit.probe = 0
        if m.timed:
            c = _clock._clock  # noqa: SLF001
            permit.start = monotonic() if c is DEFAULT else c.now()
        else:
            permit.start = 0.0
    if cell is None:
        push_entered(cb, permit)
    else:
        cell[1] = permit
    return permit


async def aenter_block(cb: CircuitBreaker) -> BreakerPermit:
    """``CircuitBreaker.__aenter__``: `enter_block`, awaiting listeners."""
    cell = take_cell(cb)  # Before any await: the next block may reset it.
    m = cb._m  # noqa: SLF001
    gate = m.gate
    if gate is None:
        permit = await cb.aacquire()
    else:
        permit = closed_permit(cb, gate[0], now() if m.timed else 0.0)
    if cell is None:
        push_entered(cb, permit)
    else:
        cell[1] = permit
    return permit


def push_entered(cb: CircuitBreaker, permit: BreakerPermit) -> None:
    """Keep a permit entered by hand, for the matching `__exit__`."""
    _ENTERED.set((cb, permit, _ENTERED.get()))


def pop_entered(cb: CircuitBreaker) -> BreakerPermit:
    """The innermost permit entered by hand for *cb*."""
    stack = _ENTERED.get()
    skipped: list[tuple[CircuitBreaker, BreakerPermit]] = []
    while stack is not None and stack[0] is not cb:
        skipped.append((stack[0], stack[1]))
        stack = stack[2]
    if stack is None:
        raise RuntimeError(
            f"breaker {cb.name!r} exited more often than entered"
        )
    rest = stack[2]
    for other, permit in reversed(skipped):
        rest = (other, permit, rest)
    _ENTERED.set(rest)
    return stack[1]


def exit_block(cell: list[Any], *args: Any) -> None:
    """The exit of one ``with`` block: called ``(exc_type, exc, tb)``."""
    cb: CircuitBreaker = cell[0]
    permit: BreakerPermit | None = cell[1]
    cell[1] = None
    if permit is None:  # Entered by hand: the context's stack.
        permit = pop_entered(cb)
    exc = args[-2]
    if exc is None:
        if not permit.probe and not permit._done:  # noqa: SLF001
            # A closed call's success, as `CircuitBreaker._record` counts
            # it, written out: the block form's hot path.
            m = cb._m  # noqa: SLF001
            gate = m.gate
            if gate is not None and gate[0] == permit.epoch:
                if m.stamped:
                    c = _clock._clock  # noqa: SLF001
                    t = monotonic() if c is DEFAULT else c.now()
                else:
                    t = 0.0
                if t - permit.start < m.slow and t < m.free_until:
                    permit._done = True  # noqa: SLF001
                    inbox = gate[1]
                    inbox.append(t)
                    if len(inbox) >= INBOX_LIMIT:
                        cb._absorb()  # noqa: SLF001
                    return
        events = cb._record(  # noqa: SLF001
            permit.epoch, permit.start, permit.probe, SUCCESS, permit
        )
    else:
        events = cb._record(  # noqa: SLF001
            permit.epoch,
            permit.start,
            permit.probe,
            cb.config.outcome(exc),
            permit,
            exc=exc,
        )
    if events:
        cb._notify(events)  # noqa: SLF001


async def aexit_block(cell: list[Any], *args: Any) -> None:
    """The exit of one ``async with`` block (see `exit_block`)."""
    cb: CircuitBreaker = cell[0]
    permit: BreakerPermit | None = cell[1]
    cell[1] = None
    if permit is None:
        permit = pop_entered(cb)
    exc = args[-2]
    if exc is None:
        events = cb._record(  # noqa: SLF001
            permit.epoch, permit.start, permit.probe, SUCCESS, permit
        )
    else:
        events = cb._record(  # noqa: SLF001
            permit.epoch,
            permit.start,
            permit.probe,
            cb.config.outcome(exc),
            permit,
            exc=exc,
        )
    if events:
        if exc is None or isinstance(exc, Exception):
            await cb._anotify(events)  # noqa: SLF001
        else:  # Cancelled: never await while cancelled.
            cb._notify(events)  # noqa: SLF001
