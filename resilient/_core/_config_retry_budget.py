"""
The retry budget's configuration: plain, frozen, validated data.

The budget itself is in `resilient._retry_budget`.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Final, TypedDict, final

import attrs

from resilient._core._keywords import settings_checked
from resilient._core._validate import check_number, field_name, to_seconds
from resilient.exceptions import ConfigTypeError


MAX_RATIO: Final = 1000.0
"""Retries per call past which a ratio means nothing (no policy makes
that many attempts)."""

MAX_PER_SECOND: Final = 1e6
"""A floor of retries per second past which the budget never refuses: a
larger one only risks overflowing the window's arithmetic."""


def _ratio(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    _not_a_duration(inst, attribute, value)
    check_number(inst, attribute, value, maximum=MAX_RATIO)


def _per_second(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    _not_a_duration(inst, attribute, value)
    check_number(inst, attribute, value, maximum=MAX_PER_SECOND)


def _not_a_duration(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if isinstance(value, dt.timedelta):
        raise ConfigTypeError(
            field_name(inst, attribute),
            value,
            "must be a number, not a duration",
        )


def _window(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, minimum=0.1, maximum=3600.0)


def _to_float(value: object) -> object:
    """
    Accept ints for counts and ratios; an int too large for a float becomes
    an infinity, which the validator refuses as not finite.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


@final
@settings_checked
@attrs.frozen(kw_only=True)
class RetryBudgetConfig:
    """
    How many retries one dependency may receive, as a share of its calls.

    Over a sliding *window*, retries are allowed while::

        retries <= ratio * calls + min_per_second * window

    where *calls* counts logical calls (first attempts) and *retries* the
    retries already allowed, both within the window. The second term is a
    floor for low traffic, so that a lone caller can still retry.
    This is the model of Finagle's ``RetryBudget`` and tower's
    ``TpsBudget``.

    Args:
        ratio: Retries allowed per call; 0.2 lets 1 call in 5 retry once
            (or 1 in 10 retry twice). 0 leaves only the floor. At most
            1000; a number, never a `datetime.timedelta`.
        min_per_second: The floor, in retries per second, that is allowed
            whatever the traffic; 0 for no floor, at most 1,000,000.
        window: Seconds a call or a retry is remembered, from 0.1 to 3600.

    Defaults are Finagle's: 20 % of calls on top of 10 retries per second,
    over 10 s. In an outage, load on the dependency is then at most about
    1.2 times the normal traffic plus 10 requests per second, instead of
    the *attempts*-fold storm that unbudgeted retries cause.

    .. versionadded:: 26.11.0
    """

    ratio: float = attrs.field(
        default=0.2, converter=_to_float, validator=_ratio
    )
    min_per_second: float = attrs.field(
        default=10.0, converter=_to_float, validator=_per_second
    )
    window: float = attrs.field(
        default=10.0, converter=to_seconds, validator=_window
    )


class RetryBudgetKnobs(TypedDict, total=False):
    """The keyword arguments `RetryBudgetConfig` takes, typed."""

    ratio: float
    min_per_second: float
    window: float | dt.timedelta
