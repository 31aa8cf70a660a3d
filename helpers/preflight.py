"""Will it fit? A safetensors file before it is loaded (:func:`preflight`), a step before it
runs (:func:`preflight_step`), on this machine or on a card you are not on (``target=``), and
what a gradient keeps for the backward pass (:func:`residuals`). The step's peak measured while
it runs: :mod:`helpers.measure`.

- :func:`preflight` reads only a file's header (never its data) and compares the bytes with the
  free memory of the device the load would land on *right now*: the allocator's
  ``bytes_limit - bytes_in_use`` on a GPU, the host's available memory on the CPU.
- :func:`preflight_step` compiles a function for the device it would run on, without running it
  and without moving any argument, and compares XLA's own estimate
  (``compiled.memory_analysis()``) with what is free there, computed as for files. What the step
  needs is XLA's peak minus the argument bytes that already sit on that device; where that memory
  goes (constants, donations, the largest temporaries and their lines) is in the record.
"""

from __future__ import annotations

import math
import os
import re
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers import allocation
from helpers._internal import frames, jaxcompat
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record
from helpers.datasets import read_header
from helpers.errors import (
    BackendError,
    BadInputError,
    CompileOutOfMemory,
    FileError,
    MeasurementFailed,
)
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes

if TYPE_CHECKING:
    import jax

__all__ = ["CompiledStep", "DonatedArgument", "FIX", "Preflight", "Residual", "Residuals",
           "StepPreflight", "Temporary", "TensorInfo", "compile_step", "judge", "preflight",
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


# --- where would it land, and is there room ----------------------------------------------
_DOCTOR = "run `python -m helpers doctor` to see why and how to fix it"


def _jax():
    """JAX, imported; BackendError (not a traceback) when this environment cannot import it."""
    try:
        return jaxcompat.import_jax()
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
    from helpers.memory import memory_stats  # imports JAX: only once _jax() has

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
        dev, why = _target(device)
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


# --- will this step fit? ------------------------------------------------------------------
_TRACE_ERRORS = ("ConcretizationTypeError", "TracerBoolConversionError",
                 "TracerIntegerConversionError", "TracerArrayConversionError")


@dataclass(frozen=True)
class DonatedArgument(Record):
    """One donated array: whether XLA writes an output into its buffer, and why not."""

    argument: str  # where it is among the arguments, e.g. "0" or "0['w']"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    reused: bool
    why: str  # "" when reused


@dataclass(frozen=True)
class Temporary(Record):
    """A value the compiled step materializes between its top-level operations: one of the
    candidates for XLA's temporary buffers (which it reuses, so they need not add up)."""

    op: str  # the JAX operation, e.g. "dot_general", "tanh"
    dtype: str  # XLA's name, e.g. "f32"
    shape: tuple[int, ...]
    nbytes: int
    line: str  # the user's line that made it ("cell, line 3: h = ..."), "" where not recorded
    batched: bool = False  # made under jax.vmap (XLA's op_name says so): the whole batch at once


@dataclass(frozen=True)
class ScanStack(Record):
    """A ``lax.scan`` and what it keeps for every one of its steps: the values its body returns
    beside the carry, stacked over its length (and, in a gradient's forward scan, what the
    backward pass needs from each step)."""

    length: int
    nbytes: int  # all its stacked outputs
    outputs: int  # how many
    dtype: str  # the largest one's, e.g. "float32"
    shape: tuple[int, ...]  # the largest one's, the length first
    line: str  # the user's line that called scan ("" where not recorded)
    #: "" for a scan of the user's; "forward" in a derivative's forward pass (its stack holds
    #: what the backward pass needs too); "backward" in the backward pass (JAX's own scan)
    role: str = ""


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
    donations: tuple[DonatedArgument, ...] = ()
    #: the largest values the step materializes, with the op and the line (XLA's program text)
    largest_temporaries: tuple[Temporary, ...] = ()
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
    scan_stacks: tuple[ScanStack, ...] = ()
    #: of ``constant_bytes``, what XLA computed while compiling (constant folding: a value
    #: made from no argument inside jit, such as jnp.ones(...).at[...].set(...))
    folded_bytes: int = 0
    #: (argument, devices) of each argument spread over several devices: priced whole here
    spread_arguments: tuple[tuple[str, int], ...] = ()
    #: (device, line) of each jax.device_put to another device inside the step, which jit
    #: ignores: a device_put to a Device does not move a value inside jit
    ignored_device_puts: tuple[tuple[str, str], ...] = ()


# --- arguments as shapes on the target device ----------------------------------------------
def _check_donation(args, donate_argnums) -> tuple[int, ...]:
    jax = _jax()
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    try:
        nums = tuple(sorted(set(donate_argnums)))
    except TypeError:
        raise BadInputError(f"donate_argnums must be an int or a tuple of ints, got "
                            f"{donate_argnums!r}") from None
    for i in nums:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(args):
            raise BadInputError(f"donate_argnums={donate_argnums!r}: {i!r} is not the "
                                f"position of one of the {len(args)} positional arguments")
        for leaf in jax.tree.leaves(args[i]):
            if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
                raise BadInputError(
                    f"argument {i} is donated but holds a {type(leaf).__name__}, not a "
                    f"jax.Array: only a buffer already on the device can be donated (a NumPy "
                    f"array or a Python number is copied for each call). Fix: "
                    f"`jax.device_put` it first, or drop {i} from donate_argnums")
    return nums


def _donated_by_name(fn, args, kwargs, names) -> tuple[int, ...]:
    """The positions of the arguments ``donate_argnames`` names (as ``jax.jit`` takes them)."""
    import inspect

    names = (names,) if isinstance(names, str) else tuple(names or ())
    if not names:
        return ()
    if not all(isinstance(n, str) for n in names):
        raise BadInputError(f"donate_argnames must be a name or a tuple of names, got {names!r}")
    try:
        signature = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        raise BadInputError("donate_argnames needs a function whose signature Python can read; "
                            "use donate_argnums") from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = []  # the parameters a positional argument can fill, in order, up to any *args
    for prm in signature:
        if prm.kind not in positional:
            break
        params.append(prm.name)
    out = []
    for n in names:
        if n in kwargs:
            raise BadInputError(
                f"donate_argnames names {n!r}, passed here as a keyword: the kit prices the "
                f"donation of positional arguments. Fix: pass {n} positionally, or use "
                f"donate_argnums")
        if n not in params or params.index(n) >= len(args):
            given = ", ".join(params[:len(args)])
            raise BadInputError(f"donate_argnames names {n!r}, which is not one of the "
                                f"{len(args)} positional arguments ({given})")
        out.append(params.index(n))
    return tuple(out)


def _device_of_committed(args, jax):
    """The one device that committed array arguments pin the step to (jit runs there)."""
    found = {d for leaf in jax.tree.leaves(args) if isinstance(leaf, jax.Array)
             and getattr(leaf, "committed", False) for d in leaf.devices()}
    return next(iter(found)) if len(found) == 1 else None


def _mesh_devices(args, jax) -> tuple:
    """The devices, by id, of the first array leaf sharded over several (a mesh the step then
    runs over); () when none is."""
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            return tuple(sorted(sharding.device_set, key=lambda d: d.id))
    return ()


def _specs(args, kwargs, device, jax, keep_shardings: bool = False):
    """Array leaves as ShapeDtypeStructs placed on ``device`` (nothing is copied); other
    leaves (Python numbers, None) are left as they are. ``keep_shardings`` (a step over a
    mesh): a leaf sharded over several devices, or committed to one, keeps its sharding, and
    an uncommitted one is left for jit to place, as jit would."""
    sharding = jax.sharding.SingleDeviceSharding(device)

    def spec(leaf):
        if keep_shardings and getattr(leaf, "sharding", None) is not None and (
                len(leaf.sharding.device_set) > 1 or getattr(leaf, "committed", True)):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if keep_shardings and hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) or (
                hasattr(leaf, "shape") and hasattr(leaf, "dtype")):  # NumPy arrays and scalars
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    return jax.tree.map(spec, args), jax.tree.map(spec, kwargs)


