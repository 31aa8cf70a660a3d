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
  temporaries and their lines (what the program holds: :mod:`helpers.compiled`), and what the
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

from helpers import allocation, compiled, devices, step_arguments
from helpers._internal import frames, jaxcompat, jaxprs
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record
from helpers.datasets import read_header
from helpers.errors import BadInputError, FileError
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes

if TYPE_CHECKING:
    import jax

__all__ = ["FIX", "Preflight", "Residual", "Residuals", "StepPreflight",
           "TensorInfo", "judge", "preflight",
           "preflight_step", "residuals"]

FIX = ("load it into host memory instead, without JAX: `safetensors.numpy.load_file(path)` "
        "(about the file's size) or a read-only numpy.memmap of the data (pages from the file), "
        "then `jax.device_put` one batch at a time. `safetensors.flax.load_file` under "
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
            f"{format_bytes(free)} free: load with safetensors.numpy.load_file (about 1x) "
            "or a numpy.memmap, and jax.device_put it in batches.")]))
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
    #: what the runtime takes outside XLA's plan (the CPU's weight-gradient convolution copies),
    #: counted in ``peak_bytes``
    runtime_bytes: int = 0
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
    #: ("float32[512, 512]", bytes, line) of each array the step multiplies by the constant 0.0
    scaled_by_zero: tuple[tuple[str, int, str], ...] = ()
    #: each floating argument the step reads only through a cast to a narrower type (float32
    #: parameters under a bfloat16 computation), unless an output has its shape and dtype (a
    #: gradient, an update: master weights)
    narrowed_arguments: tuple[step_arguments.NarrowedArgument, ...] = ()
    #: (what, its dtype, the wider dtype, bytes at that dtype, line) of each value jnp's
    #: promotion widens before a dot or a convolution: a NumPy float64 scalar under x64
    #: (jax-ml/jax#1830), a float32 batch against bfloat16 parameters (jax-ml/jax#7368)
    widened_values: tuple[tuple[str, str, str, int, str], ...] = ()
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


#: operations that hand a value to the host: under GSPMD they take it whole (jax#25842)
_CALLBACKS = tuple(jaxprs.CALLBACKS)


#: the operations that cut a part of an array: where one gathers a split argument whole, the
#: part was cut along the split dimension
_SLICES = ("dynamic_slice", "slice")


def _gathered(temporaries, args, kwargs, text: str | None = None) -> list:
    """The large temporaries (1 MiB or more) with the whole shape of an argument split over
    several devices: of a callback (jax.debug.print, a host callback), a value gathered from its
    shards to be handed to the host; of a slice, only where XLA's program (``text``) all-gathers
    a value of that shape: the argument gathered whole onto each device to cut a part along its
    split dimension (apple/axlearn#993: a minibatch sliced from a batch split over devices). A
    gather a sharded layer makes by design (FSDP's weights) is neither."""
    whole = {tuple(leaf.shape) for leaf in devices.start_jax().tree.leaves((args, kwargs))
             if compiled.devices_split_over(leaf) > 1}
    gathers = jaxcompat.all_gather_shapes(text or "")
    return [t for t in temporaries if tuple(t.shape) in whole and t.nbytes >= 2**20
            and (t.op in _CALLBACKS or (t.op in _SLICES and tuple(t.shape) in gathers))]


def _jacobian_note(r: compiled.Jacobian, held: compiled.Temporary) -> str:
    """A Jacobian made the long way: jax.jacrev over a function with more outputs than inputs
    (jax#215), or jax.jacfwd over one with more inputs than outputs (jax#719); ``held``: the
    largest value XLA's plan holds for its batch (its first dimension).
    Measured by the kit: jax#215's function with 5,120 outputs of 20 inputs, a peak of 107 MiB
    with jacrev and 401 KiB with jacfwd on jax 0.10.2, whose plan holds the 100 MiB identity;
    6.8 MiB and 401 KiB on jax 0.8.0, whose plan fuses the identity away."""
    at = f" ({r.line})" if r.line else ""
    if r.mode == "reverse":
        made, one, other, fix, how = ("row per output", "output", "input", "jax.jacfwd",
                                      "pulling back")
    else:
        made, one, other, fix, how = ("column per input", "input", "output", "jax.jacrev",
                                      "pushing forward")
    others = f"{r.other_way:,} {other}{'s' if r.other_way != 1 else ''}"
    return (f"jax.{'jacrev' if r.mode == 'reverse' else 'jacfwd'}{at} makes its Jacobian one "
            f"{made} of the function, all {r.batch:,} at once under vmap ({how} an identity "
            f"of {r.batch:,} x {r.batch:,}), for {others}: XLA's plan holds {held.op} "
            f"{held.dtype}{list(held.shape)} ({format_bytes(held.nbytes)}) for them. With "
            f"more {one}s than {other}s, {fix} makes the same Jacobian one "
            f"{'column' if r.mode == 'reverse' else 'row'} per {other} ({others} here) and "
            "needs far less.")


def _basis_note(r: compiled.Jacobian, t: compiled.Temporary, count: int = 1,
                total: int = 0) -> str:
    """The largest values made under a vmap that is a Jacobian's own: jax.jacfwd (jax.hessian
    is jacfwd(jacrev(f))) pushes its whole basis of tangents forward at once, jax.jacrev pulls
    its whole basis back, so each value of the function is made once per basis vector
    (jax-ml/jax#787: 551 GB asked for a 221 MB Hessian). Measured by the kit on the CPU, a
    pairwise-distance energy of 96 atoms: jax.hessian 51.79 MiB of temporaries on jax 0.10.2,
    51.47 MiB on 0.8.0; the HVP over the basis in chunks of 8, 1.85 MiB on both."""
    at = f", {t.line}" if t.line else ""
    what = (f"The largest value, {t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}{at}), "
            "is" if count == 1 else
            f"{count} values from one line, {format_bytes(total)} together (the largest, {t.op} "
            f"{t.dtype}{list(t.shape)}, {format_bytes(t.nbytes)}{at}), are")
    if r.mode == "forward":
        who, how, plain = ("jax.jacfwd (jax.hessian is jacfwd(jacrev(f)))", "pushes forward",
                           "for jax.jacfwd of f, jax.jvp(f, (x,), (v,))[1] the same way makes "
                           "its columns")
    else:
        who, how, plain = ("jax.jacrev", "pulls back", "for jax.jacrev of f, jax.vjp(f, x)[1](u)"
                           "[0] over the rows u of jnp.eye(m) makes its rows")
    return (f"{what} made for all {r.batch:,} basis vectors at once, under the vmap of "
            f"{who}, which {how} the whole identity of {r.batch:,} x {r.batch:,}. Make it a "
            "few rows at a time instead, for a Hessian jax.lax.map(lambda v: jax.jvp(jax.grad(f), "
            "(x,), (v,))[1], jnp.eye(n).reshape(n, *x.shape), batch_size=k) with "
            f"n = {r.batch:,} ({plain}); such values shrink to k of the {r.batch:,}.")


def _batched_by_line(c: compiled.CompiledStep, peak: int, most: int = 16
                     ) -> list[tuple[compiled.Temporary, int, int]]:
    """(the largest, how many, their bytes, whether one is a scatter) of the values made under
    jax.vmap, per line of the user's code, where they come to a quarter of the peak or more,
    largest first (one line can make several: each of a layer's weights, drawn for every layer
    at once; equinox#673)."""
    lines: dict[str, list[compiled.Temporary]] = {}
    for t in c.temporaries(most):
        if t.batched:
            lines.setdefault(t.line or f"({t.op})", []).append(t)
    out = [(max(ts, key=lambda t: t.nbytes), len(ts), sum(t.nbytes for t in ts),
            any(t.op == "scatter" for t in ts)) for ts in lines.values()]
    return sorted([b for b in out if b[2] * 4 >= peak], key=lambda b: -b[2])


