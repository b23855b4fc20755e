"""
Waiting, shared by threads and tasks: one-shot wake-ups that a thread blocks
on or a task awaits, woken from any thread.

A primitive that both sync and async callers share (a bulkhead's slots, a
singleflight's result, a lock's hand-over) keeps its queue of waiters behind
its own short `threading.Lock` and, when a waiter's turn comes, calls its
`wake()`. The waiter then looks at the primitive's state again: a wake-up is
a hint to look, never the state itself, so a spurious or a late one is
harmless, and a waiter interrupted after its wake-up can hand its turn on.

`ThreadWaiter` is a held lock that `wake()` releases: far cheaper than a
`threading.Event`. `TaskWaiter` is an `anyio.Event` set directly from the
event loop's own thread and through the loop's thread-safe hand-off from any
other (asyncio and trio alike).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Final, Protocol, final

import anyio
import anyio.lowlevel

from resilient._core._loops import thread_caller


POLL_INTERVAL: Final = 0.005
"""How long a waiter blocks before looking again when time is virtual (a
fake clock moves without telling anyone)."""


class Waiter(Protocol):
    """Anything a primitive can wake: a thread or a task waiting."""

    def wake(self) -> None:
        """Wake the waiter; from any thread, any number of times."""


@final
class ThreadWaiter:
    """
    A thread waiting to be woken.

    `wait` blocks until `wake` (from any thread) or the timeout; a wake-up
    before the wait is kept, so none is lost.
    """

    __slots__ = ("_gate",)

    def __init__(self) -> None:
        gate = threading.Lock()
        gate.acquire()
        self._gate = gate

    def wake(self) -> None:
        """Open the gate (at most once until the next `wait`)."""
        with contextlib.suppress(RuntimeError):  # Already open.
            self._gate.release()

    def wait(self, timeout: float = math.inf) -> bool:
        """
        Block until woken or *timeout* seconds passed (`math.inf`: no
        limit); True when woken.
        """
        if timeout == math.inf:
            return self._gate.acquire()
        return self._gate.acquire(
            True, max(0.0, min(timeout, threading.TIMEOUT_MAX))
        )


@final
class TaskWaiter:
    """
    A task waiting to be woken; made in the task (it remembers the event
    loop and its thread).
    """

    __slots__ = ("_call", "_event", "_home")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._call = thread_caller()
        self._home = threading.get_ident()

    def wake(self) -> None:
        """
        Set the event: directly in the loop's thread, through the loop's
        thread-safe hand-off from another (a closed loop has no one left
        to wake, and is ignored).
        """
        if threading.get_ident() == self._home:
            self._event.set()
            return
        with contextlib.suppress(RuntimeError):  # trio's RunFinishedError too
            self._call(self._event.set)

    @property
    def woken(self) -> bool:
        """Whether `wake` reached the task already."""
        return self._event.is_set()

    async def wait(self, timeout: float = math.inf) -> bool:  # noqa: ASYNC109
        """
        Wait until woken or *timeout* seconds passed; True when woken.
        Cancellation propagates as usual.
        """
        if timeout == math.inf:
            await self._event.wait()
            return True
        with anyio.move_on_after(timeout):
            await self._event.wait()
        return self._event.is_set()


def wait_slice(deadline: float, now: float, *, exact: bool) -> float:
    """
    How long to block before looking again: until *deadline* on the real
    clock (*exact*), never negative, at most what a lock wait accepts; a
    short poll on any other clock.
    """
    if not exact:
        return POLL_INTERVAL
    left = deadline - now
    if left == math.inf:
        return left
    return max(0.0, min(left, threading.TIMEOUT_MAX))
