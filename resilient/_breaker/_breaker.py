"""
The circuit breaker's shells: `CircuitBreaker`, sync and async alike.

A `CircuitBreaker` wraps one `_BreakerMachine` in a short `threading.Lock`
that is never held while the protected call runs nor across an ``await``,
so threads and event loops share one breaker per dependency. After the lock
is released the shell reports state changes: span events, metrics, then
listeners.

Asynchronous exceptions (``KeyboardInterrupt``, the interrupt of
``timeout(interrupt=True)``, ``PyThreadState_SetAsyncExc``) are delivered
only where the interpreter checks for them: after a call returns, at a loop's
back edge, at a function's start. So:

- the lock is only ever taken by ``with self._lock:``, whose acquire and
  entry into the protected block happen in one instruction (``BEFORE_WITH``,
  CPython 3.11 to 3.13) with no check between them;
- a closed call holds nothing: an exception before its outcome is recorded
  leaves it uncounted (as if ignored), after, counted once;
- a half-open probe holds a slot: the machine holds its permit weakly, and
  a permit dropped unsettled frees its slot the next time anyone looks;
- ``with`` keeps each block's permit on an object of that block alone (see
  `_blocks`), so an exception anywhere in ``__exit__`` leaves no entry
  behind that a later block could mistake for its own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    ParamSpec,
    TypeAlias,
    TypeVar,
    final,
)

from resilient._breaker._blocks import (
    ExitSlot,
    aenter_block,
    aexit_block,
    enter_block,
    exit_block,
)
from resilient._breaker._calls import INBOX_LIMIT, async_wrapper, sync_wrapper
from resilient._breaker._machine import (
    _CLOSED,
    _OPEN,
    FAILURE,
    IGNORE,
    SUCCESS,
    UNCOUNTED,
    BreakerPermit,
    BreakerState,
    BreakerStatistics,
    BreakerTransition,
    _BreakerMachine,
)
from resilient._breaker._now import DEFAULT, now
from resilient._breaker._report import report_rejection, report_transition
from resilient._core import _clock
from resilient._core._config_breaker import BreakerConfig, Outcome
from resilient._core._decorate import decorate, is_async_callable
from resilient._core._telemetry import disabled
from resilient._core._validate import check_name
from resilient.exceptions import CircuitOpen, ConfigTypeError, DeadlineExceeded


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator


P = ParamSpec("P")
T = TypeVar("T")

log: Final = logging.getLogger("resilient")

_new_open: Final = CircuitOpen.__new__

Listener: TypeAlias = "Callable[[BreakerTransition], object]"
"""A state-change listener: sync, or a coroutine function."""

Ticket: TypeAlias = "tuple[int, float] | BreakerPermit"
"""What settling a call needs: a closed call's (epoch, start), or a permit."""


