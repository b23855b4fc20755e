"""
Bulkhead: bounded concurrency per dependency, with a bounded wait queue and
a maximum wait.

`BulkheadMachine` holds the slots and the FIFO queue of waiting permits
behind a short `threading.Lock` and decides: admit, queue, reject. It never
blocks. The shells of `Bulkhead` only wait (`resilient._wait`): a thread on
a `ThreadWaiter`, a task on a `TaskWaiter` that a releaser in another thread
wakes through the task's event loop. Threads and tasks share the same slots.

A freed slot goes straight to the first waiter (it never becomes free in
between, so a newcomer cannot overtake the queue).

**Asynchronous exceptions.** A permit is one object from before its slot is
taken until after it is given back, and every step on it is recoverable:

- The permit exists before the slot: the machine marks it held in the same
  locked step that takes the slot (or grants it to the queued permit), so
  there is never a slot without a permit that knows it holds it.
- `BulkheadPermit.release` is idempotent and handles every state: held
  (the slot passes on), queued (it leaves the queue), granted but not yet
  woken (the slot passes on), never taken (nothing to do). The waits call
  it from ``except BaseException``, so a waiter cancelled or interrupted at
  any point hands its turn on.
- A permit dropped while it holds its slot (an exception between the grant
  and the caller's ``try``, or at the first line of the exit method) gives
  the slot back once it is freed: the machine knows its held permits by
  weak reference, and the next queueing, waiter's re-check or
  `BulkheadMachine.statistics` finds the dead one. No finalizer runs Python
  code, so none can swallow an asynchronous exception. A permit is freed
  at once by reference counting, or at the next pass of the cyclic
  collector when the exception's traceback sits in a reference cycle; until
  then its slot counts as held.
- ``with bulkhead:`` keeps its permit in per-``with`` state
  (`resilient._core._entered.PerWith`), not in a context variable, so a
  block cut short anywhere drops its permit with it.
- Inside the lock, each state change is written so that CPython's
  eval-breaker checks (where asynchronous exceptions land: after a call
  returns, at a function's first line, on a backward jump) see a
  consistent state: the permit's state and the counters are stored with no
  call in between, and the queue is popped or appended after them. A grant
  whose wake-up an exception cut off is found by the waiter's own re-check
  (`RECHECK`).

Every step is tested by an interrupt storm (``tests/test_bulkhead_storm.py``).
"""

from __future__ import annotations

import collections
import math
import threading
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    ParamSpec,
    TypeVar,
    Unpack,
    cast,
    final,
)

import attrs
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace

from resilient._core import _clock, _entered
from resilient._core._clock import MonotonicClock
from resilient._core._config_bulkhead import BulkheadConfig, BulkheadKnobs
from resilient._core._decorate import decorate
from resilient._core._loops import refuse_blocking
from resilient._core._registry import Registry
from resilient._core._telemetry import instruments
from resilient._timeout import check_scope, wake_on_cancel
from resilient._wait import TaskWaiter, ThreadWaiter, wait_slice
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

RejectReason = Literal["full", "queue_full", "timeout", "deadline"]

RECHECK: Final = 1.0
"""Longest a waiter blocks, in real seconds, before it looks at its permit
again even if nobody woke it (a grant whose wake-up an asynchronous
exception cut off is found this way)."""

# The states of a permit; changed only under the machine's lock (a permit
# nobody else can reach is read without it).
_PENDING: Final = 0  # made, no slot taken yet
_WAITING: Final = 1  # in the queue
_HELD: Final = 2  # holds a slot (taken, or granted while queued)
_RELEASED: Final = 3  # gave it back, or never got one


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


