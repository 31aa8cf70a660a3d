"""How many bytes each device and the host hold: now (:func:`snapshot`), and over time while a
block runs (:func:`track`).

Every number says where it comes from:

- ``"allocator"``: the device allocator's own counters (``Device.memory_stats()``; GPUs and TPUs).
- ``"live arrays"``: the sum of the shards of live JAX arrays on that device
  (``jax.live_arrays(platform)`` for every backend), used where the backend keeps no stats (CPU).
  It counts arrays only, not XLA's temporary buffers, so it is a lower bound; the host's
  high-water mark is the peak there (jax-ml/jax#8096).
- host: resident memory of this process split into anonymous (heap, NumPy arrays) and
  file-backed (memory-mapped files, shared libraries), from ``psutil``: on Linux ``shared`` is
  RssFile + RssShmem, so ``rss - shared`` is RssAnon; elsewhere the split is NOT_AVAILABLE.
  ``peak_rss`` is the kernel's own high-water mark of RSS (VmHWM, Linux): a peak between two
  samples is never lost. :func:`reset_host_peak` sets it back to the current RSS.

A number a backend or the OS does not keep is :data:`~helpers.units.NOT_AVAILABLE` (``None``
in the dicts that ``to_dict`` returns). :func:`track` samples devices in a thread and the host in
a helper process (outside this process's GIL). Rendering: :mod:`helpers.render` (text) and
:mod:`helpers.plotting` (figures).

>>> snap = snapshot()
>>> snap.host.rss > 0
True
>>> with track(interval=0.05) as trace:
...     trace.mark("start")
>>> len(trace.samples) >= 2
True
"""

from __future__ import annotations

import bisect
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import jax
import psutil

from helpers._internal import host_sampler, jaxcompat
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record, to_json_value
from helpers.errors import BadInputError, MeasurementFailed
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes

jaxcompat.ensure_hook()  # JAX is imported: record the allocator variables at start

__all__ = ["ALLOCATOR", "LIVE_ARRAYS", "DeviceMemory", "HostMemory", "MemorySnapshot",
           "MemoryTrace", "backend_restarted", "borrowed_buffers", "live_arrays",
           "live_bytes_by_device", "memory_stats", "register_borrowed", "reset_host_peak",
           "retired_arrays", "samples_to_dict", "shard_buffers", "shard_views", "snapshot",
           "still_computing", "track"]

ALLOCATOR = "allocator"
LIVE_ARRAYS = "live arrays"


@dataclass(frozen=True)
class DeviceMemory(Record):
    """Bytes in use on one device, and where the number comes from (``source``)."""

    device: str  # "cpu:0", "cuda:0"
    platform: str
    bytes_in_use: int
    peak_bytes: int | NotAvailable  # allocator peak; the CPU backend keeps none
    limit_bytes: int | NotAvailable  # allocator pool limit
    source: str  # ALLOCATOR or LIVE_ARRAYS
    note: str = ""  # why bytes_in_use may not be the arrays' bytes ("" when it is)


@dataclass(frozen=True)
class HostMemory(Record):
    """This process's host memory: resident, anonymous and file-backed bytes, and the peak."""

    rss: int
    anon: int | NotAvailable  # RssAnon: heap, NumPy buffers, JAX CPU device buffers
    file: int | NotAvailable  # RssFile + RssShmem: mmapped files (a memmapped token file), libs
    vms: int  # virtual address space (VmSize): what RLIMIT_AS caps
    available: int  # what the OS says it could still give (psutil.virtual_memory().available)
    total: int
    source: str  # "psutil"
    peak_rss: int | NotAvailable = NOT_AVAILABLE  # VmHWM: highest RSS since start or reset


@dataclass(frozen=True)
class MemorySnapshot(Display):
    """Bytes per device and on the host at one moment (:func:`snapshot`)."""

    time: float  # time.perf_counter() when taken
    devices: tuple[DeviceMemory, ...]
    host: HostMemory
    #: host memory the process gave back while :func:`snapshot` found and read the devices
    #: (anonymous memory before minus after, from 16 MiB): JAX frees some buffers only at its
    #: next garbage collection, which reading a device's memory_stats() runs (jax-ml/jax#14882:
    #: a NumPy array device_put copied, kept after `del` until then)
    released_bytes: int = 0

    def device(self, name: str | jax.Device) -> DeviceMemory:
        """One device's numbers, by name ("cpu:0") or Device; KeyError naming those there are."""
        name = device_name(name)
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(f"no device {name!r} in snapshot (devices: "
                       f"{', '.join(d.device for d in self.devices)})")


