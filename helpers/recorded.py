"""What a real GPU showed: the runs recorded in ``docs/gpu-runs/``, read back for a machine that
has no GPU, and always labelled as recorded, never as this machine's.

A GPU run (``make gpu-check``) leaves ``docs/gpu-runs/<date>-<gpu>.json`` (the machine, the
versions, each step) and, in a folder of the same name, GPU-executed copies of the notebooks.
A notebook's GPU-only cell shows, where there is no GPU, the output that the same cell (same
cell id) printed on the GPU, with where and when, and whether the cell's code has changed since
(:attr:`RecordedCell.same_code`). :func:`staleness` compares every copy with today's notebook.

>>> run = latest_run()
>>> run is None or run.gpu.startswith("NVIDIA")
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from helpers._internal.records import Display
from helpers.errors import BadInputError

__all__ = ["RUNS_DIR", "GpuRun", "RecordedCell", "Staleness", "benchmark", "cell", "latest_run",
           "runs", "staleness", "step"]

#: the repository's folder of recorded GPU runs (the kit is used from its repository)
RUNS_DIR = Path(__file__).resolve().parent.parent / "docs" / "gpu-runs"
NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
#: the repository's recorded benchmark results (``make bench``)
BENCHMARKS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


@dataclass(frozen=True)
class GpuRun(Display):
    """One recorded GPU run: which card, when, with which JAX, and where its files are."""

    name: str  # the record's file stem, e.g. "2026-11-22-nvidia-h100-80gb-hbm3"
    date: str
    gpu: str
    driver: str
    jax: str
    notebooks: tuple[str, ...]  # notebook stems with a GPU-executed copy

    @property
    def label(self) -> str:
        """"recorded on <GPU>, <date>, jax <version>": how every recorded number is shown."""
        return f"recorded on {self.gpu}, {self.date}, jax {self.jax}"


@dataclass(frozen=True)
class RecordedCell(Display):
    """The text a notebook cell printed on a recorded GPU run. ``same_code``: the cell's code
    then equals today's (False: it has changed since, so the output may not match it)."""

    notebook: str
    cell_id: str
    run: GpuRun
    text: str
    same_code: bool


@dataclass(frozen=True)
class Staleness(Display):
    """One notebook against its GPU-executed copy: code cells the same, changed, or with no
    copy at all (new since the run). ``current``: every code cell is the same, and the run did
    not record the notebook failing (a copy that stopped at a failed cell shows the rest
    unrun)."""

    notebook: str
    run: str | None  # the run whose copy was compared (None: no copy)
    same: int
    changed: tuple[str, ...]  # cell ids whose code differs
    missing: tuple[str, ...]  # cell ids the copy does not have
    status: str | None = None  # the run's word for it: "passed", "failed"...; None: not recorded

    @property
    def current(self) -> bool:
        return (self.run is not None and not self.changed and not self.missing
                and self.status in (None, "passed"))


