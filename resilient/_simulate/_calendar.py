"""
The simulation's queue of events: a calendar of time slots.

An event is ``(time, what)``: *what* is a call's number for an attempt of
that call, or the complement (``~number``, negative) of the number for the
end of a request the dependency served. Events come out in (time, push
order) order, exactly as from a binary heap of ``(time, sequence number,
what)`` entries, without the sequence number: a slot's events are appended
in push order and sorted stably by their time alone.

A slot per 1/1024 s, appended to in O(1) and sorted when the run reaches
it, so that an event costs the same with a hundred clients in flight as
with a million (a binary heap of a million entries cost 3.4 µs per push
and pop here, against 1.6 µs at 100,000).

The slots of the first 2**21 (about 2,000 s) are a list indexed by the
slot's number (the wheel), with a byte per slot that says whether it has
events, so that the next one is found by `bytearray.find`; a slot's
number is ``math.floor(time * 1024)``, an int. Pushing to a slot of the
wheel is a list index and an append (a float key in a dictionary, hashed
and compared, and ``x // 1.0`` cost twice as much); slots past it (a
policy that waits for hours) wait in a dictionary with a heap of their
numbers.
"""

from __future__ import annotations

import heapq
import math
import operator
from typing import Final, final


# (time, what): what >= 0 is an attempt of call number what; what < 0 the
# end of the request call number ~what had served.
_Event = tuple[float, int]

_SLOTS_PER_SECOND: Final = 1024.0
_LAST_SLOT: Final = 2**1100
"""The slot of every event too far away to have a slot of its own (its
time times 1024 is infinite): above the slot of every finite time."""
_WHEEL_SLOTS: Final = 2**21
"""Slots kept in the wheel (a list); later ones wait in a dictionary."""

_floor: Final = math.floor


def _slot(at: float) -> int:
    """The calendar's slot of an event at *at* seconds."""
    try:
        return _floor(at * _SLOTS_PER_SECOND)
    except OverflowError:
        return _LAST_SLOT


@final
class _Calendar:
    """
    A priority queue of events for times that only move forward: one list
    per slot of 1/1024 s, appended to in O(1) and sorted when the run
    reaches it. `next_slot` hands the run a slot's events in order, as a
    list the run iterates over and inserts into (behind the event being
    run: a later event never goes before an earlier one); `_Run.run` pushes
    with the same steps, inlined: ``wheel[slot].append(event)``, and `add`
    when that fails (a slot with no list yet, or past the wheel).

    Counts its slot operations, so that a test can check the cost per
    event without timing it.
    """

    __slots__ = (
        "far",
        "heap_ops",
        "inserts",
        "later",
        "now_slot",
        "occupied",
        "wheel",
    )

    def __init__(self, times: list[float], after: float = -math.inf) -> None:
        """The first attempt of call *n* at ``times[n]``, for every n
        whose time is not before *after*."""
        self.wheel: list[list[_Event] | None] = []
        """The events of each slot of the wheel after the one being run,
        by slot number; None for none."""
        self.occupied = bytearray()
        """1 for each slot of the wheel with events, else 0."""
        self.far: dict[int, list[_Event]] = {}
        """The events of the slots past the wheel."""
        self.later: list[int] = []
        """A heap of the keys of `far`."""
        self.now_slot = -1
        """The slot being run."""
        self.heap_ops = 0
        """Slots made and taken, and insertions into the slot being run:
        the steps beyond an append (O(log n) past the wheel, O(1) in it)."""
        self.inserts = 0
        """Of those, the insertions into the slot being run."""
        wheel, add = self.wheel, self.add
        floor, sps = _floor, _SLOTS_PER_SECOND
        for number, at in enumerate(times):
            if at < after:
                continue
            try:
                slot = floor(at * sps)  # `_slot`, inline.
            except OverflowError:
                slot = _LAST_SLOT
            try:
                wheel[slot].append((at, number))  # type: ignore[union-attr]
            except (IndexError, AttributeError):
                add(at, number, slot)

    def add(self, at: float, what: int, slot: int) -> None:
        """
        Push ``(at, what)`` into *slot* (``_slot(at)``), after the slot
        being run, when it is not a list of the wheel yet.
        """
        self.heap_ops += 1
        wheel = self.wheel
        if slot < _WHEEL_SLOTS:
            if slot >= len(wheel):
                grow = max(slot + 1, 2 * len(wheel), 1024) - len(wheel)
                wheel += [None] * grow
                self.occupied += bytes(grow)
            events = wheel[slot]
            if events is None:
                wheel[slot] = [(at, what)]
                self.occupied[slot] = 1
            else:
                events.append((at, what))
            return
        events = self.far.get(slot)
        if events is None:
            self.far[slot] = [(at, what)]
            heapq.heappush(self.later, slot)
        else:
            events.append((at, what))

    def next_slot(self) -> list[_Event] | None:
        """
        The events of the next slot with events, earliest first (in push
        order among equal times); None if there is none.
        """
        slot = self.occupied.find(1, self.now_slot + 1)
        if slot >= 0:
            self.occupied[slot] = 0
            events = self.wheel[slot]
            self.wheel[slot] = None
        elif self.later:
            slot = heapq.heappop(self.later)
            events = self.far.pop(slot)
        else:
            return None
        self.now_slot = slot
        self.heap_ops += 1
        # A slot's events were appended in push order: a stable sort by
        # time alone (on floats, the sort's fast path) keeps that order
        # among equal times.
        events.sort(key=_time)  # type: ignore[union-attr]
        return events


_time: Final = operator.itemgetter(0)


@final
class _Buckets:
    """
    The load chart's buckets of *width* seconds: the bucket a time falls
    in, ``int(now // width)``, and the first time of the next bucket, so
    that a run whose time only moves forward asks once per bucket.
    """

    __slots__ = ("width",)

    def __init__(self, width: float) -> None:
        self.width = width

    def at(self, now: float) -> tuple[int, float]:
        """The bucket of *now*, and the smallest time in a later one."""
        width = self.width
        index = now // width
        # The smallest float whose bucket is past *now*'s: the product
        # (index + 1) * width, rounded, may miss it by a few units in the
        # last place either way.
        end = (index + 1.0) * width
        while end // width > index:
            end = math.nextafter(end, -math.inf)
        while end // width <= index:
            end = math.nextafter(end, math.inf)
        return int(index), end