# --- what the kit borrowed: zero-copy aliases of host memory --------------------------------
# (device, address, shape, dtype) of every alias a live owner holds (the feeding kernel's view
# of a token file): snapshot leaves these out of a device's bytes in use, since they are the
# file's own pages, not memory the device allocated.
_BORROWED: dict[int, tuple] = {}


def register_borrowed(owner: object, device: jax.Device, address: int,
                      shape: tuple[int, ...], dtype: str) -> None:
    """Tell :func:`snapshot` that ``owner`` holds a zero-copy alias of host memory at
    ``address`` on ``device``; forgotten when ``owner`` is garbage-collected."""
    key = id(owner)
    _BORROWED[key] = (device, address, tuple(shape), str(dtype))
    weakref.finalize(owner, _BORROWED.pop, key, None)


def borrowed_buffers() -> set:
    """``(device, buffer address, shape, dtype)`` of the zero-copy aliases now alive."""
    return set(_BORROWED.values())


def memory_stats(device: jax.Device) -> dict | None:
    """``device.memory_stats()``, or None where the backend keeps none or cannot answer: the
    kit's one reading of the allocator's counters."""
    try:
        return device.memory_stats()
    except Exception:
        return None


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
    out = []
    for client in _clients().values():
        out.extend(client.local_devices())
    return out


# --- backends JAX restarted ------------------------------------------------------------------
# JAX's private api.clear_backends() (jax.clear_backends until jax 0.4.36) makes new clients; the
# arrays made before stay alive on the old client, which jax.live_arrays() no longer asks
# (jax-ml/jax#10828). The kit keeps a weak reference to every client it meets, and at its first
# sight of a client looks once through Python's objects for older ones it never met.
_SEEN: dict[int, weakref.ref] = {}
_SEEN_LOCK = threading.Lock()


def _clients() -> dict:
    """{backend name: client} of the backends JAX runs now (``jax.extend.backend.backends()``).
    A client first met here makes the kit look once for older clients still alive."""
    from jax.extend.backend import backends

    now = dict(backends())
    with _SEEN_LOCK:
        met = [c for c in now.values() if (r := _SEEN.get(id(c))) is None or r() is not c]
        for c in met:
            _SEEN[id(c)] = weakref.ref(c)
    if met:
        import gc

        kind = type(met[0])
        older = [o for o in gc.get_objects() if type(o) is kind]
        with _SEEN_LOCK:
            for c in older:
                if (r := _SEEN.get(id(c))) is None or r() is not c:
                    _SEEN[id(c)] = weakref.ref(c)
        del older
    return now


def retired_arrays() -> list:
    """Live arrays of clients JAX no longer runs, a backend restarted
    (JAX's private ``api.clear_backends()``): they keep their memory, and ``jax.live_arrays()`` no
    longer lists them (jax-ml/jax#10828). :func:`live_arrays` has them too."""
    now = list(_clients().values())
    with _SEEN_LOCK:
        alive = [c for r in list(_SEEN.values()) if (c := r()) is not None]
    out = []
    for client in alive:
        if any(client is c for c in now):
            continue
        try:
            out.extend(a for a in client.live_arrays() if _made(a))
        except Exception:  # a client that cannot list them
            continue
    return out


def backend_restarted() -> str:
    """A sentence when arrays of a backend JAX restarted are alive (:func:`retired_arrays`):
    how many and their bytes, why ``jax.live_arrays()`` misses them, and what to do instead;
    "" when there are none."""
    arrays = retired_arrays()
    if not arrays:
        return ""
    nbytes = sum(_live_bytes_by_device(arrays=arrays).values())
    n = len(arrays)
    del arrays
    return _restarted_note(n, nbytes)


def _restarted_note(n: int, nbytes: int) -> str:
    """:func:`backend_restarted`'s sentence for ``n`` arrays of ``nbytes``."""
    return (f"{n} live array{'s' if n > 1 else ''} ({format_bytes(nbytes)}) "
            f"{'belong' if n > 1 else 'belongs'} to a backend JAX restarted (its private "
            "clear_backends(), jax-ml/jax#10828): "
            f"jax.live_arrays() no longer lists {'them' if n > 1 else 'it'}, and "
            f"{'they keep' if n > 1 else 'it keeps'} the old backend's memory. "
            f"`del` {'them' if n > 1 else 'it'} to free that memory; to free compiled "
            "programs, call jax.clear_caches() instead, which keeps the backend (clear_backends "
            "frees no array).")


