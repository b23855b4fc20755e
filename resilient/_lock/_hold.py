"""
What keeps a lease from leaking when an asynchronous exception skips its
release: the ``with`` statement's hold, and the release at exit.

A ``with`` statement looks ``__exit__`` up (binding it) before it calls
``__enter__``: `Exits` binds it to a fresh `Hold`, which ``__enter__``
links to the lease it enters. The statement keeps the hold until it has
called its exit; if the exit is interrupted at its very first instruction
(where no Python code can catch anything), the statement drops the hold
with the lease unreleased, and the hold's ``__del__`` releases it. The
statement's frame and instruction tie the lookup to the call: one
instruction on CPython 3.11-3.13, two matched with `dis` on 3.14
(`resilient._core._internals.enter_calls`). Entered any other way
(``ExitStack``, explicit calls), the lease is found again in the lock's
context entries (`resilient._lock._lock.ENTERED`).
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from typing import TYPE_CHECKING, Any, Final, final

from resilient._core import _internals
from resilient._lock import _dropped
from resilient._lock._async import aleave
from resilient._lock._lease import (
    held_leases,
    log,
    may_still_run,
    thread_holder,
)
from resilient._lock._sync import leave


if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from resilient._lock._lease import Lease
    from resilient._lock._lock import Lock
    from resilient._timeout import TimeoutScope


# The hold the last ``with`` statement of this thread made (`Exits`):
# (hold, id of the statement's frame, its code, its instruction).
PENDING: Final = threading.local()

# Whether the ``__exit__`` lookup and the ``__enter__`` call of one ``with``
# are at different instructions (CPython 3.14): then matched with `dis`.
_BY_DIS: Final = _internals.WITH_SHAPE != "BEFORE_WITH"

# Release tasks of abandoned async leases (a reference keeps them alive).
_BACKGROUND: set[object] = set()


@final
class Hold:
    """
    One ``with`` / ``async with`` of a lock: the exit the statement calls,
    and the lease it entered. Dropped unreleased (its exit was interrupted
    before its first line ran), its ``__del__`` releases the lease.
    """

    __slots__ = ("call", "entry", "lock")

    def __init__(self, lock: Lock) -> None:
        self.lock = lock
        self.entry: tuple[Lease, TimeoutScope] | None = None
        self.call: Callable[[Callable[[], object]], None] | None = None

    def exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return leave(self.lock, self.entry, exc_type, exc, tb)

    async def aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await aleave(self.lock, self.entry, exc_type, exc, tb)

    def __del__(self) -> None:
        entry = getattr(self, "entry", None)  # None if __init__ was cut
        if entry is not None and entry[0]._released is None:  # noqa: SLF001
            abandon(entry[0], entry[1], self.call)


@final
class Exits:
    """
    `Lock.__exit__` / `Lock.__aexit__`: bound on an instance, the exit of a
    new `Hold` (recorded for the ``__enter__`` that follows); on the class,
    the plain method (for ``ExitStack`` and explicit calls).
    """

    __slots__ = ("_async",)

    def __init__(self, *, is_async: bool) -> None:
        self._async = is_async

    def __get__(self, lock: Lock | None, owner: type | None = None) -> Any:
        if lock is None:
            assert owner is not None  # noqa: S101
            return owner._aexit if self._async else owner._exit  # type: ignore[attr-defined]  # noqa: SLF001
        frame = sys._getframe(1)  # noqa: SLF001 - the with statement's frame
        hold = Hold(lock)
        PENDING.hold = (hold, id(frame), frame.f_code, frame.f_lasti)
        return hold.aexit if self._async else hold.exit


def linked(lock: Lock) -> Hold | None:
    """
    The hold the ``with`` statement calling ``lock.__enter__`` (two frames
    up) just made, if the caller is one.
    """
    pending = getattr(PENDING, "hold", None)
    if pending is None:
        return None
    PENDING.hold = None
    hold, frame_id, code, lasti = pending
    frame = sys._getframe(2)  # noqa: SLF001 - the with statement's frame
    if (
        hold.lock is lock
        and frame_id == id(frame)
        and code is frame.f_code
        and (
            lasti == frame.f_lasti
            if not _BY_DIS
            else _internals.enter_calls(code)[0].get(lasti) == frame.f_lasti
        )
    ):
        return hold  # type: ignore[no-any-return]
    return None


def abandon(
    lease: Lease,
    scope: TimeoutScope,
    call: Callable[[Callable[[], object]], None] | None,
) -> None:
    """
    Release a lease its ``with`` statement dropped unreleased. Runs in
    ``__del__`` (any thread, any moment): stops the renewal at once, and
    sends the release from a thread of its own (sync) or a task in the
    lease's event loop (async); never raises, never blocks.
    """
    try:
        lease._let_go()  # noqa: SLF001
        if lease._library is None:  # noqa: SLF001
            if (
                lease._holder is thread_holder()  # noqa: SLF001
                and scope._state == "entered"  # noqa: SLF001
            ):
                with contextlib.suppress(Exception):  # Another context.
                    scope.__exit__(None, None, None)
            threading.Thread(
                target=_release_quietly,
                args=(lease,),
                name="resilient-lock-abandoned",
                daemon=True,
            ).start()
        elif call is not None:  # pragma: no branch - set with the entry
            call(lambda: _spawn_release(lease))
    except Exception:  # noqa: BLE001 - in __del__: the lease expires
        log.debug("lock %r: an abandoned lease is left to expire", lease.name)


def _release_quietly(lease: Lease) -> None:
    """An abandoned lease's release, in a thread of its own."""
    try:
        lease.release()
    except BaseException:  # noqa: BLE001 - nobody to tell: the lease expires
        log.debug("lock %r: an abandoned lease is left to expire", lease.name)


def _spawn_release(lease: Lease) -> None:
    """In the lease's event loop: release it in a task of its own."""
    if lease._library == "trio":  # noqa: SLF001
        import trio  # noqa: PLC0415

        trio.lowlevel.spawn_system_task(lease.arelease)
        return
    import asyncio  # noqa: PLC0415

    task = asyncio.get_running_loop().create_task(lease.arelease())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


@atexit.register
def _release_at_exit() -> None:
    """
    At interpreter exit, release the sync leases of threads that are done
    (the main thread and every joined thread; not daemon threads, which may
    still be running their blocks): a lease taken by hand and never
    released, or one whose ``with`` was interrupted and not recovered.
    """
    _dropped.flush()  # Dropped leases' releases end before any tidying.
    for lease in held_leases():
        if lease._library is None and not may_still_run(lease._holder):  # noqa: SLF001
            with contextlib.suppress(Exception):
                lease.release()
    embedded = sys.modules.get("resilient._backends._sqlite")
    if embedded is not None:  # Its files of the leases released just now.
        embedded._tidy_at_exit()  # noqa: SLF001


__all__ = ["Exits", "Hold", "abandon", "linked"]
