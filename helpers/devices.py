"""What backends and devices exist, which one is the default, and what JAX skipped.

Capture only: :func:`probe` returns plain frozen data (:class:`DeviceReport`, defined with its
JSON form in :mod:`helpers.device_report`), rendered as text and HTML by :mod:`helpers.report`.
This module does not import JAX until :func:`probe` runs, so a report from a child process can
be read and shown even where ``import jax`` fails (the doctor).

``placement``, ``roles``, ``simulate_cpu_devices``, ``Placement`` and ``Roles`` live in
:mod:`helpers.placement` and are also reachable from here.

>>> from helpers import devices
>>> report = devices.probe()
>>> report.default_backend in report.backend_names
True
"""

from __future__ import annotations

import importlib.metadata as md
import platform as _platform
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from helpers import _child, _jax_internals, settings
from helpers._jax_internals import device_name  # "cpu:0" in every supported JAX
from helpers.device_report import BackendInfo, DeviceInfo, DeviceReport, FailedBackend
from helpers.errors import JaxAlreadyStartedError
from helpers.unavailable import NOT_AVAILABLE

__all__ = [
    "NOT_AVAILABLE",
    "device_name",
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

if TYPE_CHECKING:  # at run time these come from __getattr__ below, on first use
    from helpers.placement import Placement, Roles, placement, roles, simulate_cpu_devices

_FROM_PLACEMENT = ("Placement", "Roles", "placement", "roles", "simulate_cpu_devices")


def __getattr__(name: str):  # PEP 562: helpers.placement imports JAX, so load it on first use
    if name in _FROM_PLACEMENT:
        from helpers import placement

        return getattr(placement, name)
    raise AttributeError(f"module 'helpers.devices' has no attribute {name!r}")


# --- probing ------------------------------------------------------------------------------
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
        name=_jax_internals.device_name(d),
    )


def versions() -> tuple[dict[str, str], dict[str, str]]:
    """(versions of python, the platform, jax, jaxlib, numpy, safetensors; JAX plugins), read
    from package metadata: works even where ``import jax`` fails."""
    found = {"python": _platform.python_version(), "platform": _platform.platform()}
    for dist in ("jax", "jaxlib", "numpy", "safetensors"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = "not installed"
    plugins: dict[str, str] = {}
    pattern = re.compile(r"^(jax[-_](cuda|rocm|plugin|metal|tpu)|libtpu)", re.I)
    for dist in md.distributions():
        name = dist.metadata.get("Name") or ""
        if pattern.match(name):
            plugins[name] = dist.version
    return found, dict(sorted(plugins.items()))


def _explain_start_failure(err: BaseException, requested: str | None) -> list[FailedBackend]:
    """Turn JAX's backend start failure into named, actionable entries."""
    text = f"{type(err).__name__}: {err}".strip().rstrip(":")
    if not requested:
        return [FailedBackend("(default)", text, "set JAX_PLATFORMS=cpu to skip a broken plugin")]
    out = []
    factories = _jax_internals.backend_factories()
    for name in dict.fromkeys(n.strip() for n in requested.split(",")):  # each name once
        if not name:
            out.append(FailedBackend("(empty)", text, "JAX_PLATFORMS has an empty entry: list "
                                     "platform names separated by commas, e.g. cpu or cuda,cpu"))
            continue
        expanded = _jax_internals.expand_platform_alias(name)
        missing = [p for p in expanded if p not in factories]
        hint = ""
        if name in ("cuda", "gpu") or "cuda" in expanded:
            from helpers import gpu

            reason = []
            if not gpu.gpus():
                reason.append("no NVIDIA GPU is visible to this process")
            if "cuda" not in factories:
                reason.append("no CUDA plugin is installed (jax[cuda12] / jax[cuda13])")
            if reason:
                hint = "; ".join(reason) + ". Unset JAX_PLATFORMS or set JAX_PLATFORMS=cpu."
        elif missing and missing == expanded:
            hint = (
                f"JAX knows no backend {name!r} (known: {', '.join(sorted(factories))}); "
                "fix the spelling in JAX_PLATFORMS or install its plugin"
            )
        out.append(FailedBackend(name, text if text != "AssertionError" else
                                 f"JAX could not start any of JAX_PLATFORMS={requested!r} "
                                 "(an AssertionError inside JAX's backend start)", hint))
    return out


def probe() -> DeviceReport:
    """Everything JAX can tell about backends, devices, defaults and settings, in this process.
    Never raises for a backend that fails to start: the failure is part of the report. (For a
    report that survives JAX failing to import or XLA aborting, see :mod:`helpers.doctor`.)"""
    from helpers import _backend_start

    jax = _backend_start.import_jax()
    from jax.extend.backend import backends, get_default_device

    requested = jax.config.jax_platforms or None
    failed: list[FailedBackend] = []
    clients: Mapping[str, Any] = {}
    try:
        clients = backends()
    except Exception as err:  # e.g. JAX_PLATFORMS=cuda without a GPU
        failed.extend(_explain_start_failure(err, requested))

    for name, error in sorted(_jax_internals.backend_errors().items()):
        if name == "tpu" and "libtpu" in error:
            hint = "no TPU runtime (libtpu) installed: expected on a machine without a TPU"
        else:
            hint = "JAX skipped it quietly; harmless unless you expected this backend"
        failed.append(FailedBackend(name, error, hint))
    factories = _jax_internals.backend_factories()
    if clients and "cuda" in factories and "cuda" not in clients and not requested:
        failed.append(FailedBackend("cuda", "CUDA plugin installed but no NVIDIA GPU is visible; "
                                    "JAX skipped it", "check nvidia-smi and CUDA_VISIBLE_DEVICES"))

    default_backend = None
    default_device = None
    if clients:
        try:
            default_backend = jax.default_backend()
            default_device = _jax_internals.device_name(get_default_device())
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
    found, plugins = versions()
    return DeviceReport(
        backends=tuple(backends_info),
        failed_backends=tuple(failed),
        default_backend=default_backend,
        default_device=default_device,
        default_device_source=source,
        platforms_requested=requested,
        environment=settings.read_environment(),
        warnings=settings.check_environment(started_platforms=tuple(clients)),
        versions=MappingProxyType(found),
        plugins=MappingProxyType(plugins),
    )


def probe_in_child(env: Mapping[str, str | None] | None = None, *, timeout: float = 120
                   ) -> DeviceReport:
    """Run the probe in a fresh process and return its report.

    For settings that JAX reads only at start (``JAX_PLATFORMS``, the ``XLA_*`` allocator
    variables): env maps names to values; ``None`` removes a variable. Raises
    ChildProcessFailed (with the end of the child's stderr) when the child gives no report;
    :func:`helpers.doctor.diagnose` turns that case into a report instead.
    """
    result = _child.run_json("helpers._doctor_child", env=_child.child_env(env),
                             timeout=timeout)
    return DeviceReport.from_dict(result.require("the child doctor"))
