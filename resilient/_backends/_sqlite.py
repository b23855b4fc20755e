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

Why the takeover is safe: the path's inode changes only when a process that
holds that inode's flock unlinks it, and a process that gets a flock checks
that its inode is still the path's, so while a holder that recorded the
flock lives, no one else can hold the flock of the path's inode.

The costs of an uncontended acquire + release, kept low: each process keeps
the descriptors of the lock files it used lately open, unlocked, in a
bounded cache (`FD_CACHE` per store), so a hold is one ``flock`` and one
``stat`` to take the file and one ``flock`` to let it go, instead of an
open, an unlink and a close; a file is unlinked only when its descriptor
leaves the cache (or the store is closed, or the process exits), under its
flock and after the inode check, so no waiter is ever left holding an
unlinked file that the next holder would not see. A process killed with
``SIGKILL`` leaves at most `FD_CACHE` empty files, which the next user of
those names reuses. A release marks the row free (``expires_ns = 0``, one
``UPDATE`` on the primary key) instead of deleting it: the next grant of the
name reuses the row, and the sweep (every `SWEEP_EVERY` grants) deletes free
and expired rows, folding their fences into the floor, so the table holds
the live leases plus at most about `SWEEP_EVERY` free rows. Statements take
positional parameters (binding a dict of names costs more than the rest of
the call) and are prepared once by `sqlite3`'s statement cache.

URL: ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (as in
SQLAlchemy), with ``?synchronous=full`` to fsync every grant (power-loss
safe counters; ~10x slower) instead of WAL's ``NORMAL``. Under ``NORMAL`` a
power loss can drop the last transactions; fencing tokens still rise
because each is at least the wall-clock time in microseconds (unless the
wall clock went back across the reboot).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import math
import os
import sqlite3
import threading
import time
from collections import OrderedDict
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

#: Every this many grants, free and expired rows of other names are swept.
SWEEP_EVERY: Final = 256

#: How many unlocked lock-file descriptors a store keeps open for reuse.
FD_CACHE: int = 64

#: The page size of a new database: a grant or a release writes one page
#: to the WAL, and a small page costs less to checksum and write.
PAGE_SIZE: Final = 1024

#: Bytes of the database file read through ``mmap`` instead of ``read``.
MMAP_SIZE: Final = 1 << 23

# This process's id, kept by an at-fork hook (a hold does not ask the OS).
_PID = os.getpid()

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
# ?1 name, ?2 owner, ?3 wall-clock µs, ?4 expiry, ?5 boot, ?6 flocked,
# ?7 now (monotonic ns).
_ACQUIRE: Final = """
INSERT INTO leases (name, owner, fence, expires_ns, boot, flocked)
VALUES (
    ?1, ?2, max((SELECT fence FROM floor WHERE id = 0) + 1, ?3), ?4, ?5, ?6
)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner,
    fence = max(leases.fence + 1, excluded.fence),
    expires_ns = excluded.expires_ns,
    boot = excluded.boot,
    flocked = excluded.flocked
WHERE leases.expires_ns <= ?7 OR leases.boot != ?5
    OR leases.owner = ?2 OR (?6 AND leases.flocked)
RETURNING fence
"""

_HOLDER: Final = "SELECT expires_ns, boot FROM leases WHERE name = ?"

# ?1 expiry, ?2 name, ?3 owner, ?4 boot, ?5 now.
_RENEW: Final = """
UPDATE leases SET expires_ns = ?1
WHERE name = ?2 AND owner = ?3 AND boot = ?4 AND expires_ns > ?5
"""

