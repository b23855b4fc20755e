"""
Timeouts and cancellation scopes, sync and async.

A `TimeoutScope` sets the deadline context variable of `_core/_clock.py` (so
retry and everything else that reads it clips to it) and enforces it:

- in async code with an anyio cancel scope (asyncio and trio);
- in sync code with a cancel flag that the library's sleeps wait on (so
  `cancel()` from another thread wakes them) and, on request, a real
  interrupt of the main thread by ``SIGALRM`` (`_Alarm`).

Which scope fired is decided structurally: walking from the innermost scope
outward, the outermost one that was cancelled or whose own deadline passed
owns the cancellation, and only that one turns it into `TimedOut`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, final

import anyio

from resilient._core import _clock
from resilient.exceptions import (
    ConfigError,
    ConfigTypeError,
    DeadlineExceeded,
    ScopeCancelled,
    TimedOut,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType, TracebackType

    from resilient.typing import Clock


# Guards the children sets and cancel flags, which other threads touch.
_LOCK: Final = threading.Lock()

# A timer that is due "now" is armed for this long: zero would disarm it.
_SOON: Final = 1e-6


def _async_library() -> str | None:
    """The async library running in this thread, or None in sync code."""
    try:
        import sniffio  # noqa: PLC0415
    except ImportError:  # pragma: no cover - trio brings sniffio
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return "asyncio"
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def _loop_caller(library: str) -> Callable[[Callable[[], object]], None]:
    """How another thread asks the running event loop to call something."""
    if library == "trio":
        import trio  # noqa: PLC0415

        token = trio.lowlevel.current_trio_token()
        return token.run_sync_soon
    loop = asyncio.get_running_loop()

    def call(fn: Callable[[], object]) -> None:
        loop.call_soon_threadsafe(fn)

    return call


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
    After `cancel()` the block ends quietly and `cancelled_caught` is True.

    A scope is entered once.
    """

    __slots__ = (
        "_alarm",
        "_cancel_called",
        "_children",
        "_clock",
        "_cs",
        "_event",
        "_interrupt",
        "_loop_call",
        "_loop_thread",
        "_outer_at",
        "_own",
        "_parent",
        "_request",
        "_state",
        "_timed_out",
        "_tokens",
        "_wakers",
        "at",
        "cancelled_caught",
    )

    def __init__(
        self, *, seconds: float | None, at: float | None, interrupt: bool
    ) -> None:
        self._request = (seconds, at)
        self._interrupt = interrupt
        self._state = "new"
        self._clock: Clock = _clock.get_clock()
        self._own = math.inf
        self._outer_at = math.inf
        self.at = math.inf
        """The absolute deadline once entered: the scope's own, or an
        enclosing one if that is earlier (on resilient's clock)."""
        self._parent: TimeoutScope | None = None
        self._children: set[TimeoutScope] = set()
        self._event = threading.Event()
        self._cancel_called = False
        self._timed_out = False
        self._tokens: tuple[Any, Any] | None = None
        self._cs: anyio.CancelScope | None = None
        self._wakers: list[Callable[[], object]] = []
        self._loop_call: Callable[[Callable[[], object]], None] | None = None
        self._loop_thread = 0
        self._alarm: _Alarm | None = None
        self.cancelled_caught = False
        """Whether this scope stopped its block (by `cancel()` or its own
        deadline); an enclosing scope firing does not count."""

    def __repr__(self) -> str:
        seconds, at = self._request
        what = f"seconds={seconds!r}" if at is None else f"at={at!r}"
        return f"<TimeoutScope {what} {self._state}>"

    # -- what user code asks ------------------------------------------------

    def remaining(self) -> float:
        """
        Seconds left before the scope fires; `math.inf` if never, 0.0 once
        expired or cancelled.
        """
        if self._event.is_set():
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
        return self._event.is_set()

    @property
    def interrupting(self) -> bool:
        """Whether a real ``SIGALRM`` interrupt is armed for this scope."""
        return self._alarm is not None

    def cancel(self) -> None:
        """
        Stop the block: its waits wake at once and raise, here or in any
        thread; the scope then ends quietly. Safe to call from any thread,
        any number of times, before, inside or after the block.
        """
        wake: list[Callable[[], object]] = []
        with _LOCK:
            self._cancel_called = True
            todo = [self]
            while todo:
                scope = todo.pop()
                scope._event.set()  # noqa: SLF001
                wake.extend(scope._wakers)  # noqa: SLF001
                todo.extend(scope._children)  # noqa: SLF001
        for callback in wake:
            callback()
        if self._state != "entered":
            return
        if self._cs is not None:
            if threading.get_ident() == self._loop_thread:
                self._cs.cancel()
            elif self._loop_call is not None:  # pragma: no branch
                with contextlib.suppress(RuntimeError):  # The loop is gone.
                    self._loop_call(self._cs.cancel)
        _Alarm.poke(self)

    # -- what the sleeps ask (the `_clock._Scope` protocol) ----------------

    def wake_at(self) -> float:
        """When the innermost scope fires on the clock; -inf if cancelled."""
        return -math.inf if self._event.is_set() else self.at

    def check(self) -> None:
        """Raise (or, in the event loop, cancel) if the scope has fired."""
        fired = _fired(self, self._clock.now())
        if fired is None:
            return
        if isinstance(fired, float):
            raise DeadlineExceeded(fired)
        fired._note_fired()  # noqa: SLF001
        if fired._cs is not None and (  # noqa: SLF001
            threading.get_ident() == fired._loop_thread  # noqa: SLF001
        ):
            # Let anyio raise its own cancellation at the next checkpoint:
            # it crosses task groups, ours would not.
            fired._cs.cancel()  # noqa: SLF001
            return
        raise ScopeCancelled(fired)

    def wait(self, seconds: float) -> None:
        """Block up to *seconds* of real time, waking when the scope fires."""
        self.check()
        # The sleep runs on real time; the scope fires on resilient's clock.
        end = _now() + max(seconds, 0.0)
        while True:
            left = end - _now()
            if left <= 0:
                break
            self._event.wait(min(left, self.wake_at() - self._clock.now()))
            self.check()

    def _note_fired(self) -> None:
        if not self._cancel_called:
            self._timed_out = True

    # -- entering and leaving ----------------------------------------------

    def _enter(self) -> TimeoutScope:
        if self._state != "new":
            raise RuntimeError("a TimeoutScope can be entered only once")
        self._state = "entered"
        clock = self._clock = _clock.get_clock()
        seconds, at = self._request
        now = clock.now()
        if at is not None:
            self._own = at
        elif seconds is not None:
            self._own = now + seconds
        self._outer_at = _clock.current_deadline()
        self.at = min(self._own, self._outer_at)
        parent = _clock._SCOPE.get()  # noqa: SLF001
        self._parent = parent if isinstance(parent, TimeoutScope) else None
        if self._parent is not None:
            with _LOCK:
                self._parent._children.add(self)  # noqa: SLF001
                if self._parent._event.is_set():  # noqa: SLF001
                    self._event.set()
        self._tokens = (
            _clock._DEADLINE.set(self.at),  # noqa: SLF001
            _clock._SCOPE.set(self),  # noqa: SLF001
        )
        library = _async_library()
        if library is not None:
            self._loop_thread = threading.get_ident()
            self._loop_call = _loop_caller(library)
            left = self.at - now
            self._cs = anyio.CancelScope(deadline=anyio.current_time() + left)
            self._cs.__enter__()
            if self._cancel_called:
                self._cs.cancel()
        elif self._interrupt:
            self._alarm = _Alarm.arm(self)
        return self

    def _exit(self, exc: BaseException | None) -> bool:
        """Leave the scope; True swallows *exc*, or raise what replaces it."""
        if self._alarm is not None:
            self._alarm.disarm()
            self._alarm = None
        caught = False
        if self._cs is not None:
            # trio's scope returns True on a clean exit too: read the flag.
            self._cs.__exit__(
                type(exc) if exc is not None else None,
                exc,
                exc.__traceback__ if exc is not None else None,
            )
            caught = self._cs.cancelled_caught
            if caught:
                self._note_fired()
        assert self._tokens is not None  # noqa: S101
        _clock._SCOPE.reset(self._tokens[1])  # noqa: SLF001
        _clock._DEADLINE.reset(self._tokens[0])  # noqa: SLF001
        self._tokens = None
        if self._parent is not None:
            with _LOCK:
                self._parent._children.discard(self)  # noqa: SLF001
        self._state = "exited"
        if isinstance(exc, ScopeCancelled) and exc.scope is self:
            caught = True
        elif (
            type(exc) is DeadlineExceeded
            and exc.deadline == self.at
            and self._own < self._outer_at
        ):
            # Our own deadline, seen by `checkpoint()` or a retry attempt.
            self._timed_out = True
            caught = True
        if not caught:
            return False
        if not self._timed_out:
            self.cancelled_caught = True
            return True
        if self._own < self._outer_at:
            self.cancelled_caught = True
            raise TimedOut(self.at, self) from exc
        # Our cancel scope fired at an enclosing deadline (a cooperative one,
        # or an enclosing scope's at the same instant): pass it on as that
        # deadline's, for the enclosing scope to claim.
        raise DeadlineExceeded(self._outer_at) from exc

    def __enter__(self) -> TimeoutScope:
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._exit(exc)

    async def __aenter__(self) -> TimeoutScope:
        return self._enter()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._exit(exc)


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


