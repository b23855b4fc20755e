"""
The fenced-lock checker (RELIABILITY.md test 1), one harness for every
backend URL.

Eight worker processes take one lock over and over (``resilient.lock``, a
short TTL, renewal on). Each holder writes ``begin`` and ``end`` with its
fencing token to a *resource* that accepts a write only if its token is at
least the highest accepted so far (a stale holder is refused). Meanwhile
the checker freezes the current holder with ``SIGSTOP`` for 1.2 to 3 TTLs at
random, then lets it go on (``SIGCONT``). Given a way to pause the store
(`Settings.pause_backend`: ``SIGSTOP`` a server, or hold an embedded
store's database locked), it also freezes the store for one TTL at every
tenth freeze of a holder (the third, the thirteenth...), from the moment
the holder stops.

It then checks, from the resource's log and the workers' own records:

* every grant had its own token (fences never repeat, so never go back);
* no accepted write of another process falls between a holder's accepted
  ``begin`` and ``end`` (no two accepted critical sections overlap);
* a holder overtaken inside its block that we did not freeze (the machine
  stalled it past its TTL) got `LockLost`: never two unknowing believers;
* at least one stale write was refused (else the run proved nothing);
* every holder frozen past its TTL got `LockLost` once it ran again (after
  SIGCONT, and once the machine scheduled it), within a renewal interval
  plus 100 ms.

Workers run as ``python -m tests.lockcheck URL FILE ...`` (see `worker`).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from collections.abc import Callable


ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Settings:
    """How big a run is."""

    url: str
    processes: int = 8
    grants: int = 2000
    ttl: float = 0.3
    seconds: float = 60.0
    pause_every: tuple[float, float] = (0.4, 0.8)
    pause_ttls: tuple[float, float] = (1.2, 3.0)
    name: str = "lockcheck"
    #: Pauses the store now and returns what resumes it (or None: never).
    pause_backend: Callable[[], Callable[[], None]] | None = None
    #: One holder freeze in this many also freezes the store for one TTL.
    backend_every: int = 10

    @property
    def renew_interval(self) -> float:
        return self.ttl / 3


@dataclass
class Report:
    """What a run saw; `problems` is empty when it passed."""

    grants: int = 0
    accepted: int = 0
    stale: int = 0
    pauses: int = 0
    backend_pauses: int = 0
    holder_pauses: int = 0
    lost_seen: int = 0
    worst_lost_delay: float = 0.0
    not_acquired: int = 0
    stalls: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


# The resource ----------------------------------------------------------------


class Resource:
    """
    A fenced resource on a Unix socket, served by one thread: requests are
    lines ``op token pid``, the answer is ``1`` (accepted) or ``0``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log: list[tuple[str, int, int, bool, float]] = []
        self.highest = -1
        self.holder: tuple[int, int] | None = None  # (pid, token) after begin
        self.begins = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(64)
        self._sock.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _write(self, op: str, token: int, pid: int) -> bool:
        ok = token >= self.highest
        if ok:
            self.highest = token
            if op == "begin":
                self.holder = (pid, token)
            elif self.holder == (pid, token):
                self.holder = None
        if op == "begin":
            self.begins += 1
        self.log.append((op, token, pid, ok, time.monotonic()))
        return ok

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        buffers: dict[socket.socket, bytes] = {}
        while not self._stop.is_set():
            for key, _ in sel.select(0.05):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if sock is self._sock:
                    conn, _ = sock.accept()
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ)
                    buffers[conn] = b""
                    continue
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sock)
                    sock.close()
                    buffers.pop(sock, None)
                    continue
                buffers[sock] += data
                while b"\n" in buffers[sock]:
                    line, buffers[sock] = buffers[sock].split(b"\n", 1)
                    op, token, pid = line.decode().split()
                    ok = self._write(op, int(token), int(pid))
                    sock.sendall(b"1\n" if ok else b"0\n")
        sel.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


# The worker ------------------------------------------------------------------


