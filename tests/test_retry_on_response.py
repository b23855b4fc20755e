"""Retrying on a returned response (issue 7, item 2, in part):
`retry_if_status` and the response's own Retry-After."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

import resilient
from resilient import Constant, Policy
from resilient.testing import FakeClock, use_clock
from tests.http_server import Server


if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Driver


def _get(driver: Driver, url: str) -> Callable[[], Any]:
    """GET *url* with httpx in *driver*'s colour, returning the response
    (no raise_for_status)."""
    if not driver.is_async:

        def get() -> httpx.Response:
            with httpx.Client(timeout=10) as c:
                return c.get(url)

        return get

    async def aget() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as c:
            return await c.get(url)

    return aget


def _policy(**kw: Any) -> Policy:
    return Policy(
        name="responses",
        attempts=3,
        backoff=Constant(0.5),
        retry_if_result=resilient.retry_if_status(),
        **kw,
    )


def test_503_response_waits_its_retry_after(
    server: Server, driver: Driver
) -> None:
    """A returned 503 with ``Retry-After: 7`` is retried after 7 virtual
    seconds (the hint, not the 0.5 s backoff)."""
    get = _get(driver, server.url + "/script/r/503,200")
    clock = FakeClock()
    with use_clock(clock):
        response = driver.run(resilient.retry(_policy())(get))
    assert response.status_code == 200
    assert clock.sleeps == [7.0]


def test_last_response_returned_when_attempts_run_out(
    server: Server, driver: Driver
) -> None:
    """When the attempts run out the last response is returned; a 502
    (no hint) waits the backoff."""
    get = _get(driver, server.url + "/status/502")
    clock = FakeClock()
    with use_clock(clock):
        response = driver.run(resilient.retry(_policy())(get))
    assert response.status_code == 502
    assert clock.sleeps == [0.5, 0.5]
    assert len(server.seen) == 3


def test_non_response_results_use_the_backoff(clock: Any) -> None:
    """A result that is not response-like is never read for a hint (a
    custom retry_after reader is written for exceptions)."""
    results = iter([None, None, 1])
    policy = Policy(
        attempts=3,
        backoff=Constant(0.25),
        retry_if_result=lambda r: r is None,
    )
    assert policy(lambda: next(results))() == 1
    assert clock.sleeps == [0.25, 0.25]


def test_retry_if_status_predicate() -> None:
    """retry_if_status reads the status like http_status; bad codes are
    refused naming the argument."""
    check = resilient.retry_if_status({500, 503})
    assert check(httpx.Response(503))
    assert not check(httpx.Response(404))
    assert not check(None)
    assert check == resilient.retry_if_status([503, 500])
    assert hash(check) == hash(resilient.retry_if_status({500, 503}))
    assert repr(check) == "retry_if_status([500, 503])"
    assert resilient.retry_if_status()(httpx.Response(429))
    with pytest.raises(resilient.ConfigTypeError, match="retry_if_status"):
        resilient.retry_if_status(3)  # type: ignore[arg-type]
    with pytest.raises(resilient.ConfigTypeError, match="retry_if_status"):
        resilient.retry_if_status(["503"])  # type: ignore[list-item]
    with pytest.raises(resilient.ConfigError, match="retry_if_status"):
        resilient.retry_if_status({700})


def _send(
    driver: Driver,
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
) -> Callable[[], Any]:
    """Send *method* to *url* with httpx in *driver*'s colour, returning
    the response."""
    if not driver.is_async:

        def send() -> httpx.Response:
            with httpx.Client(timeout=10) as c:
                return c.request(method, url, headers=headers)

        return send

    async def send_async() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as c:
            return await c.request(method, url, headers=headers)

    return send_async


def test_last_result_raise_carries_the_last_response(
    server: Server, driver: Driver
) -> None:
    """With last_result="raise", running out of attempts on 502s raises
    GaveUpOnResult carrying the last response and the attempt count."""
    get = _get(driver, server.url + "/status/502")
    clock = FakeClock()
    with use_clock(clock), pytest.raises(resilient.GaveUpOnResult) as info:
        driver.run(resilient.retry(_policy(last_result="raise"))(get))
    err = info.value
    assert err.result.status_code == 502  # type: ignore[attr-defined]
    assert (err.attempts, err.reason, err.policy) == (
        3,
        "attempts",
        "responses",
    )
    assert "after 3 attempts (attempts)" in str(err)
    assert len(server.seen) == 3
    assert clock.sleeps == [0.5, 0.5]


def test_last_result_raise_in_the_block_form(driver: Driver) -> None:
    """The block form raises GaveUpOnResult out of the loop too."""
    with pytest.raises(resilient.GaveUpOnResult) as info:
        driver.block(
            _policy(last_result="raise", budget=None, max_retry_after=1),
            lambda attempt: attempt.set_result(httpx.Response(503)),
        )
    assert info.value.attempts == 3
    assert info.value.result.status_code == 503  # type: ignore[attr-defined]


def test_fallback_takes_over_from_a_raised_result(driver: Driver) -> None:
    """A policy's fallback receives GaveUpOnResult and its value is the
    call's."""
    seen: list[BaseException] = []

    def fallback(exc: Exception) -> str:
        seen.append(exc)
        return "cached"

    policy = Policy(
        attempts=2,
        backoff=Constant(0),
        retry_if_result=lambda r: r == "bad",
        last_result="raise",
        fallback=fallback,
    )
    assert driver.call(policy, lambda: "bad") == "cached"
    assert isinstance(seen[0], resilient.GaveUpOnResult)
    assert seen[0].result == "bad"


