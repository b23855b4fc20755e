"""
Singleflight: the group machine directly, then every scenario against
threads and against tasks (asyncio and trio); cancellation, deadlines,
composition with a policy, telemetry and configuration.

Async callers run in an event loop in a helper thread (an anyio blocking
portal), so that one scenario, written once as plain code in the test
thread, drives threads or tasks alike. The execution blocks on a `Latch`
the test opens, from the test thread: the wake-ups cross threads.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

import resilient
from resilient._singleflight import _async, _common
from resilient._singleflight._machine import (
    ABORTED,
    RUNNING,
    VALUE,
    GroupMachine,
    Ticket,
)
from resilient._wait import TaskWaiter, ThreadWaiter
from resilient.exceptions import (
    ConfigError,
    ConfigTypeError,
    DeadlineExceeded,
    TimedOut,
)
from tests.conftest import Telemetry


def wait_until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll *predicate* (real time, 1 ms steps) until it holds."""
    end = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > end:  # pragma: no cover (a hang)
            raise AssertionError("condition never held")
        time.sleep(0.001)


class Latch:
    """Opened once from any thread; threads and tasks wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._waiters: list[Any] = []

    def open(self) -> None:
        with self._lock:
            self._open = True
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.wake()

    def wait(self) -> None:
        w = ThreadWaiter()
        with self._lock:
            if self._open:
                return
            self._waiters.append(w)
        w.wait()

    async def await_(self) -> None:
        w = TaskWaiter()
        with self._lock:
            if self._open:
                await anyio.lowlevel.checkpoint()
                return
            self._waiters.append(w)
        await w.wait()


class Work:
    """
    The function callers share: counts its executions, blocks on a latch
    until the test opens it, then returns a fresh object or raises.
    """

    def __init__(self, *, is_async: bool) -> None:
        self.is_async = is_async
        self.latch = Latch()
        self.started = 0
        self.running = 0
        self.most = 0
        self.cancelled = 0
        self.results: list[object] = []
        self.raise_: BaseException | None = None

    def _enter(self) -> None:
        self.started += 1
        self.running += 1
        self.most = max(self.most, self.running)

    def _leave(self) -> object:
        if self.raise_ is not None:
            raise self.raise_
        value = object()
        self.results.append(value)
        return value

    def sync(self, *args: object, **kwargs: object) -> object:
        self._enter()
        try:
            self.latch.wait()
            return self._leave()
        finally:
            self.running -= 1

    async def async_(self, *args: object, **kwargs: object) -> object:
        self._enter()
        try:
            await self.latch.await_()
            return self._leave()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    @property
    def fn(self) -> Callable[..., Any]:
        return self.async_ if self.is_async else self.sync


class Callers:
    """
    Concurrent callers of one colour: threads (``sync``) or tasks in an
    asyncio or trio event loop running in a helper thread.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.is_async = kind != "sync"
        self._cm: Any = None
        self.portal: Any = None
        self.threads: list[threading.Thread] = []
        if self.is_async:
            self._cm = anyio.from_thread.start_blocking_portal(kind)
            self.portal = self._cm.__enter__()

    def close(self, *, cancel: bool = False) -> None:
        """Join the threads; stop the event loop (*cancel*: its tasks)."""
        for t in self.threads:
            t.join(10)
        cm, self._cm = self._cm, None
        if cm is not None:
            if cancel:  # The portal cancels its tasks when left by an error.
                stop = RuntimeError("stop")
                assert cm.__exit__(RuntimeError, stop, None) is False
            else:
                cm.__exit__(None, None, None)

    def work(self) -> Work:
        return Work(is_async=self.is_async)

    def start(
        self,
        call: Callable[[], Any],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Future[Any]:
        """
        Start one caller of *call* (a function, or a coroutine function
        in the async colours), inside *deadline* and *timeout* if given.
        """
        if not self.is_async:
            fut: Future[Any] = Future()

            def body() -> None:
                try:
                    with resilient.deadline(deadline):
                        if timeout is None:
                            fut.set_result(call())
                        else:
                            with resilient.timeout(timeout):
                                fut.set_result(call())
                except BaseException as exc:
                    fut.set_exception(exc)

            thread = threading.Thread(target=body, daemon=True)
            self.threads.append(thread)
            thread.start()
            return fut

        async def abody() -> Any:
            with resilient.deadline(deadline):
                if timeout is None:
                    return await call()
                async with resilient.timeout(timeout):
                    return await call()

        return self.portal.start_task_soon(abody)  # type: ignore[no-any-return]

    def many(self, n: int, call: Callable[[], Any]) -> list[Future[Any]]:
        return [self.start(call) for _ in range(n)]


@pytest.fixture(params=["sync", "asyncio", "trio"])
def callers(request: pytest.FixtureRequest) -> Iterator[Callers]:
    """One scenario, three colours of callers: threads, asyncio, trio."""
    c = Callers(request.param)
    yield c
    c.close()


def group_caller(
    callers: Callers, group: resilient.SingleFlight, key: object, work: Work
) -> Callable[[], Any]:
    """A caller of *work* through *group* for *key*, in the right colour."""
    if callers.is_async:

        async def acall() -> Any:
            return await group.acall(key, work.async_)

        return acall
    return lambda: group.call(key, work.sync)


def waiting(group: resilient.SingleFlight, n: int) -> None:
    """Wait until *n* callers wait for the group's executions."""
    wait_until(lambda: group.statistics().waiting == n)


def quiet(group: resilient.SingleFlight) -> None:
    """Nothing in flight, nobody waiting: the map is empty."""
    wait_until(lambda: group.statistics().running == 0)
    s = group.statistics()
    assert (s.in_flight, s.running, s.waiting) == (0, 0, 0)
    assert len(group) == 0
    assert group._machine.flights == {}


# -- the machine -------------------------------------------------------------


class TestMachine:
    """The in-flight map and its decisions, without any waiting."""

    def test_first_leads_the_rest_join(self) -> None:
        """The first ticket for a key leads; later ones join its flight."""
        m = GroupMachine()
        a, b, c = (Ticket(ThreadWaiter()) for _ in range(3))
        assert m.join("k", a, is_async=False).owner is a
        assert m.join("k", b, is_async=False).owner is a
        assert m.join("other", c, is_async=False).owner is c
        assert a.flight is b.flight is not c.flight
        assert a.flight is not None
        assert a.flight.joined == 1
        s = m.statistics()
        assert (s.in_flight, s.running, s.waiting) == (2, 2, 3)
        assert (s.executions, s.joined) == (2, 1)

    def test_finish_records_once_and_empties_the_map(self) -> None:
        """The first outcome wins; the flight leaves the map at once."""
        m = GroupMachine()
        a, b = Ticket(ThreadWaiter()), Ticket(ThreadWaiter())
        m.join("k", a, is_async=False)
        m.join("k", b, is_async=False)
        flight = a.flight
        assert flight is not None
        m.finish(flight, VALUE, 42)
        m.finish(flight, ABORTED)
        assert (flight.state, flight.value) == (VALUE, 42)
        assert m.flights == {}
        assert b.waiter.wait(0) is True  # type: ignore[attr-defined]

    def test_leader_leaving_first_aborts(self) -> None:
        """A sync leader that leaves without an outcome aborts the flight."""
        m = GroupMachine()
        a, b = Ticket(ThreadWaiter()), Ticket(ThreadWaiter())
        m.join("k", a, is_async=False)
        m.join("k", b, is_async=False)
        assert m.leave(a) is None
        assert a.flight is not None
        assert a.flight.state == ABORTED
        assert b.waiter.wait(0) is True  # type: ignore[attr-defined]
        assert m.flights == {}

    def test_last_member_abandons_a_spawned_async_flight(self) -> None:
        """The last caller to leave an async execution abandons it, once."""
        m = GroupMachine()
        a, b = Ticket(ThreadWaiter()), Ticket(ThreadWaiter())
        m.join("k", a, is_async=True)
        m.join("k", b, is_async=True)
        flight = a.flight
        assert flight is not None
        flight.spawned = True
        assert m.leave(a) is None
        assert flight.state == RUNNING
        assert m.leave(b) is flight
        assert m.leave(b) is None
        assert flight.abandoned
        assert m.flights == {}
        assert m.statistics().abandoned == 1

    def test_leave_is_idempotent_and_harmless_without_a_flight(self) -> None:
        """Leaving twice, or before joining, changes nothing."""
        m = GroupMachine()
        lone = Ticket(ThreadWaiter())
        assert m.leave(lone) is None
        a, b = Ticket(ThreadWaiter()), Ticket(ThreadWaiter())
        m.join("k", a, is_async=False)
        m.join("k", b, is_async=False)
        m.leave(b)
        m.leave(b)
        assert m.statistics().waiting == 1
        assert a.flight is not None
        assert a.flight.state == RUNNING

    def test_forget_takes_the_key_out_only(self) -> None:
        """A forgotten flight runs on; its finish does not touch the new."""
        m = GroupMachine()
        a, b = Ticket(ThreadWaiter()), Ticket(ThreadWaiter())
        m.join("k", a, is_async=False)
        assert m.forget("k") is True
        assert m.forget("k") is False
        m.join("k", b, is_async=False)
        assert a.flight is not None
        assert b.flight is not None
        m.finish(a.flight, VALUE, 1)
        assert m.flights == {"k": b.flight}
        assert "#1 value" in repr(a.flight)


# -- sharing -----------------------------------------------------------------


def test_callers_share_one_execution_and_its_result(callers: Callers) -> None:
    """Concurrent callers with one key get the very object one run returned."""
    group = resilient.SingleFlight()
    work = callers.work()
    futures = callers.many(20, group_caller(callers, group, "k", work))
    waiting(group, 20)
    assert "k" in group
    assert len(group) == 1
    work.latch.open()
    results = [f.result(10) for f in futures]
    assert work.started == 1
    assert all(r is work.results[0] for r in results)
    s = group.statistics()
    assert (s.executions, s.joined) == (1, 19)
    quiet(group)


def test_a_thousand_callers_cause_one_execution(callers: Callers) -> None:
    """1,000 concurrent callers on one key: exactly one execution."""
    group = resilient.SingleFlight()
    work = callers.work()
    if not callers.is_async:
        threading.stack_size(256 * 1024)
    try:
        futures = callers.many(1000, group_caller(callers, group, 1, work))
    finally:
        threading.stack_size(0)
    waiting(group, 1000)
    work.latch.open()
    results = {id(f.result(30)) for f in futures}
    assert work.started == 1
    assert results == {id(work.results[0])}
    assert group.statistics().joined == 999
    quiet(group)


def test_followers_raise_the_leaders_exception_object(
    callers: Callers,
) -> None:
    """Every caller raises the same exception object, noted once."""
    group = resilient.SingleFlight(name="users")
    work = callers.work()
    work.raise_ = ConnectionError("down")
    futures = callers.many(5, group_caller(callers, group, "k", work))
    waiting(group, 5)
    work.latch.open()
    errors = [f.exception(10) for f in futures]
    assert all(e is work.raise_ for e in errors)
    notes = work.raise_.__notes__
    assert len(notes) == 1
    assert "'users' shared this exception with the 5 callers" in notes[0]
    assert work.started == 1
    quiet(group)


def test_a_lone_caller_gets_no_note(callers: Callers) -> None:
    """An exception nobody else received is raised as it is."""
    group = resilient.SingleFlight()
    work = callers.work()
    work.raise_ = ValueError("bad")
    fut = callers.start(group_caller(callers, group, "k", work))
    work.latch.open()
    assert fut.exception(10) is work.raise_
    assert not hasattr(work.raise_, "__notes__")
    quiet(group)


def test_unpicklable_results_come_back_as_the_same_object(
    callers: Callers,
) -> None:
    """A result that cannot be pickled is handed over as it is (`is`)."""
    group = resilient.SingleFlight()
    lock = threading.Lock()
    with pytest.raises(TypeError):
        pickle.dumps(lock)
    latch = Latch()

    if callers.is_async:

        async def make() -> Any:
            await latch.await_()
            return lock

        async def call() -> Any:
            return await group.acall("k", make)

    else:

        def smake() -> Any:
            latch.wait()
            return lock

        def call() -> Any:
            return group.call("k", smake)

    futures = callers.many(3, call)
    waiting(group, 3)
    latch.open()
    assert all(f.result(10) is lock for f in futures)


def test_unhashable_keys_raise_before_anything_runs(callers: Callers) -> None:
    """An unhashable key is a TypeError at the call; nothing ran."""
    group = resilient.SingleFlight()
    work = callers.work()
    work.latch.open()
    fut = callers.start(group_caller(callers, group, ["a", "list"], work))
    error = fut.exception(10)
    assert isinstance(error, TypeError)
    assert "must be hashable, got list" in str(error)
    assert work.started == 0
    quiet(group)


def test_a_key_whose_comparison_fails_raises_its_own_error() -> None:
    """A hashable key whose ``__eq__`` raises TypeError is not misreported."""

    class Odd:
        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            raise TypeError("no comparing")

    group = resilient.SingleFlight()
    latch = Latch()
    first = threading.Thread(target=group.call, args=(Odd(), latch.wait))
    first.start()
    wait_until(lambda: len(group) == 1)
    with pytest.raises(TypeError, match="no comparing"):
        group.call(Odd(), lambda: None)
    latch.open()
    first.join()
    quiet(group)


def test_later_callers_start_a_new_execution(callers: Callers) -> None:
    """Once an execution ended, the key is free: the next caller reruns."""
    group = resilient.SingleFlight()
    work = callers.work()
    work.latch.open()
    call = group_caller(callers, group, "k", work)
    first = callers.start(call).result(10)
    second = callers.start(call).result(10)
    assert work.started == 2
    assert first is not second
    quiet(group)


def test_forget_lets_new_callers_start_a_new_execution(
    callers: Callers,
) -> None:
    """
    After `forget`, new callers start (and join) a new execution; the old
    one finishes for its own callers; the map holds the new one only.
    """
    group = resilient.SingleFlight()
    old, new = callers.work(), callers.work()
    old_callers = callers.many(2, group_caller(callers, group, "k", old))
    waiting(group, 2)
    assert group.forget("k") is True
    assert "k" not in group
    new_callers = callers.many(2, group_caller(callers, group, "k", new))
    waiting(group, 4)
    assert group.statistics().running == 2
    old.latch.open()
    assert {id(f.result(10)) for f in old_callers} == {id(old.results[0])}
    # The old one's end leaves the new one in the map (golang/go#31420).
    assert "k" in group
    late = callers.start(group_caller(callers, group, "k", new))
    waiting(group, 3)
    new.latch.open()
    assert {id(f.result(10)) for f in [*new_callers, late]} == {
        id(new.results[0])
    }
    assert (old.started, new.started) == (1, 1)
    assert group.forget("k") is False
    quiet(group)


def test_callers_of_every_colour_share_one_execution() -> None:
    """Threads, asyncio tasks and trio tasks (in other threads) share one."""
    group = resilient.SingleFlight()
    work = Work(is_async=False)
    kinds = [Callers("sync"), Callers("asyncio"), Callers("trio")]
    try:
        futures = [kinds[0].start(lambda: group.call("k", work.sync))]
        waiting(group, 1)

        async def join() -> Any:
            return await group.acall("k", Work(is_async=True).async_)

        futures += [c.start(join) for c in kinds[1:] for _ in range(3)]
        futures += [kinds[0].start(lambda: group.call("k", work.sync))]
        waiting(group, 8)
        work.latch.open()
        assert all(f.result(10) is work.results[0] for f in futures)
        assert work.started == 1
    finally:
        for c in kinds:
            c.close()
    quiet(group)


def test_an_async_execution_serves_threads_and_other_loops() -> None:
    """A trio task's execution wakes a thread and an asyncio task."""
    group = resilient.SingleFlight()
    work = Work(is_async=True)
    trio_c, asyncio_c, threads = (
        Callers("trio"),
        Callers("asyncio"),
        Callers("sync"),
    )
    try:

        async def lead() -> Any:
            return await group.acall("k", work.async_)

        futures = [trio_c.start(lead)]
        waiting(group, 1)
        futures.append(asyncio_c.start(lead))
        futures.append(threads.start(lambda: group.call("k", work.sync)))
        waiting(group, 3)
        work.latch.open()
        assert all(f.result(10) is work.results[0] for f in futures)
    finally:
        for c in (trio_c, asyncio_c, threads):
            c.close()
    quiet(group)


# -- the leader's BaseException and deadlines --------------------------------


def test_a_sync_leaders_base_exception_restarts_the_followers() -> None:
    """
    KeyboardInterrupt in the leader's thread is the leader's: it raises
    it, and the waiting followers run the work again, one of them leading.
    """
    group = resilient.SingleFlight()
    latch = Latch()
    runs: list[int] = []

    def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            latch.wait()
            raise KeyboardInterrupt
        waiting(group, 4)  # Every follower joined the rerun.
        return "second"

    callers = Callers("sync")
    try:
        leader = callers.start(lambda: group.call("k", work))
        waiting(group, 1)
        followers = callers.many(4, lambda: group.call("k", work))
        waiting(group, 5)
        latch.open()
        assert isinstance(leader.exception(10), KeyboardInterrupt)
        assert [f.result(10) for f in followers] == ["second"] * 4
    finally:
        callers.close()
    assert len(runs) == 2
    assert group.statistics().executions == 2
    quiet(group)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_an_async_executions_base_exception_goes_to_its_leader(
    kind: str,
) -> None:
    """
    SystemExit from an async execution is raised by its leader only; the
    other callers run the work again.
    """
    group = resilient.SingleFlight()
    latch = Latch()
    runs: list[int] = []

    async def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            await latch.await_()
            raise SystemExit(3)
        while group.statistics().waiting < 3:  # noqa: ASYNC110
            await anyio.sleep(0.001)  # (until every follower rejoined)
        return "second"

    async def call() -> Any:
        return await group.acall("k", work)

    async def lead() -> Any:
        try:
            return await call()
        except SystemExit as exc:  # Not to end the test's event loop.
            return exc

    callers = Callers(kind)
    try:
        leader = callers.start(lead)
        waiting(group, 1)
        followers = callers.many(3, call)
        waiting(group, 4)
        latch.open()
        error = leader.result(10)
        assert isinstance(error, SystemExit)
        assert error.code == 3
        assert [f.result(10) for f in followers] == ["second"] * 3
    finally:
        callers.close()
    assert len(runs) == 2
    quiet(group)


def test_the_sync_leaders_own_deadline_is_not_the_followers(
    clock: resilient.testing.FakeClock,
) -> None:
    """
    The leader's work stopped by the leader's deadline: the leader raises
    it; followers with time left run the work again and succeed.
    """
    group = resilient.SingleFlight()
    latch = Latch()
    runs: list[int] = []

    def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            latch.wait()
            clock.advance(5)
            resilient.checkpoint()
        waiting(group, 2)
        return "done"

    callers = Callers("sync")
    try:
        leader = callers.start(lambda: group.call("k", work), deadline=1)
        waiting(group, 1)
        followers = callers.many(2, lambda: group.call("k", work))
        waiting(group, 3)
        latch.open()
        assert isinstance(leader.exception(10), DeadlineExceeded)
        assert [f.result(10) for f in followers] == ["done", "done"]
    finally:
        callers.close()
    assert len(runs) == 2


def test_a_follower_waits_no_longer_than_its_deadline(
    callers: Callers, clock: resilient.testing.FakeClock
) -> None:
    """
    A follower raises DeadlineExceeded (with a note) at its own deadline;
    the execution goes on and the others get its result.
    """
    group = resilient.SingleFlight(name="report")
    work = callers.work()
    call = group_caller(callers, group, "k", work)
    leader = callers.start(call)
    waiting(group, 1)
    hurried = callers.start(call, deadline=2.0)
    patient = callers.start(call, deadline=100.0)
    waiting(group, 3)
    clock.advance(3.0)
    error = hurried.exception(10)
    assert isinstance(error, DeadlineExceeded)
    assert error.deadline == 1002.0
    assert "stopped waiting for singleflight 'report'" in error.__notes__[0]
    waiting(group, 2)
    work.latch.open()
    assert leader.result(10) is patient.result(10) is work.results[0]
    assert work.started == 1
    quiet(group)


def test_a_follower_in_a_timeout_scope_times_out_alone(
    callers: Callers,
) -> None:
    """Inside `resilient.timeout`, a follower raises the scope's TimedOut."""
    group = resilient.SingleFlight()
    work = callers.work()
    call = group_caller(callers, group, "k", work)
    leader = callers.start(call)
    waiting(group, 1)
    hurried = callers.start(call, timeout=0.02)
    assert isinstance(hurried.exception(10), TimedOut)
    patient = callers.start(call, timeout=60)
    waiting(group, 2)
    work.latch.open()
    assert leader.result(10) is patient.result(10) is work.results[0]
    quiet(group)


def test_a_cancelled_sync_scope_wakes_a_follower() -> None:
    """A `resilient.timeout` cancelled from another thread stops the wait."""
    group = resilient.SingleFlight()
    latch = Latch()
    callers = Callers("sync")
    scopes: list[resilient.TimeoutScope] = []
    try:
        leader = callers.start(lambda: group.call("k", latch.wait))

        def follow() -> Any:
            with resilient.timeout(60) as scope:
                scopes.append(scope)
                return group.call("k", latch.wait)

        waiting(group, 1)
        follower = callers.start(follow)
        waiting(group, 2)
        scopes[0].cancel()
        assert follower.result(10) is None  # The scope ended it quietly.
        assert scopes[0].cancelled_caught
        waiting(group, 1)
        latch.open()
        leader.result(10)
    finally:
        callers.close()
    quiet(group)


# -- async cancellation ------------------------------------------------------


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_a_cancelled_leader_leaves_the_execution_to_the_others(
    kind: str,
) -> None:
    """Cancelling the leader does not cancel the work others wait for."""
    group = resilient.SingleFlight()
    callers = Callers(kind)
    work = callers.work()
    try:
        call = group_caller(callers, group, "k", work)
        leader = callers.start(call)
        waiting(group, 1)
        followers = callers.many(3, call)
        waiting(group, 4)
        leader.cancel()
        waiting(group, 3)
        assert work.cancelled == 0
        work.latch.open()
        assert all(f.result(10) is work.results[0] for f in followers)
    finally:
        callers.close()
    assert work.started == 1
    quiet(group)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_the_last_caller_leaving_cancels_the_execution(kind: str) -> None:
    """
    The work is cancelled once every caller has gone, and not before; the
    next caller starts a fresh execution that no stale cancellation reaches.
    """
    group = resilient.SingleFlight()
    callers = Callers(kind)
    work = callers.work()
    try:
        call = group_caller(callers, group, "k", work)
        futures = callers.many(3, call)
        waiting(group, 3)
        for f in futures[:2]:
            f.cancel()
        waiting(group, 1)
        assert work.cancelled == 0
        futures[2].cancel()
        wait_until(lambda: work.cancelled == 1)
        assert group.statistics().abandoned == 1
        quiet(group)
        fresh = callers.work()
        fresh.latch.open()
        value = callers.start(group_caller(callers, group, "k", fresh))
        assert value.result(10) is fresh.results[0]
        assert fresh.cancelled == 0
    finally:
        callers.close()
    quiet(group)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_a_thread_leaving_last_cancels_an_async_execution(
    kind: str, clock: resilient.testing.FakeClock
) -> None:
    """The last caller, a thread, cancels the work through its event loop."""
    group = resilient.SingleFlight()
    loop = Callers(kind)
    threads = Callers("sync")
    work = Work(is_async=True)
    try:

        async def lead() -> Any:
            return await group.acall("k", work.async_)

        leader = loop.start(lead)
        waiting(group, 1)
        follower = threads.start(
            lambda: group.call("k", work.sync), deadline=1
        )
        waiting(group, 2)
        leader.cancel()
        waiting(group, 1)
        assert work.cancelled == 0
        clock.advance(2)
        assert isinstance(follower.exception(10), DeadlineExceeded)
        wait_until(lambda: work.cancelled == 1)
    finally:
        threads.close()
        loop.close()
    assert group.statistics().abandoned == 1
    quiet(group)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_an_execution_whose_event_loop_closes_hands_over(kind: str) -> None:
    """
    The event loop running an execution closes: the callers still waiting
    elsewhere start over, one of them leading.
    """
    group = resilient.SingleFlight()
    loop = Callers(kind)
    threads = Callers("sync")
    work = Work(is_async=True)
    try:

        async def lead() -> Any:
            try:
                return await group.acall("k", work.async_)
            except anyio.get_cancelled_exc_class():
                return "cancelled"

        leader = loop.start(lead)
        waiting(group, 1)
        follower = threads.start(lambda: group.call("k", lambda: "rerun"))
        waiting(group, 2)
        loop.close(cancel=True)  # Every task of the loop is cancelled.
        assert leader.result(10) == "cancelled"
        assert follower.result(10) == "rerun"
    finally:
        threads.close()
    assert work.cancelled == 1
    assert group.statistics().executions == 2
    quiet(group)


async def test_an_execution_aborted_before_it_started_never_runs(
    anyio_backend: str,
) -> None:
    """
    A task whose flight ended before it ran (its leader was interrupted
    between starting it and recording so) does not run the work.
    """
    from resilient._singleflight._machine import Flight

    group = resilient.SingleFlight()
    runs: list[int] = []

    async def work() -> None:
        runs.append(1)

    flight = Flight("k", 1, Ticket(ThreadWaiter()), is_async=True)
    group._machine.finish(flight, ABORTED)
    await _async._run(group, flight, work, (), {})
    assert runs == []


async def test_an_execution_abandoned_before_it_started_never_runs(
    anyio_backend: str,
) -> None:
    """
    When the last caller leaves before the execution's task got to run
    (nothing to cancel yet), the flight is abandoned and out of the map,
    and the task, once it runs, does not run the work.
    """
    group = resilient.SingleFlight()
    m = group._machine
    runs: list[int] = []

    async def work() -> None:
        runs.append(1)

    ticket = Ticket()
    flight = m.join("k", ticket, is_async=True)
    flight.spawned = True  # Started, not yet run: `cancel` is still None.
    _common.leave(m, ticket, None)
    assert flight.abandoned
    assert m.flights == {}
    await _async._run(group, flight, work, (), {})
    assert runs == []
    assert group.statistics().abandoned == 1


async def test_a_gate_opened_already_lets_a_late_waiter_through(
    anyio_backend: str,
) -> None:
    """A task that waits on a gate after it was woken does not block."""
    gate = _async.LoopGate(*_async._library())
    gate.wake()
    passed = False
    with anyio.move_on_after(1) as scope:
        await gate.waiting()
        passed = True
    assert passed, "the late waiter blocked on an opened gate"
    assert not scope.cancelled_caught


async def test_no_task_is_left_behind(anyio_backend: str) -> None:
    """After an execution, cancelled or not, no task of ours remains."""
    group = resilient.SingleFlight()
    work = Work(is_async=True)
    before = _tasks(anyio_backend)
    with anyio.move_on_after(0.01):
        await group.acall("k", work.async_)
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    assert work.cancelled == 1
    assert _tasks(anyio_backend) == before
    quiet(group)


def _tasks(backend: str) -> int:
    if backend == "trio":
        import trio

        return trio.lowlevel.current_statistics().tasks_living
    return len(asyncio.all_tasks())


async def test_an_execution_runs_outside_the_callers_deadline(
    anyio_backend: str,
) -> None:
    """Inside the execution no caller's deadline applies."""
    group = resilient.SingleFlight()

    async def work() -> float:
        return resilient.remaining()

    with resilient.deadline(30):
        assert resilient.remaining() <= 30
        assert await group.acall("k", work) == float("inf")


async def test_a_recursive_async_call_refuses_to_wait_for_itself(
    anyio_backend: str,
) -> None:
    """An execution calling its own key raises instead of hanging."""
    group = resilient.SingleFlight()

    async def work() -> object:
        return await group.acall("k", work)

    with pytest.raises(RuntimeError, match="would never end"):
        await group.acall("k", work)
    quiet(group)


def test_a_recursive_sync_call_refuses_to_wait_for_itself() -> None:
    """A leader calling its own key in its thread raises instead of hanging."""
    group = resilient.SingleFlight()

    def work() -> object:
        return group.call("k", work)

    with pytest.raises(RuntimeError, match="runs in this very thread"):
        group.call("k", work)
    quiet(group)


async def test_a_sync_follower_on_the_executions_loop_refuses(
    anyio_backend: str,
) -> None:
    """A blocking wait for an execution of this very event loop raises."""
    group = resilient.SingleFlight()
    latch = Latch()
    results: list[object] = []

    async def lead() -> None:
        results.append(await group.acall("k", latch.await_))

    async with anyio.create_task_group() as tg:
        tg.start_soon(lead)
        while "k" not in group:
            await anyio.lowlevel.checkpoint()
        with pytest.raises(RuntimeError, match="acall"):
            group.call("k", lambda: None)
        latch.open()
    assert results == [None]


def test_call_refuses_a_coroutine_function() -> None:
    """`call` with an async function raises TypeError naming `acall`."""
    group = resilient.SingleFlight()

    async def work() -> None:
        pass

    with pytest.raises(TypeError, match="acall"):
        group.call("k", work)  # type: ignore[arg-type]
    quiet(group)


# -- the decorator -----------------------------------------------------------


def test_the_decorator_shares_calls_with_equal_arguments(
    callers: Callers,
) -> None:
    """Without a key function the arguments are the key."""
    work = callers.work()
    decorated = resilient.singleflight()(work.fn)
    same = [
        callers.start(_bind(callers, decorated, 1, b=2, c=3)),
        callers.start(_bind(callers, decorated, 1, c=3, b=2)),
    ]
    other = callers.start(_bind(callers, decorated, b=2, c=3))
    wait_until(lambda: work.started == 2)
    work.latch.open()
    assert same[0].result(10) is same[1].result(10)
    assert other.result(10) is not same[0].result(10)
    assert work.started == 2


def _bind(
    callers: Callers, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Callable[[], Any]:
    if callers.is_async:

        async def call() -> Any:
            return await fn(*args, **kwargs)

        return call
    return lambda: fn(*args, **kwargs)


def test_the_default_key_is_documented() -> None:
    """``(args, sorted kwargs)``: a group shared by hand can forget it."""
    from resilient._singleflight._decorator import default_key

    assert default_key((1,), {"b": 2, "a": 1}) == ((1,), (("a", 1), ("b", 2)))
    assert default_key((), {}) == ((), ())


def test_a_key_function_gets_the_arguments(callers: Callers) -> None:
    """The key function sees the call's arguments; its result is the key."""
    seen: list[tuple[Any, ...]] = []

    def key(user: int, *, fresh: bool = False) -> int:
        seen.append((user, fresh))
        return user

    work = callers.work()
    decorated = resilient.singleflight(key=key)(work.fn)
    a = callers.start(_bind(callers, decorated, 7, fresh=True))
    wait_until(lambda: work.started == 1)
    b = callers.start(_bind(callers, decorated, 7))
    wait_until(lambda: len(seen) == 2)
    work.latch.open()
    assert a.result(10) is b.result(10)
    assert sorted(seen) == [(7, False), (7, True)]
    assert work.started == 1


def test_methods_share_per_instance_by_default() -> None:
    """``self`` is an argument: calls share only for one instance."""
    latch = Latch()
    runs: list[object] = []

    class Repo:
        @resilient.singleflight()
        def load(self, user: int) -> tuple[object, int]:
            runs.append(self)
            latch.wait()
            return (self, user)

        @resilient.singleflight(key=lambda self, user: user)
        def shared(self, user: int) -> int:
            runs.append(self)
            latch.wait()
            return user

    a, b = Repo(), Repo()
    callers = Callers("sync")
    try:
        futures = [
            callers.start(lambda: a.load(1)),
            callers.start(lambda: a.load(1)),
            callers.start(lambda: b.load(1)),
        ]
        wait_until(lambda: len(runs) == 2)
        shared = [
            callers.start(lambda: a.shared(1)),
            callers.start(lambda: b.shared(1)),
        ]
        wait_until(lambda: len(runs) == 3)
        time.sleep(0.005)
        latch.open()
        assert futures[0].result(10) is futures[1].result(10)
        assert futures[2].result(10) == (b, 1)
        assert [f.result(10) for f in shared] == [1, 1]
    finally:
        callers.close()
    assert len(runs) == 3


def test_a_decorated_function_can_use_a_group_it_is_given() -> None:
    """With ``group=``, its keys are in that group, for `forget`."""
    group = resilient.SingleFlight(name="users")
    latch = Latch()

    @resilient.singleflight(group=group, key=lambda user: ("user", user))
    def load(user: int) -> int:
        latch.wait()
        return user

    thread = threading.Thread(target=load, args=(5,))
    thread.start()
    wait_until(lambda: ("user", 5) in group)
    assert group.forget(("user", 5)) is True
    latch.open()
    thread.join()
    assert load.__name__ == "load"
    assert load(6) == 6


def test_the_decorator_keeps_the_signature() -> None:
    """The wrapper has the function's name, docs and signature."""
    import inspect

    def load(user: int, *, fresh: bool = False) -> int:
        """Load a user."""
        return user

    decorated = resilient.singleflight()(load)
    assert decorated.__name__ == "load"
    assert decorated.__doc__ == "Load a user."
    assert inspect.signature(decorated) == inspect.signature(load)
    assert decorated(3) == 3


def test_singleflight_over_a_policy_shares_the_whole_retried_call(
    callers: Callers,
) -> None:
    """Over a retrying policy, one retried call is shared, not each attempt."""
    attempts: list[int] = []
    latch = Latch()
    policy = resilient.Policy(attempts=3, retry_on=ConnectionError)

    def body() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError
        return "ok"

    if callers.is_async:

        async def abody() -> str:
            await latch.await_()
            return body()

        fn: Callable[..., Any] = resilient.singleflight()(policy(abody))

        async def call() -> Any:
            return await fn()

    else:

        def sbody() -> str:
            latch.wait()
            return body()

        sfn = resilient.singleflight()(policy(sbody))

        def call() -> Any:
            return sfn()

    with resilient.testing.set_testing(True):
        futures = callers.many(10, call)
        wait_until(lambda: len(futures) == 10)
        time.sleep(0.01)
        latch.open()
        assert [f.result(10) for f in futures] == ["ok"] * 10
    assert len(attempts) == 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": 3}, ConfigTypeError),
        ({"group": "g"}, ConfigTypeError),
        ({"name": ""}, ConfigError),
        ({"name": 3}, ConfigTypeError),
        ({"name": "x", "group": resilient.SingleFlight()}, ConfigError),
    ],
)
def test_bad_decorator_options_fail_at_construction(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    """Bad options raise ConfigError / ConfigTypeError naming the field."""
    with pytest.raises(error, match="singleflight"):
        resilient.singleflight(**kwargs)


def test_a_blank_group_name_is_refused() -> None:
    """A group name must be a non-blank str."""
    with pytest.raises(ConfigError, match=r"SingleFlight\(name\)"):
        resilient.SingleFlight(name=" ")


def test_statistics_and_repr() -> None:
    """The record is frozen; the repr names the group and its counts."""
    group = resilient.SingleFlight(name="users")
    s = group.statistics()
    assert s == resilient.SingleFlightStatistics(
        in_flight=0, running=0, waiting=0, executions=0, joined=0, abandoned=0
    )
    with pytest.raises(AttributeError):
        s.joined = 1  # type: ignore[misc]
    assert repr(group) == "<SingleFlight 'users': 0 in flight, 0 waiting>"


# -- telemetry ---------------------------------------------------------------


def one_leader_three_followers(
    callers: Callers, group: resilient.SingleFlight, key: object
) -> None:
    """One caller leads, three join once it runs; all get its result."""
    work = callers.work()
    call = group_caller(callers, group, key, work)
    futures = [callers.start(call)]
    waiting(group, 1)
    futures += callers.many(3, call)
    waiting(group, 4)
    work.latch.open()
    for f in futures:
        assert f.result(10) is work.results[0]


def test_spans_say_who_led_and_how_many_joined(
    callers: Callers, telemetry: Telemetry
) -> None:
    """
    One span per caller with its role and flight number (never the key);
    the leader's says how many joined, followers link to it.
    """
    group = resilient.SingleFlight(name="users")
    one_leader_three_followers(callers, group, "secret-key")
    wait_until(lambda: len(telemetry.spans()) == 4)
    spans = telemetry.spans()
    roles = sorted(s.attributes["resilient.singleflight.role"] for s in spans)
    assert roles == ["follower", "follower", "follower", "leader"]
    (leader,) = [
        s
        for s in spans
        if s.attributes["resilient.singleflight.role"] == "leader"
    ]
    assert leader.name == "singleflight users"
    assert leader.attributes["resilient.singleflight.joined"] == 3
    for s in spans:
        assert s.attributes["resilient.singleflight.flight"] == 1
        assert "secret-key" not in repr(dict(s.attributes))
        assert s.status.is_ok
        if s is not leader:
            assert [link.context for link in s.links] == [leader.context]


def test_the_leaders_span_is_the_parent_of_the_executions_spans(
    driver: Any, telemetry: Telemetry
) -> None:
    """Spans the work opens are children of the leader's span."""
    from opentelemetry import trace

    tracer = telemetry.tracer_provider.get_tracer("test")

    def body() -> str:
        with tracer.start_as_current_span("inner"):
            return "x"

    fn = resilient.singleflight()(driver.fn(body))
    assert driver.run(fn) == "x"
    spans = {s.name: s for s in telemetry.spans()}
    inner, outer = spans["inner"], spans[f"singleflight {_qualname(fn)}"]
    assert inner.parent is not None
    assert inner.parent.span_id == outer.context.span_id
    assert trace.get_current_span().is_recording() is False


def _qualname(fn: Any) -> str:
    return str(fn.__wrapped__.__qualname__)


def test_a_failed_callers_span_records_the_exception(
    driver: Any, telemetry: Telemetry
) -> None:
    """An error ends the caller's span with status ERROR and the exception."""

    def body() -> None:
        raise ValueError("boom")

    fn = resilient.singleflight(name="failing")(driver.fn(body))
    with pytest.raises(ValueError, match="boom"):
        driver.run(fn)
    (span,) = telemetry.spans()
    assert not span.status.is_ok
    assert [e.name for e in span.events] == ["exception"]


def test_an_unhashable_key_leaves_no_span(
    telemetry: Telemetry,
) -> None:
    """A call refused before it joined anything leaves no span."""
    group = resilient.SingleFlight()
    with pytest.raises(TypeError):
        group.call({}, lambda: None)
    assert group.call("k", lambda: None) is None
    assert len(telemetry.spans()) == 1


def test_a_restarted_caller_has_one_span_with_a_restart_event(
    telemetry: Telemetry,
) -> None:
    """A follower that leads the rerun keeps one span, marked restarted."""
    group = resilient.SingleFlight()
    latch = Latch()
    runs: list[int] = []

    def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            latch.wait()
            raise KeyboardInterrupt
        return "again"

    callers = Callers("sync")
    try:
        leader = callers.start(lambda: group.call("k", work))
        waiting(group, 1)
        follower = callers.start(lambda: group.call("k", work))
        waiting(group, 2)
        latch.open()
        assert isinstance(leader.exception(10), KeyboardInterrupt)
        assert follower.result(10) == "again"
    finally:
        callers.close()
    spans = telemetry.spans()
    assert len(spans) == 2
    (again,) = [s for s in spans if s.status.is_ok]
    assert [e.name for e in again.events] == ["resilient.singleflight.restart"]
    assert again.attributes["resilient.singleflight.role"] == "leader"
    assert again.attributes["resilient.singleflight.flight"] == 2


# -- metrics -----------------------------------------------------------------


def _points(telemetry: Telemetry, name: str) -> list[Any]:
    """The data points of metric *name* (none if it was never recorded)."""
    data = telemetry.reader.get_metrics_data()
    if data is None:  # pragma: no cover - nothing recorded at all
        return []
    return [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def test_metrics_count_executions_joins_and_sharing(
    callers: Callers, telemetry: Telemetry
) -> None:
    """
    One execution shared by four callers: executions 1, joined 3, and one
    `callers` histogram point of 4, each labelled with the group's name.
    """
    group = resilient.SingleFlight(name="users")
    one_leader_three_followers(callers, group, "k")
    wait_until(
        lambda: len(_points(telemetry, "resilient.singleflight.callers")) == 1
    )
    metrics = telemetry.metrics()
    assert metrics["resilient.singleflight.executions"] == 1
    assert metrics["resilient.singleflight.joined"] == 3
    assert "resilient.singleflight.abandoned" not in metrics
    (shared,) = _points(telemetry, "resilient.singleflight.callers")
    assert (shared.count, shared.sum) == (1, 4)
    for name in ("executions", "joined", "callers"):
        for point in _points(telemetry, f"resilient.singleflight.{name}"):
            assert dict(point.attributes) == {
                "resilient.singleflight": "users"
            }
    quiet(group)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_an_abandoned_execution_is_counted(
    kind: str, telemetry: Telemetry
) -> None:
    """The last caller leaving an async execution counts one abandoned."""
    group = resilient.SingleFlight(name="gone")
    callers = Callers(kind)
    work = callers.work()
    try:
        futures = callers.many(2, group_caller(callers, group, "k", work))
        waiting(group, 2)
        for f in futures:
            f.cancel()
        wait_until(lambda: work.cancelled == 1)
    finally:
        callers.close()
    metrics = telemetry.metrics()
    assert metrics["resilient.singleflight.abandoned"] == 1
    assert metrics["resilient.singleflight.executions"] == 1
    quiet(group)


def test_metrics_without_a_tracer_provider(driver: Any) -> None:
    """A meter provider and no tracer provider: the metrics are recorded."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    resilient.configure_telemetry(meter_provider=provider)
    try:
        fn = resilient.singleflight(name="alone")(driver.fn(lambda: 5))
        assert driver.run(fn) == 5
        data = reader.get_metrics_data()
    finally:
        resilient.configure_telemetry()
        provider.shutdown()
    assert data is not None
    names = {
        m.name
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {
        "resilient.singleflight.executions",
        "resilient.singleflight.callers",
    } <= names


def test_spans_without_a_meter_provider(driver: Any) -> None:
    """A tracer provider and no meter provider: the spans are made."""
    t = Telemetry()
    resilient.configure_telemetry(tracer_provider=t.tracer_provider)
    try:
        fn = resilient.singleflight(name="traced")(driver.fn(lambda: 6))
        assert driver.run(fn) == 6
    finally:
        resilient.configure_telemetry()
        t.tracer_provider.shutdown()
        t.meter_provider.shutdown()
    assert [s.name for s in t.spans()] == ["singleflight traced"]


def test_the_first_call_looks_for_providers_and_finds_none() -> None:
    """
    Before the first look for configured providers, a call looks (and,
    finding none, records nothing); afterwards telemetry is off.
    """
    from resilient._core._telemetry import TELEMETRY, disabled

    resilient.configure_telemetry()
    TELEMETRY.checked_env = False
    assert not disabled()
    assert resilient.SingleFlight().call("k", lambda: 7) == 7
    assert disabled()
