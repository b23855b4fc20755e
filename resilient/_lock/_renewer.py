"""
One renewer per process and backend: a thread for a sync backend, a task
for an async one.

Never a thread per lock: every lease held through one backend is renewed
by the same worker, in batches of the backend's ``max_renew_batch`` (one
round trip each), and leases due close together are renewed together.
The schedule (`Renewals`) is shared by the two drivers; the thread driver
sleeps on a condition variable, the task driver on anyio. Registering a
lease is a dict insert with no lock and no wake-up unless the worker would
look too late for it, so a short hold costs the renewer nothing until its
first renewal would be due.

A renewal call that hangs does not hold back the loss: the task driver
bounds each call by the earliest validity of its batch, and the thread
driver has a watchdog thread that, while a call is out, marks each lease
lost once its validity runs out on the local monotonic clock.

The worker starts with the first lease and ends with the last, so an idle
process runs nothing. After ``os.fork()`` the child has no renewer (threads
do not survive a fork) and owns none of the parent's leases: they are
marked lost in the child, and its release sends nothing.

The schedule is `._renewals`', the thread driver `._renew_thread`'s, the task
driver `._renew_task`'s; this module keeps one renewer per backend
(`thread_renewer`, `task_renewer`) and resets them all after a fork.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

from resilient._lock._renew_task import TaskRenewer
from resilient._lock._renew_thread import ThreadRenewer
from resilient._lock._renewals import ALL as _ALL
from resilient._lock._renewals import Renewals


if TYPE_CHECKING:
    from resilient._backends import AsyncLockBackend, LockBackend


_THREADS: dict[int, ThreadRenewer] = {}
# Weakly: a loop's backend is closed and dropped with its loop, and its
# renewer with it (the renewer's task and its leases hold it meanwhile).
_TASKS: weakref.WeakValueDictionary[int, TaskRenewer] = (
    weakref.WeakValueDictionary()
)
_LOCK = threading.Lock()


def thread_renewer(backend: LockBackend) -> ThreadRenewer:
    """The one renewer of *backend*."""
    with _LOCK:
        renewer = _THREADS.get(id(backend))
        if renewer is None or renewer.backend is not backend:
            renewer = _THREADS[id(backend)] = ThreadRenewer(backend)
        return renewer


def task_renewer(backend: AsyncLockBackend, library: str) -> TaskRenewer:
    """The one renewer of *backend* (which belongs to one event loop)."""
    with _LOCK:
        renewer = _TASKS.get(id(backend))
        if renewer is None or renewer.backend is not backend:
            renewer = _TASKS[id(backend)] = TaskRenewer(backend, library)
        return renewer


def _after_fork_in_child() -> None:
    """The child of a fork holds none of the parent's leases."""
    global _LOCK  # noqa: PLW0603 - it may have been held at the fork
    _LOCK = threading.Lock()
    for renewer in list(_ALL):
        renewer.reset_after_fork()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = [
    "Renewals",
    "TaskRenewer",
    "ThreadRenewer",
    "task_renewer",
    "thread_renewer",
]
