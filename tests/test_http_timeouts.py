"""
An attempt cut short by the policy's own ``timeout`` while an HTTP request
was in flight (issue 15, section 6, item 1): retried only if the request may
be repeated, as the client's own timeout error is judged (`Transient`'s
rule), on sync, asyncio and trio, decorator and block form, against the real
local server of tests/http_server.py, which counts what it processed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

import resilient
from resilient.http._keys import _HEADER


if TYPE_CHECKING:
    from tests.conftest import Driver
    from tests.http_server import Server


_TIMEOUT = 0.1
"""The policy's attempt timeout: /slow answers after 0.3 s."""
_TIMEOUTS = (TimeoutError, httpx.TimeoutException)
"""Sync: httpx's own timeout; async: the attempt's `DeadlineExceeded`."""


def _policy() -> resilient.Policy:
    return resilient.Policy(
        name="http-timeout",
        attempts=3,
        timeout=_TIMEOUT,
        backoff=resilient.Constant(0),
    )


def _send(client: Any, method: str, url: str, keyed: bool) -> Any:
    """*method* on *url* with what is left of the attempt's deadline as the
    client's timeout (docs/http.md's advice)."""
    headers = {_HEADER: "order-42"} if keyed else {}
    return client.request(
        method,
        url,
        headers=headers,
        timeout=resilient.remaining_or_none(),
    )


def _run(
    driver: Driver, form: str, method: str, url: str, keyed: bool
) -> None:
    policy = _policy()
    if not driver.is_async:
        with httpx.Client() as client:
            if form == "decorator":
                policy(_send)(client, method, url, keyed)
            else:
                for attempt in resilient.retrying(policy):
                    with attempt:
                        _send(client, method, url, keyed)
        return

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            if form == "decorator":
                await policy(_asend)(client, method, url, keyed)
            else:
                async for attempt in resilient.retrying(policy):
                    async with attempt:
                        await _asend(client, method, url, keyed)

    anyio.run(main, backend=driver.kind)


async def _asend(client: Any, method: str, url: str, keyed: bool) -> Any:
    return await _send(client, method, url, keyed)


def _processed(server: Server, expected: int) -> int:
    """How many requests the server saw, waiting long enough for one more
    than *expected* to show (a handler reads its request after the client
    sent it)."""
    return len(server.wait_seen(expected + 1, timeout=0.5))


@pytest.mark.parametrize("form", ["decorator", "block"])
def test_post_cut_by_the_attempt_timeout_is_sent_once(
    driver: Driver, form: str, server: Server
) -> None:
    """A POST without an Idempotency-Key whose attempt the policy's own
    timeout cut after it was sent is not sent again: the server processes
    it once (on 4f15275, async: three times)."""
    with pytest.raises(_TIMEOUTS) as caught:
        _run(driver, form, "POST", server.url + "/slow", keyed=False)
    assert _processed(server, 1) == 1
    if driver.is_async:
        error = caught.value
        assert isinstance(error, resilient.DeadlineExceeded)
        assert error.limit == "timeout"
        assert error.request.method == "POST"  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", ["decorator", "block"])
@pytest.mark.parametrize(
    ("method", "keyed"), [("GET", False), ("POST", True)], ids=["get", "keyed"]
)
def test_repeatable_request_cut_by_the_attempt_timeout_is_retried(
    driver: Driver, form: str, method: str, keyed: bool, server: Server
) -> None:
    """A GET, or a POST that carries an Idempotency-Key, cut by the
    policy's own timeout is retried: every attempt reaches the server."""
    with pytest.raises(_TIMEOUTS):
        _run(driver, form, method, server.url + "/slow", keyed=keyed)
    assert _processed(server, 3) == 3


def test_in_flight_request_is_found_only_in_http_client_frames() -> None:
    """An error raised outside an HTTP client's code names no request,
    even where a local variable is a request (the caller's, done)."""
    from resilient._core._transient import in_flight_request

    request = httpx.Request("POST", "http://127.0.0.1/")
    with pytest.raises(KeyError) as caught:
        raise KeyError(request.method)
    assert in_flight_request(caught.value) is None


@pytest.mark.parametrize(
    ("method", "keyed", "sent"),
    [("POST", False, 1), ("GET", False, 3), ("POST", True, 3)],
    ids=["post", "get", "keyed"],
)
def test_a_stream_cut_before_its_first_item_is_judged_by_its_request(
    anyio_backend: str, method: str, keyed: bool, sent: int, server: Server
) -> None:
    """A streamed response whose first item the policy's own timeout cut:
    restarted for a GET or a keyed POST, not for a POST without a key."""
    policy = _policy()
    url = server.url + "/slow"
    headers = {_HEADER: "order-42"} if keyed else {}

    async def main() -> None:
        async with httpx.AsyncClient() as client:

            @policy
            async def lines() -> Any:
                async with client.stream(method, url, headers=headers) as r:
                    async for line in r.aiter_lines():
                        yield line

            async for _ in lines():
                pass

    with pytest.raises(resilient.DeadlineExceeded):
        anyio.run(main, backend=anyio_backend)
    assert _processed(server, sent) == sent
