"""
The README's examples run as written: every ``python`` block, in order, in
one namespace (testing mode on, so the retries wait no real time).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import resilient.testing


README = Path(__file__).resolve().parent.parent / "README.md"


def blocks() -> list[str]:
    """The README's python code blocks."""
    text = README.read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_has_examples() -> None:
    """The tour is there (so the test below cannot pass vacuously)."""
    assert len(blocks()) >= 8


def test_readme_examples_run(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Every example runs, and what it prints is what the comments say."""
    # The lock example's embedded default, in this test's own directory.
    monkeypatch.setenv("RESILIENT_LOCK_URL", f"sqlite:///{tmp_path}/l.db")
    namespace: dict[str, object] = {"__name__": "readme"}
    with resilient.testing.set_testing(True):
        for block in blocks():
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    out = capsys.readouterr().out.splitlines()
    # The README shows a real run's note; in testing mode the waits are 0,
    # so only the format is checked, not the time.
    assert re.fullmatch(
        r"resilient: gave up on 'payments' after 2 attempts in \d+\.\d{3}s "
        r"\(attempts\)",
        out[0],
    )
    shown = re.search(r"# e\.g\. (resilient: gave up .*)", README.read_text())
    assert shown is not None
    assert re.fullmatch(
        r"resilient: gave up on 'payments' after 2 attempts in "
        r"0\.(?!000)\d{3}s \(attempts\)",
        shown.group(1),
    )
    assert out[1] == "BreakerState.CLOSED"
    assert out[2] == "True"
    assert re.fullmatch(r"\d{1,8}[HMSmun]", out[3])
    assert out[4].startswith("(")
    assert out[4].count(",") == 2


def _setup() -> str:
    """The README's set-up section."""
    text = README.read_text(encoding="utf-8")
    return text[text.index("## Set up") : text.index("## A short tour")]


def test_the_setup_names_the_pythons_and_sessions_ci_runs() -> None:
    """
    The set-up text is true of .ci/run: every session CI runs is named
    (``tests`` as the README's own command), the Pythons it names are the
    classifiers', and each Python but the first runs in ``tests_matrix``.
    """
    root = README.parent
    setup = " ".join(_setup().split())
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    first = re.findall(r"^run_session (\S+)$", ci, flags=re.MULTILINE)
    sessions = re.findall(r"^for session in (.*); do$", ci, flags=re.MULTILINE)
    beside = re.findall(r"^others=\((.*)\)$", ci, flags=re.MULTILINE)
    assert first == ["tests"]  # The README's command, first.
    assert sessions
    assert beside
    names = [*first, *sessions[0].split(), *beside[0].split()]
    assert "python3 noxfile.py -s tests " in setup
    for name in ("tests_lowest", "tests_matrix", "notebooks"):
        assert any(n.startswith(name) for n in names), name
        assert f"`{name}`" in setup or f"-s {name}`" in setup, name
    classifiers = re.findall(
        r'"Programming Language :: Python :: (3\.\d+)"',
        (root / "pyproject.toml").read_text(encoding="utf-8"),
    )
    assert classifiers == ["3.11", "3.12", "3.13"]
    assert f"on Python {classifiers[0]}, then" in setup
    others = " and ".join(classifiers[1:])
    assert f"on Python {others}" in setup
    assert sorted(n for n in names if n.startswith("tests_matrix-")) == [
        f"tests_matrix-{v}" for v in classifiers[1:]
    ]
    for path in ("constraints/tools.txt", "constraints/lowest.txt"):
        assert f"`{path}`" in setup
        assert (root / path).is_file()


def test_the_notebooks_are_said_to_run_apart() -> None:
    """
    The README does not say the test command runs the notebooks (the
    ``tests`` session deselects them); it names their own session.
    """
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "the test suite runs them" not in text
    assert "The notebooks are not part of it" in text
    noxfile = (README.parent / "noxfile.py").read_text(encoding="utf-8")
    assert '_SUITE = "not notebook and not storm"' in noxfile
