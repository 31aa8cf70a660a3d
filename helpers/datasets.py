"""Synthetic GPT-2-like token files, laid out like the story's dataset.

The real file (``train.safetensors`` of gpjt/fineweb-gpt2-tokens) holds one tensor, ``tokens``,
dtype uint16, shape ``[10_248_871_837]`` (19.09 GiB). :func:`write_tokens` writes the same layout
at any size, streaming in chunks so a file larger than RAM can be written, and never touches the
network.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "tokens.safetensors")
>>> write_tokens(path, 1000).n_tokens
1000
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers._display import Display
from helpers.errors import BadInputError, FileError, PathError
from helpers.safetensors_format import DTYPES, encode_header, read_header
from helpers.units import format_bytes, parse_size

__all__ = ["GPT2_EOT", "GPT2_VOCAB", "REAL_DATASET_TOKENS", "TokenFile", "batches", "open_tokens",
           "write_tokens"]

GPT2_VOCAB = 50257
GPT2_EOT = 50256  # <|endoftext|>, separates documents
REAL_DATASET_TOKENS = 10_248_871_837  # train split of gpjt/fineweb-gpt2-tokens
CHUNK_TOKENS = 1 << 22  # 8 MiB of uint16 per chunk; also the unit of determinism
_PROGRESS_FROM = 256 * 2**20  # show a progress bar for files of 256 MiB or more


@dataclass(frozen=True)
class TokenFile(Display):
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


def write_tokens(path, n_tokens: int | None = None, *, size=None, vocab_size: int = GPT2_VOCAB,
                 seed: int = 0, progress: bool | None = None) -> TokenFile:
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


def open_tokens(path, name: str = "tokens") -> np.memmap:
    """A read-only ``numpy.memmap`` of one tensor of a safetensors file: zero-copy, nothing
    read until used, no JAX device involved. The header is validated first
    (:mod:`helpers.safetensors_format`), so a truncated or corrupt file raises FileError naming
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


def batches(tokens, batch_size: int, seq_len: int, *, device=None, prefetch: int = 2,
            seed: int = 0, steps: int | None = None, dtype=None, pinned: bool = False,
            sharding=None):
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
