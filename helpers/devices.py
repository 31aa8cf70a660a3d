"""What backends and devices exist, which one is the default, what JAX skipped, and where an
array sits.

- :func:`probe` returns the doctor's report (:class:`DeviceReport`, plain frozen data with one
  JSON form); :func:`probe_in_child` runs it in a fresh process under another environment.
- :func:`placement` explains one array: its devices, memory kind, committed or not, bytes, and
  what that means for the next jit call; for an array over several devices, its sharding and
  each device's piece (:class:`Shard`), read from the public
  ``sharding.addressable_devices_indices_map`` (``devices_indices_map`` for an array that spans
  several processes: the other processes' shards are marked, not readable here).
- :func:`process_view` says which process of a multi-process job this is, and which devices are
  its own.
- :func:`resolve` names the device a load or a step would land on ("default", "cpu", "gpu" or a
  device) and why; :func:`start_jax` imports JAX or says why it cannot start.
- :func:`roles` picks the accelerator and the host (a real GPU and the CPU, or two simulated CPU
  devices as a labelled stand-in); :func:`simulate_cpu_devices` asks JAX for several CPU devices
  before it starts.

This module does not import JAX until a function needs it, so a report from a child process can
be read and shown even where ``import jax`` fails (the doctor). Rendering: :mod:`helpers.render`.

>>> report = probe()
>>> report.default_backend in report.backend_names
True
>>> import numpy as np
>>> placement(np.zeros(4, np.uint16)).nbytes
8
"""

from __future__ import annotations

import importlib.metadata as md
import platform as _platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers import placement_notes, settings
from helpers._internal import child, frames, jaxcompat
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record, from_dict
from helpers.errors import (
    BackendError,
    BadInputError,
    ChildProcessFailed,
    JaxAlreadyStartedError,
)
from helpers.placement_notes import LeafPlacement
from helpers.settings import EnvVar, EnvWarning
from helpers.units import NOT_AVAILABLE, NotAvailable

if TYPE_CHECKING:
    import jax

__all__ = ["LAUNCH_VARS", "BackendInfo", "DeviceInfo", "DeviceReport", "FailedBackend",
           "Placement", "ProcessView", "Roles", "Shard", "TreePlacement",
           "default_device", "device_name", "placement", "probe", "probe_in_child",
           "process_view", "resolve", "roles", "sharding_error_fix", "simulate_cpu_devices",
           "start_jax", "tree_placement", "versions"]


# --- the report: plain data -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DeviceInfo(Record):
    """One device as JAX sees it: ids, kind, memory kinds, allocator statistics."""

    id: int
    name: str = ""  # the kit's name for it, e.g. "cpu:0", "cuda:0"
    platform: str
    kind: str
    process_index: int
    memory_kinds: tuple[str, ...]
    default_memory_kind: str | None
    #: allocator statistics (bytes_in_use, peak_bytes_in_use, bytes_limit, ...) or NOT_AVAILABLE
    memory_stats: Mapping[str, int] | NotAvailable = NOT_AVAILABLE


#: The variables that say a process is one of a multi-process job: those JAX's
#: ``jax.distributed.initialize()`` reads (jax/_src/distributed.py: the coordinator and local
#: devices; the process count and id come from arguments or a launcher), and the launchers'
#: it detects without arguments (jax/_src/clusters/)
LAUNCH_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT", "JAX_COORDINATOR_BIND_ADDRESS",
               "JAX_LOCAL_DEVICE_IDS", "SLURM_JOB_ID", "SLURM_NTASKS",
               "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_NODES", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "JOB_COMPLETION_INDEX",
               "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_NUM_SLICES",
               "MEGASCALE_SLICE_ID")


@dataclass(frozen=True)
class ProcessView(Display):
    """This process in its JAX job: which process it is, of how many, the coordinator it
    joined, its own devices (``jax.local_devices()``) against every process's
    (``jax.devices()``), and the launcher's variables found in its environment."""

    distributed: bool  # jax.distributed.initialize() has run in this process
    process_index: int
    process_count: int
    coordinator: str | None
    local_devices: tuple[str, ...]
    devices: tuple[str, ...]  # every process's, this one's included
    launch_environment: Mapping[str, str]
    note: str = ""

    @property
    def other_devices(self) -> tuple[str, ...]:
        """Devices of the other processes: this one cannot read or write their memory."""
        own = set(self.local_devices)
        return tuple(d for d in self.devices if d not in own)


def process_view() -> ProcessView:
    """This process in its multi-process job (:class:`ProcessView`). Starts JAX's backends if
    they have not started, as ``jax.devices()`` does. A process that never called
    ``jax.distributed.initialize()`` is process 0 of 1; if its environment says it was launched
    as one of several (``SLURM_NTASKS=4``, ``JAX_COORDINATOR_ADDRESS``, ...), the note says so."""
    import os

    jax = jaxcompat.import_jax()
    env = {k: os.environ[k] for k in LAUNCH_VARS if os.environ.get(k)}
    up = bool(jax.distributed.is_initialized())
    local = tuple(device_name(d) for d in jax.local_devices())
    every = tuple(device_name(d) for d in jax.devices())
    count = int(jax.process_count())
    note = ""
    launched = {k: env[k] for k in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
                if env.get(k, "").isdigit() and int(env[k]) > 1}
    if "JAX_COORDINATOR_ADDRESS" in env:
        launched["JAX_COORDINATOR_ADDRESS"] = env["JAX_COORDINATOR_ADDRESS"]
    if not up and launched:
        k, v = next(iter(launched.items()))
        note = (f"launched as one of several processes ({k}={v}) but jax.distributed."
                "initialize() has not run here: this process works alone, on its own devices. "
                "Fix: call jax.distributed.initialize() first, before any other JAX call")
    elif up and (fewer := _gpus_narrowed(os.environ)):
        note = fewer
    return ProcessView(up, int(jax.process_index()), count, jaxcompat.distributed_coordinator(),
                       local, every, MappingProxyType(env), note)


def _gpus_narrowed(environ) -> str:
    """Where jax.distributed.initialize() left this process fewer GPUs than its environment
    gives it: JAX's SLURM detection passes local_device_ids=[SLURM_LOCALID], one GPU a process,
    which with one process per node and several GPUs each hides the rest (jax-ml/jax#16788).
    Read from jax_cuda_visible_devices, which JAX sets from local_device_ids, against
    CUDA_VISIBLE_DEVICES or SLURM_GPUS_PER_TASK; "" where nothing was narrowed."""
    chosen = str(jaxcompat.config_global("jax_cuda_visible_devices", "all") or "all")
    if chosen == "all":
        return ""
    ids = [i for i in chosen.split(",") if i.strip()]
    listed = [i for i in (environ.get("CUDA_VISIBLE_DEVICES") or "").split(",") if i.strip()]
    per_task = environ.get("SLURM_GPUS_PER_TASK", "")
    given = max(len(listed), int(per_task) if per_task.isdigit() else 0)
    if not ids or given <= len(ids):
        return ""
    return (f"jax.distributed.initialize() left this process GPU {chosen} "
            f"(jax_cuda_visible_devices) of the {given} its environment gives it: JAX's SLURM "
            "detection passes local_device_ids=[SLURM_LOCALID], one GPU a process, which with "
            "one process per node and several GPUs each hides the rest. Fix: "
            f"jax.distributed.initialize(local_device_ids=range({given})), or set "
            f"JAX_LOCAL_DEVICE_IDS={','.join(map(str, range(given)))} (jax-ml/jax#16788)")


