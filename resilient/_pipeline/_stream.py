"""
Streams: generator functions and async generator functions under a policy,
a breaker or a bulkhead.

A call of a plain function ends when it returns; a stream's call ends when
its consumer stops iterating. So a decorated generator function becomes a
generator function of the same colour whose generator, from its first
``next`` on:

- is admitted once (breaker, bulkhead) and holds its tickets until the
  stream ends: exhausted, raising, closed (``close()``, ``aclose()``, a
  ``break`` that drops it, garbage collection) or cancelled; they are
  settled exactly once, on whichever way out comes first;
- under a policy, runs the policy's flow (`resilient._pipeline._flow`) up
  to the first item: an attempt is "make the generator and get its first
  item", so an error before the first item is retried like any failed
  attempt, and the first item ends the retrying; the attempt's span ends
  there, the call's span when the stream ends;
- after the first item, delegates as ``yield from`` does (``send``,
  ``throw``, ``athrow`` and ``close`` reach the inner generator, its return
  value is the stream's), each step with the context the stream needs (the
  item deadline) set and reset around it, never across a ``yield`` (the
  consumer's context is the stream's between steps);
- raises an error after the first item as it is, with a note when the
  policy would have retried it: nothing can be restarted once items were
  delivered.

Time: the policy's *budget* bounds getting the stream started (its
attempts and waits, up to the first item); its *timeout* bounds each item
(the first one, as an attempt, and every later one: a stream that stalls
longer raises `DeadlineExceeded`). Enclosing deadlines bound every step.

What the breaker counts: an error raised while iterating as the breaker's
configuration says, a success when the stream is exhausted or its consumer
closes it; a cancellation or an interrupt never.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import anyio

from resilient._core import _clock, _registry
from resilient._pipeline._call import Call, timed_out
from resilient._pipeline._flow import RUN, SETTLE, flow
from resilient._pipeline._run import aperform, perform
from resilient.exceptions import ConfigTypeError, DeadlineExceeded


if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        Awaitable,
        Callable,
        Generator,
    )

    from resilient._breaker import BreakerPermit, CircuitBreaker
    from resilient._bulkhead import Bulkhead, BulkheadPermit
    from resilient._core._decorate import StreamShell
    from resilient._core._settings import RetrySettings
    from resilient._core._telemetry import CallRecorder
    from resilient._pipeline._guards import Guards

_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001


def policy_streams(
    policy: RetrySettings, guards: Guards | None
) -> StreamShell:
    """How ``@policy`` wraps a generator function (see the module)."""

    def make(fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        _refuse(policy, fn)
        return _wrap(fn, is_async, lambda: _PolicyStream(policy, guards))

    return make


def breaker_streams(breaker: CircuitBreaker) -> StreamShell:
    """How ``@breaker`` wraps a generator function: admitted at its first
    ``next``, counted when it ends."""
    return _held(_BreakerHold(breaker))


def bulkhead_streams(bulkhead: Bulkhead) -> StreamShell:
    """How ``@bulkhead`` wraps a generator function: a slot from its first
    ``next`` until it ends."""
    return _held(_BulkheadHold(bulkhead))


def _held(hold: _Hold) -> StreamShell:
    def make(fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        return _wrap(fn, is_async, lambda: _HeldStream(hold))

    return make


def _refuse(policy: RetrySettings, fn: object) -> None:
    """The policy settings a stream cannot honour, refused at decoration."""
    if policy.retry_if_result is not None:
        raise ConfigTypeError(
            "Policy.retry_if_result",
            policy.retry_if_result,
            f"of policy {policy.name!r} judges a returned value, and "
            f"{fn!r} is a generator function whose items are not retried: "
            "raise from the generator to retry before its first item",
        )
    if policy.fallback is not None:
        raise ConfigTypeError(
            "Policy.fallback",
            policy.fallback,
            f"of policy {policy.name!r} returns a value, which cannot "
            f"replace the stream of generator function {fn!r}: catch the "
            "error around the loop that consumes it",
        )


def _wrap(
    fn: Callable[..., Any], is_async: bool, session: Callable[[], Any]
) -> Callable[..., Any]:
    """The guarded generator function of *fn*'s colour."""
    return (_async_stream if is_async else _sync_stream)(fn, session)


# The two drivers: the delegation of PEP 380, one step at a time.


