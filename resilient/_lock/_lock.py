"""
The lock's sync and async shells, and the lease they hand out.

Both shells run the same machine (`resilient._lock._machine`): try, and
while the lock is held wait for the backend's wake-up or the next backoff
step, within the lock's own wait and the enclosing deadline. A grant
becomes a `Lease` that the process's renewer for that backend keeps alive.
The block runs inside a cancel scope that the lease's loss cancels.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import random
import sys
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    ParamSpec,
    TypeVar,
    Unpack,
    final,
)

import attrs

from resilient import _timeout
from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    async_backend,
    check_url,
    open_backend,
)
from resilient._core import _clock, _loops, _telemetry
from resilient._core._decorate import decorate
from resilient._lock._config import LockConfig, default_backend_url
from resilient._lock._machine import (
    Acquisition,
    GiveUp,
    LeaseRecord,
    LeaseState,
    Wait,
    valid_until,
)
from resilient._lock._renewer import task_renewer, thread_renewer
from resilient.exceptions import (
    ConfigTypeError,
    LockBackendError,
    LockLost,
    LockNotAcquired,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from types import TracebackType

    from opentelemetry.trace import Span

    from resilient._backends import AsyncLockBackend, LockBackend
    from resilient._lock._config import LockKnobs
    from resilient._lock._renewer import TaskRenewer, ThreadRenewer


log: Final = logging.getLogger("resilient")

P = ParamSpec("P")
T = TypeVar("T")

#: Longest wait for a release to be answered in async code, in seconds,
#: shielded from the cancellation that may be ending the block.
RELEASE_TIMEOUT: Final = 5.0

_RNG: Final = random.Random()

# (url, key digest) -> the lease this process holds; its holder is a thread
# id, or a task ("task", id). To refuse a same-holder second acquire, and
# to release at exit the leases no thread can still be using.
_HOLDERS: dict[tuple[str, bytes], Lease] = {}
_HOLDERS_LOCK = threading.Lock()

# The leases `with` / `async with` entered in this context, innermost last.
_ENTERED: contextvars.ContextVar[
    tuple[tuple[Lock, Lease, _timeout.TimeoutScope], ...]
] = contextvars.ContextVar("resilient_lock_entered", default=())


def _me(library: str | None) -> object:
    if library is None:
        return threading.get_ident()
    import anyio  # noqa: PLC0415

    return ("task", anyio.get_current_task().id)


def _claim(lock: Lock, me: object) -> None:
    with _HOLDERS_LOCK:
        held = _HOLDERS.get((lock.url, lock.key.digest))
        if held is not None and held._holder == me:  # noqa: SLF001
            who = "thread" if isinstance(me, int) else "task"
            raise RuntimeError(
                f"lock {lock.key.shown!r} is already held by this {who}: "
                "locks are not reentrant, and waiting for it here would "
                "wait for ever"
            )


class _Telemetry:
    """The span of one acquisition, from the first try to the release."""

    __slots__ = ("span",)

    def __init__(self, key: LockKey, scheme: str) -> None:
        self.span: Span | None = None
        if _telemetry.disabled():
            return
        tracer, _ = _telemetry.TELEMETRY.resolve()
        if tracer is not None:
            self.span = tracer.start_span(
                "resilient.lock",
                attributes={
                    "resilient.lock.name": key.shown,
                    "resilient.lock.backend": scheme,
                },
            )

    def acquired(self, fence: int, waited: float) -> None:
        if self.span is not None:
            self.span.set_attributes(
                {
                    "resilient.lock.fence": fence,
                    "resilient.lock.waited": waited,
                    "resilient.lock.outcome": "acquired",
                }
            )

    def event(self, name: str, **attributes: str | float) -> None:
        if self.span is not None:
            self.span.add_event(f"resilient.lock.{name}", attributes)

    def end(self, outcome: str | None = None, *, error: bool = False) -> None:
        span, self.span = self.span, None
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        if outcome is not None:
            span.set_attribute("resilient.lock.outcome", outcome)
        span.set_status(
            Status(StatusCode.ERROR, outcome)
            if error
            else Status(StatusCode.OK)
        )
        span.end()


@final
class Lease:
    """
    A held lock: what ``with resilient.lock(...)`` gives.

    The process's renewer keeps the lease alive while it is held. Check
    `checkpoint` before each step that must not run without the lock, and
    pass `token` to the resource so it can refuse stale writers
    (`resilient.fenced_update`).

    Never shows the owner token: not in its repr, its errors or its spans.

    .. versionadded:: 26.11.0
    """

    __slots__ = (
        "_backend",
        "_holder",
        "_library",
        "_lock",
        "_record",
        "_released",
        "_renewer",
        "_telemetry",
        "waited",
    )

    def __init__(  # noqa: PLR0917
        self,
        lock: Lock,
        record: LeaseRecord,
        backend: LockBackend | AsyncLockBackend,
        renewer: ThreadRenewer | TaskRenewer,
        telemetry: _Telemetry,
        holder: object,
        waited: float,
        library: str | None,
    ) -> None:
        self._lock = lock
        self._record = record
        self._backend = backend
        self._renewer = renewer
        self._telemetry = telemetry
        self._holder = holder
        self._library = library
        self._released: ReleaseResult | None = None
        self.waited = waited
        """Seconds spent acquiring it."""

    def __repr__(self) -> str:
        state = "held" if self.held else self._record.state.value
        return (
            f"<Lease {self._lock.key.shown!r} token={self.token} {state}, "
            f"valid for {self.valid_for():.3f} s>"
        )

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._lock.name

    @property
    def token(self) -> int:
        """
        The fencing token: strictly greater than the token of every earlier
        grant of this lock's name. Hand it to the resource with each write.
        """
        return self._record.fence

    @property
    def held(self) -> bool:
        """Whether the lease is still ours (on our clock; not released)."""
        return self._record.check(_clock.get_clock().now())

    @property
    def lost(self) -> bool:
        """Whether the lease was lost (not merely released)."""
        self._record.check(_clock.get_clock().now())
        return self._record.state is LeaseState.LOST

    def valid_for(self) -> float:
        """
        Seconds the lease stays ours on our clock if no renewal succeeds
        (0.0 once lost or released): the most any step may take.
        """
        if not self.held:
            return 0.0
        return max(self._record.valid_until - _clock.get_clock().now(), 0.0)

    @property
    def expires_in(self) -> float:
        """`valid_for`, as a property."""
        return self.valid_for()

    def checkpoint(self) -> None:
        """
        Raise `LockLost` if the lease is gone; return if it is still ours.

        Raises:
            LockLost: The lease was lost (or released).
        """
        if not self.held:
            raise self._lost_error()

    def _lost_error(self) -> LockLost:
        return LockLost(
            self._lock.key.shown, self.token, self._record.reason or "released"
        )

    # -- renewing and releasing by hand ------------------------------------

    def renew(self) -> bool:
        """
        Renew now, without waiting for the renewer (sync backends); whether
        the store renewed it. A lease the store no longer has is lost.

        Raises:
            LockLost: The store said the lease is not ours.
        """
        backend: LockBackend = self._backend  # type: ignore[assignment]
        self.checkpoint()
        sent = _clock.get_clock().now()
        ok = backend.renew([self._request()])
        return self._renewed(sent, ok)

    async def arenew(self) -> bool:
        """`renew` for async code."""
        backend: AsyncLockBackend = self._backend  # type: ignore[assignment]
        self.checkpoint()
        sent = _clock.get_clock().now()
        ok = await backend.renew([self._request()])
        return self._renewed(sent, ok)

    def _request(self) -> Any:
        from resilient._backends import Renewal  # noqa: PLC0415

        return Renewal(
            self._lock.key, self._record.owner, self._record.config.ttl
        )

    def _renewed(self, sent: float, ok: Any) -> bool:
        if ok and ok[0]:
            self._record.renewed(sent, self._record.config.ttl)
            return True
        self._record.lose("gone")
        raise self._lost_error()

    def _start(self) -> None:
        """Record the holder and start renewing; `_let_go` undoes it."""
        with _HOLDERS_LOCK:
            _HOLDERS[self._lock.url, self._lock.key.digest] = self
        self._renewer.add(self._record)
        self._telemetry.acquired(self.token, self.waited)

    def _let_go(self) -> bool:
        """
        Stop renewing and forget the holder; whether a release should be
        sent (not for a forked child's copy). Safe to repeat.
        """
        record = self._record
        record.released()
        self._renewer.remove(record)
        with _HOLDERS_LOCK:
            key = (self._lock.url, self._lock.key.digest)
            if _HOLDERS.get(key) is self:
                del _HOLDERS[key]
        return record.reason != "forked"

    def _settled(self, result: ReleaseResult) -> ReleaseResult:
        self._released = result
        if result is ReleaseResult.UNKNOWN:
            log.warning(
                "lock %r: the release got no answer; the lease is left to "
                "expire within %.3f s",
                self._lock.key.shown,
                self._record.config.ttl,
            )
            self._telemetry.event("release_unknown")
        self._telemetry.end(
            result.value, error=result is ReleaseResult.UNKNOWN
        )
        return result

    def release(self) -> ReleaseResult:
        """
        Release the lock now (a compare-and-delete on our owner token);
        leaving the block then does nothing more. Harmless to repeat: after
        `ReleaseResult.UNKNOWN` (no answer) it sends the release again.

        Never raises for a store that cannot be reached: the lease is left
        to expire, a log line and a span event say so, and the result is
        `ReleaseResult.UNKNOWN`.
        """
        if self._released not in {None, ReleaseResult.UNKNOWN}:
            return self._released
        if not self._let_go():
            return self._settled(ReleaseResult.NOT_HELD)
        backend: LockBackend = self._backend  # type: ignore[assignment]
        try:
            result = backend.release(self._lock.key, self._record.owner)
        except Exception:  # noqa: BLE001 - no answer: left to expire
            result = ReleaseResult.UNKNOWN
        return self._settled(result)

    async def arelease(self) -> ReleaseResult:
        """
        `release` for async code; shielded from cancellation and bounded by
        `RELEASE_TIMEOUT` seconds.
        """
        import anyio  # noqa: PLC0415

        if self._released not in {None, ReleaseResult.UNKNOWN}:
            return self._released
        if not self._let_go():
            return self._settled(ReleaseResult.NOT_HELD)
        backend: AsyncLockBackend = self._backend  # type: ignore[assignment]
        result = ReleaseResult.UNKNOWN
        try:
            with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
                result = await backend.release(
                    self._lock.key, self._record.owner
                )
        except Exception:  # noqa: BLE001 - no answer: left to expire
            result = ReleaseResult.UNKNOWN
        return self._settled(result)


def _make_lease(  # noqa: PLR0917
    lock: Lock,
    config: LockConfig,
    owner: OwnerToken,
    grant: Grant,
    sent: float,
    acq: Acquisition,
    backend: LockBackend | AsyncLockBackend,
    renewer: ThreadRenewer | TaskRenewer,
    telemetry: _Telemetry,
    holder: object,
    library: str | None,
) -> Lease:
    """The lease of a grant: plain objects, nothing started yet."""
    now = _clock.get_clock().now()
    record = LeaseRecord(
        lock.key,
        owner,
        grant.fence,
        config,
        valid_until(config, sent, grant.ttl),
        sent,
    )
    return Lease(
        lock,
        record,
        backend,
        renewer,
        telemetry,
        holder,
        now - acq.start,
        library,
    )


def _not_acquired(  # noqa: PLR0917
    lock: Lock,
    acq: Acquisition,
    reason: str,
    busy: Busy | None,
    telemetry: _Telemetry,
    error: BaseException | None,
) -> LockNotAcquired:
    waited = _clock.get_clock().now() - acq.start
    after = None
    if error is None and busy is not None and busy.expires_in is not None:
        after = max(busy.expires_in, 0.0)
    telemetry.end(reason, error=True)
    exc = LockNotAcquired(lock.key.shown, reason, waited, after)
    exc.__cause__ = error
    return exc


def _acquire(lock: Lock, config: LockConfig, out: list[Lease]) -> Lease:  # noqa: C901, PLR0912, PLR0915
    """
    The sync shell: try, wait, try again; a lease or LockNotAcquired. The
    lease is appended to *out* before anything starts, so that a caller's
    ``except BaseException`` can release it whatever line was interrupted.
    """
    clock = _clock.get_clock()
    holder = _me(None)
    _claim(lock, holder)
    backend = open_backend(lock.url)
    renewer = thread_renewer(backend)
    telemetry = _Telemetry(lock.key, backend.scheme)
    owner = OwnerToken()
    acq = Acquisition(config, clock.now(), _clock.current_deadline(), _RNG)
    woken: threading.Event | None = None  # Made only if we must wait.
    waited = False
    stop: Callable[[], None] | None = None
    sent_any = False
    busy: Busy | None = None
    error: BaseException | None = None
    try:
        while True:
            sent = clock.now()
            sent_any = True
            try:
                answer = backend.acquire(lock.key, owner, config.ttl)
            except Exception as exc:  # noqa: BLE001 - no answer: retried
                _raise_if_final(exc)
                error = exc
                step = acq.failed(clock.now())
            else:
                error = None
                if isinstance(answer, Grant):
                    if acq.granted(sent, clock.now(), answer):
                        lease = _make_lease(
                            lock,
                            config,
                            owner,
                            answer,
                            sent,
                            acq,
                            backend,
                            renewer,
                            telemetry,
                            holder,
                            None,
                        )
                        out.append(lease)
                        lease._start()  # noqa: SLF001
                        return lease
                    backend.release(lock.key, owner)  # came too late
                    answer = Busy(None)
                busy = answer
                step = acq.busy(clock.now(), answer)
                if stop is None and isinstance(step, Wait):
                    # Watch, then look once more at once: a release between
                    # the try and the watch would otherwise go unseen.
                    woken = threading.Event()
                    stop = backend.watch(lock.key, woken.set)
                    continue
            if isinstance(step, GiveUp):
                if error is not None:
                    _compensate(backend, lock.key, owner)
                raise _not_acquired(  # noqa: TRY301
                    lock, acq, step.reason, busy, telemetry, error
                )
            if not waited:
                # Only a wait would block an event loop: checked then, so
                # an uncontended acquire does not pay for the look-up.
                _loops.refuse_blocking(
                    f"a blocking acquire of lock {lock.key.shown!r}",
                    "`async with` the lock (or `await lock.aacquire()`)",
                )
                waited = True
            _sync_wait(woken, step.seconds)
    except BaseException as exc:
        # An interrupt (or any error) after a request left: the store may
        # have granted it. Compare-and-delete on our token is harmless.
        if out:
            out[-1].release()
        elif sent_any and not isinstance(exc, LockNotAcquired):
            _compensate(backend, lock.key, owner)
            telemetry.end(_why(exc), error=True)
        raise
    finally:
        if stop is not None:
            stop()


def _raise_if_final(exc: Exception) -> None:
    """
    Raise *exc* at once when trying again cannot help: a store's error that
    is not retryable (a key of another type, a refused login or privilege)
    is a configuration error, not a busy lock; waiting it out would only
    hide it.
    """
    if isinstance(exc, LockBackendError) and not exc.retryable:
        raise exc


def _why(exc: BaseException) -> str:
    """The span outcome of an acquisition that *exc* ended."""
    return "error" if isinstance(exc, LockBackendError) else "interrupted"


def _compensate(backend: LockBackend, key: LockKey, owner: OwnerToken) -> None:
    try:
        backend.release(key, owner)
    except Exception:  # noqa: BLE001 - best effort: the lease expires
        log.debug("lock %r: compensating release got no answer", key.shown)


def _sync_wait(woken: threading.Event | None, seconds: float) -> None:
    """Wait up to *seconds* for a wake-up, honouring the cancel scope."""
    clock = _clock.get_clock()
    if woken is None:
        woken = threading.Event()
    if clock is not _clock.DEFAULT_CLOCK:
        clock.sleep(seconds)  # Virtual time: the clock must move.
        woken.clear()
        return
    with _timeout.wake_on_cancel(woken.set):
        _timeout.check_scope()
        woken.wait(seconds)
    woken.clear()
    _timeout.check_scope()


async def _aacquire(lock: Lock, config: LockConfig, out: list[Lease]) -> Lease:  # noqa: C901, PLR0912, PLR0915
    """The async shell: the same steps as `_acquire`, awaited."""
    import anyio  # noqa: PLC0415

    clock = _clock.get_clock()
    library = _loops.current_async_library() or "asyncio"
    holder = _me(library)
    _claim(lock, holder)
    loop = _loop_token(library)
    backend = async_backend(lock.url, loop)
    renewer = task_renewer(backend, library)
    telemetry = _Telemetry(lock.key, backend.scheme)
    owner = OwnerToken()
    acq = Acquisition(config, clock.now(), _clock.current_deadline(), _RNG)
    call = _loops.loop_caller(library)
    events: list[anyio.Event] = [anyio.Event()]

    def notify() -> None:
        try:  # noqa: SIM105
            call(events[-1].set)
        except RuntimeError:  # pragma: no cover - the loop is gone
            pass

    stop: Callable[[], None] | None = None
    sent_any = False
    busy: Busy | None = None
    error: BaseException | None = None
    try:
        while True:
            sent = clock.now()
            sent_any = True
            try:
                answer = await backend.acquire(lock.key, owner, config.ttl)
            except Exception as exc:  # noqa: BLE001 - no answer: retried
                _raise_if_final(exc)
                error = exc
                step = acq.failed(clock.now())
            else:
                error = None
                if isinstance(answer, Grant):
                    if acq.granted(sent, clock.now(), answer):
                        lease = _make_lease(
                            lock,
                            config,
                            owner,
                            answer,
                            sent,
                            acq,
                            backend,
                            renewer,
                            telemetry,
                            holder,
                            library,
                        )
                        out.append(lease)
                        lease._start()  # noqa: SLF001
                        return lease
                    await _acompensate(backend, lock.key, owner)
                    answer = Busy(None)
                busy = answer
                step = acq.busy(clock.now(), answer)
                if stop is None and isinstance(step, Wait):
                    stop = backend.watch(lock.key, notify)
                    continue
            if isinstance(step, GiveUp):
                if error is not None:
                    await _acompensate(backend, lock.key, owner)
                raise _not_acquired(  # noqa: TRY301
                    lock, acq, step.reason, busy, telemetry, error
                )
            if clock is not _clock.DEFAULT_CLOCK:
                await clock.asleep(step.seconds)
            else:
                with anyio.move_on_after(step.seconds):
                    await events[-1].wait()
            events.append(anyio.Event())
            del events[0]
    except BaseException as exc:
        if out:
            await out[-1].arelease()
        elif sent_any and not isinstance(exc, LockNotAcquired):
            await _acompensate(backend, lock.key, owner)
            telemetry.end(_why(exc), error=True)
        raise
    finally:
        if stop is not None:
            stop()


async def _acompensate(
    backend: AsyncLockBackend, key: LockKey, owner: OwnerToken
) -> None:
    import anyio  # noqa: PLC0415

    try:
        with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
            await backend.release(key, owner)
    except Exception:  # noqa: BLE001 - best effort: the lease expires
        log.debug("lock %r: compensating release got no answer", key.shown)


def _loop_token(library: str) -> object:
    if library == "trio":
        import trio  # noqa: PLC0415

        return trio.lowlevel.current_trio_token()
    import asyncio  # noqa: PLC0415

    return asyncio.get_running_loop()


# The hold the last ``with`` statement of this thread made (`_Exits`):
# (hold, id of the statement's frame, its code, its instruction).
_PENDING: Final = threading.local()

# Release tasks of abandoned async leases (a reference keeps them alive).
_BACKGROUND: set[object] = set()


@final
class _Hold:
    """
    One ``with`` / ``async with`` of a lock: the exit the statement calls,
    and the lease it entered. Dropped unreleased (its exit was interrupted
    before its first line ran), its ``__del__`` releases the lease.
    """

    __slots__ = ("call", "entry", "lock")

    def __init__(self, lock: Lock) -> None:
        self.lock = lock
        self.entry: tuple[Lease, _timeout.TimeoutScope] | None = None
        self.call: Callable[[Callable[[], object]], None] | None = None

    def exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.lock._leave(self.entry, exc_type, exc, tb)  # noqa: SLF001

    async def aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await self.lock._aleave(self.entry, exc_type, exc, tb)  # noqa: SLF001

    def __del__(self) -> None:
        entry = getattr(self, "entry", None)  # None if __init__ was cut
        if entry is not None and entry[0]._released is None:  # noqa: SLF001
            _abandon(entry[0], entry[1], self.call)


@final
class _Exits:
    """
    `Lock.__exit__` / `Lock.__aexit__`: bound on an instance, the exit of a
    new `_Hold` (recorded for the `Lock.__enter__` that follows); on the
    class, the plain method (for ``ExitStack`` and explicit calls).
    """

    __slots__ = ("_async",)

    def __init__(self, *, is_async: bool) -> None:
        self._async = is_async

    def __get__(self, lock: Lock | None, owner: type | None = None) -> Any:
        if lock is None:
            return Lock._aexit if self._async else Lock._exit  # noqa: SLF001
        frame = sys._getframe(1)  # noqa: SLF001 - the with statement's frame
        hold = _Hold(lock)
        _PENDING.hold = (hold, id(frame), frame.f_code, frame.f_lasti)
        return hold.aexit if self._async else hold.exit


def _abandon(
    lease: Lease,
    scope: _timeout.TimeoutScope,
    call: Callable[[Callable[[], object]], None] | None,
) -> None:
    """
    Release a lease its ``with`` statement dropped unreleased. Runs in
    ``__del__`` (any thread, any moment): stops the renewal at once, and
    sends the release from a thread of its own (sync) or a task in the
    lease's event loop (async); never raises, never blocks.
    """
    try:
        lease._let_go()  # noqa: SLF001
        if lease._library is None:  # noqa: SLF001
            if (
                threading.get_ident() == lease._holder  # noqa: SLF001
                and scope._state == "entered"  # noqa: SLF001
            ):
                with contextlib.suppress(Exception):  # Another context.
                    scope.__exit__(None, None, None)
            threading.Thread(
                target=_release_quietly,
                args=(lease,),
                name="resilient-lock-abandoned",
                daemon=True,
            ).start()
        elif call is not None:  # pragma: no branch - set with the entry
            call(lambda: _spawn_release(lease))
    except Exception:  # noqa: BLE001 - in __del__: the lease expires
        log.debug("lock %r: an abandoned lease is left to expire", lease.name)


def _release_quietly(lease: Lease) -> None:
    """An abandoned lease's release, in a thread of its own."""
    try:
        lease.release()
    except BaseException:  # noqa: BLE001 - nobody to tell: the lease expires
        log.debug("lock %r: an abandoned lease is left to expire", lease.name)


def _spawn_release(lease: Lease) -> None:
    """In the lease's event loop: release it in a task of its own."""
    if lease._library == "trio":  # noqa: SLF001
        import trio  # noqa: PLC0415

        trio.lowlevel.spawn_system_task(lease.arelease)
        return
    import asyncio  # noqa: PLC0415

    task = asyncio.get_running_loop().create_task(lease.arelease())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


@atexit.register
def _release_at_exit() -> None:
    """
    At interpreter exit, release the sync leases of threads that are done
    (the main thread and every joined thread; not daemon threads, which may
    still be running their blocks): a lease taken by hand and never
    released, or one whose ``with`` was interrupted and not recovered.
    """
    daemons = {t.ident for t in threading.enumerate() if t.daemon}
    with _HOLDERS_LOCK:
        leases = list(_HOLDERS.values())
    for lease in leases:
        if lease._library is None and lease._holder not in daemons:  # noqa: SLF001
            with contextlib.suppress(Exception):
                lease.release()
    embedded = sys.modules.get("resilient._backends._sqlite")
    if embedded is not None:  # Its files of the leases released just now.
        embedded._tidy_at_exit()  # noqa: SLF001


@final
class Lock:
    """
    A named lock on a lease store: enter it with ``with`` or ``async
    with``, or decorate a function with it. Made by `resilient.lock`.

    Entering waits for the lock (within its ``timeout`` and the enclosing
    deadline), then runs the block as the lease's holder, renewed by the
    process's renewer. If the lease is lost, the block is stopped: in async
    code it is cancelled and `LockLost` comes out of ``async with``; in sync
    code every wait of the library in it wakes, `Lease.checkpoint` raises
    `LockLost`, and leaving the block raises `LockLost` unless the block is
    already raising. Leaving releases the lease (also on errors and
    cancellation).

    Not reentrant: entering a lock the same thread or task already holds
    raises `RuntimeError` rather than waiting for ever. One `Lock` may be
    entered by many threads and tasks at once; each gets its own lease in
    turn.

    .. versionadded:: 26.11.0
    """

    __slots__ = ("config", "key", "url")

    def __init__(self, name: str, config: LockConfig) -> None:
        if not isinstance(name, str):
            raise ConfigTypeError("lock(name)", name, "must be a str")
        if not isinstance(config, LockConfig):
            raise ConfigTypeError(
                "lock(config)", config, "must be a LockConfig"
            )
        self.key = LockKey.of(name)
        self.config = config
        self.url = config.backend or default_backend_url()
        check_url(self.url, "lock(backend)")

    @property
    def name(self) -> str:
        """The lock's name."""
        return self.key.name

    def __repr__(self) -> str:
        scheme = self.url.partition("://")[0]
        return (
            f"<Lock {self.key.shown!r} on {scheme}:// ttl={self.config.ttl:g}>"
        )

    def _config(
        self, blocking: bool | None, timeout: float | object | None
    ) -> LockConfig:
        changes: dict[str, Any] = {}
        if blocking is not None:
            changes["blocking"] = blocking
        if timeout is not _DEFAULT:
            changes["timeout"] = timeout
        return attrs.evolve(self.config, **changes) if changes else self.config

    def acquire(
        self,
        *,
        blocking: bool | None = None,
        timeout: float | object | None = None,
    ) -> Lease:
        """
        Acquire the lock and return its lease; release it with
        `Lease.release` (or use ``with``, which does).

        Args:
            blocking: False tries once; None (the default) is the lock's
                own setting.
            timeout: Seconds to wait; by default the lock's own.

        Raises:
            LockNotAcquired: Held past the wait, or the store did not answer.
            RuntimeError: This thread holds it already, or the call would
                block an event loop.
        """
        return _acquire(self, self._config(blocking, _or_default(timeout)), [])

    def acquire_nowait(self) -> Lease:
        """Acquire the lock if it is free, else raise `LockNotAcquired`."""
        return _acquire(self, self._config(False, _DEFAULT), [])

    async def aacquire(
        self,
        *,
        blocking: bool | None = None,
        timeout: float | object | None = None,  # noqa: ASYNC109
    ) -> Lease:
        """`acquire` for async code (asyncio or trio)."""
        return await _aacquire(
            self, self._config(blocking, _or_default(timeout)), []
        )

    # -- with / async with -------------------------------------------------
    #
    # A ``with`` statement looks ``__exit__`` up (binding it) before it
    # calls ``__enter__``: `_Exits` binds it to a fresh `_Hold`, which
    # `__enter__` links to the lease it enters. The statement keeps the
    # hold until it has called its exit; if the exit is interrupted at its
    # very first instruction (where no Python code can catch anything), the
    # statement drops the hold with the lease unreleased, and the hold's
    # ``__del__`` releases it. Entered any other way (``ExitStack``, explicit
    # calls), the lease is found again in `_ENTERED`.

    def _linked(self) -> _Hold | None:
        """The hold a ``with`` of this lock just made, if the caller is one."""
        pending = getattr(_PENDING, "hold", None)
        if pending is None:
            return None
        _PENDING.hold = None
        hold: _Hold = pending[0]
        _, frame_id, code, lasti = pending
        frame = sys._getframe(2)  # noqa: SLF001 - the with statement's frame
        if (
            hold.lock is self
            and frame_id == id(frame)
            and code is frame.f_code
            and lasti == frame.f_lasti
        ):
            return hold
        return None

    def __enter__(self) -> Lease:
        hold = self._linked()
        out: list[Lease] = []
        scope: _timeout.TimeoutScope | None = None
        try:
            lease = _acquire(self, self.config, out)
            scope = _timeout.TimeoutScope(
                seconds=None, at=None, interrupt=False
            )
            if hold is not None:
                hold.entry = (lease, scope)
            else:
                _ENTERED.set((*_ENTERED.get(), (self, lease, scope)))
            scope.__enter__()
            lease._record.on_lost(scope.cancel)  # noqa: SLF001
            return lease  # Inside the try: an interrupt here still cleans up.  # noqa: TRY300
        except BaseException:
            self._forget(out)
            if scope is not None and scope._state == "entered":  # noqa: SLF001
                scope.__exit__(None, None, None)
            if out:
                out[0].release()
            raise

    def _top(self) -> tuple[Lease, _timeout.TimeoutScope] | None:
        for lock, lease, scope in reversed(_ENTERED.get()):
            if lock is self:
                return lease, scope
        return None

    def _forget(self, leases: list[Lease]) -> None:
        entered = _ENTERED.get()
        for i in range(len(entered) - 1, -1, -1):
            if entered[i][0] is self and entered[i][1] in leases:
                _ENTERED.set(entered[:i] + entered[i + 1 :])
                return

    def _leave(
        self,
        linked: tuple[Lease, _timeout.TimeoutScope] | None,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        # The release runs on the normal path and again, from scratch, if
        # an interrupt lands anywhere in it: every step is idempotent.
        try:
            entry = linked or self._top()
            if entry is None:
                raise RuntimeError(f"{self!r} was not entered here")  # noqa: TRY301
            lease, scope = entry
            swallowed = scope.__exit__(exc_type, exc, tb)
            lost = lease.lost
            lease.release()
            self._forget([lease])
        except BaseException:
            entry = linked or self._top()
            if entry is not None:
                try:
                    if entry[1]._state == "entered":  # noqa: SLF001
                        entry[1].__exit__(None, None, None)
                finally:
                    try:
                        entry[0].release()
                    finally:
                        self._forget([entry[0]])
            raise
        return _outcome(lease, exc, swallowed, lost)

    def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._leave(None, exc_type, exc, tb)

    def __aenter__(self) -> Coroutine[Any, Any, Lease]:
        # A plain function: it runs inside the ``async with`` statement's
        # own instruction, where its hold can be recognised.
        return self._aenter(self._linked())

    async def _aenter(self, hold: _Hold | None) -> Lease:
        out: list[Lease] = []
        scope: _timeout.TimeoutScope | None = None
        try:
            lease = await _aacquire(self, self.config, out)
            scope = _timeout.TimeoutScope(
                seconds=None, at=None, interrupt=False
            )
            if hold is not None:
                hold.call = _loops.loop_caller(lease._library)  # type: ignore[arg-type]  # noqa: SLF001
                hold.entry = (lease, scope)
            else:
                _ENTERED.set((*_ENTERED.get(), (self, lease, scope)))
            await scope.__aenter__()
            lease._record.on_lost(scope.cancel)  # noqa: SLF001
            return lease  # Inside the try: an interrupt here still cleans up.  # noqa: TRY300
        except BaseException:
            self._forget(out)
            if scope is not None and scope._state == "entered":  # noqa: SLF001
                await scope.__aexit__(None, None, None)
            if out:
                await out[0].arelease()
            raise

    async def _aleave(
        self,
        linked: tuple[Lease, _timeout.TimeoutScope] | None,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        # The release runs on the normal path and again, from scratch, if
        # an interrupt lands anywhere in it: every step is idempotent.
        try:
            entry = linked or self._top()
            if entry is None:
                raise RuntimeError(f"{self!r} was not entered here")  # noqa: TRY301
            lease, scope = entry
            swallowed = await scope.__aexit__(exc_type, exc, tb)
            lost = lease.lost
            await lease.arelease()
            self._forget([lease])
        except BaseException:
            entry = linked or self._top()
            if entry is not None:
                try:
                    if entry[1]._state == "entered":  # noqa: SLF001
                        await entry[1].__aexit__(None, None, None)
                finally:
                    try:
                        await entry[0].arelease()
                    finally:
                        self._forget([entry[0]])
            raise
        return _outcome(lease, exc, swallowed, lost)

    async def _aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await self._aleave(None, exc_type, exc, tb)

    if TYPE_CHECKING:

        def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> bool: ...

        async def __aexit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> bool: ...

    else:
        __exit__ = _Exits(is_async=False)
        __aexit__ = _Exits(is_async=True)

    # -- as a decorator ----------------------------------------------------

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """
        Run each call of *fn* (sync or async) holding the lock.
        """

        def sync_shell(
            fn: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            with self:
                return fn(*args, **kwargs)

        async def async_shell(
            fn: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            async with self:
                return await fn(*args, **kwargs)

        return decorate(
            fn,
            sync_shell,
            async_shell,
            stream="a lock's decorator would hold it only while the "
            "generator object is made; take the lock inside the generator "
            "(`with lock:` around its loop) or around the loop that "
            "consumes it",
        )


_DEFAULT: Final = object()


def _or_default(timeout: object) -> object:
    return _DEFAULT if timeout is None else timeout


def _outcome(
    lease: Lease, exc: BaseException | None, swallowed: bool, lost: bool
) -> bool:
    """After the block: raise LockLost, or let the block's own exception be."""
    if not lost:
        return swallowed
    error = lease._lost_error()  # noqa: SLF001
    if exc is None or swallowed:
        raise error from exc
    if not isinstance(exc, LockLost):
        exc.add_note(f"while the block ran, {error}")
    return False


def lock(
    name: str,
    /,
    *,
    config: LockConfig | None = None,
    **knobs: Unpack[LockKnobs],
) -> Lock:
    """
    A distributed lock named *name*, held as a lease with a fencing token.

    Use it as ``with``, ``async with`` or a decorator::

        with resilient.lock("nightly-report", ttl=60) as lease:
            write_report(fence=lease.token)

        @resilient.lock("nightly-report")
        def nightly_report() -> None: ...

    Without ``backend`` it uses ``$RESILIENT_LOCK_URL`` or the embedded
    SQLite file in a per-user directory (no server needed).

    Args:
        name: Any `str`, of any content and length (it is hashed).
        config: A `LockConfig` to start from.
        **knobs: `LockConfig` fields (``backend``, ``ttl``,
            ``renew_interval``, ``drift``, ``timeout``, ``blocking``,
            ``backoff``), applied over *config*.

    Raises:
        ConfigError: A bad setting, or a backend URL whose scheme is unknown
            or whose driver is missing (the message names the extra).

    .. versionadded:: 26.11.0
    """
    base = LockConfig() if config is None else config
    if knobs:
        base = (
            LockConfig(**knobs)
            if config is None
            else attrs.evolve(base, **knobs)
        )
    return Lock(name, base)


__all__ = ["Lease", "Lock", "LockConfig", "lock"]
