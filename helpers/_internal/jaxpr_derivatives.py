"""What a step's derivatives keep and make, read from its jaxpr: a ``jax.custom_vjp`` fwd rule's
and a ``shard_map``'s residuals, what ``jax.checkpoint`` keeps or offloads and where it is
repeated, the lines traced inside ``jacfwd``/``jacrev``, a Jacobian's sizes, and a whole
Jacobian only multiplied by a vector.
"""

from __future__ import annotations

import math
import re
from typing import Any

from helpers._internal import frames, jaxcompat
from helpers._internal.jaxpr_walk import (
    REMATS,
    called_jaxpr,
    equation_line,
    equation_where,
    floating,
    frame_names,
    made_and_read,
    named_calls,
    traceback_frames,
    walk,
)

__all__ = ["checkpoint_at", "checkpoint_offloads", "custom_vjp_residuals", "custom_vjp_rule",
           "jacobian_diagonals", "jacobian_lines", "jacobian_products", "jacobian_sizes",
           "jacobian_solves",
           "repeated_checkpoints",
           "residual_sources", "shard_map_residuals", "wholly_checkpointed"]


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
            policy = eqn.params.get("policy") if eqn.primitive.name in REMATS else None
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


def custom_vjp_rule(eqn) -> str:
    """The name of the ``jax.custom_vjp`` fwd rule of the user's that made a jaxpr equation
    ("" where none did): the user's outermost frame under JAX's ``_flatten_fwd``, which calls
    the rule (jax/_src/custom_derivatives.py, named by jaxcompat; jax 0.8.0 and 0.10.2 alike).
    What the rule returns as residuals JAX keeps until bwd runs, whatever jax.checkpoint
    inside it says (sgl-project/sglang-jax#823)."""
    found = [(f.function_name, f.file_name) for f in traceback_frames(eqn)]
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
    made, _ = made_and_read(jaxpr)
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
            eqn = made_and_read(j)[0].get(id(var))
            if eqn is None:
                break
            k = next(i for i, o in enumerate(eqn.outvars) if o is var)
            if eqn.primitive.name == "shard_map":
                spec, mesh = eqn.params["out_specs"][k], eqn.params["mesh"]
                body = getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"])
                devices, local, axes = _spec_devices(spec, mesh, tuple(v.aval.shape))
                made = made_and_read(body)[0].get(id(body.outvars[k]))
                where = equation_where(made) if made is not None and \
                    made.primitive.name == "all_gather" else ""
                if devices > 1:
                    out.append((tuple(v.aval.shape), str(v.aval.dtype), devices, local, where,
                                axes))
                break
            inner = called_jaxpr(eqn)
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
        integers = not any(floating(v.aval.dtype) or "complex" in str(v.aval.dtype)
                           for v in eqn.invars if hasattr(v.aval, "dtype"))
        for k, v in enumerate(eqn.outvars):
            if id(v) in ids:
                out.append((tuple(v.aval.shape), str(v.aval.dtype), n, eqn.primitive.name,
                            (*scan, k >= jaxcompat.scan_counts(eqn.params)[1]) if scan else None,
                            integers))
    return out


def repeated_checkpoints(closed) -> tuple[tuple[str, int], ...]:
    """(the user's line, how many) for each line that made two or more ``jax.checkpoint``
    equations in one jaxpr: a function checkpointed layer by layer in a Python loop, whose
    recomputations XLA schedules as it likes (jax-ml/jax#19822, #27748)."""
    out = []
    for j, _ in walk(closed):
        lines: dict[str, int] = {}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name in REMATS and (where := equation_where(eqn)):
                lines[where] = lines.get(where, 0) + 1
        out += [(w, n) for w, n in lines.items() if n >= 2]
    return tuple(out)


def checkpoint_at(closed, where: str) -> tuple[Any, Any] | None:
    """(the jaxpr it recomputes, its policy) of the first ``jax.checkpoint`` equation made at
    ``where`` (a line :func:`repeated_checkpoints` names), for the gradient of one such call
    alone; None where none is, or its jaxpr has constants of its own."""
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name in REMATS and equation_where(eqn) == where:
                body = called_jaxpr(eqn)
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
        made, _ = made_and_read(j)
        makers = {id(made[id(v)]) for v in j.outvars if id(v) in made}
        eqns = [made[id(v)] for v in j.outvars if id(v) in made]
        if len(makers) != 1 or len(eqns) != len(j.outvars):
            return False
        if eqns[0].primitive.name in REMATS:
            return True
        if (j := called_jaxpr(eqns[0])) is None:
            return False
    return False


