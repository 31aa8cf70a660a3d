"""What a step's products, reductions, sorts and vmaps make whole, read from its jaxpr: two
inputs broadcast against each other and then reduced, a reduction whose operand is far wider
than its result, a product a softmax or an argmax reduces whole, a ``jnp.einsum`` step far
larger than its operands, a sort only sliced at one end, a BCOO product's stored elements
against its dense size, which vmaps the user asked for, and what a vmap batched in a scatter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from helpers._internal import frames, jaxcompat
from helpers._internal.jaxpr_callbacks import placed_equations
from helpers._internal.jaxpr_loops import moved_input
from helpers._internal.jaxpr_walk import (
    called_jaxpr,
    equation_line,
    equation_where,
    jitted_as,
    made_and_read,
    named_calls,
    scan_role,
    traceback_frames,
    walk,
)

__all__ = ["batch_reductions", "cumulative_cutoffs", "diagonal_matrices", "diagonal_products",
           "repeated_operands",
           "einsum_intermediates", "einsum_step",
           "pairwise_reductions",
           "scatters_batched", "selected_branches", "sliced_sorts", "softmax_products",
           "sparse_products", "vmapped_lines", "WIDE_AT", "wide_reductions"]


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


def _as_large_as_an_input(shape: tuple[int, ...], pair: tuple[int, int],
                          inputs: list[tuple[int, ...]]) -> bool:
    """Whether one of the step's own inputs runs along both ``pair`` axes' sizes (in two of
    its dimensions) with as many elements as the value: the outer product is then no larger
    than data the step already takes, as LayerNorm's rsqrt(var)[n, 1] * scale[d] beside its
    x[n, d] (a trial: "every pair of two inputs' rows" for a row's own scale, and a chunking
    that LayerNorm, needing whole rows, cannot take)."""
    size, a, b = math.prod(shape), shape[pair[0]], shape[pair[1]]
    for s in inputs:
        dims = list(s)
        if a in dims:
            dims.remove(a)
            if b in dims and math.prod(s) >= size:
                return True
    return False


def _of_a_whole_row(eqn, made: dict, shape: tuple[int, ...], pair: tuple[int, int]) -> bool:
    """One operand of the outer product comes, through elementwise steps, from a reduction of
    a value that already runs along both pair axes: a row's own statistic (LayerNorm's mean or
    variance of an [n, d] x made inside the step, x = emb[tokens]: a review) against a vector
    of d, no larger than the x it was reduced from."""
    a, b = shape[pair[0]], shape[pair[1]]
    for v in eqn.invars:
        stack, seen = [(v, 0)], set()
        while stack:
            var, depth = stack.pop()
            src = made.get(id(var))
            if src is None or id(var) in seen or depth > 8:
                continue
            seen.add(id(var))
            if src.primitive.name in _REDUCE:
                dims = list(getattr(src.invars[0].aval, "shape", ()))
                if a in dims:
                    dims.remove(a)
                    if b in dims:
                        return True
                continue
            if src.primitive.name == "dot_general":
                continue
            stack += [(w, depth + 1) for w in src.invars if not hasattr(w, "val")]
    return False


def pairwise_reductions(closed) -> tuple[tuple[tuple[int, ...], str, tuple[int, int], int,
                                               str, str, int, int], ...]:
    """Each value made by broadcasting two operands against each other (an outer product over
    two axes: ``x[:, None, :] - y[None, :, :]``) that what follows reduces over one of the two
    axes (a sum over j of f(x_i, y_j): N-body forces, an RBF kernel; openxla/xla#49131): (its
    shape, dtype, the two axes, the one reduced, the user's line that made it, the line that
    reduces it, the position among the jaxpr's own inputs of the input that runs along the
    reduced axis (-1 where it is made inside, or in an inner jaxpr), that input's axis)."""
    out = []
    top = [tuple(getattr(v.aval, "shape", ())) for v in getattr(
        getattr(closed, "jaxpr", closed), "invars", ())]
    for depth, (j, _) in enumerate(walk(closed)):
        made = {id(v): eqn for eqn in getattr(j, "eqns", ()) for v in eqn.outvars}
        invars = {id(v): i for i, v in enumerate(getattr(j, "invars", ()))} if depth == 0 \
            else {}
        for n, eqn in enumerate(getattr(j, "eqns", ())):
            if (pair := _pairwise_axes(eqn, made)) is None or \
                    _as_large_as_an_input(tuple(eqn.outvars[0].aval.shape), pair, top) or \
                    _of_a_whole_row(eqn, made, tuple(eqn.outvars[0].aval.shape), pair):
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
    _, read = made_and_read(j)
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
            elif (inner := called_jaxpr(eqn)) is not None:
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
        made, _ = made_and_read(j) if getattr(j, "eqns", None) is not None else ({}, {})
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
                                equation_line(reducers[0]), moved_input(other_var, made, invars),
                                frozenset(found)))
    return tuple(out)


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


