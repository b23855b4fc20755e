"""
Recognising an exception's kind by the names of its classes, without
importing the client libraries: `_kind` (a transport error, a database
error judged by its SQLSTATE, a wrapper of another error, aiohttp's status
error; cached per type), and what an error carries: its SQLSTATE, its HTTP
status (`http_status`), a certificate failure down its chain, the request
it came from and whether that request was ever sent. Also the leaves of an
exception group, and `every_leaf`, the one rule for judging a group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from resilient._core._transient._tables import (
    _AIOHTTP_PROTOCOL,
    _AIOHTTP_RESPONSE,
    _BUILTIN,
    _CERTIFICATE,
    _NEVER,
    _NOT_SENT,
    _TRANSPORT,
    _WRAPPERS,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


_MAX_CACHED_TYPES: Final = 4096
_type_cache: dict[type, int] = {}

# What `_kind` says of a class.
_NO: Final = 0
_TRANSPORT_ERROR: Final = 1
_SQL: Final = 2
_WRAPPER: Final = 3
_RESPONSE: Final = 4
"""aiohttp's ClientResponseError: a status error, or the server breaking
HTTP (status 400 made up by the client, raised from the parser's
HttpProcessingError)."""


def _kind(cls: type) -> int:
    """What the classes of *cls*'s MRO say (cached per type)."""
    kind = _type_cache.get(cls)
    if kind is not None:
        return kind
    keys = _keys(cls)
    if keys & _NEVER:
        kind = _NO
    elif keys & _WRAPPERS:
        kind = _WRAPPER
    elif keys & _TRANSPORT:
        kind = _SQL if _is_sql_driver(keys) else _TRANSPORT_ERROR
    elif _AIOHTTP_RESPONSE in keys:
        kind = _RESPONSE
    elif issubclass(cls, _BUILTIN):
        kind = _TRANSPORT_ERROR
    else:
        kind = _NO
    if len(_type_cache) < _MAX_CACHED_TYPES:
        _type_cache[cls] = kind
    return kind


def _is_sql_driver(keys: set[tuple[str, str]]) -> bool:
    return any(p in {"psycopg", "psycopg2", "asyncpg"} for p, _ in keys)


def _sqlstate(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return code if isinstance(code, str) else None


def http_status(obj: object) -> int | None:
    """
    The HTTP status code an exception or a response carries, or None.

    Reads ``obj.status_code`` (httpx and requests responses, many SDKs'
    errors), ``obj.response.status_code`` (httpx's `HTTPStatusError`,
    requests' `HTTPError`) and ``obj.status`` (aiohttp's
    `ClientResponseError` and responses).

    Example:
        >>> import resilient
        >>> class Response:
        ...     status_code = 503
        >>> resilient.http_status(Response())
        503

    .. versionadded:: 26.12.0
    """
    for value in (
        getattr(obj, "status_code", None),
        getattr(getattr(obj, "response", None), "status_code", None),
        getattr(obj, "status", None),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _keys(cls: type) -> set[tuple[str, str]]:
    return {(c.__module__.partition(".")[0], c.__name__) for c in cls.__mro__}


def _certificate_failure(exc: BaseException) -> bool:
    """Whether a client's error was caused, a few links down its chain, by
    a certificate that failed verification (httpx's ConnectError is)."""
    seen = exc.__cause__ or exc.__context__
    for _ in range(8):
        if seen is None:
            return False
        if _CERTIFICATE in _keys(type(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _aiohttp_protocol_error(exc: BaseException) -> bool:
    """Whether an aiohttp ClientResponseError stands for the server
    breaking HTTP (raised from the parser's HttpProcessingError)."""
    cause = exc.__cause__
    return cause is not None and _AIOHTTP_PROTOCOL in _keys(type(cause))


def _request_of(obj: object) -> tuple[str, Any] | None:
    """The (method, headers) of the HTTP request an error or a response
    came from."""
    info = getattr(obj, "request_info", None)  # aiohttp
    if info is None:
        try:
            info = getattr(obj, "request", None)  # httpx, requests
        except RuntimeError:  # httpx: "the .request property has not been set"
            return None
    method = getattr(info, "method", None)
    if not isinstance(method, str):
        return None
    return method.upper(), getattr(info, "headers", None)


def _not_sent(exc: BaseException) -> bool:
    """Whether the request never left the client (connect errors)."""
    if _keys(type(exc)) & _NOT_SENT:
        return True
    # requests wraps urllib3's MaxRetryError(reason=NewConnectionError).
    for arg in exc.args[:1]:
        reason = getattr(arg, "reason", None)
        if isinstance(reason, BaseException) and _keys(type(reason)) & (
            _NOT_SENT
        ):
            return True
    return False


def leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    """The exceptions in *group* and in its nested groups, depth first."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from leaves(exc)
        else:
            yield exc


def every_leaf(
    group: BaseExceptionGroup[Any], accepts: Callable[[BaseException], bool]
) -> bool:
    """
    Whether *group* has leaves and *accepts* every one of them: the one
    rule by which retry retries an exception group and a breaker counts one
    as a failure (an error inside a task group arrives as a group).
    """
    found = False
    for leaf in leaves(group):
        if not accepts(leaf):
            return False
        found = True
    return found
