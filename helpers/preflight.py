"""Will it fit? A safetensors file before it is loaded (:func:`preflight`), a step before it
runs (:func:`preflight_step`), on this machine or on a card you are not on (``target=``), and
what a gradient keeps for the backward pass (:func:`residuals`). The step's peak measured while
it runs: :mod:`helpers.measure`.

- :func:`preflight` reads only a file's header (never its data) and compares the bytes with the
  free memory of the device the load would land on *right now*: the allocator's
  ``bytes_limit - bytes_in_use`` on a GPU, the host's available memory on the CPU.
- :func:`preflight_step` compiles a function for the device it would run on, without running it
  and without moving any argument (:func:`helpers.compiled.compile_step`), and compares XLA's
  own estimate (``memory_analysis()``) with what is free there, computed as for files. What the
  step needs is XLA's peak minus the argument bytes that already sit on that device. Where that
  memory goes, and why, is in the record with what to change: constants, donations, the largest
  temporaries and their lines (what the program holds: :mod:`helpers.compiled`, said in words by
  :mod:`helpers.program_notes`), and what the
  arguments hold (an optimizer state's copies of the parameters, state not donated, arrays split
  over devices: :mod:`helpers.step_arguments`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from helpers import allocation, compiled, devices, program_notes, step_arguments
from helpers._internal import (
    frames,
    jaxcompat,
    jaxpr_callbacks,
    jaxpr_derivatives,
    jaxpr_loops,
    jaxpr_products,
    jaxpr_sharding,
    jaxpr_values,
    jaxpr_walk,
)
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record
from helpers.datasets import read_header
from helpers.errors import BadInputError, FileError
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes

if TYPE_CHECKING:
    import jax

__all__ = ["FIX", "Preflight", "Residual", "Residuals", "StepPreflight",
           "TensorInfo", "judge", "needed_bytes", "preflight",
           "preflight_step", "residuals"]

#: how to load a safetensors file that does not fit where JAX would put it. Peak anonymous
#: memory of a 64 MiB file of four float32 tensors (safetensors#636's repro, fresh children,
#: sampled every 2 ms; jax 0.10.2 / 0.8.0): load_file alone +70 / +69 MiB; then device_put of
#: each +131 / +133 MiB; safe_open and device_put one tensor at a time +101 / +84 MiB
FIX = ("load it into host memory instead, without JAX: one tensor at a time, "
       "`with safetensors.safe_open(path, framework='numpy') as f:` and `f.get_tensor(name)`, "
       "or a read-only numpy.memmap of the data (pages from the file), then `jax.device_put` "
       "one batch at a time. Not `safetensors.numpy.load_file(path)` and then `jax.device_put` "
       "of all of it: its whole NumPy copy stays beside JAX's, about 2x the file at the peak "
       "(the CPU backend too copies a tensor not 64-byte aligned, as most of them are not; "
       "safetensors/safetensors#636). `safetensors.flax.load_file` under "
       "`with jax.default_device(jax.devices('cpu')[0]):` also lands in host memory, at "
       "up to about four times the file at its peak (4.1x for a token file in the kit's load "
       "benchmark; 1.5-1.8x measured for a file of four float32 tensors)")
#: safetensors.flax.load_file's peak anonymous memory, in files (benchmarks/load_strategies.py
#: on the 2-core VM, jax 0.10.2: the median of 3 fresh children; safetensors.numpy: 1.0)
FLAX_LOAD_PEAK = 4.1


@dataclass(frozen=True)
class TensorInfo(Record):
    """One tensor of a safetensors file, from its header: name, dtype, shape, bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class _Verdict:
    """What a file's and a step's verdicts share."""

    verdict: str

    @property
    def fits(self) -> bool:
        """The verdict is "fits" (tight or not)."""
        return self.verdict == "fits"


@dataclass(frozen=True)
class Preflight(_Verdict, Display):
    """Will this safetensors file fit where a load would put it now: its tensors, the device,
    the free memory there, a verdict and the fix."""

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


# --- is there room where it would land ----------------------------------------------------
def _free_bytes(device) -> tuple[int | NotAvailable, str]:
    from helpers.memory import memory_stats  # imports JAX: only once devices.start_jax() has

    stats = memory_stats(device)
    if stats and "bytes_limit" in stats:
        return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
                "allocator: bytes_limit - bytes_in_use")
    if device.platform == "cpu":
        import psutil

        return int(psutil.virtual_memory().available), "host: available memory (psutil)"
    return NOT_AVAILABLE, f"{device.platform} keeps no memory statistics"


def judge(needed: int, free: int | NotAvailable, dev: jax.Device | str, *, fix: str,
          unknown: str) -> tuple[str, str]:
    """Verdict and advice for ``needed`` bytes against ``free`` on ``dev`` (a device, or the
    name of a target card) (files and steps)."""
    if free is NOT_AVAILABLE:
        return "unknown", unknown
    if needed <= free:
        return "fits", ("" if needed <= 0.9 * free else
                        f"tight: {needed / free:.0%} of what is free; anything else allocated "
                        "first will make it fail")
    return "will not fit", (f"needs {format_bytes(needed)}, {format_bytes(free)} free on "
                            f"{device_name(dev)}. {fix}")


def preflight(path: str | os.PathLike, *, device: str | jax.Device | None = None,
              target: str | int | allocation.Target | None = None) -> Preflight:
    """Dtype, shape and bytes of every tensor, the device a load would land on now, the free
    memory there, and a verdict. Reads only the header (also cross-checked by safetensors).

    ``target``: judge against a card you are not on instead (a name from
    :data:`helpers.allocation.CARDS`, a size, or :func:`helpers.allocation.target` with the
    allocator settings and the processes sharing it): its pool, not this machine's memory."""
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
    if target is not None:
        t = _as_target(target)
        where, why = t.card.name, "the target card (nothing loaded there yet)"
        free, source = t.budget_bytes, f"target: {t.note}"
    else:
        dev, why = devices.resolve(device)
        where = device_name(dev)
        free, source = _free_bytes(dev)
    verdict, advice = judge(total, free, where, fix="Fix: " + FIX,
                            unknown="this device reports no free memory; try a smaller file")
    if (verdict == "fits" and target is None and where.startswith("cpu")
            and total * FLAX_LOAD_PEAK > free):
        advice = " ".join(filter(None, [advice, (
            f"The data fits, but a load through JAX may not: safetensors.flax.load_file "
            f"peaked at {FLAX_LOAD_PEAK}x the file in host memory (the kit's load benchmark), "
            f"{format_bytes(int(total * FLAX_LOAD_PEAK))} here against "
            f"{format_bytes(free)} free. Read and put one tensor at a time, "
            "safetensors.safe_open(path, framework='numpy') and "
            "jax.device_put(f.get_tensor(name)) (the file plus about one tensor: 1.3-1.6x "
            "measured for four float32 tensors), or put a numpy.memmap in batches; "
            "safetensors.numpy.load_file, then jax.device_put, peaked at about 2x "
            "(safetensors/safetensors#636).")]))
    return Preflight(str(path), Path(path).stat().st_size, tuple(tensors), total, where,
                     why, free, source, verdict, advice)


def _as_target(target: str | int | allocation.Target) -> allocation.Target:
    return target if isinstance(target, allocation.Target) else allocation.target(target)


@dataclass(frozen=True)
class StepPreflight(_Verdict, Display):
    """Will this step fit: XLA's sizes for the compiled step, what is in use and free on its
    device now, a verdict and what to try."""

    function: str
    device: str  # where it would run, e.g. "cuda:0", "cpu:0"
    device_reason: str
    argument_bytes: int  # XLA's memory_analysis(), per device
    output_bytes: int
    alias_bytes: int  # outputs written into donated arguments
    temp_bytes: int  # XLA's scratch buffers (activations, intermediates)
    #: generated code; NOT_AVAILABLE on the CPU backend, which does not report it (XLA gives 0,
    #: jax 0.8.0 and 0.10.2)
    code_bytes: int | NotAvailable
    #: the kit's: arguments (each buffer once) + outputs - aliased + temporaries + constants +
    #: runtime
    peak_bytes: int
    xla_peak_bytes: int | NotAvailable  # memory_analysis().peak_memory_in_bytes, as XLA says
    resident_bytes: int  # argument bytes already on that device (counted in in_use_bytes)
    needed_bytes: int  # peak_bytes - resident_bytes: what the step adds
    in_use_bytes: int | NotAvailable  # on that device now
    in_use_source: str  # "allocator" or "live arrays"
    free_bytes: int | NotAvailable
    free_source: str
    donated: tuple[int, ...]
    verdict: str  # "fits" | "will not fit" | "will fail" | "unknown"
    advice: str
    #: arguments XLA dropped because the step never reads them: on the device, not in its peak
    dropped_bytes: int = 0
    #: the array constants the compiled program holds, read from its text and counted in the
    #: peak (XLA's argument, output and temporary sizes leave them out: checked on CPU, and
    #: for a closed-over array on the H100; the text's reading has not yet run on a GPU):
    #: arrays the function closes over, and values XLA computed (``folded_bytes``)
    constant_bytes: int = 0
    #: each donated array: reused by an output or not, and why not
    donations: tuple[compiled.DonatedArgument, ...] = ()
    #: the largest values the step materializes, with the op and the line (XLA's program text)
    largest_temporaries: tuple[compiled.Temporary, ...] = ()
    #: what the runtime takes outside XLA's plan (the CPU's weight-gradient convolution copies,
    #: a stable sort's scratch), counted in ``peak_bytes``
    runtime_bytes: int = 0
    #: on the CPU, the values a YNNPACK fusion makes inside itself that XLA's plan does not
    #: count (as XLA plans them without the fusion), not in ``peak_bytes``: YNNPACK tiles some
    #: fusions and holds others whole, so the step may need up to this much more
    fusion_bytes: int = 0
    #: each top-level argument's array bytes, by parameter name, largest first (an optimizer
    #: state beside its parameters shows here as a multiple of them)
    argument_split: tuple[tuple[str, int], ...] = ()
    #: subtrees of one argument with another's shapes (an optimizer's moments, a gradient
    #: accumulator): what makes a state a multiple of its parameters, and where
    state_copies: tuple[step_arguments.StateCopy, ...] = ()
    #: each lax.scan that stacks 1 MiB or more over its length, largest first
    scan_stacks: tuple[compiled.ScanStack, ...] = ()
    #: of ``constant_bytes``, what XLA computed while compiling (constant folding: a value
    #: made from no argument inside jit, such as jnp.ones(...).at[...].set(...))
    folded_bytes: int = 0
    #: (argument, devices) of each argument spread over several devices: priced whole here
    spread_arguments: tuple[tuple[str, int], ...] = ()
    #: (device, line) of each jax.device_put to another device inside the step, which jit
    #: ignores: a device_put to a Device does not move a value inside jit
    ignored_device_puts: tuple[tuple[str, str], ...] = ()
    #: (argument, its pytree node's type, the array) of each array of more than one element
    #: kept in a pytree's static part (its metadata: a field marked static)
    static_arrays: tuple[tuple[str, str, str], ...] = ()
    #: each jax.jacrev and jax.jacfwd in the step, with its rows (outputs) and columns (inputs)
    jacobians: tuple[compiled.Jacobian, ...] = ()
    #: each whole Jacobian made only to multiply a vector, named where it is a quarter of the
    #: peak (jax-ml/jax#2937)
    jacobian_products: tuple[compiled.JacobianProduct, ...] = ()
    #: (mode, "float32[3456, 3456]", bytes, its line, the solve's line) of each whole Jacobian
    #: made only for a dense linear solve, named where it is a quarter of the peak
    #: (patrick-kidger/optimistix#93)
    jacobian_solves: tuple[tuple[str, str, int, str, str], ...] = ()
    #: (mode, "float32[256, 96, 96]", bytes, its line, the diagonal's line) of each whole
    #: Jacobian or Hessian made only for its main diagonal, named where it and the values made
    #: to build it are a quarter of the peak (netket/netket#1655; jax-ml/jax#3801)
    jacobian_diagonals: tuple[tuple[str, str, int, str, str], ...] = ()
    #: ("float32[512, 512]", bytes, line) of each array the step multiplies by the constant 0.0
    scaled_by_zero: tuple[tuple[str, int, str], ...] = ()
    #: (length, flag, the scan's line, the flag's line) of each lax.scan that runs on after its
    #: carried stop flag is on everywhere (NovaSky-AI/SkyRL#1058)
    stopped_scans: tuple[tuple[int, str, str, str], ...] = ()
    #: each floating argument the step reads only through a cast to a narrower type (float32
    #: parameters under a bfloat16 computation), unless an output has its shape and dtype (a
    #: gradient, an update: master weights)
    narrowed_arguments: tuple[step_arguments.NarrowedArgument, ...] = ()
    #: (what, its dtype, the wider dtype, bytes at that dtype, line) of each value jnp's
    #: promotion widens before a dot or a convolution: a NumPy float64 scalar under x64
    #: (jax-ml/jax#1830), a float32 batch against bfloat16 parameters (jax-ml/jax#7368)
    widened_values: tuple[tuple[str, str, str, int, str], ...] = ()
    #: half-precision values jnp's promotion widens against a wider float argument and that
    #: are cast back (jaxpr_values.promoted_round_trips: BrainPy#539): (narrow dtype, wide dtype,
    #: shape, bytes at the wide dtype, line)
    half_round_trips: tuple[tuple[str, str, tuple[int, ...], int, str], ...] = ()
    #: the bytes of the step's float64 arguments while jax_enable_x64 is on (0 with it off)
    float64_argument_bytes: int = 0
    #: on the CPU, how many of XLA's values are float32 copies of the step's bfloat16 (or
    #: float16) values: XLA:CPU computes them in float32, a GPU computes the dots narrow and
    #: stores values between fusions mostly narrow (from XLA's source, not yet run on a GPU)
    cpu_float32_values: int = 0
    #: ("device=d", line) of each creation given a device= inside the step, which jit drops
    dropped_device_keywords: tuple[tuple[str, str], ...] = ()
    #: (the spec, line) of each jax.device_put inside the step to a NamedSharding that splits
    #: over a mesh of Auto axes: jit lowers no sharding for it, the value comes back whole
    unsplit_sharding_puts: tuple[tuple[str, str], ...] = ()
    #: (the output's path, "float32[2048, 2048]", bytes) of each gradient the step returns
    #: that JAX knows is zero and makes all the same (a parameter under stop_gradient)
    zero_gradients: tuple[tuple[str, str, int], ...] = ()
    #: ("bfloat16[16, 512, 512]", bytes, line) of each input cast whole to a narrower float
    #: before a lax.scan reads it one step at a time (a model cast before its layer loop)
    cast_before_scan: tuple[tuple[str, int, str], ...] = ()
    #: ("float32[4, 128, 4096]", "float32[4, 4096]", bytes, line) of each buffer a loop carries
    #: and only writes, one step's value per row: a value of every step held (gemma#534)
    loop_records: tuple[tuple[str, str, int, str], ...] = ()
    #: (the output's path, the earlier output it repeats, bytes) of each output that is the
    #: same value as another: XLA writes it twice (marin-community/marin#3668)
    repeated_outputs: tuple[tuple[str, str, int], ...] = ()
    #: ("float32[2000, 10, 10]", bytes, whole copies a step, the loop's steps or None, line) of
    #: each value a loop carries that XLA copies whole on every step (jax-ml/jax#10197, #17845)
    carry_copies: tuple[tuple[str, int, int, int | None, str], ...] = ()
    #: ("float32[1, 4, 2, 512, 4, 64]", bytes, slice copies a step, concatenates a step, bytes
    #: those move a step, the loop's steps or None, line) of each value a loop carries and
    #: updates in place while XLA copies slices of it and concatenates them back on every step
    #: (keras-team/keras-hub#2780: a layer's K and V stacked back into one cache)
    carry_slice_copies: tuple[tuple[str, int, int, int, int, int | None, str], ...] = ()
    #: argument bytes XLA's argument size counts more than once: one buffer the step takes in
    #: several places (h(x, x, x, x), jax-ml/jax#13956), counted once in ``peak_bytes``
    passed_again_bytes: int = 0
    #: (the argument and its path, bytes) of each argument leaf the step copies whole only to
    #: write a slice into it, as it must for one not donated (jax-ml/jax#9132)
    copied_to_update: tuple[tuple[str, int], ...] = ()
    #: ("logits" or "attention", "f32[1024, 8192]", bytes, the size its dot contracts, line) of
    #: each product a softmax, a logsumexp or an argmax reduces whole to one value per row: the
    #: full logits over a vocabulary (apple/axlearn#1236), an attention score matrix
    #: (google/flax#2858)
    softmax_products: tuple[tuple[str, str, int, int, str], ...] = ()
    #: (the subscripts, "f32[48, 48, 48, 48]", bytes, its step on opt_einsum's path or "",
    #: line) of each jnp.einsum that makes a value 100x its operands and result (jax#24915)
    einsum_intermediates: tuple[tuple[str, str, int, str, str], ...] = ()
    #: ("argsort", "float32[4194304]", n sorted, k kept, line) of each sort the step slices to
    #: k at one end, where jax.lax.top_k needs no full sort (openxla/xla#25487)
    sliced_sorts: tuple[tuple[str, str, int, int, str], ...] = ()
    #: ("float32[8, 50304]", n sorted per row, the sort's line, the cumulative sum's line) of
    #: each whole sort of 1 MiB or more whose results reach a cumulative sum compared with a
    #: threshold: a top-p cutoff, where jax.lax.top_k first sorts k (keras-team/keras-hub#963)
    cumulative_cutoffs: tuple[tuple[str, int, str, str], ...] = ()
    #: (the table, "float32[131072, 64]", bytes, the gather's line, the bytes of the values with
    #: one row per index) of a gather of a row per edge summed back by a scatter-add, where those
    #: values are a quarter of the peak (jax-ml/jax#1979); None for none
    edge_gather: tuple[str, str, int, str, int] | None = None
    #: ("float32[50000, 50000]", bytes, the product's line, the diagonal's line) of each square
    #: product made only for its diagonal, named where it is a quarter of the peak (GPJax#389)
    diagonal_products: tuple[tuple[str, int, str, str], ...] = ()
    #: ("float32[2, 2048, 32, 64]", bytes, times repeated, line) of each value jnp.repeat made
    #: only for a product to read, a quarter of the peak or more: grouped-query attention's K
    #: and V repeated up to the query heads (NovaSky-AI/SkyRL#514)
    repeated_operands: tuple[tuple[str, int, int, str], ...] = ()
    #: ("float32[500, 1000000]", bytes, the draw's line, the scan's line) of each array of
    #: random values drawn whole and read by a lax.scan one row per step, named where they are
    #: a quarter of the peak together (QuantEcon/lecture-python.myst#329)
    scan_draws: tuple[tuple[str, int, str, str], ...] = ()
    #: ("float32[16, 1024, 1024]", bytes, line) of each jnp.diag(v) of a vector a product
    #: reads, a quarter of the peak together (blackjax-devs/blackjax#1007)
    diagonal_matrices: tuple[tuple[str, int, str], ...] = ()


