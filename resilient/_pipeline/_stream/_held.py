"""
A stream through a standalone breaker (``@resilient.breaker(...)``) or
bulkhead (``@resilient.bulkhead(...)``): admitted at its first ``next``,
settled once when it ends; nothing is retried and no span is made, as for
the decorated functions of those guards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, final

from resilient._pipeline._stream._drive import calm, counted


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._breaker import BreakerPermit, CircuitBreaker
    from resilient._bulkhead import Bulkhead, BulkheadPermit


class Hold(Protocol):
    """A standalone guard a stream holds: admit once, settle once."""

    def admit(self) -> Any:
        """Take the ticket (may wait in the thread)."""

    async def aadmit(self) -> Any:
        """Take the ticket (may wait as a task)."""

    def settle(self, ticket: Any, exc: BaseException | None) -> None:
        """Give the ticket back, counting *exc* (None: a success)."""

    async def asettle(self, ticket: Any, exc: BaseException | None) -> None:
        """`settle`, awaiting async listeners (only when calm)."""


@final
class BreakerHold:
    """A breaker's permit, counted as the standalone decorator counts a
    call (the breaker's `BreakerConfig.outcome`)."""

    __slots__ = ("_cb",)

    def __init__(self, cb: CircuitBreaker) -> None:
        self._cb = cb

    def admit(self) -> BreakerPermit:
        return self._cb.acquire()

    async def aadmit(self) -> BreakerPermit:
        return await self._cb.aacquire()

    def settle(self, ticket: BreakerPermit, exc: BaseException | None) -> None:
        if exc is None:
            ticket.success()
        else:
            ticket.failure(exc)

    async def asettle(
        self, ticket: BreakerPermit, exc: BaseException | None
    ) -> None:
        if exc is None:
            await ticket.asuccess()
        else:
            await ticket.afailure(exc)


@final
class BulkheadHold:
    """A bulkhead's slot, waited for as the standalone decorator waits."""

    __slots__ = ("_bulkhead",)

    def __init__(self, bulkhead: Bulkhead) -> None:
        self._bulkhead = bulkhead

    def admit(self) -> BulkheadPermit:
        return self._bulkhead.acquire()

    async def aadmit(self) -> BulkheadPermit:
        return await self._bulkhead.aacquire()

    def settle(
        self, ticket: BulkheadPermit, exc: BaseException | None
    ) -> None:
        ticket.release()

    async def asettle(
        self, ticket: BulkheadPermit, exc: BaseException | None
    ) -> None:
        ticket.release()


@final
class HeldStream:
    """One stream through a standalone breaker or bulkhead."""

    __slots__ = ("_hold", "_ticket", "delivered")

    def __init__(self, hold: Hold) -> None:
        self._hold = hold
        self._ticket: Any = None
        self.delivered = 0

    def start(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """Admit, then the first item (as `PolicyStream.start`)."""
        self._ticket = self._hold.admit()
        inner = fn(*args, **kwargs)
        try:
            return inner, next(inner)
        except StopIteration as stop:
            self.end(None)
            return None, stop.value

    async def astart(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """`start`, in async code."""
        self._ticket = await self._hold.aadmit()
        inner = fn(*args, **kwargs)
        try:
            return inner, await inner.__anext__()
        except StopAsyncIteration:
            await self.aend(None)
            return None, None

    @staticmethod
    def step(method: Callable[..., Any], *args: Any) -> Any:
        """One step: nothing to set around it."""
        return method(*args)

    @staticmethod
    async def astep(method: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """One step, in async code."""
        return await method(*args)

    def end(self, exc: BaseException | None) -> None:
        """Settle the ticket, exactly once."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._hold.settle(ticket, counted(exc))

    async def aend(self, exc: BaseException | None) -> None:
        """`end`, awaiting async listeners when it may."""
        if not calm(exc):
            self.end(exc)
            return
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            await self._hold.asettle(ticket, exc)
