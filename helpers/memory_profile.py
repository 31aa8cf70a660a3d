"""Read the file ``jax.profiler.save_device_memory_profile`` writes: a gzipped pprof profile.

No maintained Python reader of pprof files exists on PyPI (checked 2026-11: the package named
``pprof`` is an unrelated line profiler), so this is a small decoder of the documented format,
google/pprof ``proto/profile.proto``, with the standard library only. It reads what JAX writes
(``PprofProfileBuilder`` in jaxlib's ``pprof_profile_builder.cc``, filled by
``PyClient::HeapProfile``): sample types ``allocations/count`` and ``space/bytes``, one sample
per (Python traceback, size, device), labels ``kind`` (``buffer`` or ``executable``) and
``device``, and the Python frames where each buffer was made, innermost first.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

from helpers._internal import frames
from helpers.errors import FileError

__all__ = ["ProfileEntry", "read_memory_profile", "top_entries"]


@dataclass(frozen=True)
class ProfileEntry:
    """One entry of a device memory profile: bytes, count, kind, and the stack that made it."""

    bytes: int  # the "space" value: size x count
    count: int  # the "allocations" value
    kind: str  # "buffer" (an array's buffer) or "executable" (compiled code)
    device: str  # e.g. "cpu:0", "cuda:0"; "" for executables
    frames: tuple[tuple[str, str, int], ...]  # (function, file, line), innermost first

    def where(self) -> str:
        """The innermost frame of the user's code: the line that made the buffer."""
        for name, file, line in self.frames:
            if frames.is_user_file(file):
                return f"{name} ({frames.where(file, line)})"
        return "?"


class _Corrupt(Exception):
    """Bytes that are not a protobuf message (turned into a FileError by the reader)."""


def _device(label: str) -> str:
    """Older jaxlibs label CPU buffers "TFRT_CPU_0"; the kit names devices "cpu:0"."""
    if label.startswith("TFRT_CPU_") and label[9:].isdigit():
        return f"cpu:{label[9:]}"
    return label


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) for each field of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise _Corrupt(f"unknown wire type {wire}")
        yield num, wire, value


def _ints(wire: int, value) -> list[int]:
    """A repeated integer field, packed (one bytes value) or not."""
    if wire == 0:
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


def _message(buf: bytes) -> dict[int, list]:
    out: dict[int, list] = {}
    for num, wire, value in _fields(buf):
        out.setdefault(num, []).append((wire, value))
    return out


def read_memory_profile(source: str | os.PathLike | bytes) -> list[ProfileEntry]:
    """Every sample of the profile, largest first. ``source``: a file written by
    ``jax.profiler.save_device_memory_profile``, or the bytes of
    ``jax.profiler.device_memory_profile()``."""
    path = "device_memory_profile() bytes" if isinstance(source, bytes) else source
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError as err:
        raise FileError(path, f"cannot read it: {err.strerror or err}") from None
    try:
        raw = gzip.decompress(data)
        profile = _message(raw)
        strings = [v.decode("utf-8", "replace") for _, v in profile.get(6, [])]
        functions = {}
        for _, f in profile.get(5, []):
            m = {k: v[0][1] for k, v in _message(f).items()}
            functions[m.get(1, 0)] = (strings[m.get(2, 0)], strings[m.get(4, 0)], m.get(5, 0))
        locations = {}
        for _, loc in profile.get(4, []):
            m = _message(loc)
            lines = [_message(v) for _, v in m.get(4, [])]
            fn = functions.get(lines[0][1][0][1], ("?", "?", 0)) if lines else ("?", "?", 0)
            line_no = lines[0].get(2, [(0, fn[2])])[0][1] if lines else 0
            locations[m.get(1, [(0, 0)])[0][1]] = (fn[0], fn[1], line_no)
        types = [strings[_message(v)[1][0][1]] for _, v in profile.get(1, [])]
        entries = []
        for _, s in profile.get(2, []):
            m = _message(s)
            ids = [i for w, v in m.get(1, []) for i in _ints(w, v)]
            values = dict(zip(types, [x for w, v in m.get(2, []) for x in _ints(w, v)],
                              strict=False))
            labels = {}
            for _, lab in m.get(3, []):
                lm = {k: v[0][1] for k, v in _message(lab).items()}
                labels[strings[lm.get(1, 0)]] = strings[lm.get(2, 0)]
            entries.append(ProfileEntry(
                bytes=values.get("space", 0), count=values.get("allocations", 0),
                kind=labels.get("kind", "?"), device=_device(labels.get("device", "")),
                frames=tuple(locations.get(i, ("?", "?", 0)) for i in ids)))
    except Exception as err:  # not gzip, not a pprof profile
        raise FileError(path, f"not a gzipped pprof memory profile ({type(err).__name__}: "
                        f"{err}); write one with jax.profiler.save_device_memory_profile"
                        ) from None
    return sorted(entries, key=lambda e: e.bytes, reverse=True)


def top_entries(source: str | os.PathLike | bytes, n: int = 5, *, kind: str = "buffer"
                ) -> list[ProfileEntry]:
    """The ``n`` largest entries of one kind ("buffer": arrays; "executable": code), from a
    profile file or the bytes of ``jax.profiler.device_memory_profile()``."""
    return [e for e in read_memory_profile(source) if e.kind == kind][:n]
