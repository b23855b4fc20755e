"""
A response the policy discards to retry it (``retry_if_status``,
``retry_if_result``) is closed (issue 15, section 6, item 2): its connection
goes back to the pool instead of being held until the garbage collector
finds the response. httpx sync and async (asyncio, trio) and requests,
decorator and block form, against the real local server of
tests/http_server.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
import requests
import requests.adapters

import resilient


if TYPE_CHECKING:
    from tests.conftest import Driver
    from tests.http_server import Server


_ATTEMPTS = 4


def _policy(**kw: Any) -> resilient.Policy:
    return resilient.Policy(
        name="discard",
        attempts=_ATTEMPTS,
        backoff=resilient.Constant(0),
        retry_after=None,
        **kw,
    )


def _limits() -> dict[str, Any]:
    """One connection in the pool, and a short wait for it: a response
    kept open holds the only connection."""
    return {
        "limits": httpx.Limits(max_connections=1),
        "timeout": httpx.Timeout(5.0, pool=0.5),
    }


@pytest.mark.parametrize("form", ["decorator", "block"])
@pytest.mark.parametrize(
    "predicate",
    ["retry_if_status", "retry_if_result"],
    ids=["status", "result"],
)
def test_httpx_streamed_responses_retried_are_closed(
    driver: Driver, form: str, predicate: str, server: Server
) -> None:
    """Streamed 503 responses, retried through a pool of one connection:
    every attempt gets the connection (on 4f15275 the second waits for a
    connection the first response holds: PoolTimeout), and every discarded
    response is closed."""
    url = server.url + "/script/s/503,503,503,200"
    policy = _policy(
        retry_if_result=resilient.retry_if_status()
        if predicate == "retry_if_status"
        else lambda r: r.status_code == 503
    )
    seen: list[httpx.Response] = []

    if not driver.is_async:
        with httpx.Client(**_limits()) as client:

            def get() -> httpx.Response:
                response = client.send(
                    client.build_request("GET", url), stream=True
                )
                seen.append(response)
                return response

            if form == "decorator":
                last = policy(get)()
            else:
                for attempt in resilient.retrying(policy):
                    with attempt:
                        last = get()
                        attempt.set_result(last)
            assert last.status_code == 200
            last.close()
    else:

        async def main() -> None:
            async with httpx.AsyncClient(**_limits()) as client:

                async def aget() -> httpx.Response:
                    response = await client.send(
                        client.build_request("GET", url), stream=True
                    )
                    seen.append(response)
                    return response

                if form == "decorator":
                    last = await policy(aget)()
                else:
                    async for attempt in resilient.retrying(policy):
                        async with attempt:
                            last = await aget()
                            attempt.set_result(last)
                assert last.status_code == 200
                await last.aclose()

        anyio.run(main, backend=driver.kind)
    assert [r.status_code for r in seen] == [503, 503, 503, 200]
    assert all(r.is_closed for r in seen[:-1])


@pytest.mark.parametrize("form", ["decorator", "block"])
def test_requests_responses_retried_are_closed(
    form: str, server: Server
) -> None:
    """requests: streamed 503 responses the policy retries are closed (their
    raw stream released to the pool), the one returned is not."""
    url = server.url + "/script/r/503,503,200"
    policy = _policy(retry_if_result=resilient.retry_if_status())
    seen: list[requests.Response] = []
    with requests.Session() as session:
        session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=1))

        def get() -> requests.Response:
            response = session.get(url, stream=True, timeout=5)
            seen.append(response)
            return response

        if form == "decorator":
            last = policy(get)()
        else:
            for attempt in resilient.retrying(policy):
                with attempt:
                    last = get()
                    attempt.set_result(last)
        assert last.status_code == 200
        assert not last.raw.closed
        last.close()
    assert [r.status_code for r in seen] == [503, 503, 200]
    assert all(r.raw.closed for r in seen[:-1])


def test_other_results_are_left_alone(driver: Driver) -> None:
    """A discarded result that is not a known response is not touched:
    its close() (a shared object's, perhaps) is not called."""
    closed: list[int] = []

    class Shared:
        def close(self) -> None:
            closed.append(1)

    results = iter([Shared(), Shared(), 7])
    policy = _policy(retry_if_result=lambda r: isinstance(r, Shared))
    assert driver.call(policy, lambda: next(results)) == 7
    assert closed == []
