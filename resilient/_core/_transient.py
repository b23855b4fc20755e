"""
What is transient: one classifier says whether an error is worth another
try (retry) and whether it means the dependency is failing (breaker).

It knows the errors of the clients people call (httpx, requests and
urllib3, aiohttp, redis-py, psycopg and psycopg2, asyncpg) by the names of
their classes, without importing any of them: a class matches when its
top-level package and name appear anywhere in the exception's MRO, so
subclasses (`httpx.ReadTimeout` of `httpx.TimeoutException`) match too.
HTTP status errors are judged by their response's status code, database
errors by their SQLSTATE, and an exception group by its leaves.
"""

from __future__ import annotations

import http.client
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from resilient._core._validate import field_name
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


# (top-level package, class name) pairs. "builtins" stands for the
# standard library's own classes, matched by identity below instead.
_TRANSPORT: Final = frozenset(
    {
        # httpx: transport errors (connect, read, write, pool timeouts;
        # network errors; the server breaking the protocol).
        ("httpx", "TimeoutException"),
        ("httpx", "NetworkError"),
        ("httpx", "RemoteProtocolError"),
        ("httpcore", "TimeoutException"),
        ("httpcore", "NetworkError"),
        ("httpcore", "RemoteProtocolError"),
        # requests and urllib3.
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
        ("requests", "ChunkedEncodingError"),
        ("urllib3", "ProtocolError"),
        ("urllib3", "NewConnectionError"),
        ("urllib3", "TimeoutError"),
        ("urllib3", "IncompleteRead"),
        # aiohttp.
        ("aiohttp", "ClientConnectionError"),
        ("aiohttp", "ClientPayloadError"),
        ("aiohttp", "ServerTimeoutError"),
        # redis-py (sync and asyncio share the classes).
        ("redis", "ConnectionError"),
        ("redis", "TimeoutError"),
        ("redis", "BusyLoadingError"),
        ("redis", "TryAgainError"),
        ("redis", "ClusterDownError"),
        ("redis", "MasterDownError"),
        ("redis", "ReadOnlyError"),
        # PostgreSQL drivers: connection-level errors (SQLSTATE checked
        # below when the server sent one).
        ("psycopg", "OperationalError"),
        ("psycopg2", "OperationalError"),
        ("asyncpg", "PostgresConnectionError"),
        ("asyncpg", "ConnectionDoesNotExistError"),
        # asyncpg's other server errors: judged by their SQLSTATE alone.
        ("asyncpg", "PostgresError"),
    }
)

# Subclasses of the above that are not transient: a certificate or an
# authentication failure does not heal by itself.
_NEVER: Final = frozenset(
    {
        ("requests", "SSLError"),
        ("requests", "InvalidURL"),
        ("urllib3", "SSLError"),
        ("urllib3", "LocationParseError"),
        ("aiohttp", "ClientSSLError"),
        ("aiohttp", "ClientConnectorCertificateError"),
        ("aiohttp", "InvalidURL"),
        ("aiohttp", "ServerFingerprintMismatch"),
        ("redis", "AuthenticationError"),
        ("redis", "AuthorizationError"),
        ("redis", "AuthenticationWrongNumberOfArgsError"),
        ("asyncpg", "InvalidAuthorizationSpecificationError"),
    }
)

_BUILTIN: Final = (ConnectionError, TimeoutError, http.client.IncompleteRead)

# Errors that wrap the one that ended them in ``reason``: urllib3's
# MaxRetryError, and urllib.request's URLError (a refused connection is
# URLError(reason=ConnectionRefusedError); its HTTPError subclass has a text
# reason and is judged by its status).
_WRAPPERS: Final = frozenset(
    {("urllib3", "MaxRetryError"), ("urllib", "URLError")}
)

# What a client's error was caused by when a TLS certificate failed
# verification: httpx raises ConnectError from httpcore's ConnectError from
# this one.
_CERTIFICATE: Final = ("ssl", "SSLCertVerificationError")

# Errors raised before a request left the client: retrying them cannot
# repeat a side effect, whatever the method.
_NOT_SENT: Final = frozenset(
    {
        ("httpx", "ConnectError"),
        ("httpx", "ConnectTimeout"),
        ("httpx", "PoolTimeout"),
        ("requests", "ConnectTimeout"),
        ("urllib3", "NewConnectionError"),
        ("urllib3", "ConnectTimeoutError"),
        ("aiohttp", "ClientConnectorError"),
        ("builtins", "ConnectionRefusedError"),
    }
)

