"""
The two drivers of a stream, sync and async: the delegation of PEP 380
(``yield from``), one step at a time, so that the session can set and reset
what each step needs around it and never across a ``yield``.

A session (`resilient._pipeline._stream._policy.PolicyStream`,
`resilient._pipeline._stream._held.HeldStream`) has ``start``/``astart``
(admission and the first item: ``(inner, item)``, or ``(None, value)``
when the stream ended at once), ``step``/``astep`` (one call into the inner
generator), ``end``/``aend`` (settle, exactly once) and ``delivered`` (the
items handed out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable, Callable, Generator


def sync_stream(
    fn: Callable[..., Any], session: Callable[[], Any]
) -> Callable[..., Any]:
    def stream(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        s = session()
        error: BaseException | None = None
        try:
            inner, item = s.start(fn, args, kwargs)
            if inner is None:
                return item
            while True:
                s.delivered += 1
                try:
                    sent = yield item
                except GeneratorExit:
                    s.step(inner.close)
                    raise
                except BaseException as thrown:  # noqa: BLE001 - passed on
                    step: Callable[..., Any] = inner.throw
                    arg: tuple[Any, ...] = (thrown,)
                else:
                    step, arg = (
                        (inner.__next__, ())
                        if sent is None
                        else (inner.send, (sent,))
                    )
                try:
                    item = s.step(step, *arg)
                except StopIteration as stop:
                    return stop.value
        except BaseException as exc:
            error = exc
            raise
        finally:
            s.end(error)

    return stream


def async_stream(
    fn: Callable[..., Any], session: Callable[[], Any]
) -> Callable[..., Any]:
    async def stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        s = session()
        error: BaseException | None = None
        try:
            inner, item = await s.astart(fn, args, kwargs)
            if inner is None:
                return
            while True:
                s.delivered += 1
                try:
                    sent = yield item
                except GeneratorExit:
                    await s.astep(inner.aclose)
                    raise
                except BaseException as thrown:  # noqa: BLE001 - passed on
                    step: Callable[..., Awaitable[Any]] = inner.athrow
                    arg: tuple[Any, ...] = (thrown,)
                else:
                    step, arg = (
                        (inner.__anext__, ())
                        if sent is None
                        else (inner.asend, (sent,))
                    )
                try:
                    item = await s.astep(step, *arg)
                except StopAsyncIteration:
                    return
        except BaseException as exc:
            error = exc
            raise
        finally:
            await s.aend(error)

    return stream


def counted(exc: BaseException | None) -> BaseException | None:
    """What a stream's end counts: a consumer's close is no failure."""
    return None if isinstance(exc, GeneratorExit) else exc


def calm(exc: BaseException | None) -> bool:
    """Whether async settling may await: never while cancelled, closing or
    interrupted."""
    return exc is None or isinstance(exc, Exception)
