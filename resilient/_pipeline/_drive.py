"""
The decorator drivers of the flow, sync and async: they run a call's flow
(`resilient._pipeline._flow`) to its end, carrying out its effects, the
attempts inline (the shells in front of them, with the bare first attempt:
`resilient._pipeline._run`).
"""

from __future__ import annotations

import math
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

from resilient._core import _internals
from resilient._pipeline._effects import abandon, aperform, perform
from resilient._pipeline._flow import PAUSE_RUN, RUN, SLEEP
from resilient._pipeline._lazy import abandon_attempt, armed_attempt, suspended
from resilient._retry._machine import WrongShell
from resilient._timeout._watchdog import (
    EAGER,
    trio_base,
    trio_checkpoint,
    yield_now,
)


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._pipeline._call import Call
    from resilient._pipeline._flow import Flow


_Coroutine: Final = CoroutineType
_get_running_loop: Final = _internals.get_running_loop  # C, no raise
_INF: Final = math.inf
UNSET: Final = object()
"""`adrive`'s *base* not looked up yet."""
_UNSET: Final = UNSET


def wrong_shell(fn: object, result: Any) -> WrongShell:
    result.close()
    return WrongShell(
        f"{fn!r} is sync but returned a coroutine: declare it `async def` "
        "to retry it from async code, or use `await policy.acall(fn)`"
    )


# The effects both decorator drivers and the block form carry out the same
# way, one colour each.


def drive(  # noqa: C901 - the zero wait and the attempt inline: one frame less each
    call: Call,
    gen: Flow,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    sent: Any = None,
    op: int = 0,
    arg: Any = None,
) -> Any:
    """
    The sync driver: run *gen* to its end. (*sent*, *op* and *arg*, the
    loop's state, are parameters so that they are bound before the first line,
    where an exception could land before the handler could read them.)
    """
    try:
        # Inside the try: CPython 3.11 raises an exception that lands at
        # the loop's back edge at the instruction before the loop's start.
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is None:
                    op, arg = gen.send(sent)
                else:
                    op, arg = gen.throw(thrown)
                    thrown = None
            except StopIteration as stop:
                return stop.value
            if op == SLEEP and arg[0] <= 0:
                # A zero wait, inline: nothing to do (`perform` would do
                # nothing either), and no perform frame.
                sent = None
                continue
            if op in (RUN, PAUSE_RUN):
                # (PAUSE_RUN: its zero wait is nothing to do in sync code.)
                try:
                    result = fn(*args, **kwargs)
                    if type(result) is _Coroutine:
                        raise wrong_shell(fn, result)  # noqa: TRY301 - counted as a failure
                except BaseException as exc:  # noqa: BLE001 - the flow decides
                    sent = (exc, None)
                else:
                    sent = (None, result)
                continue
            try:
                sent = perform(call, op, arg)
            except BaseException as exc:  # noqa: BLE001 - the flow decides
                thrown = exc
    except BaseException as exc:
        abandon(call, gen, exc, op=op, arg=arg, sent=sent)
        raise


async def adrive(  # noqa: C901, PLR0912, PLR0915 - the attempt inline: one coroutine frame less
    call: Call,
    gen: Flow,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    sent: Any = None,
    op: int = 0,
    arg: Any = None,
    base: Any = _UNSET,
) -> Any:
    """
    The async driver: run *gen* to its end (see `drive`). *base*, from
    `trio_base` (None on asyncio), is the task's place in trio's cancel
    tree where the attempts start: the same for every attempt of the call
    (the driver enters no cancel scope around them), so looked up once,
    at the first attempt (or by `call_async`, before the bare one).
    """
    try:
        # Inside the try: CPython 3.11 raises an exception that lands at
        # the loop's back edge at the instruction before the loop's start.
        thrown: BaseException | None = None
        # The event loop, for the whole call: asyncio's, or none (trio).
        # A zero wait is a checkpoint: on asyncio a bare yield to the loop,
        # on trio trio's own (no checkpoint frame of ours).
        pause: Callable[[], Awaitable[None]]
        if _get_running_loop() is not None:
            base = None
            pause = yield_now
        else:
            pause = trio_checkpoint()
        while True:
            try:
                if thrown is None:
                    op, arg = gen.send(sent)
                else:
                    op, arg = gen.throw(thrown)
                    thrown = None
            except StopIteration as stop:
                return stop.value
            if op == PAUSE_RUN:
                # A zero wait and the attempt after it: the checkpoint,
                # then the attempt below (a failed wait is thrown in).
                try:
                    await pause()
                except BaseException as exc:  # noqa: BLE001 - the flow decides
                    thrown = exc
                    continue
                op = RUN
            elif op == SLEEP and arg[0] <= 0:
                # A zero wait, inline: a checkpoint, and no aperform frame.
                try:
                    await pause()
                except BaseException as exc:  # noqa: BLE001 - the flow decides
                    thrown = exc
                else:
                    sent = None
                continue
            if op == RUN:
                coro = None
                try:
                    coro = fn(*args, **kwargs)
                    if arg == _INF:  # No deadline: nothing to arm.
                        sent = (None, await coro)
                        continue
                    if type(coro) is _Coroutine:
                        if base is _UNSET:
                            base = trio_base()
                        if base is not EAGER:
                            # The deadline armed only if the attempt
                            # suspends (`resilient._pipeline._lazy`).
                            try:
                                trap = coro.send(None)
                            except BaseException as ended:  # noqa: BLE001 - the flow decides
                                # Returned or raised, in one handler: a
                                # failure does not pass through an
                                # ``except StopIteration`` and its re-raise.
                                if type(ended) is StopIteration:
                                    sent = (None, ended.value)
                                else:
                                    if coro.cr_frame is not None:
                                        abandon_attempt(
                                            coro, ended
                                        )  # pragma: no cover - landed
                                    sent = (ended, None)
                                continue
                            sent = await suspended(
                                coro, trap, arg, call.clock, base
                            )
                            continue
                    sent = await armed_attempt(coro, arg, call.clock)
                except BaseException as exc:  # noqa: BLE001 - the flow decides
                    if type(coro) is _Coroutine and coro.cr_frame is not None:
                        abandon_attempt(coro, exc)  # pragma: no cover - landed
                    sent = (exc, None)
                continue
            try:
                sent = await aperform(call, op, arg)
            except BaseException as exc:  # noqa: BLE001 - the flow decides
                thrown = exc
    except BaseException as exc:
        abandon(call, gen, exc, op=op, arg=arg, sent=sent)
        raise