def _kept(compiled, n_leaves: int, jax) -> list[bool] | None:
    """Which argument leaves the executable takes (jit drops the ones the step never reads:
    their input sharding is None); None when this JAX does not say."""
    try:
        shardings = jax.tree.leaves(compiled.input_shardings, is_leaf=lambda x: x is None)
    except Exception:
        return None
    return [s is not None for s in shardings] if len(shardings) == n_leaves else None


def _same_buffer(a, b) -> bool:
    if a is b:
        return True
    try:
        return (a.devices() == b.devices()
                and a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer())
    except Exception:  # sharded, deleted, or not an array
        return False


def _donation_conflict(args, kwargs, donated, jax) -> str:
    """Why the call will fail, when a donated buffer is also passed again in the same call
    (XLA: "Attempt to donate the same buffer twice" / "...a buffer that was previously
    donated"); "" when none is. Each place is named by its argument and its path in it
    (optax#1059: a state whose ``z`` was its ``params['w']``)."""
    def places(where, value):
        return [(where, jax.tree_util.keystr(path), leaf)
                for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]]

    leaves = [p for i, a in enumerate(args) for p in places(i, a)]
    leaves += [p for k, v in kwargs.items() for p in places(k, v)]

    def named(where, path) -> str:
        return f"argument {where!r}{path}" if isinstance(where, str) else f"argument {where}{path}"

    for n, (i, path, leaf) in enumerate(leaves):
        if i not in donated or not isinstance(leaf, jax.Array):
            continue
        others = [named(w, q) for m, (w, q, x) in enumerate(leaves)
                  if m != n and isinstance(x, jax.Array) and _same_buffer(leaf, x)]
        if others:
            return (f"{named(i, path)} is donated and the same buffer is passed again as "
                    f"{', '.join(dict.fromkeys(others))}: the call fails (XLA: "
                    "INVALID_ARGUMENT, \"Attempt to donate the same buffer twice\"). Fix: pass "
                    "a copy (jnp.copy(x)) where it is not the donated one, or donate it in one "
                    "place only")
    return ""


def _user_frame(err: BaseException) -> str:
    """file:line of the deepest frame outside JAX and the kit: where the user's code failed."""
    at = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frames.is_user_file(frame.filename):
            at = (f" (at {frames.where(frame.filename, frame.lineno)}: "
                  f"{(frame.line or '').strip()})")
    return at


def _shapes(args) -> str:
    jax = _jax()
    return ", ".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(a.shape)}"
                     if hasattr(a, "shape") else repr(a) for a in jax.tree.leaves(args))


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _check_static(args, kwargs, static_argnums, static_argnames
                  ) -> tuple[tuple[int, ...], tuple[str, ...]]:
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    for i in nums:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(args):
            raise BadInputError(f"static_argnums={static_argnums!r}: {i!r} is not the position "
                                f"of one of the {len(args)} positional arguments")
    for n in names:
        if n not in kwargs:
            raise BadInputError(f"static_argnames={static_argnames!r}: {n!r} is not one of the "
                                f"keyword arguments given ({', '.join(kwargs) or 'none'})")
    for where in (*nums, *names):  # jit hashes them: an array cannot be one
        value = args[where] if isinstance(where, int) else kwargs[where]
        try:
            hash(value)
        except TypeError:
            raise BadInputError(
                f"static argument {where!r} ({type(value).__name__}) cannot be hashed, and jit "
                "compiles once per static value, which it must hash: an array (a PRNG key "
                "among them) cannot be static. Pass it as an ordinary, traced argument") from None
    return tuple(sorted(set(nums))), tuple(names)


