"""
The command line: ``python -m resilient simulate ...``.

Runs the retry simulator (`resilient.simulation`) and prints the load on the
dependency over time, work amplification, success rate, give-ups, latency
percentiles and drain time, and with ``--breaker`` or ``--retry-budget`` the
breaker's state over time, its rejections and the budget's refusals, then
what the figures say to change; ``--plot FILE.png`` also draws the load.
The options are in `resilient._simulate._cli`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from resilient._simulate._cli import (
    KnobWithoutSwitchError,
    config_from_args,
    option_of,
    parser,
)
from resilient._simulate._engine import simulate
from resilient._simulate._plot import require_plotting, save_plot
from resilient._simulate._render import render_text
from resilient.exceptions import ConfigError


if TYPE_CHECKING:
    from collections.abc import Sequence


__all__ = ["config_from_args", "main", "parser"]


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
        args.command_parser.error(f"argument {option_of(exc.field)}: {exc}")
    except KnobWithoutSwitchError as exc:
        args.command_parser.error(f"argument {exc.option}: {exc}")
    if args.plot is not None:
        folder = os.path.dirname(os.path.abspath(args.plot))  # noqa: PTH100, PTH120
        if not os.path.isdir(folder):  # noqa: PTH112
            args.command_parser.error(
                f"argument --plot: no such directory: {folder}"
            )
        try:
            require_plotting()
        except ImportError as exc:
            args.command_parser.error(f"argument --plot: {exc}")
    result = simulate(config)
    ascii_only = args.ascii or not _can_draw(sys.stdout)
    print(render_text(result, ascii_only=ascii_only))
    if args.plot is not None:
        # Relative to the working directory; the absolute path says where.
        path = os.path.abspath(args.plot)  # noqa: PTH100
        save_plot(result, path)
        print(f"\nwrote {path}")
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
