"""
The private internals of CPython, asyncio, trio and redis-py that resilient
leans on (`resilient._core._internals`, listed in docs/design.md).

Two kinds of test for each:

- a *shape* test, which fails when an upgrade moves or changes the internal
  (its message names what to re-verify): it pins our reading of the
  installed versions, not a behaviour of theirs that we rely on blindly;
- a *fallback* test, which takes the internal away (monkeypatched) and
  checks that the path taken then keeps the guarantee, or refuses loudly.
"""

from __future__ import annotations

import asyncio
import contextvars
import dis
import importlib.util
import math
import platform
import re
import sqlite3
import sys
import threading
import time
import types
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import trio

import resilient
from resilient import DeadlineExceeded
from resilient._backends import (
    Grant,
    OwnerToken,
    ReleaseResult,
    Renewal,
    open_backend,
)
from resilient._core import _clock, _internals, _loops
from resilient._lock import _hold
from resilient._timeout import _entry, _scope, _watchdog
from tests import test_lock_interrupts as lock_interrupts
from tests.lock_contract import fresh_key, settle_watch
from tests.server_stores import store_of


RE_VERIFY = "re-verify resilient._core._internals and docs/design.md"


# -- CPython: the with statement and f_lasti ----------------------------------


class _Spy:
    """A context manager that notes its ``with``'s frame and instruction
    as the statement looks ``__exit__`` up and as it calls ``__enter__``
    (how `resilient._lock._hold.Exits` and `_entry.note_with_frame` read
    them)."""

    def __init__(self) -> None:
        self.exit_at: tuple[types.CodeType, int] | None = None
        self.enter_at: tuple[types.CodeType, int] | None = None

    class _Exits:
        def __init__(self, *, is_async: bool) -> None:
            self.is_async = is_async

        def __get__(self, spy: _Spy, owner: type) -> Any:
            frame = sys._getframe(1)
            spy.exit_at = (frame.f_code, frame.f_lasti)
            if self.is_async:
                return lambda *exc: asyncio.sleep(0)
            return lambda *exc: None

    __exit__ = _Exits(is_async=False)
    __aexit__ = _Exits(is_async=True)

    def __enter__(self) -> None:
        frame = sys._getframe(1)
        self.enter_at = (frame.f_code, frame.f_lasti)

    def __aenter__(self) -> Any:  # Plain, as `Lock.__aenter__`.
        frame = sys._getframe(1)
        self.enter_at = (frame.f_code, frame.f_lasti)
        return asyncio.sleep(0)


def _sync_with(spy: _Spy) -> None:
    with spy:
        pass


async def _async_with(spy: _Spy) -> None:
    async with spy:
        pass


def test_this_python_compiles_with_as_resilient_reads_it() -> None:
    """
    Shape: CPython 3.11-3.13 enter a ``with`` in one instruction,
    ``BEFORE_WITH``, the opcode `_entry` and `_hold` read (3.14 has none:
    then `with_shape` must say LOAD_SPECIAL and the import warns).
    """
    if sys.version_info < (3, 14):
        assert _internals.WITH_SHAPE == "BEFORE_WITH", (
            f"CPython {sys.version} compiles `with` without BEFORE_WITH: "
            f"{RE_VERIFY}"
        )
        assert _internals.BEFORE_WITH == _entry._BEFORE_WITH >= 0
        assert not _entry._BY_DIS
        assert not _hold._BY_DIS


