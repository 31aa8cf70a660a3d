"""Which machine ran a measurement: named in benchmark results and notebook tables.

>>> from helpers import machine
>>> info = machine.describe()
>>> sorted(info)[:3]
['backend', 'cores', 'cpu']
"""

from __future__ import annotations

import os
import platform

__all__ = ["describe", "name"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe() -> dict:
    """CPU model and cores, memory, Python, JAX version, default backend and its device kind.
    Starts JAX's backends if they have not started yet."""
    import jax
    import psutil

    dev = jax.devices()[0]
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "python": platform.python_version(),
    }


def name(info: dict | None = None) -> str:
    """One line naming the machine, e.g. ``"NVIDIA H100 80GB HBM3 (gpu) on AMD EPYC …, 16 cores"``
    or ``"CPU only: AMD EPYC …, 2 cores, 24.0 GiB"``."""
    from helpers.units import format_bytes

    info = info or describe()
    host = f"{info['cpu']}, {info['cores']} cores, {format_bytes(info['memory_bytes'])}"
    if info["backend"] == "cpu":
        return f"CPU only: {host}"
    return f"{info['device_kind']} ({info['backend']}) on {host}"
