"""
The renewer of a sync backend: one daemon thread renews every lease of
the backend, and a watchdog thread marks leases lost while a renewal call
hangs (`ThreadRenewer`).
"""

from __future__ import annotations

import _thread
import logging
import math
import sys
import threading
from typing import TYPE_CHECKING, Final, final

from resilient._core import _clock
from resilient._lock._renewals import (
    ALL,
    Renewals,
    batches,
    requests,
    wait_for,
)


if TYPE_CHECKING:
    from collections.abc import Sequence

    from resilient._backends import LockBackend
    from resilient._lock._machine import LeaseRecord


log: Final = logging.getLogger("resilient")


#: Real seconds an idle renewer thread waits for a new lease before ending.
IDLE: Final = 1.0

#: On a clock other than the real one, how often (real seconds) the
#: watchdog looks; slower than the worker, whose turns it would delay.
WATCHDOG_FAKE_POLL: Final = 0.025


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
        ALL.add(self)

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
            return self.backend.renew(requests(batch))
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
                renewals.cond.wait(wait_for(wake))
                renewals.planned = -math.inf

    def reset_after_fork(self) -> None:
        """In a forked child: no thread, no leases."""
        self.thread = None
        self._dog = threading.Condition(threading.Lock())
        self._dog_until = -math.inf
        self._watching = False
        self.renewals.reset_after_fork()
