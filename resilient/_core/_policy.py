"""
Where `Policy` used to live; it moved to `resilient._policy` (the face).

Kept only so that ``from resilient._core._policy import Policy`` (the
simulator's import) goes on working until it moves; the name is looked up
lazily, so `_core` imports nothing above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from resilient._policy import DEFAULT_RETRY_ON, Policy, PolicyChanges

__all__ = ["DEFAULT_RETRY_ON", "Policy", "PolicyChanges"]


def __getattr__(name: str) -> Any:
    if name in {"Policy", "PolicyChanges", "DEFAULT_RETRY_ON"}:
        return getattr(importlib.import_module("resilient._policy"), name)
    raise AttributeError(name)
