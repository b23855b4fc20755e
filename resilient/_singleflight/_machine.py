"""
The group machine: key -> flight, each flight with the callers that wait
for it. No waiting, no I/O: the shells (`_sync.py`, `_async.py`) do that.

Every caller holds a `Ticket`. `join` makes it the leader of a new flight
or a member of the one under way; `finish` records the flight's outcome
(first one wins), takes it out of the map and wakes every member; `leave`
takes a ticket out of its flight, aborting a flight whose leader left
before it could run, and abandoning one whose last member left.

Each step is ordered so that an exception landing between any two
bytecodes (KeyboardInterrupt, ``PyThreadState_SetAsyncExc``) leaves a
state the caller's ``finally`` (one `leave`, which is idempotent) can
repair: a ticket is pointed at its flight before it becomes a member, a
flight is entered in the map only once its leader's ticket points at it,
and `finish` and `leave` only ever move a flight forward.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from resilient._core._telemetry import disabled


if TYPE_CHECKING:
    from collections.abc import Hashable
    from types import TracebackType

    from resilient._wait import Waiter


RUNNING: Final = 0
VALUE: Final = 1
ERROR: Final = 2
ABORTED: Final = 3
"""The execution ended in a way that is not the followers' to receive (a
`BaseException` such as KeyboardInterrupt or a cancellation, or the
leader's own deadline), or never ran: waiting members start over."""


@final
@attrs.frozen(kw_only=True)
class SingleFlightStatistics:
    """
    A consistent snapshot of a `resilient.SingleFlight` group.

    Attributes:
        in_flight: Keys with an execution under way (the in-flight map's
            size; 0 when nothing is in flight).
        running: Executions under way that callers wait for, forgotten
            ones included.
        waiting: Callers waiting for an execution now, leaders included.
        executions: Executions started so far.
        joined: Callers so far that joined an execution under way instead
            of starting one.
        abandoned: Executions cancelled because every caller waiting for
            them had gone (async only: a thread cannot be cancelled).

    .. versionadded:: 26.12.0
    """

    in_flight: int
    running: int
    waiting: int
    executions: int
    joined: int
    abandoned: int


@final
class Ticket:
    """
    One caller of one flight: how to wake it, and the flight it is in.

    The waiter may be shared (every task of one event loop waiting for one
    flight waits on one gate) and may be set after the join: a caller
    looks at the flight's state after setting it, so a `finish` that did
    not see it is one the caller sees.
    """

    __slots__ = ("flight", "waiter")

    def __init__(self, waiter: Waiter | None = None) -> None:
        self.waiter = waiter
        self.flight: Flight | None = None


@final
class Flight:
    """
    One execution and the callers waiting for it.

    Attributes:
        key: The key it runs for.
        number: Its sequence number in the group (spans name flights by
            number, never by key: keys may be secrets).
        owner: The leader's ticket.
        home: The thread the execution runs in (the leader's in sync code,
            the event loop's in async code).
        members: The tickets of the callers waiting for it.
        joined: How many callers joined it.
        state: `RUNNING` until `finish`.
        value, error, traceback: The outcome.
        is_async: Whether the execution runs in a task of its own.
        spawned: Whether that task was started.
        abandoned: Whether every member left before it ended.
        cancel: Cancels the task (from any thread); set by the runner.
        span: The leader's span, if telemetry is on (followers link to it).
        recorded: Whether its callers record telemetry: some was
            configured when it started (read once, before anyone could
            join it), so a caller that joins does not look for any, and a
            flight is recorded whole or not at all.
        gates: The async shell's wake-ups, one per event loop that has
            callers waiting (see `Ticket`).
        gate: The one of the execution's own event loop (async).
        woken: Whether `finish` woke every member (an interrupted `finish`
            is done again by the leader's `leave`).
    """

    __slots__ = (
        "abandoned",
        "cancel",
        "error",
        "gate",
        "gates",
        "home",
        "is_async",
        "joined",
        "key",
        "members",
        "number",
        "owner",
        "recorded",
        "span",
        "spawned",
        "state",
        "traceback",
        "value",
        "woken",
    )

    def __init__(
        self,
        key: Hashable,
        number: int,
        owner: Ticket,
        *,
        is_async: bool,
        recorded: bool = False,
    ) -> None:
        self.key = key
        self.number = number
        self.owner = owner
        self.home = threading.get_ident()
        self.members: set[Ticket] = set()
        self.joined = 0
        self.state = RUNNING
        self.value: Any = None
        self.error: BaseException | None = None
        self.traceback: TracebackType | None = None
        self.is_async = is_async
        self.spawned = False
        self.abandoned = False
        self.cancel: Any = None
        self.span: Any = None
        self.recorded = recorded
        self.gates: dict[object, Any] = {}
        self.gate: Any = None
        self.woken = False

    def __repr__(self) -> str:
        state = ("running", "value", "error", "aborted")[self.state]
        return (
            f"<Flight #{self.number} {state}, {len(self.members)} waiting, "
            f"{self.joined} joined>"
        )


