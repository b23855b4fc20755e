"""
An asynchronous exception at any bytecode boundary of `resilient.http`'s
key handling leaves no idempotency key set in the caller's context.

Before the fix, `idempotency_key()` set its context variable before the
``try`` that resets it (and ``contextlib``'s ``__enter__`` ran Python code
after the set), and the stream wrappers did the same at every step: an
exception landing there (KeyboardInterrupt, the interrupt of
``timeout(interrupt=True)``, ``PyThreadState_SetAsyncExc``) left the key
in the context, and every later non-idempotent request of that context was
sent with a stale key.

CPython 3.11 delivers an asynchronous exception only where it checks its
eval breaker: at a function's start and a generator's resumption after a
``yield`` (not after an ``await``), after a call returns, at a backward
jump. `_Injector` raises `Injected` from a trace function at each of those
points in the frames of ``resilient/http/`` (a superset: every call's
return, where the specialised calls do not all check), one run per point,
and each test checks the key afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars
import dis
import functools
import pathlib
import sys
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final

import anyio
import pytest

import resilient.http
from resilient.http import (
    current_idempotency_key,
    idempotency_key,
    idempotent,
    needs_key,
)
from tests.inject import arm_opcode_events, trace_opcodes


_PACKAGE: Final = str(pathlib.Path(resilient.http.__file__).parent)
_CALLS: Final = frozenset(
    op for name, op in dis.opmap.items() if name.startswith("CALL")
)


class Injected(BaseException):
    """The injected exception: a BaseException, as KeyboardInterrupt."""


@functools.cache
def _entries(code: types.CodeType) -> tuple[tuple[int, int, int], ...]:
    return tuple(
        (e.start, e.end, e.target)
        for e in dis.Bytecode(code).exception_entries
    )


def _handler(code: types.CodeType, offset: int) -> int:
    """The handler covering *offset* (-1: none). An exception that lands
    as a call returns is raised under the call's handler; where the next
    instruction has another, a tracer cannot raise it there: left out."""
    for start, end, target in _entries(code):
        if start <= offset < end:
            return target
    return -1


_RESUME: Final = dis.opmap["RESUME"]
_NO_INTERRUPT: Final = dis.opmap["JUMP_BACKWARD_NO_INTERRUPT"]
"""The back edge of an ``await``'s loop, where CPython does not check."""


def _checks_on_entry(frame: types.FrameType) -> bool:
    """
    Whether CPython 3.11 checks for an asynchronous exception as *frame*
    starts or resumes (the trace event comes at its ``RESUME``): at a
    start and after a ``yield`` (``RESUME`` 0 and 1), not where an
    ``await`` or a ``yield from`` resumes (2 and 3: an exception there
    lands in the frame awaited, deeper).
    """
    code = frame.f_code.co_code
    at = frame.f_lasti
    if at < 0 or code[at] != _RESUME:
        return True
    return code[at + 1] < 2