def _in_use(dev) -> tuple[int | NotAvailable, str]:
    from helpers import memory  # imports JAX: only once devices.start_jax() has

    try:
        (mem,) = memory.snapshot([dev]).devices
    except Exception:
        return NOT_AVAILABLE, "unknown"
    return mem.bytes_in_use, mem.source


def _pool_tip(needed: int, t: allocation.Target) -> str:
    """Where a step misses a card only by the pool's fraction (XLA's BFC pool takes 0.75 of it
    by default): the fraction that fits it, up to 0.95 (the CUDA context and the driver keep a
    few hundred MiB outside the pool). "" where the pool already takes 0.9 or more, several
    processes share the card, or the step needs more than 0.95 of it
    (Physical-Intelligence/openpi#284: a LoRA fine-tune 0.92 GiB short of a 24 GB card's
    0.75 fitted at 0.9, in a new user's trial of its plan). Named XLA_CLIENT_MEM_FRACTION, as
    the kit's other advice does: jaxlib raises at the backend's start where the deprecated
    XLA_PYTHON_CLIENT_MEM_FRACTION is set beside it (a review)."""
    total, pool = t.card.total_bytes, t.pool
    if t.processes != 1 or pool.cap_bytes is None or pool.fraction >= 0.9 or not total:
        return ""
    fraction = max(pool.fraction + 0.05, math.ceil((needed / total + 0.02) * 20) / 20)
    if fraction > 0.95:
        return ""
    return (f"a larger share of the card for JAX's pool: it takes {pool.fraction:g} of "
            f"{format_bytes(total)} ({format_bytes(pool.cap_bytes)}); "
            f"XLA_CLIENT_MEM_FRACTION={fraction:.2f} (never beside the older "
            "XLA_PYTHON_CLIENT_MEM_FRACTION: jaxlib refuses both), set before JAX starts, gives "
            f"{format_bytes(int(fraction * total))} (Physical-Intelligence/openpi#284)")


def _together(find: Callable, c: compiled.CompiledStep, peak: int, each: int = 0) -> list:
    """``find(c.jaxpr)``'s findings (their bytes third) of ``each`` bytes or more, where
    together they come to 1 MiB and a quarter of the peak or more; [] otherwise, and where
    the step has no jaxpr."""
    found = [f for f in (find(c.jaxpr) if c.jaxpr is not None else ()) if f[2] >= each]
    total = sum(f[2] for f in found)
    return found if total >= 2**20 and 4 * total >= peak else []


def _unused_donations_note(unused: list) -> str:
    """Donated arguments XLA did not reuse, those with one reason together (a quantization
    step's 16 weights were 16 sentences of it, twice over: a new user's trial), and where the
    outputs offered are of a narrower dtype (weights quantized to int8), the fix of
    vllm-project/tpu-inference#3439: convert a part per call."""
    by_why: dict[str, list] = {}
    for d in unused:
        by_why.setdefault(d.why, []).append(d)
    parts = []
    for why, ds in by_why.items():
        names = [f"argument {d.argument}" for d in ds]
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{listed} ({format_bytes(sum(d.nbytes for d in ds))}): {why}")
    text = "Donated but not reused: " + "; ".join(parts) + "."
    # (the arrays of several numbered layers: one layer's, the PR's fix, gets no such word)
    layers = {tuple(re.findall(r"\d+", str(d.argument)[str(d.argument).find("["):]))
              for d in unused if "[" in str(d.argument)}
    if any("the bytes differ" in d.why for d in unused) and len(layers) > 1 and all(layers):
        text += (" Where the step converts each donated array to a narrower dtype (weights "
                 "quantized to int8 or fp8), no output can take its buffer, and every original "
                 "stays alive beside its converted copy until the step ends: convert a layer "
                 "(or a few arrays) per call, so only that part's copies are alive at once "
                 "(vllm-project/tpu-inference#3439; from the PR, not yet run on a TPU or GPU).")
    return text


def _only_pool_tip(advice: str, pool: str) -> str:
    """The advice without its generic tips (none of them the fix a note names), keeping the
    pool's fraction where it alone fits the step (a review: it was dropped with them)."""
    head = advice.split(" Try: ")[0]
    return f"{head} Try: {pool}." if pool else head


def _verdict(needed: int, free, dev, donate: bool, derivative: bool,
             batch: bool = True, largest: tuple[str, int, int] | None = None,
             pool: str = "") -> tuple[str, str]:
    """``donate``: an argument whose donation lowers the planned peak (the note says which);
    ``derivative``: the step differentiates something (else jax.checkpoint has nothing to
    drop); ``batch``: not a factorization of one whole matrix (google/neural-tangents#166's
    Cholesky solve: none of the three applies); ``largest``: (name, bytes, the peak) of an
    argument that is half the peak or more, which the step needs whole: shrinking it is the
    first saving (jax-ml/jax-llm-examples#33: a KV cache sized by max_seq_len, 94% of the
    arguments; a new user's trial found the tips silent on it); ``pool``: a larger pool
    fraction that fits the step (:func:`_pool_tip`), first."""
    tips = [pool] if pool else []
    tips += [f"a smaller {largest[0]} ({format_bytes(largest[1])}, {largest[1] / largest[2]:.0%} "
            "of the peak, all of it needed on the device: a smaller shape, such as a cache "
            "sized for a shorter maximum length or fewer layers, or a narrower dtype)"
            ] if largest else []
    tips += ["donate the arguments the step replaces (donate_argnums)"] if donate else []
    tips += ["a smaller batch"] if batch else []
    tips += ["jax.checkpoint on the largest activations"] if derivative else []
    tips += ["free arrays still held (notebook 08)"]
    return judge(needed, free, dev, fix="Try: " + "; ".join(tips),
                 unknown="this device reports no free memory")


def _peak(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
          device, here: bool) -> tuple[int, int, int]:
    """The step's peak as :func:`preflight_step` counts it, with its two corrections to XLA's:
    the CPU runtime's own copies for weight-gradient convolutions and a stable sort's scratch
    (outside XLA's plan; ``here``: not for a target card), and one buffer passed in several
    places (XLA's argument size counts each, the device holds it once)."""
    runtime = c.runtime_bytes() if here else 0
    again = step_arguments.passed_again(c, fn, args, kwargs, per_device=device is None)
    return c.sizes()["peak"] - again + c.constants + runtime, runtime, again


def needed_bytes(fn: Callable, *args, device: str | jax.Device | None = None,
                 donate_argnums: int | Sequence[int] = (),
                 static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (),
                 donate_argnames: str | Sequence[str] = (), **kwargs) -> int:
    """What :func:`preflight_step` reports as ``needed_bytes`` (the step's peak on ``device``,
    less its arguments already there), from one compile and without its notes: the question a
    batch search asks at each size (:func:`helpers.sizing.largest_batch`). ``preflight_step``
    may compile the step again, donated or without its prints, to check a note's advice."""
    c = compiled.compile_step(fn, *args, device=device, donate_argnums=donate_argnums,
                              static_argnums=static_argnums, static_argnames=static_argnames,
                              donate_argnames=donate_argnames, **kwargs)
    return max(_peak(c, fn, args, kwargs, device, True)[0] - c.resident, 0)


