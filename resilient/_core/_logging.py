"""
What resilient logs through the standard library's `logging`: scheduled
retries, give-ups and breaker state changes, with structured ``extra``
fields (see docs/instrumentation.md for every record).

The library configures no handler, not even a `logging.NullHandler`: an
application that configures no logging at all still sees warnings on
stderr through Python's last-resort handler (a NullHandler would hide
them), and one that configures logging decides everything else.

Every emitter asks `Logger.isEnabledFor` first (which the standard library
caches per logger and level) and builds nothing when the level is off; the
emitters run on failure paths only, never on a first attempt's success.

Every record goes out through `emit`, which isolates the caller from the
handlers: a handler or filter that raises (a log shipper that is down)
drops its record, as `logging.Handler.handleError` would, and never
changes what the call does (it ended a retrying call at its first retry's
record).
"""

from __future__ import annotations

import logging
import math
import sys
import traceback
from typing import TYPE_CHECKING, Any, Final

from resilient._core._telemetry import (
    TELEMETRY,
    bounded,
    is_give_up,
    type_name,
)
from resilient._core._transient import http_status
from resilient.exceptions import BulkheadFull, CircuitOpen, Rejected


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._breaker._records import BreakerTransition
    from resilient._core._decisions import RetryEvent


RETRY: Final = logging.getLogger("resilient.retry")
"""Scheduled retries, outwaited rejections and give-ups."""

BREAKER: Final = logging.getLogger("resilient.breaker")
"""Circuit breaker state changes."""

RETRY_LEVEL: Final = logging.WARNING
"""A scheduled retry: a dependency failed (stamina's level too)."""

RETRY_CACHED: Final[Callable[[int], bool | None]] = getattr(
    RETRY, "_cache", {}
).get
"""What `Logger.isEnabledFor` cached for a level of `RETRY`, without its
frame: False means off (the standard library clears this cache in place
whenever a level changes); True or None, ask ``isEnabledFor``."""

REJECTED_LEVEL: Final = logging.INFO
"""An attempt a stage (an open breaker) rejected, outwaited: the breaker's
opening was already a warning; one per waiting call would flood."""

GIVE_UP_LEVEL: Final = logging.WARNING
"""A give-up: the error reaches the caller, who decides whether it is one
(a fallback may answer); ERROR here would log each failure twice."""

NOT_RETRIED_LEVEL: Final = logging.DEBUG
"""A first attempt's failure the policy does not retry (a 404, or any
error when it allows one attempt): not a give-up, only the answer to "why
was this not retried?"."""


def emit(
    logger: logging.Logger,
    level: int,
    msg: str,
    *args: object,
    extra: dict[str, Any] | None = None,
    exc_info: bool = False,
) -> None:
    """
    ``logger.log(level, msg, *args, ...)``, isolated: an `Exception` a
    handler or a filter raises is reported on stderr (when
    `logging.raiseExceptions` is on, as `logging.Handler.handleError` does)
    and the record dropped; the caller goes on as if it had been logged.
    """
    try:
        # The record's place is emit's caller (stacklevel), as if it
        # had called the logger itself.
        logger.log(
            level,
            msg,
            *args,
            extra=extra,
            exc_info=True if exc_info else None,
            stacklevel=2,
        )
    except Exception:  # noqa: BLE001 - the record is dropped, never the call
        if logging.raiseExceptions:
            try:
                sys.stderr.write(
                    "--- resilient: a logging handler raised; record "
                    f"dropped: {msg % args if args else msg}\n"
                )
                traceback.print_exc(file=sys.stderr)
            except Exception:  # noqa: BLE001, S110 - nowhere left to say it
                pass


_OPENED_LEVEL: Final = logging.WARNING
_OPEN_STATES: Final = frozenset({"open", "forced_open"})
_OTHER_LEVEL: Final = logging.INFO


def _failure(
    extra: dict[str, object], exc: BaseException | None, result: object
) -> str:
    """Add what failed to *extra*; the text the message shows for it."""
    if exc is None:
        status = http_status(result)
        kind = type_name(result)
        extra["resilient_result_type"] = kind
        if status is not None:
            extra["http_status_code"] = status
            return f"returned {kind} (status {status})"
        return f"returned {kind}"
    kind = extra["exception_type"] = type_name(exc)
    if isinstance(exc, CircuitOpen):
        extra["resilient_breaker"] = bounded(exc.name)
    elif isinstance(exc, BulkheadFull):
        extra["resilient_bulkhead"] = bounded(exc.name)
    status = http_status(exc)
    if status is not None:
        extra["http_status_code"] = status
    if not TELEMETRY.record_messages:
        return f"raised {kind}"
    try:
        message = one_line(bounded(str(exc)))
    except Exception:  # noqa: BLE001 - a broken __str__
        message = f"<unprintable {kind}>"
    extra["exception_message"] = message
    return f"raised {kind}: {message}" if message else f"raised {kind}"


def one_line(text: str) -> str:
    """
    *text* on one line: a log record is one line, and an exception's
    message may have several (httpx's status errors have two); its lines
    are joined with a space, each stripped, the empty ones dropped.
    """
    if "\n" not in text and "\r" not in text:
        return text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _base(event: RetryEvent) -> dict[str, object]:
    return {
        "resilient_policy": bounded(event.policy),
        "resilient_attempt": event.attempt,
        "resilient_elapsed": event.elapsed,
    }


