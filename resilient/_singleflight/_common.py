"""
What the sync and async shells share: the telemetry a flight's callers
record, leaving (safe against an exception landing mid-way), what an ended
flight means for a caller, and the errors they raise.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any, Final

from resilient._singleflight._machine import ERROR, VALUE
from resilient._singleflight._report import recorder
from resilient.exceptions import DeadlineExceeded


if TYPE_CHECKING:
    from resilient._singleflight._machine import Flight, GroupMachine, Ticket
    from resilient._singleflight._report import Recorder


NOTE: Final = (
    "resilient: singleflight {name!r} shared this exception with the {{n}} "
    "callers waiting for one execution (flight #{number})"
)

EXECUTING: Final[contextvars.ContextVar[frozenset[Flight]]] = (
    contextvars.ContextVar("resilient_singleflight", default=frozenset())
)
"""The flights whose execution the current context runs: a caller inside
one that would wait for it would wait for itself."""


def leave(m: GroupMachine, ticket: Ticket, rec: Recorder | None) -> None:
    """
    `GroupMachine.leave`, done again if an asynchronous exception lands in
    it (then raised once it is done); cancels an execution *ticket* was
    the last caller of. For the shells' ``finally``.
    """
    flight = ticket.flight
    if flight is not None and flight.woken:
        # Ended, every member woken: nothing left that leaving would undo
        # (a ticket stays in an ended flight's members: nobody counts them).
        return
    late = doomed = None
    while True:
        try:
            doomed = m.leave(ticket)
            break
        # An asynchronous exception: stormed in a subprocess.
        except BaseException as exc:  # noqa: BLE001 # pragma: no cover
            late = exc
    if doomed is not None:
        if rec is not None:
            rec.abandoned()
        if doomed.cancel is not None:
            doomed.cancel()  # The last caller of an async execution.
    if late is not None:
        raise late  # pragma: no cover


def recording(
    name: str, flight: Flight, rec: Recorder | None
) -> Recorder | None:
    """
    The recorder of a caller of group *name* that has just joined
    *flight* (*rec*: the one it has from an earlier flight, if any).

    Telemetry is decided once per flight, when it starts (see
    `Flight.recorded`): its callers record if it does, without looking for
    any themselves. So a flight is recorded whole or not at all, and a
    follower of an unrecorded one pays for one attribute read.
    """
    if rec is None and flight.recorded:
        rec = recorder(name)
    return rec


def outcome(
    flight: Flight, ticket: Ticket, rec: Recorder | None
) -> tuple[bool, Any]:
    """
    What an ended *flight* means for *ticket*: (True, its value), raise its
    exception, or (False, None) to start over.
    """
    if flight.state == VALUE:
        return True, flight.value
    error = flight.error
    if flight.state == ERROR or (error is not None and flight.owner is ticket):
        # A shared exception; or a KeyboardInterrupt or SystemExit of an
        # async execution, its leader's to raise and nobody else's.
        assert error is not None  # noqa: S101
        raise error.with_traceback(flight.traceback)
    if rec is not None:
        rec.restart()
    return False, None


def note(name: str, flight: Flight) -> str:
    """The note a shared exception gets (``{n}``: how many raise it)."""
    return NOTE.format(name=name, number=flight.number)


def deadline_error(name: str, flight: Flight, at: float) -> DeadlineExceeded:
    """A follower's own deadline passed while it waited for *flight*."""
    error = DeadlineExceeded(at)
    error.add_note(
        f"resilient: stopped waiting for singleflight {name!r} "
        f"(flight #{flight.number}) at the caller's deadline; the "
        "execution goes on for the others"
    )
    return error
