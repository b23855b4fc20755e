"""
Entering and leaving a scope: the bookkeeping behind `TimeoutScope`'s
``__enter__`` and ``__exit__``.

`enter` reads what a partial entry must put back, links the scope to its
parent, sets the context variables and opens the anyio cancel scope (async
code) or notes the ``with`` statement's frame and arms the interrupt (sync
code); `abandon_entry` undoes a partial entry; `leave` undoes an entry,
each step at most once however often it runs. `_heal` finishes leaving a
scope whose ``with`` statement is gone without leaving it (`abandoned`).

An asynchronous exception may land at any bytecode boundary of these, so
each is finished by a second pass (see `resilient._timeout._scope`), and
the alarm's handler holds off while they run (their code is in
`resilient._timeout._scope._BOOKKEEPING`).

The functions but `_heal` are `TimeoutScope`'s methods, bound in its class
body (``_enter = enter``, ``_leave = leave``): a call to one costs what a
method's call costs.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
from typing import TYPE_CHECKING, Final

import anyio

from resilient._core import _clock, _internals, _loops
from resilient._timeout._shared import _LOCK, _UNSET


if TYPE_CHECKING:
    from types import FrameType

    from resilient._timeout._scope import TimeoutScope


# Assigned, not imported: see `_shared`.
_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001
_SCOPE: Final = _clock._SCOPE  # noqa: SLF001


# Frames that can be suspended (generators, coroutines): not plain.
_SUSPENDABLE: Final = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)
# How a frame's current instruction tells a ``with`` calling ``__enter__``:
# one opcode on CPython 3.11-3.13, else the code read with `dis` (3.14's
# LOAD_SPECIAL and CALL); see `resilient._core._internals`.
_BEFORE_WITH: Final = _internals.BEFORE_WITH
_BY_DIS: Final = _internals.WITH_SHAPE != "BEFORE_WITH"
_calls_enter: Final = _internals.calls_enter


def enter(self: TimeoutScope) -> None:
    """Enter the scope (`TimeoutScope.__enter__` undoes a partial entry)."""
    self._state = "entered"
    current = _SCOPE.get()
    if current is not None:
        _heal(current, None)
    # Read first: a partial entry puts these back.
    self._old_deadline = _DEADLINE.get()
    self._old_scope = _SCOPE.get()
    clock = self._clock = _clock.get_clock()
    seconds, at = self._request
    now = self._entered_at = clock.now()
    if at is not None:
        self._own = at
    elif seconds is not None:
        self._own = now + seconds
    self._outer_at = self._old_deadline
    self.at = min(self._own, self._outer_at)
    parent = self._old_scope
    self._parent = parent if isinstance(parent, _scope.TimeoutScope) else None
    if self._parent is not None:
        with _LOCK:
            self._parent._children.add(self)  # noqa: SLF001
            if self._parent._stopped:  # noqa: SLF001
                self._stop_locked()
    self._deadline_token = _DEADLINE.set(self.at)
    self._scope_token = _SCOPE.set(self)
    library = _loops.current_async_library()
    if library is not None:
        self._loop_thread = threading.get_ident()
        self._loop_call = _loops.loop_caller(library)
        left = self.at - now
        cs = self._cs = anyio.CancelScope(deadline=anyio.current_time() + left)
        self._cs_open = True
        cs.__enter__()
        if self._cancel_called:
            cs.cancel()
    else:
        self._note_with_frame(sys._getframe(2))  # noqa: SLF001
        if self._interrupt:
            self._alarm = _Alarm.arm(self)


def note_with_frame(self: TimeoutScope, frame: FrameType) -> None:
    """
    Remember the frame of the ``with`` statement that entered this
    sync scope, if it is a plain function's (so it can only be running
    in this thread or finished), for `_abandoned`.
    """
    code = frame.f_code
    if not code.co_flags & _SUSPENDABLE and (
        code.co_code[frame.f_lasti] == _BEFORE_WITH
        or (_BY_DIS and _calls_enter(code, frame.f_lasti))
    ):
        self._with_frame = frame
        self._thread = threading.get_ident()


def abandoned(self: TimeoutScope) -> bool:
    """
    Whether the ``with`` statement that entered this scope is gone
    without leaving it: an exception delivered exactly as CPython
    called ``__exit__`` (before its first instruction), which no
    Python code can catch.
    """
    frame = self._with_frame
    if frame is None or self._thread != threading.get_ident():
        return False
    f: FrameType | None = sys._getframe(1)  # noqa: SLF001
    while f is not None:
        if f is frame:
            return False
        f = f.f_back
    return True


def abandon_entry(self: TimeoutScope) -> None:
    """Undo a partial entry (an exception landed in `_enter`)."""
    if self._state == "new":
        return  # Not started: nothing to undo, and it may be retried.
    self._leave(None)
    # A token lost between `ContextVar.set` and storing it: put the
    # value back instead.
    if self._old_scope is not _UNSET and _SCOPE.get() is self:
        _SCOPE.set(self._old_scope)
    if (
        self._old_deadline is not _UNSET
        and _DEADLINE.get() != self._old_deadline
    ):
        _DEADLINE.set(self._old_deadline)


def leave(self: TimeoutScope, exc: BaseException | None) -> bool:
    """
    Disarm, close the cancel scope, reset the context variables and
    unregister, each step at most once however often this runs;
    True if the cancel scope caught its own cancellation.
    """
    caught = False
    try:
        if self._interrupt:
            _Alarm.disarm_scope(self)
    finally:
        try:
            cs = self._cs
            if self._cs_open and cs is not None:
                # trio's scope returns True on a clean exit too: read
                # the flag.
                with contextlib.suppress(RuntimeError):  # Exited.
                    cs.__exit__(
                        type(exc) if exc is not None else None,
                        exc,
                        exc.__traceback__ if exc is not None else None,
                    )
                self._cs_open = False
                caught = cs.cancelled_caught
        finally:
            try:
                token, self._scope_token = self._scope_token, None
                if token is not None:
                    _SCOPE.reset(token)
            finally:
                try:
                    token, self._deadline_token = (
                        self._deadline_token,
                        None,
                    )
                    if token is not None:
                        _DEADLINE.reset(token)
                finally:
                    try:
                        parent = self._parent
                        if parent is not None:
                            with _LOCK:
                                parent._children.discard(self)  # noqa: SLF001
                    finally:
                        self._state = "exited"
                        self._with_frame = None
    return caught


def _heal(scope: object, until: TimeoutScope | None) -> None:
    """
    Finish leaving the scopes, from *scope* outward (up to *until*), whose
    ``with`` statement is gone without leaving them (`_abandoned`): so a
    scope an exception skipped the exit of is left at the next scope's
    entry or an enclosing scope's exit in the same thread.
    """
    while (
        isinstance(scope, _scope.TimeoutScope)
        and scope is not until
        and scope._state == "entered"  # noqa: SLF001
        and scope._abandoned()  # noqa: SLF001
    ):
        with contextlib.suppress(ValueError):  # A token of another context.
            scope._leave(None)  # noqa: SLF001
        if _SCOPE.get() is scope:
            _SCOPE.set(scope._old_scope)  # noqa: SLF001
            _DEADLINE.set(scope._old_deadline)  # noqa: SLF001
        scope = _SCOPE.get()


# Last, as this module is complete by then: `_scope` imports it to build
# the class, and Python may load either first.
from resilient._timeout import _alarm, _scope  # noqa: E402


_Alarm: Final = _alarm._Alarm  # noqa: SLF001 - assigned: see `_shared`
