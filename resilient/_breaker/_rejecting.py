"""
The breaker's admission when it is not closed, and its rejection path.

`admission` asks the machine under the lock (a probe's permit, or the
seconds to wait) and makes the `CircuitOpen` to raise, counting and
reporting it; `rejection` is the common rejection (open, within its
interval) decided without the lock. Both are `CircuitBreaker`'s methods
(``_admission`` and ``_rejection``), bound in its class body: a call to one
costs what a method's call costs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from resilient._breaker._now import DEFAULT
from resilient._breaker._records import _OPEN, UNCOUNTED, BreakerPermit
from resilient._breaker._report import report_rejection
from resilient._core import _clock
from resilient._core._telemetry import disabled
from resilient.exceptions import CircuitOpen


if TYPE_CHECKING:
    from resilient._breaker._breaker import CircuitBreaker
    from resilient._breaker._machine import _BreakerMachine
    from resilient._breaker._records import BreakerTransition


_new_open: Final = CircuitOpen.__new__


def admission(
    self: CircuitBreaker,
) -> tuple[BreakerPermit | CircuitOpen, list[BreakerTransition] | None]:
    """
    The machine's answer under the lock (the breaker is not closed, or
    was not a moment ago), and the state changes to report: a permit,
    or the rejection to raise once they are reported (a rejection that
    changed nothing is raised here). A metrics-only breaker reports the
    rejection and hands out an uncounted permit instead.

    Raised from here, the rejection is never in a local variable of a
    frame its traceback holds: no reference cycle, so no work for the
    garbage collector per rejection.
    """
    c = _clock._clock  # noqa: SLF001
    t = time.monotonic() if c is DEFAULT else c.now()
    with self._lock:
        m = self._m
        got = m.admit_or_wait(t, self)
        if type(got) is not BreakerPermit:
            state = m.state
            opened_by = m.opened_by
        events = self._drain() if m.outbox else None
    if not self._pinned and events is None:
        self._sync_pin()  # Heal a pin an exception interrupted.
    if type(got) is BreakerPermit:
        return got, events
    metrics_only = self.config.metrics_only
    if not disabled():
        report_rejection(self.name, got, state, metrics_only=metrics_only)
    if metrics_only:
        return BreakerPermit(self, UNCOUNTED, t, 0), events
    # Made by __new__ alone, which sets ``args`` (see `CircuitOpen`).
    if events is None:
        raise _new_open(CircuitOpen, self.name, got, state.value, opened_by)
    return _new_open(
        CircuitOpen, self.name, got, state.value, opened_by
    ), events


def rejection(
    self: CircuitBreaker, m: _BreakerMachine, t: float
) -> CircuitOpen:
    """
    The rejection of a call at *t* while *m* is open within its
    interval (`_BreakerMachine.admit_or_wait`'s first rule, written out
    for the hot path), counted and reported; for the caller to raise.

    Decided without the lock: the state, opening and interval are read
    once each, and a read that races a state change rejects as if the
    call had come a moment earlier. The count is one increment with no
    call inside, which CPython (with its GIL) never interrupts.
    """
    m.rejected += 1
    wait = m.open_until - t
    if not disabled():
        report_rejection(self.name, wait, _OPEN)
    return _new_open(CircuitOpen, self.name, wait, "open", m.opened_by)
