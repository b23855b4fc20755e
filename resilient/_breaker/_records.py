"""
The records the breaker's machine hands out and the names it decides with.

`BreakerState` and the state and outcome constants, the transition and
statistics records (`BreakerTransition`, `BreakerStatistics`), the
machine's refusal (`Reject`) and the permit a call is admitted with
(`BreakerPermit`). Plain data: no decisions live here.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, final

import attrs

from resilient._core._config_breaker import Outcome
from resilient._core._shown import shown


if TYPE_CHECKING:
    import collections

    from resilient._breaker._breaker import CircuitBreaker


class BreakerState(enum.Enum):
    """
    Where a circuit breaker stands.

    .. versionadded:: 26.11.0
    """

    CLOSED = "closed"
    """Calls run; outcomes fill the window."""
    OPEN = "open"
    """Calls are rejected until the open interval has passed."""
    HALF_OPEN = "half_open"
    """A few probes run; their outcome closes or re-opens the breaker."""
    FORCED_OPEN = "forced_open"
    """Opened by `CircuitBreaker.force_open`; rejects until `reset`."""


_CLOSED: Final = BreakerState.CLOSED
_OPEN: Final = BreakerState.OPEN
_HALF_OPEN: Final = BreakerState.HALF_OPEN
_FORCED_OPEN: Final = BreakerState.FORCED_OPEN

SUCCESS: Final = Outcome.SUCCESS
FAILURE: Final = Outcome.FAILURE
IGNORE: Final = Outcome.IGNORE

UNCOUNTED: Final = -1
"""The epoch of a metrics-only breaker's permit for a call it would have
rejected: no epoch matches it, so the call counts for nothing."""

_VERDICTS: Final = {o.verdict: o for o in Outcome}
"""Verdict names to outcomes, for callers that still hold a name."""

Gate: TypeAlias = "tuple[int, collections.deque[float]]"
"""A closed epoch and its inbox of successes' end times."""

TransitionReason = Literal[
    "failure_rate",
    "slow_call_rate",
    "open_interval_passed",
    "probe_failed",
    "probe_timeout",
    "probes_succeeded",
    "forced",
    "reset",
]
"""Why a breaker changed state."""


@final
@attrs.frozen
class BreakerTransition:
    """
    A state change, as listeners and telemetry see it.

    Attributes:
        name: The breaker's name.
        old: The state before.
        new: The state after.
        reason: Why it changed.
        at: When, on resilient's clock (monotonic seconds).
        retry_after: Seconds from *at* until the breaker admits a probe: 0
            unless *new* is open, `math.inf` when forced open.
        opened_by: When *new* is open, the exception of the call that
            opened it (as `CircuitOpen.opened_by` holds it: a copy without
            its traceback); None otherwise, and when the call raised
            nothing (a slow call, a stuck probe, a forced opening).

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       *opened_by*.
    """

    name: str
    old: BreakerState
    new: BreakerState
    reason: TransitionReason
    at: float
    retry_after: float
    opened_by: BaseException | None = None


@final
@attrs.frozen
class BreakerStatistics:
    """
    A snapshot of one breaker, immutable.

    Attributes:
        name: The breaker's name.
        state: Its state when the snapshot was taken.
        calls: Calls in the window (ignored ones are not counted).
        failures: Failed calls in the window.
        slow_calls: Slow calls in the window.
        failure_rate: ``failures / calls``, 0.0 when the window is empty.
        slow_call_rate: ``slow_calls / calls``, 0.0 when empty.
        probes_in_flight: Half-open probes admitted and not yet settled.
        retry_after: Seconds until a call would be admitted (0 when one
            would be now).
        times_opened: How often it opened since it was made.
        rejected: How many calls it rejected since it was made.

    .. versionadded:: 26.11.0
    """

    name: str
    state: BreakerState
    calls: int
    failures: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    probes_in_flight: int
    retry_after: float
    times_opened: int
    rejected: int


@final
@attrs.frozen
class Reject:
    """The machine's refusal: no call now; a probe in *retry_after* s."""

    retry_after: float
    state: BreakerState


@final
class BreakerPermit:
    """
    Leave to make one call through a breaker; settle it exactly once.

    Call `success`, `failure` or `ignore` when the call ends (the ``a``
    twins from async code, so that async listeners are awaited). A second
    settlement is a no-op. A permit is for one caller: do not share it.
    A half-open probe's permit that is dropped unsettled (an exception
    landed between taking it and settling it) gives its slot back.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("__weakref__", "_breaker", "_done", "epoch", "probe", "start")

    def __init__(
        self, breaker: CircuitBreaker, epoch: int, start: float, probe: int
    ) -> None:
        self._breaker = breaker
        self._done = False
        self.epoch = epoch
        self.start = start
        """When the permit was granted, on resilient's clock (0.0 for a
        closed breaker that does not time calls)."""
        self.probe = probe
        """The probe's number while half-open; 0 for an ordinary call."""

    def __repr__(self) -> str:
        kind = f"probe {self.probe}" if self.probe else "call"
        done = "settled" if self._done else "open"
        return (
            f"<BreakerPermit {kind} of {shown(self._breaker.name)!r}, {done}>"
        )

    def success(self) -> None:
        """The call succeeded."""
        self._breaker._settle(self, SUCCESS)  # noqa: SLF001

    def failure(self, exc: BaseException) -> None:
        """
        The call raised *exc*: a failure, a success or nothing, as the
        breaker's `BreakerConfig.failure_on` and *ignore_on* say.
        Cancellation, `KeyboardInterrupt` and `SystemExit` never count.
        """
        cb = self._breaker
        cb._settle(self, cb.config.outcome(exc), exc)  # noqa: SLF001

    def ignore(self) -> None:
        """
        Release without counting (the call was not the dependency's fault:
        a full bulkhead, the caller's own cancellation).
        """
        self._breaker._settle(self, IGNORE)  # noqa: SLF001

    async def asuccess(self) -> None:
        """`success`, awaiting async listeners."""
        await self._breaker._asettle(self, SUCCESS)  # noqa: SLF001

    async def afailure(self, exc: BaseException) -> None:
        """`failure`, awaiting async listeners."""
        cb = self._breaker
        await cb._asettle(self, cb.config.outcome(exc), exc)  # noqa: SLF001

    async def aignore(self) -> None:
        """`ignore`, awaiting async listeners."""
        await self._breaker._asettle(self, IGNORE)  # noqa: SLF001
