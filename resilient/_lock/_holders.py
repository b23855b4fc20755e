"""
Who holds which lock in this process: the record of held leases, and the
identity of a holder.

A holder is identified by an object that cannot be reused while its lease
lives: a thread by a token of its own (`thread_holder`), a task by a weak
reference to the task object (`resilient._lock._async.current_holder`);
never by a thread ident or an ``id()``, which a new thread or task may be
given once the old one is gone, and which would then be refused as
re-entrant instead of waiting. The record holds leases weakly, so that a
lease its user dropped can be collected (and released).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Final, final


if TYPE_CHECKING:
    from resilient._lock._lease import Lease
    from resilient._lock._lock import Lock


# (url, key digest) -> a weak reference to the lease this process holds
# (the lease's own `_weak`: a lease its user dropped is collected, and
# released, see `Lease.__del__`). To refuse a same-holder second acquire,
# and to release at exit the leases no thread can still be using. Read and
# written as single dict operations (atomic: a plain dict of references
# costs a third of a `WeakValueDictionary`); a conditional delete takes
# the lock.
HOLDERS: dict[tuple[str, bytes], weakref.ref[Lease]] = {}
HOLDERS_LOCK: Final = threading.Lock()


def holder_of(key: tuple[str, bytes]) -> Lease | None:
    """The live lease recorded for *key*, if any."""
    ref = HOLDERS.get(key)
    return None if ref is None else ref()


def forget(key: tuple[str, bytes], ref: weakref.ref[Lease]) -> None:
    """Drop *key*'s entry if it is still *ref* (a lease's `_weak`)."""
    if HOLDERS.get(key) is ref:
        with HOLDERS_LOCK:
            if HOLDERS.get(key) is ref:
                del HOLDERS[key]


def held_leases() -> list[Lease]:
    """Every live lease recorded."""
    with HOLDERS_LOCK:
        refs = list(HOLDERS.values())
    return [lease for ref in refs if (lease := ref()) is not None]


_THREAD: Final = threading.local()


@final
class ThreadHolder:
    """
    A thread, as the holder of leases: one object per thread, kept by its
    leases, so no other thread is ever taken for it (a thread ident is
    reused by the next thread once the old one ends).
    """

    __slots__ = ("thread",)

    def __init__(self) -> None:
        self.thread = weakref.ref(threading.current_thread())

    def __repr__(self) -> str:
        return f"<ThreadHolder {self.thread()!r}>"


def thread_holder() -> ThreadHolder:
    """The calling thread's holder token."""
    me: ThreadHolder | None = getattr(_THREAD, "me", None)
    if me is None:
        me = _THREAD.me = ThreadHolder()
    return me


def may_still_run(holder: object) -> bool:
    """
    Whether the thread *holder* (`ThreadHolder`) may still be running at
    interpreter exit: a daemon thread that is alive (the others are done,
    or joined by now).
    """
    if not isinstance(holder, ThreadHolder):
        return False
    thread = holder.thread()
    return thread is not None and thread.daemon and thread.is_alive()


def claim(lock: Lock, me: object) -> None:
    """
    Refuse a second acquire of *lock* by the thread or task *me* (a
    `ThreadHolder`, or a weak reference to a task: equal only while it is
    that very task).
    """
    held = holder_of(lock.holder_key)
    if held is not None and held._holder == me:  # noqa: SLF001
        who = "task" if isinstance(me, weakref.ref) else "thread"
        raise RuntimeError(
            f"lock {lock.key.shown!r} is already held by this {who}: "
            "locks are not reentrant, and waiting for it here would "
            "wait for ever"
        )


__all__ = [
    "HOLDERS",
    "HOLDERS_LOCK",
    "ThreadHolder",
    "claim",
    "forget",
    "held_leases",
    "holder_of",
    "may_still_run",
    "thread_holder",
]
