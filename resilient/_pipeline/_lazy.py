"""
An async attempt's deadline, armed only once the attempt suspends.

A deadline can interrupt async code only where it suspends: a cancel scope
raises at a checkpoint, and asyncio's cancellation is thrown in where the
task waits. An attempt whose coroutine returns or raises without ever
suspending (a cache hit, a validation error, the benchmark's success path)
cannot be interrupted, so arming a deadline for it buys nothing and costs
most of the call (trio's cancel scope: about 4.8 us here).

So the drivers (`resilient._pipeline._run`) step the attempt's coroutine
once by hand, ``coro.send(None)``. If it is over (it returned:
``StopIteration``; or it raised), that is the attempt's outcome and nothing
was armed. If it suspended, `suspended` takes over: it arms the deadline
there (the loop's watchdog on asyncio; on trio a cancel scope spliced in
above any scope the coroutine entered so far:
`resilient._timeout._watchdog.arm`), hands what the coroutine yielded to
the event loop, and forwards every later ``send``, ``throw`` and ``close``
as ``await`` (PEP 380's ``yield from``) would, until the coroutine ends;
then it disarms and tells the attempt's own timeout from the rest.

A deadline already past when the coroutine first suspends cancels it at
that checkpoint, as a scope entered before it would have. The coroutine's
frames stay in every traceback (it runs under this generator's frame, or
the driver's, as it ran under the driver's ``await``).

Asynchronous exceptions (an interrupt, ``PyThreadState_SetAsyncExc``): one
that lands in this generator's own code is thrown into the coroutine, as
if it had landed there, so the coroutine's clean-up runs here, in its
task, and the deadline is undone on every way out. (What the coroutine
yielded last may then never reach the event loop: on asyncio that is a
future nobody waits for; on trio, as for an exception landing inside
trio's own waiting code, trio's scheduler is not told.)
"""

from __future__ import annotations

import time
import types
from typing import TYPE_CHECKING, Any, Final

from resilient._core import _clock
from resilient._pipeline._cut import timed_out
from resilient._timeout._watchdog import TASK, arm, disarm


if TYPE_CHECKING:
    from collections.abc import Generator
    from types import CoroutineType

    from resilient.typing import Clock


_DEFAULT_CLOCK: Final = _clock.DEFAULT_CLOCK
_monotonic: Final = time.monotonic


@types.coroutine
def suspended(  # noqa: C901 - one frame: the forwarding loop inline
    coro: CoroutineType[Any, Any, Any],
    trap: Any,
    at: float,
    clock: Clock,
    base: Any,
) -> Generator[Any, Any, tuple[BaseException | None, Any]]:
    """
    Go on with *coro*, which suspended on *trap* at its first step, under
    the deadline *at* (on *clock*), to its end: ``(exception, None)`` or
    ``(None, result)``, the exception being `timed_out` when the deadline
    stopped it. *base* is `resilient._timeout._watchdog.trio_base` from
    before the first step.
    """
    armed: Any = None
    failed: BaseException | None = None
    result: Any = None
    thrown: BaseException | None = None
    sent: Any = None
    try:
        now = _monotonic() if clock is _DEFAULT_CLOCK else clock.now()
        armed = arm(at - now, base)
        while True:
            if trap is not _LOST:
                try:
                    sent = yield trap
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - the coroutine's
                    thrown = exc
            try:
                if thrown is None:
                    trap = coro.send(sent)
                else:
                    into, thrown = thrown, None
                    trap = coro.throw(into)
            except StopIteration as stop:
                result = stop.value
                break
            except BaseException as exc:  # noqa: BLE001 - the attempt's outcome
                if coro.cr_suspended:  # pragma: no cover - landed
                    # Landed here once the step had returned (its trap is
                    # lost): thrown into the coroutine, as if it had
                    # landed there.
                    thrown, trap = exc, _LOST
                    continue
                failed = exc
                break
        if disarm(armed, failed):
            failed = timed_out(at, failed)
    except BaseException as exc:
        # Closed (GeneratorExit), or an error here (arming, disarming, an
        # asynchronous exception between two steps): the coroutine first,
        # then the deadline around it.
        try:
            abandon_attempt(coro, exc)
        finally:
            release(armed, exc)
        raise
    return failed, result


async def armed_attempt(
    awaitable: Any, at: float, clock: Clock
) -> tuple[BaseException | None, Any]:
    """
    The attempt under the deadline *at* when its function returned no
    coroutine (a future, an object with ``__await__``), which cannot be
    stepped by hand: armed before it starts. As `suspended`, its outcome.
    """
    armed: Any = None
    try:
        now = _monotonic() if clock is _DEFAULT_CLOCK else clock.now()
        armed = arm(at - now)
        try:
            result = await awaitable
        except BaseException as exc:  # noqa: BLE001 - the attempt's outcome
            failed: BaseException | None = exc
            result = None
        else:
            failed = None
        if disarm(armed, failed):
            failed = timed_out(at, failed)
    except BaseException as exc:  # noqa: BLE001 - the attempt's outcome
        # Arming or disarming failed, or an exception landed here: the
        # deadline undone all the same.
        release(armed, exc)
        return exc, None
    return failed, result


def release(armed: Any, exc: BaseException) -> None:
    """Undo *armed* (from `arm`, or None: not armed) on the way out of
    *exc*, whether or not `disarm` ran: its verdict and errors dropped."""
    if armed is None:
        return
    try:
        disarm(armed, exc)
    except BaseException:  # noqa: BLE001 # pragma: no cover - *exc* goes on
        if type(armed) is list:
            armed[TASK] = None


class _Lost:
    """What the coroutine yielded, lost to an exception that landed in
    `suspended` before it reached the event loop."""

    __slots__ = ()


_LOST: Final = _Lost()


def abandon_attempt(
    coro: CoroutineType[Any, Any, Any], exc: BaseException
) -> None:
    """
    End *coro*, suspended or not started, because of *exc* outside it (in
    `suspended`, or in a driver: between the call that made it and its
    first step, or the first step and `suspended`'s first line, where no
    ``try`` of its own can reach): closed for a
    GeneratorExit (PEP 380: what the close raises goes on); else *exc*
    thrown in (its clean-up runs here, then *exc* goes on) and, should the
    coroutine suspend again, closed.
    """
    if coro.cr_frame is None:
        return
    if isinstance(exc, GeneratorExit):
        coro.close()
        return
    try:
        coro.throw(exc)
    except BaseException:  # noqa: BLE001 - *exc* goes on, or its successor
        return
    coro.close()  # pragma: no cover - a coroutine that outlived the throw
