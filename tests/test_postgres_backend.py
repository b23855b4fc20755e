"""
What only the PostgreSQL lock backend does, against a real server: the
floor row and the sweep, the table made on first use (also by many at
once, also in a schema), errors by SQLSTATE and terminated sessions. What
it shares with Redis is in ``test_server_backends.py``. Every scenario runs
on the sync twin and the async twin (asyncio, and trio through threads).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from resilient._backends import (
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    _postgres,
)
from resilient.exceptions import LockBackendError
from tests.backend_shells import Shell, open_shell
from tests.service_fixtures import RUN_ID, Services, with_query
from tests.services import PostgresServer


pytestmark = pytest.mark.postgres


@pytest.fixture
def table(request: pytest.FixtureRequest) -> str:
    """A lease table of this run and test."""
    return f"locks_{RUN_ID}_{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture
def raw(postgres_url: str) -> Iterator[psycopg.Connection]:
    """A plain connection to look at the server."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def shell(postgres_url: str, table: str, colour: str) -> Iterator[Shell]:
    """The backend twin of this test's colour on the shared test server."""
    with open_shell(
        "_postgres", with_query(postgres_url, table=table), colour
    ) as s:
        yield s


def test_sweep_folds_fences_into_the_floor(
    postgres_url: str,
    raw: psycopg.Connection,
    table: str,
    colour: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    Free and expired rows are swept (storage: one row per recently used
    name, plus the floor); their highest fence goes to the floor row in the
    same statement, so a swept name's next grant counts up from the floor
    even when the floor is ahead of the server's clock.
    """
    monkeypatch.setattr(_postgres._statements, "SWEEP_AFTER", "0 seconds")
    monkeypatch.setattr(_postgres._io, "SWEEP_EVERY", 0.0)
    connects = []
    for cls in (_postgres._Connection, _postgres._AsyncConnection):
        original = cls.connect

        def counted(*a: object, _original: Any = original, **k: object) -> Any:
            connects.append(1)
            return _original(*a, **k)

        monkeypatch.setattr(cls, "connect", counted)
    url = with_query(postgres_url, table=table)
    with open_shell("_postgres", url, colour) as shell:
        fences = []
        for i in range(20):
            key, owner = LockKey.of(f"swept-{i}"), OwnerToken()
            grant = shell.acquire(key, owner, 10.0)
            assert isinstance(grant, Grant)
            fences.append(grant.fence)
            assert shell.release(key, owner) is ReleaseResult.RELEASED
        time.sleep(0.01)
        shell.release(LockKey.of("nothing"), OwnerToken())  # sweeps
        rows = raw.execute(f"SELECT key, fence FROM {table}").fetchall()  # noqa: S608
        assert rows == [(b"", max(fences))]
        # A sweep keeps its connection (21 releases, each with a sweep).
        assert len(connects) <= 2
        future = (int(time.time()) + 10**6) * 10**6
        raw.execute(f"UPDATE {table} SET fence = %s", (future,))  # noqa: S608
        again = shell.acquire(LockKey.of("swept-3"), OwnerToken(), 1.0)
        assert again == Grant(fence=future + 1, ttl=1.0)


def test_table_made_once_by_many_at_once(
    postgres_url: str, table: str
) -> None:
    """
    Eight backends taking their first lock on a missing table at the same
    moment all succeed (the creation is serialised by an advisory lock).
    """
    url = with_query(postgres_url, table=table)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def first_use(i: int) -> None:
        backend = _postgres.sync_backend(url)
        try:
            barrier.wait()
            grant = backend.acquire(LockKey.of(f"n{i}"), OwnerToken(), 5.0)
            assert isinstance(grant, Grant)
        except BaseException as e:
            errors.append(e)
        finally:
            backend.close()

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_schema_qualified_table(
    postgres_url: str, raw: psycopg.Connection, table: str, colour: str
) -> None:
    """``table=schema.name`` puts the leases in that schema."""
    raw.execute(f"CREATE SCHEMA IF NOT EXISTS s_{table}")
    url = with_query(postgres_url, table=f"s_{table}.leases")
    with open_shell("_postgres", url, colour) as shell:
        assert isinstance(
            shell.acquire(LockKey.of("x"), OwnerToken(), 1.0), Grant
        )
    count = raw.execute(f"SELECT count(*) FROM s_{table}.leases").fetchone()  # noqa: S608
    assert count == (1,)


# Errors by SQLSTATE ---------------------------------------------------------


def _expect(shell: Shell, reason: str, *, retryable: bool) -> LockBackendError:
    owner = OwnerToken()
    with pytest.raises(LockBackendError) as info:
        shell.acquire(LockKey.of("err"), owner, 1.0)
    error = info.value
    assert (error.reason, error.retryable) == (reason, retryable)
    assert error.scheme == "postgresql"
    assert owner.hex not in str(error)
    return error


def test_unknown_role_is_not_retryable(postgres_url: str, colour: str) -> None:
    """A refused login (SQLSTATE 28000): final."""
    url = postgres_url.replace("postgres@", "nobody_here@", 1)
    with open_shell("_postgres", url, colour) as shell:
        _expect(shell, "28000", retryable=False)


def test_missing_privilege_is_not_retryable(
    postgres_url: str, raw: psycopg.Connection, table: str, colour: str
) -> None:
    """A role without rights on the table (42501): final."""
    role = f"r_{table}"
    raw.execute(f"CREATE ROLE {role} LOGIN")
    raw.execute(_postgres.CREATE_TABLE.format(table=table))
    url = with_query(
        postgres_url.replace("postgres@", f"{role}@", 1), table=table
    )
    with open_shell("_postgres", url, colour) as shell:
        _expect(shell, "42501", retryable=False)


def test_read_only_server_is_retryable(
    postgres_url: str, table: str, colour: str
) -> None:
    """A read-only session (a standby, 25006): retryable, nothing granted."""
    url = with_query(
        postgres_url,
        table=table,
        options="-c%20default_transaction_read_only%3Don",
    )
    with open_shell("_postgres", url, colour) as shell:
        _expect(shell, "25006", retryable=True)


def test_table_of_another_shape_is_not_retryable(
    postgres_url: str, raw: psycopg.Connection, table: str, colour: str
) -> None:
    """A table of that name without our columns (42703): final."""
    raw.execute(f"CREATE TABLE {table} (key bytea PRIMARY KEY)")
    with open_shell(
        "_postgres", with_query(postgres_url, table=table), colour
    ) as shell:
        _expect(shell, "42703", retryable=False)


# Dead, frozen and terminated servers; lost replies --------------------------


@pytest.fixture(scope="module")
def fault_server(test_services: Services) -> Iterator[PostgresServer]:
    """
    A throwaway server of this module's own that its tests freeze, kill
    and restart (each leaves it running; one server for all of them, as a
    fresh one costs a second or two to start).
    """
    server = test_services.postgres()
    yield server
    test_services.release(server)


@pytest.fixture
def own_server(fault_server: PostgresServer, colour: str) -> Iterator[Shell]:
    """The backend on a throwaway server this test may break."""
    with open_shell(
        "_postgres", fault_server.url + "?timeout=0.5", colour
    ) as s:
        yield s


def test_terminated_session_is_retryable(
    own_server: Shell, fault_server: PostgresServer
) -> None:
    """
    A session ended by ``pg_terminate_backend`` (an operator, a failover
    tool) makes the next call on it raise a retryable error; the call after
    it, on a new connection, releases the lease.
    """
    shell = own_server
    key, owner = LockKey.of(f"terminated-{shell.colour}"), OwnerToken()
    assert isinstance(shell.acquire(key, owner, 30.0), Grant)
    with psycopg.connect(fault_server.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
    with pytest.raises(LockBackendError) as info:
        shell.release(key, owner)
    assert info.value.retryable
    assert shell.release(key, owner) is ReleaseResult.RELEASED


@pytest.mark.parametrize("library", ["sync", "asyncio"])
def test_the_sweep_keeps_up_with_many_names(
    postgres_url: str, raw: psycopg.Connection, table: str, library: str
) -> None:
    """
    A table holding 5,000 rows due for the sweep (what 10,000 names a
    minute leave behind) is swept within a few releases, a bounded batch
    (`SWEEP_BATCH`) per release, not one batch a minute: a sweep that
    finds a full batch sweeps again at the next release. At 4f15275 a
    process deleted at most 1,000 rows a minute, so such a table grew
    without bound.
    """
    url = with_query(postgres_url, table=table)
    keys = [LockKey.of(f"k{i}") for i in range(8)]

    def seed() -> None:
        raw.execute(
            f"INSERT INTO {table} (key, owner, fence, expires_at)"  # noqa: S608
            " SELECT sha256(i::text::bytea), NULL, i,"
            " clock_timestamp() - interval '2 minutes'"
            " FROM generate_series(1, 5000) AS i"
        )

    def rows() -> int:
        row = raw.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608
        assert row is not None
        return int(row[0])

    if library == "sync":
        backend = _postgres.sync_backend(url)
        try:
            backend.release(keys[0], OwnerToken())  # makes the table
            seed()
            backend._next_sweep = 0.0  # type: ignore[attr-defined]  # due now
            for key in keys:
                backend.release(key, OwnerToken())
        finally:
            backend.close()
    else:

        async def main() -> None:
            backend = _postgres.async_backend(url)
            try:
                await backend.release(keys[0], OwnerToken())
                seed()
                backend._next_sweep = 0.0  # type: ignore[attr-defined]
                for key in keys:
                    await backend.release(key, OwnerToken())
            finally:
                await backend.aclose()

        asyncio.run(main())
    # The floor row is all that is left.
    assert rows() <= 1