#: a line that calls lax.cond or lax.switch
_COND_CALL = re.compile(r"\b(cond|switch)\(")


def selected_branches(closed) -> dict[str, str]:
    """The user's lines inside a lax.cond or lax.switch whose predicate jax.vmap batched, each
    with the cond's line: vmap makes such a cond a select_n on the cond's line, after every
    branch has run for every element, and these lines' values reach that select (jax-ml/jax#7199:
    a rare, costly branch run for the whole batch). Walked back from the select's values, not
    through the equations made on the cond's line (the predicate, the operands vmap guards),
    nor to equations before the cond's first. The guards are selects too, each between an
    operand and its stop_gradient: walked from, they led to the operand's own lines
    (``lax.cond(p(x), f, g, features(x))``: features called "in a branch", a review found)."""
    out: dict[str, str] = {}
    for j, _ in walk(closed):
        made, _ = made_and_read(j)
        first: dict[str, int] = {}
        for i, eqn in enumerate(j.eqns):
            first.setdefault(equation_line(eqn), i)
        where = {id(eqn): i for i, eqn in enumerate(j.eqns)}

        def unstopped(v, made=made):  # (through stop_gradients nested: a review)
            while (e := made.get(id(v))) is not None and e.primitive.name == "stop_gradient":
                v = e.invars[0]
            return id(v)

        for eqn in j.eqns:
            at = equation_line(eqn)
            if eqn.primitive.name != "select_n" or not _COND_CALL.search(at) or \
                    len({unstopped(v) for v in eqn.invars[1:]}) == 1:
                continue  # (an operand's guard: the operand, or its stop_gradient)
            stack, seen = list(eqn.invars[1:]), set()
            while stack:
                e = made.get(id(stack.pop()))
                if e is None or id(e) in seen or where[id(e)] < first[at]:
                    continue
                seen.add(id(e))
                line = equation_line(e)
                if line == at:
                    continue
                inner = [equation_line(q) for sub, _ in walk(called_jaxpr(e))
                         for q in sub.eqns] if called_jaxpr(e) is not None else []
                for found in [line, *inner]:
                    if found and found != at:
                        out.setdefault(found, at)
                stack += e.invars
    return out


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
    placed = [(e, bool(loops)) for e, loops, _ in placed_equations(closed)
              if scan_role(e) != "backward"]
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
        "numpy/einsum.py") for f in traceback_frames(eqn))


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
            inner = called_jaxpr(e)
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


#: jnp's functions that read only a square matrix's diagonal, jitted under these names (not
#: jnp.trace: an offset gives the same scalar, and a user's own jit may share the name)
_DIAGONAL_READS = frozenset({"diagonal", "_diag"})


def diagonal_products(closed) -> list[tuple[tuple[int, ...], str, int, str, str]]:
    """(its shape, dtype, bytes, the product's line, the line that takes the diagonal) of each
    square matrix product (a ``dot_general``) whose only reader is ``jnp.diag`` or
    ``jnp.diagonal`` of its main diagonal: the step makes m x m values to keep m of them
    (thomaspinder/GPJax#389: a predictive variance as the diagonal of a full covariance),
    largest first."""
    found = []
    for eqn, made_by, read, returned in named_calls(closed, _DIAGONAL_READS):
        var = eqn.invars[0]
        source = made_by.get(id(var))
        aval = getattr(var, "aval", None)
        shape = tuple(getattr(aval, "shape", ()))
        out = tuple(getattr(getattr(eqn.outvars[0], "aval", None), "shape", ()))
        if source is None or source.primitive.name != "dot_general" or len(shape) != 2 \
                or shape[0] != shape[1] or len(read.get(id(var), ())) != 1 \
                or id(var) in returned or out != shape[:1]:
            continue  # (not the main diagonal: jnp.diag(M, k=1) is m - 1 long; a review)
        found.append((shape, str(aval.dtype), math.prod(shape) * aval.dtype.itemsize,
                      equation_line(source), equation_line(eqn)))
    return sorted(found, key=lambda f: -f[2])