def worker(argv: list[str]) -> None:
    """
    One contender: ``URL RESOURCE STOPFILE OUTFILE TTL SEED NAME``. Takes
    the lock until STOPFILE exists, writes its records to OUTFILE as JSON:
    ``[token, acquired_at, body_end, lost_at, woke_at]`` per grant
    (monotonic times; woke_at is when its sleep in the block returned;
    the last three may be null), and a count of waits that ran out.
    """
    import resilient
    from resilient.exceptions import LockLost, LockNotAcquired

    url, resource, stopfile, outfile, ttl_s, seed, name = argv
    ttl = float(ttl_s)
    rng = random.Random(int(seed))
    stop = Path(stopfile)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(resource)
    reader = sock.makefile("rb")
    pid = os.getpid()

    def write(op: str, token: int) -> bool:
        sock.sendall(f"{op} {token} {pid}\n".encode())
        return reader.readline().strip() == b"1"

    lock = resilient.lock(
        name,
        backend=url,
        ttl=ttl,
        renew_interval=ttl / 3,
        timeout=10.0,
        backoff=resilient.FullJitter(base=0.002, cap=0.02),
    )
    records: list[list[Any]] = []
    not_acquired = 0
    while not stop.exists():
        record: list[Any] = [None, None, None, None, None]
        try:
            with lock as lease:
                record[:2] = [lease.token, time.monotonic()]
                records.append(record)
                write("begin", lease.token)
                time.sleep(rng.uniform(0.0, 0.01))
                record[4] = time.monotonic()  # running again
                write("end", lease.token)
                record[2] = time.monotonic()
                lease.checkpoint()
        except LockLost:
            record[3] = time.monotonic()
        except LockNotAcquired:
            not_acquired += 1
    Path(outfile).write_text(
        json.dumps({"records": records, "not_acquired": not_acquired})
    )


# The checker -----------------------------------------------------------------


