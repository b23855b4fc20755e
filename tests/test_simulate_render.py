"""
The simulator's text and drawings (`_render`, `_plot`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import resilient
from resilient import simulation as sim
from resilient._simulate import _plot, _render, _result
from tests.simulate_runs import guarded, run


pytest_plugins = ["tests.simulate_fixtures"]


class TestRendering:
    def test_text_has_every_section(self, none: sim.SimulationResult) -> None:
        """
        The text output has the header, the load chart with the outage
        marked and the capacity drawn, every figure, and what to change.
        """
        text = sim.render_text(none)
        header, chart, summary, diagnosis = text.split("\n\n")
        assert diagnosis.startswith("what to change ")
        assert header.startswith("1000 clients, 5 s outage, capacity 500/s")
        rows = chart.splitlines()[1:]
        assert len(rows) == len(none.load)
        assert sum("outage" in r for r in rows) == 10
        assert all("\u2502" in r for r in rows)
        for label in (
            "calls",
            "succeeded",
            "gave up",
            "attempts",
            "peak load",
            "peak after outage",
            "during outage",
            "latency (ok)",
            "drain",
            "overload ended",
        ):
            assert f"\n{label} " in f"\n{summary}"
        assert "(amplification 9.04x)" in summary
        assert "1000 per 0.5 s at 6 s (4.0x capacity)" in summary

    def test_chart_rows_show_the_counts(
        self, full: sim.SimulationResult
    ) -> None:
        """Each chart row ends with its bucket's request count."""
        rows = sim.render_chart(full).splitlines()[1:]
        counts = [
            int(r.split()[-2 if r.endswith("outage") else -1]) for r in rows
        ]
        assert counts == list(full.load)

    def test_ascii_only(self, full: sim.SimulationResult) -> None:
        """The ASCII chart uses no character outside ASCII."""
        text = sim.render_text(full, ascii_only=True)
        assert text.isascii()
        assert "#" in text
        assert "|" in text

    def test_a_small_bucket_is_never_hidden(self) -> None:
        """A bucket with a few requests still gets one cell of bar."""
        result = run("full", clients=1000, capacity=10_000.0)
        rows = sim.render_chart(result, width=10, ascii_only=True).splitlines()
        for row, n in zip(rows[1:], result.load, strict=True):
            bar = row.split(" s ", 1)[1]
            assert ("#" in bar or "x" in bar) == (n > 0)

    def test_the_scale_fits_the_load_after_the_outage(
        self, none: sim.SimulationResult
    ) -> None:
        """
        The chart is scaled to the busiest bucket after the outage: the
        bigger buckets of the outage are cut and end in a mark, and a wave
        above the capacity shows past the capacity mark.
        """
        rows = sim.render_chart(none, ascii_only=True).splitlines()[1:]
        first = rows[0]  # 2,000 requests, twice the wave after the outage.
        assert ">|" not in first
        assert "x> " in first
        wave = rows[12]  # 1,000 requests at 6 s, 4x the capacity.
        assert wave.startswith(" 6.0 s ")
        bar = wave.split(" s ", 1)[1]
        assert bar.index("|") < bar.rindex("x")
        assert ">" not in bar

    def test_no_success_no_overload(self) -> None:
        """Figures that do not apply say so instead of printing numbers."""
        result = run("full", clients=5, attempts=2, outage=30.0)
        text = sim.render_summary(result)
        assert "latency (ok)       none succeeded" in text
        assert "overload ended     never overloaded" in text
        assert result.summary.drain == 0.0

    def test_percentile_is_nearest_rank(self) -> None:
        """Percentiles pick a value that occurred, by nearest rank."""
        data = [1.0, 2.0, 3.0, 4.0]
        assert _result.percentile(data, 50) == 2.0
        assert _result.percentile(data, 90) == 4.0
        assert _result.percentile([5.0], 99) == 5.0


