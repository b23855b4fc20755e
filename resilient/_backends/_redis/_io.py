"""
The I/O adapters of the Redis backend: `RedisBackend` on redis-py's sync
client and `AsyncRedisBackend` on its asyncio client, over the commands of
`resilient._backends._redis._commands`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import urllib.parse
import weakref
from typing import TYPE_CHECKING, Any, Final, final

import anyio
import redis
import redis.asyncio
from redis import exceptions as rx

from resilient._backends._base import Busy, Grant, ReleaseResult
from resilient._backends._kept import (
    DEFAULT_MAX,
    AsyncSlots,
    Count,
    Kept,
    Slot,
    Slots,
)
from resilient._backends._redis._closed import closed_by_server
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
        LockKey,
        OwnerToken,
        Renewal,
    )


__all__ = ["AsyncRedisBackend", "RedisBackend"]

_POOL_OPTIONS: Final = ("socket_timeout", "socket_connect_timeout")


def _new_connection(
    pool: Any, limit: float, *, io_limit: float | None = None
) -> Any:
    """
    A connection of *pool*'s class and options (TLS, password, database,
    every URL option), not connected, whose connect takes at most *limit*
    and each later write or read *io_limit* (None: no limit of redis-py's).
    Made here, not checked out: the pool's checkout and release count it in
    a strong set and against ``max_connections``, and an interrupt inside
    either (or between a checkout and our ``try``) left it counted.
    """
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_connect_timeout"] = limit
    kwargs["socket_timeout"] = io_limit
    return pool.connection_class(**kwargs)


def _limit(pool: Any, options: Options) -> int:
    """The URL's ``max_connections`` (as redis-py read it), or
    `DEFAULT_MAX` (redis-py's own default is 100 or unbounded, by
    version)."""
    query = urllib.parse.urlsplit(options.driver_url).query
    given = "max_connections" in urllib.parse.parse_qs(query)
    return int(pool.max_connections) if given else DEFAULT_MAX


def _too_many(limit: int) -> rx.ConnectionError:
    # What redis-py's pool raised past its max_connections.
    return rx.ConnectionError(
        f"Too many connections (max_connections={limit})"
    )


@final
class _Kept(Kept):
    """A `Kept` redis-py connection, counted against the URL's
    ``max_connections`` (redis-py's default if none)."""

    __slots__ = ()

    shut = "disconnect"


@final
class RedisBackend:
    """
    `LockBackend` on redis-py's sync client.

    The backend makes its connections from the URL's pool options and
    keeps those that answered, in `_idle`, for the next call (`_IDLE` at
    most): taking one is a list pop, where the pool's checkout takes a
    lock, records its metrics and polls the socket for stray data. Only a
    connection whose reply was read in full is kept; one that failed, or
    that an interrupt stopped mid-call, is disconnected. A kept connection
    the server closed meanwhile (an idle timeout, a restart) is seen by
    the poll before use and replaced; one that fails later is retried
    once by the lock, which is harmless, since every script is idempotent
    on the owner token. Each connection is held by a `_Kept`, so that an
    interrupt at any point of a call loses neither it nor its place in
    ``max_connections``.
    """

    scheme = "redis"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._commands = Commands(options.namespace, options.timeout)
        kwargs = dict.fromkeys(_POOL_OPTIONS, options.timeout)
        self._pool: redis.ConnectionPool = redis.ConnectionPool.from_url(
            options.driver_url, **kwargs
        )
        self._count = Count(_limit(self._pool, options))
        self._slots = Slots(self._count.limit)
        self._idle: list[_Kept] = []
        self._hub, self._unhub = _hub(options)
        self._options = options
        _KEEPERS.add(self)

    def __repr__(self) -> str:
        return f"RedisBackend(namespace={self._commands.namespace!r})"

    def _fresh(self, command: Command) -> _Kept:
        """A new connection, connected within the call's limit."""
        count = self._count
        if count.open >= count.limit:
            exc = _too_many(count.limit)
            raise backend_error(exc, command, self._options) from exc
        kept = _Kept(
            _new_connection(self._pool, command.limit, io_limit=command.limit),
            count,
        )
        try:
            kept.conn.connect()
        except BaseException as exc:
            kept.close()
            if isinstance(exc, rx.RedisError | OSError):
                raise backend_error(exc, command, self._options) from exc
            raise
        return kept

    def _take(self, idle: list[_Kept], command: Command) -> _Kept:
        """A kept connection that is still open, or a new one."""
        while True:
            try:
                kept = idle.pop()
            except IndexError:
                return self._fresh(command)
            try:
                # As the pool's checkout does: a connection the server
                # closed (or one with stray data) reads as ready.
                stale = kept.conn.can_read()
            except (rx.RedisError, OSError):
                stale = True
            except BaseException:
                kept.close()
                raise
            if not stale:
                return kept
            kept.close()

    def _run(self, command: Command, *, urgent: bool = False) -> Any:
        """One call, once the pool has room for it (`Slots`: a release or
        renewal is *urgent*, never behind acquirers)."""
        if command.limit <= 0:
            raise _timed_out(command, self._options.where)
        slot = Slot(self._slots)
        try:
            if not self._slots.take(slot, command.limit, urgent=urgent):
                raise _timed_out(command, self._options.where)
            return self._run_held(command)
        finally:
            slot.give()

    def _run_held(self, command: Command) -> Any:
        """One call on a connection; kept if it answered, else closed."""
        idle = self._idle
        kept = self._take(idle, command)
        try:
            reply = self._call(kept.conn, command, command.limit)
        except BaseException as exc:
            kept.close()
            if isinstance(exc, rx.RedisError | OSError):
                raise backend_error(exc, command, self._options) from exc
            raise
        # From the end of the ``try`` to the append there is no call, so
        # no interrupt: the connection is closed by the handler or kept.
        idle.append(kept)
        if len(idle) > _IDLE:
            _trim(idle)
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
        return self.acquire_as(key, owner, ttl, threading.current_thread())

    def acquire_as(
        self, key: LockKey, owner: OwnerToken, ttl: float, who: object
    ) -> Grant | Busy:
        """`acquire` for *who* (a thread or task), in its turn in the
        process's line for the lock (`WatchHub.begin`)."""
        channel, hub = self._commands.channel(key), self._hub
        if not hub.begin(channel, who):
            return Busy(None, queued=True)
        reply = self._run(self._commands.acquire(key, owner, ttl))
        answer = Commands.read_acquire(reply, ttl)
        if isinstance(answer, Grant):
            hub.granted(channel, who)
        return answer

    def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        reply = self._run(self._commands.renew(batch), urgent=True)
        return Commands.read_renew(reply, len(batch))

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        reply = self._run(self._commands.release(key, owner), urgent=True)
        return self._released(key, Commands.read_release(reply))

    def _released(self, key: LockKey, result: ReleaseResult) -> ReleaseResult:
        """Wake the head of this process's line for *key* at once."""
        if result is ReleaseResult.RELEASED:
            self._hub.tell(self._commands.channel(key), here=True)
        return result

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        return self.watch_as(key, notify, threading.current_thread())

    def queued(self, key: LockKey, who: object) -> bool:
        """Whether others of this process are ahead of *who* in line."""
        return not self._hub.begin(self._commands.channel(key), who)

    def watch_as(
        self, key: LockKey, notify: Callable[[], None], who: object
    ) -> Callable[[], None]:
        """`watch` for *who*: it joins the lock's line."""
        return self._hub.watch(self._commands.channel(key), notify, who)

    def close(self) -> None:
        """Close the kept connections; those in use close as their calls
        end (they go back to the list taken here, which nothing holds)."""
        self._unhub()
        idle, self._idle = self._idle, []
        while idle:
            idle.pop().close()

    def _forked(self) -> None:
        """In a forked child: the kept connections are the parent's (closed
        here without a shutdown, which would end them for the parent)."""
        self._count = Count(self._count.limit)
        self._slots = Slots(self._count.limit)
        self._idle = []


def _trim(idle: list[_Kept]) -> None:
    """Close the oldest kept connection (a pop: freed if interrupted)."""
    with contextlib.suppress(IndexError):  # Another thread took the last.
        idle.pop(0).close()


@final
class AsyncRedisBackend:
    """
    `AsyncLockBackend` on redis-py's asyncio client; makes and keeps its
    connections as `RedisBackend` does, in one event loop (one thread), so
    a connection goes from the idle list to the call's ``try`` and back by
    statements with no call between them, where no interrupt can land.
    """

    scheme = "redis"
    max_renew_batch = MAX_RENEW_BATCH

    def __init__(self, options: Options) -> None:
        self._commands = Commands(options.namespace, options.timeout)
        kwargs = dict.fromkeys(_POOL_OPTIONS, options.timeout)
        self._pool: Any = redis.asyncio.ConnectionPool.from_url(
            options.driver_url, **kwargs
        )
        self._count = Count(_limit(self._pool, options))
        self._slots = AsyncSlots(self._count.limit)
        self._idle: list[Any] = []
        self._closed = False
        self._hub, self._unhub = _hub(options)
        self._options = options
        _KEEPERS.add(self)

    def __repr__(self) -> str:
        return f"AsyncRedisBackend(namespace={self._commands.namespace!r})"

    async def _run(
        self,
        command: Command,
        *,
        urgent: bool = False,
        sent: Callable[[], None] | None = None,
    ) -> Any:
        """One call (*sent* is called once its request is written)."""
        if command.limit <= 0:
            raise _timed_out(command, self._options.where)
        slot = Slot(self._slots)
        try:
            return await self._run_held(command, slot, urgent, sent)
        finally:
            slot.give()

    async def _run_held(
        self,
        command: Command,
        slot: Slot,
        urgent: bool,
        sent: Callable[[], None] | None,
    ) -> Any:
        """One call on a connection once `AsyncSlots` has room for it (the
        wait counted in the call's limit); kept if it answered."""
        idle = self._idle
        conn: Any = None
        try:
            with anyio.fail_after(command.limit):
                await self._slots.take(slot, urgent=urgent)
                if idle:
                    # Not idle.pop(): an interrupt after that call returned
                    # would drop the connection from the stack, uncounted.
                    conn = idle[-1]
                    del idle[-1]
                    if closed_by_server(conn):
                        # Connected anew below, in the same place.
                        await conn.disconnect(nowait=True)
                    # The pool's own check at checkout as well (connects a
                    # disconnected one).
                    await self._pool.ensure_connection(conn)
                else:
                    conn = await self._fresh(command)
                reply = await self._call(conn, command, sent)
        except BaseException as exc:
            if conn is not None and conn not in idle:
                # No call from the test to the count: it is exact even if
                # an interrupt stops the disconnect.
                self._count.open -= 1
                await _disconnect(conn)
            if isinstance(exc, rx.RedisError | OSError):
                raise backend_error(exc, command, self._options) from exc
            raise
        # No call from the ``with`` block's exit to the append, so no
        # interrupt: the connection is dropped by the handler or kept.
        idle.append(conn)
        if len(idle) > _IDLE or self._closed:
            await self._trim(idle)
        return reply

    async def _fresh(self, command: Command) -> Any:
        """A new connection, connected within the call's limit (in the
        caller's ``fail_after``); its ``return`` and the caller's
        assignment have no call between them."""
        count = self._count
        if count.open >= count.limit:
            raise _too_many(count.limit)
        # No socket timeout of redis-py's (the caller's ``fail_after`` is
        # the limit): with one, each send goes through ``wait_for``, a
        # task of its own before Python 3.12 (two more turns of the loop).
        conn = _new_connection(self._pool, command.limit)
        count.open += 1
        try:
            await self._pool.ensure_connection(conn)
        except BaseException:
            count.open -= 1
            await _disconnect(conn)
            raise
        return conn

    async def _trim(self, idle: list[Any]) -> None:
        """Close the oldest kept connection."""
        if idle:
            conn = idle[0]
            del idle[0]
            self._count.open -= 1
            try:
                await _disconnect(conn)
            except BaseException:
                await _disconnect(conn)  # Interrupted at its start.
                raise

    @staticmethod
    async def _call(
        conn: Any, command: Command, sent: Callable[[], None] | None
    ) -> Any:
        await conn.send_command(*command.evalsha())
        if sent is not None:
            sent()
        try:
            return await conn.read_response()
        except rx.NoScriptError:
            await conn.send_command(*command.eval())
            return await conn.read_response()

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        channel, hub = self._commands.channel(key), self._hub
        who = asyncio.current_task()
        if not hub.begin(channel, who):
            return Busy(None, queued=True)
        reply = await self._run(self._commands.acquire(key, owner, ttl))
        answer = Commands.read_acquire(reply, ttl)
        if isinstance(answer, Grant):
            hub.granted(channel, who)
        return answer

    async def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        if not batch:
            return []
        reply = await self._run(self._commands.renew(batch), urgent=True)
        return Commands.read_renew(reply, len(batch))

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """
        Compare-and-delete, waking the head of this process's line once the
        request is written (`WatchHub.hint`: its acquire overlaps our round
        trip; the store mostly reads ours first), and once it is answered
        if still head (`WatchHub.tell`: its early try was answered busy).
        """
        channel, hub = self._commands.channel(key), self._hub
        command = self._commands.release(key, owner)
        hinted: list[object] = []
        reply = await self._run(
            command, urgent=True, sent=lambda: hinted.append(hub.hint(channel))
        )
        result = Commands.read_release(reply)
        if result is ReleaseResult.RELEASED:
            hub.tell(channel, here=True, hinted=hinted[0] if hinted else None)
        return result

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        channel = self._commands.channel(key)
        return self._hub.watch(channel, notify, asyncio.current_task())

    async def aclose(self) -> None:
        """Close the kept connections; those in use close as their calls
        end."""
        self._unhub()
        self._closed = True
        idle = self._idle
        while idle:
            await self._trim(idle)

    def _forked(self) -> None:
        """In a forked child: the kept connections are the parent's."""
        self._count = Count(self._count.limit)
        self._slots = AsyncSlots(self._count.limit)
        self._idle = []


async def _disconnect(conn: Any) -> None:
    """Disconnect an asyncio connection (its reply may be unread),
    shielded from cancellation."""
    with anyio.CancelScope(shield=True):
        try:
            await conn.disconnect(nowait=True)
        except BaseException:
            await conn.disconnect(nowait=True)  # Stopped midway.
            raise


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
