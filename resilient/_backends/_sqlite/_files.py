"""
The embedded store's flock per lock name, kept and cached.

A holder keeps ``flock(LOCK_EX)`` on ``<db>.locks/<sha256 of the name>.lock``
beside its row, and the row records that it does. The flock only ever wakes
waiters and proves death (the kernel drops a dead process's flocks); the
row grants and fences. A process that holds the flock may take over a row
whose holder recorded the flock, because that holder must be gone. Why the
takeover is safe: the path's inode changes only when a process that holds
that inode's flock unlinks it, and a process that gets a flock checks that
its inode is still the path's, so while a holder that recorded the flock
lives, no one else can hold the flock of the path's inode.

The costs of an uncontended hold, kept low: each process keeps the
descriptors of the lock files it used lately open, unlocked, in a bounded
cache (`FD_CACHE` per store), so a hold is one ``flock`` and one ``stat`` to
take the file, and one ``flock`` and one ``fstat`` to let it go; a file is
unlinked only when its descriptor leaves the cache (or the store is
closed, or the process exits), under its flock and after the inode check,
so no waiter is ever left holding an unlinked file that the next holder
would not see. A process killed with ``SIGKILL`` leaves at most `FD_CACHE`
empty files, which the next user of those names reuses.

Wake-ups: a sync waiter waits itself, on the name's FIFO (`._waiter`); a
release of a file a waiter marked writes it a byte (`LockFiles.poke`).
An async waiter's event loop cannot block, so its wake-up is a helper
thread per name that blocks on the flock (`LockFiles.watch`) and then tells
the loop: two wake-ups, but no poll.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Final, final

from resilient._backends._sqlite._safe import (
    NOFOLLOW,
    check_file,
    open_dir,
    open_file,
)
from resilient._backends._sqlite._waiter import Waiter


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._backends._base import LockKey


#: How long a free lease whose flock someone else holds (a waiter that is
#: about to take it) is left to that waiter before it is taken without the
#: flock (the flock's holder may be stopped), in nanoseconds.
CONTESTED_NS: Final = 50_000_000

#: How many unlocked lock-file descriptors a store keeps open for reuse.
FD_CACHE: int = 64

_HELD: Final = frozenset({errno.EWOULDBLOCK, errno.EAGAIN})

#: Every lock-file descriptor of this process (forked children close them:
#: a child's copy would keep a dead parent's flock).
OPEN: Final[set[int]] = set()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    OPEN.discard(fd)


def close_inherited() -> None:
    """In a forked child: close every lock-file descriptor of the parent."""
    for fd in list(OPEN):
        _close(fd)


@final
class _Name:
    """One name's flock state in this process (an async waiter's wake-up)."""

    __slots__ = ("fd", "thread", "watchers")

    def __init__(self) -> None:
        self.fd: tuple[int, int] | None = None
        """A flock this process holds for the name but no lease uses."""
        self.watchers: list[Callable[[], None]] = []
        self.thread: threading.Thread | None = None


@final
class LockFiles:
    """The lock files of one store in one process: flocks and wake-ups."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self._prefix = f"{directory}/"
        self.dfd = -1
        """The lock directory's descriptor (`open`): every file is opened
        relative to it, never following a link (`._safe`)."""
        self._dir_lock = threading.Lock()
        self.lock = threading.Lock()
        """Guards this object's maps (the store's statements use it too)."""
        self.names: dict[bytes, _Name] = {}
        # Held flocks by owner secret: (descriptor, inode, key digest).
        self.held: dict[bytes, tuple[int, int, bytes]] = {}
        # Unlocked descriptors kept for reuse, by key digest, oldest first.
        self.fds: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self.contested: dict[bytes, int] = {}

    def path(self, key: LockKey) -> str:
        """The lock file of *key* (for messages and tests)."""
        return f"{self._prefix}{key.hex}.lock"

    def open(self, failed: int = -1) -> None:
        """
        Open the lock directory, making it if need be (again, if *failed*,
        the descriptor in use, was found removed); refused if it is a link,
        another user's, or writable by others and not sticky. A descriptor
        replaced is kept open, not closed: another thread may be using it
        (one descriptor per removal of the directory).
        """
        with self._dir_lock:
            if self.dfd != failed:
                return  # Opened already, or by another thread meanwhile.
            self.dfd = open_dir(self.dir)

    def inode(self, name: str) -> int | None:
        """The inode of *name* in the lock directory, or None if none."""
        try:
            return os.stat(name, dir_fd=self.dfd, follow_symlinks=False).st_ino
        except FileNotFoundError:
            return None

    def still_held(self, secret: bytes) -> bool:
        """
        Whether the lock file of the flock held for *secret* is still its
        name's (not unlinked, its directory not removed); True if none.
        """
        held = self.held.get(secret)
        if held is None:
            return True
        try:
            return self.inode(f"{held[2].hex()}.lock") == held[1]
        except OSError:
            return False

    def after_fork(self) -> None:
        """A forked child owns none of the parent's flocks."""
        # The at-fork hook closed our copies of the descriptors already
        # (`close_inherited`: closing them again could close a descriptor
        # the child has opened since under the same number).
        self.held.clear()
        self.fds.clear()
        self.names.clear()
        self.lock = threading.Lock()
        self._dir_lock = threading.Lock()

    # -- taking and letting go -------------------------------------------

    def open_locked(self, name: str, *, block: bool) -> tuple[int, int] | None:
        """
        Open the lock file *name* and flock it (waiting if *block*): the
        descriptor and its inode, or None if it is held. The inode is
        checked after the flock, so a file unlinked meanwhile is never the
        one held. A removed lock directory is made again.
        """
        reopened = False
        while True:
            fd = -1
            try:
                try:
                    dfd = self.dfd
                    fd, st = open_file(
                        name, dir_fd=dfd, shown=f"{self._prefix}{name}"
                    )
                except FileNotFoundError:
                    if reopened:
                        raise
                    reopened = True  # The directory was removed.
                    self.open(dfd)
                    continue
                OPEN.add(fd)
                fcntl.flock(
                    fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB)
                )
                if self.inode(name) == st.st_ino:
                    return fd, st.st_ino
            except OSError as exc:
                if fd >= 0:
                    _close(fd)
                if exc.errno in _HELD:
                    return None
                raise
            except BaseException:
                if fd >= 0:
                    _close(fd)
                raise
            _close(fd)  # Unlinked under us: take the new file.

    def take(self, key: LockKey) -> tuple[int, int] | None:
        """
        A flock of *key*'s file: one a waker got for us, a cached
        descriptor locked again, or a newly opened one; None if held.
        Errors (no access to the lock directory, a link) are raised.
        """
        with self.lock:
            state = self.names.get(key.digest)
            if state is not None and state.fd is not None:
                taken, state.fd = state.fd, None
                return taken
            cached = self.fds.pop(key.digest, None)
        name = f"{key.hex}.lock"
        if cached is not None:
            fd, ino = cached
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in _HELD:
                    raise  # pragma: no cover - flock on a valid fd
                self.cache(key.digest, fd, ino)
                return None
            except BaseException:
                _close(fd)
                raise
            if self.inode(name) == ino:
                return fd, ino
            _close(fd)  # Unlinked since: the path is a new file.
        return self.open_locked(name, block=False)

    def unlock(self, digest: bytes, fd: int, *, poke: bool = True) -> None:
        """
        ``LOCK_UN``, then (if *poke*) wake the sync waiters if the file is
        marked. A flock taken by a try that found the row held by a holder
        without one is let go without a poke: no waiter could use it, and
        a waiter of this process would only wake itself again.
        """
        fcntl.flock(fd, fcntl.LOCK_UN)
        if not poke:
            return
        try:
            marked = os.fstat(fd).st_size
        except OSError:  # pragma: no cover - fstat of an open descriptor
            return
        if marked:
            self.poke(digest, fd)

    def poke(self, digest: bytes, fd: int) -> None:
        """
        Write a byte into the name's FIFO; clear the file's mark (through
        its descriptor *fd*) if nobody has the FIFO open.
        """
        try:
            out = os.open(
                f"{digest.hex()}.wake",
                os.O_WRONLY | os.O_NONBLOCK | NOFOLLOW,
                dir_fd=self.dfd,
            )
        except OSError:  # No FIFO, or no reader: nobody listens.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            return
        try:
            check_file(f"{digest.hex()}.wake", out, stat.S_IFIFO)
            os.write(out, b"\0")
        except OSError:  # pragma: no cover - full: they will wake anyway
            pass
        finally:
            os.close(out)

    def cache(self, digest: bytes, fd: int, ino: int) -> None:
        """Keep an unlocked descriptor for reuse; evict the oldest."""
        evicted = []
        with self.lock:
            old = self.fds.pop(digest, None)
            if old is not None:
                evicted.append((digest, *old))
            self.fds[digest] = (fd, ino)
            while len(self.fds) > FD_CACHE:
                oldest, (old_fd, old_ino) = self.fds.popitem(last=False)
                evicted.append((oldest, old_fd, old_ino))
        for gone, gone_fd, gone_ino in evicted:
            self.evict(gone, gone_fd, gone_ino)

    def evict(self, digest: bytes, fd: int, ino: int) -> None:
        """
        Close a cached descriptor, unlinking its file (and its FIFO, if
        nobody has that open) if nobody holds or waits for it: under its
        flock, and only if it is still the path's.
        """
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            _close(fd)  # Held by someone: the file is theirs to keep.
            return
        try:
            stem = digest.hex()
            if self.inode(f"{stem}.lock") == ino:
                with contextlib.suppress(OSError):
                    os.unlink(f"{stem}.lock", dir_fd=self.dfd)
                _unlink_unused_fifo(f"{stem}.wake", self.dfd)
        except OSError:
            pass  # The directory went: nothing to tidy.
        finally:
            _close(fd)  # Closing drops the flock.

    def patient(self, key: LockKey, now: int, wait: int = CONTESTED_NS) -> int:
        """
        How long this process must still wait (ns; 0: no longer) for *key*,
        found free but flocked by someone else, after *wait* ns since it
        first found it so (the caller holds `lock`).
        """
        contested = self.contested
        if len(contested) > 4096:
            contested.clear()
        first = contested.setdefault(key.digest, now)
        return max(first + wait - now, 0)

    def park(self, key: LockKey, flock: tuple[int, int]) -> None:
        """Keep a flock for this process's async waiters, or let it go."""
        with self.lock:
            state = self.names.get(key.digest)
            if state is not None and state.watchers and state.fd is None:
                state.fd = flock
                return
        self.unlock(key.digest, flock[0], poke=False)
        self.cache(key.digest, *flock)

    def drop(self, secret: bytes) -> None:
        """After a release: unlock the file and keep its descriptor."""
        with self.lock:
            held = self.held.pop(secret, None)
            if held is None:
                return
            fd, ino, digest = held
            fcntl.flock(fd, fcntl.LOCK_UN)
            if os.fstat(fd).st_size:  # Marked: a sync waiter listens.
                self.poke(digest, fd)
            fds = self.fds
            if digest not in fds and len(fds) < FD_CACHE:
                fds[digest] = (fd, ino)  # Room in the cache: no eviction.
                return
        self.cache(digest, fd, ino)

    def clear_cache(self) -> None:
        """Close every cached descriptor, unlinking the files nobody uses."""
        with self.lock:
            cached = list(self.fds.items())
            self.fds.clear()
        for digest, (fd, ino) in cached:
            self.evict(digest, fd, ino)

    # -- sync waiters --------------------------------------------------------

    def waiter(self, key: LockKey) -> Waiter:
        """The wake-up of a sync waiter for *key* (see the module)."""
        return Waiter(self, key)

    def flock_free(self, key: LockKey, *, poke: bool = False) -> bool:
        """
        Whether *key*'s flock is free now (taken and let go at once, with
        a poke if *poke*); not when this process keeps it for an async
        waiter, who takes it next. An error (the lock directory went, a
        link planted) says "look now": the waiter's next acquire raises it.
        """
        with self.lock:
            state = self.names.get(key.digest)
            if state is not None and state.fd is not None:
                return False
        try:
            flock = self.take(key)
        except OSError:
            return True
        if flock is None:
            return False
        self.unlock(key.digest, flock[0], poke=poke)
        self.cache(key.digest, *flock)
        return True

    # -- async waiters: a thread per name blocks on the flock ---------------

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """
        Wake *notify* when *key*'s flock comes free: a helper thread per
        name (not per waiter) blocks on it.
        """
        with self.lock:
            state = self.names.get(key.digest)
            if state is None:
                state = self.names[key.digest] = _Name()
            state.watchers.append(notify)
            if state.thread is None and state.fd is None:
                state.thread = threading.Thread(
                    target=self._wake,
                    args=(key, state),
                    daemon=True,
                    name="resilient-lock-waker",
                )
                state.thread.start()

        def stop() -> None:
            fd = None
            with self.lock:
                if notify in state.watchers:
                    state.watchers.remove(notify)
                if not state.watchers:
                    fd, state.fd = state.fd, None
                    if state.thread is None:
                        self.names.pop(key.digest, None)
            if fd is not None:
                self.unlock(key.digest, fd[0])
                self.cache(key.digest, *fd)

        return stop

    def _wake(self, key: LockKey, state: _Name) -> None:
        """The waker: block on the flock, then hand it to the waiters."""
        try:
            fd = self.open_locked(f"{key.hex}.lock", block=True)
        except OSError:
            fd = None
        with self.lock:
            state.thread = None
            watchers = list(state.watchers)
            if watchers and fd is not None and state.fd is None:
                state.fd, fd = fd, None
            elif not watchers:
                self.names.pop(key.digest, None)
        if fd is not None:
            self.unlock(key.digest, fd[0])
            self.cache(key.digest, *fd)
        for notify in watchers:
            notify()


def _unlink_unused_fifo(name: str, dfd: int) -> None:
    """Unlink the FIFO *name* unless someone has it open to read."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # Nobody reads it.
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
        return
    os.close(fd)  # A waiter listens: keep it.
