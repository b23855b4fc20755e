"""
resilient's circuit breaker and bulkhead side by side with their peers.

Breakers (a hand-written one is the floor; pybreaker, circuitbreaker,
aiobreaker and purgatory are the peers):

- closed: the overhead of one successful call through a closed breaker;
- open: the cost of one rejected call, the library's exception caught.

Every breaker opens after 5 failures and stays open for an hour, so it
cannot half-open during the run.

Bulkheads: one acquire and release around a call, with no contention,
against a bare `threading.Semaphore` (sync) and `anyio.Semaphore` (async).

Usage::

    python benchmarks/bench_breaker.py [--quick] [--rounds N]
                                       [--block-ms MS] [--json FILE]

With ``--json FILE`` the results go to ``FILE`` with ``.breaker`` before
its suffix (``out.json`` gives ``out.breaker.json``), so that ``nox -s
bench -- --json out.json`` keeps the retry results in ``out.json``.

Not a test: it asserts nothing about the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import itertools
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import trio


sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import resilient
from resilient import BreakerConfig, CircuitOpen, CountWindow, bulkhead


breaker = resilient.breaker


THRESHOLD = 5
OPEN_FOR = 3600.0

FLOOR = "floor (hand-written)"
RES = "resilient"
RES_COUNT = "resilient CountWindow(5)"
RES_WITH = "resilient, with breaker:"
RES_AWITH = "resilient, async with breaker:"
BARE = "(undecorated call)"
PIPE_RES = "resilient @policy"
PIPE_STACKED = "resilient @policy over @bulkhead"

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]

NOTES = (
    (
        f"every breaker opens after {THRESHOLD} failures and stays open"
        f" {OPEN_FOR:g} s; opened by {THRESHOLD} real failures"
    ),
    (
        "floor: a consecutive-failure counter and an opened-at time;"
        " no lock, not thread-safe"
    ),
    (
        f"{RES}: resilient.breaker(name, BreakerConfig(open_interval=3600,"
        " max_open_interval=3600)): the default 60 s time window, opens at"
        " >= 50% failures over >= 5 calls; lock-guarded, thread-safe"
    ),
    f"{RES_COUNT}: the same with window=CountWindow(size=5)",
    f"{RES_WITH!r} / {RES_AWITH!r}: the {RES} breaker as a context manager",
    "pybreaker: CircuitBreaker(fail_max=5, reset_timeout=3600); sync only",
    (
        "circuitbreaker: CircuitBreaker(failure_threshold=5,"
        " recovery_timeout=3600)"
    ),
    (
        "aiobreaker: CircuitBreaker(fail_max=5,"
        " timeout_duration=timedelta(seconds=3600)); async only"
    ),
    (
        "purgatory: Sync/AsyncCircuitBreakerFactory(default_threshold=5,"
        " default_ttl=3600), its decorator (looks the breaker up per call)"
    ),
    (
        "bulkheads: resilient.bulkhead(name, max_concurrent=25); no"
        " contention, so nobody waits"
    ),
)


class FloorOpen(Exception):
    """The floor breaker's rejection."""


class FloorBreaker:
    """A hand-written breaker: the least a breaker can do."""

    def __init__(self, threshold: int, open_for: float) -> None:
        self.threshold = threshold
        self.open_for = open_for
        self.failures = 0
        self.opened = -1.0

    def admit(self) -> None:
        """Raise `FloorOpen` while open; half-open means closed here."""
        if self.opened >= 0:
            if time.monotonic() - self.opened < self.open_for:
                raise FloorOpen
            self.opened = -1.0

    def failed(self) -> None:
        """Count a failure; open at the threshold."""
        self.failures += 1
        if self.failures >= self.threshold:
            self.opened = time.monotonic()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.admit()
            try:
                result = fn(*args, **kwargs)
            except Exception:
                self.failed()
                raise
            self.failures = 0
            return result

        return wrapper


class AsyncFloorBreaker(FloorBreaker):
    """The async twin of `FloorBreaker`."""

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.admit()
            try:
                result = await fn(*args, **kwargs)
            except Exception:
                self.failed()
                raise
            self.failures = 0
            return result

        return wrapper


_names = itertools.count()


def _resilient(window: CountWindow | None) -> Wrap:
    config = BreakerConfig(open_interval=OPEN_FOR, max_open_interval=OPEN_FOR)
    if window is not None:
        config = BreakerConfig(
            window=window, open_interval=OPEN_FOR, max_open_interval=OPEN_FOR
        )
    return breaker(f"bench-{next(_names)}", config)


