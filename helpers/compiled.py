"""What XLA made of a step: the program compiled for the device the step would run on, with its
arguments as shapes there (nothing runs, no argument is copied), and what that program holds.

- :func:`compile_step` compiles ``fn(*args, **kwargs)`` as ``jax.jit`` would run it (on the
  device its committed arguments are on, over the devices its sharded arguments span, or on the
  default device) and turns the usual mistakes into clear errors (a value that does not trace,
  an argument that cannot be static, a buffer donated twice, a compile that runs out of memory).
- :class:`CompiledStep` is the executable with what it holds: XLA's sizes (``sizes()``), the
  array constants baked in and the part XLA computed while compiling, each donated buffer
  reused or not and why, the argument bytes already on the device, the largest values the
  program materializes and the lines that made them (``temporaries()``), scans that stack a
  value for every step (``scan_stacks()``), a Python loop unrolled (``unrolled()``), and each
  ``jax.device_put`` to a Device that jit ignores (``ignored_device_puts()``), and each
  ``device=`` given to a creation, which jit drops (``dropped_device_keywords()``).

:func:`helpers.preflight.preflight_step` turns these into a verdict and advice;
:func:`helpers.measure.measure_step` runs the executable.

>>> import jax.numpy as jnp
>>> c = compile_step(lambda x: jnp.tanh(x) * 2, jnp.ones((256, 256)))
>>> c.sizes()["argument"], c.sizes()["output"]
(262144, 262144)
"""

from __future__ import annotations

import inspect
import math
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers import devices, placement_notes, trace_errors
from helpers._internal import (
    frames,
    jaxcompat,
    jaxpr_callbacks,
    jaxpr_derivatives,
    jaxpr_loops,
    jaxpr_sharding,
    jaxpr_values,
    jaxpr_walk,
    own,
)
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Record
from helpers.errors import BadInputError, CompileOutOfMemory, MeasurementFailed
from helpers.units import NOT_AVAILABLE, format_bytes

if TYPE_CHECKING:
    import jax

__all__ = ["UNROLLED_AT", "CompiledStep", "DonatedArgument", "Jacobian", "JacobianProduct",
           "ScanStack", "Temporary", "array_bytes", "bytes_per_device", "compile_step",
           "describe_arguments", "devices_split_over", "elements_per_device", "function_name",
           "memory_kind", "metadata_arrays", "same_sharding", "unbound", "user_line"]

# --- the records -------------------------------------------------------------------------------
#: a whole copy of a loop's carried value of this many bytes on every step is worth a note (a
#: scan's small carry, a hidden state XLA copies, is not)
_CARRY_COPY_AT = 256 * 1024


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
    #: made inside a derivative (jax.grad, jax.vjp: XLA's op_name has jvp( or transpose( around
    #: it, and around its vmap where it is batched: a vmap inside the function differentiated)
    in_derivative: bool = False
    #: how many vmaps of a forward derivative are around it (XLA's op_name: "vmap(jvp(" each,
    #: jax.jacfwd's over its basis): 2 for jax.jacfwd of jax.jacfwd (jkitchin/discopt#924)
    forward_vmaps: int = 0


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
    #: what the backward pass needs too); "backward" in the backward pass (JAX's own scan);
    #: "recomputed" for a scan a jax.checkpoint around it recomputes whole in the backward pass
    #: (its stack: what the backward pass needs from every step, at once)
    role: str = ""
    #: False for a scan without a carry: jax.lax.map, whose stack is its result
    has_carry: bool = True
    #: of ``nbytes``, the values the body returns as its slice of what the scan reads,
    #: unchanged: a copy of that array, stacked (maxtext#4405: an NNX layer's parameters)
    copied_bytes: int = 0
    #: the bytes of one step's carry: what jax.checkpoint on the body keeps per step
    carry_bytes: int = 0
    #: its body runs under jax.checkpoint (read from the body, or, in a gradient, from the
    #: backward scan of the same line, where JAX keeps the checkpoint)
    checkpointed: bool = False
    #: that checkpoint holds a scan: a scan of checkpointed chunks of steps already
    chunked: bool = False
    #: the jax.custom_vjp fwd rule of the user's that runs this scan ("" for none): what the
    #: rule returns as residuals no jax.checkpoint inside it drops (sglang-jax#823)
    fwd_rule: str = ""
    #: of ``nbytes``, the values the body makes by writing rows into its slice of what the scan
    #: reads (an xs of their shape): a new stack of that array each call to change a few rows
    #: (marin-community/levanter#1249: a KV cache stacked over layers, as xs and ys)
    updated_bytes: int = 0


@dataclass(frozen=True)
class Jacobian(Record):
    """A ``jax.jacrev`` or ``jax.jacfwd`` in the step. jacrev makes the Jacobian one row per
    output of the function, pulling back an identity of outputs x outputs; jacfwd one column
    per input, pushing forward an identity of inputs x inputs; either makes all of them at
    once under vmap."""

    mode: str  # "reverse" (jax.jacrev) or "forward" (jax.jacfwd)
    outputs: int  # the function's outputs, flattened: the Jacobian's rows
    inputs: int  # the inputs differentiated, flattened: its columns
    basis_bytes: int  # the identity it pulls back or pushes forward
    line: str  # the user's line that called it ("" where not recorded)

    @property
    def batch(self) -> int:
        """How many vectors it carries at once: the rows (reverse) or the columns (forward)."""
        return self.outputs if self.mode == "reverse" else self.inputs

    @property
    def other_way(self) -> int:
        """How many the other mode would carry: the columns (reverse) or the rows (forward)."""
        return self.inputs if self.mode == "reverse" else self.outputs


@dataclass(frozen=True)
class JacobianProduct(Record):
    """A whole Jacobian (or Hessian) the step makes only to multiply it by a vector
    (jax-ml/jax#2937). ``jax.jvp`` gives J @ v, ``jax.vjp`` u @ J, and a Hessian-vector
    product ``jax.jvp(jax.grad(f), (x,), (v,))[1]``, each without the Jacobian."""

    kind: str  # "hessian" (jax.hessian: jacfwd of jacrev), "forward" or "reverse"
    side: str  # "right": J @ v (the inputs' dimensions contracted); "left": u @ J
    shape: tuple[int, ...]  # the Jacobian's, with any vmap's batch
    dtype: str
    nbytes: int  # the Jacobian's
    product_bytes: int  # what the step keeps of it: the product
    line: str  # the user's line that made the Jacobian
    product_line: str  # the user's line that multiplies it
    batched: bool  # one vector per point of a batch (an einsum 'nij,nj->ni', a vmap)


# --- arguments as shapes on the target device ----------------------------------------------
def _check_donation(args, donate_argnums) -> tuple[int, ...]:
    jax = devices.start_jax()
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
    default_kind = sharding.memory_kind

    def spec(leaf):
        kind = getattr(getattr(leaf, "sharding", None), "memory_kind", None)
        if kind not in (None, default_kind) and isinstance(leaf, jax.Array) and (
                not leaf.is_deleted()) and (keep_shardings or leaf.devices() == {device}):
            # an array in another memory (pinned_host): a shape has no memory space, so jit
            # would plan its outputs and donations in device memory (marin-community/marin
            # #8515); lowering reads the array's type and sharding only, copying nothing
            return leaf
        if keep_shardings and getattr(leaf, "sharding", None) is not None and (
                len(leaf.sharding.device_set) > 1 or getattr(leaf, "committed", True)):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if keep_shardings and hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) or (
                hasattr(leaf, "shape") and hasattr(leaf, "dtype")):  # NumPy arrays and scalars
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
        if hasattr(leaf, "__dlpack__") and not isinstance(leaf, (jax.Array, np.ndarray)):
            raise BadInputError(  # (its torch dtype is no dtype JAX or NumPy can read)
                f"the argument leaf {('args', 'kwargs')[path[0].idx]}"
                f"{jax.tree_util.keystr(path[1:])} is " + placement_notes.foreign_tensor_fix(
                    placement_notes.foreign_kind(type(leaf))))
    try:
        return jax.tree.map(spec, args), jax.tree.map(spec, kwargs)
    except Exception as err:  # a pytree whose unflatten runs the user's __init__ on them
        raise BadInputError(
            f"the kit sizes a step from stand-ins for its arrays (jax.ShapeDtypeStruct), and "
            f"rebuilding an argument's pytree around them failed ({type(err).__name__}: "
            f"{str(err)[:200]}): its class's unflatten likely calls __init__, which computes "
            "with its fields. JAX's docs ('Custom pytrees and initialization') advise an "
            "unflatten that does not run __init__ (obj = object.__new__(cls), then set the "
            "fields): jit rebuilds the object from tracers the same way, and a constructor "
            "that transforms its input (theta // 2) changes the answer under jit "
            "(jax-ml/jax#14619, shoyer in jax-ml/jax#3265)") from err


def _kept(compiled, n_leaves: int, jax) -> list[bool] | None:
    """Which argument leaves the executable takes (jit drops the ones the step never reads:
    their input sharding is None); None when this JAX does not say."""
    shardings = _input_shardings(compiled, n_leaves, jax)
    return None if shardings is None else [s is not None for s in shardings]


def _dropped_alone(leaves: list, kept: list[bool], jax) -> list[bool]:
    """For each argument leaf: jit drops it (the step never reads it) and no leaf it keeps is
    the same buffer. A dropped leaf that is also passed where the step reads it costs nothing
    apart and is donated there (marin-community/marin#3668: an unused ``ema_params`` that is
    ``params``)."""
    taken = [x for x, used in zip(leaves, kept, strict=True) if used and isinstance(x, jax.Array)]
    return [not used and not any(_same_buffer(leaf, x) for x in taken)
            for leaf, used in zip(leaves, kept, strict=True)]


def _same_buffer(a, b) -> bool:
    if a is b:
        return True
    try:  # (a sharded array's pointer makes JAX cache an Array over each shard: not asked)
        return (len(a.devices()) == 1 and a.devices() == b.devices()
                and a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer())
    except Exception:  # sharded, deleted, or not an array
        return False


def _deleted(args, kwargs, jax) -> str:
    """Why the call will fail, when an argument is an array already deleted (donated to an
    earlier call, or .delete()): the call raises (jaxmg#29; what it raises depends on the JAX:
    jaxcompat.deleted_argument_error); "" when none is."""
    paths = [(f"argument {where!r}" if isinstance(where, str) else f"argument {where}")
             + jax.tree_util.keystr(path)
             for where, value in [*enumerate(args), *kwargs.items()]
             for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
             if isinstance(leaf, jax.Array) and leaf.is_deleted()]
    if not paths:
        return ""
    return (f"{', '.join(paths[:3])}{' and more' if len(paths) > 3 else ''} "
            f"{'was' if len(paths) == 1 else 'were'} deleted (donated to an earlier call, or "
            f".delete()): the call fails (JAX raises {jaxcompat.deleted_argument_error()}). "
            "Fix: pass what the earlier call returned in its place, or keep a copy "
            "(jnp.copy(x)) before donating it where you need it again.")


