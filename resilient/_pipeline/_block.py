"""
The block form: ``for attempt in retrying(policy): with attempt: ...``, a
driver of the same flow as the decorators.

The iterator drives the flow up to an admitted attempt (``READY``) and hands
out an `Attempt`; entering it starts the attempt (its span and deadline
become current only inside the block), and leaving it sends the block's
outcome back in and drives the flow to the next decision: ``NEXT`` (retry:
the exception is swallowed and the loop goes on), the end (success, or a
kept result), or the call's error raised out of the block.

Nothing is left in the context between two iterations: a loop left early
(``break``, an exception before ``with attempt:``) leaves no current span
or deadline behind, and when the loop drops its iterator the flow is closed,
which releases what it holds and ends its spans (an attempt holds the
iterator weakly: one still referenced after the loop keeps nothing open).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Final, final

from resilient._core._shown import shown
from resilient._pipeline._call import NO_SCOPE, Call
from resilient._pipeline._cut import timed_out
from resilient._pipeline._effects import abandon, aperform, perform
from resilient._pipeline._flow import NEXT, READY, RUN, flow
from resilient._pipeline._inloop import refuse_in_loop


if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from types import TracebackType

    from resilient._core._settings import RetrySettings
    from resilient._pipeline._flow import Flow
    from resilient._pipeline._guards import Guards


# Where each part of the block form stops driving the flow: the iterator
# hands out an admitted attempt; entering it starts it; leaving it ends at
# the decision to retry (or at the end of the flow).
_TO_READY: Final = frozenset({READY})
_TO_RUN: Final = frozenset({RUN})
_TO_NEXT: Final = frozenset({NEXT})
# Markers that are not effects: passed over where they are not a stop.
_PASS: Final = frozenset({READY, RUN, NEXT})


def _step(
    call: Call,
    gen: Flow,
    sent: Any,
    stops: frozenset[int],
    *,
    op: int = 0,
    arg: Any = None,
) -> tuple[int, Any] | None:
    """
    Drive *gen* (sync effects) to its next stop; None at its end. An
    exception outside the flow (one that lands here between two effects)
    is thrown into it first, so that it releases what it holds here and
    now (`abandon`), not when the garbage collector frees it. (*op* and
    *arg*, the last effect, are parameters for the reason `drive`'s are.)
    """
    try:
        # Inside the try: CPython 3.11 raises an exception that lands at
        # the loop's back edge at the instruction before the loop's start.
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is None:
                    op, arg = gen.send(sent)
                else:
                    op, arg = gen.throw(thrown)
                    thrown = None
            except StopIteration:
                return None
            if op in stops:
                return op, arg
            if op in _PASS:
                sent = None
                continue
            try:
                sent = perform(call, op, arg)
            except BaseException as exc:  # noqa: BLE001 - the flow decides
                thrown = exc
    except BaseException as exc:
        abandon(call, gen, exc, op=op, arg=arg, sent=sent)
        raise


async def _astep(
    call: Call,
    gen: Flow,
    sent: Any,
    stops: frozenset[int],
    *,
    op: int = 0,
    arg: Any = None,
) -> tuple[int, Any] | None:
    """`_step` with async effects."""
    try:
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is None:
                    op, arg = gen.send(sent)
                else:
                    op, arg = gen.throw(thrown)
                    thrown = None
            except StopIteration:
                return None
            if op in stops:
                return op, arg
            if op in _PASS:
                sent = None
                continue
            try:
                sent = await aperform(call, op, arg)
            except BaseException as exc:  # noqa: BLE001 - the flow decides
                thrown = exc
    except BaseException as exc:
        abandon(call, gen, exc, op=op, arg=arg, sent=sent)
        raise


@final
class Attempt:
    """
    One attempt of the block form: enter it with ``with`` (or ``async with``
    in async code) around the code to retry.

    An exception the policy retries is swallowed and the loop goes on; any
    other exception, or the last one, propagates out of the loop with a note.
    In async code the attempt is cancelled at its deadline, which raises
    `DeadlineExceeded`.

    Attributes:
        number: The attempt's number: 1 is the first.
        next_wait: Seconds the policy plans to wait before the next
            attempt, once this attempt's block has ended and will be
            retried (it raised an error the policy retries, or its result
            is retried): the backoff's delay or the server's hint, the
            ``delay`` of the `RetryEvent` hooks see (0 in testing mode).
            None before the block ends, and when no attempt follows (the
            attempt succeeded, or retrying gave up).

    .. versionchanged:: 26.12.0
       *next_wait*.
    """

    __slots__ = (
        "_at",
        "_clock",
        "_entered",
        "_loop",
        "_name",
        "_result",
        "_scope",
        "_serial",
        "next_wait",
        "number",
    )

    def __init__(self, attempts: _Attempts, number: int) -> None:
        # A weak reference: the loop (``for``/``async for``) holds its
        # iterator, and a loop left with ``break`` drops it, which closes
        # the flow and ends the call's span then and there, even while
        # the attempt handed out last is still referenced.
        self._loop = weakref.ref(attempts)
        self._name = attempts.policy.name
        self._clock = attempts.call.clock
        self._serial = attempts.serial
        self.number = number
        """The attempt's number: 1 is the first."""
        self.next_wait: float | None = None
        """Seconds until the next attempt, once this one will be retried."""
        self._entered = False
        self._result: object = None
        self._scope: Any = NO_SCOPE
        self._at = float("inf")

    def __repr__(self) -> str:
        return f"<Attempt {self.number} of {shown(self._name)!r}>"

    @property
    def _attempts(self) -> _Attempts:
        """The loop's iterator, while the loop runs."""
        attempts = self._loop()
        if attempts is None:
            raise RuntimeError("this attempt's loop is over")
        return attempts

    def remaining(self) -> float:
        """Seconds left for this attempt (`math.inf` if unbounded)."""
        if self._at == float("inf"):
            return self._at
        return max(0.0, self._at - self._clock.now())

    def set_result(self, value: object) -> None:
        """
        Hand the block's result to the policy's ``retry_if_result``: when it
        asks for a retry, the loop goes on.
        """
        self._result = value

    def _enter(self) -> Attempt:
        if self._entered:
            raise RuntimeError("an Attempt can be entered only once")
        attempts = self._attempts
        if attempts.serial != self._serial or attempts.gen is None:
            raise RuntimeError("this attempt's loop is over")
        self._entered = attempts.entered = True
        gen = attempts.gen
        try:
            # Past `_step`, the flow holds the attempt's deadline and its
            # admission: released here if the block is not entered after
            # all (`_step` releases them itself if it raises).
            stop = _step(attempts.call, gen, None, _TO_RUN)
            assert stop is not None  # noqa: S101 - the flow's order
            assert stop[0] == RUN  # noqa: S101
            self._at = stop[1]
            if attempts.is_async:
                self._scope = attempts.call.cancel_scope(self._at)
                self._scope.__enter__()
        except BaseException as exc:
            attempts.gen = None
            scope, self._scope = self._scope, NO_SCOPE
            try:
                scope.__exit__(type(exc), exc, exc.__traceback__)
            finally:
                abandon(attempts.call, gen, exc)
            raise
        return self

    def _outcome(
        self, exc: BaseException | None
    ) -> tuple[BaseException | None, Any]:
        """What the block gave: its exception (or the attempt's timeout),
        or its result."""
        if self._scope is not NO_SCOPE:
            self._scope.__exit__(
                type(exc) if exc else None,
                exc,
                exc.__traceback__ if exc else None,
            )
            if self._scope.cancelled_caught:
                return timed_out(self._at, exc), None
        if exc is not None:
            return exc, None
        return None, self._result

    def _after(
        self, stop: tuple[int, Any] | None, sent: tuple[Any, Any]
    ) -> bool:
        """Whether to swallow the block's exception: only when retrying."""
        attempts = self._attempts
        if stop is None:
            attempts.gen = None  # Over: success, or a kept result.
            return False
        self.next_wait = stop[1].delay  # Retrying (NEXT).
        return sent[0] is not None

    def __enter__(self) -> Attempt:
        if self._attempts.is_async and self._attempts.policy.has_async_hooks:
            raise TypeError(
                f"policy {self._attempts.policy.name!r} has async hooks: "
                "enter attempts with `async with attempt:`"
            )
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        attempts = self._attempts
        sent = self._outcome(exc)
        try:
            stop = _step(attempts.call, attempts.gen, sent, _TO_NEXT)  # type: ignore[arg-type]
        except BaseException as raised:
            attempts.gen = None
            if raised is exc:
                return False  # The block's own error: let it propagate.
            raise
        return self._after(stop, sent)

    async def __aenter__(self) -> Attempt:
        return self._enter()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        attempts = self._attempts
        sent = self._outcome(exc)
        try:
            stop = await _astep(attempts.call, attempts.gen, sent, _TO_NEXT)  # type: ignore[arg-type]
        except BaseException as raised:
            attempts.gen = None
            if raised is exc:
                return False
            raise
        return self._after(stop, sent)


@final
class _Attempts:
    """The iterator of the block form; one per loop, one flow per loop."""

    # No reference back to the attempts it hands out, which hold it weakly:
    # a loop left early (`break`) frees it, and closes its flow, as soon as
    # the loop drops it.
    __slots__ = (
        "__weakref__",
        "call",
        "entered",
        "gen",
        "guards",
        "is_async",
        "policy",
        "serial",
    )

    def __init__(
        self, policy: RetrySettings, guards: Guards | None, *, is_async: bool
    ) -> None:
        self.policy = policy
        self.guards = guards.fresh() if guards is not None else None
        self.is_async = is_async
        self.call: Call = None  # type: ignore[assignment]
        self.gen: Flow | None = None
        self.serial = 0
        """How many attempts were handed out."""
        self.entered = True
        """Whether the last one handed out was entered."""

    def _resume(self) -> bool:
        """Whether to go on: start the flow, or check the last attempt."""
        if self.serial == 0:
            self.call = Call(self.policy, self.guards)
            self.gen = flow(self.call, block=True)
            return True
        if not self.entered:
            gen, self.gen = self.gen, None
            if gen is not None:
                gen.close()
            raise RuntimeError(
                "each attempt must be entered: `with attempt:` "
                "(or `async with attempt:`)"
            )
        return self.gen is not None

    def _hand_out(self, stop: tuple[int, Any] | None) -> Attempt:
        assert stop is not None  # noqa: S101 - the flow's order
        assert stop[0] == READY  # noqa: S101
        self.serial += 1
        self.entered = False
        return Attempt(self, self.call.attempt)

    def __iter__(self) -> Iterator[Attempt]:
        return self

    def __next__(self) -> Attempt:
        if self.serial == 0:
            refuse_in_loop(self.policy, "block")
        if not self._resume():
            raise StopIteration
        try:
            stop = _step(self.call, self.gen, None, _TO_READY)  # type: ignore[arg-type]
        except BaseException:
            self.gen = None
            raise
        return self._hand_out(stop)

    def __aiter__(self) -> AsyncIterator[Attempt]:
        return self

    async def __anext__(self) -> Attempt:
        if not self._resume():
            raise StopAsyncIteration
        try:
            stop = await _astep(self.call, self.gen, None, _TO_READY)  # type: ignore[arg-type]
        except BaseException:
            self.gen = None
            raise
        return self._hand_out(stop)
