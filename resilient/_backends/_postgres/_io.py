"""
The I/O adapters of the PostgreSQL backend: `PostgresBackend` on psycopg's
sync connections and `AsyncPostgresBackend` on its asyncio connections,
over the statements of `resilient._backends._postgres._statements`.
"""

from __future__ import annotations

import asyncio
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

from resilient._backends._base import Busy, Grant, ReleaseResult
from resilient._backends._kept import (
    AsyncSlots,
    Kept,
    Slot,
    Slots,
    fresh_after_fork,
)
from resilient._backends._postgres._statements import (
    MAX_RENEW_BATCH,
    Options,
    Query,
    Statements,
    _WaitTimeout,
    backend_error,
    swept_full,
)
from resilient._backends._postgres._watch import store_hub
from resilient.exceptions import LockBackendError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        LockKey,
        OwnerToken,
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


def _connect_seconds(limit: float) -> str:
    # libpq counts whole seconds, at least 2; our own limit cuts it shorter.
    return str(max(2, math.ceil(limit)))


def _close_all(idle: list[Kept]) -> None:
    """Close every idle connection (another thread may take the last)."""
    with contextlib.suppress(IndexError):
        while idle:
            idle.pop().close()


@final
class PostgresBackend:
    """
    `LockBackend` on psycopg's sync connections (a few kept idle).

    Each connection is held by a `Kept`; a call takes one from `_idle`
    with a list pop (atomic, so no lock) and puts it back by an append
    right after the ``try`` that closes it on any exception, so that an
    interrupt at any point of a call leaves no connection held or open.
    """

    scheme = "postgresql"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._options = options
        self._sql = Statements(options.table, options.timeout)
        self._hub, self._unhub = store_hub(options, self._sql.channel)
        self._slots = Slots(options.max_connections)
        fresh_after_fork(self)
        self._idle: list[Kept] = []
        self._next_sweep = time.monotonic() + SWEEP_EVERY
        self._closed = False
        # Idle connections are closed when the backend goes, at the latest
        # at exit (psycopg warns about connections left open).
        weakref.finalize(self, _close_all, self._idle)

    def __repr__(self) -> str:
        return f"PostgresBackend(table={'.'.join(self._options.table)!r})"

    def _connect(self, limit: float) -> Kept:
        """
        A new connection, within *limit* seconds (in a helper thread,
        because libpq's own connect timeout is whole seconds, at least 2).
        The thread hands it over in a `Kept`, taken by a pop on either
        side: once this thread has stopped waiting (the limit, or an
        interrupt in the join), the helper closes one it made too late.
        """
        made: list[Kept] = []
        failed: list[BaseException] = []
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
                failed.append(exc)
                return
            made.append(Kept(conn))
            if abandoned.is_set():
                _close_all(made)  # Unless the caller took it first.

        thread = threading.Thread(
            target=connect, name="resilient-pg-connect", daemon=True
        )
        try:
            thread.start()
            thread.join(limit)
        finally:
            abandoned.set()
        with contextlib.suppress(IndexError):
            return made.pop()
        if failed:
            raise failed[0]
        raise TimeoutError(f"no connection within {limit:.3f} s")

    def _take(self, idle: list[Kept], limit: float) -> Kept:
        """A kept connection that is still open, or a new one."""
        while True:
            try:
                kept = idle.pop()
            except IndexError:
                return self._connect(limit)
            conn = kept.conn
            if conn is not None and not conn.closed:
                return kept
            kept.close()

    def _keep(self, idle: list[Kept]) -> None:
        """Close what the idle list holds past `MAX_IDLE` (or all of it,
        once the backend is closed)."""
        if self._closed:
            _close_all(idle)
            return
        with contextlib.suppress(IndexError):  # Another thread took it.
            while len(idle) > MAX_IDLE:
                idle.pop(0).close()

    def _run(
        self, query: Query, *, urgent: bool = False
    ) -> list[tuple[Any, ...]]:
        """One statement, once `Slots` has room (*urgent*: go first)."""
        slot = Slot(self._slots)
        try:
            try:
                if not self._slots.take(slot, query.limit, urgent=urgent):
                    raise TimeoutError("no free connection in time")
                try:
                    return self._run_once(query)
                except psycopg.errors.UndefinedTable:
                    # First use: make the table, then run it again.
                    self._create(query.limit)
                    return self._run_once(query)
            except (psycopg.Error, OSError, _WaitTimeout) as exc:
                raise backend_error(exc, query, self._options) from exc
        finally:
            slot.give()

    def _run_once(self, query: Query) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + query.limit
        if query.limit <= 0:
            raise TimeoutError("no time left")
        idle = self._idle
        kept = self._take(idle, query.limit)
        try:
            conn: Any = kept.conn  # Not None: `_take` saw it open.
            conn.limit = max(deadline - time.monotonic(), 0.001)
            rows: list[tuple[Any, ...]] = conn.execute(
                query.sql, query.params, prepare=True
            ).fetchall()
        except BaseException:
            kept.close()
            raise
        # From the end of the ``try`` to the append there is no call, so
        # no interrupt: the connection is closed by the handler or kept.
        idle.append(kept)
        if len(idle) > MAX_IDLE or self._closed:
            self._keep(idle)
        return rows

    def _create(self, limit: float) -> None:
        idle = self._idle
        kept = self._take(idle, limit)
        try:
            conn: Any = kept.conn
            conn.limit = limit
            with conn.transaction():
                conn.execute(
                    "SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,)
                )
                conn.execute(self._sql.create)
        except BaseException:
            kept.close()
            raise
        idle.append(kept)
        if len(idle) > MAX_IDLE or self._closed:
            self._keep(idle)

    def _maybe_sweep(self) -> None:
        """Sweep once `SWEEP_EVERY` seconds, and again at the next release
        while a sweep finds a full batch (so that 10,000 names a minute are
        swept as fast as they come, a bounded statement at a time)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        with contextlib.suppress(LockBackendError):
            sweep = Query(self._sql.sweep, {}, self._sql.limit(math.inf))
            if swept_full(self._run(sweep)):
                self._next_sweep = now

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        return self.acquire_as(key, owner, ttl, threading.current_thread())

    def acquire_as(
        self, key: LockKey, owner: OwnerToken, ttl: float, who: object
    ) -> Grant | Busy:
        """`acquire` for *who*, in its turn in its process's line."""
        channel, hub = key.hex, self._hub
        if not hub.begin(channel, who):
            return Busy(None, queued=True)
        rows = self._run(self._sql.acquire(key, owner, ttl))
        answer = Statements.read_acquire(rows, ttl)
        if isinstance(answer, Grant):
            hub.granted(channel, who)
        return answer

    def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        rows = self._run(self._sql.renew(batch), urgent=True)
        return Statements.read_renew(rows, len(batch))

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        rows = self._run(self._sql.release(key, owner), urgent=True)
        result = Statements.read_release(rows)
        if result is ReleaseResult.RELEASED:
            # The head of this process's line need not wait for NOTIFY.
            self._hub.tell(key.hex, here=True)
        self._maybe_sweep()
        return result

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self.watch_as(key, notify, threading.current_thread())

    def queued(self, key: LockKey, who: object) -> bool:
        """Whether others of this process are ahead of *who* in line."""
        return not self._hub.begin(key.hex, who)

    def watch_as(
        self, key: LockKey, notify: Callable[[], None], who: object
    ) -> Callable[[], None]:
        """`watch` for *who*: it joins the lock's line."""
        return self._hub.watch(key.hex, notify, who)

    def close(self) -> None:
        """Close the kept connections; those in use close as their calls
        end (a call sees the flag after its append, set before this drains
        the list)."""
        self._unhub()
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
        self._hub, self._unhub = store_hub(options, self._sql.channel)
        self._slots = AsyncSlots(options.max_connections)
        fresh_after_fork(self)
        self._idle: list[_AsyncConnection] = []
        self._next_sweep = time.monotonic() + SWEEP_EVERY
        self._closed = False

    def __repr__(self) -> str:
        return f"AsyncPostgresBackend(table={'.'.join(self._options.table)!r})"

    def _connect(self, limit: float) -> Any:
        """The connect of a new connection (a coroutine, for the caller
        to await and assign, with no call in between)."""
        return _AsyncConnection.connect(
            self._options.driver_url,
            autocommit=True,
            prepare_threshold=0,
            connect_timeout=_connect_seconds(limit),
        )

    async def _run(
        self, query: Query, *, urgent: bool = False
    ) -> list[tuple[Any, ...]]:
        """One statement, once `AsyncSlots` has room for it."""
        slot = Slot(self._slots)
        try:
            try:
                with anyio.fail_after(query.limit):
                    await self._slots.take(slot, urgent=urgent)
                try:
                    return await self._run_once(query)
                except psycopg.errors.UndefinedTable:
                    await self._create(query.limit)
                    return await self._run_once(query)
            except (psycopg.Error, OSError, _WaitTimeout) as exc:
                raise backend_error(exc, query, self._options) from exc
        finally:
            slot.give()

    async def _run_once(self, query: Query) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + query.limit
        if query.limit <= 0:
            raise TimeoutError("no time left")
        idle = self._idle
        conn: _AsyncConnection | None = None
        try:
            while idle:
                # Not idle.pop(): an interrupt after that call returned
                # would drop the connection from the stack, left open.
                conn = idle[-1]
                del idle[-1]
                if not conn.closed:
                    break
                conn = None  # Broken (its status says so): nothing to do.
            if conn is None:
                # Connected in this ``try``, so that the handler closes it
                # if an interrupt lands as the ``with`` block ends.
                with anyio.fail_after(query.limit):
                    conn = await self._connect(query.limit)
            conn.limit = max(deadline - time.monotonic(), 0.001)
            cursor = await conn.execute(query.sql, query.params, prepare=True)
            rows = await cursor.fetchall()
        except BaseException:
            if conn is not None:
                try:
                    await conn.close()
                except BaseException:
                    await conn.close()  # Interrupted at its start.
                    raise
            raise
        # No call from the end of the ``try`` to the append, so no
        # interrupt: the connection is closed by the handler or kept.
        idle.append(conn)
        if len(idle) > MAX_IDLE or self._closed:
            await self._trim(idle)
        return rows

    async def _trim(self, idle: list[_AsyncConnection]) -> None:
        """Close the oldest kept connections past `MAX_IDLE` (or all of
        them, once the backend is closed). No shield: psycopg's async
        close never suspends, so no cancellation can land in it."""
        keep = 0 if self._closed else MAX_IDLE
        while len(idle) > keep:
            conn = idle[0]
            del idle[0]
            try:
                await conn.close()
            except BaseException:
                await conn.close()  # Interrupted at its start.
                raise

    async def _create(self, limit: float) -> None:
        idle = self._idle
        conn: _AsyncConnection | None = None
        try:
            with anyio.fail_after(limit):
                conn = await self._connect(limit)
            conn.limit = limit
            # Not ``async with conn.transaction()``: closing a coroutine
            # that awaits an async generator's step does not close the
            # generator, so a dropped call would leave psycopg's wait in
            # it registered on a socket the handler below closes. On any
            # error the handler closes the session, which rolls back.
            await conn.execute("BEGIN")
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,)
            )
            await conn.execute(self._sql.create)
            await conn.execute("COMMIT")
        except BaseException:
            if conn is not None:
                try:
                    await conn.close()
                except BaseException:
                    await conn.close()  # Interrupted at its start.
                    raise
            raise
        idle.append(conn)
        if len(idle) > MAX_IDLE or self._closed:
            await self._trim(idle)

    async def _maybe_sweep(self) -> None:
        """`PostgresBackend._maybe_sweep`, awaited."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        with contextlib.suppress(LockBackendError):
            query = Query(self._sql.sweep, {}, self._sql.limit(math.inf))
            if swept_full(await self._run(query)):
                self._next_sweep = now

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        channel, hub = key.hex, self._hub
        who = asyncio.current_task()
        if not hub.begin(channel, who):
            return Busy(None, queued=True)
        rows = await self._run(self._sql.acquire(key, owner, ttl))
        answer = Statements.read_acquire(rows, ttl)
        if isinstance(answer, Grant):
            hub.granted(channel, who)
        return answer

    async def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        rows = await self._run(self._sql.renew(batch), urgent=True)
        return Statements.read_renew(rows, len(batch))

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        rows = await self._run(self._sql.release(key, owner), urgent=True)
        result = Statements.read_release(rows)
        if result is ReleaseResult.RELEASED:
            self._hub.tell(key.hex, here=True)
        await self._maybe_sweep()
        return result

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self._hub.watch(key.hex, notify, asyncio.current_task())

    async def aclose(self) -> None:
        """Close the kept connections; those in use close as their calls
        end."""
        self._unhub()
        self._closed = True
        await self._trim(self._idle)


#: The advisory lock key that serialises the creation of lease tables
#: (two sessions running CREATE TABLE IF NOT EXISTS at once can collide).
_CREATE_LOCK: Final = 0x7265_7369_6C6F_636B  # b"resilock"