def test_last_result_raise_after_a_hook_that_ran_out_the_budget(
    driver: Driver, clock: Any
) -> None:
    """A before_sleep hook that runs past the budget ends the call: in
    raise mode with GaveUpOnResult (reason budget), not the value."""

    def hook(event: resilient.RetryEvent) -> None:
        clock.advance(100)

    policy = Policy(
        budget=10,
        backoff=Constant(1),
        retry_if_result=lambda r: r is None,
        last_result="raise",
        before_sleep=hook,
    )
    with pytest.raises(resilient.GaveUpOnResult) as info:
        driver.call(policy, lambda: None)
    assert (info.value.reason, info.value.attempts) == ("budget", 1)
    returned = policy.evolve(last_result="return")
    assert driver.call(returned, lambda: None) is None


def test_last_result_is_validated() -> None:
    """last_result must be "return" or "raise", refused naming the field."""
    assert Policy().last_result == "return"
    with pytest.raises(resilient.ConfigError, match=r"Policy\.last_result"):
        Policy(last_result="rise")  # type: ignore[arg-type]
    with pytest.raises(
        resilient.ConfigTypeError, match=r"Policy\.last_result"
    ):
        Policy(last_result=True)  # type: ignore[arg-type]
    assert "last_result='raise'" in repr(Policy(last_result="raise"))


@pytest.mark.parametrize("last_result", ["return", "raise"])
def test_post_response_without_a_key_is_not_repeated(
    server: Server, driver: Driver, last_result: str
) -> None:
    """A 502 answering a POST without an idempotency key is not retried
    (the server may have acted): returned, or raised in raise mode."""
    events: list[resilient.RetryEvent] = []
    post = _send(driver, "POST", server.url + "/status/502")
    policy = _policy(last_result=last_result, on_give_up=events.append)
    clock = FakeClock()
    with use_clock(clock):
        if last_result == "return":
            response = driver.run(resilient.retry(policy)(post))
            assert response.status_code == 502
        else:
            with pytest.raises(resilient.GaveUpOnResult) as info:
                driver.run(resilient.retry(policy)(post))
            assert (info.value.reason, info.value.attempts) == (
                "not_retryable",
                1,
            )
    assert len(server.seen) == 1
    assert clock.sleeps == []
    assert [e.reason for e in events] == ["not_retryable"]


def test_post_response_the_server_did_not_act_on_is_retried(
    server: Server, driver: Driver
) -> None:
    """A 503 (the server did not act) to a POST is retried without a key,
    after its Retry-After, as the error-side rule says."""
    post = _send(driver, "POST", server.url + "/script/p/503,200")
    clock = FakeClock()
    with use_clock(clock):
        response = driver.run(resilient.retry(_policy())(post))
    assert response.status_code == 200
    assert clock.sleeps == [7.0]


