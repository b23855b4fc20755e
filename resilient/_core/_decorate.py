"""
The one decorator factory every primitive uses.

It keeps the wrapped callable's signature (for `inspect` through
``__wrapped__``, and for type checkers through ParamSpec), picks the sync or
async shell from the function itself, and works under and over
`classmethod` and `staticmethod`.

Why not wrapt: its `FunctionWrapper` costs about 0.47 us per call on the
machines we measure on, more than our whole success-path budget; a closure
with `functools.update_wrapper` does the same job here for 0.06 us, and
descriptors (methods) keep working because the closure is a plain function.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from types import FunctionType, MethodType
from typing import Any, Final, ParamSpec, TypeVar, cast


P = ParamSpec("P")
T = TypeVar("T")

SyncShell = Callable[
    [Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any
]
AsyncShell = Callable[
    [Callable[..., Awaitable[Any]], tuple[Any, ...], dict[str, Any]],
    Awaitable[Any],
]
StreamShell = Callable[[Callable[..., Any], bool], Callable[..., Any]]
"""Makes the guarded twin of a generator function: called with the function
and whether it is an async generator function, returns a generator function
of the same colour (`resilient._pipeline._stream`)."""
Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
"""Makes the wrapper of a function (see `decorate`'s *wrappers*)."""


def is_async_callable(fn: object) -> bool:
    """
    Whether calling *fn* returns a coroutine: coroutine functions, partials
    of them, and objects whose ``__call__`` is one.
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def stream_kind(fn: object) -> str | None:
    """
    ``"sync"`` when calling *fn* makes a generator, ``"async"`` when it
    makes an async generator (generator functions, partials of them, and
    objects whose ``__call__`` is one), else None.
    """
    # A function's (or method's) code flags first: `Policy.call` asks on
    # every call.
    flags: int | None = getattr(
        getattr(fn, "__code__", None), "co_flags", None
    )
    if flags is None:
        while isinstance(fn, functools.partial):
            fn = fn.func
        if not isinstance(fn, FunctionType | MethodType):
            # A callable object: what its ``__call__`` makes.
            fn = getattr(fn, "__call__", None)  # noqa: B004
        flags = getattr(getattr(fn, "__code__", None), "co_flags", 0)
    if flags & _ASYNC_GENERATOR:
        return "async"
    if flags & _GENERATOR:
        return "sync"
    return None


_GENERATOR: Final = inspect.CO_GENERATOR
_ASYNC_GENERATOR: Final = inspect.CO_ASYNC_GENERATOR


def decorate(  # noqa: C901 - one branch per kind of callable
    fn: Callable[P, T],
    sync_shell: SyncShell,
    async_shell: AsyncShell,
    *,
    check_sync: Callable[[Callable[..., Any]], None] | None = None,
    stream: StreamShell | str,
    wrappers: tuple[Wrapper, Wrapper] | None = None,
) -> Callable[P, T]:
    """
    Wrap *fn* so that each call goes through the matching shell.

    A generator function (sync or async) is a stream: the shells, which
    run a call to its return, would guard only the making of the generator
    object. So *stream* makes its wrapper, or, as a message naming the form
    to use instead, refuses it with `TypeError` (never silently unguarded).

    Args:
        fn: A function, method, coroutine function, callable object,
            `classmethod` or `staticmethod`.
        sync_shell: Called as ``sync_shell(fn, args, kwargs)``.
        async_shell: Awaited as ``async_shell(fn, args, kwargs)``.
        check_sync: Called with *fn* when it is sync, to refuse settings
            that only make sense in async code.
        stream: The maker of a generator function's guarded twin, or why
            generator functions are refused and what to use instead.
        wrappers: ``(make_sync, make_async)``: each called with *fn* to
            make the wrapper itself, for a primitive whose hot path runs
            in the wrapper (the shells then go unused).
    """
    if isinstance(fn, classmethod | staticmethod):
        inner = decorate(
            fn.__func__,
            sync_shell,
            async_shell,
            check_sync=check_sync,
            stream=stream,
            wrappers=wrappers,
        )
        return cast("Callable[P, T]", type(fn)(inner))
    if not callable(fn):
        raise TypeError(f"expected a callable to decorate, got {fn!r}")

    kind = stream_kind(fn)
    if kind is not None:
        if isinstance(stream, str):
            raise TypeError(f"{fn!r} is a generator function: {stream}")
        if kind == "sync" and check_sync is not None:
            check_sync(fn)
        wrapper: Callable[..., Any] = stream(fn, kind == "async")
    elif is_async_callable(fn):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await async_shell(fn, args, kwargs)  # type: ignore[arg-type]

        wrapper = async_wrapper
        if wrappers is not None:
            wrapper = wrappers[1](fn)
    else:
        if check_sync is not None:
            check_sync(fn)

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return sync_shell(fn, args, kwargs)

        wrapper = sync_wrapper
        if wrappers is not None:
            wrapper = wrappers[0](fn)

    # Copies what exists (callable objects lack __name__) and sets
    # __wrapped__, which inspect.signature follows.
    functools.update_wrapper(wrapper, fn)
    keep_defaults(wrapper, fn)
    return cast("Callable[P, T]", wrapper)


def keep_defaults(wrapper: Callable[..., Any], fn: object) -> None:
    """
    Copy *fn*'s ``__defaults__`` and ``__kwdefaults__`` onto *wrapper*,
    which `functools.update_wrapper` leaves out: code that reads them
    directly (not through `inspect.signature`, which follows
    ``__wrapped__``) sees the wrapped function's defaults. The wrapper
    takes only ``*args, **kwargs``, so they change nothing in its calls.
    """
    for name in ("__defaults__", "__kwdefaults__"):
        value = getattr(fn, name, None)  # Callable objects have none.
        if value is not None:
            setattr(wrapper, name, value)
