"""
A gap the audit of issue 7 found in the fallback stage: *fallback_on*
judges an exception group (an error inside a task group) by the rule
*retry_on* and the breaker use, the group itself or every leaf.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

import resilient


def _policy(**kwargs: object) -> resilient.Policy:
    return resilient.Policy(
        name=f"audit-fb-{uuid.uuid4().hex[:8]}",
        attempts=1,
        fallback=lambda exc: f"fallback for {type(exc).__name__}",
        **kwargs,  # type: ignore[arg-type]
    )


def test_group_of_handled_errors_falls_back(anyio_backend: str) -> None:
    """``fallback_on=(ConnectionError,)``: a task group whose every error is
    a ConnectionError (nested groups included) falls back (before the
    audit the group was raised: classes were matched against the group
    alone)."""
    policy = _policy(fallback_on=(ConnectionError,))

    @policy
    async def fan_out() -> str:
        async def down() -> None:
            raise ConnectionResetError("reset")

        async with anyio.create_task_group() as tg:
            tg.start_soon(down)
            tg.start_soon(down)
        return "ok"

    assert anyio.run(fan_out, backend=anyio_backend) == (
        "fallback for ExceptionGroup"
    )


@pytest.mark.parametrize(
    "fallback_on",
    [(ConnectionError,), lambda exc: isinstance(exc, ConnectionError)],
)
def test_group_rule_with_classes_and_predicates(
    fallback_on: object,
) -> None:
    """Classes or a predicate: a group falls back when every leaf is
    handled, and is raised when one leaf is not."""
    policy = _policy(fallback_on=fallback_on)

    @policy
    def all_handled() -> str:
        raise ExceptionGroup(
            "g",
            [ConnectionError("a"), ExceptionGroup("h", [BrokenPipeError()])],
        )

    @policy
    def one_not() -> str:
        raise ExceptionGroup("g", [ConnectionError("a"), KeyError("k")])

    assert all_handled() == "fallback for ExceptionGroup"
    with pytest.raises(ExceptionGroup):
        one_not()


def test_predicate_accepting_the_group_itself() -> None:
    """A predicate that accepts the group as a whole is enough, as with
    *retry_on*."""
    policy = _policy(fallback_on=lambda exc: isinstance(exc, ExceptionGroup))

    @policy
    def mixed() -> str:
        raise ExceptionGroup("g", [ConnectionError("a"), KeyError("k")])

    assert mixed() == "fallback for ExceptionGroup"


def test_default_fallback_on_takes_any_group() -> None:
    """The default (every Exception) takes a group too, as before."""
    policy = _policy()

    @policy
    def mixed() -> str:
        raise ExceptionGroup("g", [KeyError("k")])

    assert mixed() == "fallback for ExceptionGroup"
