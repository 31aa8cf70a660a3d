"""What a step's arguments cost, read from the step compiled for them
(:func:`helpers.compiled.compile_step`) and from the arguments themselves: each argument's
bytes, the subtrees of one argument with another's shapes (an optimizer state's copies of the
parameters), arguments worth donating, arrays kept in a pytree's static part, arguments read
only through a cast to a narrower float, and arguments split over devices. Each finding comes
with the note that names its cause and fix; :func:`helpers.preflight.preflight_step` keeps the
findings in its record and the notes in its advice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers import compiled, devices
from helpers._internal import jaxcompat
from helpers._internal.records import Record
from helpers.units import format_bytes

__all__ = ["NarrowedArgument", "StateCopy", "argument_root", "argument_split", "copied_to_update",
           "copies_note",
           "donated_host_note", "donation_drop", "donation_note", "donation_pays",
           "donation_would_save",
           "donations_across_memory_kinds", "host_memory_leaves", "narrowed_arguments",
           "narrowed_notes", "numbers_argument", "passed_again", "PYTHON_NUMBERS",
           "spread_arguments", "state_copies",
           "static_array_note", "static_arrays", "wrapper_donation_note",
           "wrapper_donations"]


@dataclass(frozen=True)
class StateCopy(Record):
    """A subtree of one argument with another argument's shapes: state kept between steps (an
    optimizer's moments, a gradient accumulator), as large again as what it copies."""

    holder: str  # the argument that holds it, as fn names it, e.g. "opt_state"
    path: str  # where in it, as jax.tree_util.keystr writes it, e.g. "[0].mu"
    of: str  # the argument whose shapes it has, e.g. "params"
    nbytes: int
    of_nbytes: int  # the bytes of the argument it copies
    of_elements: int = 0  # the numbers in it: the parameters, where ``of`` is the model's
    #: of ``nbytes``, those of leaves whole on each of several devices (replicated as the
    #: parameters they copy may be: google/flax#5172)
    replicated_bytes: int = 0


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