def compile_step(fn: Callable, *args, device: str | jax.Device | None = None,
                 donate_argnums: int | Sequence[int] = (),
                 static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (),
                 donate_argnames: str | Sequence[str] = (), over_mesh: bool = True,
                 **kwargs) -> CompiledStep:
    """``fn`` compiled for the device it would run on, with its arguments as shapes there
    (:class:`CompiledStep`). ``static_argnums`` / ``static_argnames`` as for ``jax.jit``: those
    arguments are compile-time values (Python numbers, strings, flags), not arrays.
    ``donate_argnames``: donation by name, for arguments passed positionally. Arguments placed
    over several devices compile for those devices, with their own shardings (XLA's sizes are
    then one device's), unless ``device`` is given or ``over_mesh`` is False (one device,
    whole: what :func:`helpers.measure.measure_step` runs). Clear errors for the usual
    mistakes."""
    jax = _jax()
    if not callable(fn):
        raise BadInputError(f"fn must be a function (plain or jitted), got {fn!r}")
    by_name = _donated_by_name(fn, args, kwargs, donate_argnames)
    if by_name:  # merged once donate_argnums itself is known to be good
        donate_argnums = tuple(sorted(set(_check_donation(args, donate_argnums)) | set(by_name)))
    statics, static_names = _check_static(args, kwargs, static_argnums, static_argnames)
    asked = {donate_argnums} if isinstance(donate_argnums, int) else set(
        donate_argnums if isinstance(donate_argnums, (tuple, list, set)) else ())
    if set(statics) & asked:
        raise BadInputError(f"argument(s) {sorted(set(statics) & asked)} are both static "
                            "and donated: a static argument is a Python value, not a buffer")
    donated = _check_donation(args, donate_argnums)
    dynamic = ([a for i, a in enumerate(args) if i not in statics],
               {k: v for k, v in kwargs.items() if k not in static_names})
    mesh = _mesh_devices(dynamic, jax) if device is None and over_mesh else ()
    if mesh:
        dev = mesh[0]
        why = (f"the first of the {len(mesh)} devices its arguments are placed over: XLA's "
               "sizes are one device's, each runs the same program")
    elif device is None and (committed := _device_of_committed((args, kwargs), jax)) is not None:
        dev, why = committed, "where its committed arguments live"
    else:
        dev, why = _target(device)
    arg_specs, kw_specs = _specs(args, kwargs, dev, jax, keep_shardings=bool(mesh))
    # static arguments go in as the values they are (a NumPy scalar stays a number)
    arg_specs = tuple(a if i in statics else spec
                      for i, (a, spec) in enumerate(zip(args, arg_specs, strict=True)))
    kw_specs = {k: kwargs[k] if k in static_names else v for k, v in kw_specs.items()}
    if hasattr(fn, "lower") and not (donated or statics or static_names):
        jitted = fn  # the user's own jit, with whatever it declares
    else:
        jitted = jax.jit(fn, donate_argnums=donated, static_argnums=statics,
                         static_argnames=static_names)
    name = _name(fn)
    try:
        with warnings.catch_warnings():  # "Some donated buffers were not usable": see donations
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            lowered = jitted.lower(*arg_specs, **kw_specs)
    except Exception as err:
        kind = type(err).__name__
        first = (str(err).strip().splitlines() or [kind])[0].rstrip(".")
        if kind in _TRACE_ERRORS:
            raise BadInputError(
                f"{name} does not trace{_user_frame(err)}: Python control flow (if, while, "
                f"int(), bool()) on a traced value. {kind}: {first}. Fix: jnp.where or "
                f"jax.lax.cond/while_loop, or mark that argument static "
                f"(static_argnums=... or static_argnames=... here, as for jax.jit)") from None
        several = ("incompatible devices" in first and "inside jit" in first
                   and " one device" not in first)
        raise BadInputError(f"{name} fails on these arguments ({_shapes((args, kwargs))})"
                            f"{_user_frame(err)}: {kind}: {first}{_misspelled(kwargs)}"
                            + (". preflight_step prices a step on one device, and this one "
                               "places values on several (a sharding inside it): jax.jit(f)."
                               "lower(...).compile().memory_analysis() gives XLA's sizes per "
                               "device for it" if several else "")) from None
    try:
        compiled = lowered.compile()
    except Exception as err:
        if "RESOURCE_EXHAUSTED" in str(err):  # the GPU autotuner's candidates did not fit
            raise CompileOutOfMemory(
                f"XLA ran out of {device_name(dev)}'s memory while compiling {name} "
                f"({_shapes((args, kwargs))}): its autotuner runs candidate kernels at these "
                f"sizes, so the step cannot run with the memory free on this device now. Fix: "
                f"price a smaller batch or model (sizing.largest_batch steps down by itself), "
                f"or free memory first. XLA said: "
                f"{str(err)[:300]}") from None
        raise MeasurementFailed(f"XLA could not compile {name} for {device_name(dev)}: "
                                f"{type(err).__name__}: {str(err)[:300]}") from None
    if jitted is fn:  # donation the user's jit declared: read it back from the lowering
        donated = tuple(sorted(set(donated) | _declared_donation(lowered, len(args), jax)))
    # the executable takes the dynamic arguments only: the analyses below see those, with the
    # donated positions counted among them
    dyn_args = tuple(a for i, a in enumerate(args) if i not in statics)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    dyn_donated = tuple(i - sum(s < i for s in statics) for i in donated)
    try:
        closed = jitted.trace(*arg_specs, **kw_specs).jaxpr
    except Exception:  # a JAX that cannot trace apart from lowering
        closed = None
    try:  # read once: the analyses below and preflight_step's all parse it
        text = compiled.as_text()
    except Exception:  # a backend without program text
        text = None
    constants, folded = _constant_bytes(closed, text)
    return CompiledStep(compiled, dev, why, donated,
                        *_residency(compiled, dyn_args, dyn_kwargs, dev, jax, bool(mesh)),
                        _donation_conflict(dyn_args, dyn_kwargs, dyn_donated, jax),
                        constants,
                        _donations(compiled, text, dyn_args, dyn_kwargs, dyn_donated, jax,
                                   bool(mesh)), name,
                        statics, static_names, closed, folded, bool(mesh), text)


