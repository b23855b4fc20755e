"""
The embedded store's tables and statements, its URL and the boot id.

One statement grants and mints: ``fence = max(row + 1, floor + 1, wall
µs)``; a deleted row's fence is folded into the floor by a trigger in the
same statement. Statements take positional parameters (binding a dict of
names costs more than the rest of the call) and are prepared once by
`sqlite3`'s statement cache.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, unquote

from resilient.exceptions import ConfigError


#: Seconds a statement waits for another process's write lock.
BUSY_TIMEOUT: Final = 5.0

#: Every this many grants, free and expired rows of other names are swept.
SWEEP_EVERY: Final = 256

#: The page size of a new database: a grant or a release writes one page
#: to the WAL, and a small page costs less to checksum and write.
PAGE_SIZE: Final = 1024

#: Bytes of the database file read through ``mmap`` instead of ``read``.
MMAP_SIZE: Final = 1 << 23

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS leases (
        name TEXT PRIMARY KEY,
        owner BLOB NOT NULL,
        fence INTEGER NOT NULL,
        expires_ns INTEGER NOT NULL,
        boot TEXT NOT NULL,
        flocked INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS floor (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        fence INTEGER NOT NULL
    )""",
    "INSERT OR IGNORE INTO floor VALUES (0, 0)",
    # A deleted row's fence is folded into the floor in the same statement.
    """CREATE TRIGGER IF NOT EXISTS leases_floor AFTER DELETE ON leases
    BEGIN
        UPDATE floor SET fence = max(fence, old.fence) WHERE id = 0;
    END""",
)


def numbered(*values: object) -> dict[str, object]:
    """
    The values of a statement with numbered placeholders (``?1``, ``?2``...),
    bound by name: given a sequence, CPython 3.12.0 to 3.12.3 take ``?NNN``
    for a named parameter and warn (a DeprecationWarning that 3.14 would make
    an error); bound by name, every version reads them alike.
    """
    return {str(i): value for i, value in enumerate(values, 1)}


# One statement grants and mints: fence = max(row + 1, floor + 1, wall µs).
# ?1 name, ?2 owner, ?3 wall-clock µs, ?4 expiry, ?5 boot, ?6 the inode of
# the lock file whose flock the taker holds (0: none), ?7 now (monotonic ns).
# A live row is taken over only by a taker that holds the flock of the very
# inode the holder recorded (it must be gone): a fresh file made after the
# holder's was removed proves nothing.
ACQUIRE: Final = """
INSERT INTO leases (name, owner, fence, expires_ns, boot, flocked)
VALUES (
    ?1, ?2, max((SELECT fence FROM floor WHERE id = 0) + 1, ?3), ?4, ?5, ?6
)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner,
    fence = max(leases.fence + 1, excluded.fence),
    expires_ns = excluded.expires_ns,
    boot = excluded.boot,
    flocked = excluded.flocked
WHERE leases.expires_ns <= ?7 OR leases.boot != ?5
    OR leases.owner = ?2 OR (?6 != 0 AND leases.flocked = ?6)
RETURNING fence
"""

HOLDER: Final = "SELECT expires_ns, boot, owner FROM leases WHERE name = ?"

# ?1 expiry, ?2 name, ?3 owner, ?4 boot, ?5 now.
RENEW: Final = """
UPDATE leases SET expires_ns = ?1
WHERE name = ?2 AND owner = ?3 AND boot = ?4 AND expires_ns > ?5
"""

# A released row is marked free (expires_ns = 0) and kept for the next grant
# of the name; the sweep deletes it. Only a lease still ours and unexpired
# counts as released.
RELEASE: Final = """
UPDATE leases SET expires_ns = 0
WHERE name = ? AND owner = ? AND expires_ns > ? AND boot = ?
"""

SWEEP: Final = """
DELETE FROM leases WHERE name IN (
    SELECT name FROM leases WHERE expires_ns <= ? OR boot != ? LIMIT 256
)
"""


#: Linux's id of this boot.
BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"

#: The boot id where the system gives none: no lease is ever taken for
#: being of an earlier boot; leases expire, and the flock proves a holder
#: gone after a reboot as after a crash.
NO_BOOT_ID: Final = "unknown"


def boot_id() -> str:
    """
    This boot's id: Linux's `BOOT_ID_FILE`; macOS's
    ``kern.bootsessionuuid``; elsewhere `NO_BOOT_ID`.

    Never derived from the clocks: the wall clock steps, and where there is
    no ``/proc`` the monotonic clock stops while the machine sleeps, so
    ``time() - monotonic()`` moves within one boot, and a new process would
    take every live lease as one of an earlier boot.
    """
    with contextlib.suppress(OSError):
        return Path(BOOT_ID_FILE).read_text().strip()
    if sys.platform == "darwin":  # pragma: no cover - macOS only
        found = _darwin_boot_session()
        if found:
            return f"darwin:{found}"
    return NO_BOOT_ID


def _darwin_boot_session() -> str | None:  # pragma: no cover - macOS only
    """macOS's per-boot UUID (``sysctl kern.bootsessionuuid``), or None."""
    try:
        import ctypes  # noqa: PLC0415
        import ctypes.util  # noqa: PLC0415

        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        size = ctypes.c_size_t(64)
        buf = ctypes.create_string_buffer(64)
        if libc.sysctlbyname(
            b"kern.bootsessionuuid", buf, ctypes.byref(size), None, 0
        ):
            return None
        return buf.value.decode("ascii", "replace") or None
    except (OSError, AttributeError, TypeError):
        return None


def parse(url: str) -> tuple[Path, bool]:
    """The database path and whether to fsync every commit."""
    rest = url.partition("://")[2]
    path, _, query = rest.partition("?")
    if not path.startswith("/") or path == "/":
        raise ConfigError(
            "lock(backend)",
            "sqlite://",
            "needs a path: sqlite:///relative/file or sqlite:////absolute/file",
        )
    options = parse_qs(query)
    sync = options.pop("synchronous", ["normal"])[-1].lower()
    if options or sync not in {"normal", "full"}:
        raise ConfigError(
            "lock(backend)",
            "sqlite://",
            "takes only ?synchronous=normal or ?synchronous=full",
        )
    return Path(unquote(path[1:])), sync == "full"
