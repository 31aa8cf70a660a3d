"""What a step's program holds, in words: one note for each finding of :mod:`helpers.compiled`
(a value XLA keeps, a loop, a Jacobian, a cast, random bits, a value gathered whole), with its
cause and its fix in one or two sentences and the numbers of the record. :func:`helpers.preflight.
preflight_step` keeps them in its record's advice; :mod:`helpers.step_arguments` says the same of
a step's arguments."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers import compiled, devices
from helpers._internal import (
    frames,
    jaxcompat,
    jaxpr_callbacks,
    jaxpr_loops,
    jaxpr_products,
    jaxpr_values,
    jaxpr_walk,
)
from helpers._internal.jaxcompat import device_name
from helpers.units import NotAvailable, format_bytes

if TYPE_CHECKING:
    import jax

__all__ = ["attention_note", "basis_note", "batched_by_line", "batched_note", "bound_method_note",
           "callback_broadcast_note", "callback_loop_note", "carry_copy_note", "cast_note",
           "checkpoint_fix", "chunk_size", "chunks_fix", "cpu_upcast", "cpu_upcast_note",
           "cumulative_cutoff_note", "repeated_operand_note", "scan_draws_note",
           "diagonal_matrix_note",
           "einsum_blowups", "einsum_note",
           "factorization", "factorization_note", "FACTORIZATIONS", "float64_arguments",
           "float64_note", "fwd_rule_fix", "gathered", "identity_static_note",
           "invariant_psum_note", "jacobian_diagonal_note", "jacobian_note",
           "jacobian_product_note", "logits_note",
           "on_the_host_by_commitment",
           "output_too_large_note", "picked_log_probabilities_note",
           "pairwise_map_note", "pairwise_temporary", "print_note", "random_bits_whole",
           "record_note", "replicated_output_note", "replicated_sum_note", "selected_cond_note",
           "slice_copy_note",
           "sliced_sort_note", "softmax_inputs", "sort_scratch_note", "sorts_for_cutoffs",
           "sorts_to_slice",
           "sparse_note", "stack_note", "stacked_indices", "stopped_scan_note", "threefry_note",
           "unrolled_under_derivative", "unrolled_values", "widened", "widened_carry_note",
           "widened_note"]


#: the operations that cut a part of an array: where one gathers a split argument whole, the
#: part was cut along the split dimension
_SLICES = ("dynamic_slice", "slice")
#: the operations .at[...].set/.add/.mul/.min/.max become: where one gathers a split argument
#: whole, it wrote a slice of rows along the split dimension (jax-ml/jax#23052)
_SCATTERS = ("scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul",
             "scatter-min", "scatter_min", "scatter-max", "scatter_max")


def gathered(c: compiled.CompiledStep, temporaries: Sequence[compiled.Temporary], args: tuple,
             kwargs: dict) -> list[tuple[compiled.Temporary, str]]:
    """(temporary, how it was used: "callback", "slice", "index" or "write") of each large
    temporary (1 MiB or more) with the whole shape of an argument split over several devices:
    of a callback (jax.debug.print, a host callback), a value gathered from its shards to be
    handed to the host; otherwise only where XLA's program (``c.text``) all-gathers a value of
    that shape and the line that made it cuts a part ("slice": the argument gathered whole onto
    each device to cut a part along its split dimension, apple/axlearn#993, a minibatch sliced
    from a batch split over devices), indexes it with a value the program traces ("index":
    ``V[t]`` with ``t`` a vmapped element, OpenSourceEconomics/pylcm#391: any device may read
    any row) or writes into it ("write": ``x.at[0:3].set(u)``, a scatter at a slice of Python
    ints along the split dimension, jax-ml/jax#23052: XLA gathers the whole array to write it,
    where an index array or ``lax.dynamic_update_slice`` writes in place; jax 0.8.0 to
    0.12.0.1 alike). The
    line's operations come from the jaxpr: XLA names the gather's buffer after the argument on
    jax 0.12, after the gather on 0.10.2. A gather a sharded layer makes by design (FSDP's
    weights) is none of these."""
    whole = {tuple(leaf.shape) for leaf in devices.start_jax().tree.leaves((args, kwargs))
             if compiled.devices_split_over(leaf) > 1}
    gathers = jaxcompat.all_gather_shapes(c.text or "")
    found = [t for t in temporaries if tuple(t.shape) in whole and t.nbytes >= 2**20]
    ops = _line_ops(c, {t.line for t in found if t.op not in jaxpr_callbacks.CALLBACKS
                        and tuple(t.shape) in gathers})
    out = []
    for t in found:
        made = ops.get(t.line, set()) | {t.op}
        if t.op in jaxpr_callbacks.CALLBACKS:  # under GSPMD the host takes it whole (jax#25842)
            out.append((t, "callback"))
        elif tuple(t.shape) not in gathers:
            continue
        elif "gather" in made:
            out.append((t, "index"))
        elif made & set(_SCATTERS):
            out.append((t, "write"))
        elif made & set(_SLICES):
            out.append((t, "slice"))
    return out


#: how many times the table's rows a gather must make to be read as one row per edge
EDGE_GATHER_RATIO = 4


def edge_gathers(c: compiled.CompiledStep, temporaries: Sequence[compiled.Temporary],
                 peak: int) -> tuple[str, str, int, str, int] | None:
    """(the table, "float32[131072, 64]", its bytes, the gather's line, the bytes of the values
    with one row per index) of a gather that copies a row of a table for each of
    :data:`EDGE_GATHER_RATIO` times as many indices as the table has rows, in a step that also
    scatter-adds that many rows back (message passing in a graph network: ``x[src]`` summed
    into ``dst``, jax-ml/jax#1979), where the values with one row per index are a quarter of the
    peak or more; None otherwise."""
    if c.jaxpr is None or peak <= 0:
        return None
    gathers, scattered = [], set()
    for j, _ in jaxpr_walk.walk(c.jaxpr):
        for e in getattr(j, "eqns", ()):
            name = e.primitive.name
            if name == "gather" and len(e.invars) > 1:
                table, out = e.invars[0].aval, e.outvars[0].aval
                if (len(table.shape) == 2 and len(out.shape) == 2
                        and out.shape[0] >= EDGE_GATHER_RATIO * table.shape[0]):
                    gathers.append((table, out, jaxpr_walk.equation_line(e)))
            elif name in ("scatter-add", "scatter_add") and len(e.invars) > 2 and \
                    jaxpr_walk.scan_role(e) != "backward":
                # (a backward pass's scatter-add is a gather's gradient, an embedding's: no
                # sum the user wrote)
                scattered.add(int(e.invars[2].aval.shape[0]) if e.invars[2].aval.shape else 0)
    for table, out, line in sorted(gathers, key=lambda g: -g[1].size):
        edges = int(out.shape[0])
        per_edge = sum(u.nbytes for u in temporaries if u.shape and u.shape[0] == edges)
        if edges in scattered and 4 * per_edge >= peak:
            nbytes = int(out.size) * out.dtype.itemsize
            return (f"{table.dtype}{list(table.shape)}", f"{out.dtype}{list(out.shape)}",
                    nbytes, line, per_edge)
    return None


def edge_gather_note(table: str, what: str, nbytes: int, line: str, per_edge: int) -> str:
    """The note for :func:`edge_gathers`: the step holds a value per edge, not per node; edges
    in chunks under a scan into a carried sum hold one chunk's (a new user's trial: 35.5 MiB
    planned, 7.1 MiB in chunks of 16384 edges; jax-ml/jax#1979 hoped XLA would fuse the gather
    into the scatter, which the CPU's plan does not)."""
    at = f" ({line})" if line else ""
    return (f"A gather{at} copies a row of {table} for every index, {what} "
            f"({format_bytes(nbytes)}), and a scatter-add (jax.ops.segment_sum, .at[].add) sums "
            f"as many rows back: the step makes {format_bytes(per_edge)} of values with one row "
            "per edge (XLA may reuse one's buffer for another), growing with the edges, not the "
            "nodes. Fix: a jax.lax.scan over chunks of the indices (src.reshape(-1, k), dst "
            "likewise) that gathers one chunk and adds it into a carried sum of the table's "
            "shape holds one chunk's rows, for the same result (jax-ml/jax#1979 hoped XLA would "
            "fuse the gather into the scatter: this backend's plan keeps the rows; whether a "
            "GPU's does is from the thread, not yet run on a GPU).")


def diagonal_product_note(shape: tuple[int, ...], dtype: str, nbytes: int, line: str,
                          diagonal_line: str) -> str:
    """A square matrix product made only for its diagonal (:func:`jaxpr_products.
    diagonal_products`): each diagonal entry is one row of X times one column of Y, so an
    einsum gives the m of them without the m x m product (thomaspinder/GPJax#389: a predictive
    variance; a new user's trial: 19.37 GiB to 1.13 GiB at m = 50,000)."""
    at = f" ({line})" if line else ""
    by = f" at {diagonal_line}" if diagonal_line and diagonal_line != line else ""
    return (f"A matrix product{at} makes {dtype}{list(shape)} ({format_bytes(nbytes)}) only for "
            f"its diagonal{by} (jnp.diag or jnp.diagonal): {shape[0]} values "
            f"of its {shape[0] * shape[1]:,}. The diagonal of X @ Y is jnp.einsum('ik,ki->i', "
            "X, Y) (of A.T @ A, jnp.sum(A * A, axis=0)), which makes no matrix "
            "(thomaspinder/GPJax#389, a predictive variance).")


def _line_ops(c: compiled.CompiledStep, lines: set[str]) -> dict[str, set[str]]:
    """The primitives of the step's jaxpr that each of ``lines`` made, in one walk (none
    without a jaxpr; "" is no line)."""
    lines = lines - {""}
    out: dict[str, set[str]] = {}
    if not lines or c.jaxpr is None:
        return out
    for j, _ in jaxpr_walk.walk(c.jaxpr):
        for e in getattr(j, "eqns", ()):
            if (line := jaxpr_walk.equation_line(e)) in lines:
                out.setdefault(line, set()).add(e.primitive.name)
    return out


def jacobian_note(r: compiled.Jacobian, held: compiled.Temporary, count: int = 1,
                  total: int = 0) -> str:
    """A Jacobian made the long way: jax.jacrev over a function with more outputs than inputs
    (jax#215), or jax.jacfwd over one with more inputs than outputs (jax#719); ``held``: the
    largest value XLA's plan holds for its batch (its first dimension), one of ``count`` such
    values of ``total`` bytes (a deep function's tangents, one per layer: jax-ml/jax#14447's
    30 layers of 1,024 inputs, four f32[1024, 1024] of 16.86 MB of temporaries with jacfwd,
    4.2 KB with jax.jvp, none with jax.grad; jax 0.10.2).
    Measured by the kit: jax#215's function with 5,120 outputs of 20 inputs, a peak of 107 MiB
    with jacrev and 401 KiB with jacfwd on jax 0.10.2, whose plan holds the 100 MiB identity;
    6.8 MiB and 401 KiB on jax 0.8.0, whose plan fuses the identity away."""
    at = f" ({r.line})" if r.line else ""
    if r.mode == "reverse":
        made, one, other, fix, how = ("row per output", "output", "input", "jax.jacfwd",
                                      "pulling back")
    else:
        made, one, other, fix, how = ("column per input", "input", "output", "jax.jacrev",
                                      "pushing forward")
    others = f"{r.other_way:,} {other}{'s' if r.other_way != 1 else ''}"
    more = f" and {count - 1} more of the kind, {format_bytes(total)} in all," if count > 1 else ""
    return (f"jax.{'jacrev' if r.mode == 'reverse' else 'jacfwd'}{at} makes its Jacobian one "
            f"{made} of the function, all {r.batch:,} at once under vmap ({how} an identity "
            f"of {r.batch:,} x {r.batch:,}), for {others}: XLA's plan holds {held.op} "
            f"{held.dtype}{list(held.shape)} ({format_bytes(held.nbytes)})"
            f"{more} for them. With "
            f"more {one}s than {other}s, {fix} makes the same Jacobian one "
            f"{'column' if r.mode == 'reverse' else 'row'} per {other} ({others} here) and "
            "needs far less.")


def jacobian_product_note(p: compiled.JacobianProduct,
                          made_for: Sequence[compiled.Temporary] = ()) -> str:
    """A whole Jacobian or Hessian made only to be multiplied by a vector (jax-ml/jax#2937,
    where mattjj pointed to the autodiff cookbook's ``hvp``): ``jax.jvp`` or ``jax.vjp`` gives
    the product without it. Measured by the kit on the CPU, a pairwise energy of 96 atoms
    (288 inputs) at 32 points: ``jax.vmap(jax.hessian(V))`` then an einsum with one vector per
    point, 10.44 MiB of temporaries; the vmapped ``jvp(grad(V))``, 0 B (jax 0.10.2).
    ``made_for``: the values one line makes to build it, together larger than it (jacfwd's
    basis pushed through at once, as in jax-ml/jax#787), which the product needs none of."""
    if p.kind == "hessian":
        what = "Hessian (jax.hessian)"
        fix = ("jax.jvp(jax.grad(f), (x,), (v,))[1] gives that product without it (a "
               "Hessian-vector product)")
    else:
        what = f"Jacobian (jax.{'jacfwd' if p.kind == 'forward' else 'jacrev'})"
        fix = ("jax.jvp(f, (x,), (v,))[1] gives J @ v without it, in one forward pass"
               if p.side == "right" else
               "jax.vjp(f, x)[1](u)[0] gives u @ J without it, in one backward pass")
    at = f" at {p.line}" if p.line else ""
    by = f" at {p.product_line}" if p.product_line and p.product_line != p.line else ""
    batch = "; jax.vmap it over the points, one vector each" if p.batched else ""
    built = ""
    if made_for:
        t = max(made_for, key=lambda t: t.nbytes)
        where = f", {t.line}" if t.line else ""
        built = (f", and to build it {len(made_for)} value{'s' if len(made_for) > 1 else ''}"
                 f", {format_bytes(sum(u.nbytes for u in made_for))}"
                 f"{' in all' if len(made_for) > 1 else ''} (the largest {t.op} "
                 f"{t.dtype}{list(t.shape)}{where})")
    return (f"The step makes the whole {what}{at}, {p.dtype}{list(p.shape)} "
            f"({format_bytes(p.nbytes)}){built}, only to multiply it by a vector{by}, a "
            f"product of {format_bytes(p.product_bytes)}: {fix}{batch}.")


def jacobian_solve_note(mode: str, what: str, nbytes: int, line: str, solve_line: str,
                        made_for: Sequence[compiled.Temporary] = ()) -> str:
    """A whole Jacobian made only to solve one linear system with it (a Newton step's
    J^-1 r): a Krylov solver needs J only through Jacobian-vector products, one forward pass
    each, and never makes it (patrick-kidger/optimistix#93: Newton's default dense solve made
    the Jacobian of a [1000, 1, 1000, 3, 2] field, 77 TB; the fix, lineax.CG). ``made_for``:
    the values the lines traced inside jacfwd or jacrev make to build it."""
    at = f" at {line}" if line else ""
    by = f" at {solve_line}" if solve_line and solve_line != line else ""
    built = ""
    if made_for:
        t = max(made_for, key=lambda t: t.nbytes)
        built = (f", and to build it {format_bytes(sum(u.nbytes for u in made_for))} more "
                 f"(the largest {t.op} {t.dtype}{list(t.shape)}{', ' + t.line if t.line else ''})")
    return (f"The step makes the whole Jacobian (jax.{'jacfwd' if mode == 'forward' else 'jacrev'}"
            f"){at}, {what} ({format_bytes(nbytes)}){built}, only to solve one linear system "
            f"with it{by}: no smaller batch or jax.checkpoint shrinks it, and a matrix-free "
            "solve needs none of it. jax.scipy.sparse.linalg.gmres (cg where the Jacobian is "
            "symmetric positive definite) with the product v -> jax.jvp(f, (y,), (v,))[1] "
            "solves it from one forward pass per iteration (in optimistix: "
            "Newton(linear_solver=lineax.GMRES(...)) or lineax.CG; "
            "patrick-kidger/optimistix#93). It trades memory for iterations: where the "
            "Jacobian is small, the dense solve is faster.")


def jacobian_diagonal_note(mode: str, shape: tuple[int, ...], dtype: str, nbytes: int,
                           line: str, diagonal_line: str, hessian: bool = True,
                           made_for: Sequence[compiled.Temporary] = (), temp: int = 0) -> str:
    """A whole Jacobian or Hessian made only for its main diagonal (a Laplacian, a PINN's
    second derivatives): jacfwd pushes all n tangents through the function at once, so the
    values it makes grow with n, and n x n are made to keep n. Where each output depends on
    its own input only, vmap of grad of grad gives the diagonal at one point's cost
    (jax-ml/jax#3801, with #564; a trial: 610.77 MiB of temporaries to 1.45 MiB, 4.7 s to
    2.2 ms a step, the same loss); otherwise one Hessian-vector product at a time in a
    fori_loop keeps one tangent (netket/netket#1655: a trial, 49.59 MiB to 2.50 MiB at n = 96,
    flat in n). ``hessian``: a Hessian (else a Jacobian of a vector function, whose columns
    come from jax.jvp(f) itself, not of jax.grad(f), which takes a scalar function only: a
    review). ``made_for``: the values the lines traced inside it make to build it, their
    sum no more than ``temp``, the step's temporaries (XLA reuses buffers), where given."""
    n = shape[-1]
    what = "Hessian" if hessian else "Jacobian"
    at = f" at {line}" if line else ""
    by = f" at {diagonal_line}" if diagonal_line and diagonal_line != line else ""
    batch = f" (a batch of {math.prod(shape[:-2]):,})" if len(shape) > 2 else ""
    built = ""
    if made_for:
        t = max(made_for, key=lambda t: t.nbytes)
        total = sum(u.nbytes for u in made_for)
        built = (f", and {format_bytes(min(total, temp) if temp else total)} more to build it "
                 f"(the largest {t.op} {t.dtype}{list(t.shape)}{', ' + t.line if t.line else ''})")
    grad = "jax.grad(jax.grad(u_point))" if hessian else "jax.grad(f_point)"
    one = ("jax.lax.fori_loop over i adding jax.jvp(jax.grad(f), (x,), (e_i,))[1][i] (a "
           "Laplacian of a function that mixes its inputs)" if hessian else
           "jax.lax.fori_loop over i adding jax.jvp(f, (x,), (e_i,))[1][i]")
    return (f"The step makes the whole {what}{at}, {dtype}{list(shape)}{batch} "
            f"({format_bytes(nbytes)}){built}, only to keep its diagonal{by}: n x n values for "
            f"n = {n:,} of them, and jax.{'jacfwd' if mode == 'forward' else 'jacrev'} carries "
            f"all {n:,} basis vectors through the function at once, so the step grows with n. "
            f"Compute the diagonal alone. Where each output depends only on its own input (a "
            f"network applied to each point, as a PINN's u(t_i)), jax.vmap({grad}) over the "
            f"points gives it at one point's cost (jax-ml/jax#3801). Otherwise {one} keeps one "
            "tangent at a time, flat in n (netket/netket#1655).")


def stopped_scan_note(length: int, flag: str, line: str, flag_line: str) -> str:
    """A ``lax.scan`` of a fixed number of steps whose carry keeps a flag that only turns on
    and gates what the body computes (a decode loop's ``stopped``): after every element has
    it, each remaining step computes values ``jnp.where`` throws away. A
    ``lax.while_loop`` whose condition reads the flags stops there (NovaSky-AI/SkyRL#1058:
    per-sample latency 10 s to 1-4 s). Measured by the kit on the 2-core VM, 8 rows that stop
    by step 12 of 256: 8.2 ms for the scan, 0.49 ms for the while_loop, the same tokens
    (medians of 15, jax 0.10.2; 7.0 and 0.45 ms on 0.8.0)."""
    at = f" ({line})" if line else ""
    sets = f", set at {flag_line}" if flag_line and flag_line != line else ""
    return (f"The lax.scan{at} runs all {length:,} of its steps, though its carry keeps a flag, "
            f"{flag}{sets}, that only ever turns on (flag | ...) and decides what a step keeps: "
            "once every element has it, the remaining steps compute values that are thrown "
            "away. A jax.lax.while_loop whose condition is (i < n) & ~jnp.all(flag) stops at "
            "the step that sets the last one; write each step's output into a buffer it "
            "carries (buf.at[:, i].set(out)) instead of returning it from the scan. (A "
            "while_loop has no reverse-mode gradient: a loop for inference, such as decoding.)")


def basis_note(r: compiled.Jacobian, t: compiled.Temporary, count: int = 1,
                total: int = 0, nested: bool = False) -> str:
    """The largest values made under a vmap that is a Jacobian's own: jax.jacfwd (jax.hessian
    is jacfwd(jacrev(f))) pushes its whole basis of tangents forward at once, jax.jacrev pulls
    its whole basis back, so each value of the function is made once per basis vector
    (jax-ml/jax#787: 551 GB asked for a 221 MB Hessian). Measured by the kit on the CPU, a
    pairwise-distance energy of 96 atoms: jax.hessian 51.79 MiB of temporaries on jax 0.10.2,
    51.47 MiB on 0.8.0; the HVP over the basis in chunks of 8, 1.85 MiB on both. ``nested``:
    a value under two vmaps of forward derivatives, jax.jacfwd of jax.jacfwd, which pushes the
    inner one's n tangents along each of the outer one's n; forward-over-reverse carries n
    (jkitchin/discopt#924: a Lagrangian's Hessian asked for 413 GB; a trial at n = 200,
    m = 190: 29.30 MiB of temporaries to 156 KiB with jax.jacfwd(jax.grad(L)), the same
    Hessian)."""
    at = f", {t.line}" if t.line else ""
    what = (f"The largest value, {t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}{at}), "
            "is" if count == 1 else
            f"{count} values from one line, {format_bytes(total)} together (the largest, {t.op} "
            f"{t.dtype}{list(t.shape)}, {format_bytes(t.nbytes)}{at}), are")
    if nested:
        n = r.batch
        return (f"{what} made for all {n * n:,} = {n:,} x {n:,} pairs of basis vectors at once: "
                f"jax.jacfwd of jax.jacfwd pushes the inner one's {n:,} tangents forward along "
                f"each of the outer one's {n:,}, so each value of f is made {n * n:,} times. For "
                "the Hessian of a scalar function, forward-over-reverse carries "
                f"{n:,}: jax.hessian(f) (jacfwd of jacrev) or jax.jacfwd(jax.grad(f)), the same "
                "Hessian (jkitchin/discopt#924, a Lagrangian's Hessian that asked for 413 GB).")
    if r.mode == "forward":
        who, how, plain = ("jax.jacfwd (jax.hessian is jacfwd(jacrev(f)))", "pushes forward",
                           "for jax.jacfwd of f, jax.jvp(f, (x,), (v,))[1] the same way makes "
                           "its columns")
    else:
        who, how, plain = ("jax.jacrev", "pulls back", "for jax.jacrev of f, jax.vjp(f, x)[1](u)"
                           "[0] over the rows u of jnp.eye(m) makes its rows")
    return (f"{what} made for all {r.batch:,} basis vectors at once, under the vmap of "
            f"{who}, which {how} the whole identity of {r.batch:,} x {r.batch:,}. Make it a "
            "few rows at a time instead, for a Hessian jax.lax.map(lambda v: jax.jvp(jax.grad(f), "
            "(x,), (v,))[1], jnp.eye(n).reshape(n, *x.shape), batch_size=k) with "
            f"n = {r.batch:,} ({plain}); such values shrink to k of the {r.batch:,}.")


def batched_by_line(c: compiled.CompiledStep, peak: int, most: int = 16
                     ) -> list[tuple[compiled.Temporary, int, int, str, str, bool, str]]:
    """(the largest, how many, their bytes, what vmap batched in a scatter on that line: "index",
    "update value" or "", the line that sums the batch away afterwards or "", whether the jaxpr
    keeps a lax.cond on that line: its predicate unbatched, no select, the line of the
    lax.cond whose branch made it, where vmap made that cond a select, or "") of the values made
    under jax.vmap, per line of the user's code, where they come to a quarter of the peak or
    more, largest first (one line can make several: each of a layer's weights, drawn for every
    layer at once; equinox#673). The sum is one over the leading axis, outside the vmap, of a
    value of the batch's length and a quarter of the largest's bytes or more (per-example
    gradients averaged, google/flax#1852). Left out, where the jaxpr says so: values of a
    line only JAX's own vmaps batched (jax.nn.dot_product_attention's over its query groups,
    google/flax#2858: the user wrote none), of vmaps of one element, without a dimension of
    the batch (a gradient summed over it: jax-ml/jax#891's f32[50, 50, 21, 21] for a batch of
    6), or of a vmap that only cuts, reshapes or casts (the stacked rows of a collection
    unravelled: pyro-ppl/numpyro#539, where lax.map(unravel, coll, batch_size=100) left XLA's
    peak at 33,333,452 B against 33,333,440 B; jax 0.8.0 and 0.10.2): no chunks shrink them."""
    temporaries = c.temporaries(most)
    vmapped = (jaxpr_products.vmapped_lines(c.jaxpr) if c.jaxpr is not None
               and any(t.batched for t in temporaries) else None)
    lines: dict[str, list[compiled.Temporary]] = {}
    # a callback vmap made a loop of: its operand, transposed for the loop, is no value to make
    # in chunks (lax.map still calls it per element): callback_loop_note names it
    looped = {at for _, at, _ in c.callbacks_vmapped()} if c.jaxpr is not None else set()
    # a value larger than all the temporaries is an output (the render lists it so): a vmapped
    # update written into a donated cache is no value chunks shrink (a trial: lax.map of the
    # vmapped dynamic_update_slice took the peak from 8 to 18 MiB)
    temp = c.sizes().get("temp")
    for t in temporaries:
        if isinstance(temp, int) and t.nbytes > temp:
            continue
        if t.batched and t.line not in looped and (
                vmapped is None or not t.line or _chunks_shrink(t, vmapped)):
            lines.setdefault(t.line or f"({t.op})", []).append(t)
    if not lines:
        return []
    scatters = jaxpr_products.scatters_batched(c.jaxpr) if c.jaxpr is not None else {}
    sums = jaxpr_products.batch_reductions(c.jaxpr) if c.jaxpr is not None else ()
    conds = {jaxpr_walk.equation_line(e) for j, _ in jaxpr_walk.walk(c.jaxpr) for e in j.eqns
             if e.primitive.name == "cond"} if c.jaxpr is not None else set()
    branches = jaxpr_products.selected_branches(c.jaxpr) if c.jaxpr is not None else {}
    out = []
    for ts in lines.values():
        big = max(ts, key=lambda t: t.nbytes)
        which = "" if not any(t.op == "scatter" for t in ts) else scatters.get(
            big.line, "index or update value")
        summed = next((line or "the step" for shape, nbytes, line in sums
                       if shape[:1] == big.shape[:1] and 4 * nbytes >= big.nbytes), "")
        out.append((big, len(ts), sum(t.nbytes for t in ts), which, summed, big.line in conds,
                    branches.get(big.line, "") if big.line not in conds else ""))
    return sorted([b for b in out if b[2] * 4 >= peak], key=lambda b: -b[2])


def _chunks_shrink(t: compiled.Temporary,
                   vmapped: dict[str, tuple[tuple[frozenset[int], ...], bool]]) -> bool:
    """A batched value that computing the batch in chunks makes smaller: its line has values a
    vmap of the user's made (:func:`jaxpr_products.vmapped_lines`), not only cut, reshaped or
    cast, of more than one element, and it has a dimension of the batch (or one a multiple of
    it)."""
    found = vmapped.get(t.line)
    if found is None:
        return False  # only JAX's own vmaps made this line's values
    sizes, relayouts = found
    if relayouts or (sizes and all(s == {1} for s in sizes)):
        return False
    return not (sizes and all(sizes) and not any(
        d % b == 0 for s in sizes for b in s if b > 1 for d in t.shape))


def batched_note(t: compiled.Temporary, count: int = 1, total: int = 0,
                 scattered: str = "", summed: str = "", kept_cond: bool = False,
                 branch_of: str = "") -> str:
    """The largest value made under jax.vmap for the whole batch at once, and how to make it
    in chunks: under a derivative, chunks alone keep every chunk's values for the backward
    pass (jax#8409: 16 MiB of temporaries with vmap, 40 MiB with lax.map(f, batch_size=8),
    2 MiB with lax.map(jax.checkpoint(f), batch_size=8); measured by the kit on jax 0.10.2).
    A lax.cond whose predicate vmap batches is a select: both branches run, and its operands,
    arrays the branches close over included, are broadcast to the batch (jax-ml/jax#3103,
    #7159: 1,082,130,432 B of temporaries under vmap, 16,973,976 B with lax.map(f, xs,
    batch_size=64), 265,560 B with lax.map(f, xs); jax 0.10.2, CPU). An ``.at[i]`` update
    whose index or update value vmap batches (``scattered``: which one, from the scatter's
    batching dimensions) copies the whole operand for every element (scatter's batching rule;
    jax-ml/jax#23358: 16 MiB under vmap, 0 B computed without the updated array, jax 0.10.2).
    ``kept_cond``: the jaxpr keeps a cond on that line (its predicate unbatched): no select.
    ``branch_of``: the line of a cond so made a select, where the value is made in one of its
    branches (jax-ml/jax#7199, a rare, costly branch: 16.1 MiB of temporaries under vmap, 1.0
    MiB with lax.map(f, xs, batch_size=16) and slower, 0.06 MiB with lax.map(f, xs) or
    jax.custom_batching.sequential_vmap(f); jax 0.10.2, CPU).
    Where the batch is summed away afterwards (``summed``: per-example gradients averaged,
    google/flax#1852), lax.map(f, xs, batch_size=k) still stacks f's outputs whole
    (274,204,672 B of temporaries under vmap, 290,521,912 B with lax.map(batch_size=16)); a
    scan that adds each chunk's sum into its carry keeps one chunk (34,275,512 B; jax 0.10.2,
    CPU)."""
    at = f", {t.line}" if t.line else ""
    head = (f"The largest value, {t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}"
            f"{at}), is made under jax.vmap for every element of the batch at once, as the "
            "vectorized code would be")
    if count > 1:
        head = (f"{count} values from one line, {format_bytes(total)} in all (XLA may reuse "
                f"one's buffer for another), are made "
                f"under jax.vmap for every element of the batch at once, as the vectorized code "
                f"would be (the largest, {t.op} {t.dtype}{list(t.shape)}, "
                f"{format_bytes(t.nbytes)}{at})")
    # a line that calls cond, whatever the op (a branch's constant broadcast to the batch,
    # jax-ml/jax#3103), unless the jaxpr keeps a cond there: its predicate was not batched
    cond = re.search(r"\bcond\(", t.line) is not None and not kept_cond or bool(branch_of)
    if branch_of:
        head += (f". It is made in a branch of the lax.cond at {branch_of}, whose predicate "
                 "jax.vmap batches: vmap makes that cond a select (XLA has no batched "
                 "conditional), so every branch runs for every element, however rarely it is "
                 "taken")
    elif cond:
        head += (". A lax.cond whose predicate jax.vmap batches becomes a select (XLA has no "
                 "batched conditional), so both branches run for every element")
        if t.op == "broadcast_in_dim":
            head += (", and its operands, arrays the branches close over included, are "
                     "broadcast to the whole batch")
    at_update = bool(scattered) and ".at[" in t.line
    if at_update:
        head += (f". An .at[...] update whose {scattered} jax.vmap batches copies the whole "
                 "array it updates for every element (scatter's batching rule), though each "
                 "changes one place")
    # (under a derivative around the vmap the scan's own residuals are not measured: lax.map)
    if summed and not cond and not at_update and not t.in_derivative:
        where = "" if summed == "the step" else f" ({summed})"
        head += (f", and the step then sums the vmap's outputs over the batch{where} "
                 "(per-example gradients averaged): jax.lax.map(f, xs, batch_size=k) would "
                 "still stack f's outputs for the whole batch")
        fix = ("sum them chunk by chunk instead, jax.lax.scan over xs.reshape(n // k, k, ...) "
               "with jax.vmap(f) inside and the chunk's .sum(0) added to the carry, which keeps "
               "k elements' values at a time (google/flax#1852: 274 MB of temporaries, 290 MB "
               "with lax.map(batch_size=16), 34 MB with the scan)")
        return f"{head}; {fix}."
    if t.in_derivative:
        fix = ("under the derivative, jax.lax.map(f, xs, batch_size=k) alone keeps every "
               "chunk's values for the backward pass; jax.lax.map(jax.checkpoint(f), xs, "
               "batch_size=k) recomputes each chunk instead, and such values shrink in "
               "proportion")
    else:
        fix = ("jax.lax.map(f, xs, batch_size=k) computes k elements at a time, and such "
               "values shrink in proportion")
    if branch_of:
        fix = ("jax.lax.map(f, xs) without batch_size keeps the predicate unbatched, so only "
               "the branch taken runs, one element at a time (jax.custom_batching."
               "sequential_vmap(f) does the same where the vmap is not yours to change); "
               "jax.lax.map(f, xs, batch_size=k) still runs every branch for k elements at a "
               "time" + (" (jax.lax.map(jax.checkpoint(f), xs) under the derivative)"
                         if t.in_derivative else "")
               + " (jax-ml/jax#7199: 0.06 MiB of temporaries, 1.0 MiB with batch_size=16, "
               "16 MiB under vmap)")
    elif cond:
        fix += ("; without batch_size, jax.lax.map keeps the predicate unbatched, so only the "
                "branch taken runs" + (" (jax.lax.map(jax.checkpoint(f), xs) under the "
                                       "derivative)" if t.in_derivative else "")
                + " (jax-ml/jax#3103: 0.27 MB of temporaries, 17 MB with batch_size=64, "
                "1.08 GB under vmap)")
    if at_update:
        fix = ("compute what you need without making the updated array (for .at[i].set(v)"
               ".sum(): x.sum() - x[i] + v, jax-ml/jax#23358), or " + fix)
    return f"{head}: {fix}."


def stacked_indices(temporaries: Sequence[compiled.Temporary], peak: int) -> str:
    """The largest value is integer indices stacked into one array on a line that indexes (x[a,
    b, c] with index arrays, or x[tuple(columns)]): JAX stacks the index arrays into one int32
    array for its gather, and a gradient's scatter keeps it (jax-ml/jax#30015: 12 MiB of the
    gradient's 16 MiB of temporaries, 4 MiB with lax.gather given the (N, 3) array; measured on
    the CPU, jax 0.10.2). A note where it is 1 MiB and a quarter of the peak or more; ""
    otherwise."""
    if not temporaries:
        return ""
    t = temporaries[0]
    if not (t.op == "concatenate" and t.dtype[:1] in "su" and "[" in t.line
            and len(t.shape) == 2 and t.nbytes >= 2**20 and 4 * t.nbytes >= peak):
        return ""
    k = t.shape[1]
    dims = ", ".join(str(i) for i in range(k))
    return (f"The largest value, concatenate {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}, "
            f"{t.line}), is indices: indexing with {k} index arrays makes JAX stack them into "
            "one integer array for its gather, a copy of them (int32, however narrow yours), "
            "which a gradient's scatter keeps as well. Where they already sit in one "
            f"(N, {k}) array, hand it to jax.lax.gather as it is (GatherDimensionNumbers("
            f"offset_dims=(), collapsed_slice_dims=({dims}), start_index_map=({dims})), "
            f"slice_sizes=(1,) * {k}), or index the flattened array with one flat index "
            "(jax-ml/jax#30015).")


def sparse_note(products: Sequence[tuple[str, str, int, int, int, int, int, int, int]],
                temporaries: Sequence[compiled.Temporary], peak: int,
                sort: tuple[int, int, int, bool] | None = None) -> str:
    """The first BCOO product of 2**18 values or more whose line made a quarter of the peak
    (``products``: :func:`jaxpr_products.sparse_products`), where it makes far more values than the
    dense product has:
    BCOO @ dense gathers a row of the dense operand per stored element (jax-ml/jax#14642: 24 MiB
    for 200,000 stored elements by 32 columns; blocks of 4 columns took the peak 33.87 -> 15.11
    MiB), unless the matrix stores about as many bytes as its dense form (MIT-Lu-Lab/MPAX#24:
    ``BCOO.fromdense(A, nse=A.size)``, every element stored; blocks change nothing for a matvec,
    its real nse does: measured by the kit on the CPU, jax 0.10.2, 1024 x 2048 at 1% fill,
    80.02 -> 0.82 MiB); BCOO @ BCOO pairs every stored element of one with every one of the
    other (jax-ml/jax#14821: 820 x 820 pairs at 20% fill, where dense needed 54.86 KiB), and on
    the CPU its sum_duplicates sorts the pairs stably, with scratch outside XLA's plan (``sort``:
    the stable sort counted in ``peak``, :meth:`compiled.CompiledStep.stable_sorts`; 25.84 +
    30.78 = 56.62 MiB predicted, 54.64 and 56.57 measured in two runs). A sort of as many
    elements as the product's pairs is taken for that one, and its scratch counts as the
    product's: jax 0.11's XLA plans the pairs' indices in one buffer where 0.10.2 had two (a
    1,229 x 1,229 product's line: 23.05 MiB of temporaries, 34.57 on 0.10.2, beside 69.14 of
    the sort's scratch in a 127.18 MiB peak). "" otherwise."""
    for kind, line, nse, other, dense, whole, values, stored, dense_bytes in products:
        scratch = sort[0] if kind == "sparse" and sort and sort[2] == nse * other else 0
        held = scratch + sum(t.nbytes for t in temporaries if line and t.line == line)
        # 2**18 values: 1 MiB of float32 made for the product itself
        if nse * other < 2**18 or 4 * held < peak or nse * other < 4 * dense:
            continue
        # stored with their indices in no fewer bytes than dense: a third of float32 values
        # with two int32 indices each (the wrapper's own MPAX#24 case: all of them)
        if kind == "dense" and stored >= dense_bytes > 0:
            everything = ("every element of its dense shape, zeros included: a dense matrix "
                          "in a sparse wrapper" if values >= whole else
                          f"{values / whole:.0%} of the {whole:,} elements of its dense shape")
            return (f"The BCOO matrix of the product at {line} stores {values:,} values, "
                    f"{everything}; with their indices they take {format_bytes(stored)}, where "
                    f"the dense matrix takes {format_bytes(dense_bytes)}, and the product "
                    "gathers a row of the other operand for each of them. Build "
                    "it with its real number of stored elements (BCOO.fromdense(A) outside "
                    "jit, or BCOO.from_scipy_sparse), or keep it dense"
                    + (": a vector is one block of one column, so blocks of columns change "
                       "nothing" if other == 1 else "") +
                    " (MIT-Lu-Lab/MPAX#24: nse=A.size kept every element; a 1024 x 2048 "
                    "matrix at 1% fill, 80.02 -> 0.82 MiB with its real nse).")
        if kind == "dense":
            return (f"The BCOO @ dense product at {line} gathers a row of the dense operand "
                    f"for each of the matrix's {nse:,} stored elements: {nse * other:,} values, "
                    f"where the product has {dense:,}. Multiply in blocks of k columns "
                    "(jax.lax.map(lambda b: m @ b, blocks)), which holds the stored elements "
                    "times k; on a GPU, jax.config.update('jax_bcoo_cusparse_lowering', True) "
                    "hands it to cuSPARSE (jakevdp, jax-ml/jax#14642; from the thread, not yet "
                    "run on a GPU).")
        pairs = (f" The peak above counts {format_bytes(scratch)} that the CPU runtime "
                 "takes outside XLA's plan to sort the pairs stably (sum_duplicates' lexsort: "
                 f"{jaxcompat.sort_buffer_words(bool(sort and sort[3]))})." if scratch else "")
        return (f"The BCOO @ BCOO product at {line} pairs each of the left's {nse:,} stored "
                f"elements with each of the right's {other:,}: {nse * other:,} pairs, where the "
                f"dense product has {dense:,} elements. At this fill, dense is far cheaper: "
                "a.todense() @ b.todense() (jakevdp, jax-ml/jax#14821: a sparse product pays at "
                f"about 1% fill or less).{pairs}")
    return ""


def sort_scratch_note(nbytes: int, arrays: int, elements: int, paired: bool = False) -> str:
    """The scratch the CPU runtime's stable sort of several arrays takes outside XLA's plan
    (:meth:`compiled.CompiledStep.stable_sorts`), counted in the peak, and the fix where the
    order of equal keys does not matter. Measured by the kit on the CPU: a sort of 2 int32
    arrays of 1,510,441 elements, 23.05 MiB planned, held 69.16 MiB stable and 23.07 unstable
    on jax 0.8.0, 69.18 and 23.08 on 0.10.2, 34.76 and 23.07 on 0.11.2 (pairs)."""
    measured = "34.76 -> 23.07" if jaxcompat.paired_sorts() else "69.18 -> 23.08"
    return (f"Counted beyond XLA's plan: {format_bytes(nbytes)} of scratch for the CPU runtime's "
            f"stable sort of {arrays} arrays of {elements:,} elements (jnp.argsort, jnp.lexsort, "
            f"a sort with several operands): XLA:CPU moves them through "
            f"{jaxcompat.sort_buffer_words(paired)}. A GPU's sort is not counted (not yet run "
            "on a GPU). Where the order of equal keys does not matter, "
            "jnp.argsort(x, stable=False) or lax.sort(..., is_stable=False) sorts in place "
            f"without it (2 arrays of 1,510,441 int32: {measured} MiB measured).")


def fusion_intermediates_note(nbytes: int, planned: int, needed: int,
                              free: int | NotAvailable, dot: bool = True) -> str:
    """The values an XLA:CPU YNNPACK fusion makes inside itself that XLA's plan does not count
    (:attr:`compiled.CompiledStep.fusion_intermediates`), what the step would need with them,
    and the fix. Not counted in the peak: YNNPACK tiles some fusions and holds others whole.
    Measured by the kit on the 2-core VM, jax 0.10.2, over a 128 MiB value (65,536 rows of 128
    times a 128x512 matrix): a dot, tanh and a row sum held 12 MiB beyond the arguments; the
    same with a bias added to the dot before cosh and log (netket/netket#783's RBM) 130 MiB;
    the RBM's local energy 321 MiB, where XLA, without the fusion, plans 256 MiB."""
    more = needed + nbytes
    against = (f" (the step would then need {format_bytes(more)} of the "
               f"{format_bytes(free)} free)" if isinstance(free, int) else "")
    what = ("a dot with what follows it" if dot else
            "elementwise work and the reduction after it")
    return (f"Not in the peak: XLA:CPU fuses {what} into a YNNPACK fusion, "
            f"whose values XLA's plan does not count (its temporaries here: "
            f"{format_bytes(planned)}); XLA plans {format_bytes(nbytes)} for them without the "
            f"fusion. YNNPACK tiles some such fusions and holds others whole, so on the CPU the "
            f"step may need about that much more{against}. Measured on jax 0.10.2 over a 128 "
            "MiB value: 12 MiB held for a dot, tanh and sum; 130 MiB with a bias added before "
            "cosh and log; 321 MiB for netket#783's local energy, where XLA plans 256. "
            "compile(compiler_options={'xla_cpu_experimental_ynn_fusion_type': ''}) shows XLA's "
            "plan of them. They grow with the rows the fusion runs on: run it on fewer at a time "
            "(jax.lax.map(f, xs, batch_size=k), a chunk size) and they shrink with it.")


def pairwise_temporary(pairs: Sequence[tuple], temporaries: Sequence[compiled.Temporary],
                       peak: int, derivative: bool = False
                       ) -> tuple[tuple, compiled.Temporary] | None:
    """The first value over every pair of two inputs' rows, broadcast against each other and
    then reduced (``pairs``: :func:`jaxpr_products.pairwise_reductions`), that XLA keeps whole: a
    temporary outside any derivative with the pair's two dimensions, of 1 MiB or more and a
    quarter of the peak (jax-ml/jax#7856's kernel matrix-vector product: kept by jax 0.8.0,
    fused away by 0.10.2). ``derivative``: the step takes one (jax.grad of a pair energy,
    jax-md/jax-md#137), and a value made inside it counts too. (the pair, the temporary) or
    None."""
    for found in pairs:
        shape, (a, b) = found[0], found[2]
        for t in temporaries:
            if ((derivative or not t.in_derivative) and len(t.shape) > max(a, b)
                    and t.nbytes >= 2**20 and 4 * t.nbytes >= peak
                    and (t.shape[a], t.shape[b]) == (shape[a], shape[b])):
                return found, t
    return None


def pairwise_map_note(found: tuple, t: compiled.Temporary, reduced_input: str,
                      derivative: bool = False) -> str:
    """The note for a pairwise value XLA keeps whole (:func:`pairwise_temporary`): compute the
    rows a chunk at a time with ``jax.lax.map`` (froystig, jax-ml/jax#7856: XLA does not make
    such a value lazy in general); under a derivative, with jax.checkpoint on the row, and a
    neighbor list where a cutoff allows (jax-md/jax-md#137). Measured by the
    kit on the thread's Gaussian kernel times a vector, n = 4096, jax 0.8.0 on the CPU: 66.03
    MiB measured for the whole kernel, 4.20 MiB with lax.map(row, x_j, batch_size=256)."""
    shape, _, pair, which, made, reduced = found[:6]
    kept, size = shape[pair[1 - which]], shape[pair[which]]
    k = chunk_size(kept)
    ys = reduced_input or "the reduced input"
    return (f"XLA keeps {t.op} {t.dtype}{list(t.shape)} ({format_bytes(t.nbytes)}) whole: a "
            "value over every pair of two inputs' rows, made by broadcasting them against each "
            f"other ({made}) and then reduced over {size:,} ({reduced}). Compute it a chunk of "
            f"{k} of its {kept:,} rows at a time, each reduced over all of {ys}: "
            f"jax.lax.map(row, xs, batch_size={k}), where xs is the other input and row(x) "
            f"reduces f(x, {ys}), holds one chunk (froystig, jax-ml/jax#7856: 66.03 -> 4.20 MiB "
            "measured on the thread's kernel, n = 4096)."
            + (" Under jax.grad, checkpoint the row, jax.lax.map(jax.checkpoint(row), xs, "
               f"batch_size={k}), or the backward pass keeps every chunk's values. Where only "
               "near pairs count (a cutoff), compute those alone: a neighbor list "
               "(jax_md.partition) holds rows x neighbors, not every pair (jax-md/jax-md#137)."
               if derivative else ""))


#: the operations that factor or decompose a whole matrix at once (LAPACK / cuSOLVER calls)
FACTORIZATIONS = ("cholesky", "lu", "qr", "householder_product", "eigh", "eig", "svd", "schur")


def factorization(temporaries: Sequence[compiled.Temporary], peak: int,
                  closed: object) -> compiled.Temporary | None:
    """The largest value a factorization of one whole matrix makes (a cholesky, lu, qr, eigh,
    eig, svd or schur of two dimensions: no batch of matrices), where it is a quarter of the
    peak or more and the step takes no derivative: a one-shot solve that no smaller batch,
    donation or jax.checkpoint shrinks (google/neural-tangents#166). ``closed``: the step's
    jaxpr (None where it could not be traced apart). None otherwise."""
    if closed is not None and jaxpr_walk.has_derivative(closed):
        return None
    return next((t for t in temporaries if t.op in FACTORIZATIONS and len(t.shape) == 2
                 and 4 * t.nbytes >= peak), None)


def output_too_large_note(outputs: Sequence[tuple[str, Any, str]], output_bytes: int,
                          free: int, made_at: str = "") -> str:
    """A step whose outputs alone are more than the room where it runs: freeing other arrays,
    donation or jax.checkpoint cannot make room for what it returns (jax-ml/jax#2851: an outer
    product of a GPU pipeline's result, too large for the card and not for the host; gnecula:
    compute it on the CPU device). ``made_at``: the line that made the largest output where no
    dimension of its comes from an argument (:func:`sized_in_code`): the size is a number in
    the code, and making it smaller is the fix (google-deepmind/mujoco#1431: brax's replay
    buffer sized by num_timesteps when max_replay_size is not given, 49.5 GiB)."""
    largest = max(outputs, key=lambda o: compiled.array_bytes(o[1]), default=None)
    if made_at and largest is not None:
        path, aval, _ = largest
        return (f"Its outputs alone, {format_bytes(output_bytes)}, are more than the "
                f"{format_bytes(free)} free there, and the largest, {path or 'its output'} "
                f"({aval.dtype}{list(aval.shape)}), takes none of its dimensions from the "
                f"step's arguments: its size is a number in the code ({made_at}), a setting "
                "such as a buffer's or a cache's capacity, not a batch. Make that number "
                "smaller, where the step needs it whole; no smaller batch, donation or "
                "jax.checkpoint shrinks it (google-deepmind/mujoco#1431: a replay buffer sized "
                "by the run's total steps).")
    what = ""
    if largest is not None and len(outputs) == 1:
        what = f" ({largest[1].dtype}{list(largest[1].shape)})"
    elif largest is not None:
        path, aval, _ = largest
        what = (f" (the largest, {path}: {aval.dtype}{list(aval.shape)}, "
                f"{format_bytes(compiled.array_bytes(aval))})")
    return (f"Its outputs alone, {format_bytes(output_bytes)}{what}, are more than the "
            f"{format_bytes(free)} free there, so freeing other arrays cannot make room for "
            "them, nor can donation or jax.checkpoint. Where no batch dimension of the inputs "
            "shrinks them, compute the step where there is room: on the host, with its "
            "arguments put on jax.devices('cpu')[0] (jax.device_put; a step runs where its "
            "arguments are: jax-ml/jax#2851), or never make the whole result: reduce it in "
            "blocks of rows inside the step (jax.lax.map over the blocks).")


def sized_in_code(outputs: Sequence[tuple[str, Any, str]],
                  temporaries: Sequence[compiled.Temporary], args: Any) -> str:
    """The line that made the largest output, where none of its dimensions (of more than one)
    is one of the arguments' dimensions: its size comes from the code, not from what the step
    is given; "" otherwise, or where no line was recorded."""
    largest = max(outputs, key=lambda o: compiled.array_bytes(o[1]), default=None)
    if largest is None:
        return ""
    shape = tuple(int(d) for d in largest[1].shape)
    leaves = devices.start_jax().tree_util.tree_leaves(args)
    given = {int(d) for leaf in leaves for d in getattr(leaf, "shape", ()) or ()}
    given |= {int(v) for v in leaves if isinstance(v, int) and not isinstance(v, bool)}
    # a dimension is the arguments' where it is one of theirs (a static int's value too) or a
    # small multiple of one of 8 or more (jnp.zeros((64 * n, 2 * d)) from x.shape: a review;
    # not 30,000,000 beside a 64-wide layer, a second review)
    if not any(d > 1 for d in shape) or any(
            d in given or any(g >= 8 and d % g == 0 and d // g <= 64 for g in given)
            for d in shape if d > 1):
        return ""
    return next((t.line for t in temporaries if t.shape == shape and t.line), "")


def replicated_output_note(path: str, aval: Any, count: int, argument: str = "") -> str:
    """An output every one of ``count`` devices holds whole, a new value of ``argument``, which
    came in split over them (:meth:`compiled.CompiledStep.replicated_outputs`): each device's
    peak counts all of it.
    Read to the host, a split array needs no such step: np.asarray or jax.device_get copies its
    shards one at a time (marin-community/levanter#639: jax.jit(identity,
    out_shardings=NamedSharding(mesh, P())) to save a parameter ran a TPU out of memory; the PR
    copies it in chunks). Measured by the kit on 4 simulated CPU devices, a 32 MiB parameter
    split 4 ways: 8 MiB a device, 40 MiB replicated, 8 MiB read with np.asarray, the same
    values (jax 0.10.2)."""
    nbytes = compiled.array_bytes(aval)
    name = f"{path} " if path else ""
    return (f"The output {name}{aval.dtype}{list(aval.shape)} ({format_bytes(nbytes)}) is "
            f"replicated: each of the {count} devices holds all of it (its sharding is P(), "
            f"from out_shardings or XLA's choice), a new value of {argument or 'an argument'}, "
            "which came in split over them, so every device's peak counts it whole. If it is "
            "made only to be read on the host (a save, an export), skip the step: np.asarray(x) "
            "or jax.device_get(x) of the split "
            "array copies its shards to the host one at a time, no device holding more than its "
            "own (marin-community/levanter#639). Otherwise keep it split as the arguments are "
            "(out_shardings=x.sharding).")


def factorization_note(t: compiled.Temporary, needed: int, host_need: int | None = None,
                       host_free: int | None = None) -> str:
    """The note for a step that does not fit because of one factorization of a whole matrix
    (:func:`factorization`): it cannot shrink, so it must run where ``needed`` fits; the host
    is named as that place (romanngg, google/neural-tangents#166: the CPU) only where the kit
    priced the step for it (``host_need``, compiled for the CPU) and it fits in ``host_free``.
    Measured by the kit: the thread's Cholesky solve, 29.81 GiB for 50,000 x 50,000 float32."""
    shape = " x ".join(f"{d:,}" for d in t.shape)
    at = f" ({t.line})" if t.line else ""
    note = (f"The {t.op} of one {shape} matrix{at} makes {t.dtype} values of "
            f"{format_bytes(t.nbytes)} each: a factorization of the whole matrix at once, which "
            "no smaller batch, donation or jax.checkpoint shrinks. It needs "
            f"{format_bytes(needed)} where it runs")
    if host_need is not None and host_free is not None and host_need <= host_free:
        return note + (f"; this machine's host has {format_bytes(host_free)} available and the "
                       f"step needs {format_bytes(host_need)} as planned for its CPU: run it "
                       "there, with its arguments put on jax.devices('cpu')[0] (jax.device_put; "
                       "a step runs where its arguments are), as romanngg advised in "
                       "google/neural-tangents#166.")
    if host_need is not None and host_free is not None:
        return note + (f": a card with that much free (this machine's host has "
                       f"{format_bytes(host_free)} available, less than the "
                       f"{format_bytes(host_need)} it needs there).")
    return note + (": a card with that much free, or the host where it has that much "
                   "(jax.device_put the arguments to jax.devices('cpu')[0]: romanngg, "
                   "google/neural-tangents#166; the kit priced it for this device only).")


def _axis_names(axes: Sequence[str]) -> str:
    """"axis 'x'" or "axes 'x', 'y'"."""
    names = ", ".join(repr(a) for a in axes)
    return f"axis {names}" if len(axes) == 1 else f"axes {names}"


def invariant_psum_note(op: str, line: str, axes: Sequence[str], size: int,
                        summed: bool) -> str:
    """A ``jax.lax.psum`` (``op``: ``"psum"``) or ``psum_scatter`` under shard_map's check_vma of a
    value already the same on every device of ``axes`` (:func:`jaxpr_sharding.psums_of_invariant`):
    it multiplies the value by their ``size``. Found putting jax-ml/jax#839 to the kit: with the
    default check_vma=True, jax.grad of an input with in_spec P() is summed over the devices
    already, and the pmap habit psum(grad) gave 4.0x the true gradient on 4 CPU devices (jax 0.8.0
    and 0.10.2), psum_scatter(grad) 4.0x too; without the psum, or psum_scatter of the gradient of w
    made varying first, 1.0x."""
    why = ("under check_vma, jax.grad of a P() input is summed already" if summed else
           "under check_vma: an input with in_spec P(), or a value made from such inputs only")
    at = f" at {line}" if line else ""
    first = axes[0] if len(axes) == 1 else tuple(axes)
    fix = ("Drop the psum" if op == "psum" else
           f"To keep 1/{size} of a gradient, take it of jax.lax.pcast(w, {first!r}, "
           f"to='varying') (jax.lax.pvary(w, {first!r}) before jax 0.8.2), so each device's "
           "is its own, then psum_scatter it")
    return (f"The {op}{at} sums a value that is already the same on every device of "
            f"{_axis_names(axes)} ({why}): it multiplies it by the axis size ({size}x here). "
            f"{fix} (jax-ml/jax#839's data-parallel gradient: 4.0x the true gradient on 4 "
            "devices with it, 1.0x so).")


def replicated_sum_note(line: str, axes: Sequence[str], size: int, nbytes: int) -> str:
    """A ``jax.lax.psum`` whose sum shard_map returns with out_specs=P()
    (:func:`jaxpr_sharding.replicated_sums`): each device holds the whole sum. jax-ml/jax#839's
    data-parallel gradient of a f32[4096, 1024] weight on 4 CPU devices: outputs 16.00 MiB
    per device with psum, 4.00 MiB with psum_scatter(..., tiled=True) and out_specs=P('x')."""
    at = f" at {line}" if line else ""
    first = axes[0] if len(axes) == 1 else tuple(axes)
    return (f"The psum{at} leaves the whole sum, {format_bytes(nbytes)}, on each of the {size} "
            f"devices of {_axis_names(axes)} (out_specs=P()). Where each device needs only its "
            "share (a sharded optimizer update), jax.lax.psum_scatter(..., scatter_dimension=0, "
            f"tiled=True) with out_specs=P({first!r}) keeps 1/{size} on each: "
            f"{format_bytes(nbytes)} -> {format_bytes(nbytes // size)} (jax-ml/jax#839; mattjj "
            "in jax-ml/jax#6992).")


def unrolled_values(c: compiled.CompiledStep, unrolled: str, temp: int) -> str:
    """Where a loop unrolled inside jit (``unrolled``: the note) holds one value per iteration
    at once, half of XLA's temporaries (``temp``) or more: a sentence saying so; "" otherwise.
    openxla/xla#35719: 36 iterations of a 1.91 MiB index array, 70.6 MiB of temporaries on the
    CPU (jax 0.8.0 and 0.10.2); a lax.scan over them with one padded shape, 15.3 MiB. Values
    that add up to more than the temporaries are not all alive at once: no sentence."""
    if "is unrolled" not in unrolled:
        return ""
    same = [t for t in c.temporaries(4 * compiled.UNROLLED_AT) if t.line and t.line in unrolled]
    held = sum(t.nbytes for t in same)
    if len(same) < 4 or 2 * held < temp or held > temp:
        # more than the temporaries: XLA reuses their buffers, so they are not all alive at
        # once (fattorib/ZeRO-transformer#13: 218 values of 12.10 MiB in 3.25 MiB)
        return ""
    return (f" This line's values are alive at once, too: XLA's plan holds {len(same)} of them "
            f"({format_bytes(held)} of {format_bytes(temp)} of temporaries), from every "
            "iteration, where a jax.lax.scan over the iterations holds one iteration's (give every "
            "iteration one shape, padded, and mask what is padding; openxla/xla#35719).")


def picked_log_probabilities_note(c: compiled.CompiledStep, temp: int) -> str:
    """A ``jax.nn.log_softmax`` made whole only to take the label's value per row
    (:func:`jaxpr_values.picked_log_probabilities`; keras-team/keras#20005), 1 MiB or more
    and in XLA's plan (``temp`` half its bytes or more), where XLA plans a quarter or less
    of the temporaries for logsumexp minus the label's logit: the two compiled here, for its
    shape and dtype, on the step's device (jax 0.10.2's CPU: 32 MiB and 0.01 MiB for 4 x 256 x
    8192 floats; jax 0.8.0's CPU planned 33 MiB for both, so there no note). "" otherwise."""
    picked = jaxpr_values.picked_log_probabilities(c.jaxpr) if c.jaxpr is not None else ()
    if not picked or picked[0][1] < 2**20 or 2 * temp < picked[0][1]:
        return ""
    kind, nbytes, line, how = picked[0]
    plans = _label_loss_plans(kind, c.device)
    if plans is None or 4 * plans[1] > plans[0]:
        return ""
    at = f", {line}" if line else ""
    return (f"jax.nn.log_softmax makes the whole log-probabilities, {kind} "
            f"({format_bytes(nbytes)}{at}), and the step reads them only to take one per row, "
            f"the label's (through {how}). A label's log-probability is its logit minus the "
            "logsumexp of its row, which needs none of the others: jax.nn.logsumexp(logits, "
            "-1) - jnp.take_along_axis(logits, labels[..., None], -1)[..., 0] for the negative "
            "loss, as optax.softmax_cross_entropy_with_integer_labels computes it. For this "
            f"shape, here, XLA plans {format_bytes(plans[0])} of temporaries the first way and "
            f"{format_bytes(plans[1])} the second (keras-team/keras#20005).")


def _label_loss_plans(kind: str, device) -> tuple[int, int] | None:
    """XLA's temporaries for a mean loss over rows of ``kind`` ("float32[4, 256, 8192]") with
    integer labels, made (log_softmax, then take_along_axis) and (logsumexp minus the label's
    logit), compiled on ``device`` from shapes alone; None where either cannot compile."""
    import jax
    import jax.numpy as jnp

    dtype, shape = kind.split("[", 1)
    dims = tuple(int(d) for d in shape.rstrip("]").split(",") if d.strip())
    if not dims:
        return None
    x = jax.ShapeDtypeStruct(dims, jnp.dtype(dtype))
    y = jax.ShapeDtypeStruct(dims[:-1], jnp.int32)

    def whole(x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x, -1), y[..., None], -1))

    def by_logsumexp(x, y):
        return jnp.mean(jax.nn.logsumexp(x, -1)
                        - jnp.take_along_axis(x, y[..., None], -1)[..., 0])

    try:
        with jax.default_device(device):
            return tuple(jax.jit(f).lower(x, y).compile().memory_analysis().temp_size_in_bytes
                         for f in (whole, by_logsumexp))  # type: ignore[return-value]
    except Exception:  # a device that cannot say, a shape XLA refuses
        return None


