"""
`refuse_blocking`, from the coordinator's `resilient._core._loops` once it
is there; until then a local equivalent with the same signature.
"""

from __future__ import annotations

import asyncio
import sys


def _refuse_blocking(what: str, instead: str) -> None:  # pragma: no cover
    """Raise RuntimeError if this thread runs an event loop."""
    running = asyncio._get_running_loop() is not None  # noqa: SLF001
    if not running:
        trio = sys.modules.get("trio")
        running = trio is not None and trio.lowlevel.in_trio_run()
    if running:
        raise RuntimeError(
            f"{what} would block the event loop this thread runs; "
            f"use {instead}"
        )


try:
    from resilient._core._loops import (  # type: ignore[import-not-found, unused-ignore]
        refuse_blocking,
    )
except ImportError:  # pragma: no cover - until _loops lands on main
    refuse_blocking = _refuse_blocking

__all__ = ["refuse_blocking"]
