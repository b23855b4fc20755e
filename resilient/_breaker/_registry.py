"""
The breakers by name: `resilient.breaker` on the core registry.

One live breaker per name; a breaker that is not closed is pinned (never
dropped while it matters); a breaker made without a configuration
(``breaker("p").state``) is provisional and adopts the first explicit one
while it has seen no calls; `reset_registries` resets every breaker in
place, and the next lookup of that name finds the very same object again,
so a decorated function that holds it and the registry never disagree.
"""

from __future__ import annotations

import threading
import weakref
from typing import Final

from resilient._breaker._breaker import CircuitBreaker, _check_config
from resilient._core._config_breaker import BreakerConfig
from resilient._core._registry import DEFAULT_LIMIT, Registry


DEFAULT_MAX_BREAKERS: Final = DEFAULT_LIMIT
"""How many idle (closed) breakers the registry keeps alive on its own."""

_DEFAULT: Final = BreakerConfig()

_orphans: Final[dict[str, weakref.ref[CircuitBreaker]]] = {}
"""Breakers a reset let go of, weakly, by name: whoever still holds one
gets it back from the next lookup. (A plain dict: a miss costs nothing.)"""
_orphans_lock: Final = threading.Lock()


def _make(name: str, config: BreakerConfig) -> CircuitBreaker:
    """A new breaker, or the held one a reset let go of, reconfigured."""
    cb = None
    if _orphans:
        with _orphans_lock:
            ref = _orphans.pop(name, None)
        cb = None if ref is None else ref()
    if cb is None:
        return CircuitBreaker(name, config)
    with cb._lock:  # noqa: SLF001
        cb._rebuild(config)  # noqa: SLF001
    return cb


def _adopt(cb: CircuitBreaker, config: BreakerConfig) -> bool:
    """Take *config* in place while the breaker has seen no calls."""
    with cb._lock:  # noqa: SLF001
        if not cb._m.pristine():  # noqa: SLF001
            return False
        cb._rebuild(config)  # noqa: SLF001
    return True


def _reset(cb: CircuitBreaker) -> None:
    """Fresh state in place; the next lookup of its name finds it again."""
    with cb._lock:  # noqa: SLF001
        cb._rebuild(cb.config)  # noqa: SLF001
    cb._pinned = False  # noqa: SLF001
    with _orphans_lock:
        _orphans[cb.name] = weakref.ref(cb)


def _config_of(cb: CircuitBreaker) -> BreakerConfig:
    return cb.config


REGISTRY: Final[Registry[CircuitBreaker, BreakerConfig]] = Registry(
    "breaker",
    _make,
    lambda: _DEFAULT,
    config_of=_config_of,
    adopt=_adopt,
    reset=_reset,
    limit=DEFAULT_MAX_BREAKERS,
)


def breaker(name: str, config: BreakerConfig | None = None) -> CircuitBreaker:
    """
    The process-wide circuit breaker of the dependency *name*.

    The first call for a name makes the breaker, with *config*, or the
    defaults registered with `set_breaker_defaults` for that name, or for
    every name, or `BreakerConfig()`. Later calls return the same breaker.
    A breaker made without a configuration (``breaker("p").state`` to look
    at it) is provisional: the first explicit *config* for that name is
    adopted in place while the breaker has seen no calls. Otherwise asking
    with a *config* that differs from the one it has raises `ConfigError`
    naming the fields that differ (one name, one behaviour), and asking
    with None accepts whatever it has.

    The returned breaker is a decorator and a context manager, sync and
    async alike.

    Args:
        name: The dependency's name (not empty).
        config: How the breaker decides; None for the registered defaults.

    Raises:
        ConfigError: *config* differs from the existing breaker's, or
            *name* is empty.
        ConfigTypeError: *name* is not a str or *config* is not a
            `BreakerConfig`.

    Example:
        >>> import resilient
        >>> payments = resilient.breaker("payments")
        >>> payments is resilient.breaker("payments")
        True
        >>> payments.state
        <BreakerState.CLOSED: 'closed'>

    .. versionadded:: 26.11.0
    """
    if config is not None:
        _check_config(config)
    return REGISTRY.get(name, config)


get_breaker: Final = breaker
"""The registry lookup, under the name the pipeline uses."""


def set_breaker_defaults(
    config: BreakerConfig, *, name: str | None = None
) -> None:
    """
    Register the configuration breakers get when made without one.

    Applies to breakers made after the call. With *name*, a breaker of
    that name that exists already adopts *config* while it is provisional
    and has seen no calls; if it cannot, the call would have no effect and
    raises `ConfigError` naming the fields that differ.

    Args:
        config: The defaults.
        name: Only for the breaker of this name; None for every name
            without defaults of its own.

    Raises:
        ConfigError: *name* has a breaker already that cannot take
            *config*, or *name* is empty.
        ConfigTypeError: *config* is not a `BreakerConfig`, or *name* is
            not a str.

    .. versionadded:: 26.11.0
    """
    _check_config(config, "set_breaker_defaults(config)")
    REGISTRY.set_default(config, name)
