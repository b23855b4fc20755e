"""
Issue 7, item 4, tried with the real clients the audit found it untested
with: `resilient.remaining_or_none()` is a timeout httpx and requests
accept with and without a deadline, and passed on from a sync attempt it
is what stops a blocking request at the attempt's deadline.
"""

from __future__ import annotations

import math
import time

import httpx
import pytest
import requests

import resilient
from tests.http_server import Server


# httpx leaks the socket it opened when the timeout overflows.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_unbounded_remaining_is_refused_but_the_none_form_is_not(
    server: Server,
) -> None:
    """With no deadline `remaining()` is inf, which httpx refuses (the
    issue's OverflowError); `remaining_or_none()` is None, which httpx and
    requests read as no timeout."""
    assert resilient.remaining() == math.inf
    with httpx.Client() as client, pytest.raises(OverflowError):
        client.get(server.url + "/", timeout=resilient.remaining())
    assert resilient.remaining_or_none() is None
    timeout = resilient.remaining_or_none()
    assert httpx.get(server.url + "/", timeout=timeout).status_code == 200
    assert requests.get(server.url + "/", timeout=timeout).status_code == 200


@pytest.mark.parametrize("client", ["httpx", "requests"])
def test_sync_attempt_deadline_passed_on_stops_a_blocking_request(
    server: Server, client: str
) -> None:
    """A sync attempt's timeout is cooperative; passed on as the client's
    own timeout it stops a request the server answers only after 0.3 s at
    about the attempt's 0.05 s, and the client's timeout error is retried
    by the default classifier (two attempts, both cut short)."""
    policy = resilient.Policy(
        name=f"audit-deadline-{client}",
        attempts=2,
        timeout=0.05,
        backoff=resilient.Constant(0),
    )
    seen: list[float | None] = []

    @policy
    def get() -> int:
        timeout = resilient.remaining_or_none()
        seen.append(timeout)
        if client == "httpx":
            return httpx.get(server.url + "/slow", timeout=timeout).status_code
        return requests.get(server.url + "/slow", timeout=timeout).status_code

    started = time.monotonic()
    with pytest.raises(Exception) as info:
        get()
    took = time.monotonic() - started
    assert type(info.value).__module__.partition(".")[0] == client
    assert "after 2 attempts" in info.value.__notes__[-1]
    assert len(seen) == 2
    assert all(t is not None and 0 < t <= 0.05 for t in seen)
    assert took < 0.5  # not the server's 2 x 0.3 s
