"""
A server backend's connection and its only strong reference (`Kept`),
and the count of a backend's open connections against its limit
(`Count`): shared by the Redis and PostgreSQL backends, which keep their
own connections out of their client libraries' pools.

A `Kept` is held by the backend's idle list or by the one call using it.
It is closed by that owner, or else when the last reference to it goes
(`__del__`): an interrupt that lands between an ``idle.pop()`` and the
``try`` that owns what it returned drops the popped value from the stack,
and CPython frees it there and then (a `Kept` is in no reference cycle,
where redis-py's connections are). So a connection is idle, in use, or
closed and uncounted; never lost, never left to the client library's
finaliser (psycopg's warns), never held after its call.
"""

from __future__ import annotations

from typing import Any, ClassVar


__all__ = ["Count", "Kept"]


class Count:
    """
    The connections a backend has open, against its *limit*. Updated by
    plain ``+=``/``-=`` statements, which have no call or backward jump:
    CPython checks for a signal, an asynchronous exception or a thread
    switch at neither, so no update is ever half done or lost to another
    thread.
    """

    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0


class Kept:
    """
    One connection, and the place it takes in *count* (if the backend
    counts them). `shut` names the connection's method that closes it.
    """

    __slots__ = ("conn", "count")

    shut: ClassVar[str] = "close"

    def __init__(self, conn: Any, count: Count | None = None) -> None:
        # No call between the count and the assignment that `close` reads:
        # an interrupt lands before both (at this method's start) or after.
        self.count = count
        if count is not None:
            count.open += 1
        self.conn = conn

    def close(self) -> None:
        """Close the connection and give its place back, once."""
        conn, self.conn = self.conn, None  # Taken with no call: atomic.
        if conn is None:
            return
        count = self.count
        if count is not None:
            count.open -= 1
        try:
            getattr(conn, self.shut)()
        except BaseException:
            # An interrupt stopped the first one at its start or midway.
            getattr(conn, self.shut)()
            raise

    def __del__(self) -> None:
        # Not contextlib.suppress: a finaliser makes as few calls as it can.
        try:  # noqa: SIM105
            self.close()
        except Exception:  # noqa: BLE001, S110 - at exit, or half made
            pass
