"""
The time for the breaker's hot paths: resilient's clock, skipping the
clock object's method for the process clock (the fast paths inline the two
lines of `now`).
"""

from __future__ import annotations

import time
from typing import Final

from resilient._core import _clock
from resilient._core._clock import DEFAULT_CLOCK


DEFAULT: Final = DEFAULT_CLOCK
"""The process clock: its time is `time.monotonic`."""

monotonic: Final = time.monotonic


def now() -> float:
    """resilient's clock now, in seconds."""
    c = _clock._clock  # noqa: SLF001
    return monotonic() if c is DEFAULT else c.now()
