"""Reading a step's jaxpr for what the user's code asked of JAX, before XLA plans anything: the
patterns :class:`helpers.compiled.CompiledStep` names (a ``device=`` jit drops, a Jacobian made
the long way, values multiplied by the constant 0.0, parameters used only through a narrower
cast, values jnp's promotion widens), each with the user's line that made it.

Plain tuples out; :mod:`helpers.compiled` makes the records.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from helpers._internal import frames, jaxcompat
from helpers._internal.jaxcompat import device_name

__all__ = ["batch_reductions", "callback_vmapped", "CALLBACKS", "callbacks",
           "callbacks_every_step", "callbacks_hoisted", "callbacks_vmapped", "carry_lines",
           "cast_before_scan", "chained_scans", "checkpoint_offloads", "closed_over_values",
           "closes_over_arrays", "custom_vjp_residuals", "custom_vjp_rule",
           "device_keywords_and_puts", "einsum_intermediates", "einsum_step", "equation_line",
           "equation_where", "has_derivative", "in_selected_conds", "jacobian_lines",
           "jacobian_sizes", "line_repeats", "LOOKUPS_FIX", "loop_records", "LOOP_REPEATS",
           "narrowed_inputs", "output_kinds", "pairwise_reductions", "prints", "progress_fix",
           "psums_of_invariant", "repeated_checkpoints", "repeated_outputs", "replicated_sums",
           "residual_sources", "scaled_by_zero", "scan_carry_bytes", "scan_checkpoint",
           "scan_copied_xs", "scan_role", "scan_updated_xs", "scatters_batched", "shapes_by_dtype",
           "sliced_sorts", "softmax_products", "sparse_products", "threefry_draws",
           "UNALIKE_LOOP_FIX", "unchanged_in_rows", "unrolled_line", "vmapped_lines", "walk",
           "while_loops", "wholly_checkpointed", "WIDE_AT", "wide_reductions", "widened_carries",
           "widened_inputs", "without_prints"]


def _floating(dtype) -> bool:
    """A floating dtype, bfloat16 included (NumPy's issubdtype says no to bfloat16)."""
    import jax.numpy as jnp

    return bool(jnp.issubdtype(dtype, jnp.floating))


def walk(closed) -> Iterator[tuple[Any, Sequence]]:
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


def has_derivative(closed) -> bool:
    """The step takes a reverse-mode derivative (jax.grad, jax.vjp: an equation, at any depth,
    made under ``transpose(``): what keeps residuals for a backward pass, which
    ``jax.checkpoint`` trades for recomputation. A solve or a factorization alone has none
    (google/neural-tangents#166)."""
    return any("transpose(" in str(getattr(eqn.source_info, "name_stack", ""))
               for j, _ in walk(closed) for eqn in getattr(j, "eqns", ()))


def closes_over_arrays(closed) -> bool:
    """The step closes over an array of one dimension or more (a constant of its jaxpr or of
    one nested in it): what XLA can compute with while compiling. A step that only makes
    arrays from literals (``jnp.zeros(shape)``: a broadcast of the constant 0) closes over
    none; neither does a closed-over scalar or PRNG key."""
    return any(getattr(c, "ndim", 0) for _, consts in walk(closed) for c in consts)


def closed_over_values(closed) -> set[tuple[int, ...]]:
    """The shapes of the values a step computes from the arrays it closes over and from no
    argument (``w[i]`` of a closed-over weight stack in an unrolled loop): XLA computes them
    while compiling and keeps them as constants of these shapes, which are the closed-over
    arrays' all the same (passing the array as an argument leaves none). A value made from
    literals alone (``jnp.ones(...).at[...].set(...)``) is not one."""
    from jax.extend import core

    out: set[tuple[int, ...]] = set()
    for j, consts in walk(closed):
        arrays = {v for v, c in zip(getattr(j, "constvars", ()), consts, strict=False)
                  if getattr(c, "ndim", 0)}
        no_argument = set(getattr(j, "constvars", ()))  # made from constants and literals only
        for eqn in getattr(j, "eqns", ()):
            ins = [v for v in eqn.invars if not isinstance(v, core.Literal)]
            if eqn.effects or not all(v in no_argument for v in ins):
                continue
            no_argument.update(eqn.outvars)
            if any(v in arrays for v in ins):
                arrays.update(eqn.outvars)
                out.update(tuple(v.aval.shape) for v in eqn.outvars
                           if getattr(v.aval, "shape", ()))
    return out


def _traceback_frames(eqn) -> list:
    """The frames of the traceback that made a jaxpr equation, innermost first (JAX's own and
    the user's); [] where it has none."""
    try:
        return list(eqn.source_info.traceback.frames)
    except Exception:  # an equation without a traceback
        return []


def _innermost_user(eqn):
    """The user's innermost frame of the traceback that made a jaxpr equation, or None."""
    return next((f for f in _traceback_frames(eqn) if frames.is_user_file(f.file_name)), None)


def _user_frame(eqn) -> tuple[str, int] | None:
    """(file, line) of the user's innermost frame that made a jaxpr equation, or None."""
    f = _innermost_user(eqn)
    return (f.file_name, f.line_num) if f else None


def equation_line(eqn) -> str:
    """The user's line that made a jaxpr equation ("" where its traceback names none)."""
    where = _user_frame(eqn)
    return frames.line(*where) if where else ""


def equation_where(eqn) -> str:
    """The user's file and line that made a jaxpr equation, as JAX's residual list names it
    ("model.py:12", "Cell In[3], line 2"); "" where its traceback names none."""
    where = _user_frame(eqn)
    return frames.where(*where) if where else ""


def _statement(file: str, line: int, most: int = 12) -> str:
    """The code from ``line`` on until its brackets close (a call black spreads over several
    lines), comments left out; at most ``most`` lines."""
    import linecache

    text, depth = [], 0
    for n in range(line, line + most):
        code = linecache.getline(file, n).split("#")[0]
        if not code:
            break
        text.append(code.strip())
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0:
            break
    return " ".join(text)


def scan_role(eqn) -> str:
    """"forward" for a derivative's forward pass, "backward" for its backward pass (JAX's name
    stack says jvp, transpose), "" otherwise."""
    try:
        stack = str(eqn.source_info.name_stack)
    except Exception:  # an equation without a name stack
        return ""
    return "backward" if "transpose(" in stack else "forward" if "jvp(" in stack else ""


def scan_copied_xs(eqn) -> list[bool]:
    """For each value a ``lax.scan`` stacks over its length (its outputs beside the carry):
    whether the body returns its slice of what the scan reads (an ``xs``) unchanged, followed
    through the calls in the body (``jax.checkpoint``, an inner jit). The scan then stacks a
    copy of that array. JAX drops such a copy itself where nothing hides it (a body returning
    its ``xs`` slice directly traces to a scan that returns no such output; under
    ``jax.checkpoint`` it stays: jax 0.8.0 and 0.10.2, maxtext#4405)."""
    body = eqn.params["jaxpr"]
    body = getattr(body, "jaxpr", body)
    consts, carry = jaxcompat.scan_counts(eqn.params)
    first_xs = consts + carry
    out = []
    for var in body.outvars[carry:]:
        source = _invar_index(body, var)
        out.append(source is not None and source >= first_xs)
    return out


#: the writes of a few rows into an array: its result has the array's shape (operand 0)
_WRITES = ("dynamic_update_slice", "scatter", "scatter-add")


def scan_updated_xs(eqn) -> list[bool]:
    """For each value a ``lax.scan`` stacks over its length (its outputs beside the carry):
    whether the body makes it by writing rows into its slice of what the scan reads (an ``xs``
    of the same shape and dtype) with ``dynamic_update_slice`` or ``.at[].set`` (a scatter),
    followed back through a chain of such writes. The scan then builds a new stacked array on
    every call to change a few rows of it: a KV cache stacked over layers and threaded through
    a scan over the layers as xs and ys (marin-community/levanter#1249)."""
    body = eqn.params["jaxpr"]
    body = getattr(body, "jaxpr", body)
    consts, carry = jaxcompat.scan_counts(eqn.params)
    first_xs = consts + carry
    made = {id(v): e for e in body.eqns for v in e.outvars}
    out = []
    for var in body.outvars[carry:]:
        kind, start, writes = _types([var]), var, 0
        while (e := made.get(id(start))) is not None and e.primitive.name in _WRITES and (
                writes < 64):
            start, writes = e.invars[0], writes + 1
        source = _invar_index(body, start) if writes else None
        out.append(source is not None and source >= first_xs
                   and _types([body.invars[source]]) == kind)
    return out


def scan_carry_bytes(eqn) -> int:
    """The bytes of one step's carry of a ``lax.scan``: what ``jax.checkpoint`` on its body
    keeps for each step (jax-ml/jax#19250)."""
    return sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize
               for v in eqn.outvars[:jaxcompat.scan_counts(eqn.params)[1]]
               if hasattr(v.aval, "shape"))


#: the primitives of jax.checkpoint (jax.remat): remat2 is its name on jax 0.8.0 and 0.10.2
_REMATS = ("remat", "remat2", "checkpoint")


def scan_checkpoint(eqn) -> tuple[bool, bool]:
    """(whether a ``lax.scan``'s body runs under ``jax.checkpoint``, whether that checkpoint
    holds a scan of its own: a scan of checkpointed chunks of steps). Read from the body and
    the inner jits it calls, not from a scan nested in it. In a gradient's forward scan JAX has
    already split the checkpoint off (its backward scan keeps it: jax 0.8.0 and 0.10.2)."""
    body = eqn.params["jaxpr"]
    carry = sorted(_types(eqn.outvars[:jaxcompat.scan_counts(eqn.params)[1]]))
    stack = [getattr(body, "jaxpr", body)]
    while stack:
        for inner in stack.pop().eqns:
            if inner.primitive.name in _REMATS:  # chunks: an inner scan that carries ours
                return True, any(e.primitive.name == "scan" and _within(
                                     carry, _types(e.outvars[:jaxcompat.scan_counts(e.params)[1]]))
                                 for j, _ in walk(inner.params.get("jaxpr"))
                                 for e in getattr(j, "eqns", ()))
            if (called := _called(inner)) is not None:
                stack.append(called)
    return False, False


def checkpoint_offloads(closed) -> tuple[tuple[str, str, bool, str], ...]:
    """(what, the memory kind it goes to, whether the checkpointed function returns it, the
    user's line) for each value a ``jax.checkpoint`` policy in the jaxpr offloads: the policy
    asked of each equation of its function as JAX asks it (``policy(primitive, *avals,
    **params)``, an ``Offloadable`` with ``dst`` back; jax 0.8.0 and 0.10.2). ``what`` is a
    ``checkpoint_name``'s name, or the primitive's. A value the checkpointed function returns
    is no residual of that checkpoint: no policy offloads it (jax-ml/jax#23869)."""
    out = []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            policy = eqn.params.get("policy") if eqn.primitive.name in _REMATS else None
            body = eqn.params.get("jaxpr")
            if policy is None or body is None:
                continue
            returned = {id(v) for v in getattr(body, "jaxpr", body).outvars}
            for inner, _ in walk(body):
                for e in getattr(inner, "eqns", ()):
                    try:
                        dst = getattr(policy(e.primitive, *[v.aval for v in e.invars],
                                             **e.params), "dst", None)
                    except Exception:  # a policy of the user's that cannot answer
                        continue
                    if isinstance(dst, str):
                        what = str(e.params.get("name", "")) if e.primitive.name == "name" \
                            else e.primitive.name
                        out.append((what, dst, any(id(v) in returned for v in e.outvars),
                                    equation_where(e)))
    return tuple(dict.fromkeys(out))  # a checkpoint inside another: asked of both policies


def _broadcast_from(var, made: dict) -> tuple[set[int], Any, tuple[int, ...]]:
    """(the axes along which ``var`` is a broadcast, the value it was broadcast from, that
    value's axis for each of ``var``'s axes, -1 for a new one), through ``broadcast_in_dim``
    equations: a size-1 axis counts too, as lax's binary operations broadcast it."""
    shape = tuple(var.aval.shape)
    axes = {i for i, n in enumerate(shape) if n == 1}
    source, mapping = var, tuple(range(len(shape)))
    while (eqn := made.get(id(source))) is not None and \
            eqn.primitive.name == "broadcast_in_dim" and hasattr(eqn.invars[0], "aval"):
        dims, outer = tuple(eqn.params["broadcast_dimensions"]), tuple(source.aval.shape)
        inner = tuple(eqn.invars[0].aval.shape)
        back = {d: i for i, d in enumerate(dims) if inner[i] == outer[d]}
        axes |= {k for k, m in enumerate(mapping) if m >= 0 and m not in back}
        mapping = tuple(back.get(m, -1) if m >= 0 else -1 for m in mapping)
        source = eqn.invars[0]
    return axes, source, mapping


def _pairwise_axes(eqn, made: dict) -> tuple[int, int] | None:
    """(an axis along which the first operand varies and the second is broadcast, one along
    which the second varies and the first is broadcast), each of 8 or more, where an equation
    of two operands broadcasts them against each other: an outer product (N-body, RBF:
    ``x[:, None] - y[None, :]``); None otherwise."""
    ins = [v for v in eqn.invars if hasattr(v, "aval") and not hasattr(v, "val")]
    out = tuple(getattr(eqn.outvars[0].aval, "shape", ())) if eqn.outvars else ()
    if len(eqn.invars) != 2 or len(ins) != 2 or len(eqn.outvars) != 1 or \
            any(len(getattr(v.aval, "shape", ())) != len(out) for v in ins):
        return None
    (b0, _, _), (b1, _, _) = (_broadcast_from(v, made) for v in ins)
    a = [i for i in sorted(b1 - b0) if out[i] >= 8]  # operand 0 varies, operand 1 broadcast
    b = [i for i in sorted(b0 - b1) if out[i] >= 8]
    return (a[0], b[0]) if a and b else None


_REDUCE = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin")


def _reduced_pair_axis(j, start: int, var, pair: tuple[int, int]) -> tuple[int, Any] | None:
    """(which of the two ``pair`` axes, the equation) where what follows ``var`` in ``j``
    first reduces one of them (a reduce_*, or a dot_general contracting it), following the
    pair's positions through elementwise equations, broadcast_in_dim, transpose and
    reductions over other axes; None where none does."""
    track = {id(var): pair}
    for eqn in j.eqns[start:]:
        held = next(((v, track[id(v)]) for v in eqn.invars if id(v) in track), None)
        if held is None:
            continue
        v, (a, b) = held
        name, shape = eqn.primitive.name, tuple(v.aval.shape)
        new: tuple[int, int] | None = None
        if name in _REDUCE or name == "dot_general":
            if name == "dot_general":
                (lc, rc), _ = eqn.params["dimension_numbers"]
                axes = tuple(lc if v is eqn.invars[0] else rc)
            else:
                axes = tuple(eqn.params.get("axes", ()))
            if a in axes and b in axes:  # a sum of all: the longer, else the second
                return (0 if shape[a] > shape[b] else 1), eqn
            if a in axes or b in axes:
                return (0 if a in axes else 1), eqn
            if name == "dot_general":
                return None
            new = (a - sum(x < a for x in axes), b - sum(x < b for x in axes))
        elif name == "broadcast_in_dim":
            dims = eqn.params["broadcast_dimensions"]
            new = (dims[a], dims[b])
        elif name == "transpose":
            perm = list(eqn.params["permutation"])
            new = (perm.index(a), perm.index(b))
        elif all(len(getattr(o.aval, "shape", ())) == len(shape) for o in eqn.outvars):
            new = (a, b)  # elementwise: the same axes
        if new is not None:
            for o in eqn.outvars:
                out = tuple(getattr(o.aval, "shape", ()))
                if len(out) > max(new) and (out[new[0]], out[new[1]]) == (shape[a], shape[b]):
                    track[id(o)] = new
    return None


def pairwise_reductions(closed) -> tuple[tuple[tuple[int, ...], str, tuple[int, int], int,
                                               str, str, int, int], ...]:
    """Each value made by broadcasting two operands against each other (an outer product over
    two axes: ``x[:, None, :] - y[None, :, :]``) that what follows reduces over one of the two
    axes (a sum over j of f(x_i, y_j): N-body forces, an RBF kernel; openxla/xla#49131): (its
    shape, dtype, the two axes, the one reduced, the user's line that made it, the line that
    reduces it, the position among the jaxpr's own inputs of the input that runs along the
    reduced axis (-1 where it is made inside, or in an inner jaxpr), that input's axis)."""
    out = []
    for depth, (j, _) in enumerate(walk(closed)):
        made = {id(v): eqn for eqn in getattr(j, "eqns", ()) for v in eqn.outvars}
        invars = {id(v): i for i, v in enumerate(getattr(j, "invars", ()))} if depth == 0 \
            else {}
        for n, eqn in enumerate(getattr(j, "eqns", ())):
            if (pair := _pairwise_axes(eqn, made)) is None:
                continue
            found = _reduced_pair_axis(j, n + 1, eqn.outvars[0], pair)
            if found is None:
                continue
            which, reducer = found
            axis = pair[which]
            # the operand that varies along the reduced axis, back to the jaxpr's own input
            operand = eqn.invars[which]
            _, source, mapping = _broadcast_from(operand, made)
            arg = invars.get(id(source), -1)
            out.append((tuple(eqn.outvars[0].aval.shape), str(eqn.outvars[0].aval.dtype),
                        pair, which, equation_where(eqn), equation_line(reducer), arg,
                        mapping[axis] if arg >= 0 else -1))
    return tuple(out)


def _types(values) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(v.aval.shape), str(v.aval.dtype)) for v in values if hasattr(v.aval, "shape")]


def _within(few: list, many: list) -> bool:
    """Every type of ``few`` among ``many``, each as often (a multiset)."""
    left = list(many)
    for t in few:
        if t not in left:
            return False
        left.remove(t)
    return bool(few)


