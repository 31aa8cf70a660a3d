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
  over devices).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers import allocation, compiled, devices
from helpers._internal import frames, jaxcompat, jaxprs
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record
from helpers.datasets import read_header
from helpers.errors import BadInputError, FileError
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes

if TYPE_CHECKING:
    import jax

__all__ = ["FIX", "Preflight", "Residual", "Residuals", "StateCopy", "StepPreflight",
           "TensorInfo", "judge", "preflight",
           "preflight_step", "residuals"]

FIX = ("load it into host memory instead, without JAX: `safetensors.numpy.load_file(path)` "
        "(about the file's size) or a read-only numpy.memmap of the data (pages from the file), "
        "then `jax.device_put` one batch at a time. `safetensors.flax.load_file` under "
        "`with jax.default_device(jax.devices('cpu')[0]):` also lands in host memory, at "
        "about four times the file at its peak")
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
class StateCopy(Record):
    """A subtree of one argument with another argument's shapes: state kept between steps (an
    optimizer's moments, a gradient accumulator), as large again as what it copies."""

    holder: str  # the argument that holds it, as fn names it, e.g. "opt_state"
    path: str  # where in it, as jax.tree_util.keystr writes it, e.g. "[0].mu"
    of: str  # the argument whose shapes it has, e.g. "params"
    nbytes: int
    of_nbytes: int  # the bytes of the argument it copies


@dataclass(frozen=True)
class NarrowedArgument(Record):
    """An array argument the step reads only through a cast to a narrower floating type: kept
    at full width on the device for a computation that never uses it so."""

    argument: str  # as fn names it, with the path in it, e.g. "params['Dense_0']['kernel']"
    dtype: str  # as stored, e.g. "float32"
    shape: tuple[int, ...]
    nbytes: int
    read_as: str  # the type the step casts it to, e.g. "bfloat16"
    line: str  # the user's line that casts it ("" where not recorded)


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
    code_bytes: int  # generated code (0 on the CPU backend)
    peak_bytes: int  # the kit's: arguments + outputs - aliased + temporaries + constants + runtime
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
    state_copies: tuple[StateCopy, ...] = ()
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
    narrowed_arguments: tuple[NarrowedArgument, ...] = ()
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


#: operations that hand a value to the host: under GSPMD they take it whole (jax#25842)
_CALLBACKS = ("debug_print", "debug_callback", "pure_callback", "io_callback")


def _gathered(temporaries, args, kwargs) -> list:
    """The large temporaries (1 MiB or more) of a callback (jax.debug.print, a host callback)
    with the whole shape of an argument split over several devices: a value gathered from its
    shards to be handed to the host. (A gather a sharded layer makes by design is not one.)"""
    whole = {tuple(leaf.shape) for leaf in devices.start_jax().tree.leaves((args, kwargs))
             if compiled.devices_split_over(leaf) > 1}
    return [t for t in temporaries if t.op in _CALLBACKS and tuple(t.shape) in whole
            and t.nbytes >= 2**20]


def _spread_arguments(c: compiled.CompiledStep, fn, args, kwargs
                      ) -> tuple[tuple[str, int], ...]:
    """(name, devices) of each argument with an array split over several devices (one that
    is whole on each, replicated, costs a device what it is priced at)."""
    jax, out = devices.start_jax(), []
    for name, value in c.arguments(fn, args, kwargs):
        n = max((compiled.devices_split_over(leaf) for leaf in jax.tree.leaves(value)),
                default=1)
        if n > 1:
            out.append((name, n))
    return tuple(out)


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


