"""
``python -m resilient simulate`` (`resilient.__main__`, `_simulate._cli`)
and the public module `resilient.simulation`.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import resilient
from resilient import __main__ as cli
from resilient import simulation as sim
from resilient._simulate import _cli


pytest_plugins = ["tests.simulate_fixtures"]


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

    def test_a_relative_plot_path_is_the_working_directorys(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """
        ``--plot rel.png`` writes into the working directory and prints the
        absolute path it wrote.
        """
        pytest.importorskip("matplotlib")
        monkeypatch.chdir(tmp_path)
        assert cli.main(["simulate", "--clients=50", "--plot=rel.png"]) == 0
        assert (tmp_path / "rel.png").read_bytes()[:4] == b"\x89PNG"
        assert f"wrote {tmp_path / 'rel.png'}" in capsys.readouterr().out

    def test_a_plot_folder_that_does_not_exist_is_refused(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """
        ``--plot missing/rel.png`` exits with status 2 before simulating,
        naming the folder (relative to the working directory) it lacks.
        """
        monkeypatch.chdir(tmp_path)
        with pytest.raises(SystemExit) as info:
            cli.main(["simulate", "--plot=missing/rel.png"])
        assert info.value.code == 2
        captured = capsys.readouterr()
        assert f"no such directory: {tmp_path / 'missing'}" in captured.err
        assert captured.out == ""

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
        from resilient._simulate import (
            _config,
            _engine,
            _plot,
            _render,
            _result,
        )

        assert public.__all__ == sorted(set(public.__all__))
        homes = (_config, _engine, _plot, _render, _result)
        for name in public.__all__:
            obj = getattr(public, name)
            assert any(getattr(m, name, None) is obj for m in homes), name
        assert public.simulate is _engine.simulate
        assert public.render_diagnosis is _render.render_diagnosis

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


class TestTheOptionTable:
    def test_every_option_is_parsed_and_helped_with_its_default(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """
        The parser has every option of the table, in its group, and the
        help shows each one's default (and the switch a guard's option
        needs).
        """
        with pytest.raises(SystemExit):
            cli.main(["simulate", "--help"])
        # argparse wraps at hyphens: "--retry-\n budget" reads back joined.
        text = re.sub(r"-\s+", "-", " ".join(capsys.readouterr().out.split()))
        for option in _cli.OPTIONS:
            assert option.flag in text
            assert re.sub(r"-\s+", "-", option.help) in text
        assert "(default: 10; needs --breaker)" in text
        assert "(default: 0.2; needs --retry-budget)" in text

    def test_the_defaults_are_the_configurations(self) -> None:
        """
        No option given gives `SimulationConfig()`: the table's defaults
        are the configuration's and make_policy's.
        """
        args = cli.parser().parse_args(["simulate"])
        assert cli.config_from_args(args) == sim.SimulationConfig()

    @pytest.mark.parametrize(
        ("field", "option"),
        [
            ("SimulationConfig.clients", "--clients"),
            ("SimulationConfig.rate_until", "--rate-until"),
            ("Policy.attempts", "--attempts"),
            ("FullJitter.cap", "--cap"),
            ("DecorrelatedJitter.base", "--base"),
            ("Constant.seconds", "--base"),
            ("strategy", "--strategy"),
            ("TimeWindow.seconds", "--breaker-window"),
            ("BreakerConfig.max_open_interval", "--breaker-open-interval"),
            ("RetryBudgetConfig.min_per_second", "--retry-budget-min"),
            ("Unknown.some_field", "--some-field"),
        ],
    )
    def test_a_refused_field_is_reported_under_its_option(
        self, field: str, option: str
    ) -> None:
        """A refused setting's field maps to the option the user typed."""
        assert _cli.option_of(field) == option

    def test_every_refusal_field_belongs_to_one_option(self) -> None:
        """No two options claim the same refused field."""
        fields = [f for o in _cli.OPTIONS for f in o.errors]
        assert len(fields) == len(set(fields))

    def test_the_docs_table_lists_every_option_with_its_default(
        self,
    ) -> None:
        """
        docs/simulator.md's table of options has a row for each option of
        the table, in its order, and nothing else.
        """
        docs = Path(__file__).resolve().parent.parent / "docs/simulator.md"
        text = docs.read_text(encoding="utf-8")
        table = text.split("## Options", 1)[1].split("\n\n", 2)[1]
        rows = [
            line.split("|")[1].strip().strip("`").split()[0]
            for line in table.splitlines()
            if line.startswith("| `--")
        ]
        assert rows == [o.flag for o in _cli.OPTIONS]

    def test_argv_follows_the_table(self) -> None:
        """
        `SimulationConfig.argv` writes the options in the table's order,
        leaving out what is derived (burst, duration) or off (the steady
        traffic, the guards, the cap of ``constant``).
        """
        config = sim.SimulationConfig(
            policy=sim.make_policy("constant", base=0.5)
        )
        assert config.argv() == [
            "--clients=1000",
            "--outage=5.0",
            "--capacity=500.0",
            "--service-time=0.02",
            "--spread=0.1",
            "--strategy=constant",
            "--base=0.5",
            "--attempts=10",
            "--budget=30.0",
            "--seed=0",
            "--bucket=0.5",
        ]

    def test_a_count_window_breaker_has_no_command(self) -> None:
        """
        A breaker over a count window cannot be written as options (the
        CLI's window is seconds): the command is refused.
        """
        breaker = resilient.BreakerConfig(window=resilient.CountWindow(10))
        config = sim.SimulationConfig(policy=sim.make_policy(breaker=breaker))
        with pytest.raises(ValueError, match="cannot express"):
            config.command()

    def test_a_rate_of_zero_leaves_its_end_out(self) -> None:
        """
        Without steady traffic, when it would stop does not matter: the
        command leaves both out, and still parses back to the same run.
        """
        config = sim.SimulationConfig(rate_until=7.0)
        argv = config.argv()
        assert not any(a.startswith("--rate") for a in argv)
