"""
Reference models of the circuit breaker and the bulkhead, written plainly
from the user guides (docs/breaker.md, docs/bulkhead.md) and the
configuration classes' docstrings, not from the machines' code: no ring
buffers, no running totals, no inbox, no epochs' gates. Each step is
computed from scratch over plain lists, with exact fractions, so that a
reader can check it against the guide line by line.

`tests/test_reference_models.py` runs them beside the optimised machines
and every shell, step by step, and compares.

Where the guides leave a point open, the model takes the reading named in
its docstring ("Decided:"), and the test pins it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal


Outcome = Literal["success", "failure", "ignore"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
FORCED_OPEN = "forced_open"

BUCKETS = 60
"""A time window is cut into 60 buckets (docs/breaker.md, `window`)."""


def exact(x: float) -> Fraction:
    """A setting as the user wrote it: 0.3 is three tenths, not the binary
    float nearest to it ("at least this fraction" in docs/breaker.md)."""
    return Fraction(repr(x))


@dataclass
class Call:
    """One admitted call: when it started, whether it is a probe, and the
    number of state changes the breaker had gone through at admission."""

    start: float
    probe: bool
    changes: int


@dataclass
class Rejection:
    """A call the breaker refused: its state then and the wait it named."""

    state: str
    retry_after: float


@dataclass
class BreakerModel:
    """
    The circuit breaker of docs/breaker.md.

    closed
        Calls run; their outcomes fill the window. When the window holds
        at least *minimum_calls* calls and at least *failure_rate* of them
        failed, or at least *slow_call_rate* of them were slow, the breaker
        opens. A call is slow when it took at least *slow_call_duration*
        seconds, failed or not; an ignored call counts neither way.
    open
        Calls are rejected, with the seconds left of the open interval.
        After *open_interval* seconds the next call is admitted as a probe
        and the breaker is half-open.
    half-open
        At most *half_open_probes* probes run at once; others are rejected.
        When that many probes have succeeded, it closes with an empty window
        and the interval back at *open_interval*. A failed or slow probe
        re-opens it, for the interval times *open_interval_growth*, at most
        *max_open_interval*. A probe still running after *probe_timeout*
        counts as failed. An ignored probe frees its slot and counts
        neither way.
    forced open
        `force_open` rejects everything (``retry_after`` infinite) until
        `reset`; `reset` closes with an empty window from any state.

    Windows: `CountWindow(size)` holds the last *size* counted calls;
    `TimeWindow(seconds)` holds the calls whose end falls in the current
    bucket or the 59 before it (buckets of *seconds* / 60, counted from 0
    on the clock), so a call leaves between 59/60 and 60/60 of *seconds*
    after it ended. A call is counted at its end.

    Decided (the guides are silent; the machine's docstrings say so):

    - A call admitted before a state change counts for nothing when it
      ends: the window and the probes it was admitted against are gone. A
      `reset` of a closed breaker is no state change: it empties the window
      and calls in flight still count.
    - The breaker decides when it is used, not by a timer: an open breaker
      turns half-open when a call arrives after the interval, and a stuck
      probe re-opens it when the next call arrives (that call is rejected
      with the new interval) or when the probe itself ends. Statistics
      change nothing.
    - ``retry_after`` while half-open with every slot taken is the time
      until the oldest probe times out, or the next open interval when that
      is shorter (a caller never waits longer than a re-opening would
      cost); once the oldest probe has timed out, the next open interval.
    - Opening keeps the window (statistics still show the calls that opened
      it, a time window's calls still leave it); closing empties it.
    """

    window: Literal["count", "time"]
    size: float
    """Calls (count window) or seconds (time window)."""
    minimum_calls: int = 5
    failure_rate: float = 0.5
    slow_call_duration: float | None = None
    slow_call_rate: float = 1.0
    open_interval: float = 30.0
    open_interval_growth: float = 1.0
    max_open_interval: float = 300.0
    half_open_probes: int = 3
    probe_timeout: float = 10.0

    state: str = CLOSED
    entries: list[tuple[float, bool, bool]] = field(default_factory=list)
    """Counted calls, oldest first: (end time, failed, slow)."""
    changes: int = 0
    interval: float = -1.0
    open_until: float = 0.0
    probes: dict[int, float] = field(default_factory=dict)
    """Probes running: call id -> start."""
    successes: int = 0
    times_opened: int = 0
    rejected: int = 0
    _ids: int = 0

    def __post_init__(self) -> None:
        self.interval = self.open_interval

    # The window.

    def _bucket(self, t: float) -> int:
        return math.floor(Fraction(t) * BUCKETS / exact(self.size))

    def in_window(self, now: float) -> list[tuple[float, bool, bool]]:
        """The counted calls in the window at *now*."""
        if self.window == "count":
            return self.entries[-int(self.size) :]
        b = self._bucket(now)
        return [e for e in self.entries if b - self._bucket(e[0]) < BUCKETS]

    def _over(self, now: float) -> str | None:
        """Which threshold the window reaches at *now*, if any."""
        calls = self.in_window(now)
        if len(calls) < self.minimum_calls:
            return None
        failed = sum(1 for e in calls if e[1])
        slow = sum(1 for e in calls if e[2])
        if Fraction(failed, len(calls)) >= exact(self.failure_rate):
            return "failure_rate"
        if Fraction(slow, len(calls)) >= exact(self.slow_call_rate):
            return "slow_call_rate"
        return None

    # State changes.

    def _change(self, new: str, now: float) -> None:
        if new == CLOSED:
            self.entries = []
            self.interval = self.open_interval
        elif new == OPEN:
            if self.state == HALF_OPEN:
                self.interval = self._next_interval()
            self.open_until = now + self.interval
        if new in {OPEN, FORCED_OPEN}:
            self.times_opened += 1
        self.state = new
        self.changes += 1
        self.probes = {}
        self.successes = 0

    def _next_interval(self) -> float:
        return min(
            self.interval * self.open_interval_growth, self.max_open_interval
        )

    # What callers do.

    def admit(self, now: float) -> tuple[int, Call] | Rejection:
        """Admit a call at *now* (its id and record) or reject it."""
        if self.state == OPEN and now >= self.open_until:
            self._change(HALF_OPEN, now)
        if self.state in {OPEN, FORCED_OPEN}:
            self.rejected += 1
            return Rejection(self.state, self.retry_after(now))
        if self.state == HALF_OPEN:
            if self.probes and (
                now - min(self.probes.values()) >= self.probe_timeout
            ):
                self._change(OPEN, now)
                self.rejected += 1
                return Rejection(OPEN, self.interval)
            if len(self.probes) >= self.half_open_probes:
                self.rejected += 1
                return Rejection(HALF_OPEN, self.retry_after(now))
        self._ids += 1
        probe = self.state == HALF_OPEN
        if probe:
            self.probes[self._ids] = now
        return self._ids, Call(now, probe, self.changes)

    def end(
        self, ident: int, call: Call, outcome: Outcome, now: float
    ) -> None:
        """The call *ident* ended at *now* with *outcome*."""
        if call.changes != self.changes:
            return  # Admitted before a state change.
        took = now - call.start
        slow = (
            self.slow_call_duration is not None
            and took >= self.slow_call_duration
        )
        if call.probe:
            del self.probes[ident]
            if outcome == "ignore":
                return
            if took >= self.probe_timeout or outcome == "failure" or slow:
                self._change(OPEN, now)
                return
            self.successes += 1
            if self.successes >= self.half_open_probes:
                self._change(CLOSED, now)
            return
        if outcome == "ignore":
            return
        self.entries.append((now, outcome == "failure", slow))
        if self._over(now) is not None:
            self._change(OPEN, now)

    def force_open(self, now: float) -> None:
        if self.state != FORCED_OPEN:
            self._change(FORCED_OPEN, now)

    def reset(self, now: float) -> None:
        if self.state == CLOSED:
            self.entries = []
            self.interval = self.open_interval
        else:
            self._change(CLOSED, now)

    # What statistics show.

    def retry_after(self, now: float) -> float:  # noqa: PLR0911 - as the guide lists them
        if self.state == CLOSED:
            return 0.0
        if self.state == OPEN:
            return max(0.0, self.open_until - now)
        if self.state == FORCED_OPEN:
            return math.inf
        if not self.probes:
            return 0.0
        oldest = min(self.probes.values())
        if now - oldest >= self.probe_timeout:
            return self._next_interval()
        if len(self.probes) >= self.half_open_probes:
            return min(
                oldest + self.probe_timeout - now, self._next_interval()
            )
        return 0.0

    def statistics(self, now: float) -> dict[str, object]:
        calls = self.in_window(now)
        return {
            "state": self.state,
            "calls": len(calls),
            "failures": sum(1 for e in calls if e[1]),
            "slow_calls": sum(1 for e in calls if e[2]),
            "probes_in_flight": len(self.probes),
            "retry_after": self.retry_after(now),
            "times_opened": self.times_opened,
            "rejected": self.rejected,
        }


@dataclass
class BulkheadModel:
    """
    The bulkhead of docs/bulkhead.md.

    At most *max_concurrent* calls hold a slot. A caller that finds every
    slot taken is refused at once with ``"full"`` if it may not wait
    (*max_wait* 0, ``acquire_nowait``), with ``"queue_full"`` if
    *max_waiting* callers already queue, and otherwise queues, first come
    first served, until a slot is handed to it or its wait (*max_wait*
    seconds) runs out: refused with ``"timeout"``. A released slot goes
    straight to the first waiter (a newcomer never jumps the queue). A
    waiter that leaves (cancelled) leaves the queue.

    Counts: ``acquired == released + in_use`` always; ``rejected`` counts
    every refusal, ``timed_out`` those after queueing; ``cancelled`` the
    waiters that left.

    Decided: a wait runs out when the clock reads at least its start plus
    *max_wait*, at the latest when the waiter next looks (the shells poll a
    fake clock); the model times a waiter out at the first step that finds
    its time up, before serving the queue at that step, as the waiter
    polling first would.
    """

    max_concurrent: int
    max_waiting: int
    max_wait: float | None

    holders: set[int] = field(default_factory=set)
    queue: list[tuple[int, float]] = field(default_factory=list)
    """Waiters, first first: (id, deadline)."""
    acquired: int = 0
    released: int = 0
    rejected: int = 0
    timed_out: int = 0
    cancelled: int = 0
    _ids: int = 0

    def request(
        self, now: float, *, wait: bool = True
    ) -> tuple[str, int] | tuple[str, str]:
        """A caller at *now*: ``("held", id)``, ``("queued", id)`` or
        ``("refused", reason)``."""
        self._ids += 1
        ident = self._ids
        if len(self.holders) < self.max_concurrent and not self.queue:
            self.holders.add(ident)
            self.acquired += 1
            return "held", ident
        if not wait or self.max_wait == 0:
            self.rejected += 1
            return "refused", "full"
        if len(self.queue) >= self.max_waiting:
            self.rejected += 1
            return "refused", "queue_full"
        deadline = math.inf if self.max_wait is None else now + self.max_wait
        self.queue.append((ident, deadline))
        return "queued", ident

    def expire(self, now: float) -> list[int]:
        """The waiters whose wait ran out by *now* (refused, "timeout")."""
        gone = [i for i, d in self.queue if now >= d]
        self.queue = [(i, d) for i, d in self.queue if now < d]
        self.rejected += len(gone)
        self.timed_out += len(gone)
        return gone

    def release(self, ident: int) -> int | None:
        """A holder gives its slot back; the waiter it goes to, if any."""
        self.holders.remove(ident)
        self.released += 1
        if self.queue and len(self.holders) < self.max_concurrent:
            nxt, _ = self.queue.pop(0)
            self.holders.add(nxt)
            self.acquired += 1
            return nxt
        return None

    def cancel(self, ident: int) -> None:
        """A waiter leaves the queue."""
        self.queue = [(i, d) for i, d in self.queue if i != ident]
        self.cancelled += 1

    def statistics(self) -> dict[str, int]:
        return {
            "in_use": len(self.holders),
            "waiting": len(self.queue),
            "acquired": self.acquired,
            "released": self.released,
            "rejected": self.rejected,
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
        }
