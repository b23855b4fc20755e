"""
The real interrupt of a sync scope in the main thread: `_Alarm`, a
``SIGALRM`` handler and an ``ITIMER_REAL`` timer per scope, nested on the
stack of armed alarms (`_ALARMS`); `_poke`, which signals the main thread
at once when another thread cancels a scope an alarm is armed for; and
`_in_bookkeeping`, the rule that the handler never raises while a scope's
own entering or leaving runs (the code it must not stop is
`resilient._timeout._scope._BOOKKEEPING`, gathered where every piece of it
is defined).

Arming and disarming are written like leaving a scope: each step is one
C-level operation recorded before it runs, or harmless to repeat, so an
exception landing between two of them is finished by running them again.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Final, final

from resilient._core import _clock
from resilient._timeout._shared import (
    _AGAIN,
    _RETRY,
    _SOON,
    LONGEST_WAIT,
    _now,
)


if TYPE_CHECKING:
    from types import FrameType

    from resilient._timeout._scope import TimeoutScope


# Assigned, not imported: see `_shared`.
_SCOPE: Final = _clock._SCOPE  # noqa: SLF001


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


def _in_bookkeeping(frame: FrameType | None) -> bool:
    """Whether *frame* or a caller runs our entering or leaving."""
    while frame is not None:
        if frame.f_code in _scope._BOOKKEEPING:  # noqa: SLF001
            return True
        frame = frame.f_back
    return False


# Last, as this module is complete by then: `_scope` imports it to build
# the class, and Python may load either first.
from resilient._timeout import _scope  # noqa: E402
