"""
What only the Redis lock backend does, against a real ``redis-server``: the
fence tombstone, bounded storage, keys under one hash tag, batched renewal
in one script, error replies (RELIABILITY test 11) and the fenced writes
of the resource side. What it shares with PostgreSQL is in
``test_server_backends.py``. Every scenario runs on the sync twin and the
async twin (asyncio, and trio through threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
import redis

from resilient._backends import (
    Grant,
    LockKey,
    OwnerToken,
    ReleaseResult,
    Renewal,
    _redis,
)
from resilient.exceptions import LockBackendError
from tests.backend_shells import Shell, open_shell
from tests.faultproxy import FaultProxy
from tests.service_fixtures import RUN_ID, with_query
from tests.services import RedisServer


pytestmark = pytest.mark.redis


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A key prefix of this run and test."""
    return f"rt{RUN_ID}-{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client to look at the server."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def shell(redis_url: str, namespace: str, colour: str) -> Iterator[Shell]:
    """The backend twin of this test's colour on the shared test server."""
    with open_shell(
        "_redis", with_query(redis_url, namespace=namespace), colour
    ) as s:
        yield s


def lease_key(namespace: str, name: str) -> str:
    return f"{namespace}:lock:{{{LockKey.of(name).hex}}}"


def test_fence_counts_from_the_tombstone_not_the_clock(
    shell: Shell, raw: redis.Redis, namespace: str
) -> None:
    """
    A release keeps the fence (and only the fence) for a moment: a grant in
    that window counts up from it even if the stored fence is ahead of the
    server's clock; then the key goes away on its own.
    """
    key = LockKey.of("ahead")
    owner = OwnerToken()
    assert isinstance(shell.acquire(key, owner, 10.0), Grant)
    assert shell.release(key, owner) is ReleaseResult.RELEASED
    k = lease_key(namespace, "ahead")
    assert raw.hgetall(k).keys() == {b"f"}
    assert 0 < raw.pttl(k) <= _redis.TOMBSTONE_MS
    future = (int(time.time()) + 10**6) * 10**6
    raw.hset(k, "f", str(future))
    grant = shell.acquire(key, OwnerToken(), 10.0)
    assert grant == Grant(fence=future + 1, ttl=10.0)


