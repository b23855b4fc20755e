"""
Wake-ups for PostgreSQL waiters: the release statement calls
``pg_notify(<the table's channel>, <the key in hex>)`` in the same
statement (delivered when it commits), and one ``LISTEN`` connection per
table in a process tells the waiters of that key (`PostgresHub`). An
expiry notifies nothing: a waiter sees it when it looks again, right after
the holder's lease would end (the time left its last try reported) or on
its backoff, whichever is first.

One channel per table, not per lock: ``LISTEN`` is per channel and session,
so the hub listens once and picks the waiters by the payload; a process
with waiters receives the releases of every lock of the table (72 bytes
each), and a release costs one notification whether anyone waits or not.
"""

from __future__ import annotations

import hashlib
import select
from typing import TYPE_CHECKING, Any, Final, final

import psycopg
import psycopg.sql

from resilient._backends._watch import LINGER, WatchHub, hub_for


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._backends._postgres._statements import Options


__all__ = ["PostgresHub", "channel_of", "store_hub"]

#: Longest wait for notifications between two looks at the watchers.
IDLE_CHECK: Final = LINGER / 2


def channel_of(table: tuple[str, ...]) -> str:
    """The notification channel of a lease table: a short identifier (a
    channel name is at most 63 bytes; a schema-qualified table may not be)."""
    digest = hashlib.sha256(".".join(table).encode()).hexdigest()
    return f"resilient_free_{digest[:24]}"


@final
class PostgresHub(WatchHub):
    """One ``LISTEN`` connection for one lease table's channel."""

    def __init__(self, driver_url: str, channel: str, timeout: float) -> None:
        super().__init__("postgresql")
        self._url = driver_url
        self._channel = channel
        self._timeout = timeout

    def _serve(self) -> None:
        conn: Any = psycopg.Connection.connect(
            self._url,
            autocommit=True,
            connect_timeout=str(max(2, round(self._timeout))),
        )
        with conn:
            conn.execute(
                psycopg.sql.SQL("LISTEN {}").format(
                    psycopg.sql.Identifier(self._channel)
                )
            )
            # Listening now: a release before this (after a waiter's last
            # look) would go unseen, so every waiter looks again once.
            self.tell_all()
            while not self.done():
                self.drain()
                for note in conn.notifies(timeout=0.0):
                    self.tell(note.payload)
                select.select(
                    [conn.fileno(), self.wake_fd()], [], [], IDLE_CHECK
                )


def store_hub(
    options: Options, channel: str
) -> tuple[WatchHub, Callable[[], None]]:
    """The process's wake-up hub of the table *options* name (shared by its
    sync and async backends), and the release a backend calls at close."""
    return hub_for(
        ("postgresql", options.driver_url, channel),
        lambda: PostgresHub(options.driver_url, channel, options.timeout),
    )
