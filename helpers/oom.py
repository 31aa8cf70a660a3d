"""The OOM itself, reproduced without killing you.

:func:`reproduce` runs the story's load, ``safetensors.flax.load_file(path)["tokens"]``, in a
child process with a hard memory cap, then (with ``fixed=True``) runs it again with the fix, and
returns plain data. On a GPU the cap is the memory-fraction variable; without one, a labelled
CPU stand-in caps the child's address space.

:func:`preflight` (will this file fit where it will land?) lives in :mod:`helpers.preflight`
and the file format in :mod:`helpers.safetensors_format`; both are also reachable from here.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from helpers import _child, _jax_internals, gpu
from helpers._display import Display
from helpers.datasets import write_tokens
from helpers.errors import BadInputError, FileError, PathError
from helpers.preflight import FIX, Preflight, TensorInfo, preflight
from helpers.safetensors_format import DTYPE_BITS, read_header
from helpers.step_preflight import StepPreflight, preflight_step
from helpers.units import format_bytes, parse_size

__all__ = [
    "DTYPE_BITS",
    "FIX",
    "FileError",
    "Preflight",
    "Reproduction",
    "StepPreflight",
    "TensorInfo",
    "preflight",
    "preflight_step",
    "read_header",
    "reproduce",
]


# --- reproduction in a child process ------------------------------------------------------
@dataclass(frozen=True)
class Reproduction(Display):
    attempt: str  # the code the child ran
    fixed: bool  # True for the run with the default_device fix
    stand_in: bool  # True: CPU stand-in (memory-capped child), not a real GPU
    platform: str  # "gpu" or "cpu (stand-in)"
    device: str  # where the data was going, e.g. "cuda:0" or "cpu:0"
    landed_on: str | None  # where it landed, if it loaded
    budget_bytes: int | None  # the cap the child ran under
    budget_how: str  # how the cap was applied
    requested_bytes: int  # size of the tensor the load needed
    ok: bool
    error_type: str | None  # e.g. "jax.errors.JaxRuntimeError"
    error_message: str | None
    accelerator_bytes_added: int | None  # bytes in use on the accelerator, after - before
    elapsed_s: float
    exit_code: int

    def to_dict(self) -> dict:
        return asdict(self)


# The memory-fraction variable the kit sets. jaxlib reads the documented XLA_CLIENT_MEM_FRACTION
# and still honours the older XLA_PYTHON_CLIENT_MEM_FRACTION (jaxlib/xla_client.py,
# generate_pjrt_gpu_plugin_options); setting both is an error, so the kit sets only this one.
_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"
_MIN_FRACTION = 0.005  # the smallest pool the kit asks for: JAX's own start-up needs room


def _gpu_mode_available() -> bool:
    """True when the GPU path can run, decided without starting JAX's GPU backend here
    (which would preallocate 75% of the card for this process) unless JAX already runs."""
    jax = sys.modules.get("jax")
    if jax is not None and _jax_internals.backends_started():
        return jax.default_backend() == "gpu"
    return gpu.why_unavailable() is None


def _run_child(args: list[str], env: dict, timeout: float) -> tuple[dict | None, int, str]:
    result = _child.run_json("helpers._oom_child", args, env=env, timeout=timeout)
    stderr = result.describe_failure() if result.timed_out else result.stderr
    return result.data, result.returncode, stderr


def _check_room(mode: str, requested: int, budget, total: int | None) -> int | None:
    """The cap for the load (default: half of it), after checking the machine can run it.
    ``total``: the GPU's memory in gpu mode."""
    if mode == "gpu":
        cap = parse_size(budget) if budget is not None else (requested // 2 if total else None)
        if total and cap and cap >= total:
            raise BadInputError(f"budget {format_bytes(cap)} is larger than the GPU "
                             f"({format_bytes(total)}); pick one below it")
        return cap
    import psutil

    cap = parse_size(budget) if budget is not None else requested // 2
    machine = psutil.virtual_memory()
    if budget is not None and cap >= machine.total:
        raise BadInputError(f"budget {format_bytes(cap)} is larger than this machine's memory "
                         f"({format_bytes(machine.total)}); pick one below it")
    if 3 * requested + cap > machine.available:
        raise BadInputError(f"the stand-in needs about {format_bytes(3 * requested + cap)} "
                         f"free to reproduce a {format_bytes(requested)} load and "
                         f"{format_bytes(machine.available)} is available; use a smaller "
                         "--size (256MiB shows the same error)")
    return cap


def reproduce(path=None, *, size="256 MiB", fixed: bool = False, mode: str = "auto",
              budget=None, timeout: float = 300, workdir=None) -> Reproduction:
    """Run ``safetensors.flax.load_file(path)["tokens"]`` in a child process under a memory
    cap, so the caller survives the OOM. With ``fixed=True`` the child wraps the load in
    ``with jax.default_device(<host device>):``.

    mode "auto": the real GPU when JAX here has one, else the CPU stand-in. "gpu": cap the
    child's GPU pool with the memory-fraction variable so the file does not fit. "cpu": the
    stand-in: the child (two simulated CPU devices; cpu:0 plays the accelerator) caps its own
    address space with ``resource.setrlimit`` so that JAX's device copy, and not the file read,
    is what fails; the fix run loads onto cpu:1 (host memory is not what the cap models).

    path: an existing token file; when None, one of ``size`` is written in ``workdir`` (a
    temporary folder by default) and reused.
    """
    if mode not in ("auto", "gpu", "cpu"):
        raise BadInputError(f"mode must be 'auto', 'gpu' or 'cpu', got {mode!r}")
    if mode == "auto":
        mode = "gpu" if _gpu_mode_available() else "cpu"
    elif mode == "gpu" and not _gpu_mode_available():
        gpu.require("reproduce-oom --mode gpu")  # raises NoGpuError: reason and fix
    total = gpu.total_bytes() if mode == "gpu" else None  # asked once, from the driver
    if path is None:
        n = parse_size(size) // 2
        requested = 2 * n
        _check_room(mode, requested, budget, total)  # before writing a file that cannot be used
        folder = Path(workdir or tempfile.gettempdir()) / "jax-device-kit"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise PathError(f"cannot create {folder} for the token file: "
                            f"{err.strerror or err}; pass workdir= a writable folder") from None
        path = folder / f"tokens-{n}.safetensors"
        if not path.exists():
            write_tokens(path, n, progress=False)
    header, _ = read_header(path)  # validates the file, reads no data
    if "tokens" not in header:
        raise FileError(path, "has no tensor named 'tokens'",
                        "the reproduction loads the story's `tokens` tensor")
    start, end = header["tokens"]["data_offsets"]
    requested = end - start
    cap = _check_room(mode, requested, budget, total)
    env = _child.child_env({"PYTHONUNBUFFERED": "1"},
                           drop=("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"))
    args = [str(path), "--mode", mode] + (["--fixed"] if fixed else [])
    if mode == "gpu":
        fraction = max(_MIN_FRACTION, min(0.9, cap / total)) if (total and cap) else 0.05
        if total and fraction * total >= requested:
            raise BadInputError(
                f"a {format_bytes(requested)} file fits in the smallest pool the kit sets on this "
                f"GPU ({_MIN_FRACTION:.1%} of {format_bytes(total)}), so it cannot run out of "
                f"memory: use a file of at least {format_bytes(4 * _MIN_FRACTION * total)} "
                "(--size)")
        var = _FRACTION_VAR
        env[var] = f"{fraction:.4f}"
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)  # default: preallocate the capped pool
        how = f"{var}={fraction:.4f} of {format_bytes(total)}"
        budget_bytes = int(fraction * total) if total else None
    else:
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = "2"
        args += ["--budget", str(cap)]
        if fixed:
            how = ("stand-in: host memory not capped (the cap models the accelerator's "
                   "memory; the fix puts the data in host memory)")
            budget_bytes = None
        else:
            how = ("stand-in: RLIMIT_AS = address space after start-up + the file's read "
                   f"(2 x {format_bytes(requested)}) + {format_bytes(cap)} for the device copy")
            budget_bytes = cap
    t0 = time.perf_counter()
    result, code, stderr = _run_child(args, env, timeout)
    elapsed = time.perf_counter() - t0
    if result is None:
        tail = stderr.strip().splitlines()[-5:]
        result = {"ok": False, "error_type": "ChildProcessError",
                  "error_message": f"child exited {code} without a result: " + " | ".join(tail),
                  "device": "?", "landed_on": None, "accelerator_bytes_added": None,
                  "attempt": "?"}
    return Reproduction(
        attempt=result.get("attempt", "?"), fixed=fixed, stand_in=(mode == "cpu"),
        platform="gpu" if mode == "gpu" else "cpu (stand-in)", device=result.get("device", "?"),
        landed_on=result.get("landed_on"), budget_bytes=budget_bytes, budget_how=how,
        requested_bytes=requested, ok=bool(result.get("ok")),
        error_type=result.get("error_type"), error_message=result.get("error_message"),
        accelerator_bytes_added=result.get("accelerator_bytes_added"), elapsed_s=elapsed,
        exit_code=code,
    )
