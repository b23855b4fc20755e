"""The fallback stage (issue 7, item 5): `Policy(fallback=...)`, the
outermost stage, outside the budget and retry."""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from opentelemetry.trace import StatusCode

import resilient
from resilient import Constant, Policy
from resilient._core._config_breaker import BreakerConfig, CountWindow
from resilient._core._config_bulkhead import BulkheadConfig
from resilient.exceptions import BulkheadFull, CircuitOpen


if TYPE_CHECKING:
    from tests.conftest import Driver, Telemetry

_names = itertools.count()


def fresh(prefix: str) -> str:
    """A dependency name no other test uses (registries are per process)."""
    return f"{prefix}-fb-{next(_names)}"


def _policy(**kw: Any) -> Policy:
    base: dict[str, Any] = {
        "name": fresh("p"),
        "attempts": 3,
        "backoff": Constant(0),
    }
    return Policy(**{**base, **kw})


def _fails(exc: Exception) -> tuple[Any, list[int]]:
    calls: list[int] = []

    def body() -> None:
        calls.append(1)
        raise exc

    return body, calls


def test_gave_up_error_goes_to_fallback(driver: Driver) -> None:
    """When retry gives up, the fallback gets the final exception (with
    its give-up note) and the call returns what the fallback returns."""
    seen: list[BaseException] = []

    def fallback(exc: Exception) -> str:
        seen.append(exc)
        return "cached"

    body, calls = _fails(ConnectionError("down"))
    result = driver.call(_policy(fallback=fallback), body)
    assert result == "cached"
    assert len(calls) == 3
    (exc,) = seen
    assert isinstance(exc, ConnectionError)
    assert "after 3 attempts" in exc.__notes__[-1]


def test_async_fallback_is_awaited(anyio_backend: str) -> None:
    """An async fallback on an async function is awaited."""

    async def fallback(exc: Exception) -> str:
        await anyio.lowlevel.checkpoint()
        return f"default for {type(exc).__name__}"

    @_policy(fallback=fallback)
    async def body() -> str:
        raise ConnectionError

    assert anyio.run(body, backend=anyio_backend) == (
        "default for ConnectionError"
    )


def test_open_breaker_and_full_bulkhead_go_to_fallback(
    driver: Driver, clock: Any
) -> None:
    """CircuitOpen and BulkheadFull reach the fallback, which runs once
    per call."""
    seen: list[type[BaseException]] = []

    def fallback(exc: Exception) -> str:
        seen.append(type(exc))
        return "fallback"

    tripping = BreakerConfig(
        window=CountWindow(size=2),
        minimum_calls=2,
        failure_rate=1.0,
        open_interval=100.0,
        half_open_probes=1,
    )
    policy = _policy(
        attempts=1, budget=1.0, breaker=tripping, fallback=fallback
    )
    body, calls = _fails(ConnectionError())
    for _ in range(3):
        assert driver.call(policy, body) == "fallback"
    assert len(calls) == 2
    assert seen == [ConnectionError, ConnectionError, CircuitOpen]

    full = _policy(
        attempts=1,
        bulkhead=BulkheadConfig(max_concurrent=1, max_waiting=0),
        fallback=fallback,
    )
    outer = _policy(name=full.name, bulkhead=full.bulkhead)
    inner = driver.fn(lambda: "ran")

    def nested() -> Any:
        return driver.run(full(inner))

    if driver.is_async:

        async def hold() -> Any:
            return await full(inner)()

        assert driver.run(outer(hold)) == "fallback"
    else:
        assert outer(nested)() == "fallback"
    assert seen[-1] is BulkheadFull


def test_fallback_on_chooses_what_is_handled(driver: Driver) -> None:
    """fallback_on (classes or a predicate) limits what the fallback
    takes; anything else is raised as it would be without a fallback."""
    for handles in ((CircuitOpen,), lambda exc: isinstance(exc, KeyError)):
        policy = _policy(fallback=lambda exc: "fb", fallback_on=handles)
        body, calls = _fails(ConnectionError())
        with pytest.raises(ConnectionError):
            driver.call(policy, body)
        assert len(calls) == 3


