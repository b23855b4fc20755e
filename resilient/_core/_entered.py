"""
What a ``with owner:`` block entered, for owners that are their own context
manager (``with bulkhead:``, ``with breaker:``), kept so that an exception
landing at any point cannot lose it.

The ``with`` statement calls ``type(owner).__exit__`` with no memory of what
``__enter__`` returned, so the owner has to find the permit it handed out.
Two ways, both here:

- **Per-``with`` state** (`PerWith`), the default. CPython's ``with``
  statement looks ``__exit__`` up *before* it calls ``__enter__`` and keeps
  what the lookup returned until the block is over. `PerWith` is a
  descriptor for ``__exit__`` (or ``__aexit__``): an instance lookup makes
  the item for this block (a permit not yet taken), hands it to the
  ``__enter__`` that follows in the same thread (`take_handed`), and returns
  the item's own exit method. Nothing outlives the block: when the block is
  done, or an exception unwinds it at any point (even before the exit method
  ran its first line), the statement drops its reference and the item is
  freed; an item that still holds something gives it back when freed (its
  ``__del__``). No context variable key per owner, no stack to corrupt.
- **A context stack** (`push`, `pop`), for callers that use the class's
  methods directly, as `contextlib.ExitStack` does (``cls.__enter__(cm)``,
  then ``cls.__exit__(cm, ...)``): a class lookup of a `PerWith` gives a
  function that pops the innermost item the owner pushed. One module-level
  `contextvars.ContextVar` for every owner, holding an immutable stack of
  ``(owner, item, rest)``, so that a copied context (a new task or thread)
  can neither share nor corrupt its parent's.

Asynchronous exceptions (``PyThreadState_SetAsyncExc``, signal handlers such
as the SIGALRM of ``timeout(interrupt=True)``) are delivered by CPython 3.11
only at its eval-breaker checks: at the entry of a Python function, on a
backward jump, and after a call returns; never inside a C call. Between the
``__exit__`` lookup and ``__enter__`` there is no Python code but ours, so the
hand-off is safe, and an exception at the first line of an exit method is
exactly the case per-``with`` state recovers from.
"""

from __future__ import annotations

import contextvars
import threading
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final


if TYPE_CHECKING:
    from collections.abc import Callable


O = TypeVar("O")  # noqa: E741 - the owner
I = TypeVar("I")  # noqa: E741 - the entered item

_Stack = tuple[object, object, "_Stack"] | None

_STACK: Final[contextvars.ContextVar[_Stack]] = contextvars.ContextVar(
    "resilient_entered", default=None
)


def push(owner: object, item: object) -> None:
    """Record *item* as entered by *owner* in this thread or task."""
    _STACK.set((owner, item, _STACK.get()))


def pop(owner: object) -> Any:
    """
    The innermost item *owner* pushed in this thread or task, removed; None
    when there is none (an exit without an enter).
    """
    top = _STACK.get()
    skipped: list[tuple[object, object]] = []
    while top is not None:
        who, item, rest = top
        if who is owner:
            for entry in reversed(skipped):
                rest = (*entry, rest)
            _STACK.set(rest)
            return item
        skipped.append((who, item))
        top = rest
    return None


@final
class _Handoff(threading.local):
    """The item an ``__exit__`` lookup made for the ``__enter__`` to come."""

    item: object = None


_HANDOFF: Final = _Handoff()


def hand(item: object) -> None:
    """Give *item* to the next `take_handed` in this thread."""
    _HANDOFF.item = item


def take_handed() -> Any:
    """The item handed in this thread (None if none), no longer handed."""
    handoff = _HANDOFF
    item = handoff.item
    handoff.item = None
    return item


@final
class PerWith(Generic[O, I]):
    """
    A descriptor for an owner's ``__exit__`` or ``__aexit__`` that gives
    every ``with`` block its own item (see the module docstring).

    Args:
        make: Makes the item of one block from the owner (cheap, takes
            nothing yet).
        exit_of: The item's exit method for this block.
        by_class: What a class lookup returns: the exit function that
            callers of ``cls.__exit__(owner, ...)`` use (the stack path).
    """

    __slots__ = ("_by_class", "_exit_of", "_make")

    def __init__(
        self,
        make: Callable[[O], I],
        exit_of: Callable[[I], Callable[..., Any]],
        by_class: Callable[..., Any],
    ) -> None:
        self._make = make
        self._exit_of = exit_of
        self._by_class = by_class

    def __get__(self, owner: O | None, cls: type[O] | None = None) -> Any:
        if owner is None:
            # ``ExitStack.enter_context`` reads ``cls.__exit__`` just before
            # it calls ``cls.__enter__``: nothing may be handed to that one.
            _HANDOFF.item = None
            return self._by_class
        item = self._make(owner)
        _HANDOFF.item = item
        return self._exit_of(item)


def discard(owner: object, item: object) -> None:
    """Remove *item* from the stack if *owner* pushed it (any depth)."""
    top = _STACK.get()
    kept: list[tuple[object, object]] = []
    while top is not None:
        who, it, rest = top
        if who is owner and it is item:
            for entry in reversed(kept):
                rest = (*entry, rest)
            _STACK.set(rest)
            return
        kept.append((who, it))
        top = rest
