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
``[0, spread)``. `SimulationResult` holds the load per time bucket, the
outcome of every call and a `Summary` of the figures a user tuning a policy
wants. `render_text` is what ``python -m resilient simulate`` prints.

The names here are documented but private: the CLI, the tests and the
notebooks use them.
"""

from __future__ import annotations

import heapq
import math
import random
import shlex
from collections import Counter
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import attrs

from resilient._core._backoff import (
    Constant,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
)
from resilient._core._decisions import GiveUp
from resilient._core._policy import Policy
from resilient._core._validate import (
    check_int,
    check_number,
    field_name,
    non_negative,
    positive,
    to_seconds,
)
from resilient._retry import RetryMachine
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

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
        ConfigError: An unknown *strategy*, or a bad *base* or *cap* (named
            after the strategy's class, like ``FullJitter.cap``).
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


def make_policy(
    strategy: str = "full",
    *,
    base: float = 0.2,
    cap: float = 5.0,
    attempts: int | None = DEFAULT_ATTEMPTS,
    budget: float | None = DEFAULT_BUDGET,
) -> Policy:
    """
    The policy the simulated clients follow, from the CLI's options.

    It retries `ConnectionError` (what the simulated dependency raises) and
    reads no server hints, since the dependency sends none.

    Raises:
        ConfigError: A bad value, named after the field that refused it.
    """
    return Policy(
        name="simulated",
        attempts=attempts,
        backoff=backoff_for(strategy, base=base, cap=cap),
        budget=budget,
        retry_after=None,
    )


def _count(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_int(inst, attribute, value)


def _seed(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_int(inst, attribute, value, minimum=0)


def _positive_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, strict=True, allow_none=True)


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

    Validated at construction: a bad value raises `ConfigError` (or
    `ConfigTypeError`) naming ``SimulationConfig.<field>`` and the value.
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
        policy: The retry policy every client follows (`make_policy`).
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
    policy: Policy = attrs.field(factory=make_policy, validator=_policy)
    duration: float | None = attrs.field(
        default=None, converter=to_seconds, validator=_positive_or_none
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
        if strategy is None or attrs.evolve(
            p, name="simulated"
        ) != make_policy(
            strategy,
            base=_base_of(p.backoff),
            cap=getattr(p.backoff, "cap", 5.0),
            attempts=p.attempts,
            budget=p.budget,
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
        refused: Attempts refused before they were sent (by a breaker or a
            retry budget); 0 until those are simulated.
        amplification: *attempts* / *calls*: how much work the retries
            multiplied the traffic by.
        peak: The most requests in one bucket, and when that bucket starts.
        peak_after_outage: The same, over the buckets that start once the
            outage is over (None if there are none).
        latency: p50, p90, p99 and max of the successful calls' latency,
            in seconds (None if none succeeded).
        last_attempt: When the last request reached the dependency.
        drain: Seconds from the end of the outage to the last request, or
            0.0 if every call had ended by then.
        recovery: Seconds from the end of the outage to the last request
            refused for overload (0.0 if none was): after it, the
            dependency served everything it was sent.
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
    latency: tuple[float, float, float, float] | None
    last_attempt: float
    drain: float
    recovery: float


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
    """

    config: SimulationConfig
    load: tuple[int, ...]
    served: tuple[int, ...]
    calls: tuple[CallOutcome, ...]
    overload_end: float | None
    end: float
    summary: Summary

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
    a circuit breaker and a retry budget shared by the whole fleet.
    """

    def admit(self, now: float, attempt: int) -> Exception | None:
        """None to send attempt number *attempt*; else the exception the
        client sees instead (the request is not sent)."""

    def record(
        self, now: float, attempt: int, error: Exception | None
    ) -> None:
        """The dependency answered attempt *attempt*: *error*, or None."""


@final
class _Unguarded:
    """No breaker, no retry budget: every attempt is sent."""

    __slots__ = ()

    def admit(self, now: float, attempt: int) -> Exception | None:
        return None

    def record(
        self, now: float, attempt: int, error: Exception | None
    ) -> None:
        return None


def _guard(config: SimulationConfig) -> _Guard:  # noqa: ARG001
    """
    The guard the whole fleet shares for *config*: none yet. A breaker and
    a retry budget (issue 3) plug in here.
    """
    return _Unguarded()


_ATTEMPT: Final = 0
_SERVED: Final = 1
_MAX_ATTEMPTS_PER_CLIENT: Final = 100_000


@final
class _Client:
    """One client's call: when it started, its machine, how it ended."""

    __slots__ = ("machine", "number", "outcome", "start")

    def __init__(self, number: int, start: float, machine: RetryMachine):
        self.number = number
        self.start = start
        self.machine = machine
        self.outcome: CallOutcome | None = None

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

    def __init__(self, config: SimulationConfig) -> None:
        self.config = config
        self.clock = _VirtualClock()
        self.dependency = _Dependency(config)
        self.guard = _guard(config)
        self.queue: list[tuple[float, int, int, _Client]] = []
        self.seq = 0
        self.load: list[int] = []
        self.served: list[int] = []
        self.last = 0.0
        self.refused = 0
        self.left = _MAX_ATTEMPTS_PER_CLIENT * config.clients
        # Separate streams, so that changing the policy keeps start times.
        starts = random.Random(f"{config.seed}:starts")
        jitter = random.Random(f"{config.seed}:jitter")
        self.clients: list[_Client] = []
        for number in range(config.clients):
            at = starts.uniform(0.0, config.spread)
            machine = RetryMachine(config.policy, self.clock, jitter, at)
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
                self.guard.record(now, client.machine.attempt, None)
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
        error = self.guard.admit(now, machine.attempt)
        if error is None:
            error = self.send(now)
            if error is None:
                self.push(now + self.config.service_time, _SERVED, client)
                return
            self.guard.record(now, machine.attempt, error)
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
        return SimulationResult(
            config=config,
            load=tuple(load),
            served=tuple(served),
            calls=calls,
            overload_end=overload_end,
            end=end,
            summary=_summarize(
                config,
                load,
                calls,
                self.last,
                overload_end,
                refused=self.refused,
            ),
        )


def simulate(config: SimulationConfig | None = None) -> SimulationResult:
    """
    Run *config* in virtual time and measure it.

    Deterministic for a given configuration (seed included). Note that
    `resilient.testing.set_testing` applies here as everywhere: while it is
    on, the clients do not wait between attempts.

    Args:
        config: What to simulate; None for the defaults.

    Raises:
        RuntimeError: The clients made more than 100,000 attempts each on
            average (a policy that retries without waiting or end).
    """
    run = _Run(config if config is not None else SimulationConfig())
    run.run()
    return run.result()


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


def render_header(result: SimulationResult) -> str:
    """One line saying what was simulated."""
    c = result.config
    return (
        f"{c.clients} clients, {c.outage:g} s outage, capacity "
        f"{c.capacity:g}/s (burst {c.tokens:g}), {_describe_policy(c.policy)}"
        f", seed {c.seed}"
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
    if s.refused:
        rows.append(("refused locally", f"{s.refused}"))
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
    return "\n".join(f"{k:<18} {v}" for k, v in rows)


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
        lines.append(
            f"{t:>{label}.{decimals}f} s {''.join(cells)} "
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


def save_plot(result: SimulationResult, path: str) -> None:
    """
    Write *result*'s load chart to the PNG file *path*.

    Raises:
        ImportError: matplotlib is missing (``pip install
            'resilient[plot]'``).
    """
    fig = _figure()
    ax = fig.subplots()
    plot_load(result, ax)
    ax.legend(loc="upper right")
    fig.savefig(path, dpi=100)