def _pybreaker() -> Wrap:
    import pybreaker

    return pybreaker.CircuitBreaker(fail_max=THRESHOLD, reset_timeout=OPEN_FOR)


def _circuitbreaker() -> Wrap:
    import circuitbreaker

    return circuitbreaker.CircuitBreaker(  # type: ignore[no-any-return]
        failure_threshold=THRESHOLD,
        recovery_timeout=OPEN_FOR,
        name=f"bench-{next(_names)}",
    )


def _aiobreaker() -> Wrap:
    import aiobreaker

    return aiobreaker.CircuitBreaker(  # type: ignore[no-any-return]
        fail_max=THRESHOLD, timeout_duration=dt.timedelta(seconds=OPEN_FOR)
    )


def _purgatory(*, is_async: bool) -> Wrap:
    import purgatory

    factory_type = (
        purgatory.AsyncCircuitBreakerFactory
        if is_async
        else purgatory.SyncCircuitBreakerFactory
    )
    factory = factory_type(default_threshold=THRESHOLD, default_ttl=OPEN_FOR)
    return factory(f"bench-{next(_names)}")  # type: ignore[no-any-return]


def rejections() -> tuple[type[BaseException], ...]:
    """Every contender's "the breaker is open" exception."""
    import aiobreaker
    import circuitbreaker
    import pybreaker
    from purgatory.domain.model import OpenedState

    return (
        FloorOpen,
        CircuitOpen,
        pybreaker.CircuitBreakerError,
        circuitbreaker.CircuitBreakerError,
        aiobreaker.CircuitBreakerError,
        OpenedState,
    )


def breakers(is_async: bool) -> list[tuple[str, Callable[[], Wrap]]]:
    """(name, factory of a fresh breaker) per contender of one runtime."""
    rows: list[tuple[str, Callable[[], Wrap]]] = [
        (
            FLOOR,
            functools.partial(
                AsyncFloorBreaker if is_async else FloorBreaker,
                THRESHOLD,
                OPEN_FOR,
            ),
        ),
        (RES, functools.partial(_resilient, None)),
        (RES_COUNT, functools.partial(_resilient, CountWindow(size=5))),
    ]
    if not is_async:
        rows.append(("pybreaker", _pybreaker))
    rows.append(("circuitbreaker", _circuitbreaker))
    if is_async:
        rows.append(("aiobreaker", _aiobreaker))
    rows.append(
        ("purgatory", functools.partial(_purgatory, is_async=is_async))
    )
    return rows


class DependencyError(ConnectionError):
    """
    What the failing dependency raises: a connection error, which every
    contender counts (resilient's default counts dependency failures only).
    """


def ok() -> int:
    return 1


def fail() -> int:
    raise DependencyError


async def aok() -> int:
    return 1


async def afail() -> int:
    raise DependencyError


def _open_sync(wrap: Wrap) -> Callable[[], int]:
    """Decorate `fail`, trip the breaker with real failures, check it."""
    guarded: Callable[[], int] = wrap(fail)
    caught = rejections()
    either: tuple[type[BaseException], ...] = (DependencyError, *caught)
    for _ in range(THRESHOLD):
        with contextlib.suppress(*either):
            guarded()
    try:
        guarded()
    except caught:
        return guarded
    except DependencyError:
        pass
    raise RuntimeError(f"{wrap!r} did not open after {THRESHOLD} failures")


async def _open_async(wrap: Wrap) -> Callable[[], Awaitable[int]]:
    guarded: Callable[[], Awaitable[int]] = wrap(afail)
    caught = rejections()
    either: tuple[type[BaseException], ...] = (DependencyError, *caught)
    for _ in range(THRESHOLD):
        with contextlib.suppress(*either):
            await guarded()
    try:
        await guarded()
    except caught:
        return guarded
    except DependencyError:
        pass
    raise RuntimeError(f"{wrap!r} did not open after {THRESHOLD} failures")


def _sync_calls(fn: Callable[[], int]) -> h.SyncRun:
    def run(n: int) -> None:
        for _ in itertools.repeat(None, n):
            fn()

    return run


def _sync_with(cb: Any) -> h.SyncRun:
    def run(n: int) -> None:
        for _ in itertools.repeat(None, n):
            with cb:
                ok()

    return run


def _async_with(cb: Any) -> h.AsyncRun:
    async def run(n: int) -> None:
        for _ in itertools.repeat(None, n):
            async with cb:
                await aok()

    return run


