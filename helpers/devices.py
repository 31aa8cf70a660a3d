"""What backends and devices exist, which one is the default, and why an array sits where it does.

Capture only: every function here returns plain frozen data. Rendering (text, HTML, JSON) lives
in :mod:`helpers.report`; the dataclasses forward ``_repr_html_`` and ``str`` to it.

>>> from helpers import devices
>>> report = devices.probe()
>>> report.default_backend in report.backend_names
True
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform as _platform
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jax
import numpy as np

from helpers import settings

__all__ = [
    "NOT_AVAILABLE",
    "BackendInfo",
    "DeviceInfo",
    "DeviceReport",
    "FailedBackend",
    "JaxAlreadyStartedError",
    "Placement",
    "Roles",
    "placement",
    "probe",
    "probe_in_child",
    "roles",
    "simulate_cpu_devices",
]


class _NotAvailable:
    """Sentinel for a number a backend does not keep (CPU ``memory_stats()`` is ``None``)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_AVAILABLE"

    def __str__(self) -> str:
        return "not available"

    def __bool__(self) -> bool:
        return False


NOT_AVAILABLE: Any = _NotAvailable()


class JaxAlreadyStartedError(RuntimeError):
    """A setting that must come before JAX starts its backends came too late."""


# --- plain data ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceInfo:
    id: int
    platform: str
    kind: str
    process_index: int
    memory_kinds: tuple[str, ...]
    default_memory_kind: str | None
    #: allocator statistics (bytes_in_use, peak_bytes_in_use, bytes_limit, ...) or NOT_AVAILABLE
    memory_stats: Mapping[str, int] | Any = NOT_AVAILABLE
    name: str = ""  # str(device), e.g. "cpu:0", "cuda:0"


@dataclass(frozen=True)
class BackendInfo:
    name: str
    platform: str
    platform_version: str
    is_default: bool
    devices: tuple[DeviceInfo, ...]


@dataclass(frozen=True)
class FailedBackend:
    name: str
    error: str
    hint: str = ""


@dataclass(frozen=True)
class DeviceReport:
    backends: tuple[BackendInfo, ...]
    failed_backends: tuple[FailedBackend, ...]
    default_backend: str | None
    default_device: str | None
    default_device_source: str
    platforms_requested: str | None
    environment: tuple[settings.EnvVar, ...]
    warnings: tuple[settings.EnvWarning, ...]
    versions: Mapping[str, str]
    plugins: Mapping[str, str]
    schema: str = "jax-device-kit/doctor/1"

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    def backend(self, name: str) -> BackendInfo:
        for b in self.backends:
            if b.name == name:
                return b
        known = ", ".join(self.backend_names) or "none"
        raise KeyError(f"no backend {name!r} in this report (backends: {known})")

    # rendering lives in helpers.report; these are thin forwards
    def to_dict(self) -> dict:
        from helpers import report

        return report.report_to_dict(self)

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping) -> DeviceReport:
        from helpers import report

        return report.report_from_dict(data)

    def __str__(self) -> str:
        from helpers import report

        return report.report_text(self)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython text/plain
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from helpers import report

        return report.report_html(self)


# --- probing ------------------------------------------------------------------------------
def _xla_bridge():
    from jax._src import xla_bridge  # private: the only place failed backends are recorded

    return xla_bridge


def _device_info(d) -> DeviceInfo:
    try:
        kinds = tuple(m.kind for m in d.addressable_memories())
    except Exception:
        kinds = ()
    try:
        default_kind = d.default_memory().kind
    except Exception:
        default_kind = None
    try:
        stats = d.memory_stats()
    except Exception:
        stats = None
    return DeviceInfo(
        id=int(d.id),
        platform=str(d.platform),
        kind=str(d.device_kind),
        process_index=int(d.process_index),
        memory_kinds=kinds,
        default_memory_kind=default_kind,
        memory_stats=MappingProxyType({k: int(v) for k, v in stats.items()})
        if stats
        else NOT_AVAILABLE,
        name=str(d),
    )


