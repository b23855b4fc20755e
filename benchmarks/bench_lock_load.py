"""
Many waiters, one lock, on Redis and PostgreSQL (RELIABILITY.md test 22).

One process: ``--tasks`` asyncio tasks (one event loop) and ``--threads``
threads join the line of one held lock, one after another (a waiter every
``--spacing-ms``), then the holder lets go and each waiter in turn takes
the lock, holds it ``--hold-ms`` and releases it. Measured per backend:

- connections: the most connections of this process to the server
  (sampled every 50 ms, from a process of its own: Redis ``CLIENT LIST``,
  PostgreSQL ``pg_stat_activity``, by a name of the run's own on the lock
  URL; a sampling thread in the measured process took its GIL every
  10 ms, which on a loaded machine added 0.5 to 1 ms to each asyncio
  hand-over on Redis, a cost the hand-over baseline, measured without
  it, does not pay; and a process sampling every 10 ms took a core's
  share from PostgreSQL; a pool keeps its connections far longer than
  50 ms), against
  the documented bound: ``max_connections`` (10) for the event loop, 10
  for the threads' sync store, and one listener;
- time: from the holder's release to the last release, against 1.2x the
  sum of the holds (as they lasted: an asyncio sleep of 2 ms lasts longer
  on a loaded machine) plus one hand-over each, a hand-over being the median
  release-to-grant latency of two waiters of this process taking turns
  (measured first, ``--handover-rounds`` times);
- errors: ``LockNotAcquired('unavailable')`` and every other failure;
- order: each waiter's place in the grants against its place in the line
  (max displacement; grants in exact line order, %).

Usage::

    python benchmarks/bench_lock_load.py [--tasks N] [--threads N]
        [--hold-ms MS] [--backend redis|postgresql|both]
        [--redis-url URL] [--postgres-url URL]

Without URLs it starts throwaway servers with ``tests/services.py``
(PostgreSQL with ``max_connections=100``). ``run_load`` is also what
``tests/test_lock_load.py`` runs, smaller. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import resilient  # noqa: E402
from resilient.exceptions import LockNotAcquired  # noqa: E402


if TYPE_CHECKING:
    from collections.abc import Callable


#: The documented bound: an event loop's pool, the sync store's, the
#: listener (docs/design.md, "The store layer").
BOUND = 10 + 10 + 1

#: Seconds between two counts of the connections (`PeakSampler`).
SAMPLE_EVERY = 0.05


@dataclass
class Load:
    """What one run measured."""

    waiters: int
    hold: float
    handover: float
    seconds: float = 0.0
    peak_connections: int = 0
    unavailable: int = 0
    errors: list[str] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    held: float = 0.0
    """The holds as they lasted (an asyncio sleep of 2 ms lasts longer)."""

    @property
    def bar(self) -> float:
        """1.2x the holds (as they lasted) plus one hand-over each."""
        holds = max(self.held, self.waiters * self.hold)
        return 1.2 * (holds + self.waiters * self.handover)

    @property
    def displacement(self) -> int:
        """The farthest any waiter was granted from its place in line."""
        return max(
            (abs(i - seat) for i, seat in enumerate(self.order)), default=0
        )

    @property
    def in_order(self) -> float:
        """The share of grants that came exactly in line order."""
        if not self.order:
            return 0.0
        return sum(i == s for i, s in enumerate(self.order)) / len(self.order)


def tagged(
    kind: str, server_url: str, name: str | None = None
) -> tuple[str, Callable[[], int]]:
    """A lock URL whose connections carry a name of their own (*name*, or
    a new one), and a count of the server's connections carrying it."""
    name = name or f"bench{uuid.uuid4().hex[:10]}"
    join = "&" if "?" in server_url else "?"
    if kind == "redis":
        import redis

        plain = redis.Redis.from_url(server_url)
        url = f"{server_url}{join}client_name={name}&namespace={name}"

        def count() -> int:
            return sum(c.get("name") == name for c in plain.client_list())

        return url, count
    import psycopg

    conn = psycopg.connect(server_url, autocommit=True)
    lock = threading.Lock()
    url = f"{server_url}{join}application_name={name}&table={name}"

    def count_pg() -> int:
        with lock:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            ).fetchone()
        return int(row[0]) if row else 0

    return url, count_pg