def _shared_buffers(args, kwargs, donated, kept: list[bool], jax
                    ) -> list[tuple[str, list[tuple[int, str, bool]], int, bool]]:
    """(the donated place, [(the other place's leaf number, its name, donated there)], bytes,
    sure) for each donated buffer also passed in another place in the same call. ``sure``:
    the call fails, as the other place is the same Array, or the arrays are on a device that
    never adopts a NumPy array's memory; not sure where two Arrays over one pointer are on the
    CPU, where two ``jax.device_put`` of one 64-byte-aligned NumPy array both adopt its memory
    (separate buffers to XLA: the call runs; jax 0.8.0 and 0.10.2)."""
    flat = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    leaves = [(path[1].idx if path[0].idx == 0 else path[1].key,
               jax.tree_util.keystr(path[2:]), leaf)
              for (path, leaf), used in zip(flat, kept, strict=True) if used]

    def named(where, path) -> str:
        return f"argument {where!r}{path}" if isinstance(where, str) else f"argument {where}{path}"

    def on_cpu(leaf) -> bool:
        try:
            return all(d.platform == "cpu" for d in leaf.devices())
        except Exception:  # deleted or not an array
            return False

    shared, listed = [], set()
    for n, (i, path, leaf) in enumerate(leaves):
        if i not in donated or not isinstance(leaf, jax.Array) or n in listed:
            continue
        again = [(m, named(w, q), w in donated) for m, (w, q, x) in enumerate(leaves)
                 if m != n and isinstance(x, jax.Array) and _same_buffer(leaf, x)]
        if again:
            listed.update(m for m, _, _ in again)
            sure = not on_cpu(leaf) or any(leaves[m][2] is leaf for m, _, _ in again)
            shared.append((named(i, path), again, array_bytes(leaf), sure))
    return shared


def _donation_conflict(args, kwargs, donated, kept: list[bool], jax) -> str:
    """Why the call will fail, when a donated buffer is also passed again in the same call
    (XLA: "Attempt to donate the same buffer twice" / "...a buffer that was previously
    donated"); "" when none is. Each place is named by its argument and its path in it
    (optax#1059: a state whose ``z`` was its ``params['w']``), every shared buffer with its
    bytes, the first three by name (google/flax#5461: a module and its ``nnx.clone`` share
    both the kernel and the bias). A place the step never reads is none: jit drops it before
    the call, and the buffer is donated once (marin#3668: an unused ``ema_params`` that is
    ``params``; jax 0.8.0 and 0.10.2). Two Arrays over one pointer on the CPU that may be one
    NumPy array's memory adopted twice are not said to fail (:func:`_shared_memory_note`)."""
    shared = [s[:3] for s in _shared_buffers(args, kwargs, donated, kept, jax) if s[3]]
    if not shared:
        return ""
    first, again, nbytes = shared[0]
    # XLA's words differ: donated twice, or donated and also passed as it is (jax#9635)
    said = ("Attempt to donate the same buffer twice\", or \"...previously donated in "
            "the same call" if all(d for _, _, d in again) else
            "Attempt to use a buffer that was previously donated in the same call")

    def places(again) -> str:
        return ", ".join(dict.fromkeys(w for _, w, _ in again))

    rest = sorted(shared[1:], key=lambda s: -s[2])  # the largest named
    also = "; ".join(f"{where} as {places(a)} ({format_bytes(b)})" for where, a, b in rest[:3])
    more = len(rest) - 3
    total = sum(b for _, _, b in shared)
    also = (f"; so {'are' if len(rest) > 1 else 'is'} {also}"
            f"{f' and {more} more' if more > 0 else ''}, {len(shared)} shared buffers and "
            f"{format_bytes(total)} in all" if rest else "")
    return (f"{first} is donated and the same buffer is passed again as {places(again)} "
            f"({format_bytes(nbytes)}){also}: the call fails (XLA: INVALID_ARGUMENT, \"{said}\"). "
            "Fix: pass a copy (jnp.copy(x)) where it is not the donated one, or donate it in "
            "one place only.")


def _shared_memory_note(args, kwargs, donated, kept: list[bool], jax) -> str:
    """Where a donated array and another array of the call are two Arrays over one pointer on
    the CPU (and no sure conflict): they are one JAX buffer (``jax.device_put`` of an array to
    the device it is on: the call fails) or one NumPy array's memory that two
    ``jax.device_put`` adopted (the call runs and donates nothing, jax-ml/jax#18617: XLA does
    not write into NumPy's memory); nothing public tells which. "" where there is none."""
    shared = [s for s in _shared_buffers(args, kwargs, donated, kept, jax) if not s[3]]
    if not shared:
        return ""
    first, again, nbytes, _ = shared[0]
    more = f" (and {len(shared) - 1} more such)" if len(shared) > 1 else ""
    others = ", ".join(dict.fromkeys(w for _, w, _ in again))
    return (f"{first} is donated, and {others} is another array over the same memory "
            f"({format_bytes(nbytes)}){more}: where both are one JAX buffer (jax.device_put of "
            "an array to the device it is on) the call fails (XLA: INVALID_ARGUMENT, a buffer "
            "donated and used in the same call); where two "
            "jax.device_put calls adopted one NumPy array's memory on the CPU (a 64-byte "
            "aligned array), it runs and donates nothing (XLA does not write into NumPy's "
            "memory, jax-ml/jax#18617). Fix either way: pass a copy (jnp.copy(x)) where it is "
            "not the donated one.")


def user_line(err: BaseException) -> str:
    """file:line of the deepest frame outside JAX and the kit: where the user's code failed."""
    at = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frames.is_user_file(frame.filename):
            at = (f" (at {frames.where(frame.filename, frame.lineno)}: "
                  f"{(frame.line or '').strip()})")
    return at


def metadata_arrays(tree: Any) -> list[tuple[str, Any]]:
    """(node type's name, array) of each array of more than one element, or JAX scalar, that
    a pytree keeps in its metadata, the static part JAX compares with == to find a compiled
    program again (a JAX array in an Equinox static field, equinox#746): JAX raises for one
    that is not the same object (a JAX scalar, inside another jit: jax-ml/jax#28311), and a
    step bakes it in as a constant. Read from each node's ``node_data()``: nothing is
    flattened or copied."""
    jax = devices.start_jax()
    out, stack = [], [jax.tree.structure(tree)]
    while stack:
        node = stack.pop()
        data = node.node_data()
        if data is None:  # a leaf
            continue
        kind, metadata = data
        out += [(getattr(kind, "__name__", str(kind)), a) for a in _arrays_in(metadata, jax)
                if math.prod(a.shape) > 1 or (a.ndim == 0 and isinstance(a, jax.Array))]
        stack.extend(node.children())
    return out


def _arrays_in(metadata: Any, jax: Any, depth: int = 3) -> list:
    """Arrays (JAX, NumPy) in a node's metadata, looked for through tuples, lists and dicts
    ``depth`` levels down (Equinox keeps its static fields' values in a tuple)."""
    if isinstance(metadata, (np.ndarray, jax.Array)):
        return [metadata]
    if depth == 0:
        return []
    items = (metadata.values() if isinstance(metadata, dict) else
             metadata if isinstance(metadata, (tuple, list)) else ())
    return [a for item in items for a in _arrays_in(item, jax, depth - 1)]


def describe_arguments(args: Any) -> str:
    """The arguments' array leaves as dtype and shape ("float32[8, 256]"), other leaves as
    their repr: for an error that names the call. Given (positional, keywords), each keyword's
    leaves after ``name=``: how an argument was passed can be the cause (jax.checkpoint's
    static_argnums counts positional ones only, jax-ml/jax#18405)."""
    jax = devices.start_jax()

    def leaves(tree: Any) -> str:
        return ", ".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(a.shape)}"
                         if hasattr(a, "shape") else repr(a) for a in jax.tree.leaves(tree))

    if isinstance(args, tuple) and len(args) == 2 and isinstance(args[0], tuple) \
            and isinstance(args[1], dict):
        return ", ".join([x for x in [leaves(args[0])] if x]
                         + [f"{k}={leaves(v) or repr(v)}" for k, v in args[1].items()])
    return leaves(args)


def function_name(fn: Any) -> str:
    """The name a function goes by (a callable object: its class's)."""
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


