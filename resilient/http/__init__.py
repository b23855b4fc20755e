"""
HTTP helpers: idempotency keys that make a request safe to retry, for httpx
and requests, sync and async.

A retry repeats a request. For GET, PUT and DELETE that is harmless; a POST
that charged a card must not charge it twice. The default classifier
(`resilient.Transient`) therefore retries a non-idempotent request only when
it never left the client, or when it carries an ``Idempotency-Key`` header,
which servers such as Stripe's use to answer a repeat with the first
answer. The key must be the same for every attempt of one logical call and
new for the next call: `idempotent` (a decorator, outermost) and
`idempotency_key` (a context manager) give one key per call, and the
transports add it to every non-idempotent request sent under it::

    client = httpx.Client(transport=resilient.http.IdempotencyKeyTransport())

    @resilient.http.idempotent      # one key per call, shared by its retries
    @payments                       # the policy that retries
    def charge(order):
        return client.post(URL, json=order).raise_for_status()

`IdempotencyKeyTransport` and `AsyncIdempotencyKeyTransport` wrap httpx
transports; `IdempotencyKeyAdapter` is a requests adapter. They import their
client library when first used, so ``import resilient.http`` needs neither.

.. versionadded:: 26.12.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resilient.http._keys import (
    current_idempotency_key,
    idempotency_key,
    idempotent,
    needs_key,
)


if TYPE_CHECKING:
    from resilient.http._httpx import (
        AsyncIdempotencyKeyTransport,
        IdempotencyKeyTransport,
    )
    from resilient.http._requests import IdempotencyKeyAdapter


__all__ = [
    "AsyncIdempotencyKeyTransport",
    "IdempotencyKeyAdapter",
    "IdempotencyKeyTransport",
    "current_idempotency_key",
    "idempotency_key",
    "idempotent",
    "needs_key",
]

_LAZY = {
    "IdempotencyKeyTransport": "resilient.http._httpx",
    "AsyncIdempotencyKeyTransport": "resilient.http._httpx",
    "IdempotencyKeyAdapter": "resilient.http._requests",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(
            f"module 'resilient.http' has no attribute {name!r}"
        )
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(module), name)
    value.__module__ = "resilient.http"
    globals()[name] = value
    return value


for _name in (
    "current_idempotency_key",
    "idempotency_key",
    "idempotent",
    "needs_key",
):
    globals()[_name].__module__ = "resilient.http"