def live_arrays() -> list:
    """Live arrays of every backend: ``jax.live_arrays()`` alone lists only the default
    backend's, so on a GPU machine the CPU (host) arrays would be missed. An array whose
    computation failed (out of memory) is left out: JAX still lists it, but its buffer was
    never made. Arrays of a backend JAX restarted are in too (:func:`retired_arrays`)."""
    out = []
    for name in _clients():
        try:
            out.extend(a for a in jax.live_arrays(name) if _made(a))
        except Exception:  # a backend that cannot list them
            continue
    return out + retired_arrays()


def _made(a) -> bool:
    """False for an array whose computation failed: it is ready, and waiting on it raises.
    Asking such an array for its buffer's address aborts the whole process (a check inside
    jaxlib; seen on jax 0.8.0 and 0.10.2 after a CPU step ran out of memory), so nothing may.
    A computation still running is not waited for."""
    try:
        if not a.is_ready():
            return True
        a.block_until_ready()
        return True
    except Exception:
        return False


def still_computing() -> int:
    """How many live arrays are still being computed (asynchronous dispatch: a call returns
    at once, and the first read waits for its work; neuralgcm#197). Asked with ``is_ready()``,
    which never waits; on every backend (a GPU snapshot reads the allocator and counts none)."""
    n = 0
    for a in live_arrays():
        try:
            n += not a.is_ready()
        except Exception:  # deleted meanwhile
            continue
    return n


def live_bytes_by_device() -> dict:
    """Bytes of live JAX arrays per device (``{Device: bytes}``), each buffer counted once:
    two Arrays over one buffer (JAX caches such a second Array over a buffer jax.device_put
    made when its address is asked for, and over any at a print up to jax 0.10, both seen on
    0.8.0 and 0.10.2; views alias their source) are one buffer, and so are a sharded array's shard
    and the Array over it that a host read made (:func:`shard_buffers`). The number behind a CPU
    :func:`snapshot` and :func:`helpers.holders.largest`'s ``live_bytes``. Arrays of a backend
    JAX restarted count under their own Devices (other objects, the same names)."""
    return _live_bytes_by_device()


def shard_buffers(arrays: list | None = None) -> set:
    """``(Device, buffer address)`` of each shard of a live array over several devices where
    a single-device Array of the shard's device, shape and dtype is alive on each and the array
    carries a host copy: the Arrays JAX makes over a sharded array's shards when it is read on
    the host (``np.asarray``, ``jax.device_get``, even ``str(x)``: jax-ml/jax#26216) are views
    of these buffers, no memory of their own, freed with the array. An array never read on the
    host is not asked (asking would make such Arrays). ``arrays``: these, not every live one."""
    arrays = live_arrays() if arrays is None else arrays
    if not any(_over_several(a) for a in arrays):  # the common case, answered cheaply
        return set()
    return _shard_buffers(_placed(arrays)[0])


def _over_several(arr) -> bool:
    try:
        return len(arr.sharding.device_set) > 1
    except Exception:  # deleted meanwhile
        return False


def shard_views(arrays: list | None = None) -> set[int]:
    """``id`` of each live Array over a shard of a sharded array whose shards were listed
    (``s.data for s in x.addressable_shards``, the way to read a sharded array shard by shard):
    JAX made it then and keeps it with the array, a view of the shard's buffer with no memory
    of its own. Known by identity, so nothing is asked and nothing made. ``arrays``: these, not
    every live one."""
    arrays = live_arrays() if arrays is None else arrays
    return {id(s.data) for arr in arrays for s in jaxcompat.listed_shards(arr)}


def _placed(arrays: list) -> tuple[list, dict]:
    """(array, {Device: index}, its (device, shape, dtype) where it is on one device else None)
    per array not deleted, and how many single-device arrays there are per (device, shape,
    dtype). Leaves out the Arrays over a sharded array's shards that JAX made when its
    ``addressable_shards`` were read (``jaxcompat.listed_shards``: known by identity, no address
    asked): views of the array's own buffers, counted as the array."""
    views = shard_views(arrays)
    placed_arrays, groups = [], {}
    for arr in arrays:
        if id(arr) in views:
            continue
        try:
            if arr.is_deleted():
                continue
            placed = arr.sharding.addressable_devices_indices_map(arr.shape)
            group = (next(iter(placed)), arr.shape, str(arr.dtype)) if len(placed) == 1 else None
            placed_arrays.append((arr, placed, group))
            groups[group] = groups.get(group, 0) + 1
        except Exception:  # an array deleted between listing and reading
            continue
    return placed_arrays, groups


