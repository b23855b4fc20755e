"""
The classifiers: `Transient` (retry's default ``retry_on``) and
`DependencyFailure` (a breaker's default ``failure_on``), and the
`_Classifier` they share, which judges an exception group by its leaves,
a built-in exception by its type (a verdict cached per type and
classifier), and any other by its kind, SQLSTATE, wrapped error or HTTP
status.
"""

from __future__ import annotations

from typing import final

import attrs

from resilient._core._keywords import settings_checked
from resilient._core._transient._fields import (
    _classes,
    _classes_repr,
    _header_name,
    _methods,
    _methods_repr,
    _statuses,
    _statuses_repr,
    _to_frozenset,
    _to_methods,
    _to_tuple,
)
from resilient._core._transient._kinds import (
    _MAX_CACHED_TYPES,
    _SQL,
    _TRANSPORT_ERROR,
    _WRAPPER,
    _aiohttp_protocol_error,
    _certificate_failure,
    _kind,
    _not_sent,
    _request_of,
    _sqlstate,
    every_leaf,
    http_status,
)
from resilient._core._transient._tables import (
    _NOT_PROCESSED,
    _SQLSTATE_FAILURE,
    _SQLSTATE_RETRY,
    DEFAULT_STATUSES,
    FAILURE_STATUSES,
    IDEMPOTENT_METHODS,
)


# A classifier's verdicts on plain built-in exceptions, per (type, id of
# the classifier); each entry holds its classifier, so that no other one
# takes its id while the entry lives.
_verdicts: dict[tuple[type, int], tuple[object, bool]] = {}


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
@settings_checked
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
@settings_checked
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
