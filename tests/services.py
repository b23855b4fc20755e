"""
Throwaway Redis and PostgreSQL servers for the tests.

Each server runs from the installed binaries (``redis-server``; PostgreSQL's
``initdb`` and ``postgres``) on a free loopback port with its files in a
temporary folder, in a process group of its own, so a fault test can kill it
(``SIGKILL``), pause it (``SIGSTOP`` / ``SIGCONT``) and start it again on the
same port without touching any other server on the machine.

PostgreSQL refuses to run as root. When the tests run as root (CI does), the
server runs as the ``postgres`` system user if there is one (the server
package creates it), else as a system user ``resilient-test`` created here
with ``useradd``.

When a binary is missing, the fixtures in ``conftest.py`` fall back to the
server named by ``REDIS_URL`` / ``DATABASE_URL`` for tests that do not kill
or pause it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self


#: How long a server may take to accept connections after a start.
START_SECONDS = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_binary(name: str) -> str | None:
    """*name* on PATH or in PostgreSQL's versioned bin folders."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}")):
        return str(candidate)
    return None


class ServiceError(RuntimeError):
    """A throwaway server could not be started; the message says why."""


class _Process:
    """One server process in its own process group."""

    name = "server"

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _ready(self) -> bool:
        raise NotImplementedError

    def _log_path(self) -> Path:
        raise NotImplementedError

    def _log_tail(self) -> str:
        log = self._log_path()
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def start(self) -> Self:
        """Start the server and wait until it accepts connections."""
        assert self.proc is None or self.proc.poll() is not None
        with self._log_path().open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                **self._popen_kwargs(),
            )
        self.paused = False
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with {self.proc.returncode} at "
                    f"start: {self._log_tail()}"
                )
            if self._ready():
                return self
            time.sleep(0.01)
        self.kill()
        raise ServiceError(
            f"{self.name} did not accept connections on port {self.port} "
            f"within {START_SECONDS:.0f} s: {self._log_tail()}"
        )

    def _pids(self) -> list[int]:
        """The server's processes: the main one and its children (they
        may have left its process group: PostgreSQL's call setsid())."""
        assert self.proc is not None
        pids = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        with contextlib.suppress(OSError):
            pids += [int(p) for p in children.read_text().split()]
        return pids

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if sig in {signal.SIGSTOP, signal.SIGKILL}:
            # Freeze the main process first, so that it forks no child
            # between the listing of its children and their signal.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGSTOP)
        pids = self._pids()
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        """Freeze every process of the server (``SIGSTOP``)."""
        self._signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Let a paused server run on (``SIGCONT``)."""
        self._signal_group(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """``SIGKILL`` every process of the server and reap it."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self._signal_group(signal.SIGCONT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.paused = False

    def restart(self) -> Self:
        """Kill the server, then start it again on the same port."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """End the server for good (a kill: nothing here needs its data)."""
        self.kill()
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer(_Process):
    """
    A ``redis-server`` on a free port with no persistence (a restart loses
    every key, the case the fence floor is for), unless *appendonly*.
    """

    name = "redis-server"

    def __init__(
        self,
        binary: str,
        folder: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(port or free_port())
        self.binary = binary
        self.folder = folder
        self.appendonly = appendonly
        self.extra = extra
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            str(self.folder),
            "--logfile",
            str(self.folder / "redis.log"),
            "--daemonize",
            "no",
            *self.extra,
        ]

    def _log_path(self) -> Path:
        return self.folder / "redis.log"

    def command(self, *args: str, timeout: float = 2.0) -> bytes:
        """
        Send one command in RESP and return the raw first reply line
        (enough for readiness, ``CONFIG SET`` and ``DEBUG`` in tests).
        """
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        with socket.create_connection(
            ("127.0.0.1", self.port), timeout=timeout
        ) as s:
            s.sendall(b"".join(parts))
            return s.recv(65536)

    def _ready(self) -> bool:
        try:
            # A server with ``--requirepass`` answers NOAUTH: it is up.
            reply = self.command("PING", timeout=0.5)
            return reply.startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False


def _server_user() -> pwd.struct_passwd | None:
    """
    The user PostgreSQL runs as: None when not root; else ``postgres`` if
    it exists, else ``resilient-test`` (created here).
    """
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "resilient-test"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ServiceError(
            "PostgreSQL refuses to run as root, there is no 'postgres' "
            "user and no useradd to create 'resilient-test'"
        )
    subprocess.run(  # noqa: S603
        [useradd, "--system", "--no-create-home", "resilient-test"],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam("resilient-test")


def _chown_tree(path: Path, user: pwd.struct_passwd | None) -> None:
    if user is None:
        return
    os.chown(path, user.pw_uid, user.pw_gid)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(Path(root) / name, user.pw_uid, user.pw_gid)


class PostgresTemplate:
    """
    One ``initdb``-made data folder, copied for every server started from
    it (``initdb`` takes about a second; a copy takes a few milliseconds).
    """

    def __init__(self, folder: Path) -> None:
        initdb = find_binary("initdb")
        postgres = find_binary("postgres")
        if initdb is None or postgres is None:
            raise ServiceError("initdb or postgres is not installed")
        self.postgres = postgres
        self.user = _server_user()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        _chown_tree(folder, self.user)
        self.data = folder / "template"
        result = subprocess.run(  # noqa: S603
            [
                initdb,
                "--pgdata",
                str(self.data),
                "--username",
                "postgres",
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            check=False,
            capture_output=True,
            user=self.user.pw_uid if self.user else None,
            group=self.user.pw_gid if self.user else None,
            cwd=folder,
        )
        if result.returncode:
            raise ServiceError(
                "initdb failed: "
                + result.stderr.decode(errors="replace")[-2000:]
            )

    def spawn(self, name: str) -> PostgresServer:
        """A new (not yet started) server with its own copy of the data."""
        data = self.folder / name
        shutil.copytree(self.data, data, symlinks=True)
        _chown_tree(data, self.user)
        data.chmod(0o700)
        return PostgresServer(self.postgres, data, self.user)


class PostgresServer(_Process):
    """
    A PostgreSQL server on a free loopback port (trust auth, user and
    database ``postgres``; fsync off: a test server).
    """

    name = "postgres"

    def __init__(
        self,
        binary: str,
        data: Path,
        user: pwd.struct_passwd | None,
        *,
        port: int | None = None,
    ) -> None:
        super().__init__(port or free_port())
        self.binary = binary
        self.data = data
        self.user = user

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.data}",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=on",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=100",
            "-c",
            "logging_collector=off",
            "-c",
            f"log_directory={self.data}",
        ]

    def _log_path(self) -> Path:
        return self.data.parent / f"{self.data.name}.log"

    def _popen_kwargs(self) -> dict[str, Any]:
        if self.user is None:
            return {"cwd": self.data}
        return {
            "cwd": self.data,
            "user": self.user.pw_uid,
            "group": self.user.pw_gid,
            "extra_groups": [],
        }

    def _ready(self) -> bool:
        # The startup packet of a bare protocol-3 connection: the server
        # answers 'R' (authentication request) once it accepts logins,
        # 'E' while it is starting or recovering.
        user = b"user\x00postgres\x00database\x00postgres\x00\x00"
        body = (196608).to_bytes(4, "big") + user
        packet = (len(body) + 4).to_bytes(4, "big") + body
        try:
            with socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.5
            ) as s:
                s.sendall(packet)
                return s.recv(1)[:1] == b"R"
        except OSError:
            return False


def temporary_folder(prefix: str) -> Path:
    """A new folder under the system's temporary folder, world-traversable
    so a server running as another user can reach its data."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path
