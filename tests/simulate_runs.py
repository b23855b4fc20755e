"""
Shared runs of the simulator's tests: small helpers and module-scoped runs
(the fixtures are in tests/simulate_fixtures.py).
"""

from __future__ import annotations

from typing import Any

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


def outage_buckets(result: sim.SimulationResult) -> int:
    """How many of the chart's buckets lie wholly within the outage."""
    return int(result.config.outage / result.config.bucket + 1e-9)
