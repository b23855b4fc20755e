"""
Helpers shared by the breaker's test modules: a small configuration, the
machine fed by hand, and a body run through a breaker in any form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from resilient import BreakerConfig, BreakerState, CircuitBreaker, CountWindow
from resilient._breaker import (
    BreakerPermit,
    BreakerTransition,
    _BreakerMachine,
)
from tests.conftest import Driver


CLOSED = BreakerState.CLOSED
OPEN = BreakerState.OPEN
HALF_OPEN = BreakerState.HALF_OPEN
FORCED_OPEN = BreakerState.FORCED_OPEN


def small(**changes: Any) -> BreakerConfig:
    """A breaker that opens on 2 failures of the last 4 calls."""
    base: dict[str, Any] = {
        "window": CountWindow(4),
        "minimum_calls": 2,
        "open_interval": 10.0,
        "half_open_probes": 2,
        "probe_timeout": 5.0,
    }
    base.update(changes)
    return BreakerConfig(**base)


def machine(**changes: Any) -> _BreakerMachine:
    return _BreakerMachine(small(**changes), "m", owner=None)


def admit(m: _BreakerMachine, now: float) -> BreakerPermit:
    got = m.admit(now)
    assert isinstance(got, BreakerPermit), got
    return got


def settle(
    m: _BreakerMachine, p: BreakerPermit, outcome: int, now: float
) -> BreakerTransition | None:
    return m.record(p, outcome, now - p.start, now)


def call(
    m: _BreakerMachine, outcome: int, now: float, took: float = 0.0
) -> BreakerTransition | None:
    """Admit and settle one call ending at *now* after *took* seconds."""
    p = admit(m, now - took)
    return settle(m, p, outcome, now)


# The shells: one scenario, a body written once, run through a form.


def through(
    driver: Driver,
    cb: CircuitBreaker,
    body: Callable[[], Any],
    form: str = "decorator",
) -> Any:
    """Run *body* guarded by *cb*, as a decorator or a context manager."""
    if form == "decorator":
        return driver.call(cb, body)
    if not driver.is_async:
        with cb:
            return body()

    async def main() -> Any:
        async with cb:
            await anyio.lowlevel.checkpoint()
            return body()

    return anyio.run(main, backend=driver.kind)


def fail_with(exc: BaseException) -> Callable[[], Any]:
    def body() -> Any:
        raise exc

    return body


def ok() -> str:
    return "ok"


FORMS = pytest.mark.parametrize("form", ["decorator", "context"])
