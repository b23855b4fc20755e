"""
The simulator tests' shared runs, as session-scoped fixtures (a run's
result is frozen): each tests/test_simulate_*.py names this module in its
``pytest_plugins``.
"""

from __future__ import annotations

import pytest

from resilient import simulation as sim
from tests.simulate_runs import guarded, run


@pytest.fixture(scope="session")
def full() -> sim.SimulationResult:
    """1,000 clients, a 5 s outage, full jitter."""
    return run("full")


@pytest.fixture(scope="session")
def none() -> sim.SimulationResult:
    """1,000 clients, a 5 s outage, exponential backoff without jitter."""
    return run("exponential")


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
