"""
The simulation itself: many clients, one dependency that goes down.

`simulate` runs the library's own backoff strategies and its real
`RetryMachine` in virtual time (a discrete-event simulation; it never
sleeps) against a simulated dependency:

- during the outage (from 0 to ``outage`` seconds) every request fails at
  once with a `ConnectionError`;
- after it, a token bucket serves at most ``capacity`` requests per second
  (``burst`` at once) and refuses the excess, also with a `ConnectionError`,
  so retries that arrive together keep failing.

Every client makes one call; its first attempt starts at a random time in
``[0, spread)``. Steady traffic can come on top: ``rate`` new calls per
second (a Poisson process) until ``rate_until``.

The policy may name a circuit breaker and a retry budget, shared by the
whole fleet as they would be by every caller in a process (`_fleet`): the
breaker's pure machine is driven with the simulated time, and the real
`RetryBudget` is handed to every client's `RetryMachine`, which asks it
before each retry and outwaits an open breaker, exactly as in the library.

Without a guard, nothing one call does changes what another's attempts
see until the outage ends: each call's attempts in the outage run in a row
before the calendar's (`_outage`), and only its first attempt after the
outage becomes an event.

The events wait in a calendar queue (`_calendar`). A call is its number:
its `RetryMachine` and how it ended are kept in lists by number (columns),
not in an object per call, and what the run measures is counted per bucket
as it goes.
"""

from __future__ import annotations

import bisect
import gc
import math
import random
from typing import TYPE_CHECKING, Final, cast, final

from resilient._retry import RetryMachine
from resilient._simulate._calendar import (
    _LAST_SLOT,
    _SLOTS_PER_SECOND,
    _WHEEL_SLOTS,
    _Buckets,
    _Calendar,
    _time,
)
from resilient._simulate._config import SimulationConfig
from resilient._simulate._fleet import (
    _BUDGET_TAKES_A_CLOCK,
    _DOWN,
    _MAX_ATTEMPTS_PER_CLIENT,
    _OVERLOADED,
    _endless,
    _FleetGuard,
    _guard,
    _VirtualClock,
    start_times,
)
from resilient._simulate._outage import run_outage
from resilient._simulate._result import Calls, SimulationResult, collect
from resilient.testing import use_clock


if TYPE_CHECKING:
    from resilient._core._decisions import GiveUpReason


__all__ = [
    "_BUDGET_TAKES_A_CLOCK",
    "_Buckets",
    "_Calendar",
    "_Run",
    "_VirtualClock",
    "_guard",
    "simulate",
]


