"""
The command line: ``python -m resilient simulate ...``.

Runs the retry simulator (`resilient.simulation`) and prints the load on the
dependency over time, work amplification, success rate, give-ups, latency
percentiles and drain time, and with ``--breaker`` or ``--retry-budget`` the
breaker's state over time, its rejections and the budget's refusals;
``--plot FILE.png`` also draws the load.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Final

from resilient import _simulate
from resilient._core._config_retry_budget import RetryBudgetConfig
from resilient.exceptions import ConfigError


if TYPE_CHECKING:
    from collections.abc import Sequence

    from resilient._core._config_breaker import BreakerConfig


_PROG: Final = "python -m resilient"

# A refused setting is named after a field (``Policy.attempts``); the user
# typed an option (``--attempts``).
_OPTION_OF_FIELD: Final = {
    "Constant.seconds": "--base",
    "strategy": "--strategy",
    "BreakerConfig.failure_rate": "--breaker-failure-rate",
    "BreakerConfig.minimum_calls": "--breaker-minimum-calls",
    "TimeWindow.seconds": "--breaker-window",
    "BreakerConfig.open_interval": "--breaker-open-interval",
    "BreakerConfig.max_open_interval": "--breaker-open-interval",
    "BreakerConfig.half_open_probes": "--breaker-probes",
    "RetryBudgetConfig.ratio": "--retry-budget-ratio",
    "RetryBudgetConfig.min_per_second": "--retry-budget-min",
    "RetryBudgetConfig.window": "--retry-budget-window",
}

_BUDGET: Final = RetryBudgetConfig()

# The options that tune a guard, by the switch that turns it on.
_KNOBS: Final = {
    "--breaker": (
        ("breaker_failure_rate", _simulate.BREAKER_FAILURE_RATE),
        ("breaker_minimum_calls", _simulate.BREAKER_MINIMUM_CALLS),
        ("breaker_window", _simulate.BREAKER_WINDOW),
        ("breaker_open_interval", _simulate.BREAKER_OPEN_INTERVAL),
        ("breaker_probes", _simulate.BREAKER_PROBES),
    ),
    "--retry-budget": (
        ("retry_budget_ratio", _BUDGET.ratio),
        ("retry_budget_min", _BUDGET.min_per_second),
        ("retry_budget_window", _BUDGET.window),
    ),
}


def _option(field: str) -> str:
    if field in _OPTION_OF_FIELD:
        return _OPTION_OF_FIELD[field]
    name = field.rpartition(".")[2]
    return _OPTION_OF_FIELD.get(name, "--" + name.replace("_", "-"))


class _KnobWithoutSwitchError(ValueError):
    """A guard's option was given without the option that turns it on."""

    def __init__(self, option: str, value: object, switch: str) -> None:
        self.option = option
        super().__init__(
            f"{value!r} given, but the option only applies with {switch}"
        )


def _int_or_none(text: str) -> int | None:
    """An int, or ``none`` for no limit."""
    return None if text.strip().lower() == "none" else int(text)


def _float_or_none(text: str) -> float | None:
    """A number, or ``none`` for no limit."""
    return None if text.strip().lower() == "none" else float(text)


_int_or_none.__name__ = "int or 'none'"
_float_or_none.__name__ = "number or 'none'"


