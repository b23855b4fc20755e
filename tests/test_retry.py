"""
Retry: every scenario runs against the sync shell and the async shell
(asyncio and trio), in the decorator form and the block form, in virtual time.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resilient
import resilient.testing
from resilient import Constant, Policy
from resilient._pipeline import _drive
from resilient._timeout import _watchdog
from tests.conftest import Driver


def failing(
    times: int, exc: Callable[[], Exception] = ConnectionError
) -> tuple[Callable[..., str], list[int]]:
    """A body that raises *times* times, then returns "ok"; and its calls."""
    calls: list[int] = []

    def body(*args: Any, **kwargs: Any) -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc()
        return "ok"

    return body, calls


def run_forms(
    driver: Driver, policy: Policy, body: Callable[..., Any]
) -> list[Any]:
    """Run *body* through the decorator and the block form; both results."""
    out = []
    out.append(driver.call(resilient.retry(policy), body))
    out.append(driver.block(policy, lambda attempt: body()))
    return out


class TestOutcomes:
    def test_success_first_time(self, driver: Driver, clock: Any) -> None:
        """A call that succeeds at once returns its value, waits nothing."""
        body, calls = failing(0)
        assert driver.call(resilient.retry(Policy()), body) == "ok"
        assert calls == [1]
        assert clock.sleeps == []

    def test_transient_then_success(self, driver: Driver, clock: Any) -> None:
        """Transient failures are retried with the policy's backoff."""
        policy = Policy(attempts=5, backoff=Constant(seconds=0.5))
        body, calls = failing(2)
        assert driver.call(resilient.retry(policy), body) == "ok"
        assert len(calls) == 3
        assert clock.sleeps == [0.5, 0.5]

    def test_block_form_transient_then_success(
        self, driver: Driver, clock: Any
    ) -> None:
        """The block form retries the same way and exposes attempt numbers."""
        policy = Policy(attempts=5, backoff=Constant(seconds=0.25))
        body, _ = failing(2)
        numbers: list[int] = []

        def block(attempt: resilient.Attempt) -> str:
            numbers.append(attempt.number)
            return body()

        assert driver.block(policy, block) == "ok"
        assert numbers == [1, 2, 3]
        assert clock.sleeps == [0.25, 0.25]

    def test_attempts_exhausted_reraises_same_exception(
        self, driver: Driver, clock: Any
    ) -> None:
        """Giving up re-raises the last exception itself, with a note."""
        raised: list[Exception] = []

        def body() -> None:
            raised.append(ConnectionError(len(raised)))
            raise raised[-1]

        policy = Policy(name="pay", attempts=3, backoff=Constant(seconds=1))
        with pytest.raises(ConnectionError) as info:
            driver.call(resilient.retry(policy), body)
        assert info.value is raised[-1]
        assert len(raised) == 3
        (note,) = info.value.__notes__
        assert "'pay'" in note
        assert "after 3 attempts" in note
        assert "in 2.000s" in note
        assert "(attempts)" in note

    def test_block_form_gives_up_with_note(
        self, driver: Driver, clock: Any
    ) -> None:
        """The block form re-raises the last exception out of the loop."""
        policy = Policy(attempts=2, backoff=Constant(seconds=0))
        with pytest.raises(ConnectionError) as info:
            driver.block(policy, lambda a: failing(5)[0]())
        assert "after 2 attempts" in info.value.__notes__[0]

    def test_not_retryable_first_attempt_untouched(
        self, driver: Driver, clock: Any
    ) -> None:
        """A non-transient exception on attempt 1 propagates unchanged."""
        body, calls = failing(1, exc=lambda: ValueError("bad"))
        for form in ("call", "block"):
            calls.clear()
            with pytest.raises(ValueError, match="bad") as info:
                if form == "call":
                    driver.call(resilient.retry(Policy()), body)
                else:
                    driver.block(Policy(), lambda a: body())
            assert calls == [1]
            assert not getattr(info.value, "__notes__", [])

    def test_not_retryable_after_retries_gets_note(
        self, driver: Driver, clock: Any
    ) -> None:
        """A non-transient exception after retries says so in its note."""
        errors = iter([ConnectionError(), ValueError("then bad")])

        def body() -> None:
            raise next(errors)

        policy = Policy(backoff=Constant(seconds=0))
        with pytest.raises(ValueError, match="then bad") as info:
            driver.call(resilient.retry(policy), body)
        assert "(not retryable)" in info.value.__notes__[0]

    def test_retry_on_predicate(self, driver: Driver, clock: Any) -> None:
        """A predicate decides what is transient."""
        policy = Policy(
            retry_on=lambda e: "transient" in str(e),
            backoff=Constant(seconds=0),
        )
        body, calls = failing(2, exc=lambda: RuntimeError("transient"))
        assert driver.call(resilient.retry(policy), body) == "ok"
        assert len(calls) == 3
        body, calls = failing(2, exc=lambda: RuntimeError("fatal"))
        with pytest.raises(RuntimeError):
            driver.call(resilient.retry(policy), body)
        assert len(calls) == 1

    def test_retry_on_single_class(self, driver: Driver, clock: Any) -> None:
        """A single exception class works like a tuple of one."""
        policy = Policy(retry_on=KeyError, backoff=Constant(seconds=0))
        body, calls = failing(1, exc=lambda: KeyError("k"))
        assert driver.call(resilient.retry(policy), body) == "ok"
        assert len(calls) == 2

    def test_retry_if_result(self, driver: Driver, clock: Any) -> None:
        """Results the predicate rejects are retried; the last is returned."""
        values = iter([None, None, 3])
        policy = Policy(
            retry_if_result=lambda v: v is None,
            backoff=Constant(seconds=0.1),
        )
        assert driver.call(resilient.retry(policy), lambda: next(values)) == 3
        assert clock.sleeps == [0.1, 0.1]

        gave_up: list[resilient.RetryEvent] = []
        policy = policy.evolve(attempts=2, on_give_up=gave_up.append)
        assert driver.call(resilient.retry(policy), lambda: None) is None
        assert [e.reason for e in gave_up] == ["attempts"]
        assert gave_up[0].result is None
        assert gave_up[0].exception is None

    def test_block_form_retry_if_result(
        self, driver: Driver, clock: Any
    ) -> None:
        """`attempt.set_result` feeds the result predicate."""
        values = iter([0, 0, 7])
        policy = Policy(
            retry_if_result=lambda v: v == 0, backoff=Constant(seconds=0)
        )

        def block(attempt: resilient.Attempt) -> int:
            value = next(values)
            attempt.set_result(value)
            return value

        assert driver.block(policy, block) == 7

    def test_unretried_base_exceptions(self, clock: Any) -> None:
        """KeyboardInterrupt is never retried, and no hook hears of it."""
        heard: list[resilient.RetryEvent] = []
        policy = Policy(
            retry_on=lambda e: True,
            on_give_up=heard.append,
            before_sleep=heard.append,
        )
        calls = []

        @resilient.retry(policy)
        def body() -> None:
            calls.append(1)
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            body()
        assert calls == [1]
        assert heard == []


