"""The kit's own compiles: :func:`helpers.compiled.compile_step` lowers and compiles a step to
read XLA's sizes, and :func:`helpers.compiles.watch` leaves those compiles out of the user's
count (a preflight inside a watched block is not the user's program compiling again)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Marks what runs inside, on this thread, as the kit's own lowering and compiling."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def active() -> bool:
    """True while this thread runs inside :func:`compiling`."""
    return getattr(_local, "depth", 0) > 0
