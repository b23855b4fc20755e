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
"""

from __future__ import annotations

import _thread
import logging
import math
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final, final

from resilient._backends import Renewal
from resilient._core import _clock
from resilient.exceptions import LockBackendError


if TYPE_CHECKING:
    from collections.abc import Sequence

    from resilient._backends import AsyncLockBackend, LockBackend
    from resilient._lock._machine import LeaseRecord


log: Final = logging.getLogger("resilient")

#: On a clock other than the real one (a test's `FakeClock`), time moves
#: without telling anyone: the worker looks again this often (real seconds).
FAKE_CLOCK_POLL: Final = 0.005

#: Real seconds an idle renewer thread waits for a new lease before ending.
IDLE: Final = 1.0

#: On a clock other than the real one, how often (real seconds) the
#: watchdog looks; slower than the worker, whose turns it would delay.
WATCHDOG_FAKE_POLL: Final = 0.025

#: A lease due within this share of its renewal interval is renewed with
#: the round that is going anyway, so leases batch up.
EARLY: Final = 0.1


@final
class Renewals:
    """
    The leases one worker renews, and what a round does with them.

    Adding and removing a lease are single dict operations (atomic), with
    no lock and no wake-up unless the worker would look too late for the
    new lease: a short hold costs the renewer nothing until its first
    renewal would be due. The worker reads the dict by copying it (one
    atomic operation), under `cond` only where it decides to sleep.
    """

    __slots__ = ("_leases", "cond", "planned")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self._leases: dict[int, LeaseRecord] = {}
        self.planned = -math.inf
        """When the worker plans to look next (-inf: it is busy now)."""

    def add(self, record: LeaseRecord) -> bool:
        """
        Start renewing *record*; whether the worker must be woken for it
        (it plans to look later than the lease's first renewal).
        """
        self._leases[id(record)] = record
        # `planned` is read after the insert: if it is a sleeping worker's,
        # that worker reads the dict when it wakes, in time for the lease
        # unless it is due earlier; if the worker is busy (-inf), it may
        # be about to choose when to sleep without the lease: wake it.
        planned = self.planned
        return planned == -math.inf or record.due < planned

    def remove(self, record: LeaseRecord) -> None:
        """Stop renewing *record* (released or lost); the worker finds out."""
        self._leases.pop(id(record), None)

    def __len__(self) -> int:
        return len(self._leases)

    def held(self) -> list[LeaseRecord]:
        """The leases renewed now."""
        return list(self._leases.values())

    def due(self, now: float) -> list[LeaseRecord]:
        """
        The leases to renew now; leases found past their validity are
        marked lost and dropped.
        """
        due = []
        for record in self.held():
            if not record.check(now):
                self.remove(record)
            elif record.due <= now + EARLY * record.config.every:
                due.append(record)
        return due

    def settle(
        self,
        batch: Sequence[LeaseRecord],
        sent: float,
        results: Sequence[bool] | BaseException | None,
    ) -> None:
        """
        Apply a batch's answers: None (or an error) when the backend did not
        answer. An error the store says retrying cannot cure (a refused
        login or permission: `LockBackendError` with ``retryable`` False)
        loses every lease of the batch at once (``"refused"``) instead of
        retrying it until the validity runs out.
        """
        if isinstance(results, BaseException):
            error = results
            if not (
                isinstance(error, LockBackendError) and not error.retryable
            ):
                results = None
            else:
                log.warning(
                    "lock renewal refused by the store, %d lease(s) lost: %s",
                    len(batch),
                    error,
                )
                for record in batch:
                    record.lose("refused", error)
                    self.remove(record)
                return
        if results is not None and len(results) != len(batch):
            log.warning(
                "lock backend answered %d renewals for %d",
                len(results),
                len(batch),
            )
            results = None
        now = _clock.get_clock().now()
        for i, record in enumerate(batch):
            if results is None:
                record.renew_failed(now)
            elif results[i]:
                record.renewed(sent, record.config.ttl)
            else:
                record.lose("gone")
            if not record.active:
                self.remove(record)

    def next_wake(self) -> float:
        """When the worker must next look, on resilient's clock."""
        return min((r.wake_at() for r in self.held()), default=math.inf)

    def reset_after_fork(self) -> None:
        """In a forked child: none of these leases is ours."""
        self.cond = threading.Condition(threading.Lock())
        self.planned = -math.inf
        for record in self.held():
            record.forked()
        self._leases.clear()


def batches(
    records: Sequence[LeaseRecord], size: int
) -> list[Sequence[LeaseRecord]]:
    """*records* cut into pieces of at most *size* (at least 1)."""
    size = max(size, 1)
    return [records[i : i + size] for i in range(0, len(records), size)]


def _requests(batch: Sequence[LeaseRecord]) -> list[Renewal]:
    return [Renewal(r.key, r.owner, r.config.ttl) for r in batch]


def _wait_for(wake: float) -> float:
    """Real seconds to sleep until *wake* on resilient's clock."""
    clock = _clock.get_clock()
    left = wake - clock.now()
    if clock is not _clock.DEFAULT_CLOCK:
        left = min(left, FAKE_CLOCK_POLL)
    return min(max(left, 0.0), 3600.0)


@final
class ThreadRenewer:
    """
    Renews every lease of one sync backend from one daemon thread.

    Its watchdog (a second thread, alive while the worker is) declares
    leases lost on the local monotonic clock while a renewal call hangs:
    the worker calls the backend inline, and if the call has not returned
    when a lease's validity runs out, the watchdog, asleep until then,
    marks that lease lost (which cancels its block) without waiting for
    the call or for the backend's own per-call limit.
    """

    __slots__ = (
        "__weakref__",
        "_dog",
        "_dog_until",
        "_watching",
        "backend",
        "renewals",
        "thread",
    )

    def __init__(self, backend: LockBackend) -> None:
        self.backend = backend
        self.renewals = Renewals()
        self.thread: threading.Thread | None = None
        self._dog = threading.Condition(threading.Lock())
        self._dog_until = -math.inf
        """When the watchdog looks next (-inf: it is not watching)."""
        self._watching = False
        _ALL.add(self)

    def add(self, record: LeaseRecord) -> None:
        """Renew *record* until it is removed, released or lost."""
        renewals = self.renewals
        if renewals.add(record) or self.thread is None:
            with renewals.cond:
                if self.thread is None:
                    self.thread = threading.Thread(
                        target=self._run,
                        name=f"resilient-lock-renewer-{self.backend.scheme}",
                        daemon=True,
                    )
                    self.thread.start()
                else:
                    renewals.cond.notify()

    def remove(self, record: LeaseRecord) -> None:
        """Stop renewing *record*."""
        self.renewals.remove(record)

    def round(self) -> None:
        """One round: renew what is due (the thread runs this in a loop)."""
        clock = _clock.get_clock()
        due = self.renewals.due(clock.now())
        for batch in batches(due, self.backend.max_renew_batch):
            sent = clock.now()
            self.renewals.settle(batch, sent, self._renew(batch))

    def _renew(
        self, batch: Sequence[LeaseRecord]
    ) -> Sequence[bool] | Exception:
        """The backend's answers for *batch*, or its error (no answer)."""
        if min(r.valid_until for r in batch) < self._dog_until:
            # A lease the watchdog has not seen yet (its plan is later):
            # tell it before the call. Otherwise it plans to look in time
            # already, and waking it would only take the GIL from us.
            with self._dog:
                self._watch_soon()
                self._dog.notify()
        try:
            return self.backend.renew(_requests(batch))
        except Exception as exc:  # noqa: BLE001 - no answer, retried
            log.debug("lock renewal got no answer: %s", type(exc).__name__)
            return exc

    def _watch_soon(self) -> None:
        """
        Start the watchdog unless it runs; the caller holds `_dog`. A bare
        thread (`_thread`), which starting does not wait for: a loaded
        machine can take many milliseconds to schedule a new thread, and
        the worker must not lose them (a daemon: nothing joins it).
        """
        if not self._watching:
            self._watching = True
            _thread.start_new_thread(self._watch_thread, ())

    def _watch_thread(self) -> None:  # pragma: no cover - untraced
        """
        The watchdog's thread: traced and profiled as `threading`'s are
        (its own lines run before it sets the tracer).
        """
        trace, profile = threading.gettrace(), threading.getprofile()
        if trace is not None:
            sys.settrace(trace)
        if profile is not None:
            sys.setprofile(profile)
        self._watch()

    def _watch(self) -> None:
        """
        The watchdog: sleep until the earliest validity of the held
        leases, then mark those past it lost. The worker does the same when
        it wakes; the watchdog is what still does it while the worker is
        stuck in a renewal call.
        """
        dog = self._dog
        with dog:
            while self.thread is not None:
                clock = _clock.get_clock()
                now = clock.now()
                until = math.inf
                for record in self.renewals.held():
                    try:
                        if record.check(now):  # Marks it lost once past.
                            until = min(until, record.valid_until)
                    except Exception:  # pragma: no cover - a loss callback
                        log.exception("lock watchdog: a loss callback raised")
                self._dog_until = until
                if clock is _clock.DEFAULT_CLOCK:
                    dog.wait(min(max(until - now, 0.0), 3600.0))
                else:  # Virtual time moves without telling anyone.
                    dog.wait(WATCHDOG_FAKE_POLL)
            self._dog_until = -math.inf
            self._watching = False

    def _run(self) -> None:
        renewals = self.renewals
        with self._dog:
            # Started with the worker, long before the first renewal: not
            # by it, which would then wait for a thread to start.
            self._watch_soon()
        while True:
            self.round()
            clock = _clock.get_clock()
            with renewals.cond:
                if not len(renewals):
                    # Linger a little: a loop of short holds should not
                    # start a thread per hold.
                    renewals.planned = clock.now() + IDLE
                    renewals.cond.wait(IDLE)
                    renewals.planned = -math.inf
                    if not len(renewals):
                        self.thread = None
                        with self._dog:  # Its watchdog ends too.
                            self._dog.notify()
                        return
                    continue
                wake = renewals.next_wake()
                renewals.planned = wake
                renewals.cond.wait(_wait_for(wake))
                renewals.planned = -math.inf

    def reset_after_fork(self) -> None:
        """In a forked child: no thread, no leases."""
        self.thread = None
        self._dog = threading.Condition(threading.Lock())
        self._dog_until = -math.inf
        self._watching = False
        self.renewals.reset_after_fork()


@final
class TaskRenewer:
    """
    Renews every lease of one async backend from one task in its event
    loop (asyncio or trio), started with the first lease.
    """

    __slots__ = (
        "__weakref__",
        "_library",
        "_task",
        "_wake",
        "backend",
        "renewals",
        "running",
    )

    def __init__(self, backend: AsyncLockBackend, library: str) -> None:
        self.backend = backend
        self.renewals = Renewals()
        self.running = False
        self._library = library
        self._task: Any = None
        self._wake: Any = None
        _ALL.add(self)

    def add(self, record: LeaseRecord) -> None:
        """Renew *record*; call from a task of the backend's event loop."""
        if self.renewals.add(record) and self._wake is not None:
            self._wake.set()
        if not self.running:
            self.running = True
            if self._library == "trio":
                import trio  # noqa: PLC0415

                trio.lowlevel.spawn_system_task(self._run)
            else:
                import asyncio  # noqa: PLC0415

                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name="resilient-lock-renewer"
                )

    def remove(self, record: LeaseRecord) -> None:
        """Stop renewing *record*."""
        self.renewals.remove(record)

    async def round(self) -> None:
        """One round: renew what is due, each batch within its validity."""
        import anyio  # noqa: PLC0415

        clock = _clock.get_clock()
        due = self.renewals.due(clock.now())
        for batch in batches(due, self.backend.max_renew_batch):
            sent = clock.now()
            limit = min(r.valid_until for r in batch) - sent
            results: Sequence[bool] | Exception | None = None
            try:
                with anyio.move_on_after(max(limit, 0.0)):
                    results = await self.backend.renew(_requests(batch))
            except Exception as exc:  # noqa: BLE001 - no answer, retried
                log.debug("lock renewal got no answer: %s", type(exc).__name__)
                results = exc
            self.renewals.settle(batch, sent, results)

    async def _run(self) -> None:
        import anyio  # noqa: PLC0415

        try:
            while len(self.renewals):
                await self.round()
                if not len(self.renewals):
                    break
                self._wake = anyio.Event()
                wake = self.renewals.planned = self.renewals.next_wake()
                with anyio.move_on_after(_wait_for(wake)):
                    await self._wake.wait()
                self.renewals.planned = -math.inf
                self._wake = None
        finally:
            self.running = False
            self._task = None
            self._wake = None

    def reset_after_fork(self) -> None:
        """In a forked child: no task, no leases."""
        self.running = False
        self._task = None
        self._wake = None
        self.renewals.reset_after_fork()


_ALL: Final[weakref.WeakSet[ThreadRenewer | TaskRenewer]] = weakref.WeakSet()
_THREADS: dict[int, ThreadRenewer] = {}
_TASKS: dict[int, TaskRenewer] = {}
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
