"""
The one flow every driver runs: spans and context on every way out, hooks
inside the budget, testing mode against an open breaker, give-up notes,
the stage table, the layering of the modules, and the retry machine on its
own. (Issue 6, items 2, 4, 5, 10 and 15.)
"""

from __future__ import annotations

import ast
import contextlib
import gc
import itertools
import logging
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry import trace as otel_trace

import resilient
import resilient.testing
from resilient import Constant, Policy
from resilient._breaker import breaker as get_breaker
from resilient._bulkhead import get_bulkhead
from resilient._core import _clock
from resilient.exceptions import BulkheadFull, CircuitOpen
from resilient.lowlevel import GiveUp, Retry, RetryMachine
from tests.conftest import Driver, Telemetry


_names = itertools.count()
ROOT = Path(__file__).resolve().parent.parent / "resilient"


def fresh(prefix: str) -> str:
    """A dependency name no other test uses (registries are per process)."""
    return f"{prefix}-{next(_names)}"


class Interrupt(BaseException):
    """Stands for Ctrl-C or an interrupting timeout: not an Exception."""


class ScriptedClock:
    """A FakeClock whose sleeps raise (sync) or cancel (async) on cue."""

    def __init__(self, interrupt_at: set[int]) -> None:
        self.fake = resilient.testing.FakeClock(start=1000.0)
        self.interrupt_at = interrupt_at
        self.count = 0
        self.scope: anyio.CancelScope | None = None

    def now(self) -> float:
        return self.fake.now()

    def sleep(self, seconds: float) -> None:
        self.count += 1
        self.fake.sleep(seconds)
        if self.count in self.interrupt_at:
            raise Interrupt

    async def asleep(self, seconds: float) -> None:
        self.count += 1
        self.fake.sleep(seconds)
        if self.count in self.interrupt_at:
            assert self.scope is not None
            self.scope.cancel()
        await anyio.lowlevel.checkpoint()


OUTCOMES = st.sampled_from(["ok", "retry", "fatal", "interrupt", "weird"])


@st.composite
def schedules(draw: st.DrawFn) -> dict[str, Any]:
    """A call: what each attempt does, which sleeps are interrupted, what
    the hook does and how a block-form loop is left."""
    return {
        "outcomes": draw(st.lists(OUTCOMES, min_size=1, max_size=5)),
        "interrupt_at": set(
            draw(st.lists(st.integers(1, 4), max_size=2, unique=True))
        ),
        "hook": draw(st.sampled_from(["none", "raises", "interrupt"])),
        "form": draw(
            st.sampled_from(["decorator", "block", "break", "raise_before"])
        ),
    }


def _scenario(
    schedule: dict[str, Any], telemetry: Telemetry, name: str
) -> tuple[Policy, Any, list[int]]:
    outcomes = iter(schedule["outcomes"])
    ran: list[int] = []
    hook_mode = schedule["hook"]

    def hook(event: resilient.RetryEvent) -> None:
        if hook_mode == "raises":
            raise RuntimeError("a broken hook")
        if hook_mode == "interrupt":
            raise Interrupt

    def retry_on(exc: Exception) -> bool:
        if isinstance(exc, ValueError):
            raise TypeError("a broken predicate")
        return isinstance(exc, ConnectionError)

    def body() -> str:
        ran.append(1)
        outcome = next(outcomes, "ok")
        if outcome == "retry":
            raise ConnectionError
        if outcome == "fatal":
            raise KeyError("fatal")
        if outcome == "interrupt":
            raise Interrupt
        if outcome == "weird":
            raise ValueError("predicate breaks on this")
        return "ok"

    policy = Policy(
        name=name,
        attempts=4,
        backoff=Constant(seconds=1),
        retry_on=retry_on,
        before_sleep=hook,
        bulkhead=resilient.BulkheadConfig(max_concurrent=1),
    )
    return policy, body, ran


