"""
Fixtures for tests that need a Redis or PostgreSQL server (star-imported by
``conftest.py``).

``redis_url`` / ``postgres_url``: a server for tests that do not hurt it:
a throwaway one when the binaries are installed, else REDIS_URL /
DATABASE_URL. ``redis_server`` / ``postgres_server``: a fresh throwaway
server per test, for tests that kill, pause or restart it (never a shared
one). Without binary or URL a test skips, or fails under
RESILIENT_REQUIRE_SERVICES (CI), saying why; and under that variable a run
in which any test was skipped for a reason that names a service (Redis,
PostgreSQL, their URLs or binaries) fails at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator
from typing import Any, NoReturn, final

import pytest

from tests import services


__all__ = [
    "RUN_ID",
    "Services",
    "colour",
    "missing_service",
    "postgres_lock_url",
    "postgres_server",
    "postgres_url",
    "pytest_runtest_logreport",
    "pytest_sessionfinish",
    "redis_lock_url",
    "redis_server",
    "redis_url",
    "test_services",
    "with_query",
]


#: Keys and tables of this run carry it, so runs never see each other's.
RUN_ID = secrets.token_hex(4)


def missing_service(reason: str) -> NoReturn:
    """Skip for want of *reason*; fail instead when services are required."""
    if os.environ.get("RESILIENT_REQUIRE_SERVICES"):
        pytest.fail(f"{reason}, and RESILIENT_REQUIRE_SERVICES is set")
    pytest.skip(reason)


@final
class Services:
    """Starts throwaway servers on demand; stops them all at the end."""

    def __init__(self) -> None:
        self.folder = services.temporary_folder("resilient-services-")
        self.redis_binary = services.find_binary("redis-server")
        self._template: services.PostgresTemplate | None = None
        self._template_error: str | None = None
        self._started: list[
            services.RedisServer | services.PostgresServer
        ] = []
        self._count = 0

    def redis(self, **options: Any) -> services.RedisServer:
        """A started throwaway Redis (skips or fails without the binary)."""
        if self.redis_binary is None:
            missing_service("redis-server is not installed")
        self._count += 1
        server = services.RedisServer(
            self.redis_binary, self.folder / f"redis{self._count}", **options
        )
        self._started.append(server)
        try:
            return server.start()
        except services.ServiceError as e:
            missing_service(f"could not start redis-server: {e}")

    def postgres(self) -> services.PostgresServer:
        """A started throwaway PostgreSQL (skips/fails without initdb)."""
        if self._template is None and self._template_error is None:
            try:
                self._template = services.PostgresTemplate(self.folder / "pg")
            except (services.ServiceError, OSError) as e:
                self._template_error = str(e)
        if self._template is None:
            missing_service(f"no throwaway PostgreSQL: {self._template_error}")
        self._count += 1
        server = self._template.spawn(f"pg{self._count}")
        self._started.append(server)
        try:
            return server.start()
        except services.ServiceError as e:
            missing_service(f"could not start PostgreSQL: {e}")

    def release(
        self, server: services.RedisServer | services.PostgresServer
    ) -> None:
        server.stop()
        with contextlib.suppress(ValueError):
            self._started.remove(server)

    def close(self) -> None:
        for server in self._started:
            server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(params=["sync", "asyncio", "trio"])
def colour(request: pytest.FixtureRequest) -> str:
    """A backend test on the sync twin and on the async twin (asyncio, and
    trio through threads): see `tests.backend_shells.open_shell`."""
    return str(request.param)


@pytest.fixture(scope="session")
def test_services() -> Iterator[Services]:
    """The factory of throwaway servers of this session."""
    s = Services()
    yield s
    s.close()


@pytest.fixture(scope="session")
def redis_url(test_services: Services) -> str:
    """A Redis server URL for tests that do not kill or pause it."""
    if test_services.redis_binary is None:
        url = os.environ.get("REDIS_URL")
        if url:
            return url
        missing_service("redis-server is not installed and REDIS_URL is unset")
    return test_services.redis().url


@pytest.fixture(scope="session")
def postgres_url(test_services: Services) -> str:
    """A PostgreSQL URL for tests that do not kill or pause the server."""
    if services.find_binary("initdb") is None:
        url = os.environ.get("DATABASE_URL")
        if url:
            return url
        missing_service("initdb is not installed and DATABASE_URL is unset")
    return test_services.postgres().url


def with_query(url: str, **params: str) -> str:
    """*url* with *params* added to its query string."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


@pytest.fixture(scope="session")
def redis_lock_url(redis_url: str) -> str:
    """A ``redis://`` lock URL whose keys are namespaced to this run."""
    return with_query(redis_url, namespace=f"rt{RUN_ID}")


@pytest.fixture(scope="session")
def postgres_lock_url(postgres_url: str) -> str:
    """A ``postgresql://`` lock URL whose table is this run's own."""
    return with_query(postgres_url, table=f"resilient_locks_rt{RUN_ID}")


@pytest.fixture
def redis_server(test_services: Services) -> Iterator[services.RedisServer]:
    """A fresh throwaway Redis this test may kill, pause and restart."""
    server = test_services.redis()
    yield server
    test_services.release(server)


@pytest.fixture
def postgres_server(
    test_services: Services,
) -> Iterator[services.PostgresServer]:
    """A fresh throwaway PostgreSQL this test may kill, pause, restart."""
    server = test_services.postgres()
    yield server
    test_services.release(server)


_SERVICE_WORDS = re.compile(
    r"REDIS_URL|DATABASE_URL|redis-server|initdb|PostgreSQL|Redis|service",
)
_skipped_for_services: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note every skip whose reason names a service."""
    if not report.skipped or "xfail" in report.keywords:
        return
    reason = (
        str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    )
    if _SERVICE_WORDS.search(reason):
        _skipped_for_services.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under RESILIENT_REQUIRE_SERVICES a skipped server test fails the run."""
    if not _skipped_for_services or not os.environ.get(
        "RESILIENT_REQUIRE_SERVICES"
    ):
        return
    lines = "\n  ".join(_skipped_for_services)
    sys.stderr.write(
        "\nRESILIENT_REQUIRE_SERVICES is set, but tests that need a server "
        f"were skipped:\n  {lines}\n"
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
