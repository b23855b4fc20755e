"""
The async shell (asyncio, trio): the execution runs in a task of its own,
spawned by the leader in its event loop (an asyncio task the group keeps a
reference to; a trio system task, which belongs to the run's system
nursery). The leader then waits like any follower, so a cancelled leader
leaves alone, like anyone else; the last caller to leave cancels the
execution. The task runs outside every caller's deadline and cancel scope
(its context is the leader's, with those reset): what bounds it is its
callers, each waiting up to its own deadline.

The tasks of one event loop that wait for one flight share one `LoopGate`,
woken by one call (one hand-off from another thread) when the flight ends:
on asyncio the tasks with no deadline await one shared future (one that a
cancelled task cancels is replaced, see `LoopGate.shared_future`) and a
task with a deadline a future of its own; on trio they all park on one
`trio.Event`. Nothing else is made per caller but its `Ticket`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import math
import threading
from asyncio import CancelledError
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel
import sniffio
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from resilient._core import _clock, _internals
from resilient._core._clock import MonotonicClock
from resilient._core._loops import thread_caller
from resilient._singleflight._common import (
    EXECUTING,
    deadline_error,
    leave,
    note,
    outcome,
)
from resilient._singleflight._machine import (
    ABORTED,
    ERROR,
    RUNNING,
    VALUE,
    Flight,
    Ticket,
)
from resilient._singleflight._report import recorder
from resilient._wait import wait_slice


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable

    from resilient._singleflight._group import SingleFlight
    from resilient._singleflight._report import Recorder


P = ParamSpec("P")
T = TypeVar("T")

new_ticket: Final = object.__new__
_ident: Final = threading.get_ident
_sniffio: Final = sniffio.thread_local
# 3.11's `current_task` is Python-level, around a dict read directly here;
# 3.12's is the C one (see `resilient._core._internals`).
_current_task: Final = _internals.current_task_of
_NOTHING: Any = (
    None  # (Assigned to a ticket's slots: typed to narrow nothing.)
)
_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001
_NEVER: Final = math.inf

# asyncio keeps only weak references to tasks: the running executions.
_TASKS: Final[set[asyncio.Task[None]]] = set()


@final
class LoopGate:
    """
    Every task of one event loop waiting for one flight, woken at once:
    from the loop's thread directly, from any other through the loop's
    thread-safe hand-off (a closed loop has nobody left to wake).

    asyncio: one future that every waiter with no deadline awaits (see
    `shared_future` for what a cancelled one does to it), and one more per
    waiter with a deadline, which its own timeout cancels; all set by one
    call. trio: one `trio.Event`, whose waiters park on its lot.
    """

    __slots__ = (
        "_set_yet",
        "_soon",
        "event",
        "futures",
        "home",
        "loop",
        "new",
        "shared",
        "trio",
    )

    def __init__(self, library: str, loop: Any) -> None:
        self.home = threading.get_ident()
        """The thread of its event loop."""
        self.trio = library == "trio"
        self._set_yet = False
        self.shared: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """asyncio: its event loop (None on trio)."""
        self.futures: dict[asyncio.Future[None], None] | None = None
        if self.trio:
            import trio  # noqa: PLC0415

            self.event: Any = trio.Event()
            self._soon = loop.run_sync_soon
        else:
            self.futures = {}
            self.event = None
            self.new = _future_maker(loop)
            self.loop = loop
            self._soon = loop.call_soon_threadsafe

    def waiting(self) -> Awaitable[object]:
        """What the waiting task awaits (once); done when woken."""
        futures = self.futures
        if futures is None:
            return self.event.wait()  # type: ignore[no-any-return]
        fut: asyncio.Future[None] = self.new()
        if self._set_yet:
            fut.set_result(None)
        else:
            futures[fut] = None
        return fut

    def shared_future(self) -> asyncio.Future[None]:
        """
        The future every task of this loop that waits with no deadline
        awaits (asyncio; made by the first), set when the flight ends.

        A task cancelled while it awaits it cancels it (asyncio cancels
        what a task awaits): its other waiters then wake with
        `CancelledError` although nobody cancelled them, see that their
        task's `cancelling()` count has not grown, and wait on a new one
        (`replace`). One future for all is what makes the common case
        cheap: a thousand waiters, none cancelled.
        """
        fut: asyncio.Future[None] = self.new()
        if self._set_yet:
            fut.set_result(None)
        else:
            assert self.futures is not None  # noqa: S101 - asyncio
            self.futures[fut] = None
        self.shared = fut
        return fut

    def replace(self, fut: asyncio.Future[None]) -> None:
        """The shared *fut* was cancelled: the next waiter makes another."""
        if self.shared is fut:
            self.shared = None
        self.forget(fut)

    def forget(self, fut: Awaitable[object]) -> None:
        """A waiting that timed out: drop its future (asyncio)."""
        if self.futures is not None:
            self.futures.pop(fut, None)  # type: ignore[call-overload]

    def wake(self) -> None:
        """Wake every waiting task (once is enough; more are harmless)."""
        with contextlib.suppress(RuntimeError):  # The loop is gone.
            if threading.get_ident() == self.home:
                self._set()
            else:
                self._soon(self._set)

    def _set(self) -> None:
        futures = self.futures
        if futures is None:
            self.event.set()
            return
        self._set_yet = True
        self.futures = {}
        for fut in futures:
            try:  # noqa: SIM105 - no context manager per waiter
                fut.set_result(None)
            except asyncio.InvalidStateError:  # Its waiter was cancelled.
                pass


def _future_maker(loop: asyncio.AbstractEventLoop) -> Callable[[], Any]:
    """
    *loop*'s ``create_future``; for asyncio's own loops, the future type
    itself with the loop bound (what that method does, without its frame).
    """
    make = loop.create_future
    if getattr(make, "__func__", None) is asyncio.BaseEventLoop.create_future:
        return functools.partial(asyncio.Future, loop=loop)
    return make


def _library() -> tuple[str, Any]:
    """The async library running this task, and its loop (trio: token)."""
    if sniffio.thread_local.name == "trio":  # Set by trio while it runs.
        import trio  # noqa: PLC0415

        return "trio", trio.lowlevel.current_trio_token()
    return "asyncio", asyncio.get_running_loop()


def gate(flight: Flight) -> LoopGate:
    """
    The gate of this task's event loop for *flight* (made once; the
    leader's is the flight's `gate`, which its loop's tasks use directly).
    """
    library, loop = _library()
    g: LoopGate | None = flight.gates.get(loop)
    if g is None:
        # Only this loop's thread makes its gate: no race.
        g = flight.gates[loop] = LoopGate(library, loop)
    return g


async def fly(  # noqa: C901, PLR0912, PLR0915 - every waiting task's path
    group: SingleFlight,
    key: Hashable,
    fn: Callable[P, Awaitable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """
    ``await fn(*args, **kwargs)``, run in a task of its own, or the
    result of the execution under way for *key*, waiting for it in
    this task.

    Raises:
        TypeError: *key* is unhashable.
        DeadlineExceeded: The caller's deadline passed while waiting.
        RuntimeError: Called from inside the execution it would wait
            for.
    """
    # `SingleFlight.acall` itself (one coroutine frame per waiting task),
    # so a few steps are inlined: the gate of the execution's own loop,
    # the deadline read, the asyncio wait. Telemetry is the flight's (see
    # `Flight.recorded`): a follower of an unrecorded flight reads nothing.
    m = group._machine  # noqa: SLF001
    rec: Recorder | None = None
    failed: BaseException | None = None
    try:
        while True:
            ticket = new_ticket(Ticket)  # `Ticket()`, without its frame.
            ticket.flight = ticket.waiter = _NOTHING
            try:
                flight = m.join(key, ticket, is_async=True)
                leads = flight.owner is ticket
                if rec is None and flight.recorded:
                    rec = recorder(group.name)
                if rec is not None:
                    rec.joined(flight, leads=leads)
                if leads:
                    _spawn(group, flight, fn, args, kwargs)
                elif flight in EXECUTING.get():
                    raise RuntimeError(
                        f"resilient: singleflight {group.name!r}: called "
                        "from inside the execution it would wait for; "
                        "waiting would never end"
                    )
                waiter = flight.gate
                if (
                    waiter is None
                    or waiter.home != _ident()
                    or waiter.trio is not (_sniffio.name == "trio")
                ):
                    waiter = gate(flight)  # Not the execution's event loop.
                # Set before the state is read: a `finish` that missed it
                # is one we see.
                ticket.waiter = waiter
                if _DEADLINE.get() == _NEVER:
                    while flight.state == RUNNING:
                        if waiter.trio:
                            await waiter.event.wait()
                            continue
                        # `LoopGate.shared_future`, inlined. The task's
                        # cancel requests, read in the step that awaits,
                        # tell its own cancellation from another waiter's.
                        task = _current_task(waiter.loop)
                        asked = task.cancelling()  # type: ignore[union-attr]
                        fut = waiter.shared
                        if fut is None:
                            fut = waiter.shared_future()
                        try:
                            await fut
                        except CancelledError:
                            if task.cancelling() > asked:  # type: ignore[union-attr]
                                raise  # Ours: we leave.
                            waiter.replace(fut)  # Another's: wait on.
                else:
                    await _wait_until(group, flight, waiter, _DEADLINE.get())
            finally:
                ended = ticket.flight
                # (A woken caller has nothing to undo.)
                if ended is not None and not ended.woken:
                    leave(m, ticket, rec)
            if flight.state == VALUE:
                return flight.value  # type: ignore[no-any-return]
            outcome(flight, ticket, rec)  # Raises, or we start over.
    except BaseException as exc:
        failed = exc
        raise
    finally:
        if rec is not None:
            rec.ended(failed)
        failed = None  # (No cycle through the traceback.)


async def _wait_until(
    group: SingleFlight, flight: Flight, waiter: LoopGate, at: float
) -> None:
    """Wait until *flight* ends, or raise at the caller's deadline *at*."""
    clock = _clock.get_clock()
    exact = type(clock) is MonotonicClock
    while flight.state == RUNNING:
        now = clock.now()
        if now >= at:
            raise deadline_error(group.name, flight, at)
        with anyio.move_on_after(wait_slice(at, now, exact=exact)):
            waiting = waiter.waiting()
            await waiting
        waiter.forget(waiting)


