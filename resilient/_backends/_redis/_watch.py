"""
Wake-ups for Redis waiters: the release script publishes on the lock's own
channel, ``<namespace>:free:{<sha256 hex of the name>}`` (the lease key's
hash tag), and one subscribed connection per store in a process tells the
waiters (`RedisHub`). An expiry publishes nothing: a waiter sees it when it
looks again, which it does right after the holder's lease would end (the
``PTTL`` of its last try) or on its backoff, whichever is first.
"""

from __future__ import annotations

import select
from typing import Any, Final, final

import redis

from resilient._backends._watch import LINGER, WatchHub
from resilient._core import _internals


__all__ = ["RedisHub"]

#: Longest sleep of the thread between two looks at its watchers.
IDLE_CHECK: Final = LINGER / 2
#: How often it looks at the connection where redis-py's socket is unknown.
POLL: Final = 0.02


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@final
class RedisHub(WatchHub):
    """One ``SUBSCRIBE`` connection, its channels the watched locks'."""

    def __init__(self, driver_url: str, timeout: float) -> None:
        super().__init__("redis")
        # Its own pool: a subscribed connection never goes back to a pool;
        # RESP2, where pub/sub messages are plain replies.
        self._pool: Any = redis.ConnectionPool.from_url(
            driver_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            protocol=2,
        )

    def _serve(self) -> None:
        conn: Any = self._pool.make_connection()
        try:
            conn.connect()
            subscribed: set[str] = set()
            while not self.done():
                self.drain()
                wanted = self.channels()
                if gone := subscribed - wanted:
                    conn.send_command("UNSUBSCRIBE", *sorted(gone))
                if new := wanted - subscribed:
                    # Each confirmation tells the channel's waiters once.
                    conn.send_command("SUBSCRIBE", *sorted(new))
                subscribed = wanted
                while conn.can_read(0):
                    self._read(conn.read_response())
                # Without redis-py's socket (`redis_socket`): poll it.
                sock = _internals.redis_socket(conn)
                wake = self.wake_fd()
                ready: list[Any] = [wake] if sock is None else [sock, wake]
                select.select(
                    ready,
                    [],
                    [],
                    POLL if sock is None else IDLE_CHECK,
                )
        finally:
            conn.disconnect()

    def _read(self, message: Any) -> None:
        kind = _text(message[0])
        if kind in {"message", "subscribe"}:
            self.tell(_text(message[1]))

    def close(self) -> None:
        super().close()
        self._pool.disconnect()
