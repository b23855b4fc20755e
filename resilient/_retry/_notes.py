"""
What the retry machine leaves on the errors it decided about: the give-up
note, and the error of a function called in the wrong colour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from resilient._core._decisions import GiveUp


class WrongShell(TypeError):
    """A sync function under an async call or the reverse: never retried."""


def note(exc: BaseException, step: GiveUp) -> None:
    """
    Annotate *exc* with why its call gave up: once per exception object
    and policy, however often one object is raised again.
    """
    e = step.event
    if step.reason == "not_retryable" and e.attempt == 1:
        return  # A plain failure of a first attempt: nothing to add.
    prefix = f"resilient: gave up on {e.policy!r} "
    notes = getattr(exc, "__notes__", None)
    if notes is not None and any(
        isinstance(n, str) and n.startswith(prefix) for n in notes
    ):
        return
    exc.add_note(
        f"{prefix}after {e.attempt} "
        f"attempt{'s' if e.attempt != 1 else ''} in {e.elapsed:.3f}s "
        f"({step.reason.replace('_', ' ')})"
    )