@final
class BulkheadPermit:
    """
    One slot of a bulkhead, held until `release`.

    Also a context manager that releases on exit::

        with bulkhead.acquire():
            ...

    A permit dropped without `release` gives its slot back when it is
    freed, like a file that is closed when collected; do not rely on it
    (release it, or use ``with``), but no exception can leak a slot.
    """

    __slots__ = (
        "__weakref__",
        "_bulkhead",
        "_deadline",
        "_reason",
        "_since",
        "_state",
        "_wake",
    )

    _bulkhead: Bulkhead
    _state: int
    _wake: Callable[[], object]
    _since: float
    _deadline: float
    _reason: RejectReason

    def __init__(self, bulkhead: Bulkhead) -> None:
        # The permit keeps its bulkhead alive, so the registry finds the
        # same bulkhead by name while any slot of it is held or awaited.
        self._bulkhead = bulkhead
        self._state = _PENDING

    @property
    def released(self) -> bool:
        """Whether the slot was given back (or never taken)."""
        return self._state == _RELEASED

    def release(self) -> None:
        """
        Give the slot back, to the first waiter if any. Idempotent; also
        takes a queued permit out of the queue.
        """
        self._bulkhead._machine.release(self)  # noqa: SLF001

    def __enter__(self) -> BulkheadPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bulkhead._machine.release(self)  # noqa: SLF001

    def _exit_block(self, *exc: object) -> None:
        """The exit of the ``with bulkhead:`` block this permit is for."""
        if self._state == _PENDING:
            # Never entered: a direct ``bulkhead.__exit__()`` call.
            _class_exit(self._bulkhead)
            return
        self._bulkhead._machine.release(self)  # noqa: SLF001

    async def _aexit_block(self, *exc: object) -> None:
        """The exit of the ``async with bulkhead:`` block (never awaits)."""
        self._exit_block()

    def __repr__(self) -> str:
        state = ("pending", "waiting", "held", "released")[self._state]
        return f"<BulkheadPermit of {self._bulkhead.name!r}, {state}>"


