"""scripts/gpu_check.py (make gpu-check): refuses at once without a GPU, records steps, keeps
failures verbatim. The GPU steps themselves run only on a GPU; here a fake nvidia-smi stands in
for the driver so the recording machinery can be tested."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("gpu_check", Path(REPO) / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def _script(*args, env=None):
    return subprocess.run([sys.executable, "scripts/gpu_check.py", *args], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300)


@pytest.fixture
def no_gpu_path(tmp_path):
    """A PATH without nvidia-smi (unless the machine really has one)."""
    if gpu_check.detect_gpus():
        pytest.skip("this machine has an NVIDIA GPU")
    return os.environ["PATH"]


@pytest.fixture
def fake_smi(tmp_path):
    """A stand-in nvidia-smi that reports one 24 GiB GPU (not a GPU: JAX still runs on CPU)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA Stand-in GPU, GPU-0000, 24576, 999.99'\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_make_gpu_check_exits_2_at_once_without_a_gpu(no_gpu_path):
    for extra in ([], ["GPU_NOVENV=1", f"PYTHON={sys.executable}"]):
        proc = subprocess.run(["make", "-s", "gpu-check", *extra], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "no NVIDIA GPU here" in proc.stderr
        assert "pip install" not in proc.stdout + proc.stderr  # nothing installed first


def test_unknown_step_is_refused():
    proc = _script("--steps", "tests,fly")
    assert proc.returncode == 2 and "unknown step(s) ['fly']" in proc.stderr


def test_a_step_is_recorded_as_json_and_markdown(fake_smi, tmp_path):
    out = tmp_path / "runs"
    proc = _script("--steps", "tests", "--out", str(out), env={"PATH": fake_smi})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (record_path,) = out.glob("*-nvidia-stand-in-gpu.json")
    record = json.loads(record_path.read_text())
    assert record["schema"] == "jax-device-kit/gpu-run/1"
    assert record["gpu"] == {"name": "NVIDIA Stand-in GPU", "driver": "999.99",
                             "memory_mib": 24576}
    assert record["versions"]["jax"]  # from the doctor
    step = record["steps"]["tests"]
    assert step["status"] == "passed" and "deselected" in step["pass_line"]
    assert record["commands"] == [record["command"]]  # each call of the day is kept
    assert record["command"].endswith(f"--steps tests --out {out}")
    md = record_path.with_suffix(".md").read_text()
    assert "| tests | passed |" in md and "NVIDIA Stand-in GPU" in md


def test_missing_notebook_packages_without_wheels_name_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "NEEDED", ("nbval", "no_such_module_for_the_test"))
    env, why = gpu_check.prepare_env(sys.executable, tmp_path / "empty", tmp_path / "site")
    assert "no_such_module_for_the_test" in why and "fetch_gpu_wheels.sh" in why
    assert str(gpu_check.REPO) in env["PYTHONPATH"]


def test_failures_are_kept_verbatim_in_the_markdown():
    record = {"date": "2026-11-22", "python": "python3", "command": "make gpu-check",
              "gpu": {"name": "G", "driver": "1", "memory_mib": 1},
              "steps": {"reproduce": {"status": "failed", "seconds": 3.0, "pass_line": None,
                                      "tail": ["Traceback ...", "ValueError: the exact text"]}}}
    md = gpu_check.render_markdown(record)
    assert "| reproduce | failed | 3.0 |" in md
    assert "## reproduce: failed" in md and "ValueError: the exact text" in md


@pytest.mark.parametrize("text, expected", [
    ("....\n12 passed, 3 deselected in 4.20s\n", "12 passed, 3 deselected in 4.20s"),
    ("== 1 failed, 2 passed in 1.0s ==", "1 failed, 2 passed in 1.0s"),
    ("no summary here", None)])
def test_pass_line(text, expected):
    assert gpu_check.pass_line(text) == expected


def test_wheel_script_names_the_packages_and_target():
    text = (Path(REPO) / "scripts" / "fetch_gpu_wheels.sh").read_text()
    for name in gpu_check.NEEDED:
        assert name in text
    assert "--python-version" in text and "manylinux" in text and "x86_64" in text


