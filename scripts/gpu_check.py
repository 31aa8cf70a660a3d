"""`make gpu-check`: run the kit's GPU paths on a machine with an NVIDIA GPU, and record the run.

Steps (``--steps``, comma-separated; default ``all``: every step below but ``nbval``, most
wanted first, so a short lease spends its time where the kit has never run):

- ``notebooks``   every notebook executed, the copies (GPU outputs) kept in the record folder;
- ``reproduce``   ``python -m helpers reproduce-oom --json`` (the real CUDA OOM, then the fix);
- ``allocation``  each allocator setting, and two processes on one GPU, measured in children;
- ``tests``       the ``gpu``-marked unit tests (``pytest -m gpu``);
- ``batch``, ``wait``, ``accuracy``  the GPU halves of the performance goals;
- ``bench``       the feeding benchmark's GPU rows against the pinned ``device_put`` bound;
- ``nbval``       every notebook under nbval, as ``make test`` runs it. Not in ``all`` while no
  cell asks nbval to compare its output (``# NBVAL_CHECK_OUTPUT``): nbval in lax mode then
  proves only that every cell runs, which ``notebooks`` proves too, in one execution instead of
  two (about 6 minutes of a GPU lease).

``--deadline SECONDS`` bounds the whole call: a step gets at most the time left, and one that
would start with under a minute left is recorded as not run (its earlier entry, if any, kept).
``--notebooks 08,12`` runs only the notebooks whose names start so (a rerun after a fix); the
others keep their entries.

Writes ``docs/gpu-runs/<date>-<gpu>.json`` and ``.md`` (steps run again on the same day and GPU
replace their earlier entry), and ``docs/gpu-runs/<date>-<gpu>/`` for the executed notebooks,
logs and benchmark results. Every failure is kept verbatim (the tail of its output).

Exit status: 0 every step passed, 1 a step failed, 2 no NVIDIA GPU here (said at once, before
anything runs). Uses only the standard library and ``helpers.gpu`` (which imports no JAX), so
any Python can start it; the steps run
with ``--python`` (default: this interpreter). Missing notebook-test packages are installed from
``--wheels`` (a folder filled by ``scripts/fetch_gpu_wheels.sh``) into a private folder, so no
network is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit's modules, where it is not installed (a lent GPU machine)
STEPS = ("notebooks", "reproduce", "allocation", "tests", "batch", "wait", "accuracy", "bench",
         "nbval")
#: a step is not started with less than this left before the deadline
MIN_STEP_SECONDS = 60
#: one notebook's own limit, when the deadline leaves more
NOTEBOOK_SECONDS = 900.0
#: what the notebooks need that a bare GPU image tends to lack: the notebook-test stack, and the
#: kit's own newer dependencies (rich for nb11's sharding picture, anywidget for the widget)
NEEDED = ("nbval", "nbclient", "nbformat", "ipykernel", "jupyter_client", "ipywidgets", "rich",
          "anywidget")
SCHEMA = "jax-device-kit/gpu-run/1"
TAIL_LINES = 40


def detect_gpus() -> list[dict]:
    """GPUs the driver lists (name, driver, total MiB), via helpers.gpu (NVML or nvidia-smi,
    standard library only, no JAX); empty when there is none or no driver."""
    from helpers import gpu

    return [{"name": g.name, "driver": g.driver, "memory_mib": g.total_bytes // 2**20}
            for g in gpu.gpus()]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def pass_line(text: str) -> str | None:
    """pytest's closing summary ('12 passed, 3 deselected in 4.2s'), if any."""
    summary = r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected)\b.*?)\s*=*$"
    found = re.findall(summary, text, re.M)
    return found[-1] if found else None


