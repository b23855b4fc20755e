"""
Distributed locks through their shells (`resilient.lock`): sync, asyncio and
trio, on the ``memory://`` store with virtual time where the scenario allows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

import resilient
from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
)
from resilient._backends import _memory as memory
from resilient._lock import _lease, _renewer
from resilient.exceptions import LockBackendError
from resilient.testing import FakeClock
from tests.conftest import Driver, Telemetry


def _url() -> str:
    return f"memory://lock-tests-{uuid.uuid4().hex}"


@pytest.fixture
def url() -> str:
    """A memory store of this test's own."""
    return _url()


def settle(clock: FakeClock, seconds: float, *, steps: int = 10) -> None:
    """
    Move virtual time forward by *seconds* in *steps*, giving the renewer
    thread (which polls a fake clock every 5 ms of real time) a turn after
    each step.
    """
    for _ in range(steps):
        clock.advance(seconds / steps)
        time.sleep(0.012)


async def asettle(
    clock: FakeClock, seconds: float, *, steps: int = 10
) -> None:
    """`settle` for async tests: the renewer is a task in this loop."""
    for _ in range(steps):
        clock.advance(seconds / steps)
        await anyio.sleep(0.012)


def hold(url: str, name: str = "job", ttl: float = 60.0) -> Callable[[], None]:
    """
    Hold *name* as some other process would (straight on the store, with
    an owner of its own); returns its release.
    """
    key, owner = LockKey.of(name), OwnerToken()
    assert isinstance(memory.store(url).acquire(key, owner, ttl), Grant)
    return lambda: memory.store(url).release(key, owner) and None


def no_leftovers(url: str) -> None:
    """Nothing held: no rows, no renewed leases, no holder recorded."""
    assert memory.store(url).rows() == 0
    for renewer in list(_renewer._ALL):
        if getattr(renewer.backend, "store", renewer.backend) is memory.store(
            url
        ):
            assert len(renewer.renewals) == 0
    assert not [k for k in _lease.HOLDERS if k[0] == url]


class TestEnterAndLeave:
    def test_with_yields_a_lease_and_releases_it(
        self, driver: Driver, url: str
    ) -> None:
        """Entering yields a lease with an int fencing token and the name;
        leaving releases it, so the next holder gets it at once with a
        higher token."""
        lock = resilient.lock("job", backend=url, ttl=5.0)
        tokens: list[int] = []

        def body(lease: resilient.Lease) -> None:
            assert lease.name == "job"
            assert lease.held
            assert not lease.lost
            assert 0 < lease.valid_for() <= 5.0
            tokens.append(lease.token)

        if driver.is_async:

            async def main() -> None:
                for _ in range(2):
                    async with lock as lease:
                        body(lease)

            driver.run(main)
        else:
            for _ in range(2):
                with lock as lease:
                    body(lease)
        assert all(isinstance(t, int) for t in tokens)
        assert tokens[0] < tokens[1]
        no_leftovers(url)

    def test_decorator_holds_the_lock_for_each_call(
        self, driver: Driver, url: str
    ) -> None:
        """``@resilient.lock(name)`` runs each call of a sync or async function
        holding the lock, and keeps the function's name and result."""
        lock = resilient.lock("nightly-report", backend=url)
        seen: list[int] = []

        def job(x: int) -> int:
            seen.append(memory.store(url).rows())
            return x * 2

        fn = driver.fn(job)
        wrapped = lock(fn)
        assert wrapped.__name__ == fn.__name__
        assert wrapped.__wrapped__ is fn  # type: ignore[attr-defined]
        assert driver.run(wrapped, 21) == 42
        assert seen == [1]
        no_leftovers(url)

    def test_an_error_in_the_block_releases_and_propagates(
        self, driver: Driver, url: str
    ) -> None:
        """The block's own exception comes out unchanged, and the lease is
        released."""
        lock = resilient.lock("job", backend=url)

        def boom() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            driver.call(lock, boom)
        no_leftovers(url)

    def test_explicit_acquire_and_release(self, url: str) -> None:
        """`Lock.acquire` returns a lease that `Lease.release` releases; a
        second release answers as the first did, sending nothing."""
        lock = resilient.lock("job", backend=url)
        lease = lock.acquire()
        assert memory.store(url).rows() == 1
        assert lease.release() is ReleaseResult.RELEASED
        assert lease.release() is ReleaseResult.RELEASED
        assert not lease.held
        with pytest.raises(resilient.LockLost, match="'job'"):
            lease.checkpoint()
        no_leftovers(url)

    async def test_explicit_aacquire_and_arelease(
        self, anyio_backend: str, url: str
    ) -> None:
        """`Lock.aacquire` and `Lease.arelease`, the async twins."""
        lock = resilient.lock("job", backend=url)
        lease = await lock.aacquire()
        assert lease.held
        assert await lease.arelease() is ReleaseResult.RELEASED
        no_leftovers(url)

    def test_repr_names_the_lock_and_token(self, url: str) -> None:
        """Reprs show the name, the store's scheme (never its URL) and the
        token."""
        lock = resilient.lock("job", backend=url)
        assert repr(lock) == "<Lock 'job' on memory:// ttl=30>"
        with lock as lease:
            assert f"token={lease.token} held" in repr(lease)
        assert "released" in repr(lease)


