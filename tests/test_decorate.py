"""
Every decorator of the library keeps the decorated function's
``__defaults__`` and ``__kwdefaults__`` on its wrapper (issue 7, item 10),
besides its signature: code that reads them directly, not through
`inspect.signature`, sees the function's own defaults.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import resilient
import resilient.http


def _decorators() -> dict[str, Callable[[Callable[..., Any]], Any]]:
    """One of each decorator the library has, freshly named."""
    tag = uuid.uuid4().hex
    policy = resilient.Policy(name=f"defaults-{tag}")
    return {
        "policy": policy,
        "retry": resilient.retry(policy),
        "breaker": resilient.breaker(f"defaults-{tag}"),
        "bulkhead": resilient.bulkhead(f"defaults-{tag}", max_concurrent=2),
        "singleflight": resilient.singleflight(),
        "lock": resilient.lock(
            f"defaults-{tag}", backend=f"memory://defaults-{tag}"
        ),
        "idempotent": resilient.http.idempotent,
    }


NAMES = sorted(_decorators())


def _sync(a: int, b: int = 2, *, c: int = 3) -> tuple[int, int, int]:
    return a, b, c


async def _async(a: int, b: int = 2, *, c: int = 3) -> tuple[int, int, int]:
    return a, b, c


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fn", [_sync, _async], ids=["sync", "async"])
def test_wrapper_keeps_defaults(name: str, fn: Callable[..., Any]) -> None:
    """The wrapper has the function's __defaults__ and __kwdefaults__,
    its signature, and calls still take the defaults and the overrides."""
    wrapped = _decorators()[name](fn)
    assert wrapped.__defaults__ == (2,)
    assert wrapped.__kwdefaults__ == {"c": 3}
    assert str(inspect.signature(wrapped)) == str(inspect.signature(fn))
    if fn is _sync:
        assert wrapped(1) == (1, 2, 3)
        assert wrapped(1, 5, c=6) == (1, 5, 6)
    else:

        async def main() -> tuple[Any, Any]:
            return await wrapped(1), await wrapped(1, 5, c=6)

        assert anyio.run(main) == ((1, 2, 3), (1, 5, 6))


def _stream(a: int, b: int = 2, *, c: int = 3) -> Iterator[int]:
    yield from (a, b, c)


@pytest.mark.parametrize(
    "name", [n for n in NAMES if n not in {"lock", "singleflight"}]
)
def test_stream_wrapper_keeps_defaults(name: str) -> None:
    """A generator function's guarded twin keeps its defaults too (lock
    and singleflight refuse generator functions)."""
    wrapped = _decorators()[name](_stream)
    assert wrapped.__defaults__ == (2,)
    assert wrapped.__kwdefaults__ == {"c": 3}
    assert list(wrapped(1)) == [1, 2, 3]


@pytest.mark.parametrize("name", NAMES)
def test_methods_and_callables(name: str) -> None:
    """A method's wrapper keeps the method's defaults; a callable object
    (which has none) gets none."""

    class Service:
        def method(self, x: int = 4) -> int:
            return x

    class Handler:
        def __call__(self, x: int = 4) -> int:
            return x

    decorator = _decorators()[name]
    method = decorator(Service.method)
    assert method.__defaults__ == (4,)
    assert method(Service()) == 4
    obj = decorator(Handler())
    assert getattr(obj, "__defaults__", None) is None
    assert obj() == 4
