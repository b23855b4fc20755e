"""
The clock seam and deadlines.

Everything in resilient reads time and waits through a `Clock`, so tests can
swap in a `FakeClock` and run in virtual time.
Deadlines are absolute readings of the clock kept in a context variable; they
nest (an inner deadline can only shrink) and follow tasks and threads that copy
the context.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import math
import threading
import time
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import anyio
import anyio.lowlevel
import attrs

from resilient._core import _loops
from resilient.exceptions import ConfigError, ConfigTypeError, DeadlineExceeded


if TYPE_CHECKING:
    from types import TracebackType

    from resilient.typing import Clock


# The longest single `time.sleep`: the OS refuses much longer ones.
_LONGEST_SLEEP: Final = 1e6


@final
class MonotonicClock:
    """
    The real clock: `time.monotonic` and real sleeps.

    Wall-clock jumps (NTP, daylight saving, a user's `date -s`) never move it.
    """

    __slots__ = ()

    def now(self) -> float:
        """
        Seconds on the monotonic clock.
        """
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """
        Block the calling thread for *seconds*.

        Inside a cancel scope (`resilient.timeout`) the wait ends early,
        raising, when the scope is cancelled (from any thread) or its
        deadline passes.

        Raises:
            RuntimeError: *seconds* > 0 on a thread that runs an event
                loop, which the sleep would block: use `asleep`.

        .. versionchanged:: 26.12.0
           A blocking sleep on an event loop's thread raises.
        """
        scope = _SCOPE.get()
        if scope is not None:
            scope.wait(seconds)
            return
        if not seconds > 0:
            return
        _loops.refuse_blocking(
            f"a blocking sleep of {seconds:.3f} s (MonotonicClock.sleep)",
            "`await MonotonicClock().asleep(...)` or the async forms of "
            "resilient (async def functions, `async for attempt in "
            "retrying(...)`)",
        )
        while seconds > _LONGEST_SLEEP:  # The OS refuses very long sleeps.
            time.sleep(_LONGEST_SLEEP)
            seconds -= _LONGEST_SLEEP
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        """
        Wait *seconds* in the running event loop (asyncio or trio).

        A zero wait is a single checkpoint, so cancellation is still seen.
        """
        if seconds > 0:
            await anyio.sleep(seconds)
        else:
            await anyio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return "MonotonicClock()"


@final
class FakeClock:
    """
    A clock for tests: time stands still until something sleeps or advances it.

    A sleep, sync or async, moves the clock forward by the time asked and
    returns at once (the async one after a single checkpoint, so other tasks
    and cancellation still get their turn).
    Safe to share between threads.

    Args:
        start: The first reading, in seconds.
    """

    __slots__ = ("_lock", "_now", "sleeps")

    def __init__(self, start: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._now = float(start)
        self.sleeps: list[float] = []
        """Every sleep asked of this clock, in order, in seconds."""

    def now(self) -> float:
        """
        The current virtual time, in seconds.
        """
        return self._now

    def advance(self, seconds: float) -> None:
        """
        Move the clock forward by *seconds* (never backward).

        Raises:
            ValueError: *seconds* is negative or NaN.
        """
        if not seconds >= 0:
            raise ValueError(
                f"FakeClock.advance() takes seconds >= 0, got {seconds!r}"
            )
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        """
        Record the sleep and advance the clock by it, without blocking.

        Inside a cancel scope (`resilient.timeout`) the clock stops at the
        scope's deadline and the sleep raises, or raises at once when the
        scope is already cancelled.
        """
        scope = _SCOPE.get()
        with self._lock:
            self.sleeps.append(seconds)
            step = seconds if seconds > 0 else 0.0
            if scope is not None:
                step = min(step, max(scope.wake_at() - self._now, 0.0))
            self._now += step
        if scope is not None:
            scope.check()

    async def asleep(self, seconds: float) -> None:
        """
        Record the sleep, advance the clock by it and yield once.
        """
        self.sleep(seconds)
        await anyio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now!r})"


DEFAULT_CLOCK: Final = MonotonicClock()

# One process-wide override, not a context variable: a fake clock installed by
# a test must also be seen by threads the test starts.
_clock: Clock = DEFAULT_CLOCK


def get_clock() -> Clock:
    """
    The clock resilient reads now: the real one unless a test swapped it.
    """
    return _clock


def set_clock(clock: Clock) -> Clock:
    """
    Install *clock* for the whole process and return the previous one.
    """
    global _clock
    previous, _clock = _clock, clock
    return previous


class _Scope(Protocol):
    """
    A cancel scope as the sleeps see it; `resilient._timeout` makes them.
    """

    def wait(self, seconds: float) -> None:
        """Block up to *seconds* of real time; raise if the scope fires."""

    def wake_at(self) -> float:
        """When the scope fires, on the clock (-inf once cancelled)."""

    def check(self, *, raise_reason: bool = False) -> None:
        """
        Raise (or cancel the async scope) if the scope has fired; with
        *raise_reason*, the reason a scope was cancelled with.
        """


# The innermost cancel scope of the current context, or None. The sleeps
# hand their wait to it so that cancelling the scope wakes them.
_SCOPE: Final[contextvars.ContextVar[_Scope | None]] = contextvars.ContextVar(
    "resilient_scope", default=None
)


# The absolute deadline of the current context, on the current clock.
# `inf` means no deadline.
_DEADLINE: Final[contextvars.ContextVar[float]] = contextvars.ContextVar(
    "resilient_deadline", default=math.inf
)


def current_deadline() -> float:
    """
    The absolute deadline of the current context, or `math.inf` if none.
    """
    return _DEADLINE.get()


def remaining() -> float:
    """
    Seconds left before the innermost deadline, or `math.inf` if none.

    Never negative: an expired deadline leaves 0.0.
    To pass the time left to a client that takes None for "no limit" (and
    fails on `math.inf`), use `remaining_or_none`.

    .. versionadded:: 26.11.0
    """
    at = _DEADLINE.get()
    if at == math.inf:
        return math.inf
    return max(0.0, at - _clock.now())


def remaining_or_none() -> float | None:
    """
    Seconds left before the innermost deadline, or None if there is none.

    The form HTTP and database clients take for their own timeouts, where
    None means "no limit" and `math.inf` fails
    (``httpx.get(url, timeout=resilient.remaining_or_none())``).
    Never negative: an expired deadline leaves 0.0.

    .. versionadded:: 26.12.0
    """
    at = _DEADLINE.get()
    if at == math.inf:
        return None
    return max(0.0, at - _clock.now())


def checkpoint() -> None:
    """
    Raise `DeadlineExceeded` if the innermost deadline has passed.

    Long-running sync code calls this between steps so that a deadline set
    further up the stack stops it.

    Inside a `resilient.timeout` scope it also raises when the scope was
    cancelled (from any thread) or its deadline passed, the way the scope
    itself raises; a scope cancelled with a reason
    (``scope.cancel(reason)``) raises that reason.

    Raises:
        DeadlineExceeded: The deadline has passed.

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       Raises the reason a scope was cancelled with.
    """
    at = _DEADLINE.get()
    if at != math.inf and _clock.now() >= at:
        raise DeadlineExceeded(at)
    scope = _SCOPE.get()
    if scope is not None:
        scope.check(raise_reason=True)


def int_seconds(name: str, value: int, *, signed: bool = False) -> float:
    """
    An int number of seconds as a float: one too large for a float is
    `math.inf` (no limit in practice; ``-math.inf`` if *signed*).

    Raises:
        ConfigError: *value* is negative and not *signed*.
    """
    if value < 0 and not signed:
        raise ConfigError(name, value, "must be >= 0")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _to_seconds(value: object) -> object:
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, int) and not isinstance(value, bool):
        return int_seconds("deadline(seconds=...)", value)
    return value


def _check_seconds(
    _inst: object, _attribute: attrs.Attribute[Any], value: object
) -> None:
    """Any number of seconds >= 0; inf is allowed (no limit)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigTypeError(
            "deadline(seconds=...)",
            value,
            "must be a number of seconds or None",
        )
    if math.isnan(value) or value < 0:
        raise ConfigError("deadline(seconds=...)", value, "must be >= 0")


@final
@attrs.define(eq=False, repr=False)
class Deadline:
    """
    A deadline scope: code inside sees at most *seconds* left.

    Nests: an inner scope can only shrink the time left, never extend it.
    Propagates through context variables to everything called inside it,
    including tasks spawned inside it and threads started with a copied
    context (`anyio.to_thread.run_sync` does this).

    It is cooperative: it does not stop running code by itself.
    Everything in resilient that waits honours it, and user code asks
    `remaining()` or calls `checkpoint()`.

    Use `resilient.deadline()` to make one.
    """

    _seconds: float = attrs.field(
        alias="seconds", converter=_to_seconds, validator=_check_seconds
    )
    _at: float = attrs.field(init=False, default=math.inf)
    _token: contextvars.Token[float] | None = attrs.field(
        init=False, default=None
    )

    @property
    def at(self) -> float:
        """
        The absolute deadline on the clock, once entered.
        """
        return self._at

    def remaining(self) -> float:
        """
        Seconds left in this scope, never negative.
        """
        return max(0.0, self._at - _clock.now())

    @property
    def expired(self) -> bool:
        """
        Whether this scope's deadline has passed.
        """
        return _clock.now() >= self._at

    def __enter__(self) -> Deadline:
        if self._token is not None:
            raise RuntimeError("this Deadline is already entered")
        self._at = min(_DEADLINE.get(), _clock.now() + self._seconds)
        self._token = _DEADLINE.set(self._at)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _DEADLINE.reset(self._token)
            self._token = None

    async def __aenter__(self) -> Deadline:
        # The same scope as `with`: a coroutine awaited by the task runs in
        # the task's own context, so the deadline set here is the task's.
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"Deadline(seconds={self._seconds!r}, at={self._at!r})"


def deadline(seconds: float | dt.timedelta | None) -> Deadline:
    """
    A scope in which at most *seconds* are left (see `Deadline`).

    Use it as ``with`` or, in async code, ``async with`` (the same scope).

    Args:
        seconds: Time allowed from entry, in seconds; `None` adds no limit
            (an outer deadline still applies), and so does a number too
            large for a float (``10**400``), like `math.inf`.

    Raises:
        ConfigError: *seconds* is negative or NaN (a `ValueError`).
        ConfigTypeError: *seconds* is not a number (a `TypeError`).

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       Huge *seconds* mean no limit instead of `OverflowError`;
       ``async with`` as well as ``with``.
    """
    return Deadline(seconds=math.inf if seconds is None else seconds)
