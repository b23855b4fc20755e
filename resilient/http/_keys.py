"""One idempotency key per logical call, in a context variable."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import uuid
from typing import TYPE_CHECKING, Final, ParamSpec, TypeVar

from resilient._core._decorate import is_async_callable, keep_defaults
from resilient._core._transient import IDEMPOTENT_METHODS
from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping


P = ParamSpec("P")
T = TypeVar("T")

_HEADER: Final = "Idempotency-Key"
"""The header the transports set (the IETF draft's and Stripe's name)."""

_KEY: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "resilient.http.idempotency_key", default=None
)


def current_idempotency_key() -> str | None:
    """
    The idempotency key of the logical call in progress, or None outside
    `idempotent` / `idempotency_key`.

    .. versionadded:: 26.12.0
    """
    return _KEY.get()


@contextlib.contextmanager
def idempotency_key(key: str | None = None) -> Iterator[str]:
    """
    A block that is one logical call: every non-idempotent request the
    transports send inside it carries the same idempotency key.

    Nested blocks share the outer key (a call made of calls is still one
    operation) unless *key* is given.

    Args:
        key: The key to use; None makes a random one (a UUID4), or reuses
            the enclosing block's.

    Example:
        >>> import resilient.http
        >>> with resilient.http.idempotency_key("order-42") as key:
        ...     key == resilient.http.current_idempotency_key()
        True

    .. versionadded:: 26.12.0
    """
    _check_key(key)
    current = _KEY.get()
    if key is None:
        key = current if current is not None else str(uuid.uuid4())
    token = _KEY.set(key)
    try:
        yield key
    finally:
        _KEY.reset(token)


def _check_key(key: object) -> None:
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigTypeError(
            "idempotency_key(key)", key, "must be a non-empty str or None"
        )


def idempotent(fn: Callable[P, T], /) -> Callable[P, T]:
    """
    Run every call of *fn* (sync or async) as one logical call with a key
    of its own: put it outside the policy that retries, so that all the
    attempts of a call share the key and the next call gets a new one.

    .. versionadded:: 26.12.0
    """
    if is_async_callable(fn):

        @functools.wraps(fn)
        async def acall(*args: P.args, **kwargs: P.kwargs) -> T:
            with idempotency_key():
                return await fn(*args, **kwargs)  # type: ignore[misc,no-any-return]

        keep_defaults(acall, fn)
        return acall  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        with idempotency_key():
            return fn(*args, **kwargs)

    keep_defaults(call, fn)
    return call


def needs_key(method: str, headers: Mapping[str, str] | None) -> str | None:
    """
    The key to add to a request with *method* and *headers*: the current
    key when the method is not idempotent and the request has none.
    """
    if method.upper() in IDEMPOTENT_METHODS:
        return None
    key = _KEY.get()
    if key is None:
        return None
    if headers is not None and headers.get(_HEADER):
        return None
    return key
