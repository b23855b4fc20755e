"""
The decorator shells: the bare first attempt in front of the flow's drivers
(`resilient._pipeline._drive`).

Most calls succeed at once: a first attempt with no attempt timeout, no
result predicate and no telemetry runs bare, with only the call's deadline
in the context (in async code, armed in the loop's deadline watchdog:
`resilient._timeout._watchdog`), through guards that admit it at once (a
closed breaker counts it without a permit, a bulkhead with a free slot
takes it without queueing: `Guards.bare`); the call's state and the flow
are made only when it fails, and the flow starts from that failure.
"""

from __future__ import annotations

import functools
import math
import time
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

from resilient._core import _clock, _internals, _registry
from resilient._core._telemetry import disabled
from resilient._pipeline._call import Call
from resilient._pipeline._drive import UNSET, adrive, drive, wrong_shell
from resilient._pipeline._flow import flow
from resilient._pipeline._inloop import _thread_local, refuse_in_loop
from resilient._pipeline._lazy import abandon_attempt, armed_attempt, suspended
from resilient._timeout._watchdog import EAGER, trio_base


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._core._settings import RetrySettings
    from resilient._pipeline._guards import Guards


_DEADLINE: Final = _clock._DEADLINE  # noqa: SLF001
_DEFAULT_CLOCK: Final = _clock.DEFAULT_CLOCK
_monotonic: Final = time.monotonic
_Coroutine: Final = CoroutineType
_get_running_loop: Final = _internals.get_running_loop  # C, no raise
_INF: Final = math.inf
_UNSET: Final = UNSET


def bare_ok(policy: RetrySettings) -> bool:
    """
    Whether a first attempt can run bare: no attempt timeout, no result
    predicate, no telemetry. (The guards keep it bare while they admit it
    at once: `Guards.bare`.)
    """
    return (
        policy.timeout is None
        and policy.retry_if_result is None
        and disabled()
    )


