"""
Gaps the audit of issue 7 found outside the files the audit may change,
pinned as strict expected failures: each test says what the issue asks
for, fails today, and turns into an unexpected pass (an error, the marker
being strict) once the gap is closed, so whoever closes it removes the
marker.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

import resilient


if TYPE_CHECKING:
    from tests.conftest import Driver, Telemetry


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a policy's own breaker settles an attempt after its span has ended "
        "and before the call span is made current again, so the opening "
        "transitions land on no span (resilient/_pipeline and "
        "_core/_telemetry.py, outside the audit's files)"
    ),
)
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
