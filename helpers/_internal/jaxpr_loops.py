"""What a step's loops do, read from its jaxpr: what a ``lax.scan`` stacks, carries and
checkpoints, a ``while_loop``'s values, a Python loop unrolled into many copies of one line (and
whether ``scan`` or ``fori_loop`` can take it), a loop that writes each step's value into a buffer
it carries, and a scan that runs on after its stop flag is on everywhere.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from helpers._internal import frames, jaxcompat
from helpers._internal.jaxpr_walk import (
    MOVES,
    REMATS,
    called_jaxpr,
    equation_line,
    equation_where,
    floating,
    has_derivative,
    input_position,
    made_and_read,
    scan_role,
    types_within,
    value_types,
    walk,
)

__all__ = ["calling_loop", "carry_lines", "cast_before_scan", "chained_scans", "chunked_inputs",
           "drawn_before_scans", "line_repeats", "line_runs",
           "LOOKUPS_FIX", "loop_kind", "loop_records", "LOOP_REPEATS", "moved_input",
           "PARTIAL_UNROLL",
           "repeated_outputs", "scalar_inputs", "SCALARS_FIX", "scan_carry_bytes",
           "scan_checkpoint", "scan_copied_xs", "scan_updated_xs", "sliced_lines",
           "SLICED_LOOP_FIX", "stop_flags", "UNALIKE_LOOP_FIX", "unchanged_in_rows",
           "unrolled_line", "while_loops", "widened_carries"]


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
        source = input_position(body, var)
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
        kind, start, writes = value_types([var]), var, 0
        while (e := made.get(id(start))) is not None and e.primitive.name in _WRITES and (
                writes < 64):
            start, writes = e.invars[0], writes + 1
        source = input_position(body, start) if writes else None
        out.append(source is not None and source >= first_xs
                   and value_types([body.invars[source]]) == kind)
    return out


def scan_carry_bytes(eqn) -> int:
    """The bytes of one step's carry of a ``lax.scan``: what ``jax.checkpoint`` on its body
    keeps for each step (jax-ml/jax#19250)."""
    return sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize
               for v in eqn.outvars[:jaxcompat.scan_counts(eqn.params)[1]]
               if hasattr(v.aval, "shape"))


def scan_checkpoint(eqn) -> tuple[bool, bool]:
    """(whether a ``lax.scan``'s body runs under ``jax.checkpoint``, whether that checkpoint
    holds a scan of its own: a scan of checkpointed chunks of steps). Read from the body and
    the inner jits it calls, not from a scan nested in it. In a gradient's forward scan JAX has
    already split the checkpoint off (its backward scan keeps it: jax 0.8.0 and 0.10.2)."""
    body = eqn.params["jaxpr"]
    carry = sorted(value_types(eqn.outvars[:jaxcompat.scan_counts(eqn.params)[1]]))
    stack = [getattr(body, "jaxpr", body)]
    while stack:
        for inner in stack.pop().eqns:
            if inner.primitive.name in REMATS:  # chunks: an inner scan that carries ours
                return True, any(
                    e.primitive.name == "scan" and types_within(
                        carry, value_types(e.outvars[:jaxcompat.scan_counts(e.params)[1]]))
                    for j, _ in walk(inner.params.get("jaxpr")) for e in getattr(j, "eqns", ()))
            if (called := called_jaxpr(inner)) is not None:
                stack.append(called)
    return False, False


def moved_input(var, made: dict, invars: dict) -> int:
    """The position among the jaxpr's inputs of the input ``var`` is, or is moved or reshaped
    from (:data:`MOVES`), -1 for anything else."""
    for _ in range(8):
        if id(var) in invars:
            return invars[id(var)]
        eqn = made.get(id(var))
        ins = [v for v in eqn.invars if not hasattr(v, "val")] if eqn is not None else []
        if eqn is None or eqn.primitive.name not in MOVES or len(ins) != 1:
            return -1
        var = ins[0]
    return -1


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
            made_by, read = made_and_read(body)
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
    ``read``: ``j``'s readers by variable (:func:`made_and_read`), where the caller has them."""
    if depth > 8:
        return False
    if read is None:
        _, read = made_and_read(j)
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
            elif (inner := called_jaxpr(eqn)) is not None:
                if any(_gates(inner, inner.invars[k], None, depth + 1)
                       for k, v in enumerate(eqn.invars) if v is var):
                    return True
    return False


