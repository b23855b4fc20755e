"""
What the Redis and PostgreSQL lock backends share, written once and run
against both real servers, on the sync twin and the async twin (asyncio,
and trio through threads): the protocol's contract, fences, TTL units,
names, time limits, dead and frozen servers, lost and late replies, and
the wake-ups of waiters. What only one of them does is in
``test_redis_backend.py`` and ``test_postgres_backend.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import resilient
from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
    _postgres,
    _redis,
    _watch,
)
from resilient.exceptions import LockBackendError
from tests.backend_shells import Shell, open_shell
from tests.faultproxy import FaultProxy
from tests.lock_contract import BackendContract, settle_watch
from tests.server_stores import Store, store_of
from tests.service_fixtures import RUN_ID, Services
from tests.services import PostgresServer, RedisServer


MODULES = {"redis": "_redis", "postgresql": "_postgres"}

KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Each scenario on Redis and on PostgreSQL."""
    return str(request.param)


@pytest.fixture
def store(kind: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    """This test's own namespace (Redis) or table (PostgreSQL) on the
    shared test server of its kind."""
    server_url = request.getfixturevalue(
        "redis_url" if kind == "redis" else "postgres_url"
    )
    scope = f"t{RUN_ID}_{abs(hash(request.node.nodeid)) % 10**8}"
    s = store_of(kind, server_url, scope)
    yield s
    s.close()


@pytest.fixture
def shell(store: Store, colour: str) -> Iterator[Shell]:
    """The backend twin of this test's colour on its store."""
    with open_shell(store.module, store.url, colour) as s:
        yield s


@pytest.fixture(scope="module")
def fault_postgres(test_services: Services) -> Iterator[PostgresServer]:
    """
    A throwaway PostgreSQL of this module's own that its tests freeze, kill
    and restart (each leaves it running; one for all of them, as a fresh
    one costs a second or two to start).
    """
    server = test_services.postgres()
    yield server
    test_services.release(server)


@pytest.fixture
def fault_server(
    kind: str, request: pytest.FixtureRequest
) -> RedisServer | PostgresServer:
    """A throwaway server this test may freeze, kill and restart."""
    if kind == "redis":
        server: RedisServer | PostgresServer = request.getfixturevalue(
            "redis_server"
        )
    else:
        server = request.getfixturevalue("fault_postgres")
    return server


@pytest.fixture
def fault_store(
    kind: str, fault_server: RedisServer | PostgresServer
) -> Iterator[Store]:
    """The default namespace or table on the throwaway server, its calls
    limited to 0.5 s."""
    s = store_of(kind, fault_server.url, options="timeout=0.5")
    yield s
    s.close()


def _proxied(kind: str, proxy: FaultProxy, timeout: float) -> str:
    """The lock URL of a server reached through *proxy*."""
    if kind == "redis":
        return proxy.url("redis", f"/0?timeout={timeout}")
    return proxy.url(
        "postgresql", f"/postgres?user=postgres&timeout={timeout}"
    )


# The operations -------------------------------------------------------------


def test_acquire_busy_regrant_renew_release(
    shell: Shell, store: Store
) -> None:
    """
    A free name is granted with a fence; another owner finds it busy with
    the time left; the holder's own retry is granted again with the same
    fence and the new TTL; renew is a compare-and-set on the owner, one
    answer per request in order; release is compare-and-delete and
    harmless to repeat; the next owner's fence is higher.
    """
    key = LockKey.of("job")
    me, other = OwnerToken(), OwnerToken()
    grant = shell.acquire(key, me, 5.0)
    assert isinstance(grant, Grant)
    assert grant.ttl == 5.0
    busy = shell.acquire(key, other, 5.0)
    assert isinstance(busy, Busy)
    assert busy.expires_in is not None
    assert 4.0 < busy.expires_in <= 5.0
    assert shell.acquire(key, me, 7.0) == Grant(fence=grant.fence, ttl=7.0)
    left = store.left(key)
    assert left is not None
    assert 6.0 < left <= 7.0
    assert shell.renew([Renewal(key, other, 9.0), Renewal(key, me, 9.0)]) == [
        False,
        True,
    ]
    left = store.left(key)
    assert left is not None
    assert 8.0 < left <= 9.0
    assert shell.release(key, other) is ReleaseResult.NOT_HELD
    assert shell.release(key, me) is ReleaseResult.RELEASED
    assert shell.release(key, me) is ReleaseResult.NOT_HELD
    assert shell.renew([Renewal(key, me, 1.0)]) == [False]
    following = shell.acquire(key, other, 1.0)
    assert isinstance(following, Grant)
    assert following.fence > grant.fence


def test_fences_rise_across_release_and_expiry(shell: Shell) -> None:
    """
    Fences strictly increase per name over 100 grants, alternating release
    and expiry on the server's clock, also when the grants follow each
    other at once; an expired lease is not renewed.
    """
    key = LockKey.of("counter")
    last = 0
    for i in range(100):
        owner = OwnerToken()
        grant = shell.acquire(key, owner, 0.001 if i % 2 else 10.0)
        assert isinstance(grant, Grant)
        assert grant.fence > last
        last = grant.fence
        if i % 2 == 0:
            assert shell.release(key, owner) is ReleaseResult.RELEASED
        else:
            time.sleep(0.002)
            assert shell.renew([Renewal(key, owner, 1.0)]) == [False]


@pytest.mark.parametrize(
    ("ttl", "applied"),
    [(0.0001, 0.001), (0.5, 0.5), (1.5, 1.5), (10**9, 10**9)],
)
def test_ttl_units(
    shell: Shell, store: Store, ttl: float, applied: float
) -> None:
    """
    TTLs go to the server in milliseconds rounded up, never down to 0: the
    lease's time left on the server is within [ttl - 50 ms, ttl] (less
    only by the time the calls took on a loaded machine), a
    sub-millisecond TTL is 1 ms (the lease may be gone already), and the
    grant reports the TTL applied.
    """
    key = LockKey.of(f"ttl-{ttl}")
    start = time.monotonic()
    grant = shell.acquire(key, OwnerToken(), ttl)
    assert isinstance(grant, Grant)
    assert grant.ttl == applied
    left = store.left(key)
    # Less only by the time the two calls took (50 ms on a quiet machine).
    slack = max(time.monotonic() - start, 0.05)
    if applied < 0.05:
        assert left is None or left <= applied
    else:
        assert left is not None
        assert applied - slack <= left <= applied


def test_names_are_hashed(shell: Shell, store: Store) -> None:
    """
    Names with braces, glob and SQL metacharacters, NUL, lone surrogates,
    NFC/NFD twins and a megabyte of text each get their own lease, named
    by the name's hash; none blocks another.
    """
    names = [
        "{a}",
        "*",
        "[x]?",
        "a\x00b",
        "\ud800",
        "\u00e9t\u00e9",
        "e\u0301te\u0301",
        "x" * 1_000_000,
        "' OR 1=1 --",
    ]
    for name in names:
        grant = shell.acquire(LockKey.of(name), OwnerToken(), 10.0)
        assert isinstance(grant, Grant), name[:20]
    assert store.lease_ids() == {store.id_of(LockKey.of(n)) for n in names}


@pytest.mark.parametrize(
    ("module", "url", "field"),
    [
        ("_redis", "redis://:hunter2@h/0?namespace={x}", "namespace"),
        ("_redis", "redis://:hunter2@h/0?timeout=0", "timeout"),
        ("_redis", "redis://:hunter2@h/0?timeout=soon", "timeout"),
        ("_postgres", "postgresql://u:hunter2@h/db?table=x;drop", "table"),
        ("_postgres", "postgresql://u:hunter2@h/db?table=a.b.c", "table"),
        ("_postgres", 'postgresql://u:hunter2@h/db?table="q"', "table"),
        ("_postgres", "postgresql://u:hunter2@h/db?table=", "table"),
        ("_postgres", "postgresql://u:hunter2@h/db?timeout=-1", "timeout"),
    ],
)
def test_bad_url_options_fail_at_construction(
    module: str, url: str, field: str
) -> None:
    """A bad namespace, table or timeout is a ConfigError naming the
    parameter and not the URL (which may hold a password)."""
    backend_module = {"_redis": _redis, "_postgres": _postgres}[module]
    with pytest.raises(resilient.ConfigError, match=field) as info:
        backend_module.sync_backend(url)
    assert "hunter2" not in str(info.value)


def test_small_cases(shell: Shell, store: Store) -> None:
    """
    An empty renewal batch needs no round trip; reprs show no owner token;
    no time left (an expired deadline) is a timeout before anything is
    sent; the driver's own URL parameters pass through; made outside an
    event loop, the async twin is the asyncio one.
    """
    module = {"redis": _redis, "postgresql": _postgres}[store.kind]
    owner = OwnerToken()
    key = LockKey.of("small")
    assert list(shell.renew([])) == []
    assert owner.hex not in repr(shell.backend)
    with resilient.deadline(0), pytest.raises(LockBackendError) as info:
        shell.acquire(key, owner, 1.0)
    assert info.value.reason == "timeout"
    extra = (
        "health_check_interval=5"
        if store.kind == "redis"
        else "application_name=locks"
    )
    url = f"{store.url}&{extra}"
    backend = module.sync_backend(url)
    assert isinstance(backend.acquire(key, owner, 1.0), Grant)
    backend.close()
    twin = module.async_backend(url)
    assert type(twin).__name__.startswith("Async")


# Dead, frozen and restarted servers; lost and late replies ------------------


def test_paused_server_ends_each_call_within_its_limit(
    fault_server: RedisServer | PostgresServer, fault_store: Store, colour: str
) -> None:
    """
    With the server frozen (SIGSTOP), acquire, renew and release each raise
    a retryable timeout within their limit (the ttl, the URL's timeout),
    and after SIGCONT the lease is as it was: never a false grant or
    release.
    """
    with open_shell(fault_store.module, fault_store.url, colour) as shell:
        key, owner = LockKey.of(f"frozen-{colour}"), OwnerToken()
        grant = shell.acquire(key, owner, 5.0)
        assert isinstance(grant, Grant)
        fault_server.pause()
        try:
            for call, limit in (
                (lambda: shell.acquire(key, OwnerToken(), 0.2), 0.2),
                (lambda: shell.renew([Renewal(key, owner, 0.3)]), 0.3),
                (lambda: shell.release(key, owner), 0.5),
            ):
                start = time.monotonic()
                with pytest.raises(LockBackendError) as info:
                    call()
                took = time.monotonic() - start
                assert info.value.reason == "timeout"
                assert info.value.retryable
                assert took < limit + 0.5  # slack for a loaded machine
        finally:
            fault_server.resume()
        assert isinstance(shell.acquire(key, OwnerToken(), 1.0), Busy)
        assert shell.acquire(key, owner, 5.0) == Grant(grant.fence, 5.0)


def test_killed_and_restarted_server(
    fault_server: RedisServer | PostgresServer, fault_store: Store, colour: str
) -> None:
    """
    A killed server makes every call raise a retryable error naming the
    server's host; after a restart, a durable store (PostgreSQL) still has
    the lease and its fence, and one that lost every key (Redis without
    persistence) grants a fence still above every fence before (the clock
    floor).
    """
    with open_shell(fault_store.module, fault_store.url, colour) as shell:
        key, owner = LockKey.of(f"restart-{colour}"), OwnerToken()
        first = shell.acquire(key, owner, 30.0)
        assert isinstance(first, Grant)
        fault_server.kill()
        try:
            for call in (
                lambda: shell.renew([Renewal(key, owner, 30.0)]),
                lambda: shell.release(key, owner),
                lambda: shell.acquire(key, owner, 1.0),
            ):
                with pytest.raises(LockBackendError) as info:
                    call()
                assert info.value.retryable
                assert info.value.where == f"127.0.0.1:{fault_server.port}"
        finally:
            fault_server.start()  # the module's other tests need it
        after: Grant | Busy | None = None
        for _ in range(5):  # the pool's dead connections fail once each
            try:
                after = shell.acquire(key, owner, 30.0)
                break
            except LockBackendError:
                continue
        assert isinstance(after, Grant)
        if fault_store.durable:
            assert after.fence == first.fence
        else:
            assert after.fence > first.fence
        assert shell.release(key, owner) is ReleaseResult.RELEASED


def test_dropped_reply_to_a_grant_is_recognised(
    kind: str, fault_server: RedisServer | PostgresServer, colour: str
) -> None:
    """
    The reply to a successful acquire is lost (the connection is reset
    after the server granted): the call raises a retryable error, and the
    retry with the same owner finds its own lease and gets the same fence
    at once instead of waiting out the ttl; others find it busy.
    """
    with (
        FaultProxy(fault_server.port) as proxy,
        open_shell(
            MODULES[kind],
            _proxied(kind, proxy, 0.5),
            colour,
        ) as shell,
    ):
        key, owner = LockKey.of(f"lost-reply-{colour}"), OwnerToken()
        warm = shell.acquire(LockKey.of(f"warm-{colour}"), owner, 1.0)
        assert isinstance(warm, Grant)
        proxy.drop_next_reply(then="reset")
        with pytest.raises(LockBackendError) as info:
            shell.acquire(key, owner, 30.0)
        assert info.value.retryable
        assert proxy.dropped_replies == 1
        granted = shell.acquire(key, owner, 30.0)
        assert isinstance(granted, Grant)
        assert isinstance(shell.acquire(key, OwnerToken(), 30.0), Busy)
        direct = store_of(kind, fault_server.url)
        try:
            assert direct.fence_of(key) == granted.fence
        finally:
            direct.close()
        shell.release(key, owner)


def test_reply_after_the_limit_is_not_success(
    kind: str, fault_server: RedisServer | PostgresServer, colour: str
) -> None:
    """
    A reply that would arrive after the call's limit (200 ms of latency
    each way against a 250 ms limit) is never read as a grant: the call
    times out.
    """
    with (
        FaultProxy(fault_server.port) as proxy,
        open_shell(
            MODULES[kind],
            _proxied(kind, proxy, 2),
            colour,
        ) as shell,
    ):
        warm = shell.acquire(LockKey.of(f"warm-{colour}"), OwnerToken(), 1.0)
        assert isinstance(warm, Grant)
        proxy.latency = 0.2
        with pytest.raises(LockBackendError) as info:
            shell.acquire(LockKey.of(f"slow-{colour}"), OwnerToken(), 0.1)
        assert info.value.reason == "timeout"


# Wake-ups --------------------------------------------------------------------


def test_watch_survives_a_server_restart(
    fault_server: RedisServer | PostgresServer, fault_store: Store
) -> None:
    """
    The wake-up connection is lost when the server is killed: once the
    server is back, the hub listens again on its own and tells its
    waiters (once, as it starts again), and a release wakes them again.
    """
    from resilient._backends import open_backend

    backend = open_backend(fault_store.url)
    key, owner = LockKey.of("watch-restart"), OwnerToken()
    assert isinstance(backend.acquire(key, owner, 30.0), Grant)
    woken = threading.Event()
    stop = backend.watch(key, woken.set)
    try:
        settle_watch(woken)
        fault_server.kill()
        fault_server.start()
        assert woken.wait(10.0), "no wake-up after the server came back"
        woken.clear()
        for _ in range(5):  # the pool's dead connections fail once each
            try:
                backend.acquire(key, owner, 30.0)
                break
            except LockBackendError:
                continue
        settle_watch(woken)
        assert backend.release(key, owner) is ReleaseResult.RELEASED
        assert woken.wait(5.0)
    finally:
        stop()


def test_the_wake_up_thread_ends_when_nobody_watches(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    The hub's thread starts with the first watcher and ends (closing its
    connection) once nobody has watched for a while; the next watcher
    starts it again; closing the last backend of the store ends it too.
    """
    monkeypatch.setattr(_watch, "LINGER", 0.05)
    module = {"redis": _redis, "postgresql": _postgres}[store.kind]
    # A driver URL of its own: a hub is shared by every backend of a
    # server in the process, and this test closes the last one.
    name = "client_name" if store.kind == "redis" else "application_name"
    backend = module.sync_backend(f"{store.url}&{name}=l{uuid.uuid4().hex}")
    hub = backend._hub

    def running() -> bool:
        thread = hub._thread
        return thread is not None and thread.is_alive()

    def ends(why: str) -> None:
        deadline = time.monotonic() + 10.0
        while running():
            assert time.monotonic() < deadline, why
            time.sleep(0.02)

    key = LockKey.of("linger")
    for _ in range(2):
        stop = backend.watch(key, lambda: None)
        assert running()
        stop()
        ends("the thread did not end once nobody watched")
    backend.watch(key, lambda: None)
    assert running()
    thread = hub._thread
    backend.close()
    ends("closing the backend did not end it")
    assert thread is not None
    thread.join(5.0)
    assert not thread.is_alive()


def test_a_line_that_changes_but_stays_does_not_wake_the_listener(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Waiters joining or leaving the line of a lock that others still wait
    for do not wake the hub's listening thread (nothing to subscribe or
    unsubscribe): the first watcher of a lock and the last one to leave
    do. Each wake-up made the thread run and take the GIL from the next
    waiter's hand-over (two per hand-over, with the store's notice).
    """
    module = {"redis": _redis, "postgresql": _postgres}[store.kind]
    backend = module.sync_backend(store.url)
    hub = backend._hub
    pokes: list[int] = []
    monkeypatch.setattr(hub, "poke", lambda: pokes.append(1))
    key = LockKey.of("quiet")
    try:
        stops = [backend.watch(key, lambda: None) for _ in range(5)]
        assert len(pokes) == 1  # The first: to subscribe.
        for stop in stops[:-1]:
            stop()
        assert len(pokes) == 1
        stops[-1]()
        assert len(pokes) == 2  # The last: to unsubscribe.
    finally:
        monkeypatch.undo()
        backend.close()


def test_a_waiting_lock_is_woken_by_the_release(store: Store) -> None:
    """
    A lock waiting for a held name (its backoff grown to a second) gets it
    within a fraction of that second of the release: the release woke it,
    it did not find it on its backoff.
    """
    holder = resilient.lock("wake", backend=store.url, ttl=30.0)
    slow = resilient.FullJitter(base=1.0, cap=1.0)
    waiter = resilient.lock(
        "wake", backend=store.url, ttl=30.0, timeout=20.0, backoff=slow
    )
    got: list[float] = []

    def wait() -> None:
        with waiter:
            got.append(time.monotonic())

    lease = holder.acquire()
    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)  # the waiter is asleep in its backoff by now
    released = time.monotonic()
    lease.release()
    thread.join(20.0)
    assert got, "the waiter never got the lock"
    # Its backoff draws up to a second; a wake-up comes in milliseconds.
    assert got[0] - released < 0.25


