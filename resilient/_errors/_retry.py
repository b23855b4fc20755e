"""Retry's give-up on a result, carried as an exception."""

from __future__ import annotations

import pickle
from typing import Any, final

from resilient._errors._base import ResilientError


@final
class GaveUpOnResult(ResilientError):
    """
    Retrying on a result stopped and the policy's *last_result* is
    ``"raise"``: the last result the policy's *retry_if_result* rejected
    (a 503 response), carried as an exception instead of returned.

    Not retried by an enclosing policy (it carries no HTTP status of its
    own); a policy's *fallback* takes over from it like from any other
    final exception.

    Attributes:
        result: The last result; unpickled in another process, its repr
            when the result itself does not pickle.
        attempts: How many attempts were made.
        reason: Why retrying stopped (a ``GiveUpReason``:
            ``"attempts"``, ``"budget"``, ``"not_retryable"`` for a
            response to a request that may not be repeated, ...).
        policy: The policy's name.

    .. versionadded:: 26.12.0
    """

    def __init__(
        self, result: object, attempts: int, reason: str, policy: str
    ) -> None:
        self.result = result
        self.attempts = attempts
        self.reason = reason
        self.policy = policy
        super().__init__(
            f"gave up on {policy!r} after {attempts} "
            f"attempt{'s' if attempts != 1 else ''} "
            f"({reason.replace('_', ' ')}); last result: {_short(result)}"
        )

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        try:
            pickle.dumps(self.result)
        except Exception:  # noqa: BLE001 - any failure to pickle
            state["result"] = repr(self.result)
        return state


def _short(value: object, limit: int = 200) -> str:
    """A repr for a message, cut to *limit* characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the error
        text = f"<{type(value).__qualname__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
