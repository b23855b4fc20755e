"""
Circuit breakers: one pure machine, the sync and async shells, a registry.

`_BreakerMachine` decides (admit, reject, open, close) from outcomes and the
time it is handed; it never reads a clock, waits or calls out. A
`CircuitBreaker` wraps one machine in a short `threading.Lock` that is never
held while the protected call runs nor across an ``await``, so threads and
event loops share one breaker per dependency. After the lock is released the
shells report state changes: span events, metrics, then listeners.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import math
import threading
import weakref
from collections import OrderedDict
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    ParamSpec,
    TypeAlias,
    TypeVar,
    final,
)

import attrs
from opentelemetry import trace as otel_trace

from resilient._core import _clock
from resilient._core._config_breaker import BreakerConfig, CountWindow
from resilient._core._decorate import decorate, is_async_callable
from resilient._core._telemetry import disabled, instruments
from resilient._core._validate import check_name
from resilient._core._validate import same_config as _same
from resilient.exceptions import (
    CircuitOpen,
    ConfigError,
    ConfigTypeError,
    DeadlineExceeded,
)


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from opentelemetry.metrics import Counter, Meter


P = ParamSpec("P")
T = TypeVar("T")

log: Final = logging.getLogger("resilient")


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

    .. versionadded:: 26.11.0
    """

    name: str
    old: BreakerState
    new: BreakerState
    reason: TransitionReason
    at: float
    retry_after: float


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


# Outcomes, as the machine takes them.
SUCCESS: Final = 0
FAILURE: Final = 1
IGNORE: Final = 2
_SLOW: Final = 2  # The slow bit of a window entry; FAILURE is the other.

_BUCKETS: Final = 60


@final
class _CountRing:
    """The last *size* outcomes in a ring of bytes, with running totals."""

    __slots__ = ("_i", "_ring", "calls", "failures", "slow")

    def __init__(self, size: int) -> None:
        self._ring = bytearray(size)
        self._i = 0
        self.calls = self.failures = self.slow = 0

    def add(self, code: int, now: float) -> None:
        ring, i = self._ring, self._i
        if self.calls == len(ring):
            old = ring[i]
            self.failures -= old & FAILURE
            self.slow -= old >> 1
        else:
            self.calls += 1
        ring[i] = code
        self.failures += code & FAILURE
        self.slow += code >> 1
        self._i = i + 1 if i + 1 < len(ring) else 0

    def expire(self, now: float) -> None:
        """Nothing expires by time in a count window."""

    def clear(self) -> None:
        self._ring[:] = bytes(len(self._ring))
        self._i = self.calls = self.failures = self.slow = 0


