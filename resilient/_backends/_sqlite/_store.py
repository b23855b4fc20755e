"""
The embedded lease store: the row of a lease grants it and mints its
fencing token (`resilient._backends._sqlite._schema`), the flock beside it
wakes waiters and proves death (`resilient._backends._sqlite._files`, and
`._waiter` for a sync waiter).

A release marks the row free (``expires_ns = 0``, one ``UPDATE`` on the
primary key) instead of deleting it: the next grant of the name reuses the
row, and the sweep (every `SWEEP_EVERY` grants) deletes free and expired
rows, folding their fences into the floor, so the table holds the live
leases plus at most about `SWEEP_EVERY` free rows.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, final

from resilient._backends._base import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
)
from resilient._backends._sqlite._files import (
    CONTESTED_NS,
    LockFiles,
    close_inherited,
)
from resilient._backends._sqlite._safe import (
    Unsafe,
    failure,
    same_files,
    store_files,
)
from resilient._backends._sqlite._schema import (
    ACQUIRE,
    BUSY_TIMEOUT,
    HOLDER,
    MMAP_SIZE,
    PAGE_SIZE,
    RELEASE,
    RENEW,
    SCHEMA,
    SWEEP,
    SWEEP_EVERY,
    boot_id,
    numbered,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._sqlite._waiter import Waiter


# This process's id, kept by an at-fork hook (a hold does not ask the OS).
_PID = os.getpid()


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
        self.files = LockFiles(str(self.dir))
        self._grants = 0
        self._pid = 0
        self._conn: sqlite3.Connection | None = None
        self._ids: tuple[tuple[int, int], ...] | None = None

    def __repr__(self) -> str:
        return f"<SqliteBackend {str(self.path)!r}>"

    def _connection(self) -> sqlite3.Connection:
        """The connection, made (again after a fork) on first use."""
        conn = self._conn
        if conn is not None and self._pid == _PID:
            return conn
        if self._pid and self._pid != os.getpid():
            # A forked child owns none of the parent's flocks or connection.
            self.files.after_fork()
            self._conn = None
        try:
            return self._connect()
        except Exception as exc:
            raise failure(self.path, exc) from exc

    def _connect(self) -> sqlite3.Connection:
        """Check and open the files (`._safe`), then the database."""
        db = str(self.path)
        parent = self.path.parent
        if not parent.is_dir():
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        store_files(db)  # Made or checked, links refused, before SQLite.
        self.files.open()
        conn = sqlite3.connect(
            db,
            timeout=BUSY_TIMEOUT,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._ids = _prepare(conn, db, durable=self.durable)
        except BaseException:
            conn.close()  # Not left to the collector (a ResourceWarning).
            raise
        self._conn = conn
        self._pid = os.getpid()
        return conn

    def _moved(self) -> bool:
        """
        Whether the database, its -wal or -shm were removed or replaced
        since this process opened them (the caller holds the files' lock):
        then the next statement opens the new files.
        """
        ids = same_files(str(self.path))
        if ids == self._ids:
            return False
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # A statement of another thread retries.
        return True

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        try:
            return self._acquire(key, owner, ttl)
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise failure(self.path, exc) from exc

    def _acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        conn = self._connection()
        files = self.files
        flock = files.take(key)
        held = None
        try:
            now = time.monotonic_ns()
            with files.lock:
                if flock is None:
                    busy = self._without_flock(conn, key, owner, now, ttl)
                    if busy is not None:
                        return busy
                row = conn.execute(
                    ACQUIRE,
                    numbered(
                        key.hex,
                        owner.secret,
                        time.time_ns() // 1000,
                        now + math.ceil(ttl * 1e9),
                        self.boot,
                        0 if flock is None else flock[1],
                        now,
                    ),
                ).fetchone()
                if row is None:
                    held = conn.execute(HOLDER, (key.hex,)).fetchone()
                else:
                    if files.contested:
                        files.contested.pop(key.digest, None)
                    if flock is not None:
                        files.held[owner.secret] = (*flock, key.digest)
                        flock = None
                    self._grants += 1
                    if self._grants % SWEEP_EVERY == 0:
                        conn.execute(SWEEP, (now, self.boot))
        finally:
            if flock is not None:
                files.park(key, flock)
        if row is not None:
            return Grant(fence=row[0], ttl=ttl)
        if held is None or held[1] != self.boot:
            return Busy(expires_in=0.0)
        return Busy(expires_in=max(held[0] - now, 0) / 1e9)

    def _without_flock(
        self,
        conn: sqlite3.Connection,
        key: LockKey,
        owner: OwnerToken,
        now: int,
        ttl: float,
    ) -> Busy | None:
        """
        A try that could not take the flock (the caller holds the lock):
        the answer without a write, or None to send the UPSERT (to take an
        expired, earlier-boot or own row, a free one whose flock's holder
        has let it wait for `CONTESTED_NS`, or a missing one whose flock's
        holder has held it for a whole TTL).
        """
        held = conn.execute(HOLDER, (key.hex,)).fetchone()
        if held is None or held[0] == 0:
            # Free, but another process holds the flock: a waiter about
            # to take it. Its turn, for a moment. No row at all: the
            # flock's holder may hold a lease in a database that was
            # removed under it, so it counts as a lease of our TTL (its
            # renewal tells it of the removal within a renewal interval).
            wait = CONTESTED_NS if held else math.ceil(ttl * 1e9)
            left = self.files.patient(key, now, wait)
            if not left:
                return None
            return Busy(expires_in=min(left / 1e9, 0.05))
        self.files.contested.pop(key.digest, None)
        if held[0] > now and held[1] == self.boot and held[2] != owner.secret:
            # Held by another and live: no write (a waiter's UPSERT would
            # only queue on SQLite's write lock behind the grant it waits
            # for).
            return Busy(expires_in=(held[0] - now) / 1e9)
        return None

    def renew(self, batch: Sequence[Renewal]) -> list[bool]:
        """
        See `LockBackend.renew`: one transaction for the batch. A lease
        whose lock file, lock directory or database was removed or
        replaced is not renewed (lost: someone may take the new file).
        """
        try:
            return self._renew(batch)
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise failure(self.path, exc) from exc

    def _renew(self, batch: Sequence[Renewal]) -> list[bool]:
        conn = self._connection()
        done = []
        gone: list[bytes] = []
        files = self.files
        with files.lock:
            if self._moved():
                return [False] * len(batch)
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.monotonic_ns()
                for item in batch:
                    if not files.still_held(item.owner.secret):
                        done.append(False)
                        continue
                    cursor = conn.execute(
                        RENEW,
                        numbered(
                            now + math.ceil(item.ttl * 1e9),
                            item.key.hex,
                            item.owner.secret,
                            self.boot,
                            now,
                        ),
                    )
                    if cursor.rowcount != 1:
                        gone.append(item.owner.secret)
                    done.append(cursor.rowcount == 1)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        # A row no longer ours (expired, taken, deleted): its flock proves
        # nothing now, so the next taker need not wait for it. (A lease
        # whose file or database went keeps its flock: the row may still
        # be live where no one else can see it, so they wait out its TTL.)
        for secret in gone:
            files.drop(secret)
        return done

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        try:
            return self._release(key, owner)
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise failure(self.path, exc) from exc

    def _release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        conn = self._conn
        if conn is None or self._pid != _PID:
            conn = self._connection()
        secret = owner.secret
        try:
            with self.files.lock:
                count = conn.execute(
                    RELEASE, (key.hex, secret, time.monotonic_ns(), self.boot)
                ).rowcount
        finally:
            self.files.drop(secret)
        return ReleaseResult.RELEASED if count == 1 else ReleaseResult.NOT_HELD

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """
        Wake *notify* when *key*'s flock comes free: a helper thread per
        name (not per waiter) blocks on it (for async waiters).
        """
        self._connection()  # After a fork: the child's own file state.
        return self.files.watch(key, notify)

    def waiter(self, key: LockKey) -> Waiter:
        """
        A sync waiter's own wake-up for *key* (the waiting thread polls it:
        one wake-up per hand-over); calling it stops waiting.
        """
        self._connection()
        return self.files.waiter(key)

    def clear_cache(self) -> None:
        """Close the cached descriptors, unlinking the files nobody uses."""
        if self._pid == os.getpid():  # A forked child's copies are dropped.
            self.files.clear_cache()

    def close(self) -> None:
        """
        Close the connection and the cached descriptors (unlinking the
        files nobody uses); leases and their flocks stay.
        """
        self.clear_cache()
        with self.files.lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def _prepare(
    conn: sqlite3.Connection, db: str, *, durable: bool
) -> tuple[tuple[int, int], ...]:
    """
    Set a new connection up (pragmas, schema); the (device, inode) of the
    database, -wal and -shm SQLite uses now (it may have made the -wal and
    -shm again), which a holder's renewal checks are still the paths'.
    """
    # Only a new, empty file takes the page size (before WAL mode).
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA mmap_size={MMAP_SIZE}")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA:
            conn.execute(statement)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    ids = same_files(db)
    if ids is None:
        raise Unsafe(f"{db}: the store's files changed while opening")
    return ids


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


def forked() -> None:
    """
    In a forked child: the stores see the new process id, and the child
    closes its copies of the lock files at once, so that it never keeps a
    dead parent's flock (waiters would sit out the TTL).
    """
    global _PID  # noqa: PLW0603 - one per process
    _PID = os.getpid()
    close_inherited()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=forked)
