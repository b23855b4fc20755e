"""
The embedded SQLite backend across threads and processes: forks, SIGKILL,
hand-over to a waiting process, the flock beside the row, lock-name
fuzzing, reboots. Real time, short and bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilient
from resilient._backends import Grant, LockKey, OwnerToken, open_backend
from resilient._backends import _sqlite as sqlite_backend
from resilient._backends._sqlite import _files as lock_files


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An embedded store in this test's own directory."""
    return f"sqlite:///{tmp_path / 'locks.sqlite3'}"


def start(code: str, url: str) -> subprocess.Popen[str]:
    """A Python child running *code* with ``URL`` set, lines on stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "URL": url}
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def expect(child: subprocess.Popen[str], line: str) -> None:
    """Wait (bounded by the child's own timeouts) for *line*."""
    assert child.stdout is not None
    got = child.stdout.readline().strip()
    assert got == line, (got, child.stderr.read() if child.stderr else "")


HOLDER = """
    import os, sys, time, resilient
    lease = resilient.lock("job", backend=os.environ["URL"], ttl=30).acquire()
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_killed_holder_is_replaced_at_once(url: str) -> None:
    """RELIABILITY test 2: a holder killed with SIGKILL (30 s TTL) is
    replaced on the next attempt: the kernel drops its flock, which wakes
    the waiter and proves the holder gone, long before the TTL."""
    child = start(HOLDER, url)
    try:
        expect(child, "held")
        lock = resilient.lock("job", backend=url, ttl=30, timeout=0.05)
        with pytest.raises(resilient.LockNotAcquired):
            lock.acquire()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        lease = resilient.lock("job", backend=url, timeout=5.0).acquire()
        assert lease.waited < 5.0
        lease.release()
    finally:
        child.kill()
        child.communicate(timeout=10)


def test_a_released_lock_wakes_a_waiting_process(url: str) -> None:
    """A process waiting for the lock (backoff 10 s, wait 20 s) is woken by
    the release through the flock, and its fence is the higher one."""
    waiter = start(
        """
        import os, resilient
        lock = resilient.lock(
            "job", backend=os.environ["URL"], timeout=20,
            backoff=resilient.Constant(seconds=10),
        )
        print("waiting", flush=True)
        with lock as lease:
            print(lease.token, flush=True)
        """,
        url,
    )
    try:
        lease = resilient.lock("job", backend=url).acquire()
        expect(waiter, "waiting")
        time.sleep(0.2)
        mine = lease.token
        lease.release()
        assert waiter.stdout is not None
        theirs = int(waiter.stdout.readline())
        assert theirs > mine
        assert waiter.wait(10) == 0
    finally:
        waiter.kill()
        waiter.communicate(timeout=10)


def test_a_forked_child_cannot_release_the_parents_lock(url: str) -> None:
    """RELIABILITY test 8: in a forked child the parent's lease is lost
    ("forked"), the child has no renewer, and its release sends nothing:
    the parent still holds the lock."""
    lock = resilient.lock("job", backend=url, ttl=30)
    with lock as lease:
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            detail = ""
            try:
                renewers = [
                    t
                    for t in __import__("threading").enumerate()
                    if t.name.startswith("resilient-lock-renewer")
                ]
                lost = lease.lost
                result = lease.release()
                ok = (
                    lost
                    and lease._record.reason == "forked"
                    and not renewers
                    and result is resilient.ReleaseResult.NOT_HELD
                )
                code = 0 if ok else 2
                detail = repr(
                    (lease.lost, lease._record.reason, renewers, result)
                )
            finally:
                os.write(write, bytes([code]) + detail.encode())
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        report = os.read(read, 1000)
        os.close(read)
        assert report[:1] == b"\x00", report
        assert lease.held
        busy = open_backend(url).acquire(LockKey.of("job"), OwnerToken(), 1.0)
        assert not isinstance(busy, Grant)


def test_same_thread_double_acquire_raises(url: str) -> None:
    """RELIABILITY test 8: entering a held lock again in the same thread
    raises rather than hangs (locks are not reentrant)."""
    with resilient.lock("job", backend=url):  # noqa: SIM117
        with pytest.raises(RuntimeError, match="not reentrant"):
            resilient.lock("job", backend=url).acquire()


def test_closing_another_descriptor_keeps_the_flock(url: str) -> None:
    """RELIABILITY test 8: opening and closing another descriptor of the
    lock file does not drop the holder's flock (flock, not POSIX fcntl
    locks), and the holder's file is the one at the path."""
    with resilient.lock("job", backend=url):
        backend = open_backend(url)
        path = backend.files.path(LockKey.of("job"))  # type: ignore[attr-defined]
        fd = os.open(path, os.O_RDWR)
        os.close(fd)
        probe = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
        ((held, ino, _),) = backend.files.held.values()  # type: ignore[attr-defined]
        assert os.fstat(held).st_ino == ino == os.stat(path).st_ino  # noqa: PTH116


