"""
The async shell (asyncio and trio): the sync shell's steps, awaited.

The same `resilient._lock._attempt.Attempt` decides; this module sends
with the event loop's backend, waits on an `anyio.Event` that the
backend's watch sets through the loop, and enters and leaves the block's
cancel scope.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, final

import anyio
import sniffio

from resilient._backends import Busy, Grant
from resilient._core import _clock, _loops
from resilient._lock._attempt import Attempt, GiveUp, Wait
from resilient._lock._lease import (
    RELEASE_TIMEOUT,
    log,
    open_block,
    shut_block,
)


if TYPE_CHECKING:
    from types import TracebackType

    from resilient import _timeout
    from resilient._backends import AsyncLockBackend, LockKey, OwnerToken
    from resilient._lock._config import LockConfig
    from resilient._lock._hold import Hold
    from resilient._lock._lease import Lease
    from resilient._lock._lock import Lock


def current_library() -> str:
    """
    The async library of the running task (``"trio"`` or ``"asyncio"``),
    read the way sniffio does, without its look-ups for other libraries.
    """
    return (
        sniffio.thread_local.name
        or sniffio.current_async_library_cvar.get()
        or "asyncio"
    )


def loop_token(library: str) -> object:
    """A hashable token of the running event loop."""
    if library == "trio":
        import trio  # noqa: PLC0415

        return trio.lowlevel.current_trio_token()
    return asyncio.get_running_loop()


def current_holder(library: str) -> object:
    """
    The running task, as the holder of a lease: a weak reference to the
    task object, equal to another only while both are that very task
    (never its ``id()``, which a later task may be given).
    """
    if library == "trio":
        import trio  # noqa: PLC0415

        return weakref.ref(trio.lowlevel.current_task())
    task = asyncio.current_task()
    return object() if task is None else weakref.ref(task)


@final
class _Wakeup:
    """
    What a waiting task sleeps on: an event the backend's watch sets from
    any thread, through the event loop. A wake-up that comes between two
    waits is kept for the next.
    """

    __slots__ = ("call", "event")

    def __init__(self, library: str) -> None:
        self.call = _loops.loop_caller(library)
        self.event = anyio.Event()

    def notify(self) -> None:
        try:  # noqa: SIM105
            self.call(self._set)
        except RuntimeError:  # pragma: no cover - the loop is gone
            pass

    def _set(self) -> None:
        self.event.set()

    async def wait(self, seconds: float) -> None:
        clock = _clock.get_clock()
        if clock is not _clock.DEFAULT_CLOCK:
            await clock.asleep(seconds)  # Virtual time: the clock must move.
        else:
            with anyio.move_on_after(seconds):
                await self.event.wait()
        if self.event.is_set():
            self.event = anyio.Event()


async def aacquire(lock: Lock, config: LockConfig, out: list[Lease]) -> Lease:  # noqa: C901, PLR0912
    """`resilient._lock._sync.acquire`, awaited."""
    library = current_library()
    backend, renewer = lock.async_parts(library)
    att = Attempt(
        lock, config, current_holder(library), library, backend, renewer
    )
    key, owner, ttl, clock = lock.key, att.owner, config.ttl, att.clock
    wakeup: _Wakeup | None = None  # Made only if we must wait.
    try:
        while True:
            sent = clock.now()
            att.sent_any = True
            step: Wait | GiveUp
            try:
                answer = await backend.acquire(key, owner, ttl)
            except Exception as exc:  # noqa: BLE001 - no answer: retried
                step = att.failed(exc)
            else:
                if isinstance(answer, Grant):
                    lease = att.take(sent, answer, out)
                    if lease is not None:
                        return lease
                    await acompensate(backend, key, owner)  # Came too late.
                    answer = Busy(None)
                step = att.held(answer)
                if att.stop is None and isinstance(step, Wait):
                    wakeup = _Wakeup(library)
                    att.stop = backend.watch(key, wakeup.notify)
                    continue
            if isinstance(step, GiveUp):
                if att.error is not None:
                    await acompensate(backend, key, owner)
                raise att.refused(step)  # noqa: TRY301
            if wakeup is None:
                wakeup = _Wakeup(library)
            await wakeup.wait(step.seconds)
    except BaseException as exc:
        if out:
            await out[-1].arelease()
        elif att.compensates(exc):
            await acompensate(backend, key, owner)
        raise
    finally:
        if att.stop is not None:
            att.stop()


async def acompensate(
    backend: AsyncLockBackend, key: LockKey, owner: OwnerToken
) -> None:
    """`resilient._lock._sync.compensate`, shielded and bounded."""
    try:
        with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
            await backend.release(key, owner)
    except Exception:  # noqa: BLE001 - best effort: the lease expires
        log.debug("lock %r: compensating release got no answer", key.shown)


async def aenter(lock: Lock, hold: Hold | None) -> Lease:
    """``async with lock``: `resilient._lock._sync.enter`, awaited."""
    out: list[Lease] = []
    try:
        lease = await aacquire(lock, lock.config, out)
        if hold is not None:
            hold.call = _loops.loop_caller(lease._library)  # type: ignore[arg-type]  # noqa: SLF001
        open_block(lock, hold, lease)
        return lease  # Inside the try: an interrupt here still cleans up.  # noqa: TRY300
    except BaseException:
        lock.forget(out)
        if out:
            shut_block(out[0])
            await out[0].arelease()
        raise


async def aleave(
    lock: Lock,
    linked: tuple[Lease, _timeout.TimeoutScope] | None,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool:
    """`resilient._lock._sync.leave`, awaited."""
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
            await lease.arelease()
            if linked is None:
                lock.forget([lease])
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
                        await entry[0].arelease()
                finally:
                    lock.forget([entry[0]])
        raise
    if not lost:
        return swallowed
    return lock.outcome(lease, exc, swallowed=swallowed, lost=lost)


__all__ = ["aacquire", "acompensate", "aenter", "aleave"]