_OPTIONS = ("device", "donate_argnums", "donate_argnames", "static_argnums", "static_argnames",
            "target")


def _misspelled(kwargs: dict) -> str:
    """A hint when a keyword given to the kit, and so passed into the step, looks like one of
    the kit's own options misspelled (``static_argnum=1``)."""
    import difflib

    for key in kwargs:
        near = difflib.get_close_matches(key, _OPTIONS, n=1, cutoff=0.8)
        if near and near[0] != key:
            return (f". The keyword {key!r} went into the step as its argument: did you mean "
                    f"the option {near[0]!r}?")
    return ""


def _declared_donation(lowered, n_args: int, jax) -> set[int]:
    """Positions whose every array leaf the user's own ``jax.jit(..., donate_argnums=...)``
    donates (from ``lowered.args_info``); empty where this JAX does not say."""
    try:
        positional = lowered.args_info[0]
        return {i for i in range(min(n_args, len(positional)))
                if (leaves := jax.tree.leaves(positional[i]))
                and all(getattr(leaf, "donated", False) for leaf in leaves)}
    except Exception:
        return set()


@dataclass(frozen=True)
class CompiledStep:
    """A step compiled for the device it would run on (:func:`compile_step`): the executable,
    where it runs and why, what it donates, argument bytes already there (each buffer once;
    only the arguments the executable takes), bytes of arguments it drops, why the call would
    fail, constants, donations, the function's name and its jaxpr."""

    executable: Any
    device: Any
    why: str
    donated: tuple[int, ...]
    resident: int
    dropped: int
    conflict: str
    constants: int
    donations: tuple[DonatedArgument, ...]
    function: str = ""
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    jaxpr: Any = None  # the step's closed jaxpr; None where this JAX cannot trace apart
    folded: int = 0  # of ``constants``, what XLA computed while compiling
    over_mesh: bool = False  # compiled for the devices its arguments are placed over
    text: str | None = None  # the optimized program's text; None where the backend has none

    def dynamic(self, args: Sequence, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments the executable is called with: the static ones left out."""
        return (tuple(a for i, a in enumerate(args) if i not in self.static_argnums),
                {k: v for k, v in kwargs.items() if k not in self.static_argnames})


def _uniform(c) -> bool:
    """An array of one repeated value: XLA makes such a constant a broadcast of a scalar, so
    the program holds no copy of it (seen with jax 0.10.2 on CPU: peak_memory_in_bytes)."""
    try:
        flat = np.asarray(c).reshape(-1)
        return flat.size > 1 and bool((flat == flat[0]).all())
    except Exception:  # an array that cannot be read here: count it
        return False


def _jaxprs(closed) -> Iterator[tuple[Any, Sequence]]:
    """Each jaxpr of a closed jaxpr, and every one nested in its equations (a scan's body, a
    cond's branches, an inner jit), with its constants (none for an open one)."""
    from jax.extend import core

    stack = [closed] if closed is not None else []
    while stack:
        j, consts = stack.pop(), ()
        if isinstance(j, core.ClosedJaxpr):
            j, consts = j.jaxpr, j.consts
        yield j, consts
        for eqn in getattr(j, "eqns", ()):
            for v in eqn.params.values():
                stack += [sub for sub in (v if isinstance(v, (tuple, list)) else (v,))
                          if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr))]


def _constant_bytes(closed, text: str | None) -> tuple[int, int]:
    """(the array constants the compiled program holds, the part of them XLA computed while
    compiling). The closed-over part is the program's constants with the shape of a constant
    of the step's jaxpr (nested jaxprs included; an array of one repeated value costs nothing),
    however often XLA keeps one (a closed-over table used inside a loop and after it is there
    twice). XLA folds a closed-over array it only reduces (``lax.cond(p, lambda: data.sum(),
    ...)`` keeps a scalar). The rest XLA made itself (``jnp.ones(...).at[...].set(...)``
    inside jit, from no argument). Where there is
    no program text, the jaxpr's alone. With jax's default settings (0.10): a flag,
    ``jax_use_simplified_jaxpr_constants``, makes closed-over arrays arguments instead."""
    seen: dict[int, tuple] = {}
    for _, consts in _jaxprs(closed):
        for c in consts:
            if hasattr(c, "nbytes") and id(c) not in seen and not _uniform(c):
                seen[id(c)] = (tuple(c.shape), int(c.nbytes))
    kept = None if text is None else jaxcompat.array_constants(text)
    if kept is None:
        return sum(n for _, n in seen.values()), 0
    closed_shapes = {shape for shape, _ in seen.values()}
    total = sum(n for _, _, n in kept)
    return total, sum(n for _, shape, n in kept if shape not in closed_shapes)