def while_loops(closed) -> tuple[tuple[str, int], ...]:
    """(the user's line, the position among the jaxpr's own inputs of the integer input its
    condition reads: a bound, -1 where none is) of each ``while`` in the jaxpr and in those
    nested in it. A ``lax.fori_loop`` whose bounds are traced (a jit argument, a jnp value) is
    one; reverse-mode differentiation cannot go through it (jax-ml/jax#2956)."""
    out = []
    for depth, (j, _) in enumerate(walk(closed)):
        invars = {id(v): i for i, v in enumerate(getattr(j, "invars", ()))} if depth == 0 \
            else {}
        made, _ = made_and_read(j) if getattr(j, "eqns", None) is not None else ({}, {})
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "while":
                continue
            cond = eqn.params["cond_jaxpr"]
            cond = getattr(cond, "jaxpr", cond)
            consts = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
            operands = [*eqn.invars[:eqn.params["cond_nconsts"]], *eqn.invars[consts:]]
            used = {id(v) for e in cond.eqns for v in e.invars}
            # a bound is an integer (a fori_loop's upper); a float the condition reads is a
            # convergence test's tolerance, which no Python int can replace (mujoco#2259)
            read = [x for x, inner in zip(operands, cond.invars, strict=False)
                    if id(inner) in used and not hasattr(x, "val")
                    and str(getattr(x.aval, "dtype", "")).startswith(("int", "uint"))]
            bound = next((p for x in read if (p := moved_input(x, made, invars)) >= 0), -1)
            out.append((equation_where(eqn), bound))
    return tuple(out)


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


def _user_line(tb) -> tuple[tuple[str, int], list, bool] | None:
    """((file, line) of the innermost user frame, the traceback's frames, whether JAX's own
    loop code sits between it and the equation) for an equation's traceback; None where it
    names no user frame or cannot say."""
    try:
        fs = list(tb.frames) if tb is not None else []
    except Exception:  # a traceback that cannot say
        return None
    user = next((i for i, f in enumerate(fs) if frames.is_user_file(f.file_name)), None)
    if user is None:
        return None
    jax_own = any(own in f.file_name.replace("\\", "/") for f in fs[:user] for own in _JAX_OWN)
    return (fs[user].file_name, fs[user].line_num), fs, jax_own


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
        if (found := _user_line(tb)) is None:
            continue
        key, fs, jax_own = found
        line = out.setdefault(key, [0, 0, 0, 0, False, None])
        if jax_own:
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


def line_runs(closed) -> dict[tuple[str, int], int]:
    """Per line of the user's code, (file, line): how many times it ran in the step, the
    number of times its equations (one primitive, one call stack each) most often recur
    outside a derivative but one jax.grad's forward pass, the smaller where two are as common;
    1 where none recurs. Not the most recurrences (:func:`line_repeats`), which count an
    equation a call makes twice from one stack (jax 0.8.0's log_softmax: 16 for a loop of 8),
    nor their common divisor: ``total += ...`` from 0.0 makes its first add from a stack of
    its own (1 and 7 in a loop of 8, HomebrewML/Olmax#25; jax 0.10.2). JAX's own loop code
    left out."""
    out: dict[tuple[str, int], Counter] = {}
    for (_, tb), (_, primal, _, _) in _stack_groups(closed).items():
        if not primal or (found := _user_line(tb)) is None or found[2]:
            continue
        out.setdefault(found[0], Counter())[primal] += 1
    runs = {}
    for key, counts in out.items():
        recurring = {n: k for n, k in counts.items() if n > 1}
        most = max(recurring.values(), default=0)
        runs[key] = min((n for n, k in recurring.items() if k == most), default=1)
    return runs


