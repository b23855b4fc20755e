"""
Type-checked, never executed: what mypy sees of the public API.

`nox -s mypy_api` runs mypy --strict on this file. Every `# type: ignore`
names the error it expects, and `warn_unused_ignores` (part of --strict)
fails the check if that error goes away.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Coroutine, Mapping
from typing import Any, Literal, assert_type

import resilient
import resilient.http
import resilient.testing
from resilient.exceptions import ConfigError, DeadlineExceeded
from resilient.typing import Backoff, Clock


policy = resilient.Policy(
    name="payments",
    attempts=4,
    backoff=resilient.FullJitter(base=0.2, cap=5.0),
    budget=10.0,
    timeout=dt.timedelta(seconds=2),
    retry_on=(ConnectionError, TimeoutError),
)
assert_type(policy, resilient.Policy)
assert_type(policy.attempts, int | None)
assert_type(policy.budget, float | None)
assert_type(policy.backoff, Backoff)


# Decorators keep the signature and the return type, sync and async.


@resilient.retry(policy)
def fetch(url: str, *, tries: int = 1) -> bytes:
    return url.encode() * tries


@resilient.retry(policy)
async def afetch(url: str, *, tries: int = 1) -> bytes:
    return url.encode() * tries


@policy
def charge(order: int) -> dict[str, int]:
    return {"order": order}


@policy
async def refund(order: int) -> None:
    return None


assert_type(fetch("https://example.com", tries=2), bytes)
assert_type(charge(1), dict[str, int])


async def _awaited_functions() -> None:
    # Awaited, so mypy and pyright agree (pyright names the coroutine
    # CoroutineType, mypy Coroutine).
    assert_type(await afetch("https://example.com"), bytes)
    assert_type(await refund(1), None)


fetch(1)  # type: ignore[arg-type]
fetch("u", retries=2)  # type: ignore[call-arg]
charge()  # type: ignore[call-arg]


async def use_async() -> None:
    assert_type(await afetch("u"), bytes)
    assert_type(await refund(2), None)


class Client:
    @resilient.retry(policy)
    def get(self, path: str) -> int:
        return len(path)

    @policy
    async def aget(self, path: str) -> int:
        return len(path)

    @staticmethod
    @resilient.retry(policy)
    def ping() -> bool:
        return True

    @classmethod
    @policy
    def make(cls) -> Client:
        return cls()


client = Client()
assert_type(client.get("/x"), int)


async def _awaited_method() -> None:
    assert_type(await client.aget("/x"), int)


assert_type(Client.ping(), bool)
assert_type(Client.make(), Client)
client.get(3)  # type: ignore[arg-type]


# retry() takes a Policy, positionally.

resilient.retry(policy=policy)  # type: ignore[call-arg]
resilient.retry(3)  # type: ignore[arg-type]


# evolve() is typed per field through a TypedDict.

assert_type(policy.evolve(attempts=2), resilient.Policy)
policy.evolve(attempts=None, budget=dt.timedelta(seconds=5))
policy.evolve(backoff=resilient.Constant(seconds=0.5), timeout=None)
policy.evolve(retry_on=ValueError)
policy.evolve(retry_on=lambda exc: isinstance(exc, OSError))
policy.evolve(attempts="3")  # type: ignore[arg-type]
policy.evolve(tries=3)  # type: ignore[call-arg]


# Backoff strategies and schedules.

strategies: list[Backoff] = [
    resilient.FullJitter(),
    resilient.EqualJitter(base=0.1, cap=1.0),
    resilient.DecorrelatedJitter(),
    resilient.Exponential(base=1.0, cap=60.0),
    resilient.Constant(seconds=1.0),
    resilient.Custom(lambda n: 0.1 * n),
]
assert_type(resilient.schedule(strategies[0], 5), tuple[float, ...])
assert_type(resilient.schedule(strategies[0], 5, seed=1), tuple[float, ...])
assert_type(resilient.FullJitter(0.1, 1.0), resilient.FullJitter)


# The block form: `for`/`with` in sync code, `async for`/`async with` in
# async code; the items are `Attempt`s.


def block() -> int:
    value = 0
    for attempt in resilient.retrying(policy):
        assert_type(attempt, resilient.Attempt)
        with attempt as entered:
            assert_type(entered, resilient.Attempt)
            assert_type(entered.number, int)
            assert_type(entered.remaining(), float)
            value = fetch("u")[0]
            entered.set_result(value)
        assert_type(attempt.next_wait, float | None)
    return value


async def ablock() -> int:
    value = 0
    async for attempt in resilient.retrying(policy):
        assert_type(attempt, resilient.Attempt)
        async with attempt as entered:
            assert_type(entered, resilient.Attempt)
            value = (await afetch("u"))[0]
    return value


assert_type(resilient.retrying(policy), resilient.Retrying)


# Deadlines.

with resilient.deadline(2.0) as scope:
    assert_type(scope, resilient.Deadline)
    assert_type(scope.expired, bool)
    assert_type(resilient.remaining(), float)
    resilient.checkpoint()
resilient.deadline(None)
resilient.deadline("2")  # type: ignore[arg-type]


# Hooks receive a RetryEvent.


def log_retry(event: resilient.RetryEvent) -> None:
    assert_type(event.attempt, int)
    assert_type(event.delay, float | None)
    assert_type(event.exception, BaseException | None)
    assert_type(
        event.delay_source,
        Literal["backoff", "hint", "hint_capped", "admission"] | None,
    )


async def alog_retry(event: resilient.RetryEvent) -> None:
    return None


resilient.Policy(before_sleep=log_retry, on_give_up=alog_retry)
resilient.Policy(before_sleep=len)  # type: ignore[arg-type]


# Retrying on a result: return the last one, or raise GaveUpOnResult.

raising = resilient.Policy(
    retry_if_result=resilient.retry_if_status(), last_result="raise"
)
assert_type(raising.last_result, Literal["return", "raise"])
resilient.Policy(last_result="rise")  # type: ignore[arg-type]
try:
    raising.call(fetch, "u")
except resilient.GaveUpOnResult as gave_up:
    assert_type(gave_up.result, object)
    assert_type(gave_up.attempts, int)


# Server hints.

assert_type(resilient.parse_retry_after("120"), float | None)
assert_type(resilient.default_retry_after(OSError()), float | None)


# Testing helpers: clocks, switches, seeds.

fake = resilient.testing.FakeClock(start=10.0)
clock: Clock = fake
clock = resilient.MonotonicClock()
assert_type(fake.now(), float)
assert_type(fake.sleeps, list[float])
with resilient.testing.use_clock(fake), resilient.testing.seed(1):
    pass
with resilient.testing.set_testing(True, attempts=1):
    assert_type(resilient.testing.is_testing(), bool)
resilient.testing.set_testing(True, attempts="1")  # type: ignore[arg-type]


# Circuit breakers, bulkheads, timeouts and retry budgets.

payments_breaker = resilient.breaker("payments")
assert_type(payments_breaker, resilient.CircuitBreaker)
assert_type(payments_breaker.state, resilient.BreakerState)
assert_type(payments_breaker.retry_after(), float)
assert_type(payments_breaker.statistics(), resilient.BreakerStatistics)
resilient.breaker("payments", resilient.BreakerConfig())
resilient.breaker("shadow", resilient.BreakerConfig(metrics_only=True))
resilient.BreakerConfig(metrics_only="yes")  # type: ignore[arg-type]
resilient.breaker("payments", resilient.Policy())  # type: ignore[arg-type]


@payments_breaker
def pay(amount: int) -> str:
    return str(amount)


@payments_breaker
async def apay(amount: int) -> str:
    return str(amount)


assert_type(pay(3), str)


async def _awaited_pay() -> None:
    assert_type(await apay(3), str)


pay("3")  # type: ignore[arg-type]

with payments_breaker as breaker_permit:
    assert_type(breaker_permit, resilient.BreakerPermit)


async def _async_with_breaker() -> None:
    async with payments_breaker as permit:
        assert_type(permit, resilient.BreakerPermit)


with payments_breaker as breaker_permit:
    assert_type(breaker_permit, resilient.BreakerPermit)

db = resilient.bulkhead("db", max_concurrent=10, max_wait=0.5)
assert_type(db, resilient.Bulkhead)
assert_type(db.statistics(), resilient.BulkheadStatistics)
assert_type(db.acquire_nowait(), resilient.BulkheadPermit)
resilient.bulkhead("db", max_concurrent="10")  # type: ignore[arg-type]
resilient.bulkhead("db", size=10)  # type: ignore[call-arg]


@db
def read(key: str) -> bytes:
    return key.encode()


assert_type(read("k"), bytes)

with db as bulkhead_permit:
    assert_type(bulkhead_permit, resilient.BulkheadPermit)


async def scoped() -> None:
    async with resilient.timeout(1.0) as ascope:
        assert_type(ascope, resilient.TimeoutScope)
    async with db as abulkhead_permit:
        assert_type(abulkhead_permit, resilient.BulkheadPermit)
    async with payments_breaker as abreaker_permit:
        assert_type(abreaker_permit, resilient.BreakerPermit)


with resilient.timeout(dt.timedelta(seconds=2)) as tscope:
    assert_type(tscope, resilient.TimeoutScope)
    assert_type(tscope.remaining(), float)
assert_type(resilient.timeout_at(None), resilient.TimeoutScope)
resilient.timeout("2")  # type: ignore[arg-type]

budget = resilient.retry_budget("payments")
assert_type(budget, resilient.RetryBudget)
assert_type(budget.try_acquire_retry(), bool)
assert_type(budget.statistics(), resilient.RetryBudgetStatistics)

assert_type(
    policy.evolve(
        breaker=resilient.BreakerConfig(),
        bulkhead=resilient.BulkheadConfig(max_concurrent=5),
        retry_budget=resilient.RetryBudgetConfig(),
    ),
    resilient.Policy,
)
policy.evolve(breaker=resilient.BulkheadConfig())  # type: ignore[arg-type]


# Exceptions.

try:
    resilient.Policy(attempts=0)
except ConfigError as exc:
    assert_type(exc.field, str)
    assert_type(exc.value, object)
except DeadlineExceeded as exc:
    assert_type(exc.deadline, float)

version: str = resilient.__version__


def _call_through() -> None:
    policy = resilient.Policy()

    def add(x: int, y: int) -> int:
        return x + y

    async def add_async(x: int, y: int) -> int:
        return x + y

    assert_type(policy.call(add, 1, 2), int)
    policy.call(add, 1, "2")  # type: ignore[arg-type]

    async def main() -> None:
        assert_type(await policy.acall(add_async, 1, 2), int)


# Locks: a context manager (sync and async) and a decorator that keeps
# the signature.

nightly = resilient.lock("nightly-report", ttl=60, backend="memory://")
assert_type(nightly, resilient.Lock)
with nightly as held_lease:
    assert_type(held_lease, resilient.Lease)
    assert_type(held_lease.token, int)
    assert_type(held_lease.valid_for(), float)
    held_lease.checkpoint()
assert_type(held_lease.release(), resilient.ReleaseResult)


@resilient.lock("nightly-report")
def report(day: str) -> int:
    return len(day)


assert_type(report("monday"), int)


@resilient.lock("nightly-report")
async def areport(day: str) -> int:
    async with nightly as alease:
        assert_type(alease, resilient.Lease)
    return len(day)


resilient.lock("x", ttl=dt.timedelta(seconds=5), timeout=None)
resilient.lock("x", ttl="5")  # type: ignore[arg-type]
assert_type(resilient.LockConfig(ttl=1.5).every, float)
assert_type(
    resilient.fenced_update(object(), "t", {"a": 1}, where={"id": 1}, token=1),
    bool,
)


def _rejections(exc: resilient.Rejected) -> None:
    assert_type(exc.retry_after, float | None)
    if isinstance(exc, resilient.CircuitOpen):
        assert_type(exc.retry_after, float)  # A breaker always knows.
        assert_type(exc.opened_by, BaseException | None)
        assert_type(exc.state, str)


def _transition(event: resilient.BreakerTransition) -> None:
    assert_type(event.opened_by, BaseException | None)


def _lowlevel() -> None:
    import random

    machine = resilient.lowlevel.RetryMachine(
        resilient.Policy(name="low"),
        resilient.testing.FakeClock(),
        random.Random(0),
        0.0,
        admission_wait=lambda: 0.0,
    )
    step = machine.on_error(ConnectionError())
    assert_type(step, resilient.lowlevel.Retry | resilient.lowlevel.GiveUp)
    if isinstance(step, resilient.lowlevel.Retry):
        assert_type(step.delay, float)
    assert_type(machine.attempt, int)


# Singleflight: the decorator keeps the signature; the group's calls are
# typed by the function they run.


def _singleflight() -> None:
    @resilient.singleflight(key=lambda user: user)
    def load(user: int) -> str:
        return str(user)

    @resilient.singleflight()
    async def aload(user: int) -> str:
        return str(user)

    assert_type(load(1), str)
    load("1")  # type: ignore[arg-type]

    group = resilient.SingleFlight(name="users")
    assert_type(group.call("k", load, 1), str)
    group.call("k", load, "1")  # type: ignore[arg-type]
    assert_type(group.forget("k"), bool)
    assert_type(group.statistics(), resilient.SingleFlightStatistics)
    assert_type(group.statistics().joined, int)

    # The decorated function's handle on its group, bound for methods too.
    assert_type(load.statistics(), resilient.SingleFlightStatistics)
    assert_type(aload.forget(((1,), ())), bool)
    assert_type(aload.group, resilient.SingleFlight)
    pending: Coroutine[Any, Any, str] = aload(1)
    pending.close()

    class Client:
        @resilient.singleflight()
        def fetch(self, url: str) -> bytes:
            return url.encode()

    assert_type(Client().fetch("u"), bytes)
    assert_type(Client.fetch(Client(), "u"), bytes)
    assert_type(Client().fetch.statistics(), resilient.SingleFlightStatistics)
    Client().fetch(1)  # type: ignore[arg-type]
    assert_type(len(group), int)
    assert_type("k" in group, bool)

    async def main() -> None:
        assert_type(await aload(1), str)
        assert_type(await group.acall("k", aload, 1), str)


# Streams: a decorated generator function keeps its signature and its
# Iterator / Generator / AsyncIterator return type (docs/streams.md).


def _streams() -> None:
    from collections.abc import AsyncIterator, Generator, Iterator

    llm = resilient.Policy(name="llm")

    @llm
    def tokens(prompt: str, *, limit: int = 10) -> Iterator[str]:
        yield prompt[:limit]

    @llm
    def counted(n: int) -> Generator[int, str | None, str]:
        sent = yield n
        return sent or ""

    @llm
    async def atokens(prompt: str) -> AsyncIterator[str]:
        yield prompt

    @resilient.breaker("llm")
    def btokens(prompt: str) -> Iterator[str]:
        yield prompt

    @resilient.bulkhead("llm", max_concurrent=2)
    async def htokens(prompt: str) -> AsyncIterator[str]:
        yield prompt

    assert_type(tokens("hi", limit=2), Iterator[str])
    tokens(1)  # type: ignore[arg-type]
    assert_type(counted(1), Generator[int, str | None, str])
    assert_type(atokens("hi"), AsyncIterator[str])
    assert_type(btokens("hi"), Iterator[str])
    assert_type(htokens("hi"), AsyncIterator[str])
    assert_type(llm.call(tokens, "hi"), Iterator[str])
    assert_type(next(tokens("hi")), str)

    async def main() -> None:
        async for token in atokens("hi"):
            assert_type(token, str)


# resilient.http.needs_key takes the headers as each client types them.
def _http_headers(
    raw: Mapping[str, str | bytes], text: dict[str, str]
) -> None:
    """
    requests' own annotations (2.34 and later) give a request's headers
    ``str | bytes`` values; types-requests and httpx give ``str``.
    """
    assert_type(resilient.http.needs_key("POST", raw), str | None)
    assert_type(resilient.http.needs_key("POST", text), str | None)
    assert_type(resilient.http.needs_key("POST", None), str | None)
