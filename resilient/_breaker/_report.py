"""
What a breaker tells telemetry: span events on the caller's current span
and two counters, for state changes and rejections; state changes are
logged too (`resilient._core._logging`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from opentelemetry import trace as otel_trace

from resilient._core._logging import breaker_transition
from resilient._core._telemetry import disabled, instruments


if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Meter

    from resilient._breaker._machine import BreakerTransition, Reject


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
    counter: str, event: str, labels: dict[str, str], retry_after: float
) -> None:
    """Count on *counter* and add *event* to the caller's current span."""
    meters = _instruments()
    if meters is not None:
        getattr(meters, counter).add(1, labels)
    span = otel_trace.get_current_span()
    if span.is_recording():
        span.add_event(
            event, {**labels, "resilient.breaker.retry_after": retry_after}
        )


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
    )


def report_rejection(name: str, reject: Reject) -> None:
    """A rejected call: a counter and a span event."""
    if disabled():
        return  # No SDK anywhere: nothing would record the event.
    labels = {
        "resilient.breaker": name,
        "resilient.breaker.state": reject.state.value,
    }
    _report(
        "rejections", "resilient.breaker.rejected", labels, reject.retry_after
    )
