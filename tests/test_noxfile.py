"""
noxfile.py's own checks: an old Python is refused before nox is bootstrapped,
nox's notice about a missing uv is silenced, every session installs its tools
at the pinned versions, and the lowest versions are pyproject's bounds.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest


NOXFILE = Path(__file__).resolve().parent.parent / "noxfile.py"
PYPROJECT = NOXFILE.with_name("pyproject.toml")
TOOLS = NOXFILE.parent / "constraints" / "tools.txt"
LOWEST = NOXFILE.parent / "constraints" / "lowest.txt"


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    """noxfile.py, imported as a module (nox is installed here)."""
    pytest.importorskip("nox")
    spec = importlib.util.spec_from_file_location("noxfile_test", NOXFILE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "version", [(3, 10, 13, "final", 0), (3, 9, 18), (2, 7, 18)]
)
def test_an_old_python_is_refused_with_what_is_needed(
    noxfile: ModuleType,
    version: tuple[int, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """
    Under a Python older than 3.11 the check exits with status 2 and says
    which Python is needed and which one ran, instead of letting pip's
    resolver search for minutes.
    """
    with pytest.raises(SystemExit) as info:
        noxfile.check_python(version)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "needs Python 3.11 or newer" in err
    assert f"this is Python {'.'.join(map(str, version[:3]))}" in err


@pytest.mark.parametrize("version", [(3, 11, 0), (3, 13, 1), (4, 0, 0)])
def test_a_supported_python_passes(
    noxfile: ModuleType,
    version: tuple[int, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """3.11 and newer pass the check silently."""
    noxfile.check_python(version)
    assert capsys.readouterr().err == ""


def test_the_minimum_is_pyprojects() -> None:
    """The check's minimum is pyproject's ``requires-python``."""
    pyproject = NOXFILE.with_name("pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject


def test_the_check_runs_before_nox_is_imported() -> None:
    """
    Run as a script, noxfile.py checks the Python before it imports (or
    installs) nox: a faked old version exits at once with status 2.
    """
    code = (
        "import runpy, sys\n"
        "sys.version_info = (3, 10, 13, 'final', 0)\n"
        "sys.modules['nox'] = None  # importing nox would fail\n"
        f"sys.argv = [{str(NOXFILE)!r}, '-l']\n"
        f"runpy.run_path({str(NOXFILE)!r}, run_name='__main__')\n"
    )
    done = subprocess.run(  # noqa: S603 (this interpreter, fixed code)
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "needs Python 3.11 or newer" in done.stderr


def test_the_uv_notice_is_dropped_and_nothing_else(
    noxfile: ModuleType,
) -> None:
    """
    nox's ``uv binary not found.`` is filtered out of its logger; any other
    record of the logger passes.
    """
    nox_logger = logging.getLogger("nox")
    assert any(isinstance(f, noxfile._NoUvNotice) for f in nox_logger.filters)

    def record(message: str) -> logging.LogRecord:
        return nox_logger.makeRecord(
            "nox", logging.INFO, __file__, 1, message, (), None
        )

    assert not nox_logger.filter(record("uv binary not found."))
    assert nox_logger.filter(record("Creating virtual environment (venv)"))


class _Session:
    """What the simulate session asks of nox, recorded in order."""

    def __init__(self, invoked_from: str, posargs: list[str]) -> None:
        self.invoked_from = invoked_from
        self.posargs = posargs
        self.calls: list[tuple[str, object]] = []

    def install(self, *args: str) -> None:
        self.calls.append(("install", args))

    def chdir(self, folder: str) -> None:
        self.calls.append(("chdir", folder))

    def run(self, *args: str, **kwargs: object) -> None:
        self.calls.append(("run", args))


def test_the_simulator_runs_where_nox_was_invoked(
    noxfile: ModuleType, tmp_path: Path
) -> None:
    """
    ``nox -s simulate -- --plot rel.png`` run from another folder writes
    ``rel.png`` there, not beside noxfile.py: the session installs the
    project from its own folder, then runs the simulator in the folder nox
    was invoked from (nox changes to the noxfile's folder).
    """
    session = _Session(str(tmp_path), ["--plot", "rel.png"])
    noxfile.simulate(session)
    kinds = [kind for kind, _ in session.calls]
    assert kinds == ["install", "chdir", "run"]
    assert session.calls[1] == ("chdir", str(tmp_path))
    assert session.calls[2] == (
        "run",
        ("python", "-m", "resilient", "simulate", "--plot", "rel.png"),
    )


class FakeSession:
    """Records what a session installs and runs, running nothing."""

    def __init__(
        self,
        posargs: Sequence[str] = (),
        fails: dict[tuple[str, ...], int] | None = None,
    ) -> None:
        self.posargs = list(posargs)
        self.installs: list[tuple[str, ...]] = []
        self.runs: list[tuple[str, ...]] = []
        self.fails = fails or {}
        self.invoked_from = str(Path.cwd())
        self.folders: list[str] = []

    def install(self, *args: str) -> None:
        self.installs.append(args)

    def chdir(self, folder: str) -> None:
        self.folders.append(folder)

    def run(self, *args: str, **kwargs: object) -> None:
        """Record *args*; fail with the status `fails` gives them."""
        self.runs.append(args)
        if args in self.fails:
            import nox.command

            raise nox.command.CommandFailed(
                "failed", return_code=self.fails[args]
            )

    def error(self, message: str) -> NoReturn:
        raise AssertionError(message)


# Every session but `constraints`, which resolves with pip (its output is
# checked below).
SESSIONS = (
    "tests",
    "tests_matrix",
    "tests_lowest",
    "mypy_pkg",
    "mypy_api",
    "typing_api",
    "lint",
    "docs",
    "notebooks",
    "bench",
    "simulate",
)


@pytest.mark.parametrize("name", SESSIONS)
def test_every_install_is_held_to_the_tool_pins(
    noxfile: ModuleType, name: str
) -> None:
    """
    Every package a session installs is constrained by constraints/
    tools.txt (``-c``): the linters, type checkers, test runner and docs
    builder are the same versions today and next month. Only
    `tests_lowest` adds constraints/lowest.txt.
    """
    session = FakeSession()
    getattr(noxfile, name)(session)
    assert session.installs
    for args in session.installs:
        pins = [args[i + 1] for i, a in enumerate(args) if a == "-c"]
        expected = [str(noxfile.TOOLS)]
        if name == "tests_lowest":
            expected.append(str(noxfile.LOWEST))
        assert pins == expected, args


def test_the_bootstrap_installs_the_pinned_nox() -> None:
    """The bootstrap installs nox through constraints/tools.txt, too."""
    source = NOXFILE.read_text(encoding="utf-8")
    bootstrap = source[source.index("def _bootstrap") :]
    bootstrap = bootstrap[: bootstrap.index("\ndef ")]
    assert '"constraints" / "tools.txt"' in bootstrap
    assert re.search(r"^nox==\S+$", TOOLS.read_text(), flags=re.MULTILINE)


def test_the_tool_pins_leave_the_runtime_libraries_free(
    noxfile: ModuleType,
) -> None:
    """
    constraints/tools.txt pins exact versions and never a runtime library
    (nor psycopg's binary build, which must match psycopg): `tests` runs
    them at their newest release, `tests_lowest` at their lowest.
    """
    names = set()
    for line in TOOLS.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-z0-9-]+)==([0-9][0-9a-z.]*)", line)
        assert match, line
        names.add(match.group(1))
    assert {"mypy", "ruff", "pytest", "sphinx", "pyright", "nox"} <= names
    assert not names & {*noxfile.RUNTIME, "psycopg-binary"}


def test_the_lowest_pins_are_pyprojects_lower_bounds(
    noxfile: ModuleType,
) -> None:
    """
    constraints/lowest.txt is exactly what pyproject's lower bounds give
    (regenerated by ``python3 noxfile.py -s constraints``): a bound raised
    in pyproject is the version `tests_lowest` tests.
    """
    pyproject = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    assert LOWEST.read_text(encoding="utf-8") == noxfile.lowest_constraints(
        pyproject
    )
    bounds = noxfile.lower_bounds(pyproject)
    assert set(bounds) == set(noxfile.RUNTIME)


def _pyproject(*lines: str) -> dict[str, object]:
    return {
        "project": {"dependencies": list(lines)},
        "dependency-groups": {"tests": []},
    }


def test_lower_bounds_that_disagree_or_lack_are_refused(
    noxfile: ModuleType,
) -> None:
    """A runtime library with two lower bounds, none, or missing from
    pyproject, is named in a ValueError."""
    every = [f"{name}>=1" for name in noxfile.RUNTIME]
    assert noxfile.lower_bounds(_pyproject(*every))["trio"] == "1"
    with pytest.raises(ValueError, match="trio has lower bounds"):
        noxfile.lower_bounds(_pyproject(*every, "trio>=2"))
    with pytest.raises(ValueError, match="needs one >= bound"):
        noxfile.lower_bounds(_pyproject(*every, "redis"))
    with pytest.raises(ValueError, match="no lower bound for \\['trio'\\]"):
        noxfile.lower_bounds(_pyproject(*every[:-1]))


def test_the_other_pythons_run_the_suite_without_coverage_or_slow_tests(
    noxfile: ModuleType,
) -> None:
    """
    `tests_matrix` runs pytest directly (no coverage) on the suite minus
    the notebooks, the storms (in a pytest of their own) and the tests
    marked ``slow``; `tests` runs everything under coverage, the slow
    tests included; `tests_lowest` runs them without coverage and, as the
    matrix, without the slow ones.
    """
    session = FakeSession()
    noxfile.tests_matrix(session)
    assert session.runs == [
        ("pytest", "-m", "not notebook and not storm and not slow"),
        ("pytest", "-m", "storm"),
    ]
    session = FakeSession()
    noxfile.tests(session)
    (main,) = [r for r in session.runs if "pytest" in r and "run" in r]
    assert main[-2:] == ("-m", "not notebook and not storm")
    session = FakeSession()
    noxfile.tests_lowest(session)
    assert session.runs == [
        ("pytest", "-m", "not notebook and not storm and not slow")
    ]


def test_slow_is_a_declared_marker_that_marks_tests() -> None:
    """The ``slow`` marker is declared (``--strict-markers``) and used."""
    pyproject = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)
    used = [
        p.name
        for p in NOXFILE.parent.glob("tests/test_*.py")
        if p.name != "test_noxfile.py"
        and "mark.slow" in p.read_text(encoding="utf-8")
    ]
    assert used


def test_a_failed_test_run_still_reports_coverage_and_runs_the_storms(
    noxfile: ModuleType,
) -> None:
    """
    When the suite fails, `tests` still combines and checks the coverage
    and runs the storms, then fails naming each failed step and what
    pytest's status means; `tests_matrix` runs its storms too.
    """
    main = ("coverage", "run", "-m", "pytest", "-m", noxfile._SUITE)
    storms = ("pytest", "-m", "storm")
    session = FakeSession(fails={main: 1, storms: 2})
    with pytest.raises(AssertionError) as info:
        noxfile.tests(session)
    assert session.runs[-3:] == [
        ("coverage", "combine"),
        ("coverage", "report", "--fail-under=95"),
        storms,
    ]
    assert str(info.value) == (
        f"`{' '.join(main)}` exited 1 (tests failed); "
        "`pytest -m storm` exited 2 (interrupted)"
    )
    matrix = ("pytest", "-m", f"{noxfile._SUITE} and not slow")
    session = FakeSession(fails={matrix: 5})
    with pytest.raises(
        AssertionError, match=r"exited 5 \(no tests collected\)"
    ):
        noxfile.tests_matrix(session)
    assert session.runs == [matrix, storms]
