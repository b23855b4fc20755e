"""
Circuit breakers: the configuration, the pure machine fed outcomes and times,
and every scenario against the sync shell and the async shell (asyncio and
trio), as a decorator and as a context manager, in virtual time.
"""

from __future__ import annotations

import contextlib
import doctest
import inspect
import logging
import math
import pathlib
import pickle
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry import trace as otel_trace

import resilient
import resilient.testing
from resilient import (
    BreakerConfig,
    BreakerState,
    BreakerTransition,
    CircuitBreaker,
    CircuitOpen,
    ConfigTypeError,
    CountWindow,
)
from resilient._breaker import (
    _REGISTRY,
    FAILURE,
)
from tests.breakers import (
    CLOSED,
    FORCED_OPEN,
    FORMS,
    HALF_OPEN,
    OPEN,
    fail_with,
    ok,
    small,
    through,
)
from tests.conftest import Driver, Telemetry


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Every test starts and ends with no breakers and no defaults."""
    _REGISTRY.clear()
    yield
    _REGISTRY.clear()
    _REGISTRY.limit = 1024


class TestShells:
    @FORMS
    def test_opens_rejects_probes_and_closes(
        self, driver: Driver, clock: Any, form: str
    ) -> None:
        """Failures open the breaker; while open the call is not run and
        CircuitOpen says which breaker and when; after the interval probes
        run and close it."""
        cb = resilient.breaker("svc", small())
        runs: list[int] = []

        def failing() -> Any:
            runs.append(1)
            raise ConnectionError("down")

        for _ in range(2):
            with pytest.raises(ConnectionError, match="down"):
                through(driver, cb, failing, form)
        assert cb.state is OPEN
        clock.advance(4.0)
        with pytest.raises(CircuitOpen) as info:
            through(driver, cb, failing, form)
        assert len(runs) == 2
        assert (info.value.name, info.value.retry_after) == ("svc", 6.0)
        assert info.value.state == "open"
        assert "'svc'" in str(info.value)
        clock.advance(6.0)
        assert cb.retry_after() == 0.0
        assert through(driver, cb, ok, form) == "ok"
        assert cb.state is HALF_OPEN
        assert through(driver, cb, ok, form) == "ok"
        assert cb.state is CLOSED

    @FORMS
    def test_exception_propagates_unchanged(
        self, driver: Driver, clock: Any, form: str
    ) -> None:
        """The call's own exception comes out, the same object."""
        cb = resilient.breaker("same", small())
        exc = ConnectionError("x")
        with pytest.raises(ConnectionError) as info:
            through(driver, cb, fail_with(exc), form)
        assert info.value is exc
        assert cb.statistics().failures == 1

    @FORMS
    def test_what_counts(self, driver: Driver, clock: Any, form: str) -> None:
        """Exceptions outside failure_on count as successes (the
        dependency answered); ignore_on ones do not count at all."""
        cb = resilient.breaker(
            "counts",
            small(
                minimum_calls=3, failure_on=ConnectionError, ignore_on=KeyError
            ),
        )
        for exc in (ValueError(), KeyError(), ConnectionError()):
            with pytest.raises(type(exc)):
                through(driver, cb, fail_with(exc), form)
        s = cb.statistics()
        assert (s.calls, s.failures, s.state) == (2, 1, CLOSED)

    @pytest.mark.parametrize("form", ["decorator", "context"])
    def test_interrupts_never_count(self, clock: Any, form: str) -> None:
        """KeyboardInterrupt and SystemExit pass through and do not count."""
        cb = resilient.breaker("intr", small())
        for exc in (KeyboardInterrupt(), SystemExit(1)):
            with pytest.raises(type(exc)):
                through(Driver("sync"), cb, fail_with(exc), form)
        assert cb.statistics().calls == 0

    @pytest.mark.anyio
    @pytest.mark.parametrize("form", ["decorator", "context"])
    async def test_cancellation_never_counts(
        self, clock: Any, form: str
    ) -> None:
        """A call cancelled from outside is not a failure, nor a success,
        and a cancelled probe frees its slot."""
        cb = resilient.breaker("cancel", small(half_open_probes=1))

        async def body() -> None:
            await anyio.sleep_forever()

        async def guarded() -> None:
            if form == "decorator":
                await cb(body)()
            else:
                async with cb:
                    await body()

        for _ in range(3):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await guarded()
        assert cb.statistics().calls == 0
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await guarded()
        s = cb.statistics()
        assert (s.state, s.probes_in_flight) == (HALF_OPEN, 0)

    @FORMS
    def test_no_lock_held_during_the_call(
        self, driver: Driver, clock: Any, form: str
    ) -> None:
        """The breaker's lock is free while the call runs, so the call may
        use the same breaker (and other threads are never blocked)."""
        cb = resilient.breaker("free", small())
        seen: list[bool] = []

        def body() -> str:
            seen.append(cb._lock.locked())
            cb.statistics()
            cb.acquire().success()
            return "ok"

        assert through(driver, cb, body, form) == "ok"
        assert seen == [False]

    def test_nested_same_breaker(self, clock: Any) -> None:
        """Entering one breaker twice in one task settles each permit."""
        cb = resilient.breaker("nest", small())
        with cb as outer:
            with pytest.raises(ConnectionError), cb as inner:
                raise ConnectionError
            assert inner is not outer
        s = cb.statistics()
        assert (s.calls, s.failures) == (2, 1)

    @pytest.mark.anyio
    async def test_async_with_is_per_task(self, clock: Any) -> None:
        """Concurrent tasks in one breaker each settle their own permit."""
        cb = resilient.breaker(
            "tasks", small(window=CountWindow(10), minimum_calls=10)
        )

        async def one(fail: bool) -> None:
            async with cb:
                await anyio.lowlevel.checkpoint()
                if fail:
                    raise ConnectionError

        async def guarded(fail: bool) -> None:
            with contextlib.suppress(ConnectionError):
                await one(fail)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(guarded, i % 3 == 0)
        s = cb.statistics()
        assert (s.calls, s.failures) == (6, 2)

    def test_exit_without_enter(self) -> None:
        """Exiting a breaker never entered in this context is an error."""
        cb = resilient.breaker("exit")
        with pytest.raises(RuntimeError, match="exited more often"):
            cb.__exit__(None, None, None)
        with pytest.raises(RuntimeError, match="exited more often"):
            anyio.run(cb.__aexit__, None, None, None)

    def test_decorator_keeps_signature_and_methods(self, clock: Any) -> None:
        """The decorated function keeps its signature; methods work."""
        cb = resilient.breaker("sig")

        def add(a: int, b: int = 2) -> int:
            return a + b

        plain = inspect.signature(add)
        add = cb(add)

        class Client:
            @cb
            def get(self, x: int) -> int:
                return x * 2

        assert add(1) == 3
        assert inspect.signature(add) == plain
        assert Client().get(4) == 8


