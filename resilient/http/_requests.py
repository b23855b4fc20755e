"""A requests adapter that adds the current idempotency key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from requests.adapters import HTTPAdapter

from resilient.http._keys import _HEADER, needs_key


if TYPE_CHECKING:
    from requests import PreparedRequest, Response


@final
class IdempotencyKeyAdapter(HTTPAdapter):
    """
    A requests transport adapter that adds the current idempotency key (see
    `resilient.http.idempotent`) to every non-idempotent request without
    one. Mount it on a session::

        session.mount("https://", resilient.http.IdempotencyKeyAdapter())

    Takes the same arguments as `requests.adapters.HTTPAdapter`.

    .. versionadded:: 26.12.0
    """

    def send(
        self, request: PreparedRequest, *args: Any, **kwargs: Any
    ) -> Response:
        """Add the key if needed; send."""
        key = needs_key(request.method or "GET", request.headers)
        if key is not None:
            request.headers[_HEADER] = key
        return super().send(request, *args, **kwargs)