@final
class _Run:
    """The event loop of one simulation and what it counts."""

    def __init__(self, config: SimulationConfig, clock: _VirtualClock):
        self.config = config
        self.clock = clock
        self.guard = _guard(config, clock)
        self.load: list[int] = []
        self.served: list[int] = []
        self.last = 0.0
        self.end = 0.0
        self.refused = 0
        self.during_outage = 0
        self.overload_end: float | None = None
        # Its own stream, so that the start times (`start_times`) stay the
        # same when the policy changes.
        self.jitter = random.Random(f"{config.seed}:jitter")
        self.times = times = start_times(config)
        calls = len(times)
        # The calls, by number: a column each, not an object per call.
        self.machines: list[RetryMachine | int | None] = [None] * calls
        """Each call's machine, made at its first failure: a call served at
        once needs none, and a run stopped by its duration never pays for
        the calls that had not started. Once the call has ended, the number
        of attempts it made in its place, so that a run keeps the machines
        of the calls in flight only (a million calls' machines took a third
        of the memory of a run)."""
        self.ends: list[float | None] = [None] * calls
        self.reasons: list[str | None] = [_NO] * calls
        """Why each call gave up; None once it succeeded."""
        self.cut = -math.inf
        """Without a guard, the end of the outage (or of the run, if that
        comes first): the calls' attempts before it run in a row before the
        calendar's (`_outage`), which holds only the later ones."""
        if self.guard is None:
            end = math.inf if config.duration is None else config.duration
            self.cut = min(config.outage, end)
        self.calendar = _Calendar(times, self.cut)

    def run(self) -> None:  # noqa: C901, PLR0912, PLR0915 (the hot loop)
        """
        Run every event before the duration, in time order.

        One loop, with the calendar's push, the dependency and the load
        chart inlined: this is where a million calls spend their time.
        Without a guard, a calendar slot within one bucket of the chart
        runs in a loop of its own, the outage's or the capacity's, that
        counts the chart per slot rather than per request.
        """
        config = self.config
        stop = math.inf if config.duration is None else config.duration
        policy, clock, rng = config.policy, self.clock, self.jitter
        guard = self.guard
        budget = guard.budget if isinstance(guard, _FleetGuard) else None
        service_time = config.service_time
        outage, capacity, size = config.outage, config.capacity, config.tokens
        tokens, refilled = size, outage
        load, served = self.load, self.served
        # The load chart's bucket of the time being run, and when the next
        # one starts (`_Buckets`): times only move forward.
        buckets = _Buckets(config.bucket)
        index, bucket_end = -1, -math.inf
        # A call's slot holds its attempts (an int) only once it has ended,
        # and an ended call has no events left: the loop sees machines.
        machines = cast("list[RetryMachine | None]", self.machines)
        counted = self.machines  # The same list, for the attempts.
        ends, reasons = self.ends, self.reasons
        times = self.times
        calendar = self.calendar
        wheel, add, next_slot = (
            calendar.wheel,
            calendar.add,
            calendar.next_slot,
        )
        sps, floor = _SLOTS_PER_SECOND, math.floor
        now_slot = -1
        # Events left before the run is stopped as endless: counted a slot
        # at a time (and at each insertion into the slot being run, which
        # a policy that never waits fills without end); the ends of served
        # requests are events too, one per call at most.
        left = (_MAX_ATTEMPTS_PER_CLIENT + 1) * len(times)
        during_outage = refused = 0
        last = end = 0.0
        # Without a guard, the end of the latest request served before the
        # duration: the run ends at it or at the last attempt, the later.
        served_at = -math.inf
        overload_end: float | None = None
        insort = bisect.insort_right
        decide = RetryMachine.decide_error
        decide_transient = RetryMachine.decide_transient
        # Every call's machine is made like this one (`sibling`: the
        # constructor's work, less its arguments and defaults).
        template = RetryMachine(policy, clock, rng, 0.0, retry_budget=budget)
        sibling = RetryMachine.sibling
        # What the policy's retry_on says of the dependency's two errors,
        # asked once (they are the same two objects all run long); a
        # breaker's CircuitOpen is outwaited before retry_on is asked.
        down_ok, overloaded_ok = (
            template.is_transient(_DOWN),
            template.is_transient(_OVERLOADED),
        )
        # The dependency's errors carry no hint, and a policy that reads
        # none (retry_after=None) has `decide_error` answer a transient one
        # as `decide_transient` does, in fewer frames.
        no_hint = policy.retry_after is None
        down_fast = down_ok and no_hint
        overloaded_fast = overloaded_ok and no_hint
        if guard is None:
            # The outage's attempts, each call's in a row (`_outage`).
            before = left
            left, latest = run_outage(
                cut=self.cut,
                template=template,
                clock=clock,
                fast=down_fast,
                transient=down_ok,
                times=times,
                machines=counted,
                ends=ends,
                reasons=reasons,
                load=load,
                width=config.bucket,
                calendar=calendar,
                left=left,
            )
            during_outage = before - left
            served += [0] * (len(load) - len(served))
            if latest >= 0.0:
                last = latest
        error: Exception | None
        transient: bool | None
        delay: float | GiveUpReason
        while (current := next_slot()) is not None:
            now_slot = calendar.now_slot
            left -= len(current)
            if left < 0:
                raise _endless()
            # The slot's end (exact); a slot past the wheel runs the
            # general loop.
            slot_end = (
                (now_slot + 1.0) / sps if now_slot < _WHEEL_SLOTS else math.inf
            )
            if guard is None and slot_end + service_time < stop:
                start = now_slot / sps
                if start >= bucket_end:
                    index, bucket_end = buckets.at(start)
                    if index >= len(load):
                        grow = [0] * (index + 1 - len(load))
                        load += grow
                        served += grow
                if (
                    slot_end <= bucket_end
                    and start >= outage
                    and overloaded_fast
                ):
                    # Wholly after the outage (whose attempts, without a
                    # guard, ran before the calendar: `_outage`) and in one
                    # bucket: every event is an attempt (no guard: no event
                    # for the end of a request), the token bucket serves or
                    # refuses each, the dependency's overload is transient
                    # and reads no hint; the load, the last attempt and the
                    # end are counted once per slot.
                    count = 0
                    for now, call in current:
                        tokens += (now - refilled) * capacity
                        if tokens >= size:  # noqa: PLR1730 - min()
                            tokens = size
                        refilled = now
                        if tokens >= 1.0:
                            tokens -= 1.0
                            count += 1
                            served_at = ends[call] = now + service_time
                            reasons[call] = None
                            machine = machines[call]
                            if machine is not None:
                                counted[call] = machine.attempt
                            continue
                        # No clock to set: nothing reads it (no guard, and
                        # the machine is given the time).
                        overload_end = now
                        machine = machines[call]
                        if machine is None:
                            machine = machines[call] = sibling(template, now)
                        delay = decide_transient(machine, now)
                        try:
                            now + delay  # type: ignore[operator]
                        except TypeError:
                            # A str: why the call gives up (once per
                            # call at most, cheaper than a test each).
                            ends[call] = now
                            reasons[call] = delay  # type: ignore[assignment]
                            counted[call] = machine.attempt
                            continue
                        # The machine's wake-up time, ``now + delay``: the
                        # same float object as the event's, which a slot's
                        # sort has just read, so that the machine's next
                        # decision frees it from the cache, not from memory.
                        at = machine.wake
                        # The push below, the same steps.
                        try:
                            slot = floor(at * sps)
                        except OverflowError:
                            slot = _LAST_SLOT
                        if slot <= now_slot:
                            insort(current, (at, call), key=_time)
                            calendar.heap_ops += 1
                            calendar.inserts += 1
                            left -= 1
                            if left < 0:
                                raise _endless()
                            continue
                        try:
                            wheel[slot].append((at, call))  # type: ignore[union-attr]
                        except (IndexError, AttributeError):
                            add(at, call, slot)
                    served[index] += count
                    last = current[-1][0]
                    load[index] += len(current)
                    continue
            # The slot's events in order; a wait under a millisecond is
            # inserted behind the event being run, and the loop reaches it.
            for now, call in current:
                if now >= stop:
                    break
                clock.t = end = now
                if call < 0:
                    # The end of a served request (only with a guard, which
                    # waits on it).
                    call = ~call  # noqa: PLW2901 - the call's number
                    if guard is not None:
                        guard.record(now, call, None)
                    ends[call], reasons[call] = now, None
                    machine = machines[call]
                    if machine is not None:
                        counted[call] = machine.attempt
                    continue
                # No machine yet: this is the call's first attempt (its
                # machine is made at its first failure, below).
                machine = machines[call]
                if guard is not None:
                    if machine is None:
                        guard.begin(now)
                    error = guard.admit(
                        now, call, 1 if machine is None else machine.attempt
                    )
                    if error is not None:
                        refused += 1
                        transient = None
                else:
                    error = None
                if error is None:
                    # The request reaches the dependency: count it, serve it.
                    if now >= bucket_end:
                        index, bucket_end = buckets.at(now)
                        if index >= len(load):
                            grow = [0] * (index + 1 - len(load))
                            load += grow
                            served += grow
                    load[index] += 1
                    last = now
                    if now < outage:
                        during_outage += 1
                        error, transient = _DOWN, down_ok
                    else:
                        tokens += (now - refilled) * capacity
                        if tokens >= size:  # noqa: PLR1730 - min(), without a call
                            tokens = size
                        refilled = now
                        if tokens >= 1.0:
                            tokens -= 1.0
                            served[index] += 1
                            at = now + service_time
                            if guard is None:
                                # Nothing waits on the end of a served request
                                # without a guard: no event for it.
                                if at < stop:
                                    ends[call], reasons[call] = at, None
                                    if machine is not None:
                                        counted[call] = machine.attempt
                                    served_at = at
                                continue
                            # The end of the request, as an event.
                            call = ~call  # noqa: PLW2901
                        else:
                            overload_end = now
                            error, transient = _OVERLOADED, overloaded_ok
                    if error is not None and guard is not None:
                        guard.record(now, call, error)
                if error is not None:
                    if machine is None:
                        # The first failure of the call, at its start: its
                        # machine is the one its first attempt would have
                        # made (a call served at once needs none).
                        machine = machines[call] = sibling(template, now)
                    # The machine's decision without its event records, which
                    # nothing here reads.
                    delay = (
                        decide_transient(machine, now)
                        if transient and no_hint
                        else decide(
                            machine,
                            error,
                            False,  # own_timeout (positional: fewer steps)
                            transient,
                        )
                    )
                    if isinstance(delay, str):
                        ends[call], reasons[call] = now, delay
                        counted[call] = machine.attempt
                        continue
                    at = now + delay
                # Push (at, call): the calendar's push, inlined (`_slot`,
                # then `_Calendar.add` when the slot has no list yet).
                try:
                    slot = floor(at * sps)
                except OverflowError:
                    slot = _LAST_SLOT
                if slot <= now_slot:
                    # Due within the slot being run (a wait under a
                    # millisecond): in its place among the rest, after the
                    # events already due at the same time.
                    insort(current, (at, call), key=_time)
                    calendar.heap_ops += 1
                    calendar.inserts += 1
                    left -= 1
                    if left < 0:
                        raise _endless()
                    continue
                try:
                    wheel[slot].append((at, call))  # type: ignore[union-attr]
                except (IndexError, AttributeError):
                    add(at, call, slot)
            else:
                continue
            break
        if guard is None:
            # What a guard's run finds as its last event: the last attempt,
            # or the end of a request served before the duration if later
            # (every event is an attempt, in time order).
            end = max(last, served_at)
        self.last, self.end, self.overload_end = last, end, overload_end
        self.refused, self.during_outage = refused, during_outage

    def calls(self) -> Calls:
        """The outcome of each call, from the run's columns."""
        return Calls(
            self.times,
            self.ends,
            [
                1 if m is None else m if type(m) is int else m.attempt  # type: ignore[union-attr]
                for m in self.machines
            ],
            self.reasons,
        )

    def result(self) -> SimulationResult:
        """What the run measured (`_result.collect`)."""
        guard = self.guard
        fleet = guard if isinstance(guard, _FleetGuard) else None
        return collect(
            self.config,
            self.load,
            self.served,
            self.calls(),
            end=self.end,
            last=self.last,
            overload_end=self.overload_end,
            refused=self.refused,
            during_outage=self.during_outage,
            transitions=() if fleet is None else tuple(fleet.transitions),
            breaker=None if fleet is None else fleet.breaker,
            budget=None if fleet is None else fleet.budget,
        )


