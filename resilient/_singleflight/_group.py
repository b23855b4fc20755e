"""
`SingleFlight` (the group: `call`, `acall`, `forget`) and the
`singleflight` decorator: the sync and async shells over `GroupMachine`.

The execution model:

- **Sync** (threads): the leader runs the function itself, in its own
  thread (a thread cannot be cancelled, and nothing else could run it);
  followers block on a `ThreadWaiter`, each up to its own deadline.
- **Async** (asyncio, trio): the execution runs in a task of its own,
  spawned by the leader in its event loop (an asyncio task the group keeps
  a reference to; a trio system task, which belongs to the run's system
  nursery). The leader then waits like any follower, so a cancelled leader
  leaves alone, like anyone else; the last caller to leave cancels the
  execution. The task runs outside every caller's deadline and cancel
  scope (its context is the leader's, with those reset): what bounds it is
  its callers, each waiting up to its own deadline.

Threads and tasks of any event loop, in any thread, share one flight: the
waiters of `_wait.py` are woken from wherever the execution ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    ParamSpec,
    TypeVar,
    final,
)

import anyio
import anyio.lowlevel
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link, Status, StatusCode

from resilient._core import _clock
from resilient._core._clock import MonotonicClock
from resilient._core._decorate import decorate
from resilient._core._loops import current_async_library
from resilient._core._telemetry import TELEMETRY, disabled, record_failure
from resilient._core._validate import check_name
from resilient._singleflight._machine import (
    ABORTED,
    ERROR,
    RUNNING,
    VALUE,
    Flight,
    GroupMachine,
    SingleFlightStatistics,
    Ticket,
)
from resilient._timeout import check_scope, wake_on_cancel
from resilient._wait import TaskWaiter, ThreadWaiter, wait_slice
from resilient.exceptions import ConfigError, ConfigTypeError, DeadlineExceeded


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue


P = ParamSpec("P")
T = TypeVar("T")

_NOTE: Final = (
    "resilient: singleflight {name!r} shared this exception with the {{n}} "
    "callers waiting for one execution (flight #{number})"
)

# The flights whose execution the current context runs: a caller inside
# one that would wait for it would wait for itself.
_EXECUTING: Final[contextvars.ContextVar[frozenset[Flight]]] = (
    contextvars.ContextVar("resilient_singleflight", default=frozenset())
)

# asyncio keeps only weak references to tasks: the running executions.
_TASKS: Final[set[asyncio.Task[None]]] = set()


def default_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """
    The key of a call without a key function: the positional arguments and
    the keyword arguments sorted by name, ``(args, ((name, value), ...))``.
    """
    return (args, tuple(sorted(kwargs.items())) if kwargs else ())


@final
class SingleFlight:
    """
    A group of calls in which concurrent callers with one key share one
    execution, and its result or its exception.

    The first caller for a key (the leader) starts the execution; callers
    that come while it runs (followers) wait for it and get the same
    object it returned, or raise the same exception object, with a note.
    Once it ends the key is free: the next caller starts a new execution.
    Threads and tasks (asyncio and trio, any event loop in any thread) can
    share one execution.

    - A follower waits no longer than its own deadline (`resilient.deadline`,
      `resilient.timeout`), raising `DeadlineExceeded` (or the timeout
      scope's `TimedOut`); the execution goes on for the others.
    - In async code the execution runs in a task of its own: a cancelled
      caller, the leader included, leaves alone, and the execution is
      cancelled when its last caller has left. In sync code the leader's
      thread runs it.
    - An execution that ends in a way that is not the followers' to
      receive (a `BaseException` that is not an `Exception`, such as
      KeyboardInterrupt or a cancellation; or the leader's own deadline in
      sync code) is started again for the followers still waiting, one of
      them leading.

    Args:
        name: Names the group in spans and notes.

    Raises:
        ConfigTypeError: *name* is not a str.
        ConfigError: *name* is blank.

    .. versionadded:: 26.12.0
    """

    __slots__ = ("_machine", "name")

    def __init__(self, *, name: str = "singleflight") -> None:
        check_name("SingleFlight(name)", name)
        self.name = name
        self._machine = GroupMachine()

    def __repr__(self) -> str:
        s = self._machine.statistics()
        return (
            f"<SingleFlight {self.name!r}: {s.in_flight} in flight, "
            f"{s.waiting} waiting>"
        )

    def __len__(self) -> int:
        """How many keys have an execution under way."""
        return len(self._machine.flights)

    def __contains__(self, key: Hashable) -> bool:
        """Whether *key* has an execution under way (that new callers join)."""
        return key in self._machine.flights

    def statistics(self) -> SingleFlightStatistics:
        """A consistent snapshot of the group."""
        return self._machine.statistics()

    def forget(self, key: Hashable) -> bool:
        """
        Let the next caller for *key* start a new execution: the one under
        way, if any, goes on for the callers already waiting for it.

        Returns:
            Whether an execution was under way for *key*.
        """
        return self._machine.forget(key)

    def call(
        self,
        key: Hashable,
        fn: Callable[P, T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """
        ``fn(*args, **kwargs)``, or the result of the execution under way
        for *key*, waiting for it in this thread.

        Raises:
            TypeError: *key* is unhashable; *fn* returned a coroutine (use
                `acall`).
            DeadlineExceeded: The caller's deadline passed while waiting.
            RuntimeError: The execution it would wait for runs in this
                thread (a recursive call, or an async one in this thread's
                event loop): waiting would never end.
        """
        return self._call(key, fn, args, kwargs)

    async def acall(
        self,
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
        return await self._acall(key, fn, args, kwargs)

    # -- the sync shell ----------------------------------------------------

    def _call(
        self,
        key: Hashable,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        tracer = None if disabled() else _tracer()
        if tracer is None:
            return self._fly(key, fn, args, kwargs, None)
        traced = _Traced(self, tracer)
        try:
            return self._fly(key, fn, args, kwargs, traced)
        except BaseException as exc:
            traced.ended(exc)
            raise
        finally:
            traced.ended(None)

    def _fly(
        self,
        key: Hashable,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        traced: _Traced | None,
    ) -> T:
        m = self._machine
        while True:
            waiter = ThreadWaiter()
            ticket = Ticket(waiter)
            try:
                flight = _join(m, key, ticket, traced, is_async=False)
                if flight.owner is ticket:
                    return self._lead(flight, fn, args, kwargs, traced)
                self._follow(flight, waiter)
            finally:
                late = doomed = None
                while True:  # Interrupted while leaving: leave again.
                    try:
                        doomed = m.leave(ticket)
                        break
                    # An asynchronous exception: stormed in a subprocess.
                    except BaseException as exc:  # noqa: BLE001 # pragma: no cover
                        late = exc
                if doomed is not None and doomed.cancel is not None:
                    doomed.cancel()  # The last caller of an async execution.
                if late is not None:
                    raise late  # pragma: no cover
            done, value = _outcome(flight, ticket, traced)
            if done:
                return value  # type: ignore[no-any-return]

    def _lead(
        self,
        flight: Flight,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        traced: _Traced | None,
    ) -> T:
        m = self._machine
        own = _clock.current_deadline()
        token = None if traced is None else traced.enter()
        try:
            value = fn(*args, **kwargs)
            if inspect.iscoroutine(value):
                _refuse_coroutine(value, fn)
        except Exception as exc:
            if isinstance(exc, DeadlineExceeded) and exc.deadline == own:
                # The leader's own deadline is not the followers': they
                # start again, each within its own.
                m.finish(flight, ABORTED)
            else:
                m.finish(flight, ERROR, error=exc, note=self._note(flight))
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        m.finish(flight, VALUE, value)
        return value

    def _follow(self, flight: Flight, waiter: ThreadWaiter) -> None:
        """Wait in this thread until *flight* ends or the deadline passes."""
        if flight.home == threading.get_ident():
            raise RuntimeError(
                f"resilient: singleflight {self.name!r}: the execution this "
                "call would wait for runs in this very thread (a recursive "
                "call, or an async execution of this thread's event loop: "
                "use `await group.acall(...)`); waiting would never end"
            )
        at = _clock.current_deadline()
        clock = _clock.get_clock()
        exact = type(clock) is MonotonicClock
        if _clock._SCOPE.get() is None:  # noqa: SLF001
            while flight.state == RUNNING:
                self._wait_once(flight, waiter, clock.now(), at, exact=exact)
            return
        # A `resilient.timeout` cancelled from another thread wakes us.
        with wake_on_cancel(waiter.wake):
            while flight.state == RUNNING:
                check_scope()
                self._wait_once(flight, waiter, clock.now(), at, exact=exact)
        check_scope()

    def _wait_once(
        self,
        flight: Flight,
        waiter: ThreadWaiter,
        now: float,
        at: float,
        *,
        exact: bool,
    ) -> None:
        if at == math.inf:
            waiter.wait()
            return
        if now >= at:
            raise self._deadline(flight, at)
        waiter.wait(wait_slice(at, now, exact=exact))

    # -- the async shell ---------------------------------------------------

    async def _acall(
        self,
        key: Hashable,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        tracer = None if disabled() else _tracer()
        if tracer is None:
            return await self._afly(key, fn, args, kwargs, None)
        traced = _Traced(self, tracer)
        try:
            return await self._afly(key, fn, args, kwargs, traced)
        except BaseException as exc:
            traced.ended(exc)
            raise
        finally:
            traced.ended(None)

    async def _afly(
        self,
        key: Hashable,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        traced: _Traced | None,
    ) -> T:
        m = self._machine
        while True:
            waiter = TaskWaiter()
            ticket = Ticket(waiter)
            try:
                flight = _join(m, key, ticket, traced, is_async=True)
                if flight.owner is ticket:
                    self._spawn(flight, fn, args, kwargs)
                await self._afollow(flight, waiter)
            finally:
                late = doomed = None
                while True:  # Interrupted while leaving: leave again.
                    try:
                        doomed = m.leave(ticket)
                        break
                    # An asynchronous exception (the sync twin is stormed).
                    except BaseException as exc:  # noqa: BLE001 # pragma: no cover
                        late = exc
                if doomed is not None and doomed.cancel is not None:
                    doomed.cancel()
                if late is not None:
                    raise late  # pragma: no cover
            done, value = _outcome(flight, ticket, traced)
            if done:
                return value  # type: ignore[no-any-return]

    def _spawn(
        self,
        flight: Flight,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """Start the execution in a task of its own, outside our scopes."""
        context = contextvars.copy_context()
        context.run(_detach, flight)
        if current_async_library() == "trio":
            import trio  # noqa: PLC0415

            trio.lowlevel.spawn_system_task(
                self._run,
                flight,
                fn,
                args,
                kwargs,
                name=f"singleflight {self.name}",
                context=context,
            )
        else:
            task = asyncio.get_running_loop().create_task(
                self._run(flight, fn, args, kwargs), context=context
            )
            _TASKS.add(task)
            task.add_done_callback(_TASKS.discard)
        flight.spawned = True

    async def _run(
        self,
        flight: Flight,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """The execution's task: run *fn*, record its outcome, wake all."""
        m = self._machine
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
                    m.finish(flight, ERROR, error=exc, note=self._note(flight))
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

    async def _afollow(self, flight: Flight, waiter: TaskWaiter) -> None:
        """Wait in this task until *flight* ends or the deadline passes."""
        if flight in _EXECUTING.get():
            raise RuntimeError(
                f"resilient: singleflight {self.name!r}: called from inside "
                "the execution it would wait for; waiting would never end"
            )
        at = _clock.current_deadline()
        if at == math.inf:
            while flight.state == RUNNING:
                await waiter.wait()
            return
        clock = _clock.get_clock()
        exact = type(clock) is MonotonicClock
        while flight.state == RUNNING:
            now = clock.now()
            if now >= at:
                raise self._deadline(flight, at)
            await waiter.wait(wait_slice(at, now, exact=exact))

    # -- shared by both ----------------------------------------------------

    def _note(self, flight: Flight) -> str:
        return _NOTE.format(name=self.name, number=flight.number)

    def _deadline(self, flight: Flight, at: float) -> DeadlineExceeded:
        error = DeadlineExceeded(at)
        error.add_note(
            f"resilient: stopped waiting for singleflight {self.name!r} "
            f"(flight #{flight.number}) at the caller's deadline; the "
            "execution goes on for the others"
        )
        return error


def _join(
    m: GroupMachine,
    key: Hashable,
    ticket: Ticket,
    traced: _Traced | None,
    *,
    is_async: bool,
) -> Flight:
    """
    `GroupMachine.join` (with a clear error for an unhashable key): the
    flight *ticket* is in now, which it leads if it is its owner.
    """
    try:
        leads = m.join(key, ticket, is_async=is_async)
    except TypeError:
        try:
            hash(key)
        except TypeError as exc:
            raise TypeError(
                f"resilient: a singleflight key must be hashable, got "
                f"{type(key).__name__}: {exc}"
            ) from None
        raise
    flight = ticket.flight
    assert flight is not None  # noqa: S101
    if traced is not None:
        traced.joined(flight, leads=leads)
    return flight


def _outcome(
    flight: Flight, ticket: Ticket, traced: _Traced | None
) -> tuple[bool, Any]:
    """
    What an ended *flight* means for *ticket*: (True, its value), raise its
    exception, or (False, None) to start over.
    """
    if flight.state == VALUE:
        return True, flight.value
    error = flight.error
    if flight.state == ERROR or (error is not None and flight.owner is ticket):
        # A shared exception; or a KeyboardInterrupt or SystemExit of an
        # async execution, its leader's to raise and nobody else's.
        assert error is not None  # noqa: S101
        raise error.with_traceback(flight.traceback)
    if traced is not None:
        traced.restart()
    return False, None


def _refuse_coroutine(value: Any, fn: object) -> None:
    value.close()
    raise TypeError(
        f"resilient: SingleFlight.call() got a coroutine from {fn!r}; use "
        "`await group.acall(...)` for async functions"
    )


def _detach(flight: Flight) -> None:
    """In the execution's context: no caller's deadline or scope."""
    _clock._DEADLINE.set(math.inf)  # noqa: SLF001
    _clock._SCOPE.set(None)  # noqa: SLF001
    _EXECUTING.set(_EXECUTING.get() | {flight})
    if flight.span is not None:
        otel_context.attach(otel_trace.set_span_in_context(flight.span))


def _canceller(scope: anyio.CancelScope) -> Callable[[], None]:
    """Cancels *scope* from any thread (through its event loop)."""
    token = anyio.lowlevel.current_token()
    home = threading.get_ident()

    def cancel() -> None:
        if threading.get_ident() == home:
            scope.cancel()
            return
        with contextlib.suppress(RuntimeError):  # The loop is gone.
            token.backend_class.run_sync_soon(
                scope.cancel, (), token.native_token
            )

    return cancel


def _tracer() -> Tracer | None:
    """resilient's tracer, if a tracer provider is configured."""
    return TELEMETRY.tracer or TELEMETRY.resolve()[0]


@final
class _Traced:
    """The span of one caller: its role, its flight, how many joined."""

    __slots__ = ("_flight", "_group", "_leads", "_linked", "_span", "_tracer")

    def __init__(self, group: SingleFlight, tracer: Tracer) -> None:
        self._group = group
        self._tracer = tracer
        self._span: Span | None = None
        self._flight: Flight | None = None
        self._leads = False
        self._linked = False

    def joined(self, flight: Flight, *, leads: bool) -> None:
        """The caller led or joined *flight*: start (or update) its span."""
        self._flight, self._leads = flight, leads
        role = "leader" if leads else "follower"
        attributes: dict[str, AttributeValue] = {
            "resilient.singleflight.name": self._group.name,
            "resilient.singleflight.role": role,
            "resilient.singleflight.flight": flight.number,
        }
        span = self._span
        if span is None:
            leader = flight.span
            links = None
            if leader is not None and not leads:
                links = [Link(leader.get_span_context())]
                self._linked = True
            span = self._span = self._tracer.start_span(
                f"singleflight {self._group.name}",
                attributes=attributes,
                links=links,
            )
        else:
            span.set_attributes(attributes)
        if leads:
            flight.span = span

    def restart(self) -> None:
        """The execution aborted: the caller starts over."""
        assert self._span is not None  # noqa: S101
        self._span.add_event("resilient.singleflight.restart")

    def enter(self) -> Token[Context]:
        """Make the leader's span current while it runs the execution."""
        assert self._span is not None  # noqa: S101
        return otel_context.attach(otel_trace.set_span_in_context(self._span))

    def ended(self, exc: BaseException | None) -> None:
        """End the span (once), with how many joined if the caller led."""
        span, self._span = self._span, None
        if span is None:
            return
        flight = self._flight
        assert flight is not None  # noqa: S101 - the span began at a join
        if self._leads:
            span.set_attribute("resilient.singleflight.joined", flight.joined)
        elif not self._linked and flight.span is not None:
            # Joined before the leader's span existed.
            span.add_link(flight.span.get_span_context())
        if exc is None:
            span.set_status(Status(StatusCode.OK))
        else:
            record_failure(span, exc)  # Bounded; no traceback.
        span.end()


def singleflight(
    *,
    key: Callable[..., Hashable] | None = None,
    group: SingleFlight | None = None,
    name: str | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """
    Concurrent calls of the decorated function (sync or async) with one
    key share one execution: see `SingleFlight` for what callers see.

    Args:
        key: Called with the call's arguments (``self`` included, for a
            method), returns the key. None: the arguments are the key,
            ``(args, ((name, value), ...))`` with the keyword arguments
            sorted by name; so ``f(1, b=2)`` and ``f(1, b=2)`` share, but
            ``f(1)`` and ``f(x=1)`` do not, and a method's calls share only
            for one instance.
        group: The `SingleFlight` to run in (to `forget` keys, or to share
            one group between functions, whose keys must then differ).
            None: a group of the function's own.
        name: Names the function's own group (default: the function's
            qualified name).

    Raises:
        ConfigTypeError: *key* is not callable, *group* not a
            `SingleFlight`, or *name* not a str.
        ConfigError: Both *group* and *name* are given, or *name* is blank.

    .. versionadded:: 26.12.0
    """
    _check_options(key, group, name)

    def decorator(fn: Callable[P, T]) -> Callable[P, T]:
        g = group
        if g is None:
            label = name or getattr(fn, "__qualname__", None) or repr(fn)
            g = SingleFlight(name=label)
        call, acall = g._call, g._acall  # noqa: SLF001

        if key is None:

            def sync_shell(
                f: Callable[..., Any], args: Any, kwargs: Any
            ) -> Any:
                return call(default_key(args, kwargs), f, args, kwargs)

            async def async_shell(
                f: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
            ) -> Any:
                return await acall(default_key(args, kwargs), f, args, kwargs)

        else:
            make = key

            def sync_shell(
                f: Callable[..., Any], args: Any, kwargs: Any
            ) -> Any:
                return call(make(*args, **kwargs), f, args, kwargs)

            async def async_shell(
                f: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
            ) -> Any:
                return await acall(make(*args, **kwargs), f, args, kwargs)

        return decorate(fn, sync_shell, async_shell, stream=_NO_STREAMS)

    return decorator


_NO_STREAMS: Final = (
    "singleflight cannot share a stream between callers (each item would "
    "reach only one of them); share a function that collects it, such as "
    "one returning `list(gen())`"
)


def _check_options(key: object, group: object, name: object) -> None:
    """`singleflight`'s options, each of the right kind."""
    if key is not None and not callable(key):
        raise ConfigTypeError(
            "singleflight(key)", key, "must be callable or None"
        )
    if group is not None and not isinstance(group, SingleFlight):
        raise ConfigTypeError(
            "singleflight(group)", group, "must be a SingleFlight or None"
        )
    if name is not None:
        check_name("singleflight(name)", name)
        if group is not None:
            raise ConfigError(
                "singleflight(name)",
                name,
                "names the function's own group: give name= or group=, "
                "not both",
            )
