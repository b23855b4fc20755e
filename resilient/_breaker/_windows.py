"""
The breaker's sliding windows: the last N outcomes, or the last N seconds.

Both keep running totals (calls, failures, slow calls) so that reading the
rates costs nothing, and both use fixed memory whatever the traffic. An
outcome enters as a small code: bit 0 set for a failure, bit 1 for a slow
call.

An entry and the totals it moves are written with plain stores and no call
between them (CPython delivers an asynchronous exception only at a call's
return, a function's start or a loop's back edge): an exception lands
before an entry or after it, never inside. A success taken from an inbox
leaves it last, after its count (`CountRing.take`): popped first, an
exception at the pop's return lost it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final, final


if TYPE_CHECKING:
    import collections


FAILED: Final = 1
"""The failure bit of a window entry."""
SLOW: Final = 2
"""The slow bit of a window entry."""

BUCKETS: Final = 60
"""How many buckets a time window is cut into."""

_ZEROS: Final = (0,) * BUCKETS


@final
class CountRing:
    """The last *size* outcomes in a ring of bytes, with running totals."""

    __slots__ = ("_i", "_ring", "calls", "failures", "slow")

    def __init__(self, size: int) -> None:
        self._ring = bytearray(size)
        self._i = 0
        self.calls = self.failures = self.slow = 0

    def add(self, code: int, now: float) -> None:
        """Enter one outcome's code; the oldest leaves once it is full."""
        ring, i = self._ring, self._i
        size = len(ring)  # Before the stores: no call among them.
        if self.calls == size:
            old = ring[i]
            self.failures -= old & FAILED
            self.slow -= old >> 1
        else:
            self.calls += 1
        ring[i] = code
        self.failures += code & FAILED
        self.slow += code >> 1
        self._i = i + 1 if i + 1 < size else 0

    def take(self, inbox: collections.deque[float]) -> None:
        """
        Enter the successes queued in *inbox* (their times unused). Each
        turn counts a success, then pops it (the one call, last): an
        asynchronous exception at the pop's return or at the back edge
        finds it counted and gone, anywhere before, still queued.
        """
        ring = self._ring
        size = len(ring)
        pop = inbox.popleft
        for _ in range(len(inbox)):  # Only these: more may be appended.
            i = self._i
            if self.calls == size:
                old = ring[i]
                self.failures -= old & FAILED
                self.slow -= old >> 1
            else:
                self.calls += 1
            ring[i] = 0
            self._i = i + 1 if i + 1 < size else 0
            pop()  # Only the taker pops: the leftmost is the one counted.

    def expire(self, now: float) -> None:
        """Nothing expires by time in a count window."""

    def fills_until(self) -> float:
        """Until when successes fill the window with nothing leaving it by
        time: for ever."""
        return math.inf

    def clear(self) -> None:
        """Forget every outcome."""
        self._ring[:] = bytes(len(self._ring))
        self._i = self.calls = self.failures = self.slow = 0


@final
class TimeRing:
    """
    The last *seconds* of outcomes in 60 buckets, with running totals.

    A bucket is emptied when time moves past it, so memory stays fixed. Time
    that reads a little lower than the newest bucket (a thread that read the
    clock a moment before another) counts in the newest bucket; time that
    reads a whole window lower can only come from a swapped clock (a test's
    `FakeClock` after the process clock), and starts a fresh window instead
    of freezing it until the new clock catches up.
    """

    __slots__ = (
        "_c",
        "_f",
        "_head",
        "_s",
        "_width",
        "calls",
        "failures",
        "slow",
    )

    def __init__(self, seconds: float) -> None:
        self._width = seconds / BUCKETS
        self._c = [0] * BUCKETS
        self._f = [0] * BUCKETS
        self._s = [0] * BUCKETS
        self._head = -(1 << 62)
        self.calls = self.failures = self.slow = 0

    def expire(self, now: float) -> None:
        """Empty the buckets time has moved past."""
        b = int(now // self._width)
        head = self._head
        if b <= head:
            if head - b < BUCKETS:
                return  # Late by less than a window: the newest bucket.
            self.clear()  # The clock was swapped for one that reads lower.
        elif b - head >= BUCKETS:
            self.clear()
        else:
            c, f, s = self._c, self._f, self._s
            for i in range(head + 1, b + 1):
                j = i % BUCKETS
                self.calls -= c[j]
                self.failures -= f[j]
                self.slow -= s[j]
                c[j] = f[j] = s[j] = 0
        self._head = b

    def fills_until(self) -> float:
        """
        Until when successes fill the newest bucket, none leaving the
        window: the newest bucket's end, or a little before (every time
        before it floors into the newest bucket, as `add` floors).
        """
        head, width = self._head, self._width
        end = (head + 1) * width
        while end // width > head:  # Rounded past the bucket's end.
            end = math.nextafter(end, -math.inf)
        return end

    def add(self, code: int, now: float) -> None:
        """Enter one outcome's code in the bucket of *now*."""
        b = now // self._width
        if b != self._head:
            self.expire(now)
        j = self._head % BUCKETS
        self._c[j] += 1
        self.calls += 1
        if code:
            if code & FAILED:
                self._f[j] += 1
                self.failures += 1
            if code & SLOW:
                self._s[j] += 1
                self.slow += 1

    def take(self, inbox: collections.deque[float]) -> None:
        """
        Enter the successes queued in *inbox*, by their end times (as
        `add` would, without a call per success). Each turn reads the
        oldest, makes room for it (`expire`, which an exception may cut
        short: it leaves the totals whole), counts it and pops it last, as
        `CountRing.take` does.
        """
        width, counts = self._width, self._c
        head = self._head
        j = head % BUCKETS
        pop = inbox.popleft
        for _ in range(len(inbox)):  # Only these: more may be appended.
            t = inbox[0]  # Only the taker pops: the leftmost stays put.
            if t // width != head:
                self.expire(t)
                head = self._head
                j = head % BUCKETS
            counts[j] += 1
            self.calls += 1
            pop()

    def clear(self) -> None:
        """
        Forget every outcome: the buckets emptied in place (a reader may
        hold them) and the totals zeroed with plain stores, no loop (its
        back edge let an exception leave the totals over empty buckets).
        """
        self._c[:] = self._f[:] = self._s[:] = _ZEROS
        self.calls = self.failures = self.slow = 0
