"""The two gather kernels behind :mod:`helpers.feeding`: ``tokens[s:s + seq_len]`` for many ``s``.

- :func:`gather` (NumPy, any array): fancy indexing of a sliding-window view, 256 windows per
  call, on up to 4 threads, into a fresh 4 KiB-aligned buffer. Two copies per byte (the fancy
  index builds a temporary, which is then copied into the buffer), but the temporary stays in
  cache.
- :class:`CompiledGather` (XLA on a CPU device): the token array is handed to the CPU client
  without a copy (an *alias*: possible when a 64-byte-aligned address at or just before the first
  token lies in the same buffer, which holds for every ``numpy.memmap``, whose mapping starts on a
  page), and a jitted ``vmap`` of ``lax.dynamic_slice`` copies each window once, straight into
  the batch, on XLA's own threads. On a CPU device that output *is* the batch: no ``device_put``.

``benchmarks/feeding.py`` measured both (and the ideas that lost, listed in benchmarks/README.md):
random 2 KiB windows of a 1 GiB file cost DRAM latency, not copies, and the compiled gather gets
closer to that limit. Its output buffers come from XLA's allocator, which above the C library's
32 MiB limit maps fresh 4 KiB pages for every batch (16,384 page faults per 64 MiB), where NumPy's
large buffers get 2 MiB pages: hence :data:`COMPILED_MAX_BYTES`.
"""

from __future__ import annotations

import os
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ALIGN = 4096  # the NumPy kernel's buffers: page-aligned, so the CPU client can alias them
XLA_ALIGN = 64  # the CPU client aliases a host buffer only at this alignment (measured, 0.10.2)
#: batches larger than this use the NumPy kernel (see the module docstring)
COMPILED_MAX_BYTES = 16 * 2**20
ROWS_PER_PIECE = 256  # windows per fancy-index call: its temporary stays in cache
_pool: ThreadPoolExecutor | None = None


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array whose data starts on a 4 KiB page boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + n].view(dtype).reshape(shape)


def _workers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                   thread_name_prefix="helpers-gather")
    return _pool


def gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int, out=None, *,
           parallel: bool = True) -> np.ndarray:
    """``tokens[s:s + seq_len]`` for every ``s`` in ``starts``, as one ``(len(starts), seq_len)``
    NumPy array in a fresh 4 KiB-aligned buffer (or ``out``).

    Vectorised: windows are picked by fancy indexing a sliding-window view, 256 windows per
    call (no Python loop per window), split across up to 4 threads, since random windows are
    bound by memory latency, which more cores hide, and NumPy releases the GIL while copying."""
    base = tokens.view(np.ndarray) if isinstance(tokens, np.memmap) else tokens
    windows = np.lib.stride_tricks.sliding_window_view(base, seq_len)
    starts = np.asarray(starts, dtype=np.int64)
    if out is None:
        out = aligned_empty((len(starts), seq_len), base.dtype)

    def piece(lo: int, hi: int) -> None:
        for a in range(lo, hi, ROWS_PER_PIECE):
            b = min(hi, a + ROWS_PER_PIECE)
            out[a:b] = windows[starts[a:b]]

    n = len(starts)
    if not parallel or n <= ROWS_PER_PIECE:
        piece(0, n)
        return out
    pool = _workers()
    step = -(-n // pool._max_workers)
    for f in [pool.submit(piece, lo, min(n, lo + step)) for lo in range(0, n, step)]:
        f.result()
    return out


def _alias_view(tokens: np.ndarray) -> tuple[np.ndarray, int] | None:
    """A view that starts 64-byte aligned at or before ``tokens[0]`` and ends at its last token,
    inside the same buffer, and the offset of ``tokens[0]`` in it (in tokens); None if none."""
    if tokens.ndim != 1 or not tokens.flags.c_contiguous or tokens.size == 0:
        return None
    owner = tokens
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base  # a memmap's base is its mmap, which starts on a page
    try:
        if isinstance(owner, np.ndarray):
            if not owner.flags.c_contiguous:
                return None
            region = owner.reshape(-1).view(np.uint8)
        else:
            region = np.frombuffer(owner, np.uint8)
    except (TypeError, ValueError, BufferError):  # not a buffer, or a closed mmap
        return None
    addr, low = tokens.ctypes.data, region.ctypes.data
    start = addr - addr % XLA_ALIGN
    end = addr + tokens.nbytes
    if start < low or end > low + region.nbytes or (addr - start) % tokens.itemsize:
        return None
    return region[start - low:end - low].view(tokens.dtype), (addr - start) // tokens.itemsize


def _windows(tokens, starts, seq_len: int):
    import jax
    from jax import lax

    return jax.vmap(lambda s: lax.dynamic_slice(tokens, (s,), (seq_len,)))(starts)


_jitted = None
# (device, address, shape, dtype) of every alias a live CompiledGather holds: memory.snapshot
# leaves these out of a device's bytes in use, since they are the token file's own pages
_BORROWED: dict[int, tuple] = {}


def borrowed_buffers() -> set:
    """``(device, buffer address, shape, dtype)`` of the kit's zero-copy aliases of host memory
    now alive."""
    return set(_BORROWED.values())


class CompiledGather:
    """The compiled kernel for one token array on one CPU device (see the module docstring).

    :meth:`build` returns None where the tokens cannot be aliased; then use :func:`gather`.
    Calling it returns a ``(len(starts), seq_len)`` ``jax.Array`` on ``device``."""

    def __init__(self, alias, offset: int, device):
        self.alias, self.offset, self.device = alias, offset, device

    @classmethod
    def build(cls, tokens: np.ndarray, device) -> CompiledGather | None:
        import jax

        found = _alias_view(tokens)
        if found is None or getattr(device, "platform", None) != "cpu":
            return None
        view, offset = found
        # zero-copy (checked below), so no transfer for the transfer guard to log or refuse;
        # 64-bit dtypes are kept as they are (no converting copy)
        with jax.transfer_guard("allow"), jax.enable_x64(True):
            alias = jax.device_put(view, device, may_alias=True)
        if alias.unsafe_buffer_pointer() != view.ctypes.data:  # copied after all: not worth it
            alias.delete()
            return None
        kernel = cls(alias, offset, device)
        _BORROWED[id(kernel)] = (device, view.ctypes.data, alias.shape, str(alias.dtype))
        weakref.finalize(kernel, _BORROWED.pop, id(kernel), None)
        return kernel

    def __call__(self, starts: np.ndarray, seq_len: int):
        import jax

        global _jitted
        if _jitted is None:
            _jitted = jax.jit(_windows, static_argnums=2)
        starts = np.asarray(starts, dtype=np.int64) + self.offset
        # The starts (4 or 8 B a row) reach the device as a NumPy argument of the jitted call:
        # ~12 µs, where a device_put costs ~80 µs (jax 0.10.2), as much as a 64 KiB batch's
        # gather. The transfer guard would call that implicit: it is the kit's own bookkeeping,
        # so the guard neither logs nor refuses it. int32 where they fit: int64 (10.2 billion
        # tokens overflow int32) costs ~20 µs more.
        wide = self.alias.size > np.iinfo(np.int32).max
        x64 = wide or self.alias.dtype.itemsize == 8  # 64-bit tokens stay 64-bit
        with jax.transfer_guard_host_to_device("allow"), jax.enable_x64(x64):
            return _jitted(self.alias, starts if wide else starts.astype(np.int32),
                           int(seq_len))
