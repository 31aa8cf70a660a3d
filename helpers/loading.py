"""Four ways to get a token file into host memory, measured side by side.

Each strategy runs in a **fresh child process** (so one load's memory cannot hide in another's
numbers) under :func:`helpers.memory.track`, and does the same work: make the whole ``tokens``
tensor available on the host and read it once (a checksum), so a lazy memmap cannot win by
doing nothing.

=================  ================================================================
``flax_ctx``       ``with jax.default_device(host): safetensors.flax.load_file(path)``
``numpy_load``     ``safetensors.numpy.load_file(path)``
``safe_open``      ``safe_open(path, framework="numpy").get_slice("tokens")[:]``
``memmap``         ``helpers.datasets.open_tokens(path)`` (read-only numpy.memmap)
=================  ================================================================
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from helpers import _child
from helpers.errors import BadInputError
from helpers.safetensors_format import read_header

__all__ = ["STRATEGIES", "LoadMeasurement", "measure", "measure_all", "medians", "ratios", "table"]

STRATEGIES = {
    "flax_ctx": "safetensors.flax.load_file under jax.default_device(host)",
    "numpy_load": "safetensors.numpy.load_file",
    "safe_open": "safe_open(framework='numpy').get_slice('tokens')[:]",
    "memmap": "helpers.datasets.open_tokens (read-only numpy.memmap)",
}


@dataclass(frozen=True)
class LoadMeasurement:
    strategy: str
    description: str
    seconds: float  # wall time of load + one full read
    peak_anon_bytes: int  # peak anonymous RSS above the child's baseline
    peak_file_bytes: int  # peak file-backed RSS above the baseline (mapped file pages)
    accelerator_bytes: int  # bytes added on the accelerator (GPU, or stand-in cpu:0)
    file_bytes: int
    checksum: int  # sum of all tokens: the same for every strategy
    landed_on: str  # "host (NumPy)" or a device name
    stand_in: bool

    def to_dict(self) -> dict:
        return asdict(self)


def measure(path, strategy: str, *, timeout: float = 600) -> LoadMeasurement:
    """Load ``path`` one way in a fresh child process and return what it cost."""
    if strategy not in STRATEGIES:
        raise BadInputError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    read_header(path)  # clear error for a bad file, before starting a child
    # No GPU preallocation in the child: it only needs a few bytes there, and the parent (a
    # notebook kernel) may already hold JAX's default 75% pool on the same GPU.
    env = _child.child_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    result = _child.run_json("helpers._load_child", [path, strategy], env=env, timeout=timeout)
    data = result.require(f"the {strategy} load")
    return LoadMeasurement(description=STRATEGIES[strategy], **data)


def measure_all(path, strategies=None, *, repeats: int = 1) -> list[LoadMeasurement]:
    """Every strategy, interleaved ``repeats`` times (round-robin, so drift and the page cache
    affect all alike). Returns all measurements in run order."""
    names = list(strategies or STRATEGIES)
    out = []
    for _ in range(repeats):
        for name in names:
            out.append(measure(path, name))
    return out


def medians(measurements) -> list[dict]:
    """One row per strategy (in first-seen order): the median of each number over its runs,
    plus ``runs``. Input: LoadMeasurement objects or their dicts."""
    by: dict[str, list[dict]] = {}
    for m in measurements:
        d = m.to_dict() if hasattr(m, "to_dict") else dict(m)
        by.setdefault(d["strategy"], []).append(d)
    if not by:
        raise BadInputError("no measurements to summarise")
    rows = []
    for name, ds in by.items():
        row = {"strategy": name, "description": ds[0]["description"]}
        row["seconds"] = statistics.median(d["seconds"] for d in ds)
        for key in ("peak_anon_bytes", "peak_file_bytes", "accelerator_bytes"):
            row[key] = int(statistics.median(d[key] for d in ds))
        row.update(file_bytes=ds[0]["file_bytes"], landed_on=ds[0]["landed_on"],
                   stand_in=ds[0]["stand_in"], runs=len(ds))
        rows.append(row)
    return rows


def ratios(measurements, slow: str = "flax_ctx", fast: str = "memmap") -> dict:
    """Paired ratios between two strategies, the median over rounds (run i of ``slow`` with run
    i of ``fast``): time, and peak anonymous memory of ``slow`` over the file size."""
    ds = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in measurements]
    a = [d for d in ds if d["strategy"] == slow]
    b = [d for d in ds if d["strategy"] == fast]
    if not a or len(a) != len(b):
        raise BadInputError(f"need the same number (≥ 1) of {slow!r} and {fast!r} runs, "
                         f"got {len(a)} and {len(b)}")
    return {
        f"time_{slow}_over_{fast}": statistics.median(
            x["seconds"] / y["seconds"] for x, y in zip(a, b, strict=True)),
        f"peak_anon_{slow}_over_file": statistics.median(
            x["peak_anon_bytes"] / x["file_bytes"] for x in a),
        f"peak_anon_{fast}_over_file": statistics.median(
            y["peak_anon_bytes"] / y["file_bytes"] for y in b),
    }


def table(rows) -> str:
    """A plain-text table of :func:`medians` rows (fixed-width, for notebooks and logs)."""
    from helpers.units import format_bytes as fb

    lines = [f"{'strategy':<11} {'seconds':>8} {'peak anon':>11} {'x file':>7} "
             f"{'peak file':>11} {'accelerator':>12}  lands on"]
    for r in rows:
        lines.append(
            f"{r['strategy']:<11} {r['seconds']:>8.2f} {fb(r['peak_anon_bytes']):>11} "
            f"{r['peak_anon_bytes'] / r['file_bytes']:>7.2f} {fb(r['peak_file_bytes']):>11} "
            f"{'+' + fb(r['accelerator_bytes']):>12}  {r['landed_on']}")
    return "\n".join(lines)
