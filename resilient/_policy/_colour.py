"""
What keeps a policy's colours apart: a sync function cannot await a
policy's async hooks or fallback (`refuse_async_hooks`), and `Policy.acall`
wraps a function that is not a coroutine function so that what it returns
must be awaitable (`awaiting`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from resilient._retry._machine import WrongShell
from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from resilient._policy._policy import Policy


def awaiting(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """*fn* (not a coroutine function) for `Policy.acall`: what it returns
    must be awaitable (a lambda or partial that makes a coroutine is)."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if not inspect.isawaitable(result):
            raise WrongShell(
                f"{fn!r} is sync (it returned {type(result).__name__}, "
                "not an awaitable): call it with policy.call(fn, ...), "
                "not `await policy.acall(fn, ...)`"
            )
        return await result

    return call


def refuse_async_hooks(
    policy: Policy,
) -> Callable[[Callable[..., Any]], None]:
    def check(fn: Callable[..., Any]) -> None:
        if policy._async_fallback:  # noqa: SLF001 - the policy's own package
            raise ConfigTypeError(
                "Policy.fallback",
                policy.fallback,
                f"of policy {policy.name!r} is async, which a sync function "
                f"({fn!r}) cannot await",
            )
        if policy.has_async_hooks:
            raise ConfigTypeError(
                "Policy.before_sleep/on_give_up",
                fn,
                f"of policy {policy.name!r} are async, which a sync "
                "function cannot await",
            )

    return check