def test_the_record_renders_its_figures(tmp_path):
    """The .md shows the data each step kept: the OOM's text, each setting's predicted and
    measured limits with nvidia-smi's view, and the two-process rows."""
    m = {"ok": True, "bytes_limit": 3 * 2**30, "pool_bytes": 3 * 2**30,
         "driver_used_bytes": 4 * 2**30, "error": None,
         "predicted": {"reported_limit": 3 * 2**30}}
    record = {"date": "2026-01-01", "gpu": {"name": "G", "memory_mib": 4096, "driver": "1"},
              "python": "py", "command": "c", "steps": {
                  "reproduce": {"status": "passed", "data": [
                      {"fixed": False, "ok": False, "elapsed_s": 1.5, "budget_how": "F=0.1",
                       "error_message": "RESOURCE_EXHAUSTED: Out of memory", "landed_on": None}]},
                  "allocation": {"status": "passed", "data": {
                      "total_bytes": 4 * 2**30, "settings": {"default": m},
                      "pairs": {"default, default": [m, {**m, "ok": False,
                                                         "error": "RESOURCE_EXHAUSTED x"}]}}}}}
    text = gpu_check.render_markdown(record)
    assert "| seed load | False | 1.5 | F=0.1 | RESOURCE_EXHAUSTED: Out of memory |" in text
    assert "| default | 3.00 GiB | 3.00 GiB | 3.00 GiB | 4.00 GiB | True |" in text
    assert "| default, default | 2 |" in text and "RESOURCE_EXHAUSTED x" in text


def test_all_leaves_out_nbval_only_while_no_cell_is_compared(tmp_path):
    """nbval in lax mode compares only cells marked NBVAL_CHECK_OUTPUT; with none, it proves what
    the notebooks step proves (every cell runs), so `all` runs the notebooks once, not twice."""
    (tmp_path / "a.ipynb").write_text('{"cells": []}')
    assert "nbval" not in gpu_check.default_steps(tmp_path)
    assert gpu_check.default_steps(tmp_path)[0] == "notebooks"  # most wanted first
    (tmp_path / "b.ipynb").write_text('{"cells": [{"source": "# NBVAL_CHECK_OUTPUT"}]}')
    assert "nbval" in gpu_check.default_steps(tmp_path)
    # and the kit's own notebooks compare no output today, which is what `all` relies on
    assert "nbval" not in gpu_check.default_steps(Path(REPO) / "notebooks")


def _notebook(path, *sources):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbformat.write(nb, path)


def test_notebooks_run_one_by_one_and_a_rerun_keeps_the_others(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    _notebook(books / "01_fine.ipynb", "x = 1 + 1", "assert x == 2")
    _notebook(books / "02_broken.ipynb", "y = 3", "assert y == 4, 'the claim is false'",
              "print('stale')")
    stale = json.loads((books / "02_broken.ipynb").read_text())  # as the CPU run left it
    stale["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout",
                                     "text": ["a CPU output\n"]}]
    (books / "02_broken.ipynb").write_text(json.dumps(stale))
    saved = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = gpu_check.run_notebooks(sys.executable, env, tmp_path / "copies", notebooks=books,
                                    save=saved.append,  # a deadline leaves a fraction of a s
                                    deadline=gpu_check.time.monotonic() + 600.5)
    assert first["status"] == "failed" and len(saved) == 2  # saved after each notebook
    assert first["notebooks"]["01_fine.ipynb"]["status"] == "passed"
    broken = first["notebooks"]["02_broken.ipynb"]
    assert broken["status"] == "failed" and "the claim is false" in "\n".join(broken["tail"])
    copy = json.loads((tmp_path / "copies" / "02_broken.ipynb").read_text())
    assert copy["cells"][1]["outputs"][0]["output_type"] == "error"  # it shows the failure
    assert copy["cells"][2]["outputs"] == []  # and no output it did not make (the 11-26 run had)
    # the fix, then a rerun of that notebook alone: the other's entry is kept
    _notebook(books / "02_broken.ipynb", "y = 4", "assert y == 4")
    again = gpu_check.run_notebooks(sys.executable, env, tmp_path / "copies", notebooks=books,
                                    only=("02",), earlier=first)
    assert again["status"] == "passed" and set(again["notebooks"]) == set(first["notebooks"])
    assert again["notebooks"]["01_fine.ipynb"] == first["notebooks"]["01_fine.ipynb"]


