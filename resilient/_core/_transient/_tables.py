"""
The tables of what is transient: which client libraries' classes are
transport errors and which of their subclasses never are, which SQLSTATEs
and HTTP statuses retry and the breaker count, and which HTTP methods are
idempotent.

Classes are named as (top-level package, class name) pairs, so that
nothing here imports a client library; `_kinds` matches them against an
exception's MRO.
"""

from __future__ import annotations

import http.client
from typing import Final


# (top-level package, class name) pairs. "builtins" stands for the
# standard library's own classes, matched by identity (`_BUILTIN`) instead.
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
        # by the classifiers when the server sent one).
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

# aiohttp's status error, and the parser error it is raised from when the
# server breaks HTTP.
_AIOHTTP_RESPONSE: Final = ("aiohttp", "ClientResponseError")
_AIOHTTP_PROTOCOL: Final = ("aiohttp", "HttpProcessingError")
