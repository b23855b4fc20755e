"""
The outage without a guard, each call's attempts in a row (`_outage`),
against the same runs in time order through the calendar.

A breaker that can never open (it needs a billion calls) makes the run
take its general loop: every attempt an event, in time order, as before
the outage ran in a row. Without jitter nothing is drawn, and the two runs
must agree exactly, call for call; with jitter only the order of the
draws differs, and the figures must agree in distribution.
"""

from __future__ import annotations

import statistics
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilient
from resilient import simulation as sim
from resilient._retry import RetryMachine
from resilient._simulate import _calendar, _engine


_NEVER_OPENS = sim.make_breaker(minimum_calls=10**9)

_RUNS: dict[str, dict[str, Any]] = {
    "burst": {},
    "steady-cut-in-outage": {"rate": 300, "duration": 4.0},
    "odd-buckets": {
        "outage": 4.5,
        "bucket": 0.3,
        "duration": 4.0003,
        "clients": 300,
    },
    "overload": {"rate": 2000, "rate_until": 3, "capacity": 1500},
    "no-outage": {"outage": 0.0, "rate": 500, "rate_until": 1},
}


def _in_time_order(config: sim.SimulationConfig) -> sim.SimulationResult:
    """*config* run through its general loop: the same policy with a
    breaker that never opens."""
    policy = attrs.evolve(config.policy, breaker=_NEVER_OPENS)
    return sim.simulate(attrs.evolve(config, policy=policy))


def _outcome(result: sim.SimulationResult) -> tuple[object, ...]:
    """Everything a run measured but the breaker's own figures."""
    s = attrs.asdict(result.summary)
    del s["breaker_opened"]
    return (
        result.load,
        result.served,
        result.calls,
        result.end,
        result.overload_end,
        s,
    )


@pytest.mark.parametrize("run", sorted(_RUNS))
@pytest.mark.parametrize("strategy", ["exponential", "constant"])
def test_without_jitter_it_is_the_time_ordered_run(
    strategy: str, run: str
) -> None:
    """
    With nothing drawn, the outage in a row gives every call the same
    attempts, end and reason, the same charts, the same end of the run
    and the same figures as the time-ordered run. (The end of the run is
    a regression check: before, a run without a guard ended at its last
    attempt even when a request it served before that ended later.)
    """
    config = sim.SimulationConfig(
        policy=sim.make_policy(strategy), **_RUNS[run]
    )
    assert _outcome(sim.simulate(config)) == _outcome(_in_time_order(config))


@pytest.mark.parametrize(
    "policy",
    [
        # Reads hints: the machine's general decision, the clock set.
        resilient.Policy(
            name="hints", attempts=6, backoff=resilient.Constant(seconds=0.7)
        ),
        # Does not retry the dependency's ConnectionError at all.
        resilient.Policy(
            name="other",
            retry_on=(ValueError,),
            backoff=resilient.Constant(seconds=0.7),
        ),
        # Runs out of its 2 s budget inside the outage.
        resilient.Policy(
            name="budget",
            attempts=None,
            budget=2.0,
            backoff=resilient.Exponential(base=0.1, cap=1.0),
        ),
    ],
    ids=lambda p: p.name,
)
def test_every_kind_of_decision_matches_the_time_ordered_run(
    policy: resilient.Policy,
) -> None:
    """
    A policy that reads hints (the machine's `decide_error`, not its
    `decide_transient`), one that does not retry the outage's error, and
    one whose budget runs out in the outage all run the outage in a row
    exactly as in time order.
    """
    config = sim.SimulationConfig(policy=policy, clients=200, rate=100)
    assert _outcome(sim.simulate(config)) == _outcome(_in_time_order(config))


@pytest.mark.parametrize("strategy", ["full", "decorrelated"])
def test_with_jitter_the_figures_agree_in_distribution(strategy: str) -> None:
    """
    With jitter only the order of the draws changed: over 20 seeds, the
    mean successes, attempts, attempts during the outage and median
    latency of the two engines differ by less than three standard errors
    of their difference (seeded: the same verdict on every run).
    """
    figures: dict[str, list[list[float]]] = {}
    for seed in range(20):
        config = sim.SimulationConfig(
            policy=sim.make_policy(strategy),
            seed=seed,
            clients=400,
            rate=300,
            rate_until=3.0,
        )
        for engine, result in enumerate(
            (sim.simulate(config), _in_time_order(config))
        ):
            s = result.summary
            p50 = s.latency[0] if s.latency is not None else 0.0
            row = (s.succeeded, s.attempts, s.during_outage, p50)
            for name, value in zip(
                ("succeeded", "attempts", "during outage", "p50"),
                row,
                strict=True,
            ):
                figures.setdefault(name, [[], []])[engine].append(float(value))
    for name, (chained, ordered) in figures.items():
        gap = abs(statistics.mean(chained) - statistics.mean(ordered))
        error = (
            (statistics.variance(chained) + statistics.variance(ordered)) / 20
        ) ** 0.5
        assert gap < 3 * error + 1e-9, (name, gap, error)
        assert chained != ordered, name  # The draws did move.


