"""Will this file fit where it will land?

:func:`preflight` reads only a safetensors file's header (never its data) and compares the
bytes with the free memory of the device the load would land on *right now*: the allocator's
``bytes_limit - bytes_in_use`` on a GPU, the host's available memory on the CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from helpers._display import Display
from helpers._jax_internals import device_name
from helpers.errors import BackendError, BadInputError, FileError
from helpers.safetensors_format import read_header
from helpers.unavailable import NOT_AVAILABLE, NotAvailable, to_json_value
from helpers.units import format_bytes

__all__ = ["FIX", "Preflight", "TensorInfo", "preflight"]

FIX = ("load it into host memory instead: `with jax.default_device(jax.devices('cpu')[0]): "
        "tokens = safetensors.flax.load_file(path)['tokens']`, or skip JAX for the load "
        "(`safetensors.numpy.load_file(path)`, or a read-only numpy.memmap of the data), then "
        "`jax.device_put` one batch at a time")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Preflight(Display):
    path: str
    file_bytes: int
    tensors: tuple[TensorInfo, ...]
    total_bytes: int
    device: str  # where the load would land, e.g. "cuda:0", "cpu:0"
    device_reason: str  # why that device
    free_bytes: int | NotAvailable  # NOT_AVAILABLE: the device keeps no stats
    free_source: str  # "allocator (bytes_limit - bytes_in_use)" / "host available memory"
    verdict: str  # "fits" | "will not fit" | "unknown"
    advice: str

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = [asdict(t) for t in self.tensors]
        d["free_bytes"] = to_json_value(self.free_bytes)
        return d


# --- where would it land, and is there room ----------------------------------------------
_DOCTOR = "run `python -m helpers doctor` to see why and how to fix it"


def _jax():
    """JAX, imported; BackendError (not a traceback) when this environment cannot import it."""
    from helpers import _backend_start

    try:
        return _backend_start.import_jax()
    except Exception as err:  # e.g. JAX_NUM_CPU_DEVICES=abc raises inside `import jax`
        raise BackendError(f"JAX cannot start here ({type(err).__name__}: {err}); "
                           f"{_DOCTOR}") from None


def _default_device():
    from jax.extend.backend import get_default_device

    try:
        return get_default_device()
    except Exception as err:  # JAX_PLATFORMS=cuda without a GPU: a bare AssertionError
        raise BackendError(f"JAX could not start its default backend "
                           f"({type(err).__name__}: {err}); {_DOCTOR}") from None


def _target(device):
    jax = _jax()
    if device is None or device == "default":
        d = _default_device()
        configured = jax.config.jax_default_device
        why = ("the default device, set by jax.default_device" if configured is not None
               else "the default device: first device of the default backend")
        return d, why
    if isinstance(device, str):
        name = {"gpu": "gpu", "cuda": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(device.lower())
        if name is None:
            raise BadInputError(f"device must be 'default', 'cpu', 'gpu' or a jax.Device, "
                                f"got {device!r}")
        try:
            return jax.devices(name)[0], f"asked for {device!r}"
        except Exception:
            raise BadInputError(f"no {device!r} backend on this machine (backends: "
                                f"{', '.join(_backend_names())}); {_DOCTOR}") from None
    if isinstance(device, jax.Device):
        return device, "asked for this device"
    raise TypeError(f"device must be None, 'cpu', 'gpu' or a jax.Device, got {device!r}")


def _backend_names() -> list[str]:
    from jax.extend.backend import backends

    try:
        return sorted(backends())
    except Exception:  # no backend starts at all
        return ["none started"]


def _free_bytes(device) -> tuple[int | NotAvailable, str]:
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
    return NOT_AVAILABLE, f"{device.platform} keeps no memory statistics"


def judge(needed: int, free, dev, *, fix: str, unknown: str) -> tuple[str, str]:
    """Verdict and advice for ``needed`` bytes against ``free`` on ``dev`` (files and steps)."""
    if free is NOT_AVAILABLE:
        return "unknown", unknown
    if needed <= free:
        return "fits", ("" if needed <= 0.9 * free else
                        f"tight: {needed / free:.0%} of what is free; anything else allocated "
                        "first will make it fail")
    return "will not fit", (f"needs {format_bytes(needed)}, {format_bytes(free)} free on "
                            f"{device_name(dev)}. {fix}")


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
    verdict, advice = judge(total, free, dev, fix="Fix: " + FIX,
                            unknown="this device reports no free memory; try a smaller file")
    return Preflight(str(path), Path(path).stat().st_size, tuple(tensors), total, device_name(dev),
                     why, free, source, verdict, advice)
