"""
A small side-by-side timing harness: interleaved rounds in one process.

Every contender of a runtime (sync, asyncio, trio) is timed in rotation, one
block of calls each, for several rounds, so that whatever else the machine
is doing hits them all alike. A block's time divided by its number of calls
is one sample; a row reports the median and the minimum of its samples.
The number of calls per block is calibrated once so that a block lasts about
``block_ms`` milliseconds.

Not a test: it prints numbers and asserts nothing about them.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


SyncRun = Callable[[int], None]
AsyncRun = Callable[[int], Awaitable[None]]


@dataclass
class Case:
    """
    One contender in one group.

    ``run(n)`` (or ``arun(n)``) makes *n* calls of the benchmarked thing.
    ``enter``/``leave`` run around each timed block, untimed: switches a row
    needs (telemetry on) without leaking them into the other rows.
    ``retries`` is the number of retries each call makes; a case with
    ``baseline`` set reports ``(t - t_baseline) / retries`` per round,
    paired with the named case's sample of the same round.
    """

    group: str
    name: str
    run: SyncRun | None = None
    arun: AsyncRun | None = None
    enter: Callable[[], None] | None = None
    leave: Callable[[], None] | None = None
    retries: int = 0
    baseline: str | None = None
    samples: list[float] = field(default_factory=list)
    calls: int = 0

    @property
    def key(self) -> str:
        return f"{self.group}/{self.name}"


@dataclass(frozen=True)
class Settings:
    """How long to measure: rounds, and the length of one timed block."""

    rounds: int = 15
    block_ms: float = 10.0
    stat: str = "min"
    """What the ratios are taken on: ``"min"`` or ``"median"``."""


def _calibrate(block_ms: float, one: Callable[[int], float]) -> int:
    """Calls per block so that a block lasts about *block_ms*."""
    n = 16
    while True:
        elapsed = one(n)
        if elapsed >= block_ms / 1000 / 4 or n >= 1 << 22:
            break
        n *= 4
    per_call = max(elapsed / n, 1e-9)
    return max(16, int(block_ms / 1000 / per_call))


def _order(cases: list[Case], r: int) -> list[Case]:
    """Rotate the running order every round, and reverse every other one."""
    k = r % len(cases)
    order = cases[k:] + cases[:k]
    return order[::-1] if r % 2 else order


def measure_sync(cases: list[Case], settings: Settings) -> None:
    """Time sync cases in interleaved rounds; fills ``case.samples``."""

    def timed(case: Case, n: int) -> float:
        assert case.run is not None
        if case.enter is not None:
            case.enter()
        case.run(2)  # Untimed: lazy set-up after a switch.
        t0 = time.perf_counter()
        case.run(n)
        elapsed = time.perf_counter() - t0
        if case.leave is not None:
            case.leave()
        return elapsed

    for case in cases:
        case.calls = _calibrate(
            settings.block_ms, functools.partial(timed, case)
        )
    for r in range(settings.rounds):
        gc.collect()
        for case in _order(cases, r):
            case.samples.append(timed(case, case.calls) / case.calls)


async def measure_async(cases: list[Case], settings: Settings) -> None:
    """The async twin of `measure_sync`, run inside the event loop."""

    async def timed(case: Case, n: int) -> float:
        assert case.arun is not None
        if case.enter is not None:
            case.enter()
        await case.arun(2)
        t0 = time.perf_counter()
        await case.arun(n)
        elapsed = time.perf_counter() - t0
        if case.leave is not None:
            case.leave()
        return elapsed

    for case in cases:
        n = 16
        while True:
            elapsed = await timed(case, n)
            if elapsed >= settings.block_ms / 4000 or n >= 1 << 22:
                break
            n *= 4
        case.calls = max(
            16, int(settings.block_ms / 1000 / max(elapsed / n, 1e-9))
        )
    for r in range(settings.rounds):
        gc.collect()
        for case in _order(cases, r):
            case.samples.append(await timed(case, case.calls) / case.calls)


@dataclass
class Row:
    """One line of a table: ns per call (or per retry) and ratios."""

    group: str
    name: str
    median_ns: float
    min_ns: float
    calls_per_block: int
    vs_floor: float | None = None
    vs_resilient: float | None = None


def rows_of(
    cases: list[Case], *, floor: str, reference: str, stat: str = "min"
) -> dict[str, list[Row]]:
    """
    Reduce samples to rows, grouped, with ratios to the group's *floor* row
    and *reference* row (matched by name), taken on *stat* (``"min"`` or
    ``"median"``).

    A case with a ``baseline`` reports its per-retry cost: the median of
    ``(sample - baseline's sample of the same round) / retries``, and for
    the minimum ``(min - baseline's min) / retries``.
    """
    by_key = {c.key: c for c in cases}
    groups: dict[str, list[Row]] = {}
    for case in cases:
        samples = case.samples
        low = min(samples)
        if case.baseline is not None:
            base = by_key[case.baseline].samples
            samples = [
                (s - b) / case.retries
                for s, b in zip(samples, base, strict=True)
            ]
            low = (low - min(base)) / case.retries
        groups.setdefault(case.group, []).append(
            Row(
                case.group,
                case.name,
                statistics.median(samples) * 1e9,
                low * 1e9,
                case.calls,
            )
        )
    for rows in groups.values():
        set_ratios(rows, floor=floor, reference=reference, stat=stat)
    return groups


def set_ratios(
    rows: list[Row], *, floor: str, reference: str, stat: str = "min"
) -> None:
    """Fill each row's ratios to the *floor* and *reference* rows."""

    def value(row: Row) -> float:
        return row.min_ns if stat == "min" else row.median_ns

    named = {row.name: row for row in rows}
    for row in rows:
        if floor in named and value(named[floor]) > 0:
            row.vs_floor = value(row) / value(named[floor])
        if reference in named and value(named[reference]) > 0:
            row.vs_resilient = value(row) / value(named[reference])


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(title: str, notes: list[str], rows: list[Row]) -> str:
    """A plain text table: one row per contender, ns and ratios."""
    headers = ("contender", "median ns", "min ns", "x floor", "x resilient")
    body = [
        (
            row.name,
            f"{row.median_ns:,.0f}",
            f"{row.min_ns:,.0f}",
            _ratio(row.vs_floor),
            _ratio(row.vs_resilient),
        )
        for row in rows
    ]
    widths = [
        max(len(headers[i]), *(len(line[i]) for line in body))
        for i in range(len(headers))
    ]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    rule = "-" * len(line(headers))
    out = [title, *(f"  {n}" for n in notes), rule, line(headers), rule]
    out += [line(cells) for cells in body]
    out.append(rule)
    return "\n".join(out)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def write_json(
    path: str,
    settings: Settings,
    groups: dict[str, list[Row]],
    notes: dict[str, list[str]],
    extra: dict[str, Any],
) -> None:
    """Machine-readable results: settings, machine, rows, extra checks."""
    data = {
        "machine": machine(),
        "settings": {
            "rounds": settings.rounds,
            "block_ms": settings.block_ms,
            "ratios_on": settings.stat,
        },
        "groups": {
            name: {
                "notes": notes.get(name, []),
                "rows": [vars(row) for row in rows],
            }
            for name, rows in groups.items()
        },
        **extra,
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
