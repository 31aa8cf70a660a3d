"""Shared by the benchmark scripts: name the machine, write results as JSON (+ PNG)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """What ran the benchmark: CPU model and cores, memory, JAX backend and device kind."""
    import jax
    import psutil

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    dev = jax.devices()[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "python": platform.python_version(),
    }


def median(xs) -> float:
    return float(statistics.median(xs))


def write(name: str, payload: dict, fig=None) -> Path:
    """Write results/NAME.json (and NAME.png when a figure is given); returns the JSON path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": machine(), **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    if fig is not None:
        fig.savefig(RESULTS / f"{name}.png")
    return path
