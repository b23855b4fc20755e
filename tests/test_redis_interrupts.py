"""
The Redis backend's connections under an exception injected at each point
where CPython 3.11 can deliver an asynchronous exception (a signal's
``KeyboardInterrupt``, ``timeout(interrupt=True)``) in the backend's I/O
module, one run per point, against a real ``redis-server``: sync, asyncio,
and trio (the sync backend in a worker thread).

Each run uses a backend of its own whose URL allows one connection
(``max_connections=1``) and names it (``client_name``). After the
interrupted call, the backend must still be served, and the server must
see exactly the connection the backend keeps: an interrupt must lose no
connection (one left open, or counted in use for good, so that the next
call finds the single place taken) in any state of the call.
"""

from __future__ import annotations

import contextlib
import itertools
import pathlib
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, Final

import anyio.from_thread
import anyio.to_thread
import pytest
import redis

from resilient._backends import Grant, LockKey, OwnerToken, _redis
from resilient._backends._redis import _io
from resilient.exceptions import LockBackendError
from tests.inject import Landed, at_point
from tests.service_fixtures import RUN_ID, with_query


pytestmark = pytest.mark.redis

_IO: Final = str(pathlib.Path(_io.__file__))
_KEY: Final = LockKey.of("interrupted")


def _ours(code: types.CodeType) -> bool:
    return code.co_filename == _IO


def _not_anyio(code: types.CodeType) -> bool:
    """
    Callees whose start is a point of the async runs: not anyio's (an
    exception at the start of a cancel scope's ``__exit__`` corrupts
    anyio's own stack of scopes, whoever called it; on asyncio, Ctrl-C
    cancels the main task rather than raising there).
    """
    return _ANYIO not in code.co_filename


_ANYIO: Final = str(pathlib.Path(anyio.__file__).parent)


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client to look at the server."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


_OWNER: Final = OwnerToken()


def _traced(call: Callable[[], object], at: int | None) -> bool | None:
    """
    *call* (an acquire) with `Landed` at point *at* of the I/O module:
    True if it landed, False if the call had fewer points, None if the
    call failed as a backend error.
    """
    with at_point(_ours, at) as points:
        try:
            assert isinstance(call(), Grant)
        except Landed:
            return True
        except LockBackendError:
            return None
    return points.fired is not None


async def _atraced(backend: Any, at: int | None) -> bool | None:
    """`_traced` for an async backend."""
    with at_point(_ours, at, _not_anyio) as points:
        try:
            assert isinstance(await backend.acquire(_KEY, _OWNER, 60.0), Grant)
        except Landed:
            return True
        except LockBackendError:
            return None
    return points.fired is not None


class _Run:
    """One run: a backend of its own, set in *state*, then interrupted."""

    def __init__(
        self, raw: redis.Redis, url: str, name: str, state: str, keeps: int
    ) -> None:
        self.raw, self.url, self.name, self.state = raw, url, name, state
        self.keeps = keeps
        self.open = -1  # The server's count of its connections, at the end.

    def ready(self, outcome: bool | None) -> None:
        assert outcome is False, "served"
        if self.state == "closed":
            _kill(self.raw, self.name)

    def sync(self, at: int) -> tuple[bool | None, list[bool | None]]:
        """*at*'s outcome, then that of two more calls, on a sync backend
        (also the trio twin's, in a worker thread)."""
        backend = _redis.sync_backend(self.url)
        try:
            if self.state != "new":
                self.ready(_traced(self._acquire(backend), None))
            outcome = _traced(self._acquire(backend), at)
            after = [_traced(self._acquire(backend), None) for _ in "ab"]
            self.open = _settled(self.raw, self.name, self.keeps)
        finally:
            backend.close()
        return outcome, after

    async def asyncio(self, at: int) -> tuple[bool | None, list[bool | None]]:
        """`sync` on the asyncio backend."""
        backend = _redis.async_backend(self.url)
        try:
            if self.state != "new":
                self.ready(await _atraced(backend, None))
            outcome = await _atraced(backend, at)
            after = [await _atraced(backend, None) for _ in "ab"]
            # In a thread: the loop closes a dropped socket in a callback.
            self.open = await anyio.to_thread.run_sync(
                _settled, self.raw, self.name, self.keeps
            )
        finally:
            await backend.aclose()
        return outcome, after

    @staticmethod
    def _acquire(backend: Any) -> Callable[[], object]:
        return lambda: backend.acquire(_KEY, _OWNER, 60.0)


def _ours_on_server(raw: redis.Redis, name: str) -> int:
    return sum(1 for c in raw.client_list() if c.get("name") == name)


