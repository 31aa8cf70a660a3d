"""The ways of feeding the accelerator that benchmarks/feeding.py compares, each timed alone.

Notebook 07 writes the same loops out inline (naive, kit, bound), for a reader to see.
"""

from __future__ import annotations

import time
from unittest import mock

import numpy as np

from helpers import feeding
from helpers.feeding import Batches, naive_batch, window_starts
from helpers.feeding import aligned_empty as _aligned_empty

#: What benchmarks/feeding.py compares (see :func:`time_variant`).
VARIANTS = ("naive", "kit", "kit_no_prefetch", "kit_numpy", "bound", "bound_reused")


def time_variant(variant: str, tokens: np.ndarray, batch_size: int, seq_len: int, *, device,
                 n: int, seed: int = 0) -> float:
    """Seconds to deliver ``n`` batches of ``(batch_size, seq_len)`` tokens to ``device`` one way:

    - ``naive``: per-window slices, ``np.stack``, ``jax.device_put``;
    - ``kit`` / ``kit_no_prefetch``: :class:`helpers.feeding.Batches` with prefetch 2 / 0;
    - ``kit_numpy``: the kit with prefetch 2 held to its NumPy kernel (the previous approach:
      fancy indexing into an aligned buffer, on threads), side by side with the compiled one;
    - ``bound``: on a CPU device, one host copy of the same number of bytes from a random place
      in ``tokens`` into a fresh buffer (what producing any new batch costs at least); on an
      accelerator, one ``device_put`` of that many bytes from pinned host memory;
    - ``bound_reused``: the CPU bound into one reused buffer (no fresh pages: a higher bar, since
      a batch handed to the caller cannot be overwritten); on an accelerator the same as
      ``bound``.
    """
    import jax

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if variant in ("bound", "bound_reused"):
        count = batch_size * seq_len
        if device.platform == "cpu":
            offsets = np.random.default_rng(seed).integers(0, len(tokens) - count, n)
            reused = None
            if variant == "bound_reused":
                reused = _aligned_empty((count,), tokens.dtype)
                reused.fill(0)  # its pages exist before the clock starts
            t0 = time.perf_counter()
            for off in offsets:
                out = reused if reused is not None else _aligned_empty((count,), tokens.dtype)
                np.copyto(out, tokens[off:off + count])
            return time.perf_counter() - t0
        pinned = jax.device_put(np.asarray(tokens[:count]), jax.sharding.SingleDeviceSharding(
            device, memory_kind="pinned_host"))
        pinned.block_until_ready()
        # a bare device is refused here ("Memory kind mismatch", seen on an H100): name the
        # memory kind of the destination
        to_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
        t0 = time.perf_counter()
        for _ in range(n):
            jax.device_put(pinned, to_device).block_until_ready()
        return time.perf_counter() - t0
    if variant == "naive":
        starts = window_starts(len(tokens), batch_size, seq_len, seed=seed)
        t0 = time.perf_counter()
        for _ in range(n):
            batch = naive_batch(tokens, next(starts), seq_len)
            jax.device_put(batch, device).block_until_ready()
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    with mock.patch.object(feeding, "COMPILED_MAX_BYTES", -1 if variant == "kit_numpy" else
                           feeding.COMPILED_MAX_BYTES):  # read once, when Batches starts
        it = Batches(tokens, batch_size, seq_len, device=device, seed=seed, steps=n,
                     prefetch=0 if variant == "kit_no_prefetch" else 2)
    with it:
        for b in it:
            b.block_until_ready()
    return time.perf_counter() - t0
