"""Which host<->device and device<->device copies a block of code made.

JAX's transfer guard (``jax.transfer_guard("log_explicit")``) writes one C++ log line per
transfer to the process's stderr, file descriptor 2, not to Python's ``sys.stderr``.
:func:`trace` points fd 2 at a temporary file for the block, restores it (also on error),
parses the guard lines, and passes every other line through to the real stderr, so nothing
is lost. A transfer counts as **explicit** when it happened inside ``jax.device_put`` /
``jax.device_get`` (the kit marks JAX's own explicit-transfer scope), else **implicit**.
Both the marking and the log's format are JAX internals (``helpers._internal.jaxcompat``): each
process's first trace starts with one tiny explicit ``device_put`` (so it starts JAX's default
backend if nothing has yet) and checks that it shows up as a marked transfer; if it does not,
every transfer's ``explicit`` is ``None`` (unknown), never a guess.

>>> import numpy as np, jax
>>> with trace() as log:
...     _ = jax.jit(lambda a, b: a + b)(np.ones(3), np.ones(3))
>>> log.count("host->device")
2

Limitations (also in the README):

- jit's C++ fast path logs the host->device copies of its arguments with no shape or dtype,
  so those transfers are counted but their bytes are unknown (``nbytes is None``).
- Reading an array on a CPU device from the host (``np.asarray(x)``, ``float(x)``) is
  zero-copy and JAX does not report it: on the CPU backend no device->host transfer appears.
  The kit counts the reads a line names (``np.concatenate(batches)``, ``float(loss)``) in
  :attr:`TransferLog.cpu_reads`, with a note; a read of an expression is not counted.
- Copies XLA makes inside a compiled computation are not guard events at all.
- The guard set by a ``with`` block is per thread (JAX's config module updates it through a
  thread-local hook): copies made by other threads of yours during the block (a prefetch
  thread, say) are not seen. A host callback's copy is, on whichever thread XLA runs it: the
  kit sets the guard there for that copy, where no level is set for the thread or the process.
- On a GPU, reading an array back (``float(x)``, ``np.asarray(x)``, printing) is an implicit
  device->host copy and is logged, once per array (jaxlib caches the host copy).
- Measured on JAX 0.10.2 (CPU): once a jitted function has run, its C++ fast path moved an
  uncommitted argument to another device without consulting the guard, so that copy was
  neither logged nor disallowed; the first call's copy is seen.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import functools
import math
import os
import re
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from helpers._internal import (
    frames,
    jaxcompat,
    jaxpr_callbacks,
    linetrace,
)
from helpers._internal.records import Display, Record
from helpers.errors import BadInputError, InUseError
from helpers.units import NOT_AVAILABLE, NotAvailable

jaxcompat.ensure_hook()  # JAX is imported: record the allocator variables at start

__all__ = ["Transfer", "TransferLog", "logged_at", "parse_guard_output", "trace"]

H2D, D2D, D2H = "host->device", "device->device", "device->host"
_BEGIN = "<<helpers.transfers explicit begin>>"
_END = "<<helpers.transfers explicit end>>"
_PROBED = "<<helpers.transfers probe done>>"
#: after an explicit scope's begin marker: the jax.device_put was given jax.Arrays
_OF_ARRAYS = "|of-arrays"
#: the level the block runs under: every transfer logged, explicit ones marked as such
_GUARD = "log_explicit"
_LINE = "<<helpers.transfers line "  # + "file:line: source>>"
#: after a line's marker: the shape and dtype of the NumPy array the line converts by name
#: (jnp.asarray(x)), read from the frame as the line starts, for the copy JAX logs with none
_SIZE = "<<helpers.transfers converts "  # + "8388608;float32>>"
_NOISE = ("WARNING: All log messages before absl::InitializeLog() is called",)
_active = threading.Lock()  # one trace at a time per process: fd 2 is process-wide


@dataclass(frozen=True)
class Transfer(Record):
    """One copy the transfer guard logged: direction, explicit or not, shape, bytes, devices."""

    direction: str  # "host->device", "device->device" or "device->host"
    explicit: bool | None  # None when the kit could not mark JAX's explicit scope
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int | NotAvailable  # NOT_AVAILABLE: JAX logged no shape (jit's C++ fast path)
    source: str | None  # "host" or a device name like "cpu:0"; None when not logged
    destination: str | None  # device name; "host" for device->host
    raw: str  # the guard's own text
    line: str = ""  # the user's line that made it ("cell.py:3: y = f(x)"); "" when not known
    reason: str = ""  # why a copy happened, from the transfer and its line (see _reason)
    logged_at: float | None = None  # when the guard logged it (seconds since the epoch)
    #: the piece of ``shape`` this copy moves, where its destination is split over a mesh (JAX
    #: logs one line per device, each with the whole shape): ``nbytes`` are the piece's
    shard_shape: tuple[int, ...] | None = None
    #: the host callback that made this copy of its arguments ("jax.debug.callback",
    #: "jax.pure_callback", "io_callback"): JAX device_puts them on every call; "" for a copy
    #: of the user's own
    made_by: str = ""


_GLOG_TIME = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,6})")


def logged_at(raw: str, *, now: float | None = None) -> float | None:
    """When a guard line was logged, in seconds since the epoch, from its glog prefix
    ("W1125 12:47:07.205781 ..."; local time, no year: the year that puts it nearest ``now``).

    >>> import datetime as dt
    >>> t = logged_at("W0102 03:04:05.000006 1 guard_lib.cc:1] x",
    ...               now=dt.datetime(2026, 1, 2, 4).timestamp())
    >>> dt.datetime.fromtimestamp(t).isoformat()
    '2026-01-02T03:04:05.000006'
    """
    m = _GLOG_TIME.match(raw)
    if not m:
        return None
    now = time.time() if now is None else now
    year = datetime.datetime.fromtimestamp(now).year
    month, day, hour, minute, second = (int(g) for g in m.groups()[:5])
    micro = int(m.group(6).ljust(6, "0"))
    try:
        stamps = [datetime.datetime(y, month, day, hour, minute, second, micro).timestamp()
                  for y in (year - 1, year, year + 1)]
    except ValueError:  # 29 February in a year that has none
        return None
    return min(stamps, key=lambda t: abs(t - now))


def _itemsize(dtype: str) -> int | None:
    try:
        return np.dtype(jax.numpy.dtype(dtype)).itemsize
    except Exception:
        return None


def parse_guard_output(text: str, *, marked: bool = True, processes: int = 1
                       ) -> tuple[list[Transfer], list[str]]:
    """Split captured stderr into transfers and the other lines (returned unchanged).

    Lines between the kit's explicit markers are explicit transfers, the rest implicit. With
    ``marked=False`` (the markers could not be installed, or did not show up in the log)
    explicitness is unknown (None), never guessed. ``processes``: the JAX job's process count
    (where it is more than one, a jax.device_put onto a sharding over the job names its check).
    """
    transfers: list[Transfer] = []
    other: list[str] = []
    scopes: list[str] = []  # the explicit scopes open: "" or the host callback that opened it
    where = ""
    converts = None  # (shape, dtype) of the NumPy array the line being run converts by name
    for line in text.splitlines():
        if line.startswith(_BEGIN):  # followed by the host callback's name, for its copies
            scopes.append(line[len(_BEGIN):])
            continue
        if line == _END:
            if scopes:
                scopes.pop()
            continue
        if line.startswith(_LINE):
            where, converts = line[len(_LINE):].removesuffix(">>"), None
            continue
        if line.startswith(_SIZE):
            dims, _, kind = line[len(_SIZE):].removesuffix(">>").partition(";")
            converts = tuple(int(d) for d in dims.split(",") if d), kind
            continue
        fields = jaxcompat.parse_guard_line(line)
        if fields is None:
            if line.strip() and not line.startswith(_NOISE):
                other.append(line)
            continue
        direction, shape, dtype = fields["direction"], fields["shape"], fields["dtype"]
        if shape is None and converts and direction == H2D and not scopes:
            # jnp.asarray's own jit after its first call logs no shape: the array it was given
            (shape, dtype), converts = converts, None
        piece = fields.get("shard_shape")
        nbytes = NOT_AVAILABLE
        if shape is not None:
            size = _itemsize(dtype)
            nbytes = NOT_AVAILABLE if size is None else size * math.prod(piece or shape)
        src, dst = fields["source"], fields["destination"]
        if direction == H2D:
            src = "host"
        elif direction == D2H:
            dst = "host"
        explicit = bool(scopes) if marked else None
        split = piece is not None and piece != shape
        of_arrays = bool(marked and scopes and scopes[-1].endswith(_OF_ARRAYS))
        made_by = next((s.removesuffix(_OF_ARRAYS) for s in reversed(scopes)
                        if s.removesuffix(_OF_ARRAYS)), "") if marked else ""
        made_by, _, vmapped = made_by.partition(_VMAPPED)
        reason = (_callback_reason(made_by, vmapped=vmapped != "no") if made_by else
                  _reason(direction, explicit, shape, dtype, where, dst, split, of_arrays))
        transfers.append(Transfer(direction, explicit, shape, dtype, nbytes, src, dst,
                                  fields["raw"], where, reason, logged_at(line), piece,
                                  made_by))
    return (_process_checks(transfers) if processes > 1 else transfers), other


#: the copies jax.device_put makes, in a job of several processes, to check that each passed
#: the same host value before it puts it onto a sharding over every process: the whole array
#: to each of this process's devices for multihost_utils.assert_equal's all-gather
#: (jax/_src/dispatch.py). Measured on 2 processes of 2 CPU devices, jax 0.8.0 and 0.10.2: a
#: 4 MiB array, 10 MiB copied per process, 2 MiB with jax.make_array_from_callback
_PROCESS_CHECK = (
    "the check jax.device_put makes before it puts host data onto a sharding over every process "
    "of the job: that each process passed the same value (multihost_utils.assert_equal, an "
    "all-gather of the whole array from every process), for which it copies the whole array to "
    "each of this process's devices. Build the array from this process's own pieces instead, "
    "jax.make_array_from_callback(shape, sharding, lambda index: x[index]) (or "
    "jax.make_array_from_process_local_data), which checks nothing and copies only those "
    "pieces (sgl-project/sglang-jax#1434)")
_WHOLE_TO_ONE = re.compile(r"dst_sharding=SingleDeviceSharding\(")
_ONTO_MESH = re.compile(r"dst_sharding=NamedSharding\(")


def _process_checks(transfers: list[Transfer]) -> list[Transfer]:
    """``transfers`` with the copies of jax.device_put's check across processes named
    (:data:`_PROCESS_CHECK`): on a jax.device_put line, just before it puts the value onto a
    mesh (from the host, or from a device where it was a jax.Array not committed: jnp.asarray's),
    the explicit host-to-device copies of the whole array, one to each device; an earlier copy
    on the line (jnp.asarray's own, explicit on jax 0.8.0) is not the check's."""
    import dataclasses

    out = list(transfers)
    for n, t in enumerate(transfers):
        if not (t.explicit and t.direction in (H2D, D2D) and _ONTO_MESH.search(t.raw)
                and "device_put(" in t.line) or (
                    n and transfers[n - 1].line == t.line and _ONTO_MESH.search(
                        transfers[n - 1].raw)):  # the first copy onto the mesh
            continue
        devices: set = set()
        for k in range(n - 1, -1, -1):  # the run of whole copies just before it, one a device
            c = transfers[k]
            if not (c.line == t.line and c.explicit and c.direction == H2D and c.shape == t.shape
                    and _WHOLE_TO_ONE.search(c.raw)) or c.destination in devices:
                break
            devices.add(c.destination)
            out[k] = dataclasses.replace(c, reason=_PROCESS_CHECK)
    return out


#: jnp's creation functions that, given ``device=``, build the whole array on the default device
#: and then copy it there (measured on jax 0.8.0 and 0.10.2 for each name; jax/_src/lax/lax.py,
#: ``full``: the fill value is broadcast where it lives, then placed, an implicit copy; arange
#: and eye copy with an explicit device_put; jax-ml/jax#25396)
_MADE_ON_DEFAULT = re.compile(r"\bjnp\.(?:zeros|ones|full|empty|arange|eye)(?:_like)?\("
                              r".*\bdevice\s*=")
#: of those, the ones that fill a value: given a sharding over several devices, they make one
#: piece on the default device and copy it to each (jax/_src/lax/lax.py, ``full``; a 4 MiB
#: array over 4 CPU devices: four 1 MiB copies, peak host memory as for the array alone, jax
#: 0.8.0 and 0.10.2), where arange and eye make the whole array first
_FILLED = re.compile(r"\bjnp\.(?:zeros|ones|full|empty)(?:_like)?\(")
#: a slice with a bound (x[a:b]) on a line that calls nothing outside its brackets: the
#: copies of its bounds JAX's fast path logs with no shape (the first with one: "an index")
_SLICED = re.compile(r"[\w\]]\[[^\]]*:[^\]]*\]")
#: an index into a name (x[0, 0], x[i]), innermost brackets
_INDEXED = re.compile(r"[\w\])]\[[^\[\]]*\]")
#: a Python loop or comprehension over a name (or its attribute or slice), not over a call
#: (range(n), zip(...)): where the copies are a host->device index's, the iterable is a
#: jax.Array JAX slices piece by piece (huggingface/transformers#14864)
_ITERATED = re.compile(r"\b(for\s+[\w, ()]+?\s+in\s+([A-Za-z_][\w.]*(?:\[[^\]]*\])?))"
                       r"\s*(?:[\])]|:|$|\bif\b)")
#: the names a line calls, and those that only read an element (a line that calls anything
#: else, f(x) for x in xs, may copy for that call: a jitted f's NumPy argument)
_CALLED = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
#: what else a line may do with the element, each with copies of its own: arithmetic with a
#: Python number (a * 2.0), an index (x[i])
_ARITHMETIC = r"[-+*/%@]"
_WORKS = re.compile(_ARITHMETIC + r"|\w\[")
_READS = frozenset({"int", "float", "bool", "complex", "list", "tuple", "str", "print", "len",
                    "range", "enumerate", "zip", "np.asarray", "np.array", "numpy.asarray"})
#: the way to put host data over a mesh piece by piece (each device's piece copied once)
_FROM_CALLBACK = re.compile(r"\bmake_array_from_(?:callback|single_device_arrays|"
                            r"process_local_data)\(")


#: a line that is jnp.array / jnp.asarray of something (assigned, returned, or a statement):
#: jax 0.10.2 copies even an aligned NumPy array there, where jax.device_put uses it in place
#: on the CPU (measured; on 0.8.0 jnp.asarray used it in place, jnp.array copied)
#: a jax.device_put whose array is computed in its own argument, on the line: made on the default
#: device, then copied (jax-ml/jax#957: jax.device_put(jax.random.bernoulli(key, ...), cpu))
_PUT_OF_A_CALL = re.compile(r"\bdevice_put\(\s*[\w.]+\(")
_CONVERTED = re.compile(r"^(?:return\s+|yield\s+|[\w.,\s\[\]]+=\s*)?jnp\.(?:asarray|array)\(|"
                        r"jnp\.(?:asarray|array)\(\w+\)\s+for\s|"  # one per item of a loop
                        r"\bmap\(\s*jnp\.(?:asarray|array)\s*,")  # (jax.tree.map, map)
#: host data converted at once above this many bytes: a dataset, held twice while both live
_WHOLE_DATASET = 8 * 2**20
#: a line that loads a .npy file memory-mapped through jnp (jax.numpy.load is np.load, then
#: jnp.asarray of what it returns: jax/_src/numpy/lax_numpy.py, jax 0.8.0 and 0.10.2)
_MAPPED_LOAD = re.compile(r"\b(?:jnp|jax\.numpy)\.load\(.*\bmmap_mode\s*=")
#: what such a line does, and the fix: measured with a 64 MiB file (jax-ml/jax#20418; on jax
#: 0.10.2 +64 MiB anonymous, 0 on 0.8.0; on 0.12.0.1 a write to the file is not seen, a copy
#: too; jax.device_put of the memmap 0 MiB on all, the write back read back from the file)
_MAPPED_LOAD_REASON = (
    "jnp.load(..., mmap_mode=...) returns a jax.Array, not a memmap: it is np.load, then "
    "jnp.asarray of the mapping, which on jax 0.10.2 and 0.12.0 copies the whole file into "
    "memory (0.8.0 used the mapping in place), and the result has no flush() "
    "(jax-ml/jax#20418). Keep the memmap, m = np.load(path, mmap_mode='r+'), pass "
    "jax.device_put(m) (on the CPU it uses the mapping in place: 0 MiB added), and write back "
    "through m: m[...] = np.asarray(new); m.flush()")
#: a jax.device_put of a jax.Array that JAX logs as copies from the host: the pieces the new
#: placement needs are none of the array's own, so JAX reads the whole array to the host
#: (x._value, kept on the array as its host copy) and puts each piece again
#: (shard_sharded_device_array_slow_path in jax/_src/array.py, 0.8.0 to 0.12.0.1: Python, the
#: same on every backend; run on the CPU only). A jit with out_shardings reshards on the
#: devices, no host copy logged (jax-ml/jax#4885)
_RESHARDED_THROUGH_HOST = (
    "jax.device_put of a jax.Array to a placement whose pieces it does not hold: JAX reads the "
    "whole array to the host (and keeps that host copy on the array) and puts each piece "
    "again, a round trip through host memory (jax/_src/array.py, "
    "shard_sharded_device_array_slow_path; on a GPU not yet run). To reshard on the devices, "
    "jax.jit(lambda a: a, out_shardings=sharding)(x): XLA moves the pieces between devices, "
    "with no copy through the host (jax-ml/jax#4885)")
#: a jax.device_put of host data onto a sharding over several devices: one copy per device,
#: each of its piece, from a host array that is whole first (jax-ml/jax#2651: an array larger
#: than the host's memory, which fits the devices together). make_array_from_callback reads
#: each piece where the callback finds it (checked with a np.memmap: one call per device, each
#: a quarter of the rows over 4 CPU devices, jax 0.8.0 and 0.10.2)
_PIECES_FROM_HOST = (
    "jax.device_put of host data onto a sharding: each device's piece copied from the host "
    "array, which is whole in host memory first (unless it is a memmap). Where the whole does "
    "not fit the host, read each device's piece from where it is stored with "
    "jax.make_array_from_callback(shape, sharding, lambda index: source[index]) (source: "
    "np.load(path, mmap_mode='r'), an h5py dataset), which holds only the pieces "
    "(jax-ml/jax#2651)")
#: what the CPU backend does with a NumPy array: measured on jax 0.8.0 and 0.10.2 (a 191 MiB
#: argument added 0 MiB to the peak when 64-byte aligned, 191 MiB when not)
_ON_THE_CPU = (" (on the CPU backend an array aligned to 64 bytes is used in place, with no "
               "copy, but NumPy promises only 16-byte alignment)")
#: what refilling the NumPy buffer after a put does to the array put, on the CPU backend
#: (jax-ml/jax#37830; a 256 KiB buffer refilled after each put into a queue of 2, 8 runs each,
#: jax 0.8.0 and 0.10.2: device_put corrupted 8 of 8 runs aligned, 5 to 8 of 8 unaligned, and
#: with may_alias=False 7 to 8 of 8; device_put(buf.copy()) 0 of 8)
_REFILLED = (": refilling that NumPy buffer after the put can change the array put, aligned "
             "(shared) or not (its copy may be taken after the call returns), as a loader "
             "that reuses one batch buffer finds (jax-ml/jax#37830; may_alias=False did not "
             "prevent it); give each batch its own array, jax.device_put(np.copy(buf))")


#: after a host callback's name in its scope's marker: whether it runs under jax.vmap
#: ("yes", "no", or "?" where the program it runs in could not be read)
_VMAPPED = "|vmap="


def _callback_label(seen: dict, name: str) -> str:
    """The marker's text for the host callback ``name`` copying its arguments: its name and
    whether it runs under jax.vmap (read from the jaxpr of the program it runs in, once per
    program and callback: ``seen``; "?" where that cannot be read)."""
    site = jaxcompat.running_callback_site()
    if site is None:
        return f"{name}{_VMAPPED}?"
    _, callback, jaxpr = site
    key = (id(jaxpr), id(callback))
    if key not in seen:
        try:
            found = (None if jaxpr is None or callback is None else
                     jaxpr_callbacks.callback_vmapped(jaxpr, callback))
        except Exception:  # never break the user's program over a label
            found = None
        seen[key] = ("?" if found is None else "yes" if found else "no", jaxpr, callback)
    return f"{name}{_VMAPPED}{seen[key][0]}"


def _callback_reason(callback: str, vmapped: bool = True) -> str:
    """Why a host callback's copy happened, and the fix where the callback only reports; the
    paragraph on jax.vmap only where it runs under one (``vmapped``: or where that is unknown;
    a jax.debug.callback in a scan body with no vmap gets the loop's fix alone)."""
    who = (callback + " (or jax.debug.print, which calls it)" if callback == "jax.debug.callback"
           else callback)
    said = ("the copy " + who + " makes of its arguments on every call (JAX device_puts "
            "them to the CPU before calling your function), not a device_put of yours: in a "
            "loop body it runs, and copies, on every iteration")
    if callback == "jax.pure_callback":
        return said
    # under vmap, one call per element: io_callback's rule is a lax.map, debug_callback's an
    # unrolled call per element, and a cond around either there becomes a select (pylcm#316)
    fix = jaxpr_callbacks.progress_fix(callback)
    if not vmapped:
        return f"{said}. {fix[0].upper()}{fix[1:]}"
    return (f"{said}, and under jax.vmap once per element, one after another. Under jax.vmap "
            "(preflight_step(step, *args) names it), call it once, outside the vmap, on the "
            "whole batched array (OpenSourceEconomics/pylcm#316: 4,096 calls and 112 ms a step "
            "became 1 call and 0.25 ms, on a CPU); a lax.cond on a per-element predicate does "
            "not gate it there (an io_callback raises NotImplementedError, a jax.debug.callback "
            f"runs for every element). In a loop, {fix}")


#: added to a conversion of host data of :data:`_WHOLE_DATASET` bytes or more
_DATASET_UP_FRONT = (". Converted whole and up front, the data is held twice while the NumPy "
                     "array lives, on the host and on the device (on the CPU backend too where "
                     "the conversion copies, as jnp.asarray does from jax 0.10.1): if it is a "
                     "dataset read batch by batch, keep it as NumPy and put each batch on the "
                     "device as it is used (markean/aimz#170); if it is used whole (weights), "
                     "drop the NumPy one once converted")


def _nbytes(shape, dtype) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (JAX's log's name); 0 where not known."""
    size = _itemsize(dtype) if shape and dtype else None
    return size * math.prod(shape) if size else 0


def _reason(direction: str, explicit: bool | None, shape, dtype, where: str,
            destination: str | None = None, split: bool = False, of_arrays: bool = False
            ) -> str:
    """Why the copy happened, in a few words, from what the guard logged and the user's line
    (``split``: the destination is split over a mesh, one copy per device; ``of_arrays``: a
    jax.device_put given jax.Arrays, not host data)."""
    source = where.split(": ", 1)[-1] if where else ""
    if direction == H2D and explicit and of_arrays:
        return _RESHARDED_THROUGH_HOST
    if direction == D2D and split and _MADE_ON_DEFAULT.search(source) and _FILLED.search(
            source):
        return ("each device's piece made on the default device, then copied to it: no "
                "device holds the whole array (jnp's fill functions make one piece for a "
                "sharding); jax.jit(lambda: ..., out_shardings=sharding)() makes each piece "
                "where it lives, with no copy")
    if direction == D2D and split and _MADE_ON_DEFAULT.search(source):
        return ("made whole on the default device, then split over the sharding you named, "
                "each piece copied from there: that device holds the whole array and its "
                "pieces at once (jax-ml/jax#14075); make it inside jax.jit(lambda: ..., "
                "out_shardings=sharding)() instead, and each device makes its own piece")
    if direction == D2D and split and explicit:
        return ("jax.device_put to a sharding over several devices, each piece copied from "
                "another device: where the array was whole on one device, that device holds "
                "it and the pieces at once (jax-ml/jax#14075); put host data (NumPy) straight "
                "onto the sharding, or make the array inside jax.jit(..., "
                "out_shardings=sharding), and no device holds it whole")
    if direction in (D2D, D2H) and _MADE_ON_DEFAULT.search(source):
        return ("made whole on the default device, then copied to the device= you named "
                "(jnp's creation functions do so): it needs room there first; create it "
                "inside `with jax.default_device(device):` instead, and commit it there with "
                "jax.device_put(x, device), which copies nothing")
    if direction == D2D and split and not explicit:
        return ("an array split over the devices of a sharding (a jit's in_shardings, or a "
                "sharded operation), each device's piece copied to it from where the array "
                "was: put host data straight onto its pieces, jax.device_put(x, sharding), or "
                "make it inside the step, rather than on other devices first")
    # (on a GPU machine a put to the CPU may be logged as device->host: the same advice there,
    # from this rule, not yet run on a GPU)
    if direction in (D2D, D2H) and explicit and _PUT_OF_A_CALL.search(source):
        return ("jax.device_put of an array computed in its own argument: it was made on "
                "another device (where its inputs were: computation follows data), then copied. "
                "Compute it where it is needed instead: put its inputs there first (e.g. "
                "jax.device_put(key, device), then jax.random.bernoulli(key, ...)), or run it "
                "under jax.default_device(device) (jax-ml/jax#957)")
    if direction == D2D and explicit:
        return "jax.device_put of an array on another device: a copy from there"
    if direction == D2D:
        return "an array on another device moved to where the computation runs"
    if direction == D2H:
        return ("jax.device_get" if explicit else
                "reading a value back (np.asarray, float(), print, .item(), a Python if)")
    cpu = (destination or "").startswith("cpu")
    if _MAPPED_LOAD.search(source):  # explicit on 0.8.0, implicit on 0.10.2: the same line
        return _MAPPED_LOAD_REASON
    if explicit and split and direction == H2D:
        return _PIECES_FROM_HOST
    if explicit:  # (jax < 0.10.1 logs jnp.asarray as one: its own put, aliasing on the CPU)
        return "jax.device_put" + (_ON_THE_CPU + _REFILLED if cpu and shape else "") + (
            _DATASET_UP_FRONT if direction == H2D and _CONVERTED.search(source)
            and _nbytes(shape, dtype) >= _WHOLE_DATASET else "")
    if _CONVERTED.search(source) and shape != ():  # on its fast path too (no shape logged)
        return ("jnp.array or jnp.asarray of host data: a copy, on the CPU backend too "
                "(jax 0.10.2 copies even an aligned NumPy array there, where jax.device_put(x) "
                "uses an array aligned to 64 bytes in place), though it may be taken after "
                "the call returns: refill the NumPy buffer only after x.block_until_ready(), "
                "or np.copy it first (jax-ml/jax#37830); a Python list, flat or nested, "
                "converts far faster as jnp.array(np.array(x))" + (
                    _DATASET_UP_FRONT if _nbytes(shape, dtype) >= _WHOLE_DATASET else ""))
    if direction == H2D and shape in (None, ()) and (found := _ITERATED.search(source)) and \
            set(_CALLED.findall(source)) <= _READS and not _WORKS.search(
                source.replace(found.group(1), "")):  # (f(x), a * 2.0, x[i]: their own copies)
        return (f"iterating over {found.group(2)} in Python ({found.group(1)}), if it is "
                "a jax.Array: JAX slices it on the device a piece at a time, each slice a small "
                "copy of its start indices and a dispatch, and each element read back (int(x), "
                "float(x)) waits for it. Convert it once, np.asarray(x), and iterate over that "
                "(huggingface/transformers#14864: a data loader indexed its dataset with a "
                "jax.random.permutation; np.asarray of it left no copies)")
    if _FROM_CALLBACK.search(source):
        return ("each device's piece of the array copied to it once, from the data your "
                "callback returned: no device holds the whole array (the way to put host data "
                "over a mesh)")
    if shape is None and _SLICED.search(source) and not re.search(
            _ARITHMETIC + r"|\(", re.sub(r"\[[^\]]*\]", "", source)):  # a bare name = x[a:b]
        shape, dtype = (), "int32"  # a slice's bounds on JAX's fast path, which logs no shape
    code = source.split("#", 1)[0]  # (a comment's words are no code: a review)
    if shape is None and _INDEXED.search(code) and set(_CALLED.findall(code)) <= _READS \
            and set(_CALLED.findall(code)) and not re.search(r"\]\s*\(", code) \
            and not re.search(_ARITHMETIC, _INDEXED.sub("", code)):
        # an element read (float(b[0, 0]) for b in batches): its indices, not a jit's argument
        # (a new user's trial was told "an argument of a jitted call")
        shape, dtype = (), "int32"
    if shape is None and (jnp_only := _jnp_functions(source)):
        fn = jnp_only[0]
        numpy_has = _numpy_has(fn)
        host = (f"do it with NumPy, np.{fn}, and put the result once: one copy" if numpy_has
                else "do it with NumPy and put the result once: one copy")
        return (f"a NumPy array passed to jnp.{fn}, which JAX runs as a jitted function of its "
                "own: copied to the device at every call (its fast path logs no shape). Where "
                f"the line prepares a batch on the host (padding, stacking), {host} "
                "(markean/aimz#174: jnp.pad of each batch, even with nothing to pad)"
                + (_ON_THE_CPU if cpu else ""))
    if shape is None:
        return ("an argument of a jitted call: a NumPy array or a Python number, copied on "
                "every call (jit's fast path logs no shape)" + (_ON_THE_CPU if cpu else ""))
    if shape == ():
        if "[" in source and dtype and "int" in dtype:
            return ("an index or slice bound: JAX's slicing outside jit puts a start index on "
                    "the device for every dimension of the array, 4 bytes each, sliced or not, "
                    "whether your int or a constant (jax.lax.slice with static bounds too; "
                    "jax-ml/jax#26425); after the first, its fast path logs no shape. Inside "
                    "jax.jit the bounds are part of the program and nothing is copied; it "
                    "matters in a hot loop or under jax.transfer_guard('disallow')")
        return "a Python number (or a 0-d NumPy array) turned into an array"
    if split:
        return ("each device's piece of a NumPy array copied to it from the host at each call "
                "(a pmap's or a sharded jit's argument), no device holding it whole: the one "
                "copy a batch new each step needs (a jax.device_put(x) of it first would put it "
                "whole on one device and split it from there: google/flax#948); only an array "
                "passed again unchanged gains from jax.device_put(x, sharding) once, passing "
                "the result")
    return ("a NumPy array passed to a JAX operation or a jit: copied each time it is passed, "
            "the one copy a batch new each step needs (to overlap it with the step, put the "
            "next batch before the step runs: flax.jax_utils.prefetch_to_device); only an "
            "array passed again unchanged gains from jax.device_put once, passing the result"
            + (_ON_THE_CPU if cpu else ""))


#: jnp's functions that make an array from shapes and numbers: their copy is of a number
_CREATIONS = frozenset({"ones", "zeros", "full", "empty", "arange", "linspace", "eye",
                        "identity", "ones_like", "zeros_like", "full_like", "empty_like",
                        "array", "asarray"})


def _jnp_functions(source: str) -> list[str]:
    """The one jnp function a line calls, where it makes no other call (but reads such as len,
    or NumPy's) and no number is among that call's own arguments: "return jnp.pad(x, ...)" ->
    ["pad"], "jnp.linalg.norm(v)" -> ["linalg.norm"]; [] for anything else: a function of the
    user's, two jnp calls (which one took the copy is not known), a creation (jnp.ones(10)),
    a number passed (jnp.maximum(x, 1.0): the number is what is copied; a review)."""
    return list(_jnp_function_of(source))


@functools.lru_cache(maxsize=256)
def _jnp_function_of(source: str) -> tuple[str, ...]:
    """:func:`_jnp_functions`, read once per line of source: the log's reasons are worked out
    for each copy, and a loop makes thousands at one line (each would parse it again)."""
    called = [c for c in _CALLED.findall(source) if c not in _READS]
    fns = [c.split(".", 1)[1] for c in called if c.startswith(("jnp.", "jax.numpy."))]
    others = [c for c in called if not c.startswith(("jnp.", "jax.numpy.", "np.", "numpy."))]
    if len(fns) != 1 or others or fns[0].rsplit(".", 1)[-1] in _CREATIONS:
        return ()
    try:
        tree = ast.parse(source.strip().removesuffix(":"))
    except SyntaxError:  # a line of a statement that goes on: not read
        return ()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(fns[0]) and any(
                isinstance(a, ast.Constant) and isinstance(a.value, (int, float, complex))
                or isinstance(a, ast.UnaryOp) and isinstance(a.operand, ast.Constant)
                for a in (*node.args, *(k.value for k in node.keywords))):
            return ()
    return tuple(fns)


def _numpy_has(name: str) -> bool:
    """NumPy has a function of that dotted name ("pad", "linalg.norm")."""
    found = np
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            return False
    return callable(found)


def _split_probe(text: str) -> tuple[str, bool]:
    """(the block's own log, whether the markers worked). :func:`trace` starts each capture
    with one explicit ``jax.device_put`` (the probe) and a separator line: the markers work
    when the probe's transfer shows up between them."""
    head, sep, rest = text.partition(_PROBED + "\n")
    if not sep:
        return text, False
    lines = head.splitlines()
    try:
        i, j = lines.index(_BEGIN), len(lines) - 1 - lines[::-1].index(_END)
    except ValueError:
        return rest, False
    seen = [jaxcompat.parse_guard_line(x) for x in lines[i + 1:j]]
    ok = any(f is not None and f["direction"] == H2D for f in seen)
    other = [x for x in lines if x not in (_BEGIN, _END) and
             jaxcompat.parse_guard_line(x) is None]
    return "\n".join([*other, rest]), ok


#: a line that read several arrays back, one copy each (QuEraComputing/tsim#149; from the
#: thread, not yet run on a GPU)
_JOIN_FIX = ("join them on the device first (jnp.concatenate or jnp.stack, or keep a step's "
             "values there and read them every n steps), then read once: one copy "
             "(QuEraComputing/tsim#149: np.concatenate of a list of device results; from the "
             "thread, not yet run on a GPU)")
_JOIN_READS = "{n} arrays read back one copy at a time: " + _JOIN_FIX
#: a line that hands what it reads to another framework's tensor (Astera-org/simplexity#70:
#: torch.from_numpy(np.asarray(x)).to("cuda"), device to host to device for every batch)
_HANDED_OVER = re.compile(r"\b(?:cupy|cp)\.(?:asarray|array)\(|\b(?:torch|tf|tensorflow)\.(?:"
                          r"from_numpy|tensor|as_tensor|convert_to_tensor|constant)\(.*(?:\.to\(|"
                          r"\.cuda\(|\bdevice\s*=)")
_HANDOFF_FIX = ("the read feeds another framework's tensor, so the bytes go device to host and "
                "back: hand the array over on the device instead with DLPack, "
                "torch.from_dlpack(x) (cupy.from_dlpack(x); TensorFlow: "
                "tf.experimental.dlpack.from_dlpack(x.__dlpack__())), which shares its buffer "
                "(Astera-org/simplexity#70; jax.dlpack.to_dlpack is gone since jax 0.7: pass "
                "the array itself)")


class TransferLog(Display):
    """The transfers one :func:`trace` block made. Filled when the block ends."""

    def __init__(self) -> None:
        self._transfers: tuple[Transfer, ...] = ()
        self.finished = False
        self.explicit_marked = False
        self.started_at = time.time()  # seconds since the epoch, to line up with other logs
        #: copies the block may have made that JAX's transfer guard does not log, one sentence
        #: each: an uncommitted array off the default device (:func:`_off_default_note`)
        self.unlogged: tuple[str, ...] = ()
        #: {line: {"runs", "arrays", "bytes"}}: the reads back to the host of arrays on CPU
        #: devices that a line of the block named, which copy nothing there and JAX never logs
        #: (np.asarray(x), np.concatenate(list_of_arrays), float(x), x.item(), print(x))
        self.cpu_reads: dict[str, dict] = {}

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return self._transfers

    def __len__(self) -> int:
        return len(self._transfers)

    def __iter__(self):
        return iter(self._transfers)

    def select(self, direction: str | None = None, *, explicit: bool | None = None
               ) -> tuple[Transfer, ...]:
        """The transfers in ``direction`` (all if None), explicit or implicit (both if None)."""
        if direction is not None and direction not in (H2D, D2D, D2H):
            raise BadInputError(f"direction must be one of {H2D!r}, {D2D!r}, {D2H!r}; "
                                f"got {direction!r}")
        return tuple(t for t in self._transfers
                     if (direction is None or t.direction == direction)
                     and (explicit is None or t.explicit is explicit))

    def count(self, direction: str | None = None, *, explicit: bool | None = None) -> int:
        """How many transfers :meth:`select` finds."""
        return len(self.select(direction, explicit=explicit))

    def bytes(self, direction: str | None = None, *, explicit: bool | None = None) -> int:
        """Known bytes moved (transfers logged without a shape add nothing)."""
        return sum(t.nbytes or 0 for t in self.select(direction, explicit=explicit))

    def summary(self) -> list[dict]:
        """One row per (direction, explicit): count, known bytes, how many had no shape."""
        rows: dict[tuple, dict] = {}
        for t in self._transfers:
            key = (t.direction, t.explicit)
            row = rows.setdefault(key, {"direction": t.direction, "explicit": t.explicit,
                                        "count": 0, "bytes": 0, "unknown_size": 0})
            row["count"] += 1
            if t.nbytes is NOT_AVAILABLE:
                row["unknown_size"] += 1
            else:
                row["bytes"] += t.nbytes
        order = {H2D: 0, D2D: 1, D2H: 2}
        return sorted(rows.values(), key=lambda r: (order[r["direction"]], r["explicit"] is not
                                                    True))

    def by_line(self) -> list[dict]:
        """One row per user line that made copies, most copies first: the line, count, known
        bytes, and the reasons."""
        rows: dict[str, dict] = {}
        reads: dict[str, int] = {}  # a line -> its reads back to the host (implicit)
        for t in self._transfers:
            row = rows.setdefault(t.line or "(line not known)", {
                "line": t.line or "(line not known)", "count": 0, "bytes": 0, "reasons": []})
            row["count"] += 1
            row["bytes"] += t.nbytes or 0
            if t.reason not in row["reasons"]:
                row["reasons"].append(t.reason)
            if t.direction == D2H and not t.explicit:
                reads[row["line"]] = reads.get(row["line"], 0) + 1
        for line, n in reads.items():
            if _HANDED_OVER.search(line):
                rows[line]["reasons"].append(_HANDOFF_FIX)
            elif n > 1 and line != "(line not known)":  # (JAX copies an array back once)
                rows[line]["reasons"].append(_JOIN_READS.format(n=n))
        return sorted(rows.values(), key=lambda r: -r["count"])

    def to_dict(self) -> dict:
        """Plain data: every transfer, the :meth:`summary` and :meth:`by_line` rows, and the
        reads on CPU devices that JAX does not log (:attr:`cpu_reads`)."""
        return {"transfers": [t.to_dict() for t in self._transfers],
                "summary": self.summary(), "by_line": self.by_line(),
                "cpu_reads": self.cpu_reads, "started_at": self.started_at}


# --- which line of the user's code made a copy ----------------------------------------------
def _label(frame) -> str:
    """ "file.py:12: source", or "cell, line 3: source" for a notebook cell."""
    return frames.line(frame.f_code.co_filename, frame.f_lineno)


@contextlib.contextmanager
def _lines_marked(write: Callable[[str], None],
                  reads: dict[str, dict] | None = None) -> Iterator[None]:
    """While active, each line of user code that runs in this thread writes a marker to the
    log first, so the guard's lines that follow belong to it (the kit's one line tracer, shared
    with ``%%memory``). Does nothing while another tracer (a debugger, coverage) is installed:
    the kit never displaces it. ``reads``, where given, gathers the reads back to the host of
    arrays on CPU devices that a line names (:func:`_cpu_reads`), which JAX never logs."""
    labels: dict[tuple[str, int], str] = {}  # (file, line) -> its marker, made once
    names: dict[tuple[str, int], str] = {}  # (file, line) -> the name it converts, or ""
    read: dict[tuple[str, int], tuple[str, ...]] = {}  # (file, line) -> the names it reads
    counted: dict[int, Any] = {}  # id -> a weak reference to the array whose read is counted
    last = [""]  # the marker written last: writing it again would change nothing

    def mark(frame) -> None:
        key = (frame.f_code.co_filename, frame.f_lineno)
        marker = labels.get(key)
        if marker is None:
            marker = labels[key] = f"{_LINE}{_label(frame)}>>"
            source = marker.removesuffix(">>").partition(": ")[2]
            found = _CONVERTS_NAME.search(source)
            names[key] = found.group(1) if found else ""
            read[key] = _read_names(source) if reads is not None else ()
        if marker != last[0]:
            last[0] = marker
            write(marker)
        if names[key] and (size := _converted_size(frame, names[key])):
            write(size)
        if read[key] and (arrays := [a for a in _cpu_reads(frame, read[key])
                                     if _first_read(counted, a)]):
            row = reads.setdefault(labels[key][len(_LINE):-2], {"runs": 0, "arrays": 0,
                                                                 "bytes": 0})
            row["runs"] += 1
            row["arrays"] += len(arrays)
            row["bytes"] += sum(a.nbytes for a in arrays)

    with linetrace.follow(mark):
        yield


#: a line that is one conversion of one named value, all of its right-hand side, with no dtype:
#: "y = jnp.asarray(x)", "return jnp.array(self.data)" (not a conditional, a tuple of two, a
#: dtype= that changes the bytes, nor a comprehension's item, unbound as the line starts)
_CONVERTS_NAME = re.compile(r"^(?:return\s+|[\w.\[\]'\"]+\s*=\s*)?jnp\.(?:asarray|array)\("
                            r"\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\s*\)\s*(?:#.*)?$")


#: a line's reads of a named value back to the host: NumPy's conversions and joins of it (a
#: list of arrays too), float/int/bool/print/jax.device_get of it, its .item() and .tolist()
_READS_NAMED = (
    re.compile(r"\b(?:np|numpy)\.(?:asarray|array|concatenate|stack|vstack|hstack|copy)\("
               r"\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\s*[,)]"),
    re.compile(r"(?<![\w.])(?:float|int|bool|print|jax\.device_get)\("
               r"\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\s*[,)]"),
    re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\.(?:item|tolist)\(\)"))


def _read_names(source: str) -> tuple[str, ...]:
    """The names a line of source reads back to the host, each once, in order."""
    found = [m.group(1) for pattern in _READS_NAMED for m in pattern.finditer(source)]
    return tuple(dict.fromkeys(found))


def _first_read(counted: dict[int, Any], x) -> bool:
    """Whether the block reads ``x`` back for the first time (a GPU copies an array back
    once), and mark it read. By a weak reference, not the id alone: an array freed in the block
    leaves its id to the next one made (each epoch's permutation, read back at one line, was
    counted once for three epochs in a new user's trial)."""
    ref = counted.get(id(x))
    if ref is not None and ref() is x:
        return False
    try:
        counted[id(x)] = weakref.ref(x)
    except TypeError:  # no weak references to it: counted by its id while the block runs
        counted[id(x)] = lambda x=x: x
    return True


def _cpu_reads(frame, names: tuple[str, ...]) -> list:
    """The arrays on CPU devices that ``names`` hold as the line starts: a jax.Array, or the
    arrays in a list or tuple of them. Reading one back to NumPy on the CPU backend copies
    nothing (the buffer is host memory, lent through Python's buffer protocol), so JAX's guard
    never logs it; on a GPU each is a device->host copy of its own. Looked up as
    :func:`_converted_size` does (no property runs); anything else is skipped."""
    out: list = []
    for name in names:
        head, _, attribute = name.partition(".")
        try:
            value = frame.f_locals.get(head, frame.f_globals.get(head))
            if attribute:
                value = object.__getattribute__(value, "__dict__").get(attribute)
        except Exception:  # no __dict__ (slots)
            continue
        items = list(value) if type(value) in (list, tuple) else [value]
        for x in items:
            try:
                if isinstance(x, jax.Array) and not x.is_deleted() and all(
                        d.platform == "cpu" for d in x.devices()):
                    out.append(x)
            except Exception:  # a tracer (the line runs inside a jit being traced)
                continue
    return out


def _cpu_reads_note(reads: dict[str, dict]) -> str:
    """The sentence for the reads back to the host that the block's lines made of arrays on
    CPU devices, none of them in the table; "" if none. Where one line read several arrays,
    at once or by running again, the fix of QuEraComputing/tsim#149 (np.concatenate of a list
    of device results: on a GPU one copy an array; jnp.concatenate first, then one read): from
    the thread, not yet run on a GPU. On the CPU the join is no faster (its trial: 22 ms for
    NumPy's join of the list, 71 ms joined by JAX first)."""
    if not reads:
        return ""
    from helpers.units import format_bytes

    line, row = max(reads.items(), key=lambda kv: (kv[1]["arrays"], kv[1]["bytes"]))
    arrays = sum(r["arrays"] for r in reads.values())
    size = format_bytes(sum(r["bytes"] for r in reads.values()))
    why = ("on the CPU backend a read (np.asarray, float(), print) lends the array's own host "
           "memory and JAX logs no copy. On a GPU each array read is a device->host copy of "
           "its own")
    handed = f" At {line}, {_HANDOFF_FIX}." if _HANDED_OVER.search(line) else ""
    if arrays == 1:
        return (f"1 read of an array back to the host ({size}) at {line}, not in this table: "
                f"{why}.{handed}")
    where = "The most" if len(reads) > 1 else "All"
    runs = f" over {row['runs']} runs of the line" if row["runs"] > 1 else ""
    text = (f"{arrays} reads of arrays back to the host ({size}), none of them in this table: "
            f"{why}. {where} at {line}: {row['arrays']} array{'s' if row['arrays'] > 1 else ''}"
            f"{runs}")
    if handed:
        return f"{text}: {_HANDOFF_FIX}."
    if row["arrays"] == 1:
        return text + "."
    return f"{text}. {_JOIN_FIX[0].upper()}{_JOIN_FIX[1:]}."


def _converted_size(frame, name: str) -> str:
    """The size marker for the NumPy array ``name`` (a local or global, or one plain attribute
    of one: ``self.data``, read from the instance's ``__dict__`` so no property runs) is as the
    line starts, in the dtype JAX makes of it (float64 is float32 without x64); "" for anything
    else."""
    head, _, attribute = name.partition(".")
    try:  # (an object's own __getattr__ is never run: its __dict__ is read as object's)
        value = frame.f_locals.get(head, frame.f_globals.get(head))
        if attribute:
            value = object.__getattribute__(value, "__dict__").get(attribute)
        if type(value) is not np.ndarray:
            return ""
        dtype = jax.dtypes.canonicalize_dtype(value.dtype)
    except Exception:  # no __dict__ (slots), or a dtype JAX does not take: its error follows
        return ""
    return f"{_SIZE}{','.join(map(str, value.shape))};{np.dtype(dtype).name}>>"


_markers_verified = False  # set once a probe showed the markers work in this process


def _probe() -> None:
    """One tiny explicit host->device copy: its log lines tell whether the markers work."""
    try:
        jax.device_put(np.zeros(1, np.uint8)).block_until_ready()
    except Exception:  # no usable backend: the markers are reported as not working
        pass


def _remember(ok: bool) -> None:
    global _markers_verified
    _markers_verified = ok


_live: list = [None, None]  # the stream onto the real stderr, and what fd 2 was when made


def _live_stderr():
    """A text stream onto the real stderr for Python's own writes while fd 2 is captured,
    where ``sys.stderr`` writes to fd 2: only the guard's C++ lines need capturing, and a
    warning held back until the block ends is lost if it never ends (a forked worker that
    hangs: jax-ml/jax#9190). Made once, on a copy of fd 2, and never closed: a logging handler
    or a progress bar made inside the block keeps it (one made anew if fd 2 has moved). None
    where ``sys.stderr`` is another stream (Jupyter's, pytest's): those are not captured."""
    try:
        if sys.stderr.fileno() != 2:
            return None
        now = os.fstat(2)
    except Exception:  # no file descriptor: a notebook's stream
        return None
    if _live[0] is None or _live[1] != (now.st_dev, now.st_ino):
        # on fd 2's duplicate, left open for the process (closefd=False: the stream never
        # closes it, so no "unclosed file" warning at exit or when fd 2 moves, and a logging
        # handler that kept the stream still writes from a later atexit function; a review)
        _live[:] = [open(os.dup(2), "w", encoding=getattr(sys.stderr, "encoding", None)
                         or "utf-8", errors="backslashreplace", buffering=1, closefd=False),
                    (now.st_dev, now.st_ino)]
    return _live[0]


def _off_default_uncommitted() -> dict[int, tuple]:
    """{id: (a weak reference to the array, device)} of the live uncommitted arrays of 1 MiB or
    more on one device that is not the default device now: made under ``jax.default_device``
    (or by an operation on one made so), each operation on one copies it whole to the default
    device first. Weak: the block's ``del x`` frees it, as without the trace."""
    from helpers.devices import default_device

    try:
        default = default_device()
    except Exception:  # JAX cannot say
        return {}
    if default is None:
        return {}
    out = {}
    for x in jaxcompat.import_jax().live_arrays():
        try:
            if x.committed or x.nbytes < 2**20 or len(x.devices()) != 1:
                continue
            (device,) = x.devices()
            if device != default:
                out[id(x)] = (weakref.ref(x), device)
        except Exception:  # deleted meanwhile
            continue
    return out


def _off_default_note(before: dict[int, tuple]) -> str:
    """The sentence for the uncommitted arrays off the default device that lived through the
    block (in ``before`` and still live, still off it): an operation on one in the block copied
    it whole to the default device, which JAX's transfer guard logs only at the operation's
    first call, not on jit's fast path after it (jax 0.8.0 to 0.12.0.1; the blog post "JAX:
    commitment issues": a lookup into a 24 MiB array made under jax.default_device(cpu) took
    14-32 ms, 1.1 ms once committed; run on the CPU stand-in, not yet on a GPU). "" if none."""
    if not before:
        return ""
    from helpers.devices import default_device
    from helpers.units import format_bytes

    try:
        default = default_device()
    except Exception:  # JAX cannot say
        return ""
    still = [(x, d) for ref, d in before.values() if (x := ref()) is not None
             and not x.is_deleted() and not x.committed and d != default]
    if not still or default is None:
        return ""
    here = jaxcompat.device_name(default)
    x, d = max(still, key=lambda t: t[0].nbytes)
    where = jaxcompat.device_name(d)
    try:  # a name that runs: jax.devices('cpu')[1]
        index = jaxcompat.import_jax().devices(d.platform).index(d)
        device = f"jax.devices({d.platform!r})[{index}]"
    except Exception:  # a device of a backend JAX restarted
        device = "device"
    what = f"{x.dtype}{list(x.shape)}, {format_bytes(x.nbytes)}"
    n = len(still)
    return (f"{n} uncommitted array{'s' if n > 1 else ''} off the default "
            f"device ({what} on {where}{' the largest' if n > 1 else ''}; the default is "
            f"{here}) lived through the block. If the block used "
            f"{'them' if n > 1 else 'it'}, each operation first copied "
            f"{'each' if n > 1 else 'it'} whole to {here}, a copy this table may leave out: "
            "JAX's transfer guard logs it "
            "only at an operation's first call (later calls take jit's fast path, which copies "
            "unlogged; an array made under jax.default_device stays uncommitted). Commit it where "
            f"it is, jax.device_put(x, {device}) (x.committed is then True), or use it inside "
            "the jax.default_device block that made it.")


@contextlib.contextmanager
def trace(*, lines: bool = True) -> Iterator[TransferLog]:
    """Record the transfers the block makes; the log is filled when the block ends.

    ``lines``: also note which line of your code made each copy (a line tracer marks the log
    as your code runs; it slows pure-Python code in the block, and is skipped while a debugger
    or coverage tool traces this thread). JAX's log lines on stderr are read while the block
    runs, and what is not the kit's is written back when it ends; Python's own writes to
    stderr (a warning) show at once. Exceptions from the block propagate; stderr, JAX's
    transfer-guard setting and the tracer are restored either way.
    """
    if not _active.acquire(blocking=False):
        raise InUseError("transfers.trace() is already active in this process; "
                         "nest the code inside the existing trace instead")
    log = TransferLog()
    before = _off_default_uncommitted()
    reads: dict[str, dict] = {}  # a line -> its reads of arrays on CPU devices
    try:
        sys.stderr.flush()
        python_stderr, live = sys.stderr, _live_stderr()  # before fd 2 moves
        saved = os.dup(2)
        capture = tempfile.TemporaryFile(mode="w+b")
        os.dup2(capture.fileno(), 2)
        if live is not None:  # Python's own stderr (warnings, tracebacks) still shows at once
            sys.stderr = live

        def write(marker: str) -> None:
            os.write(2, (marker + "\n").encode())

        probing = installed = False  # also when entering the guard below fails
        try:
            seen: dict = {}  # (program, callback): whether it runs under jax.vmap

            def mark(marker: str) -> None:  # a host callback's copy: whether under jax.vmap
                if marker.startswith(_BEGIN) and marker != _BEGIN:
                    body = marker[len(_BEGIN):]
                    flag = _OF_ARRAYS if body.endswith(_OF_ARRAYS) else ""
                    body = body.removesuffix(_OF_ARRAYS)
                    marker = _BEGIN + (_callback_label(seen, body) if body else "") + flag
                write(marker)

            with jaxcompat.explicit_scopes_marked(mark, _BEGIN, _END, _OF_ARRAYS,
                                                  guard=_GUARD) as installed, \
                    jax.transfer_guard(_GUARD):
                probing = installed and not _markers_verified
                if probing:
                    _probe()
                    write(_PROBED)
                with _lines_marked(write, reads) if lines else contextlib.nullcontext():
                    yield log
        finally:
            try:
                sys.stderr.flush()
            finally:
                if live is not None and sys.stderr is live:  # (left open: see _live_stderr)
                    sys.stderr = python_stderr
                os.dup2(saved, 2)
                os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            capture.close()
            if probing:
                text, log.explicit_marked = _split_probe(text)
                _remember(log.explicit_marked)
            else:
                log.explicit_marked = installed and _markers_verified
            transfers, other = parse_guard_output(text, marked=log.explicit_marked,
                                                  processes=jax.process_count())
            log._transfers = tuple(transfers)
            log.cpu_reads = {line: dict(row) for line, row in reads.items()}
            log.unlogged = tuple(n for n in (_off_default_note(before), _cpu_reads_note(reads))
                                 if n)
            log.finished = True
            if other:  # give back what was not ours
                os.write(2, ("\n".join(other) + "\n").encode())
    finally:
        _active.release()
