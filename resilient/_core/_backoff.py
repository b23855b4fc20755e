"""
Backoff strategies and the schedule they produce.

All are pure: given the retry number, the previous delay and a random source,
they return the next delay. None of them overflows, whatever the retry number:
``base * 2**n`` is computed with `math.ldexp` only while it is below the cap.
"""

from __future__ import annotations

import inspect
import math
import random
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from resilient._core._decorate import is_async_callable
from resilient._core._keywords import settings_checked
from resilient._core._validate import (
    field_name,
    non_negative,
    positive,
    to_seconds,
)
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from resilient.typing import Backoff


def _cap_not_below_base(
    inst: Any, attribute: attrs.Attribute[Any], value: float
) -> None:
    positive(inst, attribute, value)
    if value < inst.base:
        raise ConfigError(
            field_name(inst, attribute),
            value,
            f"must be >= base ({inst.base!r})",
        )


# Every positive float lies in [2**-1074, 2**1024): past this many doublings
# even the smallest base is above the largest cap.
_ALWAYS_CAPPED: Final = 2100
_ldexp: Final = math.ldexp
_POWERS_OF_TWO: Final = tuple(2.0**n for n in range(1024))
"""``2.0**n`` for every n whose power is a float: ``base * 2.0**n`` is
``ldexp(base, n)``, exactly (a power of two only moves the exponent), or
infinite where ldexp overflows; an index is cheaper than ldexp's call."""


def exponential_ceiling(base: float, cap: float, retry: int) -> float:
    """
    ``min(cap, base * 2**retry)`` without overflow for any *retry* >= 0.
    """
    if retry >= 0:
        try:
            window = base * _POWERS_OF_TWO[retry]
        except IndexError:
            pass
        else:
            # Infinite where ldexp overflows: above the cap too.
            return window if window < cap else cap  # noqa: FURB136
    if retry >= _ALWAYS_CAPPED:
        return cap
    # ldexp is exact, and only overflows when base * 2**retry exceeds the
    # largest float, which is then above the cap too.
    try:
        window = _ldexp(base, retry)
    except OverflowError:
        return cap
    return window if window < cap else cap  # noqa: FURB136 - min() is a call


@final
@settings_checked
@attrs.frozen
class FullJitter:
    """
    Full jitter, the default: uniform in ``[0, min(cap, base * 2**n)]``.

    Spreads retries of many clients over the whole window, which is what
    keeps a recovering dependency from being hit by synchronised waves
    (Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015).

    Args:
        base: Seconds; the window before the first retry.
        cap: Seconds; the largest window.
    """

    base: float = attrs.field(
        default=0.2, validator=positive, converter=to_seconds
    )
    cap: float = attrs.field(
        default=5.0, validator=_cap_not_below_base, converter=to_seconds
    )

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """Uniform in [0, min(cap, base * 2**retry)]."""
        # rng.uniform(0.0, w) is 0.0 + (w - 0.0) * rng.random(): the same
        # float, one call less; and `exponential_ceiling`, inline (a frame
        # less: this is the default backoff, run before every retry).
        # The window by `_POWERS_OF_TWO` (infinite where ldexp overflows,
        # above the cap too) for any retry below 1024.
        cap = self.cap
        if retry >= 0:
            try:
                window = self.base * _POWERS_OF_TWO[retry]
            except IndexError:
                pass
            else:
                if window < cap:
                    return window * rng.random()
                return cap * rng.random()
        if retry >= _ALWAYS_CAPPED:
            return cap * rng.random()
        try:
            window = _ldexp(self.base, retry)
        except OverflowError:
            return cap * rng.random()
        if window < cap:
            return window * rng.random()
        return cap * rng.random()


@final
@settings_checked
@attrs.frozen
class EqualJitter:
    """
    Equal jitter: half the exponential window fixed, half random.

    ``w = min(cap, base * 2**n)``; the delay is uniform in ``[w/2, w]``.
    """

    base: float = attrs.field(
        default=0.2, validator=positive, converter=to_seconds
    )
    cap: float = attrs.field(
        default=5.0, validator=_cap_not_below_base, converter=to_seconds
    )

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """Uniform in [w/2, w] with w = min(cap, base * 2**retry)."""
        window = exponential_ceiling(self.base, self.cap, retry)
        return window / 2 + rng.uniform(0.0, window / 2)


