"""
Timeouts and cancel scopes: the scope (`_scope`, with its entering and
leaving in `_entry`, what leaving raises in `_outcome`, the waking of its
waits in `_wake`, and what these share in `_shared`), its SIGALRM
interrupt (`_alarm`), the functions that make scopes (`_make`), deadlines
carried in request headers (`_header`), and the attempt deadline's
watchdog (`_watchdog`).
"""

from __future__ import annotations

from resilient._timeout._alarm import _ALARMS
from resilient._timeout._header import (
    deadline_from_header,
    deadline_header,
    parse_deadline_header,
)
from resilient._timeout._make import timeout, timeout_at
from resilient._timeout._scope import TimeoutScope
from resilient._timeout._wake import check_scope, wake_on_cancel


__all__ = [
    "_ALARMS",
    "TimeoutScope",
    "check_scope",
    "deadline_from_header",
    "deadline_header",
    "parse_deadline_header",
    "timeout",
    "timeout_at",
    "wake_on_cancel",
]
