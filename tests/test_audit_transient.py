"""
Gaps the audit of issue 7 found in the transient-error classifier, each
against a real client and a real local server where one can be had: a TLS
certificate that fails verification, the standard library's
``urllib.request``, and aiohttp's certificate-pinning error.
"""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import requests

import resilient
from tests.http_server import Server, closed_port


if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


TRANSIENT = resilient.Transient()
FAILURE = resilient.DependencyFailure()


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def tls_url(tmp_path: Path) -> Iterator[str]:
    """An HTTPS server on loopback with a self-signed certificate (which no
    client trusts)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate with")
    made = subprocess.run(  # noqa: S603 - fixed arguments
        [  # noqa: S607 - openssl from PATH
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip("openssl could not make a certificate")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(
        target=server.serve_forever, args=(0.02,), daemon=True
    )
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _error(fn: Any) -> Exception:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def test_httpx_certificate_failure_is_not_transient(tls_url: str) -> None:
    """httpx reports a certificate that fails verification as a
    `ConnectError` (a NetworkError) caused by `ssl.SSLCertVerificationError`:
    it is never retried nor counted against the dependency, as requests'
    `SSLError` already was (it retried it before the audit)."""
    exc = _error(lambda: httpx.get(tls_url))
    assert isinstance(exc, httpx.ConnectError)
    assert not TRANSIENT(exc)
    assert not FAILURE(exc)
    requests_exc = _error(lambda: requests.get(tls_url, timeout=10))
    assert not TRANSIENT(requests_exc)


def test_policy_gives_up_at_once_on_a_certificate_failure(
    tls_url: str,
) -> None:
    """A default policy makes one attempt against an untrusted certificate,
    not four."""
    calls: list[int] = []
    policy = resilient.Policy(
        name="audit-tls", attempts=4, backoff=resilient.Constant(0)
    )

    @policy
    def get() -> httpx.Response:
        calls.append(1)
        return httpx.get(tls_url)

    with pytest.raises(httpx.ConnectError):
        get()
    assert calls == [1]


def test_httpx_connect_errors_stay_transient() -> None:
    """A refused connection (no TLS in its cause chain) is still retried:
    only a certificate in the chain changes the verdict."""
    exc = _error(lambda: httpx.get(f"http://127.0.0.1:{closed_port()}/"))
    assert isinstance(exc, httpx.ConnectError)
    assert TRANSIENT(exc)
    assert FAILURE(exc)


def test_urllib_request_errors_are_judged_by_their_reason() -> None:
    """``urllib.request`` wraps a refused connection in `URLError`
    (``reason`` the `ConnectionRefusedError`): transient, as the built-in
    is (it was not before the audit); an HTTP 503 from it is judged by its
    status, a 404 is not retried, and a URLError with a text reason is
    not transient."""
    server = Server()
    try:
        refused = _error(
            lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{closed_port()}/", timeout=10
            )
        )
        assert isinstance(refused, urllib.error.URLError)
        assert isinstance(refused.reason, ConnectionRefusedError)
        assert TRANSIENT(refused)
        assert FAILURE(refused)
        for code, retried in ((503, True), (404, False)):
            status = _error(
                lambda c=code: urllib.request.urlopen(  # noqa: S310
                    f"{server.url}/status/{c}", timeout=10
                )
            )
            assert isinstance(status, urllib.error.HTTPError)
            try:
                assert TRANSIENT(status) is retried
            finally:
                status.close()  # it holds the response open
    finally:
        server.stop()
    assert not TRANSIENT(urllib.error.URLError("unknown url type: ftpx"))


def _fake(module: str, name: str, *bases: type) -> type:
    cls = type(name, bases or (Exception,), {})
    cls.__module__ = module
    return cls


def test_aiohttp_fingerprint_mismatch_is_not_transient() -> None:
    """aiohttp's `ServerFingerprintMismatch` (a pinned certificate that does
    not match) subclasses its `ClientConnectionError`, as in aiohttp 3.x;
    like its other certificate errors it is never retried (it was before
    the audit)."""
    base = _fake("aiohttp.client_exceptions", "ClientConnectionError")
    server_error = _fake(
        "aiohttp.client_exceptions", "ServerConnectionError", base
    )
    mismatch = _fake(
        "aiohttp.client_exceptions", "ServerFingerprintMismatch", server_error
    )
    assert TRANSIENT(server_error())
    assert not TRANSIENT(mismatch())
    assert not FAILURE(mismatch())


def _aiohttp_response_error(cause: BaseException | None) -> Exception:
    """aiohttp's ClientResponseError as aiohttp 3.x raises it: status 400
    made up by the client when the server broke the protocol, raised from
    the parser's HttpProcessingError (BadStatusLine and its kin)."""
    response_error = _fake("aiohttp.client_exceptions", "ClientResponseError")
    exc = response_error()
    exc.status = 400  # type: ignore[attr-defined]
    exc.__cause__ = cause
    return exc


def test_aiohttp_protocol_error_is_transient() -> None:
    """A server that breaks HTTP (a bad status line) reaches aiohttp's
    caller as ClientResponseError(status=400) from the parser's error:
    transient and a dependency failure, as httpx's RemoteProtocolError and
    requests' ConnectionError(BadStatusLine) are (before the audit it was
    judged by its made-up 400: neither)."""
    processing = _fake("aiohttp.http_exceptions", "HttpProcessingError")
    bad_message = _fake(
        "aiohttp.http_exceptions", "BadHttpMessage", processing
    )
    bad_status = _fake("aiohttp.http_exceptions", "BadStatusLine", bad_message)
    exc = _aiohttp_response_error(bad_status("GARBAGE"))
    assert resilient.http_status(exc) == 400
    assert TRANSIENT(exc)
    assert FAILURE(exc)
    # A real 400 from raise_for_status (no parser error behind it) is not.
    assert not TRANSIENT(_aiohttp_response_error(None))
    assert not FAILURE(_aiohttp_response_error(ValueError("other")))


def _asyncpg_error(name: str, sqlstate: str, *bases: type) -> Exception:
    """An asyncpg server error as asyncpg 0.30 shapes it: a subclass of
    asyncpg.exceptions.PostgresError with its SQLSTATE on the class."""
    cls = _fake("asyncpg.exceptions", name, *bases)
    cls.sqlstate = sqlstate  # type: ignore[attr-defined]
    return cls()


@pytest.mark.parametrize(
    ("name", "sqlstate", "retried", "counted"),
    [
        ("SerializationError", "40001", True, False),
        ("DeadlockDetectedError", "40P01", True, False),
        ("QueryCanceledError", "57014", True, False),
        ("AdminShutdownError", "57P01", True, True),
        ("CannotConnectNowError", "57P03", True, True),
        ("TooManyConnectionsError", "53300", True, True),
        ("PostgresSyntaxError", "42601", False, False),
        ("InvalidCatalogNameError", "3D000", False, False),
        ("InvalidPasswordError", "28P01", False, False),
    ],
)
def test_asyncpg_server_errors_are_judged_by_sqlstate(
    name: str, sqlstate: str, retried: bool, counted: bool
) -> None:
    """asyncpg's server errors are judged by their SQLSTATE, as psycopg's
    are: a serialization failure or a statement timeout is retried (before
    the audit only its connection classes were known, so with asyncpg
    these were never retried; checked against a real server with asyncpg
    0.32), a syntax error or a wrong password is not."""
    postgres_error = _fake("asyncpg.exceptions", "PostgresError")
    exc = _asyncpg_error(name, sqlstate, postgres_error)
    assert TRANSIENT(exc) is retried
    assert FAILURE(exc) is counted
