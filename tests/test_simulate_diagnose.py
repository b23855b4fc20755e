"""
What the simulator's figures say to change (`resilient._simulate._diagnose`):
each line comes from the run's own figures and a threshold, and the policy's
differences from the library's defaults are said.
"""

from __future__ import annotations

import re

import pytest

import resilient
from resilient import simulation as sim
from resilient._simulate import _diagnose, _render
from tests.simulate_runs import guarded, run


pytest_plugins = ["tests.simulate_fixtures"]


def early_share(result: sim.SimulationResult) -> float:
    """The share of calls that ran out of attempts or budget in the outage."""
    c = result.config
    early = [
        call
        for call in result.calls
        if call.reason in {"attempts", "budget"}
        and call.end is not None
        and call.end < c.outage
    ]
    return len(early) / len(result.calls)


class TestGaveUpBeforeTheDependencyCameBack:
    def test_the_librarys_four_attempts_against_a_5_s_outage(self) -> None:
        """
        With the library's own 4 attempts every call gives up inside a 5 s
        outage; the diagnosis says so and names the option to raise, and
        nothing else (the policy is the library's: no note on defaults).
        """
        result = run("full", clients=200, attempts=4)
        assert result.summary.success_rate == 0
        assert _diagnose.diagnose(result) == (
            (
                "every call gave up before the dependency came back at 5 s: "
                "raise --attempts (now 4) so that the retries outlast the "
                "outage"
            ),
        )
        assert _diagnose.differences(result.config.policy) == ()

    def test_a_budget_spent_in_the_outage_names_the_budget(self) -> None:
        """
        Calls that run out of budget (not attempts) during the outage are
        told to raise the budget.
        """
        result = run(
            "constant", clients=50, base=1.0, attempts=None, budget=3.0
        )
        (line,) = _diagnose.diagnose(result)
        assert line.startswith("every call gave up before the dependency")
        assert "raise --budget (now 3 s)" in line
        assert "--attempts" not in line

    def test_the_threshold_is_the_share_of_calls(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """
        The line appears when the share of calls that gave up early is above
        `EARLY_GIVE_UPS`, not at it; it counts them ("N of M calls").
        """
        result = run("full", clients=200, attempts=6)
        share = early_share(result)
        assert 0 < share < 1
        monkeypatch.setattr(_diagnose, "EARLY_GIVE_UPS", share)
        assert not any(
            "before the dependency" in line
            for line in _diagnose.diagnose(result)
        )
        monkeypatch.setattr(_diagnose, "EARLY_GIVE_UPS", share - 0.001)
        (line,) = [
            line
            for line in _diagnose.diagnose(result)
            if "before the dependency" in line
        ]
        n = round(share * 200)
        assert line.startswith(f"{n} of 200 calls ({share:.0%}) gave up")


class TestOverload:
    def test_without_jitter_every_remedy_is_named(
        self, none: sim.SimulationResult
    ) -> None:
        """
        Retries without jitter overload the dependency after the outage
        (4.0x in a 0.5 s bucket): the line gives the multiple and when, then
        jitter, a retry budget and a breaker, the three things the run
        lacks.
        """
        lines = _diagnose.diagnose(none)
        (line,) = [x for x in lines if "the load after the outage" in x]
        assert "reached 4.0x the capacity (at 6 s)" in line
        for fix in ("--strategy full", "--retry-budget", "--breaker"):
            assert fix in line

    def test_with_every_guard_what_is_left_is_the_ratio(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        With jitter, a breaker and a retry budget and still 2.2x the
        capacity, the line offers what is left: a lower ratio or more
        capacity.
        """
        (line,) = [
            x
            for x in _diagnose.diagnose(steady["both"])
            if "the load after the outage" in x
        ]
        assert "2.2x" in line
        assert "lower --retry-budget-ratio" in line
        assert "--strategy" not in line

    def test_within_capacity_nothing_is_said(
        self,
        full: sim.SimulationResult,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """
        Full jitter's busiest bucket after the outage is 0.7x the capacity:
        nothing about the load, and with 99.5 % succeeded, nothing to
        change; at a threshold of 0.6x the line appears.
        """
        assert _diagnose.diagnose(full) == (
            (
                "nothing to change: 99.5% of the calls succeeded and the load "
                "after the outage stayed within the capacity"
            ),
        )
        monkeypatch.setattr(_diagnose, "OVERLOAD", 0.6)
        assert "0.7x" in _diagnose.diagnose(full)[0]


class TestBreakerAndBudget:
    def test_a_breaker_open_at_the_end(self) -> None:
        """
        A run stopped while the breaker is open says so, with the time and
        the open interval to shorten.
        """
        result = guarded(breaker=True, clients=200, duration=2.0)
        assert result.breaker_states is not None
        assert result.breaker_states.endswith("O")
        assert (
            "the breaker was still open at the end of the run (2.00 s): "
            "shorten --breaker-open-interval (now 1 s)"
        ) in _diagnose.diagnose(result)

    def test_calls_lost_outwaiting_the_breaker(self) -> None:
        """
        A breaker open for longer than the calls' budget makes them give up
        waiting for it (``breaker_open``): the line counts them and names
        the open interval and the budget.
        """
        breaker = sim.make_breaker(open_interval=40.0)
        config = sim.SimulationConfig(
            clients=100, policy=sim.make_policy(breaker=breaker)
        )
        result = sim.simulate(config)
        waited = sum(c.reason == "breaker_open" for c in result.calls)
        assert waited > 0.05 * 100
        (line,) = [
            x
            for x in _diagnose.diagnose(result)
            if "waiting for the breaker" in x
        ]
        assert line.startswith(f"{waited} of 100 calls")
        assert "--breaker-open-interval (now 40 s) or raise --budget" in line

    def test_calls_the_retry_budget_failed_fast(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        The retry budget alone under steady traffic fails 2,003 of 4,935
        calls fast; the line says so and names its two knobs.
        """
        (line,) = [
            x
            for x in _diagnose.diagnose(steady["budget"])
            if "retry budget" in x
        ]
        assert line.startswith(
            "the retry budget failed 2003 of 4935 calls (41%) fast"
        )
        assert "--retry-budget-ratio (now 0.2)" in line


class TestDefaults:
    def test_the_simulators_policy_differs_in_its_attempts(self) -> None:
        """
        The simulator's default policy makes 10 attempts, the library's 4;
        its breaker has a 10 s window and a 1 s open interval (60 s and
        30 s); a retry budget is compared field by field.
        """
        assert _diagnose.differences(sim.make_policy()) == (
            "10 attempts (library: 4)",
        )
        policy = sim.make_policy(
            "exponential",
            attempts=None,
            budget=60.0,
            breaker=sim.make_breaker(half_open_probes=2),
            retry_budget=resilient.RetryBudgetConfig(ratio=0.5),
        )
        assert _diagnose.differences(policy) == (
            "no attempt limit (library: 4)",
            "a 60 s budget (library: 30 s)",
            (
                "Exponential(base=0.2, cap=5.0) (library: "
                "FullJitter(base=0.2, cap=5.0))"
            ),
            "breaker window 10 s (library: 60 s)",
            "breaker open interval 1 s (library: 30 s)",
            "breaker half open probes 2 (library: 3)",
            "retry budget ratio 0.5 (library: 0.2)",
        )
        assert _diagnose.differences(resilient.Policy()) == ()

    def test_the_text_says_what_to_change_and_what_differs(
        self, none: sim.SimulationResult
    ) -> None:
        """
        The last section of the output is the diagnosis, then the
        differences, in the figures' two columns, wrapped to 79 columns.
        """
        text = sim.render_text(none).split("\n\n")[-1]
        assert text == _render.render_diagnosis(none)
        lines = text.splitlines()
        assert lines[0].startswith("what to change     the load after")
        assert any(
            x.startswith("not the defaults   this run's policy differs")
            for x in lines
        )
        assert all(len(x) <= 79 for x in lines)
        assert all(x[:19].strip() or x.startswith(" " * 19) for x in lines)


_DIRECTION = {"raise": "up", "lower": "down", "shorten": "down"}


def knob_directions(lines: tuple[str, ...]) -> dict[str, set[str]]:
    """
    Each option a diagnosis tells to raise or lower, with the directions it
    is told: a verb applies to the options after it in its line.
    """
    told: dict[str, set[str]] = {}
    for line in lines:
        verb = None
        for word, flag in re.findall(
            r"\b(raise|lower|shorten)\b|(--[a-z][a-z-]*)", line
        ):
            if word:
                verb = _DIRECTION[word]
            elif verb is not None:
                told.setdefault(flag, set()).add(verb)
    return told


class TestOneDecisionPerKnob:
    def test_the_ratio_is_not_both_raised_and_lowered(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        With a breaker and a retry budget under steady traffic the load
        still reaches 2.2x the capacity while the budget fails 12 % of the
        calls fast: the diagnosis used to say both "lower
        --retry-budget-ratio" and "raise --retry-budget-ratio". Now the
        overload decides (lower), and the budget's line states what it did
        without telling to raise it.
        """
        lines = _diagnose.diagnose(steady["both"])
        assert knob_directions(lines)["--retry-budget-ratio"] == {"down"}
        (budget,) = [x for x in lines if x.startswith("the retry budget")]
        assert "shedding load the dependency could not take" in budget
        assert "raise" not in budget

    def test_no_run_tells_a_knob_both_ways(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """Across runs with and without guards, load and outage, every
        option a diagnosis names goes one way only."""
        results = [
            *steady.values(),
            guarded(breaker=True, retry_budget=True, rate=300.0),
            guarded(retry_budget=True, clients=3000, capacity=100.0),
            guarded(breaker=True, clients=200, duration=2.0),
            run("exponential", clients=500),
            run("full", clients=200, attempts=4),
        ]
        for result in results:
            told = knob_directions(_diagnose.diagnose(result))
            assert all(len(ways) == 1 for ways in told.values()), told
