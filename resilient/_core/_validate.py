"""
Converters and validators shared by every configuration class.

Each error names the field (``Class.field``) and the refused value.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any

from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    import attrs


def field_name(inst: object, attribute: attrs.Attribute[Any]) -> str:
    """
    The name a user wrote: the class and the keyword, not the private name.
    """
    return f"{type(inst).__name__}.{attribute.alias}"


def to_seconds(value: float | dt.timedelta | None) -> Any:
    """
    Accept `datetime.timedelta` and ints for durations; leave the rest alone.

    The validator that follows rejects what is still not a float, so this
    never raises on its own: an int too large for a float becomes an
    infinity, which the validator refuses as not finite.

    Typed for what callers may pass, which is what type checkers show for
    the field's parameter; at run time anything may come, hence `given`.
    """
    given: object = value
    if isinstance(given, dt.timedelta):
        return given.total_seconds()
    if isinstance(given, int) and not isinstance(given, bool):
        try:
            return float(given)
        except OverflowError:
            return math.inf if given > 0 else -math.inf
    return given


def check_number(
    inst: object,
    attribute: attrs.Attribute[Any],
    value: object,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    maximum: float | None = None,
    allow_none: bool = False,
) -> None:
    """
    A finite float, >= (or > when *strict*) *minimum* and <= *maximum*, or
    None if allowed.
    """
    name = field_name(inst, attribute)
    if value is None:
        if allow_none:
            return
        raise ConfigTypeError(name, value, "must be a number of seconds")
    if isinstance(value, bool) or not isinstance(value, float):
        raise ConfigTypeError(name, value, "must be a number")
    if math.isnan(value) or math.isinf(value):
        hint = " (use None for no limit)" if allow_none else ""
        raise ConfigError(name, value, f"must be finite{hint}")
    if strict and value <= minimum:
        raise ConfigError(name, value, f"must be > {minimum:g}")
    if value < minimum:
        raise ConfigError(name, value, f"must be >= {minimum:g}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, value, f"must be <= {maximum:g}")


def non_negative(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A finite number of seconds, zero allowed."""
    check_number(inst, attribute, value)


def positive(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A finite number > 0."""
    check_number(inst, attribute, value, strict=True)


def positive_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A finite number > 0, or None for no limit."""
    check_number(inst, attribute, value, strict=True, allow_none=True)


def check_int(
    inst: object,
    attribute: attrs.Attribute[Any],
    value: object,
    *,
    minimum: int = 1,
    allow_none: bool = False,
) -> None:
    """
    An int (never a bool) >= *minimum*, or None if allowed.
    """
    name = field_name(inst, attribute)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(name, value, "must be an int")
    if value < minimum:
        raise ConfigError(name, value, f"must be >= {minimum}")


def positive_int(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """An int >= 1."""
    check_int(inst, attribute, value)


def positive_int_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """An int >= 1, or None for no limit."""
    check_int(inst, attribute, value, allow_none=True)


def callable_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A callable, or None."""
    if value is not None and not callable(value):
        raise ConfigTypeError(
            field_name(inst, attribute), value, "must be callable or None"
        )


def probability(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A float in [0, 1]."""
    check_number(inst, attribute, value, maximum=1.0)


def check_name(where: str, value: object) -> None:
    """
    A dependency's name: a str that is not blank. *where* names the field
    or the argument, like ``"Policy.name"`` or ``"breaker(name)"``.
    """
    if not isinstance(value, str):
        raise ConfigTypeError(where, value, "must be a str")
    if not value.strip():
        raise ConfigError(where, value, "must not be empty")


def to_exception_classes(value: object) -> object:
    """Let a single exception class (or a list) stand for a tuple."""
    if isinstance(value, type):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    return value


def check_exception_classes(
    where: str, value: tuple[object, ...], *, never: str
) -> None:
    """
    Exception classes, all `Exception` subclasses: cancellation,
    KeyboardInterrupt and SystemExit are refused, *never* saying why.
    """
    for item in value:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigTypeError(where, item, "must hold exception classes")
        if not issubclass(item, Exception):
            raise ConfigError(
                where,
                item,
                "must hold Exception subclasses: cancellation, "
                f"KeyboardInterrupt and SystemExit {never}",
            )


def check_classes_or_predicate(
    inst: object,
    attribute: attrs.Attribute[Any],
    value: object,
    *,
    never: str,
) -> None:
    """Exception classes (see `check_exception_classes`) or a predicate."""
    name = field_name(inst, attribute)
    if isinstance(value, tuple):
        check_exception_classes(name, value, never=never)
    elif not callable(value):
        raise ConfigTypeError(
            name, value, "must be exception classes or a predicate"
        )


def same_config(a: object, b: object) -> bool:
    """
    Whether two configurations are equal, identity first: a policy asks
    the registries with the very object they hold, and an attrs equality
    check builds two tuples of every field.
    """
    return a is b or a == b
