"""
The spans and metrics of one call (`CallRecorder`): a span for the call and
a child span per attempt, current while the attempt runs; `recorder` makes
one when telemetry is configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Status, StatusCode

from resilient._core._attributes import (
    bounded,
    is_give_up,
    is_rejection,
    record_failure,
    stage_attributes,
    type_name,
)
from resilient._core._providers import TELEMETRY, disabled


if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from resilient._core._decisions import RetryEvent
    from resilient._core._providers import _Instruments


_LOST: Final = object()
"""An attempt's context being attached: its token may be lost."""


def recorder(policy: str) -> CallRecorder | None:
    """A recorder for one call, or None when no telemetry is configured."""
    if disabled():
        return None
    t = TELEMETRY
    tracer, instruments = (
        (t.tracer, t.instruments)
        if t.tracer is not None and t.instruments is not None
        else t.resolve()
    )
    if tracer is None and instruments is None:
        return None
    return CallRecorder(policy, tracer, instruments)


@final
class CallRecorder:
    """
    The spans and metrics of one call: a span for the call and a child span
    per attempt, which is current while the attempt runs.
    """

    __slots__ = (
        "_attempt",
        "_call_token",
        "_ctx",
        "_instruments",
        "_labels",
        "_made",
        "_name",
        "_open",
        "_outside",
        "_prior",
        "_span",
        "_token",
        "_tracer",
    )

    def __init__(
        self,
        policy: str,
        tracer: Tracer | None,
        instruments: _Instruments | None,
    ) -> None:
        self._name = policy = bounded(policy)
        self._labels = {"resilient.policy": policy}
        self._tracer = tracer
        self._instruments = instruments
        self._span: Span | None = None
        self._attempt: Span | None = None
        self._open = False
        self._made = 0
        """Attempts made: ended, and not rejected before they ran."""
        self._token: object = None
        self._call_token: object = None
        self._outside: otel_context.Context | None = None
        self._prior: otel_context.Context | None = None
        if tracer is not None:
            self._span = tracer.start_span(policy, attributes=self._labels)
            self._ctx = otel_trace.set_span_in_context(self._span)

    def enter(self) -> None:
        """
        Make the call span current between attempts (admission, hooks), so
        that what the stages report then (a breaker's rejection or state
        change, a bulkhead's refusal) lands on it.
        """
        if self._span is not None and self._call_token is None:
            # The context to go back to is kept first: an asynchronous
            # exception landing before the token is kept is undone by
            # `exit` all the same.
            self._outside = otel_context.get_current()
            self._call_token = otel_context.attach(self._ctx)

    def exit(self) -> None:
        """Undo `enter` (idempotent)."""
        token, self._call_token = self._call_token, None
        outside, self._outside = self._outside, None
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        elif outside is not None and otel_context.get_current() is self._ctx:
            otel_context.attach(outside)

    def attempt_started(self, number: int) -> None:
        """Open the attempt's span and make it current."""
        self._open = True
        if self._tracer is not None:
            # An asynchronous exception can land between the attach and the
            # store of its token: _LOST says so, and `attempt_ended` then
            # makes the context it replaced current again.
            self._prior = otel_context.get_current()
            self._token = _LOST
            self._attempt = self._tracer.start_span(
                f"{self._name} attempt",
                context=self._ctx,
                attributes={**self._labels, "resilient.attempt": number},
            )
            self._token = otel_context.attach(
                otel_trace.set_span_in_context(self._attempt)
            )

    def attempt_ended(
        self, exc: BaseException | None, *, resume: bool = True
    ) -> None:
        """
        Close the attempt's span, recording *exc* if it failed, and count
        the attempt. An attempt that a stage inside it rejected (a breaker
        the function enters itself) is not counted, and its span, which
        cannot be withdrawn once started, is renamed ``<policy> rejected``.

        With *resume*, the call span is made current again (as `enter`
        does, undone by `exit` or `ended`): what the stages report while
        they settle the attempt (a policy's own breaker opening on this
        failure, closing on this probe's success) lands on the call's
        trace, not on whatever span was current outside the call.
        """
        if not self._open:
            return
        self._open = False
        rejected = is_rejection(exc)
        if not rejected:
            self._made += 1
            if self._instruments is not None:
                self._instruments.attempts.add(1, self._labels)
        span, self._attempt = self._attempt, None
        if span is None:
            return
        token, self._token = self._token, None
        if token is _LOST:  # pragma: no cover - only an asynchronous exception
            otel_context.attach(self._prior)  # type: ignore[arg-type]
        elif token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        if exc is not None:
            if rejected:
                span.update_name(f"{self._name} rejected")
                span.set_attribute("resilient.rejected", True)
            record_failure(span, exc)
        else:
            span.set_status(Status(StatusCode.OK))
        span.end()
        if resume:
            self.enter()

    def retrying(self, event: RetryEvent) -> None:
        """A retry is scheduled: an event on the call span and metrics."""
        delay = event.delay or 0.0
        if self._instruments is not None:
            self._instruments.retries.add(1, self._labels)
            self._instruments.delay.record(delay, self._labels)
        if self._span is not None:
            attributes: dict[str, str | float | int] = {
                "resilient.attempt": event.attempt,
                "resilient.delay": delay,
                "resilient.delay_source": event.delay_source or "backoff",
            }
            if event.exception is not None:
                attributes["exception.type"] = type_name(event.exception)
            self._span.add_event("resilient.retry", attributes)

    def rejected(self, event: RetryEvent) -> None:
        """
        A stage rejected the attempt before it ran and retry outwaits it:
        an event on the call span; neither an attempt nor a retry.
        """
        if self._span is not None:
            exc = event.exception
            attributes: dict[str, str | float | int] = {
                "resilient.attempt": event.attempt,
                "resilient.delay": event.delay or 0.0,
                "resilient.delay_source": event.delay_source or "admission",
                "exception.type": type_name(exc),
            }
            stage_attributes(attributes, exc)
            self._span.add_event("resilient.rejected", attributes)

    def gave_up(self, event: RetryEvent) -> None:
        """
        Retrying stopped: a metric, an event on the call span and its
        ``resilient.give_up.reason``, for real give-ups only (see
        `is_give_up`).
        """
        if not is_give_up(event):
            return
        reason = event.reason or "not_retryable"
        if self._instruments is not None:
            self._instruments.give_ups.add(
                1, {**self._labels, "resilient.reason": reason}
            )
        span = self._span
        if span is not None:
            attributes: dict[str, str | float | int] = {
                "resilient.attempt": event.attempt,
                "resilient.reason": reason,
                "resilient.elapsed": event.elapsed,
            }
            if event.exception is not None:
                attributes["exception.type"] = type_name(event.exception)
                stage_attributes(attributes, event.exception)
            span.add_event("resilient.give_up", attributes)
            span.set_attribute("resilient.give_up.reason", reason)

    def fell_back(self, exc: BaseException) -> None:
        """The policy's fallback takes over from *exc*: an event and an
        attribute on the call span."""
        span = self._span
        if span is not None:
            kind = type_name(exc)
            span.add_event("resilient.fallback", {"exception.type": kind})
            span.set_attribute("resilient.fallback", kind)

    def ended(self, exc: BaseException | None) -> None:
        """
        Close the call's span (and a dangling attempt span, if any), with
        the number of attempts made (``resilient.attempts``).
        """
        # The attempt's context first: it was attached after the call's,
        # and undoing them in the other order left the call span current.
        if self._open:
            self.attempt_ended(exc, resume=False)
        self.exit()
        span, self._span = self._span, None
        if span is None:
            return
        span.set_attribute("resilient.attempts", self._made)
        if exc is not None:
            record_failure(span, exc)
        else:
            span.set_status(Status(StatusCode.OK))
        span.end()
