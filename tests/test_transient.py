"""The transient-error classifier: retry's default and the breaker's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
import requests

import resilient
from resilient._core._transient import DependencyFailure, Transient, _kinds
from tests.http_server import Server, closed_port


if TYPE_CHECKING:
    from collections.abc import Iterator


def _fake(module: str, name: str, *bases: type) -> type:
    """An exception class that claims to come from *module* (a client
    library that need not be installed)."""
    cls = type(name, bases or (Exception,), {})
    cls.__module__ = module
    return cls


TRANSIENT = Transient()

# Generous to connect (the machine may be loaded), short to read: the
# server's /slow answer takes 0.3 s.
_TIMEOUT = httpx.Timeout(10.0, read=0.1)
FAILURE = DependencyFailure()


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(),
        ConnectionRefusedError(),
        BrokenPipeError(),
        TimeoutError(),
        resilient.DeadlineExceeded(1.0),
        _fake("aiohttp.client_exceptions", "ClientConnectionError")(),
        _fake("aiohttp.client_exceptions", "ClientPayloadError")(),
        _fake("urllib3.exceptions", "ProtocolError")(),
        _fake("redis.exceptions", "ConnectionError")(),
        _fake("redis.exceptions", "TimeoutError")(),
        _fake("redis.exceptions", "BusyLoadingError")(),
        _fake("redis.exceptions", "ReadOnlyError")(),
        _fake("psycopg", "OperationalError")(),
    ],
)
def test_transient_errors(exc: Exception) -> None:
    """Transport errors of the common clients are transient and count
    against the dependency."""
    assert TRANSIENT(exc)
    assert FAILURE(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError(),
        KeyError(),
        FileNotFoundError(),
        _fake("requests.exceptions", "SSLError", requests.ConnectionError)(),
        _fake("redis.exceptions", "AuthenticationError")(),
        _fake("aiohttp.client_exceptions", "ClientSSLError")(),
        _fake("someclient", "ConnectionError")(),
    ],
)
def test_not_transient(exc: Exception) -> None:
    """Bugs, certificate and authentication errors are not transient."""
    assert not TRANSIENT(exc)
    assert not FAILURE(exc)


def test_subclasses_of_auth_errors_stay_not_transient() -> None:
    """redis' AuthenticationError subclasses its ConnectionError: never
    retried all the same."""
    conn = _fake("redis.exceptions", "ConnectionError")
    auth = _fake("redis.exceptions", "AuthenticationError", conn)
    assert TRANSIENT(conn())
    assert not TRANSIENT(auth())


def _sql_error(code: str | None, *, attr: str = "sqlstate") -> Exception:
    cls = _fake("psycopg.errors", "OperationalError")
    exc = cls()
    setattr(exc, attr, code)
    return exc


@pytest.mark.parametrize(
    ("code", "retried", "counted"),
    [
        (None, True, True),
        ("08006", True, True),
        ("40001", True, False),
        ("40P01", True, False),
        ("57P01", True, True),
        ("57014", True, False),
        ("53300", True, True),
        ("55P03", False, False),
    ],
)
def test_sqlstates(code: str | None, retried: bool, counted: bool) -> None:
    """PostgreSQL errors are judged by their SQLSTATE: connection errors
    and shutdowns both; serialization failures are retried but the
    dependency is healthy."""
    assert TRANSIENT(_sql_error(code)) is retried
    assert FAILURE(_sql_error(code)) is counted
    assert TRANSIENT(_sql_error(code, attr="pgcode")) is retried


def test_urllib3_max_retry_error_is_judged_by_its_reason() -> None:
    """urllib3's MaxRetryError wraps the error that ended it."""
    wrapper = _fake("urllib3.exceptions", "MaxRetryError")
    exc = wrapper()
    exc.reason = ConnectionResetError()
    assert TRANSIENT(exc)
    exc.reason = ValueError()
    assert not TRANSIENT(exc)
    exc.reason = "text"
    assert not TRANSIENT(exc)


class _StatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.response = type("R", (), {"status_code": status})()


@pytest.mark.parametrize(
    ("status", "retried", "counted"),
    [
        (429, True, True),
        (500, False, True),
        (502, True, True),
        (503, True, True),
        (504, True, True),
        (404, False, False),
        (400, False, False),
    ],
)
def test_http_statuses(status: int, retried: bool, counted: bool) -> None:
    """Status errors: 429/502/503/504 retried, 5xx and 429 counted, 4xx
    neither."""
    assert TRANSIENT(_StatusError(status)) is retried
    assert FAILURE(_StatusError(status)) is counted


def test_http_status_reads_the_common_shapes() -> None:
    """status_code, response.status_code and status (aiohttp)."""

    class Direct:
        status_code = 418

    class Aio:
        status = 503

    class Neither:
        status = True

    assert resilient.http_status(Direct()) == 418
    assert resilient.http_status(_StatusError(502)) == 502
    assert resilient.http_status(Aio()) == 503
    assert resilient.http_status(Neither()) is None
    assert resilient.http_status(object()) is None