def unbound(fn: Callable, args: tuple, donate_argnums: int | Sequence[int],
            static_argnums: int | Sequence[int]) -> tuple[Callable, tuple, Any, Any]:
    """A jitted function bound as a method (``@partial(jax.jit, static_argnums=0)`` on a
    method, then ``obj.method``): the jitted function itself, with ``obj`` as its first
    argument and the positions given shifted by one (``obj`` static where any are given), as
    jit itself calls it. Given the bound method, JAX's own ``.lower(x)`` takes ``x`` for
    ``self`` and blames it ("Non-hashable static arguments", jax-ml/jax#9023 in a new user's
    trial). Anything else as it is."""
    inner = getattr(fn, "__func__", None)
    if not (inspect.ismethod(fn) and inner is not None and hasattr(inner, "lower")):
        return fn, args, donate_argnums, static_argnums

    def shift(nums):
        return nums + 1 if isinstance(nums, int) else tuple(
            n + 1 if isinstance(n, int) else n for n in nums) \
            if isinstance(nums, (tuple, list)) else nums

    donate, static = shift(donate_argnums), shift(static_argnums)
    if donate or static:  # jitted again for them: ``obj`` is no array, static as jit takes it
        static = tuple(sorted({0, *((static,) if isinstance(static, int) else static)}))
    return inner, (fn.__self__, *args), donate, static


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
    jax = devices.start_jax()
    if not callable(fn):
        raise BadInputError(f"fn must be a function (plain or jitted), got {fn!r}")
    fn, args, donate_argnums, static_argnums = unbound(fn, args, donate_argnums, static_argnums)
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
    # the executable takes the dynamic arguments only: the analyses below see those
    dyn_args = tuple(a for i, a in enumerate(args) if i not in statics)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    mesh = _mesh_devices((dyn_args, dyn_kwargs), jax) if device is None and over_mesh else ()
    if mesh:
        dev = mesh[0]
        why = (f"the first of the {len(mesh)} devices its arguments are placed over: XLA's "
               "sizes are one device's, each runs the same program")
    elif device is None and (committed := _device_of_committed((args, kwargs), jax)) is not None:
        dev, why = committed, "where its committed arguments live"
    else:
        dev, why = devices.resolve(device)
    def specs(keep_shardings: bool) -> tuple[tuple, dict]:
        a, k = _specs(args, kwargs, dev, jax, keep_shardings=keep_shardings)
        # static arguments go in as the values they are (a NumPy scalar stays a number)
        return (tuple(x if i in statics else spec
                      for i, (x, spec) in enumerate(zip(args, a, strict=True))),
                {n: kwargs[n] if n in static_names else v for n, v in k.items()})

    arg_specs, kw_specs = specs(keep_shardings=bool(mesh))
    if hasattr(fn, "lower") and not (donated or statics or static_names):
        jitted = fn  # the user's own jit, with whatever it declares
    else:
        jitted = jax.jit(fn, donate_argnums=donated, static_argnums=statics,
                         static_argnames=static_names)
    name = function_name(fn)
    lowered, err = _lower(jitted, arg_specs, kw_specs)
    lowered = _jax_lowered(lowered, jax)
    if err is None and jitted is not fn and hasattr(fn, "lower") and not _jax_jit(fn):
        asked = (("donate_argnames",) if by_name else ()) + (
            ("donate_argnums",) if set(donated) - set(by_name) else ()) + (
            ("static_argnums",) if statics else ()) + (("static_argnames",) if static_names else ())
        _check_wrapper_outputs(fn, lowered, args, kwargs, arg_specs, kw_specs, name, jax, asked)
    placed_by_jit = with_values = False
    static_arrays: tuple[str, ...] = ()
    if err is not None and jitted is fn and _jax_jit(fn) and "ShapeDtypeStruct" in str(err):
        # the user's jit declares an argument static that is a pytree of arrays (jax-ml/jax#9024):
        # given as shapes, its leaves reach the function as ShapeDtypeStructs. It goes in as
        # itself, as jit takes it: hashed, its arrays constants of the program
        found = _static_pytree(fn, args, kwargs, arg_specs, kw_specs, jax)
        if found is not None:
            where, lowered, arg_specs, kw_specs = found
            err = None
            if isinstance(where, int):
                statics = tuple(sorted({*statics, where}))
            else:
                static_names = (*static_names, where)
            dyn_args = tuple(a for i, a in enumerate(args) if i not in statics)
            dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
            value = args[where] if isinstance(where, int) else kwargs[where]
            static_arrays = (f"{_argument_label(fn, where)}, a {type(value).__name__} holding "
                             + ", ".join(f"{a.dtype}{list(a.shape)}" for a in
                                         jax.tree.leaves(value)[:3]
                                         if hasattr(a, "shape")),)
    if err is not None and jitted is fn and device is None and over_mesh and not _jax_jit(fn):
        # a wrapper's own lower() (eqx.filter_jit) that takes non-arrays as static: a shape is
        # no array to it. Lowering with the arguments themselves copies and runs nothing
        again, err_again = _lower(fn, args, kwargs)
        if err_again is not None:  # the arrays themselves fail too: that is the user's error
            err = err_again
        else:
            lowered, err, with_values = _jax_lowered(again, jax), None, True
            arg_specs, kw_specs = args, kwargs
            why = (f"where its arguments are: {name}'s own lower() ({type(fn).__module__}) "
                   "was given the arrays themselves, as it takes no shapes (nothing copied "
                   "or run)")
    retried = False
    if err is not None and device is None and over_mesh and not mesh and _placement_conflict(err):
        # the step's own shardings (a jit's in_shardings or out_shardings, a sharding inside
        # it) name other devices than the one its arguments were placed on here: leave the
        # arguments nothing commits for jit to place, as a real call does
        retry_specs = specs(keep_shardings=True)
        again, err_again = _lower(jitted, *retry_specs)
        retried = True
        if err_again is None:
            lowered, err, placed_by_jit = again, None, True
            arg_specs, kw_specs = retry_specs
    if err is not None:
        kind = type(err).__name__
        lines = str(err).strip().splitlines() or [kind]
        first = lines[0].rstrip(".")
        if first.endswith(":"):  # JAX's explanation follows on its next lines (shard_map's)
            first = " ".join([first, *(x.strip() for x in lines[1:] if x.strip())])[:1000]
        if fix := trace_errors.trace_error_fix(err):
            here = (" (preflight_step takes static_argnums and static_argnames as jax.jit "
                    "does)" if "static_argnames" in fix else "")
            raise BadInputError(f"{name} does not trace{user_line(err)}: {kind}: {first}. "
                                f"Why: {fix}{here}") from None
        if kind in trace_errors.TRACE_ERRORS:
            raise BadInputError(
                f"{name} does not trace{user_line(err)}: a traced value is used where Python "
                f"needs a concrete one (an if, int(), a shape). {kind}: {first}. Fix: "
                f"jnp.where or jax.lax.cond/while_loop, or mark the argument it comes from "
                f"static (static_argnums=... or static_argnames=... here, as for jax.jit)"
                ) from None
        several = ("incompatible devices" in first and "inside jit" in first
                   and " one device" not in first)
        if several and retried:  # placed as a real call places them, it fails as well
            hint = (". The call itself fails so: an argument is committed to one device and "
                    "the step places values on several (a sharding inside it). Put that "
                    "argument on the same devices (jax.device_put(x, sharding)), or pass it "
                    "uncommitted")
        elif several:
            hint = (". Sized here on one device, as asked (device= or measure_step), while "
                    "this step places values on several (a sharding inside it): without "
                    "device=, preflight_step sizes it over them; jax.jit(f).lower(...)"
                    ".compile().memory_analysis() gives XLA's sizes per device")
        elif jitted is fn and not _jax_jit(fn) and "ShapeDtypeStruct" in str(err):
            hint = (f". {name} is {type(fn).__module__.split('.')[0]}'s wrapper (such as "
                    "eqx.filter_jit), whose own lower() takes no shapes: preflight_step "
                    "without device= gives it the arrays themselves; measure_step and device= "
                    "need a jax.jit of the step")
        elif "metadata" in str(err) and (kept := metadata_arrays((args, kwargs))):
            node, a = kept[0]
            hint = (f". An argument's {node} keeps an array, {a.dtype}{list(a.shape)}, in its "
                    "static part (the pytree's metadata: a field marked static), which JAX "
                    "compares with == at each call: make it an ordinary field, a child of "
                    "the pytree")
        elif fix := devices.sharding_error_fix(err):
            hint = ". " + fix[0].upper() + fix[1:].rstrip(".")
        else:
            hint = ""
        raise BadInputError(f"{name} fails on these arguments "
                            f"({describe_arguments((args, kwargs))})"
                            f"{user_line(err)}: {kind}: {first}{_misspelled(kwargs)}"
                            + hint) from None
    try:
        with own.compiling():  # the kit's compile, not the user's: compiles.watch skips it
            compiled = lowered.compile()
    except Exception as err:
        if "RESOURCE_EXHAUSTED" in str(err):  # the GPU autotuner's candidates did not fit
            raise CompileOutOfMemory(
                f"XLA ran out of {device_name(dev)}'s memory while compiling {name} "
                f"({describe_arguments((args, kwargs))}): its autotuner runs candidate kernels "
                f"at these sizes, so the step cannot run with the memory free on this device "
                f"now. Fix: price a smaller batch or model (sizing.largest_batch steps down "
                f"by itself), or free memory first. XLA said: "
                f"{str(err)[:300]}") from None
        raise MeasurementFailed(f"XLA could not compile {name} for {device_name(dev)}: "
                                f"{type(err).__name__}: {str(err)[:300]}") from None
    if not (placed_by_jit or mesh or device is not None or not over_mesh):
        # no argument placed it (a jit of no argument whose out_shardings name a mesh,
        # jax-ml/jax#16679): the executable's own devices say where it runs
        placed_by_jit = len(_executable_devices(compiled, jax)) > 1
    if placed_by_jit:  # where the step's own shardings put it
        mesh = _executable_devices(compiled, jax)
        dev = mesh[0] if mesh else dev
        why = (f"the first of the {len(mesh)} devices its own shardings (in_shardings, "
               "out_shardings or one inside it) place it over: XLA's sizes are one device's, "
               "each runs the same program" if len(mesh) > 1 else
               "where its own shardings place it")
        mesh = mesh if len(mesh) > 1 else ()
    if jitted is fn and not with_values:  # donation the user's jit declared: read it back
        donated = tuple(sorted(set(donated) | _declared_donation(lowered, len(args), jax)))
    dyn_donated = tuple(i - sum(s < i for s in statics) for i in donated)  # among dyn_args
    try:
        closed = jitted.trace(*arg_specs, **kw_specs).jaxpr
    except Exception:  # a JAX that cannot trace apart from lowering
        closed = None
    if closed is None and with_values:  # a wrapper with no trace() (eqx.filter_jit): its jaxpr
        try:  # holds the arrays it closes over in an inner jit's (equinox#770)
            closed = jax.make_jaxpr(fn)(*args, **kwargs)
        except Exception:  # a wrapper that does not trace so
            closed = None
    try:  # read once: the analyses below and preflight_step's all parse it
        text = compiled.as_text()
    except Exception:  # a backend without program text
        text = None
    constants, folded = _constant_bytes(closed, text)
    n_leaves = len(jax.tree.leaves((dyn_args, dyn_kwargs)))
    kept = _kept(compiled, n_leaves, jax) or [True] * n_leaves  # (all, where JAX does not say)
    return CompiledStep(compiled, dev, why, donated,
                        *_residency(compiled, dyn_args, dyn_kwargs, kept, dev, jax, bool(mesh)),
                        _deleted(dyn_args, dyn_kwargs, jax)
                        or _donation_conflict(dyn_args, dyn_kwargs, dyn_donated, kept, jax),
                        constants,
                        _donations(compiled, text, dyn_args, dyn_kwargs, dyn_donated, kept, jax,
                                   bool(mesh)), name,
                        statics, static_names, closed, folded, bool(mesh), text, with_values,
                        *_dropped_by_keyword(fn, jitted, compiled, arg_specs, kw_specs, jax),
                        type(fn).__module__.split(".")[0]
                        if hasattr(fn, "lower") and not _jax_jit(fn) else "",
                        _shared_memory_note(dyn_args, dyn_kwargs, dyn_donated, kept, jax),
                        max(len(mesh), 1), *_fusion_intermediates(lowered, compiled, text, dev),
                        static_arrays)


def _fusion_intermediates(lowered, compiled, text: str | None, dev) -> tuple[int, bool]:
    """The values XLA:CPU's YNNPACK fusions make inside themselves, outside its buffer plan:
    where a fusion makes a value of 1 MiB or more larger than its result
    (:func:`jaxcompat.ynn_fusion_intermediates`), the temporaries XLA plans for the same program
    compiled without YNNPACK fusions, less those it plans with them; and whether such a fusion
    holds a dot or a convolution. (0, False) off the CPU, where there is none, and where the
    second compile fails (the first stands)."""
    if getattr(dev, "platform", "") != "cpu" or not text:
        return 0, False
    try:
        found = [f for f in jaxcompat.ynn_fusion_intermediates(text) if f[0] >= 2**20]
        if not found:
            return 0, False
        with own.compiling():
            unfused = lowered.compile(compiler_options=jaxcompat.YNN_FUSIONS_OFF)
        return (max(0, _analysis(unfused)["temp"] - _analysis(compiled)["temp"]),
                any(f[2] for f in found))
    except Exception:  # a JAX without the option, or text the parser cannot read
        return 0, False


_OPTIONS = ("device", "donate_argnums", "donate_argnames", "static_argnums", "static_argnames",
            "target")


def _jax_jit(fn) -> bool:
    """``fn`` is jax.jit's own (a PjitFunction), not another library's wrapper with a lower()
    method (eqx.filter_jit: it takes non-arrays as static, a ShapeDtypeStruct among them)."""
    return type(fn).__module__.split(".")[0] in ("jax", "jaxlib")


def _jax_lowered(lowered, jax):
    """JAX's own Lowered inside a library's (equinox's and Flax NNX's keep it as ``.lowered``):
    its compile() gives JAX's Compiled, whose outputs (``out_info``) and program the kit reads.
    nnx.jit's inner program takes the modules' state as a pytree of the same leaves, in the
    same order, and returns it updated beside the step's own outputs."""
    inner = getattr(lowered, "lowered", None)
    if lowered is None or isinstance(lowered, jax.stages.Lowered) or not isinstance(
            inner, jax.stages.Lowered):
        return lowered
    return inner


def _check_wrapper_outputs(fn, lowered, args, kwargs, arg_specs, kw_specs, name: str, jax,
                           asked: tuple[str, ...] = ("donate_argnums",)) -> None:
    """Refuse to price ``jax.jit(fn, ...)`` (what the kit compiles when it is asked to donate
    or to keep arguments static: the options in ``asked``) where ``fn`` is another library's
    jit whose own program returns more than that jit's does: Flax's ``nnx.jit`` returns the
    modules' updated state beside the step's outputs, which a jax.jit around it drops (XLA
    then drops the work that made it), so the kit would price a step that updates nothing."""
    own_lowered, err = _lower(fn, arg_specs, kw_specs)
    if err is not None:
        own_lowered, err = _lower(fn, args, kwargs)
    try:
        own = len(jax.tree.leaves(_jax_lowered(own_lowered, jax).out_info))
        wrapped = len(jax.tree.leaves(lowered.out_info))
    except Exception:  # a wrapper or JAX whose lowering does not say: price it as asked
        return
    if own > wrapped:
        module = type(fn).__module__.split(".")[0]
        what = " and ".join(dict.fromkeys(
            "the donation" if a.startswith("donate") else "the static arguments" for a in asked))
        declare = ", ".join(f"{a}=..." for a in asked)
        raise BadInputError(
            f"{name} is {module}'s own jit ({type(fn).__name__}), whose program returns "
            f"{own} arrays where jax.jit around it returns {wrapped}: it hands back state "
            "that a jax.jit around it drops (Flax NNX's updated modules), and the kit puts "
            f"one around it to apply {what} asked here, so it would price a step that updates "
            f"nothing. Declare them on the wrapper itself (nnx.jit(step, {declare})) and call "
            f"preflight_step without {' or '.join(asked)} (google/flax#5026)")


