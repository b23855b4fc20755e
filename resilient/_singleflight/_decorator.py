"""
The `singleflight` decorator: a function's calls through a group (its
own, or one it is given), keyed by a key function or by the arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast

from resilient._core._decorate import decorate
from resilient._core._validate import check_name
from resilient._singleflight._async import fly
from resilient._singleflight._group import SingleFlight
from resilient._singleflight._sync import call
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable

    from resilient.typing import SingleFlightFunction


P = ParamSpec("P")
T = TypeVar("T")


def default_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """
    The key of a call without a key function: the positional arguments and
    the keyword arguments sorted by name, ``(args, ((name, value), ...))``.
    """
    return (args, tuple(sorted(kwargs.items())) if kwargs else ())


def singleflight(
    *,
    key: Callable[..., Hashable] | None = None,
    group: SingleFlight | None = None,
    name: str | None = None,
) -> Callable[[Callable[P, T]], SingleFlightFunction[P, T]]:
    """
    Concurrent calls of the decorated function (sync or async) with one
    key share one execution: see `SingleFlight` for what callers see.

    Args:
        key: Called with the call's arguments (``self`` included, for a
            method), returns the key. None: the arguments are the key,
            ``(args, ((name, value), ...))`` with the keyword arguments
            sorted by name; so ``f(1, b=2)`` and ``f(1, b=2)`` share, but
            ``f(1)`` and ``f(x=1)`` do not, and a method's calls share only
            for one instance.
        group: The `SingleFlight` to run in (to `forget` keys, or to share
            one group between functions, whose keys must then differ).
            None: a group of the function's own.
        name: Names the function's own group (default: the function's
            qualified name).

    Returns:
        A decorator; the function it makes (a `SingleFlightFunction`) has
        the handle on its group: ``fn.group``, ``fn.statistics()`` and
        ``fn.forget(key)``.

    Raises:
        ConfigTypeError: *key* is not callable, *group* not a
            `SingleFlight`, or *name* not a str.
        ConfigError: Both *group* and *name* are given, or *name* is blank.

    .. versionadded:: 26.12.0
    """
    _check_options(key, group, name)

    def decorator(fn: Callable[P, T]) -> SingleFlightFunction[P, T]:
        g = group
        if g is None:
            label = name or getattr(fn, "__qualname__", None) or repr(fn)
            g = SingleFlight(name=label)
        flights = g
        keyof = default_key if key is None else _spread(key)

        def sync_shell(f: Callable[..., Any], args: Any, kwargs: Any) -> Any:
            return call(flights, keyof(args, kwargs), f, args, kwargs)

        def async_shell(
            f: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
        ) -> Awaitable[Any]:
            return fly(flights, keyof(args, kwargs), f, *args, **kwargs)

        made = decorate(fn, sync_shell, async_shell, stream=_NO_STREAMS)
        # The handle lives on the function itself, so a method bound from
        # it reaches it too (a bound method reads its function's
        # attributes); for a classmethod or staticmethod, on the function
        # it wraps.
        target: Any = getattr(made, "__func__", made)
        target.group = flights
        target.statistics = flights.statistics
        target.forget = flights.forget
        return cast("SingleFlightFunction[P, T]", made)

    return decorator


_NO_STREAMS: Final = (
    "singleflight cannot share a stream between callers (each item would "
    "reach only one of them); share a function that collects it, such as "
    "one returning `list(gen())`"
)


def _check_options(key: object, group: object, name: object) -> None:
    """`singleflight`'s options, each of the right kind."""
    if key is not None and not callable(key):
        raise ConfigTypeError(
            "singleflight(key)", key, "must be callable or None"
        )
    if group is not None and not isinstance(group, SingleFlight):
        raise ConfigTypeError(
            "singleflight(group)", group, "must be a SingleFlight or None"
        )
    if name is not None:
        check_name("singleflight(name)", name)
        if group is not None:
            raise ConfigError(
                "singleflight(name)",
                name,
                "names the function's own group: give name= or group=, "
                "not both",
            )


def _spread(
    key: Callable[..., Hashable],
) -> Callable[[tuple[Any, ...], dict[str, Any]], Hashable]:
    """A key function called with the call's arguments spread out."""

    def keyof(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        return key(*args, **kwargs)

    return keyof
