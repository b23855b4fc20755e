"""
The PostgreSQL lock backend (``postgresql://``, ``postgres://``), on psycopg 3.

Leases are rows of one table (``resilient_locks`` unless the URL says
``?table=``), created on first use; every operation is one statement, one
round trip, written once here (`Statements`) under two thin adapters:
`PostgresBackend` (psycopg's sync connections) and `AsyncPostgresBackend`
(its asyncio connections; trio runs the sync one in worker threads).

The table (the migration statement to run ahead, if the locks' database
user may not create tables, is `CREATE_TABLE` with the name filled in)::

    CREATE TABLE IF NOT EXISTS resilient_locks (
        key        bytea PRIMARY KEY,  -- SHA-256 of the lock's name
        owner      bytea,              -- the holder's token; NULL when free
        fence      bigint NOT NULL,    -- the last fencing token granted
        expires_at timestamptz NOT NULL
    )

**Expiry** is on the server's clock (``clock_timestamp()``, not ``now()``,
which is the start of the transaction).

**Fencing tokens.** A grant sets ``fence = greatest(row.fence + 1, floor + 1,
server clock in µs)`` in the acquiring upsert, where ``floor`` is the fence
of a reserved row (``key = ''``) that holds the highest fence of every row
ever deleted. A release only marks the row free (``owner = NULL``); a sweep
(at most once a minute per process, a thousand rows at a time) deletes rows
that have been free or expired for `SWEEP_AFTER` and folds their fences
into the floor in the same statement. So a name with a row counts up from
its row, a name without one counts up from the floor, tokens never go
backwards, and the table holds one row per name used in the last minute or
so, plus the floor: no counter per name forever. (Deleting at release would
make every release update the floor row, which would serialise the
releases of all locks on one row lock.)

**Wake-ups.** The release statement calls ``pg_notify`` on the table's
channel with the key in hex; `watch` is served by the process's one
``LISTEN`` session per table (`resilient._backends._postgres_watch`). An
expiry notifies nothing.

**Errors** map to `LockBackendError` by SQLSTATE: connection failures
(class 08), shutdowns (57P01-57P03), resources (53), serialisation and
deadlocks (40), lock waits (55P03), a cancelled statement (57014) and a
read-only server (25006) are retryable; a refused login (28), a missing
privilege (42501) and other errors are not.

**Time limits.** Every call is bounded by the enclosing deadline, by the
lease's ttl for acquire and renew, and by the URL's ``timeout`` (seconds,
default 2): past it the connection is closed (its reply, if any, is never
read) and the call raises `LockBackendError` with reason ``"timeout"``.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
import urllib.parse
import weakref
from typing import TYPE_CHECKING, Any, Final, final

import anyio
import attrs
import psycopg
import psycopg.errors
import psycopg.sql
import sniffio
from psycopg import waiting

from resilient._backends._base import (
    Busy,
    Grant,
    ReleaseResult,
    call_limit,
    hide,
    ttl_ms,
    url_seconds,
    url_secrets,
    url_where,
)
from resilient._backends._postgres_watch import PostgresHub, channel_of
from resilient._backends._threaded import ThreadedAsyncBackend
from resilient._backends._watch import WatchHub, hub_for
from resilient.exceptions import ConfigError, LockBackendError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        AsyncLockBackend,
        LockBackend,
        LockKey,
        OwnerToken,
        Renewal,
    )


__all__ = [
    "CREATE_TABLE",
    "EXTRA",
    "AsyncPostgresBackend",
    "PostgresBackend",
    "Statements",
    "async_backend",
    "sync_backend",
]

#: The extra that installs psycopg.
EXTRA: Final = "postgres"

#: Leases renewed by one statement.
MAX_RENEW_BATCH: Final = 500

#: The default time limit of one call, in seconds (URL: ``timeout=``).
DEFAULT_TIMEOUT: Final = 2.0

#: How long a row stays free or expired before a sweep may delete it.
SWEEP_AFTER: Final = "60 seconds"

#: Seconds between two sweeps of one backend.
SWEEP_EVERY: Final = 60.0

#: Idle connections a backend keeps.
MAX_IDLE: Final = 4

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE = re.compile(rf"({_IDENT})(?:\.({_IDENT}))?")

CREATE_TABLE: Final = """\
CREATE TABLE IF NOT EXISTS {table} (
    key bytea PRIMARY KEY,
    owner bytea,
    fence bigint NOT NULL,
    expires_at timestamptz NOT NULL
)"""

_ACQUIRE = """\
WITH granted AS (
    INSERT INTO {table} AS l (key, owner, fence, expires_at)
    SELECT %(key)s, %(owner)s,
        greatest(
            coalesce(max(f.fence), 0) + 1,
            (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
        clock_timestamp() + %(ms)s * interval '1 millisecond'
    FROM {table} AS f WHERE f.key = ''::bytea
    ON CONFLICT (key) DO UPDATE SET
        owner = excluded.owner,
        fence = CASE WHEN l.owner = excluded.owner THEN l.fence
                     ELSE greatest(l.fence + 1, excluded.fence) END,
        expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.owner = excluded.owner
        OR l.expires_at <= clock_timestamp()
    RETURNING l.fence
)
SELECT fence, NULL::float8 FROM granted
UNION ALL
SELECT NULL, extract(epoch FROM h.expires_at - clock_timestamp())::float8
FROM {table} AS h
WHERE h.key = %(key)s AND NOT EXISTS (SELECT FROM granted)"""

_RENEW = """\
UPDATE {table} AS l
SET expires_at = clock_timestamp() + r.ms * interval '1 millisecond'
FROM unnest(%(keys)s::bytea[], %(owners)s::bytea[], %(ms)s::bigint[])
    WITH ORDINALITY AS r(key, owner, ms, i)
WHERE l.key = r.key AND l.owner = r.owner
    AND l.expires_at > clock_timestamp()
RETURNING r.i"""

_RELEASE = """\
WITH freed AS (
    UPDATE {table} SET owner = NULL, expires_at = clock_timestamp()
    WHERE key = %(key)s AND owner = %(owner)s
        AND expires_at > clock_timestamp()
    RETURNING key
)
SELECT pg_notify('{channel}', encode(key, 'hex')) FROM freed"""

_SWEEP = """\
WITH gone AS (
    DELETE FROM {table} WHERE key IN (
        SELECT key FROM {table}
        WHERE key <> ''::bytea
            AND expires_at < clock_timestamp() - interval '{after}'
        LIMIT 1000 FOR UPDATE SKIP LOCKED)
    RETURNING fence
)
INSERT INTO {table} AS t (key, owner, fence, expires_at)
SELECT ''::bytea, NULL, max(fence), 'infinity' FROM gone
HAVING count(*) > 0
ON CONFLICT (key) DO UPDATE SET fence = greatest(t.fence, excluded.fence)
RETURNING t.fence"""

# SQLSTATEs (or their two-character classes) worth trying again.
_RETRYABLE_STATES: Final = frozenset(
    {"08", "53", "40", "55P03", "57014", "57P01", "57P02", "57P03"}
    | {"25006", "connection", "timeout"}
)

_WaitTimeout: type[BaseException] = getattr(
    psycopg.errors, "_WaitTimeout", TimeoutError
)


@final
@attrs.frozen
class Options:
    """What a lock URL says, split into the driver's URL and ours."""

    driver_url: str
    table: tuple[str, ...]
    timeout: float
    where: str
    secrets: tuple[str, ...] = ()


def parse_url(url: str) -> Options:
    """
    Split our query parameters (``table``, ``timeout``) off *url*; the rest
    goes to libpq. Errors name the parameter, never the URL.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    rest: list[tuple[str, str]] = []
    table: tuple[str, ...] = ("resilient_locks",)
    timeout = DEFAULT_TIMEOUT
    for name, value in query:
        if name == "table":
            match = _TABLE.fullmatch(value)
            if match is None:
                raise ConfigError(
                    "postgresql URL table",
                    value[:64],
                    "must be a name or schema.name of letters, digits, _",
                )
            table = tuple(p for p in match.groups() if p)
        elif name == "timeout":
            timeout = url_seconds(value)
        else:
            rest.append((name, value))
    scheme = "postgresql" if parts.scheme.lower() == "postgres" else None
    driver = parts._replace(
        query=urllib.parse.urlencode(rest, quote_via=urllib.parse.quote),
        scheme=scheme or parts.scheme,
    ).geturl()
    return Options(driver, table, timeout, url_where(url), url_secrets(url))


@final
@attrs.frozen(repr=False)
class Query:
    """One statement to run: its text, parameters and time limit."""

    sql: bytes
    params: dict[str, Any]
    limit: float
    secrets: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Query({self.sql[:40]!r}...)"


@final
class Statements:
    """The sans-IO layer: the SQL to run and how to read its rows."""

    __slots__ = (
        "_acquire",
        "_release",
        "_renew",
        "channel",
        "create",
        "sweep",
        "timeout",
    )

    def __init__(self, table: tuple[str, ...], timeout: float) -> None:
        ident = psycopg.sql.Identifier(*table).as_string(None)

        self.channel = channel_of(table)

        def render(text: str) -> bytes:
            return text.format(
                table=ident, after=SWEEP_AFTER, channel=self.channel
            ).encode()

        self.timeout = timeout
        self.create = render(CREATE_TABLE)
        self.sweep = render(_SWEEP)
        self._acquire = render(_ACQUIRE)
        self._renew = render(_RENEW)
        self._release = render(_RELEASE)

    def limit(self, cap: float) -> float:
        return call_limit(cap, self.timeout)

    def acquire(self, key: LockKey, owner: OwnerToken, ttl: float) -> Query:
        params = {"key": key.digest, "owner": owner.secret, "ms": ttl_ms(ttl)}
        return Query(self._acquire, params, self.limit(ttl), (owner.hex,))

    @staticmethod
    def read_acquire(rows: list[tuple[Any, ...]], ttl: float) -> Grant | Busy:
        if rows and rows[0][0] is not None:
            return Grant(fence=int(rows[0][0]), ttl=ttl_ms(ttl) / 1000.0)
        if rows and rows[0][1] is not None:
            return Busy(expires_in=max(float(rows[0][1]), 0.0))
        return Busy()

    def renew(self, batch: Sequence[Renewal]) -> Query:
        params = {
            "keys": [r.key.digest for r in batch],
            "owners": [r.owner.secret for r in batch],
            "ms": [ttl_ms(r.ttl) for r in batch],
        }
        return Query(
            self._renew,
            params,
            self.limit(min(r.ttl for r in batch)),
            tuple(r.owner.hex for r in batch),
        )

    @staticmethod
    def read_renew(rows: list[tuple[Any, ...]], n: int) -> list[bool]:
        renewed = {int(row[0]) for row in rows}
        return [i + 1 in renewed for i in range(n)]

    def release(self, key: LockKey, owner: OwnerToken) -> Query:
        params = {"key": key.digest, "owner": owner.secret}
        return Query(self._release, params, self.limit(math.inf), (owner.hex,))

    @staticmethod
    def read_release(rows: list[tuple[Any, ...]]) -> ReleaseResult:
        return ReleaseResult.RELEASED if rows else ReleaseResult.NOT_HELD


def backend_error(
    exc: BaseException, query: Query | None, store: Options | None = None
) -> LockBackendError:
    """The documented error for a psycopg exception."""
    state: str | None = None
    if isinstance(exc, _WaitTimeout | TimeoutError):
        reason = "timeout"
    elif isinstance(exc, psycopg.Error) and exc.sqlstate:
        state = exc.sqlstate
        reason = state
    else:
        reason = _refused_login(str(exc)) or "connection"
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        message = exc.diag.message_primary
    else:
        message = str(exc).split("\n", 1)[0] or type(exc).__name__
    message = message[:200]
    for secret in query.secrets if query else ():
        message = message.replace(secret, "(secret)")
    if store is not None:
        message = hide(message, store.secrets)
    retryable = reason in _RETRYABLE_STATES or (
        state is not None and state[:2] in _RETRYABLE_STATES
    )
    return LockBackendError(
        "postgresql",
        reason,
        message,
        retryable=retryable,
        where=store.where if store else None,
    )


# A refused connection carries no SQLSTATE, only libpq's text.
_LOGIN_REFUSALS: Final = (
    (
        re.compile(r"role .* does not exist|authentication failed|pg_hba"),
        "28000",
    ),
    (re.compile(r"database .* does not exist"), "3D000"),
    (re.compile(r"permission denied for database"), "42501"),
)


def _refused_login(message: str) -> str | None:
    """The SQLSTATE of a login the server refused, from its message."""
    for pattern, state in _LOGIN_REFUSALS:
        if pattern.search(message):
            return state
    return None


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


def sync_backend(url: str) -> LockBackend:
    """The sync backend for a ``postgresql://`` URL."""
    return PostgresBackend(parse_url(url))


def async_backend(url: str) -> AsyncLockBackend:
    """
    The async backend for *url* in the running event loop: psycopg's
    asyncio connections on asyncio, sync ones in worker threads elsewhere.
    """
    options = parse_url(url)
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = "asyncio"
    if library == "asyncio":
        return AsyncPostgresBackend(options)
    return ThreadedAsyncBackend(PostgresBackend(options))
