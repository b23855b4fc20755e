"""
The sync shell: acquire (try, wait for the wake-up or the next backoff
step, try again), enter the block's cancel scope, and leave it.

The loop's decisions are `resilient._lock._attempt.Attempt`'s; this module
only sends, waits on a `threading.Event` (woken by the backend's watch or
by the enclosing cancel scope) and releases.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from resilient import _timeout
from resilient._backends import Busy, Grant
from resilient._core import _clock, _loops
from resilient._lock._attempt import Attempt, GiveUp, Wait
from resilient._lock._lease import log, open_block, shut_block, thread_holder


if TYPE_CHECKING:
    from types import TracebackType

    from resilient._backends import LockBackend, LockKey, OwnerToken
    from resilient._backends._sqlite._waiter import Waiter
    from resilient._lock._config import LockConfig
    from resilient._lock._hold import Hold
    from resilient._lock._lease import Lease
    from resilient._lock._lock import Lock


def acquire(lock: Lock, config: LockConfig, out: list[Lease]) -> Lease:  # noqa: C901, PLR0912
    """
    Try, wait, try again: a lease or `LockNotAcquired`. The lease is
    appended to *out* before anything starts, so that a caller's ``except
    BaseException`` can release it whatever line was interrupted.
    """
    if config.blocking and config.timeout != 0:
        # Refused at the first call, not at the first wait: a test suite
        # where the lock is always free would never see the mistake.
        _refuse_in_loop(lock)
    backend, renewer = lock.sync_parts()
    att = Attempt(lock, config, thread_holder(), None, backend, renewer)
    key, owner, ttl, clock = lock.key, att.owner, config.ttl, att.clock
    woken: threading.Event | None = None  # Made only if we must wait.
    waiter = None  # Or the store's own wake-up, which this thread polls.
    try:
        while True:
            sent = clock.now()
            att.sent_any = True
            step: Wait | GiveUp
            try:
                answer = backend.acquire(key, owner, ttl)
            except Exception as exc:  # noqa: BLE001 - no answer: retried
                step = att.failed(exc)
            else:
                if isinstance(answer, Grant):
                    lease = att.take(sent, answer, out)
                    if lease is not None:
                        return lease
                    backend.release(key, owner)  # Came too late.
                    answer = Busy(None)
                step = att.held(answer)
                if att.stop is None and isinstance(step, Wait):
                    # Watch, then look once more at once: a release between
                    # the try and the watch would otherwise go unseen.
                    # A store that lets the waiting thread block on its
                    # wake-up itself (the embedded one) saves a thread
                    # wake-up per hand-over.
                    make = getattr(backend, "waiter", None)
                    if make is not None:
                        att.stop = waiter = make(key)
                    else:
                        woken = threading.Event()
                        att.stop = backend.watch(key, woken.set)
                    continue
            if isinstance(step, GiveUp):
                if att.error is not None:
                    compensate(backend, key, owner)
                raise att.refused(step)  # noqa: TRY301
            _wait(lock, woken, step.seconds, waiter)
    except BaseException as exc:
        # An interrupt (or any error) after a request left: the store may
        # have granted it. Compare-and-delete on our token is harmless.
        if out:
            out[-1].release()
        elif att.compensates(exc):
            compensate(backend, key, owner)
        raise
    finally:
        if att.stop is not None:
            att.stop()


def compensate(backend: LockBackend, key: LockKey, owner: OwnerToken) -> None:
    """Give back what the store may have granted us; never raises."""
    try:
        backend.release(key, owner)
    except Exception:  # noqa: BLE001 - best effort: the lease expires
        log.debug("lock %r: compensating release got no answer", key.shown)


def _refuse_in_loop(lock: Lock) -> None:
    """Raise if an event loop runs in this thread: a wait would block it."""
    _loops.refuse_blocking(
        f"a blocking acquire of lock {lock.key.shown!r}",
        "`async with` the lock (or `await lock.aacquire()`)",
    )


def _wait(
    lock: Lock,
    woken: threading.Event | None,
    seconds: float,
    waiter: Waiter | None = None,
) -> None:
    """
    Wait up to *seconds* for a wake-up (the watch's event, or the store's
    *waiter*, polled by this thread), honouring the cancel scope.
    """
    _refuse_in_loop(lock)  # A lock that may not wait can still be told to.
    clock = _clock.get_clock()
    if clock is not _clock.DEFAULT_CLOCK:
        clock.sleep(seconds)  # Virtual time: the clock must move.
        if woken is not None:
            woken.clear()
        return
    if waiter is not None:
        with _timeout.wake_on_cancel(waiter.wake):
            _timeout.check_scope()
            waiter.block(seconds)
        _timeout.check_scope()
        return
    if woken is None:
        woken = threading.Event()
    with _timeout.wake_on_cancel(woken.set):
        _timeout.check_scope()
        woken.wait(seconds)
    woken.clear()
    _timeout.check_scope()


def enter(lock: Lock, hold: Hold | None) -> Lease:
    """
    ``with lock``: acquire, then enter the block's cancel scope
    (`open_block`). *hold* is the ``with`` statement's
    (`resilient._lock._hold`), or None.
    """
    out: list[Lease] = []
    try:
        lease = acquire(lock, lock.config, out)
        open_block(lock, hold, lease)
        return lease  # Inside the try: an interrupt here still cleans up.  # noqa: TRY300
    except BaseException:
        lock.forget(out)
        if out:
            shut_block(out[0])
            out[0].release()
        raise


def leave(
    lock: Lock,
    linked: tuple[Lease, _timeout.TimeoutScope] | None,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool:
    """
    Leave the block: its scope (which raises `LockLost` if the lease was
    lost, unless the block is raising), then the release. The release runs
    on the normal path and again, from scratch, if an interrupt lands
    anywhere in it: every step is idempotent.
    """
    entry = linked
    try:
        if entry is None:
            entry = lock.entered()
        lease, scope = entry
        lost = lease._lost_now()  # noqa: SLF001
        before = lease._released  # noqa: SLF001 - released by hand?
        try:
            swallowed = scope.__exit__(exc_type, exc, tb)
        finally:
            lease.release()
            if linked is None:
                lock.forget([lease])
        # The store said the lease was not ours: the block may have run
        # without the lock (expired, deleted or taken meanwhile).
        lost = lost or lease._released_at_exit(before)  # noqa: SLF001
    except BaseException:
        if entry is not None:
            try:
                shut_block(entry[0])
            finally:
                try:
                    # Unless a release was sent and settled (an answer,
                    # or none: UNKNOWN is not sent twice by one exit).
                    if entry[0]._released is None:  # noqa: SLF001
                        entry[0].release()
                finally:
                    lock.forget([entry[0]])
        raise
    if not lost:
        return swallowed
    return lock.outcome(lease, exc, swallowed=swallowed, lost=lost)


__all__ = ["acquire", "compensate", "enter", "leave"]
