"""
The validators of `resilient.Policy`: each refuses a value at construction
with a `ConfigError` or `ConfigTypeError` naming the field and the value,
so that nothing the policy holds can fail only at call time.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Final, final

from resilient._core._decorate import is_async_callable
from resilient._core._hints import default_retry_after
from resilient._core._validate import (
    callable_or_none,
    check_classes_or_predicate,
    field_name,
    positive_int_or_none,
)
from resilient._core._validate import check_name as _check_name
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable

    import attrs


@final
class Unnamed(str):
    """The default name, told apart from an explicit ``"default"``: a
    policy with a stateful guard must be named (they are shared by
    name)."""

    __slots__ = ()


UNNAMED: Final = Unnamed("default")


def check_name(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A dependency's name."""
    _check_name(field_name(inst, attribute), value)


def takes(where: str, fn: object, count: int, what: str) -> None:
    """
    Refuse *fn* unless it can be called with *count* positional arguments
    (when its signature can be read at all).
    """
    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return  # Some built-ins have no signature: trust them.
    try:
        signature.bind(*(None,) * count)
    except TypeError:
        raise ConfigTypeError(
            where,
            fn,
            f"must be callable with {what} "
            f"({count} positional argument{'s' if count != 1 else ''})",
        ) from None


def _sync_callable(where: str, fn: object, what: str, why: str) -> None:
    """A sync callable of one argument: an async one would be read as
    always true (a coroutine object is truthy)."""
    if is_async_callable(fn):
        raise ConfigTypeError(
            where, fn, f"must be a sync function ({why}), not async"
        )
    takes(where, fn, 1, what)


def check_backoff(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    where = field_name(inst, attribute)
    delay = None if isinstance(value, type) else getattr(value, "delay", None)
    if not callable(delay):
        raise ConfigTypeError(
            where,
            value,
            "must be a backoff strategy (an object with a delay() method, "
            "such as resilient.FullJitter())",
        )
    if is_async_callable(delay):
        raise ConfigTypeError(where, value, "must have a sync delay() method")
    takes(f"{where}.delay", delay, 3, "(retry, previous, rng)")


def check_retry_on(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_classes_or_predicate(
        inst, attribute, value, never="are never retried"
    )
    if value == ():
        # It used to be taken silently: a policy that never retries an
        # exception, which is what nobody writing () expects.
        raise ConfigError(
            field_name(inst, attribute),
            value,
            "is empty, so no exception would ever be retried; to retry "
            "none, say so with a predicate (retry_on=lambda exc: False)",
        )
    if not isinstance(value, tuple):
        _sync_callable(
            field_name(inst, attribute),
            value,
            "the exception",
            "it is asked in sync code too",
        )


def check_fallback_on(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_classes_or_predicate(
        inst, attribute, value, never="are never handed to a fallback"
    )
    if not isinstance(value, tuple):
        _sync_callable(
            field_name(inst, attribute),
            value,
            "the exception",
            "it is asked in sync code too",
        )


def check_fallback(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    callable_or_none(inst, attribute, value)
    if value is not None:
        takes(field_name(inst, attribute), value, 1, "the exception")


def check_predicate(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    callable_or_none(inst, attribute, value)
    if value is not None and value is not default_retry_after:
        _sync_callable(
            field_name(inst, attribute),
            value,
            "one argument",
            "it is asked in sync code too",
        )


LAST_RESULT: Final = ("return", "raise")
"""What `Policy.last_result` may say."""


def check_last_result(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """``"return"`` or ``"raise"``."""
    if not isinstance(value, str):
        raise ConfigTypeError(
            field_name(inst, attribute), value, 'must be "return" or "raise"'
        )
    if value not in LAST_RESULT:
        raise ConfigError(
            field_name(inst, attribute), value, 'must be "return" or "raise"'
        )


def check_hook(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    callable_or_none(inst, attribute, value)
    if value is not None:
        takes(field_name(inst, attribute), value, 1, "the RetryEvent")


def check_attempts(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    positive_int_or_none(inst, attribute, value)


def instance_or_none(
    cls: type,
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(
        inst: object, attribute: attrs.Attribute[Any], value: object
    ) -> None:
        if value is not None and not isinstance(value, cls):
            raise ConfigTypeError(
                field_name(inst, attribute),
                value,
                f"must be a resilient.{cls.__name__} or None",
            )

    return check


def check_timeout_within_budget(
    timeout: float | None, budget: float | None
) -> None:
    """
    Refuse an attempt *timeout* longer than the whole call's *budget*: the
    budget would always cut the attempt first, so the timeout could never
    be what stops it (it used to be accepted silently).
    """
    if timeout is not None and budget is not None and timeout > budget:
        raise ConfigError(
            "Policy.timeout",
            timeout,
            f"must be <= Policy.budget ({budget!r}): one attempt cannot "
            "take longer than the whole call; raise the budget or lower "
            "the timeout",
        )
