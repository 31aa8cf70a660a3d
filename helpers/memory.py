"""How many bytes each device and the host hold: now (:func:`snapshot`), over time (:func:`track`).

Every number says where it comes from:

- ``"allocator"``: the device allocator's own counters (``Device.memory_stats()``; GPUs and TPUs).
- ``"live arrays"``: the sum of the shards of live JAX arrays on that device
  (``jax.live_arrays()``), used where the backend keeps no stats (CPU). It counts arrays only,
  not XLA's temporary buffers, so it is a lower bound.
- host: resident memory of this process split into anonymous (heap, NumPy arrays) and
  file-backed (memory-mapped files, shared libraries) from ``/proc/self/status`` on Linux,
  else ``psutil`` RSS with no split.

>>> from helpers import memory
>>> snap = memory.snapshot()
>>> snap.host.rss > 0
True
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import jax
import psutil

__all__ = ["DeviceMemory", "HostMemory", "MemorySnapshot", "MemoryTrace", "samples_to_dict",
           "snapshot", "track"]

ALLOCATOR = "allocator"
LIVE_ARRAYS = "live arrays"


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cpu:0", "cuda:0"
    platform: str
    bytes_in_use: int
    peak_bytes: int | None  # allocator peak; None where the backend keeps none
    limit_bytes: int | None  # allocator pool limit; None where unknown
    source: str  # ALLOCATOR or LIVE_ARRAYS


@dataclass(frozen=True)
class HostMemory:
    rss: int
    anon: int | None  # RssAnon: heap, NumPy buffers, JAX CPU device buffers
    file: int | None  # RssFile + RssShmem: mmapped files (e.g. a memmapped token file), libraries
    available: int  # what the OS says it could still give (psutil.virtual_memory().available)
    total: int
    source: str  # "/proc/self/status" or "psutil"


@dataclass(frozen=True)
class MemorySnapshot:
    time: float  # time.perf_counter() when taken
    devices: tuple[DeviceMemory, ...]
    host: HostMemory

    def device(self, name) -> DeviceMemory:
        name = str(name)
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(f"no device {name!r} in snapshot (devices: "
                       f"{', '.join(d.device for d in self.devices)})")

    def to_dict(self) -> dict:
        return {
            "time": self.time,
            "devices": [d.__dict__.copy() for d in self.devices],
            "host": self.host.__dict__.copy(),
        }

    def __str__(self) -> str:
        from helpers.units import format_bytes as fb

        lines = [f"{'device':<10} {'in use':>12} {'peak':>12} {'limit':>12}  source"]
        for d in self.devices:
            lines.append(f"{d.device:<10} {fb(d.bytes_in_use):>12} {fb(d.peak_bytes):>12} "
                         f"{fb(d.limit_bytes):>12}  {d.source}")
        h = self.host
        lines.append(f"host RSS {fb(h.rss)} (anonymous {fb(h.anon)}, file-backed {fb(h.file)}); "
                     f"available {fb(h.available)} of {fb(h.total)}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


# --- capture ------------------------------------------------------------------------------
_PROC_STATUS = "/proc/self/status"


def _host_memory() -> HostMemory:
    vm = psutil.virtual_memory()
    try:
        fields = {}
        with open(_PROC_STATUS) as f:
            for line in f:
                if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")):
                    key, value = line.split(":", 1)
                    fields[key] = int(value.split()[0]) * 1024  # kB
        return HostMemory(
            rss=fields["VmRSS"], anon=fields["RssAnon"],
            file=fields["RssFile"] + fields.get("RssShmem", 0),
            available=int(vm.available), total=int(vm.total), source=_PROC_STATUS,
        )
    except (OSError, KeyError, ValueError):
        rss = psutil.Process().memory_info().rss
        return HostMemory(rss=int(rss), anon=None, file=None, available=int(vm.available),
                          total=int(vm.total), source="psutil")


def _all_devices() -> list:
    from jax.extend.backend import backends

    out = []
    for client in backends().values():
        out.extend(client.local_devices())
    return out


def _live_bytes_by_device() -> dict:
    """Bytes of live JAX arrays per device (each shard counted on its own device).

    Computed from each array's sharding, never through ``shard.data``: reading that makes
    JAX cache a second Array over the same buffer, which ``jax.live_arrays()`` then lists,
    so the measurement would double-count its own artefact. Single-device arrays that alias
    one buffer (views made by user code) are counted once, by buffer address.
    """
    totals: dict = {}
    seen: set = set()
    for arr in jax.live_arrays():
        try:
            if arr.is_deleted():
                continue
            sharding = arr.sharding
            placed = sharding.addressable_devices_indices_map(arr.shape)
            if len(placed) == 1:
                (device,) = placed
                try:
                    key = (device, arr.unsafe_buffer_pointer())
                except Exception:
                    key = None
                if key is not None:
                    if key in seen:
                        continue
                    seen.add(key)
            shard_bytes = math.prod(sharding.shard_shape(arr.shape)) * arr.dtype.itemsize
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
                device=str(d), platform=d.platform, bytes_in_use=int(stats["bytes_in_use"]),
                peak_bytes=_int_or_none(stats.get("peak_bytes_in_use")),
                limit_bytes=_int_or_none(stats.get("bytes_limit")), source=ALLOCATOR,
            ))
        else:
            if live is None:
                live = _live_bytes_by_device()
            out.append(DeviceMemory(
                device=str(d), platform=d.platform, bytes_in_use=int(live.get(d, 0)),
                peak_bytes=None, limit_bytes=None, source=LIVE_ARRAYS,
            ))
    return tuple(out)


def _int_or_none(x) -> int | None:
    return None if x is None else int(x)


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


# --- tracking -----------------------------------------------------------------------------
def _rate(times) -> float:
    """Samples per second over a series of sample times."""
    return (len(times) - 1) / times[-1] if len(times) > 1 and times[-1] > 0 else 0.0


def samples_to_dict(samples, *, t0: float | None = None, marks=(), interval=None) -> dict:
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
        "limits": {d.device: d.limit_bytes for d in last},
        "sources": {d.device: d.source for d in last},
        "host_anon": [s.host.anon for s in samples],
        "host_file": [s.host.file for s in samples],
        "host_rss": [s.host.rss for s in samples],
        "marks": [list(m) for m in marks],
    }


class MemoryTrace:
    """Samples collected by :func:`track`. Add named marks with ``trace.mark("loaded")``.

    Series are plain tuples once the block has ended: ``times`` (seconds from the start),
    ``device_bytes[name]``, ``host_anon``, ``host_file``, ``host_rss``; ``limits[name]`` and
    ``sources[name]`` per device; ``marks`` as (time, label).
    """

    def __init__(self, interval: float):
        self.interval = interval
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._samples: list[MemorySnapshot] = []
        self._marks: list[tuple[float, str]] = []
        self.finished = False

    # called from the sampler thread and from user code
    def _add(self, snap: MemorySnapshot) -> None:
        with self._lock:
            self._samples.append(snap)

    def mark(self, label: str) -> None:
        """Record a named moment (drawn as a vertical line on the timeline)."""
        with self._lock:
            self._marks.append((time.perf_counter() - self._t0, str(label)))

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
    def limits(self) -> dict[str, int | None]:
        s = self.samples
        return {d.device: d.limit_bytes for d in s[-1].devices} if s else {}

    @property
    def sources(self) -> dict[str, str]:
        s = self.samples
        return {d.device: d.source for d in s[-1].devices} if s else {}

    @property
    def host_anon(self) -> tuple[int | None, ...]:
        return tuple(x.host.anon for x in self.samples)

    @property
    def host_file(self) -> tuple[int | None, ...]:
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
        """Samples per second actually taken. Lower than 1/interval when the sampler thread
        cannot get the GIL, e.g. a loop of many small CPU computations (see README)."""
        return _rate(self.times)

    def peak(self, device) -> int:
        """Largest bytes-in-use sampled on a device (a name like 'cpu:0' or a Device)."""
        series = self.device_bytes.get(str(device))
        if series is None:
            raise KeyError(f"device {str(device)!r} was not tracked "
                           f"(tracked: {', '.join(self.device_names)})")
        return max(series)

    def growth(self, device) -> int:
        """Bytes in use at the end minus at the start, on one device."""
        series = self.device_bytes[str(device)]
        return series[-1] - series[0]

    def to_dict(self) -> dict:
        """Plain data: everything a renderer needs."""
        return samples_to_dict(self.samples, t0=self._t0, marks=self.marks,
                               interval=self.interval)

    def __repr__(self) -> str:
        return (f"MemoryTrace({len(self.samples)} samples over "
                f"{(self.times[-1] if self.samples else 0):.2f} s, devices={self.device_names}, "
                f"marks={[m[1] for m in self.marks]})")


@contextmanager
def track(interval: float = 0.01, *, devices=None) -> Iterator[MemoryTrace]:
    """Sample device and host memory every ``interval`` seconds while the block runs.

    A sample is taken at the start and at the end, so even a short block has two. The
    sampler thread always stops, also when the block raises (the exception propagates).

    >>> with track(interval=0.05) as trace:
    ...     trace.mark("start")
    >>> len(trace.samples) >= 2
    True
    """
    if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not (
            0 < interval <= 60):
        raise ValueError(f"interval must be seconds in (0, 60], got {interval!r}")
    devs = _resolve_devices(devices)
    trace = MemoryTrace(float(interval))
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            while not stop.wait(interval):
                trace._add(MemorySnapshot(time.perf_counter(), _device_memory(devs),
                                          _host_memory()))
        except BaseException as err:  # pragma: no cover - reported after the block
            errors.append(err)

    trace._add(snapshot(devs))
    thread = threading.Thread(target=run, name=f"helpers.memory.track-{os.getpid()}",
                              daemon=True)
    thread.start()
    try:
        yield trace
    finally:
        stop.set()
        thread.join()
        trace._add(snapshot(devs))
        trace.finished = True
    if errors:  # pragma: no cover
        raise RuntimeError(f"memory sampler failed: {errors[0]!r}") from errors[0]
