"""
The backend contract (`tests/lock_contract.py`) on the stores that need no
server: ``memory://`` and the embedded ``sqlite://``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from resilient._backends import LockKey, open_backend
from resilient._backends import _memory as memory
from resilient._backends import _sqlite as sqlite
from tests.lock_contract import BackendContract


class TestMemory(BackendContract):
    """``memory://``: the contract, in one process."""

    @pytest.fixture
    def lock_backend_url(self) -> str:
        return f"memory://contract-{uuid.uuid4().hex}"

    @pytest.fixture
    def delete_lease(self) -> Callable[[str, LockKey], None]:
        def delete(url: str, key: LockKey) -> None:
            assert memory.store(url).delete(key)

        return delete

    @pytest.fixture
    def count_rows(self) -> Callable[[str], int]:
        return lambda url: memory.store(url).rows()


class TestSqlite(BackendContract):
    """``sqlite://``: the contract, on a file in a temporary directory."""

    kept_rows = sqlite.SWEEP_EVERY  # Released rows wait for the sweep.

    @pytest.fixture
    def lock_backend_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'locks.sqlite3'}"

    @pytest.fixture
    def delete_lease(self) -> Callable[[str, LockKey], None]:
        def delete(url: str, key: LockKey) -> None:
            path = open_backend(url).path  # type: ignore[attr-defined]
            with contextlib.closing(sqlite3.connect(path)) as db, db:
                gone = db.execute(
                    "DELETE FROM leases WHERE name = ?", (key.hex,)
                ).rowcount
            assert gone == 1

        return delete

    @pytest.fixture
    def count_rows(self) -> Callable[[str], int]:
        def count(url: str) -> int:
            backend = open_backend(url)
            backend._connection()  # type: ignore[attr-defined]
            path = backend.path  # type: ignore[attr-defined]
            with contextlib.closing(sqlite3.connect(path)) as db, db:
                return int(
                    db.execute("SELECT count(*) FROM leases").fetchone()[0]
                )

        return count


def test_owner_tokens_compare_by_value_and_keys_show_short_names() -> None:
    """Owner tokens compare in constant time by value and hash alike; a
    key's repr cuts long names."""
    from resilient._backends import OwnerToken

    a = OwnerToken(b"x" * 20)
    assert a == OwnerToken(b"x" * 20)
    assert a != OwnerToken()
    assert a != "x"
    assert hash(a) == hash(OwnerToken(b"x" * 20))
    assert a.hex == "78" * 20
    assert repr(LockKey.of("n" * 500)).endswith("...')")


def test_renewal_keeps_an_embedded_lease_past_several_ttls(
    tmp_path: Path,
) -> None:
    """On the embedded store (real time, TTL 0.3 s), the renewer keeps the
    lease for four TTLs; another owner is refused all along."""
    import time

    import resilient
    from resilient._backends import Busy, OwnerToken

    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    with resilient.lock("job", backend=url, ttl=0.3) as lease:
        for _ in range(4):
            time.sleep(0.3)
            busy = open_backend(url).acquire(
                LockKey.of("job"), OwnerToken(), 1
            )
            assert isinstance(busy, Busy)
        assert lease.held


def test_backends_close_and_are_forgotten(tmp_path: Path) -> None:
    """Closing a backend lets go of its connection (reopened on next use);
    forgetting the cache hands every backend back for closing, and the
    file's one live store is found again."""
    from resilient import _backends
    from resilient._backends import Grant, OwnerToken

    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    backend = open_backend(url)
    backend.acquire(LockKey.of("a"), OwnerToken(), 1.0)
    backend.close()
    assert isinstance(
        backend.acquire(LockKey.of("b"), OwnerToken(), 1.0), Grant
    )
    gone = _backends.forget_backends()
    assert backend in gone
    # Still one store per file in the process (a live one is found again).
    assert open_backend(url) is backend
    memory.store("memory://close").close()
    assert "leases" in repr(memory.store("memory://close"))
