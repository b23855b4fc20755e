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
whole fleet as they would be by every caller in a process: the breaker's
pure machine is driven with the simulated time, and the real `RetryBudget`
is handed to every client's `RetryMachine`, which asks it before each retry
and outwaits an open breaker, exactly as in the library.

The events wait in a calendar queue (`_Calendar`): a slot per 1/1024 s,
appended to in O(1) and sorted when the run reaches it, so that an event
costs the same with a hundred clients in flight as with a million (a binary
heap of a million entries cost 3.4 µs per push and pop here, against
1.6 µs at 100,000).
"""

from __future__ import annotations

import bisect
import functools
import gc
import heapq
import inspect
import math
import operator
import random
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import attrs

from resilient import BreakerState, CircuitOpen, RetryBudget
from resilient._breaker import _VERDICTS, SUCCESS, Reject, _BreakerMachine
from resilient._retry import RetryMachine
from resilient._simulate._config import SimulationConfig
from resilient._simulate._result import (
    CallOutcome,
    SimulationResult,
    _summarize,
)
from resilient.testing import use_clock


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient import BreakerPermit, BreakerTransition, Policy


class _DownError(ConnectionError):
    """The dependency is down (the outage)."""


class _OverloadedError(ConnectionError):
    """The dependency refused a request beyond its capacity."""


_DOWN: Final = _DownError("simulated outage")
_OVERLOADED: Final = _OverloadedError("simulated overload")


@final
class _VirtualClock:
    """The simulation's time, read by every client's `RetryMachine`."""

    __slots__ = ("now", "t")

    def __init__(self) -> None:
        self.t = 0.0
        self.now: Callable[[], float] = functools.partial(getattr, self, "t")
        """The time: ``getattr(self, "t")``, called with no Python frame
        (every decision of every client reads it)."""

    def sleep(self, seconds: float) -> None:
        raise RuntimeError("the simulator's clock never sleeps")

    async def asleep(self, seconds: float) -> None:
        raise RuntimeError("the simulator's clock never sleeps")


class _Guard(Protocol):
    """
    What a client asks before each attempt and tells after it: the seam for
    the circuit breaker and the retry budget the whole fleet shares.
    """

    def begin(self, now: float) -> None:
        """A call starts: its first attempt is about to be made."""

    def admit(self, now: float, client: _Client) -> Exception | None:
        """
        None to send *client*'s attempt; else the exception the client
        sees instead (the request is not sent).
        """

    def record(
        self, now: float, client: _Client, error: Exception | None
    ) -> None:
        """The dependency answered *client*'s attempt: *error*, or None."""


@final
class _FleetGuard:
    """
    The breaker and the retry budget of the policy, shared by every client
    as they are shared by every caller in a process. Either may be absent.

    The breaker is the library's pure breaker machine, given the simulated
    time; a rejection is the `CircuitOpen` the breaker's shell raises. The
    retry budget is the library's `RetryBudget`: it reads the process's
    clock, which `simulate` points at the simulation's, and the clients'
    `RetryMachine`s ask it before every retry.
    """

    __slots__ = ("breaker", "budget", "transitions")

    def __init__(self, policy: Policy, clock: _VirtualClock) -> None:
        self.breaker = (
            None
            if policy.breaker is None
            else _BreakerMachine(policy.breaker, policy.name)
        )
        self.budget = _budget(policy, clock)
        self.transitions: list[BreakerTransition] = []

    def begin(self, now: float) -> None:
        if self.budget is not None:
            self.budget.record_call()

    def admit(self, now: float, client: _Client) -> Exception | None:
        machine = self.breaker
        if machine is None:
            return None
        decision = machine.admit(now)
        self._drain(machine)
        if isinstance(decision, Reject):
            return CircuitOpen(
                machine.name, decision.retry_after, decision.state.value
            )
        client.permit = decision
        return None

    def record(
        self, now: float, client: _Client, error: Exception | None
    ) -> None:
        machine, permit = self.breaker, client.permit
        if machine is None or permit is None:
            return
        client.permit = None
        outcome = (
            SUCCESS
            if error is None
            else _VERDICTS[machine.config.verdict(error)]
        )
        machine.record(permit, outcome, now - permit.start, now)
        self._drain(machine)

    def _drain(self, machine: _BreakerMachine) -> None:
        if machine.outbox:
            self.transitions += machine.outbox
            machine.outbox = []


