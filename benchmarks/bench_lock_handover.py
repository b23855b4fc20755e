"""
Hand-over to a waiting process on Redis and PostgreSQL.

Four processes contend for one lock (``with resilient.lock(...)``), each
holding it ~1 ms (and, second, two processes holding it 50 ms each and
resting 50 ms after each release, so every hand-over goes to a process
that has waited 50 ms; third, the same with 300 ms, where a polling
waiter's backoff has grown); the latency from one holder's release to the
acquire of the next holder in another process (p50, p99, max, on the shared
CLOCK_MONOTONIC), as in the embedded hand-over of ``bench_locks.py``. A
waiter is woken by the store's release notice (Redis pub/sub, PostgreSQL
``LISTEN``) where the backend watches, else it looks again on its backoff.

Usage::

    python benchmarks/bench_lock_handover.py [--holds N] [--rounds N]
        [--redis-url URL] [--postgres-url URL]

Without URLs it starts throwaway servers with ``tests/services.py``. Not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_locks import handover, quantile  # noqa: E402
from tests import services  # noqa: E402


def main() -> None:
    """Print one row per store: the hand-over quantiles over all rounds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--holds", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url")
    parser.add_argument("--postgres-url")
    args, _ = parser.parse_known_args()
    folder = services.temporary_folder("bench-handover-")
    started: list[services.RedisServer | services.PostgresServer] = []
    try:
        rurl = args.redis_url
        if not rurl:
            binary = services.find_binary("redis-server")
            assert binary, "redis-server is not installed: pass --redis-url"
            server = services.RedisServer(binary, folder / "redis").start()
            started.append(server)
            rurl = server.url
        purl = args.postgres_url
        if not purl:
            pg = services.PostgresTemplate(folder / "pg").spawn("b").start()
            started.append(pg)
            purl = pg.url
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average {load}; source {ROOT}")
        print(
            f"{'store, procs x hold':24} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'max ms':>8} {'n':>6}"
        )
        cases = [
            (f"{name} {procs}x{hold:g}ms", url, procs, hold)
            for procs, hold in ((4, 1.0), (2, 50.0), (2, 300.0))
            for name, url in (("redis", rurl), ("postgresql", purl))
        ]
        for name, url, procs, hold in cases:
            gaps: list[float] = []
            medians = []
            holds = args.holds if hold < 10 else max(args.holds // 4, 5)
            if hold > 100:
                holds = max(args.holds // 10, 5)
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    got = handover(
                        "resilient", Path(tmp), procs, holds, url, hold
                    )
                gaps += got
                medians.append(statistics.median(got))
            print(
                f"{name:24} {quantile(gaps, 0.5):8.3f} "
                f"{quantile(gaps, 0.99):8.3f} {max(gaps):8.3f} {len(gaps):6}"
                f"   (round medians {', '.join(f'{m:.2f}' for m in medians)})"
            )
    finally:
        for s in started:
            s.stop()


if __name__ == "__main__":
    main()
