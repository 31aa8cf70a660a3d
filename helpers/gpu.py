"""NVIDIA GPU queries in one place, answered without starting JAX.

Starting JAX's GPU backend just to ask "is there a GPU?" would grab 75% of the card for the
asking process (notebook 06), so everything here asks the driver instead: NVML through
``nvidia-ml-py`` when it is installed, else the ``nvidia-smi`` command that ships with the
driver. JAX numbers the GPUs it can see (``cuda:0``, ``cuda:1``, ...) the way CUDA does: after
``CUDA_VISIBLE_DEVICES`` has filtered them (by index, ``GPU-`` UUID prefix, or a ``MIG-``
instance), in the order ``CUDA_DEVICE_ORDER`` asks for. The driver tools number them by PCI bus,
so :func:`visible` maps one to the other, and says when it cannot tell: CUDA's default order,
``FASTEST_FIRST``, may put a faster model first, so on a machine with GPUs of different models
and ``CUDA_DEVICE_ORDER`` unset, the numbers may not match nvidia-smi's (set
``CUDA_DEVICE_ORDER=PCI_BUS_ID``). A MIG instance's memory needs NVML (``nvidia-ml-py``, in
the ``cuda12``/``cuda13`` extras).

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

from helpers._internal.jaxcompat import DEFAULT_MEM_FRACTION, MIN_MEM_FRACTION
from helpers.errors import NoGpuError

__all__ = ["GpuInfo", "MigInfo", "VisibleGpu", "cuda_plugins", "device_used_bytes", "gpus",
           "measuring_pool", "physical_index", "process_used_bytes", "require", "total_bytes",
           "visible", "why_unavailable"]

INSTALL_HINT = 'pip install -U "jax[cuda13]" (or "jax[cuda12]" for a CUDA 12 driver)'


@dataclass(frozen=True)
class MigInfo:
    """One MIG instance of a GPU (NVML only): what CUDA sees as a whole device."""

    uuid: str  # "MIG-..."
    total_bytes: int
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as the driver reports it (NVML or nvidia-smi), without starting JAX."""

    index: int  # physical index, as nvidia-smi numbers it (PCI bus order)
    name: str
    uuid: str
    total_bytes: int
    driver: str
    migs: tuple[MigInfo, ...] = ()  # its MIG instances, where MIG is on (NVML only)


@dataclass(frozen=True)
class VisibleGpu:
    """JAX's ``cuda:<jax_index>``: which physical GPU (or MIG instance) it is, and its memory.
    ``note`` says why the mapping is uncertain ("" when it is not)."""

    jax_index: int
    physical_index: int | None
    uuid: str | None  # the GPU's, or the MIG instance's
    name: str | None
    total_bytes: int | None
    mig: bool = False
    note: str = ""


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
                                     int(nv.nvmlDeviceGetMemoryInfo(h).total), _text(driver),
                                     _migs(nv, h)))
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


def _migs(nv, handle) -> tuple[MigInfo, ...]:
    """The MIG instances of one GPU (empty where MIG is off or NVML cannot say)."""
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
        if not current:
            return ()
        out = []
        for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except Exception:  # an empty slot
                continue
            gi = ci = None
            try:
                gi, ci = nv.nvmlDeviceGetGpuInstanceId(m), nv.nvmlDeviceGetComputeInstanceId(m)
            except Exception:
                pass
            out.append(MigInfo(_text(nv.nvmlDeviceGetUUID(m)),
                               int(nv.nvmlDeviceGetMemoryInfo(m).total), gi, ci))
        return tuple(out)
    except Exception:  # an NVML or GPU without MIG support
        return ()


def visible(*, environ: Mapping[str, str] | None = None,
            found: tuple[GpuInfo, ...] | None = None) -> tuple[VisibleGpu, ...]:
    """The GPUs JAX will number ``cuda:0``, ``cuda:1``, ..., in that order, as CUDA sees them:
    ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-`` UUID prefixes, ``MIG-`` UUIDs or the older
    ``MIG-GPU-<uuid>/<gi>/<ci>``; CUDA stops at the first entry it cannot match) in the order
    ``CUDA_DEVICE_ORDER`` gives."""
    environ = os.environ if environ is None else environ
    found = gpus() if found is None else found
    same_model = len({g.name for g in found}) <= 1
    pci = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID"
    note = "" if pci or same_model else (
        "CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs are of different models: CUDA may "
        "number the fastest first, unlike nvidia-smi; set CUDA_DEVICE_ORDER=PCI_BUS_ID")
    order = list(found)  # PCI bus order: what NVML and nvidia-smi number
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in spec.split(",")] if spec is not None else [
        str(i) for i in range(len(order))]
    out: list[VisibleGpu] = []
    for entry in entries:
        hit = _match(entry, order)
        if hit is None:  # CUDA ignores this entry and every one after it
            break
        gpu, mig = hit
        uuid = mig.uuid if mig else gpu.uuid
        size = mig.total_bytes if mig else gpu.total_bytes
        index_note = note if entry.isdigit() else ""  # a UUID names one GPU whatever the order
        out.append(VisibleGpu(len(out), gpu.index, uuid, gpu.name, size, mig is not None,
                              index_note))
    return tuple(out)


