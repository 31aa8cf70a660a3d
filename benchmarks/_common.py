"""Shared by the benchmark scripts: name the machine, write results as JSON (+ PNG)."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

# JDK_BENCH_RESULTS redirects the output (make gpu-check writes a GPU run's results elsewhere).
RESULTS = Path(os.environ.get("JDK_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def median(xs) -> float:
    return float(statistics.median(xs))


def write(name: str, payload: dict, fig=None) -> Path:
    """Write results/NAME.json (and NAME.png when a figure is given); returns the JSON path."""
    from helpers import machine  # here, so importing _common never touches JAX

    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": machine.describe(), **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    if fig is not None:
        fig.savefig(RESULTS / f"{name}.png")
    return path