@pytest.mark.parametrize("form", ["with", "async with"])
def test_a_with_calls_enter_where_enter_calls_says(form: str) -> None:
    """
    Shape (``sys._getframe``, ``f_lasti`` and the ``with`` bytecode): the
    instruction a ``with`` / ``async with`` is at when it looks
    ``__exit__`` up maps, in `enter_calls`, to the one it is at when it
    calls ``__enter__``; and that one is recognised as such (by the one
    opcode on 3.11-3.13, by `calls_enter` everywhere).
    """
    spy = _Spy()
    if form == "with":
        _sync_with(spy)
    else:
        asyncio.run(_async_with(spy))
    assert spy.exit_at is not None
    assert spy.enter_at is not None
    code, exit_lasti = spy.exit_at
    enter_code, enter_lasti = spy.enter_at
    assert enter_code is code
    calls, enters = _internals.enter_calls(code)
    assert calls == {exit_lasti: enter_lasti}, (
        f"{form} on CPython {sys.version}: __exit__ looked up at "
        f"{exit_lasti}, __enter__ called at {enter_lasti}, read as {calls}: "
        f"{RE_VERIFY}"
    )
    assert _internals.calls_enter(code, enter_lasti)
    if not _entry._BY_DIS and form == "with":
        assert code.co_code[enter_lasti] == _entry._BEFORE_WITH


def test_without_before_with_the_3_14_shape_is_read() -> None:
    """
    Fallback (``BEFORE_WITH`` missing from the opmap): `with_shape` says
    so, and `with_calls` reads 3.14's ``with`` (``LOAD_SPECIAL __exit__``,
    two swaps, ``LOAD_SPECIAL __enter__``, ``CALL``) and ``async with``,
    and nothing else: a lone ``__enter__`` lookup, or one not called at
    once, is no ``with``.
    """
    opmap = dict(dis.opmap)
    opmap.pop("BEFORE_WITH", None)
    opmap.pop("BEFORE_ASYNC_WITH", None)
    opmap.setdefault("LOAD_SPECIAL", 255)
    assert _internals.with_shape(opmap) == "LOAD_SPECIAL"
    del opmap["LOAD_SPECIAL"]
    assert _internals.with_shape(opmap) == "unknown"

    code_3_14 = [
        (0, "RESUME", ""),
        (2, "LOAD_FAST", "cm"),
        (4, "COPY", ""),
        (6, "LOAD_SPECIAL", "__exit__"),
        (8, "SWAP", ""),
        (10, "SWAP", ""),
        (12, "LOAD_SPECIAL", "__enter__"),
        (14, "CALL", "0"),
        (22, "POP_TOP", ""),
        (24, "LOAD_FAST", "acm"),
        (26, "COPY", ""),
        (28, "LOAD_SPECIAL", "__aexit__"),
        (30, "SWAP", ""),
        (32, "SWAP", ""),
        (34, "LOAD_SPECIAL", "__aenter__"),
        (36, "CALL", "0"),
        (44, "GET_AWAITABLE", "1"),
        # Not a with: an __enter__ looked up alone, then one not called.
        (46, "LOAD_SPECIAL", "__enter__"),
        (48, "CALL", "0"),
        (56, "LOAD_SPECIAL", "__exit__"),
        (58, "LOAD_SPECIAL", "__enter__"),
        (60, "POP_TOP", ""),
        (62, "CALL", "0"),
        # A dis that shows LOAD_SPECIAL's index, not the method's name.
        (70, "LOAD_SPECIAL", "1"),
        (72, "SWAP", ""),
        (74, "SWAP", ""),
        (76, "LOAD_SPECIAL", "0"),
        (78, "CALL", "0"),
    ]
    assert _internals.with_calls(code_3_14) == {6: 14, 28: 36, 70: 78}


@pytest.mark.parametrize(
    ("shape", "says"),
    [("LOAD_SPECIAL", "ordinary call"), ("unknown", "does not recognise")],
)
def test_an_unverified_with_shape_warns_naming_the_python(
    shape: str, says: str
) -> None:
    """
    Fallback (refuse loudly): where ``with`` is not compiled as on
    3.11-3.13, the import-time check warns, naming the Python version and
    what is not guaranteed; on 3.11-3.13 it says nothing.
    """
    with pytest.warns(RuntimeWarning, match=rf"Python 3\.99\.0 .*{says}"):
        _internals.check_with_shape(shape, "3.99.0")
    _internals.check_with_shape("BEFORE_WITH", "3.13.0")  # filterwarnings


