"""
`resilient.testing`: the testing switch, seeded jitter and clock swapping,
each usable as a plain call and as a context manager that restores.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

import resilient
import resilient.testing
from resilient._core import _state
from resilient._core._clock import get_clock, set_clock
from resilient.testing import (
    FakeClock,
    is_testing,
    seed,
    set_testing,
    use_clock,
)


@pytest.fixture(autouse=True)
def _restore_switches() -> Iterator[None]:
    """Whatever a test does, the process-wide switches are put back."""
    mode = _state.testing
    rng_state = _state.rng.getstate()
    clock = get_clock()
    yield
    _state.testing = mode
    _state.rng.setstate(rng_state)
    set_clock(clock)


def mode() -> tuple[bool, int | None]:
    """The testing mode in force, read afresh."""
    return _state.testing.active, _state.testing.attempts


def always_fails(calls: list[int]) -> Any:
    """A body that counts its calls and always fails transiently."""

    def body() -> None:
        calls.append(1)
        raise ConnectionError("down")

    return body


def test_public_names() -> None:
    """The module exports exactly its documented helpers."""
    assert sorted(resilient.testing.__all__) == [
        "FakeClock",
        "is_testing",
        "reset_registries",
        "seed",
        "set_testing",
        "use_clock",
    ]
    for name in resilient.testing.__all__:
        assert hasattr(resilient.testing, name)


# --- set_testing


def test_off_by_default() -> None:
    """Testing mode is off unless switched on."""
    assert not is_testing()
    assert _state.testing == _state.TestingMode(active=False, attempts=None)


def test_set_testing_as_a_call() -> None:
    """Called plainly, `set_testing` switches the mode until changed."""
    set_testing(True, attempts=2)
    assert is_testing()
    assert _state.testing.attempts == 2
    set_testing(False)
    assert not is_testing()
    assert _state.testing.attempts is None


def test_set_testing_as_a_context_manager() -> None:
    """As a context manager it restores the previous mode, nesting."""
    with set_testing(True, attempts=3):
        assert mode() == (True, 3)
        with set_testing(False):
            assert mode() == (False, None)
        assert mode() == (True, 3)
        with set_testing(True):
            assert mode() == (True, None)
        assert mode() == (True, 3)
    assert mode() == (False, None)


def test_set_testing_restores_after_an_exception() -> None:
    """Leaving by an exception restores the previous mode too."""
    with pytest.raises(KeyError), set_testing(True):
        raise KeyError
    assert not is_testing()


def test_set_testing_restores_what_was_before_the_call() -> None:
    """
    The mode restored is the one in force when `set_testing` was called,
    not when the block was entered.
    """
    restore = set_testing(True, attempts=1)
    set_testing(True, attempts=5)
    with restore:
        pass
    assert not is_testing()


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "error"),
    [
        ((1,), {}, "set_testing(testing)", resilient.ConfigTypeError),
        (("yes",), {}, "set_testing(testing)", resilient.ConfigTypeError),
        ((None,), {}, "set_testing(testing)", resilient.ConfigTypeError),
        (
            (True,),
            {"attempts": True},
            "set_testing(attempts)",
            resilient.ConfigTypeError,
        ),
        (
            (True,),
            {"attempts": 1.5},
            "set_testing(attempts)",
            resilient.ConfigTypeError,
        ),
        (
            (True,),
            {"attempts": "2"},
            "set_testing(attempts)",
            resilient.ConfigTypeError,
        ),
        (
            (True,),
            {"attempts": 0},
            "set_testing(attempts)",
            resilient.ConfigError,
        ),
        (
            (True,),
            {"attempts": -1},
            "set_testing(attempts)",
            resilient.ConfigError,
        ),
    ],
)
def test_set_testing_refuses_bad_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    field: str,
    error: type[resilient.ConfigError],
) -> None:
    """Bad arguments raise, naming the argument, and change nothing."""
    with pytest.raises(error) as info:
        set_testing(*args, **kwargs)
    assert type(info.value) is error
    assert info.value.field == field
    assert not is_testing()


def test_set_testing_turns_off_waits_and_caps_attempts(
    driver: Any, clock: FakeClock
) -> None:
    """
    In testing mode a retrying call waits zero seconds and makes no more
    than the capped number of attempts, in sync and async code alike.
    """
    policy = resilient.Policy(name="t", attempts=5)
    calls: list[int] = []
    with set_testing(True, attempts=2), pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), always_fails(calls))
    assert len(calls) == 2
    assert clock.now() == 1000.0
    assert all(s == 0 for s in clock.sleeps)

    # Without a cap the policy's own attempts apply, still without waits.
    calls.clear()
    with set_testing(True), pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), always_fails(calls))
    assert len(calls) == 5
    assert clock.now() == 1000.0

    # Switched off again: the policy waits as it says.
    calls.clear()
    with pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), always_fails(calls))
    assert len(calls) == 5
    assert clock.now() > 1000.0


# --- seed


def test_seed_makes_the_retry_schedule_reproducible(
    driver: Any, clock: FakeClock
) -> None:
    """
    After ``seed(s)`` a retrying call sleeps exactly
    ``schedule(policy.backoff, n, seed=s)``, sync and async.
    """
    policy = resilient.Policy(
        name="seeded",
        attempts=6,
        budget=None,
        backoff=resilient.FullJitter(base=1.0, cap=8.0),
    )
    runs = []
    for _ in range(2):
        sleeps_before = len(clock.sleeps)
        with seed(1234), pytest.raises(ConnectionError):
            driver.call(resilient.retry(policy), always_fails([]))
        runs.append(clock.sleeps[sleeps_before:])
    expected = list(resilient.schedule(policy.backoff, 5, seed=1234))
    assert runs == [expected, expected]


def test_seed_restores_the_random_state() -> None:
    """As a context manager `seed` puts the jitter's state back."""
    before = _state.rng.getstate()
    with seed(7):
        assert _state.rng.random() == random.Random(7).random()
    assert _state.rng.getstate() == before


