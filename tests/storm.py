"""
A storm of asynchronous exceptions, for tests that prove state survives one
landing at any bytecode boundary.

Two sources, the two the library must survive:

- `storm` runs *body* in a loop in worker threads and throws `Storm` into
  them with ``PyThreadState_SetAsyncExc``, one at a time, each after a
  random delay, so it lands wherever the worker happens to be: inside the
  library's ``__enter__``, its ``finally``, between two statements of its
  bookkeeping.
- `interrupt_storm` runs *body* in the main thread inside
  ``resilient.timeout(d, interrupt=True)`` with a random tiny *d*, so the
  scope's ``SIGALRM`` interrupt fires at a random point of *body* (or of
  the scope's own entry and exit).

Usage::

    def body() -> None:
        with resilient.timeout(1e-3):
            with bulkhead:
                resilient.checkpoint()

    def finish() -> None:  # runs in each worker once the storm is over
        assert resilient.remaining() == math.inf

    result = storm(body, exceptions=2_000, threads=2, finish=finish)
    result.check()            # every exception landed; no other error
    assert bulkhead.in_use == 0

The protocol makes each landing count exactly once: a worker announces that
it is inside its guarded loop, the firer waits a random delay, throws one
`Storm`, and waits until the worker reports that it landed before it throws
the next; so no second exception can hit the harness's own handler. A
`Storm` that *body* (or the library) swallows is reported in
`StormResult.swallowed`; one that something replaced with another exception
(the `Storm` is its ``__context__`` or ``__cause__``) in
`StormResult.replaced`; any other exception out of *body* in
`StormResult.errors`. `StormResult.check` fails on all three.

Under a tracer (coverage, a debugger) an exception thrown by `storm` can
land inside the tracer's own Python code and be lost there, and the storm
then waits out its patience for each: mark such tests `untraced`.

Only CPython has ``PyThreadState_SetAsyncExc``; the exception is delivered
at the target's next eval-breaker check (a call returning, a loop's back
edge, a function's entry), so a thread blocked in C receives it only when
the C call returns: keep *body*'s waits short.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final, final

import pytest

import resilient
from resilient.exceptions import DeadlineExceeded, ScopeCancelled


__all__ = [
    "Storm",
    "StormResult",
    "interrupt_storm",
    "storm",
    "unlocked",
    "untraced",
]

untraced: Final = pytest.mark.skipif(
    sys.gettrace() is not None,
    reason="asynchronous exceptions get lost inside a tracer (coverage)",
)
"""Skips a `storm` test under a tracer (see the module's docstring)."""


class Storm(BaseException):
    """The exception a storm throws; a BaseException like KeyboardInterrupt."""


_set_async_exc: Final = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def unlocked(lock: threading.Lock | threading.RLock) -> bool:
    """
    Whether *lock* is free: held by no thread, this one included (an
    `threading.RLock` has no ``locked()`` before Python 3.14, and this
    thread could take it again without waiting).
    """
    owned = getattr(lock, "_is_owned", None)
    if owned is not None and owned():
        return False
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


def _throw(ident: int, exc: type[BaseException] | None) -> int:
    """Throw *exc* into thread *ident* (None clears a pending one)."""
    return int(
        _set_async_exc(
            ctypes.c_ulong(ident),
            ctypes.py_object(exc) if exc is not None else ctypes.py_object(),
        )
    )


@final
class StormResult:
    """What a storm did; `check` asserts it went as planned."""

    __slots__ = (
        "errors",
        "fired",
        "iterations",
        "landed",
        "replaced",
        "swallowed",
    )

    def __init__(self) -> None:
        self.fired = 0
        """Exceptions thrown (or interrupts armed)."""
        self.landed = 0
        """Exceptions that reached the harness as themselves."""
        self.iterations = 0
        """Calls of *body* that returned normally (roughly: the workers
        count without a lock)."""
        self.swallowed = 0
        """Exceptions that never came out of *body* (within the wait)."""
        self.replaced: list[BaseException] = []
        """Exceptions that came out in place of a storm exception."""
        self.errors: list[BaseException] = []
        """Other exceptions out of *body* or *finish*."""

    def __repr__(self) -> str:
        return (
            f"StormResult(fired={self.fired}, landed={self.landed}, "
            f"iterations={self.iterations}, swallowed={self.swallowed}, "
            f"replaced={self.replaced[:5]!r}, errors={self.errors[:5]!r})"
        )

    def check(self) -> None:
        """Fail unless every exception landed and nothing else went wrong."""
        assert not self.errors, self
        assert not self.replaced, self
        assert self.swallowed == 0, self
        assert self.landed == self.fired, self


def _is_storm(
    exc: BaseException,
    kind: type[BaseException] | tuple[type[BaseException], ...],
) -> bool:
    """Whether *kind* is somewhere in *exc*'s chain (not *exc* itself)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link = link.__cause__ or link.__context__
        if isinstance(link, kind):
            return True
    return False


@final
class _Worker:
    """One target thread: loops *body*, reports each storm that lands."""

    __slots__ = (
        "body",
        "failed",
        "finish",
        "inside",
        "kind",
        "landed",
        "result",
        "stop",
        "thread",
    )

    def __init__(
        self,
        body: Callable[[], object],
        finish: Callable[[], object] | None,
        kind: type[BaseException],
        result: StormResult,
    ) -> None:
        self.body = body
        self.finish = finish
        self.kind = kind
        self.result = result
        self.inside = threading.Event()
        self.failed = threading.Event()
        self.landed = threading.Semaphore(0)
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        """The thread: the guarded loop, then *finish*."""
        try:
            self.loop()
        except self.kind:  # pragma: no cover - only after another error
            self.landed.release()
        if self.finish is not None:
            try:
                self.finish()
            except BaseException as exc:
                self.result.errors.append(exc)

    def spin(self) -> None:
        """
        Run *body* until stopped: a frame of its own, so an exception that
        lands anywhere in it, the loop's back edge included, comes out of
        the call, inside `loop`'s ``try`` (CPython 3.13 checks for one at a
        back edge that its exception table leaves outside a ``try`` written
        around the loop: the harness's own self-test lost it there).
        """
        result = self.result
        self.inside.set()
        while not self.stop:
            self.body()
            result.iterations += 1

    def loop(self) -> None:
        """Run *body* until stopped; count what comes out of it."""
        result = self.result
        while not self.stop:
            try:
                self.spin()
            except self.kind:
                self.inside.clear()
                result.landed += 1
                self.landed.release()
            except BaseException as exc:
                self.inside.clear()
                if _is_storm(exc, self.kind):
                    result.replaced.append(exc)
                    self.landed.release()
                else:
                    # Stop at the first other error: a broken body would
                    # only repeat it (and a storm may be in flight).
                    result.errors.append(exc)
                    self.stop = True
                    self.failed.set()
                    self.landed.release()


@contextlib.contextmanager
def _switch_interval(seconds: float) -> Iterator[None]:
    """Switch threads often, so the firer gets the GIL at random points."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def storm(
    body: Callable[[], object],
    *,
    exceptions: int,
    threads: int = 1,
    max_delay: float = 2e-4,
    seed: int = 0,
    finish: Callable[[], object] | None = None,
    kind: type[BaseException] = Storm,
    patience: float = 2.0,
) -> StormResult:
    """
    Throw *exceptions* asynchronous exceptions into *threads* worker
    threads that loop *body*, then run *finish* in each worker.

    Args:
        body: What each worker runs over and over (it should take
            microseconds, not seconds, and wait only briefly in C).
        exceptions: How many to throw, spread over the workers at random.
        threads: Worker threads.
        max_delay: Each throw waits uniformly up to this long (seconds)
            after the worker is back in its loop.
        seed: Seeds the delays and the choice of worker.
        finish: Runs in each worker thread after the storm (no exception
            can hit it): check per-thread state here (context variables,
            the current span); what it raises lands in `errors`.
        kind: The exception class thrown; `Storm` by default.
        patience: Seconds to wait for a thrown exception to come out of
            *body* before counting it swallowed.

    Returns:
        The counts; call `StormResult.check` to assert a clean storm.
    """
    rng = random.Random(seed)
    result = StormResult()
    workers = [_Worker(body, finish, kind, result) for _ in range(threads)]
    with _switch_interval(1e-5):
        for w in workers:
            w.thread.start()
        try:
            for _ in range(exceptions):
                w = rng.choice(workers)
                if not w.inside.wait(patience) or w.failed.is_set():
                    break  # The worker failed or is stuck: reported below.
                time.sleep(rng.uniform(0.0, max_delay))
                ident = w.thread.ident
                assert ident is not None
                if _throw(ident, kind) != 1:
                    break  # pragma: no cover - the thread is gone
                result.fired += 1
                if not w.landed.acquire(timeout=patience):
                    result.swallowed += 1
                    # Clear it if still pending, so it cannot land later.
                    _throw(ident, None)
                if w.failed.is_set():
                    break
        finally:
            for w in workers:
                w.stop = True
            for w in workers:
                w.thread.join(patience * 5)
                if w.thread.is_alive():
                    result.errors.append(
                        RuntimeError(f"worker {w.thread.name} hung")
                    )
    return result


