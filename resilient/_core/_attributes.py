"""
What resilient's spans, events and log records say, bounded: text cut to
`TEXT_LIMIT`, qualified type names, an exception event's attributes (its
message only when `configure_telemetry` allows it), a failed span's status,
and which outcomes count as rejections and give-ups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from opentelemetry.trace import Status, StatusCode

from resilient._core._providers import TELEMETRY
from resilient.exceptions import BulkheadFull, CircuitOpen, Rejected


if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from resilient._core._decisions import RetryEvent


TEXT_LIMIT: Final = 256
"""The most characters of an exception message, or of any other text value
(a policy's name), that resilient puts in a span attribute; longer text is
cut there and ends with an ellipsis."""


def bounded(text: str) -> str:
    """*text* cut to `TEXT_LIMIT` characters (and an ellipsis)."""
    if len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + "\u2026"


def type_name(obj: object) -> str:
    """
    The fully qualified name of *obj*'s type, bounded, as OpenTelemetry's
    ``exception.type`` wants it: ``ConnectionError``,
    ``httpx.ConnectTimeout``, ``resilient.exceptions.CircuitOpen`` (the
    module is left out for built-ins only). Every event, attribute and log
    record resilient makes names a type this way.
    """
    cls = type(obj)
    module = cls.__module__
    name = cls.__qualname__
    return bounded(name if module in {"builtins", ""} else f"{module}.{name}")


def exception_attributes(exc: BaseException) -> dict[str, str]:
    """
    The attributes of an ``exception`` span event, bounded: the qualified
    type and (unless configured off) the message cut to `TEXT_LIMIT`; no
    traceback (the SDK's ``record_exception`` copies it whole, with every
    message in its chain).
    """
    name = type(exc).__qualname__
    attributes = {"exception.type": type_name(exc)}
    if TELEMETRY.record_messages:
        try:
            message = str(exc)
        except Exception:  # noqa: BLE001 - a broken __str__
            message = f"<unprintable {name}>"
        attributes["exception.message"] = bounded(message)
    return attributes


def record_failure(span: Span, exc: BaseException) -> None:
    """Mark *span* failed by *exc*: a bounded event and the ERROR status."""
    span.add_event("exception", exception_attributes(exc))
    span.set_status(Status(StatusCode.ERROR, type_name(exc)))


def is_rejection(exc: BaseException | None) -> bool:
    """
    Whether *exc* is a stage's rejection that retry outwaits (a `Rejected`
    that says when to come back): the attempt never reached the
    dependency, so it is not counted as one.
    """
    return isinstance(exc, Rejected) and exc.retry_after is not None


def is_give_up(event: RetryEvent) -> bool:
    """
    Whether *event* is a real give-up: retrying stopped on a call that had
    been retried, or that would have been but for the time left, the retry
    budget or a stage that would not admit. A first attempt's error that
    the policy does not retry at all (a 404, or any error when it allows
    one attempt) is a plain failure, not one.
    """
    return event.attempt > 1 or event.reason not in _PLAIN_FAILURES


_PLAIN_FAILURES: Final = frozenset({"not_retryable", "attempts", None})


def stage_attributes(
    attributes: dict[str, str | float | int], exc: BaseException | None
) -> None:
    """The name of the stage that rejected *exc*'s attempt."""
    if isinstance(exc, CircuitOpen):
        attributes["resilient.breaker"] = bounded(exc.name)
    elif isinstance(exc, BulkheadFull):
        attributes["resilient.bulkhead"] = bounded(exc.name)
