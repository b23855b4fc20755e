"""Settings that make no sense, refused at construction."""

from __future__ import annotations

import pickle
from typing import Any, final

from resilient._errors._base import ResilientError


class ConfigError(ResilientError, ValueError):
    """
    A setting has a value that makes no sense; raised at construction.

    Attributes:
        field: The qualified name of the setting, like ``"Policy.attempts"``.
        value: The value that was refused; unpickled in another process,
            its repr when the value itself does not pickle (a lambda).
    """

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} {why}, got {value!r}")

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        try:
            pickle.dumps(self.value)
        except Exception:  # noqa: BLE001 - any failure to pickle
            state["value"] = repr(self.value)
        return state


@final
class ConfigTypeError(ConfigError, TypeError):
    """
    A setting has the wrong type (``True`` for an int included).
    """
