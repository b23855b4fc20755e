"""
Misuse a new user makes, refused loudly: settings that would fail at call
time refused at construction naming the field, the wrong shell for a
function, sync waits inside an event loop, and unnamed shared guards.
(Issue 6, items 9, 11, 12 and 13.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from typing import Any

import anyio
import pytest

import resilient
from resilient import Constant, Custom, Policy
from resilient.exceptions import ConfigError, ConfigTypeError
from tests.conftest import Driver


_names = itertools.count()


def fresh(prefix: str) -> str:
    """A dependency name no other test uses (registries are per process)."""
    return f"{prefix}-{next(_names)}"


async def _async_predicate(exc: Exception) -> bool:
    return False


class _AsyncHook:
    async def __call__(self, event: resilient.RetryEvent) -> None:
        return None


class TestRefusedAtConstruction:
    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("retry_on", lambda: True),
            ("retry_if_result", lambda: True),
            ("retry_after", lambda: 1),
            ("before_sleep", lambda: None),
            ("on_give_up", lambda a, b: None),
        ],
    )
    def test_wrong_arity_is_refused_naming_the_field(
        self, field: str, value: object
    ) -> None:
        """
        A predicate, hint reader or hook that cannot take the one argument
        it is given is refused when the policy is made, naming the field
        (it used to fail inside the library at the first failure).
        """
        with pytest.raises(ConfigTypeError) as info:
            Policy(**{field: value})
        assert info.value.field == f"Policy.{field}"
        assert info.value.value is value

    def test_custom_backoff_of_wrong_arity_is_refused(self) -> None:
        """`Custom(lambda: 1)` is refused: it is called with the retry."""
        with pytest.raises(ConfigTypeError, match=r"Custom\.fn"):
            Custom(lambda: 1)  # type: ignore[arg-type, misc]

    def test_backoff_whose_delay_has_wrong_arity_is_refused(self) -> None:
        """A user backoff's delay() must take (retry, previous, rng)."""

        class Bad:
            def delay(self, retry: int) -> float:
                return 1.0

        with pytest.raises(ConfigTypeError, match=r"Policy\.backoff\.delay"):
            Policy(backoff=Bad())  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "field", ["retry_on", "retry_if_result", "retry_after"]
    )
    def test_async_predicates_are_refused(self, field: str) -> None:
        """
        An `async def` predicate would be read as always true (a coroutine
        object is truthy): refused, naming the field.
        """
        with pytest.raises(ConfigTypeError, match="not async") as info:
            Policy(**{field: _async_predicate})
        assert info.value.field == f"Policy.{field}"

    def test_async_call_object_hook_on_sync_function(self) -> None:
        """
        A hook object whose ``__call__`` is ``async def`` counts as async:
        refused on a sync function at decoration (it was never awaited).
        """
        policy = Policy(before_sleep=_AsyncHook())
        assert policy.has_async_hooks
        with pytest.raises(ConfigTypeError, match="before_sleep"):
            policy(lambda: None)

    def test_builtin_callables_without_signature_are_accepted(self) -> None:
        """A callable whose signature cannot be read is trusted."""
        assert Policy(retry_if_result=bool).retry_if_result is bool


class TestUserCodeThatFails:
    def test_raising_predicate_keeps_the_callers_error(
        self, driver: Driver, clock: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """
        A retry_on predicate that raises is logged, and the call's own error
        propagates, not retried (as the breaker treats a raising
        failure_on).
        """

        def broken(exc: Exception) -> bool:
            raise RuntimeError("bug in predicate")

        calls: list[int] = []

        def body() -> None:
            calls.append(1)
            raise ConnectionError("the dependency")

        policy = Policy(retry_on=broken, backoff=Constant(seconds=0))
        with (
            caplog.at_level(logging.ERROR, "resilient"),
            pytest.raises(ConnectionError, match="the dependency"),
        ):
            driver.call(policy, body)
        assert calls == [1]
        assert "retry_on predicate" in caplog.text

    def test_raising_result_predicate_accepts_the_result(
        self, driver: Driver, clock: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A retry_if_result that raises is logged; the result is kept."""

        def broken(value: object) -> bool:
            raise RuntimeError("bug")

        policy = Policy(retry_if_result=broken)
        with caplog.at_level(logging.ERROR, "resilient"):
            assert driver.call(policy, lambda: 42) == 42
        assert "retry_if_result predicate" in caplog.text

    def test_raising_hint_reader_falls_back_to_backoff(
        self, driver: Driver, clock: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A retry_after reader that raises is logged; the backoff waits."""

        def broken(exc: Exception) -> float:
            raise RuntimeError("bug")

        calls: list[int] = []

        def body() -> str:
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError
            return "ok"

        policy = Policy(retry_after=broken, backoff=Constant(seconds=2))
        with caplog.at_level(logging.ERROR, "resilient"):
            assert driver.call(policy, body) == "ok"
        assert clock.sleeps == [2.0]
        assert "retry_after reader" in caplog.text

    @pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, "soon"])
    def test_backoff_returning_nonsense_gives_up_with_the_callers_error(
        self,
        driver: Driver,
        clock: Any,
        caplog: pytest.LogCaptureFixture,
        bad: object,
    ) -> None:
        """
        A user backoff that returns NaN, a negative, an infinity or a
        non-number is logged and the call gives up at once: the caller's
        own error propagates, noted with the reason, and nothing sleeps.
        """

        class Broken:
            def delay(self, retry: int, previous: float, rng: Any) -> Any:
                return bad

        policy = Policy(name=fresh("bad-backoff"), backoff=Broken())

        def body() -> None:
            raise ConnectionError("the dependency")

        with (
            caplog.at_level(logging.ERROR, "resilient"),
            pytest.raises(ConnectionError, match="the dependency") as info,
        ):
            driver.call(policy, body)
        assert clock.sleeps == []
        assert "(backoff error)" in info.value.__notes__[0]
        assert "backoff" in caplog.text


