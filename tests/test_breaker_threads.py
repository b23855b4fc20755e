"""
RELIABILITY test 18: one breaker, 32 threads, 10,000 calls each, threads
switched every microsecond. Every call is counted exactly once, as a
success, a failure, a rejection or an ignored call; a raising listener
changes nothing; the half-open limit holds; and the call runs outside the
breaker's lock (32 calls are inside the protected function at once).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest

import resilient
from resilient import BreakerConfig, BreakerState, CircuitOpen, CountWindow


THREADS: Final = 32
CLOSED_CALLS: Final = 7_500
"""Each thread's calls while closed; the rest of its 10,000 are rejected."""
OPEN_CALLS: Final = 2_500


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    resilient.testing.reset_registries()
    yield
    resilient.testing.reset_registries()


@contextlib.contextmanager
def _switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _in_threads(work: Callable[[int], object]) -> None:
    """*work(n)* in 32 threads at once; re-raise the first error."""
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            start.wait()
            work(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    with _switching():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def test_every_call_is_counted_exactly_once(clock: Any) -> None:
    """
    32 x 10,000 calls (decorator, with, permit; successes, failures and
    ignored calls while closed, then rejections once a raising listener
    has heard the breaker open): successes + failures + rejections +
    ignored equal the calls exactly, and the window holds what the
    callers saw.
    """
    cb = resilient.breaker(
        "threads-18",
        BreakerConfig(
            window=CountWindow(1_000_000),
            minimum_calls=100,
            failure_rate=0.5,
            open_interval=3600.0,
            max_open_interval=3600.0,
            failure_on=ConnectionError,
            ignore_on=LookupError,
        ),
    )
    heard: list[object] = []

    def raising(event: object) -> None:
        heard.append(event)
        raise RuntimeError("a listener that raises")

    cb.add_listener(raising)

    def fn(kind: int) -> None:
        if kind == 1:
            raise ConnectionError
        if kind == 2:
            raise LookupError

    guarded = cb(fn)
    seen = [[0, 0, 0, 0] for _ in range(THREADS)]  # ok, failed, ignored, rej.

    def one(kind: int, form: int) -> None:
        if form == 0:
            guarded(kind)
        elif form == 1:
            with cb:
                fn(kind)
        else:
            permit = cb.acquire()
            try:
                fn(kind)
            except BaseException as exc:
                permit.failure(exc)
                raise
            permit.success()

    def calls(n: int, count: int) -> None:
        mine = seen[n]
        for i in range(count):
            # Failures one call in four, never first: the rate stays below
            # a half from the start, so the breaker stays closed.
            kind = 1 if i % 4 == 3 else 2 if i % 10 == 5 else 0
            try:
                one(kind, (i + n) % 3)
            except ConnectionError:
                mine[1] += 1
            except LookupError:
                mine[2] += 1
            except CircuitOpen:
                mine[3] += 1
            else:
                mine[0] += 1

    _in_threads(lambda n: calls(n, CLOSED_CALLS))
    ok, failed, ignored, rejected = map(sum, zip(*seen, strict=True))
    s = cb.statistics()
    assert s.state is BreakerState.CLOSED
    assert rejected == 0
    assert (s.calls - s.failures, s.failures) == (ok, failed)
    assert ok + failed + ignored == THREADS * CLOSED_CALLS

    # Open it (its listener raises), then every call is rejected, counted
    # by the lock-free rejection.
    cb.reset()
    for _ in range(100):
        with contextlib.suppress(ConnectionError):
            guarded(1)
    assert cb.state is BreakerState.OPEN
    assert heard
    seen = [[0, 0, 0, 0] for _ in range(THREADS)]
    _in_threads(lambda n: calls(n, OPEN_CALLS))
    s = cb.statistics()
    assert [sum(x) for x in zip(*seen, strict=True)] == [
        0,
        0,
        0,
        THREADS * OPEN_CALLS,
    ]
    assert s.rejected == THREADS * OPEN_CALLS
    assert (s.calls, s.failures) == (100, 100)  # The window is untouched.


def test_half_open_limit_holds_under_32_threads(clock: Any) -> None:
    """
    32 threads call a half-open breaker at once, each probe held inside
    the protected function until every thread has been admitted or
    rejected: exactly half_open_probes get in, the 29 others are
    rejected, and the probes' successes close it.
    """
    cb = resilient.breaker(
        "threads-18-half",
        BreakerConfig(
            window=CountWindow(4),
            minimum_calls=2,
            open_interval=10.0,
            half_open_probes=3,
            probe_timeout=3600.0,
        ),
    )
    for _ in range(2):
        cb.acquire().failure(ConnectionError())
    clock.advance(11.0)
    lock = threading.Lock()
    inside = [0, 0]  # now, peak
    done = threading.Semaphore(0)
    release = threading.Event()
    rejected: list[CircuitOpen] = []

    @cb
    def probe() -> None:
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
        done.release()
        assert release.wait(30.0)
        with lock:
            inside[0] -= 1

    def work(n: int) -> None:
        try:
            probe()
        except CircuitOpen as exc:
            rejected.append(exc)
            done.release()

    runner = threading.Thread(target=_in_threads, args=(work,))
    runner.start()
    for _ in range(THREADS):
        assert done.acquire(timeout=30.0)
    release.set()
    runner.join()
    assert (inside[1], len(rejected)) == (3, THREADS - 3)
    assert cb.state is BreakerState.CLOSED


def test_the_call_runs_outside_the_lock() -> None:
    """
    32 threads call through one closed breaker a function that waits for
    all 32 to be inside it at once: it returns in every thread, so no lock
    is held around the call (the timing-free form of "32 concurrent
    100 ms calls finish in < 300 ms").
    """
    cb = resilient.breaker("threads-18-lock")
    together = threading.Barrier(THREADS, timeout=30.0)

    @cb
    def call() -> int:
        return together.wait()

    with cb:  # The block form too: nothing of the block holds the lock.
        pass
    _in_threads(lambda n: call())
    assert cb.statistics().calls == THREADS + 1
