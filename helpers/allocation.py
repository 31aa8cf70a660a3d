"""What JAX's GPU allocator settings do, each run in a fresh child process.

The settings are environment variables JAX reads once, when its GPU backend starts, so the only
honest way to compare them is one fresh process per setting:

- :func:`plugin_options` asks jaxlib which options it *would* pass to the CUDA client for an
  environment (pure Python in jaxlib: runs on any machine, GPU or not, including the error when
  both memory-fraction variables are set);
- :func:`measure` starts JAX on the GPU under an environment, allocates ``array_bytes``, and
  reports the allocator's counters and what the driver (nvidia-smi) says the process uses;
- :func:`measure_together` runs two such processes on one GPU at the same time.

``measure`` and ``measure_together`` need an NVIDIA GPU; without one they raise
:class:`NoGpuError` saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from helpers import gpu
from helpers.gpu import NoGpuError

__all__ = ["AllocatorMeasurement", "NoGpuError", "SETTINGS", "measure", "measure_together",
           "plugin_options"]

#: The settings notebook 05 compares: name -> environment (None removes a variable).
SETTINGS = {
    "default": {},
    "PREALLOCATE=false": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "MEM_FRACTION=0.25": {"XLA_CLIENT_MEM_FRACTION": "0.25"},
    "ALLOCATOR=platform": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
}
_ALL_VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION",
             "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")


def _env(overrides: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _ALL_VARS and k != "JAX_PLATFORMS"}
    for k, v in overrides.items():
        if v is not None:
            env[k] = str(v)
    return env


_OPTIONS_CHILD = """
import json
from jaxlib import xla_client
try:
    opts = xla_client.generate_pjrt_gpu_plugin_options()
    print(json.dumps({"options": {k: v for k, v in opts.items()}}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


def plugin_options(env: dict) -> dict:
    """The options jaxlib would hand the CUDA client under ``env`` (added to a clean copy of this
    process's environment), as ``{"options": {...}}`` or ``{"error": "ValueError: ..."}``.
    Reads only environment variables: no GPU needed, nothing allocated."""
    proc = subprocess.run([sys.executable, "-c", _OPTIONS_CHILD], env=_env(env),
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError("could not ask jaxlib for its GPU options: "
                           f"{proc.stderr.strip()[-500:]}")
    return json.loads(lines[-1])


@dataclass(frozen=True)
class AllocatorMeasurement:
    setting: str
    env: dict
    ok: bool
    error: str | None
    device_kind: str | None
    total_bytes: int | None  # the GPU's memory (nvidia-smi)
    array_bytes: int  # what the child allocated on purpose
    bytes_in_use: int | None  # allocator: live buffers
    peak_bytes_in_use: int | None
    bytes_limit: int | None  # allocator: the most it will hand out
    bytes_reserved: int | None  # allocator: reserved from the driver, where reported
    driver_used_bytes: int | None  # nvidia-smi: memory this process holds on the GPU

    def to_dict(self) -> dict:
        return asdict(self)


def _require_gpu() -> int:
    """The GPU's total memory (from the driver), or NoGpuError naming the reason and fix."""
    gpu.require("the allocator measurements (plugin_options() runs anywhere)")
    total = gpu.total_bytes()
    if total is None:
        raise NoGpuError("the driver reports no memory size for JAX's cuda:0")
    return total


def _start(setting: str, env: dict, array_bytes: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "helpers._alloc_child", setting, str(array_bytes)],
        env=_env(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _read(proc: subprocess.Popen, setting: str, env: dict, array_bytes: int,
          total: int) -> AllocatorMeasurement:
    line = proc.stdout.readline()
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        proc.kill()
        err = proc.stderr.read().strip().splitlines()[-3:]
        data = {"ok": False, "error": " | ".join(err) or "the child printed nothing"}
    return AllocatorMeasurement(
        setting=setting, env=dict(env), ok=data.get("ok", False), error=data.get("error"),
        device_kind=data.get("device_kind"), total_bytes=total,
        array_bytes=array_bytes, bytes_in_use=data.get("bytes_in_use"),
        peak_bytes_in_use=data.get("peak_bytes_in_use"), bytes_limit=data.get("bytes_limit"),
        bytes_reserved=data.get("bytes_reserved"),
        driver_used_bytes=data.get("driver_used_bytes"))


def _finish(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.communicate("\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def measure(setting: str = "default", env: dict | None = None, *, array_bytes: int = 2**28,
            timeout: float = 180) -> AllocatorMeasurement:
    """Start JAX on the GPU in a fresh child under ``env`` (default: ``SETTINGS[setting]``),
    allocate ``array_bytes``, and measure. Needs an NVIDIA GPU (else NoGpuError)."""
    total = _require_gpu()
    env = SETTINGS[setting] if env is None else env
    proc = _start(setting, env, array_bytes)
    try:
        return _read(proc, setting, env, array_bytes, total)
    finally:
        _finish(proc, timeout)


def measure_together(settings=("default", "default"), *, array_bytes: int = 2**28,
                     timeout: float = 180) -> list[AllocatorMeasurement]:
    """Two (or more) JAX processes on one GPU at the same time: each starts, allocates, reports,
    and holds its memory until all have reported. Needs an NVIDIA GPU."""
    total = _require_gpu()
    procs, out = [], []
    try:
        for s in settings:  # one after the other: the second starts while the first holds its pool
            env = SETTINGS[s]
            p = _start(s, env, array_bytes)
            procs.append(p)
            out.append(_read(p, s, env, array_bytes, total))
    finally:
        for p in procs:
            _finish(p, timeout)
    return out