@final
class _TimeRing:
    """
    The last *seconds* of outcomes in 60 buckets, with running totals;
    a bucket is emptied when time moves past it, so memory stays fixed.
    """

    __slots__ = (
        "_c",
        "_f",
        "_head",
        "_s",
        "_width",
        "calls",
        "failures",
        "slow",
    )

    def __init__(self, seconds: float) -> None:
        self._width = seconds / _BUCKETS
        self._c = [0] * _BUCKETS
        self._f = [0] * _BUCKETS
        self._s = [0] * _BUCKETS
        self._head = -(1 << 62)
        self.calls = self.failures = self.slow = 0

    def expire(self, now: float) -> None:
        """Empty the buckets time has moved past."""
        b = int(now // self._width)
        head = self._head
        if b <= head:
            return
        if b - head >= _BUCKETS:
            self.clear()
        else:
            c, f, s = self._c, self._f, self._s
            for i in range(head + 1, b + 1):
                j = i % _BUCKETS
                self.calls -= c[j]
                self.failures -= f[j]
                self.slow -= s[j]
                c[j] = f[j] = s[j] = 0
        self._head = b

    def add(self, code: int, now: float) -> None:
        if now // self._width > self._head:
            self.expire(now)
        j = self._head % _BUCKETS
        self._c[j] += 1
        self.calls += 1
        if code:
            if code & FAILURE:
                self._f[j] += 1
                self.failures += 1
            if code & _SLOW:
                self._s[j] += 1
                self.slow += 1

    def clear(self) -> None:
        for bucket in (self._c, self._f, self._s):
            bucket[:] = [0] * _BUCKETS
        self.calls = self.failures = self.slow = 0


@final
class _BreakerMachine:
    """
    The decisions of one breaker, and nothing else: no clock, no lock, no
    I/O. Every method takes the time; every state change is appended to
    `outbox` for the shell to report once its lock is released.

    Args:
        config: The thresholds and timings.
        name: The breaker's name, copied into transitions.
        owner: Handed to each permit (the `CircuitBreaker`); opaque here.
    """

    __slots__ = (
        "_fail_rate",
        "_min_calls",
        "_seq",
        "_slow",
        "_slow_rate",
        "config",
        "epoch",
        "interval",
        "name",
        "open_until",
        "outbox",
        "owner",
        "probes",
        "rejected",
        "state",
        "successes",
        "timed",
        "times_opened",
        "window",
    )

    def __init__(
        self, config: BreakerConfig, name: str = "", owner: Any = None
    ) -> None:
        self.config = config
        self.name = name
        self.owner = owner
        w = config.window
        self.window: _CountRing | _TimeRing = (
            _CountRing(w.size)
            if isinstance(w, CountWindow)
            else _TimeRing(w.seconds)
        )
        self._min_calls = config.minimum_calls
        self._fail_rate = config.failure_rate
        self._slow_rate = config.slow_call_rate
        slow = config.slow_call_duration
        self._slow = math.inf if slow is None else slow
        self.timed = slow is not None
        """Whether a call's duration matters while closed."""
        self.state = _CLOSED
        self.epoch = 0
        """Bumped on every state change: older permits no longer count."""
        self.open_until = 0.0
        self.interval = config.open_interval
        self.probes: dict[int, float] = {}
        """Half-open probes in flight: permit number -> start time."""
        self.successes = 0
        self._seq = 0
        self.times_opened = 0
        self.rejected = 0
        self.outbox: list[BreakerTransition] = []

    def admit(self, now: float) -> BreakerPermit | Reject:
        """A permit to call now, or a rejection with the wait for a probe."""
        state = self.state
        if state is _CLOSED:
            return BreakerPermit(self.owner, self.epoch, now, 0)
        if state is _OPEN and now >= self.open_until:
            self._move(_HALF_OPEN, "open_interval_passed", now)
        elif state is not _HALF_OPEN:
            self.rejected += 1
            return Reject(self.retry_after(now), state)
        probes = self.probes
        if probes and now - min(probes.values()) >= self.config.probe_timeout:
            self._trip("probe_timeout", now)
            self.rejected += 1
            return Reject(self.interval, _OPEN)
        if len(probes) >= self.config.half_open_probes:
            self.rejected += 1
            return Reject(self.retry_after(now), _HALF_OPEN)
        self._seq += 1
        probes[self._seq] = now
        return BreakerPermit(self.owner, self.epoch, now, self._seq)

    def record(
        self,
        permit: BreakerPermit,
        outcome: int,
        duration: float,
        now: float,
    ) -> BreakerTransition | None:
        """
        Count a settled permit's *outcome* (`SUCCESS`, `FAILURE` or
        `IGNORE`) that took *duration* seconds; the state change, if any.

        A permit from before the latest state change counts for nothing.
        """
        if permit.epoch != self.epoch or outcome == IGNORE:
            if permit.probe and permit.epoch == self.epoch:
                del self.probes[permit.probe]  # Released, not counted.
            return None
        if self.state is _CLOSED:
            return self.record_closed(outcome, duration, now)
        return self._probe_ended(permit, outcome, duration, now)

    def record_closed(
        self, outcome: int, duration: float, now: float
    ) -> BreakerTransition | None:
        """Count an outcome (not `IGNORE`) of a call made while closed."""
        code = outcome | (_SLOW if duration >= self._slow else 0)
        w = self.window
        w.add(code, now)
        calls = w.calls
        if calls >= self._min_calls:
            if w.failures >= calls * self._fail_rate:
                return self._trip("failure_rate", now)
            if w.slow >= calls * self._slow_rate:
                return self._trip("slow_call_rate", now)
        return None

    def _probe_ended(
        self,
        permit: BreakerPermit,
        outcome: int,
        duration: float,
        now: float,
    ) -> BreakerTransition | None:
        """A half-open probe of the current epoch succeeded or failed."""
        start = self.probes.pop(permit.probe)
        if now - start >= self.config.probe_timeout:
            return self._trip("probe_timeout", now)
        if outcome == FAILURE or duration >= self._slow:
            return self._trip("probe_failed", now)
        self.successes += 1
        if self.successes >= self.config.half_open_probes:
            return self._move(_CLOSED, "probes_succeeded", now)
        return None

    def retry_after(self, now: float) -> float:
        """Seconds until `admit` would admit a call; 0 if it would now."""
        state = self.state
        if state is _CLOSED:
            return 0.0
        if state is _OPEN:
            return max(0.0, self.open_until - now)
        if state is _FORCED_OPEN:
            return math.inf
        probes = self.probes
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
        self.times_opened += 1
        return self._move(_FORCED_OPEN, "forced", now)

    def reset(self, now: float) -> BreakerTransition | None:
        """Close and forget the window (and any forced opening)."""
        if self.state is _CLOSED:
            self.window.clear()
            self.interval = self.config.open_interval
            return None
        return self._move(_CLOSED, "reset", now)

    def statistics(self, now: float) -> BreakerStatistics:
        """A snapshot as of *now*."""
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
            retry_after=self.retry_after(now),
            times_opened=self.times_opened,
            rejected=self.rejected,
        )

    def _next_interval(self) -> float:
        """The open interval of a re-opening from half-open."""
        c = self.config
        return min(self.interval * c.open_interval_growth, c.max_open_interval)

    def _trip(self, reason: TransitionReason, now: float) -> BreakerTransition:
        if self.state is _HALF_OPEN:
            self.interval = self._next_interval()
        self.open_until = now + self.interval
        self.times_opened += 1
        return self._move(_OPEN, reason, now)

    def _move(
        self, new: BreakerState, reason: TransitionReason, now: float
    ) -> BreakerTransition:
        old, self.state = self.state, new
        self.epoch += 1
        self.probes.clear()
        self.successes = 0
        if new is _CLOSED:
            self.window.clear()
            self.interval = self.config.open_interval
        event = BreakerTransition(
            self.name, old, new, reason, now, self.retry_after(now)
        )
        self.outbox.append(event)
        return event


