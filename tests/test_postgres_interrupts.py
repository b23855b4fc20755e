"""
The PostgreSQL backend's connections under an exception injected at each
point where CPython 3.11 can deliver an asynchronous exception (a signal's
``KeyboardInterrupt``, ``timeout(interrupt=True)``) in the backend's I/O
module, one run per point, against a real server: sync, asyncio, and trio
(the sync backend in a worker thread).

Each run uses a backend of its own whose sessions carry a name of their own
(``application_name``) and interrupts one acquire + release. After it the
backend must still be served, the server must see exactly the sessions the
backend keeps, and no connection of the backend may have been left to
psycopg's finaliser (which warns with a `ResourceWarning`, made an error
here): an interrupt must leave nothing held, and every connection is closed
by the backend, in any state of the call.
"""

from __future__ import annotations

import contextlib
import itertools
import pathlib
import sys
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any, Final

import anyio.from_thread
import anyio.to_thread
import psycopg
import pytest

from resilient._backends import Grant, LockKey, OwnerToken, _postgres
from resilient._backends._postgres import _io
from resilient.exceptions import LockBackendError
from tests.inject import Landed, at_point
from tests.service_fixtures import RUN_ID, with_query


pytestmark = pytest.mark.postgres

_IO: Final = str(pathlib.Path(_io.__file__))
_KEY: Final = LockKey.of("interrupted")
_OWNER: Final = OwnerToken()
_ANYIO: Final = str(pathlib.Path(anyio.__file__).parent)
#: The start of psycopg's warning about a connection of ours left open.
_LEFT_OPEN: Final = r"<resilient\._backends\._postgres\._io\."


def _ours(code: types.CodeType) -> bool:
    return code.co_filename == _IO


def _not_anyio(code: types.CodeType) -> bool:
    """Callees whose start is a point of the asyncio runs: not anyio's (an
    exception at the start of a cancel scope's ``__exit__`` corrupts
    anyio's own stack of scopes, whoever called it)."""
    return _ANYIO not in code.co_filename


def _call(backend: Any) -> object:
    if not isinstance(backend.acquire(_KEY, _OWNER, 60.0), Grant):
        raise AssertionError("not granted")
    return backend.release(_KEY, _OWNER)


async def _acall(backend: Any) -> object:
    if not isinstance(await backend.acquire(_KEY, _OWNER, 60.0), Grant):
        raise AssertionError("not granted")
    return await backend.release(_KEY, _OWNER)


def _traced(
    backend: Any, at: int | None, where: list[str] | None = None
) -> bool | None:
    """
    An acquire + release on *backend* with `Landed` at point *at* of the
    I/O module: True if it landed, False if the call had fewer points (it
    was served), None if it failed as a backend error; where it landed
    goes to *where*.
    """
    with at_point(_ours, at) as points:
        try:
            _call(backend)
        except Landed:
            pass
        except LockBackendError:
            return None
    if where is not None and points.fired is not None:
        where.append(points.fired)
    return points.fired is not None


async def _atraced(
    backend: Any, at: int | None, where: list[str] | None = None
) -> bool | None:
    """`_traced` for an asyncio backend."""
    with at_point(_ours, at, _not_anyio) as points:
        try:
            await _acall(backend)
        except Landed:
            pass
        except LockBackendError:
            return None
    if where is not None and points.fired is not None:
        where.append(points.fired)
    return points.fired is not None


class _LeftOpen:
    """
    The connections of ours that psycopg's finaliser found open: its
    `ResourceWarning` is made an error, which a finaliser reports to
    ``sys.unraisablehook`` (recorded here) instead of raising. The injected
    exception is reported there too when its point is the start of a
    finaliser or weakref callback run from a traced frame (a dropped
    thread's, say): CPython reports it and the call goes on, as it would
    with a real interrupt there.
    """

    def __init__(self) -> None:
        self.found: list[str] = []

    def hook(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, ResourceWarning):
            self.found.append(str(unraisable.exc_value))
        elif not isinstance(unraisable.exc_value, Landed):
            self._previous(unraisable)  # pragma: no cover - as pytest would

    @contextlib.contextmanager
    def watching(self) -> Iterator[_LeftOpen]:
        self._previous = sys.unraisablehook
        sys.unraisablehook = self.hook
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "error", message=_LEFT_OPEN, category=ResourceWarning
                )
                yield self
        finally:
            sys.unraisablehook = self._previous