def test_a_spent_deadline_runs_nothing_and_says_so(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    _notebook(books / "01_fine.ipynb", "x = 1")
    spent = gpu_check.time.monotonic() + 5  # under MIN_STEP_SECONDS left
    result = gpu_check.run_notebooks(sys.executable, dict(os.environ), tmp_path / "copies",
                                     notebooks=books, deadline=spent)
    assert result["status"] == "not run"
    assert "deadline" in result["notebooks"]["01_fine.ipynb"]["tail"][0]
    assert not (tmp_path / "copies").exists()


def test_a_step_past_the_deadline_is_not_run_and_the_call_says_incomplete(fake_smi, tmp_path):
    out = tmp_path / "runs"
    proc = _script("--steps", "tests", "--deadline", "10", "--out", str(out),
                   env={"PATH": fake_smi})
    assert proc.returncode == 1 and "not run" in proc.stdout
    assert not list(out.glob("*.json"))  # nothing ran, so nothing is recorded as run


def test_stale_selects_the_notebooks_whose_gpu_copy_is_not_current(fake_smi, tmp_path):
    # a runs folder of its own: one record whose copy of notebook 01 is current and passed,
    # so every other notebook is stale (no copy), and 01 too once the run says it failed
    out = tmp_path / "runs"
    first = sorted((Path(REPO) / "notebooks").glob("*.ipynb"))[0]
    (out / "2026-01-02-gpu").mkdir(parents=True)
    (out / "2026-01-02-gpu" / first.name).write_text(first.read_text())
    record = {"date": "2026-01-02", "gpu": {"name": "NVIDIA Fake"}, "steps": {"notebooks": {
        "notebooks": {first.name: {"status": "passed"}}}}}
    (out / "2026-01-02-gpu.json").write_text(json.dumps(record))
    others = [p.stem for p in sorted((Path(REPO) / "notebooks").glob("*.ipynb"))[1:]]

    def stale_listed():
        proc = _script("--steps", "notebooks", "--notebooks", "stale", "--deadline", "10",
                       "--out", str(out), env={"PATH": fake_smi})  # too little time: none runs
        line = next(x for x in proc.stdout.splitlines() if "stale notebooks:" in x)
        return line.split("stale notebooks: ")[1].split(", ")

    assert stale_listed() == others
    record["steps"]["notebooks"]["notebooks"][first.name]["status"] = "failed"
    (out / "2026-01-02-gpu.json").write_text(json.dumps(record))
    assert stale_listed() == [first.stem, *others]
    (listed,) = [r for r in out.glob("*-nvidia-stand-in-gpu.json")]
    assert sorted(json.loads(listed.read_text())["steps"]["notebooks"]["notebooks"]) == [
        f"{n}.ipynb" for n in [first.stem, *others]]  # recorded "not run", those alone


def test_the_script_finds_the_kit_where_it_is_not_installed(no_gpu_path):
    # as on a lent GPU machine: `python3 scripts/gpu_check.py` with the kit not installed
    # (-S: no site-packages, so no editable install); on the H100 (2026-11-26) the stale list
    # failed with "No module named 'helpers'"
    proc = subprocess.run([sys.executable, "-S", "scripts/gpu_check.py", "--notebooks", "stale",
                           "--detect-only"], cwd=REPO, capture_output=True, text=True,
                          env={"PATH": no_gpu_path}, timeout=120)
    assert "No module named" not in proc.stderr, proc.stderr
    assert "stale notebooks:" in proc.stdout and proc.returncode == 2  # listed, then no GPU


def test_each_failed_notebook_is_shown_verbatim_under_its_name():
    record = {"date": "d", "python": "p", "command": "c",
              "gpu": {"name": "G", "driver": "1", "memory_mib": 1},
              "steps": {"notebooks": {"status": "failed", "seconds": 5.0, "notebooks": {
                  "01_a.ipynb": {"status": "passed", "seconds": 2.0, "tail": []},
                  "09_b.ipynb": {"status": "failed", "seconds": 3.0,
                                 "tail": ["AssertionError: c18 is false on a GPU"]}}}}}
    md = gpu_check.render_markdown(record)
    assert "| 01_a.ipynb | passed | 2.0 |" in md and "| 09_b.ipynb | failed | 3.0 |" in md
    assert "## 09_b.ipynb: failed" in md and "c18 is false on a GPU" in md
    assert "## 01_a.ipynb" not in md and "## notebooks" not in md


def test_a_notebook_selection_that_matches_nothing_is_refused():
    proc = _script("--steps", "notebooks", "--notebooks", "21")
    assert proc.returncode == 2 and "matches no notebook" in proc.stderr


def test_a_run_cut_off_by_the_deadline_is_not_run_not_failed():
    cut = gpu_check._cut_off({"status": "failed", "tail": ["[killed after 61 s]"]}, 124, True)
    assert cut["status"] == "not run" and "deadline" in cut["tail"][-1]
    own = gpu_check._cut_off({"status": "failed", "tail": []}, 124, False)  # its own timeout
    assert own["status"] == "failed"


def test_the_batch_step_can_run_some_budgets_only():
    every, _ = gpu_check.step_command("batch", "python3")
    some, _ = gpu_check.step_command("batch", "python3", "2 GiB,8 GiB")
    assert "--budgets" not in every and some[-2:] == ["--budgets", "2 GiB,8 GiB"]
