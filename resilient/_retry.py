"""
Retry: one pure state machine and the shells that carry out its decisions.

`RetryMachine` decides (retry after N seconds, or give up) from outcomes and
the clock; it never sleeps. `_Call` binds a machine to one call's telemetry
and deadline. The four shells below (decorator sync/async, block form
sync/async) only run the call, wait and run hooks.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel

from resilient._breaker import SUCCESS, attempt_outcome
from resilient._core import _clock, _state
from resilient._core._decisions import GiveUp, Retry, RetryEvent
from resilient._core._decorate import decorate
from resilient._core._policy import Policy
from resilient._core._telemetry import disabled, recorder
from resilient.exceptions import (
    CircuitOpen,
    ConfigTypeError,
    DeadlineExceeded,
)


if TYPE_CHECKING:
    import random
    from collections.abc import AsyncIterator, Callable, Iterator
    from types import TracebackType

    from resilient._core._telemetry import CallRecorder
    from resilient._pipeline import Guards, _Admission
    from resilient._retry_budget import RetryBudget
    from resilient.typing import Clock


P = ParamSpec("P")
T = TypeVar("T")

log: Final = logging.getLogger("resilient")
_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001


@final
class RetryMachine:
    """
    The decisions of one retrying call, and nothing else.

    Fed the outcome of each attempt and reading the clock, it answers
    `Retry` (with the delay) or `GiveUp` (with the reason). Pure but for the
    jitter it draws from *rng*.

    Args:
        policy: The policy.
        clock: Where time is read.
        rng: The jitter's random source.
        start: When the call started, on *clock*.
        deadline: The absolute time no attempt may start at or after: the
            earlier of the policy's budget and any enclosing deadline.
        retry_budget: The dependency's shared retry budget, asked before
            every retry; None for no budget.
        breaker_wait: Seconds until the dependency's breaker admits a call
            (0 when closed); a retry never starts before that, and gives up
            at once when that is past the deadline.
    """

    __slots__ = (
        "_budget_end",
        "_max_attempts",
        "_previous",
        "_rejections",
        "_testing",
        "attempt",
        "breaker_wait",
        "clock",
        "deadline",
        "policy",
        "retry_budget",
        "rng",
        "start",
    )

    def __init__(
        self,
        policy: Policy,
        clock: Clock,
        rng: random.Random,
        start: float,
        *,
        deadline: float = math.inf,
        retry_budget: RetryBudget | None = None,
        breaker_wait: Callable[[], float] | None = None,
    ) -> None:
        self.policy = policy
        self.retry_budget = retry_budget
        self.breaker_wait = breaker_wait
        self.clock = clock
        self.rng = rng
        self.start = start
        self._budget_end = (
            start + policy.budget if policy.budget is not None else math.inf
        )
        self.deadline = min(deadline, self._budget_end)
        self.attempt = 1
        """The number of the attempt in progress; 1 is the first."""
        self._previous = 0.0
        self._rejections = 0
        testing = _state.testing
        self._testing = testing.active
        limit = policy.attempts if policy.attempts is not None else math.inf
        if testing.active and testing.attempts is not None:
            limit = min(limit, testing.attempts)
        self._max_attempts = limit

    def attempt_deadline(self) -> float:
        """The absolute deadline of the attempt about to start."""
        timeout = self.policy.timeout
        if timeout is None:
            return self.deadline
        return min(self.deadline, self.clock.now() + timeout)

    def is_transient(self, exc: Exception) -> bool:
        """Whether the policy retries *exc*."""
        retry_on = self.policy.retry_on
        if isinstance(retry_on, tuple):
            return isinstance(exc, retry_on)
        return bool(retry_on(exc))

    def on_error(self, exc: BaseException) -> Retry | GiveUp:
        """
        The attempt raised *exc*: retry it or give up.

        Only instances of `Exception` are retried; cancellation,
        `KeyboardInterrupt` and `SystemExit` give up at once.
        """
        if isinstance(exc, CircuitOpen):
            return self._outwait(exc)
        if not isinstance(exc, Exception) or not self.is_transient(exc):
            return GiveUp(
                "not_retryable", self._event(exc, None, None, "not_retryable")
            )
        reader = self.policy.retry_after
        hint = reader(exc) if reader is not None else None
        return self._next(exc, None, hint)

    def _outwait(self, exc: CircuitOpen) -> Retry | GiveUp:
        """
        A breaker rejected the attempt before it reached the dependency:
        wait until the breaker admits a probe, plus this call's own jitter
        so that a fleet of callers does not return in one wave, if that
        fits in the deadline; else give up now.

        A rejection is not an attempt and spends no retry budget (nothing
        reached the dependency): the deadline bounds the waits. With no
        deadline at all, a call tolerates at most as many rejections as it
        has attempts, so the loop always ends.
        """
        self._rejections += 1
        if self.deadline == math.inf and self._rejections > self._max_attempts:
            return GiveUp("attempts", self._event(exc, None, None, "attempts"))
        wait = 0.0
        if not self._testing:
            wait = self._spread(max(exc.retry_after, 0.0)) + self._backoff()
        if self.clock.now() + wait >= self.deadline:
            reason: Any = "breaker_open"
            return GiveUp(reason, self._event(exc, None, None, reason))
        return Retry(wait, self._event(exc, None, wait, None))

    def _spread(self, wait: float) -> float:
        """
        A breaker's wait T, spread uniformly over [T, T + max(T, cap)],
        where cap is the backoff's cap (the policy's own word on how widely
        it spreads retries): every caller waiting for the same breaker would
        otherwise come back in the instant it closes, and re-open it.

        Measured with the simulator (1,000 clients, a 5 s outage, 500/s
        capacity, full jitter capped at 5 s): the breaker closed 10.5 s
        after the outage with no spread, 2.8 s with [T, 2T], and 0.08 s
        with this window; with 200 new calls a second on top, 76 % of calls
        succeeded with [T, 2T] and all of them with this window.
        """
        if wait == math.inf:
            return wait
        cap = getattr(self.policy.backoff, "cap", 0.0)
        return wait + self.rng.uniform(0.0, max(wait, cap))

    def _backoff(self) -> float:
        return self.policy.backoff.delay(
            self.attempt - 1, self._previous, self.rng
        )

    def on_result(self, value: object) -> Retry | GiveUp | None:
        """
        The attempt returned *value*: None accepts it, else retry or give up.
        """
        check = self.policy.retry_if_result
        if check is None or not check(value):
            return None
        return self._next(None, value, None)

    def _next(
        self, exc: Exception | None, result: object, hint: float | None
    ) -> Retry | GiveUp:
        if self.attempt >= self._max_attempts:
            return GiveUp(
                "attempts", self._event(exc, result, None, "attempts")
            )
        if self._testing:
            delay = 0.0
        elif hint is not None and not math.isnan(hint):
            delay = min(max(hint, 0.0), self.policy.max_retry_after)
        else:
            delay = self._backoff()
        # Never retry into an open breaker: wait until it admits a probe,
        # then this call's backoff on top, so the fleet spreads out.
        blocked = False
        if self.breaker_wait is not None and not self._testing:
            wait = self.breaker_wait()
            if wait > 0:
                delay, blocked = self._spread(wait) + delay, True
        # Never start a wait that ends at or past the deadline: the attempt
        # after it would have no time left.
        if self.clock.now() + delay >= self.deadline:
            reason: Any = (
                "breaker_open"
                if blocked
                else "budget"
                if self.deadline == self._budget_end
                else "deadline"
            )
            return GiveUp(reason, self._event(exc, result, None, reason))
        return self._grant(exc, result, delay)

    def _grant(
        self, exc: Exception | None, result: object, delay: float
    ) -> Retry | GiveUp:
        budget = self.retry_budget
        if budget is not None and not budget.try_acquire_retry():
            reason: Any = "retry_budget"
            return GiveUp(reason, self._event(exc, result, None, reason))
        event = self._event(exc, result, delay, None)
        self._previous = delay
        self.attempt += 1
        return Retry(delay, event)

    def _event(
        self,
        exc: BaseException | None,
        result: object,
        delay: float | None,
        reason: Any,
    ) -> RetryEvent:
        return RetryEvent(
            policy=self.policy.name,
            attempt=self.attempt,
            elapsed=self.clock.now() - self.start,
            delay=delay,
            exception=exc,
            result=result,
            reason=reason,
        )


def _note(exc: BaseException, step: GiveUp) -> None:
    e = step.event
    if step.reason == "not_retryable" and e.attempt == 1:
        return  # A plain failure of a first attempt: nothing to add.
    exc.add_note(
        f"resilient: gave up on {e.policy!r} after {e.attempt} "
        f"attempt{'s' if e.attempt != 1 else ''} in {e.elapsed:.3f}s "
        f"({step.reason.replace('_', ' ')})"
    )


@final
class _Call:
    """
    One call's loop state, shared by all four shells: the clock, the lazily
    made machine, the telemetry recorder, the guards (breaker, bulkhead,
    retry budget) and the deadline context variable.

    An attempt is `begin` (telemetry; the call's deadline is current, so an
    admission wait is bounded by the budget), the admission stages, then
    `arm` (the attempt's own deadline becomes current), then the call.
    """

    __slots__ = (
        "_arm_token",
        "_deadline",
        "_machine",
        "_outer",
        "_rec",
        "_start",
        "_token",
        "clock",
        "guards",
        "own_timeout",
        "policy",
    )

    def __init__(
        self,
        policy: Policy,
        guards: Guards | None = None,
        start: float | None = None,
        outer: float | None = None,
    ) -> None:
        self.policy = policy
        self.guards = guards
        clock = self.clock = _clock._clock  # noqa: SLF001
        if start is None or outer is None:
            start, outer = clock.now(), _DEADLINE.get()
        self._start = start
        self._outer = outer
        budget = policy.budget
        self._deadline = (
            outer if budget is None else min(outer, start + budget)
        )
        self._machine: RetryMachine | None = None
        self._rec: CallRecorder | None = recorder(policy.name)
        self._token: Any = None
        self._arm_token: Any = None
        self.own_timeout = False
        """Whether the armed attempt deadline is the policy's timeout (not
        the call's budget or an enclosing deadline)."""
        if guards is not None and guards.budget is not None:
            guards.budget.record_call()

    @property
    def machine(self) -> RetryMachine:
        """The machine, made on first use so a first success costs less."""
        m = self._machine
        if m is None:
            guards = self.guards
            m = self._machine = RetryMachine(
                self.policy,
                self.clock,
                _state.rng,
                self._start,
                deadline=self._outer,
                retry_budget=None if guards is None else guards.budget,
                breaker_wait=None
                if guards is None or guards.breaker is None
                else guards.breaker.retry_after,
            )
        return m

    @property
    def attempt(self) -> int:
        """The number of the attempt in progress."""
        return 1 if self._machine is None else self._machine.attempt

    def begin(self) -> None:
        """Start an attempt: its span, and the call's deadline."""
        if self._rec is not None:
            self._rec.attempt_started(self.attempt)
        self._token = _DEADLINE.set(self._deadline)

    def suspend(self) -> None:
        """Take the call's deadline back out of the context (block form:
        the iterator hands the attempt over and the block may never run)."""
        if self._token is not None:
            _DEADLINE.reset(self._token)
            self._token = None

    def resume(self) -> None:
        """Put the call's deadline back when the block starts."""
        self._token = _DEADLINE.set(self._deadline)

    def abandon(self) -> None:
        """An attempt handed out and never entered: end its span."""
        self.suspend()
        if self._rec is not None:
            self._rec.attempt_ended(None)
        self.finish(None)

    def arm(self) -> float:
        """Make the attempt's own deadline current; returns it."""
        if self.policy.timeout is None:
            return self._deadline
        at = self.machine.attempt_deadline()
        self.own_timeout = at < self._deadline
        self._arm_token = _DEADLINE.set(at)
        return at

    def _end_attempt(self, exc: BaseException | None) -> None:
        if self._arm_token is not None:
            _DEADLINE.reset(self._arm_token)
            self._arm_token = None
        self.suspend()
        if self._rec is not None:
            self._rec.attempt_ended(exc)

    def failed(self, exc: BaseException) -> Retry | GiveUp:
        """The attempt raised: decide, record, annotate on give-up."""
        self._end_attempt(exc)
        step = self.machine.on_error(exc)
        if isinstance(step, GiveUp):
            if isinstance(exc, Exception):
                _note(exc, step)
                if step.reason == "retry_budget":
                    exc.add_note(self.guards.budget.refusal_note())  # type: ignore[union-attr]
                if self._rec is not None:
                    self._rec.gave_up(step.event)
            self.finish(exc)
        elif self._rec is not None:
            self._rec.retrying(step.event)
        return step

    def returned(self, value: object) -> Retry | GiveUp | None:
        """The attempt returned: accept, retry or give up (keeping it)."""
        self._end_attempt(None)
        if self.policy.retry_if_result is None:
            self.finish(None)
            return None
        step = self.machine.on_result(value)
        if self._rec is not None and step is not None:
            if isinstance(step, GiveUp):
                self._rec.gave_up(step.event)
            else:
                self._rec.retrying(step.event)
        if not isinstance(step, Retry):
            self.finish(None)
        return step

    def finish(self, exc: BaseException | None) -> None:
        """Close the call's telemetry (idempotent)."""
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.ended(exc, self.attempt)

    def cancel_scope(self, at: float) -> anyio.CancelScope | _NoScope:
        """A cancel scope for an async attempt ending at *at* (our clock)."""
        if at == math.inf:
            return _NO_SCOPE
        left = at - self.clock.now()
        return anyio.CancelScope(deadline=anyio.current_time() + left)


@final
class _NoScope:
    """Null object for an attempt with no deadline: a cancel scope costs
    about 5 us on asyncio, more than the rest of the call."""

    __slots__ = ()
    cancelled_caught = False

    def __enter__(self) -> _NoScope:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_SCOPE: Final = _NoScope()


def _observable(event: RetryEvent) -> bool:
    """Hooks hear of failures, never of cancellation or interrupts."""
    return event.exception is None or isinstance(event.exception, Exception)


def _hook(
    hook: Callable[[RetryEvent], object] | None, event: RetryEvent
) -> None:
    """Run a sync hook; a hook that raises is logged and changes nothing."""
    if hook is not None and _observable(event):
        try:
            hook(event)
        except Exception:
            log.exception("resilient: hook %r raised; ignored", hook)


async def _ahook(
    hook: Callable[[RetryEvent], object] | None, event: RetryEvent
) -> None:
    """Run a hook from async code, awaiting it if it is async."""
    if hook is not None and _observable(event):
        try:
            result = hook(event)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("resilient: hook %r raised; ignored", hook)


def _timed_out(at: float) -> DeadlineExceeded:
    return DeadlineExceeded(at, "attempt deadline")


# The shells. Each one runs the call, carries out the step the machine
# decided, and nothing else. The sync and async twins differ only in
# `await`, the cancel scope and how they wait.


def _bare_ok(policy: Policy) -> bool:
    """
    Whether a first attempt can run bare: no attempt timeout, no result
    predicate, no telemetry. (Of the guards, only a closed breaker keeps
    it bare.)
    """
    return (
        policy.timeout is None
        and policy.retry_if_result is None
        and disabled()
    )


@final
class _Resume:
    """A first attempt that failed and will be retried: the loop goes on
    from here (a private type, so no call's result can be mistaken for
    it)."""

    __slots__ = ("call", "step")

    def __init__(self, call: _Call, step: Retry) -> None:
        self.call = call
        self.step = step


# The breaker was not closed: the first attempt takes the full path.
_NOT_BARE: Final = object()


def _call_sync(
    policy: Policy,
    guards: Guards | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    if _bare_ok(policy):
        if guards is None:
            first = _bare_sync(policy, fn, args, kwargs)
        elif guards.breaker_only:
            first = _bare_breaker_sync(policy, guards, fn, args, kwargs)
        else:
            first = _NOT_BARE
        if type(first) is _Resume:
            return _loop_sync(first.call, first.step, fn, args, kwargs)
        if first is not _NOT_BARE:
            return first
    return _loop_sync(_Call(policy, guards), None, fn, args, kwargs)


def _bare_sync(
    policy: Policy,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """
    Most calls succeed at once: run the first attempt bare, with only the
    call's deadline in the context, and build the loop's state only when it
    fails.
    """
    start, outer = _clock._clock.now(), _DEADLINE.get()  # noqa: SLF001
    budget = policy.budget
    token = _DEADLINE.set(
        outer if budget is None else min(outer, start + budget)
    )
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - _failed_sync re-raises it
        call = _Call(policy, None, start, outer)
        return _Resume(call, _failed_sync(call, exc))
    finally:
        _DEADLINE.reset(token)


def _bare_breaker_sync(
    policy: Policy,
    guards: Guards,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """`_bare_sync` through a closed breaker: counted without a permit."""
    cb = guards.breaker
    assert cb is not None  # noqa: S101 - breaker_only says so
    ticket = cb._closed_ticket()  # noqa: SLF001
    if ticket is None:
        return _NOT_BARE
    start, outer = _clock._clock.now(), _DEADLINE.get()  # noqa: SLF001
    budget = policy.budget
    token = _DEADLINE.set(
        outer if budget is None else min(outer, start + budget)
    )
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        cb._settle_closed(*ticket, attempt_outcome(cb, exc, own_timeout=False))  # noqa: SLF001
        if not isinstance(exc, Exception):
            raise
        call = _Call(policy, guards, start, outer)
        return _Resume(call, _failed_sync(call, exc))
    finally:
        _DEADLINE.reset(token)
    cb._settle_closed(*ticket, SUCCESS)  # noqa: SLF001
    return result


def _loop_sync(
    call: _Call,
    step: Retry | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    policy, guards = call.policy, call.guards
    while True:
        if step is not None:
            _hook(policy.before_sleep, step.event)
            if step.delay > 0:
                call.clock.sleep(step.delay)
        call.begin()
        try:
            if guards is None or not guards.admits:
                call.arm()
                result = fn(*args, **kwargs)
            else:
                result = guards.call(call, fn, args, kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on give-up
            step = _failed_sync(call, exc)
        else:
            outcome = call.returned(result)
            if not isinstance(outcome, Retry):
                if outcome is not None:
                    _hook(policy.on_give_up, outcome.event)
                return result
            step = outcome


def _failed_sync(call: _Call, exc: BaseException) -> Retry:
    """Decide on a failed attempt; on a give-up, hook and re-raise."""
    decided = call.failed(exc)
    if isinstance(decided, GiveUp):
        _hook(call.policy.on_give_up, decided.event)
        raise exc
    return decided


async def _failed_async(call: _Call, exc: BaseException) -> Retry:
    """Decide on a failed attempt; on a give-up, hook and re-raise."""
    decided = call.failed(exc)
    if isinstance(decided, GiveUp):
        await _ahook(call.policy.on_give_up, decided.event)
        raise exc
    return decided


async def _call_async(
    policy: Policy,
    guards: Guards | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    # The bare first attempt of the sync shell, when no deadline needs a
    # cancel scope.
    if (
        policy.budget is None
        and _bare_ok(policy)
        and _DEADLINE.get() == math.inf
    ):
        if guards is None:
            # Inline, not a helper: one coroutine frame less per call.
            start = _clock._clock.now()  # noqa: SLF001
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - re-raised on give-up
                call = _Call(policy, None, start, math.inf)
                step = await _failed_async(call, exc)
            return await _loop_async(call, step, fn, args, kwargs)
        if guards.breaker_only:
            first = await _bare_breaker_async(policy, guards, fn, args, kwargs)
        else:
            first = _NOT_BARE
        if type(first) is _Resume:
            return await _loop_async(first.call, first.step, fn, args, kwargs)
        if first is not _NOT_BARE:
            return first
    return await _loop_async(_Call(policy, guards), None, fn, args, kwargs)


async def _bare_breaker_async(
    policy: Policy,
    guards: Guards,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The bare first attempt through a closed breaker (see `_bare_sync`):
    counted without a permit."""
    cb = guards.breaker
    assert cb is not None  # noqa: S101 - breaker_only says so
    ticket = cb._closed_ticket()  # noqa: SLF001
    if ticket is None:
        return _NOT_BARE
    start = _clock._clock.now()  # noqa: SLF001
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        verdict = attempt_outcome(cb, exc, own_timeout=False)
        if not isinstance(exc, Exception):
            cb._settle_closed(*ticket, verdict)  # noqa: SLF001
            raise
        await cb._asettle_closed(*ticket, verdict)  # noqa: SLF001
        call = _Call(policy, guards, start, math.inf)
        return _Resume(call, await _failed_async(call, exc))
    await cb._asettle_closed(*ticket, SUCCESS)  # noqa: SLF001
    return result


async def _loop_async(
    call: _Call,
    step: Retry | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    policy, guards = call.policy, call.guards
    attempt = functools.partial(_attempt, call, fn, args, kwargs)
    while True:
        if step is not None:
            await _ahook(policy.before_sleep, step.event)
            await _async_wait(call.clock, step.delay)
        call.begin()
        try:
            if guards is None or not guards.admits:
                result = await attempt()
            else:
                result = await guards.acall(call, attempt)
        except BaseException as exc:  # noqa: BLE001 - re-raised on give-up
            step = await _failed_async(call, exc)
        else:
            outcome = call.returned(result)
            if not isinstance(outcome, Retry):
                if outcome is not None:
                    await _ahook(policy.on_give_up, outcome.event)
                return result
            step = outcome


async def _attempt(
    call: _Call,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Arm the attempt deadline and run the call under it."""
    at = call.arm()
    with call.cancel_scope(at) as scope:
        result = await fn(*args, **kwargs)
    if scope.cancelled_caught:
        raise _timed_out(at)
    return result


async def _async_wait(clock: Clock, delay: float) -> None:
    """Wait *delay*; a zero wait is one checkpoint and no timer."""
    if delay > 0:
        await clock.asleep(delay)
    else:
        await anyio.lowlevel.checkpoint()


def _guards(policy: Policy) -> Guards | None:
    from resilient._pipeline import Guards  # noqa: PLC0415

    return Guards.of(policy)


def call_through(
    policy: Policy,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """`Policy.call`: one call through the sync shell."""
    if policy.has_async_hooks:
        _refuse_async_hooks(policy)(fn)
    return _call_sync(policy, _guards(policy), fn, args, kwargs)


async def acall_through(
    policy: Policy,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """`Policy.acall`: one call through the async shell."""
    return await _call_async(policy, _guards(policy), fn, args, kwargs)


def _refuse_async_hooks(
    policy: Policy,
) -> Callable[[Callable[..., Any]], None]:
    def check(fn: Callable[..., Any]) -> None:
        if policy.has_async_hooks:
            raise ConfigTypeError(
                "Policy.before_sleep/on_give_up",
                fn,
                f"of policy {policy.name!r} are async, which a sync "
                "function cannot await",
            )

    return check


def retry(policy: Policy, /) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """
    A decorator that retries a function as *policy* says.

    Works on sync and async functions (detected from the function), methods,
    class methods and static methods, and keeps their signatures.

    Gives up by re-raising the last exception itself, with a note of the
    attempts, elapsed time and policy name; when attempts run out on a
    result the policy retries on, returns that last result.

    Args:
        policy: What to retry, how often, how long to wait.

    Raises:
        ConfigTypeError: *policy* is not a `Policy`, or it has async hooks
            and the function is sync.

    Example:
        >>> import resilient
        >>> @resilient.retry(resilient.Policy(name="flaky", attempts=3))
        ... def fetch() -> str:
        ...     return "ok"
        >>> fetch()
        'ok'

    .. versionadded:: 26.11.0
    """
    if not isinstance(policy, Policy):
        raise ConfigTypeError(
            "retry(policy)", policy, "must be a resilient.Policy"
        )

    # Partials, not closures: one Python frame less per call. The guards
    # are looked up once here, not on every call.
    guards = _guards(policy)
    sync_shell = functools.partial(_call_sync, policy, guards)
    async_shell = functools.partial(_call_async, policy, guards)

    def decorator(fn: Callable[P, T]) -> Callable[P, T]:
        return decorate(
            fn, sync_shell, async_shell, check_sync=_refuse_async_hooks(policy)
        )

    return decorator


@final
class Attempt:
    """
    One attempt of the block form: enter it with ``with`` (or ``async with``
    in async code) around the code to retry.

    An exception the policy retries is swallowed and the loop goes on; any
    other exception, or the last one, propagates out of the loop with a note.
    In async code the attempt is cancelled at its deadline, which raises
    `DeadlineExceeded`.
    """

    __slots__ = (
        "_admission",
        "_async",
        "_at",
        "_call",
        "_entered",
        "_result",
        "_scope",
        "_step",
        "number",
    )

    def __init__(
        self,
        call: _Call,
        admission: _Admission | None = None,
        *,
        is_async: bool,
    ) -> None:
        self._call = call
        self._admission = admission
        self._async = is_async
        self.number = call.attempt
        """The attempt's number: 1 is the first."""
        self._entered = False
        self._result: object = None
        self._step: Retry | GiveUp | None = None
        self._scope: anyio.CancelScope | _NoScope = _NO_SCOPE
        self._at = math.inf

    def __repr__(self) -> str:
        return f"<Attempt {self.number} of {self._call.policy.name!r}>"

    def remaining(self) -> float:
        """Seconds left for this attempt (`math.inf` if unbounded)."""
        if self._at == math.inf:
            return math.inf
        return max(0.0, self._at - self._call.clock.now())

    def set_result(self, value: object) -> None:
        """
        Hand the block's result to the policy's ``retry_if_result``: when it
        asks for a retry, the loop goes on.
        """
        self._result = value

    def _enter(self) -> Attempt:
        if self._entered:
            raise RuntimeError("an Attempt can be entered only once")
        self._entered = True
        self._call.resume()
        self._at = self._call.arm()
        if self._async:
            self._scope = self._call.cancel_scope(self._at)
            self._scope.__enter__()
        return self

    def _close_scope(
        self, exc: BaseException | None
    ) -> tuple[BaseException | None, bool]:
        """The exception that counts, and whether we replaced it."""
        if self._scope is not _NO_SCOPE:
            self._scope.__exit__(
                type(exc) if exc else None,
                exc,
                exc.__traceback__ if exc else None,
            )
            if self._scope.cancelled_caught:
                return _timed_out(self._at), True
        return exc, False

    def _decide(self, err: BaseException | None) -> Retry | GiveUp | None:
        if err is None:
            self._step = self._call.returned(self._result)
        else:
            self._step = self._call.failed(err)
        return self._step

    @staticmethod
    def _finish(
        step: Retry | GiveUp | None, exc: BaseException | None, replaced: bool
    ) -> bool:
        if isinstance(step, Retry):
            return exc is not None  # Swallow what we retry.
        if replaced:
            raise exc  # type: ignore[misc]
        return False

    def __enter__(self) -> Attempt:
        if self._async and self._call.policy.has_async_hooks:
            raise TypeError(
                f"policy {self._call.policy.name!r} has async hooks: "
                "enter attempts with `async with attempt:`"
            )
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        err, replaced = self._close_scope(exc)
        if self._admission is not None:
            self._admission.settle(err, own_timeout=self._call.own_timeout)
        step = self._decide(err)
        if isinstance(step, GiveUp):
            _hook(self._call.policy.on_give_up, step.event)
        return self._finish(step, err, replaced)

    async def __aenter__(self) -> Attempt:
        return self._enter()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        err, replaced = self._close_scope(exc)
        admission = self._admission
        if admission is not None:
            own = self._call.own_timeout
            if err is None or isinstance(err, Exception):
                await admission.asettle(err, own_timeout=own)
            else:
                admission.settle(err, own_timeout=own)
        step = self._decide(err)
        if isinstance(step, GiveUp):
            await _ahook(self._call.policy.on_give_up, step.event)
        return self._finish(step, err, replaced)


@final
class _Attempts:
    """
    The iterator of the block form; one per loop.

    The admission stages (breaker, bulkhead) run here, before an attempt
    is handed out: a context manager cannot skip its block, so a rejection
    is retried (or raised) by the iterator itself.
    """

    __slots__ = ("_async", "_call", "_guards", "_last", "_policy")

    def __init__(
        self, policy: Policy, guards: Guards | None, *, is_async: bool
    ) -> None:
        self._policy = policy
        self._guards = guards
        self._async = is_async
        self._call: _Call | None = None
        self._last: Attempt | None = None

    def _advance(self) -> Retry | None:
        """None to start; the pending retry; or raise _Stop."""
        last = self._last
        if last is None:
            self._call = _Call(self._policy, self._guards)
            return None
        if not last._entered:  # noqa: SLF001
            self._call.abandon()  # type: ignore[union-attr]
            raise RuntimeError(
                "each attempt must be entered: `with attempt:` "
                "(or `async with attempt:`)"
            )
        step = last._step  # noqa: SLF001
        if isinstance(step, Retry):
            return step
        raise _Stop

    def _new(self, admission: _Admission | None) -> Attempt:
        assert self._call is not None  # noqa: S101
        self._last = Attempt(self._call, admission, is_async=self._async)
        return self._last

    def __iter__(self) -> Iterator[Attempt]:
        return self

    def __next__(self) -> Attempt:
        try:
            step = self._advance()
        except _Stop:
            raise StopIteration from None
        call, guards = self._call, self._guards
        assert call is not None  # noqa: S101
        while True:
            if step is not None:
                _hook(self._policy.before_sleep, step.event)
                if step.delay > 0:
                    call.clock.sleep(step.delay)
            call.begin()
            if guards is None or not guards.admits:
                call.suspend()
                return self._new(None)
            try:
                admission = guards.admit()
            except BaseException as exc:
                decided = call.failed(exc)
                if isinstance(decided, GiveUp):
                    _hook(self._policy.on_give_up, decided.event)
                    raise
                step = decided
            else:
                call.suspend()
                return self._new(admission)

    def __aiter__(self) -> AsyncIterator[Attempt]:
        return self

    async def __anext__(self) -> Attempt:
        try:
            step = self._advance()
        except _Stop:
            raise StopAsyncIteration from None
        call, guards = self._call, self._guards
        assert call is not None  # noqa: S101
        while True:
            if step is not None:
                await _ahook(self._policy.before_sleep, step.event)
                await _async_wait(call.clock, step.delay)
            call.begin()
            if guards is None or not guards.admits:
                call.suspend()
                return self._new(None)
            try:
                admission = await guards.aadmit()
            except BaseException as exc:
                decided = call.failed(exc)
                if isinstance(decided, GiveUp):
                    await _ahook(self._policy.on_give_up, decided.event)
                    raise
                step = decided
            else:
                call.suspend()
                return self._new(admission)


class _Stop(Exception):
    """The loop is over (success, or a kept result)."""


@final
class Retrying:
    """
    The block form of retry, for code that is not a function.

    Iterate it with ``for`` in sync code and ``async for`` in async code; each
    item is an `Attempt` to enter around the code::

        for attempt in resilient.retrying(policy):
            with attempt:
                response = client.get(url)

        async for attempt in resilient.retrying(policy):
            async with attempt:
                response = await client.get(url)

    Same semantics as `retry`. Each iteration starts a fresh call, so one
    `Retrying` can be iterated many times.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("_guards", "policy")

    def __init__(self, policy: Policy, /) -> None:
        if not isinstance(policy, Policy):
            raise ConfigTypeError(
                "retrying(policy)", policy, "must be a resilient.Policy"
            )
        self.policy = policy
        self._guards = _guards(policy)

    def __repr__(self) -> str:
        return f"retrying({self.policy!r})"

    def __iter__(self) -> Iterator[Attempt]:
        if self.policy.has_async_hooks:
            raise ConfigTypeError(
                "Policy.before_sleep/on_give_up",
                self.policy,
                "are async, which a sync `for` loop cannot await",
            )
        return _Attempts(self.policy, self._guards, is_async=False)

    def __aiter__(self) -> AsyncIterator[Attempt]:
        return _Attempts(self.policy, self._guards, is_async=True)


retrying = Retrying
