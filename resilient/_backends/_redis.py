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
(`resilient._backends._redis_watch`). An expiry publishes nothing.

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

import hashlib
import math
import re
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, final

import anyio
import attrs
import redis
import redis.asyncio
import sniffio
from redis import exceptions as rx

from resilient._backends._base import (
    Busy,
    Grant,
    ReleaseResult,
    call_limit,
    hide,
    ttl_ms,
    url_seconds,
    url_secrets,
    url_where,
)
from resilient._backends._redis_watch import RedisHub
from resilient._backends._threaded import ThreadedAsyncBackend
from resilient._backends._watch import WatchHub, hub_for
from resilient.exceptions import ConfigError, LockBackendError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        AsyncLockBackend,
        LockBackend,
        LockKey,
        OwnerToken,
        Renewal,
    )


__all__ = [
    "EXTRA",
    "AsyncRedisBackend",
    "Commands",
    "RedisBackend",
    "async_backend",
    "sync_backend",
]

#: The extra that installs redis-py.
EXTRA: Final = "redis"

#: How long a released lease's hash keeps its fence (and nothing else).
TOMBSTONE_MS: Final = 1000

#: Leases renewed by one script (one round trip).
MAX_RENEW_BATCH: Final = 100

#: The default time limit of one call, in seconds (URL: ``timeout=``).
DEFAULT_TIMEOUT: Final = 2.0

_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# KEYS[1] the lease hash; ARGV[1] owner, ARGV[2] ttl in ms.
# -> {1, fence} granted (also when ARGV[1] already holds it), {0, pttl} busy.
_ACQUIRE = """\
local owner = redis.call('HGET', KEYS[1], 'o')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('HGET', KEYS[1], 'f')}
end
if owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('HGET', KEYS[1], 'f'))
if last and last >= fence then fence = last + 1 end
fence = string.format('%d', fence)
redis.call('HSET', KEYS[1], 'o', ARGV[1], 'f', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
"""

# KEYS[i] lease hashes; ARGV[2i-1] owner, ARGV[2i] ttl in ms.
# -> one 1 (renewed) or 0 (not ours any more) per key.
_RENEW = """\
local out = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('HGET', key, 'o') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# KEYS[1] the lease hash; ARGV[1] owner, ARGV[2] tombstone ms, ARGV[3]
# the lock's wake-up channel. -> 1 released (and waiters told), 0 not ours.
_RELEASE = """\
if redis.pcall('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'o')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], '')
  return 1
end
return 0
"""

_RETRYABLE: Final = frozenset(
    {"OOM", "READONLY", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN"}
    | {"CLUSTERDOWN", "connection", "timeout"}
)


@final
class Script:
    """A Lua script and its SHA-1 (the ``EVALSHA`` name)."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        digest = hashlib.sha1(source.encode(), usedforsecurity=False)
        self.sha = digest.hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.sha[:8]})"


ACQUIRE: Final = Script(_ACQUIRE)
RENEW: Final = Script(_RENEW)
RELEASE: Final = Script(_RELEASE)


@final
@attrs.frozen(repr=False)
class Command:
    """
    One script call: what to send. Its arguments hold owner tokens, so its
    repr shows only the script.
    """

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    limit: float

    def evalsha(self) -> tuple[str | int, ...]:
        return (
            "EVALSHA",
            self.script.sha,
            len(self.keys),
            *self.keys,
            *self.args,
        )

    def eval(self) -> tuple[str | int, ...]:
        return (
            "EVAL",
            self.script.source,
            len(self.keys),
            *self.keys,
            *self.args,
        )

    def __repr__(self) -> str:
        return f"Command({self.script!r}, {len(self.keys)} keys)"


@final
@attrs.frozen
class Options:
    """What a lock URL says, split into the driver's URL and ours."""

    driver_url: str
    namespace: str
    timeout: float
    where: str
    secrets: tuple[str, ...] = ()


