"""What Restart & Run All must leave in a notebook, read from the file JupyterLab saved.

A cell tagged ``raises-exception`` shows an error on purpose (nbval and JupyterLab treat it the
same way: it may fail, and Run All goes on), so its outputs are not checked.
"""

from __future__ import annotations

INTENDED_ERROR_TAG = "raises-exception"
TRACEBACK = "Traceback (most recent call last)"


def _where(index: int, cell) -> str:
    lines = [ln for ln in cell.source.splitlines() if ln.strip() and "NBVAL_" not in ln]
    first = lines[0] if lines else ""
    return f"cell {index} ({first[:60]!r})"


def problems(nb) -> list[str]:
    """One line per problem: an error output or a traceback on stderr in a cell not tagged
    ``raises-exception``, a code cell without an execution count, counts out of order."""
    found, counts = [], []
    for index, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        counts.append(cell.execution_count)
        if cell.execution_count is None:
            found.append(f"{_where(index, cell)}: no execution count (it did not run)")
        if INTENDED_ERROR_TAG in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append(f"{_where(index, cell)}: error output "
                             f"{out.ename}: {out.evalue[:200]}")
            elif (out.output_type == "stream" and out.name == "stderr"
                  and TRACEBACK in out.text):
                found.append(f"{_where(index, cell)}: traceback on stderr: "
                             f"{out.text.strip().splitlines()[-1][:200]}")
    if None not in counts and counts != list(range(1, len(counts) + 1)):
        found.append(f"execution counts {counts} are not 1..{len(counts)} in order")
    return found