_BUDGET_TAKES_A_CLOCK: Final = (
    "clock" in inspect.signature(RetryBudget).parameters
)
"""Whether `RetryBudget` can read the simulation's clock; if not, `simulate`
points the process's clock at the simulation's while it runs."""


def _budget(policy: Policy, clock: _VirtualClock) -> RetryBudget | None:
    """The fleet's retry budget, reading *clock* when it can."""
    config = policy.retry_budget
    if config is None:
        return None
    reads: dict[str, Any] = {"clock": clock} if _BUDGET_TAKES_A_CLOCK else {}
    return RetryBudget(policy.name, config, **reads)


def _guard(config: SimulationConfig, clock: _VirtualClock) -> _Guard | None:
    """The guard the whole fleet shares for *config*; None for none."""
    policy = config.policy
    if policy.breaker is None and policy.retry_budget is None:
        return None
    return _FleetGuard(policy, clock)


_MAX_ATTEMPTS_PER_CLIENT: Final = 100_000


@final
class _Client:
    """
    One client's call: its number, when it started, its machine, and how it
    ended. Made when its first attempt comes up, not before: a run stopped
    by its duration never pays for the calls that had not started.
    """

    __slots__ = (
        "end",
        "machine",
        "number",
        "permit",
        "reason",
        "serving",
        "start",
    )

    def __init__(self, number: int, start: float, machine: RetryMachine):
        self.number = number
        self.start = start
        self.machine = machine
        self.end: float | None = None
        self.reason: str | None = "unfinished"
        """Why it gave up; None once it succeeded."""
        self.serving = False
        """Whether its pending event is the end of a served request."""
        self.permit: BreakerPermit | None = None
        """The breaker's permit for the attempt in flight, if any."""

    def outcome(self) -> CallOutcome:
        reason = self.reason
        return CallOutcome(
            self.number,
            self.start,
            self.end,
            self.machine.attempt,
            ok=reason is None,
            reason=reason,
        )


# An event is (time, sequence number, what): a client's number for its first
# attempt (the client is made then), or the client for a later one. The
# sequence number breaks ties in the order the events were pushed, and the
# comparison never reaches the third item.
_Event = tuple[float, int, "int | _Client"]

_SLOTS_PER_SECOND: Final = 1024.0
_LAST_SLOT: Final = 2**1000
"""The slot of every event too far away to have a slot of its own."""
_LAST_SLOT_F: Final = float(_LAST_SLOT)  # Exact: a power of two.


def _slot(at: float) -> int:
    """The calendar's slot of an event at *at* seconds."""
    slot = at * _SLOTS_PER_SECOND
    return int(slot) if slot < _LAST_SLOT else _LAST_SLOT