def parse_url(url: str) -> Options:
    """
    Split our query parameters (``namespace``, ``timeout``) off *url*; the
    rest goes to redis-py. Errors name the parameter, never the URL.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    rest: list[tuple[str, str]] = []
    namespace = "resilient"
    timeout = DEFAULT_TIMEOUT
    for name, value in query:
        if name == "namespace":
            if not _NAMESPACE.fullmatch(value):
                raise ConfigError(
                    "redis URL namespace",
                    value[:64],
                    "must be 1-64 letters, digits or _ . : -",
                )
            namespace = value
        elif name == "timeout":
            timeout = url_seconds(value)
        else:
            rest.append((name, value))
    driver = parts._replace(
        query=urllib.parse.urlencode(rest, quote_via=urllib.parse.quote)
    ).geturl()
    return Options(
        driver, namespace, timeout, url_where(url), url_secrets(url)
    )


@final
class Commands:
    """The sans-IO layer: the scripts to run and how to read their replies."""

    __slots__ = ("namespace", "timeout")

    def __init__(self, namespace: str, timeout: float) -> None:
        self.namespace = namespace
        self.timeout = timeout

    def key(self, key: LockKey) -> str:
        """The Redis key of a lock's lease hash."""
        return f"{self.namespace}:lock:{{{key.hex}}}"

    def channel(self, key: LockKey) -> str:
        """The channel a release of the lock publishes on (its hash tag)."""
        return f"{self.namespace}:free:{{{key.hex}}}"

    def _limit(self, cap: float) -> float:
        return call_limit(cap, self.timeout)

    def acquire(self, key: LockKey, owner: OwnerToken, ttl: float) -> Command:
        return Command(
            ACQUIRE,
            (self.key(key),),
            (owner.hex, ttl_ms(ttl)),
            self._limit(ttl),
        )

    @staticmethod
    def read_acquire(reply: Any, ttl: float) -> Grant | Busy:
        granted, value = reply
        if granted == 1:
            return Grant(fence=int(value), ttl=ttl_ms(ttl) / 1000.0)
        pttl = int(value)
        return Busy(expires_in=pttl / 1000.0 if pttl >= 0 else None)

    def renew(self, batch: Sequence[Renewal]) -> Command:
        args: list[str | int] = []
        for r in batch:
            args += (r.owner.hex, ttl_ms(r.ttl))
        return Command(
            RENEW,
            tuple(self.key(r.key) for r in batch),
            tuple(args),
            self._limit(min(r.ttl for r in batch)),
        )

    @staticmethod
    def read_renew(reply: Any, n: int) -> list[bool]:
        if len(reply) != n:  # pragma: no cover - the script answers n
            raise LockBackendError(
                "redis",
                "reply",
                f"{len(reply)} results for {n} renewals",
                retryable=False,
            )
        return [r == 1 for r in reply]

    def release(self, key: LockKey, owner: OwnerToken) -> Command:
        return Command(
            RELEASE,
            (self.key(key),),
            (owner.hex, TOMBSTONE_MS, self.channel(key)),
            self._limit(math.inf),
        )

    @staticmethod
    def read_release(reply: Any) -> ReleaseResult:
        return ReleaseResult.RELEASED if reply == 1 else ReleaseResult.NOT_HELD


def backend_error(
    exc: BaseException, command: Command, store: Options | None = None
) -> LockBackendError:
    """The documented error for a redis-py exception (or an OSError)."""
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError):
        code = "NOAUTH"
    elif isinstance(exc, rx.BusyLoadingError):
        code = "LOADING"
    elif isinstance(exc, rx.TimeoutError | TimeoutError):
        code = "timeout"
    elif isinstance(exc, rx.ConnectionError | OSError):
        code = "connection"
    elif isinstance(exc, rx.ResponseError):
        code = getattr(exc, "status_code", None) or (
            str(exc).split(" ", 1)[0] or "ERR"
        )
        if not code.isupper():
            code = "ERR"
    else:
        code = type(exc).__name__
    message = str(exc)[:200] or type(exc).__name__
    for arg in command.args:
        # Defensive: an error text never carries an owner token.
        if isinstance(arg, str) and len(arg) >= 32:
            message = message.replace(arg, "(secret)")
    if store is not None:
        message = hide(message, store.secrets)
    return LockBackendError(
        "redis",
        code,
        message,
        retryable=code in _RETRYABLE,
        where=store.where if store else None,
    )


def _timed_out(command: Command, where: str) -> LockBackendError:
    return LockBackendError(
        "redis",
        "timeout",
        f"no reply within {command.limit:.3f} s",
        retryable=True,
        where=where,
    )


_POOL_OPTIONS: Final = ("socket_timeout", "socket_connect_timeout")


def _bound_handshake(pool: Any, limit: float) -> None:
    """
    Give a connection the pool makes for this call no more than *limit*
    for its connect and handshake (its later reads get their own limit).
    Shared by the pool's threads: a racing call may use another's limit,
    which is at most the URL's timeout either way.
    """
    kwargs = pool.connection_kwargs
    for option in _POOL_OPTIONS:
        kwargs[option] = limit