# A released row is marked free (expires_ns = 0) and kept for the next grant
# of the name; the sweep deletes it. Only a lease still ours and unexpired
# counts as released.
_RELEASE: Final = """
UPDATE leases SET expires_ns = 0
WHERE name = ? AND owner = ? AND expires_ns > ? AND boot = ?
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
        self.fd: tuple[int, int] | None = None
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
        self._files = f"{self.dir}/"
        self.durable = durable
        self.boot = boot_id()
        self._lock = threading.Lock()
        self._names: dict[bytes, _Name] = {}
        # Held flocks by owner secret: (descriptor, inode, key digest).
        self._flocks: dict[bytes, tuple[int, int, bytes]] = {}
        # Unlocked descriptors kept for reuse, by key digest, oldest first.
        self._fds: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
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
        if conn is not None and self._pid == _PID:
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
        # Only a new, empty file takes the page size (before WAL mode).
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA mmap_size={MMAP_SIZE}")
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
            fds = [held[0] for held in self._flocks.values()]
            fds += [cached[0] for cached in self._fds.values()]
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._flocks.clear()
            self._fds.clear()
            self._names.clear()
            self._lock = threading.Lock()
            self._conn = None

    # -- the flocks ------------------------------------------------------

    def _file(self, key: LockKey) -> str:
        return f"{self._files}{key.hex}.lock"

    def _open_locked(
        self, path: str, *, block: bool
    ) -> tuple[int, int] | None:
        """
        Open *path* and flock it (waiting if *block*): the descriptor and
        its inode, or None if it is held. The inode is checked after the
        flock, so a file unlinked meanwhile is never the one held.
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
            ino = os.fstat(fd).st_ino
            if _inode(path) == ino:
                return fd, ino
            os.close(fd)  # Unlinked under us: take the new file.

    def _take_flock(self, key: LockKey) -> tuple[int, int] | None:
        """
        A flock of *key*'s file: one a waker got for us, a cached
        descriptor locked again, or a newly opened one; None if held.
        """
        with self._lock:
            state = self._names.get(key.digest)
            if state is not None and state.fd is not None:
                taken, state.fd = state.fd, None
                return taken
            cached = self._fds.pop(key.digest, None)
        path = self._file(key)
        try:
            if cached is not None:
                fd, ino = cached
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in {errno.EWOULDBLOCK, errno.EAGAIN}:
                        raise  # pragma: no cover - flock on a valid fd
                    self._cache(key.digest, fd, ino)
                    return None
                except BaseException:
                    os.close(fd)
                    raise
                if _inode(path) == ino:
                    return fd, ino
                os.close(fd)  # Unlinked since: the path is a new file.
            return self._open_locked(path, block=False)
        except OSError:
            return None  # No lock directory access: rows still work.

    def _cache(self, digest: bytes, fd: int, ino: int) -> None:
        """Keep an unlocked descriptor for reuse; evict the oldest."""
        evicted = []
        with self._lock:
            old = self._fds.pop(digest, None)
            if old is not None:
                evicted.append((digest, *old))
            self._fds[digest] = (fd, ino)
            while len(self._fds) > FD_CACHE:
                oldest, (old_fd, old_ino) = self._fds.popitem(last=False)
                evicted.append((oldest, old_fd, old_ino))
        for gone, gone_fd, gone_ino in evicted:
            self._evict(gone, gone_fd, gone_ino)

    def _evict(self, digest: bytes, fd: int, ino: int) -> None:
        """
        Close a cached descriptor, unlinking its file if nobody holds or
        waits for it: under its flock, and only if it is still the path's.
        """
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # Held by someone: the file is theirs to keep.
            return
        try:
            path = f"{self.dir}/{digest.hex()}.lock"
            if _inode(path) == ino:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # noqa: PTH108
        finally:
            os.close(fd)  # Closing drops the flock.

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

    def _park(self, key: LockKey, flock: tuple[int, int]) -> None:
        """Keep a flock for this process's waiters, or let it go."""
        with self._lock:
            state = self._names.get(key.digest)
            if state is not None and state.watchers and state.fd is None:
                state.fd = flock
                return
        fcntl.flock(flock[0], fcntl.LOCK_UN)
        self._cache(key.digest, *flock)

    def _drop_flock(self, secret: bytes) -> None:
        """After a release: unlock the file and keep its descriptor."""
        with self._lock:
            held = self._flocks.pop(secret, None)
            if held is None:
                return
            fd, ino, digest = held
            fcntl.flock(fd, fcntl.LOCK_UN)
            fds = self._fds
            if digest not in fds and len(fds) < FD_CACHE:
                fds[digest] = (fd, ino)  # Room in the cache: no eviction.
                return
        self._cache(digest, fd, ino)

    def _clear_cache(self) -> None:
        """Close every cached descriptor, unlinking the files nobody uses."""
        with self._lock:
            if self._pid != os.getpid():
                return  # A forked child's copies: `_after_fork` drops them.
            cached = list(self._fds.items())
            self._fds.clear()
        for digest, (fd, ino) in cached:
            self._evict(digest, fd, ino)

    # -- the protocol ------------------------------------------------------

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        conn = self._connection()
        flock = self._take_flock(key)
        held = None
        try:
            now = time.monotonic_ns()
            with self._lock:
                if flock is None and not self._patient(key, now):
                    held = conn.execute(_HOLDER, (key.hex,)).fetchone()
                    if held is None or held[0] == 0:
                        # Free, but another process holds the flock: a
                        # waiter about to take it. Its turn, for a moment.
                        return Busy(expires_in=0.001)
                row = conn.execute(
                    _ACQUIRE,
                    (
                        key.hex,
                        owner.secret,
                        time.time_ns() // 1000,
                        now + math.ceil(ttl * 1e9),
                        self.boot,
                        flock is not None,
                        now,
                    ),
                ).fetchone()
                if row is None:
                    held = conn.execute(_HOLDER, (key.hex,)).fetchone()
                else:
                    if self._contested:
                        self._contested.pop(key.digest, None)
                    if flock is not None:
                        self._flocks[owner.secret] = (*flock, key.digest)
                        flock = None
                    self._grants += 1
                    if self._grants % SWEEP_EVERY == 0:
                        conn.execute(_SWEEP, (now, self.boot))
        finally:
            if flock is not None:
                self._park(key, flock)
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
                        (
                            now + math.ceil(item.ttl * 1e9),
                            item.key.hex,
                            item.owner.secret,
                            self.boot,
                            now,
                        ),
                    )
                    done.append(cursor.rowcount == 1)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return done

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        conn = self._conn
        if conn is None or self._pid != _PID:
            conn = self._connection()
        secret = owner.secret
        try:
            with self._lock:
                count = conn.execute(
                    _RELEASE, (key.hex, secret, time.monotonic_ns(), self.boot)
                ).rowcount
        finally:
            self._drop_flock(secret)
        return ReleaseResult.RELEASED if count == 1 else ReleaseResult.NOT_HELD

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
                fcntl.flock(fd[0], fcntl.LOCK_UN)
                self._cache(key.digest, *fd)

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
            fcntl.flock(fd[0], fcntl.LOCK_UN)
            self._cache(key.digest, *fd)
        for notify in watchers:
            notify()

    def close(self) -> None:
        """
        Close the connection and the cached descriptors (unlinking the
        files nobody uses); leases and their flocks stay.
        """
        self._clear_cache()
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


def _inode(path: str) -> int | None:
    """The inode of *path*, or None if there is no such file."""
    try:
        return os.stat(path).st_ino  # noqa: PTH116
    except FileNotFoundError:
        return None


_STORES: dict[tuple[Path, bool], SqliteBackend] = {}
_STORES_LOCK = threading.Lock()


@atexit.register
def _tidy_at_exit() -> None:
    """Remove the lock files this process cached and nobody else uses."""
    for store in list(_STORES.values()):
        with contextlib.suppress(Exception):
            store._clear_cache()  # noqa: SLF001


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


def _forked() -> None:
    """In a forked child: the stores see the new process id."""
    global _PID  # noqa: PLW0603 - one per process
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_forked)