def _sync_rejections(fn: Callable[[], int]) -> h.SyncRun:
    caught = rejections()

    def run(n: int) -> None:
        for _ in itertools.repeat(None, n):
            try:
                fn()
            except caught:
                continue

    return run


def _async_calls(fn: Callable[[], Awaitable[int]]) -> h.AsyncRun:
    async def run(n: int) -> None:
        for _ in itertools.repeat(None, n):
            await fn()

    return run


def _async_rejections(fn: Callable[[], Awaitable[int]]) -> h.AsyncRun:
    caught = rejections()

    async def run(n: int) -> None:
        for _ in itertools.repeat(None, n):
            try:
                await fn()
            except caught:
                continue

    return run


def sync_cases() -> list[h.Case]:
    """Breakers closed and open, and bulkheads, in sync code."""
    cases = [h.Case("sync breaker closed", BARE, run=_sync_calls(ok))]
    for name, make in breakers(is_async=False):
        cases.append(
            h.Case("sync breaker closed", name, run=_sync_calls(make()(ok)))
        )
        if name == RES:
            cases.append(
                h.Case("sync breaker closed", RES_WITH, run=_sync_with(make()))
            )
        cases.append(
            h.Case(
                "sync breaker open",
                name,
                run=_sync_rejections(_open_sync(make())),
            )
        )

    group = "sync bulkhead"
    sem = threading.Semaphore(25)
    bounded = threading.BoundedSemaphore(25)
    bh = bulkhead(f"bench-{next(_names)}", max_concurrent=25)
    decorated = bh(ok)

    def with_sem(n: int) -> None:
        for _ in itertools.repeat(None, n):
            with sem:
                ok()

    def with_bounded(n: int) -> None:
        for _ in itertools.repeat(None, n):
            with bounded:
                ok()

    def with_bulkhead(n: int) -> None:
        for _ in itertools.repeat(None, n):
            with bh:
                ok()

    cases += [
        h.Case("sync pipeline", name, run=_sync_calls(fn))
        for name, fn in pipelines(is_async=False)
    ]
    cases += [
        h.Case(group, BARE, run=_sync_calls(ok)),
        h.Case(group, "threading.Semaphore", run=with_sem),
        h.Case(group, "threading.BoundedSemaphore", run=with_bounded),
        h.Case(group, "resilient with bulkhead", run=with_bulkhead),
        h.Case(group, "resilient @bulkhead", run=_sync_calls(decorated)),
    ]
    return cases


async def async_cases(backend: str) -> list[h.Case]:
    """Breakers (asyncio only) and bulkheads in async code."""
    cases: list[h.Case] = []
    if backend == "asyncio":
        closed, opened = "asyncio breaker closed", "asyncio breaker open"
        cases.append(h.Case(closed, BARE, arun=_async_calls(aok)))
        for name, make in breakers(is_async=True):
            cases.append(h.Case(closed, name, arun=_async_calls(make()(aok))))
            if name == RES:
                cases.append(
                    h.Case(closed, RES_AWITH, arun=_async_with(make()))
                )
            guarded = await _open_async(make())
            cases.append(h.Case(opened, name, arun=_async_rejections(guarded)))
        cases += [
            h.Case("asyncio pipeline", name, arun=_async_calls(fn))
            for name, fn in pipelines(is_async=True)
        ]

    group = f"{backend} bulkhead"
    sem = anyio.Semaphore(25)
    bh = bulkhead(f"bench-{next(_names)}", max_concurrent=25)
    decorated = bh(aok)

    async def with_sem(n: int) -> None:
        for _ in itertools.repeat(None, n):
            async with sem:
                await aok()

    async def with_bulkhead(n: int) -> None:
        for _ in itertools.repeat(None, n):
            async with bh:
                await aok()

    cases += [
        h.Case(group, BARE, arun=_async_calls(aok)),
        h.Case(group, "anyio.Semaphore", arun=with_sem),
    ]
    native: Any = (
        asyncio.Semaphore(25) if backend == "asyncio" else trio.Semaphore(25)
    )

    async def with_native(n: int) -> None:
        for _ in itertools.repeat(None, n):
            async with native:
                await aok()

    cases += [
        h.Case(group, f"{backend}.Semaphore", arun=with_native),
        h.Case(group, "resilient async with bulkhead", arun=with_bulkhead),
        h.Case(group, "resilient @bulkhead", arun=_async_calls(decorated)),
    ]
    return cases


