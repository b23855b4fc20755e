"""
What the retry machine leans on: its records (`RetryEvent`, `Retry`) made
without attrs' frozen ``__init__`` (about half the cost of a retry's
bookkeeping), the non-idempotent rule it asks of a response, and the
methods of both (`MachineRecords`, its base).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Final

from resilient._core._decisions import GiveUp, Retry, RetryEvent
from resilient._core._hints import default_retry_after
from resilient._core._logging import emit
from resilient._core._transient import Transient, every_leaf, http_status
from resilient._retry._asks import accepts, backoff_raised, hint, not_a_delay
from resilient._retry._notes import WrongShell


if TYPE_CHECKING:
    import random
    from collections.abc import Callable

    from resilient._core._decisions import DelaySource, GiveUpReason
    from resilient._core._settings import RetrySettings


# The machine's records made without attrs' frozen __init__ (one
# object.__setattr__ call per field, about half the cost of a retry's
# bookkeeping): each field stored through its slot descriptor, once, on a
# new object; the records are as frozen as attrs makes them.
_new: Final = object.__new__
_EVENT_SLOTS: Final = tuple(
    RetryEvent.__dict__[name].__set__
    for name in (
        "policy",
        "attempt",
        "elapsed",
        "delay",
        "exception",
        "result",
        "reason",
        "delay_source",
    )
)
_RETRY_SLOTS: Final = tuple(
    Retry.__dict__[name].__set__ for name in ("delay", "event")
)


def new_retry(delay: float, event: RetryEvent) -> Retry:
    """``Retry(delay, event)``, made faster (see `_EVENT_SLOTS`)."""
    step = _new(Retry)
    set_delay, set_event = _RETRY_SLOTS
    set_delay(step, delay)
    set_event(step, event)
    return step


def new_event(  # noqa: PLR0917 - one argument per field, in field order.
    policy: str,
    attempt: int,
    elapsed: float,
    delay: float | None,
    exception: BaseException | None,
    result: object,
    reason: GiveUpReason | None,
    delay_source: DelaySource | None,
) -> RetryEvent:
    """``RetryEvent(...)`` with every field given, made faster."""
    event = _new(RetryEvent)
    (
        set_policy,
        set_attempt,
        set_elapsed,
        set_delay,
        set_exception,
        set_result,
        set_reason,
        set_source,
    ) = _EVENT_SLOTS
    set_policy(event, policy)
    set_attempt(event, attempt)
    set_elapsed(event, elapsed)
    set_delay(event, delay)
    set_exception(event, exception)
    set_result(event, result)
    set_reason(event, reason)
    set_source(event, delay_source)
    return event


log: Final = logging.getLogger("resilient")
_DEFAULT_RULE: Final = Transient()


def may_repeat(policy: RetrySettings, response: object) -> bool:
    """
    Whether the request a response answered may be sent again: the
    non-idempotent rule of the policy's `Transient` (of the default one
    when *retry_on* is something else), the same as for errors. A rule
    that raises is logged and the result is not retried.
    """
    retry_on = policy.retry_on
    rule = retry_on if isinstance(retry_on, Transient) else _DEFAULT_RULE
    try:
        return rule.may_repeat(response)
    except Exception:  # noqa: BLE001 - logged (emit)
        emit(
            log,
            logging.ERROR,
            "resilient: reading the request of %r (policy %r) raised; "
            "the result is not retried",
            response,
            policy.name,
            exc_info=True,
        )
        return False


class MachineRecords:
    """
    The `RetryMachine`'s records of its decisions (`RetryEvent`, `GiveUp`),
    which a driver reading no records never makes, and what it reads
    besides its decision: an admission wait's spread (and the outwaiting
    of a stage's rejection), a response's hint and whether its request
    may be sent again.
    """

    __slots__ = ()

    # The machine's fields these read (its own slots).
    policy: RetrySettings
    attempt: int
    start: float
    _now: Callable[[], float]
    _source: DelaySource
    rng: random.Random
    deadline: float
    _previous: float

    def _spread(self, wait: float) -> float:
        """
        A stage's wait T, spread uniformly over [T, T + max(T, cap)],
        where cap is the backoff's cap (the policy's own word on how widely
        it spreads retries): every caller waiting for the same breaker would
        otherwise come back in the instant it closes, and re-open it (see
        "Retry and an open breaker" in docs/design.md).
        """
        if wait == math.inf:
            return wait
        cap = getattr(self.policy.backoff, "cap", 0.0)
        return wait + self.rng.uniform(0.0, max(wait, cap))

    def _may_repeat(self, response: object) -> bool:
        """Whether the request *response* answered may be sent again."""
        return may_repeat(self.policy, response)

    def _result_hint(self, value: object) -> float | None:
        """A response's own ``Retry-After``, read with the default reader
        (a user's reader is written for exceptions): for response-like
        results only (they carry an HTTP status)."""
        if (
            self.policy.retry_after is not default_retry_after
            or http_status(value) is None
        ):
            return None
        return hint(self.policy, value)  # type: ignore[arg-type]

    def _give_up(
        self, reason: GiveUpReason, exc: BaseException | None, result: object
    ) -> GiveUp:
        return GiveUp(
            reason, self._event(exc, result, None, reason, self.attempt)
        )

    def _retry_event(
        self,
        exc: BaseException | None,
        result: object,
        delay: float,
        attempt: int,
    ) -> RetryEvent:
        return self._record(
            exc, result, delay, None, attempt, source=self._source
        )

    def _event(
        self,
        exc: BaseException | None,
        result: object,
        delay: float | None,
        reason: GiveUpReason | None,
        attempt: int,
    ) -> RetryEvent:
        return self._record(exc, result, delay, reason, attempt, source=None)

    def _record(
        self,
        exc: BaseException | None,
        result: object,
        delay: float | None,
        reason: GiveUpReason | None,
        attempt: int,
        *,
        source: DelaySource | None,
    ) -> RetryEvent:
        return new_event(
            self.policy.name,
            attempt,
            self._now() - self.start,
            delay,
            exc,
            result,
            reason,
            source,
        )

    def attempt_deadline(self) -> float:
        """The absolute deadline of the attempt about to start."""
        timeout = self.policy.timeout
        if timeout is None:
            return self.deadline
        return min(self.deadline, self._now() + timeout)

    def is_transient(self, exc: Exception) -> bool:
        """
        Whether the policy retries *exc*; a predicate that raises is logged
        and the error is not retried.

        An `ExceptionGroup` (an error inside a task group) is retried when
        *retry_on* accepts the group itself or every one of its leaves
        (the exceptions in it and in its nested groups).
        """
        if isinstance(exc, WrongShell):
            return False
        if accepts(self.policy, exc):
            return True
        if isinstance(exc, ExceptionGroup):
            return every_leaf(exc, self._accepts_leaf)
        return False

    def _accepts_leaf(self, leaf: BaseException) -> bool:
        return (
            isinstance(leaf, Exception)
            and not isinstance(leaf, WrongShell)
            and accepts(self.policy, leaf)
        )

    def _backoff(self) -> float | None:
        """The backoff's delay; None (logged) when it is not a delay."""
        backoff = self.policy.backoff
        try:
            delay = backoff.delay(self.attempt - 1, self._previous, self.rng)
            if 0.0 <= delay < math.inf:
                return delay
            not_a_delay(self.policy, delay)
        except Exception:  # noqa: BLE001 - logged: a broken backoff
            backoff_raised(self.policy)
        return None
