"""
What a breaker counts as a failure by default (issue 7, items 3 and 7):
the dependency failing (transport errors, timeouts, 429 and 5xx), not a
client error such as a 404; an exception group when every leaf is a
failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
import requests

import resilient
from resilient import BreakerConfig, CircuitOpen, CountWindow
from tests.breakers import CLOSED, OPEN, fail_with, through
from tests.conftest import Driver


def httpx_status_error(status: int) -> httpx.HTTPStatusError:
    """The error `raise_for_status` raises for a real httpx response."""
    request = httpx.Request("GET", "http://users.invalid/users/1")
    response = httpx.Response(status, request=request)
    with pytest.raises(httpx.HTTPStatusError) as info:
        response.raise_for_status()
    return info.value


def requests_status_error(status: int) -> requests.HTTPError:
    """The error `raise_for_status` raises for a real requests response."""
    response = requests.Response()
    response.status_code = status
    response.url = "http://users.invalid/users/1"
    response.reason = "whatever"
    with pytest.raises(requests.HTTPError) as info:
        response.raise_for_status()
    return info.value


CLIENTS = pytest.mark.parametrize(
    "make",
    [httpx_status_error, requests_status_error],
    ids=["httpx", "requests"],
)


def _five(driver: Driver, error: BaseException) -> resilient.CircuitBreaker:
    """Five calls that raise *error* through ``with breaker("users")``."""
    users = resilient.breaker("users")
    for _ in range(5):
        with pytest.raises(type(error)):
            through(driver, users, fail_with(error), "context")
    return users


@CLIENTS
def test_five_404s_leave_the_default_breaker_closed(
    driver: Driver, clock: Any, make: Callable[[int], Exception]
) -> None:
    """Five 404s through ``with breaker("users")`` are the dependency
    answering: the breaker stays closed and the next call runs."""
    users = _five(driver, make(404))
    assert users.state is CLOSED
    assert users.statistics().failures == 0
    assert through(driver, users, lambda: "ran", "context") == "ran"


@CLIENTS
@pytest.mark.parametrize("status", [503, 429, 500])
def test_five_5xx_or_429_open_the_default_breaker(
    driver: Driver,
    clock: Any,
    make: Callable[[int], Exception],
    status: int,
) -> None:
    """Five 503s (or 429s, or 500s) open the default breaker."""
    users = _five(driver, make(status))
    assert users.state is OPEN
    with pytest.raises(CircuitOpen):
        through(driver, users, lambda: "ran", "context")


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError(),
        httpx.ReadTimeout("slow"),
        httpx.ConnectError("refused"),
        requests.ConnectionError("reset"),
        resilient.TimedOut(0.0, seconds=1.0),
    ],
    ids=["reset", "httpx-timeout", "httpx-connect", "requests", "timed-out"],
)
def test_transport_errors_and_timeouts_open_the_default_breaker(
    driver: Driver, clock: Any, error: Exception
) -> None:
    """Transport errors and timeouts (resilient's own TimedOut included)
    are dependency failures."""
    assert _five(driver, error).state is OPEN


def test_failure_on_overrides_the_default(driver: Driver, clock: Any) -> None:
    """An explicit failure_on replaces the classifier: counting every
    exception opens on five 404s again."""
    resilient.breaker("users", BreakerConfig(failure_on=Exception))
    assert _five(driver, httpx_status_error(404)).state is OPEN


def test_default_failure_on_is_the_classifier() -> None:
    """The default failure_on is DependencyFailure(): a bug (ValueError)
    counts as the dependency answering."""
    config = BreakerConfig()
    assert config.failure_on == resilient.DependencyFailure()
    assert config.verdict(ValueError()) == "success"
    assert config.verdict(httpx_status_error(502)) == "failure"


# Exception groups (item 7): a failure when every leaf is one.


def _group(*leaves: Exception) -> ExceptionGroup[Exception]:
    """A group with a nested group, as task groups make them."""
    return ExceptionGroup(
        "tasks", [leaves[0], ExceptionGroup("inner", [*leaves[1:]])]
    )


_FORMS: list[Any] = [
    (),
    (ConnectionError, TimeoutError),
    lambda exc: isinstance(exc, ConnectionError | TimeoutError),
]
_FORM_IDS = ["default", "classes", "predicate"]


@pytest.mark.parametrize("failure_on", _FORMS, ids=_FORM_IDS)
def test_group_of_failures_is_a_failure(failure_on: Any) -> None:
    """A (nested) group whose every leaf is a failure is one failure."""
    changes = {"failure_on": failure_on} if failure_on != () else {}
    config = BreakerConfig(**changes)
    group = _group(ConnectionResetError(), TimeoutError(), ConnectionError())
    assert config.verdict(group) == "failure"


@pytest.mark.parametrize("failure_on", _FORMS, ids=_FORM_IDS)
def test_group_with_one_answer_is_a_success(failure_on: Any) -> None:
    """One leaf that is not a failure (a bug, a 404) makes the group the
    dependency answering."""
    changes = {"failure_on": failure_on} if failure_on != () else {}
    config = BreakerConfig(**changes)
    group = _group(ConnectionResetError(), ValueError(), TimeoutError())
    assert config.verdict(group) == "success"


def test_group_leaves_follow_ignore_on() -> None:
    """An ignored leaf is not a failure; a group of ignored leaves is
    ignored, and ignore_on naming the group itself wins."""
    config = BreakerConfig(ignore_on=KeyError)
    assert config.verdict(_group(KeyError(), ConnectionError())) == "success"
    assert config.verdict(_group(KeyError(), KeyError())) == "ignore"
    named = BreakerConfig(ignore_on=ExceptionGroup)
    assert named.verdict(_group(ConnectionError(), TimeoutError())) == "ignore"


def test_group_named_by_failure_on_is_a_failure() -> None:
    """failure_on that names ExceptionGroup counts any group."""
    config = BreakerConfig(failure_on=ExceptionGroup)
    assert config.verdict(_group(ValueError(), KeyError())) == "failure"


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_task_group_errors_open_the_breaker(kind: str, clock: Any) -> None:
    """Errors inside an anyio task group (an ExceptionGroup on both
    backends) count: five of them open the default breaker, while five
    groups holding a bug leave it closed."""

    async def reset() -> None:
        raise ConnectionResetError

    async def bug() -> None:
        raise ValueError

    def through_group(name: str, *tasks: Any) -> resilient.CircuitBreaker:
        cb = resilient.breaker(name, BreakerConfig(window=CountWindow(5)))

        async def main() -> None:
            for _ in range(5):
                with pytest.raises(ExceptionGroup):
                    async with cb, anyio.create_task_group() as tg:
                        for task in tasks:
                            tg.start_soon(task)

        anyio.run(main, backend=kind)
        return cb

    assert through_group("tasks-down", reset, reset).state is OPEN
    assert through_group("tasks-bug", reset, bug).state is CLOSED
