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

import json
import subprocess
import sys
from dataclasses import asdict, dataclass

__all__ = ["STRATEGIES", "LoadMeasurement", "measure", "measure_all"]

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
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    from helpers.oom import read_header

    read_header(path)  # clear error for a bad file, before starting a child
    proc = subprocess.run([sys.executable, "-m", "helpers._load_child", str(path), strategy],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the {strategy} load failed in its child process: {tail}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
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