def _static_pytree(fn, args: tuple, kwargs: dict, arg_specs: tuple, kw_specs: dict, jax
                   ) -> tuple[int | str, Any, tuple, dict] | None:
    """(where, the lowering, the specs with it as itself) for the one argument of a user's
    jax.jit that lowers when given as the value it is, not as shapes: an argument the jit
    declares static that holds arrays (a registered pytree whose hash is its identity). None
    where no single argument does so."""
    def holds_arrays(value) -> bool:
        return any(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in jax.tree.leaves(value))

    for where in [*(i for i, a in enumerate(args) if holds_arrays(a)),
                  *(n for n, v in kwargs.items() if holds_arrays(v))]:
        a = tuple(args[i] if i == where else spec for i, spec in enumerate(arg_specs))
        k = {n: kwargs[n] if n == where else spec for n, spec in kw_specs.items()}
        lowered, err = _lower(fn, a, k)
        if err is None:
            return where, lowered, a, k
    return None


def _argument_label(fn, where: int | str) -> str:
    """``where`` as the function names it: "argument 0 (m)", or the keyword's name."""
    if isinstance(where, str):
        return where
    try:
        names = list(inspect.signature(fn).parameters)
        return f"argument {where} ({names[where]})"
    except (TypeError, ValueError, IndexError):
        return f"argument {where}"


def _lower(jitted, arg_specs, kw_specs) -> tuple[Any, BaseException | None]:
    """(the lowering, None), or (None, the error lowering raised)."""
    try:
        with warnings.catch_warnings(), own.compiling():  # the kit's: compiles.watch skips it
            # "Some donated buffers were not usable": see donations
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            return jitted.lower(*arg_specs, **kw_specs), None
    except Exception as err:
        return None, err


def _dropped_by_keyword(fn, jitted, compiled, arg_specs, kw_specs, jax
                        ) -> tuple[tuple[str, ...], int]:
    """(the keyword arguments whose donation ``fn``'s own wrapper drops, the bytes XLA aliases
    when they are passed by position instead). jax.pmap donates positional arguments only
    (jax-ml/jax#8470; jax.jit keeps a donation passed by keyword, and its lowering says
    ``donated`` for both): lowered again by position, does XLA alias more? ((), 0) where not,
    or where the arguments have no positions to move to."""
    if not kw_specs or jitted is not fn or _jax_jit(fn):
        return (), 0
    try:
        bound = inspect.signature(fn).bind(*arg_specs, **kw_specs)
    except (TypeError, ValueError):
        return (), 0
    if bound.kwargs:  # keyword-only parameters: no position to pass them at
        return (), 0
    by_position, err = _lower(fn, bound.args, {})
    if err is not None:
        return (), 0
    by_position = getattr(by_position, "lowered", by_position)  # a wrapper's Lowered
    moved = sorted(i for i in _declared_donation(by_position, len(bound.args), jax)
                   if i >= len(arg_specs))
    if not moved:  # nothing the wrapper donates by position: no second compile
        return (), 0
    try:
        with own.compiling():
            aliased = by_position.compile().memory_analysis().alias_size_in_bytes
        now = compiled.memory_analysis().alias_size_in_bytes
    except Exception:  # a backend without memory_analysis
        return (), 0
    if aliased <= now:
        return (), 0
    names = list(bound.arguments)
    return tuple(names[i] for i in moved), aliased - now


def _placement_conflict(err: BaseException) -> bool:
    """The lowering failed because the arguments' placement here disagrees with shardings the
    step declares (jit's "incompatible devices", or an argument whose sharding does not match
    jit's in_shardings)."""
    text = str(err)
    return "incompatible devices" in text or "does not match the sharding" in text