def _sample_peak(kind: str, server_url: str, url: str, pipe: Any) -> None:
    """In a process of its own: the peak of the run's connections, sampled
    every `SAMPLE_EVERY` seconds until told to stop through *pipe*, sent
    back on it."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    name = (query.get("client_name") or query["application_name"])[0]
    _, count = tagged(kind, server_url, name)
    peak = 0
    while not pipe.poll(SAMPLE_EVERY):
        peak = max(peak, count())
    pipe.send(peak)


class PeakSampler:
    """`_sample_peak` in a child process (a context manager); ``peak`` once
    it is left."""

    def __init__(self, kind: str, server_url: str, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_sample_peak, args=(kind, server_url, url, child)
        )
        self.peak = 0

    def __enter__(self) -> Self:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._pipe.send("stop")
        if self._pipe.poll(10):
            self.peak = int(self._pipe.recv())
        self._proc.join(10)


def handover(url: str, rounds: int, hold: float) -> float:
    """Median release-to-grant latency between two threads of this
    process taking turns on one lock."""
    name = f"turns-{uuid.uuid4().hex[:8]}"
    gaps: list[float] = []
    released = [0.0]
    stop = threading.Event()

    def turn() -> None:
        lock = resilient.lock(name, backend=url, ttl=5.0, timeout=10)
        while not stop.is_set():
            with lock:
                if released[0]:
                    gaps.append(time.monotonic() - released[0])
                time.sleep(hold)
                released[0] = time.monotonic()

    threads = [threading.Thread(target=turn) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(gaps) < rounds and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(10)
    return statistics.median(gaps) if gaps else float("nan")


def run_load(  # noqa: C901, PLR0915, PLR0917
    url: str,
    count: Callable[[], int] | None,
    tasks: int,
    threads: int,
    hold: float,
    spacing: float,
    handover_seconds: float,
    ttl: float = 5.0,
) -> Load:
    """One run: see the module (*count* sampled in a thread of this
    process, unless None: then the caller samples)."""
    name = f"load-{uuid.uuid4().hex[:8]}"
    result = Load(tasks + threads, hold, handover_seconds)
    seats: dict[str, int] = {}
    grants: list[str] = []
    seat_lock = threading.Lock()
    done = threading.Event()

    def sample() -> None:
        while count is not None and not done.is_set():
            result.peak_connections = max(result.peak_connections, count())
            done.wait(0.01)

    def failed(exc: BaseException) -> None:
        if isinstance(exc, LockNotAcquired) and exc.reason == "unavailable":
            result.unavailable += 1
        result.errors.append(repr(exc))

    def seat(who: str) -> None:
        with seat_lock:
            seats[who] = len(seats)

    def thread_waiter(who: str, go: threading.Event) -> None:
        lock = resilient.lock(name, backend=url, ttl=ttl, timeout=120)
        go.wait()
        try:
            seat(who)
            with lock:
                grants.append(who)
                began = time.monotonic()
                time.sleep(hold)
                result.held += time.monotonic() - began
        except Exception as exc:
            failed(exc)

    async def main() -> float:
        holder = await resilient.lock(name, backend=url, ttl=ttl).aacquire()

        async def task_waiter(who: str) -> None:
            lock = resilient.lock(name, backend=url, ttl=ttl, timeout=120)
            try:
                seat(who)
                async with lock:
                    grants.append(who)
                    began = time.monotonic()
                    await asyncio.sleep(hold)
                    result.held += time.monotonic() - began
            except Exception as exc:
                failed(exc)

        pending = []
        workers = []
        gos = []
        for i in range(threads):
            go = threading.Event()
            t = threading.Thread(target=thread_waiter, args=(f"t{i}", go))
            t.start()
            workers.append(t)
            gos.append(go)
        # Threads and tasks join the line in turn, one every `spacing`.
        order = [("t", i) for i in range(threads)] + [
            ("a", i) for i in range(tasks)
        ]
        order.sort(key=lambda p: p[1] / (threads if p[0] == "t" else tasks))
        for kind, i in order:
            if kind == "t":
                gos[i].set()
            else:
                pending.append(asyncio.ensure_future(task_waiter(f"a{i}")))
            await asyncio.sleep(spacing)
        await asyncio.sleep(0.2)  # the last ones are in line
        started = time.monotonic()
        await holder.arelease()
        await asyncio.gather(*pending)

        def join() -> None:
            for t in workers:
                t.join(120)

        await asyncio.to_thread(join)
        return time.monotonic() - started

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result.seconds = asyncio.run(main())
    finally:
        done.set()
        sampler.join(5)
    result.order = [seats[who] for who in grants]
    return result


def _servers(args: argparse.Namespace) -> tuple[dict[str, str], list[Any]]:
    urls: dict[str, str] = {}
    started: list[Any] = []
    kinds = (
        ["redis", "postgresql"] if args.backend == "both" else [args.backend]
    )
    if "redis" in kinds:
        if args.redis_url:
            urls["redis"] = args.redis_url
        else:
            from tests import services

            binary = services.find_binary("redis-server")
            assert binary, "redis-server not found: pass --redis-url"
            folder = services.temporary_folder("bench-load-")
            server = services.RedisServer(binary, folder / "redis").start()
            started.append(server)
            urls["redis"] = server.url
    if "postgresql" in kinds:
        if args.postgres_url:
            urls["postgresql"] = args.postgres_url
        else:
            from tests import services

            folder = services.temporary_folder("bench-load-")
            pg = services.PostgresTemplate(folder / "pg").spawn("pg1")
            pg.start()
            started.append(pg)
            urls["postgresql"] = pg.url
    return urls, started


def main() -> None:
    """Run the load per backend and print what it measured."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--hold-ms", type=float, default=2.0)
    parser.add_argument("--spacing-ms", type=float, default=0.5)
    parser.add_argument("--handover-rounds", type=int, default=200)
    parser.add_argument(
        "--backend", choices=["redis", "postgresql", "both"], default="both"
    )
    parser.add_argument("--redis-url")
    parser.add_argument("--postgres-url")
    args = parser.parse_args()
    urls, started = _servers(args)
    try:
        for kind, server_url in urls.items():
            url, _count = tagged(kind, server_url)
            hold = args.hold_ms / 1000
            base = handover(url, args.handover_rounds, hold)
            with PeakSampler(kind, server_url, url) as sampler:
                load = run_load(
                    url,
                    None,
                    args.tasks,
                    args.threads,
                    hold,
                    args.spacing_ms / 1000,
                    base,
                )
            load.peak_connections = sampler.peak
            print(
                f"{kind}: {load.waiters} waiters ({args.tasks} tasks,"
                f" {args.threads} threads), {args.hold_ms:g} ms holds\n"
                f"  time            {load.seconds:.3f} s"
                f" (bar {load.bar:.3f} s: 1.2 x ({load.held:.3f} s of holds"
                f" as they lasted, {load.waiters} x {hold * 1000:g} ms asked,"
                f" + {load.waiters} x {base * 1000:.3f} ms hand-over))"
                f" {'met' if load.seconds <= load.bar else 'MISSED'}\n"
                f"  connections     peak {load.peak_connections}"
                f" (bound {BOUND})"
                f" {'met' if load.peak_connections <= BOUND else 'MISSED'}\n"
                f"  unavailable     {load.unavailable};"
                f" other errors {len(load.errors) - load.unavailable}\n"
                f"  order           {len(load.order)} grants, max displacement"
                f" {load.displacement}, in exact line order"
                f" {load.in_order:.1%}"
            )
            for error in load.errors[:3]:
                print("   ", error)
    finally:
        for server in started:
            server.stop()


if __name__ == "__main__":
    main()