def prepare_env(python: str, wheels: Path | None, site: Path) -> tuple[dict, str | None]:
    """Environment for the steps, and None or why the notebook steps cannot run. Installs
    the missing notebook-test packages from ``wheels`` into ``site`` (no network)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    probe = ("import importlib.util as u, json; "
             f"print(json.dumps([m for m in {NEEDED!r} if not u.find_spec(m)]))")

    def missing(e):
        out = subprocess.run([python, "-c", probe], env=e, capture_output=True, text=True)
        return json.loads(out.stdout) if out.returncode == 0 else list(NEEDED)

    lacking = missing(env)
    if not lacking:
        return env, None
    found = sorted(wheels.glob("*.whl")) if wheels and wheels.is_dir() else []
    if not found:
        return env, (f"missing {', '.join(lacking)} and no wheels in {wheels}; fill the folder "
                     "with scripts/fetch_gpu_wheels.sh on a machine with network access")
    site.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--no-compile", "--upgrade", "--target", str(site),
                           *map(str, found)], capture_output=True, text=True)
    if proc.returncode != 0:
        return env, "installing the wheels failed: " + proc.stderr.strip()[-500:]
    env["PYTHONPATH"] = os.pathsep.join((str(site), env["PYTHONPATH"]))
    lacking = missing(env)
    return env, (f"still missing after installing the wheels: {', '.join(lacking)}"
                 if lacking else None)


def run(cmd: list[str], env: dict, timeout: float, log: Path) -> dict:
    """Run one step's command; its whole output goes to ``log``, its tail into the record."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
        rc, text, stdout = proc.returncode, proc.stdout + proc.stderr, proc.stdout
    except subprocess.TimeoutExpired as err:
        rc, stdout = 124, ""
        text = (_text(err.stdout) + _text(err.stderr) + f"\n[killed after {timeout:.0f} s]")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    return {"command": " ".join(cmd)[:300], "exit_code": rc,
            "seconds": round(time.perf_counter() - t0, 1),
            "status": "passed" if rc == 0 else "failed", "pass_line": pass_line(text),
            "log": _relative(log), "tail": text.strip().splitlines()[-TAIL_LINES:],
            "_stdout": stdout}


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _text(x) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


_ALLOCATION = """
import json
from helpers import allocation
total = allocation.measure("default").total_bytes
settings = {n: allocation.measure(n).to_dict() for n in allocation.SETTINGS}
for n, m in settings.items():
    opts = allocation.plugin_options(allocation.SETTINGS[n])["options"]
    m["predicted"] = allocation.predict(opts, total).to_dict()
pairs = {
    "default, default": allocation.measure_together(("default", "default")),
    "default, default asking 35%": allocation.measure_together(
        ("default", "default"), array_bytes=(2**28, int(0.35 * total))),
    "false, false": allocation.measure_together(("PREALLOCATE=false",) * 2),
}
print(json.dumps({"total_bytes": total, "settings": settings,
                  "pairs": {k: [m.to_dict() for m in v] for k, v in pairs.items()}}))
"""

_EXECUTE = """
import os, sys, nbformat
from nbclient import NotebookClient
src, dst, timeout = sys.argv[1], sys.argv[2], int(float(sys.argv[3]))  # nbclient: an int
nb = nbformat.read(src, as_version=4)
for cell in nb.cells:  # the copy shows only what ran here: a failure leaves no CPU outputs below
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
try:
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(src)}}).execute()
finally:  # a failed notebook's copy shows the cells up to the failure
    nbformat.write(nb, dst)
"""

#: what nbval would compare beyond "every cell runs" (lax mode compares only marked cells)
OUTPUT_CHECK = "NBVAL_CHECK_OUTPUT"


def default_steps(notebooks: Path) -> tuple[str, ...]:
    """``all``: every step, but nbval only while some cell asks nbval to compare its output;
    otherwise ``notebooks`` proves the same (every cell runs) and keeps the GPU copies."""
    compared = any(OUTPUT_CHECK in nb.read_text() for nb in notebooks.glob("*.ipynb"))
    return tuple(s for s in STEPS if s != "nbval" or compared)