def test_storage_is_bounded(
    shell: Shell,
    raw: redis.Redis,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    One hash per lock, nothing else: after 300 names were taken and
    released, their keys are gone once the tombstones expire.
    """
    monkeypatch.setattr(_redis._commands, "TOMBSTONE_MS", 30)
    for i in range(300):
        key, owner = LockKey.of(f"name-{i}"), OwnerToken()
        assert isinstance(shell.acquire(key, owner, 10.0), Grant)
        assert shell.release(key, owner) is ReleaseResult.RELEASED
    deadline = time.monotonic() + 2
    while list(raw.scan_iter(f"{namespace}:*")):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_keys_are_hashed_under_one_hash_tag(
    shell: Shell, raw: redis.Redis, namespace: str
) -> None:
    """
    A lock's key is its namespace and the hash of its name inside one pair
    of braces (the cluster hash tag), whatever braces the name holds.
    """
    names = ["{a}", "}{", "{{}}", "x" * 1000]
    for name in names:
        grant = shell.acquire(LockKey.of(name), OwnerToken(), 10.0)
        assert isinstance(grant, Grant)
    keys = sorted(k.decode() for k in raw.scan_iter(f"{namespace}:*"))
    assert keys == sorted(lease_key(namespace, n) for n in names)
    for k in keys:
        assert k.count("{") == 1
        assert k.endswith("}")
        assert len(k) == len(namespace) + len(":lock:{}") + 64


def test_one_round_trip_renews_a_batch(shell: Shell, raw: redis.Redis) -> None:
    """A batch of 100 leases is renewed by one script call."""
    owners = [(LockKey.of(f"many-{i}"), OwnerToken()) for i in range(100)]
    for key, owner in owners:
        assert isinstance(shell.acquire(key, owner, 10.0), Grant)

    def evalsha_calls() -> int:
        stats = raw.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    before = evalsha_calls()
    result = shell.renew([Renewal(k, o, 10.0) for k, o in owners])
    assert evalsha_calls() - before == 1
    assert list(result) == [True] * 100


# Error replies (RELIABILITY test 11) -----------------------------------------


def _expect(
    shell: Shell, reason: str, *, retryable: bool, owner: OwnerToken
) -> LockBackendError:
    with pytest.raises(LockBackendError) as info:
        shell.acquire(LockKey.of("err"), owner, 1.0)
    error = info.value
    assert error.reason == reason
    assert error.retryable is retryable
    assert error.scheme == "redis"
    assert owner.hex not in str(error)
    return error


@pytest.fixture
def own_server(
    redis_server: RedisServer, colour: str
) -> Iterator[tuple[Shell, redis.Redis]]:
    """The backend on a throwaway server this test may break."""
    with open_shell("_redis", redis_server.url + "?timeout=0.5", colour) as s:
        client = redis.Redis.from_url(redis_server.url)
        yield s, client
        client.close()


def test_oom_is_retryable_and_grants_nothing(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """
    Out of memory (``maxmemory 1``): a retryable LockBackendError, and the
    lease was not written.
    """
    shell, client = own_server
    client.set("ballast", "x" * 10000)
    client.config_set("maxmemory", "1")
    _expect(shell, "OOM", retryable=True, owner=OwnerToken())
    client.config_set("maxmemory", "0")
    assert client.keys("resilient:*") == []


def test_noscript_after_script_flush_reloads(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """After ``SCRIPT FLUSH`` the backend sends the script again and works."""
    shell, client = own_server
    key, owner = LockKey.of("flushed"), OwnerToken()
    assert isinstance(shell.acquire(key, owner, 5.0), Grant)
    client.script_flush()
    assert shell.renew([Renewal(key, owner, 5.0)]) == [True]
    client.script_flush()
    assert shell.release(key, owner) is ReleaseResult.RELEASED


def test_a_kept_connection_the_server_closed_is_not_used(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """The backend keeps its answered connections for the next call; when
    the server closes them while they are idle (``CLIENT KILL``, an idle
    timeout), the next call notices before sending and uses a new one, on
    the sync and the async twin alike, whatever redis-py's own check at
    checkout does (8.1's asyncio pool used such a connection, 8.2's does
    not): no call fails, and each still answers truly."""
    shell, client = own_server
    key, owner = LockKey.of("kept"), OwnerToken()

    def after_kill(call: Callable[[], object]) -> object:
        client.client_kill_filter(_type="normal", skipme=True)
        return call()

    assert isinstance(shell.acquire(key, owner, 5.0), Grant)
    before = {c["id"] for c in client.client_list()}
    assert after_kill(lambda: shell.renew([Renewal(key, owner, 5.0)])) == [
        True
    ]
    released = after_kill(lambda: shell.release(key, owner))
    assert released is ReleaseResult.RELEASED
    assert shell.release(key, owner) is ReleaseResult.NOT_HELD
    after = {c["id"] for c in client.client_list()}
    assert after - before  # The backend's new connection.


def test_a_kept_connection_closed_while_the_loop_was_busy_is_not_used(
    redis_server: RedisServer,
) -> None:
    """The server closes the asyncio twin's kept connection while the event
    loop is busy (here: blocked in a sync call), so the loop has not read
    the end of the stream when the next call takes the connection: the
    backend still sees it closed, from its socket, and the call is answered
    on a new connection, not failed."""
    client = redis.Redis.from_url(redis_server.url)
    key, owner = LockKey.of("busy"), OwnerToken()

    async def main() -> None:
        backend = _redis.async_backend(redis_server.url + "?timeout=0.5")
        try:
            assert isinstance(await backend.acquire(key, owner, 5.0), Grant)
            # No await from here to the call: the loop reads nothing.
            client.client_kill_filter(_type="normal", skipme=True)
            deadline = time.monotonic() + 2.0
            # Until the server has acted; blocking the loop is the point.
            while len(client.client_list(_type="normal")) > 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)  # noqa: ASYNC251
            time.sleep(0.05)  # noqa: ASYNC251 - the end of stream arrives.
            renewed = await backend.renew([Renewal(key, owner, 5.0)])
            assert list(renewed) == [True]
            assert await backend.release(key, owner) is ReleaseResult.RELEASED
        finally:
            await backend.aclose()

    try:
        anyio.run(main)
    finally:
        client.close()


def test_wrongtype_is_not_retryable(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """A key of another type where the lease should be: WRONGTYPE, final."""
    shell, client = own_server
    client.set(f"resilient:lock:{{{LockKey.of('err').hex}}}", "not a hash")
    _expect(shell, "WRONGTYPE", retryable=False, owner=OwnerToken())


def test_a_key_of_another_type_fails_no_other_lease_of_the_batch(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """One lease key of a renewal batch overwritten with a string: that
    lease reads as gone (False), the others of the batch are renewed; its
    release says NOT_HELD and leaves the string alone."""
    shell, client = own_server
    owner = OwnerToken()
    keys = [LockKey.of(f"batch-{i}") for i in range(3)]
    for key in keys:
        assert isinstance(shell.acquire(key, owner, 5.0), Grant)
    client.set(f"resilient:lock:{{{keys[1].hex}}}", "not a hash")
    renewed = shell.renew([Renewal(k, owner, 5.0) for k in keys])
    assert list(renewed) == [True, False, True]
    assert shell.release(keys[1], owner) is ReleaseResult.NOT_HELD
    assert client.get(f"resilient:lock:{{{keys[1].hex}}}") == b"not a hash"


def test_readonly_replica_is_retryable(
    own_server: tuple[Shell, redis.Redis], redis_server: RedisServer
) -> None:
    """A replica refuses the write: READONLY, retryable, nothing granted."""
    shell, client = own_server
    client.execute_command("REPLICAOF", "127.0.0.1", "1")
    try:
        _expect(shell, "READONLY", retryable=True, owner=OwnerToken())
    finally:
        client.execute_command("REPLICAOF", "NO", "ONE")
    assert client.keys("resilient:*") == []


def test_busy_script_is_retryable(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """
    While another script runs past the busy threshold the server answers
    BUSY: retryable.
    """
    shell, client = own_server
    client.config_set("busy-reply-threshold", "10")
    blocker = redis.Redis.from_url(_url_of(client))
    thread = threading.Thread(
        target=lambda: _swallow(
            lambda: blocker.eval(
                "local t = redis.call('TIME') "
                "while true do local n = redis.call('TIME') "
                "if n[1] - t[1] > 1 then break end end",
                0,
            )
        ),
        daemon=True,
    )
    thread.start()
    time.sleep(0.1)
    try:
        _expect(shell, "BUSY", retryable=True, owner=OwnerToken())
    finally:
        _swallow(lambda: redis.Redis.from_url(_url_of(client)).script_kill())
        thread.join(5)


def test_noauth_is_not_retryable(
    own_server: tuple[Shell, redis.Redis],
) -> None:
    """A server that wants a password answers NOAUTH: final."""
    shell, client = own_server
    client.config_set("requirepass", "sesame")
    client.connection_pool.disconnect()
    try:
        _expect(shell, "NOAUTH", retryable=False, owner=OwnerToken())
    finally:
        authed = redis.Redis.from_url(_url_of(client), password="sesame")  # noqa: S106
        authed.config_set("requirepass", "")
        authed.close()


def test_loading_is_retryable(colour: str) -> None:
    """
    A server still loading its data answers LOADING: retryable (a fake
    server that answers only that).
    """
    with (
        _FakeRedis(
            b"-LOADING Redis is loading the dataset in memory\r\n"
        ) as port,
        open_shell("_redis", f"redis://127.0.0.1:{port}/0", colour) as shell,
    ):
        _expect(shell, "LOADING", retryable=True, owner=OwnerToken())


# helpers ---------------------------------------------------------------------


def _url_of(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


def _swallow(fn: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        fn()


class _FakeRedis:
    """A TCP server that answers every RESP command with one canned reply."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()

    def __enter__(self) -> int:
        threading.Thread(target=self._serve, daemon=True).start()
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.sock.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._answer, args=(conn,), daemon=True
            ).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                # One reply per command in the chunk.
                conn.sendall(self.reply * max(1, _commands(data)))


