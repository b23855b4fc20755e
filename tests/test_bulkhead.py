"""
Bulkhead: the slot machine directly, then every scenario against threads
and against tasks (asyncio and trio), in virtual time; cancellation, stress,
statistics, telemetry and configuration.

Async actors run in an event loop in a helper thread (an anyio blocking
portal), so that one scenario, written once as plain code in the test
thread, drives threads or tasks alike; releasing their permits from the test
thread exercises the cross-thread hand-off. Same-thread hand-offs are tested
by the pure async tests further down.

Waits in virtual time: with a FakeClock the waiters re-read the clock every
few real milliseconds, so a test advances the clock and the waiter notices.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import gc
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import resilient
from resilient._bulkhead import (
    BULKHEADS,
    Bulkhead,
    BulkheadMachine,
    BulkheadPermit,
    BulkheadStatistics,
    _machine,
    bulkhead,
    get_bulkhead,
)
from resilient._core._config_bulkhead import BulkheadConfig
from resilient.exceptions import BulkheadFull, ConfigError, ConfigTypeError
from tests.actors import Actors, wait_until
from tests.conftest import Driver, Telemetry


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Every test starts with no bulkheads."""
    BULKHEADS.clear()
    yield
    BULKHEADS.clear()


def invariants(s: BulkheadStatistics) -> None:
    """The counts of a snapshot add up."""
    assert s.acquired == s.released + s.in_use
    assert 0 <= s.in_use <= s.max_concurrent
    assert 0 <= s.waiting <= s.max_waiting


def acquire(
    actors: Actors, bh: Bulkhead, timeout: float | None = None
) -> BulkheadPermit:
    """Acquire in the actors' colour, blocking the test until it returns."""
    return actors.call(bh.acquire, bh.acquire_async, timeout)


def start(
    actors: Actors,
    bh: Bulkhead,
    timeout: float | None = None,
    deadline: float | None = None,
) -> Future[BulkheadPermit]:
    """Start one acquirer (inside *deadline*); its outcome."""
    return actors.start(
        bh.acquire, bh.acquire_async, timeout, deadline=deadline
    )


def queued(bh: Bulkhead, n: int) -> None:
    """Wait until *n* callers queue on *bh*."""
    wait_until(lambda: bh.statistics().waiting == n)


# --------------------------------------------------------------------------
# The machine, directly