def custom_vjp_rule(eqn) -> str:
    """The name of the ``jax.custom_vjp`` fwd rule of the user's that made a jaxpr equation
    ("" where none did): the user's outermost frame under JAX's ``_flatten_fwd``, which calls
    the rule (jax/_src/custom_derivatives.py, named by jaxcompat; jax 0.8.0 and 0.10.2 alike).
    What the rule returns as residuals JAX keeps until bwd runs, whatever jax.checkpoint
    inside it says (sgl-project/sglang-jax#823)."""
    found = [(f.function_name, f.file_name) for f in _traceback_frames(eqn)]
    caller = jaxcompat.custom_vjp_fwd_caller()
    for n, (name, _) in enumerate(found):  # innermost first
        if caller and name == caller:
            user = [fn for fn, file in found[:n] if frames.is_user_file(file)]
            return user[-1].rsplit("<locals>.", 1)[-1] if user else ""  # (a nested def's)
    return ""


def custom_vjp_residuals(closed) -> list[tuple[tuple[int, ...], str, str, str]]:
    """(shape, dtype, where it was made, the fwd rule) of each residual of a linearized
    function's jaxpr (``jax.make_jaxpr`` of ``jax.linearize(f, ...)[1]``: its outputs are what
    the gradient keeps, as in JAX's ``saved_residuals``) that a ``jax.custom_vjp`` fwd rule
    made."""
    jaxpr = getattr(closed, "jaxpr", closed)
    made, _ = _index(jaxpr)
    out = []
    for v in jaxpr.outvars:
        eqn = made.get(id(v))
        if eqn is not None and (rule := custom_vjp_rule(eqn)):
            out.append((tuple(v.aval.shape), str(v.aval.dtype), equation_where(eqn), rule))
    return out


def _spec_devices(spec, mesh, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...], tuple]:
    """(the devices a shard_map's out_spec splits a value over, its shape on one device, the
    mesh axes named) for a PartitionSpec on ``mesh``."""
    sizes = dict(mesh.shape)
    devices, local, names = 1, list(shape), []
    for dim, entry in enumerate(tuple(spec)[:len(shape)]):
        axes = entry if isinstance(entry, tuple) else () if entry is None else (entry,)
        n = math.prod(int(sizes.get(a, 1)) for a in axes)
        devices, local[dim], names = devices * n, local[dim] // max(n, 1), names + list(axes)
    return devices, tuple(local), tuple(names)


def shard_map_residuals(closed, count: int) -> list[tuple[tuple[int, ...], str, int,
                                                          tuple[int, ...], str, tuple]]:
    """(shape, dtype, the devices it is split over, its shape on one device, the line of the
    ``all_gather`` that made it whole in the body or "", the mesh axes) of each of the last
    ``count`` outputs of ``closed`` (the jaxpr of ``jax.vjp``: those are its residuals, as in
    JAX's ``saved_residuals``) that a ``shard_map`` returns, followed through inner jits. JAX
    returns a shard_map body's residuals through its out_specs, stacked over the manual axes
    (jax-ml/jax#25010: four devices' float32[1024, 1024] listed as one float32[4096, 1024])."""
    jaxpr = getattr(closed, "jaxpr", closed)
    out = []
    for v in jaxpr.outvars[len(jaxpr.outvars) - count:] if count else ():
        j, var = jaxpr, v
        for _ in range(8):
            eqn = _index(j)[0].get(id(var))
            if eqn is None:
                break
            k = next(i for i, o in enumerate(eqn.outvars) if o is var)
            if eqn.primitive.name == "shard_map":
                spec, mesh = eqn.params["out_specs"][k], eqn.params["mesh"]
                body = getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"])
                devices, local, axes = _spec_devices(spec, mesh, tuple(v.aval.shape))
                made = _index(body)[0].get(id(body.outvars[k]))
                where = equation_where(made) if made is not None and \
                    made.primitive.name == "all_gather" else ""
                if devices > 1:
                    out.append((tuple(v.aval.shape), str(v.aval.dtype), devices, local, where,
                                axes))
                break
            inner = _called(eqn)
            if inner is None:
                break
            j, var = inner, inner.outvars[k]
    return out


def residual_sources(closed, count: int) -> list[tuple[tuple[int, ...], str, int, str,
                                                      tuple[int, str, int, bool] | None, bool]]:
    """(shape, dtype, the number of the top-level equation that makes it (-1 for an input, a
    constant or a literal), that equation's primitive, for a ``lax.scan``'s output (its length,
    the user's line, its place among the top-level scans of that length and line, whether it is
    stacked over the steps rather than a final carry) else None, whether that equation reads
    no floating value (a one-hot or a mask, made from integers alone)) of each of the last
    ``count`` outputs of ``closed``: the jaxpr of ``jax.vjp``, whose last outputs are the
    residuals, listed in the order JAX's ``saved_residuals`` lists them (literals, constants,
    inputs, then each equation's outputs in turn: jax 0.8.0 and 0.10.2), so the two pair one
    for one. Two scans made by one line (a Python loop of scans) are two equations here."""
    jaxpr = getattr(closed, "jaxpr", closed)
    wanted = list(jaxpr.outvars[len(jaxpr.outvars) - count:]) if count else []
    subst = {id(e.outvars[0]): e.invars[0] for e in jaxpr.eqns
             if e.primitive.name == "reduce_precision"}  # JAX looks through it (0.10.2)
    ids = {id(subst.get(id(v), v)) for v in wanted if not hasattr(v, "val")}
    out: list = [(tuple(v.aval.shape), str(v.aval.dtype), -1, "", None, False)
                 for v in wanted if hasattr(v, "val")]
    out += [(tuple(v.aval.shape), str(v.aval.dtype), -1, "", None, False)
            for v in (*jaxpr.constvars, *jaxpr.invars) if id(v) in ids]
    seen: dict[tuple[int, str], int] = {}
    for n, eqn in enumerate(jaxpr.eqns):
        scan = None
        if eqn.primitive.name == "scan":
            key = (int(eqn.params["length"]), equation_where(eqn))
            scan = (*key, seen.get(key, 0))
            seen[key] = scan[2] + 1
        integers = not any(_floating(v.aval.dtype) or "complex" in str(v.aval.dtype)
                           for v in eqn.invars if hasattr(v.aval, "dtype"))
        for k, v in enumerate(eqn.outvars):
            if id(v) in ids:
                out.append((tuple(v.aval.shape), str(v.aval.dtype), n, eqn.primitive.name,
                            (*scan, k >= jaxcompat.scan_counts(eqn.params)[1]) if scan else None,
                            integers))
    return out


def _rows_of(var, made: dict, invars: dict) -> int:
    """The position among the jaxpr's inputs of the input ``var`` is, or is moved or reshaped
    from (:data:`_MOVES`), -1 for anything else."""
    for _ in range(8):
        if id(var) in invars:
            return invars[id(var)]
        eqn = made.get(id(var))
        ins = [v for v in eqn.invars if not hasattr(v, "val")] if eqn is not None else []
        if eqn is None or eqn.primitive.name not in _MOVES or len(ins) != 1:
            return -1
        var = ins[0]
    return -1


#: reductions that take the value's axes in ``axes``: a softmax's max and sum, a logsumexp's
_REDUCTIONS = ("reduce_max", "reduce_sum", "reduce_min", "argmax", "argmin", "reduce_prod")
#: a product's free axis this many times its contracted size or more is "wide": a vocabulary
#: against the hidden size (apple/axlearn#1236: 8192 against 256), keys against a head's size
#: (google/flax#2858: 1024 against 64)
WIDE_AT = 8


def _follow_axis(j, var, axis: int, found: list, depth: int = 0) -> tuple[list, dict]:
    """(the reductions over ``axis`` of ``var`` in jaxpr ``j``, reached through the elementwise
    equations, transposes, broadcasts and inner calls that keep that axis; id of each value
    reached -> its axis there). Each value on the way is added to ``found`` as (shape,
    dtype)."""
    _, read = _index(j)
    stack, reached, reducers = [(var, axis)], {}, []
    while stack:
        v, a = stack.pop()
        if id(v) in reached:
            continue
        reached[id(v)] = a
        found.append((tuple(v.aval.shape), str(v.aval.dtype)))
        for eqn in read.get(id(v), ()):
            name, out = eqn.primitive.name, eqn.outvars[0] if eqn.outvars else None
            if name in _REDUCTIONS:
                if a in tuple(int(x) for x in eqn.params.get("axes", ())):
                    reducers.append(eqn)
            elif name == "transpose":
                stack.append((out, list(eqn.params["permutation"]).index(a)))
            elif name == "broadcast_in_dim":
                stack.append((out, int(eqn.params["broadcast_dimensions"][a])))
            elif (inner := _called(eqn)) is not None:
                if depth > 6:
                    continue
                for k in [k for k, x in enumerate(eqn.invars) if x is v]:
                    more, inside = _follow_axis(inner, inner.invars[k], a, found, depth + 1)
                    reducers += more
                    stack += [(eqn.outvars[i], inside[id(o)])
                              for i, o in enumerate(inner.outvars) if id(o) in inside]
            elif out is not None and len(eqn.outvars) == 1 and hasattr(out.aval, "shape") \
                    and name not in ("dot_general", "gather", "scatter", "scatter-add") \
                    and len(out.aval.shape) == len(v.aval.shape) \
                    and out.aval.shape[a] == v.aval.shape[a]:
                stack.append((out, a))  # elementwise: the same axis
    return reducers, reached


def wide_reductions(closed) -> tuple[tuple[tuple[int, ...], str, int, int, int, str, str, int,
                                           frozenset], ...]:
    """Each product (``dot_general``) whose free axis is :data:`WIDE_AT` times its contracted
    size or more, and that what follows reduces over that axis: full-vocabulary logits reduced
    by a logsumexp (apple/axlearn#1236), attention scores reduced by a softmax
    (google/flax#2858). (the product's shape, its dtype, the wide axis's size, the contracted
    size, the rows: the other operand's largest free axis, the user's line that made the
    product, the line that reduces it, the position among the jaxpr's own inputs of the input
    those rows come from (-1 where it is made inside), the (shape, dtype) of every value on the
    way from the product to its reduction)."""
    out = []
    for depth, (j, _) in enumerate(walk(closed)):
        made, _ = _index(j) if getattr(j, "eqns", None) is not None else ({}, {})
        invars = {id(v): i for i, v in enumerate(getattr(j, "invars", ()))} if depth == 0 \
            else {}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "dot_general":
                continue
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            lhs, rhs = (tuple(v.aval.shape) for v in eqn.invars[:2])
            k = math.prod(lhs[i] for i in lc) or 1
            lfree = [i for i in range(len(lhs)) if i not in lc and i not in lb]
            rfree = [i for i in range(len(rhs)) if i not in rc and i not in rb]
            # output axes: the batch axes, then the lhs's free ones, then the rhs's
            sides = ((rhs, rfree, lhs, lfree, eqn.invars[0], len(lb) + len(lfree)),
                     (lhs, lfree, rhs, rfree, eqn.invars[1], len(lb)))
            for shape, free, other, other_free, other_var, first in sides:
                for n, i in enumerate(free):
                    if shape[i] < WIDE_AT * k or not other_free:
                        continue
                    found: list = []
                    reducers, _ = _follow_axis(j, eqn.outvars[0], first + n, found)
                    if not reducers:
                        continue
                    out.append((tuple(eqn.outvars[0].aval.shape),
                                str(eqn.outvars[0].aval.dtype), shape[i], k,
                                max(other[x] for x in other_free), equation_where(eqn),
                                equation_line(reducers[0]), _rows_of(other_var, made, invars),
                                frozenset(found)))
    return tuple(out)


def chained_scans(closed) -> frozenset[tuple[int, str]]:
    """(length, the user's line) of the top-level scans made at one line where each
    after the first starts from a carry the one before ends with: blocks of one long scan in a
    Python loop (jax-ml/jax#27748), which one scan over the blocks can run. Layers that pass
    each other their stacked outputs (a stacked RNN) are not chained so."""
    jaxpr = getattr(closed, "jaxpr", closed)
    ends: dict[tuple[int, str], set[int]] = {}  # key -> ids of the carries its scans end with
    counts: dict[tuple[int, str], list[bool]] = {}
    for eqn in getattr(jaxpr, "eqns", ()):
        if eqn.primitive.name != "scan":
            continue
        key = (int(eqn.params["length"]), equation_where(eqn))
        start, n = jaxcompat.scan_counts(eqn.params)
        carried = eqn.invars[start:start + n]
        if key in ends:
            counts[key].append(any(id(v) in ends[key] for v in carried))
        else:
            counts[key] = []
        ends.setdefault(key, set()).update(id(v) for v in eqn.outvars[:n])
    return frozenset(k for k, chained in counts.items() if chained and all(chained))


def stop_flags(closed) -> list[tuple[int, str, str, str]]:
    """(the scan's length, the flag's type, the scan's line, the line that sets it) of each
    ``lax.scan`` (a ``fori_loop`` with fixed bounds is one) whose carry holds a boolean flag
    that only ever turns on, ``stopped = stopped | ...``, and that the body also reads (to
    select with ``jnp.where``, or as a ``lax.cond``'s predicate): once every element has it,
    the remaining steps compute what is thrown away (NovaSky-AI/SkyRL#1058, a decode loop of
    ``max_new_tokens`` steps). None in a step that takes a reverse-mode derivative: the fix, a
    ``while_loop``, has none."""
    found = []
    if has_derivative(closed):
        return found
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "scan" or int(eqn.params.get("length", 0)) < 4:
                continue
            body = eqn.params["jaxpr"]
            body = getattr(body, "jaxpr", body)
            start, n = jaxcompat.scan_counts(eqn.params)
            made_by, read = _index(body)
            for k in range(n):
                flag, new = body.invars[start + k], body.outvars[k]
                aval = getattr(flag, "aval", None)
                if getattr(aval, "dtype", None) != np.bool_:
                    continue
                setter = made_by.get(id(new))
                if setter is None or setter.primitive.name != "or" or not any(
                        v is flag for v in setter.invars):
                    continue
                if not _gates(body, flag, setter, read=read):
                    continue  # a flag nothing selects by (a count of it): nothing is thrown away
                found.append((int(eqn.params["length"]), f"bool{list(aval.shape)}",
                              equation_line(eqn), equation_line(setter)))
    return found


#: what a flag may pass through on its way to a select's predicate (~flag, its broadcast, a cast,
#: another flag and-ed or or-ed with it)
_FLAG_PASSES = frozenset({"not", "and", "or", "broadcast_in_dim", "reshape", "squeeze",
                          "expand_dims", "convert_element_type"})


def _gates(j, flag, setter=None, depth: int = 0, read: dict | None = None) -> bool:
    """Whether ``flag`` (a boolean variable of jaxpr ``j``) decides, through
    :data:`_FLAG_PASSES`, a ``select_n``'s predicate (``jnp.where``) or a ``cond``'s index,
    following it into inner jits (jnp.where is one); ``setter``'s reading is left out.
    ``read``: ``j``'s readers by variable (:func:`_index`), where the caller has them."""
    if depth > 8:
        return False
    if read is None:
        _, read = _index(j)
    seen, todo = set(), [flag]
    while todo:
        var = todo.pop()
        if id(var) in seen:
            continue
        seen.add(id(var))
        for eqn in read.get(id(var), ()):
            if eqn is setter:
                continue
            name = eqn.primitive.name
            if name in ("select_n", "cond") and eqn.invars and eqn.invars[0] is var:
                return True
            if name in _FLAG_PASSES:
                todo.extend(eqn.outvars)
            elif (inner := _called(eqn)) is not None:
                if any(_gates(inner, inner.invars[k], None, depth + 1)
                       for k, v in enumerate(eqn.invars) if v is var):
                    return True
    return False


def repeated_checkpoints(closed) -> tuple[tuple[str, int], ...]:
    """(the user's line, how many) for each line that made two or more ``jax.checkpoint``
    equations in one jaxpr: a function checkpointed layer by layer in a Python loop, whose
    recomputations XLA schedules as it likes (jax-ml/jax#19822, #27748)."""
    out = []
    for j, _ in walk(closed):
        lines: dict[str, int] = {}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name in _REMATS and (where := equation_where(eqn)):
                lines[where] = lines.get(where, 0) + 1
        out += [(w, n) for w, n in lines.items() if n >= 2]
    return tuple(out)


def checkpoint_at(closed, where: str) -> tuple[Any, Any] | None:
    """(the jaxpr it recomputes, its policy) of the first ``jax.checkpoint`` equation made at
    ``where`` (a line :func:`repeated_checkpoints` names), for the gradient of one such call
    alone; None where none is, or its jaxpr has constants of its own."""
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name in _REMATS and equation_where(eqn) == where:
                body = _called(eqn)
                if body is None or getattr(body, "constvars", ()):
                    return None
                return body, eqn.params.get("policy")
    return None


def wholly_checkpointed(closed) -> bool:
    """Whether every output of the jaxpr comes from one ``jax.checkpoint`` equation (followed
    through inner jits): ``jax.checkpoint`` around the whole function differentiated, which
    keeps only its arguments and recomputes all of it at once in the backward pass
    (jax-ml/jax#19822)."""
    j = getattr(closed, "jaxpr", closed)
    for _ in range(8):
        made, _ = _index(j)
        makers = {id(made[id(v)]) for v in j.outvars if id(v) in made}
        eqns = [made[id(v)] for v in j.outvars if id(v) in made]
        if len(makers) != 1 or len(eqns) != len(j.outvars):
            return False
        if eqns[0].primitive.name in _REMATS:
            return True
        if (j := _called(eqns[0])) is None:
            return False
    return False


