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

import json
import logging
import os
import re
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
                "-c",
                str(ROOT / "constraints" / "tools.txt"),
                "nox",
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
    import nox.command
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


CONSTRAINTS = ROOT / "constraints"
TOOLS = CONSTRAINTS / "tools.txt"
"""The tools' pinned versions (linters, type checkers, test runner, docs,
benchmark peers and what they pull in), for every session: a check gives
the same verdict today and next month. Written by ``nox -s constraints``."""
LOWEST = CONSTRAINTS / "lowest.txt"
"""The runtime libraries at the lowest versions pyproject.toml declares,
for `tests_lowest`. Written by ``nox -s constraints`` from pyproject."""

RUNTIME = (
    "anyio",
    "attrs",
    "httpx",
    "matplotlib",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "psycopg",
    "redis",
    "requests",
    "sniffio",
    "trio",
)
"""The libraries the package runs on or integrates with: never pinned in
`TOOLS` (the sessions test their newest release), pinned at their lowest
declared version in `LOWEST`."""

EXTRAS = "[otel,trio,redis,postgres]"
"""The extras the test sessions install (plot is the notebooks')."""


def _install(
    session: nox.Session,
    *groups: str,
    extras: str = "",
    lowest: bool = False,
    project: bool = True,
) -> None:
    """
    Install the project (with *extras*; unless not *project*) and the
    dependency *groups*, the tools at their `TOOLS` pins (and, if *lowest*,
    the runtime libraries at their `LOWEST` pins; else at their newest
    release).
    """
    pins = ["-c", str(TOOLS)]
    if lowest:
        pins += ["-c", str(LOWEST)]
    this = [f".{extras}"] if project else []
    session.install(*pins, *this, *_group(*groups))


