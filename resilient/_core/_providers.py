"""
resilient's telemetry providers: the slot that holds them, what
`configure_telemetry` sets, and the metric instruments made on their meter.

The SDK is the user's choice. Until a tracer or meter provider is configured
(globally, or for resilient with `configure_telemetry`), the shells skip
telemetry entirely: `disabled` is one attribute read per call, no span
objects. Every primitive's instruments are made on one meter (`instruments`).
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Final, TypeVar, final

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace

from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider


SCOPE: Final = "resilient"

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
