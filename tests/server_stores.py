"""
The Redis and PostgreSQL lock stores as the tests look at them: one face
over a plain client of each server (what is stored for a lease, how long
it has left, its fence), so that a backend test is written once and runs
on both (``tests/test_server_backends.py``).
"""

from __future__ import annotations

from typing import Any

import psycopg
import redis

from resilient._backends import LockKey


class Store:
    """A lock store on a server, seen through a plain client."""

    kind: str
    #: The backend module under ``resilient._backends``.
    module: str
    #: Whether a lease outlives a restart of the server (a durable table).
    durable: bool

    #: The lock URL parameter that names the store's namespace or table.
    scope_parameter: str

    def __init__(
        self, server_url: str, scope: str | None, options: str = ""
    ) -> None:
        self.server_url = server_url
        self.scope = scope
        self.options = options

    @property
    def url(self) -> str:
        """The lock URL of this store (its namespace or table, and the
        other lock URL *options* it was given)."""
        query = [self.options] if self.options else []
        if self.scope is not None:
            query.insert(0, f"{self.scope_parameter}={self.scope}")
        if not query:
            return self.server_url
        join = "&" if "?" in self.server_url else "?"
        return f"{self.server_url}{join}{'&'.join(query)}"

    def left(self, key: LockKey) -> float | None:
        """Seconds the store keeps *key*'s lease, None if there is none."""
        raise NotImplementedError

    def fence_of(self, key: LockKey) -> int | None:
        """The fence stored for *key*, None if nothing is stored."""
        raise NotImplementedError

    def lease_ids(self) -> set[bytes]:
        """What identifies each lease stored (keys or row keys)."""
        raise NotImplementedError

    def id_of(self, key: LockKey) -> bytes:
        """The identity `lease_ids` gives *key*'s lease."""
        raise NotImplementedError

    def delete(self, key: LockKey) -> None:
        """Delete *key*'s lease behind its holder's back."""
        raise NotImplementedError

    def close(self) -> None:
        """Let go of the plain client."""
        raise NotImplementedError


class RedisStore(Store):
    """``redis://``: one hash per lease under a namespace."""

    kind = "redis"
    module = "_redis"
    durable = False
    scope_parameter = "namespace"

    def __init__(
        self, server_url: str, scope: str | None, options: str = ""
    ) -> None:
        super().__init__(server_url, scope, options)
        self.namespace = scope or "resilient"
        self._raw: redis.Redis | None = None

    @property
    def raw(self) -> redis.Redis:
        """A plain client of the server (made on first use)."""
        if self._raw is None:
            self._raw = redis.Redis.from_url(self.server_url)
        return self._raw

    def key(self, key: LockKey) -> str:
        return f"{self.namespace}:lock:{{{key.hex}}}"

    def left(self, key: LockKey) -> float | None:
        pttl = int(self.raw.pttl(self.key(key)))
        assert pttl != -1, "a lease key without an expiry"
        return None if pttl < 0 else pttl / 1000.0

    def fence_of(self, key: LockKey) -> int | None:
        stored = self.raw.hget(self.key(key), "f")
        return None if stored is None else int(stored)

    def lease_ids(self) -> set[bytes]:
        return set(self.raw.scan_iter(f"{self.namespace}:*", count=1000))

    def id_of(self, key: LockKey) -> bytes:
        return self.key(key).encode()

    def delete(self, key: LockKey) -> None:
        assert self.raw.delete(self.key(key)) == 1

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()


class PostgresStore(Store):
    """``postgresql://``: one row per lease in a table."""

    kind = "postgresql"
    module = "_postgres"
    durable = True
    scope_parameter = "table"

    def __init__(
        self, server_url: str, scope: str | None, options: str = ""
    ) -> None:
        super().__init__(server_url, scope, options)
        self.table = scope or "resilient_locks"
        self._raw: psycopg.Connection[Any] | None = None

    @property
    def raw(self) -> psycopg.Connection[Any]:
        """A plain connection to the server (made on first use)."""
        if self._raw is None:
            self._raw = psycopg.connect(self.server_url, autocommit=True)
        return self._raw

    def _one(self, sql: str, key: LockKey) -> Any:
        try:
            row = self.raw.execute(sql, (key.digest,)).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        return None if row is None else row[0]

    def left(self, key: LockKey) -> float | None:
        left = self._one(
            "SELECT extract(epoch FROM expires_at - clock_timestamp()) "  # noqa: S608
            f"FROM {self.table} WHERE key = %s AND owner IS NOT NULL",
            key,
        )
        return None if left is None or left <= 0 else float(left)

    def fence_of(self, key: LockKey) -> int | None:
        fence = self._one(
            f"SELECT fence FROM {self.table} WHERE key = %s",  # noqa: S608
            key,
        )
        return None if fence is None else int(fence)

    def lease_ids(self) -> set[bytes]:
        try:
            rows = self.raw.execute(
                f"SELECT key FROM {self.table} WHERE key <> ''::bytea"  # noqa: S608
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            return set()
        return {bytes(r[0]) for r in rows}

    def id_of(self, key: LockKey) -> bytes:
        return key.digest

    def delete(self, key: LockKey) -> None:
        gone = self.raw.execute(
            f"DELETE FROM {self.table} WHERE key = %s",  # noqa: S608
            (key.digest,),
        ).rowcount
        assert gone == 1

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()


def store_of(
    kind: str, server_url: str, scope: str | None = None, options: str = ""
) -> Store:
    """A `Store` of *kind* (``redis``, ``postgresql``) on *server_url*,
    namespaced by *scope* (else the backend's defaults), its lock URL with
    the lock URL *options* (``"timeout=0.5"``)."""
    cls = RedisStore if kind == "redis" else PostgresStore
    return cls(server_url, scope, options)