def _batched_note(t: compiled.Temporary, count: int = 1, total: int = 0,
                  scattered: bool = False) -> str:
    """The largest value made under jax.vmap for the whole batch at once, and how to make it
    in chunks: under a derivative, chunks alone keep every chunk's values for the backward
    pass (jax#8409: 16 MiB of temporaries with vmap, 40 MiB with lax.map(f, batch_size=8),
    2 MiB with lax.map(jax.checkpoint(f), batch_size=8); measured by the kit on jax 0.10.2).
    A lax.cond whose predicate vmap batches is a select: both branches run. An ``.at[i]``
    update whose index vmap batches (``scattered``) copies the whole operand for every element
    (scatter's batching rule; jax-ml/jax#23358: 16 MiB under vmap, 0 B computed without the
    updated array, jax 0.10.2)."""
    at = f", {t.line}" if t.line else ""
    head = (f"The largest value, {t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}"
            f"{at}), is made under jax.vmap for every element of the batch at once, as the "
            "vectorized code would be")
    if count > 1:
        head = (f"{count} values from one line, {format_bytes(total)} in all (XLA may reuse "
                f"one's buffer for another), are made "
                f"under jax.vmap for every element of the batch at once, as the vectorized code "
                f"would be (the largest, {t.op} {t.dtype}{list(t.shape)}, "
                f"{format_bytes(t.nbytes)}{at})")
    cond = t.op == "select_n" and re.search(r"\bcond\(", t.line) is not None
    if cond:
        head += (". A lax.cond whose predicate jax.vmap batches becomes a select (XLA has no "
                 "batched conditional), so both branches run for every element")
    at_update = scattered and ".at[" in t.line
    if at_update:
        head += (". An .at[...] update whose index jax.vmap batches copies the whole array it "
                 "updates for every element (scatter's batching rule), though each changes one "
                 "place")
    if t.in_derivative:
        fix = ("under the derivative, jax.lax.map(f, xs, batch_size=k) alone keeps every "
               "chunk's values for the backward pass; jax.lax.map(jax.checkpoint(f), xs, "
               "batch_size=k) recomputes each chunk instead, and such values shrink in "
               "proportion")
    else:
        fix = ("jax.lax.map(f, xs, batch_size=k) computes k elements at a time, and such "
               "values shrink in proportion")
    if cond:
        fix += ("; without batch_size, jax.lax.map keeps the predicate unbatched, so only the "
                "branch taken runs" + (" (jax.lax.map(jax.checkpoint(f), xs) under the "
                                       "derivative)" if t.in_derivative else ""))
    if at_update:
        fix = ("compute what you need without making the updated array (for .at[i].set(v)"
               ".sum(): x.sum() - x[i] + v, jax-ml/jax#23358), or " + fix)
    return f"{head}: {fix}."


def _stacked_indices(temporaries, peak: int) -> str:
    """The largest value is integer indices stacked into one array on a line that indexes (x[a,
    b, c] with index arrays, or x[tuple(columns)]): JAX stacks the index arrays into one int32
    array for its gather, and a gradient's scatter keeps it (jax-ml/jax#30015: 12 MiB of the
    gradient's 16 MiB of temporaries, 4 MiB with lax.gather given the (N, 3) array; measured on
    the CPU, jax 0.10.2). A note where it is 1 MiB and a quarter of the peak or more; ""
    otherwise."""
    if not temporaries:
        return ""
    t = temporaries[0]
    if not (t.op == "concatenate" and t.dtype[:1] in "su" and "[" in t.line
            and len(t.shape) == 2 and t.nbytes >= 2**20 and 4 * t.nbytes >= peak):
        return ""
    k = t.shape[1]
    dims = ", ".join(str(i) for i in range(k))
    return (f"The largest value, concatenate {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}, "
            f"{t.line}), is indices: indexing with {k} index arrays makes JAX stack them into "
            "one integer array for its gather, a copy of them (int32, however narrow yours), "
            "which a gradient's scatter keeps as well. Where they already sit in one "
            f"(N, {k}) array, hand it to jax.lax.gather as it is (GatherDimensionNumbers("
            f"offset_dims=(), collapsed_slice_dims=({dims}), start_index_map=({dims})), "
            f"slice_sizes=(1,) * {k}), or index the flattened array with one flat index "
            "(jax-ml/jax#30015).")


def _sparse_note(products, temporaries, peak: int) -> str:
    """The first BCOO product of 2**18 values or more whose line made a quarter of the peak
    (``products``: :func:`jaxprs.sparse_products`), where it makes far more values than the
    dense product has:
    BCOO @ dense gathers a row of the dense operand per stored element (jax-ml/jax#14642: 24 MiB
    for 200,000 stored elements by 32 columns; blocks of 4 columns took the peak 33.87 -> 15.11
    MiB), BCOO @ BCOO pairs every stored element of one with every one of the other
    (jax-ml/jax#14821: 820 x 820 pairs at 20% fill, where dense needed 54.86 KiB; measured on the
    CPU, jax 0.10.2: 30.83 and 53.27 MiB held in two runs where the kit said 24.55). ""
    otherwise."""
    for kind, line, nse, other, dense in products:
        held = sum(t.nbytes for t in temporaries if line and t.line == line)
        # 2**18 values: 1 MiB of float32 made for the product itself
        if nse * other < 2**18 or 4 * held < peak or nse * other < 4 * dense:
            continue
        if kind == "dense":
            return (f"The BCOO @ dense product at {line} gathers a row of the dense operand "
                    f"for each of the matrix's {nse:,} stored elements: {nse * other:,} values, "
                    f"where the product has {dense:,}. Multiply in blocks of k columns "
                    "(jax.lax.map(lambda b: m @ b, blocks)), which holds the stored elements "
                    "times k; on a GPU, jax.config.update('jax_bcoo_cusparse_lowering', True) "
                    "hands it to cuSPARSE (jakevdp, jax-ml/jax#14642; from the thread, not yet "
                    "run on a GPU).")
        return (f"The BCOO @ BCOO product at {line} pairs each of the left's {nse:,} stored "
                f"elements with each of the right's {other:,}: {nse * other:,} pairs, where the "
                f"dense product has {dense:,} elements. At this fill, dense is far cheaper: "
                "a.todense() @ b.todense() (jakevdp, jax-ml/jax#14821: a sparse product pays at "
                "about 1% fill or less). The peak above may be low for it: on the CPU, runs of "
                "such a product held 1.3 to 2.2 times the kit's figure (the cause not yet "
                "known).")
    return ""


def _unrolled_values(c: compiled.CompiledStep, unrolled: str, temp: int) -> str:
    """Where a loop unrolled inside jit (``unrolled``: the note) holds one value per iteration
    at once, half of XLA's temporaries (``temp``) or more: a sentence saying so; "" otherwise.
    openxla/xla#35719: 36 iterations of a 1.91 MiB index array, 70.6 MiB of temporaries on the
    CPU (jax 0.8.0 and 0.10.2); a lax.scan over them with one padded shape, 15.3 MiB."""
    if "is unrolled" not in unrolled:
        return ""
    same = [t for t in c.temporaries(4 * compiled.UNROLLED_AT) if t.line and t.line in unrolled]
    held = sum(t.nbytes for t in same)
    if len(same) < 4 or 2 * held < temp:
        return ""
    return (f" This line's values are alive at once, too: XLA's plan holds {len(same)} of them "
            f"({format_bytes(held)} of {format_bytes(temp)} of temporaries), from every "
            "iteration, where a jax.lax.scan over the iterations holds one iteration's (give every "
            "iteration one shape, padded, and mask what is padding; openxla/xla#35719).")


def _random_bits_whole(c: compiled.CompiledStep) -> bool:
    """The step draws random numbers (threefry) while ``jax_threefry_partitionable`` is off:
    over a mesh each device then computes the bits of the whole array (levanter#475; measured
    on jax 0.8.0 and 0.10.2: 32 MiB of temporaries per device for a 4 MiB part, 12 MiB with
    the flag on)."""
    jax = devices.start_jax()
    return (not getattr(jax.config, "jax_threefry_partitionable", True)
            and bool({"threefry2x32", "random_bits"} & c.primitives))


def _on_the_host_by_commitment(dev) -> str:
    """A note when committed arguments pin the step to another platform than the default
    device's (a GPU machine's batch committed to its CPU): jit runs it there, and says
    nothing. "" otherwise."""
    default = devices.default_device()
    if dev == default or getattr(dev, "platform", "") == getattr(default, "platform", ""):
        return ""
    loader = (" A loader that yields arrays committed to the CPU does this (jax.device_put to "
              "a CPU device; jax.dlpack.from_dlpack of a NumPy array commits too, seen on the "
              "CPU)." if getattr(dev, "platform", "") == "cpu" else "")
    return (f"This step runs on {device_name(dev)}, not on the default device "
            f"{device_name(default)}: its arguments are committed to {device_name(dev)}, and jit "
            f"runs where committed arguments are, without a word.{loader} If "
            f"{device_name(default)} was meant, jax.device_put the arguments there before the "
            "call.")


