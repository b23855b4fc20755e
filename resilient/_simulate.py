"""
The retry simulator: many clients, one dependency that goes down.

`simulate` runs the library's own backoff strategies and its real
`RetryMachine` in virtual time (a discrete-event simulation over a heap; it
never sleeps) against a simulated dependency:

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
pure `_BreakerMachine` is driven with the simulated time, and the real
`RetryBudget` is handed to every client's `RetryMachine`, which asks it
before each retry and outwaits an open breaker, exactly as in the library.

`SimulationResult` holds the load per time bucket, the outcome of every
call, the breaker's transitions and a `Summary` of the figures a user
tuning a policy wants. `render_text` is what ``python -m resilient
simulate`` prints.

The public names are re-exported by `resilient.simulation`.
"""

from __future__ import annotations

import heapq
import math
import random
import shlex
from collections import Counter
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import attrs

from resilient._breaker import (
    _VERDICTS,
    SUCCESS,
    BreakerPermit,
    BreakerState,
    BreakerTransition,
    Reject,
    _BreakerMachine,
)
from resilient._core import _clock
from resilient._core._backoff import (
    Constant,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
)
from resilient._core._config_breaker import BreakerConfig, TimeWindow
from resilient._core._decisions import GiveUp
from resilient._core._policy import Policy
from resilient._core._validate import (
    check_int,
    check_number,
    field_name,
    non_negative,
    positive,
    positive_or_none,
    to_seconds,
)
from resilient._retry import RetryMachine
from resilient._retry_budget import RetryBudget
from resilient.exceptions import CircuitOpen, ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._core._config_retry_budget import RetryBudgetConfig
    from resilient.typing import Backoff


STRATEGIES: Final[tuple[str, ...]] = (
    "full",
    "equal",
    "decorrelated",
    "exponential",
    "constant",
)
"""The backoff strategies the simulator knows by name."""

_BACKOFFS: Final[dict[str, Callable[[float, float], Backoff]]] = {
    "full": lambda base, cap: FullJitter(base=base, cap=cap),
    "equal": lambda base, cap: EqualJitter(base=base, cap=cap),
    "decorrelated": lambda base, cap: DecorrelatedJitter(base=base, cap=cap),
    "exponential": lambda base, cap: Exponential(base=base, cap=cap),
    "constant": lambda base, _: Constant(seconds=base),
}

# The simulated fleet's policy differs from `Policy()` in one way: 4
# attempts (the library default) are spent in about 1.4 s of backoff, well
# inside a 5 s outage, and every call would give up before it ends.
DEFAULT_ATTEMPTS: Final = 10
DEFAULT_BUDGET: Final = 30.0


def backoff_for(
    strategy: str, *, base: float = 0.2, cap: float = 5.0
) -> Backoff:
    """
    The backoff strategy called *strategy* (one of `STRATEGIES`).

    Args:
        strategy: ``full``, ``equal``, ``decorrelated``, ``exponential`` (no
            jitter) or ``constant`` (waits *base* every time).
        base: Seconds; the first window (the constant delay for
            ``constant``).
        cap: Seconds; the largest window (ignored by ``constant``).

    Raises:
        resilient.ConfigError: An unknown *strategy*, or a bad *base* or
            *cap* (named after the strategy's class, like
            ``FullJitter.cap``).
    """
    try:
        make = _BACKOFFS[strategy]
    except (KeyError, TypeError):
        raise ConfigError(
            "strategy", strategy, f"must be one of {', '.join(STRATEGIES)}"
        ) from None
    return make(base, cap)


def strategy_of(backoff: Backoff) -> str | None:
    """The name `backoff_for` knows *backoff* by, or None if none."""
    for name, cls in (
        ("full", FullJitter),
        ("equal", EqualJitter),
        ("decorrelated", DecorrelatedJitter),
        ("exponential", Exponential),
        ("constant", Constant),
    ):
        if type(backoff) is cls:
            return name
    return None


# The simulated breaker differs from `BreakerConfig()` in its timings: the
# library's 60 s window and 30 s open interval are made for outages of
# minutes; against a 5 s outage and 30 s call budgets, a breaker open for
# 30 s would outlast every call. The thresholds are the library's.
BREAKER_FAILURE_RATE: Final = 0.5
BREAKER_MINIMUM_CALLS: Final = 5
BREAKER_WINDOW: Final = 10.0
BREAKER_OPEN_INTERVAL: Final = 1.0
BREAKER_PROBES: Final = 3


def make_breaker(
    *,
    failure_rate: float = BREAKER_FAILURE_RATE,
    minimum_calls: int = BREAKER_MINIMUM_CALLS,
    window: float = BREAKER_WINDOW,
    open_interval: float = BREAKER_OPEN_INTERVAL,
    half_open_probes: int = BREAKER_PROBES,
) -> BreakerConfig:
    """
    The circuit breaker the CLI's ``--breaker`` options describe.

    A `BreakerConfig` over a `TimeWindow` of *window* seconds; the fields
    not named here keep the library's defaults.

    Args:
        failure_rate: Open when at least this fraction of the window's
            calls failed, in (0, 1].
        minimum_calls: Never open on fewer calls in the window.
        window: Seconds of calls the failure rate is taken over.
        open_interval: Seconds an opened breaker rejects calls before it
            admits probes.
        half_open_probes: Probes admitted while half-open; this many
            successes close it.

    Raises:
        resilient.ConfigError: A bad value, named after the field that
            refused it (``BreakerConfig.open_interval``,
            ``TimeWindow.seconds``...).
    """
    return BreakerConfig(
        window=TimeWindow(window),
        failure_rate=failure_rate,
        minimum_calls=minimum_calls,
        open_interval=open_interval,
        half_open_probes=half_open_probes,
    )


