"""
The retry decision's shortcuts answer as the full decision does: a quiet
retry (no hook, no telemetry, logging off) is decided without its record,
a built-in exception type retried once is not classified again, and
`Transient` caches its verdict on plain built-in exceptions per type; none
of them may take an instance's own attributes for its type's.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import resilient
from resilient import Constant, Policy
from tests.conftest import Driver


def _raising(*errors: BaseException) -> Any:
    """A function that raises *errors* in turn, then returns "ok"."""
    left = list(errors)

    def body() -> str:
        if left:
            raise left.pop(0)
        return "ok"

    return body


def _hinted(seconds: float) -> ValueError:
    exc = ValueError("throttled")
    exc.retry_after = seconds  # type: ignore[attr-defined]
    return exc


def _with_status(status: int) -> ValueError:
    exc = ValueError("status")
    exc.status_code = status  # type: ignore[attr-defined]
    return exc


def test_hint_on_an_instance_of_a_type_retried_by_type(
    driver: Driver, clock: Any
) -> None:
    """A call that retried a plain ValueError by its type still reads a
    later ValueError's own retry_after (the machine's per-type shortcut is
    for instances with no attributes of their own)."""
    policy = Policy(retry_on=ValueError, backoff=Constant(seconds=1))
    body = _raising(ValueError(), ValueError(), _hinted(4.0))
    assert driver.call(resilient.retry(policy), body) == "ok"
    assert clock.sleeps == [1.0, 1.0, 4.0]


def test_transient_status_on_an_instance_of_a_type_it_refused(
    driver: Driver, clock: Any
) -> None:
    """Transient refused a plain ValueError, and still retries a
    ValueError that carries a 503 (its cache is for instances with no
    attributes of their own)."""
    transient = resilient.Transient()
    assert transient(ValueError()) is False
    assert transient(_with_status(503)) is True
    assert transient(ValueError()) is False
    policy = Policy(retry_on=transient, backoff=Constant(seconds=0))
    body = _raising(_with_status(503), _with_status(503))
    assert driver.call(resilient.retry(policy), body) == "ok"
    body = _raising(_with_status(503), ValueError())
    with pytest.raises(ValueError) as info:
        driver.call(resilient.retry(policy), body)
    assert not hasattr(info.value, "status_code")


def test_group_after_a_retried_group_is_judged_by_its_leaves(
    driver: Driver, clock: Any
) -> None:
    """Under the default Transient, a group of connection errors is
    retried and a later group of a ValueError is not: groups are judged by
    their leaves, never by their type."""
    policy = Policy(backoff=Constant(seconds=0))
    body = _raising(
        ExceptionGroup("g", [ConnectionError()]),
        ExceptionGroup("g", [ValueError()]),
    )
    with pytest.raises(ExceptionGroup) as info:
        driver.call(resilient.retry(policy), body)
    assert isinstance(info.value.exceptions[0], ValueError)


@pytest.mark.parametrize("logged", [False, True])
def test_quiet_and_logged_retries_decide_alike(
    driver: Driver,
    clock: Any,
    caplog: pytest.LogCaptureFixture,
    logged: bool,
) -> None:
    """A retry nobody hears of (logging off) waits and counts as one that
    is logged; with the log on, each retry is one record, level changes
    between calls included."""
    policy = Policy(
        retry_on=ConnectionError,
        backoff=resilient.Exponential(base=1, cap=10),
    )
    level = logging.WARNING if logged else logging.ERROR
    with caplog.at_level(level, logger="resilient"):
        body = _raising(ConnectionError(), ConnectionError())
        assert driver.call(resilient.retry(policy), body) == "ok"
    assert clock.sleeps == [1.0, 2.0]
    records = [r for r in caplog.records if r.name == "resilient.retry"]
    assert len(records) == (2 if logged else 0)
