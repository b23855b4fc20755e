"""
The command line's arguments and the simulation they describe, both ways:
`config_from_args` reads parsed arguments, `argv` writes a configuration
back as arguments (behind `SimulationConfig.command`), checked by reading
them back.

`OPTIONS` (`._options`) is the only place an option is written down: the
argparse parser (`._parser`), the help texts with their defaults, the
configuration parsed arguments describe, the arguments a configuration is
written back as and the option a refused setting is reported under
(`option_of`) are all made from it. This module re-exports what the
command line and the tests use of the table and the parser.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Final

from resilient import Constant, RetryBudgetConfig, TimeWindow
from resilient._simulate._config import (
    SimulationConfig,
    make_breaker,
    make_policy,
    strategy_of,
)
from resilient._simulate._options import (
    GROUPS,
    OPTIONS,
    SWITCHES,
    Option,
    Part,
    option_of,
)
from resilient._simulate._parser import add_options, parser


if TYPE_CHECKING:
    from resilient.typing import Backoff


class KnobWithoutSwitchError(ValueError):
    """A guard's option was given without the option that turns it on."""

    def __init__(self, option: str, value: object, switch: str) -> None:
        self.option = option
        super().__init__(
            f"{value!r} given, but the option only applies with {switch}"
        )


def config_from_args(args: argparse.Namespace) -> SimulationConfig:
    """
    The simulation the parsed *args* describe.

    Raises:
        ConfigError: A refused value, named after its field.
        KnobWithoutSwitchError: An option of the breaker or the retry
            budget without ``--breaker`` or ``--retry-budget``.
    """
    values: dict[Part, dict[str, Any]] = {
        "config": {},
        "policy": {},
        "breaker": {},
        "retry_budget": {},
    }
    on: dict[Part, bool] = {
        part: bool(getattr(args, o.dest)) for part, o in SWITCHES.items()
    }
    for o in OPTIONS:
        if o.part == "output" or o.parse is None:
            continue
        value = getattr(args, o.dest)
        if o.needs is not None:
            if value is not None and not on[o.part]:
                raise KnobWithoutSwitchError(o.flag, value, o.needs)
            if value is None:
                continue
        values[o.part][o.name] = value
    return _build(values, on)


def _build(
    values: dict[Part, dict[str, Any]], on: dict[Part, bool]
) -> SimulationConfig:
    """The configuration of *values*, with the guards that are *on*."""
    breaker = make_breaker(**values["breaker"]) if on.get("breaker") else None
    retry_budget = (
        RetryBudgetConfig(**values["retry_budget"])
        if on.get("retry_budget")
        else None
    )
    policy = make_policy(
        **values["policy"], breaker=breaker, retry_budget=retry_budget
    )
    return SimulationConfig(**values["config"], policy=policy)


def _values(config: SimulationConfig) -> dict[str, object]:
    """
    The value of every option that *config* writes, by flag; a switch's
    value is True.

    Raises:
        ValueError: The configuration has a part no option sets.
    """
    p = config.policy
    strategy = strategy_of(p.backoff)
    if strategy is None:
        raise ValueError(f"no --strategy is {p.backoff!r}")
    values: dict[str, object] = {
        o.flag: getattr(config, o.name) for o in OPTIONS if o.part == "config"
    }
    if config.burst is None:
        del values["--burst"]
    if config.duration is None:
        del values["--duration"]
    if not config.rate:
        del values["--rate"], values["--rate-until"]
    values |= {
        "--strategy": strategy,
        "--base": _base_of(p.backoff),
        "--attempts": p.attempts,
        "--budget": p.budget,
    }
    if strategy != "constant":
        values["--cap"] = p.backoff.cap  # type: ignore[attr-defined]
    b = p.breaker
    if b is not None:
        if not isinstance(b.window, TimeWindow):
            raise ValueError(f"no --breaker-window is {b.window!r}")
        values["--breaker"] = True
        values |= {
            o.flag: b.window.seconds
            if o.name == "window"
            else getattr(b, o.name)
            for o in OPTIONS
            if o.part == "breaker" and o.needs
        }
    r = p.retry_budget
    if r is not None:
        values["--retry-budget"] = True
        values |= {
            o.flag: getattr(r, o.name)
            for o in OPTIONS
            if o.part == "retry_budget" and o.needs
        }
    return values


def _base_of(backoff: Backoff) -> float:
    if isinstance(backoff, Constant):
        return backoff.seconds
    return float(getattr(backoff, "base", 0.2))


def _write(value: object) -> str:
    if isinstance(value, str):
        return value
    return "none" if value is None else repr(value)


def argv(config: SimulationConfig) -> list[str]:
    """
    The CLI's arguments that describe *config* (`SimulationConfig.argv`).

    Raises:
        ValueError: The policy is not one the CLI can express (another
            backoff, other exceptions, a timeout, hooks...).
    """
    p = config.policy
    try:
        values = _values(config)
        # The name changes nothing in a simulation; every other field must
        # be one the options set: parsed back, the arguments give *config*.
        args = argparse.Namespace(
            **{o.dest: values.get(o.flag) for o in OPTIONS}
        )
        for o in OPTIONS:
            if o.flag not in values and not o.needs and o.parse is not None:
                setattr(args, o.dest, o.default)
        same = config_from_args(args).policy == p.evolve(name="simulated")
    except ValueError:
        same = False
    if not same:
        raise ValueError(
            f"the CLI cannot express the policy {p!r}; "
            "build it with make_policy()"
        )
    return [
        o.flag if value is True else f"{o.flag}={_write(value)}"
        for o in OPTIONS
        if (value := values.get(o.flag, _ABSENT)) is not _ABSENT
    ]


_ABSENT: Final = object()


__all__ = [
    "GROUPS",
    "OPTIONS",
    "SWITCHES",
    "KnobWithoutSwitchError",
    "Option",
    "Part",
    "add_options",
    "argv",
    "config_from_args",
    "option_of",
    "parser",
]
