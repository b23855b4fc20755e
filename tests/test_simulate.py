"""
The retry simulator (`resilient._simulate`) and its command line
(``python -m resilient simulate``).
"""

from __future__ import annotations

import datetime as dt
import io
import itertools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import resilient
from resilient import __main__ as cli
from resilient import _simulate as sim
from resilient.exceptions import ConfigError, ConfigTypeError


def run(strategy: str = "full", **changes: object) -> sim.SimulationResult:
    """Simulate the default fleet with *strategy* and *changes*."""
    policy_keys = {"base", "cap", "attempts", "budget"}
    policy = {k: changes.pop(k) for k in list(changes) if k in policy_keys}
    config = sim.SimulationConfig(
        policy=sim.make_policy(strategy, **policy),  # type: ignore[arg-type]
        **changes,  # type: ignore[arg-type]
    )
    return sim.simulate(config)


@pytest.fixture(scope="module")
def full() -> sim.SimulationResult:
    """1,000 clients, a 5 s outage, full jitter."""
    return run("full")


@pytest.fixture(scope="module")
def none() -> sim.SimulationResult:
    """1,000 clients, a 5 s outage, exponential backoff without jitter."""
    return run("exponential")


class TestTheIssueCriterion:
    def test_no_jitter_spikes_full_jitter_spreads(
        self, full: sim.SimulationResult, none: sim.SimulationResult
    ) -> None:
        """
        After a 5 s outage, 1,000 clients without jitter hit the dependency
        in one synchronised wave several times its capacity; with full
        jitter the busiest bucket is several times smaller and within it.
        """
        assert none.summary.peak_after_outage is not None
        assert full.summary.peak_after_outage is not None
        spike = none.summary.peak_after_outage[0]
        spread = full.summary.peak_after_outage[0]
        per_bucket = full.config.capacity * full.config.bucket
        assert spike >= 0.9 * full.config.clients
        assert spike > 3 * per_bucket
        assert spike >= 4 * spread
        assert spread <= per_bucket

    def test_jitter_succeeds_more_with_less_work(
        self, full: sim.SimulationResult, none: sim.SimulationResult
    ) -> None:
        """
        The synchronised waves keep failing for overload, so without jitter
        fewer calls succeed, with more attempts each, and the dependency
        stays overloaded and busy for longer after the outage.
        """
        f, n = full.summary, none.summary
        assert f.success_rate > 0.95
        assert n.success_rate < 0.6
        assert f.amplification < n.amplification
        assert f.drain < n.drain
        assert full.overload_end is None
        assert none.overload_end is not None
        assert n.recovery > 10.0

    def test_every_strategy_runs_fast_enough_to_tune_with(self) -> None:
        """
        Each strategy simulates the default 1,000-client fleet and gives
        every call an outcome (no real sleeping: the whole module's runs
        would take minutes otherwise).
        """
        for strategy in sim.STRATEGIES:
            result = run(strategy)
            assert len(result.calls) == 1000
            assert all(c.end is not None for c in result.calls)


class TestConsistency:
    @pytest.mark.parametrize("strategy", sim.STRATEGIES)
    def test_figures_agree_with_the_raw_data(self, strategy: str) -> None:
        """
        The summary is derived from the per-bucket load and the per-call
        outcomes: attempts, successes, give-ups, amplification and latency
        all agree with them.
        """
        # A constant 1 s wait outlasts the outage within 10 attempts.
        base = 1.0 if strategy == "constant" else 0.2
        result = run(strategy, clients=300, base=base)
        s = result.summary
        calls = result.calls
        assert s.calls == len(calls) == 300
        assert s.attempts == sum(result.load) == sum(c.attempts for c in calls)
        assert s.succeeded == sum(c.ok for c in calls) == sum(result.served)
        assert s.succeeded + sum(n for _, n in s.give_ups) == s.calls
        assert s.success_rate == s.succeeded / s.calls
        assert s.amplification == s.attempts / s.calls
        assert s.refused == 0
        latencies = sorted(c.end - c.start for c in calls if c.end and c.ok)
        assert s.latency is not None
        assert s.latency[3] == latencies[-1]
        assert s.latency[0] == sim.percentile(latencies, 50)
        assert s.latency[0] <= s.latency[1] <= s.latency[2] <= s.latency[3]
        assert max(c.attempts for c in calls) <= 10
        assert s.peak[0] == max(result.load)

    def test_the_outage_fails_everything(
        self, full: sim.SimulationResult
    ) -> None:
        """No request is served during the outage; all of them fail."""
        width = full.config.bucket
        for t, served in zip(full.times, full.served, strict=True):
            if t + width <= full.config.outage:
                assert served == 0

    @pytest.mark.parametrize("strategy", ["exponential", "constant"])
    def test_the_dependency_never_serves_past_its_capacity(
        self, strategy: str
    ) -> None:
        """
        After the outage, no bucket serves more than its share of the
        capacity plus the burst the token bucket holds.
        """
        result = run(strategy, base=0.5, capacity=100.0)
        limit = 100.0 * result.config.bucket + result.config.tokens
        assert max(result.served) <= limit
        assert max(result.load) > limit  # The excess was sent and failed.

    def test_same_seed_same_run_other_seed_other_run(self) -> None:
        """A seed makes a run repeatable; another seed changes it."""
        a = run("full", clients=200, seed=7)
        b = run("full", clients=200, seed=7)
        c = run("full", clients=200, seed=8)
        assert a == b
        assert a.load != c.load

    def test_start_times_do_not_depend_on_the_policy(self) -> None:
        """
        Clients start at the same times whatever the strategy, so two
        strategies are compared on the same fleet.
        """
        a = run("full", clients=50)
        b = run("exponential", clients=50)
        assert [c.start for c in a.calls] == [c.start for c in b.calls]
        assert all(0 <= c.start < 0.1 for c in a.calls)


