"""Devices and meshes in a step's jaxpr: a ``device=`` that jit drops, a ``device_put`` to a Device
it ignores, and under ``shard_map`` a ``psum`` of a value already the same on every device or
one returned whole with ``out_specs`` P().
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from helpers._internal import frames
from helpers._internal.jaxcompat import device_name
from helpers._internal.jaxpr_walk import (
    called_jaxpr,
    equation_line,
    made_and_read,
    statement,
    traceback_frames,
    user_frame,
    walk,
)

__all__ = ["device_keywords_and_puts", "psums_of_invariant", "replicated_sums"]


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
                if said := _DEVICE_KEYWORD.search(statement(*user_frame(eqn))):
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
    made, _ = made_and_read(jaxpr)
    for n, v in enumerate(jaxpr.outvars):
        out[id(v)] = n
        eqn = made.get(id(v))
        body = called_jaxpr(eqn) if eqn is not None else None
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
    fs = traceback_frames(eqn)
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
