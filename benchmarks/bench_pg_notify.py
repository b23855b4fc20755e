"""
What the PostgreSQL release's ``pg_notify`` costs: uncontended acquire +
release, with and without it.

The release statement of the PostgreSQL backend marks the row free and
calls ``pg_notify`` (the waiters' wake-up) in the same statement. Here the
same backend runs with that statement and with a copy of it that returns
the freed key instead of notifying (a variant of this benchmark only, not
an option of the library), as bare backend calls and as the whole
``with resilient.lock(...)``; first with nobody listening on the channel,
then with one session listening (a thread that reads its notifications),
which is what a process with waiters has open. Rows are interleaved as in
``bench_locks_servers.py``.

Usage::

    python benchmarks/bench_pg_notify.py [--rounds N] [--calls N]
        [--postgres-url URL]

Without a URL it starts a throwaway server with ``tests/services.py``. Not
a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import psycopg  # noqa: E402

import resilient  # noqa: E402
from bench_locks_servers import measure  # noqa: E402
from resilient._backends import LockKey, OwnerToken, _postgres  # noqa: E402
from tests import services  # noqa: E402


Call = Callable[[], None]

NOTIFY = b"SELECT pg_notify("
QUIET = b"SELECT key FROM freed"


def quiet(backend: Any) -> None:
    """Give *backend* a release statement without the ``pg_notify``."""
    sql = backend._sql
    text: bytes = sql._release
    if NOTIFY not in text:
        return  # Already quiet (a backend shared by both passes).
    start = text.index(NOTIFY)
    sql._release = text[:start] + QUIET


def cases(url: str) -> dict[str, Callable[[str], Call]]:
    """Row name -> (URL -> one acquire + release)."""

    def bare(*, notify: bool) -> Callable[[str], Call]:
        def make(u: str) -> Call:
            b = _postgres.sync_backend(u)
            if not notify:
                quiet(b)
            key = LockKey.of(f"bench:bare:{notify}")
            owner = OwnerToken()

            def call() -> None:
                b.acquire(key, owner, 30.0)
                b.release(key, owner)

            return call

        return make

    def public(*, notify: bool) -> Callable[[str], Call]:
        def make(u: str) -> Call:
            # Another table for the quiet lock: the backend of a URL is
            # shared by its locks, and only the quiet one is changed.
            if not notify:
                u = f"{u}{'&' if '?' in u else '?'}table=bench_quiet"
            lock = resilient.lock(f"bench:lock:{notify}", backend=u, ttl=30.0)
            with lock:
                pass
            if not notify:
                quiet(lock.sync_parts()[0])

            def call() -> None:
                with lock:
                    pass

            return call

        return make

    del url
    return {
        "backend, release with pg_notify": bare(notify=True),
        "backend, release without": bare(notify=False),
        "resilient.lock, release with pg_notify": public(notify=True),
        "resilient.lock, release without": public(notify=False),
    }


@contextlib.contextmanager
def listening(url: str) -> Iterator[None]:
    """A session listening on the lock table's channel, read by a thread."""
    conn = psycopg.connect(url, autocommit=True)
    channel = _postgres.sync_backend(url)._sql.channel
    conn.execute(f"LISTEN {channel}")
    stop = threading.Event()
    seen = [0]

    def read() -> None:
        while not stop.is_set():
            for _ in conn.notifies(timeout=0.2):
                seen[0] += 1

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2)
        conn.close()
        print(f"(the listener read {seen[0]:,} notifications)")


def report(
    samples: dict[str, list[float]], cpu: dict[str, list[float]]
) -> None:
    """Median and best µs per call, client CPU, and the notify's share."""
    print(f"{'case':42} {'median µs':>10} {'best µs':>8} {'CPU µs':>7}")
    med = {n: statistics.median(s) * 1e6 for n, s in samples.items()}
    for name, values in samples.items():
        print(
            f"{name:42} {med[name]:10.1f} {min(values) * 1e6:8.1f} "
            f"{statistics.median(cpu[name]) * 1e6:7.1f}"
        )
    for what in ("backend", "resilient.lock"):
        with_it = med[f"{what}, release with pg_notify"]
        without = med[f"{what}, release without"]
        print(
            f"{what}: pg_notify adds {with_it - without:+.1f} µs per "
            f"acquire + release ({(with_it / without - 1) * 100:+.0f} %, "
            "medians)"
        )


def main() -> None:
    """Both passes, printed as tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--postgres-url")
    args, _ = parser.parse_known_args()
    started = None
    url = args.postgres_url
    if not url:
        folder = services.temporary_folder("bench-pg-notify-")
        template = services.PostgresTemplate(folder / "pg")
        started = template.spawn("bench").start()
        url = started.url
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average {load} at the start")
        for title, scope in [
            ("nobody listening", contextlib.nullcontext()),
            ("one session listening", listening(url)),
        ]:
            with scope:
                print(f"\nUncontended acquire + release, {title}")
                cpu: dict[str, list[float]] = {}
                samples = measure(
                    cases(url), url, args.rounds, args.calls, cpu
                )
                report(samples, cpu)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\nload average {load} at the end")
    finally:
        if started is not None:
            started.stop()


if __name__ == "__main__":
    main()
