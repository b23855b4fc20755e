"""
The lease machine: when to try again, when to renew, when a lease is lost.

Pure: it is given the time and the backend's answers and returns
decisions; it never sleeps, awaits or does I/O. The shells in
`resilient._lock._lock` and the renewer in `resilient._lock._renewer` carry
the decisions out.

Validity is counted on the holder's monotonic clock from *before* the
request that acquired or renewed the lease was sent, minus the drift
margin: a reply that comes late cannot stretch it, so the holder counts its
lease lost before the store could grant the lock to anyone else.
"""

from __future__ import annotations

import enum
import math
import threading
from typing import TYPE_CHECKING, Final, final

import attrs

from resilient._backends._base import QUEUED_LOOK


if TYPE_CHECKING:
    import random
    from collections.abc import Callable

    from resilient._backends import Busy, Grant, LockKey, OwnerToken
    from resilient._lock._config import LockConfig


#: The shortest sleep between renewal retries after a failed round.
MIN_RETRY: Final = 0.001


@final
@attrs.frozen
class Wait:
    """Sleep up to *seconds* (or until woken), then try again."""

    seconds: float


@final
@attrs.frozen
class GiveUp:
    """
    Stop waiting: *reason* is ``"busy"`` (held, and no wait allowed),
    ``"timeout"`` (the lock's own wait ran out), ``"deadline"`` (the
    enclosing deadline) or ``"unavailable"`` (the store did not answer).
    """

    reason: str


@final
class Acquisition:
    """
    One attempt to get a lock, from the first try to a grant or giving up.

    Args:
        config: The lock's configuration.
        start: When the acquisition began, on resilient's clock.
        deadline: The enclosing deadline (absolute, `math.inf` if none).
        rng: Jitter for the waits.
    """

    __slots__ = ("_config", "_rng", "deadline", "errors", "start", "tries")

    def __init__(
        self,
        config: LockConfig,
        start: float,
        deadline: float,
        rng: random.Random,
    ) -> None:
        self._config = config
        self._rng = rng
        self.start = start
        own = start + config.wait
        self.deadline = min(own, deadline)
        """When waiting must stop, on resilient's clock."""
        self.tries = 0
        self.errors = 0

    def _limit(self) -> str:
        """Which limit ends the wait: the lock's own or the enclosing one."""
        if not self._config.blocking:
            return "busy"
        own = self.start + self._config.wait
        if own <= self.deadline:
            return "busy" if self._config.wait == 0 else "timeout"
        return "deadline"

    def granted(self, sent: float, now: float, grant: Grant) -> bool:
        """
        Whether a grant that left at *sent* and came back at *now* is still
        worth having: False when it arrived past its own validity (the
        shell then releases it and tries again within the deadline).
        """
        return now < valid_until(self._config, sent, grant.ttl)

    def busy(self, now: float, busy: Busy) -> Wait | GiveUp:
        """The lock is held: how long to wait before the next try."""
        self.tries += 1
        left = self.deadline - now
        if left <= 0:
            return GiveUp(self._limit())
        delay = self._config.backoff.delay(self.tries - 1, 0.0, self._rng)
        if busy.queued:
            # Behind others of this process: woken when at the head.
            delay = QUEUED_LOOK
        elif busy.expires_in is not None:
            # No point sleeping past the holder's expiry: try right after.
            delay = min(delay, max(busy.expires_in, 0.0) + 0.0005)
        return Wait(max(min(delay, left), 0.0))

    def failed(self, now: float) -> Wait | GiveUp:
        """The store did not answer: retry within the deadline."""
        self.errors += 1
        left = self.deadline - now
        if left <= 0:
            return GiveUp("unavailable")
        delay = self._config.backoff.delay(self.errors - 1, 0.0, self._rng)
        return Wait(max(min(delay, left), 0.0))


def valid_until(config: LockConfig, sent: float, granted_ttl: float) -> float:
    """The end of a lease's validity for a request sent at *sent*."""
    return sent + min(config.ttl, granted_ttl) - config.margin


class LeaseState(enum.Enum):
    """Where a held lease is."""

    HELD = "held"
    LOST = "lost"
    RELEASED = "released"


