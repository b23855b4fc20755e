"""
Singleflight's telemetry: one `Recorder` per caller (its span, and the
group's metrics), made only when a tracer or meter provider is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link, Status, StatusCode

from resilient._core._telemetry import (
    TELEMETRY,
    bounded,
    instruments,
    record_failure,
)


if TYPE_CHECKING:
    from contextvars import Token
    from types import TracebackType

    from opentelemetry.context import Context
    from opentelemetry.metrics import Counter, Histogram, Meter
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

    from resilient._singleflight._machine import Flight


@final
class Meters:
    """Singleflight's instruments on one meter."""

    __slots__ = ("abandoned", "callers", "executions", "joined")

    def __init__(self, meter: Meter) -> None:
        self.executions: Counter = meter.create_counter(
            "resilient.singleflight.executions",
            unit="{execution}",
            description="Executions started: calls that led.",
        )
        self.joined: Counter = meter.create_counter(
            "resilient.singleflight.joined",
            unit="{call}",
            description="Calls that joined an execution under way.",
        )
        self.abandoned: Counter = meter.create_counter(
            "resilient.singleflight.abandoned",
            unit="{execution}",
            description=(
                "Async executions cancelled because every caller waiting "
                "for them had left."
            ),
        )
        self.callers: Histogram = meter.create_histogram(
            "resilient.singleflight.callers",
            unit="{call}",
            description="Callers that shared one execution, its leader's "
            "included.",
        )


def recorder(name: str) -> Recorder | None:
    """
    The recorder of one call of group *name*; None if nothing is set. For
    callers that found telemetry not `disabled` (their fast path).
    """
    tracer = TELEMETRY.tracer or TELEMETRY.resolve()[0]
    meters = instruments("singleflight", Meters)
    if tracer is None and meters is None:
        return None
    return Recorder(name, tracer, meters)


@final
class Recorder:
    """
    The span of one caller (its role, its flight, how many joined) and
    the group's metrics; a context manager around the whole call.
    """

    __slots__ = (
        "_flight",
        "_labels",
        "_leads",
        "_linked",
        "_meters",
        "_name",
        "_span",
        "_tracer",
    )

    def __init__(
        self, name: str, tracer: Tracer | None, meters: Meters | None
    ) -> None:
        self._name = name
        self._labels = {"resilient.singleflight": bounded(name)}
        self._tracer = tracer
        self._meters = meters
        self._span: Span | None = None
        self._flight: Flight | None = None
        self._leads = False
        self._linked = False

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ended(exc)

    def joined(self, flight: Flight, *, leads: bool) -> None:
        """The caller led or joined *flight*: count it, start its span."""
        self._flight, self._leads = flight, leads
        meters = self._meters
        if meters is not None:
            (meters.executions if leads else meters.joined).add(
                1, self._labels
            )
        if self._tracer is None:
            return
        attributes: dict[str, AttributeValue] = {
            "resilient.singleflight.name": self._name,
            "resilient.singleflight.role": "leader" if leads else "follower",
            "resilient.singleflight.flight": flight.number,
        }
        span = self._span
        if span is None:
            leader = flight.span
            links = None
            if leader is not None and not leads:
                links = [Link(leader.get_span_context())]
                self._linked = True
            span = self._span = self._tracer.start_span(
                f"singleflight {self._name}",
                attributes=attributes,
                links=links,
            )
        else:
            span.set_attributes(attributes)
        if leads:
            flight.span = span

    def abandoned(self) -> None:
        """The caller was the last to leave: its execution is cancelled."""
        if self._meters is not None:
            self._meters.abandoned.add(1, self._labels)

    def restart(self) -> None:
        """The execution aborted: the caller starts over."""
        self._shared()
        if self._span is not None:
            self._span.add_event("resilient.singleflight.restart")

    def enter(self) -> Token[Context] | None:
        """Make the leader's span current while it runs the execution."""
        if self._span is None:
            return None
        return otel_context.attach(otel_trace.set_span_in_context(self._span))

    def _shared(self) -> None:
        """A leader's flight is over for it: how many callers shared it."""
        flight = self._flight
        if self._leads and self._meters is not None and flight is not None:
            self._meters.callers.record(flight.joined + 1, self._labels)

    def ended(self, exc: BaseException | None) -> None:
        """End the span, with how many joined if the caller led."""
        self._shared()
        span, self._span = self._span, None
        if span is None:
            return
        flight = self._flight
        assert flight is not None  # noqa: S101 - the span began at a join
        if self._leads:
            span.set_attribute("resilient.singleflight.joined", flight.joined)
        elif not self._linked and flight.span is not None:
            # Joined before the leader's span existed.
            span.add_link(flight.span.get_span_context())
        if exc is None:
            span.set_status(Status(StatusCode.OK))
        else:
            record_failure(span, exc)
        span.end()