def jacobian_lines(closed) -> frozenset[str]:
    """The user's lines (as :func:`equation_line` names them) of the equations traced inside
    ``jax.jacfwd`` or ``jax.jacrev`` (``jax.hessian``): a frame of their traceback is JAX's
    ``jacfun``, the function those return (jax 0.8.0 and 0.10.2). A value made at such a line
    under a vmap may be the Jacobian's own, over its basis (jax-ml/jax#787)."""
    out = set()
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if any(n.endswith("jacfun") for n in frame_names(eqn)) and (
                    line := equation_line(eqn)):
                out.add(line)
    return frozenset(out)


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
            names = frame_names(eqn)
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


def _unravelled(var, made_by: dict, read: dict, returned) -> tuple[Any, str, bool]:
    """(the equation that made ``var``, read back through up to six reshapes
    (:data:`_RESHAPING`); "forward" or "reverse" where it is the output of JAX's
    ``_jacfwd_unravel`` or ``_jacrev_unravel``, a whole Jacobian, "" otherwise; whether each
    value on the way is read once, here, and not returned (``returned``: the ids of the
    jaxpr's outputs))."""
    source, alone = None, True
    for _ in range(6):
        alone = alone and len(read.get(id(var), ())) == 1 and id(var) not in returned
        source = made_by.get(id(var))
        if source is None or source.primitive.name not in _RESHAPING or \
                {"_jacfwd_unravel", "_jacrev_unravel"} & set(frame_names(source)):
            break
        var = source.invars[0]
    names = set(frame_names(source)) if source is not None else set()
    mode = ("forward" if "_jacfwd_unravel" in names else
            "reverse" if "_jacrev_unravel" in names else "")
    return source, mode, alone


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
        made_by, read = made_and_read(j)
        returned = {id(v) for v in getattr(j, "outvars", ())}
        inner_reverse = None  # read once, where a jacfwd's product is found
        for eqn in eqns:
            if eqn.primitive.name != "dot_general" or any(
                    n.endswith("jacfun") for n in frame_names(eqn)):
                continue
            (contract, batch) = eqn.params["dimension_numbers"]
            for side in (0, 1):
                other = 1 - side
                o_shape = tuple(getattr(eqn.invars[other].aval, "shape", ()))
                if math.prod(d for k, d in enumerate(o_shape)
                             if k not in contract[other] and k not in batch[other]) != 1:
                    continue  # a matrix on the other side: a product of Jacobians, not a vector
                source, mode, alone = _unravelled(eqn.invars[side], made_by, read, returned)
                if not alone:
                    continue  # the Jacobian is needed as well: not only for this product
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
                                         frame_names(e))}
                found.append((
                    "hessian" if mode == "forward" and line in inner_reverse else mode,
                    "right" if right else "left", shape, str(aval.dtype),
                    math.prod(shape) * aval.dtype.itemsize,
                    math.prod(out.shape) * out.dtype.itemsize, line, equation_line(eqn),
                    bool(batch[side])))
    return sorted(found, key=lambda f: -f[4])


#: jnp's and jax.scipy's dense linear solves, jitted under these names (jnp.linalg.solve,
#: jax.scipy.linalg.solve, jnp.linalg.inv), and the factorizations they start with
_DENSE_SOLVES = frozenset({"solve", "_solve", "lu_factor", "cho_factor"})
_FACTORIZATIONS = frozenset({"lu", "cholesky"})