#: how often a line must run in a program for its values to be read as a Python loop's chunks
CHUNK_LOOP_AT = 4


def unrolled_under_derivative(c: compiled.CompiledStep, temp: int) -> str:
    """A Python loop over chunks of an input inside jit, under a derivative: the step cuts
    :data:`CHUNK_LOOP_AT` pieces or more of one shape from an input along its first dimension
    (:func:`jaxpr_loops.chunked_inputs`), the largest temporary is made by a line that ran
    :data:`CHUNK_LOOP_AT` times or more, four or more values a quarter of its size or more are
    such lines', half of XLA's temporaries (``temp``) or more, and ``temp`` is four times the
    largest or more. jit unrolls the loop and the backward pass
    needs each iteration's values, so a loop over chunks saves little (HomebrewML/Olmax#25, a
    cross-entropy over 8 chunks of the logits: 60.5 MiB of temporaries, 64 MiB for the full
    logits, 40.1 MiB with lax.scan, 8.1 MiB with lax.scan and jax.checkpoint on the body;
    measured by the kit on the CPU, jax 0.10.2). "" otherwise."""
    if c.jaxpr is None or temp <= 0:
        return ""
    ran = {frames.line(file, n): k for (file, n), k in jaxpr_loops.line_runs(c.jaxpr).items()
           if k >= CHUNK_LOOP_AT}
    ts = c.temporaries(64)
    if not ts or ts[0].line not in ran or not ts[0].in_derivative or \
            jaxpr_loops.chunked_inputs(c.jaxpr) < CHUNK_LOOP_AT:
        return ""  # (a loop over layers: a checkpointed scan over them raised the plan)
    big = ts[0]
    same = [t for t in ts if t.line in ran and t.in_derivative and 4 * t.nbytes >= big.nbytes]
    if len(same) < 4 or temp < 4 * big.nbytes or 2 * sum(t.nbytes for t in same) < temp:
        return ""
    if jaxpr_loops.backward_passes(c.jaxpr, big.line) >= jaxpr_loops.OWN_DERIVATIVES_AT:
        return ""  # a jax.grad in each iteration (araffin/sbx#14): no derivative of the loop
    return (f"The largest value, {big.op} {big.dtype}{list(big.shape)} "
            f"({format_bytes(big.nbytes)}, {big.line}), is made by a line that ran "
            f"{ran[big.line]} times in this program: a Python loop, which jit unrolls. Under the "
            "derivative the backward pass needs each iteration's values: XLA's plan holds "
            f"{format_bytes(temp)} of temporaries, {temp / big.nbytes:.0f} times this value, "
            "and a loop over chunks of a batch saves little. Fix: jax.lax.scan over the "
            "iterations (chunks as x.reshape(n // k, k, ...), or layers' stacked weights) with "
            "jax.checkpoint on the body, which keeps one iteration's values and each step's carry "
            "(HomebrewML/Olmax#25, a cross-entropy over 8 chunks of the logits: 60.5 MiB of "
            "temporaries with the Python loop, 40.1 MiB with lax.scan alone, 8.1 MiB with "
            "lax.scan and jax.checkpoint).")