def _settled(raw: redis.Redis, name: str, expected: int) -> int:
    """The server's count of *name*'s connections, once it is *expected*
    (a closed socket leaves the server's list a moment later)."""
    deadline = time.monotonic() + 2.0
    while True:
        n = _ours_on_server(raw, name)
        if n == expected or time.monotonic() > deadline:
            return n
        time.sleep(0.005)


def _kill(raw: redis.Redis, name: str) -> None:
    for c in raw.client_list():
        if c.get("name") == name:
            raw.client_kill_filter(_id=c["id"])


@pytest.mark.filterwarnings(
    # An exception landing in a finaliser (`_Kept.__del__` of a connection
    # already closed) is reported, not raised; one landing between the
    # call that makes a coroutine and its ``await`` leaves it unawaited.
    "ignore::pytest.PytestUnraisableExceptionWarning",
    "ignore:coroutine .* was never awaited:RuntimeWarning",
)
@pytest.mark.parametrize("state", ["kept", "new", "closed", "full"])
def test_an_interrupt_at_any_point_of_a_call_loses_no_connection(
    colour: str,
    raw: redis.Redis,
    redis_url: str,
    state: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    An acquire is interrupted at each point of the backend's I/O module in
    turn, with the backend's connection in each state a call meets: one
    kept from the call before, none yet, one kept that the server closed
    meanwhile, and no room to keep it after the call (the trim). After
    every run the next call is served within the one allowed connection
    (on asyncio, the one after it: its first use of a connection the
    server closed fails, as documented), and the server then sees only the
    connection the backend keeps, if any.
    """
    if state == "full":
        monkeypatch.setattr(_io, "_IDLE", 0)
    keeps = 0 if state == "full" else 1
    landed = 0
    with contextlib.ExitStack() as stack:
        portal = None
        if colour == "trio":
            portal = stack.enter_context(
                anyio.from_thread.start_blocking_portal("trio")
            )
        for at in itertools.count():
            name = f"ri{RUN_ID}-{colour}-{state}-{at}"
            url = with_query(
                redis_url,
                namespace=f"ri{RUN_ID}",
                client_name=name,
                max_connections="1",
            )
            run = _Run(raw, url, name, state, keeps)
            if colour == "sync":
                outcome, after = run.sync(at)
            elif portal is not None:  # The sync twin in a worker thread.
                outcome, after = portal.call(
                    anyio.to_thread.run_sync, run.sync, at
                )
            else:
                outcome, after = anyio.run(run.asyncio, at)
            where = f"point {at} ({state})"
            if colour == "asyncio" and state == "closed":
                after = after[1:]
            assert after[0] is False, where  # Served.
            assert run.open == keeps, where
            assert _settled(raw, name, 0) == 0, where
            if outcome is not True:  # Past the call's last point.
                break
            landed += 1
    assert landed > 10


def test_an_interrupted_call_gives_its_place_back_at_once(
    redis_url: str, raw: redis.Redis
) -> None:
    """
    The sync backend's one interrupt window that no handler covers, between
    ``idle.pop()`` returning and the assignment of what it returned, closes
    the popped connection as the interrupt unwinds the frame (not at a
    later garbage collection, since the connection's holder is in no
    reference cycle): the place is free while the exception still exists.
    """
    name = f"ri{RUN_ID}-pop"
    url = with_query(redis_url, namespace=f"ri{RUN_ID}", client_name=name)
    backend = _redis.sync_backend(url)
    try:
        assert isinstance(backend.acquire(_KEY, _OWNER, 60.0), Grant)
        assert _settled(raw, name, 1) == 1
        kept = backend._idle
        with contextlib.ExitStack() as stack:
            held = stack.enter_context(pytest.raises(Landed))
            stack.enter_context(
                at_point(_ours, _first_after(_pop_points(backend)))
            )
            backend.acquire(_KEY, _OWNER, 60.0)
        assert held.value is not None  # The exception is still alive.
        assert not kept
        assert backend._count.open == 0
        assert _settled(raw, name, 0) == 0
    finally:
        backend.close()


def _pop_points(backend: Any) -> list[str]:
    """Where each point of an uninjected acquire is (function:line)."""
    wheres: list[str] = []
    for at in itertools.count():
        with at_point(_ours, at) as points, contextlib.suppress(Landed):
            backend.acquire(_KEY, _OWNER, 60.0)
        if points.fired is None:
            return wheres
        wheres.append(points.fired)
        # Put a connection back for the next run (the pop's own point
        # closed it).
        backend.acquire(_KEY, _OWNER, 60.0)
    raise AssertionError  # pragma: no cover


def _first_after(wheres: list[str]) -> int:
    """The point just after the take's ``idle.pop()`` returned."""
    source = pathlib.Path(_IO).read_text().splitlines()
    for i, where in enumerate(wheres):
        function, line = where.split(":")
        if function == "_take" and "idle.pop()" in source[int(line) - 1]:
            return i
    raise AssertionError(wheres)
