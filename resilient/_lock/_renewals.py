"""
The renewal schedule both renewer drivers share (`Renewals`): the leases
one worker renews, which are due, how a batch's answers settle them, and
when the worker must look next; with the batching and sleeping helpers.

Pure bookkeeping over the leases' records: no thread, no task, no I/O (the
drivers, `._renew_thread` and `._renew_task`, call the backend).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from typing import TYPE_CHECKING, Final, final

from resilient._backends import Renewal
from resilient._core import _clock
from resilient.exceptions import LockBackendError


if TYPE_CHECKING:
    from collections.abc import Sequence

    from resilient._lock._machine import LeaseRecord
    from resilient._lock._renew_task import TaskRenewer
    from resilient._lock._renew_thread import ThreadRenewer


log: Final = logging.getLogger("resilient")

#: On a clock other than the real one (a test's `FakeClock`), time moves
#: without telling anyone: the worker looks again this often (real seconds).
FAKE_CLOCK_POLL: Final = 0.005

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


def requests(batch: Sequence[LeaseRecord]) -> list[Renewal]:
    return [Renewal(r.key, r.owner, r.config.ttl) for r in batch]


def wait_for(wake: float) -> float:
    """Real seconds to sleep until *wake* on resilient's clock."""
    clock = _clock.get_clock()
    left = wake - clock.now()
    if clock is not _clock.DEFAULT_CLOCK:
        left = min(left, FAKE_CLOCK_POLL)
    return min(max(left, 0.0), 3600.0)


ALL: Final[weakref.WeakSet[ThreadRenewer | TaskRenewer]] = weakref.WeakSet()
"""Every renewer made, for the fork hook (`._renewer`)."""
