"""NVIDIA GPU queries in one place, answered without starting JAX.

Starting JAX's GPU backend just to ask "is there a GPU?" would grab 75% of the card for the
asking process (notebook 06), so everything here asks the driver instead: NVML through
``nvidia-ml-py`` when it is installed, else the ``nvidia-smi`` command that ships with the
driver. JAX numbers the GPUs it can see (``cuda:0``, ``cuda:1``, ...) after
``CUDA_VISIBLE_DEVICES`` has filtered them; the driver tools number them physically, so
:func:`physical_index` maps one to the other.

>>> why_unavailable(environ={"CUDA_VISIBLE_DEVICES": "-1"}) is not None
True
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

from helpers.errors import NoGpuError

__all__ = ["GpuInfo", "cuda_plugins", "device_used_bytes", "gpus", "physical_index",
           "process_used_bytes", "require", "total_bytes", "why_unavailable"]

INSTALL_HINT = 'pip install -U "jax[cuda13]" (or "jax[cuda12]" for a CUDA 12 driver)'


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as the driver reports it (NVML or nvidia-smi), without starting JAX."""

    index: int  # physical index, as nvidia-smi numbers it
    name: str
    uuid: str
    total_bytes: int
    driver: str


def _smi(*query: str) -> list[list[str]] | None:
    """Rows of an nvidia-smi CSV query, or None when nvidia-smi is missing or fails."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[x.strip() for x in line.split(",")] for line in out.stdout.splitlines() if line]


@functools.lru_cache(maxsize=1)
def _nvml():
    """pynvml, initialised once per process; None when nvidia-ml-py or the driver is missing."""
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def gpus() -> tuple[GpuInfo, ...]:
    """Every NVIDIA GPU the driver sees (all of them: ``CUDA_VISIBLE_DEVICES`` is not applied
    here). Empty when there is no driver or no GPU."""
    nv = _nvml()
    if nv is not None:
        try:
            driver = nv.nvmlSystemGetDriverVersion()
            found = []
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                found.append(GpuInfo(i, _text(nv.nvmlDeviceGetName(h)),
                                     _text(nv.nvmlDeviceGetUUID(h)),
                                     int(nv.nvmlDeviceGetMemoryInfo(h).total), _text(driver)))
            return tuple(found)
        except Exception:
            pass  # fall back to nvidia-smi
    rows = _smi("--query-gpu=index,name,uuid,memory.total,driver_version")
    out = []
    for row in rows or ():
        try:
            out.append(GpuInfo(int(row[0]), row[1], row[2], int(row[3]) * 2**20, row[4]))
        except (IndexError, ValueError):
            continue
    return tuple(out)


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def physical_index(jax_index: int = 0, *, environ: Mapping[str, str] | None = None,
                   found: tuple[GpuInfo, ...] | None = None) -> int | None:
    """The driver's index of JAX's ``cuda:<jax_index>``, through ``CUDA_VISIBLE_DEVICES``
    (indices or ``GPU-…`` UUIDs). None when that GPU is hidden or unknown."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return jax_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if jax_index >= len(entries):
        return None
    entry = entries[jax_index]
    if entry.lstrip("-").isdigit():
        return int(entry) if int(entry) >= 0 else None
    found = gpus() if found is None else found
    return next((g.index for g in found if g.uuid.startswith(entry)), None)


def total_bytes(jax_index: int = 0) -> int | None:
    """Total memory of JAX's ``cuda:<jax_index>`` as the driver reports it, or None."""
    found = gpus()
    index = physical_index(jax_index, found=found)
    return next((g.total_bytes for g in found if g.index == index), None)


def device_used_bytes(jax_index: int = 0) -> int | None:
    """Memory in use on JAX's ``cuda:<jax_index>`` by every process, as the driver reports it."""
    index = physical_index(jax_index)
    if index is None:
        return None
    nv = _nvml()
    if nv is not None:
        try:
            return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).used)
        except Exception:
            pass
    for row in _smi("--query-gpu=index,memory.used") or ():
        try:
            if int(row[0]) == index:
                return int(row[1]) * 2**20
        except (IndexError, ValueError):
            continue
    return None


def process_used_bytes(pid: int) -> int | None:
    """GPU memory the driver says process ``pid`` holds (summed over GPUs), or None.

    Inside a container the driver may report host PIDs, which do not match ours; then this is
    None rather than a guess."""
    nv = _nvml()
    if nv is not None:
        try:
            used = None
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid == pid and p.usedGpuMemory is not None:
                        used = (used or 0) + int(p.usedGpuMemory)
            return used
        except Exception:
            pass
    rows = _smi("--query-compute-apps=pid,used_memory")
    used = None
    for row in rows or ():
        try:
            if int(row[0]) == pid:
                used = (used or 0) + int(row[1]) * 2**20
        except (IndexError, ValueError):
            continue
    return used


def cuda_plugins() -> dict[str, str]:
    """Installed JAX CUDA plugin distributions and their versions (public entry points)."""
    out = {}
    for ep in metadata.entry_points(group="jax_plugins"):
        if "cuda" in ep.name:
            dist = getattr(ep, "dist", None)
            out[dist.name if dist else ep.name] = dist.version if dist else "?"
    return out


def why_unavailable(*, environ: Mapping[str, str] | None = None) -> str | None:
    """None when JAX should be able to start on an NVIDIA GPU here; else why not, and the fix.

    Checks, without starting JAX: ``JAX_PLATFORMS`` leaving the GPU out, ``CUDA_VISIBLE_DEVICES``
    hiding every GPU, no driver / no GPU, and no JAX CUDA plugin installed."""
    environ = os.environ if environ is None else environ
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms and not {"cuda", "gpu"} & {p.strip() for p in platforms.split(",")}:
        return (f"JAX_PLATFORMS={platforms!r} leaves the GPU out; unset it or add cuda "
                "(JAX_PLATFORMS=cuda,cpu)")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU; unset it or name one (=0)"
    if not gpus():
        return ("no NVIDIA GPU is visible (no driver, nvidia-smi missing, or it lists no GPU); "
                "run this on a machine with an NVIDIA GPU")
    if not cuda_plugins():
        return f"an NVIDIA GPU is here but JAX has no CUDA backend installed; {INSTALL_HINT}"
    return None


def require(what: str) -> None:
    """Raise :class:`NoGpuError` naming ``what`` needed the GPU, the reason, and the fix."""
    reason = why_unavailable()
    if reason is not None:
        raise NoGpuError(f"{what} needs an NVIDIA GPU with JAX's CUDA backend: {reason}")
