"""
Gaps the audit of issue 7 found in `resilient.http`: `idempotent` on a
generator or async generator function (a streamed POST, an LLM token
stream) must hold the call's key while the stream runs, not only while
the generator object is made.
"""

from __future__ import annotations

import inspect
import pickle
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
import requests

import resilient
import resilient.http
from resilient.http import current_idempotency_key
from tests.http_server import Server


if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Generator, Iterator


def _keys(server: Server) -> list[str | None]:
    return [headers.get("Idempotency-Key") for _, _, headers in server.seen]


def test_sync_stream_holds_its_key_while_it_runs() -> None:
    """Every step of an idempotent generator sees the one key of its call
    (before the audit it saw None: the key was reset as soon as the
    generator object was made); the next call gets a new key; the wrapper
    is still a generator function, with the same defaults."""

    @resilient.http.idempotent
    def tokens(n: int = 2) -> Iterator[str | None]:
        for _ in range(n):
            yield current_idempotency_key()

    first, second = list(tokens()), list(tokens(3))
    assert first[0] is not None
    assert first == [first[0]] * 2
    assert second == [second[0]] * 3
    assert first[0] != second[0]
    assert current_idempotency_key() is None
    assert inspect.isgeneratorfunction(tokens)
    assert tokens.__defaults__ == (2,)


def test_interleaved_streams_keep_their_own_keys() -> None:
    """Two idempotent streams consumed in turns each see their own key at
    every step, and neither leaks into the caller."""

    @resilient.http.idempotent
    def tokens() -> Iterator[str | None]:
        for _ in range(3):
            yield current_idempotency_key()

    a, b = tokens(), tokens()
    seen = [(next(a), next(b)) for _ in range(3)]
    assert current_idempotency_key() is None
    assert len({k for k, _ in seen}) == 1
    assert len({k for _, k in seen}) == 1
    assert seen[0][0] != seen[0][1]


def test_sync_stream_send_throw_close_and_return() -> None:
    """The wrapper passes on sent values, thrown exceptions (which the
    stream may handle), close() and the return value, each step under the
    key."""
    log: list[Any] = []

    @resilient.http.idempotent
    def echo() -> Generator[Any, Any, None]:
        try:
            got = yield "ready"
            log.append((got, current_idempotency_key() is not None))
            try:
                yield "more"
            except KeyError:
                log.append(("caught", current_idempotency_key() is not None))
                yield "after"
            yield "last"
        finally:
            log.append(("finally", current_idempotency_key() is not None))

    stream = echo()
    assert next(stream) == "ready"
    assert stream.send("hello") == "more"
    assert stream.throw(KeyError("k")) == "after"
    stream.close()
    assert log == [
        ("hello", True),
        ("caught", True),
        ("finally", True),
    ]

    @resilient.http.idempotent
    def returns() -> Generator[int, None, int]:
        yield 1
        return 7

    stream2 = returns()
    next(stream2)
    with pytest.raises(StopIteration) as stop:
        next(stream2)
    assert stop.value.value == 7


def test_nested_stream_shares_the_enclosing_key() -> None:
    """Inside an enclosing `idempotency_key` block the stream uses that
    block's key, as a nested call does."""

    @resilient.http.idempotent
    def tokens() -> Iterator[str | None]:
        yield current_idempotency_key()

    with resilient.http.idempotency_key("outer"):
        assert list(tokens()) == ["outer"]


def test_async_stream_holds_its_key(anyio_backend: str) -> None:
    """An idempotent async generator holds its key at every step, on
    asyncio and trio, and stays an async generator function (before the
    audit every step saw None)."""

    @resilient.http.idempotent
    async def tokens() -> AsyncIterator[str | None]:
        for _ in range(2):
            await anyio.lowlevel.checkpoint()
            yield current_idempotency_key()

    async def main() -> tuple[list[str | None], list[str | None]]:
        first = [k async for k in tokens()]
        second = [k async for k in tokens()]
        return first, second

    first, second = anyio.run(main, backend=anyio_backend)
    assert first[0] is not None
    assert first == [first[0]] * 2
    assert second == [second[0]] * 2
    assert first[0] != second[0]
    assert inspect.isasyncgenfunction(tokens)


