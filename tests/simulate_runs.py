"""
Shared runs of the simulator's tests: small helpers and module-scoped runs
(imported as fixtures by each tests/test_simulate_*.py).
"""

from __future__ import annotations

from typing import Any

import pytest

import resilient
from resilient import simulation as sim


def run(strategy: str = "full", **changes: object) -> sim.SimulationResult:
    """Simulate the default fleet with *strategy* and *changes*."""
    policy_keys = {"base", "cap", "attempts", "budget"}
    policy = {k: changes.pop(k) for k in list(changes) if k in policy_keys}
    config = sim.SimulationConfig(
        policy=sim.make_policy(strategy, **policy),  # type: ignore[arg-type]
        **changes,  # type: ignore[arg-type]
    )
    return sim.simulate(config)


@pytest.fixture(scope="session")
def full() -> sim.SimulationResult:
    """1,000 clients, a 5 s outage, full jitter."""
    return run("full")


@pytest.fixture(scope="session")
def none() -> sim.SimulationResult:
    """1,000 clients, a 5 s outage, exponential backoff without jitter."""
    return run("exponential")


def guarded(
    *, breaker: bool = False, retry_budget: bool = False, **changes: Any
) -> sim.SimulationResult:
    """
    Simulate the default fleet (full jitter) with the simulator's default
    breaker and/or the library's default retry budget, and *changes*.
    """
    policy = sim.make_policy(
        breaker=sim.make_breaker() if breaker else None,
        retry_budget=resilient.RetryBudgetConfig() if retry_budget else None,
    )
    return sim.simulate(sim.SimulationConfig(policy=policy, **changes))


@pytest.fixture(scope="session")
def budgeted() -> sim.SimulationResult:
    """The default fleet and outage, with the default retry budget."""
    return guarded(retry_budget=True)


@pytest.fixture(scope="session")
def broken() -> sim.SimulationResult:
    """The default fleet and outage, with the simulator's breaker."""
    return guarded(breaker=True)


@pytest.fixture(scope="session")
def steady() -> dict[str, sim.SimulationResult]:
    """
    The default fleet plus 200 new calls a second for 20 s: plain, with a
    retry budget, with a breaker, and with both.
    """
    return {
        "plain": guarded(rate=200.0),
        "budget": guarded(retry_budget=True, rate=200.0),
        "breaker": guarded(breaker=True, rate=200.0),
        "both": guarded(breaker=True, retry_budget=True, rate=200.0),
    }


def outage_buckets(result: sim.SimulationResult) -> int:
    """How many of the chart's buckets lie wholly within the outage."""
    return int(result.config.outage / result.config.bucket + 1e-9)
