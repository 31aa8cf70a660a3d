"""Why one array sits where it does, and who plays the accelerator on this machine.

:func:`placement` explains one array (its devices, memory kind, committed or not, bytes, and
what that means for the next jit call); for an array over several devices, its sharding and each
device's piece (:class:`Shard`: index, shape, bytes), read from the public
``sharding.addressable_devices_indices_map``. :func:`roles` picks the accelerator and the host
(a real GPU and the CPU, or two simulated CPU devices as a labelled stand-in);
:func:`simulate_cpu_devices` asks JAX for several CPU devices before it starts.

>>> import numpy as np
>>> placement(np.zeros(4, np.uint16)).nbytes
8
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helpers import _backend_start
from helpers._display import Display
from helpers._jax_internals import device_name
from helpers.errors import BadInputError, JaxAlreadyStartedError

# JAX is imported inside the functions (the Placement record must load where JAX cannot).
_jax = _backend_start.import_jax

__all__ = ["Placement", "Roles", "Shard", "placement", "roles", "simulate_cpu_devices"]


# --- roles: who plays the accelerator and who plays the host -------------------------------
@dataclass(frozen=True)
class Roles:
    accelerator: Any  # jax.Device
    host: Any  # jax.Device
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


def roles() -> Roles:
    """The accelerator and the host: a real GPU/TPU and the CPU when present, else two
    simulated CPU devices (needs ``simulate_cpu_devices(2)`` or more before JAX starts)."""
    jax = _jax()

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
    jax = _jax()

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
class Shard:
    """One device's piece of an array: which elements (``index``, e.g. "[0:2, :]"), their
    shape and their bytes on that device."""

    device: str
    index: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Placement(Display):
    _renderer = "helpers.report"

    kind: str  # "jax.Array" or "numpy.ndarray"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    devices: tuple[str, ...]
    memory_kind: str | None
    committed: bool | None  # None for NumPy arrays
    explanation: str = field(default="")
    sharding: str = ""  # "SingleDeviceSharding", "NamedSharding(mesh={'data': 8}, spec=P('data'))"
    shards: tuple[Shard, ...] = ()  # one per addressable device, in device order (NumPy: none)

    @property
    def device_bytes(self) -> int:
        """Bytes on all devices together: ``nbytes`` when sharded, N x ``nbytes`` when
        replicated on N devices (NumPy: 0)."""
        return sum(s.nbytes for s in self.shards)

    @property
    def replicated(self) -> bool:
        """Every one of several devices holds the whole array."""
        return len(self.shards) > 1 and all(s.shape == self.shape for s in self.shards)


def placement(x) -> Placement:
    """Explain one array: its devices, memory kind, committed or not, bytes, and what that
    means for the next jit call."""
    jax = _jax()

    if isinstance(x, np.ndarray):
        from jax.extend.backend import get_default_device

        default = get_default_device()
        return Placement(
            kind="numpy.ndarray", shape=tuple(x.shape), dtype=str(x.dtype), nbytes=int(x.nbytes),
            devices=(), memory_kind="host (NumPy)", committed=None,
            explanation=(
                f"a NumPy array in host memory: JAX copies it to the default device "
                f"({device_name(default)}) every time you pass it to a JAX operation or a "
                "jitted function"
            ),
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
    memory_kind = getattr(x.sharding, "memory_kind", None)
    why += _layout_note(x, shards) + _memory_kind_note(memory_kind)
    return Placement(
        kind="jax.Array", shape=tuple(x.shape), dtype=str(x.dtype), nbytes=int(x.nbytes),
        devices=names, memory_kind=memory_kind, committed=bool(x.committed), explanation=why,
        sharding=_describe_sharding(x.sharding), shards=shards,
    )


def _shards(x) -> tuple[Shard, ...]:
    """Each addressable device's piece of ``x``, from the sharding alone (never through
    ``shard.data``, which would make JAX keep another Array over the same buffer)."""
    itemsize = np.dtype(x.dtype).itemsize
    out = []
    placed = x.sharding.addressable_devices_indices_map(tuple(x.shape))
    for device, index in sorted(placed.items(), key=lambda kv: (kv[0].platform, kv[0].id)):
        index = tuple(index or ()) + (slice(None),) * (x.ndim - len(index or ()))
        parts, shape = [], []
        for sl, dim in zip(index, x.shape, strict=True):
            start, stop, step = sl.indices(dim)
            shape.append(len(range(start, stop, step)))
            parts.append(":" if (start, stop, step) == (0, dim, 1) else f"{start}:{stop}")
        shape_t = tuple(shape)
        out.append(Shard(device_name(device), f"[{', '.join(parts)}]", shape_t,
                         int(np.prod(shape_t, dtype=np.int64)) * itemsize))
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
                f"{len(shards)} x {x.nbytes:,} B = {total:,} B on devices in all")
    return (f". Sharded: each device holds one piece (shapes "
            f"{', '.join(sorted({str(s.shape) for s in shards}))}), {total:,} B on devices in "
            "all; a computation on it runs on all of them, whatever jax.default_device says")


def _memory_kind_note(kind: str | None) -> str:
    if kind in (None, "device"):
        return ""
    return (f". Its bytes are in {kind} memory (host RAM the device can address), not the "
            "device's own: computing with device-memory arrays needs a copy first, "
            "jax.device_put(part, x.sharding.with_memory_kind('device'))")