def _executable_devices(compiled, jax) -> tuple:
    """The devices, by id, the executable's input and output shardings span."""
    try:
        found = {d for s in jax.tree.leaves((compiled.input_shardings,
                                             compiled.output_shardings))
                 for d in getattr(s, "device_set", ())}
    except Exception:
        return ()
    return tuple(sorted(found, key=lambda d: d.id))


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
    #: lowered by the function's own lower() with the arguments themselves (a wrapper such as
    #: eqx.filter_jit takes no shapes): its executable takes that wrapper's split of them
    lowered_with_arguments: bool = False
    #: keyword arguments whose donation the function's own wrapper drops (jax.pmap donates
    #: by position only), and the bytes XLA writes into donated buffers when they are passed
    #: by position instead (each device's)
    dropped_by_keyword: tuple[str, ...] = ()
    aliased_by_position: int = 0
    #: the library whose own jit the step is (``flax`` for nnx.jit), "" for jax.jit's or a
    #: plain function: the kit puts no jax.jit with a donation around such a wrapper
    own_jit: str = ""
    #: a donated array and another over the same memory that may be one NumPy array's,
    #: adopted twice on the CPU (the call runs) or one JAX buffer (it fails); "" where none
    shared_memory: str = ""
    #: the devices the program runs on (its shardings' or its arguments'), each running all of
    #: it: its constants are whole on each (jax-ml/jax#16679)
    spanned: int = 1
    #: on the CPU, the values YNNPACK fusions make inside themselves that XLA's plan does not
    #: count, as XLA plans the program without such fusions (netket/netket#783); 0 where no
    #: fusion makes a value of 1 MiB or more larger than its result. YNNPACK tiles some and
    #: holds others whole, so this is what the step may need beyond its peak, not part of it
    fusion_intermediates: int = 0
    #: whether such a fusion holds a dot or a convolution (else elementwise work and a sum)
    fusion_has_dot: bool = False
    #: an argument the user's jit declares static that holds arrays, e.g. "argument 0 (m), a
    #: MyClass holding int32[4]": hashed by identity, its arrays baked in (jax-ml/jax#9024)
    static_arrays: tuple[str, ...] = ()

    def dynamic(self, args: Sequence, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments the executable is called with: the static ones left out."""
        return (tuple(a for i, a in enumerate(args) if i not in self.static_argnums),
                {k: v for k, v in kwargs.items() if k not in self.static_argnames})

    def run(self, args: Sequence, kwargs: dict) -> Any:
        """Run the executable on the dynamic arguments (:meth:`dynamic`), as its program takes
        them: Flax 0.12's nnx.jit compiles a program that takes the modules' state (its
        NodeStates) where the step is given the modules, the same leaves in the same order,
        and JAX refuses a Compiled called with other Python types ("Function compiled with
        input pytree does not match": the H100 run of 2026-11-27; jax 0.8.0 to 0.11.2)."""
        jax = devices.start_jax()
        tree = getattr(self.executable, "in_tree", None)
        leaves, given = jax.tree.flatten((tuple(args), dict(kwargs)))
        if tree is not None and tree != given and tree.num_leaves == len(leaves):
            args, kwargs = jax.tree.unflatten(tree, leaves)
        return self.executable(*args, **kwargs)

    def argument_names(self, fn: Callable, args: Sequence, kwargs: dict) -> list[tuple]:
        """(position or keyword, the name ``fn`` gives it) for each argument that is not
        static ("args[2]" for ``*args``)."""
        import inspect

        try:
            params = [q for q in inspect.signature(fn).parameters.values()
                      if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        out = [(i, params[i].name if i < len(params) else f"args[{i}]")
               for i in range(len(args)) if i not in self.static_argnums]
        return out + [(k, k) for k in kwargs if k not in self.static_argnames]

    def leaf_names(self, fn: Callable, args: Sequence, kwargs: dict
                   ) -> Callable[[tuple], tuple[str, str]]:
        """For a key path into the dynamic arguments, ``(args, kwargs)`` as
        ``jax.tree_util.tree_flatten_with_path`` gives it: (the argument's name as ``fn``
        calls it, the path in it, such as "['w1']")."""
        jax = devices.start_jax()
        positional = [name for where, name in self.argument_names(fn, args, kwargs)
                      if isinstance(where, int)]

        def names(path: tuple) -> tuple[str, str]:
            top = path[1]  # (args, kwargs)[0][i] or [1][key]
            return (positional[top.idx] if path[0].idx == 0 else str(top.key),
                    jax.tree_util.keystr(path[2:]))

        return names

    def arguments(self, fn: Callable, args: Sequence, kwargs: dict) -> list[tuple[str, Any]]:
        """(the name ``fn`` gives it, its value) for each argument that is not static."""
        return [(name, args[where] if isinstance(where, int) else kwargs[where])
                for where, name in self.argument_names(fn, args, kwargs)]

    def input_shardings(self, args: Sequence, kwargs: dict) -> list | None:
        """The sharding the executable takes each array leaf of the dynamic arguments with
        (None for one it drops); None where this JAX does not say."""
        jax = devices.start_jax()
        return _input_shardings(self.executable, len(jax.tree.leaves(self.dynamic(args, kwargs))),
                                jax)

    def sizes(self) -> dict:
        """XLA's sizes (``argument``, ``output``, ``alias``, ``temp``, ``generated_code``,
        ``xla_peak``: memory_analysis()), and ``peak``: every buffer the executable holds at
        once, at most (the temporaries are one block, allocated for the whole run)."""
        return _analysis(self.executable)

    @cached_property
    def values(self) -> list[dict]:
        """The values XLA materializes between the step's operations (largest first), with the
        user's (file, line) that made each where the program text records it."""
        try:
            return jaxcompat.entry_values(self.text or "", frames.is_user_file)
        except Exception:  # text the parser cannot read
            return []

    def temporaries(self, most: int = 3) -> tuple[Temporary, ...]:
        """The largest values XLA materializes between the step's operations, with their
        lines."""
        out = []
        for v in self.values[:most]:
            line = frames.line(*v["source"]) if v["source"] else ""
            out.append(Temporary(v["op"].rsplit("/", 1)[-1], v["dtype"], v["shape"],
                                 v["nbytes"], line, batched="vmap(" in v["op"],
                                 in_derivative=_in_derivative(v["op"]),
                                 forward_vmaps=v["op"].rsplit("/", 1)[0].count("vmap(jvp(")))
        return tuple(out)

    def unrolled(self, leaves: int = 0) -> str:
        """A note when one line of the user's code made ``UNROLLED_AT`` or more of the
        program's operations: a Python loop inside jit, unrolled (jax-ml/jax#2777), or, where
        their number goes with the ``leaves`` of the arguments (a pytree of many arrays), one
        operation per array (jax-ml/jax#4667); "" otherwise."""
        return _unrolled(self.values, leaves, self.jaxpr)

    def jacobians(self) -> tuple[Jacobian, ...]:
        """Each ``jax.jacrev`` and ``jax.jacfwd`` in the step, with its rows (outputs) and
        columns (inputs). Read from JAX's own functions in each equation's traceback
        (``_std_basis``, ``_jacrev_unravel``, ``_jacfwd_unravel`` under the ``jacfun`` of
        ``jacrev`` or ``jacfwd``; jax 0.8.0 and 0.10.2 alike)."""
        return tuple(Jacobian(*sizes) for sizes in jaxpr_derivatives.jacobian_sizes(self.jaxpr))

    def stopped_scans(self) -> tuple[tuple[int, str, str, str], ...]:
        """(length, the flag's type, the scan's line, the line that sets the flag) of each
        ``lax.scan`` whose carry holds a flag that only turns on and gates the body (a decode
        loop's ``stopped``): it runs every step after the flag is on everywhere
        (NovaSky-AI/SkyRL#1058)."""
        return tuple(jaxpr_loops.stop_flags(self.jaxpr))

    def jacobian_products(self) -> tuple[JacobianProduct, ...]:
        """Each whole Jacobian the step only multiplies by a vector, largest first: the output
        of JAX's ``_jacfwd_unravel`` or ``_jacrev_unravel`` read by a ``dot_general`` whose
        other operand keeps no dimension of its own (jax-ml/jax#2937)."""
        return tuple(JacobianProduct(*p) for p in jaxpr_derivatives.jacobian_products(self.jaxpr))

    def jacobian_solves(self) -> tuple[tuple[str, tuple[int, ...], str, int, str, str], ...]:
        """(mode, its shape, its dtype, bytes, the Jacobian's line, the solve's line) of each
        whole Jacobian the step hands only to a dense linear solve, largest first
        (patrick-kidger/optimistix#93: a Newton step's J^-1 r)."""
        return tuple(jaxpr_derivatives.jacobian_solves(self.jaxpr))

    def jacobian_diagonals(self) -> tuple[tuple[str, tuple[int, ...], str, int, str, str, bool],
                                          ...]:
        """(mode, its shape, its dtype, bytes, the Jacobian's line, the diagonal's line, whether
        it is a Hessian) of each whole Jacobian or Hessian whose only reader is ``jnp.diag``,
        ``jnp.diagonal`` or ``jnp.trace`` of its main diagonal, a batch of them under vmap too,
        largest first (netket/netket#1655; jax-ml/jax#3801)."""
        return tuple(jaxpr_derivatives.jacobian_diagonals(self.jaxpr))

    def scaled_by_zero(self) -> tuple[tuple[str, int, str], ...]:
        """("float32[512, 512]", bytes, line) of each floating array the step computes and then
        multiplies by the constant 0.0 (``optax.scale(0.0)`` on frozen parameters' gradients,
        google-research/big_vision#14): XLA keeps the work that makes it, since 0 * x is not 0
        for an infinite or NaN x. An argument times 0.0 (a weight decay of 0.0) is not listed:
        nothing is computed for it."""
        return jaxpr_values.scaled_by_zero(self.jaxpr)

    def cast_before_scan(self) -> tuple[tuple[str, str, tuple[int, ...], int, str, str, str],
                                        ...]:
        """(dtype, narrower dtype, shape, bytes, the cast's line, the scan's line, the scan's
        role) of each input cast whole to a narrower float and then read by a ``lax.scan`` one
        step at a time (marin-community/levanter#426)."""
        return jaxpr_loops.cast_before_scan(self.jaxpr)

    @cached_property
    def jacobian_lines(self) -> frozenset[str]:
        """The user's lines traced inside ``jax.jacfwd`` or ``jax.jacrev``: where a vmapped
        value may be the Jacobian's own basis, not a vmap of the user's (jax-ml/jax#787)."""
        return jaxpr_derivatives.jacobian_lines(self.jaxpr)

    def loop_records(self) -> tuple[tuple[str, tuple[int, ...], tuple[int, ...], str, int, str,
                                          str, int | None, bool], ...]:
        """(the loop's primitive, the buffer's shape, one step's shape, dtype, bytes, the
        write's line, the write's primitive: ``maybe_set`` for equinox's, the scan's steps: None
        for a ``while_loop``, whether the buffer starts as a value made in the step) of each
        buffer a ``lax.while_loop``, ``lax.fori_loop`` or ``lax.scan``
        carries and only writes, one step's value per row (google-deepmind/gemma#534)."""
        return jaxpr_loops.loop_records(self.jaxpr)

    def loop_carries(self) -> tuple[Temporary, ...]:
        """Each value a loop of the program carries, largest first, as a :class:`Temporary`
        ("a loop's carry", no line): buffers XLA holds for the whole loop, which
        :meth:`temporaries` does not list (a solver's basis under jax.jacrev's vmap:
        uwplasma/vmex#328). () where the program has no text."""
        try:
            carried = jaxcompat.while_carried(self.text or "")
        except Exception:  # text the parser cannot read
            return ()
        return tuple(Temporary("a loop's carry", dtype, dims, n, "") for dtype, dims, n in carried)

    def carry_copies(self, least: int = _CARRY_COPY_AT, few: int = 16
                     ) -> tuple[tuple[str, tuple[int, ...], int, int, int | None, bool, str],
                                ...]:
        """(dtype, the carried value's shape, its bytes, whole copies of it in one step,
        the loop's steps: None where XLA does not know them, inside a derivative, the loop's
        line) of each value of ``least`` bytes or more a loop of the step's own (of ``few``
        steps or more, or a while_loop) carries that XLA copies whole on every step of the
        optimized program: a ``copy`` of the carried shape in the body of a ``while``, so each
        step costs the whole buffer, not the row it writes (jax-ml/jax#10197:
        a row written into the carry under ``jax.grad``; jax-ml/jax#17845: the carry read before
        a write and that value used after it). Largest first; () without program text."""
        out = []
        found = jaxcompat.while_carry_copies(self.text or "", least)
        for dtype, shape, nbytes, copies, steps, op in found:
            lines = jaxpr_loops.carry_lines(self.jaxpr, shape)
            if not lines or (steps is not None and steps < few):
                continue  # a loop XLA made (threefry's 5 rounds), or a few copies in all
            out.append((_jax_dtype(dtype), shape, nbytes, copies, steps,
                        _in_derivative(op + "/copy"), lines[0]))
        return tuple(out)

    def carry_slice_copies(self, least: int = _CARRY_COPY_AT, few: int = 16
                           ) -> tuple[tuple[str, tuple[int, ...], int, int, int, int,
                                            int | None, str, str], ...]:
        """(dtype, the carried value's shape, its bytes, copies of slices of it a step,
        concatenates of a slice's shape a step, the bytes those move a step, the loop's steps:
        None where XLA does not know them, the loop's line, the concatenates' line where it is
        not the loop's) of each value of ``least`` bytes or more a loop of the step's own (of
        ``few`` steps or more, or a while_loop) carries and updates in place while XLA copies
        slices of it and concatenates them back on every step: a KV cache whose layer's K and
        V are sliced out, updated and stacked back to write one row (keras-team/keras-hub#2780).
        Most bytes first; () without program text."""
        out = []
        for dtype, shape, nbytes, copies, joins, moved, steps, _, source in (
                jaxcompat.while_slice_copies(self.text or "", least, frames.is_user_file)):
            lines = jaxpr_loops.carry_lines(self.jaxpr, shape)
            if not lines or (steps is not None and steps < few):
                continue  # a loop XLA made, or a few copies in all
            joined = frames.line(*source) if source else ""
            out.append((_jax_dtype(dtype), shape, nbytes, copies, joins, moved, steps, lines[0],
                        "" if joined == lines[0] else joined))
        return tuple(out)
    def updated_copies(self) -> tuple[tuple[int, int], ...]:
        """(the program's parameter number, bytes) of each argument leaf the step copies whole
        only to write a slice into the copy (``x.at[i].set(v)``, ``dynamic_update_slice``, a
        scatter), largest first: an argument not donated must stay as it was, so every call
        copies all of it (jax-ml/jax#9132). A parameter's number counts the leaves the
        executable takes. () without program text."""
        return tuple(jaxcompat.updated_parameter_copies(self.text or ""))

    def callbacks_every_step(self) -> tuple[tuple[str, str, str, int | None], ...]:
        """(the callback, its line, the loop, its steps: None for a while_loop) of each host
        callback in a loop's body with no cond around it: it runs on every iteration
        (liesel-devs/liesel#282)."""
        return jaxpr_callbacks.callbacks_every_step(self.jaxpr)

    def callbacks(self) -> tuple[tuple[str, str], ...]:
        """(the callback, its line) of each host callback in the step: the Python it runs
        allocates outside XLA's plan, so XLA's sizes leave that memory out (jax-ml/jax#31292)."""
        return jaxpr_callbacks.callbacks(self.jaxpr)

    def batched_whiles_reduced(self) -> tuple[str, ...]:
        """The line of each lax.while_loop that jax.vmap batched (its stop test an array, one
        per element) where the program all-reduces a while loop's stop test across devices at
        every iteration: its batch is split over them, so each device runs until the slowest
        element anywhere stops (jax-ml/jax#26586); () where none, or no program text."""
        reduced = jaxcompat.while_condition_all_reduces(self.text or "")
        if not reduced:
            return ()
        return tuple(dict.fromkeys(
            jaxpr_walk.equation_line(eqn) for j, _ in jaxpr_walk.walk(self.jaxpr)
            for eqn in getattr(j, "eqns", ()) if eqn.primitive.name == "while"
            and getattr(eqn.params["cond_jaxpr"].out_avals[0], "shape", ()) != ()))

    def callbacks_removed(self) -> tuple[str, ...]:
        """The line of each jax.pure_callback in the step that XLA removed from the program,
        its result read by nothing: it never runs (jax-ml/jax#13762). Matched by line where
        the program text records the callbacks' lines; otherwise only where it kept none."""
        kept = jaxcompat.kept_callbacks(self.text or "", frames.is_user_file)
        pure = [at for cb, at in self.callbacks() if cb == "jax.pure_callback"]
        if kept is None or not pure:
            return ()
        kept = [src for op, src in kept if op == "pure_callback"]
        if not kept:
            return tuple(pure)
        if None in kept or len(kept) >= len(pure):
            return ()  # (some kept without a line, or none removed: which ones cannot be told)
        lines = {frames.line(*src) for src in kept}
        if not lines <= set(pure):  # a kept one's line is not its jaxpr's (a transposed
            return ()  # callback under shard_map: the loss's line, jax-ml/jax#21855's trial)
        code = jaxpr_callbacks.pure_callback_code(self.jaxpr)
        running = {c for at, c in code if at in lines and c is not None}
        # (a line whose Python also runs from a kept callback, a custom_vjp's backward, is
        # not one that never runs: deleting it would break the gradient)
        return tuple(at for at, c in code if at and at not in lines and c not in running)

    def callbacks_calling_jax(self) -> tuple[tuple[str, str, str, str], ...]:
        """(the callback, its line, the function it runs, what in it is JAX's) of each
        pure_callback and io_callback whose Python calls JAX itself, which can hang the step
        (jax-ml/jax#24255)."""
        return jaxpr_callbacks.callbacks_calling_jax(self.jaxpr)

    def computed_while_compiling(self) -> bool:
        """The program takes no parameter and only copies or broadcasts constants, and the step
        closes over an array: XLA computed the whole result from that array while compiling,
        and a call only copies it out (jax-ml/jax#13956). A step that only allocates
        (``jnp.zeros`` of static sizes: a broadcast of the constant 0) is not one; neither is
        a step whose jaxpr this JAX cannot trace apart."""
        return bool(self.text and jaxpr_walk.closes_over_arrays(self.jaxpr)
                    and jaxcompat.computed_while_compiling(self.text))

    def callbacks_hoisted(self) -> tuple[tuple[str, str, str, str], ...]:
        """(the callback, its line, the loop, the loop's line) of each host callback written in
        a loop's body that the step runs once, outside the loop: under jax.grad, scan moves a
        callback that reads nothing the loop changes out of it (jax-ml/jax#16637)."""
        return jaxpr_callbacks.callbacks_hoisted(self.jaxpr)

    def callbacks_vmapped(self) -> tuple[tuple[str, str, int], ...]:
        """(the callback, its line, its calls per run: one per element) of each host callback
        that jax.vmap made a loop of, one call after another (OpenSourceEconomics/pylcm#316)."""
        return jaxpr_callbacks.callbacks_vmapped(self.jaxpr)

    def callbacks_broadcast(self) -> tuple[tuple[str, str, str, tuple[int, ...], int], ...]:
        """(the callback, its line, the argument as "float32[1024, 1024]", the shape vmap broadcast
        it to, its bytes) of each argument jax.vmap copied once per element for a
        jax.pure_callback of vmap_method="broadcast_all", the largest first (jax-ml/jax#17187)."""
        return jaxpr_callbacks.callbacks_broadcast(self.jaxpr)

    def in_selected_conds(self) -> tuple[tuple[str, str, str, int], ...]:
        """(the callback or "lax.while_loop", its line, the cond's line, how many) of each host
        callback, and each batched while_loop, in a branch of a lax.cond that jax.vmap made a
        select: both branches run on every element (jax-ml/jax#19314, #2947)."""
        return jaxpr_callbacks.in_selected_conds(self.jaxpr)

    @cached_property
    def temp_without_prints(self) -> tuple[str, str, int] | None:
        """(the print as the user wrote it, its line, XLA's temporaries for the step compiled
        again with its jax.debug.print and jax.debug.callback left out), where the step has
        one: a print is part of the program XLA compiles and can change it (jax-ml/jax#26370:
        printing a 16 MiB intermediate kept it, 0 B of temporaries without the print, on a
        CPU with jax 0.10.2; 0.8.0 kept it either way). One more compile, the kit's own (on
        one device: None for a step over several, where it has no print, or where the program
        without them does not compile)."""
        if self.over_mesh or self.jaxpr is None or not (
                found := jaxpr_callbacks.prints(self.jaxpr)):
            return None
        jax = devices.start_jax()
        try:
            from jax.extend.core import jaxpr_as_fun

            stripped = jaxpr_callbacks.without_prints(self.jaxpr)
            on = jax.sharding.SingleDeviceSharding(self.device)
            specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, sharding=on)
                     for v in stripped.jaxpr.invars]
            with warnings.catch_warnings(), own.compiling():  # the kit's: compiles.watch skips
                warnings.simplefilter("ignore")
                other = jax.jit(jaxpr_as_fun(stripped)).lower(*specs).compile()
            return (*found[0], _analysis(other)["temp"])
        except Exception:  # a jaxpr this JAX does not rebuild or lower so
            return None

    def threefry_draws(self) -> tuple[tuple[tuple[int, ...], int, str, int], ...]:
        """(shape, bytes, line, keys: more than 1 where jax.vmap batched the key) of each
        ``jax.random`` draw through the threefry2x32 generator (JAX's default), largest first:
        XLA's plan may hold its uint32 bits several times over while making them
        (jax-ml/jax#20328)."""
        return jaxpr_values.threefry_draws(self.jaxpr)

    def narrowed_inputs(self, args: Sequence, kwargs: dict) -> tuple[tuple[tuple, Any, str, str],
                                                                       ...]:
        """(the leaf's key path in the dynamic arguments, the leaf, the dtype it is cast to,
        the line) of each floating array argument the step reads only through a cast to a
        narrower floating type, never as it is (float32 parameters under a bfloat16
        computation, huggingface/transformers#12534). Empty where the jaxpr's inputs are not
        the arguments' leaves (a wrapper such as eqx.filter_jit splits them its own way)."""
        jax = devices.start_jax()
        flat = jax.tree_util.tree_flatten_with_path(self.dynamic(args, kwargs))[0]
        invars = getattr(getattr(self.jaxpr, "jaxpr", None), "invars", ())
        if self.lowered_with_arguments or len(invars) != len(flat):
            return ()
        return tuple((flat[n][0], flat[n][1], to, line)
                     for n, to, line in jaxpr_values.narrowed_inputs(self.jaxpr))

    def widened_inputs(self, args: Sequence, kwargs: dict
                       ) -> tuple[tuple[tuple | None, str, str, tuple[int, ...], int, str, str,
                                        tuple | None], ...]:
        """(the leaf's key path in the dynamic arguments, None for a value computed from
        them; its dtype; the wider dtype jnp's promotion reads it as; its shape; its bytes at
        that dtype; the line; "constant" or "argument" for what widens it; that argument's key
        path or None) of each floating value the step widens by promotion before a dot or a
        convolution (:func:`helpers._internal.jaxpr_values.widened_inputs`: jax-ml/jax#1830,
        #7368). Paths are None where the jaxpr's inputs are not the arguments' leaves."""
        jax = devices.start_jax()
        flat = jax.tree_util.tree_flatten_with_path(self.dynamic(args, kwargs))[0]
        invars = getattr(getattr(self.jaxpr, "jaxpr", None), "invars", ())
        named = not self.lowered_with_arguments and len(invars) == len(flat)

        def path(n: int | None) -> tuple | None:
            return flat[n][0] if named and n is not None else None

        return tuple((path(n), dtype, to, shape, nbytes, line, kind, path(other))
                     for n, dtype, to, shape, nbytes, line, kind, other
                     in jaxpr_values.widened_inputs(self.jaxpr))

    def outputs(self) -> list[tuple[str, Any, str]]:
        """(the output's path as jax.tree_util.keystr writes it, its shape and dtype, its kind)
        for each array the step returns. The kind: "gradient" (made by a derivative's backward
        pass), "zero gradient" (one JAX knows is zero and makes all the same), or ""; "" for
        every output where the jaxpr's outputs are not the executable's (a wrapper's split)."""
        return list(self._outputs)

    @cached_property
    def _outputs(self) -> tuple[tuple[str, Any, str], ...]:
        jax = devices.start_jax()
        try:
            flat = jax.tree_util.tree_flatten_with_path(self.executable.out_info)[0]
        except Exception:  # an executable that does not say
            return ()
        kinds = jaxpr_values.output_kinds(self.jaxpr)
        if self.lowered_with_arguments or len(kinds) != len(flat):
            kinds = [""] * len(flat)
        return tuple((jax.tree_util.keystr(path), leaf, kind)
                     for (path, leaf), kind in zip(flat, kinds, strict=True))

    def replicated_outputs(self) -> tuple[tuple[str, Any, int, int], ...]:
        """(the output's path, its shape and dtype, how many devices hold it, its index among
        the outputs) of each output every one of several devices holds whole (its sharding
        fully replicated: an out_shardings of P(), or XLA's choice), the largest first; ()
        where the executable does not say (marin-community/levanter#639: a split parameter
        replicated to be saved ran a TPU out of memory)."""
        jax = devices.start_jax()
        try:
            shardings = jax.tree.leaves(self.executable.output_shardings)
        except Exception:  # an executable that does not say
            return ()
        outs = self.outputs()
        if len(shardings) != len(outs):
            return ()
        found = [(path, aval, len(s.device_set), i)
                 for i, ((path, aval, _), s) in enumerate(zip(outs, shardings, strict=True))
                 if s.is_fully_replicated and len(s.device_set) > 1]
        return tuple(sorted(found, key=lambda o: -array_bytes(o[1])))

    def updated_arguments(self, fn: Callable, args: Sequence, kwargs: dict
                          ) -> list[frozenset[str]] | None:
        """For each output, the names of the arguments it is a new value of (``acc + g`` of
        ``acc``, ``p - lr * g`` of ``p``: :func:`helpers._internal.jaxpr_values.updated_inputs`);
        empty for a value made anew. None where the jaxpr's inputs or outputs are not the
        executable's (a wrapper's split)."""
        jax = devices.start_jax()
        flat = jax.tree_util.tree_flatten_with_path(self.dynamic(args, kwargs))[0]
        invars = getattr(getattr(self.jaxpr, "jaxpr", None), "invars", ())
        updates = jaxpr_values.updated_inputs(self.jaxpr)
        if self.lowered_with_arguments or len(invars) != len(flat) or \
                len(updates) != len(self.outputs()):
            return None
        names = self.leaf_names(fn, args, kwargs)
        return [frozenset(names(flat[k][0])[0] for k in found) for found in updates]

    def repeated_outputs(self) -> tuple[tuple[str, str, int], ...]:
        """(the output's path, the path of the earlier output it repeats, its bytes) of each
        output that is the same computed value as another: XLA writes each into its own
        buffer (marin-community/marin#3668). () where the jaxpr's outputs are not the
        executable's."""
        made = self.outputs()
        pairs = jaxpr_loops.repeated_outputs(self.jaxpr)
        if not made or any(j >= len(made) for _, j in pairs):
            return ()
        return tuple((made[j][0], made[i][0], array_bytes(made[j][1])) for i, j in pairs)

    def scan_stacks(self, room: int, most: int = 3) -> tuple[ScanStack, ...]:
        """Each ``lax.scan`` in the step (nested ones included) with what it stacks over its
        length, largest first, from 1 MiB: only where the program still has a value of the
        largest one's shape and its outputs and temporaries (``room``) could hold the stacks
        (XLA drops a stack that nothing uses)."""
        return _scan_stacks(self.jaxpr, self.text, room, most)

    @cached_property
    def primitives(self) -> frozenset[str]:
        """The names of the JAX primitives in the step's jaxpr, nested ones included (empty
        where this JAX cannot trace apart from lowering)."""
        return frozenset(eqn.primitive.name for j, _ in jaxpr_walk.walk(self.jaxpr)
                         for eqn in getattr(j, "eqns", ()))

    def ignored_device_puts(self) -> tuple[tuple[str, str], ...]:
        """(device, line) of each ``jax.device_put`` inside the step to a Device other than the
        one it runs on, which jit ignores."""
        return self._device_requests[0]

    def dropped_device_keywords(self) -> tuple[tuple[str, str], ...]:
        """("device=...", line) of each line inside the step that gives a creation such as
        ``jnp.zeros`` a ``device=``, which jit drops (jax-ml/jax#26000)."""
        return self._device_requests[1]

    def unsplit_sharding_puts(self) -> tuple[tuple[str, str], ...]:
        """(the spec, line) of each ``jax.device_put`` inside the step to a NamedSharding that
        splits the value over a mesh of Auto axes, where that value is an output of the step
        and the compiled program returns it whole on every device: jit lowered no sharding for
        it (jax 0.8.0 and 0.10.2; split where its input already was)."""
        jax = devices.start_jax()
        try:
            shardings = jax.tree.leaves(self.executable.output_shardings)
        except Exception:  # an executable that does not say
            return ()
        return tuple((spec, line) for spec, line, n in self._device_requests[2]
                     if n is not None and n < len(shardings)
                     and shardings[n].is_fully_replicated)

    @cached_property
    def _device_requests(self) -> tuple[tuple, tuple, tuple]:
        return jaxpr_sharding.device_keywords_and_puts(self.jaxpr, self.device,
                                               devices.start_jax().Device)

    def runtime_bytes(self) -> int:
        """Memory the CPU runtime takes outside XLA's buffer plan: it copies both operands of a
        weight-gradient convolution (measured, jax 0.10.2: a CNN's step was 15% over the plan
        at batch 256), and a stable sort of several arrays takes a buffer of 16 bytes per array
        per element (two arrays from jax 0.11: a pair per element; :meth:`stable_sorts`). One
        such operation runs at a time, so the largest counts. 0 off the CPU (a GPU's sort: not
        counted, not run on a GPU). What a YNNPACK fusion holds inside itself is not counted
        here (:attr:`fusion_intermediates`: it may be a few MiB or the values whole)."""
        if getattr(self.device, "platform", "") != "cpu":
            return 0
        try:
            convolutions = jaxcompat.weight_gradient_convolutions(self.text or "")
        except Exception:  # text the parser cannot read
            convolutions = []
        return max([*convolutions, *(n for n, *_ in self.stable_sorts())], default=0)

    def stable_sorts(self) -> list[tuple[int, int, int, bool]]:
        """(scratch bytes, arrays sorted together, elements sorted, sorted as pairs) of each
        stable sort of two or more arrays (``jnp.argsort``, ``jnp.lexsort``, a BCOO's
        sum_duplicates) in the CPU program, largest first: XLA:CPU's sort takes 16 B x arrays x
        elements outside XLA's plan, from jax 0.11 a pair per element for two arrays
        (:func:`jaxcompat.stable_sort_scratch`; measured, a stable sort of 2 int32 arrays of
        1,510,441 elements where XLA planned 23.05 MiB peaked at 69.16 MiB on jax 0.8.0, 69.18 on
        0.10.2, 34.76 on 0.11.2). [] off the CPU: a GPU's sort is not counted (not run on a GPU)."""
        if getattr(self.device, "platform", "") != "cpu":
            return []
        try:
            return sorted(jaxcompat.stable_sort_scratch(self.text or ""), reverse=True)
        except Exception:  # text the parser cannot read
            return []


def _uniform(c) -> bool:
    """An array of one repeated value: XLA makes such a constant a broadcast of a scalar, so
    the program holds no copy of it (seen with jax 0.10.2 on CPU: peak_memory_in_bytes)."""
    try:
        flat = np.asarray(c).reshape(-1)
        return flat.size > 1 and bool((flat == flat[0]).all())
    except Exception:  # an array that cannot be read here: count it
        return False


def _const_bytes(c) -> int:
    """A jaxpr constant's bytes. jax 0.8.0 keeps a closed-over NumPy array as a TypedNdArray,
    which has a shape and a dtype but no ``.nbytes`` (jax-ml/jax#16679: it was left out, and
    its bytes in the program were called values XLA folded)."""
    return int(c.nbytes) if hasattr(c, "nbytes") else int(np.asarray(c).nbytes)


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
    for _, consts in jaxpr_walk.walk(closed):
        for c in consts:
            if getattr(c, "shape", None) is not None and id(c) not in seen and not _uniform(c):
                seen[id(c)] = (tuple(c.shape), _const_bytes(c))
    kept = None if text is None else jaxcompat.array_constants(text)
    if kept is None:
        return sum(n for _, n in seen.values()), 0
    # and the values made from them alone, which XLA folds (a closed-over w[i]: its slices)
    closed_shapes = {shape for shape, _ in seen.values()} | jaxpr_walk.closed_over_values(closed)
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
    parents = [(eqn, j) for j, _ in jaxpr_walk.walk(closed) for eqn in getattr(j, "eqns", ())
               if eqn.primitive.name == "scan"]
    scans = [eqn for eqn, _ in parents]
    parent = {id(eqn): j for eqn, j in parents}
    found = {id(eqn): jaxpr_loops.scan_checkpoint(eqn) for eqn in scans}
    recomputed = jaxpr_walk.recomputed_scans(closed)
    derivative = jaxpr_walk.has_derivative(closed)
    # a gradient's forward scan has lost the checkpoint its backward scan of the same line keeps
    remat = {(int(eqn.params["length"]), line): found[id(eqn)] for eqn in scans
             if (line := jaxpr_walk.equation_line(eqn)) and found[id(eqn)][0]}
    out = []
    for eqn in scans:
        carried = jaxcompat.scan_counts(eqn.params)[1]
        ys = [v.aval for v in eqn.outvars[carried:]]
        sizes = [array_bytes(a) for a in ys]
        if sum(sizes) < 2**20:
            continue
        big = ys[sizes.index(max(sizes))]
        if sum(sizes) > room or (
                text is not None and f"[{','.join(map(str, big.shape))}]" not in text):
            continue
        copied = sum(n for n, same in zip(sizes, jaxpr_loops.scan_copied_xs(eqn), strict=True)
                     if same)
        updated = sum(n for n, new in zip(sizes, jaxpr_loops.scan_updated_xs(eqn), strict=True)
                      if new)
        length, line = int(eqn.params["length"]), jaxpr_walk.equation_line(eqn)
        checkpointed, chunked = remat.get((length, line), found[id(eqn)])
        out.append(ScanStack(length, sum(sizes), len(ys), str(big.dtype), tuple(big.shape),
                             line, "recomputed" if id(eqn) in recomputed else
                             # a checkpointed scan JAX split out of an outer checkpoint's
                             # forward pass names no jvp: its stack is residuals too
                             # (or one with no line of the user's: JAX's own, in a jit)
                             "forward" if checkpointed and not jaxpr_walk.scan_role(eqn)
                             and (jaxpr_walk.feeds_backward(eqn, parent[id(eqn)], closed)
                                  or not line and derivative) else
                             jaxpr_walk.scan_role(eqn), carried > 0,
                             copied, jaxpr_loops.scan_carry_bytes(eqn), checkpointed, chunked,
                             jaxpr_derivatives.custom_vjp_rule(eqn), updated))
    return tuple(sorted(out, key=lambda t: -t.nbytes)[:most])


def devices_split_over(leaf: Any) -> int:
    """How many devices an array is split over: 1 where it is whole on one, or on each."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None or sharding.is_fully_replicated:
        return 1
    return len(sharding.device_set)


def _why_not_donated(shape: tuple, dtype: str, nbytes: int, outputs: list[tuple],
                     free: list[tuple], kind: str | None = None) -> str:
    """Why a donated buffer was not reused. JAX pairs a donated argument with an output of the
    same shape and dtype, and of the same memory kind where every argument's and output's kind
    is known; failing that, it offers the buffer to XLA when an output has as many elements,
    and XLA reuses it only when the bytes match too (jax/_src/interpreters/mlir.py,
    _set_up_aliases; measured on jax 0.8.0 and 0.10.2: float32[100] is reused for a
    float32[50, 2] or an int32[100], not a float16[100]). ``outputs`` and ``free`` (those no
    other donated argument took) are (shape, dtype, bytes, memory kind); ``kind`` is the
    argument's memory kind (None: the device's own)."""
    count = math.prod(shape)
    name = f"{dtype}{list(shape)}"
    same = [o for o in outputs if o[:2] == (shape, dtype)]
    if same and not any(o in free for o in same):
        return f"every {name} output is already written into another donated argument"
    if elsewhere := [o for o in free if o[:2] == (shape, dtype) and o[3] != kind]:
        # marin-community/marin#8515: measured on jax 0.10.2's CPU, a pinned_host int32[]
        # state leaf and a device-memory int32[] output
        return (f"the {name} output{'s' if len(elsewhere) > 1 else ''} left "
                f"{'are' if len(elsewhere) > 1 else 'is'} in {elsewhere[0][3]} memory "
                f"and this argument in {kind} memory: JAX pairs a donated buffer only "
                "with an output of its own memory kind (where it knows every argument's and "
                "output's). Return it where it came from "
                f"(out_shardings with memory_kind='{kind}'), or put the argument where "
                f"the output goes (jax.device_put(x, sharding.with_memory_kind("
                f"'{elsewhere[0][3]}')))")
    if same:
        return (f"an {name} output is left, and XLA did not write it into this buffer (its "
                "layout or sharding differs from the argument's)")
    if offered := [o for o in free if math.prod(o[0]) == count and o[2] != nbytes]:
        return (f"JAX offered it to XLA for an output with as many elements "
                f"({offered[0][1]}{list(offered[0][0])}), and XLA did not reuse it: the bytes "
                "differ, and a donated buffer is reused only for an output of the same size")
    if taken := [o for o in outputs if math.prod(o[0]) == count]:
        return (f"the output with as many elements ({taken[0][1]}{list(taken[0][0])}) is "
                "already written into another donated argument")
    return (f"no output is a {name}, nor has its {count:,} elements: JAX donates a buffer only "
            "to an output of the same shape and dtype, or of the same number of elements (then "
            "XLA reuses it where the bytes match); donating it gains nothing: an argument of its "
            "own, leave it out of donate_argnums (a batch, where the state is donated: "
            "jax-ml/jax#9237); a leaf of a donated tree whose other leaves are reused, pass it "
            "as an argument apart")


def memory_kind(leaf: Any) -> str:
    """The memory an array (or a shape with a sharding, or an output) is in, as the notes name
    it: its sharding's memory kind, "device" where it says none (the device's own)."""
    return getattr(getattr(leaf, "sharding", None), "memory_kind", None) or "device"


def _donations(compiled, text: str | None, args, kwargs, donated, kept: list[bool], jax,
               mesh: bool = False) -> tuple[DonatedArgument, ...]:
    """Each donated array leaf, and whether XLA writes an output into it (its alias table).
    Over a mesh, bytes are each device's share, and a buffer not reused is not explained by
    shapes alone (XLA matches the sharding too)."""
    if not donated:
        return ()
    flat, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    alone = _dropped_alone([leaf for _, leaf in flat], kept, jax)
    try:
        aliased = None if text is None else jaxcompat.aliased_parameters(text)
        outputs = [(tuple(o.shape), str(o.dtype), array_bytes(o), memory_kind(o))
                   for o in jax.tree.leaves(compiled.out_info)]
    except Exception:
        aliased, outputs = None, []
    leaves, param = [], 0
    for (path, leaf), used, dropped in zip(flat, kept, alone, strict=True):
        number = param
        param += int(used)
        if path[0].idx != 0 or path[1].idx not in donated or not hasattr(leaf, "shape"):
            continue  # positional arguments only: donate_argnums names positions
        if not used and not dropped:
            continue  # dropped, but the same buffer is donated where the step reads it
        leaves.append((jax.tree_util.keystr(path[1:]).removeprefix("[").replace("]", "", 1),
                       tuple(leaf.shape), str(leaf.dtype),
                       bytes_per_device(leaf) if mesh else array_bytes(leaf), used, number,
                       memory_kind(leaf)))
    free = list(outputs)  # the outputs no reused donation took: its own shape first, then size
    for _, shape, dtype, nbytes, used, number, kind in leaves:
        if used and aliased and number in aliased:
            match = ([o for o in free if o[:2] == (shape, dtype) and
                      o[3] == kind] or
                     [o for o in free if o[:2] == (shape, dtype)] or
                     [o for o in free if math.prod(o[0]) == math.prod(shape) and o[2] == nbytes])
            if match:
                free.remove(match[0])
    out = []
    for where, shape, dtype, nbytes, used, number, kind in leaves:
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
            reused, why = False, _why_not_donated(shape, dtype, nbytes, outputs, free, kind)
        out.append(DonatedArgument(where, shape, dtype, nbytes, reused, why))
    return tuple(out)


def _residency(compiled, args, kwargs, kept: list[bool], dev, jax, mesh: bool = False
               ) -> tuple[int, int]:
    """(bytes of kept arguments already on ``dev``, each buffer once; bytes of dropped ones).
    Over a mesh, an argument counts only where it is placed as the program takes it (its
    shard on ``dev``); one jit must move or split first is not there yet."""
    leaves = jax.tree.leaves((args, kwargs))
    wanted = _input_shardings(compiled, len(leaves), jax) if mesh else None
    resident = dropped = 0
    seen: list = []
    alone = _dropped_alone(leaves, kept, jax)
    for i, (leaf, used) in enumerate(zip(leaves, kept, strict=True)):
        if not hasattr(leaf, "nbytes") or not hasattr(leaf, "shape"):
            continue
        if not used:
            if alone[i]:
                dropped += bytes_per_device(leaf) if mesh else int(leaf.nbytes)
            continue
        if not isinstance(leaf, jax.Array) or leaf.is_deleted() or any(
                _same_buffer(leaf, other) for other in seen):
            continue
        if mesh:
            want = wanted[i] if wanted else None
            if (want is not None and dev in leaf.devices()
                    and same_sharding(leaf.sharding, want, leaf.ndim)):
                seen.append(leaf)
                # its shard's bytes from the sharding: reading ``s.data`` would make JAX cache
                # an Array over each shard, which later counts would meet as a host read's views
                resident += math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
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


def array_bytes(leaf: Any) -> int:
    """An array's or a shape's bytes (a ShapeDtypeStruct has no .nbytes; keys: 8 B)."""
    return int(math.prod(leaf.shape) * leaf.dtype.itemsize)


def same_sharding(a: Any, b: Any, ndim: int) -> bool:
    """Two shardings place an array of ``ndim`` dimensions alike (False where they cannot be
    compared)."""
    try:
        return bool(a.is_equivalent_to(b, ndim))
    except Exception:  # shardings that cannot be compared
        return False


def elements_per_device(leaf: Any) -> int:
    """How many of an array's (or a shape's) elements each device it is split over holds (all
    of them where it is whole on one device, or on each)."""
    sharding = getattr(leaf, "sharding", None)
    try:
        if sharding is not None and len(sharding.device_set) > 1:
            return int(math.prod(sharding.shard_shape(tuple(leaf.shape))))
    except Exception:  # a sharding that cannot say
        pass
    return int(math.prod(leaf.shape))


def bytes_per_device(leaf: Any) -> int:
    """An array's bytes on each device it is split over (all of them where it is whole)."""
    return elements_per_device(leaf) * leaf.dtype.itemsize