@final
class LeaseRecord:
    """
    A lease this process holds, as the renewer and the holder see it.

    Its fields change under a short lock, because the renewer thread, the
    holder and ``cancel()``-ing code touch them from different threads.

    Attributes:
        key: The lock's key.
        owner: Our owner token (a secret: never shown).
        fence: The fencing token of the grant.
        config: The lock's configuration.
        valid_until: When the lease stops being ours on our clock, unless
            renewed.
        due: When the next renewal should be sent.
        state: Held, lost or released.
        reason: Why it was lost (``"gone"``, ``"expired"``, ``"refused"``),
            or None.
        error: The store's error that refused a renewal (``"refused"``),
            or None.
    """

    __slots__ = (
        "_lock",
        "_on_lost",
        "config",
        "due",
        "error",
        "failures",
        "fence",
        "key",
        "owner",
        "reason",
        "state",
        "valid_until",
    )

    def __init__(  # noqa: PLR0917
        self,
        key: LockKey,
        owner: OwnerToken,
        fence: int,
        config: LockConfig,
        valid_until: float,
        sent: float,
    ) -> None:
        self._lock = threading.Lock()
        self.key = key
        self.owner = owner
        self.fence = fence
        self.config = config
        self.valid_until = valid_until
        self.due = sent + config.every
        self.state = LeaseState.HELD
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.failures = 0
        self._on_lost: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return (
            f"<LeaseRecord {self.key.shown!r} fence={self.fence} "
            f"{self.state.value}>"
        )

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call *callback* (once, from any thread) when the lease is lost."""
        with self._lock:
            self._on_lost = callback
            lost = self.state is LeaseState.LOST
        if lost:
            callback()

    def check(self, now: float) -> bool:
        """Whether the lease is still held at *now*; marks it lost if not."""
        if self.state is LeaseState.HELD and now >= self.valid_until:
            self.lose("expired")
        return self.state is LeaseState.HELD

    def lose(self, reason: str, error: BaseException | None = None) -> None:
        """
        Mark the lease lost and tell the holder, once; *error* is the
        store's answer that ended it, if one did (``"refused"``).
        """
        with self._lock:
            if self.state is not LeaseState.HELD:
                return
            self.state = LeaseState.LOST
            self.reason = reason
            self.error = error
            callback = self._on_lost
        if callback is not None:
            callback()

    def forked(self) -> None:
        """
        In a forked child: the lease is the parent's. Marked lost without
        telling anyone (locks held by other threads at the fork may never
        be released in the child), and its release sends nothing.
        """
        self._lock = threading.Lock()
        self.state = LeaseState.LOST
        self.reason = "forked"
        self._on_lost = None

    def renewed(self, sent: float, granted_ttl: float) -> None:
        """A renewal sent at *sent* succeeded."""
        with self._lock:
            if self.state is not LeaseState.HELD:
                return
            self.valid_until = max(
                self.valid_until, valid_until(self.config, sent, granted_ttl)
            )
            self.due = sent + self.config.every
            self.failures = 0

    def renew_failed(self, now: float) -> None:
        """
        A renewal got no answer: retry soon, within the validity (a
        quarter of the renewal interval, then halving, never below 1 ms).
        """
        with self._lock:
            self.failures += 1
            step = self.config.every / (4 * 2 ** min(self.failures - 1, 30))
            self.due = now + max(step, MIN_RETRY)
        self.check(now)

    def released(self) -> bool:
        """Mark the lease released; whether it was still held (not lost)."""
        with self._lock:
            held = self.state is LeaseState.HELD
            self.state = LeaseState.RELEASED
            self._on_lost = None
        return held

    def gone_at_release(self) -> bool:
        """
        Our release found the lease no longer ours on the store (it answered
        NOT_HELD): it was lost while we believed we held it. Marks it lost
        (``"gone"``) and returns True, unless it was lost before or is a
        forked child's copy (False: nothing new).
        """
        with self._lock:
            if self.reason is not None:
                return False
            self.state = LeaseState.LOST
            self.reason = "gone"
        return True

    def wake_at(self) -> float:
        """When the renewer must next look at this lease."""
        return min(self.due, self.valid_until) if self.active else math.inf

    @property
    def active(self) -> bool:
        """Whether the renewer still has work for this lease."""
        return self.state is LeaseState.HELD
