"""
The policy object: frozen, validated at construction with errors that name
the field and the value, evolved into validated variants, and readable.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from typing import Any

import attrs
import pytest
import trio

import resilient
import resilient.testing
from resilient._core import _validate
from resilient._core._hints import default_retry_after


def is_teapot(exc: Exception) -> bool:
    """A predicate over exceptions, for the tests."""
    return "teapot" in str(exc)


def is_empty(result: object) -> bool:
    """A predicate over results, for the tests."""
    return not result


def test_defaults_follow_common_practice() -> None:
    """
    The defaults are the ones documented: 4 attempts, full jitter from 0.2 s
    capped at 5 s, a 30 s budget, no per-attempt timeout, retries on
    what `Transient` calls transient, server hints up to 60 s.
    """
    p = resilient.Policy()
    assert p.name == "default"
    assert p.attempts == 4
    assert p.backoff == resilient.FullJitter(base=0.2, cap=5.0)
    assert p.budget == 30.0
    assert p.timeout is None
    assert p.retry_on == resilient.Transient()
    assert p.retry_if_result is None
    assert p.retry_after is default_retry_after
    assert p.max_retry_after == 60.0
    assert p.before_sleep is None
    assert p.on_give_up is None


def test_policy_is_frozen() -> None:
    """A policy cannot be changed after construction."""
    p = resilient.Policy(name="payments")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.attempts = 10  # type: ignore[misc]
    assert p.attempts == 4


def test_policy_is_a_hashable_value() -> None:
    """Equal settings make equal policies with equal hashes."""
    a = resilient.Policy(name="db", attempts=2)
    b = resilient.Policy(name="db", attempts=2)
    assert a == b
    assert hash(a) == hash(b)
    assert a != resilient.Policy(name="db", attempts=3)


def test_positional_arguments_are_refused() -> None:
    """Every setting is keyword-only, so none can be passed by mistake."""
    with pytest.raises(TypeError):
        resilient.Policy("payments")  # type: ignore[call-arg]


# --- validation


ConfigError = resilient.ConfigError
ConfigTypeError = resilient.ConfigTypeError


BAD_VALUES: list[Any] = [
    ("name", "", ConfigError),
    ("name", "   ", ConfigError),
    ("name", 3, ConfigTypeError),
    ("name", None, ConfigTypeError),
    ("attempts", 0, ConfigError),
    ("attempts", -1, ConfigError),
    ("attempts", True, ConfigTypeError),
    ("attempts", False, ConfigTypeError),
    ("attempts", 2.0, ConfigTypeError),
    ("attempts", "3", ConfigTypeError),
    ("budget", 0, ConfigError),
    ("budget", 0.0, ConfigError),
    ("budget", -1.0, ConfigError),
    ("budget", math.nan, ConfigError),
    ("budget", math.inf, ConfigError),
    ("budget", -math.inf, ConfigError),
    ("budget", 10**400, ConfigError),
    ("budget", True, ConfigTypeError),
    ("budget", "30", ConfigTypeError),
    ("budget", dt.timedelta(0), ConfigError),
    ("timeout", 0.0, ConfigError),
    ("timeout", -0.5, ConfigError),
    ("timeout", math.nan, ConfigError),
    ("timeout", math.inf, ConfigError),
    ("timeout", False, ConfigTypeError),
    ("timeout", "2.0", ConfigTypeError),
    ("timeout", dt.timedelta(seconds=-1), ConfigError),
    ("max_retry_after", -1.0, ConfigError),
    ("max_retry_after", math.nan, ConfigError),
    ("max_retry_after", math.inf, ConfigError),
    ("max_retry_after", None, ConfigTypeError),
    ("max_retry_after", True, ConfigTypeError),
    ("max_retry_after", "60", ConfigTypeError),
    ("backoff", 1.0, ConfigTypeError),
    ("backoff", None, ConfigTypeError),
    pytest.param(
        "backoff",
        resilient.FullJitter,
        ConfigTypeError,
        id="backoff=FullJitter-class",
    ),
    ("retry_on", KeyboardInterrupt, ConfigError),
    ("retry_on", SystemExit, ConfigError),
    ("retry_on", GeneratorExit, ConfigError),
    ("retry_on", asyncio.CancelledError, ConfigError),
    ("retry_on", trio.Cancelled, ConfigError),
    ("retry_on", BaseException, ConfigError),
    ("retry_on", (ValueError, KeyboardInterrupt), ConfigError),
    ("retry_on", (ValueError, int), ConfigTypeError),
    ("retry_on", (ValueError, is_teapot), ConfigTypeError),
    ("retry_on", "ValueError", ConfigTypeError),
    ("retry_on", 3, ConfigTypeError),
    ("retry_on", None, ConfigTypeError),
    ("retry_if_result", 3, ConfigTypeError),
    ("retry_after", "Retry-After", ConfigTypeError),
    ("before_sleep", 1, ConfigTypeError),
    ("on_give_up", "log", ConfigTypeError),
]


@pytest.mark.parametrize(
    ("field", "value", "error"),
    BAD_VALUES,
    ids=lambda v: v.__name__ if isinstance(v, type) else repr(v)[:30],
)
def test_bad_values_are_refused(
    field: str, value: object, error: type[resilient.ConfigError]
) -> None:
    """
    A bad value raises at construction: `ConfigError` (a `ValueError`) for a
    value that makes no sense, `ConfigTypeError` (also a `TypeError`) for a
    wrong type; either way naming ``Policy.field`` and carrying the value.
    """
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(error) as info:
        resilient.Policy(**kwargs)
    exc = info.value
    assert type(exc) is error
    assert isinstance(exc, ValueError)
    assert isinstance(exc, TypeError) == (error is ConfigTypeError)
    assert exc.field == "Policy." + field
    assert str(exc).startswith(f"Policy.{field} ")
    # The message shows the refused value (for a tuple, the bad item).
    assert repr(exc.value) in str(exc)
    if not isinstance(value, tuple | int | dt.timedelta):
        assert exc.value is value


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_messages_suggest_none(value: float) -> None:
    """For settings where None means no limit, the message says so."""
    with pytest.raises(ConfigError, match=r"use None for no limit"):
        resilient.Policy(budget=value)


def test_bad_item_of_retry_on_is_named() -> None:
    """A bad member of a *retry_on* tuple is the value the error carries."""
    with pytest.raises(ConfigError) as info:
        resilient.Policy(retry_on=(ValueError, KeyboardInterrupt))
    assert info.value.value is KeyboardInterrupt
    assert "never retried" in str(info.value)


def test_unbounded_attempts_need_a_budget() -> None:
    """
    ``attempts=None`` (no limit) is allowed only with a budget; with neither
    the policy could retry for ever.
    """
    p = resilient.Policy(attempts=None, budget=10.0)
    assert p.attempts is None
    with pytest.raises(ConfigError) as info:
        resilient.Policy(attempts=None, budget=None)
    assert info.value.field == "Policy.attempts"
    assert info.value.value is None
    assert "Policy.budget" in str(info.value)
    # A budget of None with bounded attempts is fine.
    assert resilient.Policy(budget=None).budget is None


def test_durations_accept_timedelta_and_int() -> None:
    """Durations take `timedelta`s and ints and store float seconds."""
    p = resilient.Policy(
        budget=dt.timedelta(minutes=1),
        timeout=dt.timedelta(milliseconds=1500),
        max_retry_after=120,
    )
    assert p.budget == 60.0
    assert p.timeout == 1.5
    assert p.max_retry_after == 120.0
    assert type(p.max_retry_after) is float
    assert resilient.Policy(max_retry_after=0.0).max_retry_after == 0.0


def test_retry_on_takes_a_single_class_a_list_or_a_predicate() -> None:
    """
    *retry_on* takes one exception class (kept as a tuple of one), a tuple
    or list of classes, or a predicate over the exception.
    """
    assert resilient.Policy(retry_on=ValueError).retry_on == (ValueError,)
    listed = resilient.Policy(retry_on=[KeyError, OSError])
    assert listed.retry_on == (KeyError, OSError)
    assert resilient.Policy(retry_on=is_teapot).retry_on is is_teapot


def test_retry_on_accepts_exception_subclasses() -> None:
    """Any `Exception` subclass is allowed, user-defined ones included."""

    class Flaky(RuntimeError):
        pass

    p = resilient.Policy(retry_on=(Flaky, asyncio.TimeoutError, OSError))
    assert p.retry_on == (Flaky, asyncio.TimeoutError, OSError)


def test_callables_are_accepted() -> None:
    """Hooks and predicates accept any callable, async hooks included."""

    async def ahook(event: resilient.RetryEvent) -> None:
        pass

    p = resilient.Policy(
        retry_if_result=lambda r: r is None,
        retry_after=None,
        before_sleep=print,
        on_give_up=ahook,
    )
    assert p.retry_after is None
    assert p.has_async_hooks
    assert not resilient.Policy(before_sleep=print).has_async_hooks
    assert not resilient.Policy().has_async_hooks


def test_backoff_takes_any_strategy() -> None:
    """*backoff* takes any object with a ``delay`` method."""

    @attrs.frozen
    class Fixed:
        def delay(self, retry: int, previous: float, rng: Any) -> float:
            return 1.0

    assert resilient.Policy(backoff=Fixed()).backoff == Fixed()
    assert resilient.Policy(
        backoff=resilient.Constant(seconds=0)
    ).backoff == resilient.Constant(seconds=0)


def test_config_errors_are_value_errors_and_type_errors() -> None:
    """
    `ConfigError` is a `ValueError`; `ConfigTypeError` is a `ConfigError`
    and a `TypeError`; both carry ``field`` and ``value``.
    """
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, resilient.ResilientError)
    assert issubclass(ConfigTypeError, ConfigError)
    assert issubclass(ConfigTypeError, TypeError)
    err = ConfigTypeError("Policy.attempts", True, "must be an int")
    assert (err.field, err.value) == ("Policy.attempts", True)
    assert str(err) == "Policy.attempts must be an int, got True"


# --- evolve


def test_evolve_returns_a_validated_variant() -> None:
    """`evolve` returns a new policy with the changes; the old one stays."""
    base = resilient.Policy(name="payments", attempts=4)
    variant = base.evolve(attempts=2, budget=dt.timedelta(seconds=5))
    assert variant is not base
    assert (variant.name, variant.attempts, variant.budget) == (
        "payments",
        2,
        5.0,
    )
    assert (base.attempts, base.budget) == (4, 30.0)
    assert base.evolve() == base


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attempts": 0}, "Policy.attempts"),
        ({"attempts": True}, "Policy.attempts"),
        ({"budget": -1.0}, "Policy.budget"),
        ({"retry_on": KeyboardInterrupt}, "Policy.retry_on"),
        ({"attempts": None, "budget": None}, "Policy.attempts"),
        ({"name": ""}, "Policy.name"),
    ],
)
def test_evolve_validates_again(changes: dict[str, Any], field: str) -> None:
    """A variant is validated like a new policy: bad changes raise."""
    base = resilient.Policy(name="payments")
    with pytest.raises(ConfigError) as info:
        base.evolve(**changes)
    assert info.value.field == field


def test_evolve_checks_cross_field_rules() -> None:
    """Dropping the budget of an unbounded policy is refused."""
    unbounded = resilient.Policy(attempts=None, budget=5.0)
    with pytest.raises(ConfigError, match=r"Policy\.budget is set"):
        unbounded.evolve(budget=None)


# --- repr


def test_repr_of_defaults_shows_the_name_only() -> None:
    """A default policy's repr shows only its name."""
    assert repr(resilient.Policy()) == "Policy(name='default')"