#: how many returns from a backward pass to a forward one (:func:`backward_passes`) say that each
#: iteration of a loop takes its own derivative, not one derivative the whole loop
OWN_DERIVATIVES_AT = 3


def backward_passes(closed, line: str) -> int:
    """How many times, in program order, the equations the user's ``line`` ("file.py:12: code",
    as :func:`helpers._internal.frames.line` writes it) made go from a backward pass's (a
    transpose in their name stack) back to a forward pass's: 0 where one derivative takes the
    whole loop (its forward iterations, then its backward ones: HomebrewML/Olmax#25's chunks), one
    less than the iterations where each takes its own jax.grad (araffin/sbx#14: an update per
    gradient step, each backward pass done before the next forward one)."""
    last, switches = False, 0
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            try:
                stack = str(eqn.source_info.name_stack)
                found = _user_line(eqn.source_info.traceback)
            except Exception:  # an equation without its source
                continue
            if found is None or frames.line(*found[0]) != line:
                continue
            # the outermost derivative's pass: under an outer jax.grad (MAML's, over inner
            # ones) an inner backward pass is the outer's forward, which keeps every iteration;
            # a loss that takes a derivative itself (a gradient penalty) stays each iteration's
            first = re.search(r"(transpose|jvp)\(", stack)
            back = bool(first) and first.group(1) == "transpose"
            switches += last and not back
            last = back
    return switches


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
    :data:`LOOP_REPEATS` times or more into slices of more than one shape, of one array (of one
    shape): a loop slicing by its index (``U[k, k:n]`` in an LU factorization: jax-ml/jax#2242).
    Windows of one width over several arrays on one line (``x[B * i:B * (i + 1)]`` of each of a
    batch's arrays: araffin/sbx#14, a new user's trial) are slices of one shape each."""
    shapes: dict[tuple[str, int], dict[tuple, Counter]] = {}
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
                shapes.setdefault((user.file_name, user.line_num), {}).setdefault(
                    tuple(eqn.invars[0].aval.shape), Counter())[
                    tuple(eqn.outvars[0].aval.shape)] += 1
    # shapes that change with the index: more of them than each is made (x[k:] in one loop,
    # in two calls, or under jax.jvp), or some made more often than others (nested loops); a
    # fixed split of each iteration's array (x[:, :8], x[:, 8:]) makes a few shapes, each once
    # an iteration (two reviews)
    return {key for key, seen in shapes.items()
            if sum(sum(c.values()) for c in seen.values()) >= LOOP_REPEATS
            and any(len(c) > 1 and (len(set(c.values())) > 1 or len(c) > max(c.values()))
                    for c in seen.values())}


def chunked_inputs(closed) -> int:
    """The most pieces of one shape that the step's code cuts from one input of a jaxpr along
    its first dimension (``x[i:i + k]`` in a Python loop over chunks of a batch, as
    HomebrewML/Olmax#25's cross-entropy does), each from its own start and more than one row
    long; 0 where none. A loop over layers cuts no such pieces: its weights are arguments of
    their own, or rows of a stack (``W[i]``), and a loop over time steps reads rows too
    (``x[t]``); for these a checkpointed scan raised XLA's plan (a review's run on jax
    0.10.2: 6 stacked layers 7.5 -> 10 MiB, an RNN of 16 steps 9.25 -> 10 MiB)."""
    most = 0
    for j, _ in walk(closed):
        inputs = {id(v) for v in getattr(j, "invars", ())}
        starts: dict[tuple, set] = {}
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "slice" or id(eqn.invars[0]) not in inputs:
                continue
            shape = tuple(eqn.invars[0].aval.shape)
            start, limit = eqn.params["start_indices"], eqn.params["limit_indices"]
            if not shape or limit[0] - start[0] < 2 or any(
                    a or b != n for a, b, n in zip(start[1:], limit[1:], shape[1:], strict=True)):
                continue  # one row (a layer, a time step), or cut along another dimension too
            starts.setdefault((id(eqn.invars[0]), limit[0] - start[0]), set()).add(start[0])
        most = max([most, *(len(found) for found in starts.values())])
    return most


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
    moves = (*MOVES, "convert_element_type")
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
        if hasattr(v.aval, "shape") and floating(v.aval.dtype) and v.aval.shape:
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
                    if hasattr(v.aval, "shape") and floating(v.aval.dtype)
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
                if (floating(before.dtype) and floating(after.dtype)
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


def _drawn_outputs(j, depth: int = 0) -> dict[int, Any]:
    """id of each variable of jaxpr ``j`` that holds random values (random bits, or what
    elementwise arithmetic with far smaller values makes of them: mu + sigma * z) -> the
    equation that drew them; through inner jits, an output only where the inner jaxpr's own
    output is drawn (a jitted encoder that applies dropout returns no draws: a review)."""
    drawn: dict[int, Any] = {}
    for eqn in getattr(j, "eqns", ()):
        shape = getattr(eqn.outvars[0].aval, "shape", None) if eqn.outvars else None
        if not shape:  # (a token, a scalar: no array of draws)
            continue
        size = math.prod(shape)
        if eqn.primitive.name in ("random_bits", "threefry2x32"):
            if size >= 1024:
                for v in eqn.outvars:
                    drawn[id(v)] = eqn
            continue
        inner = called_jaxpr(eqn)
        if inner is not None and depth < 4:
            found = _drawn_outputs(inner, depth + 1)
            for v, w in zip(eqn.outvars, inner.outvars, strict=False):
                if id(w) in found and math.prod(getattr(v.aval, "shape", ()) or (0,)) >= 1024:
                    drawn[id(v)] = eqn
            continue
        # elementwise with the draws, every other operand far smaller (a scalar, a row)
        ins = [v for v in eqn.invars if not hasattr(v, "val")]
        source = next((drawn[id(v)] for v in ins if id(v) in drawn), None)
        if source is not None and len(eqn.outvars) == 1 and all(
                id(v) in drawn or 8 * math.prod(getattr(v.aval, "shape", ()) or (1,)) <= size
                for v in ins) and eqn.primitive.name not in ("scan", "while", "cond",
                                                             "dot_general"):
            drawn[id(eqn.outvars[0])] = source
    return drawn


def drawn_before_scans(closed) -> tuple[tuple[tuple[int, ...], str, int, str, str], ...]:
    """(shape, dtype, bytes, the draw's line, the scan's line) of each array of random values
    (jax.random.normal(key, (T, M)) and what elementwise arithmetic with smaller values makes
    of it: mu + sigma * z) drawn whole and read by a ``lax.scan`` one row per step: every
    step's draws held at once, growing with the scan's length, where a key per step inside the
    body draws one row at a time (QuantEcon/lecture-python.myst#329: three (T, M) matrices of
    shocks, 9.31 GiB asked of a 10 GB card). Largest first."""
    out = []
    for j, _ in walk(closed):
        drawn = _drawn_outputs(j)
        if not drawn:
            continue
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "scan":
                continue
            first = sum(jaxcompat.scan_counts(eqn.params))
            for v in eqn.invars[first:]:
                shape = getattr(v.aval, "shape", None)
                if id(v) in drawn and shape:
                    out.append((tuple(shape), str(v.aval.dtype),
                                math.prod(shape) * v.aval.dtype.itemsize,
                                equation_line(drawn[id(v)]), equation_line(eqn)))
    return tuple(sorted(out, key=lambda x: -x[2]))


#: where the unrolled loop was faster to run: a partial unroll (noegroup/ScoreMD#7, a Langevin
#: step unrolled on purpose, which its maintainer kept for speed on a GPU; on the CPU, 50 steps:
#: 23.4 s to the first result unrolled, 2.3 s with lax.scan, 3.4 s with unroll=10)
PARTIAL_UNROLL = (" Where the unrolled loop ran faster, jax.lax.scan(..., unroll=k) keeps k "
                  "steps in each copy of the body and still compiles a program of bounded size "
                  "(noegroup/ScoreMD#7).")
