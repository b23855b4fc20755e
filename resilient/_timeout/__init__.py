"""
Timeouts and cancel scopes: the scope and its SIGALRM interrupt
(`_scope`), the functions that make scopes (`_make`), and deadlines
carried in request headers (`_header`).
"""

from __future__ import annotations

from resilient._timeout._header import (
    deadline_from_header,
    deadline_header,
    parse_deadline_header,
)
from resilient._timeout._make import timeout, timeout_at
from resilient._timeout._scope import (
    _ALARMS,
    TimeoutScope,
    check_scope,
    wake_on_cancel,
)


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
