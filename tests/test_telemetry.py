"""
Telemetry: a span per call, a child span per attempt, events and metrics,
through the OpenTelemetry API, captured with the SDK's in-memory exporters.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import resilient
from resilient import Constant, Policy
from resilient._core import _telemetry
from tests.conftest import Driver, Telemetry


def flaky(times: int) -> Any:
    calls: list[int] = []

    def body() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise ConnectionError(f"down {len(calls)}")
        return "ok"

    return body


def test_no_provider_no_recorder() -> None:
    """Without any provider configured, no span objects are made."""
    assert _telemetry.recorder("x") is None


def test_spans_for_retried_call(
    driver: Driver, clock: Any, telemetry: Telemetry
) -> None:
    """One call span, one child per attempt, errors recorded, events."""
    policy = Policy(name="payments", backoff=Constant(seconds=0.5))
    assert driver.call(resilient.retry(policy), flaky(2)) == "ok"
    spans = telemetry.spans()
    attempts = [s for s in spans if s.name == "payments attempt"]
    (call,) = [s for s in spans if s.name == "payments"]
    assert [s.attributes["resilient.attempt"] for s in attempts] == [1, 2, 3]
    assert all(s.parent.span_id == call.context.span_id for s in attempts)
    assert [s.status.status_code for s in attempts] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.OK,
    ]
    assert attempts[0].events[0].name == "exception"
    assert (
        attempts[0]
        .events[0]
        .attributes["exception.type"]
        .endswith("ConnectionError")
    )
    assert call.status.status_code is StatusCode.OK
    assert call.attributes["resilient.policy"] == "payments"
    assert call.attributes["resilient.attempts"] == 3
    retries = [e for e in call.events if e.name == "resilient.retry"]
    assert [e.attributes["resilient.delay"] for e in retries] == [0.5, 0.5]
    metrics = telemetry.metrics()
    assert metrics["resilient.attempts"] == 3
    assert metrics["resilient.retries"] == 2
    assert metrics["resilient.retry.delay"] == 2  # histogram count
    assert "resilient.give_ups" not in metrics


def test_give_up_recorded(
    driver: Driver, clock: Any, telemetry: Telemetry
) -> None:
    """A give-up sets the call span's status and counts a give-up."""
    policy = Policy(name="db", attempts=2, backoff=Constant(seconds=0))
    with pytest.raises(ConnectionError):
        driver.call(resilient.retry(policy), flaky(5))
    (call,) = [s for s in telemetry.spans() if s.name == "db"]
    assert call.status.status_code is StatusCode.ERROR
    (give_up,) = [e for e in call.events if e.name == "resilient.give_up"]
    assert give_up.attributes["resilient.reason"] == "attempts"
    assert telemetry.metrics()["resilient.give_ups"] == 1


def test_block_form_spans(
    driver: Driver, clock: Any, telemetry: Telemetry
) -> None:
    """The block form emits the same spans."""
    policy = Policy(name="blk", backoff=Constant(seconds=0))
    body = flaky(1)
    assert driver.block(policy, lambda a: body()) == "ok"
    names = sorted(s.name for s in telemetry.spans())
    assert names == ["blk", "blk attempt", "blk attempt"]


def test_attempt_span_is_current(clock: Any, telemetry: Telemetry) -> None:
    """Spans the call itself opens are children of the attempt span."""
    tracer = telemetry.tracer_provider.get_tracer("client")

    @resilient.retry(Policy(name="outer"))
    def body() -> None:
        with tracer.start_as_current_span("client.request"):
            pass

    body()
    spans = {s.name: s for s in telemetry.spans()}
    assert (
        spans["client.request"].parent.span_id
        == spans["outer attempt"].context.span_id
    )
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_cancelled_call_ends_spans(
    anyio_backend: str, telemetry: Telemetry
) -> None:
    """A call cancelled from outside still ends its spans."""
    import anyio

    @resilient.retry(Policy(name="slow", budget=None))
    async def body() -> None:
        await anyio.sleep(30)

    async def main() -> None:
        with anyio.move_on_after(0.005):
            await body()

    anyio.run(main, backend=anyio_backend)
    names = sorted(s.name for s in telemetry.spans())
    assert names == ["slow", "slow attempt"]


def test_result_retries_recorded(
    driver: Driver, clock: Any, telemetry: Telemetry
) -> None:
    """Retries and give-ups on results are recorded too."""
    policy = Policy(
        name="res",
        attempts=2,
        retry_if_result=lambda v: v is None,
        backoff=Constant(seconds=0),
    )
    assert driver.call(resilient.retry(policy), lambda: None) is None
    metrics = telemetry.metrics()
    assert metrics["resilient.retries"] == 1
    assert metrics["resilient.give_ups"] == 1
