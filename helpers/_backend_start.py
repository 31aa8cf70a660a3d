"""What the allocator variables were when each JAX backend started.

jaxlib reads the ``XLA_PYTHON_CLIENT_*`` / ``XLA_CLIENT_MEM_FRACTION`` variables once, when the
GPU backend starts; a value changed later has no effect. A hook (through
:mod:`helpers._jax_internals`), installed when this module is imported before any backend
starts, records them at that moment, so :mod:`helpers.env_rules` can tell a user that a change
came too late.
"""

from __future__ import annotations

import os
import sys
import threading

from helpers import _jax_internals

__all__ = ["ALLOCATOR_VARS", "backend_start_snapshot", "ensure_hook", "import_jax"]

#: Read by jaxlib when the GPU backend starts; changing them later has no effect.
ALLOCATOR_VARS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)

# --- what the allocator variables were when each backend started --------------------------
# Filled by a JAX backend-initialisation hook installed when helpers is imported before any
# backend starts. If helpers came later, we cannot know, and say so.
_lock = threading.Lock()
_at_start: dict[str, dict[str, str | None]] = {}
_hook_state = "not installed"


def _on_backend_start(client) -> None:  # called by JAX with the new client
    snapshot = {name: os.environ.get(name) for name in ALLOCATOR_VARS}
    with _lock:
        _at_start.setdefault(str(client.platform), snapshot)


def ensure_hook() -> None:
    """Install the hook once, if JAX is imported (never importing it: the doctor's parent and
    the CLI must work where ``import jax`` fails). Every kit module that imports JAX calls
    this right after, so the hook is in place before the user's first JAX operation."""
    global _hook_state
    with _lock:
        if _hook_state == "not installed" and "jax" in sys.modules:
            _hook_state = _jax_internals.on_backend_start(_on_backend_start)


def backend_start_snapshot() -> tuple[str, dict[str, dict[str, str | None]]]:
    """(state, {platform: {var: value at backend start}}).

    state is "installed" (values are exact), "late" (helpers was imported after JAX started
    its backends, values unknown), "unavailable" (this JAX has no hook: before 0.10.2) or
    "not installed" (JAX is not imported).
    """
    ensure_hook()
    with _lock:
        return _hook_state, {k: dict(v) for k, v in _at_start.items()}


def import_jax():
    """``import jax`` for a kit module that imports it late (inside a function), with the hook
    in place before the caller's first JAX operation can start a backend."""
    import jax

    ensure_hook()
    return jax


ensure_hook()