# The backend contract (tests/lock_contract.py) ------------------------------


class TestServerContract(BackendContract):
    """``redis://`` and ``postgresql://``: the contract every backend keeps."""

    @pytest.fixture
    def lock_backend_url(
        self, kind: str, request: pytest.FixtureRequest
    ) -> str:
        server_url = request.getfixturevalue(
            "redis_url" if kind == "redis" else "postgres_url"
        )
        return store_of(kind, server_url, f"c{uuid.uuid4().hex}").url

    @pytest.fixture
    def delete_lease(
        self, kind: str, request: pytest.FixtureRequest
    ) -> Iterator[Callable[[str, LockKey], None]]:
        opened: list[Store] = []

        def delete(url: str, key: LockKey) -> None:
            server_url, scope = _split_scope(url)
            s = store_of(kind, server_url, scope)
            opened.append(s)
            s.delete(key)

        yield delete
        for s in opened:
            s.close()

    @pytest.fixture
    def count_rows(
        self, kind: str, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[Callable[[str], int]]:
        # Released leases leave something for a moment (Redis: the fence
        # tombstone; PostgreSQL: the free row, until the sweep): shortened
        # here, so the count is of the store once it settles.
        monkeypatch.setattr(_redis._commands, "TOMBSTONE_MS", 10)
        monkeypatch.setattr(_postgres._statements, "SWEEP_AFTER", "0 seconds")
        monkeypatch.setattr(_postgres._io, "SWEEP_EVERY", 0.0)
        opened: list[Store] = []

        def count(url: str) -> int:
            time.sleep(0.05)
            server_url, scope = _split_scope(url)
            s = store_of(kind, server_url, scope)
            opened.append(s)
            return len(s.lease_ids())

        yield count
        for s in opened:
            s.close()


def _split_scope(url: str) -> tuple[str, str]:
    """A contract URL's server URL and its namespace or table."""
    base, _, query = url.rpartition("?")
    _, _, scope = query.partition("=")
    return base, scope


@pytest.mark.parametrize("kind_", ["redis", "postgresql"])
def test_a_hub_without_its_server_keeps_trying_and_closes(kind_: str) -> None:
    """
    A wake-up hub whose server refuses connections never blocks or fails
    its watchers: its thread tries again on a backoff, and closing the
    last backend of the store ends it (twice is harmless).
    """
    from tests.services import free_port

    scheme = "redis" if kind_ == "redis" else "postgresql"
    url = f"{scheme}://127.0.0.1:{free_port()}/0?timeout=0.2"
    module = {"redis": _redis, "postgresql": _postgres}[kind_]
    backend = module.sync_backend(url)
    hub = backend._hub
    start = time.monotonic()
    stop = backend.watch(LockKey.of("nobody"), lambda: None)
    # It never waits for the connection (the thread makes it); a second
    # allows for a thread's start on a loaded machine.
    assert time.monotonic() - start < 1.0
    time.sleep(0.3)  # a few refused connections, with backoff
    thread = hub._thread
    assert thread is not None
    assert thread.is_alive()
    stop()
    backend.close()
    backend.close()
    thread.join(5.0)
    assert not thread.is_alive()


def test_where_a_store_is_names_no_secret() -> None:
    """A store's place in messages is its host and port only: no user,
    password, path or query; IPv6 in brackets; a URL without a host, or
    one that cannot be read, says so; passwords are cut from text."""
    from resilient._backends._base import hide, url_secrets, url_where

    assert url_where("redis://u:pw@10.0.0.5:6379/0?x=1") == "10.0.0.5:6379"
    assert url_where("postgresql://db.internal/app") == "db.internal"
    assert url_where("redis://[::1]:7000/0") == "[::1]:7000"
    assert url_where("postgresql:///app?host=/run/pg") == "(default host)"
    assert url_where("redis://h:notaport/0") == "(unreadable host)"
    assert url_secrets("redis://h/0") == ()
    assert url_secrets("redis://h:notaport/0") == ()
    secrets = url_secrets("redis://:p%40ss@h/0")
    assert set(secrets) == {"p%40ss", "p@ss"}
    assert hide("bad p@ss and p%40ss", secrets) == "bad (secret) and (secret)"


# A lost lease's exit -------------------------------------------------------


@pytest.mark.parametrize("library", ["sync", "asyncio"])
def test_a_lost_lease_sends_its_release_once_to_a_hanging_store(
    kind: str,
    fault_server: RedisServer | PostgresServer,
    library: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    A block whose lease was lost while the store hangs (every reply held
    back) raises `LockLost` at its exit and sends its release once: the
    release that got no answer is not sent a second time by the exit's
    clean-up. At 4f15275 the scope's `LockLost` sent the exit down its
    interrupt path, which released again (two sends, each waiting out the
    store's timeout).
    """
    sent: list[str] = []
    sync_cls = (
        _redis.RedisBackend if kind == "redis" else _postgres.PostgresBackend
    )
    async_cls = (
        _redis.AsyncRedisBackend
        if kind == "redis"
        else _postgres.AsyncPostgresBackend
    )
    sync_release, async_release = sync_cls.release, async_cls.release

    def counted(self: Any, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        sent.append("sync")
        return sync_release(self, key, owner)

    async def acounted(
        self: Any, key: LockKey, owner: OwnerToken
    ) -> ReleaseResult:
        sent.append("async")
        return await async_release(self, key, owner)

    monkeypatch.setattr(sync_cls, "release", counted)
    monkeypatch.setattr(async_cls, "release", acounted)
    with FaultProxy(fault_server.port) as proxy:
        url = _proxied(kind, proxy, 0.3)
        lock = resilient.lock(f"lost-once-{library}", backend=url, ttl=1.0)
        if library == "sync":
            with pytest.raises(resilient.LockLost), lock:
                proxy.blackhole()
                time.sleep(2.0)
        else:

            async def main() -> None:
                with pytest.raises(resilient.LockLost):
                    async with lock:
                        proxy.blackhole()
                        await anyio.sleep(2.0)

            anyio.run(main, backend="asyncio")
        proxy.heal()
    assert len(sent) == 1, sent