def _cli_breaker(breaker: BreakerConfig) -> bool:
    """Whether the CLI's options can express *breaker*."""
    window = breaker.window
    return isinstance(window, TimeWindow) and breaker == make_breaker(
        failure_rate=breaker.failure_rate,
        minimum_calls=breaker.minimum_calls,
        window=window.seconds,
        open_interval=breaker.open_interval,
        half_open_probes=breaker.half_open_probes,
    )


def make_policy(
    strategy: str = "full",
    *,
    base: float = 0.2,
    cap: float = 5.0,
    attempts: int | None = DEFAULT_ATTEMPTS,
    budget: float | None = DEFAULT_BUDGET,
    breaker: BreakerConfig | None = None,
    retry_budget: RetryBudgetConfig | None = None,
) -> Policy:
    """
    The policy the simulated clients follow, from the CLI's options.

    It retries `ConnectionError` (what the simulated dependency raises) and
    reads no server hints, since the dependency sends none.

    Args:
        strategy: The backoff, by name (see `backoff_for`).
        base: Seconds; the backoff's first window.
        cap: Seconds; its largest window.
        attempts: Attempts per call, the first included; None for no limit.
        budget: Seconds per call, waits included; None for no limit.
        breaker: The circuit breaker the fleet shares (`make_breaker`), or
            None for none.
        retry_budget: The retry budget the fleet shares, or None for none.

    Raises:
        resilient.ConfigError: A bad value, named after the field that
            refused it.
    """
    return Policy(
        name="simulated",
        attempts=attempts,
        backoff=backoff_for(strategy, base=base, cap=cap),
        budget=budget,
        retry_after=None,
        breaker=breaker,
        retry_budget=retry_budget,
    )