# The whole pipeline: retry around a breaker (and a bulkhead), success path.

PIPE_NOTES = (
    (
        "pipeline: up to 4 attempts, zero wait, retry on ValueError, a"
        " breaker that opens after 5 failures; success path only"
    ),
    (
        "pipeline floor: the hand-written retry loop around the"
        " hand-written breaker"
    ),
    (
        "resilient @policy: Policy(retry_on=ValueError,"
        " backoff=Constant(seconds=0), budget=None, attempts=4,"
        " breaker=BreakerConfig(...)) used as the decorator; '+ bulkhead'"
        " adds bulkhead=BulkheadConfig(max_concurrent=25)"
    ),
    (
        f"{PIPE_STACKED}: the same policy without a bulkhead, decorating"
        " a function under a standalone @resilient.bulkhead(name,"
        " max_concurrent=25): the decorator's cost in the pipeline's"
        " context (its slot held across retries, not per attempt)"
    ),
    "tenacity + pybreaker / aiobreaker: tenacity.retry(...)(breaker(fn))",
)


def _retry_floor(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The hand-written retry loop of bench_retry.py, sync or async."""
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            for _ in range(3):
                try:
                    return await fn(*args, **kwargs)
                except ValueError:
                    continue
            return await fn(*args, **kwargs)

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for _ in range(3):
            try:
                return fn(*args, **kwargs)
            except ValueError:
                continue
        return fn(*args, **kwargs)

    return wrapper


def _pipeline_policy(*, with_bulkhead: bool) -> resilient.Policy:
    return resilient.Policy(
        name=f"bench-{next(_names)}",
        retry_on=ValueError,
        backoff=resilient.Constant(seconds=0),
        budget=None,
        attempts=4,
        breaker=BreakerConfig(
            open_interval=OPEN_FOR, max_open_interval=OPEN_FOR
        ),
        bulkhead=(
            resilient.BulkheadConfig(max_concurrent=25)
            if with_bulkhead
            else None
        ),
    )


def pipelines(*, is_async: bool) -> list[tuple[str, Callable[..., Any]]]:
    """(name, the guarded `ok`) per contender of the pipeline group."""
    import tenacity

    target: Callable[..., Any] = aok if is_async else ok
    floor_breaker = (AsyncFloorBreaker if is_async else FloorBreaker)(
        THRESHOLD, OPEN_FOR
    )
    peer_breaker = _aiobreaker() if is_async else _pybreaker()
    peer = "aiobreaker" if is_async else "pybreaker"
    stack = tenacity.retry(
        stop=tenacity.stop_after_attempt(4),
        wait=tenacity.wait_none(),
        retry=tenacity.retry_if_exception_type(ValueError),
        reraise=True,
    )
    return [
        (BARE, target),
        (FLOOR, _retry_floor(floor_breaker(target))),
        (PIPE_RES, _pipeline_policy(with_bulkhead=False)(target)),
        (
            f"{PIPE_RES} + bulkhead",
            _pipeline_policy(with_bulkhead=True)(target),
        ),
        (
            PIPE_STACKED,
            _pipeline_policy(with_bulkhead=False)(
                bulkhead(f"bench-{next(_names)}", max_concurrent=25)(target)
            ),
        ),
        (f"tenacity + {peer}", stack(peer_breaker(target))),
    ]


def _floors(group: str) -> str:
    if group.endswith("bulkhead"):
        return (
            "threading.Semaphore"
            if group.startswith("sync")
            else ("anyio.Semaphore")
        )
    return FLOOR


def bulkhead_in_pipeline(
    groups: dict[str, list[h.Row]], stat: str
) -> list[str]:
    """
    What a bulkhead adds inside the pipeline (the policy with a bulkhead
    minus the same policy without) beside what it costs on its own (the
    decorator minus the undecorated call), per runtime, on *stat*; and,
    for scale, what the same standalone decorator adds under the policy
    (the same code costs more inside the pipeline's longer call than in
    the decorator's short one: the comparison the bar makes puts the
    pipeline's bulkhead at that disadvantage).
    """

    def value(group: str, name: str) -> float:
        for row in groups.get(group, []):
            if row.name == name:
                return row.min_ns if stat == "min" else row.median_ns
        return math.nan

    lines = [f"A bulkhead inside the pipeline vs on its own (ns, {stat})"]
    for runtime in ("sync", "asyncio", "trio"):
        pipe = f"{runtime} pipeline"
        bh = f"{runtime} bulkhead"
        inside = value(pipe, f"{PIPE_RES} + bulkhead") - value(pipe, PIPE_RES)
        alone = value(bh, "resilient @bulkhead") - value(bh, BARE)
        if math.isnan(inside) or math.isnan(alone):
            continue
        lines.append(
            f"  {runtime}: adds {inside:,.0f} inside the pipeline, costs"
            f" {alone:,.0f} alone ({inside / alone:.2f}x; want <= 1)"
        )
        stacked = value(pipe, PIPE_STACKED) - value(pipe, PIPE_RES)
        if not math.isnan(stacked):
            lines.append(
                f"  {runtime}: for scale, @bulkhead under the policy adds"
                f" {stacked:,.0f} ({stacked / alone:.2f}x its cost alone)"
            )
    return lines


def concurrency(calls: int = 32, seconds: float = 0.1) -> None:
    """
    32 concurrent 100 ms calls through one closed breaker: with no lock
    held around the call they overlap, and the batch takes about 100 ms,
    not 32 x 100 ms. Real sleeps: this is a measurement, not a test.
    """
    name = f"bench-concurrent-{next(_names)}"

    @resilient.breaker(name)
    def slow_sync() -> None:
        time.sleep(seconds)

    threads = [threading.Thread(target=slow_sync) for _ in range(calls)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    threaded = time.perf_counter() - started

    @resilient.breaker(name)
    async def slow_async() -> None:
        await anyio.sleep(seconds)

    async def batch() -> float:
        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(calls):
                tg.start_soon(slow_async)
        return time.perf_counter() - began

    tasks = anyio.run(batch)
    print(
        f"{calls} concurrent {seconds * 1000:g} ms calls through one closed"
        f" breaker: threads {threaded * 1000:.0f} ms, asyncio tasks"
        f" {tasks * 1000:.0f} ms (serialised would be"
        f" {calls * seconds * 1000:.0f} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument(
        "--quick", action="store_true", help="5 rounds of 4 ms blocks"
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--block-ms", type=float, default=None, help="ms per timed block"
    )
    parser.add_argument(
        "--stat",
        choices=("min", "median"),
        default="min",
        help="what the ratios are taken on (default: min)",
    )
    parser.add_argument("--json", metavar="FILE", default=None)
    parser.add_argument(
        "--strace", action="store_true", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)

    base = h.Settings(rounds=5, block_ms=4.0) if args.quick else h.Settings()
    settings = h.Settings(
        rounds=args.rounds or base.rounds,
        block_ms=args.block_ms or base.block_ms,
        stat=args.stat,
    )
    started = time.perf_counter()
    info = h.machine()
    print(
        f"resilient breaker and bulkhead benchmark: {info['date']}, "
        f"{info['cpu']}, nproc={info['nproc']}, Python {info['python']}"
    )
    print(
        f"{settings.rounds} interleaved rounds of ~{settings.block_ms:g} ms"
        " blocks per contender; median and min of the per-call times;"
        f" ratios on the {settings.stat}\n"
    )

    cases = sync_cases()
    h.measure_sync(cases, settings)
    all_cases = list(cases)
    for backend in ("asyncio", "trio"):

        async def run(backend: str = backend) -> None:
            mine = await async_cases(backend)
            await h.measure_async(mine, settings)
            all_cases.extend(mine)

        anyio.run(run, backend=backend)

    groups: dict[str, list[h.Row]] = {}
    for group in dict.fromkeys(c.group for c in all_cases):
        members = [c for c in all_cases if c.group == group]
        reference = next(
            c.name for c in members if c.name.startswith("resilient")
        )
        groups.update(
            h.rows_of(
                members,
                floor=_floors(group),
                reference=reference,
                stat=settings.stat,
            )
        )
    for group, rows in groups.items():
        what = "per rejection" if group.endswith("open") else "per call"
        print(h.format_table(f"{group} ({what})", [], rows))
        print()
    print("Configuration:")
    for note in NOTES + PIPE_NOTES:
        print(f"  - {note}")
    print()
    print("\n".join(bulkhead_in_pipeline(groups, settings.stat)))
    print()
    concurrency()
    print(f"\n(total {time.perf_counter() - started:.1f} s)")

    if args.json:
        path = Path(args.json)
        out = path.with_name(f"{path.stem}.breaker{path.suffix or '.json'}")
        h.write_json(
            str(out),
            settings,
            groups,
            {},
            {"configuration": list(NOTES + PIPE_NOTES)},
        )
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
