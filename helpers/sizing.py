"""The largest batch that fits a memory budget, from a few compiles and no run.

A step's memory grows with its batch about linearly once the batch is large: parameters and
optimizer state stay, activations, gradients of the inputs and temporaries scale. So
:func:`largest_batch` prices the step (:func:`helpers.preflight.needed_bytes`, one compile
each, shapes only: nothing is allocated or run) at two large batches, fits a line, and checks the
line's answer with a third compile. Where the line is off there (memory is not linear in the
batch in that range: a small batch, XLA changing its plan), it narrows down with more compiles,
secant steps and then halving, until it has compiled the answer and the next batch. The record
says how many compiles it took, how long, and whether the next batch's need was compiled or read
off the line.

It assumes a need that grows with the batch. On a GPU it need not: on the H100 the MLP step at
batch 129 needed more than twice its need at 128 (2026-11-26 record; why is not yet known). There
the answer is a batch that fits, not surely the largest that fits (``verify=True`` compiles the
next batch too). A batch far beyond the card may not even compile there (XLA's autotuner runs its
candidates at the step's sizes and runs out of memory): such a batch counts as over the budget,
and the search steps down from it.

>>> import jax
>>> def step(w, x):
...     return w - 0.01 * (x @ w).sum()
>>> w = jax.ShapeDtypeStruct((256, 256), "float32")
>>> found = largest_batch(step, lambda b: (w, jax.ShapeDtypeStruct((b, 256), "float32")),
...                       "8 MiB", granularity=8)
>>> found.batch % 8 == 0 and found.needed_bytes <= found.budget_bytes < found.next_needed_bytes
True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from helpers import compiled, preflight
from helpers._internal.records import Display
from helpers.errors import BadInputError, CompileOutOfMemory
from helpers.units import NOT_AVAILABLE, NotAvailable, parse_size

if TYPE_CHECKING:
    import jax

__all__ = ["BatchSize", "largest_batch"]


@dataclass(frozen=True)
class BatchSize(Display):
    """The largest batch (a multiple of ``granularity``) whose step fits ``budget_bytes``: its
    need, the next batch's need (compiled, or read off the fitted line: ``next_compiled``), the
    line (bytes per example and fixed bytes), and what finding it cost."""

    function: str
    batch: int  # 0: even the smallest batch does not fit
    granularity: int
    budget_bytes: int
    needed_bytes: int  # at ``batch`` (compiled)
    #: at ``batch + granularity``; NOT_AVAILABLE when ``batch`` is the largest allowed (the
    #: batch above it is never asked of ``make_args``)
    next_needed_bytes: int | NotAvailable
    next_compiled: bool  # False: read off the line, which the last compile agreed with
    bytes_per_example: float
    fixed_bytes: float
    #: batches priced; a search again in multiples of a padding prices some batches a second
    #: time, which JAX's cache answers without compiling
    compiles: int
    seconds: float
    method: str
    #: where XLA's plan near an answer held the batch padded up to a multiple (on a GPU, from
    #: XLA's source, split-K pads a matmul's contracting dimension: the batch, in a weight
    #: gradient): the largest such multiple seen, and the first search's answer; ``batch`` is
    #: then the largest answer of the searches in multiples of it (1 and 0: no padding seen)
    padded_to: int = 1
    unaligned_batch: int = 0


def _unplaced_bytes(args: Sequence) -> int:
    """The bytes of the arguments that are not JAX arrays (shapes, NumPy arrays): a step needs
    at least these on its device (an array already there is resident, and not counted). A
    shape split over devices is priced per device."""
    import jax

    def itemsize(dtype) -> int:  # at the size XLA takes it: float64 is float32 unless x64;
        # a typed PRNG key (key<fry>, 8 bytes) is no NumPy dtype to canonicalize (a trial)
        return dtype.itemsize if jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else \
            jax.dtypes.canonicalize_dtype(dtype).itemsize

    return sum(compiled.elements_per_device(leaf) * itemsize(leaf.dtype)
               for leaf in jax.tree.leaves(args)
               if not isinstance(leaf, jax.Array) and hasattr(leaf, "shape")
               and hasattr(leaf, "dtype"))


def largest_batch(fn: Callable, make_args: Callable[[int], Sequence], budget: int | str, *,
                  granularity: int = 1, max_batch: int = 1 << 24, verify: bool = False,
                  device: str | jax.Device | None = None,
                  donate_argnums: int | Sequence[int] = (),
                  tolerance: float = 0.001) -> BatchSize:
    """The largest batch for which ``fn(*make_args(batch))`` needs at most ``budget`` (bytes, or
    a size such as "40 GiB": what :func:`helpers.preflight.preflight_step` calls the step's
    ``needed_bytes``, priced by :func:`helpers.preflight.needed_bytes`) on ``device``.

    ``make_args(batch)`` returns the step's arguments for that batch: ``jax.ShapeDtypeStruct``
    shapes (nothing is allocated) or arrays. ``granularity``: the answer is a multiple of it.
    ``verify=True`` also compiles the next batch, so the boundary is compiled on both sides
    (where that batch fits too, the need is not monotonic there, and ``method`` says so).
    A need padded to a multiple of the batch (8 rows on a TPU) is a staircase, which no line
    through compiles follows: give that multiple as ``granularity``, or ``verify=True``.
    ``tolerance``: how far (a share of the budget) the line may be from a compiled need at the
    answer before more compiles are spent; never more than a 64th of one batch step's bytes
    (at least 1 KiB), so a line through a bend is not taken for the need.

    The first compile is at ``max_batch``, or lower where the arguments that are not on the
    device yet (shapes, NumPy) would alone pass the budget: at the smallest halving of
    ``max_batch`` where they still do. A batch XLA cannot compile on the device
    (:class:`helpers.errors.CompileOutOfMemory`) counts as over the budget: the search tries an
    eighth of it, and never reports a need for it (``next_needed_bytes`` is NOT_AVAILABLE when
    the answer's next batch is one). Raises CompileOutOfMemory when not even ``granularity``
    compiles.

    Where XLA's plan at the answer (or at the batch above, where compiled) holds a copy of the
    batch padded up to a multiple of 8 or more (seen on an H100, 2026-11-27: at 61,077 fusions
    of f32[61088, 2048] and f32[61080, 2048]; from XLA's source, not yet confirmed on a GPU, its
    split-K rewrite pads a matmul's contracting dimension, the batch in a weight gradient), a
    batch that is a multiple of it needs no such copy and can fit where a smaller batch did
    not: the search runs again in multiples of it, and again while the new answer's plan shows
    a larger multiple; the largest answer is returned (``padded_to``; the first kept as
    ``unaligned_batch``). Not yet run on a GPU."""
    search = functools.partial(_search, fn, make_args, budget, max_batch=max_batch,
                               verify=verify, device=device, donate_argnums=donate_argnums,
                               tolerance=tolerance)
    first = search(granularity=granularity)
    best = current = first
    padded, compiles, seconds = [], first.compiles, first.seconds
    # each search in multiples of the padding its predecessor's plan showed: a padded size fits
    # several multiples (61,077 rounded up to 16 or to 32 is 61,088), and the smallest is taken,
    # so the next answer's plan may show a larger one; the step grows each time, or it stops
    while current.batch and current.batch + current.granularity <= max_batch:
        t = time.perf_counter()
        pad, where = max(_padding(fn, make_args(b), b, device, donate_argnums)
                         for b in (current.batch, current.batch + current.granularity)[
                             :1 + current.next_compiled])
        seconds += time.perf_counter() - t
        step = math.lcm(current.granularity, pad)
        if step == current.granularity or step > max_batch:  # no padding, or none to avoid
            break
        padded.append((current.batch, pad, where, step))
        try:
            current = search(granularity=step)
        except (CompileOutOfMemory, BadInputError):  # the answers so far stand
            break
        compiles, seconds = compiles + current.compiles, seconds + current.seconds
        best = current if current.batch >= best.batch else best  # a tie: the coarser search
    if not padded:
        return first
    seen = "; ".join(f"XLA's plan near batch {b:,} holds the batch padded up to a multiple of "
                     f"{m} ({where})" for b, m, where, _ in padded)
    steps = ", ".join(str(step) for *_, step in padded)
    outcome = (f"so the search ran again in multiples of {steps}, where no such copy is needed: "
               f"{best.batch:,} (a multiple of {best.granularity}) fits, more than the first "
               f"answer {first.batch:,}" if best.batch > first.batch else
               f"and searched again in multiples of {steps}, no larger batch fits")
    return dataclasses.replace(best, compiles=compiles, seconds=seconds,
                               method=f"{best.method}; {seen}, {outcome}",
                               padded_to=max(m for _, m, _, _ in padded),
                               unaligned_batch=first.batch)


def _padding(fn: Callable, args: Sequence, batch: int, device, donate_argnums) -> tuple[int, str]:
    """The multiple (8 to 1024) that a value in XLA's plan for ``batch`` rounds the batch up to,
    and that value ("fusion f32[61088, 2048]"); (1, "") where none does. A value counts as a
    padded copy only where the plan or the arguments also hold a value of its shape with the
    batch in that place (f32[61077, 2048] beside f32[61088, 2048]), and where the size is none
    of the arguments' own: a model's width a little above the batch (2,048 at batch 1,025, in
    f32[2048, 256] beside the labels' f32[1025, 256]) is not taken for one. Of the multiples a
    padded size fits (61,077 rounded up to 16 or to 32 is 61,088) the smallest, so a search in
    multiples of it loses least (the next search's answer shows a larger one, where there is
    one); of several values, the largest such multiple. The step was compiled at ``batch`` by the
    search, so this compile is JAX's cached one. Arguments split over devices are priced per
    device, whose shapes this does not read: no padding is seen there."""
    import jax

    c = compiled.compile_step(fn, *args, device=device, donate_argnums=donate_argnums)
    given = [tuple(leaf.shape) for leaf in jax.tree.leaves(args) if hasattr(leaf, "shape")]
    shapes = {tuple(v["shape"]) for v in c.values} | set(given)
    widths = {d for shape in given for d in shape}  # a model's sizes, in its arguments
    best, where = 1, ""
    for v in c.values:
        shape = tuple(v["shape"])
        for axis, d in enumerate(shape):
            if not batch < d < batch + 1024 or d in widths or (
                    *shape[:axis], batch, *shape[axis + 1:]) not in shapes:
                continue
            m = next((m for m in (2**k for k in range(3, 11)) if -(-batch // m) * m == d), 1)
            if m > best:
                best, where = m, f"{v['op'].rsplit('/', 1)[-1]} {v['dtype']}{list(shape)}"
    return best, where


def _search(fn: Callable, make_args: Callable[[int], Sequence], budget: int | str, *,
            granularity: int = 1, max_batch: int = 1 << 24, verify: bool = False,
            device: str | jax.Device | None = None, donate_argnums: int | Sequence[int] = (),
            tolerance: float = 0.001) -> BatchSize:
    """One search at one granularity: :func:`largest_batch` without the second search in
    multiples of a padding XLA added."""
    if not callable(make_args):
        raise BadInputError("make_args must be a function of the batch size that returns the "
                            "step's arguments")
    if not isinstance(granularity, int) or isinstance(granularity, bool) or granularity < 1:
        raise BadInputError(f"granularity must be a positive int, got {granularity!r}")
    if not isinstance(max_batch, int) or max_batch < granularity:
        raise BadInputError(f"max_batch must be an int >= granularity, got {max_batch!r}")
    budget_bytes = parse_size(budget) if isinstance(budget, str) else budget
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes <= 0:
        raise BadInputError(f"budget must be a positive number of bytes or a size, got {budget!r}")
    g, top = granularity, max_batch // granularity * granularity
    known: dict[int, int] = {}
    uncompiled: set[int] = set()  # batches too large for XLA to compile on the device
    name = getattr(fn, "__name__", type(fn).__name__)
    t0 = time.perf_counter()

    last: list = [None, ()]  # the batch whose arguments were made last, and them, until compiled

    def args_of(batch: int) -> Sequence:
        if last[0] != batch:
            args = make_args(batch)
            if not isinstance(args, (tuple, list)):
                raise BadInputError(f"make_args({batch}) must return a tuple of the step's "
                                    f"arguments, got {type(args).__name__}")
            last[:] = [batch, args]
        return last[1]

    def need(batch: int) -> int:
        if batch not in known:
            known[batch] = preflight.needed_bytes(
                fn, *args_of(batch), device=device, donate_argnums=donate_argnums)
            last[:] = [None, ()]
        return known[batch]

    def compiles(batch: int) -> bool:  # False: XLA ran out of the device's memory compiling it
        if batch in uncompiled:  # once is enough (on a GPU each try is the autotuner failing)
            return False
        try:
            need(batch)
        except CompileOutOfMemory:
            uncompiled.add(batch)
            return False
        return True

    def line(a: int, b: int) -> tuple[float, float]:
        slope = (known[b] - known[a]) / (b - a)
        return slope, known[b] - slope * b

    def done(batch: int, slope: float, fixed: float, method: str) -> BatchSize:
        nxt = batch + g
        if batch == top:  # nothing above the largest batch allowed is asked for
            return BatchSize(name, batch, g, budget_bytes, known[batch], NOT_AVAILABLE, False,
                             slope, fixed, len(known), time.perf_counter() - t0, method)
        compiled = nxt in known or ((verify or slope <= 0) and compiles(nxt))
        after = (known[nxt] if compiled else NOT_AVAILABLE if nxt in uncompiled
                 else int(round(known[batch] + slope * g)))
        if compiled and batch and known[nxt] <= budget_bytes:  # a need that is not monotonic
            method += ("; but the next batch fits too: the need is not monotonic in the batch "
                       "here (as on a GPU, where XLA picks kernels per shape), so this is a batch "
                       "that fits, not surely the largest")
        return BatchSize(name, batch, g, budget_bytes, known.get(batch, 0), after, compiled,
                         slope, fixed, len(known), time.perf_counter() - t0, method)

    # first the largest batch allowed: if it fits, that is the answer. Where the arguments
    # that are not on the device yet (shapes, NumPy) would alone be over the budget, the step
    # needs more than the budget too: then the smallest halving of it still that large, which
    # keeps the compile near the answer (on a GPU a compile many times the card's memory takes
    # seconds, or runs out of memory in XLA's autotuner)
    first = top
    while first > g and _unplaced_bytes(args_of(first)) > budget_bytes and _unplaced_bytes(
            args_of(half := max(g, first // 2 // g * g))) > budget_bytes:
        first = half
    while not compiles(first):  # too large to compile here: an eighth, until one compiles
        if first == g:
            raise CompileOutOfMemory(f"XLA ran out of the device's memory compiling {name} even "
                                     f"at batch {g}: the step does not fit at any batch")
        first = max(g, first // 8 // g * g)
    if known[first] <= budget_bytes and first < top:
        # it fits, yet a larger batch did not compile, or the arguments' bound did not hold (jit
        # drops an argument the step never uses): halve towards the smallest batch above it not
        # known to fit, until one compiles over the budget (a bracket for the lines below)
        hi = min([b for b in uncompiled if b > first] or [top])
        while hi - first > g and hi not in known:  # doubling, then halving the gap
            mid = min(2 * first, (first + hi) // 2 // g * g)
            if compiles(mid) and known[mid] <= budget_bytes:
                first = mid
            else:
                hi = mid
        if hi not in known and not (hi == top and compiles(top)):
            return done(first, 0.0, float(known[first]), "halving between compiles: the batch "
                        "above it is too large for XLA to compile on this device")
        if known[hi] <= budget_bytes:  # the largest batch allowed, compiled just now, fits
            first = top
    if first == top and known[top] <= budget_bytes or top == g:
        fits = known[top] <= budget_bytes
        return done(top if fits else 0, 0.0, float(known[top]),
                    "the largest batch allowed fits" if fits else "one batch size allowed")
    if known[first] > budget_bytes and first > g:  # (at g: the loop says nothing fits)
        # then where a need proportional to the batch would meet the budget: near the answer, so
        # the lines below are drawn through compiles close to it (a step's need is linear in
        # the batch only piecewise: XLA changes its plan as the batch grows)
        need(min(max(int(budget_bytes / known[first] * first) // g * g, g), first - g))
    width = float("inf")  # the bracket's width before the last step (a halving rule)
    for _ in range(64):
        fits = sorted(b for b, n in known.items() if n <= budget_bytes)
        over = sorted(b for b, n in known.items() if n > budget_bytes)
        slope = fixed = 0.0  # a halving draws no line
        if not fits:  # everything compiled is over the budget: go down
            if g in known:
                if known[g] == known[over[-1]] and over[-1] >= 1024 * g:  # flat, a wide range
                    raise BadInputError(f"{name}'s memory does not grow with the batch between "
                                        f"{g} and {over[-1]}: is the batch in make_args' "
                                        "shapes?")
                return done(0, 0.0, float(known[g]), "even the smallest batch does not fit")
            a = min(over + sorted(uncompiled))
            if a == g:
                raise CompileOutOfMemory(f"XLA ran out of the device's memory compiling {name} "
                                         f"at batch {g}, and every batch it compiled was over "
                                         "the budget: the step does not fit at any batch")
            if a in uncompiled or len(over) < 2:  # no line below it: halve towards g
                guess = max(g, a // 2 // g * g)
            else:
                slope, fixed = line(a, over[1])
                if slope <= 0:  # a flat step (the batch padded to a multiple): halve towards g
                    guess = max(g, a // 2 // g * g)
                else:
                    guess = max(g, min(int((budget_bytes - fixed) // slope) // g * g, a - g))
        else:  # a bracket: the largest batch that fits, the smallest above it that does not
            lo = fits[-1]
            # (a batch XLA could not compile counts as over: on a GPU, its autotuner can run
            # out of memory at a batch below one that compiled)
            hi = min(x for x in over + sorted(uncompiled) if x > lo)
            if hi in uncompiled:
                if hi - lo <= g:
                    return done(lo, 0.0, float(known[lo]), "halving between compiles: the batch "
                                "above it is too large for XLA to compile on this device")
                compiles(max(lo + g, (lo + hi) // 2 // g * g))
                continue
            if hi - lo <= g:
                slope, fixed = line(lo, hi)
                return done(lo, slope, fixed, "a line, then narrowed by compiles (the need is "
                                              "not linear in the batch over this range)")
            # the line through lo and whichever compile nearest the budget goes with it: the
            # next fit down (local, when the bracket's top is far) or the bracket's top
            others = [hi] + ([fits[-2]] if len(fits) > 1 else [])
            a, b = sorted((lo, min(others, key=lambda x: abs(known[x] - budget_bytes))))
            slope, fixed = line(a, b)
            guess = int((budget_bytes - fixed) // slope) // g * g if slope > 0 else lo + g
            # a secant that did not halve a real bracket is followed by a halving (the
            # largest batch allowed as its top is no bracket yet: no halving towards it)
            halve = guess >= hi or guess in known or guess in uncompiled or (
                hi != top and hi - lo > width / 2)
            width = hi - lo
            if guess <= lo:  # the line says lo is the answer: compile the batch above it
                guess = lo + g
            elif halve:
                guess = max(lo + g, (lo + hi) // 2 // g * g)
        if not compiles(guess):  # over the budget, with no need to draw a line through
            continue
        # accepted where the compile lies on the line (to a 64th of an example's bytes: a line
        # through a bend or a step misses by more) and the line, from that compile, puts the
        # next batch over the budget by more than that
        tol = min(tolerance * budget_bytes, max(1024.0, slope * g / 64))
        on_line = slope > 0 and abs(known[guess] - (fixed + slope * guess)) <= tol
        if known[guess] <= budget_bytes and on_line and \
                known[guess] + slope * g > budget_bytes + tol:
            return done(guess, slope, fixed, "a line through two compiles, checked by a third"
                        if len(known) == 3 else "a line through the two compiles nearest the "
                        "answer, checked by another (the need is not linear in the batch over "
                        "the whole range)")
    raise BadInputError(f"no answer for {name} in 64 compiles: its need does not grow "
                        "steadily with the batch")  # pragma: no cover
