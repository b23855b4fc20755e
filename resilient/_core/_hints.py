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
    or a ``Retry-After`` header value: delay-seconds (``"120"``) or an
    HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``, RFC 9110 section
    10.2.3). A date in the past gives 0.0; garbage, NaN and negative numbers
    give None.

    Args:
        value: The hint.
        now: The wall-clock time (`time.time`) to measure a date against.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, int | float):
        seconds = float(value)
        return seconds if seconds >= 0 and not math.isinf(seconds) else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return float(text)
        try:
            value = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        wall = time.time() if now is None else now
        return max(0.0, value.timestamp() - wall)
    return None


def _header(headers: object) -> object:
    if isinstance(headers, Mapping):
        for key in ("Retry-After", "retry-after"):
            if key in headers:
                return headers[key]
        return None
    get = getattr(headers, "get", None)
    return get("Retry-After") if callable(get) else None


def default_retry_after(exc: Exception) -> float | None:
    """
    Read a wait hint from an exception, the way common clients carry one.

    Looks, in order, at ``exc.retry_after``; at ``exc.headers``; and at
    ``exc.response.headers`` (httpx's `HTTPStatusError`, requests'
    `HTTPError`), for a ``Retry-After`` value. See `parse_retry_after`.

    .. versionadded:: 26.11.0
    """
    hint = getattr(exc, "retry_after", None)
    if hint is None:
        headers = getattr(exc, "headers", None)
        if headers is None:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        if headers is not None:
            hint = _header(headers)
    return parse_retry_after(hint)
