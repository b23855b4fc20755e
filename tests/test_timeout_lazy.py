"""
A sync scope makes the event its sleeps wait on only when a sleep first
needs it: a scope nobody sleeps in (a lock's block, most often) builds
none, and one made late still wakes on a cancel that came before it, or
one from another thread while it waits, nested scopes included.

The real waits here are 5 s sleeps woken after about 10 ms; the check is
only that they woke well before their end.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import resilient
from resilient import _timeout
from resilient._backends import LockKey
from resilient._backends import _memory as memory
from resilient._core import _clock


REAL_SLEEP = 5.0  # What a woken sleep would have waited.
PROMPTLY = 1.0  # "Woke at once", with room for a loaded machine.


def _cancel_soon(cancel: object) -> threading.Timer:
    assert callable(cancel)
    timer = threading.Timer(0.01, cancel)
    timer.start()
    return timer


def test_a_scope_nobody_sleeps_in_builds_no_event() -> None:
    """Entering, nesting in, registering a waker with and cancelling a
    scope make no event: only a sleep does."""
    woken: list[int] = []
    with resilient.timeout(None) as outer:
        inner = resilient.timeout(None)
        with inner, _timeout.wake_on_cancel(lambda: woken.append(1)):
            outer.cancel()
        assert inner.cancelled
    assert woken == [1]
    assert outer._event is None
    assert inner._event is None


def test_the_event_made_after_a_cancel_is_already_set() -> None:
    """The first sleep after a cancel (of the scope, or of the enclosing
    one before this scope was entered) gets an event that is already set:
    it cannot wait for a wake-up that has already happened."""
    with resilient.timeout(None) as outer:
        outer.cancel()
        with resilient.timeout(None) as inner:
            assert inner._sleeper().is_set()
        assert outer._sleeper().is_set()


def test_a_sleep_in_a_nested_scope_wakes_on_the_outer_cancel() -> None:
    """A real sleep in a scope nested in another, each entered with no
    event, wakes at once when another thread cancels the outer scope."""
    clock = _clock.get_clock()
    with resilient.timeout(None) as outer, resilient.timeout(None) as inner:
        assert inner._event is None
        _cancel_soon(outer.cancel)
        start = time.monotonic()
        clock.sleep(REAL_SLEEP)
    assert time.monotonic() - start < PROMPTLY
    assert outer.cancelled_caught
    assert not inner.cancelled_caught


def test_a_second_sleep_reuses_the_event_and_wakes_again() -> None:
    """The event made by a first sleep is kept: a second sleep in the same
    scope still wakes on a cancel from another thread."""
    clock = _clock.get_clock()
    with resilient.timeout(None) as scope:
        clock.sleep(0.001)
        first = scope._event
        assert first is not None
        _cancel_soon(scope.cancel)
        start = time.monotonic()
        clock.sleep(REAL_SLEEP)
    assert scope._event is first
    assert time.monotonic() - start < PROMPTLY


class TestTheLockBlock:
    """The lock's block scope, which the lease's loss cancels."""

    @pytest.fixture
    def url(self) -> str:
        """A memory store of this test's own."""
        return f"memory://lazy-scope-{uuid.uuid4().hex}"

    def test_a_lock_block_nobody_sleeps_in_builds_no_event(
        self, url: str
    ) -> None:
        """An uncontended lock block that does not sleep makes no event
        for its scope."""
        with resilient.lock("job", backend=url) as lease:
            scope = lease._scope
            assert scope is not None
        assert scope._event is None

    def test_a_sleep_in_a_nested_scope_wakes_on_loss(self, url: str) -> None:
        """A sleep started in a scope nested in the lock's block, after the
        block was entered without an event, wakes when the lease is lost
        (the store forgot it, the renewer notices), and the block ends
        with `LockLost`."""
        lock = resilient.lock("job", backend=url, ttl=0.3)
        start = time.monotonic()
        with pytest.raises(resilient.LockLost), lock as lease:
            scope = lease._scope
            assert scope is not None
            assert scope._event is None
            memory.store(url).delete(LockKey.of("job"))
            with resilient.timeout(None):
                resilient.MonotonicClock().sleep(30.0)
        assert time.monotonic() - start < 10.0

    def test_a_sleep_after_the_loss_raises_lock_lost_at_once(
        self, url: str
    ) -> None:
        """The lease lost before any sleep in the block: the first sleep
        (its event made then) does not wait, and the block ends with
        `LockLost`."""
        lock = resilient.lock("job", backend=url, ttl=0.3)
        with pytest.raises(resilient.LockLost), lock as lease:
            scope = lease._scope
            assert scope is not None
            memory.store(url).delete(LockKey.of("job"))
            deadline = time.monotonic() + 10.0
            while not scope.cancelled and time.monotonic() < deadline:
                time.sleep(0.005)
            assert scope._event is None
            start = time.monotonic()
            resilient.MonotonicClock().sleep(30.0)
        assert time.monotonic() - start < PROMPTLY