def _chunk_size(length: int) -> int:
    """The number of steps per chunk nearest the square root of ``length`` that divides it
    (2 or more steps, 2 or more chunks); the square root itself where none does (a prime)."""
    root = math.isqrt(length)
    pairs = [d for k in range(2, root + 1) if length % k == 0 for d in (k, length // k)]
    return min(pairs, key=lambda d: abs(d - math.sqrt(length)), default=max(root, 2))


def _chunks_fix(length: int) -> str:
    """The fix for a scan whose steps each keep their carry: checkpointed chunks of about
    sqrt(length) steps (measured by the kit for jax#19250, a fori_loop of 256 steps of sin over
    float32[4096]: 4.00 MiB kept became 256 KiB, XLA's temporaries 4.03 MiB became 0.53 MiB,
    the same gradient; jax 0.8.0 and 0.10.2)."""
    k = _chunk_size(length)
    n, left = divmod(length, k)
    last = "the last step" if left == 1 else f"the last {left} steps"
    rest = (f" Then run {last} on their own, after the scan (your {length} steps are {n} "
            f"chunks of {k} and {left} more)." if left else "")
    return (f"A lax.scan over jax.checkpoint-ed chunks of {k} steps keeps one carry per chunk, "
            f"{n} in all, and the backward pass recomputes one chunk at a time: "
            f"jax.lax.scan(jax.checkpoint(chunk), carry, xs[:{n * k}].reshape({n}, {k}, ...)), "
            f"where chunk runs the body over its {k} steps with a lax.scan (for a fori_loop: "
            f"xs None, length={n}, and chunk a fori_loop of {k} steps).{rest}")


def _checkpoint_fix(length: int, per_step: int, carry: int, checkpointed: bool,
                    chunked: bool) -> str:
    """What jax.checkpoint can do for a scan under a derivative that keeps ``per_step`` bytes
    a step, whose carry is ``carry`` bytes: checkpointing the body keeps each step's carry, so
    where that is all it keeps already, or the whole body is checkpointed already, the fix is
    chunks (jax-ml/jax#19250: "jax.remat(body_fn) does not help"); where a checkpoint covers
    only part of the body and a step keeps more than its carry, around the whole body."""
    if chunked:
        return ("Its body is a jax.checkpoint-ed chunk of steps already: it keeps one carry per "
                "chunk and recomputes one chunk at a time in the backward pass; chunks of about "
                "the square root of all the steps keep the least.")
    if checkpointed and (not carry or per_step <= 2 * carry):
        return ("Its body is under jax.checkpoint already, so each step keeps its carry (and "
                "what the checkpoint's policy saves). " + _chunks_fix(length))
    if carry and per_step <= carry:
        return (f"Each step keeps {format_bytes(per_step)}, no more than its carry "
                f"({format_bytes(carry)}), which is what jax.checkpoint on the body would keep: "
                "it cannot shrink this (jax#19250). " + _chunks_fix(length))
    if checkpointed:
        return (f"Part of its body is under jax.checkpoint, yet each step keeps "
                f"{format_bytes(per_step)}, more than its carry ({format_bytes(carry)}): "
                "jax.checkpoint around the whole body keeps only each step's carry and "
                "recomputes the rest in the backward pass.")
    return ("jax.checkpoint on the body keeps only each step's carry and recomputes the rest in "
            "the backward pass.")


def _fwd_rule_fix(rule: str) -> str:
    """The fix for residuals a jax.custom_vjp fwd rule returns (sgl-project/sglang-jax#823:
    measured by the kit on a chunked linear attention of 32 chunks, jax 0.8.0 and 0.10.2: 896
    KiB kept, the same with jax.checkpoint on the scan's body inside the fwd rule; 256 KiB
    with the rule returning only its inputs)."""
    return (f"JAX keeps what {rule} returns until the bwd rule runs, and jax.checkpoint on code "
            f"inside {rule} (a scan's body) cannot drop it; around the whole call it only makes "
            f"{rule} run again in the backward pass. Return fewer residuals from {rule} (its "
            "inputs, say) and recompute the rest in the bwd rule (sglang-jax#823).")


def _updated_stack_note(t: compiled.ScanStack, peak: int) -> str:
    """A scan that takes an array in as xs and gives it back as ys with rows written into each
    step's slice: a KV cache stacked over layers, scanned over with the layers
    (marin-community/levanter#1249, the maintainer's fix a list of per-layer caches, "~5-6x").
    Measured by the helper on the CPU, 8 layers of [2, 2048, 4, 64] float32 (32 MiB), donated:
    51.2 ms per token through the scan (35.6 on jax 0.8.0), 13.2 with a list of per-layer
    caches, 10.2 with the cache carried by a lax.fori_loop and written with
    dynamic_update_slice at (i, 0, pos, 0, 0); XLA's temporaries 40 MiB -> 4 MiB."""
    at = f" ({t.line})" if t.line else ""
    return (f"A lax.scan{at} takes a {t.dtype}{list(t.shape)} in as xs and gives it back as "
            f"ys with rows written into each of its {t.length} steps' slices "
            "(dynamic_update_slice or .at[].set): every call builds a new "
            f"{format_bytes(t.updated_bytes)} stacked array ({t.updated_bytes / peak:.0%} of the "
            "peak) to change those rows, and donating the old one does not make the write in "
            "place. Carry the array instead and write step i's rows into it with "
            "lax.dynamic_update_slice at (i, ...) in a lax.fori_loop over the layers, or keep a "
            "list of per-layer arrays (a KV cache: marin-community/levanter#1249; 51 -> 10 ms "
            "per token on the CPU).")


def _stack_note(t: compiled.ScanStack, peak: int) -> str:
    at = f" ({t.line})" if t.line else ""
    largest = (f"; the largest, {t.dtype}{list(t.shape)}" if t.outputs > 1 else
               f": {t.dtype}{list(t.shape)}")
    head = (f"A lax.scan{at} keeps a value for each of its {t.length} steps, "
            f"{format_bytes(t.nbytes)} stacked over its length ({t.nbytes / peak:.0%} of the "
            f"peak{largest})")
    if t.role == "forward" and t.fwd_rule:  # (its values may be residuals, or the output)
        rule = t.fwd_rule
        return (f"{head}: it runs inside the jax.custom_vjp fwd rule {rule}. What {rule} returns "
                "as residuals JAX keeps until the bwd rule runs, and jax.checkpoint on code "
                f"inside {rule} cannot drop it: where preflight.residuals(loss, ...) names this "
                f"scan's values as {rule}'s residuals, return fewer from {rule} and recompute "
                f"them in the bwd rule (sglang-jax#823); where it does not, they are {rule}'s "
                "output.")
    if t.role == "forward":
        return (f"{head}: it runs under a derivative (jax.grad, jax.vjp), so beside what its "
                "body returns it keeps what the backward pass needs from each step. "
                "preflight.residuals(loss, ...) lists those. "
                + _checkpoint_fix(t.length, t.nbytes // t.length, t.carry_bytes,
                                  t.checkpointed, t.chunked))
    if t.updated_bytes * 2 >= t.nbytes:
        return _updated_stack_note(t, peak)
    if not t.has_carry:
        return (f"{head.replace('A lax.scan', 'A jax.lax.map (a scan without a carry)', 1)}: "
                "its result, each step's stacked. Where what follows needs only a reduction of "
                "it (a sum, a maximum), compute that in a lax.scan's carry instead, and no "
                "step's result is kept; where it needs all of it, this is memory the step "
                "must have.")
    if t.copied_bytes * 2 >= t.nbytes:
        return (f"{head}: {format_bytes(t.copied_bytes)} of it is the body returning its slice "
                "of what the scan reads, unchanged, so the scan stacks a copy of that array. "
                "Drop it from the body's outputs (Flax NNX: return only the state that "
                "changes, not nnx.state(layer) with its nnx.Param, maxtext#4405). Under "
                "jax.checkpoint or an inner jax.jit JAX keeps the copy; returned directly, "
                "JAX drops it itself.")
    return (f"{head}: what its body returns beside the carry. Return less from the body (a "
            "sum, or the last value, belongs in the carry).")


def _record_note(loop: str, whole: tuple[int, ...], step: tuple[int, ...], dtype: str,
                 nbytes: int, line: str, write: str = "", steps: int | None = None,
                 made_here: bool = True) -> str:
    """The note for a buffer a loop carries and only writes, a step's value per row
    (google-deepmind/gemma#534: a sampler kept every token's logits over the vocabulary; its
    fix keeps the top-k logits and their indices. Measured by the kit on the CPU, B=4, 128
    steps, a vocabulary of 4096: a peak of 10.44 MiB, 2.47 MiB with the top 8, jax 0.8.0 and
    0.10.2). A ``while_loop`` has no step count: its buffer is sized by its bound, whatever the
    number of steps it takes (patrick-kidger/diffrax#238: ``SaveAt(steps=True)`` keeps
    ``max_steps`` rows, 4096, for 8 steps taken; equinox writes them with its own
    ``maybe_set``. ``SaveAt(ts=...)`` of 6 times: a peak of 32.04 MiB -> 81.66 KiB, y of 1024
    float32, measured by the kit with diffrax 0.7.2, equinox 0.13.8, jax 0.10.2 on the CPU).
    A scan's buffer of more rows than steps is told to shrink only where the step makes it
    (``made_here``): one handed in may hold rows written before (a prompt's, then a decode's)."""
    kind = "lax.while_loop" if loop == "while" else "lax.scan (or lax.fori_loop)"
    rows = math.prod(whole) // max(math.prod(step), 1)
    head = (f"A {kind} writes a {dtype}{list(step)} into its carried {dtype}{list(whole)} at "
            f"each step{f' ({line})' if line else ''} and never reads it back: "
            f"{format_bytes(nbytes)} held through the loop")
    part = ("where what follows needs only part of each step's value (the top-k logits and "
            "their indices, the chosen token's log-probability), write that instead, and the "
            "buffer shrinks in proportion (google-deepmind/gemma#534)")
    if steps is not None and steps < rows and not made_here:  # rows handed in may hold values
        return (f"{head}, {rows} rows, of which its {steps} steps write {steps}: the others "
                f"keep what the buffer held when it was handed in; {part}.")
    if steps is not None and steps < rows:
        return (f"{head}, {rows} rows, of which its {steps} steps write at most {steps}. Size "
                f"the buffer by the steps ({steps} rows), or return each step's value as the "
                f"scan's output; {part}.")
    if loop == "while":
        fix = ("with diffrax, SaveAt(steps=True) or SaveAt(dense=True) keeps max_steps rows: "
               "save at the times you need, SaveAt(ts=...), or lower max_steps "
               "(patrick-kidger/diffrax#238; 32.04 MiB -> 81.66 KiB for 6 times)"
               if write == "maybe_set" else
               "write only the steps you need into a buffer of that many rows, or lower the "
               "bound (patrick-kidger/diffrax#238: SaveAt(ts=...) for SaveAt(steps=True))")
        return (f"{head}, {rows} rows sized by its bound, not by the steps it takes (room for "
                f"each of its {rows} steps at most; the rows past the last step taken hold "
                f"nothing it wrote). The fix: {fix}; {part}.")
    return (f"{head}, a value of each of its {rows} steps. {part[0].upper()}{part[1:]}; where "
            "it needs all of it, this is memory the loop must have.")


def _carry_copy_note(dtype: str, shape: tuple[int, ...], nbytes: int, copies: int,
                     steps: int | None, in_derivative: bool, line: str, more: int = 0) -> str:
    """The note for a loop whose carried buffer XLA copies whole on every step, so a step that
    writes one row costs the whole buffer and the loop is quadratic in its length: under
    jax.grad, a scan that writes rows into its carry (jax-ml/jax#10197: the fix returns the
    rows as the scan's output; measured by the kit, jax.grad at 4000 rows of 10x10 on the CPU,
    677 -> 3.1 ms), or a value read from the carry before a write and used after it
    (jax-ml/jax#17845: read after the writes; 2000 steps over 1e6 floats, 607 -> 0.4 ms)."""
    each = f"each of its {steps} steps" if steps else "each step"
    total = f" ({format_bytes(nbytes * copies * steps)} copied a call)" if steps else ""
    times = "whole" if copies == 1 else f"whole {copies} times"
    also = f" (and in {more} more loop{'s' if more > 1 else ''})" if more else ""
    head = (f"XLA copies the loop's carried {dtype}{list(shape)} ({format_bytes(nbytes)}) "
            f"{times} on {each}{f' ({line})' if line else ''}{total}{also}, so the time grows "
            "with the buffer, not with what a step writes")
    grad = ("under jax.grad a row written into the carry is not updated in place "
            "(jax-ml/jax#10197): return each step's row as the scan's output (ys) and carry only "
            "what the next step needs (677 -> 3.1 ms)")
    read = ("a value read from the carry before a write to it and used after it keeps the old "
            "buffer alive (jax-ml/jax#17845): read it after the writes, copying it into a spare "
            "slot of the carry first (607 -> 0.4 ms)")
    first, then = (grad, read) if in_derivative else (read, grad)
    return f"{head}: {first}; or {then}."


def _slice_copy_note(dtype: str, shape: tuple[int, ...], nbytes: int, copies: int, joins: int,
                     moved: int, steps: int | None, line: str, joined: str, more: int = 0) -> str:
    """The note for a loop that updates a carried buffer in place while XLA copies slices of
    it and concatenates them back on every step: a KV cache [B, layers, 2, S, H, D] whose
    layer's K and V are sliced out, updated with dynamic_update_slice and put back with
    jnp.stack, which rebuilds the layer's cache to write one row (keras-team/keras-hub#2780,
    fixed in #2781 by dropping the stack; keras-hub#1562 and marin-community/levanter#1249: a
    list of per-layer caches). Measured by the helper on the CPU, jax 0.10.2, 4 layers,
    S=2048, 64 tokens in a lax.while_loop, best of 8: 187-206 ms stacked, 93-107 ms with one
    K and one V buffer per layer updated in place (the same tokens); at S=512 the kit counts 8
    copies of 512 KiB and 4 concatenates of 1 MiB a step, none with the per-layer buffers."""
    each = f"each of its {steps} steps" if steps else "each step"
    total = f", {format_bytes(moved * steps)} a call" if steps else ""
    made = f" (the concatenates: {joined})" if joined else ""
    also = f" (and in {more} more loop{'s' if more > 1 else ''})" if more else ""
    what = ", ".join(part for part in (
        f"{copies} cop{'y' if copies == 1 else 'ies'}" if copies else "",
        f"{joins} concatenate{'s' if joins > 1 else ''}" if joins else "") if part)
    return (f"The loop{f' ({line})' if line else ''} updates its carried {dtype}{list(shape)} "
            f"({format_bytes(nbytes)}) in place, yet XLA copies slices of it and concatenates "
            f"them back on {each} ({what}; {format_bytes(moved)} moved a step{total}){also} to "
            "write a row, as when a KV cache's K and V are sliced out of it, updated and stacked "
            f"back{made}. Keep each layer's K and V as separate buffers in the carry and update "
            "each in place with lax.dynamic_update_slice, with no jnp.stack or concatenate "
            "(keras-team/keras-hub#2780: about 2x faster on the CPU).")


def _leaf_name(c: compiled.CompiledStep, fn: Callable, args, kwargs, path) -> str:
    """The name of a leaf of the dynamic arguments, as ``fn`` calls it ("params['w1']"), from
    its key path in (args, kwargs)."""
    jax = devices.start_jax()
    positional = [name for where, name in c.argument_names(fn, args, kwargs)
                  if isinstance(where, int)]
    top = path[1]
    name = positional[top.idx] if path[0].idx == 0 else str(top.key)
    return name + jax.tree_util.keystr(path[2:])


def _widened(c: compiled.CompiledStep, fn: Callable, args, kwargs
             ) -> list[tuple[str, str, str, int, str, str, str]]:
    """(what, its dtype, the wider dtype, bytes at that dtype, line, "constant" or
    "argument", the wider operand's name) of each value jnp's promotion widens before a dot
    or a convolution, largest first (:meth:`helpers.compiled.CompiledStep.widened_inputs`)."""
    out = []
    for path, dtype, to, shape, nbytes, line, kind, other in c.widened_inputs(args, kwargs):
        what = (f"{_leaf_name(c, fn, args, kwargs, path)} ({dtype}{list(shape)})" if path
                else f"a {dtype}{list(shape)} value computed from the arguments")
        other_name = _leaf_name(c, fn, args, kwargs, other) if other else ""
        out.append((what, dtype, to, nbytes, line, kind, other_name))
    return out


def _widened_note(what: str, dtype: str, to: str, nbytes: int, line: str, kind: str,
                  other: str) -> str:
    """A value jnp's promotion reads at a wider type before a dot, and the fix. Measured on
    the CPU (jax 0.10.2; 0.8.0 alike): under x64, a float32 step dividing by
    ``sigma = np.std(data)`` of NumPy data (a NumPy float64 scalar, strongly typed) runs in
    float64: ``float(sigma)`` took XLA's temporaries from 9.00 to 2.00 MiB and the peak from
    17.50 to 10.50 MiB (jax-ml/jax#1830); bfloat16 parameters against a float32 batch make
    every activation float32: ``batch.astype(jnp.bfloat16)`` took what jax.grad keeps from
    50.00 to 26.00 MiB (jax-ml/jax#7368); a float32 bias added to a bfloat16 activation
    names the bias (an argument, not a constant), and ``b.astype(jnp.bfloat16)`` at that line
    took what jax.grad keeps from 8.25 to 6.25 MiB. The constant is not named (a jaxpr has no
    name for it): the fix says "the constant that line reads".
    ``jax.numpy_dtype_promotion('strict')`` raises a TypePromotionError at each such line
    (jax-ml/jax#10824, the maintainers' answer)."""
    at = f" at {line}" if line else ""
    if kind == "constant":
        whose = ("under x64 a NumPy float64 scalar or array, such as np.std of NumPy data, is "
                 "strongly typed, jax-ml/jax#1830" if to == "float64" else
                 f"a NumPy or JAX {to} array the function closes over is strongly typed")
        cause = f"jnp promotes it with a {to} constant there ({whose}; a Python float is not)"
        fix = (f"make the constant that line reads {dtype} where it is made "
               f"(jnp.{dtype}(...) of it), or pass a scalar as a Python float (float(...) of "
               "it), which takes the other operand's dtype")
    else:
        named = other or f"a {to} value computed from the arguments"
        cause = f"jnp promotes it with {named} ({to}) there (jax-ml/jax#7368)"
        fix = (f"cast {other} to {dtype} ({other}.astype(jnp.{dtype})), before the step or "
               "where that line reads it" if other else
               f"cast that value to {dtype} where it is made (.astype(jnp.{dtype}))")
    return (f"{what} is read as {to}{at}: {cause}, so what is computed from it there on, and "
            f"what jax.grad keeps of it, is {to} ({format_bytes(nbytes)} as {to} for this "
            f"value alone). Fix: {fix}; jax.numpy_dtype_promotion('strict') raises at every "
            "line that promotes so.")


def _float64_arguments(c: compiled.CompiledStep, args, kwargs) -> int:
    """The bytes of the step's float64 array arguments (each buffer once) while x64 is on;
    0 with x64 off."""
    jax = devices.start_jax()
    if not jax.config.jax_enable_x64:
        return 0
    leaves = {id(leaf): leaf for leaf in jax.tree.leaves(c.dynamic(args, kwargs))
              if str(getattr(leaf, "dtype", "")) == "float64"}
    return sum(compiled.array_bytes(leaf) for leaf in leaves.values())


def _float64_note(nbytes: int, argument_bytes: int) -> str:
    """x64 on and most of the step's arguments float64: under x64 what is made without a
    dtype is float64 (patrick-kidger/equinox#1154: a network initialised so; dtype=jnp.float32
    at creation took the step's arguments from 27.17 to 13.59 MiB and its peak from 56.22 to
    28.11 MiB, measured on the CPU, jax 0.10.2 and 0.8.0). Worded for a step that wants its
    float64 too (a float64 PDE step, x64.py of the code review): no gate tells the two apart,
    since both are float64 throughout, so the fix is stated as conditional on float32 being
    enough."""
    share = f" ({nbytes / argument_bytes:.0%})" if argument_bytes else ""
    return (f"{format_bytes(nbytes)} of the step's arguments{share} are float64, and "
            "jax_enable_x64 is on: under x64 an array made without a dtype (jnp.zeros, "
            "jax.random.normal, NumPy data through jnp.asarray, a layer's initialiser such as "
            "eqx.nn.Linear's) is float64, twice float32's bytes. If float32 is enough for them "
            "(a network beside float64 numerics, patrick-kidger/equinox#1154), pass "
            "dtype=jnp.float32 where they are made, or leave x64 off; if the step needs float64, "
            "this is its cost, not a mistake.")


#: where XLA:CPU computes a half-precision type in float32: read in openxla/xla's
#: xla/service/cpu/cpu_compiler.cc (FloatNormalization with CpuFloatSupport(BF16): bfloat16
#: arithmetic becomes float32, data movement stays; ChangeOpDataType(F16, F32): float16 dots
#: and convolutions, elementwise float16 stays float16). Measured: the same MLP training step
#: has 36.00 MiB of temporaries in bfloat16, 34.00 MiB in float32 (jax 0.10.2, the CPU)
_CPU_UPCAST = {"bfloat16": "bfloat16 arithmetic in float32 (FloatNormalization with "
                           "CpuFloatSupport(BF16)",
               "float16": "float16 dots and convolutions in float32 (ChangeOpDataType(F16, "
                          "F32)"}
#: what a GPU does instead, read in openxla/xla: xla/service/gpu/gpu_float_support.cc keeps
#: bfloat16 dots and data movement (copy, broadcast, slice, ...) at bfloat16; add, multiply
#: and subtract count as supported only on Hopper or later, abs, max, min and negate on Ampere
#: or later, exp and log on CUDA, everything else (tanh, divide, sqrt, ...) FloatNormalization
#: widens to float32, and it runs before fusion (gpu_compiler.cc's post-layout passes), so the
#: widening is mostly inside fusions. gpu_compiler.cc normalizes no float16. Not yet run on a
#: GPU
_GPU_KEEPS = {"bfloat16": "a GPU computes the dots in bfloat16 and keeps values between "
                          "fusions mostly in bfloat16 (tanh, divide, sqrt and like math widened "
                          "to float32 inside fusions, add and multiply too below Hopper; "
                          "xla/service/gpu/gpu_float_support.cc",
              "float16": "a GPU computes float16 dots and convolutions in float16 "
                         "(xla/service/gpu/gpu_compiler.cc normalizes no float16"}


def _cpu_upcast(c: compiled.CompiledStep, temporaries) -> tuple[str, list[dict]]:
    """(the half-precision dtype, XLA's float32 values of its shapes, largest first) where
    the step compiled for the CPU computes bfloat16 or float16 values of its jaxpr in float32
    and one of them is among its largest ``temporaries``; ("", []) otherwise. A float32 value
    whose shape a float32 value of the jaxpr has too is left out (it may be the user's own)."""
    if getattr(c.device, "platform", "") != "cpu":
        return "", []
    shapes = jaxprs.shapes_by_dtype(c.jaxpr)
    wide = shapes.get("float32", set())
    for dtype in _CPU_UPCAST:
        half = shapes.get(dtype, set()) - wide
        found = [v for v in c.values if v["dtype"] == "f32" and tuple(v["shape"]) in half]
        if found and any(t.dtype == "f32" and tuple(t.shape) in half for t in temporaries):
            return dtype, found
    return "", []


def _cpu_upcast_note(dtype: str, found: list[dict]) -> str:
    """The CPU stand-in's float32 copies of a half-precision step: labelled, sizes kept."""
    v = found[0]
    largest = (f"{v['op'].rsplit('/', 1)[-1]} f32{list(v['shape'])}, "
               f"{format_bytes(v['nbytes'])}")
    many = (f"{len(found)} of XLA's values are float32 with the shapes of {dtype} values of "
            f"the step, the largest {largest}" if len(found) > 1 else
            f"XLA's {largest} has the shape of a {dtype} value of the step")
    return (f"On the CPU, XLA computes {_CPU_UPCAST[dtype]}, openxla/xla "
            f"xla/service/cpu/cpu_compiler.cc): these temporaries are float32-sized ({many}); "
            f"{_GPU_KEEPS[dtype]}; from XLA's source, not yet run on a GPU). "
            f"To see what a change to {dtype} saves, compare residuals(loss, ...) (the jaxpr's "
            "sizes), not these temporaries.")


def _cast_note(wide: str, narrow: str, shape: tuple[int, ...], nbytes: int, line: str,
               scan: str, role: str) -> str:
    """An input cast whole to a narrower float before a scan reads it step by step
    (marin-community/levanter#426: "we store a full bf16 copy of all the parameters")."""
    note = (f"A {wide}{list(shape)} input is cast to {narrow} whole"
            f"{' (' + line + ')' if line else ''}, {format_bytes(nbytes)} for all "
            f"{shape[0]} steps at once, before the lax.scan{' (' + scan + ')' if scan else ''} "
            "reads it one step at a time: the cast copy is made before the loop and held "
            "through it. Cast each step's slice inside the body instead (the maintainer's fix "
            "in marin-community/levanter#426).")
    if role == "forward":
        note += (" Under a derivative also put the body under jax.checkpoint: otherwise JAX "
                 "keeps each step's cast for the backward pass all the same.")
    return note


def _threefry_note(c: compiled.CompiledStep, temp: int, peak: int) -> str:
    """For a step whose temporaries are mostly a large ``jax.random`` draw's bits (threefry2x32,
    JAX's default generator: jax-ml/jax#20328): the draw, and the generator that holds less.
    Only where XLA's plan keeps uint32 values of the draw's shape (measured on the CPU, jax
    0.8.0 and 0.10.2: an 8 MiB normal table, 24 MiB of temporaries; with an rbg key, none),
    and one draw's make up half the temporaries or more: several draws of one shape (dropout's
    masks, one a layer) are made one after another in memory XLA reuses, so each draw's bits
    count once (a dropout MLP's two 2 MiB masks, 22.5 MiB of temporaries: 18.4 MiB with an
    rbg key, measured on the CPU, jax 0.10.2; no note)."""
    draws = [d for d in c.threefry_draws() if d[1] >= 2**20]
    if not draws or 2 * temp < peak:
        return ""
    shape, nbytes, line = draws[0]
    times = sum(d[0] == shape for d in c.threefry_draws())
    listed = sum(v["nbytes"] for v in c.values if v["dtype"] in ("u32", "uint32")
                 and tuple(v["shape"]) == shape)
    kept = listed // times  # one draw's
    # XLA's loop that makes the bits carries the uint32 values listed here and makes as many
    # again in its body, which no list shows: the draw is most of the temporaries where the
    # listed ones are a quarter of them (bfloat16 at 2048 x 1024: 16 MiB listed of 32 MiB;
    # float32: 16 of 24. jax-ml/jax#21045: the old test, half, left out every bfloat16 draw)
    if 4 * kept < temp:
        return ""
    each = f" (one of {times} draws of that shape)" if times > 1 else ""
    return (f"jax.random{' at ' + line if line else ''} draws {format_bytes(nbytes)} of random "
            f"bits{each} through threefry2x32, JAX's default generator, and XLA's plan holds "
            f"{format_bytes(kept)} of uint32 values that size while making "
            f"{'each' if times > 1 else 'them'} ({kept / nbytes:.0f}x the draw). A key of the "
            "'rbg' generator makes them with no such temporaries: jax.random.key(seed, "
            "impl='rbg'), or jax.config.update('jax_default_prng_impl', 'rbg') before any key "
            "is made (other numbers, the same distribution; froystig in jax-ml/jax#17982). Or "
            "draw a large table in pieces.")


def _bound_method_note(fn: Callable) -> str:
    """For a jit of a method bound to an object (``t.__call__``), the object's arrays are what
    it closes over: the fix passes the object (patrick-kidger/equinox#770)."""
    import inspect

    try:
        method = inspect.unwrap(fn)  # eqx.filter_jit and jax.jit keep it as __wrapped__
    except Exception:  # a wrapper whose __wrapped__ chain loops
        method = fn
    if not inspect.ismethod(method):
        return ""
    return (f" {method.__name__} is a method bound to a {type(method.__self__).__name__} "
            "object, whose arrays a jit of the method closes over: pass the object itself. "
            "With equinox, eqx.filter_jit(t)(x), not eqx.filter_jit(t.__call__)(x), which takes "
            "the object of a method like __call__ as static (patrick-kidger/equinox#770: "
            "16.00 MiB of weights baked in, 0 B once passed; XLA's compile 0.29 -> 0.04 s); "
            "with jax.jit, an object that is a pytree as an argument, "
            "jax.jit(lambda t, x: t(x))(t, x).")


def _in_use(dev) -> tuple[int | NotAvailable, str]:
    from helpers import memory  # imports JAX: only once devices.start_jax() has

    try:
        (mem,) = memory.snapshot([dev]).devices
    except Exception:
        return NOT_AVAILABLE, "unknown"
    return mem.bytes_in_use, mem.source


def _verdict(needed: int, free, dev, donated) -> tuple[str, str]:
    tips = [] if donated else ["donate the arguments the step replaces (donate_argnums)"]
    tips += ["a smaller batch", "jax.checkpoint on the largest activations",
             "free arrays still held (notebook 08)"]
    return judge(needed, free, dev, fix="Try: " + "; ".join(tips),
                 unknown="this device reports no free memory")


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
    c = compiled.compile_step(fn, *args, device=device, donate_argnums=donate_argnums,
                     static_argnums=static_argnums, static_argnames=static_argnames,
                     donate_argnames=donate_argnames, **kwargs)
    dev = c.device
    a = c.sizes()
    split = step_arguments.argument_split(c, fn, args, kwargs, per_device=device is None)
    copies = step_arguments.state_copies(c, fn, args, kwargs, per_device=device is None)
    spread = step_arguments.spread_arguments(c, fn, args, kwargs)
    # the CPU runtime's own copies for weight-gradient convolutions (outside XLA's plan)
    runtime = c.runtime_bytes() if target is None else 0
    # one buffer passed in several places: XLA's argument size counts each, the device one
    again = step_arguments.passed_again(c, fn, args, kwargs, per_device=device is None)
    peak = a["peak"] - again + c.constants + runtime
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
    if c.conflict:
        verdict, advice = "will fail", c.conflict
    else:
        verdict, advice = _verdict(needed, free, where, c.donated)
    notes = []
    if closed_over := c.constants - c.folded:
        notes.append(f"{format_bytes(closed_over)} of arrays the function closes over are baked "
                     "into the compiled program as constants, a copy the program holds (XLA's "
                     "peak_memory_in_bytes counts it; its argument, output and temporary sizes "
                     "do not): pass them as arguments instead." + _bound_method_note(fn))
    if c.folded >= 2**20:
        notes.append(f"{format_bytes(c.folded)} of constants XLA computed while compiling "
                     "(constant folding: a value made inside the jitted function from no "
                     "argument, such as jnp.ones(...).at[...].set(...)) are baked into the "
                     "program, which holds them as long as it lives, and folding them slows "
                     "the compile. Make such a value from an argument, or compile without "
                     "folding: jax.jit(f).lower(*args).compile(compiler_options="
                     "{'xla_disable_hlo_passes': 'constant_folding'}).")
    if not (c.conflict or c.lowered_with_arguments) and (  # (a wrapper's own donation: unseen)
            undonated := step_arguments.donation_would_save(c, fn, args, kwargs)):
        notes.append(step_arguments.donation_note(
            *undonated, step_arguments.copied_to_update(c, fn, args, kwargs), c.own_jit))
    if not c.conflict and (held := step_arguments.donated_host_note(c, fn, args, kwargs)):
        notes.append(held)
    if not c.conflict and c.shared_memory:
        notes.append(c.shared_memory)
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
            copies, tuple(name for name, _ in spread) if device is None else ()))
    unused = [d for d in c.donations if not d.reused]
    if unused:
        notes.append("Donated but not reused: " + "; ".join(
            f"argument {d.argument} ({format_bytes(d.nbytes)}): {d.why}" for d in unused)
            + ".")
    if c.dropped:
        notes.append(f"Not counted: {format_bytes(c.dropped)} of arguments the step never "
                     "reads (XLA drops them); they stay on the device while you hold them.")
    temporaries = c.temporaries()
    batched = _batched_by_line(c, peak)
    jacobians = c.jacobians()
    the_long_way = [(r, held) for r in jacobians if r.batch >= 4 * r.other_way and (
        held := max((t for t in temporaries if t.shape[:1] == (r.batch,)),
                    key=lambda t: t.nbytes, default=None)) is not None
        and 4 * held.nbytes >= peak]
    if the_long_way:
        r, held = the_long_way[0]
        notes.append(_jacobian_note(r, held))
        batched = [b for b in batched if b[0].shape[:1] != (r.batch,)]  # its rows: not lax.map
    # a vmap the user never wrote: a Jacobian's own, over its basis (XLA may fold the batch
    # into a dot's rows: f32[288 * 96, 96] for 288 tangents)
    basis = [r for r in jacobians if batched and not the_long_way and r.batch > 1
             and batched[0][0].shape and batched[0][0].shape[0] % r.batch == 0
             and batched[0][0].line in c.jacobian_lines]  # (not a vmap of the user's)
    if basis and batched[0][2] >= 4 * basis[0].basis_bytes:
        notes.append(_basis_note(basis[0], *batched[0][:3]))
    elif batched and not basis:  # (values the size of the Jacobian itself: nothing to save)
        notes.append(_batched_note(*batched[0]))
    leaves = sum(1 for a in c.dynamic(args, kwargs) for leaf in devices.start_jax().tree.leaves(a)
                 if hasattr(leaf, "shape"))
    if unrolled := c.unrolled(leaves):
        notes.append(unrolled + _unrolled_values(c, unrolled, a["temp"]))
    stacks = c.scan_stacks(a["output"] + a["temp"])
    named = [t for t in stacks if t.role != "backward"]  # JAX's own scan: nothing to change
    if named and named[0].nbytes * 4 >= peak:
        notes.append(_stack_note(named[0], peak))
    if device is None and target is None and (host := _on_the_host_by_commitment(dev)):
        notes.append(host)
    if bits := _threefry_note(c, a["temp"], peak):
        notes.append(bits)
    if stacked := _stacked_indices(temporaries, peak):
        notes.append(stacked)
    if sparse := _sparse_note(jaxprs.sparse_products(c.jaxpr), temporaries, peak):
        notes.append(sparse)
    casts = [x for x in c.cast_before_scan() if x[6] != "backward"]
    if casts and casts[0][3] >= 2**20 and casts[0][3] * 8 >= peak:
        notes.append(_cast_note(*casts[0]))
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
        notes.append(_record_note(*records[0]))
    copied = c.carry_copies()
    if copied:
        notes.append(_carry_copy_note(*copied[0], more=len(copied) - 1))
    sliced = c.carry_slice_copies()
    if sliced:
        notes.append(_slice_copy_note(*sliced[0], more=len(sliced) - 1))
    if c.computed_while_compiling():
        notes.append(
            f"XLA computed all of {c.function} while compiling: its program reads no argument "
            "(the arrays it uses are closed over, constants) and only copies or broadcasts the "
            "result, so a call copies that out, and its time and cost_analysis() say nothing of "
            "the work. Pass the inputs as arguments, jax.jit(h)(x), not jax.jit(lambda: h(x))() "
            "(jax-ml/jax#13956: a loop of 600 million additions timed at 3.9 ms as a closure, "
            "96.0 ms with x passed, on a CPU).")
    host = [(cb, at) for cb, at in c.callbacks() if cb in ("jax.pure_callback", "io_callback")]
    if host:
        cb, at = host[0]
        # one sentence for every step, however small: what the Python allocates is not in
        # the step's sizes (the thread's step: 2 MiB, its callback's array 64 MiB)
        notes.append(
            f"The {cb}{' at ' + at if at else ''} runs Python outside XLA's plan, so XLA's "
            "sizes above leave out what that Python allocates: measure.measure_step(fn, *args) "
            "or %%memory around a call counts it (jax-ml/jax#31292: 2.00 MiB by XLA's sizes, "
            "151.64 MiB measured on a CPU).")
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
        fix = jaxprs.progress_fix(callback)
        notes.append(
            f"The {callback} at {at} is in the body of a {loop} with no cond around it: it "
            f"runs, a round trip to the host, on every iteration; {fix}.")
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
    widened = _widened(c, fn, args, kwargs)
    if widened and widened[0][3] >= 2**20 and 32 * widened[0][3] >= peak:
        notes.append(_widened_note(*widened[0]))
    float64 = _float64_arguments(c, args, kwargs)
    if float64 >= 2**20 and 2 * float64 >= a["argument"]:
        notes.append(_float64_note(float64, a["argument"]))
    half, upcast = _cpu_upcast(c, temporaries)
    if upcast:
        notes.append(_cpu_upcast_note(half, upcast))
    if static := step_arguments.static_arrays(c, fn, args, kwargs):
        notes.append(step_arguments.static_array_note(static))
    gathered = _gathered(temporaries, args, kwargs, c.text) if spread and device is None else []
    if gathered:
        t = gathered[0]
        whole = (f"{t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}"
                 f"{', ' + t.line if t.line else ''}) is the whole of an array the arguments "
                 "split over devices")
        if t.op not in _CALLBACKS:  # a slice XLA all-gathers (apple/axlearn#993)
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
    if spread and device is not None:
        listed = ", ".join(f"{name} over {n} devices" for name, n in spread)
        notes.append(
            f"Priced whole on {device_name(dev)}, as asked: arguments are sharded ({listed}), "
            "so these sizes are the whole step's, not one device's share (without device=, "
            "the kit sizes one device's share).")
    bits = [t for t in temporaries if t.dtype == "u32"]  # threefry's words, largest first
    if c.over_mesh and sum(t.nbytes for t in bits) * 4 >= peak and _random_bits_whole(c):
        notes.append(
            "This step draws random numbers over several devices with "
            "jax_threefry_partitionable off: each device makes the random bits for the whole "
            f"array, then keeps its own part (the largest value of random bits, "
            f"u32{list(bits[0].shape)}, is {format_bytes(bits[0].nbytes)} on each device). "
            "jax.config.update("
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
    if runtime:
        notes.append(f"Counted beyond XLA's plan: {format_bytes(runtime)} the CPU runtime "
                     "copies for a convolution's weight gradient (measured on jax 0.10.2).")
    if a["output"] == 0 and a["temp"] == 0 and not c.conflict:
        notes.append("The compiled step computes nothing: it returns no array, so XLA kept no "
                     "work and there is no memory to predict. A step that updates Python "
                     "objects in place (as Flax NNX steps do) must be priced through the "
                     "function its own jit traces, or made to return the new state.")
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
        runtime_bytes=runtime, argument_split=split, state_copies=copies, scan_stacks=stacks,
        ignored_device_puts=ignored, spread_arguments=spread, static_arrays=static,
        jacobians=jacobians, scaled_by_zero=zeroed, narrowed_arguments=narrowed,
        widened_values=tuple(w[:5] for w in widened), float64_argument_bytes=float64,
        cpu_float32_values=len(upcast),
        cast_before_scan=tuple((f"{to}{list(shape)}", n, line)
                               for _, to, shape, n, line, _, _ in casts),
        dropped_device_keywords=dropped, zero_gradients=zeros, unsplit_sharding_puts=unsplit,
        loop_records=tuple((f"{dtype}{list(whole)}", f"{dtype}{list(step)}", n, line)
                           for _, whole, step, dtype, n, line, *_ in records),
        repeated_outputs=repeated, passed_again_bytes=again,
        copied_to_update=step_arguments.copied_to_update(c, fn, args, kwargs),
        carry_copies=tuple((f"{dtype}{list(shape)}", n, copies, steps, line)
                           for dtype, shape, n, copies, steps, _, line in copied),
        carry_slice_copies=tuple((f"{dtype}{list(shape)}", n, copies, joins, moved, steps, line)
                                 for dtype, shape, n, copies, joins, moved, steps, line, _
                                 in sliced))


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


