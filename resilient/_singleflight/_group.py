"""
`SingleFlight`, the group: its public face over the in-flight map, and
the doors to the two shells (`_sync.call`, `_async.acall`).

Threads and tasks of any event loop, in any thread, share one flight: the
waiters are woken from wherever the execution ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ParamSpec, TypeVar, final

from resilient._core._shown import shown
from resilient._core._validate import check_name
from resilient._singleflight import _async, _sync
from resilient._singleflight._machine import (
    GroupMachine,
    SingleFlightStatistics,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Hashable


P = ParamSpec("P")
T = TypeVar("T")


@final
class SingleFlight:
    """
    A group of calls in which concurrent callers with one key share one
    execution, and its result or its exception.

    The first caller for a key (the leader) starts the execution; callers
    that come while it runs (followers) wait for it and get the same
    object it returned, or raise the same exception object, with a note.
    Once it ends the key is free: the next caller starts a new execution.
    Threads and tasks (asyncio and trio, any event loop in any thread) can
    share one execution.

    - A follower waits no longer than its own deadline (`resilient.deadline`,
      `resilient.timeout`), raising `DeadlineExceeded` (or the timeout
      scope's `TimedOut`); the execution goes on for the others.
    - In async code the execution runs in a task of its own: a cancelled
      caller, the leader included, leaves alone, and the execution is
      cancelled when its last caller has left. In sync code the leader's
      thread runs it.
    - An execution that ends in a way that is not the followers' to
      receive (a `BaseException` that is not an `Exception`, such as
      KeyboardInterrupt or a cancellation; or the leader's own deadline in
      sync code) is started again for the followers still waiting, one of
      them leading.

    Args:
        name: Names the group in spans and notes.

    Raises:
        ConfigTypeError: *name* is not a str.
        ConfigError: *name* is blank.

    .. versionadded:: 26.12.0
    """

    __slots__ = ("_machine", "name")

    def __init__(self, *, name: str = "singleflight") -> None:
        check_name("SingleFlight(name)", name)
        self.name = name
        self._machine = GroupMachine()

    def __repr__(self) -> str:
        s = self._machine.statistics()
        return (
            f"<SingleFlight {shown(self.name)!r}: {s.in_flight} in flight, "
            f"{s.waiting} waiting>"
        )

    def __len__(self) -> int:
        """How many keys have an execution under way."""
        return len(self._machine.flights)

    def __contains__(self, key: Hashable) -> bool:
        """Whether *key* has an execution under way (that new callers join)."""
        return key in self._machine.flights

    def statistics(self) -> SingleFlightStatistics:
        """A consistent snapshot of the group."""
        return self._machine.statistics()

    def forget(self, key: Hashable) -> bool:
        """
        Let the next caller for *key* start a new execution: the one under
        way, if any, goes on for the callers already waiting for it.

        Returns:
            Whether an execution was under way for *key*.
        """
        return self._machine.forget(key)

    def call(
        self,
        key: Hashable,
        fn: Callable[P, T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """
        ``fn(*args, **kwargs)``, or the result of the execution under way
        for *key*, waiting for it in this thread.

        Raises:
            TypeError: *key* is unhashable; *fn* returned a coroutine (use
                `acall`).
            DeadlineExceeded: The caller's deadline passed while waiting.
            RuntimeError: The execution it would wait for runs in this
                thread (a recursive call, or an async one in this thread's
                event loop): waiting would never end.
        """
        return _sync.call(self, key, fn, args, kwargs)

    # The async shell's coroutine function itself: ``await group.acall(...)``
    # runs one coroutine frame per waiting task, not two.
    acall = _async.fly
