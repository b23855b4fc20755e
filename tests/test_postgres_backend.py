"""
The PostgreSQL lock backend against a real server: the protocol's contract,
fences and the floor row, the sweep, the table made on first use, TTL
units, names, error mapping by SQLSTATE, time limits and lost replies.
Every scenario runs on the sync twin and the async twin (asyncio, and trio
through threads).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
    _postgres,
)
from resilient.exceptions import ConfigError, LockBackendError
from tests.backend_shells import Shell, open_shell
from tests.faultproxy import FaultProxy
from tests.lock_contract import BackendContract
from tests.service_fixtures import RUN_ID, Services, with_query
from tests.services import PostgresServer


pytestmark = pytest.mark.postgres


@pytest.fixture(params=["sync", "asyncio", "trio"])
def colour(request: pytest.FixtureRequest) -> str:
    """Each scenario on the sync twin and on the async twin (two loops)."""
    return str(request.param)


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


def test_acquire_busy_regrant_renew_release(
    shell: Shell, raw: psycopg.Connection, table: str
) -> None:
    """
    The table is made on first use; a free name is granted with a fence;
    another owner finds it busy with the time left; the holder's retry is
    granted again with the same fence; renew and release are
    compare-and-set on the owner; release is harmless to repeat.
    """
    key = LockKey.of("job")
    me, other = OwnerToken(), OwnerToken()
    grant = shell.acquire(key, me, 5.0)
    assert isinstance(grant, Grant)
    assert grant.ttl == 5.0
    busy = shell.acquire(key, other, 5.0)
    assert isinstance(busy, Busy)
    assert busy.expires_in is not None
    assert 4.0 < busy.expires_in <= 5.0
    assert shell.acquire(key, me, 7.0) == Grant(fence=grant.fence, ttl=7.0)
    assert shell.renew([Renewal(key, other, 9.0), Renewal(key, me, 9.0)]) == [
        False,
        True,
    ]
    left = raw.execute(
        f"SELECT extract(epoch FROM expires_at - clock_timestamp()) "  # noqa: S608
        f"FROM {table} WHERE key = %s",
        (key.digest,),
    ).fetchone()
    assert left is not None
    assert 8.5 < float(left[0]) <= 9.0
    assert shell.release(key, other) is ReleaseResult.NOT_HELD
    assert shell.release(key, me) is ReleaseResult.RELEASED
    assert shell.release(key, me) is ReleaseResult.NOT_HELD
    assert shell.renew([Renewal(key, me, 1.0)]) == [False]
    following = shell.acquire(key, other, 1.0)
    assert isinstance(following, Grant)
    assert following.fence > grant.fence


def test_fences_rise_across_release_and_expiry(shell: Shell) -> None:
    """
    Fences strictly increase per name over 100 grants, alternating release
    and expiry on the server's clock; an expired lease is not renewed.
    """
    key = LockKey.of("counter")
    last = 0
    for i in range(100):
        owner = OwnerToken()
        grant = shell.acquire(key, owner, 0.001 if i % 2 else 10.0)
        assert isinstance(grant, Grant)
        assert grant.fence > last
        last = grant.fence
        if i % 2 == 0:
            assert shell.release(key, owner) is ReleaseResult.RELEASED
        else:
            time.sleep(0.002)
            assert shell.renew([Renewal(key, owner, 1.0)]) == [False]


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
    monkeypatch.setattr(_postgres, "SWEEP_AFTER", "0 seconds")
    monkeypatch.setattr(_postgres, "SWEEP_EVERY", 0.0)
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


@pytest.mark.parametrize("ttl", [0.0001, 0.5, 1.5])
def test_ttl_units(
    shell: Shell, raw: psycopg.Connection, table: str, ttl: float
) -> None:
    """
    TTLs are whole milliseconds rounded up, never down to 0: the row
    expires on the server's clock that long after the grant (read between
    two clock readings taken before and after the acquire).
    """
    key = LockKey.of(f"ttl-{ttl}")
    now = "SELECT clock_timestamp()"
    before = raw.execute(now).fetchone()
    grant = shell.acquire(key, OwnerToken(), ttl)
    after = raw.execute(now).fetchone()
    assert isinstance(grant, Grant)
    assert grant.ttl == max(0.001, ttl)
    row = raw.execute(
        f"SELECT expires_at FROM {table} WHERE key = %s",  # noqa: S608
        (key.digest,),
    ).fetchone()
    assert before is not None
    assert after is not None
    assert row is not None
    applied = round(max(ttl, 0.001), 3)
    assert (row[0] - after[0]).total_seconds() <= applied
    assert (row[0] - before[0]).total_seconds() >= applied


def test_names_are_hashed(
    shell: Shell, raw: psycopg.Connection, table: str
) -> None:
    """
    Names with NUL (which PostgreSQL text cannot hold), quotes, SQL, lone
    surrogates, NFC/NFD twins and a megabyte of text each get their own row
    keyed by the 32-byte hash; none blocks another.
    """
    names = [
        "a\x00b",
        "' OR 1=1 --",
        "\ud800",
        "\u00e9t\u00e9",
        "e\u0301te\u0301",
    ]
    names.append("x" * 1_000_000)
    for name in names:
        assert isinstance(
            shell.acquire(LockKey.of(name), OwnerToken(), 5.0), Grant
        )
    keys = {
        bytes(r[0])
        for r in raw.execute(f"SELECT key FROM {table}").fetchall()  # noqa: S608
    }
    assert keys == {LockKey.of(n).digest for n in names}


def test_bad_url_options_fail_at_construction() -> None:
    """
    A table name that is not an identifier, or a bad timeout, is a
    ConfigError naming the parameter, not the URL.
    """
    for table in ("x;drop", "a.b.c", '"q"', ""):
        with pytest.raises(ConfigError, match="table") as info:
            _postgres.sync_backend(
                f"postgresql://u:hunter2@h/db?table={table}"
            )
        assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match="timeout"):
        _postgres.sync_backend("postgresql://h/db?timeout=-1")


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


def test_paused_server_ends_each_call_within_its_limit(
    own_server: Shell, fault_server: PostgresServer
) -> None:
    """
    With the server frozen (SIGSTOP), acquire, renew and release each raise
    a retryable timeout within their limit; after SIGCONT the lease is as
    it was: never a false grant or release.
    """
    shell = own_server
    key, owner = LockKey.of(f"frozen-{shell.colour}"), OwnerToken()
    grant = shell.acquire(key, owner, 5.0)
    assert isinstance(grant, Grant)
    fault_server.pause()
    try:
        for call, limit in (
            (lambda: shell.acquire(key, OwnerToken(), 0.2), 0.2),
            (lambda: shell.renew([Renewal(key, owner, 0.3)]), 0.3),
            (lambda: shell.release(key, owner), 0.5),
        ):
            start = time.monotonic()
            with pytest.raises(LockBackendError) as info:
                call()
            assert info.value.reason == "timeout"
            assert info.value.retryable
            assert (
                time.monotonic() - start < limit + 0.5
            )  # slack: loaded machine
    finally:
        fault_server.resume()
    assert isinstance(shell.acquire(key, OwnerToken(), 1.0), Busy)
    assert shell.acquire(key, owner, 5.0) == Grant(grant.fence, 5.0)


def test_killed_restarted_and_terminated(
    own_server: Shell, fault_server: PostgresServer
) -> None:
    """
    A killed server makes calls raise retryable connection errors; after a
    restart the lease and its fence are still there (the table is durable);
    a session ended by ``pg_terminate_backend`` is a retryable error too.
    """
    shell = own_server
    key, owner = LockKey.of(f"restart-{shell.colour}"), OwnerToken()
    first = shell.acquire(key, owner, 30.0)
    assert isinstance(first, Grant)
    fault_server.kill()
    with pytest.raises(LockBackendError) as info:
        shell.renew([Renewal(key, owner, 30.0)])
    assert info.value.retryable
    fault_server.start()
    assert shell.acquire(key, owner, 30.0) == Grant(first.fence, 30.0)
    with psycopg.connect(fault_server.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
    with pytest.raises(LockBackendError) as info:
        shell.release(key, owner)
    assert info.value.retryable
    assert shell.release(key, owner) is ReleaseResult.RELEASED


def test_dropped_reply_to_a_grant_is_recognised(
    fault_server: PostgresServer, colour: str
) -> None:
    """
    The reply to a successful acquire is lost (connection reset after the
    server committed): the retry by the same owner gets its lease and the
    same fence at once; another owner finds it busy.
    """
    with (
        FaultProxy(fault_server.port) as proxy,
        open_shell(
            "_postgres",
            proxy.url("postgresql", "/postgres?user=postgres&timeout=1"),
            colour,
        ) as shell,
    ):
        key, owner = LockKey.of(f"lost-reply-{colour}"), OwnerToken()
        assert isinstance(
            shell.acquire(LockKey.of(f"warm-{colour}"), owner, 1.0), Grant
        )
        proxy.drop_next_reply(then="reset")
        with pytest.raises(LockBackendError) as info:
            shell.acquire(key, owner, 30.0)
        assert info.value.retryable
        granted = shell.acquire(key, owner, 30.0)
        assert isinstance(granted, Grant)
        assert isinstance(shell.acquire(key, OwnerToken(), 30.0), Busy)
        with psycopg.connect(fault_server.url) as conn:
            row = conn.execute(
                "SELECT fence FROM resilient_locks WHERE key = %s",
                (key.digest,),
            ).fetchone()
        assert row == (granted.fence,)


def test_small_cases(shell: Shell, postgres_url: str, table: str) -> None:
    """
    An empty renewal batch needs no round trip; `watch` is a no-op; reprs
    show no owner token; an expired deadline is a timeout before anything
    is sent; libpq's own URL parameters pass through; made outside an
    event loop, the async twin is the asyncio one.
    """
    import resilient

    owner = OwnerToken()
    key = LockKey.of("small")
    assert list(shell.renew([])) == []
    stop = shell.backend.watch(key, lambda: None)
    stop()
    query = _postgres.Statements(("t",), 1.0).acquire(key, owner, 1.0)
    for text in (repr(shell.backend), repr(query)):
        assert owner.hex not in text
    with resilient.deadline(0), pytest.raises(LockBackendError) as info:
        shell.acquire(key, owner, 1.0)
    assert info.value.reason == "timeout"
    url = with_query(postgres_url, table=table, application_name="locks")
    backend = _postgres.sync_backend(
        url.replace("postgresql:", "postgres:", 1)
    )
    assert isinstance(backend.acquire(key, owner, 1.0), Grant)
    backend.close()
    assert isinstance(
        _postgres.async_backend(url), _postgres.AsyncPostgresBackend
    )


# The backend contract (tests/lock_contract.py) ----------------------------


class TestPostgresContract(BackendContract):
    """``postgresql://``: the contract every backend keeps."""

    @pytest.fixture
    def lock_backend_url(self, postgres_url: str) -> str:
        return with_query(postgres_url, table=f"c{uuid.uuid4().hex}")

    @pytest.fixture
    def delete_lease(
        self, raw: psycopg.Connection
    ) -> Callable[[str, LockKey], None]:
        def delete(url: str, key: LockKey) -> None:
            table = url.rsplit("table=", 1)[1]
            gone = raw.execute(
                f"DELETE FROM {table} WHERE key = %s",  # noqa: S608
                (key.digest,),
            ).rowcount
            assert gone == 1

        return delete

    @pytest.fixture
    def count_rows(
        self, raw: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
    ) -> Callable[[str], int]:
        # Free rows wait for the sweep (a minute by default): sweep at every
        # release here, as the store settles; the floor row is not a lease.
        monkeypatch.setattr(_postgres, "SWEEP_AFTER", "0 seconds")
        monkeypatch.setattr(_postgres, "SWEEP_EVERY", 0.0)

        def count(url: str) -> int:
            table = url.rsplit("table=", 1)[1]
            try:
                row = raw.execute(
                    f"SELECT count(*) FROM {table} WHERE key <> ''::bytea"  # noqa: S608
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                return 0
            assert row is not None
            return int(row[0])

        return count
