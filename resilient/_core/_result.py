"""
Retrying on a response: `retry_if_status`, a ``retry_if_result`` predicate
over a response-like result's HTTP status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

from resilient._core._transient import DEFAULT_STATUSES, http_status
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Iterable


@final
class _RetryIfStatus:
    """The predicate `retry_if_status` makes."""

    __slots__ = ("statuses",)

    def __init__(self, statuses: frozenset[int]) -> None:
        self.statuses: Final = statuses

    def __call__(self, result: object) -> bool:
        return http_status(result) in self.statuses

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _RetryIfStatus)
            and other.statuses == self.statuses
        )

    def __hash__(self) -> int:
        return hash(self.statuses)

    def __repr__(self) -> str:
        return f"retry_if_status({sorted(self.statuses)!r})"


def retry_if_status(
    statuses: Iterable[int] = DEFAULT_STATUSES,
) -> _RetryIfStatus:
    """
    A ``retry_if_result`` predicate: retry a returned response whose HTTP
    status (read by `http_status`: httpx, requests and aiohttp responses)
    is in *statuses* (by default 429, 502, 503 and 504, as `Transient`).

    A response retried this way has its ``Retry-After`` honoured like an
    error's (with the policy's default *retry_after*), and when the
    attempts run out the last response is returned.

    Raises:
        ConfigTypeError: *statuses* does not hold int status codes.
        ConfigError: a code is not between 100 and 599.

    Example:
        >>> import resilient
        >>> class Response:
        ...     status_code = 503
        >>> resilient.retry_if_status()(Response())
        True

    .. versionadded:: 26.12.0
    """
    try:
        codes = frozenset(statuses)
    except TypeError:
        raise ConfigTypeError(
            "retry_if_status(statuses)", statuses, "must be status codes"
        ) from None
    for code in codes:
        if isinstance(code, bool) or not isinstance(code, int):
            raise ConfigTypeError(
                "retry_if_status(statuses)", statuses, "must hold int codes"
            )
        if not 100 <= code <= 599:
            raise ConfigError(
                "retry_if_status(statuses)",
                statuses,
                "must hold codes from 100 to 599",
            )
    return _RetryIfStatus(codes)