def jacobian_solves(closed) -> list[tuple[str, tuple[int, ...], str, int, str, str]]:
    """(mode, the Jacobian's shape, its dtype, its bytes, the Jacobian's line, the solve's line)
    of each whole Jacobian (the output of JAX's ``_jacfwd_unravel`` or ``_jacrev_unravel``,
    read through reshapes) that the step hands only to a dense linear solve (jnp.linalg.solve,
    jax.scipy.linalg.solve, an LU or Cholesky factorization; not jnp.linalg.inv, whose result
    may be the inverse itself, a covariance; nor a batch of small ones under vmap, which a
    smaller batch shrinks: a review): a Newton step that needs J
    only through J^-1 r, which a matrix-free solve gets from Jacobian-vector products
    (patrick-kidger/optimistix#93: the full Jacobian of a [1000, 1, 1000, 3, 2] field, 77 TB),
    largest first."""
    found = []
    for eqn, made_by, read, returned in named_calls(closed, _DENSE_SOLVES, _FACTORIZATIONS):
        source, mode, alone = _unravelled(eqn.invars[0], made_by, read, returned)
        aval = eqn.invars[0].aval
        if not mode or not alone or len(aval.shape) != 2:
            continue  # no Jacobian, one needed for more than this solve, or a batch
        found.append((mode, tuple(aval.shape), str(aval.dtype),
                      math.prod(aval.shape) * aval.dtype.itemsize, equation_line(source),
                      equation_line(eqn)))
    return sorted(found, key=lambda f: -f[3])


#: jnp.diag and jnp.diagonal, as their jitted functions are named in a jaxpr, and jnp.trace
#: (the sum of the diagonal: a Laplacian as the trace of a Hessian)
_DIAGONAL_READS = frozenset({"diagonal", "_diag", "trace"})
#: a reverse derivative inside a forward one's vmap, as a name stack shows it: jacfwd of a
#: gradient, a Hessian (jax.hessian, jacfwd(jacrev(f)), jacfwd(grad(f)))
_REVERSE_INSIDE_FORWARD = re.compile(r"vmap\(jvp\(.*transpose\(")
#: the smallest n for which a diagonal read from n x n is named: below it, computing the
#: diagonal alone saves too little (a 3-D Laplacian's Hessian is 3 x 3; a review)
DIAGONAL_AT = 16


def jacobian_diagonals(closed) -> list[tuple[str, tuple[int, ...], str, int, str, str, bool]]:
    """(mode, the Jacobian's shape, its dtype, its bytes, the Jacobian's line, the line that
    takes its diagonal, whether it is a Hessian) of each whole Jacobian or Hessian (the output
    of JAX's ``_jacfwd_unravel`` or ``_jacrev_unravel``, read through reshapes) of
    :data:`DIAGONAL_AT` rows or more whose only reader is ``jnp.diag``, ``jnp.diagonal`` or
    ``jnp.trace`` of its main diagonal, a batch of them under vmap too: the step makes n x n
    values, and pushes n tangents through the function, to keep n (netket/netket#1655, a
    Laplacian; jax-ml/jax#3801, a PINN's second derivatives), largest first. A Hessian: the
    step has a reverse derivative inside a forward one's vmap (read from the name stacks, so
    jacfwd(g) of a gradient g made on another line counts; a review)."""
    hessian = any(_REVERSE_INSIDE_FORWARD.search(str(e.source_info.name_stack))
                  for j, _ in walk(closed) for e in getattr(j, "eqns", ()))
    found = []
    for eqn, made_by, read, returned in named_calls(closed, _DIAGONAL_READS):
        source, mode, alone = _unravelled(eqn.invars[0], made_by, read, returned)
        aval = eqn.invars[0].aval
        shape = tuple(int(d) for d in getattr(aval, "shape", ()))
        out = tuple(int(d) for d in getattr(eqn.outvars[0].aval, "shape", ()))
        summed = str(eqn.params.get("name", "")) == "trace"
        if len(shape) < 2:  # (jnp.diag of a vector makes a matrix)
            continue
        kept = shape[-1] * (shape[-1] if summed else 1)  # n of n x n, or the sum of the n
        if not mode or not alone or shape[-1] != shape[-2] or \
                shape[-1] < DIAGONAL_AT or math.prod(out) * kept != math.prod(shape) or \
                (summed and len(eqn.invars) != 1):  # (an offset comes as an operand)
            continue  # no Jacobian, one read elsewhere too, or not its main diagonal
        found.append((mode, shape, str(aval.dtype), math.prod(shape) * aval.dtype.itemsize,
                      equation_line(source), equation_line(eqn),
                      hessian or "hessian" in equation_line(source)))
    return sorted(found, key=lambda f: -f[3])
