"""
Streams (issue 7, item 6): generator functions and async generator
functions under a policy, a breaker or a bulkhead are guarded for the
stream's whole life, the same on sync, asyncio and trio.

A scenario is written once as a generator that yields the operations it
performs on streams (``next``, ``send``, ``throw``, ``close``); the `Runner`
carries them out in its colour (``await``-ing them for async streams) and
sends back the result or throws in the exception. The generator functions
under test are written once as sync generators; `Runner.gen` gives their
async twin, which checkpoints before each step and passes ``asend`` and
``athrow`` on.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import resilient
import resilient.testing
from resilient.testing import FakeClock, use_clock


Op = tuple[Any, ...]
Scenario = Generator[Op, Any, Any]


class Exhausted(Exception):
    """The stream ended: `StopIteration` (with its value) or
    `StopAsyncIteration`, one exception for both colours (neither may
    cross a coroutine or a generator)."""

    def __init__(self, value: object = None) -> None:
        super().__init__(value)
        self.value = value


class Runner:
    """Runs a scenario against sync streams, or async ones on a backend."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.is_async = kind != "sync"

    def __repr__(self) -> str:
        return f"Runner({self.kind})"

    def gen(self, body: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
        """*body* (a sync generator function) in this runner's colour."""
        if not self.is_async:
            return body

        async def agen(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            inner: Generator[Any, Any, Any] = body(*args, **kwargs)  # type: ignore[assignment]
            step: Callable[..., Any] = inner.send
            arg: Any = None
            while True:
                await anyio.lowlevel.checkpoint()
                try:
                    item = step(arg)
                except StopIteration:
                    return
                try:
                    arg, step = (yield item), inner.send
                except GeneratorExit:
                    inner.close()
                    raise
                except BaseException as exc:
                    arg, step = exc, inner.throw

        return agen

    @staticmethod
    def next(it: Any) -> Op:
        """The next item (`Exhausted` when there is none)."""
        return ("next", it)

    @staticmethod
    def send(it: Any, value: object) -> Op:
        """Send *value* in; the next item."""
        return ("send", it, value)

    @staticmethod
    def throw(it: Any, exc: BaseException) -> Op:
        """Throw *exc* in; the next item."""
        return ("throw", it, exc)

    @staticmethod
    def close(it: Any) -> Op:
        """Close the stream."""
        return ("close", it)

    @staticmethod
    def drain(it: Any) -> Op:
        """Every item left, as a list."""
        return ("drain", it)

    @staticmethod
    def collect() -> Op:
        """Run the garbage collector (and, async, let finalizers run)."""
        return ("collect",)

    def _sync(self, op: Op) -> Any:
        kind, *rest = op
        try:
            if kind == "next":
                return next(rest[0])
            if kind == "send":
                return rest[0].send(rest[1])
            if kind == "throw":
                return rest[0].throw(rest[1])
        except StopIteration as stop:
            raise Exhausted(stop.value) from None
        if kind == "close":
            return rest[0].close()
        if kind == "drain":
            return list(rest[0])
        assert kind == "collect"
        gc.collect()
        return None

    async def _async(self, op: Op) -> Any:
        kind, *rest = op
        try:
            if kind == "next":
                return await rest[0].__anext__()
            if kind == "send":
                return await rest[0].asend(rest[1])
            if kind == "throw":
                return await rest[0].athrow(rest[1])
        except StopAsyncIteration:
            raise Exhausted from None
        if kind == "close":
            return await rest[0].aclose()
        if kind == "drain":
            return [item async for item in rest[0]]
        assert kind == "collect"
        gc.collect()
        # The event loop's async generator finalizer runs aclose() in a
        # task of its own.
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        return None

    def run(self, scenario: Callable[[Runner], Scenario]) -> Any:
        """Carry *scenario* out; what it returns."""
        script = scenario(self)
        if not self.is_async:
            return _drive(script, self._sync)

        async def main() -> Any:
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                try:
                    op = (
                        script.send(sent)
                        if thrown is None
                        else script.throw(thrown)
                    )
                except StopIteration as stop:
                    return stop.value
                sent, thrown = None, None
                try:
                    sent = await self._async(op)
                except BaseException as exc:
                    thrown = exc

        return anyio.run(main, backend=self.kind)


def _drive(script: Scenario, perform: Callable[[Op], Any]) -> Any:
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            op = script.send(sent) if thrown is None else script.throw(thrown)
        except StopIteration as stop:
            return stop.value
        sent, thrown = None, None
        try:
            sent = perform(op)
        except BaseException as exc:
            thrown = exc


@pytest.fixture(params=["sync", "asyncio", "trio"])
def runner(request: pytest.FixtureRequest) -> Runner:
    """One stream scenario, three colours: sync, asyncio and trio."""
    return Runner(request.param)


class Tally:
    """How many stream bodies run at once, and how many ever started."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.started = 0

    def body(
        self,
        items: int = 3,
        *,
        fail_before: int = 0,
        fail_after: int = -1,
        error: type[Exception] = ConnectionError,
    ) -> Callable[..., Iterator[int]]:
        """A stream of *items* ints that fails its first *fail_before*
        starts before any item, and raises *error* after *fail_after*
        items (never when -1)."""

        def body() -> Iterator[int]:
            self.started += 1
            self.running += 1
            self.most = max(self.most, self.running)
            try:
                if self.started <= fail_before:
                    raise error("before the first item")
                for i in range(items):
                    if i == fail_after:
                        raise error("mid-stream")
                    yield i
            finally:
                self.running -= 1

        return body


def _bulkhead_config() -> resilient.BulkheadConfig:
    return resilient.BulkheadConfig(max_concurrent=1, max_wait=0)


def _by_policy() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return resilient.Policy(
        name="llm",
        attempts=3,
        backoff=resilient.Constant(0),
        bulkhead=_bulkhead_config(),
    )


def _by_bulkhead() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return resilient.bulkhead("llm", max_concurrent=1, max_wait=0)


BULKHEADS = pytest.mark.parametrize(
    "guard", [_by_policy, _by_bulkhead], ids=["policy", "bulkhead"]
)


@BULKHEADS
def test_max_concurrent_one_admits_one_stream_of_five(
    runner: Runner, guard: Callable[[], Any]
) -> None:
    """Five streams through a max_concurrent=1 bulkhead: the first holds
    the slot while it is iterated, the other four are refused (before the
    fix, all five ran at once)."""
    tally = Tally()
    stream = guard()(runner.gen(tally.body()))

    def scenario(r: Runner) -> Scenario:
        streams = [stream() for _ in range(5)]
        got, refused = [], 0
        for s in streams:
            try:
                got.append((yield r.next(s)))
            except resilient.BulkheadFull:
                refused += 1
        assert (got, refused, tally.most) == ([0], 4, 1)
        assert (yield r.drain(streams[0])) == [1, 2]
        # The slot is free again: the next stream runs.
        assert (yield r.drain(stream())) == [0, 1, 2]

    runner.run(scenario)
    assert resilient.bulkhead("llm").statistics().in_use == 0


# trio warns when it finalizes a collected async generator (it still does).
@pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning")
@BULKHEADS
@pytest.mark.parametrize("end", ["exhausted", "raised", "closed", "dropped"])
def test_slot_released_once_however_the_stream_ends(
    runner: Runner, guard: Callable[[], Any], end: str
) -> None:
    """The slot is given back exactly once when the stream is exhausted,
    raises mid-stream, is closed early, or is dropped and collected."""
    tally = Tally()
    body = (
        tally.body(items=1) if end == "exhausted" else tally.body(fail_after=1)
    )
    stream = guard()(runner.gen(body))
    bh = resilient.bulkhead("llm")

    def scenario(r: Runner) -> Scenario:
        s = stream()
        assert (yield r.next(s)) == 0
        assert bh.statistics().in_use == 1
        with pytest.raises(resilient.BulkheadFull):
            yield r.next(stream())
        if end == "exhausted":
            with pytest.raises(Exhausted):
                yield r.next(s)
        elif end == "raised":
            with pytest.raises(ConnectionError):
                yield r.next(s)
        elif end == "closed":
            yield r.close(s)
            yield r.close(s)
        else:
            del s
            yield r.collect()
        assert tally.running == 0
        assert bh.statistics().in_use == 0

    runner.run(scenario)
    stats = bh.statistics()
    assert stats.in_use == 0
    assert stats.acquired == stats.released


def test_slot_released_when_a_for_loop_breaks_and_drops_it() -> None:
    """A ``for`` loop that breaks out of a stream nobody else holds gives
    the slot back at once (the generator is closed when dropped)."""
    tally = Tally()
    stream = _by_policy()(tally.body())
    for item in stream():
        assert item == 0
        assert resilient.bulkhead("llm").statistics().in_use == 1
        break
    assert resilient.bulkhead("llm").statistics().in_use == 0
    assert tally.running == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_slot_released_when_the_consumer_is_cancelled(backend: str) -> None:
    """A task cancelled while its stream waits for an item gives the slot
    back, and the breaker counts nothing for it."""
    policy = resilient.Policy(
        name="llm",
        attempts=1,
        bulkhead=_bulkhead_config(),
        breaker=resilient.BreakerConfig(minimum_calls=1),
    )
    entered = anyio.Event()

    @policy
    async def stream() -> AsyncIterator[int]:
        yield 0
        entered.set()
        await anyio.sleep(60)
        yield 1  # pragma: no cover - cancelled first

    async def main() -> None:
        items = []
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for item in stream():
                    items.append(item)  # noqa: PERF401 - the loop is cancelled

            tg.start_soon(consume)
            await entered.wait()
            tg.cancel_scope.cancel()
        assert items == [0]
        for _ in range(5):
            await anyio.lowlevel.checkpoint()

    anyio.run(main, backend=backend)
    assert resilient.bulkhead("llm").statistics().in_use == 0
    cb = resilient.breaker("llm").statistics()
    assert (cb.calls, cb.failures) == (0, 0)


def test_slot_released_on_an_interrupt_mid_stream() -> None:
    """A KeyboardInterrupt raised while the stream makes an item reaches the
    consumer and gives the slot back."""
    policy = resilient.Policy(
        name="llm", attempts=3, bulkhead=_bulkhead_config()
    )

    @policy
    def stream() -> Iterator[int]:
        yield 0
        raise KeyboardInterrupt

    s = stream()
    assert next(s) == 0
    assert resilient.bulkhead("llm").statistics().in_use == 1
    with pytest.raises(KeyboardInterrupt):
        next(s)
    assert resilient.bulkhead("llm").statistics().in_use == 0


def _breaker_config() -> resilient.BreakerConfig:
    return resilient.BreakerConfig(
        window=resilient.CountWindow(size=10), minimum_calls=2
    )


BREAKERS = pytest.mark.parametrize(
    "guard",
    [
        lambda: resilient.Policy(
            name="llm", attempts=1, breaker=_breaker_config()
        ),
        lambda: resilient.breaker("llm", _breaker_config()),
    ],
    ids=["policy", "breaker"],
)


@BREAKERS
def test_breaker_counts_errors_raised_mid_stream(
    runner: Runner, guard: Callable[[], Any]
) -> None:
    """Streams that fail after their first item count as failures: two of
    them open the breaker, and the next stream is refused at its first
    ``next`` (before the fix, the breaker counted each as a success)."""
    tally = Tally()
    stream = guard()(runner.gen(tally.body(fail_after=1)))

    def scenario(r: Runner) -> Scenario:
        for _ in range(2):
            s = stream()
            assert (yield r.next(s)) == 0
            with pytest.raises(ConnectionError):
                yield r.next(s)
        with pytest.raises(resilient.CircuitOpen):
            yield r.next(stream())

    runner.run(scenario)
    stats = resilient.breaker("llm").statistics()
    assert (stats.state, stats.failures) == (resilient.BreakerState.OPEN, 2)
    assert tally.started == 2


@BREAKERS
def test_breaker_counts_a_success_at_exhaustion_or_close(
    runner: Runner, guard: Callable[[], Any]
) -> None:
    """A stream counts once it ends, as a success when it is exhausted or
    closed by its consumer; nothing is counted while it is iterated."""
    tally = Tally()
    stream = guard()(runner.gen(tally.body()))
    cb = resilient.breaker("llm")

    def scenario(r: Runner) -> Scenario:
        s = stream()
        assert (yield r.next(s)) == 0
        assert cb.statistics().calls == 0
        assert (yield r.drain(s)) == [1, 2]
        assert cb.statistics().calls == 1
        s = stream()
        yield r.next(s)
        yield r.close(s)
        assert cb.statistics().calls == 2

    runner.run(scenario)
    assert cb.statistics().failures == 0


def _retrying(**kw: Any) -> resilient.Policy:
    return resilient.Policy(
        name="llm", attempts=3, backoff=resilient.Constant(0), **kw
    )


def test_restarted_before_its_first_item(runner: Runner) -> None:
    """A stream that fails before its first item is restarted, as a failed
    attempt; the consumer sees only the stream that worked."""
    tally = Tally()
    stream = _retrying()(runner.gen(tally.body(fail_before=2)))

    def scenario(r: Runner) -> Scenario:
        return (yield r.drain(stream()))

    assert runner.run(scenario) == [0, 1, 2]
    assert tally.started == 3


def test_no_restart_after_the_first_item_and_a_note_says_so(
    runner: Runner,
) -> None:
    """An error after items were delivered is not retried: it reaches the
    consumer with a note saying why."""
    tally = Tally()
    stream = _retrying()(runner.gen(tally.body(fail_after=2)))

    def scenario(r: Runner) -> Scenario:
        s = stream()
        got = [(yield r.next(s)), (yield r.next(s))]
        with pytest.raises(ConnectionError) as info:
            yield r.next(s)
        return got, info.value

    got, exc = runner.run(scenario)
    assert got == [0, 1]
    assert tally.started == 1
    assert exc.__notes__ == [
        (
            "resilient: policy 'llm' could not retry: the stream had "
            "delivered 2 item(s), and a stream is restarted only before its "
            "first item"
        )
    ]


def test_no_note_for_an_error_retry_would_not_retry(runner: Runner) -> None:
    """A mid-stream error the policy does not retry carries no note."""
    tally = Tally()
    body = tally.body(fail_after=1, error=ValueError)
    stream = _retrying()(runner.gen(body))

    def scenario(r: Runner) -> Scenario:
        s = stream()
        yield r.next(s)
        with pytest.raises(ValueError, match="mid-stream") as info:
            yield r.next(s)
        assert not hasattr(info.value, "__notes__")

    runner.run(scenario)


def test_send_and_throw_pass_through(runner: Runner) -> None:
    """``send``/``asend`` reach the inner generator, and ``throw``/
    ``athrow`` too: the stream may catch the error and go on."""
    seen: list[object] = []

    def body() -> Iterator[str]:
        try:
            seen.append((yield "first"))
        except LookupError as exc:
            seen.append(exc)
        seen.append((yield "second"))
        yield "third"

    stream = _retrying()(runner.gen(body))

    def scenario(r: Runner) -> Scenario:
        s = stream()
        assert (yield r.next(s)) == "first"
        error = LookupError("thrown")
        assert (yield r.throw(s, error)) == "second"
        assert (yield r.send(s, "sent")) == "third"
        with pytest.raises(Exhausted):
            yield r.next(s)
        assert seen == [error, "sent"]

    runner.run(scenario)


def test_throw_that_the_stream_does_not_catch_ends_it(runner: Runner) -> None:
    """An error thrown in and not caught propagates and ends the stream,
    releasing its slot."""
    tally = Tally()
    stream = _by_policy()(runner.gen(tally.body()))

    def scenario(r: Runner) -> Scenario:
        s = stream()
        yield r.next(s)
        assert resilient.bulkhead("llm").statistics().in_use == 1
        with pytest.raises(LookupError):
            yield r.throw(s, LookupError("stop"))
        assert resilient.bulkhead("llm").statistics().in_use == 0

    runner.run(scenario)


def test_return_value_and_yield_from_semantics() -> None:
    """A sync stream's return value is kept (``StopIteration.value``, and
    what ``yield from`` over it returns), and an empty stream returns at
    once."""

    @_retrying(bulkhead=_bulkhead_config())
    def stream(n: int) -> Generator[int, None, str]:
        yield from range(n)
        return f"{n} done"

    def outer() -> Generator[int, None, str]:
        result = yield from stream(2)
        return result

    gen = outer()
    assert [next(gen), next(gen)] == [0, 1]
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "2 done"
    with pytest.raises(StopIteration) as stop:
        next(stream(0))
    assert stop.value.value == "0 done"
    assert resilient.bulkhead("llm").statistics().in_use == 0


@pytest.mark.parametrize("standalone", [False, True])
def test_an_empty_stream_ends_at_once(
    runner: Runner, standalone: bool
) -> None:
    """A stream with no items runs holding its slot on its first ``next``,
    ends there and counts as a success, its slot given back (under a
    policy or a bulkhead)."""
    guard = (
        _by_bulkhead()
        if standalone
        else _retrying(bulkhead=_bulkhead_config(), breaker=_breaker_config())
    )
    held = []

    def body() -> Iterator[int]:
        held.append(resilient.bulkhead("llm").statistics().in_use)
        yield from ()

    stream = guard(runner.gen(body))

    def scenario(r: Runner) -> Scenario:
        with pytest.raises(Exhausted):
            yield r.next(stream())

    runner.run(scenario)
    assert held == [1]
    bh = resilient.bulkhead("llm").statistics()
    assert (bh.in_use, bh.acquired) == (0, 1)
    if not standalone:
        assert resilient.breaker("llm").statistics().calls == 1


def test_a_refused_start_is_retried_as_the_policy_says(
    runner: Runner,
) -> None:
    """A stream refused a slot is retried when *retry_on* names
    `BulkheadFull`, and gives up after its attempts, leaving the slot to
    the stream that holds it."""
    tally = Tally()
    policy = _retrying(
        bulkhead=_bulkhead_config(),
        retry_on=(resilient.BulkheadFull, ConnectionError),
    )
    stream = policy(runner.gen(tally.body()))

    def scenario(r: Runner) -> Scenario:
        held = stream()
        yield r.next(held)
        with pytest.raises(resilient.BulkheadFull) as info:
            yield r.next(stream())
        assert "3 attempts" in info.value.__notes__[0]
        assert (yield r.drain(held)) == [1, 2]

    runner.run(scenario)
    stats = resilient.bulkhead("llm").statistics()
    assert (stats.rejected, stats.in_use, tally.started) == (3, 0, 1)


def test_streams_find_their_guards_again_after_a_reset(
    runner: Runner,
) -> None:
    """After `resilient.testing.reset_registries`, a decorated stream takes
    its slot from the bulkhead that now has the policy's name."""
    stream = _by_policy()(runner.gen(Tally().body()))
    before = resilient.bulkhead("llm")
    resilient.testing.reset_registries()

    def scenario(r: Runner) -> Scenario:
        s = stream()
        yield r.next(s)
        assert resilient.bulkhead("llm").statistics().in_use == 1
        yield r.close(s)

    runner.run(scenario)
    assert resilient.bulkhead("llm") is not before
    assert before.statistics().acquired == 0


def test_one_call_span_for_the_streams_life(
    runner: Runner, telemetry: Any
) -> None:
    """A stream that was restarted once has two attempt spans and one call
    span, ended once, when the stream ends (not at its first item)."""
    tally = Tally()
    stream = _retrying()(runner.gen(tally.body(fail_before=1)))

    def scenario(r: Runner) -> Scenario:
        s = stream()
        yield r.next(s)
        names = [span.name for span in telemetry.spans()]
        assert names == ["llm attempt", "llm attempt"]
        assert (yield r.drain(s)) == [1, 2]

    runner.run(scenario)
    spans = telemetry.spans()
    calls = [s for s in spans if s.name == "llm"]
    assert len(calls) == 1
    assert calls[0].attributes["resilient.attempts"] == 2
    assert calls[0].attributes["resilient.stream.items"] == 3
    assert calls[0].status.is_ok
    attempts = [s for s in spans if s.name == "llm attempt"]
    assert all(s.parent.span_id == calls[0].context.span_id for s in attempts)


def test_the_call_span_records_a_mid_stream_error(
    runner: Runner, telemetry: Any
) -> None:
    """An error after the first item ends the call span as an error, with
    the number of items delivered."""
    stream = _retrying()(runner.gen(Tally().body(fail_after=1)))

    def scenario(r: Runner) -> Scenario:
        s = stream()
        yield r.next(s)
        with pytest.raises(ConnectionError):
            yield r.next(s)

    runner.run(scenario)
    (call,) = [s for s in telemetry.spans() if s.name == "llm"]
    assert not call.status.is_ok
    assert call.attributes["resilient.stream.items"] == 1
    assert [e.name for e in call.events][-1] == "exception"


def test_budget_bounds_the_start_not_a_healthy_stream() -> None:
    """The budget bounds getting to the first item: a stream that then
    runs longer than the budget is not cut short, and its steps see no
    deadline of the policy's."""
    clock = FakeClock()
    seen = []

    @_retrying(budget=1.0)
    def stream() -> Iterator[int]:
        for i in range(3):
            seen.append(resilient.remaining())
            clock.advance(5.0)
            yield i

    with use_clock(clock):
        assert list(stream()) == [0, 1, 2]
    assert seen[0] == 1.0
    assert seen[1:] == [float("inf")] * 2


def test_an_enclosing_deadline_bounds_every_item() -> None:
    """Each step of a stream sees the deadline enclosing its consumer when
    it is earlier than the policy's timeout."""
    clock = FakeClock()
    seen = []

    @_retrying(timeout=10.0)
    def stream() -> Iterator[int]:
        for i in range(3):
            seen.append(resilient.remaining())
            clock.advance(1.0)
            yield i

    with use_clock(clock), resilient.deadline(5.0):
        assert list(stream()) == [0, 1, 2]
    assert seen == [5.0, 4.0, 3.0]


def test_timeout_bounds_each_item_cooperatively_in_sync_code() -> None:
    """In sync code the policy's timeout is each item's deadline, seen by
    `resilient.checkpoint`: a stall after the first item raises
    `DeadlineExceeded` with the note and a message naming the item's
    timeout, one before it is retried."""
    clock = FakeClock()
    starts = []

    @_retrying(timeout=1.0)
    def stream() -> Iterator[int]:
        starts.append(1)
        if len(starts) == 1:
            clock.advance(2.0)
            resilient.checkpoint()
        yield 0
        assert resilient.remaining() == 1.0
        clock.advance(2.0)
        resilient.checkpoint()
        yield 1  # pragma: no cover - the checkpoint raised

    with use_clock(clock):
        s = stream()
        assert next(s) == 0
        with pytest.raises(resilient.DeadlineExceeded) as info:
            next(s)
    assert len(starts) == 2
    assert "could not retry" in info.value.__notes__[0]
    # The message names the limit: the policy's timeout on a later item.
    assert str(info.value) == (
        "stream item timeout of 1.000 s exceeded (policy 'llm', attempt 2, "
        "after its first item)"
    )
    assert (info.value.limit, info.value.seconds) == ("item", 1.0)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_timeout_cancels_a_stalled_item_in_async_code(backend: str) -> None:
    """In async code the policy's timeout cancels a first item that does not
    come (retried) and a later one that stalls (raised with the note and a
    message naming the item's timeout; the breaker counts it)."""
    starts = []
    policy = _retrying(timeout=0.005, breaker=_breaker_config())

    @policy
    async def stream() -> AsyncIterator[int]:
        starts.append(1)
        if len(starts) == 1:
            await anyio.sleep(5)
        yield 0
        await anyio.sleep(5)
        yield 1  # pragma: no cover - cancelled first

    async def main() -> BaseException:
        s = stream()
        assert await s.__anext__() == 0
        with pytest.raises(resilient.DeadlineExceeded) as info:
            await s.__anext__()
        return info.value

    exc = anyio.run(main, backend=backend)
    assert len(starts) == 2
    assert "could not retry" in exc.__notes__[0]
    assert str(exc) == (
        "stream item timeout of 0.005 s exceeded (policy 'llm', attempt 2, "
        "after its first item)"
    )
    assert resilient.breaker("llm").statistics().failures == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_enclosing_deadline_cancels_an_async_item(backend: str) -> None:
    """In async code a later item is cancelled at the deadline enclosing its
    consumer, as an attempt would be: `DeadlineExceeded`, with no note and
    not counted by the breaker (the caller's deadline, not the
    dependency)."""
    policy = _retrying(breaker=_breaker_config())

    @policy
    async def stream() -> AsyncIterator[int]:
        yield 0
        await anyio.sleep(5)
        yield 1  # pragma: no cover - cancelled first

    async def main() -> BaseException:
        s = stream()
        assert await s.__anext__() == 0
        with (
            resilient.deadline(0.005),
            pytest.raises(resilient.DeadlineExceeded) as info,
        ):
            await s.__anext__()
        return info.value

    exc = anyio.run(main, backend=backend)
    assert not hasattr(exc, "__notes__")
    stats = resilient.breaker("llm").statistics()
    assert (stats.calls, stats.failures) == (0, 0)


def test_decorated_generator_functions_stay_generator_functions() -> None:
    """A decorated generator function is still a generator function of its
    colour (frameworks check this) with its signature."""

    def gen(a: int, *, b: str = "x") -> Iterator[int]:
        yield a

    async def agen(a: int, *, b: str = "x") -> AsyncIterator[int]:
        yield a

    for guard in (_retrying(), resilient.breaker("b"), _by_bulkhead()):
        assert inspect.isgeneratorfunction(guard(gen))
        assert inspect.isasyncgenfunction(guard(agen))
        assert inspect.signature(guard(gen)) == inspect.signature(gen)
        assert guard(agen).__name__ == "agen"


def test_partials_and_callable_objects_are_streams_too() -> None:
    """A partial of a generator function, or an object whose ``__call__``
    is one, is guarded as a stream."""

    class Tokens:
        def __call__(self, n: int) -> Iterator[int]:
            yield from range(n)

    for fn in (Tokens(), functools.partial(Tokens().__call__)):
        stream = _by_policy()(fn)
        s = stream(2)
        assert next(s) == 0
        assert resilient.bulkhead("llm").statistics().in_use == 1
        assert list(s) == [1]
        assert resilient.bulkhead("llm").statistics().in_use == 0


def test_policy_call_guards_a_generator_function(runner: Runner) -> None:
    """``policy.call(genfn)`` returns the guarded stream, which holds its
    slot; ``await policy.acall(genfn)`` is refused."""
    tally = Tally()
    policy = _retrying(bulkhead=_bulkhead_config())
    body = runner.gen(tally.body())

    def scenario(r: Runner) -> Scenario:
        s = policy.call(body)
        yield r.next(s)
        with pytest.raises(resilient.BulkheadFull):
            yield r.next(policy.call(body))
        assert (yield r.drain(s)) == [1, 2]

    runner.run(scenario)
    with pytest.raises(TypeError, match="is a generator function"):
        anyio.run(policy.acall, runner.gen(tally.body()))


@pytest.mark.parametrize(
    ("decorator", "field"),
    [
        (resilient.singleflight, "singleflight"),
        (lambda: resilient.lock("n", backend="memory://"), "lock"),
        (
            lambda: _retrying(retry_if_result=lambda r: False),
            "retry_if_result",
        ),
        (lambda: _retrying(fallback=lambda exc: None), "fallback"),
    ],
)
def test_what_cannot_guard_a_stream_refuses_it(
    decorator: Callable[[], Any], field: str
) -> None:
    """Decorators and settings that cannot hold for a stream's life refuse a
    generator function at decoration, naming what to use instead."""

    def gen() -> Iterator[int]:
        yield 1  # pragma: no cover - refused

    async def agen() -> AsyncIterator[int]:
        yield 1  # pragma: no cover - refused

    for fn in (gen, agen):
        with pytest.raises(TypeError, match=field):
            decorator()(fn)


def test_methods_and_static_methods_are_streams_too() -> None:
    """A generator method, or a static method, is guarded like a function."""

    class Client:
        @_by_policy()
        def tokens(self) -> Iterator[str]:
            yield "a"
            yield "b"

        @staticmethod
        @_by_policy()
        def more() -> Iterator[str]:
            yield "c"

    s = Client().tokens()
    assert next(s) == "a"
    with pytest.raises(resilient.BulkheadFull):
        next(Client.more())
    assert list(s) == ["b"]
    assert list(Client.more()) == ["c"]


def test_async_hooks_refuse_a_sync_stream() -> None:
    """A policy whose hooks are async refuses a sync generator function,
    decorated or through `Policy.call`, as it refuses a sync function."""

    async def hook(event: resilient.RetryEvent) -> None:
        pass  # pragma: no cover - refused

    policy = _retrying(before_sleep=hook)

    def gen() -> Iterator[int]:
        yield 1  # pragma: no cover - refused

    with pytest.raises(resilient.ConfigTypeError, match="async"):
        policy(gen)
    with pytest.raises(resilient.ConfigTypeError, match="async"):
        policy.call(gen)


def test_no_note_when_no_attempt_was_left(runner: Runner) -> None:
    """A stream that started on its last attempt gets no note: retry could
    not have restarted it anyway."""
    stream = resilient.Policy(name="llm", attempts=1)(
        runner.gen(Tally().body(fail_after=1))
    )

    def scenario(r: Runner) -> Scenario:
        s = stream()
        yield r.next(s)
        with pytest.raises(ConnectionError) as info:
            yield r.next(s)
        assert not hasattr(info.value, "__notes__")

    runner.run(scenario)


def test_an_interrupt_between_the_flows_effects_leaves_nothing(
    runner: Runner, telemetry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt that lands outside the flow while it is suspended (here,
    as the first item is handed over) is thrown into the flow, which resets
    the attempt's deadline, frees the slot and ends the spans."""
    from resilient._pipeline._stream._policy import PolicyStream

    def interrupted(self: object, call: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(PolicyStream, "_started", interrupted)
    stream = _retrying(bulkhead=_bulkhead_config(), timeout=5.0)(
        runner.gen(Tally().body())
    )

    def scenario(r: Runner) -> Scenario:
        with pytest.raises(KeyboardInterrupt):
            yield r.next(stream())
        assert resilient.remaining() == float("inf")
        assert resilient.bulkhead("llm").statistics().in_use == 0

    runner.run(scenario)
    spans = telemetry.spans()
    assert sorted(s.name for s in spans) == ["llm", "llm attempt"]
    assert not any(s.status.is_ok for s in spans)


def test_the_consumer_keeps_its_own_span_between_items(
    runner: Runner, telemetry: Any
) -> None:
    """
    Between items the consumer's current span is its own, not the stream's
    call span (on 4f15275 the call span stayed current from the first item
    on, so the consumer's spans became its children); the stream's steps
    run under the call span.
    """
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    seen_inside: list[str] = []

    def body() -> Iterator[int]:
        for i in range(3):
            span = trace.get_current_span()
            seen_inside.append(getattr(span, "name", "none"))
            yield i

    stream = _retrying()(runner.gen(body))
    consumer = telemetry.tracer_provider.get_tracer("t").start_span("consumer")

    def scenario(r: Runner) -> Scenario:
        token = otel_context.attach(trace.set_span_in_context(consumer))
        try:
            s = stream()
            for _ in range(3):
                yield r.next(s)
                assert trace.get_current_span() is consumer
            yield r.drain(s)
            assert trace.get_current_span() is consumer
        finally:
            otel_context.detach(token)

    runner.run(scenario)
    consumer.end()
    assert seen_inside == ["llm attempt", "llm", "llm"]