def _simulate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a fleet of retrying clients against an outage",
        description=(
            "Run the library's backoff and retry machine for many clients "
            "in virtual time against a dependency that is down for a while "
            "and then serves a limited number of requests per second. "
            "Prints the load on the dependency over time and the figures "
            "that tell a good policy from a retry storm."
        ),
    )
    p.set_defaults(command_parser=p)
    d = _simulate.SimulationConfig()
    fleet = p.add_argument_group("the fleet and the dependency")
    fleet.add_argument(
        "--clients",
        type=int,
        default=d.clients,
        help="clients, one call each (default: %(default)s)",
    )
    fleet.add_argument(
        "--outage",
        type=float,
        default=d.outage,
        metavar="SECONDS",
        help="seconds from the start during which every request fails "
        "(default: %(default)s)",
    )
    fleet.add_argument(
        "--capacity",
        type=float,
        default=d.capacity,
        metavar="RPS",
        help="requests per second the dependency serves after the outage; "
        "the excess fails (default: %(default)s)",
    )
    fleet.add_argument(
        "--burst",
        type=float,
        default=None,
        metavar="N",
        help="requests it serves at once (default: a tenth of a second of "
        "capacity)",
    )
    fleet.add_argument(
        "--service-time",
        type=float,
        default=d.service_time,
        metavar="SECONDS",
        help="how long a successful request takes (default: %(default)s)",
    )
    fleet.add_argument(
        "--spread",
        type=float,
        default=d.spread,
        metavar="SECONDS",
        help="window over which the clients start their calls "
        "(default: %(default)s)",
    )
    fleet.add_argument(
        "--rate",
        type=float,
        default=d.rate,
        metavar="CPS",
        help="steady new calls per second on top of the clients, arriving "
        "at random until --rate-until (default: %(default)s, none)",
    )
    fleet.add_argument(
        "--rate-until",
        type=float,
        default=d.rate_until,
        metavar="SECONDS",
        help="when the steady calls stop (default: %(default)s)",
    )
    policy = p.add_argument_group("the retry policy")
    policy.add_argument(
        "--strategy",
        choices=_simulate.STRATEGIES,
        default="full",
        help="backoff: full, equal or decorrelated jitter, exponential "
        "without jitter, or constant (waits --base every time) "
        "(default: %(default)s)",
    )
    policy.add_argument(
        "--base",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="the first backoff window; the delay of 'constant' "
        "(default: %(default)s)",
    )
    policy.add_argument(
        "--cap",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="the largest backoff window (default: %(default)s)",
    )
    policy.add_argument(
        "--attempts",
        type=_int_or_none,
        default=_simulate.DEFAULT_ATTEMPTS,
        metavar="N",
        help="attempts per call, the first included; 'none' for no limit "
        "(default: %(default)s)",
    )
    policy.add_argument(
        "--budget",
        type=_float_or_none,
        default=_simulate.DEFAULT_BUDGET,
        metavar="SECONDS",
        help="seconds per call, waits included; 'none' for no limit "
        "(default: %(default)s)",
    )
    _guard_options(p)
    run = p.add_argument_group("the run")
    run.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="seed of the start times and the jitter; the same seed gives "
        "the same run (default: %(default)s)",
    )
    run.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long (default: when every call has ended)",
    )
    run.add_argument(
        "--bucket",
        type=float,
        default=d.bucket,
        metavar="SECONDS",
        help="width of a row of the load chart (default: %(default)s)",
    )
    run.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the load to this PNG (needs resilient[plot])",
    )
    run.add_argument(
        "--ascii",
        action="store_true",
        help="draw the chart with ASCII characters only",
    )


def _knob_help(flag: str, text: str) -> str:
    """*text*, with the option's default and the switch it needs."""
    dest = flag.removeprefix("--").replace("-", "_")
    for switch, knobs in _KNOBS.items():
        for name, default in knobs:
            if name == dest:
                return f"{text} (default: {default:g}; needs {switch})"
    raise AssertionError(flag)  # pragma: no cover (a typo in a flag)


def _guard_options(p: argparse.ArgumentParser) -> None:
    """The options of the circuit breaker and the retry budget."""
    b = p.add_argument_group(
        "the circuit breaker",
        "one breaker shared by every client; its options need --breaker",
    )
    b.add_argument(
        "--breaker",
        action="store_true",
        help="put the library's circuit breaker between the clients' "
        "retries and the dependency",
    )
    for flag, kind, metavar, text in (
        (
            "--breaker-failure-rate",
            float,
            "RATE",
            "open at this fraction of failed calls in the window, in (0, 1]",
        ),
        (
            "--breaker-minimum-calls",
            int,
            "N",
            "never open on fewer calls in the window",
        ),
        (
            "--breaker-window",
            float,
            "SECONDS",
            "seconds of calls the failure rate is taken over",
        ),
        (
            "--breaker-open-interval",
            float,
            "SECONDS",
            "seconds an open breaker rejects calls before it admits probes",
        ),
        (
            "--breaker-probes",
            int,
            "N",
            "probes admitted while half-open; this many successes close it",
        ),
    ):
        b.add_argument(
            flag, type=kind, metavar=metavar, help=_knob_help(flag, text)
        )
    r = p.add_argument_group(
        "the retry budget",
        "one retry budget shared by every client: retries within the window "
        "stay under RATIO * calls + MIN * window; its options need "
        "--retry-budget",
    )
    r.add_argument(
        "--retry-budget",
        action="store_true",
        help="ask the library's retry budget before every retry",
    )
    for flag, metavar, text in (
        ("--retry-budget-ratio", "RATIO", "retries allowed per call"),
        (
            "--retry-budget-min",
            "RPS",
            "retries per second allowed whatever the traffic",
        ),
        (
            "--retry-budget-window",
            "SECONDS",
            "seconds a call or a retry is remembered",
        ),
    ):
        r.add_argument(
            flag, type=float, metavar=metavar, help=_knob_help(flag, text)
        )