def _in_derivative(op: str) -> bool:
    """XLA's op_name ("jit(loss)/transpose(jvp(vmap()))/select_n") puts a derivative around
    the value, and around its vmap if it has one (vmap(jvp()) is a vmap of a derivative: a
    per-example gradient, a Jacobian)."""
    scope = op.rsplit("/", 1)[0]
    found = [i for i in (scope.find("jvp("), scope.find("transpose(")) if i >= 0]
    vmap = scope.find("vmap(")
    return bool(found) and (vmap < 0 or min(found) < vmap)


#: this many of a program's operations from one line of code mean a Python loop was unrolled
UNROLLED_AT = 64


def _jax_dtype(hlo: str) -> str:
    """JAX's name for XLA's element type ("f32" -> "float32", "bf16" -> "bfloat16")."""
    kinds = {"f": "float", "s": "int", "u": "uint", "c": "complex"}
    if hlo in ("pred", "bf16"):
        return {"pred": "bool", "bf16": "bfloat16"}[hlo]
    return kinds[hlo[0]] + hlo[1:] if hlo[0] in kinds and hlo[1:].isdigit() else hlo


#: what a note that advises jax.lax.scan adds where the step takes a derivative
SCAN_UNDER_GRAD = (
    " Under jax.grad, put jax.checkpoint on the scan's body: without it the scan keeps every "
    "iteration's values for the backward pass at once, and XLA's plan can grow where the "
    "unrolled loop's did not (jax-ml/jax#14056 in a miniature on the CPU, 16 layers: 11.00 MiB "
    "of temporaries unrolled, 94.75 with lax.scan, 10.00 with jax.checkpoint on its body; "
    "jax 0.10.2).")


