"""
The bulkhead's two shells, side by side: `Bulkhead` waits for a slot in a
thread (``with``, `Bulkhead.acquire`, a sync decorated function) or in a
task (``async with``, `Bulkhead.aacquire`, an async one); the machine
(`resilient._bulkhead._machine`) decides.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast, final

import sniffio
from opentelemetry import trace as otel_trace

from resilient._bulkhead._machine import (
    _HELD,
    RECHECK,
    BulkheadMachine,
    BulkheadPermit,
    RejectReason,
    _aexit_of,
    _class_aexit,
    _class_exit,
    _exit_of,
)
from resilient._bulkhead._metrics import _metrics
from resilient._core import _clock, _entered
from resilient._core._clock import MonotonicClock
from resilient._core._decorate import decorate
from resilient._core._loops import refuse_blocking
from resilient._core._shown import shown
from resilient._timeout import check_scope, wake_on_cancel
from resilient._wait import TaskWaiter, ThreadWaiter, wait_slice
from resilient.exceptions import BulkheadFull, ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._bulkhead._machine import BulkheadStatistics
    from resilient._core._config_bulkhead import BulkheadConfig


P = ParamSpec("P")
T = TypeVar("T")

_thread_local: Final = sniffio.thread_local
_get_running_loop: Final = asyncio._get_running_loop  # noqa: SLF001 - C, no raise


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

    A sync entry that could wait (``with``, `acquire`, a sync decorated
    function, on a bulkhead that queues) in a thread that runs an event
    loop raises `RuntimeError` at once, free slot or not, instead of
    blocking the loop once it is full (it could deadlock: the task that
    would free the slot could never run); use the async form there.
    Taking a free slot never blocks, so `acquire_nowait`,
    ``acquire(timeout=0)`` and a bulkhead with ``max_wait=0`` work
    anywhere.

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
        if _thread_local.name is not None or _get_running_loop() is not None:
            self._refuse_in_loop(timeout)
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

    def _refuse_in_loop(self, timeout: float | None) -> None:
        """
        On a thread that runs an event loop: raise if a sync entry with
        *timeout* could wait (the bulkhead queues, the wait is not zero),
        at once, not only once the bulkhead is full (issue 15).
        """
        config = self._machine.config
        wait = config.max_wait if timeout is None else timeout
        if config.max_waiting > 0 and wait != 0:
            refuse_blocking(
                f"a sync entry into bulkhead {self.name!r}, which can queue,",
                "`async with bulkhead` or `await bulkhead.aacquire()`",
            )

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
        if _thread_local.name is not None or _get_running_loop() is not None:
            self._refuse_in_loop(None)
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
        if _thread_local.name is not None or _get_running_loop() is not None:
            self._refuse_in_loop(None)  # Nothing taken yet.
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
            f"<Bulkhead {shown(self.name)!r}: {s.in_use}/{s.max_concurrent} "
            f"in use, {s.waiting} waiting>"
        )


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
