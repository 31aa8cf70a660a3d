"""Bytes each device and the host hold right now: :func:`snapshot` (capture only).

Every number says where it comes from:

- ``"allocator"``: the device allocator's own counters (``Device.memory_stats()``; GPUs and TPUs).
- ``"live arrays"``: the sum of the shards of live JAX arrays on that device
  (``jax.live_arrays(platform)`` for every backend), used where the backend keeps no stats (CPU).
  It counts arrays only, not XLA's temporary buffers, so it is a lower bound.
- host: resident memory of this process split into anonymous (heap, NumPy arrays) and
  file-backed (memory-mapped files, shared libraries), from ``psutil``: on Linux ``shared`` is
  RssFile + RssShmem, so ``rss - shared`` is RssAnon; elsewhere the split is NOT_AVAILABLE.
  ``peak_rss`` is the kernel's own high-water mark of RSS (VmHWM, Linux): a peak between two
  samples is never lost. :func:`reset_host_peak` sets it back to the current RSS.

A number a backend or the OS does not keep is :data:`~helpers.unavailable.NOT_AVAILABLE`
(``None`` in the dicts that ``to_dict`` returns for renderers and JSON). Rendering:
:mod:`helpers.render` (text) and :mod:`helpers.plotting` (figures).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import jax
import psutil

from helpers import _backend_start
from helpers._display import Display
from helpers._jax_internals import device_name
from helpers.unavailable import NOT_AVAILABLE, NotAvailable, to_json_value

_backend_start.ensure_hook()  # JAX is imported: record the allocator variables at start

__all__ = ["ALLOCATOR", "LIVE_ARRAYS", "NOT_AVAILABLE", "DeviceMemory", "HostMemory",
           "MemorySnapshot", "reset_host_peak", "snapshot"]

ALLOCATOR = "allocator"
LIVE_ARRAYS = "live arrays"


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cpu:0", "cuda:0"
    platform: str
    bytes_in_use: int
    peak_bytes: int | NotAvailable  # allocator peak; the CPU backend keeps none
    limit_bytes: int | NotAvailable  # allocator pool limit
    source: str  # ALLOCATOR or LIVE_ARRAYS

    def to_dict(self) -> dict:
        return {k: to_json_value(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class HostMemory:
    rss: int
    anon: int | NotAvailable  # RssAnon: heap, NumPy buffers, JAX CPU device buffers
    file: int | NotAvailable  # RssFile + RssShmem: mmapped files (a memmapped token file), libs
    vms: int  # virtual address space (VmSize): what RLIMIT_AS caps
    available: int  # what the OS says it could still give (psutil.virtual_memory().available)
    total: int
    source: str  # "psutil"
    peak_rss: int | NotAvailable = NOT_AVAILABLE  # VmHWM: highest RSS since start or reset

    def to_dict(self) -> dict:
        return {k: to_json_value(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class MemorySnapshot(Display):
    time: float  # time.perf_counter() when taken
    devices: tuple[DeviceMemory, ...]
    host: HostMemory

    def device(self, name) -> DeviceMemory:
        name = device_name(name)
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(f"no device {name!r} in snapshot (devices: "
                       f"{', '.join(d.device for d in self.devices)})")

    def to_dict(self) -> dict:
        return {
            "time": self.time,
            "devices": [d.to_dict() for d in self.devices],
            "host": self.host.to_dict(),
        }


# --- capture ------------------------------------------------------------------------------
def _host_memory() -> HostMemory:
    vm = psutil.virtual_memory()
    info = psutil.Process().memory_info()
    shared = getattr(info, "shared", None)  # Linux: RssFile + RssShmem
    anon = NOT_AVAILABLE if shared is None else int(info.rss - shared)
    return HostMemory(rss=int(info.rss), anon=anon,
                      file=NOT_AVAILABLE if shared is None else int(shared), vms=int(info.vms),
                      available=int(vm.available), total=int(vm.total), source="psutil",
                      peak_rss=_peak_rss())


_STATUS = "/proc/self/status"


def _peak_rss() -> int | NotAvailable:
    """VmHWM from /proc/self/status (Linux); NOT_AVAILABLE elsewhere."""
    try:
        with open(_STATUS, "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return NOT_AVAILABLE


def reset_host_peak() -> bool:
    """Set the kernel's RSS high-water mark (VmHWM) back to the current RSS, by writing 5 to
    /proc/self/clear_refs (Linux >= 4.0). False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _all_devices() -> list:
    from jax.extend.backend import backends

    out = []
    for client in backends().values():
        out.extend(client.local_devices())
    return out


