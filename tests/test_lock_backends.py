"""
The backend contract (`tests/lock_contract.py`) on the stores that need no
server: ``memory://`` and the embedded ``sqlite://``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from resilient._backends import LockKey, open_backend
from resilient._backends import _memory as memory
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

    @pytest.fixture
    def lock_backend_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'locks.sqlite3'}"

    @pytest.fixture
    def delete_lease(self) -> Callable[[str, LockKey], None]:
        def delete(url: str, key: LockKey) -> None:
            path = open_backend(url).path  # type: ignore[attr-defined]
            with sqlite3.connect(path) as db:
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
            with sqlite3.connect(path) as db:
                return int(
                    db.execute("SELECT count(*) FROM leases").fetchone()[0]
                )

        return count