def test_statuses_configurable_and_validated() -> None:
    """500 is a documented choice; bad codes are refused by field."""
    assert Transient(statuses={500, 503})(_StatusError(500))
    assert Transient(statuses=[503]).statuses == frozenset({503})
    with pytest.raises(resilient.ConfigError, match=r"Transient.statuses"):
        Transient(statuses={700})
    with pytest.raises(resilient.ConfigTypeError, match=r"statuses"):
        Transient(statuses={"503"})  # type: ignore[arg-type]
    with pytest.raises(resilient.ConfigTypeError, match=r"statuses"):
        Transient(statuses=503)  # type: ignore[arg-type]


def test_also_and_never() -> None:
    """Own classes can be added; never wins over everything."""

    class Flaky(Exception):
        pass

    custom = Transient(also=Flaky, never=[ConnectionResetError])
    assert custom(Flaky())
    assert not custom(ConnectionResetError())
    assert custom(ConnectionRefusedError())
    with pytest.raises(resilient.ConfigTypeError, match=r"Transient.also"):
        Transient(also=(int,))  # type: ignore[arg-type]


def test_exception_groups_need_every_leaf() -> None:
    """A group is transient when every leaf is (nested groups too)."""
    ok = ExceptionGroup("x", [ConnectionResetError(), TimeoutError()])
    nested = ExceptionGroup("y", [ok, ExceptionGroup("z", [TimeoutError()])])
    mixed = ExceptionGroup("m", [ConnectionResetError(), ValueError()])
    assert TRANSIENT(ok)
    assert TRANSIENT(nested)
    assert not TRANSIENT(mixed)
    assert FAILURE(nested)


def test_base_exceptions_never() -> None:
    """Cancellation and interrupts are never transient."""
    assert not TRANSIENT(KeyboardInterrupt())
    assert not FAILURE(SystemExit())
    assert not TRANSIENT(BaseExceptionGroup("g", [KeyboardInterrupt()]))


def test_type_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-type cache stops growing at its limit."""
    monkeypatch.setattr(_kinds, "_type_cache", {})
    monkeypatch.setattr(_kinds, "_MAX_CACHED_TYPES", 2)
    for i in range(5):
        TRANSIENT(type(f"E{i}", (Exception,), {})())
    assert len(_kinds._type_cache) == 2


def test_classifiers_are_frozen_equal_values() -> None:
    """Two default classifiers are equal (policies compare equal)."""
    assert Transient() == Transient()
    assert hash(Transient()) == hash(Transient())
    assert Transient() != DependencyFailure()


# A real local HTTP server: what httpx and requests raise against it.


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    """A stdlib HTTP server on a free loopback port, in a thread."""
    server = Server()
    yield server.url
    server.stop()


def _httpx_error(base: str, path: str) -> BaseException:
    with httpx.Client(timeout=_TIMEOUT) as client:
        try:
            client.get(base + path).raise_for_status()
        except httpx.HTTPError as exc:
            return exc
    raise AssertionError(path)


def _requests_error(base: str, path: str) -> BaseException:
    try:
        requests.get(base + path, timeout=(10.0, 0.1)).raise_for_status()
    except requests.RequestException as exc:
        return exc
    raise AssertionError(path)


@pytest.mark.parametrize("get", [_httpx_error, _requests_error])
@pytest.mark.parametrize(
    ("path", "retried", "counted"),
    [
        ("/status/503", True, True),
        ("/status/404", False, False),
        ("/reset", True, True),
        ("/slow", True, True),
        ("refused", True, True),
    ],
)
def test_real_clients_against_a_local_server(
    http_base: str,
    get: Any,
    path: str,
    retried: bool,
    counted: bool,
) -> None:
    """httpx's and requests' own exceptions from a real server: resets,
    read timeouts, refused connections and 503s are transient; a 404 is
    not; the 503's Retry-After is read."""
    if path == "refused":
        exc = get(f"http://127.0.0.1:{closed_port()}", "/")
    else:
        exc = get(http_base, path)
    assert TRANSIENT(exc) is retried, repr(exc)
    assert FAILURE(exc) is counted, repr(exc)
    if path == "/status/503":
        assert resilient.default_retry_after(exc) == 7.0


async def test_httpx_async_against_a_local_server(
    http_base: str, anyio_backend: str
) -> None:
    """httpx's AsyncClient on asyncio and trio raises the same classes."""
    async with httpx.AsyncClient(timeout=_TIMEOUT) as client:
        for path, expected in [("/reset", True), ("/slow", True)]:
            with pytest.raises(httpx.TransportError) as info:
                await client.get(http_base + path)
            assert TRANSIENT(info.value) is expected
        response = await client.get(http_base + "/status/404")
        with pytest.raises(httpx.HTTPStatusError) as status:
            response.raise_for_status()
        assert not TRANSIENT(status.value)
    await anyio.lowlevel.checkpoint()