def test_repr_shows_non_default_fields_only() -> None:
    """The repr lists the name and the fields that differ from defaults."""
    p = resilient.Policy(
        name="payments",
        attempts=2,
        backoff=resilient.EqualJitter(base=0.5),
        budget=None,
        retry_on=ValueError,
    )
    assert repr(p) == (
        "Policy(name='payments', attempts=2, "
        "backoff=EqualJitter(base=0.5, cap=5.0), budget=None, "
        "retry_on=(ValueError,))"
    )


def test_repr_names_callables_and_tuples() -> None:
    """Predicates and hooks appear by name; tuples of classes by names."""
    p = resilient.Policy(
        name="x",
        retry_on=(KeyError, OSError),
        retry_if_result=is_empty,
        retry_after=None,
    )
    assert repr(p) == (
        "Policy(name='x', retry_on=(KeyError, OSError), "
        "retry_if_result=is_empty, retry_after=None)"
    )
    assert "retry_on=is_teapot" in repr(resilient.Policy(retry_on=is_teapot))


def test_repr_of_a_default_value_given_explicitly() -> None:
    """Passing a default explicitly does not clutter the repr."""
    p = resilient.Policy(name="db", attempts=4, budget=30)
    assert repr(p) == "Policy(name='db')"


# --- a policy is a decorator


