"""The safetensors file format, read and written without the safetensors library.

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor name ->
dtype, shape, data offsets; optional ``__metadata__``), then the raw data. :func:`read_header`
validates a header without touching the data, so a 19 GiB file is checked in microseconds;
:func:`encode_header` writes one. A leaf module: it imports nothing else from the kit but
:mod:`helpers.errors`.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from helpers.errors import FileError

__all__ = ["DTYPES", "DTYPE_BITS", "MAX_HEADER", "Dtype", "FileError", "encode_header",
           "read_header"]


class Dtype(NamedTuple):
    bits: int  # bits per element (sub-byte types are packed)
    numpy: str | None  # the NumPy dtype a memmap can use, None where NumPy has none


#: safetensors dtype -> bits and NumPy name: the kit's one dtype table
DTYPES: Mapping[str, Dtype] = {
    "BOOL": Dtype(8, "bool"), "U8": Dtype(8, "uint8"), "I8": Dtype(8, "int8"),
    "F8_E5M2": Dtype(8, None), "F8_E4M3": Dtype(8, None), "F8_E4M3FN": Dtype(8, None),
    "F8_E8M0": Dtype(8, None),
    "I16": Dtype(16, "int16"), "U16": Dtype(16, "uint16"), "F16": Dtype(16, "float16"),
    "BF16": Dtype(16, None),
    "I32": Dtype(32, "int32"), "U32": Dtype(32, "uint32"), "F32": Dtype(32, "float32"),
    "I64": Dtype(64, "int64"), "U64": Dtype(64, "uint64"), "F64": Dtype(64, "float64"),
    "C64": Dtype(64, "complex64"),
    "F4": Dtype(4, None), "F6_E2M3": Dtype(6, None), "F6_E3M2": Dtype(6, None),
}
#: safetensors dtype -> bits per element (a view of DTYPES, kept for existing callers)
DTYPE_BITS: Mapping[str, int] = {k: v.bits for k, v in DTYPES.items()}
MAX_HEADER = 100 * 2**20  # safetensors' own limit
_MAX_HEADER = MAX_HEADER


def encode_header(tensors: Mapping[str, Mapping], metadata: Mapping[str, str] | None = None
                  ) -> bytes:
    """The length prefix and JSON header for ``tensors`` ({name: {"dtype", "shape",
    "data_offsets"}}), padded with spaces so the data starts 8-byte aligned."""
    meta: dict = {"__metadata__": dict(metadata)} if metadata else {}
    meta.update({k: dict(v) for k, v in tensors.items()})
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return struct.pack("<Q", len(raw)) + raw


def read_header(path) -> tuple[dict, int]:
    """Validate a safetensors file's header without reading its data.

    Returns (header dict without __metadata__, data start offset). Raises FileError naming
    the file and the problem for every way a file can be broken.
    """
    p = Path(path)
    try:
        info = os.stat(p)
    except FileNotFoundError:
        raise FileError(p, "no such file", "check the path; make one with "
                        "`python -m helpers make-tokens PATH --size 1GiB`") from None
    except OSError as err:  # a name too long, a folder we may not enter, ...
        raise FileError(p, f"cannot be read: {err.strerror or err}", "check the path") from None
    if stat.S_ISDIR(info.st_mode):
        raise FileError(p, "is a directory, not a safetensors file",
                        "pass the .safetensors file inside it")
    try:
        size = info.st_size
        with open(p, "rb") as f:
            prefix = f.read(8)
            if size == 0:
                raise FileError(p, "is empty (0 bytes)", "the download or write did not finish")
            if len(prefix) < 8:
                raise FileError(p, f"is only {size} bytes; a safetensors file starts with an "
                                "8-byte header length", "the file is truncated")
            (n,) = struct.unpack("<Q", prefix)
            if n > _MAX_HEADER:
                raise FileError(p, f"header length {n:,} bytes is larger than safetensors "
                                f"allows ({_MAX_HEADER:,}); not a safetensors file?")
            if 8 + n > size:
                raise FileError(p, f"header length {n:,} bytes runs past the end of the "
                                f"{size:,}-byte file", "the file is truncated or not safetensors")
            raw = f.read(n)
    except PermissionError as err:
        raise FileError(p, f"cannot be read: {err.strerror}", "check its permissions") from None
    except OSError as err:
        raise FileError(p, f"cannot be read: {err.strerror or err}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FileError(p, f"header is not valid JSON ({err.__class__.__name__}: {err})",
                        "the file is corrupt or not safetensors") from None
    if not isinstance(header, dict):
        raise FileError(p, f"header is JSON but not an object (got {type(header).__name__})")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise FileError(p, f"tensor {name!r} lacks dtype, shape or data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise FileError(p, f"tensor {name!r} has unknown dtype {dtype!r}",
                            f"known: {', '.join(sorted(DTYPES))}")
        if (not isinstance(shape, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FileError(p, f"tensor {name!r} has a bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) or
                not 0 <= offsets[0] <= offsets[1]):
            raise FileError(p, f"tensor {name!r} has bad data_offsets {offsets!r}")
        if offsets[1] > data_len:
            raise FileError(p, f"tensor {name!r} ends at byte {offsets[1]:,} of the data, past "
                            f"its end ({data_len:,} bytes)", "the file is truncated")
        expected = math.ceil(math.prod(shape) * DTYPES[dtype].bits / 8)
        if offsets[1] - offsets[0] != expected:
            raise FileError(p, f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]:,} "
                            f"bytes but shape {shape} x {dtype} needs {expected:,}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise FileError(p, f"tensors {a!r} and {b!r} overlap in the data")
    return header, 8 + n
