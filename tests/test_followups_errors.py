"""
The exceptions live in ``resilient._errors`` (one module per family) and are
named at their public home, ``resilient.exceptions``: what pickles refer
to, what reprs and the docs show, and what `resilient` re-exports.
"""

from __future__ import annotations

import pickle
import pickletools

import resilient
import resilient.exceptions
from resilient.exceptions import CircuitOpen, LockLost, TimedOut


def test_every_public_class_is_named_at_its_public_home() -> None:
    """Each name in ``__all__`` says ``resilient.exceptions`` and is the
    object `resilient` exports under that name."""
    for name in resilient.exceptions.__all__:
        cls = getattr(resilient.exceptions, name)
        assert cls.__module__ == "resilient.exceptions", name
        assert cls.__qualname__ == name
        assert getattr(resilient, name) is cls


def _globals_named(data: bytes) -> set[str]:
    """The module paths a pickle refers to (protocol 4+ names them as
    strings before a STACK_GLOBAL; protocol 2 in GLOBAL ops)."""
    names: set[str] = set()
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            names.add(str(arg).split(" ")[0])
        elif op.name in {"SHORT_BINUNICODE", "BINUNICODE"} and str(
            arg
        ).startswith("resilient"):
            names.add(str(arg))
    return names


def test_pickles_name_only_the_public_module() -> None:
    """A pickled exception refers to ``resilient.exceptions`` alone (its
    class and the function that rebuilds it), never to the private
    modules, so pickles survive a later reshuffle of ``_errors``."""
    errors = [
        CircuitOpen("db", 1.5, "open", ValueError("boom")),
        TimedOut(5.0, None, 2.0, "fetch"),
        LockLost("jobs", 3, "gone"),
    ]
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        data = pickle.dumps(errors, protocol=protocol)
        named = {n for n in _globals_named(data) if n.startswith("resilient")}
        assert named == {"resilient.exceptions"}, (protocol, named)
        back = pickle.loads(data)  # noqa: S301 - our own bytes
        assert [str(e) for e in back] == [str(e) for e in errors]
