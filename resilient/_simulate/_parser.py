"""
The argparse parser of ``python -m resilient``: its ``simulate`` command,
with every option of `OPTIONS` (`._options`) in its help group.
"""

from __future__ import annotations

import argparse
from typing import Any

from resilient._simulate._options import _RUN, GROUPS, OPTIONS, Option, Part


def _group(option: Option) -> Part:
    return "output" if option.flag in _RUN else option.part


def add_options(p: argparse.ArgumentParser) -> None:
    """Add every option of `OPTIONS` to *p*, in its group."""
    groups = {
        part: p.add_argument_group(title, description)
        for part, (title, description) in GROUPS.items()
    }
    for o in OPTIONS:
        group = groups[_group(o)]
        if o.parse is None:
            group.add_argument(o.flag, action="store_true", help=o.help)
            continue
        kw: dict[str, Any] = {"type": o.parse, "help": o.help}
        if o.metavar is not None:
            kw["metavar"] = o.metavar
        if o.choices is not None:
            kw["choices"] = o.choices
        # A guard's options default to None, to tell a given one apart.
        kw["default"] = None if o.needs else o.default
        group.add_argument(o.flag, **kw)


def parser() -> argparse.ArgumentParser:
    """The ``python -m resilient`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m resilient",
        description="resilient's command line tools.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    s = sub.add_parser(
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
    s.set_defaults(command_parser=s)
    add_options(s)
    return p