def _shard_buffers(placed_arrays: list, keys: set | None = None) -> set:
    """:func:`shard_buffers` of ``_placed``'s rows. A shard's address is asked for only where
    the array carries the host copy a read on the host left (``jaxcompat.host_copy_bytes``):
    that read made JAX's Arrays over the shards, so ``shard.data`` reads them and makes none.
    Elsewhere ``shard.data`` would make JAX cache an Array over each shard, one more in
    ``jax.live_arrays()`` per shard, that a later count would call a host read's view. Also
    only where a single-device Array of its device, shape and dtype is alive on every device
    of the array, and the array is ready (asking waits). ``keys`` gets the (device, shape,
    dtype) of those shards."""
    singles = {group for _, _, group in placed_arrays if group is not None}
    out: set = set()
    for arr, placed, group in placed_arrays:
        if group is not None or not singles:
            continue
        try:
            if not jaxcompat.host_copy_bytes(arr):  # never read on the host: no views to find
                continue
            shape, dtype = arr.sharding.shard_shape(arr.shape), str(arr.dtype)
            if not all((d, shape, dtype) in singles for d in placed) or not arr.is_ready():
                continue
            out.update((s.device, s.data.unsafe_buffer_pointer())
                       for s in arr.addressable_shards)
            if keys is not None:
                keys.update((d, shape, dtype) for d in placed)
        except Exception:  # deleted meanwhile, or a shard that cannot say
            continue
    return out


def _live_bytes_by_device(pending: dict | None = None, arrays: list | None = None) -> dict:
    """Bytes of live JAX arrays per device (each shard counted on its own device).

    Computed from each array's sharding. Single-device arrays that alias one buffer (views
    made by user code) are counted once, by buffer address; the address is asked for only
    where two arrays share device, shape and dtype, since asking can make JAX cache such a
    second Array too. A single-device Array over a sharded array's shard (a host read of it
    made one: jax-ml/jax#26216, where the count was twice the device bytes, 128 MiB for a 64
    MiB array over 4 CPU devices) is the shard's buffer, counted once
    (:func:`shard_buffers`). The zero-copy alias of a token file that an open
    ``datasets.batches`` holds on a CPU device is not counted at all: it is the file's page
    cache, not memory the device allocated. An array still being computed is never asked for
    its address (asking waits for it: jax-ml/jax#928's queue would drain before the count);
    ``pending`` gets how many there are per device. ``arrays``: these, not every live one.
    """
    borrowed = borrowed_buffers()
    seen: set = {(d, addr) for d, addr, _, _ in borrowed}
    placed_arrays, groups = _placed(live_arrays() if arrays is None else arrays)
    for d, _, shape, dtype in borrowed:
        groups[(d, shape, dtype)] = groups.get((d, shape, dtype), 0) + 1
    shards: set = set()  # a sharded array's shards: counted as its own, never as a view's
    seen |= _shard_buffers(placed_arrays, shards)
    for key in shards:
        groups[key] = groups.get(key, 0) + 1
    totals: dict = {}
    for arr, placed, group in placed_arrays:
        try:
            ready = arr.is_ready()
            if not ready and pending is not None:
                for device in placed:
                    pending[device] = pending.get(device, 0) + 1
            if group is not None and groups[group] > 1 and ready:
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
    retired = _retired_by_name()  # arrays of a backend JAX restarted: by device name
    for d in devices:
        stats = memory_stats(d)
        old_bytes, old_note = retired.get(device_name(d), (0, ""))
        if stats and "bytes_in_use" in stats:
            out.append(DeviceMemory(
                device=device_name(d), platform=d.platform,
                bytes_in_use=int(stats["bytes_in_use"]),
                peak_bytes=_int_or_na(stats.get("peak_bytes_in_use")),
                limit_bytes=_int_or_na(stats.get("bytes_limit")), source=ALLOCATOR,
                note=" ".join(x for x in (_counting_note(stats, d.platform), old_note and (
                    f"{old_note} The counters above may leave out its "
                    f"{format_bytes(old_bytes)}: jax-ml/jax#20022 reports that the new "
                    "backend takes a pool of its own (not yet run on a GPU).")) if x),
            ))
        else:
            if live is None:
                pending: dict = {}
                live = _live_bytes_by_device(pending)
            out.append(DeviceMemory(
                device=device_name(d), platform=d.platform,
                bytes_in_use=int(live.get(d, 0) + old_bytes),
                peak_bytes=NOT_AVAILABLE, limit_bytes=NOT_AVAILABLE, source=LIVE_ARRAYS,
                note=" ".join(x for x in (_pending_note(pending.get(d, 0)), old_note and (
                    f"{old_note} These {format_bytes(old_bytes)} are in the count above.")) if x),
            ))
    return tuple(out)


