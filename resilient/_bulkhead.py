"""
Bulkhead: bounded concurrency per dependency, with a bounded wait queue and
a maximum wait.

`BulkheadMachine` holds the slots and the FIFO queue of waiters behind a short
`threading.Lock` and decides: admit, queue, reject. It never blocks. The two
shells (`Bulkhead.acquire` for threads, `Bulkhead.acquire_async` for tasks)
only wait: on a `threading.Event`, or on an `anyio.Event` that a releaser in
another thread sets through the waiter's event loop. Threads and tasks share
the same slots.

A freed slot goes straight to the first waiter (it never becomes free in
between, so a newcomer cannot overtake the queue). A waiter that is cancelled
or interrupted after its grant but before it woke up passes the slot on to
the next waiter, or frees it: a permit is never lost.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import math
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    Unpack,
    cast,
    final,
)

import anyio
import anyio.lowlevel
import attrs
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace

from resilient._core import _clock
from resilient._core._clock import MonotonicClock
from resilient._core._config_bulkhead import BulkheadConfig, BulkheadKnobs
from resilient._core._decorate import decorate
from resilient._core._telemetry import instruments
from resilient._core._validate import check_name
from resilient._core._validate import same_config as _same
from resilient._timeout import check_scope, wake_on_cancel
from resilient.exceptions import BulkheadFull, ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable
    from types import TracebackType

    from opentelemetry.metrics import (
        CallbackOptions,
        Counter,
        Histogram,
        Meter,
        Observation,
    )


P = ParamSpec("P")
T = TypeVar("T")


class _Configured(Protocol):
    @property
    def config(self) -> Any: ...


_Item = TypeVar("_Item", bound=_Configured)
_Config = TypeVar("_Config")

RejectReason = Literal["full", "queue_full", "timeout", "deadline"]

# How often a waiter re-reads a clock it cannot wait on exactly (a
# FakeClock in tests), in real seconds.
POLL_INTERVAL: Final = 0.005

# Bulkheads kept by name before idle ones are forgotten.
REGISTRY_LIMIT: Final = 1024


@final
@attrs.frozen
class BulkheadStatistics:
    """
    A consistent snapshot of one bulkhead, taken under its lock.

    At every instant ``acquired == released + in_use``, and every request so
    far is counted once in ``acquired + rejected + cancelled + waiting``.

    Attributes:
        name: The bulkhead's name.
        max_concurrent: Its number of slots.
        max_waiting: How many callers may queue.
        in_use: Permits held now.
        waiting: Callers queued now.
        acquired: Permits granted so far.
        released: Permits given back so far (a waiter cancelled just after
            its grant counts as acquired and released).
        rejected: `BulkheadFull` errors raised so far, timeouts included.
        timed_out: Of those, the ones raised after waiting (``"timeout"``
            and ``"deadline"`` once queued).
        cancelled: Waiters cancelled or interrupted before their grant.
    """

    name: str
    max_concurrent: int
    max_waiting: int
    in_use: int
    waiting: int
    acquired: int
    released: int
    rejected: int
    timed_out: int
    cancelled: int


_Held = tuple["BulkheadPermit", "_Held"] | None

_WAITING: Final = 0
_GRANTED: Final = 1
_GONE: Final = 2


@final
class _Waiter:
    """One queued caller: its wake-up callback and when it stops waiting."""

    __slots__ = ("deadline", "reason", "since", "state", "wake")

    def __init__(
        self,
        wake: Callable[[], object],
        since: float,
        deadline: float,
        reason: RejectReason,
    ) -> None:
        self.wake = wake
        self.since = since
        self.deadline = deadline
        self.reason = reason
        self.state = _WAITING


@final
class BulkheadPermit:
    """
    One slot of a bulkhead, held until `release`.

    Also a context manager that releases on exit::

        with bulkhead.acquire():
            ...
    """

    __slots__ = ("_machine", "_released")

    def __init__(self, machine: BulkheadMachine) -> None:
        self._machine = machine
        self._released = False

    @property
    def released(self) -> bool:
        """Whether the slot was given back."""
        return self._released

    def release(self) -> None:
        """
        Give the slot back, to the first waiter if any. Idempotent.
        """
        self._machine.release(self)

    def __enter__(self) -> BulkheadPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._machine.release(self)

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<BulkheadPermit of {self._machine.name!r}, {state}>"


# The short name the pipeline uses inside the package.
Permit = BulkheadPermit


@final
class BulkheadMachine:
    """
    The slots and the wait queue of one bulkhead, and nothing else.

    Every method takes the lock for a few attribute updates and never
    blocks; time comes in as arguments. Shared by threads and tasks alike.

    Args:
        name: The bulkhead's name.
        config: Its configuration.
    """

    __slots__ = (
        "_limit",
        "_lock",
        "_max_waiting",
        "_waiters",
        "acquired",
        "cancelled",
        "config",
        "in_use",
        "name",
        "rejected",
        "released",
        "timed_out",
    )

    def __init__(self, name: str, config: BulkheadConfig) -> None:
        self.name = name
        self.config = config
        self._limit = config.max_concurrent
        self._max_waiting = config.max_waiting
        self._lock = threading.Lock()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self.in_use = 0
        self.acquired = 0
        self.released = 0
        self.rejected = 0
        self.timed_out = 0
        self.cancelled = 0

    def try_acquire(self) -> bool:
        """Take a free slot if there is one and nobody queues before us."""
        with self._lock:
            if self.in_use < self._limit and not self._waiters:
                self.in_use += 1
                self.acquired += 1
                return True
            return False

    def enqueue(
        self,
        now: float,
        seconds: float,
        reason: RejectReason,
        wake: Callable[[], object],
    ) -> _Waiter | RejectReason | None:
        """
        Take a free slot (None), queue (the `_Waiter`) or refuse (why).

        Args:
            now: The time on the clock.
            seconds: How long the caller may wait; 0 or less never queues.
            reason: What ends the wait if it runs out: ``"timeout"`` or
                ``"deadline"``.
            wake: Called, under the lock and from any thread, when the
                waiter is granted a slot; must not block.
        """
        with self._lock:
            if self.in_use < self._limit and not self._waiters:
                self.in_use += 1
                self.acquired += 1
                return None
            if seconds <= 0:
                self.rejected += 1
                return "full" if reason == "timeout" else reason
            if len(self._waiters) >= self._max_waiting:
                self.rejected += 1
                return "queue_full"
            waiter = _Waiter(wake, now, now + seconds, reason)
            self._waiters.append(waiter)
            return waiter

    def settle(self, waiter: _Waiter, now: float) -> bool | RejectReason:
        """
        After a wake-up: granted (True), still waiting (False), or out of
        time (why; the waiter leaves the queue).
        """
        with self._lock:
            if waiter.state == _GRANTED:
                return True
            if waiter.state == _WAITING and now >= waiter.deadline:
                waiter.state = _GONE
                self._waiters.remove(waiter)
                self.rejected += 1
                self.timed_out += 1
                return waiter.reason
            return False

    def abandon(self, waiter: _Waiter) -> None:
        """
        The waiter is cancelled or interrupted: leave the queue, or pass on
        the slot it was granted but never took.
        """
        with self._lock:
            if waiter.state == _WAITING:
                self._waiters.remove(waiter)
                self.cancelled += 1
            elif waiter.state == _GRANTED:
                self.released += 1
                self._free_slot()
            waiter.state = _GONE

    def release(self, permit: BulkheadPermit) -> None:
        """Give back *permit*'s slot, once."""
        with self._lock:
            if permit._released:  # noqa: SLF001
                return
            permit._released = True  # noqa: SLF001
            self.released += 1
            self._free_slot()

    def _free_slot(self) -> None:
        """Hand the slot to the first live waiter, or free it. Locked."""
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.state = _GRANTED
            self.acquired += 1
            try:
                waiter.wake()
            except Exception:  # noqa: BLE001
                # The waiter's event loop is gone; it will never take the
                # slot, so it goes to the next one.
                waiter.state = _GONE
                self.released += 1
            else:
                return
        self.in_use -= 1

    def statistics(self) -> BulkheadStatistics:
        """A consistent snapshot of the counts."""
        with self._lock:
            return BulkheadStatistics(
                name=self.name,
                max_concurrent=self._limit,
                max_waiting=self._max_waiting,
                in_use=self.in_use,
                waiting=len(self._waiters),
                acquired=self.acquired,
                released=self.released,
                rejected=self.rejected,
                timed_out=self.timed_out,
                cancelled=self.cancelled,
            )

    def is_idle(self) -> bool:
        """No slot held and nobody waiting: safe to forget."""
        return self.in_use == 0 and not self._waiters


