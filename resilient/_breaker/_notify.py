"""
How a breaker reports its state changes, outside its lock.

`drain` takes the machine's transitions under the lock; `deliver` (one
body for both colours) records them in telemetry and calls the listeners,
`notify` from sync code and `anotify` from async code, which awaits async
listeners; `sync_pin` keeps the registry holding a breaker that is not
closed. All are `CircuitBreaker`'s methods (``_notify = notify``), bound in
its class body: a call to one costs what a method's call costs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from resilient._breaker._records import _CLOSED
from resilient._breaker._report import report_transition


if TYPE_CHECKING:
    from collections.abc import Awaitable, Iterator

    from resilient._breaker._breaker import CircuitBreaker
    from resilient._breaker._records import BreakerTransition


log: Final = logging.getLogger("resilient")


def drain(self: CircuitBreaker) -> list[BreakerTransition]:
    m = self._m
    events, m.outbox = m.outbox, []
    return events


def deliver(
    self: CircuitBreaker, events: list[BreakerTransition], *, awaiting: bool
) -> Iterator[Awaitable[object]]:
    """
    Report *events* and call the sync listeners; yield the async
    listeners' awaitables when the caller can await them (else skip
    them).
    """
    self._sync_pin()
    for event in events:
        report_transition(event)
        for listener, is_async in self._listeners:
            if is_async and not awaiting:
                log.debug(
                    "resilient: async listener %r skipped: breaker %r "
                    "changed state in sync code",
                    listener,
                    self.name,
                )
                continue
            try:
                result = listener(event)
            except Exception:
                log.exception("resilient: listener %r raised", listener)
                continue
            if is_async:
                yield result  # type: ignore[misc]


def notify(self: CircuitBreaker, events: list[BreakerTransition]) -> None:
    for _ in self._deliver(events, awaiting=False):
        pass  # pragma: no cover - nothing is yielded when not awaiting


async def anotify(
    self: CircuitBreaker, events: list[BreakerTransition]
) -> None:
    for pending in self._deliver(events, awaiting=True):
        try:
            await pending
        except Exception:
            log.exception("resilient: listener %r raised", pending)


def sync_pin(self: CircuitBreaker) -> None:
    """
    Keep the registry holding this breaker while it is not closed, and
    let go once it is; read again if the state moved meanwhile.
    """
    from resilient._breaker._registry import REGISTRY  # noqa: PLC0415

    while True:
        m = self._m
        epoch = m.epoch
        busy = m.state is not _CLOSED
        if busy:
            REGISTRY.pin(self.name, self)
        else:
            REGISTRY.unpin(self.name, self)
        self._pinned = busy
        if self._m is m and m.epoch == epoch:
            return
