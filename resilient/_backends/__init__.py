"""
Lock backends, loaded by URL scheme only when a URL asks for one.

``import resilient`` imports none of them; `open_backend` imports
``resilient._backends._<module>`` the first time a lock uses its scheme, so
neither redis nor psycopg is imported unless a ``redis://`` or
``postgresql://`` lock is made. Backends are shared per URL in a process (one
connection pool and one renewer per backend); an async backend is shared per
URL and event loop, and closed with its loop (`async_backend`).
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Final

from resilient._backends._base import (
    AsyncLockBackend,
    Busy,
    Grant,
    LockBackend,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
)
from resilient._core._registry import Registry
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import ModuleType


__all__ = [
    "SCHEMES",
    "AsyncLockBackend",
    "Busy",
    "Grant",
    "LockBackend",
    "LockKey",
    "OwnerToken",
    "ReleaseResult",
    "Renewal",
    "async_backend",
    "open_backend",
    "scheme_of",
]

#: URL scheme -> (module under resilient._backends, extra that installs it).
SCHEMES: Final[dict[str, tuple[str, str | None]]] = {
    "memory": ("_memory", None),
    "sqlite": ("_sqlite", None),
    "redis": ("_redis", "redis"),
    "rediss": ("_redis", "redis"),
    "postgresql": ("_postgres", "postgres"),
    "postgres": ("_postgres", "postgres"),
}


def _make(url: str, _config: None) -> LockBackend:
    return _module(url, "LockConfig.backend").sync_backend(url)  # type: ignore[no-any-return]


#: Sync backends by URL in the core registry: one live backend per URL (and
#: so one renewer), kept while anything uses it.
BACKENDS: Final[Registry[LockBackend, None]] = Registry(
    "lock_backend",
    _make,
    lambda: None,
    config_of=lambda _backend: None,
)

_LOCK = threading.Lock()
# Async backends belong to one event loop each: by (URL, loop), with the
# async generator whose finalisation closes them with their loop.
_ASYNC: dict[tuple[str, object], AsyncLockBackend] = {}
_CLOSERS: dict[int, object] = {}


def scheme_of(url: object, field: str = "LockConfig.backend") -> str:
    """
    The known scheme of *url*, lowercased; `ConfigError` naming the scheme
    (never the URL, which may hold a password) when it is not one.
    """
    if not isinstance(url, str):
        raise ConfigTypeError(field, url, "must be a URL string")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise ConfigError(
            field,
            f"{scheme}://" if sep else "(no scheme)",
            f"has an unknown URL scheme (known: {known})",
        )
    return scheme


def _module(url: str, field: str) -> ModuleType:
    scheme = scheme_of(url, field)
    module, extra = SCHEMES[scheme]
    try:
        return importlib.import_module(f"resilient._backends.{module}")
    except ImportError as exc:
        if extra is None:  # pragma: no cover - the stdlib backends import
            raise
        raise ConfigError(
            field,
            f"{scheme}://",
            f"needs its driver ({exc.name or 'a module'} is missing): "
            f"pip install 'resilient[{extra}]'",
        ) from exc


def check_url(url: object, field: str = "LockConfig.backend") -> None:
    """Refuse an unknown scheme or a missing driver (at construction)."""
    _module(url, field)  # type: ignore[arg-type]


def open_backend(url: str) -> LockBackend:
    """The process's sync backend for *url*, made on first use."""
    scheme_of(url)
    return BACKENDS.get(url)


def async_backend(url: str, loop: object) -> AsyncLockBackend:
    """
    The async backend for *url* in the event loop *loop* (any hashable
    token of the running loop), made on first use; call it from a task of
    that loop.

    It is closed (its connections with it) and forgotten when the loop
    ends: an async generator started here is finalised by the loop's own
    shutdown of async generators (``asyncio.run``, ``trio.run``, anyio),
    while the loop still runs, and its ``finally`` closes the backend. A
    loop closed without that shutdown keeps its backend until
    `forget_backends`.
    """
    with _LOCK:
        backend = _ASYNC.get((url, loop))
    if backend is not None:
        return backend
    made: AsyncLockBackend = _module(url, "LockConfig.backend").async_backend(
        url
    )
    closer = _close_with_loop(url, loop, made)
    with _LOCK:
        backend = _ASYNC.get((url, loop))
        if backend is None:
            _ASYNC[url, loop] = backend = made
            _CLOSERS[id(made)] = closer
    if backend is made:
        _start(closer)
    return backend


async def _close_with_loop(
    url: str, loop: object, backend: AsyncLockBackend
) -> AsyncIterator[None]:
    try:
        yield
    finally:
        with _LOCK:
            if _ASYNC.get((url, loop)) is backend:
                del _ASYNC[url, loop]
            _CLOSERS.pop(id(backend), None)
        await backend.aclose()


def _start(closer: AsyncIterator[None]) -> None:
    """Run *closer* to its ``yield``: the running loop's first-iteration
    hook now tracks it, to finalise it when the loop shuts down."""
    step = closer.__anext__()
    try:
        step.send(None)  # type: ignore[attr-defined]
    except StopIteration:
        return
    raise RuntimeError(
        "the closer awaited before its yield"
    )  # pragma: no cover


_forgotten = 0


def forgotten() -> int:
    """How often the backends were dropped: holders that cache one compare."""
    return _forgotten


def forget_backends() -> list[LockBackend | AsyncLockBackend]:
    """Drop every cached backend (tests); returns them for closing."""
    global _forgotten  # noqa: PLW0603
    with _LOCK:
        _forgotten += 1
        gone: list[LockBackend | AsyncLockBackend] = [
            *BACKENDS.items(),
            *_ASYNC.values(),
        ]
        BACKENDS.clear()
        _ASYNC.clear()
        # The closers stay until their loops end (dropping a suspended one
        # would ask a loop that may be closed to finalise it).
    return gone
