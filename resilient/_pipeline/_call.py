"""
One call's state, shared by every driver: the clock, the lazily made retry
machine, the telemetry recorder, the guards and the deadline tokens.

Every context change it makes (the deadline context variable, the attempt
span made current, the call span made current between attempts) is undone
by `end_attempt`, `exit_deadline` or, on any other way out, `abort`.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import TYPE_CHECKING, Any, Final, Literal, final, overload

from resilient._core import _clock, _logging, _state
from resilient._core._decisions import GiveUp, Retry
from resilient._core._telemetry import recorder
from resilient._pipeline._cut import may_repeat
from resilient._retry._machine import RetryMachine, note
from resilient._timeout._watchdog import AttemptDeadline
from resilient.exceptions import (
    CircuitOpen,
    DeadlineExceeded,
    GaveUpOnResult,
    Rejected,
)


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._core._decisions import GiveUpReason, RetryEvent
    from resilient._core._settings import RetrySettings
    from resilient._core._telemetry import CallRecorder
    from resilient._pipeline._guards import Guards


log: Final = logging.getLogger("resilient")
_RETRY_LOG: Final = _logging.RETRY
_RETRY_LEVEL: Final = _logging.RETRY_LEVEL
_RETRY_CACHED: Final = _logging.RETRY_CACHED
_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001
_LOST: Final = object()
"""A token being set: its value is current, the token may be lost."""


@final
class Call:
    """
    One call through a policy. An attempt is `start_attempt` (its span
    made current, its deadline current) and `end_attempt`; admission and
    hooks run with the call's own deadline current (`enter_deadline`).
    """

    __slots__ = (
        "_at",
        "_deadline",
        "_held",
        "_machine",
        "_outer",
        "_prior",
        "_rec",
        "_start",
        "_token",
        "clock",
        "guards",
        "hold",
        "own_timeout",
        "policy",
    )

    def __init__(
        self,
        policy: RetrySettings,
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
        # min(outer, start + budget), without the call.
        self._deadline = (
            outer
            if budget is None or outer <= start + budget
            else start + budget
        )
        self._machine: RetryMachine | None = None
        self._held: RetryEvent | None = None
        """A give-up not logged yet: a fallback may answer in its place."""
        self._rec: CallRecorder | None = recorder(policy.name)
        self._token: Any = None
        self._prior = math.inf
        """The deadline `enter_deadline` or `start_attempt` replaced."""
        self._at = math.nan
        self.own_timeout = False
        """Whether the attempt's deadline is the policy's timeout (not the
        call's budget or an enclosing deadline)."""
        self.hold = False
        """Whether a failed attempt's deadline stays current until the next
        attempt (`end_attempt`); the flow sets it."""
        if guards is not None and guards.budget is not None:
            guards.budget.record_call()

    @property
    def deadline(self) -> float:
        """The call's deadline: its budget, or an enclosing deadline."""
        return self._deadline

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
                admission_wait=None
                if guards is None
                or not guards.stages
                or not self.policy.waits_for_breaker
                else guards.admission_wait,
            )
        return m

    @property
    def attempt(self) -> int:
        """The number of the attempt in progress."""
        return 1 if self._machine is None else self._machine.attempt

    def enter_deadline(self) -> None:
        """Make the call's deadline current (admission waits, hooks), and
        its span."""
        if self._token is None:
            # An asynchronous exception can land between the set and the
            # store of its token: _LOST says so, and `exit_deadline` then
            # puts the replaced value back.
            self._prior = _DEADLINE.get()
            self._token = _LOST
            self._token = _DEADLINE.set(self._deadline)
        # Else held since the last attempt (`end_attempt`): the call's
        # deadline is current already, and `exit_deadline` ends the hold.
        if self._rec is not None:
            self._rec.enter()

    def exit_deadline(self) -> None:
        """Undo `enter_deadline` or `start_attempt` (idempotent)."""
        token = self._token
        if token is not None:
            _restore(token, self._prior)
            # Dropped only once undone: an exception landing before this
            # line leaves it for `abort` to undo (`_restore` twice).
            self._token = None
        if self._rec is not None:
            self._rec.exit()

    def start_attempt(self) -> float:
        """Open the attempt's span and make its deadline current."""
        if self._rec is not None:
            self._rec.attempt_started(self.attempt)
        at = self._deadline
        if self.policy.timeout is not None:
            at = self.machine.attempt_deadline()
            self.own_timeout = at < self._deadline
        elif self._token is not None:
            # Held since the last attempt (`end_attempt`): current already.
            return at
        self._at = at
        # `enter_deadline`, inline: one frame less per attempt.
        self._prior = _DEADLINE.get()
        self._token = _LOST
        self._token = _DEADLINE.set(at)
        return at

    def end_attempt(self, exc: BaseException | None) -> bool:
        """
        Undo `start_attempt`; end the span, recording *exc*.

        When the call's `hold` is set (no attempt timeout: every attempt's
        deadline is the call's), a failed attempt leaves its deadline
        current for the next (a retry sets and resets no context
        variable); `exit_deadline` (or `abort`) undoes it on any other way
        on: a hook, an admission, the fallback, the end of the call.
        True when it is held and there are no spans: the next attempt,
        straight after, needs no `start_attempt`.
        """
        rec = self._rec
        if exc is None or not self.hold:
            # `exit_deadline` (and `_restore`), inline: one frame less per
            # attempt.
            token = self._token
            if token is not None:
                if token is _LOST:
                    _DEADLINE.set(self._prior)
                else:
                    try:  # noqa: SIM105 - no context manager's frame
                        _DEADLINE.reset(token)
                    except RuntimeError:  # pragma: no cover - landed
                        pass
                self._token = None
            if rec is None:
                return False
        elif rec is None:
            return True
        rec.attempt_ended(exc)
        return False

    @overload
    def failed(
        self, exc: BaseException, quiet: Literal[False] = False
    ) -> Retry | GiveUp: ...

    @overload
    def failed(
        self, exc: BaseException, quiet: bool
    ) -> Retry | GiveUp | float: ...

    def failed(
        self, exc: BaseException, quiet: bool = False
    ) -> Retry | GiveUp | float:
        """
        The attempt raised (or was rejected): decide and record.

        *quiet* says the caller hands the retry to no hook: when no
        telemetry and no log record want it either, a retry is its delay
        alone (a number), and its `RetryEvent` is never made.
        """
        m = self._machine
        if m is None:
            m = self.machine
        rec = self._rec
        attempt = m.attempt
        if isinstance(exc, CircuitOpen) and not self.policy.waits_for_breaker:
            # Not sat out (`Policy.wait_for_breaker`): the call gives up
            # now, to its fallback if it has one.
            decision: float | GiveUpReason = "breaker_open"
        else:
            own, transient = (
                self._timeout_verdict(exc, attempt)
                if isinstance(exc, DeadlineExceeded)
                else (False, None)
            )
            decision = m.decide_error(exc, own, transient)
        if (
            quiet
            and rec is None
            and not isinstance(decision, str)
            and not (isinstance(exc, Rejected) and exc.retry_after is not None)
            and (
                _RETRY_CACHED(_RETRY_LEVEL) is False
                or not _RETRY_LOG.isEnabledFor(_RETRY_LEVEL)
            )
        ):
            return decision  # Nobody hears of the retry: no records.
        step = m.step(exc, decision, attempt)
        if isinstance(step, Retry):
            if isinstance(exc, Rejected) and exc.retry_after is not None:
                # A stage's rejection, outwaited: not an attempt, not a
                # retry.
                if rec is not None:
                    rec.rejected(step.event)
                _logging.rejection_outwaited(step.event)
            else:
                if rec is not None:
                    rec.retrying(step.event)
                if _RETRY_LOG.isEnabledFor(_RETRY_LEVEL):
                    _logging.retry_scheduled(step.event)
        elif isinstance(step, GiveUp):
            self._gave_up(exc, step)
        return step

    def _timeout_verdict(
        self, exc: DeadlineExceeded, attempt: int
    ) -> tuple[bool, bool | None]:
        """Whether *exc* is the policy's own attempt timeout (retried
        whatever retry_on says, unless it cut a request that must not run
        twice: `may_repeat`), and retry_on's verdict if known (None: ask)."""
        own = self.own_timeout and exc.deadline == self._at
        if type(exc) is DeadlineExceeded:
            self._ended_by(exc, attempt)
            if own and not may_repeat(self.policy.retry_on, exc):
                return False, False
        return own, None

    def _ended_by(self, exc: DeadlineExceeded, attempt: int) -> None:
        """
        Name the limit of this call whose deadline *exc* is (the policy's
        attempt timeout or budget, or a deadline around the call) in its
        message: the error's makers (`timed_out`, `resilient.checkpoint`)
        know only the time. The innermost policy that owns the limit
        names it; a deadline around the call, the innermost that saw it.
        """
        at = exc.deadline
        policy = self.policy
        if self.own_timeout and at == self._at:
            limit, seconds = "timeout", policy.timeout or 0.0
        elif at != self._deadline:
            return
        elif policy.budget is not None and at == self._start + policy.budget:
            limit, seconds = "budget", policy.budget
        else:
            limit, seconds = "deadline", at - self._start
        if exc.limit is None or (exc.limit == "deadline" != limit):
            exc._ended_attempt(policy.name, attempt, limit, seconds)  # noqa: SLF001

    def _gave_up(self, exc: BaseException, step: GiveUp) -> None:
        """Record the give-up *step* on *exc*: its notes, telemetry, log."""
        if isinstance(exc, Exception):
            note(exc, step)
            if step.reason == "retry_budget":
                budget = self.guards.budget  # type: ignore[union-attr]
                _note_once(exc, budget.refusal_note())  # type: ignore[union-attr]
            if self._rec is not None:
                self._rec.gave_up(step.event)
            self._log_give_up(step.event)

    def _log_give_up(self, event: RetryEvent) -> None:
        """Log a give-up now, or, with a fallback, once the call ends
        (`abort`; `fallback_answered` says the fallback's answer)."""
        if self.policy.fallback is None:
            _logging.gave_up(event)
        else:
            self._held = event

    def fallback_answered(self, exc: BaseException) -> None:
        """The fallback answered in place of *exc*: log that, not a
        give-up."""
        event, self._held = self._held, None
        _logging.fallback_answered(self.policy.name, event, exc)

    def returned(self, value: object) -> Retry | GiveUp | None:
        """The attempt returned: accept, retry or give up (keeping it)."""
        if self.policy.retry_if_result is None:
            return None
        step = self.machine.on_result(value)
        if step is not None:
            rec = self._rec
            if isinstance(step, GiveUp):
                if rec is not None:
                    rec.gave_up(step.event)
                _logging.gave_up(step.event)
            else:
                if rec is not None:
                    rec.retrying(step.event)
                if _RETRY_LOG.isEnabledFor(_RETRY_LEVEL):
                    _logging.retry_scheduled(step.event)
        return step

    def kept(self, step: GiveUp) -> Any:
        """What a give-up on a result leaves: the result, or (the policy's
        *last_result* is ``"raise"``) `GaveUpOnResult` carrying it."""
        event = step.event
        if self.policy.last_result == "raise":
            raise GaveUpOnResult(
                event.result, event.attempt, step.reason, event.policy
            )
        return event.result

    def after_hook(self, step: Retry) -> float | GiveUp:
        """The wait left after *step*'s hook (see RetryMachine)."""
        wait = self.machine.after_hook(step)
        if isinstance(wait, GiveUp):
            exc = wait.event.exception
            if isinstance(exc, Exception):
                note(exc, wait)
            if self._rec is not None:
                self._rec.gave_up(wait.event)
            self._log_give_up(wait.event)
        return wait

    def callers_deadline(self, exc: BaseException) -> bool:
        """
        Whether *exc* is the deadline around the call (the caller's: a
        `resilient.timeout` or `deadline` it runs under), not the policy's
        own budget or timeout nor one inside the call: the caller's
        deadline is not the dependency's failure, and passes the fallback
        (as trio's cancellation does, and asyncio's did not).
        """
        return (
            isinstance(exc, DeadlineExceeded)
            and exc.deadline == self._outer
            and self._outer != math.inf
        )

    def fell_back(self, exc: BaseException) -> None:
        """The policy's fallback takes over from *exc*: an event (and an
        attribute) on the call's span."""
        if self._rec is not None:
            self._rec.fell_back(exc)

    def finish(self, exc: BaseException | None) -> None:
        """Close the call's telemetry (idempotent)."""
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.ended(exc)

    def abort(self, exc: BaseException | None) -> None:
        """Any other way out: undo every context change, end every span,
        log a give-up held for a fallback that did not answer."""
        self.exit_deadline()
        self.finish(exc)
        event, self._held = self._held, None
        if event is not None:
            _logging.gave_up(event)

    def cancel_scope(self, at: float) -> Any:
        """A deadline for async work ending at *at* (our clock): the
        loop's watchdog on asyncio, trio's own cancel scope on trio
        (`resilient._timeout._watchdog`), nothing when unbounded."""
        if at == math.inf:
            return NO_SCOPE
        return AttemptDeadline(at - self.clock.now())