def _batched_by_line(c: compiled.CompiledStep, peak: int, most: int = 16
                     ) -> list[tuple[compiled.Temporary, int, int]]:
    """(the largest, how many, their bytes) of the values made under jax.vmap, per line of the
    user's code, where they come to a quarter of the peak or more, largest first (one line can
    make several: each of a layer's weights, drawn for every layer at once; equinox#673)."""
    lines: dict[str, list[compiled.Temporary]] = {}
    for t in c.temporaries(most):
        if t.batched:
            lines.setdefault(t.line or f"({t.op})", []).append(t)
    out = [(max(ts, key=lambda t: t.nbytes), len(ts), sum(t.nbytes for t in ts))
           for ts in lines.values()]
    return sorted([b for b in out if b[2] * 4 >= peak], key=lambda b: -b[2])


def _batched_note(t: compiled.Temporary, count: int = 1, total: int = 0) -> str:
    """The largest value made under jax.vmap for the whole batch at once, and how to make it
    in chunks: under a derivative, chunks alone keep every chunk's values for the backward
    pass (jax#8409: 16 MiB of temporaries with vmap, 40 MiB with lax.map(f, batch_size=8),
    2 MiB with lax.map(jax.checkpoint(f), batch_size=8); measured by the kit on jax 0.10.2).
    A lax.cond whose predicate vmap batches is a select: both branches run."""
    at = f", {t.line}" if t.line else ""
    head = (f"The largest value, {t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}"
            f"{at}), is made under jax.vmap for every element of the batch at once, as the "
            "vectorized code would be")
    if count > 1:
        head = (f"{count} values from one line, {format_bytes(total)} together, are made "
                f"under jax.vmap for every element of the batch at once, as the vectorized code "
                f"would be (the largest, {t.op} {t.dtype}{list(t.shape)}, "
                f"{format_bytes(t.nbytes)}{at})")
    cond = t.op == "select_n" and re.search(r"\bcond\(", t.line) is not None
    if cond:
        head += (". A lax.cond whose predicate jax.vmap batches becomes a select (XLA has no "
                 "batched conditional), so both branches run for every element")
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
    return f"{head}: {fix}."


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


