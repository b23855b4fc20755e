"""
Timeout and cancel scopes, sync and async, and the SIGALRM interrupt.

A `TimeoutScope` sets the deadline context variable of `_core/_clock.py` (so
retry and everything else that reads it clips to it) and enforces it:

- in async code with an anyio cancel scope (asyncio and trio);
- in sync code with a cancel flag that the library's sleeps wait on (so
  `cancel()` from another thread wakes them) and, on request, a real
  interrupt of the main thread by ``SIGALRM`` (`_Alarm`).

Which scope fired is decided structurally: walking from the innermost scope
outward, the outermost one that was cancelled or whose own deadline passed
owns the cancellation, and only that one turns it into `TimedOut` (or
raises the reason it was cancelled with).

Asynchronous exceptions (KeyboardInterrupt, ``PyThreadState_SetAsyncExc``,
another scope's interrupt) may land at any bytecode boundary of entering or
leaving, so both are written to be finished by a second pass: ``__enter__``
undoes a partial entry, ``__exit__`` runs `_leave` again if an exception
landed in it, and every step of `_leave` (and of arming and disarming the
alarm) is one C-level operation recorded before it runs, or harmless to
repeat. The alarm's handler never raises while our bookkeeping is on the
stack (`_in_bookkeeping`).
"""

from __future__ import annotations

import contextlib
import dis
import inspect
import math
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Final, final

import anyio

from resilient._core import _clock, _loops
from resilient.exceptions import DeadlineExceeded, ScopeCancelled, TimedOut


if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType, TracebackType

    from resilient.typing import Clock


# Guards the children sets, wakers and cancel flags, which other threads
# touch.
_LOCK: Final = threading.Lock()

# A timer that is due "now" is armed for this long: zero would disarm it.
_SOON: Final = 1e-6

# How soon the interrupt comes back when it cannot raise now: our own
# bookkeeping runs (_AGAIN), or the code it stopped is still unwinding, or
# in case what it raised was swallowed (_RETRY).
_AGAIN: Final = 1e-4
_RETRY: Final = 1e-3

# The longest single real wait or timer: the OS refuses much longer ones
# (``setitimer`` past about 1e9 s on some platforms). A longer wait is
# cut into pieces of this size; a longer timer fires early and re-arms.
LONGEST_WAIT: Final = 1e6

_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001
_SCOPE: Final = _clock._SCOPE  # noqa: SLF001

# "Not read yet", for the values a partial entry puts back.
_UNSET: Final[Any] = object()

# Frames that can be suspended (generators, coroutines): not plain.
_SUSPENDABLE: Final = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)
_BEFORE_WITH: Final = dis.opmap.get("BEFORE_WITH", -1)


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
        name = "" if self._name is None else f" name={self._name!r}"
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

    def _sleeper(self) -> threading.Event:
        """The event `wait` sleeps on, made (already set if cancelled) once."""
        with _LOCK:
            event = self._event
            if event is None:
                event = threading.Event()
                if self._stopped:
                    event.set()
                self._event = event  # Stored set: `cancel` sets it from now.
        return event

    def _stop_locked(self) -> None:
        """Mark the scope cancelled and wake its sleeper (under `_LOCK`)."""
        self._stopped = True
        event = self._event
        if event is not None:
            event.set()

    def _note_fired(self) -> None:
        if not self._cancel_called:
            self._timed_out = True

    # -- entering and leaving ----------------------------------------------

    def _enter(self) -> None:
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
        self._parent = parent if isinstance(parent, TimeoutScope) else None
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
            cs = self._cs = anyio.CancelScope(
                deadline=anyio.current_time() + left
            )
            self._cs_open = True
            cs.__enter__()
            if self._cancel_called:
                cs.cancel()
        else:
            self._note_with_frame(sys._getframe(2))  # noqa: SLF001
            if self._interrupt:
                self._alarm = _Alarm.arm(self)

    def _note_with_frame(self, frame: FrameType) -> None:
        """
        Remember the frame of the ``with`` statement that entered this
        sync scope, if it is a plain function's (so it can only be running
        in this thread or finished), for `_abandoned`.
        """
        if (
            not frame.f_code.co_flags & _SUSPENDABLE
            and frame.f_code.co_code[frame.f_lasti] == _BEFORE_WITH
        ):
            self._with_frame = frame
            self._thread = threading.get_ident()

    def _abandoned(self) -> bool:
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

    def _abandon_entry(self) -> None:
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

    def _leave(self, exc: BaseException | None) -> bool:
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

    def _claims(self, exc: BaseException | None, caught: bool) -> bool:
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

    def _outcome(self, exc: BaseException | None, caught: bool) -> bool:
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
                raise TimedOut(
                    self.at, self, self._allowed(), self._name
                ) from exc
            # Our cancel scope fired at an enclosing deadline (a cooperative
            # one, or an enclosing scope's at the same instant): pass it on
            # as that deadline's, for the enclosing scope to claim.
            raise DeadlineExceeded(self._outer_at) from exc
        self.cancelled_caught = True
        if reason is not None:
            raise reason
        return True

    def _allowed(self) -> float:
        """The seconds the scope allowed from its entry."""
        seconds, _ = self._request
        return seconds if seconds is not None else self._own - self._entered_at

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