def while_loops(closed) -> tuple[tuple[str, int], ...]:
    """(the user's line, the position among the jaxpr's own inputs of the input its condition
    reads: a bound, -1 where none is) of each ``while`` in the jaxpr and in those nested in it.
    A ``lax.fori_loop`` whose bounds are traced (a jit argument, a jnp value) is one; reverse-mode
    differentiation cannot go through it (jax-ml/jax#2956)."""
    out = []
    for depth, (j, _) in enumerate(walk(closed)):
        invars = {id(v): i for i, v in enumerate(getattr(j, "invars", ()))} if depth == 0 \
            else {}
        made, _ = _index(j) if getattr(j, "eqns", None) is not None else ({}, {})
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "while":
                continue
            cond = eqn.params["cond_jaxpr"]
            cond = getattr(cond, "jaxpr", cond)
            consts = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
            operands = [*eqn.invars[:eqn.params["cond_nconsts"]], *eqn.invars[consts:]]
            used = {id(v) for e in cond.eqns for v in e.invars}
            read = [x for x, inner in zip(operands, cond.invars, strict=False)
                    if id(inner) in used and not hasattr(x, "val")]
            bound = next((p for x in read if (p := _rows_of(x, made, invars)) >= 0), -1)
            out.append((equation_where(eqn), bound))
    return tuple(out)


def _invar_index(jaxpr, var, depth: int = 0) -> int | None:
    """The index of the input of ``jaxpr`` that its value ``var`` is, unchanged, followed
    through inner jits and remats (an inner jaxpr whose output is its own input); None else."""
    for i, v in enumerate(jaxpr.invars):
        if v is var:
            return i
    if depth > 8:
        return None
    for eqn in jaxpr.eqns:
        for k, out in enumerate(eqn.outvars):
            if out is var:
                inner = _called(eqn)
                at = None if inner is None else _invar_index(inner, inner.outvars[k], depth + 1)
                return None if at is None else _invar_index(jaxpr, eqn.invars[at], depth + 1)
    return None


def jacobian_lines(closed) -> frozenset[str]:
    """The user's lines (as :func:`equation_line` names them) of the equations traced inside
    ``jax.jacfwd`` or ``jax.jacrev`` (``jax.hessian``): a frame of their traceback is JAX's
    ``jacfun``, the function those return (jax 0.8.0 and 0.10.2). A value made at such a line
    under a vmap may be the Jacobian's own, over its basis (jax-ml/jax#787)."""
    out = set()
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if any(n.endswith("jacfun") for n in _frame_names(eqn)) and (
                    line := equation_line(eqn)):
                out.add(line)
    return frozenset(out)


def _frame_names(eqn) -> list[str]:
    """The function names of the traceback that made a jaxpr equation, innermost first."""
    return [f.function_name for f in _traceback_frames(eqn)]


def repeated_outputs(closed) -> list[tuple[int, int]]:
    """(the first, the repeat) positions of each output of a jaxpr that is the same computed
    value as an earlier one: XLA writes it into a buffer of its own each time (a ``copy``), so
    the caller holds two arrays of it (marin-community/marin#3668: ``ema_params=params`` in a
    train state with EMA off). An argument returned twice is left out."""
    jaxpr = getattr(closed, "jaxpr", closed)
    if jaxpr is None:
        return []
    inputs = {id(v) for v in jaxpr.invars}
    first: dict[int, int] = {}
    out = []
    for i, v in enumerate(jaxpr.outvars):
        if not hasattr(v, "aval") or type(v).__name__ == "Literal" or id(v) in inputs:
            continue
        if id(v) in first:
            out.append((first[id(v)], i))
        else:
            first[id(v)] = i
    return out


#: one equation (a primitive, from one and the same call stack) made this many times or more
#: at a line of the user's: the line ran that often, a Python loop unrolled into the program
LOOP_REPEATS = 16
#: where JAX's own loop code lives: what it makes by itself (associative_scan's slices and
#: interleaving, a recursion of log2 n levels, each level its own call stack) is no loop of
#: the user's (radarFudan/mamba-minimal-jax#1)
_JAX_LOOPS = "jax/_src/lax/control_flow/"
#: JAX's own code that makes equations by itself as a loop would: the batching rule of
#: ``jax.debug.print`` and ``jax.debug.callback`` under ``jax.vmap`` binds one callback and
#: one slice per element (jax/_src/debugging.py, ``debug_batching_rule``; a vmap over 32 made
#: 97 of a step's 100 equations at the print's line, jax 0.10.2), and JAX's callback code
#: (jax/_src/callback.py) is the same kind: no Python loop of the user's
_JAX_OWN = (_JAX_LOOPS, "jax/_src/debugging.py", "jax/_src/callback.py")
#: where jax.tree.map runs a function once per leaf (jax/_src/tree_util.py, jax/_src/tree.py)
_TREE_MAPS = ("tree_util.py", "_src/tree.py")


#: where the unrolled line looks a value up in each iteration (jax-ml/jax#891, hawkinsp: one
#: large gather, not many lookups in a loop; measured by the kit on a loaded 2-core CPU, B=6,
#: L=50: the gradient compiled in 16.6 s, one gather in 0.68 s, jax 0.10.2; 25.3 s and 2.35 s
#: on jax 0.8.0)
LOOKUPS_FIX = (" Its lookups (x[i, idx[i]] for each i) are one gather for all iterations with "
               "index arrays: x[jnp.arange(n), idx] (jax-ml/jax#891: 16.6 s of compiling "
               "for 50 lookups in a loop, 0.68 s for one gather).")


def line_repeats(closed) -> dict[tuple[str, int], tuple[int, int, int, int, bool, int]]:
    """Per line of the user's code, (file, line): (the equations it made, nested ones included,
    besides those of JAX's own loop code; those JAX's own code made (the slices of
    ``jax.lax.associative_scan``, a vmapped ``jax.debug.print``'s callback per element); the most
    times one equation (one primitive, one call stack) recurs there: how often the line ran, a
    Python loop's iterations; the same through ``jax.tree.map``: once per leaf; whether a gather (in
    a gradient, or its scatter-add) recurs there, a lookup in each iteration; of the equations that
    recur :data:`LOOP_REPEATS` times or more, the fewest times one of them recurs with the same
    operand shapes: a loop over layers of different widths makes its matmul with shapes of their own
    each time, and ``jax.lax.scan`` cannot run those as one body; the most recurrences where none
    recurs that often). Recurrences are counted among the equations of no derivative but one
    ``jax.grad`` or ``jax.jvp``'s forward pass: a derivative makes several equations from one call
    stack (nested ``jax.jvp`` of one line, 27 of one ``mul`` at order 3)."""
    out: dict[tuple[str, int], list] = {}
    for (_, tb), (n, primal, lookups, shapes) in _stack_groups(closed).items():
        try:
            fs = list(tb.frames) if tb is not None else []
        except Exception:  # a traceback that cannot say
            continue
        user = next((i for i, f in enumerate(fs) if frames.is_user_file(f.file_name)), None)
        if user is None:
            continue
        key = (fs[user].file_name, fs[user].line_num)
        line = out.setdefault(key, [0, 0, 0, 0, False, None])
        if any(own in f.file_name.replace("\\", "/") for f in fs[:user] for own in _JAX_OWN):
            line[1] += n
            continue
        line[0] += n
        if any(f.file_name.endswith(_TREE_MAPS) for f in fs):
            line[3] = max(line[3], primal)
        else:
            line[2] = max(line[2], primal)
            line[4] = line[4] or lookups > 1
            if primal >= LOOP_REPEATS:  # each equation the loop repeats, alike or not
                alike = max(shapes.values(), default=0)
                line[5] = alike if line[5] is None else min(line[5], alike)
    return {k: (*v[:5], v[2] if v[5] is None else v[5])  # type: ignore[misc]
            for k, v in out.items()}


def _stack_groups(closed) -> dict[tuple[str, Any], list]:
    """(primitive, traceback): [its equations, those of no derivative but one jax.grad or
    jax.jvp's forward pass (the primal's), lookups, {operand shapes: primal ones}], over every
    jaxpr of the step: one equation per call stack, counted as often as the code that made it
    ran (:func:`line_repeats`, :func:`calling_loop`)."""
    groups: dict[tuple[str, Any], list] = {}
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            try:
                tb = eqn.source_info.traceback
                stack = str(eqn.source_info.name_stack)
            except Exception:  # an equation without its source
                continue
            one = groups.setdefault((eqn.primitive.name, tb), [0, 0, 0, Counter()])
            one[0] += 1
            primal = stack.count("jvp(") <= 1 and "transpose(" not in stack
            one[1] += primal
            if primal:
                one[3][tuple(getattr(getattr(v, "aval", None), "shape", None)
                             for v in eqn.invars)] += 1
            # a lookup: a gather, or its transpose under jax.grad, a scatter-add (where the
            # gradient needs no forward value, jit's dead-code pass drops the gathers)
            one[2] += eqn.primitive.name == "gather" or (
                eqn.primitive.name == "scatter-add" and "transpose(" in stack)
    return groups


def calling_loop(closed, key: tuple[str, int]) -> tuple[tuple[str, int], int] | None:
    """((file, line), how many times it ran) of the user's line that calls the function ``key``
    (a line of the user's code, as :func:`line_repeats` keys it) is in, where that call ran
    :data:`LOOP_REPEATS` times or more: an outer Python loop around an inner one, each unrolled
    (fattorib/ZeRO-transformer#13: 32 microbatches, each a forward and backward pass through 6
    layers written as a loop). The times are the largest number that divides how often each
    equation made under that call recurs (the microbatch loop's 32, where the layers' own
    equations recur 6 x 32 times); None where the call ran once, or no user frame calls it. A
    function made of one loop alone, called once, looks the same from its tracebacks (each
    equation recurs as often as the loop ran): the caller compares the times with the line's
    own repeats."""
    chains = []
    for (_, tb), (_, n, _, _) in _stack_groups(closed).items():
        if not n:  # a derivative's equations alone: the primal's are counted
            continue
        try:
            fs = [(f.file_name, f.line_num) for f in tb.frames if frames.is_user_file(f.file_name)]
        except Exception:  # a traceback that cannot say
            continue
        chains.append((fs, n))
    caller = next((fs[1] for fs, _ in chains if len(fs) > 1 and fs[0] == key), None)
    if caller is None:
        return None
    times = 0
    for fs, n in chains:
        if caller in fs[1:]:  # made inside a call from that line
            times = math.gcd(times, n)
    return (caller, times) if times >= LOOP_REPEATS else None


def scalar_inputs(closed) -> int:
    """How many inputs of the step's own jaxpr (not a nested one's) are scalars: a list of
    Python numbers passed to jit is one scalar argument per number."""
    top = closed.jaxpr if hasattr(closed, "jaxpr") and hasattr(closed, "consts") else closed
    return sum(1 for v in getattr(top, "invars", ())
               if getattr(getattr(v, "aval", None), "shape", None) == ())


def sliced_lines(closed) -> set[tuple[str, int]]:
    """The lines of the user's code (as :func:`line_repeats` keys them) that slice an array
    :data:`LOOP_REPEATS` times or more into slices of more than one shape: a loop slicing by
    its index (``U[k, k:n]`` in an LU factorization: jax-ml/jax#2242)."""
    shapes: dict[tuple[str, int], Counter] = {}
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name not in ("slice", "dynamic_slice"):
                continue
            try:
                fs = list(eqn.source_info.traceback.frames)
            except Exception:  # an equation without its source
                continue
            user = next((f for f in fs if frames.is_user_file(f.file_name)), None)
            if user is not None:
                shapes.setdefault((user.file_name, user.line_num), Counter())[
                    tuple(eqn.outvars[0].aval.shape)] += 1
    return {key for key, seen in shapes.items()
            if sum(seen.values()) >= LOOP_REPEATS and len(seen) > 1}


def loop_kind(closed, key: tuple[str, int], repeats: int,
              sliced: set[tuple[str, int]] | None = None) -> str:
    """What made the line ``key`` (as :func:`line_repeats` keys it) repeat one equation
    ``repeats`` times, where that is not one Python loop over arrays alike: "scalars" where the
    step takes about as many scalar arguments (a list of Python numbers passed to jit is a
    pytree, each number an argument of its own, and code over it makes one operation per
    number: jax-ml/jax#5684's 3000 indices); "sliced" where the line slices an array by a
    loop's index, the slices' shapes changing between iterations (:func:`sliced_lines`, which
    ``sliced`` gives where the caller has it already); "" else."""
    scalars = scalar_inputs(closed)
    if scalars >= 2 * LOOP_REPEATS and scalars // 2 <= repeats <= 8 * scalars:
        return "scalars"
    return "sliced" if tuple(key) in (sliced_lines(closed) if sliced is None else sliced) \
        else ""


#: the fix of an unrolled line whose copies are one per scalar argument: a list of numbers
SCALARS_FIX = (
    "the step takes {} scalar arguments, about one per copy: a list (or tuple) of Python "
    "numbers passed to jit is a pytree, and each of its numbers is traced as an argument of "
    "its own, so code over it makes one operation per number and the program and its compile "
    "time grow with the list (there is no loop to rewrite). Pass it as one array "
    "(jnp.asarray(indices)): one argument, one operation (jax-ml/jax#5684).")
#: the fix of an unrolled loop whose iterations slice an array by the loop's index
SLICED_LOOP_FIX = (
    "its iterations slice an array by the loop's index (x[k:]: a shape that changes with k), "
    "so no one body fits every iteration as written. Keep whole rows and mask the part the "
    "slice left out (jnp.where(jnp.arange(n) >= k, row, 0)), or read a window of fixed size "
    "with jax.lax.dynamic_slice; then jax.lax.fori_loop(0, n, body, carry) compiles the body "
    "once (jax-ml/jax#2242).")


def unrolled_line(closed, least: int
                  ) -> tuple[tuple[str, int], int, int, int, bool, int, str, int] | None:
    """((file, line), its equations, the step's equations, the most times one of its equations
    recurs, whether a gather recurs there, the fewest times one of its repeated equations recurs
    with the same operand shapes (:func:`line_repeats`): under :data:`LOOP_REPEATS`, the loop's
    iterations differ in shape and ``jax.lax.scan`` cannot take them as they are,
    :data:`UNALIKE_LOOP_FIX`) of the line of the user's code that made the most equations, ``least``
    or more, of which one recurs :data:`LOOP_REPEATS` times or more outside ``jax.tree.map``: a
    Python loop inside jit, unrolled (counted before XLA fuses its copies: jax-ml/jax#891's 50
    lookups were 51 XLA operations, 900 equations and more), what made it repeat where not a
    loop over arrays alike (:func:`loop_kind`) and the step's scalar inputs; None where none
    does."""
    lines = line_repeats(closed)
    total = sum(len(getattr(j, "eqns", ())) for j, _ in walk(closed))
    found = [(key, n, repeats, gathers, alike)
             for key, (n, _, repeats, _, gathers, alike) in lines.items()
             if n >= least and repeats >= LOOP_REPEATS]
    if not found:
        return None
    key, n, repeats, gathers, alike = max(found, key=lambda f: f[1])
    return (key, n, total, repeats, gathers, alike, loop_kind(closed, key, repeats),
            scalar_inputs(closed))


#: the fix of an unrolled loop whose iterations differ in shape (a model's layers of different
#: widths): jax.lax.scan runs one body over arrays of one shape, so it cannot take them; the
#: many-leaves advice instead (jax-ml/jax#4667: one operation per array)
UNALIKE_LOOP_FIX = (
    "its iterations work on arrays of different shapes (layers of different widths), and "
    "jax.lax.scan runs one body over arrays of one shape, so it cannot take them as they are: "
    "stack the layers that share a shape into one array and scan over those, or use fewer, "
    "larger arrays (jax-ml/jax#4667).")


#: the primitives that write one step's value into a buffer, with the positions of the buffer
#: and the value among their operands: equinox's own ``maybe_set`` (pred, xs, x, i) is how
#: ``eqx.internal.while_loop`` (diffrax's ``SaveAt(steps=True)``, patrick-kidger/diffrax#238)
#: writes its buffers; it stays one equation in the jaxpr, and XLA makes it a select and a
#: dynamic-update-slice (diffrax 0.7.2, equinox 0.13.8, jax 0.10.2, the CPU program)
_ROW_WRITES = {"scatter": (0, 2), "dynamic_update_slice": (0, 1), "maybe_set": (1, 2)}


def _copied(j, var):
    """What ``var`` is once ``copy`` equations alone have passed it on (equinox copies the
    buffer its ``maybe_set`` wrote before the loop body returns it); ``var`` where none does."""
    while True:
        users = [e for e in j.eqns if any(x is var for x in e.invars)]
        if len(users) != 1 or users[0].primitive.name != "copy" or any(
                x is var for x in j.outvars):
            return var
        var = users[0].outvars[0]


def _row_writes(closed) -> Iterator[tuple[Any, Any, Any, int, int, int, Any, int]]:
    """(the jaxpr, the loop's equation, its body, its first carry's position among the body's
    inputs, its carries, the carry's number, the write, the position of the written value
    among the write's operands) of each buffer a loop carries and only writes, a row a step:
    what :func:`loop_records` describes."""
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            name = eqn.primitive.name
            if name == "while":
                body, first = eqn.params["body_jaxpr"], eqn.params["body_nconsts"]
                carries = len(eqn.outvars)
            elif name == "scan":
                body = eqn.params["jaxpr"]
                first, carries = jaxcompat.scan_counts(eqn.params)
            else:
                continue
            body = getattr(body, "jaxpr", body)
            for k, v in enumerate(body.invars[first:first + carries]):
                users = [e for e in body.eqns if any(x is v for x in e.invars)]
                if len(users) != 1 or users[0].primitive.name not in _ROW_WRITES:
                    continue
                write = users[0]
                into, value = _ROW_WRITES[write.primitive.name]
                if write.invars[into] is not v or _copied(body, write.outvars[0]) is not (
                        body.outvars[k]):
                    continue
                whole = v.aval
                step = write.invars[value].aval
                size, piece = math.prod(whole.shape), math.prod(step.shape)
                if piece == 0 or size // piece < 2 or size // piece not in whole.shape:
                    continue  # not one row of a dimension of steps
                yield j, eqn, body, first, carries, k, write, value


