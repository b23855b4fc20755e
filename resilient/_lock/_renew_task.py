"""
The renewer of an async backend: one task in the backend's event loop
(asyncio or trio) renews every lease of the backend, each call bounded by
the earliest validity of its batch (`TaskRenewer`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Final, final

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

    from resilient._backends import AsyncLockBackend
    from resilient._lock._machine import LeaseRecord


log: Final = logging.getLogger("resilient")


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
        ALL.add(self)

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
                    results = await self.backend.renew(requests(batch))
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
                with anyio.move_on_after(wait_for(wake)):
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
