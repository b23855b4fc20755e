"""
The embedded store against its filesystem (RELIABILITY test 23): files
removed under a holder, links and files planted in its directories,
directories others can write, stores that can never work, forked children
and a platform without ``/proc``. Real processes, short TTLs, bounded.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import resilient
from resilient._backends import Grant, LockKey, OwnerToken, open_backend
from resilient._backends._sqlite import _schema
from resilient.exceptions import LockBackendError
from tests.conftest import Driver


ROOT = Path(__file__).resolve().parent.parent

DB = "locks.sqlite3"


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An embedded store in this test's own directory."""
    return f"sqlite:///{tmp_path / DB}"


def run(code: str, url: str, *, timeout: float = 20.0) -> str:
    """Run *code* in a fresh Python with ``URL`` set: its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "URL": url}
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CONTENDER = """
    import os, resilient
    lock = resilient.lock(
        os.environ.get("NAME", "job"), backend=os.environ["URL"], ttl=30,
        timeout=0.6,
    )
    try:
        lease = lock.acquire()
    except resilient.LockNotAcquired as exc:
        print("refused", exc.reason)
    except resilient.LockBackendError as exc:
        print("refused", exc.reason)
    else:
        print("got")
        lease.release()
"""


def wait_lost(lease: resilient.Lease, within: float) -> float:
    """Seconds until *lease* is lost, failing after *within*."""
    start = time.monotonic()
    while not lease.lost:
        assert time.monotonic() - start < within, "the holder was not told"
        time.sleep(0.02)
    return time.monotonic() - start


def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / f"{DB}.locks"


def remove_lock_file(tmp_path: Path) -> None:
    (lock_dir(tmp_path) / f"{LockKey.of('job').hex}.lock").unlink()


def remove_lock_dir(tmp_path: Path) -> None:
    shutil.rmtree(lock_dir(tmp_path))


def link_as_lock_file(tmp_path: Path) -> None:
    """The lock file replaced by a link to a file outside (planted)."""
    remove_lock_file(tmp_path)
    outside = tmp_path / "outside-victim"
    outside.write_bytes(b"precious")
    (lock_dir(tmp_path) / f"{LockKey.of('job').hex}.lock").symlink_to(outside)


def remove_database(tmp_path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"{DB}{suffix}").unlink()


def link_as_database(tmp_path: Path) -> None:
    """The database, -wal and -shm replaced by links to a file outside."""
    remove_database(tmp_path)
    outside = tmp_path / "outside-victim"
    outside.write_bytes(b"precious")
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"{DB}{suffix}").symlink_to(outside)


@pytest.mark.parametrize(
    "remove",
    [
        remove_lock_file,
        remove_lock_dir,
        remove_database,
        link_as_lock_file,
        link_as_database,
    ],
)
def test_a_removed_file_never_gives_two_holders(
    tmp_path: Path, url: str, remove: object
) -> None:
    """While a lease is held (TTL 2 s, renewed every 0.67 s), removing its
    lock file, the lock directory or the database (with -wal and -shm), or
    planting a link as its lock file, lets no other process take the lock
    (a fresh file proves nothing: takeover only on the inode the holder
    recorded, and a missing row whose flock is held counts as a lease),
    and the holder's renewal notices its file is gone and loses the lease
    (`LockLost`) within one renewal interval."""
    contender = ready(CONTENDER, url)  # Started (and imported) already.
    lease = resilient.lock("job", backend=url, ttl=2.0).acquire()
    try:
        remove(tmp_path)  # type: ignore[operator]
        # The lease is valid for at least 1.33 s more; the contender tries
        # for 0.6 s from now.
        out, err = contender.communicate("go\n", timeout=20)
        assert out.startswith("refused"), ("two holders", out, err)
        wait_lost(lease, within=2.0 / 3 + 0.5)
    finally:
        lease.release()
    victim = tmp_path / "outside-victim"
    assert not victim.exists() or victim.read_bytes() == b"precious"
    if remove in {link_as_lock_file, link_as_database}:
        return
    # Once the lost lease's TTL is over, the lock is anyone's again.
    time.sleep(2.0)
    assert run(CONTENDER, url) == "got"


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@pytest.mark.parametrize("remove", [remove_lock_file, remove_database])
def test_an_async_holder_is_told_its_file_is_gone(
    tmp_path: Path, url: str, remove: object, loop: str
) -> None:
    """The same on an event loop: the async holder's renewal (every
    0.67 s) loses the lease once its lock file or database is gone, and a
    newcomer in another process is refused meanwhile."""
    contender = ready(CONTENDER, url)

    async def main() -> tuple[float, str, str]:
        lease = await resilient.lock("job", backend=url, ttl=2.0).aacquire()
        try:
            remove(tmp_path)  # type: ignore[operator]
            start = time.monotonic()
            while not lease.lost:
                assert time.monotonic() - start < 2.0 / 3 + 0.5
                await anyio.sleep(0.02)
            took = time.monotonic() - start
            # The lost lease's TTL is not over yet (2 s from its last
            # renewal): the newcomer is refused.
            out, err = await anyio.to_thread.run_sync(
                lambda: contender.communicate("go\n", timeout=20)
            )
            return took, out, err
        finally:
            await lease.arelease()

    took, out, err = anyio.run(main, backend=loop)
    assert took < 2.0 / 3 + 0.5
    assert out.startswith("refused"), ("two holders", out, err)


def ready(code: str, url: str) -> subprocess.Popen[str]:
    """*code* in a fresh Python, started once it reads a line on stdin."""
    child = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            "-c",
            "import sys, resilient, resilient._backends._sqlite\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n" + textwrap.dedent(code),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "URL": url},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_lease_held_by_another_process_survives_a_fresh_lock_file(
    tmp_path: Path, url: str
) -> None:
    """A holder in another process, its lock file removed: a newcomer's
    flock of a fresh file does not take the live lease over."""
    holder = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
                import os, sys, time, resilient
                lease = resilient.lock(
                    "job", backend=os.environ["URL"], ttl=30
                ).acquire()
                print("held", flush=True)
                time.sleep(30)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "URL": url},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        remove_lock_file(tmp_path)
        assert run(CONTENDER, url).startswith("refused"), "two holders"
    finally:
        holder.kill()
        holder.communicate(timeout=10)


# -- links, planted files, directories others can write --------------------


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the store's directories that nothing may touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "victim"
    path.write_bytes(b"precious")
    os.utime(path, (1_000_000, 1_000_000))
    return path


def untouched(path: Path) -> bool:
    st = path.stat()
    return path.read_bytes() == b"precious" and st.st_mtime == 1_000_000


def test_a_planted_link_as_a_lock_file_is_refused(
    tmp_path: Path, url: str, victim: Path
) -> None:
    """A symbolic link planted as a name's lock file is refused at once with
    an error naming it; its target is not opened, truncated or written."""
    resilient.lock("other", backend=url).acquire().release()  # The dir.
    planted = lock_dir(tmp_path) / f"{LockKey.of('job').hex}.lock"
    planted.symlink_to(victim)
    start = time.monotonic()
    with pytest.raises(LockBackendError) as info:
        resilient.lock("job", backend=url, timeout=5).acquire()
    assert time.monotonic() - start < 1.0
    assert str(planted) in str(info.value)
    assert "symbolic link" in str(info.value)
    assert not info.value.retryable
    assert untouched(victim)


def test_a_planted_hard_link_as_a_lock_file_is_refused(
    tmp_path: Path, url: str, victim: Path
) -> None:
    """A hard link to another file planted as a lock file is refused."""
    resilient.lock("other", backend=url).acquire().release()
    planted = lock_dir(tmp_path) / f"{LockKey.of('job').hex}.lock"
    os.link(victim, planted)
    with pytest.raises(LockBackendError, match="hard link"):
        resilient.lock("job", backend=url, timeout=5).acquire()
    assert untouched(victim)


def test_a_planted_link_as_a_wake_fifo_is_never_written(
    tmp_path: Path, url: str, victim: Path
) -> None:
    """A link planted as a name's wake-up FIFO: a waiter does not open its
    target and the release writes nothing into it."""
    lease = resilient.lock("job", backend=url).acquire()
    planted = lock_dir(tmp_path) / f"{LockKey.of('job').hex}.wake"
    planted.symlink_to(victim)
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, resilient; resilient.lock('job', "
                "backend=os.environ['URL'], timeout=10).acquire().release()"
            ),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT), "URL": url},
    )
    marked = lock_dir(tmp_path) / f"{LockKey.of('job').hex}.lock"
    end = time.monotonic() + 10
    while marked.stat().st_size == 0:  # The waiter marks the file, waits.
        assert time.monotonic() < end
        time.sleep(0.01)
    time.sleep(0.1)
    lease.release()
    assert waiter.wait(15) == 0
    assert untouched(victim)


def test_a_link_planted_while_a_caller_waits_is_refused_at_once(
    tmp_path: Path, url: str, victim: Path
) -> None:
    """A caller waiting (up to 10 s) for a held lock whose lock file is
    replaced by a link meanwhile gets `LockBackendError` naming the link
    at once, not a raw `OSError` from its wake-up nor a wait to the end."""
    backend: Any = open_backend(url)
    assert isinstance(
        backend.acquire(LockKey.of("job"), OwnerToken(), 30.0), Grant
    )
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            resilient.lock("job", backend=url, timeout=10).acquire()
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    start = time.monotonic()
    link_as_lock_file(tmp_path)
    waiter.join(10)
    assert time.monotonic() - start < 1.0
    assert len(errors) == 1
    assert isinstance(errors[0], LockBackendError), repr(errors[0])
    assert f"{LockKey.of('job').hex}.lock" in str(errors[0])
    assert (tmp_path / "outside-victim").read_bytes() == b"precious"


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_a_planted_link_as_the_database_is_refused(
    tmp_path: Path, url: str, victim: Path, suffix: str
) -> None:
    """A link planted as the database, its -wal or -shm is refused at once,
    named; SQLite never opens its target."""
    planted = tmp_path / f"{DB}{suffix}"
    planted.symlink_to(victim)
    with pytest.raises(LockBackendError) as info:
        resilient.lock("job", backend=url, timeout=5).acquire()
    assert str(planted) in str(info.value)
    assert untouched(victim)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_directory_others_can_write_is_refused(
    tmp_path: Path, mode: int
) -> None:
    """A database in a directory that group or others can write and that
    is not sticky is refused, naming the directory; a sticky one (like
    /tmp) is accepted."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if mode & 0o020:  # A group with other members (nogroup).
        if os.geteuid() != 0:
            pytest.skip("chgrp to a group of others needs root")
        os.chown(shared, -1, 65534)
    url = f"sqlite:///{shared / DB}"
    with pytest.raises(LockBackendError) as info:
        resilient.lock("job", backend=url, timeout=5).acquire()
    assert str(shared) in str(info.value)
    assert "not sticky" in str(info.value)
    shared.chmod(mode | 0o1000)
    resilient.lock("job", backend=url).acquire().release()


