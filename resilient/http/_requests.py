"""A requests adapter that adds the current idempotency key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from requests.adapters import HTTPAdapter

from resilient.http._keys import _HEADER, check_header, needs_key


if TYPE_CHECKING:
    from requests import PreparedRequest, Response


@final
class IdempotencyKeyAdapter(HTTPAdapter):
    """
    A requests transport adapter that adds the current idempotency key (see
    `resilient.http.idempotent`) to every non-idempotent request without
    one. Mount it on a session::

        session.mount("https://", resilient.http.IdempotencyKeyAdapter())

    Takes the same arguments as `requests.adapters.HTTPAdapter`, and
    *header*, the name to send the key under (``Idempotency-Key`` by
    default).

    .. versionadded:: 26.12.0
    """

    # What requests' own pickling keeps of an adapter.
    __attrs__ = [*HTTPAdapter.__attrs__, "_header"]  # noqa: RUF012

    def __init__(
        self, *args: Any, header: str = _HEADER, **kwargs: Any
    ) -> None:
        self._header = check_header(header)
        super().__init__(*args, **kwargs)

    def send(
        self, request: PreparedRequest, *args: Any, **kwargs: Any
    ) -> Response:
        """Add the key if needed; send."""
        key = needs_key(
            request.method or "GET", request.headers, header=self._header
        )
        if key is not None:
            request.headers[self._header] = key
        return super().send(request, *args, **kwargs)
