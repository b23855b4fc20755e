"""
noxfile.py's own checks: an old Python is refused before nox is bootstrapped,
and nox's notice about a missing uv is silenced.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


NOXFILE = Path(__file__).resolve().parent.parent / "noxfile.py"


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