def _retired_by_name() -> dict[str, tuple[int, str]]:
    """{device name: (bytes, the sentence)} for the arrays of a backend JAX restarted
    (:func:`retired_arrays`): its devices are other objects with the same names."""
    arrays = retired_arrays()
    if not arrays:
        return {}
    by_device, n = _live_bytes_by_device(arrays=arrays), len(arrays)
    del arrays
    note = _restarted_note(n, sum(by_device.values()))  # (not backend_restarted(): its search)
    out: dict[str, tuple[int, str]] = {}
    for device, nbytes in by_device.items():
        name = device_name(device)
        out[name] = (out.get(name, (0, ""))[0] + nbytes, note)
    return out


#: this many results still being computed mean the Python loop runs ahead of the device
QUEUED_AT = 10


def _pending_note(n: int) -> str:
    """What a count of arrays still being computed means (asynchronous dispatch)."""
    if n < QUEUED_AT:
        return ""
    return (f"{n} of its arrays are still being computed (asynchronous dispatch: work was "
            "queued and has not run yet). A loop that keeps queuing steps runs ahead of the "
            "device, and each queued step holds its inputs and outputs: .block_until_ready() "
            "on a step's result every few steps bounds the queue (jax-ml/jax#928)")


def _counting_note(stats: dict, platform: str) -> str:
    """BFC hands a free chunk out whole when splitting it would leave less than the request and
    under 128 MiB (``FindChunkPtr``, ``xla/tsl/framework/bfc_allocator.cc``), and
    ``bytes_in_use`` counts the chunk. A pool grown on demand adds a new region for each request
    it cannot serve, each at least twice the last, so this is the rule there: measured on an
    H100 (2026-11-26), a 36 MiB array showed 64 MiB in use. A pool taken whole starts as one
    block, and counted a fresh array exactly there."""
    pool, limit = stats.get("pool_bytes"), stats.get("bytes_limit")
    if not (isinstance(pool, int) and isinstance(limit, int) and pool < limit):
        return ""  # a pool taken whole (or none): the common case, answered without a lock
    state, at_start = jaxcompat.backend_start_snapshot()
    setting = (at_start.get(platform, {}) if state == "installed" else os.environ).get(
        "XLA_PYTHON_CLIENT_PREALLOCATE")  # what the backend started with, where known
    grown = setting in jaxcompat.PREALLOCATE_OFF
    return ("the pool grows on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false), so in use counts "
            "whole chunks of it, up to about twice an array (an H100: 64 MiB for a 36 MiB "
            "array); jax.live_arrays() gives the arrays' own bytes" if grown else "")


def _int_or_na(x) -> int | NotAvailable:
    return NOT_AVAILABLE if x is None else int(x)


def _resolve_devices(devices: str | jax.Device | Sequence[str | jax.Device] | None) -> list:
    """Devices from Devices, device names ("cpu:1") or platform names ("cpu", "gpu")."""
    if devices is None:
        return _all_devices()
    if isinstance(devices, (str, jax.Device)):
        devices = [devices]
    out = []
    for d in devices:
        if isinstance(d, jax.Device):
            out.append(d)
        elif isinstance(d, str):
            out.extend(_named(d))
        else:
            raise TypeError(f"devices must be jax.Device objects, device names like 'cpu:0' or "
                            f"platform names like 'cpu', got {d!r}")
    return out


def _named(name: str) -> list:
    every = _all_devices()
    found = [d for d in every if device_name(d) == name]
    if found:
        return found
    try:
        return list(jax.devices(name))
    except RuntimeError:
        known = ", ".join(device_name(d) for d in every)
        raise BadInputError(f"no device or platform {name!r} here; devices: {known}, or a "
                            "platform name such as 'cpu'") from None


def snapshot(devices: str | jax.Device | Sequence[str | jax.Device] | None = None
             ) -> MemorySnapshot:
    """Bytes per device (all local devices of every backend, or the ones given: Devices, names
    like "cpu:0" or a platform like "cpu") and host."""
    before = _anonymous()  # around finding and reading the devices alone
    devs = _resolve_devices(devices)
    found = _device_memory(devs)
    released = before - _anonymous()
    snap = MemorySnapshot(time=time.perf_counter(), devices=found, host=_host_memory())
    return replace(snap, released_bytes=released) if released >= 16 * 2**20 else snap


def _anonymous() -> int:
    """This process's anonymous resident memory (RSS less file-backed and shared pages)."""
    info = psutil.Process().memory_info()
    return int(info.rss - getattr(info, "shared", 0))


# --- tracking -----------------------------------------------------------------------------
def _annotate(name: str) -> None:
    """An empty ``jax.profiler.TraceAnnotation``: inside a ``jax.profiler.trace`` capture it
    shows as a named moment on this thread's timeline (XProf, Perfetto); elsewhere it costs
    about a microsecond."""
    try:
        with jax.profiler.TraceAnnotation(name):
            pass
    except Exception:  # pragma: no cover - a JAX without the profiler: marks still work
        pass


