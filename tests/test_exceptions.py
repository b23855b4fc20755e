"""
The library's exceptions cross process boundaries and copies intact: every
class in `resilient.exceptions.__all__` pickles, copies and deep-copies with
its message and its attributes, and a process pool whose job raised one
gets it back (issue 6 item 6).

The classes are discovered from ``__all__`` and built from their
``__init__`` signature, so a class added later is covered without touching
this file (a parameter of a type the builder does not know fails loudly).
"""

from __future__ import annotations

import concurrent.futures
import copy
import inspect
import multiprocessing
import pickle
import types
import typing
from collections.abc import Callable
from typing import Any

import pytest

import resilient
import resilient.exceptions


def _sample(annotation: object, name: str) -> object:
    """A picklable value of type *annotation* for parameter *name*."""
    origin = typing.get_origin(annotation)
    if origin in {typing.Union, types.UnionType}:
        options = [a for a in typing.get_args(annotation) if a is not None]
        options = [a for a in options if a is not type(None)]
        return _sample(options[0], name)
    samples: dict[object, object] = {
        str: f"{name}-value",
        float: 2.5,
        int: 7,
        bool: True,
        object: ("an", "object", 1),
        # Exceptions compare by identity: CircuitOpen.opened_by's round
        # trip is checked on its own in tests/test_breaker_details.py.
        BaseException: None,
    }
    if annotation in samples:
        return samples[annotation]
    raise AssertionError(  # pragma: no cover - a new kind of parameter
        f"tests/test_exceptions.py cannot build a {annotation!r} for "
        f"{name!r}: teach _sample about it"
    )


def _build(cls: type[BaseException]) -> BaseException:
    """An instance of *cls* with a sample for every parameter."""
    hints = typing.get_type_hints(cls.__init__)
    kwargs: dict[str, object] = {}
    for param in inspect.signature(cls.__init__).parameters.values():
        if param.name == "self" or param.kind in {
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        }:
            continue
        kwargs[param.name] = _sample(hints.get(param.name, str), param.name)
    if cls.__init__ is BaseException.__init__:  # pragma: no cover
        return cls("a message")
    return cls(**kwargs)


CLASSES = [
    getattr(resilient.exceptions, name)
    for name in resilient.exceptions.__all__
]


def _same(a: BaseException, b: BaseException, *, pickled: bool) -> None:
    """
    *b* is a faithful copy of *a*: class, message, args, attributes (those
    local to a process, a live scope, are None once pickled).
    """
    assert type(b) is type(a)
    assert str(b) == str(a)
    assert b.args == a.args
    expected = dict(vars(a))
    if pickled:
        for name in getattr(a, "_process_local", ()):
            expected[name] = None
    assert vars(b) == expected


Roundtrip = Callable[[BaseException], BaseException]

ROUNDTRIPS: dict[str, Roundtrip] = {
    "pickle": lambda e: pickle.loads(pickle.dumps(e)),  # noqa: S301
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
}


def test_every_exception_is_covered() -> None:
    """The exceptions the library raises are all in `__all__` (and so
    covered here), the known ones included."""
    names = set(resilient.exceptions.__all__)
    assert {
        "BulkheadFull",
        "CircuitOpen",
        "ConfigError",
        "ConfigTypeError",
        "DeadlineExceeded",
        "ResilientError",
        "ScopeCancelled",
        "TimedOut",
    } <= names
    for name in names:
        assert issubclass(getattr(resilient.exceptions, name), BaseException)


@pytest.mark.parametrize("how", sorted(ROUNDTRIPS))
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_round_trip(cls: type[BaseException], how: str) -> None:
    """Each exception class survives pickle, copy and deepcopy with its
    message, args and attributes."""
    exc = _build(cls)
    exc.add_note("a note")
    back = ROUNDTRIPS[how](exc)
    _same(exc, back, pickled=how == "pickle")
    assert back.__notes__ == ["a note"]
    if how != "copy":
        assert back is not exc


@pytest.mark.parametrize("how", sorted(ROUNDTRIPS))
def test_a_live_scope_does_not_travel(how: str) -> None:
    """`TimedOut.scope` and `ScopeCancelled.scope` hold a live scope: None
    in a pickle, the same scope in a copy or a deep copy."""
    scope = resilient.timeout(1.0, name="fetch")
    for exc in (
        resilient.TimedOut(12.5, scope, 2.0, "fetch"),
        resilient.ScopeCancelled(scope),
    ):
        back: Any = ROUNDTRIPS[how](exc)
        assert str(back) == str(exc)
        assert back.scope is (None if how == "pickle" else scope)


def test_an_unpicklable_value_travels_as_its_repr() -> None:
    """A ConfigError about a lambda pickles, the value as its repr; copies
    keep the lambda itself."""

    def fn() -> None: ...  # pragma: no cover

    exc = resilient.ConfigError("Policy.retry_on", fn, "must take 1 arg")
    back = pickle.loads(pickle.dumps(exc))  # noqa: S301
    assert back.value == repr(fn)
    assert str(back) == str(exc)
    assert copy.copy(exc).value is fn
    assert copy.deepcopy(exc).value is fn


def test_timed_out_says_which_scope_and_how_long() -> None:
    """The message names the duration and, if named, the scope."""
    assert str(resilient.TimedOut(1.0, None, 2.0, "x")) == (
        "timeout of 2.000 s exceeded (scope 'x')"
    )
    assert str(resilient.TimedOut(1.0, None, 0.25)) == (
        "timeout of 0.250 s exceeded"
    )
    assert str(resilient.TimedOut(1.0)) == "timeout exceeded"


def test_a_process_pool_gets_every_exception_back() -> None:
    """
    A process pool whose jobs raise each exception gets each one back, with
    its message and attributes, and every job's result: none of them
    breaks the pool.
    """
    context = multiprocessing.get_context("spawn")
    excs = [_build(cls) for cls in CLASSES]
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=context
    ) as pool:
        # `exec` is importable in the child, unlike a test function: the
        # exception goes there in a pickle and comes back in another.
        futures = [pool.submit(exec, "raise exc", {"exc": e}) for e in excs]
        done = pool.submit(sum, [1, 2])
        for exc, future in zip(excs, futures, strict=True):
            back = future.exception(timeout=60)
            assert back is not None
            _same(exc, back, pickled=True)
        assert done.result(timeout=60) == 3


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("gone", "the store no longer holds it"),
        ("expired", "it was not renewed before its lease ran out"),
        ("refused", "the store refused its renewal for good"),
        ("forked", "this process is a fork of the holder"),
    ],
)
def test_lock_lost_says_why_in_words(reason: str, says: str) -> None:
    """Each reason a lease can be lost for reads as words in the message,
    the renewal the store refused for good included (it printed the bare
    code before)."""
    lost = resilient.LockLost("nightly", 7, reason)
    assert str(lost) == f"lock 'nightly' lost (fence 7): {says}"