def _versions() -> tuple[dict[str, str], dict[str, str]]:
    versions = {"python": _platform.python_version(), "platform": _platform.platform()}
    for dist in ("jax", "jaxlib", "numpy", "safetensors"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = "not installed"
    plugins: dict[str, str] = {}
    pattern = re.compile(r"^(jax[-_](cuda|rocm|plugin|metal|tpu)|libtpu)", re.I)
    for dist in md.distributions():
        name = dist.metadata.get("Name") or ""
        if pattern.match(name):
            plugins[name] = dist.version
    return versions, dict(sorted(plugins.items()))


def _explain_start_failure(err: BaseException, requested: str | None) -> list[FailedBackend]:
    """Turn JAX's backend start failure into named, actionable entries."""
    xb = _xla_bridge()
    text = f"{type(err).__name__}: {err}".strip().rstrip(":")
    if not requested:
        return [FailedBackend("(default)", text, "set JAX_PLATFORMS=cpu to skip a broken plugin")]
    out = []
    factories = set(getattr(xb, "_backend_factories", {}))
    for name in requested.split(","):
        name = name.strip()
        expanded = xb.expand_platform_alias(name) if name else []
        missing = [p for p in expanded if p not in factories]
        hint = ""
        if name in ("cuda", "gpu") or "cuda" in expanded:
            from jax._src import hardware_utils

            visible = hardware_utils.has_visible_nvidia_gpu()
            plugin = "cuda" in factories
            reason = []
            if not visible:
                reason.append("no NVIDIA GPU is visible to this process")
            if not plugin:
                reason.append("no CUDA plugin is installed (jax[cuda12] / jax[cuda13])")
            if reason:
                hint = "; ".join(reason) + ". Unset JAX_PLATFORMS or set JAX_PLATFORMS=cpu."
        elif missing and missing == expanded:
            hint = (
                f"JAX knows no backend {name!r} (known: {', '.join(sorted(factories))}); "
                "fix the spelling in JAX_PLATFORMS or install its plugin"
            )
        out.append(FailedBackend(name or "(empty)", text if text != "AssertionError" else
                                 f"JAX could not start any of JAX_PLATFORMS={requested!r} "
                                 "(AssertionError from jax._src.xla_bridge.backends)", hint))
    return out


def probe() -> DeviceReport:
    """Everything JAX can tell about backends, devices, defaults and settings. Never raises
    for a backend that fails to start: the failure is part of the report."""
    xb = _xla_bridge()
    requested = jax.config.jax_platforms or None
    failed: list[FailedBackend] = []
    clients: Mapping[str, Any] = {}
    try:
        from jax.extend.backend import backends

        clients = backends()
    except Exception as err:  # e.g. JAX_PLATFORMS=cuda without a GPU
        failed.extend(_explain_start_failure(err, requested))

    for name, error in sorted(getattr(xb, "_backend_errors", {}).items()):
        if name == "tpu" and "libtpu" in error:
            hint = "no TPU runtime (libtpu) installed: expected on a machine without a TPU"
        else:
            hint = "JAX skipped it quietly; harmless unless you expected this backend"
        failed.append(FailedBackend(name, error, hint))
    factories = set(getattr(xb, "_backend_factories", {}))
    if clients and "cuda" in factories and "cuda" not in clients and not requested:
        failed.append(FailedBackend("cuda", "CUDA plugin installed but no NVIDIA GPU is visible; "
                                    "JAX skipped it", "check nvidia-smi and CUDA_VISIBLE_DEVICES"))

    default_backend = None
    default_device = None
    if clients:
        try:
            default_backend = xb.default_backend()
            from jax.extend.backend import get_default_device

            default_device = str(get_default_device())
        except Exception as err:  # pragma: no cover - defensive
            failed.append(FailedBackend("(default)", f"{type(err).__name__}: {err}"))
    configured = jax.config.jax_default_device
    if configured is None:
        source = "first device of the default backend"
    else:
        source = f"jax.default_device / jax_default_device is set to {configured!r}"

    backends_info = []
    for name, client in clients.items():
        devices = tuple(_device_info(d) for d in client.devices())
        backends_info.append(BackendInfo(
            name=name,
            platform=str(client.platform),
            platform_version=str(getattr(client, "platform_version", "")),
            is_default=(name == default_backend or client.platform == default_backend),
            devices=devices,
        ))
    versions, plugins = _versions()
    return DeviceReport(
        backends=tuple(backends_info),
        failed_backends=tuple(failed),
        default_backend=default_backend,
        default_device=default_device,
        default_device_source=source,
        platforms_requested=requested,
        environment=settings.read_environment(),
        warnings=settings.check_environment(started_platforms=tuple(clients)),
        versions=MappingProxyType(versions),
        plugins=MappingProxyType(plugins),
    )


def probe_in_child(env: Mapping[str, str | None] | None = None, *, timeout: float = 120
                   ) -> DeviceReport:
    """Run ``python -m helpers doctor --json`` in a fresh process and return its report.

    For settings that JAX reads only at start (``JAX_PLATFORMS``, the ``XLA_*`` allocator
    variables): env maps names to values; ``None`` removes a variable.
    """
    child_env = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            child_env.pop(k, None)
        else:
            child_env[k] = str(v)
    proc = subprocess.run(
        [sys.executable, "-m", "helpers", "doctor", "--json"],
        env=child_env, capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the child doctor exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}"
        )
    return DeviceReport.from_dict(json.loads(proc.stdout))


