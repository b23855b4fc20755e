"""
The private internals of CPython, asyncio, trio and redis-py that resilient
leans on, each behind one probe here with the path taken where it is missing.

Re-verify them on every upgrade of Python or of these libraries:
``tests/test_internals.py`` asserts that each internal is present with the
shape used here on the installed versions (and fails, naming what to
re-verify, when one moves), and runs each fallback with the internal taken
away. docs/design.md ("Private internals") keeps the list.

- CPython's ``with`` statement (`WITH_SHAPE`, `enter_calls`): where a frame
  calls a context manager's ``__enter__``, read from ``frame.f_lasti``. A
  timeout scope uses it to know the frame of the ``with`` that entered it, a
  lock to tie the ``__exit__`` a ``with`` looked up to the ``__enter__`` it
  calls. CPython 3.11-3.13 do both in one instruction (``BEFORE_WITH``,
  ``BEFORE_ASYNC_WITH``), with no check for asynchronous exceptions between
  the call's return and the block's protection: what makes ``with lock:``
  safe from ``KeyboardInterrupt`` and ``timeout(interrupt=True)`` at the
  acquire. 3.14 looks both methods up with ``LOAD_SPECIAL`` and calls
  ``__enter__`` with an ordinary ``CALL`` (which checks): `enter_calls`
  reads that shape too, and importing resilient there warns that the
  guarantees under asynchronous exceptions are not verified. A shape known
  to neither is never guessed: nothing is recognised, and the import warns.
- asyncio's ``_get_running_loop`` (`get_running_loop`): the running loop or
  None, without the exception ``get_running_loop`` raises and the caller
  catches (on every sync call of a policy). Else: that, caught.
- asyncio's ``tasks._current_tasks`` on 3.11 (`current_task_of`): 3.11's
  ``current_task`` is Python code around that dict. Else: ``current_task``.
- trio's cancel tree (`trio_can_splice`): ``Task._cancel_status``,
  ``Task._activate_cancel_status``, the ``CancelStatus.parent`` setter and
  ``CancelScope._cancel_status``, to start an attempt's deadline at its
  first suspension. Else: the deadline is armed before the attempt.
- redis-py's ``Connection._sock`` (`redis_socket`): the socket a watcher
  waits on beside its wake-up pipe. Else: it polls the connection.
"""

from __future__ import annotations

import asyncio
import dis
import functools
import platform
import sys
import warnings
from typing import TYPE_CHECKING, Any, Final


if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Iterable, Mapping
    from types import CodeType


__all__ = [
    "BEFORE_WITH",
    "WITH_SHAPE",
    "calls_enter",
    "current_task_of",
    "enter_calls",
    "get_running_loop",
    "redis_socket",
    "trio_can_splice",
    "with_calls",
    "with_shape",
]


# -- CPython: the with statement ---------------------------------------------


def with_shape(opmap: Mapping[str, int]) -> str:
    """
    How this interpreter compiles a ``with`` statement, from its opcodes:
    ``"BEFORE_WITH"`` (CPython 3.11-3.13), ``"LOAD_SPECIAL"`` (3.14) or
    ``"unknown"``.
    """
    if "BEFORE_WITH" in opmap:
        return "BEFORE_WITH"
    if "LOAD_SPECIAL" in opmap:
        return "LOAD_SPECIAL"
    return "unknown"


WITH_SHAPE: Final = with_shape(dis.opmap)
BEFORE_WITH: Final = (
    dis.opmap["BEFORE_WITH"] if WITH_SHAPE == "BEFORE_WITH" else -1
)
"""The opcode that enters a ``with`` (-1 where there is none): the fast
check of a frame's current instruction on CPython 3.11-3.13."""

_ONE_STEP: Final = frozenset({"BEFORE_WITH", "BEFORE_ASYNC_WITH"})
# LOAD_SPECIAL's argument: the method's name as `dis` shows it, or its
# index in CPython's table (0 __enter__, 1 __exit__, 2 __aenter__, ...).
_EXITS: Final = frozenset({"__exit__", "__aexit__", "1", "3"})
_ENTERS: Final = frozenset({"__enter__", "__aenter__", "0", "2"})
_SHUFFLES: Final = frozenset({"SWAP", "COPY", "NOP"})