class TestPermits:
    def test_settles_once(self, clock: Any) -> None:
        """A second settlement of a permit is a no-op."""
        cb = resilient.breaker("once", small())
        p = cb.acquire()
        p.failure(ConnectionError())
        p.failure(ConnectionError())
        p.success()
        p.ignore()
        assert cb.statistics().calls == 1
        assert "settled" in repr(p)

    def test_failure_decides_by_config(self, clock: Any) -> None:
        """permit.failure(exc) counts exc as the config says; cancellation
        is ignored."""
        import asyncio

        cb = resilient.breaker(
            "decide", small(minimum_calls=4, failure_on=OSError)
        )
        cb.acquire().failure(ValueError())
        cb.acquire().failure(OSError())
        cb.acquire().failure(asyncio.CancelledError())
        s = cb.statistics()
        assert (s.calls, s.failures) == (2, 1)

    def test_ignore_releases_a_probe(self, clock: Any) -> None:
        """ignore() releases a half-open probe slot without counting."""
        cb = resilient.breaker("rel", small(half_open_probes=1))
        cb.force_open()
        cb.reset()
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        p = cb.acquire()
        assert "probe 1" in repr(p)
        with pytest.raises(CircuitOpen) as info:
            cb.acquire()
        assert info.value.state == "half_open"
        assert info.value.retry_after == 5.0
        p.ignore()
        cb.acquire().success()
        assert cb.state is CLOSED

    @pytest.mark.anyio
    async def test_async_twins(self, clock: Any) -> None:
        """aacquire and the a-settlements behave like the sync ones."""
        cb = resilient.breaker("twins", small())
        p = await cb.aacquire()
        await p.afailure(ConnectionError())
        await p.asuccess()
        await (await cb.aacquire()).aignore()
        await (await cb.aacquire()).asuccess()
        s = cb.statistics()
        assert (s.calls, s.failures) == (2, 1)

    def test_forced_open(self, clock: Any) -> None:
        """force_open rejects with an infinite wait until reset."""
        cb = resilient.breaker("forced")
        cb.force_open()
        assert cb.state is FORCED_OPEN
        assert cb.retry_after() == math.inf
        with pytest.raises(CircuitOpen, match="until it is reset") as info:
            cb.acquire()
        assert info.value.retry_after == math.inf
        cb.reset()
        cb.acquire().success()
        assert cb.statistics().rejected == 1

    def test_circuit_open_pickles(self) -> None:
        """CircuitOpen survives pickling with its attributes."""
        data = pickle.dumps(CircuitOpen("db", 2.5, "half_open"))
        exc = pickle.loads(data)  # noqa: S301
        assert (exc.name, exc.retry_after, exc.state) == (
            "db",
            2.5,
            "half_open",
        )
        assert "half-open; next probe in 2.500 s" in str(exc)


