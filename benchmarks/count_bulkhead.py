"""
One contender of bench_breaker.py's "a bulkhead inside the pipeline vs on
its own", called N times, for counting instructions with callgrind (load
independent, unlike the timed script).

Usage::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/count_bulkhead.py VARIANT N

VARIANT is ``bare`` (the undecorated call), ``bh`` (``@bulkhead``),
``pol`` (the pipeline's policy with a breaker), ``polbh`` (the same with
a bulkhead), ``polobh`` (the policy without a bulkhead over a
``@bulkhead`` function: the decorator inside the pipeline), each prefixed
with ``a`` for the asyncio twin (``abh``...).
Run each with two values of N (2000 and 12000) and divide the difference
of the "Collected" totals by 10000: instructions per call, without the
start-up. Inside = polbh - pol, alone = bh - bare.
"""

from __future__ import annotations

import asyncio
import itertools
import sys

import resilient
from resilient import BreakerConfig, bulkhead


def ok() -> int:
    return 1


async def aok() -> int:
    return 1


def _policy(*, with_bulkhead: bool) -> resilient.Policy:
    """bench_breaker.py's pipeline policy."""
    return resilient.Policy(
        name=f"count-{with_bulkhead}",
        retry_on=ValueError,
        backoff=resilient.Constant(seconds=0),
        budget=None,
        attempts=4,
        breaker=BreakerConfig(open_interval=3600, max_open_interval=3600),
        bulkhead=(
            resilient.BulkheadConfig(max_concurrent=25)
            if with_bulkhead
            else None
        ),
    )


def main() -> None:
    """Warm up, then make N calls of VARIANT."""
    variant, n = sys.argv[1], int(sys.argv[2])
    is_async = variant.startswith("a")
    target = aok if is_async else ok
    fn = {
        "bare": lambda: target,
        "bh": lambda: bulkhead("count", max_concurrent=25)(target),
        "pol": lambda: _policy(with_bulkhead=False)(target),
        "polbh": lambda: _policy(with_bulkhead=True)(target),
        "polobh": lambda: _policy(with_bulkhead=False)(
            bulkhead("count", max_concurrent=25)(target)
        ),
    }[variant[1:] if is_async else variant]()
    if is_async:

        async def calls() -> None:
            for _ in range(2000):
                await fn()
            for _ in itertools.repeat(None, n):
                await fn()

        asyncio.run(calls())
    else:
        for _ in range(2000):
            fn()
        for _ in itertools.repeat(None, n):
            fn()


if __name__ == "__main__":
    main()