_SOURCE_LINE = re.compile(r"from (\S+?):(\d+)(?::\d+)? ")


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
    #: checkpoint policy offloads (jaxprs.checkpoint_offloads)
    offloads: tuple[tuple[str, str, bool, str], ...]


def _scans(fn: Callable, args, kwargs) -> tuple[set[int] | None, set[tuple], dict, object]:
    """(the lengths of the scans in ``fn``'s forward pass, nested ones included; the (shape,
    dtype) of their carries, which a stacked output is not; (length, where) -> its
    :class:`_Scan`; the jaxpr). None and empties where it cannot be traced apart (then every
    scan output counts as stacked)."""
    jax = devices.start_jax()
    try:
        closed = jax.make_jaxpr(fn)(*args, **kwargs)
    except Exception:
        return None, set(), {}, None
    scans = [eqn for j, _ in jaxprs.walk(closed) for eqn in getattr(j, "eqns", ())
             if eqn.primitive.name == "scan"]
    steps: dict[tuple[int, str], _Scan] = {}
    for eqn in scans:
        carried = eqn.outvars[:eqn.params["num_carry"]]
        steps.setdefault((int(eqn.params["length"]), jaxprs.equation_where(eqn)), _Scan(
            jaxprs.scan_carry_bytes(eqn), *jaxprs.scan_checkpoint(eqn),
            tuple((tuple(v.aval.shape), str(v.aval.dtype)) for v in carried
                  if hasattr(v.aval, "shape")),
            jaxprs.checkpoint_offloads(eqn.params["jaxpr"])))
    return ({int(eqn.params["length"]) for eqn in scans},
            {(tuple(v.aval.shape), str(v.aval.dtype)) for eqn in scans
             for v in eqn.outvars[:eqn.params["num_carry"]] if hasattr(v.aval, "shape")},
            steps, closed)


