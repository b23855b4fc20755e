"""
The options of ``python -m resilient simulate``, in one table (`OPTIONS`).

Each `Option` says how it is parsed, shown and written back, and what it
sets; the help's groups (`GROUPS`), the switches that turn a guard on
(`SWITCHES`) and the option a refused setting is reported under
(`option_of`) are read off the table. The parser and the reading of parsed
arguments are in `._cli`, the writing back as arguments in `._argv`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal, final

import attrs

from resilient import RetryBudgetConfig
from resilient._simulate._config import (
    BREAKER_FAILURE_RATE,
    BREAKER_MINIMUM_CALLS,
    BREAKER_OPEN_INTERVAL,
    BREAKER_PROBES,
    BREAKER_WINDOW,
    DEFAULT_ATTEMPTS,
    DEFAULT_BUDGET,
    STRATEGIES,
    SimulationConfig,
)


if TYPE_CHECKING:
    from collections.abc import Callable


Part = Literal["config", "policy", "breaker", "retry_budget", "output"]
"""What an option sets: a `SimulationConfig` field, a `make_policy`
argument, a `make_breaker` argument, a `RetryBudgetConfig` field, or only
the output (``--plot``, ``--ascii``)."""


def _int_or_none(text: str) -> int | None:
    """An int, or ``none`` for no limit."""
    return None if text.strip().lower() == "none" else int(text)


def _float_or_none(text: str) -> float | None:
    """A number, or ``none`` for no limit."""
    return None if text.strip().lower() == "none" else float(text)


_int_or_none.__name__ = "int or 'none'"
_float_or_none.__name__ = "number or 'none'"


@final
@attrs.frozen
class Option:
    """
    One option: how it is parsed, shown and written, and what it sets.

    Attributes:
        flag: ``--clients``.
        part: What it sets (`Part`).
        name: The keyword it sets in *part* (``clients``, ``attempts``,
            ``failure_rate``...).
        text: The help text, without the default.
        parse: The argparse type; None for a switch.
        metavar: The value's name in the help.
        default: The value when the option is not given.
        shown: The default as the help shows it, when it is not *default*.
        needs: The switch a guard's option needs (``--breaker``).
        choices: The accepted values, if only a few.
        errors: The names of the fields (``Policy.attempts``,
            ``*.base`` for any class) whose refusal is this option's.
    """

    flag: str
    part: Part
    name: str
    text: str
    parse: Callable[[str], Any] | None = float
    metavar: str | None = "SECONDS"
    default: object = None
    shown: str | None = None
    needs: str | None = None
    choices: tuple[str, ...] | None = None
    errors: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The attribute of the parsed namespace."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def help(self) -> str:
        """The help text with the default (and the switch it needs)."""
        if self.parse is None or self.part == "output":
            return self.text
        shown = self.shown
        if shown is None:
            value = self.default
            shown = f"{value:g}" if isinstance(value, float) else str(value)
        needs = f"; needs {self.needs}" if self.needs else ""
        return f"{self.text} (default: {shown}{needs})"


_D: Final = SimulationConfig()
_BUDGET: Final = RetryBudgetConfig()

GROUPS: Final[dict[Part, tuple[str, str | None]]] = {
    "config": ("the fleet and the dependency", None),
    "policy": ("the retry policy", None),
    "breaker": (
        "the circuit breaker",
        "one breaker shared by every client; its options need --breaker",
    ),
    "retry_budget": (
        "the retry budget",
        (
            "one retry budget shared by every client: retries within the "
            "window stay under RATIO * calls + MIN * window; its options need "
            "--retry-budget"
        ),
    ),
    "output": ("the run", None),
}
"""The groups of the help, by the part their options set (the run's
options that set the configuration are shown with the output's)."""


def _config(flag: str, text: str, **kw: Any) -> Option:
    name = flag.removeprefix("--").replace("-", "_")
    return Option(
        flag,
        "config",
        name,
        text,
        default=getattr(_D, name),
        errors=(f"SimulationConfig.{name}",),
        **kw,
    )


def _knob(
    flag: str, part: Part, name: str, text: str, default: float, **kw: Any
) -> Option:
    switch = "--breaker" if part == "breaker" else "--retry-budget"
    return Option(
        flag,
        part,
        name,
        text,
        shown=f"{default:g}",
        needs=switch,
        **kw,
    )


OPTIONS: Final[tuple[Option, ...]] = (
    _config(
        "--clients", "clients, one call each", parse=int, metavar="CLIENTS"
    ),
    _config(
        "--outage",
        "seconds from the start during which every request fails",
    ),
    _config(
        "--capacity",
        "requests per second the dependency serves after the outage; the "
        "excess fails",
        metavar="RPS",
    ),
    _config(
        "--burst",
        "requests it serves at once",
        metavar="N",
        shown="a tenth of a second of capacity",
    ),
    _config("--service-time", "how long a successful request takes"),
    _config("--spread", "window over which the clients start their calls"),
    _config(
        "--rate",
        "steady new calls per second on top of the clients, arriving at "
        "random until --rate-until",
        metavar="CPS",
        shown="0, none",
    ),
    _config("--rate-until", "when the steady calls stop"),
    Option(
        "--strategy",
        "policy",
        "strategy",
        "backoff: full, equal or decorrelated jitter, exponential without "
        "jitter, or constant (waits --base every time)",
        parse=str,
        metavar=None,
        default="full",
        choices=STRATEGIES,
        errors=("strategy",),
    ),
    Option(
        "--base",
        "policy",
        "base",
        "the first backoff window; the delay of 'constant'",
        default=0.2,
        errors=("Constant.seconds", "*.base"),
    ),
    Option(
        "--cap",
        "policy",
        "cap",
        "the largest backoff window",
        default=5.0,
        errors=("*.cap",),
    ),
    Option(
        "--attempts",
        "policy",
        "attempts",
        "attempts per call, the first included; 'none' for no limit",
        parse=_int_or_none,
        metavar="N",
        default=DEFAULT_ATTEMPTS,
        errors=("Policy.attempts",),
    ),
    Option(
        "--budget",
        "policy",
        "budget",
        "seconds per call, waits included; 'none' for no limit",
        parse=_float_or_none,
        default=DEFAULT_BUDGET,
        errors=("Policy.budget",),
    ),
    Option(
        "--breaker",
        "breaker",
        "",
        "put the library's circuit breaker between the clients' retries and "
        "the dependency",
        parse=None,
        metavar=None,
    ),
    _knob(
        "--breaker-failure-rate",
        "breaker",
        "failure_rate",
        "open at this fraction of failed calls in the window, in (0, 1]",
        BREAKER_FAILURE_RATE,
        metavar="RATE",
        errors=("BreakerConfig.failure_rate",),
    ),
    _knob(
        "--breaker-minimum-calls",
        "breaker",
        "minimum_calls",
        "never open on fewer calls in the window",
        BREAKER_MINIMUM_CALLS,
        parse=int,
        metavar="N",
        errors=("BreakerConfig.minimum_calls",),
    ),
    _knob(
        "--breaker-window",
        "breaker",
        "window",
        "seconds of calls the failure rate is taken over",
        BREAKER_WINDOW,
        errors=("TimeWindow.seconds",),
    ),
    _knob(
        "--breaker-open-interval",
        "breaker",
        "open_interval",
        "seconds an open breaker rejects calls before it admits probes",
        BREAKER_OPEN_INTERVAL,
        errors=(
            "BreakerConfig.open_interval",
            "BreakerConfig.max_open_interval",
        ),
    ),
    _knob(
        "--breaker-probes",
        "breaker",
        "half_open_probes",
        "probes admitted while half-open; this many successes close it",
        BREAKER_PROBES,
        parse=int,
        metavar="N",
        errors=("BreakerConfig.half_open_probes",),
    ),
    Option(
        "--retry-budget",
        "retry_budget",
        "",
        "ask the library's retry budget before every retry",
        parse=None,
        metavar=None,
    ),
    _knob(
        "--retry-budget-ratio",
        "retry_budget",
        "ratio",
        "retries allowed per call",
        _BUDGET.ratio,
        metavar="RATIO",
        errors=("RetryBudgetConfig.ratio",),
    ),
    _knob(
        "--retry-budget-min",
        "retry_budget",
        "min_per_second",
        "retries per second allowed whatever the traffic",
        _BUDGET.min_per_second,
        metavar="RPS",
        errors=("RetryBudgetConfig.min_per_second",),
    ),
    _knob(
        "--retry-budget-window",
        "retry_budget",
        "window",
        "seconds a call or a retry is remembered",
        _BUDGET.window,
        errors=("RetryBudgetConfig.window",),
    ),
    _config(
        "--seed",
        "seed of the start times and the jitter; the same seed gives the "
        "same run",
        parse=int,
        metavar="SEED",
    ),
    _config(
        "--duration",
        "stop after this long",
        shown="when every call has ended",
    ),
    _config("--bucket", "width of a row of the load chart"),
    Option(
        "--plot",
        "output",
        "plot",
        "also draw the load to this PNG (needs resilient[plot])",
        parse=str,
        metavar="FILE.png",
    ),
    Option(
        "--ascii",
        "output",
        "ascii",
        "draw the chart with ASCII characters only",
        parse=None,
        metavar=None,
    ),
)
"""Every option, in the order of the help and of `argv`."""

_RUN: Final = frozenset({"--seed", "--duration", "--bucket"})
"""The options of the configuration shown with the run's."""

SWITCHES: Final = {
    o.part: o for o in OPTIONS if o.parse is None and o.part != "output"
}
"""The switch that turns each guard on, by the part it sets."""


def option_of(field: str) -> str:
    """The option a refused setting named *field* is given with."""
    cls, _, name = field.rpartition(".")
    for o in OPTIONS:
        if field in o.errors or (cls and f"*.{name}" in o.errors):
            return o.flag
    return "--" + name.replace("_", "-")