class TestBudget:
    def test_no_wait_past_budget(self, driver: Driver, clock: Any) -> None:
        """A wait that would end past the budget is not started."""
        policy = Policy(
            attempts=None, budget=10.0, backoff=Constant(seconds=3)
        )
        body, calls = failing(100)
        with pytest.raises(ConnectionError) as info:
            driver.call(resilient.retry(policy), body)
        # Waits at 0, 3, 6 end at 3, 6, 9; the one ending at 12 is refused.
        assert clock.sleeps == [3, 3, 3]
        assert len(calls) == 4
        assert "(budget)" in info.value.__notes__[0]

    def test_enclosing_deadline_clips(
        self, driver: Driver, clock: Any
    ) -> None:
        """An enclosing deadline shortens the budget; reason 'deadline'."""
        policy = Policy(attempts=10, backoff=Constant(seconds=1))
        body, calls = failing(100)
        with resilient.deadline(2.5), pytest.raises(ConnectionError) as info:
            driver.call(resilient.retry(policy), body)
        assert clock.sleeps == [1, 1]
        assert "(deadline)" in info.value.__notes__[0]

    def test_attempt_sees_clipped_deadline(
        self, driver: Driver, clock: Any
    ) -> None:
        """Inside an attempt, remaining() is the timeout clipped to budget."""
        seen: list[float] = []
        policy = Policy(budget=5.0, timeout=2.0, backoff=Constant(seconds=2))

        def body() -> None:
            seen.append(resilient.remaining())
            clock.advance(0.5)
            raise ConnectionError

        with pytest.raises(ConnectionError):
            driver.call(resilient.retry(policy), body)
        # t=0: min(2, 5); t=2.5: min(2, 2.5); t=5.0 would be past: stop.
        assert seen == [2.0, 2.0]
        assert resilient.remaining() == math.inf

    def test_nested_retry_inherits_deadline(
        self, driver: Driver, clock: Any
    ) -> None:
        """A retry inside another sees only what the outer one has left."""
        outer = Policy(name="outer", budget=4.0, attempts=1)
        inner = Policy(name="inner", budget=100.0, attempts=1)
        seen: list[float] = []

        def body() -> None:
            seen.append(resilient.remaining())

        inner_fn = resilient.retry(inner)(body)

        def outer_body() -> None:
            clock.advance(1.0)
            inner_fn()

        resilient.retry(outer)(outer_body)()
        assert seen == [3.0]

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(
        attempts=st.one_of(st.none(), st.integers(1, 30)),
        base=st.floats(0.001, 5.0),
        factor=st.floats(1.0, 50.0),
        budget=st.floats(0.01, 60.0),
        timeout=st.one_of(st.none(), st.floats(0.001, 20.0)),
        work=st.floats(0.0, 10.0),
        strategy=st.sampled_from(
            [
                resilient.FullJitter,
                resilient.EqualJitter,
                resilient.DecorrelatedJitter,
                resilient.Exponential,
            ]
        ),
        seed=st.integers(0, 2**32),
    )
    def test_budget_never_overrun(
        self,
        clock: Any,
        attempts: int | None,
        base: float,
        factor: float,
        budget: float,
        timeout: float | None,
        work: float,
        strategy: Any,
        seed: int,
    ) -> None:
        """
        Property: for any policy, a call whose attempts honour remaining()
        ends within its budget, waits included, in virtual time.
        """
        policy = Policy(
            attempts=attempts,
            budget=budget,
            # A timeout above the budget is refused at construction.
            timeout=None if timeout is None else min(timeout, budget),
            backoff=strategy(base=base, cap=base * factor),
        )
        start = clock.now()

        @resilient.retry(policy)
        def body() -> None:
            clock.advance(min(work, resilient.remaining()))
            raise ConnectionError

        with resilient.testing.seed(seed), pytest.raises(ConnectionError):
            body()
        assert clock.now() - start <= budget + 1e-9