def loop_records(closed) -> tuple[tuple[str, tuple[int, ...], tuple[int, ...], str, int, str,
                                        str, int | None, bool], ...]:
    """(the loop's primitive, the buffer's shape, one step's shape, dtype, the buffer's bytes,
    the write's line, the write's primitive, the scan's steps: None for a ``while_loop``,
    whose buffer is sized by its bound, not by the steps it takes; whether the buffer's
    starting value is made in the step, not handed in) of each buffer a
    ``lax.while_loop`` or ``lax.scan`` (``lax.fori_loop``) carries and only writes: each step
    puts its value into one row (``.at[:, i].set(v)``, ``lax.dynamic_update_slice``, equinox's
    ``maybe_set``) and nothing in the body reads the buffer back, so it holds a value of every
    step (google-deepmind/gemma#534: a sampler's logits over the whole vocabulary, kept for
    every token; patrick-kidger/diffrax#238: ``SaveAt(steps=True)``, ``max_steps`` rows). A
    buffer the body reads (a KV cache) is not one. Largest first."""
    out = []
    for j, eqn, body, first, _, k, write, value in _row_writes(closed):
        name = eqn.primitive.name
        whole = body.invars[first + k].aval
        step = write.invars[value].aval
        size = math.prod(whole.shape)
        # the buffer's starting value: made in this jaxpr (zeros), or handed in (an
        # argument whose rows may already hold values: a prompt's before a decode)
        start = _carried_operands(eqn)[k]
        made_here = not any(start is x for x in getattr(j, "invars", ()))
        out.append((name, tuple(whole.shape), tuple(step.shape), str(whole.dtype),
                    size * whole.dtype.itemsize, equation_line(write),
                    write.primitive.name,
                    eqn.params["length"] if name == "scan" else None, made_here))
    return tuple(sorted(out, key=lambda r: -r[4]))


def _moved_back(var, made: dict, moves: tuple[str, ...]):
    """What ``var`` was before equations of ``moves`` (``made``: each value's equation, by id)
    passed it on."""
    while (e := made.get(id(var))) is not None and e.primitive.name in moves:
        var = e.invars[0]
    return var


def unchanged_in_rows(closed) -> dict[tuple[tuple[int, ...], str], int]:
    """For each buffer :func:`loop_records` lists, by (its shape, the write's line): how many
    of the values of each row it writes are values the loop carries unchanged (a carry its
    body returns as it took it, or a constant of the body: JAX moves a carry no step changes
    into the constants), cut, reshaped or cast and concatenated into the row: the same in every
    row (pyro-ppl/numpyro#539: 8,192 of each 8,325, the dense mass matrix and its square root
    in every sample's HMC state). 0 where the row is made otherwise."""
    moves = (*_MOVES, "convert_element_type")
    out: dict[tuple[tuple[int, ...], str], int] = {}
    for _, _, body, first, carries, k, write, value in _row_writes(closed):
        same = {id(v) for v in body.invars[:first]} | {
            id(v) for i, v in enumerate(body.invars[first:first + carries])
            if body.outvars[i] is v}
        made = {id(o): e for e in body.eqns for o in e.outvars}
        row = _moved_back(write.invars[value], made, moves)
        joined = made.get(id(row))
        parts = joined.invars if joined is not None and (
            joined.primitive.name == "concatenate") else [row]
        n = sum(math.prod(getattr(p.aval, "shape", ())) for p in parts
                if not hasattr(p, "val") and id(_moved_back(p, made, moves)) in same)
        out[(tuple(body.invars[first + k].aval.shape), equation_line(write))] = n
    return out


def carry_lines(closed, shape: tuple[int, ...]) -> list[str]:
    """The user's lines of each ``lax.scan`` or ``lax.while_loop`` (``lax.fori_loop``) that
    carries a value of ``shape`` (where a loop XLA copies a carried value of that shape comes
    from), those with a line first ("" for one without); [] where none carries it (a loop XLA
    made itself: threefry2x32's rounds on the CPU)."""
    out = []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if any(tuple(getattr(v.aval, "shape", ())) == tuple(shape)
                   for v in _carried_operands(eqn)):
                out.append(equation_line(eqn))
    return sorted(out, key=lambda line: not line)


def widened_carries(closed) -> tuple[tuple[str, str, str, int, int, int], ...]:
    """(the scan's line, the carry's dtype, the arguments' dtype, the carry's bytes of those
    shapes, the arguments' bytes of them, how many leaves) of each ``lax.scan`` whose body
    takes a gradient (a transpose in its name stack) and whose carry holds floating values
    with the shapes of the step's arguments in a wider dtype than any argument of that shape
    (a gradient accumulator in float32 beside bfloat16 parameters: AI-Hypercomputer/maxtext
    #5039, where the PR allocates it in the gradients' dtype). Largest first."""
    if closed is None:
        return ()
    dtypes: dict[tuple[int, ...], set] = {}
    for v in getattr(closed, "jaxpr", closed).invars:
        if hasattr(v.aval, "shape") and _floating(v.aval.dtype) and v.aval.shape:
            dtypes.setdefault(tuple(v.aval.shape), set()).add(v.aval.dtype)
    out = []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            # (a scan of one step XLA unrolls into the step: the sum is the gradient itself,
            # measured at no cost on the CPU)
            if eqn.primitive.name != "scan" or scan_role(eqn) == "backward" or eqn.params.get(
                    "length", 2) < 2 or not any(
                    "transpose(" in str(getattr(e.source_info, "name_stack", ""))
                    for sub, _ in walk(eqn.params["jaxpr"]) for e in sub.eqns):
                continue
            wide = [v.aval for v in _carried_operands(eqn)
                    if hasattr(v.aval, "shape") and _floating(v.aval.dtype)
                    and (mine := dtypes.get(tuple(v.aval.shape)))
                    and v.aval.dtype not in mine
                    and all(d.itemsize < v.aval.dtype.itemsize for d in mine)]
            if not wide:
                continue
            narrow = min(dtypes[tuple(wide[0].shape)], key=lambda d: d.itemsize)
            out.append((equation_line(eqn), str(wide[0].dtype), str(narrow),
                        sum(math.prod(a.shape) * a.dtype.itemsize for a in wide),
                        sum(math.prod(a.shape) * narrow.itemsize for a in wide), len(wide)))
    return tuple(sorted(out, key=lambda x: -x[3]))


def _carried_operands(eqn) -> list:
    """The operands a ``lax.scan`` or ``lax.while_loop`` equation starts its carry from (after
    its constants); [] for any other equation."""
    if eqn.primitive.name == "scan":
        first, n = jaxcompat.scan_counts(eqn.params)
    elif eqn.primitive.name == "while":
        first, n = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"], len(eqn.outvars)
    else:
        return []
    return list(eqn.invars[first:first + n])


def cast_before_scan(closed) -> tuple[tuple[str, str, tuple[int, ...], int, str, str, str],
                                        ...]:
    """(dtype, narrower dtype, shape, the cast's bytes, the cast's line, the scan's line, the
    scan's role) of each input of a jaxpr cast whole to a narrower floating type and then read
    by a ``lax.scan`` one step at a time: the cast copy of every step is made before the loop
    and held through it (marin-community/levanter#426: a model cast to bfloat16, then a loop
    over its layers). Largest first."""
    out = []
    for j, _ in walk(closed):
        inputs = {id(v) for v in getattr(j, "invars", ())}
        casts = {}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name == "convert_element_type" and id(eqn.invars[0]) in inputs:
                before, after = eqn.invars[0].aval, eqn.outvars[0].aval
                if (_floating(before.dtype) and _floating(after.dtype)
                        and after.dtype.itemsize < before.dtype.itemsize and after.shape):
                    casts[id(eqn.outvars[0])] = (eqn, before, after)
            elif eqn.primitive.name == "scan" and casts:
                first = sum(jaxcompat.scan_counts(eqn.params))
                for v in eqn.invars[first:]:
                    if id(v) in casts:
                        cast, before, after = casts[id(v)]
                        out.append((str(before.dtype), str(after.dtype), tuple(after.shape),
                                    math.prod(after.shape) * after.dtype.itemsize,
                                    equation_line(cast), equation_line(eqn), scan_role(eqn)))
    return tuple(sorted(out, key=lambda x: -x[3]))


def threefry_draws(closed) -> tuple[tuple[tuple[int, ...], int, str], ...]:
    """(shape, bytes, line) of each ``jax.random`` draw of the step made through the
    threefry2x32 generator (JAX's default), largest first: its uint32 bits, which XLA may hold
    several times over while making them (jax-ml/jax#20328)."""
    from jax.extend import core

    out = []
    # (a jaxpr, the user's line of the equation that holds it): jax.random.normal's own jit
    # keeps too short a traceback on jax 0.10.2 to reach the user's frame, its caller's does
    stack = [(closed, "")] if closed is not None else []
    while stack:
        j, above = stack.pop()
        for eqn in getattr(getattr(j, "jaxpr", j), "eqns", ()):
            line = equation_line(eqn) or above
            if eqn.primitive.name == "random_bits" and str(
                    eqn.invars[0].aval).startswith("key<fry>"):
                aval = eqn.outvars[0].aval
                out.append((tuple(aval.shape), math.prod(aval.shape) * aval.dtype.itemsize,
                            line))
            for v in eqn.params.values():
                stack += [(sub, line) for sub in (v if isinstance(v, (tuple, list)) else (v,))
                          if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr))]
    return tuple(sorted(out, key=lambda x: -x[1]))


def scatters_batched(closed) -> dict[str, str]:
    """The user's line of each scatter (an ``.at[...]`` update) that jax.vmap batched, and what
    it batched: "index" where the scatter's indices carry the batch (its
    ``scatter_indices_batching_dims``), "update value" where only the value does (a constant
    index, jax-ml/jax#23358's ``x.at[9].set(i)``); jax 0.8.0 and 0.10.2 alike."""
    out: dict[str, str] = {}
    for j, _ in walk(closed):
        for eqn in j.eqns:
            if not eqn.primitive.name.startswith("scatter") or "vmap(" not in str(
                    eqn.source_info.name_stack):
                continue
            dims = eqn.params.get("dimension_numbers")
            which = ("index" if getattr(dims, "scatter_indices_batching_dims", ())
                     else "update value")
            line = equation_line(eqn)
            if out.get(line, which) != which:
                which = "index or update value"
            out[line] = which
    return out


#: where JAX's own functions live (jnp, lax, jax.nn, jax.scipy, jax.random, ...): a jax.vmap one
#: of them calls is JAX's, not the user's (jax.nn.dot_product_attention's over its query
#: groups, of one element: google/flax#2858); JAX's tracing machinery (jit, grad, linear_util)
#: calling a vmap the user made, and jax.jacfwd, jacrev, hessian and jnp.vectorize, which
#: batch for the user (api.py, vectorize.py), are not
_JAX_FUNCTIONS = re.compile(r"jax/(_src/(nn|numpy|lax|scipy|image|ops|cudnn|pallas)/|"
                            r"_src/random\.py|experimental/)")
_VECTORIZE = "jax/_src/numpy/vectorize.py"
#: operations that only cut, reshape or cast a value: under a vmap, no larger in chunks
_RELAYOUTS = frozenset({"split", "slice", "dynamic_slice", "reshape", "squeeze", "expand_dims",
                        "convert_element_type", "copy", "copy_p", "transpose", "concatenate",
                        "bitcast_convert_type", "pad"})


def _vmaps(tb) -> list[tuple[tuple, bool]]:
    """Each jax.vmap around an equation made with the traceback ``tb``, innermost first: (what
    names its call: the call stack from JAX's ``vmap_f`` out to the user's first frame, which
    an inner jit's jaxpr traced at an earlier call of the step shares; whether the user asked
    for it: no function of JAX's own (:data:`_JAX_FUNCTIONS`) sits between it and the user's
    code)."""
    try:
        fs = list(tb.frames) if tb is not None else []
    except Exception:  # a traceback that cannot say
        return []
    out = []
    for i, f in enumerate(fs):
        if not (f.function_name.endswith("vmap_f")
                and f.file_name.replace("\\", "/").endswith("jax/_src/api.py")):
            continue
        users, end = True, len(fs)
        for at in range(i + 1, len(fs)):
            name = fs[at].file_name.replace("\\", "/")
            if frames.is_user_file(fs[at].file_name):
                end = at + 1
                break
            if users and _JAX_FUNCTIONS.search(name) and not name.endswith(_VECTORIZE):
                users = False
        out.append((tuple((c.file_name, c.line_num) for c in fs[i:end]), users))
    return out


def _relayout(eqn) -> bool:
    """An equation that only cuts, reshapes or casts (:data:`_RELAYOUTS`), or an inner jit of
    such equations alone."""
    if eqn.primitive.name in _RELAYOUTS:
        return True
    subs = [getattr(sub, "jaxpr", sub) for value in eqn.params.values()
            for sub in (value if isinstance(value, (tuple, list)) else (value,))
            if hasattr(getattr(sub, "jaxpr", sub), "eqns")]
    return bool(subs) and all(_relayout(e) for sub in subs for e in sub.eqns)


def vmapped_lines(closed) -> dict[str, tuple[tuple[frozenset[int], ...], bool]]:
    """Per user's line (as :func:`equation_line` names it) with equations under a jax.vmap the
    user asked for: (for each such vmap, the sizes its batch may have: the leading size of
    the outputs of its forward pass where they all have one (out_axes=0), else the sizes every
    one of them has, an empty set where they share none; whether those equations only
    cut, reshape or cast values, :data:`_RELAYOUTS`: ``jax.vmap(unravel)(rows)`` of
    ``ravel_pytree``, pyro-ppl/numpyro#539). A line whose values only JAX's own vmaps made
    (jax.nn.dot_product_attention's, google/flax#2858) is not listed. A vmap applied to
    equations traced before it (jax.jacrev's, of the pullback) is not on their call stacks:
    counted as the user's, its size not known."""
    sizes: dict[tuple, tuple[set[int], frozenset[int]]] = {}  # (leading sizes, common sizes)
    lines: dict[str, list] = {}  # line: [its vmaps, only relayouts]
    seen: dict[Any, list[tuple[tuple, bool]]] = {}  # per traceback: its vmaps

    def vmaps(e) -> list[tuple[tuple, bool]]:
        tb = getattr(e.source_info, "traceback", None)
        if tb not in seen:
            seen[tb] = _vmaps(tb)
        return seen[tb]

    def visit(j, around: set) -> None:
        eqns = list(getattr(j, "eqns", ()))
        regions = [{key for key, _ in vmaps(e)} for e in eqns]
        outside: dict[int, list[set]] = {}  # var: the vmaps of each equation that reads it
        for e, regs in zip(eqns, regions, strict=True):
            for v in e.invars:
                if not hasattr(v, "val"):
                    outside.setdefault(id(v), []).append(regs)
        for v in getattr(j, "outvars", ()):
            if not hasattr(v, "val"):
                outside.setdefault(id(v), []).append(around)
        for e, regs in zip(eqns, regions, strict=True):
            users = [key for key, asked in vmaps(e) if asked]
            if str(e.source_info.name_stack).count("vmap(") > len(regs):
                # a vmap of equations traced before it, whose call stacks do not show it
                # (jax.jacrev's of its pullback): the user's, of a size not known here
                users.append(())
            if users and (line := equation_line(e)):
                entry = lines.setdefault(line, [set(), True])
                entry[0].update(users)
                entry[1] = entry[1] and _relayout(e)
            if "transpose(" not in str(e.source_info.name_stack):
                for key in regs:
                    for v in e.outvars:
                        shape = tuple(int(d) for d in getattr(v.aval, "shape", ()))
                        if any(key not in r for r in outside.get(id(v), ())):
                            lead, common = sizes.setdefault(key, (set(), frozenset(shape)))
                            lead.add(shape[0] if shape else -1)
                            sizes[key] = (lead, common & frozenset(shape))
            for value in e.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        visit(inner, regs)

    visit(getattr(closed, "jaxpr", closed), set())
    def batch(key: tuple) -> frozenset[int]:
        lead, common = sizes.get(key, (set(), frozenset()))
        return frozenset(lead) if len(lead) == 1 and -1 not in lead else common

    return {line: (tuple(batch(key) for key in keys), only) for line, (keys, only) in lines.items()}


def batch_reductions(closed) -> tuple[tuple[tuple[int, ...], int, str], ...]:
    """(shape, bytes, line) of each sum over the leading axis outside any jax.vmap (a
    ``.sum(0)`` or ``.mean(0)`` of what a vmap stacked: per-example gradients averaged,
    google/flax#1852), largest first: values lax.map(f, xs, batch_size=k) would still stack
    whole, where a scan that adds each chunk's sum into its carry keeps one chunk."""
    out = []
    for j, _ in walk(closed):
        for eqn in j.eqns:
            if (eqn.primitive.name != "reduce_sum" or 0 not in tuple(eqn.params.get("axes", ()))
                    or "vmap(" in str(eqn.source_info.name_stack)):
                continue
            aval = eqn.invars[0].aval
            out.append((tuple(aval.shape), math.prod(aval.shape) * aval.dtype.itemsize,
                        equation_line(eqn)))
    return tuple(sorted(out, key=lambda x: -x[1]))