@final
@settings_checked
@attrs.frozen
class DecorrelatedJitter:
    """
    Decorrelated jitter: uniform in ``[base, 3 * previous]``, capped.

    Each delay depends on the one before, not on the retry number.
    Before the first retry *previous* counts as *base*, so the first delay
    is already uniform in ``[base, 3 * base]`` and a fleet does not retry in
    one wave (Brooker's ``sleep = min(cap, random_between(base, sleep * 3))``
    starting from ``sleep = base``).
    """

    base: float = attrs.field(
        default=0.2, validator=positive, converter=to_seconds
    )
    cap: float = attrs.field(
        default=5.0, validator=_cap_not_below_base, converter=to_seconds
    )

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """min(cap, uniform(base, 3 * max(base, previous)))."""
        high = min(self.cap, max(self.base, previous) * 3)
        return min(self.cap, rng.uniform(self.base, high))


@final
@settings_checked
@attrs.frozen
class Exponential:
    """
    Exponential backoff without jitter: ``min(cap, base * 2**n)``.

    Every client waits the same: use it for a single client, never a fleet
    (the simulator shows the synchronised waves it makes).
    """

    base: float = attrs.field(
        default=0.2, validator=positive, converter=to_seconds
    )
    cap: float = attrs.field(
        default=5.0, validator=_cap_not_below_base, converter=to_seconds
    )

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """min(cap, base * 2**retry)."""
        return exponential_ceiling(self.base, self.cap, retry)


@final
@settings_checked
@attrs.frozen
class Constant:
    """
    The same delay before every retry.

    Args:
        seconds: The delay; zero retries at once.
    """

    seconds: float = attrs.field(
        default=1.0, validator=non_negative, converter=to_seconds
    )

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """Always `seconds`."""
        return self.seconds


@final
@settings_checked
@attrs.frozen
class Custom:
    """
    A backoff from a plain function of the retry number.

    Args:
        fn: Called with the retry number (0 for the first retry); returns
            seconds. A function that cannot take one argument is refused
            here; a result that is negative, NaN or infinite raises
            `ValueError`, which a retry loop logs before it gives up
            (the call's own error propagates).
    """

    fn: Callable[[int], float] = attrs.field()

    @fn.validator
    def _check(self, attribute: attrs.Attribute[Any], value: object) -> None:
        where = field_name(self, attribute)
        if not callable(value):
            raise ConfigTypeError(where, value, "must be callable")
        if is_async_callable(value):
            raise ConfigTypeError(where, value, "must be a sync function")
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):  # pragma: no cover - some built-ins
            return
        try:
            signature.bind(0)
        except TypeError:
            raise ConfigTypeError(
                where,
                value,
                "must be callable with the retry number (1 positional "
                "argument)",
            ) from None

    def delay(self, retry: int, previous: float, rng: random.Random) -> float:
        """What `fn` returns, checked to be a finite number >= 0."""
        seconds = float(self.fn(retry))
        if not 0 <= seconds < math.inf:
            raise ValueError(
                f"Custom backoff returned {seconds!r} for retry {retry}; "
                "a delay must be finite and >= 0"
            )
        return seconds


def iter_delays(
    backoff: Backoff, *, rng: random.Random | None = None
) -> Iterator[float]:
    """
    The endless sequence of delays *backoff* draws, one per retry.

    Args:
        backoff: The strategy.
        rng: The random source; a fresh unseeded one if None.
    """
    rng = rng if rng is not None else random.Random()
    previous = 0.0
    retry = 0
    while True:
        previous = backoff.delay(retry, previous, rng)
        yield previous
        retry += 1


def schedule(
    backoff: Backoff, retries: int, *, seed: int | None = None
) -> tuple[float, ...]:
    """
    The first *retries* delays of *backoff*, reproducible for a *seed*.

    This is the exact sequence a retry loop with the same seed would sleep;
    the simulator and the notebooks are built on it.

    Args:
        backoff: The strategy (a policy's ``backoff``).
        retries: How many delays.
        seed: Seed for the jitter; None draws a fresh one.

    Raises:
        TypeError: *retries* is not an int (a bool included).
        ValueError: *retries* is negative.

    .. versionadded:: 26.11.0
    """
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise TypeError(
            f"schedule(retries=...) must be an int, got {retries!r}"
        )
    if retries < 0:
        raise ValueError(
            f"schedule(retries=...) must be >= 0, got {retries!r}"
        )
    it = iter_delays(backoff, rng=random.Random(seed))
    return tuple(next(it) for _ in range(retries))