def _scan_stacks(closed, text: str | None, room: int, most: int = 3
                 ) -> tuple[ScanStack, ...]:
    """Each ``lax.scan`` in the step (nested ones included) with what it stacks over its
    length: the values its body returns beside the carry, and, in a gradient's forward scan,
    what the backward pass needs from each step. Largest first, from 1 MiB; only where the
    optimized program still has a value of the largest one's shape and its outputs and
    temporaries (``room``) could hold the stacks (XLA drops a stack that nothing uses). Without
    program text, every stack counts."""
    out = []
    for j, _ in _jaxprs(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "scan":
                continue
            ys = [v.aval for v in eqn.outvars[eqn.params["num_carry"]:]]
            sizes = [_leaf_bytes(a) for a in ys]
            if sum(sizes) < 2**20:
                continue
            big = ys[sizes.index(max(sizes))]
            if sum(sizes) > room or (
                    text is not None and f"[{','.join(map(str, big.shape))}]" not in text):
                continue
            out.append(ScanStack(int(eqn.params["length"]), sum(sizes), len(ys), str(big.dtype),
                                 tuple(big.shape), _equation_line(eqn), _scan_role(eqn)))
    return tuple(sorted(out, key=lambda t: -t.nbytes)[:most])


#: operations that hand a value to the host: under GSPMD they take it whole (jax#25842)
_CALLBACKS = ("debug_print", "debug_callback", "pure_callback", "io_callback")


def _gathered(temporaries, args, kwargs) -> list:
    """The large temporaries (1 MiB or more) of a callback (jax.debug.print, a host callback)
    with the whole shape of an argument split over several devices: a value gathered from its
    shards to be handed to the host. (A gather a sharded layer makes by design is not one.)"""
    whole = {tuple(leaf.shape) for leaf in _jax().tree.leaves((args, kwargs))
             if _split_over(leaf) > 1}
    return [t for t in temporaries if t.op in _CALLBACKS and tuple(t.shape) in whole
            and t.nbytes >= 2**20]


def _spread_arguments(c: CompiledStep, fn, args, kwargs) -> tuple[tuple[str, int], ...]:
    """(name, devices) of each argument with an array split over several devices (one that
    is whole on each, replicated, costs a device what it is priced at)."""
    out = []
    for name, value in _arguments(c, fn, args, kwargs):
        n = max((_split_over(leaf) for leaf in _jax().tree.leaves(value)), default=1)
        if n > 1:
            out.append((name, n))
    return tuple(out)


def _split_over(leaf) -> int:
    """How many devices an array is split over: 1 where it is whole on one, or on each."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None or sharding.is_fully_replicated:
        return 1
    return len(sharding.device_set)


def _on_the_host_by_commitment(dev) -> str:
    """A note when committed arguments pin the step to another platform than the default
    device's (a GPU machine's batch committed to its CPU): jit runs it there, and says
    nothing. "" otherwise."""
    default = _default_device()
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


def _ignored_device_puts(closed, dev) -> tuple[tuple[str, str], ...]:
    """(device, line) of each ``jax.device_put`` inside the step to a Device other than the
    one it runs on: jit ignores those (jax 0.8 and 0.10 alike: the value stays, uncommitted,
    where the step runs). A device_put to a sharding or a memory kind is honoured, and not
    listed."""
    jax = _jax()
    out = []
    for j, _ in _jaxprs(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name == "device_put":
                out += [(device_name(d), _equation_line(eqn))
                        for d in eqn.params.get("devices", ())
                        if isinstance(d, jax.Device) and d != dev]
    return tuple(out)


def _stack_note(t: ScanStack, peak: int) -> str:
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
    return (f"{head}: what its body returns beside the carry. Return less from the body (a "
            "sum, or the last value, belongs in the carry).")


def _scan_role(eqn) -> str:
    """"forward" for a derivative's forward pass, "backward" for its backward pass (JAX's name
    stack says jvp, transpose), "" otherwise."""
    try:
        stack = str(eqn.source_info.name_stack)
    except Exception:  # an equation without a name stack
        return ""
    return "backward" if "transpose(" in stack else "forward" if "jvp(" in stack else ""


def _equation_line(eqn) -> str:
    """The user's line that made a jaxpr equation ("" where its traceback names none)."""
    try:
        user = [f for f in eqn.source_info.traceback.frames if frames.is_user_file(f.file_name)]
    except Exception:  # an equation without a traceback
        return ""
    return frames.line(user[0].file_name, user[0].line_num) if user else ""


def _why_not_donated(shape: tuple, dtype: str, nbytes: int, outputs: list[tuple],
                     free: list[tuple]) -> str:
    """Why a donated buffer was not reused. JAX pairs a donated argument with an output of the
    same shape and dtype; failing that, it offers the buffer to XLA when an output has as many
    elements, and XLA reuses it only when the bytes match too (jax/_src/interpreters/mlir.py,
    _set_up_aliases; measured on jax 0.8.0 and 0.10.2: float32[100] is reused for a
    float32[50, 2] or an int32[100], not a float16[100]). ``outputs`` and ``free`` (those no
    other donated argument took) are (shape, dtype, bytes)."""
    count = math.prod(shape)
    name = f"{dtype}{list(shape)}"
    if any(o[:2] == (shape, dtype) for o in outputs):
        return f"every {name} output is already written into another donated argument"
    if offered := [o for o in free if math.prod(o[0]) == count and o[2] != nbytes]:
        return (f"JAX offered it to XLA for an output with as many elements "
                f"({offered[0][1]}{list(offered[0][0])}), and XLA did not reuse it: the bytes "
                "differ, and a donated buffer is reused only for an output of the same size")
    if taken := [o for o in outputs if math.prod(o[0]) == count]:
        return (f"the output with as many elements ({taken[0][1]}{list(taken[0][0])}) is "
                "already written into another donated argument")
    return (f"no output is a {name}, nor has its {count:,} elements: JAX donates a buffer only "
            "to an output of the same shape and dtype, or of the same number of elements (then "
            "XLA reuses it where the bytes match)")