def test_importing_where_before_with_is_missing_warns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    Fallback, as on CPython 3.14: with ``BEFORE_WITH`` gone from
    ``dis.opmap`` (where the probe looks it up), a fresh import of the
    probes takes the LOAD_SPECIAL shape, has no opcode for the fast check,
    and warns at import, naming this Python's version. Before: the
    lookup fell back to -1 in silence.
    """
    opmap = dict(dis.opmap)
    del opmap["BEFORE_WITH"]
    opmap.setdefault("LOAD_SPECIAL", 255)
    monkeypatch.setattr(dis, "opmap", opmap)
    spec = importlib.util.spec_from_file_location(
        "resilient_internals_as_on_3_14", _internals.__file__
    )
    assert spec is not None
    assert spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    version = re.escape(platform.python_version())
    with pytest.warns(RuntimeWarning, match=rf"Python {version} .*verified"):
        spec.loader.exec_module(fresh)
    assert fresh.WITH_SHAPE == "LOAD_SPECIAL"
    assert fresh.BEFORE_WITH == -1


def _skip_a_scope_exit() -> None:
    """Enter a sync timeout scope with ``with`` and have an exception land
    at the first line of its ``__exit__`` (before any of its code can
    catch it): the scope stays entered, its statement gone."""
    exit_code = _scope.TimeoutScope.__exit__.__code__

    def at_exit(frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code is exit_code:
            return on_line
        return None

    def on_line(frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "line":
            raise KeyboardInterrupt
        return on_line

    previous = sys.gettrace()
    try:
        with resilient.timeout(30.0):
            sys.settrace(at_exit)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(previous)


def _healed() -> tuple[object, float]:
    _skip_a_scope_exit()
    assert _clock._SCOPE.get() is not None  # Left entered.
    with resilient.timeout(None):  # The next entry heals it.
        pass
    return _clock._SCOPE.get(), _clock.current_deadline()


@pytest.mark.parametrize("shape", ["BEFORE_WITH", "dis"])
def test_a_scope_whose_exit_was_skipped_is_healed_without_the_opcode(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Fallback (``BEFORE_WITH`` missing): a sync timeout scope whose
    ``__exit__`` an exception skipped is left at the next scope's entry,
    with the opcode and with the code read by `dis` instead (3.14's way).
    Before: with the opcode looked up as missing, the scope stayed the
    current one and its deadline stayed in force for good.
    """
    if shape == "dis":
        monkeypatch.setattr(_entry, "_BEFORE_WITH", -1)
        monkeypatch.setattr(_entry, "_BY_DIS", True, raising=False)
    scope, deadline = contextvars.copy_context().run(_healed)
    assert scope is None
    assert deadline == math.inf