def sparse_products(closed) -> tuple[tuple[str, str, int, int, int, int, int, int, int], ...]:
    """Each product of a ``jax.experimental.sparse`` BCOO matrix in the step: (``"dense"`` for
    BCOO @ dense, ``"sparse"`` for BCOO @ BCOO, the user's line, the left operand's stored
    elements, the right's stored elements or dense columns, the elements of the dense product,
    the elements of the left's dense shape, the values it stores, the bytes of its values and
    indices, the bytes of its dense form).
    BCOO @ dense gathers a row of the dense operand per stored element (nse x p values:
    jax-ml/jax#14642); BCOO @ BCOO pairs every stored element of one with every one of the
    other (nse_a x nse_b: jax-ml/jax#14821); a left operand that stores as many values as its
    dense shape has elements is a dense matrix in a sparse wrapper (MIT-Lu-Lab/MPAX#24)."""
    out = []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            name = eqn.primitive.name
            if name not in ("bcoo_dot_general", "bcoo_spdot_general"):
                continue
            try:
                data, indices = eqn.invars[0].aval, eqn.invars[1].aval
                lhs_nse = data.shape[-1]
                rhs = eqn.invars[2].aval.shape  # BCOO @ BCOO: the right's data, [nse]
                if name == "bcoo_dot_general":
                    other, dense_out = math.prod(rhs[1:]), math.prod(eqn.outvars[0].aval.shape)
                else:
                    other, dense_out = rhs[-1], math.prod(_product_shape(eqn))
                whole = math.prod(eqn.params["lhs_spinfo"].shape)
                stored = (math.prod(data.shape) * data.dtype.itemsize
                          + math.prod(indices.shape) * indices.dtype.itemsize)
            except Exception:  # a form of these primitives this reader does not know
                continue
            out.append(("dense" if name == "bcoo_dot_general" else "sparse",
                        equation_line(eqn), int(lhs_nse), int(other), int(dense_out),
                        int(whole), int(math.prod(data.shape)), int(stored),
                        int(whole * data.dtype.itemsize)))
    return tuple(out)


def _product_shape(eqn) -> tuple[int, ...]:
    """The dense shape of a BCOO @ BCOO product: the left's rows by the right's columns (its
    spinfo shapes, contracted over the dimension numbers' contracting dimensions)."""
    (lc, rc), _ = eqn.params["dimension_numbers"]
    lhs = eqn.params["lhs_spinfo"].shape
    rhs = eqn.params["rhs_spinfo"].shape
    return (tuple(d for i, d in enumerate(lhs) if i not in lc)
            + tuple(d for i, d in enumerate(rhs) if i not in rc))


#: a ``device=`` keyword given to a jnp creation in a line of the user's code (the text up to
#: the next comma or paren; not ``device == ...``, not ``device=None``)
_DEVICE_KEYWORD = re.compile(
    r"\b(?:zeros|ones|full|empty|arange|eye|identity|linspace|zeros_like|ones_like|full_like|"
    r"empty_like)\([^#]*?\b(device\s*=(?!=)\s*(?!None\b)[^,)\s]+)")


def device_keywords_and_puts(closed, dev, device_type: type) -> tuple[tuple, tuple, tuple]:
    """((device, line) of each ``jax.device_put`` inside the step to a Device other than
    ``dev``, ("device=...", line) of each line that gives a jnp creation a ``device=``,
    (the sharding's spec, line, the step's output it is or None) of each device_put to a
    NamedSharding that splits the value over a mesh of Auto axes).

    jit ignores the first two (jax 0.8 and 0.10 alike): the value stays, uncommitted, where
    the step runs. The third places the step over the mesh's devices but lowers no sharding:
    the value comes back whole on each (jax 0.8.0 and 0.10.2, checked on the CPU; on a mesh
    of Explicit axes 0.10.2 splits it, 0.8.0 not: such a mesh is not listed, nor a sharding
    to another memory kind). A device_put to a SingleDeviceSharding or a memory kind is
    honoured, and not listed; so is ``jnp.asarray(x, device=d)``, which becomes a sharding
    constraint. ``device_type``: ``jax.Device``."""
    puts, put_lines, keywords, looked, unsplit = [], set(), {}, set(), []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            line = equation_line(eqn)
            if eqn.primitive.name in ("device_put", "sharding_constraint"):
                put_lines.add(line)
                puts += [(device_name(d), line) for d in eqn.params.get("devices", ())
                         if isinstance(d, device_type) and d != dev]
                if eqn.primitive.name == "device_put":
                    unsplit += [(str(d.spec), line, id(out)) for d, out
                                in zip(eqn.params.get("devices", ()), eqn.outvars,
                                       strict=False)
                                if _splits_over_auto_axes(d)]
            elif line and line not in looked:
                looked.add(line)  # (the whole call: black spreads a long one over lines)
                if said := _DEVICE_KEYWORD.search(_statement(*_user_frame(eqn))):
                    keywords[line] = said.group(1)
    # a creation's `device=` (jnp.zeros(n, device=d)) leaves nothing in the program: JAX drops
    # it and makes the value where the step runs (jax 0.8.0 and 0.10.2 alike, a Sharding too;
    # lax.full's docstring: "sharding will currently be ignored in jitted mode")
    dropped = tuple((said, line) for line, said in keywords.items() if line not in put_lines)
    outputs = _output_positions(closed)  # the value put is read back from the program's output
    return tuple(puts), dropped, tuple((spec, line, outputs.get(v)) for spec, line, v in unsplit)


def _output_positions(closed) -> dict[int, int]:
    """id of a variable -> the step's output it is, for the top jaxpr's outputs and, through
    an inner jit or remat that makes one, its body's."""
    jaxpr = getattr(closed, "jaxpr", None)
    out: dict[int, int] = {}
    if jaxpr is None:
        return out
    made, _ = _index(jaxpr)
    for n, v in enumerate(jaxpr.outvars):
        out[id(v)] = n
        eqn = made.get(id(v))
        body = _called(eqn) if eqn is not None else None
        if body is not None:
            at = next(i for i, w in enumerate(eqn.outvars) if w is v)
            out[id(body.outvars[at])] = n
    return out


def _splits_over_auto_axes(sharding) -> bool:
    """A NamedSharding that names a mesh axis of more than one device, on a mesh whose axes
    are all Auto (jax's default for Mesh(...))."""
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or spec is None or getattr(sharding, "memory_kind", None) not in (
            None, "device"):
        return False
    try:
        sizes = dict(mesh.shape)
        types = [str(t).rsplit(".", 1)[-1] for t in getattr(mesh, "axis_types", ())]
        named = [a for part in spec if part is not None
                 for a in (part if isinstance(part, tuple) else (part,))]
    except Exception:  # an abstract mesh or a spec this reading does not know
        return False
    return bool(types) and all(t == "Auto" for t in types) and any(
        sizes.get(a, 1) > 1 for a in named)


def jacobian_sizes(closed) -> list[tuple[str, int, int, int, str]]:
    """(mode, outputs, inputs, the identity's bytes, line) of each ``jax.jacrev`` ("reverse")
    and ``jax.jacfwd`` ("forward") in the step, per call (its mode and user line). Read from
    JAX's own functions in each equation's traceback: the identity's bytes from
    ``_std_basis``; from the split of each unravel, the other sizes. jacrev's is (outputs,
    *an input's shape), once per input; jacfwd's (*an output's shape, inputs), once per output
    (jax/_src/api.py, _jacrev_unravel and _jacfwd_unravel; jax 0.8.0 and 0.10.2 alike). Under
    an enclosing vmap (``jax.hessian``) shapes carry its batch: skipped."""
    found: dict[tuple[str, str], list[int]] = {}  # (mode, line): [outputs, inputs, basis]
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            names = _frame_names(eqn)
            mode = next(("reverse" if n.startswith("jacrev.") else "forward" for n in names
                         if n.startswith(("jacrev.", "jacfwd."))), "")
            if not mode or "vmap(" in str(eqn.source_info.name_stack):
                continue
            sizes = found.setdefault((mode, equation_line(eqn)), [0, 0, 0])
            if "_std_basis" in names:
                sizes[2] = max([sizes[2]] + [math.prod(v.aval.shape) * v.aval.dtype.itemsize
                                             for v in eqn.outvars])
            elif eqn.primitive.name == "split" and eqn.invars and (
                    "_jacrev_unravel" in names or "_jacfwd_unravel" in names):
                shape = tuple(getattr(eqn.invars[0].aval, "shape", ()))
                if not shape:
                    continue
                if mode == "reverse":
                    sizes[0], sizes[1] = shape[0], sizes[1] + math.prod(shape[1:])
                else:
                    sizes[0], sizes[1] = sizes[0] + math.prod(shape[:-1]), shape[-1]
    return [(mode, outputs, inputs, basis, line)
            for (mode, line), (outputs, inputs, basis) in found.items()
            if basis and outputs and inputs]


#: what a Jacobian's value may pass through between JAX's unravel and the user's product, each
#: keeping its dimensions in order (a transpose would swap which side the product is on: J.T @
#: u is u @ J; not followed)
_RESHAPING = frozenset({"reshape", "convert_element_type", "copy", "squeeze", "expand_dims"})


def jacobian_products(closed) -> list[tuple[str, str, tuple[int, ...], str, int, int, str,
                                            str, bool]]:
    """(kind, side, the Jacobian's shape, its dtype, its bytes, the product's bytes, the
    Jacobian's line, the product's line, whether the product is batched) of each whole
    Jacobian that the step only multiplies by a vector (jax-ml/jax#2937:
    ``jax.vmap(jax.hessian(V))(xs)`` then contracted with one vector per point). kind:
    "hessian" (``jax.jacfwd`` of ``jax.jacrev``, what ``jax.hessian`` is), "forward" or
    "reverse"; side: "right" where the product contracts the Jacobian's
    input dimensions (J @ v, a ``jax.jvp``), "left" where its outputs' (u @ J, a
    ``jax.vjp``). The Jacobian is the output of JAX's ``_jacfwd_unravel`` or
    ``_jacrev_unravel`` (jax/_src/api.py), read through reshapes (:data:`_RESHAPING`); the vector
    is a ``dot_general`` operand with no dimension of its own left in the product (one
    vector per point where the product is batched, as an einsum ``'nij,nj->ni'`` is)."""
    found = []
    for j, _ in walk(closed):
        eqns = getattr(j, "eqns", ())
        made_by, read = _index(j)
        returned = Counter(id(v) for v in getattr(j, "outvars", ()))
        inner_reverse = None  # read once, where a jacfwd's product is found
        for eqn in eqns:
            if eqn.primitive.name != "dot_general" or any(
                    n.endswith("jacfun") for n in _frame_names(eqn)):
                continue
            (contract, batch) = eqn.params["dimension_numbers"]
            for side in (0, 1):
                other = 1 - side
                o_shape = tuple(getattr(eqn.invars[other].aval, "shape", ()))
                if math.prod(d for k, d in enumerate(o_shape)
                             if k not in contract[other] and k not in batch[other]) != 1:
                    continue  # a matrix on the other side: a product of Jacobians, not a vector
                var, source, alone = eqn.invars[side], None, True
                for _ in range(6):
                    alone = alone and len(read.get(id(var), ())) == 1 and not returned[id(var)]
                    source = made_by.get(id(var))
                    if source is None or source.primitive.name not in _RESHAPING or \
                            {"_jacfwd_unravel", "_jacrev_unravel"} & set(_frame_names(source)):
                        break
                    var = source.invars[0]
                if not alone:
                    continue  # the Jacobian is needed as well: not only for this product
                names = set(_frame_names(source)) if source is not None else set()
                mode = ("forward" if "_jacfwd_unravel" in names else
                        "reverse" if "_jacrev_unravel" in names else "")
                if not mode:
                    continue
                aval = eqn.invars[side].aval
                shape = tuple(aval.shape)
                free = [k for k in range(len(shape)) if k not in batch[side]]
                contracted = sorted(contract[side])
                right = contracted == free[len(free) - len(contracted):]
                line = equation_line(source)
                out = eqn.outvars[0].aval
                if mode == "forward" and inner_reverse is None:
                    # jax.hessian is jacfwd(jacrev(f)): the inner unravel, under the outer jacfun
                    inner_reverse = {equation_line(e) for e in eqns
                                     if {"_jacrev_unravel", "jacfwd.<locals>.jacfun"} <= set(
                                         _frame_names(e))}
                found.append((
                    "hessian" if mode == "forward" and line in inner_reverse else mode,
                    "right" if right else "left", shape, str(aval.dtype),
                    math.prod(shape) * aval.dtype.itemsize,
                    math.prod(out.shape) * out.dtype.itemsize, line, equation_line(eqn),
                    bool(batch[side])))
    return sorted(found, key=lambda f: -f[4])


def _zero_literal(v) -> bool:
    """A jaxpr operand that is the literal 0 (a Python 0.0 the step multiplies by)."""
    val = getattr(v, "val", None)  # a Var has none
    try:
        return val is not None and np.ndim(val) == 0 and float(val) == 0.0
    except (TypeError, ValueError):  # a value that is no number
        return False


def scaled_by_zero(closed) -> tuple[tuple[str, int, str], ...]:
    """("float32[512, 512]", bytes, line) of each floating array the step computes and then
    multiplies by the constant 0.0, largest first. An argument times 0.0 (a weight decay of
    0.0) is not listed: nothing is computed for it; nor an integer, which XLA folds."""
    out = []
    for j, _ in walk(closed):
        made = {id(v) for eqn in getattr(j, "eqns", ()) for v in eqn.outvars}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "mul" or not any(_zero_literal(v) for v in eqn.invars):
                continue
            aval = eqn.outvars[0].aval
            computed = any(id(v) in made for v in eqn.invars)
            if computed and getattr(aval, "shape", ()) and _floating(aval.dtype):
                out.append((f"{aval.dtype}{list(aval.shape)}",
                            math.prod(aval.shape) * aval.dtype.itemsize, equation_line(eqn)))
    return tuple(sorted(out, key=lambda x: -x[1]))


#: primitives that call a jaxpr with their own operands, one for one, and return its outputs:
#: an inner jit, a remat, a custom derivative's function (not a scan, a loop or a branch, whose
#: body runs per step or per case)
_CALLS = ("pjit", "jit", "closed_call", "core_call", *_REMATS, "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr")


def _called(eqn):
    """The jaxpr an inner jit or remat equation calls with its operands, one for one (None for
    any other equation, or one whose counts do not match)."""
    from jax.extend import core

    if eqn.primitive.name not in _CALLS:
        return None
    inner = next((p for k in ("jaxpr", "call_jaxpr", "fun_jaxpr")
                  if isinstance(p := eqn.params.get(k), (core.ClosedJaxpr, core.Jaxpr))), None)
    body = inner.jaxpr if isinstance(inner, core.ClosedJaxpr) else inner
    if body is None or len(body.invars) != len(eqn.invars) or \
            len(body.outvars) != len(eqn.outvars):
        return None
    return body


def _index(j) -> tuple[dict, dict]:
    """(id of a variable -> the equation that makes it, id -> the equations that read it), for
    one jaxpr: made once, so each question about a variable is a lookup."""
    made, read = {}, {}
    for eqn in j.eqns:
        for v in eqn.outvars:
            made[id(v)] = eqn
        for v in eqn.invars:
            if not hasattr(v, "val"):  # a Literal is no variable
                read.setdefault(id(v), []).append(eqn)
    return made, read


def narrowed_inputs(closed) -> tuple[tuple[int, str, str], ...]:
    """(the input's position among the jaxpr's inputs, the dtype it is cast to, the line) of
    each floating input the step reads only through a cast to a narrower floating type
    (float32 parameters under a bfloat16 computation, huggingface/transformers#12534): never
    as it is. Followed into inner jits and remats, and into a scan's body for its constants and
    what it scans (stacked layers); any other use (returned, a scan's carry, read at full
    width) keeps an input off the list."""
    indexes: dict[int, tuple[dict, dict]] = {}

    def uses(j, var) -> list[tuple[str, str]] | None:
        """[(dtype, line)] of each use of ``var`` in ``j``, all narrowing casts; else None."""
        if any(v is var for v in getattr(j, "outvars", ())):
            return None
        if id(j) not in indexes:
            indexes[id(j)] = _index(j)
        _, read = indexes[id(j)]
        found = []
        for eqn in dict.fromkeys(read.get(id(var), [])):  # (an equation reading it twice)
            if eqn.primitive.name == "scan":  # its constants and the slices of what it scans,
                body = eqn.params["jaxpr"].jaxpr  # not its carry (whose type must not change)
                consts, carry = jaxcompat.scan_counts(eqn.params)
                for i, v in enumerate(eqn.invars):
                    if v is not var:
                        continue
                    below = None if consts <= i < consts + carry else uses(body, body.invars[i])
                    if below is None:
                        return None
                    found += below
                continue
            body = _called(eqn)
            if body is not None:
                for i, v in enumerate(eqn.invars):
                    if v is var:
                        below = uses(body, body.invars[i])
                        if below is None:
                            return None
                        found += below
                continue
            to = eqn.params.get("new_dtype") if eqn.primitive.name == "convert_element_type" \
                else None
            if to is None or not _floating(to) or \
                    np.dtype(to).itemsize >= var.aval.dtype.itemsize:
                return None
            found.append((str(np.dtype(to)), equation_line(eqn)))
        return found

    jaxpr = getattr(closed, "jaxpr", None)
    out = []
    for n, var in enumerate(getattr(jaxpr, "invars", ())):
        dtype = getattr(var.aval, "dtype", None)
        if dtype is None or not _floating(dtype) or not var.aval.shape:
            continue
        found = uses(jaxpr, var)
        if found:  # (an input never read at all is XLA's to drop: not listed)
            out.append((n, found[0][0], found[0][1]))
    return tuple(out)


#: what the user called where jnp promotes its operands to one dtype: an operator (a / b,
#: a @ b: JAX's array methods) or a jnp ufunc (jnp.multiply), and these jnp functions. A cast
#: made under any other call is the user's own (x.astype, jnp.asarray(x, dtype),
#: jnp.float32(x), lax.convert_element_type) or a library's on purpose (jnp.mean and
#: jax.nn.softmax sum bfloat16 in float32): read from the traceback, jax 0.8.0 and 0.10.2
_PROMOTING_CALLS = ("_forward_operator_to_aval.<locals>.op", "ufunc.__call__")
_PROMOTING_FUNCTIONS = ("matmul", "dot", "einsum", "inner", "outer", "tensordot", "vdot",
                        "where", "concatenate", "stack", "kron")