class TestListeners:
    def _trip(self, driver: Driver, cb: CircuitBreaker) -> None:
        for _ in range(2):
            with pytest.raises(ConnectionError):
                through(driver, cb, fail_with(ConnectionError()))

    def test_sync_listeners_hear_every_change(
        self, driver: Driver, clock: Any
    ) -> None:
        """Sync listeners get each transition, in sync and async code."""
        cb = resilient.breaker("hear", small(half_open_probes=1))
        heard: list[tuple[BreakerState, BreakerState, str]] = []
        cb.add_listener(lambda t: heard.append((t.old, t.new, t.reason)))
        self._trip(driver, cb)
        clock.advance(10.0)
        through(driver, cb, ok)
        assert heard == [
            (CLOSED, OPEN, "failure_rate"),
            (OPEN, HALF_OPEN, "open_interval_passed"),
            (HALF_OPEN, CLOSED, "probes_succeeded"),
        ]

    def test_raising_listener_changes_nothing(
        self, driver: Driver, clock: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A listener that raises is logged; later listeners still run and
        the call's outcome is untouched."""
        cb = resilient.breaker("raise", small())
        after: list[BreakerTransition] = []

        def bad(t: BreakerTransition) -> None:
            raise RuntimeError("listener bug")

        async def abad(t: BreakerTransition) -> None:
            raise RuntimeError("async listener bug")

        cb.add_listener(bad)
        cb.add_listener(abad)
        cb.add_listener(after.append)
        with caplog.at_level(logging.ERROR, logger="resilient"):
            self._trip(driver, cb)
        assert cb.state is OPEN
        assert len(after) == 1
        assert "listener bug" in caplog.text

    def test_async_listeners_awaited_in_async_code(
        self, driver: Driver, clock: Any
    ) -> None:
        """Async listeners are awaited when the change happens in async
        code, and skipped when it happens in sync code."""
        cb = resilient.breaker("await", small())
        heard: list[str] = []

        async def listener(t: BreakerTransition) -> None:
            await anyio.lowlevel.checkpoint()
            heard.append(t.reason)

        cb.add_listener(listener)
        self._trip(driver, cb)
        assert heard == (["failure_rate"] if driver.is_async else [])

    def test_remove_listener_and_bad_listener(self, clock: Any) -> None:
        """A removed listener hears nothing more; a non-callable is
        refused."""
        cb = resilient.breaker("remove")
        heard: list[BreakerTransition] = []
        cb.add_listener(heard.append)
        cb.remove_listener(heard.append)
        cb.remove_listener(print)
        cb.force_open()
        assert heard == []
        with pytest.raises(ConfigTypeError, match="listener"):
            cb.add_listener("nope")  # type: ignore[arg-type]


class TestTelemetry:
    def test_span_events_and_metrics(
        self, driver: Driver, clock: Any, telemetry: Telemetry
    ) -> None:
        """State changes and rejections are events on the current span and
        counted in metrics."""
        cb = resilient.breaker("tele", small())
        tracer = telemetry.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("outer"):
            for _ in range(2):
                with pytest.raises(ConnectionError):
                    through(driver, cb, fail_with(ConnectionError()))
            with pytest.raises(CircuitOpen):
                through(driver, cb, ok)
        (span,) = telemetry.spans()
        names = [e.name for e in span.events]
        assert names == [
            "resilient.breaker.state_change",
            "resilient.breaker.rejected",
        ]
        change = span.events[0].attributes
        assert change["resilient.breaker"] == "tele"
        assert change["resilient.breaker.state"] == "open"
        assert change["resilient.breaker.from"] == "closed"
        assert span.events[1].attributes["resilient.breaker.retry_after"] == 10
        metrics = telemetry.metrics()
        assert metrics["resilient.breaker.transitions"] == 1
        assert metrics["resilient.breaker.rejections"] == 1

    def test_without_sdk_nothing_breaks(self, clock: Any) -> None:
        """With no SDK configured, reporting is skipped silently."""
        cb = resilient.breaker("nosdk", small())
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        with pytest.raises(CircuitOpen):
            cb.acquire()
        assert not otel_trace.get_current_span().is_recording()


class TestThreads:
    def test_probes_never_exceed_the_cap(self, clock: Any) -> None:
        """Threads racing into a half-open breaker: at most
        half_open_probes are admitted while the probes are in flight."""
        cb = resilient.breaker("race", small(half_open_probes=3))
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        admitted: list[Any] = []
        rejected: list[CircuitOpen] = []
        start = threading.Barrier(8)

        def worker() -> None:
            start.wait()
            try:
                admitted.append(cb.acquire())
            except CircuitOpen as exc:
                rejected.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (len(admitted), len(rejected)) == (3, 5)
        for p in admitted:
            p.success()
        assert cb.state is CLOSED

    def test_counts_stay_consistent_under_threads(self, clock: Any) -> None:
        """Threads hammering one breaker lose no update: the window's
        totals always match its contents."""
        cb = resilient.breaker(
            "hammer",
            BreakerConfig(
                window=CountWindow(50), minimum_calls=50, failure_rate=1.0
            ),
        )
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)

        start = threading.Barrier(4)

        def worker(seed: int) -> None:
            start.wait()
            for i in range(10_000):
                permit = cb.acquire()
                if (i + seed) % 3:
                    permit.success()
                else:
                    permit.failure(ConnectionError())

        try:
            threads = [
                threading.Thread(target=worker, args=(n,)) for n in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(old)
        ring = cb._m.window._ring  # type: ignore[union-attr]
        s = cb.statistics()
        assert s.state is CLOSED
        assert s.calls == 50
        assert s.failures == sum(b & FAILURE for b in ring)


class TestTasks:
    @pytest.mark.anyio
    async def test_probes_never_exceed_the_cap(self, clock: Any) -> None:
        """Tasks racing into a half-open breaker: at most half_open_probes
        run at once, the others are rejected; the probes' successes close
        it."""
        cb = resilient.breaker("tasks-race", small(half_open_probes=2))
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        clock.advance(10.0)
        release = anyio.Event()
        running: list[int] = []
        peak: list[int] = [0]
        rejected: list[CircuitOpen] = []

        @cb
        async def probe() -> None:
            running.append(1)
            peak[0] = max(peak[0], len(running))
            await release.wait()
            running.pop()

        async def caller() -> None:
            try:
                await probe()
            except CircuitOpen as exc:
                rejected.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(caller)
            while len(running) + len(rejected) < 6:
                await anyio.lowlevel.checkpoint()
            release.set()
        assert (peak[0], len(rejected)) == (2, 4)
        assert cb.state is CLOSED


def test_docs_examples_run(clock: Any) -> None:
    """The examples in docs/breaker.md run as written, on a fake clock."""
    path = pathlib.Path(__file__).parent.parent / "docs" / "breaker.md"
    result = doctest.testfile(
        str(path),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
        globs={"resilient": resilient, "clock": clock},
    )
    assert result.attempted > 0
    assert result.failed == 0


class TestDecoratorClosedPath:
    """The decorator's closed path takes no permit object; it must still
    count exactly what a permit would."""

    def test_a_call_that_outlives_a_state_change_is_not_counted(
        self, driver: Driver, clock: Any
    ) -> None:
        """A call admitted while closed and ended after a reset (a new
        epoch) counts for nothing, failure or success."""
        cb = resilient.breaker("stale", small())

        def body() -> None:
            cb.force_open()  # two state changes while the call runs:
            cb.reset()  # a new epoch, an empty window
            raise ConnectionError

        for _ in range(3):
            with pytest.raises(ConnectionError):
                driver.call(cb, body)
        stats = cb.statistics()
        assert stats.state is BreakerState.CLOSED
        assert (stats.calls, stats.failures) == (0, 0)

    def test_failures_through_the_decorator_open_it(
        self, driver: Driver, clock: Any
    ) -> None:
        """Failures counted on the closed path open the breaker, and a
        failed probe through the decorator opens it again."""
        cb = resilient.breaker("opens", small())
        for _ in range(2):
            with pytest.raises(ConnectionError):
                driver.call(cb, fail_with(ConnectionError()))
        assert cb.state is BreakerState.OPEN
        clock.advance(10.0)
        with pytest.raises(ConnectionError):
            driver.call(cb, fail_with(ConnectionError()))
        assert cb.state is BreakerState.OPEN

    def test_cancellation_on_the_closed_path_is_not_counted(
        self, anyio_backend: str
    ) -> None:
        """A cancelled call through the async decorator counts nothing."""
        cb = resilient.breaker("cancelled", small())

        @cb
        async def body() -> None:
            await anyio.sleep(30)

        async def main() -> None:
            for _ in range(3):
                with anyio.move_on_after(0.001):
                    await body()

        anyio.run(main, backend=anyio_backend)
        assert cb.statistics().calls == 0

    def test_rejection_with_a_tracer_only_outside_spans(
        self, clock: Any
    ) -> None:
        """With a tracer but no meter, and no span recording, a rejection
        still raises CircuitOpen and records nothing."""
        from opentelemetry.sdk.trace import TracerProvider

        resilient.configure_telemetry(tracer_provider=TracerProvider())
        try:
            cb = resilient.breaker("quiet", small())
            cb.force_open()
            with pytest.raises(resilient.CircuitOpen, match="forced-open"):
                cb(ok)()
        finally:
            resilient.configure_telemetry()
