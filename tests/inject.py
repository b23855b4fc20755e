"""
An exception raised at a chosen line of chosen functions, with
``sys.settrace``: for tests that prove a driver keeps its state when an
asynchronous exception lands between two of its statements.

A trace function that raises makes the exception appear in the traced
frame at the start of that line, as ``PyThreadState_SetAsyncExc`` or a
signal handler's exception would at an eval-breaker check there. The
tracer in place before (coverage's, under coverage) is put back after.

Lines that are a bare ``try:`` are passed over unless asked for: CPython
compiles a nested one to a no-op that its exception table leaves out (an
exception raised there skips the enclosing handlers), and it checks for
asynchronous exceptions only at calls, backward jumps and function
entries, never at that no-op: only a tracer can raise there.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import itertools
import linecache
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, Final, final


__all__ = [
    "Landed",
    "Points",
    "arm_opcode_events",
    "at_line",
    "at_point",
    "nth_line",
    "trace_opcodes",
]

_CALLS: Final = frozenset(
    op for name, op in dis.opmap.items() if name.startswith("CALL")
)


class Landed(BaseException):
    """The injected exception: a BaseException, as KeyboardInterrupt."""


def arm_opcode_events() -> None:
    """
    Call before ``sys.settrace`` when a trace function will ask for opcode
    events (`trace_opcodes`). CPython 3.12 turns on its per-instruction
    events at ``sys.settrace`` only if some frame has set
    ``f_trace_opcodes`` before (an interpreter-wide flag, never cleared):
    without this the first traced run of a process gets no opcode event.
    A no-op elsewhere (3.11 reads the frame's flag at each instruction,
    3.13 turns the events on per code object in `trace_opcodes`).
    """
    frame = sys._getframe()
    frame.f_trace_opcodes = True
    frame.f_trace_opcodes = False


def trace_opcodes(
    frame: types.FrameType, local: Callable[..., Any]
) -> Callable[..., Any]:
    """
    From a global trace function's ``call`` event: trace *frame* with
    *local* by opcode events only (no line events); returns *local*, what
    the global trace function returns. The frame's local tracer is set
    first: CPython 3.13 turns a frame's opcode events on when
    ``f_trace_opcodes`` is set on a frame that already has one, and
    ignores the flag set in the ``call`` event otherwise (``f_trace`` is
    then still unset), so the frame would run with no opcode event.
    """
    frame.f_trace = local
    frame.f_trace_opcodes = True
    frame.f_trace_lines = False
    return local


@final
class _Tracer:
    """Raise `Landed` at the first line of *codes* where *when* holds."""

    def __init__(
        self,
        codes: frozenset[types.CodeType],
        when: Callable[[types.FrameType], bool],
        *,
        skip_try: bool,
    ) -> None:
        self.codes = codes
        self.when = when
        self.skip_try = skip_try
        self.fired = False
        self.frames: list[str] = []

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if self.fired or frame.f_code not in self.codes:
            return None
        return self.local

    def local(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if self.fired:
            return None
        if (
            event == "line"
            and not (self.skip_try and _is_try(frame))
            and self.when(frame)
        ):
            self.fired = True
            self.frames.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            raise Landed
        return self.local


def _is_try(frame: types.FrameType) -> bool:
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return line.strip() == "try:"


@contextlib.contextmanager
def at_line(
    functions: list[Callable[..., Any]],
    when: Callable[[types.FrameType], bool],
    *,
    skip_try: bool = True,
) -> Iterator[_Tracer]:
    """
    Within the block, raise `Landed` once, at the first line event of a
    frame of one of *functions* for which *when* (given the frame) is true
    (a ``try:`` line too if not *skip_try*). The tracer tells whether it
    fired (``.fired``) and where (``.frames``).
    """
    codes = frozenset(getattr(f, "__wrapped__", f).__code__ for f in functions)
    tracer = _Tracer(codes, when, skip_try=skip_try)
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield tracer
    finally:
        sys.settrace(previous)


def nth_line(n: int) -> Callable[[types.FrameType], bool]:
    """An `at_line` *when* that is true at the *n*-th line event it is
    asked about (1 for the first): a sweep raises at each in turn."""
    count = itertools.count(1)

    def when(frame: types.FrameType) -> bool:
        return next(count) == n

    return when


@final
class Points:
    """
    A trace function that numbers the points where CPython 3.11 to 3.13
    can deliver an asynchronous exception (alike on the three) in frames of
    code that *traced* accepts, and raises `Landed` at point *at* (None:
    only counts them):

    - a traced function's start (not a coroutine's resumption after an
      ``await``, where CPython does not check);
    - the start of any function a traced frame calls (an exception at the
      first point inside it, which the traced frame sees as the call's),
      of code *callees* accepts (all by default);
    - just after a call returned, in a traced frame (the point between
      ``x = f()``'s call and its assignment), when it is under the same
      exception handler as the call (CPython raises there as the call's
      own, under the call's handler: where the next instruction has
      another, as after the ``return f()`` ending a ``with``, a trace
      function cannot raise it, so the point is left out);
    - a backward jump (a loop's back edge).

    A superset of CPython's own points: its specialised forms of some
    calls (``list.append``) do not check after the call.
    """

    def __init__(
        self,
        traced: Callable[[types.CodeType], bool],
        at: int | None,
        callees: Callable[[types.CodeType], bool] = lambda code: True,
    ) -> None:
        self.traced = traced
        self.callees = callees
        self.at = at
        self.seen = 0
        self.fired: str | None = None
        self._last: dict[types.FrameType, int] = {}

    def _point(self, frame: types.FrameType) -> None:
        n = self.seen
        self.seen = n + 1
        if n == self.at:
            self.fired = f"{frame.f_code.co_name}:{frame.f_lineno}"
            # CPython stops tracing after a trace function raised: keep no
            # frame (nor what its locals hold) that will not return here.
            self._last.clear()
            raise Landed

    def __call__(
        self, frame: types.FrameType, event: str, arg: object
    ) -> Callable[..., Any] | None:
        start = _at_start(frame)
        if self.traced(frame.f_code):
            trace_opcodes(frame, self._step)
            if start:
                self._point(frame)
            return self._step
        caller = frame.f_back
        if (
            start
            and caller is not None
            and self.traced(caller.f_code)
            and self.callees(frame.f_code)
        ):
            self._point(frame)
        return None

    def _step(
        self, frame: types.FrameType, event: str, arg: object
    ) -> Callable[..., Any]:
        if event == "opcode":
            here = frame.f_lasti
            before = self._last.get(frame)
            self._last[frame] = here
            code = frame.f_code
            if before is not None and (
                here <= before
                or (
                    code.co_code[before] in _CALLS
                    and _handler(code, before) == _handler(code, here)
                )
            ):
                self._point(frame)
        elif event == "return":  # Or a coroutine's suspension.
            self._last.pop(frame, None)  # Keeps no finished frame alive.
        return self._step


_RESUME: Final = dis.opmap["RESUME"]


def _at_start(frame: types.FrameType) -> bool:
    """Whether *frame* is at its start, not resuming after an ``await``
    or a ``yield`` (``RESUME 0``)."""
    code, at = frame.f_code.co_code, frame.f_lasti
    return code[at] == _RESUME and code[at + 1] == 0


@functools.cache
def _handlers(code: types.CodeType) -> tuple[tuple[int, int, int], ...]:
    return tuple(
        (e.start, e.end, e.target)
        for e in dis.Bytecode(code).exception_entries
    )


def _handler(code: types.CodeType, offset: int) -> int:
    """The exception handler that covers *offset* (-1: none)."""
    for start, end, target in _handlers(code):
        if start <= offset < end:
            return target
    return -1


@contextlib.contextmanager
def at_point(
    traced: Callable[[types.CodeType], bool],
    at: int | None,
    callees: Callable[[types.CodeType], bool] = lambda code: True,
) -> Iterator[Points]:
    """
    Within the block (in this thread), raise `Landed` at point *at* of the
    frames of code *traced* accepts (see `Points`), or only count them.
    """
    points = Points(traced, at, callees)
    previous = sys.gettrace()
    arm_opcode_events()
    sys.settrace(points)
    try:
        yield points
    finally:
        sys.settrace(previous)