def _commands(data: bytes) -> int:
    return sum(1 for line in data.split(b"\r\n") if line.startswith(b"*"))


# The resource side: fenced writes -------------------------------------------


def test_fenced_set_refuses_stale_and_equal_tokens(
    raw: redis.Redis, namespace: str
) -> None:
    """
    A fenced write is applied only above every earlier token (an equal
    token is refused too); tokens past 2**53 compare exactly.
    """
    from resilient import fenced_redis_set as fenced_set

    key = f"{namespace}:resource"
    big = 2**60
    assert fenced_set(raw, key, "a", 10)
    assert not fenced_set(raw, key, "stale", 9)
    assert not fenced_set(raw, key, "same", 10)
    assert fenced_set(raw, key, "b", 11)
    assert fenced_set(raw, key, "c", big)
    assert not fenced_set(raw, key, "d", big - 1)
    assert fenced_set(raw, key, "e", big + 1)
    assert raw.hgetall(key) == {
        b"fence": str(big + 1).encode(),
        b"value": b"e",
    }
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(TypeError, match="fencing token"):
            fenced_set(raw, key, "x", bad)  # type: ignore[arg-type]


def test_afenced_set_with_the_asyncio_client(
    redis_url: str, namespace: str
) -> None:
    """The asyncio twin applies the same check, also after SCRIPT FLUSH."""

    import redis.asyncio

    from resilient import afenced_redis_set as afenced_set

    async def main() -> list[bool]:
        client = redis.asyncio.Redis.from_url(redis_url)
        key = f"{namespace}:aresource"
        out = [await afenced_set(client, key, b"v1", 5)]
        await client.script_flush()
        out.append(await afenced_set(client, key, b"v0", 4))
        out.append(await afenced_set(client, key, b"v2", 6))
        await client.aclose()
        return out

    assert asyncio.run(main()) == [True, False, True]


