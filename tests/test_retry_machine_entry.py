"""
The retry machine's entry points for a driver that knows its errors
answer as the general ones do: `RetryMachine.decide_transient()` decides
as `decide_error()` on a transient error without a hint, and
`RetryMachine.sibling()` makes the machine the constructor makes, on many
random policies, clocks, budgets and testing modes.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import resilient
from resilient import Policy
from resilient._core._backoff import exponential_ceiling
from resilient._retry import RetryMachine


class _Down(ConnectionError):
    """A transient error of a non-built-in type, with no hint."""


class _Clock:
    """A clock that moves by hand."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:  # pragma: no cover - unused
        self.t += seconds


class _Budget:
    """A retry budget that grants retries from a list, in turn."""

    def __init__(self, grants: list[bool]) -> None:
        self.grants = list(grants)
        self.asked = 0

    def try_acquire_retry(self) -> bool:
        self.asked += 1
        return self.grants.pop(0) if self.grants else True


def _broken(retry: int) -> float:
    """A Custom backoff that raises, then returns nonsense, then waits."""
    if retry % 3 == 0:
        raise RuntimeError("broken backoff")
    return math.nan if retry % 3 == 1 else 0.25


_BACKOFFS = st.sampled_from(
    [
        resilient.FullJitter(base=0.1, cap=2.0),
        resilient.FullJitter(base=1e-300, cap=1e300),
        resilient.FullJitter(base=1e-300, cap=1e-299),
        resilient.EqualJitter(base=0.2, cap=5.0),
        resilient.DecorrelatedJitter(base=0.2, cap=5.0),
        resilient.Exponential(base=0.5, cap=4.0),
        resilient.Constant(0.0),
        resilient.Custom(_broken),
    ]
)


def _state(machine: RetryMachine) -> dict[str, Any]:
    return {name: getattr(machine, name) for name in RetryMachine.__slots__}


# A twin's own objects (compared by what they did, not by identity).
_OWN = frozenset({"admission_wait", "clock", "_now", "retry_budget", "rng"})


def _same(
    a: dict[str, Any], b: dict[str, Any], skip: frozenset[str] = frozenset()
) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        other = b[name]
        if name in skip:
            continue
        if isinstance(value, float) and math.isnan(value):
            assert isinstance(other, float), name
            assert math.isnan(other), name
        else:
            assert value == other, name


@settings(max_examples=300, deadline=None)
@given(
    backoff=_BACKOFFS,
    attempts=st.one_of(st.none(), st.integers(1, 8)),
    budget=st.one_of(st.none(), st.floats(0.5, 20.0)),
    start=st.floats(0.0, 1e6),
    steps=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=10),
    grants=st.lists(st.booleans(), max_size=10),
    waits=st.one_of(st.none(), st.lists(st.floats(0.0, 2.0), max_size=10)),
    testing=st.sampled_from([None, 0, 3]),
    seed=st.integers(0, 2**32),
    given_now=st.booleans(),
)
def test_decide_transient_decides_as_decide_error(
    backoff: Any,
    attempts: int | None,
    budget: float | None,
    start: float,
    steps: list[float],
    grants: list[bool],
    waits: list[float] | None,
    testing: int | None,
    seed: int,
    given_now: bool,
) -> None:
    """decide_transient() and decide_error() on a transient error without
    a hint, driven in lockstep on twin machines, give the same answers and
    leave the same state, rng and retry budget, whatever the backoff
    (broken ones too), attempts, budget, admission waits and testing mode,
    and whether decide_transient reads the clock or is given its time."""
    assume(attempts is not None or budget is not None)
    policy = Policy(
        retry_on=ConnectionError,
        retry_after=None,
        attempts=attempts,
        budget=budget,
        backoff=backoff,
    )
    machines = []
    for _ in range(2):
        left = list(waits) if waits is not None else None
        admission = (
            None
            if left is None
            else (lambda left=left: left.pop(0) if left else 0.0)
        )
        with resilient.testing.set_testing(
            testing is not None, attempts=testing or None
        ):
            machine = RetryMachine(
                policy,
                _Clock(start),
                random.Random(seed),
                start,
                retry_budget=_Budget(grants),
                admission_wait=admission,
            )
        machines.append(machine)
    fast, general = machines
    error = _Down("down")
    for step in steps:
        now = fast.clock.t if given_now else None  # type: ignore[attr-defined]
        answers = [fast.decide_transient(now), general.decide_error(error)]
        assert answers[0] == answers[1] or all(
            isinstance(a, float) and math.isnan(a) for a in answers
        )
        _same(_state(fast), _state(general), _OWN)
        assert fast.rng.getstate() == general.rng.getstate()
        assert fast.retry_budget.asked == general.retry_budget.asked  # type: ignore[union-attr]
        if isinstance(answers[0], str):
            break
        for machine in machines:
            machine.clock.t += step  # type: ignore[attr-defined]