def _match(entry: str, order: list[GpuInfo]) -> tuple[GpuInfo, MigInfo | None] | None:
    if not entry:
        return None
    if entry.isdigit():
        n = int(entry)
        return (order[n], None) if n < len(order) else None
    if entry.startswith("MIG-GPU-"):  # MIG-GPU-<uuid>/<gi>/<ci>
        parent, _, rest = entry[len("MIG-"):].partition("/")
        gi, _, ci = rest.partition("/")
        for g in order:
            if g.uuid == parent:
                mig = next((m for m in g.migs if str(m.gpu_instance) == gi
                            and str(m.compute_instance) == ci), None)
                return (g, mig) if mig else None
        return None
    if entry.startswith("MIG-"):
        for g in order:
            mig = next((m for m in g.migs if m.uuid.startswith(entry)), None)
            if mig:
                return g, mig
        return None
    uuid = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    hits = [g for g in order if g.uuid.startswith(uuid)]
    return (hits[0], None) if len(hits) == 1 else None  # a prefix must name one GPU


def physical_index(jax_index: int = 0, *, environ: Mapping[str, str] | None = None,
                   found: tuple[GpuInfo, ...] | None = None) -> int | None:
    """The driver's index of JAX's ``cuda:<jax_index>`` (see :func:`visible`). None when that
    GPU is hidden or unknown."""
    environ = os.environ if environ is None else environ
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in spec.split(",")] if spec is not None else None
    if found is None and (entries is None or all(e.isdigit() for e in entries)):
        # indices alone: no need to ask the driver
        if entries is None:
            return jax_index
        ok = entries[:next((i for i, e in enumerate(entries) if not e.isdigit()), len(entries))]
        return int(ok[jax_index]) if jax_index < len(ok) else None
    shown = visible(environ=environ, found=found)
    return shown[jax_index].physical_index if jax_index < len(shown) else None


def total_bytes(jax_index: int = 0) -> int | None:
    """Total memory of JAX's ``cuda:<jax_index>`` as the driver reports it (a MIG instance's
    own size where it is one), or None."""
    shown = visible()
    return shown[jax_index].total_bytes if jax_index < len(shown) else None


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


def measuring_pool(share: float = 0.5, jax_index: int = 0) -> dict[str, str | None]:
    """The allocator settings for a child process that measures a step by the allocator's
    ``peak_bytes_in_use`` on ``cuda:<jax_index>``: a pool taken whole at start, ``share`` of
    the memory free on the card now (at least 0.5% of it, at most JAX's default 75%). None
    removes a variable (the pool's size is this one's alone). {} where the driver lists no GPU.

    Why taken whole: BFC hands out a free chunk whole when splitting it would leave less than
    the request and under 128 MiB, and counts the whole chunk in use. A pool grown on demand
    (``XLA_PYTHON_CLIENT_PREALLOCATE=false``) adds a region per request, so there it over-counts:
    measured on an H100 (2026-11-26), a 36 MiB array showed 64 MiB, and a 240.03 MiB step
    measured 364.03. A pool taken whole is one block in a fresh process, and counted each buffer
    exactly. Why a share: the rest stays free for the parent (a notebook kernel may hold 75% of
    the card), cuBLAS's start in the child, and other children.
    """
    total = total_bytes(jax_index)
    if not total:
        return {}
    used = device_used_bytes(jax_index)
    # unknown, or more than the card (a MIG instance: the driver's reading is the whole GPU's):
    # assume a notebook kernel holds JAX's default 75%
    free = total - used if used is not None and used <= total else int(
        total * (1 - DEFAULT_MEM_FRACTION))
    fraction = min(DEFAULT_MEM_FRACTION, max(MIN_MEM_FRACTION, share * free / total))
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.4f}",
            "XLA_CLIENT_MEM_FRACTION": None, "XLA_PYTHON_CLIENT_ALLOCATOR": None}


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