def test_fallback_can_reraise(driver: Driver) -> None:
    """A fallback that raises ends the call with that exception; one that
    re-raises gives the original error back."""

    def reraise(exc: Exception) -> None:
        raise exc

    def translate(exc: Exception) -> None:
        raise LookupError("no cached value") from exc

    body, _ = _fails(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        driver.call(_policy(fallback=reraise), body)
    with pytest.raises(LookupError) as info:
        driver.call(_policy(fallback=translate), body)
    assert isinstance(info.value.__cause__, ValueError)


def test_fallback_runs_under_the_enclosing_deadline(
    driver: Driver, clock: Any
) -> None:
    """The call's budget is spent when the fallback runs: it sees what is
    left of the enclosing deadline, or no deadline at all."""
    left: list[float] = []

    def fallback(exc: Exception) -> str:
        left.append(resilient.remaining())
        return "fb"

    policy = _policy(budget=5.0, backoff=Constant(2.0), fallback=fallback)

    def body() -> None:
        raise ConnectionError

    assert driver.call(policy, body) == "fb"
    with resilient.deadline(100.0):
        assert driver.call(policy, body) == "fb"
    assert left[0] == float("inf")
    assert left[1] == pytest.approx(100.0 - 4.0)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_cancellation_is_not_handed_over(kind: str) -> None:
    """Cancellation is never a failure to fall back from."""
    called: list[int] = []

    @_policy(fallback=lambda exc: called.append(1))
    async def body() -> None:
        await anyio.sleep(30)

    async def main() -> bool:
        with anyio.move_on_after(0.01) as scope:
            await body()
        return scope.cancelled_caught

    assert anyio.run(main, backend=kind)
    assert called == []


def test_async_fallback_refused_on_sync_code() -> None:
    """An async fallback is refused when the policy decorates or calls a
    sync function, naming the field."""

    async def fallback(exc: Exception) -> str:
        return "fb"

    policy = _policy(fallback=fallback)
    with pytest.raises(resilient.ConfigTypeError, match=r"Policy\.fallback"):
        policy(lambda: None)
    with pytest.raises(resilient.ConfigTypeError, match=r"Policy\.fallback"):
        policy.call(lambda: None)


def test_block_form_refuses_a_fallback(anyio_backend: str) -> None:
    """retrying() cannot return a fallback's value: iterating a policy
    with a fallback is refused, sync and async, naming the field."""
    policy = _policy(fallback=lambda exc: "fb")
    with pytest.raises(resilient.ConfigTypeError, match=r"Policy\.fallback"):
        iter(resilient.retrying(policy))

    async def main() -> None:
        async for _ in resilient.retrying(policy):
            pass  # pragma: no cover - refused before the first attempt

    with pytest.raises(resilient.ConfigTypeError, match=r"Policy\.fallback"):
        anyio.run(main, backend=anyio_backend)


def test_bad_fallback_configuration() -> None:
    """A fallback must be a callable of one argument; fallback_on must be
    Exception classes or a sync predicate."""
    with pytest.raises(resilient.ConfigTypeError, match=r"Policy\.fallback"):
        Policy(fallback=3)  # type: ignore[arg-type]
    with pytest.raises(resilient.ConfigTypeError, match=r"Policy\.fallback"):
        Policy(fallback=lambda: 1)  # type: ignore[arg-type]
    with pytest.raises(resilient.ConfigError, match=r"Policy\.fallback_on"):
        Policy(fallback_on=(KeyboardInterrupt,))  # type: ignore[arg-type]

    async def predicate(exc: Exception) -> bool:
        return True

    with pytest.raises(resilient.ConfigTypeError, match="fallback_on"):
        Policy(fallback_on=predicate)  # type: ignore[arg-type]


def test_fallback_on_predicate_that_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fallback_on predicate that raises is logged and the call's own
    error is raised."""

    def broken(exc: Exception) -> bool:
        raise RuntimeError

    body, _ = _fails(ConnectionError())
    policy = _policy(fallback=lambda exc: "fb", fallback_on=broken)
    with (
        caplog.at_level(logging.ERROR, "resilient"),
        pytest.raises(ConnectionError),
    ):
        policy(body)()
    assert "fallback_on predicate" in caplog.text


def test_sync_fallback_returning_an_awaitable_is_refused() -> None:
    """A sync function's fallback that returns a coroutine is a mistake,
    raised as such (never returned as the call's value)."""

    async def later() -> str:
        return "fb"

    body, _ = _fails(ConnectionError())
    policy = _policy(fallback=lambda exc: later())
    with pytest.raises(TypeError, match="async fallback"):
        policy(body)()


def test_fallback_is_recorded_in_the_span(
    driver: Driver, clock: Any, telemetry: Telemetry
) -> None:
    """The call span carries a ``resilient.fallback`` event and attribute
    (the exception type) and ends OK with the fallback's value."""
    policy = _policy(fallback=lambda exc: "fb")
    body, _ = _fails(ConnectionError())
    assert driver.call(policy, body) == "fb"
    (call,) = [s for s in telemetry.spans() if s.name == policy.name]
    (event,) = [e for e in call.events if e.name == "resilient.fallback"]
    assert event.attributes["exception.type"] == "ConnectionError"
    assert call.attributes["resilient.fallback"] == "ConnectionError"
    assert call.status.status_code is StatusCode.OK


def test_callers_own_deadline_passes_the_fallback(driver: Driver) -> None:
    """
    The deadline of a `resilient.timeout` around the call is the caller's,
    not the dependency's failure: it reaches the caller, never the
    policy's fallback, on sync, asyncio and trio alike (on 4f15275 the
    asyncio call returned the fallback's answer to `DeadlineExceeded`,
    trio's raised). A deadline inside the call (the dependency's own) is
    still handed over.
    """
    handed: list[BaseException] = []

    def fallback(exc: Exception) -> str:
        handed.append(exc)
        return "fb"

    policy = _policy(fallback=fallback)

    if driver.is_async:

        async def body() -> None:
            await anyio.sleep(5)

    else:

        def body() -> None:
            time.sleep(0.1)
            resilient.checkpoint()

    def around() -> Any:
        with resilient.timeout(0.05):
            return policy(body)()

    async def aaround() -> Any:
        with resilient.timeout(0.05):
            return await policy(body)()

    with pytest.raises(resilient.DeadlineExceeded):
        driver.run(aaround if driver.is_async else around)
    assert handed == []

    def inner() -> Any:
        with resilient.timeout(0.05):
            return body()

    async def ainner() -> Any:
        with resilient.timeout(0.05):
            return await body()  # type: ignore[func-returns-value]

    assert driver.run(policy(ainner if driver.is_async else inner)) == "fb"
    assert [type(e) for e in handed] == [resilient.TimedOut]
