"""
The lock semantics users of redis-py's lock and filelock rely on (issue 15,
section 5), on every backend (memory, the embedded SQLite file, Redis,
PostgreSQL) and in every shell (sync, asyncio, trio): leaving a block whose
release the store refused raises `LockLost`; "held by this thread/task"
never mistakes a new thread or task for a finished one; a lease dropped
unreleased is released when collected, with a `ResourceWarning`; no repr
shows a URL's password; a loss is logged, a wait is logged at DEBUG; the
fence column of the docs is 64-bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import resilient
from resilient._backends import (
    LockKey,
    OwnerToken,
    async_backend,
    open_backend,
)
from resilient._backends import _memory as memory
from resilient._lock import _lease
from resilient.exceptions import LockLost, LockNotAcquired
from tests.server_stores import store_of
from tests.service_fixtures import RUN_ID


DOCS = Path(__file__).resolve().parent.parent / "docs"

SHELLS = ["sync", "asyncio", "trio"]


class Store:
    """A lock URL of one backend, and how to delete a lease behind its
    holder's back there."""

    def __init__(self, url: str, delete: Callable[[LockKey], None]) -> None:
        self.url = url
        self.delete = delete


def _sqlite_delete(url: str) -> Callable[[LockKey], None]:
    def delete(key: LockKey) -> None:
        path = open_backend(url).path  # type: ignore[attr-defined]
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            gone = db.execute(
                "DELETE FROM leases WHERE name = ?", (key.hex,)
            ).rowcount
        assert gone == 1

    return delete


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each scenario on every backend."""
    kind = request.param
    if kind == "memory":
        url = f"memory://semantics-{uuid.uuid4().hex}"

        def delete(key: LockKey) -> None:
            assert memory.store(url).delete(key)

        yield Store(url, delete)
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'locks.sqlite3'}"
        yield Store(url, _sqlite_delete(url))
    else:
        server = request.getfixturevalue(
            "redis_url" if kind == "redis" else "postgres_url"
        )
        scope = f"sem{RUN_ID}"
        plain = store_of(kind, server, scope)
        yield Store(plain.url, plain.delete)
        plain.close()


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    """sync, asyncio or trio."""
    return str(request.param)


def fresh_name() -> str:
    return f"job-{uuid.uuid4().hex}"


def run(shell: str, fn: Callable[[], Any]) -> Any:
    """Run *fn* (a function, or an async one) in *shell*."""
    if shell == "sync":
        return fn()
    return anyio.run(fn, backend=shell)


def in_block(
    shell: str, lock: resilient.Lock, body: Callable[[resilient.Lease], None]
) -> Callable[[], Any]:
    """A function that runs *body* inside ``with`` / ``async with`` *lock*."""
    if shell == "sync":

        def sync() -> None:
            with lock as lease:
                body(lease)

        return sync

    async def main() -> None:
        async with lock as lease:
            await anyio.lowlevel.checkpoint()
            body(lease)

    return main


def collect(leases: list[Any]) -> None:
    """Drop the only reference to the leases, and collect."""
    leases.clear()
    gc.collect()


def acquire_free(shell: str, url: str, name: str) -> float:
    """Acquire and release *name* as another holder, within 5 s (far less
    than the dropped holder's 60 s TTL); the seconds it waited."""
    lock = resilient.lock(name, backend=url, timeout=5.0)
    if shell == "sync":
        lease = lock.acquire()
        lease.release()
        return lease.waited

    async def main() -> float:
        lease = await lock.aacquire()
        await lease.arelease()
        return lease.waited

    return float(anyio.run(main, backend=shell))


# 1. Leaving a block the store no longer held -------------------------------


def test_leaving_a_block_whose_release_the_store_refused_raises_lock_lost(
    store: Store, shell: str
) -> None:
    """The lease is deleted behind the holder's back and the block ends
    before any renewal could notice: the release answers NOT_HELD, so the
    block may have run without the lock, and leaving it raises `LockLost`
    (reason ``"gone"``, with the name and fence), as redis-py's
    ``LockNotOwnedError`` does."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    fences: list[int] = []

    def body(lease: resilient.Lease) -> None:
        fences.append(lease.token)
        store.delete(LockKey.of(name))

    with pytest.raises(LockLost) as info:
        run(shell, in_block(shell, lock, body))
    assert info.value.reason == "gone"
    assert info.value.name == name
    assert info.value.fence == fences[0]
    assert acquire_free(shell, store.url, name) < 5.0


def test_a_raising_block_keeps_its_error_with_a_note_of_the_loss(
    store: Store, shell: str
) -> None:
    """When the block is raising already, its own exception comes out,
    with a note that the lock was lost (the release answered NOT_HELD)."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)

    def body(lease: resilient.Lease) -> None:
        store.delete(LockKey.of(name))
        raise KeyError("own")

    with pytest.raises(KeyError) as info:
        run(shell, in_block(shell, lock, body))
    notes = getattr(info.value, "__notes__", [])
    assert any("lost" in note and name in note for note in notes), notes


def test_a_release_by_hand_then_leaving_the_block_raises_nothing(
    store: Store, shell: str
) -> None:
    """Releasing inside the block by hand (the caller sees its answer) and
    then leaving: the exit sends nothing and raises nothing, even if the
    lease was gone by then."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    results = []

    def sync_body(lease: resilient.Lease) -> None:
        store.delete(LockKey.of(name))
        results.append(lease.release())

    if shell == "sync":
        run(shell, in_block(shell, lock, sync_body))
    else:

        async def main() -> None:
            async with lock as lease:
                store.delete(LockKey.of(name))
                results.append(await lease.arelease())

        anyio.run(main, backend=shell)
    assert [r.value for r in results] == ["not_held"]


# 2. Holders are threads and tasks, never reusable numbers -------------------


def test_a_new_thread_with_a_dead_holders_ident_waits(store: Store) -> None:
    """A thread that acquired by hand ended holding the lease; a new thread
    that the OS gave the same ident is another thread: it waits (and times
    out), it is not refused as re-entrant."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0, timeout=0.05)
    kept: list[resilient.Lease] = []
    idents: list[int] = []

    def first() -> None:
        idents.append(threading.get_ident())
        kept.append(lock.acquire())

    thread = threading.Thread(target=first)
    thread.start()
    thread.join()
    outcome: list[BaseException | None] = []

    def second() -> None:
        if threading.get_ident() != idents[0]:
            return
        try:
            lock.acquire().release()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    for _ in range(200):
        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        if outcome:
            break
    try:
        if not outcome:
            pytest.skip("the OS never reused the thread's ident")
        assert type(outcome[0]) is LockNotAcquired, outcome
    finally:
        kept[0].release()


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_a_new_task_at_a_dead_holders_address_waits(
    store: Store, library: str
) -> None:
    """A task that acquired by hand ended holding the lease; a new task at
    the same address (same ``id()``) is another task: it waits (and times
    out), it is not refused as re-entrant."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0, timeout=0.05)

    def current() -> object:
        if library == "trio":
            import trio

            return trio.lowlevel.current_task()
        return asyncio.current_task()

    async def main() -> BaseException | None:
        kept: list[resilient.Lease] = []
        ids: list[int] = []
        outcome: list[BaseException | None] = []

        async def first() -> None:
            ids.append(id(current()))
            kept.append(await lock.aacquire())

        async def second() -> None:
            if id(current()) != ids[0]:
                return
            try:
                await (await lock.aacquire()).arelease()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        async def spawn(fn: Callable[[], Any]) -> None:
            if library == "trio":
                import trio

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fn)
            else:
                task = asyncio.get_running_loop().create_task(fn())
                await task
                del task

        try:
            await spawn(first)
            for _ in range(3000):
                await spawn(second)
                if outcome:
                    return outcome[0]
            pytest.skip("no new task was made at the old one's address")
        finally:
            for lease in kept:
                await lease.arelease()

    result = anyio.run(main, backend=library)
    assert type(result) is LockNotAcquired, result


def test_the_same_thread_and_task_are_still_refused(
    store: Store, shell: str
) -> None:
    """The holder itself acquiring again is still refused at once."""
    lock = resilient.lock(fresh_name(), backend=store.url)
    if shell == "sync":
        with lock, pytest.raises(RuntimeError, match="this thread"):
            lock.acquire()
        return

    async def main() -> None:
        async with lock:
            with pytest.raises(RuntimeError, match="this task"):
                await lock.aacquire()

    anyio.run(main, backend=shell)


# 3. A lease dropped unreleased ---------------------------------------------


def test_a_dropped_lease_is_released_with_a_resource_warning(
    store: Store, shell: str
) -> None:
    """A lease acquired by hand and dropped without release warns like an
    unclosed file when collected, and its release is sent (by the
    renewal side, not the collecting thread): another holder gets the lock
    at once, not after the 60 s TTL (today: renewed until the process
    exits)."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)

    if shell == "sync":
        leases = [lock.acquire()]
        with pytest.warns(ResourceWarning, match=re.escape(repr(name))):
            collect(leases)
        assert acquire_free(shell, store.url, name) < 5.0
        return

    async def main() -> float:
        leases = [await lock.aacquire()]
        with pytest.warns(ResourceWarning, match=re.escape(repr(name))):
            collect(leases)
        other = resilient.lock(name, backend=store.url, timeout=5.0)
        got = await other.aacquire()
        await got.arelease()
        return got.waited

    assert anyio.run(main, backend=shell) < 5.0


def test_a_dropped_lease_is_no_longer_renewed_or_recorded(
    store: Store,
) -> None:
    """After the collection nothing of the lease is left in the process:
    no holder recorded, no renewal going on."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    leases = [lock.acquire()]
    record = leases[0]._record
    with pytest.warns(ResourceWarning):
        collect(leases)
    end = time.monotonic() + 5.0
    while record.state.value == "held" and time.monotonic() < end:
        time.sleep(0.01)
    assert record.state.value == "released"
    assert lock.holder_key not in _lease.HOLDERS
    _, renewer = lock.sync_parts()
    assert record not in renewer.renewals.held()


_DROPPER = """
import gc, sys, time, warnings
import anyio
import resilient
warnings.simplefilter("default", ResourceWarning)
url, name, shell = sys.argv[1:4]
lock = resilient.lock(name, backend=url, ttl=60.0)

def report(leases):
    print(leases[0].token, flush=True)
    leases.clear()
    gc.collect()
    print("dropped", flush=True)

if shell == "sync":
    report([lock.acquire()])
    time.sleep(60)  # alive: its renewer would keep the lease for good
else:
    async def main():
        report([await lock.aacquire()])
        await anyio.sleep(60)  # the loop runs: so would its renewer
    anyio.run(main, backend=shell)
"""


def test_a_lease_dropped_in_a_live_process_frees_the_lock_for_others(
    store: Store, shell: str
) -> None:
    """Another process (sync, asyncio or trio) acquires a lease by hand,
    drops it and keeps running: this process gets the lock at once (well
    within the 60 s TTL), and the other one printed the
    `ResourceWarning`."""
    if store.url.startswith("memory"):
        pytest.skip("memory:// does not span processes")
    name = fresh_name()
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", _DROPPER, store.url, name, shell],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    try:
        assert child.stdout is not None
        token = int(child.stdout.readline())
        assert child.stdout.readline().strip() == "dropped"
        lease = resilient.lock(name, backend=store.url, timeout=5.0).acquire()
        lease.release()
        assert lease.token > token
        assert lease.waited < 5.0
        assert child.poll() is None  # The dropper is still running.
    finally:
        child.kill()
        _, err = child.communicate(timeout=10)
    assert "ResourceWarning" in err
    assert name in err


def test_a_dropped_lease_in_a_cycle_is_released_by_the_collector(
    store: Store,
) -> None:
    """A lease caught in a reference cycle is found by the cyclic collector
    (which clears weak references before finalizers run): released too,
    and its holder entry forgotten."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    cycle: list[Any] = [lock.acquire()]
    cycle.append(cycle)
    with pytest.warns(ResourceWarning, match=re.escape(repr(name))):
        collect(cycle)
    assert acquire_free("sync", store.url, name) < 5.0
    end = time.monotonic() + 5.0
    while lock.holder_key in _lease.HOLDERS and time.monotonic() < end:
        time.sleep(0.01)
    assert lock.holder_key not in _lease.HOLDERS


def test_the_collecting_thread_never_waits_for_the_release(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release of a dropped lease runs in the dropped-lease worker: a
    store that takes its time to answer it never holds up the thread whose
    allocation ran the collector (it may hold any lock at that moment)."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    backend = open_backend(store.url)
    gate = threading.Event()
    threads: list[threading.Thread | None] = []
    real = backend.release

    def slow(key: LockKey, owner: OwnerToken) -> Any:
        threads.append(threading.current_thread())
        gate.wait(10.0)
        return real(key, owner)

    monkeypatch.setattr(backend, "release", slow)
    leases = [lock.acquire()]
    started = time.monotonic()
    with pytest.warns(ResourceWarning):
        collect(leases)
    assert time.monotonic() - started < 1.0
    end = time.monotonic() + 5.0
    while not threads and time.monotonic() < end:
        time.sleep(0.01)  # The worker is in the release, at the gate.
    gate.set()
    assert threads
    assert threads[0] is not threading.current_thread()
    assert acquire_free("sync", store.url, name) < 5.0


def test_a_released_or_with_lease_gives_no_warning(store: Store) -> None:
    """Leases released by hand or by ``with`` are collected silently."""
    lock = resilient.lock(fresh_name(), backend=store.url)
    lease: Any = lock.acquire()
    lease.release()
    with lock as inner:
        assert inner.held
    del lease, inner
    gc.collect()  # filterwarnings=error: a warning here fails the test


# 4. No password in a repr ---------------------------------------------------

SECRET_URLS = [
    "redis://:s3cr%40t@cache.example:6379/0",
    "redis://alice:s3cr%40t@cache.example:6379/0?namespace=x",
    "rediss://alice:s3cr%40t@cache.example:6380/0",
    "postgresql://alice:s3cr%40t@db.example:5432/app",
    "postgres://alice:s3cr%40t@db.example/app?table=locks",
]


def _no_secret(text: str) -> None:
    assert "s3cr" not in text, text
    assert "%40t" not in text, text


@pytest.mark.parametrize("url", SECRET_URLS)
def test_lock_config_and_lock_hide_the_password(url: str) -> None:
    """`LockConfig`'s repr and str, and `Lock`'s, show the URL with its
    password as ``***`` (user and host stay)."""
    config = resilient.LockConfig(backend=url)
    for text in (repr(config), str(config)):
        _no_secret(text)
        assert ":***@" in text
        assert "example" in text
    _no_secret(repr(resilient.lock("job", config=config)))


@pytest.mark.parametrize("url", SECRET_URLS)
def test_store_options_and_backends_hide_the_password(url: str) -> None:
    """The parsed URL options of Redis and PostgreSQL (the driver's URL and
    the secrets kept to cut from messages) and the sync and async backends
    made from the URL show no password."""
    from resilient._backends import _postgres, _redis

    module: Any = _redis if url.startswith("redis") else _postgres
    options = module.parse_url(url)
    for text in (repr(options), str(options)):
        _no_secret(text)
    _no_secret(repr(module.sync_backend(url)))

    async def twin() -> str:
        from resilient._lock._async import loop_token

        backend = async_backend(url, loop_token("asyncio"))
        try:
            return repr(backend)
        finally:
            await backend.aclose()

    _no_secret(anyio.run(twin))


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cr%40t@127.0.0.1:1/0?timeout=0.2",
        "postgresql://alice:s3cr%40t@127.0.0.1:1/app?timeout=0.2",
    ],
)
def test_errors_and_logs_of_an_unreachable_store_hide_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that cannot be reached: `LockNotAcquired`, its cause (the
    store's `LockBackendError`) and the log lines name no password."""
    caplog.set_level(logging.DEBUG, logger="resilient")
    with pytest.raises(LockNotAcquired) as info:
        resilient.lock(fresh_name(), backend=url, timeout=0.3).acquire()
    cause = info.value.__cause__
    assert cause is not None
    for text in (str(info.value), repr(info.value), str(cause), repr(cause)):
        _no_secret(text)
    _no_secret(caplog.text)


def test_a_url_without_a_password_is_shown_whole() -> None:
    """Only the password is hidden: a URL without one is shown as given."""
    url = "redis://cache.example:6379/0"
    assert url in repr(resilient.LockConfig(backend=url))


# 5. Logs ---------------------------------------------------------------------


def test_a_loss_at_exit_is_logged_without_the_owner_token(
    store: Store, shell: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease found gone at exit is logged at WARNING with the lock's name
    (never its owner token)."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    owners: list[OwnerToken] = []

    def body(lease: resilient.Lease) -> None:
        owners.append(lease._record.owner)
        store.delete(LockKey.of(name))

    caplog.set_level(logging.DEBUG, logger="resilient")
    with pytest.raises(LockLost):
        run(shell, in_block(shell, lock, body))
    lost = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "lost" in r.getMessage()
    ]
    assert len(lost) == 1, caplog.records
    assert repr(name) in lost[0].getMessage()
    for record in caplog.records:
        assert owners[0].hex not in record.getMessage()


def test_a_loss_found_by_renewal_is_logged(
    store: Store, shell: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal the store answers "not yours" logs the loss at WARNING,
    once, with the lock's name."""
    name = fresh_name()
    lock = resilient.lock(name, backend=store.url, ttl=60.0)
    caplog.set_level(logging.DEBUG, logger="resilient")
    if shell == "sync":
        lease = lock.acquire()
        store.delete(LockKey.of(name))
        with pytest.raises(LockLost):
            lease.renew()
        lease.release()
    else:

        async def main() -> None:
            lease = await lock.aacquire()
            store.delete(LockKey.of(name))
            with pytest.raises(LockLost):
                await lease.arenew()
            await lease.arelease()

        anyio.run(main, backend=shell)
    lost = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lost) == 1, caplog.records
    assert repr(name) in lost[0].getMessage()
    assert (
        "gone" in lost[0].getMessage() or "no longer" in lost[0].getMessage()
    )


def test_waiting_is_logged_at_debug(
    store: Store, shell: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller that finds the lock held and waits says so at DEBUG (once
    per acquisition, with the name), and nothing about the lock above
    DEBUG (other tests' background threads may log meanwhile)."""
    name = fresh_name()
    held: list[resilient.Lease] = []
    thread = threading.Thread(
        target=lambda: held.append(
            resilient.lock(name, backend=store.url).acquire()
        )
    )
    thread.start()
    thread.join()
    try:
        lock = resilient.lock(name, backend=store.url, timeout=0.1)
        caplog.set_level(logging.DEBUG, logger="resilient")

        if shell == "sync":
            with pytest.raises(LockNotAcquired):
                lock.acquire()
        else:

            async def main() -> None:
                with pytest.raises(LockNotAcquired):
                    await lock.aacquire()

            anyio.run(main, backend=shell)
    finally:
        held[0].release()
    waits = [
        r
        for r in caplog.records
        if "wait" in r.getMessage() and repr(name) in r.getMessage()
    ]
    assert len(waits) == 1, caplog.records
    assert waits[0].levelno == logging.DEBUG
    assert all(
        r.levelno <= logging.DEBUG
        for r in caplog.records
        if repr(name) in r.getMessage()
    )


def test_the_docs_fence_columns_are_64_bit() -> None:
    """Fencing tokens start at the wall-clock microsecond (past 2**50): a
    fence column the docs declare is ``BIGINT``, never a 32-bit type."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"\bfence\s+([A-Za-z]+)", text):
            kind = match.group(1).upper()
            if kind in {"INT", "INTEGER", "INT4", "SMALLINT", "SERIAL"}:
                found.append(f"{page.name}: {match.group(0)}")
    assert not found