def _stack_note(t: compiled.ScanStack, peak: int) -> str:
    at = f" ({t.line})" if t.line else ""
    largest = (f"; the largest, {t.dtype}{list(t.shape)}" if t.outputs > 1 else
               f": {t.dtype}{list(t.shape)}")
    head = (f"A lax.scan{at} keeps a value for each of its {t.length} steps, "
            f"{format_bytes(t.nbytes)} stacked over its length ({t.nbytes / peak:.0%} of the "
            f"peak{largest})")
    if t.role == "forward":
        return (f"{head}: it runs under a derivative (jax.grad, jax.vjp), so beside what its "
                "body returns it keeps what the backward pass needs from each step. "
                "preflight.residuals(loss, ...) lists those. jax.checkpoint on the body, if it "
                "is not there yet, keeps only "
                "each step's carry and recomputes the rest; if it is, the carries are what is "
                "left, and a shorter scan shrinks them.")
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
    0.8.0 and 0.10.2: an 8 MiB normal table, 24 MiB of temporaries; with an rbg key, none)."""
    draws = [d for d in c.threefry_draws() if d[1] >= 2**20]
    if not draws or 2 * temp < peak:
        return ""
    shape, nbytes, line = draws[0]
    kept = sum(t.nbytes for t in c.temporaries(8) if t.dtype in ("u32", "uint32")
               and tuple(t.shape) == shape)
    if 2 * kept < temp:
        return ""
    return (f"jax.random{' at ' + line if line else ''} draws {format_bytes(nbytes)} of random "
            f"bits through threefry2x32, JAX's default generator, and XLA's plan holds "
            f"{format_bytes(kept)} of uint32 values that size while making them "
            f"({kept / nbytes:.0f}x the draw). A key of the 'rbg' generator makes them with no "
            "such temporaries: jax.random.key(seed, impl='rbg'), or "
            "jax.config.update('jax_default_prng_impl', 'rbg') before any key is made (other "
            "numbers, the same distribution; froystig in jax-ml/jax#17982). Or draw a large "
            "table in pieces.")


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
    split = _argument_split(c, fn, args, kwargs)
    copies = _state_copies(c, fn, args, kwargs)
    # the CPU runtime's own copies for weight-gradient convolutions (outside XLA's plan)
    runtime = c.runtime_bytes() if target is None else 0
    peak = a["peak"] + c.constants + runtime
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
                     "do not): pass them as arguments instead.")
    if c.folded >= 2**20:
        notes.append(f"{format_bytes(c.folded)} of constants XLA computed while compiling "
                     "(constant folding: a value made inside the jitted function from no "
                     "argument, such as jnp.ones(...).at[...].set(...)) are baked into the "
                     "program, which holds them as long as it lives, and folding them slows "
                     "the compile. Make such a value from an argument, or compile without "
                     "folding: jax.jit(f).lower(*args).compile(compiler_options="
                     "{'xla_disable_hlo_passes': 'constant_folding'}).")
    if not (c.conflict or c.lowered_with_arguments) and (  # (a wrapper's own donation: unseen)
            undonated := _donation_would_save(c, fn, args, kwargs)):
        names, saving = undonated
        notes.append(f"Nothing donated for {', '.join(names)}, yet {format_bytes(saving)} of "
                     "the outputs have their shapes and dtypes: the old values stay alive "
                     f"beside the new. Donating {' and '.join(names)} (donate_argnums or "
                     "donate_argnames; nnx.jit takes them too), if you do not use the old "
                     "values after the call, lets XLA write the outputs into them: up to that "
                     "much less at the peak, as XLA plans it (preflight_step with the donation "
                     "shows its plan).")
    if copies:
        notes.append(_copies_note(copies))
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
    if batched:
        notes.append(_batched_note(*batched[0]))
    leaves = sum(1 for a in c.dynamic(args, kwargs) for leaf in devices.start_jax().tree.leaves(a)
                 if hasattr(leaf, "shape"))
    if unrolled := c.unrolled(leaves):
        notes.append(unrolled)
    stacks = c.scan_stacks(a["output"] + a["temp"])
    named = [t for t in stacks if t.role != "backward"]  # JAX's own scan: nothing to change
    if named and named[0].nbytes * 4 >= peak:
        notes.append(_stack_note(named[0], peak))
    if device is None and target is None and (host := _on_the_host_by_commitment(dev)):
        notes.append(host)
    if bits := _threefry_note(c, a["temp"], peak):
        notes.append(bits)
    casts = [x for x in c.cast_before_scan() if x[6] != "backward"]
    if casts and casts[0][3] >= 2**20 and casts[0][3] * 8 >= peak:
        notes.append(_cast_note(*casts[0]))
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
    narrowed = _narrowed_arguments(c, fn, args, kwargs)
    in_trees = tuple(n for n in narrowed if not _is_data(n))  # parameters
    whole = tuple(n for n in narrowed if _is_data(n))  # a batch of data
    for group, note in ((in_trees, _narrowed_note), (whole, _narrowed_data_note)):
        if (wide := sum(n.nbytes for n in group)) >= 2**20 and 8 * wide >= peak:
            notes.append(note(group, wide))
    if static := _static_arrays(c, fn, args, kwargs):
        name, node, array = static[0]
        notes.append(
            f"{name} keeps an array, {array}, in the static part of its {node} (the pytree's "
            "metadata: a field marked static): jit bakes it into the program as a constant and "
            "compares it with == at every call, which raises for another array of more than "
            "one element (\"arrays cannot be passed as metadata fields\"). Make it an ordinary "
            "field, a child of the pytree, so it is passed to the step as an argument.")
    spread = _spread_arguments(c, fn, args, kwargs)
    if spread and device is None and (gathered := _gathered(temporaries, args, kwargs)):
        t = gathered[0]
        notes.append(
            f"{t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}"
            f"{', ' + t.line if t.line else ''}) is the whole of an array the arguments split "
            "over devices: a value gathered from its shards to be handed to the host. "
            "jax.debug.print and host callbacks take what they are given whole: give them a "
            "slice or a reduction.")
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
        alias_bytes=a["alias"], temp_bytes=a["temp"], code_bytes=a["generated_code"],
        peak_bytes=peak, xla_peak_bytes=a["xla_peak"], resident_bytes=resident,
        needed_bytes=needed, in_use_bytes=in_use, in_use_source=in_use_source,
        free_bytes=free, free_source=free_source, donated=c.donated, verdict=verdict,
        advice=advice, dropped_bytes=c.dropped, constant_bytes=c.constants,
        folded_bytes=c.folded,
        donations=c.donations, largest_temporaries=temporaries,
        runtime_bytes=runtime, argument_split=split, state_copies=copies, scan_stacks=stacks,
        ignored_device_puts=ignored, spread_arguments=spread, static_arrays=static,
        jacobians=jacobians, scaled_by_zero=zeroed, narrowed_arguments=narrowed,
        cast_before_scan=tuple((f"{to}{list(shape)}", n, line)
                               for _, to, shape, n, line, _, _ in casts),
        dropped_device_keywords=dropped, zero_gradients=zeros, unsplit_sharding_puts=unsplit)


def _donation_would_save(c: compiled.CompiledStep, fn, args, kwargs
                         ) -> tuple[list[str], int] | None:
    """(the arguments worth donating, the output bytes they could take) when an undonated
    top-level argument has outputs of its leaves' shapes and dtypes for at least half its bytes
    and 1 MiB; None otherwise. Outputs are matched once each, largest arguments first. Over a
    mesh XLA matches the sharding too (an output of another layout takes nothing), and bytes
    are each device's."""
    jax = devices.start_jax()
    made = c.outputs()
    outputs = [(tuple(o.shape), str(o.dtype)) for _, o, _ in made]
    try:
        out_shardings = (jax.tree.leaves(c.executable.output_shardings) if c.over_mesh
                         else [None] * len(outputs))
    except Exception:
        return None
    arrays = _donatable_leaves(c, fn, args, kwargs, jax)
    if not outputs or arrays is None or len(out_shardings) != len(outputs):
        return None
    names = dict(c.argument_names(fn, args, kwargs))
    # a gradient has its parameter's shape, and is no new value of it: donating the parameters
    # to a step that only returns gradients would lose them (only an update replaces them)
    free = [(o, s) for o, s, (_, _, kind) in zip(outputs, out_shardings, made, strict=True)
            if not kind.endswith("gradient")]
    chosen, saving = [], 0
    for i, leaves in sorted(arrays.items(), key=lambda kv: -sum(n for _, n, _ in kv[1])):
        total = sum(n for _, n, _ in leaves)
        matched, took = 0, []
        for key, nbytes, sharding in leaves:
            hit = next((f for f in free if f[0] == key and (
                sharding is None or compiled.same_sharding(f[1], sharding, len(key[0])))), None)
            if hit is not None:
                free.remove(hit)
                took.append(hit)
                matched += nbytes
        if total and matched * 2 >= total and matched >= 2**20:
            chosen.append(names[i])
            saving += matched
        else:
            free += took  # not worth donating: give its outputs back
    return (chosen, saving) if chosen else None


