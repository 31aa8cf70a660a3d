"""Forks of this process after JAX started: how many, and the user's line that made each.

JAX runs threads of its own and holds locks in them; a child made by ``os.fork()`` copies
the locks but not the threads, so a lock held at that moment is never released in the child
and JAX there can hang (jax-ml/jax#9190: a PyTorch DataLoader's worker processes beside JAX).
JAX warns at each such fork (``_at_fork`` in jax/_src/xla_bridge.py, installed when its
backends start) without saying which code forked; the kit records that here, from the moment
``helpers`` is imported, and ``settings.check_process()`` names it with the fix.

``subprocess`` starts its children without Python's fork handlers (``_posixsubprocess``), and
multiprocessing's "spawn" and "forkserver" methods fork no process that runs JAX: neither is
recorded, and neither needs to be.
"""

from __future__ import annotations

import os
import sys
import threading

from helpers._internal import frames, jaxcompat

__all__ = ["forks_after_start", "watch"]

_MOST = 8  # distinct lines kept
_lock = threading.Lock()
_lines: dict[str, int] = {}  # the user's line that forked -> forks, after JAX started
_installed = False


def watch() -> None:
    """Record each ``os.fork()`` of this process from now on (once per process; a no-op where
    the platform has no fork handlers)."""
    global _installed
    with _lock:
        if _installed or not hasattr(os, "register_at_fork"):
            return
        os.register_at_fork(before=_before_fork, after_in_child=_in_child)
        _installed = True


def forks_after_start() -> dict[str, int]:
    """{the user's line that called it (or the first frame outside the standard library and
    the kit, or "" where none): forks} of each ``os.fork()`` made while JAX's backends were
    running, since :func:`watch`."""
    with _lock:
        return dict(_lines)


def _before_fork() -> None:  # in the parent, just before the fork: never raise
    try:
        if not jaxcompat.backends_running_unlocked():
            return
        line = _forking_line()
        with _lock:
            if line in _lines or len(_lines) < _MOST:
                _lines[line] = _lines.get(line, 0) + 1
    except Exception:  # pragma: no cover - a fork must go on whatever the kit fails to read
        pass


def _in_child() -> None:  # a new process: its parent's forks are not its own, and a lock
    global _lock, _lines   # another thread held at the fork would stay held here forever
    _lock, _lines = threading.Lock(), {}


def _forking_line() -> str:
    frame = sys._getframe(2)  # past this module
    while frame is not None:
        if frames.is_user_frame(frame):
            return frames.line(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return ""
