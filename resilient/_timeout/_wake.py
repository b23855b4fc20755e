"""
Waking what waits in a scope that is cancelled.

`sleeper` makes the event a scope's `TimeoutScope.wait` sleeps on, and
`stop_locked` marks a scope cancelled and sets that event (both
`TimeoutScope`'s methods, bound in its class body: ``_sleeper = sleeper``).
For the waits of other primitives that do not sleep on the clock (a
condition variable, a queue): `wake_on_cancel` registers a callback that
``cancel()`` calls, and `check_scope` raises once the scope fired.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final, final

from resilient._core import _clock
from resilient._timeout._shared import _LOCK


if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from resilient._timeout._scope import TimeoutScope


# Assigned, not imported: see `_shared`.
_SCOPE: Final = _clock._SCOPE  # noqa: SLF001


def sleeper(self: TimeoutScope) -> threading.Event:
    """The event `wait` sleeps on, made (already set if cancelled) once."""
    with _LOCK:
        event = self._event
        if event is None:
            event = threading.Event()
            if self._stopped:
                event.set()
            self._event = event  # Stored set: `cancel` sets it from now.
    return event


def stop_locked(self: TimeoutScope) -> None:
    """Mark the scope cancelled and wake its sleeper (under `_LOCK`)."""
    self._stopped = True
    event = self._event
    if event is not None:
        event.set()


def check_scope() -> None:
    """
    Raise if the current scope (or an enclosing one) was cancelled or its
    deadline passed; nothing outside scopes.

    For the waits of other primitives that do not sleep on the clock (a
    condition variable, a queue): call it before and after each wait.
    """
    scope = _SCOPE.get()
    if scope is not None:
        scope.check()


@final
class wake_on_cancel:  # noqa: N801 - used like a function
    """
    Call *callback* if the current scope (or an enclosing one) is cancelled
    while inside this block; at once if it already is.

    For waits that are not clock sleeps: *callback* wakes the waiter (say,
    ``notify_all()`` under the condition's lock), which then calls
    `check_scope`. It runs in the thread that calls ``cancel()``, and must
    not raise.

    A class, not a generator: a generator-based context manager that an
    interrupt abandons half-entered is closed later by the garbage
    collector, where nothing can be raised.
    """

    __slots__ = ("_callback", "_scope")

    def __init__(self, callback: Callable[[], object]) -> None:
        self._callback = callback
        scope = _SCOPE.get()
        self._scope = scope if isinstance(scope, _scope.TimeoutScope) else None

    def __enter__(self) -> None:
        scope = self._scope
        if scope is None:
            return
        try:
            with _LOCK:
                scope._wakers.append(self._callback)  # noqa: SLF001
                already = scope._stopped  # noqa: SLF001
            if already:
                self._callback()
        except BaseException:
            self._leave()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        scope = self._scope
        if scope is None:
            return
        callback = self._callback
        with _LOCK:
            wakers = scope._wakers  # noqa: SLF001
            for i in range(len(wakers) - 1, -1, -1):
                if wakers[i] is callback:
                    del wakers[i]
                    break


# Last, as this module is complete by then: `_scope` imports it to build
# the class, and Python may load either first.
from resilient._timeout import _scope  # noqa: E402
