"""
Public protocols and aliases: what a user implements or annotates with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeAlias


if TYPE_CHECKING:
    import random

    from resilient._core._decisions import RetryEvent


__all__ = [
    "AsyncHook",
    "Backoff",
    "Clock",
    "ExceptionPredicate",
    "Fallback",
    "Hook",
    "ResultPredicate",
    "RetryAfter",
]


class Clock(Protocol):
    """
    Where resilient reads the time and how it waits.

    `now` is monotonic seconds; the sleeps wait that many seconds.
    """

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    async def asleep(self, seconds: float) -> None: ...


class Backoff(Protocol):
    """
    A backoff strategy: how long to wait before a retry.

    Implement `delay` to write your own; it must be pure but for *rng*.
    A strategy may also have a ``cap`` attribute (seconds, its largest
    delay): retry then spreads its waits for an open circuit breaker over
    that window too, as it does for the built-in jittered strategies.
    """

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """
        Seconds to wait before retry number *retry* (0 for the first retry).

        Args:
            retry: How many retries came before this one.
            previous: The delay returned for the previous retry (0.0 before
                the first).
            rng: The random source to draw jitter from.
        """
        ...


ExceptionPredicate: TypeAlias = Callable[[Exception], bool]
"""Decides from an exception whether it is transient (retry) or not."""

ResultPredicate: TypeAlias = Callable[[object], bool]
"""Decides from a returned value whether to retry (True) or accept it."""

RetryAfter: TypeAlias = Callable[[Exception], "float | None"]
"""Reads a server's wait hint, in seconds, from an exception; None if none."""

Hook: TypeAlias = Callable[["RetryEvent"], object]
"""A callback told about a retry or a give-up; what it returns is ignored."""

AsyncHook: TypeAlias = Callable[["RetryEvent"], Awaitable[object]]
"""An async callback; awaited from async code only."""

Fallback: TypeAlias = Callable[[Exception], object]
"""A policy's fallback: given the exception that ended the call, returns
what the call returns instead (or an awaitable of it, in async code), or
raises."""