@final
class _Calendar:
    """
    A priority queue of events for times that only move forward: one list
    per slot of 1/1024 s, appended to in O(1) and sorted when the run
    reaches it (latest first, so that the next event is popped off the
    end). Events come out in (time, sequence) order, exactly as from a
    heap; `_Run.run` pushes with the same steps, inlined.

    Counts its heap operations, so that a test can check the cost per event
    without timing it.
    """

    __slots__ = (
        "current",
        "heap_ops",
        "inserts",
        "later",
        "now_slot",
        "seq",
        "slots",
    )

    def __init__(self, times: list[float]) -> None:
        slots: dict[int, list[_Event]] = {}
        for seq, at in enumerate(times):
            slot = _slot(at)
            events = slots.get(slot)
            if events is None:
                slots[slot] = [(at, seq, seq)]
            else:
                events.append((at, seq, seq))
        self.slots = slots
        """The events of the slots after the one being run."""
        self.later = sorted(slots)
        """A heap of the keys of `slots`."""
        self.seq = len(times)
        """The sequence number of the next event pushed."""
        self.now_slot = -1
        self.current: list[_Event] = []
        """The events of the slot being run, latest first."""
        self.heap_ops = 0
        """Pushes and pops on the heap of slots, and insertions into the
        slot being run: O(log n) steps, the rest are O(1)."""
        self.inserts = 0
        """Of those, the insertions into the slot being run."""

    def next_slot(self) -> bool:
        """Move on to the next slot with events; False if there is none."""
        if not self.later:
            return False
        self.now_slot = slot = heapq.heappop(self.later)
        self.heap_ops += 1
        events = self.slots.pop(slot)
        # Latest first, as sort(reverse=True) orders the (time, sequence)
        # pairs, for less: a slot's events were appended in sequence order,
        # so reversed they are latest first among equal times, and a
        # stable sort by time alone (on floats, the sort's fast path) keeps
        # them so.
        events.reverse()
        events.sort(key=_time, reverse=True)
        self.current = events
        return True


_time: Final = operator.itemgetter(0)


