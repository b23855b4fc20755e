"""
The I/O adapters of the PostgreSQL backend: `PostgresBackend` on psycopg's
sync connections and `AsyncPostgresBackend` on its asyncio connections,
over the statements of `resilient._backends._postgres._statements`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final, final

import anyio
import psycopg
import psycopg.errors
from psycopg import waiting

from resilient._backends._postgres._statements import (
    MAX_RENEW_BATCH,
    Options,
    Query,
    Statements,
    _WaitTimeout,
    backend_error,
)
from resilient._backends._postgres._watch import PostgresHub
from resilient._backends._watch import WatchHub, hub_for


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        Busy,
        Grant,
        LockKey,
        OwnerToken,
        ReleaseResult,
        Renewal,
    )


__all__ = ["AsyncPostgresBackend", "PostgresBackend"]

#: Seconds between two sweeps of one backend.
SWEEP_EVERY: Final = 60.0

#: Idle connections a backend keeps.
MAX_IDLE: Final = 4


class _Connection(psycopg.Connection[Any]):
    """A connection whose every wait is bounded by `limit` seconds."""

    limit: float | None = None

    def wait(
        self,
        gen: Any,
        interval: float = 0.1,
        timeout: float | None = None,
    ) -> Any:
        return waiting.wait(
            gen,
            self.pgconn.socket,
            interval=interval,
            timeout=self.limit if timeout is None else timeout,
        )


class _AsyncConnection(psycopg.AsyncConnection[Any]):
    """An asyncio connection whose waits are bounded by `limit` seconds."""

    limit: float | None = None

    async def wait(
        self,
        gen: Any,
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109 - psycopg's signature
    ) -> Any:
        return await waiting.wait_async(
            gen,
            self.pgconn.socket,
            interval=interval,
            timeout=self.limit if timeout is None else timeout,
        )


def _close_all(idle: list[_Connection]) -> None:
    """Close every idle connection (a backend's finaliser)."""
    while idle:
        idle.pop().close()


def _connect_seconds(limit: float) -> str:
    # libpq counts whole seconds, at least 2; our own limit cuts it shorter.
    return str(max(2, math.ceil(limit)))


@final
class PostgresBackend:
    """`LockBackend` on psycopg's sync connections (a few kept idle)."""

    scheme = "postgresql"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._options = options
        self._sql = Statements(options.table, options.timeout)
        self._hub, self._unhub = _hub(options, self._sql.channel)
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._next_sweep = time.monotonic() + SWEEP_EVERY
        self._closed = False
        # Idle connections are closed when the backend goes, at the latest
        # at exit (psycopg warns about connections left open).
        weakref.finalize(self, _close_all, self._idle)

    def __repr__(self) -> str:
        return f"PostgresBackend(table={'.'.join(self._options.table)!r})"

    def _connect(self, limit: float) -> _Connection:
        """A new connection, within *limit* seconds (in a helper thread,
        because libpq's own connect timeout is whole seconds, at least 2)."""
        result: list[_Connection | BaseException] = []
        abandoned = threading.Event()

        def connect() -> None:
            try:
                conn = _Connection.connect(
                    self._options.driver_url,
                    autocommit=True,
                    prepare_threshold=0,
                    connect_timeout=_connect_seconds(limit),
                )
            except BaseException as exc:  # noqa: BLE001 - handed over
                result.append(exc)
                return
            result.append(conn)
            if abandoned.is_set():
                conn.close()

        thread = threading.Thread(
            target=connect, name="resilient-pg-connect", daemon=True
        )
        thread.start()
        thread.join(limit)
        abandoned.set()
        if not result:
            raise TimeoutError(f"no connection within {limit:.3f} s")
        outcome = result[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _take(self, limit: float) -> _Connection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return self._connect(limit)

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE and not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _run(self, query: Query) -> list[tuple[Any, ...]]:
        try:
            try:
                return self._run_once(query)
            except psycopg.errors.UndefinedTable:
                # First use: make the table, then run the statement again.
                self._create(query.limit)
                return self._run_once(query)
        except (psycopg.Error, OSError, _WaitTimeout) as exc:
            raise backend_error(exc, query, self._options) from exc

    def _run_once(self, query: Query) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + query.limit
        if query.limit <= 0:
            raise TimeoutError("no time left")
        conn = self._take(query.limit)
        ok = False
        try:
            conn.limit = max(deadline - time.monotonic(), 0.001)
            rows = conn.execute(
                query.sql, query.params, prepare=True
            ).fetchall()
            ok = True
        finally:
            if ok:
                self._give(conn)
            else:
                conn.close()
        return rows

    def _create(self, limit: float) -> None:
        conn = self._take(limit)
        try:
            conn.limit = limit
            with conn.transaction():
                conn.execute(
                    "SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,)
                )
                conn.execute(self._sql.create)
        except BaseException:
            conn.close()
            raise
        self._give(conn)

    def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        with contextlib.suppress(psycopg.Error, OSError, _WaitTimeout):
            self._run_once(
                Query(self._sql.sweep, {}, self._sql.limit(math.inf))
            )

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        rows = self._run(self._sql.acquire(key, owner, ttl))
        return Statements.read_acquire(rows, ttl)

    def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        rows = self._run(self._sql.renew(batch))
        return Statements.read_renew(rows, len(batch))

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        rows = self._run(self._sql.release(key, owner))
        self._maybe_sweep()
        return Statements.read_release(rows)

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self._hub.watch(key.hex, notify)

    def close(self) -> None:
        self._unhub()
        with self._lock:
            self._closed = True
            _close_all(self._idle)


@final
class AsyncPostgresBackend:
    """`AsyncLockBackend` on psycopg's asyncio connections."""

    scheme = "postgresql"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._options = options
        self._sql = Statements(options.table, options.timeout)
        self._hub, self._unhub = _hub(options, self._sql.channel)
        self._idle: list[_AsyncConnection] = []
        self._next_sweep = time.monotonic() + SWEEP_EVERY
        self._closed = False

    def __repr__(self) -> str:
        return f"AsyncPostgresBackend(table={'.'.join(self._options.table)!r})"

    async def _take(self, limit: float) -> _AsyncConnection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        with anyio.fail_after(limit):
            return await _AsyncConnection.connect(
                self._options.driver_url,
                autocommit=True,
                prepare_threshold=0,
                connect_timeout=_connect_seconds(limit),
            )

    async def _give(self, conn: _AsyncConnection) -> None:
        if len(self._idle) < MAX_IDLE and not self._closed:
            self._idle.append(conn)
            return
        await conn.close()

    async def _run(self, query: Query) -> list[tuple[Any, ...]]:
        try:
            try:
                return await self._run_once(query)
            except psycopg.errors.UndefinedTable:
                await self._create(query.limit)
                return await self._run_once(query)
        except (psycopg.Error, OSError, _WaitTimeout) as exc:
            raise backend_error(exc, query, self._options) from exc

    async def _run_once(self, query: Query) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + query.limit
        if query.limit <= 0:
            raise TimeoutError("no time left")
        conn = await self._take(query.limit)
        ok = False
        try:
            conn.limit = max(deadline - time.monotonic(), 0.001)
            cursor = await conn.execute(query.sql, query.params, prepare=True)
            rows = await cursor.fetchall()
            ok = True
        finally:
            with anyio.CancelScope(shield=True):
                if ok:
                    await self._give(conn)
                else:
                    await conn.close()
        return rows

    async def _create(self, limit: float) -> None:
        conn = await self._take(limit)
        try:
            conn.limit = limit
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,)
                )
                await conn.execute(self._sql.create)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise
        await self._give(conn)

    async def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        with contextlib.suppress(psycopg.Error, OSError, _WaitTimeout):
            await self._run_once(
                Query(self._sql.sweep, {}, self._sql.limit(math.inf))
            )

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        rows = await self._run(self._sql.acquire(key, owner, ttl))
        return Statements.read_acquire(rows, ttl)

    async def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        rows = await self._run(self._sql.renew(batch))
        return Statements.read_renew(rows, len(batch))

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        rows = await self._run(self._sql.release(key, owner))
        await self._maybe_sweep()
        return Statements.read_release(rows)

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self._hub.watch(key.hex, notify)

    async def aclose(self) -> None:
        self._unhub()
        self._closed = True
        idle, self._idle = self._idle, []
        with anyio.CancelScope(shield=True):
            for conn in idle:
                await conn.close()


#: The advisory lock key that serialises the creation of lease tables
#: (two sessions running CREATE TABLE IF NOT EXISTS at once can collide).
_CREATE_LOCK: Final = 0x7265_7369_6C6F_636B  # b"resilock"


def _hub(
    options: Options, channel: str
) -> tuple[WatchHub, Callable[[], None]]:
    """The process's wake-up hub of the table *options* name (shared by its
    sync and async backends), and the release a backend calls at close."""
    return hub_for(
        ("postgresql", options.driver_url, channel),
        lambda: PostgresHub(options.driver_url, channel, options.timeout),
    )
