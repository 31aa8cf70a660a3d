"""What a step computes with, read from its jaxpr: values multiplied by the constant 0.0, inputs
read only through a narrower cast, values jnp's promotion widens (and a half-precision state
computed wider and cast back), the shapes of each dtype, what each output is (a gradient, one
JAX knows is zero, a new value of an input), and the random bits threefry2x32 draws.
"""

from __future__ import annotations

import math

import numpy as np

from helpers._internal import frames, jaxcompat
from helpers._internal.jaxpr_walk import (
    MOVES,
    bodies,
    called_jaxpr,
    equation_line,
    floating,
    frame_names,
    made_and_read,
    scan_role,
    traceback_frames,
    walk,
    zero_literal,
)

__all__ = ["narrow_constants_widened", "narrowed_inputs", "output_kinds",
           "picked_log_probabilities", "promoted_round_trips", "scaled_by_zero", "shapes_by_dtype",
           "threefry_draws", "updated_inputs", "widened_inputs"]


def threefry_draws(closed) -> tuple[tuple[tuple[int, ...], int, str, int], ...]:
    """(shape, bytes, line, keys) of each ``jax.random`` draw of the step made through the
    threefry2x32 generator (JAX's default), largest first: its uint32 bits, which XLA may hold
    several times over while making them (jax-ml/jax#20328). ``keys``: how many keys it draws
    from at once, more than 1 where jax.vmap batched the key (one per example)."""
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
                            line, math.prod(getattr(eqn.invars[0].aval, "shape", ()))))
            for v in eqn.params.values():
                stack += [(sub, line) for sub in (v if isinstance(v, (tuple, list)) else (v,))
                          if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr))]
    return tuple(sorted(out, key=lambda x: -x[1]))


def narrow_constants_widened(closed) -> tuple[tuple[str, int, str], ...]:
    """("float32[1000]", bytes, the line that reads it) of each closed-over float32 jax.Array
    that the step widens to float64: under jax_enable_x64, an array made before x64 was turned
    on (a library's module-level table, made at its import) keeps float32's precision inside a
    float64 computation (ArgonneCPAC/dsps#108: a relative error of 2.75e-8 against 1.5e-16
    with x64 on before the import; jax 0.10.2). Not a NumPy array, nor a float16 or bfloat16
    one: x64 does not make those, so they were meant (a review). Largest first."""
    jax = jaxcompat.import_jax()
    out = []
    for j, consts in walk(closed):
        narrow = {id(v): c for v, c in zip(getattr(j, "constvars", ()), consts, strict=False)
                  if isinstance(c, jax.Array) and str(c.dtype) == "float32"}  # (a key: no)
        seen: set[int] = set()
        for eqn in getattr(j, "eqns", ()):
            for v in eqn.invars:
                if id(v) in narrow and id(v) not in seen and any(
                        str(getattr(o.aval, "dtype", "")) == "float64" for o in eqn.outvars):
                    seen.add(id(v))
                    c = narrow[id(v)]
                    out.append((f"{np.dtype(c.dtype).name}{list(np.shape(c))}",
                                int(np.dtype(c.dtype).itemsize * math.prod(np.shape(c))),
                                equation_line(eqn)))
    return tuple(sorted(out, key=lambda x: -x[1]))


def _named_call(eqn, name: str) -> bool:
    """An inner jit JAX's own function ``name`` made (jax.nn.log_softmax's, jnp's ``_one_hot``)."""
    return eqn is not None and eqn.primitive.name in ("jit", "pjit") and \
        eqn.params.get("name") == name


def _reduced_axes(eqn) -> set[int]:
    """The axes the reductions inside an inner jit reduce (log_softmax's max and sum: its
    ``axis``); empty where it reduces nothing."""
    return {int(a) for q in called_jaxpr(eqn).eqns if q.primitive.name.startswith("reduce_")
            for a in q.params.get("axes", ())} if called_jaxpr(eqn) is not None else set()


def picked_log_probabilities(closed) -> tuple[tuple[str, int, str, str], ...]:
    """("float32[4, 256, 8192]", bytes, line, how: "take_along_axis" or "a one-hot") of each
    ``jax.nn.log_softmax`` whose whole output the step reads only to pick one value per row:
    through ``jnp.take_along_axis`` with the labels, or multiplied by ``jax.nn.one_hot`` of them
    (a sparse cross-entropy, keras-team/keras#20005). Only a log_softmax over the last axis,
    and a take_along_axis of one value per row (a review found the note naming the last-axis
    fix for ``axis=1``, where it raises). Largest first."""
    out = []
    for j, _ in walk(closed):
        made, read = made_and_read(j)
        for eqn in j.eqns:
            if not _named_call(eqn, "log_softmax") or not eqn.outvars:
                continue
            v = eqn.outvars[0]  # (under jax.grad its residuals follow, for the backward pass)
            shape = tuple(v.aval.shape)
            if not shape or _reduced_axes(eqn) != {len(shape) - 1}:
                continue  # over another axis than the last (the fix named is for the last)
            hows = set()
            for r in read.get(id(v), []):
                if _named_call(r, "take_along_axis") and r.outvars and \
                        tuple(r.outvars[0].aval.shape) == (*shape[:-1], 1):
                    hows.add("take_along_axis")  # one per row: the label's
                elif r.primitive.name == "mul" and any(
                        _named_call(made.get(id(o)), "_one_hot") for o in r.invars if o is not v):
                    hows.add("a one-hot")
                else:
                    hows = set()
                    break
            if hows:
                out.append((f"{np.dtype(v.aval.dtype).name}{list(shape)}",
                            int(np.dtype(v.aval.dtype).itemsize * math.prod(shape)),
                            equation_line(eqn), sorted(hows)[0]))
    return tuple(sorted(out, key=lambda x: -x[1]))