def test_decide_transient_logs_a_broken_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A backoff that raises gives up with "backoff_error" and is logged
    once, as the general path does (the backoff is not asked twice)."""
    calls = []

    def fn(retry: int) -> float:
        calls.append(retry)
        raise RuntimeError("broken")

    policy = Policy(
        retry_on=ConnectionError,
        retry_after=None,
        backoff=resilient.Custom(fn),
    )
    machine = RetryMachine(policy, _Clock(0.0), random.Random(0), 0.0)
    with caplog.at_level(logging.ERROR, logger="resilient"):
        assert machine.decide_transient() == "backoff_error"
    assert calls == [0]
    assert len(caplog.records) == 1


@settings(max_examples=300, deadline=None)
@given(
    attempts=st.one_of(st.none(), st.integers(1, 8)),
    budget=st.one_of(st.none(), st.floats(1e-9, 1e9)),
    start=st.one_of(st.floats(0.0, 1e9), st.just(math.inf)),
    made_testing=st.sampled_from([None, 0, 3]),
    now_testing=st.sampled_from([None, 0, 2]),
    with_budget=st.booleans(),
    with_wait=st.booleans(),
)
def test_sibling_is_the_machine_the_constructor_makes(
    attempts: int | None,
    budget: float | None,
    start: float,
    made_testing: int | None,
    now_testing: int | None,
    with_budget: bool,
    with_wait: bool,
) -> None:
    """template.sibling(start) has every field the constructor gives a
    machine for the same policy, clock, rng, retry budget and admission
    wait at *start*, whatever testing mode the template and the sibling
    were made in."""
    assume(attempts is not None or budget is not None)
    policy = Policy(attempts=attempts, budget=budget)
    clock, rng = _Clock(0.0), random.Random(0)
    retry_budget = _Budget([]) if with_budget else None

    def wait() -> float:  # pragma: no cover - never called
        return 0.0

    admission = wait if with_wait else None
    with resilient.testing.set_testing(
        made_testing is not None, attempts=made_testing or None
    ):
        template = RetryMachine(
            policy,
            clock,
            rng,
            12.0,
            retry_budget=retry_budget,
            admission_wait=admission,
        )
    with resilient.testing.set_testing(
        now_testing is not None, attempts=now_testing or None
    ):
        made = template.sibling(start)
        expected = RetryMachine(
            policy,
            clock,
            rng,
            start,
            retry_budget=retry_budget,
            admission_wait=admission,
        )
    assert type(made) is RetryMachine
    _same(_state(made), _state(expected))
    assert made.retry_budget is retry_budget
    assert made.admission_wait is admission


@settings(max_examples=500, deadline=None)
@given(
    base=st.floats(1e-300, 10.0),
    spread=st.floats(1.0, 1e300),
    retry=st.one_of(st.integers(0, 3000), st.just(10**6)),
    seed=st.integers(0, 2**32),
)
def test_full_jitter_is_its_window_times_a_draw(
    base: float, spread: float, retry: int, seed: int
) -> None:
    """FullJitter.delay(), with the ceiling inline, is
    exponential_ceiling(base, cap, retry) times one draw, for any retry
    number (past overflow and the always-capped bound too)."""
    cap = min(base * spread, 1e300)
    cap = max(cap, base)
    backoff = resilient.FullJitter(base=base, cap=cap)
    a, b = random.Random(seed), random.Random(seed)
    assert backoff.delay(retry, 0.0, a) == (
        exponential_ceiling(base, cap, retry) * b.random()
    )
    assert a.getstate() == b.getstate()
