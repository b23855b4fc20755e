"""
What a simulation is: the fleet, the dependency, the policy and the run.

`SimulationConfig` and the helpers that build the policy and the breaker the
command line's options describe (`make_policy`, `make_breaker`,
`backoff_for`). The options themselves are in `resilient._simulate._cli`.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from resilient import (
    BreakerConfig,
    Constant,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    Policy,
    TimeWindow,
)
from resilient._core._keywords import settings_checked
from resilient._core._validate import (
    check_int,
    check_number,
    field_name,
    non_negative,
    positive,
    positive_or_none,
    to_seconds,
)
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient import RetryBudgetConfig
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


def _to_number(value: object) -> Any:
    """
    An int as a float, for a count or a rate; anything else as it is, for
    the validator to judge (a `datetime.timedelta` is not a rate).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return to_seconds(value)
    return value


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
@settings_checked
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
        default=500.0, converter=_to_number, validator=positive
    )
    burst: float | None = attrs.field(
        default=None, converter=_to_number, validator=_burst
    )
    service_time: float = attrs.field(
        default=0.02, converter=to_seconds, validator=non_negative
    )
    spread: float = attrs.field(
        default=0.1, converter=to_seconds, validator=non_negative
    )
    rate: float = attrs.field(
        default=0.0, converter=_to_number, validator=non_negative
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
        # The option table knows this class; this class only asks it.
        from resilient._simulate._cli import argv  # noqa: PLC0415

        return argv(self)
