"""
The circuit breaker's configuration: frozen, validated data and nothing else.

The breaker itself (machine, shells, registry) lives in `resilient._breaker`
and reads these objects; nothing here imports it.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    TypedDict,
    Unpack,
    final,
)

import attrs

from resilient._core._decorate import is_async_callable
from resilient._core._keywords import settings_checked
from resilient._core._transient import DependencyFailure, every_leaf
from resilient._core._validate import (
    check_classes_or_predicate,
    check_exception_classes,
    check_int,
    check_number,
    field_name,
    positive,
    positive_int,
    positive_or_none,
    to_exception_classes,
    to_seconds,
)
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    import datetime as dt


log: Final = logging.getLogger("resilient")

FailureOn = (
    type[Exception] | tuple[type[Exception], ...] | Callable[[Exception], bool]
)
"""What `BreakerConfig.failure_on` accepts."""

Verdict = Literal["failure", "success", "ignore"]
"""How a breaker counts an exception, as `BreakerConfig.verdict` names it."""


class Outcome(enum.IntEnum):
    """
    How a breaker counts a call: the one form the machine, the shells and
    the pipeline pass around. An `int` so that the window takes it as a bit
    (`FAILURE` is the failure bit) without a lookup.
    """

    SUCCESS = 0
    """The dependency answered."""
    FAILURE = 1
    """The dependency failed."""
    IGNORE = 2
    """Counts neither way (and frees a probe's slot)."""

    @property
    def verdict(self) -> Verdict:
        """The outcome's name as `BreakerConfig.verdict` gives it."""
        return _VERDICT_NAMES[self]


_VERDICT_NAMES: Final[tuple[Verdict, Verdict, Verdict]] = (
    "success",
    "failure",
    "ignore",
)

MAX_COUNT_WINDOW: Final = 1_000_000
"""The largest `CountWindow` size: a byte per call, so 1 MB per breaker."""
MIN_TIME_WINDOW: Final = 1e-3
"""The shortest `TimeWindow`, in seconds (its 60 buckets must be real)."""
MAX_TIME_WINDOW: Final = 1e9
"""The longest `TimeWindow`, in seconds (about 31 years)."""
MAX_GROWTH: Final = 1000.0
"""The largest `BreakerConfig.open_interval_growth`: more reaches
*max_open_interval* on the first re-opening anyway."""


def _count_size(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_int(inst, attribute, value)
    if value > MAX_COUNT_WINDOW:  # type: ignore[operator]
        raise ConfigError(
            field_name(inst, attribute),
            value,
            f"must be <= {MAX_COUNT_WINDOW:,} (a byte per call)",
        )


def _window_seconds(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, strict=True, maximum=MAX_TIME_WINDOW)
    if value < MIN_TIME_WINDOW:  # type: ignore[operator]
        raise ConfigError(
            field_name(inst, attribute),
            value,
            f"must be >= {MIN_TIME_WINDOW:g} s (60 buckets of it)",
        )


def _to_ratio(value: object) -> object:
    """
    An int becomes a float (one too large for a float an infinity, which
    the validator refuses); anything else is left for the validator, so a
    `datetime.timedelta` is refused: a ratio is not a duration.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


@final
@settings_checked
@attrs.frozen
class CountWindow:
    """
    A count-based sliding window: the outcomes of the last *size* calls.

    Args:
        size: How many of the latest calls the failure rate is taken over,
            from 1 to 1,000,000 (the window keeps a byte per call).

    .. versionadded:: 26.11.0
    """

    size: int = attrs.field(default=100, validator=_count_size)


@final
@settings_checked
@attrs.frozen
class TimeWindow:
    """
    A time-based sliding window: the calls of the last *seconds*.

    Calls are kept in 60 buckets of ``seconds / 60`` each, so a call leaves
    the window between 59/60 and 60/60 of *seconds* after it ended; memory
    does not grow with traffic.

    Args:
        seconds: The window's length, in seconds (`datetime.timedelta` is
            accepted), from 0.001 to 1e9.

    .. versionadded:: 26.11.0
    """

    seconds: float = attrs.field(
        default=60.0, converter=to_seconds, validator=_window_seconds
    )


def _check_window(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if not isinstance(value, CountWindow | TimeWindow):
        raise ConfigTypeError(
            field_name(inst, attribute),
            value,
            "must be a resilient.CountWindow or resilient.TimeWindow",
        )


def _rate(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """A fraction in (0, 1]."""
    check_number(inst, attribute, value, strict=True, maximum=1.0)


def _growth(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, minimum=1.0, maximum=MAX_GROWTH)


def _check_failure_on(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_classes_or_predicate(inst, attribute, value, never="never count")
    if not isinstance(value, tuple) and is_async_callable(value):
        raise ConfigTypeError(
            field_name(inst, attribute),
            value,
            "must be a plain (sync) predicate: the breaker cannot await it, "
            "and an un-awaited coroutine would read as true",
        )


def _check_bool(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if not isinstance(value, bool):
        raise ConfigTypeError(
            field_name(inst, attribute), value, "must be a bool"
        )


def _check_ignore_on(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    name = field_name(inst, attribute)
    if not isinstance(value, tuple):
        raise ConfigTypeError(name, value, "must be exception classes")
    check_exception_classes(name, value, never="never count")


@final
@settings_checked
@attrs.frozen(kw_only=True)
class BreakerConfig:
    """
    How a circuit breaker decides: its window, thresholds and timings.

    Frozen and validated at construction: a bad value raises `ConfigError`
    (a `ValueError`) or `ConfigTypeError` (also a `TypeError`) naming the
    field and the value. Make variants with `attrs.evolve` or `evolve`.

    Args:
        window: Which calls the rates are taken over: `TimeWindow` (the
            last N seconds) or `CountWindow` (the last N calls).
        failure_rate: Open when at least this fraction of the window's
            calls failed, in (0, 1].
        minimum_calls: Never open on fewer calls than this in the window.
        slow_call_duration: Seconds after which a call counts as slow;
            None turns slow-call tracking off.
        slow_call_rate: Open when at least this fraction of the window's
            calls were slow, in (0, 1].
        open_interval: Seconds an opened breaker rejects calls before it
            admits probes.
        open_interval_growth: Each time half-open probes fail and the
            breaker re-opens, the interval is multiplied by this (from 1 to
            1000; 1 keeps it constant). It goes back to *open_interval* on
            close.
        max_open_interval: Seconds; the interval never grows past this.
        half_open_probes: At most this many probes run at once while
            half-open, and this many successes in a row close the breaker.
        probe_timeout: Seconds; a probe still running after this counts as
            failed and re-opens the breaker, so a stuck probe cannot wedge
            it half-open. Its late outcome is ignored.
        failure_on: Which exceptions count as failures: exception classes
            or a predicate (a plain function: an ``async def`` one is
            refused). The default, `DependencyFailure()`, counts transport
            errors, timeouts (resilient's own `TimedOut` included), and
            HTTP status errors of 429 and 5xx; a 404 is the dependency
            answering. Other exceptions count as successes (the
            dependency answered). An `ExceptionGroup` that *failure_on*
            does not accept itself is a failure when every one of its
            leaves is. Cancellation, `KeyboardInterrupt` and `SystemExit`
            never count.
        ignore_on: Exceptions that count neither way, checked first.
        metrics_only: Count, change state and report as usual, but never
            reject a call: for rolling a breaker out and watching what it
            would do before it does it. A call the breaker would have
            rejected runs uncounted, and is reported as a rejection.

    Defaults start from the common rule "5 failures in 60 s open the
    breaker for 30 s, then 3 half-open test requests": a 60 s time window,
    at least 5 calls, half of them failing, 30 s open, 3 probes. At low
    traffic that is the rule as written; at high traffic a handful of
    errors among thousands of calls does not cut a dependency off.

    .. versionadded:: 26.11.0
    """

    window: CountWindow | TimeWindow = attrs.field(
        factory=TimeWindow, validator=_check_window
    )
    failure_rate: float = attrs.field(
        default=0.5, converter=_to_ratio, validator=_rate
    )
    minimum_calls: int = attrs.field(default=5, validator=positive_int)
    slow_call_duration: float | None = attrs.field(
        default=None, converter=to_seconds, validator=positive_or_none
    )
    slow_call_rate: float = attrs.field(
        default=1.0, converter=_to_ratio, validator=_rate
    )
    open_interval: float = attrs.field(
        default=30.0, converter=to_seconds, validator=positive
    )
    open_interval_growth: float = attrs.field(
        default=1.0, converter=_to_ratio, validator=_growth
    )
    max_open_interval: float = attrs.field(
        default=300.0, converter=to_seconds, validator=positive
    )
    half_open_probes: int = attrs.field(default=3, validator=positive_int)
    probe_timeout: float = attrs.field(
        default=10.0, converter=to_seconds, validator=positive
    )
    failure_on: tuple[type[Exception], ...] | Callable[[Exception], bool] = (
        attrs.field(
            factory=DependencyFailure,
            converter=to_exception_classes,
            validator=_check_failure_on,
        )
    )
    ignore_on: tuple[type[Exception], ...] = attrs.field(
        default=(), converter=to_exception_classes, validator=_check_ignore_on
    )
    metrics_only: bool = attrs.field(default=False, validator=_check_bool)

    def __attrs_post_init__(self) -> None:
        if self.max_open_interval < self.open_interval:
            raise ConfigError(
                "BreakerConfig.max_open_interval",
                self.max_open_interval,
                f"must be >= BreakerConfig.open_interval "
                f"({self.open_interval:g})",
            )
        window = self.window
        if isinstance(window, CountWindow) and window.size < (
            self.minimum_calls
        ):
            raise ConfigError(
                "BreakerConfig.minimum_calls",
                self.minimum_calls,
                f"must be <= the CountWindow size ({window.size}), "
                "or the breaker could never open",
            )

    def outcome(self, exc: BaseException) -> Outcome:
        """
        How *exc* counts, as an `Outcome`.

        A `BaseException` that is not an `Exception` (cancellation,
        `KeyboardInterrupt`, `SystemExit`) is always ignored. A *failure_on*
        predicate that raises is logged and its exception counts as a
        failure. An `ExceptionGroup` that *ignore_on* and *failure_on* do
        not name itself is a failure when every leaf (the exceptions in it
        and in its nested groups) is one, ignored when every leaf is
        ignored, and a success otherwise.
        """
        if not isinstance(exc, Exception) or isinstance(exc, self.ignore_on):
            return Outcome.IGNORE
        if self._fails(exc):
            return Outcome.FAILURE
        if isinstance(exc, ExceptionGroup):
            if every_leaf(exc, self._failed):
                return Outcome.FAILURE
            if every_leaf(exc, self._ignored):
                return Outcome.IGNORE
        return Outcome.SUCCESS

    def _fails(self, exc: Exception) -> bool:
        """Whether *failure_on* accepts *exc* itself."""
        test = self.failure_on
        if isinstance(test, tuple):
            return isinstance(exc, test)
        try:
            return bool(test(exc))
        except Exception:
            log.exception(
                "resilient: failure_on predicate %r raised; counted as a "
                "failure",
                test,
            )
            return True

    def _failed(self, leaf: BaseException) -> bool:
        return self.outcome(leaf) is Outcome.FAILURE

    def _ignored(self, leaf: BaseException) -> bool:
        return self.outcome(leaf) is Outcome.IGNORE

    def verdict(self, exc: BaseException) -> Verdict:
        """
        How *exc* counts: ``"failure"``, ``"success"`` or ``"ignore"``; the
        name of `outcome`.
        """
        return _VERDICT_NAMES[self.outcome(exc)]

    def evolve(self, **changes: Unpack[BreakerConfigChanges]) -> BreakerConfig:
        """
        A copy with *changes* applied and validated again.

        Example:
            >>> import resilient
            >>> resilient.BreakerConfig().evolve(open_interval=5).open_interval
            5.0
        """
        return attrs.evolve(self, **changes)


class BreakerConfigChanges(TypedDict, total=False):
    """The keyword arguments `BreakerConfig.evolve` takes, typed."""

    window: CountWindow | TimeWindow
    failure_rate: float
    minimum_calls: int
    slow_call_duration: float | dt.timedelta | None
    slow_call_rate: float
    open_interval: float | dt.timedelta
    open_interval_growth: float
    max_open_interval: float | dt.timedelta
    half_open_probes: int
    probe_timeout: float | dt.timedelta
    failure_on: FailureOn
    ignore_on: type[Exception] | tuple[type[Exception], ...]
    metrics_only: bool


__all__ = ["BreakerConfig", "CountWindow", "Outcome", "TimeWindow"]
