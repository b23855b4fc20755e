"""
`Policy(wait_for_breaker=...)` (issue 15, section 6, item 4): whether a call
sits out an open breaker. A policy with a fallback fails fast by default
(its fallback answers at once: on 4f15275 each call waited out the open
interval first); one without waits, as before; either is a choice the
option makes explicit. Sync, asyncio and trio, on a fake clock.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import pytest

import resilient
from resilient import Constant, Policy
from resilient._core._config_breaker import BreakerConfig, CountWindow
from resilient.exceptions import CircuitOpen, ConfigTypeError


if TYPE_CHECKING:
    from resilient.testing import FakeClock
    from tests.conftest import Driver

_names = itertools.count()
_OPEN = 5.0


def _policy(**kw: Any) -> Policy:
    base: dict[str, Any] = {
        "name": f"wfb-{next(_names)}",
        "attempts": 3,
        "budget": 30.0,
        "backoff": Constant(0.1),
        "breaker": BreakerConfig(
            window=CountWindow(size=2),
            minimum_calls=2,
            failure_rate=1.0,
            open_interval=_OPEN,
            half_open_probes=1,
        ),
    }
    return Policy(**{**base, **kw})


def _trip(driver: Driver, policy: Policy) -> None:
    """Two failed calls (no retries) open the breaker."""
    tripper = Policy(name=policy.name, attempts=1, breaker=policy.breaker)

    def fail() -> None:
        raise ConnectionError

    for _ in range(2):
        with pytest.raises(ConnectionError):
            driver.call(tripper, fail)
    assert resilient.breaker(policy.name).state.name == "OPEN"


def _fallback(exc: Exception) -> str:
    return f"fallback: {type(exc).__name__}"


def test_fallback_answers_at_once_while_the_breaker_is_open(
    driver: Driver, clock: FakeClock
) -> None:
    """A call refused by an open breaker goes to the fallback at once: no
    time passes, the function is not called."""
    policy = _policy(fallback=_fallback)
    _trip(driver, policy)
    calls: list[int] = []
    start = clock.now()
    assert driver.call(policy, lambda: calls.append(1)) == (
        "fallback: CircuitOpen"
    )
    assert clock.now() == start
    assert calls == []


def test_retry_does_not_wait_for_a_breaker_the_call_opened(
    driver: Driver, clock: FakeClock
) -> None:
    """A call whose failures open the breaker does not wait for it to half
    open before its next attempt: it falls back at once."""
    policy = _policy(fallback=_fallback)
    calls: list[int] = []

    def fail() -> None:
        calls.append(1)
        raise ConnectionError

    start = clock.now()
    assert driver.call(policy, fail) == "fallback: CircuitOpen"
    assert calls == [1, 1]
    assert clock.now() - start < _OPEN


@pytest.mark.parametrize("fallback", [None, _fallback], ids=["none", "fb"])
def test_waiting_is_kept_when_chosen(
    driver: Driver, clock: FakeClock, fallback: Any
) -> None:
    """``wait_for_breaker=True`` (and no fallback, by default) sits out
    the open interval and then probes: the call succeeds."""
    kw: dict[str, Any] = {"fallback": fallback}
    if fallback is not None:
        kw["wait_for_breaker"] = True
    policy = _policy(**kw)
    _trip(driver, policy)
    start = clock.now()
    assert driver.call(policy, lambda: "live") == "live"
    assert clock.now() - start >= _OPEN


def test_failing_fast_without_a_fallback(
    driver: Driver, clock: FakeClock
) -> None:
    """``wait_for_breaker=False`` without a fallback raises `CircuitOpen`
    at once."""
    policy = _policy(wait_for_breaker=False)
    _trip(driver, policy)
    start = clock.now()
    with pytest.raises(CircuitOpen):
        driver.call(policy, lambda: "live")
    assert clock.now() == start


def test_wait_for_breaker_is_checked() -> None:
    """Anything but True, False or None is refused, naming the field."""
    with pytest.raises(ConfigTypeError, match=r"Policy\.wait_for_breaker"):
        _policy(wait_for_breaker="yes")
    assert _policy().wait_for_breaker is None
    assert "wait_for_breaker" not in repr(_policy())
    assert "wait_for_breaker=True" in repr(_policy(wait_for_breaker=True))
