"""
Helpers for the test suites of code that uses resilient.

- `set_testing`: no waits (and optionally fewer attempts), also as a context
  manager;
- `FakeClock` and `use_clock`: virtual time, sync and async;
- `seed`: reproducible jitter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from resilient._core import _clock, _state
from resilient._core._clock import FakeClock
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from types import TracebackType

    from resilient.typing import Clock


__all__ = [
    "FakeClock",
    "is_testing",
    "reset_registries",
    "seed",
    "set_testing",
    "use_clock",
]


@final
class _Restore:
    """Undoes a switch on ``__exit__``; does nothing if never entered."""

    __slots__ = ("_undo",)

    def __init__(self, undo: object) -> None:
        self._undo = undo

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._undo()  # type: ignore[operator]


def set_testing(testing: bool, *, attempts: int | None = None) -> _Restore:
    """
    Turn testing mode on or off for the whole process.

    While on, every retry waits zero seconds, and with *attempts* no call
    makes more than that many attempts. Also a context manager that restores
    the previous mode on exit::

        with resilient.testing.set_testing(True, attempts=1):
            ...

    Args:
        testing: On or off.
        attempts: Cap on attempts per call while on; None keeps each
            policy's own.

    .. versionadded:: 26.11.0
    """
    if not isinstance(testing, bool):
        raise ConfigTypeError(
            "set_testing(testing)", testing, "must be a bool"
        )
    if attempts is not None and (
        isinstance(attempts, bool) or not isinstance(attempts, int)
    ):
        raise ConfigTypeError(
            "set_testing(attempts)", attempts, "must be an int or None"
        )
    if attempts is not None and attempts < 1:
        raise ConfigError("set_testing(attempts)", attempts, "must be >= 1")
    previous = _state.testing
    _state.testing = _state.TestingMode(active=testing, attempts=attempts)

    def undo() -> None:
        _state.testing = previous

    return _Restore(undo)


def is_testing() -> bool:
    """
    Whether testing mode is on.
    """
    return _state.testing.active


def seed(value: int | None) -> _Restore:
    """
    Seed the jitter so retry schedules repeat exactly; also a context
    manager that restores the previous random state on exit.

    Args:
        value: The seed; None re-seeds from the operating system.

    .. versionadded:: 26.11.0
    """
    saved = _state.rng.getstate()
    _state.rng.seed(value)

    def undo() -> None:
        _state.rng.setstate(saved)

    return _Restore(undo)


def use_clock(clock: Clock) -> _Restore:
    """
    Make every primitive read and wait on *clock*; also a context manager
    that puts the previous clock back on exit::

        clock = FakeClock()
        with use_clock(clock):
            ...  # retries sleep in virtual time

    .. versionadded:: 26.11.0
    """
    previous = _clock.set_clock(clock)

    def undo() -> None:
        _clock.set_clock(previous)

    return _Restore(undo)


def reset_registries() -> None:
    """
    Forget every circuit breaker, bulkhead and retry budget made so far.

    Their state is process-wide by design (one breaker per dependency), so a
    test that opens a breaker would otherwise leave it open for the next
    one. Call it between tests, e.g. from an autouse fixture::

        @pytest.fixture(autouse=True)
        def _fresh_resilient_state():
            yield
            resilient.testing.reset_registries()

    Objects already handed out keep working; the next lookup of a name
    makes a new one.

    .. versionadded:: 26.11.0
    """
    from resilient._bulkhead import BULKHEADS  # noqa: PLC0415
    from resilient._core._registry import reset_all  # noqa: PLC0415
    from resilient._retry_budget import RETRY_BUDGETS  # noqa: PLC0415

    BULKHEADS.clear()
    RETRY_BUDGETS.clear()
    reset_all()


FakeClock.__module__ = "resilient.testing"
