"""Host memory of a process, sampled by a helper process: outside that process's GIL.

A Python thread cannot sample while the thread dispatching JAX work holds the GIL, so the
in-process sampler of :func:`helpers.memory.track` falls far below its rate in a loop of small
computations. The host's numbers live in ``/proc/PID`` and any process may read them, so a
helper process samples them at the asked rate whatever the tracked process is doing. Linux only
(elsewhere :func:`start` returns None and the thread samples the host as before).

The helper is the child function :func:`sample_in_child` (:mod:`helpers._internal.child`):
asked with a :class:`SampleRequest`, it answers ``{"ready": true}``, samples until a line
arrives on stdin, then answers a :class:`HostSamples` (every sample, and the CPU seconds its
sampling took) and exits. No JAX import, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass

from helpers._internal import child
from helpers._internal.records import Record
from helpers.errors import ChildProcessFailed

__all__ = ["HostSampler", "HostSamples", "SampleRequest", "start"]


@dataclass(frozen=True)
class SampleRequest(Record):
    """What the helper samples: a process id, every ``interval`` seconds."""

    pid: int
    interval: float


@dataclass(frozen=True)
class HostSamples(Record):
    """The helper's answer: one row per sample (``_FIELDS``), and its own CPU seconds."""

    samples: list
    cpu_s: float


_FIELDS = ("time", "rss", "shared", "vms", "peak_rss", "available", "total")
SLOW_EVERY = 10  # the high-water mark only rises, and its last value is read at the end


def _read(fd: int, size: int = 8192) -> bytes:
    return os.pread(fd, size, 0)


def _kib(text: bytes, key: bytes) -> int:
    i = text.find(key)
    return int(text[i + len(key):].split(None, 1)[0]) * 1024 if i >= 0 else -1


def _sample_loop(pid: int, interval: float) -> tuple[list[list], float]:
    page = os.sysconf("SC_PAGE_SIZE")
    statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    status = os.open(f"/proc/{pid}/status", os.O_RDONLY)
    meminfo = os.open("/proc/meminfo", os.O_RDONLY)
    samples: list[list] = []
    slow: list = [-1, -1, -1]  # VmHWM, MemAvailable, MemTotal: read every SLOW_EVERY samples

    def sample(final: bool = False) -> bool:
        now = time.perf_counter()
        try:
            size, resident, shared = (int(x) for x in _read(statm, 200).split()[:3])
            if final or len(samples) % SLOW_EVERY == 0:  # /proc/PID/status costs ~10x statm
                st, mi = _read(status), _read(meminfo, 4096)
                slow[:] = [_kib(st, b"VmHWM:"), _kib(mi, b"MemAvailable:"),
                           _kib(mi, b"MemTotal:")]
        except OSError:  # the process ended
            return False
        samples.append([now, resident * page, shared * page, size * page, *slow])
        return True

    child.answer({"ready": True})
    cpu = time.process_time()  # ns resolution (os.times counts 10 ms ticks)
    tick = time.perf_counter()
    while sample():
        tick += interval
        wait = tick - time.perf_counter()
        if wait < 0:  # fell behind (a busy machine): keep the rate from now on
            tick, wait = time.perf_counter(), 0
        if select.select([sys.stdin], [], [], wait)[0]:
            sample(final=True)  # the end of the block: its last values, its peak
            break
    return samples, time.process_time() - cpu


class HostSampler:
    """The parent's handle on a running helper: :meth:`stop` returns its samples."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc
        #: CPU seconds the helper spent sampling (from ready to stop), known after stop()
        self.cpu_s: float | None = None
        # a handle dropped without stop(): the helper ends with it, not with this process
        self._finalizer = weakref.finalize(self, _end_helper, proc)

    def stop(self, timeout: float = 10) -> list[dict]:
        """End the helper and return its samples as dicts (``_FIELDS``); [] if it failed.
        Also sets :attr:`cpu_s`."""
        try:
            self._proc.stdin.write(b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass
        try:
            result = child.read_answer(self._proc, timeout=timeout)
            child.finish(self._proc, timeout=timeout)
        finally:  # interrupted before the helper ended: the finalizer still ends it
            if self._proc.poll() is not None:
                self._finalizer.detach()
        try:
            answer = result.answer(HostSamples, "the host-memory sampler")
            samples = [dict(zip(_FIELDS, s, strict=True)) for s in answer.samples]
        except (ChildProcessFailed, ValueError, TypeError):
            return []
        self.cpu_s = float(answer.cpu_s)
        return samples


def _end_helper(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    child.finish(proc, timeout=1)  # closes its stderr file


def start(interval: float, pid: int | None = None, *, timeout: float = 10) -> HostSampler | None:
    """Start sampling ``pid`` (default: this process) every ``interval`` seconds; None where
    there is no /proc (not Linux) or the helper could not start in ``timeout`` seconds."""
    pid = os.getpid() if pid is None else pid
    if not os.path.exists(f"/proc/{pid}/statm"):
        return None
    try:
        proc = child.start(f"{__name__}:sample_in_child", SampleRequest(pid, float(interval)))
    except OSError:
        return None
    if child.read_answer(proc, timeout=timeout).data != {"ready": True}:
        child.finish(proc, timeout=1)
        return None
    return HostSampler(proc)


def sample_in_child(request: SampleRequest) -> HostSamples:
    """The helper (run by :func:`start`, never directly): sample until told to stop."""
    try:  # yield to the workload: it needs ~1% of a core and must not preempt compute threads
        os.nice(19)
    except OSError:
        pass
    samples, cpu_s = _sample_loop(request.pid, request.interval)
    return HostSamples(samples, cpu_s)
