"""
The stateful parts a policy names, looked up once per decorated function.

A registry lookup compares configurations, so it is done when the function
is decorated, not per call; `resilient.testing.reset_registries()` bumps
the registries' generation, and the guards look their parts up again on the
next call (one int compare per call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol, final

from resilient._bulkhead._pair import BreakerBulkhead
from resilient._core import _registry
from resilient._pipeline._stage import ORDER, BreakerStage, BulkheadStage
from resilient._retry_budget import get_retry_budget


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._core._settings import RetrySettings
    from resilient._pipeline._stage import Stage
    from resilient._retry_budget import RetryBudget


class FastStage(Protocol):
    """
    Admission for the bare first attempt: a ticket when the stage admits
    at once without its full path (no queueing, no permit machinery), or
    None to take the full path.
    """

    def fast_admit(self) -> Any:
        """A ticket, or None."""

    def fast_settle(self, ticket: Any, exc: BaseException | None) -> object:
        """The bare attempt ended: count it, free what the ticket holds
        (what it returns is ignored)."""

    def afast_settle(
        self, ticket: Any, exc: BaseException | None
    ) -> Awaitable[None]:
        """`fast_settle` from async code, to await (a coroutine, or the
        already complete `DONE` when nothing is left to await); never
        awaits while cancelled."""

    def fast_drop(self, ticket: Any) -> object:
        """Give the ticket back uncounted: the attempt will not run bare
        (what it returns is ignored)."""


# The stages that have a fast admission.
_FAST: Final = (BreakerStage, BulkheadStage)


@final
class BareChain:
    """
    Several fast stages in `ORDER`, admitted outermost first and settled
    innermost first, as one: a breaker and a bulkhead cost their own fast
    admissions, not the flow's. The stages' methods are bound once (a
    breaker's own ``fast_admit``, without its stage's frame).
    """

    __slots__ = ("_admits", "_asettles", "_drops", "_settles")

    def __init__(self, stages: tuple[FastStage, ...]) -> None:
        self._admits: tuple[Callable[[], Any], ...] = tuple(
            s.breaker.fast_admit if type(s) is BreakerStage else s.fast_admit
            for s in stages
        )
        self._settles = tuple(s.fast_settle for s in stages)
        # None: the stage's settle never awaits (a bulkhead's release), so
        # it is called, not awaited (no coroutine made).
        self._asettles: tuple[
            Callable[[Any, BaseException | None], Awaitable[None]] | None, ...
        ] = tuple(
            None if type(s) is BulkheadStage else s.afast_settle
            for s in stages
        )
        self._drops = tuple(s.fast_drop for s in stages)

    def fast_admit(self) -> list[Any] | None:
        """Every stage's ticket, or None (those taken given back)."""
        tickets: list[Any] = []
        try:
            for admit in self._admits:
                ticket = admit()
                if ticket is None:
                    self.fast_drop(tickets)
                    return None
                tickets.append(ticket)
        except BaseException:
            self.fast_drop(tickets)
            raise
        return tickets

    def fast_settle(
        self, tickets: list[Any], exc: BaseException | None
    ) -> None:
        """Settle every ticket, innermost first."""
        settles = self._settles
        for i in range(len(tickets) - 1, -1, -1):
            settles[i](tickets[i], exc)

    async def afast_settle(
        self, tickets: list[Any], exc: BaseException | None
    ) -> None:
        """`fast_settle`, awaiting async listeners."""
        asettles = self._asettles
        for i in range(len(tickets) - 1, -1, -1):
            asettle = asettles[i]
            if asettle is None:
                self._settles[i](tickets[i], exc)
            else:
                await asettle(tickets[i], exc)

    def fast_drop(self, tickets: list[Any]) -> None:
        """Give the tickets taken back uncounted, innermost first."""
        drops = self._drops
        for i in range(len(tickets) - 1, -1, -1):
            drops[i](tickets[i])


