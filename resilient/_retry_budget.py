"""
Retry budget: a share of each dependency's traffic that retries may use,
shared by every caller in the process.

A sliding window of calls and retries (Finagle's ``RetryBudget``, tower's
``TpsBudget``): a retry is allowed while the retries already allowed in the
window stay within ``ratio * calls + min_per_second * window``. In an outage
every call fails, retries soon hit that line, and the load on the
dependency stays near its normal traffic instead of multiplying by the
number of attempts.

`RetryBudgetMachine` is the window with time passed in (pure bookkeeping,
no lock, no clock); `RetryBudget` is its shell for the process: a short
lock, the clock seam, the refusal metric. It never waits, so sync and async
code share it as is.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Final, Unpack, final

import attrs

from resilient._core import _clock
from resilient._core._config_retry_budget import (
    RetryBudgetConfig,
    RetryBudgetKnobs,
)
from resilient._core._registry import Registry
from resilient._core._shown import shown
from resilient._core._telemetry import instruments
from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Meter

    from resilient.typing import Clock


# The window is kept as this many buckets: calls and retries leave the
# window one bucket (window / 20 seconds) at a time.
BUCKETS: Final = 20

# Absorbs float error in ``ratio * calls`` (0.1 * 3 > 0.3).
_EPSILON: Final = 1e-9


@final
@attrs.frozen
class RetryBudgetStatistics:
    """
    A consistent snapshot of one retry budget, taken under its lock.

    Attributes:
        name: The dependency's name.
        calls: Calls recorded within the window.
        retries: Retries allowed within the window.
        available: Retries that would be allowed now.
        total_calls: Calls recorded since the budget was made.
        total_retries: Retries allowed since then.
        refused: Retries refused since then.
    """

    name: str
    calls: int
    retries: int
    available: int
    total_calls: int
    total_retries: int
    refused: int


@final
class RetryBudgetMachine:
    """
    The sliding window of one retry budget, with time passed in: pure
    bookkeeping, no lock, no clock. `RetryBudget` wraps it for the process;
    a simulator can drive one directly in its own virtual time::

        m = RetryBudgetMachine(RetryBudgetConfig(), now=0.0)
        m.record_call(now=0.5)
        allowed = m.try_acquire_retry(now=0.7)

    Not thread-safe on its own. Every method leaves the window consistent
    wherever an asynchronous exception lands (each bucket is cleared together
    with its share of the totals, and the window moves last), so a shell
    that calls it under a lock needs nothing more.

    Args:
        config: The budget's configuration.
        now: The time on the caller's clock, in seconds.

    .. versionadded:: 26.12.0
    """

    __slots__ = (
        "_calls",
        "_head",
        "_hi",
        "_index",
        "_lo",
        "_ratio",
        "_reserve",
        "_retries",
        "_width",
        "_window_calls",
        "_window_retries",
        "config",
        "refused",
        "total_calls",
        "total_retries",
    )

    def __init__(self, config: RetryBudgetConfig, now: float) -> None:
        self.config = config
        self._ratio = config.ratio
        self._reserve = config.min_per_second * config.window + _EPSILON
        self._width = config.window / BUCKETS
        self._calls = [0] * BUCKETS
        self._retries = [0] * BUCKETS
        self._window_calls = 0
        self._window_retries = 0
        self._move_to(math.floor(now / self._width))
        self.total_calls = 0
        self.total_retries = 0
        self.refused = 0

    def _advance(self, now: float) -> int:
        """Drop the buckets that left the window; the current index."""
        if self._lo <= now < self._hi:
            return self._index
        slot = math.floor(now / self._width)
        gap = slot - self._head
        if gap < 0:
            if gap > -BUCKETS:
                # A thread that read the clock a moment late: count it now.
                return self._index
            # A monotonic clock never goes that far back: it was swapped
            # (a test's FakeClock), so start afresh.
            gap = BUCKETS
        if gap >= BUCKETS:
            self._calls = [0] * BUCKETS
            self._retries = [0] * BUCKETS
            self._window_calls = self._window_retries = 0
        else:
            calls, retries = self._calls, self._retries
            for step in range(1, gap + 1):
                i = (self._head + step) % BUCKETS
                # One bucket and its share of the totals together: cut off
                # here, the next call clears the same buckets again.
                self._window_calls -= calls[i]
                self._window_retries -= retries[i]
                calls[i] = retries[i] = 0
        self._move_to(slot)
        return self._index

    def _move_to(self, slot: int) -> None:
        index = slot % BUCKETS
        lo = slot * self._width
        hi = lo + self._width
        self._head, self._index, self._lo, self._hi = slot, index, lo, hi

    def available(self, now: float) -> int:
        """Retries that would be allowed at *now*."""
        self._advance(now)
        allowance = self._ratio * self._window_calls + self._reserve
        return max(0, math.floor(allowance) - self._window_retries)

    def record_call(self, now: float) -> None:
        """Count one logical call (its first attempt, not its retries)."""
        i = self._advance(now)
        self._calls[i] += 1
        self._window_calls += 1
        self.total_calls += 1

    def try_acquire_retry(self, now: float) -> bool:
        """
        Spend one retry at *now* if the budget allows it.

        Returns:
            True if the retry may go ahead (it is counted); False if it
            would exceed the budget (nothing is counted but the refusal).
        """
        if self.available(now) >= 1:
            i = self._index
            self._retries[i] += 1
            self._window_retries += 1
            self.total_retries += 1
            return True
        self.refused += 1
        return False

    def statistics(self, name: str, now: float) -> RetryBudgetStatistics:
        """A snapshot of the window at *now* and of the totals."""
        available = self.available(now)
        return RetryBudgetStatistics(
            name=name,
            calls=self._window_calls,
            retries=self._window_retries,
            available=available,
            total_calls=self.total_calls,
            total_retries=self.total_retries,
            refused=self.refused,
        )

    def is_unused(self) -> bool:
        """Whether it has counted nothing yet."""
        return not (self.total_calls or self.total_retries or self.refused)


@final
class RetryBudget:
    """
    The retry budget of one dependency, shared by every caller in the
    process. Get one with `resilient.retry_budget`.

    Retry calls `record_call` once per logical call (on its first attempt)
    and `try_acquire_retry` before every retry; when it returns False, the
    retry is refused and the last error re-raised.

    A thin shell around a `RetryBudgetMachine`: a short lock, the clock,
    and the refusal metric. Reads time through the clock seam (so a
    `FakeClock` moves the window in tests), or from *clock* when given.

    Args:
        name: The dependency's name.
        config: The budget's configuration.
        clock: The clock to read instead of the process's clock seam (a
            simulator's virtual clock).

    .. versionadded:: 26.11.0
    .. versionchanged:: 26.12.0 The *clock* argument.
    """

    __slots__ = ("__weakref__", "_clock", "_lock", "_m", "name")

    def __init__(
        self,
        name: str,
        config: RetryBudgetConfig,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._m = RetryBudgetMachine(config, self._now())

    @property
    def config(self) -> RetryBudgetConfig:
        """The configuration."""
        return self._m.config

    def _now(self) -> float:
        clock = self._clock
        return (clock if clock is not None else _clock.get_clock()).now()

    def record_call(self) -> None:
        """Count one logical call (its first attempt, not its retries)."""
        now = self._now()
        with self._lock:
            self._m.record_call(now)

    def try_acquire_retry(self) -> bool:
        """
        Spend one retry if the budget allows it.

        Returns:
            True if the retry may go ahead (it is counted); False if it
            would exceed the budget (nothing is counted but the refusal).
        """
        now = self._now()
        with self._lock:
            allowed = self._m.try_acquire_retry(now)
        if not allowed:
            _refused(self.name)
        return allowed

    def statistics(self) -> RetryBudgetStatistics:
        """A consistent snapshot of the window and the totals."""
        now = self._now()
        with self._lock:
            return self._m.statistics(self.name, now)

    def refusal_note(self) -> str:
        """
        What to add to the re-raised error when a retry was refused.
        """
        s = self.statistics()
        c = self.config
        return (
            f"retry refused by the retry budget of {self.name!r}: "
            f"{s.retries} retries for {s.calls} calls in the last "
            f"{c.window:g} s (allowed: {c.ratio:g} per call "
            f"+ {c.min_per_second:g} per second)"
        )

    def _reset(self) -> None:
        """A fresh window and totals (`reset_registries`)."""
        now = self._now()
        with self._lock:
            self._m = RetryBudgetMachine(self._m.config, now)

    def _adopt(self, config: RetryBudgetConfig) -> bool:
        """Take *config* if nothing was counted yet (a provisional one)."""
        now = self._now()
        with self._lock:
            if not self._m.is_unused():
                return False
            self._m = RetryBudgetMachine(config, now)
            return True

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<RetryBudget {shown(self.name)!r}: {s.retries} retries for "
            f"{s.calls} calls, {s.available} available>"
        )


def _check_config(config: object) -> RetryBudgetConfig | None:
    if config is not None and not isinstance(config, RetryBudgetConfig):
        raise ConfigTypeError(
            "retry_budget(config)",
            config,
            "must be a RetryBudgetConfig or None",
        )
    return config


RETRY_BUDGETS: Final[Registry[RetryBudget, RetryBudgetConfig]] = Registry(
    "retry_budget",
    RetryBudget,
    RetryBudgetConfig,
    config_of=lambda b: b.config,
    adopt=lambda b, c: b._adopt(c),  # noqa: SLF001
    reset=lambda b: b._reset(),  # noqa: SLF001
)


def retry_budget(
    name: str,
    config: RetryBudgetConfig | None = None,
    **knobs: Unpack[RetryBudgetKnobs],
) -> RetryBudget:
    """
    The process-wide retry budget of the dependency called *name*.

    Made with *config* (or the keywords of `RetryBudgetConfig`, or the
    defaults) on first use; later calls get the same object, for as long
    as anything holds it. A lookup without a configuration does not fix
    it: the first explicit one is taken while nothing was counted.

    Raises:
        TypeError: Both *config* and keywords are given.
        ConfigError: A bad value, or a configuration that differs from the
            existing budget's.

    .. versionadded:: 26.11.0
    """
    if knobs:
        if config is not None:
            raise TypeError(
                "retry_budget() takes a config or keywords, not both"
            )
        config = RetryBudgetConfig(**knobs)
    return RETRY_BUDGETS.get(name, _check_config(config))


def _refusals(meter: Meter) -> Counter:
    return meter.create_counter(
        "resilient.retry_budget.refused",
        unit="{retry}",
        description="Retries a retry budget refused.",
    )


def _refused(name: str) -> None:
    """Count a refusal, when a meter provider is configured."""
    counter = instruments("retry_budget", _refusals)
    if counter is not None:
        counter.add(1, {"resilient.policy": name})


get_retry_budget: Final = retry_budget
"""The registry lookup, under the name the pipeline uses."""
