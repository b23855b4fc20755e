"""
A real HTTP server for client tests: the standard library's, in a thread,
on a free loopback port. Paths script its answers:

- ``/status/<code>``: that status (``Retry-After: 7`` on 429 and 503);
- ``/script/<name>/<code>,<code>,...``: the next status of the named
  script on each request (the last one repeats);
- ``/reset``: the connection closed with a TCP reset;
- ``/slow``: an answer after 0.3 s (for read timeouts).

Every request's method, path and headers are kept in `Server.seen`.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import struct
import threading
import time
from typing import Any, final


@final
class _Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int) -> None:
        body = f"status {status}".encode()
        self.send_response(status)
        if status in {429, 503}:
            self.send_header("Retry-After", "7")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.record(self.command, self.path, dict(self.headers))
        parts = self.path.strip("/").split("/")
        if parts[0] == "status":
            self._answer(int(parts[1]))
        elif parts[0] == "script":
            self._answer(self.server.next_status(parts[1], parts[2]))
        elif parts[0] == "reset":
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            self.connection.close()
        elif parts[0] == "slow":
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                self._answer(200)
        else:
            self._answer(200)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # noqa: N815


@final
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """The server; `url` is its base URL."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self._scripts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)
        self._thread = threading.Thread(
            target=self.serve_forever, args=(0.02,), daemon=True
        )
        self._thread.start()

    def record(self, method: str, path: str, headers: dict[str, str]) -> None:
        with self._lock:
            self.seen.append((method, path, headers))
            self._recorded.notify_all()

    def wait_seen(
        self, n: int, timeout: float = 5.0
    ) -> list[tuple[str, str, dict[str, str]]]:
        """
        `seen`, once it holds at least *n* requests (or after *timeout*
        seconds): a client that gave up on its read timeout can be done
        before the thread serving its last request has read it, on a
        loaded machine.
        """
        with self._lock:
            self._recorded.wait_for(lambda: len(self.seen) >= n, timeout)
            return list(self.seen)

    def next_status(self, name: str, codes: str) -> int:
        statuses = [int(c) for c in codes.split(",")]
        with self._lock:
            n = self._scripts.get(name, 0)
            self._scripts[name] = n + 1
        return statuses[min(n, len(statuses) - 1)]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