def check_scope() -> None:
    """
    Raise if the current scope (or an enclosing one) was cancelled or its
    deadline passed; nothing outside scopes.

    For the waits of other primitives that do not sleep on the clock (a
    condition variable, a queue): call it before and after each wait.
    """
    scope = _clock._SCOPE.get()  # noqa: SLF001
    if scope is not None:
        scope.check()


@contextlib.contextmanager
def wake_on_cancel(callback: Callable[[], object]) -> Iterator[None]:
    """
    Call *callback* if the current scope (or an enclosing one) is cancelled
    while inside this block; at once if it already is.

    For waits that are not clock sleeps: *callback* wakes the waiter (say,
    ``notify_all()`` under the condition's lock), which then calls
    `check_scope`. It runs in the thread that calls ``cancel()``, and must
    not raise.
    """
    scope = _clock._SCOPE.get()  # noqa: SLF001
    if not isinstance(scope, TimeoutScope):
        yield
        return
    with _LOCK:
        scope._wakers.append(callback)  # noqa: SLF001
        already = scope._event.is_set()  # noqa: SLF001
    if already:
        callback()
    try:
        yield
    finally:
        with _LOCK:
            scope._wakers.remove(callback)  # noqa: SLF001


@final
class _Alarm:
    """
    The real interrupt of one sync scope in the main thread: a ``SIGALRM``
    handler and an ``ITIMER_REAL`` timer, nested by saving and restoring
    the previous handler and timer.
    """

    __slots__ = (
        "_armed",
        "_prev_delivered",
        "_prev_due",
        "_prev_handler",
        "_prev_interval",
        "scope",
    )

    def __init__(self, scope: TimeoutScope, prev: Any) -> None:
        self.scope = scope
        self._prev_handler = prev
        delay, self._prev_interval = signal.getitimer(signal.ITIMER_REAL)
        self._prev_due = _now() + delay if delay > 0 else math.inf
        self._prev_delivered = False
        self._armed = False

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
        signal.signal(signal.SIGALRM, alarm.on_signal)
        _ALARMS.append(alarm)
        alarm._armed = True
        alarm.set_timer()
        return alarm

    @classmethod
    def poke(cls, scope: TimeoutScope) -> None:
        """Interrupt the main thread now if *scope* is inside an alarm."""
        if threading.current_thread() is threading.main_thread():
            return  # The main thread's next wait or checkpoint sees it.
        for alarm in _ALARMS:
            if _encloses(scope, alarm.scope) or _encloses(alarm.scope, scope):
                main = threading.main_thread().ident
                assert main is not None  # noqa: S101
                signal.pthread_kill(main, signal.SIGALRM)
                return

    def set_timer(self) -> None:
        """Arm the timer for the earlier of our deadline and the previous."""
        left = self.scope.at - self.scope._clock.now()  # noqa: SLF001
        if not self._prev_delivered:
            left = min(left, self._prev_due - _now())
        if left < math.inf:
            signal.setitimer(signal.ITIMER_REAL, max(left, _SOON))

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The handler: delegate to a due previous timer, raise, or re-arm."""
        if not self._armed:
            return
        if frame is not None and frame.f_code.co_filename == __file__:
            # Inside our own bookkeeping (a scope being left): raising here
            # would escape it. Come back a moment later.
            signal.setitimer(signal.ITIMER_REAL, _SOON * 100)
            return
        if not self._prev_delivered and _now() >= self._prev_due:
            self._prev_delivered = True
            if callable(self._prev_handler):
                self._prev_handler(signum, frame)
        current = _clock._SCOPE.get()  # noqa: SLF001
        scope = current if isinstance(current, TimeoutScope) else self.scope
        scope.check()
        self.set_timer()

    def disarm(self) -> None:
        """Stop the timer and put the previous handler and timer back."""
        self._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._prev_handler)
        _ALARMS.remove(self)
        if self._prev_due < math.inf and not (
            self._prev_delivered and self._prev_handler not in _handlers()
        ):
            signal.setitimer(
                signal.ITIMER_REAL,
                max(self._prev_due - _now(), _SOON),
                self._prev_interval,
            )


# The armed alarms, outermost first (main thread only).
_ALARMS: Final[list[_Alarm]] = []


def _handlers() -> list[object]:
    """The handlers of the alarms still armed: ours, not the user's."""
    return [a.on_signal for a in _ALARMS]