def _donatable_leaves(c: compiled.CompiledStep, fn, args, kwargs, jax) -> dict | None:
    """For each undonated positional argument the executable takes: its array leaves as
    ((shape, dtype), bytes, the sharding it is taken with, over a mesh; else None), a leaf XLA
    drops left out over a mesh. None where the executable does not say its shardings."""
    wanted = None
    if c.over_mesh:
        wanted = c.input_shardings(args, kwargs)
        if wanted is None:
            return None
    names = dict(c.argument_names(fn, args, kwargs))
    out, i = {}, 0
    for where, value in enumerate(args):
        if where in c.static_argnums:
            continue  # not among the executable's arguments
        leaves = jax.tree.leaves(value)
        mine = wanted[i:i + len(leaves)] if wanted else [None] * len(leaves)
        i += len(leaves)
        if where in c.donated or where not in names:
            continue
        out[where] = [
            ((tuple(x.shape), str(x.dtype)),
             compiled.array_bytes(x) if s is None else
             math.prod(s.shard_shape(tuple(x.shape))) * x.dtype.itemsize, s)
            for x, s in zip(leaves, mine, strict=True)
            if hasattr(x, "shape") and hasattr(x, "dtype") and (wanted is None or s is not None)]
    return out


def _static_arrays(c: compiled.CompiledStep, fn, args, kwargs
                   ) -> tuple[tuple[str, str, str], ...]:
    """(argument, node type, "float32[3] (12 B)") of each array of more than one element that
    an argument's pytree keeps in its metadata (equinox#746: a JAX array in a static field)."""
    return tuple((name, node, f"{a.dtype}{list(a.shape)} ({format_bytes(compiled.array_bytes(a))})")
                 for name, value in c.arguments(fn, args, kwargs)
                 for node, a in compiled.metadata_arrays(value))