class _Run:
    """One run: a backend of its own, set in *state*, then interrupted."""

    def __init__(
        self,
        raw: psycopg.Connection[Any],
        url: str,
        name: str,
        state: str,
        keeps: int,
    ) -> None:
        self.raw, self.url, self.name, self.state = raw, url, name, state
        self.keeps = keeps
        self.open = -1  # The server's count of the run's sessions, at the end.
        self.fired: list[str] = []  # Where the interrupt landed.

    def ready(self, outcome: bool | None) -> None:
        assert outcome is False, "served"
        if self.state == "closed":
            _terminate(self.raw, self.name)

    def prepare(self, backend: Any) -> None:
        if self.state == "sweep":
            backend._next_sweep = 0.0  # The release sweeps the table.

    def sync(self, at: int) -> tuple[bool | None, list[bool | None]]:
        """*at*'s outcome, then that of two more calls, on a sync backend
        (also the trio twin's, in a worker thread)."""
        backend = _postgres.PostgresBackend(_postgres.parse_url(self.url))
        try:
            if self.state not in {"new", "create"}:
                self.ready(_traced(backend, None))
            self.prepare(backend)
            outcome = _traced(backend, at, self.fired)
            after = [_traced(backend, None) for _ in "ab"]
            self.open = _settled(self.raw, self.name, self.keeps)
        finally:
            backend.close()
        return outcome, after

    async def asyncio(self, at: int) -> tuple[bool | None, list[bool | None]]:
        """`sync` on the asyncio backend."""
        backend = _postgres.AsyncPostgresBackend(_postgres.parse_url(self.url))
        try:
            if self.state not in {"new", "create"}:
                self.ready(await _atraced(backend, None))
            self.prepare(backend)
            outcome = await _atraced(backend, at, self.fired)
            after = [await _atraced(backend, None) for _ in "ab"]
            self.open = await anyio.to_thread.run_sync(
                _settled, self.raw, self.name, self.keeps
            )
        finally:
            await backend.aclose()
        return outcome, after


def _sessions(raw: psycopg.Connection[Any], name: str) -> int:
    row = raw.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = %s AND datname = current_database()",
        (name,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _settled(raw: psycopg.Connection[Any], name: str, expected: int) -> int:
    """The server's count of *name*'s sessions, once it is *expected* (a
    closed session leaves pg_stat_activity a moment later)."""
    deadline = time.monotonic() + 2.0
    while True:
        n = _sessions(raw, name)
        if n == expected or time.monotonic() > deadline:
            return n
        time.sleep(0.005)


def _terminate(raw: psycopg.Connection[Any], name: str) -> None:
    raw.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = %s",
        (name,),
    )
    assert _settled(raw, name, 0) == 0


@pytest.fixture
def raw(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection to look at the server (and drop the tables)."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


_STATES: Final = ["kept", "new", "closed", "full", "sweep", "create"]


@pytest.mark.filterwarnings(
    # An exception landing between the call that makes a coroutine and its
    # ``await`` leaves it unawaited.
    "ignore:coroutine .* was never awaited:RuntimeWarning",
)
@pytest.mark.parametrize("state", _STATES)
def test_an_interrupt_at_any_point_of_a_call_leaves_no_connection(
    colour: str,
    raw: psycopg.Connection[Any],
    postgres_url: str,
    state: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    An acquire + release is interrupted at each point of the backend's I/O
    module in turn, with the backend in each state a call meets: a
    connection kept from the call before, none yet, one kept that the
    server ended meanwhile, no room to keep one after the call, a release
    that sweeps the table, and a table not made yet. After every run the
    next call is served (when the server ended the kept session, the one
    after it: the first use of that session fails, as documented), the
    server then sees only the session the backend keeps, if any, none once
    it is closed, and no connection was left for psycopg's finaliser.
    """
    if state == "full":
        monkeypatch.setattr(_io, "MAX_IDLE", 0)
    keeps = 0 if state == "full" else 1
    table = f"resilient_locks_pi{RUN_ID}"
    landed = 0
    left = _LeftOpen()
    with contextlib.ExitStack() as stack:
        stack.enter_context(left.watching())
        portal = None
        if colour == "trio":
            portal = stack.enter_context(
                anyio.from_thread.start_blocking_portal("trio")
            )
        for at in itertools.count():
            name = f"pi{RUN_ID}-{colour}-{state}-{at}"
            if state == "create":
                table = f"resilient_locks_pi{RUN_ID}_{colour}_{at}"
            url = with_query(postgres_url, table=table, application_name=name)
            run = _Run(raw, url, name, state, keeps)
            try:
                if colour == "sync":
                    outcome, after = run.sync(at)
                elif portal is not None:  # The sync twin in a worker thread.
                    outcome, after = portal.call(
                        anyio.to_thread.run_sync, run.sync, at
                    )
                else:
                    outcome, after = anyio.run(run.asyncio, at)
            finally:
                if state == "create":
                    raw.execute(f"DROP TABLE IF EXISTS {table}")
            where = f"point {at} ({state}): {run.fired}"
            if state == "closed":
                after = after[1:]
            assert after[0] is False, where  # Served.
            assert run.open == keeps, where
            assert _settled(raw, name, 0) == 0, where
            assert left.found == [], where
            if outcome is not True:  # Past the call's last point.
                break
            landed += 1
    assert landed > 10