def test_a_directory_of_a_private_group_is_accepted(tmp_path: Path) -> None:
    """Group-writable by the user's own private group (``umask 002``, the
    group named after the user with no other member): accepted."""
    import grp
    import pwd

    user = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(user.pw_gid)
    if group.gr_name != user.pw_name or set(group.gr_mem) - {user.pw_name}:
        pytest.skip("this user has no private group")
    shared = tmp_path / "private-group"
    shared.mkdir()
    os.chown(shared, -1, user.pw_gid)
    shared.chmod(0o770)
    resilient.lock(
        "job", backend=f"sqlite:///{shared / DB}"
    ).acquire().release()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_lock_directory_of_another_user_is_refused(
    tmp_path: Path, url: str
) -> None:
    """A lock directory owned by another uid (made first by someone else
    beside a shared database path) is refused, naming its owner."""
    lock_dir(tmp_path).mkdir(mode=0o777)
    os.chown(lock_dir(tmp_path), 65534, 65534)
    with pytest.raises(LockBackendError) as info:
        resilient.lock("job", backend=url, timeout=5).acquire()
    assert "owned by uid 65534" in str(info.value)


# -- stores that can never work --------------------------------------------


def _dir_as_database(tmp_path: Path) -> str:
    (tmp_path / DB).mkdir()
    return str(tmp_path / DB)