def _sync_stream(
    fn: Callable[..., Any], session: Callable[[], Any]
) -> Callable[..., Any]:
    def stream(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        s = session()
        error: BaseException | None = None
        try:
            inner, item = s.start(fn, args, kwargs)
            if inner is None:
                return item
            while True:
                s.delivered += 1
                try:
                    sent = yield item
                except GeneratorExit:
                    s.step(inner.close)
                    raise
                except BaseException as thrown:  # noqa: BLE001 - passed on
                    step: Callable[..., Any] = inner.throw
                    arg: tuple[Any, ...] = (thrown,)
                else:
                    step, arg = (
                        (inner.__next__, ())
                        if sent is None
                        else (inner.send, (sent,))
                    )
                try:
                    item = s.step(step, *arg)
                except StopIteration as stop:
                    return stop.value
        except BaseException as exc:
            error = exc
            raise
        finally:
            s.end(error)

    return stream


def _async_stream(
    fn: Callable[..., Any], session: Callable[[], Any]
) -> Callable[..., Any]:
    async def stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        s = session()
        error: BaseException | None = None
        try:
            inner, item = await s.astart(fn, args, kwargs)
            if inner is None:
                return
            while True:
                s.delivered += 1
                try:
                    sent = yield item
                except GeneratorExit:
                    await s.astep(inner.aclose)
                    raise
                except BaseException as thrown:  # noqa: BLE001 - passed on
                    step: Callable[..., Awaitable[Any]] = inner.athrow
                    arg: tuple[Any, ...] = (thrown,)
                else:
                    step, arg = (
                        (inner.__anext__, ())
                        if sent is None
                        else (inner.asend, (sent,))
                    )
                try:
                    item = await s.astep(step, *arg)
                except StopAsyncIteration:
                    return
        except BaseException as exc:
            error = exc
            raise
        finally:
            await s.aend(error)

    return stream


def _abandon(gen: Generator[Any, Any, Any], exc: BaseException) -> None:
    """
    An exception outside the flow (an interrupt or a cancellation between
    two of its effects) while it is suspended: throw it in, so that the
    flow undoes what it set (the deadline, spans, tickets) before it goes
    on to the consumer.
    """
    if inspect.getgeneratorstate(gen) == inspect.GEN_CLOSED:
        return  # The flow raised it: it is over and has cleaned up.
    try:
        gen.throw(exc)
    except BaseException:  # noqa: BLE001 - raised by the caller
        return
    gen.close()  # pragma: no cover - only a fallback yields after an error


def _counted(exc: BaseException | None) -> BaseException | None:
    """What a stream's end counts: a consumer's close is no failure."""
    return None if isinstance(exc, GeneratorExit) else exc


def _calm(exc: BaseException | None) -> bool:
    """Whether async settling may await: never while cancelled, closing or
    interrupted."""
    return exc is None or isinstance(exc, Exception)


@final
class _PolicyStream:
    """
    One stream through a policy: the flow up to its first item, then the
    tickets and the call's span, held until `end`.
    """

    __slots__ = (
        "_at",
        "_call",
        "_guards",
        "_live",
        "_policy",
        "_rec",
        "_tickets",
        "delivered",
    )

    def __init__(self, policy: RetrySettings, guards: Guards | None) -> None:
        self._policy = policy
        self._guards = guards
        self._call: Call | None = None
        self._tickets: list[object] | None = None
        self._rec: CallRecorder | None = None
        self._live = False
        self._at = math.nan
        """The deadline of the last step the policy's timeout bounded."""
        self.delivered = 0
        """Items handed to the consumer."""

    def _flow(self) -> tuple[Call, Any]:
        guards = self._guards
        if guards is not None and guards.generation != _registry._generation:  # noqa: SLF001
            guards.look_up()
        call = self._call = Call(self._policy, guards)
        return call, flow(call)

    def start(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """
        Run the flow to the first item: ``(inner, item)``, or ``(None,
        value)`` when the stream ended at once (returning *value*).
        """
        call, gen = self._flow()
        sent: Any = None
        thrown: BaseException | None = None
        try:
            while True:
                try:
                    if thrown is None:
                        op, arg = gen.send(sent)
                    else:
                        op, arg = gen.throw(thrown)
                        thrown = None
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                if op == RUN:
                    sent = self._first(call, fn, args, kwargs)
                elif op == SETTLE and self._hold(arg):
                    sent = None
                else:
                    try:
                        sent = perform(call, op, arg)
                    except BaseException as exc:  # noqa: BLE001 - the flow decides
                        thrown = exc
        except BaseException as exc:
            _abandon(gen, exc)
            raise

    async def astart(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """`start`, in async code: each attempt is cancelled at its
        deadline."""
        call, gen = self._flow()
        sent: Any = None
        thrown: BaseException | None = None
        try:
            while True:
                try:
                    if thrown is None:
                        op, arg = gen.send(sent)
                    else:
                        op, arg = gen.throw(thrown)
                        thrown = None
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                if op == RUN:
                    sent = await self._afirst(call, arg, fn, args, kwargs)
                elif op == SETTLE and self._hold(arg):
                    sent = None
                else:
                    try:
                        sent = await aperform(call, op, arg)
                    except BaseException as exc:  # noqa: BLE001 - the flow decides
                        thrown = exc
        except BaseException as exc:
            _abandon(gen, exc)
            raise

    def _first(
        self, call: Call, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[BaseException | None, Any]:
        """The attempt (effect RUN): make the generator, get its first
        item; what the flow is sent."""
        try:
            inner = fn(*args, **kwargs)
            item = next(inner)
        except StopIteration as stop:
            return None, (None, stop.value)
        except BaseException as exc:  # noqa: BLE001 - the flow decides
            return exc, None
        self._started(call)
        return None, (inner, item)

    async def _afirst(
        self,
        call: Call,
        at: float,
        fn: Callable[..., Any],
        args: Any,
        kwargs: Any,
    ) -> tuple[BaseException | None, Any]:
        """`_first`, cancelled at the attempt's deadline *at*."""
        try:
            with call.cancel_scope(at) as scope:
                inner = fn(*args, **kwargs)
                item = await inner.__anext__()
            if scope.cancelled_caught:
                raise timed_out(at)  # noqa: TRY301
        except StopAsyncIteration:
            return None, (None, None)
        except BaseException as exc:  # noqa: BLE001 - the flow decides
            return exc, None
        self._started(call)
        return None, (inner, item)

    def _started(self, call: Call) -> None:
        """The first item came: the attempt's span ends now, the call's
        span is the stream's from here on (the flow no longer ends it)."""
        self._live = True
        rec = self._rec = call._rec  # noqa: SLF001
        call._rec = None  # noqa: SLF001
        if rec is not None:
            rec.attempt_ended(None)

    def _hold(self, arg: tuple[list[object], Any, bool]) -> bool:
        """Keep the tickets of the attempt that gave the first item."""
        if not self._live or self._tickets is not None:
            return False
        self._tickets = arg[0]
        return True

    def _deadline(self) -> float | None:
        """The deadline of the next step when the policy's timeout is
        earlier than the enclosing one, else None."""
        timeout = self._policy.timeout
        if timeout is None:
            return None
        at = _clock._clock.now() + timeout  # noqa: SLF001
        if at >= _DEADLINE.get():
            return None
        self._at = at
        return at

    def step(self, method: Callable[..., Any], *args: Any) -> Any:
        """One step of the inner generator after its first item."""
        at = self._deadline()
        if at is None:
            return method(*args)
        token = _DEADLINE.set(at)
        try:
            return method(*args)
        finally:
            _DEADLINE.reset(token)

    async def astep(
        self, method: Callable[..., Awaitable[Any]], *args: Any
    ) -> Any:
        """`step`, cancelled at the item's deadline or the enclosing one
        (as an attempt is)."""
        own = self._deadline()
        at = _DEADLINE.get() if own is None else own
        if at == math.inf:
            return await method(*args)
        token = None if own is None else _DEADLINE.set(own)
        try:
            left = at - _clock._clock.now()  # noqa: SLF001
            with anyio.CancelScope(deadline=anyio.current_time() + left) as s:
                return await method(*args)
            if s.cancelled_caught:  # pragma: no branch - caught, or returned
                raise DeadlineExceeded(at, "stream item deadline")
        finally:
            if token is not None:
                _DEADLINE.reset(token)

    def _take(
        self, exc: BaseException | None
    ) -> tuple[list[object] | None, BaseException | None, bool]:
        """The tickets to settle (once), what counts and whether the error
        was the item deadline."""
        tickets, self._tickets = self._tickets, None
        counted = _counted(exc)
        own = isinstance(counted, DeadlineExceeded) and (
            counted.deadline == self._at
        )
        if self.delivered and isinstance(counted, Exception):
            self._note(counted, own=own)
        return tickets, counted, own

    def _note(self, exc: Exception, *, own: bool) -> None:
        call = self._call
        policy = self._policy
        if call is None or (
            policy.attempts is not None and call.attempt >= policy.attempts
        ):
            return
        if own or (
            # The enclosing deadline passed: no retry could have helped.
            not isinstance(exc, DeadlineExceeded)
            and call.machine.is_transient(exc)
        ):
            exc.add_note(
                f"resilient: policy {policy.name!r} could not retry: the "
                f"stream had delivered {self.delivered} item(s), and a "
                "stream is restarted only before its first item"
            )

    def _finish(self, counted: BaseException | None) -> None:
        """End the call's span (once)."""
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.ended(counted, self._call.attempt)  # type: ignore[union-attr]

    def end(self, exc: BaseException | None) -> None:
        """The stream ended with *exc* (None: exhausted): settle and end
        the span, exactly once."""
        try:
            tickets, counted, own = self._take(exc)
            if tickets is not None:
                self._guards.settle(tickets, counted, own)  # type: ignore[union-attr]
        finally:
            self._finish(_counted(exc))

    async def aend(self, exc: BaseException | None) -> None:
        """`end`, awaiting async listeners when it may."""
        if not _calm(exc):
            self.end(exc)
            return
        try:
            tickets, counted, own = self._take(exc)
            if tickets is not None:
                await self._guards.asettle(tickets, counted, own)  # type: ignore[union-attr]
        finally:
            self._finish(_counted(exc))


class _Hold(Protocol):
    """A standalone guard a stream holds: admit once, settle once."""

    def admit(self) -> Any:
        """Take the ticket (may wait in the thread)."""

    async def aadmit(self) -> Any:
        """Take the ticket (may wait as a task)."""

    def settle(self, ticket: Any, exc: BaseException | None) -> None:
        """Give the ticket back, counting *exc* (None: a success)."""

    async def asettle(self, ticket: Any, exc: BaseException | None) -> None:
        """`settle`, awaiting async listeners (only when calm)."""


@final
class _BreakerHold:
    __slots__ = ("_cb",)

    def __init__(self, cb: CircuitBreaker) -> None:
        self._cb = cb

    def admit(self) -> BreakerPermit:
        return self._cb.acquire()

    async def aadmit(self) -> BreakerPermit:
        return await self._cb.aacquire()

    def settle(self, ticket: BreakerPermit, exc: BaseException | None) -> None:
        if exc is None:
            ticket.success()
        else:
            ticket.failure(exc)

    async def asettle(
        self, ticket: BreakerPermit, exc: BaseException | None
    ) -> None:
        if exc is None:
            await ticket.asuccess()
        else:
            await ticket.afailure(exc)


@final
class _BulkheadHold:
    __slots__ = ("_bulkhead",)

    def __init__(self, bulkhead: Bulkhead) -> None:
        self._bulkhead = bulkhead

    def admit(self) -> BulkheadPermit:
        return self._bulkhead.acquire()

    async def aadmit(self) -> BulkheadPermit:
        return await self._bulkhead.aacquire()

    def settle(
        self, ticket: BulkheadPermit, exc: BaseException | None
    ) -> None:
        ticket.release()

    async def asettle(
        self, ticket: BulkheadPermit, exc: BaseException | None
    ) -> None:
        ticket.release()


@final
class _HeldStream:
    """One stream through a standalone breaker or bulkhead."""

    __slots__ = ("_hold", "_ticket", "delivered")

    def __init__(self, hold: _Hold) -> None:
        self._hold = hold
        self._ticket: Any = None
        self.delivered = 0

    def start(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """Admit, then the first item (as `_PolicyStream.start`)."""
        self._ticket = self._hold.admit()
        inner = fn(*args, **kwargs)
        try:
            return inner, next(inner)
        except StopIteration as stop:
            self.end(None)
            return None, stop.value

    async def astart(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """`start`, in async code."""
        self._ticket = await self._hold.aadmit()
        inner = fn(*args, **kwargs)
        try:
            return inner, await inner.__anext__()
        except StopAsyncIteration:
            await self.aend(None)
            return None, None

    @staticmethod
    def step(method: Callable[..., Any], *args: Any) -> Any:
        """One step: nothing to set around it."""
        return method(*args)

    @staticmethod
    async def astep(method: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """One step, in async code."""
        return await method(*args)

    def end(self, exc: BaseException | None) -> None:
        """Settle the ticket, exactly once."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._hold.settle(ticket, _counted(exc))

    async def aend(self, exc: BaseException | None) -> None:
        """`end`, awaiting async listeners when it may."""
        if not _calm(exc):
            self.end(exc)
            return
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            await self._hold.asettle(ticket, exc)
