"""
The sync shell (threads): the leader runs the function itself, in its own
thread (a thread cannot be cancelled, and nothing else could run it);
followers block on a `ThreadWaiter` each, up to their own deadline.
"""

from __future__ import annotations

import inspect
import math
import threading
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context

from resilient._core import _clock
from resilient._core._clock import MonotonicClock
from resilient._singleflight._common import (
    deadline_error,
    leave,
    note,
    outcome,
    recording,
)
from resilient._singleflight._machine import (
    ABORTED,
    ERROR,
    RUNNING,
    VALUE,
    Flight,
    Ticket,
)
from resilient._timeout import check_scope, wake_on_cancel
from resilient._wait import ThreadWaiter, wait_slice
from resilient.exceptions import DeadlineExceeded


if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from resilient._singleflight._group import SingleFlight
    from resilient._singleflight._report import Recorder


T = TypeVar("T")


def call(
    group: SingleFlight,
    key: Hashable,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """
    `SingleFlight.call`. Telemetry is the flight's, as in the async shell:
    its callers record if some was configured when it started.
    """
    m = group._machine  # noqa: SLF001
    rec: Recorder | None = None
    failed: BaseException | None = None
    try:
        while True:
            waiter = ThreadWaiter()
            ticket = Ticket(waiter)
            try:
                flight = m.join(key, ticket, is_async=False)
                leads = flight.owner is ticket
                rec = recording(group.name, flight, rec)
                if rec is not None:
                    rec.joined(flight, leads=leads)
                if leads:
                    return _lead(group, flight, fn, args, kwargs, rec=rec)
                _follow(group, flight, waiter)
            finally:
                leave(m, ticket, rec)
            done, value = outcome(flight, ticket, rec)
            if done:
                return value  # type: ignore[no-any-return]
    except BaseException as exc:
        failed = exc
        raise
    finally:
        if rec is not None:
            rec.ended(failed)
        failed = None  # (No cycle through the traceback.)


def _lead(
    group: SingleFlight,
    flight: Flight,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    rec: Recorder | None,
) -> T:
    m = group._machine  # noqa: SLF001
    own = _clock.current_deadline()
    token = None if rec is None else rec.enter()
    try:
        value = fn(*args, **kwargs)
        if inspect.iscoroutine(value):
            value.close()
            raise TypeError(  # noqa: TRY301 - shared like fn's own errors
                f"resilient: SingleFlight.call() got a coroutine from "
                f"{fn!r}; use `await group.acall(...)` for async functions"
            )
    except Exception as exc:
        if isinstance(exc, DeadlineExceeded) and exc.deadline == own:
            # The leader's own deadline is not the followers': they start
            # again, each within its own.
            m.finish(flight, ABORTED)
        else:
            m.finish(flight, ERROR, error=exc, note=note(group.name, flight))
        raise
    finally:
        if token is not None:
            otel_context.detach(token)
    m.finish(flight, VALUE, value)
    return value


def _follow(group: SingleFlight, flight: Flight, waiter: ThreadWaiter) -> None:
    """Wait in this thread until *flight* ends or the deadline passes."""
    if flight.home == threading.get_ident():
        raise RuntimeError(
            f"resilient: singleflight {group.name!r}: the execution this "
            "call would wait for runs in this very thread (a recursive "
            "call, or an async execution of this thread's event loop: "
            "use `await group.acall(...)`); waiting would never end"
        )
    at = _clock.current_deadline()
    if _clock._SCOPE.get() is None:  # noqa: SLF001
        _wait(group, flight, waiter, at, scoped=False)
        return
    # A `resilient.timeout` cancelled from another thread wakes us.
    with wake_on_cancel(waiter.wake):
        _wait(group, flight, waiter, at, scoped=True)
    check_scope()


def _wait(
    group: SingleFlight,
    flight: Flight,
    waiter: ThreadWaiter,
    at: float,
    *,
    scoped: bool,
) -> None:
    """Block until *flight* ends, up to *at* (checking the scope)."""
    clock = _clock.get_clock()
    exact = type(clock) is MonotonicClock
    while flight.state == RUNNING:
        if scoped:
            check_scope()
        if at == math.inf:
            waiter.wait()
            continue
        now = clock.now()
        if now >= at:
            raise deadline_error(group.name, flight, at)
        waiter.wait(wait_slice(at, now, exact=exact))