def test_policy_decorates(clock: resilient.testing.FakeClock) -> None:
    """``@policy`` retries the function as the policy says."""
    calls: list[int] = []
    policy = resilient.Policy(
        name="deco", attempts=3, backoff=resilient.Constant(seconds=1.0)
    )

    @policy
    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError
        return x * 2

    assert flaky(21) == 42
    assert calls == [21, 21, 21]
    assert clock.sleeps == [1.0, 1.0]


# --- the shared validators, on a class of their own


@attrs.frozen(kw_only=True)
class Knobs:
    """Exercises the validators no Policy field uses yet."""

    count: int = attrs.field(default=1, validator=_validate.positive_int)
    share: float = attrs.field(
        default=0.5,
        converter=_validate.to_seconds,
        validator=_validate.probability,
    )
    limit: int | None = attrs.field(
        default=None, validator=_validate.positive_int_or_none
    )
    wait: float = attrs.field(
        default=1.0,
        converter=_validate.to_seconds,
        validator=_validate.positive,
    )


@pytest.mark.parametrize(
    ("kwargs", "field", "error"),
    [
        ({"count": 0}, "Knobs.count", ConfigError),
        ({"count": None}, "Knobs.count", ConfigTypeError),
        ({"count": True}, "Knobs.count", ConfigTypeError),
        ({"share": 1.5}, "Knobs.share", ConfigError),
        ({"share": -0.1}, "Knobs.share", ConfigError),
        ({"share": math.nan}, "Knobs.share", ConfigError),
        ({"share": "half"}, "Knobs.share", ConfigTypeError),
        ({"limit": 0}, "Knobs.limit", ConfigError),
        ({"limit": 1.0}, "Knobs.limit", ConfigTypeError),
        ({"wait": 0.0}, "Knobs.wait", ConfigError),
        ({"wait": None}, "Knobs.wait", ConfigTypeError),
        ({"wait": -(10**400)}, "Knobs.wait", ConfigError),
    ],
)
def test_shared_validators_refuse(
    kwargs: dict[str, Any], field: str, error: type[ConfigError]
) -> None:
    """Each shared validator refuses its bad values, naming the field."""
    with pytest.raises(error) as info:
        Knobs(**kwargs)
    assert type(info.value) is error
    assert info.value.field == field


