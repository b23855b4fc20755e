"""
Closing a result the policy discards to retry (``retry_if_status``,
``retry_if_result``): an HTTP response nobody will read holds its
connection until it is closed, and a pool of a few connections runs dry
after as many retries.

Only responses of the HTTP clients it knows (by class name, without
importing them) are closed: httpx's (``aclose`` in async code) and
requests'. Any other result is left alone, as its ``close`` could end
something shared. Closing is best effort: an error it raises is logged at
DEBUG and changes nothing (the retry goes on).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from resilient._core._logging import emit


log: Final = logging.getLogger("resilient")

_RESPONSES: Final = frozenset(
    {("httpx", "Response"), ("requests", "Response")}
)


def discards(value: object) -> bool:
    """Whether *value*, discarded, is a response to close."""
    cls = type(value)
    for c in cls.__mro__:
        if (c.__module__.partition(".")[0], c.__name__) in _RESPONSES:
            return True
    return False


def _close_failed(value: object) -> None:
    """Log, at DEBUG, that closing *value* raised (a close changes no
    outcome)."""
    emit(
        log,
        logging.DEBUG,
        "resilient: closing a discarded %r failed",
        value,
        exc_info=True,
    )


def close_discarded(value: Any) -> None:
    """Close a discarded response from sync code."""
    try:
        value.close()
    except Exception:  # noqa: BLE001 - logged
        _close_failed(value)


async def aclose_discarded(value: Any) -> None:
    """Close a discarded response from async code: httpx's async response
    with ``aclose``, a sync one (requests', a sync httpx client's) with
    ``close``."""
    try:
        aclose = getattr(value, "aclose", None)
        if aclose is None:
            value.close()
            return
        try:
            await aclose()
        except RuntimeError:
            # httpx: "Attempted to call an async close on a sync stream".
            value.close()
    except Exception:  # noqa: BLE001 - logged
        _close_failed(value)
