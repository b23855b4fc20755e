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
import linecache
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, final


__all__ = ["Landed", "at_line"]


class Landed(BaseException):
    """The injected exception: a BaseException, as KeyboardInterrupt."""


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