def _narrowed_arguments(c: compiled.CompiledStep, fn, args, kwargs
                        ) -> tuple[NarrowedArgument, ...]:
    """Each array argument the step reads only through a narrower cast, largest first; not one
    with an output of its shape and dtype (a gradient or an updated copy: master weights kept
    at full width on purpose)."""
    jax = devices.start_jax()
    made = c.outputs()
    if not made:  # an executable that does not say: no way to tell master weights apart
        return ()
    outputs = {(tuple(o.shape), str(o.dtype)) for _, o, _ in made}
    positional = [name for where, name in c.argument_names(fn, args, kwargs)
                  if isinstance(where, int)]
    out = []
    for path, leaf, to, line in c.narrowed_inputs(args, kwargs):
        if (tuple(leaf.shape), str(leaf.dtype)) in outputs or not hasattr(leaf, "dtype"):
            continue
        top = path[1]  # (args, kwargs)[0][i] or [1][key]
        name = positional[top.idx] if path[0].idx == 0 else str(top.key)
        out.append(NarrowedArgument(name + jax.tree_util.keystr(path[2:]), str(leaf.dtype),
                                    tuple(leaf.shape), compiled.array_bytes(leaf), to, line))
    return tuple(sorted(out, key=lambda n: -n.nbytes))


#: argument names that say what they hold: a batch of data, or parameters
_DATA_NAME = re.compile(r"^(?:x|xs|y|batch\w*|inputs?|data\w*|images?|tokens?|features?|obs\w*|"
                        r"examples?|samples?)$", re.IGNORECASE)
_PARAMS_NAME = re.compile(r"param|weight|variables|state|model|kernel|^w\d*$", re.IGNORECASE)


def _is_data(n: NarrowedArgument) -> bool:
    """A batch of data rather than parameters: by the argument's name where it says (x, batch,
    inputs; params, weights, state), else by its shape of tree (a whole array is data, a leaf
    of a tree a parameter)."""
    root = _root(n.argument)
    if _DATA_NAME.match(root):
        return True
    if _PARAMS_NAME.search(root):
        return False
    return n.argument == root


def _root(argument: str) -> str:
    """The top-level argument's name in a leaf's path ("params" of "params['w']")."""
    return re.split(r"[\[.]", argument, maxsplit=1)[0]


def _saved(narrowed: tuple[NarrowedArgument, ...], wide: int) -> int:
    """The bytes the narrower type would save."""
    jnp = devices.start_jax().numpy
    return wide - sum(n.nbytes * jnp.dtype(n.read_as).itemsize // jnp.dtype(n.dtype).itemsize
                      for n in narrowed)