def call_sync(  # noqa: C901, PLR0912 - the bare first attempt, inline for speed
    policy: RetrySettings,
    guards: Guards | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A call through *policy*, sync: the bare first attempt, then the
    flow."""
    if _thread_local.name is not None or _get_running_loop() is not None:
        refuse_in_loop(policy, "call")  # On an event loop's thread.
    # The registries were reset: look the parts up again (one int compare
    # per call; the module global, not a call of generation()).
    if guards is not None and guards.generation != _registry._generation:  # noqa: SLF001
        guards.look_up()
    if bare_ok(policy):
        bare = None if guards is None else guards.bare
        if guards is None or bare is not None:
            start, outer = _clock._clock.now(), _DEADLINE.get()  # noqa: SLF001
            budget = policy.budget
            token = ticket = None
            try:
                try:
                    # The admission inside the ``try``: its ticket settled
                    # on every way out.
                    if bare is not None:
                        ticket = bare.fast_admit()
                    if bare is None or ticket is not None:
                        token = _DEADLINE.set(
                            outer
                            if budget is None
                            else min(outer, start + budget)
                        )
                        try:
                            result = fn(*args, **kwargs)
                            if type(result) is _Coroutine:
                                raise wrong_shell(fn, result)  # noqa: TRY301 - counted as a failure
                        except BaseException as exc:  # noqa: BLE001 - settled first
                            failed: BaseException | None = exc
                        else:
                            failed = None
                finally:
                    if token is not None:
                        _DEADLINE.reset(token)
                    elif bare is None or ticket is not None:
                        # Lost between the set and its store (an
                        # asynchronous exception): put the value back.
                        _DEADLINE.set(outer)
                if ticket is not None:
                    bare.fast_settle(ticket, failed)  # type: ignore[union-attr]
            except BaseException:
                # As in call_async: what the ticket still holds given back,
                # the deadline put back.
                if ticket is not None:
                    bare.fast_drop(ticket)  # type: ignore[union-attr]
                if _DEADLINE.get() != outer:
                    _DEADLINE.set(outer)  # pragma: no cover - landed
                raise
            if bare is None or ticket is not None:
                if failed is None:
                    return result
                if not isinstance(failed, Exception):
                    raise failed
                call = Call(policy, guards, start, outer)
                # The flow holds the error from here: dropped here, as a
                # frame that keeps it would be kept by its traceback (a
                # cycle, left to the garbage collector, in every call that
                # retries).
                gen, failed = flow(call, failed, fuse=True), None
                return drive(call, gen, fn, args, kwargs)
    call = Call(policy, guards)
    return drive(call, flow(call, fuse=True), fn, args, kwargs)


async def call_async(  # noqa: C901, PLR0911, PLR0912, PLR0915 - the bare first attempt, inline for speed
    policy: RetrySettings,
    guards: Guards | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A call through *policy*, async: the bare first attempt (under the
    loop's deadline watchdog when it has a deadline), then the flow."""
    # The registries were reset: look the parts up again (one int compare
    # per call; the module global, not a call of generation()).
    if guards is not None and guards.generation != _registry._generation:  # noqa: SLF001
        guards.look_up()
    if (  # bare_ok(policy), inline: one Python frame less per call
        policy.timeout is None
        and policy.retry_if_result is None
        and disabled()
    ):
        bare = None if guards is None else guards.bare
        if guards is None or bare is not None:
            # Inline, not helpers: one coroutine frame less per call (and
            # the default clock read without its method).
            clock = _clock._clock  # noqa: SLF001
            start = _monotonic() if clock is _DEFAULT_CLOCK else clock.now()
            outer = at = _DEADLINE.get()
            budget = policy.budget
            if budget is not None and start + budget < outer:
                at = start + budget
            if at == _INF and bare is None:
                # No deadline: nothing to arm.
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - the flow decides
                    call = Call(policy, None, start, outer)
                    gen = flow(call, exc, fuse=True)
                return await adrive(call, gen, fn, args, kwargs)
            if bare is None:
                # No guards, a deadline (the budget's, or an enclosing
                # one): the general case below, without its tickets.
                token = coro = None
                base: Any = _UNSET
                failed: BaseException | None = None
                try:
                    try:
                        token = _DEADLINE.set(at)
                        coro = fn(*args, **kwargs)
                        if (
                            type(coro) is _Coroutine
                            and (
                                base := (
                                    None
                                    if _get_running_loop() is not None
                                    else trio_base()
                                )
                            )
                            is not EAGER
                        ):
                            try:
                                trap = coro.send(None)
                            except BaseException as ended:  # noqa: BLE001 - settled first
                                if type(ended) is StopIteration:
                                    result = ended.value
                                else:
                                    if coro.cr_frame is not None:
                                        abandon_attempt(
                                            coro, ended
                                        )  # pragma: no cover - landed
                                    failed = ended
                            else:
                                failed, result = await suspended(
                                    coro, trap, at, clock, base
                                )
                        else:
                            failed, result = await armed_attempt(
                                coro, at, clock
                            )
                    except BaseException as exc:  # noqa: BLE001 - settled first
                        if (
                            type(coro) is _Coroutine
                            and coro.cr_frame is not None
                        ):
                            abandon_attempt(coro, exc)  # pragma: no cover
                        failed = exc
                    finally:
                        if token is not None:
                            _DEADLINE.reset(token)
                        else:
                            _DEADLINE.set(outer)  # Lost: see call_sync.
                except BaseException:
                    if _DEADLINE.get() != outer:
                        _DEADLINE.set(outer)  # pragma: no cover - landed
                    raise
                if failed is None:
                    return result
                if not isinstance(failed, Exception):
                    raise failed
                call = Call(policy, None, start, outer)
                # The flow holds the error from here: dropped here, as a
                # frame that keeps it would be kept by its traceback (a
                # cycle, left to the garbage collector, in every call that
                # retries).
                gen, failed = flow(call, failed, fuse=True), None
                return await adrive(call, gen, fn, args, kwargs, base=base)
            # Guards that admit at once (`Guards.bare`).
            token = ticket = None
            failed = None
            try:
                try:
                    # The admission inside the ``try``: its ticket settled
                    # on every way out.
                    ticket = bare.fast_admit()
                    if ticket is not None:
                        token = _DEADLINE.set(at)
                        coro = None
                        try:
                            coro = fn(*args, **kwargs)
                            if at == _INF:  # No deadline: none to arm.
                                result = await coro
                            elif (
                                type(coro) is _Coroutine
                                and (
                                    base := (
                                        None
                                        if _get_running_loop() is not None
                                        else trio_base()
                                    )
                                )
                                is not EAGER
                            ):
                                # The deadline armed only if the attempt
                                # suspends (`resilient._pipeline._lazy`).
                                try:
                                    trap = coro.send(None)
                                except BaseException as ended:  # noqa: BLE001 - settled first
                                    # Returned or raised, in one handler
                                    # (see `adrive`).
                                    if type(ended) is StopIteration:
                                        result = ended.value
                                    else:
                                        if coro.cr_frame is not None:
                                            abandon_attempt(
                                                coro, ended
                                            )  # pragma: no cover - landed
                                        failed = ended
                                else:
                                    failed, result = await suspended(
                                        coro, trap, at, clock, base
                                    )
                            else:
                                failed, result = await armed_attempt(
                                    coro, at, clock
                                )
                        except BaseException as exc:  # noqa: BLE001 - settled first
                            if (
                                type(coro) is _Coroutine
                                and coro.cr_frame is not None
                            ):
                                abandon_attempt(coro, exc)  # pragma: no cover
                            failed = exc
                finally:
                    if token is not None:
                        _DEADLINE.reset(token)
                    elif ticket is not None:
                        _DEADLINE.set(outer)  # Lost: see call_sync.
                if ticket is not None:
                    await bare.afast_settle(ticket, failed)
            except BaseException:
                # The admission's own error, one raised by the settle, or
                # one that landed here: whatever the ticket still holds is
                # given back uncounted (`fast_drop` frees only what is
                # still held, so it is harmless after a settle), and the
                # deadline put back by value if the ``finally`` was cut
                # short.
                if ticket is not None:
                    bare.fast_drop(ticket)
                if _DEADLINE.get() != outer:
                    _DEADLINE.set(outer)  # pragma: no cover - landed
                raise
            if ticket is not None:
                if failed is None:
                    return result
                if not isinstance(failed, Exception):
                    raise failed
                call = Call(policy, guards, start, outer)
                gen, failed = (
                    flow(call, failed, fuse=True),
                    None,
                )  # See call_sync.
                return await adrive(call, gen, fn, args, kwargs)
    call = Call(policy, guards)
    return await adrive(call, flow(call, fuse=True), fn, args, kwargs)


def shells(
    policy: RetrySettings, guards: Guards | None
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The sync and async shells of one decorated function: partials, not
    closures (one Python frame less per call)."""
    return (
        functools.partial(call_sync, policy, guards),
        functools.partial(call_async, policy, guards),
    )
