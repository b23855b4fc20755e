"""
A small TCP fault proxy for tests, after toxiproxy's toxics: loopback only.

``FaultProxy(target_port)`` listens on a free port of 127.0.0.1 and forwards
every connection to the target, one thread per direction. Faults, switched
on and off while connections are open:

- ``latency``: seconds added before each forwarded chunk, both directions;
- ``blackhole()`` / ``heal()``: stop forwarding (bytes wait in the kernel's
  buffers, connections stay open), then forward again;
- ``reset_all()``: close every open connection with an RST (``SO_LINGER``
  0), as a crashed middlebox or a killed server would;
- ``refuse = True``: new connections are reset at once;
- ``drop_next_reply(then=...)``: the next chunk from the server is thrown
  away, then that connection is reset (``"reset"``) or left open and silent
  (``"hang"``): the server did the work, the client never hears of it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from typing import Literal, Self


_TICK = 0.005


def _rst(sock: socket.socket) -> None:
    """Close *sock* so that the peer gets an RST, not a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.closed = threading.Event()
        self.silent = False

    def close(self, *, reset: bool) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            if reset:
                _rst(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()


class FaultProxy:
    """A TCP proxy from a free loopback port to ``127.0.0.1:target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.latency = 0.0
        self.refuse = False
        self.dropped_replies = 0
        self.requests = 0  # chunks forwarded client -> server
        self._holes = threading.Event()  # set while blackholed
        self._drop: Literal["reset", "hang"] | None = None
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_TICK * 10)
        self.port = int(self._listener.getsockname()[1])
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def url(self, scheme: str, path: str = "") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def blackhole(self) -> None:
        self._holes.set()

    def heal(self) -> None:
        self._holes.clear()
        self._drop = None

    def drop_next_reply(
        self, *, then: Literal["reset", "hang"] = "reset"
    ) -> None:
        self._drop = then

    def reset_all(self) -> None:
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close(reset=True)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2)
        self._listener.close()
        self.reset_all()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refuse:
                _rst(client)
                continue
            try:
                server = socket.create_connection(
                    ("127.0.0.1", self.target_port), timeout=2
                )
            except OSError:
                _rst(client)
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            for src, dst, reply in (
                (client, server, False),
                (server, client, True),
            ):
                threading.Thread(
                    target=self._pump,
                    args=(link, src, dst, reply),
                    daemon=True,
                ).start()

    def _pump(
        self, link: _Link, src: socket.socket, dst: socket.socket, reply: bool
    ) -> None:
        try:
            while not link.closed.is_set():
                if self._holes.is_set() or link.silent:
                    time.sleep(_TICK)
                    continue
                ready, _, _ = select.select([src], [], [], _TICK * 10)
                if not ready or self._holes.is_set() or link.silent:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                then = None
                if reply and self._drop is not None:
                    with self._lock:
                        then, self._drop = self._drop, None
                if then is not None:
                    self.dropped_replies += 1
                    if then == "reset":
                        link.close(reset=True)
                        return
                    link.silent = True
                    continue
                if self.latency:
                    time.sleep(self.latency)
                if not reply:
                    self.requests += 1
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        link.close(reset=False)
