"""
Every notebook in ``notebooks/`` runs headless, without error, and the
simulator figures it prints agree with the simulator and its command line.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from resilient import __main__ as cli
from resilient import simulation as sim


nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
COMMAND = "$ python -m resilient simulate"
TIMEOUT = 300


def executed(path: Path) -> Any:
    """*path* run top to bottom in a fresh python3 kernel, headless."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name="python3",  # jupyter_client starts sys.executable
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return nb


def printed(nb: Any) -> str:
    """Everything the notebook's code cells printed to stdout."""
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "stream" and out.name == "stdout"
    )


def summaries(text: str) -> list[tuple[list[str], str]]:
    """
    The ``$ python -m resilient simulate ...`` lines a notebook printed, as
    CLI arguments, each with the block of figures printed under it.
    """
    blocks: list[tuple[list[str], str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(COMMAND):
            continue
        argv = shlex.split(line)[5:]
        body: list[str] = []
        for following in lines[i + 1 :]:
            if not following.strip() or following.startswith("$"):
                break
            body.append(following)
        blocks.append((argv, "\n".join(body)))
    return blocks


def notebooks() -> list[Path]:
    """Every notebook in ``notebooks/``."""
    return sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.notebook
@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.name)
def test_notebook_runs_and_agrees_with_the_simulator(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """
    The notebook runs headless without an error output, and every block of
    simulator figures it prints is exactly what `simulate` and
    ``python -m resilient simulate`` give for the command it printed.
    """
    nb = executed(path)
    for cell in nb.cells:
        if cell.cell_type == "code":
            kinds = [out.output_type for out in cell.get("outputs", [])]
            assert "error" not in kinds, cell.source
    blocks = summaries(printed(nb))
    pngs = [
        out
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]
    if path.name == "backoff_spread.ipynb":
        strategies = [a for argv, _ in blocks for a in argv if "strategy" in a]
        assert strategies == [
            "--strategy=full",
            "--strategy=equal",
            "--strategy=decorrelated",
            "--strategy=exponential",
        ]
        assert len(pngs) == 3
    if path.name == "breaker_budget.ipynb":
        # (breaker, retry budget, steady traffic) of each printed run.
        guards = [
            (
                "--breaker" in argv,
                "--retry-budget" in argv,
                any(a.startswith("--rate=") for a in argv),
            )
            for argv, _ in blocks
        ]
        assert guards == [
            (False, False, True),
            (False, True, True),
            (True, False, True),
            (True, True, True),
            (True, True, False),
        ]
        for (breaker, budget, _), (_, body) in zip(
            guards, blocks, strict=True
        ):
            assert ("breaker states" in body) == breaker
            assert ("retry budget       allowed" in body) == budget
        assert len(pngs) == 3
    for argv, body in blocks:
        args = cli.parser().parse_args(["simulate", *argv])
        result = sim.simulate(cli.config_from_args(args))
        assert body == sim.render_summary(result)
        capsys.readouterr()
        assert cli.main(["simulate", *argv, "--ascii"]) == 0
        assert body in capsys.readouterr().out


def test_the_notebooks_are_stored_without_outputs() -> None:
    """
    Notebooks are committed with their outputs cleared, so that diffs show
    only what a person wrote and nothing stale is shown as a result.
    """
    assert notebooks()
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [], path.name
                assert cell.execution_count is None, path.name


def test_summaries_reads_commands_and_their_figures() -> None:
    """
    The parser of printed output pairs each command with the lines under
    it, up to a blank line or the next command.
    """
    text = (
        "intro\n"
        f"{COMMAND} --clients=5 --seed=1\n"
        "calls 5\n"
        "succeeded 5\n"
        "\n"
        f"{COMMAND} --strategy=full\n"
        "calls 1\n"
    )
    assert summaries(text) == [
        (["--clients=5", "--seed=1"], "calls 5\nsucceeded 5"),
        (["--strategy=full"], "calls 1"),
    ]