class TestHints:
    def test_retry_after_attribute(self, driver: Driver, clock: Any) -> None:
        """An exception's retry_after replaces the backoff delay."""

        class Throttled(ConnectionError):
            retry_after = 2.5

        body, _ = failing(1, exc=Throttled)
        driver.call(resilient.retry(Policy()), body)
        assert clock.sleeps == [2.5]

    def test_retry_after_header_clamped(
        self, driver: Driver, clock: Any
    ) -> None:
        """A Retry-After header is clamped to max_retry_after."""

        class HTTPError(ConnectionError):
            headers = {"Retry-After": "120"}

        body, _ = failing(1, exc=HTTPError)
        policy = Policy(budget=None, max_retry_after=7)
        driver.call(resilient.retry(policy), body)
        assert clock.sleeps == [7.0]

    def test_hint_past_budget_gives_up(
        self, driver: Driver, clock: Any
    ) -> None:
        """A hint longer than the budget left gives up instead of waiting."""

        class Throttled(ConnectionError):
            retry_after = 50

        body, calls = failing(5, exc=Throttled)
        with pytest.raises(Throttled) as info:
            driver.call(resilient.retry(Policy(budget=10)), body)
        assert clock.sleeps == []
        assert len(calls) == 1
        assert "(budget)" in info.value.__notes__[0]

    def test_hints_ignored_when_disabled(
        self, driver: Driver, clock: Any
    ) -> None:
        """retry_after=None ignores hints and uses the backoff."""

        class Throttled(ConnectionError):
            retry_after = 9

        body, _ = failing(1, exc=Throttled)
        policy = Policy(retry_after=None, backoff=Constant(seconds=0.1))
        driver.call(resilient.retry(policy), body)
        assert clock.sleeps == [0.1]

    def test_event_says_where_the_delay_came_from(
        self, driver: Driver, clock: Any
    ) -> None:
        """before_sleep's event says whether the delay was the backoff, a
        server hint, or a hint cut to max_retry_after."""

        class Hinted(ConnectionError):
            def __init__(self, seconds: float | None) -> None:
                super().__init__()
                self.retry_after = seconds

        hints = iter([None, 2.0, 120.0])
        events: list[resilient.RetryEvent] = []

        def body() -> str:
            seconds = next(hints, "done")
            if seconds == "done":
                return "ok"
            raise Hinted(seconds)  # type: ignore[arg-type]

        policy = Policy(
            attempts=4,
            budget=None,
            backoff=Constant(seconds=0.5),
            max_retry_after=7,
            before_sleep=events.append,
            on_give_up=events.append,
        )
        assert driver.call(resilient.retry(policy), body) == "ok"
        assert [(e.delay, e.delay_source) for e in events] == [
            (0.5, "backoff"),
            (2.0, "hint"),
            (7.0, "hint_capped"),
        ]


