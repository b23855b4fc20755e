"""
Names as reprs and messages show them: a user's name may be of any length
(a 1 MB singleflight name is a valid name), a repr stays one short line.
"""

from __future__ import annotations

from typing import Final


NAME_LIMIT: Final = 80
"""The characters of a name a repr or a message shows."""


def shown(name: str) -> str:
    """*name* cut to `NAME_LIMIT` characters, ``...`` marking the cut."""
    if len(name) > NAME_LIMIT:
        return name[:NAME_LIMIT] + "..."
    return name