# --- roles: who plays the accelerator and who plays the host -------------------------------
@dataclass(frozen=True)
class Roles:
    accelerator: Any  # jax.Device
    host: Any  # jax.Device
    stand_in: bool

    def describe(self) -> str:
        if self.stand_in:
            return (
                f"STAND-IN: no accelerator here, so simulated CPU device {self.accelerator} "
                f"(the default device) plays the accelerator and {self.host} plays host memory."
            )
        return (
            f"Real hardware: {self.accelerator} ({self.accelerator.device_kind}) is the "
            f"accelerator and {self.host} is host memory."
        )

    def __str__(self) -> str:
        return self.describe()


def roles() -> Roles:
    """The accelerator and the host: a real GPU/TPU and the CPU when present, else two
    simulated CPU devices (needs ``simulate_cpu_devices(2)`` or more before JAX starts)."""
    if jax.default_backend() != "cpu":
        return Roles(jax.devices()[0], jax.devices("cpu")[0], stand_in=False)
    cpus = jax.devices("cpu")
    if len(cpus) < 2:
        raise JaxAlreadyStartedError(
            "only one CPU device and no accelerator, so there is nothing to stand in for the "
            "accelerator. Restart the kernel and call helpers.devices.simulate_cpu_devices(4) "
            "(or jax.config.update('jax_num_cpu_devices', 4)) before any JAX operation."
        )
    return Roles(cpus[0], cpus[1], stand_in=True)


def simulate_cpu_devices(n: int) -> int:
    """Ask JAX for ``n`` CPU devices (a stand-in for several accelerators).

    Must run before JAX starts its backends. If they already started with at least ``n``
    CPU devices this is a no-op; with fewer, it raises JaxAlreadyStartedError saying how
    to fix it, and changes nothing. Returns the number of CPU devices JAX will have.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"simulate_cpu_devices needs a positive int, got {n!r}")
    if _xla_bridge().backends_are_initialized():
        have = len(jax.devices("cpu"))
        if have >= n:
            return have
        raise JaxAlreadyStartedError(
            f"JAX already started its backends with {have} CPU device(s); it cannot add more "
            f"now. Restart the kernel (or the process) and call simulate_cpu_devices({n}) "
            "before any JAX operation, e.g. in the notebook's first cell."
        )
    jax.config.update("jax_num_cpu_devices", n)
    return n


# --- placement: why one array sits where it does ------------------------------------------
@dataclass(frozen=True)
class Placement:
    kind: str  # "jax.Array" or "numpy.ndarray"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    devices: tuple[str, ...]
    memory_kind: str | None
    committed: bool | None  # None for NumPy arrays
    explanation: str = field(default="")

    def __str__(self) -> str:
        from helpers import report

        return report.placement_text(self)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython text/plain
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from helpers import report

        return report.placement_html(self)


def placement(x) -> Placement:
    """Explain one array: its devices, memory kind, committed or not, bytes, and what that
    means for the next jit call.

    >>> import numpy as np
    >>> placement(np.zeros(4, np.uint16)).nbytes
    8
    """
    if isinstance(x, np.ndarray):
        from jax.extend.backend import get_default_device

        default = get_default_device()
        return Placement(
            kind="numpy.ndarray", shape=tuple(x.shape), dtype=str(x.dtype), nbytes=int(x.nbytes),
            devices=(), memory_kind="host (NumPy)", committed=None,
            explanation=(
                f"a NumPy array in host memory: JAX copies it to the default device "
                f"({default}) every time you pass it to a JAX operation or a jitted function"
            ),
        )
    if not isinstance(x, jax.Array):
        raise TypeError(
            f"placement() explains jax.Array or numpy.ndarray values, got {type(x).__name__}; "
            "convert with jnp.asarray(...) or np.asarray(...) first"
        )
    if x.is_deleted():
        raise ValueError(
            f"this {x.dtype}{list(x.shape)} array has been deleted (or donated to a jit); "
            "it has no placement any more"
        )
    devs = sorted(x.devices(), key=lambda d: (d.platform, d.id))
    names = tuple(str(d) for d in devs)
    where = names[0] if len(names) == 1 else f"{len(names)} devices ({', '.join(names)})"
    if x.committed:
        why = (
            f"committed to {where}: jit runs computations that use it there, and mixing it "
            "with an array committed to another device raises an error instead of moving it"
        )
    else:
        why = (
            f"uncommitted, on {where} (the default device when it was made): a jit with "
            "committed inputs elsewhere will move it there"
        )
    return Placement(
        kind="jax.Array", shape=tuple(x.shape), dtype=str(x.dtype), nbytes=int(x.nbytes),
        devices=names, memory_kind=getattr(x.sharding, "memory_kind", None),
        committed=bool(x.committed), explanation=why,
    )