class TestWrongShell:
    def test_call_with_an_async_function(self) -> None:
        """`Policy.call(async_fn)` is a TypeError naming `acall`."""

        async def fetch() -> int:
            return 1

        with pytest.raises(TypeError, match=r"policy\.acall"):
            Policy().call(fetch)

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_acall_with_a_sync_function(self, kind: str) -> None:
        """`Policy.acall(sync_fn)` is a TypeError naming `call`, raised at
        once and never retried."""
        calls: list[int] = []

        def compute() -> int:
            calls.append(1)
            return 1

        policy = Policy(retry_on=lambda exc: True)

        async def main() -> None:
            await policy.acall(compute)  # type: ignore[arg-type]

        with pytest.raises(TypeError, match=r"policy\.call\(fn"):
            anyio.run(main, backend=kind)
        assert calls == [1]

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_acall_with_a_lambda_making_a_coroutine(self, kind: str) -> None:
        """A sync callable that returns an awaitable is fine for acall."""

        async def fetch(x: int) -> int:
            return x

        async def main() -> int:
            return await Policy().acall(lambda: fetch(3))

        assert anyio.run(main, backend=kind) == 3

    def test_sync_function_returning_a_coroutine(self, clock: Any) -> None:
        """
        A sync function (seen as sync by the decorator) that returns a
        coroutine is a TypeError naming `async def`, never retried, and the
        coroutine is closed (no "never awaited" warning).
        """
        calls: list[int] = []

        async def work() -> int:
            return 1

        @Policy(retry_on=lambda exc: True, backoff=Constant(seconds=0))
        def looks_sync() -> Any:
            calls.append(1)
            return work()

        with pytest.raises(TypeError, match="async def"):
            looks_sync()
        assert calls == [1]


class TestSyncRetryInsideAnEventLoop:
    def test_sync_decorated_retry_in_async_code_is_refused(
        self, clock: Any
    ) -> None:
        """
        A sync @policy function whose retry would sleep, called on a thread
        that runs an event loop, raises a RuntimeError naming the async
        form instead of stalling the loop, at once: before its first
        attempt (issue 15: not only once the first outage makes it wait).
        """
        policy = Policy(backoff=Constant(seconds=1))
        calls: list[int] = []

        @policy
        def fetch() -> None:
            calls.append(1)
            raise ConnectionError("down")

        async def main() -> None:
            fetch()

        with pytest.raises(RuntimeError, match="async"):
            asyncio.run(main())
        assert calls == []
        assert clock.sleeps == []

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_sync_block_form_in_async_code_is_refused(
        self, clock: Any, kind: str
    ) -> None:
        """The sync `for attempt in retrying(...)` too, on any loop."""
        policy = Policy(backoff=Constant(seconds=1))

        async def main() -> None:
            for attempt in resilient.retrying(policy):
                with attempt:
                    raise ConnectionError

        with pytest.raises(RuntimeError, match="async for attempt"):
            anyio.run(main, backend=kind)
        assert clock.sleeps == []

    def test_zero_delay_retry_is_not_refused(self, clock: Any) -> None:
        """A retry that does not sleep does not block: it is allowed."""
        calls: list[int] = []

        @Policy(backoff=Constant(seconds=0))
        def fetch() -> str:
            calls.append(1)
            if len(calls) < 3:
                raise ConnectionError
            return "ok"

        async def main() -> str:
            return fetch()

        assert asyncio.run(main()) == "ok"
        assert calls == [1, 1, 1]


class TestUnnamedGuards:
    @pytest.mark.parametrize(
        "guard",
        [
            {"breaker": resilient.BreakerConfig()},
            {"bulkhead": resilient.BulkheadConfig(max_concurrent=1)},
            {"retry_budget": resilient.RetryBudgetConfig()},
        ],
    )
    def test_stateful_guard_needs_a_name(self, guard: dict[str, Any]) -> None:
        """
        A policy with a breaker, bulkhead or retry budget and no name is
        refused naming Policy.name: unnamed policies would share one guard
        called "default" (a healthy dependency got CircuitOpen because
        another failed).
        """
        with pytest.raises(ConfigError) as info:
            Policy(**guard)
        assert info.value.field == "Policy.name"
        with pytest.raises(ConfigError):
            Policy().evolve(**guard)

    def test_explicit_names_are_accepted(self) -> None:
        """Naming the policy (even "default", on purpose) is enough."""
        breaker = resilient.BreakerConfig()
        assert Policy(name="payments", breaker=breaker).name == "payments"
        assert Policy(name="default", breaker=breaker).name == "default"
        assert Policy().name == "default"
