"""
The classifiers' attrs fields: the converters that accept sets, lists and
single classes, the validators that reject what cannot be statuses,
exception classes, HTTP methods or a header name, and the reprs that show
them at a glance (``{429, *range(500, 600)}``) and evaluate back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resilient._core._validate import field_name
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    import attrs


def _statuses(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    name = field_name(inst, attribute)
    if not isinstance(value, frozenset):
        raise ConfigTypeError(name, value, "must be a set of status codes")
    for code in value:
        if isinstance(code, bool) or not isinstance(code, int):
            raise ConfigTypeError(name, value, "must hold int status codes")
        if not 100 <= code <= 599:
            raise ConfigError(name, value, "must hold codes from 100 to 599")


def _classes(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    name = field_name(inst, attribute)
    if not isinstance(value, tuple) or not all(
        isinstance(c, type) and issubclass(c, Exception) for c in value
    ):
        raise ConfigTypeError(name, value, "must be Exception classes")


def _to_methods(value: object) -> object:
    if isinstance(value, set | list | tuple | frozenset):
        return frozenset(m.upper() if isinstance(m, str) else m for m in value)
    return value


def _methods(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is None:
        return
    if not isinstance(value, frozenset) or not all(
        isinstance(m, str) and m.isalpha() for m in value
    ):
        raise ConfigTypeError(
            field_name(inst, attribute),
            value,
            "must be a set of HTTP method names or None",
        )


def _header_name(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigTypeError(
            field_name(inst, attribute), value, "must be a header name"
        )


def _to_frozenset(value: object) -> object:
    if isinstance(value, set | list | tuple | range):
        return frozenset(value)
    return value


def _to_tuple(value: object) -> object:
    if isinstance(value, type):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    return value


def _statuses_repr(codes: frozenset[int]) -> str:
    """
    A set of status codes as a set display, sorted, with runs of five or
    more as ``*range(...)``: ``{429, *range(500, 600)}`` reads at a glance
    (the set itself holds 101 codes) and evaluates back to it.
    """
    if not codes:
        return "frozenset()"
    parts: list[str] = []
    ordered = sorted(codes)
    first = last = ordered[0]
    for code in [*ordered[1:], None]:
        if code is not None and code == last + 1:
            last = code
            continue
        if last - first >= 4:  # A run of five or more.
            parts.append(f"*range({first}, {last + 1})")
        else:
            parts.extend(str(c) for c in range(first, last + 1))
        if code is not None:
            first = last = code
    return "{" + ", ".join(parts) + "}"


def _classes_repr(classes: tuple[type[Exception], ...]) -> str:
    """Exception classes by name (qualified but for built-ins), as a tuple
    display that evaluates back where the names are in scope."""
    names = [
        c.__qualname__
        if c.__module__ == "builtins"
        else f"{c.__module__}.{c.__qualname__}"
        for c in classes
    ]
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def _methods_repr(methods: frozenset[str] | None) -> str:
    """HTTP methods as a sorted set display (None as is)."""
    if methods is None:
        return "None"
    if not methods:
        return "frozenset()"
    return "{" + ", ".join(repr(m) for m in sorted(methods)) + "}"