def _count(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_int(inst, attribute, value)


def _seed(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_int(inst, attribute, value, minimum=0)


def _burst(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is None:
        return
    check_number(inst, attribute, value, minimum=1.0)


def _policy(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if not isinstance(value, Policy):
        raise ConfigTypeError(
            field_name(inst, attribute), value, "must be a resilient.Policy"
        )


@final
@attrs.frozen(kw_only=True)
class SimulationConfig:
    """
    One simulation: the fleet, the dependency, the policy and the run.

    Validated at construction: a bad value raises
    `~resilient.ConfigError` (or `~resilient.ConfigTypeError`) naming
    ``SimulationConfig.<field>`` and the value.
    Durations are seconds (a `datetime.timedelta` is accepted too).

    Args:
        clients: How many clients; each makes one call.
        outage: Seconds from the start during which every request fails.
        capacity: Requests per second the dependency serves once it is back;
            the excess fails.
        burst: How many requests it serves at once (the token bucket's
            size); None for a tenth of a second's worth of *capacity*, at
            least 1.
        service_time: Seconds a successful request takes; failures are
            instant.
        spread: Seconds over which the clients start their calls.
        rate: New calls per second on top of the clients' burst, arriving
            at random (a Poisson process) from 0 until *rate_until*; 0 for
            none. A retry budget is a share of the traffic, so it needs
            traffic to share.
        rate_until: Seconds; when the steady arrivals stop.
        policy: The retry policy every client follows (`make_policy`),
            with the circuit breaker and the retry budget the fleet
            shares, if any.
        duration: Seconds to run; None runs until every call has ended.
            Calls still going at the end count as unfinished.
        bucket: Seconds per bucket of the load chart.
        seed: Seed for the start times and the jitter.
    """

    clients: int = attrs.field(default=1000, validator=_count)
    outage: float = attrs.field(
        default=5.0, converter=to_seconds, validator=non_negative
    )
    capacity: float = attrs.field(
        default=500.0, converter=to_seconds, validator=positive
    )
    burst: float | None = attrs.field(
        default=None, converter=to_seconds, validator=_burst
    )
    service_time: float = attrs.field(
        default=0.02, converter=to_seconds, validator=non_negative
    )
    spread: float = attrs.field(
        default=0.1, converter=to_seconds, validator=non_negative
    )
    rate: float = attrs.field(
        default=0.0, converter=to_seconds, validator=non_negative
    )
    rate_until: float = attrs.field(
        default=20.0, converter=to_seconds, validator=positive
    )
    policy: Policy = attrs.field(factory=make_policy, validator=_policy)
    duration: float | None = attrs.field(
        default=None, converter=to_seconds, validator=positive_or_none
    )
    bucket: float = attrs.field(
        default=0.5, converter=to_seconds, validator=positive
    )
    seed: int = attrs.field(default=0, validator=_seed)

    @property
    def tokens(self) -> float:
        """The token bucket's size: *burst*, or its default."""
        if self.burst is not None:
            return self.burst
        return max(1.0, self.capacity / 10)

    def command(self) -> str:
        """
        The ``python -m resilient simulate`` command line that runs this
        simulation.

        Raises:
            ValueError: The policy is not one the CLI can express (another
                backoff, other exceptions, a timeout, hooks...).
        """
        return shlex.join(
            ["python", "-m", "resilient", "simulate", *self.argv()]
        )

    def argv(self) -> list[str]:
        """The CLI's arguments for this simulation (see `command`)."""
        p = self.policy
        strategy = strategy_of(p.backoff)
        # The name changes nothing in a simulation; every other field must
        # be one the options set.
        if (
            strategy is None
            or (p.breaker is not None and not _cli_breaker(p.breaker))
            or attrs.evolve(p, name="simulated")
            != make_policy(
                strategy,
                base=_base_of(p.backoff),
                cap=getattr(p.backoff, "cap", 5.0),
                attempts=p.attempts,
                budget=p.budget,
                breaker=p.breaker,
                retry_budget=p.retry_budget,
            )
        ):
            raise ValueError(
                f"the CLI cannot express the policy {p!r}; "
                "build it with make_policy()"
            )
        args = [
            f"--clients={self.clients}",
            f"--outage={self.outage!r}",
            f"--capacity={self.capacity!r}",
            f"--service-time={self.service_time!r}",
            f"--spread={self.spread!r}",
            f"--strategy={strategy}",
            f"--base={_base_of(p.backoff)!r}",
        ]
        if strategy != "constant":
            args.append(f"--cap={p.backoff.cap!r}")  # type: ignore[attr-defined]
        args += [
            f"--attempts={_none(p.attempts)}",
            f"--budget={_none(p.budget)}",
            f"--bucket={self.bucket!r}",
            f"--seed={self.seed}",
        ]
        if self.burst is not None:
            args.append(f"--burst={self.burst!r}")
        if self.duration is not None:
            args.append(f"--duration={self.duration!r}")
        if self.rate:
            args += [
                f"--rate={self.rate!r}",
                f"--rate-until={self.rate_until!r}",
            ]
        b = p.breaker
        if b is not None:
            args += [
                "--breaker",
                f"--breaker-failure-rate={b.failure_rate!r}",
                f"--breaker-minimum-calls={b.minimum_calls}",
                f"--breaker-window={b.window.seconds!r}",  # type: ignore[union-attr]
                f"--breaker-open-interval={b.open_interval!r}",
                f"--breaker-probes={b.half_open_probes}",
            ]
        r = p.retry_budget
        if r is not None:
            args += [
                "--retry-budget",
                f"--retry-budget-ratio={r.ratio!r}",
                f"--retry-budget-min={r.min_per_second!r}",
                f"--retry-budget-window={r.window!r}",
            ]
        return args


def _base_of(backoff: Backoff) -> float:
    if isinstance(backoff, Constant):
        return backoff.seconds
    return float(getattr(backoff, "base", 0.2))


def _none(value: float | None) -> str:
    return "none" if value is None else repr(value)


@final
@attrs.frozen
class CallOutcome:
    """
    How one client's call ended.

    Attributes:
        client: The client's number, from 0.
        start: When the call started, in seconds.
        end: When it ended (success or give-up); None if it was still going
            when the run stopped.
        attempts: Attempts made, the first one included.
        ok: Whether it succeeded.
        reason: Why it gave up (a `GiveUpReason`, or ``"unfinished"``);
            None on success.
    """

    client: int
    start: float
    end: float | None
    attempts: int
    ok: bool
    reason: str | None

    @property
    def latency(self) -> float | None:
        """Seconds from start to end; None if unfinished."""
        return None if self.end is None else self.end - self.start


@final
@attrs.frozen(kw_only=True)
class Summary:
    """
    The figures ``python -m resilient simulate`` prints.

    Attributes:
        calls: Calls made (one per client).
        succeeded: Calls that succeeded.
        success_rate: *succeeded* / *calls*.
        give_ups: ``(reason, count)`` pairs, most frequent first; a call
            still going when the run stopped counts as ``"unfinished"``.
        attempts: Requests that reached the dependency.
        refused: Attempts the circuit breaker rejected: they were never
            sent. (A retry the retry budget refuses is not an attempt: the
            call gives up for ``retry_budget``.)
        amplification: *attempts* / *calls*: how much work the retries
            multiplied the traffic by.
        peak: The most requests in one bucket, and when that bucket starts.
        peak_after_outage: The same, over the buckets that start once the
            outage is over (None if there are none).
        during_outage: Requests that reached the dependency during the
            outage.
        latency: p50, p90, p99 and max of the successful calls' latency,
            in seconds (None if none succeeded).
        last_attempt: When the last request reached the dependency.
        drain: Seconds from the end of the outage to the last request, or
            0.0 if every call had ended by then.
        recovery: Seconds from the end of the outage to the last request
            refused for overload (0.0 if none was): after it, the
            dependency served everything it was sent.
        breaker_opened: How often the breaker opened (None without one).
        breaker_closed: When the breaker closed for the last time, if it
            had opened and ended the run closed; else None.
        budget_retries: Retries the retry budget allowed (None without
            one).
        budget_refused: Retries it refused (None without one).
        budget_calls: Calls the retry budget counted, one per call (None
            without one).
    """

    calls: int
    succeeded: int
    success_rate: float
    give_ups: tuple[tuple[str, int], ...]
    attempts: int
    refused: int
    amplification: float
    peak: tuple[int, float]
    peak_after_outage: tuple[int, float] | None
    during_outage: int
    latency: tuple[float, float, float, float] | None
    last_attempt: float
    drain: float
    recovery: float
    breaker_opened: int | None = None
    breaker_closed: float | None = None
    budget_retries: int | None = None
    budget_refused: int | None = None
    budget_calls: int | None = None


@final
@attrs.frozen(kw_only=True)
class SimulationResult:
    """
    What a simulation measured.

    Attributes:
        config: The simulation's configuration.
        load: Requests that reached the dependency, per bucket of
            ``config.bucket`` seconds from 0.
        served: How many of those it served, per bucket.
        calls: The outcome of each client's call, by client number.
        overload_end: When the last request was refused for overload, or
            None if none was.
        end: When the run stopped, in seconds.
        summary: The figures the CLI prints.
        transitions: The circuit breaker's state changes, in order (its
            ``at`` is the simulated time); empty without a breaker.
    """

    config: SimulationConfig
    load: tuple[int, ...]
    served: tuple[int, ...]
    calls: tuple[CallOutcome, ...]
    overload_end: float | None
    end: float
    summary: Summary
    transitions: tuple[BreakerTransition, ...] = ()

    @property
    def times(self) -> tuple[float, ...]:
        """The start of each bucket, in seconds."""
        return tuple(i * self.config.bucket for i in range(len(self.load)))

    @property
    def failed(self) -> tuple[int, ...]:
        """Requests the dependency failed, per bucket."""
        return tuple(
            n - s for n, s in zip(self.load, self.served, strict=True)
        )

    @property
    def breaker_states(self) -> str | None:
        """
        The breaker's state per bucket of the load chart, one letter each;
        None without a breaker.

        ``H`` if the breaker was half-open at any moment of the bucket
        (it let probes through), else ``O`` if it was open at any moment,
        else ``C`` (closed throughout).
        """
        if self.config.policy.breaker is None:
            return None
        width = self.config.bucket
        letters: list[str] = []
        state = "C"
        pending = list(self.transitions)
        pending.reverse()
        for i in range(len(self.load)):
            seen = {state}
            end = (i + 1) * width
            while pending and pending[-1].at < end:
                state = _LETTER[pending.pop().new]
                seen.add(state)
            letters.append("H" if "H" in seen else "O" if "O" in seen else "C")
        return "".join(letters)

    def breaker_timeline(self) -> list[tuple[float, BreakerState]]:
        """
        The breaker's state from the start to the end of the run, as
        ``(time, state)`` steps; empty without a breaker.
        """
        if self.config.policy.breaker is None:
            return []
        steps = [(0.0, BreakerState.CLOSED)]
        steps += [(t.at, t.new) for t in self.transitions]
        steps.append((max(self.end, steps[-1][0]), steps[-1][1]))
        return steps


_LETTER: Final = {
    BreakerState.CLOSED: "C",
    BreakerState.OPEN: "O",
    BreakerState.HALF_OPEN: "H",
    BreakerState.FORCED_OPEN: "O",
}


class _DownError(ConnectionError):
    """The dependency is down (the outage)."""


class _OverloadedError(ConnectionError):
    """The dependency refused a request beyond its capacity."""


_DOWN: Final = _DownError("simulated outage")
_OVERLOADED: Final = _OverloadedError("simulated overload")


@final
class _VirtualClock:
    """The simulation's time, read by every client's `RetryMachine`."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        raise RuntimeError("the simulator's clock never sleeps")

    async def asleep(self, seconds: float) -> None:
        raise RuntimeError("the simulator's clock never sleeps")


@final
class _Dependency:
    """Down until *outage*; then a token bucket of *capacity* per second."""

    __slots__ = (
        "capacity",
        "last",
        "outage",
        "overload_end",
        "size",
        "tokens",
    )

    def __init__(self, config: SimulationConfig) -> None:
        self.outage = config.outage
        self.capacity = config.capacity
        self.size = config.tokens
        self.tokens = self.size
        self.last = config.outage
        self.overload_end: float | None = None

    def serve(self, now: float) -> ConnectionError | None:
        """None if the request arriving at *now* is served, else the error."""
        if now < self.outage:
            return _DOWN
        self.tokens = min(
            self.size, self.tokens + (now - self.last) * self.capacity
        )
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        self.overload_end = now
        return _OVERLOADED


class _Guard(Protocol):
    """
    What a client asks before each attempt and tells after it: the seam for
    the circuit breaker and the retry budget the whole fleet shares.
    """

    def begin(self, now: float) -> None:
        """A call starts: its first attempt is about to be made."""

    def admit(self, now: float, client: _Client) -> Exception | None:
        """None to send *client*'s attempt; else the exception the client
        sees instead (the request is not sent)."""

    def record(
        self, now: float, client: _Client, error: Exception | None
    ) -> None:
        """The dependency answered *client*'s attempt: *error*, or None."""


@final
class _FleetGuard:
    """
    The breaker and the retry budget of the policy, shared by every client
    as they are shared by every caller in a process. Either may be absent.

    The breaker is the library's pure `_BreakerMachine`, given the
    simulated time; a rejection is the `CircuitOpen` the breaker's shell
    raises. The retry budget is the library's `RetryBudget`: it reads the
    process's clock, which `simulate` points at the simulation's, and the
    clients' `RetryMachine`s ask it before every retry.
    """

    __slots__ = ("breaker", "budget", "transitions")

    def __init__(self, policy: Policy) -> None:
        self.breaker = (
            None
            if policy.breaker is None
            else _BreakerMachine(policy.breaker, policy.name)
        )
        self.budget = (
            None
            if policy.retry_budget is None
            else RetryBudget(policy.name, policy.retry_budget)
        )
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


def _guard(config: SimulationConfig) -> _Guard:
    """The guard the whole fleet shares for *config*."""
    return _FleetGuard(config.policy)


_ATTEMPT: Final = 0
_SERVED: Final = 1
_MAX_ATTEMPTS_PER_CLIENT: Final = 100_000


@final
class _Client:
    """One client's call: when it started, its machine, how it ended."""

    __slots__ = ("begun", "machine", "number", "outcome", "permit", "start")

    def __init__(self, number: int, start: float, machine: RetryMachine):
        self.begun = False
        """Whether the call was counted once with the retry budget (its
        first try; a breaker's rejection does not advance the attempt
        number, so that cannot tell)."""
        self.number = number
        self.start = start
        self.machine = machine
        self.outcome: CallOutcome | None = None
        self.permit: BreakerPermit | None = None
        """The breaker's permit for the attempt in flight, if any."""

    def end(self, now: float | None, reason: str | None) -> None:
        self.outcome = CallOutcome(
            self.number,
            self.start,
            now,
            self.machine.attempt,
            ok=reason is None,
            reason=reason,
        )


@final
class _Run:
    """The event loop of one simulation and what it counts."""

    def __init__(self, config: SimulationConfig, clock: _VirtualClock):
        self.config = config
        self.clock = clock
        self.dependency = _Dependency(config)
        self.guard = _guard(config)
        self.queue: list[tuple[float, int, int, _Client]] = []
        self.seq = 0
        self.load: list[int] = []
        self.served: list[int] = []
        self.last = 0.0
        self.refused = 0
        self.during_outage = 0
        # Separate streams, so that changing the policy keeps start times
        # and adding steady traffic keeps the burst's.
        starts = random.Random(f"{config.seed}:starts")
        jitter = random.Random(f"{config.seed}:jitter")
        times = [
            starts.uniform(0.0, config.spread) for _ in range(config.clients)
        ]
        if config.rate > 0:
            arrivals = random.Random(f"{config.seed}:arrivals")
            at = arrivals.expovariate(config.rate)
            while at < config.rate_until:
                times.append(at)
                at += arrivals.expovariate(config.rate)
        guard = self.guard
        budget = guard.budget if isinstance(guard, _FleetGuard) else None
        self.left = _MAX_ATTEMPTS_PER_CLIENT * len(times)
        self.clients: list[_Client] = []
        for number, at in enumerate(times):
            machine = RetryMachine(
                config.policy, clock, jitter, at, retry_budget=budget
            )
            client = _Client(number, at, machine)
            self.clients.append(client)
            self.push(at, _ATTEMPT, client)

    def push(self, at: float, kind: int, client: _Client) -> None:
        heapq.heappush(self.queue, (at, self.seq, kind, client))
        self.seq += 1

    def run(self) -> None:
        stop = self.config.duration
        stop = math.inf if stop is None else stop
        queue = self.queue
        while queue and queue[0][0] < stop:
            now, _, kind, client = heapq.heappop(queue)
            self.clock.t = now
            if kind == _ATTEMPT:
                self.attempt(now, client)
            else:
                self.guard.record(now, client, None)
                client.end(now, None)

    def attempt(self, now: float, client: _Client) -> None:
        """One attempt of *client*'s call, and what its machine decides."""
        self.left -= 1
        if self.left < 0:
            raise RuntimeError(
                "simulate(): the clients retry without end; give the policy "
                "a backoff that waits, or fewer attempts"
            )
        machine = client.machine
        if not client.begun:
            client.begun = True
            self.guard.begin(now)
        error = self.guard.admit(now, client)
        if error is None:
            error = self.send(now)
            if error is None:
                self.push(now + self.config.service_time, _SERVED, client)
                return
            self.guard.record(now, client, error)
        else:
            self.refused += 1
        step = machine.on_error(error)
        if isinstance(step, GiveUp):
            client.end(now, step.reason)
        else:
            self.push(now + step.delay, _ATTEMPT, client)

    def send(self, now: float) -> ConnectionError | None:
        """A request reaches the dependency at *now*: count it, serve it."""
        index = int(now // self.config.bucket)
        if index >= len(self.load):
            grow = [0] * (index + 1 - len(self.load))
            self.load += grow
            self.served += grow
        self.load[index] += 1
        self.last = now
        if now < self.config.outage:
            self.during_outage += 1
        error = self.dependency.serve(now)
        if error is None:
            self.served[index] += 1
        return error

    def result(self) -> SimulationResult:
        config = self.config
        load, served = self.load, self.served
        end = self.clock.t
        if config.duration is not None:
            end = config.duration
            size = max(1, math.ceil(config.duration / config.bucket - 1e-9))
            load = (load + [0] * size)[:size]
            served = (served + [0] * size)[:size]
        for client in self.clients:
            if client.outcome is None:
                client.end(None, "unfinished")
        calls = tuple(c.outcome for c in self.clients if c.outcome)
        overload_end = self.dependency.overload_end
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
            overload_end,
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
            overload_end=overload_end,
            end=end,
            summary=figures,
            transitions=transitions,
        )


_CLOSED: Final = BreakerState.CLOSED


def simulate(config: SimulationConfig | None = None) -> SimulationResult:
    """
    Run *config* in virtual time and measure it.

    Deterministic for a given configuration (seed included). Note that
    `resilient.testing.set_testing` applies here as everywhere: while it is
    on, the clients do not wait between attempts.

    While it runs, the process's clock (`resilient.testing.use_clock`) is
    the simulation's, so that the retry budget's window moves in simulated
    time; the previous clock is put back when it returns or raises. Do not
    run it while other threads of the process use resilient for real.

    Args:
        config: What to simulate; None for the defaults.

    Raises:
        RuntimeError: The clients made more than 100,000 attempts each on
            average (a policy that retries without waiting or end).
    """
    clock = _VirtualClock()
    previous = _clock.set_clock(clock)
    try:
        run = _Run(config if config is not None else SimulationConfig(), clock)
        run.run()
        return run.result()
    finally:
        _clock.set_clock(previous)


def percentile(ordered: Sequence[float], p: float) -> float:
    """
    The *p*-th percentile (0 < p <= 100) of sorted data, by nearest rank:
    a value that occurred, not an interpolation.
    """
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _summarize(
    config: SimulationConfig,
    load: Sequence[int],
    calls: Sequence[CallOutcome],
    last_attempt: float,
    overload_end: float | None,
    *,
    refused: int,
    during_outage: int,
) -> Summary:
    width = config.bucket
    ok = sorted(c.end - c.start for c in calls if c.ok and c.end is not None)
    reasons = Counter(c.reason for c in calls if not c.ok)
    attempts = sum(load)
    peak = max(range(len(load)), key=load.__getitem__, default=0)
    after = [i for i in range(len(load)) if i * width >= config.outage - 1e-9]
    peak_after = max(after, key=load.__getitem__, default=None)
    return Summary(
        calls=len(calls),
        succeeded=len(ok),
        success_rate=len(ok) / len(calls),
        give_ups=tuple(
            sorted(
                ((str(r), n) for r, n in reasons.items()),
                key=lambda rn: (-rn[1], rn[0]),
            )
        ),
        attempts=attempts,
        refused=refused,
        amplification=attempts / len(calls),
        peak=(load[peak] if load else 0, peak * width),
        peak_after_outage=(
            None
            if peak_after is None
            else (load[peak_after], peak_after * width)
        ),
        during_outage=during_outage,
        latency=(
            None
            if not ok
            else (
                percentile(ok, 50),
                percentile(ok, 90),
                percentile(ok, 99),
                ok[-1],
            )
        ),
        last_attempt=last_attempt,
        drain=max(0.0, last_attempt - config.outage),
        recovery=(
            0.0 if overload_end is None else overload_end - config.outage
        ),
    )


def _describe_policy(policy: Policy) -> str:
    attempts = (
        "no attempt limit"
        if policy.attempts is None
        else f"{policy.attempts} attempts"
    )
    budget = (
        "no budget" if policy.budget is None else f"{policy.budget:g} s budget"
    )
    return f"{policy.backoff!r}, {attempts}, {budget}"


def _describe_guards(policy: Policy) -> str:
    """The breaker and the retry budget, in a few words; '' for neither."""
    parts: list[str] = []
    b = policy.breaker
    if b is not None:
        window = (
            f"{b.window.seconds:g} s"
            if isinstance(b.window, TimeWindow)
            else f"{b.window.size} calls"
        )
        parts.append(
            f"breaker (opens at {b.failure_rate:.0%} of >= "
            f"{b.minimum_calls} calls in {window}, open "
            f"{b.open_interval:g} s, {b.half_open_probes} probes)"
        )
    r = policy.retry_budget
    if r is not None:
        parts.append(
            f"retry budget ({r.ratio:g} per call + {r.min_per_second:g}/s "
            f"over {r.window:g} s)"
        )
    return ", ".join(parts)


def short_label(config: SimulationConfig) -> str:
    """A short name for *config*'s guards: plain, + breaker, + budget..."""
    p = config.policy
    parts = [strategy_of(p.backoff) or type(p.backoff).__name__]
    if p.retry_budget is not None:
        parts.append("retry budget")
    if p.breaker is not None:
        parts.append("breaker")
    return " + ".join(parts)


def render_header(result: SimulationResult) -> str:
    """One line saying what was simulated."""
    c = result.config
    traffic = (
        f" + {c.rate:g} calls/s until {c.rate_until:g} s" if c.rate else ""
    )
    guards = _describe_guards(c.policy)
    return (
        f"{c.clients} clients{traffic}, {c.outage:g} s outage, capacity "
        f"{c.capacity:g}/s (burst {c.tokens:g}), {_describe_policy(c.policy)}"
        f"{', ' + guards if guards else ''}, seed {c.seed}"
    )


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def render_summary(result: SimulationResult) -> str:
    """
    The figures: success rate, give-ups, amplification, peak load, latency
    percentiles, drain and recovery times. The notebooks print this too.
    """
    s = result.summary
    c = result.config
    per_bucket = c.capacity * c.bucket
    rows: list[tuple[str, str]] = [
        ("calls", f"{s.calls}"),
        ("succeeded", f"{s.succeeded} ({s.success_rate:.1%})"),
    ]
    reasons = ", ".join(f"{r.replace('_', ' ')} {n}" for r, n in s.give_ups)
    gave_up = s.calls - s.succeeded
    rows.append(("gave up", f"{gave_up} ({reasons})" if reasons else "0"))
    rows.append(
        ("attempts", f"{s.attempts} (amplification {s.amplification:.2f}x)")
    )
    if c.policy.breaker is not None or s.refused:
        rows.append(("breaker rejected", f"{s.refused} attempts (not sent)"))
    if s.budget_retries is not None:
        rows.append(
            (
                "retry budget",
                (
                    f"allowed {s.budget_retries} retries, "
                    f"refused {s.budget_refused}"
                ),
            )
        )
    n, at = s.peak
    rows.append(("peak load", f"{n} per {c.bucket:g} s at {at:g} s"))
    if s.peak_after_outage is not None:
        n, at = s.peak_after_outage
        rows.append(
            (
                "peak after outage",
                (
                    f"{n} per {c.bucket:g} s at {at:g} s "
                    f"({n / per_bucket:.1f}x capacity)"
                ),
            )
        )
    rows.append(
        (
            "during outage",
            (
                f"{s.during_outage} requests "
                f"({s.during_outage / c.outage if c.outage else 0:.1f}/s)"
            ),
        )
    )
    if s.latency is None:
        rows.append(("latency (ok)", "none succeeded"))
    else:
        p50, p90, p99, top = s.latency
        rows.append(
            (
                "latency (ok)",
                f"p50 {_s(p50)}, p90 {_s(p90)}, p99 {_s(p99)}, max {_s(top)}",
            )
        )
    rows.append(
        (
            "drain",
            (
                f"{_s(s.drain)} after the outage "
                f"(last attempt at {_s(s.last_attempt)})"
            ),
        )
    )
    rows.append(
        (
            "overload ended",
            f"{_s(s.recovery)} after the outage"
            if result.overload_end is not None
            else "never overloaded",
        )
    )
    states = result.breaker_states
    if states is not None:
        rows += _breaker_rows(result, states)
    return "\n".join(f"{k:<18} {v}" for k, v in rows)


def _breaker_rows(
    result: SimulationResult, states: str
) -> list[tuple[str, str]]:
    s = result.summary
    c = result.config
    opened = s.breaker_opened or 0
    if s.breaker_closed is not None:
        closed = (
            f"closed at {_s(s.breaker_closed)} "
            f"({_s(s.breaker_closed - c.outage)} after the outage)"
        )
    elif opened:
        closed = "still open at the end"
    else:
        closed = "never opened"
    times = "time" if opened == 1 else "times"
    rows = [("breaker", f"opened {opened} {times}, {closed}")]
    # The states, ten buckets to a group and six groups to a line.
    groups = [states[i : i + 10] for i in range(0, len(states), 10)]
    lines = [" ".join(groups[i : i + 6]) for i in range(0, len(groups), 6)]
    lines = lines or [""]
    rows.append(
        (
            "breaker states",
            f"per {c.bucket:g} s: C closed, O open, H half-open",
        )
    )
    rows += [("", line) for line in lines]
    return rows


_UNICODE: Final = ("\u2588", "\u2591", "\u2502", "\u00bb")
_ASCII: Final = ("#", "x", "|", ">")


def render_chart(
    result: SimulationResult, *, width: int = 50, ascii_only: bool = False
) -> str:
    """
    The load on the dependency over time as a text chart.

    One row per bucket: a bar of the requests that arrived in it (served
    then failed), a mark at the dependency's capacity, the count, and
    ``outage`` on the buckets during the outage.
    The scale fits the busiest bucket after the outage (or a quarter more
    than the capacity, if larger): that is where policies differ.
    Longer bars, as during the outage, are cut and end in ``\u00bb``
    (``>`` in ASCII).

    Args:
        result: What to chart.
        width: Characters for the longest bar.
        ascii_only: Draw with ``#``, ``x``, ``|`` and ``>`` only.
    """
    c = result.config
    ok_char, fail_char, cap_char, cut_char = _ASCII if ascii_only else _UNICODE
    per_bucket = c.capacity * c.bucket
    after = result.summary.peak_after_outage
    busiest = after[0] if after is not None else result.summary.peak[0]
    # The capacity sits at four fifths of the width when nothing is busier
    # after the outage, so that overloads show past it.
    scale = width / max(busiest, per_bucket * 1.25)
    cap_col = round(per_bucket * scale)
    decimals = _decimals(c.bucket)
    label = max(len(f"{t:.{decimals}f}") for t in (0.0, result.end))
    digits = len(str(max(result.load, default=0)))
    title = (
        f"Load on the dependency: requests per {c.bucket:g} s "
        f"({ok_char} served, {fail_char} failed, {cap_char} capacity "
        f"{per_bucket:g})"
    )
    lines = [title]
    states = result.breaker_states
    if states is not None:
        lines[0] += "; breaker: C closed, O open, H half-open"
    for i, (n, ok) in enumerate(zip(result.load, result.served, strict=True)):
        t = i * c.bucket
        good = round(ok * scale)
        bad = round(n * scale) - good
        if n and not good + bad:
            # Never hide a bucket that had requests: one cell of the kind
            # that made most of them.
            good, bad = (1, 0) if 2 * ok >= n else (0, 1)
        cells = [ok_char] * good + [fail_char] * bad
        if len(cells) > width:
            cells[width - 1 :] = [cut_char]
        cells += [" "] * (width - len(cells))
        # The capacity mark takes a column of its own, so a bar that
        # passes it shows beyond it.
        cells.insert(cap_col, cap_char)
        note = "  outage" if t < c.outage else ""
        state = "" if states is None else states[i] + " "
        lines.append(
            f"{t:>{label}.{decimals}f} s {state}{''.join(cells)} "
            f"{n:>{digits}}{note}".rstrip()
        )
    return "\n".join(lines)


def _decimals(seconds: float) -> int:
    text = f"{seconds:g}"
    return 0 if "." not in text else min(3, len(text.split(".")[1]))


def render_text(result: SimulationResult, *, ascii_only: bool = False) -> str:
    """What ``python -m resilient simulate`` prints: header, chart, figures."""
    return "\n\n".join(
        (
            render_header(result),
            render_chart(result, ascii_only=ascii_only),
            render_summary(result),
        )
    )


def require_plotting() -> None:
    """
    Check that matplotlib can be imported.

    Raises:
        ImportError: It cannot, with how to install it.
    """
    try:
        import matplotlib.figure  # noqa: F401, PLC0415
    except ImportError as exc:
        raise ImportError(
            "plotting needs matplotlib, which is not installed: "
            "pip install 'resilient[plot]'"
        ) from exc


def _figure() -> Any:
    """A matplotlib `Figure` (no pyplot, so no GUI backend is touched)."""
    require_plotting()
    from matplotlib.figure import Figure  # noqa: PLC0415

    return Figure(figsize=(10, 4), layout="tight")


def plot_load(
    result: SimulationResult, ax: Any, *, label: str | None = None
) -> None:
    """
    Draw *result*'s load per bucket on the matplotlib axes *ax*: served and
    failed requests stacked, the outage shaded, the capacity as a line.
    """
    c = result.config
    times = result.times
    ax.bar(
        times,
        result.served,
        width=c.bucket,
        align="edge",
        color="tab:green",
        label="served",
    )
    ax.bar(
        times,
        result.failed,
        width=c.bucket,
        align="edge",
        bottom=result.served,
        color="tab:red",
        label="failed",
    )
    ax.axvspan(0, c.outage, color="grey", alpha=0.2, label="outage")
    ax.axhline(
        c.capacity * c.bucket, color="black", linestyle="--", label="capacity"
    )
    ax.set_title(label or _describe_policy(c.policy))
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"requests per {c.bucket:g} s")


_LEVEL: Final = {
    BreakerState.CLOSED: 0,
    BreakerState.HALF_OPEN: 1,
    BreakerState.OPEN: 2,
    BreakerState.FORCED_OPEN: 2,
}


def plot_breaker(
    result: SimulationResult, ax: Any, *, label: str | None = None
) -> None:
    """
    Draw *result*'s circuit breaker state over time on the matplotlib axes
    *ax*, as a step line over closed / half-open / open, with the outage
    shaded. Draws nothing but the shading without a breaker.

    A half-open spell whose probe failed at once lasts no time: it shows as
    a spike from open to half-open and back.
    """
    c = result.config
    ax.axvspan(0, c.outage, color="grey", alpha=0.2)
    steps = result.breaker_timeline()
    if steps:
        ax.step(
            [t for t, _ in steps],
            [_LEVEL[state] for _, state in steps],
            where="post",
            color="tab:purple",
            label=label,
        )
    ax.set_yticks([0, 1, 2], ["closed", "half-open", "open"])
    ax.set_ylim(-0.3, 2.3)
    ax.set_xlabel("time (s)")


def save_plot(result: SimulationResult, path: str) -> None:
    """
    Write *result*'s load chart to the PNG file *path*, with the breaker's
    state under it when there is a breaker.

    Raises:
        ImportError: matplotlib is missing (``pip install
            'resilient[plot]'``).
    """
    fig = _figure()
    if result.config.policy.breaker is None:
        ax = fig.subplots()
        plot_load(result, ax)
    else:
        fig.set_size_inches(10, 5.5)
        ax, state = fig.subplots(
            2, 1, sharex=True, height_ratios=(3, 1), squeeze=True
        )
        plot_load(result, ax)
        plot_breaker(result, state)
        state.set_ylabel("breaker")
    ax.legend(loc="upper right")
    fig.savefig(path, dpi=100)
