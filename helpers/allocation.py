"""What JAX's GPU allocator settings do, each run in a fresh child process.

The settings are environment variables JAX reads once, when its GPU backend starts, so the only
honest way to compare them is one fresh process per setting:

- :func:`plugin_options` asks jaxlib which options it *would* pass to the CUDA client for an
  environment (pure Python in jaxlib: runs on any machine, GPU or not, including the error when
  both memory-fraction variables are set);
- :func:`measure` starts JAX on the GPU under an environment, allocates ``array_bytes``, and
  reports the allocator's counters and what the driver (nvidia-smi) says the process uses;
- :func:`measure_together` runs two such processes on one GPU at the same time;
- :func:`predict` applies XLA's rules to jaxlib's options: the pool's cap, what is taken up front,
  and what ``memory_stats()["bytes_limit"]`` will say, for a GPU of any size (runs anywhere).

``measure`` and ``measure_together`` need an NVIDIA GPU; without one they raise
:class:`NoGpuError` saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from helpers import gpu
from helpers._internal import child, jaxcompat
from helpers._internal.jaxcompat import ALLOCATOR_VARS, DEFAULT_MEM_FRACTION
from helpers._internal.records import Display, Record
from helpers.errors import BadInputError, ChildProcessFailed, NoGpuError, SizeError
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes, parse_size

__all__ = ["CARDS", "AllocatorMeasurement", "Card", "PoolPrediction", "SETTINGS", "STORY",
           "Target", "card", "measure", "measure_together", "plugin_options", "predict",
           "story_table", "target"]

#: The settings notebook 06 compares: name -> environment (None removes a variable).
SETTINGS = {
    "default": {},
    "PREALLOCATE=false": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "MEM_FRACTION=0.25": {"XLA_CLIENT_MEM_FRACTION": "0.25"},
    "MEM_FRACTION=0.9": {"XLA_CLIENT_MEM_FRACTION": "0.9"},
    "ALLOCATOR=platform": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
    "ALLOCATOR=cuda_async": {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"},
}
#: The story: 10,248,871,837 uint16 tokens (19.09 GiB) loaded onto a 24 GiB RTX 3090.
STORY = {"request_bytes": 2 * 10_248_871_837, "gpu_total_bytes": 24 * 2**30,
         "gpu": "RTX 3090 (24 GiB)"}


def _env(overrides: dict) -> dict:
    return child.child_env(overrides, drop=(*ALLOCATOR_VARS, "JAX_PLATFORMS"))


def plugin_options(env: dict) -> dict:
    """The options jaxlib would hand the CUDA client under ``env`` (added to a clean copy of this
    process's environment), as ``{"options": {...}}`` or ``{"error": "ValueError: ..."}``.
    Reads only environment variables: no GPU needed, nothing allocated."""
    result = child.run(f"{__name__}:_options_child", env=_env(env), timeout=120)
    return result.require("asking jaxlib for its GPU options")


def _options_child() -> dict:
    """In the child of :func:`plugin_options`: jaxlib's GPU options for this environment."""
    try:
        generate = jaxcompat.verify("generate_pjrt_gpu_plugin_options")
        return {"options": dict(generate())}
    except Exception as err:  # e.g. both memory-fraction variables set: jaxlib's ValueError
        return {"error": f"{type(err).__name__}: {err}"}


# --- XLA's rules, applied to jaxlib's options ----------------------------------------------
# Read from XLA's source at the revision jax 0.11 pins (and checked unchanged at jax 0.10.2's):
#   xla/pjrt/plugin/xla_gpu/xla_gpu_allocator_config.h  GpuAllocatorConfig: memory_fraction =
#       0.75, preallocate = true
#   xla/pjrt/gpu/gpu_helpers.cc  CreateBFCAllocator: allocator_memory = total_memory *
#       memory_fraction, rounded up to 2 MiB, whatever `preallocate` says; preallocate only sets
#       BFC's allow_growth (and the log line: "XLA backend allocating ..." vs "... will use up
#       to ...")
#   xla/tsl/framework/bfc_allocator.cc  stats_.bytes_limit = that limit, set once; without
#       growth the first region is the whole limit (backpedalling by 0.9 when the driver has less)
#   xla/pjrt/gpu/se_gpu_pjrt_client.cc  platform: no pool, no XLA limit, memory_stats() None;
#       cuda_async: the device's default CUDA mempool (no hard cap); the fraction is only what it
#       reserves up front when preallocating, which is also its bytes_limit (0 otherwise)
# Run on an H100 (docs/gpu-runs/2026-11-22-nvidia-h100-80gb-hbm3.md): every measured bytes_limit
# within 0.6% of these (XLA's total is CUDA's, about 0.5 GB below nvidia-smi's); notebook 06 and
# the gpu-marked tests compare them with measurements on any GPU.
_ROUND = 2 * 2**20


@dataclass(frozen=True)
class PoolPrediction(Display):
    """What XLA builds from jaxlib's allocator options on a GPU of a given size: the pool's
    cap, what is taken up front, and what ``memory_stats()["bytes_limit"]`` will say."""

    allocator: str  # "bfc" (what "default" means), "platform", "cuda_async"
    fraction: float
    preallocate: bool
    cap_bytes: int | None  # the most the allocator will hand out; None: no XLA cap (the card)
    upfront_bytes: int  # taken from the driver at the first allocation
    reported_limit: int | None  # memory_stats()["bytes_limit"]; None: memory_stats() is None
    note: str

    def fits(self, request_bytes: int, total_bytes: int) -> bool:
        """Whether one allocation of ``request_bytes`` fits under the cap (the card's total
        where XLA sets none; the CUDA context's few hundred MiB are not counted)."""
        return request_bytes <= (total_bytes if self.cap_bytes is None else self.cap_bytes)


def _round_up(n: float) -> int:
    return int(-(-int(n) // _ROUND) * _ROUND)


def predict(options: dict, total_bytes: int) -> PoolPrediction:
    """What XLA builds from jaxlib's ``options`` (``plugin_options(env)["options"]``) on a GPU
    of ``total_bytes``. Raises BadInputError (a ValueError) for a fraction outside (0, 1], for
    an allocator whose rules the kit does not model, and for plugin_options' whole answer
    (``{"options": ...}``), whose settings it would otherwise miss (a new user's trial)."""
    if "options" in options or "error" in options:  # plugin_options' answer itself
        raise BadInputError(
            "predict takes the options inside plugin_options' answer, "
            "plugin_options(env)['options'], not the answer itself"
            + (f" (here jaxlib refused the settings: {options['error']})" if "error" in options
               else "") + ": given the whole answer, every setting would read as JAX's default")
    allocator = {"default": "bfc", "address": "platform"}.get(options.get("allocator", "default"),
                                                              options.get("allocator"))
    fraction = float(options.get("memory_fraction", DEFAULT_MEM_FRACTION))
    if not 0 < fraction <= 1:
        raise BadInputError(f"memory_fraction {fraction:g} is outside (0, 1]: it is a fraction "
                            "of the GPU's memory (0.75 is JAX's default, 75%); jaxlib passes it "
                            "on unchecked (jaxlib/xla_client.py), so check the variable")
    preallocate = bool(options.get("preallocate", True))
    if allocator == "bfc":
        cap = _round_up(total_bytes * fraction)
        return PoolPrediction(allocator, fraction, preallocate, cap, cap if preallocate else 0,
                              cap, "BFC pool: capped at fraction x total"
                              + ("" if preallocate else ", grown on demand up to the cap"))
    if allocator == "platform":
        return PoolPrediction(allocator, fraction, preallocate, None, 0, None,
                              "no pool: each buffer is its own cudaMalloc; no stats")
    if allocator == "cuda_async":
        reserve = int(total_bytes * fraction) if preallocate else 0
        return PoolPrediction(allocator, fraction, preallocate, None, reserve, reserve,
                              "CUDA's default mempool: no XLA cap; the fraction is only what "
                              "it reserves up front")
    raise BadInputError(f"the kit does not model allocator {options.get('allocator')!r} "
                     "(known: default, bfc, platform, cuda_async)")


# --- the card you will run on ------------------------------------------------------------------
_H100_RUN = "docs/gpu-runs/2026-11-22-nvidia-h100-80gb-hbm3"


@dataclass(frozen=True)
class Card(Record):
    """A GPU's memory: its name, total bytes, and where the number comes from."""

    name: str
    total_bytes: int
    source: str  # "vendor spec (nominal)", "measured: <record>" or "given"


def _spec(name: str, gib: int) -> Card:
    return Card(name, gib * 2**30, "vendor spec (nominal GiB; the driver reports a little less, "
                f"e.g. 79.65 of 80 on an H100: {_H100_RUN})")


#: Common NVIDIA cards. Totals are the vendors' nominal sizes except where a run measured the
#: driver's figure.
CARDS: Mapping[str, Card] = MappingProxyType({c.name: c for c in (
    _spec("T4 16GB", 16), _spec("V100 16GB", 16), _spec("V100 32GB", 32),
    _spec("A10 24GB", 24), _spec("L4 24GB", 24), _spec("RTX 3090 24GB", 24),
    _spec("RTX 4090 24GB", 24), _spec("A100 40GB", 40), _spec("A100 80GB", 80),
    _spec("L40S 48GB", 48), _spec("RTX A6000 48GB", 48),
    Card("H100 80GB", 85_520_809_984, f"measured: nvidia-smi total, {_H100_RUN}"),
    _spec("H200 141GB", 141),
)})


def _key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def card(which: str | int) -> Card:
    """A card by name ("H100", "rtx 3090", "A100 80GB"; see :data:`CARDS`) or by its size
    (bytes, or text like "24 GiB"). BadInputError lists the names for an unknown one."""
    if isinstance(which, int) and not isinstance(which, bool):
        return Card(f"{format_bytes(which)} card", parse_size(which), "given")
    if not isinstance(which, str):
        raise BadInputError(f"a card is a name or a size, got {which!r}")
    key = _key(which)
    exact = [c for c in CARDS.values() if _key(c.name) == key]
    starts = [c for c in CARDS.values() if _key(c.name).startswith(key)]
    found = exact or starts
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise BadInputError(f"{which!r} names several cards ({', '.join(c.name for c in found)})"
                            "; say which")
    try:
        size = parse_size(which)
    except SizeError:
        raise BadInputError(f"no card {which!r}; known: {', '.join(CARDS)}, or a size such as "
                            "'24 GiB'") from None
    return Card(f"{format_bytes(size)} card", size, "given")


@dataclass(frozen=True)
class Target(Display):
    """The card a step or a file will run on, under given allocator settings and with other
    processes on it: the pool XLA builds there and the budget this process gets."""

    card: Card
    pool: PoolPrediction
    processes: int
    budget_bytes: int  # what this process can use on that card
    note: str  # how the budget was worked out, in one sentence


def target(which: str | int | Card, *, fraction: float = DEFAULT_MEM_FRACTION,
           preallocate: bool = True, allocator: str = "default", processes: int = 1
           ) -> Target:
    """The budget on a card you are not on: XLA's pool for these settings (:func:`predict`),
    shared with ``processes - 1`` other JAX processes (with preallocation each takes its whole
    pool at its first allocation; without, an equal share is assumed)."""
    c = which if isinstance(which, Card) else card(which)
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise BadInputError(f"processes must be a positive int, got {processes!r}")
    pool = predict({"memory_fraction": fraction, "preallocate": preallocate,
                    "allocator": allocator}, c.total_bytes)
    cap = c.total_bytes if pool.cap_bytes is None else pool.cap_bytes
    settings = (f"{pool.allocator} pool {format_bytes(cap)} ({pool.fraction:g} of "
                f"{format_bytes(c.total_bytes)}, {'preallocated' if preallocate else 'on demand'})")
    if processes == 1:
        return Target(c, pool, 1, cap, settings)
    if preallocate and pool.allocator == "bfc":
        left = c.total_bytes - (processes - 1) * cap
        budget = max(0, min(cap, left))
        note = (f"{settings}; the other {processes - 1} process(es) take {format_bytes(cap)} "
                f"each at their first allocation, leaving {format_bytes(max(left, 0))}"
                + ("" if left >= cap else ": set XLA_PYTHON_CLIENT_PREALLOCATE=false, or "
                   f"XLA_CLIENT_MEM_FRACTION below {1 / processes:.2f}, in every process")
                + " (each process's CUDA context, a few hundred MiB outside its pool, is not "
                "counted: pools that fill the card to the byte leave the last process short)")
        return Target(c, pool, processes, budget, note)
    share = c.total_bytes // processes
    return Target(c, pool, processes, min(cap, share),
                  f"{settings}; {processes} processes assumed to share the card equally")


def story_table(settings: dict | None = None, *, request_bytes: int | None = None,
                total_bytes: int | None = None) -> list[dict]:
    """One row per setting: jaxlib's options for it (asked of jaxlib in a child process), XLA's
    cap for a GPU of ``total_bytes``, and whether ``request_bytes`` fits. Defaults: the story's
    19.09 GiB of tokens on a 24 GiB card, for every setting in :data:`SETTINGS`."""
    settings = SETTINGS if settings is None else settings
    request = STORY["request_bytes"] if request_bytes is None else request_bytes
    total = STORY["gpu_total_bytes"] if total_bytes is None else total_bytes
    rows = []
    for name, env in settings.items():
        p = predict(plugin_options(env)["options"], total)
        rows.append({"setting": name, **p.to_dict(), "total_bytes": total,
                     "request_bytes": request, "fits": p.fits(request, total)})
    return rows


@dataclass(frozen=True)
class AllocatorMeasurement(Record):
    """One allocator setting measured on a real GPU in a fresh process: the allocator's
    counters and what the driver says the process holds."""

    setting: str
    env: dict
    ok: bool
    error: str | None
    device_kind: str | None
    total_bytes: int | NotAvailable  # the GPU's memory (nvidia-smi)
    array_bytes: int  # what the child allocated on purpose
    bytes_in_use: int | NotAvailable  # allocator: live buffers
    peak_bytes_in_use: int | NotAvailable
    bytes_limit: int | NotAvailable  # allocator: the most it will hand out
    bytes_reserved: int | NotAvailable  # allocator: reserved from the driver, where reported
    pool_bytes: int | NotAvailable  # BFC: what its regions really got from the driver
    driver_used_bytes: int | NotAvailable  # nvidia-smi: memory this process holds on the GPU
    driver_used_source: str | None = None  # how driver_used_bytes was read


def _require_gpu() -> int:
    """The GPU's total memory (from the driver), or NoGpuError naming the reason and fix."""
    gpu.require("measuring the allocator settings (plugin_options() alone runs anywhere)")
    total = gpu.total_bytes()
    if total is None:
        raise NoGpuError("the driver reports no memory size for JAX's cuda:0")
    return total


def _start(setting: str, env: dict, array_bytes: int) -> subprocess.Popen:
    return child.start(f"{__name__}:_alloc_child", _AllocRequest(setting, array_bytes),
                       env=_env(env))


def _read(proc: subprocess.Popen, setting: str, env: dict, array_bytes: int,
          total: int, timeout: float) -> AllocatorMeasurement:
    result = child.read_answer(proc, timeout=timeout)
    try:
        got = result.answer(_AllocAnswer, f"the {setting} child")
    except ChildProcessFailed as err:  # died or hung: that is this setting's result
        got = _AllocAnswer(ok=False, error=str(err))
    return AllocatorMeasurement(
        setting=setting, env=dict(env), ok=got.ok, error=got.error,
        device_kind=got.device_kind, total_bytes=total, array_bytes=array_bytes,
        bytes_in_use=got.bytes_in_use, peak_bytes_in_use=got.peak_bytes_in_use,
        bytes_limit=got.bytes_limit, bytes_reserved=got.bytes_reserved,
        pool_bytes=got.pool_bytes, driver_used_bytes=got.driver_used_bytes,
        driver_used_source=got.driver_used_source)


def measure(setting: str = "default", env: dict | None = None, *, array_bytes: int = 2**28,
            timeout: float = 180) -> AllocatorMeasurement:
    """Start JAX on the GPU in a fresh child under ``env`` (default: ``SETTINGS[setting]``),
    allocate ``array_bytes``, and measure. Needs an NVIDIA GPU (else NoGpuError)."""
    total = _require_gpu()
    env = SETTINGS[setting] if env is None else env
    proc = _start(setting, env, array_bytes)
    try:
        return _read(proc, setting, env, array_bytes, total, timeout)
    finally:
        child.finish(proc, timeout=timeout)


def measure_together(settings: Sequence[str] = ("default", "default"), *,
                     array_bytes: int | Sequence[int] = 2**28, timeout: float = 180
                     ) -> list[AllocatorMeasurement]:
    """Two (or more) JAX processes on one GPU at the same time: each starts, allocates, reports,
    and holds its memory until all have reported. ``array_bytes``: one size for all, or one per
    process (e.g. a second process asking for more than the card has left). Needs a GPU."""
    total = _require_gpu()
    sizes = ([array_bytes] * len(settings) if isinstance(array_bytes, int)
             else list(array_bytes))
    if len(sizes) != len(settings):
        raise BadInputError(f"{len(settings)} settings but {len(sizes)} array sizes")
    procs, out = [], []
    try:
        for s, size in zip(settings, sizes, strict=True):  # the 2nd starts while the 1st holds
            env = SETTINGS[s]
            p = _start(s, env, size)
            procs.append(p)
            out.append(_read(p, s, env, size, total, timeout))
    finally:
        for p in procs:
            child.finish(p, timeout=timeout)
    return out


# --- the child: start JAX on the GPU under one setting, allocate, report, hold -------------
@dataclass(frozen=True)
class _AllocRequest(Record):
    setting: str
    array_bytes: int


@dataclass(frozen=True)
class _AllocAnswer(Record):
    ok: bool
    error: str | None = None
    device_kind: str | None = None
    bytes_in_use: int | NotAvailable = NOT_AVAILABLE
    peak_bytes_in_use: int | NotAvailable = NOT_AVAILABLE
    bytes_limit: int | NotAvailable = NOT_AVAILABLE
    bytes_reserved: int | NotAvailable = NOT_AVAILABLE
    pool_bytes: int | NotAvailable = NOT_AVAILABLE
    driver_used_bytes: int | NotAvailable = NOT_AVAILABLE
    driver_used_source: str | None = None


def _held(before: int | None) -> tuple[int | NotAvailable, str]:
    """What the driver says this process holds: its per-process figure, or (where the driver
    cannot match our PID, as in some containers) the card's used memory minus ``before``."""
    mine = gpu.process_used_bytes(os.getpid())
    if mine is not None:
        return mine, "nvidia-smi: this process"
    now = gpu.device_used_bytes()
    if now is None or before is None:
        return NOT_AVAILABLE, "unknown"
    return now - before, "nvidia-smi: whole card, change since this process started"


def _stats(stats: dict | None) -> dict:
    stats = stats or {}
    return {k: stats.get(k, NOT_AVAILABLE) for k in (
        "bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved", "pool_bytes")}


def _alloc_child(request: _AllocRequest) -> None:
    """In the child of :func:`measure`: answer one :class:`_AllocAnswer`, then hold the memory
    until a line arrives on stdin (so several children can be measured side by side)."""
    report: dict = {"ok": False}
    before = gpu.device_used_bytes()  # before JAX starts in this process
    try:
        import jax
        import jax.numpy as jnp

        from helpers.memory import memory_stats

        if jax.default_backend() != "gpu":
            raise NoGpuError(f"JAX started on {jax.default_backend()!r}, not on a GPU")
        dev = jax.devices()[0]
        report["device_kind"] = dev.device_kind
        x = jnp.ones(request.array_bytes, jnp.uint8)
        x.block_until_ready()
        report.update(ok=True, **_stats(memory_stats(dev)))
        report["driver_used_bytes"], report["driver_used_source"] = _held(before)
    except Exception as err:  # reported, not raised: the parent shows it
        report["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        try:  # what the allocator says after the failure (bytes_limit vs pool_bytes)
            stats = _stats(memory_stats(jax.devices()[0]))
            report.update(bytes_limit=stats["bytes_limit"], bytes_in_use=stats["bytes_in_use"],
                          pool_bytes=stats["pool_bytes"])
            report["driver_used_bytes"], report["driver_used_source"] = _held(before)
        except Exception:
            pass
    child.answer(_AllocAnswer(**report))
    sys.stdin.readline()  # hold the memory until the parent says so
