"""
The lease a held lock hands out, shared by the sync and async shells.

A `Lease` is what ``with resilient.lock(...)`` gives: the fencing token, the
checks (`Lease.checkpoint`), renewing and releasing by hand. Also here: the
acquisition's span. Which thread or task holds which lock is recorded in
`resilient._lock._holders` (re-exported here).

Nothing of the process keeps a lease alive but its user: the holders'
record is weak, and so is the record's loss callback. A lease dropped while
held is released when it is collected, with a `ResourceWarning`
(`Lease.__del__`, `resilient._lock._dropped`).
"""

from __future__ import annotations

import logging
import sys
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Final, final

from resilient import _timeout
from resilient._backends import ReleaseResult, Renewal
from resilient._core import _clock
from resilient._lock import _dropped
from resilient._lock._holders import (
    HOLDERS,
    HOLDERS_LOCK,
    ThreadHolder,
    claim,
    forget,
    held_leases,
    may_still_run,
    thread_holder,
)
from resilient._lock._machine import LeaseState
from resilient._lock._spans import end_span, start_span
from resilient.exceptions import LockBackendError, LockLost


if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.trace import Span

    from resilient._backends import AsyncLockBackend, LockBackend
    from resilient._lock._hold import Hold
    from resilient._lock._lock import Lock
    from resilient._lock._machine import LeaseRecord
    from resilient._lock._renewer import TaskRenewer, ThreadRenewer


log: Final = logging.getLogger("resilient")

#: Longest wait for a release to be answered in async code, in seconds,
#: shielded from the cancellation that may be ending the block.
RELEASE_TIMEOUT: Final = 5.0


