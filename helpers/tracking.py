"""Device and host memory over time: :func:`track` samples :func:`helpers.snapshots.snapshot`
in a background thread while a block runs, and returns a :class:`MemoryTrace`.

>>> with track(interval=0.05) as trace:
...     trace.mark("start")
>>> len(trace.samples) >= 2
True
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from helpers import _host_sampler
from helpers._jax_internals import device_name
from helpers.errors import BadInputError, MeasurementFailed
from helpers.snapshots import (
    HostMemory,
    MemorySnapshot,
    _device_memory,
    _host_memory,
    _resolve_devices,
    reset_host_peak,
    snapshot,
)
from helpers.unavailable import NOT_AVAILABLE, NotAvailable, to_json_value

__all__ = ["MemoryTrace", "samples_to_dict", "track"]


# --- tracking -----------------------------------------------------------------------------
def _rate(times) -> float:
    """Samples per second over a series of sample times."""
    return (len(times) - 1) / times[-1] if len(times) > 1 and times[-1] > 0 else 0.0


def samples_to_dict(samples, *, t0: float | None = None, marks=(), interval=None,
                    rates=None) -> dict:
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
        self.host_peak_reset = False  # was the kernel's RSS high-water mark reset at start?
        self._rates: dict[str, float] = {}  # samples per second, per source (when finished)
        #: CPU seconds the sampling itself used while the block ran, per sampler ("sampler
        #: thread" in this process, "host helper" process): what tracking costs (when finished)
        self.sampler_cpu_s: dict[str, float] = {}
        self.wall_s: float | None = None  # how long the block ran (when finished)

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
        computations. On a GPU the allocator's peak counter still catches every peak."""
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
            self._rates = {"devices": _rate([t - device_times[0] for t in device_times]),
                           "host": _rate([t - host_times[0] for t in host_times])}

    def peak(self, device) -> int:
        """Largest bytes-in-use sampled on a device (a name like 'cpu:0' or a Device)."""
        series = self.device_bytes.get(device_name(device))
        if series is None:
            raise KeyError(f"device {device_name(device)!r} was not tracked "
                           f"(tracked: {', '.join(self.device_names)})")
        return max(series)

    @property
    def host_peak(self) -> int | NotAvailable:
        """Highest host RSS while the block ran, from the kernel's high-water mark (reset
        when the block started), so a spike between two samples still counts. NOT_AVAILABLE
        where the OS keeps no such mark (not Linux) or it could not be reset."""
        with self._lock:
            peaks = [s.host.peak_rss for s in self._samples]
        if not self.host_peak_reset or any(isinstance(p, NotAvailable) for p in peaks):
            return NOT_AVAILABLE
        return max(peaks)

    def growth(self, device) -> int:
        """Bytes in use at the end minus at the start, on one device."""
        series = self.device_bytes[device_name(device)]
        return series[-1] - series[0]

    @property
    def sampling_cpu_share(self) -> float | None:
        """Samplers' CPU seconds / (block seconds x cores), None until the block ends: what
        watching cost in CPU (not the waits for the GIL it caused the block's thread)."""
        cores = (self.wall_s or 0) * (os.cpu_count() or 1)
        return sum(self.sampler_cpu_s.values()) / cores if cores and self.sampler_cpu_s else None

    def to_dict(self) -> dict:
        """Plain data: everything a renderer needs."""
        return {**samples_to_dict(self.samples, t0=self._t0, marks=self.marks,
                                  interval=self.interval, rates=self.achieved_hz_by_source),
                "sampler_cpu_s": dict(self.sampler_cpu_s)}

    def __repr__(self) -> str:
        return (f"MemoryTrace({len(self.samples)} samples over "
                f"{(self.times[-1] if self.samples else 0):.2f} s, devices={self.device_names}, "
                f"marks={[m[1] for m in self.marks]})")


@contextmanager
def track(interval: float = 0.01, *, devices=None) -> Iterator[MemoryTrace]:
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
    helper = _host_sampler.start(interval)  # None: no /proc; the thread samples the host too
    first = snapshot(devs)
    trace._add(first)

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
                trace._rates = {"devices and host": _rate(
                    [x.time - trace._samples[0].time for x in trace._samples])}
        trace.finished = True
    if errors:  # pragma: no cover
        raise MeasurementFailed(f"memory sampler failed: {errors[0]!r}") from errors[0]


def _host_from(s: dict) -> HostMemory:
    """A helper's /proc sample as HostMemory (statm's shared pages = RssFile + RssShmem)."""
    return HostMemory(rss=s["rss"], anon=s["rss"] - s["shared"], file=s["shared"],
                      vms=s["vms"], available=s["available"], total=s["total"],
                      source="helper process (/proc)",
                      peak_rss=s["peak_rss"] if s["peak_rss"] >= 0 else NOT_AVAILABLE)
