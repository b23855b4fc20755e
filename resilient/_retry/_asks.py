"""
What the retry machine asks of a policy's own code (its *retry_on*
predicate, its *retry_after* reader, its backoff), each answer guarded: a
user's function that raises or answers nonsense never replaces the call's
own error; it is logged, and the machine carries on without it. And
whether *retry_on* judges an error by its type alone (`type_only`), so
that a call asks once per type.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Final

from resilient._core._logging import emit
from resilient._core._transient import Transient


if TYPE_CHECKING:
    from resilient._core._settings import RetrySettings


log: Final = logging.getLogger("resilient")


def accepts(policy: RetrySettings, exc: Exception) -> bool:
    """Whether *retry_on* accepts *exc* (a predicate that raises: no)."""
    retry_on = policy.retry_on
    if isinstance(retry_on, tuple):
        return isinstance(exc, retry_on)
    try:
        return bool(retry_on(exc))
    except Exception:  # noqa: BLE001 - logged (emit)
        emit(
            log,
            logging.ERROR,
            "resilient: retry_on predicate %r of policy %r raised; the "
            "error is not retried",
            retry_on,
            policy.name,
            exc_info=True,
        )
        return False


def type_only(retry_on: object, cls: type) -> bool:
    """
    Whether *retry_on* judges a plain instance of the built-in exception
    type *cls* by its type alone: a tuple that lists *cls* itself
    (``isinstance`` asks no ``__instancecheck__`` of an exact type), or a
    `Transient` with no classes of the user's (it caches that verdict per
    type itself) and *cls* no group (judged by its leaves).
    """
    if type(retry_on) is tuple:
        return cls in retry_on
    return (
        type(retry_on) is Transient
        and not retry_on.never
        and not retry_on.also
        and not issubclass(cls, BaseExceptionGroup)
    )


def hint(policy: RetrySettings, exc: Exception) -> float | None:
    """The server's wait hint the policy's reader finds on *exc* (seconds,
    >= 0), or None (no reader, no hint, or a reader that raised)."""
    reader = policy.retry_after
    if reader is None:
        return None
    try:
        seconds = reader(exc)
        if seconds is not None:
            if math.isnan(seconds):
                return None
            seconds = max(seconds, 0.0)
    except Exception:  # noqa: BLE001 - logged (emit)
        emit(
            log,
            logging.ERROR,
            "resilient: retry_after reader %r of policy %r raised; "
            "no hint used",
            reader,
            policy.name,
            exc_info=True,
        )
        return None
    return seconds


def not_a_delay(policy: RetrySettings, delay: object) -> None:
    """Log a backoff's answer that is not a delay."""
    emit(
        log,
        logging.ERROR,
        "resilient: backoff %r of policy %r returned %r, which is "
        "not a finite number of seconds >= 0; giving up",
        policy.backoff,
        policy.name,
        delay,
    )


def backoff_raised(policy: RetrySettings) -> None:
    """Log a backoff that raised (from its ``except`` block)."""
    emit(
        log,
        logging.ERROR,
        "resilient: backoff %r of policy %r raised; giving up",
        policy.backoff,
        policy.name,
        exc_info=True,
    )
