"""
Low-level parts for those who drive retry themselves (a simulator, another
scheduler): the retry machine and the decisions it returns.

Most code wants `resilient.Policy` and its decorator instead; these names
may change between releases faster than the rest of the API.

.. versionadded:: 26.12.0
"""

from __future__ import annotations

from resilient._core._decisions import DelaySource, GiveUp, GiveUpReason, Retry
from resilient._retry._machine import RetryMachine


__all__ = ["DelaySource", "GiveUp", "GiveUpReason", "Retry", "RetryMachine"]

for _obj in (GiveUp, Retry, RetryMachine):
    _obj.__module__ = __name__
del _obj