def retry_scheduled(event: RetryEvent) -> None:
    """
    A retry is scheduled after *event*'s attempt failed. The caller asks
    ``RETRY.isEnabledFor(RETRY_LEVEL)`` first: the one record on a
    successful retry's path, guarded without a call when off.
    """
    log = RETRY
    extra = _base(event)
    extra["resilient_delay"] = event.delay
    extra["resilient_delay_source"] = event.delay_source
    what = _failure(extra, event.exception, event.result)
    emit(
        log,
        logging.WARNING,
        "resilient: %r attempt %d %s; retrying in %.3f s (%s)",
        extra["resilient_policy"],
        event.attempt,
        what,
        event.delay,
        event.delay_source,
        extra=extra,
    )


def rejection_outwaited(event: RetryEvent) -> None:
    """A stage rejected *event*'s attempt before it ran; it runs again
    after the delay."""
    log = RETRY
    if not log.isEnabledFor(REJECTED_LEVEL):
        return
    extra = _base(event)
    extra["resilient_delay"] = event.delay
    extra["resilient_delay_source"] = event.delay_source
    exc = event.exception
    extra["exception_type"] = type_name(exc)
    stage = _stage(extra, exc)
    emit(
        log,
        logging.INFO,
        "resilient: %r attempt %d rejected by %s; trying again in %.3f s",
        extra["resilient_policy"],
        event.attempt,
        stage,
        event.delay,
        extra=extra,
    )


def _stage(extra: dict[str, object], exc: BaseException | None) -> str:
    """The rejecting stage, named in *extra* and in words."""
    if isinstance(exc, CircuitOpen):
        extra["resilient_breaker"] = name = bounded(exc.name)
        return f"breaker {name!r} ({exc.state})"
    if isinstance(exc, BulkheadFull):
        extra["resilient_bulkhead"] = name = bounded(exc.name)
        return f"bulkhead {name!r} ({exc.reason})"
    return type_name(exc) if isinstance(exc, Rejected) else "a stage"


def gave_up(event: RetryEvent) -> None:
    """Retrying stopped without success (see `is_give_up`)."""
    if not is_give_up(event):
        log = RETRY
        if log.isEnabledFor(NOT_RETRIED_LEVEL):
            extra = _base(event)
            extra["resilient_reason"] = reason = event.reason
            what = _failure(extra, event.exception, event.result)
            emit(
                log,
                logging.DEBUG,
                "resilient: %r attempt 1 %s; not retried (%s)",
                extra["resilient_policy"],
                what,
                "not retryable" if reason == "not_retryable" else "1 attempt",
                extra=extra,
            )
        return
    log = RETRY
    if not log.isEnabledFor(GIVE_UP_LEVEL):
        return
    extra = _base(event)
    extra["resilient_reason"] = reason = event.reason
    what = _failure(extra, event.exception, event.result)
    emit(
        log,
        logging.WARNING,
        "resilient: gave up on %r after %d attempt%s in %.3f s (%s); "
        "the last attempt %s",
        extra["resilient_policy"],
        event.attempt,
        "" if event.attempt == 1 else "s",
        event.elapsed,
        (reason or "").replace("_", " "),
        what,
        extra=extra,
    )


def fallback_answered(
    name: str, event: RetryEvent | None, exc: BaseException
) -> None:
    """
    The policy's fallback answered in place of *exc*, the call's final
    error: said as such, in place of the give-up record (*event*, when
    retry gave up) that would otherwise have been logged.
    """
    log = RETRY
    serious = event is None or is_give_up(event)
    level = GIVE_UP_LEVEL if serious else NOT_RETRIED_LEVEL
    if not log.isEnabledFor(level):
        return
    if event is None:
        extra: dict[str, object] = {"resilient_policy": bounded(name)}
        how = ""
    else:
        extra = _base(event)
        extra["resilient_reason"] = reason = event.reason
        how = (
            f" after {event.attempt} attempt"
            f"{'' if event.attempt == 1 else 's'} in {event.elapsed:.3f} s "
            f"({(reason or '').replace('_', ' ')})"
        )
    extra["resilient_fallback"] = True
    what = _failure(extra, exc, None)
    log.log(
        level,
        "resilient: the fallback answered for %r%s; the call %s",
        extra["resilient_policy"],
        how,
        what,
        extra=extra,
    )


def breaker_transition(event: BreakerTransition) -> None:
    """A breaker changed state: opening (or being forced open) is a
    warning, the rest info."""
    new = event.new.value
    opened = new in _OPEN_STATES
    level = _OPENED_LEVEL if opened else _OTHER_LEVEL
    log = BREAKER
    if not log.isEnabledFor(level):
        return
    extra: dict[str, object] = {
        "resilient_breaker": bounded(event.name),
        "resilient_breaker_from": event.old.value,
        "resilient_breaker_state": new,
        "resilient_breaker_reason": event.reason,
        "resilient_breaker_retry_after": event.retry_after,
    }
    # The failure that opened it, where the breaker says (``opened_by``).
    cause = getattr(event, "opened_by", None)
    if isinstance(cause, BaseException):
        when = f" after {_failure(extra, cause, None).removeprefix('raised ')}"
    else:
        when = ""
    if opened:
        wait = event.retry_after
        when += (
            "; until reset"
            if wait == math.inf
            else f"; next probe in {wait:.3f} s"
        )
    emit(
        log,
        level,
        "resilient: breaker %r %s -> %s (%s)%s",
        extra["resilient_breaker"],
        event.old.value,
        new,
        event.reason.replace("_", " "),
        when,
        extra=extra,
    )
