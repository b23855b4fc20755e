"""The span of one lock acquisition, from the try to the release."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient._core import _telemetry


if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from resilient._backends import LockKey


def start_span(key: LockKey, scheme: str) -> Span | None:
    """The span of one acquisition, or None when telemetry is off."""
    if _telemetry.disabled():
        return None
    tracer, _ = _telemetry.TELEMETRY.resolve()
    if tracer is None:
        return None
    return tracer.start_span(
        "resilient.lock",
        attributes={
            "resilient.lock.name": key.shown,
            "resilient.lock.backend": scheme,
        },
    )


def end_span(
    span: Span | None, outcome: str | None = None, *, error: bool = False
) -> None:
    """End *span* (if any) with *outcome*."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

    if outcome is not None:
        span.set_attribute("resilient.lock.outcome", outcome)
    span.set_status(
        Status(StatusCode.ERROR, outcome) if error else Status(StatusCode.OK)
    )
    span.end()


__all__ = ["end_span", "start_span"]
