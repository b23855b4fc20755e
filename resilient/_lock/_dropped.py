"""
The release of a lease its owner dropped without releasing it.

`resilient._lock._lease.Lease.__del__` runs wherever the lease is collected:
any thread, inside any allocation of any code (the cyclic collector), maybe
while that thread holds a lock the release would need. So it does nothing
there but hand a job to this module's worker: a queue put (which is safe
even in ``__del__``) and, if no worker runs, a bare thread started without
waiting for it (`_thread`, which takes none of `threading`'s locks). The
worker stops the lease's renewal, sends its release through the process's
sync backend of the lock's URL (the async backend of an event loop cannot
be used from here, and that loop may be gone), and ends after a second
with nothing to do. At interpreter exit the jobs still queued run inline;
a forked child drops its parent's.
"""

from __future__ import annotations

import _thread
import atexit
import inspect
import logging
import os
import queue
import sys
import threading
from typing import TYPE_CHECKING, Final


if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable

    from opentelemetry.trace import Span

    from resilient._backends import AsyncLockBackend, LockBackend
    from resilient._lock._lease import Lease
    from resilient._lock._machine import LeaseRecord
    from resilient._lock._renewer import TaskRenewer, ThreadRenewer


log: Final = logging.getLogger("resilient")

#: Real seconds the worker waits for another job before it ends.
IDLE: Final = 1.0

_jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
_running = _thread.allocate_lock()
_in_job = _thread.allocate_lock()
"""Held while the worker runs a job: at exit, `flush` waits for it before
the stores tidy their files (a release still under way raced the embedded
store's tidying: files of live leases removed, released ones kept)."""

#: Real seconds `flush` waits at exit for the job the worker is running.
EXIT_WAIT: Final = 5.0


def hand_over(job: Callable[[], object]) -> None:
    """
    Run *job* soon in the worker thread. Never blocks and never takes a
    lock another thread may hold: safe from ``__del__``.
    """
    _jobs.put(job)
    if _running.acquire(blocking=False):
        try:
            _thread.start_new_thread(_worker, ())
        except BaseException:  # pragma: no cover - interpreter shutting down
            _running.release()
            raise


def _worker() -> None:  # pragma: no cover - a bare thread: untraced
    """The worker's thread, traced and profiled as `threading`'s are."""
    trace, profile = threading.gettrace(), threading.getprofile()
    if trace is not None:
        sys.settrace(trace)
    if profile is not None:
        sys.setprofile(profile)
    drain(IDLE)


def drain(idle: float) -> None:
    """Run jobs until none came for *idle* seconds (the worker's loop)."""
    while True:
        try:
            job = _jobs.get(timeout=idle)
        except queue.Empty:
            _running.release()
            # A job put after the wait gave up found the worker still
            # running and started none: take it on, unless another worker
            # already did.
            if _jobs.empty() or not _running.acquire(blocking=False):
                return
            continue
        with _in_job:
            run(job)


def run(job: Callable[[], object]) -> None:
    """Run one job; never raises (nobody is left to tell)."""
    try:
        job()
    except Exception:
        log.debug("lock: the release of a dropped lease failed", exc_info=True)


def release_job(
    record: LeaseRecord,
    renewer: ThreadRenewer | TaskRenewer,
    backend: LockBackend | AsyncLockBackend,
    holder: tuple[tuple[str, bytes], weakref.ref[Lease]],
    span: Span | None,
) -> Callable[[], None]:
    """
    The job for a lease collected unreleased: stop its renewal, send its
    release (on its *backend* if that is a sync one, else on the process's
    sync backend of the lock's URL: an async backend belongs to its event
    loop), forget its *holder* entry, end its span.
    """
    from resilient._backends import ReleaseResult, open_backend  # noqa: PLC0415
    from resilient._lock._holders import forget  # noqa: PLC0415
    from resilient._lock._spans import end_span  # noqa: PLC0415

    def job() -> None:
        record.released()
        renewer.remove(record)
        forget(*holder)
        result = ReleaseResult.UNKNOWN
        try:
            store = backend
            if inspect.iscoroutinefunction(store.release):
                store = open_backend(holder[0][0])
            result = store.release(record.key, record.owner)  # type: ignore[assignment]
        finally:
            failed = result is not ReleaseResult.RELEASED
            end_span(span, result.value, error=failed)
            log.debug(
                "lock %r: a dropped lease's release: %s",
                record.key.shown,
                result.value,
            )

    return job


@atexit.register
def flush() -> None:
    """
    At exit: wait (up to `EXIT_WAIT`) for the job the worker runs, then run
    the jobs still queued here (the worker is a daemon: it dies soon). Run
    by `resilient._lock._hold`'s exit hook before the stores tidy, and on
    its own where that module was never imported.
    """
    got = _in_job.acquire(timeout=EXIT_WAIT)
    try:
        while True:
            try:
                job = _jobs.get_nowait()
            except queue.Empty:
                return
            run(job)
    finally:
        if got:
            _in_job.release()


def _after_fork_in_child() -> None:
    """A forked child's queue held its parent's leases: not ours."""
    global _jobs, _running  # noqa: PLW0603 - one per process
    _jobs = queue.SimpleQueue()
    _running = _thread.allocate_lock()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["hand_over", "release_job"]