_NO: Final = "unfinished"


def simulate(config: SimulationConfig | None = None) -> SimulationResult:
    """
    Run *config* in virtual time and measure it.

    Deterministic for a given configuration (seed included). Note that
    `resilient.testing.set_testing` applies here as everywhere: while it is
    on, the clients do not wait between attempts.

    With a retry budget, while it runs, the process's clock
    (`resilient.testing.use_clock`) is the simulation's, so that the retry
    budget's window moves in simulated time; the previous clock is put back
    when it returns or raises. Do not run such a simulation while other
    threads of the process use resilient for real.

    Args:
        config: What to simulate; None for the defaults.

    Raises:
        RuntimeError: The clients made more than 100,000 attempts each on
            average (a policy that retries without waiting or end).
    """
    clock = _VirtualClock()
    config = config if config is not None else SimulationConfig()
    if config.policy.retry_budget is not None and not _BUDGET_TAKES_A_CLOCK:
        with use_clock(clock):
            return _simulate(config, clock)
    return _simulate(config, clock)


def _simulate(
    config: SimulationConfig, clock: _VirtualClock
) -> SimulationResult:
    # A run makes millions of small objects that live until it ends: the
    # cyclic collector would walk them again and again for nothing (a
    # fifth of the time of a run of 200,000 calls).
    collecting = gc.isenabled()
    gc.disable()
    try:
        run = _Run(config, clock)
        run.run()
        return run.result()
    finally:
        if collecting:
            gc.enable()