class TestHooks:
    def test_hooks_see_events(self, driver: Driver, clock: Any) -> None:
        """before_sleep hears each retry, on_give_up the end."""
        events: list[resilient.RetryEvent] = []
        policy = Policy(
            name="h",
            attempts=3,
            backoff=Constant(seconds=1),
            before_sleep=events.append,
            on_give_up=events.append,
        )
        body, _ = failing(10)
        with pytest.raises(ConnectionError):
            driver.call(resilient.retry(policy), body)
        assert [(e.attempt, e.delay, e.reason) for e in events] == [
            (1, 1.0, None),
            (2, 1.0, None),
            (3, None, "attempts"),
        ]
        assert events[1].elapsed == 1.0
        assert all(isinstance(e.exception, ConnectionError) for e in events)
        assert {e.policy for e in events} == {"h"}

    def test_block_form_hooks(self, driver: Driver, clock: Any) -> None:
        """The block form runs the same hooks."""
        events: list[resilient.RetryEvent] = []
        policy = Policy(
            attempts=2,
            backoff=Constant(seconds=1),
            before_sleep=events.append,
            on_give_up=events.append,
        )
        with pytest.raises(ConnectionError):
            driver.block(policy, lambda a: failing(10)[0]())
        assert [e.reason for e in events] == [None, "attempts"]

    def test_raising_hook_is_logged_and_ignored(
        self, driver: Driver, clock: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A hook that raises changes nothing; the error is logged."""

        def hook(event: resilient.RetryEvent) -> None:
            raise RuntimeError("hook bug")

        policy = Policy(backoff=Constant(seconds=0), before_sleep=hook)
        body, _ = failing(1)
        with caplog.at_level(logging.ERROR, logger="resilient"):
            assert driver.call(resilient.retry(policy), body) == "ok"
        assert "hook bug" in caplog.text

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_async_hooks_awaited(self, kind: str, clock: Any) -> None:
        """Async hooks are awaited in async code, in both forms."""
        events: list[int] = []

        async def hook(event: resilient.RetryEvent) -> None:
            await anyio.lowlevel.checkpoint()
            events.append(event.attempt)

        policy = Policy(
            attempts=2,
            backoff=Constant(seconds=0),
            before_sleep=hook,
            on_give_up=hook,
        )
        driver = Driver(kind)
        with pytest.raises(ConnectionError):
            driver.call(resilient.retry(policy), failing(10)[0])
        assert events == [1, 2]
        events.clear()
        with pytest.raises(ConnectionError):
            driver.block(policy, lambda a: failing(10)[0]())
        assert events == [1, 2]

    def test_async_hooks_refused_on_sync(self) -> None:
        """A sync function cannot take a policy with async hooks."""

        async def hook(event: resilient.RetryEvent) -> None:
            pass

        policy = Policy(before_sleep=hook)
        with pytest.raises(resilient.ConfigTypeError, match="async"):
            resilient.retry(policy)(lambda: None)
        with pytest.raises(resilient.ConfigTypeError, match="async"):
            iter(resilient.retrying(policy))

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_async_hooks_need_async_with(self, kind: str) -> None:
        """In async code, a policy with async hooks needs `async with`."""

        async def hook(event: resilient.RetryEvent) -> None:
            pass

        policy = Policy(on_give_up=hook)
        with pytest.raises(TypeError, match="async with"):
            Driver(kind).block(policy, lambda a: 1, use_async_with=False)


class TestZeroDelay:
    def test_sync_zero_delay_makes_no_sleep_call(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With the real clock, a zero delay never calls time.sleep."""
        slept: list[float] = []
        monkeypatch.setattr(time, "sleep", slept.append)
        body, calls = failing(3)
        policy = Policy(backoff=Constant(seconds=0))
        assert resilient.retry(policy)(body)() == "ok"
        assert len(calls) == 4
        assert slept == []

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_async_zero_delay_one_checkpoint(
        self, kind: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A zero delay in async code is one checkpoint and no sleep."""
        sleeps: list[float] = []
        checkpoints: list[int] = []
        real_checkpoint = _watchdog.checkpoint
        real_yield_now = _drive.yield_now

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)

        async def checkpoint() -> None:
            checkpoints.append(1)
            await real_checkpoint()

        async def yield_now() -> None:
            checkpoints.append(1)
            await real_yield_now()

        monkeypatch.setattr(anyio, "sleep", sleep)
        # The async driver's own checkpoint: a yield to asyncio's loop, or
        # trio's checkpoint, directly.
        monkeypatch.setattr(_drive, "trio_checkpoint", lambda: checkpoint)
        monkeypatch.setattr(_drive, "yield_now", yield_now)
        calls: list[int] = []

        async def body() -> str:
            calls.append(1)
            if len(calls) < 4:
                raise ConnectionError
            return "ok"

        policy = Policy(backoff=Constant(seconds=0), budget=None)
        fn = resilient.retry(policy)(body)
        assert Driver(kind).run(fn) == "ok"
        assert sleeps == []
        assert len(checkpoints) == 3  # one per retry, none for the call


class TestTestingMode:
    def test_no_waits_in_testing_mode(
        self, driver: Driver, clock: Any
    ) -> None:
        """set_testing removes waits and can cap attempts."""
        body, calls = failing(10)
        policy = Policy(attempts=5, backoff=Constant(seconds=9))
        with (
            resilient.testing.set_testing(True),
            pytest.raises(ConnectionError),
        ):
            driver.call(resilient.retry(policy), body)
        assert len(calls) == 5
        assert clock.sleeps == []
        calls.clear()
        with (
            resilient.testing.set_testing(True, attempts=2),
            pytest.raises(ConnectionError),
        ):
            driver.call(resilient.retry(policy), body)
        assert len(calls) == 2

    def test_seeded_schedule_matches_sleeps(
        self, driver: Driver, clock: Any
    ) -> None:
        """Seeded jitter sleeps exactly what schedule() predicts."""
        policy = Policy(attempts=6, budget=None)
        body, _ = failing(10)
        with resilient.testing.seed(42), pytest.raises(ConnectionError):
            driver.call(resilient.retry(policy), body)
        assert tuple(clock.sleeps) == resilient.schedule(
            policy.backoff, 5, seed=42
        )


class TestAsyncTimeouts:
    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_attempt_timeout_cancels_and_retries(self, kind: str) -> None:
        """An async attempt past its timeout is cancelled and retried."""
        calls: list[int] = []

        async def body() -> str:
            calls.append(1)
            if len(calls) < 3:
                await anyio.sleep(5)
            return "ok"

        policy = Policy(timeout=0.005, backoff=Constant(seconds=0))
        started = time.monotonic()
        assert Driver(kind).run(resilient.retry(policy)(body)) == "ok"
        assert len(calls) == 3
        assert time.monotonic() - started < 2.0

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_block_form_timeout(self, kind: str) -> None:
        """An async block past its deadline raises DeadlineExceeded."""

        async def main() -> None:
            policy = Policy(attempts=2, timeout=0.005, backoff=Constant(0))
            async for attempt in resilient.retrying(policy):
                async with attempt:
                    assert attempt.remaining() <= 0.005
                    await anyio.sleep(5)

        with pytest.raises(resilient.DeadlineExceeded) as info:
            anyio.run(main, backend=kind)
        assert "after 2 attempts" in info.value.__notes__[0]

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_cancelled_backoff_sleep_wakes_at_once(self, kind: str) -> None:
        """Cancelling a call in its backoff sleep ends it at once."""
        calls: list[int] = []

        @resilient.retry(Policy(backoff=Constant(seconds=30), budget=None))
        async def body() -> None:
            calls.append(1)
            raise ConnectionError

        async def main() -> None:
            with anyio.move_on_after(0.01):
                await body()

        started = time.monotonic()
        anyio.run(main, backend=kind)
        assert calls == [1]
        assert time.monotonic() - started < 2.0

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_outer_cancellation_not_retried(self, kind: str) -> None:
        """Cancellation from outside is not a timeout and is not retried."""
        calls: list[int] = []

        @resilient.retry(Policy(timeout=10, retry_on=lambda e: True))
        async def body() -> None:
            calls.append(1)
            await anyio.sleep(30)

        async def main() -> bool:
            with anyio.move_on_after(0.01) as scope:
                await body()
            return scope.cancelled_caught

        assert anyio.run(main, backend=kind)
        assert calls == [1]


class Service:
    """Methods of every kind, decorated."""

    policy = Policy(backoff=Constant(seconds=0))

    def __init__(self) -> None:
        self.calls = 0

    @resilient.retry(policy)
    def method(self, x: int, *, y: int = 1) -> int:
        """Doc kept."""
        self.calls += 1
        if self.calls < 2:
            raise ConnectionError
        return x + y

    @resilient.retry(policy)
    async def amethod(self, x: int) -> int:
        self.calls += 1
        if self.calls < 2:
            raise ConnectionError
        return x

    @resilient.retry(policy)
    @classmethod
    def cmethod(cls, x: int) -> tuple[type, int]:
        return cls, x

    @classmethod
    @resilient.retry(policy)
    def cmethod_below(cls, x: int) -> tuple[type, int]:
        return cls, x

    @resilient.retry(policy)
    @staticmethod
    def smethod(x: int) -> int:
        return x * 2


class TestDecoration:
    def test_methods(self) -> None:
        """Methods, class methods and static methods all work."""
        s = Service()
        assert s.method(1, y=2) == 3
        assert s.calls == 2
        assert Service.cmethod(4) == (Service, 4)
        assert s.cmethod(4) == (Service, 4)
        assert Service.cmethod_below(5) == (Service, 5)
        assert Service.smethod(3) == 6
        assert s.smethod(3) == 6

    def test_async_method(self, anyio_backend: str) -> None:
        """Async methods are detected and retried."""
        s = Service()
        assert anyio.run(s.amethod, 7, backend=anyio_backend) == 7
        assert s.calls == 2

    def test_signature_and_metadata_kept(self) -> None:
        """inspect sees the original signature, name and doc."""
        assert str(inspect.signature(Service.method)) == (
            "(self, x: 'int', *, y: 'int' = 1) -> 'int'"
        )
        assert Service.method.__name__ == "method"
        assert Service.method.__doc__ == "Doc kept."
        assert inspect.iscoroutinefunction(Service.amethod)
        assert not inspect.iscoroutinefunction(Service.method)

    def test_policy_is_a_decorator(self, driver: Driver, clock: Any) -> None:
        """@policy applies the policy."""
        policy = Policy(backoff=Constant(seconds=0.5))
        body, calls = failing(1)
        assert driver.call(policy, body) == "ok"
        assert clock.sleeps == [0.5]

    def test_callable_objects_and_partials(self, anyio_backend: str) -> None:
        """Async callables are detected through partials and __call__."""
        import functools

        class Handler:
            async def __call__(self, x: int) -> int:
                return x

        async def add(x: int, y: int) -> int:
            return x + y

        wrapped = resilient.retry(Policy())(Handler())
        assert inspect.iscoroutinefunction(wrapped)
        assert anyio.run(wrapped, 3, backend=anyio_backend) == 3
        part = resilient.retry(Policy())(functools.partial(add, 1))
        assert anyio.run(part, 2, backend=anyio_backend) == 3

    def test_bad_arguments(self) -> None:
        """retry() needs a Policy and a callable."""
        with pytest.raises(resilient.ConfigTypeError, match="retry"):
            resilient.retry(3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="callable"):
            resilient.retry(Policy())(3)  # type: ignore[arg-type]
        with pytest.raises(resilient.ConfigTypeError, match="retrying"):
            resilient.retrying("x")  # type: ignore[arg-type]

    def test_block_form_misuse(self) -> None:
        """An attempt not entered, or entered twice, is an error."""
        with pytest.raises(RuntimeError, match="must be entered"):
            for _ in resilient.retrying(Policy()):
                pass
        for attempt in resilient.retrying(Policy()):
            with attempt:
                pass
            with pytest.raises(RuntimeError, match="only once"), attempt:
                pass
        assert "Attempt 1" in repr(attempt)
        assert "retrying(Policy(" in repr(resilient.retrying(Policy()))
        assert attempt.remaining() > 0

    def test_block_form_leaves_no_deadline_behind(self, clock: Any) -> None:
        """Misuse, a break, or a give-up leave the context as it was."""
        policy = Policy(budget=5.0)
        with pytest.raises(RuntimeError):
            for _ in resilient.retrying(policy):
                pass
        assert resilient.remaining() == math.inf
        for _ in resilient.retrying(policy):
            break
        assert resilient.remaining() == math.inf
        for attempt in resilient.retrying(policy):
            with attempt:
                assert resilient.remaining() == 5.0
        assert resilient.remaining() == math.inf

    def test_retrying_is_reusable(self, clock: Any) -> None:
        """One Retrying object serves many loops."""
        loop = resilient.retrying(Policy(backoff=Constant(seconds=1)))
        for _ in range(2):
            body, calls = failing(1)
            for attempt in loop:
                with attempt:
                    body()
            assert len(calls) == 2
        assert clock.sleeps == [1, 1]


class TestMachine:
    def test_machine_directly(self) -> None:
        """The pure machine decides from outcomes and the clock alone."""
        import random

        clock = resilient.testing.FakeClock()
        machine = resilient.lowlevel.RetryMachine(
            Policy(attempts=3, backoff=Constant(seconds=3), budget=5),
            clock,
            random.Random(0),
            start=0.0,
        )
        step = machine.on_error(ConnectionError())
        assert isinstance(step, resilient.lowlevel.Retry)
        assert step.delay == 3.0
        clock.advance(3.0)
        step2 = machine.on_error(ConnectionError())
        assert isinstance(step2, resilient.lowlevel.GiveUp)
        assert step2.reason == "budget"
        assert machine.on_result("x") is None
        assert machine.attempt_deadline() == 5.0


class TestCallThrough:
    def test_call_and_acall(self, driver: Driver, clock: Any) -> None:
        """Policy.call / acall run one call through the policy, with its
        arguments, retrying like the decorator."""
        policy = Policy(backoff=Constant(seconds=0.5))
        body, calls = failing(2)

        def sync_body(x: int, *, y: int) -> str:
            return f"{body()}{x + y}"

        if driver.is_async:

            async def abody(x: int, *, y: int) -> str:
                await anyio.lowlevel.checkpoint()
                return sync_body(x, y=y)

            async def main() -> str:
                return await policy.acall(abody, 1, y=2)

            result = anyio.run(main, backend=driver.kind)
        else:
            result = policy.call(sync_body, 1, y=2)
        assert result == "ok3"
        assert len(calls) == 3
        assert clock.sleeps == [0.5, 0.5]

    def test_call_refuses_async_hooks(self) -> None:
        """A sync call-through cannot await async hooks."""

        async def hook(event: resilient.RetryEvent) -> None:
            pass

        with pytest.raises(resilient.ConfigTypeError, match="async"):
            Policy(before_sleep=hook).call(lambda: None)


class TestNextWait:
    @staticmethod
    def _loop(
        driver: Driver,
        policy: Policy,
        outcomes: list[Any],
        seen: list[tuple[float | None, float | None]],
    ) -> None:
        """
        Run the block form over *outcomes* (an exception to raise or a
        value to set), adding to *seen* each attempt's next_wait inside its
        block and after it. The last attempt's error propagates.
        """
        it = iter(outcomes)

        def body(attempt: resilient.Attempt) -> None:
            seen.append((attempt.next_wait, None))
            outcome = next(it)
            if isinstance(outcome, BaseException):
                raise outcome
            attempt.set_result(outcome)

        def after(attempt: resilient.Attempt) -> None:
            seen[-1] = (seen[-1][0], attempt.next_wait)

        if not driver.is_async:
            for attempt in resilient.retrying(policy):
                try:
                    with attempt:
                        body(attempt)
                finally:
                    after(attempt)
            return

        async def main() -> None:
            async for attempt in resilient.retrying(policy):
                try:
                    async with attempt:
                        await anyio.lowlevel.checkpoint()
                        body(attempt)
                finally:
                    after(attempt)

        anyio.run(main, backend=driver.kind)

    def test_next_wait_after_each_failure(
        self, driver: Driver, clock: Any
    ) -> None:
        """After a retried failure the attempt holds the planned wait (the
        backoff's, or a server hint's); None inside the block and on the
        attempt that gives up."""

        class Throttled(ConnectionError):
            retry_after = 5.0

        policy = Policy(attempts=3, backoff=Constant(seconds=2), budget=None)
        seen: list[tuple[float | None, float | None]] = []
        with pytest.raises(ConnectionError):
            self._loop(
                driver,
                policy,
                [ConnectionError(), Throttled(), ConnectionError()],
                seen,
            )
        assert seen == [(None, 2.0), (None, 5.0), (None, None)]
        assert clock.sleeps == [2.0, 5.0]

    def test_next_wait_on_success_and_results(
        self, driver: Driver, clock: Any
    ) -> None:
        """A retried result gets a next_wait too; an attempt that succeeds,
        or that gives up on a result, keeps None (no attempt follows)."""
        policy = Policy(
            attempts=2,
            backoff=Constant(seconds=1),
            retry_if_result=lambda r: r is None,
        )
        seen: list[tuple[float | None, float | None]] = []
        self._loop(driver, policy, [None, None], seen)
        assert seen == [(None, 1.0), (None, None)]
        seen.clear()
        self._loop(driver, policy, [ConnectionError(), "ok"], seen)
        assert seen == [(None, 1.0), (None, None)]
