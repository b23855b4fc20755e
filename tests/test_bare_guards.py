"""
The bare first attempt through the guards (issue 7, "a bulkhead inside the
pipeline adding no more than its standalone cost"): a bulkhead with a free
slot, alone or after a closed breaker, admits the first attempt without
the flow; a full bulkhead sends the call down the full path, which queues
or rejects, and the breaker counts nothing for it.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Coroutine
from typing import Any

import anyio
import pytest

from resilient import Constant, Policy
from resilient._breaker import breaker as get_breaker
from resilient._bulkhead import get_bulkhead
from resilient._core._config_breaker import BreakerConfig
from resilient._core._config_bulkhead import BulkheadConfig
from resilient._core._done import DONE
from resilient._pipeline._guards import BareChain, BreakerBulkhead, Guards
from resilient._pipeline._stage import BreakerStage, BulkheadStage
from resilient.exceptions import BulkheadFull
from tests.conftest import Driver


_names = itertools.count()


def run_to_end(coro: Coroutine[Any, Any, Any]) -> None:
    """Run a coroutine that never suspends to its end, outside a loop."""
    with pytest.raises(StopIteration):
        coro.send(None)


def _policy(*, breaker: bool, max_waiting: int = 0) -> Policy:
    return Policy(
        name=f"bare-{next(_names)}",
        attempts=3,
        budget=None,
        backoff=Constant(seconds=0),
        retry_on=ConnectionError,
        breaker=BreakerConfig() if breaker else None,
        bulkhead=BulkheadConfig(max_concurrent=1, max_waiting=max_waiting),
    )


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
def test_guards_of_fast_stages_run_bare(breaker: bool) -> None:
    """A bulkhead, alone or after a breaker, makes guards with a bare
    admission: the stage itself, or the breaker-then-bulkhead pair."""
    guards = Guards.of(_policy(breaker=breaker))
    assert guards is not None
    if breaker:
        assert isinstance(guards.bare, BreakerBulkhead)
        kinds = [type(s) for s in guards.stages]
        assert kinds == [BreakerStage, BulkheadStage]
    else:
        assert isinstance(guards.bare, BulkheadStage)


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
def test_the_slot_is_held_for_the_attempt(
    driver: Driver, breaker: bool
) -> None:
    """The bare first attempt holds the bulkhead's slot while it runs and
    gives it back after; the breaker counts the success."""
    policy = _policy(breaker=breaker)
    in_use: list[int] = []

    def body() -> str:
        in_use.append(get_bulkhead(policy.name).statistics().in_use)
        return "ok"

    assert driver.call(policy, body) == "ok"
    stats = get_bulkhead(policy.name).statistics()
    assert in_use == [1]
    assert (stats.in_use, stats.acquired, stats.released) == (0, 1, 1)
    if breaker:
        assert get_breaker(policy.name).statistics().calls == 1


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
def test_a_failed_bare_attempt_frees_the_slot_and_retries(
    driver: Driver, breaker: bool
) -> None:
    """A bare first attempt that fails gives its slot back before the
    retry takes it again; the breaker counts both attempts."""
    policy = _policy(breaker=breaker)
    in_use: list[int] = []

    def body() -> str:
        in_use.append(get_bulkhead(policy.name).statistics().in_use)
        if len(in_use) == 1:
            raise ConnectionError
        return "ok"

    assert driver.call(policy, body) == "ok"
    stats = get_bulkhead(policy.name).statistics()
    assert in_use == [1, 1]
    assert (stats.in_use, stats.acquired, stats.released) == (0, 2, 2)
    if breaker:
        cb = get_breaker(policy.name).statistics()
        assert (cb.calls, cb.failures) == (2, 1)


@pytest.mark.parametrize("breaker", [False, True], ids=["alone", "breaker"])
def test_a_full_bulkhead_takes_the_full_path(
    driver: Driver, breaker: bool
) -> None:
    """With the only slot held elsewhere the call is not run bare: the full
    path rejects it (no queue) and the breaker counts nothing."""
    policy = _policy(breaker=breaker)
    calls: list[int] = []

    def body() -> str:
        calls.append(1)
        return "ok"

    # The registry's bulkhead for the policy, made by decorating first.
    decorated: Any = policy(driver.fn(body))
    held = get_bulkhead(policy.name).acquire_nowait()
    try:
        with pytest.raises(BulkheadFull):
            driver.run(decorated)
    finally:
        held.release()
    assert calls == []
    assert get_bulkhead(policy.name).statistics().in_use == 0
    if breaker:
        cb = get_breaker(policy.name).statistics()
        assert (cb.calls, cb.failures) == (0, 0)
    # The slot back, the next call runs.
    assert driver.run(decorated) == "ok"


def test_a_chain_gives_back_what_it_took() -> None:
    """When a later stage will not admit at once, the tickets the chain
    already took are dropped (a bulkhead's slot freed)."""
    policy = _policy(breaker=False)
    outer = BulkheadStage(get_bulkhead(policy.name, policy.bulkhead))
    other = Policy(
        name=f"bare-{next(_names)}",
        bulkhead=BulkheadConfig(max_concurrent=1, max_waiting=0),
    )
    inner = BulkheadStage(get_bulkhead(other.name, other.bulkhead))
    chain = BareChain((outer, inner))
    held = inner.bulkhead.acquire_nowait()
    try:
        assert chain.fast_admit() is None
        assert outer.bulkhead.statistics().in_use == 0
    finally:
        held.release()
    tickets = chain.fast_admit()
    assert tickets is not None
    assert outer.bulkhead.statistics().in_use == 1
    chain.fast_settle(tickets, None)
    assert outer.bulkhead.statistics().in_use == 0
    assert inner.bulkhead.statistics().in_use == 0


def test_a_chain_cut_off_gives_back_what_it_took() -> None:
    """An exception in a later stage's admission (an asynchronous one,
    here raised by the stage) frees the slots the chain already took."""
    policy = _policy(breaker=False)
    outer = BulkheadStage(get_bulkhead(policy.name, policy.bulkhead))

    class Cut:
        def fast_admit(self) -> None:
            raise KeyboardInterrupt

        fast_settle = afast_settle = fast_drop = fast_admit

    chain = BareChain((outer, Cut()))  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        chain.fast_admit()
    assert outer.bulkhead.statistics().in_use == 0


def test_the_pair_frees_its_slot_when_dropped() -> None:
    """The breaker-then-bulkhead pair gives its slot back uncounted when
    the attempt will not run bare."""
    guards = Guards.of(_policy(breaker=True))
    assert guards is not None
    pair = guards.bare
    assert isinstance(pair, BreakerBulkhead)
    tickets = pair.fast_admit()
    assert tickets is not None
    bh = get_bulkhead(guards.stages[1].bulkhead.name)  # type: ignore[attr-defined]
    assert bh.statistics().in_use == 1
    pair.fast_drop(tickets)
    assert bh.statistics().in_use == 0


def test_the_pair_takes_no_slot_from_an_open_breaker() -> None:
    """An open breaker gives no closed ticket: the pair admits nothing and
    takes no slot (the full path rejects)."""
    policy = _policy(breaker=True)
    guards = Guards.of(policy)
    assert guards is not None
    get_breaker(policy.name).force_open()
    assert guards.bare is not None
    assert guards.bare.fast_admit() is None
    assert get_bulkhead(policy.name).statistics().in_use == 0


def test_the_bulkhead_stage_takes_its_slot_in_one_call() -> None:
    """The lone bulkhead's bare admission is its machine's own step: a new
    permit holding a slot, or None when every slot is taken; and its async
    settle is a plain call whose result is already complete (`DONE`, no
    coroutine made per call)."""
    guards = Guards.of(_policy(breaker=False))
    assert guards is not None
    stage = guards.bare
    assert isinstance(stage, BulkheadStage)
    bh = stage.bulkhead
    permit = stage.fast_admit()
    assert permit is not None
    assert not permit.released
    assert bh.statistics().in_use == 1
    assert stage.fast_admit() is None  # One slot only.
    assert stage.afast_settle(permit, None) is DONE
    assert permit.released
    stats = bh.statistics()
    assert (stats.in_use, stats.acquired, stats.released) == (0, 1, 1)


def test_the_pair_settles_async_without_a_coroutine_of_its_own() -> None:
    """The breaker-then-bulkhead pair frees the slot at once and hands back
    the breaker's own settle to await; while cancelled (a BaseException)
    the breaker is settled at once and nothing is left to await."""
    guards = Guards.of(_policy(breaker=True))
    assert guards is not None
    pair = guards.bare
    assert isinstance(pair, BreakerBulkhead)
    bh = guards.stages[1].bulkhead  # type: ignore[attr-defined]
    tickets = pair.fast_admit()
    assert tickets is not None
    pending = pair.afast_settle(tickets, None)
    assert bh.statistics().in_use == 0
    assert inspect.iscoroutine(pending)
    run_to_end(pending)
    cb = get_breaker(guards.stages[0].breaker.name)  # type: ignore[attr-defined]
    assert cb.statistics().calls == 1
    tickets = pair.fast_admit()
    assert tickets is not None
    assert pair.afast_settle(tickets, KeyboardInterrupt()) is DONE
    assert bh.statistics().in_use == 0
    assert cb.statistics().calls == 1  # An interruption is not counted.


def test_a_permit_lost_on_its_way_out_gives_its_slot_back() -> None:
    """A permit that `take_new` granted but nobody kept (an exception
    between the grant and the caller's store) frees its slot once it is
    collected: the next statistics sweep gives it back."""
    bh = get_bulkhead(f"bare-{next(_names)}", BulkheadConfig(max_concurrent=1))
    m = bh._machine
    assert m.take_new(bh) is not None  # Dropped at once.
    stats = bh.statistics()
    assert (stats.in_use, stats.acquired, stats.released) == (0, 1, 1)
    kept = m.take_new(bh)
    assert kept is not None
    assert m.take_new(bh) is None
    m.release(kept)
    m.release(kept)  # Idempotent.
    assert bh.statistics().released == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_done_is_awaited_without_a_checkpoint(backend: str) -> None:
    """``await DONE`` returns None at once: no checkpoint, so even inside a
    cancelled scope it does not raise."""

    async def main() -> list[object]:
        seen: list[object] = []
        with anyio.CancelScope() as scope:
            scope.cancel()
            seen.append(await DONE)
            seen.append(await DONE)
        return seen

    assert anyio.run(main, backend=backend) == [None, None]
