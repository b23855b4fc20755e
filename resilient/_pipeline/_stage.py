"""
Admission stages: what stands between retry and each attempt.

A stage admits an attempt (or raises a `resilient.exceptions.Rejected`
saying when it may admit one), and is settled when the attempt ends. `ORDER`
lists the stages outermost first, each under the `Policy` field that
configures it: a new stage is one module with a `Stage` class and one line
here. Retry outwaits a rejection from any stage, and before each retry asks
every stage how long until it would admit (`Stage.retry_after`).

What counts against the dependency is each stage's own business: a breaker
ignores a rejection by a later stage (local overload, not the dependency),
the caller's cancellation, and a `DeadlineExceeded` that was not the
attempt's own timeout (the caller's budget or deadline ran out).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from resilient._breaker import SUCCESS, attempt_outcome
from resilient._breaker import breaker as get_breaker
from resilient._bulkhead import get_bulkhead
from resilient._core._done import DONE


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._breaker import BreakerPermit, CircuitBreaker
    from resilient._bulkhead import Bulkhead, BulkheadPermit


class Stage(Protocol):
    """
    One admission stage. Tickets are whatever `admit` returns; each is
    settled exactly once, by `settle`, `asettle` or `release`.
    """

    def admit(self) -> object:
        """Admit one attempt (blocking the thread while it queues)."""

    async def aadmit(self) -> object:
        """Admit one attempt, waiting as a task."""

    def settle(
        self, ticket: Any, exc: BaseException | None, own_timeout: bool
    ) -> None:
        """The attempt ended: it raised *exc*, or returned (None)."""

    async def asettle(
        self, ticket: Any, exc: BaseException | None, own_timeout: bool
    ) -> None:
        """`settle`, awaiting async listeners; never while cancelled."""

    def release(self, ticket: Any) -> None:
        """Give the ticket back without counting: the attempt never ran."""

    def retry_after(self) -> float:
        """Seconds until an attempt would be admitted; 0 when now."""


@final
class BreakerStage:
    """A circuit breaker as a stage."""

    __slots__ = ("breaker",)

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker

    def admit(self) -> BreakerPermit:
        """A permit, or `CircuitOpen`."""
        return self.breaker.acquire()

    async def aadmit(self) -> BreakerPermit:
        """A permit, awaiting async listeners, or `CircuitOpen`."""
        return await self.breaker.aacquire()

    def settle(
        self,
        ticket: BreakerPermit,
        exc: BaseException | None,
        own_timeout: bool,
    ) -> None:
        """Count the attempt as the breaker's configuration says."""
        cb = self.breaker
        outcome = attempt_outcome(cb, exc, own_timeout=own_timeout)
        cb._settle(ticket, outcome, exc)  # noqa: SLF001

    async def asettle(
        self,
        ticket: BreakerPermit,
        exc: BaseException | None,
        own_timeout: bool,
    ) -> None:
        """`settle`, awaiting async listeners."""
        cb = self.breaker
        outcome = attempt_outcome(cb, exc, own_timeout=own_timeout)
        await cb._asettle(ticket, outcome, exc)  # noqa: SLF001

    def release(self, ticket: BreakerPermit) -> None:
        """Release the permit without counting."""
        ticket.ignore()

    def retry_after(self) -> float:
        """Seconds until the breaker admits a probe."""
        return self.breaker.retry_after()

    # The bare first attempt: a closed breaker counts a call without a
    # permit object or its lock (see CircuitBreaker._closed_ticket).

    def fast_admit(self) -> tuple[int, float] | None:
        """A ticket while closed, or None (take the full path)."""
        return self.breaker._closed_ticket()  # noqa: SLF001

    def fast_settle(
        self, ticket: tuple[int, float], exc: BaseException | None
    ) -> None:
        """Count a bare attempt (never its own timeout: it has none)."""
        cb = self.breaker
        outcome = (
            SUCCESS
            if exc is None
            else attempt_outcome(cb, exc, own_timeout=False)
        )
        # The ticket's fields as arguments, not ``*ticket`` (a call that
        # builds its arguments' tuple, a good part of a bare call).
        cb._settle_closed(ticket[0], ticket[1], outcome, exc)  # noqa: SLF001

    def afast_settle(
        self, ticket: tuple[int, float], exc: BaseException | None
    ) -> Awaitable[None]:
        """
        `fast_settle` from async code: the breaker's settle to await (its
        coroutine, not one of this stage's around it), or, while cancelled,
        the settle done here and `DONE` (nothing is awaited).
        """
        cb = self.breaker
        if exc is None:
            return cb._asettle_closed(ticket[0], ticket[1], SUCCESS)  # noqa: SLF001
        if not isinstance(exc, Exception):
            self.fast_settle(ticket, exc)
            return DONE
        outcome = attempt_outcome(cb, exc, own_timeout=False)
        return cb._asettle_closed(ticket[0], ticket[1], outcome, exc)  # noqa: SLF001

    def fast_drop(self, ticket: tuple[int, float]) -> None:
        """Nothing to give back: a closed ticket holds nothing."""


