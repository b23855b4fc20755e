"""
The bulkhead's configuration: plain, frozen, validated data.

The bulkhead itself (the slot machine and its shells) is in
`resilient._bulkhead`; this module holds only what a `Policy` carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, final

import attrs

from resilient._core._keywords import settings_checked
from resilient._core._validate import (
    check_int,
    check_number,
    positive_int,
    to_seconds,
)


if TYPE_CHECKING:
    import datetime as dt


def _non_negative_int(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_int(inst, attribute, value, minimum=0)


def _seconds_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, allow_none=True)


@final
@settings_checked
@attrs.frozen(kw_only=True)
class BulkheadConfig:
    """
    How many calls to one dependency may run at once, and how long the
    others may wait for a turn.

    Threads and async tasks share the same slots: a bulkhead of 10 admits
    10 calls in all, whichever kind they are.

    Frozen and validated at construction: a bad value raises `ConfigError`
    or `ConfigTypeError` naming the field and the value.

    Args:
        max_concurrent: Calls admitted at once.
        max_waiting: Callers allowed to queue for a slot once all are taken;
            0 rejects at once when full. Beyond it, callers are rejected
            without waiting.
        max_wait: Seconds a caller waits for a slot before it is rejected;
            0 never waits, None waits as long as the enclosing deadline
            allows (an enclosing `resilient.deadline` always clips it).

    Defaults: 25 concurrent calls (the default of Resilience4j's semaphore
    bulkhead, a common connection-pool size), 25 waiting, and a 1 s wait:
    long enough to ride out a burst, short enough that a stuck dependency
    turns into fast `BulkheadFull` errors rather than piled-up callers.

    .. versionadded:: 26.11.0
    """

    max_concurrent: int = attrs.field(default=25, validator=positive_int)
    max_waiting: int = attrs.field(default=25, validator=_non_negative_int)
    max_wait: float | None = attrs.field(
        default=1.0, converter=to_seconds, validator=_seconds_or_none
    )


class BulkheadKnobs(TypedDict, total=False):
    """The keyword arguments `BulkheadConfig` takes, typed."""

    max_concurrent: int
    max_waiting: int
    max_wait: float | dt.timedelta | None