def test_shared_validators_accept() -> None:
    """The edges of each shared validator's range are accepted."""
    assert Knobs(share=0, count=10**30, limit=1).share == 0.0
    assert Knobs(share=1).share == 1.0
    assert Knobs(limit=None, wait=dt.timedelta(microseconds=1)).wait == 1e-6


@pytest.mark.parametrize("empty", [(), []])
def test_an_empty_retry_on_is_refused(empty: Any) -> None:
    """
    ``retry_on=()`` (or ``[]``) is refused with a `ConfigError` naming the
    field and saying why: it used to be taken silently as "retry no
    exception". A predicate says that on purpose, and is kept.
    """
    with pytest.raises(resilient.ConfigError) as info:
        resilient.Policy(retry_on=empty)
    assert info.value.field == "Policy.retry_on"
    assert "no exception would ever be retried" in str(info.value)
    with pytest.raises(resilient.ConfigError):
        resilient.Policy().evolve(retry_on=())

    def never(exc: Exception) -> bool:
        return False

    assert resilient.Policy(retry_on=never).retry_on is never


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"timeout": 5, "budget": 2},
            "Policy.timeout must be <= Policy.budget (2.0)",
        ),
        ({"timeout": 60}, "Policy.timeout must be <= Policy.budget (30.0)"),
    ],
)
def test_a_timeout_longer_than_the_budget_is_refused(
    kwargs: dict[str, Any], message: str
) -> None:
    """
    An attempt timeout above the whole call's budget (the default budget
    included) raises a `ConfigError` naming both fields and values; it
    used to be accepted, and the timeout could never fire.
    """
    with pytest.raises(resilient.ConfigError) as info:
        resilient.Policy(**kwargs)
    assert info.value.field == "Policy.timeout"
    assert message in str(info.value)
    assert str(info.value).endswith(f"got {float(kwargs['timeout'])!r}")
    with pytest.raises(resilient.ConfigError, match=r"Policy\.budget"):
        resilient.Policy(timeout=5).evolve(budget=2)
    assert resilient.Policy(timeout=2, budget=2).timeout == 2.0
    assert resilient.Policy(timeout=60, budget=None, attempts=3).timeout == 60
