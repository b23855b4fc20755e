"""The policy's own attempt timeout stays retryable whatever retry_on says
(issue 7, item 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

import resilient
from resilient.testing import FakeClock, use_clock


if TYPE_CHECKING:
    from collections.abc import Callable


_RETRY_ON: list[object] = [(ValueError,), lambda exc: False]


def _policy(retry_on: object, **kw: object) -> resilient.Policy:
    return resilient.Policy(
        attempts=3,
        backoff=resilient.Constant(0),
        retry_on=retry_on,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("retry_on", _RETRY_ON, ids=["classes", "predicate"])
def test_sync_own_timeout_is_retried(retry_on: object) -> None:
    """A sync attempt that overran the policy's timeout (seen at a
    checkpoint) is retried although retry_on names neither timeouts nor
    anything at all."""
    calls: list[int] = []
    clock = FakeClock()

    @resilient.retry(_policy(retry_on, timeout=1.0))
    def body() -> str:
        calls.append(1)
        if len(calls) < 3:
            clock.advance(2.0)
            resilient.checkpoint()
        return "ok"

    with use_clock(clock):
        assert body() == "ok"
    assert len(calls) == 3


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
@pytest.mark.parametrize("retry_on", _RETRY_ON, ids=["classes", "predicate"])
def test_async_own_timeout_is_retried(kind: str, retry_on: object) -> None:
    """An async attempt cancelled at the policy's timeout is retried
    although retry_on names neither timeouts nor anything at all."""
    calls: list[int] = []

    @resilient.retry(_policy(retry_on, timeout=0.005))
    async def body() -> str:
        calls.append(1)
        if len(calls) < 3:
            await anyio.sleep(5)
        return "ok"

    assert anyio.run(body, backend=kind) == "ok"
    assert len(calls) == 3


@pytest.mark.parametrize("retry_on", _RETRY_ON, ids=["classes", "predicate"])
def test_user_timeout_error_and_budget_still_follow_retry_on(
    retry_on: object,
) -> None:
    """Only the policy's own timeout is exempt: a TimeoutError of the
    user's, or the call's budget running out, is judged by retry_on."""
    clock = FakeClock()
    calls: list[int] = []

    def raiser(make: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            calls.append(1)
            make()

        return body

    def user_timeout() -> None:
        raise TimeoutError

    def budget_out() -> None:
        clock.advance(2.0)
        resilient.checkpoint()

    with use_clock(clock):
        with pytest.raises(TimeoutError):
            resilient.retry(_policy(retry_on, timeout=1.0))(
                raiser(user_timeout)
            )()
        assert len(calls) == 1
        with pytest.raises(resilient.DeadlineExceeded):
            resilient.retry(_policy(retry_on, budget=1.0))(
                raiser(budget_out)
            )()
        assert len(calls) == 2