class _Injector:
    """Numbers the landing points in ``resilient/http/`` frames and raises
    `Injected` at point *at* (None: only counts). ``where`` names the
    point it fired at: ``(function name, event)``."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.seen = 0
        self.where: tuple[str, str] | None = None
        self.last: dict[types.FrameType, int] = {}

    def _point(self, frame: types.FrameType, event: str) -> None:
        n = self.seen
        self.seen = n + 1
        if n == self.at:
            self.where = (frame.f_code.co_name, event)
            raise Injected

    def enter(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if not frame.f_code.co_filename.startswith(_PACKAGE):
            return None
        trace_opcodes(frame, self.step)
        self.last.pop(frame, None)
        if _checks_on_entry(frame):
            self._point(frame, "start")  # A start, or a resumption.
        return self.step

    def step(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            here = frame.f_lasti
            before = self.last.get(frame)
            self.last[frame] = here
            code = frame.f_code
            if before is not None and (
                (here <= before and code.co_code[before] != _NO_INTERRUPT)
                or (
                    code.co_code[before] in _CALLS
                    and _handler(code, before) == _handler(code, here)
                )
            ):
                self._point(frame, "after a call or a back edge")
        return self.step


# The exit of a ``with`` block's context manager written in Python cannot
# be made safe at its very start (docs/timeouts.md says the same of the
# scopes): the one point the block form leaves; `idempotent` has none.
_EXIT_START: Final = ("__exit__", "start")


def _block() -> None:
    with idempotency_key() as key:
        assert current_idempotency_key() == key


def _given_block() -> None:
    with idempotency_key("order-42"):
        assert current_idempotency_key() == "order-42"


@idempotent
def _call() -> None:
    assert current_idempotency_key() is not None


@idempotent
def _stream() -> Iterator[str | None]:
    yield current_idempotency_key()
    yield current_idempotency_key()


def _consume() -> None:
    outside = current_idempotency_key()
    for item in _stream():
        assert item is not None
        assert current_idempotency_key() == outside  # Between steps.


@idempotent
async def _acall() -> None:
    await anyio.lowlevel.checkpoint()
    assert current_idempotency_key() is not None


@idempotent
async def _astream() -> AsyncIterator[str | None]:
    await anyio.lowlevel.checkpoint()
    yield current_idempotency_key()
    yield current_idempotency_key()


async def _aconsume() -> None:
    outside = current_idempotency_key()
    # Closed by its consumer whatever happens (trio warns of a stream left
    # to the garbage collector).
    async with contextlib.aclosing(_astream()) as stream:  # type: ignore[type-var]
        async for item in stream:
            assert item is not None
            assert current_idempotency_key() == outside


async def _ablock() -> None:
    with idempotency_key() as key:
        await anyio.lowlevel.checkpoint()
        assert current_idempotency_key() == key


SYNC_FORMS: Final[dict[str, Callable[[], None]]] = {
    "block": _block,
    "block with a key": _given_block,
    "decorator": _call,
    "stream": _consume,
}
ASYNC_FORMS: Final[dict[str, Callable[[], Awaitable[None]]]] = {
    "async block": _ablock,
    "async decorator": _acall,
    "async stream": _aconsume,
}


def _key_left() -> str | None:
    """What a later request of this context would be sent with."""
    assert needs_key("POST", {}) == current_idempotency_key()
    return current_idempotency_key()


def _once(
    at: int | None, form: str, backend: str | None, outer: str | None
) -> tuple[_Injector, str | None]:
    """
    Run *form* once, traced, with `Injected` at point *at*: in this thread
    (*backend* None) or in a task of a fresh event loop, inside an
    ``idempotency_key(outer)`` block entered before the tracing when
    *outer*; the injector, and the key the context is left with.
    """
    injector = _Injector(at)
    out: list[str | None] = []

    def traced_sync() -> None:
        sys.settrace(injector.enter)
        try:
            SYNC_FORMS[form]()
        except Injected:
            pass
        finally:
            sys.settrace(None)
        out.append(_key_left())

    async def traced_async() -> None:
        sys.settrace(injector.enter)
        try:
            if form in SYNC_FORMS:
                SYNC_FORMS[form]()
            else:
                await ASYNC_FORMS[form]()
        except Injected:
            pass
        finally:
            sys.settrace(None)
        out.append(_key_left())

    async def main() -> None:
        with idempotency_key(outer) if outer else contextlib.nullcontext():
            await traced_async()

    def run() -> None:
        if backend is None:
            with idempotency_key(outer) if outer else contextlib.nullcontext():
                traced_sync()
        else:
            anyio.run(main, backend=backend)

    before = sys.gettrace()
    arm_opcode_events()
    try:
        # A fresh context each run: a key a run leaves must not change the
        # next one's path.
        contextvars.Context().run(run)
    finally:
        sys.settrace(before)
    return injector, out[0]


def _check_every_point(
    form: str, backend: str | None, outer: str | None
) -> None:
    counted, left = _once(None, form, backend, outer)
    assert left == outer
    assert counted.seen > 5
    leaks = []
    for at in range(counted.seen):
        injector, left = _once(at, form, backend, outer)
        assert injector.where is not None, at
        if left != outer:
            leaks.append((at, injector.where))
    assert [where for _, where in leaks] in (
        ([_EXIT_START], []) if "block" in form else ([],)
    ), leaks


OUTER: Final = pytest.mark.parametrize(
    "outer", [None, "outer-key"], ids=["alone", "nested"]
)


@OUTER
@pytest.mark.parametrize("form", sorted(SYNC_FORMS))
def test_sync_forms_leave_no_key_set(form: str, outer: str | None) -> None:
    """
    Each sync form (the block, the decorator, a stream consumed to its
    end), with an exception at each landing point in resilient.http's
    frames: the context is left with the key it had (none, or the
    enclosing block's). The one exception is the block's ``__exit__``
    start, out of reach of any context manager written in Python.
    """
    _check_every_point(form, None, outer)


# The exception can land between a coroutine's making and its await, as
# anywhere: Python warns of the coroutine never awaited.
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
@OUTER
@pytest.mark.parametrize("form", sorted(SYNC_FORMS) + sorted(ASYNC_FORMS))
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_forms_leave_no_key_set(
    backend: str, form: str, outer: str | None
) -> None:
    """
    Each form run in a task (asyncio and trio: the async decorator and
    stream suspend at every step, the block across an await), with an
    exception at each landing point: the task's context is left with the
    key it had, but for the block's ``__exit__`` start.
    """
    _check_every_point(form, backend, outer)