@final
class Lease:
    """
    A held lock: what ``with resilient.lock(...)`` gives.

    The process's renewer keeps the lease alive while it is held. Check
    `checkpoint` before each step that must not run without the lock, and
    pass `token` to the resource so it can refuse stale writers
    (`resilient.fenced_update`).

    Never shows the owner token: not in its repr, its errors or its spans.

    Release a lease taken by hand (`Lock.acquire`): one dropped while held
    is released when the garbage collector finds it, with a
    `ResourceWarning`, as an unclosed file is.

    .. versionadded:: 26.11.0
    """

    __slots__ = (
        "__weakref__",
        "_backend",
        "_holder",
        "_library",
        "_lock",
        "_record",
        "_released",
        "_renewer",
        "_scope",
        "_span",
        "_weak",
        "waited",
    )

    def __init__(  # noqa: PLR0917
        self,
        lock: Lock,
        record: LeaseRecord,
        backend: LockBackend | AsyncLockBackend,
        renewer: ThreadRenewer | TaskRenewer,
        span: Span | None,
        holder: object,
        waited: float,
        library: str | None,
    ) -> None:
        self._lock = lock
        self._record = record
        self._backend = backend
        self._renewer = renewer
        self._span = span
        self._holder = holder
        self._library = library
        self._released: ReleaseResult | None = None
        self._weak = weakref.ref(self)
        self._scope: _timeout.TimeoutScope | None = None
        self.waited = waited
        """Seconds spent acquiring it."""

    def __repr__(self) -> str:
        state = "held" if self.held else self._record.state.value
        return (
            f"<Lease {self._lock.key.shown!r} token={self.token} {state}, "
            f"valid for {self.valid_for():.3f} s>"
        )

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._lock.name

    @property
    def token(self) -> int:
        """
        The fencing token: strictly greater than the token of every earlier
        grant of this lock's name. Hand it to the resource with each write.
        """
        return self._record.fence

    @property
    def held(self) -> bool:
        """Whether the lease is still ours (on our clock; not released)."""
        return self._record.check(_clock.get_clock().now())

    @property
    def lost(self) -> bool:
        """Whether the lease was lost (not merely released)."""
        self._record.check(_clock.get_clock().now())
        return self._record.state is LeaseState.LOST

    def valid_for(self) -> float:
        """
        Seconds the lease stays ours on our clock if no renewal succeeds
        (0.0 once lost or released): the most any step may take.
        """
        if not self.held:
            return 0.0
        return max(self._record.valid_until - _clock.get_clock().now(), 0.0)

    @property
    def expires_in(self) -> float:
        """`valid_for`, as a property."""
        return self.valid_for()

    def checkpoint(self) -> None:
        """
        Raise `LockLost` if the lease is gone; return if it is still ours.

        Raises:
            LockLost: The lease was lost (or released).
        """
        if not self.held:
            raise self._lost_error()

    def _lost_error(self) -> LockLost:
        record = self._record
        error = LockLost(
            self._lock.key.shown, self.token, record.reason or "released"
        )
        if record.error is not None:
            # "refused": the store's error (its code and `where`) says why.
            error.__cause__ = record.error
            error.add_note(f"the store refused its renewal: {record.error}")
        return error

    def _lost_now(self) -> bool:
        """
        At the end of the block: whether the lease is lost, checked now; if
        it is, its scope is cancelled with `LockLost` (a no-op if it was
        already, and the first reason stays). A lease released by hand in
        the block is not: its caller had the release's answer.
        """
        if self._released is not None:
            return False
        record = self._record
        if record.state is LeaseState.HELD and (
            _clock.get_clock().now() < record.valid_until
        ):
            return False  # Held: the common case, without `lost`'s calls.
        if self.lost:
            self._cancel_block()
            return True
        return False

    def _on_loss(self) -> None:
        """The record's loss callback (once, from any thread): log, cancel."""
        log.warning("%s", self._lost_error())
        self._cancel_block()

    def _cancel_if_lost(self) -> None:
        """
        Once the block's scope is set: cancel it if the lease was lost
        before (the loss's callback found no scope then).
        """
        if self._record.state is LeaseState.LOST:
            self._cancel_block()

    def _cancel_block(self) -> None:
        """
        The lease is lost (the record's callback, from any thread): cancel
        its block's scope with `LockLost`, if the block has one yet.
        """
        scope = self._scope
        if scope is not None:
            scope.cancel(self._lost_error())

    # -- renewing by hand ----------------------------------------------------

    def renew(self) -> bool:
        """
        Renew now, without waiting for the renewer (sync backends); whether
        the store renewed it. A lease the store no longer has is lost, and
        so is one whose renewal the store refuses in a way retrying cannot
        cure (a `LockBackendError` that is not ``retryable``).

        Raises:
            LockLost: The store said the lease is not ours.
            LockBackendError: The store did not answer, or refused; the
                lease is then lost if the error is not ``retryable``.
        """
        backend: LockBackend = self._backend  # type: ignore[assignment]
        sent = self._renewing()
        try:
            ok = backend.renew([self._request()])
        except LockBackendError as exc:
            self._refused(exc)
            raise
        return self._renewed(sent, ok)

    async def arenew(self) -> bool:
        """`renew` for async code."""
        backend: AsyncLockBackend = self._backend  # type: ignore[assignment]
        sent = self._renewing()
        try:
            ok = await backend.renew([self._request()])
        except LockBackendError as exc:
            self._refused(exc)
            raise
        return self._renewed(sent, ok)

    def _refused(self, exc: LockBackendError) -> None:
        """A renewal's error: one retrying cannot cure loses the lease."""
        if not exc.retryable:
            self._record.lose("refused", exc)

    def _renewing(self) -> float:
        self.checkpoint()
        return _clock.get_clock().now()

    def _request(self) -> Renewal:
        record = self._record
        return Renewal(self._lock.key, record.owner, record.config.ttl)

    def _renewed(self, sent: float, ok: Any) -> bool:
        if ok and ok[0]:
            self._record.renewed(sent, self._record.config.ttl)
            return True
        self._record.lose("gone")
        raise self._lost_error()

    # -- holding and releasing -----------------------------------------------

    def _start(self) -> None:
        """Record the holder and start renewing; `_let_go` undoes it."""
        HOLDERS[self._lock.holder_key] = self._weak
        self._renewer.add(self._record)
        span = self._span
        if span is not None:
            span.set_attributes(
                {
                    "resilient.lock.fence": self.token,
                    "resilient.lock.waited": self.waited,
                    "resilient.lock.outcome": "acquired",
                }
            )

    def _let_go(self) -> bool:
        """
        Stop renewing and forget the holder; whether a release should be
        sent (not for a forked child's copy). Safe to repeat.
        """
        record = self._record
        record.released()
        self._renewer.remove(record)
        forget(self._lock.holder_key, self._weak)
        return record.reason != "forked"

    def _settled(self, result: ReleaseResult) -> ReleaseResult:
        self._released = result
        if result is ReleaseResult.NOT_HELD and self._record.gone_at_release():
            # Expired, deleted or taken while we held it: the work done
            # under it may have run without the lock.
            log.warning("%s", self._lost_error())
        elif result is ReleaseResult.UNKNOWN:
            log.warning(
                "lock %r: the release got no answer; the lease is left to "
                "expire within %.3f s",
                self._lock.key.shown,
                self._record.config.ttl,
            )
            if self._span is not None:
                self._span.add_event("resilient.lock.release_unknown")
        span, self._span = self._span, None
        if span is not None:
            end_span(span, result.value, error=result is ReleaseResult.UNKNOWN)
        return result

    def _to_release(self) -> ReleaseResult | None:
        """
        The answer of a release that sends nothing (already released, or a
        forked child's copy), or None: send it.
        """
        done = self._released
        if done is not None and done is not ReleaseResult.UNKNOWN:
            return done
        if not self._let_go():
            return self._settled(ReleaseResult.NOT_HELD)
        return None

    def release(self) -> ReleaseResult:
        """
        Release the lock now (a compare-and-delete on our owner token);
        leaving the block then does nothing more. Harmless to repeat: after
        `ReleaseResult.UNKNOWN` (no answer) it sends the release again.
        `ReleaseResult.NOT_HELD` from a lease we believed held means it was
        lost meanwhile: `lost` turns True, with reason ``"gone"``, and a
        warning is logged.

        Never raises for a store that cannot be reached: the lease is left
        to expire, a log line and a span event say so, and the result is
        `ReleaseResult.UNKNOWN`.
        """
        done = self._to_release()
        if done is not None:
            return done
        backend: LockBackend = self._backend  # type: ignore[assignment]
        try:
            result = backend.release(self._lock.key, self._record.owner)
        except Exception:  # noqa: BLE001 - no answer: left to expire
            result = ReleaseResult.UNKNOWN
        return self._settled(result)

    def _released_at_exit(self, before: ReleaseResult | None) -> bool:
        """
        After the block's release: whether it found the lease lost (the
        store answered NOT_HELD), when *before* (`_released` before it) says
        the block had not released it by hand.
        """
        return before is None and self._record.reason == "gone"

    def __del__(self) -> None:
        """
        Collected unreleased (acquired by hand and dropped): stop renewing
        and release it from the dropped-lease worker (never here, in any
        thread amid anything), and warn as an unclosed file does.
        """
        if getattr(self, "_released", True) is not None:
            return  # Released, or __init__ never finished.
        record = self._record
        if record.reason == "forked":
            return
        held = record.state is LeaseState.HELD and not sys.is_finalizing()
        try:
            _dropped.hand_over(
                _dropped.release_job(
                    record,
                    self._renewer,
                    self._backend,
                    (self._lock.holder_key, self._weak),
                    self._span,
                )
            )
        except BaseException:  # noqa: BLE001 - in __del__: the lease expires
            return
        if held:
            warnings.warn(
                f"lock {self._lock.key.shown!r} (fence {record.fence}) was "
                "never released: its lease was dropped while held, and is "
                "released now; release it (`lease.release()`) or hold it "
                "with `with`",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )

    async def arelease(self) -> ReleaseResult:
        """
        `release` for async code; shielded from cancellation and bounded by
        `RELEASE_TIMEOUT` seconds.
        """
        done = self._to_release()
        if done is not None:
            return done
        import anyio  # noqa: PLC0415

        backend: AsyncLockBackend = self._backend  # type: ignore[assignment]
        result = ReleaseResult.UNKNOWN
        try:
            with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
                result = await backend.release(
                    self._lock.key, self._record.owner
                )
        except Exception:  # noqa: BLE001 - no answer: left to expire
            result = ReleaseResult.UNKNOWN
        return self._settled(result)


