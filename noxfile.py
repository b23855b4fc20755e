"""
The project's tasks, as nox sessions.

On a machine with nothing but Python 3.11+, run this file directly::

    python3 noxfile.py -s tests
    python3 noxfile.py -s simulate -- --help

If nox is not installed, it is installed into a private virtual environment
(``.nox-bootstrap/``) first and the same command runs again from there.
With nox installed, ``nox -s tests`` does the same.
An older Python is refused at once, before anything is installed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any, NoReturn


MINIMUM_PYTHON = (3, 11)
"""The oldest Python the project supports (pyproject's requires-python)."""


def check_python(version_info: tuple[Any, ...] = sys.version_info) -> None:
    """
    Refuse a Python older than `MINIMUM_PYTHON`, saying what is needed.

    Run before nox is looked for or installed: under an older Python,
    pip's resolver looks for a nox that supports it for minutes, silently,
    and the project could not be installed anyway.

    Raises:
        SystemExit: With status 2 and the message, for an older Python.
    """
    if tuple(version_info[:2]) >= MINIMUM_PYTHON:
        return
    need = ".".join(map(str, MINIMUM_PYTHON))
    have = ".".join(map(str, version_info[:3]))
    print(
        f"noxfile.py: resilient needs Python {need} or newer; this is "
        f"Python {have} ({sys.executable}). Run it with a newer one, "
        f"for example: python{need} noxfile.py -s tests",
        file=sys.stderr,
    )
    raise SystemExit(2)


class _NoUvNotice(logging.Filter):
    """
    Drop nox's ``uv binary not found.``: the sessions use the ``venv``
    backend, so uv is not needed, and the line reads like an error.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "uv binary not found."


ROOT = Path(__file__).resolve().parent
BOOTSTRAP = ROOT / ".nox-bootstrap"
_BOOTSTRAPPED = "RESILIENT_NOX_BOOTSTRAPPED"
SOURCES = ("resilient", "tests", "docs", "benchmarks", "noxfile.py")


def _bootstrap() -> NoReturn:
    """Give a bare Python a nox to run this file with, then re-run it."""
    if os.environ.get(_BOOTSTRAPPED):
        raise SystemExit(
            f"noxfile.py: nox is still not importable from {sys.executable}"
        )
    bindir = "Scripts" if sys.platform == "win32" else "bin"
    python = (
        BOOTSTRAP
        / bindir
        / ("python.exe" if bindir == "Scripts" else "python")
    )
    if (
        not python.exists()
        or subprocess.run(
            [str(python), "-c", "import nox"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode
    ):
        print(f"noxfile.py: installing nox into {BOOTSTRAP}", file=sys.stderr)
        venv.create(BOOTSTRAP, with_pip=True, clear=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "nox>=2024.4",
            ],
            check=True,
        )
    os.environ[_BOOTSTRAPPED] = "1"
    os.execv(  # noqa: S606
        python, [str(python), str(Path(__file__).resolve()), *sys.argv[1:]]
    )


if __name__ == "__main__":
    check_python()

try:
    import nox
except ModuleNotFoundError:  # pragma: no cover
    if __name__ != "__main__":
        raise
    _bootstrap()

logging.getLogger("nox").addFilter(_NoUvNotice())


PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
PYTHONS = nox.project.python_versions(PYPROJECT)

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.download_python = "never"
nox.options.error_on_missing_interpreters = False
nox.options.sessions = [
    "lint",
    "mypy_pkg",
    "mypy_api",
    "typing_api",
    "tests",
    "docs",
    "notebooks",
]


def _group(*names: str) -> tuple[str, ...]:
    """The requirements of dependency groups in pyproject.toml."""
    return nox.project.dependency_groups(PYPROJECT, *names)


def _install(session: nox.Session, *groups: str, extras: str = "") -> None:
    """Install the project (with *extras*) and the dependency *groups*."""
    session.install(f".{extras}", *_group(*groups))


def _run_tests(session: nox.Session) -> None:
    _install(session, "tests")
    args = list(session.posargs)
    if "-m" not in args:
        # Notebooks start Jupyter kernels; their own session runs them.
        # The storms of asynchronous exceptions run in a pytest of their
        # own below, outside coverage: its tracer loses some of them.
        args = ["-m", "not notebook and not storm", *args]
    session.run("coverage", "erase")
    try:
        session.run("coverage", "run", "-m", "pytest", *args)
    finally:
        session.run("coverage", "combine", success_codes=[0, 1])
    if session.posargs:
        # A subset of the tests cannot reach the bar; report only.
        session.run("coverage", "report")
        return
    session.run("coverage", "report", "--fail-under=95")
    session.run("pytest", "-m", "storm")


@nox.session
def tests(session: nox.Session) -> None:
    """
    The test suite under coverage, on the interpreter running nox.

    Arguments after ``--`` go to pytest (and then coverage is reported, not
    enforced). REDIS_URL, DATABASE_URL and RESILIENT_REQUIRE_SERVICES pass
    through from the environment.
    """
    _run_tests(session)


@nox.session(python=PYTHONS)
def tests_matrix(session: nox.Session) -> None:
    """The test suite on every Python in the classifiers that is installed."""
    _run_tests(session)


@nox.session
def mypy_pkg(session: nox.Session) -> None:
    """mypy --strict on the package and this file."""
    _install(session, "typing")
    session.run("mypy", "--strict", "resilient", "noxfile.py")


@nox.session
def mypy_api(session: nox.Session) -> None:
    """mypy on tests/typing: the public API types as documented."""
    _install(session, "typing")
    session.run("mypy", "--strict", "tests/typing")


@nox.session
def typing_api(session: nox.Session) -> None:
    """pyright on tests/typing: the same API types as a second checker
    sees them (mypy_api is the first)."""
    _install(session, "typing")
    session.install("pyright>=1.1.400")
    session.run("pyright", "tests/typing/api.py")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and codespell."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # Named paths: a bare `codespell` would also read the virtual
    # environments (.nox-bootstrap/ is not in the skip list).
    paths = [
        p
        for p in (*SOURCES, "notebooks", "README.md", "pyproject.toml")
        if (ROOT / p).exists()
    ]
    session.run("codespell", "--toml", "pyproject.toml", *paths)


@nox.session
def docs(session: nox.Session) -> None:
    """
    Build the docs with warnings as errors and run their doctests.

    ``nox -s docs -- watch`` rebuilds and serves them as you edit.
    """
    # The examples use the OpenTelemetry SDK (instrumentation page).
    _install(session, "docs", extras="[otel]")
    if session.posargs == ["watch"]:
        session.install("sphinx-autobuild")
        session.run("sphinx-autobuild", "-W", "-n", "docs", "docs/_build/html")
        return
    common = ["-W", "-n", "--keep-going", "-T", "-q"]
    session.run(
        "sphinx-build", *common, "-b", "html", "docs", "docs/_build/html"
    )
    session.run(
        "sphinx-build",
        *common,
        "-b",
        "doctest",
        "docs",
        "docs/_build/doctest",
    )


@nox.session
def notebooks(session: nox.Session) -> None:
    """Run every notebook headless (the tests marked ``notebook``)."""
    _install(session, "tests", extras="[plot]")
    session.run("pytest", "-m", "notebook", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run benchmarks/bench_retry.py, then every other bench_*.py."""
    _install(session, "bench")
    scripts = sorted(
        ROOT.glob("benchmarks/bench_*.py"),
        key=lambda p: (p.name != "bench_retry.py", p.name),
    )
    if not scripts:
        session.error("no benchmarks/bench_*.py to run")
    for script in scripts:
        session.run("python", str(script.relative_to(ROOT)), *session.posargs)


@nox.session
def simulate(session: nox.Session) -> None:
    """``python -m resilient simulate`` with the arguments after ``--``."""
    _install(session, extras="[plot]")
    # nox runs a session in this file's folder: run the simulator where nox
    # was invoked, so that a relative --plot path is the caller's.
    session.chdir(session.invoked_from)
    session.run("python", "-m", "resilient", "simulate", *session.posargs)


if __name__ == "__main__":
    if not any(a in {"-f", "--noxfile"} for a in sys.argv[1:]):
        # nox.main() reads sys.argv; point it at this very file.
        sys.argv[1:1] = ["-f", str(Path(__file__).resolve())]
    nox.main()