def widened_carry_note(line: str, wide: str, narrow: str, nbytes: int, of_bytes: int,
                       leaves: int) -> str:
    """A ``lax.scan`` that takes a gradient each step and carries values with the shapes of
    the step's arguments in a wider float (:func:`helpers._internal.jaxpr_loops.widened_carries`):
    a gradient accumulator in float32 beside bfloat16 parameters, a cost that does not shrink
    with the number of microbatches (AI-Hypercomputer/maxtext#5039; measured by the helper
    on the CPU, jax 0.10.2: 4 bfloat16 512x512 parameters, 4 microbatches, temporaries 9.18 MiB
    with a float32 carry, 7.18 MiB with a bfloat16 one)."""
    at = f" ({line})" if line else ""
    return (f"The lax.scan{at} carries {format_bytes(nbytes)} of {wide} with the shapes of "
            f"{leaves} {narrow} argument{'s' if leaves > 1 else ''} ({format_bytes(of_bytes)}):"
            f" a gradient accumulator in {wide}, {nbytes / of_bytes:.0f}x the bytes of what it "
            "accumulates, whatever the number of microbatches. Allocate it in the parameters' "
            "dtype (jax.tree.map(jnp.zeros_like, params)) or accept the cost (accumulating in "
            f"{wide} is more precise; AI-Hypercomputer/maxtext#5039).")


