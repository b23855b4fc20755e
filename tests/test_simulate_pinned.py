"""
The simulator's output pinned for a few small seeded runs: a change to the
engine's speed must leave every figure, every call's outcome and the
printed text the same for the same seed.

The pinned values of the runs with a guard ("breaker-steady",
"budget-steady", "both-steady") and of those that draw nothing
("constant-duration") were produced by the engine before its batch rework
(commit 929285e, run from a copy of that commit's tree). The others were
pinned again when the outage without a guard came to run each call's
attempts in a row (`resilient._simulate._outage`): their jitter is drawn
in another order (tests/test_simulate_outage.py checks the distribution),
and "exponential", which draws nothing, changed only in the run's end (a
request served before the last attempt, ending after it, ends the run).
The text of "both-steady" was pinned again when the diagnosis stopped
telling to raise the retry budget's ratio in a run whose load overran the
capacity (it tells to lower it there): only that line changed.
The digests cover every call (number, start, end, attempts, outcome,
reason), the load and served charts, the breaker's transitions, and the
text ``python -m resilient simulate`` prints.
"""

from __future__ import annotations

import hashlib

import pytest

import resilient
from resilient import simulation as sim


def _configs() -> dict[str, sim.SimulationConfig]:
    mp, mb = sim.make_policy, sim.make_breaker
    rb = resilient.RetryBudgetConfig
    return {
        "full": sim.SimulationConfig(),
        "exponential": sim.SimulationConfig(
            policy=mp("exponential"), bucket=1.0
        ),
        "decorrelated-seed-3": sim.SimulationConfig(
            policy=mp("decorrelated"), seed=3, clients=400
        ),
        "constant-duration": sim.SimulationConfig(
            policy=mp("constant"), rate=300, duration=4.0
        ),
        "breaker-steady": sim.SimulationConfig(
            policy=mp(breaker=mb()), rate=200
        ),
        "budget-steady": sim.SimulationConfig(
            policy=mp(retry_budget=rb()), rate=200
        ),
        "both-steady": sim.SimulationConfig(
            policy=mp(breaker=mb(), retry_budget=rb()), rate=200, seed=7
        ),
        "rate-capacity": sim.SimulationConfig(
            rate=20000, rate_until=0.5, capacity=20000
        ),
        # Buckets that end inside calendar slots, and a run stopped inside
        # the outage and inside a slot.
        "odd-buckets": sim.SimulationConfig(
            policy=mp("equal"),
            clients=300,
            outage=4.5,
            bucket=0.3,
            duration=4.0003,
        ),
    }


# name: (succeeded, attempts, refused, during_outage, peak, calls and
# charts digest, text digest)
_PINNED: dict[str, tuple[int, int, int, int, tuple[int, float], str, str]] = {
    "full": (
        995,
        7483,
        0,
        6488,
        (3089, 0.0),
        "9c5ede3ce98895a7",
        "2193b2d81384b5ac",
    ),
    "exponential": (
        467,
        9035,
        0,
        5000,
        (3000, 0.0),
        "d5bbd524a99e2743",
        "5512c0c3d2f69707",
    ),
    "decorrelated-seed-3": (
        386,
        2690,
        0,
        2304,
        (651, 0.0),
        "3374af69c219b138",
        "a296c24f090486a7",
    ),
    "constant-duration": (
        0,
        19339,
        0,
        19339,
        (4044, 1.0),
        "c59774279e09fba6",
        "2fb698fe0dd396fc",
    ),
    "breaker-steady": (
        4935,
        8883,
        8897,
        9,
        (669, 12.0),
        "10f10368e51c0656",
        "8729367b1cf57b2d",
    ),
    "budget-steady": (
        2932,
        5436,
        0,
        2504,
        (1425, 0.0),
        "bf56fedb3f350b32",
        "9c1bbbaebee09ac9",
    ),
    "both-steady": (
        4390,
        5707,
        5338,
        9,
        (572, 6.5),
        "3f5cc0165802ac7b",
        "06f6043c8ca002b3",
    ),
    "rate-capacity": (
        10733,
        79315,
        0,
        68582,
        (25261, 0.0),
        "1a75f42c45f20aac",
        "8fd2c861825486b2",
    ),
    "odd-buckets": (
        0,
        1531,
        0,
        1531,
        (600, 0.0),
        "c852122886ca0045",
        "164556d3c2c20b5f",
    ),
}


def _digest(result: sim.SimulationResult) -> str:
    h = hashlib.sha256()
    for c in result.calls:
        call = (c.client, c.start, c.end, c.attempts, c.ok, c.reason)
        h.update(repr(call).encode())
    charts = (result.load, result.served, result.overload_end, result.end)
    h.update(repr(charts).encode())
    steps = [(t.at, t.old, t.new) for t in result.transitions]
    h.update(repr(steps).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(_PINNED))
def test_a_seeded_run_gives_the_pinned_output(name: str) -> None:
    """
    The run *name* gives exactly the pinned headline figures, the pinned
    outcome of every call, and the pinned text, draw for draw.
    """
    result = sim.simulate(_configs()[name])
    s = result.summary
    text = hashlib.sha256(sim.render_text(result).encode()).hexdigest()
    assert (
        s.succeeded,
        s.attempts,
        s.refused,
        s.during_outage,
        s.peak,
        _digest(result),
        text[:16],
    ) == _PINNED[name]
