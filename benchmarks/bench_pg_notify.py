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
``bench_locks_servers.py``. Then (if ``pgbench`` is on the PATH) the same
two statement pairs, acquire then release, run by ``pgbench`` (one client,
prepared statements, interleaved runs of ``--pgbench-seconds``): the
server's side with almost no client cost.

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
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
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


def pgbench_scripts(url: str, folder: Path) -> dict[str, Path]:
    """The acquire + release pair as pgbench scripts, with and without."""
    backend: Any = _postgres.sync_backend(url)
    backend.acquire(LockKey.of("warm"), OwnerToken(), 1.0)  # Makes the table.
    sql = backend._sql
    key, owner = LockKey.of("bench:pgbench"), OwnerToken()
    values = {
        b"%(key)s": f"'\\x{key.digest.hex()}'::bytea".encode(),
        b"%(owner)s": f"'\\x{owner.hex}'::bytea".encode(),
        b"%(ms)s": b"30000",
    }

    def bind(text: bytes) -> bytes:
        for name, value in values.items():
            text = text.replace(name, value)
        return b" ".join(text.split())  # pgbench: one line per statement

    acquire = bind(sql._acquire)
    release = bind(sql._release)
    start = release.index(NOTIFY)
    scripts = {
        "with pg_notify": acquire + b";\n" + release + b";\n",
        "without": acquire + b";\n" + release[:start] + QUIET + b";\n",
    }
    paths = {}
    for name, text in scripts.items():
        path = folder / f"{name.replace(' ', '_')}.sql"
        path.write_bytes(text)
        paths[name] = path
    return paths


def run_pgbench(url: str, rounds: int, seconds: int) -> None:
    """Interleaved pgbench runs of both scripts; µs per acquire + release."""
    binary = shutil.which("pgbench")
    if binary is None:
        print("\n(pgbench is not installed: its section is left out)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        scripts = pgbench_scripts(url, Path(tmp))
        got: dict[str, list[float]] = {name: [] for name in scripts}
        for r in range(rounds):
            order = list(scripts) if r % 2 == 0 else list(scripts)[::-1]
            for name in order:
                out = subprocess.run(  # noqa: S603
                    [
                        binary,
                        "-n",
                        "-c",
                        "1",
                        "-M",
                        "prepared",
                        "-T",
                        str(seconds),
                        "-f",
                        str(scripts[name]),
                        url,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                found = re.search(
                    r"latency average = ([0-9.]+) ms", out.stdout
                )
                assert found, out.stdout + out.stderr
                got[name].append(float(found.group(1)) * 1000)
    print(
        f"\npgbench, one client, prepared, {rounds} interleaved runs of "
        f"{seconds} s: µs per acquire + release (median, best)"
    )
    for name, values in got.items():
        print(f"{name:16} {statistics.median(values):8.1f} {min(values):8.1f}")
    with_it = statistics.median(got["with pg_notify"])
    without = statistics.median(got["without"])
    print(
        f"pg_notify adds {with_it - without:+.1f} µs "
        f"({(with_it / without - 1) * 100:+.0f} %, medians)"
    )


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
    parser.add_argument("--pgbench-rounds", type=int, default=6)
    parser.add_argument("--pgbench-seconds", type=int, default=3)
    parser.add_argument("--pgbench-only", action="store_true")
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
        passes = [
            ("nobody listening", contextlib.nullcontext()),
            ("one session listening", listening(url)),
        ]
        for title, scope in [] if args.pgbench_only else passes:
            with scope:
                print(f"\nUncontended acquire + release, {title}")
                cpu: dict[str, list[float]] = {}
                samples = measure(
                    cases(url), url, args.rounds, args.calls, cpu
                )
                report(samples, cpu)
        run_pgbench(url, args.pgbench_rounds, args.pgbench_seconds)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\nload average {load} at the end")
    finally:
        if started is not None:
            started.stop()


if __name__ == "__main__":
    main()
