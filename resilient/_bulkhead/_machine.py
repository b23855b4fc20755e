"""
The machine of a bulkhead and its permits: the slots, the FIFO queue and
the counts behind one short lock, with no waiting and no I/O (see the
package's docstring for how every step survives an asynchronous
exception).
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import TYPE_CHECKING, Final, Literal, final

import attrs

from resilient._core import _entered
from resilient._core._done import DONE, Done
from resilient._core._shown import shown


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from resilient._bulkhead._shells import Bulkhead
    from resilient._core._config_bulkhead import BulkheadConfig


RejectReason = Literal["full", "queue_full", "timeout", "deadline"]

RECHECK: Final = 1.0
"""Longest a waiter blocks, in real seconds, before it looks at its permit
again even if nobody woke it (a grant whose wake-up an asynchronous
exception cut off is found this way)."""

# The states of a permit; changed only under the machine's lock (a permit
# nobody else can reach is read without it).
_PENDING: Final = 0  # made, no slot taken yet
_WAITING: Final = 1  # in the queue
_HELD: Final = 2  # holds a slot (taken, or granted while queued)
_RELEASED: Final = 3  # gave it back, or never got one


@final
@attrs.frozen
class BulkheadStatistics:
    """
    A consistent snapshot of one bulkhead, taken under its lock.

    At every instant ``acquired == released + in_use``, and every request so
    far is counted once in ``acquired + rejected + cancelled + waiting``.

    Attributes:
        name: The bulkhead's name.
        max_concurrent: Its number of slots.
        max_waiting: How many callers may queue.
        in_use: Permits held now.
        waiting: Callers queued now.
        acquired: Permits granted so far.
        released: Permits given back so far (a waiter cancelled just after
            its grant counts as acquired and released).
        rejected: `BulkheadFull` errors raised so far, timeouts included.
        timed_out: Of those, the ones raised after waiting (``"timeout"``
            and ``"deadline"`` once queued).
        cancelled: Waiters cancelled or interrupted before their grant.
    """

    name: str
    max_concurrent: int
    max_waiting: int
    in_use: int
    waiting: int
    acquired: int
    released: int
    rejected: int
    timed_out: int
    cancelled: int


@final
class BulkheadPermit:
    """
    One slot of a bulkhead, held until `release`.

    Also a context manager that releases on exit::

        with bulkhead.acquire():
            ...

    A permit dropped without `release` gives its slot back when it is
    freed, like a file that is closed when collected; do not rely on it
    (release it, or use ``with``), but no exception can leak a slot.
    """

    __slots__ = (
        "__weakref__",
        "_bulkhead",
        "_deadline",
        "_outer",
        "_reason",
        "_ref",
        "_since",
        "_state",
        "_wake",
    )

    _bulkhead: Bulkhead
    _ref: weakref.ref[BulkheadPermit]
    _state: int
    _wake: Callable[[], object]
    _since: float
    _deadline: float
    _reason: RejectReason
    _outer: object
    """The ticket of the stage before this one, carried for it by the
    pipeline's breaker-then-bulkhead pair (`resilient._bulkhead._pair`)."""

    def __init__(self, bulkhead: Bulkhead) -> None:
        # The permit keeps its bulkhead alive, so the registry finds the
        # same bulkhead by name while any slot of it is held or awaited.
        self._bulkhead = bulkhead
        self._state = _PENDING

    @property
    def released(self) -> bool:
        """Whether the slot was given back (or never taken)."""
        return self._state == _RELEASED

    def release(self) -> None:
        """
        Give the slot back, to the first waiter if any. Idempotent; also
        takes a queued permit out of the queue.
        """
        self._bulkhead._machine.release(self)  # noqa: SLF001

    def __enter__(self) -> BulkheadPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bulkhead._machine.release(self)  # noqa: SLF001

    def _exit_block(self, *exc: object) -> None:
        """The exit of the ``with bulkhead:`` block this permit is for."""
        if self._state == _PENDING:
            # Never entered: a direct ``bulkhead.__exit__()`` call.
            _class_exit(self._bulkhead)
            return
        self._bulkhead._machine.release(self)  # noqa: SLF001

    async def _aexit_block(self, *exc: object) -> None:
        """The exit of the ``async with bulkhead:`` block (never awaits)."""
        self._exit_block()

    def __repr__(self) -> str:
        state = ("pending", "waiting", "held", "released")[self._state]
        return f"<BulkheadPermit of {shown(self._bulkhead.name)!r}, {state}>"


