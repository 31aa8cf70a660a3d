"""Reading a step's jaxpr, the ground the other ``jaxpr_*`` modules stand on: every equation,
nested jaxprs included (:func:`walk`), the user's line that made an equation, what an inner jit
or remat calls, and which equation makes or reads a variable.

The ``jaxpr_*`` modules read a step's jaxpr for what the user's code asked of JAX, before XLA
plans anything, each with the user's line; plain tuples out, :mod:`helpers.compiled` makes the
records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from helpers._internal import frames

__all__ = ["bodies", "called_jaxpr", "CALLS", "closed_over_values", "closes_over_arrays",
           "equation_line", "equation_where", "factored_shapes", "FACTORIZATIONS", "floating",
           "frame_names", "has_derivative",
           "innermost_user", "input_position", "jitted_as", "made_and_read", "MOVES",
           "named_calls", "REMATS", "scan_role",
           "statement", "traceback_frames", "types_within", "user_frame", "value_types", "walk",
           "zero_literal"]


def floating(dtype) -> bool:
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


#: the primitives that factor a whole matrix (jnp.linalg and jax.scipy.linalg's)
FACTORIZATIONS = frozenset({"cholesky", "lu", "eigh", "eig", "svd", "qr", "schur"})


def factored_shapes(closed) -> set[tuple[int, int]]:
    """The (rows, columns) of each matrix the step factors (a Cholesky, an LU, an
    eigendecomposition), at any depth; the last two dimensions of a batch of them."""
    return {tuple(int(d) for d in e.invars[0].aval.shape[-2:])
            for j, _ in walk(closed) for e in getattr(j, "eqns", ())
            if e.primitive.name in FACTORIZATIONS and e.invars
            and len(getattr(e.invars[0].aval, "shape", ())) >= 2}


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


def numpy_constants(closed, least: int) -> list[tuple[Any, str, Any]]:
    """(the constant, the user's line of the first equation that reads it, the function's
    frames' files) of each NumPy array of ``least`` bytes or more that enters the step as a
    constant of its jaxpr (a jax.Array constant is not one), nested jaxprs included."""
    import jax

    out = []
    for j, consts in walk(closed):
        for var, c in zip(getattr(j, "constvars", ()), consts, strict=False):
            if isinstance(c, jax.Array) or not getattr(c, "ndim", 0):
                continue
            size = int(np.prod(c.shape)) * np.dtype(c.dtype).itemsize
            if size < least:
                continue
            use = next((e for e in getattr(j, "eqns", ()) if any(v is var for v in e.invars)),
                       None)
            out.append((c, equation_line(use) if use is not None else "",
                        {f.file_name for f in traceback_frames(use)} if use is not None else set()))
    return out


def traceback_frames(eqn) -> list:
    """The frames of the traceback that made a jaxpr equation, innermost first (JAX's own and
    the user's); [] where it has none."""
    try:
        return list(eqn.source_info.traceback.frames)
    except Exception:  # an equation without a traceback
        return []


def innermost_user(eqn):
    """The user's innermost frame of the traceback that made a jaxpr equation, or None."""
    return next((f for f in traceback_frames(eqn) if frames.is_user_file(f.file_name)), None)


def user_frame(eqn) -> tuple[str, int] | None:
    """(file, line) of the user's innermost frame that made a jaxpr equation, or None."""
    f = innermost_user(eqn)
    return (f.file_name, f.line_num) if f else None


def equation_line(eqn) -> str:
    """The user's line that made a jaxpr equation ("" where its traceback names none)."""
    where = user_frame(eqn)
    return frames.line(*where) if where else ""


def equation_where(eqn) -> str:
    """The user's file and line that made a jaxpr equation, as JAX's residual list names it
    ("model.py:12", "Cell In[3], line 2"); "" where its traceback names none."""
    where = user_frame(eqn)
    return frames.where(*where) if where else ""


def statement(file: str, line: int, most: int = 12) -> str:
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


#: the primitives of jax.checkpoint (jax.remat): remat2 is its name on jax 0.8.0 and 0.10.2
REMATS = ("remat", "remat2", "checkpoint")


def feeds_backward(eqn, j, closed=None) -> bool:
    """Whether an output of ``eqn`` (an equation of the jaxpr ``j``) is read in a backward pass:
    by an equation JAX made under ``transpose(``, or by a differentiated jax.checkpoint (the
    backward pass of a checkpoint), followed out of the inner jits that return it (``closed``:
    the step's whole jaxpr, where ``j`` is nested in it). A scan's stacked outputs read so are
    residuals; an eval scan beside a gradient's is not (a review: it was said to run under a
    derivative)."""
    callers: dict[int, tuple] = {}  # an inner jaxpr: (the equation calling it, its jaxpr)
    for outer, _ in walk(closed):
        for e in getattr(outer, "eqns", ()):
            inner = called_jaxpr(e)
            if inner is not None:
                callers[id(inner)] = (e, outer)
    todo, seen = [(j, list(eqn.outvars))], set()
    while todo:
        here, values = todo.pop()
        if id(here) in seen:
            continue
        seen.add(id(here))
        _, read = made_and_read(here)
        for v in values:
            for e in read.get(id(v), ()):
                if (e.primitive.name in REMATS and e.params.get("differentiated")) or \
                        scan_role(e) == "backward":
                    return True
        returned = [k for k, out in enumerate(here.outvars) if any(out is v for v in values)]
        if returned and id(here) in callers:
            caller, outer = callers[id(here)]
            todo.append((outer, [caller.outvars[k] for k in returned]))
    return False


def recomputed_scans(closed) -> set[int]:
    """The ids of the scan equations a jax.checkpoint recomputes whole in a backward pass: in
    a differentiated checkpoint that no scan's body holds (``jax.checkpoint(forward)`` around a
    scan over layers, NovaSky-AI/SkyRL#1083; ``remat(scan(f), policy)``, apple/axlearn#1171).
    Recomputed there, such a scan keeps what the backward pass needs from every step at once;
    a checkpoint on a scan's body (or on chunks of steps, in an outer scan) recomputes one
    step, or one chunk, at a time. JAX names them "rematted_computation", not jvp."""
    out: set[int] = set()
    todo = [(closed.jaxpr if hasattr(closed, "jaxpr") else closed, False)] \
        if closed is not None else []
    while todo:
        j, in_scan = todo.pop()
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name in REMATS and eqn.params.get("differentiated") and not in_scan:
                out.update(id(e) for body, _ in bodies(eqn) for sub, _ in walk(body)
                           for e in getattr(sub, "eqns", ()) if e.primitive.name == "scan"
                           and "rematted_computation" in str(e.source_info.name_stack))
                continue
            for sub, _ in bodies(eqn):
                todo.append((sub, in_scan or eqn.primitive.name == "scan"))
    return out


def value_types(values) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(v.aval.shape), str(v.aval.dtype)) for v in values if hasattr(v.aval, "shape")]


