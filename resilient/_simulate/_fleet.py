"""
What the whole simulated fleet shares: the virtual clock, the guard (the
circuit breaker and the retry budget of the policy), the dependency's
errors, and when the calls start.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from resilient import CircuitOpen, RetryBudget
from resilient._breaker import _VERDICTS, SUCCESS, Reject, _BreakerMachine


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient import BreakerPermit, BreakerTransition, Policy
    from resilient._simulate._config import SimulationConfig


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
    What a call asks before each attempt and tells after it: the seam for
    the circuit breaker and the retry budget the whole fleet shares. A call
    is named by its number; *attempt* is the number of its attempt, from
    1.
    """

    def begin(self, now: float) -> None:
        """A call starts: its first attempt is about to be made."""

    def admit(self, now: float, call: int, attempt: int) -> Exception | None:
        """
        None to send the attempt of call number *call*; else the exception
        the call sees instead (the request is not sent).
        """

    def record(self, now: float, call: int, error: Exception | None) -> None:
        """The dependency answered the attempt of *call*: *error*, or None."""


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

    __slots__ = ("breaker", "budget", "permits", "transitions")

    def __init__(self, policy: Policy, clock: _VirtualClock) -> None:
        self.breaker = (
            None
            if policy.breaker is None
            else _BreakerMachine(policy.breaker, policy.name)
        )
        self.budget = _budget(policy, clock)
        self.transitions: list[BreakerTransition] = []
        self.permits: dict[int, BreakerPermit] = {}
        """The breaker's permit of each call's attempt in flight."""

    def begin(self, now: float) -> None:
        if self.budget is not None:
            self.budget.record_call()

    def admit(self, now: float, call: int, attempt: int) -> Exception | None:
        breaker = self.breaker
        if breaker is None:
            return None
        decision = breaker.admit(now)
        self._drain(breaker)
        if isinstance(decision, Reject):
            return CircuitOpen(
                breaker.name, decision.retry_after, decision.state.value
            )
        self.permits[call] = decision
        return None

    def record(self, now: float, call: int, error: Exception | None) -> None:
        breaker = self.breaker
        if breaker is None:
            return
        permit = self.permits.pop(call, None)
        if permit is None:
            return
        outcome = (
            SUCCESS
            if error is None
            else _VERDICTS[breaker.config.verdict(error)]
        )
        breaker.record(permit, outcome, now - permit.start, now)
        self._drain(breaker)

    def _drain(self, breaker: _BreakerMachine) -> None:
        if breaker.outbox:
            self.transitions += breaker.outbox
            breaker.outbox = []


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


class _DownError(ConnectionError):
    """The dependency is down (the outage)."""


class _OverloadedError(ConnectionError):
    """The dependency refused a request beyond its capacity."""


_DOWN: Final = _DownError("simulated outage")
_OVERLOADED: Final = _OverloadedError("simulated overload")


_MAX_ATTEMPTS_PER_CLIENT: Final = 100_000


def _endless() -> RuntimeError:
    return RuntimeError(
        "simulate(): the clients retry without end; give the policy a "
        "backoff that waits, or fewer attempts"
    )


def start_times(config: SimulationConfig) -> list[float]:
    """
    When each call starts: the clients within the spread, then the steady
    calls (a Poisson process) until ``rate_until``.
    """
    # Separate streams, so that changing the policy keeps start times
    # and adding steady traffic keeps the burst's.
    starts = random.Random(f"{config.seed}:starts")
    uniform, spread = starts.uniform, config.spread
    times = [uniform(0.0, spread) for _ in range(config.clients)]
    if config.rate > 0:
        arrivals = random.Random(f"{config.seed}:arrivals")
        # `arrivals.expovariate(rate)`, its formula inline (a frame
        # less per call, the same floats: the tests check it).
        draw, log, rate = arrivals.random, math.log, config.rate
        until, append = config.rate_until, times.append
        at = -log(1.0 - draw()) / rate
        while at < until:
            append(at)
            at += -log(1.0 - draw()) / rate
    return times