def spread_arguments(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
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


def donation_would_save(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                         ) -> tuple[list[str], int] | None:
    """(the arguments worth donating, the output bytes they could take) when an undonated
    top-level argument has outputs of its leaves' shapes and dtypes for at least half its bytes
    and 1 MiB; None otherwise. An argument with a leaf in host memory (pinned_host) is never
    advised (:func:`donations_across_memory_kinds`), nor one with a buffer the step takes in
    another place too (donated, the call fails). Outputs are matched once each, largest
    arguments first. Over a mesh XLA matches the sharding too (an output of another layout
    takes nothing), and bytes are each device's. Outputs XLA already writes into donated
    arguments are taken (google-deepmind/optax#320)."""
    jax = devices.start_jax()
    made = c.outputs()
    # an output in pinned_host takes only a donated buffer in pinned_host, and one in device
    # memory only one there (JAX pairs them by memory kind where it knows them all)
    outputs = [(tuple(o.shape), str(o.dtype), compiled.memory_kind(o)) for _, o, _ in made]
    try:
        out_shardings = (jax.tree.leaves(c.executable.output_shardings) if c.over_mesh
                         else [None] * len(outputs))
    except Exception:
        return None
    arrays = _donatable_leaves(c, fn, args, kwargs, jax)
    if not outputs or arrays is None or len(out_shardings) != len(outputs):
        return None
    names = dict(c.argument_names(fn, args, kwargs))
    shared = {name for name, _, _, _ in _shared_leaves(c, fn, args, kwargs)}
    # a gradient has its parameter's shape, and is no new value of it: donating the parameters
    # to a step that only returns gradients would lose them (only an update replaces them)
    # an output that is a new value of some argument is that argument's alone to take: the
    # parameters of an accumulation step, acc + grad(loss)(p, x), are no old value of it, and
    # donated they would be lost to the caller, who still needs them (only acc is replaced)
    updates = c.updated_arguments(fn, args, kwargs) or [frozenset()] * len(outputs)
    free = [(o, s, owners) for o, s, (_, _, kind), owners
            in zip(outputs, out_shardings, made, updates, strict=True)
            if not kind.endswith("gradient")]
    # an output XLA already writes into a donated argument (its alias table) is taken: a batch
    # with a weight's shape is no old value of it (google-deepmind/optax#320: donated too, JAX
    # warns "Some donated buffers were not usable" and the peak stays 17,825,944 B)
    for d in c.donations:
        hit = next((f for f in free if d.reused and f[0][:2] == (d.shape, d.dtype)), None)
        if hit is not None:
            free.remove(hit)
    chosen, saving = [], 0
    for i, leaves in sorted(arrays.items(), key=lambda kv: -sum(n for _, n, _ in kv[1])):
        if any(key[2] != "device" for key, _, _ in leaves):
            # a state offloaded to host memory: donating it frees no device memory, and where
            # JAX does not know every argument's and output's memory kind it pairs the buffer
            # with a device output, which aborts jax 0.10.2 (marin-community/marin#8515)
            continue
        if names[i] in shared:
            # its buffer is passed again (as another argument, or twice in its tree): donated,
            # the call fails, "Attempt to use a buffer that was previously donated in the same
            # call" (jax-ml/jax#13956's h(x, x, x, x))
            continue
        total = sum(n for _, n, _ in leaves)
        matched, took = 0, []
        for key, nbytes, sharding in leaves:
            fits = [f for f in free if f[0] == key and (
                sharding is None or compiled.same_sharding(f[1], sharding, len(key[0])))]
            # its own new values first (those of it alone before those of several), then
            # values made anew; never another argument's
            hit = min((f for f in fits if names[i] in f[2]), key=lambda f: len(f[2]),
                      default=next((f for f in fits if not f[2]), None))
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


def donation_drop(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
                  names: list[str], device: Any = None) -> int | None:
    """How much lower XLA's planned peak is with ``names`` donated as well
    (:func:`donation_would_save`'s answer), from the kit's own compile of the step so donated
    (:func:`helpers.compiled.compile_step`); None where the kit cannot compile it so (another
    library's own jit, google/flax#5026; a wrapper lowered with the arguments themselves).
    Outputs of the shape of an argument do not always let its buffer go: a decomposition's
    LAPACK call overwrites its input, so XLA copies an argument it may not destroy
    (jax-ml/jax#9755's thin svd of 100000 x 50: U written into the donated input, peak 57.24 ->
    57.24 MiB, measured 58.64 -> 57.32 MiB on the CPU, jax 0.10.2). The cost: one more compile
    of the step, paid only where the donation note would be given."""
    if c.own_jit or c.lowered_with_arguments:
        return None
    jax = devices.start_jax()
    where = [i for i, name in c.argument_names(fn, args, kwargs)
             if isinstance(i, int) and name in names]

    def as_shape(leaf: Any) -> Any:  # a NumPy leaf, donated, is priced as the buffer it becomes
        return (leaf if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct))
                else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))

    shaped = tuple(jax.tree.map(as_shape, a) if i in where else a for i, a in enumerate(args))
    try:
        donated = compiled.compile_step(
            fn, *shaped, device=device, donate_argnums=tuple(sorted({*c.donated, *where})),
            static_argnums=c.static_argnums, static_argnames=c.static_argnames, **kwargs)
        return c.sizes()["peak"] - donated.sizes()["peak"]
    except Exception:  # a step the kit cannot compile with that donation: say what it would
        return None


#: equinox.filter_jit's donations, each with what it keeps undonated, in the order advised
_EQX_DONATIONS = (("all-except-first", "every argument but the first, which stays readable after "
                   "the call"),
                  ("all", "every argument"))


def wrapper_donations(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
                      device: Any = None) -> tuple[tuple[str, str, int], ...]:
    """For a step that is ``equinox.filter_jit`` of a function, declared with no donation (its
    default): each donation it takes, what that donates, and how much lower XLA's planned peak
    is with it, from the kit's compile of ``filter_jit(function, donate=...)`` for ``device``
    (the wrapper's other jit arguments are not carried over). The kit cannot add a donation to
    such a wrapper, nor see its split of the arguments (``c.lowered_with_arguments``), so it
    asks the wrapper itself (goodfire-ai/spd#971: an Adam step of an eqx.nn.MLP, 12.16 MiB
    planned, 9.71 with 'all-except-first', 7.70 with 'all', jax 0.10.2 CPU, equinox 0.13.8).
    'all' is compiled first; where it does not pay, neither can the narrower one, which is then
    not compiled. Empty for any other step, or where nothing drops."""
    if not (c.lowered_with_arguments and type(fn).__module__.startswith("equinox")
            and getattr(fn, "donate_first", None) is False
            and getattr(fn, "donate_rest", None) is False
            and callable(getattr(fn, "__wrapped__", None))):
        return ()
    try:
        import equinox
        out, sizes = [], c.sizes()
        for mode, what in reversed(_EQX_DONATIONS):  # 'all' first
            donated = compiled.compile_step(
                equinox.filter_jit(fn.__wrapped__, donate=mode), *args, device=device, **kwargs)
            if not donation_pays(drop := sizes["peak"] - donated.sizes()["peak"],
                                 sizes["output"]):
                break
            out.insert(0, (mode, what, drop))
        return tuple(out)
    except Exception:  # a wrapper the kit cannot compile so: say nothing it did not measure
        return ()