class TestWaiting:
    def test_a_refusal_is_a_rejection_that_retry_outwaits(
        self, url: str, clock: FakeClock
    ) -> None:
        """`LockNotAcquired` is a `resilient.Rejected` whose ``retry_after``
        is the holder's time left: a policy around a non-blocking acquire
        waits that long (not an attempt's backoff) and gets the lock once
        the holder's lease has run out."""
        start = clock.now()
        hold(url, ttl=3.0)  # Never renewed: it runs out in 3 s.
        lock = resilient.lock("job", backend=url, blocking=False)
        policy = resilient.Policy(
            retry_on=lambda exc: False,
            backoff=resilient.Constant(seconds=0.01),
        )
        lease = policy.call(lock.acquire)
        assert lease.held
        assert clock.now() - start >= 3.0
        lease.release()
        assert issubclass(resilient.LockNotAcquired, resilient.Rejected)

    def test_non_blocking_try_refuses_at_once(
        self, driver: Driver, url: str, clock: FakeClock
    ) -> None:
        """``blocking=False`` (and `acquire_nowait`) raise `LockNotAcquired`
        at once while the lock is held, naming the lock and how long the
        holder's lease has left."""
        release = hold(url, ttl=30.0)
        lock = resilient.lock("job", backend=url, blocking=False)
        start = clock.now()
        with pytest.raises(resilient.LockNotAcquired) as info:
            driver.call(lock, lambda: None)
        assert info.value.reason == "busy"
        assert info.value.name == "job"
        assert 0 < info.value.retry_after <= 30.0
        assert clock.now() == start
        with pytest.raises(resilient.LockNotAcquired):
            resilient.lock("job", backend=url).acquire_nowait()
        release()

    def test_timeout_bounds_the_wait(
        self, driver: Driver, url: str, clock: FakeClock
    ) -> None:
        """A held lock is waited for up to ``timeout`` (virtual time), with
        jittered backoff, then `LockNotAcquired` says it timed out."""
        release = hold(url)
        lock = resilient.lock("job", backend=url, timeout=2.0)
        start = clock.now()
        with pytest.raises(resilient.LockNotAcquired) as info:
            driver.call(lock, lambda: None)
        assert info.value.reason == "timeout"
        assert clock.now() - start == pytest.approx(2.0)
        assert info.value.waited == pytest.approx(2.0)
        assert "timed out" in str(info.value)
        release()

    def test_the_enclosing_deadline_bounds_the_wait(
        self, driver: Driver, url: str, clock: FakeClock
    ) -> None:
        """An enclosing `resilient.deadline` shorter than the lock's timeout
        ends the wait at the deadline."""
        release = hold(url)
        lock = resilient.lock("job", backend=url, timeout=10.0)
        start = clock.now()
        with (
            resilient.deadline(0.5),
            pytest.raises(resilient.LockNotAcquired) as info,
        ):
            driver.call(lock, lambda: None)
        assert info.value.reason == "deadline"
        assert clock.now() - start == pytest.approx(0.5)
        release()

    def test_a_waiter_gets_the_lock_when_the_holder_expires(
        self, url: str, clock: FakeClock
    ) -> None:
        """A holder that stops renewing (its lease expires on the store) is
        replaced by a waiter right after the expiry, not a backoff later."""
        hold(url, ttl=3.0)
        lock = resilient.lock(
            "job",
            backend=url,
            timeout=10.0,
            backoff=resilient.Constant(seconds=5.0),
        )
        start = clock.now()
        with lock:
            assert clock.now() - start == pytest.approx(3.0, abs=0.01)

    def test_a_released_lock_wakes_a_waiting_thread(self, url: str) -> None:
        """A thread waiting for a held lock is woken by the release, not by
        its next backoff step (here 10 s away)."""
        lock = resilient.lock(
            "job", backend=url, backoff=resilient.Constant(seconds=10.0)
        )
        held = lock.acquire()
        got = threading.Event()

        def waiter() -> None:
            with lock:
                got.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.05)
        assert not got.is_set()
        held.release()
        assert got.wait(5.0)
        thread.join(5.0)
        no_leftovers(url)

    async def test_a_released_lock_wakes_a_waiting_task(
        self, anyio_backend: str, url: str
    ) -> None:
        """The same for tasks: woken by the release, on asyncio and trio."""
        lock = resilient.lock(
            "job", backend=url, backoff=resilient.Constant(seconds=10.0)
        )
        order: list[str] = []

        async def waiter() -> None:
            async with lock:
                order.append("waiter")

        async with anyio.create_task_group() as tg, lock:
            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            order.append("holder")
        assert order == ["holder", "waiter"]

    def test_cancelling_the_scope_wakes_a_waiting_thread(
        self, url: str
    ) -> None:
        """A thread waiting for a lock inside a `resilient.timeout` scope that
        another thread cancels stops waiting at once."""
        lock = resilient.lock(
            "job", backend=url, backoff=resilient.Constant(seconds=10.0)
        )
        held = lock.acquire()
        scope = resilient.timeout(None)
        done = threading.Event()

        def waiter() -> None:
            with scope:
                lock.acquire()
            done.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.05)
        scope.cancel()
        assert done.wait(5.0)
        thread.join(5.0)
        held.release()
        no_leftovers(url)

    def test_blocking_acquire_in_an_event_loop_is_refused(
        self, anyio_backend: str, url: str
    ) -> None:
        """A sync acquire that could wait, on an event loop's thread, raises
        a clear error naming the async form at its first call, even when the
        lock is free (a test suite where it always is would never see the
        mistake); one that may not wait (``blocking=False``, ``timeout=0``)
        is allowed."""
        lock = resilient.lock("job", backend=url)

        async def main() -> None:
            with pytest.raises(RuntimeError, match="async with"):
                lock.acquire()
            release = hold(url)
            with pytest.raises(RuntimeError, match="async with"):
                lock.acquire()
            release()
            resilient.lock("job", backend=url, timeout=0).acquire().release()
            with pytest.raises(resilient.LockNotAcquired):
                release = hold(url)
                try:
                    resilient.lock(
                        "job", backend=url, blocking=False
                    ).acquire()
                finally:
                    release()

        anyio.run(main, backend=anyio_backend)


