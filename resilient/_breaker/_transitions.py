"""
The breaker machine's state changes: opening (`trip`), every move
between states (`move`) and the open interval's growth; and `detached`,
the copy of the opening failure an open breaker keeps.

The functions are `_BreakerMachine`'s methods, bound in its class body
(``_move = move``): a call to one costs what a method's call costs.
They run under the shell's lock like the rest of the machine.
"""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING, Any

from resilient._breaker._records import (
    _CLOSED,
    _FORCED_OPEN,
    _HALF_OPEN,
    _OPEN,
    BreakerTransition,
)


if TYPE_CHECKING:
    from resilient._breaker._machine import _BreakerMachine
    from resilient._breaker._records import (
        BreakerState,
        Gate,
        TransitionReason,
    )


def next_interval(self: _BreakerMachine) -> float:
    """The open interval of a re-opening from half-open."""
    c = self.config
    return min(self.interval * c.open_interval_growth, c.max_open_interval)


def reopen(self: _BreakerMachine, now: float) -> None:
    """The clock reads earlier than the opening: open from *now*."""
    self.opened_at = now
    self.open_until = now + self.interval


def trip(
    self: _BreakerMachine,
    reason: TransitionReason,
    now: float,
    exc: BaseException | None,
) -> BreakerTransition:
    interval = (
        self._next_interval() if self.state is _HALF_OPEN else self.interval
    )
    opened_by = None if exc is None else detached(exc)
    return self._move(_OPEN, reason, now, interval, opened_by)


def move(  # noqa: PLR0917 - a method: *self* counts
    self: _BreakerMachine,
    new: BreakerState,
    reason: TransitionReason,
    now: float,
    interval: float = 0.0,
    opened_by: BaseException | None = None,
) -> BreakerTransition:
    """
    Change state (to open for *interval* seconds, opened by
    *opened_by*, when *new* is open) and report it in `outbox`.

    Everything that calls out (the new inbox, the event, the window's
    clearing) comes first, then the commit: plain stores, and the
    event's append (a call that ends it). An asynchronous exception
    lands before the change or after it and its report, never halfway
    (it could leave an opening counted in `times_opened` with the
    breaker still closed, or a change nobody heard of).
    """
    old = self.state
    if old is _CLOSED:
        # The inbox's successes belong to the window an open breaker
        # still shows; its gate goes with the change.
        self.absorb()
    epoch = self.epoch + 1
    closing = new is _CLOSED
    gate: Gate | None = (epoch, collections.deque()) if closing else None
    if new is _OPEN:
        retry_after = interval
    else:  # Half-open still names the failure that opened it.
        opened_by = self.opened_by if new is _HALF_OPEN else None
        interval = self.config.open_interval if closing else self.interval
        retry_after = math.inf if new is _FORCED_OPEN else 0.0
    event = BreakerTransition(
        self.name,
        old,
        new,
        reason,
        now,
        retry_after,
        opened_by if new is _OPEN else None,
    )
    if closing:
        self.window.clear()  # Early is harmless: nobody reads it.
    opened = 1 if new is _OPEN or new is _FORCED_OPEN else 0
    outbox = self.outbox
    self.successes = 0
    self.probes = {}
    self._holders = {}
    self.interval = interval
    self.opened_by = opened_by
    if new is _OPEN:
        self.opened_at = now
        self.open_until = now + interval
    self.times_opened += opened
    self.free_until = -math.inf  # Closed: the window is empty.
    self.state = new
    self.epoch = epoch
    self.gate = gate
    outbox.append(event)
    return event


def detached(exc: BaseException) -> BaseException:
    """
    A copy of *exc* without its traceback, cause or context: its class,
    ``args``, attributes and notes, made without calling ``__init__`` (so
    that classes with keyword-only arguments copy too), the leaves of a
    group likewise. What an open breaker keeps of the failure that opened
    it, so that it keeps no frames (and their locals) alive. An exception
    that cannot be copied that way is kept as it is.
    """
    try:
        if isinstance(exc, BaseExceptionGroup):
            copy = exc.derive([detached(e) for e in exc.exceptions])
        else:
            cls: Any = type(exc)
            copy = cls.__new__(cls, *exc.args)
            copy.args = exc.args
        copy.__dict__.update(exc.__dict__)
    except Exception:  # noqa: BLE001 - an exotic __new__ or __dict__
        return exc
    return copy
