"""Will this file fit where it will land? And the OOM itself, reproduced without killing you.

:func:`preflight` reads only a safetensors file's header (never its data) and compares the
bytes with the free memory of the device the load would land on *right now*.
:func:`reproduce` runs the story's load, ``safetensors.flax.load_file(path)["tokens"]``, in a
child process with a hard memory cap, then runs it again with the fix, and returns plain data.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from helpers import gpu
from helpers.units import format_bytes, parse_size

__all__ = [
    "DTYPE_BITS",
    "FileError",
    "Preflight",
    "Reproduction",
    "TensorInfo",
    "preflight",
    "read_header",
    "reproduce",
]

#: safetensors dtype -> bits per element (sub-byte types are packed)
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E4M3FN": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
_MAX_HEADER = 100 * 2**20  # safetensors' own limit
_FIX = ("load it into host memory instead: `with jax.default_device(jax.devices('cpu')[0]): "
        "tokens = safetensors.flax.load_file(path)['tokens']`, or skip JAX for the load "
        "(`safetensors.numpy.load_file(path)`, or a read-only numpy.memmap of the data), then "
        "`jax.device_put` one batch at a time")


class FileError(ValueError):
    """A file that is not a readable safetensors file; the message names file and problem."""

    def __init__(self, path, problem: str, fix: str = ""):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{path}: {problem}" + (f" ({fix})" if fix else ""))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Preflight:
    path: str
    file_bytes: int
    tensors: tuple[TensorInfo, ...]
    total_bytes: int
    device: str  # where the load would land, e.g. "cuda:0", "cpu:0"
    device_reason: str  # why that device
    free_bytes: int | None  # None: the device keeps no stats
    free_source: str  # "allocator (bytes_limit - bytes_in_use)" / "host available memory"
    verdict: str  # "fits" | "will not fit" | "unknown"
    advice: str

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = [asdict(t) for t in self.tensors]
        return d

    def __str__(self) -> str:
        lines = [f"{self.path} ({format_bytes(self.file_bytes)})"]
        for t in self.tensors:
            lines.append(f"  {t.name}: {t.dtype}{list(t.shape)}  {format_bytes(t.nbytes)}")
        lines.append(f"  total: {format_bytes(self.total_bytes)} ({self.total_bytes:,} bytes)")
        lines.append(f"lands on: {self.device}  ({self.device_reason})")
        lines.append(f"free there: {format_bytes(self.free_bytes)}  ({self.free_source})")
        lines.append(f"verdict: {self.verdict.upper()}")
        if self.advice:
            lines.append(f"  {self.advice}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


# --- header -------------------------------------------------------------------------------
def read_header(path) -> tuple[dict, int]:
    """Validate a safetensors file's header without reading its data.

    Returns (header dict without __metadata__, data start offset). Raises FileError naming
    the file and the problem for every way a file can be broken.
    """
    p = Path(path)
    if not p.exists():
        raise FileError(p, "no such file", "check the path; make one with "
                        "`python -m helpers make-tokens PATH --size 1GiB`")
    if p.is_dir():
        raise FileError(p, "is a directory, not a safetensors file",
                        "pass the .safetensors file inside it")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            prefix = f.read(8)
            if size == 0:
                raise FileError(p, "is empty (0 bytes)", "the download or write did not finish")
            if len(prefix) < 8:
                raise FileError(p, f"is only {size} bytes; a safetensors file starts with an "
                                "8-byte header length", "the file is truncated")
            (n,) = struct.unpack("<Q", prefix)
            if n > _MAX_HEADER:
                raise FileError(p, f"header length {n:,} bytes is larger than safetensors "
                                f"allows ({_MAX_HEADER:,}); not a safetensors file?")
            if 8 + n > size:
                raise FileError(p, f"header length {n:,} bytes runs past the end of the "
                                f"{size:,}-byte file", "the file is truncated or not safetensors")
            raw = f.read(n)
    except PermissionError as err:
        raise FileError(p, f"cannot be read: {err.strerror}", "check its permissions") from None
    except OSError as err:
        raise FileError(p, f"cannot be read: {err.strerror or err}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FileError(p, f"header is not valid JSON ({err.__class__.__name__}: {err})",
                        "the file is corrupt or not safetensors") from None
    if not isinstance(header, dict):
        raise FileError(p, f"header is JSON but not an object (got {type(header).__name__})")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise FileError(p, f"tensor {name!r} lacks dtype, shape or data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BITS:
            raise FileError(p, f"tensor {name!r} has unknown dtype {dtype!r}",
                            f"known: {', '.join(sorted(DTYPE_BITS))}")
        if (not isinstance(shape, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FileError(p, f"tensor {name!r} has a bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) or
                not 0 <= offsets[0] <= offsets[1]):
            raise FileError(p, f"tensor {name!r} has bad data_offsets {offsets!r}")
        if offsets[1] > data_len:
            raise FileError(p, f"tensor {name!r} ends at byte {offsets[1]:,} of the data, past "
                            f"its end ({data_len:,} bytes)", "the file is truncated")
        expected = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
        if offsets[1] - offsets[0] != expected:
            raise FileError(p, f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]:,} "
                            f"bytes but shape {shape} x {dtype} needs {expected:,}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise FileError(p, f"tensors {a!r} and {b!r} overlap in the data")
    return header, 8 + n


# --- where would it land, and is there room ----------------------------------------------
def _target(device):
    import jax
    from jax.extend.backend import get_default_device

    if device is None or device == "default":
        d = get_default_device()
        configured = jax.config.jax_default_device
        why = ("the default device, set by jax.default_device" if configured is not None
               else "the default device: first device of the default backend")
        return d, why
    if isinstance(device, str):
        name = {"gpu": "gpu", "cuda": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(device.lower())
        if name is None:
            raise ValueError(f"device must be 'default', 'cpu', 'gpu' or a jax.Device, "
                             f"got {device!r}")
        try:
            return jax.devices(name)[0], f"asked for {device!r}"
        except RuntimeError:
            raise ValueError(f"no {device!r} backend on this machine (backends: "
                             f"{', '.join(sorted(_backend_names()))})") from None
    if isinstance(device, jax.Device):
        return device, "asked for this device"
    raise TypeError(f"device must be None, 'cpu', 'gpu' or a jax.Device, got {device!r}")


def _backend_names():
    from jax.extend.backend import backends

    return list(backends())


def _free_bytes(device) -> tuple[int | None, str]:
    try:
        stats = device.memory_stats()
    except Exception:
        stats = None
    if stats and "bytes_limit" in stats:
        return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
                "allocator: bytes_limit - bytes_in_use")
    if device.platform == "cpu":
        import psutil

        return int(psutil.virtual_memory().available), "host: available memory (psutil)"
    return None, f"{device.platform} keeps no memory statistics"


def preflight(path, *, device=None) -> Preflight:
    """Dtype, shape and bytes of every tensor, the device a load would land on now, the free
    memory there, and a verdict. Reads only the header (also cross-checked by safetensors)."""
    header, _ = read_header(path)
    try:  # cross-check with the library the load will use
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            slices = {k: f.get_slice(k) for k in f.keys()}
            lib = {k: (s.get_dtype(), list(s.get_shape())) for k, s in slices.items()}
    except Exception as err:
        raise FileError(path, f"safetensors refuses it: {err}") from None
    tensors = []
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        e = header[name]
        if lib.get(name) != (e["dtype"], e["shape"]):
            raise FileError(path, f"tensor {name!r}: safetensors reads {lib.get(name)}, the "
                            f"header says {(e['dtype'], e['shape'])}")
        tensors.append(TensorInfo(name, e["dtype"], tuple(e["shape"]),
                                  e["data_offsets"][1] - e["data_offsets"][0]))
    total = sum(t.nbytes for t in tensors)
    dev, why = _target(device)
    free, source = _free_bytes(dev)
    if free is None:
        verdict, advice = "unknown", "this device reports no free memory; try a smaller file"
    elif total <= free:
        verdict = "fits"
        advice = ("" if total <= 0.9 * free else
                  f"tight: {total / free:.0%} of what is free; anything else allocated first "
                  "will make it fail")
    else:
        verdict = "will not fit"
        advice = (f"needs {format_bytes(total)}, {format_bytes(free)} free on {dev}. Fix: "
                  + _FIX)
    return Preflight(str(path), Path(path).stat().st_size, tuple(tensors), total, str(dev),
                     why, free, source, verdict, advice)


# --- reproduction in a child process ------------------------------------------------------
@dataclass(frozen=True)
class Reproduction:
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

    def __str__(self) -> str:
        label = "STAND-IN (CPU, memory-capped child)" if self.stand_in else "real GPU"
        head = f"[{'fix' if self.fixed else 'seed load'}] {label}: {self.attempt}"
        if self.ok:
            body = (f"  OK: landed on {self.landed_on}; accelerator bytes added: "
                    f"{format_bytes(self.accelerator_bytes_added)}")
        else:
            body = f"  FAILED: {self.error_type}: {self.error_message}"
        return (f"{head}\n  wanted {format_bytes(self.requested_bytes)} on {self.device}, "
                f"budget {format_bytes(self.budget_bytes)} ({self.budget_how})\n{body}\n"
                f"  exit code {self.exit_code}, {self.elapsed_s:.2f} s")

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))




# The memory-fraction variable the kit sets. jaxlib reads the documented XLA_CLIENT_MEM_FRACTION
# and still honours the older XLA_PYTHON_CLIENT_MEM_FRACTION (jaxlib/xla_client.py,
# generate_pjrt_gpu_plugin_options); setting both is an error, so the kit sets only this one.
_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"


def _gpu_mode_available() -> bool:
    """True when the GPU path can run, decided without starting JAX's GPU backend here
    (which would preallocate 75% of the card for this process) unless JAX already runs."""
    jax = sys.modules.get("jax")
    if jax is not None and _jax_started():
        return jax.default_backend() == "gpu"
    return gpu.why_unavailable() is None


def _jax_started() -> bool:
    from helpers.devices import _xla_bridge  # the kit's one reach into JAX's private xla_bridge

    try:
        return bool(_xla_bridge().backends_are_initialized())
    except Exception:  # moved in a newer JAX: assume not started, ask the driver instead
        return False


def _run_child(args: list[str], env: dict, timeout: float) -> tuple[dict | None, int, str]:
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as out:
        out_path = out.name
    try:
        proc = subprocess.run([sys.executable, "-m", "helpers._oom_child", *args,
                               "--out", out_path], env=env,
                              capture_output=True, text=True, timeout=timeout)
        text = Path(out_path).read_text()
        return (json.loads(text) if text.strip() else None), proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        return None, -9, f"the child did not finish within {timeout:.0f} s and was killed"
    finally:
        os.unlink(out_path)


def _check_room(mode: str, requested: int, budget, total: int | None) -> int | None:
    """The cap for the load (default: half of it), after checking the machine can run it.
    ``total``: the GPU's memory in gpu mode."""
    if mode == "gpu":
        cap = parse_size(budget) if budget is not None else (requested // 2 if total else None)
        if total and cap and cap >= total:
            raise ValueError(f"budget {format_bytes(cap)} is larger than the GPU "
                             f"({format_bytes(total)}); pick one below it")
        return cap
    import psutil

    cap = parse_size(budget) if budget is not None else requested // 2
    machine = psutil.virtual_memory()
    if budget is not None and cap >= machine.total:
        raise ValueError(f"budget {format_bytes(cap)} is larger than this machine's memory "
                         f"({format_bytes(machine.total)}); pick one below it")
    if 3 * requested + cap > machine.available:
        raise ValueError(f"the stand-in needs about {format_bytes(3 * requested + cap)} "
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
        raise ValueError(f"mode must be 'auto', 'gpu' or 'cpu', got {mode!r}")
    if mode == "auto":
        mode = "gpu" if _gpu_mode_available() else "cpu"
    elif mode == "gpu" and not _gpu_mode_available():
        gpu.require("reproduce-oom --mode gpu")  # raises NoGpuError: reason and fix
    total = gpu.total_bytes() if mode == "gpu" else None  # asked once, from the driver
    if path is None:
        n = parse_size(size) // 2
        requested = 2 * n
        _check_room(mode, requested, budget, total)  # before writing a file that cannot be used
        from helpers.datasets import write_tokens

        folder = Path(workdir or tempfile.gettempdir()) / "jax-device-kit"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"tokens-{n}.safetensors"
        if not path.exists():
            write_tokens(path, n)
    header, _ = read_header(path)  # validates the file, reads no data
    if "tokens" not in header:
        raise FileError(path, "has no tensor named 'tokens'",
                        "the reproduction loads the story's `tokens` tensor")
    start, end = header["tokens"]["data_offsets"]
    requested = end - start
    cap = _check_room(mode, requested, budget, total)
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")}
    env["PYTHONUNBUFFERED"] = "1"
    args = [str(path), "--mode", mode] + (["--fixed"] if fixed else [])
    if mode == "gpu":
        fraction = max(0.005, min(0.9, cap / total)) if (total and cap) else 0.05
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
