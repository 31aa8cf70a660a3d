"""The doctor's report as plain data: backends, devices, defaults, failures, settings, versions.

Frozen dataclasses and their JSON form (``DeviceReport.to_dict``/``from_dict``), with no JAX
import, so a report made in a child process can be read and shown where ``import jax`` fails.
:func:`helpers.devices.probe` fills one; :mod:`helpers.report` renders it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from helpers._display import Display
from helpers.env_rules import EnvWarning
from helpers.errors import BadInputError
from helpers.settings import EnvVar
from helpers.unavailable import NOT_AVAILABLE, NotAvailable

__all__ = ["BackendInfo", "DeviceInfo", "DeviceReport", "FailedBackend"]


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
    memory_stats: Mapping[str, int] | NotAvailable = NOT_AVAILABLE
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
class DeviceReport(Display):
    _renderer = "helpers.report"

    backends: tuple[BackendInfo, ...]
    failed_backends: tuple[FailedBackend, ...]
    default_backend: str | None
    default_device: str | None
    default_device_source: str
    platforms_requested: str | None
    environment: tuple[EnvVar, ...]
    warnings: tuple[EnvWarning, ...]
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

    def to_dict(self) -> dict:
        """The JSON form. Keys are stable within a schema version (README, 'doctor --json')."""
        return _report_to_dict(self)

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping) -> DeviceReport:
        """Inverse of to_dict (for reports made in a child process)."""
        return _report_from_dict(data)


# --- JSON -----------------------------------------------------------------------------------
def _device_dict(d: DeviceInfo) -> dict:
    return {
        "id": d.id,
        "name": d.name,
        "platform": d.platform,
        "kind": d.kind,
        "process_index": d.process_index,
        "memory_kinds": list(d.memory_kinds),
        "default_memory_kind": d.default_memory_kind,
        "memory_stats": dict(d.memory_stats) if d.memory_stats is not NOT_AVAILABLE else None,
    }


def _report_to_dict(r: DeviceReport) -> dict:
    """The JSON form. Keys are stable within a schema version (see README, 'doctor --json')."""
    return {
        "schema": r.schema,
        "default_backend": r.default_backend,
        "default_device": r.default_device,
        "default_device_source": r.default_device_source,
        "platforms_requested": r.platforms_requested,
        "backends": [
            {
                "name": b.name,
                "platform": b.platform,
                "platform_version": b.platform_version,
                "is_default": b.is_default,
                "devices": [_device_dict(d) for d in b.devices],
            }
            for b in r.backends
        ],
        "failed_backends": [
            {"name": f.name, "error": f.error, "hint": f.hint} for f in r.failed_backends
        ],
        "environment": [{"name": e.name, "value": e.value, "meaning": e.meaning}
                        for e in r.environment],
        "warnings": [{"code": w.code, "message": w.message, "fix": w.fix} for w in r.warnings],
        "versions": dict(r.versions),
        "plugins": dict(r.plugins),
    }


def _report_from_dict(data: Mapping) -> DeviceReport:
    """Inverse of report_to_dict (for reports made in a child process)."""
    if not str(data.get("schema", "")).startswith("jax-device-kit/doctor/"):
        raise BadInputError(f"not a doctor report: schema is {data.get('schema')!r}")

    def dev(d: Mapping) -> DeviceInfo:
        stats = d.get("memory_stats")
        return DeviceInfo(
            id=d["id"], platform=d["platform"], kind=d["kind"],
            process_index=d["process_index"], memory_kinds=tuple(d["memory_kinds"]),
            default_memory_kind=d["default_memory_kind"],
            memory_stats=MappingProxyType(dict(stats)) if stats else NOT_AVAILABLE,
            name=d.get("name", ""),
        )

    return DeviceReport(
        backends=tuple(
            BackendInfo(b["name"], b["platform"], b["platform_version"], b["is_default"],
                        tuple(dev(d) for d in b["devices"]))
            for b in data["backends"]
        ),
        failed_backends=tuple(FailedBackend(f["name"], f["error"], f.get("hint", ""))
                              for f in data["failed_backends"]),
        default_backend=data["default_backend"],
        default_device=data["default_device"],
        default_device_source=data["default_device_source"],
        platforms_requested=data["platforms_requested"],
        environment=tuple(EnvVar(e["name"], e["value"], e["meaning"])
                          for e in data["environment"]),
        warnings=tuple(EnvWarning(w["code"], w["message"], w["fix"])
                       for w in data["warnings"]),
        versions=MappingProxyType(dict(data["versions"])),
        plugins=MappingProxyType(dict(data["plugins"])),
        schema=data["schema"],
    )
