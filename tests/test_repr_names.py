"""
Reprs that show a user's name cut it to 80 characters (one shared
helper), whatever its length: a 1 MB name stays out of logs and tracebacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import resilient


HUGE = "n" * (1 << 20)
NAME_LIMIT = 80

MAKERS: dict[str, Callable[[str], Any]] = {
    "singleflight": lambda name: resilient.SingleFlight(name=name),
    "policy": lambda name: resilient.Policy(name=name),
    "breaker": resilient.breaker,
    "bulkhead": resilient.bulkhead,
    "retry_budget": resilient.retry_budget,
    "lock": resilient.lock,
    "timeout": lambda name: resilient.timeout(1.0, name=name),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_huge_name_is_cut_in_the_repr(kind: str) -> None:
    """
    The repr of a singleflight group (which kept a 1 MB name whole),
    breaker, bulkhead, retry budget, lock, policy or timeout scope named
    with 1 MB shows the first 80 characters and ``...``; the object keeps
    its whole name.
    """
    made = MAKERS[kind](HUGE)
    text = repr(made)
    assert len(text) < 200
    assert repr("n" * NAME_LIMIT + "...") in text
    assert "n" * (NAME_LIMIT + 1) not in text
    if kind in {"singleflight", "policy", "breaker", "bulkhead"}:
        assert made.name == HUGE


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_short_name_is_shown_whole(kind: str) -> None:
    """A name of up to 80 characters is shown as it is, quoted."""
    name = "x" * NAME_LIMIT
    assert repr(name) in repr(MAKERS[kind](name))


def test_the_helper_marks_the_cut() -> None:
    """`shown` cuts at 80 characters and says so; shorter names pass."""
    from resilient._core._shown import shown

    assert shown("abc") == "abc"
    assert shown("a" * 81) == "a" * 80 + "..."
