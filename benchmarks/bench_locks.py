"""
Lock benchmarks: the embedded backend against filelock.

- uncontended: acquire + release per second in one process, resilient's
  ``with resilient.lock(...)`` on the embedded SQLite backend (and its bare
  backend calls) against ``filelock.FileLock`` and against the floor of raw
  SQLite (one UPSERT that mints the token, one DELETE, on a WAL database
  with ``synchronous=NORMAL``, as the backend uses), in interleaved rounds;
- hand-over: 4 processes contend for one lock, each holding it ~1 ms; the
  latency from one holder's release to the acquire of the next holder in
  another process (p50, p99, max) on the shared CLOCK_MONOTONIC. filelock
  polls every 50 ms by default.

The Redis and PostgreSQL sections (another script or more functions here)
reuse `interleave` and `handover`.

Usage::

    python benchmarks/bench_locks.py [--quick] [--rounds N]
        [--handover-rounds N] [--handover-only]

Not a test: it asserts nothing about the numbers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import resilient
from resilient._backends import OwnerToken, open_backend
from resilient._backends._base import LockKey


if TYPE_CHECKING:
    from collections.abc import Callable


def interleave(
    cases: dict[str, Callable[[int], None]],
    rounds: int,
    n: int,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """
    Each case does *n* acquire+release per round, in rotation; ops/s of
    wall-clock time, and in *cpu* (if given) ops per second of this
    thread's CPU time, which a loaded machine disturbs far less.
    """
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for run in cases.values():
        run(max(n // 10, 1))  # warm up
    for r in range(rounds):
        names = list(cases)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            start, cpu_start = time.perf_counter(), time.thread_time()
            cases[name](n)
            rates[name].append(n / (time.perf_counter() - start))
            if cpu is not None:
                used = time.thread_time() - cpu_start
                cpu.setdefault(name, []).append(n / max(used, 1e-9))
    return rates


def embedded_uncontended(directory: Path) -> dict[str, Callable[[int], None]]:
    """The uncontended cases: resilient's shell, its backend, filelock."""
    import filelock

    url = f"sqlite:///{directory / 'bench.sqlite3'}"
    lock = resilient.lock("bench", backend=url, ttl=30)
    backend = open_backend(url)
    key = LockKey.of("bench-raw")
    peer = filelock.FileLock(str(directory / "bench.filelock"))

    def shell(n: int) -> None:
        for _ in range(n):
            with lock:
                pass

    def raw(n: int) -> None:
        for _ in range(n):
            owner = OwnerToken()
            backend.acquire(key, owner, 30.0)
            backend.release(key, owner)

    def file_lock(n: int) -> None:
        for _ in range(n):
            with peer:
                pass

    db = sqlite3.connect(directory / "raw.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE leases (name TEXT PRIMARY KEY, owner BLOB, "
        "fence INTEGER, expires_ns INTEGER) WITHOUT ROWID"
    )
    upsert = (
        "INSERT INTO leases VALUES (?1, ?2, 1, ?3) ON CONFLICT (name) DO "
        "UPDATE SET owner = ?2, fence = fence + 1, expires_ns = ?3 "
        "WHERE leases.expires_ns <= ?4 RETURNING fence"
    )
    delete = "DELETE FROM leases WHERE name = ? AND owner = ?"

    def raw_sqlite(n: int) -> None:
        for _ in range(n):
            owner = os.urandom(20)
            now = time.monotonic_ns()
            db.execute(upsert, ("x", owner, now + 30_000_000_000, now))
            db.execute(delete, ("x", owner))

    return {
        "resilient.lock (sqlite)": shell,
        "sqlite backend, bare calls": raw,
        "filelock.FileLock": file_lock,
        "raw SQLite UPSERT + DELETE": raw_sqlite,
    }


def _contender(
    kind: str, path: str, holds: int, out: str, hold_ms: float = 1.0
) -> None:
    """One contending process: acquire, hold *hold_ms*, release; log times."""
    times: list[tuple[int, int]] = []
    if kind == "resilient":
        url = path if "://" in path else f"sqlite:///{path}"
        lock = resilient.lock("handover", backend=url, ttl=30, timeout=60)
    else:
        import filelock

        lock = filelock.FileLock(path + ".filelock", timeout=60)  # type: ignore[assignment]
    for _ in range(holds):
        with lock:
            got = time.monotonic_ns()
            if hold_ms > 1.0:
                time.sleep(hold_ms / 1000.0)
            while time.monotonic_ns() - got < hold_ms * 1_000_000:
                pass
            times.append((got, time.monotonic_ns()))
        if hold_ms > 1.0:
            # Long holds: rest as long after the release, so the lock goes
            # to the process that was waiting rather than back to this one.
            time.sleep(hold_ms / 1000.0)
    pid = os.getpid()
    Path(out).write_text("\n".join(f"{a} {b} {pid}" for a, b in times))