def _all_live_arrays() -> list:
    """Live arrays of every backend: ``jax.live_arrays()`` alone lists only the default
    backend's, so on a GPU machine the CPU (host) arrays would be missed."""
    from jax.extend.backend import backends

    out = []
    for name in backends():
        try:
            out.extend(jax.live_arrays(name))
        except Exception:  # a backend that cannot list them
            continue
    return out


def _live_bytes_by_device() -> dict:
    """Bytes of live JAX arrays per device (each shard counted on its own device).

    Computed from each array's sharding, never through ``shard.data``: reading that makes
    JAX cache a second Array over the same buffer, which ``jax.live_arrays()`` then lists,
    so the measurement would double-count its own artefact. Single-device arrays that alias
    one buffer (views made by user code) are counted once, by buffer address; the address is
    asked for only where two arrays share device, shape and dtype, since asking can make JAX
    cache such a second Array too. The zero-copy alias of a token file that an open
    ``datasets.batches`` holds on a CPU device is not counted at all: it is the file's page
    cache, not memory the device allocated.
    """
    from helpers._gather import borrowed_buffers

    borrowed = borrowed_buffers()
    seen: set = {(d, addr) for d, addr, _, _ in borrowed}
    placed_arrays, groups = [], {}
    for arr in _all_live_arrays():
        try:
            if arr.is_deleted():
                continue
            placed = arr.sharding.addressable_devices_indices_map(arr.shape)
            group = (next(iter(placed)), arr.shape, str(arr.dtype)) if len(placed) == 1 else None
            placed_arrays.append((arr, placed, group))
            groups[group] = groups.get(group, 0) + 1
        except Exception:  # an array deleted between listing and reading
            continue
    for d, _, shape, dtype in borrowed:
        groups[(d, shape, dtype)] = groups.get((d, shape, dtype), 0) + 1
    totals: dict = {}
    for arr, placed, group in placed_arrays:
        try:
            if group is not None and groups[group] > 1:
                key = (group[0], arr.unsafe_buffer_pointer())
                if key in seen:
                    continue
                seen.add(key)
            shard_bytes = math.prod(arr.sharding.shard_shape(arr.shape)) * arr.dtype.itemsize
            for device in placed:
                totals[device] = totals.get(device, 0) + shard_bytes
        except Exception:  # an array deleted between listing and reading
            continue
    return totals


def _device_memory(devices) -> tuple[DeviceMemory, ...]:
    live = None
    out = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:
            stats = None
        if stats and "bytes_in_use" in stats:
            out.append(DeviceMemory(
                device=device_name(d), platform=d.platform,
                bytes_in_use=int(stats["bytes_in_use"]),
                peak_bytes=_int_or_na(stats.get("peak_bytes_in_use")),
                limit_bytes=_int_or_na(stats.get("bytes_limit")), source=ALLOCATOR,
            ))
        else:
            if live is None:
                live = _live_bytes_by_device()
            out.append(DeviceMemory(
                device=device_name(d), platform=d.platform, bytes_in_use=int(live.get(d, 0)),
                peak_bytes=NOT_AVAILABLE, limit_bytes=NOT_AVAILABLE, source=LIVE_ARRAYS,
            ))
    return tuple(out)


def _int_or_na(x) -> int | NotAvailable:
    return NOT_AVAILABLE if x is None else int(x)


def _resolve_devices(devices) -> list:
    if devices is None:
        return _all_devices()
    if isinstance(devices, jax.Device):
        return [devices]
    out = list(devices)
    bad = [d for d in out if not isinstance(d, jax.Device)]
    if bad:
        raise TypeError(
            f"devices must be jax.Device objects (e.g. jax.devices()[0]), got {bad[0]!r}")
    return out


def snapshot(devices=None) -> MemorySnapshot:
    """Bytes per device (all local devices of every backend, or the ones given) and host."""
    devs = _resolve_devices(devices)
    return MemorySnapshot(time=time.perf_counter(), devices=_device_memory(devs),
                          host=_host_memory())
