"""
OpenTelemetry spans and metrics, through the API only.

The SDK is the user's choice. Until a tracer or meter provider is configured
(globally, or for resilient with `configure_telemetry`), the shells skip
telemetry entirely: one attribute read per call, no span objects.

The names live in three modules, by concern: the providers' slot and the
instruments (`._providers`), what spans and events say (`._attributes`), and
one call's spans and metrics (`._recorder`). This module is where the rest
of resilient imports them from.
"""

from __future__ import annotations

from resilient._core._attributes import (
    TEXT_LIMIT,
    bounded,
    exception_attributes,
    is_give_up,
    is_rejection,
    record_failure,
    type_name,
)
from resilient._core._providers import (
    SCOPE,
    TELEMETRY,
    configure_telemetry,
    disabled,
    instruments,
)
from resilient._core._recorder import CallRecorder, recorder


__all__ = [
    "SCOPE",
    "TELEMETRY",
    "TEXT_LIMIT",
    "CallRecorder",
    "bounded",
    "configure_telemetry",
    "disabled",
    "exception_attributes",
    "instruments",
    "is_give_up",
    "is_rejection",
    "record_failure",
    "recorder",
    "type_name",
]
