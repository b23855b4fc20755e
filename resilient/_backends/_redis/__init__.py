"""
The Redis lock backend (``redis://`` and ``rediss://``), on redis-py.

Each operation is one Lua script, one round trip uncontended, written once
here (`Commands`: the scripts, their keys and arguments, and the parsing of
their replies) under two thin I/O adapters: `RedisBackend` on redis-py's
sync client and `AsyncRedisBackend` on its asyncio client (trio runs the
sync one in worker threads).

**Keys.** A lock's lease is one hash, ``<namespace>:lock:{<sha256 hex of the
name>}`` (the braces are a cluster hash tag: every key of one lock shares
it), with field ``o`` (the owner token, hex) and ``f`` (the fencing token),
and a server-side expiry (``PEXPIRE``, milliseconds rounded up, never down
to 0). Nothing else is stored per name.

**Fencing tokens.** A grant mints ``f = max(stored f + 1, TIME in µs)`` in
the acquire script itself:

* a name whose hash still exists (held by us, or released less than
  `TOMBSTONE_MS` ago: a release keeps ``f`` and drops ``o``) counts up from
  the stored value, whatever the clock does;
* a name without a hash (never used, expired, or released longer ago)
  starts from the server's clock in microseconds: the hash went away by an
  expiry at least a millisecond after its last grant, or by a release
  tombstone at least `TOMBSTONE_MS` after it, so the clock has moved past
  the last fence (which is that grant's time, or at most a few counts above
  it);
* after a restart that lost the data (no ``appendfsync always``), the clock
  is the floor too, so tokens keep rising unless the server's clock was
  stepped back by more than the time the server was down.

So storage is one small hash per held (or just released) name, and no
counter per name is kept forever (redisson#6510).

**Wake-ups.** The release script publishes on the lock's channel
``<namespace>:free:{<hex>}`` (same hash tag); `watch` subscribes to it
through the process's one subscribed connection per server
(`resilient._backends._redis._watch`). An expiry publishes nothing.

**Errors** map to `LockBackendError`: ``OOM``, ``READONLY``, ``LOADING``,
``BUSY``, ``TRYAGAIN``, ``MASTERDOWN``, ``CLUSTERDOWN``, connection errors and
timeouts are retryable; ``WRONGTYPE``, ``NOAUTH``, ``WRONGPASS``, ``NOPERM``
and other ``ERR`` replies are not (the lock raises them from an acquire at
once). A lease key of another type is "not ours" to renew and release
(``pcall``), so it fails no other lease of a renewal batch. ``NOSCRIPT``
(after ``SCRIPT FLUSH`` or a restart) is handled here: the script is sent
again in full, once.

**Time limits.** Every call is bounded by the enclosing deadline
(`resilient.remaining()`), by the lease's ttl for acquire and renew (a reply
later than that is of no use), and by the URL's ``timeout`` (seconds,
default 2). A call past its limit drops its connection (its reply, if any,
is never read) and raises `LockBackendError` with reason ``"timeout"``.

Not for Redis Cluster: the batched renewal sends the keys of many locks in
one script, which a cluster refuses across slots. Use one node (with
replicas; note that a failover can lose a grant, which is what fencing
tokens are for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import sniffio

from resilient._backends._redis._commands import (
    ACQUIRE,
    DEFAULT_TIMEOUT,
    MAX_RENEW_BATCH,
    RELEASE,
    RENEW,
    TOMBSTONE_MS,
    Command,
    Commands,
    Options,
    backend_error,
    parse_url,
)
from resilient._backends._redis._io import AsyncRedisBackend, RedisBackend
from resilient._backends._threaded import ThreadedAsyncBackend


if TYPE_CHECKING:
    from resilient._backends._base import AsyncLockBackend, LockBackend


__all__ = [
    "ACQUIRE",
    "DEFAULT_TIMEOUT",
    "EXTRA",
    "MAX_RENEW_BATCH",
    "RELEASE",
    "RENEW",
    "TOMBSTONE_MS",
    "AsyncRedisBackend",
    "Command",
    "Commands",
    "Options",
    "RedisBackend",
    "async_backend",
    "backend_error",
    "parse_url",
    "sync_backend",
]

#: The extra that installs redis-py.
EXTRA: Final = "redis"


def sync_backend(url: str) -> LockBackend:
    """The sync backend for a ``redis://`` or ``rediss://`` URL."""
    return RedisBackend(parse_url(url))


def async_backend(url: str) -> AsyncLockBackend:
    """
    The async backend for *url* in the running event loop: redis-py's
    asyncio client on asyncio, the sync client in worker threads elsewhere
    (trio).
    """
    options = parse_url(url)
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = "asyncio"
    if library == "asyncio":
        return AsyncRedisBackend(options)
    # The process's sync backend of the URL, shared: a run of this loop
    # opens no connection that could outlive it.
    from resilient._backends import open_backend  # noqa: PLC0415

    return ThreadedAsyncBackend(open_backend(url), owns=False)
