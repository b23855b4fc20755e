"""Exception groups are retried when every leaf is retryable (issue 7,
item 7), whatever the form of retry_on."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import resilient
from resilient import Constant, Policy


if TYPE_CHECKING:
    from tests.conftest import Driver


class ServerError(Exception):
    """A user's own transient error."""


_FORMS: list[Any] = [
    (ServerError, ConnectionError),
    lambda exc: isinstance(exc, ServerError | ConnectionError),
    resilient.Transient(also=(ServerError,)),
]
_IDS = ["classes", "predicate", "transient"]


def _group(*leaves: Exception) -> ExceptionGroup[Exception]:
    """A group with one nested group, as task groups make them."""
    return ExceptionGroup(
        "tasks", [leaves[0], ExceptionGroup("inner", [*leaves[1:]])]
    )


def _calls(driver: Driver, policy: Policy, errors: list[Exception]) -> int:
    calls: list[int] = []

    def body() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    with contextlib.suppress(Exception):
        driver.call(policy, body)
    return len(calls)


@pytest.mark.parametrize("retry_on", _FORMS, ids=_IDS)
def test_group_of_retryable_leaves_is_retried(
    driver: Driver, clock: Any, retry_on: Any
) -> None:
    """A (nested) group whose every leaf is retryable is retried."""
    policy = Policy(attempts=3, backoff=Constant(0), retry_on=retry_on)
    group = _group(ServerError(), ConnectionError(), ServerError())
    assert _calls(driver, policy, [group]) == 2


@pytest.mark.parametrize("retry_on", _FORMS, ids=_IDS)
def test_group_with_one_final_leaf_is_not_retried(
    driver: Driver, clock: Any, retry_on: Any
) -> None:
    """One leaf that is not retryable makes the whole group final."""
    policy = Policy(attempts=3, backoff=Constant(0), retry_on=retry_on)
    group = _group(ServerError(), ValueError(), ConnectionError())
    assert _calls(driver, policy, [group]) == 1


def test_group_listed_itself_is_retried(driver: Driver, clock: Any) -> None:
    """retry_on that names ExceptionGroup (or accepts the group) retries
    it whatever its leaves."""
    policy = Policy(attempts=3, backoff=Constant(0), retry_on=ExceptionGroup)
    assert _calls(driver, policy, [_group(ValueError(), KeyError())]) == 2


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
def test_task_group_error_is_retried(kind: str) -> None:
    """An error inside an anyio task group (an ExceptionGroup on both
    backends) is retried by the default policy."""
    calls: list[int] = []

    async def fails() -> None:
        if len(calls) < 3:
            raise ConnectionResetError

    @Policy(attempts=3, backoff=Constant(0))
    async def body() -> str:
        calls.append(1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(fails)
            tg.start_soon(fails)
        return "ok"

    assert anyio.run(body, backend=kind) == "ok"
    assert len(calls) == 3
