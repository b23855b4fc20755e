"""
How the embedded store wakes its waiters: a sync waiter polls the name's
FIFO itself (no helper thread; one wake-up per hand-over), looks at the
flock for a holder that died without a release, passes on a wake-up it
did not use, and a waiter of a live lease writes nothing. Real time,
short and bounded.
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import resilient
from resilient._backends import Busy, Grant, LockKey, OwnerToken, open_backend
from resilient._backends._sqlite import _files
from tests.test_lock_sqlite import HOLDER, expect, start


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An embedded store in this test's own directory."""
    return f"sqlite:///{tmp_path / 'locks.sqlite3'}"


def _wakers() -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name == "resilient-lock-waker"
    ]


def test_a_sync_waiter_is_woken_by_the_release_without_a_helper_thread(
    url: str,
) -> None:
    """A thread waiting for a held lock (backoff 10 s) starts no waker
    thread: it polls the name's FIFO itself, and the release's byte wakes
    it long before its backoff would."""
    holder = resilient.lock("job", backend=url).acquire()
    waiter = resilient.lock(
        "job", backend=url, timeout=20, backoff=resilient.Constant(seconds=10)
    )
    got: list[int] = []

    def wait() -> None:
        lease = waiter.acquire()
        got.append(lease.token)
        lease.release()

    thread = threading.Thread(target=wait)
    before = set(_wakers())  # Async waiters of earlier tests may linger.
    thread.start()
    time.sleep(0.2)  # It waits: tried, listens, tried again.
    assert not got
    assert set(_wakers()) <= before
    mine = holder.token
    holder.release()
    thread.join(5)
    assert got
    assert got[0] > mine


def test_a_waiter_of_a_live_lease_sends_no_write(url: str) -> None:
    """A try that finds the lease held and live by another owner answers
    from a read: no UPSERT that would queue on SQLite's write lock behind
    the grant it waits for."""
    backend = open_backend(url)
    key = LockKey.of("job")
    holder = OwnerToken()
    assert isinstance(backend.acquire(key, holder, 30.0), Grant)
    statements: list[str] = []
    conn: sqlite3.Connection = backend._conn  # type: ignore[attr-defined]
    conn.set_trace_callback(statements.append)
    try:
        busy = backend.acquire(key, OwnerToken(), 30.0)
    finally:
        conn.set_trace_callback(None)
    assert isinstance(busy, Busy)
    assert busy.expires_in is not None
    assert 25 < busy.expires_in <= 30
    assert [s for s in statements if "INSERT" in s] == []
    backend.release(key, holder)


def test_a_waiter_sees_a_killed_holder_without_a_release(url: str) -> None:
    """RELIABILITY test 2 with the waiter already waiting (backoff 10 s): a
    holder killed with SIGKILL sends no wake-up, but its flock dies with it
    and the waiter's look at the flock (every `CHECK`) takes the lease,
    long before the 30 s TTL or the backoff."""
    child = start(HOLDER, url)
    try:
        expect(child, "held")
        waiter = resilient.lock(
            "job",
            backend=url,
            timeout=20,
            backoff=resilient.Constant(seconds=10),
        )
        got: list[float] = []

        def wait() -> None:
            lease = waiter.acquire()
            got.append(lease.waited)
            lease.release()

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        assert not got
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        thread.join(5)
        assert got
        assert got[0] < 5
    finally:
        child.kill()
        child.communicate(timeout=10)


def test_a_wake_up_read_but_not_used_is_passed_on(url: str) -> None:
    """Two waiters of one name; a release's byte is read by the first,
    which then stops waiting without taking the lock: it writes the byte
    again, so the second wakes on a wake-up (not only on its next look at
    the flock)."""
    backend: Any = open_backend(url)
    files: _files.LockFiles = backend.files
    key = LockKey.of("job")
    owner = OwnerToken()
    assert isinstance(backend.acquire(key, owner, 30.0), Grant)
    first, second = backend.waiter(key), backend.waiter(key)
    try:
        backend.release(key, owner)  # The file is marked: a byte is sent.
        first.block(5.0)
        assert first.woken
        first()  # Gives up: passes the byte on.
        second.block(5.0)
        assert second.woken
    finally:
        first.close()
        second.close()
    assert files.held == {}