def _rate(times) -> float:
    """Samples per second over a series of sample times."""
    return (len(times) - 1) / times[-1] if len(times) > 1 and times[-1] > 0 else 0.0


def samples_to_dict(samples: Iterable[MemorySnapshot], *, t0: float | None = None,
                    marks: Iterable[tuple[float, str]] = (), interval: float | None = None,
                    rates: Mapping[str, float] | None = None) -> dict:
    """Series from a sequence of snapshots, as plain data for renderers (times in seconds from
    ``t0``, default the first sample). Used by MemoryTrace.to_dict and the live widget."""
    samples = tuple(samples)
    if t0 is None:
        t0 = samples[0].time if samples else 0.0
    times = [s.time - t0 for s in samples]
    names = [d.device for d in samples[0].devices] if samples else []
    last = samples[-1].devices if samples else ()
    return {
        "interval": interval,
        "achieved_hz": _rate(times),
        "times": times,
        "devices": {n: [s.devices[i].bytes_in_use for s in samples]
                    for i, n in enumerate(names)},
        "device_peaks": {n: [to_json_value(s.devices[i].peak_bytes) for s in samples]
                         for i, n in enumerate(names)},
        "achieved_hz_by_source": dict(rates or {}),
        "limits": {d.device: to_json_value(d.limit_bytes) for d in last},
        "sources": {d.device: d.source for d in last},
        "host_anon": [to_json_value(s.host.anon) for s in samples],
        "host_file": [to_json_value(s.host.file) for s in samples],
        "host_rss": [s.host.rss for s in samples],
        "host_peak_rss": [to_json_value(s.host.peak_rss) for s in samples],
        "marks": [list(m) for m in marks],
    }


