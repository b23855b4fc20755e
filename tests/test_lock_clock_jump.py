"""
RELIABILITY test 7, the server's side: ``redis-server``'s wall clock jumps
forward by one TTL while a lease is held (Redis 7 expires keys on wall
time, so the lease's key expires at once on the server).

The jump comes from our own LD_PRELOAD shim (``tests/clock_jump.c``, built
here with gcc into the test's folder): it adds an offset, read from a file
the test writes, to the server's ``CLOCK_REALTIME``, ``gettimeofday`` and
``time``, and nothing else (libfaketime's threads and timers crashed
redis-server). Real time, TTL 0.6 s, a few seconds in all.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import resilient
from resilient.exceptions import LockLost, LockNotAcquired
from tests import services
from tests.service_fixtures import missing_service


# slow: a real-time server clock jump, of code no Python version changes;
# `tests_matrix` leaves it to the `tests` session.
pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TTL = 0.6
STALE_WRITES = 20


class JumpedRedis(services.RedisServer):
    """A throwaway ``redis-server`` whose wall clock the test can move."""

    def __init__(self, binary: str, folder: Path, shim: Path) -> None:
        super().__init__(binary, folder)
        self.offset_file = folder / "clock-offset-us"
        self.offset_file.write_text("0")
        self.shim = shim

    def _popen_kwargs(self) -> dict[str, Any]:
        env = {
            "PATH": "/usr/bin:/bin",
            "LD_PRELOAD": str(self.shim),
            "RESILIENT_CLOCK_JUMP_FILE": str(self.offset_file),
        }
        return {"env": env}

    def jump(self, seconds: float) -> None:
        """Move the server's wall clock by *seconds* from now on."""
        self.offset_file.write_text(str(round(seconds * 1e6)))
        time.sleep(0.01)  # The shim looks at the file once a millisecond.


def build_shim(folder: Path) -> Path:
    """The shim, compiled for this machine; fails (never skips) without gcc:
    every machine that runs the suite, CI's included, has it."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build the clock-jump shim, and missing")
    out = folder / "clock_jump.so"
    subprocess.run(  # noqa: S603
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            "-o",
            str(out),
            str(ROOT / "tests" / "clock_jump.c"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


@pytest.fixture
def jumped_redis(tmp_path: Path) -> Any:
    """A started throwaway Redis under the shim, stopped at the end."""
    shim = build_shim(tmp_path)
    binary = services.find_binary("redis-server")
    if binary is None:
        missing_service("redis-server is not installed")
    server = JumpedRedis(binary, tmp_path / "redis", shim)
    try:
        server.start()
    except services.ServiceError as e:
        missing_service(f"could not start redis-server under the shim: {e}")
    try:
        yield server
    finally:
        server.stop()


def test_the_shim_moves_only_the_servers_wall_clock(
    jumped_redis: JumpedRedis,
) -> None:
    """The shim works as the test below needs: ``TIME`` jumps by the offset
    and a key's expiry follows the jumped clock (a key with a minute to
    live is gone once the clock is two minutes ahead)."""
    import redis

    client = redis.Redis.from_url(jumped_redis.url)
    before = client.time()[0]
    client.set("k", "v", px=60_000)
    jumped_redis.jump(120)
    after = client.time()[0]
    assert 119 <= after - before <= 150
    assert client.get("k") is None
    client.close()


def test_a_server_clock_jump_loses_the_lease_and_fences_the_old_holder(
    jumped_redis: JumpedRedis, tmp_path: Path
) -> None:
    """
    The server's clock jumps forward one TTL under a held lease, so the
    lease's key expires at once and a rival is granted. Then: the rival's
    fencing token is higher; the holder learns it lost the lease
    (`LockLost` at its next renewal, within a few renewal intervals, and
    again when it leaves the block); both fenced resources (the Redis
    compare-and-set script and the SQL guard) refuse every one of the old
    holder's writes and take the rival's; and the rival's lease is not
    stolen in turn (a third caller is refused while it is renewed).
    """
    import redis

    client = redis.Redis.from_url(jumped_redis.url)
    db = sqlite3.connect(tmp_path / "resource.sqlite3", isolation_level=None)
    db.execute("CREATE TABLE res (id INTEGER PRIMARY KEY, v TEXT, fence INT)")
    db.execute("INSERT INTO res VALUES (1, NULL, NULL)")

    def write(value: str, token: int) -> tuple[bool, bool]:
        in_redis = resilient.fenced_redis_set(client, "res", value, token)
        in_sql = resilient.fenced_update(
            db, "res", {"v": value}, where={"id": 1}, token=token
        )
        return in_redis, in_sql

    url = f"{jumped_redis.url}?timeout=0.5"
    holder = resilient.lock("report", backend=url, ttl=TTL)
    rival = resilient.lock("report", backend=url, ttl=TTL, timeout=5 * TTL)
    third = resilient.lock("report", backend=url, ttl=TTL, blocking=False)
    granted: list[resilient.Lease] = []
    lost_after: list[float] = []

    with pytest.raises(LockLost), holder as lease:
        old = lease.token
        assert write("old", old) == (True, True)
        jumped_redis.jump(TTL)
        jumped = time.monotonic()
        thread = threading.Thread(
            target=lambda: granted.append(rival.acquire())
        )
        thread.start()
        thread.join(10)
        (new,) = granted
        assert new.token > old
        assert write("new", new.token) == (True, True)
        # The holder's next renewal finds the key gone (or the rival's).
        limit = time.monotonic() + 6 * TTL
        while time.monotonic() < limit:
            try:
                lease.checkpoint()
            except LockLost:
                lost_after.append(time.monotonic() - jumped)
                break
            time.sleep(0.01)
        assert lost_after, "the holder never learnt it had lost the lease"
        assert not lease.held
        refused = [write(f"stale-{i}", old) for i in range(STALE_WRITES)]
        assert refused == [(False, False)] * STALE_WRITES
    # The rival's lease survives its renewals on the jumped clock.
    for _ in range(int(3 * TTL / 0.05)):
        new.checkpoint()
        time.sleep(0.05)
    with pytest.raises(LockNotAcquired):
        third.acquire()
    assert new.release() is resilient.ReleaseResult.RELEASED
    assert client.hget("res", "value") == b"new"
    assert db.execute("SELECT v, fence FROM res").fetchone() == (
        "new",
        new.token,
    )
    client.close()
    db.close()
