"""The environment variables that decide where JAX puts arrays and how much memory it takes.

Capture only: :func:`read_environment` returns plain data, :func:`check_environment` returns
warnings for known mistakes. Both read ``os.environ`` and JAX's config; neither starts a backend.

What is checked comes from what JAX itself reads: ``jaxlib/xla_client.py`` reads the
``XLA_PYTHON_CLIENT_*`` / ``XLA_CLIENT_MEM_FRACTION`` variables once, when the GPU backend
starts; ``jax`` reads ``JAX_PLATFORMS`` and ``JAX_DEFAULT_DEVICE`` once, at ``import jax``.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

__all__ = [
    "ALLOCATOR_VARS",
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

#: Read by jaxlib when the GPU backend starts; changing them later has no effect.
ALLOCATOR_VARS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)
_ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")
_PREALLOCATE_OFF = ("false", "False", "0")  # exactly what jaxlib compares against
_GPU_PLATFORMS = ("cuda", "rocm", "gpu")


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None  # None: not set
    meaning: str


@dataclass(frozen=True)
class EnvWarning:
    code: str  # stable identifier, e.g. "both-mem-fractions"
    message: str  # what is wrong
    fix: str  # what to do


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


def _install_hook() -> None:
    global _hook_state
    try:
        from jax._src import xla_bridge as xb  # private, hence the guard
    except Exception:  # pragma: no cover - JAX layout changed
        _hook_state = "unavailable"
        return
    if not hasattr(xb, "register_backend_initialization_hook"):  # pragma: no cover
        _hook_state = "unavailable"
        return
    started_before = xb.backends_are_initialized()
    if not started_before:
        xb.register_backend_initialization_hook(_on_backend_start)
        _hook_state = "installed"
    else:
        _hook_state = "late"


def backend_start_snapshot() -> tuple[str, dict[str, dict[str, str | None]]]:
    """(state, {platform: {var: value at backend start}}).

    state is "installed" (values are exact), "late" (helpers was imported after JAX started
    its backends, values unknown) or "unavailable".
    """
    with _lock:
        return _hook_state, {k: dict(v) for k, v in _at_start.items()}


_install_hook()


# --- capture ------------------------------------------------------------------------------
def read_environment(environ: dict[str, str] | None = None) -> tuple[EnvVar, ...]:
    env = os.environ if environ is None else environ
    return tuple(EnvVar(name, env.get(name), meaning) for name, meaning in VARIABLES.items())


def _jax_config_value(name: str):
    try:
        import jax

        return getattr(jax.config, name)
    except Exception:  # pragma: no cover
        return None


def check_environment(
    environ: dict[str, str] | None = None,
    *,
    started_platforms: tuple[str, ...] = (),
) -> tuple[EnvWarning, ...]:
    """Known mistakes in the placement/allocation variables.

    started_platforms: platforms whose backends are running in this process (used to tell
    that a variable was changed after it was read).
    """
    env = dict(os.environ if environ is None else environ)
    out: list[EnvWarning] = []

    new, old = env.get("XLA_CLIENT_MEM_FRACTION"), env.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if new and old:
        out.append(EnvWarning(
            "both-mem-fractions",
            f"XLA_CLIENT_MEM_FRACTION={new} and XLA_PYTHON_CLIENT_MEM_FRACTION={old} are both "
            "set; JAX refuses to start the GPU backend (ValueError).",
            "unset XLA_PYTHON_CLIENT_MEM_FRACTION (the deprecated name) and keep "
            "XLA_CLIENT_MEM_FRACTION",
        ))
    for name, value in (("XLA_CLIENT_MEM_FRACTION", new), ("XLA_PYTHON_CLIENT_MEM_FRACTION", old)):
        if not value:
            continue
        try:
            fraction = float(value)
        except ValueError:
            out.append(EnvWarning(
                "bad-mem-fraction",
                f"{name}={value!r} is not a number; the GPU backend will fail to start.",
                f"set {name} to a fraction such as 0.5",
            ))
            continue
        if not 0 < fraction <= 1:
            out.append(EnvWarning(
                "mem-fraction-out-of-range",
                f"{name}={value} is outside (0, 1]; it is a fraction of total GPU memory.",
                f"set {name} to a value in (0, 1], e.g. 0.5 for half the GPU",
            ))

    pre = env.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    if pre and pre not in _PREALLOCATE_OFF and pre not in ("true", "True", "1"):
        out.append(EnvWarning(
            "preallocate-ambiguous",
            f"XLA_PYTHON_CLIENT_PREALLOCATE={pre!r} is read as TRUE: JAX turns preallocation "
            "off only for exactly 'false', 'False' or '0'.",
            "write XLA_PYTHON_CLIENT_PREALLOCATE=false to turn preallocation off",
        ))

    alloc = env.get("XLA_PYTHON_CLIENT_ALLOCATOR")
    if alloc and alloc.lower() not in _ALLOCATORS:
        out.append(EnvWarning(
            "bad-allocator",
            f"XLA_PYTHON_CLIENT_ALLOCATOR={alloc!r} is not one of {', '.join(_ALLOCATORS)}; "
            "the GPU backend will fail to start.",
            "set XLA_PYTHON_CLIENT_ALLOCATOR=platform (allocate on demand) or unset it",
        ))

    if env.get("CUDA_VISIBLE_DEVICES") is not None and env["CUDA_VISIBLE_DEVICES"].strip() in (
        "", "-1"
    ):
        out.append(EnvWarning(
            "no-visible-gpu",
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} hides every NVIDIA GPU from "
            "this process.",
            "unset CUDA_VISIBLE_DEVICES, or list the GPU ids to use (e.g. 0)",
        ))

    if "xla_force_host_platform_device_count" in env.get("XLA_FLAGS", "") and env.get(
        "JAX_NUM_CPU_DEVICES"
    ):
        out.append(EnvWarning(
            "two-cpu-device-counts",
            "both XLA_FLAGS=--xla_force_host_platform_device_count and JAX_NUM_CPU_DEVICES "
            "set the number of CPU devices.",
            "keep JAX_NUM_CPU_DEVICES (or jax.config.update('jax_num_cpu_devices', N)) and drop "
            "the XLA flag",
        ))

    # Set too late: JAX read JAX_PLATFORMS at import; the env now says something else.
    if "jax" in _imported_modules():
        configured = _jax_config_value("jax_platforms")
        wanted = env.get("JAX_PLATFORMS")
        if wanted is not None and (wanted or None) != (configured or None):
            out.append(EnvWarning(
                "platforms-set-after-import",
                f"JAX_PLATFORMS is {wanted!r} now but JAX read {configured!r} when it was "
                "imported; the change has no effect in this process.",
                "set JAX_PLATFORMS before `import jax` (first cell of the notebook, or in the "
                "shell), then restart the kernel",
            ))

    # Set too late: allocator variables changed after the GPU backend started.
    gpu_started = [p for p in started_platforms if p in _GPU_PLATFORMS]
    if gpu_started:
        state, snapshots = backend_start_snapshot()
        for platform in gpu_started:
            then = snapshots.get(platform)
            if then is None:
                if state == "late":
                    out.append(EnvWarning(
                        "allocator-settings-unverified",
                        f"the {platform} backend started before helpers was imported, so the kit "
                        "cannot tell whether the allocator variables changed since.",
                        "import helpers before running any JAX operation, or run "
                        "`python -m helpers doctor` in a fresh process",
                    ))
                continue
            changed = [n for n in ALLOCATOR_VARS if env.get(n) != then.get(n)]
            if changed:
                detail = ", ".join(f"{n}: {then.get(n)!r} -> {env.get(n)!r}" for n in changed)
                out.append(EnvWarning(
                    "allocator-set-after-start",
                    f"changed after the {platform} backend started, so not in effect: {detail}.",
                    "set these before the first JAX operation (restart the kernel and set them "
                    "in the first cell), or run the experiment in a child process",
                ))
    return tuple(out)


def _imported_modules():
    return sys.modules
