"""
The embedded store in the environments a job runs in (RELIABILITY test
24): cron and ssh runs of one job share one store; a second user is
refused, naming the path; a store that keeps failing is logged while a
caller waits. Real processes, bounded.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

import resilient
from resilient._backends import _memory as memory
from resilient.testing import FakeClock
from tests.conftest import Driver


ROOT = Path(__file__).resolve().parent.parent

JOB = """
    import os, sys, time, resilient
    lock = resilient.lock(os.environ["NAME"], ttl=30, timeout=0.3)
    print(lock.url, flush=True)
    try:
        lease = lock.acquire()
    except resilient.LockNotAcquired:
        print("refused", flush=True)
    else:
        print("held", flush=True)
        sys.stdin.readline()  # Held until the test says so.
        lease.release()
"""


def job(env: dict[str, str]) -> subprocess.Popen[str]:
    """The job, in a fresh Python with exactly *env* (plus the path)."""
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", textwrap.dedent(JOB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
        | env,
    )


def test_cron_and_ssh_runs_of_a_job_share_one_store(tmp_path: Path) -> None:
    """The same job from an ssh session (``XDG_RUNTIME_DIR``,
    ``XDG_CACHE_HOME`` and ``HOME`` set) and from cron (none of them, or a
    ``HOME`` that ``sudo`` kept) resolves the same default store, and the
    two runs exclude each other: one store per user whatever the
    environment, and never under ``/run/user/$UID`` (removed at logout)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    name = f"job-{uuid.uuid4().hex}"
    ssh = job(
        {
            "NAME": name,
            "XDG_RUNTIME_DIR": str(run),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "HOME": str(tmp_path / "home"),
        }
    )
    try:
        assert ssh.stdout is not None
        ssh_url = ssh.stdout.readline().strip()
        assert ssh.stdout.readline().strip() == "held", ssh.stderr
        for env in ({"NAME": name}, {"NAME": name, "HOME": str(tmp_path)}):
            cron = job(env)
            out, err = cron.communicate(timeout=20)
            cron_url, answer = out.split()
            assert cron_url == ssh_url
            assert answer == "refused", err
        assert str(run) not in ssh_url
        assert str(tmp_path) not in ssh_url
    finally:
        ssh.communicate("\n", timeout=20)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as nobody")
def test_a_second_user_is_refused_naming_the_path() -> None:
    """The embedded store is one user's (docs/locks.md): another uid using
    it, even with the files made readable and writable for all, is refused
    at once with an error naming the file and its owner, never served
    through files it does not own."""
    # Not under pytest's 0700 directory: nobody must reach the files.
    where = Path(tempfile.mkdtemp(prefix="resilient-second-uid-", dir="/tmp"))
    try:
        where.chmod(0o755)
        _as_nobody(where)
    finally:
        shutil.rmtree(where)


def _as_nobody(where: Path) -> None:
    url = f"sqlite:///{where / 'locks.sqlite3'}"
    resilient.lock("job", backend=url).acquire().release()
    for suffix in ("", "-wal", "-shm"):
        (where / f"locks.sqlite3{suffix}").chmod(0o666)
    code = """
        import os, resilient
        import resilient._backends._sqlite, resilient._lock._sync
        # Python and the package are under root's 0700 home: imported
        # first, then the child becomes nobody.
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        try:
            resilient.lock("job", backend=os.environ["URL"]).acquire()
        except resilient.LockBackendError as exc:
            print(exc.reason, exc)
    """
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
        | {"URL": url},
        timeout=20,
        check=False,
        cwd="/",
    )
    assert done.stdout.startswith("unsafe "), (done.stdout, done.stderr)
    assert str(where / "locks.sqlite3") in done.stdout
    assert "owned by uid 0" in done.stdout


def test_a_store_that_keeps_failing_is_logged_while_a_caller_waits(
    driver: Driver,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that keeps failing while a caller waits (here 12 s) is
    logged at once, then at most every 5 s, never silently retried (with
    ``timeout=None`` the wait would otherwise hang with nothing said).
    Generic to the wait loop: every backend's errors reach it."""
    url = f"memory://{uuid.uuid4().hex}"
    store = memory.store(url)

    def down(*_: Any) -> Any:
        raise ConnectionError("down")

    monkeypatch.setattr(store, "acquire", down)
    lock = resilient.lock("job", backend=url, timeout=12.0)
    with (
        caplog.at_level(logging.WARNING, logger="resilient"),
        pytest.raises(resilient.LockNotAcquired),
    ):
        driver.call(lock, lambda: None)
    said = [r for r in caplog.records if "still trying" in r.getMessage()]
    assert 2 <= len(said) <= 3, [r.getMessage() for r in said]
    assert "memory store failed (ConnectionError)" in said[0].getMessage()
