"""
Deadlines that travel with requests: the ``grpc-timeout`` header codec, and
the scope a request's header grants.

The value uses gRPC's ``grpc-timeout`` syntax: 1 to 8 ASCII digits and a
unit, H (hours), M (minutes), S (seconds), m (milliseconds), u
(microseconds) or n (nanoseconds). gRPC servers, Envoy and other proxies
read it as is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from resilient._core import _clock
from resilient._timeout._make import _flag, scope_name, seconds_arg
from resilient._timeout._scope import TimeoutScope


if TYPE_CHECKING:
    from datetime import timedelta

_UNITS: Final = (
    ("n", 1e-9),
    ("u", 1e-6),
    ("m", 1e-3),
    ("S", 1.0),
    ("M", 60.0),
    ("H", 3600.0),
)
_UNIT_SECONDS: Final = dict(_UNITS)
_MAX_VALUE: Final = 99_999_999


def deadline_header(seconds: float | None = None) -> str | None:
    """
    The time left, as a header value to pass on with an outgoing request.

    Encodes in gRPC's ``grpc-timeout`` syntax (``"1500m"`` is 1.5 s): the
    finest unit that fits in 8 digits, rounded down so the callee is never
    promised more time than is left. Send it as ``grpc-timeout`` to gRPC
    services, or under a header name of your choice elsewhere.

    Args:
        seconds: The time to encode; None reads `resilient.remaining()`.

    Returns:
        The value, or None when there is no deadline (send no header).

    Raises:
        ConfigError: *seconds* is negative or NaN.

    .. versionadded:: 26.11.0
    """
    if seconds is None:
        seconds = _clock.remaining()
    else:
        seconds = seconds_arg("deadline_header(seconds)", seconds)
        assert seconds is not None  # noqa: S101
    if seconds == math.inf:
        return None
    for unit, size in _UNITS:
        # A nanosecond of slack absorbs float error: 0.3 s is 300000000n
        # even though 0.3 / 1e-9 is a hair below.
        value = math.floor(seconds / size + 1e-9)
        if value <= _MAX_VALUE:
            return f"{value}{unit}"
    return f"{_MAX_VALUE}H"


def parse_deadline_header(value: str | bytes) -> float:
    """
    The seconds in a ``grpc-timeout`` style header value.

    Raises:
        ValueError: *value* is not 1 to 8 ASCII digits and one of the
            units H, M, S, m, u, n.

    .. versionadded:: 26.11.0
    """
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if not isinstance(text, str):
        raise TypeError(
            f"a deadline header must be str or bytes, got {value!r}"
        )
    text = text.strip()
    digits, unit = text[:-1], text[-1:]
    if (
        not 1 <= len(digits) <= 8
        or not (digits.isascii() and digits.isdigit())
        or unit not in _UNIT_SECONDS
    ):
        raise ValueError(
            f"bad deadline header {value!r}: expected 1 to 8 digits and a "
            "unit H, M, S, m, u or n, like '1500m'"
        )
    return int(digits) * _UNIT_SECONDS[unit]


def deadline_from_header(
    value: str | bytes | None,
    *,
    cap: float | timedelta | None = None,
    interrupt: bool = False,
    name: str | None = None,
) -> TimeoutScope:
    """
    A timeout scope for the budget an incoming request brought.

    ::

        with resilient.deadline_from_header(
            request.headers.get("grpc-timeout"), cap=30
        ):
            handle(request)

    Args:
        value: The header value (see `deadline_header`); None or empty
            means the caller sent none, which makes a scope with no limit.
        cap: The most time to grant whatever the header says, in seconds;
            None grants what it says. Enclosing deadlines still apply.
        interrupt: As for `timeout`.
        name: As for `timeout`.

    Raises:
        ValueError: *value* is not a valid header value.
        ConfigError: *cap* is negative or NaN, or *name* is blank.

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0
       *name*.
    """
    limit = seconds_arg("deadline_from_header(cap)", cap)
    seconds: float | None = None
    if value is not None and value not in {"", b""}:
        seconds = parse_deadline_header(value)
    if limit is not None:
        seconds = limit if seconds is None else min(seconds, limit)
    return TimeoutScope(
        seconds=seconds,
        at=None,
        interrupt=_flag(interrupt),
        name=scope_name("deadline_from_header(name)", name),
    )