def _normal(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
    """The distribution name *requirement* starts with."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return match.group(0) if match else requirement


def lower_bounds(pyproject: dict[str, Any]) -> dict[str, str]:
    """
    The lowest version pyproject declares of each `RUNTIME` library: the
    ``>=`` bound of its requirements in ``[project]`` (dependencies and
    extras) and in the ``tests`` group, which must agree.

    Raises:
        ValueError: A library with no bound, or with bounds that disagree.
    """
    from packaging.requirements import Requirement

    project = pyproject["project"]
    lines = [
        *project.get("dependencies", ()),
        *(
            r
            for rs in project.get("optional-dependencies", {}).values()
            for r in rs
        ),
        *pyproject["dependency-groups"]["tests"],
    ]
    found: dict[str, set[str]] = {}
    for line in lines:
        req = Requirement(line)
        name = _normal(req.name)
        if name not in RUNTIME:
            continue
        bounds = {s.version for s in req.specifier if s.operator == ">="}
        if len(bounds) != 1:
            raise ValueError(f"pyproject.toml: {line!r} needs one >= bound")
        found.setdefault(name, set()).update(bounds)
    missing = sorted(set(RUNTIME) - found.keys())
    if missing:
        raise ValueError(f"pyproject.toml: no lower bound for {missing}")
    for name, bounds in found.items():
        if len(bounds) > 1:
            raise ValueError(
                f"pyproject.toml: {name} has lower bounds {sorted(bounds)}"
            )
    return {name: bounds.pop() for name, bounds in sorted(found.items())}


def lowest_constraints(pyproject: dict[str, Any]) -> str:
    """The text of `LOWEST` for *pyproject*."""
    pins = [f"{n}=={v}" for n, v in lower_bounds(pyproject).items()]
    return (
        "# The runtime libraries at the lowest versions pyproject.toml\n"
        "# declares: `python3 noxfile.py -s tests_lowest` runs the suite on\n"
        "# them. Written by `python3 noxfile.py -s constraints`; a test\n"
        "# (tests/test_noxfile.py) checks that it agrees with pyproject.\n"
        + "".join(f"{pin}\n" for pin in pins)
    )


def _pytest_args(session: nox.Session, default: str) -> list[str]:
    """pytest's arguments: the session's own, else ``-m`` *default*."""
    args = list(session.posargs)
    if "-m" not in args:
        args = ["-m", default, *args]
    return args


# Notebooks start Jupyter kernels; their own session runs them. The storms
# of asynchronous exceptions run in a pytest of their own, outside
# coverage: its tracer loses some of them.
_SUITE = "not notebook and not storm"


#: What pytest's exit statuses mean (pytest.ExitCode).
PYTEST_STATUS = {
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}


class _Steps:
    """
    Runs a session's steps to the end even when one fails, so that a failed
    test still leaves the coverage report and the storms to run; then fails
    the session naming each failed step and what its status means.
    """

    def __init__(self, session: nox.Session) -> None:
        self.session = session
        self.failed: list[str] = []

    def run(self, *args: str, **kwargs: Any) -> None:
        """Run a command; a failure is recorded, not raised."""
        try:
            self.session.run(*args, **kwargs)
        except nox.command.CommandFailed as exc:
            code = exc.return_code
            said = f"`{' '.join(args)}` exited {code}"
            if "pytest" in args and code in PYTEST_STATUS:
                said += f" ({PYTEST_STATUS[code]})"
            self.failed.append(said)

    def end(self) -> None:
        """Fail the session if a step failed."""
        if self.failed:
            self.session.error("; ".join(self.failed))


def _run_tests(session: nox.Session) -> None:
    _install(session, "tests", extras=EXTRAS)
    args = _pytest_args(session, _SUITE)
    steps = _Steps(session)
    session.run("coverage", "erase")
    steps.run("coverage", "run", "-m", "pytest", *args)
    session.run("coverage", "combine", success_codes=[0, 1])
    if session.posargs:
        # A subset of the tests cannot reach the bar; report only.
        session.run("coverage", "report")
    else:
        steps.run("coverage", "report", "--fail-under=95")
        steps.run("pytest", "-m", "storm")
    steps.end()


@nox.session
def tests(session: nox.Session) -> None:
    """
    The test suite under coverage, then the storms (README's command).

    On the interpreter running nox, the runtime libraries at their newest
    release.

    Arguments after ``--`` go to pytest (and then coverage is reported, not
    enforced). A failed test does not stop the coverage check or the
    storms; the session fails at the end, naming what failed. REDIS_URL,
    DATABASE_URL and RESILIENT_REQUIRE_SERVICES pass through from the
    environment.
    """
    _run_tests(session)


@nox.session(python=PYTHONS)
def tests_matrix(session: nox.Session) -> None:
    """
    The test suite on each Python of the classifiers, without coverage.

    ``-s tests_matrix-3.13`` runs one. Coverage is measured once, in
    `tests`; the tests marked ``slow`` (multi-process faults, a server
    clock jump: real time, and no code a Python version changes) run only
    there. The storms and injection sweeps run here too.
    """
    _install(session, "tests", extras=EXTRAS)
    steps = _Steps(session)
    steps.run("pytest", *_pytest_args(session, f"{_SUITE} and not slow"))
    if not session.posargs:
        steps.run("pytest", "-m", "storm")
    steps.end()


@nox.session(python=PYTHONS[0])
def tests_lowest(session: nox.Session) -> None:
    """
    The test suite on the lowest versions pyproject.toml declares.

    The runtime libraries (`RUNTIME`) at their `LOWEST` pins, on the oldest
    Python (some of those releases predate the newest Pythons); without
    coverage, and without the tests marked ``slow`` (as `tests_matrix`:
    CI runs the three suites side by side, and the fault tests that kill
    and restart throwaway servers did not start them in time there).
    """
    if LOWEST.read_text(encoding="utf-8") != lowest_constraints(PYPROJECT):
        session.error(
            f"{LOWEST.relative_to(ROOT)} disagrees with pyproject.toml: "
            "run python3 noxfile.py -s constraints"
        )
    _install(session, "tests", extras=EXTRAS, lowest=True)
    session.run("pytest", *_pytest_args(session, f"{_SUITE} and not slow"))


@nox.session
def constraints(session: nox.Session) -> None:
    """
    Rewrite constraints/: lowest.txt and tools.txt.

    `LOWEST` from pyproject's lower bounds; `TOOLS` from the newest release
    of every tool the groups name (and what they pull in), leaving out the
    runtime libraries and what they pull in.
    """
    LOWEST.write_text(lowest_constraints(PYPROJECT), encoding="utf-8")
    groups = PYPROJECT["dependency-groups"]
    tools = [r for g in groups for r in _group(g)]
    extras = [f".[{','.join(PYPROJECT['project']['optional-dependencies'])}]"]
    everything = _resolve(session, "all", [*extras, *tools, "nox"])
    # As the tests group names them (psycopg[binary] brings psycopg-binary).
    named = [r for r in _group("tests") if _normal(_name(r)) in RUNTIME]
    runtime = _resolve(session, "runtime", [*extras, *RUNTIME, *named])
    pins = sorted(
        f"{name}=={version}"
        for name, version in everything.items()
        if name not in runtime and name not in RUNTIME
    )
    TOOLS.write_text(
        "# The tools' versions for every nox session (passed with -c):\n"
        "# linters, type checkers, test runner, docs, benchmark peers and\n"
        "# what they pull in; never a runtime library or what it pulls in\n"
        "# (noxfile.RUNTIME: the sessions test their newest release).\n"
        "# Written by `python3 noxfile.py -s constraints`.\n"
        + "".join(f"{pin}\n" for pin in pins),
        encoding="utf-8",
    )


def _resolve(
    session: nox.Session, label: str, requirements: list[str]
) -> dict[str, str]:
    """What pip would install for *requirements* (newest releases)."""
    report = Path(session.create_tmp()) / f"{label}.json"
    session.run(
        "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        *requirements,
    )
    items = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {
        _normal(i["metadata"]["name"]): i["metadata"]["version"]
        for i in items
        if _normal(i["metadata"]["name"]) != "resilient"
    }


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
    session.run("pyright", "tests/typing/api.py")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and codespell."""
    _install(session, "lint", project=False)
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
        session.install("-c", str(TOOLS), "sphinx-autobuild")
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
