"""What ``with owner:`` blocks entered (resilient._core._entered)."""

from __future__ import annotations

import contextlib
import contextvars
import gc
from typing import Any

from resilient._core import _entered


class _Item:
    """A stand-in permit: records its enter and exit, and being freed."""

    def __init__(self, owner: _Owner) -> None:
        self.owner = owner
        self.entered = False

    def exit(self, *exc: object) -> None:
        self.owner.log.append(("exit", self.entered))

    def __del__(self) -> None:
        self.owner.freed += 1


def _class_exit(owner: _Owner, *exc: object) -> None:
    item = _entered.pop(owner)
    owner.log.append(("stack-exit", item is not None))


class _Owner:
    """A context manager of its own, as a bulkhead is."""

    def __init__(self) -> None:
        self.log: list[tuple[str, bool]] = []
        self.freed = 0

    def __enter__(self) -> _Item:
        item = _entered.take_handed()
        if item is None:  # called as cls.__enter__(owner): the stack path
            item = _Item(self)
            _entered.push(self, item)
        item.entered = True
        return item  # type: ignore[no-any-return]

    __exit__ = _entered.PerWith(_Item, lambda i: i.exit, _class_exit)


def test_with_statement_gets_its_own_item() -> None:
    """Each block gets the item its __exit__ lookup made; it is freed when
    the block ends, nested blocks included; no stack is used."""
    owner = _Owner()
    with owner as outer:
        with owner as inner:
            assert inner is not outer
        assert _entered._STACK.get() is None
    del outer, inner
    gc.collect()
    assert owner.log == [("exit", True), ("exit", True)]
    assert owner.freed == 2


def test_exit_stack_uses_the_context_stack() -> None:
    """contextlib.ExitStack calls the class's methods: the class lookup
    clears any hand-off and exits through the stack."""
    owner = _Owner()
    _entered.hand(object())  # a stale hand-off must not be taken
    with contextlib.ExitStack() as stack:
        stack.enter_context(owner)
        assert _entered._STACK.get() is not None
    assert owner.log == [("stack-exit", True)]
    assert _entered._STACK.get() is None


def test_pop_finds_its_owner_below_others() -> None:
    """pop takes the innermost entry of its owner and keeps the others in
    order; None when the owner has none."""
    a, b = object(), object()
    _entered.push(a, 1)
    _entered.push(b, 2)
    _entered.push(b, 3)
    assert _entered.pop(a) == 1
    assert _entered.pop(b) == 3
    assert _entered.pop(a) is None
    assert _entered.pop(b) == 2
    assert _entered._STACK.get() is None


def test_copied_context_does_not_share_the_stack() -> None:
    """A copied context (a new task) sees its parent's entries but popping
    there leaves the parent's stack as it was."""
    owner = object()
    _entered.push(owner, "x")
    got: list[Any] = []
    contextvars.copy_context().run(lambda: got.append(_entered.pop(owner)))
    assert got == ["x"]
    assert _entered.pop(owner) == "x"


def test_take_handed_takes_once() -> None:
    """A hand-off is taken once, then there is none."""
    _entered.hand("item")
    assert _entered.take_handed() == "item"
    assert _entered.take_handed() is None