def wrapper_donation_note(found: tuple[tuple[str, str, int], ...], function: str) -> str:
    """The note for :func:`wrapper_donations`' answer: the cause (equinox.filter_jit donates
    nothing unless asked), each donation that lowers the peak, and what it costs."""
    each = "; ".join(f"donate={mode!r}, {what}: {format_bytes(drop)} less"
                     for mode, what, drop in found)
    return (f"Nothing donated: {function} is an equinox.filter_jit, which donates no argument "
            "unless asked, so the old arguments stay alive beside the outputs that replace them "
            f"at the peak. Declare it on the wrapper, eqx.filter_jit({function}, donate=...): "
            f"{each} at the peak, as XLA plans the step compiled so (goodfire-ai/spd#971). A "
            "donated array is deleted by the call: pass only values you rebind to the step's "
            "results, not arrays another object still holds.")


def donation_pays(drop: int, saving: int) -> bool:
    """Whether XLA's planned peak drops enough with the donation (``drop``, from
    :func:`donation_drop`) to call it a saving: 1 MiB, or half of what the outputs could take
    (``saving``: a 1 MiB state whose plan drops by 1016 KiB saves nearly all of it)."""
    return drop >= min(2**20, saving // 2) and drop > 0


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
            ((tuple(x.shape), str(x.dtype), compiled.memory_kind(x)),
             compiled.array_bytes(x) if s is None else
             math.prod(s.shard_shape(tuple(x.shape))) * x.dtype.itemsize, s)
            for x, s in zip(leaves, mine, strict=True)
            if hasattr(x, "shape") and hasattr(x, "dtype") and (wanted is None or s is not None)]
    return out


def _buffer(leaf: Any, jax) -> Any:
    """What names a jax.Array's buffer: its devices and address where it has one buffer, else
    the array itself; None for what is no jax.Array (a NumPy array or a shape is placed anew,
    or allocated, for each place it is passed)."""
    if not isinstance(leaf, jax.Array):
        return None
    try:
        if len(leaf.devices()) != 1:  # a sharded array's pointer makes JAX cache shard Arrays
            return ("array", id(leaf))
        return (tuple(leaf.devices()), leaf.unsafe_buffer_pointer())
    except Exception:  # split over devices, or deleted
        return ("array", id(leaf))


def _taken_leaves(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                  ) -> list[tuple[str, str, Any, bool]]:
    """(the argument's name, the path in it, the leaf, whether the executable takes it: jit
    drops one the step never reads) for each leaf of the dynamic arguments, in the order the
    executable takes them (each taken one is the next parameter of its program)."""
    jax = devices.start_jax()
    names = c.leaf_names(fn, args, kwargs)
    flat = jax.tree_util.tree_flatten_with_path(c.dynamic(args, kwargs))[0]
    shardings = c.input_shardings(args, kwargs)  # None for a leaf it drops
    return [(*names(path), leaf, shardings is None or shardings[k] is not None)
            for k, (path, leaf) in enumerate(flat)]


def _shared_leaves(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                   ) -> list[tuple[str, str, Any, str]]:
    """(argument, path, leaf, the place that took the buffer first) of each leaf the
    executable takes that is a buffer it takes in an earlier place too: the same array passed
    as several arguments (jax-ml/jax#13956's h(x, x, x, x)), or twice in one tree (a module and
    its nnx.clone, google/flax#5461); and each such first place, with "" for it."""
    jax = devices.start_jax()
    leaves = [(name, path, leaf) for name, path, leaf, taken
              in _taken_leaves(c, fn, args, kwargs) if taken]
    first: dict[Any, str] = {}
    for name, path, leaf in leaves:
        if (key := _buffer(leaf, jax)) is not None:
            first.setdefault(key, name + path)
    again = [(name, path, leaf, first[key]) for name, path, leaf in leaves
             if (key := _buffer(leaf, jax)) is not None and first[key] != name + path]
    firsts = {place for *_, place in again}
    return [*((name, path, leaf, "") for name, path, leaf in leaves if name + path in firsts),
            *again]


