"""Distributed locks' errors: the store, a lock not acquired, a lease
lost."""

from __future__ import annotations

from typing import final

from resilient._errors._base import ResilientError
from resilient._errors._rejections import Rejected


class LockBackendError(ResilientError):
    """
    A lock's store (Redis, PostgreSQL, the embedded SQLite file) answered a
    request with an error, or could not be reached in time: the outcome of
    the request is unknown.

    A lock never reads it as acquired, renewed or released: a failed
    acquire is tried again within the wait's deadline when `retryable`, a
    failed renewal is retried until the lease's validity runs out when
    `retryable` (and otherwise loses the lease at once: `LockLost` with
    reason ``"refused"``, this error as its cause), and a failed release
    leaves the lease to expire on the store.

    The message names the scheme, the store's host and port and its error
    code, never the whole URL (it may hold a password) nor an owner token.

    Attributes:
        scheme: The URL scheme of the store, like ``"redis"``.
        where: The store's host and port from its URL, like
            ``"10.0.0.5:6379"`` (no user name or password), the database's
            path for ``sqlite://``, or `None`.
        reason: A short code: the store's error code (``"OOM"``,
            ``"READONLY"``, ``"LOADING"``, ``"BUSY"``, ``"WRONGTYPE"``,
            ``"NOAUTH"``, ``"NOPERM"``; a PostgreSQL SQLSTATE such as
            ``"42501"``; for ``sqlite://`` an errno name such as
            ``"EACCES"``, SQLite's code, or ``"unsafe"`` for a link or a
            file or directory of another user it refuses), or
            ``"connection"`` (the connection failed or was lost) or
            ``"timeout"`` (no reply within the call's time limit).
        retryable: False when trying again cannot help (a key of another
            type, a refused login or permission: a configuration error).

    .. versionadded:: 26.11.0
    """

    def __init__(
        self,
        scheme: str,
        reason: str,
        message: str,
        *,
        retryable: bool,
        where: str | None = None,
    ) -> None:
        self.scheme = scheme
        self.reason = reason
        self.retryable = retryable
        self.where = where
        at = f" at {where}" if where else ""
        super().__init__(f"{scheme} lock store{at}: {reason}: {message}")


class LockNotAcquired(Rejected):
    """
    A lock was not acquired: it was held and the caller could not wait (or
    waited as long as allowed), or the store did not answer.

    Not a failure of the dependency. Never carries the owner token. A
    `Rejected`: retry outwaits it when the store said when the holder's
    lease runs out (*retry_after*), within the deadline.

    Attributes:
        name: The lock's name.
        reason: ``"busy"`` (held, no wait allowed), ``"timeout"`` (the
            lock's own wait ran out), ``"deadline"`` (the enclosing deadline
            ended the wait) or ``"unavailable"`` (the store did not answer;
            the store's error is the ``__cause__``).
        waited: Seconds spent trying.
        retry_after: Seconds until the holder's lease expires if it is not
            renewed, when the store said; None when it did not (the store
            did not answer, or cannot tell): a hint, not a promise.

    """

    def __init__(
        self,
        name: str,
        reason: str,
        waited: float,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(name, reason, waited, retry_after)
        self.name = name
        self.reason = reason
        self.waited = waited
        self.retry_after = retry_after

    def __str__(self) -> str:
        why = {
            "busy": "it is held",
            "timeout": "it is held and the wait timed out",
            "deadline": "it is held and the deadline ran out",
            "unavailable": "the lock store did not answer",
        }.get(self.reason, self.reason)
        return (
            f"lock {self.name!r} not acquired: {why} "
            f"(waited {self.waited:.3f} s)"
        )


@final
class LockLost(ResilientError):
    """
    A held lock's lease was lost: the store no longer had it (it expired,
    or was deleted or taken), or it could not be renewed before it ran out
    on the holder's clock. The work the lock protected must stop; what it
    wrote with the lease's fencing token may be refused by the resource.

    Raised by `Lease.checkpoint`, and by leaving the lock's block (unless
    the block is already raising: then a note on its exception says so),
    also when the block's release finds the lease no longer ours: the block
    may have run without the lock. Every loss is logged at WARNING. Never
    carries the owner token.

    Attributes:
        name: The lock's name.
        fence: The fencing token of the lost lease.
        reason: ``"gone"`` (the store said it is not ours, at a renewal or
            at the release), ``"expired"``
            (not renewed in time on our clock), ``"refused"`` (the store
            refused a renewal for good, such as a revoked password or
            permission: the `LockBackendError` is the ``__cause__``) or
            ``"forked"`` (this process is a fork of the holder).
    """

    def __init__(self, name: str, fence: int, reason: str) -> None:
        super().__init__(name, fence, reason)
        self.name = name
        self.fence = fence
        self.reason = reason

    def __str__(self) -> str:
        why = {
            "gone": "the store no longer holds it",
            "expired": "it was not renewed before its lease ran out",
            "refused": "the store refused its renewal for good",
            "forked": "this process is a fork of the holder",
        }.get(self.reason, self.reason)
        return f"lock {self.name!r} lost (fence {self.fence}): {why}"
