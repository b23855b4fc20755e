"""
`DONE`: an awaitable that is already complete.

``await DONE`` returns None at once, without a frame or a checkpoint: its
``__await__`` is the empty tuple's C iterator, exhausted from the start.
A sync function that finishes its work and returns `DONE` can stand where
an ``async def`` that never awaits would (a coroutine object, its frame
and the send protocol per call), so a step that has nothing to await costs
a plain call in async code too (the pipeline's bare first attempt settles
a bulkhead's slot this way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final


if TYPE_CHECKING:
    from collections.abc import Generator


@final
class Done(tuple[()]):
    """The type of `DONE`."""

    __slots__ = ()

    if TYPE_CHECKING:

        def __await__(self) -> Generator[None, None, None]:
            """An exhausted iterator: the await returns None at once."""

    else:
        __await__ = tuple.__iter__

    def __repr__(self) -> str:
        return "DONE"


DONE: Final = Done()
"""The one `Done`: await it, or return it from a sync function that
stands in for a coroutine function."""