def passed_again(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
                 per_device: bool = False) -> int:
    """The bytes of the leaves the executable takes that are a buffer it takes in an earlier
    place too (one array passed as several arguments): XLA's argument size counts the buffer
    once per place (jax 0.8.0 and 0.10.2: h(x, x, x, x) of a 3.81 MiB x, 15.26 MiB), the
    device holds it once (jax-ml/jax#13956: the call adds 3.84 MiB, measured). ``per_device``:
    an array split over devices counts one device's piece, as :func:`argument_split`."""
    nbytes = compiled.bytes_per_device if per_device else compiled.array_bytes
    return sum(nbytes(leaf) for _, _, leaf, place in _shared_leaves(c, fn, args, kwargs)
               if place)


def copied_to_update(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                     ) -> tuple[tuple[str, int], ...]:
    """(the argument and the path in it, bytes) of each argument leaf the step copies whole only
    to write a slice into the copy (``x.at[i].set(v)``, ``lax.dynamic_update_slice``, a
    scatter: :meth:`helpers.compiled.CompiledStep.updated_copies`): not donated, the buffer
    must stay as it was, so every call copies all of it (jax-ml/jax#9132). Largest first; ()
    where the executable takes a wrapper's split of the arguments."""
    if c.lowered_with_arguments:
        return ()
    taken = [(name + path, leaf) for name, path, leaf, used in _taken_leaves(c, fn, args, kwargs)
             if used]
    out = [(taken[number][0], nbytes) for number, nbytes in c.updated_copies()
           if number < len(taken)]
    return tuple(sorted(out, key=lambda x: -x[1]))


def host_memory_leaves(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                       ) -> tuple[tuple[str, str], ...]:
    """(the argument and the path in it, its memory kind) of each array leaf of the step's
    arguments kept outside the device's own memory (an optimizer state offloaded to
    ``pinned_host``, marin-community/marin#8515), largest first."""
    jax = devices.start_jax()
    found = [(compiled.array_bytes(leaf), name + jax.tree_util.keystr(path),
              compiled.memory_kind(leaf))
             for name, value in c.arguments(fn, args, kwargs)
             for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
             if hasattr(leaf, "shape") and compiled.memory_kind(leaf) != "device"]
    return tuple((where, kind) for _, where, kind in sorted(found, key=lambda f: -f[0]))


def donations_across_memory_kinds(c: compiled.CompiledStep, fn: Callable, args: tuple,
                                  kwargs: dict) -> tuple[tuple[str, str, str, str], ...]:
    """(donated leaf, its memory kind, the output JAX writes into it, that output's memory kind)
    for each donated buffer the call as written pairs with an output in another memory.
    JAX pairs donations by memory kind only where it knows every argument's and output's
    (jax/_src/interpreters/mlir.py, _set_up_aliases): an argument not committed to a device,
    or an output whose memory kind nothing fixes (no out_shardings), makes it pair a
    pinned_host state with a device-memory output of its shape, and jax 0.10.2 then aborts the
    process at the call (marin-community/marin#8515). Read from the call lowered with the
    arguments themselves (nothing copied or run); () where it cannot be lowered so."""
    jax = devices.start_jax()
    host = [where for where, _ in host_memory_leaves(c, fn, args, kwargs)]  # largest first
    if not c.donated or not host:
        return ()
    lowered = _lowered_as_called(c, fn, args, kwargs, jax)
    try:
        text = lowered.as_text() if lowered is not None else ""
    except Exception:
        return ()
    pairs, arguments = jaxcompat.lowered_aliases(text)
    leaves = [name + jax.tree_util.keystr(path)
              for name, value in c.arguments(fn, args, kwargs)
              for path, _ in jax.tree_util.tree_flatten_with_path(value)[0]]
    found = []
    for i, kind_in, out, kind_out in pairs:
        if kind_in != kind_out:
            name = leaves[i] if len(leaves) == arguments else f"argument leaf {i}"
            found.append((name, kind_in, out, kind_out))
    return tuple(sorted(found, key=lambda f: host.index(f[0]) if f[0] in host else len(host)))