def random_bits_whole(c: compiled.CompiledStep) -> bool:
    """The step draws random numbers (threefry) while ``jax_threefry_partitionable`` is off:
    over a mesh each device then computes the bits of the whole array (levanter#475; measured
    on jax 0.8.0 and 0.10.2: 32 MiB of temporaries per device for a 4 MiB part, 12 MiB with
    the flag on)."""
    jax = devices.start_jax()
    return (not getattr(jax.config, "jax_threefry_partitionable", True)
            and bool({"threefry2x32", "random_bits"} & c.primitives))


def on_the_host_by_commitment(dev: jax.Device) -> str:
    """A note when committed arguments pin the step to another platform than the default
    device's (a GPU machine's batch committed to its CPU): jit runs it there, and says
    nothing. "" otherwise."""
    default = devices.default_device()
    if dev == default or getattr(dev, "platform", "") == getattr(default, "platform", ""):
        return ""
    loader = (" A loader that yields arrays committed to the CPU does this (jax.device_put to "
              "a CPU device; jax.dlpack.from_dlpack of a NumPy array commits too, seen on the "
              "CPU)." if getattr(dev, "platform", "") == "cpu" else "")
    return (f"This step runs on {device_name(dev)}, not on the default device "
            f"{device_name(default)}: its arguments are committed to {device_name(dev)}, and jit "
            f"runs where committed arguments are, without a word.{loader} If "
            f"{device_name(default)} was meant, jax.device_put the arguments there before the "
            "call.")


