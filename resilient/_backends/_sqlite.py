"""
``sqlite:///path``: the embedded default, an SQLite file and a flock per name.

Safe across the processes and threads of one host, with the standard
library only. The row of a lease in the ``leases`` table grants it and mints
its fencing token in one UPSERT statement; the lease's expiry is on the
host's monotonic clock (``CLOCK_MONOTONIC``, one clock for every process of
one boot), stored with the boot id so that a reboot expires every lease.

Beside the row, a holder keeps ``flock(LOCK_EX)`` on the file
``<db>.locks/<sha256 of the name>.lock`` and the row records that it does.
A waiter blocks on that flock in a helper thread, so it wakes within
microseconds when the holder releases, or dies (the kernel drops a dead
process's flocks), instead of polling; and a process that holds the flock
may take over a row whose holder recorded the flock, because that holder
must be gone. The flock only ever wakes and proves death; the row grants
and fences.

Why the takeover is safe: the path's inode changes only when a holder of
that inode's flock unlinks it (at release), and a process that gets a flock
checks that its inode is still the path's, so while a holder that recorded
the flock lives, no one else can hold the flock of the path's inode.

URL: ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (as in
SQLAlchemy), with ``?synchronous=full`` to fsync every grant (power-loss
safe counters; ~10x slower) instead of WAL's ``NORMAL``. Under ``NORMAL`` a
power loss can drop the last transactions; fencing tokens still rise
because each is at least the wall-clock time in microseconds (unless the
wall clock went back across the reboot).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, final
from urllib.parse import parse_qs, unquote

from resilient._backends._base import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
)
from resilient.exceptions import ConfigError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


EXTRA: Final = None

#: Seconds a statement waits for another process's write lock.
BUSY_TIMEOUT: Final = 5.0

#: How long a free lease whose flock someone else holds (a waiter that is
#: about to take it) is left to that waiter before it is taken without the
#: flock (the flock's holder may be stopped), in nanoseconds.
CONTESTED_NS: Final = 50_000_000

#: Every this many grants, expired rows of other names are swept.
SWEEP_EVERY: Final = 256

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS leases (
        name TEXT PRIMARY KEY,
        owner BLOB NOT NULL,
        fence INTEGER NOT NULL,
        expires_ns INTEGER NOT NULL,
        boot TEXT NOT NULL,
        flocked INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS floor (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        fence INTEGER NOT NULL
    )""",
    "INSERT OR IGNORE INTO floor VALUES (0, 0)",
    # A deleted row's fence is folded into the floor in the same statement.
    """CREATE TRIGGER IF NOT EXISTS leases_floor AFTER DELETE ON leases
    BEGIN
        UPDATE floor SET fence = max(fence, old.fence) WHERE id = 0;
    END""",
)

# One statement grants and mints: fence = max(row + 1, floor + 1, wall µs).
_ACQUIRE: Final = """
INSERT INTO leases (name, owner, fence, expires_ns, boot, flocked)
VALUES (
    :name, :owner,
    max((SELECT fence FROM floor WHERE id = 0) + 1, :wall_us),
    :expires, :boot, :flocked
)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner,
    fence = max(leases.fence + 1, excluded.fence),
    expires_ns = excluded.expires_ns,
    boot = excluded.boot,
    flocked = excluded.flocked
WHERE leases.expires_ns <= :now OR leases.boot != :boot
    OR leases.owner = :owner OR (:flocked AND leases.flocked)
RETURNING fence
"""

_HOLDER: Final = "SELECT expires_ns, boot FROM leases WHERE name = ?"

_RENEW: Final = """
UPDATE leases SET expires_ns = :expires
WHERE name = :name AND owner = :owner AND boot = :boot AND expires_ns > :now
"""

_RELEASE: Final = """
DELETE FROM leases WHERE name = ? AND owner = ?
RETURNING expires_ns, boot
"""

_SWEEP: Final = """
DELETE FROM leases WHERE name IN (
    SELECT name FROM leases WHERE expires_ns <= ? OR boot != ? LIMIT 256
)
"""


def boot_id() -> str:
    """
    This boot's id: Linux's ``/proc/sys/kernel/random/boot_id``; elsewhere
    the wall-clock time of the boot in whole minutes (an approximation).
    """
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"boot@{round((time.time() - time.monotonic()) / 60)}"


def parse(url: str) -> tuple[Path, bool]:
    """The database path and whether to fsync every commit."""
    rest = url.partition("://")[2]
    path, _, query = rest.partition("?")
    if not path.startswith("/") or path == "/":
        raise ConfigError(
            "lock(backend)",
            "sqlite://",
            "needs a path: sqlite:///relative/file or sqlite:////absolute/file",
        )
    options = parse_qs(query)
    sync = options.pop("synchronous", ["normal"])[-1].lower()
    if options or sync not in {"normal", "full"}:
        raise ConfigError(
            "lock(backend)",
            "sqlite://",
            "takes only ?synchronous=normal or ?synchronous=full",
        )
    return Path(unquote(path[1:])), sync == "full"