class TestTheRealMachine:
    def test_one_client_follows_the_exponential_schedule(self) -> None:
        """
        One client without jitter retries after exactly 0.2, 0.4 and 0.8 s
        (the library's `Exponential`), and its fourth attempt, after a 1 s
        outage, succeeds after the service time.
        """
        result = run(
            "exponential", clients=1, spread=0.0, outage=1.0, bucket=0.1
        )
        (call,) = result.calls
        assert call.ok
        assert call.attempts == 4
        assert call.end == pytest.approx(0.2 + 0.4 + 0.8 + 0.02)
        arrivals = [
            t for t, n in zip(result.times, result.load, strict=True) if n
        ]
        assert arrivals == pytest.approx([0.0, 0.2, 0.6, 1.4])

    def test_jitter_draws_match_the_schedule(self) -> None:
        """
        A lone client's waits are the policy's backoff drawn from the
        simulation's jitter stream: each retry lands inside its full-jitter
        window.
        """
        result = run("full", clients=1, spread=0.0, outage=100.0, bucket=0.01)
        arrivals = [
            t for t, n in zip(result.times, result.load, strict=True) if n
        ]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert len(arrivals) == 10
        for retry, gap in enumerate(gaps):
            assert 0 <= gap <= min(5.0, 0.2 * 2**retry) + 0.01

    def test_attempts_run_out(self) -> None:
        """
        A policy of 3 attempts against a long outage gives up on every call
        for ``attempts``, after exactly 3 attempts each.
        """
        result = run("full", clients=100, attempts=3, outage=60.0)
        assert result.summary.give_ups == (("attempts", 100),)
        assert {c.attempts for c in result.calls} == {3}
        assert result.summary.succeeded == 0
        assert result.summary.latency is None

    def test_the_budget_runs_out(self) -> None:
        """
        With no attempt limit, a 2 s budget gives up on every call for
        ``budget``, and no attempt starts after it.
        """
        result = run(
            "constant", clients=20, base=0.5, attempts=None, budget=2.0
        )
        assert result.summary.give_ups == (("budget", 20),)
        assert result.summary.last_attempt < 2.0 + 0.1

    def test_a_policy_that_does_not_retry_connection_errors(self) -> None:
        """
        The simulated failures are `ConnectionError`s: a policy that does
        not retry them gives up at once for ``not_retryable``.
        """
        policy = resilient.Policy(name="strict", retry_on=KeyError)
        result = sim.simulate(sim.SimulationConfig(clients=10, policy=policy))
        assert result.summary.give_ups == (("not_retryable", 10),)
        assert result.summary.amplification == 1.0

    def test_a_policy_that_never_waits_is_stopped(self) -> None:
        """
        Retrying without waiting and without an attempt limit would never
        advance virtual time: the simulator stops and says why.
        """
        policy = resilient.Policy(
            attempts=None, budget=1.0, backoff=resilient.Constant(seconds=0)
        )
        config = sim.SimulationConfig(clients=1, policy=policy)
        with pytest.raises(RuntimeError, match="retry without end"):
            sim.simulate(config)

    def test_duration_stops_the_run(self) -> None:
        """
        With a duration, the chart covers exactly that long and calls still
        going at the end count as unfinished.
        """
        result = run("exponential", clients=100, duration=4.0, outage=5.0)
        assert len(result.load) == 8
        assert result.end == 4.0
        assert result.summary.give_ups == (("unfinished", 100),)
        assert all(c.end is None and c.latency is None for c in result.calls)


def test_the_virtual_clock_never_sleeps() -> None:
    """
    The clients' machines read the simulation's clock; nothing may sleep on
    it (waits are events on the heap), so a sleep is a bug and raises.
    """
    clock = sim._VirtualClock()
    assert clock.now() == 0.0
    with pytest.raises(RuntimeError, match="never sleeps"):
        clock.sleep(1.0)
    coro = clock.asleep(1.0)
    with pytest.raises(RuntimeError, match="never sleeps"):
        coro.send(None)


