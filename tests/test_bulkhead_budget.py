"""
A policy's bulkhead wait is bounded by what is left of the call's budget
(and of any enclosing deadline), not only by the bulkhead's ``max_wait``.
"""

from __future__ import annotations

import itertools
import time

import pytest

import resilient
from tests.conftest import Driver


_names = itertools.count()


@pytest.mark.parametrize("limit", ["budget", "deadline"])
def test_the_bulkhead_wait_ends_with_the_budget(
    driver: Driver, limit: str
) -> None:
    """
    With every slot taken, a call whose budget (or enclosing deadline) is
    0.05 s is refused with `BulkheadFull` (reason "deadline") after about
    0.05 s, not after the default ``max_wait`` of 1 s; sync, asyncio and
    trio alike.
    """
    name = f"bh-budget-{next(_names)}"
    config = resilient.BulkheadConfig(max_concurrent=1)
    held = resilient.bulkhead(name, config).acquire()
    policy = resilient.Policy(
        name=name,
        attempts=1,
        budget=0.05 if limit == "budget" else None,
        bulkhead=config,
    )
    start = time.monotonic()
    try:
        with pytest.raises(resilient.BulkheadFull) as info:
            if limit == "budget":
                driver.call(policy, lambda: 1)
            else:
                with resilient.deadline(0.05):
                    driver.call(policy, lambda: 1)
    finally:
        held.release()
    took = time.monotonic() - start
    assert 0.04 <= took < 0.6
    assert info.value.reason == "deadline"
    assert policy.bulkhead is not None
    assert policy.bulkhead.max_wait == 1.0
