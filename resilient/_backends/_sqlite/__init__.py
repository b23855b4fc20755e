"""
``sqlite:///path``: the embedded default, an SQLite file and a flock per name.

Safe across the processes and threads of one host, with the standard
library only. The row of a lease in the ``leases`` table grants it and mints
its fencing token in one UPSERT statement (`._schema`); the lease's expiry
is on the host's monotonic clock (``CLOCK_MONOTONIC``, one clock for every
process of one boot), stored with the boot id so that a reboot expires
every lease. Beside the row, a holder keeps ``flock(LOCK_EX)`` on a file per
name, which wakes waiters and proves a dead holder gone (`._files`;
`._waiter` is how a release wakes a waiting thread with one wake-up).
`._store` has the sync store and its async twin.

URL: ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (as in
SQLAlchemy), with ``?synchronous=full`` to fsync every grant (power-loss
safe counters; ~10x slower) instead of WAL's ``NORMAL``. Under ``NORMAL`` a
power loss can drop the last transactions; fencing tokens still rise
because each is at least the wall-clock time in microseconds (unless the
wall clock went back across the reboot).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from typing import TYPE_CHECKING, Final

from resilient._backends._sqlite._files import CONTESTED_NS
from resilient._backends._sqlite._schema import SWEEP_EVERY, boot_id, parse
from resilient._backends._sqlite._store import (
    AsyncSqliteBackend,
    SqliteBackend,
)


if TYPE_CHECKING:
    from pathlib import Path


__all__ = [
    "CONTESTED_NS",
    "EXTRA",
    "SWEEP_EVERY",
    "AsyncSqliteBackend",
    "SqliteBackend",
    "async_backend",
    "boot_id",
    "parse",
    "sync_backend",
]

EXTRA: Final = None

_STORES: dict[tuple[Path, bool], SqliteBackend] = {}
_STORES_LOCK = threading.Lock()


@atexit.register
def _tidy_at_exit() -> None:
    """Remove the lock files this process cached and nobody else uses."""
    for store in list(_STORES.values()):
        with contextlib.suppress(Exception):
            store.clear_cache()


def _shared(url: str) -> SqliteBackend:
    path, durable = parse(url)
    path = path.absolute()
    with _STORES_LOCK:
        found = _STORES.get((path, durable))
        if found is None:
            found = _STORES[path, durable] = SqliteBackend(
                path, durable=durable
            )
        return found


def sync_backend(url: str) -> SqliteBackend:
    """The sync store of *url* (one per file per process)."""
    return _shared(url)


def async_backend(url: str) -> AsyncSqliteBackend:
    """The async store of *url*: the sync one, called from worker threads."""
    return AsyncSqliteBackend(_shared(url))