def _donations(compiled, text: str | None, args, kwargs, donated, jax, mesh: bool = False
               ) -> tuple[DonatedArgument, ...]:
    """Each donated array leaf, and whether XLA writes an output into it (its alias table).
    Over a mesh, bytes are each device's share, and a buffer not reused is not explained by
    shapes alone (XLA matches the sharding too)."""
    if not donated:
        return ()
    flat, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    kept = _kept(compiled, len(flat), jax) or [True] * len(flat)
    try:
        aliased = None if text is None else jaxcompat.aliased_parameters(text)
        outputs = [(tuple(o.shape), str(o.dtype), _leaf_bytes(o))
                   for o in jax.tree.leaves(compiled.out_info)]
    except Exception:
        aliased, outputs = None, []
    leaves, param = [], 0
    for (path, leaf), used in zip(flat, kept, strict=True):
        number = param
        param += int(used)
        if path[0].idx != 0 or path[1].idx not in donated or not hasattr(leaf, "shape"):
            continue  # positional arguments only: donate_argnums names positions
        leaves.append((jax.tree_util.keystr(path[1:]).removeprefix("[").replace("]", "", 1),
                       tuple(leaf.shape), str(leaf.dtype),
                       _share_bytes(leaf) if mesh else _leaf_bytes(leaf), used, number))
    free = list(outputs)  # the outputs no reused donation took: its own shape first, then size
    for _, shape, dtype, nbytes, used, number in leaves:
        if used and aliased and number in aliased:
            match = ([o for o in free if o[:2] == (shape, dtype)] or
                     [o for o in free if math.prod(o[0]) == math.prod(shape) and o[2] == nbytes])
            if match:
                free.remove(match[0])
    out = []
    for where, shape, dtype, nbytes, used, number in leaves:
        if not used:
            reused, why = False, "XLA dropped it: the step never reads it"
        elif aliased is None:
            reused, why = False, "unknown: this XLA's program text has no alias table the kit reads"
        elif number in aliased:
            reused, why = True, ""
        elif mesh:
            reused, why = False, (
                "over a mesh XLA reuses a donated buffer only for an output of its shape, "
                "dtype and sharding: compare the argument's sharding with the outputs' "
                "(jax.jit(f).lower(...).compile().output_shardings)")
        else:
            reused, why = False, _why_not_donated(shape, dtype, nbytes, outputs, free)
        out.append(DonatedArgument(where, shape, dtype, nbytes, reused, why))
    return tuple(out)


def _residency(compiled, args, kwargs, dev, jax, mesh: bool = False) -> tuple[int, int]:
    """(bytes of kept arguments already on ``dev``, each buffer once; bytes of dropped ones).
    Over a mesh, an argument counts only where it is placed as the program takes it (its
    shard on ``dev``); one jit must move or split first is not there yet."""
    leaves = jax.tree.leaves((args, kwargs))
    kept = _kept(compiled, len(leaves), jax) or [True] * len(leaves)
    wanted = _input_shardings(compiled, len(leaves), jax) if mesh else None
    resident = dropped = 0
    seen: list = []
    for i, (leaf, used) in enumerate(zip(leaves, kept, strict=True)):
        if not hasattr(leaf, "nbytes") or not hasattr(leaf, "shape"):
            continue
        if not used:
            dropped += _share_bytes(leaf) if mesh else int(leaf.nbytes)
            continue
        if not isinstance(leaf, jax.Array) or leaf.is_deleted() or any(
                _same_buffer(leaf, other) for other in seen):
            continue
        if mesh:
            want = wanted[i] if wanted else None
            if (want is not None and dev in leaf.devices()
                    and _equivalent(leaf.sharding, want, leaf.ndim)):
                seen.append(leaf)
                resident += sum(int(s.data.nbytes) for s in leaf.addressable_shards
                                if s.device == dev)
        elif set(leaf.devices()) == {dev}:
            seen.append(leaf)
            resident += leaf.nbytes
    return resident, dropped


def _input_shardings(compiled, n_leaves: int, jax) -> list | None:
    """The sharding the executable takes each argument leaf with (None for a dropped one);
    None when this JAX does not say."""
    try:
        shardings = jax.tree.leaves(compiled.input_shardings, is_leaf=lambda x: x is None)
    except Exception:
        return None
    return shardings if len(shardings) == n_leaves else None


def _analysis(compiled) -> dict:
    """XLA's sizes, and the kit's peak: every buffer the executable holds at once, at most
    (the temporaries are one block, allocated for the whole run)."""
    ma = compiled.memory_analysis()
    if ma is None:
        raise MeasurementFailed("this backend gives no memory analysis for compiled code")
    sizes = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in
             ("argument", "output", "alias", "temp", "generated_code")}
    sizes["peak"] = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
    xla_peak = getattr(ma, "peak_memory_in_bytes", None)
    sizes["xla_peak"] = NOT_AVAILABLE if xla_peak is None else int(xla_peak)
    return sizes


def _cpu_runtime_bytes(text: str | None) -> int:
    """Memory the CPU runtime takes outside XLA's buffer plan: it copies both operands of a
    weight-gradient convolution (measured, jax 0.10.2: a CNN's step was 15% over the plan at
    batch 256). One such convolution runs at a time, so the largest counts."""
    try:
        return max(jaxcompat.weight_gradient_convolutions(text or ""), default=0)
    except Exception:  # text the parser cannot read
        return 0


