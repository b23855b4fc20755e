"""
Which scope fired, and what leaving one does with its block's exception.

`_fired` walks out from a scope to the one that owns a cancellation (the
outermost cancelled or expired one, or a deadline set between scopes);
`claims` tells whether an exception is the scope's own cancellation or
deadline, and `outcome` what leaving does with it: swallow it, raise
`TimedOut`, pass an enclosing deadline on, or raise the reason the scope
was cancelled with.

The functions but `_fired` are `TimeoutScope`'s methods, bound in its
class body (``_claims = claims``, ``_outcome = outcome``): a call to one
costs what a method's call costs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from resilient.exceptions import DeadlineExceeded, ScopeCancelled, TimedOut


if TYPE_CHECKING:
    from resilient._timeout._scope import TimeoutScope


def _fired(scope: TimeoutScope, now: float) -> TimeoutScope | float | None:
    """
    What fired, walking out from *scope*: the outermost scope that was
    cancelled or whose own deadline passed, or the absolute time of a
    deadline set between scopes (a plain `resilient.deadline()` or a retry
    attempt), or None.
    """
    found: TimeoutScope | float | None = None
    s: TimeoutScope | None = scope
    while s is not None:
        if s._cancel_called or now >= s._own:  # noqa: SLF001
            found = s
        parent = s._parent  # noqa: SLF001
        limit = parent.at if parent is not None else math.inf
        between = s._outer_at  # noqa: SLF001
        if between < limit and now >= between:
            found = between
        s = parent
    return found


def note_fired(self: TimeoutScope) -> None:
    """Record that the scope fired: on its deadline, unless cancelled."""
    if not self._cancel_called:
        self._timed_out = True


def claims(
    self: TimeoutScope, exc: BaseException | None, caught: bool
) -> bool:
    """Whether *exc* is this scope's own cancellation or deadline."""
    if caught:
        self._note_fired()
        return True
    if isinstance(exc, ScopeCancelled) and exc.scope is self:
        return True
    if (
        type(exc) is DeadlineExceeded
        and exc.deadline == self.at
        and self._own < self._outer_at
    ):
        # Our own deadline, seen by `checkpoint()` or a retry attempt.
        self._timed_out = True
        return True
    return False


def outcome(
    self: TimeoutScope, exc: BaseException | None, caught: bool
) -> bool:
    """What leaving does with *exc*: True swallows it, or raise."""
    reason = self._reason
    if not self._claims(exc, caught):
        if reason is not None and not self._timed_out:
            if exc is None:
                raise reason
            if exc is reason:
                self.cancelled_caught = True
        return False
    if self._timed_out:
        if self._own < self._outer_at:
            self.cancelled_caught = True
            raise TimedOut(self.at, self, self._allowed(), self._name) from exc
        # Our cancel scope fired at an enclosing deadline (a cooperative
        # one, or an enclosing scope's at the same instant): pass it on
        # as that deadline's, for the enclosing scope to claim.
        raise DeadlineExceeded(self._outer_at) from exc
    self.cancelled_caught = True
    if reason is not None:
        raise reason
    return True


def allowed(self: TimeoutScope) -> float:
    """The seconds the scope allowed from its entry."""
    seconds, _ = self._request
    return seconds if seconds is not None else self._own - self._entered_at