def _latest_first(event: _Event) -> tuple[float, int]:
    return (-event[0], -event[1])


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
        # Separate streams, so that changing the policy keeps start times
        # and adding steady traffic keeps the burst's.
        starts = random.Random(f"{config.seed}:starts")
        self.jitter = random.Random(f"{config.seed}:jitter")
        uniform, spread = starts.uniform, config.spread
        times = [uniform(0.0, spread) for _ in range(config.clients)]
        if config.rate > 0:
            arrivals = random.Random(f"{config.seed}:arrivals")
            draw, rate = arrivals.expovariate, config.rate
            at = draw(rate)
            while at < config.rate_until:
                times.append(at)
                at += draw(rate)
        self.times = times
        self.clients: list[_Client | None] = [None] * len(times)
        self.calendar = _Calendar(times)

    def run(self) -> None:  # noqa: C901, PLR0912, PLR0915 (the hot loop)
        """
        Run every event before the duration, in time order.

        One loop, with the calendar's push, the dependency and the load
        chart inlined: this is where a million calls spend their time.
        """
        config = self.config
        stop = math.inf if config.duration is None else config.duration
        policy, clock, rng = config.policy, self.clock, self.jitter
        guard = self.guard
        budget = guard.budget if isinstance(guard, _FleetGuard) else None
        service_time = config.service_time
        width = config.bucket
        outage, capacity, size = config.outage, config.capacity, config.tokens
        tokens, refilled = size, outage
        load, served = self.load, self.served
        clients, times = self.clients, self.times
        calendar = self.calendar
        slots, later, seq = calendar.slots, calendar.later, calendar.seq
        current, now_slot, next_slot = calendar.current, -1, calendar.next_slot
        left = _MAX_ATTEMPTS_PER_CLIENT * len(times)
        during_outage = refused = 0
        last = end = 0.0
        overload_end: float | None = None
        insort, heappush = bisect.insort, heapq.heappush
        decide = RetryMachine.decide_error
        # What the policy's retry_on says of the dependency's two errors,
        # asked once (they are the same two objects all run long); a
        # breaker's CircuitOpen is outwaited before retry_on is asked.
        probe = RetryMachine(policy, clock, rng, 0.0)
        down_ok, overloaded_ok = (
            probe.is_transient(_DOWN),
            probe.is_transient(_OVERLOADED),
        )
        while True:
            if not current:
                if not next_slot():
                    break
                current, now_slot = calendar.current, calendar.now_slot
            now, _, what = current.pop()
            if now >= stop:
                break
            clock.t = end = now
            if isinstance(what, int):
                start = times[what]
                machine = RetryMachine(
                    policy, clock, rng, start, retry_budget=budget
                )
                client = clients[what] = _Client(what, start, machine)
                if guard is not None:
                    guard.begin(now)
            else:
                client = what
                if client.serving:
                    if guard is not None:
                        guard.record(now, client, None)
                    client.end, client.reason = now, None
                    continue
                machine = client.machine
            left -= 1
            if left < 0:
                raise RuntimeError(
                    "simulate(): the clients retry without end; give the "
                    "policy a backoff that waits, or fewer attempts"
                )
            error: Exception | None = (
                None if guard is None else guard.admit(now, client)
            )
            if error is None:
                # The request reaches the dependency: count it, serve it.
                index = int(now // width)
                if index >= len(load):
                    grow = [0] * (index + 1 - len(load))
                    load += grow
                    served += grow
                load[index] += 1
                last = now
                if now < outage:
                    during_outage += 1
                    error = _DOWN
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
                                client.end, client.reason = at, None
                                end = max(end, at)
                            continue
                        client.serving = True
                    else:
                        overload_end = now
                        error = _OVERLOADED
                if error is not None and guard is not None:
                    guard.record(now, client, error)
            else:
                refused += 1
            if error is not None:
                # The machine's decision without its event records, which
                # nothing here reads.
                delay = decide(
                    machine,
                    error,
                    False,  # own_timeout (positional: fewer steps)
                    down_ok
                    if error is _DOWN
                    else overloaded_ok
                    if error is _OVERLOADED
                    else None,
                )
                if isinstance(delay, str):
                    client.end, client.reason = now, delay
                    continue
                at = now + delay
            # Push (at, seq, client): the calendar's push, inlined.
            seq += 1
            slot = at * _SLOTS_PER_SECOND
            # (A float bound: comparing a float with the int 2**1000 costs
            # a conversion each time.)
            slot = int(slot) if slot < _LAST_SLOT_F else _LAST_SLOT
            if slot <= now_slot:
                # Due within the slot being run (a wait under a
                # millisecond): in its place among the rest.
                insort(current, (at, seq, client), key=_latest_first)
                calendar.heap_ops += 1
                calendar.inserts += 1
                continue
            events = slots.get(slot)
            if events is None:
                slots[slot] = [(at, seq, client)]
                heappush(later, slot)
                calendar.heap_ops += 1
            else:
                events.append((at, seq, client))
        calendar.seq = seq
        self.last, self.end, self.overload_end = last, end, overload_end
        self.refused, self.during_outage = refused, during_outage

    def result(self) -> SimulationResult:
        config = self.config
        load, served = self.load, self.served
        end = self.end
        if config.duration is not None:
            end = config.duration
            size = max(1, math.ceil(config.duration / config.bucket - 1e-9))
            load = (load + [0] * size)[:size]
            served = (served + [0] * size)[:size]
        times = self.times
        calls = tuple(
            CallOutcome(number, times[number], None, 1, ok=False, reason=_NO)
            if client is None
            else client.outcome()
            for number, client in enumerate(self.clients)
        )
        guard = self.guard
        if isinstance(guard, _FleetGuard):
            transitions = tuple(guard.transitions)
            machine, budget = guard.breaker, guard.budget
        else:
            transitions, machine, budget = (), None, None
        figures = _summarize(
            config,
            load,
            calls,
            self.last,
            self.overload_end,
            refused=self.refused,
            during_outage=self.during_outage,
        )
        if machine is not None:
            closed = [t.at for t in transitions if t.new is _CLOSED]
            figures = attrs.evolve(
                figures,
                breaker_opened=machine.times_opened,
                breaker_closed=(
                    closed[-1] if closed and machine.state is _CLOSED else None
                ),
            )
        if budget is not None:
            stats = budget.statistics()
            figures = attrs.evolve(
                figures,
                budget_retries=stats.total_retries,
                budget_refused=stats.refused,
                budget_calls=stats.total_calls,
            )
        return SimulationResult(
            config=config,
            load=tuple(load),
            served=tuple(served),
            calls=calls,
            overload_end=self.overload_end,
            end=end,
            summary=figures,
            transitions=transitions,
        )


_CLOSED: Final = BreakerState.CLOSED
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