class TestMachine:
    def bulkhead(self, n: int = 1, waiting: int = 5) -> Bulkhead:
        return Bulkhead(
            "m", BulkheadConfig(max_concurrent=n, max_waiting=waiting)
        )

    def taken(self, bh: Bulkhead) -> BulkheadPermit:
        p = BulkheadPermit(bh)
        assert bh._machine.take(p)
        return p

    def queued(
        self,
        bh: Bulkhead,
        now: float = 0.0,
        seconds: float = 9.0,
        reason: Any = "timeout",
        wake: Callable[[], object] = lambda: None,
    ) -> BulkheadPermit:
        p = BulkheadPermit(bh)
        assert bh._machine.enqueue(p, now, seconds, reason, wake) is None
        return p

    def test_a_release_from_a_collected_cycle_counts_once(self) -> None:
        """A held permit released by the finalizer of a generator collected
        with it in a reference cycle (the collector clears the weak
        reference first) gives its slot back once, not twice."""
        bh = self.bulkhead(1)

        def holder(box: list[object]) -> Iterator[None]:
            permit = bh.acquire_nowait()
            try:
                yield
            finally:
                permit.release()

        box: list[object] = []
        gen = holder(box)
        box.append(gen)
        next(gen)
        del gen, box
        gc.collect()
        stats = bh.statistics()
        assert (stats.in_use, stats.acquired, stats.released) == (0, 1, 1)
        # The slot is free again, and only one.
        again = bh.acquire_nowait()
        with pytest.raises(BulkheadFull):
            bh.acquire_nowait()
        again.release()

    def test_a_release_after_the_sweep_counts_nothing(self) -> None:
        """A permit whose slot the sweep already gave back (its weak
        reference died first, as while the collector runs its finalizer)
        counts nothing when it is released too."""
        bh = self.bulkhead(1)
        permit = self.taken(bh)
        m = bh._machine
        # What `_sweep` does for a dead reference.
        m._holders.discard(permit._ref)
        permit.release()
        stats = bh.statistics()
        assert (stats.in_use, stats.acquired, stats.released) == (0, 1, 1)
        assert permit.released

    def test_a_release_inside_a_locked_step_completes(self) -> None:
        """A release from the thread that already holds the machine's lock
        (what a finalizer does when a collection runs inside one of the
        machine's locked steps) gives the slot back instead of waiting for
        its own thread forever."""
        bh = self.bulkhead(1)
        permit = self.taken(bh)
        m = bh._machine
        done = threading.Event()

        def release_inside() -> None:
            with m._lock:
                permit.release()
            done.set()

        worker = threading.Thread(target=release_inside, daemon=True)
        worker.start()
        assert done.wait(10), "the release waited for its own thread"
        worker.join()
        stats = bh.statistics()
        assert (stats.in_use, stats.acquired, stats.released) == (0, 1, 1)

    def test_a_finalizer_that_releases_while_the_queue_is_served(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A slot released in the thread that is serving the queue, by a
        finalizer that a collection runs where the serve allocates (the
        lock is reentrant), leaves a consistent queue: both waiters are
        granted once, in order, and the counts add up."""
        bh = self.bulkhead(2)
        m = bh._machine
        a, b = self.taken(bh), self.taken(bh)
        woken: list[str] = []
        w1 = self.queued(bh, wake=lambda: woken.append("w1"))
        w2 = self.queued(bh, wake=lambda: woken.append("w2"))
        real = _machine.weakref.ref
        ran: list[bool] = []

        def ref(permit: BulkheadPermit) -> Any:
            if m._lock._is_owned() and not ran:
                ran.append(True)
                b.release()  # What the finalizer does.
            return real(permit)

        monkeypatch.setattr(_machine.weakref, "ref", ref)
        a.release()
        monkeypatch.undo()
        assert ran
        assert woken == ["w1", "w2"]
        assert m.settle(w1, 0.0) is True
        assert m.settle(w2, 0.0) is True
        stats = bh.statistics()
        assert (stats.in_use, stats.waiting) == (2, 0)
        invariants(stats)
        assert stats.acquired == 4
        w1.release()
        w2.release()

    def test_grants_until_full(self) -> None:
        """Free slots are taken at once; then take says no."""
        bh = self.bulkhead(2)
        held = [self.taken(bh), self.taken(bh)]
        assert not bh._machine.take(BulkheadPermit(bh))
        assert len(held) == 2
        assert bh.statistics().in_use == 2

    def test_enqueue_takes_a_slot_freed_meanwhile(self) -> None:
        """A slot freed between take and enqueue is taken."""
        bh = self.bulkhead(1)
        p = self.queued(bh)
        assert repr(p) == "<BulkheadPermit of 'm', held>"
        assert bh.statistics().in_use == 1

    def test_no_wait_allowed_rejects_full(self) -> None:
        """With no time to wait, the answer is "full" (or "deadline")."""
        bh = self.bulkhead(1)
        m = bh._machine
        held = self.taken(bh)
        p = BulkheadPermit(bh)
        assert m.enqueue(p, 0.0, 0.0, "timeout", lambda: None) == "full"
        assert m.enqueue(p, 0.0, 0.0, "deadline", lambda: None) == "deadline"
        assert m.statistics().rejected == 2
        held.release()

    def test_queue_bound(self) -> None:
        """Past max_waiting, callers are refused with "queue_full"."""
        bh = self.bulkhead(1, waiting=1)
        held = self.taken(bh)
        waiting = self.queued(bh)
        p = BulkheadPermit(bh)
        assert bh._machine.enqueue(p, 0, 1, "timeout", print) == "queue_full"
        waiting.release()
        held.release()

    def test_release_hands_slot_to_first_waiter(self) -> None:
        """FIFO: the first waiter is granted and woken; in_use stays."""
        bh = self.bulkhead(1)
        m = bh._machine
        first = self.taken(bh)
        woken: list[str] = []
        a = self.queued(bh, wake=lambda: woken.append("a"))
        b = self.queued(bh, wake=lambda: woken.append("b"))
        assert repr(a) == "<BulkheadPermit of 'm', waiting>"
        first.release()
        assert woken == ["a"]
        assert m.settle(a, 1.0) is True
        assert m.settle(b, 1.0) is False
        s = m.statistics()
        assert (s.in_use, s.waiting, s.acquired, s.released) == (1, 1, 2, 1)
        # A newcomer cannot overtake the queue.
        assert not m.take(BulkheadPermit(bh))

    def test_expired_waiter_leaves_queue(self) -> None:
        """A waiter past its deadline settles with its reason, once."""
        bh = self.bulkhead(1)
        m = bh._machine
        held = self.taken(bh)
        w = self.queued(bh, 10.0, 2.0, "deadline")
        assert m.settle(w, 11.9) is False
        assert m.settle(w, 12.0) == "deadline"
        assert m.settle(w, 12.0) is False  # gone: nothing more to settle
        m.abandon(w)  # after expiry: nothing left to undo
        s = m.statistics()
        assert (s.waiting, s.rejected, s.timed_out, s.cancelled) == (
            0,
            1,
            1,
            0,
        )
        held.release()

    def test_cancel_while_waiting(self) -> None:
        """A waiter abandoned before its grant leaves the queue."""
        bh = self.bulkhead(1)
        m = bh._machine
        p = self.taken(bh)
        w = self.queued(bh)
        m.abandon(w)
        m.release(p)
        s = m.statistics()
        assert (s.in_use, s.waiting, s.cancelled) == (0, 0, 1)
        invariants(s)

    def test_cancel_just_after_grant_passes_slot_on(self) -> None:
        """A waiter abandoned after its grant passes the slot to the next."""
        bh = self.bulkhead(1)
        m = bh._machine
        p = self.taken(bh)
        woken: list[str] = []
        a = self.queued(bh, wake=lambda: woken.append("a"))
        b = self.queued(bh, wake=lambda: woken.append("b"))
        m.release(p)
        m.abandon(a)
        assert woken == ["a", "b"]
        assert m.settle(b, 0.0) is True
        s = m.statistics()
        assert (s.in_use, s.acquired, s.released, s.cancelled) == (1, 3, 2, 0)
        invariants(s)

    def test_cancel_just_after_grant_frees_slot(self) -> None:
        """With nobody else waiting, the abandoned grant frees the slot."""
        bh = self.bulkhead(1)
        m = bh._machine
        p = self.taken(bh)
        a = self.queued(bh)
        m.release(p)
        m.abandon(a)
        m.abandon(a)  # twice changes nothing
        s = m.statistics()
        assert (s.in_use, s.acquired, s.released) == (0, 2, 2)
        self.taken(bh)

    def test_dead_waiter_skipped(self) -> None:
        """A waiter whose wake-up fails (its loop is gone) is skipped."""
        bh = self.bulkhead(1)
        m = bh._machine
        p = self.taken(bh)

        def dead() -> None:
            raise anyio.RunFinishedError

        self.queued(bh, wake=dead)
        live = self.queued(bh)
        m.release(p)
        assert m.settle(live, 0.0) is True
        s = m.statistics()
        assert (s.in_use, s.waiting, s.acquired, s.released) == (1, 0, 3, 2)

    def test_dead_last_waiter_frees_slot(self) -> None:
        """With only a dead waiter queued, the slot becomes free."""
        bh = self.bulkhead(1)
        p = self.taken(bh)

        def dead() -> None:
            raise RuntimeError("loop closed")

        self.queued(bh, wake=dead)
        p.release()
        assert bh.statistics().in_use == 0

    def test_release_is_idempotent(self) -> None:
        """Releasing a permit twice frees one slot; a permit that never
        held one frees nothing."""
        bh = self.bulkhead(2)
        kept = self.taken(bh)
        p = self.taken(bh)
        p.release()
        p.release()
        assert p.released
        never = BulkheadPermit(bh)
        never.release()
        assert never.released
        assert bh.statistics().in_use == 1
        kept.release()

    def test_a_dropped_permit_gives_its_slot_back(self) -> None:
        """A held permit freed without a release gives its slot back (an
        exception between the grant and the caller's try cannot leak it),
        to the first waiter if any."""
        bh = self.bulkhead(1)
        p = self.taken(bh)
        w = self.queued(bh)
        del p
        gc.collect()
        assert bh._machine.settle(w, 0.0) is True
        w.release()
        s = bh.statistics()
        assert (s.in_use, s.acquired, s.released) == (0, 2, 2)

    def test_a_grant_cut_off_before_leaving_the_queue(self) -> None:
        """A waiter granted but still at the head of the queue (an
        exception landed between the two steps) and then released is
        skipped by the next hand-on."""
        bh = self.bulkhead(1)
        m = bh._machine
        held = self.taken(bh)
        a = self.queued(bh)
        b = self.queued(bh)
        a._state = 3  # what a cut-off grant and a release leave at the head
        held.release()
        assert m.settle(b, 0.0) is True
        s = m.statistics()
        assert (s.waiting, s.in_use) == (0, 1)

    def test_a_free_slot_behind_a_queue_is_served_by_a_waiter(
        self,
    ) -> None:
        """A slot freed without a hand-on (an exception landed between the
        two) goes to the first waiter when any waiter looks again."""
        bh = self.bulkhead(1)
        m = bh._machine
        held = self.taken(bh)
        a = self.queued(bh)
        b = self.queued(bh)
        # The state a release cut off before it served the queue leaves:
        held._state = 3
        m._holders.discard(held._ref)
        assert m.settle(b, 0.0) is False
        assert m.settle(a, 0.0) is True
        invariants(m.statistics())


# --------------------------------------------------------------------------
# Scenarios against threads, asyncio tasks and trio tasks


class TestScenarios:
    def test_admits_up_to_max_concurrent(
        self, actors: Actors, clock: Any
    ) -> None:
        """N callers get in at once; the next is refused when it may not
        wait."""
        bh = bulkhead("db", max_concurrent=3, max_wait=0)
        permits = [acquire(actors, bh) for _ in range(3)]
        with pytest.raises(BulkheadFull) as info:
            acquire(actors, bh)
        e = info.value
        assert (e.name, e.reason, e.max_concurrent, e.waited) == (
            "db",
            "full",
            3,
            0.0,
        )
        for p in permits:
            p.release()
        s = bh.statistics()
        assert (s.in_use, s.acquired, s.released, s.rejected) == (0, 3, 3, 1)

    def test_waiter_gets_released_slot(
        self, actors: Actors, clock: Any
    ) -> None:
        """A queued caller gets the slot the holder releases."""
        bh = bulkhead("db", max_concurrent=1, max_wait=5.0)
        held = acquire(actors, bh)
        fut = start(actors, bh)
        queued(bh, 1)
        assert not fut.done()
        held.release()
        permit = fut.result(timeout=10)
        assert bh.statistics().in_use == 1
        permit.release()
        s = bh.statistics()
        assert (s.in_use, s.acquired, s.released, s.timed_out) == (0, 2, 2, 0)

    def test_fifo_order(self, actors: Actors, clock: Any) -> None:
        """Waiters are served in the order they queued."""
        bh = bulkhead("db", max_concurrent=1, max_wait=None)
        held = acquire(actors, bh)
        futs = []
        for i in range(4):
            futs.append(start(actors, bh))
            queued(bh, i + 1)
        order = []
        for expected, fut in enumerate(futs):
            held.release()
            held = fut.result(timeout=10)
            order.append(expected)
            assert all(not f.done() for f in futs[expected + 1 :])
        held.release()
        assert order == [0, 1, 2, 3]
        assert bh.statistics().in_use == 0

    def test_wait_times_out_in_virtual_time(
        self, actors: Actors, clock: Any
    ) -> None:
        """A waiter is refused once max_wait passes on the clock."""
        bh = bulkhead("db", max_concurrent=1, max_wait=2.0)
        held = acquire(actors, bh)
        fut = start(actors, bh)
        queued(bh, 1)
        clock.advance(1.9)
        time.sleep(0.02)
        assert not fut.done()
        clock.advance(0.1)
        with pytest.raises(BulkheadFull) as info:
            fut.result(timeout=10)
        assert info.value.reason == "timeout"
        assert info.value.waited == pytest.approx(2.0)
        held.release()
        s = bh.statistics()
        assert (s.in_use, s.waiting, s.rejected, s.timed_out) == (0, 0, 1, 1)

    def test_timeout_argument_overrides_max_wait(
        self, actors: Actors, clock: Any
    ) -> None:
        """acquire(timeout=) replaces max_wait for that call."""
        bh = bulkhead("db", max_concurrent=1, max_wait=100.0)
        held = acquire(actors, bh)
        fut = start(actors, bh, timeout=1.0)
        queued(bh, 1)
        clock.advance(1.0)
        with pytest.raises(BulkheadFull, match="timeout"):
            fut.result(timeout=10)
        with pytest.raises(BulkheadFull, match="full"):
            acquire(actors, bh, timeout=0)
        held.release()

    def test_deadline_clips_wait(self, actors: Actors, clock: Any) -> None:
        """The enclosing deadline ends the wait before max_wait does."""
        bh = bulkhead("db", max_concurrent=1, max_wait=10.0)
        held = acquire(actors, bh)
        fut = start(actors, bh, deadline=0.5)
        queued(bh, 1)
        clock.advance(0.5)
        with pytest.raises(BulkheadFull) as info:
            fut.result(timeout=10)
        assert info.value.reason == "deadline"
        held.release()

    def test_expired_deadline_rejects_without_queueing(
        self, actors: Actors, clock: Any
    ) -> None:
        """A full bulkhead and no time left: refused at once."""
        bh = bulkhead("db", max_concurrent=1, max_wait=10.0)
        held = acquire(actors, bh)
        fut = start(actors, bh, deadline=0.0)
        with pytest.raises(BulkheadFull, match="deadline"):
            fut.result(timeout=10)
        assert bh.statistics().timed_out == 0
        held.release()

    def test_expired_deadline_still_admits_to_free_slot(
        self, actors: Actors, clock: Any
    ) -> None:
        """A free slot is granted whatever the deadline says."""
        bh = bulkhead("db", max_concurrent=1)
        start(actors, bh, deadline=0.0).result(timeout=10).release()
        assert bh.statistics().acquired == 1

    def test_queue_full_rejects_at_once(
        self, actors: Actors, clock: Any
    ) -> None:
        """Past max_waiting, a caller is refused without waiting."""
        bh = bulkhead("db", max_concurrent=1, max_waiting=2, max_wait=5.0)
        held = acquire(actors, bh)
        futs = [start(actors, bh) for _ in range(2)]
        queued(bh, 2)
        with pytest.raises(BulkheadFull) as info:
            acquire(actors, bh)
        assert info.value.reason == "queue_full"
        held.release()
        futs[0].result(timeout=10).release()
        futs[1].result(timeout=10).release()
        s = bh.statistics()
        invariants(s)
        assert (s.acquired, s.rejected, s.in_use) == (3, 1, 0)

    def test_no_queue(self, actors: Actors, clock: Any) -> None:
        """max_waiting=0 refuses as soon as the slots are taken."""
        bh = bulkhead("db", max_concurrent=1, max_waiting=0, max_wait=5.0)
        held = acquire(actors, bh)
        with pytest.raises(BulkheadFull, match="queue_full"):
            acquire(actors, bh)
        held.release()

    def test_acquire_nowait(self, clock: Any) -> None:
        """acquire_nowait takes a free slot or raises at once."""
        bh = bulkhead("db", max_concurrent=1, max_wait=5.0)
        p = bh.acquire_nowait()
        with pytest.raises(BulkheadFull, match="full"):
            bh.acquire_nowait()
        p.release()
        bh.acquire_nowait().release()

    def test_slot_freed_while_deciding_to_wait(
        self, actors: Actors, clock: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A slot freed between the fast path and queueing is taken
        without waiting."""
        bh = bulkhead("db", max_concurrent=1)
        monkeypatch.setattr(BulkheadMachine, "take", lambda *_: False)
        acquire(actors, bh).release()
        s = bh.statistics()
        assert (s.acquired, s.released, s.waiting) == (1, 1, 0)

    def test_huge_wait_is_clipped_for_threads(self) -> None:
        """A max_wait beyond what a lock wait accepts still works (real
        clock): the wait is clipped, not an OverflowError."""
        bh = bulkhead("db", max_concurrent=1, max_wait=1e300)
        held = bh.acquire()
        got: list[BulkheadPermit] = []
        t = threading.Thread(target=lambda: got.append(bh.acquire()))
        t.start()
        queued(bh, 1)
        held.release()
        t.join(10)
        got[0].release()
        assert bh.statistics().acquired == 2

    def test_threads_and_tasks_share_slots(self, clock: Any) -> None:
        """A thread and a task draw from the same slots, both ways."""
        bh = bulkhead("db", max_concurrent=1, max_wait=5.0)
        with anyio.from_thread.start_blocking_portal("trio") as portal:
            held = bh.acquire()
            fut = portal.start_task_soon(bh.acquire_async)
            queued(bh, 1)
            held.release()  # from this thread to the task
            task_permit = fut.result(timeout=10)
            got: list[BulkheadPermit] = []
            t = threading.Thread(target=lambda: got.append(bh.acquire()))
            t.start()
            queued(bh, 1)
            portal.call(task_permit.release)  # from the loop to a thread
            t.join(10)
            got[0].release()
        s = bh.statistics()
        assert (s.acquired, s.released, s.in_use) == (3, 3, 0)


class TestCancellation:
    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_task_cancelled_while_waiting(self, kind: str, clock: Any) -> None:
        """A task cancelled in the queue leaves it; nothing is lost."""
        bh = bulkhead("db", max_concurrent=1, max_wait=None)
        actors = Actors(kind)
        try:
            held = acquire(actors, bh)
            fut = start(actors, bh)
            queued(bh, 1)
            fut.cancel()
            queued(bh, 0)
            held.release()
        finally:
            actors.close()
        s = bh.statistics()
        assert (s.in_use, s.waiting, s.cancelled) == (0, 0, 1)
        invariants(s)

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    @pytest.mark.parametrize("cancel_first", [False, True])
    def test_task_cancelled_just_after_grant(
        self, kind: str, cancel_first: bool, clock: Any
    ) -> None:
        """A task granted a slot and cancelled before it resumes gives the
        slot to the next waiter: whether the cancel lands first (the task
        wakes cancelled, holding a grant it never saw) or after the grant
        (the task resumes with the permit and releases it)."""

        async def main() -> None:
            bh = bulkhead("db", max_concurrent=1, max_wait=None)
            held = await bh.acquire_async()
            box: list[anyio.CancelScope] = []
            second_in: list[bool] = []

            async def first() -> None:
                with anyio.CancelScope() as scope:
                    box.append(scope)
                    permit = await bh.acquire_async()
                    try:  # resumed with the grant before the cancel landed
                        await anyio.lowlevel.checkpoint()
                    finally:
                        permit.release()

            async def second() -> None:
                async with bh:
                    second_in.append(True)

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await wait_queued(bh, 1)
                tg.start_soon(second)
                await wait_queued(bh, 2)
                if cancel_first:
                    box[0].cancel()
                    held.release()
                else:
                    held.release()
                    box[0].cancel()
            assert second_in == [True]
            s = bh.statistics()
            assert (s.in_use, s.waiting, s.cancelled) == (0, 0, 0)
            assert s.acquired == s.released == 3

        anyio.run(main, backend=kind)

    def test_thread_interrupted_while_waiting(
        self, clock: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A thread interrupted (KeyboardInterrupt) in the queue leaves it."""

        class Interrupted:
            def wait(self, timeout: float) -> bool:
                raise KeyboardInterrupt

            def wake(self) -> None: ...

        bh = bulkhead("db", max_concurrent=1, max_wait=None)
        held = bh.acquire()
        monkeypatch.setattr(
            "resilient._bulkhead._shells.ThreadWaiter", Interrupted
        )
        with pytest.raises(KeyboardInterrupt):
            bh.acquire()
        held.release()
        s = bh.statistics()
        assert (s.in_use, s.waiting, s.cancelled) == (0, 0, 1)

    def test_thread_interrupted_just_after_grant(
        self, clock: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A thread interrupted right after its grant passes the slot on."""
        bh = bulkhead("db", max_concurrent=1, max_wait=None)
        held = bh.acquire()

        class GrantThenInterrupt:
            woken = False

            def wait(self, timeout: float) -> bool:
                held.release()  # the grant arrives...
                assert self.woken
                raise KeyboardInterrupt  # ...and so does a signal

            def wake(self) -> None:
                self.woken = True

        monkeypatch.setattr(
            "resilient._bulkhead._shells.ThreadWaiter", GrantThenInterrupt
        )
        with pytest.raises(KeyboardInterrupt):
            bh.acquire()
        s = bh.statistics()
        assert (s.in_use, s.acquired, s.released, s.cancelled) == (0, 2, 2, 0)
        bh.acquire_nowait().release()


async def wait_queued(bh: Bulkhead, n: int) -> None:
    """In a task: yield until *n* callers queue on *bh*."""
    for _ in range(10_000):
        if bh.statistics().waiting == n:
            return
        await anyio.sleep(0.0005)
    raise AssertionError("never queued")  # pragma: no cover


class TestSameLoop:
    pytestmark = pytest.mark.anyio

    async def test_same_loop_hand_off(self, clock: Any) -> None:
        """Tasks in one loop hand slots to each other directly."""
        bh = bulkhead("db", max_concurrent=2, max_wait=None)
        inside = 0
        peak = 0

        async def worker() -> None:
            nonlocal inside, peak
            for _ in range(5):
                async with bh:
                    inside += 1
                    peak = max(peak, inside)
                    await anyio.lowlevel.checkpoint()
                    inside -= 1

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(worker)
        assert peak == 2
        s = bh.statistics()
        assert (s.acquired, s.released, s.in_use) == (30, 30, 0)

    async def test_real_clock_timeout(self) -> None:
        """On the real clock a waiter times out after max_wait."""
        bh = bulkhead("db", max_concurrent=1, max_wait=0.01)
        async with bh:
            with pytest.raises(BulkheadFull, match="timeout"):
                await bh.acquire_async()

    async def test_async_with_nests(self, clock: Any) -> None:
        """Nested ``async with`` holds two permits and releases both."""
        bh = bulkhead("db", max_concurrent=2)
        async with bh as outer:
            async with bh as inner:
                assert bh.statistics().in_use == 2
            assert inner.released
            assert not outer.released
        assert bh.statistics().in_use == 0


def test_real_clock_thread_timeout() -> None:
    """On the real clock a waiting thread times out after max_wait."""
    bh = bulkhead("db", max_concurrent=1, max_wait=0.01)
    with bh, pytest.raises(BulkheadFull, match="timeout"):
        bh.acquire()
    assert bh.statistics().timed_out == 1


class TestForms:
    def test_decorator(self, driver: Driver, clock: Any) -> None:
        """@bulkhead holds a slot while the function runs, sync or async."""
        bh = bulkhead("db", max_concurrent=1)

        def body(x: int) -> tuple[int, int]:
            return x, bh.statistics().in_use

        assert driver.call(bh, body, 7) == (7, 1)
        s = bh.statistics()
        assert (s.in_use, s.acquired, s.released) == (0, 1, 1)

    def test_decorator_releases_on_error(
        self, driver: Driver, clock: Any
    ) -> None:
        """The slot comes back when the function raises."""
        bh = bulkhead("db", max_concurrent=1)

        def body() -> None:
            raise ValueError

        with pytest.raises(ValueError):
            driver.call(bh, body)
        assert bh.statistics().in_use == 0

    def test_decorator_keeps_signature(self) -> None:
        """The decorated function keeps its name and __wrapped__."""
        bh = bulkhead("db")

        def f(a: int, b: str = "") -> None: ...

        g = bh(f)
        assert g.__name__ == "f"
        assert g.__wrapped__ is f  # type: ignore[attr-defined]

    def test_with_block_and_permit(self, clock: Any) -> None:
        """``with bh:`` and ``with bh.acquire():`` hold one slot each."""
        bh = bulkhead("db", max_concurrent=2)
        with bh as p, bh.acquire() as q:
            assert bh.statistics().in_use == 2
            assert (p.released, q.released) == (False, False)
        assert (p.released, q.released) == (True, True)
        assert "released" in repr(p)
        assert bh.statistics().in_use == 0

    def test_with_block_waits_for_a_slot(self, clock: Any) -> None:
        """``with bh:`` queues like acquire() when the slots are taken."""
        bh = bulkhead("db", max_concurrent=1, max_wait=None)
        held = bh.acquire()
        done = threading.Event()

        def body() -> None:
            with bh:
                done.set()

        t = threading.Thread(target=body)
        t.start()
        queued(bh, 1)
        assert not done.is_set()
        held.release()
        t.join(10)
        assert done.is_set()
        assert bh.statistics().in_use == 0

    def test_exit_without_enter(self) -> None:
        """Exiting a bulkhead never entered in this context is an error."""
        bh = bulkhead("db")
        with pytest.raises(RuntimeError, match="exited more often"):
            bh.__exit__(None, None, None)

    def test_with_is_per_thread(self, clock: Any) -> None:
        """``with bh:`` in two threads tracks each thread's own permit."""
        bh = bulkhead("db", max_concurrent=2)
        barrier = threading.Barrier(2)

        def body() -> None:
            with bh:
                barrier.wait(5)
            barrier.wait(5)

        threads = [threading.Thread(target=body) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        s = bh.statistics()
        assert (s.acquired, s.released, s.in_use) == (2, 2, 0)

    def test_repr(self) -> None:
        """The repr shows slots in use and waiters."""
        bh = bulkhead("db", max_concurrent=4)
        with bh:
            assert repr(bh) == "<Bulkhead 'db': 1/4 in use, 0 waiting>"


# --------------------------------------------------------------------------
# Stress


def test_stress_threads() -> None:
    """16 threads x 300 acquisitions never exceed N inside; counts add up."""
    n = 3
    bh = bulkhead("stress", max_concurrent=n, max_waiting=64, max_wait=None)
    lock = threading.Lock()
    inside = 0
    peak = 0
    violations = 0

    def worker() -> None:
        nonlocal inside, peak, violations
        for _ in range(300):
            with bh:
                with lock:
                    inside += 1
                    peak = max(peak, inside)
                    violations += inside > n
                time.sleep(0)
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s = bh.statistics()
    assert violations == 0
    assert 1 <= peak <= n
    assert (s.acquired, s.released, s.in_use, s.waiting) == (4800, 4800, 0, 0)
    assert s.rejected == s.cancelled == 0


def test_stress_threads_and_tasks_with_cancellation() -> None:
    """Threads and tasks (asyncio and trio), some timing out and some
    cancelled while waiting, inside, or just after their grant, share N
    slots: never more than N inside, none lost, every request counted once.
    """
    n = 2
    bh = bulkhead("mixed", max_concurrent=n, max_waiting=200, max_wait=None)
    lock = threading.Lock()
    state = {"inside": 0, "violations": 0, "entered": 0, "full": 0}

    def enter() -> None:
        with lock:
            state["inside"] += 1
            state["violations"] += state["inside"] > n
            state["entered"] += 1

    def leave() -> None:
        with lock:
            state["inside"] -= 1

    def thread_worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            try:
                with bh.acquire(timeout=rng.choice([None, 0.0, 0.0005])):
                    enter()
                    time.sleep(0)
                    leave()
            except BulkheadFull:
                with lock:
                    state["full"] += 1

    async def task_worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            with anyio.move_on_after(rng.choice([1.0, 0.0005, 0.0])):
                async with bh:
                    enter()
                    try:
                        await anyio.lowlevel.checkpoint()
                    finally:
                        leave()

    def loop(kind: str, base: int) -> None:
        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(task_worker, base + i)

        anyio.run(main, backend=kind)

    threads = [
        threading.Thread(target=thread_worker, args=(i,)) for i in range(6)
    ]
    threads.append(threading.Thread(target=loop, args=("asyncio", 100)))
    threads.append(threading.Thread(target=loop, args=("trio", 200)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    s = bh.statistics()
    assert state["violations"] == 0
    assert state["inside"] == 0
    assert (s.in_use, s.waiting) == (0, 0)
    # Grants abandoned just after they came count as acquired, not entered.
    assert s.acquired == s.released >= state["entered"]
    assert s.rejected == state["full"]
    assert s.acquired + s.rejected + s.cancelled == 6 * 150 + 2 * 8 * 60


# --------------------------------------------------------------------------
# Registry, configuration, telemetry


class TestRegistry:
    def test_one_per_name(self) -> None:
        """The same name gives the same bulkhead."""
        a = bulkhead("db", max_concurrent=3)
        assert get_bulkhead("db") is a
        assert bulkhead("db") is a
        assert get_bulkhead("db", BulkheadConfig(max_concurrent=3)) is a
        assert get_bulkhead("other") is not a

    def test_conflicting_config(self) -> None:
        """A different configuration for an existing name is refused."""
        bulkhead("db", max_concurrent=3)
        with pytest.raises(ConfigError, match=r"bulkhead\('db'\)\.config"):
            bulkhead("db", max_concurrent=4)

    def test_config_and_knobs(self) -> None:
        """A config object and keywords together are refused."""
        with pytest.raises(TypeError, match="not both"):
            bulkhead("db", BulkheadConfig(), max_concurrent=2)

    def test_bad_config_type(self) -> None:
        """A config that is not a BulkheadConfig is refused."""
        with pytest.raises(ConfigTypeError, match="bulkhead"):
            get_bulkhead("db", {"max_concurrent": 2})  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("name", "error"),
        [("", ConfigError), ("  ", ConfigError), (3, TypeError)],
    )
    def test_bad_name(self, name: Any, error: type[Exception]) -> None:
        """Names are non-empty strings."""
        with pytest.raises(error, match=r"bulkhead\(name\)"):
            get_bulkhead(name)

    def test_held_bulkhead_is_never_duplicated(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Regression: past the registry's limit, a bulkhead a decorated
        function holds was forgotten and a lookup made a second one, so a
        max_concurrent=1 bulkhead ran 2 calls at once. Now the same name
        finds the same bulkhead as long as anything holds it."""
        monkeypatch.setattr(BULKHEADS, "limit", 2)
        one = bulkhead("one", max_concurrent=1, max_wait=0)
        inside: list[int] = []

        @one
        def call() -> None:
            inside.append(1)
            with pytest.raises(BulkheadFull):
                bulkhead("one").acquire_nowait()

        del one
        for i in range(5):  # push the idle "one" out of the registry's keep
            bulkhead(f"other{i}")
        gc.collect()
        assert "one" not in BULKHEADS.kept()
        call()
        assert inside == [1]

    def test_held_permit_keeps_its_bulkhead(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bulkhead nothing references but a held permit is still the
        one its name finds: its slot stays taken."""
        monkeypatch.setattr(BULKHEADS, "limit", 2)
        permit = bulkhead("one", max_concurrent=1, max_wait=0).acquire()
        for i in range(5):
            bulkhead(f"other{i}")
        gc.collect()
        with pytest.raises(BulkheadFull):
            bulkhead("one").acquire_nowait()
        permit.release()
        bulkhead("one").acquire_nowait().release()

    def test_unheld_bulkheads_are_forgotten(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Past the limit, bulkheads nobody holds are forgotten."""
        monkeypatch.setattr(BULKHEADS, "limit", 3)
        for i in range(10):
            bulkhead(f"idle{i}")
        gc.collect()
        assert len(BULKHEADS) == 3
        assert set(BULKHEADS.names()) == {"idle7", "idle8", "idle9"}

    def test_lookup_without_config_then_configured(self) -> None:
        """Looking at a bulkhead (statistics) does not fix its
        configuration: the first explicit one is taken while unused."""
        assert bulkhead("db").statistics().max_concurrent == 25
        bh = bulkhead("db", max_concurrent=2)
        assert bh.statistics().max_concurrent == 2
        with bh:
            pass
        with pytest.raises(ConfigError, match=r"max_concurrent: 2 != 3"):
            bulkhead("db", max_concurrent=3)

    def test_used_provisional_bulkhead_conflicts(self) -> None:
        """A default-made bulkhead that has been used keeps its
        configuration: a later different one is refused."""
        bh = bulkhead("db")
        bh.acquire_nowait().release()
        with pytest.raises(ConfigError, match=r"max_concurrent: 25 != 2"):
            bulkhead("db", max_concurrent=2)

    def test_reset_keeps_held_slots(self) -> None:
        """reset_registries() zeroes a bulkhead's counts in place but keeps
        the slots held then: old holders plus new callers never exceed
        max_concurrent."""
        bh = bulkhead("db", max_concurrent=1, max_wait=0)
        held = bh.acquire()
        resilient.testing.reset_registries()
        s = bh.statistics()
        assert (s.in_use, s.acquired, s.released) == (1, 1, 0)
        with pytest.raises(BulkheadFull):
            bh.acquire_nowait()
        held.release()
        bh.acquire_nowait().release()
        invariants(bh.statistics())
        assert bulkhead("db") is not bh  # the name starts afresh


class TestConfig:
    def test_defaults(self) -> None:
        """Defaults: 25 slots, 25 waiting, 1 s wait."""
        c = BulkheadConfig()
        assert (c.max_concurrent, c.max_waiting, c.max_wait) == (25, 25, 1.0)

    def test_durations(self) -> None:
        """max_wait takes timedelta and int, and None."""
        assert BulkheadConfig(max_wait=dt.timedelta(seconds=2)).max_wait == 2.0
        assert BulkheadConfig(max_wait=3).max_wait == 3.0
        assert BulkheadConfig(max_wait=None).max_wait is None

    @pytest.mark.parametrize(
        ("field", "value", "error"),
        [
            ("max_concurrent", 0, ConfigError),
            ("max_concurrent", True, ConfigTypeError),
            ("max_concurrent", 2.0, ConfigTypeError),
            ("max_waiting", -1, ConfigError),
            ("max_waiting", None, ConfigTypeError),
            ("max_wait", -0.5, ConfigError),
            ("max_wait", float("nan"), ConfigError),
            ("max_wait", float("inf"), ConfigError),
            ("max_wait", "1", ConfigTypeError),
        ],
    )
    def test_bad_values(
        self, field: str, value: object, error: type[Exception]
    ) -> None:
        """Bad values raise naming BulkheadConfig.<field> and the value."""
        with pytest.raises(error) as info:
            BulkheadConfig(**{field: value})  # type: ignore[arg-type]
        assert f"BulkheadConfig.{field}" in str(info.value)
        assert repr(value) in str(info.value)

    @pytest.mark.parametrize(
        ("timeout", "error"),
        [(-1, ConfigError), (float("nan"), ConfigError), ("1", TypeError)],
    )
    def test_bad_timeout(self, timeout: Any, error: type[Exception]) -> None:
        """acquire(timeout=) must be a number >= 0 or None."""
        bh = bulkhead("db", max_concurrent=1)
        with bh, pytest.raises(error, match=r"acquire\(timeout\)"):
            bh.acquire(timeout)
        assert bh.statistics().in_use == 0


class TestTelemetry:
    def test_rejections_waits_and_gauges(
        self, telemetry: Telemetry, clock: Any
    ) -> None:
        """Rejections count, waits are recorded, gauges show slots and
        waiters."""
        bh = bulkhead("db", max_concurrent=1, max_wait=1.0)
        tracer = telemetry.tracer_provider.get_tracer("test")
        held = bh.acquire()
        with (
            tracer.start_as_current_span("call"),
            pytest.raises(BulkheadFull),
        ):
            bh.acquire_nowait()
        fut: Future[BulkheadPermit] = Future()
        t = threading.Thread(target=lambda: fut.set_result(bh.acquire()))
        t.start()
        queued(bh, 1)
        m = telemetry.metrics()
        assert m["resilient.bulkhead.in_use"] == 1
        assert m["resilient.bulkhead.waiting"] == 1
        clock.advance(0.25)
        held.release()
        t.join(10)
        fut.result().release()
        m = telemetry.metrics()
        assert m["resilient.bulkhead.rejections"] == 1
        assert m["resilient.bulkhead.wait"] == 1
        (span,) = telemetry.spans()
        (event,) = span.events
        assert event.name == "resilient.bulkhead.rejected"
        assert event.attributes["resilient.reason"] == "full"

    def test_no_sdk_no_cost(self, clock: Any) -> None:
        """Without a meter provider, rejections and waits record nothing."""
        bh = bulkhead("db", max_concurrent=1, max_wait=0)
        with bh, pytest.raises(BulkheadFull):
            bh.acquire()


# --------------------------------------------------------------------------
# The machine against a model, on random sequences of operations


class MachineModel(RuleBasedStateMachine):
    """
    Random acquisitions, queueing, releases, cancellations, grants and
    expiries against a model of the slots: the machine never admits more
    than N, grants in queue order, loses no slot, and its counts add up.
    """

    def __init__(self) -> None:
        super().__init__()
        self.n = 2
        self.bh = Bulkhead(
            "model", BulkheadConfig(max_concurrent=self.n, max_waiting=3)
        )
        self.m = self.bh._machine
        self.now = 0.0
        self.held: list[BulkheadPermit] = []
        self.queue: list[BulkheadPermit] = []  # in the order they queued
        self.granted: list[BulkheadPermit] = []  # granted, not yet settled
        self.woken: list[BulkheadPermit] = []

    def _in_use(self) -> int:
        return len(self.held) + len(self.granted)

    @rule()
    def take(self) -> None:
        free = self._in_use() < self.n and not self.queue
        p = BulkheadPermit(self.bh)
        assert self.m.take(p) is free
        if free:
            self.held.append(p)

    @rule(seconds=st.sampled_from([0.0, 1.0, 5.0]))
    def enqueue(self, seconds: float) -> None:
        p = BulkheadPermit(self.bh)
        out = self.m.enqueue(
            p, self.now, seconds, "timeout", lambda: self.woken.append(p)
        )
        if self._in_use() < self.n and not self.queue:
            assert out is None
            self.held.append(p)
        elif seconds <= 0:
            assert out == "full"
        elif len(self.queue) >= 3:
            assert out == "queue_full"
        else:
            assert out is None
            self.queue.append(p)

    def _hand_on(self) -> None:
        if self.queue:
            first = self.queue.pop(0)
            assert self.woken[-1] is first
            self.granted.append(first)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        permit = data.draw(st.sampled_from(self.held))
        self.held.remove(permit)
        permit.release()
        self._hand_on()

    @precondition(lambda self: self.queue or self.granted)
    @rule(data=st.data())
    def abandon(self, data: st.DataObject) -> None:
        waiter = data.draw(st.sampled_from(self.queue + self.granted))
        self.m.abandon(waiter)
        if waiter in self.granted:
            self.granted.remove(waiter)
            self._hand_on()
        else:
            self.queue.remove(waiter)

    @precondition(lambda self: self.queue or self.granted)
    @rule(data=st.data(), advance=st.sampled_from([0.0, 0.5, 2.0]))
    def settle(self, data: st.DataObject, advance: float) -> None:
        self.now += advance
        waiter = data.draw(st.sampled_from(self.queue + self.granted))
        out = self.m.settle(waiter, self.now)
        if waiter in self.granted:
            assert out is True
            self.granted.remove(waiter)
            self.held.append(waiter)
        elif self.now >= waiter._deadline:
            assert out == "timeout"
            self.queue.remove(waiter)
        else:
            assert out is False

    @invariant()
    def counts_add_up(self) -> None:
        s = self.m.statistics()
        assert s.in_use == self._in_use() <= self.n
        assert s.waiting == len(self.queue)
        invariants(s)


MachineModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestMachineModel = MachineModel.TestCase


def test_cancelled_scope_wakes_a_waiting_thread() -> None:
    """
    A thread queued for a full bulkhead inside a `resilient.timeout` scope
    leaves the queue at once when another thread cancels the scope; the
    scope ends quietly and the bulkhead counts it as cancelled.
    """
    bh = bulkhead("wake", max_concurrent=1, max_waiting=5, max_wait=None)
    held = bh.acquire_nowait()
    scopes: list[resilient.TimeoutScope] = []
    entered = threading.Event()
    outcome: list[str] = []

    def waiter() -> None:
        with resilient.timeout(60) as scope:
            scopes.append(scope)
            entered.set()
            with bh.acquire():
                outcome.append("granted")
        outcome.append("left" if scope.cancelled_caught else "timed out")

    t = threading.Thread(target=waiter)
    t.start()
    assert entered.wait(5)
    while bh.statistics().waiting == 0:  # until it is queued
        time.sleep(0.001)
    started = time.monotonic()
    scopes[0].cancel()
    t.join(5)
    assert not t.is_alive()
    assert time.monotonic() - started < 2.0
    assert outcome == ["left"]
    stats = bh.statistics()
    assert (stats.waiting, stats.in_use, stats.cancelled) == (0, 1, 1)
    held.release()


class TestSyncWaitInAnEventLoop:
    async def test_sync_wait_in_a_loop_thread_is_refused(
        self, anyio_backend: str
    ) -> None:
        """Regression: a sync ``with bulkhead`` in async code while a task
        holds the slot deadlocked (max_wait=None: the holder can never run
        to release it). Now the blocking wait raises RuntimeError naming the
        async form; nothing is left queued."""
        bh = bulkhead("loop", max_concurrent=1, max_wait=None)
        async with bh:
            with (
                pytest.raises(RuntimeError, match="async with bulkhead"),
                bh,
            ):
                pass  # pragma: no cover - never entered
            with pytest.raises(RuntimeError, match="aacquire"):
                bh.acquire()
        s = bh.statistics()
        assert (s.in_use, s.waiting, s.acquired, s.released) == (0, 0, 1, 1)

    async def test_non_blocking_forms_still_work_in_a_loop(
        self, anyio_backend: str
    ) -> None:
        """A free slot is taken by the sync forms even in an event loop's
        thread, and acquire_nowait or max_wait=0 refuse without waiting."""
        bh = bulkhead("loop", max_concurrent=1, max_wait=0)
        with bh:
            with pytest.raises(BulkheadFull):
                bh.acquire_nowait()
            with pytest.raises(BulkheadFull):
                bh.acquire()
        bh.acquire().release()


def test_huge_timeout_is_no_limit(clock: Any) -> None:
    """acquire(timeout=10**400) waits without limit instead of raising
    OverflowError; 0 refuses at once."""
    bh = bulkhead("db", max_concurrent=1)
    with bh:
        with pytest.raises(BulkheadFull, match="full"):
            bh.acquire(timeout=0)
        fut: Future[BulkheadPermit] = Future()
        t = threading.Thread(
            target=lambda: fut.set_result(bh.acquire(timeout=10**400))
        )
        t.start()
        queued(bh, 1)
    t.join(10)
    fut.result().release()


def test_exit_stack_and_nesting(clock: Any) -> None:
    """contextlib.ExitStack (which calls the class's methods) and nested
    blocks of one bulkhead each hold and give back their own slot."""
    bh = bulkhead("db", max_concurrent=3)
    with contextlib.ExitStack() as stack:
        p = stack.enter_context(bh)
        with bh as inner, bh:
            assert bh.statistics().in_use == 3
            assert inner is not p
        assert bh.statistics().in_use == 1
    assert bh.statistics().in_use == 0


async def test_async_exit_stack(anyio_backend: str) -> None:
    """contextlib.AsyncExitStack works as async with does."""
    bh = bulkhead("db", max_concurrent=1)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(bh)
        assert bh.statistics().in_use == 1
    assert bh.statistics().in_use == 0


def test_with_leaves_no_context_variable_per_name() -> None:
    """Regression: each bulkhead name used with ``with`` left a ContextVar
    key in the context forever. Now the context does not grow."""
    before = len(contextvars.copy_context())
    for i in range(200):
        with bulkhead(f"n{i}"):
            pass
    assert len(contextvars.copy_context()) <= before + 1


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf(
        "SC_PAGE_SIZE"
    )


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="Linux")
def test_a_million_names_through_every_form() -> None:
    """Distinct names through bulkhead(name), with, async with, the
    decorator and retry_budget(name) (100,000 in the suite; 1,000,000 with
    RESILIENT_MILLION_NAMES=1): retained memory stays under 50 MB and the
    registries keep only their limit. Prints the time per lookup of a new
    name after 1,000 names and at the end (no assertion on it)."""
    gc.collect()
    base = _rss()

    @bulkhead("decorated")
    def call() -> None:
        pass

    async def enter_async(names: range) -> None:
        for i in names:
            async with bulkhead(f"a{i}"):
                pass

    def lookups(names: range, prefix: str) -> float:
        start = time.perf_counter()
        for i in names:
            bulkhead(f"{prefix}{i}")
        return (time.perf_counter() - start) / len(names)

    early = lookups(range(1_000), "early")
    n = 200_000 if os.environ.get("RESILIENT_MILLION_NAMES") else 20_000
    for i in range(n):
        with bulkhead(f"w{i}"):
            pass
        resilient.retry_budget(f"r{i}")
        bulkhead(f"d{i}")(call)
    anyio.run(enter_async, range(n))
    lookups(range(n), "late")
    late = lookups(range(1_000), "last")
    gc.collect()
    grown = _rss() - base
    print(  # noqa: T201 - the figure the issue asks to record
        f"\nper new-name lookup: {early * 1e6:.2f} us at 1,000 names, "
        f"{late * 1e6:.2f} us at {5 * n + 2_000:,}; "
        f"retained {grown / 2**20:.1f} MB"
    )
    assert len(BULKHEADS) <= BULKHEADS.limit + 1
    assert grown < 50 * 2**20


def test_a_permit_released_while_collected_is_counted_once() -> None:
    """A held permit in a reference cycle whose collection releases it
    (a block-form loop left before its attempt was entered) frees its slot
    once: the collector clears the weak reference the bulkhead holds
    before the release runs, and the sweep must not count it again (it
    did: in_use -1)."""
    bulkhead = resilient.bulkhead(
        f"collected-{os.getpid()}-{random.random()}", max_concurrent=1
    )

    class Holder:
        def __init__(self) -> None:
            self.permit = bulkhead.acquire()
            self.me = self

        def __del__(self) -> None:
            self.permit.release()

    gc.disable()
    try:
        Holder()
        gc.collect()
    finally:
        gc.enable()
    bulkhead.acquire().release()  # sweeps the bulkhead's dead holders
    stats = bulkhead.statistics()
    assert (stats.in_use, stats.acquired, stats.released) == (0, 2, 2)
