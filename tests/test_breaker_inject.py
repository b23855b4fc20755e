"""
The breaker's bookkeeping with an exception injected at each point where
CPython can deliver an asynchronous exception, one run per point.

CPython raises an asynchronous exception (``PyThreadState_SetAsyncExc``,
``KeyboardInterrupt``, a signal handler's exception) only where it checks
its eval breaker: at a function's start, after a call returns and at a
backward jump (a loop's back edge); never between two plain stores. The
`_Injector` raises `Injected` from a trace function at exactly those
points (a superset: it counts every call's return, even where CPython's
specialised forms do not check) in the frames of ``resilient._breaker``,
so each test below runs its scenario once per point with the exception at
that point and checks that the record of an outcome is all or nothing:

- a success or failure is counted once or not at all, and once whenever
  its caller saw the call end;
- the inbox's successes are moved into the window, never lost or doubled;
- a window's running totals match its contents (checked after the window
  has wrapped, where a stale entry would be subtracted).
"""

from __future__ import annotations

import asyncio
import contextlib
import dis
import functools
import pathlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest

import resilient
from resilient import BreakerConfig, CircuitBreaker, CountWindow, TimeWindow
from resilient._breaker._windows import BUCKETS, CountRing, TimeRing
from tests.inject import arm_opcode_events, trace_opcodes


_PACKAGE: Final = str(pathlib.Path(resilient.__file__).parent / "_breaker")
_CALLS: Final = frozenset(
    op for name, op in dis.opmap.items() if name.startswith("CALL")
)


class Injected(BaseException):
    """The injected exception: a BaseException, as KeyboardInterrupt."""


class _Injector:
    """
    A trace function over the breaker's frames that numbers the points
    where an asynchronous exception can land and raises `Injected` at
    point *at* (None: only counts them).
    """

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.seen = 0
        self.last: dict[types.FrameType, int] = {}

    def point(self) -> None:
        n = self.seen
        self.seen = n + 1
        if n == self.at:
            raise Injected

    def enter(
        self, frame: types.FrameType, event: str, arg: object
    ) -> Callable[..., Any] | None:
        if not frame.f_code.co_filename.startswith(_PACKAGE):
            return None
        trace_opcodes(frame, self.step)
        self.point()  # A function's start (or a coroutine's resumption).
        return self.step

    def step(
        self, frame: types.FrameType, event: str, arg: object
    ) -> Callable[..., Any]:
        if event == "opcode":
            here = frame.f_lasti
            before = self.last.get(frame)
            self.last[frame] = here
            if before is not None and (
                here <= before
                or (
                    frame.f_code.co_code[before] in _CALLS
                    and _handler(frame.f_code, before)
                    == _handler(frame.f_code, here)
                )
            ):
                self.point()  # After a call returned, or a back edge.
        return self.step


@functools.cache
def _handlers(code: types.CodeType) -> tuple[tuple[int, int, int], ...]:
    return tuple(
        (e.start, e.end, e.target)
        for e in dis.Bytecode(code).exception_entries
    )


def _handler(code: types.CodeType, offset: int) -> int:
    """
    The exception handler that covers *offset* (-1: none). CPython raises
    an exception that lands after a call returns as the call's own, under
    the call's handler: where the next instruction has another (the
    ``return f()`` that ends a ``with`` block) a trace function cannot
    raise it there, so the point is left out.
    """
    for start, end, target in _handlers(code):
        if start <= offset < end:
            return target
    return -1


def _run(at: int | None, scenario: Callable[[], object]) -> tuple[int, bool]:
    """Run *scenario* traced; (points seen, whether `Injected` came out)."""
    injector = _Injector(at)
    before = sys.gettrace()
    arm_opcode_events()
    sys.settrace(injector.enter)
    try:
        scenario()
    except Injected:
        return injector.seen, True
    finally:
        sys.settrace(before)
    return injector.seen, False