def _narrowed_note(narrowed: tuple[NarrowedArgument, ...], wide: int) -> str:
    """The note for arrays of argument trees (parameters) read only through a narrower cast:
    what they cost, the fix."""
    first, more = narrowed[0], len(narrowed) - 1
    hf = {"bfloat16": "to_bf16", "float16": "to_fp16"}.get(first.read_as)
    root = _root(first.argument)
    return (
        f"{first.argument}{f' and {more} more argument arrays' if more else ''} "
        f"({format_bytes(wide)}, {first.dtype}) {'are' if more else 'is'} read only as "
        f"{first.read_as}{f' ({first.line})' if first.line else ''}: the step casts "
        f"{'them' if more else 'it'} at every call, and the {first.dtype} "
        f"cop{'ies stay' if more else 'y stays'} on the device though the computation uses "
        f"only the {first.read_as} one{'s' if more else ''}. Stored as {first.read_as} "
        f"(jax.tree.map(lambda p: p.astype(jnp.{first.read_as}), {root})"
        f"{f'; a Hugging Face Flax model: model.{hf}({root})' if hf else ''}) "
        f"{'they take' if more else 'it takes'} {format_bytes(_saved(narrowed, wide))} less. "
        "A Flax module's dtype= sets the computation's type, not the parameters' (param_dtype "
        f"does). Keep them {first.dtype} where they are master weights that an optimizer "
        "updates.")


def _narrowed_data_note(narrowed: tuple[NarrowedArgument, ...], wide: int) -> str:
    """The note for whole array arguments (a batch of data) read only through a narrower
    cast."""
    first, more = narrowed[0], len(narrowed) - 1
    names = " and ".join(n.argument for n in narrowed[:3])
    return (
        f"{names} ({format_bytes(wide)}, {first.dtype}) {'are' if more else 'is'} read only "
        f"as {first.read_as}{f' ({first.line})' if first.line else ''}: made or loaded as "
        f"{first.read_as}, {'they take' if more else 'it takes'} "
        f"{format_bytes(_saved(narrowed, wide))} less on the device, and in each copy to it.")


def _argument_split(c: compiled.CompiledStep, fn, args, kwargs) -> tuple[tuple[str, int], ...]:
    """Each top-level argument's array bytes (each buffer once), named as ``fn`` names its
    parameters ("args[2]" for ``*args``), largest first; static arguments are left out."""
    seen: dict[int, str] = {}  # id of an array -> the argument it was counted under
    out = []
    for name, value in c.arguments(fn, args, kwargs):
        total, elsewhere = 0, []
        for leaf in devices.start_jax().tree.leaves(value):
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                continue
            if id(leaf) in seen:
                elsewhere.append(seen[id(leaf)])
                continue
            seen[id(leaf)] = name
            total += compiled.array_bytes(leaf)
        if elsewhere and not total:  # passed twice: XLA's argument size counts it twice
            name = f"{name} (the same arrays as {', '.join(dict.fromkeys(elsewhere))})"
        out.append((name, total))
    return tuple(sorted(out, key=lambda kv: -kv[1]))


def _state_copies(c: compiled.CompiledStep, fn, args, kwargs) -> tuple[StateCopy, ...]:
    """Each subtree of an argument that has the structure, keys and shapes of another argument,
    or of another field of the same argument (a Flax TrainState holds ``params`` and
    ``opt_state``): an Adam state's ``mu`` and ``nu`` beside the parameters. Only for a tree of
    two arrays or more and at least 1 MiB (a single array's shape can recur by chance); a tree
    that is a copy as a whole (the gradients beside the parameters) is not one, and of two
    trees alike only the first is looked for."""
    jax = devices.start_jax()
    arrays = {}
    for name, value in c.arguments(fn, args, kwargs):
        arrays[name] = [(tuple(str(k) for k in path), leaf) for path, leaf
                        in jax.tree_util.tree_flatten_with_path(value)[0]
                        if hasattr(leaf, "shape") and hasattr(leaf, "dtype")]
    trees = []  # (label, argument, the field's key or None, its arrays by relative path)
    for name, leaves in arrays.items():
        trees.append((name, name, None, leaves))
        for key in dict.fromkeys(path[0] for path, _ in leaves if len(path) > 1):
            trees.append((f"{name}{key}", name, key,
                          [(path[1:], x) for path, x in leaves if path[0] == key]))
    out, looked_for, found = [], set(), []  # found: (holder, key path) of each copy so far
    for of, of_arg, key, like in trees:
        want = tuple((path, tuple(x.shape)) for path, x in like)
        size = sum(compiled.array_bytes(x) for _, x in like)
        if len(like) < 2 or want in looked_for or size < 2**20:
            continue
        looked_for.add(want)
        for holder, held in arrays.items():
            if holder == of_arg and key is None:
                continue
            for path, nbytes in _subtrees_like(held, list(want)):
                # within one argument, only deeper than a field (TrainState.opt_state.mu): a
                # field beside it with its shapes is a sibling (two identical layers); and a
                # part of a copy already found (mu['l1'] of params['l1']) is no new one
                if (holder == of_arg and len(path) < 2) or any(
                        h == holder and path[:len(q)] == q for h, q in found):
                    continue
                found.append((holder, path))
                out.append(StateCopy(holder, "".join(path), of, nbytes, size))
    return tuple(out)


