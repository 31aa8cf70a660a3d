"""The story's data: synthetic GPT-2-like token files in the safetensors format, read without
copying.

The real file (``train.safetensors`` of gpjt/fineweb-gpt2-tokens) holds one tensor, ``tokens``,
dtype uint16, shape ``[10_248_871_837]`` (19.09 GiB). :func:`write_tokens` writes the same layout
at any size, streaming in chunks so a file larger than RAM can be written, and never touches the
network; :func:`open_tokens` maps one tensor read-only (zero copy); :func:`batches` feeds random
windows of it to a device (:mod:`helpers.feeding`).

The format is read and written here without the safetensors library. A safetensors file is an
8-byte little-endian header length, a JSON header (tensor name -> dtype, shape, data offsets;
optional ``__metadata__``), then the raw data. :func:`read_header` validates a header without
touching the data, so a 19 GiB file is checked in microseconds; :func:`encode_header` writes one.

>>> import tempfile, os
>>> folder = tempfile.TemporaryDirectory()
>>> path = os.path.join(folder.name, "tokens.safetensors")
>>> write_tokens(path, 1000).n_tokens
1000
>>> read_header(path)[0]["tokens"]["shape"]
[1000]
>>> folder.cleanup()
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from helpers._internal.records import Display
from helpers.errors import BadInputError, FileError, PathError
from helpers.units import format_bytes, parse_size

if TYPE_CHECKING:
    import jax

    from helpers.feeding import Batches

__all__ = ["DTYPES", "GPT2_EOT", "GPT2_VOCAB", "MAX_HEADER", "REAL_DATASET_TOKENS", "Dtype",
           "TokenFile", "batches", "encode_header", "open_tokens", "read_header",
           "write_tokens"]


# --- the safetensors format ------------------------------------------------------------------
class Dtype(NamedTuple):
    """One safetensors dtype: bits per element and the NumPy dtype a memmap can use."""

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
MAX_HEADER = 100 * 2**20  # safetensors' own limit


def encode_header(tensors: Mapping[str, Mapping], metadata: Mapping[str, str] | None = None
                  ) -> bytes:
    """The length prefix and JSON header for ``tensors`` ({name: {"dtype", "shape",
    "data_offsets"}}), padded with spaces so the data starts 8-byte aligned."""
    meta: dict = {"__metadata__": dict(metadata)} if metadata else {}
    meta.update({k: dict(v) for k, v in tensors.items()})
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return struct.pack("<Q", len(raw)) + raw


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
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
            if n > MAX_HEADER:
                raise FileError(p, f"header length {n:,} bytes is larger than safetensors "
                                f"allows ({MAX_HEADER:,}); not a safetensors file?")
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


# --- token files -------------------------------------------------------------------------------
GPT2_VOCAB = 50257
GPT2_EOT = 50256  # <|endoftext|>, separates documents
REAL_DATASET_TOKENS = 10_248_871_837  # train split of gpjt/fineweb-gpt2-tokens
CHUNK_TOKENS = 1 << 22  # 8 MiB of uint16 per chunk; also the unit of determinism
_PROGRESS_FROM = 256 * 2**20  # show a progress bar for files of 256 MiB or more


@dataclass(frozen=True)
class TokenFile(Display):
    """A synthetic token file that :func:`write_tokens` wrote: where, how many tokens, bytes."""

    path: str
    n_tokens: int
    nbytes: int  # data bytes (n_tokens * 2)
    file_bytes: int  # header included
    header_bytes: int  # the 8-byte length prefix + JSON header
    vocab_size: int
    seed: int


def _header(n_tokens: int) -> bytes:
    """The token file's header: one uint16 tensor ``tokens``, the kit's metadata."""
    return encode_header(
        {"tokens": {"dtype": "U16", "shape": [n_tokens], "data_offsets": [0, 2 * n_tokens]}},
        {"generator": "jax-device-kit", "format": "gpt2-uint16-tokens"})


_TABLE_BITS = 20


def _rank_table(vocab_size: int) -> np.ndarray:
    """Inverse CDF of a Zipf(1.1) law over ranks, tabulated at 2**20 points: drawing a uniform
    20-bit integer and looking it up gives a rank, fast (a gather) and deterministic."""
    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -1.1)
    cdf /= cdf[-1]
    points = (np.arange(1 << _TABLE_BITS, dtype=np.float64) + 0.5) / (1 << _TABLE_BITS)
    return np.searchsorted(cdf, points).astype(np.uint16)


_MASK = (1 << _TABLE_BITS) - 1
_AHEAD = 8  # chunks made ahead of the writer (64 MiB): generation goes on while a write waits


def _chunk(index: int, n: int, vocab_size: int, seed: int, ids_by_rank: np.ndarray
           ) -> np.ndarray:
    """Token ids with a Zipf-like frequency (a few ids very common, a long tail), scattered
    over the vocabulary by a fixed permutation, with an end-of-text token about every 1,000
    tokens. Depends only on (seed, chunk index) for the fixed chunk size CHUNK_TOKENS, so the
    same seed always gives the same file.

    Fast: each raw 64-bit draw of SFC64 gives three 20-bit table indices; the ids come from
    one table lookup; the end-of-text tokens are placed at n/1000 random positions (no per-token
    draw). Every NumPy call here releases the GIL, so chunks can be made on several threads."""
    rng = np.random.Generator(np.random.SFC64([seed, index]))
    raw = rng.bit_generator.random_raw(-(-n // 3))
    idx = np.empty((3, raw.size), np.intp)  # take's own index type: no converted copy
    for row in idx:
        np.bitwise_and(raw, _MASK, out=row, casting="unsafe")
        raw >>= _TABLE_BITS
    ids = np.take(ids_by_rank, idx.reshape(-1)[:n])
    if vocab_size > GPT2_EOT and n >= 1000:
        ids[rng.integers(0, n, size=n // 1000)] = GPT2_EOT
    return ids


def _chunks(n_tokens: int, vocab_size: int, seed: int, ids_by_rank: np.ndarray):
    """The file's chunks in order, made up to ``_AHEAD`` ahead on two threads while the caller
    writes (generation and writing overlap; memory stays at a few chunks)."""
    from concurrent.futures import ThreadPoolExecutor

    starts = list(range(0, n_tokens, CHUNK_TOKENS))
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1),
                            thread_name_prefix="helpers-tokens") as pool:
        pending = []
        for index, start in enumerate(starts):
            n = min(CHUNK_TOKENS, n_tokens - start)
            pending.append(pool.submit(_chunk, index, n, vocab_size, seed, ids_by_rank))
            if len(pending) > _AHEAD:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


def _writeback_starter():
    """A function ``(fd, offset, nbytes)`` that asks the OS to start writing those bytes to the
    disk now, without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``); a no-op
    elsewhere. Without it a file smaller than the kernel's dirty-page threshold (10% of RAM
    here) is not written at all until someone syncs it: generating and writing then happen one
    after the other instead of at the same time (measured in benchmarks/README.md)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        sync_file_range = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, nbytes: None
    sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    sync_file_range.restype = ctypes.c_int
    return lambda fd, offset, nbytes: sync_file_range(fd, offset, nbytes, 2)  # errors ignored