#: a sort as a jaxpr shows it: the primitive, or jnp's jitted function around it
_SORTS = frozenset({"argsort", "sort"})
#: a comparison with a threshold: what a cumulative cutoff ends in (cum < p)
_COMPARISONS = frozenset({"lt", "le", "gt", "ge"})


def _named(eqn, names: frozenset[str]) -> bool:
    """The equation is one of ``names``, as a primitive or as jnp's jit of that name."""
    return eqn.primitive.name in names or jitted_as(eqn, names)


def cumulative_cutoffs(closed) -> list[tuple[tuple[int, ...], str, int, str, str]]:
    """(the sorted shape, its dtype, its length n along the last axis, the sort's line, the
    cumulative sum's line) of each whole sort whose results, directly or gathered through its
    indices, reach a cumulative sum (jnp.cumsum) that the step compares with a threshold: a
    cutoff by cumulative mass, as top-p (nucleus) sampling takes over a vocabulary. The sort
    is of n = 1,024 or more along its last axis (keras-team/keras-hub#963: 50,304 per row,
    every step). Largest first."""
    found = []
    for j, _ in walk(closed):
        tainted: dict[int, tuple] = {}  # a variable -> (the sort equation)
        summed: dict[int, tuple] = {}  # a cumulative sum's result -> (sort, cumsum equation)
        for e in getattr(j, "eqns", ()):
            from_sort = next((tainted[id(v)] for v in e.invars if id(v) in tainted), None)
            from_sum = next((summed[id(v)] for v in e.invars if id(v) in summed), None)
            if _named(e, _SORTS) and from_sort is None:
                shape = tuple(getattr(e.invars[0].aval, "shape", ()))
                if shape and shape[-1] >= 1024:
                    for v in e.outvars:
                        tainted[id(v)] = (e,)
                continue
            if from_sum is not None:
                if e.primitive.name in _COMPARISONS:
                    sort, cum = from_sum
                    aval = sort.invars[0].aval
                    shape = tuple(aval.shape)
                    found.append((shape, str(aval.dtype), shape[-1], equation_line(sort),
                                  equation_line(cum)))
                    summed.clear()  # one cutoff per sort
                    continue
                for v in e.outvars:
                    summed[id(v)] = from_sum
            if from_sort is not None:
                if _named(e, frozenset({"cumsum"})):
                    for v in e.outvars:
                        summed[id(v)] = (from_sort[0], e)
                else:
                    for v in e.outvars:
                        tainted[id(v)] = from_sort
    unique = {(f[3], f[4]): f for f in found}
    return sorted(unique.values(), key=lambda f: -math.prod(f[0]))


#: equations a repeated value may pass through on its way to the product: a layout change
_PASS_THROUGH = frozenset({"transpose", "convert_element_type", "reshape", "copy"})


def _reaches_product(var, read: dict, depth: int = 0) -> bool:
    """``var`` is an operand of a dot_general, directly, through a layout change, or as the
    input of a call (jnp.einsum's jit on older JAX) whose own jaxpr multiplies it."""
    for eqn in read.get(id(var), ()):
        name = eqn.primitive.name
        if name == "dot_general":
            return True
        if name in _PASS_THROUGH and depth < 4 and _reaches_product(eqn.outvars[0], read,
                                                                     depth + 1):
            return True
        inner = getattr(eqn.params.get("jaxpr"), "jaxpr", eqn.params.get("jaxpr"))
        if inner is not None and depth < 4 and hasattr(inner, "eqns"):
            at = [i for i, v in enumerate(eqn.invars) if v is var]
            _, inner_read = made_and_read(inner)
            if any(i < len(inner.invars) and _reaches_product(inner.invars[i], inner_read,
                                                               depth + 1) for i in at):
                return True
    return False