def interrupt_storm(
    body: Callable[[], object],
    *,
    firings: int,
    max_delay: float = 2e-4,
    seed: int = 0,
) -> StormResult:
    """
    In the main thread, *firings* times: run *body* in a loop inside
    ``resilient.timeout(d, interrupt=True)`` with *d* uniform in
    (0, *max_delay*] seconds, until the scope's ``SIGALRM`` interrupt
    stops it with `resilient.TimedOut`.

    A firing that something replaced with another exception is in
    `StormResult.replaced`; any other error is in `StormResult.errors` and
    stops the storm.
    Afterwards the alarm must be disarmed and the handler back: this
    checks both (as errors).

    Returns:
        The counts (``fired`` is the number of scopes run, ``landed`` those
        that ended in `resilient.TimedOut`).
    """
    assert threading.current_thread() is threading.main_thread()
    rng = random.Random(seed)
    result = StormResult()
    handler = signal.getsignal(signal.SIGALRM)
    for _ in range(firings):
        result.fired += 1
        try:
            with resilient.timeout(
                rng.uniform(1e-6, max_delay), interrupt=True
            ):
                while True:
                    body()
                    result.iterations += 1
        except resilient.TimedOut:
            result.landed += 1
        except BaseException as exc:
            if _is_storm(exc, (DeadlineExceeded, ScopeCancelled)):
                result.replaced.append(exc)
            else:
                result.errors.append(exc)
                break
    if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
        result.errors.append(RuntimeError("an alarm is still armed"))
    if signal.getsignal(signal.SIGALRM) is not handler:
        result.errors.append(RuntimeError("the SIGALRM handler changed"))
    return result
