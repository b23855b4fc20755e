"""
Unknown keywords named: ``Policy(attemps=3)`` says which setting is
misspelt and which one was meant, not ``Policy.__init__() got an
unexpected keyword argument``.

`settings_checked` wraps an attrs class's ``__init__`` (and so its
``evolve``, which calls the class) with a handler that only runs when
Python refused the arguments: a correct call pays one frame, nothing else.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, TypeVar

import attrs

from resilient.exceptions import ConfigTypeError


_C = TypeVar("_C", bound=type)


def unknown_setting(
    owner: str, name: str, value: object, known: tuple[str, ...]
) -> ConfigTypeError:
    """
    The error for a keyword *owner* has no setting of: it names the
    keyword and the closest setting (`difflib`), or lists them all.
    """
    close = difflib.get_close_matches(name, known, n=1)
    hint = (
        f"did you mean {close[0]!r}?"
        if close
        else "its settings: " + ", ".join(sorted(known))
    )
    return ConfigTypeError(
        f"{owner}.{name}", value, f"is not a setting ({hint})"
    )


def settings_checked(cls: _C) -> _C:
    """
    Make the attrs class *cls* name an unknown keyword argument (and the
    setting it is closest to) in a `ConfigTypeError`, a `TypeError`.
    """
    init = cls.__dict__["__init__"]
    known = tuple(a.alias for a in attrs.fields(cls) if a.init)
    owner = cls.__name__

    @functools.wraps(init)
    def __init__(self: object, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        try:
            init(self, *args, **kwargs)
        except TypeError:
            for name, value in kwargs.items():
                if name not in known:
                    raise unknown_setting(owner, name, value, known) from None
            raise

    setattr(cls, "__init__", __init__)  # noqa: B010 - mypy refuses the assignment
    return cls