def _heal(scope: object, until: TimeoutScope | None) -> None:
    """
    Finish leaving the scopes, from *scope* outward (up to *until*), whose
    ``with`` statement is gone without leaving them (`_abandoned`): so a
    scope an exception skipped the exit of is left at the next scope's
    entry or an enclosing scope's exit in the same thread.
    """
    while (
        isinstance(scope, TimeoutScope)
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


def _encloses(outer: TimeoutScope, inner: TimeoutScope) -> bool:
    """Whether *inner* is *outer* or was entered inside it."""
    s: TimeoutScope | None = inner
    while s is not None and s is not outer:
        s = s._parent  # noqa: SLF001
    return s is not None


def _poke(scope: TimeoutScope) -> None:
    """Interrupt the main thread now if *scope* is inside an alarm."""
    if threading.current_thread() is threading.main_thread():
        return  # The main thread's next wait or checkpoint sees it.
    for alarm in _ALARMS:
        if _encloses(scope, alarm.scope) or _encloses(alarm.scope, scope):
            main = threading.main_thread().ident
            assert main is not None  # noqa: S101
            signal.pthread_kill(main, signal.SIGALRM)
            return


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
        self._scope = scope if isinstance(scope, TimeoutScope) else None

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


# -- The main-thread interrupt ---------------------------------------------


@final
class _Alarm:
    """
    The real interrupt of one sync scope in the main thread: a ``SIGALRM``
    handler and an ``ITIMER_REAL`` timer, nested by saving and restoring
    the previous handler and timer.

    The previous timer (the application's, or an enclosing scope's) keeps
    running in our bookkeeping: when it falls due first, its handler gets
    the signal with the timer set as it would be without us (its interval
    re-armed), so the handler may re-arm or change it; we read the timer
    back, then arm ours for whichever is due first. Leaving puts back the
    previous handler and its timer, interval included.
    """

    __slots__ = (
        "_armed",
        "_handler_back",
        "_prev_due",
        "_prev_handler",
        "_prev_interval",
        "_raised",
        "_timer_back",
        "scope",
    )

    def __init__(self, scope: TimeoutScope, prev: Any) -> None:
        self.scope = scope
        self._prev_handler = prev
        delay, self._prev_interval = signal.getitimer(signal.ITIMER_REAL)
        self._prev_due = _now() + delay if delay > 0 else math.inf
        self._armed = False
        self._handler_back = False
        self._timer_back = False
        self._raised: BaseException | None = None

    @classmethod
    def arm(cls, scope: TimeoutScope) -> _Alarm | None:
        """Arm an interrupt for *scope*, or None where Python allows none."""
        if (
            not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()
        ):
            return None
        prev = signal.getsignal(signal.SIGALRM)
        if prev is None:  # A handler installed from C: leave it alone.
            return None
        alarm = cls(scope, prev)
        # On the stack first, so that leaving finds it whatever step an
        # exception interrupts; armed before installed, so that a signal
        # due meanwhile is deferred (we are in our bookkeeping), not lost.
        _ALARMS.append(alarm)
        alarm._armed = True
        signal.signal(signal.SIGALRM, alarm.on_signal)
        alarm.set_timer()
        return alarm

    @staticmethod
    def disarm_scope(scope: TimeoutScope) -> None:
        """Disarm *scope*'s alarm, found on the stack if its record is lost."""
        alarm = scope._alarm  # noqa: SLF001
        if alarm is None:
            for a in _ALARMS:
                if a.scope is scope:
                    alarm = a
        if alarm is not None:
            alarm.disarm()
        scope._alarm = None  # noqa: SLF001

    def set_timer(self) -> None:
        """Arm the timer for the earlier of our deadline and the previous."""
        left = min(
            self.scope.at - self.scope._clock.now(),  # noqa: SLF001
            self._prev_due - _now(),
        )
        if left < math.inf:
            signal.setitimer(
                signal.ITIMER_REAL, min(max(left, _SOON), LONGEST_WAIT)
            )

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The handler: deliver a due previous timer, raise, or re-arm."""
        if not self._armed:
            return
        if _in_bookkeeping(frame):
            # Inside our own entering or leaving: raising here would break
            # it. Come back a moment later.
            signal.setitimer(signal.ITIMER_REAL, _AGAIN)
            return
        if self._in_flight():
            # The code being stopped still handles what we raised.
            signal.setitimer(signal.ITIMER_REAL, _RETRY)
            return
        try:
            if _now() >= self._prev_due:
                self._deliver(signum, frame)
        finally:
            self._fire_or_rearm()

    def _fire_or_rearm(self) -> None:
        """Raise if the scope (or an enclosing one) fired; else re-arm."""
        current = _SCOPE.get()
        scope = current if current is not None else self.scope
        try:
            scope.check()
        except BaseException as exc:
            self._raised = exc
            # Raised inside a finalizer (a generator closed by the garbage
            # collector, a __del__), it would be swallowed: until the scope
            # is left, come back a moment later.
            signal.setitimer(signal.ITIMER_REAL, _RETRY)
            raise
        self.set_timer()

    def _in_flight(self) -> bool:
        """Whether the code interrupted is handling what we last raised."""
        raised = self._raised
        if raised is None:
            return False
        exc = sys.exception()
        for _ in range(100):  # Bounded: a context chain may loop.
            if exc is None:
                return False
            if exc is raised:
                return True
            exc = exc.__context__
        return False  # pragma: no cover

    def _deliver(self, signum: int, frame: FrameType | None) -> None:
        """The previous timer is due: what would happen without us."""
        now = _now()
        interval = self._prev_interval
        due = math.inf
        if interval > 0:
            late = max(now - self._prev_due, 0.0)
            due = self._prev_due + interval * (math.floor(late / interval) + 1)
        self._prev_due = due
        handler = self._prev_handler
        if not callable(handler):
            return  # SIG_IGN, or SIG_DFL which we do not let kill.
        if due < math.inf:
            signal.setitimer(
                signal.ITIMER_REAL, max(due - now, _SOON), interval
            )
        else:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            handler(signum, frame)
        finally:
            # The handler may have re-armed or changed its timer.
            delay, self._prev_interval = signal.getitimer(signal.ITIMER_REAL)
            self._prev_due = _now() + delay if delay > 0 else math.inf

    def disarm(self) -> None:
        """
        Stop the timer and put the previous handler and timer back; each
        step once, however often an exception interrupts and this runs
        again.

        No signal is blocked meanwhile: CPython runs the handler of a
        signal that the OS hands to another thread only when something
        else wakes the main thread's eval loop, so a blocked SIGALRM could
        be missed for good.
        """
        if self._armed:
            self._armed = False
            # A SIGALRM that fired just before runs our handler right
            # after this call, now disarmed.
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self in _ALARMS:
            _ALARMS.remove(self)
        if not self._handler_back:
            signal.signal(signal.SIGALRM, self._prev_handler)
            self._handler_back = True
        if not self._timer_back:
            if self._prev_due < math.inf:
                signal.setitimer(
                    signal.ITIMER_REAL,
                    min(max(self._prev_due - _now(), _SOON), LONGEST_WAIT),
                    self._prev_interval,
                )
            self._timer_back = True


# The armed alarms, outermost first (main thread only).
_ALARMS: Final[list[_Alarm]] = []

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


def _in_bookkeeping(frame: FrameType | None) -> bool:
    """Whether *frame* or a caller runs our entering or leaving."""
    while frame is not None:
        if frame.f_code in _BOOKKEEPING:
            return True
        frame = frame.f_back
    return False


def _now() -> float:
    """Real monotonic time: signal timers run on it whatever the clock."""
    return _clock.DEFAULT_CLOCK.now()
