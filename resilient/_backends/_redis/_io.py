"""
The I/O adapters of the Redis backend: `RedisBackend` on redis-py's sync
client and `AsyncRedisBackend` on its asyncio client, over the commands of
`resilient._backends._redis._commands`.
"""

from __future__ import annotations

import os
import weakref
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
    """
    `LockBackend` on redis-py's sync client (one connection pool).

    A connection that answered is kept out of the pool, in `_idle`, for
    the next call (`_IDLE` at most): taking it is a list pop, where the
    pool's checkout takes a lock, records its metrics and polls the socket
    for stray data. Only a connection whose reply was read in full goes
    back; one that failed, or that an interrupt stopped mid-call, is
    disconnected and returned to the pool. A kept connection the server
    closed meanwhile (an idle timeout, a restart) fails at once on its
    next use: that call is sent once more on a fresh connection, which is
    harmless, since every script is idempotent on the owner token.
    """

    scheme = "redis"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._commands = Commands(options.namespace, options.timeout)
        kwargs = dict.fromkeys(_POOL_OPTIONS, options.timeout)
        self._pool: redis.ConnectionPool = redis.ConnectionPool.from_url(
            options.driver_url, **kwargs
        )
        self._idle: list[Any] = []
        self._hub, self._unhub = _hub(options)
        self._options = options
        _KEEPERS.add(self)

    def __repr__(self) -> str:
        return f"RedisBackend(namespace={self._commands.namespace!r})"

    def _fresh(self, command: Command) -> Any:
        """A connection from the pool, connected within the call's limit."""
        _bound_handshake(self._pool, command.limit)
        try:
            return self._pool.get_connection()
        except (rx.RedisError, OSError) as exc:
            raise backend_error(exc, command, self._options) from exc

    def _drop(self, conn: Any) -> None:
        """Disconnect *conn* (its reply may be unread) and give it back."""
        try:
            conn.disconnect()
        finally:
            self._pool.release(conn)

    def _keep(self, conn: Any) -> None:
        """*conn*'s reply was read in full: keep it for the next call."""
        if len(self._idle) < _IDLE:
            self._idle.append(conn)
        else:
            self._pool.release(conn)

    def _take(self, command: Command) -> Any:
        """A kept connection that is still open, or one from the pool."""
        idle = self._idle
        while idle:
            try:
                conn = idle.pop()
            except IndexError:  # Another thread took the last one.
                break
            try:
                # As the pool's checkout does: a connection the server
                # closed (or one with stray data) reads as ready.
                if not conn.can_read():
                    return conn
            except (rx.RedisError, OSError):
                pass
            self._drop(conn)
        return self._fresh(command)

    def _run(self, command: Command) -> Any:
        """One call on a connection; kept if it answered, else dropped."""
        if command.limit <= 0:
            raise _timed_out(command, self._options.where)
        # The connection is taken inside the ``try`` that drops it (as the
        # async twin does): an interrupt landing between the checkout and
        # the call no longer leaves it checked out of the pool for good.
        conn: Any = None
        try:
            conn = self._take(command)
            reply = self._call(conn, command, command.limit)
        except BaseException as exc:
            if conn is not None:
                self._drop(conn)
            if isinstance(exc, rx.RedisError | OSError):
                raise backend_error(exc, command, self._options) from exc
            raise
        self._keep(conn)
        return reply

    @staticmethod
    def _call(conn: Any, command: Command, limit: float) -> Any:
        conn.send_command(*command.evalsha())
        try:
            return conn.read_response(timeout=limit)
        except rx.NoScriptError:
            conn.send_command(*command.eval())
            return conn.read_response(timeout=limit)

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
        self._idle = []
        self._pool.disconnect()

    def _forked(self) -> None:
        """In a forked child: the kept connections are the parent's."""
        self._idle = []


@final
class AsyncRedisBackend:
    """
    `AsyncLockBackend` on redis-py's asyncio client; keeps answered
    connections out of the pool as `RedisBackend` does.
    """

    scheme = "redis"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._commands = Commands(options.namespace, options.timeout)
        kwargs = dict.fromkeys(_POOL_OPTIONS, options.timeout)
        self._pool: Any = redis.asyncio.ConnectionPool.from_url(
            options.driver_url, **kwargs
        )
        self._idle: list[Any] = []
        self._hub, self._unhub = _hub(options)
        self._options = options
        _KEEPERS.add(self)

    def __repr__(self) -> str:
        return f"AsyncRedisBackend(namespace={self._commands.namespace!r})"

    async def _run(self, command: Command) -> Any:
        if command.limit <= 0:
            raise _timed_out(command, self._options.where)
        idle = self._idle
        conn: Any = None
        try:
            with anyio.fail_after(command.limit):
                if idle:
                    conn = idle.pop()
                    # The pool's own check at checkout: reconnects one the
                    # server closed while it was kept.
                    await self._pool.ensure_connection(conn)
                else:
                    _bound_handshake(self._pool, command.limit)
                    conn = await self._pool.get_connection()
                reply = await self._call(conn, command)
        except BaseException as exc:
            if conn is not None:
                await self._adrop(conn)
            if isinstance(exc, rx.RedisError | OSError):
                raise backend_error(exc, command, self._options) from exc
            raise
        if len(idle) < _IDLE:
            idle.append(conn)
        else:
            await self._pool.release(conn)
        return reply

    async def _adrop(self, conn: Any) -> None:
        """Disconnect *conn* and give it back, shielded from cancellation."""
        with anyio.CancelScope(shield=True):
            try:
                await conn.disconnect(nowait=True)
            finally:
                await self._pool.release(conn)

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
        self._idle = []
        await self._pool.disconnect()

    def _forked(self) -> None:
        """In a forked child: the kept connections are the parent's."""
        self._idle = []


#: Answered connections a backend keeps out of its pool for the next call.
_IDLE: Final = 16

# Every backend keeping connections, to forget them in a forked child.
_KEEPERS: Final[weakref.WeakSet[RedisBackend | AsyncRedisBackend]] = (
    weakref.WeakSet()
)


def _forget_after_fork() -> None:
    for backend in list(_KEEPERS):
        backend._forked()  # noqa: SLF001


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_forget_after_fork)


def _hub(options: Options) -> tuple[WatchHub, Callable[[], None]]:
    """The process's wake-up hub of the store *options* name (shared by its
    sync and async backends), and the release a backend calls at close."""
    return hub_for(
        ("redis", options.driver_url),
        lambda: RedisHub(options.driver_url, options.timeout),
    )
