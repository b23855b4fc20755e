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
(at a release, once a minute per process, a thousand rows at a time;
again at the next release while a sweep finds a full thousand, so the
sweep keeps up with any rate of new names) deletes rows
that have been free or expired for `SWEEP_AFTER` and folds their fences
into the floor in the same statement. So a name with a row counts up from
its row, a name without one counts up from the floor, tokens never go
backwards, and the table holds one row per name used in the last minute or
so, plus the floor: no counter per name forever. (Deleting at release would
make every release update the floor row, which would serialise the
releases of all locks on one row lock.)

**Wake-ups.** The release statement calls ``pg_notify`` on the table's
channel with the key in hex; `watch` is served by the process's one
``LISTEN`` session per table (`resilient._backends._postgres._watch`). An
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

from typing import TYPE_CHECKING, Final

import sniffio

from resilient._backends._postgres._io import (
    MAX_IDLE,
    SWEEP_EVERY,
    AsyncPostgresBackend,
    PostgresBackend,
    _AsyncConnection,
    _Connection,
)
from resilient._backends._postgres._statements import (
    CREATE_TABLE,
    DEFAULT_TIMEOUT,
    MAX_RENEW_BATCH,
    SWEEP_AFTER,
    Options,
    Query,
    Statements,
    backend_error,
    parse_url,
)
from resilient._backends._threaded import ThreadedAsyncBackend


if TYPE_CHECKING:
    from resilient._backends._base import AsyncLockBackend, LockBackend


__all__ = [
    "CREATE_TABLE",
    "DEFAULT_TIMEOUT",
    "EXTRA",
    "MAX_IDLE",
    "MAX_RENEW_BATCH",
    "SWEEP_AFTER",
    "SWEEP_EVERY",
    "AsyncPostgresBackend",
    "Options",
    "PostgresBackend",
    "Query",
    "Statements",
    "_AsyncConnection",
    "_Connection",
    "async_backend",
    "backend_error",
    "parse_url",
    "sync_backend",
]

#: The extra that installs psycopg.
EXTRA: Final = "postgres"


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
    # The process's sync backend of the URL, shared: a run of this loop
    # opens no connection that could outlive it.
    from resilient._backends import open_backend  # noqa: PLC0415

    return ThreadedAsyncBackend(open_backend(url), owns=False)
