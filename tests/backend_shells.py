"""
One sync face for a lock backend's sync twin and its async twin (asyncio or
trio), so that a backend test is written once and runs against all three.

The async twin lives in an event loop of its own thread (an anyio blocking
portal); every call goes through the portal, so the twin sees one loop for
its whole life, as it does in an application.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio.from_thread

from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
)


class Shell:
    """Calls one backend twin synchronously."""

    def __init__(
        self,
        backend: Any,
        call: Callable[..., Any],
        colour: str,
    ) -> None:
        self.backend = backend
        self._call = call
        self.colour = colour

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        return self._call(self.backend.acquire, key, owner, ttl)  # type: ignore[no-any-return]

    def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        return self._call(self.backend.renew, batch)  # type: ignore[no-any-return]

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        return self._call(self.backend.release, key, owner)  # type: ignore[no-any-return]


@contextlib.contextmanager
def open_shell(module_name: str, url: str, colour: str) -> Iterator[Shell]:
    """The *colour* twin (``sync``, ``asyncio``, ``trio``) of the backend
    module ``resilient._backends.<module_name>`` for *url*."""
    module = importlib.import_module(f"resilient._backends.{module_name}")
    if colour == "sync":
        backend = module.sync_backend(url)
        try:
            yield Shell(backend, lambda fn, *a: fn(*a), colour)
        finally:
            backend.close()
        return

    async def make() -> Any:
        return module.async_backend(url)

    with anyio.from_thread.start_blocking_portal(colour) as portal:
        backend = portal.call(make)
        try:
            yield Shell(backend, portal.call, colour)
        finally:
            portal.call(backend.aclose)
