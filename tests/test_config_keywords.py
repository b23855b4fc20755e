"""
A misspelt setting is named, with the setting it is closest to, by every
configuration class's constructor and ``evolve``.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import resilient
from resilient import simulation as sim


CASES: list[tuple[Any, str, str]] = [
    (resilient.Policy, "attemps", "attempts"),
    (resilient.Policy, "retry_of", "retry_on"),
    (resilient.BreakerConfig, "failure_rat", "failure_rate"),
    (resilient.BulkheadConfig, "max_concurent", "max_concurrent"),
    (resilient.RetryBudgetConfig, "min_per_secnd", "min_per_second"),
    (resilient.LockConfig, "ttll", "ttl"),
    (resilient.CountWindow, "sise", "size"),
    (resilient.TimeWindow, "second", "seconds"),
    (resilient.FullJitter, "bse", "base"),
    (resilient.EqualJitter, "capp", "cap"),
    (resilient.DecorrelatedJitter, "bas", "base"),
    (resilient.Exponential, "cp", "cap"),
    (resilient.Constant, "second", "seconds"),
    (resilient.Transient, "statuss", "statuses"),
    (resilient.DependencyFailure, "neverr", "never"),
    (sim.SimulationConfig, "clientz", "clients"),
]


def _make(cls: Any, **kwargs: Any) -> Any:
    return cls(**kwargs)


@pytest.mark.parametrize(("cls", "typo", "meant"), CASES)
def test_an_unknown_keyword_names_the_field_and_the_close_one(
    cls: Any, typo: str, meant: str
) -> None:
    """
    ``Policy(attemps=3)`` raises a `ConfigTypeError` (still a `TypeError`)
    whose field is ``Policy.attemps`` and whose message suggests
    ``attempts``; it used to name ``Policy.__init__`` only.
    """
    with pytest.raises(resilient.ConfigTypeError) as info:
        _make(cls, **{typo: 3})
    error = info.value
    assert isinstance(error, TypeError)
    assert error.field == f"{cls.__name__}.{typo}"
    assert error.value == 3
    assert f"did you mean {meant!r}?" in str(error)
    assert "__init__" not in str(error)


@pytest.mark.parametrize(
    "config",
    [
        resilient.Policy(name="payments"),
        resilient.BreakerConfig(),
    ],
)
def test_evolve_names_the_misspelt_field(config: Any) -> None:
    """``evolve`` with a misspelt change names it, like the constructor."""
    typo = "attemps" if isinstance(config, resilient.Policy) else "windw"
    with pytest.raises(resilient.ConfigTypeError) as info:
        config.evolve(**{typo: 3})
    assert info.value.field == f"{type(config).__name__}.{typo}"
    assert "did you mean" in str(info.value)


def test_a_keyword_close_to_nothing_lists_the_settings() -> None:
    """With no setting close to it, the error lists them all."""
    with pytest.raises(resilient.ConfigTypeError) as info:
        resilient.BulkheadConfig(zzz=1)
    assert str(info.value) == (
        "BulkheadConfig.zzz is not a setting (its settings: max_concurrent, "
        "max_wait, max_waiting), got 1"
    )


def test_the_other_type_errors_are_unchanged() -> None:
    """
    A wrong type of a known setting, or too many positional arguments,
    keeps its own error; the signature stays the class's.
    """
    with pytest.raises(resilient.ConfigTypeError) as info:
        resilient.Policy(attempts="3")  # type: ignore[arg-type]
    assert info.value.field == "Policy.attempts"
    with pytest.raises(TypeError, match="positional"):
        resilient.Policy(3)  # type: ignore[misc]
    assert list(inspect.signature(resilient.FullJitter).parameters) == [
        "base",
        "cap",
    ]