@final
class GroupMachine:
    """The in-flight map of one group and its counts, behind one lock."""

    __slots__ = (
        "_abandoned",
        "_executions",
        "_joined",
        "_lock",
        "_running",
        "flights",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.flights: dict[Hashable, Flight] = {}
        self._running: set[Flight] = set()
        self._executions = 0
        self._joined = 0
        self._abandoned = 0

    def join(self, key: Hashable, ticket: Ticket, *, is_async: bool) -> Flight:
        """
        Put *ticket* in the flight for *key*, starting one if none is under
        way: the flight, which *ticket* leads if it is its `owner` (it must
        then run the execution).

        Raises:
            TypeError: *key* is unhashable (nothing changed).
        """
        with self._lock:
            try:
                flight = self.flights.get(key)
            except TypeError:
                _refuse_unhashable(key)
                raise
            if flight is None:
                self._executions += 1
                flight = Flight(
                    key,
                    self._executions,
                    ticket,
                    is_async=is_async,
                    recorded=not disabled(),
                )
                ticket.flight = flight
                flight.members.add(ticket)
                self._running.add(flight)
                self.flights[key] = flight
                return flight
            ticket.flight = flight
            flight.members.add(ticket)
            flight.joined += 1  # (The group's count adds it up at the end.)
            return flight

    def finish(
        self,
        flight: Flight,
        state: int,
        value: object = None,
        error: BaseException | None = None,
        note: str | None = None,
    ) -> None:
        """
        Record the outcome of *flight* (unless one is recorded already),
        take it out of the map and wake every member. Idempotent.

        Args:
            note: Added to a shared *error* when more than one caller will
                raise it; ``{n}`` becomes their number.
        """
        with self._lock:
            if flight.state == RUNNING:
                if error is not None:
                    flight.error = error
                    flight.traceback = error.__traceback__
                    if note is not None and len(flight.members) > 1:
                        error.add_note(note.format(n=len(flight.members)))
                flight.value = value
                flight.state = state
            self._drop(flight)
            if flight.woken:
                return
            # Each waiter once: many tickets can share one.
            waiters = {t.waiter for t in flight.members}
        waiters.discard(None)
        for waiter in waiters:
            waiter.wake()  # type: ignore[union-attr]
        flight.woken = True

    def leave(self, ticket: Ticket) -> Flight | None:
        """
        Take *ticket* out of its flight (if any; idempotent). A leader that
        leaves before its execution ran aborts the flight; the last member
        to leave an async execution abandons it: returns the flight whose
        task is to be cancelled.
        """
        flight = ticket.flight
        if flight is None:
            return None
        with self._lock:
            flight.members.discard(ticket)
            if flight.is_async and flight.spawned:
                if (
                    flight.state != RUNNING
                    or flight.members
                    or flight.abandoned
                ):
                    return None
                flight.abandoned = True
                self._abandoned += 1
                self._drop(flight)
                return flight
            if flight.owner is not ticket or flight.woken:
                return None
        # The leader left without an execution that outlives it (sync: it
        # was the execution; async: it was interrupted before the task
        # started): the members start over.
        self.finish(flight, ABORTED)
        return None

    def _drop(self, flight: Flight) -> None:
        """
        Out of the map (if still there) and the running set, its joins
        added to the group's count. Locked.
        """
        if self.flights.get(flight.key) is flight:
            del self.flights[flight.key]
        if flight in self._running:
            self._running.remove(flight)
            self._joined += flight.joined

    def forget(self, key: Hashable) -> bool:
        """Take *key*'s flight out of the map; True if there was one."""
        with self._lock:
            return self.flights.pop(key, None) is not None

    def statistics(self) -> SingleFlightStatistics:
        """A consistent snapshot of the map and the counts."""
        with self._lock:
            return SingleFlightStatistics(
                in_flight=len(self.flights),
                running=len(self._running),
                waiting=sum(len(f.members) for f in self._running),
                executions=self._executions,
                joined=self._joined + sum(f.joined for f in self._running),
                abandoned=self._abandoned,
            )


def _refuse_unhashable(key: object) -> None:
    """Raise a clear TypeError if *key* cannot be hashed (else return)."""
    try:
        hash(key)
    except TypeError as exc:
        raise TypeError(
            f"resilient: a singleflight key must be hashable, got "
            f"{type(key).__name__}: {exc}"
        ) from None
