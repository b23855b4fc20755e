"""
A stream through a policy: its flow (`resilient._pipeline._flow`) up to the
first item, with an attempt being "make the generator and get its first
item"; then the attempt's tickets and the call's span, held until the
stream ends.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, final

import anyio

from resilient._core import _clock, _registry
from resilient._pipeline._call import Call
from resilient._pipeline._cut import timed_out
from resilient._pipeline._effects import aperform, perform
from resilient._pipeline._effects import throw_into as abandon
from resilient._pipeline._flow import RUN, SETTLE, flow
from resilient._pipeline._stream._drive import calm, counted
from resilient.exceptions import DeadlineExceeded


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._core._settings import RetrySettings
    from resilient._core._telemetry import CallRecorder
    from resilient._pipeline._guards import Guards


_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001


@final
class PolicyStream:
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
        try:
            # Inside the try: see `resilient._pipeline._drive.drive`.
            sent: Any = None
            thrown: BaseException | None = None
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
            abandon(gen, exc)
            raise

    async def astart(
        self, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """`start`, in async code: each attempt is cancelled at its
        deadline."""
        call, gen = self._flow()
        try:
            # Inside the try: see `resilient._pipeline._drive.drive`.
            sent: Any = None
            thrown: BaseException | None = None
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
            abandon(gen, exc)
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
        cut: BaseException | None = None
        try:
            with call.cancel_scope(at) as scope:
                try:
                    inner = fn(*args, **kwargs)
                    item = await inner.__anext__()
                except BaseException as exc:
                    cut = exc  # What the deadline cut, if it did.
                    raise
            if scope.cancelled_caught:
                raise timed_out(at, cut)  # noqa: TRY301
        except StopAsyncIteration:
            return None, (None, None)
        except BaseException as exc:  # noqa: BLE001 - the flow decides
            return exc, None
        self._started(call)
        return None, (inner, item)

    def _started(self, call: Call) -> None:
        """The first item came: the attempt's span ends now, the call's
        span is the stream's from here on (the flow no longer ends it),
        current in each step (`step`), never between them: the consumer's
        own span is current in its code."""
        self._live = True
        rec = self._rec = call._rec  # noqa: SLF001
        call._rec = None  # noqa: SLF001
        if rec is not None:
            rec.attempt_ended(None, resume=False)

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
        """One step of the inner generator after its first item, under the
        call's span."""
        rec = self._rec
        if rec is None:
            return self._step(method, *args)
        rec.enter()
        try:
            return self._step(method, *args)
        finally:
            rec.exit()

    async def astep(
        self, method: Callable[..., Awaitable[Any]], *args: Any
    ) -> Any:
        """`step`, in async code."""
        rec = self._rec
        if rec is None:
            return await self._astep(method, *args)
        rec.enter()
        try:
            return await self._astep(method, *args)
        finally:
            rec.exit()

    def _step(self, method: Callable[..., Any], *args: Any) -> Any:
        """One step, under the item's deadline."""
        at = self._deadline()
        if at is None:
            return method(*args)
        token = _DEADLINE.set(at)
        try:
            return method(*args)
        finally:
            _DEADLINE.reset(token)

    async def _astep(
        self, method: Callable[..., Awaitable[Any]], *args: Any
    ) -> Any:
        """`_step`, cancelled at the item's deadline or the enclosing one
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
        error = counted(exc)
        own = isinstance(error, DeadlineExceeded) and (
            error.deadline == self._at
        )
        if own and type(error) is DeadlineExceeded and error.limit is None:
            # The item's own timeout: its makers knew only the time.
            call = self._call
            error._ended_attempt(  # noqa: SLF001
                self._policy.name,
                1 if call is None else call.attempt,
                "item",
                self._policy.timeout or 0.0,
            )
        if self.delivered and isinstance(error, Exception):
            self._note(error, own=own)
        return tickets, error, own

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

    def _finish(self, error: BaseException | None) -> None:
        """End the call's span (once), saying how many items it gave."""
        rec, self._rec = self._rec, None
        if rec is not None:
            # The call span itself, as `Call.fell_back` reaches it:
            # CallRecorder has no method for attributes of its own yet.
            span = getattr(rec, "_span", None)
            if span is not None:
                span.set_attribute("resilient.stream.items", self.delivered)
            rec.ended(error)

    def end(self, exc: BaseException | None) -> None:
        """The stream ended with *exc* (None: exhausted): settle and end
        the span, exactly once."""
        try:
            tickets, error, own = self._take(exc)
            if tickets is not None:
                self._guards.settle(tickets, error, own)  # type: ignore[union-attr]
        finally:
            self._finish(counted(exc))

    async def aend(self, exc: BaseException | None) -> None:
        """`end`, awaiting async listeners when it may."""
        if not calm(exc):
            self.end(exc)
            return
        try:
            tickets, error, own = self._take(exc)
            if tickets is not None:
                await self._guards.asettle(tickets, error, own)  # type: ignore[union-attr]
        finally:
            self._finish(counted(exc))
