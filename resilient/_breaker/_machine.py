"""
The breaker's pure machine: admission, settling and the snapshot.

`_BreakerMachine` decides (admit, reject, open, close) from outcomes and the
time it is handed; it never reads a clock, waits or calls out, and holds no
lock: its shell (`CircuitBreaker`) calls it under its own. Every state
change is appended to `outbox` for the shell to report once the lock is
released.

Its records (states, transitions, permits) live in `_records`, its state
changes (opening, moving between states) in `_transitions`, its windows in
`_windows`.
"""

from __future__ import annotations

import collections
import math
import weakref
from typing import TYPE_CHECKING, Any, final

from resilient._breaker._records import (
    _CLOSED,
    _FORCED_OPEN,
    _HALF_OPEN,
    _OPEN,
    FAILURE,
    IGNORE,
    BreakerPermit,
    BreakerStatistics,
    Reject,
)
from resilient._breaker._transitions import (
    move,
    next_interval,
    reopen,
    trip,
)
from resilient._breaker._windows import SLOW, CountRing, TimeRing
from resilient._core._config_breaker import BreakerConfig, CountWindow


if TYPE_CHECKING:
    from resilient._breaker._records import BreakerTransition, Gate


@final
class _BreakerMachine:
    """
    The decisions of one breaker, and nothing else: no clock, no lock, no
    I/O. Every method takes the time; every state change is appended to
    `outbox` for the shell to report once its lock is released.

    Args:
        config: The thresholds and timings.
        name: The breaker's name, copied into transitions.
        owner: Handed to each permit when `admit` is given none; opaque
            here. (`CircuitBreaker` passes itself to `admit` instead, so
            that it and its machine form no reference cycle.)
        epoch: The first epoch: a machine that replaces another starts past
            the old one's, so that the old one's permits count for nothing.
    """

    __slots__ = (
        "_fail_rate",
        "_holders",
        "_min_calls",
        "_seq",
        "_slow_rate",
        "config",
        "enforcing",
        "epoch",
        "free_until",
        "gate",
        "interval",
        "name",
        "open_until",
        "opened_at",
        "opened_by",
        "outbox",
        "owner",
        "probes",
        "rejected",
        "slow",
        "stamped",
        "state",
        "successes",
        "timed",
        "times_opened",
        "window",
    )

    def __init__(
        self,
        config: BreakerConfig,
        name: str = "",
        owner: Any = None,
        *,
        epoch: int = 0,
    ) -> None:
        self.config = config
        self.name = name
        self.owner = owner
        w = config.window
        self.window: CountRing | TimeRing = (
            CountRing(w.size)
            if isinstance(w, CountWindow)
            else TimeRing(w.seconds)
        )
        self._min_calls = config.minimum_calls
        self._fail_rate = config.failure_rate
        self._slow_rate = config.slow_call_rate
        slow = config.slow_call_duration
        self.slow = math.inf if slow is None else slow
        """Seconds from which a call is slow (infinite: never)."""
        self.timed = slow is not None
        """Whether a call's duration matters while closed."""
        self.enforcing = not config.metrics_only
        """Whether it rejects calls (it does unless metrics-only)."""
        self.stamped = self.timed or isinstance(self.window, TimeRing)
        """Whether a closed call's success needs its end time (a time
        window files it by time; a count window does not)."""
        self.state = _CLOSED
        self.epoch = epoch
        """Bumped on every state change: older permits no longer count."""
        self.gate: Gate | None = (epoch, collections.deque())
        """While closed, the epoch and its inbox; None otherwise. One read
        tells a caller whether it may call without the lock, with which
        epoch, and where a plain success goes (see `absorb`)."""
        self.free_until = -math.inf
        """A closed call's success that was not slow and ended before this
        time may go to the inbox, uncounted for now and unchecked; from it
        on, or when it is -inf, it is counted under the lock (see
        `_free_inbox`)."""
        self.open_until = self.opened_at = 0.0
        self.opened_by: BaseException | None = None
        """The failure that opened it, detached (see `detached`); None
        while closed."""
        self.interval = config.open_interval
        self.probes: dict[int, float] = {}
        """Half-open probes in flight: permit number -> start time."""
        self._holders: dict[int, weakref.ref[BreakerPermit]] = {}
        """The probes' permits, weakly: a dropped one frees its slot."""
        self.successes = 0
        self._seq = 0
        self.times_opened = 0
        self.rejected = 0
        self.outbox: list[BreakerTransition] = []

    def admit(self, now: float, owner: Any = None) -> BreakerPermit | Reject:
        """
        A permit to call now, or a rejection with the wait for a probe; the
        permit is *owner*'s (default: the machine's own *owner*).
        """
        got = self.admit_or_wait(now, owner)
        if type(got) is BreakerPermit:
            return got
        return Reject(got, self.state)

    def admit_or_wait(
        self, now: float, owner: Any = None
    ) -> BreakerPermit | float:
        """
        `admit` without a record for the rejection: a permit, or the
        seconds until a probe (the rejection's state is `state` then).
        """
        if owner is None:
            owner = self.owner
        state = self.state
        if state is _CLOSED:
            return BreakerPermit(owner, self.epoch, now, 0)
        if state is _OPEN:
            if now < self.opened_at:
                self._reopen(now)  # The clock was swapped for a lower one.
            if now >= self.open_until:
                self._move(_HALF_OPEN, "open_interval_passed", now)
            else:
                self.rejected += 1
                return self.open_until - now
        elif state is not _HALF_OPEN:
            self.rejected += 1
            return math.inf
        probes = self.probes
        if probes:
            self._reap(now)
            if (
                probes
                and now - min(probes.values()) >= self.config.probe_timeout
            ):
                self._trip("probe_timeout", now, None)
                self.rejected += 1
                return self.interval
            if len(probes) >= self.config.half_open_probes:
                self.rejected += 1
                return self.retry_after(now)
        self._seq += 1
        seq = self._seq
        permit = BreakerPermit(owner, self.epoch, now, seq)
        ref = weakref.ref(permit)
        # Both entries in two stores with no call between them: an
        # asynchronous exception lands before both or after both, never
        # leaving a probe whose permit nobody can see dropped.
        probes[seq] = now
        self._holders[seq] = ref
        return permit

    def settle(
        self,
        epoch: int,
        probe: int,
        outcome: int,
        duration: float,
        now: float,
        *,
        exc: BaseException | None = None,
    ) -> BreakerTransition | None:
        """
        Count the *outcome* of a call admitted at *epoch* (as probe number
        *probe*, or 0) that took *duration* seconds and raised *exc* (or
        nothing); the state change, if any. The one way an outcome enters
        the machine.

        A call admitted before the latest state change counts for nothing.
        """
        if epoch != self.epoch:
            return None
        if probe:
            return self._probe_ended(probe, outcome, duration, now, exc)
        if outcome == IGNORE:
            return None
        self.absorb()
        code = outcome | (SLOW if duration >= self.slow else 0)
        w = self.window
        w.add(code, now)
        calls = w.calls
        if calls >= self._min_calls:
            # Rates as quotients: ``failures >= calls * rate`` misreads
            # 3 of 10 at 0.3 (10 * 0.3 is 3.0000000000000004).
            if w.failures / calls >= self._fail_rate:
                return self._trip("failure_rate", now, exc)
            if w.slow / calls >= self._slow_rate:
                return self._trip("slow_call_rate", now, exc)
            self.free_until = w.fills_until()  # `_free_inbox`, checked.
        else:
            self.free_until = -math.inf
        return None

    def _free_inbox(self) -> None:
        """
        Set `free_until` after the window changed under the lock.

        A success that was not slow lowers both rates, or keeps them, once
        the window holds *minimum_calls* calls: with fewer, it may be the
        call that brings the window to *minimum_calls* and opens the
        breaker (F, F, F, S, S at 50 % of 5), so it is counted under the
        lock and checked. The inbox is free, then, while closed, with the
        window at *minimum_calls* or more and both rates under their
        thresholds; for a count window until the next change under the
        lock (`inf`), for a time window until its newest bucket ends (a
        bucket that leaves may take calls or successes with it and raise
        the rates; that success is counted under the lock, which checks).
        """
        w = self.window
        calls = w.calls
        if (
            self.gate is None
            or calls < self._min_calls
            or w.failures / calls >= self._fail_rate
            or w.slow / calls >= self._slow_rate
        ):
            self.free_until = -math.inf
        else:
            self.free_until = w.fills_until()

    def absorb(self) -> None:
        """
        Move the inbox's successes into the window.

        A success of a closed call that was not slow, ended before
        `free_until`, cannot open the breaker (see `_free_inbox`), so the
        shell counts it without the lock: it appends the call's end time to
        the closed epoch's inbox (one atomic step), and the machine takes
        the inbox in before anything reads the window. A success from an
        epoch that ended lands in an inbox nobody reads.
        """
        gate = self.gate
        if gate is not None and gate[1]:
            self.window.take(gate[1])

    def record(
        self,
        permit: BreakerPermit,
        outcome: int,
        duration: float,
        now: float,
        exc: BaseException | None = None,
    ) -> BreakerTransition | None:
        """`settle` for a permit (the simulator's form)."""
        return self.settle(
            permit.epoch, permit.probe, outcome, duration, now, exc=exc
        )

    def _probe_ended(
        self,
        probe: int,
        outcome: int,
        duration: float,
        now: float,
        exc: BaseException | None,
    ) -> BreakerTransition | None:
        """A half-open probe of the current epoch ended."""
        start = self.probes.pop(probe, None)
        self._holders.pop(probe, None)
        if start is None or outcome == IGNORE:
            return None  # Reaped already, or released without counting.
        if now - start >= self.config.probe_timeout:
            return self._trip("probe_timeout", now, exc)
        if outcome == FAILURE or duration >= self.slow:
            return self._trip("probe_failed", now, exc)
        self.successes += 1
        if self.successes >= self.config.half_open_probes:
            return self._move(_CLOSED, "probes_succeeded", now)
        return None

    def _reap(self, now: float) -> None:
        """
        Free the slots of probes whose permits were dropped unsettled, and
        re-time probes that started "after" *now* (a swapped clock).
        """
        probes, holders = self.probes, self._holders
        for seq in [s for s, ref in holders.items() if ref() is None]:
            del holders[seq]
            probes.pop(seq, None)
        for seq, start in probes.items():
            if start > now:
                probes[seq] = now

    def retry_after(self, now: float) -> float:
        """Seconds until `admit` would admit a call; 0 if it would now."""
        state = self.state
        if state is _CLOSED:
            return 0.0
        if state is _OPEN:
            if now < self.opened_at:
                self._reopen(now)
            return max(0.0, self.open_until - now)
        if state is _FORCED_OPEN:
            return math.inf
        probes = self.probes
        if probes:
            self._reap(now)
        if probes:
            oldest = min(probes.values())
            timeout = self.config.probe_timeout
            if now - oldest >= timeout:
                return self._next_interval()  # It re-opens on next admit.
            if len(probes) >= self.config.half_open_probes:
                # A slot frees when a probe ends, at the latest when it
                # times out; never promise a longer wait than re-opening
                # would cost, or waiting callers outlast a recovery.
                return min(oldest + timeout - now, self._next_interval())
        return 0.0

    def force_open(self, now: float) -> BreakerTransition | None:
        """Reject everything until `reset`."""
        if self.state is _FORCED_OPEN:
            return None
        return self._move(_FORCED_OPEN, "forced", now)

    def reset(self, now: float) -> BreakerTransition | None:
        """Close and forget the window (and any forced opening)."""
        if self.state is _CLOSED:
            self.absorb()
            self.free_until = -math.inf  # First: the window empties.
            self.window.clear()
            self.interval = self.config.open_interval
            return None
        return self._move(_CLOSED, "reset", now)

    def pristine(self) -> bool:
        """
        Whether it holds nothing a new configuration would lose: closed
        since it was made, with an empty window.
        """
        self.absorb()
        return (
            self.state is _CLOSED
            and self.window.calls == 0
            and self.times_opened == 0
        )

    def statistics(self, now: float) -> BreakerStatistics:
        """A snapshot as of *now*."""
        retry_after = self.retry_after(now)
        self.absorb()
        w = self.window
        w.expire(now)
        self._free_inbox()  # Buckets may have left.
        calls = w.calls
        return BreakerStatistics(
            name=self.name,
            state=self.state,
            calls=calls,
            failures=w.failures,
            slow_calls=w.slow,
            failure_rate=w.failures / calls if calls else 0.0,
            slow_call_rate=w.slow / calls if calls else 0.0,
            probes_in_flight=len(self.probes),
            retry_after=retry_after,
            times_opened=self.times_opened,
            rejected=self.rejected,
        )

    # State changes: see `_transitions`.

    _next_interval = next_interval
    _reopen = reopen
    _trip = trip
    _move = move
