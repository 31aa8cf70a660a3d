"""No thread, child process or temporary file outlives its owner: a notebook run twice in one
kernel (as a learner re-runs it) leaves no kit thread or child behind."""

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers._internal import jaxcompat

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"

COUNT = """
import json, threading, psutil
kit = sorted(t.name for t in threading.enumerate()
             if t.name.startswith(("helpers-batches", "helpers.widgets", "helpers.memory")))
children = [p.pid for p in psutil.Process().children(recursive=True)]
print(json.dumps({"threads": kit, "children": children}))
"""


def _run_twice_then_count(name: str, tmp_path) -> dict:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    copies = [nbformat.v4.new_code_cell(c.source, metadata=c.metadata) for c in cells * 2]
    twice = nbformat.v4.new_notebook(cells=[*copies, nbformat.v4.new_code_cell(COUNT)],
                                     metadata=nb.metadata)
    # errors fail the test, except in cells tagged raises-exception (nbclient's own rule)
    client = NotebookClient(twice, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(cwd=str(NOTEBOOKS))
    ran = [c.execution_count for c in twice.cells]
    assert ran == list(range(1, len(twice.cells) + 1)), "not every cell ran"
    out = twice.cells[-1].outputs
    text = "".join(o.get("text", "") for o in out if o.get("name") == "stdout")
    assert text, f"the counting cell printed nothing: {out}"
    return json.loads(text.strip().splitlines()[-1])


# 07 makes prefetching iterators. (02 and 11 cannot yet run twice in one kernel: cells that
# measure "what this array added" count the array of the previous run going away.)
@pytest.mark.parametrize("name", ["07_feeding_the_accelerator.ipynb"])
def test_a_notebook_run_twice_in_one_kernel_leaves_no_thread_or_child(name, tmp_path):
    if jaxcompat.jax_version_tuple() < (0, 10):  # make test-floor: unit tests only
        pytest.skip("notebooks run on the newest jax only; jax 0.8 refuses the setup cell's "
                    "jax_num_cpu_devices once the first run started the backend")
    left = _run_twice_then_count(name, tmp_path)
    assert left == {"threads": [], "children": []}
