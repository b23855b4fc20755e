"""
The face of retry: `Policy`, one frozen description of how to call a
dependency, and the ways to apply it (`retry`, ``@policy``, `Policy.call`,
`Policy.acall`, `retrying`).

A `Policy` is plain data. The stateful parts a policy names (breakers,
bulkheads, retry budgets) live in registries keyed by the policy's name.
What runs a call is `resilient._pipeline`, which reads a policy through the
`RetrySettings` protocol and never imports this package.

`._policy` holds `Policy` (and `PolicyChanges`, its variants' keywords),
`._apply` the decorator and the block form, `._colour` the checks that
keep sync code from async hooks.
"""

from __future__ import annotations

from resilient._policy._apply import Retrying, retry, retrying
from resilient._policy._policy import (
    DEFAULT_RETRY_ON,
    Policy,
    PolicyChanges,
    RetryOn,
)


__all__ = [
    "DEFAULT_RETRY_ON",
    "Policy",
    "PolicyChanges",
    "RetryOn",
    "Retrying",
    "retry",
    "retrying",
]
