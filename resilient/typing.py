"""
Public protocols and aliases: what a user implements or annotates with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    overload,
)


if TYPE_CHECKING:
    import random
    from collections.abc import Hashable

    from resilient._core._decisions import RetryEvent
    from resilient._singleflight import SingleFlight, SingleFlightStatistics


__all__ = [
    "AsyncHook",
    "Backoff",
    "Clock",
    "ExceptionPredicate",
    "Fallback",
    "Hook",
    "ResultPredicate",
    "RetryAfter",
    "SingleFlightFunction",
]

_P = ParamSpec("_P")
_Q = ParamSpec("_Q")
_S = TypeVar("_S")
_T_co = TypeVar("_T_co", covariant=True)


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


class SingleFlightFunction(Protocol[_P, _T_co]):
    """
    What `resilient.singleflight` makes of a function (sync or async):
    called as the function was, with a handle on its group.

    Read as a method of an instance it is bound like the function, the
    handle included (``client.fetch.statistics()``). (mypy reads
    ``@classmethod`` over it as unbound; put ``@staticmethod`` or a plain
    method there, or call the class method through ``cls``.)

    .. versionadded:: 26.12.0
    """

    @property
    def group(self) -> SingleFlight:
        """The `SingleFlight` the calls run in."""
        ...

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _T_co: ...

    def statistics(self) -> SingleFlightStatistics:
        """The group's `SingleFlight.statistics`."""
        ...

    def forget(self, key: Hashable) -> bool:
        """The group's `SingleFlight.forget`: the key as the *key* function
        (or the default key) gives it."""
        ...

    @overload
    def __get__(
        self, instance: None, owner: type[Any], /
    ) -> SingleFlightFunction[_P, _T_co]: ...

    @overload
    def __get__(
        self: SingleFlightFunction[Concatenate[_S, _Q], _T_co],
        instance: _S,
        owner: type[Any],
        /,
    ) -> SingleFlightFunction[_Q, _T_co]: ...