@final
class _Name:
    """One name's flock state in this process (a waiter's wake-up)."""

    __slots__ = ("fd", "thread", "watchers")

    def __init__(self) -> None:
        self.fd: int | None = None
        """A flock this process holds for the name but no lease uses."""
        self.watchers: list[Callable[[], None]] = []
        self.thread: threading.Thread | None = None


@final
class SqliteBackend:
    """The embedded lease store (sync); one per database file per process."""

    scheme: Final = "sqlite"
    max_renew_batch: Final = 500

    def __init__(self, path: Path, *, durable: bool = False) -> None:
        self.path = path
        self.dir = Path(f"{path}.locks")
        self.durable = durable
        self.boot = boot_id()
        self._lock = threading.Lock()
        self._names: dict[bytes, _Name] = {}
        self._flocks: dict[bytes, tuple[int, Path]] = {}
        self._grants = 0
        self._contested: dict[bytes, int] = {}
        self._pid = 0
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"<SqliteBackend {str(self.path)!r}>"

    # -- the database --------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """The connection, made (again after a fork) on first use."""
        conn = self._conn
        if conn is not None and self._pid == os.getpid():
            return conn
        self._after_fork()
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(
            self.path,
            timeout=BUSY_TIMEOUT,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            f"PRAGMA synchronous={'FULL' if self.durable else 'NORMAL'}"
        )
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._conn = conn
        self._pid = os.getpid()
        return conn

    def _after_fork(self) -> None:
        """A forked child owns none of the parent's flocks or connection."""
        if self._pid and self._pid != os.getpid():
            # Closing our copies of the descriptors keeps the parent's
            # flocks (a flock lives while any descriptor of it is open).
            for fd, _ in self._flocks.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._flocks.clear()
            self._names.clear()
            self._lock = threading.Lock()
            self._conn = None

    # -- the flocks ------------------------------------------------------

    def _file(self, key: LockKey) -> Path:
        return self.dir / f"{key.hex}.lock"

    def _open_locked(self, path: Path, *, block: bool) -> int | None:
        """
        Open *path* and flock it (waiting if *block*); None if it is held.
        The inode is checked after the flock, so a file a releaser unlinked
        meanwhile is never the one held.
        """
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(
                    fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB)
                )
            except OSError as exc:
                os.close(fd)
                if exc.errno in {errno.EWOULDBLOCK, errno.EAGAIN}:
                    return None
                raise
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino  # noqa: PTH116
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # Unlinked under us: take the new file.

    def _take_flock(self, key: LockKey) -> int | None:
        """A flock of *key*'s file: one a waker got for us, or a new try."""
        with self._lock:
            state = self._names.get(key.digest)
            if state is not None and state.fd is not None:
                fd, state.fd = state.fd, None
                return fd
        try:
            return self._open_locked(self._file(key), block=False)
        except OSError:
            return None  # No lock directory access: rows still work.

    def _patient(self, key: LockKey, now: int) -> bool:
        """
        Whether this process has found *key* free but flocked by someone
        else for `CONTESTED_NS` already (the caller holds `_lock`).
        """
        contested = self._contested
        if len(contested) > 4096:
            contested.clear()
        first = contested.setdefault(key.digest, now)
        return now - first >= CONTESTED_NS

    def _park(self, key: LockKey, fd: int) -> None:
        """Keep a flock for this process's waiters, or let it go."""
        with self._lock:
            state = self._names.get(key.digest)
            if state is not None and state.watchers and state.fd is None:
                state.fd = fd
                return
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def _drop_flock(self, key: LockKey, owner: OwnerToken) -> None:
        """After a release: unlink the file (we hold it), then unlock."""
        with self._lock:
            held = self._flocks.pop(owner.secret, None)
        if held is None:
            return
        fd, path = held
        try:
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:  # noqa: PTH116
                    path.unlink()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- the protocol ------------------------------------------------------

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        conn = self._connection()
        fd = self._take_flock(key)
        try:
            now = time.monotonic_ns()
            with self._lock:
                if fd is None and not self._patient(key, now):
                    held = conn.execute(_HOLDER, (key.hex,)).fetchone()
                    if held is None:
                        # Free, but another process holds the flock: a
                        # waiter about to take it. Its turn, for a moment.
                        return Busy(expires_in=0.001)
                row = conn.execute(
                    _ACQUIRE,
                    {
                        "name": key.hex,
                        "owner": owner.secret,
                        "wall_us": time.time_ns() // 1000,
                        "expires": now + math.ceil(ttl * 1e9),
                        "boot": self.boot,
                        "flocked": fd is not None,
                        "now": now,
                    },
                ).fetchone()
                if row is None:
                    held = conn.execute(_HOLDER, (key.hex,)).fetchone()
                else:
                    self._contested.pop(key.digest, None)
                    if fd is not None:
                        self._flocks[owner.secret] = (fd, self._file(key))
                        fd = None
                    self._grants += 1
                    if self._grants % SWEEP_EVERY == 0:
                        conn.execute(_SWEEP, (now, self.boot))
        finally:
            if fd is not None:
                self._park(key, fd)
        if row is not None:
            return Grant(fence=row[0], ttl=ttl)
        if held is None or held[1] != self.boot:
            return Busy(expires_in=0.0)
        return Busy(expires_in=max(held[0] - now, 0) / 1e9)

    def renew(self, batch: Sequence[Renewal]) -> list[bool]:
        """See `LockBackend.renew`: one transaction for the batch."""
        conn = self._connection()
        done = []
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.monotonic_ns()
                for item in batch:
                    cursor = conn.execute(
                        _RENEW,
                        {
                            "expires": now + math.ceil(item.ttl * 1e9),
                            "name": item.key.hex,
                            "owner": item.owner.secret,
                            "boot": self.boot,
                            "now": now,
                        },
                    )
                    done.append(cursor.rowcount == 1)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return done

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        conn = self._connection()
        try:
            now = time.monotonic_ns()
            with self._lock:
                row = conn.execute(
                    _RELEASE, (key.hex, owner.secret)
                ).fetchone()
        finally:
            self._drop_flock(key, owner)
        if row is None or row[1] != self.boot or row[0] <= now:
            return ReleaseResult.NOT_HELD
        return ReleaseResult.RELEASED

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """
        Wake *notify* when *key*'s flock comes free: a helper thread per
        name (not per waiter) blocks on it.
        """
        with self._lock:
            state = self._names.get(key.digest)
            if state is None:
                state = self._names[key.digest] = _Name()
            state.watchers.append(notify)
            if state.thread is None and state.fd is None:
                state.thread = threading.Thread(
                    target=self._wake,
                    args=(key, state),
                    daemon=True,
                    name="resilient-lock-waker",
                )
                state.thread.start()

        def stop() -> None:
            fd = None
            with self._lock:
                if notify in state.watchers:
                    state.watchers.remove(notify)
                if not state.watchers:
                    fd, state.fd = state.fd, None
                    if state.thread is None:
                        self._names.pop(key.digest, None)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

        return stop

    def _wake(self, key: LockKey, state: _Name) -> None:
        """The waker: block on the flock, then hand it to the waiters."""
        try:
            fd = self._open_locked(self._file(key), block=True)
        except OSError:
            fd = None
        with self._lock:
            state.thread = None
            watchers = list(state.watchers)
            if watchers and fd is not None and state.fd is None:
                state.fd, fd = fd, None
            elif not watchers:
                self._names.pop(key.digest, None)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        for notify in watchers:
            notify()

    def close(self) -> None:
        """Close the connection; leases and their flocks stay."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


@final
class AsyncSqliteBackend:
    """
    The embedded store for async code: the sync store's calls, each run in
    a worker thread (`anyio.to_thread.run_sync`), never in the event loop.
    """

    scheme: Final = "sqlite"
    max_renew_batch: Final = SqliteBackend.max_renew_batch

    def __init__(self, sync: SqliteBackend) -> None:
        self.sync = sync

    def __repr__(self) -> str:
        return f"<AsyncSqliteBackend {str(self.sync.path)!r}>"

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        import anyio  # noqa: PLC0415

        return await anyio.to_thread.run_sync(
            self.sync.acquire, key, owner, ttl
        )

    async def renew(self, batch: Sequence[Renewal]) -> list[bool]:
        """See `LockBackend.renew`."""
        import anyio  # noqa: PLC0415

        return await anyio.to_thread.run_sync(self.sync.renew, batch)

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        import anyio  # noqa: PLC0415

        return await anyio.to_thread.run_sync(self.sync.release, key, owner)

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """See `LockBackend.watch`."""
        return self.sync.watch(key, notify)

    async def aclose(self) -> None:
        """Nothing of its own: the sync store is shared."""


_STORES: dict[tuple[Path, bool], SqliteBackend] = {}
_STORES_LOCK = threading.Lock()


def _store(url: str) -> SqliteBackend:
    path, durable = parse(url)
    path = path.absolute()
    with _STORES_LOCK:
        found = _STORES.get((path, durable))
        if found is None:
            found = _STORES[path, durable] = SqliteBackend(
                path, durable=durable
            )
        return found


def sync_backend(url: str) -> SqliteBackend:
    """The sync store of *url* (one per file per process)."""
    return _store(url)


def async_backend(url: str) -> AsyncSqliteBackend:
    """The async store of *url*: the sync one, called from worker threads."""
    return AsyncSqliteBackend(_store(url))