def time_left(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()


def step_command(name: str, python: str, batch_budgets: str | None = None
                 ) -> tuple[list[str], float]:
    nbval = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.nbval_hooks",
             "--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with",
             "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=600", "notebooks"]
    return {
        "tests": ([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"],
                  900),
        "nbval": (nbval, 1800),
        "reproduce": ([python, "-m", "helpers", "reproduce-oom", "--json", "--size", "1GiB"], 600),
        "allocation": ([python, "-c", _ALLOCATION], 900),
        "bench": ([python, "benchmarks/feeding.py", "--rounds", "3", "--mib", "128"], 1200),
        # the GPU halves of issue "Performance users feel": three compiles, the accelerator
        # that never waits, predictions on the Flax corpus (flax/optax/grain: the bench extra,
        # in the wheel folder with BENCH=1; the capped verdict runs model a CPU, not a GPU)
        # one round: about 150 compiles, slower on a GPU (2 rounds passed 242 s on an H100)
        "batch": ([python, "benchmarks/batch_search.py", "--rounds", "1",
                   *(["--budgets", batch_budgets] if batch_budgets else [])], 600),
        "wait": ([python, "benchmarks/accelerator_wait.py", "--rounds", "7"], 600),
        # four steps at once: each child's allocator peak is its own (104 s did not finish
        # the 22 children one by one on an H100)
        "accuracy": ([python, "benchmarks/prediction_accuracy.py", "--no-verdicts", "--jobs",
                      "4"], 600),
    }[name]


def run_notebooks(python: str, env: dict, folder: Path, *, notebooks: Path,
                  only: tuple[str, ...] = (), earlier: dict | None = None,
                  deadline: float | None = None, save=lambda result: None) -> dict:
    """Execute each notebook (those whose names start with one of ``only``, or all) in a fresh
    kernel, keep its executed copy in ``folder``; ``earlier`` entries of notebooks not run are
    kept. Calls ``save`` after each notebook, so a call killed midway keeps what ran."""
    results = dict((earlier or {}).get("notebooks", {}))
    for nb in sorted(notebooks.glob("*.ipynb")):
        if only and not nb.name.startswith(only):
            continue
        left = time_left(deadline)
        if left < MIN_STEP_SECONDS:
            results.setdefault(nb.name, {"status": "not run",
                                         "tail": ["not run: the call's deadline came first"]})
            continue
        folder.mkdir(parents=True, exist_ok=True)
        timeout = min(NOTEBOOK_SECONDS, left)
        r = run([python, "-c", _EXECUTE, str(nb), str(folder / nb.name), str(timeout)], env,
                timeout, folder / "logs" / f"notebook-{nb.stem}.log")
        results[nb.name] = _cut_off({k: r[k] for k in ("status", "seconds", "tail")},
                                    r["exit_code"], timeout < NOTEBOOK_SECONDS)
        save(_notebooks_result(results))
    return _notebooks_result(results)


def _cut_off(result: dict, exit_code: int, by_deadline: bool) -> dict:
    """A run killed because the call's deadline came is "not run", not "failed"."""
    if exit_code == 124 and by_deadline:
        return {**result, "status": "not run",
                "tail": [*result.get("tail", []), "not run: cut off by the call's deadline"]}
    return result


def _notebooks_result(results: dict) -> dict:
    statuses = {r["status"] for r in results.values()}
    status = ("failed" if "failed" in statuses else "not run" if "not run" in statuses
              else "passed")
    return {"status": status, "notebooks": dict(sorted(results.items())),
            "seconds": round(sum(r.get("seconds", 0) for r in results.values()), 1)}


def summarise(name: str, result: dict) -> dict:
    """Keep the JSON a step printed (reproduce-oom, allocation) as the record's data."""
    stdout = result.pop("_stdout", "")
    if name in ("reproduce", "allocation") and stdout.strip():
        try:
            result["data"] = json.loads(stdout if name == "reproduce"
                                        else stdout.strip().splitlines()[-1])
        except json.JSONDecodeError:
            pass
    return result


def render_markdown(record: dict, bench: dict | None = None) -> str:
    g = record["gpu"]
    lines = [f"# GPU run {record['date']}: {g['name']}", "",
             f"- GPU: {g['name']}, {g['memory_mib']} MiB, driver {g['driver']}",
             f"- Python: {record['python']}", f"- JAX: {record.get('versions', {})}",
             *([f"- Commands, in order: {'; '.join(f'`{c}`' for c in record['commands'])}"]
               if record.get("commands") else [f"- Command: `{record['command']}`"]),
             *[f"- {n}" for n in record.get("notes", [])],
             "", "| step | status | seconds | result |",
             "|---|---|---|---|"]
    for name in STEPS:
        s = record["steps"].get(name)
        if s:
            lines.append(f"| {name} | {s['status']} | {s.get('seconds', '')} | "
                         f"{s.get('pass_line') or s.get('reason') or ''} |")
    notebooks = (record["steps"].get("notebooks") or {}).get("notebooks") or {}
    if notebooks:
        lines += ["", "## Notebooks, each in a fresh kernel", "", "| notebook | status | seconds |",
                  "|---|---|---|",
                  *(f"| {n} | {r['status']} | {r.get('seconds', '')} |"
                    for n, r in notebooks.items())]
    lines += _data_sections(record["steps"]) + _bench_section(bench)
    failed = {}
    for name, s in record["steps"].items():
        if name == "notebooks" and notebooks:  # each failed notebook under its own name
            failed |= {n: r for n, r in notebooks.items() if r["status"] != "passed"}
        elif s["status"] != "passed":
            failed[name] = s
    for name, s in failed.items():
        lines += ["", f"## {name}: {s['status']}", "", "```",
                  *(s.get("tail") or [s.get("reason", "")]), "```"]
    return "\n".join(lines) + "\n"


def _gib(n) -> str:
    return "—" if n is None else f"{n / 2**30:.2f} GiB"


def _data_sections(steps: dict) -> list[str]:
    """The figures each step produced: the OOM's text and time, every allocator setting with
    XLA's predicted cap and nvidia-smi's view, two processes, the feeding rows."""
    out: list[str] = []
    runs = (steps.get("reproduce") or {}).get("data") or []
    if runs:
        out += ["", "## The OOM, reproduced (`reproduce-oom --size 1GiB`)", "",
                "| run | ok | seconds | pool cap | error |", "|---|---|---|---|---|"]
        for r in runs:
            out.append(f"| {'fix' if r['fixed'] else 'seed load'} | {r['ok']} | "
                       f"{r['elapsed_s']:.1f} | {r['budget_how']} | "
                       f"{(r['error_message'] or 'landed on ' + str(r['landed_on']))[:160]} |")
    alloc = (steps.get("allocation") or {}).get("data")
    if alloc:
        out += ["", f"## Allocator settings (card: {_gib(alloc['total_bytes'])} by nvidia-smi)",
                "", "| setting | predicted bytes_limit | measured bytes_limit | BFC pool | "
                "nvidia-smi: this process | ok |", "|---|---|---|---|---|---|"]
        for name, m in alloc["settings"].items():
            out.append(f"| {name} | {_gib(m['predicted']['reported_limit'])} | "
                       f"{_gib(m['bytes_limit'])} | {_gib(m.get('pool_bytes'))} | "
                       f"{_gib(m['driver_used_bytes'])} | {m['ok']} |")
        out += ["", "## Two processes on one GPU", "",
                "| pair | process | bytes_limit | BFC pool | nvidia-smi | result |",
                "|---|---|---|---|---|---|"]
        for pair, ms in alloc["pairs"].items():
            for i, m in enumerate(ms, 1):
                result = "ok" if m["ok"] else (m["error"] or "")[:90]
                out.append(f"| {pair} | {i} | {_gib(m['bytes_limit'])} | "
                           f"{_gib(m.get('pool_bytes'))} | {_gib(m['driver_used_bytes'])} | "
                           f"{result} |")
    return out


def _bench_section(bench: dict | None) -> list[str]:
    if not bench:
        return []
    goal = bench["goal"]
    out = ["", f"## Feeding benchmark ({bench['device']}, {bench['rounds']} rounds, medians; "
           f"bound: {bench['bound']})", "",
           f"Goal: kit ≥ {goal['kit_over_bound_at_least']:.0%} of the bound for batches from "
           f"{goal['for_batches_from_bytes'] >> 20} MiB: **{'met' if goal['met'] else 'not met'}**."
           , "", "| batch | naive GB/s | kit GB/s | bound GB/s | kit / bound | kit / naive |",
           "|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        g = r["gbps"]
        out.append(f"| {r['batch_bytes'] >> 10} KiB | {g['naive']:.2f} | {g['kit']:.2f} | "
                   f"{g['bound']:.2f} | {r['kit_over_bound']:.0%} | {r['kit_over_naive']:.1f}× |")
    return out


def _bench_of(record_path: Path) -> dict | None:
    path = record_path.with_suffix("") / "bench" / "feeding.json"
    return json.loads(path.read_text()) if path.exists() else None


def render_file(record_path: Path) -> None:
    """Rewrite the .md next to a record JSON from its data (no GPU needed)."""
    record = json.loads(record_path.read_text())
    record_path.with_suffix(".md").write_text(render_markdown(record, _bench_of(record_path)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run the kit's GPU paths and record the run.")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--wheels", type=Path, default=REPO / ".gpu-wheels")
    p.add_argument("--steps", default="all")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "gpu-runs")
    p.add_argument("--detect-only", action="store_true", help="exit 0 with a GPU, else 2")
    p.add_argument("--render", type=Path, help="only rewrite the .md of this record JSON")
    p.add_argument("--deadline", type=float, metavar="SECONDS",
                   help="the whole call's time: no step starts with under a minute left")
    p.add_argument("--notebooks", metavar="PREFIXES",
                   help="with the notebooks step: only notebooks whose names start so, e.g. "
                   "08,12; or stale: those whose GPU copy is not current (changed, or failed)")
    p.add_argument("--batch-budgets", metavar="NAMES",
                   help='with the batch step: only these of its budgets, e.g. "2 GiB,8 GiB" '
                   "(a round of all five does not finish in 10 minutes on an H100)")
    a = p.parse_args(argv)
    if a.render:
        render_file(a.render)
        return 0
    steps = (default_steps(REPO / "notebooks") if a.steps == "all"
             else tuple(s.strip() for s in a.steps.split(",")))
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        print(f"gpu-check: unknown step(s) {unknown}; choose from {', '.join(STEPS)}",
              file=sys.stderr)
        return 2
    only = tuple(x.strip() for x in a.notebooks.split(",")) if a.notebooks else ()
    if "stale" in only:  # the notebooks whose GPU copy is not current: changed, or it failed
        from helpers import recorded
        from helpers.errors import BadInputError

        try:
            stale = tuple(s.notebook for s in recorded.staleness(a.out, REPO / "notebooks")
                          if not s.current)
        except BadInputError as err:  # a record in --out that is not one
            print(f"gpu-check: --notebooks stale: {err}", file=sys.stderr)
            return 2
        print(f"gpu-check: stale notebooks: {', '.join(stale) or 'none'}")
        only = tuple(dict.fromkeys(x for x in (*only, *stale) if x != "stale"))
        if not only:
            steps = tuple(s for s in steps if s not in ("notebooks", "nbval"))
    if only and not [nb for nb in (REPO / "notebooks").glob("*.ipynb")
                     if nb.name.startswith(only)]:
        print(f"gpu-check: --notebooks {a.notebooks} matches no notebook in notebooks/ (their "
              "names start 01_, 02_, ...)", file=sys.stderr)
        return 2
    gpus = detect_gpus()
    if not gpus:
        print("gpu-check: no NVIDIA GPU here (nvidia-smi is missing or lists none); this check "
              "needs one. On a CPU machine, `make test` is the check.", file=sys.stderr)
        return 2
    if a.detect_only:
        return 0
    deadline = None if a.deadline is None else time.monotonic() + a.deadline
    gpu = gpus[0]
    name = f"{time.strftime('%Y-%m-%d')}-{slug(gpu['name'])}"
    folder = a.out / name
    env, missing = prepare_env(a.python, a.wheels, REPO / "build" / "gpu-site")
    env["JDK_BENCH_RESULTS"] = str(folder / "bench")
    record_path = a.out / f"{name}.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"steps": {}}
    doctor = subprocess.run([a.python, "-m", "helpers", "doctor", "--json"], cwd=REPO, env=env,
                            capture_output=True, text=True)
    versions = json.loads(doctor.stdout)["versions"] if doctor.returncode == 0 else {}
    command = "scripts/gpu_check.py " + " ".join(sys.argv[1:])
    record.update(schema=SCHEMA, date=time.strftime("%Y-%m-%d"), gpu=gpu, versions=versions,
                  python=a.python, command=command)
    record.setdefault("commands", []).append(command)  # every call of the day, in order

    def save(step: str, result: dict) -> None:
        record["steps"][step] = result
        a.out.mkdir(parents=True, exist_ok=True)  # written after every step: a kill keeps some
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        (a.out / f"{name}.md").write_text(render_markdown(record, _bench_of(record_path)))

    complete = True
    for step in steps:
        print(f"== {step}", flush=True)
        left = time_left(deadline)
        if step in ("nbval", "notebooks") and missing:
            result = {"status": "failed", "reason": missing}
        elif step == "notebooks":
            result = run_notebooks(a.python, env, folder, notebooks=REPO / "notebooks",
                                   only=only, earlier=record["steps"].get("notebooks"),
                                   deadline=deadline, save=lambda r: save("notebooks", r))
        elif left < MIN_STEP_SECONDS:
            print(f"   not run: {left:.0f} s left before the deadline")
            complete = False
            continue
        else:
            cmd, timeout = step_command(step, a.python, a.batch_budgets)
            result = summarise(step, run(cmd, env, min(timeout, left),
                                         folder / "logs" / f"{step}.log"))
            result = _cut_off(result, result["exit_code"], left < timeout)
        save(step, result)
        complete &= result["status"] == "passed"
        print(f"   {result['status']}  {result.get('pass_line') or result.get('reason') or ''}")
    print(f"record: {record_path}")
    return 0 if complete and all(record["steps"][s]["status"] == "passed" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
