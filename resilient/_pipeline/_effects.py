"""
The effects of the flow other than its attempts, carried out by the
drivers (`resilient._pipeline._run`, the block form, the stream drivers):
admissions, settles, sleeps, hooks, the fallback, closing a discarded
response; and how a driver
abandons a suspended flow when an exception lands outside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resilient._core._loops import refuse_blocking
from resilient._pipeline._call import arun_hook, run_hook
from resilient._pipeline._discard import aclose_discarded, close_discarded
from resilient._pipeline._fallback import arun_fallback, run_fallback
from resilient._pipeline._flow import (
    ADMIT,
    DISCARD,
    FALLBACK,
    HOOK,
    SETTLE,
    SLEEP,
)
from resilient._timeout._watchdog import checkpoint


if TYPE_CHECKING:
    from collections.abc import Generator

    from resilient._pipeline._call import Call
    from resilient._pipeline._flow import Flow


def perform(call: Call, op: int, arg: Any) -> Any:
    """Carry out one effect of the flow (not RUN) in sync code."""
    if op == ADMIT:
        return arg.admit()
    if op == SETTLE:
        call.guards.settle(*arg)  # type: ignore[union-attr]
    elif op == SLEEP:
        seconds, error = arg
        if seconds > 0:
            try:
                refuse_blocking(
                    f"a sync retry of policy {call.policy.name!r}",
                    "an async function under the policy, or `async for "
                    "attempt in resilient.retrying(policy)`",
                )
            except RuntimeError as refused:
                raise refused from error
            call.clock.sleep(seconds)
    elif op == HOOK:
        run_hook(*arg)
    elif op == FALLBACK:
        return run_fallback(*arg)
    elif op == DISCARD:
        close_discarded(arg)
    return None


async def aperform(call: Call, op: int, arg: Any) -> Any:
    """Carry out one effect of the flow (not RUN) in async code."""
    if op == ADMIT:
        return await arg.aadmit()
    if op == SETTLE:
        await call.guards.asettle(*arg)  # type: ignore[union-attr]
    elif op == SLEEP:
        seconds = arg[0]
        if seconds > 0:
            await call.clock.asleep(seconds)
        else:
            await checkpoint()
    elif op == HOOK:
        # Hooks are bounded by the call's deadline (docs/retry.md).
        with call.cancel_scope(call.deadline):
            await arun_hook(*arg)
    elif op == FALLBACK:
        return await arun_fallback(*arg)
    elif op == DISCARD:
        await aclose_discarded(arg)
    return None


def abandon(
    call: Call,
    gen: Flow,
    exc: BaseException,
    *,
    op: int = 0,
    arg: Any = None,
    sent: Any = None,
) -> None:
    """
    An exception outside the flow (an interrupt or a cancellation that
    landed in a driver between two effects) while it is suspended: throw it
    in here, in the driver's context, so that the flow undoes what it set
    (the deadline, spans, tickets) before the exception goes on; a flow
    dropped instead would be closed wherever it is freed (another thread,
    another context). *op*, *arg* and *sent* are the driver's last effect
    and what it got: tickets that are in the driver's hands alone (an
    admission's not given to the flow yet, a settle's the flow handed
    over) are released here, uncounted. (Releasing is idempotent: tickets
    the flow got, or the driver settled, just before the exception are
    not released twice.)
    """
    if op == ADMIT and type(sent) is list:
        call.guards.release(sent)  # type: ignore[union-attr]
    elif op == SETTLE:
        call.guards.release(arg[0])  # type: ignore[union-attr]
    throw_into(gen, exc)
    call.abort(exc)  # A flow not started yet: the call's span.


def throw_into(gen: Generator[Any, Any, Any], exc: BaseException) -> None:
    """
    Throw *exc* into a suspended flow so it undoes what it set, and let
    the exception that comes out go (the caller raises its own); nothing
    when the flow is over already (it raised *exc* and cleaned up). The
    call drivers and the stream drivers share it.
    """
    if gen.gi_frame is None:  # type: ignore[attr-defined] # (getgeneratorstate, faster)
        return
    try:
        gen.throw(exc)
    except BaseException:  # noqa: BLE001, S110 - raised by the driver
        pass
    else:
        gen.close()  # pragma: no cover - only a fallback yields after an error