@final
class BreakerPermit:
    """
    Leave to make one call through a breaker; settle it exactly once.

    Call `success`, `failure` or `ignore` when the call ends (the ``a``
    twins from async code, so that async listeners are awaited). A second
    settlement is a no-op. A permit is for one caller: do not share it.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("_breaker", "_done", "epoch", "probe", "start")

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
        self._breaker._settle(self, self._breaker._outcome(exc))  # noqa: SLF001

    def ignore(self) -> None:
        """Release without counting (the call was not the dependency's
        fault: a full bulkhead, the caller's own cancellation)."""
        self._breaker._settle(self, IGNORE)  # noqa: SLF001

    async def asuccess(self) -> None:
        """`success`, awaiting async listeners."""
        await self._breaker._asettle(self, SUCCESS)  # noqa: SLF001

    async def afailure(self, exc: BaseException) -> None:
        """`failure`, awaiting async listeners."""
        outcome = self._breaker._outcome(exc)  # noqa: SLF001
        await self._breaker._asettle(self, outcome)  # noqa: SLF001

    async def aignore(self) -> None:
        """`ignore`, awaiting async listeners."""
        await self._breaker._asettle(self, IGNORE)  # noqa: SLF001


_VERDICTS: Final = {"failure": FAILURE, "success": SUCCESS, "ignore": IGNORE}

Listener: TypeAlias = "Callable[[BreakerTransition], object]"
"""A state-change listener: sync, or a coroutine function."""

_Stack: TypeAlias = "tuple[BreakerPermit, _Stack] | None"


@final
class CircuitBreaker:
    """
    The circuit breaker of one dependency; get it with `resilient.breaker`.

    Use it as a decorator (sync or async functions), as a context manager
    (``with`` and ``async with``), or through `acquire` and the permit.
    One breaker serves threads and event loops at once: its lock guards a
    few counters and is never held while the call runs.

    Args:
        name: The dependency's name.
        config: How it decides; the defaults of `BreakerConfig` if None.

    .. versionadded:: 26.11.0
    """

    __slots__ = (
        "__weakref__",
        "_entered",
        "_listeners",
        "_lock",
        "_m",
        "_registered",
        "config",
        "name",
    )

    def __init__(self, name: str, config: BreakerConfig | None = None) -> None:
        _check_name(name)
        if config is None:
            config = BreakerConfig()
        elif not isinstance(config, BreakerConfig):
            raise ConfigTypeError(
                "breaker(config)", config, "must be a resilient.BreakerConfig"
            )
        self.name = name
        self.config = config
        self._lock = threading.Lock()
        self._m = _BreakerMachine(config, name, self)
        self._listeners: tuple[tuple[Listener, bool], ...] = ()
        self._entered: contextvars.ContextVar[_Stack] = contextvars.ContextVar(
            f"resilient_breaker_{name}", default=None
        )
        self._registered = False

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name!r} {self._m.state.value}>"

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker whose interval has passed still
        reads open until the next call is admitted)."""
        return self._m.state

    def retry_after(self) -> float:
        """Seconds until a call would be admitted: 0 when one would be now,
        `math.inf` when forced open."""
        now = _clock.get_clock().now()
        with self._lock:
            return self._m.retry_after(now)

    def statistics(self) -> BreakerStatistics:
        """An immutable snapshot of the window, state and counters."""
        now = _clock.get_clock().now()
        with self._lock:
            return self._m.statistics(now)

    # Listeners.

    def add_listener(self, listener: Listener) -> None:
        """
        Call *listener* with a `BreakerTransition` on every state change.

        Sync listeners run wherever the change happens. Async ones (a
        coroutine function) are awaited when the change happens in async
        code and skipped when it happens in sync code. A listener that
        raises is logged and changes nothing.
        """
        if not callable(listener):
            raise ConfigTypeError(
                "add_listener(listener)", listener, "must be callable"
            )
        with self._lock:
            self._listeners += ((listener, is_async_callable(listener)),)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling *listener*; no error if it was not added."""
        with self._lock:
            self._listeners = tuple(
                x for x in self._listeners if x[0] != listener
            )

    # Manual control.

    def force_open(self) -> None:
        """Reject every call until `reset` (sync listeners only)."""
        self._apply(self._m.force_open)

    def reset(self) -> None:
        """Close, empty the window and undo `force_open` (sync listeners
        only)."""
        self._apply(self._m.reset)

    def _apply(self, op: Callable[[float], object]) -> None:
        now = _clock.get_clock().now()
        with self._lock:
            op(now)
            events = self._drain()
        if events:
            self._notify(events)

    # The permit protocol.

    # A closed breaker admits without taking the lock: admitting then
    # changes nothing, and the epoch read before the state makes a permit
    # that races a state change stale (its outcome is not counted), never
    # wrong.

    def acquire(self) -> BreakerPermit:
        """
        Leave to make one call now.

        Raises:
            CircuitOpen: The breaker rejects the call; its ``retry_after``
                says when a probe will be admitted.
        """
        m = self._m
        epoch = m.epoch  # Read before the state (see above).
        if m.state is _CLOSED:
            start = _clock._clock.now() if m.timed else 0.0  # noqa: SLF001
            return BreakerPermit(self, epoch, start, 0)
        got, events = self._admit()
        if events:
            self._notify(events)
        if type(got) is Reject:
            raise self._rejected(got)
        return got

    async def aacquire(self) -> BreakerPermit:
        """`acquire` from async code: async listeners are awaited."""
        permit = self._closed_permit()
        if permit is not None:
            return permit
        got, events = self._admit()
        if events:
            await self._anotify(events)
        if type(got) is Reject:
            raise self._rejected(got)
        return got

    def _closed_ticket(self) -> tuple[int, float] | None:
        """
        The epoch and start time of a call admitted while closed, without
        a permit object or the lock (see above); None if not closed.
        Settle it with `_settle_closed` / `_asettle_closed`.
        """
        m = self._m
        epoch = m.epoch
        if m.state is _CLOSED:
            return epoch, _clock._clock.now() if m.timed else 0.0  # noqa: SLF001
        return None

    def _closed_permit(self) -> BreakerPermit | None:
        """A permit, without the lock, if closed (see above); else None."""
        m = self._m
        epoch = m.epoch
        if m.state is _CLOSED:
            start = _clock._clock.now() if m.timed else 0.0  # noqa: SLF001
            return BreakerPermit(self, epoch, start, 0)
        return None

    def _admit(
        self,
    ) -> tuple[BreakerPermit | Reject, list[BreakerTransition] | None]:
        """The machine's answer, and the state changes to report."""
        now = _clock.get_clock().now()
        with self._lock:
            got = self._m.admit(now)
            events = self._drain() if self._m.outbox else None
        return got, events

    def _record(
        self, permit: BreakerPermit, outcome: int
    ) -> list[BreakerTransition] | None:
        """Settle *permit*; the state changes to report, if any."""
        # The hot path of every call: acquire()/release() costs half of
        # `with`, and the clock is read off the module (no call).
        now = _clock._clock.now()  # noqa: SLF001
        lock = self._lock
        lock.acquire()
        try:
            if permit._done:  # noqa: SLF001
                return None
            permit._done = True  # noqa: SLF001
            m = self._m
            m.record(permit, outcome, now - permit.start, now)
            return self._drain() if m.outbox else None
        finally:
            lock.release()

    def _record_closed(
        self, epoch: int, start: float, outcome: int
    ) -> list[BreakerTransition] | None:
        """Count a call admitted while closed at *epoch* (no permit)."""
        if outcome == IGNORE:
            return None
        now = _clock._clock.now()  # noqa: SLF001
        lock = self._lock
        lock.acquire()
        try:
            m = self._m
            if epoch != m.epoch:
                return None  # The state changed meanwhile: a stale call.
            m.record_closed(outcome, now - start, now)
            return self._drain() if m.outbox else None
        finally:
            lock.release()

    def _settle_closed(self, epoch: int, start: float, outcome: int) -> None:
        events = self._record_closed(epoch, start, outcome)
        if events:
            self._notify(events)

    async def _asettle_closed(
        self, epoch: int, start: float, outcome: int
    ) -> None:
        events = self._record_closed(epoch, start, outcome)
        if events:
            await self._anotify(events)

    def _settle(self, permit: BreakerPermit, outcome: int) -> None:
        events = self._record(permit, outcome)
        if events:
            self._notify(events)

    async def _asettle(self, permit: BreakerPermit, outcome: int) -> None:
        events = self._record(permit, outcome)
        if events:
            await self._anotify(events)

    def _outcome(self, exc: BaseException) -> int:
        return _VERDICTS[self.config.verdict(exc)]

    def _drain(self) -> list[BreakerTransition]:
        events, self._m.outbox = self._m.outbox, []
        return events

    def _rejected(self, reject: Reject) -> CircuitOpen:
        _report_rejection(self.name, reject)
        return CircuitOpen(self.name, reject.retry_after, reject.state.value)

    # Reporting, outside the lock.

    def _notify(self, events: list[BreakerTransition]) -> None:
        for event in events:
            self._report(event)
            for listener, is_async in self._listeners:
                if is_async:
                    log.debug(
                        "resilient: async listener %r skipped: breaker %r "
                        "changed state in sync code",
                        listener,
                        self.name,
                    )
                    continue
                try:
                    listener(event)
                except Exception:
                    log.exception("resilient: listener %r raised", listener)

    async def _anotify(self, events: list[BreakerTransition]) -> None:
        for event in events:
            self._report(event)
            for listener, is_async in self._listeners:
                try:
                    if is_async:
                        await listener(event)  # type: ignore[misc]
                    else:
                        listener(event)
                except Exception:
                    log.exception("resilient: listener %r raised", listener)

    def _report(self, event: BreakerTransition) -> None:
        if self._registered and event.new is not _CLOSED:
            _REGISTRY.pin(self)
        _report_transition(event)

    # Decorator and context manager.

    def __call__(self, fn: Callable[P, T], /) -> Callable[P, T]:
        """Guard *fn* (sync or async) with this breaker: ``@breaker``."""
        return decorate(fn, self._call, self._acall)

    def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        m = self._m
        epoch = m.epoch  # Read before the state, as in acquire().
        if m.state is _CLOSED:
            # The decorator's closed path needs no permit object.
            start = _clock._clock.now() if m.timed else 0.0  # noqa: SLF001
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                self._settle_closed(epoch, start, self._outcome(exc))
                raise
            self._settle_closed(epoch, start, SUCCESS)
            return result
        permit = self.acquire()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._settle(permit, self._outcome(exc))
            raise
        self._settle(permit, SUCCESS)
        return result

    async def _acall(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        m = self._m
        epoch = m.epoch
        if m.state is _CLOSED:
            # As in `_call`: the closed path needs no permit object.
            start = _clock._clock.now() if m.timed else 0.0  # noqa: SLF001
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                outcome = self._outcome(exc)
                if isinstance(exc, Exception):
                    await self._asettle_closed(epoch, start, outcome)
                else:
                    self._settle_closed(epoch, start, outcome)
                raise
            await self._asettle_closed(epoch, start, SUCCESS)
            return result
        permit = await self.aacquire()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            await self._asettle(permit, self._outcome(exc))
            raise
        await self._asettle(permit, SUCCESS)
        return result

    def _leave(
        self, exc: BaseException | None
    ) -> list[BreakerTransition] | None:
        """Settle the innermost entered permit (both context managers)."""
        top = self._entered.get()
        if top is None:
            raise self._unbalanced()
        self._entered.set(top[1])
        return self._record(
            top[0], SUCCESS if exc is None else self._outcome(exc)
        )

    def _unbalanced(self) -> RuntimeError:
        return RuntimeError(
            f"breaker {self.name!r} exited more often than entered"
        )

    def __enter__(self) -> BreakerPermit:
        permit = self.acquire()
        entered = self._entered
        entered.set((permit, entered.get()))
        return permit

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        events = self._leave(exc)
        if events:
            self._notify(events)

    async def __aenter__(self) -> BreakerPermit:
        permit = self._closed_permit() or await self.aacquire()
        entered = self._entered
        entered.set((permit, entered.get()))
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        events = self._leave(exc)
        if events:
            await self._anotify(events)


def attempt_outcome(
    cb: CircuitBreaker, exc: BaseException | None, *, own_timeout: bool
) -> int:
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
    return cb._outcome(exc)  # noqa: SLF001


def _check_name(name: object) -> None:
    check_name("breaker(name)", name)


# Telemetry: span events on the caller's current span, and two counters.


@final
class _Meters:
    """The breaker's instruments on resilient's meter."""

    __slots__ = ("rejections", "transitions")

    def __init__(self, meter: Meter) -> None:
        self.transitions: Counter = meter.create_counter(
            "resilient.breaker.transitions",
            unit="{transition}",
            description="Circuit breaker state changes.",
        )
        self.rejections: Counter = meter.create_counter(
            "resilient.breaker.rejections",
            unit="{call}",
            description="Calls a circuit breaker rejected.",
        )


def _instruments() -> _Meters | None:
    """The breaker's instruments, made once per meter provider."""
    return instruments("breaker", _Meters)


def _report(
    counter: str, event: str, labels: dict[str, str], retry_after: float
) -> None:
    """Count on *counter* and add *event* to the caller's current span."""
    meters = _instruments()
    if meters is not None:
        getattr(meters, counter).add(1, labels)
    span = otel_trace.get_current_span()
    if span.is_recording():
        span.add_event(
            event, {**labels, "resilient.breaker.retry_after": retry_after}
        )


def _report_transition(event: BreakerTransition) -> None:
    labels = {
        "resilient.breaker": event.name,
        "resilient.breaker.from": event.old.value,
        "resilient.breaker.state": event.new.value,
        "resilient.breaker.reason": event.reason,
    }
    _report(
        "transitions",
        "resilient.breaker.state_change",
        labels,
        event.retry_after,
    )


def _report_rejection(name: str, reject: Reject) -> None:
    if disabled():
        return  # No SDK anywhere: nothing would record the event.
    labels = {
        "resilient.breaker": name,
        "resilient.breaker.state": reject.state.value,
    }
    _report(
        "rejections", "resilient.breaker.rejected", labels, reject.retry_after
    )


# The registry.

DEFAULT_MAX_BREAKERS: Final = 1024


@final
class _Registry:
    """
    One breaker per name, process-wide, bounded.

    At most *max_size* closed breakers are kept alive by the registry
    (least recently looked up go first); open, half-open and forced-open
    ones are always kept. A breaker dropped from the bound is still found
    by name while anything else holds it (a decorated function does), so
    one name never has two live breakers.
    """

    def __init__(self, max_size: int = DEFAULT_MAX_BREAKERS) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, CircuitBreaker] = OrderedDict()
        self._live: weakref.WeakValueDictionary[str, CircuitBreaker] = (
            weakref.WeakValueDictionary()
        )
        self._defaults: dict[str | None, BreakerConfig] = {}
        self.max_size = max_size

    def get(self, name: str, config: BreakerConfig | None) -> CircuitBreaker:
        with self._lock:
            cb = self._live.get(name)
            if cb is None:
                if config is None:
                    config = self._defaults.get(name) or self._defaults.get(
                        None
                    )
                cb = CircuitBreaker(name, config)
                cb._registered = True  # noqa: SLF001
                self._live[name] = cb
            elif config is not None and not _same(config, cb.config):
                raise ConfigError(
                    f"breaker({name!r}).config",
                    config,
                    "differs from the config the breaker already has "
                    f"({cb.config!r}); one name, one config",
                )
            self._keep(cb)
            return cb

    def pin(self, cb: CircuitBreaker) -> None:
        """Keep *cb* (it just left the closed state) while it is ours."""
        with self._lock:
            if self._live.get(cb.name) is cb:
                self._keep(cb)

    def _keep(self, cb: CircuitBreaker) -> None:
        kept = self._kept
        kept[cb.name] = cb
        kept.move_to_end(cb.name)
        excess = len(kept) - self.max_size
        if excess > 0:
            for name in [
                n
                for n, b in kept.items()
                if b.state is _CLOSED and b is not cb
            ][:excess]:
                del kept[name]

    def set_default(self, config: BreakerConfig, name: str | None) -> None:
        with self._lock:
            self._defaults[name] = config

    def clear(self) -> None:
        """Forget every breaker and default (for tests)."""
        with self._lock:
            self._kept.clear()
            self._live.clear()
            self._defaults.clear()

    def kept(self) -> list[str]:
        """The names kept alive by the registry, least recent first."""
        with self._lock:
            return list(self._kept)


