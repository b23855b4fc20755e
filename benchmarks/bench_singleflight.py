"""
Singleflight: 1,000 concurrent callers on one key, the shared call taking
1 ms, against a hand-written dict-of-futures version (the floor: no
cancellation safety, no deadlines, no telemetry), on asyncio, trio and
threads.

A round starts 1,000 callers at once and ends when all have their result;
the rounds of the two contenders alternate, so the machine's noise hits
both alike. Reported: the median and best round, per caller, and the ratio
of medians, in wall time and in the process's CPU time (which a loaded
machine disturbs less; it leaves out the 1 ms both spend asleep). Not a
test: it prints numbers and asserts nothing.

    PYTHONPATH=. python benchmarks/bench_singleflight.py [--rounds 15]
        [--runtime asyncio] [--stat min]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable  # noqa: TC003 - used at run time
from concurrent.futures import Future

import trio

import resilient


CALLERS = 1000
CALL = 0.001


# -- asyncio -------------------------------------------------------------


def asyncio_round(kind: str) -> float:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        futures: dict[str, asyncio.Future[object]] = {}
        group = resilient.SingleFlight()

        async def work() -> object:
            await asyncio.sleep(CALL)
            return object()

        async def by_hand() -> object:
            fut = futures.get("k")
            if fut is not None:
                return await fut
            fut = futures["k"] = loop.create_future()
            try:
                value = await work()
            except BaseException as exc:
                fut.set_exception(exc)
                raise
            else:
                fut.set_result(value)
            finally:
                del futures["k"]
            return value

        async def ours() -> object:
            return await group.acall("k", work)

        call = by_hand if kind == "hand" else ours
        start = time.perf_counter()
        await asyncio.gather(*(call() for _ in range(CALLERS)))
        return time.perf_counter() - start

    return asyncio.run(main())


# -- trio ----------------------------------------------------------------


def trio_round(kind: str) -> float:
    async def main() -> float:
        flights: dict[str, tuple[trio.Event, list[object]]] = {}
        group = resilient.SingleFlight()

        async def work() -> object:
            await trio.sleep(CALL)
            return object()

        async def by_hand() -> object:
            flight = flights.get("k")
            if flight is not None:
                await flight[0].wait()
                return flight[1][0]
            flight = flights["k"] = (trio.Event(), [])
            try:
                value = await work()
                flight[1].append(value)
            finally:
                del flights["k"]
                flight[0].set()
            return value

        async def ours() -> object:
            return await group.acall("k", work)

        call = by_hand if kind == "hand" else ours
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(CALLERS):
                nursery.start_soon(call)
        return time.perf_counter() - start

    return trio.run(main)


# -- threads -------------------------------------------------------------


def threads_round(kind: str) -> float:
    """1,000 threads started and parked first: only the calls are timed."""
    lock = threading.Lock()
    futures: dict[str, Future[object]] = {}
    group = resilient.SingleFlight()

    def work() -> object:
        time.sleep(CALL)
        return object()

    def by_hand() -> object:
        with lock:
            fut = futures.get("k")
            lead = fut is None
            if lead:
                fut = futures["k"] = Future()
        assert fut is not None
        if not lead:
            return fut.result()
        try:
            value = work()
            fut.set_result(value)
        finally:
            with lock:
                del futures["k"]
        return value

    def ours() -> object:
        return group.call("k", work)

    call: Callable[[], object] = by_hand if kind == "hand" else ours
    go = threading.Event()
    done = threading.Barrier(CALLERS + 1)

    def body() -> None:
        go.wait()
        call()
        done.wait()

    threads = [threading.Thread(target=body) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    go.set()
    done.wait()
    took = time.perf_counter() - start
    for t in threads:
        t.join()
    return took


RUNTIMES: dict[str, Callable[[str], float]] = {
    "asyncio": asyncio_round,
    "trio": trio_round,
    "threads": threads_round,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--runtime",
        choices=sorted(RUNTIMES),
        action="append",
        help="only this runtime (repeatable; default: all)",
    )
    parser.add_argument(
        "--stat",
        choices=["median", "min"],
        default="median",
        help="the figure of each contender's rounds the ratios compare",
    )
    args = parser.parse_args()
    stat = statistics.median if args.stat == "median" else min
    threading.stack_size(256 * 1024)
    print(
        f"{CALLERS} concurrent callers, one key, {CALL * 1e3:g} ms call; "
        f"{args.rounds} interleaved rounds; µs per caller"
    )
    print(
        f"{'runtime':<9} {'contender':<18} {args.stat:>8} {'best':>8} "
        f"{'ratio':>6} {'cpu':>8} {'ratio':>6}"
    )
    for runtime, run in RUNTIMES.items():
        if args.runtime and runtime not in args.runtime:
            continue
        wall: dict[str, list[float]] = {"hand": [], "resilient": []}
        cpu: dict[str, list[float]] = {"hand": [], "resilient": []}
        run("hand")  # Warm up.
        run("resilient")
        for _ in range(args.rounds):
            for kind, values in wall.items():
                start = time.process_time()
                values.append(run(kind) / CALLERS * 1e6)
                cpu[kind].append((time.process_time() - start) / CALLERS * 1e6)
        floor = stat(wall["hand"])
        cpu_floor = stat(cpu["hand"])
        for kind, label in (
            ("hand", "dict of futures"),
            ("resilient", "SingleFlight"),
        ):
            med = stat(wall[kind])
            used = stat(cpu[kind])
            print(
                f"{runtime:<9} {label:<18} {med:8.1f} "
                f"{min(wall[kind]):8.1f} {med / floor:5.2f}x "
                f"{used:8.1f} {used / cpu_floor:5.2f}x"
            )


if __name__ == "__main__":
    main()
