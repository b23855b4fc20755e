"""
The resource's side of fencing: `resilient.fenced_update` applies a write
only when its token is newer than the row's, in one statement.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator

import pytest

import resilient


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    """A table with one row that no write has fenced yet."""
    conn = sqlite3.connect(":memory:")
    conn.execute('CREATE TABLE "re""ports" (id INTEGER, body TEXT, fence INT)')
    conn.execute("""INSERT INTO "re""ports" VALUES (1, NULL, NULL)""")
    yield conn
    conn.close()


def body(db: sqlite3.Connection) -> tuple[str | None, int | None]:
    return db.execute('SELECT body, fence FROM "re""ports"').fetchone()


def test_newer_tokens_write_and_older_ones_are_refused(
    db: sqlite3.Connection,
) -> None:
    """A write with a newer token is applied and records the token; one
    with the same or an older token is refused and changes nothing."""
    write = resilient.fenced_update
    assert write(db, 're"ports', {"body": "a"}, where={"id": 1}, token=5)
    assert body(db) == ("a", 5)
    assert not write(db, 're"ports', {"body": "b"}, where={"id": 1}, token=5)
    assert not write(db, 're"ports', {"body": "c"}, where={"id": 1}, token=4)
    assert body(db) == ("a", 5)
    assert write(db, 're"ports', {"body": "d"}, where={"id": 1}, token=6)
    assert body(db) == ("d", 6)
    assert not write(db, 're"ports', {"body": "e"}, where={"id": 2}, token=9)


def test_a_lock_holder_fences_its_writes(
    db: sqlite3.Connection, tmp_path: object
) -> None:
    """With the lease's token, the second holder's write wins and the first
    holder's late write is refused."""
    url = f"memory://fence-{uuid.uuid4().hex}"
    first = resilient.lock("report", backend=url).acquire()
    first.release()
    with resilient.lock("report", backend=url) as second:
        assert resilient.fenced_update(
            db,
            're"ports',
            {"body": "new"},
            where={"id": 1},
            token=second.token,
        )
    assert not resilient.fenced_update(
        db, 're"ports', {"body": "stale"}, where={"id": 1}, token=first.token
    )
    assert body(db)[0] == "new"


def test_guard_and_identifiers() -> None:
    """The guard condition quotes its column; bad identifiers, tokens and
    empty ``where`` are refused."""
    assert resilient.fence_guard() == '("fence" IS NULL OR "fence" < ?)'
    assert resilient.fence_guard("f", "%s") == '("f" IS NULL OR "f" < %s)'
    conn = sqlite3.connect(":memory:")
    with pytest.raises(resilient.ConfigTypeError):
        resilient.fenced_update(conn, "t", {}, where={"id": 1}, token=True)
    with pytest.raises(resilient.ConfigError, match="where"):
        resilient.fenced_update(conn, "t", {}, where={}, token=1)
    with pytest.raises(resilient.ConfigError, match="NUL"):
        resilient.fenced_update(conn, "t\0", {}, where={"id": 1}, token=1)
    with pytest.raises(resilient.ConfigTypeError):
        resilient.fenced_update(conn, (), {}, where={"id": 1}, token=1)
    conn.execute("ATTACH ':memory:' AS s")
    conn.execute("CREATE TABLE s.t (id INT, fence INT)")
    conn.execute("INSERT INTO s.t VALUES (1, 0)")
    assert resilient.fenced_update(
        conn, ("s", "t"), {}, where={"id": 1}, token=1
    )
    conn.close()


def test_an_unknown_placeholder_style_is_refused() -> None:
    """A driver whose placeholders are neither ``?`` nor ``%s`` is refused
    rather than sent a statement it would misread."""
    import types

    module = types.ModuleType("fakedb")
    module.paramstyle = "named"  # type: ignore[attr-defined]
    conn_type = type("Conn", (), {"__module__": "fakedb"})
    import sys

    sys.modules["fakedb"] = module
    try:
        with pytest.raises(resilient.ConfigError, match="paramstyle"):
            resilient.fenced_update(
                conn_type(), "t", {}, where={"a": 1}, token=1
            )
    finally:
        del sys.modules["fakedb"]


@pytest.mark.postgres
def test_psycopg_connections(postgres_url: str) -> None:
    """The same statement works on psycopg (``%s`` placeholders), on the
    test server (a throwaway one, or DATABASE_URL without the binaries)."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TEMP TABLE jobs (id INT, body TEXT, fence BIGINT)"
        )
        conn.execute("INSERT INTO jobs VALUES (1, NULL, NULL)")
        write = resilient.fenced_update
        assert write(conn, "jobs", {"body": "a"}, where={"id": 1}, token=7)
        assert not write(conn, "jobs", {"body": "b"}, where={"id": 1}, token=7)
        row = conn.execute("SELECT body, fence FROM jobs").fetchone()
        assert row == ("a", 7)
