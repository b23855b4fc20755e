"""resilient.http: idempotency keys that make requests safe to retry."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
import requests

import resilient
import resilient.http
from resilient.http import (
    current_idempotency_key,
    idempotency_key,
    idempotent,
    needs_key,
)
from resilient.http._keys import _HEADER
from resilient.testing import FakeClock, use_clock
from tests.http_server import Server, closed_port


if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Driver


def _policy(**kw: object) -> resilient.Policy:
    return resilient.Policy(
        name="http",
        attempts=3,
        backoff=resilient.Constant(0),
        retry_on=resilient.Transient(),
        retry_after=None,
        **kw,  # type: ignore[arg-type]
    )


def test_key_blocks_nest_and_reset() -> None:
    """Nested blocks share the outer key; the key is gone after."""
    assert current_idempotency_key() is None
    with idempotency_key() as outer:
        assert len(outer) == 36
        with idempotency_key() as inner:
            assert inner == outer
        with idempotency_key("explicit") as own:
            assert own == "explicit"
            assert current_idempotency_key() == "explicit"
        assert current_idempotency_key() == outer
    assert current_idempotency_key() is None


def test_bad_key_is_refused() -> None:
    """A key must be a non-empty str."""
    with pytest.raises(resilient.ConfigTypeError, match="idempotency_key"):
        idempotency_key("").__enter__()
    with pytest.raises(resilient.ConfigTypeError, match="idempotency_key"):
        idempotency_key(3).__enter__()  # type: ignore[arg-type]


def test_needs_key() -> None:
    """Only non-idempotent requests without a key get the current key."""
    assert needs_key("POST", {}) is None
    with idempotency_key("k"):
        assert needs_key("post", {}) == "k"
        assert needs_key("PATCH", None) == "k"
        assert needs_key("GET", {}) is None
        assert needs_key("POST", {_HEADER: "own"}) is None


def test_idempotent_gives_each_call_its_own_key(driver: Driver) -> None:
    """One key per call of the decorated function, sync and async."""
    keys: list[str | None] = []

    def body() -> None:
        keys.append(current_idempotency_key())

    fn = idempotent(driver.fn(body))
    driver.run(fn)
    driver.run(fn)
    assert keys[0] is not None
    assert keys[1] is not None
    assert keys[0] != keys[1]
    assert inspect.iscoroutinefunction(fn) is driver.is_async


def test_idempotent_keeps_the_signature() -> None:
    """The decorator keeps name and signature."""

    def charge(order: str, *, amount: int) -> str:
        return order

    wrapped = idempotent(charge)
    assert wrapped.__name__ == "charge"
    assert inspect.signature(wrapped) == inspect.signature(charge)


def test_post_with_a_key_is_retried_with_the_same_key(server: Server) -> None:
    """A POST answered 502 twice is retried under @idempotent, and the
    server sees one key on all three attempts."""
    client = httpx.Client(
        transport=resilient.http.IdempotencyKeyTransport(), timeout=2
    )

    @idempotent
    @_policy()
    def charge() -> int:
        response = client.post(server.url + "/script/a/502,502,200")
        response.raise_for_status()
        return response.status_code

    assert charge() == 200
    assert charge() == 200
    keys = [h.get(_HEADER) for _, _, h in server.seen]
    assert len(keys) == 4
    assert keys[0] is not None
    assert keys[0] == keys[1] == keys[2]
    assert keys[3] != keys[0]
    client.close()


def test_post_without_a_key_is_not_repeated(server: Server) -> None:
    """Without a key, a POST that may have been processed (502, a read
    timeout) is not retried; one the server refused (503) is."""
    with httpx.Client(timeout=httpx.Timeout(10.0, read=0.1)) as client:

        @_policy()
        def post(path: str) -> int:
            response = client.post(server.url + path)
            response.raise_for_status()
            return response.status_code

        with pytest.raises(httpx.HTTPStatusError):
            post("/script/b/502,200")
        with pytest.raises(httpx.ReadTimeout):
            post("/slow")
        assert post("/script/c/503,200") == 200
    paths = [p for _, p, _ in server.wait_seen(4)]
    assert paths.count("/script/b/502,200") == 1
    assert paths.count("/slow") == 1
    assert paths.count("/script/c/503,200") == 2


def test_get_is_retried_without_a_key(server: Server) -> None:
    """An idempotent method needs no key."""
    with httpx.Client(timeout=2) as client:

        @_policy()
        def get() -> int:
            response = client.get(server.url + "/script/d/502,200")
            response.raise_for_status()
            return response.status_code

        assert get() == 200
    assert len(server.seen) == 2


def test_refused_post_is_retried_without_a_key() -> None:
    """A POST that never left the client is safe to retry."""
    attempts = []
    url = f"http://127.0.0.1:{closed_port()}/"
    with httpx.Client(timeout=1) as client:

        @_policy()
        def post() -> None:
            attempts.append(1)
            client.post(url)

        with pytest.raises(httpx.ConnectError):
            post()
    assert len(attempts) == 3


def test_requests_adapter(server: Server) -> None:
    """The requests adapter adds the key; the POST is retried with it."""
    session = requests.Session()
    session.mount("http://", resilient.http.IdempotencyKeyAdapter())

    @idempotent
    @_policy()
    def charge() -> int:
        response = session.post(
            server.url + "/script/e/502,200", timeout=2, data=b"x"
        )
        response.raise_for_status()
        return response.status_code

    assert charge() == 200
    keys = {h.get(_HEADER) for _, _, h in server.seen}
    assert len(server.seen) == 2
    assert len(keys) == 1
    assert None not in keys
    with pytest.raises(requests.HTTPError):
        _policy()(
            lambda: session.post(
                server.url + "/status/502", timeout=2
            ).raise_for_status()
        )()
    assert len(server.seen) == 3
    session.close()


async def test_async_transport(server: Server, anyio_backend: str) -> None:
    """The async transport on asyncio and trio: same key on every try."""
    transport = resilient.http.AsyncIdempotencyKeyTransport()
    async with httpx.AsyncClient(transport=transport, timeout=2) as client:

        @idempotent
        @_policy()
        async def charge() -> int:
            response = await client.post(server.url + "/script/f/503,200")
            response.raise_for_status()
            return response.status_code

        assert await charge() == 200
    await anyio.lowlevel.checkpoint()
    keys = [h.get(_HEADER) for _, _, h in server.seen]
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys[0] == keys[1]


def test_transports_close_their_inner_transport() -> None:
    """Closing the client closes the wrapped transport."""
    closed = []

    class Inner(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            raise AssertionError  # pragma: no cover

        def close(self) -> None:
            closed.append(1)

    httpx.Client(
        transport=resilient.http.IdempotencyKeyTransport(Inner())
    ).close()
    assert closed == [1]


async def test_async_transport_closes_inner(anyio_backend: str) -> None:
    """The async transport closes its inner one too."""
    closed = []

    class Inner(httpx.AsyncBaseTransport):
        async def aclose(self) -> None:
            closed.append(1)

    client = httpx.AsyncClient(
        transport=resilient.http.AsyncIdempotencyKeyTransport(Inner())
    )
    await client.aclose()
    assert closed == [1]


def test_lazy_names_and_unknown_attribute() -> None:
    """The transports load on first use; unknown names raise."""
    assert (
        resilient.http.IdempotencyKeyTransport.__module__ == "resilient.http"
    )
    with pytest.raises(AttributeError, match="nope"):
        resilient.http.nope  # noqa: B018


def test_idempotent_methods_none_retries_everything() -> None:
    """idempotent_methods=None: every method alike."""
    request = httpx.Request("POST", "http://x/")
    exc = httpx.ReadTimeout("slow", request=request)
    assert not resilient.Transient()(exc)
    assert resilient.Transient(idempotent_methods=None)(exc)
    assert resilient.Transient(idempotent_methods={"post"})(exc)
    with pytest.raises(resilient.ConfigTypeError, match="idempotent_methods"):
        resilient.Transient(idempotent_methods={"P O S T"})
    with pytest.raises(resilient.ConfigTypeError, match="idempotency_header"):
        resilient.Transient(idempotency_header="")
    keyed = httpx.Request("POST", "http://x/", headers={"X-Key": "1"})
    exc = httpx.ReadTimeout("slow", request=keyed)
    assert resilient.Transient(idempotency_header="X-Key")(exc)


# The default retry_on (issue 7, item 1): a policy with no retry_on retries
# httpx's and requests' resets, read timeouts and 503s (honouring their
# Retry-After) and does not retry a 404, sync, on asyncio and on trio.

_CLIENTS = ["httpx", "requests"]


def _get(driver: Driver, client: str, url: str) -> Callable[[], Any]:
    """A function of *driver*'s colour that GETs *url* with *client*,
    raising for an error status (a short read timeout, a generous connect
    one)."""
    if client == "httpx":
        timeout = httpx.Timeout(10.0, read=0.1)
        if not driver.is_async:

            def sync_get() -> int:
                with httpx.Client(timeout=timeout) as c:
                    return c.get(url).raise_for_status().status_code

            return sync_get

        async def async_get() -> int:
            async with httpx.AsyncClient(timeout=timeout) as c:
                response = await c.get(url)
                return response.raise_for_status().status_code

        return async_get

    def requests_get() -> int:
        response = requests.get(url, timeout=(10.0, 0.1))
        response.raise_for_status()
        return response.status_code

    if not driver.is_async:
        return requests_get

    async def in_thread() -> int:
        return await anyio.to_thread.run_sync(requests_get)

    return in_thread


def _default_policy() -> resilient.Policy:
    """Everything default but the backoff (zero, so a Retry-After is the
    only wait) and the attempts."""
    return resilient.Policy(
        name="http-default", attempts=3, backoff=resilient.Constant(0)
    )


@pytest.mark.parametrize("client", _CLIENTS)
@pytest.mark.parametrize("path", ["/reset", "/slow"])
def test_default_retries_resets_and_read_timeouts(
    server: Server, driver: Driver, client: str, path: str
) -> None:
    """A connection reset and a read timeout are retried by default, up to
    the policy's attempts, and the client's own error is what gives up."""
    get = _get(driver, client, server.url + path)
    with pytest.raises(Exception) as info:
        driver.run(resilient.retry(_default_policy())(get))
    assert type(info.value).__module__.partition(".")[0] == client
    assert "after 3 attempts" in info.value.__notes__[-1]
    assert [p for _, p, _ in server.wait_seen(3)] == [path] * 3


@pytest.mark.parametrize("client", _CLIENTS)
def test_default_retries_503_after_its_hint(
    server: Server, driver: Driver, client: str
) -> None:
    """A 503 with ``Retry-After: 7`` is retried by default after 7
    (virtual) seconds, and the retry's answer is returned."""
    get = _get(driver, client, server.url + "/script/s/503,200")
    clock = FakeClock()
    with use_clock(clock):
        assert driver.run(resilient.retry(_default_policy())(get)) == 200
    assert clock.sleeps == [7.0]
    assert len(server.seen) == 2


@pytest.mark.parametrize("client", _CLIENTS)
def test_default_does_not_retry_404(
    server: Server, driver: Driver, client: str
) -> None:
    """A 404 is the dependency answering: raised at once, not retried."""
    get = _get(driver, client, server.url + "/status/404")
    with pytest.raises(Exception) as info:
        driver.run(resilient.retry(_default_policy())(get))
    assert resilient.http_status(info.value) == 404
    assert len(server.seen) == 1
