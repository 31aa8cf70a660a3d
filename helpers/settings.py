"""The environment variables that decide where JAX puts arrays and how much memory it takes.

Capture only: :func:`read_environment` returns plain data, :func:`check_environment` returns
warnings for known mistakes (one rule each, in :mod:`helpers.env_rules`). Both read
``os.environ`` and JAX's config; neither starts a backend.

What is checked comes from what JAX itself reads: ``jaxlib/xla_client.py`` reads the
``XLA_PYTHON_CLIENT_*`` / ``XLA_CLIENT_MEM_FRACTION`` variables once, when the GPU backend
starts; ``jax`` reads ``JAX_PLATFORMS`` and ``JAX_DEFAULT_DEVICE`` once, at ``import jax``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from helpers._backend_start import ALLOCATOR_VARS, backend_start_snapshot
from helpers.env_rules import RULES, EnvWarning, check

__all__ = [
    "ALLOCATOR_VARS",
    "RULES",
    "EnvVar",
    "EnvWarning",
    "VARIABLES",
    "backend_start_snapshot",
    "check_environment",
    "read_environment",
]

#: name -> what it governs (one line, shown in the doctor report)
VARIABLES: dict[str, str] = {
    "JAX_PLATFORMS": "which backends JAX starts, in priority order (read at `import jax`)",
    "JAX_DEFAULT_DEVICE": "platform of the default device (read at `import jax`)",
    "JAX_NUM_CPU_DEVICES": "number of CPU devices (simulated devices; before backends start)",
    "JAX_TRANSFER_GUARD": "log or disallow implicit host<->device transfers",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "GPU: take the whole pool at the first allocation (default "
                                     "true); false grows it on demand, up to the same cap",
    "XLA_CLIENT_MEM_FRACTION": "GPU: the pool's cap, as a fraction of total memory (default 0.75)",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "GPU: deprecated name of XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR": "GPU: allocator (default, platform, bfc, cuda_async, vmm)",
    "CUDA_VISIBLE_DEVICES": "which NVIDIA GPUs the process can see",
    "XLA_FLAGS": "flags passed to the XLA compiler and runtime",
}


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None  # None: not set
    meaning: str


# --- capture ------------------------------------------------------------------------------
def read_environment(environ: dict[str, str] | None = None) -> tuple[EnvVar, ...]:
    env = os.environ if environ is None else environ
    return tuple(EnvVar(name, env.get(name), meaning) for name, meaning in VARIABLES.items())


def check_environment(
    environ: dict[str, str] | None = None,
    *,
    started_platforms: tuple[str, ...] = (),
    this_process: bool = True,
) -> tuple[EnvWarning, ...]:
    """Known mistakes in the placement/allocation variables (see :data:`RULES`).

    started_platforms: platforms whose backends are running in this process (used to tell
    that a variable was changed after it was read). this_process=False: ``environ`` belongs
    to another process, so only the rules that read the environment alone run.
    """
    return check(dict(os.environ if environ is None else environ), started_platforms,
                 this_process=this_process)
