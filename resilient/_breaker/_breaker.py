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
  CPython 3.11 to 3.13) with no check between them. This holds on those
  versions only: 3.14 calls ``__enter__`` with an ordinary ``CALL``, which
  checks as it returns, so importing resilient on any interpreter without
  ``BEFORE_WITH`` warns that these guarantees are not verified there
  (`resilient._core._internals.check_with_shape`);
- a closed call holds nothing: an exception before its outcome is recorded
  leaves it uncounted (as if ignored), after, counted once;
- a half-open probe holds a slot: the machine holds its permit weakly, and
  a permit dropped unsettled frees its slot the next time anyone looks;
- ``with`` keeps each block's permit on an object of that block alone (see
  `_blocks`), so an exception anywhere in ``__exit__`` leaves no entry
  behind that a later block could mistake for its own.
"""

from __future__ import annotations

import threading
from typing import (
    TYPE_CHECKING,
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
from resilient._breaker._calls import acall, async_wrapper, call, sync_wrapper
from resilient._breaker._machine import _BreakerMachine
from resilient._breaker._notify import (
    anotify,
    deliver,
    drain,
    notify,
    sync_pin,
)
from resilient._breaker._now import now
from resilient._breaker._records import (
    _OPEN,
    BreakerPermit,
    BreakerState,
    BreakerStatistics,
    BreakerTransition,
)
from resilient._breaker._rejecting import admission, rejection
from resilient._breaker._settling import (
    absorb,
    afailed,
    asettle_closed,
    asettle_permit,
    count,
    failed,
    record,
    settle_closed,
    settle_permit,
)
from resilient._core import _clock
from resilient._core._config_breaker import BreakerConfig, Outcome
from resilient._core._decorate import decorate, is_async_callable
from resilient._core._shown import shown
from resilient._core._validate import check_name
from resilient.exceptions import CircuitOpen, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable


P = ParamSpec("P")
T = TypeVar("T")

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
        return f"<CircuitBreaker {shown(self.name)!r} {self._m.state.value}>"

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

    # Not closed: see `_rejecting`.

    _admission = admission
    _rejection = rejection

    # Settling: every outcome enters the machine through `_record` (see
    # `_settling`).

    _record = record
    _absorb = absorb
    _count = count
    _settle_closed = settle_closed
    _asettle_closed = asettle_closed
    _settle = settle_permit
    _asettle = asettle_permit
    _failed = failed
    _afailed = afailed

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

    def outcome(self, exc: BaseException) -> Outcome:
        """How *exc* counts for this breaker (its `BreakerConfig.outcome`)."""
        return self.config.outcome(exc)

    _outcome = outcome

    # Reporting, outside the lock: see `_notify`.

    _drain = drain
    _deliver = deliver
    _notify = notify
    _anotify = anotify
    _sync_pin = sync_pin

    # Decorator: see `_calls` (``_call`` and ``_acall`` too).

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

    _call = call
    _acall = acall

    # Context managers: see `_blocks`.

    __enter__ = enter_block
    __aenter__ = aenter_block
    __exit__ = ExitSlot(exit_block)
    __aexit__ = ExitSlot(aexit_block)