def _under_a_regular_file(tmp_path: Path) -> str:
    (tmp_path / "file").write_text("x")
    return str(tmp_path / "file" / DB)


def _nul_byte(tmp_path: Path) -> str:
    return f"{tmp_path}/a%00b/{DB}"


@pytest.mark.parametrize(
    "make", [_dir_as_database, _under_a_regular_file, _nul_byte]
)
def test_a_store_that_can_never_work_raises_at_once(
    tmp_path: Path, driver: Driver, make: object
) -> None:
    """A directory where the database should be, a path under a regular
    file, a NUL byte: `LockBackendError` (not retryable) at once, naming
    the path and the cause, instead of retrying for the whole wait as "the
    store did not answer" (and hanging with ``timeout=None``)."""
    path = make(tmp_path)  # type: ignore[operator]
    lock = resilient.lock("job", backend=f"sqlite:///{path}", timeout=5)
    start = time.monotonic()
    with pytest.raises(LockBackendError) as info:
        driver.call(lock, lambda: None)
    assert time.monotonic() - start < 2.0
    assert not info.value.retryable
    assert str(tmp_path) in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as nobody")
def test_a_store_without_access_raises_at_once_naming_it(
    tmp_path: Path,
) -> None:
    """As a second uid (nobody): a store in a directory it may not enter
    (EACCES) and the default store under a home it cannot write (nobody's
    home, like a read-only HOME in a container) fail at once naming the
    path, even with ``timeout=None``."""
    tmp_path.chmod(0o755)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    code = """
        import os, sys, time, resilient
        import resilient._backends._sqlite, resilient._lock._sync
        # Python and the package are under root's 0700 home: imported
        # first, then the child becomes nobody.
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        url = os.environ.get("URL") or None
        start = time.monotonic()
        try:
            resilient.lock("job", backend=url, timeout=None).acquire()
        except resilient.LockBackendError as exc:
            print(round(time.monotonic() - start), exc.reason, exc)
    """
    for url, where in [
        (f"sqlite:///{private / DB}", str(private)),
        ("", "/nonexistent"),
    ]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": str(ROOT),
            "URL": url,
            "HOME": "/nonexistent",
        }
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=env,
            timeout=10,
            check=False,
            cwd="/",
        )
        assert done.stdout.startswith("0 EACCES "), (done.stdout, done.stderr)
        assert where in done.stdout


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A read-only filesystem (a tmpfs mounted ``ro``), like a container's
    read-only HOME."""
    where = tmp_path / "ro"
    where.mkdir()
    mounted = subprocess.run(  # noqa: S603
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)],  # noqa: S607
        capture_output=True,
        check=False,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a read-only tmpfs: {mounted.stderr!r}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)  # noqa: S603, S607


@pytest.mark.parametrize("under", ["", "home/.cache/resilient/locks/"])
def test_a_store_on_a_read_only_filesystem_raises_at_once(
    read_only: Path, driver: Driver, under: str
) -> None:
    """A store on a read-only filesystem (the file itself, or directories
    still to make): `LockBackendError` ``EROFS`` at once, naming the path,
    not retried for the whole wait."""
    url = f"sqlite:///{read_only}/{under}{DB}"
    lock = resilient.lock("job", backend=url, timeout=5)
    start = time.monotonic()
    with pytest.raises(LockBackendError) as info:
        driver.call(lock, lambda: None)
    assert time.monotonic() - start < 2.0
    assert info.value.reason == "EROFS"
    assert str(read_only) in str(info.value)


# -- forks and boots ---------------------------------------------------------


def test_a_forked_child_does_not_keep_a_dead_holders_flock(
    url: str,
) -> None:
    """A holder forks a child (no exec) and is killed: the child's copies of
    the lock files were closed at the fork, so the kernel drops the flock
    and a waiter takes the lock at once, not after the 30 s TTL."""
    holder = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
                import os, time, warnings, resilient
                lease = resilient.lock(
                    "job", backend=os.environ["URL"], ttl=30
                ).acquire()
                warnings.simplefilter("ignore", DeprecationWarning)
                child = os.fork()
                if child == 0:
                    time.sleep(30)
                    os._exit(0)
                print(child, flush=True)
                time.sleep(30)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "URL": url},
    )
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        lease = resilient.lock("job", backend=url, timeout=5).acquire()
        assert lease.waited < 2.0
        lease.release()
    finally:
        os.kill(child, signal.SIGKILL)
        holder.kill()
        holder.communicate(timeout=10)


def test_without_proc_the_boot_id_survives_clock_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where there is no ``/proc/sys/kernel/random/boot_id`` (macOS, BSD),
    the boot id does not come from the wall clock: a clock step (or a
    sleep, which stops the monotonic clock there) must not change it, or a
    new process would take every live lease as one of an earlier boot."""
    real = pathlib.Path.read_text

    def no_proc(self: Path, *args: object, **kwargs: object) -> str:
        if str(self).startswith("/proc"):
            raise FileNotFoundError(str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pathlib.Path, "read_text", no_proc)
    monkeypatch.setattr(sys, "platform", "freebsd14")
    before = _schema.boot_id()
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)
    assert _schema.boot_id() == before
    monkeypatch.setattr(time, "time", lambda: wall() - 86400.0)
    assert _schema.boot_id() == before
