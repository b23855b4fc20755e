"""
Locks under asynchronous exceptions: a KeyboardInterrupt landing at any
line of the acquire, the hold or the release never leaves a lease held
without a renewer or a release (DESIGN section 3, "safe at every bytecode
boundary").
"""

from __future__ import annotations

import linecache
import sys
import threading
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilient
from resilient._backends import _memory as memory
from resilient._core import _clock
from resilient._lock import _lease, _renewer
from resilient._lock import _lock as shell


OURS = ("resilient/_lock/", "resilient/_backends/")


def _is_with(filename: str, lineno: int) -> bool:
    """
    Whether the line is a ``with`` statement. A tracer sees such a line
    again when the block ends, before ``__exit__`` is called; an exception
    raised there skips ``__exit__`` (bpo-29988), for every context manager,
    `threading.Lock` included. Real asynchronous exceptions are checked at
    calls and backward jumps, not there, so the storm skips those lines.
    """
    text = linecache.getline(filename, lineno).strip()
    return text.startswith(("with ", "async with "))


class Interrupt:
    """A trace function that raises KeyboardInterrupt at the n-th line event
    inside the lock's own modules, and (with *statement*) at the lines of
    the test's own ``body`` function too, its ``with`` lines included."""

    def __init__(self, n: int, *, statement: bool = False) -> None:
        self.n = n
        self.seen = 0
        self.fired = False
        self.statement = statement

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if self.statement and code.co_name == "body":
            # The user's with statement: its line is seen again when the
            # block ends, before the exit is called; an exception there
            # skips the exit (bpo-29988), and the lock's hold covers that.
            if event == "line":
                self.fire()
            return self
        if not code.co_filename.replace("\\", "/").endswith(
            tuple(
                f"{d}{f}"
                for d in OURS
                for f in (
                    "_lock.py",
                    "_lease.py",
                    "_attempt.py",
                    "_sync.py",
                    "_async.py",
                    "_hold.py",
                    "_machine.py",
                    "_renewer.py",
                    "_renewals.py",
                    "_renew_thread.py",
                    "_renew_task.py",
                    "_memory.py",
                    "__init__.py",
                    "_base.py",
                )
            )
        ):
            return None
        # Every line, the first line of each exit included. The lines of a
        # `with` over the library's own threading locks are skipped: their
        # exit is a C call, where a real interrupt is checked only after
        # the release, and a tracer's exception there would skip it
        # (bpo-29988), which no real interrupt can do.
        if event == "line" and not _is_with(code.co_filename, frame.f_lineno):
            self.fire()
        return self

    def fire(self) -> None:
        """Raise at the n-th line seen."""
        self.seen += 1
        if self.seen == self.n and not self.fired:
            self.fired = True
            raise KeyboardInterrupt


def settled() -> None:
    """Wait for the releases of abandoned leases (threads of their own)."""
    for thread in threading.enumerate():
        if thread.name == "resilient-lock-abandoned":
            thread.join(5.0)


def leftovers(url: str) -> list[str]:
    """What a lock left behind, if anything."""
    found = []
    if memory.store(url).rows():
        found.append("a row in the store")
    for renewer in list(_renewer._ALL):
        if renewer.backend is memory.store(url) and len(renewer.renewals):
            found.append("a lease the renewer still renews")  # noqa: PERF401
    if [k for k in _lease.HOLDERS if k[0] == url]:
        found.append("a recorded holder")
    if shell.ENTERED.get():
        found.append("an entered block")
    if _clock._SCOPE.get() is not None:
        found.append("a cancel scope left entered")
    return found


def run_interrupted(
    n: int, body: Callable[[], None], *, statement: bool = False
) -> bool:
    """
    Run *body* with an interrupt at the n-th line; whether it fired. An
    interrupt that lands in a ``__del__`` (after a normal release) is
    reported by Python as ignored: collected here, not a failure.
    """
    tracer = Interrupt(n, statement=statement)
    previous = sys.gettrace()  # coverage's, under coverage: put it back
    hook = sys.unraisablehook
    ignored: list[object] = []
    sys.unraisablehook = ignored.append
    sys.settrace(tracer)
    try:
        body()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(previous)
        sys.unraisablehook = hook
    settled()
    return tracer.fired


def test_an_interrupt_at_any_line_leaks_nothing() -> None:
    """A KeyboardInterrupt raised at every line, one run per line, of
    entering, holding and leaving a lock: after each run the store has no
    row, the renewer renews nothing, and no holder or block is recorded."""
    url = f"memory://interrupts-{uuid.uuid4().hex}"
    lock = resilient.lock("job", backend=url, ttl=30.0)

    def body() -> None:
        with lock as lease:
            lease.checkpoint()

    n = 1
    while run_interrupted(n, body):
        assert leftovers(url) == [], f"interrupted at line event {n}"
        n += 1
    assert n > 50  # The runs covered the whole path.
    assert leftovers(url) == []