def _each_point(
    scenario: Callable[[], Callable[[], object]],
) -> Iterator[tuple[int, bool]]:
    """
    For each point of a fresh scenario's traced part: (point, whether it
    was injected there); *scenario* sets up and returns the traced part.
    """
    total, _ = _run(None, scenario())
    assert total > 10
    for at in range(total):
        _, injected = _run(at, scenario())
        yield at, injected


def _breaker(window: CountWindow | TimeWindow) -> CircuitBreaker:
    resilient.testing.reset_registries()
    return resilient.breaker(
        "inject",
        BreakerConfig(
            window=window,
            minimum_calls=600,
            failure_rate=1.0,
            failure_on=ConnectionError,
        ),
    )


def _check_window(cb: CircuitBreaker) -> None:
    """The window's running totals match what it holds."""
    m = cb._m
    with cb._lock:
        m.absorb()
        w = m.window
        if isinstance(w, CountRing):
            ring = w._ring
            held = ring if w.calls == len(ring) else ring[: w.calls]
            assert w.failures == sum(b & 1 for b in held)
            assert w.slow == sum(b >> 1 for b in held)
        else:
            assert isinstance(w, TimeRing)
            assert w.calls == sum(w._c)
            assert w.failures == sum(w._f)
            assert w.slow == sum(w._s)


WINDOWS: Final = {
    "count": lambda: CountWindow(600),
    "time": lambda: TimeWindow(3600),
}


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_absorbing_the_inbox_loses_no_success(window: str, clock: Any) -> None:
    """
    `statistics` (which moves the inbox's successes into the window) with
    an exception at each point: every success is in the window afterwards
    exactly once. Before the fix, the window took a success off the inbox
    and an exception before its count lost it.
    """
    made: list[CircuitBreaker] = []

    def scenario() -> Callable[[], object]:
        cb = _breaker(WINDOWS[window]())
        made.append(cb)
        ok = cb(lambda: None)
        for _ in range(5):
            ok()
        return cb.statistics

    for at, injected in _each_point(scenario):
        cb = made[-1]
        assert cb.statistics().calls == 5, (at, injected)
        _check_window(cb)


def _call(cb: CircuitBreaker, form: str, fail: bool) -> Callable[[], object]:
    """One call through *cb* in *form*: success, or ConnectionError."""

    def fn() -> None:
        if fail:
            raise ConnectionError

    async def afn() -> None:
        fn()

    guarded, aguarded = cb(fn), cb(afn)

    def with_block() -> None:
        with cb:
            fn()

    def permit() -> None:
        p = cb.acquire()
        try:
            fn()
        except BaseException as exc:
            p.failure(exc)
            raise
        p.success()

    async def async_with() -> None:
        async with cb:
            fn()

    async def apermit() -> None:
        p = await cb.aacquire()
        try:
            fn()
        except BaseException as exc:
            await p.afailure(exc)
            raise
        await p.asuccess()

    forms: dict[str, Callable[[], object]] = {
        "decorator": guarded,
        "with": with_block,
        "permit": permit,
        "async decorator": lambda: _LOOP.run_until_complete(aguarded()),
        "async with": lambda: _LOOP.run_until_complete(async_with()),
        "async permit": lambda: _LOOP.run_until_complete(apermit()),
    }
    return forms[form]


_LOOP: Final = asyncio.new_event_loop()

FORMS: Final = (
    "decorator",
    "with",
    "permit",
    "async decorator",
    "async with",
    "async permit",
)


def _fill(cb: CircuitBreaker, n: int, *, every: int = 0) -> int:
    """*n* calls through *cb*, every *every*-th failing; the failures."""
    failures = 0
    for i in range(n):
        permit = cb.acquire()
        if every and i % every == 0:
            permit.failure(ConnectionError())
            failures += 1
        else:
            permit.success()
    return failures


@pytest.fixture
def small_inbox(monkeypatch: pytest.MonkeyPatch) -> int:
    """An inbox that fills at 4 successes (fewer points to go through)."""
    from resilient._breaker import _blocks, _calls, _settling

    for module in (_blocks, _calls, _settling):
        monkeypatch.setattr(module, "INBOX_LIMIT", 4)
    return 4


