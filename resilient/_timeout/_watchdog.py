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
  keeps its own deadline heap; anyio's wrapper around it is skipped. The
  decorators' drivers arm it only once the attempt's coroutine suspends
  (`resilient._pipeline._lazy`), by then maybe inside cancel scopes of its
  own (``trio.sleep`` opens one): `arm` then splices the attempt's scope
  into the task's tree of cancel statuses *above* those, where it would
  have been had it been entered first (`_splice`).

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
import time
import types
import weakref
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any, Final, final

from resilient._core import _internals


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator
    from types import TracebackType


_monotonic: Final = time.monotonic
_get_running_loop: Final = _internals.get_running_loop  # C, no raise
_current_task: Final = asyncio.current_task
_CancelledError: Final = asyncio.CancelledError

# Dead entries are dropped in one pass once the heap outgrows this many,
# or twice the live entries at the last pass if more.
_MIN_COMPACT: Final = 64


# An attempt's entry in its loop's watchdog, a list (compared in C, made
# without an __init__): [deadline on the loop's clock, sequence number, the
# task or None once the attempt ended (dead), the task's cancelling() count
# at entry, whether the watchdog cancelled the task].
_AT: Final = 0
TASK: Final = 2
_CANCELLING: Final = 3
FIRED: Final = 4


@final
class _Watchdog:
    """The deadlines of one event loop's attempts in flight."""

    # Nothing here refers to the loop (the timer is held weakly, the loop
    # holds it): the loop is freed once nothing else refers to it, and its
    # watchdog with it.
    __slots__ = ("__weakref__", "armed", "handle", "heap", "limit", "native")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.heap: list[list[Any]] = []
        """The entries, earliest deadline first (dead ones included)."""
        self.limit = _MIN_COMPACT
        """Past this many entries, the dead ones are dropped."""
        self.armed = math.inf
        """When the timer fires (the loop's clock); inf when not armed."""
        self.handle: weakref.ref[asyncio.TimerHandle] | None = None
        """The armed timer, if any."""
        self.native = type(loop).time is asyncio.BaseEventLoop.time
        """Whether the loop's clock is `time.monotonic` (then read directly,
        one Python frame less per attempt)."""

    def arm(self, at: float, loop: asyncio.AbstractEventLoop) -> None:
        """(Re-)arm the timer for *at*."""
        ref = self.handle
        handle = None if ref is None else ref()
        if handle is not None:
            handle.cancel()
        self.handle = weakref.ref(loop.call_at(at, self.fire))
        self.armed = at

    def compact(self) -> None:
        """Drop the dead entries."""
        heap = self.heap
        heap[:] = [e for e in heap if e[TASK] is not None]
        heapify(heap)
        self.limit = max(_MIN_COMPACT, 2 * len(heap))

    def fire(self) -> None:
        """The timer: cancel each attempt that overran; re-arm."""
        self.handle = None
        self.armed = math.inf
        heap = self.heap
        loop = asyncio.get_running_loop()
        now = loop.time()
        while heap and heap[0][_AT] <= now:
            entry = heappop(heap)
            task = entry[TASK]
            if task is not None:
                entry[FIRED] = True
                task.cancel()
        while heap and heap[0][TASK] is None:
            heappop(heap)
        if heap:
            self.arm(heap[0][_AT], loop)


def _fire(entry: list[Any]) -> None:
    """Cancel the task of *entry*, an attempt past its deadline, unless
    it has ended."""
    task = entry[TASK]
    if task is not None:
        entry[FIRED] = True
        task.cancel()


_SEQ: Final = itertools.count()

# One watchdog per event loop; the last one looked up, first (one identity
# compare per attempt while one loop runs).
_DOGS: Final[
    weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog]
] = weakref.WeakKeyDictionary()
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], _Watchdog] | None = None


def _watchdog(loop: asyncio.AbstractEventLoop) -> _Watchdog:
    """The watchdog of *loop*, made on first use."""
    global _last  # noqa: PLW0603 - the one-entry cache
    dog = _DOGS.get(loop)
    if dog is None:
        dog = _DOGS[loop] = _Watchdog(loop)
    _last = (weakref.ref(loop), dog)
    return dog


_trio: Any = None


def arm(left: float, base: Any = None) -> Any:
    """
    Arm a deadline *left* seconds from now for the async code that runs
    until `disarm`, in the event loop running here (asyncio or trio).

    On trio, *base* is what `trio_base` gave when that code started, if
    it may have entered cancel scopes since (an attempt armed at its first
    suspension): the deadline's scope goes in above those.

    Call `disarm` on every way out: inside a ``try`` whose handlers do
    (`arm` returns to a Python caller, and CPython checks for asynchronous
    exceptions neither on that return nor on the store of its result).
    """
    loop = _get_running_loop()
    if loop is None:  # No asyncio loop runs here: trio does.
        return _trio_arm(left, base)
    last = _last
    dog = (
        last[1] if last is not None and last[0]() is loop else _watchdog(loop)
    )
    task = _current_task(loop)
    if task is None:  # pragma: no cover - the drivers run in a task
        raise RuntimeError("an attempt deadline needs an asyncio task")
    at = (_monotonic() if dog.native else loop.time()) + left
    entry = [at, next(_SEQ), task, task.cancelling(), False]
    if left <= 0:
        # Past already (an attempt armed at its first suspension): a
        # callback queued now runs before the task's own wake-up from the
        # suspension that follows (a timer would run after it, once a bare
        # yield had resumed the attempt), and cancels it only if the
        # attempt has not ended by then.
        loop.call_soon(_fire, entry)
        return entry
    try:
        heap = dog.heap
        heappush(heap, entry)
        if at < dog.armed:
            dog.arm(at, loop)
        if len(heap) > dog.limit:
            dog.compact()
    except BaseException:
        entry[TASK] = None
        raise
    return entry


