"""Committed notebooks read well before anyone runs them, and follow the kit's conventions."""

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.name)
def nb(request):
    return nbformat.read(request.param, as_version=4), request.param


def code_cells(notebook):
    return [c for c in notebook.cells if c.cell_type == "code"]


def test_name_is_numbered_snake_case(nb):
    _, path = nb
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), path.name


def test_outputs_committed_with_counts_in_order(nb):
    notebook, _ = nb
    counts = [c.execution_count for c in code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), (
        f"execution counts {counts}: re-run with `make notebooks` (Restart & Run All)")
    assert any(c.outputs for c in code_cells(notebook)), "no outputs committed"


def test_errors_only_where_tagged(nb):
    notebook, _ = nb
    for cell in code_cells(notebook):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        tagged = "raises-exception" in cell.metadata.get("tags", [])
        assert not errors or tagged, f"untagged error in cell: {cell.source[:80]!r}"
        if tagged:
            assert errors, f"cell tagged raises-exception did not raise: {cell.source[:80]!r}"


def test_claims_are_asserted(nb):
    notebook, _ = nb
    asserts = sum(len(re.findall(r"^\s*assert\b", c.source, re.M)) for c in code_cells(notebook))
    assert asserts >= 1


def test_skeleton(nb):
    notebook, _ = nb
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert "What you'll learn" in first.source and "Runs on" in first.source
    headings = [ln for c in notebook.cells if c.cell_type == "markdown"
                for ln in c.source.splitlines() if ln.startswith("## ")]
    assert "## Summary" in headings and "## Next" in headings


def test_no_machine_paths_or_random_widget_ids_in_outputs(nb):
    notebook, _ = nb
    for cell in code_cells(notebook):
        for out in cell.outputs:
            text = str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
            assert "/home/" not in text and "/work/" not in text and "/root/" not in text, (
                f"machine-specific path in output of {cell.source[:60]!r}")
            assert "image/svg+xml" not in out.get("data", {}), "figures are PNG"


def test_setup_before_first_jax_operation(nb):
    """jax_num_cpu_devices, if used in the kernel, is set in the setup cell, before any other JAX
    call (cells that only pass it to a child process do not count)."""
    notebook, _ = nb
    sources = [c.source for c in code_cells(notebook) if "subprocess.run(" not in c.source]
    where = [i for i, s in enumerate(sources) if "jax_num_cpu_devices" in s]
    if where:
        first = where[0]
        assert all("jax.devices(" not in s and "jnp." not in s for s in sources[:first])
