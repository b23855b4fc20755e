"""
The outage without a guard: each call's attempts run one after another.

While the dependency is down, every request fails at once, and without a
guard (no breaker, no retry budget) nothing one call does changes what
another's attempts see: the failure, the load chart's count, the machine's
decision. So a call needs no calendar until it leaves the outage. The run
takes the calls that start before it ends one at a time, fails each of its
attempts there in a row (the machine decides, the next attempt is its
wake-up time), and pushes into the calendar only its first attempt after
the outage, or records its give-up.

This is the same simulation as running every attempt through the calendar
in time order, but for the order of the draws from the run's jitter stream:
a call draws its outage's delays in a row, and the calls draw in their
numbers' order. The delays are drawn the same way from the same stream
(the machine's decision, its backoff, one ``rng.random()`` each), so the
figures' distribution is the same; for a given seed they are not the ones
an event-ordered run gives (the test of the same name in
tests/test_simulate_outage.py measures how close).

A run over a million calls spent two fifths of its attempts in the outage,
and each of them paid for an event: a tuple, a calendar slot's append and
sort, the loop's steps, and, with half a million calls in flight, a machine
fetched from far away in memory. A call's attempts in a row keep its
machine at hand and skip the calendar.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from resilient._retry import RetryMachine
from resilient._simulate._calendar import _LAST_SLOT, _SLOTS_PER_SECOND
from resilient._simulate._fleet import _DOWN, _endless


if TYPE_CHECKING:
    from resilient._simulate._calendar import _Calendar
    from resilient._simulate._fleet import _VirtualClock


def run_outage(  # noqa: C901, PLR0912, PLR0915 (the hot loop, in one frame)
    *,
    cut: float,
    template: RetryMachine,
    clock: _VirtualClock,
    fast: bool,
    transient: bool,
    times: list[float],
    machines: list[RetryMachine | int | None],
    ends: list[float | None],
    reasons: list[str | None],
    load: list[int],
    width: float,
    calendar: _Calendar,
    left: int,
) -> tuple[int, float]:
    """
    Fail, in a row, the attempts before *cut* (the end of the outage, or the
    end of the run when that comes first) of every call that starts before
    it; push each such call's first attempt at or after *cut* into
    *calendar*, or record why it gave up.

    Counts every attempt in *load* (buckets of *width* seconds: grown as
    needed, the served chart is the caller's to grow to the same length).

    Args:
        cut: No attempt at or after this time is run here.
        template: The machine each call's own is a `RetryMachine.sibling`
            of.
        clock: The run's clock, set to each attempt's time when the
            machine may read it (not *fast*).
        fast: Whether the dependency's outage error is transient and the
            policy reads no hint from it: the machine's
            `RetryMachine.decide_transient` answers it.
        transient: What the policy's ``retry_on`` says of the outage's
            error.
        times: When each call starts.
        machines: Each call's machine (set for a call still in flight
            after *cut*), or its attempts once it ended (set here for a
            call that gave up).
        ends: When each call ended (set for one that gave up).
        reasons: Why each call gave up (set for one that did).
        load: The load chart's counts.
        width: The chart's bucket, in seconds.
        calendar: The run's calendar, for the attempts after *cut*.
        left: Attempts the run may still make before it is stopped as
            endless.

    Returns:
        The attempts the run may still make, and the time of the latest
        attempt made here (-1.0 for none).

    Raises:
        RuntimeError: *left* ran out (a policy that retries without waiting
            or end).
    """
    sibling = RetryMachine.sibling
    decide_transient = RetryMachine.decide_transient
    decide = RetryMachine.decide_error
    wheel, add = calendar.wheel, calendar.add
    sps, floor = _SLOTS_PER_SECOND, math.floor
    latest = -1.0
    size = len(load)
    for call, start in enumerate(times):
        if start >= cut:
            continue
        machine = sibling(template, start)
        now = start
        while True:
            index = int(now // width)
            try:
                load[index] += 1
            except IndexError:
                load += [0] * (index + 1 - size)
                size = index + 1
                load[index] += 1
            left -= 1
            if left < 0:
                raise _endless()
            if fast:
                delay = decide_transient(machine, now)
            else:
                clock.t = now
                delay = decide(machine, _DOWN, False, transient)
            try:
                at = now + delay  # type: ignore[operator]
            except TypeError:
                # A str: why the call gave up.
                ends[call] = now
                reasons[call] = delay  # type: ignore[assignment]
                machines[call] = machine.attempt
                break
            if at < cut:
                now = at
                continue
            machines[call] = machine
            if fast:
                # The same float as the machine's wake-up time (see the
                # engine's loop after the outage).
                at = machine.wake
            # The calendar's push (`_Calendar.add`, as `_Run.run` does it).
            try:
                slot = floor(at * sps)
            except OverflowError:
                slot = _LAST_SLOT
            try:
                wheel[slot].append((at, call))  # type: ignore[union-attr]
            except (IndexError, AttributeError):
                add(at, call, slot)
            break
        if now > latest:  # noqa: PLR1730 - max(), without a call
            latest = now
    return left, latest
