"""
What the state machines decide, and the records they hand to hooks and
telemetry.
"""

from __future__ import annotations

from typing import Literal, final

import attrs


GiveUpReason = Literal[
    "not_retryable",
    "attempts",
    "budget",
    "deadline",
    "retry_budget",
    "breaker_open",
    "rejected",
    "backoff_error",
]
"""Why a retry loop stopped without success:

- ``not_retryable``: the exception is not transient by the policy;
- ``attempts``: the attempts ran out;
- ``budget``: the next attempt could not start within the policy's budget;
- ``deadline``: ... nor within an enclosing deadline;
- ``retry_budget``: the dependency's shared retry budget refused a retry;
- ``breaker_open``: the circuit breaker is open and will not admit a probe
  before the deadline (or, in testing mode, is open at all);
- ``rejected``: another stage (a full bulkhead) rejected the call and will
  not admit it before the deadline (or, in testing mode, at all);
- ``backoff_error``: the backoff raised or returned something that is not a
  finite number of seconds >= 0 (logged).
"""

DelaySource = Literal["backoff", "hint", "hint_capped", "admission"]
"""Where a scheduled retry's delay came from:

- ``backoff``: the policy's backoff;
- ``hint``: a server's hint (``Retry-After`` on the exception or on a
  response-like result), as given;
- ``hint_capped``: a server's hint, cut down to the policy's
  *max_retry_after*;
- ``admission``: a stage that will not admit the call yet (an open breaker,
  a full bulkhead) set the wait, spread with jitter (plus the backoff's).

In testing mode, where every wait is zero, it still says which one would
have applied.
"""


@final
@attrs.frozen
class RetryEvent:
    """
    What happened to one attempt, as hooks and telemetry see it.

    Attributes:
        policy: The policy's name.
        attempt: The number of the attempt that just ended (1 is the first).
        elapsed: Seconds since the call started.
        delay: Seconds until the next attempt; None when giving up.
        exception: The exception the attempt raised, or None if it returned
            a value the policy retries on.
        result: The value the attempt returned, or None.
        reason: Why resilient gave up, or None when it retries.
        delay_source: Where *delay* came from (see `DelaySource`); None
            when giving up.

    .. versionchanged:: 26.12.0
       *delay_source*.
    """

    policy: str
    attempt: int
    elapsed: float
    delay: float | None
    exception: BaseException | None
    result: object = None
    reason: GiveUpReason | None = None
    delay_source: DelaySource | None = None


@final
@attrs.frozen
class Retry:
    """Wait *delay* seconds, then attempt again."""

    delay: float
    event: RetryEvent


@final
@attrs.frozen
class GiveUp:
    """Stop: re-raise the exception, or return the last result."""

    reason: GiveUpReason
    event: RetryEvent
