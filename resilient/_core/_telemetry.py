"""
OpenTelemetry spans and metrics, through the API only.

The SDK is the user's choice. Until a tracer or meter provider is configured
(globally, or for resilient with `configure_telemetry`), the shells skip
telemetry entirely: one attribute read per call, no span objects.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Final, TypeVar, final

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Status, StatusCode

from resilient.exceptions import (
    BulkheadFull,
    CircuitOpen,
    ConfigTypeError,
    Rejected,
)


_LOST: Final = object()
"""An attempt's context being attached: its token may be lost."""

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from resilient._core._decisions import RetryEvent


SCOPE: Final = "resilient"

TEXT_LIMIT: Final = 256
"""The most characters of an exception message, or of any other text value
(a policy's name), that resilient puts in a span attribute; longer text is
cut there and ends with an ellipsis."""

_I = TypeVar("_I")


def _version() -> str:
    try:
        return importlib.metadata.version("resilient")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return "0"


@final
class _Instruments:
    """The metric instruments, made once per meter."""

    __slots__ = ("attempts", "delay", "give_ups", "retries")

    def __init__(self, meter: Meter) -> None:
        self.attempts: Counter = meter.create_counter(
            "resilient.attempts",
            unit="{attempt}",
            description="Attempts started, first ones included.",
        )
        self.retries: Counter = meter.create_counter(
            "resilient.retries",
            unit="{retry}",
            description="Retries scheduled after a transient failure.",
        )
        self.give_ups: Counter = meter.create_counter(
            "resilient.give_ups",
            unit="{call}",
            description="Calls that failed after retrying stopped.",
        )
        self.delay: Histogram = meter.create_histogram(
            "resilient.retry.delay",
            unit="s",
            description="Waits before retries.",
        )


@final
class _Telemetry:
    """Resolves the tracer and instruments lazily, then caches them."""

    __slots__ = (
        "checked_env",
        "extras",
        "instruments",
        "meter",
        "meter_provider",
        "record_messages",
        "tracer",
        "tracer_provider",
    )

    def __init__(self) -> None:
        self.tracer_provider: TracerProvider | None = None
        self.meter_provider: MeterProvider | None = None
        self.tracer: Tracer | None = None
        self.instruments: _Instruments | None = None
        self.meter: Meter | None = None
        self.extras: dict[str, object] = {}
        """Other primitives' instruments, made on `meter` (see
        `instruments`)."""
        self.checked_env = False
        self.record_messages = True
        """Whether span events carry exception messages (bounded)."""

    def resolve(self) -> tuple[Tracer | None, _Instruments | None]:
        """The tracer and instruments, or None where nothing is configured."""
        if not self.checked_env:
            # Providers named in environment variables load on first use.
            otel_trace.get_tracer_provider()
            otel_metrics.get_meter_provider()
            self.checked_env = True
        if self.tracer is None:
            provider = self.tracer_provider or getattr(
                otel_trace, "_TRACER_PROVIDER", None
            )
            if provider is not None:
                self.tracer = provider.get_tracer(SCOPE, _version())
        if self.instruments is None:
            meters = self.meter_provider or getattr(
                otel_metrics._internal,  # noqa: SLF001
                "_METER_PROVIDER",
                None,
            )
            if meters is not None:
                self.meter = meters.get_meter(SCOPE, _version())
                self.instruments = _Instruments(self.meter)
        return self.tracer, self.instruments


TELEMETRY: Final = _Telemetry()


def configure_telemetry(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    record_messages: bool = True,
) -> None:
    """
    Send resilient's spans and metrics to these providers instead of the
    global ones, and choose what failed spans say about the exception.

    Each call sets the whole configuration: call with no arguments to go
    back to the global providers and the defaults.

    Args:
        tracer_provider: Where spans go; None for the global provider.
        meter_provider: Where metrics go; None for the global provider.
        record_messages: Whether a failed span's ``exception`` event
            carries the exception's message (``exception.message``, cut
            to 256 characters). False keeps only its type: messages can
            hold what the failing code put there, a connection string with
            its password included. Tracebacks are never recorded.

    Raises:
        ConfigTypeError: *record_messages* is not a bool.

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       *record_messages*; messages are cut to 256 characters and
       tracebacks no longer recorded.
    """
    if not isinstance(record_messages, bool):
        raise ConfigTypeError(
            "configure_telemetry(record_messages)",
            record_messages,
            "must be a bool",
        )
    TELEMETRY.record_messages = record_messages
    TELEMETRY.tracer_provider = tracer_provider
    TELEMETRY.meter_provider = meter_provider
    TELEMETRY.tracer = None
    TELEMETRY.instruments = None
    TELEMETRY.meter = None
    TELEMETRY.extras = {}


def instruments(key: str, make: Callable[[Meter], _I]) -> _I | None:
    """
    The instruments a primitive makes with *make* on resilient's meter,
    made once per meter provider; None when no meter provider is set.

    Args:
        key: The primitive's name (``"breaker"``, ``"bulkhead"``...).
        make: Creates its instruments on a meter.
    """
    t = TELEMETRY
    if t.meter is None:
        t.resolve()
        if t.meter is None:
            return None
    made = t.extras.get(key)
    if made is None:
        made = t.extras[key] = make(t.meter)
    return made  # type: ignore[return-value]


_metrics_internal = otel_metrics._internal  # noqa: SLF001


def disabled() -> bool:
    """
    Whether no telemetry is configured anywhere: a handful of attribute
    reads, so the shells can skip telemetry entirely on their fast path.
    """
    t = TELEMETRY
    return (
        t.tracer is None
        and t.instruments is None
        and t.tracer_provider is None
        and t.meter_provider is None
        and otel_trace._TRACER_PROVIDER is None  # noqa: SLF001
        and _metrics_internal._METER_PROVIDER is None  # noqa: SLF001
        and t.checked_env
    )


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


def _stage_attributes(
    attributes: dict[str, str | float | int], exc: BaseException | None
) -> None:
    """The name of the stage that rejected *exc*'s attempt."""
    if isinstance(exc, CircuitOpen):
        attributes["resilient.breaker"] = bounded(exc.name)
    elif isinstance(exc, BulkheadFull):
        attributes["resilient.bulkhead"] = bounded(exc.name)


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

    def attempt_ended(self, exc: BaseException | None) -> None:
        """
        Close the attempt's span, recording *exc* if it failed, and count
        the attempt. An attempt that a stage inside it rejected (a breaker
        the function enters itself) is not counted, and its span, which
        cannot be withdrawn once started, is renamed ``<policy> rejected``.
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
            _stage_attributes(attributes, exc)
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
                _stage_attributes(attributes, event.exception)
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
        self.exit()
        if self._open:
            self.attempt_ended(exc)
        span, self._span = self._span, None
        if span is None:
            return
        span.set_attribute("resilient.attempts", self._made)
        if exc is not None:
            record_failure(span, exc)
        else:
            span.set_status(Status(StatusCode.OK))
        span.end()
