"""
Distributed locks on Redis and PostgreSQL, side by side with their peers.

Redis (one server, one run): one uncontended acquire + release, per call,
for

- the floors: a raw ``PING`` (one round trip) and a raw ``SET k v NX PX``
  followed by ``DEL k`` (two round trips, no owner check, no fence);
- resilient: the backend alone (acquire script + release script) and the
  public lock (``with resilient.lock(...)``, which also starts and stops
  the renewal);
- peers: redis-py's ``Lock``, python-redis-lock's ``Lock`` and pottery's
  ``Redlock`` (one master).

PostgreSQL: resilient's backend and public lock against a raw
``pg_try_advisory_lock`` + ``pg_advisory_unlock`` (two round trips).

Each row is timed in interleaved rounds (the order rotates every round),
so a noisy moment of the machine hits every row alike; the table gives the
median and the minimum over rounds of the per-call time, the ratios of the
minimum to one round trip and to the two-round-trip floor, and the round
trips per call, counted by sending calls through a loopback TCP proxy
(``tests/faultproxy.py``) that counts the request chunks the client writes.

Usage::

    python benchmarks/bench_locks_servers.py [--quick] [--rounds N]
        [--calls N] [--json FILE] [--redis-url URL] [--postgres-url URL]
        [--case NAME]

Without URLs it starts throwaway servers (``redis-server``; ``initdb`` and
``postgres``) with ``tests/services.py``. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
import redis_lock  # noqa: E402
from pottery import Redlock  # noqa: E402

import resilient  # noqa: E402
from resilient._backends import LockKey, OwnerToken, _postgres, _redis  # noqa: E402
from tests import services  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402


Call = Callable[[], None]


def redis_cases(url: str) -> dict[str, Callable[[str], Call]]:  # noqa: C901
    """Row name -> (URL -> one acquire + release)."""

    def ping(u: str) -> Call:
        client = redis.Redis.from_url(u)
        return lambda: (client.ping(), None)[1]

    def set_del(u: str) -> Call:
        client = redis.Redis.from_url(u)

        def call() -> None:
            client.set("bench:raw", "x", nx=True, px=30000)
            client.delete("bench:raw")

        return call

    def backend(u: str) -> Call:
        b = _redis.sync_backend(u)
        key, owner = LockKey.of("bench:backend"), OwnerToken()

        def call() -> None:
            b.acquire(key, owner, 30.0)
            b.release(key, owner)

        return call

    def public(u: str) -> Call:
        lock = resilient.lock("bench:public", backend=u, ttl=30.0)

        def call() -> None:
            with lock:
                pass

        return call

    def redis_py(u: str) -> Call:
        client = redis.Redis.from_url(u)
        lock = client.lock("bench:redis-py", timeout=30)

        def call() -> None:
            lock.acquire()
            lock.release()

        return call

    def python_redis_lock(u: str) -> Call:
        client = redis.Redis.from_url(u)

        def call() -> None:
            lock = redis_lock.Lock(client, "bench:prl", expire=30)
            lock.acquire()
            lock.release()

        return call

    def pottery(u: str) -> Call:
        client = redis.Redis.from_url(u)
        lock = Redlock(
            key="bench:pottery", masters={client}, auto_release_time=30
        )

        def call() -> None:
            lock.acquire()
            lock.release()

        return call

    cases: dict[str, Callable[[str], Call]] = {
        "PING (1 round trip)": ping,
        "raw SET NX PX + DEL (floor)": set_del,
        "resilient backend (acquire + release)": backend,
    }
    if hasattr(resilient, "lock"):
        cases["resilient.lock (with)"] = public
    cases |= {
        "redis-py Lock": redis_py,
        "python-redis-lock": python_redis_lock,
        "pottery Redlock (1 master)": pottery,
    }
    return cases


def postgres_cases(url: str) -> dict[str, Callable[[str], Call]]:
    """Row name -> (URL -> one acquire + release)."""

    def select1(u: str) -> Call:
        conn = psycopg.connect(u, autocommit=True)
        return lambda: (conn.execute("SELECT 1", prepare=True), None)[1]

    def advisory(u: str) -> Call:
        conn = psycopg.connect(u, autocommit=True)
        k = LockKey.of("bench:advisory").int64

        def call() -> None:
            conn.execute("SELECT pg_try_advisory_lock(%s)", (k,), prepare=True)
            conn.execute("SELECT pg_advisory_unlock(%s)", (k,), prepare=True)

        return call

    def backend(u: str) -> Call:
        b = _postgres.sync_backend(u)
        key, owner = LockKey.of("bench:backend"), OwnerToken()

        def call() -> None:
            b.acquire(key, owner, 30.0)
            b.release(key, owner)

        return call

    def public(u: str) -> Call:
        lock = resilient.lock("bench:public", backend=u, ttl=30.0)

        def call() -> None:
            with lock:
                pass

        return call

    cases: dict[str, Callable[[str], Call]] = {
        "SELECT 1 (1 round trip)": select1,
        "pg_try_advisory_lock + unlock (floor)": advisory,
        "resilient backend (acquire + release)": backend,
    }
    if hasattr(resilient, "lock"):
        cases["resilient.lock (with)"] = public
    return cases


def round_trips(make: Callable[[str], Call], url: str, port: int) -> float:
    """Request chunks one call sends, through a counting proxy."""
    with FaultProxy(port) as proxy:
        call = make(url.replace(f":{port}/", f":{proxy.port}/", 1))
        for _ in range(3):
            call()  # connections, scripts and statements warm
        before = proxy.requests
        for _ in range(10):
            call()
        return (proxy.requests - before) / 10


def measure(
    cases: dict[str, Callable[[str], Call]],
    url: str,
    rounds: int,
    calls: int,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """
    Seconds per call of each case, a sample per round; in *cpu* (if
    given) the client's CPU seconds per call (this thread's time: the
    client's own work, which a loaded machine disturbs far less).
    """
    made = {name: make(url) for name, make in cases.items()}
    for call in made.values():
        for _ in range(50):
            call()
    samples: dict[str, list[float]] = {name: [] for name in made}
    names = list(made)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        if r % 2:
            order.reverse()
        for name in order:
            call = made[name]
            start, cpu_start = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                call()
            samples[name].append((time.perf_counter() - start) / calls)
            if cpu is not None:
                used = (time.thread_time() - cpu_start) / calls
                cpu.setdefault(name, []).append(used)
    return samples


def table(  # noqa: PLR0917
    title: str,
    samples: dict[str, list[float]],
    trips: dict[str, float],
    one: str,
    floor: str,
    cpu: dict[str, list[float]],
) -> str:
    """Median and minimum per call; ratios to the floor on the median and
    on the minimum (the least disturbed sample), the client's CPU per call
    and its ratio, round trips."""
    med = {n: statistics.median(s) for n, s in samples.items()}
    low = {n: min(s) for n, s in samples.items()}
    work = {n: statistics.median(s) for n, s in cpu.items()}
    lines = [
        f"### {title}",
        "",
        (
            "| contender | µs median | µs min | x one round trip | x floor "
            "(median) | x floor (min) | client CPU µs | x floor (CPU) "
            "| round trips |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {name} | {med[name] * 1e6:.1f} | {low[name] * 1e6:.1f} | "
        f"{low[name] / low[one]:.2f} | {med[name] / med[floor]:.2f} | "
        f"{low[name] / low[floor]:.2f} | {work[name] * 1e6:.1f} | "
        f"{work[name] / work[floor]:.2f} | {trips[name]:.1f} |"
        for name in samples
    )
    return "\n".join(lines)


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[tuple[str, int, str, int]]:
    folder = services.temporary_folder("bench-locks-")
    started: list[Any] = []
    try:
        if args.redis_url:
            rurl = args.redis_url
            rport = int(rurl.rsplit(":", 1)[1].split("/")[0])
        else:
            binary = services.find_binary("redis-server")
            assert binary, "redis-server is not installed: pass --redis-url"
            r = services.RedisServer(binary, folder / "redis").start()
            started.append(r)
            rurl, rport = r.url, r.port
        if args.postgres_url:
            purl = args.postgres_url
            pport = int(purl.rsplit(":", 1)[1].split("/")[0])
        else:
            p = services.PostgresTemplate(folder / "pg").spawn("bench").start()
            started.append(p)
            purl, pport = p.url, p.port
        yield rurl, rport, purl, pport
    finally:
        for s in started:
            s.stop()


def one_case(args: argparse.Namespace) -> None:
    """
    ``--case``: one Redis row alone, for an instruction count that the
    machine's load does not disturb. Run it under callgrind twice, with
    ``--calls 0`` and ``--calls 1000``; the difference over 1000 is the
    client's instructions per call::

        valgrind --tool=callgrind python benchmarks/bench_locks_servers.py \
            --redis-url redis://127.0.0.1:6379/0 --case "resilient.lock" \
            --calls 1000
    """
    url = args.redis_url
    assert url, "--case needs --redis-url (no server is started)"
    cases = redis_cases(url)
    names = [n for n in cases if n.startswith(args.case)]
    assert len(names) == 1, f"--case {args.case!r} matches {names}"
    call = cases[names[0]](url)
    for _ in range(200):
        call()
    for _ in range(args.calls):
        call()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="5 x 50 calls")
    parser.add_argument("--json", help="also write the samples to FILE")
    parser.add_argument("--redis-url")
    parser.add_argument("--postgres-url")
    parser.add_argument(
        "--case",
        help="run only the Redis row whose name starts with CASE, --calls "
        "times after a warm-up, and print nothing else (for callgrind)",
    )
    # ``nox -s bench`` passes the other scripts' options to every script.
    args, _ = parser.parse_known_args()
    if args.quick:
        args.rounds, args.calls = 5, 50
    if args.case is not None:
        one_case(args)
        return
    with servers(args) as (rurl, rport, purl, pport):
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average {load} at the start\n")
        rc = redis_cases(rurl)
        rcpu: dict[str, list[float]] = {}
        rs = measure(rc, rurl, args.rounds, args.calls, rcpu)
        rt = {n: round_trips(m, rurl, rport) for n, m in rc.items()}
        print(
            table(
                "Redis",
                rs,
                rt,
                "PING (1 round trip)",
                "raw SET NX PX + DEL (floor)",
                rcpu,
            )
        )
        print()
        pc = postgres_cases(purl)
        pcpu: dict[str, list[float]] = {}
        ps = measure(pc, purl, args.rounds, max(args.calls // 2, 1), pcpu)
        pt = {n: round_trips(m, purl, pport) for n, m in pc.items()}
        print(
            table(
                "PostgreSQL",
                ps,
                pt,
                "SELECT 1 (1 round trip)",
                "pg_try_advisory_lock + unlock (floor)",
                pcpu,
            )
        )
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\nload average {load} at the end")
    if args.json:
        out = Path(args.json)
        out = out.with_name(f"{out.stem}.locks_servers{out.suffix}")
        out.write_text(
            json.dumps(
                {
                    "redis": {"samples": rs, "round_trips": rt},
                    "postgresql": {"samples": ps, "round_trips": pt},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
