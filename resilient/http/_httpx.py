"""httpx transports that add the current idempotency key."""

from __future__ import annotations

from typing import final

import httpx

from resilient.http._keys import _HEADER, check_header, needs_key


@final
class IdempotencyKeyTransport(httpx.BaseTransport):
    """
    An httpx transport that adds the current idempotency key (see
    `resilient.http.idempotent`) to every non-idempotent request without
    one, under *header*, then sends it through *inner* (a plain
    `httpx.HTTPTransport` by default).

    .. versionadded:: 26.12.0
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        header: str = _HEADER,
    ) -> None:
        self._header = check_header(header)
        self._inner = inner if inner is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Add the key if needed; send."""
        key = needs_key(request.method, request.headers, header=self._header)
        if key is not None:
            request.headers[self._header] = key
        return self._inner.handle_request(request)

    def close(self) -> None:
        """Close the inner transport."""
        self._inner.close()


@final
class AsyncIdempotencyKeyTransport(httpx.AsyncBaseTransport):
    """
    `IdempotencyKeyTransport` for `httpx.AsyncClient` (asyncio and trio).

    .. versionadded:: 26.12.0
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport | None = None,
        *,
        header: str = _HEADER,
    ) -> None:
        self._header = check_header(header)
        self._inner = (
            inner if inner is not None else httpx.AsyncHTTPTransport()
        )

    async def handle_async_request(
        self, request: httpx.Request
    ) -> httpx.Response:
        """Add the key if needed; send."""
        key = needs_key(request.method, request.headers, header=self._header)
        if key is not None:
            request.headers[self._header] = key
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()
