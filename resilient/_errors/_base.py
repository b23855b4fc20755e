"""The base of every exception: pickling and copying by ``args`` and
``__dict__`` (see `resilient.exceptions`)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Self, TypeVar


class _Portable(BaseException):
    """
    Pickling and copying by ``args`` and ``__dict__`` (see the module's
    docstring): ``BaseException``'s own way calls ``__init__`` with
    ``args``, which breaks as soon as ``__init__`` takes other arguments.
    """

    # Attributes that mean nothing in another process: None in a pickle,
    # shared (not copied) by deepcopy.
    _process_local: ClassVar[tuple[str, ...]] = ()

    def _state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._process_local:
            if name in state:
                state[name] = None
        return state

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self._state()))

    def __copy__(self) -> Self:
        return _rebuild(type(self), self.args, self.__dict__)

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        local = {
            name: self.__dict__[name]
            for name in self._process_local
            if name in self.__dict__
        }
        rest = {k: v for k, v in self.__dict__.items() if k not in local}
        new = _rebuild(type(self), copy.deepcopy(self.args, memo), local)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(rest, memo))
        return new


_E = TypeVar("_E", bound=BaseException)


def _rebuild(
    cls: type[_E], args: tuple[Any, ...], state: dict[str, Any]
) -> _E:
    """An exception from its args and attributes, without ``__init__``."""
    exc = cls.__new__(cls, *args)
    # Set again: OSError subclasses (TimeoutError) leave it to __init__.
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ResilientError(_Portable, Exception):
    """
    Base class of every exception resilient raises on its own account.

    Every subclass pickles with its message and attributes.
    """