class TestGuardRendering:
    def test_text_shows_the_breaker_and_the_budget(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        With both guards, the header names them and the traffic, each chart
        row starts with the bucket's breaker state, and the figures add the
        rejections, the budget's refusals and the breaker's states.
        """
        result = steady["both"]
        header, chart, summary, _ = sim.render_text(result).split("\n\n")
        assert "+ 200 calls/s until 20 s" in header
        assert "breaker (opens at 50% of >= 5 calls in 10 s" in header
        assert "retry budget (0.2 per call + 10/s over 10 s)" in header
        states = result.breaker_states
        assert states is not None
        rows = chart.splitlines()
        assert "breaker: C closed, O open, H half-open" in rows[0]
        assert [r.split(" s ", 1)[1][0] for r in rows[1:]] == list(states)
        s = result.summary
        assert f"breaker rejected   {s.refused} attempts (not sent)" in summary
        assert (
            f"retry budget       allowed {s.budget_retries} retries, "
            f"refused {s.budget_refused}"
        ) in summary
        assert "breaker            opened " in summary
        lines = summary.split("breaker states", 1)[1].splitlines()[1:]
        assert all(line.startswith(" " * 19) for line in lines)
        assert "".join(line.replace(" ", "") for line in lines) == states
        assert len(lines) == math.ceil(len(states) / 60)

    def test_a_breaker_on_a_count_window_is_described(self) -> None:
        """The header describes a count window in calls."""
        policy = sim.make_policy(
            breaker=resilient.BreakerConfig(window=resilient.CountWindow(50))
        )
        result = sim.simulate(sim.SimulationConfig(clients=10, policy=policy))
        assert "in 50 calls" in _render.render_header(result)

    def test_short_labels(self) -> None:
        """A short name for each combination, for charts and tables."""
        labels = [
            sim.short_label(r.config)
            for r in (
                guarded(clients=1),
                guarded(clients=1, retry_budget=True),
                guarded(clients=1, breaker=True, retry_budget=True),
            )
        ]
        assert labels == [
            "full",
            "full + retry budget",
            "full + retry budget + breaker",
        ]
        custom = sim.SimulationConfig(
            policy=resilient.Policy(backoff=resilient.Custom(lambda r: 1.0))
        )
        assert sim.short_label(custom) == "Custom"

    def test_plot_with_a_breaker(
        self, broken: sim.SimulationResult, tmp_path: Path
    ) -> None:
        """
        With a breaker, the PNG has the breaker's state under the load;
        `plot_breaker` draws a step line over the three states, and nothing
        but the outage without a breaker.
        """
        pytest.importorskip("matplotlib")
        target = tmp_path / "breaker.png"
        sim.save_plot(broken, str(target))
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        from matplotlib.figure import Figure

        ax = Figure().subplots()
        sim.plot_breaker(broken, ax)
        (line,) = ax.get_lines()
        levels: Any = line.get_ydata()
        assert set(levels) == {0, 1, 2}
        ax = Figure().subplots()
        sim.plot_breaker(guarded(clients=1), ax)
        assert ax.get_lines() == []


class TestPlotTitle:
    def test_the_title_has_the_configuration_and_the_figures(
        self, none: sim.SimulationResult
    ) -> None:
        """
        The PNG's title says what was simulated (the header, wrapped) and
        the headline figures: success rate, amplification, the peak after
        the outage as a multiple of the capacity, and the drain.
        """
        title = _plot.plot_title(none)
        header, figures = title.rsplit("\n", 1)
        assert " ".join(header.split("\n")) == _render.render_header(none)
        assert figures == (
            "46.7% succeeded, amplification 9.04x, peak after outage 4.0x "
            "capacity at 6 s, drain 21.30 s"
        )

    def test_the_png_carries_the_title(
        self, broken: sim.SimulationResult
    ) -> None:
        """The drawn figure's title is `plot_title`, with or without a
        breaker."""
        pytest.importorskip("matplotlib")
        for result in (broken, guarded(clients=20)):
            fig = _plot._draw(result)
            assert fig.get_suptitle() == _plot.plot_title(result)

    def test_a_run_cut_before_the_outage_ends_has_no_peak_after_it(
        self,
    ) -> None:
        """
        A run stopped during the outage has no bucket after it: the title
        leaves that figure out.
        """
        result = guarded(clients=20, duration=2.0)
        assert result.summary.peak_after_outage is None
        title = _plot.plot_title(result)
        assert "peak after outage" not in title
        assert title.rsplit("\n", 1)[1] == (
            "0.0% succeeded, amplification 4.90x, drain 0.00 s"
        )


def test_a_run_with_the_librarys_policy_says_nothing_about_defaults() -> None:
    """
    With the library's own policy settings (4 attempts), the diagnosis has
    no ``not the defaults`` line.
    """
    result = run("full", clients=50, attempts=4)
    text = _render.render_diagnosis(result)
    assert text.startswith("what to change     every call gave up")
    assert "not the defaults" not in text
