"""
The I/O adapters of the Redis backend: `RedisBackend` on redis-py's sync
client and `AsyncRedisBackend` on its asyncio client, over the commands of
`resilient._backends._redis._commands`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, final

import anyio
import redis
import redis.asyncio
from redis import exceptions as rx

from resilient._backends._redis._commands import (
    MAX_RENEW_BATCH,
    Command,
    Commands,
    Options,
    _timed_out,
    backend_error,
)
from resilient._backends._redis._watch import RedisHub
from resilient._backends._watch import WatchHub, hub_for


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from resilient._backends._base import (
        Busy,
        Grant,
        LockKey,
        OwnerToken,
        ReleaseResult,
        Renewal,
    )


__all__ = ["AsyncRedisBackend", "RedisBackend"]

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
