"""
`Lock` and `lock`: the public object, as ``with``, ``async with`` and a
decorator, and the factory.

The shells it runs are `resilient._lock._sync` and `resilient._lock._async`
(one `resilient._lock._attempt.Attempt` under both), the lease they hand
out is `resilient._lock._lease.Lease`, and `resilient._lock._hold` keeps an
interrupted ``with`` from leaking it. A `Lock` keeps its backend and
renewer once found (looked up again after the backends are forgotten), so
a hold does not look them up.
"""

from __future__ import annotations

import contextvars
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    ParamSpec,
    TypeVar,
    Unpack,
    final,
)

import attrs

from resilient import _backends
from resilient._backends import LockKey, async_backend, check_url, open_backend
from resilient._core import _registry
from resilient._core._decorate import decorate
from resilient._lock import _async, _sync
from resilient._lock._config import LockConfig, default_backend_url
from resilient._lock._hold import Exits, linked
from resilient._lock._renewer import task_renewer, thread_renewer
from resilient.exceptions import ConfigTypeError, LockLost


if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from types import TracebackType

    from resilient._backends import AsyncLockBackend, LockBackend
    from resilient._lock._config import LockKnobs
    from resilient._lock._lease import Lease
    from resilient._lock._renewer import TaskRenewer, ThreadRenewer
    from resilient._timeout import TimeoutScope


P = ParamSpec("P")
T = TypeVar("T")

# The leases `with` / `async with` entered in this context without a hold
# (``ExitStack``, explicit calls), innermost last.
ENTERED: contextvars.ContextVar[
    tuple[tuple[Lock, Lease, TimeoutScope], ...]
] = contextvars.ContextVar("resilient_lock_entered", default=())

_DEFAULT: Final = object()

# Kept for the contract tests of other backends.
_loop_token = _async.loop_token


def _epoch() -> tuple[int, int]:
    """Changes when the cached backends are dropped (tests, resets)."""
    return _registry._generation, _backends._forgotten  # noqa: SLF001