def test_lock_files_stay_bounded_and_go_at_close(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock directory does not grow with the number of names ever used:
    a store keeps at most `FD_CACHE` lock files (their descriptors cached
    for the next hold), and closing it removes them."""
    monkeypatch.setattr(lock_files, "FD_CACHE", 4)
    for i in range(20):
        with resilient.lock(f"job-{i}", backend=url):
            pass
    backend = open_backend(url)
    assert len(list(backend.dir.iterdir())) == 4  # type: ignore[attr-defined]
    backend.close()
    assert list(backend.dir.iterdir()) == []  # type: ignore[attr-defined]


def test_a_hold_reuses_the_cached_descriptor(url: str) -> None:
    """Holding a lock again reuses the lock file's descriptor and inode
    (no open, unlink or close per hold)."""
    backend = open_backend(url)
    lock = resilient.lock("job", backend=url)
    seen = set()
    for _ in range(3):
        with lock:
            ((fd, ino, _),) = backend.files.held.values()  # type: ignore[attr-defined]
            seen.add((fd, ino))
    assert len(seen) == 1


def test_a_file_unlinked_while_cached_is_opened_again(url: str) -> None:
    """A cached descriptor whose file was unlinked meanwhile (another
    process evicted it) is not used: the next hold flocks the file now at
    the path, which a waiter opening the path would see."""
    backend = open_backend(url)
    lock = resilient.lock("job", backend=url)
    with lock:
        pass
    path = backend.files.path(LockKey.of("job"))  # type: ignore[attr-defined]
    os.unlink(path)  # noqa: PTH108
    with lock:
        ((fd, ino, _),) = backend.files.held.values()  # type: ignore[attr-defined]
        assert os.stat(path).st_ino == ino == os.fstat(fd).st_ino  # noqa: PTH116
        probe = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)


def test_eviction_keeps_a_file_someone_holds(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached descriptor evicted while another descriptor holds the file's
    flock (another process's holder) is closed without unlinking the file,
    so that holder's flock stays the one at the path."""
    monkeypatch.setattr(lock_files, "FD_CACHE", 1)
    backend = open_backend(url)
    with resilient.lock("a", backend=url):
        pass
    path = backend.files.path(LockKey.of("a"))  # type: ignore[attr-defined]
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with resilient.lock("b", backend=url):  # Evicts "a".
            pass
        assert os.stat(path).st_ino == os.fstat(other).st_ino  # noqa: PTH116
    finally:
        os.close(other)
    assert not backend.files.fds.get(LockKey.of("a").digest)  # type: ignore[attr-defined]


def test_a_lease_from_an_earlier_boot_is_expired(url: str) -> None:
    """Expiry is on the monotonic clock of one boot: a row written under
    another boot id is expired, whatever its time says."""
    backend = open_backend(url)
    key = LockKey.of("job")
    assert isinstance(backend.acquire(key, OwnerToken(), 30.0), Grant)
    path = backend.path  # type: ignore[attr-defined]
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE leases SET boot = 'an-earlier-boot', flocked = 0")
    assert isinstance(backend.acquire(key, OwnerToken(), 30.0), Grant)


def test_the_url_needs_a_path() -> None:
    """``sqlite://`` without a path, or with an unknown option, is refused
    at construction."""
    with pytest.raises(resilient.ConfigError, match="needs a path"):
        sqlite_backend.parse("sqlite://")
    with pytest.raises(resilient.ConfigError, match="synchronous"):
        sqlite_backend.parse("sqlite:///x.db?journal=off")
    assert sqlite_backend.parse("sqlite:///x.db?synchronous=full") == (
        Path("x.db"),
        True,
    )
    assert sqlite_backend.parse("sqlite:////tmp/x.db")[0] == Path("/tmp/x.db")  # noqa: S108


NAMES = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec=None, categories=None)),
    st.sampled_from(
        [
            "",
            "\0",
            "../../etc/passwd",
            "/etc/passwd",
            "{tag}",
            "*?[]",
            "'; DROP TABLE leases; --",
            "\u00e9t\u00e9",
            "e\u0301te\u0301",
            "\ud800",
            "x" * 1_000_000,
        ]
    ),
)


@settings(max_examples=300, deadline=None, database=None)
@given(name=NAMES)
def test_names_map_to_safe_keys(name: str) -> None:
    """RELIABILITY test 9: any str (unicode, lone surrogates, NUL, 1 MB,
    glob, SQL, paths) maps to 64 hex digits, a file name that stays in the
    lock directory."""
    key = LockKey.of(name)
    assert len(key.hex) == 64
    assert set(key.hex) <= set("0123456789abcdef")
    lock_dir = Path("/locks")
    assert (lock_dir / f"{key.hex}.lock").parent == lock_dir