@dataclass(frozen=True)
class BackendInfo(Record):
    """One backend that started: its platform and devices, and whether it is the default."""

    name: str
    platform: str
    platform_version: str
    is_default: bool
    devices: tuple[DeviceInfo, ...]


@dataclass(frozen=True)
class FailedBackend(Record):
    """A backend that did not start (or was skipped): JAX's error and what to do about it."""

    name: str
    error: str
    hint: str = ""


@dataclass(frozen=True, kw_only=True)
class DeviceReport(Display):
    """The doctor's report: backends, devices, defaults, failures, settings and versions. Its
    JSON form (``to_dict``, ``to_json``; ``doctor --json``) has stable keys within a schema."""

    schema: str = "jax-device-kit/doctor/1"
    default_backend: str | None
    default_device: str | None
    default_device_source: str
    platforms_requested: str | None
    backends: tuple[BackendInfo, ...]
    failed_backends: tuple[FailedBackend, ...]
    environment: tuple[EnvVar, ...]
    warnings: tuple[EnvWarning, ...]
    versions: Mapping[str, str]
    plugins: Mapping[str, str]
    #: ``jax.print_environment_info()``'s text, what JAX's issue template asks for ("" where
    #: JAX could not produce it, e.g. when ``import jax`` failed)
    jax_environment_info: str = ""
    #: the process in its multi-process job (None in a report from before this field)
    processes: ProcessView | None = None

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    def backend(self, name: str) -> BackendInfo:
        """The backend called ``name``; KeyError naming the backends there are."""
        for b in self.backends:
            if b.name == name:
                return b
        known = ", ".join(self.backend_names) or "none"
        raise KeyError(f"no backend {name!r} in this report (backends: {known})")

    @classmethod
    def from_dict(cls, data: Mapping) -> DeviceReport:
        """The inverse of ``to_dict`` (for a report made in a child process); BadInputError
        for data that is not a doctor report."""
        if not str(data.get("schema", "")).startswith("jax-device-kit/doctor/"):
            raise BadInputError(f"not a doctor report: schema is {data.get('schema')!r}")
        return from_dict(cls, data)


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
    from helpers.memory import memory_stats  # imports JAX: the probe already has

    stats = memory_stats(d)
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
        name=jaxcompat.device_name(d),
    )


#: libraries whose versions change what a step compiles to (named where installed: the GPU
#: record of 2026-11-27 could not say which Flax its nnx.jit failure came from)
_LIBRARIES = ("flax", "optax", "equinox", "grain")


def versions() -> tuple[dict[str, str], dict[str, str]]:
    """(versions of python, the platform, jax, jaxlib, numpy, safetensors, and of the JAX
    libraries that are installed (flax, optax, equinox, grain); JAX plugins), read from
    package metadata: works even where ``import jax`` fails."""
    found = {"python": _platform.python_version(), "platform": _platform.platform()}
    for dist in ("jax", "jaxlib", "numpy", "safetensors", *_LIBRARIES):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            if dist not in _LIBRARIES:
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
    factories = jaxcompat.backend_factories()
    for name in dict.fromkeys(n.strip() for n in requested.split(",")):  # each name once
        if not name:
            out.append(FailedBackend("(empty)", text, "JAX_PLATFORMS has an empty entry: list "
                                     "platform names separated by commas, e.g. cpu or cuda,cpu"))
            continue
        expanded = jaxcompat.expand_platform_alias(name)
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


#: JAX's CUDA version check, as it words a library older than the one jaxlib was built against
#: (jax/_src/xla_bridge.py in jax 0.4: "Found cuDNN version 8500, but JAX was built against
#: version 8600, which is newer"; jax_plugins/cuda/__init__.py later: "Outdated cuDNN
#: installation found. Version JAX was built against: 91000 ... Installed version: 90100")
_OLDER_LIBRARY = (
    re.compile(r"Found (\w+) version (\d+), but JAX was built against version (\d+)"),
    re.compile(r"Outdated (\w+) installation found\.\s*Version JAX was built against: (\d+)"
               r"[\s\S]*?Installed version: (\d+)"))


def _older_library(error: str) -> tuple[str, str, str] | None:
    """(the library, the version found, the version jaxlib was built against) where JAX
    skipped a GPU backend for a CUDA library older than its own; None otherwise."""
    if m := _OLDER_LIBRARY[0].search(error):
        return m.group(1), m.group(2), m.group(3)
    if m := _OLDER_LIBRARY[1].search(error):
        return m.group(1), m.group(3), m.group(2)
    return None


def _older_library_hint(backend: str, library: str, found: str, built: str) -> str:
    """The cause and the fix of a GPU backend JAX skipped for an older CUDA library: where
    torch or TensorFlow is imported in this process, its own copy loaded first
    (jax-ml/jax#19004, #18032: import torch before JAX's first operation)."""
    import sys

    loaded = [m for m in ("torch", "tensorflow") if m in sys.modules]
    head = (f"JAX did not start its {backend} backend, so no GPU is used: the {library} "
            f"found ({found}) is older than the one jaxlib was built against ({built})")
    source = ("(from JAX's version check, jax_plugins/cuda/__init__.py, and the thread; not "
              "yet run on a GPU)")
    if loaded:
        names = " and ".join(loaded)
        return (f"{head}: {names} is imported in this process, and an older copy of {library} "
                f"it brings was loaded first (jax-ml/jax#19004). Start JAX before importing "
                f"{names} (jax.devices() first), or install versions that agree (a {names} "
                f"built for the same CUDA and {library} as jaxlib) {source}")
    return (f"{head}. Install a {library} at least as new (pip install -U \"jax[cuda12]\", "
            "or cuda13, brings its own), or find the older copy loaded first (LD_LIBRARY_PATH, a "
            f"library imported before JAX) {source}")


def probe() -> DeviceReport:
    """Everything JAX can tell about backends, devices, defaults and settings, in this process.
    Never raises for a backend that fails to start: the failure is part of the report. (For a
    report that survives JAX failing to import or XLA aborting, see :mod:`helpers.doctor`.)"""
    jax = jaxcompat.import_jax()
    from jax.extend.backend import backends, get_default_device

    requested = jax.config.jax_platforms or None
    failed: list[FailedBackend] = []
    clients: Mapping[str, Any] = {}
    try:
        clients = backends()
    except Exception as err:  # e.g. JAX_PLATFORMS=cuda without a GPU
        failed.extend(_explain_start_failure(err, requested))

    for name, error in sorted(jaxcompat.backend_errors().items()):
        if name == "tpu" and "libtpu" in error:
            hint = "no TPU runtime (libtpu) installed: expected on a machine without a TPU"
        elif older := _older_library(error):
            hint = _older_library_hint(name, *older)
        else:
            hint = "JAX skipped it quietly; harmless unless you expected this backend"
        failed.append(FailedBackend(name, error, hint))
    factories = jaxcompat.backend_factories()
    if clients and "cuda" in factories and "cuda" not in clients and not requested:
        failed.append(FailedBackend("cuda", "CUDA plugin installed but no NVIDIA GPU is visible; "
                                    "JAX skipped it", "check nvidia-smi and CUDA_VISIBLE_DEVICES"))

    default_backend = None
    default_device = None
    if clients:
        try:
            default_backend = jax.default_backend()
            default_device = jaxcompat.device_name(get_default_device())
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
    try:
        processes = process_view() if clients else None
    except Exception:  # pragma: no cover - no backend answers: the report says why elsewhere
        processes = None
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
        jax_environment_info=_environment_info(jax) if clients else "",
        processes=processes,
    )


