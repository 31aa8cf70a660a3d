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

import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from helpers._internal import child
from helpers._internal.records import Record
from helpers.datasets import open_tokens, read_header
from helpers.errors import BadInputError

__all__ = ["STRATEGIES", "LoadMeasurement", "measure", "measure_all", "medians", "ratios"]

STRATEGIES = {
    "flax_ctx": "safetensors.flax.load_file under jax.default_device(host)",
    "numpy_load": "safetensors.numpy.load_file",
    "safe_open": "safe_open(framework='numpy').get_slice('tokens')[:]",
    "memmap": "helpers.datasets.open_tokens (read-only numpy.memmap)",
}


@dataclass(frozen=True)
class LoadMeasurement(Record):
    """What one way of loading the token file cost, measured in a fresh child process."""

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


def measure(path: str | os.PathLike, strategy: str, *, timeout: float = 600
            ) -> LoadMeasurement:
    """Load ``path`` one way in a fresh child process and return what it cost."""
    if strategy not in STRATEGIES:
        raise BadInputError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    read_header(path)  # clear error for a bad file, before starting a child
    # No GPU preallocation in the child: it only needs a few bytes there, and the parent (a
    # notebook kernel) may already hold JAX's default 75% pool on the same GPU.
    env = child.child_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    result = child.run(f"{__name__}:_load_child", _LoadRequest(str(path), strategy), env=env,
                       timeout=timeout)
    return result.answer(LoadMeasurement, f"the {strategy} load")


def measure_all(path: str | os.PathLike, strategies: Sequence[str] | None = None, *,
                repeats: int = 1) -> list[LoadMeasurement]:
    """Every strategy, interleaved ``repeats`` times (round-robin, so drift and the page cache
    affect all alike). Returns all measurements in run order."""
    names = list(strategies or STRATEGIES)
    out = []
    for _ in range(repeats):
        for name in names:
            out.append(measure(path, name))
    return out


def medians(measurements: Iterable[LoadMeasurement | dict]) -> list[dict]:
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


def ratios(measurements: Iterable[LoadMeasurement | dict], slow: str = "flax_ctx",
           fast: str = "memmap") -> dict:
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


# --- the child: one load, measured ---------------------------------------------------------
@dataclass(frozen=True)
class _LoadRequest(Record):
    path: str
    strategy: str


def _load_child(request: _LoadRequest) -> LoadMeasurement:
    """In the child of :func:`measure`: load the file one way, under memory.track."""
    path, strategy = request.path, request.strategy
    import jax

    jax.config.update("jax_num_cpu_devices", 2)  # stand-in roles when there is no GPU
    import numpy as np

    from helpers import devices, memory

    roles = devices.roles()
    acc = roles.accelerator
    jax.numpy.zeros(1).block_until_ready()
    start = memory.snapshot([acc])
    base_anon, base_file = start.host.anon or 0, start.host.file or 0
    t0 = time.perf_counter()
    with memory.track(interval=0.005, devices=[acc]) as trace:
        if strategy == "flax_ctx":
            from safetensors.flax import load_file

            with jax.default_device(roles.host):
                tokens = load_file(path)["tokens"]
            tokens.block_until_ready()
            after_load = memory.snapshot([acc]).devices[0].bytes_in_use
            checksum = int(jax.numpy.sum(tokens, dtype=jax.numpy.uint32))
            landed = ", ".join(devices.device_name(d) for d in tokens.devices())
        else:
            if strategy == "numpy_load":
                from safetensors.numpy import load_file

                tokens = load_file(path)["tokens"]
            elif strategy == "safe_open":
                from safetensors import safe_open

                with safe_open(path, framework="numpy") as f:
                    tokens = f.get_slice("tokens")[:]
            elif strategy == "memmap":
                tokens = open_tokens(path)
            else:
                raise SystemExit(f"unknown strategy {strategy!r}")
            after_load = memory.snapshot([acc]).devices[0].bytes_in_use
            checksum = int(np.sum(tokens, dtype=np.uint64) % 2**32)
            landed = "host (NumPy)"
    seconds = time.perf_counter() - t0
    anon = [a for a in trace.host_anon if isinstance(a, int)] or [base_anon]
    file = [f for f in trace.host_file if isinstance(f, int)] or [base_file]
    return LoadMeasurement(
        strategy=strategy, description=STRATEGIES[strategy], seconds=seconds,
        peak_anon_bytes=max(anon) - base_anon, peak_file_bytes=max(file) - base_file,
        accelerator_bytes=after_load - start.devices[0].bytes_in_use,  # the load's own
        file_bytes=os.path.getsize(path), checksum=checksum, landed_on=landed,
        stand_in=roles.stand_in)