def _lowered_as_called(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
                       jax) -> Any:
    """The step lowered as the call would lower it (the arguments themselves: committed or
    not, in their memory kinds), with the donation preflight_step compiled; None where it
    cannot be."""
    if hasattr(fn, "lower"):  # the user's own jit, with its own out_shardings
        try:
            lowered = fn.lower(*args, **kwargs)
            donated = {i for i, a in enumerate(lowered.args_info[0])
                       if any(getattr(x, "donated", False) for x in jax.tree.leaves(a))}
            if donated == set(c.donated):
                return lowered
        except Exception:
            pass
    try:
        return jax.jit(fn, donate_argnums=c.donated, static_argnums=c.static_argnums,
                       static_argnames=c.static_argnames).lower(*args, **kwargs)
    except Exception:
        return None


def donated_host_note(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                      ) -> str | None:
    """The note for a step whose donation, called as written, pairs a buffer in one memory
    kind with an output in another (:func:`donations_across_memory_kinds`): the call that
    aborts jax 0.10.2 (measured on the CPU; 0.8.0 ran it). None otherwise."""
    pairs = donations_across_memory_kinds(c, fn, args, kwargs)
    if not pairs or jaxcompat.jax_version_tuple() < (0, 10):
        return None
    leaf, kind_in, out, kind_out = pairs[0]
    more = f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else ""
    return (f"Called as written, this step gives donated {leaf} ({kind_in}){more} to {out}, "
            f"which is in {kind_out} memory: JAX pairs donations by memory kind only where it "
            "knows every argument's and output's, and jax 0.10.2 then aborts the whole process "
            "at the call (SIGABRT: \"PjRtBuffer's memory kind does not match sharding's memory "
            "kind\"; measured on the CPU, not yet run on a GPU), marin-community/marin#8515. "
            "Commit every argument (jax.device_put(x, sharding)) and give every output its "
            "memory kind (out_shardings, the state's with memory_kind='pinned_host'), or "
            "donate nothing in host memory.")


def static_arrays(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                   ) -> tuple[tuple[str, str, str], ...]:
    """(argument, node type, "float32[3] (12 B)") of each array of more than one element that
    an argument's pytree keeps in its metadata (equinox#746: a JAX array in a static field)."""
    return tuple((name, node, f"{a.dtype}{list(a.shape)} ({format_bytes(compiled.array_bytes(a))})")
                 for name, value in c.arguments(fn, args, kwargs)
                 for node, a in compiled.metadata_arrays(value))