def _environment_info(jax) -> str:
    """``jax.print_environment_info()``'s text (it runs nvidia-smi where there is one)."""
    try:
        return str(jax.print_environment_info(return_string=True))
    except Exception as err:  # pragma: no cover - JAX's own tool failed: say so, go on
        return f"(jax.print_environment_info() failed: {type(err).__name__}: {err})"


def probe_in_child(env: Mapping[str, str | None] | None = None, *, timeout: float = 120
                   ) -> DeviceReport:
    """Run :func:`probe` in a fresh process and return its report.

    For settings that JAX reads only at start (``JAX_PLATFORMS``, the ``XLA_*`` allocator
    variables): env maps names to values; ``None`` removes a variable. Raises
    ChildProcessFailed (with the end of the child's stderr, and the child's result as
    ``err.result``) when the child gives no report; :func:`helpers.doctor.diagnose` turns that
    case into a report instead.
    """
    result = child.run(f"{__name__}:_probe_child", env=child.child_env(env), timeout=timeout)
    data = result.require("the child doctor")
    try:
        return DeviceReport.from_dict(data)
    except Exception as err:  # a report this version cannot read (another schema)
        why = f"the probe's report could not be read ({type(err).__name__}: {err})"
        unread = child.ChildResult(None, result.returncode, f"{result.stderr}\n{why}")
        raise ChildProcessFailed(f"the child doctor: {why}", result=unread) from None


def _probe_child() -> DeviceReport:
    """In the child (:func:`probe_in_child`): import JAX first, so a failing import raises
    JAX's own error here, then probe."""
    import jax  # noqa: F401

    return probe()


# --- roles: who plays the accelerator and who plays the host -------------------------------
@dataclass(frozen=True)
class Roles:
    """Who plays the accelerator and who plays host memory: the real GPU and CPU, or two
    simulated CPU devices (``stand_in``)."""

    accelerator: jax.Device
    host: jax.Device
    stand_in: bool

    def describe(self) -> str:
        if self.stand_in:
            return (
                f"STAND-IN: no accelerator here, so simulated CPU device "
                f"{device_name(self.accelerator)} (the default device) plays the accelerator and "
                f"{device_name(self.host)} plays host memory."
            )
        return (
            f"Real hardware: {device_name(self.accelerator)} ({self.accelerator.device_kind}) is "
            f"the accelerator and {device_name(self.host)} is host memory."
        )

    def __str__(self) -> str:
        return self.describe()


# --- which device: the default, or the one asked for ------------------------------------------
_DOCTOR = "run `python -m helpers doctor` to see why and how to fix it"


def start_jax() -> Any:
    """JAX, imported; :class:`helpers.errors.BackendError` (not a traceback) when this
    environment cannot import it (``JAX_NUM_CPU_DEVICES=abc`` raises inside ``import jax``)."""
    try:
        return jaxcompat.import_jax()
    except Exception as err:
        raise BackendError(f"JAX cannot start here ({type(err).__name__}: {err}); "
                           f"{_DOCTOR}") from None


def default_device() -> jax.Device:
    """Where an operation on uncommitted arrays runs now (``jax.default_device`` included);
    BackendError where JAX cannot start its default backend (``JAX_PLATFORMS=cuda`` without a
    GPU: a bare AssertionError in JAX)."""
    start_jax()
    from jax.extend.backend import get_default_device

    try:
        return get_default_device()
    except Exception as err:
        raise BackendError(f"JAX could not start its default backend "
                           f"({type(err).__name__}: {err}); {_DOCTOR}") from None


def _default_device_now():
    """The default device now; None where JAX cannot say."""
    try:
        return default_device()
    except BackendError:
        return None