def repeated_operands(closed) -> list[tuple[tuple[int, ...], str, int, int, int, str]]:
    """(the repeated value's shape, its dtype, its bytes, the times each slice is repeated,
    the axis, the user's line) of each value made by repeating every slice of another along
    an axis, jnp.repeat(k, g, axis) (a broadcast that adds an axis of g beside it, reshaped
    into it), and then multiplied by a dot_general: grouped-query attention's K and V
    repeated up to the query heads (NovaSky-AI/SkyRL#514), a copy g times the original's size
    that the product could read unrepeated. Largest first."""
    found = []
    for j, _ in walk(closed):
        made, read = made_and_read(j)
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "reshape":
                continue
            wide = made.get(id(eqn.invars[0]))
            if wide is None or wide.primitive.name != "broadcast_in_dim":
                continue
            src = tuple(getattr(wide.invars[0].aval, "shape", ()))
            mid = tuple(wide.outvars[0].aval.shape)
            out = tuple(eqn.outvars[0].aval.shape)
            dims = tuple(wide.params["broadcast_dimensions"])
            if len(mid) == len(src) and dims == tuple(range(len(mid))):
                # Llama's repeat_kv: x[:, :, :, None, :] broadcast to g there, then reshaped
                # (one size-1 axis made g wide: a review)
                ones = [i for i, (m, n) in enumerate(zip(mid, src, strict=True)) if n == 1 < m]
                if len(ones) != 1:
                    continue
                new = ones[0]
                src = src[:new] + src[new + 1:]
            elif len(mid) != len(src) + 1 or dims != tuple(
                    i for i in range(len(mid)) if i != (new := next(
                        (i for i in range(len(mid)) if i not in dims), -1))):
                continue
            if len(out) != len(src) or new < 1:
                continue
            g = mid[new]
            # jnp.repeat's layout: the new axis right after the one it repeats, merged into it
            if g < 2 or out != src[:new - 1] + (src[new - 1] * g,) + src[new:]:
                continue
            if not _reaches_product(eqn.outvars[0], read):
                continue
            aval = eqn.outvars[0].aval
            found.append((out, str(aval.dtype), math.prod(out) * aval.dtype.itemsize, g,
                          new - 1, equation_line(wide)))
    return sorted(found, key=lambda f: -f[2])


def diagonal_matrices(closed) -> list[tuple[tuple[int, ...], str, int, str, bool]]:
    """(the matrix's shape, its dtype, its bytes, the user's line, whether every product that
    reads it takes a vector for its other operand) of each jnp.diag of a vector
    of n = 16 or more (under vmap, a batch of them) whose n x n matrix a dot_general reads:
    jnp.diag(v) @ M scales M's rows, which v[:, None] * M does without the matrix
    (blackjax-devs/blackjax#1007: Pathfinder's L-BFGS at 200k parameters). Largest first."""
    found = []
    for j, _ in walk(closed):
        _, read = made_and_read(j)
        for eqn in getattr(j, "eqns", ()):
            if not jitted_as(eqn, frozenset({"_diag", "diag"})) or len(eqn.outvars) != 1:
                continue
            src = tuple(getattr(eqn.invars[0].aval, "shape", ()))
            out = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
            if len(src) < 1 or len(out) != len(src) + 1 or out[-2:] != (src[-1], src[-1]) or \
                    src[-1] < 16 or not _reaches_product(eqn.outvars[0], read):
                continue
            aval = eqn.outvars[0].aval
            products = [e for e in read.get(id(eqn.outvars[0]), ())
                        if e.primitive.name == "dot_general"]
            # (jnp.diag(v) @ g with g a vector: v * g, not v[:, None] * g: a review)
            vectors = bool(products) and all(
                len(getattr(o.aval, "shape", ())) == len(src)
                for e in products for o in e.invars if o is not eqn.outvars[0])
            found.append((out, str(aval.dtype), math.prod(out) * aval.dtype.itemsize,
                          equation_line(eqn), vectors))
    return sorted(found, key=lambda f: -f[2])