@contextlib.contextmanager
def _logs_not_kept() -> Iterator[None]:
    """
    Log records of the hooks and predicates that raise are dropped, not
    kept: a kept record holds its traceback, whose frames hold a block-form
    loop left with ``break`` alive (its flow then ends when the record
    goes, not when the loop's last attempt is dropped).
    """
    logger = logging.getLogger("resilient")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = True
        logger.removeHandler(handler)


_SHARED: list[Telemetry] = []


def _telemetry() -> Telemetry:
    """One in-memory SDK for every example (making one is slow), emptied
    and configured for each."""
    if not _SHARED:
        _SHARED.append(Telemetry())
    telemetry = _SHARED[0]
    telemetry.exporter.clear()
    resilient.configure_telemetry(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    return telemetry


def _check_clean(telemetry: Telemetry, ran: list[int], name: str) -> None:
    spans = telemetry.spans()
    calls = [s for s in spans if s.name == name]
    attempts = [s for s in spans if s.name == f"{name} attempt"]
    assert len(calls) == 1, "the call span ended exactly once"
    assert len(attempts) == len(ran), "every attempt span ended"
    assert not otel_trace.get_current_span().get_span_context().is_valid
    assert _clock._DEADLINE.get() == math.inf
    assert get_bulkhead(name).statistics().in_use == 0


def _run_sync(schedule: dict[str, Any], policy: Policy, body: Any) -> None:
    form = schedule["form"]
    if form == "decorator":
        policy(body)()
        return
    for attempt in resilient.retrying(policy):
        if form == "break" and attempt.number == 2:
            break
        if form == "raise_before" and attempt.number == 2:
            raise LookupError("building the request failed")
        with attempt:
            body()


class TestEverySpanEnds:
    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(schedule=schedules())
    def test_sync_schedules(self, schedule: dict[str, Any]) -> None:
        """
        Over generated schedules of outcomes, interrupted sleeps, hooks
        that raise, predicates that raise, and block-form loops left early
        (``break``, an exception before ``with attempt:``), every span ends,
        no span stays current, the deadline is restored and no slot leaks.
        """
        telemetry = _telemetry()
        name = fresh("spans")
        clock = ScriptedClock(schedule["interrupt_at"])
        policy, body, ran = _scenario(schedule, telemetry, name)
        try:
            with resilient.testing.use_clock(clock), _logs_not_kept():
                try:
                    _run_sync(schedule, policy, body)
                except (Interrupt, KeyError, ConnectionError):
                    pass
                except (ValueError, LookupError):
                    pass

            _check_clean(telemetry, ran, name)
        finally:
            resilient.configure_telemetry()

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(schedule=schedules(), backend=st.sampled_from(["asyncio", "trio"]))
    @example(
        schedule={
            "outcomes": ["retry"],
            "interrupt_at": set(),
            "hook": "none",
            "form": "raise_before",
        },
        backend="asyncio",
    )
    def test_async_schedules(
        self, schedule: dict[str, Any], backend: str
    ) -> None:
        """
        The same over the async drivers, where an interrupted sleep is a
        real cancellation of the caller.
        """
        telemetry = _telemetry()
        name = fresh("aspans")
        clock = ScriptedClock(schedule["interrupt_at"])
        policy, body, ran = _scenario(schedule, telemetry, name)
        form = schedule["form"]

        async def abody() -> str:
            await anyio.lowlevel.checkpoint()
            return body()

        async def main() -> None:
            with anyio.CancelScope() as scope:
                clock.scope = scope
                if form == "decorator":
                    await policy(abody)()
                    return
                async for attempt in resilient.retrying(policy):
                    if (
                        form in {"break", "raise_before"}
                        and attempt.number == 2
                    ):
                        # The loop's objects to the oldest generation, as in
                        # a program that ran a while: what frees a loop left
                        # early must not count on them being young.
                        gc.collect()
                    if form == "break" and attempt.number == 2:
                        break
                    if form == "raise_before" and attempt.number == 2:
                        raise LookupError
                    async with attempt:
                        await abody()

        try:
            with resilient.testing.use_clock(clock), _logs_not_kept():
                try:
                    anyio.run(main, backend=backend)
                except (Interrupt, KeyError, ConnectionError):
                    pass
                except (ValueError, LookupError):
                    pass
                # A task that failed is in a reference cycle with its
                # exception's traceback (asyncio's own): a loop it left
                # early is freed, and its flow closed, by the collector: a
                # full collection, since the cycle may be in the oldest
                # generation (a young one's misses it).
                if form in {"break", "raise_before"}:
                    gc.collect()

            _check_clean(telemetry, ran, name)
        finally:
            resilient.configure_telemetry()

    def test_break_before_with_leaves_no_current_span(
        self, telemetry: Telemetry, clock: Any
    ) -> None:
        """
        Leaving the block-form loop before ``with attempt:`` leaves no
        attempt span current: a later span of the thread is not its child.
        """
        policy = Policy(name="early", backoff=Constant(seconds=0))
        for attempt in resilient.retrying(policy):
            assert attempt.number == 1
            break
        assert not otel_trace.get_current_span().get_span_context().is_valid
        del attempt
        names = [s.name for s in telemetry.spans()]
        assert names == ["early"]  # the call span ended; no attempt ran


class TestHooksWithinTheBudget:
    def test_before_sleep_time_counts_toward_the_wait(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        The time a before_sleep hook takes is part of the wait it
        announces: after a 0.4 s hook, a 1 s wait sleeps 0.6 s.
        """

        def slow_hook(event: resilient.RetryEvent) -> None:
            clock.advance(0.4)

        calls: list[int] = []

        def body() -> str:
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError
            return "ok"

        policy = Policy(backoff=Constant(seconds=1), before_sleep=slow_hook)
        assert driver.call(policy, body) == "ok"
        assert clock.sleeps == [pytest.approx(0.6)]

    def test_hook_past_the_deadline_gives_up_without_another_attempt(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        A hook that runs past the budget ends the call: no wait, no attempt
        with no time left; the caller's error propagates, noted "budget",
        and on_give_up hears of it.
        """
        heard: list[str | None] = []

        def slow_hook(event: resilient.RetryEvent) -> None:
            clock.advance(5.0)

        calls: list[int] = []

        def body() -> None:
            calls.append(1)
            raise ConnectionError("down")

        policy = Policy(
            budget=2,
            backoff=Constant(seconds=1),
            before_sleep=slow_hook,
            on_give_up=lambda e: heard.append(e.reason),
        )
        with pytest.raises(ConnectionError) as info:
            driver.call(policy, body)
        assert calls == [1]
        assert clock.sleeps == []
        assert "(budget)" in info.value.__notes__[0]
        assert heard == ["budget"]

    def test_hooks_see_the_calls_deadline(
        self, driver: Driver, clock: Any
    ) -> None:
        """Inside a hook, resilient.remaining() is what is left of the
        call's budget (so a hook can bound itself)."""
        seen: list[float] = []
        policy = Policy(
            budget=10,
            attempts=2,
            backoff=Constant(seconds=1),
            before_sleep=lambda e: seen.append(resilient.remaining()),
            on_give_up=lambda e: seen.append(resilient.remaining()),
        )

        def body() -> None:
            raise ConnectionError

        with pytest.raises(ConnectionError):
            driver.call(policy, body)
        assert seen == [pytest.approx(10.0), pytest.approx(9.0)]

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    @pytest.mark.parametrize("hook", ["before_sleep", "on_give_up"])
    def test_async_hook_is_cancelled_at_the_deadline(
        self, kind: str, hook: str
    ) -> None:
        """
        An async hook that would overrun the call's budget is cancelled
        when the budget ends (a 0.02 s budget and a hook that would sleep
        30 s): the call still ends with its own error.
        """
        finished: list[str] = []

        async def slow(event: resilient.RetryEvent) -> None:
            await anyio.sleep(30)
            finished.append("hook")

        policy = Policy(
            budget=0.02,
            attempts=2,
            backoff=Constant(seconds=0),
            **{hook: slow},
        )

        @policy
        async def body() -> None:
            raise ConnectionError("down")

        async def main() -> None:
            with anyio.fail_after(10):
                await body()

        with pytest.raises(ConnectionError):
            anyio.run(main, backend=kind)
        assert finished == []


class TestTestingMode:
    def test_open_breaker_fails_fast(self, driver: Driver, clock: Any) -> None:
        """
        With set_testing(True), a call against an open breaker gives up at
        the first rejection instead of spinning until the budget is spent.
        """
        name = fresh("testing-open")
        policy = Policy(name=name, breaker=resilient.BreakerConfig())
        get_breaker(name, policy.breaker).force_open()
        calls: list[int] = []
        with (
            resilient.testing.set_testing(True),
            pytest.raises(CircuitOpen) as info,
        ):
            driver.call(policy, lambda: calls.append(1))
        assert calls == []
        assert get_breaker(name).statistics().rejected == 1
        assert "(breaker open)" in info.value.__notes__[0]


class TestGiveUpNotes:
    def test_one_note_per_object_and_policy(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        One exception object raised by many calls (a Future's exception)
        carries one give-up note per policy, not one per call.
        """
        shared = ConnectionError("one object")
        first = Policy(name="first", attempts=2, backoff=Constant(seconds=0))
        second = first.evolve(name="second")

        def body() -> None:
            raise shared

        for policy in (first, first, first, second, second):
            with pytest.raises(ConnectionError):
                driver.call(policy, body)
        notes = shared.__notes__
        assert len(notes) == 2
        assert "'first'" in notes[0]
        assert "'second'" in notes[1]


class TestRejections:
    def test_rejected_is_the_base_of_stage_rejections(self) -> None:
        """CircuitOpen and BulkheadFull share the Rejected base, which
        carries retry_after (None where the stage cannot tell)."""
        assert issubclass(CircuitOpen, resilient.Rejected)
        assert issubclass(BulkheadFull, resilient.Rejected)
        assert CircuitOpen("x", 2.5).retry_after == 2.5
        assert BulkheadFull("x", "full", 1, 0.0).retry_after is None

    def test_any_rejection_with_a_wait_is_outwaited(
        self, driver: Driver, clock: Any
    ) -> None:
        """
        A Rejected from any stage (here one the call raises itself) that
        says when to come back is outwaited like an open breaker: waited
        out with jitter, not an attempt.
        """

        class RateLimited(resilient.Rejected):
            def __init__(self) -> None:
                super().__init__("slow down")
                self.retry_after = 2.0

        outcomes = iter([RateLimited(), "ok"])

        def body() -> str:
            outcome = next(outcomes)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        policy = Policy(
            retry_on=lambda exc: False, backoff=Constant(seconds=0.5)
        )
        assert driver.call(policy, body) == "ok"
        (wait,) = clock.sleeps
        assert 2.5 <= wait <= 4.5


class TestMachine:
    """The retry machine on its own: outcomes and a clock in, decisions
    out, nothing slept (STYLE §6)."""

    def machine(self, clock: Any, **policy: Any) -> RetryMachine:
        settings: dict[str, Any] = {"backoff": Constant(seconds=1)}
        settings.update(policy)
        return RetryMachine(
            Policy(**settings), clock, random.Random(0), start=clock.now()
        )

    def test_decide_error_is_on_error_without_records(
        self, clock: Any
    ) -> None:
        """decide_error gives on_error's delays and reasons, draw for draw,
        with the same state changes; a verdict passed in stands for
        retry_on (which is then not asked)."""
        asked: list[BaseException] = []

        def retry_on(exc: BaseException) -> bool:
            asked.append(exc)
            return isinstance(exc, ConnectionError)

        policy = Policy(attempts=3, budget=None, retry_on=retry_on)
        full = RetryMachine(policy, clock, random.Random(7), start=0.0)
        lean = RetryMachine(policy, clock, random.Random(7), start=0.0)
        for _ in range(3):
            step = full.on_error(ConnectionError())
            decision = lean.decide_error(ConnectionError())
            if isinstance(step, Retry):
                assert decision == step.delay
            else:
                assert decision == step.reason == "attempts"
            assert (lean.attempt, lean.wake) == (full.attempt, full.wake)
        assert len(asked) == 6
        fresh = RetryMachine(policy, clock, random.Random(7), start=0.0)
        assert fresh.decide_error(ConnectionError(), transient=False) == (
            "not_retryable"
        )
        assert isinstance(
            fresh.decide_error(ValueError(), transient=True), float
        )
        assert fresh.decide_error(KeyboardInterrupt()) == "not_retryable"
        assert len(asked) == 6

    def test_attempts_run_out(self, clock: Any) -> None:
        """Three attempts: two retries, then give up with "attempts"."""
        m = self.machine(clock, attempts=3)
        assert isinstance(m.on_error(ConnectionError()), Retry)
        assert isinstance(m.on_error(ConnectionError()), Retry)
        step = m.on_error(ConnectionError())
        assert isinstance(step, GiveUp)
        assert (step.reason, step.event.attempt) == ("attempts", 3)

    def test_not_retryable_and_cancellation(self, clock: Any) -> None:
        """An error the policy does not retry, or a BaseException, gives up
        at once."""
        m = self.machine(clock)
        assert m.on_error(KeyError()).reason == "not_retryable"  # type: ignore[union-attr]
        assert m.on_error(Interrupt()).reason == "not_retryable"  # type: ignore[union-attr]

    def test_hint_clamped_and_nan_ignored(self, clock: Any) -> None:
        """A server hint replaces the backoff, clamped to max_retry_after;
        a NaN hint is no hint."""
        hints = iter([1e9, math.nan])
        m = self.machine(
            clock,
            retry_after=lambda exc: next(hints),
            max_retry_after=30,
            attempts=5,
            budget=None,
        )
        assert m.on_error(ConnectionError()).delay == 30.0  # type: ignore[union-attr]
        assert m.on_error(ConnectionError()).delay == 1.0  # type: ignore[union-attr]

    def test_wait_past_deadline_gives_up(self, clock: Any) -> None:
        """A wait that would end at or past the budget gives up now."""
        m = self.machine(clock, budget=1.5, backoff=Constant(seconds=2))
        step = m.on_error(ConnectionError())
        assert isinstance(step, GiveUp)
        assert step.reason == "budget"

    def test_after_hook(self, clock: Any) -> None:
        """The wait left after a hook shrinks by the hook's time, and a
        hook past the deadline turns the retry into a give-up."""
        m = self.machine(clock, budget=3, backoff=Constant(seconds=2))
        step = m.on_error(ConnectionError())
        assert isinstance(step, Retry)
        clock.advance(0.5)
        assert m.after_hook(step) == pytest.approx(1.5)
        clock.advance(5)
        late = m.after_hook(step)
        assert isinstance(late, GiveUp)
        assert late.reason == "budget"
        # The retry never started: one attempt was made, not two.
        assert late.event.attempt == m.attempt == 1

    def test_rejections_are_bounded(self, clock: Any) -> None:
        """Rejections are outwaited but at most `attempts` of them."""
        m = self.machine(clock, attempts=2, budget=None)
        first = m.on_error(CircuitOpen("x", 1.0))
        assert isinstance(first, Retry)
        assert first.event.delay_source == "admission"
        assert isinstance(m.on_error(CircuitOpen("x", 1.0)), Retry)
        assert m.on_error(CircuitOpen("x", 1.0)).reason == "attempts"  # type: ignore[union-attr]
        assert m.attempt == 1  # none of them was an attempt

    def test_admission_wait_is_waited_for(self, clock: Any) -> None:
        """Before a retry, the machine waits for every stage to admit."""
        m = RetryMachine(
            Policy(backoff=Constant(seconds=1), budget=100),
            clock,
            random.Random(0),
            start=clock.now(),
            admission_wait=lambda: 10.0,
        )
        step = m.on_error(ConnectionError())
        assert isinstance(step, Retry)
        assert 11.0 <= step.delay <= 21.0
        assert step.event.delay_source == "admission"


class TestLayout:
    @staticmethod
    def _imports(path: Path) -> set[str]:
        """The resilient modules *path* imports outside TYPE_CHECKING."""
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found: set[str] = set()

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(
                    child.test
                ):
                    continue
                if isinstance(child, ast.ImportFrom) and child.module:
                    found.add(child.module)
                elif isinstance(child, ast.Import):
                    found.update(a.name for a in child.names)
                visit(child)

        visit(tree)
        return {m for m in found if m.startswith("resilient")}

    @pytest.mark.parametrize(
        ("package", "forbidden"),
        [
            (
                "_core",
                (
                    "resilient._pipeline",
                    "resilient._policy",
                    "resilient._retry",
                ),
            ),
            ("_retry", ("resilient._pipeline", "resilient._policy")),
            ("_pipeline", ("resilient._policy",)),
        ],
    )
    def test_layers_import_only_downward(
        self, package: str, forbidden: tuple[str, ...]
    ) -> None:
        """
        No import circle: `_core` and the retry machine never import the
        pipeline or the face, and the pipeline never imports the face.
        """
        assert (ROOT / package).is_dir()
        bad = {
            (path.name, module)
            for path in (ROOT / package).rglob("*.py")
            for module in self._imports(path)
            if module.startswith(forbidden)
        }
        assert bad == set()

    def test_pipeline_modules_hold_one_concern_each(self) -> None:
        """No module of the pipeline or the machine is past ~500 lines."""
        for package in ("_pipeline", "_retry"):
            assert (ROOT / package).is_dir()
            for path in (ROOT / package).rglob("*.py"):
                lines = path.read_text(encoding="utf-8").count("\n")
                assert lines <= 500, path.name

    def test_no_module_is_past_the_size_rule(self) -> None:
        """The house rule for the whole package: a module past ~500 lines
        is split along its seams (520 here: a docstring's growth is not a
        reason to split a module that holds one concern)."""
        sizes = {
            str(path.relative_to(ROOT)): path.read_text(
                encoding="utf-8"
            ).count("\n")
            for path in ROOT.rglob("*.py")
        }
        assert {p: n for p, n in sizes.items() if n > 520} == {}

    def test_stage_order_matches_the_policy(self) -> None:
        """Each stage of the ORDER table is configured by a Policy field."""
        from resilient._pipeline._stage import ORDER

        fields = {a.name for a in Policy.__attrs_attrs__}
        assert [f for f, _ in ORDER] == ["breaker", "bulkhead"]
        assert {f for f, _ in ORDER} <= fields


class TestRegistryReset:
    def test_reset_reaches_decorated_functions(self, clock: Any) -> None:
        """
        After reset_registries(), a function decorated before sees a fresh
        breaker, the same one `resilient.breaker(name)` returns: an open
        breaker does not leak into the next test.
        """
        pytest.importorskip("resilient._core._registry")
        name = fresh("reset")
        policy = Policy(name=name, breaker=resilient.BreakerConfig())
        calls: list[int] = []
        fn = policy(lambda: calls.append(1))
        get_breaker(name, policy.breaker).force_open()
        with pytest.raises(CircuitOpen):
            fn()
        resilient.testing.reset_registries()
        fn()
        assert calls == [1]
        assert get_breaker(name).state.value == "closed"


class TestEdges:
    def test_old_policy_import_path(self) -> None:
        """`resilient._core._policy.Policy` (the simulator's import) is the
        Policy, looked up lazily; other names are not there."""
        import resilient._core._policy as old

        assert old.Policy is Policy
        with pytest.raises(AttributeError):
            _ = old.Nothing

    def test_block_form_iterators_and_stale_attempts(self, clock: Any) -> None:
        """
        The block form's iterator is its own iterator; an attempt of a loop
        that ended (here: the next one was asked for before it was
        entered) refuses to be entered, and with no deadline an attempt has
        all the time there is.
        """
        loop = resilient.retrying(Policy(budget=None))
        it = iter(loop)
        assert iter(it) is it
        first = next(it)
        assert first.remaining() == math.inf
        with pytest.raises(RuntimeError, match="must be entered"):
            next(it)
        with pytest.raises(RuntimeError, match="loop is over"), first:
            pass

    @pytest.mark.parametrize("kind", ["asyncio", "trio"])
    def test_async_block_iterator_is_its_own(self, kind: str) -> None:
        """`aiter()` of the async iterator is itself."""

        async def main() -> None:
            it = aiter(resilient.retrying(Policy()))
            assert aiter(it) is it
            async for attempt in it:
                async with attempt:
                    pass

        anyio.run(main, backend=kind)

    def test_interrupt_in_on_give_up_leaves_the_block(
        self, telemetry: Telemetry, clock: Any
    ) -> None:
        """An on_give_up hook that raises a BaseException in the block form
        propagates out of ``with attempt:``, and the call's span ends."""

        def hook(event: resilient.RetryEvent) -> None:
            raise Interrupt

        policy = Policy(name="gu", attempts=1, on_give_up=hook)
        with pytest.raises(Interrupt):
            for attempt in resilient.retrying(policy):
                with attempt:
                    raise ConnectionError
        assert [s.name for s in telemetry.spans()] == ["gu attempt", "gu"]

    def test_hook_past_deadline_keeps_a_retried_result(
        self, driver: Driver, clock: Any, telemetry: Telemetry
    ) -> None:
        """
        When the hook before retrying a result runs past the budget, the
        last result is returned (as when attempts run out), and the give-up
        is an event on the call's span.
        """

        def slow_hook(event: resilient.RetryEvent) -> None:
            clock.advance(5)

        policy = Policy(
            name="late",
            budget=2,
            backoff=Constant(seconds=1),
            retry_if_result=lambda value: True,
            before_sleep=slow_hook,
        )
        assert driver.call(policy, lambda: "pending") == "pending"
        (call,) = [s for s in telemetry.spans() if s.name == "late"]
        events = [
            (e.name, e.attributes.get("resilient.reason")) for e in call.events
        ]
        assert events == [
            ("resilient.retry", None),
            ("resilient.give_up", "budget"),
        ]

    def test_decorator_outwaits_a_breaker_open_at_the_start(
        self, driver: Driver, clock: Any
    ) -> None:
        """A call that starts against an open breaker is rejected at
        admission, waits the breaker out and is admitted as the probe."""
        name = fresh("open-at-start")
        policy = Policy(
            name=name,
            budget=60,
            backoff=Constant(seconds=0),
            breaker=resilient.BreakerConfig(
                window=resilient.CountWindow(size=1),
                minimum_calls=1,
                open_interval=5,
            ),
        )
        with pytest.raises(ConnectionError):
            driver.call(policy.evolve(attempts=1), _raise(ConnectionError))
        assert get_breaker(name).state.value == "open"
        assert driver.call(policy, lambda: "probe ok") == "probe ok"
        (wait,) = clock.sleeps
        assert 5.0 <= wait <= 10.0

    def test_coroutine_from_sync_function_on_the_full_path(
        self, clock: Any
    ) -> None:
        """The wrong-shell check holds past the bare first attempt too (an
        attempt timeout takes the full path)."""

        async def work() -> None:
            return None

        @Policy(timeout=5)
        def looks_sync() -> Any:
            return work()

        with pytest.raises(TypeError, match="async def"):
            looks_sync()

    def test_async_backoff_and_custom_are_refused(self) -> None:
        """A backoff whose delay() is async, or an async Custom function,
        is refused at construction."""

        class Async:
            async def delay(
                self, retry: int, previous: float, rng: Any
            ) -> float:
                return 0.0

        async def fn(retry: int) -> float:
            return 0.0

        with pytest.raises(resilient.ConfigTypeError, match="sync delay"):
            Policy(backoff=Async())  # type: ignore[arg-type]
        with pytest.raises(resilient.ConfigTypeError, match="sync function"):
            resilient.Custom(fn)  # type: ignore[arg-type]

    def test_broken_backoff_while_outwaiting(self, clock: Any) -> None:
        """A backoff that fails while a rejection is outwaited gives up
        with the rejection (reason backoff_error)."""

        class Broken:
            def delay(self, retry: int, previous: float, rng: Any) -> float:
                raise RuntimeError

        m = RetryMachine(
            Policy(backoff=Broken()), clock, random.Random(0), clock.now()
        )
        step = m.on_error(CircuitOpen("x", 1.0))
        assert isinstance(step, GiveUp)
        assert step.reason == "backoff_error"


def _raise(exc: type[Exception]) -> Any:
    def body() -> None:
        raise exc

    return body


class TestOutsideExceptions:
    """What an asynchronous exception between two steps leaves behind."""

    def test_abandon_throws_into_a_suspended_flow(
        self, telemetry: Telemetry, clock: Any
    ) -> None:
        """
        An exception that landed in a driver while the flow waits for its
        attempt is thrown in by `abandon`: the attempt's deadline is reset
        in this context, its span and the call's end, the flow is over.
        """
        from resilient._pipeline._call import Call
        from resilient._pipeline._effects import abandon
        from resilient._pipeline._flow import RUN, flow

        call = Call(Policy(name="abandoned", timeout=2.0))
        gen = flow(call)
        op, at = gen.send(None)
        assert op == RUN
        assert _clock._DEADLINE.get() == at
        abandon(call, gen, Interrupt())
        assert gen.gi_frame is None
        assert _clock._DEADLINE.get() == math.inf
        assert not otel_trace.get_current_span().get_span_context().is_valid
        names = sorted(s.name for s in telemetry.spans())
        assert names == ["abandoned", "abandoned attempt"]

    def test_abandon_ends_a_flow_not_started(
        self, telemetry: Telemetry
    ) -> None:
        """A flow the exception reached before its first step: the call's
        span ends all the same."""
        from resilient._pipeline._call import Call
        from resilient._pipeline._effects import abandon
        from resilient._pipeline._flow import flow

        call = Call(Policy(name="unstarted"))
        abandon(call, flow(call), Interrupt())
        assert [s.name for s in telemetry.spans()] == ["unstarted"]

    def test_a_lost_deadline_token_is_made_good(self) -> None:
        """
        A deadline set whose token was lost (the exception landed between
        the set and its store) is undone by value: the deadline it replaced
        is current again.
        """
        from resilient._pipeline import _call

        call = _call.Call(Policy(name="lost", budget=5.0))
        for enter in (call.enter_deadline, call.start_attempt):
            enter()
            assert _clock._DEADLINE.get() != math.inf
            call._token = _call._LOST  # what the landing leaves
            call.exit_deadline()
            assert _clock._DEADLINE.get() == math.inf
        call.start_attempt()
        call._token = _call._LOST
        call.end_attempt(None)
        assert _clock._DEADLINE.get() == math.inf
