"""Calls a stage refused without running them: an open breaker, a full
bulkhead."""

from __future__ import annotations

import copy
import pickle
from typing import Any, Self, final

from resilient._errors._base import ResilientError, _rebuild


class Rejected(ResilientError):
    """
    A stage refused a call without running it (an open breaker, a full
    bulkhead): nothing reached the dependency.

    Retry outwaits a rejection that says when to come back: it waits
    *retry_after* (spread by its jitter) and tries again, and gives up at
    once when that is past the deadline. A rejection is not an attempt, but
    a call tolerates at most as many of them as it has attempts.

    Attributes:
        retry_after: Seconds until the stage may admit the call (`math.inf`
            when only a reset will); None when the stage cannot tell, and
            retry then treats the rejection as any other error (its
            *retry_on* decides).

    .. versionadded:: 26.12.0
    """

    retry_after: float | None = None


@final
class BulkheadFull(Rejected):
    """
    A bulkhead refused a call: every slot was taken and the caller could
    not wait for one.

    Not a failure of the dependency: a circuit breaker does not count it.
    Its *retry_after* is None: the bulkhead already waited as long as it
    was configured to, so retry does not wait again unless its *retry_on*
    says so.

    Attributes:
        name: The bulkhead's name.
        reason: ``"full"`` (no waiting allowed), ``"queue_full"`` (too many
            callers already waiting), ``"timeout"`` (waited the maximum wait)
            or ``"deadline"`` (the enclosing deadline ended the wait).
        max_concurrent: The bulkhead's number of slots.
        waited: Seconds the caller waited before being refused.
    """

    def __init__(
        self, name: str, reason: str, max_concurrent: int, waited: float
    ) -> None:
        self.name = name
        self.reason = reason
        self.max_concurrent = max_concurrent
        self.waited = waited
        super().__init__(
            f"bulkhead {name!r} is full ({max_concurrent} calls in flight; "
            f"{reason}, waited {waited:.3f} s)"
        )


class CircuitOpen(Rejected):
    """
    A circuit breaker rejected a call without running it.

    Attributes:
        name: The breaker's name (the dependency).
        retry_after: Seconds until the breaker admits a probe; `math.inf`
            when it was forced open (until someone resets it).
        state: The breaker's state: ``"open"``, ``"half_open"`` (all probe
            slots taken) or ``"forced_open"``.
        opened_by: The exception of the call that opened the breaker, as a
            copy without its traceback (so that an open breaker keeps no
            frames alive); None when no exception opened it (slow calls, a
            stuck probe, `CircuitBreaker.force_open`), and in a pickle when
            it does not survive pickling. Copies of the rejection share
            it.

    .. versionchanged:: 26.12.0
       *opened_by*.
    """

    # The attributes live in ``args``: a breaker makes its rejections with
    # ``CircuitOpen.__new__`` alone (``BaseException.__new__`` sets
    # ``args``), so that a rejection, a hot path mostly caught unseen,
    # costs what any exception costs. The message is built in __str__.
    def __init__(
        self,
        name: str,
        retry_after: float,
        state: str = "open",
        opened_by: BaseException | None = None,
    ) -> None:
        self.args = (name, retry_after, state, opened_by)

    @property
    def name(self) -> str:
        """The breaker's name."""
        return self.args[0]  # type: ignore[no-any-return]

    @property
    def retry_after(self) -> float:  # type: ignore[override]
        """Seconds until the breaker admits a probe."""
        return self.args[1]  # type: ignore[no-any-return]

    @property
    def state(self) -> str:
        """The breaker's state when it rejected the call."""
        args = self.args
        return args[2] if len(args) > 2 else "open"

    @property
    def opened_by(self) -> BaseException | None:
        """The exception that opened the breaker, without its traceback."""
        args = self.args
        return args[3] if len(args) > 3 else None

    def __reduce__(self) -> tuple[Any, ...]:
        args = self.args
        if len(args) > 3 and args[3] is not None:
            try:
                pickle.loads(pickle.dumps(args[3]))  # noqa: S301
            except Exception:  # noqa: BLE001 - any failure to round-trip
                args = (*args[:3], None)
        return (_rebuild, (type(self), args, self._state()))

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        # The failure is a record, shared by copies: many exceptions do not
        # copy (keyword-only arguments), and nothing should change it.
        new = _rebuild(type(self), self.args, {})
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __str__(self) -> str:
        when = (
            "until it is reset"
            if self.retry_after == float("inf")
            else f"next probe in {self.retry_after:.3f} s"
        )
        state = self.state.replace("_", "-")
        return f"circuit breaker {self.name!r} is {state}; {when}"