def with_calls(instructions: Iterable[tuple[int, str, str]]) -> dict[int, int]:
    """
    For bytecode given as ``(offset, opname, argrepr)``: the offset where
    each ``with`` / ``async with`` looks its ``__exit__`` up, mapped to the
    offset of its call of ``__enter__`` (the frame's ``f_lasti`` while that
    runs). ``BEFORE_WITH`` does both at one offset; 3.14's ``LOAD_SPECIAL
    __exit__``, stack shuffles, ``LOAD_SPECIAL __enter__`` and a ``CALL``
    right after it are read as one statement; anything else is not one.
    """
    calls: dict[int, int] = {}
    exit_at = -1  # A LOAD_SPECIAL of __exit__ seen, no __enter__ yet.
    enter_for = -1  # The __enter__ looked up: the next instruction calls.
    for offset, name, arg in instructions:
        if enter_for >= 0:
            if name.startswith("CALL"):
                calls[enter_for] = offset
            enter_for = -1
        if name in _ONE_STEP:
            calls[offset] = offset
            exit_at = -1
        elif name == "LOAD_SPECIAL" and arg in _EXITS:
            exit_at = offset
        elif name == "LOAD_SPECIAL" and arg in _ENTERS and exit_at >= 0:
            enter_for, exit_at = exit_at, -1
        elif name not in _SHUFFLES:
            exit_at = -1
    return calls


@functools.lru_cache(maxsize=4096)
def enter_calls(code: CodeType) -> tuple[dict[int, int], frozenset[int]]:
    """`with_calls` of *code*, and the offsets of its ``__enter__`` calls."""
    calls = with_calls(
        (i.offset, i.opname, i.argrepr or str(i.arg))
        for i in dis.get_instructions(code)
    )
    return calls, frozenset(calls.values())


def calls_enter(code: CodeType, at: int) -> bool:
    """Whether offset *at* of *code* is a ``with`` calling ``__enter__``."""
    return at in enter_calls(code)[1]


def check_with_shape(shape: str, version: str) -> None:
    """Warn at import where ``with`` is not compiled as on 3.11-3.13."""
    if shape == "BEFORE_WITH":
        return
    if shape == "LOAD_SPECIAL":
        how = (
            "calls a `with` statement's `__enter__` through an ordinary "
            "call, after which CPython may deliver an asynchronous exception "
            "before the block is entered"
        )
    else:
        how = (
            "compiles `with` statements in a shape resilient does not "
            "recognise (no BEFORE_WITH, no LOAD_SPECIAL): a timeout scope or "
            "lock whose `__exit__` such an exception skips is not healed"
        )
    warnings.warn(
        f"resilient: Python {version} {how}; a lock a breaker, bulkhead or "
        "timeout scope takes with `with` may be left held by "
        "KeyboardInterrupt or timeout(interrupt=True). resilient's "
        "guarantees under asynchronous exceptions are verified on CPython "
        "3.11 to 3.13 only (see resilient._core._internals)",
        RuntimeWarning,
        stacklevel=2,
    )


check_with_shape(WITH_SHAPE, platform.python_version())


# -- asyncio -----------------------------------------------------------------


def running_loop_getter(
    module: object,
) -> Callable[[], asyncio.AbstractEventLoop | None]:
    """*module*'s ``_get_running_loop`` (asyncio's), else the same answer
    from the public ``get_running_loop``."""
    getter = getattr(module, "_get_running_loop", None)
    if callable(getter):
        return getter  # type: ignore[no-any-return]

    def get_running_loop() -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    return get_running_loop


get_running_loop: Final = running_loop_getter(asyncio)


def current_task_getter(
    module: Any, version: tuple[int, ...]
) -> Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]:
    """
    The current task of a loop: on 3.11 the dict 3.11's Python-level
    ``current_task`` reads (``tasks._current_tasks``), else (3.12's is C,
    or the dict is gone) *module*'s ``current_task``.
    """
    if version < (3, 12):
        tasks = getattr(getattr(module, "tasks", None), "_current_tasks", None)
        if isinstance(tasks, dict):
            return tasks.get
    return module.current_task  # type: ignore[no-any-return]


current_task_of: Final = current_task_getter(asyncio, sys.version_info[:2])


# -- trio --------------------------------------------------------------------


def trio_can_splice(trio: Any) -> bool:
    """
    Whether *trio*'s private cancel tree has what
    `resilient._timeout._watchdog` splices a deadline scope into: the
    task's and scope's ``_cancel_status``, ``Task._activate_cancel_status``
    and a settable ``CancelStatus.parent`` (trio 0.12 to today).
    """
    try:
        task = trio.lowlevel.Task
        status = trio._core._run.CancelStatus  # noqa: SLF001
        scope = trio.CancelScope
    except AttributeError:
        return False
    parent = getattr(status, "parent", None)
    return (
        callable(getattr(task, "_activate_cancel_status", None))
        and hasattr(task, "_cancel_status")
        and hasattr(scope, "_cancel_status")
        and isinstance(parent, property)
        and parent.fset is not None
    )


# -- redis-py ----------------------------------------------------------------


def redis_socket(conn: object) -> socket.socket | None:
    """A connected redis-py connection's socket (``_sock``), or None."""
    sock = getattr(conn, "_sock", None)
    return sock if callable(getattr(sock, "fileno", None)) else None
