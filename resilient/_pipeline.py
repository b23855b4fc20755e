"""
The stages a policy puts between retry and the call.

Composition order, outermost first: total budget -> retry (with the retry
budget) -> circuit breaker -> bulkhead -> attempt timeout -> the call.
Retry and the budget live in `resilient._retry`; this module holds the
admission stages (breaker, then bulkhead) and settles them when the attempt
ends. Each stage exists only if the policy configures it, so a plain retry
policy pays nothing here.

What counts against the dependency:

- a bulkhead rejection is local overload: the breaker permit is released
  without counting (`BreakerPermit.ignore`);
- cancellation from outside never counts (the breaker ignores every
  `BaseException` that is not an `Exception`);
- a `DeadlineExceeded` counts as a failure only when the attempt's own
  timeout fired; when the call's budget or an enclosing deadline ran out, it
  was the caller's clock, not the dependency, and it is ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from resilient._breaker import attempt_outcome
from resilient._breaker import breaker as get_breaker
from resilient._bulkhead import get_bulkhead
from resilient._retry_budget import get_retry_budget


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._breaker import BreakerPermit, CircuitBreaker
    from resilient._bulkhead import Bulkhead, Permit
    from resilient._core._policy import Policy
    from resilient._retry import _Call
    from resilient._retry_budget import RetryBudget


@final
class Guards:
    """
    The shared objects a policy names, looked up once per decorated
    function (not per call: a registry lookup compares configurations).
    """

    __slots__ = ("breaker", "breaker_only", "budget", "bulkhead")

    def __init__(self, policy: Policy) -> None:
        self.breaker: CircuitBreaker | None = (
            None
            if policy.breaker is None
            else get_breaker(policy.name, policy.breaker)
        )
        self.bulkhead: Bulkhead | None = (
            None
            if policy.bulkhead is None
            else get_bulkhead(policy.name, policy.bulkhead)
        )
        self.budget: RetryBudget | None = (
            None
            if policy.retry_budget is None
            else get_retry_budget(policy.name, policy.retry_budget)
        )
        self.breaker_only = (
            self.breaker is not None
            and self.bulkhead is None
            and self.budget is None
        )
        """Whether the only guard is a breaker (a bare first attempt is
        possible while it is closed)."""

    @classmethod
    def of(cls, policy: Policy) -> Guards | None:
        """The guards of *policy*, or None when it configures none."""
        if (
            policy.breaker is None
            and policy.bulkhead is None
            and policy.retry_budget is None
        ):
            return None
        return cls(policy)

    @property
    def admits(self) -> bool:
        """Whether there is an admission stage (breaker or bulkhead)."""
        return self.breaker is not None or self.bulkhead is not None

    def admit(self) -> _Admission:
        """Breaker, then bulkhead (blocking the thread while it queues)."""
        permit = None if self.breaker is None else self.breaker.acquire()
        try:
            slot = None if self.bulkhead is None else self.bulkhead.acquire()
        except BaseException:
            if permit is not None:
                permit.ignore()
            raise
        return _Admission(permit, slot)

    async def aadmit(self) -> _Admission:
        """Breaker, then bulkhead, waiting as a task."""
        breaker = self.breaker
        permit = None if breaker is None else await breaker.aacquire()
        try:
            slot = (
                None
                if self.bulkhead is None
                else await self.bulkhead.acquire_async()
            )
        except BaseException:
            if permit is not None:
                permit.ignore()
            raise
        return _Admission(permit, slot)

    def call(
        self,
        call: _Call,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """One guarded sync attempt."""
        admission = self.admit()
        call.arm()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            admission.settle(exc, own_timeout=call.own_timeout)
            raise
        admission.settle(None)
        return result

    async def acall(
        self,
        call: _Call,
        attempt: Callable[[], Awaitable[Any]],
    ) -> Any:
        """One guarded async attempt; *attempt* arms and runs the call."""
        admission = await self.aadmit()
        try:
            result = await attempt()
        except BaseException as exc:
            if isinstance(exc, Exception):
                await admission.asettle(exc, own_timeout=call.own_timeout)
            else:
                # Cancelled: nothing may be awaited now; never counted.
                admission.settle(exc)
            raise
        await admission.asettle(None)
        return result


@final
class _Admission:
    """The permits one attempt holds; settled exactly once."""

    __slots__ = ("permit", "slot")

    def __init__(self, permit: BreakerPermit | None, slot: Permit | None):
        self.permit = permit
        self.slot = slot

    def settle(
        self, exc: BaseException | None, *, own_timeout: bool = False
    ) -> None:
        """Release the slot, then tell the breaker how the call went."""
        if self.slot is not None:
            self.slot.release()
        permit = self.permit
        if permit is not None:
            cb = permit._breaker  # noqa: SLF001
            outcome = attempt_outcome(cb, exc, own_timeout=own_timeout)
            cb._settle(permit, outcome)  # noqa: SLF001

    async def asettle(
        self, exc: BaseException | None, *, own_timeout: bool = False
    ) -> None:
        """`settle`, awaiting the breaker's async listeners."""
        if self.slot is not None:
            self.slot.release()
        permit = self.permit
        if permit is not None:
            cb = permit._breaker  # noqa: SLF001
            outcome = attempt_outcome(cb, exc, own_timeout=own_timeout)
            await cb._asettle(permit, outcome)  # noqa: SLF001
