"""How many bytes each device and the host hold: now (:func:`snapshot`), over time (:func:`track`).

Every number says where it comes from:

- ``"allocator"``: the device allocator's own counters (``Device.memory_stats()``; GPUs and TPUs).
- ``"live arrays"``: the sum of the shards of live JAX arrays on that device
  (``jax.live_arrays()``), used where the backend keeps no stats (CPU). It counts arrays only,
  not XLA's temporary buffers, so it is a lower bound.
- host: resident memory of this process split into anonymous (heap, NumPy arrays) and
  file-backed (memory-mapped files, shared libraries), from ``psutil``: on Linux ``shared`` is
  RssFile + RssShmem, so ``rss - shared`` is RssAnon; elsewhere the split is NOT_AVAILABLE.

A number a backend or the OS does not keep is :data:`~helpers.unavailable.NOT_AVAILABLE`
(``None`` in the dicts that ``to_dict`` returns for renderers and JSON).

The capture lives in :mod:`helpers.snapshots` (now) and :mod:`helpers.tracking` (over time);
this module gathers both under one name.

>>> from helpers import memory
>>> snap = memory.snapshot()
>>> snap.host.rss > 0
True
"""

from helpers.snapshots import (
    ALLOCATOR,
    LIVE_ARRAYS,
    NOT_AVAILABLE,
    DeviceMemory,
    HostMemory,
    MemorySnapshot,
    snapshot,
)
from helpers.tracking import MemoryTrace, samples_to_dict, track

__all__ = ["ALLOCATOR", "LIVE_ARRAYS", "NOT_AVAILABLE", "DeviceMemory", "HostMemory",
           "MemorySnapshot", "MemoryTrace", "samples_to_dict", "snapshot", "track"]