def scaled_by_zero(closed) -> tuple[tuple[str, int, str], ...]:
    """("float32[512, 512]", bytes, line) of each floating array the step computes and then
    multiplies by the constant 0.0, largest first. An argument times 0.0 (a weight decay of
    0.0) is not listed: nothing is computed for it; nor an integer, which XLA folds."""
    out = []
    for j, _ in walk(closed):
        made = {id(v) for eqn in getattr(j, "eqns", ()) for v in eqn.outvars}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "mul" or not any(zero_literal(v) for v in eqn.invars):
                continue
            aval = eqn.outvars[0].aval
            computed = any(id(v) in made for v in eqn.invars)
            if computed and getattr(aval, "shape", ()) and floating(aval.dtype):
                out.append((f"{aval.dtype}{list(aval.shape)}",
                            math.prod(aval.shape) * aval.dtype.itemsize, equation_line(eqn)))
    return tuple(sorted(out, key=lambda x: -x[1]))


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
            indexes[id(j)] = made_and_read(j)
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
            body = called_jaxpr(eqn)
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
            if to is None or not floating(to) or \
                    np.dtype(to).itemsize >= var.aval.dtype.itemsize:
                return None
            found.append((str(np.dtype(to)), equation_line(eqn)))
        return found

    jaxpr = getattr(closed, "jaxpr", None)
    out = []
    for n, var in enumerate(getattr(jaxpr, "invars", ())):
        dtype = getattr(var.aval, "dtype", None)
        if dtype is None or not floating(dtype) or not var.aval.shape:
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
    made = traceback_frames(eqn)
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
        made, read = made_and_read(j)
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
            for body, operands in ([] if scan_role(eqn) == "backward" else bodies(eqn)):
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


def _moved_from(var, made: dict, origin: dict[int, int]) -> int | None:
    """The position among the inputs of the input ``var`` is, or is made from by moving or
    reshaping it alone (:data:`MOVES`); None for anything else."""
    while id(var) not in origin:
        eqn = made.get(id(var))
        ins = [v for v in eqn.invars if not hasattr(v, "val")] if eqn is not None else []
        if eqn is None or eqn.primitive.name not in MOVES or len(ins) != 1:
            return None
        var = ins[0]
    return origin[id(var)]


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
        if to is None or dtype is None or not (floating(dtype) and floating(to)) or \
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
        if da is None or db is None or da == db or not (floating(da) and floating(db)):
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
        _, read = made_and_read(j)
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
            indexes[id(j)] = made_and_read(j)
        made_by, _ = indexes[id(j)]
        made = made_by.get(id(var))
        if made is None:
            return ""
        body = called_jaxpr(made)
        if body is not None:
            at = next(i for i, v in enumerate(made.outvars) if v is var)
            return kind(body, body.outvars[at])
        names = set(frame_names(made))
        if made.primitive.name == "broadcast_in_dim" and "instantiate_zeros" in names and \
                any(zero_literal(v) for v in made.invars):
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
    # each value's answer once: a value read twice (sin(x) and cos(x) of one x, layer after
    # layer) is otherwise walked once per path, 2**layers times (a 20-layer gradient took 89 s)
    known: dict[tuple[int, int, int], frozenset[int]] = {}
    kept: list[dict] = []  # the inner maps, alive while their ids are keys

    def reach(j, var, inputs: dict) -> set[int]:
        """The top-level inputs ``var`` of jaxpr ``j`` updates; ``inputs`` maps ``j``'s own
        inputs (by id) to the top-level positions they stand for."""
        key = (id(j), id(var), id(inputs))
        if key not in known:
            known[key] = frozenset(_reach(j, var, inputs))
        return set(known[key])

    def _reach(j, var, inputs: dict) -> set[int]:
        if id(var) in inputs:
            return set(inputs[id(var)])
        if id(j) not in indexes:
            indexes[id(j)] = made_and_read(j)
        made = indexes[id(j)][0].get(id(var))
        if made is None:
            return set()
        body = called_jaxpr(made)
        if body is not None:
            at = next(i for i, v in enumerate(made.outvars) if v is var)
            inner = {id(b): frozenset(reach(j, o, inputs)) if not hasattr(o, "val") else
                     frozenset() for b, o in zip(body.invars, made.invars, strict=True)}
            kept.append(inner)
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
