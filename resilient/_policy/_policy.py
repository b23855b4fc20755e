"""
`Policy`: one frozen, validated description of how to call a dependency,
with its variants (`Policy.evolve`, typed by `PolicyChanges`), its repr, and
its one-call forms (`Policy.call`, `Policy.acall`).

A `Policy` is plain data. The stateful parts a policy names (breakers,
bulkheads, retry budgets) live in registries keyed by the policy's name.
``@policy`` is `retry` (`._apply`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    ParamSpec,
    TypedDict,
    TypeVar,
    Unpack,
    final,
)

import attrs

from resilient._core._backoff import FullJitter
from resilient._core._config_breaker import BreakerConfig
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._core._config_retry_budget import RetryBudgetConfig
from resilient._core._decorate import is_async_callable, stream_kind
from resilient._core._hints import default_retry_after
from resilient._core._keywords import settings_checked
from resilient._core._policy_checks import (
    UNNAMED,
    Unnamed,
    check_attempts,
    check_backoff,
    check_fallback,
    check_fallback_on,
    check_hook,
    check_last_result,
    check_name,
    check_predicate,
    check_retry_on,
    check_timeout_within_budget,
    instance_or_none,
)
from resilient._core._shown import shown
from resilient._core._transient import Transient
from resilient._core._validate import (
    field_name,
    non_negative,
    positive_or_none,
    to_exception_classes,
    to_seconds,
)
from resilient._pipeline._guards import Guards
from resilient._pipeline._run import call_async, call_sync
from resilient._pipeline._stream import policy_streams
from resilient._policy._colour import awaiting, refuse_async_hooks
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    import datetime as dt

    from resilient.typing import (
        AsyncHook,
        Backoff,
        ExceptionPredicate,
        Fallback,
        Hook,
        ResultPredicate,
        RetryAfter,
    )


_P = ParamSpec("_P")
_T = TypeVar("_T")

RetryOn = (
    type[Exception] | tuple[type[Exception], ...] | Callable[[Exception], bool]
)

DEFAULT_RETRY_ON: Final = Transient()
"""The default *retry_on*: `resilient.Transient` with its defaults."""


def _check_optional_bool(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None and not isinstance(value, bool):
        raise ConfigTypeError(
            field_name(inst, attribute), value, "must be True, False or None"
        )


@final
@settings_checked
@attrs.frozen(kw_only=True, repr=False)
class Policy:
    """
    How to call one dependency: attempts, backoff, budget, timeouts, and what
    counts as transient.

    Frozen and validated at construction: a bad value raises `ConfigError`
    (a `ValueError`) or `ConfigTypeError` (also a `TypeError`) naming the
    field and the value. Make variants with `evolve`.

    A policy is also a decorator: ``@policy`` applies everything it
    describes, sync or async.

    Args:
        name: The dependency's name. Names spans and metrics, and later the
            breaker, bulkhead and retry budget the policy shares with every
            other policy of that name.
        attempts: Total attempts, the first one included. None means no
            limit other than *budget* (which then must be set).
        backoff: The wait before each retry.
        budget: Seconds for the whole call, attempts and waits included;
            None for no limit (then *attempts* must be set). No wait is
            started that would end past it, and each attempt's *timeout* is
            clipped to what is left. An enclosing `resilient.deadline`
            shortens it further.
        timeout: Seconds for one attempt, or None. Async attempts are
            cancelled when it passes; sync attempts see it through
            `resilient.remaining` and `resilient.checkpoint`.
        retry_on: Which exceptions are transient: exception classes (a tuple
            or a single class) or a predicate over the exception (such as
            `Transient`, the default). An attempt cut short by the
            policy's own *timeout* is retried whatever *retry_on* says (the
            timeout is the policy's decision, not the dependency's error),
            unless it cut an HTTP request that may not be repeated (a
            ``POST`` without an idempotency key in flight in httpx).
        retry_if_result: A predicate over a returned value: retry while it
            returns True. A response-like result (one with an HTTP status)
            to a request that may not be repeated (a ``POST`` without an
            idempotency key, as `Transient.may_repeat` says) is not
            retried.
        last_result: What a call gives when retrying on a result stops (the
            attempts or the budget ran out, or the request may not be
            repeated): ``"return"`` (the default) returns the last result;
            ``"raise"`` raises `resilient.exceptions.GaveUpOnResult`
            carrying it.
        retry_after: Reads a server's wait hint (``Retry-After``) from an
            exception; when it returns seconds they replace the backoff delay
            for that retry, clamped to *max_retry_after*. None ignores hints.
        max_retry_after: Seconds; the largest server hint honoured.
        before_sleep: Called with a `RetryEvent` before each wait. Async
            hooks are awaited in async code and refused on sync functions.
            A hook that raises is logged and changes nothing.
        on_give_up: Called with a `RetryEvent` when resilient gives up.
        breaker: A circuit breaker between retry and the call, shared by
            every policy of this *name*; None for none.
        bulkhead: A bound on concurrent calls (and on callers waiting for
            one) to this dependency, shared by name; None for none.
        retry_budget: A token bucket shared by every caller of this
            dependency that refuses retries beyond a share of the calls;
            None for none.
        fallback: The outermost stage: called with the exception that
            ends the call (retry gave up, `CircuitOpen`, `BulkheadFull`, a
            deadline) when *fallback_on* accepts it; the call returns what
            it returns, or raises what it raises (it may re-raise the
            exception). It runs outside the call's budget, under any
            enclosing deadline. An async fallback is for async functions
            only. Not supported by the block form (`retrying`).
        fallback_on: Which final exceptions the fallback takes over from:
            exception classes or a predicate; by default every `Exception`
            (never a cancellation, `KeyboardInterrupt` or `SystemExit`).
        wait_for_breaker: Whether a call sits out an open *breaker*: True
            waits until it admits a probe (within the budget) and tries
            again; False gives up at once with `CircuitOpen` (to the
            *fallback*, if any), and a retry never waits for the breaker
            either; None (the default) waits unless the policy has a
            *fallback*, which then answers at once.

    Applied to a function (``@policy``, `retry`) or a block (`retrying`),
    the stages run in this order, outermost first: fallback (functions
    only), total budget, retry (asking the retry budget before each retry),
    breaker, bulkhead, attempt timeout, the call. Each runs only if
    configured.

    Defaults follow common practice for calls to remote APIs: 4 attempts,
    full jitter from 0.2 s capped at 5 s, a 30 s budget, and retries on
    what `Transient` calls transient: connection errors and timeouts
    (the built-ins' and those of httpx, requests, aiohttp, redis-py and
    the PostgreSQL drivers) and HTTP 429, 502, 503 and 504.

    .. versionadded:: 26.11.0
    """

    name: str = attrs.field(default=UNNAMED, validator=check_name)
    attempts: int | None = attrs.field(default=4, validator=check_attempts)
    backoff: Backoff = attrs.field(factory=FullJitter, validator=check_backoff)
    budget: float | None = attrs.field(
        default=30.0, converter=to_seconds, validator=positive_or_none
    )
    timeout: float | None = attrs.field(
        default=None, converter=to_seconds, validator=positive_or_none
    )
    retry_on: tuple[type[Exception], ...] | ExceptionPredicate = attrs.field(
        default=DEFAULT_RETRY_ON,
        converter=to_exception_classes,
        validator=check_retry_on,
    )
    retry_if_result: ResultPredicate | None = attrs.field(
        default=None, validator=check_predicate
    )
    last_result: Literal["return", "raise"] = attrs.field(
        default="return", validator=check_last_result
    )
    retry_after: RetryAfter | None = attrs.field(
        default=default_retry_after, validator=check_predicate
    )
    max_retry_after: float = attrs.field(
        default=60.0, converter=to_seconds, validator=non_negative
    )
    before_sleep: Hook | AsyncHook | None = attrs.field(
        default=None, validator=check_hook
    )
    on_give_up: Hook | AsyncHook | None = attrs.field(
        default=None, validator=check_hook
    )
    breaker: BreakerConfig | None = attrs.field(
        default=None, validator=instance_or_none(BreakerConfig)
    )
    bulkhead: BulkheadConfig | None = attrs.field(
        default=None, validator=instance_or_none(BulkheadConfig)
    )
    retry_budget: RetryBudgetConfig | None = attrs.field(
        default=None, validator=instance_or_none(RetryBudgetConfig)
    )
    fallback: Fallback | None = attrs.field(
        default=None, validator=check_fallback
    )
    fallback_on: tuple[type[Exception], ...] | ExceptionPredicate = (
        attrs.field(
            default=(Exception,),
            converter=to_exception_classes,
            validator=check_fallback_on,
        )
    )
    wait_for_breaker: bool | None = attrs.field(
        default=None, validator=_check_optional_bool
    )
    _async_hooks: bool = attrs.field(
        init=False, default=False, repr=False, eq=False
    )
    _async_fallback: bool = attrs.field(
        init=False, default=False, repr=False, eq=False
    )
    _guards: Guards | None = attrs.field(
        init=False, default=None, repr=False, eq=False
    )

    def __attrs_post_init__(self) -> None:
        if self.attempts is None and self.budget is None:
            raise ConfigError(
                "Policy.attempts",
                None,
                "may only be None (unbounded) when Policy.budget is set",
            )
        check_timeout_within_budget(self.timeout, self.budget)
        if type(self.name) is Unnamed and (
            self.breaker is not None
            or self.bulkhead is not None
            or self.retry_budget is not None
        ):
            raise ConfigError(
                "Policy.name",
                None,
                "must be given when the policy has a breaker, bulkhead or "
                "retry_budget: they are shared by every policy of one name, "
                "so unnamed policies would share one guard",
            )
        # Worked out once here, not on every call that asks. (A
        # functools.cached_property would do it too, but on a slotted attrs
        # class it slowed every call through the policy by ~90 ns.)
        object.__setattr__(
            self,
            "_async_hooks",
            any(
                is_async_callable(h)
                for h in (self.before_sleep, self.on_give_up)
                if h is not None
            ),
        )
        object.__setattr__(
            self,
            "_async_fallback",
            self.fallback is not None and is_async_callable(self.fallback),
        )

    @property
    def waits_for_breaker(self) -> bool:
        """Whether a call sits out an open breaker (*wait_for_breaker*,
        or by default: when there is no fallback)."""
        wait = self.wait_for_breaker
        return self.fallback is None if wait is None else wait

    @property
    def has_async_hooks(self) -> bool:
        """Whether a hook is a coroutine function (async code only)."""
        return self._async_hooks

    def evolve(self, **changes: Unpack[PolicyChanges]) -> Policy:
        """
        A copy with *changes* applied and validated again.

        Example:
            >>> import resilient
            >>> base = resilient.Policy(name="payments")
            >>> base.evolve(attempts=2).attempts
            2
        """
        return attrs.evolve(self, **changes)

    def __call__(self, fn: Callable[_P, _T], /) -> Callable[_P, _T]:
        """
        Apply the whole policy to *fn* (sync or async): ``@policy``.
        """
        from resilient._policy._apply import retry  # noqa: PLC0415 - it imports Policy

        return retry(self)(fn)

    def _call_guards(self) -> Guards | None:
        guards = self._guards
        if guards is None:
            guards = Guards.of(self)
            object.__setattr__(self, "_guards", guards)
        return guards

    def call(
        self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        """
        Call *fn* once through the whole policy, without decorating it.

        For a call site that is not worth a decorator: ``payments.call(
        client.post, url, json=body)``. Same semantics as ``@policy``.
        For a generator function (sync or async), returns its guarded
        stream, as ``@policy`` would.

        Raises:
            TypeError: *fn* is async (use `acall`), or the policy has async
                hooks.

        Example:
            >>> import resilient
            >>> resilient.Policy(name="math").call(divmod, 7, 2)
            (3, 1)

        .. versionadded:: 26.11.0
        """
        if is_async_callable(fn):
            raise TypeError(
                f"{fn!r} is async: call it with `await policy.acall(fn, "
                "...)`, not policy.call()"
            )
        kind = stream_kind(fn)
        if kind == "async":
            stream = policy_streams(self, self._call_guards())(fn, True)
            return stream(*args, **kwargs)  # type: ignore[no-any-return]
        if self._async_hooks or self._async_fallback:
            refuse_async_hooks(self)(fn)
        if kind == "sync":
            stream = policy_streams(self, self._call_guards())(fn, False)
            return stream(*args, **kwargs)  # type: ignore[no-any-return]
        return call_sync(self, self._call_guards(), fn, args, kwargs)  # type: ignore[no-any-return]

    async def acall(
        self,
        fn: Callable[_P, Awaitable[_T]],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """
        Await ``fn(*args, **kwargs)`` once through the whole policy.

        The async twin of `call`: ``await payments.acall(client.post, url)``.

        Raises:
            TypeError: ``fn(...)`` did not return an awaitable (use `call`),
                or *fn* is a generator function (iterate `call`'s stream).

        .. versionadded:: 26.11.0
        """
        if stream_kind(fn) is not None:
            raise TypeError(
                f"{fn!r} is a generator function: iterate `policy.call(fn, "
                "...)` (or decorate it) instead of awaiting policy.acall()"
            )
        if not is_async_callable(fn):
            fn = awaiting(fn)
        return await call_async(self, self._call_guards(), fn, args, kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        fields = [f"name={shown(self.name)!r}"]
        for a in attrs.fields(Policy):
            if not a.init or a.name == "name":
                continue
            value = getattr(self, a.name)
            if value != _DEFAULTS[a.name]:
                fields.append(f"{a.alias}={_short(value)}")
        return f"Policy({', '.join(fields)})"


def _short(value: object) -> str:
    name = getattr(value, "__qualname__", None)
    if (
        callable(value)
        and isinstance(name, str)
        and not isinstance(value, type)
    ):
        return name
    if isinstance(value, tuple):
        inner = ", ".join(_short(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, type):
        return value.__qualname__
    return repr(value)


class PolicyChanges(TypedDict, total=False):
    """The keyword arguments `Policy.evolve` takes, typed."""

    name: str
    attempts: int | None
    backoff: Backoff
    budget: float | dt.timedelta | None
    timeout: float | dt.timedelta | None
    retry_on: RetryOn
    retry_if_result: ResultPredicate | None
    last_result: Literal["return", "raise"]
    retry_after: RetryAfter | None
    max_retry_after: float | dt.timedelta
    before_sleep: Hook | AsyncHook | None
    on_give_up: Hook | AsyncHook | None
    breaker: BreakerConfig | None
    bulkhead: BulkheadConfig | None
    retry_budget: RetryBudgetConfig | None
    fallback: Fallback | None
    fallback_on: RetryOn
    wait_for_breaker: bool | None


def _default(a: attrs.Attribute[Any]) -> object:
    d: Any = a.default
    factory = getattr(d, "factory", None)
    return factory() if callable(factory) else d


_DEFAULTS: dict[str, object] = {
    a.name: _default(a) for a in attrs.fields(Policy) if a.init
}