class TestTheGuardSeam:
    def test_a_guard_refuses_attempts_before_they_are_sent(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """
        The per-client loop tells the fleet's guard when each call begins,
        asks it before each attempt and tells it each outcome: a guard that
        refuses every retry with a non-transient error keeps retries off the
        dependency, and the refusals are counted apart from the load.
        """
        heard: list[tuple[int, bool]] = []
        begun: list[float] = []

        class OnlyFirstAttempts:
            def begin(self, now: float) -> None:
                begun.append(now)

            def admit(self, now: float, client: Any) -> Exception | None:
                if client.machine.attempt == 1:
                    return None
                return KeyError("refused")

            def record(
                self, now: float, client: Any, error: Exception | None
            ) -> None:
                heard.append((client.machine.attempt, error is None))

        monkeypatch.setattr(sim, "_guard", lambda config: OnlyFirstAttempts())
        result = run("full", clients=40)
        s = result.summary
        assert s.attempts == sum(result.load) == 40
        assert s.refused == 40
        assert s.give_ups == (("not_retryable", 40),)
        assert heard == [(1, False)] * 40
        assert sorted(begun) == sorted(c.start for c in result.calls)
        assert "breaker rejected   40 attempts" in sim.render_summary(result)


class TestConfig:
    @pytest.mark.parametrize(
        ("field", "value", "error"),
        [
            ("clients", 0, ConfigError),
            ("clients", True, ConfigTypeError),
            ("clients", 1.5, ConfigTypeError),
            ("outage", -1, ConfigError),
            ("capacity", 0, ConfigError),
            ("capacity", math.inf, ConfigError),
            ("burst", 0.5, ConfigError),
            ("service_time", -0.1, ConfigError),
            ("spread", math.nan, ConfigError),
            ("policy", "full", ConfigTypeError),
            ("duration", 0, ConfigError),
            ("bucket", 0, ConfigError),
            ("seed", -1, ConfigError),
        ],
    )
    def test_bad_values_name_the_field(
        self, field: str, value: object, error: type[Exception]
    ) -> None:
        """A bad setting raises at construction, naming it and the value."""
        with pytest.raises(error) as info:
            sim.SimulationConfig(**{field: value})  # type: ignore[arg-type]
        assert isinstance(info.value, ConfigError)
        assert info.value.field == f"SimulationConfig.{field}"
        assert repr(value) in str(info.value)

    def test_unknown_strategy(self) -> None:
        """An unknown strategy name is refused with the known ones."""
        with pytest.raises(ConfigError, match="full, equal") as info:
            sim.backoff_for("jittery")
        assert info.value.field == "strategy"

    def test_defaults(self) -> None:
        """
        The defaults: 1,000 clients, a 5 s outage, 500 requests/s served 50
        at a time, full jitter, 10 attempts in a 30 s budget.
        """
        c = sim.SimulationConfig()
        assert (c.clients, c.outage, c.capacity, c.tokens) == (
            1000,
            5.0,
            500.0,
            50.0,
        )
        assert c.policy.backoff == resilient.FullJitter()
        assert (c.policy.attempts, c.policy.budget) == (10, 30.0)
        assert sim.SimulationConfig(capacity=5).tokens == 1.0

    @pytest.mark.parametrize("strategy", sim.STRATEGIES)
    def test_command_round_trips_through_the_cli(self, strategy: str) -> None:
        """
        `SimulationConfig.argv` gives the CLI arguments that parse back to
        the same configuration.
        """
        config = sim.SimulationConfig(
            clients=12,
            burst=7,
            duration=9,
            seed=3,
            policy=sim.make_policy(strategy, base=0.3, attempts=None),
        )
        args = cli.parser().parse_args(["simulate", *config.argv()])
        assert cli.config_from_args(args) == config
        assert config.command().startswith("python -m resilient simulate ")

    def test_default_command_leaves_out_what_is_derived(self) -> None:
        """
        The default burst and an unlimited duration are not written out,
        and a given burst is the token bucket's size.
        """
        argv = sim.SimulationConfig().argv()
        assert not any(a.startswith(("--burst", "--duration")) for a in argv)
        assert sim.SimulationConfig(burst=3).tokens == 3.0

    def test_the_policy_name_does_not_matter_to_the_command(self) -> None:
        """
        A policy named after a real dependency, with settings the options
        can express, has a command: the name changes nothing simulated.
        """
        policy = sim.make_policy("equal").evolve(name="payments")
        config = sim.SimulationConfig(
            policy=policy, outage=dt.timedelta(seconds=2)
        )
        assert config.outage == 2.0
        assert "--strategy=equal" in config.argv()

    def test_a_custom_backoff_has_no_command(self) -> None:
        """A backoff the CLI has no name for makes the command impossible."""
        backoff = resilient.Custom(lambda retry: 1.0)
        assert sim.strategy_of(backoff) is None
        config = sim.SimulationConfig(policy=resilient.Policy(backoff=backoff))
        with pytest.raises(ValueError, match="cannot express"):
            config.argv()

    def test_command_refuses_a_policy_the_cli_cannot_express(self) -> None:
        """A policy with settings the CLI has no option for has no command."""
        config = sim.SimulationConfig(
            policy=resilient.Policy(retry_on=KeyError)
        )
        with pytest.raises(ValueError, match="make_policy"):
            config.command()


class TestRendering:
    def test_text_has_every_section(self, none: sim.SimulationResult) -> None:
        """
        The text output has the header, the load chart with the outage
        marked and the capacity drawn, and every figure.
        """
        text = sim.render_text(none)
        header, chart, summary = text.split("\n\n")
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
        assert sim.percentile(data, 50) == 2.0
        assert sim.percentile(data, 90) == 4.0
        assert sim.percentile([5.0], 99) == 5.0


class TestCommandLine:
    def test_main_prints_what_simulate_measures(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """
        ``simulate`` prints exactly `render_text` of the same configuration.
        """
        argv = ["simulate", "--clients=200", "--strategy=equal", "--seed=5"]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        config = cli.config_from_args(cli.parser().parse_args(argv))
        result = sim.simulate(config)
        ascii_only = not cli._can_draw(sys.stdout)
        assert out == sim.render_text(result, ascii_only=ascii_only) + "\n"

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--clients=0"], "argument --clients: SimulationConfig.clients"),
            (["--clients=x"], "argument --clients: invalid int value: 'x'"),
            (["--attempts=0"], "argument --attempts: Policy.attempts"),
            (["--budget=-2"], "argument --budget: Policy.budget"),
            (["--cap=0.1"], "argument --cap: FullJitter.cap must be >= base"),
            (
                ["--strategy=constant", "--base=-1"],
                "argument --base: Constant.seconds",
            ),
            (["--outage=nan"], "argument --outage: SimulationConfig.outage"),
            (["--service-time=-1"], "argument --service-time:"),
            (["--strategy=fast"], "argument --strategy: invalid choice"),
        ],
    )
    def test_bad_options_name_the_option_and_value(
        self,
        argv: list[str],
        message: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A bad option exits with status 2, naming the option and value."""
        with pytest.raises(SystemExit) as info:
            cli.main(["simulate", *argv])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "python -m resilient simulate: error: " in err
        assert message in err
        value = argv[-1].split("=", 1)[1]
        assert value in err

    def test_plot_writes_a_png(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--plot FILE.png`` writes the load chart as a PNG."""
        pytest.importorskip("matplotlib")
        target = tmp_path / "load.png"
        assert cli.main(["simulate", "--clients=50", f"--plot={target}"]) == 0
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {target}" in capsys.readouterr().out

    def test_plot_without_matplotlib_says_how_to_get_it(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """
        Without matplotlib, ``--plot`` fails before simulating, naming the
        ``resilient[plot]`` extra.
        """
        monkeypatch.setitem(sys.modules, "matplotlib", None)
        monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
        with pytest.raises(SystemExit) as info:
            cli.main(["simulate", "--plot=x.png"])
        assert info.value.code == 2
        captured = capsys.readouterr()
        assert "argument --plot:" in captured.err
        assert "pip install 'resilient[plot]'" in captured.err
        assert captured.out == ""

    def test_a_command_is_required(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``python -m resilient`` alone asks for a command."""
        with pytest.raises(SystemExit) as info:
            cli.main([])
        assert info.value.code == 2
        assert "COMMAND" in capsys.readouterr().err

    def test_a_closed_pipe_ends_the_program_quietly(self) -> None:
        """
        ``python -m resilient simulate | head`` does not end in a
        traceback when the reader goes away.
        """
        proc = subprocess.Popen(
            [sys.executable, "-m", "resilient", "simulate", "--clients=20"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        proc.stdout.close()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in {0, 1}
        assert b"Traceback" not in err

    @pytest.mark.parametrize(
        ("encoding", "drawable"),
        [("utf-8", True), ("ascii", False), ("cp1252", False), (None, False)],
    )
    def test_the_chart_falls_back_to_ascii(
        self, encoding: str | None, drawable: bool
    ) -> None:
        """
        The block characters are drawn only on a stream that can encode
        them; otherwise (or with no known encoding) the chart is ASCII.
        """

        class Stream:
            pass

        stream = Stream()
        stream.encoding = encoding  # type: ignore[attr-defined]
        assert cli._can_draw(stream) is drawable
        stream.encoding = "no-such-codec"  # type: ignore[attr-defined]
        assert cli._can_draw(stream) is False

    def test_script_exit_status(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The program's entry point returns main()'s status: 0 on success."""
        monkeypatch.setattr(
            sys, "argv", ["resilient", "simulate", "--clients=3"]
        )
        assert cli._script() == 0
        assert "calls              3" in capsys.readouterr().out

    def test_script_on_a_broken_pipe(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """
        When the reader of stdout has gone, the entry point returns 1 and
        points stdout at the null device so the exit flush cannot fail.
        """
        with (tmp_path / "out").open("w") as target:

            class Closed(io.StringIO):
                def write(self, text: str) -> int:
                    raise BrokenPipeError

                def fileno(self) -> int:
                    return target.fileno()

            monkeypatch.setattr(sys, "stdout", Closed())
            monkeypatch.setattr(
                sys, "argv", ["resilient", "simulate", "--clients=3"]
            )
            assert cli._script() == 1

    def test_python_dash_m(self) -> None:
        """
        ``python -m resilient simulate`` runs as a program and prints the
        chart and the figures.
        """
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "resilient",
                "simulate",
                "--clients=100",
                "--strategy=exponential",
                "--ascii",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Load on the dependency: requests per 0.5 s" in proc.stdout
        assert "outage" in proc.stdout
        assert "amplification" in proc.stdout
        assert "peak after outage" in proc.stdout


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


@pytest.fixture(scope="module")
def budgeted() -> sim.SimulationResult:
    """The default fleet and outage, with the default retry budget."""
    return guarded(retry_budget=True)


@pytest.fixture(scope="module")
def broken() -> sim.SimulationResult:
    """The default fleet and outage, with the simulator's breaker."""
    return guarded(breaker=True)


@pytest.fixture(scope="module")
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


class TestRetryBudget:
    def test_the_budget_cuts_the_storm_of_a_burst(
        self, full: sim.SimulationResult, budgeted: sim.SimulationResult
    ) -> None:
        """
        With a retry budget, the burst of 1,000 failing calls gets the
        retries the budget allows and no more: ratio * calls + min_per_second
        * window of them, so the peak and the total load are a fraction of
        the unbudgeted fleet's; the other calls give up for
        ``retry_budget`` instead of retrying into the outage.
        """
        b, f = budgeted.summary, full.summary
        config = resilient.RetryBudgetConfig()
        allowed = config.ratio * 1000 + config.min_per_second * config.window
        assert b.budget_retries == round(allowed)
        assert b.attempts == 1000 + b.budget_retries
        assert b.during_outage == b.attempts
        assert b.peak[0] <= 0.5 * f.peak[0]
        assert b.attempts <= 0.25 * f.attempts
        assert b.budget_refused is not None
        assert dict(b.give_ups)["retry_budget"] == b.budget_refused > 0
        assert b.refused == 0  # No attempt is refused: the call gives up.
        assert budgeted.transitions == ()
        assert budgeted.breaker_states is None

    def test_under_steady_traffic_the_load_stays_near_the_traffic(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        Under steady traffic, the retry budget keeps the load during the
        outage near the calls' own rate (plus the budget's share) instead
        of several times it, the peak after the outage under the capacity,
        and the total well under the unbudgeted total.
        """
        plain, budget = steady["plain"].summary, steady["budget"].summary
        assert plain.calls == budget.calls
        assert budget.during_outage <= 0.3 * plain.during_outage
        assert budget.peak[0] <= 0.5 * plain.peak[0]
        assert plain.peak_after_outage is not None
        assert budget.peak_after_outage is not None
        assert budget.peak_after_outage[0] <= 0.3 * plain.peak_after_outage[0]
        assert budget.attempts <= 0.4 * plain.attempts
        assert budget.amplification < 1.2 < plain.amplification
        assert dict(budget.give_ups)["retry_budget"] > 0
        assert steady["budget"].overload_end is None
        # Calls that start after the outage succeed at once.
        late = [c for c in steady["budget"].calls if c.start >= 6.0]
        assert late
        assert all(c.ok and c.attempts == 1 for c in late)

    def test_the_budget_reads_simulated_time(self) -> None:
        """
        The budget's window moves with the simulation's clock: a long
        outage with steady traffic gets a fresh allowance every window, so
        retries keep flowing at about ratio * rate + min_per_second.
        """
        result = guarded(
            retry_budget=True,
            clients=1,
            rate=100.0,
            rate_until=40.0,
            outage=40.0,
        )
        s = result.summary
        assert s.budget_retries is not None
        per_second = s.budget_retries / 40.0
        assert 0.8 * (0.2 * 100 + 10) <= per_second <= 1.2 * (0.2 * 100 + 10)


class TestBreaker:
    def test_rejections_appear_and_the_outage_sees_only_probes(
        self, full: sim.SimulationResult, broken: sim.SimulationResult
    ) -> None:
        """
        The breaker opens on the first failures and rejects the fleet's
        retries (they are never sent): during the outage the dependency
        sees the calls that tripped it and then one probe per open
        interval (each fails at once and re-opens it), a tiny fraction of
        the unguarded fleet's load.
        """
        s = broken.summary
        breaker = broken.config.policy.breaker
        assert breaker is not None
        assert s.refused > broken.config.clients
        probes = breaker.half_open_probes * math.ceil(
            broken.config.outage / breaker.open_interval
        )
        assert s.during_outage <= breaker.minimum_calls + probes
        assert s.during_outage <= 0.01 * full.summary.during_outage
        for n in broken.load[1 : outage_buckets(broken)]:
            assert n <= breaker.half_open_probes
        first = broken.transitions[0]
        assert (first.new, first.reason) == (
            resilient.BreakerState.OPEN,
            "failure_rate",
        )
        during = [t for t in broken.transitions if t.at < 5.0]
        assert {t.reason for t in during} == {
            "failure_rate",
            "open_interval_passed",
            "probe_failed",
        }

    def test_the_breaker_closes_after_recovery(
        self, broken: sim.SimulationResult
    ) -> None:
        """
        Once the dependency is back, the half-open probes succeed and the
        breaker closes; the run's state timeline ends closed, and the
        letters show open and half-open during the outage.
        """
        s = broken.summary
        closes = [
            t
            for t in broken.transitions
            if t.new is resilient.BreakerState.CLOSED
        ]
        assert closes
        assert closes[0].at >= broken.config.outage
        assert closes[0].reason == "probes_succeeded"
        assert s.breaker_closed == closes[-1].at
        assert s.breaker_opened == sum(
            t.new is resilient.BreakerState.OPEN for t in broken.transitions
        )
        assert (
            broken.breaker_timeline()[-1][1] is resilient.BreakerState.CLOSED
        )
        states = broken.breaker_states
        assert states is not None
        assert len(states) == len(broken.load)
        outage = states[: outage_buckets(broken)]
        assert set(outage) == {"O", "H"}
        assert "C" in states[outage_buckets(broken) :]

    def test_breaker_states_follow_the_transitions(
        self, broken: sim.SimulationResult
    ) -> None:
        """
        A bucket's letter is H if the breaker was half-open at any moment
        in it, else O if it was open at any moment, else C.
        """
        states = broken.breaker_states
        assert states is not None
        steps = broken.breaker_timeline()
        width = broken.config.bucket
        letter = {
            resilient.BreakerState.CLOSED: "C",
            resilient.BreakerState.OPEN: "O",
            resilient.BreakerState.HALF_OPEN: "H",
        }
        for i, got in enumerate(states):
            lo, hi = i * width, (i + 1) * width
            seen = {
                letter[state]
                for (t, state), (t_next, _) in itertools.pairwise(steps)
                if t < hi and (t_next >= lo or t_next == t >= lo)
            }
            want = "H" if "H" in seen else "O" if "O" in seen else "C"
            assert got == want, i

    def test_with_steady_traffic_and_a_budget(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        Under steady traffic the breaker still holds the outage's load to
        the probes and closes after recovery; rejections are not attempts
        and spend no retry budget, so adding a budget changes nothing while
        the budget's floor covers the retries. The budget alone cuts the
        total load below the plain fleet's.
        """
        s = {name: r.summary for name, r in steady.items()}
        for name in ("breaker", "both"):
            assert s[name].during_outage <= 0.01 * s["plain"].during_outage
            assert s[name].refused > 0
            closed = s[name].breaker_closed
            assert closed is not None
            assert closed >= 5.0
            timeline = steady[name].breaker_timeline()
            assert timeline[-1][1] is resilient.BreakerState.CLOSED
            assert s[name].success_rate > s["budget"].success_rate
        assert s["budget"].attempts < 0.5 * s["plain"].attempts
        assert dict(s["budget"].give_ups)["retry_budget"] > 0

    def test_the_budget_counts_each_call_once(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        The retry budget counts every call exactly once, however many times
        the breaker rejected it before its first try went out (a rejection
        does not advance the attempt number).
        """
        both = steady["both"]
        assert both.summary.budget_calls == len(both.calls)
        assert both.summary.budget_refused > 0

    def test_a_breaker_that_never_opens(self) -> None:
        """
        Without an outage and with ample capacity, the breaker stays closed
        and rejects nothing; the figures say it never opened.
        """
        result = guarded(breaker=True, clients=100, outage=0.0)
        assert result.transitions == ()
        assert result.summary.refused == 0
        assert result.summary.breaker_opened == 0
        assert result.summary.breaker_closed is None
        assert set(result.breaker_states or "") == {"C"}
        text = sim.render_summary(result)
        assert "breaker            opened 0 times, never opened" in text

    def test_a_breaker_still_open_at_the_end(self) -> None:
        """
        When every call has given up while the breaker is open (an outage
        longer than any call's budget), the figures say it was still open
        when the run ended.
        """
        result = guarded(breaker=True, retry_budget=True, outage=60.0)
        assert result.summary.breaker_closed is None
        assert result.breaker_timeline()[-1][1] is not (
            resilient.BreakerState.CLOSED
        )
        assert "still open at the end" in sim.render_summary(result)


class TestSteadyTraffic:
    def test_steady_calls_arrive_on_top_of_the_burst(
        self,
        full: sim.SimulationResult,
        steady: dict[str, sim.SimulationResult],
    ) -> None:
        """
        ``rate`` adds about rate * rate_until calls at random times before
        ``rate_until``, numbered after the clients; the clients' own start
        times do not change.
        """
        result = steady["plain"]
        extra = result.calls[1000:]
        assert 0.9 * 200 * 20 <= len(extra) <= 1.1 * 200 * 20
        assert all(0 < c.start < 20.0 for c in extra)
        assert [c.start for c in extra] == sorted(c.start for c in extra)
        assert [c.client for c in result.calls] == list(
            range(len(result.calls))
        )
        assert [c.start for c in result.calls[:1000]] == [
            c.start for c in full.calls
        ]

    def test_every_guard_is_deterministic_for_a_seed(self) -> None:
        """
        The same configuration (seed included), breaker, budget and steady
        traffic all on, gives the same run; another seed another run.
        """
        a = guarded(breaker=True, retry_budget=True, rate=50.0, clients=200)
        b = guarded(breaker=True, retry_budget=True, rate=50.0, clients=200)
        c = guarded(
            breaker=True, retry_budget=True, rate=50.0, clients=200, seed=1
        )
        assert a == b
        assert a.transitions == b.transitions
        assert a.calls != c.calls


class TestTheProcessClock:
    def test_simulate_restores_the_clock(
        self, clock: resilient.testing.FakeClock
    ) -> None:
        """
        `simulate` points the process's clock at the simulation's while it
        runs (the retry budget reads it) and puts the previous one back.
        """
        from resilient._core import _clock

        guarded(retry_budget=True, clients=20)
        assert _clock.get_clock() is clock

    def test_simulate_restores_the_clock_on_error(
        self, clock: resilient.testing.FakeClock
    ) -> None:
        """The previous clock comes back even when the simulation raises."""
        from resilient._core import _clock

        policy = resilient.Policy(
            attempts=None, budget=1.0, backoff=resilient.Constant(seconds=0)
        )
        with pytest.raises(RuntimeError):
            sim.simulate(sim.SimulationConfig(clients=1, policy=policy))
        assert _clock.get_clock() is clock


class TestGuardConfig:
    @pytest.mark.parametrize(
        ("field", "value"), [("rate", -1.0), ("rate_until", 0.0)]
    )
    def test_bad_traffic_names_the_field(
        self, field: str, value: float
    ) -> None:
        """A bad steady rate or end is refused, naming the field."""
        with pytest.raises(ConfigError) as info:
            sim.SimulationConfig(**{field: value})  # type: ignore[arg-type]
        assert info.value.field == f"SimulationConfig.{field}"

    def test_make_breaker(self) -> None:
        """
        The simulator's breaker: a 10 s time window and a 1 s open
        interval, the library's thresholds; the rest as `BreakerConfig`.
        """
        b = sim.make_breaker()
        assert b.window == resilient.TimeWindow(10.0)
        assert (b.failure_rate, b.minimum_calls) == (0.5, 5)
        assert (b.open_interval, b.half_open_probes) == (1.0, 3)
        assert b.probe_timeout == resilient.BreakerConfig().probe_timeout

    def test_command_round_trips_with_every_guard(self) -> None:
        """
        A configuration with a breaker, a retry budget and steady traffic
        has a command that parses back to it.
        """
        config = sim.SimulationConfig(
            clients=30,
            rate=12.5,
            rate_until=7,
            policy=sim.make_policy(
                "equal",
                breaker=sim.make_breaker(
                    failure_rate=0.25,
                    minimum_calls=9,
                    window=4,
                    open_interval=2.5,
                    half_open_probes=2,
                ),
                retry_budget=resilient.RetryBudgetConfig(
                    ratio=0.1, min_per_second=3, window=5
                ),
            ),
        )
        argv = config.argv()
        assert "--breaker" in argv
        assert "--retry-budget" in argv
        args = cli.parser().parse_args(["simulate", *argv])
        assert cli.config_from_args(args) == config

    @pytest.mark.parametrize(
        "breaker",
        [
            resilient.BreakerConfig(window=resilient.CountWindow(50)),
            sim.make_breaker().evolve(probe_timeout=3.0),
        ],
        ids=["count-window", "probe-timeout"],
    )
    def test_a_breaker_the_cli_cannot_express(
        self, breaker: resilient.BreakerConfig
    ) -> None:
        """A breaker with settings the options do not reach has no command."""
        config = sim.SimulationConfig(policy=sim.make_policy(breaker=breaker))
        with pytest.raises(ValueError, match="cannot express"):
            config.command()


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
        header, chart, summary = sim.render_text(result).split("\n\n")
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
        assert "in 50 calls" in sim.render_header(result)

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


class TestGuardCommandLine:
    def test_main_prints_the_guarded_simulation(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """
        ``--breaker``, ``--retry-budget`` and ``--rate`` with their knobs
        print exactly `render_text` of the configuration they describe.
        """
        argv = [
            "simulate",
            "--clients=200",
            "--rate=50",
            "--rate-until=10",
            "--breaker",
            "--breaker-open-interval=2",
            "--breaker-probes=1",
            "--retry-budget",
            "--retry-budget-ratio=0.5",
            "--ascii",
        ]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        config = cli.config_from_args(cli.parser().parse_args(argv))
        assert config.policy.breaker == sim.make_breaker(
            open_interval=2, half_open_probes=1
        )
        assert config.policy.retry_budget == resilient.RetryBudgetConfig(
            ratio=0.5
        )
        assert (config.rate, config.rate_until) == (50.0, 10.0)
        result = sim.simulate(config)
        assert out == sim.render_text(result, ascii_only=True) + "\n"
        assert "breaker states" in out

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (
                ["--breaker", "--breaker-failure-rate=1.5"],
                "argument --breaker-failure-rate: BreakerConfig.failure_rate",
            ),
            (
                ["--breaker", "--breaker-minimum-calls=0"],
                (
                    "argument --breaker-minimum-calls: "
                    "BreakerConfig.minimum_calls"
                ),
            ),
            (
                ["--breaker", "--breaker-window=0"],
                "argument --breaker-window: TimeWindow.seconds",
            ),
            (
                ["--breaker", "--breaker-open-interval=-1"],
                (
                    "argument --breaker-open-interval: "
                    "BreakerConfig.open_interval"
                ),
            ),
            (
                ["--breaker", "--breaker-open-interval=400"],
                (
                    "argument --breaker-open-interval: "
                    "BreakerConfig.max_open_interval"
                ),
            ),
            (
                ["--breaker", "--breaker-probes=0"],
                "argument --breaker-probes: BreakerConfig.half_open_probes",
            ),
            (
                ["--breaker", "--breaker-probes=x"],
                "argument --breaker-probes: invalid int value: 'x'",
            ),
            (
                ["--retry-budget", "--retry-budget-ratio=-1"],
                "argument --retry-budget-ratio: RetryBudgetConfig.ratio",
            ),
            (
                ["--retry-budget", "--retry-budget-min=nan"],
                (
                    "argument --retry-budget-min: "
                    "RetryBudgetConfig.min_per_second"
                ),
            ),
            (
                ["--retry-budget", "--retry-budget-window=0.01"],
                "argument --retry-budget-window: RetryBudgetConfig.window",
            ),
            (["--rate=-5"], "argument --rate: SimulationConfig.rate"),
            (
                ["--rate-until=0"],
                "argument --rate-until: SimulationConfig.rate_until",
            ),
            (
                ["--breaker-probes=2"],
                (
                    "argument --breaker-probes: 2 given, but the option only "
                    "applies with --breaker"
                ),
            ),
            (
                ["--retry-budget-window=5"],
                (
                    "argument --retry-budget-window: 5.0 given, but the "
                    "option only applies with --retry-budget"
                ),
            ),
        ],
    )
    def test_bad_guard_options_name_the_option_and_value(
        self,
        argv: list[str],
        message: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """
        A bad breaker, retry budget or traffic option, or a knob without
        its switch, exits with status 2 naming the option and the value.
        """
        with pytest.raises(SystemExit) as info:
            cli.main(["simulate", *argv])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "python -m resilient simulate: error: " in err
        assert message in err
        value = argv[-1].split("=", 1)[1]
        assert value in err


class TestThePublicModule:
    def test_it_exports_the_simulator(self) -> None:
        """
        `resilient.simulation` re-exports the simulator's public names,
        listed in a sorted ``__all__``.
        """
        import resilient.simulation as public

        assert public.__all__ == sorted(set(public.__all__))
        for name in public.__all__:
            assert getattr(public, name) is getattr(sim, name)
        assert public.simulate is sim.simulate

    def test_import_resilient_stays_lean(self) -> None:
        """
        ``import resilient`` loads neither the simulator nor its public
        module; they are imported by name.
        """
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import sys, resilient; "
                    "print(sorted(m for m in sys.modules if 'simulat' in m))"
                ),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert proc.stdout.strip() == "[]"