def _open_for_writing(path: Path):
    try:
        return open(path, "wb")
    except OSError as err:  # permission, read-only file system, ...: say which file and why
        raise PathError(f"cannot write {path}: {err.strerror or err}") from None


def write_tokens(path: str | os.PathLike, n_tokens: int | None = None, *,
                 size: str | int | None = None, vocab_size: int = GPT2_VOCAB, seed: int = 0,
                 progress: bool | None = None) -> TokenFile:
    """Write ``n_tokens`` uint16 GPT-2-like token ids (or ``size`` bytes of them, e.g.
    "1 GiB") to a safetensors file with one tensor ``tokens``. Deterministic for a seed.

    The file is written to ``PATH.partial`` and renamed when complete, so an interrupted
    write never leaves a truncated file under the real name.
    """
    if (n_tokens is None) == (size is None):
        raise BadInputError("give exactly one of n_tokens or size (e.g. size='1 GiB')")
    if size is not None:
        n_tokens = parse_size(size) // 2
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 1:
        raise BadInputError(f"n_tokens must be a positive integer, got {n_tokens!r}")
    n_tokens = int(n_tokens)
    if not 2 <= vocab_size <= 65536:
        raise BadInputError(f"vocab_size must be in [2, 65536] to fit uint16, got {vocab_size}")
    path = Path(path)
    try:
        if path.is_dir():
            raise PathError(f"{path} is a directory; give a file name such as "
                            f"{path / 'train.safetensors'}")
        if not path.parent.exists():
            raise PathError(f"folder {path.parent} does not exist; create it first")
    except PathError:
        raise
    except OSError as err:  # a name too long, a folder we may not enter, ...
        raise PathError(f"cannot use {path}: {err.strerror or err}") from None
    header = _header(n_tokens)
    nbytes = 2 * n_tokens
    try:
        fs = os.statvfs(path.parent)
        free = fs.f_bavail * fs.f_frsize
    except OSError:
        free = None
    if free is not None and len(header) + nbytes > free:
        raise PathError(f"not enough disk space in {path.parent}: the file needs "
                        f"{format_bytes(len(header) + nbytes)}, {format_bytes(free)} is free")
    perm = np.random.default_rng([seed, 0xC0FFEE]).permutation(vocab_size).astype(np.uint16)
    ids_by_rank = perm[_rank_table(vocab_size)]
    show = progress if progress is not None else nbytes >= _PROGRESS_FROM
    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=nbytes, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=f"writing {path.name}")
    partial = path.with_name(path.name + ".partial")
    try:
        f = _open_for_writing(partial)
        start_writeback = _writeback_starter()
        with f:
            f.write(header)
            f.flush()
            offset = len(header)
            for ids in _chunks(n_tokens, vocab_size, seed, ids_by_rank):
                f.write(memoryview(ids))  # no .tobytes() copy; larger than the buffer: written now
                start_writeback(f.fileno(), offset, ids.nbytes)  # the disk works while we generate
                offset += ids.nbytes
                if bar is not None:
                    bar.update(ids.nbytes)
        os.replace(partial, path)
    except PathError:
        partial.unlink(missing_ok=True)
        raise
    except OSError as err:  # the disk filled up, a quota, an I/O error: nothing is left behind
        partial.unlink(missing_ok=True)
        raise PathError(f"cannot write {path}: {err.strerror or err}; nothing was left "
                        "behind") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return TokenFile(str(path), n_tokens, nbytes, len(header) + nbytes, len(header), vocab_size,
                     seed)


