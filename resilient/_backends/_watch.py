"""
Wake-ups for waiters of a server store: one listening connection per store
in a process, shared by every waiter (threads, asyncio tasks, trio tasks).

A `WatchHub` keeps the waiters of each channel (one lock) in a queue, in
the order they came, and runs one daemon thread that holds the store's
listening connection (Redis ``SUBSCRIBE``, PostgreSQL ``LISTEN``); the
store-specific part is `WatchHub._serve`. The thread starts with the first
watcher and ends (closing its connection) once nobody has watched for
`LINGER` seconds, or when the last backend using the hub is closed.

**One at a time, in order.** The queue is the process's line in front of
the store for that lock: only its head asks the store (`begin` says who
may), a release wakes only the head, and the next waiter becomes head when
the head stops watching (woken at once if the head left without the lock).
A newcomer while others wait, or while another request of this process is
out for the lock, is answered "busy" without a round trip, and joins the
line's tail when it watches. So a thousand waiters cost the store one
request per hand-over, not a thousand, and they get the lock first come,
first served (within the process; processes still race at the store). A
head that has not asked for `STALE` seconds (its task gone without
stopping its watch) no longer holds the line up: everyone may ask again.

Wake-ups are hints, never the truth: a waiter woken looks again with an
acquire, and a waiter never woken looks again on its backoff (or when the
holder's lease expires: an expiry without a release publishes nothing). So
the hub may notify spuriously, and does on purpose whenever it starts (or
starts again) to listen to a channel: a release that came before the
subscription took effect, and after the waiter's last look, would
otherwise go unseen until the backoff ran out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Final


if TYPE_CHECKING:
    from collections.abc import Callable, Hashable


__all__ = ["LINGER", "WatchHub", "hub_for"]

log = logging.getLogger("resilient.lock")

#: Seconds the listening connection stays open with nobody watching.
LINGER: Final = 2.0

#: Seconds after which a head that has not asked the store stops the others
#: waiting behind it (a watch left unstopped by an interrupt).
STALE: Final = 2.0

#: Seconds within which the store's notice of a release made in this
#: process is taken for the echo of the local wake-up it already gave.
ECHO: Final = 0.25

#: Reconnection backoff after the listening connection failed, in seconds.
RETRY_FIRST: Final = 0.05
RETRY_CAP: Final = 1.0


class _Entry:
    """One waiter in a channel's line: who waits (a thread or a task), how
    to wake it, when it last asked the store, whether it got the lock."""

    __slots__ = ("asked", "granted", "notify", "who")

    def __init__(
        self, who: object, notify: Callable[[], None], now: float
    ) -> None:
        self.who = who
        self.notify = notify
        self.asked = now
        self.granted = False


class WatchHub:
    """
    The lines of one store's waiters, by channel, and the thread that
    listens for them. Subclasses give `_serve` (one connection's life).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._watchers: dict[str, list[_Entry]] = {}
        # Releases made here, told already: their store notices are echoes.
        self._echoes: dict[str, tuple[int, float]] = {}
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()
        self._closed = threading.Event()
        self._users = 0
        self._pid = os.getpid()
        self._wake_r, self._wake_w = _pipe()

    # -- what waiters call (never blocks, never raises) ---------------------

    def begin(self, channel: str, who: object) -> bool:
        """
        Whether *who* may ask the store for *channel*'s lock now: nobody
        waits in this process, or it heads the line (else it is told
        "busy" locally, and joins the line when it watches). Nothing is
        held between this and the answer: an interrupt between them
        leaves no state behind.
        """
        now = time.monotonic()
        with self._lock:
            line = self._watchers.get(channel)
            if not line:
                return True
            head = line[0]
            if head.who is who:
                head.asked = now
                return True
            return now - head.asked >= STALE

    def granted(self, channel: str, who: object) -> None:
        """*who* got the lock: when it stops watching, the next one in
        line is not woken (the holder's release will wake it)."""
        with self._lock:
            line = self._watchers.get(channel)
            if line and line[0].who is who:
                line[0].granted = True

    def watch(
        self,
        channel: str,
        notify: Callable[[], None],
        who: object = None,
    ) -> Callable[[], None]:
        """Call *notify* when *channel* is told and *who* heads its line;
        returns the unwatch."""
        if self._pid != os.getpid():  # pragma: no cover - in a forked child
            self._after_fork()
        entry = _Entry(who, notify, time.monotonic())
        with self._lock:
            line = self._watchers.get(channel)
            new = line is None
            if line is None:
                line = self._watchers[channel] = []
            line.append(entry)
            if self._thread is None and not self._closed.is_set():
                thread = threading.Thread(
                    target=self._run, name=f"resilient-{self.name}-watch"
                )
                thread.daemon = True
                self._thread = thread
                thread.start()
        if new:
            self.poke()  # To subscribe (a line joined changes nothing).

        def stop() -> None:
            self._unwatch(channel, entry)

        return stop

    def _unwatch(self, channel: str, entry: _Entry) -> None:
        """*entry* leaves *channel*'s line (its watch's stop)."""
        after: _Entry | None = None
        gone = False
        with self._lock:
            line = self._watchers.get(channel)
            if line is not None and entry in line:
                was_head = line[0] is entry
                line.remove(entry)
                if not line:
                    del self._watchers[channel]
                    gone = True
                elif was_head:
                    # The next one heads the line from now (its wait
                    # so far does not make it stale).
                    line[0].asked = time.monotonic()
                    if not entry.granted:
                        # It left without the lock: the next one looks.
                        after = line[0]
            if not self._watchers:
                self._idle_since = time.monotonic()
        if after is not None:
            _call(after.notify)
        if gone:
            # To unsubscribe. Not for every waiter that leaves a line:
            # each poke makes the thread run, and take the GIL from
            # the next waiter's hand-over.
            self.poke()

    def _after_fork(self) -> None:  # pragma: no cover - in a forked child
        # The parent's thread did not come along; its lock may be held.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._thread = None
        self._watchers = {}
        self._echoes = {}
        self._closed = threading.Event()
        self._wake_r, self._wake_w = _pipe()

    def poke(self) -> None:
        """Wake the thread (the watched channels changed, or closing)."""
        with contextlib.suppress(OSError):  # full (it will wake) or closed
            os.write(self._wake_w, b"x")

    # -- what the thread calls ----------------------------------------------

    def channels(self) -> set[str]:
        """The channels watched now."""
        with self._lock:
            return set(self._watchers)

    def tell(
        self, channel: str, *, here: bool = False, hinted: object = None
    ) -> None:
        """
        Notify the head of *channel*'s line: the lock was released. A
        release made *here*, in this process, tells at once (the head need
        not wait for the store's notice), and one store notice per such
        release, within `ECHO` seconds, is taken for its echo and not told
        again (a notice that overtook its release's reply is told, and a
        later one swallowed instead: a waiter then looks on its backoff).
        A release that *hinted* a head (`hint`) tells only that head, if it
        still heads the line: once it left, the lock went to it (or its
        leaving woke the next one), and the next one would only find the
        lock held, one wasted request per hand-over.
        """
        now = time.monotonic()
        with self._lock:
            count, since = self._echoes.pop(channel, (0, now))
            if here:
                self._echoes[channel] = (count + 1, now)
            elif count and now - since < ECHO:
                if count > 1:
                    self._echoes[channel] = (count - 1, since)
                return
            line = self._watchers.get(channel)
            head = line[0] if line else None
            if hinted is not None and head is not hinted:
                head = None
        if head is not None:
            _call(head.notify)

    def hint(self, channel: str) -> object:
        """
        Notify the head of *channel*'s line: a release made here was sent,
        not yet answered (a spurious wake-up at worst; not an echo: the
        `tell` of its answer counts that). Returns the head woken (None if
        nobody waits), for that `tell`.
        """
        with self._lock:
            line = self._watchers.get(channel)
            head = line[0] if line else None
        if head is not None:
            _call(head.notify)
        return head

    def tell_all(self) -> None:
        """Notify the head of every line (a spurious wake-up: see the
        module)."""
        with self._lock:
            notifies = [line[0].notify for line in self._watchers.values()]
        for notify in notifies:
            _call(notify)

    def drain(self) -> None:
        """Empty the wake-up pipe."""
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass

    def done(self) -> bool:
        """
        Whether the thread should end: closed, or nobody has watched for
        `LINGER` seconds (then it forgets itself under the lock, so that a
        watcher coming now starts a new thread).
        """
        with self._lock:
            idle = (
                not self._watchers
                and time.monotonic() - self._idle_since >= LINGER
            )
            if self._closed.is_set() or idle:
                self._thread = None
                return True
            return False

    def wake_fd(self) -> int:
        """The descriptor that becomes readable when the thread is poked."""
        return self._wake_r

    def _serve(self) -> None:
        """Open a connection, listen and tell, until `done`; raise when the
        connection fails (the thread opens another after a backoff)."""
        raise NotImplementedError

    def _run(self) -> None:
        delay = RETRY_FIRST
        while not self.done():
            started = time.monotonic()
            try:
                self._serve()
            except Exception as exc:  # noqa: BLE001 - reconnect after a pause
                log.debug(
                    "lock store %s: the wake-up connection failed (%s); "
                    "waiters look again on their backoff",
                    self.name,
                    type(exc).__name__,
                )
                if time.monotonic() - started > RETRY_CAP:
                    delay = RETRY_FIRST  # It had worked for a while.
                if self._closed.wait(delay):
                    break
                delay = min(delay * 2, RETRY_CAP)
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None

    # -- users: the backends sharing the hub ---------------------------------

    def close(self) -> None:
        """End the thread and its connection for good."""
        self._closed.set()
        self.poke()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(0.5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _call(notify: Callable[[], None]) -> None:
    try:
        notify()
    except Exception:  # pragma: no cover - the shells' notifies do not raise
        log.exception("lock wake-up callback failed")


_HUBS: dict[Hashable, WatchHub] = {}
_HUBS_LOCK = threading.Lock()


def hub_for(
    key: Hashable, make: Callable[[], WatchHub]
) -> tuple[WatchHub, Callable[[], None]]:
    """
    The process's hub for *key* (a store: its driver URL and namespace or
    table), made by *make* on first use, and the function a backend calls
    when it closes: the last one to close ends the hub.
    """
    with _HUBS_LOCK:
        hub = _HUBS.get(key)
        if hub is None:
            hub = _HUBS[key] = make()
        hub._users += 1  # noqa: SLF001 - the registry's count
    released = False

    def release() -> None:
        nonlocal released
        with _HUBS_LOCK:
            if released:
                return
            released = True
            hub._users -= 1  # noqa: SLF001
            last = hub._users == 0  # noqa: SLF001
            if last and _HUBS.get(key) is hub:
                del _HUBS[key]
        if last:
            hub.close()

    return hub, release


def _after_fork_in_child() -> None:  # pragma: no cover - in a forked child
    """A forked child has no hub thread and none of the parent's waiters;
    the locks may have been held by a parent thread at the fork."""
    global _HUBS_LOCK  # noqa: PLW0603
    _HUBS_LOCK = threading.Lock()
    for hub in list(_HUBS.values()):
        hub._after_fork()  # noqa: SLF001


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
