"""
The sans-IO layer of the PostgreSQL backend: the lease table, the SQL of
every operation, the URL's options, and how rows and errors are read.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import psycopg
import psycopg.errors
import psycopg.sql

from resilient._backends._base import (
    Busy,
    Grant,
    ReleaseResult,
    call_limit,
    hide,
    ttl_ms,
    url_repr,
    url_seconds,
    url_secrets,
    url_where,
)
from resilient._backends._kept import DEFAULT_MAX
from resilient._backends._postgres._watch import channel_of
from resilient.exceptions import ConfigError, LockBackendError


if TYPE_CHECKING:
    from collections.abc import Sequence

    from resilient._backends._base import LockKey, OwnerToken, Renewal


__all__ = [
    "CREATE_TABLE",
    "Options",
    "Query",
    "Statements",
    "backend_error",
    "parse_url",
    "swept_full",
]

#: Leases renewed by one statement.
MAX_RENEW_BATCH: Final = 500

#: The default time limit of one call, in seconds (URL: ``timeout=``).
DEFAULT_TIMEOUT: Final = 2.0

#: How long a row stays free or expired before a sweep may delete it.
SWEEP_AFTER: Final = "60 seconds"

#: The most rows one sweep deletes (one statement, bounded in time); a
#: sweep that deleted this many is followed by another at the next release.
SWEEP_BATCH: Final = 1000

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
        LIMIT {batch} FOR UPDATE SKIP LOCKED)
    RETURNING fence
), floor AS (
    INSERT INTO {table} AS t (key, owner, fence, expires_at)
    SELECT ''::bytea, NULL, max(fence), 'infinity' FROM gone
    HAVING count(*) > 0
    ON CONFLICT (key) DO UPDATE SET fence = greatest(t.fence, excluded.fence)
)
SELECT count(*) FROM gone"""

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

    driver_url: str = attrs.field(repr=url_repr)
    table: tuple[str, ...]
    timeout: float
    where: str
    secrets: tuple[str, ...] = attrs.field(default=(), repr=False)
    max_connections: int = DEFAULT_MAX


def _url_count(value: str) -> int:
    """A lock URL's ``max_connections=`` option (a whole number >= 1)."""
    if not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise ConfigError(
            "postgresql URL max_connections",
            value[:32],
            "must be a whole number from 1 to 10000",
        )
    return int(value)


def parse_url(url: str) -> Options:
    """
    Split our query parameters (``table``, ``timeout``,
    ``max_connections``) off *url*; the rest goes to libpq. Errors name the
    parameter, never the URL.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    rest: list[tuple[str, str]] = []
    table: tuple[str, ...] = ("resilient_locks",)
    timeout = DEFAULT_TIMEOUT
    most = DEFAULT_MAX
    for name, value in query:
        if name == "max_connections":
            most = _url_count(value)
        elif name == "table":
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
    return Options(
        driver, table, timeout, url_where(url), url_secrets(url), most
    )


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
                table=ident,
                after=SWEEP_AFTER,
                batch=SWEEP_BATCH,
                channel=self.channel,
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
        re.compile(
            r"role .* (?:does not exist|is not permitted to log in)"
            r"|authentication failed|pg_hba"
        ),
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


def swept_full(rows: list[tuple[Any, ...]]) -> bool:
    """Whether a sweep deleted a full batch (more may be waiting)."""
    return bool(rows) and int(rows[0][0]) >= SWEEP_BATCH