def _check_config(config: object, where: str = "breaker(config)") -> None:
    if not isinstance(config, BreakerConfig):
        raise ConfigTypeError(
            where, config, "must be a resilient.BreakerConfig"
        )


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
        "_listeners",
        "_lock",
        "_m",
        "_pinned",
        "config",
        "name",
    )

    def __init__(self, name: str, config: BreakerConfig | None = None) -> None:
        check_name("breaker(name)", name)
        if config is None:
            config = BreakerConfig()
        else:
            _check_config(config)
        self.name = name
        self.config = config
        self._lock = threading.Lock()
        self._m = _BreakerMachine(config, name)
        self._listeners: tuple[tuple[Listener, bool], ...] = ()
        self._pinned = False

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name!r} {self._m.state.value}>"

    @property
    def state(self) -> BreakerState:
        """
        The state now (an open breaker whose interval has passed still
        reads open until the next call is admitted).
        """
        return self._m.state

    def retry_after(self) -> float:
        """
        Seconds until a call would be admitted: 0 when one would be now,
        `math.inf` when forced open; always 0 for a metrics-only breaker
        (its `statistics` say what it would have made callers wait).
        """
        if self.config.metrics_only:
            return 0.0
        t = now()
        with self._lock:
            return self._m.retry_after(t)

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
        entry = (listener, is_async_callable(listener))
        with self._lock:
            self._listeners += (entry,)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling *listener*; no error if it was not added."""
        with self._lock:
            self._listeners = tuple(
                x for x in self._listeners if x[0] != listener
            )

    # Manual control.

    def force_open(self) -> None:
        """Reject every call until `reset` (sync listeners only)."""
        self._apply(_BreakerMachine.force_open)

    def reset(self) -> None:
        """
        Close, empty the window and undo `force_open` (sync listeners
        only).
        """
        self._apply(_BreakerMachine.reset)

    def _apply(self, op: Callable[[_BreakerMachine, float], object]) -> None:
        now = _clock.get_clock().now()
        with self._lock:
            op(self._m, now)
            events = self._drain()
        if events:
            self._notify(events)

    def _rebuild(self, config: BreakerConfig) -> None:
        """
        Start afresh with *config* (the lock held): a new machine whose
        epoch is past the old one's, so calls in flight count for nothing.
        """
        self.config = config
        self._m = _BreakerMachine(config, self.name, epoch=self._m.epoch + 1)

    # Admission: a closed breaker admits without the lock. Admitting then
    # changes nothing, and the machine's `gate` (its epoch and inbox while
    # closed, None otherwise) is one read: a call that races a state change
    # holds an old epoch and counts for nothing, never for the wrong state.

    def fast_admit(self) -> tuple[int, float] | None:
        """
        A closed call's ticket, ``(epoch, start)``, without the lock or a
        permit object; None unless closed. Settle it with `settle`.

        For pipeline stages; most code wants `acquire` or the decorator.
        """
        m = self._m
        gate = m.gate
        if gate is None:
            return None
        return gate[0], now() if m.timed else 0.0

    _closed_ticket = fast_admit

    def acquire(self) -> BreakerPermit:
        """
        Leave to make one call now.

        Raises:
            CircuitOpen: The breaker rejects the call; its ``retry_after``
                says when a probe will be admitted.
        """
        m = self._m
        gate = m.gate
        if gate is not None:
            return BreakerPermit(self, gate[0], now() if m.timed else 0.0, 0)
        t = now()
        if (
            m.state is _OPEN
            and m.enforcing
            and self._pinned  # Else heal the pin on the slow path.
            and m.opened_at <= t < m.open_until
        ):
            raise self._rejection(m, t)
        got, events = self._admission()
        if events:
            self._notify(events)
            if type(got) is CircuitOpen:  # A rejection that changed state.
                raise got
        return got  # type: ignore[return-value]

    async def aacquire(self) -> BreakerPermit:
        """`acquire` from async code: async listeners are awaited."""
        m = self._m
        gate = m.gate
        if gate is not None:
            return BreakerPermit(self, gate[0], now() if m.timed else 0.0, 0)
        t = now()
        if (
            m.state is _OPEN
            and m.enforcing
            and self._pinned  # Else heal the pin on the slow path.
            and m.opened_at <= t < m.open_until
        ):
            raise self._rejection(m, t)
        got, events = self._admission()
        if events:
            await self._anotify(events)
            if type(got) is CircuitOpen:  # A rejection that changed state.
                raise got
        return got  # type: ignore[return-value]

    admit = acquire
    aadmit = aacquire

    def _admission(
        self,
    ) -> tuple[BreakerPermit | CircuitOpen, list[BreakerTransition] | None]:
        """
        The machine's answer under the lock (the breaker is not closed, or
        was not a moment ago), and the state changes to report: a permit,
        or the rejection to raise once they are reported (a rejection that
        changed nothing is raised here). A metrics-only breaker reports the
        rejection and hands out an uncounted permit instead.

        Raised from here, the rejection is never in a local variable of a
        frame its traceback holds: no reference cycle, so no work for the
        garbage collector per rejection.
        """
        c = _clock._clock  # noqa: SLF001
        t = time.monotonic() if c is DEFAULT else c.now()
        with self._lock:
            m = self._m
            got = m.admit_or_wait(t, self)
            if type(got) is not BreakerPermit:
                state = m.state
                opened_by = m.opened_by
            events = self._drain() if m.outbox else None
        if not self._pinned and events is None:
            self._sync_pin()  # Heal a pin an exception interrupted.
        if type(got) is BreakerPermit:
            return got, events
        metrics_only = self.config.metrics_only
        if not disabled():
            report_rejection(self.name, got, state, metrics_only=metrics_only)
        if metrics_only:
            return BreakerPermit(self, UNCOUNTED, t, 0), events
        # Made by __new__ alone, which sets ``args`` (see `CircuitOpen`).
        if events is None:
            raise _new_open(
                CircuitOpen, self.name, got, state.value, opened_by
            )
        return _new_open(
            CircuitOpen, self.name, got, state.value, opened_by
        ), events

    def _rejection(self, m: _BreakerMachine, t: float) -> CircuitOpen:
        """
        The rejection of a call at *t* while *m* is open within its
        interval (`_BreakerMachine.admit_or_wait`'s first rule, written out
        for the hot path), counted and reported; for the caller to raise.

        Decided without the lock: the state, opening and interval are read
        once each, and a read that races a state change rejects as if the
        call had come a moment earlier. The count is one increment with no
        call inside, which CPython (with its GIL) never interrupts.
        """
        m.rejected += 1
        wait = m.open_until - t
        if not disabled():
            report_rejection(self.name, wait, _OPEN)
        return _new_open(CircuitOpen, self.name, wait, "open", m.opened_by)

    # Settling: every outcome enters the machine through `_record`.

    def _record(
        self,
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

        A closed call's success that was not slow goes to the epoch's inbox
        without the lock (it cannot open the breaker; see
        `_BreakerMachine.absorb`), an ignored closed call changes nothing;
        everything else is counted under the lock.
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
            if gate is not None and gate[0] == epoch and t - start < m.slow:
                inbox = gate[1]
                inbox.append(t)
                if len(inbox) >= INBOX_LIMIT:
                    self._absorb()
                return None
        return self._count(epoch, start, probe, outcome, permit, t=t, exc=exc)

    def _absorb(self) -> None:
        """Empty a full inbox into the window."""
        with self._lock:
            self._m.absorb()

    def _count(
        self,
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

    def settle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        exc: BaseException | None = None,
    ) -> None:
        """
        Count a call admitted by `fast_admit` or `admit` that raised *exc*
        (or nothing); a second settlement of a permit is a no-op. For
        pipeline stages.
        """
        if type(ticket) is tuple:
            self._settle_closed(ticket[0], ticket[1], outcome, exc)
        else:
            self._settle(ticket, outcome, exc)  # type: ignore[arg-type]

    async def asettle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        exc: BaseException | None = None,
    ) -> None:
        """`settle` from async code: async listeners are awaited."""
        if type(ticket) is tuple:
            await self._asettle_closed(ticket[0], ticket[1], outcome, exc)
        else:
            await self._asettle(ticket, outcome, exc)  # type: ignore[arg-type]

    def _settle_closed(
        self,
        epoch: int,
        start: float,
        outcome: int,
        exc: BaseException | None = None,
    ) -> None:
        events = self._record(epoch, start, 0, outcome, None, exc=exc)
        if events:
            self._notify(events)

    async def _asettle_closed(
        self,
        epoch: int,
        start: float,
        outcome: int,
        exc: BaseException | None = None,
    ) -> None:
        events = self._record(epoch, start, 0, outcome, None, exc=exc)
        if events:
            await self._anotify(events)

    def _settle(
        self,
        permit: BreakerPermit,
        outcome: int,
        exc: BaseException | None = None,
    ) -> None:
        events = self._record(
            permit.epoch, permit.start, permit.probe, outcome, permit, exc=exc
        )
        if events:
            self._notify(events)

    async def _asettle(
        self,
        permit: BreakerPermit,
        outcome: int,
        exc: BaseException | None = None,
    ) -> None:
        events = self._record(
            permit.epoch, permit.start, permit.probe, outcome, permit, exc=exc
        )
        if events:
            await self._anotify(events)

    def _failed(
        self,
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

    async def _afailed(
        self,
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

    def outcome(self, exc: BaseException) -> Outcome:
        """How *exc* counts for this breaker (its `BreakerConfig.outcome`)."""
        return self.config.outcome(exc)

    _outcome = outcome

    def _drain(self) -> list[BreakerTransition]:
        m = self._m
        events, m.outbox = m.outbox, []
        return events

    # Reporting, outside the lock: one body for both colours.

    def _deliver(
        self, events: list[BreakerTransition], *, awaiting: bool
    ) -> Iterator[Awaitable[object]]:
        """
        Report *events* and call the sync listeners; yield the async
        listeners' awaitables when the caller can await them (else skip
        them).
        """
        self._sync_pin()
        for event in events:
            report_transition(event)
            for listener, is_async in self._listeners:
                if is_async and not awaiting:
                    log.debug(
                        "resilient: async listener %r skipped: breaker %r "
                        "changed state in sync code",
                        listener,
                        self.name,
                    )
                    continue
                try:
                    result = listener(event)
                except Exception:
                    log.exception("resilient: listener %r raised", listener)
                    continue
                if is_async:
                    yield result  # type: ignore[misc]

    def _notify(self, events: list[BreakerTransition]) -> None:
        for _ in self._deliver(events, awaiting=False):
            pass  # pragma: no cover - nothing is yielded when not awaiting

    async def _anotify(self, events: list[BreakerTransition]) -> None:
        for pending in self._deliver(events, awaiting=True):
            try:
                await pending
            except Exception:
                log.exception("resilient: listener %r raised", pending)

    def _sync_pin(self) -> None:
        """
        Keep the registry holding this breaker while it is not closed, and
        let go once it is; read again if the state moved meanwhile.
        """
        from resilient._breaker._registry import REGISTRY  # noqa: PLC0415

        while True:
            m = self._m
            epoch = m.epoch
            busy = m.state is not _CLOSED
            if busy:
                REGISTRY.pin(self.name, self)
            else:
                REGISTRY.unpin(self.name, self)
            self._pinned = busy
            if self._m is m and m.epoch == epoch:
                return

    # Decorator: see `_calls`.

    def __call__(self, fn: Callable[P, T], /) -> Callable[P, T]:
        """
        Guard *fn* (sync or async) with this breaker: ``@breaker``.

        A generator function's stream is admitted at its first ``next``
        and counted when it ends (docs/streams.md).
        """
        from resilient._pipeline._stream import breaker_streams  # noqa: PLC0415 - the pipeline imports the breaker

        return decorate(
            fn,
            self._call,
            self._acall,
            stream=breaker_streams(self),
            wrappers=(
                lambda f: sync_wrapper(self, f),
                lambda f: async_wrapper(self, f),
            ),
        )

    def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        permit: BreakerPermit | None = None,
    ) -> Any:
        """One call under *permit* (taken here when None)."""
        if permit is None:
            permit = self.acquire()
        if permit.epoch == UNCOUNTED:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._failed(permit.epoch, permit.start, permit.probe, permit, exc)
            raise
        self._settle(permit, SUCCESS)
        return result

    async def _acall(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        permit: BreakerPermit | None = None,
    ) -> Any:
        """`_call` from async code."""
        if permit is None:
            permit = await self.aacquire()
        if permit.epoch == UNCOUNTED:
            return await fn(*args, **kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            await self._afailed(
                permit.epoch, permit.start, permit.probe, permit, exc
            )
            raise
        await self._asettle(permit, SUCCESS)
        return result

    # Context managers: see `_blocks`.

    __enter__ = enter_block
    __aenter__ = aenter_block
    __exit__ = ExitSlot(exit_block)
    __aexit__ = ExitSlot(aexit_block)


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