def types_within(few: list, many: list) -> bool:
    """Every type of ``few`` among ``many``, each as often (a multiset)."""
    left = list(many)
    for t in few:
        if t not in left:
            return False
        left.remove(t)
    return bool(few)


def input_position(jaxpr, var, depth: int = 0) -> int | None:
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
                inner = called_jaxpr(eqn)
                at = None if inner is None else input_position(inner, inner.outvars[k], depth + 1)
                return None if at is None else input_position(jaxpr, eqn.invars[at], depth + 1)
    return None


def frame_names(eqn) -> list[str]:
    """The function names of the traceback that made a jaxpr equation, innermost first."""
    return [f.function_name for f in traceback_frames(eqn)]


def zero_literal(v) -> bool:
    """A jaxpr operand that is the literal 0 (a Python 0.0 the step multiplies by)."""
    val = getattr(v, "val", None)  # a Var has none
    try:
        return val is not None and np.ndim(val) == 0 and float(val) == 0.0
    except (TypeError, ValueError):  # a value that is no number
        return False


#: primitives that call a jaxpr with their own operands, one for one, and return its outputs:
#: an inner jit, a remat, a custom derivative's function (not a scan, a loop or a branch, whose
#: body runs per step or per case)
CALLS = ("pjit", "jit", "closed_call", "core_call", *REMATS, "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr")


def called_jaxpr(eqn):
    """The jaxpr an inner jit or remat equation calls with its operands, one for one (None for
    any other equation, or one whose counts do not match)."""
    from jax.extend import core

    if eqn.primitive.name not in CALLS:
        return None
    inner = next((p for k in ("jaxpr", "call_jaxpr", "fun_jaxpr")
                  if isinstance(p := eqn.params.get(k), (core.ClosedJaxpr, core.Jaxpr))), None)
    body = inner.jaxpr if isinstance(inner, core.ClosedJaxpr) else inner
    if body is None or len(body.invars) != len(eqn.invars) or \
            len(body.outvars) != len(eqn.outvars):
        return None
    return body


def made_and_read(j) -> tuple[dict, dict]:
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


def jitted_as(eqn, names: frozenset[str]) -> bool:
    """The equation calls a jit named in ``names``: jnp's own functions are jitted under their
    names (jnp.diag as "_diag", jnp.linalg.solve as "solve", jnp.cumsum as "cumsum")."""
    return eqn.primitive.name in ("jit", "pjit") and str(eqn.params.get("name", "")) in names


def named_calls(closed, jitted: frozenset[str], primitives: frozenset[str] = frozenset()
                ) -> Iterator[tuple[Any, dict, dict, set[int]]]:
    """(the equation, its jaxpr's :func:`made_and_read` pair, the ids of that jaxpr's outputs)
    of each equation with an operand that is one of ``primitives`` or calls a jit named in
    ``jitted``, in every jaxpr of the step: where a value read by such a call comes from, and
    whether anything else reads it."""
    for j, _ in walk(closed):
        found = [e for e in getattr(j, "eqns", ()) if e.invars and (
            e.primitive.name in primitives or jitted_as(e, jitted))]
        if not found:
            continue
        made_by, read = made_and_read(j)
        returned = {id(v) for v in getattr(j, "outvars", ())}
        for eqn in found:
            yield eqn, made_by, read, returned


#: equations that only move or reshape their one operand: a value they make from an input is
#: that input (a bias broadcast to its activation's shape), for naming it
MOVES = ("broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "copy")


def bodies(eqn) -> list[tuple[Any, Sequence | None]]:
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
