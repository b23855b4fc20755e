"""
Timeout and cancel scopes, sync and async: the `TimeoutScope` class.

A `TimeoutScope` sets the deadline context variable of `_core/_clock.py` (so
retry and everything else that reads it clips to it) and enforces it:

- in async code with an anyio cancel scope (asyncio and trio);
- in sync code with a cancel flag that the library's sleeps wait on (so
  `cancel()` from another thread wakes them) and, on request, a real
  interrupt of the main thread by ``SIGALRM`` (`_alarm`).

Which scope fired is decided structurally: walking from the innermost scope
outward, the outermost one that was cancelled or whose own deadline passed
owns the cancellation, and only that one turns it into `TimedOut` (or
raises the reason it was cancelled with; see `_outcome`).

Asynchronous exceptions (KeyboardInterrupt, ``PyThreadState_SetAsyncExc``,
another scope's interrupt) may land at any bytecode boundary of entering or
leaving, so both are written to be finished by a second pass: ``__enter__``
undoes a partial entry, ``__exit__`` runs `_leave` again if an exception
landed in it, and every step of `_leave` (and of arming and disarming the
alarm) is one C-level operation recorded before it runs, or harmless to
repeat (see `_entry`). The alarm's handler never raises while our
bookkeeping is on the stack: `_BOOKKEEPING`, at the end of this module,
gathers its code.

Here live the class, with what user code and the sleeps ask of a scope;
its private methods live in sibling modules as functions bound in the
class body (a call to one costs what a method's call costs): entering and
leaving in `_entry`, what leaving does with the block's exception in
`_outcome`, waking its waits in `_wake`.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import TYPE_CHECKING, Any, Final, final

from resilient._core import _clock, _loops
from resilient._core._shown import shown
from resilient._timeout._alarm import _Alarm, _poke
from resilient._timeout._entry import (
    _heal,
    abandon_entry,
    abandoned,
    enter,
    leave,
    note_with_frame,
)
from resilient._timeout._outcome import (
    _fired,
    allowed,
    claims,
    note_fired,
    outcome,
)
from resilient._timeout._shared import (
    _LOCK,
    _UNSET,
    LONGEST_WAIT,
    _now,
)
from resilient._timeout._wake import sleeper, stop_locked, wake_on_cancel
from resilient.exceptions import DeadlineExceeded, ScopeCancelled


if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType, TracebackType

    import anyio

    from resilient.typing import Clock


# Assigned, not imported: see `_shared`.
_SCOPE: Final = _clock._SCOPE  # noqa: SLF001


@final
class TimeoutScope:
    """
    A scope with a deadline that stops the work inside it.

    Made by `timeout`, `timeout_at` and `deadline_from_header`; enter it
    with ``with`` (sync or async code) or ``async with``.
    In async code it is an anyio cancel scope. In sync code every wait of
    the library wakes when it fires (from any thread), `checkpoint()`
    raises once its deadline has passed, and with *interrupt* blocking code
    in the main thread is interrupted too.

    When its own deadline passes it raises `TimedOut`, a `TimeoutError`.
    When an enclosing scope fires, it lets that scope's exception through.
    After `cancel()` the block ends quietly and `cancelled_caught` is True;
    after ``cancel(reason)`` leaving the scope raises *reason* (see
    `cancel`).

    A scope is entered once. A copy of a scope (`copy.copy`,
    `copy.deepcopy`) is the scope itself.
    """

    __slots__ = (
        "_alarm",
        "_cancel_called",
        "_children",
        "_clock",
        "_cs",
        "_cs_open",
        "_deadline_token",
        "_entered_at",
        "_event",
        "_interrupt",
        "_loop_call",
        "_loop_thread",
        "_name",
        "_old_deadline",
        "_old_scope",
        "_outer_at",
        "_own",
        "_parent",
        "_reason",
        "_request",
        "_scope_token",
        "_state",
        "_stopped",
        "_thread",
        "_timed_out",
        "_wakers",
        "_with_frame",
        "at",
        "cancelled_caught",
    )

    def __init__(
        self,
        *,
        seconds: float | None,
        at: float | None,
        interrupt: bool,
        name: str | None = None,
    ) -> None:
        self._request = (seconds, at)
        self._interrupt = interrupt
        self._name = name
        self._state = "new"
        self._clock: Clock = _clock.get_clock()
        self._own = math.inf
        self._outer_at = math.inf
        self._entered_at = math.nan
        self.at = math.inf
        """The absolute deadline once entered: the scope's own, or an
        enclosing one if that is earlier (on resilient's clock)."""
        self._parent: TimeoutScope | None = None
        self._children: set[TimeoutScope] = set()
        # Whether cancelled (here or in an enclosing scope); the event
        # `wait` sleeps on is made by the first wait (`_sleeper`), so a
        # scope nobody sleeps in builds none.
        self._stopped = False
        self._event: threading.Event | None = None
        self._cancel_called = False
        self._reason: BaseException | None = None
        self._timed_out = False
        self._deadline_token: Any = None
        self._scope_token: Any = None
        self._old_deadline: Any = _UNSET
        self._old_scope: Any = _UNSET
        self._cs: anyio.CancelScope | None = None
        self._cs_open = False
        self._wakers: list[Callable[[], object]] = []
        self._loop_call: Callable[[Callable[[], object]], None] | None = None
        self._loop_thread = 0
        self._alarm: _Alarm | None = None
        self._with_frame: FrameType | None = None
        self._thread = 0
        self.cancelled_caught = False
        """Whether this scope stopped its block (by `cancel()` or its own
        deadline); an enclosing scope firing does not count."""

    def __repr__(self) -> str:
        seconds, at = self._request
        what = f"seconds={seconds!r}" if at is None else f"at={at!r}"
        name = "" if self._name is None else f" name={shown(self._name)!r}"
        return f"<TimeoutScope {what}{name} {self._state}>"

    def __copy__(self) -> TimeoutScope:
        return self

    def __deepcopy__(self, memo: object) -> TimeoutScope:
        return self

    # -- what user code asks ------------------------------------------------

    @property
    def name(self) -> str | None:
        """The scope's name (shown in `TimedOut`), or None."""
        return self._name

    def remaining(self) -> float:
        """
        Seconds left before the scope fires; `math.inf` if never, 0.0 once
        expired or cancelled.
        """
        if self._stopped:
            return 0.0
        if self.at == math.inf:
            return math.inf
        return max(0.0, self.at - self._clock.now())

    @property
    def expired(self) -> bool:
        """Whether the scope's deadline (or an enclosing one) has passed."""
        return self._clock.now() >= self.at

    @property
    def cancelled(self) -> bool:
        """Whether `cancel()` was called on this scope or an enclosing one."""
        return self._stopped

    @property
    def cancel_reason(self) -> BaseException | None:
        """
        The exception this scope was cancelled with (the first reason
        given to `cancel`), or None.

        .. versionadded:: 26.12.0
        """
        return self._reason

    @property
    def interrupting(self) -> bool:
        """Whether a real ``SIGALRM`` interrupt is armed for this scope."""
        return self._alarm is not None

    def cancel(self, reason: BaseException | None = None) -> None:
        """
        Stop the block: its waits wake at once and raise, here or in any
        thread. Safe to call from any thread (or another task, or another
        event loop's thread), any number of times, before, inside or after
        the block.

        Without *reason* the scope then ends quietly (`cancelled_caught`).
        With *reason*, an exception instance (say, a lost lock's
        ``LockLost``), the scope stops its block the same way, but:

        - `resilient.checkpoint()` inside the scope raises *reason*;
        - leaving the scope raises *reason*, unless the block is already
          raising another exception (which then propagates), or the
          scope's own deadline fired first (`TimedOut`);
        - in async code the block is cancelled (anyio's cancellation) and
          *reason* is raised when the scope is left.

        The library's own waits inside the scope still unwind with
        `ScopeCancelled` (a BaseException, so ``except Exception`` in the
        code being stopped cannot swallow it); the scope turns it into
        *reason*. The first reason given wins.

        Args:
            reason: The exception to raise out of the scope, or None.

        Raises:
            TypeError: *reason* is not an exception instance.

        .. versionchanged:: 26.12.0
           *reason*.
        """
        if reason is not None and not isinstance(reason, BaseException):
            raise TypeError(
                "TimeoutScope.cancel(reason) takes an exception instance or "
                f"None, got {reason!r}"
            )
        wake: list[Callable[[], object]] = []
        with _LOCK:
            if self._reason is None:
                self._reason = reason
            self._cancel_called = True
            todo = [self]
            while todo:
                scope = todo.pop()
                scope._stop_locked()  # noqa: SLF001
                wake.extend(scope._wakers)  # noqa: SLF001
                todo.extend(scope._children)  # noqa: SLF001
        for callback in wake:
            callback()
        if self._state != "entered":
            return
        cs = self._cs
        if cs is not None:
            if threading.get_ident() == self._loop_thread:
                cs.cancel()
            elif self._loop_call is not None:  # pragma: no branch
                with contextlib.suppress(RuntimeError):  # The loop is gone.
                    self._loop_call(cs.cancel)
        _poke(self)

    # -- what the sleeps ask (the `_clock._Scope` protocol) ----------------

    def wake_at(self) -> float:
        """When the innermost scope fires on the clock; -inf if cancelled."""
        return -math.inf if self._stopped else self.at

    def check(self, *, raise_reason: bool = False) -> None:
        """
        Raise (or, in the event loop, cancel) if the scope has fired.

        With *raise_reason* (`resilient.checkpoint()`), a scope cancelled
        with a reason raises that reason instead of `ScopeCancelled`.
        """
        fired = _fired(self, self._clock.now())
        if fired is None:
            return
        if isinstance(fired, float):
            raise DeadlineExceeded(fired)
        fired._note_fired()  # noqa: SLF001
        reason = fired._reason  # noqa: SLF001
        if raise_reason and reason is not None and not fired._timed_out:  # noqa: SLF001
            raise reason
        if fired._cs is not None and (  # noqa: SLF001
            threading.get_ident() == fired._loop_thread  # noqa: SLF001
        ):
            # Let anyio raise its own cancellation at the next checkpoint:
            # it crosses task groups, ours would not.
            fired._cs.cancel()  # noqa: SLF001
            return
        raise ScopeCancelled(fired)

    def wait(self, seconds: float) -> None:
        """
        Block up to *seconds* of real time, waking when the scope fires.

        Raises:
            RuntimeError: This thread runs an event loop (the wait would
                block it): use the async form.
        """
        self.check()
        if seconds <= 0:
            return
        _loops.refuse_blocking(
            "a blocking sleep inside a timeout scope",
            "`async with resilient.timeout(...)` and "
            "`await resilient.MonotonicClock().asleep(...)`",
        )
        event = self._sleeper()
        # The sleep runs on real time; the scope fires on resilient's clock.
        end = _now() + seconds
        while True:
            left = end - _now()
            if left <= 0:
                break
            step = min(left, self.wake_at() - self._clock.now())
            event.wait(min(step, LONGEST_WAIT))
            self.check()

    # The event `wait` sleeps on, and marking the scope cancelled: see
    # `_wake`.

    _sleeper = sleeper
    _stop_locked = stop_locked

    # -- entering and leaving ----------------------------------------------

    # The bookkeeping: see `_entry`.

    _enter = enter
    _note_with_frame = note_with_frame
    _abandoned = abandoned
    _abandon_entry = abandon_entry
    _leave = leave

    # What leaving does with the block's exception: see `_outcome`.

    _note_fired = note_fired
    _claims = claims
    _outcome = outcome
    _allowed = allowed

    def __enter__(self) -> TimeoutScope:
        if self._state != "new":
            raise RuntimeError("a TimeoutScope can be entered only once")
        try:
            self._enter()
        except BaseException:
            self._abandon_entry()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            current = _SCOPE.get()
            if current is not self:
                _heal(current, self)
            caught = self._leave(exc)
        except BaseException:
            # Something landed while leaving: finish leaving, then let it
            # through.
            self._leave(exc)
            raise
        if exc is None and not caught and self._reason is None:
            return False  # Neither claimed nor cancelled with a reason.
        return self._outcome(exc, caught)

    async def __aenter__(self) -> TimeoutScope:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)


# The code that must not be interrupted by our own alarm: entering and
# leaving a scope, arming and disarming.
_BOOKKEEPING: Final[frozenset[CodeType]] = frozenset(
    fn.__code__
    for fn in (
        TimeoutScope.__enter__,
        TimeoutScope.__exit__,
        TimeoutScope._enter,  # noqa: SLF001
        TimeoutScope._leave,  # noqa: SLF001
        TimeoutScope._abandon_entry,  # noqa: SLF001
        TimeoutScope._abandoned,  # noqa: SLF001
        TimeoutScope._note_with_frame,  # noqa: SLF001
        _heal,
        TimeoutScope.cancel,
        wake_on_cancel.__enter__,
        wake_on_cancel.__exit__,
        wake_on_cancel._leave,  # noqa: SLF001
        _Alarm.arm,
        _Alarm.disarm,
        _Alarm.disarm_scope,
        _Alarm._deliver,  # noqa: SLF001
    )
)
