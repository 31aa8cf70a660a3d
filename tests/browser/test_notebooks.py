"""Every notebook, Restart & Run All in JupyterLab: no error output, no traceback on stderr,
every cell run in order, every widget rendered. Then proof that the check can fail."""

from __future__ import annotations

import nbformat
import pytest

from tests.browser import NOTEBOOKS
from tests.browser.driver import write_notebook

NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))  # whatever notebooks/ holds now


def test_there_are_notebooks():
    assert NAMES, f"no notebooks in {NOTEBOOKS}"


@pytest.mark.parametrize("name", NAMES)
def test_restart_and_run_all(run, name):
    problems, seconds = run(name)
    assert not problems, f"{name} after Restart & Run All ({seconds:.0f} s):\n" + "\n".join(
        problems)


def test_the_check_reports_errors_tracebacks_and_cells_not_run(run, lab):
    path = write_notebook(lab.notebooks, "fails.ipynb", [
        "import traceback\ntry:\n    {}['missing']\nexcept KeyError:\n    traceback.print_exc()",
        "1 / 0",
        "print('never runs: Run All stops at an error')",
    ])
    problems, _ = run(path)
    assert len(problems) == 3, problems
    assert "cell 1" in problems[0] and "traceback on stderr: KeyError" in problems[0]
    assert "cell 2" in problems[1] and "ZeroDivisionError" in problems[1]
    assert "cell 3" in problems[2] and "no execution count" in problems[2]


def test_an_error_tagged_raises_exception_is_intended(run, lab):
    path = write_notebook(lab.notebooks, "intended.ipynb", [
        "x = 1", ("1 / 0", ["raises-exception"]), "assert x == 1"])
    problems, _ = run(path)
    assert problems == []
    saved = nbformat.read(lab.notebooks / path, as_version=4)
    assert [c.execution_count for c in saved.cells] == [1, 2, 3]  # Run All went past it
    assert saved.cells[1].outputs[0].ename == "ZeroDivisionError"


def test_a_widget_that_cannot_render_is_reported(run, lab):
    path = write_notebook(lab.notebooks, "broken_widget.ipynb", [
        "from IPython.display import display\n"
        "view = {'model_id': 'no-such-model', 'version_major': 2, 'version_minor': 0}\n"
        "display({'application/vnd.jupyter.widget-view+json': view}, raw=True)"])
    problems, _ = run(path)
    assert any("widget did not render" in p for p in problems), problems