class TestReentrancy:
    def test_same_thread_double_acquire_raises(self, url: str) -> None:
        """A thread entering a lock it already holds (through any `Lock`
        object of the name) gets an error instead of waiting for ever."""
        with resilient.lock("job", backend=url):  # noqa: SIM117
            with pytest.raises(RuntimeError, match="not reentrant"):
                resilient.lock("job", backend=url).acquire()
        no_leftovers(url)

    async def test_same_task_double_acquire_raises(
        self, anyio_backend: str, url: str
    ) -> None:
        """The same in a task; another task waits its turn instead."""
        lock = resilient.lock("job", backend=url)
        async with lock:
            with pytest.raises(RuntimeError, match="this task"):
                await lock.aacquire()

    def test_another_thread_waits_its_turn(self, url: str) -> None:
        """Another thread of the same process is not refused: it waits."""
        lock = resilient.lock("job", backend=url, timeout=0.05)
        with lock:
            errors: list[BaseException] = []

            def other() -> None:
                try:
                    lock.acquire()
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=other)
            thread.start()
            thread.join(5.0)
        assert [type(e) for e in errors] == [resilient.LockNotAcquired]


class TestRenewal:
    def test_renewal_keeps_the_lease_past_several_ttls(
        self, url: str, clock: FakeClock
    ) -> None:
        """While held, the lease is renewed every ttl/3 and outlives five
        TTLs; another owner cannot take it meanwhile."""
        with resilient.lock("job", backend=url, ttl=3.0) as lease:
            settle(clock, 15.0, steps=30)
            assert lease.held
            assert lease.valid_for() > 1.0
            lease.checkpoint()
            busy = memory.store(url).acquire(
                LockKey.of("job"), OwnerToken(), 1
            )
            assert isinstance(busy, Busy)

    async def test_renewal_keeps_the_lease_in_async_code(
        self, anyio_backend: str, url: str, clock: FakeClock
    ) -> None:
        """The renewer task keeps an async holder's lease alive too."""
        async with resilient.lock("job", backend=url, ttl=3.0) as lease:
            await asettle(clock, 15.0, steps=30)
            assert lease.held

    def test_one_renewer_renews_many_leases_in_one_call(
        self, url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Fifty held leases of one backend are renewed by one worker (and
        its watchdog), in one batched call per round, not a thread per
        lock."""
        store = memory.store(url)
        calls: list[int] = []
        real = store.renew

        def counting(batch: Sequence[Renewal]) -> list[bool]:
            calls.append(len(batch))
            return real(batch)

        monkeypatch.setattr(store, "renew", counting)
        before = threading.active_count()
        leases = [
            resilient.lock(f"job-{i}", backend=url, ttl=3.0).acquire()
            for i in range(50)
        ]
        assert threading.active_count() <= before + 2
        settle(clock, 1.2, steps=2)
        assert calls
        assert max(calls) == 50
        assert all(lease.held for lease in leases)
        for lease in leases:
            lease.release()

    def test_renew_now_by_hand(self, url: str, clock: FakeClock) -> None:
        """`Lease.renew` renews at once and extends the validity."""
        with resilient.lock("job", backend=url, ttl=3.0) as lease:
            clock.advance(1.5)
            before = lease.valid_for()
            assert lease.renew()
            assert lease.valid_for() > before


class TestLoss:
    def test_a_lease_deleted_behind_the_holders_back_is_lost(
        self, url: str, clock: FakeClock
    ) -> None:
        """When the store no longer holds the lease, the next renewal finds
        out (within a renewal interval): `checkpoint()` raises `LockLost`
        naming the lock, and leaving the block raises it."""
        lock = resilient.lock("job", backend=url, ttl=3.0)
        with pytest.raises(resilient.LockLost) as info, lock as lease:
            memory.store(url).delete(LockKey.of("job"))
            settle(clock, 1.0, steps=4)
            assert lease.lost
            with pytest.raises(resilient.LockLost):
                lease.checkpoint()
        assert info.value.reason == "gone"
        assert info.value.name == "job"
        assert info.value.fence == lease.token
        no_leftovers(url)

    def test_loss_wakes_every_library_wait_in_the_block(
        self, url: str
    ) -> None:
        """In sync code a lost lease wakes the block's library waits (here a
        `resilient.timeout` block's sleep on a bulkhead-free wait), and the
        block ends with `LockLost`."""
        lock = resilient.lock("job", backend=url, ttl=0.3)
        start = time.monotonic()
        with pytest.raises(resilient.LockLost), lock:
            memory.store(url).delete(LockKey.of("job"))
            resilient.MonotonicClock().sleep(30.0)
        assert time.monotonic() - start < 10.0

    def test_renewal_that_cannot_reach_the_store_loses_at_validity(
        self, url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """When renewals get no answer, the lease counts as lost once its
        local validity (ttl minus the drift margin, from before the acquire
        was sent) runs out: before the store could grant it again."""
        store = memory.store(url)

        def down(batch: Sequence[Renewal]) -> list[bool]:
            raise ConnectionError("store down")

        with pytest.raises(resilient.LockLost) as info:  # noqa: SIM117
            with resilient.lock("job", backend=url, ttl=3.0) as lease:
                monkeypatch.setattr(store, "renew", down)
                settle(clock, 3.0, steps=10)
                assert not lease.held
                assert lease.valid_for() == 0.0
        assert info.value.reason == "expired"

    @pytest.mark.parametrize("retryable", [False, True])
    def test_a_renewal_the_store_refuses_for_good_loses_at_once(
        self,
        url: str,
        clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch,
        retryable: bool,
    ) -> None:
        """A renewal refused with a `LockBackendError` that retrying cannot
        cure (a refused login) loses the lease at that renewal, reason
        "refused", the store's error as the cause; a retryable one (a
        dropped connection) is retried until the validity runs out, reason
        "expired". A manual `renew()` that is refused loses it too."""
        store = memory.store(url)
        refusal = LockBackendError(
            "memory", "NOAUTH", "refused", retryable=retryable, where="here:1"
        )

        def refuse(batch: Sequence[Renewal]) -> list[bool]:
            raise refusal

        with pytest.raises(resilient.LockLost) as info:  # noqa: SIM117
            with resilient.lock("job", backend=url, ttl=3.0) as lease:
                monkeypatch.setattr(store, "renew", refuse)
                settle(clock, 1.5, steps=6)  # Past the first renewal (1 s).
                assert lease.lost is not retryable
                settle(clock, 1.5, steps=6)
        if retryable:
            assert info.value.reason == "expired"
            return
        assert info.value.reason == "refused"
        assert info.value.__cause__ is refusal
        assert any("here:1" in note for note in info.value.__notes__)
        lock = resilient.lock("job", backend=url, ttl=3.0)
        with pytest.raises(resilient.LockLost) as info, lock as lease:
            with pytest.raises(LockBackendError):
                lease.renew()
            assert lease.lost
        assert info.value.reason == "refused"

    def test_the_block_scope_carries_lock_lost_as_its_reason(
        self, url: str, clock: FakeClock
    ) -> None:
        """The loss cancels the block's scope with `LockLost` as its reason:
        `resilient.checkpoint()` in the block raises `LockLost` itself (not
        a bare scope cancellation), naming the lock."""
        raised: list[BaseException] = []
        with pytest.raises(resilient.LockLost) as info:  # noqa: SIM117
            with resilient.lock("job", backend=url, ttl=3.0):
                memory.store(url).delete(LockKey.of("job"))
                settle(clock, 1.5, steps=6)
                try:
                    resilient.checkpoint()
                except BaseException as exc:
                    raised.append(exc)
                    raise
        assert [type(e) for e in raised] == [resilient.LockLost]
        assert raised[0] is info.value
        assert info.value.reason == "gone"
        assert info.value.name == "job"

    def test_a_renewal_call_that_hangs_is_lost_on_time(
        self, url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A renewal call that never returns does not hold the loss back:
        the renewer's watchdog marks the lease lost when its validity runs
        out on our clock, while the call still hangs, and the block's scope
        is cancelled with `LockLost` (`resilient.checkpoint()` raises it)."""
        store = memory.store(url)
        calling, unblock = threading.Event(), threading.Event()

        def hang(batch: Sequence[Renewal]) -> list[bool]:
            calling.set()
            unblock.wait(10.0)
            return [True] * len(batch)

        try:
            with pytest.raises(resilient.LockLost) as info:  # noqa: SIM117
                with resilient.lock("job", backend=url, ttl=3.0):
                    monkeypatch.setattr(store, "renew", hang)
                    settle(clock, 3.0, steps=10)
                    assert calling.is_set()
                    end = time.monotonic() + 5.0  # The watchdog's turn.
                    while time.monotonic() < end:
                        resilient.checkpoint()
                        time.sleep(0.005)
                    pytest.fail("the hanging renewal kept the block running")
        finally:
            unblock.set()
        assert info.value.reason == "expired"

    async def test_an_async_renewal_call_that_hangs_is_lost_on_time(
        self,
        anyio_backend: str,
        url: str,
        clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The same in async code: the renewer task stops waiting for a
        hanging renewal at the lease's validity, and the block is
        cancelled with `LockLost`."""
        reached = []

        async def hang(
            self: memory.AsyncMemoryStore, batch: Sequence[Renewal]
        ) -> list[bool]:
            await anyio.Event().wait()
            raise AssertionError  # pragma: no cover - never set

        with pytest.raises(resilient.LockLost) as info:
            async with resilient.lock("job", backend=url, ttl=3.0):
                monkeypatch.setattr(memory.AsyncMemoryStore, "renew", hang)
                await asettle(clock, 3.0, steps=10)
                await anyio.sleep(30)
                reached.append(True)
        assert reached == []
        assert info.value.reason == "expired"

    def test_a_pause_past_validity_is_lost_even_without_the_renewer(
        self, url: str, clock: FakeClock
    ) -> None:
        """A holder paused past its TTL (virtual time jumps at once, the
        renewer never ran) sees the loss at its next checkpoint."""
        with pytest.raises(resilient.LockLost):  # noqa: SIM117
            with resilient.lock("job", backend=url, ttl=3.0) as lease:
                clock.advance(3.0)
                lease.checkpoint()

    def test_the_blocks_own_exception_wins_over_the_loss(
        self, url: str, clock: FakeClock
    ) -> None:
        """A block already raising keeps its exception; a note says the
        lock was lost."""
        with pytest.raises(KeyError) as info:  # noqa: SIM117
            with resilient.lock("job", backend=url, ttl=3.0):
                clock.advance(5.0)
                raise KeyError("own")
        assert any("lost" in note for note in info.value.__notes__)

    async def test_async_loss_cancels_the_block(
        self, anyio_backend: str, url: str, clock: FakeClock
    ) -> None:
        """In async code a lost lease cancels the block (its cancel scope)
        and `LockLost` comes out of ``async with``."""
        reached = []
        with pytest.raises(resilient.LockLost) as info:
            async with resilient.lock("job", backend=url, ttl=3.0):
                memory.store(url).delete(LockKey.of("job"))
                await asettle(clock, 2.0, steps=8)
                await anyio.sleep(30)
                reached.append(True)
        assert reached == []
        assert info.value.reason == "gone"


class TestRelease:
    def test_a_release_that_gets_no_answer_is_logged_not_raised(
        self,
        url: str,
        caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch,
        telemetry: Telemetry,
    ) -> None:
        """A release the store does not answer leaves the lease to expire:
        a log line and a span event say so, and no exception hides the
        block's result; a retried release sends it again."""
        store = memory.store(url)
        real = store.release
        monkeypatch.setattr(
            store, "release", lambda key, owner: (_ for _ in ()).throw(OSError)
        )
        with caplog.at_level(logging.WARNING, "resilient"):  # noqa: SIM117
            with resilient.lock("job", backend=url) as lease:
                pass
        assert "left to expire" in caplog.text
        events = [e.name for s in telemetry.spans() for e in s.events]
        assert "resilient.lock.release_unknown" in events
        monkeypatch.setattr(store, "release", real)
        assert lease.release() is ReleaseResult.RELEASED
        assert store.rows() == 0

    async def test_async_release_survives_cancellation(
        self, anyio_backend: str, url: str
    ) -> None:
        """A block cancelled from outside still releases its lease (the
        release is shielded)."""
        with anyio.move_on_after(0.05) as scope:
            async with resilient.lock("job", backend=url) as lease:
                await anyio.sleep(30)
        assert scope.cancelled_caught
        assert not lease.held
        no_leftovers(url)
        again = resilient.lock("job", backend=url, blocking=False)
        async with again as second:
            assert second.token > lease.token


class TestTelemetry:
    def test_a_span_per_acquisition(
        self, url: str, telemetry: Telemetry
    ) -> None:
        """Each acquisition has a span with the lock's name, backend, fencing
        token, time waited and outcome; never the owner token."""
        with resilient.lock("job", backend=url) as lease:
            token = lease.token
        release = hold(url)
        with pytest.raises(resilient.LockNotAcquired):
            resilient.lock("job", backend=url, blocking=False).acquire()
        release()
        spans = [s for s in telemetry.spans() if s.name == "resilient.lock"]
        first = dict(spans[0].attributes)
        assert first["resilient.lock.name"] == "job"
        assert first["resilient.lock.backend"] == "memory"
        assert first["resilient.lock.fence"] == token
        assert first["resilient.lock.waited"] >= 0
        assert first["resilient.lock.outcome"] == "released"
        outcomes = [
            dict(s.attributes)["resilient.lock.outcome"] for s in spans
        ]
        assert "busy" in outcomes


class TestSecrecy:
    """RELIABILITY test 10: the owner token is a secret."""

    def test_owner_tokens_are_random_and_long(self) -> None:
        """Owner tokens come from `secrets`: at least 128 bits, and 10,000 of
        them never repeat."""
        tokens = {OwnerToken().secret for _ in range(10_000)}
        assert len(tokens) == 10_000
        assert min(len(t) for t in tokens) * 8 >= 128

    def test_owner_tokens_come_from_secrets(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The token's bytes are what `secrets.token_bytes` gives."""
        import secrets

        monkeypatch.setattr(secrets, "token_bytes", lambda n: b"\x01" * n)
        assert OwnerToken().secret == b"\x01" * 20

    def test_the_token_shows_nowhere(
        self,
        url: str,
        clock: FakeClock,
        caplog: pytest.LogCaptureFixture,
        telemetry: Telemetry,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Not in the reprs of the lock, lease or records, nor in log lines,
        spans, `LockLost` or `LockNotAcquired`."""
        secret = b"\xab" * 20
        # Held by another owner (made before every token is the secret).
        release = hold(url, "other")
        monkeypatch.setattr("secrets.token_bytes", lambda n: secret[:n])
        shown: list[str] = []
        lock = resilient.lock("job", backend=url, ttl=3.0)
        with caplog.at_level(logging.DEBUG, "resilient"):
            try:
                with lock as lease:
                    shown += [repr(lock), repr(lease), repr(lease._record)]
                    with pytest.raises(resilient.LockNotAcquired) as refused:
                        resilient.lock("other", backend=url).acquire_nowait()
                    shown += [str(refused.value), repr(refused.value)]
                    release()
                    memory.store(url).delete(LockKey.of("job"))
                    settle(clock, 1.5, steps=4)
            except resilient.LockLost as exc:
                shown += [str(exc), repr(exc)]
        shown.append(caplog.text)
        for span in telemetry.spans():
            shown.append(repr(dict(span.attributes)))
            shown += [repr(dict(e.attributes)) for e in span.events]
        text = "\n".join(shown)
        assert secret.hex() not in text
        assert repr(secret)[2:-1] not in text
        assert "LockLost" in text or "lost" in text

    def test_an_owner_token_cannot_be_pickled(self) -> None:
        """Pickling a token (into a log record, a queue) is refused."""
        import pickle

        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(OwnerToken())


class TestConfig:
    """RELIABILITY test 12: TTL units and bad lock options."""

    @pytest.mark.parametrize(
        ("ttl", "seconds"),
        [
            (0.5, 0.5),
            (1.5, 1.5),
            (10**9, 1e9),
            (dt.timedelta(milliseconds=1500), 1.5),
            (0.0004, 0.0004),
        ],
    )
    def test_ttl_units(self, ttl: Any, seconds: float, tmp_path: Any) -> None:
        """TTLs in seconds (floats, ints, timedelta) reach the store as that
        many seconds: on SQLite the row expires a TTL after the store wrote
        it (between the call and the read of the row: a renewal may move it
        later), never at once;
        sub-millisecond TTLs are not rounded to 0."""
        import sqlite3

        url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
        lock = resilient.lock("job", backend=url, ttl=ttl)
        assert lock.config.ttl == seconds
        start = time.monotonic_ns()
        lease = lock.acquire()
        path = resilient._backends.open_backend(url).path  # type: ignore[attr-defined]
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            (expires,) = db.execute("SELECT expires_ns FROM leases").fetchone()
        read = time.monotonic_ns()
        if seconds >= 0.001:
            assert start + seconds * 1e9 <= expires <= read + seconds * 1e9 + 1
        else:  # Renewed every 0.13 ms: only check it is not 0.
            assert expires > start
        lease.release()

    @pytest.mark.parametrize(
        ("knobs", "field"),
        [
            ({"ttl": 0}, "LockConfig.ttl"),
            ({"ttl": -1}, "LockConfig.ttl"),
            ({"ttl": math.nan}, "LockConfig.ttl"),
            ({"ttl": math.inf}, "LockConfig.ttl"),
            ({"ttl": 1e20}, "LockConfig.ttl"),
            ({"ttl": 3, "renew_interval": 3}, "LockConfig.renew_interval"),
            ({"ttl": 3, "renew_interval": 5}, "LockConfig.renew_interval"),
            (
                {"ttl": 3, "renew_interval": 2.9, "drift": 0.2},
                "LockConfig.renew_interval",
            ),
            ({"ttl": 3, "drift": 3}, "LockConfig.drift"),
            ({"timeout": -1}, "LockConfig.timeout"),
            ({"backend": "nope://x"}, "LockConfig.backend"),
        ],
    )
    def test_bad_values_are_refused(
        self, knobs: dict[str, Any], field: str
    ) -> None:
        """Bad values raise `ConfigError` (a `ValueError`) at construction,
        naming the field."""
        with pytest.raises(resilient.ConfigError, match=field) as info:
            resilient.LockConfig(**knobs)
        assert isinstance(info.value, ValueError)
        assert info.value.field == field

    @pytest.mark.parametrize(
        "knobs",
        [{"ttl": "3"}, {"ttl": True}, {"blocking": 1}, {"backoff": 3}],
    )
    def test_bad_types_are_refused(self, knobs: dict[str, Any]) -> None:
        """Wrong types raise `ConfigTypeError`."""
        with pytest.raises(resilient.ConfigTypeError):
            resilient.LockConfig(**knobs)

    def test_bad_names_are_refused(self) -> None:
        """A lock's name must be a str."""
        with pytest.raises(resilient.ConfigTypeError, match="lock\\(name\\)"):
            resilient.lock(b"job")  # type: ignore[arg-type]

    def test_defaults(self) -> None:
        """30 s leases, renewed every 10 s, a 10 s wait: never unbounded."""
        config = resilient.LockConfig()
        assert config.ttl == 30.0
        assert config.every == 10.0
        assert config.margin == pytest.approx(0.3)
        assert config.wait == 10.0
        assert resilient.LockConfig(blocking=False).wait == 0.0
        assert resilient.LockConfig(timeout=None).wait == math.inf

    def test_knobs_apply_over_a_config(self) -> None:
        """Keyword knobs apply over a given `LockConfig`."""
        base = resilient.LockConfig(ttl=5.0, backend="memory://")
        lock = resilient.lock("job", config=base, timeout=1.0)
        assert lock.config.ttl == 5.0
        assert lock.config.timeout == 1.0

    def test_unknown_scheme_and_missing_driver(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An unknown scheme, or a scheme whose driver is missing, fails at
        construction with the scheme and the extra, never the URL (which
        may hold a password)."""
        with pytest.raises(resilient.ConfigError) as info:
            resilient.lock("job", backend="mongodb://user:pw@host")
        assert "mongodb://" in str(info.value)
        assert "pw" not in str(info.value)
        import sys

        monkeypatch.setitem(sys.modules, "resilient._backends._redis", None)
        with pytest.raises(resilient.ConfigError) as info:
            resilient.lock("job", backend="redis://user:secretpw@host")
        assert "resilient[redis]" in str(info.value)
        assert "secretpw" not in str(info.value)

    def test_default_backend_is_the_embedded_file(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """Without a backend a lock uses ``$RESILIENT_LOCK_URL``, else the
        SQLite file in the uid's ``~/.cache/resilient/locks`` (its home from
        the user database: no environment variable moves it)."""
        import pwd

        from resilient._lock import _config

        monkeypatch.delenv(_config.ENV_URL, raising=False)
        home = pwd.getpwuid(os.geteuid()).pw_dir
        want = f"sqlite:///{home}/.cache/resilient/locks/locks.sqlite3"
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.setenv("HOME", str(tmp_path))
        assert resilient.lock("job").url == want
        monkeypatch.setenv(_config.ENV_URL, "memory://env")
        assert resilient.lock("job").url == "memory://env"


class TestStoreFailures:
    def test_a_store_that_does_not_answer_is_retried_then_refused(
        self,
        driver: Driver,
        url: str,
        clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Acquire errors are retried with backoff within the wait; then
        `LockNotAcquired` says the store did not answer, with its error as
        the cause, and a compensating release was sent (the grant may have
        happened with its reply lost)."""
        store = memory.store(url)
        released: list[object] = []
        monkeypatch.setattr(
            store,
            "acquire",
            lambda *a: (_ for _ in ()).throw(ConnectionError("down")),
        )
        real_release = store.release
        monkeypatch.setattr(
            store,
            "release",
            lambda key, owner: (
                released.append(owner) or real_release(key, owner)
            ),
        )
        lock = resilient.lock("job", backend=url, timeout=1.0)
        with pytest.raises(resilient.LockNotAcquired) as info:
            driver.call(lock, lambda: None)
        assert info.value.reason == "unavailable"
        assert info.value.retry_after is None  # The store did not say.
        assert isinstance(info.value.__cause__, ConnectionError)
        assert "did not answer" in str(info.value)
        assert len(released) == 1

    def test_a_grant_that_arrives_too_late_is_given_back(
        self, url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A grant whose reply came after the lease's own validity counts as
        failed: it is released, and the next try gets a fresh lease."""
        store = memory.store(url)
        real = store.acquire
        slow = [True]

        def late(key: LockKey, owner: OwnerToken, ttl: float) -> Any:
            answer = real(key, owner, ttl)
            if slow:
                slow.clear()
                clock.advance(ttl)  # the reply took a whole TTL
            return answer

        monkeypatch.setattr(store, "acquire", late)
        with resilient.lock("job", backend=url, ttl=3.0) as lease:
            assert lease.held
            assert lease.valid_for() > 2.0
        no_leftovers(url)

    async def test_async_store_errors_and_renew_by_hand(
        self, anyio_backend: str, url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The async shell: `Lease.arenew` renews, and raises `LockLost` once
        the store lost the lease; a store that does not answer ends the
        wait with ``"unavailable"``."""
        lock = resilient.lock("job", backend=url, ttl=3.0, timeout=0.05)
        with pytest.raises(resilient.LockLost):  # Leaving says so too.
            async with lock as lease:
                assert await lease.arenew()
                memory.store(url).delete(LockKey.of("job"))
                with pytest.raises(resilient.LockLost):
                    await lease.arenew()
        monkeypatch.setattr(
            memory.AsyncMemoryStore,
            "acquire",
            lambda *a: (_ for _ in ()).throw(ConnectionError("down")),
        )
        with pytest.raises(resilient.LockNotAcquired) as info:
            await lock.aacquire()
        assert info.value.reason == "unavailable"

    def test_renew_by_hand_of_a_lost_lease_raises(self, url: str) -> None:
        """`Lease.renew` on a lease the store no longer has raises
        `LockLost` and marks the lease lost."""
        lease = resilient.lock("job", backend=url).acquire()
        memory.store(url).delete(LockKey.of("job"))
        with pytest.raises(resilient.LockLost):
            lease.renew()
        assert lease.lost
        assert lease.release() is ReleaseResult.NOT_HELD

    def test_lock_needs_a_lock_config(self) -> None:
        """`resilient.Lock` refuses a config that is not a `LockConfig`."""
        with pytest.raises(resilient.ConfigTypeError, match="config"):
            resilient.Lock("job", {"ttl": 1})  # type: ignore[arg-type]
