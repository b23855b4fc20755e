"""
How a policy is applied to code: `retry` (the decorator, also
``@policy``) and `Retrying` (`retrying`, the block form).
"""

from __future__ import annotations

from collections.abc import Callable  # noqa: TC003 - get_type_hints(retry) needs it
from typing import TYPE_CHECKING, ParamSpec, TypeVar, final

from resilient._core._decorate import decorate
from resilient._pipeline._block import _Attempts
from resilient._pipeline._guards import Guards
from resilient._pipeline._run import shells
from resilient._pipeline._stream import policy_streams
from resilient._policy._colour import refuse_async_hooks
from resilient._policy._policy import Policy
from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from resilient._pipeline._block import Attempt


_P = ParamSpec("_P")
_T = TypeVar("_T")


def retry(policy: Policy, /) -> Callable[[Callable[_P, _T]], Callable[_P, _T]]:
    """
    A decorator that retries a function as *policy* says.

    Works on sync and async functions (detected from the function), methods,
    class methods and static methods, and keeps their signatures.

    A generator function or async generator function is a stream, guarded
    from its first item to its end: retried only before its first item,
    its breaker permit and bulkhead slot held until it ends (see the
    Streams guide).

    Gives up by re-raising the last exception itself, with a note of the
    attempts, elapsed time and policy name; when retrying on a result
    stops, returns that last result (or raises
    `resilient.exceptions.GaveUpOnResult` when the policy's *last_result*
    is ``"raise"``).

    Args:
        policy: What to retry, how often, how long to wait.

    Raises:
        ConfigTypeError: *policy* is not a `Policy`, or it has async hooks
            (an ``async def`` hook or an object with an ``async def
            __call__``) and the function is sync.

    Example:
        >>> import resilient
        >>> @resilient.retry(resilient.Policy(name="flaky", attempts=3))
        ... def fetch() -> str:
        ...     return "ok"
        >>> fetch()
        'ok'

    .. versionadded:: 26.11.0
    """
    if not isinstance(policy, Policy):
        raise ConfigTypeError(
            "retry(policy)", policy, "must be a resilient.Policy"
        )
    # The guards are looked up once here, not on every call.
    guards = Guards.of(policy)
    sync_shell, async_shell = shells(policy, guards)

    def decorator(fn: Callable[_P, _T]) -> Callable[_P, _T]:
        return decorate(
            fn,
            sync_shell,
            async_shell,
            check_sync=refuse_async_hooks(policy),
            stream=policy_streams(policy, guards),
        )

    return decorator


@final
class Retrying:
    """
    The block form of retry, for code that is not a function.

    Iterate it with ``for`` in sync code and ``async for`` in async code; each
    item is an `Attempt` to enter around the code::

        for attempt in resilient.retrying(policy):
            with attempt:
                response = client.get(url)

        async for attempt in resilient.retrying(policy):
            async with attempt:
                response = await client.get(url)

    Same semantics as `retry`. Each iteration starts a fresh call, so one
    `Retrying` can be iterated many times.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("_guards", "policy")

    def __init__(self, policy: Policy, /) -> None:
        if not isinstance(policy, Policy):
            raise ConfigTypeError(
                "retrying(policy)", policy, "must be a resilient.Policy"
            )
        self.policy = policy
        self._guards = Guards.of(policy)

    def __repr__(self) -> str:
        return f"retrying({self.policy!r})"

    def _refuse_fallback(self) -> None:
        if self.policy.fallback is not None:
            raise ConfigTypeError(
                "Policy.fallback",
                self.policy.fallback,
                f"of policy {self.policy.name!r} is not supported by the "
                "block form (retrying): a block cannot return the "
                "fallback's value; decorate a function or use policy.call",
            )

    def __iter__(self) -> Iterator[Attempt]:
        self._refuse_fallback()
        if self.policy.has_async_hooks:
            raise ConfigTypeError(
                "Policy.before_sleep/on_give_up",
                self.policy,
                "are async, which a sync `for` loop cannot await",
            )
        return _Attempts(self.policy, self._guards, is_async=False)

    def __aiter__(self) -> AsyncIterator[Attempt]:
        self._refuse_fallback()
        return _Attempts(self.policy, self._guards, is_async=True)


retrying = Retrying
