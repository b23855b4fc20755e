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