def _subtrees_like(leaves: list[tuple[tuple[str, ...], Any]], want: list[tuple]
                   ) -> list[tuple[tuple[str, ...], int]]:
    """(key path, bytes) of each subtree whose arrays have the key paths and shapes in ``want``,
    beneath it and in order, as the tree holds them. Never the whole tree: a tree that is a
    copy as a whole (as gradients are of the parameters) is not state kept beside it."""
    under: dict[tuple[str, ...], list[int]] = {}
    for i, (path, _) in enumerate(leaves):
        for k in range(1, len(path)):
            under.setdefault(path[:k], []).append(i)
    found = []
    for prefix, idx in under.items():
        if len(idx) == len(want) and [(leaves[i][0][len(prefix):], tuple(leaves[i][1].shape))
                                      for i in idx] == want:
            found.append((idx[0], prefix, sum(compiled.array_bytes(leaves[i][1]) for i in idx)))
    return [(path, nbytes) for _, path, nbytes in sorted(found)]


def _copies_note(copies: tuple[StateCopy, ...]) -> str:
    """One sentence per argument that holds copies of another: how many, where, and how to
    shrink them."""
    out = []
    for holder, of in dict.fromkeys((c.holder, c.of) for c in copies):
        mine = [c for c in copies if (c.holder, c.of) == (holder, of)]
        total = sum(c.nbytes for c in mine)
        where = ", ".join(f"{holder}{c.path}" for c in mine)
        n, whose = len(mine), of + ("'" if of.endswith("s") else "'s")
        out.append(
            f"{holder} holds {n} {'copy' if n == 1 else 'copies'} of {whose} shapes ({where}: "
            f"{format_bytes(total)}, {total / mine[0].of_nbytes:.2f}x {of}): state kept from "
            "step to step, such as an optimizer's moments or a gradient accumulator, each as "
            f"many numbers as {of}. To shrink it: a smaller dtype where the optimizer "
            "takes one (optax.adam's mu_dtype, optax.MultiSteps' accumulator_dtype), an "
            "optimizer that keeps less (optax.adafactor factors its second moment; optax.sgd "
            "without momentum keeps none), or the state sharded over devices.")
    return " ".join(out)


# --- what a gradient keeps for the backward pass ------------------------------------------------
@dataclass(frozen=True)
class Residual(Record):
    """One array a gradient keeps from the forward pass for the backward pass."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    source: str  # JAX's words: "from the argument x", "output of scan from model.py:12 (f)"
    is_argument: bool  # an argument itself: kept anyway, costs nothing extra


@dataclass(frozen=True)
class Residuals(Display):
    """What ``jax.grad`` of a function keeps between its forward and backward pass: the arrays,
    how many bytes beyond the arguments, the part a scan multiplies by its length, and the fix."""

    function: str
    residuals: tuple[Residual, ...]  # largest first
    saved_bytes: int  # beyond the arguments: memory held from the forward to the backward pass
    scan_bytes: int  # of which stacked scan outputs (one slice per scan step or layer)
    scan_lengths: tuple[int, ...]  # the lengths that multiply them
    advice: str


_SOURCE_LINE = re.compile(r"from (\S+?):(\d+)(?::\d+)? ")


def _short(source: str) -> str:
    """JAX's "output of scan from /tmp/ipykernel_1/94.py:5:11 (f)" with the file named as the
    kit names lines ("cell, line 5"), without a machine's paths."""
    return _SOURCE_LINE.sub(lambda m: f"from {frames.where(m.group(1), int(m.group(2)))} ",
                            source, count=1)


