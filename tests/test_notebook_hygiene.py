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
            assert not any(p in text for p in ("/home/", "/work/", "/root/", "/tmp/")), (
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


# --- budget and the strength of asserts (curriculum v2) ------------------------------------
MAX_CELLS = 35


def test_cell_budget(nb):
    notebook, path = nb
    assert len(notebook.cells) <= MAX_CELLS, (
        f"{path.name} has {len(notebook.cells)} cells; the budget is {MAX_CELLS}")


def test_numbers_run_in_order_and_next_links_the_following_notebook(nb):
    notebook, path = nb
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(1, len(NOTEBOOKS) + 1)), numbers
    nxt = next(c.source for c in notebook.cells[::-1]
               if c.cell_type == "markdown" and "## Next" in c.source)
    links = re.findall(r"\]\(([^)#]+)", nxt.split("## Next", 1)[1])
    following = [p.name for p in NOTEBOOKS if int(p.name[:2]) == int(path.name[:2]) + 1]
    if following:
        assert following[0] in links, f"{path.name}'s Next should link {following[0]}: {links}"
    for link in links:
        assert (path.parent / link).resolve().exists(), f"{path.name}: broken link {link}"


def _python(source: str) -> str:
    """A cell's source without IPython magics and shell escapes."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                     for ln in source.splitlines())


def _constant(node, literal_names=frozenset()) -> bool:
    """True when the expression reads nothing but literals (and names bound to literals)."""
    import ast

    for sub in ast.walk(node):
        if isinstance(sub, (ast.Call, ast.Attribute, ast.Subscript)):
            return False
        if isinstance(sub, ast.Name) and sub.id not in literal_names:
            return False
    return True


def weak_asserts(source: str) -> list[str]:
    """Asserts that cannot fail or only restate the cell: a literal, constants compared, a
    value compared with itself, or names just bound to literals in the same cell."""
    import ast

    tree = ast.parse(_python(source))
    literal_names = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and _constant(node.value) for t in node.targets if isinstance(t, ast.Name)}
    weak = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        same = (isinstance(test, ast.Compare) and len(test.comparators) == 1
                and ast.dump(test.left) == ast.dump(test.comparators[0]))
        if same or _constant(test, literal_names):
            weak.append(ast.unparse(test))
    return weak


def test_the_weak_assert_finder_finds_weak_asserts():
    assert weak_asserts("assert True") == ["True"]
    assert weak_asserts("assert 2 > 1") == ["2 > 1"]
    assert weak_asserts("x = f()\nassert x == x") == ["x == x"]
    assert weak_asserts("budget = 3\nneed = 4\nassert need > budget") == ["need > budget"]
    assert weak_asserts("x = f()\nassert x > 3") == []
    assert weak_asserts("%time y = g()\nassert y.committed") == []


def test_every_assert_can_fail(nb):
    notebook, path = nb
    found = [(i, w) for i, c in enumerate(notebook.cells) if c.cell_type == "code"
             for w in weak_asserts(c.source)]
    assert found == [], f"{path.name}: asserts that cannot fail (cell, test): {found}"


def test_no_stale_widget_state(nb):
    """Saved widget state belongs to widgets the notebook still makes (a progress bar from an old
    run once lingered in notebook 07's metadata)."""
    notebook, path = nb
    state = str(notebook.metadata.get("widgets", ""))
    makes_widgets = any("widgets" in c.source or "MemoryMonitor" in c.source
                        for c in code_cells(notebook))
    assert makes_widgets or not state, f"{path.name} keeps widget state for no widget"
    assert "writing " not in state, f"{path.name} keeps an old progress bar's state"
