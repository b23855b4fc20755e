"""
Where the time of one resilient retry call goes.

Prints, for the success path and for a call that retries three times with
zero delay (sync, and async on asyncio):

- a cProfile of many calls, top functions by own time;
- the cost of the building blocks a call is made of (a clock read, a
  context variable set and reset, an anyio cancel scope, a checkpoint, the
  no-SDK telemetry check), each timed alone, to set against the totals.

Usage::

    python benchmarks/profile_retry.py [--calls N] [--top K]

Not a test, and not a benchmark of peers: a tool to find what to trim.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import cProfile
import io
import itertools
import math
import pstats
import sys
import time
import timeit
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

import resilient


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


POLICIES = {
    "default (budget 30 s)": resilient.Policy(
        name="profile",
        retry_on=ValueError,
        backoff=resilient.Constant(seconds=0),
    ),
    "budget=None": resilient.Policy(
        name="profile",
        retry_on=ValueError,
        backoff=resilient.Constant(seconds=0),
        budget=None,
        attempts=4,
    ),
}


def _flaky() -> Callable[[], int]:
    fails = itertools.cycle([True, True, True, False]).__next__

    def sometimes() -> int:
        if fails():
            raise ValueError
        return 1

    return sometimes


def _aflaky() -> Callable[[], Awaitable[int]]:
    fails = itertools.cycle([True, True, True, False]).__next__

    async def sometimes() -> int:
        if fails():
            raise ValueError
        return 1

    return sometimes


def ok() -> int:
    return 1


async def aok() -> int:
    return 1


def _report(profile: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:])


def profile_sync(calls: int, top: int) -> None:
    """cProfile the sync success path and retry path of each policy."""
    for label, policy in POLICIES.items():
        for what, fn in (("success", ok), ("3 retries", _flaky())):
            wrapped = resilient.retry(policy)(fn)
            for _ in range(100):
                wrapped()
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(calls):
                wrapped()
            profile.disable()
            print(f"\n== sync, {label}, {what}: {calls} calls ==")
            print(_report(profile, top))


def profile_async(calls: int, top: int) -> None:
    """The same on asyncio."""

    async def main() -> None:
        for label, policy in POLICIES.items():
            for what, fn in (("success", aok), ("3 retries", _aflaky())):
                wrapped: Any = resilient.retry(policy)(fn)
                for _ in range(100):
                    await wrapped()
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(calls):
                    await wrapped()
                profile.disable()
                print(f"\n== asyncio, {label}, {what}: {calls} calls ==")
                print(_report(profile, top))

    anyio.run(main, backend="asyncio")


def _ns(stmt: Callable[[], object], number: int = 20000) -> float:
    best = min(timeit.repeat(stmt, number=number, repeat=5))
    return best / number * 1e9


def sync_blocks() -> list[tuple[str, float]]:
    """Each sync piece of a call, timed alone (ns, best of 5)."""
    var: contextvars.ContextVar[float] = contextvars.ContextVar(
        "v", default=math.inf
    )

    def set_reset() -> None:
        var.reset(var.set(1.0))

    rows = [
        ("empty function call", _ns(ok)),
        ("time.monotonic()", _ns(time.monotonic)),
        ("MonotonicClock().now()", _ns(resilient.MonotonicClock().now)),
        ("ContextVar.get()", _ns(var.get)),
        ("ContextVar set + reset", _ns(set_reset)),
        ("resilient.remaining() (no deadline)", _ns(resilient.remaining)),
    ]
    try:
        from resilient._core._telemetry import recorder
    except ImportError:  # pragma: no cover - internal name moved
        pass
    else:
        rows.append(
            ("telemetry recorder() with no SDK", _ns(lambda: recorder("p")))
        )
    rows += [
        (f"retry(policy)(ok)() {label}", _ns(resilient.retry(policy)(ok)))
        for label, policy in POLICIES.items()
    ]
    return rows


async def _per_op(n: int, op: Callable[[], Awaitable[object]]) -> float:
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            await op()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e9


async def _async_blocks(backend: str) -> list[tuple[str, float]]:
    async def bare() -> None:
        await aok()

    async def scoped() -> None:
        with anyio.CancelScope(deadline=anyio.current_time() + 30):
            await aok()

    async def unbounded() -> None:
        with anyio.CancelScope():
            await aok()

    async def native() -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(loop.time() + 30):
            await aok()

    n = 5000
    rows = [
        (f"{backend}: await aok()", await _per_op(n, bare)),
        (
            f"{backend}: same in anyio.CancelScope(deadline=now+30)",
            await _per_op(n, scoped),
        ),
        (
            f"{backend}: same in anyio.CancelScope() (no deadline)",
            await _per_op(n, unbounded),
        ),
        (
            f"{backend}: anyio.lowlevel.checkpoint()",
            await _per_op(n, anyio.lowlevel.checkpoint),
        ),
    ]
    if backend == "asyncio":
        rows.append(
            (
                "asyncio: same in asyncio.timeout_at(now+30)",
                await _per_op(n, native),
            )
        )
    return rows


def async_blocks() -> list[tuple[str, float]]:
    """Cancel scopes and checkpoints on asyncio and trio."""
    rows: list[tuple[str, float]] = []
    for backend in ("asyncio", "trio"):

        async def main(backend: str = backend) -> None:
            rows.extend(await _async_blocks(backend))

        anyio.run(main, backend=backend)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args(argv)
    print("Building blocks (ns per operation, best of 5):")
    for label, ns in sync_blocks() + async_blocks():
        print(f"  {label:48s} {ns:9,.0f}")
    profile_sync(args.calls, args.top)
    profile_async(args.calls, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
