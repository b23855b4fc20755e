"""
The simulator's drawings, with matplotlib (the ``plot`` extra): the load
per bucket and the breaker's state over time.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, Final

from resilient import BreakerState
from resilient._simulate._render import _describe_policy, render_header


if TYPE_CHECKING:
    from resilient._simulate._result import SimulationResult


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

    return Figure(figsize=(10, 4.5), layout="tight")


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


def plot_title(result: SimulationResult) -> str:
    """
    The PNG's title: what was simulated (`render_header`), then the
    headline figures, so that a drawing shown alone still says both.
    """
    s = result.summary
    c = result.config
    figures = [
        f"{s.success_rate:.1%} succeeded",
        f"amplification {s.amplification:.2f}x",
    ]
    if s.peak_after_outage is not None:
        n, at = s.peak_after_outage
        figures.append(
            f"peak after outage {n / (c.capacity * c.bucket):.1f}x capacity "
            f"at {at:g} s"
        )
    figures.append(f"drain {s.drain:.2f} s")
    header = textwrap.fill(render_header(result), width=_TITLE_WIDTH)
    return f"{header}\n{', '.join(figures)}"


_TITLE_WIDTH: Final = 120


def _draw(result: SimulationResult) -> Any:
    """*result*'s figure: the load, and the breaker's state under it."""
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
    fig.suptitle(plot_title(result), fontsize="small")
    return fig


def save_plot(result: SimulationResult, path: str) -> None:
    """
    Write *result*'s load chart to the PNG file *path*, with the breaker's
    state under it when there is a breaker, and the configuration and the
    headline figures in the title (`plot_title`).

    Raises:
        ImportError: matplotlib is missing (``pip install
            'resilient[plot]'``).
    """
    _draw(result).savefig(path, dpi=100)
