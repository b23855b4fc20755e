"""
Making scopes: `timeout`, `timeout_at` and the checks of their arguments
(shared with `resilient._timeout._header`).
"""

from __future__ import annotations

import math
from datetime import timedelta

from resilient._core import _clock
from resilient._core._validate import check_name
from resilient._timeout._scope import TimeoutScope
from resilient.exceptions import ConfigError, ConfigTypeError


def seconds_arg(name: str, value: object) -> float | None:
    """
    Validate a duration: a number or timedelta >= 0, or None. A number too
    large for a float is `math.inf` (no limit).
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigTypeError(
            name, value, "must be a number of seconds, a timedelta or None"
        )
    if isinstance(value, int):
        return _clock.int_seconds(name, value)
    if math.isnan(value) or value < 0:
        raise ConfigError(name, value, "must be >= 0")
    return value


def _flag(interrupt: object) -> bool:
    if not isinstance(interrupt, bool):
        raise ConfigTypeError(
            "timeout(interrupt)", interrupt, "must be a bool"
        )
    return interrupt


def scope_name(where: str, name: object) -> str | None:
    """Validate a scope's name: a non-blank str, or None."""
    if name is None:
        return None
    check_name(where, name)
    assert isinstance(name, str)  # noqa: S101
    return name


def timeout(
    seconds: float | timedelta | None,
    *,
    interrupt: bool = False,
    name: str | None = None,
) -> TimeoutScope:
    """
    A scope that stops its block after *seconds*, raising `TimedOut`.

    Use it as ``with`` in sync code and as ``with`` or ``async with`` in
    async code (asyncio or trio, detected when entered)::

        with resilient.timeout(2.0):
            resilient.checkpoint()

        async with resilient.timeout(2.0):
            await client.get(url)

    It nests with every other deadline: an inner one can only shrink the
    time left, and the one whose time ran out raises. Everything inside
    sees the deadline through `resilient.remaining()`.

    Args:
        seconds: Time allowed from entry, in seconds (or a timedelta);
            None sets no limit of its own, which still makes a scope
            that `TimeoutScope.cancel` can stop. A number too large for a
            float (``10**400``) means no limit, like `math.inf`.
        interrupt: In sync code in the main thread, also interrupt
            blocking code (``time.sleep``, socket reads, lock waits...)
            with ``SIGALRM``; ignored elsewhere and in async code.
            Off by default: see the timeouts guide for what it can break.
        name: A name for the scope, shown in its repr and in `TimedOut`.

    Raises:
        ConfigError: *seconds* is negative or NaN, or *name* is blank.
        ConfigTypeError: *seconds* is not a number, timedelta or None, or
            *name* not a str or None.

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       *name*; huge *seconds* mean no limit instead of `OverflowError`.
    """
    s = seconds_arg("timeout(seconds)", seconds)
    return TimeoutScope(
        seconds=s,
        at=None,
        interrupt=_flag(interrupt),
        name=scope_name("timeout(name)", name),
    )


def timeout_at(
    deadline: float | None,
    *,
    interrupt: bool = False,
    name: str | None = None,
) -> TimeoutScope:
    """
    A scope that stops its block at the absolute time *deadline*.

    Like `timeout`, with the deadline read on resilient's clock
    (`time.monotonic` unless a test installed a fake clock), for example
    ``time.monotonic() + 5`` or another scope's ``at``.

    Args:
        deadline: Absolute time in seconds on resilient's clock; None sets
            no limit of its own. A number too large for a float is
            `math.inf` (no limit), or ``-math.inf`` (past) if negative.
        interrupt: As for `timeout`.
        name: As for `timeout`.

    Raises:
        ConfigError: *deadline* is NaN, or *name* is blank.
        ConfigTypeError: *deadline* is not a number or None, or *name* not
            a str or None.

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       *name*; huge deadlines mean no limit instead of `OverflowError`.
    """
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise ConfigTypeError(
                "timeout_at(deadline)", deadline, "must be a number or None"
            )
        if isinstance(deadline, int):
            deadline = _clock.int_seconds(
                "timeout_at(deadline)", deadline, signed=True
            )
        if math.isnan(deadline):
            raise ConfigError("timeout_at(deadline)", deadline, "is NaN")
    return TimeoutScope(
        seconds=None,
        at=deadline,
        interrupt=_flag(interrupt),
        name=scope_name("timeout_at(name)", name),
    )