def open_tokens(path: str | os.PathLike, name: str = "tokens") -> np.memmap:
    """A read-only ``numpy.memmap`` of one tensor of a safetensors file: zero-copy, nothing
    read until used, no JAX device involved. The header is validated first
    (:func:`read_header`), so a truncated or corrupt file raises FileError naming
    the problem instead of mapping junk.

    Pages the OS reads in count as *file-backed* resident memory, which the OS can drop again
    under pressure, unlike the anonymous memory a full load allocates.
    """
    header, data_start = read_header(path)
    if name not in header:
        raise FileError(path, f"has no tensor named {name!r} (tensors: "
                        f"{', '.join(sorted(header)) or 'none'})")
    entry = header[name]
    dtype = DTYPES[entry["dtype"]].numpy
    if dtype is None:
        raise FileError(path, f"tensor {name!r} has dtype {entry['dtype']}, which NumPy cannot "
                        "map directly", "load it with safetensors.numpy.load_file instead")
    shape = tuple(entry["shape"])
    start = data_start + entry["data_offsets"][0]
    if math.prod(shape) == 0:
        return np.empty(shape, dtype)  # mmap cannot map zero bytes
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape)


def batches(tokens: np.ndarray, batch_size: int, seq_len: int, *, device: jax.Device | None = None,
            prefetch: int = 2, seed: int = 0, steps: int | None = None,
            dtype: str | np.dtype | None = None, pinned: bool = False,
            sharding: jax.sharding.Sharding | None = None) -> Batches:
    """Random ``(batch_size, seq_len)`` token windows on ``device`` (or split over several
    devices by ``sharding``, e.g. ``NamedSharding(mesh, P("data"))``: one slice of the rows
    per device), prepared ``prefetch`` batches ahead. ``tokens``: a 1-D array/memmap or a path
    to a token file (opened with :func:`open_tokens`). Returns a
    :class:`helpers.feeding.Batches` iterator; see there."""
    from helpers.feeding import Batches

    if isinstance(tokens, (str, os.PathLike)):
        tokens = open_tokens(tokens)
    return Batches(tokens, batch_size, seq_len, device=device, prefetch=prefetch, seed=seed,
                   steps=steps, dtype=dtype, pinned=pinned, sharding=sharding)
