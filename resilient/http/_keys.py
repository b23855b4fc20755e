"""One idempotency key per logical call, in a context variable."""

from __future__ import annotations

import contextvars
import functools
import uuid
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, final

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
        Mapping,
    )
    from contextlib import AbstractContextManager


P = ParamSpec("P")
T = TypeVar("T")

_HEADER: Final = "Idempotency-Key"
"""The header the transports set (the IETF draft's and Stripe's name)."""

_KEY: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "resilient.http.idempotency_key", default=None
)


_UNSET: Final[Any] = object()
"""No value read yet (see the streams' closing)."""


def current_idempotency_key() -> str | None:
    """
    The idempotency key of the logical call in progress, or None outside
    `idempotent` / `idempotency_key`.

    .. versionadded:: 26.12.0
    """
    return _KEY.get()


def idempotency_key(key: str | None = None) -> AbstractContextManager[str]:
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
    return _KeyBlock(key)


@final
class _KeyBlock:
    """
    `idempotency_key`'s block. A class, not a ``contextlib`` generator:
    there an asynchronous exception could land between the key's setting
    and the ``try`` that undoes it (the generator's own lines, and
    ``__enter__``'s once the generator yielded), leaving the key set for
    every later request of the context. Here ``__enter__`` undoes its own
    setting on any way out, so the key is set only once the ``with`` owns
    it, and ``__exit__`` puts back the value it found.
    One point is out of reach of any context manager written in Python:
    an exception delivered as CPython calls ``__exit__``, before its first
    instruction. `idempotent` has no ``__exit__``, and no such point.
    """

    __slots__ = ("_entered", "_key", "_prior")

    def __init__(self, key: str | None) -> None:
        self._key = key
        self._prior: str | None = None
        self._entered = False

    def __enter__(self) -> str:
        if self._entered:
            raise RuntimeError("an idempotency_key() block is entered once")
        prior = self._prior = _KEY.get()
        key = self._key
        if key is None:
            key = prior if prior is not None else str(uuid.uuid4())
        self._entered = True
        try:
            _KEY.set(key)
        except BaseException:
            # Landed as the set returned: the ``with`` will not exit.
            _KEY.set(prior)
            raise
        return key

    def __exit__(self, *exc_info: object) -> None:
        _KEY.set(self._prior)


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
    # Every wrapper below sets the key inside the ``try`` whose ``finally``
    # puts the value it found back (by value: a token could be lost as the
    # set returns), so an asynchronous exception landing anywhere leaves
    # nothing set.
    if is_async_callable(fn):

        @functools.wraps(fn)
        async def acall(*args: P.args, **kwargs: P.kwargs) -> T:
            prior = _KEY.get()
            try:
                _KEY.set(prior if prior is not None else str(uuid.uuid4()))
                return await fn(*args, **kwargs)  # type: ignore[misc,no-any-return]
            finally:
                _KEY.set(prior)

        keep_defaults(acall, fn)
        return acall  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        prior = _KEY.get()
        try:
            _KEY.set(prior if prior is not None else str(uuid.uuid4()))
            return fn(*args, **kwargs)
        finally:
            _KEY.set(prior)

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
        prior = _KEY.get()
        try:
            _KEY.set(key)
            inner = fn(*args, **kwargs)
        finally:
            _KEY.set(prior)
        try:
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                # Each step of the stream under the key, and nothing of
                # the consumer's between steps.
                prior = _KEY.get()
                try:
                    _KEY.set(key)
                    if thrown is not None:
                        item = inner.throw(thrown)
                    else:
                        item = inner.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    thrown = None
                    _KEY.set(prior)
                try:
                    sent = yield item
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - thrown in
                    thrown, sent = exc, None
        finally:
            # Closed even if an exception lands as the key is set; the
            # value put back only once read (_UNSET: the set never ran).
            prior = _UNSET
            try:
                prior = _KEY.get()
                _KEY.set(key)
            finally:
                try:
                    inner.close()
                finally:
                    if prior is not _UNSET:
                        _KEY.set(prior)

    return stream


def _async_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        key = _call_key()
        prior = _KEY.get()
        try:
            _KEY.set(key)
            inner = fn(*args, **kwargs)
        finally:
            _KEY.set(prior)
        try:
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                prior = _KEY.get()
                try:
                    _KEY.set(key)
                    if thrown is not None:
                        item = await inner.athrow(thrown)
                    else:
                        item = await inner.asend(sent)
                except StopAsyncIteration:
                    return
                finally:
                    thrown = None
                    _KEY.set(prior)
                try:
                    sent = yield item
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - thrown in
                    thrown, sent = exc, None
        finally:
            # Closed even if an exception lands as the key is set; the
            # value put back only once read (_UNSET: the set never ran).
            prior = _UNSET
            try:
                prior = _KEY.get()
                _KEY.set(key)
            finally:
                try:
                    await inner.aclose()
                finally:
                    if prior is not _UNSET:
                        _KEY.set(prior)

    return stream


def needs_key(
    method: str,
    headers: Mapping[str, str | bytes] | None,
    *,
    header: str = _HEADER,
) -> str | None:
    """
    The key to add to a request with *method* and *headers*: the current
    key when the method is not idempotent and the request has none under
    *header* (``Idempotency-Key`` by default; give the name your server
    reads, and the same to `resilient.Transient`'s *idempotency_header*).
    Header values may be `str` or `bytes`, as requests types them.
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