def _in_use(dev) -> tuple[int | NotAvailable, str]:
    from helpers import memory  # imports JAX: only once _jax() has

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
    c = compile_step(fn, *args, device=device, donate_argnums=donate_argnums,
                     static_argnums=static_argnums, static_argnames=static_argnames,
                     donate_argnames=donate_argnames, **kwargs)
    dev = c.device
    a = _analysis(c.executable)
    split = _argument_split(c, fn, args, kwargs)
    copies = _state_copies(c, fn, args, kwargs)
    # the CPU runtime's own copies for weight-gradient convolutions (outside XLA's plan)
    runtime = _cpu_runtime_bytes(c.text) if (target is None and getattr(
        c.device, "platform", "") == "cpu") else 0
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
    if undonated := _donation_would_save(c, fn, args, kwargs):
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
    values = _entry_values(c.text)
    temporaries = _temporaries(values)
    batched = [t for t in temporaries if t.batched and t.nbytes * 4 >= peak]
    if batched:
        t = batched[0]
        at = f", {t.line}" if t.line else ""
        notes.append(f"The largest value, {t.op} {t.dtype}{list(t.shape)} "
                     f"({format_bytes(t.nbytes)}{at}), is made under jax.vmap for every element "
                     "of the batch at once, as the vectorized code would be: "
                     "jax.lax.map(f, xs, batch_size=k) computes k elements at a time, and "
                     "such values shrink in proportion.")
    leaves = sum(1 for a in c.dynamic(args, kwargs) for leaf in _jax().tree.leaves(a)
                 if hasattr(leaf, "shape"))
    if unrolled := _unrolled(values, leaves):
        notes.append(unrolled)
    stacks = _scan_stacks(c.jaxpr, c.text, a["output"] + a["temp"])
    named = [t for t in stacks if t.role != "backward"]  # JAX's own scan: nothing to change
    if named and named[0].nbytes * 4 >= peak:
        notes.append(_stack_note(named[0], peak))
    if device is None and target is None and (host := _on_the_host_by_commitment(dev)):
        notes.append(host)
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
    if ignored := _ignored_device_puts(c.jaxpr, dev):
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
        function=_name(fn), device=device_name(where),
        device_reason=reason, argument_bytes=a["argument"], output_bytes=a["output"],
        alias_bytes=a["alias"], temp_bytes=a["temp"], code_bytes=a["generated_code"],
        peak_bytes=peak, xla_peak_bytes=a["xla_peak"], resident_bytes=resident,
        needed_bytes=needed, in_use_bytes=in_use, in_use_source=in_use_source,
        free_bytes=free, free_source=free_source, donated=c.donated, verdict=verdict,
        advice=advice, dropped_bytes=c.dropped, constant_bytes=c.constants,
        folded_bytes=c.folded,
        donations=c.donations, largest_temporaries=temporaries,
        runtime_bytes=runtime, argument_split=split, state_copies=copies, scan_stacks=stacks,
        ignored_device_puts=ignored, spread_arguments=spread)


def _leaf_bytes(leaf) -> int:
    """An array's or a shape's bytes (a ShapeDtypeStruct has no .nbytes; keys: 8 B)."""
    return int(math.prod(leaf.shape) * leaf.dtype.itemsize)


def _equivalent(a, b, ndim: int) -> bool:
    try:
        return bool(a.is_equivalent_to(b, ndim))
    except Exception:  # shardings that cannot be compared
        return False


def _share_bytes(leaf) -> int:
    """An array's bytes on each device it is split over (all of them where it is whole)."""
    sharding = getattr(leaf, "sharding", None)
    try:
        if sharding is not None and len(sharding.device_set) > 1:
            return int(math.prod(sharding.shard_shape(tuple(leaf.shape)))
                       * leaf.dtype.itemsize)
    except Exception:  # a sharding that cannot say
        pass
    return _leaf_bytes(leaf)


def _donation_would_save(c: CompiledStep, fn, args, kwargs) -> tuple[list[str], int] | None:
    """(the arguments worth donating, the output bytes they could take) when an undonated
    top-level argument has outputs of its leaves' shapes and dtypes for at least half its bytes
    and 1 MiB; None otherwise. Outputs are matched once each, largest arguments first. Over a
    mesh XLA matches the sharding too (an output of another layout takes nothing), and bytes
    are each device's."""
    jax = _jax()
    try:
        outputs = [(tuple(o.shape), str(o.dtype))
                   for o in jax.tree.leaves(c.executable.out_info)]
        out_shardings = (jax.tree.leaves(c.executable.output_shardings) if c.over_mesh
                         else [None] * len(outputs))
    except Exception:
        return None
    arrays = _donatable_leaves(c, fn, args, kwargs, jax)
    if arrays is None or len(out_shardings) != len(outputs):
        return None
    names = dict(_argument_names(c, fn, args, kwargs))
    free = list(zip(outputs, out_shardings, strict=True))
    chosen, saving = [], 0
    for i, leaves in sorted(arrays.items(), key=lambda kv: -sum(n for _, n, _ in kv[1])):
        total = sum(n for _, n, _ in leaves)
        matched, took = 0, []
        for key, nbytes, sharding in leaves:
            hit = next((f for f in free if f[0] == key and (
                sharding is None or _equivalent(f[1], sharding, len(key[0])))), None)
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


def _donatable_leaves(c: CompiledStep, fn, args, kwargs, jax) -> dict | None:
    """For each undonated positional argument the executable takes: its array leaves as
    ((shape, dtype), bytes, the sharding it is taken with, over a mesh; else None), a leaf XLA
    drops left out over a mesh. None where the executable does not say its shardings."""
    wanted = None
    if c.over_mesh:
        wanted = _input_shardings(c.executable, len(jax.tree.leaves(c.dynamic(args, kwargs))),
                                  jax)
        if wanted is None:
            return None
    names = dict(_argument_names(c, fn, args, kwargs))
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
             _leaf_bytes(x) if s is None else
             math.prod(s.shard_shape(tuple(x.shape))) * x.dtype.itemsize, s)
            for x, s in zip(leaves, mine, strict=True)
            if hasattr(x, "shape") and hasattr(x, "dtype") and (wanted is None or s is not None)]
    return out


