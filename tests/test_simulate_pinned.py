"""
The simulator's output pinned for a few small seeded runs: a change to the
engine's speed must leave every figure, every call's outcome and the
printed text the same for the same seed.

The pinned values were produced by the engine before its batch rework
(commit 929285e, run from a copy of that commit's tree); the digests cover
every call (number, start, end, attempts, outcome, reason), the load and
served charts, the breaker's transitions, and the text
``python -m resilient simulate`` prints.
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
        998,
        7484,
        0,
        6486,
        (3060, 0.0),
        "33bf7c3861711b83",
        "28fad0fd2b7d3406",
    ),
    "exponential": (
        467,
        9035,
        0,
        5000,
        (3000, 0.0),
        "4ea114b986e1f63b",
        "5512c0c3d2f69707",
    ),
    "decorrelated-seed-3": (
        385,
        2692,
        0,
        2307,
        (657, 0.0),
        "9e89ee7c682a6a5d",
        "cb215c131d7cce9a",
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
        "69dde7bec74dd99e",
    ),
    "rate-capacity": (
        10736,
        79331,
        0,
        68595,
        (25336, 0.0),
        "1125dffd718119b8",
        "af8220c2cae335a9",
    ),
    "odd-buckets": (
        0,
        1536,
        0,
        1536,
        (600, 0.0),
        "6a68d3d1d8c49813",
        "4f66ee5ba035b5fa",
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
