"""
The bulkheads' OpenTelemetry instruments, made once per meter provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from opentelemetry import metrics as otel_metrics

from resilient._core._telemetry import instruments


if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from opentelemetry.metrics import (
        CallbackOptions,
        Counter,
        Histogram,
        Meter,
        Observation,
    )


@final
class _Metrics:
    """The bulkhead's instruments on one meter."""

    __slots__ = ("rejections", "wait")

    def __init__(self, meter: Meter) -> None:
        self.rejections: Counter = meter.create_counter(
            "resilient.bulkhead.rejections",
            unit="{call}",
            description="Calls a bulkhead refused with BulkheadFull.",
        )
        self.wait: Histogram = meter.create_histogram(
            "resilient.bulkhead.wait",
            unit="s",
            description="Time callers queued for a bulkhead slot.",
        )
        meter.create_observable_up_down_counter(
            "resilient.bulkhead.in_use",
            callbacks=[_observe("in_use")],
            unit="{call}",
            description="Bulkhead slots held.",
        )
        meter.create_observable_up_down_counter(
            "resilient.bulkhead.waiting",
            callbacks=[_observe("waiting")],
            unit="{call}",
            description="Callers queued for a bulkhead slot.",
        )


def _observe(
    field: str,
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        # Imported here: the registry module imports the shells, which
        # import this one.
        from resilient._bulkhead._registry import BULKHEADS  # noqa: PLC0415

        for b in BULKHEADS.items():
            stats = b.statistics()
            yield otel_metrics.Observation(
                getattr(stats, field), {"resilient.bulkhead": b.name}
            )

    return callback


def _metrics() -> _Metrics | None:
    """The bulkheads' instruments, made once per meter provider."""
    return instruments("bulkhead", _Metrics)