def handover(  # noqa: PLR0917
    kind: str,
    directory: Path,
    procs: int,
    holds: int,
    url: str | None = None,
    hold_ms: float = 1.0,
) -> list[float]:
    """Release-to-acquire latencies in ms with *procs* contending (on the
    lock *url*, else on an embedded store in *directory*)."""
    ctx = multiprocessing.get_context("spawn")
    path = url or str(directory / f"handover-{kind}.sqlite3")
    outs = [str(directory / f"{kind}-{i}.txt") for i in range(procs)]
    workers = [
        ctx.Process(target=_contender, args=(kind, path, holds, out, hold_ms))
        for out in outs
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(600)
    spans = sorted(
        tuple(map(int, line.split()))
        for out in outs
        for line in Path(out).read_text().splitlines()
    )
    # Only hand-overs to another process: a releaser that takes the lock
    # straight back is not a hand-over.
    return [
        (spans[i + 1][0] - spans[i][1]) / 1e6
        for i in range(len(spans) - 1)
        if spans[i + 1][0] >= spans[i][1] and spans[i + 1][2] != spans[i][2]
    ]


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def run_handover(directory: Path, holds: int, rounds: int) -> None:
    """The hand-over section: *rounds* interleaved runs of each, pooled."""
    print(
        f"\nHand-over to a waiting process, 4 processes, {holds} holds each, "
        f"{rounds} interleaved round(s), pooled (ms)"
    )
    print(f"{'case':34} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'n':>6}")
    cases = [
        ("resilient", "resilient.lock (sqlite + flock)"),
        ("filelock", "filelock.FileLock (poll 50 ms)"),
    ]
    gaps: dict[str, list[float]] = {kind: [] for kind, _ in cases}
    for r in range(rounds):
        for kind, _ in cases if r % 2 == 0 else cases[::-1]:
            count = holds if kind == "resilient" else max(holds // 4, 10)
            gaps[kind] += handover(kind, directory, 4, count)
    for kind, label in cases:
        got = gaps[kind]
        print(
            f"{label:34} {quantile(got, 0.5):8.3f} {quantile(got, 0.9):8.3f} "
            f"{quantile(got, 0.99):8.3f} {max(got):8.3f} {len(got):6}"
        )


def run_embedded(
    rounds: int, n: int, holds: int, handover_rounds: int = 1
) -> None:
    """Both embedded sections, printed as tables."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if rounds == 0:
            run_handover(directory, holds, handover_rounds)
            return
        cpu: dict[str, list[float]] = {}
        rates = interleave(embedded_uncontended(directory), rounds, n, cpu)
        peer = statistics.median(rates["filelock.FileLock"])
        floor = statistics.median(rates["raw SQLite UPSERT + DELETE"])
        print("\nEmbedded, uncontended acquire + release (one process)")
        print(
            f"{'case':34} {'median/s':>10} {'best/s':>10} "
            f"{'vs filelock':>12} {'vs raw SQLite':>14} {'per CPU s':>10}"
        )
        for name, values in rates.items():
            med = statistics.median(values)
            print(
                f"{name:34} {med:10,.0f} {max(values):10,.0f} "
                f"{med / peer:11.2f}x {med / floor:13.2f}x "
                f"{statistics.median(cpu[name]):10,.0f}"
            )
        run_handover(directory, holds, handover_rounds)


def main(argv: list[str] | None = None) -> None:
    """Run the embedded sections."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--handover-rounds",
        type=int,
        default=1,
        help="interleaved hand-over runs, pooled (default 1)",
    )
    parser.add_argument(
        "--handover-only",
        action="store_true",
        help="skip the uncontended section",
    )
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    n = 500 if args.quick else 2000
    holds = 50 if args.quick else 250
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"python {sys.version.split()[0]}, pid {os.getpid()}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    run_embedded(
        0 if args.handover_only else rounds, n, holds, args.handover_rounds
    )


if __name__ == "__main__":
    main()