def preflight_step(fn: Callable, *args, device: str | jax.Device | None = None,
                   donate_argnums: int | Sequence[int] = (),
                   target: str | int | allocation.Target | None = None,
                   static_argnums: int | Sequence[int] = (),
                   static_argnames: str | Sequence[str] = (),
                   donate_argnames: str | Sequence[str] = (),
                   **kwargs) -> StepPreflight:
    """XLA's memory estimate for ``fn(*args, **kwargs)`` on ``device`` (default: where jit
    would run it), what is in use and free there now, and a verdict. Nothing runs and no
    argument is copied: arrays (JAX, NumPy) or ``jax.ShapeDtypeStruct`` shapes all work.

    ``target``: judge against a card you are not on (a name from
    :data:`helpers.allocation.CARDS`, a size, or :func:`helpers.allocation.target` with the
    allocator settings and the processes sharing it): the whole peak against its budget,
    labelled "sized for the target, compiled here" (XLA's sizes are this backend's)."""
    fn, args, donate_argnums, static_argnums = compiled.unbound(fn, args, donate_argnums,
                                                                static_argnums)
    c = compiled.compile_step(fn, *args, device=device, donate_argnums=donate_argnums,
                     static_argnums=static_argnums, static_argnames=static_argnames,
                     donate_argnames=donate_argnames, **kwargs)
    dev = c.device
    a = c.sizes()
    split = step_arguments.argument_split(c, fn, args, kwargs, per_device=device is None)
    copies = step_arguments.state_copies(c, fn, args, kwargs, per_device=device is None)
    spread = step_arguments.spread_arguments(c, fn, args, kwargs)
    peak, runtime, again = _peak(c, fn, args, kwargs, device, target is None)
    # an output each device holds whole that is a new value of an argument that came in split
    # over them (levanter#639; a state replicated in and out, as data parallelism keeps it, is
    # not one, nor a tensor-parallel layer's replicated activations: a review)
    split_in = {name for name, _ in spread} if spread and device is None else set()
    updated = (c.updated_arguments(fn, args, kwargs) or []) if split_in else []
    replicated = [r for r in (c.replicated_outputs() if updated else ())
                  if r[3] < len(updated) and updated[r[3]] & split_in
                  and (n := compiled.array_bytes(r[1])) >= 2**20 and 4 * n >= peak]
    if target is not None:
        t = _as_target(target)
        resident, needed, where = 0, peak, t.card.name
        reason = f"the target card, compiled on {device_name(dev)}"
        in_use, in_use_source = NOT_AVAILABLE, "target card: nothing there yet"
        free = t.budget_bytes
        free_source = (f"target: {t.note}; sized for the target, compiled here "
                       f"({device_name(dev)}: XLA's sizes are this backend's)")
    else:
        resident, needed, where = c.resident, max(peak - c.resident, 0), dev
        reason = c.why
        in_use, in_use_source = _in_use(dev)
        free, free_source = _free_bytes(dev)
    # donation advised only where XLA's plan of the step so donated has a lower peak: an output
    # of an argument's shape may not let it go (a LAPACK call copies the input it overwrites:
    # jax-ml/jax#9755's svd), and a step whose outputs match no argument has nothing to donate
    # (google/neural-tangents#166's Cholesky solve)
    undonated, drop = None, None
    # arguments the step copies whole to write a slice into (jax-ml/jax#9132): read once
    slice_copies = step_arguments.copied_to_update(c, fn, args, kwargs)
    if not (c.conflict or c.lowered_with_arguments) and (  # (a wrapper's own donation: unseen)
            undonated := step_arguments.donation_would_save(c, fn, args, kwargs)):
        drop = step_arguments.donation_drop(c, fn, args, kwargs, undonated[0], device)
        # kept where the plan does not drop but the step copies a donatable argument whole to
        # write a slice (time, jax-ml/jax#9132), or where it was planned for the CPU, whose
        # plan copies where a GPU's may not: the note then says the CPU's plan did not drop
        copied = {step_arguments.argument_root(where) for where, _ in slice_copies}
        if drop is not None and not step_arguments.donation_pays(drop, undonated[1]) and not (
                getattr(dev, "platform", "") == "cpu" or copied & set(undonated[0])):
            undonated = None
    pool_tip = _pool_tip(needed, _as_target(target)) if target is not None else ""
    if c.conflict:
        verdict, advice = "will fail", c.conflict
    elif c.shared_memory:  # it fails for one JAX buffer, runs for adopted NumPy memory
        verdict, advice = "unknown", c.shared_memory
    else:
        # a one-shot factorization of a whole matrix: no batch to shrink, nothing to checkpoint
        factored = program_notes.factorization(c.temporaries(), peak, c.jaxpr)
        big = max(split, key=lambda x: x[1], default=None) if len(split) > 1 else None
        # (a donation that saves under 2% of the need is no tip: 3.81 MiB of a 14.91 GiB
        # Kesten process, listed first, in a new user's trial; its note still says it)
        verdict, advice = _verdict(needed, free, where,
                                   bool(undonated) and 50 * undonated[1] >= needed,
                                   c.jaxpr is None or jaxpr_walk.has_derivative(c.jaxpr),
                                   factored is None, (*big, peak) if big and 2 * big[1] >= peak
                                   else None,
                                   pool_tip)
        if verdict == "will not fit" and factored is not None:
            host = (peak - runtime + c.runtime_bytes(), _free_bytes(dev)[0]
                    ) if getattr(dev, "platform", "") == "cpu" else (None, None)
            advice += " " + program_notes.factorization_note(factored, needed, *host)
        elif verdict == "will not fit" and isinstance(free, int) and not replicated and \
                a["output"] - a["alias"] > free:  # (an output written into a donated argument
            # takes no room of its own: jax-ml/jax-llm-examples#33's donated KV cache)
            made_at = program_notes.sized_in_code(c.outputs(), c.temporaries(), (args, kwargs))
            if made_at:  # no batch sets its size, nor does freeing room fit it: the note alone
                advice = _only_pool_tip(advice, pool_tip)
            advice = (advice.rstrip(".") + ". " + program_notes.output_too_large_note(
                c.outputs(), a["output"], free, made_at))
    notes = []
    made = (program_notes.numpy_made_while_tracing(fn, c.jaxpr)
            if c.constants and c.jaxpr is not None else [])
    if made:  # (what XLA folded from it is the NumPy array's: no folding note below)
        notes.append(program_notes.numpy_constant_note(made, c.constants))
    closed_over = c.constants - c.folded
    if made and len(made) == program_notes.large_constants(c.jaxpr):
        closed_over = 0  # every large constant is a NumPy array made while tracing: none kept
    if closed_over and c.spanned > 1:
        notes.append(f"{format_bytes(closed_over)} of arrays the function closes over are baked "
                     f"into the compiled program as constants, whole on each of the {c.spanned} "
                     "devices it runs on (no sharding splits a constant; counted in the peak "
                     "here, where XLA's argument, output and temporary sizes leave it out): "
                     "pass them as arguments instead"
                     + ("" if a["argument"] else
                        ", or, where the jit only places them (jax.jit(lambda: state, "
                        "out_shardings=shardings)), jax.device_put(state, shardings), which "
                        "puts only each device's part there")
                     + " (jax-ml/jax#16679)." + program_notes.bound_method_note(fn))
    elif closed_over:
        notes.append(f"{format_bytes(closed_over)} of arrays the function closes over are baked "
                     "into the compiled program as constants, a copy the program holds "
                     "(counted in the peak here, where XLA's argument, output and temporary "
                     "sizes leave it out): pass them as arguments instead."
                     + program_notes.bound_method_note(fn))
    if static_self := program_notes.identity_static_note(fn, args):
        notes.append(static_self)
    if picked := program_notes.picked_log_probabilities_note(c, a["temp"]):
        notes.append(picked)
    if narrow := _widened_constants(c):
        kinds = ", ".join(kind for kind, _, _ in narrow[:3]) + (", ..." if len(narrow) > 3 else "")
        at = f" ({narrow[0][2]})" if narrow[0][2] else ""
        cause = ("This process's first JAX backend started with x64 off, so arrays made "
                 "before it was turned on are float32" if jaxcompat.x64_at_start() is False
                 else "Arrays made before jax_enable_x64 was turned on are float32")
        notes.append(f"{len(narrow)} closed-over float32 array{'s' if len(narrow) > 1 else ''} "
                     f"({kinds}) {'are' if len(narrow) > 1 else 'is'} widened to float64 in "
                     f"this program{at}, so the float64 result keeps float32's rounding. "
                     f"{cause}, a library's module-level arrays among "
                     "them (made at its import). If float64 was meant, turn x64 on before that "
                     "import: JAX_ENABLE_X64=1 before Python starts, or jax.config.update("
                     "'jax_enable_x64', True) right after `import jax`; a later update leaves "
                     "arrays already made as they are (ArgonneCPAC/dsps#108: a relative error "
                     "of 2.75e-8, 1.5e-16 with x64 on first). If float32 was meant, nothing to "
                     "change.")
    if c.folded >= 2**20 and not made:
        notes.append(f"{format_bytes(c.folded)} of constants XLA computed while compiling "
                     "(constant folding: a value made inside the jitted function from no "
                     "argument, such as jnp.ones(...).at[...].set(...)) are baked into the "
                     "program, which holds them as long as it lives, and folding them slows "
                     "the compile. Make such a value from an argument, or compile without "
                     "folding: jax.jit(f).lower(*args).compile(compiler_options="
                     "{'xla_disable_hlo_passes': 'constant_folding'}).")
    if undonated:
        notes.append(step_arguments.donation_note(
            *undonated, slice_copies, c.own_jit, drop,
            getattr(dev, "platform", "") == "cpu",
            "" if target is None else _as_target(target).card.name))
    if c.static_arrays:
        notes.append(f"{c.static_arrays[0]} is static in this jit (static_argnums or "
                     "static_argnames), yet it holds arrays: jit keys its compiled programs by "
                     "the object's hash and equality (for a registered pytree class, by identity "
                     "unless it says otherwise) and bakes its arrays into the program as "
                     "constants, so arrays changed in place give stale results and a new object "
                     "compiles again. Pass it as an ordinary argument: jit traces a pytree's "
                     "leaves (jax-ml/jax#9024).")
    if not c.conflict and target is None and (
            wrapped := step_arguments.wrapper_donations(c, fn, args, kwargs, device)):
        notes.append(step_arguments.wrapper_donation_note(wrapped, c.function))
    if not c.conflict and (held := step_arguments.donated_host_note(c, fn, args, kwargs)):
        notes.append(held)
    if c.dropped_by_keyword:
        names = ", ".join(c.dropped_by_keyword)
        notes.append(f"{names} passed by keyword: {c.function}'s own wrapper drops the "
                     "donation there, so XLA writes nothing into the donated buffers (jax.pmap "
                     "donates positional arguments only, jax-ml/jax#8470; jax.jit keeps a "
                     f"donation passed by keyword). Fix: pass {names} by position; then XLA "
                     f"writes {format_bytes(c.aliased_by_position)} of the outputs into them "
                     "(each device's).")
    if copies:
        notes.append(step_arguments.copies_note(
            copies, tuple(name for name, _ in spread) if device is None else (), peak))
    unused = [d for d in c.donations if not d.reused]
    if unused:
        notes.append(_unused_donations_note(unused))
    if c.dropped:
        notes.append(f"Not counted: {format_bytes(c.dropped)} of arguments the step never "
                     "reads (XLA drops them); they stay on the device while you hold them.")
    temporaries = c.temporaries()
    gathered = (program_notes.gathered(c, temporaries, args, kwargs)
                if spread and device is None else [])
    batched = program_notes.batched_by_line(c, peak)
    # an argument vmap copied per element for a pure_callback: its fix is the callback's
    # vmap_method, not chunks (jax-ml/jax#17187)
    broadcast = [b for b in c.callbacks_broadcast() if b[4] >= 2**20 and 4 * b[4] >= peak]
    batched = [b for b in batched if (b[0].line, tuple(b[0].shape)) not in {
        (at, shape) for _, at, _, shape, _ in broadcast}]
    # jnp.diag(v) @ M: an n x n matrix made to scale rows, whatever the batch (a vmap's lines
    # are not its cause: blackjax-devs/blackjax#1007, where chunks of the batch still held it)
    diag_matrices = _together(jaxpr_products.diagonal_matrices, c, peak, each=2**20)
    if diag_matrices:
        notes.append(program_notes.diagonal_matrix_note(diag_matrices))
        batched = [b for b in batched if b[0].line not in {d[3] for d in diag_matrices}]
    if gathered:  # the whole array on each device: its cause is the split, not the vmap
        batched = [b for b in batched if (b[0].line, b[0].shape) not in {
            (t.line, t.shape) for t, _ in gathered}]
    stacks = c.scan_stacks(a["output"] + a["temp"])
    # a scan's (lax.map's) own stacked result under a vmap, returned by the step: chunks make
    # it no smaller, they are what it is made of already (pymc-devs/pymc#5656's fix,
    # vmap(lax.map(f)): batch_size=10 and 50 kept it at 3.81 MiB and raised the peak from 11.8
    # to 31.6 and 109.8 MiB)
    returned = {tuple(sorted(getattr(o, "shape", ()))) for _, o, _ in c.outputs()}
    stacked = {(t.line, tuple(sorted(t.shape))) for t in stacks
               if tuple(sorted(t.shape)) in returned}
    batched = [b for b in batched if (b[0].line, tuple(sorted(b[0].shape))) not in stacked]
    softmaxed = program_notes.softmax_inputs(c, peak)
    jacobians = c.jacobians()
    # a whole Jacobian made only to multiply a vector: jvp/vjp make the product without it,
    # which no other way of making the Jacobian (fewer rows, chunks) comes near
    by_line: dict[str, list] = {}  # the values made inside the Jacobians, by line
    # (more than the three largest: a deep function's tangents are many values of one size,
    # none a quarter of the peak alone; jax-ml/jax#14447 at 30 layers)
    many = c.temporaries(16)
    for t in many:
        if t.line in c.jacobian_lines:
            by_line.setdefault(t.line, []).append(t)
    made_for = max(by_line.values(), key=lambda ts: sum(t.nbytes for t in ts), default=[])
    made_bytes = sum(t.nbytes for t in made_for)
    multiplied = c.jacobian_products()
    products = [p for p in multiplied  # (where XLA's plan has room for it)
                if 4 * max(p.nbytes, made_bytes) >= peak
                and p.nbytes >= 4 * p.product_bytes and a["temp"] >= p.nbytes]
    if products:  # the values built for it, where no other Jacobian could have made them
        alone = len({p.line for p in multiplied} | {r.line for r in jacobians}) == 1
        notes.append(program_notes.jacobian_product_note(
            products[0], made_for if alone and made_bytes > products[0].nbytes else ()))
        batched = [b for b in batched if b[0].line not in c.jacobian_lines]
    # the Jacobian and the values the lines jacfwd or jacrev traced make to build it: each
    # line pushes the whole basis through, values of the Jacobian's size (XLA's metadata on jax
    # 0.8.0 gives a while loop's line to those inside it; patrick-kidger/optimistix#93)
    solved = []
    for mode, shape, dtype, nbytes, line, solve_line in c.jacobian_solves():
        building = [t for t in many if t.shape != shape and t.line != line and (
            t.line in c.jacobian_lines or t.nbytes == nbytes)]
        if 4 * (nbytes + sum(t.nbytes for t in building)) >= peak:
            solved.append(((mode, f"{dtype}{list(shape)}", nbytes, line, solve_line), building))
    if solved and not products:  # a Newton step's J^-1 r
        notes.append(program_notes.jacobian_solve_note(*solved[0][0], solved[0][1]))
        batched = [b for b in batched if b[0].line not in c.jacobian_lines]
        if verdict == "will not fit":  # none of the generic tips is its fix
            advice = _only_pool_tip(advice, pool_tip)
    # a whole Jacobian or Hessian made only for its diagonal (a Laplacian, a PINN's u_tt):
    # the values its lines make for all n basis vectors at once, and n x n kept for n
    diagonal = []
    if not products and not solved:
        for mode, shape, dtype, nbytes, line, at, hessian in c.jacobian_diagonals():
            building = [t for t in many if t.line in c.jacobian_lines and t.line != at]
            if 4 * (nbytes + sum(t.nbytes for t in building)) >= peak:
                diagonal.append(((mode, shape, dtype, nbytes, line, at, hessian), building))
    if diagonal:
        notes.append(program_notes.jacobian_diagonal_note(*diagonal[0][0], diagonal[0][1],
                                                          a["temp"]))
        batched = [b for b in batched if b[0].line not in c.jacobian_lines]
        if verdict == "will not fit":  # none of the generic tips is its fix
            advice = _only_pool_tip(advice, pool_tip)
    made_whole = () if products or solved or diagonal else jacobians  # (no Jacobian needed)
    # a loop's carry is no temporary XLA lists, yet a Jacobian's batch can be in it (jacrev
    # over an iterative solve: its Krylov basis, one per row; uwplasma/vmex#328)
    carried = c.loop_carries()
    the_long_way = [(r, along) for r in made_whole if r.batch >= 4 * r.other_way
                    and (along := _along_basis(r, (*many, *carried)))
                    and 4 * sum(t.nbytes for t in along) >= peak]
    if the_long_way:
        r, along = the_long_way[0]
        notes.append(program_notes.jacobian_note(r, along[0], len(along),
                                                 sum(t.nbytes for t in along)))
        batched = [b for b in batched if b[0].shape[:1] != (r.batch,)]  # its rows: not lax.map
    # a vmap the user never wrote: a Jacobian's own, over its basis (XLA may fold the batch
    # into a dot's rows: f32[288 * 96, 96] for 288 tangents)
    basis = [r for r in made_whole if batched and not the_long_way and r.batch > 1
             and any(d % r.batch == 0 for d in batched[0][0].shape)
             and batched[0][0].line in c.jacobian_lines]  # (not a vmap of the user's)
    if basis and batched[0][2] >= 4 * basis[0].basis_bytes:
        r, t = basis[0], batched[0][0]
        nested = r.mode == "forward" and t.forward_vmaps >= 2  # (jacfwd of jacfwd)
        notes.append(program_notes.basis_note(r, *batched[0][:3], nested=nested))
    elif batched and not basis:  # (values the size of the Jacobian itself: nothing to save)
        notes.append(program_notes.batched_note(*batched[0]))
    leaves = sum(1 for a in c.dynamic(args, kwargs) for leaf in devices.start_jax().tree.leaves(a)
                 if hasattr(leaf, "shape"))
    if unrolled := c.unrolled(leaves):
        numbers = step_arguments.numbers_argument(c, fn, args, kwargs)
        if numbers and "jnp.asarray(indices)" in unrolled:  # the list of numbers, by name
            name, count = numbers
            unrolled = unrolled.replace(
                "(jnp.asarray(indices))", f"(here `{name}`, {count} Python numbers: "
                f"jnp.asarray({name}))")
        held = program_notes.unrolled_values(c, unrolled, a["temp"])
        notes.append(unrolled + held)
    if not (unrolled and held) and (kept := program_notes.unrolled_under_derivative(
            c, a["temp"])):
        notes.append(kept)  # (a loop too short for the note above, or held in its backward pass)
    named = [t for t in stacks if t.role != "backward"]  # JAX's own scan: nothing to change
    if named and named[0].nbytes * 4 >= peak:
        notes.append(program_notes.stack_note(named[0], peak))
    if device is None and target is None and (host := program_notes.on_the_host_by_commitment(dev)):
        notes.append(host)
    if bits := program_notes.threefry_note(c, a["temp"], peak):
        notes.append(bits)
    if stacked := program_notes.stacked_indices(temporaries, peak):
        notes.append(stacked)
    # the CPU runtime's stable sort of several arrays: its scratch, outside XLA's plan
    sorted_ = [x for x in (c.stable_sorts() if target is None else []) if x[0] == runtime]
    sparse = program_notes.sparse_note(jaxpr_products.sparse_products(c.jaxpr), temporaries, peak,
                                       sorted_[0] if sorted_ else None)
    if sparse:
        notes.append(sparse)
    for kind, *found in softmaxed[:1]:
        notes.append((program_notes.attention_note if kind == "attention"
                      else program_notes.logits_note)(*found))
    blowups = program_notes.einsum_blowups(c, peak)
    if blowups:
        notes.append(program_notes.einsum_note(*blowups[0]))
    sorts = program_notes.sorts_to_slice(c)
    if sorts:
        notes.append(program_notes.sliced_sort_note(*sorts[0]))
    cutoffs = program_notes.sorts_for_cutoffs(c)
    if cutoffs and not sorts:  # a whole sort per row for a top-p cutoff (keras-hub#963)
        notes.append(program_notes.cumulative_cutoff_note(*cutoffs[0]))
    draws = _together(jaxpr_loops.drawn_before_scans, c, peak)
    if draws:
        notes.append(program_notes.scan_draws_note(draws))
    # (K and V counted together against the peak: a review)
    repeats = _together(jaxpr_products.repeated_operands, c, peak, each=2**20)
    if repeats:  # K and V repeated up to the query heads (NovaSky-AI/SkyRL#514)
        notes.append(program_notes.repeated_operand_note(repeats))
    diagonals = [d for d in (jaxpr_products.diagonal_products(c.jaxpr) if c.jaxpr is not None
                             else []) if 4 * d[2] >= peak]
    if diagonals:  # m x m values for m of them (GPJax#389)
        notes.append(program_notes.diagonal_product_note(*diagonals[0]))
    edges = program_notes.edge_gathers(c, c.temporaries(16), peak)
    if edges is not None:  # a graph network's messages, one row per edge (jax-ml/jax#1979)
        notes.append(program_notes.edge_gather_note(*edges))
    if c.jaxpr is not None:
        # a value over every pair of two inputs' rows that XLA keeps whole (jax-ml/jax#7856);
        # under jax.grad its backward pass keeps one too (jax-md/jax-md#137)
        derivative = jaxpr_walk.has_derivative(c.jaxpr)
        kept = program_notes.pairwise_temporary(jaxpr_products.pairwise_reductions(c.jaxpr),
                                                temporaries, peak, derivative)
        if kept is not None:
            rows, columns = kept[0][2]
            if (kept[1].shape[rows], kept[1].shape[columns]) in jaxpr_walk.factored_shapes(
                    c.jaxpr):  # a matrix the step factors whole (a GP's Cholesky): a new
                kept = None    # user's trial found chunks of its rows changed nothing
        if kept is not None:
            notes.append(program_notes.pairwise_map_note(
                *kept, _input_name(fn, args, kwargs, kept[0][6]) if kept[0][6] >= 0 else "",
                derivative=derivative))
    # a wrong number: whatever its size
    for found in jaxpr_sharding.psums_of_invariant(c.jaxpr)[:1]:
        notes.append(program_notes.invariant_psum_note(*found))
    for line, axes, size, nbytes in jaxpr_sharding.replicated_sums(c.jaxpr)[:1]:
        if nbytes >= 2**20 and 4 * nbytes >= peak:
            notes.append(program_notes.replicated_sum_note(line, axes, size, nbytes))
    carried = jaxpr_loops.widened_carries(c.jaxpr)
    if carried and carried[0][3] >= 2**20 and 8 * carried[0][3] >= peak:
        notes.append(program_notes.widened_carry_note(*carried[0]))
    casts = [x for x in c.cast_before_scan() if x[6] != "backward"]
    if casts and casts[0][3] >= 2**20 and casts[0][3] * 8 >= peak:
        notes.append(program_notes.cast_note(*casts[0]))
    repeated = c.repeated_outputs()
    if (twice := sum(r[2] for r in repeated)) >= 2**20 and 8 * twice >= peak:
        path, first, _ = repeated[0]
        more = len(repeated) - 1
        more = f" (and {more} more such pair{'s' if more > 1 else ''})" if more else ""
        notes.append(
            f"The outputs {first} and {path} are the same value{more}: XLA writes it into two "
            f"buffers ({format_bytes(twice)} for the second), and the caller holds both "
            "arrays. Return it once, or leave the field out where it is not used (a train "
            "state's ema_params=params with EMA off: marin-community/marin#3668).")
    records = c.loop_records()
    if records and records[0][4] >= 2**20 and records[0][4] * 4 >= peak:
        unchanged = jaxpr_loops.unchanged_in_rows(c.jaxpr).get((records[0][1], records[0][5]), 0)
        notes.append(program_notes.record_note(*records[0], unchanged=unchanged))
    copied = c.carry_copies()
    if the_long_way:  # a carry the Jacobian's batch made: the Jacobian's note says what to do
        copied = [x for x in copied if x[-1] or x[1][:1] != (the_long_way[0][0].batch,)]
    if copied:
        notes.append(program_notes.carry_copy_note(*copied[0], more=len(copied) - 1))
    sliced = c.carry_slice_copies()
    if sliced:
        notes.append(program_notes.slice_copy_note(*sliced[0], more=len(sliced) - 1))
    if c.computed_while_compiling():
        notes.append(
            f"XLA computed all of {c.function} while compiling: its program reads no argument "
            "(the arrays it uses are closed over, constants) and only copies or broadcasts the "
            "result, so a call copies that out, and its time and cost_analysis() say nothing of "
            "the work. Pass the inputs as arguments, jax.jit(h)(x), not jax.jit(lambda: h(x))() "
            "(jax-ml/jax#13956: a loop of 600 million additions timed at 3.9 ms as a closure, "
            "96.0 ms with x passed, on a CPU).")
    if whiles := c.batched_whiles_reduced():
        at = f" ({whiles[0]})" if whiles[0] else ""
        notes.append(
            f"The lax.while_loop{at} is batched by jax.vmap over a batch split across devices: "
            "its stop test becomes 'any element still running', which XLA all-reduces across "
            "the devices at every iteration, so each device waits on the others at each step "
            "and runs until the slowest element anywhere stops. Run the vmap inside "
            "jax.shard_map over the batch's axis (shard_map(jax.vmap(f), mesh=..., "
            "in_specs=P(axis), out_specs=P(axis))): each device then loops over its own "
            "elements, as jax.pmap does, with no collective (jax-ml/jax#26586).")
    removed = c.callbacks_removed()
    if removed and c.jaxpr is not None and removed[0] in jaxpr_callbacks.in_custom_rules(
            c.jaxpr):  # (a training step's own logging callback is not one: a review)
        at = removed[0]  # (a custom_vjp's forward kernel: the plain call still needs it)
        notes.append(
            f"The jax.pure_callback{' (' + at + ')' if at else ''} never runs in this step: "
            "under the derivative nothing reads its result, and XLA removes such a call as "
            "dead code; a call without the derivative still runs it, so keep it. If it must "
            "run here, to log or save, call it with jax.experimental.io_callback or "
            "jax.debug.callback, which XLA keeps (jax-ml/jax#13762).")
    elif removed:
        at = removed[0]
        notes.append(
            f"The jax.pure_callback{' (' + at + ')' if at else ''} never runs: nothing reads its "
            "result, and XLA removes such a call from the program as dead code (a pure "
            "callback is one without side effects). If it must run, to log or save, call it "
            "with jax.experimental.io_callback or jax.debug.callback, which XLA keeps "
            "(jax-ml/jax#13762); otherwise delete it.")
    host = [(cb, at) for cb, at in c.callbacks()
            if cb in ("jax.pure_callback", "io_callback") and at not in removed]
    if host:
        cb, at = host[0]
        # one sentence for every step, however small: what the Python allocates is not in
        # the step's sizes (the thread's step: 2 MiB, its callback's array 64 MiB)
        notes.append(
            f"The {cb}{' at ' + at if at else ''} runs Python outside XLA's plan, so XLA's "
            "sizes above leave out what that Python allocates: measure.measure_step(fn, *args) "
            "or %%memory around a call counts it (jax-ml/jax#31292: 2.00 MiB by XLA's sizes, "
            "151.64 MiB measured on a CPU).")
    for callback, at, fn, found in c.callbacks_calling_jax()[:1]:
        notes.append(
            f"The {callback}{' at ' + at if at else ''} runs {fn}, which calls JAX itself "
            f"({found}): JAX work started inside a host callback can deadlock with the step "
            "that called it, which waits on the callback (jax-ml/jax#24255: hangs on the CPU "
            "backend since jax 0.4.32, which dispatches asynchronously; run on the CPU, a loop "
            "of 60 calls of a 200x200 eig hung on jax 0.8.0 and 0.10.2, and ran in 1.0 s on "
            "0.12.0.1; with NumPy inside, 1.6 s on each). Do the callback's work in NumPy "
            "(invrs-io/agjax#34), or call JAX outside the jitted function.")
    for callback, at, loop, loop_at in c.callbacks_hoisted()[:1]:
        notes.append(
            f"The {callback} at {at}, written in the body of the {loop}"
            f"{' at ' + loop_at if loop_at else ''}, runs once, not once per step: under "
            "jax.grad, scan moves a callback that reads nothing the loop changes out of the loop "
            "(jax-ml/jax#16637; io_callback(ordered=True) is moved too). Make it read a value "
            "that changes each step, the carry, as jax.debug.callback(fn, x) (a scan of 5 "
            "steps: 1 call under grad, 5 once it reads the carry).")
    # a scan of 100 steps or more; a while_loop's count is unknown, so there only a callback
    # that reports (progress: liesel#282), not a jax.debug.print of a solver's few iterations
    every = [x for x in c.callbacks_every_step()
             if x[0] != "jax.pure_callback"
             and (x[3] >= 100 if x[3] is not None else x[0] != "jax.debug.print")]
    for callback, at, loop, _ in every[:1]:
        fix = jaxpr_callbacks.progress_fix(callback)
        notes.append(
            f"The {callback} at {at} is in the body of a {loop} with no cond around it: it "
            f"runs, a round trip to the host, on every iteration; {fix}.")
    for found in c.callbacks_vmapped()[:1]:  # vmap's loop of host calls, one per element
        notes.append(program_notes.callback_loop_note(*found))
    for found in broadcast[:1]:  # an argument vmap copied per element for a pure_callback
        notes.append(program_notes.callback_broadcast_note(*found))
    if stopped := c.stopped_scans():  # a loop that runs on after every element stopped
        notes.append(program_notes.stopped_scan_note(*stopped[0]))
    for found in c.in_selected_conds()[:1]:  # a cond vmap made a select: both branches run
        notes.append(program_notes.selected_cond_note(*found))
    # one more compile, only where the step prints and holds 1 MiB of temporaries or more
    if a["temp"] >= 2**20 and 4 * a["temp"] >= peak and (printed := c.temp_without_prints) and (
            more := a["temp"] - printed[2]) >= 2**20 and 4 * more >= peak:
        notes.append(program_notes.print_note(printed[0], printed[1], a["temp"], printed[2]))
    if (zeroed := c.scaled_by_zero()) and zeroed[0][1] >= 64 * 1024:
        what, _, at = zeroed[0]
        notes.append(
            f"{len(zeroed)} array{'s' if len(zeroed) > 1 else ''} "
            f"({format_bytes(sum(z[1] for z in zeroed))}; the largest {what}"
            f"{', ' + at if at else ''}) {'are' if len(zeroed) > 1 else 'is'} multiplied by the "
            "constant 0.0, as optax.scale(0.0) does to frozen parameters' updates: XLA keeps the "
            "work that makes them (0 * x is not 0 for an infinite or NaN x), so the step still "
            "computes those gradients. Zeros that read nothing, optax.set_to_zero() (under "
            "optax.masked or optax.multi_transform) or jnp.zeros_like, let XLA drop it.")
    zeros = tuple((path, f"{o.dtype}{list(o.shape)}", compiled.array_bytes(o))
                  for path, o, kind in c.outputs() if kind == "zero gradient")
    if (zero_bytes := sum(z[2] for z in zeros)) >= 2**20:
        path, what, _ = max(zeros, key=lambda z: z[2])
        many = len(zeros) > 1
        notes.append(
            (f"{len(zeros)} outputs ({format_bytes(zero_bytes)}; the largest {path}, {what}) "
             "are gradients" if many else
             f"The output {path} ({what}, {format_bytes(zero_bytes)}) is a gradient") +
            " JAX knows to be zero and makes all the same: a parameter under "
            "jax.lax.stop_gradient, or one the loss never reads. Differentiate only the "
            "parameters you train: pass the frozen ones as another argument, outside jax.grad's "
            "argnums (eqx.partition splits a model so), and no zero gradient is made or kept.")
    narrowed = step_arguments.narrowed_arguments(c, fn, args, kwargs)
    notes += step_arguments.narrowed_notes(narrowed, peak)
    widened = program_notes.widened(c, fn, args, kwargs)
    if widened and widened[0][3] >= 2**20 and 32 * widened[0][3] >= peak:
        notes.append(program_notes.widened_note(*widened[0]))
    round_trips = jaxpr_values.promoted_round_trips(c.jaxpr) if c.jaxpr is not None else ()
    if round_trips and not widened and round_trips[0][3] >= 2**20 and \
            16 * round_trips[0][3] >= peak:
        notes.append(program_notes.round_trip_note(*round_trips[0], more=len(round_trips) - 1))
    float64 = program_notes.float64_arguments(c, args, kwargs)
    if float64 >= 2**20 and 2 * float64 >= a["argument"]:
        notes.append(program_notes.float64_note(
            float64, a["argument"], factors=any(  # (a matrix, not a 3 x 3 det: a review)
                rows >= 64 for rows, _ in jaxpr_walk.factored_shapes(c.jaxpr))
            if c.jaxpr is not None else False))
    half, upcast = program_notes.cpu_upcast(c, temporaries)
    if upcast:
        notes.append(program_notes.cpu_upcast_note(half, upcast))
    if static := step_arguments.static_arrays(c, fn, args, kwargs):
        notes.append(step_arguments.static_array_note(static))
    if gathered:
        t, how = gathered[0]
        whole = (f"{t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}"
                 f"{', ' + t.line if t.line else ''}) is the whole of an array the arguments "
                 "split over devices")
        if how == "index":  # an index the program traces (OpenSourceEconomics/pylcm#391)
            # (no op named: on jax 0.12 XLA names the buffer after the argument)
            notes.append(
                f"A value of {whole.removeprefix(t.op + ' ')}, gathered from its shards onto each "
                "device (an all-gather in XLA's program): every device holds all of it. An index "
                "the program traces (V[t], t an element of a jax.vmap) may read any row, so XLA "
                "brings them all. Where each element reads rows of its own, split as the batch is, "
                "map the array with the batch, jax.vmap(lambda t, v_t: ..., in_axes=(0, 0))(types, "
                "V), so each device reads its own share (OpenSourceEconomics/pylcm#391). Computing "
                "the batch in chunks, lax.map(f, xs, batch_size=k), keeps the gather (checked: no "
                "fewer temporaries at batch_size=2).")
        elif how == "write":  # a slice of rows written, which XLA all-gathers (jax#23052)
            notes.append(
                f"{whole}, gathered from its shards onto each device (an all-gather in XLA's "
                "program): every device holds all of it. Writing a slice along the split "
                "dimension, x.at[a:b].set(u) (or .add) with Python ints, is a scatter XLA's "
                "partitioner does not split: it gathers the whole array to write it. Give the "
                "positions on that dimension as an index array, x.at[jnp.arange(a, b)].set(u) "
                "for rows, x.at[:, jnp.arange(a, b)].set(u) for columns, or write with "
                "jax.lax.dynamic_update_slice(x, u, start), start one index per dimension (a on "
                "the split one, 0 elsewhere): each device writes what it holds, the same values "
                "(jax-ml/jax#23052; checked on 4 simulated devices, 16 MiB of temporaries to "
                "none).")
        elif how == "slice":  # a slice XLA all-gathers (apple/axlearn#993)
            notes.append(
                f"{whole}, gathered from its shards onto each device (an all-gather in XLA's "
                "program): every device holds all of it. A slice along the split dimension (a "
                "minibatch cut from a batch split over devices) lives on few devices and is "
                "gathered to be used: reshape so that each slice takes part of every device's "
                "share, jnp.swapaxes(x.reshape(size, steps, *rest), 0, 1)[i] for step i "
                "(apple/axlearn#993), or slice a dimension that is not split.")
        else:
            notes.append(
                f"{whole}: a value gathered from its shards to be handed to the host. "
                + ("jax.debug.print and jax.debug.callback take what they are given whole: "
                   "give them a slice or a reduction." if t.op in ("debug_print",
                                                                   "debug_callback") else
                   f"A host callback ({t.op}) takes what it is given whole. Where it works on "
                   "each part alone (an elementwise function, not a sort or a total), run it "
                   "under shard_map with in_specs and out_specs that split it, each device on "
                   "its part (jax-ml/jax#15956); where it needs the whole, this gather is the "
                   "cost of calling it."))
    if replicated:
        r = replicated[0]
        notes.append(program_notes.replicated_output_note(
            *r[:3], ", ".join(sorted(updated[r[3]] & split_in))))
    if spread and device is not None:
        listed = ", ".join(f"{name} over {n} devices" for name, n in spread)
        notes.append(
            f"Priced whole on {device_name(dev)}, as asked: arguments are sharded ({listed}), "
            "so these sizes are the whole step's, not one device's share (without device=, "
            "the kit sizes one device's share).")
    bits = [t for t in temporaries if t.dtype == "u32"]  # threefry's words, largest first
    # over a mesh with the flag off: a note where the bits are a quarter of the peak, or where
    # devices exchange values at all (jax-ml/jax#15895: a data-parallel step with dropout ran
    # slower on 2 GPUs than on 1; a trial's miniature on 4 simulated devices had 24
    # all-gathers and 48 collective-permutes with the flag off, none with it on)
    # (of random bits only, uint32: an FSDP step's gathers of its weights are not the flag's,
    # and turning it on removes none of them: a review)
    whole_bits = c.over_mesh and program_notes.random_bits_whole(c)
    moves = sum(1 for line in (c.text or "").splitlines()
                if re.search(r"= \(?u32\[[^=]*? (?:all-gather|collective-permute)(?:-start)?\(",
                             line)) if whole_bits else 0
    if whole_bits and (sum(t.nbytes for t in bits) * 4 >= peak > 0 or moves):
        largest = (f" (the largest value of random bits, u32{list(bits[0].shape)}, is "
                   f"{format_bytes(bits[0].nbytes)} on each device)" if bits else "")
        exchanged = (f" XLA's program here also has {moves:,} all-gathers and "
                     "collective-permutes of random bits, exchanges run at every step (a "
                     "data-parallel step with dropout ran slower on 2 GPUs than on 1: "
                     "jax-ml/jax#15895; with the flag on, the kit's miniature of it had none)."
                     if moves else "")
        notes.append(
            "This step draws random numbers over several devices with "
            "jax_threefry_partitionable off: each device makes the random bits for the whole "
            f"array, then keeps its own part{largest}.{exchanged} jax.config.update("
            "'jax_threefry_partitionable', True), JAX's default, lets each device draw only "
            "its part; the numbers drawn change with it.")
    ignored, dropped = c.ignored_device_puts(), c.dropped_device_keywords()
    if dropped:
        said, at = dropped[0]
        notes.append(
            f"{said} is dropped inside jit ({at}): JAX makes the value where the step runs, "
            f"{device_name(dev)}, and nothing in the program moves it (if that is the device "
            "you named, nothing is lost). To get the result on another device, give the jit "
            "out_shardings=jax.sharding.SingleDeviceSharding(device), "
            "or make the value outside jit, or pass the step an argument already there (jit "
            "runs where its committed arguments are).")
    if unsplit := c.unsplit_sharding_puts():
        spec, at = unsplit[0]
        notes.append(
            f"jax.device_put(..., NamedSharding(mesh, {spec})) inside jit"
            f"{f' ({at})' if at else ''} does not split the value: on a mesh of Auto axes "
            "(Mesh(...)'s default) JAX lowers no sharding for it, and it comes back whole on "
            "every device of the mesh (jax 0.8.0 and 0.10.2). jax.lax.with_sharding_constraint("
            "x, sharding) inside jit splits it, as does out_shardings on the jit.")
    if ignored:
        put_to, put_at = ignored[0]
        notes.append(
            f"jax.device_put(..., {put_to}){f' ({put_at})' if put_at else ''} does nothing "
            f"inside jit: a device_put to a Device does not move the value, and the step runs "
            f"on {device_name(dev)} and returns its results there. Put the arguments on {put_to} "
            "before the call (jit runs where its committed arguments are), or give device_put "
            "a sharding, jax.sharding.SingleDeviceSharding(device): inside jit that places the "
            "whole computation there (and fails if an argument is committed elsewhere).")
    # (counted in the peak whatever its size; a word only where it matters: a 512 B scratch
    # of jax.random.permutation's own sort drew the argsort fix, a trial)
    if runtime and sorted_:
        if "to sort the pairs stably" not in sparse and sorted_[0][0] >= 2**20 and \
                16 * sorted_[0][0] >= peak:  # (said there, with its own fix)
            notes.append(program_notes.sort_scratch_note(*sorted_[0]))
    elif runtime:
        notes.append(f"Counted beyond XLA's plan: {format_bytes(runtime)} the CPU runtime "
                     "copies for a convolution's weight gradient (measured on jax 0.10.2).")
    fused = c.fusion_intermediates if target is None else 0
    if fused >= 2**20:  # (less: not worth a note; the record keeps it)
        notes.append(program_notes.fusion_intermediates_note(fused, a["temp"], needed, free,
                                                             c.fusion_has_dot))
    if a["output"] == 0 and a["temp"] == 0 and not c.conflict:
        notes.append("The compiled step computes nothing: it returns no array, so XLA kept no "
                     "work and there is no memory to predict. A step that updates Python "
                     "objects in place (as Flax NNX steps do) must be priced through the "
                     "function its own jit traces, or made to return the new state.")
    if notes and advice and not advice.endswith("."):  # ("Try: ...; free arrays ... (nb 08)")
        advice += "."
    advice = " ".join([advice, *notes]).strip()
    return StepPreflight(
        function=compiled.function_name(fn), device=device_name(where),
        device_reason=reason, argument_bytes=a["argument"], output_bytes=a["output"],
        alias_bytes=a["alias"], temp_bytes=a["temp"],
        code_bytes=a["generated_code"] or (NOT_AVAILABLE if getattr(dev, "platform", "") == "cpu"
                                           else 0),
        peak_bytes=peak, xla_peak_bytes=a["xla_peak"], resident_bytes=resident,
        needed_bytes=needed, in_use_bytes=in_use, in_use_source=in_use_source,
        free_bytes=free, free_source=free_source, donated=c.donated, verdict=verdict,
        advice=advice, dropped_bytes=c.dropped, constant_bytes=c.constants,
        folded_bytes=c.folded,
        donations=c.donations, largest_temporaries=temporaries,
        runtime_bytes=runtime, fusion_bytes=fused, argument_split=split, state_copies=copies,
        scan_stacks=stacks,
        ignored_device_puts=ignored, spread_arguments=spread, static_arrays=static,
        jacobians=jacobians, jacobian_products=tuple(products), stopped_scans=stopped,
        jacobian_solves=tuple(s for s, _ in solved),
        jacobian_diagonals=tuple((mode, f"{dtype}{list(shape)}", n, line, at)
                                 for (mode, shape, dtype, n, line, at, _), _ in diagonal),
        scaled_by_zero=zeroed, narrowed_arguments=narrowed,
        widened_values=tuple(w[:5] for w in widened), half_round_trips=round_trips,
        float64_argument_bytes=float64,
        cpu_float32_values=len(upcast),
        cast_before_scan=tuple((f"{to}{list(shape)}", n, line)
                               for _, to, shape, n, line, _, _ in casts),
        dropped_device_keywords=dropped, zero_gradients=zeros, unsplit_sharding_puts=unsplit,
        loop_records=tuple((f"{dtype}{list(whole)}", f"{dtype}{list(step)}", n, line)
                           for _, whole, step, dtype, n, line, *_ in records),
        repeated_outputs=repeated, passed_again_bytes=again,
        copied_to_update=slice_copies,
        carry_copies=tuple((f"{dtype}{list(shape)}", n, copies, steps, line)
                           for dtype, shape, n, copies, steps, _, line in copied),
        carry_slice_copies=tuple((f"{dtype}{list(shape)}", n, copies, joins, moved, steps, line)
                                 for dtype, shape, n, copies, joins, moved, steps, line, _
                                 in sliced),
        softmax_products=tuple((kind, f"{dtype}{list(shape)}", n, k, line)
                               for kind, shape, dtype, n, k, line, _, _ in softmaxed),
        einsum_intermediates=tuple((spec, f"{dtype}{list(shape)}", n, step, line)
                                   for spec, shape, dtype, n, _, step, line in blowups),
        sliced_sorts=tuple((function, f"{dtype}{list(shape)}", n, k, line)
                           for shape, dtype, n, k, _, _, function, line in sorts),
        cumulative_cutoffs=tuple((f"{dtype}{list(shape)}", n, line, at)
                                 for shape, dtype, n, line, at in cutoffs),
        edge_gather=edges,
        diagonal_products=tuple((f"{dtype}{list(shape)}", n, line, at)
                                for shape, dtype, n, line, at in diagonals),
        repeated_operands=tuple((f"{dtype}{list(shape)}", n, g, line)
                                for shape, dtype, n, g, _, line in repeats),
        scan_draws=tuple((f"{dtype}{list(shape)}", n, line, at)
                         for shape, dtype, n, line, at in draws),
        diagonal_matrices=tuple((f"{dtype}{list(shape)}", n, line)
                                for shape, dtype, n, line, _ in diag_matrices))