@final
class BulkheadStage:
    """
    A bulkhead as a stage: a slot per attempt.

    Its bare first attempt takes a free slot without queueing, and it is
    the machine's own steps, bound once (no frame of the stage's around
    them): ``fast_admit()`` is `BulkheadMachine.take_new` for this
    bulkhead (a new permit holding a slot, or None to take the full path,
    which queues), and ``fast_settle(permit, exc)``, ``afast_settle``
    (whose return value is the already complete `DONE`) and
    ``fast_drop(permit)`` are `BulkheadMachine.release`.
    """

    __slots__ = (
        "afast_settle",
        "bulkhead",
        "fast_admit",
        "fast_drop",
        "fast_settle",
    )

    def __init__(self, bulkhead: Bulkhead) -> None:
        self.bulkhead = bulkhead
        machine = bulkhead._machine  # noqa: SLF001
        self.fast_admit: Callable[[], BulkheadPermit | None] = (
            functools.partial(machine.take_new, bulkhead)
        )
        self.fast_settle: Callable[
            [BulkheadPermit, BaseException | None], object
        ] = machine.release
        self.afast_settle: Callable[
            [BulkheadPermit, BaseException | None], Awaitable[None]
        ] = machine.release
        self.fast_drop: Callable[[BulkheadPermit], object] = machine.release

    def admit(self) -> BulkheadPermit:
        """A slot, or `BulkheadFull`."""
        return self.bulkhead.acquire()

    async def aadmit(self) -> BulkheadPermit:
        """A slot, waiting as a task, or `BulkheadFull`."""
        return await self.bulkhead.acquire_async()

    def settle(
        self,
        ticket: BulkheadPermit,
        exc: BaseException | None,
        own_timeout: bool,
    ) -> None:
        """Free the slot."""
        ticket.release()

    async def asettle(
        self,
        ticket: BulkheadPermit,
        exc: BaseException | None,
        own_timeout: bool,
    ) -> None:
        """Free the slot (nothing to await)."""
        ticket.release()

    def release(self, ticket: BulkheadPermit) -> None:
        """Free the slot."""
        ticket.release()

    def retry_after(self) -> float:
        """A bulkhead cannot tell when a slot frees: 0."""
        return 0.0


def _breaker_stage(name: str, config: Any) -> Stage:
    return BreakerStage(get_breaker(name, config))


def _bulkhead_stage(name: str, config: Any) -> Stage:
    return BulkheadStage(get_bulkhead(name, config))


ORDER: Final[tuple[tuple[str, Callable[[str, Any], Stage]], ...]] = (
    ("breaker", _breaker_stage),
    ("bulkhead", _bulkhead_stage),
)
"""The admission stages, outermost first: (the `Policy` field that
configures it, how to make it from the policy's name and that field)."""