def narrowed_arguments(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                        ) -> tuple[NarrowedArgument, ...]:
    """Each array argument the step reads only through a narrower cast, largest first; not one
    with an output of its shape and dtype (a gradient or an updated copy: master weights kept
    at full width on purpose)."""
    made = c.outputs()
    if not made:  # an executable that does not say: no way to tell master weights apart
        return ()
    outputs = {(tuple(o.shape), str(o.dtype)) for _, o, _ in made}
    names = c.leaf_names(fn, args, kwargs)
    out = []
    for path, leaf, to, line in c.narrowed_inputs(args, kwargs):
        if (tuple(leaf.shape), str(leaf.dtype)) in outputs or not hasattr(leaf, "dtype"):
            continue
        out.append(NarrowedArgument("".join(names(path)), str(leaf.dtype),
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
    root = argument_root(n.argument)
    if _DATA_NAME.match(root):
        return True
    if _PARAMS_NAME.search(root):
        return False
    return n.argument == root


def argument_root(argument: str) -> str:
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
    root = argument_root(first.argument)
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


#: the leaves jit takes as Python numbers: each a scalar argument of its own (jax-ml/jax#5684)
PYTHON_NUMBERS = (bool, int, float, complex)


def numbers_argument(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
                     ) -> tuple[str, int] | None:
    """(its name, how many) of the argument that holds the most Python numbers as leaves (a
    list of ints passed to jit: each a scalar argument of its own, jax-ml/jax#5684); None where
    none holds any."""
    jax = devices.start_jax()
    count, name = max(((sum(isinstance(leaf, PYTHON_NUMBERS) for leaf in jax.tree.leaves(v)),
                        name) for name, v in c.arguments(fn, args, kwargs)), default=(0, ""))
    return (name, count) if count else None


def argument_split(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
                   per_device: bool = False) -> tuple[tuple[str, int], ...]:
    """Each top-level argument's array bytes (each buffer once), named as ``fn`` names its
    parameters ("args[2]" for ``*args``), largest first; static arguments are left out.
    ``per_device``: an array split over devices counts one device's piece, as XLA's argument
    size does when it prices one device's share (it added up to more than that size)."""
    jax = devices.start_jax()
    seen: dict[Any, str] = {}  # a buffer -> the argument it was counted under
    out = []
    for name, value in c.arguments(fn, args, kwargs):
        total, elsewhere, numbers = 0, [], 0
        for leaf in jax.tree.leaves(value):
            if isinstance(leaf, PYTHON_NUMBERS):  # an argument of its own, a scalar of JAX's
                numbers += 1  # default type (jax-ml/jax#5684)
                total += jax.dtypes.canonicalize_dtype(np.asarray(leaf).dtype).itemsize
                continue
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                continue
            if (key := _buffer(leaf, jax)) in seen:
                elsewhere.append(seen[key])
                continue
            if key is not None:  # (a shape passed twice is two arrays)
                seen[key] = name
            if isinstance(leaf, np.ndarray):  # JAX makes a float64 one float32 (x64 off), as
                # XLA's argument size counts it (the rows added up to more than the total)
                total += int(math.prod(leaf.shape)) * np.dtype(
                    jax.dtypes.canonicalize_dtype(leaf.dtype)).itemsize
                continue
            total += (compiled.bytes_per_device(leaf) if per_device
                      else compiled.array_bytes(leaf))
        if elsewhere and not total:  # passed twice: XLA's argument size counts it twice
            name = f"{name} (the same arrays as {', '.join(dict.fromkeys(elsewhere))})"
        if numbers > 1:
            name = f"{name} ({numbers} Python numbers, a scalar argument each)"
        out.append((name, total))
    return tuple(sorted(out, key=lambda kv: -kv[1]))


def state_copies(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict,
                 per_device: bool = False) -> tuple[StateCopy, ...]:
    """Each subtree of an argument that has the structure, keys and shapes of another argument,
    or of another field of the same argument (a Flax TrainState holds ``params`` and
    ``opt_state``): an Adam state's ``mu`` and ``nu`` beside the parameters. Only for a tree of
    two arrays or more and at least 1 MiB (a single array's shape can recur by chance); a tree
    that is a copy as a whole (the gradients beside the parameters) is not one, and of two
    trees alike only the first is looked for."""
    jax = devices.start_jax()
    nbytes = compiled.bytes_per_device if per_device else compiled.array_bytes
    count = compiled.elements_per_device if per_device else (lambda x: math.prod(x.shape))
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
        size = sum(nbytes(x) for _, x in like)
        elements = sum(count(x) for _, x in like)
        if len(like) < 2 or want in looked_for or size < 2**20:
            continue
        looked_for.add(want)
        for holder, held in arrays.items():
            if holder == of_arg and key is None:
                continue
            for path, held_bytes in _subtrees_like(held, list(want), nbytes):
                # within one argument, only deeper than a field (TrainState.opt_state.mu): a
                # field beside it with its shapes is a sibling (two identical layers); and a
                # part of a copy already found (mu['l1'] of params['l1']) is no new one
                if (holder == of_arg and len(path) < 2) or any(
                        h == holder and path[:len(q)] == q for h, q in found):
                    continue
                found.append((holder, path))
                replicated = sum(nbytes(x) for p, x in held if p[:len(path)] == path
                                 and compiled.devices_split_over(x) == 1
                                 and len(getattr(getattr(x, "sharding", None), "device_set",
                                                 ())) > 1)
                out.append(StateCopy(holder, "".join(path), of, held_bytes, size, elements,
                                     replicated))
    return tuple(out)


def _subtrees_like(leaves: list[tuple[tuple[str, ...], Any]], want: list[tuple],
                   nbytes: Callable[[Any], int] = compiled.array_bytes
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
            found.append((idx[0], prefix, sum(nbytes(leaves[i][1]) for i in idx)))
    return [(path, nbytes) for _, path, nbytes in sorted(found)]


def copies_note(copies: tuple[StateCopy, ...], split: tuple[str, ...] = (),
                peak: int = 0) -> str:
    """One sentence per argument that holds copies of another: how many, where, and how to
    shrink them (``split``: the arguments already split over devices, whose bytes are one
    device's share: sharding is no news to them); and the bytes per parameter, kept between
    steps and (``peak``, the step's) at the step's peak, the figure a model's size is
    multiplied by (AI-Hypercomputer/maxtext#606: "20 bytes per parameter with Adam", answered
    "12": float32 parameters and two moments). Where a copy is optax.MultiSteps' ``acc_grads``,
    that MultiSteps accumulates over calls and splits no batch (google-deepmind/optax#320)."""
    out = []
    for holder, of in dict.fromkeys((c.holder, c.of) for c in copies):
        mine = [c for c in copies if (c.holder, c.of) == (holder, of)]
        total = sum(c.nbytes for c in mine)
        where = ", ".join(f"{holder}{c.path}" for c in mine)
        n, whose = len(mine), of + ("'" if of.endswith("s") else "'s")
        per = ""
        if (numbers := mine[0].of_elements) > 0:
            own, kept = mine[0].of_nbytes / numbers, (mine[0].of_nbytes + total) / numbers
            per = (f" Kept from step to step: {kept:.3g} bytes per parameter (per number in "
                   f"{of}: {own:.3g} for {of}, {total / numbers:.3g} for these copies)" + (
                       f", {peak / numbers:.3g} at this step's peak (with its batch, gradients "
                       "and activations)" if peak else "") + f"; N parameters need N x "
                   f"{kept:.3g} bytes before a step runs.")
        if any("acc_grads" in c.path for c in mine):  # optax.MultiSteps' accumulator
            per += (" optax.MultiSteps adds up the gradients of k calls of the step in its "
                    "acc_grads; it does not split the batch a call is given, so a call given k "
                    "times the batch holds k times the activations: give each call one "
                    "microbatch, the batch you want divided by k (google-deepmind/optax#320).")
        out.append(
            f"{holder} holds {n} {'copy' if n == 1 else 'copies'} of {whose} shapes ({where}: "
            f"{format_bytes(total)}, {total / mine[0].of_nbytes:.2f}x {of}): state kept from "
            "step to step, such as an optimizer's moments or a gradient accumulator, each as "
            f"many numbers as {of}. To shrink it: a smaller dtype where the optimizer "
            "takes one (optax.adam's mu_dtype, optax.MultiSteps' accumulator_dtype), an "
            "optimizer that keeps less (optax.adafactor factors its second moment; optax.sgd "
            "without momentum keeps none)" + _sharded_or_not(mine, holder in split, of) + per)
    return " ".join(out)


def _sharded_or_not(mine: list[StateCopy], split: bool, of: str) -> str:
    """The end of the copies' sentence: shard the state, or it is split already; where the
    argument is split but most of these copies are whole on every device (the moments of
    parameters replicated on purpose, google/flax#5172), that they can be split all the same."""
    total, whole = sum(c.nbytes for c in mine), sum(c.replicated_bytes for c in mine)
    if not split:
        return ", or the state sharded over devices."
    if 2 * whole < total:
        return " (these are one device's bytes: it is split over devices already)."
    return (f" (one device's bytes, of which {format_bytes(whole)} are whole on every device, "
            f"as the parts of {of} they copy are: the state need not follow {of}'s sharding. "
            "Put these copies split over the devices, a NamedSharding of their own (flax's "
            "nnx.Optimizer has opt_sharding for it, google/flax#5172), and give the step "
            "out_shardings that keep each output's: without them XLA chooses, and may hand the "
            "replicated parameters back split).")


def donation_note(names: list[str], saving: int,
                  copied: tuple[tuple[str, int], ...] = (), own_jit: str = "",
                  drop: int | None = None, on_cpu: bool = False, target: str = "") -> str:
    """The note for undonated arguments whose new values the step returns
    (:func:`donation_would_save`'s answer): the bytes and the fix; and, where the step copies
    one of them whole only to write a slice into it (:func:`copied_to_update`), the time that
    copy costs on every call (jax-ml/jax#9132, measured by the helper on the CPU, jax 0.10.2: a
    32 MiB KV cache written one token per call, 26.6 ms a token, 0.067 ms donated). For a
    step that is another library's own jit (``own_jit``: ``flax`` for nnx.jit), the donation
    is declared on that wrapper: the kit refuses to add one around it (google/flax#5026).
    ``drop``: how much lower the peak is with the donation, from the kit's compile of it
    (:func:`donation_drop`); None where the kit could not compile it. Under 1 MiB the note says
    the plan does not drop (``on_cpu``: planned for the CPU, whose plan copies where a GPU's
    may not: google/flax#4848's SGD step, 16.75 -> 16.50 MiB planned, measured 16.8 -> 16.9)."""
    how, plan = (("donate_argnums or donate_argnames; nnx.jit takes them too",
                  "preflight_step with the donation shows its plan") if not own_jit else
                 ("declared on the wrapper itself: nnx.jit(step, donate_argnums=...)",
                  "preflight_step on the step so declared shows its plan; the kit adds no "
                  "donation around another library's jit, google/flax#5026"))
    note = (f"Nothing donated for {', '.join(names)}, yet {format_bytes(saving)} of "
            "the outputs have their shapes and dtypes: the old values stay alive "
            f"beside the new. Donating {' and '.join(names)} ({how}), if you do not use the "
            "old values after the call, lets XLA write the outputs into them"
            + (f": up to that much less at the peak, as XLA plans it ({plan})." if drop is None
               else f": {format_bytes(drop)} less at the peak, as XLA plans the step compiled "
               "so (the kit compiled it with the donation)." if donation_pays(drop, saving) else
               f"; but as XLA plans one call of this step{' for the CPU' if on_cpu else ''}, "
               f"its peak does not drop with them donated ({format_bytes(max(drop, 0))} less: "
               "the kit compiled it so)"
               + (f", and the CPU's plan cannot speak for {target}'s (not yet run on a GPU)."
                  if on_cpu and target else
                  ". In a loop that feeds the outputs back, donation still lets each call's old "
                  "buffers go as it runs (measured on the CPU, jax 0.10.2: an 8-layer MLP step "
                  "fed back 20 times peaked at 243-259 MiB of process memory without it, "
                  "126-152 MiB with it); a GPU's plan is "
                  f"its own (not yet run on a GPU: {plan} there)." if on_cpu else ".")))
    mine = [(where, n) for where, n in copied if argument_root(where) in names]
    if mine:
        where, n = mine[0]
        also = f" (and {len(mine) - 1} more)" if len(mine) > 1 else ""
        note += (f" It costs time too: to write a slice into {where}{also} (.at[...].set, "
                 f"dynamic_update_slice, a scatter) the step copies all {format_bytes(n)} of it "
                 "first, on every call, where donated it writes in place (a KV cache written "
                 "one token per call, jax-ml/jax#9132: 26.6 ms a token, 0.067 ms donated, on "
                 "the CPU).")
    return note


#: where the value in a pytree's static part sets a shape or an index, it cannot be traced
_STATIC_BOUND = ("where it sets a shape or a slice bound, which must stay static, keep it a "
                 "Python int (int(x)), and run jax.clear_caches() once, since the cache keeps "
                 "the entry keyed on the array (jax-ml/jax#28311)")


def static_array_note(static: tuple[tuple[str, str, str], ...]) -> str:
    """The note for the first array kept in a pytree's static part (:func:`static_arrays`)."""
    name, node, array = static[0]
    return (f"{name} keeps an array, {array}, in the static part of its {node} (the pytree's "
            "metadata: a field marked static): jit bakes it into the program as a constant and "
            "compares it with == at every call, which raises for another array of more than "
            "one element (\"arrays cannot be passed as metadata fields\"), and for a JAX "
            "scalar inside another jit. Make it an ordinary field, a child of the pytree, so it "
            "is passed to the step as an argument; " + _STATIC_BOUND + ".")


def narrowed_notes(narrowed: tuple[NarrowedArgument, ...], peak: int) -> list[str]:
    """The notes for arguments read only through a narrower cast (:func:`narrowed_arguments`):
    one for parameters, one for a batch of data, each where it holds 1 MiB or more and an
    eighth of the step's peak."""
    in_trees = tuple(n for n in narrowed if not _is_data(n))  # parameters
    whole = tuple(n for n in narrowed if _is_data(n))  # a batch of data
    return [note(group, wide)
            for group, note in ((in_trees, _narrowed_note), (whole, _narrowed_data_note))
            if (wide := sum(n.nbytes for n in group)) >= 2**20 and 8 * wide >= peak]