# --- what a gradient keeps for the backward pass ------------------------------------------------
@dataclass(frozen=True)
class Residual(Record):
    """One array a gradient keeps from the forward pass for the backward pass."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    source: str  # JAX's words: "from the argument x", "output of scan from model.py:12 (f)"
    is_argument: bool  # an argument itself: kept anyway, costs nothing extra
    #: the jax.custom_vjp fwd rule that returns it ("" for none): no jax.checkpoint inside
    #: the rule drops it
    fwd_rule: str = ""
    #: where it waits for the backward pass: "device", or the host memory a jax.checkpoint
    #: policy offloads it to ("pinned_host"; "host" where the policies name several), as JAX
    #: lists it (float32<host>[...])
    memory: str = "device"
    #: the devices a ``shard_map`` splits it over (its out_specs): JAX lists a shard_map
    #: body's residual stacked over them, and each device keeps ``nbytes // devices``
    #: (jax-ml/jax#25010); 1 for a value that is not split that way
    devices: int = 1
    device_shape: tuple[int, ...] = ()  # its shape on one device, where ``devices`` > 1
    #: the line of the ``all_gather`` in the shard_map body that made it whole, "" for none
    gathered_at: str = ""


@dataclass(frozen=True)
class Residuals(Display):
    """What ``jax.grad`` of a function keeps between its forward and backward pass: the arrays,
    how many bytes beyond the arguments in device memory and how many a jax.checkpoint policy
    offloads to host memory, the part a scan multiplies by its length, and the fix."""

    function: str
    residuals: tuple[Residual, ...]  # those in device memory first, each largest first
    #: beyond the arguments, in device memory: held there from the forward to the backward pass
    saved_bytes: int
    scan_bytes: int  # of which stacked scan outputs (one slice per scan step or layer)
    scan_lengths: tuple[int, ...]  # the lengths that multiply them
    advice: str
    #: beyond the arguments, in host memory: offloaded there by a jax.checkpoint policy
    offloaded_bytes: int = 0
    offloaded_to: str = ""  # that memory ("pinned_host"), "" where nothing is offloaded
    #: what one device keeps in device memory: ``saved_bytes`` with each shard_map residual
    #: divided over the devices it is split over (``saved_bytes`` sums them, jax-ml/jax#25010)
    device_bytes: int = 0
    devices: int = 1  # the most devices one residual is split over (1: none is)


_SOURCE_LINE = re.compile(r"from (\S+?):(\d+)(?::\d+)? ")


def _along_basis(r: compiled.Jacobian, values: Sequence[compiled.Temporary]
                 ) -> list[compiled.Temporary]:
    """The values among ``values`` that carry a Jacobian's whole basis (its first dimension),
    largest first: the largest and those a quarter of its size or more (a deep function's
    tangents, one per layer; not the primal's vectors of the same length)."""
    along = sorted((t for t in values if t.shape[:1] == (r.batch,)), key=lambda t: -t.nbytes)
    return [t for t in along if 4 * t.nbytes >= along[0].nbytes]


def _short(source: str) -> str:
    """JAX's "output of scan from /tmp/ipykernel_1/94.py:5:11 (f)" with the file named as the
    kit names lines ("cell, line 5"), without a machine's paths."""
    return _SOURCE_LINE.sub(lambda m: f"from {frames.where(m.group(1), int(m.group(2)))} ",
                            source, count=1)


def _made_at(source: str) -> str:
    """Where JAX's words say a residual was made, as the kit names lines ("" for none)."""
    m = _SOURCE_LINE.search(source)
    return frames.where(m.group(1), int(m.group(2))) if m else ""


def _memory(aval, kinds: set[str]) -> str:
    """Where a residual waits: "device", or the host memory a policy offloads it to. JAX marks
    an offloaded residual's memory space Host (``MemorySpace.Host`` on jax 0.10.2,
    ``Space.Host`` on 0.8.0); the policies' ``dst`` names the kind."""
    if getattr(getattr(aval, "memory_space", None), "name", "") != "Host":
        return "device"
    return next(iter(kinds)) if len(kinds) == 1 else "host"


@dataclass(frozen=True)
class _Scan:
    """One lax.scan of the forward pass, for :func:`residuals`."""

    carry_bytes: int  # one step's carry
    checkpointed: bool  # its body under jax.checkpoint
    chunked: bool  # that checkpoint holds a scan of its own: chunks of steps
    carries: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each carried value
    #: (what, memory kind, returned by the checkpointed body, line) for each value its body's
    #: checkpoint policy offloads (jaxpr_derivatives.checkpoint_offloads)
    offloads: tuple[tuple[str, str, bool, str], ...]


def _scans(fn: Callable, args, kwargs) -> tuple[set[int] | None, set[tuple], dict, object,
                                               dict]:
    """(the lengths of the scans in ``fn``'s forward pass, nested ones included; the (shape,
    dtype) of their carries, which a stacked output is not; (length, where) -> its
    :class:`_Scan`; the jaxpr; (length, where) -> the :class:`_Scan` of each scan of that
    length made at that line, the top-level ones in the order they run first, then those
    nested in other equations). None and empties where it cannot be traced apart (then every
    scan output counts as stacked)."""
    jax = devices.start_jax()
    try:
        closed = jax.make_jaxpr(fn)(*args, **kwargs)
    except Exception:
        return None, set(), {}, None, {}
    top = [eqn for eqn in closed.jaxpr.eqns if eqn.primitive.name == "scan"]
    scans = top + [eqn for j, _ in jaxpr_walk.walk(closed) if j is not closed.jaxpr
                   for eqn in getattr(j, "eqns", ()) if eqn.primitive.name == "scan"]
    steps: dict[tuple[int, str], _Scan] = {}
    every: dict[tuple[int, str], list[tuple[_Scan, bool]]] = {}
    carry_types: set[tuple[tuple[int, ...], str]] = set()
    for n, eqn in enumerate(scans):
        carried = tuple((tuple(v.aval.shape), str(v.aval.dtype))
                        for v in eqn.outvars[:jaxcompat.scan_counts(eqn.params)[1]]
                        if hasattr(v.aval, "shape"))
        carry_types.update(carried)
        key = (int(eqn.params["length"]), jaxpr_walk.equation_where(eqn))
        scan = _Scan(jaxpr_loops.scan_carry_bytes(eqn), *jaxpr_loops.scan_checkpoint(eqn), carried,
                     jaxpr_derivatives.checkpoint_offloads(eqn.params["jaxpr"]))
        steps.setdefault(key, scan)
        every.setdefault(key, []).append((scan, n < len(top)))
    return ({int(eqn.params["length"]) for eqn in scans}, carry_types, steps, closed, every)


def _scan_of(every: dict, key: tuple[int, str], ordinal: int, forward: int) -> _Scan | None:
    """The :class:`_Scan` of the ``ordinal``-th of the ``forward`` top-level scans of ``key``
    in the gradient's forward pass, which are the function's top-level scans of that key in
    the same order where it has as many; else the one all scans of that key are alike in; None
    where they differ (the kit cannot tell which one it is)."""
    found = every.get(key, [])
    top = [scan for scan, at_top in found if at_top]
    if ordinal < forward == len(top):
        return top[ordinal]
    return found[0][0] if found and len({scan for scan, _ in found}) == 1 else None


def _offloaded_note(offloaded: list[Residual], kept: int, names: list[str]) -> str:
    """The words for residuals a jax.checkpoint policy offloads: where they are, beside what
    stays in device memory (jax-ml/jax#20015: JAX lists them as float32<host>[...]). XLA:CPU
    drops the placement when it compiles, so the CPU shows no saving: the gradient's
    temporaries were 720,896 B with the offload, save and nothing_saveable policies alike
    (two float32[256, 128] activations, jax 0.8.0 and 0.10.2); on 0.11.2 851,968 B offloading
    both, as saving both (786,432 saving one or none)."""
    total = sum(r.nbytes for r in offloaded)
    kinds = sorted({r.memory for r in offloaded})
    named = f": {', '.join(repr(n) for n in names)}" if names else ""
    head = (f"{format_bytes(total)} kept in {' and '.join(kinds)} (offloaded by your "
            f"policy{named}), {format_bytes(kept)} in device memory.")
    if kept:
        return head
    return (f"{head} Nothing waits in device memory for the backward pass: the policy "
            "already moves it off the device (the CPU backend drops that placement when it "
            "compiles, so XLA's sizes on the CPU show no saving).")


def _carry_note(stranded: list[Residual], kept: int, where: str, length: int, scan: _Scan,
                kind: str) -> str:
    """jax-ml/jax#23869: under an offload policy, a scan of checkpointed layers still keeps
    each layer's input (its carry, stacked over the steps) in device memory: the input of a
    jax.checkpoint-ed function is kept whatever its policy says, and a name on the body's
    output offloads nothing. The fix, checked by the kit (8 layers, float32[256, 128]
    activations, jax 0.8.0 and 0.10.2; the thread's miniature float32[1024, 256] alike):
    naming the input inside the body and offloading that name turns the f32[8,256,128]
    residual into f32<host>[8,256,128], with the same gradient."""
    r = stranded[0]
    at = f" ({where})" if where else ""
    returned = [w for w, _, out, _ in scan.offloads if out and w]
    output = (f"; your policy offloads {', '.join(repr(n) for n in returned)}, the body's "
              "output, which is the next step's input: nothing is offloaded for it"
              if returned else "")
    return (f"{format_bytes(sum(x.nbytes for x in stranded))} of the {format_bytes(kept)} "
            f"kept in device memory is the carry of the lax.scan{at} stacked over its {length} "
            f"steps ({r.dtype}{list(r.shape)}): each step's input to its jax.checkpoint-ed "
            "body, which JAX keeps whatever the policy says, so your offload policy leaves it "
            f"on the device{output} (jax-ml/jax#23869). Name it inside the body (x = "
            "checkpoint_name(x, 'layer_input')) and offload that name "
            "(names_which_can_be_offloaded=[..., 'layer_input']): its stack then goes to "
            f"{kind}.")


def _pairwise_note(pairwise: list[Residual], saved: int, found: tuple, arg: str,
                   temp: int | None, function: str) -> str:
    """openxla/xla#49131: residuals made by broadcasting two inputs against each other, then
    reduced over one of the two axes (a sum over j of f(x_i, y_j)). jax.checkpoint around it
    recomputes the whole M x N block at once in the backward pass; a scan over chunks of the
    reduced axis with jax.checkpoint on the chunk's body holds one chunk. Measured by the kit
    on the thread's N-body gradient, M = N = 2048, XLA's temporaries on the CPU: jax 0.10.2
    192 MiB, 240 MiB with jax.checkpoint, 24.67 KiB in 64 checkpointed chunks of 32; jax
    0.8.0 112, 96 and 1.02 MiB; the same gradient. Where XLA's compiled gradient holds far
    less than the residuals (the thread's RBF kernel on jax 0.10.2: 0 B against 64 MiB
    listed), XLA recomputes them inside its fusions, and the note says so instead."""
    shape, dtype, pair, which, made, reduced, _, _ = found
    size = shape[pair[which]]
    k = program_notes.chunk_size(size)
    n = size // k
    total = sum(r.nbytes for r in pairwise)
    head = (f"{format_bytes(total)} of the {format_bytes(saved)} kept are values over every "
            f"pair of two inputs' rows (the largest {dtype}{list(shape)}), made by broadcasting "
            f"them against each other ({made}) and then reduced over {size} ({reduced}).")
    if temp is not None and 2 * temp < total:
        return (f"{head} XLA's compiled jax.grad({function}) holds only {format_bytes(temp)} "
                "of temporaries: it recomputes them inside its fusions, so on this backend "
                "they cost no memory and nothing needs changing (openxla/xla#49131).")
    held = (f" XLA's compiled jax.grad({function}) holds {format_bytes(temp)} of temporaries."
            if temp is not None else "")
    ys = arg or "ys"
    return (f"{head}{held} jax.checkpoint around it keeps none of them but recomputes the whole "
            "block at once in the backward pass, which can raise the peak (openxla/xla#49131's "
            "N-body gradient, jax 0.10.2 on the CPU: XLA's temporaries 192 MiB became 240 "
            f"MiB). Sum over chunks instead: a lax.scan over {n} chunks of {k} of {ys} (the "
            "reduced axis), with jax.checkpoint on the chunk's body, holds one chunk at a time: "
            "jax.lax.scan(lambda acc, c: (acc + jax.checkpoint(f)(x, c), None), acc0, "
            f"{ys}.reshape({n}, {k}, ...)) (there: 192 MiB became 24.67 KiB, the same "
            "gradient).")


def _input_name(fn: Callable, args, kwargs, index: int) -> str:
    """The name of the ``index``-th array leaf of (args, kwargs), as the user calls it ("y",
    "params['w']"); "" where it cannot be told."""
    import inspect

    jax = devices.start_jax()
    try:
        paths = [p for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
        path = paths[index]
        if getattr(path[0], "idx", None) == 1:  # a keyword argument
            return f"{path[1].key}{jax.tree_util.keystr(path[2:])}"
        params = list(inspect.signature(fn).parameters.values())
        position = path[1].idx
        if position >= len(params) or params[position].kind not in (
                inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return ""
        return f"{params[position].name}{jax.tree_util.keystr(path[2:])}"
    except Exception:  # no signature, a leaf the jaxpr numbers otherwise
        return ""


def _compiled_gradient(fn: Callable, args, kwargs) -> compiled.CompiledStep | None:
    """XLA's program for ``jax.grad(fn)`` (by the first argument, as the user takes it),
    compiled, not run; None where it cannot be compiled (an output that is no scalar)."""
    jax = devices.start_jax()
    try:
        return compiled.compile_step(jax.grad(fn), *args, over_mesh=False, **kwargs)
    except Exception:  # an output that is no scalar, a backend that will not say
        return None


def _gradient_temp(fn: Callable, args, kwargs) -> int | None:
    """XLA's temporaries for ``jax.grad(fn)``, compiled, not run; None where it cannot be
    compiled."""
    c = _compiled_gradient(fn, args, kwargs)
    return None if c is None else _temp_of(c)


def _temp_of(c: compiled.CompiledStep) -> int | None:
    try:
        return int(c.sizes()["temp"])
    except Exception:  # a backend that will not say
        return None


def _one_checkpoint_temp(closed, where: str, device) -> int | None:
    """XLA's temporaries for the gradient of one of the ``jax.checkpoint`` calls made at
    ``where``, alone (by its inexact inputs, of the sum of its inexact outputs), compiled for
    ``device``, not run: what a lax.scan over such calls holds about, as it recomputes one at a
    time (jax-ml/jax#19822's layer: 4.00 MiB on jax 0.8.0, 0.10.2 and 0.11.2). None where it
    cannot be made or compiled."""
    jax = devices.start_jax()
    from jax.extend import core

    found = jaxpr_derivatives.checkpoint_at(closed, where)
    if found is None:
        return None
    body, policy = found
    avals = [v.aval for v in body.invars]
    inexact = [i for i, a in enumerate(avals)
               if jax.numpy.issubdtype(getattr(a, "dtype", None), jax.numpy.inexact)]
    if not inexact:
        return None
    call = jax.checkpoint(core.jaxpr_as_fun(core.ClosedJaxpr(body, [])), policy=policy)

    def loss(*xs):
        outs = [o for o in call(*xs) if jax.numpy.issubdtype(o.dtype, jax.numpy.inexact)]
        return sum(jax.numpy.sum(o.real) for o in outs)

    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    try:
        step = compiled.compile_step(jax.grad(loss, argnums=tuple(inexact)), *shapes,
                                     device=device, over_mesh=False)
    except Exception:  # a body this cannot call alone
        return None
    return _temp_of(step)  # (None: a backend that will not say)


#: arguments that are no arrays: ``jax.grad(loss)(x, 10)`` passes them to ``loss`` as they are
_PYTHON = (int, float, complex, str)


def _close_over_python(fn: Callable, args: tuple, kwargs: dict
                       ) -> tuple[Callable, tuple, dict, list[str]]:
    """``fn`` with its arguments that are Python numbers or strings closed over, as
    ``jax.grad(loss)(x, 10)`` passes its arguments after the first (jax-ml/jax#2956: a
    ``lax.fori_loop`` bound of 10 stays a Python int, so the loop is a scan, which the gradient
    can go through; traced, it is a while_loop, which it cannot). Their places hold None (no
    leaves), so every other leaf keeps its place and its name. A Python float or complex first
    argument stays: ``jax.grad`` differentiates it. (fn, args, kwargs, the names closed over:
    none and ``fn`` itself where there are none)."""
    import functools
    import inspect

    fixed = [i for i, a in enumerate(args) if isinstance(a, _PYTHON)
             and not (i == 0 and isinstance(a, (float, complex)))]
    named = [k for k, a in kwargs.items() if isinstance(a, _PYTHON)]
    if not fixed and not named:
        return fn, args, kwargs, []

    @functools.wraps(fn)
    def closed(*a, **k):
        a = tuple(args[i] if i in fixed else x for i, x in enumerate(a))
        return fn(*a, **{**k, **{n: kwargs[n] for n in named}})

    closed.__name__ = compiled.function_name(fn)
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # no signature
        params = []
    names = [params[i] if i < len(params) else f"argument {i}" for i in fixed] + named
    return (closed, tuple(None if i in fixed else a for i, a in enumerate(args)),
            {k: None if k in named else a for k, a in kwargs.items()}, names)


def _calls(closed, named: Callable[[str], bool]) -> bool:
    """Whether the jaxpr, or one nested in it, has an equation whose primitive's name
    ``named`` accepts."""
    return closed is not None and any(named(eqn.primitive.name)
                                      for j, _ in jaxpr_walk.walk(closed)
                                      for eqn in getattr(j, "eqns", ()))


def _over_leaves(fn: Callable, args, kwargs, jax) -> tuple[list, Callable]:
    """(the leaves of ``(args, kwargs)``, ``fn`` taking them flat): the function JAX's
    saved_residuals traces."""
    leaves, tree = jax.tree.flatten((args, kwargs))

    def flat(*leaves):
        a, k = jax.tree.unflatten(tree, leaves)
        return fn(*a, **k)

    return leaves, flat


def _fwd_rules(fn: Callable, args, kwargs, closed) -> dict[tuple, str]:
    """(shape, dtype, where made) -> the jax.custom_vjp fwd rule that returns it, for each
    residual of ``fn``'s gradient that one returns: traced as JAX's saved_residuals traces
    (the jaxpr of ``jax.linearize``'s linear function, whose inputs are the residuals), only
    where ``fn`` calls a custom_vjp function."""
    if not _calls(closed, lambda name: name.startswith("custom_vjp_call")):
        return {}
    jax = devices.start_jax()
    leaves, flat = _over_leaves(fn, args, kwargs, jax)
    try:
        linear = jax.make_jaxpr(lambda *xs: jax.linearize(flat, *xs)[1])(*leaves)
    except Exception:
        return {}
    return {(shape, dtype, where): rule
            for shape, dtype, where, rule in jaxpr_derivatives.custom_vjp_residuals(linear)}


def _vjp_jaxpr(fn: Callable, args, kwargs) -> tuple[object, int]:
    """(the jaxpr of ``jax.vjp`` of ``fn``, whose last outputs are the residuals, as JAX's
    saved_residuals traces it; how many residuals); (None, 0) where it cannot be traced."""
    jax = devices.start_jax()
    leaves, flat = _over_leaves(fn, args, kwargs, jax)
    try:
        traced, shapes = jax.make_jaxpr(lambda *xs: jax.vjp(flat, *xs),
                                        return_shape=True)(*leaves)
    except Exception:
        return None, 0
    return traced, len(jax.tree.leaves(shapes[1]))


def _shard_map_splits(traced, count: int, closed) -> list[tuple]:
    """``jaxpr_derivatives.shard_map_residuals`` of the gradient's jaxpr (:func:`_vjp_jaxpr`),
    only where ``fn`` calls ``shard_map``."""
    if traced is None or not _calls(closed, lambda name: name == "shard_map"):
        return []
    return jaxpr_derivatives.shard_map_residuals(traced, count)


def _reverse_mode_error(fn: Callable, args, kwargs) -> str:
    """JAX's own words where the backward pass of ``fn`` cannot be traced (a ``while_loop``
    that carries a value the gradient needs: "Reverse-mode differentiation does not work for
    lax.while_loop or lax.fori_loop with dynamic start/stop values", jax 0.8.0 and 0.10.2),
    traced as jax.grad traces it, nothing run; "" where it can."""
    jax = devices.start_jax()
    leaves, flat = _over_leaves(fn, args, kwargs, jax)

    def backward(*xs):
        out, pullback = jax.vjp(flat, *xs)
        return pullback(jax.tree.map(jax.numpy.ones_like, out))

    try:
        jax.make_jaxpr(backward)(*leaves)
    except Exception as err:  # the one about while_loop: another is no loop's to explain
        said = str(err).splitlines()[0] if str(err) else ""
        return f"{type(err).__name__}: {said}" if "while_loop" in said else ""
    return ""


def _while_error(fn: Callable, args, kwargs, closed, names: list[str]) -> str:
    """The words for a gradient that cannot go back through a ``while_loop`` (jax-ml/jax#2956):
    its line, the argument its bound comes from, JAX's error, the fix; "" where there is none
    or the gradient goes through it (a loop that carries nothing the gradient needs)."""
    loops = jaxpr_loops.while_loops(closed) if closed is not None else ()
    if not loops or not (said := _reverse_mode_error(fn, args, kwargs)):
        return ""
    where, bound = next(((w, b) for w, b in loops if b >= 0), loops[0])
    at = f" at {where}" if where else ""
    name = _input_name(fn, args, kwargs, bound) if bound >= 0 else ""
    traced = (f"Its bound comes from the argument {name}, an array, which is traced as jax.jit "
              f"traces its arguments: pass {name} as a Python int (marked static, "
              "jax.jit(step, static_argnums=...), where a jitted step takes it) so "
              "lax.fori_loop makes a lax.scan the gradient can go back through, or use "
              "lax.scan with a fixed length."
              if name else
              "Use lax.scan with a fixed number of steps (or lax.fori_loop with Python-int "
              "bounds, which makes one), masking the steps past the end (a loop until "
              "convergence: a largest count, the steps after it converged keeping the carry, "
              "jnp.where(done, carry, step(carry)); google-deepmind/mujoco#3264), or a "
              "jax.custom_vjp for the loop.")
    kept = (f" (The kit passed {', '.join(names)} as given, as jax.grad passes the arguments "
            "it does not differentiate.)" if names else "")
    return (f"jax.grad({compiled.function_name(fn)}) cannot go back through the "
            f"lax.while_loop{at}: reverse-mode differentiation does not work for a "
            "while_loop, and a lax.fori_loop whose bounds are traced is one (jax-ml/jax#2956). "
            f"JAX raises {said} {traced}{kept}")


def _gathered_note(gathered: list[Residual], kept: int) -> str:
    """The words for whole weights a shard_map body gathers from their shards and the gradient
    keeps (jax-ml/jax#25010, FSDP by hand): per device, with the all_gather's line and the
    fix, checked: 4 layers of float32[1024, 1024] kept 73.00 MiB summed over 4 devices
    (18.25 MiB each, 16 of them gathered weights); with jax.checkpoint on the layer, gather
    included, 4.00 MiB (1 MiB each). XLA's plan on the CPU kept 16 MiB of temporaries both
    ways (jax 0.8.0 and 0.10.2)."""
    r = gathered[0]
    lines = sorted({x.gathered_at for x in gathered})
    each = sum(x.nbytes // x.devices for x in gathered)
    return (f"{format_bytes(each)} of the {format_bytes(kept)} each device keeps are whole "
            f"arrays that the all_gather at {', '.join(lines)} gathers from their shards "
            f"({len(gathered)} of {r.dtype}{list(r.device_shape)}, on every device): jax.grad "
            "keeps each one gathered for the backward pass. Wrap the layer, gather included, "
            "in jax.checkpoint (or name the gathered value with checkpoint_name and leave it "
            "out of the policy's saved names), so only the shard is kept and the gather runs "
            "again in the backward pass. Fewer residuals need not mean a lower peak: compare "
            "preflight_step(jax.grad(loss), ...) before and after (in jax#25010's miniature, 4 "
            "layers of float32[1024, 1024] on 4 CPU devices, the residuals fell from 73 to 4 "
            "MiB and XLA's temporaries stayed at 16 MiB).")


def _jitted_name(source: str) -> str:
    """The inner jit JAX's words name ("output of jitted function '_one_hot' from ..."), ""
    for none."""
    m = re.match(r"output of jitted function '([^']+)'", source)
    return m.group(1) if m else ""


def _fused(candidates: list[Residual], made_at: dict, step: compiled.CompiledStep
           ) -> list[Residual]:
    """Those of ``candidates`` that XLA's compiled gradient holds no buffer of: no value the
    program materializes has its shape or its bytes and was made where it was (inside its inner
    jit, as XLA's op_name says, or at its line). XLA recomputes such a value inside the
    fusions that read it (google/flax#2051: a one-hot of the labels)."""
    values = step.values
    out = []
    for r in candidates:
        name, where = _jitted_name(r.source), made_at[id(r)]
        there = [v for v in values if (f"jit({name})" in v["op"] if name else
                                       bool(v["source"]) and frames.where(*v["source"]) == where)]
        if values and not any(tuple(v["shape"]) == r.shape or v["nbytes"] == r.nbytes
                              for v in there):
            out.append(r)
    return out


def _fused_note(fused: list[Residual], saved: int, temp: int, function: str) -> str:
    """google/flax#2051: JAX lists a value made from integers alone (a one-hot of the labels)
    among what the gradient keeps; XLA recomputes it inside the fusions that read it and holds
    no buffer of it. Measured by the kit (the thread's cross-entropy, 2048 labels over 8192
    classes, XLA's temporaries for jax.grad on the CPU): one-hot 64.02 MiB, integer labels with
    take_along_axis 64.03 MiB on jax 0.10.2; 4.00 and 66.12 MiB on jax 0.8.0."""
    r = fused[0]
    total = sum(x.nbytes for x in fused)
    return (f"{format_bytes(total)} of the {format_bytes(saved)} kept (the largest, "
            f"{r.dtype}{list(r.shape)}, {r.source}) is made from integers alone, and XLA's "
            f"compiled jax.grad({function}) ({format_bytes(temp)} of temporaries) holds no "
            "buffer of it: it recomputes it inside the fusions that read it, so on this "
            "backend it costs no memory and needs no change (google/flax#2051: a one-hot of "
            "the labels; integer labels gave the same temporaries on jax 0.10.2, 64.03 against "
            "64.02 MiB).")


def _wide_note(hits: list[Residual], saved: int, found: tuple, rows_name: str,
               temp: int | None, function: str) -> str:
    """apple/axlearn#1236, google/flax#2858: a product over a wide axis (full-vocabulary
    logits, attention scores) that what follows reduces over that axis (a logsumexp, a
    softmax): the gradient keeps the whole product. jax.checkpoint around it keeps less but
    recomputes the whole product at once in the backward pass. Measured by the kit, XLA's
    temporaries for jax.grad on the CPU, jax 0.8.0 and 0.10.2 alike: the thread's loss over
    1024 tokens, a hidden size of 256 and 8192 classes, 64.01 MiB; the same with jax.checkpoint
    around the loss or the dots_with_no_batch_dims_saveable policy; 12.13 MiB in a lax.scan over
    8 chunks of 128 tokens with jax.checkpoint on the chunk, the same loss and gradient.
    flax#2858's causal attention (2 x 1024 tokens, 4 heads of 64), by q, k and v: 130.06 MiB
    (132.03 on 0.8.0), 102.06 (130.03) with jax.checkpoint, 20.51 (24.51) in 8 checkpointed
    query chunks of 128."""
    shape, dtype, wide, k, rows, made, reduced, _, _ = found
    chunk = program_notes.chunk_size(rows)
    total = sum(r.nbytes for r in hits)
    of = f" of {rows_name}" if rows_name else ""
    held = (f" XLA's compiled jax.grad({function}) holds {format_bytes(temp)} of temporaries."
            if temp is not None else "")
    return (f"{format_bytes(total)} of the {format_bytes(saved)} kept are {dtype}{list(shape)}, "
            f"a product over {wide} columns against a contracted size of {k} ({made}), and the "
            f"values made from it, which {reduced} reduces over those {wide} columns: "
            "full-vocabulary logits under a logsumexp, or attention scores under a softmax. "
            f"The gradient keeps the whole product for all {rows} rows.{held} jax.checkpoint "
            "around it (or a policy such as dots_with_no_batch_dims_saveable) recomputes the "
            "whole product at once in the backward pass and does not lower XLA's peak "
            "(apple/axlearn#1236's loss on the CPU: 64.01 MiB of temporaries either way). "
            f"Compute it in chunks of rows instead: a lax.scan (or lax.map) over {rows // chunk} "
            f"chunks of {chunk} of the {rows} rows{of}, with jax.checkpoint on the chunk's body, "
            "holds "
            "one chunk's product at a time (there: 64.01 -> 12.13 MiB, the same gradient; "
            "attention in query chunks, google/flax#2858, jax 0.10.2: 130.06 -> 20.51 MiB).")


def _loop_checkpoint_note(where: str, count: int, saved: int, temp: int, function: str,
                          one: int | None = None) -> str:
    """jax-ml/jax#19822 and #27748: jax.checkpoint on each layer (or block) in a Python loop
    leaves little kept, yet XLA's plan for the gradient can hold far more: it schedules the
    layers' recomputations as it likes, and can run them together before the backward pass
    uses them. A lax.scan over the layers with jax.checkpoint on the body recomputes one at a
    time. Measured by the kit, XLA's temporaries for jax.grad on the CPU, jax 0.10.2 (0.8.0):
    jax#19822's 10 layers of a random 512 x 512 matrix, plain 13.02 MiB (41.02), checkpointed
    in the Python loop 14.02 (41.02), a lax.scan over the checkpointed layers 6.02 (6.02);
    jax#27748's 10 blocks of a 100-step scan over a float32[300, 100] carry, each block
    checkpointed in the Python loop 126.24 MiB (126.24), one lax.scan over the checkpointed
    blocks 13.16 (12.93). ``one``: the gradient of one of the calls alone
    (:func:`_one_checkpoint_temp`). Where ``temp`` is under twice that, XLA already recomputes
    them one at a time, and a scan has nothing to take: jax 0.11.2 holds 4.02 MiB for
    jax#19822's loop, one layer alone 4.00, the scan 6.02."""
    alone = f" (one of them alone: {format_bytes(one)})" if one is not None else ""
    if one is not None and temp < 2 * one:
        return (f"jax.checkpoint is applied {count} times at {where}, once per layer or block "
                f"of a Python loop: the gradient keeps only {format_bytes(saved)}, and XLA's "
                f"compiled jax.grad({function}) holds {format_bytes(temp)} of temporaries, "
                f"under twice what one of them alone holds ({format_bytes(one)}): XLA "
                "recomputes them one at a time, and a lax.scan over them would not hold less "
                "(jax-ml/jax#19822 on jax 0.11.2 on the CPU: 4.02 MiB in the loop, 6.02 in a "
                "scan; jax 0.10.2 ran them together: 14.02).")
    return (f"jax.checkpoint is applied {count} times at {where}, once per layer or block of a "
            f"Python loop: the gradient keeps only {format_bytes(saved)}, yet XLA's compiled "
            f"jax.grad({function}) holds {format_bytes(temp)} of temporaries{alone}. XLA "
            f"schedules the {count} recomputations as it likes and can run them together "
            "before the backward pass uses them (jax-ml/jax#19822, #27748). Make the layers (or "
            "blocks) one lax.scan over their stacked parameters or inputs, with jax.checkpoint "
            "on the body: a scan recomputes one at a time (jax 0.10.2 on the CPU, jax#19822: "
            "14.02 -> 6.02 MiB; jax#27748: 126.24 -> 13.16 MiB).")


def _whole_checkpoint_note(temp: int | None, function: str) -> str:
    """jax-ml/jax#19822: jax.checkpoint around the whole function differentiated keeps only its
    arguments, and its backward pass recomputes the whole function at once, so XLA's peak for
    the gradient does not fall. Measured by the kit (the thread's 10 layers of a random
    512 x 512 matrix, XLA's temporaries for jax.grad on the CPU): 13.02 MiB with and without
    it on jax 0.10.2 (41.02 on 0.8.0); 6.02 MiB with a lax.scan over the layers, each
    jax.checkpoint-ed, on both."""
    held = (f": XLA's compiled jax.grad({function}) holds {format_bytes(temp)} of "
            "temporaries" if temp is not None else "")
    return (f"jax.checkpoint wraps the whole of {function}: the gradient keeps nothing beyond "
            "its arguments, but the backward pass recomputes the whole function at once, so "
            "every layer's values are live together again and XLA's peak stays where it was "
            f"without the checkpoint{held} (jax-ml/jax#19822, jax 0.10.2 on the CPU: 13.02 MiB "
            "with it and without). "
            "Checkpoint each layer inside a lax.scan over the layers instead, which recomputes "
            "one at a time (there: 6.02 MiB).")


def _generic_note(kept: int) -> str:
    """What jax.checkpoint can do where the kit sees nothing more specific: it trades residuals
    for recomputation, and whether XLA's peak falls depends on how it schedules the
    recomputation (jax-ml/jax#19822, its 10 layers measured by the kit: XLA's temporaries for
    jax.grad on the CPU 13.02 MiB, 14.02 with jax.checkpoint on each layer of the Python loop,
    6.02 in a lax.scan over the checkpointed layers on jax 0.10.2; 41.02, 41.02, 6.02 on
    0.8.0; 13.02, 4.02, 6.02 on 0.11.2, whose XLA recomputes the loop's layers one at a
    time)."""
    return (f"{format_bytes(kept)} is kept between the forward and backward pass. "
            "jax.checkpoint on the largest layer keeps only its inputs and recomputes the rest "
            "in the backward pass, but XLA plans the gradient's buffers itself, so fewer "
            "residuals need not mean a lower peak: on each layer of a Python loop it did not "
            "fall on jax 0.10.2 (jax-ml/jax#19822 on the CPU: 13.02 MiB of XLA's temporaries "
            "became 14.02; jax 0.11.2 recomputes the layers one at a time: 4.02), in a "
            "lax.scan over the jax.checkpoint-ed layers it did on both (6.02 MiB): compare "
            "preflight_step(jax.grad(loss), ...) before and after.")


def residuals(fn: Callable, *args, **kwargs) -> Residuals:
    """What ``jax.grad(fn)`` keeps from the forward pass, from JAX's own list
    (``jax.ad_checkpoint.print_saved_residuals``): each array, its size and where it was made.
    Arrays or ``jax.ShapeDtypeStruct`` shapes; nothing runs. ``fn`` is the function whose
    gradient is taken (the loss), not the whole training step. What a jax.checkpoint policy
    offloads to host memory is counted apart (``offloaded_bytes``) from what waits in device
    memory (``saved_bytes``). Arguments that are Python numbers or strings are passed as they
    are, as ``jax.grad(loss)(x, 10)`` passes the arguments it does not differentiate (a
    ``lax.fori_loop`` bound stays static); a gradient that cannot go back through a
    ``while_loop`` raises :class:`~helpers.errors.BadInputError` with the loop's line, where
    its bound comes from and the fix (jax-ml/jax#2956).

    >>> import jax.numpy as jnp
    >>> r = residuals(lambda w, x: jnp.sum(jnp.sin(x @ w)), jnp.ones((3, 3)), jnp.ones((5, 3)))
    >>> r.saved_bytes  # cos(x @ w), a 5x3 float32 array, kept for the backward pass
    60
    """
    devices.start_jax()  # JAX can start here, or a BackendError says why
    if not callable(fn):
        raise BadInputError(f"fn must be a function, got {fn!r}")
    given = (args, kwargs)
    fn, args, kwargs, static = _close_over_python(fn, args, kwargs)
    saved = jaxcompat.verify("saved_residuals")
    try:
        found = saved(fn, *args, **kwargs)
    except Exception as err:
        raise BadInputError(f"{compiled.function_name(fn)} could not be differentiated on "
                            f"these arguments ({compiled.describe_arguments(given)})"
                            f"{compiled.user_line(err)}: "
                            f"{type(err).__name__}: {str(err).splitlines()[0]}") from None
    lengths_run, carries, steps, closed, every = _scans(fn, args, kwargs)
    if said := _while_error(fn, args, kwargs, closed, static):
        raise BadInputError(said)
    traced, count = _vjp_jaxpr(fn, args, kwargs)
    sources = jaxpr_derivatives.residual_sources(traced, count) if traced is not None else []
    if [s[:2] for s in sources] != [(tuple(a.shape), str(a.dtype)) for a, _ in found]:
        sources = []  # they do not pair one for one: the kit reads JAX's words alone
    forward: dict[tuple[int, str], int] = {}  # the gradient's top-level scans of each key
    for eqn in getattr(getattr(traced, "jaxpr", None), "eqns", ()):
        if eqn.primitive.name == "scan":
            key = (int(eqn.params["length"]), jaxpr_walk.equation_where(eqn))
            forward[key] = forward.get(key, 0) + 1
    rules = _fwd_rules(fn, args, kwargs, closed)
    offloads = jaxpr_derivatives.checkpoint_offloads(closed) if closed is not None else ()
    kinds = {kind for _, kind, _, _ in offloads}
    splits: dict[tuple, list[tuple]] = {}  # (shape, dtype) -> how shard_maps split such
    for split in _shard_map_splits(traced, count, closed):
        splits.setdefault(split[:2], []).append(split[2:])
    out, made_at, source_of = [], {}, {}
    for n, (aval, source) in enumerate(found):
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize
        shape, dtype, where = tuple(aval.shape), str(aval.dtype), _made_at(str(source))
        is_argument = str(source).startswith("from the argument")
        split = splits[(shape, dtype)].pop(0) if not is_argument and splits.get((shape, dtype)) \
            else (1, (), "", ())
        out.append(Residual(shape, dtype, nbytes, _short(str(source)), is_argument,
                            rules.get((shape, dtype, where), ""), _memory(aval, kinds),
                            *split[:3]))
        made_at[id(out[-1])] = where
        source_of[id(out[-1])] = sources[n] if sources else None
    out.sort(key=lambda r: (r.memory != "device", -r.nbytes))
    extra = [r for r in out if not r.is_argument and r.memory == "device"]
    offloaded = [r for r in out if not r.is_argument and r.memory != "device"]

    def stacked(r: Residual) -> bool:
        """A scan's output stacked over its steps: its final carry, also "output of scan",
        does not grow with the length."""
        if (src := source_of[id(r)]) is not None and src[4] is not None:
            return src[4][3] and bool(r.shape)
        return r.source.startswith("output of scan") and bool(r.shape) and (
            lengths_run is None or (r.shape[0] in lengths_run
                                    and (r.shape, r.dtype) not in carries))

    scans = [r for r in extra if stacked(r)]
    saved_bytes, scan_bytes = sum(r.nbytes for r in extra), sum(r.nbytes for r in scans)
    lengths = tuple(sorted({r.shape[0] for r in scans}))
    by_rule = [r for r in extra if r.fwd_rule]
    # jax#23869: a checkpointed scan body's input, stacked, left in device memory by an
    # offload policy (the body's, or one that offloads residuals elsewhere)
    stranded: dict[tuple[int, str], list[Residual]] = {}
    for r in scans:
        key = (r.shape[0], made_at[id(r)])
        scan = steps.get(key)
        if scan is not None and scan.checkpointed and (r.shape[1:], r.dtype) in scan.carries \
                and (scan.offloads or offloaded):
            stranded.setdefault(key, []).append(r)
    pairs = jaxpr_products.pairwise_reductions(closed) if closed is not None and extra else ()
    pairwise, pair = [], None
    for found_pair in pairs:
        shape, a, b = found_pair[0], *found_pair[2]
        hits = [r for r in extra if len(r.shape) > max(a, b)
                and (r.shape[a], r.shape[b]) == (shape[a], shape[b])]
        if sum(r.nbytes for r in hits) > sum(r.nbytes for r in pairwise):
            pairwise, pair = hits, found_pair
    wide, reduction = [], None
    for found_wide in (jaxpr_products.wide_reductions(closed)
                       if closed is not None and extra else ()):
        along = {shape for shape, _ in found_wide[8]}
        hits = [r for r in extra if r.shape in along]
        if sum(r.nbytes for r in hits) > sum(r.nbytes for r in wide):
            wide, reduction = hits, found_wide
    name = compiled.function_name(fn)
    names = list(dict.fromkeys(what for what, _, returned, _ in offloads
                               if what and not returned))
    lead = _offloaded_note(offloaded, saved_bytes, names) if offloaded else ""
    # google/flax#2051: values made from integers alone (a one-hot) that XLA fuses away
    integers = [r for r in extra if (src := source_of[id(r)]) is not None and src[5]
                and src[2] >= 0 and r not in scans]
    fused: list[Residual] = []
    if integers and 4 * sum(r.nbytes for r in integers) >= saved_bytes and not pairwise:
        step = _compiled_gradient(fn, args, kwargs)
        fused = _fused(integers, made_at, step) if step is not None else []
        if fused:
            lead = f"{lead} {_fused_note(fused, saved_bytes, step.sizes()['temp'], name)}"
    kept = saved_bytes - sum(r.nbytes for r in fused)
    repeated = jaxpr_derivatives.repeated_checkpoints(closed) if closed is not None else ()
    advice = ""
    if stranded:
        key, held = max(stranded.items(), key=lambda kv: sum(r.nbytes for r in kv[1]))
        kind = next(iter(kinds)) if len(kinds) == 1 else "host memory"
        advice = _carry_note(held, saved_bytes, key[1], key[0], steps[key], kind)
    elif by_rule and 2 * sum(r.nbytes for r in by_rule) >= saved_bytes:
        r = by_rule[0]
        advice = (f"{format_bytes(sum(x.nbytes for x in by_rule))} of the "
                  f"{format_bytes(saved_bytes)} kept are residuals the jax.custom_vjp fwd rule "
                  f"{r.fwd_rule} returns (the largest, {r.dtype}{list(r.shape)}, {r.source}). "
                  + program_notes.fwd_rule_fix(r.fwd_rule))
    elif scan_bytes and 4 * scan_bytes >= saved_bytes:  # (a few KiB of a scan's steps beside
        # a large carry: chunks save nothing, and a trial's peak rose following them, jax#15906)
        advice = _scan_advice(scans, saved_bytes, scan_bytes, lengths, made_at, source_of,
                              every, forward, jaxpr_loops.chained_scans(closed) if closed else ())
    elif pair is not None and pair[6] >= 0 and 2 * sum(r.nbytes for r in pairwise) >= saved_bytes:
        # (the reduced axis runs along an input: chunks of it are what a scan can take; a
        # one-hot against jnp.arange is no pair of inputs, and its fix is take_along_axis)
        arg = _input_name(fn, args, kwargs, pair[6])
        advice = _pairwise_note(pairwise, saved_bytes, pair, arg,
                                _gradient_temp(fn, args, kwargs), name)
    elif 2 * sum(r.nbytes for r in extra if r.gathered_at) >= saved_bytes > 0:
        advice = _gathered_note([r for r in extra if r.gathered_at],
                                sum(r.nbytes // r.devices for r in extra))
    elif reduction is not None and 2 * sum(r.nbytes for r in wide) >= saved_bytes:
        rows = _input_name(fn, args, kwargs, reduction[7]) if reduction[7] >= 0 else ""
        advice = _wide_note(wide, saved_bytes, reduction, rows,
                            _gradient_temp(fn, args, kwargs), name)
    elif repeated and (step := _compiled_gradient(fn, args, kwargs)) is not None \
            and (temp := _temp_of(step)) is not None and temp >= 4 * max(saved_bytes, 1):
        where, times = max(repeated, key=lambda wn: wn[1])
        one = _one_checkpoint_temp(closed, where, step.device)
        advice = _loop_checkpoint_note(where, times, saved_bytes, temp, name, one)
    elif not saved_bytes and closed is not None and jaxpr_derivatives.wholly_checkpointed(closed):
        advice = _whole_checkpoint_note(_gradient_temp(fn, args, kwargs), name)
    elif kept:
        advice = _generic_note(kept)
    advice = f"{lead} {advice}".strip()
    return Residuals(name, tuple(out), saved_bytes, scan_bytes, lengths,
                     advice, sum(r.nbytes for r in offloaded),
                     "/".join(sorted({r.memory for r in offloaded})),
                     sum(r.nbytes // r.devices for r in extra), max((r.devices for r in out),
                                                                     default=1))


def _scan_advice(scans: list[Residual], saved: int, scan_bytes: int, lengths: tuple[int, ...],
                 made_at: dict, source_of: dict, every: dict, forward: dict,
                 chained: frozenset | tuple) -> str:
    """The words for scan outputs stacked over their steps: the scan that stacks the most, one
    equation each (a Python loop of scans made by one line is several: jax-ml/jax#27748), and
    what jax.checkpoint can do for it (:func:`program_notes.checkpoint_fix`); for checkpointed
    blocks of one long scan in a Python loop (``chained``), one scan over the blocks."""
    per_scan: dict[tuple, int] = {}  # (length, where, the scan's place): the bytes it stacks
    for r in scans:
        src = source_of[id(r)]
        key = (r.shape[0], made_at[id(r)], src[4][2] if src is not None and src[4] else -1)
        per_scan[key] = per_scan.get(key, 0) + r.nbytes
    (length, where, ordinal), most = max(per_scan.items(), key=lambda kv: kv[1])
    alike = sum(1 for k in per_scan if k[:2] == (length, where))
    scan = _scan_of(every, (length, where), ordinal, forward.get((length, where), 0)) \
        if ordinal >= 0 else _scan_of(every, (length, where), 0, -1)
    fix = ("If the scan's body is not wrapped in jax.checkpoint yet, wrapping it keeps only "
           "each step's carry and recomputes the rest in the backward pass; if it is, a "
           "shorter scan (or fewer layers) is what shrinks it.")
    if scan is not None:
        fix = program_notes.checkpoint_fix(length, most // length, scan.carry_bytes,
                                           scan.checkpointed, scan.chunked)
    several, blocks = "", ""
    if alike > 1:
        several = (f" {alike} scans of {length} steps are made at {where}, each its own "
                   f"(a Python loop of scans); the largest stacks {format_bytes(most)}.")
        if scan is not None and scan.checkpointed and not scan.chunked \
                and (length, where) in chained:
            blocks = (f" One lax.scan over the {alike} blocks with jax.checkpoint on the "
                      "block keeps one carry per block and recomputes one block at a time "
                      "(jax-ml/jax#27748, jax 0.10.2 on the CPU: XLA's temporaries 115.02 -> "
                      "13.16 MiB).")
    return (f"{format_bytes(scan_bytes)} of the {format_bytes(saved)} kept are scan outputs "
            f"stacked over {', '.join(map(str, lengths))} steps, so they grow with the length."
            f"{several} {fix}{blocks}")


def _widened_constants(c: compiled.CompiledStep) -> tuple[tuple[str, int, str], ...]:
    """The closed-over float32 arrays the step widens to float64
    (:func:`jaxpr_values.narrow_constants_widened`), where x64 may have been off when they
    were made: not where it was on from the start (the backend-start hook saw it, or
    JAX_ENABLE_X64 asked for it at import), where float32 was the user's choice."""
    at_start = jaxcompat.x64_at_start()
    if c.jaxpr is None or at_start is True or (at_start is None
                                               and jaxcompat.x64_asked(os.environ)):
        return ()
    return jaxpr_values.narrow_constants_widened(c.jaxpr)
