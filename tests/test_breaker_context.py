"""
The breaker's context managers and its admission interface: each ``with``
block settles its own permit, however it is entered, and a block whose exit
never ran leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
from typing import Any

import pytest

import resilient
from resilient import BreakerConfig, BreakerState, CountWindow
from resilient._core._config_breaker import Outcome


def _half_open(
    clock: Any, name: str, probes: int = 2
) -> resilient.CircuitBreaker:
    cb = resilient.breaker(
        name,
        BreakerConfig(
            window=CountWindow(2),
            minimum_calls=2,
            open_interval=1,
            half_open_probes=probes,
        ),
    )
    for _ in range(2):
        cb.acquire().failure(ConnectionError())
    clock.advance(1)
    return cb


def test_exit_stack_settles_its_permit(clock: Any) -> None:
    """`contextlib.ExitStack` looks the exit up on the class: it works."""
    cb = _half_open(clock, "stack")
    with contextlib.ExitStack() as stack:
        permit = stack.enter_context(cb)
        assert permit.probe
        assert cb.statistics().probes_in_flight == 1
    assert cb.statistics().probes_in_flight == 0


@pytest.mark.anyio
async def test_async_exit_stack_settles_its_permit() -> None:
    """`contextlib.AsyncExitStack` works the same way."""
    cb = resilient.breaker("astack")
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(cb)
    assert cb.statistics().calls == 1


def test_entered_by_hand(clock: Any) -> None:
    """
    ``__enter__``/``__exit__`` called by hand pair up innermost first, even
    after ``__exit__`` was looked up and dropped in between.
    """
    cb = _half_open(clock, "hand")
    assert hasattr(cb, "__exit__")
    outer = cb.__enter__()
    inner = cb.__enter__()
    assert (outer.probe, inner.probe) == (1, 2)
    cb.__exit__(ConnectionError, ConnectionError(), None)
    assert repr(inner).endswith("settled>")
    assert repr(outer).endswith("open>")
    cb.__exit__(None, None, None)
    assert cb.state is BreakerState.OPEN
    with pytest.raises(RuntimeError, match="exited more often"):
        cb.__exit__(None, None, None)


def test_hand_exits_skip_other_breakers(clock: Any) -> None:
    """An exit by hand finds its own breaker's permit under another's."""
    a, b = resilient.breaker("a"), resilient.breaker("b")
    pa = a.__enter__()
    pb = b.__enter__()
    a.__exit__(None, None, None)
    assert repr(pa).endswith("settled>")
    assert repr(pb).endswith("open>")
    b.__exit__(None, None, None)
    assert a.statistics().calls == b.statistics().calls == 1


def test_nested_blocks_settle_their_own(clock: Any) -> None:
    """Nested blocks of one breaker each settle their own permit."""
    cb = _half_open(clock, "nested")
    with cb as outer:
        with pytest.raises(ConnectionError), cb as inner:
            raise ConnectionError
        assert repr(inner).endswith("settled>")
        assert repr(outer).endswith("open>")
    assert cb.state is BreakerState.OPEN


def test_a_block_whose_exit_never_ran_leaves_nothing(clock: Any) -> None:
    """
    What an exception landing at the first instruction of ``__exit__``
    leaves: the block's exit is dropped uncalled. Its probe's slot comes
    back and later blocks are unaffected.
    """
    cb = _half_open(clock, "dropped", probes=1)
    exit_ = cb.__exit__  # what a with statement looks up first
    cb.__enter__()
    assert cb.statistics().probes_in_flight == 1
    del exit_
    gc.collect()
    assert cb.statistics().probes_in_flight == 0
    with cb:
        pass
    assert cb.state is BreakerState.CLOSED
    with pytest.raises(RuntimeError):
        cb.__exit__(None, None, None)


def test_names_cost_the_context_nothing() -> None:
    """A thousand names through ``with`` add no context variables."""
    before = len(contextvars.copy_context())
    for i in range(1000):
        with resilient.breaker(f"ctx-{i}"):
            pass
    assert len(contextvars.copy_context()) <= before + 1


def test_admission_interface(clock: Any) -> None:
    """
    `fast_admit` gives a closed call's ticket; `settle` counts a ticket or
    a permit; `admit` rejects like `acquire`.
    """
    cb = resilient.breaker(
        "stage", BreakerConfig(window=CountWindow(2), minimum_calls=2)
    )
    ticket = cb.fast_admit()
    assert ticket is not None
    cb.settle(ticket, Outcome.FAILURE)
    cb.settle(cb.admit(), cb.outcome(ConnectionError()))
    assert cb.state is BreakerState.OPEN
    assert cb.fast_admit() is None
    with pytest.raises(resilient.CircuitOpen) as info:
        cb.admit()
    assert info.value.retry_after == cb.retry_after() == 30.0


@pytest.mark.anyio
async def test_async_admission_interface() -> None:
    """`aadmit` and `asettle` are the async twins."""
    cb = resilient.breaker("astage")
    ticket = cb.fast_admit()
    assert ticket is not None
    await cb.asettle(ticket, Outcome.SUCCESS)
    permit = await cb.aadmit()
    await cb.asettle(permit, Outcome.FAILURE)
    await cb.asettle(permit, Outcome.FAILURE)  # settled once only
    stats = cb.statistics()
    assert (stats.calls, stats.failures) == (2, 1)


def test_many_successes_are_taken_in(clock: Any) -> None:
    """
    Successes counted without the lock are taken into the window however
    many pile up between two reads.
    """
    cb = resilient.CircuitBreaker("inbox")
    guarded = cb(int)
    for i in range(1000):
        guarded(i)
    assert cb.config == BreakerConfig()
    assert cb.statistics().calls == 1000