class MemoryTrace(Display):
    """Samples collected by :func:`track`. Add named marks with ``trace.mark("loaded")``.

    Series are plain tuples once the block has ended: ``times`` (seconds from the start),
    ``device_bytes[name]``, ``host_anon``, ``host_file``, ``host_rss``; ``limits[name]`` and
    ``sources[name]`` per device; ``marks`` as (time, label).
    """

    def __init__(self, interval: float):
        self.interval = interval
        self._t0 = time.perf_counter()
        self.wall_t0 = time.time()  # the same moment on the wall clock (to line up other logs)
        self._lock = threading.Lock()
        self._samples: list[MemorySnapshot] = []
        self._marks: list[tuple[float, str]] = []
        self.finished = False
        self.host_peak_reset = False  # was the kernel's RSS high-water mark reset at start?
        self._rates: dict[str, float] = {}  # samples per second, per source (when finished)
        #: CPU seconds the sampling itself used while the block ran, per sampler ("sampler
        #: thread" in this process, "host helper" process): what tracking costs (when finished)
        self.sampler_cpu_s: dict[str, float] = {}
        self.wall_s: float | None = None  # how long the block ran (when finished)
        self._sample_now = None  # set by track(): takes one sample on the caller's thread
        self._closing = False  # set under the lock when the block ends: no more mark samples
        self._mark_sample_times: set[float] = set()  # left out of the sampler's rate

    # called from the sampler thread and from user code
    def _add(self, snap: MemorySnapshot) -> None:
        with self._lock:
            bisect.insort(self._samples, snap, key=lambda s: s.time)

    def mark(self, label: str) -> None:
        """Record a named moment (drawn as a vertical line on the timeline), and take a sample
        of **device** memory there on this thread, so what the devices held at each mark is
        always in the series, however the background sampler was scheduled. (Host memory at a
        mark is the helper process's latest reading; ``host_peak`` catches a host spike.)"""
        now = time.perf_counter()
        sample_now = self._sample_now  # read once: the block may end meanwhile
        snap = sample_now() if sample_now is not None else None
        with self._lock:
            if snap is not None and not self._closing:  # a mark after the end takes no sample
                bisect.insort(self._samples, snap, key=lambda s: s.time)
                self._mark_sample_times.add(snap.time)
                now = snap.time  # the mark sits on its own sample
            self._marks.append((now - self._t0, str(label)))
        _annotate(f"helpers mark: {label}")

    @property
    def samples(self) -> tuple[MemorySnapshot, ...]:
        with self._lock:
            return tuple(self._samples)

    @property
    def times(self) -> tuple[float, ...]:
        return tuple(s.time - self._t0 for s in self.samples)

    @property
    def device_names(self) -> tuple[str, ...]:
        s = self.samples
        return tuple(d.device for d in s[0].devices) if s else ()

    @property
    def device_bytes(self) -> dict[str, tuple[int, ...]]:
        s = self.samples
        return {name: tuple(x.devices[i].bytes_in_use for x in s)
                for i, name in enumerate(self.device_names)}

    @property
    def limits(self) -> dict[str, int | NotAvailable]:
        s = self.samples
        return {d.device: d.limit_bytes for d in s[-1].devices} if s else {}

    @property
    def sources(self) -> dict[str, str]:
        s = self.samples
        return {d.device: d.source for d in s[-1].devices} if s else {}

    @property
    def host_anon(self) -> tuple[int | NotAvailable, ...]:
        return tuple(x.host.anon for x in self.samples)

    @property
    def host_file(self) -> tuple[int | NotAvailable, ...]:
        return tuple(x.host.file for x in self.samples)

    @property
    def host_rss(self) -> tuple[int, ...]:
        return tuple(x.host.rss for x in self.samples)

    @property
    def marks(self) -> tuple[tuple[float, str], ...]:
        with self._lock:
            return tuple(self._marks)

    @property
    def achieved_hz(self) -> float:
        """Samples per second actually taken, by the slower source (see
        :attr:`achieved_hz_by_source`): every series was refreshed at least this often."""
        by = self.achieved_hz_by_source
        return min(by.values()) if by else _rate(self.times)

    @property
    def achieved_hz_by_source(self) -> dict[str, float]:
        """Samples per second per source. "host" comes from a helper process reading /proc
        (Linux), so it keeps its rate whatever this process does; "devices" is read in this
        process (allocator counters, or live arrays on CPU) by a thread that needs the GIL,
        and falls behind while another thread holds it, e.g. a loop of many small CPU
        computations. A peak shorter than the gap between two samples can be missed; the
        allocator's ``peak_bytes_in_use`` is no help there: it is the process's high-water mark
        since the backend started, which JAX cannot reset. ``mark()`` always samples."""
        with self._lock:
            return dict(self._rates)

    def _merge(self, host: list[HostMemory], host_times: list[float]) -> None:
        """Merge the thread's device samples (all samples so far) with the helper's host
        samples into one series (each value held until its source's next sample)."""
        with self._lock:
            dev = list(self._samples)
            device_times = [x.time for x in dev]
            events = sorted([(t, 0, i) for i, t in enumerate(device_times)]
                            + [(t, 1, i) for i, t in enumerate(host_times)])
            merged, d, h = [], dev[0], dev[0].host
            for t, kind, i in events:
                if kind == 0:
                    d = dev[i]
                else:
                    h = host[i]
                merged.append(MemorySnapshot(t, d.devices, h))
            self._samples = merged
            self._rates = {"devices": self._sampler_rate(device_times),
                           "host": _rate([t - host_times[0] for t in host_times])}

    def _sampler_rate(self, times: list[float]) -> float:
        """Samples per second over ``times``, leaving out the samples marks took."""
        own = [t for t in times if t not in self._mark_sample_times]
        return _rate([t - own[0] for t in own]) if own else 0.0

    def _series(self, device: str | jax.Device) -> tuple[int, ...]:
        series = self.device_bytes.get(device_name(device))
        if series is None:
            raise KeyError(f"device {device_name(device)!r} was not tracked "
                           f"(tracked: {', '.join(self.device_names)})")
        return series

    def peak(self, device: str | jax.Device) -> int:
        """Largest bytes-in-use sampled on a device (a name like 'cpu:0' or a Device). Where
        its source is "live arrays" (the CPU, which keeps no allocator counters) it counts live
        arrays only: XLA's temporaries inside a call are not live arrays and never appear
        there, however often it is sampled, and on the CPU :attr:`host_peak` is the block's
        peak (jax-ml/jax#8096: a sort's 64 MiB temporary left this at 163,844 B for it and
        for a version without the temporary; host_peak rose 64.3 MiB against 0.0 MiB)."""
        return max(self._series(device))

    @property
    def host_peak(self) -> int | NotAvailable:
        """Highest host RSS while the block ran, from the kernel's high-water mark (reset
        when the block started), so a spike between two samples still counts; on the CPU the
        block's peak, XLA's temporaries included, which :meth:`peak` never sees. NOT_AVAILABLE
        where the OS keeps no such mark (not Linux) or it could not be reset."""
        with self._lock:
            peaks = [s.host.peak_rss for s in self._samples]
        if not self.host_peak_reset or any(isinstance(p, NotAvailable) for p in peaks):
            return NOT_AVAILABLE
        return max(peaks)

    def growth(self, device: str | jax.Device) -> int:
        """Bytes in use at the end minus at the start, on one device."""
        series = self._series(device)
        return series[-1] - series[0]

    @property
    def sampling_cpu_share(self) -> float | None:
        """Samplers' CPU seconds / (block seconds x cores), None until the block ends: what
        watching cost in CPU (not the waits for the GIL it caused the block's thread)."""
        cores = (self.wall_s or 0) * (os.cpu_count() or 1)
        return sum(self.sampler_cpu_s.values()) / cores if cores and self.sampler_cpu_s else None

    def to_dict(self) -> dict:
        """Plain data: everything a renderer needs (``wall_t0``: the start, in seconds since
        the epoch, so a trace export can line this up with other logs)."""
        return {**samples_to_dict(self.samples, t0=self._t0, marks=self.marks,
                                  interval=self.interval, rates=self.achieved_hz_by_source),
                "sampler_cpu_s": dict(self.sampler_cpu_s), "wall_t0": self.wall_t0}

    def __repr__(self) -> str:
        return (f"MemoryTrace({len(self.samples)} samples over "
                f"{(self.times[-1] if self.samples else 0):.2f} s, devices={self.device_names}, "
                f"marks={[m[1] for m in self.marks]})")