def disarm(armed: Any, exc: BaseException | None) -> bool:
    """
    Undo `arm` (the code it guarded ended with *exc*, or None); True if the
    deadline stopped it (*exc* is the deadline's cancellation alone).
    Undoing it again (after a `disarm` cut short) changes nothing.
    """
    if type(armed) is not list:
        return _trio_disarm(armed, exc)
    # Dead first (one store): the watchdog never cancels the task once the
    # attempt has ended, whatever lands later here.
    task = armed[TASK]
    armed[TASK] = None
    if task is None or not armed[FIRED]:
        return False
    # Our cancellation, taken back: the attempt was stopped by it alone if
    # no other cancellation (the caller's) is pending.
    return task.uncancel() <= armed[_CANCELLING] and isinstance(
        exc, _CancelledError
    )


def trio_base() -> Any:
    """
    Where in trio's tree of cancel statuses an attempt starts (the current
    task's), for `arm` at its first suspension, when no asyncio loop runs
    here (the drivers ask ``_get_running_loop()`` first; on asyncio the
    base is None); `EAGER` on a trio whose tree cannot be spliced (then arm
    before the attempt).
    """
    if _trio is None:
        _import_trio()
    if not _SPLICE:  # pragma: no cover - every trio this supports can
        return EAGER
    return _current_task_trio()._cancel_status  # noqa: SLF001


EAGER: Final = object()
"""`trio_base` on a trio whose cancel statuses cannot be spliced."""


def _trio_arm(left: float, base: Any) -> Any:
    """Enter trio's own cancel scope with the deadline (spliced above the
    scopes entered since *base*, if any)."""
    trio = _trio or _import_trio()
    scope = trio.CancelScope(deadline=trio.current_time() + left)
    if base is None:
        scope.__enter__()
        return scope
    task = _current_task_trio()
    top = task._cancel_status  # noqa: SLF001
    if top is base:  # No scope entered since: it nests as it is.
        scope.__enter__()
        return scope
    _splice(scope, task, top, base)
    return scope


def _splice(scope: Any, task: Any, top: Any, base: Any) -> None:
    """
    Enter *scope* as if before the cancel scopes that *task* entered since
    its cancel status was *base* (*top* now): its status becomes *base*'s
    child and the parent of the outermost of those, and the task stays in
    *top*. trio's own ``TaskStatus.started`` moves statuses between
    parents with the same setter; each move recomputes who is cancelled,
    so a deadline already past cancels the task at this checkpoint.
    """
    child = top
    while child.parent is not base:
        child = child.parent
        if child is None:  # pragma: no cover - misnested by the attempt
            raise RuntimeError("the attempt left the cancel scope it began in")
    scope.__enter__()  # The task in the scope's status, a child of *top*.
    status = scope._cancel_status  # noqa: SLF001
    task._activate_cancel_status(top)  # noqa: SLF001 - back where it was
    status.parent = base
    child.parent = status


def _trio_disarm(scope: Any, exc: BaseException | None) -> bool:
    """Exit trio's scope; True if it caught its own cancellation."""
    if scope._cancel_status is None:  # noqa: SLF001 - exited already
        return False
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
        if armed is None:  # Not entered, or its entry cut short.
            return False
        caught = self.cancelled_caught = disarm(armed, exc)
        return caught


def checkpoint() -> Awaitable[None]:
    """
    Let the event loop run other tasks (and deliver a cancellation): as
    ``anyio.lowlevel.checkpoint()``, without looking the library up. A
    plain function returning the awaitable: one coroutine frame less.
    """
    if _get_running_loop() is not None:
        return yield_now()
    return (_trio_checkpoint or _import_trio().lowlevel.checkpoint)()  # type: ignore[no-any-return]


def trio_checkpoint() -> Callable[[], Awaitable[None]]:
    """trio's ``checkpoint`` function itself (trio imported on first
    use), for a driver that makes many in one call."""
    return _trio_checkpoint or _import_trio().lowlevel.checkpoint  # type: ignore[no-any-return]


@types.coroutine
def yield_now() -> Generator[None, None, None]:
    """asyncio's own zero sleep (``asyncio.sleep(0)``) without its frame:
    a bare yield gives the loop one iteration (asyncio only)."""
    yield


_current_task_trio: Any = None
_trio_checkpoint: Any = None
_SPLICE = False


def _import_trio() -> Any:
    """Import trio once, on first use (``import resilient`` does not)."""
    global _trio, _current_task_trio, _trio_checkpoint, _SPLICE  # noqa: PLW0603 - imported lazily
    import trio  # noqa: PLC0415

    _current_task_trio = trio.lowlevel.current_task
    _trio_checkpoint = trio.lowlevel.checkpoint
    # What `_splice` uses of trio's private cancel tree (trio 0.12 on).
    _SPLICE = _internals.trio_can_splice(trio)
    _trio = trio
    return trio