@final
class BulkheadMachine:
    """
    The slots and the wait queue of one bulkhead, and nothing else.

    Every method takes the lock for a few attribute updates and never
    blocks; time comes in as arguments. Shared by threads and tasks alike.

    Each held permit is in `_holders` (as a weak reference) from the step
    that grants it to the step that releases it, so a permit freed while
    held shows up as a dead reference: `_sweep` gives its slot back. No
    finalizer runs Python code (one would swallow an asynchronous exception
    that landed in it, and could not take the lock safely).

    Args:
        name: The bulkhead's name.
        config: Its configuration.
    """

    __slots__ = (
        "_holders",
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
        self._lock = threading.Lock()
        self._waiters: collections.deque[BulkheadPermit] = collections.deque()
        self._holders: set[weakref.ref[BulkheadPermit]] = set()
        self.configure(config)
        self.in_use = 0
        self.acquired = 0
        self.released = 0
        self.rejected = 0
        self.timed_out = 0
        self.cancelled = 0

    def configure(self, config: BulkheadConfig) -> None:
        """Take *config*'s limits (on a machine that has seen no work)."""
        self.config = config
        self._limit = config.max_concurrent
        self._max_waiting = config.max_waiting

    # Every grant below is written the same way: the weak reference is made
    # first (a call), then the state and the counts are stored with no call
    # in between, then the reference is added (a call, after which the
    # state is consistent again).

    def take(self, permit: BulkheadPermit) -> bool:
        """Give *permit* a free slot if there is one and nobody queues."""
        with self._lock:
            if self.in_use < self._limit and not self._waiters:
                ref = weakref.ref(permit)
                permit._state = _HELD  # noqa: SLF001
                self.in_use += 1
                self.acquired += 1
                self._holders.add(ref)
                return True
            return False

    def enqueue(
        self,
        permit: BulkheadPermit,
        now: float,
        seconds: float,
        reason: RejectReason,
        wake: Callable[[], object],
    ) -> RejectReason | None:
        """
        Give *permit* a free slot or queue it (None: look at its state), or
        refuse (why).

        Args:
            permit: A permit that holds nothing yet.
            now: The time on the clock.
            seconds: How long the caller may wait; 0 or less never queues.
            reason: What ends the wait if it runs out: ``"timeout"`` or
                ``"deadline"``.
            wake: Called, under the lock and from any thread, when the
                permit is granted a slot; must not block.
        """
        with self._lock:
            self._sweep()
            if self.in_use < self._limit and not self._waiters:
                ref = weakref.ref(permit)
                permit._state = _HELD  # noqa: SLF001
                self.in_use += 1
                self.acquired += 1
                self._holders.add(ref)
                return None
            if seconds <= 0:
                self.rejected += 1
                return "full" if reason == "timeout" else reason
            if len(self._waiters) >= self._max_waiting:
                self.rejected += 1
                return "queue_full"
            permit._wake = wake  # noqa: SLF001
            permit._since = now  # noqa: SLF001
            permit._deadline = now + seconds  # noqa: SLF001
            permit._reason = reason  # noqa: SLF001
            permit._state = _WAITING  # noqa: SLF001
            self._waiters.append(permit)
            return None

    def settle(
        self, permit: BulkheadPermit, now: float
    ) -> bool | RejectReason:
        """
        After a wake-up: granted (True), still waiting (False), or out of
        time (why; the permit leaves the queue).
        """
        with self._lock:
            self._sweep()
            state = permit._state  # noqa: SLF001
            if state == _HELD:
                return True
            if state == _WAITING:
                if now < permit._deadline:  # noqa: SLF001
                    return False
                permit._state = _RELEASED  # noqa: SLF001
                self.rejected += 1
                self.timed_out += 1
                self._waiters.remove(permit)
                return permit._reason  # noqa: SLF001
            return False

    def release(self, permit: BulkheadPermit) -> None:
        """
        Give back *permit*'s slot (to the first waiter), take it out of the
        queue, or nothing if it holds nothing; idempotent.
        """
        with self._lock:
            state = permit._state  # noqa: SLF001
            if state == _HELD:
                ref = weakref.ref(permit)
                permit._state = _RELEASED  # noqa: SLF001
                self.released += 1
                self.in_use -= 1
                self._holders.discard(ref)
                self._serve()
            elif state == _WAITING:
                permit._state = _RELEASED  # noqa: SLF001
                self.cancelled += 1
                self._waiters.remove(permit)
            else:
                permit._state = _RELEASED  # noqa: SLF001

    # ``abandon`` is what a waiter that is cancelled or interrupted does:
    # the same as a release, whatever state it reached.
    abandon = release

    def _sweep(self) -> None:
        """
        Give back the slots of permits freed while held, and serve the
        queue (a release an exception cut off before it served). Locked.
        """
        holders = self._holders
        dead = [ref for ref in holders if ref() is None]
        for ref in dead:
            self.released += 1
            self.in_use -= 1
            holders.discard(ref)
        self._serve()

    def _serve(self) -> None:
        """Grant free slots to the first waiters, in order. Locked."""
        waiters = self._waiters
        while waiters:
            permit = waiters[0]
            if permit._state != _WAITING:  # noqa: SLF001
                # A grant cut off before it left the queue, then released.
                waiters.popleft()
                continue
            if self.in_use >= self._limit:
                return
            ref = weakref.ref(permit)
            permit._state = _HELD  # noqa: SLF001
            self.in_use += 1
            self.acquired += 1
            self._holders.add(ref)
            waiters.popleft()
            try:
                permit._wake()  # noqa: SLF001
            except Exception:  # noqa: BLE001
                # The waiter's event loop is gone: it will never take the
                # slot, so it goes to the next one.
                permit._state = _RELEASED  # noqa: SLF001
                self.in_use -= 1
                self.released += 1
                self._holders.discard(ref)

    def reset(self) -> None:
        """
        Zero the counts (for `resilient.testing.reset_registries`), keeping
        the slots that are held and the callers that queue: a reset never
        lets more than ``max_concurrent`` calls in, old holders included.
        """
        with self._lock:
            self._sweep()
            self.acquired = self.in_use
            self.released = 0
            self.rejected = 0
            self.timed_out = 0
            self.cancelled = 0

    def is_idle(self) -> bool:
        """No slot held and nobody waiting, and no work seen."""
        return self.acquired == 0 and not self._waiters

    def statistics(self) -> BulkheadStatistics:
        """A consistent snapshot of the counts."""
        with self._lock:
            self._sweep()
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


def _class_exit(bulkhead: Bulkhead, *_exc: object) -> None:
    """``Bulkhead.__exit__`` called on the class (`contextlib.ExitStack`)."""
    permit = _entered.pop(bulkhead)
    if permit is None:
        raise RuntimeError(
            f"bulkhead {bulkhead.name!r} exited more often than entered "
            "in this thread or task"
        )
    bulkhead._machine.release(permit)  # noqa: SLF001


def _exit_of(permit: BulkheadPermit) -> Callable[..., None]:
    return permit._exit_block  # noqa: SLF001


def _aexit_of(permit: BulkheadPermit) -> Callable[..., Awaitable[None]]:
    return permit._aexit_block  # noqa: SLF001


async def _class_aexit(bulkhead: Bulkhead, *_exc: object) -> None:
    """``Bulkhead.__aexit__`` called on the class (`AsyncExitStack`)."""
    _class_exit(bulkhead)


@final
class Bulkhead:
    """
    At most ``max_concurrent`` calls to one dependency at once, threads and
    tasks together; up to ``max_waiting`` more wait their turn, for at most
    ``max_wait`` seconds (and never past the enclosing deadline); anyone
    else gets `BulkheadFull` at once.

    Get one with `resilient.bulkhead`: one per name in the process. Use it
    as a decorator, with ``with`` in threads and ``async with`` in tasks, or
    take permits by hand::

        db = resilient.bulkhead("db", max_concurrent=10)

        @db
        def query(sql): ...

        async with db:
            await conn.execute(...)

        with db.acquire(timeout=0.5):
            ...

    A sync wait (``with``, `acquire`, a sync decorated function) in a thread
    that runs an event loop raises `RuntimeError` instead of blocking the
    loop (it could deadlock: the task that would free the slot could never
    run); use the async form there. Taking a free slot never blocks, so
    `acquire_nowait` and a bulkhead with ``max_wait=0`` work anywhere.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("__weakref__", "_machine", "name")

    def __init__(self, name: str, config: BulkheadConfig) -> None:
        self.name = name
        self._machine = BulkheadMachine(name, config)

    @property
    def config(self) -> BulkheadConfig:
        """The configuration."""
        return self._machine.config

    def acquire_nowait(self) -> BulkheadPermit:
        """
        A permit if a slot is free now.

        Raises:
            BulkheadFull: Every slot is taken (or others already queue).
        """
        permit = BulkheadPermit(self)
        if self._machine.take(permit):
            return permit
        raise self._reject("full", 0.0)

    def acquire(self, timeout: float | None = None) -> BulkheadPermit:
        """
        A permit, waiting in this thread for a slot if need be.

        Args:
            timeout: Seconds to wait at most; None uses the configured
                ``max_wait``. The enclosing deadline clips either.

        Raises:
            BulkheadFull: No slot came in time, or the queue is full.
            RuntimeError: It would wait, in a thread that runs an event
                loop (use `aacquire`).
        """
        permit = BulkheadPermit(self)
        try:
            if not self._machine.take(permit):
                self._wait(permit, timeout)
        except BaseException:
            # An exception just after the grant: give the slot back now,
            # not when the permit is freed.
            self._machine.release(permit)
            raise
        return permit

    async def aacquire(
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

        .. versionadded:: 26.12.0
        """
        permit = BulkheadPermit(self)
        try:
            if not self._machine.take(permit):
                await self._await(permit, timeout)
        except BaseException:
            self._machine.release(permit)
            raise
        return permit

    acquire_async = aacquire
    """The former name of `aacquire`, kept as an alias."""

    def _queue(
        self,
        permit: BulkheadPermit,
        timeout: float | None,
        wake: Callable[[], object],
        *,
        blocking: bool,
    ) -> tuple[Any, bool] | None:
        """
        The decision both waits share: queue *permit* (the clock to wait on
        and whether it is the real one), or None when it got a free slot.

        Raises:
            BulkheadFull: Refused at once (no time to wait, queue full).
            RuntimeError: A blocking wait in an event loop's thread.
        """
        clock = _clock.get_clock()
        seconds, reason = self._wait_limit(timeout)
        if blocking and seconds > 0:
            refuse_blocking(
                f"waiting for a slot of bulkhead {self.name!r} in sync code",
                "`async with bulkhead` or `await bulkhead.aacquire()`",
            )
        refusal = self._machine.enqueue(
            permit, clock.now(), seconds, reason, wake
        )
        if refusal is not None:
            raise self._reject(refusal, 0.0)
        if permit._state == _HELD:  # noqa: SLF001
            return None
        return clock, type(clock) is MonotonicClock

    def _wait(self, permit: BulkheadPermit, timeout: float | None) -> None:
        """Wait in this thread until *permit* holds a slot, or raise."""
        m = self._machine
        waiter = ThreadWaiter()
        try:
            queued = self._queue(permit, timeout, waiter.wake, blocking=True)
            if queued is None:
                return
            clock, exact = queued
            # A `resilient.timeout` scope cancelled from another thread
            # wakes the waiter too; it then leaves the queue.
            with wake_on_cancel(waiter.wake):
                while (done := m.settle(permit, clock.now())) is False:
                    check_scope()
                    end = permit._deadline  # noqa: SLF001
                    left = wait_slice(end, clock.now(), exact=exact)
                    waiter.wait(min(left, RECHECK))
            self._granted(permit, done, clock.now())
        except BaseException:
            m.release(permit)
            raise

    async def _await(
        self, permit: BulkheadPermit, limit: float | None
    ) -> None:
        """Wait in this task until *permit* holds a slot, or raise."""
        m = self._machine
        try:
            waiter = TaskWaiter()
            queued = self._queue(permit, limit, waiter.wake, blocking=False)
            if queued is None:
                return
            clock, exact = queued
            while (done := m.settle(permit, clock.now())) is False:
                end = permit._deadline  # noqa: SLF001
                left = wait_slice(end, clock.now(), exact=exact)
                await waiter.wait(min(left, RECHECK))
            self._granted(permit, done, clock.now())
        except BaseException:
            m.release(permit)
            raise

    def statistics(self) -> BulkheadStatistics:
        """A consistent snapshot: slots in use, waiters, and the counts."""
        return self._machine.statistics()

    def __call__(self, fn: Callable[P, T], /) -> Callable[P, T]:
        """
        Run every call of *fn* (sync or async) under this bulkhead.

        A generator function's stream holds its slot from its first
        ``next`` until it ends (docs/streams.md).
        """
        from resilient._pipeline._stream import bulkhead_streams  # noqa: PLC0415 - the pipeline imports the bulkhead

        return decorate(
            fn,
            self._sync_shell,
            self._async_shell,
            stream=bulkhead_streams(self),
        )

    def _sync_shell(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        m = self._machine
        permit = BulkheadPermit(self)
        try:
            if not m.take(permit):
                self._wait(permit, None)
            return fn(*args, **kwargs)
        finally:
            m.release(permit)

    async def _async_shell(
        self, fn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
    ) -> Any:
        m = self._machine
        permit = BulkheadPermit(self)
        try:
            if not m.take(permit):
                await self._await(permit, None)
            return await fn(*args, **kwargs)
        finally:
            m.release(permit)

    def __enter__(self) -> BulkheadPermit:
        permit = _entered.take_handed()
        if permit is None or permit._bulkhead is not self:  # noqa: SLF001
            return self._enter_stacked()
        try:
            if not self._machine.take(permit):
                self._wait(permit, None)
        except BaseException:
            self._machine.release(permit)
            raise
        return permit  # type: ignore[no-any-return]

    # The ``with`` statement looks ``__exit__`` up before it calls
    # ``__enter__``: the lookup makes this block's permit and hands it to
    # ``__enter__``; the statement holds the permit's exit until the block
    # is over, so a block cut short anywhere drops the permit with it.
    __exit__ = _entered.PerWith(BulkheadPermit, _exit_of, _class_exit)

    async def __aenter__(self) -> BulkheadPermit:
        permit = _entered.take_handed()
        if permit is None or permit._bulkhead is not self:  # noqa: SLF001
            return await self._aenter_stacked()
        try:
            if not self._machine.take(permit):
                await self._await(permit, None)
        except BaseException:
            self._machine.release(permit)
            raise
        return permit  # type: ignore[no-any-return]

    __aexit__ = _entered.PerWith(BulkheadPermit, _aexit_of, _class_aexit)

    def _enter_stacked(self) -> BulkheadPermit:
        """``__enter__`` called on the class: keep the permit on a stack."""
        permit = self.acquire()
        try:
            _entered.push(self, permit)
        except BaseException:
            _entered.discard(self, permit)
            permit.release()
            raise
        return permit

    async def _aenter_stacked(self) -> BulkheadPermit:
        """``__aenter__`` called on the class (`AsyncExitStack`)."""
        permit = await self.aacquire()
        try:
            _entered.push(self, permit)
        except BaseException:
            _entered.discard(self, permit)
            permit.release()
            raise
        return permit

    def _wait_limit(self, timeout: float | None) -> tuple[float, RejectReason]:
        """Seconds a caller may wait, and what ends the wait."""
        if timeout is None:
            wait = self._machine.config.max_wait
            wait = math.inf if wait is None else wait
        else:
            wait = _check_timeout(timeout)
        left = _clock.remaining()
        if left < wait:
            return left, "deadline"
        return wait, "timeout"

    def _granted(
        self, permit: BulkheadPermit, done: bool | RejectReason, now: float
    ) -> None:
        """Record the wait; raise if `settle` said it ran out."""
        waited = max(0.0, now - permit._since)  # noqa: SLF001
        metrics = _metrics()
        if metrics is not None:
            metrics.wait.record(waited, {"resilient.bulkhead": self.name})
        if done is not True:
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
            self.name, reason, self._machine.config.max_concurrent, waited
        )

    def __repr__(self) -> str:
        s = self._machine.statistics()
        return (
            f"<Bulkhead {self.name!r}: {s.in_use}/{s.max_concurrent} in use, "
            f"{s.waiting} waiting>"
        )


Permit = BulkheadPermit
"""The short name the pipeline uses inside the package."""


def _check_timeout(timeout: object) -> float:
    """A timeout in seconds: a number >= 0, `math.inf` for no limit."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigTypeError(
            "Bulkhead.acquire(timeout)", timeout, "must be a number or None"
        )
    try:
        seconds = float(timeout)
    except OverflowError:  # an int too large for a float
        seconds = math.inf if timeout > 0 else -math.inf
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError("Bulkhead.acquire(timeout)", timeout, "must be >= 0")
    return seconds


def _check_config(config: object) -> BulkheadConfig | None:
    if config is not None and not isinstance(config, BulkheadConfig):
        raise ConfigTypeError(
            "bulkhead(config)", config, "must be a BulkheadConfig or None"
        )
    return config


def _adopt(bulkhead: Bulkhead, config: BulkheadConfig) -> bool:
    """A bulkhead made from the defaults takes the first explicit
    configuration, if it has seen no work."""
    m = bulkhead._machine  # noqa: SLF001
    with m._lock:  # noqa: SLF001
        if not m.is_idle():
            return False
        m.configure(config)
        return True


BULKHEADS: Final[Registry[Bulkhead, BulkheadConfig]] = Registry(
    "bulkhead",
    Bulkhead,
    BulkheadConfig,
    config_of=lambda b: b.config,
    adopt=_adopt,
    reset=lambda b: b._machine.reset(),  # noqa: SLF001
)


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

    Made on first use; later calls get the same object, for as long as
    anything holds it (a decorated function, a held permit, a variable).
    A lookup without a configuration (``bulkhead("db").statistics()``)
    does not fix the configuration: the first explicit one is taken, as
    long as the bulkhead has not been used.

    Raises:
        TypeError: Both *config* and keywords are given.
        ConfigError: A bad value, or a configuration that differs from the
            existing bulkhead's (the message names the fields).

    .. versionadded:: 26.11.0
    """
    if knobs:
        if config is not None:
            raise TypeError("bulkhead() takes a config or keywords, not both")
        config = BulkheadConfig(**knobs)
    return BULKHEADS.get(name, _check_config(config))


def get_bulkhead(name: str, config: BulkheadConfig | None = None) -> Bulkhead:
    """
    `bulkhead` without keywords, under the name the pipeline uses.

    .. versionadded:: 26.11.0
    """
    return BULKHEADS.get(name, _check_config(config))


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