@final
class Bulkhead:
    """
    At most ``max_concurrent`` calls to one dependency at once, threads and
    tasks together; up to ``max_waiting`` more wait their turn, for at most
    ``max_wait`` seconds (and never past the enclosing deadline); anyone
    else gets `BulkheadFull` at once.

    Get one with `resilient.bulkhead` (or `get_bulkhead`): one per name in
    the process. Use it as a decorator, with ``with`` in threads and
    ``async with`` in tasks, or take permits by hand::

        db = resilient.bulkhead("db", max_concurrent=10)

        @db
        def query(sql): ...

        async with db:
            await conn.execute(...)

        with db.acquire(timeout=0.5):
            ...

    .. versionadded:: 26.11.0
    """

    __slots__ = ("_held", "_machine", "config", "name")

    def __init__(self, name: str, config: BulkheadConfig) -> None:
        self.name = name
        self.config = config
        self._machine = BulkheadMachine(name, config)
        # The permits ``with bulkhead:`` holds in this thread or task, as
        # an immutable stack of (innermost, rest) pairs, so that contexts
        # copied into new tasks or threads cannot share or corrupt it.
        self._held: contextvars.ContextVar[_Held] = contextvars.ContextVar(
            f"resilient_bulkhead_{name}", default=None
        )

    def acquire_nowait(self) -> BulkheadPermit:
        """
        A permit if a slot is free now.

        Raises:
            BulkheadFull: Every slot is taken (or others already queue).
        """
        if self._machine.try_acquire():
            return BulkheadPermit(self._machine)
        raise self._reject("full", 0.0)

    def acquire(self, timeout: float | None = None) -> BulkheadPermit:
        """
        A permit, waiting in this thread for a slot if need be.

        Args:
            timeout: Seconds to wait at most; None uses the configured
                ``max_wait``. The enclosing deadline clips either.

        Raises:
            BulkheadFull: No slot came in time, or the queue is full.
        """
        m = self._machine
        if m.try_acquire():
            return BulkheadPermit(m)
        clock = _clock.get_clock()
        seconds, reason = self._wait_limit(timeout)
        gate = _new_gate()
        wake = _opener(gate)
        waiter = m.enqueue(clock.now(), seconds, reason, wake)
        if waiter is None:
            return BulkheadPermit(m)
        if isinstance(waiter, str):
            raise self._reject(waiter, 0.0)
        exact = type(clock) is MonotonicClock
        try:
            # A `resilient.timeout` scope cancelled from another thread
            # opens the gate too; the waiter then leaves the queue.
            with wake_on_cancel(wake):
                while (done := m.settle(waiter, clock.now())) is False:
                    check_scope()
                    wait = _slice(waiter, clock.now(), exact=exact)
                    gate.acquire(True, -1 if wait == math.inf else wait)
        except BaseException:
            m.abandon(waiter)
            raise
        return self._granted(waiter, done, clock.now())

    async def acquire_async(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 (as in `acquire`)
    ) -> BulkheadPermit:
        """
        A permit, waiting in this task for a slot if need be.

        A free slot is taken without a checkpoint. Cancellation while
        waiting, or just after the grant, gives the slot to the next caller.

        Args:
            timeout: As for `acquire`.

        Raises:
            BulkheadFull: No slot came in time, or the queue is full.
        """
        m = self._machine
        if m.try_acquire():
            return BulkheadPermit(m)
        clock = _clock.get_clock()
        seconds, reason = self._wait_limit(timeout)
        event = anyio.Event()
        waiter = m.enqueue(clock.now(), seconds, reason, _waker(event))
        if waiter is None:
            return BulkheadPermit(m)
        if isinstance(waiter, str):
            raise self._reject(waiter, 0.0)
        exact = type(clock) is MonotonicClock
        try:
            while (done := m.settle(waiter, clock.now())) is False:
                wait = _slice(waiter, clock.now(), exact=exact)
                if wait == math.inf:
                    await event.wait()
                else:
                    with anyio.move_on_after(wait):
                        await event.wait()
        except BaseException:
            m.abandon(waiter)
            raise
        return self._granted(waiter, done, clock.now())

    def statistics(self) -> BulkheadStatistics:
        """A consistent snapshot: slots in use, waiters, and the counts."""
        return self._machine.statistics()

    def __call__(self, fn: Callable[P, T], /) -> Callable[P, T]:
        """
        Run every call of *fn* (sync or async) under this bulkhead.
        """
        return decorate(fn, self._sync_shell, self._async_shell)

    def _sync_shell(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        with self.acquire():
            return fn(*args, **kwargs)

    async def _async_shell(
        self, fn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
    ) -> Any:
        with await self.acquire_async():
            return await fn(*args, **kwargs)

    def __enter__(self) -> BulkheadPermit:
        m = self._machine
        permit = BulkheadPermit(m) if m.try_acquire() else self.acquire()
        self._held.set((permit, self._held.get()))
        return permit

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._machine.release(self._pop_held())

    async def __aenter__(self) -> BulkheadPermit:
        permit = await self.acquire_async()
        self._held.set((permit, self._held.get()))
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._machine.release(self._pop_held())

    def _pop_held(self) -> BulkheadPermit:
        held = self._held.get()
        if held is None:
            raise RuntimeError(
                f"bulkhead {self.name!r} exited more often than entered "
                "in this thread or task"
            )
        permit, rest = held
        self._held.set(rest)
        return permit

    def _wait_limit(self, timeout: float | None) -> tuple[float, RejectReason]:
        """Seconds a caller may wait, and what ends the wait."""
        if timeout is None:
            wait = self.config.max_wait
            wait = math.inf if wait is None else wait
        else:
            wait = _check_timeout(timeout)
        left = _clock.remaining()
        if left < wait:
            return left, "deadline"
        return wait, "timeout"

    def _granted(
        self, waiter: _Waiter, done: bool | RejectReason, now: float
    ) -> BulkheadPermit:
        """Turn `settle`'s answer into a permit, or refuse."""
        waited = max(0.0, now - waiter.since)
        metrics = _metrics()
        if metrics is not None:
            metrics.wait.record(waited, {"resilient.bulkhead": self.name})
        if done is True:
            return BulkheadPermit(self._machine)
        raise self._reject(cast("RejectReason", done), waited)

    def _reject(self, reason: RejectReason, waited: float) -> BulkheadFull:
        """The error to raise, recorded as a metric and a span event."""
        labels = {"resilient.bulkhead": self.name, "resilient.reason": reason}
        metrics = _metrics()
        if metrics is not None:
            metrics.rejections.add(1, labels)
        span = otel_trace.get_current_span()
        if span.is_recording():
            span.add_event(
                "resilient.bulkhead.rejected",
                {**labels, "resilient.waited": waited},
            )
        return BulkheadFull(
            self.name, reason, self.config.max_concurrent, waited
        )

    def __repr__(self) -> str:
        s = self._machine.statistics()
        return (
            f"<Bulkhead {self.name!r}: {s.in_use}/{s.max_concurrent} in use, "
            f"{s.waiting} waiting>"
        )


def _slice(waiter: _Waiter, now: float, *, exact: bool) -> float:
    """
    How long to block before looking again: until the waiter's deadline on
    the real clock (at most what a lock wait accepts); a short poll on any
    other clock, whose time moves without telling us.
    """
    if not exact:
        return POLL_INTERVAL
    left = waiter.deadline - now
    if left == math.inf:
        return left
    # The clock moves between the caller's reading and ours: never ask a
    # lock for a negative wait (it raises ValueError).
    return max(0.0, min(left, threading.TIMEOUT_MAX))


def _opener(gate: threading.Lock) -> Callable[[], None]:
    """Open *gate* at most once, whoever asks first (a grant, a cancel)."""

    def open_gate() -> None:
        with contextlib.suppress(RuntimeError):  # Already open.
            gate.release()

    return open_gate


def _new_gate() -> threading.Lock:
    """
    A held lock a waiting thread blocks on and its waker releases: a
    one-shot signal far cheaper than a `threading.Event`.
    """
    gate = threading.Lock()
    gate.acquire()
    return gate


def _waker(event: anyio.Event) -> Callable[[], None]:
    """
    Sets *event* from any thread: directly in the event loop's own thread,
    through the loop's thread-safe hand-off from any other.
    """
    token = anyio.lowlevel.current_token()
    home = threading.get_ident()

    def wake() -> None:
        if threading.get_ident() == home:
            event.set()
        else:
            token.backend_class.run_sync_soon(
                event.set, (), token.native_token
            )

    return wake


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigTypeError(
            "Bulkhead.acquire(timeout)", timeout, "must be a number or None"
        )
    if math.isnan(timeout) or timeout < 0:
        raise ConfigError("Bulkhead.acquire(timeout)", timeout, "must be >= 0")
    return float(timeout)


@final
class Registry(Generic[_Item, _Config]):
    """
    Stateful primitives by name, at most *limit* of them: past it, the
    least recently used idle ones are forgotten.

    Args:
        kind: What the registry holds, for error messages.
        make: Builds a new item from a name and a configuration.
        default: The configuration used when none is given.
        idle: Whether an item may be forgotten.
        limit: How many items to keep before forgetting idle ones.
    """

    def __init__(
        self,
        kind: str,
        make: Callable[[str, _Config], _Item],
        default: Callable[[], _Config],
        idle: Callable[[_Item], bool],
        limit: int = REGISTRY_LIMIT,
    ) -> None:
        self._kind = kind
        self._make = make
        self._default = default
        self._idle = idle
        self.limit = limit
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[str, _Item] = (
            collections.OrderedDict()
        )

    def get(self, name: str, config: _Config | None) -> _Item:
        """
        The item called *name*, made with *config* on first use.

        Raises:
            ConfigTypeError: *name* is not a string.
            ConfigError: *name* is empty, or *config* differs from the one
                the existing item was made with.
        """
        _check_name(self._kind, name)
        with self._lock:
            item = self._items.get(name)
            if item is None:
                item = self._make(
                    name, self._default() if config is None else config
                )
                self._items[name] = item
                self._evict()
                return item
            self._items.move_to_end(name)
        if config is not None and not _same(config, item.config):
            raise ConfigError(
                f"{self._kind}({name!r}).config",
                config,
                f"conflicts with the configuration it already has, "
                f"{item.config!r}",
            )
        return item

    def _evict(self) -> None:
        excess = len(self._items) - self.limit
        if excess <= 0:
            return
        for key in list(self._items)[:-1]:
            if self._idle(self._items[key]):
                del self._items[key]
                excess -= 1
                if excess == 0:
                    return

    def items(self) -> list[_Item]:
        """A snapshot of the items."""
        with self._lock:
            return list(self._items.values())

    def clear(self) -> None:
        """Forget every item (for tests)."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def _check_name(kind: str, name: object) -> None:
    check_name(f"{kind}(name)", name)


def _check_config(config: object) -> BulkheadConfig | None:
    if config is not None and not isinstance(config, BulkheadConfig):
        raise ConfigTypeError(
            "bulkhead(config)", config, "must be a BulkheadConfig or None"
        )
    return config


BULKHEADS: Final[Registry[Bulkhead, BulkheadConfig]] = Registry(
    "Bulkhead",
    Bulkhead,
    BulkheadConfig,
    lambda b: b._machine.is_idle(),  # noqa: SLF001
)


def get_bulkhead(name: str, config: BulkheadConfig | None = None) -> Bulkhead:
    """
    The process-wide bulkhead called *name*.

    Made with *config* (or the defaults) on first use; later calls get the
    same object.

    Args:
        name: The dependency's name.
        config: Its configuration; None takes the existing bulkhead's, or
            the defaults.

    Raises:
        ConfigError: *config* differs from the existing bulkhead's.

    .. versionadded:: 26.11.0
    """
    return BULKHEADS.get(name, _check_config(config))


def bulkhead(
    name: str,
    /,
    config: BulkheadConfig | None = None,
    **knobs: Unpack[BulkheadKnobs],
) -> Bulkhead:
    """
    The process-wide bulkhead called *name*, configured by *config* or by
    the keywords of `BulkheadConfig`::

        db = resilient.bulkhead("db", max_concurrent=10, max_wait=0.5)

    Raises:
        TypeError: Both *config* and keywords are given.
        ConfigError: A bad value, or a configuration that differs from the
            existing bulkhead's.

    .. versionadded:: 26.11.0
    """
    if knobs:
        if config is not None:
            raise TypeError("bulkhead() takes a config or keywords, not both")
        config = BulkheadConfig(**knobs)
    return get_bulkhead(name, config)


@final
class _Metrics:
    """The bulkhead's instruments on one meter."""

    __slots__ = ("rejections", "wait")

    def __init__(self, meter: Meter) -> None:
        self.rejections: Counter = meter.create_counter(
            "resilient.bulkhead.rejections",
            unit="{call}",
            description="Calls a bulkhead refused with BulkheadFull.",
        )
        self.wait: Histogram = meter.create_histogram(
            "resilient.bulkhead.wait",
            unit="s",
            description="Time callers queued for a bulkhead slot.",
        )
        meter.create_observable_up_down_counter(
            "resilient.bulkhead.in_use",
            callbacks=[_observe("in_use")],
            unit="{call}",
            description="Bulkhead slots held.",
        )
        meter.create_observable_up_down_counter(
            "resilient.bulkhead.waiting",
            callbacks=[_observe("waiting")],
            unit="{call}",
            description="Callers queued for a bulkhead slot.",
        )


def _observe(
    field: str,
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        for b in BULKHEADS.items():
            stats = b.statistics()
            yield otel_metrics.Observation(
                getattr(stats, field), {"resilient.bulkhead": b.name}
            )

    return callback


def _metrics() -> _Metrics | None:
    """The bulkheads' instruments, made once per meter provider."""
    return instruments("bulkhead", _Metrics)
