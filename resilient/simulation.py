"""
The retry simulator, for notebooks and scripts.

``python -m resilient simulate`` is its command line. `simulate` runs the
library's own backoff, `RetryMachine`, circuit breaker and retry budget for
a fleet of clients in virtual time, against a dependency that is down for a
while and then serves a limited number of requests per second::

    from resilient.simulation import SimulationConfig, make_policy, simulate

    result = simulate(SimulationConfig(policy=make_policy("full")))
    print(render_text(result))

It is not imported by ``import resilient``: import it by name.

.. versionadded:: 26.11.0
"""

from __future__ import annotations

import contextlib

from resilient._simulate._config import (
    STRATEGIES,
    SimulationConfig,
    backoff_for,
    make_breaker,
    make_policy,
)
from resilient._simulate._engine import simulate
from resilient._simulate._plot import plot_breaker, plot_load, save_plot
from resilient._simulate._render import (
    render_chart,
    render_diagnosis,
    render_summary,
    render_text,
    short_label,
)
from resilient._simulate._result import (
    CallOutcome,
    Calls,
    SimulationResult,
    Summary,
)


# Plain `sorted()` order, which tests/test_public_api.py checks; ruff's
# isort-style order would put the constant first.
__all__ = [  # noqa: RUF022
    "CallOutcome",
    "Calls",
    "STRATEGIES",
    "SimulationConfig",
    "SimulationResult",
    "Summary",
    "backoff_for",
    "make_breaker",
    "make_policy",
    "plot_breaker",
    "plot_load",
    "render_chart",
    "render_diagnosis",
    "render_summary",
    "render_text",
    "save_plot",
    "short_label",
    "simulate",
]


def _fix_module_names() -> None:
    """Show public paths (``resilient.simulation.simulate``) in reprs."""
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("resilient._"):
            with contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = __name__


_fix_module_names()