def test_a_lock_hold_is_linked_by_dis(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Fallback (the ``__exit__`` lookup and the ``__enter__`` call matched
    with `dis`, 3.14's way): an interrupt at the first line of a lock's
    exit still leaves the lease released, not renewed for good.
    """
    monkeypatch.setattr(_hold, "_BY_DIS", True)
    lock_interrupts.test_an_interrupt_at_the_first_line_of_the_exit_leaks_nothing(
        None
    )


# -- asyncio -----------------------------------------------------------------


def test_asyncio_get_running_loop_is_the_private_c_one() -> None:
    """Shape: ``asyncio._get_running_loop`` is there and is what runs."""
    assert _internals.get_running_loop is getattr(
        asyncio, "_get_running_loop", None
    ), f"asyncio._get_running_loop moved on {sys.version}: {RE_VERIFY}"


def test_without_get_running_loop_the_public_call_answers() -> None:
    """Fallback: with no ``_get_running_loop``, the running loop or None
    all the same (the caller never sees get_running_loop's error), and
    `current_async_library` tells sync from async code with it."""
    getter = _internals.running_loop_getter(types.SimpleNamespace())
    assert getter is not asyncio._get_running_loop
    assert getter() is None

    async def inside() -> None:
        assert getter() is asyncio.get_running_loop()

    asyncio.run(inside())


def test_current_async_library_without_the_private_getter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fallback end to end: sync code is told apart from asyncio."""
    monkeypatch.setattr(
        _internals,
        "get_running_loop",
        _internals.running_loop_getter(types.SimpleNamespace()),
    )
    assert _loops.current_async_library() is None

    async def inside() -> str | None:
        return _loops.current_async_library()

    assert asyncio.run(inside()) == "asyncio"


def test_current_task_of_reads_what_this_python_has() -> None:
    """Shape: on 3.11, ``asyncio.tasks._current_tasks`` is the dict that
    3.11's ``current_task`` reads; on 3.12+, the public C call is used."""
    if sys.version_info < (3, 12):
        tasks = getattr(asyncio.tasks, "_current_tasks", None)
        assert isinstance(tasks, dict), (
            f"asyncio.tasks._current_tasks moved on {sys.version}: {RE_VERIFY}"
        )
        assert _internals.current_task_of == tasks.get
    else:
        assert _internals.current_task_of is asyncio.current_task

    async def inside() -> None:
        loop = asyncio.get_running_loop()
        assert _internals.current_task_of(loop) is asyncio.current_task()

    asyncio.run(inside())


def test_without_current_tasks_the_public_call_answers() -> None:
    """Fallback: 3.11 with no ``tasks._current_tasks``: ``current_task``."""
    bare = types.SimpleNamespace(
        tasks=types.SimpleNamespace(), current_task=asyncio.current_task
    )
    getter = _internals.current_task_getter(bare, (3, 11))
    assert getter is asyncio.current_task

    async def inside() -> None:
        assert getter(asyncio.get_running_loop()) is asyncio.current_task()

    asyncio.run(inside())


# -- trio --------------------------------------------------------------------


def test_trio_cancel_tree_has_what_the_splice_uses() -> None:
    """Shape: trio's private cancel tree (``Task._cancel_status``,
    ``_activate_cancel_status``, the ``CancelStatus.parent`` setter,
    ``CancelScope._cancel_status``) is there on the installed trio."""
    assert _internals.trio_can_splice(trio), (
        f"trio {trio.__version__}'s cancel tree moved: {RE_VERIFY} "
        "(resilient._timeout._watchdog._splice)"
    )
    _watchdog._import_trio()
    assert _watchdog._SPLICE


def test_a_trio_without_the_cancel_tree_is_not_spliced() -> None:
    """Fallback probe: any piece missing, no splice."""
    assert not _internals.trio_can_splice(types.SimpleNamespace())

    class Status:
        parent = property(lambda self: None)  # No setter.

    fake = types.SimpleNamespace(
        lowlevel=types.SimpleNamespace(
            Task=type(
                "Task",
                (),
                {"_cancel_status": None, "_activate_cancel_status": print},
            )
        ),
        _core=types.SimpleNamespace(
            _run=types.SimpleNamespace(CancelStatus=Status)
        ),
        CancelScope=type("CancelScope", (), {"_cancel_status": None}),
    )
    assert not _internals.trio_can_splice(fake)
    Status.parent = property(lambda self: None, lambda self, v: None)
    assert _internals.trio_can_splice(fake)


@pytest.mark.parametrize("attempts", [1, 3])
def test_trio_deadlines_hold_without_the_splice(
    attempts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fallback end to end: with the splice off (`EAGER`: the deadline
    armed before the attempt), an attempt that overruns its budget on trio
    is still interrupted at the deadline."""
    _watchdog._import_trio()
    monkeypatch.setattr(_watchdog, "_SPLICE", False)
    calls: list[int] = []

    @resilient.retry(
        resilient.Policy(
            attempts=attempts,
            backoff=resilient.Constant(0),
            retry_on=ValueError,
            budget=0.05,
        )
    )
    async def body() -> None:
        assert _watchdog.trio_base() is _watchdog.EAGER
        calls.append(1)
        if len(calls) < attempts:
            raise ValueError
        await anyio.sleep(5)

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        anyio.run(body, backend="trio")
    assert time.monotonic() - started < 2.0
    assert len(calls) == attempts


# -- anyio: no internal left -------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_task_is_woken_from_another_thread_by_public_calls(
    backend: str,
) -> None:
    """`thread_caller` (which replaced anyio's opaque token) has a task's
    loop run a call from another thread, and raises RuntimeError, which
    the wakers ignore, once the loop is gone."""
    kept: list[Any] = []

    async def main() -> None:
        call = _loops.thread_caller()
        kept.append(call)
        woken = anyio.Event()
        threading.Thread(target=call, args=(woken.set,)).start()
        with anyio.fail_after(5):
            await woken.wait()

    anyio.run(main, backend=backend)
    with pytest.raises(RuntimeError):
        kept[0](lambda: None)
    with pytest.raises(RuntimeError, match="no event loop"):
        _loops.thread_caller()


# -- redis-py ----------------------------------------------------------------


def test_redis_connections_keep_their_socket_in_sock(redis_url: str) -> None:
    """Shape: a connected redis-py connection's socket is ``_sock``."""
    conn = redis.Redis.from_url(redis_url).connection_pool.make_connection()
    try:
        conn.connect()  # type: ignore[no-untyped-call]
        sock = _internals.redis_socket(conn)
        assert sock is not None, (
            f"redis-py {redis.__version__} keeps no `_sock`: {RE_VERIFY} "
            "(resilient._backends._redis._watch)"
        )
        assert sock.fileno() >= 0
    finally:
        conn.disconnect()  # type: ignore[no-untyped-call]
    assert _internals.redis_socket(conn) is None


def test_redis_wakeups_without_the_socket(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fallback end to end: with no socket to wait on, the Redis watcher
    polls its connection and still tells a waiter of the release."""
    monkeypatch.setattr(_internals, "redis_socket", lambda conn: None)
    url = store_of("redis", redis_url, f"in{uuid.uuid4().hex}").url
    backend = open_backend(url)
    key = fresh_key()
    owner = OwnerToken()
    backend.acquire(key, owner, 10.0)
    woken = threading.Event()
    stop = backend.watch(key, woken.set)
    try:
        settle_watch(woken)
        assert backend.release(key, owner) is ReleaseResult.RELEASED
        assert woken.wait(5.0)
    finally:
        stop()


# -- CPython's sqlite3 across versions ---------------------------------------


class _StrictConnection(sqlite3.Connection):
    """What CPython 3.12.0-3.12.3 (and, as an error, any Python that
    follows their deprecation) make of numbered placeholders bound to a
    sequence: refused here on every version."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if re.search(r"\?\d", sql) and not isinstance(parameters, Mapping):
            raise sqlite3.ProgrammingError(
                f"numbered placeholders bound to a sequence: {sql!r}"
            )
        return super().execute(sql, parameters)


def test_the_sqlite_store_binds_numbered_placeholders_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    The SQLite store's statements with ``?1``-style placeholders (acquire,
    renew) are bound by name. Before: bound to tuples, which CPython
    3.12.1 (the 3.12 on these machines) warns about at every acquire, a
    DeprecationWarning it says becomes an error in 3.14: with warnings as
    errors, every SQLite lock test failed on 3.12.
    """
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real_connect(*args, factory=_StrictConnection, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    backend = open_backend(f"sqlite:///{tmp_path / 'locks.sqlite3'}")
    try:
        key, owner = fresh_key(), OwnerToken()
        assert isinstance(backend.acquire(key, owner, 30.0), Grant)
        assert backend.renew([Renewal(key, owner, 30.0)]) == [True]
        assert backend.release(key, owner) is ReleaseResult.RELEASED
    finally:
        backend.close()
