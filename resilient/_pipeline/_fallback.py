"""
The fallback: the outermost stage of a call, outside the total budget and
retry.

When the call ends with an exception (retry gave up, an open breaker's
`CircuitOpen`, a full bulkhead's `BulkheadFull`, the deadline) that the
policy's *fallback_on* accepts, the flow hands it to the policy's
*fallback* (effect ``FALLBACK`` of `resilient._pipeline._flow`) and the
call returns what the fallback returns; a fallback that raises ends the
call with that exception. It is not an admission stage (those run around
each attempt and are listed in `resilient._pipeline._stage.ORDER`): it runs
once per call, after the call's own deadline is spent, under whatever
deadline encloses the call.

Never handed over: a `BaseException` that is not an `Exception`
(cancellation, `KeyboardInterrupt`, `SystemExit`), and a sync function
called from async code or the reverse (a programming error).
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, Final

from resilient._core._logging import emit
from resilient._core._transient import every_leaf
from resilient._retry._machine import WrongShell


if TYPE_CHECKING:
    from resilient._core._settings import RetrySettings


log: Final = logging.getLogger("resilient")


def falls_back(policy: RetrySettings, exc: BaseException) -> bool:
    """
    Whether *policy*'s fallback takes over from *exc*: *fallback_on*
    accepts it, or it is an exception group (an error inside a task group)
    and *fallback_on* accepts every leaf, the rule of *retry_on*.
    """
    if not isinstance(exc, Exception) or isinstance(exc, WrongShell):
        return False
    if _handles(policy, exc):
        return True
    return isinstance(exc, ExceptionGroup) and every_leaf(
        exc,
        lambda leaf: isinstance(leaf, Exception) and _handles(policy, leaf),
    )


def _handles(policy: RetrySettings, exc: Exception) -> bool:
    handles = policy.fallback_on
    if isinstance(handles, tuple):
        return isinstance(exc, handles)
    try:
        return bool(handles(exc))
    except Exception:  # noqa: BLE001 - logged (emit)
        emit(
            log,
            logging.ERROR,
            "resilient: fallback_on predicate %r of policy %r raised; the "
            "error is raised, not handed to the fallback",
            handles,
            policy.name,
            exc_info=True,
        )
        return False


def run_fallback(fallback: Any, exc: Exception) -> Any:
    """Call a sync fallback with the call's final exception."""
    result = fallback(exc)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise WrongShell(
            f"the fallback {fallback!r} returned an awaitable: an async "
            "fallback needs an async function"
        )
    return result


async def arun_fallback(fallback: Any, exc: Exception) -> Any:
    """Call a fallback from async code, awaiting it if it is async."""
    result = fallback(exc)
    if inspect.isawaitable(result):
        return await result
    return result