#: the operations whose width sets the step's cost: a widened value that reaches one is worth
#: a word
_PRODUCTS = ("dot_general", "conv_general_dilated")


def _promoted(eqn) -> bool:
    """Whether the user's call that made ``eqn`` is one where jnp promotes its operands to
    one dtype (an operator, a jnp ufunc, jnp.matmul or jnp.where), not an explicit cast."""
    made = _traceback_frames(eqn)
    at = next((n for n, f in enumerate(made) if frames.is_user_file(f.file_name)), 0)
    if not at:
        return False
    called = made[at - 1]  # the function the user's line called (innermost first)
    return called.function_name in _PROMOTING_CALLS or (
        called.function_name in _PROMOTING_FUNCTIONS and "numpy" in called.file_name)


def _has_product(sub, cache: dict) -> bool:
    """Whether a jaxpr, or one nested in it, computes a dot or a convolution."""
    if id(sub) not in cache:
        cache[id(sub)] = any(e.primitive.name in _PRODUCTS for j, _ in walk(sub)
                             for e in getattr(j, "eqns", ()))
    return cache[id(sub)]


def _reaches_product(var, read: dict, cache: dict) -> bool:
    """Whether ``var``, or a value computed from it in its jaxpr, is read by a dot or a
    convolution (in an inner jit, a remat or a loop's body too) of the forward computation:
    the walk stops at a derivative's backward pass (an equation whose name stack says
    transpose, jax 0.8.0 and 0.10.2), whose weight-gradient dots read every residual (a
    bfloat16 output against float32 labels in a float32 loss reaches no forward dot)."""
    from jax.extend import core

    stack, seen = [var], set()
    while stack:
        v = stack.pop()
        for eqn in read.get(id(v), []):
            if id(eqn) in seen or scan_role(eqn) == "backward":
                continue
            seen.add(id(eqn))
            if eqn.primitive.name in _PRODUCTS or any(
                    _has_product(p, cache) for p in eqn.params.values()
                    if isinstance(p, (core.ClosedJaxpr, core.Jaxpr))):
                return True
            stack += eqn.outvars
    return False


def widened_inputs(closed) -> tuple[tuple[int | None, str, str, tuple[int, ...], int, str,
                                          str, int | None], ...]:
    """(the input's position among the jaxpr's inputs, None for a value computed from them;
    its dtype; the wider dtype it is read as; its shape; its bytes at the wider dtype; the
    user's line; what widens it: "constant" (a literal or a closed-over array, such as a NumPy
    float64 scalar under x64: jax-ml/jax#1830) or "argument" (a value of the arguments: a
    float32 batch against bfloat16 parameters, jax-ml/jax#7368); that value's position among
    the inputs, or None) of each floating value computed from the step's arguments that jnp's
    promotion widens at the user's operator or jnp call (a ``convert_element_type``, or a
    ``dot_general`` of two dtypes) and that then reaches a dot or a convolution, outside a
    derivative's backward pass; followed into inner jits, remats and loops' bodies. The mirror
    of :func:`narrowed_inputs`. Not a cast the user wrote (astype, jnp.asarray(x, dtype)) nor
    a library's own (jnp.mean of bfloat16), not one that only feeds an elementwise update (a
    bfloat16 gradient added to float32 master weights), and not one whose wider operand is
    itself a widening's result (its cause is named). Whether the wider operand is an argument
    or a constant is decided after the walk (a bias broadcast after the widening is still an
    argument's, fp1 of the code review), and it is traced to the input it moves or reshapes
    (a float32 bias ``b`` added to a bfloat16 activation names ``b``). Largest first."""
    top = getattr(closed, "jaxpr", closed)
    cache: dict = {}
    found_all, seen = [], set()

    def visit(j, derived: set[int], wide: set[int], origin: dict[int, int]) -> None:
        """``derived``: the ids of values computed from the step's arguments (not from
        constants alone); ``wide``: of values computed from a widening's result; ``origin``:
        the step's input each value is, by position."""
        made, read = _index(j)
        for eqn in j.eqns:
            found = _widening(eqn, read)
            if found is not None and id(found[0]) in derived and id(found[2]) not in wide \
                    and scan_role(eqn) != "backward" and _promoted(eqn):
                var, to, other = found
                wide.update(id(v) for v in eqn.outvars)
                line = equation_line(eqn)
                if (eqn.primitive.name == "dot_general"
                        or _reaches_product(eqn.outvars[0], read, cache)) \
                        and (id(var), line) not in seen:
                    seen.add((id(var), line))
                    found_all.append((var, to, line, other, derived, origin, made))
            ins = [v for v in eqn.invars if not hasattr(v, "val")]  # (a Literal is constant)
            # a backward pass's own equation (a checkpointed gradient's remat) is not walked:
            # the name stacks inside it are relative, and its dots are weight gradients
            for body, operands in ([] if scan_role(eqn) == "backward" else _bodies(eqn)):
                if operands is None:  # a while loop's: read as a whole
                    inner = set(map(id, body.invars)) if any(id(v) in derived for v in ins) \
                        else set()
                    visit(body, inner, set(), {})
                    continue
                pairs = [(b, v) for b, v in zip(body.invars, operands, strict=True)
                         if not hasattr(v, "val")]
                visit(body, {id(b) for b, v in pairs if id(v) in derived},
                      {id(b) for b, v in pairs if id(v) in wide},
                      {id(b): origin[id(v)] for b, v in pairs  # (not a scan's slice of it)
                       if id(v) in origin and b.aval.shape == v.aval.shape})
            if any(id(v) in derived for v in ins):
                derived.update(id(v) for v in eqn.outvars)
            if any(id(v) in wide for v in ins):
                wide.update(id(v) for v in eqn.outvars)

    if top is not None and hasattr(top, "invars"):
        visit(top, set(map(id, top.invars)), set(),
              {id(v): n for n, v in enumerate(top.invars)})
    out = []
    for var, to, line, other, derived, origin, made in found_all:  # (each jaxpr walked whole)
        shape = tuple(var.aval.shape)
        kind = "argument" if id(other) in derived else "constant"
        out.append((origin.get(id(var)), str(var.aval.dtype), str(np.dtype(to)), shape,
                    math.prod(shape) * np.dtype(to).itemsize, line, kind,
                    _moved_from(other, made, origin)))
    return tuple(sorted(out, key=lambda w: -w[4]))