def test_a_call_that_gives_up_in_the_outage_keeps_no_machine() -> None:
    """
    Every call gives up within the outage (2 attempts): the run keeps
    their attempt counts, no machine, and its calendar never held them.
    """
    config = sim.SimulationConfig(
        policy=sim.make_policy(attempts=2), clients=500, duration=None
    )
    run = _engine._Run(config, _engine._VirtualClock())
    assert not any(run.calendar.occupied)  # Every call starts in the outage.
    run.run()
    assert all(type(m) is int for m in run.machines)
    assert not any(isinstance(m, RetryMachine) for m in run.machines)
    assert run.during_outage == 1000 == sum(run.load)
    assert set(run.reasons) == {"attempts"}


def test_the_calendar_skips_the_times_before_its_cut() -> None:
    """`_Calendar(times, after)` holds the calls at or after *after* only,
    by their numbers."""
    times = [0.5, 7.0, 4.999, 5.0, 12.25]
    calendar = _calendar._Calendar(times, 5.0)
    events = []
    while (slot := calendar.next_slot()) is not None:
        events += slot
    assert events == [(5.0, 3), (7.0, 1), (12.25, 4)]


def test_a_retry_that_never_waits_is_stopped_in_the_outage() -> None:
    """A policy retrying without waiting, with no attempt limit and a
    budget that virtual time never reaches, is stopped as endless while
    its calls are still in the outage."""
    policy = resilient.Policy(
        attempts=None, budget=1.0, backoff=resilient.Constant(seconds=0)
    )
    run = _engine._Run(
        sim.SimulationConfig(clients=3, policy=policy),
        _engine._VirtualClock(),
    )
    with pytest.raises(RuntimeError, match="retry without end"):
        run.run()
    assert sum(run.load) > 100_000


@settings(max_examples=40, deadline=None)
@given(
    strategy=st.sampled_from(["exponential", "constant"]),
    base=st.sampled_from([0.0004, 0.05, 0.3, 1.0]),
    attempts=st.one_of(st.none(), st.integers(1, 12)),
    budget=st.sampled_from([None, 0.5, 3.0, 30.0]),
    clients=st.integers(1, 60),
    outage=st.sampled_from([0.0, 0.0005, 0.7, 2.0, 5.0]),
    spread=st.sampled_from([0.0001, 0.1, 3.0]),
    rate=st.sampled_from([0.0, 40.0]),
    capacity=st.sampled_from([5.0, 500.0]),
    duration=st.sampled_from([None, 0.3, 1.7, 4.0003]),
    bucket=st.sampled_from([0.001, 0.3, 0.5]),
    seed=st.integers(0, 3),
)
def test_any_run_without_jitter_is_the_time_ordered_run(
    strategy: str,
    base: float,
    attempts: int | None,
    budget: float | None,
    clients: int,
    outage: float,
    spread: float,
    rate: float,
    capacity: float,
    duration: float | None,
    bucket: float,
    seed: int,
) -> None:
    """
    For any small fleet, outage, traffic, duration and chart, and any
    attempt limit and budget (none included), a policy without jitter runs
    the outage in a row exactly as in time order, call for call: waits
    under a calendar slot, a run cut inside the outage, an outage shorter
    than a slot and none at all included.
    """
    if attempts is None and budget is None:
        return  # A policy with no end is refused.
    config = sim.SimulationConfig(
        policy=sim.make_policy(
            strategy,
            base=base,
            cap=max(base, 2.0),
            attempts=attempts,
            budget=budget,
        ),
        clients=clients,
        outage=outage,
        spread=spread,
        rate=rate,
        rate_until=2.5,
        capacity=capacity,
        duration=duration,
        bucket=bucket,
        seed=seed,
    )
    assert _outcome(sim.simulate(config)) == _outcome(_in_time_order(config))