IDEMPOTENT_METHODS: Final = frozenset(
    {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"}
)
"""HTTP methods that RFC 9110 defines as idempotent: retried freely."""

# Statuses that say the server did not act on the request.
_NOT_PROCESSED: Final = frozenset({429, 503})

DEFAULT_STATUSES: Final = frozenset({429, 502, 503, 504})
"""HTTP statuses retried by default: too many requests, bad gateway,
service unavailable, gateway timeout. 500 is left out on purpose: it is as
often a bug that fails the same way again as an overloaded server."""

FAILURE_STATUSES: Final = frozenset({429, *range(500, 600)})
"""HTTP statuses a breaker counts as the dependency failing: 429 and 5xx."""

# SQLSTATE codes worth another try: connection exceptions (class 08),
# serialization failures and deadlocks (retry the transaction), operator
# intervention (shutdowns, "cannot connect now", statement timeouts), too
# many connections.
_SQLSTATE_RETRY: Final = frozenset(
    {"40001", "40P01", "57P01", "57P02", "57P03", "57014", "53300"}
)
_SQLSTATE_FAILURE: Final = frozenset({"57P01", "57P02", "57P03", "53300"})

_MAX_CACHED_TYPES: Final = 4096
_type_cache: dict[type, int] = {}

# A classifier's verdicts on plain built-in exceptions, per (type, id of
# the classifier); each entry holds its classifier, so that no other one
# takes its id while the entry lives.
_verdicts: dict[tuple[type, int], tuple[object, bool]] = {}

_NO: Final = 0
_TRANSPORT_ERROR: Final = 1
_SQL: Final = 2
_WRAPPER: Final = 3
_RESPONSE: Final = 4
"""aiohttp's ClientResponseError: a status error, or the server breaking
HTTP (status 400 made up by the client, raised from the parser's
HttpProcessingError)."""

_AIOHTTP_RESPONSE: Final = ("aiohttp", "ClientResponseError")
_AIOHTTP_PROTOCOL: Final = ("aiohttp", "HttpProcessingError")


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


def _statuses(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    name = field_name(inst, attribute)
    if not isinstance(value, frozenset):
        raise ConfigTypeError(name, value, "must be a set of status codes")
    for code in value:
        if isinstance(code, bool) or not isinstance(code, int):
            raise ConfigTypeError(name, value, "must hold int status codes")
        if not 100 <= code <= 599:
            raise ConfigError(name, value, "must hold codes from 100 to 599")


def _classes(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    name = field_name(inst, attribute)
    if not isinstance(value, tuple) or not all(
        isinstance(c, type) and issubclass(c, Exception) for c in value
    ):
        raise ConfigTypeError(name, value, "must be Exception classes")


def _to_methods(value: object) -> object:
    if isinstance(value, set | list | tuple | frozenset):
        return frozenset(m.upper() if isinstance(m, str) else m for m in value)
    return value


def _methods(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is None:
        return
    if not isinstance(value, frozenset) or not all(
        isinstance(m, str) and m.isalpha() for m in value
    ):
        raise ConfigTypeError(
            field_name(inst, attribute),
            value,
            "must be a set of HTTP method names or None",
        )


def _header_name(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigTypeError(
            field_name(inst, attribute), value, "must be a header name"
        )


def _to_frozenset(value: object) -> object:
    if isinstance(value, set | list | tuple | range):
        return frozenset(value)
    return value


def _to_tuple(value: object) -> object:
    if isinstance(value, type):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    return value


def _statuses_repr(codes: frozenset[int]) -> str:
    """
    A set of status codes as a set display, sorted, with runs of five or
    more as ``*range(...)``: ``{429, *range(500, 600)}`` reads at a glance
    (the set itself holds 101 codes) and evaluates back to it.
    """
    if not codes:
        return "frozenset()"
    parts: list[str] = []
    ordered = sorted(codes)
    first = last = ordered[0]
    for code in [*ordered[1:], None]:
        if code is not None and code == last + 1:
            last = code
            continue
        if last - first >= 4:  # A run of five or more.
            parts.append(f"*range({first}, {last + 1})")
        else:
            parts.extend(str(c) for c in range(first, last + 1))
        if code is not None:
            first = last = code
    return "{" + ", ".join(parts) + "}"


def _classes_repr(classes: tuple[type[Exception], ...]) -> str:
    """Exception classes by name (qualified but for built-ins), as a tuple
    display that evaluates back where the names are in scope."""
    names = [
        c.__qualname__
        if c.__module__ == "builtins"
        else f"{c.__module__}.{c.__qualname__}"
        for c in classes
    ]
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def _methods_repr(methods: frozenset[str] | None) -> str:
    """HTTP methods as a sorted set display (None as is)."""
    if methods is None:
        return "None"
    if not methods:
        return "frozenset()"
    return "{" + ", ".join(repr(m) for m in sorted(methods)) + "}"


@attrs.frozen(kw_only=True)
class _Classifier:
    """What `Transient` and `DependencyFailure` share."""

    statuses: frozenset[int] = attrs.field(
        converter=_to_frozenset, validator=_statuses, repr=_statuses_repr
    )
    also: tuple[type[Exception], ...] = attrs.field(
        default=(), converter=_to_tuple, validator=_classes, repr=_classes_repr
    )
    never: tuple[type[Exception], ...] = attrs.field(
        default=(), converter=_to_tuple, validator=_classes, repr=_classes_repr
    )

    def _sql_codes(self) -> frozenset[str]:
        raise NotImplementedError

    def __call__(self, exc: BaseException) -> bool:
        """Whether *exc* is one of the errors this classifier names."""
        if isinstance(exc, BaseExceptionGroup):
            return every_leaf(exc, self)
        if not isinstance(exc, Exception):
            return False  # Cancellation, KeyboardInterrupt, SystemExit.
        cls = type(exc)
        if (
            cls.__module__ == "builtins"
            and not exc.__dict__
            and not self.never
            and not self.also
        ):
            # A built-in exception with no attributes of its own carries
            # no status, request or SQLSTATE to read: its verdict is its
            # type's, asked once per type (`never` and `also` classes could
            # check instances in their own way: not cached then).
            key = (cls, id(self))
            seen = _verdicts.get(key)
            if seen is not None:
                return seen[1]
            verdict = self._leaf(exc)
            if len(_verdicts) < _MAX_CACHED_TYPES:
                _verdicts[key] = (self, verdict)
            return verdict
        return self._leaf(exc)

    def _leaf(self, exc: Exception) -> bool:
        if self.never and isinstance(exc, self.never):
            return False
        if self.also and isinstance(exc, self.also):
            return True
        cls = type(exc)
        kind = _kind(cls)
        if kind == _TRANSPORT_ERROR:
            # A client's own class raised for an untrusted certificate is
            # not transient. (Built-in classes are not asked: their verdict
            # is cached per type.)
            return cls.__module__ == "builtins" or not _certificate_failure(
                exc
            )
        if kind == _SQL:
            code = _sqlstate(exc)
            return (
                code is None or code[:2] == "08" or code in self._sql_codes()
            )
        if kind >= _WRAPPER:
            inner = self._wrapped(exc, kind)
            if inner is not None:
                return inner
        status = http_status(exc)
        return status is not None and status in self.statuses

    def _wrapped(self, exc: Exception, kind: int) -> bool | None:
        """The verdict on the error *exc* stands for, if it stands for
        one: the reason of a wrapper, the protocol error behind aiohttp's
        made-up 400 (transient, as httpx's and requests' are)."""
        if kind == _WRAPPER:
            reason = getattr(exc, "reason", None)
            return self(reason) if isinstance(reason, Exception) else None
        return True if _aiohttp_protocol_error(exc) else None


@final
@attrs.frozen(kw_only=True)
class Transient(_Classifier):
    """
    The default ``retry_on`` of a `Policy`: is this error worth another
    try?

    Transient are: the built-in `ConnectionError` and `TimeoutError` (and
    so resilient's own `DeadlineExceeded`); the transport errors of httpx,
    requests and urllib3, and aiohttp (connect and read timeouts, resets,
    refused connections, broken protocol); redis-py's connection and
    timeout errors and its "try again" replies (loading, read-only
    replica, cluster down); PostgreSQL connection errors and the SQLSTATEs
    of class 08, serialization failures and deadlocks, shutdowns and
    statement timeouts; HTTP status errors whose status is in *statuses*.
    ``urllib.request``'s `URLError` is judged by the error it wraps.
    Never transient: certificate, URL and authentication errors (httpx's
    `ConnectError` too when a certificate that failed verification caused
    it), and anything that is not an `Exception`. An exception group is
    transient when every leaf is.

    A request that is not idempotent is never repeated by accident: when
    the error carries its HTTP request (httpx's and requests' errors do,
    and aiohttp's status errors; aiohttp's connection errors and timeouts
    do not, so send a key on those requests yourself) and
    the method is not in *idempotent_methods* (POST, PATCH) and the request
    has no *idempotency_header*, the error is transient only if the request
    never left the client (a refused connection, a connect or pool
    timeout) or the server said it did not act on it (429, 503). Give the
    request an idempotency key (`resilient.http.idempotent`) to retry it
    like any other.

    Args:
        statuses: HTTP statuses to retry (default 429, 502, 503, 504; add
            500 if your dependency's 500s are transient).
        also: More exception classes to retry.
        never: Exception classes never to retry (checked first).
        idempotent_methods: HTTP methods retried freely; None retries
            every method alike.
        idempotency_header: The header that makes any request safe to
            repeat.

    Example:
        >>> import resilient
        >>> retry_on = resilient.Transient(statuses={429, 500, 502, 503, 504})
        >>> retry_on(ConnectionResetError())
        True
        >>> retry_on(ValueError())
        False

    .. versionadded:: 26.12.0
    """

    statuses: frozenset[int] = attrs.field(
        default=DEFAULT_STATUSES,
        converter=_to_frozenset,
        validator=_statuses,
        repr=_statuses_repr,
    )
    idempotent_methods: frozenset[str] | None = attrs.field(
        default=IDEMPOTENT_METHODS,
        converter=_to_methods,
        validator=_methods,
        repr=_methods_repr,
    )
    idempotency_header: str = attrs.field(
        default="Idempotency-Key", validator=_header_name
    )

    def _sql_codes(self) -> frozenset[str]:
        return _SQLSTATE_RETRY

    def _leaf(self, exc: Exception) -> bool:
        return super()._leaf(exc) and self.may_repeat(exc)

    def may_repeat(self, outcome: object) -> bool:
        """
        Whether repeating the HTTP request *outcome* came from (an error or
        a response that carries its request) cannot repeat a side effect:
        its method is idempotent, it carries the idempotency header, it
        never left the client, or the server said it did not act on it
        (429, 503). True when *outcome* carries no request.

        Example:
            >>> import httpx, resilient
            >>> post = httpx.Request("POST", "https://api.example/charges")
            >>> response = httpx.Response(502, request=post)
            >>> resilient.Transient().may_repeat(response)
            False

        .. versionadded:: 26.12.0
        """
        methods = self.idempotent_methods
        if methods is None:
            return True
        request = _request_of(outcome)
        if request is None or request[0] in methods:
            return True
        headers = request[1]
        get = getattr(headers, "get", None)
        if callable(get) and get(self.idempotency_header):
            return True
        return (
            isinstance(outcome, BaseException) and _not_sent(outcome)
        ) or http_status(outcome) in _NOT_PROCESSED


@final
@attrs.frozen(kw_only=True)
class DependencyFailure(_Classifier):
    """
    The default ``failure_on`` of a breaker: does this error mean the
    dependency is failing?

    The same transport errors and timeouts as `Transient`, PostgreSQL
    connection errors and shutdowns, and HTTP status errors whose status is
    in *statuses* (429 and every 5xx by default). A 404 or a 400 is the
    dependency answering, not failing.

    Args:
        statuses: HTTP statuses that count as failures.
        also: More exception classes that count.
        never: Exception classes that never count (checked first).

    .. versionadded:: 26.12.0
    """

    statuses: frozenset[int] = attrs.field(
        default=FAILURE_STATUSES,
        converter=_to_frozenset,
        validator=_statuses,
        repr=_statuses_repr,
    )

    def _sql_codes(self) -> frozenset[str]:
        return _SQLSTATE_FAILURE
