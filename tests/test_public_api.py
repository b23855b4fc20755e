"""
The public surface: what `resilient` and its public submodules export, under
which names, and what importing it costs.
"""

from __future__ import annotations
import __future__

import enum
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import resilient


PUBLIC_MODULES = (
    "resilient",
    "resilient.exceptions",
    "resilient.http",
    "resilient.lowlevel",
    "resilient.testing",
    "resilient.typing",
)

# Classes users may subclass, and why. Every other public class is @final.
OPEN_CLASSES: dict[str, str] = {}

# Heavy or optional packages `import resilient` must not pull in.
LAZY = (
    "redis",
    "psycopg",
    "psycopg2",
    "opentelemetry.sdk",
    "matplotlib",
    "trio",
)

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def _module(name: str) -> types.ModuleType:
    return importlib.import_module(name)


def _exported(name: str) -> list[tuple[str, Any]]:
    mod = _module(name)
    return [(n, getattr(mod, n)) for n in mod.__all__]


def _is_future(obj: object) -> bool:
    """`from __future__ import annotations` leaves a public-looking name."""
    return isinstance(obj, __future__._Feature)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_sorted_and_unique(name: str) -> None:
    """Each public module's __all__ is sorted, with no duplicates."""
    names = _module(name).__all__
    assert list(names) == sorted(set(names))


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_everything_listed_exists(name: str) -> None:
    """Every name in __all__ is an attribute of its module."""
    mod = _module(name)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == []


def test_nothing_public_is_unlisted() -> None:
    """
    Every public attribute of `resilient` is in __all__, except the public
    submodules themselves.
    """
    unlisted = [
        n
        for n, obj in vars(resilient).items()
        if not n.startswith("_")
        and n not in resilient.__all__
        and not isinstance(obj, types.ModuleType)
        and not _is_future(obj)
    ]
    assert unlisted == []


@pytest.mark.parametrize("name", PUBLIC_MODULES[1:])
def test_submodule_definitions_are_listed(name: str) -> None:
    """
    Every public class and function a public submodule defines is in its
    __all__ (what it merely imports need not be).
    """
    mod = _module(name)
    unlisted = [
        n
        for n, obj in vars(mod).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == name
        and n not in mod.__all__
    ]
    assert unlisted == []


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_objects_name_a_public_module(name: str) -> None:
    """
    Every exported class and function says it comes from a public module,
    so reprs, tracebacks and the docs show paths users can import.
    """
    private = [
        (n, obj.__module__)
        for n, obj in _exported(name)
        if (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ not in PUBLIC_MODULES
    ]
    assert private == []


def test_exceptions_are_exported_at_the_top() -> None:
    """
    Every exception in `resilient.exceptions` is also `resilient.<Name>`,
    the same object.
    """
    for n, obj in _exported("resilient.exceptions"):
        assert getattr(resilient, n, None) is obj, n


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_classes_are_final(name: str) -> None:
    """
    Public classes are closed with @typing.final, except exceptions (users
    catch and may subclass them), protocols (users implement them), enums
    (closed already: an enum with members cannot be subclassed) and the
    classes in OPEN_CLASSES.
    """
    open_ = [
        n
        for n, obj in _exported(name)
        if inspect.isclass(obj)
        and not issubclass(obj, BaseException | enum.Enum)
        and not getattr(obj, "_is_protocol", False)
        and n not in OPEN_CLASSES
        and not getattr(obj, "__final__", False)
    ]
    assert open_ == []


def test_open_classes_are_public() -> None:
    """Every class excused from @final is a public class."""
    for n in OPEN_CLASSES:
        assert inspect.isclass(getattr(resilient, n)), n


def test_version() -> None:
    """`resilient.__version__` is the installed CalVer version."""
    version = resilient.__version__
    assert version == importlib.metadata.version("resilient")
    assert re.fullmatch(r"\d{2}\.\d{1,2}\.\d+(\.dev\d+)?", version)


def test_retry_machine_moved_to_lowlevel() -> None:
    """
    `resilient.RetryMachine` (documented in 26.11.0) still works, as the
    same object as `resilient.lowlevel.RetryMachine`, and warns.
    """
    with pytest.warns(DeprecationWarning, match="resilient.lowlevel"):
        old = resilient.RetryMachine
    assert old is resilient.lowlevel.RetryMachine
    assert "RetryMachine" not in resilient.__all__


def test_unknown_attribute() -> None:
    """A name the package does not have raises AttributeError with it."""
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = resilient.no_such_thing


def test_import_is_lean() -> None:
    """
    `import resilient` (and its public submodules) imports no backend
    client, no OpenTelemetry SDK and no optional extra.
    """
    code = (
        "import sys\n"
        "import resilient, resilient.testing, resilient.typing\n"
        "import resilient.exceptions\n"
        f"lazy = {LAZY!r}\n"
        "print(sorted(m for m in sys.modules if any(\n"
        "    m == p or m.startswith(p + '.') for p in lazy)))\n"
    )
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]", out.stdout


def _documented() -> set[str]:
    text = API_PAGE.read_text(encoding="utf-8")
    found = re.findall(
        r"^[`:]{3}\{(?:auto|py:)(?:function|class|exception|data)\}\s+([\w.]+)",
        text,
        flags=re.MULTILINE,
    )
    found += re.findall(
        r"^\.\. (?:auto|py:)(?:function|class|exception|data)::\s+([\w.]+)",
        text,
        flags=re.MULTILINE,
    )
    return set(found)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_api_page_lists_every_public_name(name: str) -> None:
    """
    docs/api.md has an explicit autodoc entry for every exported name.
    """
    documented = _documented()
    missing = [
        f"{name}.{n}"
        for n in _module(name).__all__
        if f"{name}.{n}" not in documented
    ]
    assert missing == []


def test_dir_is_the_public_api() -> None:
    """
    ``dir(resilient)`` lists `__all__`, the public submodules and the
    dunders, nothing else: not ``annotations`` or ``contextlib`` (which it
    used to list), nor a private subpackage or helper. The namespace itself
    holds no public-looking name outside `__all__` but the submodules.
    """
    listed = set(dir(resilient))
    assert set(resilient.__all__) <= listed
    extra = {
        n
        for n in listed - set(resilient.__all__)
        if not (n.startswith("__") and n.endswith("__"))
    }
    submodules = {n.rsplit(".", 1)[-1] for n in PUBLIC_MODULES}
    assert extra <= submodules | {"simulation"}
    assert {"exceptions", "lowlevel"} <= extra
    assert dir(resilient) == sorted(listed)
    assert "annotations" not in vars(resilient)
    assert "contextlib" not in vars(resilient)
    assert not [
        n
        for n in vars(resilient)
        if n.startswith("_")
        and not n.startswith("__")
        and not isinstance(vars(resilient)[n], types.ModuleType)
    ]
