"""
How a sync waiter of the embedded store is woken (`Waiter`).

**Wake-ups, one per hand-over.** A sync waiter is the thread that will take
the lease, and it waits itself (`Waiter`): it polls the name's FIFO,
``<hash>.wake`` (opened read-write, so that it never reads as hung up),
with its wait's bound, after marking the lock file (its size set to 1: "a
waiter listens"). A holder letting go of a marked file writes a byte into
the FIFO after its ``LOCK_UN``, so the release wakes the waiting thread
itself, which takes the flock without blocking and grants in the same
turn. The first waiter to run drains the byte and wins; if it is slow to
run, the byte is still there and the next waiter's poll sees it too, so the
tail is that of the quickest waiter, not of one chosen thread. A releaser
whose FIFO has no reader clears the mark. A holder killed with ``SIGKILL``
writes nothing; the waiter also looks at the flock every `CHECK` seconds
(``LOCK_NB``): a free flock wakes it. Async waiters are woken by a thread
per name instead (`._files`, `LockFiles.watch`).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import stat
import time
from typing import TYPE_CHECKING, final

from resilient._backends._sqlite._safe import NOFOLLOW, check_file


if TYPE_CHECKING:
    from resilient._backends._base import LockKey
    from resilient._backends._sqlite._files import LockFiles


#: Seconds between a sync waiter's looks at the flock while it waits for
#: a wake-up (a holder killed with SIGKILL sends none).
CHECK: float = 0.01


@final
class Waiter:
    """
    A sync waiter's wake-up: the name's FIFO and a pipe of its own (for
    the cancel scope), polled by the waiting thread with the wait's bound.
    Calling it stops waiting; it never raises from `block`'s I/O errors
    (a wake-up is a hint: the wait's bound and `CHECK` still hold).
    """

    __slots__ = (
        "_fifo",
        "_ino",
        "_open",
        "_pipe",
        "_poll",
        "files",
        "key",
        "woken",
    )

    def __init__(self, files: LockFiles, key: LockKey) -> None:
        self.files = files
        self.key = key
        # Every descriptor, listed as it is made (in the same statement),
        # so that `close` (or `__del__`, after an interrupt) finds it.
        self._open: list[int] = []
        self._fifo: int | None = None
        self.woken = False
        """Whether a release's byte was read and no grant followed yet."""
        self._ino = 0
        self._poll = select.poll()
        self._open.extend(pipe := os.pipe())
        self._pipe = pipe
        for end in self._pipe:
            os.set_blocking(end, False)
        self._poll.register(self._pipe[0], select.POLLIN)
        self._listen()

    def _listen(self) -> None:
        """Open (making it if need be) the name's FIFO and mark the file."""
        if self._fifo is not None:
            self._poll.unregister(self._fifo)
            fifo, self._fifo = self._fifo, None
            _close(self._open, fifo)
        name, flags = (
            f"{self.key.hex}.wake",
            os.O_RDWR | os.O_NONBLOCK | NOFOLLOW,
        )
        dfd = self.files.dfd
        try:
            with contextlib.suppress(FileExistsError):
                os.mkfifo(name, 0o600, dir_fd=dfd)
            # Listed at once, in one line (an interrupt's `close` finds it).
            self._open.append(fifo := os.open(name, flags, dir_fd=dfd))
            # Never a link (O_NOFOLLOW), and only our own FIFO.
            self._ino = check_file(name, fifo, stat.S_IFIFO).st_ino
        except OSError:
            return  # No FIFO here: the CHECK looks still serve.
        self._fifo = fifo
        self._poll.register(fifo, select.POLLIN)
        self.mark()

    def mark(self) -> None:
        """Tell holders that a waiter listens (the lock file's size)."""
        name = f"{self.key.hex}.lock"
        flags, dfd = os.O_WRONLY | os.O_NONBLOCK | NOFOLLOW, self.files.dfd
        with contextlib.suppress(OSError):
            # Listed at once, in one line (an interrupt's `close` finds it).
            self._open.append(fd := os.open(name, flags, dir_fd=dfd))
            try:
                check_file(name, fd)  # Never a link, a FIFO or not ours.
                os.ftruncate(fd, 1)
            finally:
                _close(self._open, fd)

    def wake(self) -> None:
        """End the current `block` (from any thread: the cancel scope)."""
        with contextlib.suppress(OSError):  # full (it will wake) or closed
            os.write(self._pipe[1], b"x")

    def block(self, seconds: float) -> None:
        """
        Wait up to *seconds* for a release, a `wake`, or a free flock
        (looked at every `CHECK` seconds).
        """
        until = time.monotonic() + seconds
        self.mark()  # A releaser since the last wait may have cleared it.
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            ready = self._poll.poll(math.ceil(min(left, CHECK) * 1000))
            if ready:
                for fd, _ in ready:
                    self.woken |= fd == self._fifo
                    _drain(fd)
                return
            if self.files.flock_free(self.key):
                return
            try:
                moved = (
                    os.stat(
                        f"{self.key.hex}.wake",
                        dir_fd=self.files.dfd,
                        follow_symlinks=False,
                    ).st_ino
                    != self._ino
                )
            except OSError:
                moved = True
            if moved:  # Unlinked by an eviction: listen to the new one.
                self._listen()

    def __call__(self) -> None:
        """
        Stop waiting. A release's byte that this waiter read but did not
        act on (it gave up) is passed on if the flock is free.
        """
        if self.woken:
            self.files.flock_free(self.key, poke=True)
        self.close()

    def close(self) -> None:
        """Close the descriptors (idempotent)."""
        self._fifo = None
        _close(getattr(self, "_open", []))

    def __del__(self) -> None:
        self.close()


def _close(fds: list[int], only: int | None = None) -> None:
    """Close *only* (or every descriptor) of *fds*, each taken off first."""
    while fds:
        if only is not None:
            fds.remove(only)
            fd = only
        else:
            fd = fds.pop()
        with contextlib.suppress(OSError):
            os.close(fd)
        if only is not None:
            return


def _drain(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 512):
            pass