def _read(path: Path, *, needs: str | None = None) -> dict:
    """A JSON object from ``path`` (with the key ``needs``, if given), or a clear error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BadInputError(f"cannot read {path.parent.name}/{path.name}: {err}") from err
    if not isinstance(data, dict) or (needs is not None and not isinstance(data.get(needs), list)):
        what = f"a JSON object with a list {needs!r}" if needs else "a JSON object"
        raise BadInputError(f"{path.parent.name}/{path.name} is not {what}: is it a GPU run "
                            "record (make gpu-check) or a notebook?")
    return data


def _field(data: dict, *keys: str) -> object:
    """data[k1][k2]...; None where a level is missing or not an object (a hand-edited file)."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _records(folder: Path) -> list[tuple[GpuRun, dict]]:
    """Every run record in ``folder`` with its data, newest first, each file read once."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        data = _read(path)
        copies = folder / path.stem
        found.append((GpuRun(
            name=path.stem, date=str(_field(data, "date") or "?"),
            gpu=str(_field(data, "gpu", "name") or "?"),
            driver=str(_field(data, "gpu", "driver") or "?"),
            jax=str(_field(data, "versions", "jax") or "?"),
            notebooks=tuple(sorted(p.stem for p in copies.glob("*.ipynb")))), data))
    return sorted(found, key=lambda rd: (rd[0].date, rd[0].name), reverse=True)


def runs(folder: Path | str | None = None) -> tuple[GpuRun, ...]:
    """Every recorded GPU run in ``folder`` (default ``docs/gpu-runs``), newest first; empty
    where the folder is missing (the kit installed without its repository)."""
    return tuple(run for run, _ in _records(Path(folder) if folder is not None else RUNS_DIR))


def latest_run(folder: Path | str | None = None) -> GpuRun | None:
    """The newest recorded GPU run, or None."""
    found = runs(folder)
    return found[0] if found else None


def benchmark(name: str, *, folder: Path | str | None = None) -> dict:
    """The recorded result of ``benchmarks/<name>.py`` (``benchmarks/results/<name>.json``):
    medians measured side by side, with the machine and the date, wherever the caller runs."""
    folder = Path(folder) if folder is not None else BENCHMARKS_DIR
    path = folder / f"{name}.json"
    if not path.exists():
        raise BadInputError(f"no recorded benchmark {name!r} in {folder.name}/ (run `make bench`)")
    return _read(path)


def step(name: str, *, folder: Path | str | None = None) -> tuple[GpuRun, dict] | None:
    """The data a step of ``make gpu-check`` recorded (e.g. "allocation": every allocator
    setting measured), from the newest run that has it, with that run; None if none has."""
    for run, record in _records(Path(folder) if folder is not None else RUNS_DIR):
        data = _field(record, "steps", name, "data")
        if data is not None:
            return run, data
    return None


def _cells(path: Path) -> dict[str, dict]:
    return {c.get("id", ""): c for c in _read(path, needs="cells")["cells"]
            if isinstance(c, dict) and c.get("cell_type") == "code"}


def _text(c: dict) -> str:
    parts = []
    for out in c.get("outputs", ()):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        if out.get("output_type") == "error":
            text = f"{out.get('ename')}: {out.get('evalue')}"
        parts.append(text if isinstance(text, str) else "".join(text))
    return "".join(parts).rstrip("\n")


def cell(notebook: str, cell_id: str, *, folder: Path | str | None = None,
         notebooks: Path | str | None = None) -> RecordedCell | None:
    """What cell ``cell_id`` of ``notebook`` (its stem, e.g. "07_feeding_the_accelerator")
    printed on the newest GPU run that has a copy of it; None if no run has one. ``folder``
    holds the runs (default ``docs/gpu-runs``), ``notebooks`` today's notebooks."""
    folder = Path(folder) if folder is not None else RUNS_DIR
    notebooks = Path(notebooks) if notebooks is not None else NOTEBOOKS_DIR
    for run in runs(folder):
        if notebook not in run.notebooks:
            continue
        then = _cells(folder / run.name / f"{notebook}.ipynb").get(cell_id)
        if then is None:
            continue
        now_path = notebooks / f"{notebook}.ipynb"
        now = _cells(now_path).get(cell_id) if now_path.exists() else None
        same = now is not None and "".join(now["source"]) == "".join(then["source"])
        return RecordedCell(notebook=notebook, cell_id=cell_id, run=run, text=_text(then),
                            same_code=same)
    return None


def staleness(folder: Path | str | None = None,
              notebooks: Path | str | None = None) -> tuple[Staleness, ...]:
    """Every notebook against its copy on the newest run that has one."""
    folder = Path(folder) if folder is not None else RUNS_DIR
    nb_dir = Path(notebooks) if notebooks is not None else NOTEBOOKS_DIR
    found = _records(folder)
    rows = []
    for path in sorted(nb_dir.glob("*.ipynb")):
        now = _cells(path)
        run, data = next(((r, d) for r, d in found if path.stem in r.notebooks), (None, None))
        if run is None:
            rows.append(Staleness(path.stem, None, 0, (), tuple(now)))
            continue
        then = _cells(folder / run.name / path.name)
        changed = tuple(i for i in now if i in then
                        and "".join(now[i]["source"]) != "".join(then[i]["source"]))
        missing = tuple(i for i in now if i not in then)
        status = _field(data, "steps", "notebooks", "notebooks", path.name, "status")
        rows.append(Staleness(path.stem, run.name, len(now) - len(changed) - len(missing),
                              changed, missing, status if isinstance(status, str) else None))
    return tuple(rows)