def _unrolled(values: list[dict], leaves: int = 0, jaxpr: Any = None) -> str:
    """:func:`_unrolled_note`, and where it advises jax.lax.scan in a step that takes a
    derivative, :data:`SCAN_UNDER_GRAD`."""
    note = _unrolled_note(values, leaves, jaxpr)
    if "jax.lax.scan" not in note or jaxpr is None:
        return note
    # the note's line is one a backward pass traced (its equations under transpose), not only
    # somewhere in the step: a loop beside a gradient, outside it, needs no checkpoint, nor
    # one only pushed forward (jax.jvp, jax.jacfwd: a forward-mode scan keeps no iteration's
    # values; jax-ml/jax#14447)
    differentiated = {frames.line(*found) for j, _ in jaxpr_walk.walk(jaxpr)
                      for e in getattr(j, "eqns", ())
                      if jaxpr_walk.scan_role(e) == "backward"
                      and (found := jaxpr_walk.user_frame(e))}
    # and not where each iteration takes its own jax.grad, done before the next one starts
    # (araffin/sbx#14: an update per gradient step): the scan then keeps no iteration's values
    return note + SCAN_UNDER_GRAD if any(
        f"({line})" in note
        and jaxpr_loops.backward_passes(jaxpr, line) < jaxpr_loops.OWN_DERIVATIVES_AT
        for line in differentiated) else note


