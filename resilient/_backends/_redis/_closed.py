"""
Whether the server closed a kept asyncio Redis connection, asked before the
connection is used again.

The one place that reads redis-py's private stream attributes; see
`closed_by_server`.
"""

from __future__ import annotations

import select
from typing import Any, Final


def closed_by_server(conn: Any) -> bool:
    """
    Whether the server closed a kept asyncio connection (an idle timeout,
    ``CLIENT KILL``, a restart) or sent what no call asked for: its stream
    is at its end, or its socket is readable, polled as the sync client's
    check polls it. The socket, because a busy event loop may not have read
    the end of the stream yet; our own check, because redis-py's at
    checkout (``ensure_connection``) differs between releases (8.1's used
    such a connection; the call then failed). A TLS record the loop has
    not read yet also reads as closed: one needless reconnect.

    The stream is redis-py's private ``_reader``/``_writer`` (there since
    its asyncio client began, 4.2); where they are missing, redis-py's own
    check alone decides (`test_redis_backend` fails when they move).
    """
    reader = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    if reader is None or writer is None:
        return False
    if reader.at_eof() or reader.exception() is not None:
        return True
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    try:
        if _poll is None:  # pragma: no cover - Windows
            return bool(select.select([sock], [], [], 0)[0])
        poller = _poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


_poll: Final = getattr(select, "poll", None)
