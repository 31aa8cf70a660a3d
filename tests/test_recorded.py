import json
import re
from pathlib import Path

import pytest

from helpers import recorded
from helpers.errors import BadInputError

ROOT = Path(__file__).resolve().parent.parent


def _notebook(cells):
    return {"cells": [{"cell_type": "code", "id": i, "source": [src], "outputs": out,
                       "metadata": {}, "execution_count": None} for i, src, out in cells],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def tree(tmp_path):
    """A fake repository: one GPU run with a copy of nb "01_x", today's 01_x and 02_y."""
    runs, nbs = tmp_path / "docs" / "gpu-runs", tmp_path / "notebooks"
    (runs / "2026-01-02-gpu").mkdir(parents=True)
    nbs.mkdir()
    (runs / "2026-01-02-gpu.json").write_text(json.dumps(
        {"date": "2026-01-02", "gpu": {"name": "NVIDIA Fake 8GB", "driver": "1"},
         "versions": {"jax": "9.9"}, "steps": {"allocation": {"data": {"total_bytes": 8}}}}))
    said = [{"output_type": "stream", "name": "stdout", "text": ["fast: 50 GB/s\n"]}]
    (runs / "2026-01-02-gpu" / "01_x.ipynb").write_text(json.dumps(_notebook(
        [("a", "print('fast')", said), ("b", "x = 1", [])])))
    (nbs / "01_x.ipynb").write_text(json.dumps(_notebook(
        [("a", "print('fast')", []), ("b", "x = 2", []), ("c", "new", [])])))
    (nbs / "02_y.ipynb").write_text(json.dumps(_notebook([("a", "y", [])])))
    return runs, nbs


def test_a_recorded_cell_is_labelled_and_says_whether_its_code_changed(tree):
    runs, nbs = tree
    got = recorded.cell("01_x", "a", folder=runs, notebooks=nbs)
    assert got.text == "fast: 50 GB/s" and got.same_code
    assert str(got).startswith("recorded on NVIDIA Fake 8GB, 2026-01-02, jax 9.9:")
    changed = recorded.cell("01_x", "b", folder=runs, notebooks=nbs)
    assert not changed.same_code and "has changed since" in str(changed)
    assert recorded.cell("01_x", "zz", folder=runs, notebooks=nbs) is None
    assert recorded.cell("02_y", "a", folder=runs, notebooks=nbs) is None  # no copy


def test_a_recorded_step_comes_with_its_run(tree):
    runs, _ = tree
    run, data = recorded.step("allocation", folder=runs)
    assert data == {"total_bytes": 8} and run.gpu == "NVIDIA Fake 8GB"
    assert recorded.step("never-run", folder=runs) is None


def test_staleness_counts_changed_and_new_cells(tree):
    runs, nbs = tree
    rows = {s.notebook: s for s in recorded.staleness(runs, nbs)}
    assert rows["01_x"].changed == ("b",) and rows["01_x"].missing == ("c",)
    assert rows["01_x"].same == 1 and not rows["01_x"].current
    assert rows["02_y"].run is None and "no GPU-executed copy" in str(rows["02_y"])


def test_a_copy_that_failed_on_the_gpu_is_not_current(tree):
    # the 2026-11-26 run: notebook 09 failed at its 16th cell with unchanged code; its copy shows
    # the cells after it unrun, so it must be run again, whatever its code
    runs, nbs = tree
    (nbs / "01_x.ipynb").write_text((runs / "2026-01-02-gpu" / "01_x.ipynb").read_text())
    record = json.loads((runs / "2026-01-02-gpu.json").read_text())
    assert {s.notebook: s for s in recorded.staleness(runs, nbs)}["01_x"].current
    record["steps"]["notebooks"] = {"notebooks": {"01_x.ipynb": {"status": "failed"}}}
    (runs / "2026-01-02-gpu.json").write_text(json.dumps(record))
    row = {s.notebook: s for s in recorded.staleness(runs, nbs)}["01_x"]
    assert not row.current and row.status == "failed" and not row.changed
    assert str(row) == "01_x: stale: it failed on 2026-01-02-gpu"


def test_a_recorded_benchmark_is_read_wherever_the_caller_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a kernel started elsewhere (JupyterLab, a test's copy)
    result = recorded.benchmark("feeding")
    assert result["benchmark"] == "feeding" and result["rows"]
    with pytest.raises(BadInputError, match="no recorded benchmark 'nope'"):
        recorded.benchmark("nope")


def test_no_runs_folder_means_no_runs(tmp_path):
    assert recorded.runs(tmp_path / "absent") == () and recorded.latest_run(tmp_path) is None


def test_a_corrupt_record_is_a_clear_error(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(BadInputError, match="cannot read .*broken.json"):
        recorded.runs(tmp_path)
    (tmp_path / "broken.json").write_text("[]")
    with pytest.raises(BadInputError, match="broken.json is not a JSON object"):
        recorded.runs(tmp_path)


def test_a_record_with_missing_or_null_parts_still_reads(tmp_path):
    (tmp_path / "2026-01-01-x.json").write_text(json.dumps(
        {"date": "2026-01-01", "gpu": None, "steps": {"allocation": None}}))
    (run,) = recorded.runs(tmp_path)
    assert run.gpu == "?" and run.jax == "?"
    assert recorded.step("allocation", folder=tmp_path) is None


def test_a_notebook_copy_without_cells_is_a_clear_error(tree):
    runs, nbs = tree
    (runs / "2026-01-02-gpu" / "01_x.ipynb").write_text("{}")
    with pytest.raises(BadInputError, match="01_x.ipynb is not a JSON object with a list 'cells'"):
        recorded.cell("01_x", "a", folder=runs, notebooks=nbs)


def test_the_readme_says_which_gpu_copies_are_current():
    line = re.search(r"\*\*GPU copies current:\*\* ([^.]+)\.", (ROOT / "README.md").read_text())
    assert line, "README.md lost its 'GPU copies current:' line"
    said = set() if line.group(1) == "none" else {
        n.strip() for n in line.group(1).split(",")}
    assert said == {s.notebook for s in recorded.staleness() if s.current}
