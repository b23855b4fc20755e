"""
One acquisition, as both shells run it: the steps that do no I/O.

The sync shell (`resilient._lock._sync`) and the async one
(`resilient._lock._async`) each loop over the same `Attempt`: send the
acquire, hand the answer (or the error) to the attempt, and carry out what
it decides (a lease, a wait, or `LockNotAcquired`). Only sending, waiting
and compensating differ between them.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Final, final

from resilient._backends import Busy, Grant, OwnerToken
from resilient._core import _clock
from resilient._lock._lease import (
    Lease,
    claim,
    end_span,
    log,
    loss_callback,
    start_span,
)
from resilient._lock._machine import (
    Acquisition,
    GiveUp,
    LeaseRecord,
    Wait,
    valid_until,
)
from resilient.exceptions import LockBackendError, LockNotAcquired


if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.trace import Span

    from resilient._backends import AsyncLockBackend, LockBackend
    from resilient._lock._config import LockConfig
    from resilient._lock._lock import Lock
    from resilient._lock._renewer import TaskRenewer, ThreadRenewer


_RNG: Final = random.Random()

#: Seconds between two log records of a store that keeps failing while a
#: caller waits (the first failure is logged at once).
FAILING_LOG_EVERY: Final = 5.0


@final
class Attempt:
    """
    The state of one acquisition, from the first try to a lease or giving
    up: the lock, its backend and renewer, our owner token, the wait's
    machine and what the last try answered.
    """

    __slots__ = (
        "_acq",
        "backend",
        "busy",
        "clock",
        "config",
        "deadline",
        "error",
        "holder",
        "library",
        "lock",
        "logged",
        "owner",
        "renewer",
        "sent_any",
        "span",
        "start",
        "stop",
    )

    def __init__(  # noqa: PLR0917
        self,
        lock: Lock,
        config: LockConfig,
        holder: object,
        library: str | None,
        backend: LockBackend | AsyncLockBackend,
        renewer: ThreadRenewer | TaskRenewer,
    ) -> None:
        claim(lock, holder)
        clock = self.clock = _clock.get_clock()
        self.lock = lock
        self.config = config
        self.holder = holder
        self.library = library
        self.backend = backend
        self.renewer = renewer
        self.span: Span | None = start_span(lock.key, backend.scheme)
        self.owner = OwnerToken()
        self.start = clock.now()
        self.deadline = _clock.current_deadline()
        self._acq: Acquisition | None = None  # Made for the first wait.
        self.busy: Busy | None = None
        self.error: BaseException | None = None
        self.sent_any = False
        self.logged = -math.inf
        """When a failing store was last logged (`failed`)."""
        self.stop: Callable[[], None] | None = None
        """Stops the backend's wake-up watch, once one was started."""

    def take(
        self, sent: float, grant: Grant, out: list[Lease]
    ) -> Lease | None:
        """
        The lease of a grant for a request sent at *sent*, appended to *out*
        and then started (renewed, recorded as held); None if it came back
        too late to be worth having (the shell gives it back).
        """
        config = self.config
        now = self.clock.now()
        until = valid_until(config, sent, grant.ttl)
        if now >= until:
            return None
        record = LeaseRecord(
            self.lock.key, self.owner, grant.fence, config, until, sent
        )
        lease = Lease(
            self.lock,
            record,
            self.backend,
            self.renewer,
            self.span,
            self.holder,
            now - self.start,
            self.library,
        )
        # Nobody else sees the record yet (the renewer gets it below).
        record._on_lost = loss_callback(lease)  # noqa: SLF001
        out.append(lease)
        lease._start()  # noqa: SLF001
        return lease

    @property
    def acq(self) -> Acquisition:
        """The wait's machine, made when the first try did not grant."""
        acq = self._acq
        if acq is None:
            acq = self._acq = Acquisition(
                self.config, self.start, self.deadline, _RNG
            )
        return acq

    def held(self, answer: Busy) -> Wait | GiveUp:
        """The lock is held (or the grant came too late): what next."""
        self.error = None
        self.busy = answer
        first = self._acq is None
        step = self.acq.busy(self.clock.now(), answer)
        if first and isinstance(step, Wait):
            log.debug(
                "lock %r is held; waiting for it (up to %s)",
                self.lock.key.shown,
                _left(self.acq.deadline - self.start),
            )
        return step

    def failed(self, exc: Exception) -> Wait | GiveUp:
        """
        The store did not answer: what next. A store's error that is not
        retryable (a key of another type, a refused login or privilege) is
        raised at once: it is a configuration error, not a busy lock, and
        waiting it out would only hide it.
        """
        if isinstance(exc, LockBackendError) and not exc.retryable:
            raise exc
        self.error = exc
        now = self.clock.now()
        if now >= self.logged + FAILING_LOG_EVERY:
            # Never silent, never a flood: once, then every few seconds.
            self.logged = now
            log.warning(
                "lock %r: the %s store failed (%s), still trying (waited "
                "%.1f s)",
                self.lock.key.shown,
                self.backend.scheme,
                # A backend error's text hides secrets; others: the type.
                exc
                if isinstance(exc, LockBackendError)
                else type(exc).__name__,
                now - self.start,
            )
        return self.acq.failed(now)

    def refused(self, step: GiveUp) -> LockNotAcquired:
        """The error to raise when the wait gives up."""
        busy, error = self.busy, self.error
        waited = self.clock.now() - self.start
        after = None
        if error is None and busy is not None and busy.expires_in is not None:
            after = max(busy.expires_in, 0.0)
        end_span(self.span, step.reason, error=True)
        exc = LockNotAcquired(self.lock.key.shown, step.reason, waited, after)
        exc.__cause__ = error
        return exc

    def compensates(self, exc: BaseException) -> bool:
        """
        Whether an exception that ends the acquisition before a lease was
        made must be followed by a compare-and-delete (a request left, and
        the store may have granted it); ends the span if so.
        """
        if not self.sent_any or isinstance(exc, LockNotAcquired):
            return False
        why = "error" if isinstance(exc, LockBackendError) else "interrupted"
        end_span(self.span, why, error=True)
        return True


def _left(seconds: float) -> str:
    return "no limit" if seconds == math.inf else f"{seconds:.3f} s"


__all__ = ["Attempt", "GiveUp", "Grant", "Wait"]
