"""
Server wait hints: ``Retry-After`` headers and ``retry_after`` attributes.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
import time
from collections.abc import Mapping


def parse_retry_after(
    value: object, *, now: float | None = None
) -> float | None:
    """
    Seconds to wait from a hint, or None if there is no usable hint.

    Accepts a number of seconds, a `datetime.timedelta`, a `datetime.datetime`
    or a ``Retry-After`` header value (`str` or `bytes`): delay-seconds
    (``"120"``) or an HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``, RFC 9110
    section 10.2.3). A date in the past gives 0.0; garbage, NaN, infinite and
    negative values give None; a number too large for a float (a header of
    hundreds of digits) gives `math.inf`, which retry clamps to its
    *max_retry_after*. A naive `datetime.datetime` is taken as UTC, the zone
    every HTTP-date is in.

    .. versionchanged:: 26.12.0
       A hint too large for a float gives `math.inf`, not None.

    Args:
        value: The hint.
        now: The wall-clock time (`time.time`) to measure a date against.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        value = _parse_header(value.strip())
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # An int beyond any float: a very long wait.
            return math.inf if value > 0 else None
        return seconds if 0 <= seconds < math.inf else None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        wall = time.time() if now is None else now
        return max(0.0, value.timestamp() - wall)
    return None


# Longer digit strings are far beyond any float (and int() limits them).
_MAX_DIGITS = 400
_HUGE = 10**_MAX_DIGITS  # Stands for any longer number: beyond any float.


def _parse_header(text: str) -> object:
    """A header value as an int, an infinity, a datetime, or None."""
    # RFC 9110 delay-seconds is ASCII digits only ("²".isdigit() is true).
    if text.isascii() and text.isdigit():
        return int(text) if len(text) <= _MAX_DIGITS else _HUGE
    try:
        return email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _header(headers: object) -> object:
    if isinstance(headers, Mapping):
        for key in ("Retry-After", "retry-after"):
            if key in headers:
                return headers[key]
        # A plain dict is case-sensitive; header names are not.
        for key, value in headers.items():
            if isinstance(key, str | bytes) and key.lower() in _NAMES:
                return value
        return None
    get = getattr(headers, "get", None)
    return get("Retry-After") if callable(get) else None


_NAMES = ("retry-after", b"retry-after")


def default_retry_after(exc: Exception) -> float | None:
    """
    Read a wait hint from an exception, the way common clients carry one.

    Looks, in order, at ``exc.retry_after``; at ``exc.headers``; and at
    ``exc.response.headers`` (httpx's `HTTPStatusError`, requests'
    `HTTPError`), for a ``Retry-After`` value; the first place that has one
    wins. See `parse_retry_after`.

    .. versionadded:: 26.11.0
    """
    if type(exc).__module__ == "builtins" and not exc.__dict__:
        return None  # A plain built-in exception carries no hint (fast).
    hint = getattr(exc, "retry_after", None)
    if hint is None:
        hint = _header(getattr(exc, "headers", None))
    if hint is None:
        response = getattr(exc, "response", None)
        hint = _header(getattr(response, "headers", None))
    return parse_retry_after(hint)