def _now() -> float:
    """Real monotonic time: signal timers run on it whatever the clock."""
    return _clock.DEFAULT_CLOCK.now()


def _seconds(name: str, value: object) -> float | None:
    """Validate a duration: a number or timedelta >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigTypeError(
            name, value, "must be a number of seconds, a timedelta or None"
        )
    if math.isnan(value) or value < 0:
        raise ConfigError(name, value, "must be >= 0")
    return float(value)


def timeout(
    seconds: float | timedelta | None, *, interrupt: bool = False
) -> TimeoutScope:
    """
    A scope that stops its block after *seconds*, raising `TimedOut`.

    Use it as ``with`` in sync code and as ``with`` or ``async with`` in
    async code (asyncio or trio, detected when entered)::

        with resilient.timeout(2.0):
            resilient.checkpoint()

        async with resilient.timeout(2.0):
            await client.get(url)

    It nests with every other deadline: an inner one can only shrink the
    time left, and the one whose time ran out raises. Everything inside
    sees the deadline through `resilient.remaining()`.

    Args:
        seconds: Time allowed from entry, in seconds (or a timedelta);
            None sets no limit of its own, which still makes a scope
            that `TimeoutScope.cancel` can stop.
        interrupt: In sync code in the main thread, also interrupt
            blocking code (``time.sleep``, socket reads, lock waits...)
            with ``SIGALRM``; ignored elsewhere and in async code.
            Off by default: see the timeouts guide for what it can break.

    Raises:
        ConfigError: *seconds* is negative or NaN.
        ConfigTypeError: *seconds* is not a number, timedelta or None.

    .. versionadded:: 26.11.0
    """
    s = _seconds("timeout(seconds)", seconds)
    return TimeoutScope(seconds=s, at=None, interrupt=_flag(interrupt))


def timeout_at(
    deadline: float | None, *, interrupt: bool = False
) -> TimeoutScope:
    """
    A scope that stops its block at the absolute time *deadline*.

    Like `timeout`, with the deadline read on resilient's clock
    (`time.monotonic` unless a test installed a fake clock), for example
    ``time.monotonic() + 5`` or another scope's ``at``.

    Args:
        deadline: Absolute time in seconds on resilient's clock; None sets
            no limit of its own.
        interrupt: As for `timeout`.

    Raises:
        ConfigError: *deadline* is NaN.
        ConfigTypeError: *deadline* is not a number or None.

    .. versionadded:: 26.11.0
    """
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise ConfigTypeError(
                "timeout_at(deadline)", deadline, "must be a number or None"
            )
        if math.isnan(deadline):
            raise ConfigError("timeout_at(deadline)", deadline, "is NaN")
        deadline = float(deadline)
    return TimeoutScope(seconds=None, at=deadline, interrupt=_flag(interrupt))


def _flag(interrupt: object) -> bool:
    if not isinstance(interrupt, bool):
        raise ConfigTypeError(
            "timeout(interrupt)", interrupt, "must be a bool"
        )
    return interrupt


# -- Request headers ---------------------------------------------------------
#
# The value uses gRPC's ``grpc-timeout`` syntax: 1 to 8 ASCII digits and a
# unit, H (hours), M (minutes), S (seconds), m (milliseconds), u
# (microseconds) or n (nanoseconds). gRPC servers, Envoy and other proxies
# read it as is.

_UNITS: Final = (
    ("n", 1e-9),
    ("u", 1e-6),
    ("m", 1e-3),
    ("S", 1.0),
    ("M", 60.0),
    ("H", 3600.0),
)
_UNIT_SECONDS: Final = dict(_UNITS)
_MAX_VALUE: Final = 99_999_999


def deadline_header(seconds: float | None = None) -> str | None:
    """
    The time left, as a header value to pass on with an outgoing request.

    Encodes in gRPC's ``grpc-timeout`` syntax (``"1500m"`` is 1.5 s): the
    finest unit that fits in 8 digits, rounded down so the callee is never
    promised more time than is left. Send it as ``grpc-timeout`` to gRPC
    services, or under a header name of your choice elsewhere.

    Args:
        seconds: The time to encode; None reads `resilient.remaining()`.

    Returns:
        The value, or None when there is no deadline (send no header).

    Raises:
        ConfigError: *seconds* is negative or NaN.

    .. versionadded:: 26.11.0
    """
    if seconds is None:
        seconds = _clock.remaining()
    else:
        seconds = _seconds("deadline_header(seconds)", seconds)
        assert seconds is not None  # noqa: S101
    if seconds == math.inf:
        return None
    for unit, size in _UNITS:
        # A nanosecond of slack absorbs float error: 0.3 s is 300000000n
        # even though 0.3 / 1e-9 is a hair below.
        value = math.floor(seconds / size + 1e-9)
        if value <= _MAX_VALUE:
            return f"{value}{unit}"
    return f"{_MAX_VALUE}H"


def parse_deadline_header(value: str | bytes) -> float:
    """
    The seconds in a ``grpc-timeout`` style header value.

    Raises:
        ValueError: *value* is not 1 to 8 ASCII digits and one of the
            units H, M, S, m, u, n.

    .. versionadded:: 26.11.0
    """
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if not isinstance(text, str):
        raise TypeError(
            f"a deadline header must be str or bytes, got {value!r}"
        )
    text = text.strip()
    digits, unit = text[:-1], text[-1:]
    if (
        not 1 <= len(digits) <= 8
        or not (digits.isascii() and digits.isdigit())
        or unit not in _UNIT_SECONDS
    ):
        raise ValueError(
            f"bad deadline header {value!r}: expected 1 to 8 digits and a "
            "unit H, M, S, m, u or n, like '1500m'"
        )
    return int(digits) * _UNIT_SECONDS[unit]


def deadline_from_header(
    value: str | bytes | None,
    *,
    cap: float | timedelta | None = None,
    interrupt: bool = False,
) -> TimeoutScope:
    """
    A timeout scope for the budget an incoming request brought.

    ::

        with resilient.deadline_from_header(
            request.headers.get("grpc-timeout"), cap=30
        ):
            handle(request)

    Args:
        value: The header value (see `deadline_header`); None or empty
            means the caller sent none, which makes a scope with no limit.
        cap: The most time to grant whatever the header says, in seconds;
            None grants what it says. Enclosing deadlines still apply.
        interrupt: As for `timeout`.

    Raises:
        ValueError: *value* is not a valid header value.
        ConfigError: *cap* is negative or NaN.

    .. versionadded:: 26.11.0
    """
    limit = _seconds("deadline_from_header(cap)", cap)
    seconds: float | None = None
    if value is not None and value not in {"", b""}:
        seconds = parse_deadline_header(value)
    if limit is not None:
        seconds = limit if seconds is None else min(seconds, limit)
    return TimeoutScope(seconds=seconds, at=None, interrupt=_flag(interrupt))
