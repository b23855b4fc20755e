"""One idempotency key per logical call, in a context variable."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import uuid
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from resilient._core._decorate import (
    is_async_callable,
    keep_defaults,
    stream_kind,
)
from resilient._core._transient import IDEMPOTENT_METHODS
from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        Callable,
        Generator,
        Iterator,
        Mapping,
    )


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

    A generator or async generator function (a streamed request) keeps its
    call's key for the stream's whole life: every step of the stream runs
    under it, and only it (streams consumed in turns keep their own keys).

    .. versionadded:: 26.12.0
    """
    kind = stream_kind(fn)
    if kind is not None:
        wrapper = _sync_stream(fn) if kind == "sync" else _async_stream(fn)
        keep_defaults(wrapper, fn)
        return wrapper
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


def _call_key() -> str:
    """The key for a new logical call: the enclosing block's, or new."""
    current = _KEY.get()
    return current if current is not None else str(uuid.uuid4())


def _sync_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def stream(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        key = _call_key()
        token = _KEY.set(key)
        try:
            inner = fn(*args, **kwargs)
        finally:
            _KEY.reset(token)
        try:
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                # Each step of the stream under the key, and nothing of
                # the consumer's between steps.
                token = _KEY.set(key)
                try:
                    if thrown is not None:
                        item = inner.throw(thrown)
                    else:
                        item = inner.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    thrown = None
                    _KEY.reset(token)
                try:
                    sent = yield item
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - thrown in
                    thrown, sent = exc, None
        finally:
            token = _KEY.set(key)
            try:
                inner.close()
            finally:
                _KEY.reset(token)

    return stream


def _async_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        key = _call_key()
        token = _KEY.set(key)
        try:
            inner = fn(*args, **kwargs)
        finally:
            _KEY.reset(token)
        try:
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                token = _KEY.set(key)
                try:
                    if thrown is not None:
                        item = await inner.athrow(thrown)
                    else:
                        item = await inner.asend(sent)
                except StopAsyncIteration:
                    return
                finally:
                    thrown = None
                    _KEY.reset(token)
                try:
                    sent = yield item
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - thrown in
                    thrown, sent = exc, None
        finally:
            token = _KEY.set(key)
            try:
                await inner.aclose()
            finally:
                _KEY.reset(token)

    return stream


def needs_key(
    method: str,
    headers: Mapping[str, str] | None,
    *,
    header: str = _HEADER,
) -> str | None:
    """
    The key to add to a request with *method* and *headers*: the current
    key when the method is not idempotent and the request has none under
    *header* (``Idempotency-Key`` by default; give the name your server
    reads, and the same to `resilient.Transient`'s *idempotency_header*).
    """
    if method.upper() in IDEMPOTENT_METHODS:
        return None
    key = _KEY.get()
    if key is None:
        return None
    if headers is not None and headers.get(header):
        return None
    return key


def check_header(header: object) -> str:
    """*header*, if it is a header name."""
    if not isinstance(header, str) or not header.strip():
        raise ConfigTypeError("header", header, "must be a header name")
    return header