def test_post_response_with_a_key_is_retried(
    server: Server, driver: Driver
) -> None:
    """A POST carrying an Idempotency-Key is retried on a 502 response."""
    post = _send(
        driver,
        "POST",
        server.url + "/script/k/502,502,200",
        headers={"Idempotency-Key": "k1"},
    )
    clock = FakeClock()
    with use_clock(clock):
        response = driver.run(resilient.retry(_policy())(post))
    assert response.status_code == 200
    assert len(server.seen) == 3


def test_requests_post_response_is_not_repeated(server: Server) -> None:
    """requests' responses carry their request too: a POST's 502 is not
    retried, one to a GET is."""
    import requests

    policy = _policy()
    clock = FakeClock()
    with use_clock(clock):
        posted = policy.call(requests.post, server.url + "/status/502")
        assert posted.status_code == 502
        assert len(server.seen) == 1
        got = policy.call(requests.get, server.url + "/status/502")
        assert got.status_code == 502
    assert len(server.seen) == 4


def test_the_policys_transient_settings_rule_results() -> None:
    """A policy's Transient decides for responses too: idempotent_methods
    None retries a POST's 502; another retry_on keeps the default rule."""
    post = httpx.Request("POST", "https://api.example/charges")
    responses = [httpx.Response(502, request=post)] * 2 + [
        httpx.Response(200, request=post)
    ]
    anything = Policy(
        attempts=3,
        backoff=Constant(0),
        retry_if_result=resilient.retry_if_status(),
        retry_on=resilient.Transient(idempotent_methods=None),
    )
    it = iter(responses)
    assert anything.call(lambda: next(it)).status_code == 200
    classes = anything.evolve(retry_on=(ConnectionError,))
    it = iter(responses)
    assert classes.call(lambda: next(it)).status_code == 502


def test_a_request_that_cannot_be_read_is_not_repeated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A response whose request raises when read is logged and not
    retried (never repeated on a guess)."""

    class Odd:
        status_code = 503

        @property
        def request(self) -> object:
            raise ValueError("no request")

    calls: list[int] = []

    def body() -> Odd:
        calls.append(1)
        return Odd()

    policy = Policy(attempts=3, retry_if_result=resilient.retry_if_status())
    with caplog.at_level("ERROR", logger="resilient"):
        assert isinstance(policy.call(body), Odd)
    assert calls == [1]
    assert "reading the request" in caplog.text


def test_transient_may_repeat() -> None:
    """Transient.may_repeat applies the non-idempotent rule to responses
    and errors alike."""
    rule = resilient.Transient()
    post = httpx.Request("POST", "https://api.example/charges")
    keyed = httpx.Request(
        "POST", "https://api.example/charges", headers={"Idempotency-Key": "k"}
    )
    get = httpx.Request("GET", "https://api.example/charges")
    assert not rule.may_repeat(httpx.Response(502, request=post))
    assert rule.may_repeat(httpx.Response(429, request=post))
    assert rule.may_repeat(httpx.Response(502, request=keyed))
    assert rule.may_repeat(httpx.Response(502, request=get))
    assert rule.may_repeat(httpx.Response(502))  # no request to read
    assert not rule.may_repeat(httpx.ReadTimeout("slow", request=post))
    assert rule.may_repeat(httpx.ConnectError("refused", request=post))


def test_gave_up_on_result_pickles_an_unpicklable_result_as_its_repr() -> None:
    """GaveUpOnResult crosses a process boundary even when its result does
    not pickle (a live response, a lambda): the copy carries its repr."""
    import pickle

    err = resilient.GaveUpOnResult(lambda: 1, 2, "attempts", "p")
    copy = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes
    assert isinstance(copy.result, str)
    assert copy.result.startswith("<function")
    assert (copy.attempts, copy.reason, copy.policy) == (2, "attempts", "p")
    assert str(copy) == str(err)


def test_gave_up_on_result_message_survives_any_result() -> None:
    """The message shows a long result cut short, and a result whose repr
    raises by its type, never failing itself."""

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    long = resilient.GaveUpOnResult("x" * 500, 1, "attempts", "p")
    assert str(long).endswith("...")
    assert len(str(long)) < 300
    broken = resilient.GaveUpOnResult(Broken(), 1, "attempts", "p")
    assert str(broken).endswith(".Broken object>")
