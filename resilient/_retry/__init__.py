"""
Retry's pure part: the `RetryMachine` and its give-up notes.

The shells that carry out its decisions are the pipeline's drivers
(`resilient._pipeline`); the face is `resilient._policy`.
"""

from __future__ import annotations

from resilient._retry._machine import RetryMachine, WrongShell, note


__all__ = ["RetryMachine", "WrongShell", "note"]