#: equations that only move or reshape their one operand: a value they make from an input is
#: that input (a bias broadcast to its activation's shape), for naming it
_MOVES = ("broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "copy")


def _moved_from(var, made: dict, origin: dict[int, int]) -> int | None:
    """The position among the inputs of the input ``var`` is, or is made from by moving or
    reshaping it alone (:data:`_MOVES`); None for anything else."""
    while id(var) not in origin:
        eqn = made.get(id(var))
        ins = [v for v in eqn.invars if not hasattr(v, "val")] if eqn is not None else []
        if eqn is None or eqn.primitive.name not in _MOVES or len(ins) != 1:
            return None
        var = ins[0]
    return origin[id(var)]


def _bodies(eqn) -> list[tuple[Any, Sequence | None]]:
    """(jaxpr, the equation's operands its inputs take, one for one; None where they do not
    pair so: a while loop's) of each jaxpr an equation calls: an inner jit's, a remat's, a
    scan's body, a cond's branches."""
    from jax.extend import core

    out = []
    for p in eqn.params.values():
        for sub in (p if isinstance(p, (tuple, list)) else (p,)):
            if not isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
                continue
            body = sub.jaxpr if isinstance(sub, core.ClosedJaxpr) else sub
            n = len(body.invars)
            operands = (eqn.invars if n == len(eqn.invars) else
                        eqn.invars[1:] if eqn.primitive.name == "cond" and
                        n == len(eqn.invars) - 1 else None)
            out.append((body, operands))
    return out


def _widening(eqn, read: dict):
    """(the value widened, the dtype it is read as, the wider operand) where ``eqn`` reads a
    floating value at a wider floating type: a ``convert_element_type`` to a wider float (the
    wider operand: another input of an equation that reads the result, of that type), or a
    ``dot_general`` of a narrower and a wider float; None otherwise (or where no wider
    operand is found: nothing to name as the cause)."""
    name = eqn.primitive.name
    if name == "convert_element_type":
        (var,) = eqn.invars[:1]
        to = eqn.params.get("new_dtype")
        dtype = getattr(var.aval, "dtype", None)
        if to is None or dtype is None or not (_floating(dtype) and _floating(to)) or \
                np.dtype(to).itemsize <= np.dtype(dtype).itemsize or not var.aval.shape:
            return None
        result = eqn.outvars[0]
        other = next((v for user in read.get(id(result), []) for v in user.invars
                      if v is not result and getattr(getattr(v, "aval", None), "dtype",
                                                     None) == np.dtype(to)), None)
        return (var, to, other) if other is not None else None
    if name == "dot_general" and len(eqn.invars) == 2:
        a, b = eqn.invars
        da, db = (getattr(v.aval, "dtype", None) for v in (a, b))
        if da is None or db is None or da == db or not (_floating(da) and _floating(db)):
            return None
        narrow, other = (a, b) if np.dtype(da).itemsize < np.dtype(db).itemsize else (b, a)
        if np.dtype(narrow.aval.dtype).itemsize == np.dtype(other.aval.dtype).itemsize:
            return None  # (bfloat16 against float16: neither is wider)
        return narrow, other.aval.dtype, other
    return None


def promoted_round_trips(closed) -> tuple[tuple[str, str, tuple[int, ...], int, str], ...]:
    """(the narrow dtype, the wider one, the shape, the bytes of one such value at the wider
    dtype, the first user's line) of each half-precision value (float16, bfloat16) that jnp's
    promotion widens at a user's operator or jnp call against a wider float operand (a float32
    parameter, coefficient or ``dt``) where the same jaxpr casts a value of that shape back
    to the half dtype: a state kept in half precision whose work runs in float32, so the half
    type saves neither memory nor time (brainpy/BrainPy#539). Loops' bodies included; one per
    (dtype, shape), largest first."""
    found: dict[tuple, tuple] = {}
    for j, _ in walk(closed):
        _, read = _index(j)
        back = {(str(e.params.get("new_dtype")), tuple(e.invars[0].aval.shape))
                for e in getattr(j, "eqns", ()) if e.primitive.name == "convert_element_type"
                and hasattr(getattr(e.invars[0], "aval", None), "dtype")
                and np.dtype(e.invars[0].aval.dtype).itemsize > 2
                and e.params.get("new_dtype") is not None
                and np.dtype(e.params["new_dtype"]).itemsize == 2}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "convert_element_type":
                continue
            widened = _widening(eqn, read)
            if widened is None or not _promoted(eqn):
                continue
            var, to = widened[0], np.dtype(widened[1])
            narrow, shape = np.dtype(var.aval.dtype), tuple(var.aval.shape)
            if narrow.itemsize != 2 or (str(narrow), shape) not in back:
                continue
            found.setdefault((str(narrow), shape), (
                str(narrow), str(to), shape, math.prod(shape) * to.itemsize,
                equation_line(eqn)))
    return tuple(sorted(found.values(), key=lambda f: -f[3]))


def shapes_by_dtype(closed) -> dict[str, set[tuple[int, ...]]]:
    """The shapes of the values of a jaxpr (its inputs and every equation's results, nested
    jaxprs too), by dtype name ("bfloat16": {(1024, 2048), ...})."""
    out: dict[str, set[tuple[int, ...]]] = {}
    for j, _ in walk(closed):
        for v in [*getattr(j, "invars", ()), *(o for e in j.eqns for o in e.outvars)]:
            dtype = getattr(getattr(v, "aval", None), "dtype", None)
            if dtype is not None and hasattr(v.aval, "shape"):
                out.setdefault(str(dtype), set()).add(tuple(v.aval.shape))
    return out

def output_kinds(closed) -> list[str]:
    """One word per output of the step: "zero gradient" for a gradient JAX knows is zero and
    makes all the same (``instantiate_zeros``: a parameter under ``stop_gradient``, or one the
    loss never reads; jax-ml/jax#23316), "gradient" for one a derivative's backward pass made
    (its name stack says transpose: a scan of the backward pass too), "" otherwise (an update
    ``p - lr * g`` is ""). Followed into inner jits and remats, not into a scan's body."""
    indexes: dict[int, tuple[dict, dict]] = {}

    def kind(j, var) -> str:
        if id(j) not in indexes:
            indexes[id(j)] = _index(j)
        made_by, _ = indexes[id(j)]
        made = made_by.get(id(var))
        if made is None:
            return ""
        body = _called(made)
        if body is not None:
            at = next(i for i, v in enumerate(made.outvars) if v is var)
            return kind(body, body.outvars[at])
        names = set(_frame_names(made))
        if made.primitive.name == "broadcast_in_dim" and "instantiate_zeros" in names and \
                any(_zero_literal(v) for v in made.invars):
            return "zero gradient"
        return "gradient" if "transpose(" in str(made.source_info.name_stack) else ""

    jaxpr = getattr(closed, "jaxpr", None)
    return [kind(jaxpr, v) for v in getattr(jaxpr, "outvars", ())]


#: operations whose result is a new value of an operand of its own shape, element by element
#: (an update ``acc + g``, ``p - lr * g``, a cast, a select) or with a part written
#: (``x.at[i].set(v)``)
_UPDATES = frozenset({
    "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "select_n", "clamp", "pow",
    "integer_pow", "sqrt", "rsqrt", "exp", "log", "tanh", "logistic", "abs", "sign", "copy",
    "copy_p", "convert_element_type", "dynamic_update_slice", "scatter", "scatter-add",
    "scatter_add", "square"})


def updated_inputs(closed) -> list[frozenset[int]]:
    """For each output of the step, the positions of the jaxpr's inputs it is a new value of:
    reached from the output through operations of :data:`_UPDATES` whose operand has the
    output's shape (``acc + g`` is a new ``acc``; a gradient, made through a dot or a sum, is no
    new value of its parameter). Followed into inner jits and remats; empty where no input is
    reached (a value made anew)."""
    indexes: dict[int, tuple[dict, dict]] = {}

    def reach(j, var, inputs: dict) -> set[int]:
        """The top-level inputs ``var`` of jaxpr ``j`` updates; ``inputs`` maps ``j``'s own
        inputs (by id) to the top-level positions they stand for."""
        if id(var) in inputs:
            return set(inputs[id(var)])
        if id(j) not in indexes:
            indexes[id(j)] = _index(j)
        made = indexes[id(j)][0].get(id(var))
        if made is None:
            return set()
        body = _called(made)
        if body is not None:
            at = next(i for i, v in enumerate(made.outvars) if v is var)
            inner = {id(b): frozenset(reach(j, o, inputs)) if not hasattr(o, "val") else
                     frozenset() for b, o in zip(body.invars, made.invars, strict=True)}
            return reach(body, body.outvars[at], inner)
        if made.primitive.name not in _UPDATES:
            return set()
        shape = getattr(getattr(var, "aval", None), "shape", None)
        out: set[int] = set()
        for v in made.invars:
            if not hasattr(v, "val") and getattr(getattr(v, "aval", None), "shape", 0) == shape:
                out |= reach(j, v, inputs)
        return out

    jaxpr = getattr(closed, "jaxpr", None)
    if jaxpr is None:
        return []
    top = {id(v): frozenset({k}) for k, v in enumerate(jaxpr.invars)}
    return [frozenset(reach(jaxpr, v, top)) for v in jaxpr.outvars]


#: the primitives of JAX's host callbacks, and the names the user wrote (jax.debug.print is its
#: own primitive from jax 0.10)
CALLBACKS = {"debug_callback": "jax.debug.callback", "debug_print": "jax.debug.print",
             "io_callback": "io_callback", "pure_callback": "jax.pure_callback"}
_LOOPS = ("while", "scan")


def progress_fix(callback: str) -> str:
    """The fix for a host callback ("jax.debug.callback", "io_callback", ...) that runs on every
    iteration of a loop to report progress: call it every k steps (liesel-devs/liesel#282;
    measured by the kit on a CPU, jax 0.10.2)."""
    call = {"io_callback": "io_callback(fn, None, i)",
            "jax.debug.print": 'jax.debug.print("{}", i)'}.get(callback, f"{callback}(fn, i)")
    return (f"to report progress, call it every k steps: jax.lax.cond(i % k == 0, lambda: "
            f"{call}, lambda: None), i the loop's step counter (carry one where the loop has "
            "none) (liesel-devs/liesel#282; a while_loop of 20,000 steps on a CPU: 586 ms with a "
            "callback each step, 5.4 ms called every 1,000)")


#: the primitives of jax.debug.print and jax.debug.callback (jax.debug.print is its own from
#: jax 0.10; on 0.8.0 it binds debug_callback)
_PRINTS = ("debug_callback", "debug_print")


def prints(closed) -> tuple[tuple[str, str], ...]:
    """(the print as the user wrote it, its line) of each jax.debug.print and
    jax.debug.callback in the step, nested ones included."""
    return tuple((c, at) for c, at in callbacks(closed)
                 if c in ("jax.debug.print", "jax.debug.callback"))


def without_prints(closed):
    """The step's closed jaxpr with its jax.debug.print and jax.debug.callback equations
    dropped, nested ones included (their effects with them): the program as it would be
    without them, to compile beside the step's own (a print is part of what XLA compiles and
    can change it: jax-ml/jax#26370). None where the step has none."""
    from jax.extend import core

    if not prints(closed):
        return None

    def effects(found) -> Any:
        return type(found)(e for e in found if "Debug" not in type(e).__name__)

    def strip(j):
        if jaxcompat.wraps_jaxpr(j):
            return j.replace(jaxpr=strip(j.jaxpr))
        eqns = []
        for eqn in j.eqns:
            if eqn.primitive.name in _PRINTS:
                continue
            params = {k: (type(v)(strip(x) if isinstance(x, (core.ClosedJaxpr, core.Jaxpr))
                                  else x for x in v) if isinstance(v, (tuple, list)) else
                          strip(v) if isinstance(v, (core.ClosedJaxpr, core.Jaxpr)) else v)
                      for k, v in eqn.params.items()}
            eqns.append(eqn.replace(params=params, effects=effects(eqn.effects)))
        return j.replace(eqns=eqns, effects=effects(j.effects))

    return strip(closed)


def _callback_loop(eqn) -> tuple[Any, int] | None:
    """(the callback, its calls per run) where ``eqn`` is a scan of no carry whose body is one
    host callback, or one such scan: what jax.lax.map makes of a callback, one call per
    element in sequence; else None."""
    from jax.extend import core

    if eqn.primitive.name in CALLBACKS:
        return eqn, 1
    if eqn.primitive.name != "scan" or jaxcompat.scan_counts(eqn.params)[1]:
        return None
    body = eqn.params.get("jaxpr")
    body = body.jaxpr if isinstance(body, core.ClosedJaxpr) else body
    eqns = getattr(body, "eqns", ())
    inner = _callback_loop(eqns[0]) if len(eqns) == 1 else None
    return (inner[0], inner[1] * int(eqn.params["length"])) if inner else None


def _vmap_loop(eqn) -> tuple[Any, int] | None:
    """(the callback, its calls per run of the step) where ``eqn`` is the loop jax.vmap made of
    a host callback: vmap's rule for io_callback (and for jax.pure_callback with
    vmap_method="sequential") is jax.lax.map, so the callback runs once per element, one after
    another, each a round trip to the host (a scan of no carry, made under vmap, whose body is
    the callback alone: the jaxpr of jax 0.8.0 and 0.10.2 alike)."""
    if eqn.primitive.name != "scan" or "vmap(" not in str(eqn.source_info.name_stack):
        return None
    return _callback_loop(eqn)


def callbacks_vmapped(closed) -> tuple[tuple[str, str, int], ...]:
    """(the callback as the user wrote it, its line, its calls per run of the step: one per
    element of the vmaps around it) of each host callback that jax.vmap made a loop of
    (:func:`_vmap_loop`): OpenSourceEconomics/pylcm#316, an io_callback validation inside a
    function vmapped over 64 x 64 state-action pairs ran 4,096 times a step. The line is the
    loop's (jax 0.10.2 gives the callback inside it none)."""
    out, seen = [], set()
    for eqn, _, _ in _placed(closed, vmap_loops=True):
        if id(eqn) in seen or (found := _vmap_loop(eqn)) is None:
            continue
        callback, calls = found
        for j, _ in walk(eqn.params["jaxpr"]):  # its inner loops: not found again
            seen.update(id(e) for e in j.eqns)
        out.append((CALLBACKS[callback.primitive.name],
                    equation_line(eqn) or equation_line(callback), calls))
    return tuple(out)


def callback_vmapped(closed, callback) -> bool | None:
    """Whether the host callback whose function is ``callback`` (its equation's ``callback``
    parameter) runs under jax.vmap in ``closed``: its equation's name stack has ``vmap(``
    (jax.debug.callback, one call per element), or it is the body of the loop vmap made of it
    (:func:`_vmap_loop`: io_callback, whose equation inside that loop has no ``vmap(``; jax
    0.8.0 and 0.10.2 alike). A jax.debug.print's equation (``debug_print``) holds no callback:
    its function is made when the program is lowered, so where no equation has ``callback``,
    the step's prints decide, all under a vmap or none. None where that cannot tell."""
    seen = False
    printed = set()  # whether each debug_print is under a vmap
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.params.get("callback") is callback:
                seen = True
                if "vmap(" in str(eqn.source_info.name_stack):
                    return True
            elif eqn.primitive.name == "debug_print":
                printed.add("vmap(" in str(eqn.source_info.name_stack))
            found = _vmap_loop(eqn)
            if found is not None and found[0].params.get("callback") is callback:
                return True
    if seen:
        return False
    return printed.pop() if len(printed) == 1 else None


def _placed(closed, vmap_loops: bool = False
            ) -> Iterator[tuple[Any, tuple[Any, ...], bool]]:
    """(equation, the loops it sits in, outermost first, whether a cond guards it inside the
    innermost loop) for each equation of a jaxpr and of every jaxpr nested in it. The loops
    jax.vmap makes of a host callback (:func:`_vmap_loop`) are no loops of the user's: left
    out of the loops, and their callbacks too unless ``vmap_loops``."""
    from jax.extend import core

    stack = [(closed, (), False)] if closed is not None else []
    while stack:
        j, loops, guarded = stack.pop()
        j = j.jaxpr if isinstance(j, core.ClosedJaxpr) else j
        for eqn in getattr(j, "eqns", ()):
            yield eqn, loops, guarded
            name = eqn.primitive.name
            if _vmap_loop(eqn) is not None and not vmap_loops:
                continue
            inner = (*loops, eqn) if name in _LOOPS else loops
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
                        stack.append((sub, inner, False if name in _LOOPS else
                                      guarded or name == "cond"))


def _user_function(eqn) -> tuple[str, str] | None:
    """(file, function name) of the user's innermost frame that made a jaxpr equation."""
    f = _innermost_user(eqn)
    return (f.file_name, f.function_name) if f else None


def _loop_name(eqn) -> str:
    return ("lax.scan" if eqn.primitive.name == "scan" else "lax.while_loop") + (
        f" of {eqn.params['length']:,} steps" if eqn.primitive.name == "scan" else "")


def callbacks(closed) -> tuple[tuple[str, str], ...]:
    """(the callback as the user wrote it, its line) of each host callback in the step, nested
    ones included."""
    return tuple((CALLBACKS[eqn.primitive.name], equation_line(eqn))
                 for j, _ in walk(closed) for eqn in getattr(j, "eqns", ())
                 if eqn.primitive.name in CALLBACKS)


def callbacks_every_step(closed) -> tuple[tuple[str, str, str, int | None], ...]:
    """(the callback as the user wrote it, its line, the loop: "lax.while_loop", "lax.scan of
    1,000 steps", its steps: None for a while_loop) of each host callback in a loop's body with
    no cond around it inside that loop: it runs, a host round trip, on every iteration
    (liesel-devs/liesel#282)."""
    return tuple((CALLBACKS[eqn.primitive.name], equation_line(eqn), _loop_name(loops[-1]),
                  int(loops[-1].params["length"]) if loops[-1].primitive.name == "scan"
                  else None)
                 for eqn, loops, guarded in _placed(closed)
                 if eqn.primitive.name in CALLBACKS and loops and not guarded)


def callbacks_hoisted(closed) -> tuple[tuple[str, str, str, str], ...]:
    """(the callback as the user wrote it, its line, the loop, the loop's line) of each host
    callback that sits outside every loop while the rest of the user's function that made it
    sits in a loop's body (none of its other equations outside every loop): under jax.grad,
    scan's partial evaluation moves a callback that reads nothing the loop changes out of the
    loop (io_callback(ordered=True) too), and it runs once, not once per step
    (jax-ml/jax#16637)."""
    placed = list(_placed(closed))
    inside, outside = {}, set()  # user function -> the loop that holds its equations
    for eqn, loops, _ in placed:
        if eqn.primitive.name in CALLBACKS or (f := _user_function(eqn)) is None:
            continue
        if loops:
            inside.setdefault(f, loops[-1])
        else:
            outside.add(f)
    out = []
    for eqn, loops, _ in placed:
        if eqn.primitive.name in CALLBACKS and not loops:
            f = _user_function(eqn)
            if f in inside and f not in outside:
                loop = inside[f]
                out.append((CALLBACKS[eqn.primitive.name], equation_line(eqn), _loop_name(loop),
                            equation_line(loop)))
    return tuple(out)


#: a line that calls lax.cond or lax.switch (what vmap turns into a select when it batches the
#: predicate)
_COND_CALL = re.compile(r"\b(?:cond|switch)\(")


def in_selected_conds(closed, most: int = 64) -> tuple[tuple[str, str, str, int], ...]:
    """(what: the callback as the user wrote it or "lax.while_loop", its line, the line of the
    lax.cond it sits in, how many: a callback's equations there, one per element where vmap
    unrolled it) of each host callback, and each while_loop whose predicate is batched, in a
    branch of a lax.cond whose predicate jax.vmap batched. XLA has no batched conditional, so
    vmap makes such a cond a select (jax 0.8.0 and 0.10.2 leave no cond equation at its line,
    only select_n): both branches run on every element. A callback there runs for every
    element (jax-ml/jax#19314: a jax.debug.print in one branch printed 4 times for 4 elements,
    2 of them the branch's); a batched while_loop runs until every element's condition is
    false, so one that ends only on its own branch's inputs never ends (jax-ml/jax#2947).
    Found by the data: the equation reads, or its outputs reach, within ``most`` equations, a
    select_n made at a line that calls cond( or switch( where the jaxpr keeps no cond."""
    kept = {equation_line(e) for j, _ in walk(closed) for e in getattr(j, "eqns", ())
            if e.primitive.name == "cond"}
    out: dict[tuple[str, str, str], int] = {}
    for j, _ in walk(closed):
        eqns = list(getattr(j, "eqns", ()))
        selects = {}
        for e in eqns:
            if e.primitive.name == "select_n" and (line := equation_line(e)) and \
                    line not in kept and _COND_CALL.search(line.split(": ", 1)[-1]):
                selects[id(e)] = line
        if not selects:
            continue
        made = {id(v): e for e in eqns for v in e.outvars}
        readers: dict[int, list] = {}
        for e in eqns:
            for v in e.invars:
                readers.setdefault(id(v), []).append(e)
        for eqn in eqns:
            name = eqn.primitive.name
            if name in CALLBACKS:
                what = CALLBACKS[name]
            elif name == "while" and getattr(_while_predicate(eqn), "shape", ()):
                what = "lax.while_loop"
            else:
                continue
            cond = _reached(eqn, selects, made, readers, most)
            if cond:
                key = (what, equation_line(eqn), cond)
                out[key] = out.get(key, 0) + 1
    return tuple((*key, n) for key, n in out.items())


def _while_predicate(eqn):
    """The aval of a while_loop's predicate: bool[] unbatched, bool[n] where vmap batched it."""
    from jax.extend import core

    c = eqn.params.get("cond_jaxpr")
    c = c.jaxpr if isinstance(c, core.ClosedJaxpr) else c
    outs = getattr(c, "outvars", ())
    return outs[0].aval if outs else None


def _reached(eqn, selects: dict, made: dict, readers: dict, most: int) -> str:
    """The line of a select in ``selects`` (id of the equation -> its line) that ``eqn`` reads
    from, or whose inputs its outputs reach, within ``most`` equations each way; "" if none."""
    for step in (lambda e: [made[id(v)] for v in e.invars if id(v) in made],
                 lambda e: [r for v in e.outvars for r in readers.get(id(v), ())]):
        todo, seen = step(eqn), set()
        while todo and len(seen) < most:
            e = todo.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            if id(e) in selects:
                return selects[id(e)]
            todo += step(e)
    return ""


def _axis_sizes(eqn, sizes: dict) -> dict:
    """The mesh axis sizes a shard_map equation's body runs under (``sizes`` outside it)."""
    mesh = eqn.params.get("mesh") if eqn.primitive.name == "shard_map" else None
    try:
        return {**sizes, **dict(mesh.shape)} if mesh is not None else sizes
    except Exception:  # a mesh this reader does not know
        return sizes


def _under_meshes(closed) -> Iterator[tuple[Any, dict]]:
    """Each jaxpr of a closed jaxpr and those nested in it, with the mesh axis sizes of the
    shard_maps around it ({} outside any)."""
    from jax.extend import core

    stack = [(closed, {})] if closed is not None else []
    while stack:
        j, sizes = stack.pop()
        j = j.jaxpr if isinstance(j, core.ClosedJaxpr) else j
        yield j, sizes
        for eqn in getattr(j, "eqns", ()):
            inner = _axis_sizes(eqn, sizes)
            for v in eqn.params.values():
                stack += [(sub, inner) for sub in (v if isinstance(v, (tuple, list)) else (v,))
                          if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr))]


def _axes(eqn) -> tuple:
    """The named axes of a collective (``axes``, or a ``reduce_scatter``'s ``axis_name``: a name
    or a tuple of them)."""
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _called_as(eqn) -> str:
    """The name of the function the user's innermost line called to make a jaxpr equation
    (``"psum"`` for ``jax.lax.psum``; a transformation's own equation names another, such as
    ``jax.grad``'s); "" where its traceback names no user's line."""
    fs = _traceback_frames(eqn)
    at = next((i for i, f in enumerate(fs) if frames.is_user_file(f.file_name)), None)
    return fs[at - 1].function_name.rsplit(".", 1)[-1] if at else ""


#: the sums a user calls, by the primitive that makes them under check_vma
_SUMS = {"psum_invariant": "psum", "psum": "psum", "reduce_scatter": "psum_scatter"}


def psums_of_invariant(closed) -> tuple[tuple[str, str, tuple[str, ...], int, bool], ...]:
    """Each ``jax.lax.psum`` or ``psum_scatter`` under ``shard_map``'s check_vma (the default)
    of a value already the same on every device of (some of) its axes: (``"psum"`` or
    ``"psum_scatter"``, the user's line, those axes, the product of their sizes, whether the
    value was itself a sum over them). JAX makes such a value varying (``pvary``) before it sums
    it, so the sum multiplies it by the axes' size; a value that is itself a ``psum_invariant``'s
    is a ``jax.grad`` of an input with in_spec P(), which JAX has summed already (found putting
    jax-ml/jax#839 to the kit: psum(grad) and psum_scatter(grad) gave 4.0x the gradient on 4
    devices, jax 0.8.0 and 0.10.2). A psum of a Python number (``psum(1, 'i')``, the axis size)
    is none, nor a sum a transformation made."""
    from jax.extend import core

    out = []
    for j, sizes in _under_meshes(closed):
        made = {}
        for eqn in getattr(j, "eqns", ()):
            name = _SUMS.get(eqn.primitive.name)
            pv = made.get(id(eqn.invars[0])) if name and eqn.invars else None
            if pv is not None and pv.primitive.name == "pvary" and _called_as(eqn) == name:
                axes = tuple(a for a in _axes(pv) if a in _axes(eqn))
                src = pv.invars[0]
                if axes and not isinstance(src, core.Literal) and all(a in sizes for a in axes):
                    by = made.get(id(src))
                    summed = by is not None and by.primitive.name == "psum_invariant" and \
                        set(axes) <= set(_axes(by))
                    out.append((name, equation_line(eqn), axes,
                                math.prod(sizes[a] for a in axes), summed))
            for v in eqn.outvars:
                made[id(v)] = eqn
    return tuple(out)