def _check_config(config: object) -> None:
    if not isinstance(config, BreakerConfig):
        raise ConfigTypeError(
            "breaker(config)", config, "must be a resilient.BreakerConfig"
        )


_REGISTRY: Final = _Registry()


def breaker(name: str, config: BreakerConfig | None = None) -> CircuitBreaker:
    """
    The process-wide circuit breaker of the dependency *name*.

    The first call for a name makes the breaker, with *config*, or the
    defaults registered with `set_breaker_defaults` for that name, or for
    every name, or `BreakerConfig()`. Later calls return the same breaker;
    asking with a *config* that differs from the one it has raises
    `ConfigError` (one name, one behaviour), and asking with None accepts
    whatever it has.

    The returned breaker is a decorator and a context manager, sync and
    async alike.

    Args:
        name: The dependency's name (not empty).
        config: How the breaker decides; None for the registered defaults.

    Raises:
        ConfigError: *config* differs from the existing breaker's, or
            *name* is empty.
        ConfigTypeError: *name* is not a str or *config* is not a
            `BreakerConfig`.

    Example:
        >>> import resilient
        >>> payments = resilient.breaker("payments")
        >>> payments is resilient.breaker("payments")
        True
        >>> payments.state
        <BreakerState.CLOSED: 'closed'>

    .. versionadded:: 26.11.0
    """
    _check_name(name)
    if config is not None:
        _check_config(config)
    return _REGISTRY.get(name, config)


get_breaker: Final = breaker
"""The registry lookup, under the name the pipeline uses."""


def set_breaker_defaults(
    config: BreakerConfig, *, name: str | None = None
) -> None:
    """
    Register the configuration breakers get when made without one.

    Applies to breakers made after the call; an existing breaker keeps its
    configuration.

    Args:
        config: The defaults.
        name: Only for the breaker of this name; None for every name
            without defaults of its own.

    .. versionadded:: 26.11.0
    """
    _check_config(config)
    if name is not None:
        _check_name(name)
    _REGISTRY.set_default(config, name)
