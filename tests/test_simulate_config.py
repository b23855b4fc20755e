"""
What a simulation is (`resilient._simulate._config`): validation,
defaults, and the command line a configuration is written back as.
"""

from __future__ import annotations

import datetime as dt
import math

import pytest

import resilient
from resilient import __main__ as cli
from resilient import simulation as sim
from resilient._simulate import _config
from resilient.exceptions import ConfigError, ConfigTypeError


pytest_plugins = ["tests.simulate_fixtures"]


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
        assert _config.strategy_of(backoff) is None
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


@pytest.mark.parametrize("field", ["capacity", "rate", "burst"])
def test_a_rate_is_not_a_duration(field: str) -> None:
    """
    *capacity*, *rate* and *burst* are counts per second or counts, not
    durations: a `datetime.timedelta` is refused (it used to be read as
    its seconds, so ``capacity=timedelta(minutes=1)`` meant 60 per second),
    while an int is a float.
    """
    with pytest.raises(ConfigTypeError) as info:
        sim.SimulationConfig(**{field: dt.timedelta(minutes=1)})  # type: ignore[arg-type]
    assert info.value.field == f"SimulationConfig.{field}"
    assert getattr(sim.SimulationConfig(**{field: 60}), field) == 60.0  # type: ignore[arg-type]