@final
class RedisBackend:
    """`LockBackend` on redis-py's sync client (one connection pool)."""

    scheme = "redis"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._commands = Commands(options.namespace, options.timeout)
        kwargs = dict.fromkeys(_POOL_OPTIONS, options.timeout)
        self._pool: redis.ConnectionPool = redis.ConnectionPool.from_url(
            options.driver_url, **kwargs
        )
        self._hub, self._unhub = _hub(options)
        self._options = options

    def __repr__(self) -> str:
        return f"RedisBackend(namespace={self._commands.namespace!r})"

    def _run(self, command: Command) -> Any:
        if command.limit <= 0:
            raise _timed_out(command, self._options.where)
        _bound_handshake(self._pool, command.limit)
        try:
            conn: Any = self._pool.get_connection()
        except (rx.RedisError, OSError) as exc:
            raise backend_error(exc, command, self._options) from exc
        done = False
        try:
            reply = self._call(conn, command)
            done = True
        except (rx.RedisError, OSError) as exc:
            raise backend_error(exc, command, self._options) from exc
        finally:
            if not done:
                conn.disconnect()
            self._pool.release(conn)
        return reply

    @staticmethod
    def _call(conn: Any, command: Command) -> Any:
        conn.send_command(*command.evalsha())
        try:
            return conn.read_response(timeout=command.limit)
        except rx.NoScriptError:
            conn.send_command(*command.eval())
            return conn.read_response(timeout=command.limit)

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        reply = self._run(self._commands.acquire(key, owner, ttl))
        return Commands.read_acquire(reply, ttl)

    def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        reply = self._run(self._commands.renew(batch))
        return Commands.read_renew(reply, len(batch))

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        reply = self._run(self._commands.release(key, owner))
        return Commands.read_release(reply)

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self._hub.watch(self._commands.channel(key), notify)

    def close(self) -> None:
        self._unhub()
        self._pool.disconnect()


@final
class AsyncRedisBackend:
    """`AsyncLockBackend` on redis-py's asyncio client."""

    scheme = "redis"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._commands = Commands(options.namespace, options.timeout)
        kwargs = dict.fromkeys(_POOL_OPTIONS, options.timeout)
        self._pool: Any = redis.asyncio.ConnectionPool.from_url(
            options.driver_url, **kwargs
        )
        self._hub, self._unhub = _hub(options)
        self._options = options

    def __repr__(self) -> str:
        return f"AsyncRedisBackend(namespace={self._commands.namespace!r})"

    async def _run(self, command: Command) -> Any:
        if command.limit <= 0:
            raise _timed_out(command, self._options.where)
        conn: Any = None
        done = False
        _bound_handshake(self._pool, command.limit)
        try:
            with anyio.fail_after(command.limit):
                conn = await self._pool.get_connection()
                reply = await self._call(conn, command)
            done = True
        except (rx.RedisError, OSError) as exc:
            raise backend_error(exc, command, self._options) from exc
        finally:
            if conn is not None:
                with anyio.CancelScope(shield=True):
                    if not done:
                        await conn.disconnect(nowait=True)
                    await self._pool.release(conn)
        return reply

    @staticmethod
    async def _call(conn: Any, command: Command) -> Any:
        await conn.send_command(*command.evalsha())
        try:
            return await conn.read_response()
        except rx.NoScriptError:
            await conn.send_command(*command.eval())
            return await conn.read_response()

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        reply = await self._run(self._commands.acquire(key, owner, ttl))
        return Commands.read_acquire(reply, ttl)

    async def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        reply = await self._run(self._commands.renew(batch))
        return Commands.read_renew(reply, len(batch))

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        reply = await self._run(self._commands.release(key, owner))
        return Commands.read_release(reply)

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self._hub.watch(self._commands.channel(key), notify)

    async def aclose(self) -> None:
        self._unhub()
        await self._pool.disconnect()


def _hub(options: Options) -> tuple[WatchHub, Callable[[], None]]:
    """The process's wake-up hub of the store *options* name (shared by its
    sync and async backends), and the release a backend calls at close."""
    return hub_for(
        ("redis", options.driver_url),
        lambda: RedisHub(options.driver_url, options.timeout),
    )


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
    return ThreadedAsyncBackend(RedisBackend(options))