@final
class BulkheadMachine:
    """
    The slots and the wait queue of one bulkhead, and nothing else.

    Every method takes the lock for a few attribute updates and never
    blocks; time comes in as arguments. Shared by threads and tasks alike.

    Each held permit is in `_holders` (as a weak reference) from the step
    that grants it to the step that releases it, so a permit freed while
    held shows up as a dead reference: `_sweep` gives its slot back. No
    finalizer runs Python code (one would swallow an asynchronous exception
    that landed in it, and could not take the lock safely).

    The holders are the count of slots in use (`in_use` is their number,
    `released` the grants no longer among them): a grant's one set
    operation adds its slot, a release's or a sweep's one set operation
    gives it back, and discarding a reference twice frees nothing twice,
    so no exception between two steps can make the counts disagree.

    Args:
        name: The bulkhead's name.
        config: Its configuration.
    """

    __slots__ = (
        "_holders",
        "_limit",
        "_lock",
        "_max_waiting",
        "_waiters",
        "acquired",
        "cancelled",
        "config",
        "name",
        "rejected",
        "timed_out",
    )

    def __init__(self, name: str, config: BulkheadConfig) -> None:
        self.name = name
        # An RLock for the owner its release checks: the pipeline's pair
        # takes it without ``with`` (`resilient._bulkhead._pair`). (And a
        # finalizer that a collection runs inside a locked step, in the
        # thread that holds the lock, releases instead of deadlocking.)
        self._lock = threading.RLock()
        self._waiters: collections.deque[BulkheadPermit] = collections.deque()
        self._holders: set[weakref.ref[BulkheadPermit]] = set()
        self.configure(config)
        self.acquired = 0
        self.rejected = 0
        self.timed_out = 0
        self.cancelled = 0

    @property
    def in_use(self) -> int:
        """Slots held now (by permits `_sweep` has not found freed yet
        too)."""
        return len(self._holders)

    @property
    def released(self) -> int:
        """Slots given back so far: the grants no longer held."""
        return self.acquired - len(self._holders)

    def configure(self, config: BulkheadConfig) -> None:
        """Take *config*'s limits (on a machine that has seen no work)."""
        self.config = config
        self._limit = config.max_concurrent
        self._max_waiting = config.max_waiting

    # Every grant below is written the same way: the weak reference is made
    # first (a call, before the checks: nothing is allocated between a check
    # and its grant, so no collection runs a finalizer that takes or grants
    # a slot in this thread there, which the reentrant lock would let in),
    # then it and the state are stored on the permit and the grant counted
    # with no call in between, then the reference is added (a call, the
    # slot's take, after which the state is consistent again).
    # A release stores the state, then discards the reference (a call, the
    # slot's give-back). The pipeline's breaker-then-bulkhead pair
    # (`resilient._bulkhead._pair`) does `take_new` and the held case of
    # `release` inline: a change to either is made there too.

    def take(self, permit: BulkheadPermit) -> bool:
        """Give *permit* a free slot if there is one and nobody queues."""
        ref = weakref.ref(permit)
        with self._lock:
            if len(self._holders) < self._limit and not self._waiters:
                permit._ref = ref  # noqa: SLF001
                permit._state = _HELD  # noqa: SLF001
                self.acquired += 1
                self._holders.add(ref)
                return True
            return False

    def take_new(self, bulkhead: Bulkhead) -> BulkheadPermit | None:
        """
        A new permit of *bulkhead* holding a free slot, or None (every slot
        taken, or others queue): `BulkheadPermit` and `take` in one step,
        for the pipeline's bare first attempt (one call per slot).

        The permit exists before the slot is taken, as with `take`: one
        lost to an exception before it is returned is freed, and its slot
        comes back (see the class's docstring).
        """
        permit = _new_permit(BulkheadPermit)
        permit._bulkhead = bulkhead  # noqa: SLF001
        permit._state = _PENDING  # noqa: SLF001
        ref = weakref.ref(permit)
        with self._lock:
            if len(self._holders) < self._limit and not self._waiters:
                permit._ref = ref  # noqa: SLF001
                permit._state = _HELD  # noqa: SLF001
                self.acquired += 1
                self._holders.add(ref)
                return permit
        return None

    def enqueue(
        self,
        permit: BulkheadPermit,
        now: float,
        seconds: float,
        reason: RejectReason,
        wake: Callable[[], object],
    ) -> RejectReason | None:
        """
        Give *permit* a free slot or queue it (None: look at its state), or
        refuse (why).

        Args:
            permit: A permit that holds nothing yet.
            now: The time on the clock.
            seconds: How long the caller may wait; 0 or less never queues.
            reason: What ends the wait if it runs out: ``"timeout"`` or
                ``"deadline"``.
            wake: Called, under the lock and from any thread, when the
                permit is granted a slot; must not block.
        """
        ref = weakref.ref(permit)
        with self._lock:
            self._sweep()
            if len(self._holders) < self._limit and not self._waiters:
                permit._ref = ref  # noqa: SLF001
                permit._state = _HELD  # noqa: SLF001
                self.acquired += 1
                self._holders.add(ref)
                return None
            if seconds <= 0:
                self.rejected += 1
                return "full" if reason == "timeout" else reason
            if len(self._waiters) >= self._max_waiting:
                self.rejected += 1
                return "queue_full"
            permit._wake = wake  # noqa: SLF001
            permit._since = now  # noqa: SLF001
            permit._deadline = now + seconds  # noqa: SLF001
            permit._reason = reason  # noqa: SLF001
            permit._state = _WAITING  # noqa: SLF001
            self._waiters.append(permit)
            return None

    def settle(
        self, permit: BulkheadPermit, now: float
    ) -> bool | RejectReason:
        """
        After a wake-up: granted (True), still waiting (False), or out of
        time (why; the permit leaves the queue).
        """
        with self._lock:
            self._sweep()
            state = permit._state  # noqa: SLF001
            if state == _HELD:
                return True
            if state == _WAITING:
                if now < permit._deadline:  # noqa: SLF001
                    return False
                permit._state = _RELEASED  # noqa: SLF001
                self.rejected += 1
                self.timed_out += 1
                self._waiters.remove(permit)
                return permit._reason  # noqa: SLF001
            return False

    def release(
        self,
        permit: BulkheadPermit,
        _exc: BaseException | None = None,
    ) -> Done:
        """
        Give back *permit*'s slot (to the first waiter), take it out of the
        queue, or nothing if it holds nothing; idempotent.

        Also the pipeline's settle of a bare attempt's slot, sync and async:
        the attempt's exception (ignored) is the second argument, and the
        return value, `DONE`, is awaitable (and already complete), so an
        async settle costs this one call.
        """
        with self._lock:
            state = permit._state  # noqa: SLF001
            if state == _HELD:
                # The reference made at the grant, not a new one: the
                # collector clears a permit's weak references before it runs
                # the finalizer that may release it (a generator collected
                # in a cycle), and a dead reference equals only itself.
                # (Nothing if `_sweep` gave the slot back first.)
                permit._state = _RELEASED  # noqa: SLF001
                self._holders.discard(permit._ref)  # noqa: SLF001
                if self._waiters:
                    self._serve()
            elif state == _WAITING:
                permit._state = _RELEASED  # noqa: SLF001
                self.cancelled += 1
                self._waiters.remove(permit)
            else:
                permit._state = _RELEASED  # noqa: SLF001
        return DONE

    # ``abandon`` is what a waiter that is cancelled or interrupted does:
    # the same as a release, whatever state it reached.
    abandon = release

    def _sweep(self) -> None:
        """
        Give back the slots of permits freed while held, and serve the
        queue (a release an exception cut off before it served). Locked.
        """
        holders = self._holders
        for ref in [ref for ref in holders if ref() is None]:
            holders.discard(ref)
        self._serve()

    def _serve(self) -> None:
        """Grant free slots to the first waiters, in order. Locked."""
        waiters = self._waiters
        while waiters:
            permit = waiters[0]
            ref = weakref.ref(permit)
            if not waiters or waiters[0] is not permit:
                # A finalizer that the reference's allocation let run
                # released a slot in this thread and served the queue.
                continue
            if permit._state != _WAITING:  # noqa: SLF001
                # A grant cut off before it left the queue, then released.
                waiters.popleft()
                continue
            if len(self._holders) >= self._limit:
                return
            permit._ref = ref  # noqa: SLF001
            permit._state = _HELD  # noqa: SLF001
            self.acquired += 1
            self._holders.add(ref)
            waiters.popleft()
            try:
                permit._wake()  # noqa: SLF001
            except Exception:  # noqa: BLE001
                # The waiter's event loop is gone: it will never take the
                # slot, so it goes to the next one.
                permit._state = _RELEASED  # noqa: SLF001
                self._holders.discard(ref)

    def reset(self) -> None:
        """
        Zero the counts (for `resilient.testing.reset_registries`), keeping
        the slots that are held and the callers that queue: a reset never
        lets more than ``max_concurrent`` calls in, old holders included.
        """
        with self._lock:
            self._sweep()
            self.acquired = len(self._holders)
            self.rejected = 0
            self.timed_out = 0
            self.cancelled = 0

    def is_idle(self) -> bool:
        """No slot held and nobody waiting, and no work seen."""
        return self.acquired == 0 and not self._waiters

    def statistics(self) -> BulkheadStatistics:
        """A consistent snapshot of the counts."""
        with self._lock:
            self._sweep()
            return BulkheadStatistics(
                name=self.name,
                max_concurrent=self._limit,
                max_waiting=self._max_waiting,
                in_use=len(self._holders),
                waiting=len(self._waiters),
                acquired=self.acquired,
                released=self.acquired - len(self._holders),
                rejected=self.rejected,
                timed_out=self.timed_out,
                cancelled=self.cancelled,
            )


def _class_exit(bulkhead: Bulkhead, *_exc: object) -> None:
    """``Bulkhead.__exit__`` called on the class (`contextlib.ExitStack`)."""
    permit = _entered.pop(bulkhead)
    if permit is None:
        raise RuntimeError(
            f"bulkhead {bulkhead.name!r} exited more often than entered "
            "in this thread or task"
        )
    bulkhead._machine.release(permit)  # noqa: SLF001


def _exit_of(permit: BulkheadPermit) -> Callable[..., None]:
    return permit._exit_block  # noqa: SLF001


def _aexit_of(permit: BulkheadPermit) -> Callable[..., Awaitable[None]]:
    return permit._aexit_block  # noqa: SLF001


async def _class_aexit(bulkhead: Bulkhead, *_exc: object) -> None:
    """``Bulkhead.__aexit__`` called on the class (`AsyncExitStack`)."""
    _class_exit(bulkhead)


Permit = BulkheadPermit
"""The short name the pipeline uses inside the package."""

_new_permit: Final = object.__new__
"""Makes a permit without calling its ``__init__`` (a Python frame): the
machine sets its two fields itself (`BulkheadMachine.take_new`)."""
