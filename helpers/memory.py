"""How many bytes each device and the host hold: now (:func:`snapshot`), over time (:func:`track`).

Every number says where it comes from ("allocator" counters, or "live arrays" where a backend
keeps none) and a number nobody keeps is ``NOT_AVAILABLE``: see :mod:`helpers.snapshots`.

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
