"""
The deadline of one async attempt, without a cancel scope per attempt.

An attempt of a policy (the decorators' and the block form's) must be
interrupted at its deadline, and only then: the caller's own cancellation
is never taken for a timeout. An anyio cancel scope per attempt does that
but costs about as much as the rest of a call, so:

- on asyncio, a watchdog per event loop (`_Watchdog`) keeps the attempts'
  deadlines in a heap and arms one ``loop.call_at`` timer, for the
  earliest. When it fires it cancels the task of each attempt that overran
  (`asyncio.Task.cancel`); the attempt, when it ends, takes its own
  cancellation back (`asyncio.Task.uncancel`) and tells it from the
  caller's by the task's `asyncio.Task.cancelling` count, as
  `asyncio.timeout` does. A registration is one ``heappush``; the timer is
  re-armed only when a deadline earlier than the armed one comes in (not
  for a stream of calls with the same budget). An attempt that ended
  leaves a dead entry in the heap, dropped when it reaches the top or when
  the dead outnumber the live (so the heap stays within twice the attempts
  in flight, plus a constant).
- on trio, a native `trio.CancelScope` with the deadline: trio's runner
  keeps its own deadline heap; anyio's wrapper around it is skipped.

Either object is a context manager with the interface of a cancel scope
that the drivers read: ``with deadline: ...`` then ``cancelled_caught``.
On asyncio, as with `asyncio.timeout`, the attempt is cancelled once at
its deadline, not again at each later checkpoint of its clean-up (an
anyio scope's way); on trio the scope is trio's own, as before.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import weakref
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any, Final, final


if TYPE_CHECKING:
    from types import TracebackType


_get_running_loop: Final = asyncio._get_running_loop  # noqa: SLF001 - C, no raise
_current_task: Final = asyncio.current_task
_CancelledError: Final = asyncio.CancelledError
_sleep: Final = asyncio.sleep

# Dead entries are dropped in one pass once the heap outgrows this many,
# or twice the live entries at the last pass if more.
_MIN_COMPACT: Final = 64


# An attempt's entry in its loop's watchdog, a list (compared in C, made
# without an __init__): [deadline on the loop's clock, sequence number, the
# task or None once the attempt ended (dead), the task's cancelling() count
# at entry, whether the watchdog cancelled the task].
_AT: Final = 0
_TASK: Final = 2
_CANCELLING: Final = 3
_FIRED: Final = 4


@final
class _Watchdog:
    """The deadlines of one event loop's attempts in flight."""

    __slots__ = ("__weakref__", "_armed", "_handle", "_heap", "_limit")

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._limit = _MIN_COMPACT
        self._armed = math.inf
        self._handle: asyncio.TimerHandle | None = None

    def add(self, entry: list[Any], loop: asyncio.AbstractEventLoop) -> None:
        """Register *entry*; arm the timer if it is due first."""
        heap = self._heap
        heappush(heap, entry)
        at = entry[_AT]
        if at < self._armed:
            self._arm(at, loop)
        if len(heap) > self._limit:
            self._compact()

    def _arm(self, at: float, loop: asyncio.AbstractEventLoop) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
        self._handle = loop.call_at(at, self._fire, loop)
        self._armed = at

    def _compact(self) -> None:
        """Drop the dead entries."""
        heap = self._heap
        heap[:] = [e for e in heap if e[_TASK] is not None]
        heapify(heap)
        self._limit = max(_MIN_COMPACT, 2 * len(heap))

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer: cancel each attempt that overran; re-arm."""
        self._handle = None
        self._armed = math.inf
        heap = self._heap
        now = loop.time()
        while heap and heap[0][_AT] <= now:
            entry = heappop(heap)
            task = entry[_TASK]
            if task is not None:
                entry[_FIRED] = True
                task.cancel()
        while heap and heap[0][_TASK] is None:
            heappop(heap)
        if heap:
            self._arm(heap[0][_AT], loop)


_SEQ: Final = itertools.count()

# One watchdog per event loop; the last one looked up, first (one identity
# compare per attempt while one loop runs).
_DOGS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog]] = (
    weakref.WeakKeyDictionary()
)
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], _Watchdog] | None = None


def _watchdog(loop: asyncio.AbstractEventLoop) -> _Watchdog:
    global _last  # noqa: PLW0603 - the one-entry cache
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    dog = _DOGS.get(loop)
    if dog is None:
        dog = _DOGS[loop] = _Watchdog()
    _last = (weakref.ref(loop), dog)
    return dog


_trio: Any = None


def arm(left: float) -> Any:
    """
    Arm a deadline *left* seconds from now for the async code that runs
    until `disarm`, in the event loop running here (asyncio or trio).

    Call `disarm` on every way out: right before a ``try`` whose every
    branch does (nothing between can raise but an asynchronous exception,
    and none is checked for there).
    """
    loop = _get_running_loop()
    if loop is None:
        trio = _trio
        if trio is None:
            trio = _import_trio()
        scope = trio.CancelScope(deadline=trio.current_time() + left)
        scope.__enter__()
        return scope
    task = _current_task(loop)
    entry = [loop.time() + left, next(_SEQ), task, task.cancelling(), False]
    try:
        _watchdog(loop).add(entry, loop)
    except BaseException:
        entry[_TASK] = None
        raise
    return entry


def disarm(armed: Any, exc: BaseException | None) -> bool:
    """
    Undo `arm` (the code it guarded ended with *exc*, or None); True if the
    deadline stopped it (*exc* is the deadline's cancellation alone).
    """
    if type(armed) is not list:
        return _trio_disarm(armed, exc)
    # Dead first (one store): the watchdog never cancels the task once the
    # attempt has ended, whatever lands later here.
    task = armed[_TASK]
    armed[_TASK] = None
    if not armed[_FIRED]:
        return False
    # Our cancellation, taken back: the attempt was stopped by it alone if
    # no other cancellation (the caller's) is pending.
    return task.uncancel() <= armed[_CANCELLING] and isinstance(
        exc, _CancelledError
    )


def _trio_disarm(scope: Any, exc: BaseException | None) -> bool:
    """Exit trio's scope; True if it caught its own cancellation."""
    if exc is None:
        scope.__exit__(None, None, None)
        return False
    if scope.__exit__(type(exc), exc, exc.__traceback__):
        return bool(scope.cancelled_caught)
    return False


@final
class AttemptDeadline:
    """`arm` and `disarm` as a context manager with a cancel scope's
    interface, for the block form and hooks."""

    __slots__ = ("_armed", "_left", "cancelled_caught")

    def __init__(self, left: float) -> None:
        self._left = left
        self._armed: Any = None
        self.cancelled_caught = False
        """Whether the deadline stopped the block (and was swallowed)."""

    def __enter__(self) -> AttemptDeadline:
        self._armed = arm(self._left)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        armed, self._armed = self._armed, None
        if armed is None:
            return False
        caught = self.cancelled_caught = disarm(armed, exc)
        return caught


async def checkpoint() -> None:
    """
    Let the event loop run other tasks (and deliver a cancellation): as
    ``anyio.lowlevel.checkpoint()``, without looking the library up.
    """
    if _get_running_loop() is not None:
        await _sleep(0)
        return
    trio = _trio
    if trio is None:
        trio = _import_trio()
    await trio.lowlevel.checkpoint()


def _import_trio() -> Any:
    """Import trio once, on first use (``import resilient`` does not)."""
    global _trio  # noqa: PLW0603 - imported lazily
    import trio  # noqa: PLC0415

    _trio = trio
    return trio