def _unrolled_note(values: list[dict], leaves: int = 0, jaxpr: Any = None) -> str:
    """A note when one line of the user's code made ``UNROLLED_AT`` or more of the program's
    operations: a Python loop inside jit, unrolled (jax-ml/jax#2777), or, where their number
    goes with the ``leaves`` of the arguments (a pytree of many arrays), one operation per
    array (jax-ml/jax#4667); "" otherwise. Read from the ``jaxpr`` where it is given: a line
    whose operations JAX's own loop code made (``jax.lax.associative_scan``'s recursion, no
    Python loop: radarFudan/mamba-minimal-jax#1) is left out, and a loop whose copies XLA fused
    below ``UNROLLED_AT`` operations is named by its equations (jax-ml/jax#891: 50 lookups,
    51 operations, 16.6 s of compiling on jax 0.10.2 against 0.68 s for one gather)."""
    lines = jaxpr_loops.line_repeats(jaxpr) if jaxpr is not None else {}
    counts = Counter(v["source"] for v in values if v["source"])
    for source, n in counts.most_common():
        if n < UNROLLED_AT:
            break
        made = lines.get(tuple(source))
        if made is not None and made[1] > made[0]:
            continue  # JAX's own loop code made most of this line's equations
        head = (f"{n} of the compiled program's {len(values)} operations come from one line "
                f"({frames.line(*source)})")
        if leaves >= UNROLLED_AT // 2 and leaves // 2 <= n <= 8 * leaves:
            return (f"{head}, about as many as the {leaves} arrays of the arguments: code that "
                    "runs once per array or per layer (jax.tree.map, a loop over "
                    "jax.tree.leaves, a Python loop over layers) is unrolled into the program, "
                    "so the program and its compile time grow with the number of arrays. "
                    "Fewer, larger arrays compile faster: stack alike layers into one array "
                    "(and run them with jax.lax.scan), or flatten the tree "
                    "(jax.flatten_util.ravel_pytree).")
        sliced = jaxpr_loops.sliced_lines(jaxpr) if jaxpr is not None else set()
        kind = jaxpr_loops.loop_kind(jaxpr, tuple(source), made[2], sliced) if made else ""
        if kind == "scalars":  # a list of Python numbers, one argument each: no loop
            return (f"{head}, one of them {made[2]} times over: "
                    + jaxpr_loops.SCALARS_FIX.format(jaxpr_loops.scalar_inputs(jaxpr)))
        # shapes differ between copies: fewer alike than the loop's iterations (an equation
        # made twice per iteration from one stack recurs twice as often: jax 0.8.0's
        # log_softmax in HomebrewML/Olmax#25's loop of 8)
        runs = jaxpr_loops.line_runs(jaxpr).get(tuple(source), 0) if jaxpr is not None else 0
        if made and made[2] >= jaxpr_loops.LOOP_REPEATS > made[5] and made[5] < (
                runs or made[2]):
            return (f"{head}, one of them {made[2]} times over, its operand shapes "
                    f"changing between iterations (at most {made[5]} alike): "
                    f"{_UNROLLED_CAUSE}; "
                    + (jaxpr_loops.SLICED_LOOP_FIX if kind == "sliced"
                       else jaxpr_loops.UNALIKE_LOOP_FIX))
        outer = jaxpr_loops.calling_loop(jaxpr, tuple(source)) if jaxpr is not None else None
        # a loop around the call of the line's function: its count divides the line's repeats,
        # and is fewer (as many, and the loop may as well be the line's own)
        if outer is not None and outer[0] != tuple(source) and made and outer[1] < made[2]:
            return (f"{head}, in a function called {outer[1]} times from "
                    f"{frames.line(*outer[0])}: {_UNROLLED_CAUSE}, and the loop around that "
                    f"call is unrolled too, {outer[1]} copies of everything the call makes. "
                    "jax.lax.scan over that outer loop (or jax.lax.fori_loop) compiles the call "
                    f"once, {outer[1]} times fewer operations; the inner loop can be a scan too.")
        elsewhere = [key for key, other in lines.items() if other[2] >= jaxpr_loops.LOOP_REPEATS
                     and jaxpr_loops.loop_kind(jaxpr, key, other[2], sliced) == "sliced"]
        if elsewhere:  # another line of the loop slices by its index (jax 0.12: jax#2242)
            return (f"{head}: {_UNROLLED_CAUSE}; at {frames.line(*elsewhere[0])} "
                    + jaxpr_loops.SLICED_LOOP_FIX)
        return f"{head}: {_UNROLLED_FIX}" + (jaxpr_loops.LOOKUPS_FIX if made and made[4] else "") \
            + jaxpr_loops.PARTIAL_UNROLL
    found = jaxpr_loops.unrolled_line(jaxpr, UNROLLED_AT) if jaxpr is not None else None
    if found is None:
        return ""
    source, n, total, repeats, gathers, alike, kind, scalars = found
    # as alike as the loop ran: a loop of 8 whose copies are all alike (HomebrewML/Olmax#25's
    # chunks on jax 0.8.0) is no loop over shapes of their own
    runs = jaxpr_loops.line_runs(jaxpr).get(tuple(source), 0)
    alike = max(alike, jaxpr_loops.LOOP_REPEATS) if runs and alike >= runs else alike
    fix = (jaxpr_loops.SCALARS_FIX.format(scalars) if kind == "scalars" else
           _UNROLLED_FIX + (jaxpr_loops.LOOKUPS_FIX if gathers else "") + jaxpr_loops.PARTIAL_UNROLL
           if alike >= jaxpr_loops.LOOP_REPEATS else
           f"{_UNROLLED_CAUSE}; "
           + (jaxpr_loops.SLICED_LOOP_FIX if kind == "sliced" else jaxpr_loops.UNALIKE_LOOP_FIX))
    shapes = ("" if alike >= jaxpr_loops.LOOP_REPEATS or kind == "scalars" else
              f", its operand shapes changing between iterations (at most {alike} alike)")
    kept = counts.get(source, 0)
    fused = (f"though XLA fused them into {kept} of its {len(values)} operations" if kept else
             f"though XLA fused them into operations of other lines (none of its "
             f"{len(values)} is named after this one)")
    return (f"{n:,} of the step's {total:,} jaxpr equations come from one line "
            f"({frames.line(*source)}), one of them {repeats} times over{shapes}, {fused}: "
            f"{fix}")


#: the cause and the fix of a loop unrolled inside jit (jax-ml/jax#2777)
_UNROLLED_CAUSE = ("a Python loop inside the jitted function is unrolled, one copy of its body "
                   "per iteration, so the program and its compile time grow with the loop")
_UNROLLED_FIX = (f"{_UNROLLED_CAUSE}; jax.lax.fori_loop or jax.lax.scan compile the body "
                 "once.")