@final
class Guards:
    """
    The admission stages (in `ORDER`) and the retry budget of one policy.
    """

    __slots__ = ("_policy", "bare", "budget", "generation", "stages")

    def __init__(self, policy: RetrySettings) -> None:
        self._policy = policy
        self.generation = -1
        """The registry generation the parts were looked up in."""
        self.stages: tuple[Stage, ...] = ()
        self.budget: RetryBudget | None = None
        self.bare: FastStage | None = None
        """The guards when each can admit without waiting (a closed
        breaker, a bulkhead with a free slot): then a first attempt runs
        bare, through `FastStage.fast_admit`."""
        self.look_up()

    def look_up(self) -> None:
        """Look the parts up (again) in the registries."""
        policy = self._policy
        self.generation = _registry.generation()
        self.stages = tuple(
            make(policy.name, config)
            for field, make in ORDER
            if (config := getattr(policy, field)) is not None
        )
        self.budget = (
            None
            if policy.retry_budget is None
            else get_retry_budget(policy.name, policy.retry_budget)
        )
        stages = self.stages
        fast = (
            bool(stages)
            and self.budget is None
            and all(type(s) in _FAST for s in stages)
        )
        self.bare = (
            None
            if not fast
            else stages[0]  # type: ignore[assignment]
            if len(stages) == 1
            else BreakerBulkhead(stages[0].breaker, stages[1].bulkhead)  # type: ignore[attr-defined]
            if tuple(map(type, stages)) == (BreakerStage, BulkheadStage)
            else BareChain(stages)  # type: ignore[arg-type]
        )

    def fresh(self) -> Guards:
        """These guards, looked up again if the registries were reset."""
        if self.generation != _registry.generation():
            self.look_up()
        return self

    @classmethod
    def of(cls, policy: RetrySettings) -> Guards | None:
        """The guards of *policy*, or None when it configures none."""
        if policy.retry_budget is None and all(
            getattr(policy, field) is None for field, _ in ORDER
        ):
            return None
        return cls(policy)

    def admission_wait(self) -> float:
        """Seconds until every stage would admit an attempt."""
        return max((s.retry_after() for s in self.stages), default=0.0)

    def admit(self) -> list[object]:
        """Every stage's ticket, outermost first; on a rejection, the
        tickets already taken are released uncounted."""
        tickets: list[object] = []
        try:
            for stage in self.stages:
                tickets.append(stage.admit())  # noqa: PERF401 - kept as taken
        except BaseException:
            self.release(tickets)
            raise
        return tickets

    async def aadmit(self) -> list[object]:
        """`admit`, waiting as a task."""
        tickets: list[object] = []
        try:
            for stage in self.stages:
                tickets.append(await stage.aadmit())  # noqa: PERF401 - kept as taken
        except BaseException:
            self.release(tickets)
            raise
        return tickets

    def release(self, tickets: list[object]) -> None:
        """Release *tickets* uncounted, innermost first."""
        for stage, ticket in reversed(
            tuple(zip(self.stages, tickets, strict=False))
        ):
            stage.release(ticket)

    def settle(
        self,
        tickets: list[object],
        exc: BaseException | None,
        own_timeout: bool,
    ) -> None:
        """The attempt ended: settle every ticket, innermost first."""
        for stage, ticket in reversed(
            tuple(zip(self.stages, tickets, strict=True))
        ):
            stage.settle(ticket, exc, own_timeout)

    async def asettle(
        self,
        tickets: list[object],
        exc: BaseException | None,
        own_timeout: bool,
    ) -> None:
        """`settle` from async code; while cancelled, nothing is awaited."""
        if exc is not None and not isinstance(exc, Exception):
            self.settle(tickets, exc, own_timeout)
            return
        for stage, ticket in reversed(
            tuple(zip(self.stages, tickets, strict=True))
        ):
            await stage.asettle(ticket, exc, own_timeout)