def _scan_lengths(fn: Callable, args, kwargs) -> tuple[set[int] | None, set[tuple]]:
    """(the lengths of the scans in ``fn``'s forward pass, nested ones included; the (shape,
    dtype) of their carries, which a stacked output is not). None where it cannot be traced
    apart (then every scan output counts as stacked)."""
    jax = devices.start_jax()
    try:
        closed = jax.make_jaxpr(fn)(*args, **kwargs)
    except Exception:
        return None, set()
    scans = [eqn for j, _ in jaxprs.walk(closed) for eqn in getattr(j, "eqns", ())
             if eqn.primitive.name == "scan"]
    return ({int(eqn.params["length"]) for eqn in scans},
            {(tuple(v.aval.shape), str(v.aval.dtype)) for eqn in scans
             for v in eqn.outvars[:eqn.params["num_carry"]] if hasattr(v.aval, "shape")})


def residuals(fn: Callable, *args, **kwargs) -> Residuals:
    """What ``jax.grad(fn)`` keeps from the forward pass, from JAX's own list
    (``jax.ad_checkpoint.print_saved_residuals``): each array, its size and where it was made.
    Arrays or ``jax.ShapeDtypeStruct`` shapes; nothing runs. ``fn`` is the function whose
    gradient is taken (the loss), not the whole training step.

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
    out = []
    for aval, source in found:
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
        out.append(Residual(tuple(aval.shape), str(aval.dtype), nbytes, _short(str(source)),
                            str(source).startswith("from the argument")))
    out.sort(key=lambda r: -r.nbytes)
    extra = [r for r in out if not r.is_argument]
    # a scan's stacked outputs lead with its length; its final carry, also "output of scan",
    # does not grow with the length
    lengths_run, carries = _scan_lengths(fn, args, kwargs)
    scans = [r for r in extra if r.source.startswith("output of scan") and r.shape
             and (lengths_run is None or (r.shape[0] in lengths_run
                                          and (r.shape, r.dtype) not in carries))]
    saved_bytes, scan_bytes = sum(r.nbytes for r in extra), sum(r.nbytes for r in scans)
    lengths = tuple(sorted({r.shape[0] for r in scans}))
    advice = ""
    if scan_bytes:
        advice = (f"{format_bytes(scan_bytes)} of the {format_bytes(saved_bytes)} kept are "
                  f"scan outputs stacked over {', '.join(map(str, lengths))} steps, so they "
                  "grow with the length. If the scan's body is not wrapped in jax.checkpoint "
                  "yet, wrapping it keeps only each step's carry and recomputes the rest in "
                  "the backward pass; if it is, a shorter scan (or fewer layers) is what "
                  "shrinks it.")
    elif saved_bytes:
        advice = (f"{format_bytes(saved_bytes)} is kept between the forward and backward pass: "
                  "jax.checkpoint on the largest layer (or a policy such as "
                  "jax.checkpoint_policies.dots_with_no_batch_dims_saveable) trades it for "
                  "recomputation. Fewer residuals need not mean a lower peak: XLA plans the "
                  "gradient's buffers itself, so compare preflight_step(jax.grad(loss), ...) "
                  "before and after.")
    return Residuals(compiled.function_name(fn), tuple(out), saved_bytes, scan_bytes, lengths,
                     advice)