def resolve(device: str | jax.Device | None = None) -> tuple[jax.Device, str]:
    """The device ``device`` names (None or "default": the default device; "cpu", "gpu" or
    "cuda", "tpu": that backend's first device; a ``jax.Device`` itself), and why that one.
    BadInputError for a name that is none of these or a backend this machine lacks."""
    jax = start_jax()
    if device is None or (isinstance(device, str) and device.lower() == "default"):
        d = default_device()
        why = ("the default device, set by jax.default_device"
               if jax.config.jax_default_device is not None
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
    raise TypeError(f"device must be None, 'default', 'cpu', 'gpu' or a jax.Device, got "
                    f"{device!r}")


def _backend_names() -> list[str]:
    from jax.extend.backend import backends

    try:
        return sorted(backends())
    except Exception:  # no backend starts at all
        return ["none started"]


def roles() -> Roles:
    """The accelerator and the host: a real GPU/TPU and the CPU when present, else two
    simulated CPU devices (needs ``simulate_cpu_devices(2)`` or more before JAX starts)."""
    jax = jaxcompat.import_jax()

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
        raise BadInputError(f"simulate_cpu_devices needs a positive int, got {n!r}")
    jax = jaxcompat.import_jax()

    try:  # public API: JAX refuses the update with RuntimeError once its backends started
        jax.config.update("jax_num_cpu_devices", n)
        return n
    except RuntimeError:
        pass
    have = len(jax.devices("cpu"))
    if have >= n:
        return have
    raise JaxAlreadyStartedError(
        f"JAX already started its backends with {have} CPU device(s); it cannot add more "
        f"now. Restart the kernel (or the process) and call simulate_cpu_devices({n}) "
        "before any JAX operation, e.g. in the notebook's first cell."
    )


# --- placement: why one array sits where it does ------------------------------------------
@dataclass(frozen=True)
class Shard(Record):
    """One device's piece of an array: which elements (``index``, e.g. "[0:2, :]"), their
    shape and their bytes on that device."""

    device: str
    index: str
    shape: tuple[int, ...]
    nbytes: int
    process_index: int = 0  # the process whose device holds it
    addressable: bool = True  # False: another process's; this one cannot read it


@dataclass(frozen=True)
class Placement(Display):
    """Where one array sits and what that means for the next jit call: devices, memory kind,
    committed or not, sharding and each device's shard."""

    kind: str  # "jax.Array" or "numpy.ndarray"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    devices: tuple[str, ...]
    memory_kind: str | None
    committed: bool | None  # None for NumPy arrays
    explanation: str = field(default="")
    sharding: str = ""  # "SingleDeviceSharding", "NamedSharding(mesh={'data': 8}, spec=P('data'))"
    shards: tuple[Shard, ...] = ()  # one per device, in device order (NumPy: none); in a
    #: multi-process job, other processes' shards too (``addressable=False``)

    @property
    def local_bytes(self) -> int:
        """Bytes in this process's devices (``device_bytes`` less other processes' shards)."""
        return sum(s.nbytes for s in self.shards if s.addressable)

    @property
    def device_bytes(self) -> int:
        """Bytes on all devices together: ``nbytes`` when sharded, N x ``nbytes`` when
        replicated on N devices (NumPy: 0)."""
        return sum(s.nbytes for s in self.shards)

    @property
    def replicated(self) -> bool:
        """Every one of several devices holds the whole array."""
        return len(self.shards) > 1 and all(s.shape == self.shape for s in self.shards)


#: dtypes XLA keeps packed, two or more to a byte: unpacked on the host, so always copied
_SUB_BYTE = ("int2", "uint2", "int4", "uint4", "float4_e2m1fn")


def _numpy_explanation(x: np.ndarray, default: str, on_cpu: bool, jax: Any) -> str:
    """What passing a NumPy array to JAX costs where the default device is ``default``. The
    CPU client uses the array's memory in place where it is C-contiguous, aligned to 64 bytes
    and of a dtype JAX keeps (xla/pjrt/cpu/abstract_cpu_buffer.cc,
    BufferFromHostBufferSupportsZeroCopy; jaxlib's py_values.cc offers every NumPy array for
    zero copy): checked with jax.device_put on jax 0.8.0 and 0.10.2 for aligned float32,
    float16, uint8 and bool (shared), and 4 bytes off, Fortran order, a [::2] view, float64
    and int64 without x64 (copied); five jitted calls on np.asarray of a 64 MiB CPU array
    added 0 MiB, on an array 4 bytes off alignment 64 MiB (jax-ml/jax#40789)."""
    if not on_cpu:
        return (f"a NumPy array in host memory: JAX copies it to the default device ({default}) "
                "every time you pass it to a JAX operation or a jitted function (from XLA's "
                "source, not yet run on a GPU: a host buffer is used in place only where the "
                "client says it can, xla/pjrt/common_pjrt_client.h, as the CPU client does, "
                "and a GPU's memory is not the host's)")
    address = x.__array_interface__["data"][0]
    narrowed = (x.dtype.itemsize == 8 and x.dtype.kind in "fiu" or x.dtype == np.complex128) \
        and not jax.config.jax_enable_x64
    why = ("not C-contiguous (a transposed, Fortran-ordered or strided view)"
           if not x.flags.c_contiguous and x.size > 1 else
           f"at an address {address % 64} bytes past a multiple of 64 (NumPy promises only "
           "16-byte alignment)" if address % 64 else
           f"{x.dtype}, which JAX narrows to 32 bits (jax_enable_x64 is off)" if narrowed else
           f"{x.dtype}, which XLA packs several to a byte" if x.dtype.name in _SUB_BYTE else "")
    if not why:
        version = jax.__version__
        asarray = (f"jnp.asarray(x), though, copies it on this JAX ({version}; jax 0.8.0 "
                   "shares it), so a write after jnp.asarray is not seen"
                   if _asarray_copies(jax) else
                   f"jnp.asarray(x) shares it too on this JAX ({version}; jax 0.10.2 copies it)")
        return (f"a NumPy array in host memory, C-contiguous and aligned to 64 bytes: the "
                f"default device ({default}) is the CPU, which uses it in place, with no copy, "
                "each time you pass it to a JAX operation or a jitted function (jax-ml/jax#40789:"
                " 0 MiB added by five calls on a 64 MiB one), and jax.device_put(x) shares it, "
                + ("though it is read-only (np.asarray or jax.device_get of a jax.Array gives "
                   "such an array: np.array(x) makes a copy you can write, jax-ml/jax#7437); "
                   if not x.flags.writeable else
                   "so writing into it changes what JAX reads (jax-ml/jax#37830); ")
                + f"{asarray}. On a GPU it would be copied every time you pass "
                "it (from XLA's source, xla/pjrt/common_pjrt_client.h; not yet run on a GPU)")
    return (f"a NumPy array in host memory: the default device ({default}) is the CPU, which "
            "uses a C-contiguous array aligned to 64 bytes in place, but this one is "
            f"{why}, so JAX copies it every time you pass it to a JAX operation or a jitted "
            "function (jax-ml/jax#40789: 64 MiB a call for a 64 MiB array 4 bytes off). "
            "jax.device_put(x) once, and pass the result: one copy")


_ASARRAY_COPIES: list[bool] = []  # the answer of :func:`_asarray_copies`, once asked


def _asarray_copies(jax: Any) -> bool:
    """Whether jnp.asarray of a C-contiguous float32 NumPy array aligned to 64 bytes copies it
    on this JAX, asked once of 16 floats: it does on jax 0.10.2 (a write after it is not seen;
    257 MiB more at the peak for a 256 MiB array) and shares it on jax 0.8.0 (0 MiB more),
    where jax.device_put shares it on both (the review of jax-ml/jax#40789's note)."""
    if not _ASARRAY_COPIES:
        raw = np.zeros(16 * 4 + 64, np.uint8)
        start = -raw.ctypes.data % 64
        host = raw[start:start + 64].view(np.float32)
        made = jax.numpy.asarray(host)
        _ASARRAY_COPIES.append(made.unsafe_buffer_pointer() != host.ctypes.data)
    return _ASARRAY_COPIES[0]


def placement(x: jax.Array | np.ndarray) -> Placement:
    """Explain one array: its devices, memory kind, committed or not, bytes, and what that
    means for the next jit call."""
    jax = jaxcompat.import_jax()

    if isinstance(x, np.ndarray):
        from jax.extend.backend import get_default_device

        default = get_default_device()
        return Placement(
            kind="numpy.ndarray", shape=tuple(x.shape), dtype=str(x.dtype), nbytes=int(x.nbytes),
            devices=(), memory_kind="host (NumPy)", committed=None,
            explanation=placement_notes.unsupported_dtype_note(str(x.dtype), x.shape)
            or _numpy_explanation(x, device_name(default),
                                  getattr(default, "platform", "") == "cpu", jax),
        )
    if not isinstance(x, jax.Array):
        raise TypeError(
            f"placement() explains jax.Array or numpy.ndarray values, got {type(x).__name__}; "
            "convert with jnp.asarray(...) or np.asarray(...) first"
        )
    if x.is_deleted():
        raise BadInputError(
            f"this {x.dtype}{list(x.shape)} array has been deleted (or donated to a jit); "
            "it has no placement any more"
        )
    shards = _shards(x)
    names = tuple(s.device for s in shards)
    where = names[0] if len(names) == 1 else f"{len(names)} devices ({', '.join(names)})"
    held_here = any(s.addressable for s in shards)
    if not held_here:  # all of it in other processes of a job
        why = f"on {where}, of another process" + _process_note(x, shards)
    elif x.committed:
        why = (
            f"committed to {where}: jit runs computations that use it there, and mixing it "
            "with an array committed to another device raises an error instead of moving it"
        )
    elif (default := _default_device_now()) is not None and len(names) == 1 and (
            names[0] != device_name(default)):
        here = device_name(default)
        why = (
            f"uncommitted, on {where}, which is not the default device now ({here}): it was "
            f"made while {where} was (under jax.default_device), so an operation on it now "
            f"first copies it whole to {here}. Commit it where it is with "
            f"jax.device_put(x, {where}), or work on it inside that block"
        )
    else:
        why = (
            f"uncommitted, on {where} (the default device when it was made): a jit with "
            "committed inputs elsewhere will move it there"
        )
    memory_kind = getattr(x.sharding, "memory_kind", None)
    if held_here:
        why += _layout_note(x, shards) + _process_note(x, shards) + _mesh_note(x, shards)
    why += _memory_kind_note(memory_kind)
    return Placement(
        kind="jax.Array", shape=tuple(x.shape), dtype=str(x.dtype), nbytes=int(x.nbytes),
        devices=names, memory_kind=memory_kind, committed=bool(x.committed), explanation=why,
        sharding=_describe_sharding(x.sharding), shards=shards,
    )


def _shards(x) -> tuple[Shard, ...]:
    """Each addressable device's piece of ``x``, from the sharding alone (never through
    ``shard.data``, which would make JAX keep another Array over the same buffer)."""
    itemsize = x.dtype.itemsize  # (a typed PRNG key's dtype is no NumPy dtype)
    out = []
    every = x.is_fully_addressable  # one process holds it all: its own devices are all of them
    placed = (x.sharding.addressable_devices_indices_map(tuple(x.shape)) if every else
              x.sharding.devices_indices_map(tuple(x.shape)))
    here = {d.id for d in x.sharding.addressable_devices}
    for device, index in sorted(placed.items(), key=lambda kv: (kv[0].platform, kv[0].id)):
        index = tuple(index or ()) + (slice(None),) * (x.ndim - len(index or ()))
        parts, shape = [], []
        for sl, dim in zip(index, x.shape, strict=True):
            start, stop, step = sl.indices(dim)
            shape.append(len(range(start, stop, step)))
            parts.append(":" if (start, stop, step) == (0, dim, 1) else f"{start}:{stop}")
        shape_t = tuple(shape)
        out.append(Shard(device_name(device), f"[{', '.join(parts)}]", shape_t,
                         int(np.prod(shape_t, dtype=np.int64)) * itemsize,
                         int(device.process_index), device.id in here))
    return tuple(out)


def _describe_sharding(sharding) -> str:
    """A short, version-independent description: the class, and for a NamedSharding its mesh
    and partition spec (jax 0.8 prints ``PartitionSpec(...)`` where 0.10 prints ``P(...)``)."""
    name = type(sharding).__name__
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        return name
    axes = ", ".join(f"{k!r}: {v}" for k, v in dict(mesh.shape).items())
    return f"{name}(mesh={{{axes}}}, spec=P({', '.join(repr(a) for a in spec)}))"


def _layout_note(x, shards: tuple[Shard, ...]) -> str:
    if len(shards) < 2:
        return ""
    total = sum(s.nbytes for s in shards)
    if all(s.shape == tuple(x.shape) for s in shards):
        return (f". Replicated: each of the {len(shards)} devices holds the whole array, "
                f"{len(shards)} x {x.nbytes:,} B = {total:,} B on devices in all"
                + _replication_hint(x))
    return (f". Sharded: each device holds one piece (shapes "
            f"{', '.join(sorted({str(s.shape) for s in shards}))}), {total:,} B on devices in "
            "all; a computation on it runs on all of them, whatever jax.default_device says")


#: an index or slice of a split array taken outside jit comes back replicated (jax 0.8.0 and
#: 0.10.2: x[:1000], x[0] and x[1:7] of a row-split float32[1024, 64] gave P(); inside jit the
#: slice stayed split; yashk2810 in jax-ml/jax#13632: intended, until JAX splits unevenly)
_EAGER_INDEX = (". An index or slice of an array split over the mesh, taken outside jit, comes "
                "back replicated like this: take it inside jax.jit and it stays split "
                "(jax-ml/jax#13632)")


def _replication_hint(x) -> str:
    """For an array replicated over a mesh: what may have kept it from being split. A value that
    ``jax.lax.with_sharding_constraint`` splits unevenly inside jit (a mesh of Auto axes) comes
    back fully replicated when the jit returns it, whatever the annotation (that function's
    docstring; jax 0.8.0 and 0.10.2: P('data', None) on 17 rows over 8 devices gave P();
    jax-ml/jax#26946), where device_put, out_shardings and Explicit axes refuse the uneven split.
    The spec asked for is gone by then, so the hint names the splits that would be uneven."""
    mesh = getattr(x.sharding, "mesh", None)
    axes = {k: v for k, v in dict(getattr(mesh, "shape", {})).items() if v > 1}
    if not axes or not x.ndim:
        return ""
    uneven = [(d, n, k, v) for d, n in enumerate(x.shape) for k, v in axes.items()
              if n >= v and n % v]  # a split that gives every device a piece, but not equal ones
    if not uneven:
        return (". If you meant to split it, name a mesh axis in its PartitionSpec (out_shardings, "
                "jax.device_put or jax.lax.with_sharding_constraint): as it is, its sharding "
                "splits it over no axis of more than one device" + _EAGER_INDEX if any(
                    n >= v and n % v == 0 for n in x.shape for v in axes.values()) else "")
    d, n, k, v = uneven[0]
    return (f". If you meant to split it: dimension {d} ({n}) does not divide over mesh axis "
            f"{k!r} ({v}), and a value jax.lax.with_sharding_constraint splits unevenly inside "
            "jit comes back fully replicated when the jit returns it, whatever the annotation "
            "(inside the jit the split holds, padded; device_put and out_shardings refuse it). "
            f"Fix: pad dimension {d} to a multiple of {v}, e.g. {-(-n // v) * v}, or split a "
            "dimension that divides" + _EAGER_INDEX)


def _process_note(x, shards: tuple[Shard, ...]) -> str:
    if x.is_fully_addressable:
        return ""
    mine = [s for s in shards if s.addressable]
    processes = sorted({s.process_index for s in shards})
    if not mine:
        return (f". None of it is in this process: every shard is on another process's device "
                f"(process {', '.join(map(str, processes))}), which jax.default_device or "
                "device_put named; this process can neither read it nor compute with it. Fix: "
                "name a device of this process, jax.local_devices()")
    readable = ("; each process holds all of it, so it can be read here" if
                x.is_fully_replicated else
                "; np.asarray of it raises here (print shows its shape only). Read this "
                "process's part with x.addressable_shards, or gather the whole array into "
                "every process with jax.experimental.multihost_utils.process_allgather(x)")
    return (f". It spans {len(processes)} processes: this one holds {len(mine)} of its "
            f"{len(shards)} shards ({sum(s.nbytes for s in mine):,} B){readable}")


def _context_mesh():
    """The mesh ``jax.set_mesh`` set for this thread, of more than one device, or None: the
    concrete one where this JAX says (``jax.sharding.get_mesh``, 0.10), else the abstract one
    (0.8.0, where ``jax.sharding.use_abstract_mesh`` alone counts too)."""
    sharding = jaxcompat.import_jax().sharding
    getter = getattr(sharding, "get_mesh", None) or sharding.get_abstract_mesh
    try:
        mesh = getter()
    except Exception:  # no mesh of either kind
        return None
    return mesh if mesh is not None and not mesh.empty and mesh.size > 1 else None


def _mesh_in_use(x, platform: str) -> tuple[str, bool]:
    """A mesh other live arrays of ``platform`` are spread over, described ("{'x': 4}, over
    which other live arrays are split (a float32[8, 4] among them)"), and whether it is
    jax.pmap's own (its outputs' mesh, for an array pmap would take: its first dimension one
    per device; with pmap's own fix, fermiflow/CoulombGas#2); ("", False) where none is."""
    found = ("", False)
    for other in jaxcompat.import_jax().live_arrays(platform):
        if other is x or (spread := placement_notes.split_mesh(other)) is None or not any(
                d % spread.size == 0 for d in x.shape):
            continue
        if jaxcompat.is_pmap_mesh(spread):  # a pmap input: its first dimension, one per device
            if x.shape[0] == spread.size:
                return (f"jax.pmap's {spread.size} devices, over which other live arrays are "
                        f"split (a {other.dtype}{list(other.shape)} among them)", True)
        elif not found[0]:
            found = (f"{dict(spread.shape)}, over which other live arrays are split "
                     f"(a {other.dtype}{list(other.shape)} among them)", False)
    return found


def _mesh_note(x, shards: tuple[Shard, ...]) -> str:
    """For an array whole on one device where a mesh is in use: under ``jax.set_mesh``, what
    an operation on it does there (committed: it raises; uncommitted: its result is copied
    whole onto every device of the mesh); beside arrays split over a mesh, how to have it made
    split (jax#24332: jnp.meshgrid of arrays made on one device keeps its outputs there).
    Checked on simulated CPU devices, jax 0.8.0 and 0.10.2."""
    if len(shards) != 1:
        return ""
    if (context := _context_mesh()) is not None:
        mesh = dict(context.shape)
        if x.committed:
            return (f". A mesh is set by jax.set_mesh ({mesh}) and this array is committed to "
                    f"{shards[0].device} alone: inside that block any operation on it, jitted "
                    "or not, raises \"Received incompatible devices ... jit's context mesh\" "
                    "(`with mesh:` inside it does not undo it). Read it on the host "
                    "(np.asarray(x)), put it on the mesh (jax.device_put(x, NamedSharding(mesh, "
                    "P())), replicated), or use it outside the jax.set_mesh block")
        return (f". A mesh is set by jax.set_mesh ({mesh}): an operation on this uncommitted "
                "array inside that block runs over the whole mesh and returns its result "
                f"whole on each of the {context.size} devices ({context.size} x its bytes). "
                f"Split it first (jax.device_put(x, NamedSharding(mesh, "
                f"P({context.axis_names[0]!r})))), or compute outside the block")
    if x.ndim == 0:
        return ""
    platform = next(iter(x.sharding.device_set)).platform
    jax = jaxcompat.import_jax()
    if len(jax.devices(platform)) < 2:
        return ""
    mesh_text, pmapped = _mesh_in_use(x, platform)
    if not mesh_text:
        return ""
    if pmapped and x.committed:
        return (f". jax.pmap is in use ({mesh_text}), but this array is whole on "
                f"{shards[0].device} and committed there, all {x.nbytes:,} B: a pmap refuses "
                "it (a ValueError: \"Sharding passed to jit does not match\" on jax 0.10.2, "
                "\"incompatible devices\" on 0.8.0). jax.device_put(x, device) of a pmap's "
                "output gathers its pieces onto that device and commits it there "
                "(pyro-ppl/numpyro#696, jax-ml/jax#3597): pass the "
                "pmap's output to the next pmap as it is, split already, and read it on the "
                "host (np.asarray(x)) where you need it whole")
    if pmapped:
        return (f". jax.pmap is in use ({mesh_text}), but this array is whole on "
                f"{shards[0].device}, all {x.nbytes:,} B on that one device: passed to a pmap, "
                "it is split over its devices at each call, each piece copied from there. Make "
                "it under jax.pmap, each device making its own part (jax.pmap(lambda _: "
                "make())(jnp.zeros(jax.local_device_count())), fermiflow/CoulombGas#2); and if "
                "it stacks one copy per device of a value each device needs whole, pass that "
                "value once with in_axes=None instead")
    return (f". A mesh is in use ({mesh_text}), but this array is whole on {shards[0].device}, "
            f"all {x.nbytes:,} B on that one device: an operation on arrays that sit on one "
            "device (jnp.linspace, then jnp.meshgrid of it) makes its result there too. To have "
            "it split from the start, make it inside a jit that names the split: "
            "jax.jit(make, out_shardings=NamedSharding(mesh, P(...))); "
            "jax.device_put(x, NamedSharding(mesh, P(...))) splits it only after one device "
            "has held it whole. Data loaded or unpickled (which keeps no device: jax-ml/jax#12253) "
            "is not made by a jit: keep it on the host as NumPy and device_put that straight "
            "onto the sharding (vllm-project/tpu-inference#1989)")


def _memory_kind_note(kind: str | None) -> str:
    if kind in (None, "device"):
        return ""
    return (f". Its bytes are in {kind} memory (host RAM the device can address), not the "
            "device's own: computing with device-memory arrays needs a copy first, "
            "jax.device_put(part, x.sharding.with_memory_kind('device'))")


# --- placement of a pytree: where every leaf of a params dict or an optimizer state sits -----
@dataclass(frozen=True)
class TreePlacement(Display):
    """Where every leaf of a pytree sits, bytes per place, and what would go wrong in a jit
    over the whole tree, with the fix (``problems``: one or two sentences each)."""

    leaves: tuple[LeafPlacement, ...]
    bytes_by_place: Mapping[str, int]  # "cpu:0", "cuda:0 (pinned_host)", "host (NumPy)"
    problems: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of all leaves (each device's copy of a replicated leaf counted once)."""
        return sum(leaf.nbytes for leaf in self.leaves)


def tree_placement(tree: Any) -> TreePlacement:
    """Explain a pytree (a params dict, an optimizer state, a Flax NNX state): one row per leaf
    (device, memory kind, committed, bytes), bytes per place, and the problems a jit over the
    whole tree would meet: leaves wholly on another process's devices (a library's
    jax.devices()[0] in a job: pytorch/xla#8667), committed leaves on different devices (it
    raises), NumPy leaves
    (copied on every call), a batch-shaped leaf whole on one device beside leaves on a mesh
    (copied whole to every device), host-memory leaves mixed with device ones, deleted leaves,
    and leaves that hold one copy per device as a state replicated for jax.pmap does (laid out
    by jax.pmap itself, not over a mesh of the user's; a save writes every copy; checked by
    one small jitted checksum per device, the kit's own compile)."""
    jax = jaxcompat.import_jax()
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    leaves = tuple(_leaf(jax.tree_util.keystr(path) or "(root)", leaf, jax)
                   for path, leaf in flat)
    places: dict[str, int] = {}
    for leaf in leaves:
        where = _place(leaf)
        places[where] = places.get(where, 0) + leaf.nbytes
    problems = placement_notes.problems(
        leaves, [leaf for _, leaf in flat], tuple(tuple(path) for path, _ in flat),
        context_mesh=_context_mesh(), default_device=lambda: device_name(default_device()))
    return TreePlacement(leaves, MappingProxyType(places), problems)


def _leaf(path: str, x: Any, jax) -> LeafPlacement:
    if isinstance(x, jax.Array):
        if x.is_deleted():
            return LeafPlacement(path, "jax.Array", tuple(x.shape), str(x.dtype), 0, (), None,
                                 None, deleted=True)
        shards = _shards(x)
        names = tuple(s.device for s in shards)
        mesh = getattr(x.sharding, "mesh", None)
        try:
            order = tuple(device_name(d) for d in mesh.devices.flat) if mesh is not None else ()
        except Exception:  # an abstract mesh: no devices of its own
            order = ()
        axes = () if mesh is None or jaxcompat.is_pmap_mesh(mesh) else tuple(
            (str(k), int(v)) for k, v in dict(mesh.shape).items())
        held = sum(s.nbytes for s in shards if s.addressable)  # this process's memory
        return LeafPlacement(path, "jax.Array", tuple(x.shape), str(x.dtype), int(x.nbytes),
                             names, getattr(x.sharding, "memory_kind", None),
                             bool(x.committed), mesh_order=order, local_bytes=held,
                             mesh_axes=axes,
                             replicated=bool(x.sharding.is_fully_replicated))
    if isinstance(x, np.ndarray):
        return LeafPlacement(path, "numpy.ndarray", tuple(x.shape), str(x.dtype),
                             int(x.nbytes), (), None, None)
    if hasattr(x, "__dlpack__"):  # another framework's tensor (torch.Tensor): JAX refuses it
        try:
            shape = tuple(int(d) for d in getattr(x, "shape", ()))
        except (TypeError, ValueError):
            shape = ()
        return LeafPlacement(path, placement_notes.foreign_kind(type(x)), shape,
                             str(getattr(x, "dtype", "")), int(getattr(x, "nbytes", 0) or 0),
                             (), None, None, foreign=True)
    # a Python number (weakly typed to JAX, passed anew on every call) or another object
    return LeafPlacement(path, type(x).__name__, (), "", 0, (), None, None)


def _place(leaf: LeafPlacement) -> str:
    if leaf.deleted:
        return "deleted"
    if not leaf.devices:
        return ("host (NumPy)" if leaf.kind == "numpy.ndarray" else
                "another framework" if leaf.foreign else "Python values")
    where = ", ".join(leaf.devices)
    kind = leaf.memory_kind
    return where if kind in (None, "device") else f"{where} ({kind})"



# --- sharding errors: the cause and the fix ---------------------------------------------------
#: a dimension its sharding does not divide: jax 0.10 ("axis 0 is partitioned 4 times, but the
#: dimension size is 19"; on a mesh of Explicit axes "... but does not evenly divide the
#: dimension size 19") and jax 0.8 ("dimension 0 should be divisible by 4, but it is equal
#: to 19"); the groups: the dimension, the number of pieces, its size
_INDIVISIBLE = (re.compile(r"axis (\d+) is partitioned (\d+) times, but (?:the dimension size "
                           r"is|does not evenly divide the dimension size) (\d+)"),
                re.compile(r"dimension (\d+) should be divisible by (\d+), but it is equal to "
                           r"(\d+)"))
#: what JAX raises where a mesh's axes are Explicit (jax.make_mesh's default from jax 0.9) and a
#: program changes or mixes shardings without saying so (jax 0.10.2's texts)
_EXPLICIT = ("can only refer to Auto axes", "All operands should have the same sharding")
#: an ``.at[...]`` update on a mesh of Explicit axes whose operand and updates are split
#: differently (jax 0.10.2 and 0.12's text); the groups: the operand's and the updates' types
_SCATTER_OUT = re.compile(r"\(out_sharding=\)`? to provide output PartitionSpec for the scatter "
                          r"update.*?operand=ShapedArray\(\w+\[([^\]]*)\]\).*?"
                          r"updates=ShapedArray\(\w+\[([^\]]*)\]\)", re.S)
#: shard_map on a mesh of Explicit axes from jax 0.9 (jax 0.10.2's text): an argument whose
#: sharding is not its in_spec; the groups: the in_spec, the argument's spec, its type
_IN_SPECS = re.compile(r"in_specs passed to shard_map: (P\(.*?\)) does not match the specs of "
                       r"the input: (P\(.*?\)) for arg: (\S+?)\.?(?:\s|$)")
#: inside shard_map, a sharding made on the outer mesh, where the axes shard_map made Manual are
#: still Auto (jax 0.10.2: "`manual_axis_type` field", jax 0.8.0: "`vma` field"); the groups:
#: 0.10.2's axes, 0.8.0's one axis
_OUTER_MESH = re.compile(r"Axes mentioned in `(?:manual_axis_type|vma)` field of ShapedArray "
                         r"should be of type `Manual`(?:.*?varying=frozenset\(\{([^}]*)\}\)"
                         r"|.*?Got axis: (\S+) of type)?", re.S)
#: a PartitionSpec inside shard_map that names an axis shard_map made Manual: before jax 0.8
#: ("contains a manual axes", NVIDIA/TransformerEngine#2069's text), and jax 0.10.2's bare P(...)
#: ("can only refer to Auto axes ... axis_types=(Manual, Auto)"); the groups: spec, mesh, types
_MANUAL_IN_SPEC = (re.compile(r"pspec (.*?) contains a manual axes (.*?) of mesh", re.S),
                   re.compile(r"can only refer to Auto axes of the mesh\. Got spec=(P\(.*?\)) "
                              r"and mesh=AbstractMesh\((.*?)axis_types=\(([^)]*)\)", re.S))


#: jit's "Received incompatible devices for jitted computation" (jax/_src/stages.py's
#: ``_device_assignment_mismatch_error``): each argument it names, with its devices ("and device
#: ids" in jax 0.8.0, "and with device ids" from 0.10); the groups: name, shape, device ids
_INCOMPATIBLE_ARG = re.compile(r"argument (\S*) of \S+ with shape (\S+) and (?:with )?device "
                               r"ids \[([\d, ]*)\]")


def _incompatible_devices_fix(text: str) -> str:
    """The cause and the fix of jit's "Received incompatible devices" between two arguments
    (Physical-Intelligence/openpi#261: an image batch committed to device 0 beside parameters
    split over the mesh); "" for any other error."""
    if "Received incompatible devices for jitted computation" not in text:
        return ""
    args = _INCOMPATIBLE_ARG.findall(text)
    if len(args) != 2:
        return ""
    (_, a, a_ids), (_, b, b_ids) = placed = [
        (n or "an argument", f"{n or 'an argument'} ({shape})",
         [int(i) for i in ids.split(",") if i.strip()]) for n, shape, ids in args]
    if sorted(a_ids) == sorted(b_ids):
        return (f"{a} and {b} are on the same devices {sorted(a_ids)} but through meshes of "
                f"different device orders ({a_ids} and {b_ids}): jit takes them as different "
                "places. Build every sharding from one Mesh (NamedSharding(x.sharding.mesh, "
                "spec)).")
    (name, one, one_ids), (_, many, many_ids) = sorted(placed, key=lambda t: len(t[2]))
    if len(one_ids) == 1 and len(many_ids) > 1:
        return (f"{one} is committed to device {one_ids[0]} alone (jax.device_put to one "
                f"device, or made from arrays that were), and {many} is split over devices "
                f"{many_ids}; jit runs on one set of devices and never moves a committed "
                f"array. Put {name} on the other's mesh first, "
                "jax.device_put(x, NamedSharding(mesh, P())) replicated or split along its "
                "batch axis, or leave it uncommitted (jnp.asarray of the host data, or "
                "device_put without a device), which jit then places itself. "
                "devices.tree_placement(arguments) lists every leaf's devices.")
    return (f"{a} is on devices {a_ids} and {b} on devices {b_ids}: jit runs on one set of "
            "devices and never moves a committed array. Put one where the other is first, "
            "jax.device_put(x, y.sharding), or leave it uncommitted (no device given), which jit "
            "then places itself. devices.tree_placement(arguments) lists every leaf's devices.")


def sharding_error_fix(error: BaseException | str) -> str:
    """The cause and the fix, in a sentence or two, for an error JAX raises where a sharding
    cannot take an array: a dimension its mesh axes do not divide (the last, short batch of an
    epoch: Physical-Intelligence/openpi#437, jax-ml/jax#27808), or shardings changed or mixed on
    a mesh of Explicit axes, jax.make_mesh's default from jax 0.9 (vllm-project/
    tpu-inference#1917), where shard_map no longer moves an argument to its in_spec
    (sgl-project/sglang-jax#1286); a sharding inside shard_map that meets the axes shard_map
    made Manual (NVIDIA/TransformerEngine#2069); two arguments of a jit on different devices
    ("Received incompatible devices": Physical-Intelligence/openpi#261). "" for any other
    error, and for one a jax.pmap's own call raised: pmap splits axis 0 of every argument over
    its devices, one slice each, so padding to a multiple is no fix there (``%load_ext
    helpers`` names the pmap's; huggingface/diffusers#880 in a new user's trial)."""
    text = str(error)
    if fix := _incompatible_devices_fix(text):
        return fix
    if isinstance(error, BaseException) and frames.raised_by(error, "jax/_src/pmap.py"):
        return ""  # (pmap's own call raised it)
    for pattern in _INDIVISIBLE:
        if m := pattern.search(text):
            axis, pieces, size = (int(g) for g in m.groups())
            padded = -(-size // pieces) * pieces
            return (f"dimension {axis} ({size}) is split into {pieces} pieces by its sharding, "
                    f"and {pieces} does not divide {size}: the pieces must be equal. "
                    f"Make that dimension a multiple of {pieces} (the last, short batch of an "
                    "epoch: pad it to the full batch size and mask the padding, so every batch "
                    "has one shape and the step compiles once (huggingface/transformers#17863), "
                    f"or drop it; if you pad it to {padded}, the smallest multiple, the step "
                    f"compiles again for that shape), or leave it unsplit (None at place {axis} "
                    "of the PartitionSpec).")
    if m := _IN_SPECS.search(text):
        wanted, held, arg = m.groups()
        return (f"shard_map's in_spec {wanted} is not the sharding the argument {arg} has "
                f"({held}): on a mesh of Explicit axes (jax.make_mesh's default from jax 0.9) "
                "shard_map no longer moves its inputs (sgl-project/sglang-jax#1286). Put the "
                f"argument there first, jax.device_put(x, NamedSharding(mesh, {wanted})) or "
                f"jax.sharding.reshard(x, NamedSharding(mesh, {wanted})), or make the mesh "
                "with axis_types=(jax.sharding.AxisType.Auto,) * len(axis_names), where "
                "shard_map moves it.")
    if fix := _manual_axes_fix(text):
        return fix
    if _UNPROVEN_REPLICATION in text:
        names = _replicated_axes(text)
        axes = ", ".join(repr(n) for n in names) or "the axes out_specs leave out"
        lax = jaxcompat.import_jax().lax
        over = (repr(names[0]) if len(names) == 1 else "(" + ", ".join(map(repr, names)) + ")"
                ) if names else "axis"
        invariant = (f"jax.lax.all_gather_invariant(x, {over}, tiled=True)"
                     if hasattr(lax, "all_gather_invariant") else
                     f"jax.lax.all_gather(x, {over}, tiled=True, to='invarying')")
        return (f"shard_map's out_specs leave out mesh ax{'is' if len(names) == 1 else 'es'} "
                f"{axes}, which says each device returns the same value over "
                f"{'it' if len(names) == 1 else 'them'}, and JAX cannot prove that from the "
                "body: a value computed from each device's own piece differs per device. A "
                f"sum or mean of the pieces needs jax.lax.psum(x, {over}) or "
                f"jax.lax.pmean(x, {over}) in the body (without it each device returns its "
                "own partial value: check_vma=False then gives a wrong result); a gathered "
                f"array needs {invariant}, whose result JAX knows is the same everywhere, or "
                "the axis kept in out_specs with no gather (the result is the whole array all "
                "the same). check_vma=False only where you know the value is the same "
                "(accelerator-microbenchmarks#25).")
    if m := _SCATTER_OUT.search(text):
        operand, updates = (_spec_of(t) for t in m.groups())
        return (f"on a mesh of Explicit axes the result of an .at[...] update takes its "
                f"sharding from its operands, and here they disagree: the array updated is split "
                f"{operand}, the updates {updates}. Say which one it keeps: "
                f"x.at[i].set(v, out_sharding={operand}), the array's own (checked on 4 CPU "
                f"devices, jax 0.10.2: no collective), or make the mesh with "
                f"axis_types=(jax.sharding.AxisType.Auto,) * len(axis_names), where XLA "
                f"chooses.")
    if any(s in text for s in _EXPLICIT):
        return ("the mesh's axes are Explicit (jax.make_mesh makes them so from jax 0.9): there "
                "a sharding changes only where the program says so, with "
                "jax.sharding.reshard(x, P(...)) in place of with_sharding_constraint, and the "
                "operands of one operation must agree (reshard one to the other's sharding). "
                "Or make the mesh with axis_types=(jax.sharding.AxisType.Auto,) * "
                "len(axis_names) for the behaviour before 0.9.")
    return ""


#: shard_map's words for out_specs that replicate a value it cannot prove the same on each
#: device (jax/_src/shard_map.py, _check_reps / the vma check)
_UNPROVEN_REPLICATION = "which require replication which can't be statically inferred"


def _replicated_axes(text: str) -> list[str]:
    """The mesh axes shard_map's replication check names ("replicated across mesh axis 'x'",
    or "only varying across mesh axes {} and not {data,model}"); [] where it names none."""
    if m := re.search(r"replicated across mesh ax[ie]s (.+?), but", text):
        return _quoted(m.group(1))
    if m := re.search(r"and not \{([^}]*)\}", text):
        return [a.strip().strip("'") for a in m.group(1).split(",") if a.strip()]
    return []


def _spec_of(dims: str) -> str:
    """The PartitionSpec of JAX's type text of an array's dimensions on a mesh of Explicit axes
    ("2048@x,2048@(y,z),16" -> "P('x', ('y', 'z'), None)")."""
    spec = []
    for _, axes in re.findall(r"(\d+)(?:@(\([^)]*\)|\w+))?", dims):
        names = [a.strip() for a in axes.strip("()").split(",") if a.strip()]
        spec.append("None" if not names else repr(names[0]) if len(names) == 1 and
                    not axes.startswith("(") else "(" + ", ".join(map(repr, names)) + ")")
    return f"P({', '.join(spec)})"


def _quoted(text: str) -> list[str]:
    """The names in quotes in a piece of JAX's message, in order, each once."""
    return list(dict.fromkeys(re.findall(r"'([^']+)'", text)))


def _manual_axes_fix(text: str) -> str:
    """The note for a sharding inside shard_map that meets the axes shard_map made Manual
    (NVIDIA/TransformerEngine#2069); "" for any other error."""
    if m := _OUTER_MESH.search(text):
        axes = sorted(_quoted(m.group(1) or "")) or ([m.group(2)] if m.group(2) else [])
        named = f" (here {', '.join(repr(a) for a in axes)})" if axes else ""
        return ("inside shard_map the mesh axes it splits over" + named + " are Manual (each "
                "device holds its own block), but a sharding made on the outer mesh, such as "
                "with_sharding_constraint(x, NamedSharding(mesh, P(...))), calls them Auto "
                "(NVIDIA/TransformerEngine#2069). Delete the constraint, or constrain only axes "
                "outside shard_map's axis_names with a bare PartitionSpec, "
                "with_sharding_constraint(x, P(None, 'other_axis')), which takes the mesh "
                "inside shard_map.")
    for pattern in _MANUAL_IN_SPEC:
        if not (m := pattern.search(text)):
            continue
        if len(m.groups()) == 2:  # before jax 0.8: the Manual axes are listed
            axes = [a for a in _quoted(m.group(1)) if a in _quoted(m.group(2))]
        else:  # jax 0.10.2: the spec's axes that the mesh's axis_types call Manual
            types = dict(zip(re.findall(r"'([^']+)': \d+", m.group(2)),
                             (t.strip() for t in m.group(3).split(",")), strict=False))
            axes = [a for a in _quoted(m.group(1)) if types.get(a) == "Manual"]
        if axes:
            return (f"a PartitionSpec inside shard_map ({m.group(1)}) names "
                    f"{', '.join(repr(a) for a in axes)}, which shard_map made Manual: each "
                    "device holds its own block there (NVIDIA/TransformerEngine#2069). Drop "
                    "those axes from the PartitionSpec, keeping only axes outside shard_map's "
                    "axis_names, or delete the constraint where none is left.")
    return ""
