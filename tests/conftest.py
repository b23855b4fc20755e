"""
Shared fixtures: virtual time, telemetry capture, and the `driver` that runs
one scenario against the sync shell and the async shell (asyncio and trio).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

import resilient
import resilient.testing
from tests.actors import Actors
from tests.http_server import Server


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """Every test starts with no breakers, bulkheads or retry budgets."""
    yield
    resilient.testing.reset_registries()


@pytest.fixture(autouse=True)
def _storms_log_nowhere(request: pytest.FixtureRequest) -> Iterator[None]:
    """
    Under a storm, resilient logs nothing: written to stderr (Python's last
    resort, as nothing is configured), every retry is a system call where no
    asynchronous exception can land, and a storm that waits for its
    exceptions to land runs for minutes, its spans filling memory.

    The loggers are disabled, not raised in level: `Logger.isEnabledFor`
    takes the logging module's lock whenever its cache was cleared (pytest
    sets the root level around every test), and an asynchronous exception
    landing between that lock's acquire and its ``try`` leaves it held:
    every thread that logs then hangs (seen: a storm stuck in
    ``logging._acquireLock``). That is the standard library's, not
    resilient's, and a disabled logger answers before the lock.

    Nor does a storm run garbage-collector callbacks: a callback is Python
    code run at any allocation, and an interrupt that lands in one is
    swallowed there ("Exception ignored"; seen with hypothesis's, left
    installed by the stateful tests that ran before a breaker storm).
    """
    if request.node.get_closest_marker("storm") is None:
        yield
        return
    loggers = [logging.getLogger("resilient")] + [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("resilient.") and isinstance(logger, logging.Logger)
    ]
    before = [logger.disabled for logger in loggers]
    callbacks = gc.callbacks[:]
    for logger in loggers:
        logger.disabled = True
    gc.callbacks.clear()
    try:
        yield
    finally:
        gc.callbacks[:] = callbacks
        for logger, was in zip(loggers, before, strict=True):
            logger.disabled = was


@pytest.fixture
def server() -> Iterator[Server]:
    """A fresh real local HTTP server per test (tests/http_server.py): its
    log of requests is the test's own."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def clock() -> Iterator[resilient.testing.FakeClock]:
    """A fake clock every primitive reads and sleeps on for this test."""
    fake = resilient.testing.FakeClock(start=1000.0)
    with resilient.testing.use_clock(fake):
        yield fake


class Telemetry:
    """Captured spans and metrics of one test."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(
            SimpleSpanProcessor(self.exporter)
        )
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, float]:
        """Sum of every data point per metric name."""
        out: dict[str, float] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count
                        out[metric.name] = out.get(metric.name, 0) + value
        return out


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """Route resilient's spans and metrics to in-memory SDK exporters."""
    t = Telemetry()
    resilient.configure_telemetry(
        tracer_provider=t.tracer_provider, meter_provider=t.meter_provider
    )
    yield t
    resilient.configure_telemetry()
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


class Driver:
    """
    Runs one scenario against one shell: ``sync``, or async on ``asyncio``
    or ``trio``. A scenario is written once with a sync *body*; for the
    async shells the driver turns it into a coroutine function.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.is_async = kind != "sync"

    def __repr__(self) -> str:
        return f"Driver({self.kind})"

    def fn(self, body: Callable[..., Any]) -> Callable[..., Any]:
        """*body* as a function of this driver's colour."""
        if not self.is_async:
            return body

        async def abody(*args: Any, **kwargs: Any) -> Any:
            await anyio.lowlevel.checkpoint()
            return body(*args, **kwargs)

        return abody

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call *fn* (sync, or async in a fresh event loop)."""
        if not self.is_async:
            return fn(*args, **kwargs)

        async def main() -> Any:
            return await fn(*args, **kwargs)

        return anyio.run(main, backend=self.kind)

    def call(
        self,
        decorator: Callable[[Callable[..., Any]], Callable[..., Any]],
        body: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Decorate *body* (in this colour) and call it."""
        return self.run(decorator(self.fn(body)), *args, **kwargs)

    def block(
        self,
        policy: resilient.Policy,
        body: Callable[[resilient.Attempt], Any],
        *,
        use_async_with: bool = True,
    ) -> Any:
        """
        Run *body* in the block form; returns the last value *body* gave.
        """
        if not self.is_async:
            value = None
            for attempt in resilient.retrying(policy):
                with attempt:
                    value = body(attempt)
            return value

        async def main() -> Any:
            value = None
            async for attempt in resilient.retrying(policy):
                if use_async_with:
                    async with attempt:
                        await anyio.lowlevel.checkpoint()
                        value = body(attempt)
                else:
                    with attempt:
                        await anyio.lowlevel.checkpoint()
                        value = body(attempt)
            return value

        return anyio.run(main, backend=self.kind)


@pytest.fixture(params=["sync", "asyncio", "trio"])
def driver(request: pytest.FixtureRequest) -> Driver:
    """One scenario, three shells: sync, asyncio and trio."""
    return Driver(request.param)


@pytest.fixture(params=["sync", "asyncio", "trio"])
def actors(request: pytest.FixtureRequest) -> Iterator[Actors]:
    """One scenario, three colours of concurrent callers: threads, asyncio
    tasks, trio tasks (`tests.actors.Actors`)."""
    a = Actors(request.param)
    yield a
    a.close()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Async tests run on asyncio and on trio."""
    return str(request.param)


def service_url(var: str) -> str:
    """
    The URL of a test service, or skip: unless RESILIENT_REQUIRE_SERVICES
    is set (CI sets it), where a missing service fails the test instead.
    """
    url = os.environ.get(var)
    if url:
        return url
    if os.environ.get("RESILIENT_REQUIRE_SERVICES"):
        pytest.fail(f"{var} is not set and services are required")
    pytest.skip(f"{var} is not set")
    raise AssertionError  # pragma: no cover


# Throwaway Redis and PostgreSQL servers: their fixtures and the check that
# fails a CI run in which a test that needs one was skipped.
from tests.service_fixtures import *  # noqa: E402, F403


_STORM_FILES = frozenset(
    {
        "test_storm.py",
        "test_breaker_storm.py",
        "test_bulkhead_storm.py",
        "test_timeout_storm.py",
        "test_lock_interrupts.py",
        "test_singleflight_schedules.py",
        "test_singleflight_storm.py",
        "test_streams_storm.py",
    }
)


def _breaks_a_postgres(item: pytest.Item) -> bool:
    """Whether *item* kills, freezes or restarts a throwaway PostgreSQL of
    its own (`postgres_server`; the fault servers of test_postgres_backend
    and of test_server_backends' ``postgresql`` cases)."""
    names = getattr(item, "fixturenames", ())
    if "postgres_server" in names:
        return True
    if "fault_server" not in names:
        return False
    callspec = getattr(item, "callspec", None)
    kind = None if callspec is None else callspec.params.get("kind")
    return kind in {None, "postgresql"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """
    Mark the asynchronous-exception storms: the tests session runs them in
    a pytest of their own, outside coverage, whose tracer would receive
    some of the exceptions in its own callbacks and lose them.

    Mark ``slow`` the tests that break a throwaway PostgreSQL of their own:
    they run in the tests session only. In CI the other suites run side by
    side, and there throwaway PostgreSQL servers (initdb, a postmaster per
    server) failed to start or restart in time (11 such failures in one
    run of tests_lowest); the code under them is the same on every Python.
    """
    for item in items:
        if item.path.name in _STORM_FILES:
            item.add_marker(pytest.mark.storm)
        if _breaks_a_postgres(item):
            item.add_marker(pytest.mark.slow)