def test_an_async_release_wakes_the_head_before_its_answer(
    redis_server: RedisServer,
) -> None:
    """
    An asyncio release made in this process wakes the head of the lock's
    line in this process as soon as its request is written, before the
    store answers it: the head's acquire, sent after the release on
    another connection, overlaps the release's round trip instead of
    following it (a hand-over between two tasks of one loop cost two round
    trips in a row). Here the store never answers the release (a
    blackholed link), and the head was woken all the same.
    """
    key = LockKey.of("early")

    async def main(url: str, proxy: FaultProxy) -> list[int]:
        backend = _redis.async_backend(url)
        seen: list[int] = []
        here = threading.get_ident()

        def notify() -> None:
            # Not the listener thread's (a spurious wake-up as it starts
            # listening, or the store's notice): the release's own.
            if threading.get_ident() == here:
                seen.append(1)

        holder = OwnerToken()
        try:
            assert isinstance(await backend.acquire(key, holder, 5.0), Grant)
            stop = backend.watch(key, notify)
            try:
                proxy.blackhole()
                with pytest.raises(LockBackendError):
                    await backend.release(key, holder)
            finally:
                stop()
        finally:
            proxy.heal()
            await backend.aclose()
        return seen

    with FaultProxy(redis_server.port) as proxy:
        url = proxy.url("redis", "/0?timeout=0.3")
        assert asyncio.run(main(url, proxy)) == [1]


def test_an_asyncio_call_runs_in_its_callers_task(
    redis_url: str, namespace: str
) -> None:
    """
    An asyncio call of the Redis backend runs in the caller's task: no
    task of its own per command. redis-py sends through
    ``asyncio.wait_for`` when its connection has a socket timeout, which
    before Python 3.12 wraps the send in a new task: two more turns of the
    event loop per call, on every hand-over of a lock between tasks. The
    backend's own limit (``fail_after``) bounds the call instead
    (``test_paused_server_ends_each_call_within_its_limit``).
    """
    url = with_query(redis_url, namespace=namespace)
    key = LockKey.of("no-task")

    async def main() -> int:
        backend = _redis.async_backend(url)
        loop = asyncio.get_running_loop()
        made: list[object] = []

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
        ) -> asyncio.Task[Any]:
            made.append(coro)
            return asyncio.Task(coro, loop=loop, **kwargs)

        try:
            owner = OwnerToken()
            assert isinstance(await backend.acquire(key, owner, 5.0), Grant)
            loop.set_task_factory(factory)
            try:
                assert await backend.release(key, owner) is (
                    ReleaseResult.RELEASED
                )
                assert isinstance(
                    await backend.acquire(key, owner, 5.0), Grant
                )
                assert await backend.renew([Renewal(key, owner, 5.0)]) == [
                    True
                ]
                await backend.release(key, owner)
            finally:
                loop.set_task_factory(None)
        finally:
            await backend.aclose()
        return len(made)

    assert asyncio.run(main()) == 0


def test_an_async_release_does_not_wake_the_next_head_once_the_lock_went_on(
    redis_url: str, namespace: str
) -> None:
    """
    The head woken by an asyncio release's early wake-up took the lock and
    left the line before the release was answered: the answer wakes nobody
    (the next one in line would only find the lock held: one wasted request
    to the store per hand-over, and a turn of its task during the hold).
    """
    url = with_query(redis_url, namespace=namespace)
    key = LockKey.of("went-on")

    async def main() -> list[str]:
        backend = _redis.async_backend(url)
        hub = backend._hub  # type: ignore[attr-defined]
        channel = backend._commands.channel(key)  # type: ignore[attr-defined]
        here = threading.get_ident()
        woken: list[str] = []
        stops: dict[str, Callable[[], None]] = {}

        def first() -> None:
            if threading.get_ident() == here and "first" in stops:
                woken.append("first")
                # It got the lock (as its early acquire would) and leaves.
                hub.granted(channel, asyncio.current_task())
                stops.pop("first")()

        def second() -> None:
            if threading.get_ident() == here:
                woken.append("second")

        holder = OwnerToken()
        try:
            assert isinstance(await backend.acquire(key, holder, 5.0), Grant)
            stops["first"] = backend.watch(key, first)
            stops["second"] = backend.watch(key, second)
            try:
                assert await backend.release(key, holder) is (
                    ReleaseResult.RELEASED
                )
            finally:
                for stop in stops.values():
                    stop()
        finally:
            await backend.aclose()
        return woken

    assert asyncio.run(main()) == ["first"]
