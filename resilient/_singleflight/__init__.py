"""
Singleflight: concurrent callers with one key share one execution.

`_machine.py` holds the in-flight map (key -> flight, with the tickets of
the callers waiting for it) and its decisions; `_sync.py` and `_async.py`
the two shells, over what they share in `_common.py`; `_group.py` the
group (`SingleFlight`), `_decorator.py` the decorator and `_report.py`
the spans and metrics.
"""

from __future__ import annotations

from resilient._singleflight._decorator import singleflight
from resilient._singleflight._group import SingleFlight
from resilient._singleflight._machine import SingleFlightStatistics


__all__ = ["SingleFlight", "SingleFlightStatistics", "singleflight"]
