"""
The retry machine: what to do after each attempt, and nothing else.

Fed the outcome of each attempt and reading the clock, it answers `Retry`
(with the delay) or `GiveUp` (with the reason). It never sleeps, awaits or
runs hooks; the pipeline's flow (`resilient._pipeline._flow`) carries out
what it decides.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Final, final

from resilient._core import _settings, _state
from resilient._core._backoff import _POWERS_OF_TWO, FullJitter
from resilient._core._clock import MonotonicClock
from resilient._core._decisions import (
    DelaySource,
    GiveUp,
    GiveUpReason,
    Retry,
)
from resilient._core._hints import default_retry_after
from resilient._core._logging import emit
from resilient._core._transient import http_status
from resilient._retry._asks import (
    backoff_raised,
    hint,
    not_a_delay,
    type_only,
)
from resilient._retry._notes import WrongShell, note
from resilient._retry._records import MachineRecords, new_retry
from resilient.exceptions import CircuitOpen, Rejected


if TYPE_CHECKING:
    import random
    from collections.abc import Callable

    from resilient._policy import Policy  # For type checkers only.
    from resilient._retry_budget import RetryBudget
    from resilient.typing import Clock


# WrongShell and note (from _notes) are imported from here too.
__all__ = ["RetryMachine", "RetrySettings", "WrongShell", "note"]

log: Final = logging.getLogger("resilient")
_INF: Final = math.inf
_new: Final = object.__new__
_TABLED: Final = len(_POWERS_OF_TWO)
"""The attempts whose `FullJitter` window `decide_transient` computes
inline: retries 0 to 1023, those of the table."""


# What the machine reads of a policy (imported for the protocol's sake: it
# is the API this layer is written against).
RetrySettings = _settings.RetrySettings


@final
class RetryMachine(MachineRecords):
    """
    The decisions of one retrying call, and nothing else.

    Fed the outcome of each attempt and reading the clock, it answers
    `Retry` (with the delay) or `GiveUp` (with the reason). Pure but for the
    jitter it draws from *rng* and the retry budget it asks.

    A user's predicate, hint reader or backoff that raises or returns
    nonsense never replaces the call's own error: it is logged, and the
    error is not retried (the result is accepted).

    Args:
        policy: The policy.
        clock: Where time is read.
        rng: The jitter's random source.
        start: When the call started, on *clock*.
        deadline: The absolute time no attempt may start at or after: the
            earlier of the policy's budget and any enclosing deadline.
        retry_budget: The dependency's shared retry budget, asked before
            every retry; None for no budget.
        admission_wait: Seconds until every admission stage (the breaker)
            admits a call (0 when it would now); a retry never starts
            before that, and gives up at once when that is past the
            deadline.
        breaker_wait: The old name of *admission_wait*.

    .. versionchanged:: 26.12.0
       Outwaits any `resilient.exceptions.Rejected`, not only
       `CircuitOpen`; *admission_wait* is the new name of *breaker_wait*.
    """

    __slots__ = (
        "_budget_end",
        "_max_attempts",
        "_now",
        "_plain",
        "_previous",
        "_rejections",
        "_source",
        "_testing",
        "admission_wait",
        "attempt",
        "clock",
        "deadline",
        "policy",
        "retry_budget",
        "rng",
        "start",
        "wake",
    )

    def __init__(
        self,
        policy: Policy | RetrySettings,
        clock: Clock,
        rng: random.Random,
        start: float,
        *,
        deadline: float = math.inf,
        retry_budget: RetryBudget | None = None,
        admission_wait: Callable[[], float] | None = None,
        breaker_wait: Callable[[], float] | None = None,
    ) -> None:
        self.policy: RetrySettings = policy
        self.retry_budget = retry_budget
        self.admission_wait = (
            admission_wait if admission_wait is not None else breaker_wait
        )
        self.clock = clock
        # The real clock read without its method (a frame less per read).
        self._now: Callable[[], float] = (
            time.monotonic if type(clock) is MonotonicClock else clock.now
        )
        self.rng = rng
        self.start = start
        self._budget_end = (
            start + policy.budget if policy.budget is not None else math.inf
        )
        self.deadline = min(deadline, self._budget_end)
        self.attempt = 1
        """The number of the attempt in progress; 1 is the first."""
        self.wake = start
        """When the wait of the last `Retry` ends, on *clock*."""
        self._previous = 0.0
        self._plain: type | None = None
        """A built-in exception type whose plain instances (no attributes
        of their own) this call retries by their type alone."""
        self._rejections = 0
        self._source: DelaySource = "backoff"
        testing = _state.testing
        self._testing = testing.active
        limit = policy.attempts if policy.attempts is not None else math.inf
        if testing.active and testing.attempts is not None:
            limit = min(limit, testing.attempts)
        self._max_attempts = limit

    def on_error(
        self, exc: BaseException, *, own_timeout: bool = False
    ) -> Retry | GiveUp:
        """
        The attempt raised *exc*: retry it or give up.

        Only instances of `Exception` are retried; cancellation,
        `KeyboardInterrupt` and `SystemExit` give up at once. A `Rejected`
        that says when to come back (the attempt never ran) is outwaited.
        *own_timeout* says *exc* is the policy's own attempt timeout: it
        is retried whatever *retry_on* says.
        """
        attempt = self.attempt
        decision = self.decide_error(exc, own_timeout)
        return self.step(exc, decision, attempt)

    def step(
        self,
        exc: BaseException,
        decision: float | GiveUpReason,
        attempt: int,
    ) -> Retry | GiveUp:
        """
        The records of `decide_error`'s *decision* on *exc*, decided at
        *attempt*: `on_error`'s answer, for a caller that asked
        `decide_error` first (and wants the records only when someone
        reads them).
        """
        if isinstance(decision, str):
            return GiveUp(
                decision, self._event(exc, None, None, decision, attempt)
            )
        return new_retry(
            decision, self._retry_event(exc, None, decision, attempt)
        )

    def decide_error(  # noqa: C901, PLR0911 - its fast paths inline
        self,
        exc: BaseException,
        own_timeout: bool = False,  # Positional too: the simulator calls it.
        transient: bool | None = None,
    ) -> float | GiveUpReason:
        """
        `on_error` without its records: the delay of the retry (a number),
        or why it gives up (a `GiveUpReason`, a str). For a driver that
        reads neither the event nor its hooks (the simulator): the same
        decision, and the same state changes, for less.

        *transient*, when not None, is what *retry_on* says of *exc*,
        already asked (a driver that raises the same error objects asks
        once).
        """
        cls = type(exc)
        if cls is self._plain and transient is None and not exc.__dict__:
            # Another plain instance of a type this call retried: the same
            # answers (transient, no hint), not asked again.
            return self._next(None)
        if isinstance(exc, Rejected) and exc.retry_after is not None:
            return self._outwait(exc, exc.retry_after)
        if not isinstance(exc, Exception):
            return "not_retryable"
        policy = self.policy
        asked = not own_timeout and transient is None
        if not own_timeout:
            if transient is None:
                retry_on = policy.retry_on
                # `is_transient`'s answer for a listed class, without its
                # frames (the common case of a retry).
                transient = (
                    type(retry_on) is tuple
                    and isinstance(exc, retry_on)
                    and not isinstance(exc, WrongShell)
                ) or self.is_transient(exc)
            if not transient:
                return "not_retryable"
        reader = policy.retry_after
        if reader is None or reader is default_retry_after:
            if cls.__module__ == "builtins" and not exc.__dict__:
                # No hint on a plain built-in exception (the default
                # reader's own answer, without its frames).
                if asked and type_only(policy.retry_on, cls):
                    self._plain = cls
                return self._next(None)
            if reader is None:
                return self._next(None)
        return self._next(hint(self.policy, exc))

    def _outwait(
        self, exc: Rejected, retry_after: float
    ) -> float | GiveUpReason:
        """
        A stage rejected the attempt before it reached the dependency:
        wait until the stage may admit it, plus this call's own jitter so
        that a fleet of callers does not return in one wave, if that fits
        in the deadline; else give up now.

        A rejection is not an attempt and spends no retry budget (nothing
        reached the dependency): the deadline bounds the waits, and a call
        tolerates at most as many rejections as it has attempts, so a stage
        that rejects with no wait cannot make it spin. In testing mode,
        where waits are zero, a rejection gives up at once.
        """
        reason: GiveUpReason = (
            "breaker_open" if isinstance(exc, CircuitOpen) else "rejected"
        )
        self._rejections += 1
        if self._testing:
            return reason
        if self._rejections > self._max_attempts:
            return "attempts"
        spread = self._spread(retry_after if retry_after > 0 else 0.0)
        backoff = self._backoff()
        if backoff is None:
            return "backoff_error"
        wait = spread + backoff
        now = self._now()
        if now + wait >= self.deadline:
            return reason
        self.wake = now + wait
        self._source = "admission"
        return wait

    def on_result(self, value: object) -> Retry | GiveUp | None:
        """
        The attempt returned *value*: None accepts it, else retry or give
        up. A predicate that raises is logged and the value accepted.
        """
        check = self.policy.retry_if_result
        if check is None:
            return None
        try:
            retry = check(value)
        except Exception:  # noqa: BLE001 - logged (emit)
            emit(
                log,
                logging.ERROR,
                "resilient: retry_if_result predicate %r of policy %r "
                "raised; the result is accepted",
                check,
                self.policy.name,
                exc_info=True,
            )
            return None
        if not retry:
            return None
        attempt = self.attempt
        decision: float | GiveUpReason
        if http_status(value) is not None and not self._may_repeat(value):
            decision = "not_retryable"
        else:
            decision = self._next(self._result_hint(value))
        if isinstance(decision, str):
            return GiveUp(
                decision, self._event(None, value, None, decision, attempt)
            )
        return new_retry(
            decision, self._retry_event(None, value, decision, attempt)
        )

    def _next(self, hint: float | None) -> float | GiveUpReason:
        """The delay of the next retry, or why there is none."""
        attempt = self.attempt
        if attempt >= self._max_attempts:
            return "attempts"
        testing = self._testing
        source: DelaySource
        if hint is not None:
            cap = self.policy.max_retry_after
            source = "hint_capped" if hint > cap else "hint"
            delay = 0.0 if testing else min(hint, cap)
        elif testing:
            delay, source = 0.0, "backoff"
        else:
            # `_backoff`, inline: one frame less per retry.
            try:
                delay = self.policy.backoff.delay(
                    attempt - 1, self._previous, self.rng
                )
                if not 0.0 <= delay < _INF:
                    not_a_delay(self.policy, delay)
                    return "backoff_error"
            except Exception:  # noqa: BLE001 - logged: a broken backoff
                backoff_raised(self.policy)
                return "backoff_error"
            source = "backoff"
        # Never retry into a stage that will not admit: wait until it may,
        # then this call's backoff on top, so the fleet spreads out.
        blocked = False
        if self.admission_wait is not None and not testing:
            wait = self.admission_wait()
            if wait > 0:
                delay, blocked = self._spread(wait) + delay, True
                source = "admission"
        # Never start a wait that ends at or past the deadline: the attempt
        # after it would have no time left.
        now = self._now()
        if now + delay >= self.deadline:
            return "breaker_open" if blocked else self._late()
        budget = self.retry_budget
        if budget is not None and not budget.try_acquire_retry():
            return "retry_budget"
        self._source = source
        self._previous = delay
        self.attempt = attempt + 1
        self.wake = now + delay
        return delay

    def decide_transient(  # noqa: PLR0911
        self, now: float | None = None
    ) -> float | GiveUpReason:
        """
        `decide_error`'s answer to a transient `Exception` that is not a
        `resilient.exceptions.Rejected` and carries no hint (the policy's
        ``retry_after`` is None, or reads none in it): the same decision
        and state changes, in one frame when neither testing mode nor an
        admission wait applies. For a driver that knows its errors (the
        simulator, whose dependency raises two, asked once).

        *now*, when not None, is the time on the machine's clock, which
        the caller has just read or set (the simulator): the machine does
        not read it again. None reads the clock.

        .. versionadded:: 26.12.0
        """
        attempt = self.attempt
        if attempt >= self._max_attempts:
            return "attempts"
        if self._testing or self.admission_wait is not None:
            return self._next(None)
        policy = self.policy
        backoff = policy.backoff
        try:
            if (
                type(backoff) is FullJitter
                and attempt > 0
                and attempt <= _TABLED
            ):
                # `FullJitter.delay(attempt - 1, ...)`, inline (a frame
                # less per retry of the default backoff): the same window
                # and the same one draw of the same rng, so the same float.
                window = backoff.base * _POWERS_OF_TWO[attempt - 1]
                cap = backoff.cap
                if window < cap:
                    delay = window * self.rng.random()
                else:
                    delay = cap * self.rng.random()
            else:
                delay = backoff.delay(attempt - 1, self._previous, self.rng)
            if not (delay >= 0.0 and delay < _INF):  # NaN too; no chain
                not_a_delay(policy, delay)
                return "backoff_error"
        except Exception:  # noqa: BLE001 - logged: a broken backoff
            backoff_raised(policy)
            return "backoff_error"
        if now is None:
            # An attribute, then a call: `self._now()` looks for a method,
            # slowly.
            clock_now = self._now
            now = clock_now()
        if now + delay >= self.deadline:
            return self._late()
        budget = self.retry_budget
        if budget is not None and not budget.try_acquire_retry():
            return "retry_budget"
        self._source = "backoff"
        self._previous = delay
        self.attempt = attempt + 1
        self.wake = now + delay
        return delay

    def sibling(self, start: float) -> RetryMachine:
        """
        A new machine for another call of this one's policy, clock, rng,
        retry budget and admission wait, starting at *start*, with no
        enclosing deadline: ``RetryMachine(policy, clock, rng, start,
        retry_budget=..., admission_wait=...)``, made for less (a driver
        that makes one per call, the simulator).

        .. versionadded:: 26.12.0
        """
        if self._testing or _state.testing.active:
            return RetryMachine(
                self.policy,
                self.clock,
                self.rng,
                start,
                retry_budget=self.retry_budget,
                admission_wait=self.admission_wait,
            )
        new: RetryMachine = _new(RetryMachine)
        policy = new.policy = self.policy
        new.retry_budget = self.retry_budget
        new.admission_wait = self.admission_wait
        new.clock = self.clock
        new._now = self._now
        new.rng = self.rng
        new.start = new.wake = start
        budget = policy.budget
        end = new._budget_end = start + budget if budget is not None else _INF
        # min(math.inf, end), without the call.
        new.deadline = end if end < _INF else _INF  # noqa: FURB136
        new.attempt = 1
        new._previous = 0.0
        new._plain = None
        new._rejections = 0
        new._source = "backoff"
        new._testing = False
        new._max_attempts = self._max_attempts  # Not testing (above).
        return new

    def _late(self) -> GiveUpReason:
        return "budget" if self.deadline == self._budget_end else "deadline"

    def after_hook(self, step: Retry) -> float | GiveUp:
        """
        The wait left of *step* once its ``before_sleep`` hook has run: the
        hook's time is part of the wait; when the hook ran to or past the
        deadline, give up instead of starting an attempt with no time.
        """
        now = self._now()
        if now >= self.deadline:
            event = step.event
            # The retry *step* counted will not start.
            self.attempt = event.attempt
            return self._give_up(self._late(), event.exception, event.result)
        return max(0.0, min(self.wake, self.deadline) - now)