def test_seed_as_a_call_persists() -> None:
    """Called plainly, the seed stays in force."""
    seed(99)
    reference = random.Random(99)
    assert [_state.rng.random() for _ in range(3)] == [
        reference.random() for _ in range(3)
    ]


def test_seed_none_reseeds_from_the_system() -> None:
    """``seed(None)`` draws a fresh state, and restores the old one."""
    before = _state.rng.getstate()
    with seed(None):
        assert _state.rng.getstate() != before
    assert _state.rng.getstate() == before


# --- use_clock


def test_use_clock_as_a_context_manager() -> None:
    """`use_clock` installs a clock and puts the previous one back."""
    original = get_clock()
    outer, inner = FakeClock(start=1.0), FakeClock(start=2.0)
    with use_clock(outer):
        assert get_clock() is outer
        with use_clock(inner):
            assert get_clock() is inner
            with resilient.deadline(3) as d:
                assert d.at == 5.0
        assert get_clock() is outer
    assert get_clock() is original


def test_use_clock_restores_after_an_exception() -> None:
    """Leaving by an exception restores the clock too."""
    original = get_clock()
    with pytest.raises(KeyError), use_clock(FakeClock()):
        raise KeyError
    assert get_clock() is original


def test_use_clock_as_a_call() -> None:
    """Called plainly, the clock stays installed until restored."""
    original = get_clock()
    fake = FakeClock()
    restore = use_clock(fake)
    assert get_clock() is fake
    with restore:
        assert get_clock() is fake
    assert get_clock() is original


def test_retries_sleep_on_the_installed_clock(driver: Any) -> None:
    """
    Retries wait on the clock `use_clock` installs, in virtual time: the
    call takes no real time and the fake clock moves by the waits.
    """
    fake = FakeClock(start=0.0)
    policy = resilient.Policy(
        name="virtual",
        attempts=3,
        backoff=resilient.Constant(seconds=10.0),
        budget=None,
    )
    with use_clock(fake), pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), always_fails([]))
    assert fake.sleeps == [10.0, 10.0]
    assert fake.now() == 20.0


def test_reset_registries_forgets_shared_state() -> None:
    """After reset_registries, a name gets a fresh bulkhead and retry
    budget, and its breaker is reset in place (a holder and the name agree);
    objects handed out before keep working."""
    cb = resilient.breaker("reset-me")
    cb.force_open()
    bh = resilient.bulkhead("reset-me")
    rb = resilient.retry_budget("reset-me")
    resilient.testing.reset_registries()
    assert cb.state.value == "closed"
    assert resilient.breaker("reset-me") is cb
    assert resilient.bulkhead("reset-me") is not bh
    assert resilient.retry_budget("reset-me") is not rb