def _offloaded_note(offloaded: list[Residual], kept: int, names: list[str]) -> str:
    """The words for residuals a jax.checkpoint policy offloads: where they are, beside what
    stays in device memory (jax-ml/jax#20015: JAX lists them as float32<host>[...]). XLA:CPU
    drops the placement when it compiles, so the CPU shows no saving: the gradient's
    temporaries were 720,896 B with the offload, save and nothing_saveable policies alike
    (two float32[256, 128] activations, jax 0.8.0 and 0.10.2)."""
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
    k = _chunk_size(size)
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


def _gradient_temp(fn: Callable, args, kwargs) -> int | None:
    """XLA's temporaries for ``jax.grad(fn)`` (by the first argument, as the user takes it),
    compiled, not run; None where it cannot be compiled (an output that is no scalar)."""
    jax = devices.start_jax()
    try:
        return int(compiled.compile_step(jax.grad(fn), *args, over_mesh=False,
                                         **kwargs).sizes()["temp"])
    except Exception:  # an output that is no scalar, a backend that will not say
        return None


def _fwd_rules(fn: Callable, args, kwargs, closed) -> dict[tuple, str]:
    """(shape, dtype, where made) -> the jax.custom_vjp fwd rule that returns it, for each
    residual of ``fn``'s gradient that one returns: traced as JAX's saved_residuals traces
    (the jaxpr of ``jax.linearize``'s linear function, whose inputs are the residuals), only
    where ``fn`` calls a custom_vjp function."""
    if closed is None or not any(eqn.primitive.name.startswith("custom_vjp_call")
                                 for j, _ in jaxprs.walk(closed)
                                 for eqn in getattr(j, "eqns", ())):
        return {}
    jax = devices.start_jax()
    leaves, tree = jax.tree.flatten((args, kwargs))

    def flat(*leaves):
        a, k = jax.tree.unflatten(tree, leaves)
        return fn(*a, **k)

    try:
        linear = jax.make_jaxpr(lambda *xs: jax.linearize(flat, *xs)[1])(*leaves)
    except Exception:
        return {}
    return {(shape, dtype, where): rule
            for shape, dtype, where, rule in jaxprs.custom_vjp_residuals(linear)}