def run(settings: Settings) -> Report:
    """Run the checker on *settings.url*; see the module's docstring."""
    report = Report()
    folder = Path(tempfile.mkdtemp(prefix="lockcheck-"))
    resource = Resource(folder / "resource.sock")
    stopfile = folder / "stop"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    procs = [
        subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-m",
                "tests.lockcheck",
                settings.url,
                str(resource.path),
                str(stopfile),
                str(folder / f"worker{i}.json"),
                str(settings.ttl),
                str(i),
                settings.name,
            ],
            env=env,
            cwd=ROOT,
        )
        for i in range(settings.processes)
    ]
    pauses: list[
        tuple[int, float, float, bool]
    ] = []  # pid, stop, cont, holder
    rng = random.Random(20261201)
    start = time.monotonic()
    try:
        while resource.begins < settings.grants:
            if time.monotonic() - start > settings.seconds:
                report.problems.append(
                    f"only {resource.begins} grants in "
                    f"{settings.seconds:.0f} s"
                )
                break
            if any(p.poll() is not None for p in procs):
                report.problems.append("a worker died")
                break
            time.sleep(rng.uniform(*settings.pause_every))
            holder = resource.holder
            if holder is None:
                continue
            pauses.append(
                _freeze(settings, holder[0], rng, len(pauses), report)
            )
    finally:
        stopfile.touch()
        for p in procs:
            os.kill(p.pid, signal.SIGCONT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                report.problems.append(f"worker {p.pid} did not stop")
        resource.close()
    report.seconds = time.monotonic() - start
    results = {}
    for i, p in enumerate(procs):
        out = folder / f"worker{i}.json"
        if out.exists():
            results[p.pid] = json.loads(out.read_text())
        else:
            report.problems.append(f"worker {p.pid} left no results")
    _check(settings, resource, results, pauses, report)
    return report


def _freeze(
    settings: Settings,
    pid: int,
    rng: random.Random,
    count: int,
    report: Report,
) -> tuple[int, float, float, bool]:
    """
    Freeze the holder *pid* for 1.2 to 3 TTLs; at one freeze in
    `Settings.backend_every` (the third, the thirteenth...), freeze the
    store too, for one TTL from the same moment.
    """
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    frozen = settings.ttl * rng.uniform(*settings.pause_ttls)
    if (
        settings.pause_backend is not None
        and count % settings.backend_every == 2
    ):
        resume = settings.pause_backend()
        try:
            time.sleep(settings.ttl)
        finally:
            resume()
        report.backend_pauses += 1
        frozen -= time.monotonic() - stopped
    time.sleep(max(frozen, 0.0))
    os.kill(pid, signal.SIGCONT)
    return (pid, stopped, time.monotonic(), True)


def _check(  # noqa: PLR0912 - one pass per property
    settings: Settings,
    resource: Resource,
    results: dict[int, Any],
    pauses: list[tuple[int, float, float, bool]],
    report: Report,
) -> None:
    tokens = [
        r[0]
        for res in results.values()
        for r in res["records"]
        if r[0] is not None
    ]
    report.grants = len(tokens)
    report.not_acquired = sum(res["not_acquired"] for res in results.values())
    if len(set(tokens)) != len(tokens):
        report.problems.append("two grants carried the same fencing token")
    accepted = [(op, t, pid) for op, t, pid, ok, _ in resource.log if ok]
    report.accepted = len(accepted)
    report.stale = sum(1 for *_, ok, _ in resource.log if not ok)
    if any(b[1] < a[1] for a, b in itertools.pairwise(accepted)):
        report.problems.append("an accepted write carried a lower token")
    accepted_at = [
        (op, t, pid, at) for op, t, pid, ok, at in resource.log if ok
    ]
    # (pid, token) -> when that grant's holder got LockLost (or None).
    by_grant = {
        (pid, r[0]): r[3]
        for pid, res in results.items()
        for r in res["records"]
    }
    open_section: tuple[int, int, float] | None = None
    for op, token, pid, at in accepted_at:
        if open_section is not None and open_section[:2] != (pid, token):
            holder, _, began = open_section
            if op != "begin":
                report.problems.append(
                    f"write of {pid} inside the accepted section of {holder}"
                )
            elif not any(
                p == holder and began <= stopped <= at
                for p, stopped, _, _ in pauses
            ):
                # Not frozen by us, yet its lease ran out: the machine
                # stalled it past its TTL (a pause all the same). Fine if
                # it was told (LockLost); two believers if it was not.
                report.stalls += 1
                if by_grant.get(open_section[:2]) is None:
                    report.problems.append(
                        f"{pid} was granted the lock while {holder} was "
                        "inside its block, and it never got LockLost"
                    )
            open_section = None
        if op == "begin":
            open_section = (pid, token, at)
        elif open_section is not None and open_section[:2] == (pid, token):
            open_section = None
    if report.stale == 0:
        report.problems.append("no stale write was refused: proved nothing")
    report.pauses = len(pauses)
    bound = settings.renew_interval + 0.1
    for pid, stopped, cont, _ in pauses:
        if cont - stopped <= settings.ttl:
            continue
        record = next(
            (
                r
                for r in results.get(pid, {"records": []})["records"]
                if r[1] is not None
                and r[1] <= stopped
                and (r[2] is None or stopped < r[2])
            ),
            None,
        )
        if record is None:
            continue  # it had left its block before the signal landed
        report.holder_pauses += 1
        if record[3] is None:
            report.problems.append(
                f"holder {pid} frozen {cont - stopped:.2f} s never got "
                "LockLost"
            )
            continue
        report.lost_seen += 1
        # From when it ran again: SIGCONT, or later if the loaded machine
        # left it unscheduled for a while after that.
        resumed = max(cont, record[4] or cont)
        delay = record[3] - resumed
        report.worst_lost_delay = max(report.worst_lost_delay, delay)
        if delay > bound:
            report.problems.append(
                f"holder {pid} got LockLost {delay * 1000:.0f} ms after it "
                f"resumed (bound {bound * 1000:.0f} ms)"
            )


if __name__ == "__main__":
    worker(sys.argv[1:])