def replicated_sums(closed) -> tuple[tuple[str, tuple[str, ...], int, int], ...]:
    """Each ``jax.lax.psum`` whose sum a ``shard_map`` returns with an out_spec that names no
    axis (P()): every device of the summed axes holds the whole sum (jax-ml/jax#839, "psum
    copies the result to all workers"). (the user's line, the summed axes, the product of their
    sizes, the sum's bytes per device). A psum of a value already the same on every device
    (:func:`psums_of_invariant`) is not one: that one is a wrong number first; nor is the sum
    ``jax.grad`` makes itself of an input with in_spec P()."""
    from jax.extend import core

    out = []
    for j, sizes in _under_meshes(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "shard_map":
                continue
            body = eqn.params.get("jaxpr")
            body = body.jaxpr if isinstance(body, core.ClosedJaxpr) else body
            inner = _axis_sizes(eqn, sizes)
            made = {id(v): e for e in getattr(body, "eqns", ()) for v in e.outvars}
            for var, spec in zip(getattr(body, "outvars", ()), eqn.params.get("out_specs", ()),
                                 strict=False):
                e = made.get(id(var))
                if e is None or e.primitive.name not in ("psum", "psum_invariant") or any(
                        p is not None for p in tuple(spec)) or _called_as(e) != "psum":
                    continue
                pv = made.get(id(e.invars[0]))
                axes = tuple(a for a in _axes(e) if a in inner)
                if not axes or (pv is not None and pv.primitive.name == "pvary"):
                    continue
                aval = var.aval
                out.append((equation_line(e), axes, math.prod(inner[a] for a in axes),
                            math.prod(aval.shape) * aval.dtype.itemsize))
    return tuple(out)


# --- what a step's products and sorts make whole ------------------------------------------------
def _squeezed(shape) -> tuple[int, ...]:
    """A shape with its dimensions of 1 left out (a vmap of one group adds one: jax.nn's
    dot_product_attention computes its scores as [B, N, T, 1, S])."""
    return tuple(int(n) for n in shape if n != 1)


def _nbytes(v) -> int:
    aval = v.aval
    return math.prod(aval.shape) * aval.dtype.itemsize if hasattr(aval, "shape") else 0


def _last_axis(shape) -> int | None:
    """The last dimension of a shape that is not 1, or None."""
    return max((i for i, n in enumerate(shape) if n != 1), default=None)


#: the equations that pass a value on rearranged, not computed from others: a weight they
#: reach is still the step's argument (an embedding's transpose, a cast to bfloat16)
_REARRANGED = frozenset({"transpose", "convert_element_type", "reshape", "broadcast_in_dim",
                         "copy", "squeeze", "expand_dims", "slice", "dynamic_slice"})


def _inner_arguments(eqn, args: set) -> list[tuple[Any, set]]:
    """(a jaxpr nested in ``eqn``, the ids of its inputs that are the step's arguments) where
    ``args`` holds those of ``eqn``'s jaxpr: an inner jit, a checkpoint or a custom rule passes
    its operands on one for one; a scan, its constants and the rows of its xs; a while_loop,
    its constants; a cond, its operands to each branch. Other nested jaxprs: none."""
    from jax.extend import core

    def ids(j, pairs):
        j = j.jaxpr if isinstance(j, core.ClosedJaxpr) else j
        return (j, {id(v) for v, o in pairs if id(o) in args})

    name, p, ins = eqn.primitive.name, eqn.params, list(eqn.invars)
    out = []
    if name == "scan":
        body = p["jaxpr"].jaxpr if isinstance(p["jaxpr"], core.ClosedJaxpr) else p["jaxpr"]
        c, n = jaxcompat.scan_counts(p)
        pairs = [*zip(body.invars[:c], ins[:c], strict=False),
                 *zip(body.invars[c + n:], ins[c + n:], strict=False)]
        return [ids(body, pairs)]
    if name == "while":
        body = p["body_jaxpr"].jaxpr
        c = p["body_nconsts"]
        return [ids(body, zip(body.invars[:c], ins[p["cond_nconsts"]:][:c], strict=False))]
    if name == "cond":
        return [ids(b, zip(b.jaxpr.invars, ins[1:], strict=False)) for b in p["branches"]]
    for v in p.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
                inner = sub.jaxpr if isinstance(sub, core.ClosedJaxpr) else sub
                if len(inner.invars) == len(ins):
                    out.append(ids(inner, zip(inner.invars, ins, strict=True)))
    return out


def _dots_of_arguments(closed) -> set[int]:
    """The ids of the ``dot_general`` equations one of whose operands is an argument of the
    step, rearranged at most (:data:`_REARRANGED`): a weight or an embedding table, not a value
    computed from the batch (apple/axlearn#1236's ``h @ w``, not CLIP's ``a @ b.T`` of two
    projected batches). Followed into nested jaxprs (:func:`_inner_arguments`)."""
    from jax.extend import core

    found: set[int] = set()
    top = closed.jaxpr if isinstance(closed, core.ClosedJaxpr) else closed
    if top is None:
        return found
    stack = [(top, {id(v) for v in (*top.constvars, *top.invars)})]
    while stack:
        j, args = stack.pop()
        args = set(args) | {id(v) for v in getattr(j, "constvars", ())}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name == "dot_general" and any(id(v) in args for v in eqn.invars):
                found.add(id(eqn))
            if eqn.primitive.name in _REARRANGED and eqn.invars and id(eqn.invars[0]) in args:
                args.update(id(v) for v in eqn.outvars)
            stack += _inner_arguments(eqn, args)
    return found


#: the equations a product passes through, elementwise, before its softmax: a scale, a bias
_ELEMENTWISE = frozenset({"mul", "div", "add", "sub", "neg", "convert_element_type", "copy",
                          "stop_gradient", "tanh", "max", "min", "select_n"})


def _reduced_across(j, dot) -> bool:
    """Whether the product of ``dot`` (in jaxpr ``j``) is reduced (a max, an argmax, a sum)
    along a dimension that is not its last, directly or through its transpose and elementwise
    equations: a CLIP loss's ``log_softmax(logits.T)``, which a chunk of rows cannot
    compute."""
    from jax.extend import core

    last = _last_axis(dot.outvars[0].aval.shape)
    todo = [(j, dot.outvars[0], last)]
    seen = set()
    while todo:
        j, var, axis = todo.pop()
        if id(var) in seen or axis is None:
            continue
        seen.add(id(var))
        for e in getattr(j, "eqns", ()):
            if not any(v is var for v in e.invars):
                continue
            name = e.primitive.name
            if name == "transpose":
                todo.append((j, e.outvars[0], list(e.params["permutation"]).index(axis)))
            elif name in _ELEMENTWISE and e.outvars and getattr(
                    e.outvars[0].aval, "shape", None) == var.aval.shape:
                todo.append((j, e.outvars[0], axis))
            elif name in ("pjit", "jit", "closed_call", "custom_jvp_call", "remat",
                          "checkpoint"):  # into the inner jaxpr (jax.nn.log_softmax's jit)
                for sub in e.params.values():
                    inner = sub.jaxpr if isinstance(sub, core.ClosedJaxpr) else sub
                    if isinstance(inner, core.Jaxpr) and len(inner.invars) == len(e.invars):
                        todo += [(inner, iv, axis) for iv, v in zip(inner.invars, e.invars,
                                                                    strict=True) if v is var]
            elif name in ("reduce_max", "argmax", "reduce_sum") and axis not in tuple(
                    e.params.get("axes", ())) and any(
                    var.aval.shape[a] != 1 for a in e.params.get("axes", ())):
                return True
    return False


def softmax_products(closed) -> tuple[tuple[str, tuple[int, ...], str, int, int, str, bool,
                                            bool], ...]:
    """(``"attention"`` or ``"logits"``, the product's shape with its dimensions of 1 left out,
    its dtype, its bytes, the size its dot contracts, the user's line, whether it is made in a
    derivative's forward pass, whether in a loop's body: a lax.scan or lax.map, a while_loop)
    of each ``dot_general`` outside a backward pass whose last
    dimension (the right operand's) is 4 or more times the size it contracts and whose result
    a ``reduce_max`` or ``argmax`` reduces over that dimension (a softmax, a logsumexp, an
    argmax: one value per row from a whole row), largest first. "attention" where another dot
    then contracts that dimension against an operand with dimensions of its own (the
    probabilities times the values: a T x S score matrix, google/flax#2858); "logits" where
    one operand of the dot is an argument of the step (a weight, an embedding table:
    :func:`_dots_of_arguments`) and nothing reduces the product along another dimension (the
    full logits over a vocabulary, made for a loss that keeps one value per token:
    apple/axlearn#1236); none otherwise (a CLIP loss's similarity matrix of two projected
    batches, softmaxed along both axes: no vocabulary, and no chunk of rows computes it)."""
    placed = [(e, bool(loops)) for e, loops, _ in _placed(closed) if scan_role(e) != "backward"]
    eqns = [e for e, _ in placed]
    looped = {id(e) for e, in_loop in placed if in_loop}
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    reduced = set()  # the shapes (squeezed) reduced over their last dimension
    for e in eqns:
        if e.primitive.name in ("reduce_max", "argmax") and hasattr(e.invars[0], "aval"):
            shape, axes = tuple(e.invars[0].aval.shape), tuple(e.params.get("axes", ()))
            if len(axes) == 1 and axes[0] == _last_axis(shape):
                reduced.add(_squeezed(shape))
    contracted = set()  # the shapes (squeezed) a dot contracts over their last dimension
    for e in dots:
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        sides = ((tuple(lc), tuple(lb)), (tuple(rc), tuple(rb)))
        for n in (0, 1):
            shape = tuple(e.invars[n].aval.shape)
            other, (o_axes, o_batch) = tuple(e.invars[1 - n].aval.shape), sides[1 - n]
            keeps = [i for i, d in enumerate(other)  # the other operand's own dimensions (H)
                     if d != 1 and i not in o_axes and i not in o_batch]
            if _last_axis(shape) in sides[n][0] and keeps:
                contracted.add(_squeezed(shape))
    weighted = _dots_of_arguments(closed)
    within = {id(e): j for j, _ in walk(closed) for e in getattr(j, "eqns", ())}
    out = []
    for e in dots:
        (lc, rc), (_, rb) = e.params["dimension_numbers"]
        lhs, rhs = (tuple(v.aval.shape) for v in e.invars)
        free = [i for i in range(len(rhs)) if i not in rc and i not in rb and rhs[i] != 1]
        shape, k = _squeezed(e.outvars[0].aval.shape), math.prod(lhs[i] for i in lc)
        if not free or not shape or shape[-1] != rhs[free[-1]] or shape[-1] < 4 * max(k, 1) \
                or shape not in reduced:
            continue
        kind = "attention" if shape in contracted else "logits"
        if kind == "logits" and (id(e) not in weighted or _reduced_across(within[id(e)], e)):
            continue
        out.append((kind, shape,
                    str(e.outvars[0].aval.dtype), _nbytes(e.outvars[0]), int(k),
                    equation_line(e), scan_role(e) == "forward", id(e) in looped))
    return tuple(sorted(out, key=lambda x: -x[3]))


#: the subscripts jnp.einsum names its inner jit's scope with ("ij,jk->ik"), in a name stack
#: such as "transpose(jvp(ij,jk->ik))"
_EINSUM_SPEC = re.compile(r"([A-Za-z.]*(?:,[A-Za-z.]*)*->[A-Za-z.]*)")


def _in_einsum(eqn) -> bool:
    """The equation was made inside ``jnp.einsum`` (a frame of its traceback is JAX's einsum
    in jax/_src/numpy/einsum.py; jax 0.8.0 and 0.10.2)."""
    return any(f.function_name == "einsum" and f.file_name.replace("\\", "/").endswith(
        "numpy/einsum.py") for f in _traceback_frames(eqn))


def einsum_intermediates(closed) -> tuple[tuple[str, tuple[int, ...], str, int, int,
                                                tuple[tuple[int, ...], ...], str], ...]:
    """(the einsum's subscripts, "" where its name stack does not say them; the largest value
    it makes inside; that value's dtype; its bytes; the bytes of the largest of the einsum's
    operands and its result; the operands' shapes in the order the einsum reads them; the
    user's line) of each ``jnp.einsum`` outside a backward pass that makes a value 100 or more
    times the size of every operand and of its result: jnp.einsum contracts two operands at a
    time along opt_einsum's path, and a step of it can be far larger than both ends
    (jax-ml/jax#24915: ``ij,ik,il,jk,jl,kl->ij`` makes an n**4 intermediate). Largest
    first."""
    from jax.extend import core

    out = []
    for j, _ in walk(closed):
        groups: dict[tuple[str, str], list] = {}
        for e in getattr(j, "eqns", ()):
            if scan_role(e) != "backward" and _in_einsum(e):
                groups.setdefault((str(e.source_info.name_stack), equation_line(e)), []).append(e)
        for (stack, line), eqns in groups.items():
            made = {id(v) for e in eqns for v in e.outvars}
            inputs = list({id(v): v for e in eqns for v in e.invars
                           if not isinstance(v, core.Literal) and id(v) not in made
                           and hasattr(v.aval, "shape")}.values())
            largest = max((v for e in eqns for v in e.outvars), key=_nbytes)
            ends = max(_nbytes(v) for v in [*inputs, eqns[-1].outvars[0]])
            if _nbytes(largest) < 100 * max(ends, 1):
                continue
            spec = _EINSUM_SPEC.findall(stack.replace(" ", ""))
            out.append((spec[-1] if spec else "", tuple(largest.aval.shape),
                        str(largest.aval.dtype), _nbytes(largest), ends,
                        tuple(tuple(v.aval.shape) for v in inputs), line))
    return tuple(sorted(out, key=lambda x: -x[3]))


def _letter_sizes(terms: Sequence[str], shapes: Sequence[tuple[int, ...]]
                  ) -> tuple[dict[str, int], tuple[int, ...]] | None:
    """(each subscript letter's size, the operand for each term) where the operands' shapes fit
    the terms in some order (the einsum's order of reading need not be its operands'); None
    where none does, or the search runs long."""
    budget = [5000]

    def fit(i: int, sizes: dict, used: tuple) -> tuple[dict, tuple] | None:
        if i == len(terms):
            return sizes, used
        for n, shape in enumerate(shapes):
            budget[0] -= 1
            if budget[0] < 0:
                return None
            if n in used or len(shape) != len(terms[i]):
                continue
            new = dict(sizes)
            if all(new.setdefault(c, d) == d for c, d in zip(terms[i], shape, strict=True)):
                if (found := fit(i + 1, new, (*used, n))) is not None:
                    return found
        return None

    return fit(0, {}, ())


def einsum_step(spec: str, shapes: Sequence[tuple[int, ...]], elements: int) -> str:
    """The pairwise step of ``jnp.einsum_path(spec, ...)`` for operands of ``shapes`` whose
    result has ``elements`` elements ("ilj,jki->iljk"), from opt_einsum's path as jnp.einsum
    takes it; "" where the subscripts have an ellipsis, the shapes do not fit them, or no step
    makes a value that size (an ``optimize=`` of the user's own)."""
    if "->" not in spec or "." in spec:
        return ""
    terms = spec.split("->")[0].split(",")
    found = _letter_sizes(terms, shapes) if len(terms) == len(shapes) else None
    if found is None:
        return ""
    sizes, order = found
    import jax
    import jax.numpy as jnp

    operands = [jax.ShapeDtypeStruct(shapes[n], jnp.float32) for n in order]
    try:
        _, info = jnp.einsum_path(spec, *operands)
        steps = [c[2] for c in info.contraction_list]
    except Exception:  # subscripts opt_einsum does not take
        return ""
    return next((s for s in steps if math.prod(sizes.get(c, 1) for c in s.split("->")[-1])
                 == elements), "")


def _iota(var, made: dict) -> bool:
    """``var`` is an iota, or one reversed (jnp.argsort(x, descending=True) sorts the reversed
    array with the reversed iota) or broadcast (under jax.vmap)."""
    eqn = made.get(id(var))
    while eqn is not None and eqn.primitive.name in ("rev", "broadcast_in_dim"):
        eqn = made.get(id(eqn.invars[0]))
    return eqn is not None and eqn.primitive.name == "iota"


def sliced_sorts(closed) -> tuple[tuple[tuple[int, ...], str, int, int, str, str, str, str],
                                  ...]:
    """(the sorted array's shape, its dtype, its length along the sorted dimension n, how many
    the step keeps k, "smallest" or "largest": which end it keeps, "indices", "values" or
    "indices and values": what it keeps, the function that sorts: "argsort", "sort" or
    "lax.sort", the user's line) of each sort of one key (jnp.argsort, jnp.sort) whose
    results the step only slices to k of n, 8k <= n, at one end of the sorted dimension
    (followed through reversals and the inner jits jnp's functions are): it sorts all n to keep
    k, where ``jax.lax.top_k`` finds them without the full sort (the NumPy habit
    ``jnp.argsort(x)[:k]``; openxla/xla#25487). Largest first."""
    from jax.extend import core

    alias: dict[int, tuple[int, str, bool]] = {}  # a variable -> (sort, which, reversed)
    sorts: dict[int, tuple[Any, str, str]] = {}  # sort -> (equation, function, line)
    uses: dict[int, list] = {}  # sort -> (which, k, end) or None for any other use

    def use(eqn, a: tuple[int, str, bool]) -> tuple[str, int, str] | None:
        s, which, flipped = a
        dim = sorts[s][0].params["dimension"]
        shape = tuple(sorts[s][0].invars[0].aval.shape)
        if eqn.primitive.name != "slice" or any(x != 1 for x in eqn.params.get("strides")
                                                or ()):
            return None
        start, limit = eqn.params["start_indices"], eqn.params["limit_indices"]
        whole = all((start[i], limit[i]) == (0, n) for i, n in enumerate(shape) if i != dim)
        k, n = limit[dim] - start[dim], shape[dim]
        if not whole or 8 * k > n or (start[dim] != 0 and limit[dim] != n):
            return None
        first = (start[dim] == 0) != flipped  # the start of an ascending sort: the smallest
        return which, k, "smallest" if first else "largest"

    def visit(j, incoming: dict[int, tuple], name: str, above: str) -> dict[int, tuple]:
        made = {}
        for n, v in enumerate(j.invars):
            if n in incoming:
                alias[id(v)] = incoming[n]
        for e in j.eqns:
            made.update({id(v): e for v in e.outvars})
            p, line = e.primitive.name, equation_line(e) or above
            held = [(v, alias[id(v)]) for v in e.invars
                    if not isinstance(v, core.Literal) and id(v) in alias]
            if p == "sort" and not held and e.params.get("num_keys") == 1 and (
                    len(e.invars) == 1 or (len(e.invars) == 2 and _iota(e.invars[1], made))):
                s = len(sorts)  # (a jit's jaxpr is shared by its calls: one sort per call)
                sorts[s], uses[s] = (e, name or "lax.sort", line), []
                for v, which in zip(e.outvars, ("values", "indices"), strict=False):
                    alias[id(v)] = (s, which, False)
                continue
            if p == "rev" and len(held) == 1 and sorts[held[0][1][0]][0].params["dimension"] \
                    in tuple(e.params.get("dimensions", ())):
                s, which, flipped = held[0][1]
                alias[id(e.outvars[0])] = (s, which, not flipped)
                continue
            inner = _called(e)
            if inner is not None:
                returned = visit(inner, {n: alias[id(v)] for n, v in enumerate(e.invars)
                                         if id(v) in alias},
                                 str(e.params.get("name", "")) or name, line)
                for n, a in returned.items():
                    alias[id(e.outvars[n])] = a
                continue
            for _, a in held:
                uses[a[0]].append(use(e, a))
            for v in e.params.values():  # a loop's or a branch's body: a use of its own
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
                        body = sub.jaxpr if isinstance(sub, core.ClosedJaxpr) else sub
                        for a in visit(body, {}, "", line).values():
                            uses[a[0]].append(None)
        return {n: alias[id(v)] for n, v in enumerate(j.outvars) if id(v) in alias}

    top = getattr(closed, "jaxpr", closed)
    if top is None:
        return ()
    for a in visit(top, {}, "", "").values():
        uses[a[0]].append(None)  # returned whole
    out = []
    for s, (e, name, line) in sorts.items():
        found = uses[s]
        if not found or None in found or len({end for _, _, end in found}) != 1:
            continue
        which = sorted({w for w, _, _ in found})
        aval = e.invars[0].aval
        out.append((tuple(aval.shape), str(aval.dtype),
                    int(aval.shape[e.params["dimension"]]), max(k for _, k, _ in found),
                    found[0][2], " and ".join(which[::-1]) if len(which) > 1 else which[0],
                    name if name in ("argsort", "sort") else "lax.sort", line))
    return tuple(sorted(out, key=lambda x: -math.prod(x[0])))