def test_ten_thousand_names_never_collide() -> None:
    """RELIABILITY test 9: 10,000 random names (any code point, lone
    surrogates included, lengths up to 300) and their NFC/NFD twins give
    distinct keys, and distinct 64-bit keys too (for PostgreSQL)."""
    import random
    import unicodedata

    rng = random.Random(9)
    names: set[str] = set()
    while len(names) < 10_000:
        size = rng.choice([0, 1, 2, 5, 20, 300])
        name = "".join(chr(rng.randrange(0x110000)) for _ in range(size))
        names.add(name)
        names.add(unicodedata.normalize("NFD", "\u00e9t\u00e9" + name))
        names.add(unicodedata.normalize("NFC", "\u00e9t\u00e9" + name))
    keys = {LockKey.of(n).hex for n in names}
    assert len(keys) == len(names)
    assert len({LockKey.of(n).int64 for n in names}) == len(names)


def test_fuzzed_names_stay_in_the_lock_directory(url: str) -> None:
    """Acquiring locks with hostile names creates files only inside the
    lock directory (realpath check), and each name locks on its own."""
    names = [
        "../../escape",
        "/abs",
        "\0nul",
        "\ud800",
        "{x}",
        "a/b",
        "x" * 5000,
    ]
    backend = open_backend(url)
    backend._connection()  # type: ignore[attr-defined]
    base = Path(url.removeprefix("sqlite:///")).parent
    before = {p.resolve() for p in base.rglob("*")}
    leases = [resilient.lock(n, backend=url).acquire() for n in names]
    created = {p.resolve() for p in base.rglob("*")} - before
    lock_dir = backend.dir.resolve()  # type: ignore[attr-defined]
    assert created
    outside = [p for p in created if p.is_file() and p.parent != lock_dir]
    assert outside == []
    assert len({lease.token for lease in leases}) == len(names)
    for lease in leases:
        lease.release()


def test_the_shells_on_the_embedded_store(url: str) -> None:
    """``with`` and ``async with`` (asyncio and trio) on the embedded store:
    a lease with a rising token each time, the store's calls made from
    worker threads in async code, nothing left behind."""
    import anyio

    lock = resilient.lock("job", backend=url, ttl=5)
    tokens = []
    with lock as lease:
        tokens.append(lease.token)

    async def main() -> None:
        async with lock as lease:
            tokens.append(lease.token)
            await anyio.lowlevel.checkpoint()

    anyio.run(main, backend="asyncio")
    anyio.run(main, backend="trio")
    assert tokens == sorted(set(tokens))
    path = open_backend(url).path  # type: ignore[attr-defined]
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        held = "SELECT count(*) FROM leases WHERE expires_ns != 0"
        assert db.execute(held).fetchone() == (0,)


def test_exit_releases_leases_no_thread_still_uses(url: str) -> None:
    """At interpreter exit, a lease the main thread took by hand and never
    released is released (its row is free at once, not after its 30 s TTL),
    while one a daemon thread still holds is left to expire, and the lock
    files nobody uses are removed."""
    code = """
    import os, threading, resilient
    url = os.environ["URL"]
    resilient.lock("main", backend=url, ttl=30).acquire()
    held = threading.Event()
    def daemon():
        with resilient.lock("daemon", backend=url, ttl=30):
            held.set()
            threading.Event().wait()
    threading.Thread(target=daemon, daemon=True).start()
    held.wait(10)
    print("exiting", flush=True)
    """
    child = start(code, url)
    out, err = child.communicate(timeout=30)
    assert (out.strip(), child.returncode) == ("exiting", 0), err
    path = Path(url.removeprefix("sqlite:///"))
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        rows = dict(db.execute("SELECT name, expires_ns FROM leases"))
    assert rows[LockKey.of("main").hex] == 0  # Released.
    assert rows[LockKey.of("daemon").hex] > time.monotonic_ns()  # Left.
    lock_dir = Path(f"{path}.locks")
    assert [p.name for p in lock_dir.iterdir()] == [
        f"{LockKey.of('daemon').hex}.lock"
    ]


def test_a_cached_descriptor_of_a_file_someone_holds_is_kept(url: str) -> None:
    """While another descriptor holds a free lock's flock (another process's
    waiter, about to take the row), a try from this process, which has the
    file's descriptor cached, is refused and keeps the descriptor; once the
    flock is let go the next try takes the lock with it."""
    backend = open_backend(url)
    lock = resilient.lock("job", backend=url, blocking=False)
    with lock:
        pass
    path = backend.files.path(LockKey.of("job"))  # type: ignore[attr-defined]
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(resilient.LockNotAcquired):
            lock.acquire()
        assert LockKey.of("job").digest in backend.files.fds  # type: ignore[attr-defined]
    finally:
        os.close(other)
    with lock as lease:
        assert lease.held