FDS = Path("/proc/self/fd")


def _ours(folder: Path) -> set[tuple[str, str]]:
    """This process's descriptors of files in *folder*, and its pipes
    (other threads of the suite may open and close other files meanwhile)."""
    found = set()
    for fd in FDS.iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith((str(folder), "pipe:")):
                found.add((fd.name, target))
    return found


class _Interrupt:
    """
    KeyboardInterrupt at the n-th line of a sync waiter's own code (the
    `Waiter` and the shell's wait; the store's flock code under it is not
    made for a tracer that raises at ``except`` lines); not at a ``with``
    line, where a tracer's exception would skip the exit
    (bpo-29988), which no real interrupt can do (as in
    ``tests/test_lock_interrupts.py``).
    """

    FILES = ("_sqlite/_waiter.py", "_lock/_sync.py")

    def __init__(self, n: int) -> None:
        self.n, self.seen, self.fired = n, 0, False

    def __call__(self, frame: FrameType, event: str, arg: object) -> Any:
        if not frame.f_code.co_filename.replace("\\", "/").endswith(
            self.FILES
        ):
            return None
        code = frame.f_code
        ours = (
            code.co_qualname.startswith("Waiter.") or code.co_name == "_wait"
        )
        line = linecache.getline(code.co_filename, frame.f_lineno)
        if ours and event == "line" and not line.strip().startswith("with "):
            self.seen += 1
            if self.seen == self.n and not self.fired:
                self.fired = True
                self.where = (frame.f_code.co_filename, frame.f_lineno)
                raise KeyboardInterrupt
        return self


@pytest.mark.skipif(not FDS.exists(), reason="needs /proc")
def test_an_interrupt_anywhere_in_the_wait_leaks_nothing(
    url: str, tmp_path: Path
) -> None:
    """A KeyboardInterrupt at any line of a waiting acquire on the embedded
    store (the FIFO, the pipe, the looks at the flock) leaves no descriptor
    open, no lease of ours and no flock held: the other holder's lease is
    the only one, and a later acquire after its release is granted.

    The holder's lease lasts an hour: the loop makes one interrupted acquire
    per line of the wait, which took over 30 s under a loaded full run, and
    a 30 s lease expired in the middle of it (an acquire was then rightly
    granted, and the last step found the lock already held by this
    thread)."""
    backend: Any = open_backend(url)
    key, holder = LockKey.of("job"), OwnerToken()
    assert isinstance(backend.acquire(key, holder, 3600.0), Grant)
    lock = resilient.lock("job", backend=url, timeout=0.03)
    with pytest.raises(resilient.LockNotAcquired):
        lock.acquire()  # Warm: the connection and cached descriptors.
    gc.collect()
    baseline = _ours(tmp_path)
    n = 1
    while n < 2000:
        tracer = _Interrupt(n)
        previous = sys.gettrace()
        # An interrupt landing in a `__del__` (the collector's) is ignored
        # by Python and reported as unraisable: collected, not a failure.
        hook, sys.unraisablehook = sys.unraisablehook, lambda _: None
        sys.settrace(tracer)
        try:
            lock.acquire()
        except (KeyboardInterrupt, resilient.LockNotAcquired):
            pass
        finally:
            sys.settrace(previous)
            sys.unraisablehook = hook
        if not tracer.fired:
            break
        gc.collect()
        leaked = _ours(tmp_path) - baseline
        assert not leaked, (tracer.where, leaked)
        assert len(backend.files.held) == 1  # Only the holder's flock.
        n += 1
    assert n > 10  # The wait's lines were reached.
    backend.release(key, holder)
    with lock as lease:
        assert lease.held