@final
class Lock:
    """
    A named lock on a lease store: enter it with ``with`` or ``async
    with``, or decorate a function with it. Made by `resilient.lock`.

    Entering waits for the lock (within its ``timeout`` and the enclosing
    deadline), then runs the block as the lease's holder, renewed by the
    process's renewer. If the lease is lost, the block is stopped: in async
    code it is cancelled and `LockLost` comes out of ``async with``; in sync
    code every wait of the library in it wakes, `Lease.checkpoint` raises
    `LockLost`, and leaving the block raises `LockLost` unless the block is
    already raising. Leaving releases the lease (also on errors and
    cancellation); a release the store answers with "not held" (the lease
    expired, or was deleted or taken) raises `LockLost` too, as the block
    may have run without the lock.

    Not reentrant: entering a lock the same thread or task already holds
    raises `RuntimeError` rather than waiting for ever (the thread or task
    object itself, never its reusable ident or ``id``). One `Lock` may be
    entered by many threads and tasks at once; each gets its own lease in
    turn.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("_async", "_sync", "config", "holder_key", "key", "url")

    def __init__(self, name: str, config: LockConfig) -> None:
        if not isinstance(name, str):
            raise ConfigTypeError("lock(name)", name, "must be a str")
        if not isinstance(config, LockConfig):
            raise ConfigTypeError(
                "lock(config)", config, "must be a LockConfig"
            )
        self.key = LockKey.of(name)
        self.config = config
        self.url = config.backend or default_backend_url()
        check_url(self.url, "lock(backend)")
        self.holder_key = (self.url, self.key.digest)
        self._sync: tuple[tuple[int, int], LockBackend, ThreadRenewer] | None
        self._sync = None
        self._async: (
            tuple[tuple[int, int], object, AsyncLockBackend, TaskRenewer]
            | None
        ) = None

    @property
    def name(self) -> str:
        """The lock's name."""
        return self.key.name

    def __repr__(self) -> str:
        scheme = self.url.partition("://")[0]
        return (
            f"<Lock {self.key.shown!r} on {scheme}:// ttl={self.config.ttl:g}>"
        )

    # -- the parts the shells use ------------------------------------------

    def sync_parts(self) -> tuple[LockBackend, ThreadRenewer]:
        """The process's sync backend of this lock's URL and its renewer."""
        cached = self._sync
        epoch = _epoch()
        if cached is None or cached[0] != epoch:
            backend = open_backend(self.url)
            cached = self._sync = (epoch, backend, thread_renewer(backend))
        return cached[1], cached[2]

    def async_parts(
        self, library: str
    ) -> tuple[AsyncLockBackend, TaskRenewer]:
        """The running event loop's backend of this URL and its renewer."""
        loop = _async.loop_token(library)
        cached = self._async
        epoch = _epoch()
        if cached is None or cached[0] != epoch or cached[1] is not loop:
            backend = async_backend(self.url, loop)
            renewer = task_renewer(backend, library)
            cached = self._async = (epoch, loop, backend, renewer)
        return cached[2], cached[3]

    def record_entry(self, lease: Lease, scope: TimeoutScope) -> None:
        """Remember a block entered without a hold, for its exit."""
        ENTERED.set((*ENTERED.get(), (self, lease, scope)))

    def entered(self) -> tuple[Lease, TimeoutScope]:
        """The innermost block of this lock entered without a hold."""
        for lock, lease, scope in reversed(ENTERED.get()):
            if lock is self:
                return lease, scope
        raise RuntimeError(f"{self!r} was not entered here")

    def forget(self, leases: list[Lease]) -> None:
        """Drop the context entry of one of *leases*, if there is one."""
        entered = ENTERED.get()
        for i in range(len(entered) - 1, -1, -1):
            if entered[i][0] is self and entered[i][1] in leases:
                ENTERED.set(entered[:i] + entered[i + 1 :])
                return

    @staticmethod
    def outcome(
        lease: Lease,
        exc: BaseException | None,
        *,
        swallowed: bool,
        lost: bool,
    ) -> bool:
        """
        After the block and its scope: let the block's own exception be
        (with a note if the lease was lost meanwhile), or raise `LockLost`
        where the scope did not.
        """
        if not lost:
            return swallowed
        error = lease._lost_error()  # noqa: SLF001
        if exc is None or swallowed:
            raise error from (exc if exc is not None else error.__cause__)
        if not isinstance(exc, LockLost):
            exc.add_note(f"while the block ran, {error}")
        return False

    def _config(
        self, blocking: bool | None, timeout: float | object | None
    ) -> LockConfig:
        changes: dict[str, Any] = {}
        if blocking is not None:
            changes["blocking"] = blocking
        if timeout is not _DEFAULT:
            changes["timeout"] = timeout
        return attrs.evolve(self.config, **changes) if changes else self.config

    # -- acquiring by hand ---------------------------------------------------

    def acquire(
        self,
        *,
        blocking: bool | None = None,
        timeout: float | object | None = None,
    ) -> Lease:
        """
        Acquire the lock and return its lease; release it with
        `Lease.release` (or use ``with``, which does).

        Args:
            blocking: False tries once; None (the default) is the lock's
                own setting.
            timeout: Seconds to wait; by default the lock's own.

        Raises:
            LockNotAcquired: Held past the wait, or the store did not answer.
            RuntimeError: This thread holds it already, or the call would
                block an event loop.
        """
        config = self._config(blocking, _or_default(timeout))
        return _sync.acquire(self, config, [])

    def acquire_nowait(self) -> Lease:
        """Acquire the lock if it is free, else raise `LockNotAcquired`."""
        return _sync.acquire(self, self._config(False, _DEFAULT), [])

    async def aacquire(
        self,
        *,
        blocking: bool | None = None,
        timeout: float | object | None = None,  # noqa: ASYNC109
    ) -> Lease:
        """`acquire` for async code (asyncio or trio)."""
        config = self._config(blocking, _or_default(timeout))
        return await _async.aacquire(self, config, [])

    # -- with / async with (see `resilient._lock._hold`) --------------------

    def __enter__(self) -> Lease:
        return _sync.enter(self, linked(self))

    def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return _sync.leave(self, None, exc_type, exc, tb)

    def __aenter__(self) -> Coroutine[Any, Any, Lease]:
        # A plain function: it runs inside the ``async with`` statement's
        # own instruction, where its hold can be recognised.
        return _async.aenter(self, linked(self))

    async def _aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await _async.aleave(self, None, exc_type, exc, tb)

    if TYPE_CHECKING:

        def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> bool: ...

        async def __aexit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> bool: ...

    else:
        __exit__ = Exits(is_async=False)
        __aexit__ = Exits(is_async=True)

    # -- as a decorator ----------------------------------------------------

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """
        Run each call of *fn* (sync or async) holding the lock.
        """

        def sync_shell(
            fn: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            with self:
                return fn(*args, **kwargs)

        async def async_shell(
            fn: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            async with self:
                return await fn(*args, **kwargs)

        return decorate(
            fn,
            sync_shell,
            async_shell,
            stream="a lock's decorator would hold it only while the "
            "generator object is made; take the lock inside the generator "
            "(`with lock:` around its loop) or around the loop that "
            "consumes it",
        )


def _or_default(timeout: object) -> object:
    return _DEFAULT if timeout is None else timeout


def lock(
    name: str,
    /,
    *,
    config: LockConfig | None = None,
    **knobs: Unpack[LockKnobs],
) -> Lock:
    """
    A distributed lock named *name*, held as a lease with a fencing token.

    Use it as ``with``, ``async with`` or a decorator::

        with resilient.lock("nightly-report", ttl=60) as lease:
            write_report(fence=lease.token)

        @resilient.lock("nightly-report")
        def nightly_report() -> None: ...

    Without ``backend`` it uses ``$RESILIENT_LOCK_URL`` or the embedded
    SQLite file in a per-user directory (no server needed).

    Args:
        name: Any `str`, of any content and length (it is hashed).
        config: A `LockConfig` to start from.
        **knobs: `LockConfig` fields (``backend``, ``ttl``,
            ``renew_interval``, ``drift``, ``timeout``, ``blocking``,
            ``backoff``), applied over *config*.

    Raises:
        ConfigError: A bad setting, or a backend URL whose scheme is unknown
            or whose driver is missing (the message names the extra).

    .. versionadded:: 26.11.0
    """
    base = LockConfig() if config is None else config
    if knobs:
        base = (
            LockConfig(**knobs)
            if config is None
            else attrs.evolve(base, **knobs)
        )
    return Lock(name, base)


__all__ = ["ENTERED", "Lock", "LockConfig", "lock"]