def loss_callback(lease: Lease) -> Callable[[], None]:
    """
    *lease*'s loss callback for its record, holding it weakly: the renewer
    keeps the record, and must not keep the lease from being collected.
    """
    ref = lease._weak  # noqa: SLF001

    def lost() -> None:
        alive = ref()
        if alive is not None:
            alive._on_loss()  # noqa: SLF001

    return lost


# -- the block's cancel scope (both shells) ---------------------------------


def open_block(lock: Lock, hold: Hold | None, lease: Lease) -> None:
    """
    Enter the cancel scope of *lease*'s block, which the loss cancels with
    `LockLost`. The lease and its scope are recorded first (in the ``with``
    statement's *hold*, or the lock's context entries), so that an
    interrupt anywhere from here on still finds them to clean up.
    """
    scope = lease._scope = _timeout.TimeoutScope(  # noqa: SLF001
        seconds=None, at=None, interrupt=False
    )
    if hold is not None:
        hold.entry = (lease, scope)
    else:
        lock.record_entry(lease, scope)
    # A plain ``with`` scope in async code too: it is an anyio cancel scope
    # there, and entering it awaits nothing.
    scope.__enter__()
    lease._cancel_if_lost()  # noqa: SLF001


def shut_block(lease: Lease) -> None:
    """Leave *lease*'s block scope if it is still entered (cleaning up)."""
    scope = lease._scope  # noqa: SLF001
    if scope is not None and scope._state == "entered":  # noqa: SLF001
        scope.__exit__(None, None, None)


__all__ = [
    "HOLDERS",
    "HOLDERS_LOCK",
    "RELEASE_TIMEOUT",
    "Lease",
    "ThreadHolder",
    "claim",
    "end_span",
    "held_leases",
    "loss_callback",
    "may_still_run",
    "open_block",
    "shut_block",
    "start_span",
    "thread_holder",
]