# The exception can land between a coroutine's making and its await, as
# anywhere: Python warns of the coroutine never awaited.
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_an_outcome_is_counted_once_or_not_at_all(
    window: str, form: str, fail: bool, clock: Any, small_inbox: int
) -> None:
    """
    One call (every form, sync and async) whose record fills the inbox
    (so the record also moves it into the window), with an exception at
    each point: the call counts once or not at all, once when its caller
    saw it end, and nothing else moves; after the window has wrapped (or
    slid) its totals still match its contents. Before the fix a success
    was lost from the inbox, and a failure's entry could be overwritten
    while its count stayed (a stale failure once the ring wrapped).
    """
    made: list[tuple[CircuitBreaker, int, int]] = []
    seen: list[bool] = []

    def scenario() -> Callable[[], object]:
        cb = _breaker(WINDOWS[window]())
        failures = _fill(cb, 30, every=7)
        more = small_inbox - 1 - len(cb._m.gate[1])  # type: ignore[index]
        _fill(cb, more)
        made.append((cb, 30 + more, failures))
        clock.advance(120.0)  # The call's outcome in a bucket of its own.
        call = _call(cb, form, fail)

        def traced() -> None:
            seen.clear()
            with contextlib.suppress(ConnectionError):
                call()
            seen.append(True)  # The caller saw the call end.

        return traced

    for at, injected in _each_point(scenario):
        cb, calls, failures = made[-1]
        s = cb.statistics()
        counted = s.calls - calls
        w = cb._m.window
        if isinstance(w, TimeRing):
            # The call's own bucket: the others hold what came before,
            # whole (a success lost from the inbox shows there).
            j = int(clock.now() // w._width) % BUCKETS
            counted = w._c[j]
            assert s.calls - counted == calls, (at, s)
        assert counted in (0, 1), (at, s)
        assert s.failures - failures == (counted if fail else 0), (at, s)
        if seen:
            assert not injected
            assert counted == 1, (at, s)
        clock.advance(1800.0)
        _fill(cb, 700, every=3)
        _check_window(cb)


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_a_reset_empties_the_window_whole(window: str, clock: Any) -> None:
    """
    `reset` of a closed breaker with an exception at each point: the
    window is as it was or empty, its totals matching its contents. Before
    the fix a time window emptied its buckets in a loop, and an exception
    at the loop's back edge left the totals counting emptied buckets.
    """
    made: list[CircuitBreaker] = []

    def scenario() -> Callable[[], object]:
        cb = _breaker(WINDOWS[window]())
        _fill(cb, 40, every=3)
        made.append(cb)
        return cb.reset

    for at, _ in _each_point(scenario):
        cb = made[-1]
        assert cb.statistics().calls in (0, 40), at
        _check_window(cb)


def test_an_opening_is_counted_with_the_state(clock: Any) -> None:
    """
    The failure that opens a breaker, with an exception at each point:
    the breaker is open and counts one opening, or is still closed and
    counts none, and is never open without its reopening time. Before the
    fix the opening was counted (and its interval set) before the state
    changed, so an exception at the change's start left a closed breaker
    that had "opened" once.
    """
    made: list[CircuitBreaker] = []

    def scenario() -> Callable[[], object]:
        resilient.testing.reset_registries()
        cb = resilient.breaker(
            "inject-open",
            BreakerConfig(
                window=CountWindow(4),
                minimum_calls=2,
                open_interval=10.0,
                failure_on=ConnectionError,
            ),
        )
        cb.acquire().failure(ConnectionError())
        made.append(cb)
        call = _call(cb, "decorator", fail=True)

        def traced() -> None:
            with contextlib.suppress(ConnectionError):
                call()

        return traced

    for at, _ in _each_point(scenario):
        cb = made[-1]
        m = cb._m
        s = cb.statistics()
        opened = s.state is resilient.BreakerState.OPEN
        assert s.times_opened == (1 if opened else 0), (at, s)
        assert (m.gate is None) == opened, at
        if opened:
            assert m.open_until == m.opened_at + 10.0, at
            assert s.retry_after > 0, at