def residuals(fn: Callable, *args, **kwargs) -> Residuals:
    """What ``jax.grad(fn)`` keeps from the forward pass, from JAX's own list
    (``jax.ad_checkpoint.print_saved_residuals``): each array, its size and where it was made.
    Arrays or ``jax.ShapeDtypeStruct`` shapes; nothing runs. ``fn`` is the function whose
    gradient is taken (the loss), not the whole training step. What a jax.checkpoint policy
    offloads to host memory is counted apart (``offloaded_bytes``) from what waits in device
    memory (``saved_bytes``).

    >>> import jax.numpy as jnp
    >>> r = residuals(lambda w, x: jnp.sum(jnp.sin(x @ w)), jnp.ones((3, 3)), jnp.ones((5, 3)))
    >>> r.saved_bytes  # cos(x @ w), a 5x3 float32 array, kept for the backward pass
    60
    """
    devices.start_jax()  # JAX can start here, or a BackendError says why
    if not callable(fn):
        raise BadInputError(f"fn must be a function, got {fn!r}")
    saved = jaxcompat.verify("saved_residuals")
    try:
        found = saved(fn, *args, **kwargs)
    except Exception as err:
        raise BadInputError(f"{compiled.function_name(fn)} could not be differentiated on "
                            f"these arguments ({compiled.describe_arguments((args, kwargs))})"
                            f"{compiled.user_line(err)}: "
                            f"{type(err).__name__}: {str(err).splitlines()[0]}") from None
    lengths_run, carries, steps, closed = _scans(fn, args, kwargs)
    rules = _fwd_rules(fn, args, kwargs, closed)
    offloads = jaxprs.checkpoint_offloads(closed) if closed is not None else ()
    kinds = {kind for _, kind, _, _ in offloads}
    out, made_at = [], {}
    for aval, source in found:
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize
        shape, dtype, where = tuple(aval.shape), str(aval.dtype), _made_at(str(source))
        out.append(Residual(shape, dtype, nbytes, _short(str(source)),
                            str(source).startswith("from the argument"),
                            rules.get((shape, dtype, where), ""), _memory(aval, kinds)))
        made_at[id(out[-1])] = where
    out.sort(key=lambda r: (r.memory != "device", -r.nbytes))
    extra = [r for r in out if not r.is_argument and r.memory == "device"]
    offloaded = [r for r in out if not r.is_argument and r.memory != "device"]
    # a scan's stacked outputs lead with its length; its final carry, also "output of scan",
    # does not grow with the length
    scans = [r for r in extra if r.source.startswith("output of scan") and r.shape
             and (lengths_run is None or (r.shape[0] in lengths_run
                                          and (r.shape, r.dtype) not in carries))]
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
    pairs = jaxprs.pairwise_reductions(closed) if closed is not None and extra else ()
    pairwise, pair = [], None
    for found_pair in pairs:
        shape, a, b = found_pair[0], *found_pair[2]
        hits = [r for r in extra if len(r.shape) > max(a, b)
                and (r.shape[a], r.shape[b]) == (shape[a], shape[b])]
        if sum(r.nbytes for r in hits) > sum(r.nbytes for r in pairwise):
            pairwise, pair = hits, found_pair
    names = list(dict.fromkeys(what for what, _, returned, _ in offloads
                               if what and not returned))
    lead = _offloaded_note(offloaded, saved_bytes, names) if offloaded else ""
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
                  + _fwd_rule_fix(r.fwd_rule))
    elif scan_bytes:
        per_scan: dict[tuple[int, str], int] = {}  # (length, where): the bytes it stacks
        for r in scans:
            key = (r.shape[0], made_at[id(r)])
            per_scan[key] = per_scan.get(key, 0) + r.nbytes
        (length, where), stacked = max(per_scan.items(), key=lambda kv: kv[1])
        fix = ("If the scan's body is not wrapped in jax.checkpoint yet, wrapping it keeps only "
               "each step's carry and recomputes the rest in the backward pass; if it is, a "
               "shorter scan (or fewer layers) is what shrinks it.")
        if (length, where) in steps:
            s = steps[(length, where)]
            fix = _checkpoint_fix(length, stacked // length, s.carry_bytes, s.checkpointed,
                                  s.chunked)
        advice = (f"{format_bytes(scan_bytes)} of the {format_bytes(saved_bytes)} kept are "
                  f"scan outputs stacked over {', '.join(map(str, lengths))} steps, so they "
                  f"grow with the length. {fix}")
    elif pair is not None and pair[6] >= 0 and 2 * sum(r.nbytes for r in pairwise) >= saved_bytes:
        # (the reduced axis runs along an input: chunks of it are what a scan can take; a
        # one-hot against jnp.arange is no pair of inputs, and its fix is take_along_axis)
        arg = _input_name(fn, args, kwargs, pair[6])
        advice = _pairwise_note(pairwise, saved_bytes, pair, arg,
                                _gradient_temp(fn, args, kwargs), compiled.function_name(fn))
    elif saved_bytes:
        advice = (f"{format_bytes(saved_bytes)} is kept between the forward and backward pass: "
                  "jax.checkpoint on the largest layer (or a policy such as "
                  "jax.checkpoint_policies.dots_with_no_batch_dims_saveable) trades it for "
                  "recomputation. Fewer residuals need not mean a lower peak: XLA plans the "
                  "gradient's buffers itself, so compare preflight_step(jax.grad(loss), ...) "
                  "before and after.")
    advice = f"{lead} {advice}".strip()
    return Residuals(compiled.function_name(fn), tuple(out), saved_bytes, scan_bytes, lengths,
                     advice, sum(r.nbytes for r in offloaded),
                     "/".join(sorted({r.memory for r in offloaded})))