@contextmanager
def track(interval: float = 0.01, *,
          devices: str | jax.Device | Sequence[str | jax.Device] | None = None
          ) -> Iterator[MemoryTrace]:
    """Sample device and host memory every ``interval`` seconds while the block runs.

    A sample is taken at the start and at the end, so even a short block has two. The
    sampler thread always stops, also when the block raises (the exception propagates).
    The kernel's RSS high-water mark is reset when the block starts, so ``trace.host_peak``
    is the true host peak of the block, not the highest sample (Linux).

    >>> with track(interval=0.05) as trace:
    ...     trace.mark("start")
    >>> len(trace.samples) >= 2
    True
    """
    if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not (
            0 < interval <= 60):
        raise BadInputError(f"interval must be seconds in (0, 60], got {interval!r}")
    devs = _resolve_devices(devices)
    trace = MemoryTrace(float(interval))
    stop = threading.Event()
    errors: list[BaseException] = []
    trace.host_peak_reset = reset_host_peak()
    helper = host_sampler.start(interval)  # None: no /proc; the thread samples the host too
    first = snapshot(devs)
    trace._add(first)
    trace._sample_now = lambda: MemorySnapshot(
        time.perf_counter(), _device_memory(devs),
        first.host if helper is not None else _host_memory())

    def run() -> None:
        tick = first.time
        cpu = time.thread_time()
        try:
            while True:  # on a fixed grid, so the time a sample takes does not lower the rate
                tick += interval
                if stop.wait(max(0.0, tick - time.perf_counter())):
                    trace.sampler_cpu_s["sampler thread"] = time.thread_time() - cpu
                    return
                now = time.perf_counter()
                host = first.host if helper is not None else _host_memory()
                trace._add(MemorySnapshot(now, _device_memory(devs), host))
                if now - tick > interval:  # fell behind (the GIL was busy): no burst
                    tick = now
        except BaseException as err:  # pragma: no cover - reported after the block
            errors.append(err)

    thread = threading.Thread(target=run, name=f"helpers.memory.track-{os.getpid()}",
                              daemon=True)
    thread.start()
    try:
        yield trace
    finally:
        with trace._lock:
            trace._closing = True  # from here on, a mark (from any thread) adds no sample
        stop.set()
        thread.join()
        trace._add(snapshot(devs))
        trace.wall_s = trace._samples[-1].time - first.time
        host = helper.stop() if helper is not None else []
        if helper is not None and helper.cpu_s is not None:
            trace.sampler_cpu_s["host helper"] = helper.cpu_s
        if host:
            trace._merge([_host_from(s) for s in host], [s["time"] for s in host])
        else:
            with trace._lock:
                trace._rates = {"devices and host": trace._sampler_rate(
                    [x.time for x in trace._samples])}
        trace.finished = True
        trace._sample_now = None
    if errors:  # pragma: no cover
        raise MeasurementFailed(f"memory sampler failed: {errors[0]!r}") from errors[0]


def _host_from(s: dict) -> HostMemory:
    """A helper's /proc sample as HostMemory (statm's shared pages = RssFile + RssShmem)."""
    return HostMemory(rss=s["rss"], anon=s["rss"] - s["shared"], file=s["shared"],
                      vms=s["vms"], available=s["available"], total=s["total"],
                      source="helper process (/proc)",
                      peak_rss=s["peak_rss"] if s["peak_rss"] >= 0 else NOT_AVAILABLE)
