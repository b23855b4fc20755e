"""
Singleflight: concurrent callers with one key share one execution.

`_machine.py` holds the in-flight map (key -> flight, with the tickets of
the callers waiting for it) and its decisions; `_group.py` the sync and
async shells (`SingleFlight.call` and `acall`) and the decorator.
"""

from __future__ import annotations

from resilient._singleflight._group import SingleFlight, singleflight
from resilient._singleflight._machine import SingleFlightStatistics


__all__ = ["SingleFlight", "SingleFlightStatistics", "singleflight"]
