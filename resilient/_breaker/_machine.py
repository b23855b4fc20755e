"""
The breaker's pure machine and the records it hands out.

`_BreakerMachine` decides (admit, reject, open, close) from outcomes and the
time it is handed; it never reads a clock, waits or calls out, and holds no
lock: its shell (`CircuitBreaker`) calls it under its own. Every state
change is appended to `outbox` for the shell to report once the lock is
released.
"""

from __future__ import annotations

import collections
import enum
import math
import weakref
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, final

import attrs

from resilient._breaker._windows import SLOW, CountRing, TimeRing
from resilient._core._config_breaker import BreakerConfig, CountWindow, Outcome


if TYPE_CHECKING:
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
        return f"<BreakerPermit {kind} of {self._breaker.name!r}, {done}>"

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


@final
class _BreakerMachine:
    """
    The decisions of one breaker, and nothing else: no clock, no lock, no
    I/O. Every method takes the time; every state change is appended to
    `outbox` for the shell to report once its lock is released.

    Args:
        config: The thresholds and timings.
        name: The breaker's name, copied into transitions.
        owner: Handed to each permit when `admit` is given none; opaque
            here. (`CircuitBreaker` passes itself to `admit` instead, so
            that it and its machine form no reference cycle.)
        epoch: The first epoch: a machine that replaces another starts past
            the old one's, so that the old one's permits count for nothing.
    """

    __slots__ = (
        "_fail_rate",
        "_holders",
        "_min_calls",
        "_seq",
        "_slow_rate",
        "config",
        "enforcing",
        "epoch",
        "gate",
        "interval",
        "name",
        "open_until",
        "opened_at",
        "opened_by",
        "outbox",
        "owner",
        "probes",
        "rejected",
        "slow",
        "stamped",
        "state",
        "successes",
        "timed",
        "times_opened",
        "window",
    )

    def __init__(
        self,
        config: BreakerConfig,
        name: str = "",
        owner: Any = None,
        *,
        epoch: int = 0,
    ) -> None:
        self.config = config
        self.name = name
        self.owner = owner
        w = config.window
        self.window: CountRing | TimeRing = (
            CountRing(w.size)
            if isinstance(w, CountWindow)
            else TimeRing(w.seconds)
        )
        self._min_calls = config.minimum_calls
        self._fail_rate = config.failure_rate
        self._slow_rate = config.slow_call_rate
        slow = config.slow_call_duration
        self.slow = math.inf if slow is None else slow
        """Seconds from which a call is slow (infinite: never)."""
        self.timed = slow is not None
        """Whether a call's duration matters while closed."""
        self.enforcing = not config.metrics_only
        """Whether it rejects calls (it does unless metrics-only)."""
        self.stamped = self.timed or isinstance(self.window, TimeRing)
        """Whether a closed call's success needs its end time (a time
        window files it by time; a count window does not)."""
        self.state = _CLOSED
        self.epoch = epoch
        """Bumped on every state change: older permits no longer count."""
        self.gate: Gate | None = (epoch, collections.deque())
        """While closed, the epoch and its inbox; None otherwise. One read
        tells a caller whether it may call without the lock, with which
        epoch, and where a plain success goes (see `absorb`)."""
        self.open_until = self.opened_at = 0.0
        self.opened_by: BaseException | None = None
        """The failure that opened it, detached (see `detached`); None
        while closed."""
        self.interval = config.open_interval
        self.probes: dict[int, float] = {}
        """Half-open probes in flight: permit number -> start time."""
        self._holders: dict[int, weakref.ref[BreakerPermit]] = {}
        """The probes' permits, weakly: a dropped one frees its slot."""
        self.successes = 0
        self._seq = 0
        self.times_opened = 0
        self.rejected = 0
        self.outbox: list[BreakerTransition] = []

    def admit(self, now: float, owner: Any = None) -> BreakerPermit | Reject:
        """
        A permit to call now, or a rejection with the wait for a probe; the
        permit is *owner*'s (default: the machine's own *owner*).
        """
        got = self.admit_or_wait(now, owner)
        if type(got) is BreakerPermit:
            return got
        return Reject(got, self.state)

    def admit_or_wait(
        self, now: float, owner: Any = None
    ) -> BreakerPermit | float:
        """
        `admit` without a record for the rejection: a permit, or the
        seconds until a probe (the rejection's state is `state` then).
        """
        if owner is None:
            owner = self.owner
        state = self.state
        if state is _CLOSED:
            return BreakerPermit(owner, self.epoch, now, 0)
        if state is _OPEN:
            if now < self.opened_at:
                self._reopen(now)  # The clock was swapped for a lower one.
            if now >= self.open_until:
                self._move(_HALF_OPEN, "open_interval_passed", now)
            else:
                self.rejected += 1
                return self.open_until - now
        elif state is not _HALF_OPEN:
            self.rejected += 1
            return math.inf
        probes = self.probes
        if probes:
            self._reap(now)
            if (
                probes
                and now - min(probes.values()) >= self.config.probe_timeout
            ):
                self._trip("probe_timeout", now, None)
                self.rejected += 1
                return self.interval
            if len(probes) >= self.config.half_open_probes:
                self.rejected += 1
                return self.retry_after(now)
        self._seq += 1
        seq = self._seq
        permit = BreakerPermit(owner, self.epoch, now, seq)
        ref = weakref.ref(permit)
        # Both entries in two stores with no call between them: an
        # asynchronous exception lands before both or after both, never
        # leaving a probe whose permit nobody can see dropped.
        probes[seq] = now
        self._holders[seq] = ref
        return permit

    def settle(
        self,
        epoch: int,
        probe: int,
        outcome: int,
        duration: float,
        now: float,
        *,
        exc: BaseException | None = None,
    ) -> BreakerTransition | None:
        """
        Count the *outcome* of a call admitted at *epoch* (as probe number
        *probe*, or 0) that took *duration* seconds and raised *exc* (or
        nothing); the state change, if any. The one way an outcome enters
        the machine.

        A call admitted before the latest state change counts for nothing.
        """
        if epoch != self.epoch:
            return None
        if probe:
            return self._probe_ended(probe, outcome, duration, now, exc)
        if outcome == IGNORE:
            return None
        self.absorb()
        code = outcome | (SLOW if duration >= self.slow else 0)
        w = self.window
        w.add(code, now)
        calls = w.calls
        if calls >= self._min_calls:
            if w.failures >= calls * self._fail_rate:
                return self._trip("failure_rate", now, exc)
            if w.slow >= calls * self._slow_rate:
                return self._trip("slow_call_rate", now, exc)
        return None

    def absorb(self) -> None:
        """
        Move the inbox's successes into the window.

        A success of a closed call that was not slow can only lower the
        rates, so the shell counts it without the lock: it appends the
        call's end time to the closed epoch's inbox (one atomic step), and
        the machine takes the inbox in before anything reads the window.
        A success from an epoch that ended lands in an inbox nobody reads.
        """
        gate = self.gate
        if gate is not None and gate[1]:
            self.window.take(gate[1])

    def record(
        self,
        permit: BreakerPermit,
        outcome: int,
        duration: float,
        now: float,
        exc: BaseException | None = None,
    ) -> BreakerTransition | None:
        """`settle` for a permit (the simulator's form)."""
        return self.settle(
            permit.epoch, permit.probe, outcome, duration, now, exc=exc
        )

    def _probe_ended(
        self,
        probe: int,
        outcome: int,
        duration: float,
        now: float,
        exc: BaseException | None,
    ) -> BreakerTransition | None:
        """A half-open probe of the current epoch ended."""
        start = self.probes.pop(probe, None)
        self._holders.pop(probe, None)
        if start is None or outcome == IGNORE:
            return None  # Reaped already, or released without counting.
        if now - start >= self.config.probe_timeout:
            return self._trip("probe_timeout", now, exc)
        if outcome == FAILURE or duration >= self.slow:
            return self._trip("probe_failed", now, exc)
        self.successes += 1
        if self.successes >= self.config.half_open_probes:
            return self._move(_CLOSED, "probes_succeeded", now)
        return None

    def _reap(self, now: float) -> None:
        """
        Free the slots of probes whose permits were dropped unsettled, and
        re-time probes that started "after" *now* (a swapped clock).
        """
        probes, holders = self.probes, self._holders
        for seq in [s for s, ref in holders.items() if ref() is None]:
            del holders[seq]
            probes.pop(seq, None)
        for seq, start in probes.items():
            if start > now:
                probes[seq] = now

    def retry_after(self, now: float) -> float:
        """Seconds until `admit` would admit a call; 0 if it would now."""
        state = self.state
        if state is _CLOSED:
            return 0.0
        if state is _OPEN:
            if now < self.opened_at:
                self._reopen(now)
            return max(0.0, self.open_until - now)
        if state is _FORCED_OPEN:
            return math.inf
        probes = self.probes
        if probes:
            self._reap(now)
        if probes:
            oldest = min(probes.values())
            timeout = self.config.probe_timeout
            if now - oldest >= timeout:
                return self._next_interval()  # It re-opens on next admit.
            if len(probes) >= self.config.half_open_probes:
                # A slot frees when a probe ends, at the latest when it
                # times out; never promise a longer wait than re-opening
                # would cost, or waiting callers outlast a recovery.
                return min(oldest + timeout - now, self._next_interval())
        return 0.0

    def force_open(self, now: float) -> BreakerTransition | None:
        """Reject everything until `reset`."""
        if self.state is _FORCED_OPEN:
            return None
        return self._move(_FORCED_OPEN, "forced", now)

    def reset(self, now: float) -> BreakerTransition | None:
        """Close and forget the window (and any forced opening)."""
        if self.state is _CLOSED:
            self.absorb()
            self.window.clear()
            self.interval = self.config.open_interval
            return None
        return self._move(_CLOSED, "reset", now)

    def pristine(self) -> bool:
        """
        Whether it holds nothing a new configuration would lose: closed
        since it was made, with an empty window.
        """
        self.absorb()
        return (
            self.state is _CLOSED
            and self.window.calls == 0
            and self.times_opened == 0
        )

    def statistics(self, now: float) -> BreakerStatistics:
        """A snapshot as of *now*."""
        retry_after = self.retry_after(now)
        self.absorb()
        w = self.window
        w.expire(now)
        calls = w.calls
        return BreakerStatistics(
            name=self.name,
            state=self.state,
            calls=calls,
            failures=w.failures,
            slow_calls=w.slow,
            failure_rate=w.failures / calls if calls else 0.0,
            slow_call_rate=w.slow / calls if calls else 0.0,
            probes_in_flight=len(self.probes),
            retry_after=retry_after,
            times_opened=self.times_opened,
            rejected=self.rejected,
        )

    def _next_interval(self) -> float:
        """The open interval of a re-opening from half-open."""
        c = self.config
        return min(self.interval * c.open_interval_growth, c.max_open_interval)

    def _reopen(self, now: float) -> None:
        """The clock reads earlier than the opening: open from *now*."""
        self.opened_at = now
        self.open_until = now + self.interval

    def _trip(
        self,
        reason: TransitionReason,
        now: float,
        exc: BaseException | None,
    ) -> BreakerTransition:
        interval = (
            self._next_interval()
            if self.state is _HALF_OPEN
            else self.interval
        )
        opened_by = None if exc is None else detached(exc)
        return self._move(_OPEN, reason, now, interval, opened_by)

    def _move(
        self,
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