def _argument_names(c: CompiledStep, fn, args, kwargs) -> list[tuple]:
    """(position or keyword, the name fn gives it) for each argument that is not static."""
    import inspect

    try:
        params = [q for q in inspect.signature(fn).parameters.values()
                  if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    out = [(i, params[i].name if i < len(params) else f"args[{i}]")
           for i in range(len(args)) if i not in c.static_argnums]
    return out + [(k, k) for k in kwargs if k not in c.static_argnames]


def _arguments(c: CompiledStep, fn, args, kwargs) -> list[tuple[str, Any]]:
    """(the name fn gives it, its value) for each argument that is not static."""
    return [(name, args[where] if isinstance(where, int) else kwargs[where])
            for where, name in _argument_names(c, fn, args, kwargs)]


def _argument_split(c: CompiledStep, fn, args, kwargs) -> tuple[tuple[str, int], ...]:
    """Each top-level argument's array bytes (each buffer once), named as ``fn`` names its
    parameters ("args[2]" for ``*args``), largest first; static arguments are left out."""
    seen: set[int] = set()
    out = []
    for name, value in _arguments(c, fn, args, kwargs):
        total = 0
        for leaf in _jax().tree.leaves(value):
            if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and id(leaf) not in seen:
                seen.add(id(leaf))
                total += _leaf_bytes(leaf)
        out.append((name, total))
    return tuple(sorted(out, key=lambda kv: -kv[1]))


def _state_copies(c: CompiledStep, fn, args, kwargs) -> tuple[StateCopy, ...]:
    """Each subtree of an argument that has the structure, keys and shapes of another argument,
    or of another field of the same argument (a Flax TrainState holds ``params`` and
    ``opt_state``): an Adam state's ``mu`` and ``nu`` beside the parameters. Only for a tree of
    two arrays or more and at least 1 MiB (a single array's shape can recur by chance); a tree
    that is a copy as a whole (the gradients beside the parameters) is not one, and of two
    trees alike only the first is looked for."""
    jax = _jax()
    arrays = {}
    for name, value in _arguments(c, fn, args, kwargs):
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
        size = sum(_leaf_bytes(x) for _, x in like)
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
            found.append((idx[0], prefix, sum(_leaf_bytes(leaves[i][1]) for i in idx)))
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


def _entry_values(text: str | None) -> list[dict]:
    """The values XLA materializes between the step's operations (largest first), with the
    user's (file, line) that made each where the program text records it."""
    try:
        return jaxcompat.entry_values(text or "", frames.is_user_file)
    except Exception:  # text the parser cannot read
        return []


def _temporaries(values: list[dict], most: int = 3) -> tuple[Temporary, ...]:
    """The largest values XLA materializes between the step's operations, with their lines."""
    out = []
    for v in values[:most]:
        line = frames.line(*v["source"]) if v["source"] else ""
        out.append(Temporary(v["op"].rsplit("/", 1)[-1], v["dtype"], v["shape"], v["nbytes"],
                             line, batched="vmap(" in v["op"]))
    return tuple(out)


#: this many of a program's operations from one line of code mean a Python loop was unrolled
UNROLLED_AT = 64


def _unrolled(values: list[dict], leaves: int = 0) -> str:
    """A note when one line of the user's code made ``UNROLLED_AT`` or more of the program's
    operations: a Python loop inside jit, unrolled (jax-ml/jax#2777), or, where their number
    goes with the ``leaves`` of the arguments (a pytree of many arrays), one operation per
    array (jax-ml/jax#4667); "" otherwise."""
    counts = Counter(v["source"] for v in values if v["source"])
    if not counts:
        return ""
    source, n = counts.most_common(1)[0]
    if n < UNROLLED_AT:
        return ""
    head = (f"{n} of the compiled program's {len(values)} operations come from one line "
            f"({frames.line(*source)})")
    if leaves >= UNROLLED_AT // 2 and leaves // 2 <= n <= 8 * leaves:
        return (f"{head}, about as many as the {leaves} arrays of the arguments: code that "
                "runs over a pytree's leaves (jax.tree.map, a loop over jax.tree.leaves) is "
                "one operation per array, so the program and its compile time grow with the "
                "number of arrays. Fewer, larger arrays compile faster: stack alike layers "
                "into one array (and run them with jax.lax.scan), or flatten the tree "
                "(jax.flatten_util.ravel_pytree).")
    return (f"{head}: a Python loop inside the jitted function is unrolled, one copy of its "
            "body per iteration, so the program and its compile time grow with the loop; "
            "jax.lax.fori_loop or jax.lax.scan compile the body once.")


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
    _jax()  # JAX can start here, or a BackendError says why
    if not callable(fn):
        raise BadInputError(f"fn must be a function, got {fn!r}")
    saved = jaxcompat.verify("saved_residuals")
    try:
        found = saved(fn, *args, **kwargs)
    except Exception as err:
        raise BadInputError(f"{_name(fn)} could not be differentiated on these arguments "
                            f"({_shapes((args, kwargs))}){_user_frame(err)}: "
                            f"{type(err).__name__}: {str(err).splitlines()[0]}") from None
    out = []
    for aval, source in found:
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
        out.append(Residual(tuple(aval.shape), str(aval.dtype), nbytes, _short(str(source)),
                            str(source).startswith("from the argument")))
    out.sort(key=lambda r: -r.nbytes)
    extra = [r for r in out if not r.is_argument]
    scans = [r for r in extra if r.source.startswith("output of scan") and r.shape]
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
    return Residuals(_name(fn), tuple(out), saved_bytes, scan_bytes, lengths, advice)
