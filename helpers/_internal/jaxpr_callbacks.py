"""A step's host callbacks and prints, read from its jaxpr: each with its line, one on every
iteration of a loop, moved out of a scan by ``jax.grad``, made a loop of by ``jax.vmap``, or in a
branch of a ``lax.cond`` that ``jax.vmap`` made a select; the step without its
``jax.debug.print``s; and the fix for a progress report on every step.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from helpers._internal import jaxcompat
from helpers._internal.jaxpr_walk import equation_line, innermost_user, walk

__all__ = ["callback_vmapped", "CALLBACKS", "callbacks", "callbacks_broadcast",
           "callbacks_every_step", "callbacks_calling_jax", "callbacks_hoisted",
           "callbacks_vmapped",
           "in_selected_conds", "placed_equations", "prints", "progress_fix", "without_prints"]


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
    for eqn, _, _ in placed_equations(closed, vmap_loops=True):
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


def placed_equations(closed, vmap_loops: bool = False
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
    f = innermost_user(eqn)
    return (f.file_name, f.function_name) if f else None


def _loop_name(eqn) -> str:
    return ("lax.scan" if eqn.primitive.name == "scan" else "lax.while_loop") + (
        f" of {eqn.params['length']:,} steps" if eqn.primitive.name == "scan" else "")


def callbacks_broadcast(closed) -> tuple[tuple[str, str, str, tuple[int, ...], int], ...]:
    """(the callback as the user wrote it, its line, the argument broadcast as "float32[1024,
    1024]", the shape it was broadcast to, that value's bytes) of each argument jax.vmap
    broadcast to the whole batch for a jax.pure_callback of vmap_method="broadcast_all": vmap's
    rule copies each argument it does not map once per element (a ``broadcast_in_dim`` that
    adds leading axes, right before the callback), where "expand_dims" gives it a leading axis
    of size 1 (jax-ml/jax#17187's request; jax 0.8.0, 0.10.2 and 0.12.0.1 alike)."""
    out = []
    for j, _ in walk(closed):
        made = {}
        for eqn in getattr(j, "eqns", ()):
            made.update((id(v), eqn) for v in eqn.outvars)
            if eqn.primitive.name != "pure_callback" or \
                    str(eqn.params.get("vmap_method")) != "broadcast_all":
                continue
            for v in eqn.invars:
                b = made.get(id(v))  # (vmap's rule makes it at the callback's own line)
                if b is None or b.primitive.name != "broadcast_in_dim" or \
                        equation_line(b) != equation_line(eqn):
                    continue
                before, after = b.invars[0].aval, v.aval
                if len(after.shape) <= len(getattr(before, "shape", ())):
                    continue
                nbytes = int(np.prod(after.shape, dtype=np.int64)) * after.dtype.itemsize
                out.append((CALLBACKS[eqn.primitive.name], equation_line(eqn),
                            f"{before.dtype}{list(before.shape)}", tuple(after.shape), nbytes))
    return tuple(sorted(out, key=lambda x: -x[4]))


def callbacks(closed) -> tuple[tuple[str, str], ...]:
    """(the callback as the user wrote it, its line) of each host callback in the step, nested
    ones included."""
    return tuple((CALLBACKS[eqn.primitive.name], equation_line(eqn))
                 for j, _ in walk(closed) for eqn in getattr(j, "eqns", ())
                 if eqn.primitive.name in CALLBACKS)


def pure_callback_code(closed) -> tuple[tuple[str, Any], ...]:
    """(its line, the code object of the Python it runs: None where unknown) of each
    jax.pure_callback in the step: a custom_vjp's forward and backward that call one function
    run the same code from two lines (jax 0.8.0 gives the backward's the loss's line)."""
    out = []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name != "pure_callback":
                continue
            fn = jaxcompat.callback_function(eqn.params.get("callback"))
            while isinstance(fn, functools.partial):
                fn = fn.func
            out.append((equation_line(eqn), getattr(fn, "__code__", None)))
    return tuple(out)


def in_custom_rules(closed) -> set[str]:
    """The lines of the jax.pure_callbacks inside a custom_vjp's or custom_jvp's function (its
    primal, which a derivative may leave unread while the plain call needs it)."""
    out: set[str] = set()
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if not eqn.primitive.name.startswith(("custom_vjp_call", "custom_jvp_call")):
                continue
            inner = [v for v in eqn.params.values() if hasattr(v, "eqns") or hasattr(v, "jaxpr")]
            for sub in inner:
                out.update(equation_line(e) for jj, _ in walk(sub)
                           for e in getattr(jj, "eqns", ()) if e.primitive.name == "pure_callback")
    return out


def callbacks_calling_jax(closed) -> tuple[tuple[str, str, str, str], ...]:
    """(the callback, its line, the function it runs, what in it is JAX's) of each
    jax.pure_callback and io_callback whose Python function calls JAX itself (a jitted
    function, jnp, jax.*), or a function of the same file that does: JAX work started inside a
    host callback can hang the step (jax-ml/jax#24255)."""
    out = []
    for j, _ in walk(closed):
        for eqn in getattr(j, "eqns", ()):
            if eqn.primitive.name not in ("pure_callback", "io_callback"):
                continue
            fn = jaxcompat.callback_function(eqn.params.get("callback"))
            while isinstance(fn, functools.partial):
                fn = fn.func
            if (found := _jax_inside(fn)):
                out.append((CALLBACKS[eqn.primitive.name], equation_line(eqn),
                            getattr(fn, "__name__", "its function"), found))
    return tuple(out)


#: what a callback may read from JAX without starting work: dtypes and type names, and the
#: pytree functions (jax.tree.map over NumPy values runs no JAX operation)
_HARMLESS = frozenset({"tree", "tree_util", "dtype", "dtypes", "ShapeDtypeStruct", "Array",
                       "typing", "float16", "bfloat16", "float32", "float64", "int8", "int16",
                       "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool_",
                       "complex64", "complex128", "iinfo", "finfo", "ndarray"})


def _jax_inside(fn: Any, depth: int = 2) -> str:
    """The first JAX operation ``fn``'s code reaches, as written (``jnp.linalg``, ``_EIG_JIT, a
    jitted function``): a global or closed-over name it loads (not an attribute name: NumPy's
    ``np.random`` is not jax's ``random``) that is a jax module followed by an attribute that
    is not a dtype or a pytree function, a jitted function, or a function of jax's modules;
    looked for in the functions of the same file it calls, ``depth`` levels down. "" for
    none."""
    if not isinstance(fn, types.FunctionType):
        return ""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
    for name, attribute in _loaded_names(fn.__code__):
        if name in cells:
            try:
                value = cells[name].cell_contents
            except ValueError:  # an empty cell
                continue
        elif name in fn.__globals__:
            value = fn.__globals__[name]
        else:
            continue
        if isinstance(value, types.ModuleType):
            module = value.__name__
            if (module == "jax" or module.startswith("jax.")) and attribute not in _HARMLESS \
                    and "tree" not in module.rsplit(".", 1)[-1]:  # jax.tree, tree_util
                return f"{name}.{attribute}" if attribute else name
            continue
        if hasattr(type(value), "lower") and hasattr(type(value), "clear_cache"):
            return f"{name}, a jitted function"
        module = getattr(value, "__module__", None) or ""
        if callable(value) and not isinstance(value, type) and (
                module == "jax" or module.startswith("jax.")) and "tree" not in module:
            return name
        if depth > 1 and isinstance(value, types.FunctionType) and value is not fn and \
                value.__code__.co_filename == fn.__code__.co_filename:
            if inner := _jax_inside(value, depth - 1):
                return f"{inner} in {name}"
    return ""


def _loaded_names(code) -> Iterator[tuple[str, str]]:
    """(name, the attribute read from it next, or "") for each global or closed-over name
    ``code`` loads, nested code (a comprehension, a lambda) included."""
    import dis

    instructions = list(dis.get_instructions(code))
    for k, ins in enumerate(instructions):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF"):
            after = instructions[k + 1] if k + 1 < len(instructions) else None
            attribute = (after.argval if after is not None and after.opname in (
                "LOAD_ATTR", "LOAD_METHOD") and isinstance(after.argval, str) else "")
            yield ins.argval, attribute
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _loaded_names(const)


def callbacks_every_step(closed) -> tuple[tuple[str, str, str, int | None], ...]:
    """(the callback as the user wrote it, its line, the loop: "lax.while_loop", "lax.scan of
    1,000 steps", its steps: None for a while_loop) of each host callback in a loop's body with
    no cond around it inside that loop: it runs, a host round trip, on every iteration
    (liesel-devs/liesel#282)."""
    return tuple((CALLBACKS[eqn.primitive.name], equation_line(eqn), _loop_name(loops[-1]),
                  int(loops[-1].params["length"]) if loops[-1].primitive.name == "scan"
                  else None)
                 for eqn, loops, guarded in placed_equations(closed)
                 if eqn.primitive.name in CALLBACKS and loops and not guarded)


def callbacks_hoisted(closed) -> tuple[tuple[str, str, str, str], ...]:
    """(the callback as the user wrote it, its line, the loop, the loop's line) of each host
    callback that sits outside every loop while the rest of the user's function that made it
    sits in a loop's body (none of its other equations outside every loop): under jax.grad,
    scan's partial evaluation moves a callback that reads nothing the loop changes out of the
    loop (io_callback(ordered=True) too), and it runs once, not once per step
    (jax-ml/jax#16637)."""
    placed = list(placed_equations(closed))
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
