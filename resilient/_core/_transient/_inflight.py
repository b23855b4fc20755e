"""
The HTTP request an exception cut short: what was in flight when a
deadline cancelled an async attempt.

An attempt cancelled by its policy's own timeout ends in resilient's
`DeadlineExceeded`, not in the client's timeout error, which would carry
the request (httpx's `ReadTimeout` does, and `Transient` judges a POST by
it). The cancellation passed through the client's frames on its way out,
though, and its traceback keeps them: the innermost frame of httpx's own
code that holds a request (or a response, which holds its request) names
the request that was in flight. `resilient._pipeline._call.timed_out`
puts it on the error as ``request``, so the same rule judges it.

Only httpx's frames are read: a request object in the caller's own frames
may be one it is done with. A request found there was being sent or
answered; whether its bytes had left the client is not known, so it counts
as sent (a POST waiting for a pooled connection is not repeated either).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final


if TYPE_CHECKING:
    from collections.abc import Iterable


_CLIENTS: Final = frozenset({"httpx"})
"""The top-level packages whose frames are read."""
_REQUESTS: Final = frozenset({("httpx", "Request")})
_RESPONSES: Final = frozenset({("httpx", "Response")})
_MAX_FRAMES: Final = 256


def in_flight_request(exc: BaseException) -> object | None:
    """The HTTP request *exc* unwound through an HTTP client's code while
    sending or answering, the innermost one; None if there was none."""
    found: object | None = None
    tb = exc.__traceback__
    for _ in range(_MAX_FRAMES):
        if tb is None:
            break
        frame = tb.tb_frame
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.partition(".")[0] in _CLIENTS:
            request = _request_in(frame.f_locals.values())
            if request is not None:
                found = request
        tb = tb.tb_next
    return found


def _request_in(values: Iterable[object]) -> object | None:
    for value in values:
        cls = type(value)
        key = (cls.__module__.partition(".")[0], cls.__name__)
        if key in _REQUESTS:
            return value
        if key in _RESPONSES:
            try:
                request: object | None = getattr(value, "request", None)
            except RuntimeError:  # httpx: a response made without one
                continue
            return request
    return None
