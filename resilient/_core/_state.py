"""
Process-wide switches: the testing mode and the jitter's random source.

Plain module globals rather than context variables, so that a switch a test
flips is also seen by the threads and tasks it starts.
"""

from __future__ import annotations

import random
from typing import Final, final

import attrs


@final
@attrs.frozen
class TestingMode:
    """
    What `resilient.testing.set_testing` turned on.

    Attributes:
        active: Waits are zero while True.
        attempts: Cap on attempts per call while active; None keeps each
            policy's own.
    """

    active: bool = False
    attempts: int | None = None


OFF: Final = TestingMode()

testing: TestingMode = OFF

# Jitter draws from this one source; `resilient.testing.seed()` re-seeds it.
rng: Final = random.Random()
