"""
What a breaker tells telemetry: span events on the caller's current span
and two counters, for state changes and rejections; state changes are
logged too (`resilient._core._logging`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from opentelemetry import trace as otel_trace

from resilient._core._logging import breaker_transition
from resilient._core._telemetry import (
    exception_attributes,
    instruments,
)


if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Meter

    from resilient._breaker._records import BreakerState, BreakerTransition


@final
class _Meters:
    """The breaker's instruments on resilient's meter."""

    __slots__ = ("rejections", "transitions")

    def __init__(self, meter: Meter) -> None:
        self.transitions: Counter = meter.create_counter(
            "resilient.breaker.transitions",
            unit="{transition}",
            description="Circuit breaker state changes.",
        )
        self.rejections: Counter = meter.create_counter(
            "resilient.breaker.rejections",
            unit="{call}",
            description="Calls a circuit breaker rejected.",
        )


def _instruments() -> _Meters | None:
    """The breaker's instruments, made once per meter provider."""
    return instruments("breaker", _Meters)


def _report(
    counter: str,
    event: str,
    labels: dict[str, str],
    retry_after: float,
    exc: BaseException | None = None,
) -> None:
    """
    Count on *counter* and add *event* to the caller's current span (with
    the type and message of *exc*, if any, on the event alone).
    """
    meters = _instruments()
    if meters is not None:
        getattr(meters, counter).add(1, labels)
    span = otel_trace.get_current_span()
    if span.is_recording():
        attributes: dict[str, Any] = {
            **labels,
            "resilient.breaker.retry_after": retry_after,
        }
        if exc is not None:
            attributes.update(exception_attributes(exc))
        span.add_event(event, attributes)


def report_transition(event: BreakerTransition) -> None:
    """A state change: a log record, a counter and a span event."""
    breaker_transition(event)
    labels = {
        "resilient.breaker": event.name,
        "resilient.breaker.from": event.old.value,
        "resilient.breaker.state": event.new.value,
        "resilient.breaker.reason": event.reason,
    }
    _report(
        "transitions",
        "resilient.breaker.state_change",
        labels,
        event.retry_after,
        event.opened_by,
    )


def report_rejection(
    name: str,
    retry_after: float,
    state: BreakerState,
    *,
    metrics_only: bool = False,
) -> None:
    """
    A rejected call (one a metrics-only breaker let through all the same):
    a counter and a span event. The caller skips it when telemetry is
    `disabled` (no SDK anywhere: nothing would record the event).
    """
    labels = {
        "resilient.breaker": name,
        "resilient.breaker.state": state.value,
    }
    if metrics_only:
        labels["resilient.breaker.metrics_only"] = "true"
    _report("rejections", "resilient.breaker.rejected", labels, retry_after)
