"""
A policy's own breaker reports its transitions on the call's trace.

The audit of issue 7 found the opening transitions on no span: the policy
settles a failed attempt after the attempt's span has ended and before
the call span was current again. The recorder now makes the call span
current as soon as an attempt's span ends.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

import resilient


if TYPE_CHECKING:
    from tests.conftest import Driver, Telemetry


def test_policy_breaker_opening_is_on_the_trace(
    driver: Driver, telemetry: Telemetry, clock: object
) -> None:
    """Issue 7, item 9 (traces an SRE can search) and instrumentation.md
    ("the call span when they are a policy's stages"): when a policy's own
    breaker opens on a failed attempt, and re-opens on a failed probe, the
    ``resilient.breaker.state_change`` events for closed -> open and
    half_open -> open are on the call's trace, as open -> half_open is."""
    name = f"audit-{uuid.uuid4().hex[:8]}"
    policy = resilient.Policy(
        name=name,
        attempts=2,
        budget=100.0,
        backoff=resilient.Constant(0),
        breaker=resilient.BreakerConfig(
            minimum_calls=1, failure_rate=0.1, open_interval=1.0
        ),
    )

    def down() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        driver.call(policy, down)
    changes = [
        (
            event.attributes["resilient.breaker.from"],
            event.attributes["resilient.breaker.state"],
        )
        for span in telemetry.spans()
        for event in span.events
        if event.name == "resilient.breaker.state_change"
    ]
    assert ("open", "half_open") in changes  # what is there today
    assert ("closed", "open") in changes
    assert ("half_open", "open") in changes


def test_policy_breaker_closing_is_on_the_trace(
    driver: Driver, telemetry: Telemetry, clock: object
) -> None:
    """A probe that succeeds closes a policy's own breaker, and the
    half_open -> closed transition is on the call's trace too (it is
    reported while the probe's attempt is settled)."""
    name = f"trace-{uuid.uuid4().hex[:8]}"
    policy = resilient.Policy(
        name=name,
        attempts=2,
        budget=100.0,
        backoff=resilient.Constant(0),
        breaker=resilient.BreakerConfig(
            minimum_calls=1,
            failure_rate=0.1,
            open_interval=1.0,
            half_open_probes=1,
        ),
    )
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("down")
        return "up"

    assert driver.call(policy, flaky) == "up"
    changes = [
        (
            event.attributes["resilient.breaker.from"],
            event.attributes["resilient.breaker.state"],
        )
        for span in telemetry.spans()
        for event in span.events
        if event.name == "resilient.breaker.state_change"
    ]
    assert changes == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_no_span_stays_current_after_the_call(
    driver: Driver, telemetry: Telemetry, clock: object
) -> None:
    """Making the call span current after each attempt is undone when the
    call ends, whether it gives up or succeeds: the span current before
    the call is current after it, in the caller's own thread or task."""
    from opentelemetry import trace

    policy = resilient.Policy(
        name=f"trace-{uuid.uuid4().hex[:8]}",
        attempts=3,
        budget=100.0,
        backoff=resilient.Constant(0),
    )

    def down() -> None:
        raise ConnectionError("down")

    failing = policy(driver.fn(down))
    working = policy(driver.fn(lambda: 1))
    tracer = telemetry.tracer_provider.get_tracer("test")

    if not driver.is_async:
        with tracer.start_as_current_span("outer") as outer:
            with pytest.raises(ConnectionError):
                failing()
            assert trace.get_current_span() is outer
            assert working() == 1
            assert trace.get_current_span() is outer
        return

    async def main() -> None:
        with tracer.start_as_current_span("outer") as outer:
            with pytest.raises(ConnectionError):
                await failing()
            assert trace.get_current_span() is outer
            assert await working() == 1
            assert trace.get_current_span() is outer

    driver.run(main)
