"""Which host<->device and device<->device copies a block of code made.

JAX's transfer guard (``jax.transfer_guard("log_explicit")``) writes one C++ log line per
transfer to the process's stderr, file descriptor 2, not to Python's ``sys.stderr``.
:func:`trace` points fd 2 at a temporary file for the block, restores it (also on error),
parses the guard lines, and passes every other line through to the real stderr, so nothing
is lost. A transfer counts as **explicit** when it happened inside ``jax.device_put`` /
``jax.device_get`` (the kit marks JAX's own explicit-transfer scope), else **implicit**.

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
- Copies XLA makes inside a compiled computation are not guard events at all.
- The guard set by a ``with`` block is per thread (jax/_src/config.py updates it through a
  thread-local hook): copies made by other threads during the block (a prefetch thread, say)
  are not seen.
- On a GPU, reading an array back (``float(x)``, ``np.asarray(x)``, printing) is an implicit
  device->host copy and is logged, once per array (jaxlib caches the host copy).
- Measured on JAX 0.10.2 (CPU): once a jitted function has run, its C++ fast path moved an
  uncommitted argument to another device without consulting the guard, so that copy was
  neither logged nor disallowed; the first call's copy is seen.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import numpy as np

__all__ = ["Transfer", "TransferLog", "parse_guard_output", "trace"]

H2D, D2D, D2H = "host->device", "device->device", "device->host"
_DIRECTIONS = {"host-to-device": H2D, "device-to-device": D2D, "device-to-host": D2H}
_LINE = re.compile(r"(host-to-device|device-to-device|device-to-host) transfer:(.*)$")
_AVAL = re.compile(r"aval=ShapedArray\((\w+)\[([\d,\s]*)\]")
_SRC = re.compile(r"(?<!dst_)sharding=\w+\(device=(\w+?)Device\(id=(\d+)\)")
_DST = re.compile(r"dst_sharding=\w+\(device=(\w+?)Device\(id=(\d+)\)")
_BEGIN = "<<helpers.transfers explicit begin>>"
_END = "<<helpers.transfers explicit end>>"
_NOISE = ("WARNING: All log messages before absl::InitializeLog() is called",)
_active = threading.Lock()  # one trace at a time per process: fd 2 is process-wide


@dataclass(frozen=True)
class Transfer:
    direction: str  # "host->device", "device->device" or "device->host"
    explicit: bool | None  # None when the kit could not mark JAX's explicit scope
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int | None  # None when JAX logged no shape (jit's C++ fast path)
    source: str | None  # "host" or a device name like "cpu:0"; None when not logged
    destination: str | None  # device name; "host" for device->host
    raw: str  # the guard's own text


def _device_name(match) -> str | None:
    if not match:
        return None
    return f"{match.group(1).lower()}:{match.group(2)}"


def _itemsize(dtype: str) -> int | None:
    try:
        return np.dtype(jax.numpy.dtype(dtype)).itemsize
    except Exception:
        return None


def parse_guard_output(text: str, *, marked: bool = True) -> tuple[list[Transfer], list[str]]:
    """Split captured stderr into transfers and the other lines (returned unchanged).

    Lines between the kit's explicit markers are explicit transfers, the rest implicit. With
    ``marked=False`` (the markers could not be installed) explicitness is unknown (None).
    """
    transfers: list[Transfer] = []
    other: list[str] = []
    depth = 0
    for line in text.splitlines():
        if line == _BEGIN:
            depth += 1
            continue
        if line == _END:
            depth = max(0, depth - 1)
            continue
        m = _LINE.search(line)
        if not m:
            if line.strip() and not line.startswith(_NOISE):
                other.append(line)
            continue
        direction = _DIRECTIONS[m.group(1)]
        rest = m.group(2)
        shape = dtype = nbytes = None
        aval = _AVAL.search(rest)
        if aval:
            dtype = aval.group(1)
            dims = aval.group(2).replace(" ", "")
            shape = tuple(int(x) for x in dims.split(",") if x)
            size = _itemsize(dtype)
            nbytes = None if size is None else size * math.prod(shape)
        src = _device_name(_SRC.search(rest))
        dst = _device_name(_DST.search(rest))
        if direction == H2D:
            src = "host"
        elif direction == D2H:
            dst = "host"
        explicit = (depth > 0) if marked else None
        transfers.append(Transfer(direction, explicit, shape, dtype, nbytes, src, dst,
                                  line[m.start():].strip()))
    return transfers, other


class TransferLog:
    """The transfers one :func:`trace` block made. Filled when the block ends."""

    def __init__(self) -> None:
        self._transfers: tuple[Transfer, ...] = ()
        self.finished = False
        self.explicit_marked = False

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return self._transfers

    def __len__(self) -> int:
        return len(self._transfers)

    def __iter__(self):
        return iter(self._transfers)

    def select(self, direction: str | None = None, *, explicit: bool | None = None
               ) -> tuple[Transfer, ...]:
        if direction is not None and direction not in (H2D, D2D, D2H):
            raise ValueError(f"direction must be one of {H2D!r}, {D2D!r}, {D2H!r}; "
                             f"got {direction!r}")
        return tuple(t for t in self._transfers
                     if (direction is None or t.direction == direction)
                     and (explicit is None or t.explicit is explicit))

    def count(self, direction: str | None = None, *, explicit: bool | None = None) -> int:
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
            if t.nbytes is None:
                row["unknown_size"] += 1
            else:
                row["bytes"] += t.nbytes
        order = {H2D: 0, D2D: 1, D2H: 2}
        return sorted(rows.values(), key=lambda r: (order[r["direction"]], r["explicit"] is not
                                                    True))

    def to_dict(self) -> dict:
        return {"transfers": [t.__dict__.copy() for t in self._transfers],
                "summary": self.summary()}

    def __str__(self) -> str:
        from helpers.units import format_bytes

        if not self._transfers:
            return "no transfers"
        lines = [f"{'direction':<15} {'kind':<9} {'count':>5} {'bytes':>12}"]
        for r in self.summary():
            kind = {True: "explicit", False: "implicit", None: "?"}[r["explicit"]]
            if r["unknown_size"] == r["count"]:
                size = "?"  # logged without shapes (jit's fast path)
            else:
                size = format_bytes(r["bytes"]) + ("+?" if r["unknown_size"] else "")
            lines.append(f"{r['direction']:<15} {kind:<9} {r['count']:>5} {size:>12}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        import html

        from helpers.units import format_bytes

        head = ("<table><tr><th>direction</th><th>kind</th><th>shape</th><th>dtype</th>"
                "<th>bytes</th><th>from</th><th>to</th></tr>")
        rows = []
        for t in self._transfers:
            kind = {True: "explicit", False: "implicit", None: "?"}[t.explicit]
            shape = "?" if t.shape is None else str(list(t.shape))
            cells = (t.direction, kind, shape, t.dtype or "?",
                     format_bytes(t.nbytes) if t.nbytes is not None else "?",
                     t.source or "?", t.destination or "?")
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                        + "</tr>")
        if not rows:
            return "<i>no transfers</i>"
        return head + "".join(rows) + "</table>"


@contextlib.contextmanager
def _mark_explicit_scopes(write) -> Iterator[bool]:
    """Wrap JAX's explicit device_put/device_get scopes so they write markers to fd 2."""
    try:
        from jax._src import config as jax_config  # private; guarded
        originals = {name: getattr(jax_config, name) for name in
                     ("explicit_device_put_scope", "explicit_device_get_scope")}
    except Exception:  # pragma: no cover - JAX moved it: explicitness becomes unknown
        yield False
        return

    def wrap(original):
        @contextlib.contextmanager
        def scope():
            write(_BEGIN)
            try:
                with original():
                    yield
            finally:
                write(_END)
        return scope

    for name, original in originals.items():
        setattr(jax_config, name, wrap(original))
    try:
        yield True
    finally:
        for name, original in originals.items():
            setattr(jax_config, name, original)


@contextlib.contextmanager
def trace() -> Iterator[TransferLog]:
    """Record the transfers the block makes; the log is filled when the block ends.

    Exceptions from the block propagate; stderr and JAX's transfer-guard setting are
    restored either way.
    """
    if not _active.acquire(blocking=False):
        raise RuntimeError("transfers.trace() is already active in this process; "
                           "nest the code inside the existing trace instead")
    log = TransferLog()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        capture = tempfile.TemporaryFile(mode="w+b")
        os.dup2(capture.fileno(), 2)

        def write(marker: str) -> None:
            os.write(2, (marker + "\n").encode())

        try:
            with _mark_explicit_scopes(write) as marked, jax.transfer_guard("log_explicit"):
                log.explicit_marked = marked
                yield log
        finally:
            try:
                sys.stderr.flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            capture.close()
            transfers, other = parse_guard_output(text, marked=log.explicit_marked)
            log._transfers = tuple(transfers)
            log.finished = True
            if other:  # give back what was not ours
                os.write(2, ("\n".join(other) + "\n").encode())
    finally:
        _active.release()