def _guards(
    args: argparse.Namespace,
) -> tuple[BreakerConfig | None, RetryBudgetConfig | None]:
    """
    The breaker and retry budget *args* ask for.

    Raises:
        _KnobWithoutSwitchError: A guard's option without its switch.
        ConfigError: A refused value.
    """
    values: dict[str, dict[str, Any]] = {}
    for switch, knobs in _KNOBS.items():
        on = getattr(args, switch.removeprefix("--").replace("-", "_"))
        given = {}
        for dest, default in knobs:
            value = getattr(args, dest)
            if value is not None and not on:
                raise _KnobWithoutSwitchError(
                    "--" + dest.replace("_", "-"), value, switch
                )
            given[dest] = default if value is None else value
        if on:
            values[switch] = given
    breaker = None
    if "--breaker" in values:
        v = values["--breaker"]
        breaker = _simulate.make_breaker(
            failure_rate=v["breaker_failure_rate"],
            minimum_calls=v["breaker_minimum_calls"],
            window=v["breaker_window"],
            open_interval=v["breaker_open_interval"],
            half_open_probes=v["breaker_probes"],
        )
    budget = None
    if "--retry-budget" in values:
        v = values["--retry-budget"]
        budget = RetryBudgetConfig(
            ratio=v["retry_budget_ratio"],
            min_per_second=v["retry_budget_min"],
            window=v["retry_budget_window"],
        )
    return breaker, budget


def parser() -> argparse.ArgumentParser:
    """The ``python -m resilient`` argument parser."""
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="resilient's command line tools.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _simulate_parser(sub)
    return p


def config_from_args(
    args: argparse.Namespace,
) -> _simulate.SimulationConfig:
    """
    The simulation the parsed *args* describe.

    Raises:
        ConfigError: A refused value, named after its field.
        ValueError: An option of the breaker or the retry budget without
            ``--breaker`` or ``--retry-budget``.
    """
    breaker, retry_budget = _guards(args)
    return _simulate.SimulationConfig(
        clients=args.clients,
        outage=args.outage,
        capacity=args.capacity,
        burst=args.burst,
        service_time=args.service_time,
        spread=args.spread,
        policy=_simulate.make_policy(
            args.strategy,
            base=args.base,
            cap=args.cap,
            attempts=args.attempts,
            budget=args.budget,
            breaker=breaker,
            retry_budget=retry_budget,
        ),
        rate=args.rate,
        rate_until=args.rate_until,
        duration=args.duration,
        bucket=args.bucket,
        seed=args.seed,
    )


def _can_draw(stream: object) -> bool:
    """Whether *stream* can print the chart's block characters."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "\u2588\u2591\u2502\u00bb".encode(encoding)
    except (LookupError, UnicodeEncodeError):
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run ``python -m resilient`` with *argv* (default: `sys.argv`).

    Returns the exit status; a bad option exits with status 2 and a message
    naming the option and its value.
    """
    p = parser()
    args = p.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        args.command_parser.error(f"argument {_option(exc.field)}: {exc}")
    except _KnobWithoutSwitchError as exc:
        args.command_parser.error(f"argument {exc.option}: {exc}")
    if args.plot is not None:
        try:
            _simulate.require_plotting()
        except ImportError as exc:
            args.command_parser.error(f"argument --plot: {exc}")
    result = _simulate.simulate(config)
    ascii_only = args.ascii or not _can_draw(sys.stdout)
    print(_simulate.render_text(result, ascii_only=ascii_only))
    if args.plot is not None:
        _simulate.save_plot(result, args.plot)
        print(f"\nwrote {args.plot}")
    return 0


def _script() -> int:
    """`main` as a program: a closed pipe (``| head``) ends it quietly."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at devnull first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":  # pragma: no cover (run in a subprocess)
    sys.exit(_script())
