"""The kit's timelines as a trace that opens where JAX users already look: the Chrome trace event
format (JSON), which Perfetto (https://ui.perfetto.dev, "Open trace file"), ``chrome://tracing``
and XProf's trace viewer read.

A :func:`helpers.memory.track` block becomes counter tracks (bytes in use per device; the host's
anonymous and file-backed memory) with its marks as instant events; a
:func:`helpers.transfers.trace` block becomes one instant event per copy (direction, bytes, the
line of your code, why). Both line up on the wall clock, so one file can hold both. To see the
kit beside JAX's own profile, capture with ``jax.profiler.trace(logdir)``: the kit's marks are
``jax.profiler.TraceAnnotation``\\ s there, named ``helpers mark: <label>``.

A renderer: it reads the records' plain data (``to_dict()``), never the capture modules.

>>> doc = events()
>>> doc["traceEvents"], doc["displayTimeUnit"]
([], 'ms')
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from helpers.errors import BadInputError

__all__ = ["events", "save"]

_DEVICES, _HOST, _COPIES = 1, 2, 3  # one track group ("process") each


def _data(record: Any, kind: str) -> Mapping | None:
    if record is None:
        return None
    data = record.to_dict() if hasattr(record, "to_dict") else record
    if not isinstance(data, Mapping):
        raise BadInputError(f"{kind}: expected a {kind} record or its to_dict(), got "
                            f"{type(record).__name__}")
    return data


def _meta(pid: int, name: str) -> dict:
    return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}


def events(memory: Any = None, transfers: Any = None) -> dict:
    """A trace document ``{"traceEvents": [...], "displayTimeUnit": "ms"}`` from a
    :class:`~helpers.memory.MemoryTrace` and/or a :class:`~helpers.transfers.TransferLog`
    (or their ``to_dict()``). Times are microseconds from the earlier of the two starts."""
    mem, copies = _data(memory, "MemoryTrace"), _data(transfers, "TransferLog")
    starts = [d[k] for d, k in ((mem, "wall_t0"), (copies, "started_at"))
              if d is not None and d.get(k) is not None]
    origin = min(starts) if starts else 0.0
    out: list[dict] = []
    if mem is not None:
        offset = (mem.get("wall_t0") or origin) - origin
        out += [_meta(_DEVICES, "device memory (helpers.memory.track)"),
                _meta(_HOST, "host memory (helpers.memory.track)")]
        times = [round((offset + t) * 1e6, 1) for t in mem.get("times", [])]
        for name, series in mem.get("devices", {}).items():
            source = mem.get("sources", {}).get(name, "")
            for ts, value in zip(times, series, strict=False):
                out.append({"ph": "C", "name": f"{name} ({source})", "pid": _DEVICES,
                            "tid": 0, "ts": ts, "args": {"bytes in use": value}})
        anon, file = mem.get("host_anon", []), mem.get("host_file", [])
        for ts, a, f in zip(times, anon, file, strict=False):
            if a is not None and f is not None:
                out.append({"ph": "C", "name": "host RSS", "pid": _HOST, "tid": 0, "ts": ts,
                            "args": {"anonymous": a, "file-backed": f}})
        for at, label in mem.get("marks", []):
            out.append({"ph": "i", "s": "g", "name": label, "pid": _DEVICES, "tid": 0,
                        "ts": round((offset + at) * 1e6, 1)})
    if copies is not None:
        out.append(_meta(_COPIES, "transfers (helpers.transfers.trace)"))
        start = copies.get("started_at") or origin
        for t in copies.get("transfers", []):
            at = t.get("logged_at") or start
            kind = {True: "explicit", False: "implicit"}.get(t.get("explicit"), "")
            out.append({"ph": "i", "s": "p", "name": f"{t['direction']} {kind}".strip(),
                        "pid": _COPIES, "tid": 0, "ts": round((at - origin) * 1e6, 1),
                        "args": {"bytes": t.get("nbytes"), "shape": t.get("shape"),
                                 "dtype": t.get("dtype"), "from": t.get("source"),
                                 "to": t.get("destination"), "line": t.get("line"),
                                 "why": t.get("reason")}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def save(path: str | Path, memory: Any = None, transfers: Any = None) -> Path:
    """Write :func:`events` to ``path`` (gzipped when it ends in ``.gz``) and return it."""
    path = Path(path)
    text = json.dumps(events(memory, transfers))
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
