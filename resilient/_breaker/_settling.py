"""
How a breaker counts its calls' outcomes: `record`, the one way in.

A closed call's success that was not slow goes to the epoch's inbox
without the lock (`record`), everything else is counted by the machine
under it (`count`); the settling forms for closed tickets, permits and
failed calls, sync and async, report the state changes that follow.
`attempt_outcome` says how a pipeline attempt counts.

The functions but `attempt_outcome` are `CircuitBreaker`'s methods, bound
in its class body (``_record = record``, ``_settle = settle_permit``): a
call to one costs what a method's call costs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from resilient._breaker._calls import INBOX_LIMIT
from resilient._breaker._now import DEFAULT
from resilient._breaker._records import FAILURE, IGNORE, SUCCESS
from resilient._core import _clock
from resilient.exceptions import DeadlineExceeded


if TYPE_CHECKING:
    from resilient._breaker._breaker import CircuitBreaker
    from resilient._breaker._records import BreakerPermit, BreakerTransition
    from resilient._core._config_breaker import Outcome


def record(  # noqa: PLR0917 - a method: *self* counts
    self: CircuitBreaker,
    epoch: int,
    start: float,
    probe: int,
    outcome: int,
    permit: BreakerPermit | None,
    *,
    exc: BaseException | None = None,
) -> list[BreakerTransition] | None:
    """
    Count one call's outcome; the state changes to report, if any.

    A closed call's success that was not slow and ended before the
    machine's `free_until` goes to the epoch's inbox without the lock (it
    cannot open the breaker; see `_BreakerMachine._free_inbox`), an
    ignored closed call changes nothing; everything else is counted under
    the lock.
    """
    c = _clock._clock  # noqa: SLF001
    t = time.monotonic() if c is DEFAULT else c.now()
    if not probe and outcome != FAILURE:
        if permit is not None:
            if permit._done:  # noqa: SLF001
                return None
            permit._done = True  # noqa: SLF001
            permit = None
        if outcome == IGNORE:
            return None
        m = self._m
        gate = m.gate
        if (
            gate is not None
            and gate[0] == epoch
            and t - start < m.slow
            and t < m.free_until
        ):
            inbox = gate[1]
            inbox.append(t)
            if len(inbox) >= INBOX_LIMIT:
                self._absorb()
            return None
    return self._count(epoch, start, probe, outcome, permit, t=t, exc=exc)


def absorb(self: CircuitBreaker) -> None:
    """Empty a full inbox into the window."""
    with self._lock:
        self._m.absorb()


def count(  # noqa: PLR0917 - a method: *self* counts
    self: CircuitBreaker,
    epoch: int,
    start: float,
    probe: int,
    outcome: int,
    permit: BreakerPermit | None,
    *,
    t: float,
    exc: BaseException | None,
) -> list[BreakerTransition] | None:
    """`_record` under the lock: the machine counts the outcome."""
    with self._lock:
        if permit is not None:
            if permit._done:  # noqa: SLF001
                return None
            permit._done = True  # noqa: SLF001
        m = self._m
        m.settle(epoch, probe, outcome, t - start, t, exc=exc)
        return self._drain() if m.outbox else None


def settle_closed(
    self: CircuitBreaker,
    epoch: int,
    start: float,
    outcome: int,
    exc: BaseException | None = None,
) -> None:
    events = self._record(epoch, start, 0, outcome, None, exc=exc)
    if events:
        self._notify(events)


async def asettle_closed(
    self: CircuitBreaker,
    epoch: int,
    start: float,
    outcome: int,
    exc: BaseException | None = None,
) -> None:
    events = self._record(epoch, start, 0, outcome, None, exc=exc)
    if events:
        await self._anotify(events)


def settle_permit(
    self: CircuitBreaker,
    permit: BreakerPermit,
    outcome: int,
    exc: BaseException | None = None,
) -> None:
    events = self._record(
        permit.epoch, permit.start, permit.probe, outcome, permit, exc=exc
    )
    if events:
        self._notify(events)


async def asettle_permit(
    self: CircuitBreaker,
    permit: BreakerPermit,
    outcome: int,
    exc: BaseException | None = None,
) -> None:
    events = self._record(
        permit.epoch, permit.start, permit.probe, outcome, permit, exc=exc
    )
    if events:
        await self._anotify(events)


def failed(  # noqa: PLR0917 - a method: *self* counts
    self: CircuitBreaker,
    epoch: int,
    start: float,
    probe: int,
    permit: BreakerPermit | None,
    exc: BaseException,
) -> None:
    """A guarded call raised *exc*: count it as the configuration says."""
    events = self._record(
        epoch, start, probe, self.config.outcome(exc), permit, exc=exc
    )
    if events:
        self._notify(events)


async def afailed(  # noqa: PLR0917 - a method: *self* counts
    self: CircuitBreaker,
    epoch: int,
    start: float,
    probe: int,
    permit: BreakerPermit | None,
    exc: BaseException,
) -> None:
    """`_failed` from async code; while cancelled, nothing is awaited."""
    events = self._record(
        epoch, start, probe, self.config.outcome(exc), permit, exc=exc
    )
    if events:
        if isinstance(exc, Exception):
            await self._anotify(events)
        else:  # Cancelled: never await while cancelled.
            self._notify(events)


def attempt_outcome(
    cb: CircuitBreaker, exc: BaseException | None, *, own_timeout: bool
) -> Outcome:
    """
    How an attempt of the pipeline counts for its breaker: a success; a
    `DeadlineExceeded` that was not the attempt's own timeout (the caller's
    budget or deadline ran out, not the dependency) counts for nothing;
    anything else as the breaker's configuration says.
    """
    if exc is None:
        return SUCCESS
    if isinstance(exc, DeadlineExceeded) and not own_timeout:
        return IGNORE
    return cb.config.outcome(exc)