def chunk_size(length: int) -> int:
    """The number of steps per chunk nearest the square root of ``length`` that divides it
    (2 or more steps, 2 or more chunks); the square root itself where none does (a prime)."""
    root = math.isqrt(length)
    pairs = [d for k in range(2, root + 1) if length % k == 0 for d in (k, length // k)]
    return min(pairs, key=lambda d: abs(d - math.sqrt(length)), default=max(root, 2))


def chunks_fix(length: int) -> str:
    """The fix for a scan whose steps each keep their carry: checkpointed chunks of about
    sqrt(length) steps (measured by the kit for jax#19250, a fori_loop of 256 steps of sin over
    float32[4096]: 4.00 MiB kept became 256 KiB, XLA's temporaries 4.03 MiB became 0.53 MiB,
    the same gradient; jax 0.8.0 and 0.10.2)."""
    k = chunk_size(length)
    n, left = divmod(length, k)
    last = "the last step" if left == 1 else f"the last {left} steps"
    rest = (f" Then run {last} on their own, after the scan (your {length} steps are {n} "
            f"chunks of {k} and {left} more)." if left else "")
    return (f"A lax.scan over jax.checkpoint-ed chunks of {k} steps keeps one carry per chunk, "
            f"{n} in all, and the backward pass recomputes one chunk at a time: "
            f"jax.lax.scan(jax.checkpoint(chunk), carry, xs[:{n * k}].reshape({n}, {k}, ...)), "
            f"where chunk runs the body over its {k} steps with a lax.scan (for a fori_loop: "
            f"xs None, length={n}, and chunk a fori_loop of {k} steps).{rest}")


def checkpoint_fix(length: int, per_step: int, carry: int, checkpointed: bool,
                    chunked: bool) -> str:
    """What jax.checkpoint can do for a scan under a derivative that keeps ``per_step`` bytes
    a step, whose carry is ``carry`` bytes: checkpointing the body keeps each step's carry, so
    where that is all it keeps already, or the whole body is checkpointed already, the fix is
    chunks (jax-ml/jax#19250: "jax.remat(body_fn) does not help"); where a checkpoint covers
    only part of the body and a step keeps more than its carry, around the whole body."""
    if chunked:
        return ("Its body is a jax.checkpoint-ed chunk of steps already: it keeps one carry per "
                "chunk and recomputes one chunk at a time in the backward pass; chunks of about "
                "the square root of all the steps keep the least.")
    if checkpointed and (not carry or per_step <= 2 * carry):
        return ("Its body is under jax.checkpoint already, so each step keeps its carry (and "
                "what the checkpoint's policy saves). " + chunks_fix(length))
    if carry and per_step <= carry:
        return (f"Each step keeps {format_bytes(per_step)}, no more than its carry "
                f"({format_bytes(carry)}), which is what jax.checkpoint on the body would keep: "
                "it cannot shrink this (jax#19250). " + chunks_fix(length))
    if checkpointed:
        return (f"Part of its body is under jax.checkpoint, yet each step keeps "
                f"{format_bytes(per_step)}, more than its carry ({format_bytes(carry)}): "
                "jax.checkpoint around the whole body keeps only each step's carry and "
                "recomputes the rest in the backward pass.")
    return ("jax.checkpoint on the body keeps only each step's carry and recomputes the rest in "
            "the backward pass.")


def fwd_rule_fix(rule: str) -> str:
    """The fix for residuals a jax.custom_vjp fwd rule returns (sgl-project/sglang-jax#823:
    measured by the kit on a chunked linear attention of 32 chunks, jax 0.8.0 and 0.10.2: 896
    KiB kept, the same with jax.checkpoint on the scan's body inside the fwd rule; 256 KiB
    with the rule returning only its inputs)."""
    return (f"JAX keeps what {rule} returns until the bwd rule runs, and jax.checkpoint on code "
            f"inside {rule} (a scan's body) cannot drop it; around the whole call it only makes "
            f"{rule} run again in the backward pass. Return fewer residuals from {rule} (its "
            "inputs, say) and recompute the rest in the bwd rule (sglang-jax#823).")


def _updated_stack_note(t: compiled.ScanStack, peak: int) -> str:
    """A scan that takes an array in as xs and gives it back as ys with rows written into each
    step's slice: a KV cache stacked over layers, scanned over with the layers
    (marin-community/levanter#1249, the maintainer's fix a list of per-layer caches, "~5-6x").
    Measured by the helper on the CPU, 8 layers of [2, 2048, 4, 64] float32 (32 MiB), donated:
    51.2 ms per token through the scan (35.6 on jax 0.8.0), 13.2 with a list of per-layer
    caches, 10.2 with the cache carried by a lax.fori_loop and written with
    dynamic_update_slice at (i, 0, pos, 0, 0); XLA's temporaries 40 MiB -> 4 MiB."""
    at = f" ({t.line})" if t.line else ""
    return (f"A lax.scan{at} takes a {t.dtype}{list(t.shape)} in as xs and gives it back as "
            f"ys with rows written into each of its {t.length} steps' slices "
            "(dynamic_update_slice or .at[].set): every call builds a new "
            f"{format_bytes(t.updated_bytes)} stacked array ({t.updated_bytes / peak:.0%} of the "
            "peak) to change those rows, and donating the old one does not make the write in "
            "place. Carry the array instead and write step i's rows into it with "
            "lax.dynamic_update_slice at (i, ...) in a lax.fori_loop over the layers, or keep a "
            "list of per-layer arrays (a KV cache: marin-community/levanter#1249; 51 -> 10 ms "
            "per token on the CPU).")


def stack_note(t: compiled.ScanStack, peak: int) -> str:
    at = f" ({t.line})" if t.line else ""
    largest = (f"; the largest, {t.dtype}{list(t.shape)}" if t.outputs > 1 else
               f": {t.dtype}{list(t.shape)}")
    head = (f"A lax.scan{at} keeps a value for each of its {t.length} steps, "
            f"{format_bytes(t.nbytes)} stacked over its length ({t.nbytes / peak:.0%} of the "
            f"peak{largest})")
    if t.role == "forward" and t.fwd_rule:  # (its values may be residuals, or the output)
        rule = t.fwd_rule
        return (f"{head}: it runs inside the jax.custom_vjp fwd rule {rule}. What {rule} returns "
                "as residuals JAX keeps until the bwd rule runs, and jax.checkpoint on code "
                f"inside {rule} cannot drop it: where preflight.residuals(loss, ...) names this "
                f"scan's values as {rule}'s residuals, return fewer from {rule} and recompute "
                f"them in the bwd rule (sglang-jax#823); where it does not, they are {rule}'s "
                "output.")
    if t.role == "recomputed" and not t.checkpointed:
        return (f"{head}: a jax.checkpoint around the whole scan recomputes it for the backward "
                "pass, and recomputed it keeps what the backward pass needs from every step at "
                "once, as a scan with no checkpoint does. Put the checkpoint (and its policy) "
                "on the scan's body instead, jax.lax.scan(jax.checkpoint(body), ...): it keeps "
                "one carry per step and recomputes one step at a time (NovaSky-AI/SkyRL#1083; "
                "apple/axlearn#1171, remat(scan(f)) made scan(remat(f)); a miniature on the "
                "CPU: XLA's temporaries 94.75 -> 10.00 MiB, jax 0.10.2).")
    if t.role in ("forward", "recomputed"):  # (recomputed, its body checkpointed already)
        return (f"{head}: it runs under a derivative (jax.grad, jax.vjp), so beside what its "
                "body returns it keeps what the backward pass needs from each step. "
                "preflight.residuals(loss, ...) lists those. "
                + checkpoint_fix(t.length, t.nbytes // t.length, t.carry_bytes,
                                  t.checkpointed, t.chunked))
    if t.updated_bytes * 2 >= t.nbytes:
        return _updated_stack_note(t, peak)
    if not t.has_carry:
        return (f"{head.replace('A lax.scan', 'A jax.lax.map (a scan without a carry)', 1)}: "
                "its result, each step's stacked. Where what follows needs only a reduction of "
                "it (a sum, a maximum), compute that in a lax.scan's carry instead, and no "
                "step's result is kept; where it needs all of it on the device, this is memory "
                "the step must have. Where it is kept for the host (samples to save or plot), "
                "call the step on one chunk at a time and move each chunk's result to the host "
                "(np.asarray, jax.device_get) before the next: the device holds one chunk's "
                "(juanitorduz/numpyro_forecast#65, posterior predictive draws).")
    if t.copied_bytes * 2 >= t.nbytes:
        return (f"{head}: {format_bytes(t.copied_bytes)} of it is the body returning its slice "
                "of what the scan reads, unchanged, so the scan stacks a copy of that array. "
                "Drop it from the body's outputs (Flax NNX: return only the state that "
                "changes, not nnx.state(layer) with its nnx.Param, maxtext#4405). Under "
                "jax.checkpoint or an inner jax.jit JAX keeps the copy; returned directly, "
                "JAX drops it itself.")
    return (f"{head}: what its body returns beside the carry. Return less from the body (a "
            "sum, or the last value, belongs in the carry). Where the history is wanted, keep "
            "every k-th step: an outer lax.scan over the snapshots whose body runs k steps in "
            "a jax.lax.fori_loop and returns only the last (uwplasma/JAX-in-Cell#37). Where "
            "all of it is the result, run the scan in chunks from a Python loop, the carry "
            "passed on, and move each chunk's stack to the host (jax.device_get, or to disk) "
            "before the next (SparkyTruck/deepmd-jax#6).")


def record_note(loop: str, whole: tuple[int, ...], step: tuple[int, ...], dtype: str,
                 nbytes: int, line: str, write: str = "", steps: int | None = None,
                 made_here: bool = True, unchanged: int = 0) -> str:
    """The note for a buffer a loop carries and only writes, a step's value per row
    (google-deepmind/gemma#534: a sampler kept every token's logits over the vocabulary; its
    fix keeps the top-k logits and their indices. Measured by the kit on the CPU, B=4, 128
    steps, a vocabulary of 4096: a peak of 10.44 MiB, 2.47 MiB with the top 8, jax 0.8.0 and
    0.10.2). A ``while_loop`` has no step count: its buffer is sized by its bound, whatever the
    number of steps it takes (patrick-kidger/diffrax#238: ``SaveAt(steps=True)`` keeps
    ``max_steps`` rows, 4096, for 8 steps taken; equinox writes them with its own
    ``maybe_set``. ``SaveAt(ts=...)`` of 6 times: a peak of 32.04 MiB -> 81.66 KiB, y of 1024
    float32, measured by the kit with diffrax 0.7.2, equinox 0.13.8, jax 0.10.2 on the CPU).
    A scan's buffer of more rows than steps is told to shrink only where the step makes it
    (``made_here``): one handed in may hold rows written before (a prompt's, then a decode's).
    ``unchanged``: of each row's values, those the loop carries unchanged
    (:func:`helpers._internal.jaxpr_loops.unchanged_in_rows`); half of the row or more is named, as
    every row's copy of the same values (pyro-ppl/numpyro#539: fori_collect kept the whole HMC
    state per sample, 8,192 of its 8,325 floats a dense mass matrix and its square root;
    collecting state.z alone: XLA's outputs 33,300,064 B -> 256,000 B, its peak 33,333,440 B
    -> 272,980 B, D=64 and 1000 samples, measured on jax 0.8.0 and 0.10.2, CPU)."""
    kind = "lax.while_loop" if loop == "while" else "lax.scan (or lax.fori_loop)"
    rows = math.prod(whole) // max(math.prod(step), 1)
    head = (f"A {kind} writes a {dtype}{list(step)} into its carried {dtype}{list(whole)} at "
            f"each step{f' ({line})' if line else ''} and never reads it back: "
            f"{format_bytes(nbytes)} held through the loop")
    row = max(math.prod(step), 1)
    if 2 * unchanged >= row and made_here:
        kept = nbytes * (row - unchanged) // row
        return (f"{head}, yet {unchanged:,} of each row's {row:,} values "
                f"({100 * unchanged // row}%) are values the loop carries unchanged, the same "
                "in every row. Collect only what changes (numpyro's fori_collect(..., "
                "transform=lambda state: state.z), pyro-ppl/numpyro#539): "
                f"{format_bytes(nbytes)} -> {format_bytes(kept)} without them.")
    part = ("where what follows needs only part of each step's value (the top-k logits and "
            "their indices, the chosen token's log-probability), write that instead, and the "
            "buffer shrinks in proportion (google-deepmind/gemma#534)")
    if steps is not None and steps < rows and not made_here:  # rows handed in may hold values
        return (f"{head}, {rows} rows, of which its {steps} steps write {steps}: the others "
                f"keep what the buffer held when it was handed in; {part}.")
    if steps is not None and steps < rows:
        return (f"{head}, {rows} rows, of which its {steps} steps write at most {steps}. Size "
                f"the buffer by the steps ({steps} rows), or return each step's value as the "
                f"scan's output; {part}.")
    if loop == "while":
        fix = ("with diffrax, SaveAt(steps=True) or SaveAt(dense=True) keeps max_steps rows: "
               "save at the times you need, SaveAt(ts=...), or lower max_steps "
               "(patrick-kidger/diffrax#238; 32.04 MiB -> 81.66 KiB for 6 times)"
               if write == "maybe_set" else
               "write only the steps you need into a buffer of that many rows, or lower the "
               "bound (patrick-kidger/diffrax#238: SaveAt(ts=...) for SaveAt(steps=True))")
        return (f"{head}, {rows} rows sized by its bound, not by the steps it takes (room for "
                f"each of its {rows} steps at most; the rows past the last step taken hold "
                f"nothing it wrote). The fix: {fix}; {part}.")
    return (f"{head}, a value of each of its {rows} steps. {part[0].upper()}{part[1:]}; where "
            "it needs all of it, this is memory the loop must have.")


def carry_copy_note(dtype: str, shape: tuple[int, ...], nbytes: int, copies: int,
                     steps: int | None, in_derivative: bool, line: str, more: int = 0) -> str:
    """The note for a loop whose carried buffer XLA copies whole on every step, so a step that
    writes one row costs the whole buffer and the loop is quadratic in its length: under
    jax.grad, a scan that writes rows into its carry (jax-ml/jax#10197: the fix returns the
    rows as the scan's output; measured by the kit, jax.grad at 4000 rows of 10x10 on the CPU,
    677 -> 3.1 ms), or a value read from the carry before a write and used after it
    (jax-ml/jax#17845: read after the writes; 2000 steps over 1e6 floats, 607 -> 0.4 ms)."""
    each = f"each of its {steps} steps" if steps else "each step"
    total = f" ({format_bytes(nbytes * copies * steps)} copied a call)" if steps else ""
    times = "whole" if copies == 1 else f"whole {copies} times"
    also = f" (and in {more} more loop{'s' if more > 1 else ''})" if more else ""
    head = (f"XLA copies the loop's carried {dtype}{list(shape)} ({format_bytes(nbytes)}) "
            f"{times} on {each}{f' ({line})' if line else ''}{total}{also}, so the time grows "
            "with the buffer, not with what a step writes")
    grad = ("under jax.grad a row written into the carry is not updated in place "
            "(jax-ml/jax#10197): return each step's row as the scan's output (ys) and carry only "
            "what the next step needs (677 -> 3.1 ms)")
    read = ("a value read from the carry before a write to it and used after it keeps the old "
            "buffer alive (jax-ml/jax#17845): read it after the writes, copying it into a spare "
            "slot of the carry first (607 -> 0.4 ms)")
    if not line:  # a loop of JAX's or a library's (a solver's): no rewrite is the user's
        return (f"{head}. The loop is not in your code (JAX's or a library's own, such as an "
                "iterative solver's), so the rewrite is not yours to make; what you choose is "
                "what it carries: its size follows the arguments you give the function that "
                "runs it, and a vmap around that call (jax.vmap, jax.jacrev, jax.jacfwd) "
                "carries the whole batch at once.")
    first, then = (grad, read) if in_derivative else (read, grad)
    return f"{head}: {first}; or {then}."


def slice_copy_note(dtype: str, shape: tuple[int, ...], nbytes: int, copies: int, joins: int,
                     moved: int, steps: int | None, line: str, joined: str, more: int = 0) -> str:
    """The note for a loop that updates a carried buffer in place while XLA copies slices of
    it and concatenates them back on every step: a KV cache [B, layers, 2, S, H, D] whose
    layer's K and V are sliced out, updated with dynamic_update_slice and put back with
    jnp.stack, which rebuilds the layer's cache to write one row (keras-team/keras-hub#2780,
    fixed in #2781 by dropping the stack; keras-hub#1562 and marin-community/levanter#1249: a
    list of per-layer caches). Measured by the helper on the CPU, jax 0.10.2, 4 layers,
    S=2048, 64 tokens in a lax.while_loop, best of 8: 187-206 ms stacked, 93-107 ms with one
    K and one V buffer per layer updated in place (the same tokens); at S=512 the kit counts 8
    copies of 512 KiB and 4 concatenates of 1 MiB a step, none with the per-layer buffers."""
    each = f"each of its {steps} steps" if steps else "each step"
    total = f", {format_bytes(moved * steps)} a call" if steps else ""
    made = f" (the concatenates: {joined})" if joined else ""
    also = f" (and in {more} more loop{'s' if more > 1 else ''})" if more else ""
    what = ", ".join(part for part in (
        f"{copies} cop{'y' if copies == 1 else 'ies'}" if copies else "",
        f"{joins} concatenate{'s' if joins > 1 else ''}" if joins else "") if part)
    return (f"The loop{f' ({line})' if line else ''} updates its carried {dtype}{list(shape)} "
            f"({format_bytes(nbytes)}) in place, yet XLA copies slices of it and concatenates "
            f"them back on {each} ({what}; {format_bytes(moved)} moved a step{total}){also} to "
            "write a row, as when a KV cache's K and V are sliced out of it, updated and stacked "
            f"back{made}. Keep each layer's K and V as separate buffers in the carry and update "
            "each in place with lax.dynamic_update_slice, with no jnp.stack or concatenate "
            "(keras-team/keras-hub#2780: about 2x faster on the CPU).")


def widened(c: compiled.CompiledStep, fn: Callable, args: tuple, kwargs: dict
            ) -> list[tuple[str, str, str, int, str, str, str, bool]]:
    """(what, its dtype, the wider dtype, bytes at that dtype, line, "constant" or
    "argument", the wider operand's name, whether that operand was passed as a NumPy array) of
    each value jnp's promotion widens before a dot or a convolution, largest first
    (:meth:`helpers.compiled.CompiledStep.widened_inputs`)."""
    out, names = [], c.leaf_names(fn, args, kwargs)
    jax = devices.start_jax()
    passed = dict(jax.tree_util.tree_flatten_with_path(c.dynamic(args, kwargs))[0])
    for path, dtype, to, shape, nbytes, line, kind, other in c.widened_inputs(args, kwargs):
        what = (f"{''.join(names(path))} ({dtype}{list(shape)})" if path
                else f"a {dtype}{list(shape)} value computed from the arguments")
        other_name = "".join(names(other)) if other else ""
        out.append((what, dtype, to, nbytes, line, kind, other_name,
                    isinstance(passed.get(other), np.ndarray)))
    return out


def round_trip_note(narrow: str, wide: str, shape: tuple[int, ...], nbytes: int, line: str,
                    more: int = 0) -> str:
    """Half-precision values computed in a wider float and cast back
    (:func:`helpers._internal.jaxpr_values.promoted_round_trips`): a float32 parameter, coefficient
    or dt beside a float16 state promotes the work (brainpy/BrainPy#539; measured by the
    helper on the CPU, jax 0.10.2, a million-neuron RK2 step in float16: 7.63 MiB of
    temporaries with float32 parameters, 3.82 MiB with float16 ones)."""
    at = f" ({line})" if line else ""
    also = f" (and {more} more such value{'s' if more > 1 else ''})" if more else ""
    return (f"The {narrow} values of shape {list(shape)} are computed in {wide}{at}{also}: "
            f"they meet a {wide} operand (a parameter, a coefficient or a time step given as "
            f"{wide}), jnp promotes the work to {wide} ({format_bytes(nbytes)} a value), and "
            f"the result is cast back to {narrow}, so half precision saves neither memory nor "
            f"time there. Give every operand the {narrow} type too: jax.tree.map(lambda x: "
            f"x.astype(jnp.{narrow}), params), dt = jnp.asarray(dt, jnp.{narrow}) "
            "(brainpy/BrainPy#539).")


def widened_note(what: str, dtype: str, to: str, nbytes: int, line: str, kind: str,
                  other: str, other_numpy: bool = False) -> str:
    """A value jnp's promotion reads at a wider type before a dot, and the fix. Measured on
    the CPU (jax 0.10.2; 0.8.0 alike): under x64, a float32 step dividing by
    ``sigma = np.std(data)`` of NumPy data (a NumPy float64 scalar, strongly typed) runs in
    float64: ``float(sigma)`` took XLA's temporaries from 9.00 to 2.00 MiB and the peak from
    17.50 to 10.50 MiB (jax-ml/jax#1830); bfloat16 parameters against a float32 batch make
    every activation float32: ``batch.astype(jnp.bfloat16)`` took what jax.grad keeps from
    50.00 to 26.00 MiB (jax-ml/jax#7368); a float32 bias added to a bfloat16 activation
    names the bias (an argument, not a constant), and ``b.astype(jnp.bfloat16)`` at that line
    took what jax.grad keeps from 8.25 to 6.25 MiB. The constant is not named (a jaxpr has no
    name for it): the fix says "the constant that line reads".
    ``jax.numpy_dtype_promotion('strict')`` raises a TypePromotionError at each such line
    (jax-ml/jax#10824, the maintainers' answer). ``other_numpy``: the wider argument came as a
    NumPy array, data made on the host, where NumPy's own promotion may have widened it
    (p-doom/jasmine#123: a bfloat16 video divided by 255.0 in NumPy is float32, where jnp keeps
    bfloat16; NumPy 2.4.6 with ml_dtypes): cast it before the step, no master copy at stake."""
    at = f" at {line}" if line else ""
    if kind == "constant":
        whose = ("under x64 a NumPy float64 scalar or array, such as np.std of NumPy data, is "
                 "strongly typed, jax-ml/jax#1830" if to == "float64" else
                 f"a NumPy or JAX {to} array the function closes over is strongly typed")
        cause = f"jnp promotes it with a {to} constant there ({whose}; a Python float is not)"
        fix = (f"make the constant that line reads {dtype} where it is made "
               f"(jnp.{dtype}(...) of it), or pass a scalar as a Python float (float(...) of "
               "it), which takes the other operand's dtype")
    else:
        named = other or f"a {to} value computed from the arguments"
        cause = f"jnp promotes it with {named} ({to}) there (jax-ml/jax#7368)"
        numpy_math = (" (NumPy computes a bfloat16 array divided by a Python float, x / "
                      "255.0, in float32, where jnp keeps bfloat16: do that arithmetic with "
                      "jnp, or cast after it; p-doom/jasmine#123)" if dtype == "bfloat16" else "")
        fix = (f"{other} came as a NumPy {to} array, made on the host: give it {dtype} "
               f"before the step{numpy_math}" if other and other_numpy else
               f"cast {other} to {dtype} where that line reads it ({other}.astype(jnp."
               f"{dtype}) there: cast before the step, a parameter the optimizer updates "
               f"would lose its {to} master copy)" if other else
               f"cast that value to {dtype} where it is made (.astype(jnp.{dtype}))")
    what = "A" + what[1:] if what.startswith("a ") else what  # a sentence of its own
    return (f"{what} is read as {to}{at}: {cause}, so what is computed from it there on, and "
            f"what jax.grad keeps of it, is {to} ({format_bytes(nbytes)} as {to} for this "
            f"value alone). Fix: {fix}; jax.numpy_dtype_promotion('strict') raises at every "
            "line that promotes so.")


def float64_arguments(c: compiled.CompiledStep, args: tuple, kwargs: dict) -> int:
    """The bytes of the step's float64 array arguments (each buffer once) while x64 is on;
    0 with x64 off."""
    jax = devices.start_jax()
    if not jax.config.jax_enable_x64:
        return 0
    leaves = {id(leaf): leaf for leaf in jax.tree.leaves(c.dynamic(args, kwargs))
              if str(getattr(leaf, "dtype", "")) == "float64"}
    return sum(compiled.array_bytes(leaf) for leaf in leaves.values())


def float64_note(nbytes: int, argument_bytes: int, factors: bool = False) -> str:
    """x64 on and most of the step's arguments float64: under x64 what is made without a
    dtype is float64 (patrick-kidger/equinox#1154: a network initialised so; dtype=jnp.float32
    at creation took the step's arguments from 27.17 to 13.59 MiB and its peak from 56.22 to
    28.11 MiB, measured on the CPU, jax 0.10.2 and 0.8.0). Worded for a step that wants its
    float64 too (a float64 PDE step, x64.py of the code review): no gate tells the two apart,
    since both are float64 throughout, so the fix is stated as conditional on float32 being
    enough."""
    share = f" ({nbytes / argument_bytes:.0%})" if argument_bytes else ""
    return (f"{format_bytes(nbytes)} of the step's arguments{share} are float64, and "
            "jax_enable_x64 is on: under x64 an array made without a dtype (jnp.zeros, "
            "jax.random.normal, NumPy data through jnp.asarray, a layer's initialiser such as "
            "eqx.nn.Linear's) is float64, twice float32's bytes. If float32 is enough for them "
            "(a network beside float64 numerics, patrick-kidger/equinox#1154), pass "
            "dtype=jnp.float32 where they are made, or leave x64 off; if the step needs float64, "
            "this is its cost, not a mistake." + (
                " This step factors a matrix (a Cholesky, an LU, an eigendecomposition): keep "
                "that matrix in float64, which is what x64 is usually on for, as a factorization "
                "in float32 can fail on a matrix near singular and give NaN (a kernel matrix: "
                "dfm/tinygp#24)." if factors else ""))


#: where XLA:CPU computes a half-precision type in float32: read in openxla/xla's
#: xla/service/cpu/cpu_compiler.cc (FloatNormalization with CpuFloatSupport(BF16): bfloat16
#: arithmetic becomes float32, data movement stays; ChangeOpDataType(F16, F32): float16 dots
#: and convolutions, elementwise float16 stays float16). Measured: the same MLP training step
#: has 36.00 MiB of temporaries in bfloat16, 34.00 MiB in float32 (jax 0.10.2, the CPU)
_CPU_UPCAST = {"bfloat16": "bfloat16 arithmetic in float32 (FloatNormalization with "
                           "CpuFloatSupport(BF16)",
               "float16": "float16 dots and convolutions in float32 (ChangeOpDataType(F16, "
                          "F32)"}
#: what a GPU does instead, read in openxla/xla: xla/service/gpu/gpu_float_support.cc keeps
#: bfloat16 dots and data movement (copy, broadcast, slice, ...) at bfloat16; add, multiply
#: and subtract count as supported only on Hopper or later, abs, max, min and negate on Ampere
#: or later, exp and log on CUDA, everything else (tanh, divide, sqrt, ...) FloatNormalization
#: widens to float32, and it runs before fusion (gpu_compiler.cc's post-layout passes), so the
#: widening is mostly inside fusions. gpu_compiler.cc normalizes no float16. Not yet run on a
#: GPU
_GPU_KEEPS = {"bfloat16": "a GPU computes the dots in bfloat16 and keeps values between "
                          "fusions mostly in bfloat16 (tanh, divide, sqrt and like math widened "
                          "to float32 inside fusions, add and multiply too below Hopper; "
                          "xla/service/gpu/gpu_float_support.cc",
              "float16": "a GPU computes float16 dots and convolutions in float16 "
                         "(xla/service/gpu/gpu_compiler.cc normalizes no float16"}


def cpu_upcast(c: compiled.CompiledStep, temporaries: Sequence[compiled.Temporary]
               ) -> tuple[str, list[dict]]:
    """(the half-precision dtype, XLA's float32 values of its shapes, largest first) where
    the step compiled for the CPU computes bfloat16 or float16 values of its jaxpr in float32
    and one of them is among its largest ``temporaries``; ("", []) otherwise. A float32 value
    whose shape a float32 value of the jaxpr has too is left out (it may be the user's own)."""
    if getattr(c.device, "platform", "") != "cpu":
        return "", []
    shapes = jaxpr_values.shapes_by_dtype(c.jaxpr)
    wide = shapes.get("float32", set())
    for dtype in _CPU_UPCAST:
        half = shapes.get(dtype, set()) - wide
        found = [v for v in c.values if v["dtype"] == "f32" and tuple(v["shape"]) in half]
        if found and any(t.dtype == "f32" and tuple(t.shape) in half for t in temporaries):
            return dtype, found
    return "", []


def cpu_upcast_note(dtype: str, found: list[dict]) -> str:
    """The CPU stand-in's float32 copies of a half-precision step: labelled, sizes kept."""
    v = found[0]
    largest = (f"{v['op'].rsplit('/', 1)[-1]} f32{list(v['shape'])}, "
               f"{format_bytes(v['nbytes'])}")
    many = (f"{len(found)} of XLA's values are float32 with the shapes of {dtype} values of "
            f"the step, the largest {largest}" if len(found) > 1 else
            f"XLA's {largest} has the shape of a {dtype} value of the step")
    return (f"On the CPU, XLA computes {_CPU_UPCAST[dtype]}, openxla/xla "
            f"xla/service/cpu/cpu_compiler.cc): these temporaries are float32-sized ({many}); "
            f"{_GPU_KEEPS[dtype]}; from XLA's source, not yet run on a GPU). "
            f"To see what a change to {dtype} saves, compare residuals(loss, ...) (the jaxpr's "
            "sizes), not these temporaries.")


def cast_note(wide: str, narrow: str, shape: tuple[int, ...], nbytes: int, line: str,
               scan: str, role: str) -> str:
    """An input cast whole to a narrower float before a scan reads it step by step
    (marin-community/levanter#426: "we store a full bf16 copy of all the parameters")."""
    note = (f"A {wide}{list(shape)} input is cast to {narrow} whole"
            f"{' (' + line + ')' if line else ''}, {format_bytes(nbytes)} for all "
            f"{shape[0]} steps at once, before the lax.scan{' (' + scan + ')' if scan else ''} "
            "reads it one step at a time: the cast copy is made before the loop and held "
            "through it. Cast each step's slice inside the body instead (the maintainer's fix "
            "in marin-community/levanter#426).")
    if role == "forward":
        note += (" Under a derivative also put the body under jax.checkpoint: otherwise JAX "
                 "keeps each step's cast for the backward pass all the same.")
    return note


def threefry_note(c: compiled.CompiledStep, temp: int, peak: int) -> str:
    """For a step whose temporaries are mostly a large ``jax.random`` draw's bits (threefry2x32,
    JAX's default generator: jax-ml/jax#20328): the draw, and the generator that holds less.
    Only where XLA's plan keeps uint32 values of the draw's shape (measured on the CPU, jax
    0.8.0 and 0.10.2: an 8 MiB normal table, 24 MiB of temporaries; with an rbg key, none),
    and one draw's make up half the temporaries or more: several draws of one shape (dropout's
    masks, one a layer) are made one after another in memory XLA reuses, so each draw's bits
    count once (a dropout MLP's two 2 MiB masks, 22.5 MiB of temporaries: 18.4 MiB with an
    rbg key, measured on the CPU, jax 0.10.2; no note). Under jax.vmap over a batch of keys
    the rbg key is not advised: it draws the whole batch from the first key (jax-ml/jax#21663,
    a new user's trial: "example 3 in the batch == example 3 alone: False")."""
    draws = [d for d in c.threefry_draws() if d[1] >= 2**20]
    if not draws or 2 * temp < peak:
        return ""
    shape, nbytes, line, keys = draws[0]
    times = sum(d[0] == shape for d in c.threefry_draws())
    listed = sum(v["nbytes"] for v in c.values if v["dtype"] in ("u32", "uint32")
                 and tuple(v["shape"]) == shape)
    kept = listed // times  # one draw's
    # XLA's loop that makes the bits carries the uint32 values listed here and makes as many
    # again in its body, which no list shows: the draw is most of the temporaries where the
    # listed ones are a quarter of them (bfloat16 at 2048 x 1024: 16 MiB listed of 32 MiB;
    # float32: 16 of 24. jax-ml/jax#21045: the old test, half, left out every bfloat16 draw)
    if 4 * kept < temp:
        return ""
    each = f" (one of {times} draws of that shape)" if times > 1 else ""
    head = (f"jax.random{' at ' + line if line else ''} draws {format_bytes(nbytes)} of random "
            f"bits{each} through threefry2x32, JAX's default generator, and XLA's plan holds "
            f"{format_bytes(kept)} of uint32 values that size while making "
            f"{'each' if times > 1 else 'them'} ({kept / nbytes:.0f}x the draw). ")
    if keys > 1:  # under vmap: an rbg key would draw the batch from its first key
        return (head + f"jax.vmap draws them from {keys:,} keys at once, so the 'rbg' "
                "generator, which elsewhere makes them with no such temporaries, is no fix "
                "here: under vmap an rbg key draws the whole batch from the batch's first key "
                "(JAX's documented behaviour, jax-ml/jax#21663 and #22684), so each example "
                "would no longer get its own key's numbers, and they would change with how the "
                "batch is made or split. Draw the batch in pieces instead (jax.lax.map(f, xs, "
                "batch_size=k)).")
    return (head + "A key of the 'rbg' generator makes them with no such temporaries: "
            "jax.random.key(seed, impl='rbg'), or jax.config.update('jax_default_prng_impl', "
            "'rbg') before any key is made (other numbers, the same distribution; froystig in "
            "jax-ml/jax#17982). Or draw a large table in pieces.")


def numpy_made_while_tracing(fn: Callable, closed, least: int = 2**20
                             ) -> list[tuple[str, int, str]]:
    """(the array as "float32[1, 1, 1024, 1024]", its bytes, the line that reads it) of each
    NumPy array of ``least`` bytes or more that enters the step as a constant and that no
    variable holds: not a global of the function's files nor a value it closes over, so made
    with NumPy while jit traced (``np.tril(np.ones((T, T)))`` in the step, dm-haiku#675).
    Compared by value: JAX keeps a float64 array as a float32 copy."""
    import sys

    from helpers._internal import jaxpr_walk

    found = jaxpr_walk.numpy_constants(closed, least)
    if not found:
        return []
    roots: list = [fn]
    while hasattr(fn, "__wrapped__"):  # jax.jit's, functools.wraps'
        fn = fn.__wrapped__
        roots.append(fn)
    main = sys.modules.get("__main__")
    files = set().union(*(f for _, _, f in found))
    roots += [m for m in list(sys.modules.values())
              if getattr(m, "__file__", None) in files or m is main]
    out = []
    for c, line, _ in found:
        value = np.asarray(c)
        if _reaches(roots, value):
            continue
        out.append((f"{value.dtype}{list(value.shape)}", int(value.nbytes), line))
    return out


def large_constants(closed, least: int = 2**20) -> int:
    """How many constants of ``least`` bytes or more the step's jaxpr holds (jax.Arrays and
    NumPy arrays, nested jaxprs included)."""
    from helpers._internal import jaxpr_walk

    return sum(1 for _, consts in jaxpr_walk.walk(closed) for c in consts
               if getattr(c, "ndim", 0) and int(np.prod(c.shape)) * np.dtype(c.dtype).itemsize
               >= least)


def _reaches(roots: list, value, depth: int = 3, most: int = 20000) -> bool:
    """A NumPy array equal to ``value`` (in ``value``'s dtype) is reached from ``roots`` within
    ``depth`` steps: a module's globals, a function's globals and closure, a bound method's
    object, a functools.partial's arguments, an object's attributes, a dict's values, a list's
    or tuple's items (a review: a model's self.w, partial(f, mask=arr), a nested config)."""
    seen: set[int] = set()
    level = list(roots)
    for _ in range(depth + 1):
        nxt = []
        for v in level:
            if id(v) in seen or len(seen) > most:
                continue
            seen.add(id(v))
            if isinstance(v, np.ndarray):
                if v.shape == value.shape and v.dtype != object:
                    try:
                        if np.array_equal(v.astype(value.dtype, copy=False), value):
                            return True
                    except (TypeError, ValueError):
                        pass
                continue
            try:  # (an object's own __getattr__ may raise anything: a review)
                nxt += _inside(v, roots)
            except Exception:
                continue
        level = nxt
    return False


def _inside(v, roots: list) -> list:
    """What :func:`_reaches` looks at one step further from ``v``."""
    import functools
    import types

    if isinstance(v, types.ModuleType):  # a module imported there is not searched
        return list(vars(v).values()) if any(v is r for r in roots) else []
    if isinstance(v, types.FunctionType):
        return ([c.cell_contents for c in (v.__closure__ or ()) if _filled(c)]
                + [v.__globals__.get(n) for n in v.__code__.co_names]
                + list(v.__defaults__ or ()) + list((v.__kwdefaults__ or {}).values()))
    if isinstance(v, types.MethodType):
        return [v.__self__, v.__func__]
    if isinstance(v, functools.partial):
        return [v.func, *v.args, *v.keywords.values()]
    if isinstance(v, dict):
        return list(v.values())
    if isinstance(v, (list, tuple)):
        return list(v[:1000])
    if isinstance(v, (str, bytes, int, float, bool, type(None), type)):
        return []
    try:
        found = list(vars(v).values())
    except TypeError:  # no __dict__
        found = []
    return [*found, getattr(v, "__wrapped__", None)]


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def numpy_constant_note(made: list[tuple[str, int, str]], program_constants: int) -> str:
    """The note for NumPy arrays made while tracing (:func:`numpy_made_while_tracing`)."""
    kind, nbytes, line = made[0]
    more = f" (and {len(made) - 1} more)" if len(made) > 1 else ""
    at = f", read at {line}" if line else ""
    return (f"A NumPy array made while jit traced, {kind} ({format_bytes(nbytes)}{at}){more}, "
            "enters the program as a constant: NumPy runs in Python, so jit sees only its "
            f"result, which XLA holds as a constant or folds into the values it computes from "
            f"it (the program holds {format_bytes(program_constants)} of constants). Build it "
            "with jnp instead (jnp.tril(jnp.ones(...)), jnp.arange): XLA then computes it "
            "inside the program and fuses it into its use, holding no copy (google-deepmind/"
            "dm-haiku#675). Passing it as an argument, or compiling without constant folding, "
            "holds the whole array instead; for a causal mask, "
            "jax.nn.dot_product_attention(..., is_causal=True) makes none.")


def bound_method_note(fn: Callable) -> str:
    """For a jit of a method bound to an object (``t.__call__``), the object's arrays are what
    it closes over: the fix passes the object (patrick-kidger/equinox#770)."""
    import inspect

    try:
        method = inspect.unwrap(fn)  # eqx.filter_jit and jax.jit keep it as __wrapped__
    except Exception:  # a wrapper whose __wrapped__ chain loops
        method = fn
    if not inspect.ismethod(method):
        return ""
    return (f" {method.__name__} is a method bound to a {type(method.__self__).__name__} "
            "object, whose arrays a jit of the method closes over: pass the object itself. "
            "With equinox, eqx.filter_jit(t)(x), not eqx.filter_jit(t.__call__)(x), which takes "
            "the object of a method like __call__ as static (patrick-kidger/equinox#770: "
            "16.00 MiB of weights baked in, 0 B once passed; XLA's compile 0.29 -> 0.04 s); "
            "with jax.jit, an object that is a pytree as an argument, "
            "jax.jit(lambda t, x: t(x))(t, x).")




def identity_static_note(fn: Callable, args: tuple) -> str:
    """A positional argument that is an object of a class of the user's with no ``__hash__``
    of its own and attributes (``self`` of a method jitted with ``static_argnums=0``): it
    can only have been static (an object that is no pytree of arrays does not trace), so jit
    hashes it by identity and reuses the program traced at the first call, with its attribute
    values then, however they change after (jax-ml/jax#9023: run, a reassigned self.fn gave the
    old result; JAX logs nothing, as nothing compiles). "" otherwise."""
    import inspect

    jax = devices.start_jax()
    for i, a in enumerate(args):
        kind = type(a)
        if callable(a) or not hasattr(a, "__dict__") or kind.__hash__ is not object.__hash__ \
                or not jax.tree_util.treedef_is_leaf(jax.tree.structure(a)) \
                or kind.__module__ in ("builtins",) or kind.__module__.split(".")[0] in (
                    "jax", "jaxlib", "numpy"):
            continue
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        name = params[i] if i < len(params) else f"argument {i}"
        label = kind.__name__
        return (f"{name}, a {label} object, is a static argument, and {label} defines no "
                "__hash__, so jit knows it by its identity: the program traced at the first "
                "call, with the values its attributes had then baked in, runs for this object "
                "whatever they become after, without a word (and each new object compiles "
                "again). If an attribute the step reads changes after the first call, pass it "
                "as an argument instead (an array traced; a function static, where a new "
                f"function is a new program), or register {label} as a pytree, its arrays as "
                "children; or give it __hash__ and __eq__ over the fields the step reads, and "
                "never change them in place (jax-ml/jax#9023).")
    return ""


def callback_loop_note(callback: str, at: str, calls: int) -> str:
    """A host callback that jax.vmap made a loop of (:meth:`compiled.CompiledStep.
    callbacks_vmapped`): vmap's rule for io_callback is jax.lax.map, one call per element, one
    after another (OpenSourceEconomics/pylcm#316: an io_callback validation in a function
    vmapped over 64 x 64 state-action pairs; measured by the kit on a CPU, 4,096 calls and 112
    ms a step on jax 0.10.2, 127 ms on 0.8.0; validated once outside the vmap, 1 call and
    0.25 ms, 0.22 ms). The progress fix, a lax.cond around it, raises NotImplementedError
    there ("IO effect not supported in vmap-of-cond", jax 0.8.0 and 0.10.2). A
    jax.pure_callback (vmap_method='sequential') computes a value the step uses, not a check:
    vmap_method='expand_dims' calls it once with the batch as a leading axis (measured by the
    kit on a CPU, a vmap over 32: 32 calls -> 1, jax 0.8.0 and 0.10.2)."""
    where = f" at {at}" if at else ""
    head = (f"The {callback}{where} is under jax.vmap, which makes it a loop: one call to the "
            f"host per element, one after another ({calls:,} calls a run of the step). ")
    if callback == "jax.pure_callback":
        return (f"{head}It computes a value, so let it take the whole batch: give it "
                "vmap_method='expand_dims', which calls it once with the batch as a leading "
                "axis of each batched argument (write the function for that), in place of "
                "'sequential' (measured by the kit on a CPU, a vmap over 32: 32 calls -> 1; "
                "OpenSourceEconomics/pylcm#316: 4,096 calls and 112 ms a step).")
    fix = ("call it once, outside the vmap, on the whole batched array: io_callback(check, None, "
           "jax.vmap(f)(xs)), not io_callback inside f")
    if callback == "io_callback":
        fix += (" (a lax.cond around it does not gate it there: JAX raises NotImplementedError, "
                "IO effect not supported in vmap-of-cond)")
    return (f"{head}To check or log the values, {fix} (OpenSourceEconomics/pylcm#316: 4,096 "
            "calls and 112 ms a step, 1 call and 0.25 ms validated once outside; CPU, jax "
            "0.10.2).")


def callback_broadcast_note(callback: str, at: str, argument: str, shape: tuple[int, ...],
                            nbytes: int) -> str:
    """An argument jax.vmap copied once per element for a jax.pure_callback of
    vmap_method="broadcast_all" (:meth:`compiled.CompiledStep.callbacks_broadcast`): an
    argument the vmap does not map, made whole for every element before the call.
    vmap_method="expand_dims" gives it a leading axis of size 1 instead, which NumPy's
    broadcasting in the function takes alike (measured by the kit on a CPU: a 4 MiB table
    beside 64 elements, 256 MiB of temporaries with "broadcast_all", none with "expand_dims",
    the same values; jax 0.8.0, 0.10.2 and 0.12.0.1)."""
    where = f" at {at}" if at else ""
    return (f"The {callback}{where} has vmap_method='broadcast_all': jax.vmap copies each "
            f"argument it does not map whole for every element before the call, here "
            f"{argument} to {list(shape)} ({format_bytes(nbytes)}). vmap_method='expand_dims' "
            "gives such an argument a leading axis of size 1 instead (the mapped ones keep "
            "the batch), which NumPy's broadcasting against the batch takes alike, one call, "
            "no copies. Computing the batch in chunks (jax.lax.map with batch_size) keeps a "
            "copy per element of each chunk.")


def selected_cond_note(what: str, at: str, cond_at: str, count: int) -> str:
    """A host callback, or a while_loop with a batched predicate, in a branch of a lax.cond
    whose predicate jax.vmap batched (:meth:`compiled.CompiledStep.in_selected_conds`): the
    cond is a select and both branches run on every element. Measured by the kit on a CPU,
    jax 0.8.0 and 0.10.2: jax-ml/jax#19314's jax.debug.print in one branch printed 4 times for
    4 elements under vmap, 2 with jax.lax.map(f, xs) or the predicate passed to the callback;
    jax-ml/jax#2947's while_loop that ends only on its branch's inputs never ends under vmap
    (compiled, not run), and ends with the unbatched values with its operand masked by
    jnp.where or under jax.lax.map."""
    at, cond_at = at.rstrip(","), cond_at.rstrip(",")
    head = (f"The {what}{' at ' + at if at != cond_at else ''} is in a branch of the lax.cond "
            f"at {cond_at} (its predicate batched by jax.vmap): XLA has no batched conditional, "
            "so the cond became a select and both branches run for every element")
    if what == "lax.while_loop":
        return (f"{head}, this loop on the elements the cond sends to the other branch too, and "
                "a batched while_loop runs until every element's condition is false: one that "
                "ends only on its own branch's inputs never ends (jax-ml/jax#2947). Make it end "
                "on any input, its operand masked, jax.lax.while_loop(c, b, jnp.where(pred, x, "
                "x_that_ends)), or run the elements one at a time with jax.lax.map(f, xs), "
                "which keeps the cond.")
    runs = (f"it runs {count:,} times a call, one per element" if count > 1 else
            "it runs on every call")
    return (f"{head}: {runs}, whatever each element's predicate (jax-ml/jax#19314). "
            "jax.lax.map(f, xs) keeps the cond, so only the branch taken calls it; or pass "
            "the predicate to the callback and act where it holds, jax.debug.callback(lambda "
            "ok, v: print(v) if ok else None, pred, v) (4 elements: 4 prints under vmap, 2 "
            "with either).")


def print_note(callback: str, at: str, with_print: int, without: int) -> str:
    """A jax.debug.print (or jax.debug.callback) that changes the program XLA compiles: the
    step compiled again without it (:attr:`compiled.CompiledStep.temp_without_prints`) holds
    far fewer temporaries, as the value printed must be made whole for the host where XLA
    would fuse it away (jax-ml/jax#26370, mattjj: a print changes the computation and can
    change its numbers). Measured by the kit on a CPU with jax 0.10.2: printing a 16 MiB
    intermediate, 16.00 MiB of temporaries against 0 B without the print, and outputs
    that differ by up to 6.1e-5; a print of a slice (h[:2, :4]) or of h.mean() keeps the 16
    MiB, one of the step's output keeps 0 B and the numbers. jax 0.8.0 kept the 16.50 MiB
    either way: no note."""
    return (f"The {callback} at {at} changes the program XLA compiles: the step compiled "
            f"without it holds {format_bytes(without)} of temporaries, with it "
            f"{format_bytes(with_print)} (what it prints is made whole for the host, where XLA "
            "would fuse it away), and its numbers can differ in the last bits. Size and compare "
            "the step without the print, or print the step's output instead: a slice or a "
            "reduction of the same value can keep the cost (jax-ml/jax#26370: 0 B and 16.00 MiB "
            "for a 16 MiB intermediate, outputs 6.1e-5 apart; CPU, jax 0.10.2).")
# --- what a product or a sort makes whole, for a result that keeps little of it ----------------
def _held(c: compiled.CompiledStep, elements: int) -> list[dict]:
    """XLA's values of the step with ``elements`` elements (any dtype: the CPU computes a
    bfloat16 value in float32), largest first."""
    return [v for v in c.values if math.prod(v["shape"]) == elements]


def softmax_inputs(c: compiled.CompiledStep, peak: int
                   ) -> list[tuple[str, tuple[int, ...], str, int, int, str, bool, int]]:
    """(``"attention"`` or ``"logits"``, the product's shape, XLA's dtype for it, its bytes
    there, the size its dot contracts, the line, made under a derivative, how many values of
    its size XLA's plan holds) of each product a softmax, a logsumexp or an argmax reduces
    over its last dimension (:func:`helpers._internal.jaxpr_products.softmax_products`), where XLA's
    plan holds a value of its size and that value is 1 MiB and an eighth of the peak or more.
    Left out: products already made in chunks, logits in a loop's body (a lax.scan over
    chunks of tokens: the fix) and attention scores in one with fewer queries than keys (a
    lax.map over blocks of queries)."""
    out = []
    for kind, shape, _, _, k, line, forward, looped in jaxpr_products.softmax_products(c.jaxpr):
        if looped and (kind == "logits" or len(shape) < 2 or shape[-2] < shape[-1]):
            continue
        held = _held(c, math.prod(shape))
        if held and held[0]["nbytes"] >= 2**20 and 8 * held[0]["nbytes"] >= peak:
            out.append((kind, shape, held[0]["dtype"], held[0]["nbytes"], k, line, forward,
                        len(held)))
    return out


def logits_note(shape: tuple[int, ...], dtype: str, nbytes: int, contracted: int, line: str,
                in_derivative: bool, held: int) -> str:
    """The full logits over a vocabulary, made whole for a loss that keeps one value per token
    (apple/axlearn#1236: 9.6 GB of fp32 logits at 16k tokens and a 153k vocabulary, 313 MB
    computed in a scan over chunks of 512 tokens). Measured by the kit on the CPU, 1,024 tokens,
    256 features, a vocabulary of 8,192, jax.value_and_grad of a logsumexp loss: XLA's
    temporaries 64.01 MiB, 12.13 MiB with a lax.scan over 8 chunks of 128 tokens and
    jax.checkpoint on the body, the same loss and a gradient difference of 0.0 (jax 0.10.2;
    64.02 -> 12.13 MiB on 0.8.0). jax.checkpoint on the whole loss, which preflight.residuals
    suggests for a gradient's largest layer, left them at 64.01 MiB (0.10.2) or raised them to
    96.02 MiB (0.8.0)."""
    at = f", {line}" if line else ""
    rows = math.prod(shape[:-1])
    many = f"; XLA's plan holds {held} values of that many elements" if held > 1 else ""
    body = ("with jax.checkpoint on the body, so that only one chunk's logits and their "
            "gradient are alive at a time" if in_derivative else
            "so that only one chunk's logits are alive at a time")
    return (f"{dtype}{list(shape)} ({format_bytes(nbytes)}{at}) is the full logits over the "
            f"vocabulary, {shape[-1]:,} for each of {rows:,} tokens from {contracted:,} "
            "features, made whole for a loss that keeps one value per token (a logsumexp, a "
            f"softmax or an argmax over them){many}. Compute the loss in a jax.lax.scan over "
            f"chunks of tokens {body}, adding each chunk's loss into the carry "
            "(apple/axlearn#1236: 9.6 GB -> 313 MB; measured by the kit on the CPU, 1,024 "
            "tokens by 8,192: XLA's temporaries 64.01 -> 12.13 MiB in 8 chunks).")


def attention_note(shape: tuple[int, ...], dtype: str, nbytes: int, contracted: int,
                   line: str, in_derivative: bool, held: int) -> str:
    """The attention score matrix, T x S per head, made whole for the softmax over the keys
    (google/flax#2858, asking for FlashAttention; memory-efficient attention works on chunks).
    Measured by the kit on the CPU, jax.grad of causal jax.nn.dot_product_attention, B=2,
    T=S=1,024, 4 heads of 64: XLA's temporaries 130.06 MiB, 20.51 MiB with a lax.map over 8
    blocks of 128 queries under jax.checkpoint (a max gradient difference of 2.5e-5; jax
    0.10.2; 132.03 -> 24.51 MiB on 0.8.0); lax.map(jax.checkpoint(f), batch_size=1) over the
    batch gave 78.00 MiB, jax.checkpoint on the attention 102.06 MiB (0.10.2; 86.02 and 130.03
    MiB on 0.8.0). cuDNN's flash attention is read in JAX's source (jax/_src/nn/functions.py:
    implementation='cudnn'; jax/_src/cudnn/fused_attention_stablehlo.py: fp16, bf16 or fp8 q, k
    and v), not yet run on a GPU."""
    at = f", {line}" if line else ""
    queries = f"{shape[-2]:,} queries x " if len(shape) > 1 else ""
    many = (f" (XLA's plan holds {held} values of that many elements: the softmax's steps"
            + (" and their gradients)" if in_derivative else ")")) if held > 1 else ""
    block = "a jax.checkpoint-ed function" if in_derivative else "a function"
    return (f"{dtype}{list(shape)} ({format_bytes(nbytes)}{at}) is the attention score matrix, "
            f"{queries}{shape[-1]:,} keys per head from {contracted:,} features, made whole "
            f"for the softmax over the keys{many}. Chunk the queries: jax.lax.map, over blocks "
            f"of queries, of {block} that attends one block to all the keys (memory-efficient "
            "attention, "
            "google/flax#2858; measured by the kit on the CPU, jax.grad at 1,024 x 1,024: "
            "XLA's temporaries 130.06 -> 20.51 MiB in 8 blocks); on a GPU, "
            "jax.nn.dot_product_attention(q, k, v, implementation='cudnn') with bfloat16 or "
            "float16 q, k, v runs cuDNN's flash attention, which makes no such matrix (from "
            "JAX's source, jax/_src/cudnn/fused_attention_stablehlo.py, not yet run on a GPU)."
            + (_MASK_ARRAY if _MASK_ARGUMENT.search(line) else ""))


#: a jax.nn.dot_product_attention call given a mask array (google/flax#5093)
_MASK_ARGUMENT = re.compile(r"dot_product_attention\(.*\bmask\s*=\s*(?!None\b)")
#: what a mask array costs there: the array itself, and under cuDNN a dense bias (from JAX's
#: source, jax/_src/cudnn/fused_attention_stablehlo.py's combine_bias_and_mask, 0.10.2; not
#: yet run on a GPU); is_causal builds none (google/flax#5093 added is_causal for it)
_MASK_ARRAY = (" The call passes mask=: where it is a causal mask made as an array "
               "(nn.make_causal_mask, jnp.tril), pass is_causal=True instead. On the XLA path "
               "the two cost the same (JAX builds the causal mask itself), but with "
               "implementation='cudnn' a mask array becomes a dense additive bias of its shape, "
               "where is_causal selects cuDNN's causal kernel and passes no T x T array "
               "(google/flax#5093; from JAX's source, "
               "jax/_src/cudnn/fused_attention_stablehlo.py: combine_bias_and_mask, not yet run "
               "on a GPU).")


def einsum_blowups(c: compiled.CompiledStep, peak: int
                   ) -> list[tuple[str, tuple[int, ...], str, int, int, str, str]]:
    """(the subscripts, the intermediate's shape, XLA's dtype for it, its bytes, the bytes of
    the largest of the einsum's operands and result, its step on opt_einsum's path or "",
    the line) of each ``jnp.einsum`` that makes a value 100 or more times its operands and its
    result (:func:`helpers._internal.jaxpr_products.einsum_intermediates`), where XLA's plan holds a
    value of that size, 1 MiB and a quarter of the peak or more."""
    out = []
    for spec, shape, _, _, ends, shapes, line in jaxpr_products.einsum_intermediates(c.jaxpr):
        held = _held(c, math.prod(shape))
        if held and held[0]["nbytes"] >= 2**20 and 4 * held[0]["nbytes"] >= peak:
            step = jaxpr_products.einsum_step(spec, shapes, math.prod(shape)) if spec else ""
            out.append((spec, shape, held[0]["dtype"], held[0]["nbytes"], ends, step, line))
    return out


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _row_fix(spec: str, step: str) -> str:
    """How to map ``spec`` over one of its output's indices in chunks: the index the large
    step keeps (the output's first where the step is unknown), the operands that carry it, and
    the einsum of one slice; "" where the output has no index or one appears twice in an
    operand (a diagonal)."""
    ins, out = spec.split("->")
    terms, kept = ins.split(","), step.split("->")[-1] if step else out
    letter = next((x for x in out if x in kept), "")
    mapped = [n for n, t in enumerate(terms) if letter and letter in t]
    if not letter or not mapped or any(terms[n].count(letter) > 1 for n in mapped):
        return ""
    rest = [n for n in range(len(terms)) if n not in mapped]
    row = ",".join([terms[n].replace(letter, "") for n in mapped]
                   + [terms[n] for n in rest]) + "->" + out.replace(letter, "")
    which = ", ".join(_ordinal(n + 1) for n in mapped)
    front = ("" if all(terms[n][0] == letter for n in mapped) else
             f", each with {letter} moved to the front (jnp.moveaxis)")
    place = ("" if out[0] == letter else
             f", then jnp.moveaxis(out, 0, {out.index(letter)})")
    return (f"Map over its output index {letter} in chunks: jax.lax.map(lambda r: jnp.einsum("
            f"'{row}', *r, *others), (the {which} operand{'s' if len(mapped) > 1 else ''}, "
            f"which carry {letter}{front}), batch_size=k){place}, the others passed whole")


def einsum_note(spec: str, shape: tuple[int, ...], dtype: str, nbytes: int, ends: int,
                step: str, line: str) -> str:
    """jnp.einsum's pairwise intermediate, far larger than its operands and result
    (jax-ml/jax#24915: ``ij,ik,il,jk,jl,kl->ij`` over six n x n arrays goes through
    ``ilj,jki->iljk``, n**4; jnp.einsum_path says "Largest intermediate"). Measured by the kit
    on the CPU, n=128: XLA's temporaries 1.00 GiB (1,024.06 MiB), 1.50 MiB with a lax.map over
    rows i in chunks of 8, each an einsum 'j,k,l,jk,jl,kl->j' (jax 0.10.2; 1,024.00 -> 2.00 MiB
    on 0.8.0); a run 2321 -> 4.1 ms on the 2-core VM, a relative difference of 5e-6. At n=48
    XLA 0.8.0 fuses the whole einsum into one loop and holds no such value: no note there."""
    at = f" at {line}" if line else ""
    what = f"jnp.einsum('{spec}')" if spec else "jnp.einsum"
    by = (f", its step '{step}' makes it" if step else "")
    fix = _row_fix(spec, step) if spec else ""
    fix = (f"{fix} (jax-ml/jax#24915; measured by the kit on the CPU at n=128: XLA's "
           "temporaries 1.00 GiB -> 1.50 MiB in chunks of 8 rows), or pass optimize= a path "
           "whose largest intermediate fits" if fix else
           "Map over an index of its output in chunks with jax.lax.map(..., batch_size=k), "
           "each chunk an einsum of the operands' slices (jax-ml/jax#24915: 1.00 GiB -> 1.50 "
           "MiB of XLA's temporaries), or pass optimize= a path whose largest intermediate "
           "fits")
    return (f"{what}{at} makes {dtype}{list(shape)} ({format_bytes(nbytes)}), "
            f"{nbytes // max(ends, 1):,}x the largest of its operands and its result: "
            f"jnp.einsum contracts two operands at a time along opt_einsum's path{by}, and "
            "jnp.einsum_path(subscripts, *operands) lists every step. "
            f"{fix}.")


def sorts_to_slice(c: compiled.CompiledStep
                   ) -> list[tuple[tuple[int, ...], str, int, int, str, str, str, str]]:
    """:func:`helpers._internal.jaxpr_products.sliced_sorts` of the step whose sorted array is 1
    MiB or more: a sort of n elements of which the step keeps k at one end."""
    return [s for s in jaxpr_products.sliced_sorts(c.jaxpr) if _mib_or_more(s[0], s[1])]


def sorts_for_cutoffs(c: compiled.CompiledStep
                      ) -> list[tuple[tuple[int, ...], str, int, str, str]]:
    """:func:`helpers._internal.jaxpr_products.cumulative_cutoffs` of the step whose sorted
    array is 1 MiB or more: a whole sort of each row for a top-p cutoff."""
    return [s for s in jaxpr_products.cumulative_cutoffs(c.jaxpr) if _mib_or_more(s[0], s[1])]


def _mib_or_more(shape: tuple[int, ...], dtype: str) -> bool:
    """A sorted array of 1 MiB or more: a sort worth a note."""
    return math.prod(shape) * devices.start_jax().numpy.dtype(dtype).itemsize >= 2**20


def cumulative_cutoff_note(shape: tuple[int, ...], dtype: str, n: int, line: str,
                           cumulative_line: str) -> str:
    """A whole sort of each row for a cutoff by cumulative mass (top-p, nucleus sampling): the
    sort is most of such a sampler's time, where the k largest found first give the same
    nucleus wherever it lies within them (keras-team/keras-hub#963, fixed by PR #980;
    a new user's trial, batch 8 over a vocabulary of 50,304 on the 2-core VM, jax 0.10.2:
    130-153 ms a step for the whole sort, 1.2 ms with jax.lax.top_k(logits, 64) first)."""
    at = f" at {line}" if line else ""
    by = f" at {cumulative_line}" if cumulative_line and cumulative_line != line else ""
    rows = math.prod(shape[:-1])
    which = f"each of {rows:,} rows" if rows > 1 else "its row"
    return (f"The step sorts all {n:,} values of {which}"
            f"{at} ({dtype}{list(shape)}) for a cutoff by cumulative mass{by} (top-p, nucleus "
            "sampling): a whole sort each step, most of such a sampler's time. Take the k "
            "largest first, jax.lax.top_k(probs, k) of the probabilities over the whole "
            "vocabulary, with k of a few dozen to a few hundred, and the cumulative cutoff over "
            "those k: the same nucleus wherever it lies within the k (keras-team/keras-hub#963; "
            "its fix renormalised over the k, which keeps a few tokens fewer).")


def _lines_at(lines: Iterable[str], most: int = 2) -> str:
    """ " (a.py:3: ...; a.py:4: ...)": the first ``most`` of the user's lines, each once, in
    brackets; "" where none is known."""
    found = list(dict.fromkeys(line for line in lines if line))
    return f" ({'; '.join(found[:most])})" if found else ""


def repeated_operand_note(repeats: Sequence[tuple[tuple[int, ...], str, int, int, int, str]]
                          ) -> str:
    """Values jnp.repeat made only for a product to read
    (:func:`helpers._internal.jaxpr_products.repeated_operands`): grouped-query attention's K
    and V repeated up to the query heads, where jax.nn.dot_product_attention takes them with
    fewer heads (NovaSky-AI/SkyRL#514's fix; a new user's trial, B=2, a 2,048-token cache, 32
    query heads over 4: 72.5 MiB at the peak with the repeats, 16.5 MiB without, the same
    output; a smaller batch, the generic advice, still did not fit a 48 MiB budget)."""
    from helpers.units import format_bytes

    shape, dtype, _, g, axis, line = repeats[0]
    total = sum(r[2] for r in repeats)
    at = _lines_at(r[5] for r in repeats)
    each = (f"{len(repeats)} values" if len(repeats) > 1 else "a value") + \
        f" repeated {g} times along axis {axis}"
    return (f"The step makes {each}{at}, {format_bytes(total)} in all (the largest "
            f"{dtype}{list(shape)}), only for a product to read: a copy {g} times the size of "
            "what it repeats. Where these are grouped-query attention's K and V repeated up to "
            "the query heads, pass them unrepeated: jax.nn.dot_product_attention(q, k, v) takes "
            "K and V with fewer heads than Q, a divisor of them (NovaSky-AI/SkyRL#514); in an "
            "einsum, reshape q to [..., kv_heads, group, head_dim] and contract it with the "
            "unrepeated k, jnp.einsum('btkgd,bskd->bkgts', q, k). A smaller batch only shrinks "
            "the copy with everything else.")


def diagonal_matrix_note(found: Sequence[tuple[tuple[int, ...], str, int, str, bool]]) -> str:
    """jnp.diag of a vector made into an n x n matrix only for a product to read
    (:func:`helpers._internal.jaxpr_products.diagonal_matrices`): blackjax-devs/blackjax#1007,
    Pathfinder's L-BFGS (fixed by PR #1008 with elementwise products and vectors multiplied
    first). A new user's trial at N = 4,096 under vmap: 3,090 MiB of temporaries; lax.map over
    the batch, the kit's advice then, 278 MiB at batch_size=1; the PR's rewrite 54 MiB."""
    from helpers.units import format_bytes

    shape, dtype = found[0][0], found[0][1]
    total = sum(f[2] for f in found)
    rows = any(not f[4] for f in found)
    vector = any(f[4] for f in found)
    at = _lines_at(f[3] for f in found)
    n = shape[-1]
    many = f"{len(found)} diagonal matrices" if len(found) > 1 else "a diagonal matrix"
    return (f"The step makes {many} with jnp.diag of a vector{at}, {format_bytes(total)} in all "
            f"(the largest {dtype}{list(shape)}: {n:,} x {n:,}, all but {n:,} of them zeros), "
            "only for a product to read. "
            + ("jnp.diag(v) @ M scales M's rows: v[:, None] * M gives the same without the "
               "matrix (M @ jnp.diag(v) is M * v). " if rows else "")
            + ("jnp.diag(v) @ g of a vector g is v * g. " if vector else "")
            + "In a chain of products, multiply the vector first, B @ (G @ (B.T @ g)), and no "
            "n x n value is made (blackjax-devs/blackjax#1007)."
            + (" The batch is not the cause: chunks of it still make each matrix."
               if len(shape) > 2 else ""))


def scan_draws_note(draws: Sequence[tuple[tuple[int, ...], str, int, str, str]]) -> str:
    """Random values drawn whole and read by a lax.scan one row per step
    (:func:`helpers._internal.jaxpr_loops.drawn_before_scans`): every step's draws held at
    once, growing with the scan's length (QuantEcon/lecture-python.myst#329, a Kesten process:
    three (T, M) matrices of shocks; the maintainers drew them inside the loop. A new user's
    trial at T=500, M=1,000,000: a peak of 14.91 GiB, 45.78 MiB with a key per step, compiled
    for the CPU only)."""
    from helpers.units import format_bytes

    shape, dtype, _, line, scan = draws[0]
    total = sum(d[2] for d in draws)
    at = _lines_at((d[3] for d in draws), most=3)
    what = f"{len(draws)} arrays" if len(draws) > 1 else "an array"
    loop = f" at {scan}" if scan else ""
    return (f"The step draws {what} of random values whole{at}, {format_bytes(total)} in all "
            f"(the largest {dtype}{list(shape)}), before the lax.scan{loop} that reads them "
            f"one row per step: all {shape[0]:,} steps' draws are held at once and grow with "
            "the scan's length. Draw each step's values inside the body instead, from a key "
            "per step, jax.random.fold_in(key, t) with the step t scanned over jnp.arange(T) "
            "(or a key split in the carry): one row at a time "
            "(QuantEcon/lecture-python.myst#329). The values differ from the whole draw's, "
            "with the same distribution.")


def sliced_sort_note(shape: tuple[int, ...], dtype: str, n: int, k: int, end: str, kept: str,
                     function: str, line: str) -> str:
    """A sort of n elements of which the step keeps k, 8k <= n, at one end: jnp.argsort(x)[:k] or
    jnp.sort(x)[-k:] (the NumPy habit; openxla/xla#25487 asks why top-k sorts it all). jax.lax.top_k
    finds the k without the full sort, ties first by lower index: at the smallest end that is a
    stable sort's order, at the largest end a slice of the sorted result keeps the highest indices
    among equal values and top_k the lowest (jnp.ones(10): argsort(x)[-3:] gives [7 8 9], top_k(x,
    3)[1] gives [0 1 2]). Integers are flipped with ~x, not -x, which wraps for unsigned ints
    (uint32: -top_k(-u, 10)[0] gives 1..10, jnp.sort(u)[:10] 0..9). Measured by the kit on the CPU,
    4,194,304 float32, k=100: XLA's temporaries 32.00 MiB for jnp.argsort(x)[:k], 16.00 MiB for
    jax.lax.top_k(-x, k) (the negation); 1795 ms -> 16 ms (jax 0.10.2), 1420 -> 41 ms (0.8.0), the
    same indices. On a GPU XLA's own top-k kernel takes k <= 16 (n >= 1,024; newer XLA takes larger
    k through RAFT), and a larger k becomes a sort and a slice all the same: read in XLA's source,
    xla/service/gpu/transforms/ topk_specializer.cc and the TopkDecomposer it falls back on, not yet
    run on a GPU."""
    at = f" at {line}" if line else ""
    call = {"argsort": "jnp.argsort", "sort": "jnp.sort"}.get(function, "jax.lax.sort")
    small = end == "smallest"
    # -x wraps around for unsigned ints and for the signed minimum; ~x reverses their order
    # without wrapping (uint32 jnp.sort(u)[:10] gives 0..9, -top_k(-u, 10)[0] gives 1..10).
    flip = "~" if devices.start_jax().numpy.dtype(dtype).kind in "biu" else "-"
    arg = f"{flip}x" if small else "x"
    got = {"indices": f"jax.lax.top_k({arg}, {k})[1]",
           "values": f"{flip if small else ''}jax.lax.top_k({arg}, {k})[0]",
           "indices and values": f"jax.lax.top_k({arg}, {k})"}[kept]
    order = ("in the same order" if small else
             "largest first (reverse it for the sort's ascending order)")
    ties = not small and kept != "values"
    same = f"the same {kept}{' where the values differ' if ties else ''}"
    if ties:
        order += ("; among equal values top_k takes the lowest indices and the sort's slice "
                  "the highest")
    axis = ("" if len(shape) < 2 or n == shape[-1] else
            " (top_k works on the last axis: move the sorted one there with jnp.moveaxis)")
    what = (f"all {n:,} elements of {dtype}{list(shape)}" if len(shape) == 1 else
            f"{dtype}{list(shape)} along an axis of {n:,}")
    keeps = {"indices": f"the indices of the {end} {k:,}", "values": f"the {end} {k:,}",
             "indices and values": f"the {end} {k:,} and their indices"}[kept]
    return (f"{call}{at} sorts {what}, and the step keeps only {keeps} (a slice of the sorted "
            f"result). {got} gives {same}, {order}, without sorting the rest{axis} "
            "(measured by the kit on the "
            "CPU, 4,194,304 float32, k=100: XLA's temporaries 32.00 -> 16.00 MiB, 1795 -> 16 "
            "ms; openxla/xla#25487); on a GPU XLA's own top-k kernel takes only a small k and "
            "sorts for a larger one (from XLA's source, xla/service/gpu/transforms/"
            "topk_specializer.cc, not yet run on a GPU).")
