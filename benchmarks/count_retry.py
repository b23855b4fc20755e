"""
bench_retry.py's async retry path (a call that fails three times, then
succeeds, zero delay), called N times, for counting instructions with
callgrind (load independent, unlike the timed script).

Usage::

    PYTHONHASHSEED=0 valgrind --tool=callgrind \\
        --callgrind-out-file=/dev/null \\
        python benchmarks/count_retry.py BACKEND POLICY N

BACKEND is ``asyncio`` or ``trio``; POLICY is ``default`` (the benchmark's
policy: a 30 s budget, so every attempt has a deadline) or ``nobudget``
(``budget=None, attempts=4``). Run each with two values of N (1000 and
5000) and divide the difference of the "Collected" totals by 12000:
instructions per retry, without the start-up. (A fixed hash seed makes
the counts repeat to a few instructions; with a random one they vary by
1 to 2 % from run to run.)
"""

from __future__ import annotations

import itertools
import logging
import sys

import anyio

import resilient


# As in bench_retry.py: retrying measured, not logging.
logging.getLogger("resilient").setLevel(logging.CRITICAL)

POLICIES = {
    "default": resilient.Policy(
        name="count",
        retry_on=ValueError,
        backoff=resilient.Constant(seconds=0),
    ),
    "nobudget": resilient.Policy(
        name="count",
        retry_on=ValueError,
        backoff=resilient.Constant(seconds=0),
        budget=None,
        attempts=4,
    ),
}


def main() -> None:
    """Warm up, then make N calls that each retry three times."""
    backend, policy, n = sys.argv[1], POLICIES[sys.argv[2]], int(sys.argv[3])
    fails = itertools.cycle([True, True, True, False]).__next__

    @resilient.retry(policy)
    async def sometimes() -> int:
        if fails():
            raise ValueError
        return 1

    async def run() -> None:
        for _ in range(200):
            await sometimes()
        for _ in range(n):
            await sometimes()

    anyio.run(run, backend=backend)


if __name__ == "__main__":
    main()