def test_streamed_post_retried_with_one_key(server: Server) -> None:
    """A streamed POST through the idempotency transport, under a retrying
    policy, sends its key on every attempt (a 502 before the first item is
    retried, as the stream rule allows), the same key each time."""
    client = httpx.Client(transport=resilient.http.IdempotencyKeyTransport())
    policy = resilient.Policy(
        name="audit-stream-post", attempts=3, backoff=resilient.Constant(0)
    )

    @resilient.http.idempotent
    @policy
    def lines() -> Iterator[str]:
        with client.stream(
            "POST", server.url + "/script/stream/502,200"
        ) as response:
            response.raise_for_status()
            yield from response.iter_lines()

    assert list(lines()) == ["status 200"]
    keys = _keys(server)
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys == [keys[0]] * 2


def test_async_streamed_post_retried_with_one_key(
    server: Server, anyio_backend: str
) -> None:
    """The async twin: httpx.AsyncClient with the async transport, asyncio
    and trio."""
    policy = resilient.Policy(
        name="audit-astream-post", attempts=3, backoff=resilient.Constant(0)
    )

    async def main() -> list[str]:
        async with httpx.AsyncClient(
            transport=resilient.http.AsyncIdempotencyKeyTransport()
        ) as client:

            @resilient.http.idempotent
            @policy
            async def lines() -> AsyncIterator[str]:
                async with client.stream(
                    "POST", server.url + f"/script/a{anyio_backend}/502,200"
                ) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        yield line

            return [line async for line in lines()]

    assert anyio.run(main, backend=anyio_backend) == ["status 200"]
    keys = _keys(server)
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys == [keys[0]] * 2


def test_transports_take_the_header_name_the_classifier_reads(
    server: Server,
) -> None:
    """http.md's ``Transient(idempotency_header="X-Request-Id")`` for a
    server with another header name works with the helpers: the httpx
    transport and the requests adapter send the key under the name given
    (before the audit they could only send ``Idempotency-Key``, which
    such a classifier does not read, so the POST was not retried)."""
    policy = resilient.Policy(
        name="audit-header-name",
        attempts=3,
        backoff=resilient.Constant(0),
        retry_on=resilient.Transient(idempotency_header="X-Request-Id"),
    )
    client = httpx.Client(
        transport=resilient.http.IdempotencyKeyTransport(header="X-Request-Id")
    )
    session = requests.Session()
    # Pickled and back, as requests' own pickling of a session does: the
    # header name survives.
    adapter = resilient.http.IdempotencyKeyAdapter(header="X-Request-Id")
    session.mount("http://", pickle.loads(pickle.dumps(adapter)))  # noqa: S301

    @resilient.http.idempotent
    @policy
    def with_httpx() -> int:
        url = server.url + "/script/hx/502,200"
        return client.post(url).raise_for_status().status_code

    @resilient.http.idempotent
    @policy
    def with_requests() -> int:
        response = session.post(server.url + "/script/rq/502,200", timeout=10)
        response.raise_for_status()
        return response.status_code

    assert with_httpx() == 200
    assert with_requests() == 200
    sent = [
        (h.get("X-Request-Id"), h.get("Idempotency-Key"))
        for _, _, h in server.seen
    ]
    assert len(sent) == 4
    assert all(key is not None and other is None for key, other in sent)
    assert sent[0] == sent[1] != sent[2] == sent[3]
    assert resilient.http.needs_key("POST", {}, header="X-Request-Id") is None
    with resilient.http.idempotency_key("k"):
        assert resilient.http.needs_key("POST", {"x-request-id": "own"}) == "k"
        assert (
            resilient.http.needs_key(
                "POST", {"X-Request-Id": "own"}, header="X-Request-Id"
            )
            is None
        )


def test_async_transport_takes_the_header_name(
    server: Server, anyio_backend: str
) -> None:
    """The async httpx transport too, on asyncio and trio."""
    policy = resilient.Policy(
        name="audit-aheader-name",
        attempts=3,
        backoff=resilient.Constant(0),
        retry_on=resilient.Transient(idempotency_header="X-Request-Id"),
    )

    async def main() -> int:
        async with httpx.AsyncClient(
            transport=resilient.http.AsyncIdempotencyKeyTransport(
                header="X-Request-Id"
            )
        ) as client:

            @resilient.http.idempotent
            @policy
            async def post() -> int:
                url = server.url + f"/script/a{anyio_backend}/502,200"
                response = await client.post(url)
                return response.raise_for_status().status_code

            return await post()

    assert anyio.run(main, backend=anyio_backend) == 200
    keys = [h.get("X-Request-Id") for _, _, h in server.seen]
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys == [keys[0]] * 2