@pytest.mark.parametrize("library", [None, "asyncio", "trio"])
def test_an_interrupt_at_the_first_line_of_the_exit_leaks_nothing(
    library: str | None,
) -> None:
    """An interrupt at the very first line of the exit the ``with`` / ``async
    with`` statement calls (where no code of the exit can catch it) leaves
    the lease released once the statement has let go of its hold: not
    renewed, no row, no holder, no scope left entered."""
    url = f"memory://interrupts-{uuid.uuid4().hex}"
    lock = resilient.lock("job", backend=url, ttl=30.0)
    names = {"exit", "aexit", "__exit__", "__aexit__"}

    class AtExit:
        fired = False

        def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
            if event == "call" and frame.f_code.co_name in names:
                return self
            if event == "line" and not self.fired:
                self.fired = True
                raise KeyboardInterrupt
            return None

    async def main() -> None:
        previous = sys.gettrace()
        try:
            async with lock:
                sys.settrace(AtExit())
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(previous)
        for _ in range(100):  # The release is a task of this loop.
            if not memory.store(url).rows():
                break
            await anyio.sleep(0.01)

    previous = sys.gettrace()
    try:
        if library is None:
            with lock:
                sys.settrace(AtExit())
        else:
            anyio.run(main, backend=library)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(previous)
    settled()
    assert leftovers(url) == []


def test_an_interrupt_at_any_line_of_the_with_statement_leaks_nothing() -> (
    None
):
    """The storm again, now also at the lines of the caller's own ``with``
    statement, its exit line included (seen before the exit is called; an
    exception there skips the exit, bpo-29988): nothing is left behind."""
    url = f"memory://interrupts-{uuid.uuid4().hex}"
    lock = resilient.lock("job", backend=url, ttl=30.0)

    def body() -> None:
        with lock as lease:
            lease.checkpoint()

    n = 1
    while run_interrupted(n, body, statement=True):
        assert leftovers(url) == [], f"interrupted at line event {n}"
        n += 1
    assert n > 50


def test_an_interrupt_while_waiting_leaks_nothing() -> None:
    """The same while waiting for a held lock (non-blocking and timed
    tries through the wake-up machinery)."""
    url = f"memory://interrupts-{uuid.uuid4().hex}"
    lock = resilient.lock("job", backend=url, timeout=0.01)
    from resilient._backends import LockKey, OwnerToken

    key, owner = LockKey.of("job"), OwnerToken()
    memory.store(url).acquire(key, owner, 30.0)

    def body() -> None:
        try:
            with lock:
                pass
        except resilient.LockNotAcquired:
            pass

    n = 1
    while run_interrupted(n, body):
        assert memory.store(url).rows() == 1  # Only the other holder's.
        assert not [k for k in _lease.HOLDERS if k[0] == url]
        n += 1
    memory.store(url).release(key, owner)
    assert leftovers(url) == []


@settings(max_examples=60, deadline=None)
@given(
    delays=st.lists(
        st.floats(min_value=0, max_value=0.004), min_size=1, max_size=6
    ),
    library=st.sampled_from(["asyncio", "trio"]),
)
def test_random_cancellations_leak_nothing(
    delays: list[float], library: str
) -> None:
    """Tasks contending for one lock, each cancelled after a random delay
    (waiting, just granted, holding or releasing): at the end nothing is
    held, renewed or recorded, and no task is left."""
    url = f"memory://cancel-{uuid.uuid4().hex}"
    lock = resilient.lock("job", backend=url, ttl=30.0)

    async def worker(delay: float) -> None:
        with anyio.move_on_after(delay):
            async with lock:
                await anyio.sleep(0.001)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for delay in delays:
                tg.start_soon(worker, delay)

    anyio.run(main, backend=library)
    assert leftovers(url) == []


@pytest.mark.parametrize("where", ["acquire", "release"])
def test_an_interrupt_inside_the_backend_call_compensates(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt raised by the store call itself (after the store granted,
    before the reply was read) is compensated: the grant is released."""
    url = f"memory://interrupts-{uuid.uuid4().hex}"
    store = memory.store(url)
    real = getattr(store, where)

    def granted_then_interrupted(*args: Any) -> Any:
        real(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(store, where, granted_then_interrupted)
    with pytest.raises(KeyboardInterrupt):  # noqa: SIM117
        with resilient.lock("job", backend=url):
            pass
    monkeypatch.undo()
    assert leftovers(url) == []