def _spawn(
    group: SingleFlight,
    flight: Flight,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Start the execution in a task of its own, outside our scopes."""
    context = contextvars.copy_context()
    context.run(_detach, flight)
    flight.gate = g = gate(flight)
    if g.trio:
        import trio  # noqa: PLC0415

        trio.lowlevel.spawn_system_task(
            _run,
            group,
            flight,
            fn,
            args,
            kwargs,
            name=f"singleflight {group.name}",
            context=context,
        )
    else:
        task = asyncio.get_running_loop().create_task(
            _run(group, flight, fn, args, kwargs), context=context
        )
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)
    flight.spawned = True


async def _run(
    group: SingleFlight,
    flight: Flight,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """The execution's task: run *fn*, record its outcome, wake all."""
    m = group._machine  # noqa: SLF001
    try:
        if flight.state != RUNNING:
            return
        with anyio.CancelScope() as scope:
            flight.cancel = _canceller(scope)
            if flight.abandoned:
                return
            try:
                value = await fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                m.finish(
                    flight, ERROR, error=exc, note=note(group.name, flight)
                )
            else:
                m.finish(flight, VALUE, value)
    except anyio.get_cancelled_exc_class():
        raise  # The event loop is closing down: the callers start over.
    except BaseException as exc:
        m.finish(flight, ABORTED, error=exc)
        if flight.owner not in flight.members:  # pragma: no cover
            raise  # Nobody to hand it to: let it end the loop.
    finally:
        m.finish(flight, ABORTED)


def _detach(flight: Flight) -> None:
    """In the execution's context: no caller's deadline or scope."""
    _clock._DEADLINE.set(math.inf)  # noqa: SLF001
    _clock._SCOPE.set(None)  # noqa: SLF001
    EXECUTING.set(EXECUTING.get() | {flight})
    if flight.span is not None:
        otel_context.attach(otel_trace.set_span_in_context(flight.span))


def _canceller(scope: anyio.CancelScope) -> Callable[[], None]:
    """Cancels *scope* from any thread (through its event loop)."""
    call = thread_caller()
    home = threading.get_ident()

    def cancel() -> None:
        if threading.get_ident() == home:
            scope.cancel()
            return
        with contextlib.suppress(RuntimeError):  # The loop is gone.
            call(scope.cancel)

    return cancel
