"""Retrying on a returned response (issue 7, item 2, in part):
`retry_if_status` and the response's own Retry-After."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

import resilient
from resilient import Constant, Policy
from resilient.testing import FakeClock, use_clock
from tests.http_server import Server


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.conftest import Driver


@pytest.fixture
def server() -> Iterator[Server]:
    """A fresh local HTTP server per test."""
    s = Server()
    yield s
    s.stop()


def _get(driver: Driver, url: str) -> Callable[[], Any]:
    """GET *url* with httpx in *driver*'s colour, returning the response
    (no raise_for_status)."""
    if not driver.is_async:

        def get() -> httpx.Response:
            with httpx.Client(timeout=10) as c:
                return c.get(url)

        return get

    async def aget() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as c:
            return await c.get(url)

    return aget


def _policy(**kw: Any) -> Policy:
    return Policy(
        name="responses",
        attempts=3,
        backoff=Constant(0.5),
        retry_if_result=resilient.retry_if_status(),
        **kw,
    )


def test_503_response_waits_its_retry_after(
    server: Server, driver: Driver
) -> None:
    """A returned 503 with ``Retry-After: 7`` is retried after 7 virtual
    seconds (the hint, not the 0.5 s backoff)."""
    get = _get(driver, server.url + "/script/r/503,200")
    clock = FakeClock()
    with use_clock(clock):
        response = driver.run(resilient.retry(_policy())(get))
    assert response.status_code == 200
    assert clock.sleeps == [7.0]


def test_last_response_returned_when_attempts_run_out(
    server: Server, driver: Driver
) -> None:
    """When the attempts run out the last response is returned; a 502
    (no hint) waits the backoff."""
    get = _get(driver, server.url + "/status/502")
    clock = FakeClock()
    with use_clock(clock):
        response = driver.run(resilient.retry(_policy())(get))
    assert response.status_code == 502
    assert clock.sleeps == [0.5, 0.5]
    assert len(server.seen) == 3


def test_non_response_results_use_the_backoff(clock: Any) -> None:
    """A result that is not response-like is never read for a hint (a
    custom retry_after reader is written for exceptions)."""
    results = iter([None, None, 1])
    policy = Policy(
        attempts=3,
        backoff=Constant(0.25),
        retry_if_result=lambda r: r is None,
    )
    assert policy(lambda: next(results))() == 1
    assert clock.sleeps == [0.25, 0.25]


def test_retry_if_status_predicate() -> None:
    """retry_if_status reads the status like http_status; bad codes are
    refused naming the argument."""
    check = resilient.retry_if_status({500, 503})
    assert check(httpx.Response(503))
    assert not check(httpx.Response(404))
    assert not check(None)
    assert check == resilient.retry_if_status([503, 500])
    assert hash(check) == hash(resilient.retry_if_status({500, 503}))
    assert repr(check) == "retry_if_status([500, 503])"
    assert resilient.retry_if_status()(httpx.Response(429))
    with pytest.raises(resilient.ConfigTypeError, match="retry_if_status"):
        resilient.retry_if_status(3)  # type: ignore[arg-type]
    with pytest.raises(resilient.ConfigTypeError, match="retry_if_status"):
        resilient.retry_if_status(["503"])  # type: ignore[list-item]
    with pytest.raises(resilient.ConfigError, match="retry_if_status"):
        resilient.retry_if_status({700})