def _restore(token: Any, prior: float) -> None:
    """
    Undo the deadline set with *token* (or `_LOST`: put *prior* back by
    value). Twice is harmless: a token reset already (an exception landed
    before its holder dropped it, and the way out undoes it again) is
    left as it is.
    """
    if token is _LOST:
        _DEADLINE.set(prior)
        return
    try:  # noqa: SIM105 - no context manager's frame on every attempt
        _DEADLINE.reset(token)
    except RuntimeError:  # pragma: no cover - landed: used once already
        pass


def _note_once(exc: BaseException, text: str) -> None:
    if text not in getattr(exc, "__notes__", ()):
        exc.add_note(text)


@final
class NoScope:
    """Null object for work with no deadline: a cancel scope costs about
    as much on asyncio as the rest of the call."""

    __slots__ = ()
    cancelled_caught = False

    def __enter__(self) -> NoScope:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


NO_SCOPE: Final = NoScope()


def observable(event: RetryEvent) -> bool:
    """Hooks hear of failures, never of cancellation or interrupts."""
    return event.exception is None or isinstance(event.exception, Exception)


def run_hook(hook: Callable[[RetryEvent], object], event: RetryEvent) -> None:
    """Run a sync hook; a hook that raises is logged and changes nothing."""
    try:
        hook(event)
    except Exception:  # noqa: BLE001 - logged (emit)
        _logging.emit(
            log,
            logging.ERROR,
            "resilient: hook %r raised; ignored",
            hook,
            exc_info=True,
        )


async def arun_hook(
    hook: Callable[[RetryEvent], object], event: RetryEvent
) -> None:
    """Run a hook from async code, awaiting it if it is async."""
    try:
        result = hook(event)
        if inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001 - logged (emit)
        _logging.emit(
            log,
            logging.ERROR,
            "resilient: hook %r raised; ignored",
            hook,
            exc_info=True,
        )
