"""What a block of code compiled, how often, and why it compiled again.

A jitted function compiles once per new *signature*: the shapes, dtypes and shardings of its
array arguments, the values of its static arguments, the structure of its pytrees, the settings
around the call, and the function object itself. A loop that changes any of them compiles again
every time. Each compile costs seconds, and each compiled program stays in JAX's caches, in host
memory: a "memory leak in a simple loop" that grows with every new shape.

JAX explains each miss of its tracing cache when ``jax_explain_cache_misses`` is on (it logs
"TRACING CACHE MISS ... because ..."), and reports each XLA compile to :mod:`jax.monitoring`.
:func:`watch` turns both on for a block, keeps JAX's explanations verbatim, pairs each compile
with the explanation that led to it, and sums them up per function: how many compiles, what
changed between them, the line that called it, and the fix, in a sentence (the fix and what
changed: :mod:`helpers.compile_causes`).

>>> import jax, numpy as np
>>> f = jax.jit(lambda x: x * 2)
>>> with watch() as log:
...     for n in (3, 4, 5):
...         _ = f(np.zeros(n, np.float32))
>>> log.function("<lambda>").compiles, log.function("<lambda>").cause
(3, 'new shapes')

A function that compiled in the block and compiles again with no cache miss, for argument types
it compiled for before but other shardings (JAX's own "Compiling ... Argument mapping" line,
which it logs at DEBUG), had its arguments placed differently: committed to a device or not,
another device or sharding ("new placement").
What JAX does not explain is counted, not guessed at: a jnp call outside jit compiles a
one-operation program per new shape ("eager operations"), and a pmap, a function from a
library's files (a jax.jit of JAX's own function too, as jit(top_k): not an eager operation), a
call on another thread, a jax.grad or jax.vmap of a jitted function, or a function compiled
before the block compiles without a word from JAX ("compiles JAX did not explain").

Before XLA compiles, JAX traces the Python function to a jaxpr and lowers it; both report their
seconds to :mod:`jax.monitoring` too, and the log keeps them beside XLA's. Where the jaxpr JAX
lowered has many times the instructions XLA kept of it, the program was built far larger than
what it computes (nested ``jax.jvp``, jax-ml/jax#520), and the log says so: a rule on sizes, so
that a loaded machine, which slows tracing, cannot make it fire.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import jax

from helpers._internal import (
    frames,
    jaxcompat,
    jaxpr_loops,
    own,
)
from helpers._internal.records import Display, Record
from helpers.compile_causes import (
    AHEAD_SHARDING_FIX,
    AHEAD_TYPED_FIX,
    AHEAD_WEAK_FIX,
    BUCKETED_FIX,
    CAUSES,
    CLEARED_NEW_SHAPES,
    FIXES,
    WEAK_FIX,
    CacheMiss,
    fix_for,
    weak_now,
    what_changed,
)
from helpers.errors import BadInputError, InUseError
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes

__all__ = ["CompileLog", "FunctionCompiles", "watch"]

EAGER = "eager operations"
UNEXPLAINED = "compiles JAX did not explain"
#: compiling this many seconds, this share of a block's time, with nothing compiled twice and
#: no persistent cache: a new process pays it again (a diagnosis; no test times it)
HEAVY_COMPILE_SECONDS = 1.0
#: a program of this many arguments or more, compiled for an operation outside jit: jnp.stack
#: of a Python list of that many arrays, each one an operand (jax 0.10.2 and 0.12.0.1; 0.8.0 and
#: jnp.array join them in pieces of a few concatenates), whose compile time grows with their
#: number (markean/aimz#268 in a new user's miniature: 5,000 per-step loss scalars, 6.0 s to
#: compile; 2,000: 1.8 s, jax 0.10.2 CPU)
MANY_OPERANDS = 1000
HEAVY_COMPILE_SHARE = 0.5

#: jax.monitoring's events for tracing a function to a jaxpr and for lowering the jaxpr to MLIR,
#: before XLA compiles it; recorded on every backend, the CPU's too, with the function's name
#: (fun_name: "f" for a trace, "jit(f)" for a lowering; jax 0.8.0 and 0.10.2 alike). 0.8.0 also
#: reports each jnp function traced inside a trace, nested in the outer one's seconds
_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
#: a jaxpr lowered with this many equations or more (nested ones included), and this many or
#: more per instruction XLA kept of it: a program JAX built far larger than what XLA kept
#: (nested jvp, jax 0.8.0 and 0.10.2 alike: order 7 lowers 2,182 equations and XLA keeps 79, 28
#: each; order 8: 4,807 and 91, 53 each; order 5: 436 and 58; a small step: 6 equations; an
#: unrolled loop: about as many as XLA keeps). Sizes, not seconds: on a loaded machine a step of
#: 19 instructions took 0.11 s to trace and lower, 2.2 times its compile, the ratio of nested
#: jvp at order 7 (0.8.0: 0.42 s against 0.19 s)
LARGE_TRACE_EQUATIONS = 1000
EQUATIONS_PER_INSTRUCTION = 10
#: a jaxpr with this many equations or more from one line of the user's code, one of them made
#: again and again there (``jaxpr_loops.LOOP_REPEATS`` times or more), was a Python loop unrolled
#: while it was traced (as :data:`helpers.compiled.UNROLLED_AT` for a step's operations): XLA
#: compiles each copy of its body (jax-ml/jax#352: an RNN of 300 steps written as a Python
#: loop, 21.5 s to its first result, 19.8 s of it XLA compiling; 1.0 s with lax.scan; measured
#: by the kit on jax 0.10.2, CPU)
UNROLLED_EQUATIONS = 64
#: the seconds of XLA compiling a function's compiles take, this many or more, before
#: compiles.watch names its unrolled loop: a loop that compiles fast costs nothing worth a
#: rewrite (a 21-layer MLP's loop compiled in 1.44 s, a vmapped print's 32 callbacks in 0.24 s;
#: jax-ml/jax#352's RNN of 300 steps in 19.8 s)
UNROLLED_SECONDS = 1.0
#: the seconds of compiling, among the operations run outside jit, from which a jnp.split there
#: is named (jax-ml/jax#9445: 500 pieces of an epoch's indices, 3 to 10 s on the 2-core VM)
SPLIT_SECONDS = 1.0
#: of a block compiling heavily, a program holding this many bytes of array constants or more:
#: arrays closed over, baked in (jax-ml/jax#14080: a 10 MiB dataset, 2.04 s to compile)
HEAVY_CONSTANT_BYTES = 2**20
#: the advice where a function's trace outweighs its compile and XLA kept little of it
#: (jax-ml/jax#520; jet measured at order 9 on the CPU: 0.26 s against 5.7 s nested, jax 0.10.2)
LARGE_TRACE_FIX = (
    "unless the function does slow Python work while it is traced, JAX built a program far "
    "larger than what XLA kept, by massive repetition that XLA merges only after tracing has "
    "paid for it (nested jax.jvp or jax.grad, each level repeating all below it, "
    "jax-ml/jax#520; or a Python loop unrolled). For k derivatives along one direction, "
    "jax.experimental.jet.jet(f, (x,), ([v] + [zeros] * (k - 1),)) gives all k in one pass "
    "(the k-th at index k - 1 of its second result); a loop traces its body once in "
    "lax.fori_loop or lax.scan")

_CACHED = ("Each compiled program stays in JAX's caches, in host memory, until its Python "
           "function is gone (the one passed to jax.jit: dropping the jitted wrapper frees "
           "nothing, jax-ml/jax#7930) or the bounded caches drop it; jax.clear_caches() drops "
           "them all.")
_active = threading.Lock()  # one watch at a time per process: the config and logger are global


@dataclass(frozen=True)
class FunctionCompiles(Record):
    """One function's compiles in the block: XLA's compiles (``compiles``) and the traces JAX
    explained (``traces``: a nested jit or ``jax.eval_shape`` traces without compiling), the
    seconds XLA spent (and JAX's tracing and lowering before it), why it compiled again
    (``cause``: the most frequent of its misses' causes), what changed, where it was called,
    and the fix in a sentence."""

    function: str
    defined_at: str
    compiles: int
    traces: int
    compile_seconds: float
    cause: str  # "first compile", one of CAUSES, EAGER or UNEXPLAINED
    changed: tuple[str, ...]  # each argument's new types, else JAX's first differences
    called_at: tuple[str, ...]
    fix: str
    jax_says: str  # JAX's explanation for the cause, from its second line ("" when none)
    #: the eager and unexplained groups: the most compiles of any one name in them (1 where
    #: each name compiled once); 0 for a function's entry, whose count is ``compiles``
    most_of_one: int = 0
    #: the eager group: each operation compiled outside jit more than once with the same
    #: argument types: a value it bakes in changed (integer_pow's exponent), or, for a loop or
    #: branch (while, scan, cond), its body is a new program each call
    same_types_again: tuple[str, ...] = ()
    #: the seconds JAX spent tracing this function to a jaxpr for the compiles here (its
    #: outermost traces) and lowering that to MLIR, before XLA's ``compile_seconds``
    trace_seconds: float = 0.0
    lowering_seconds: float = 0.0
    #: of ``compiles``, the programs loaded from JAX's persistent compilation cache rather
    #: than compiled (PlasmaControl/DESC#1402: a session's resolutions, loaded in 0.20 s)
    cache_loads: int = 0
    #: the instructions of XLA's optimized program for it (the largest, where it compiled more
    #: than once), read only where its jaxpr was large; NOT_AVAILABLE where not read
    xla_instructions: int | NotAvailable = NOT_AVAILABLE
    #: the eager group: where each loop (while, scan, cond) compiled outside jit was called: the
    #: user's function, its line, and "cg" where jax.scipy.sparse.linalg.cg was in between
    loop_callers: tuple[tuple[str, str, str], ...] = ()
    #: the unexplained group: (the name compiled, the function of the user's passed to it, the
    #: user's line) where that function was a new object at each compile, made by the same code:
    #: a library's jit that takes it as a static argument compiles again for each (jax-ml/
    #: jax#17232: odeint of a lambda made in a loop)
    passed_anew: tuple[tuple[str, str, str], ...] = ()
    #: the eager group: (name, its seconds of XLA compiling) of each operation compiled
    #: outside jit, the slowest first (a jnp.split of 400 pieces, 3.98 s, beside cheap ones)
    eager_seconds: tuple[tuple[str, float], ...] = ()
    #: of ``compiles``, those asked for ahead of time (jax.jit(f).lower(x).compile()): a
    #: warm-up of one program per shape the user chose is no recompile (sglang-jax#284)
    ahead_of_time: int = 0
    #: ``defined_at`` is in a library's file: the function was jitted there, as a wrapper of
    #: the user's (eqx.filter_jit jits its own function under the user's function's name,
    #: patrick-kidger/diffrax#466), and ``called_at`` holds the user's lines that called it
    library: bool = False
    #: the equations of the largest jaxpr JAX lowered for it in the block, nested ones included
    #: (what JAX built, before XLA's optimizations); NOT_AVAILABLE where JAX did not lower it in
    #: the block or this JAX does not say
    jaxpr_equations: int | NotAvailable = NOT_AVAILABLE
    #: the bytes of array constants its programs in the block hold (arrays it closes over, baked
    #: in), read only where the block's compiling was heavy or the function compiled again;
    #: NOT_AVAILABLE where not read
    constant_bytes: int | NotAvailable = NOT_AVAILABLE
    #: of ``constant_bytes``, the largest one program holds, read also where the function
    #: compiled again: each compile bakes in its own copy (jax-ml/jax#6905)
    constants_each: int | NotAvailable = NOT_AVAILABLE
    #: the line of the user's code that made the most of that jaxpr's equations,
    #: :data:`UNROLLED_EQUATIONS` or more, where one of them recurs
    #: ``jaxpr_loops.LOOP_REPEATS`` times or more: a Python loop inside jit, unrolled
    #: (jax-ml/jax#352)
    #: ("" where none did); its equations, how often that one recurs, and whether a gather
    #: recurs there (a lookup in each iteration: one gather with index arrays, jax-ml/jax#891)
    unrolled_line: str = ""
    unrolled_equations: int = 0
    unrolled_repeats: int = 0
    unrolled_gathers: bool = False
    #: the most times one of that line's equations recurs with the same operand shapes: under
    #: ``jaxpr_loops.LOOP_REPEATS`` its iterations differ in shape (layers of different widths) and
    #: ``jax.lax.scan`` cannot run them as one body
    unrolled_alike: int = 0
    #: what made that line repeat where not a loop over arrays alike (``jaxpr_loops.loop_kind``):
    #: "scalars" (a list of Python numbers passed to jit, one argument each: jax-ml/jax#5684),
    #: "sliced" (a loop slicing an array by its index: jax-ml/jax#2242) or ""; and the number
    #: of the function's scalar arguments
    unrolled_kind: str = ""
    unrolled_scalars: int = 0

    @property
    def cause_in_words(self) -> str:
        """``cause`` as the summary row says it: "new dtypes (the weak type only)" where only
        the weak type changed (jax#3163: the dtype itself did not, so ``.astype`` is no fix)."""
        if self.cause == "new dtypes" and self.fix == WEAK_FIX:
            return "new dtypes (the weak type only)"
        return self.cause

    @property
    def place(self) -> str:
        """Where to look: the line the function was defined on; for one jitted in a library's
        file, the user's line that called it first, then the library's ("" where unknown)."""
        if self.library and self.called_at:
            return f"called at {self.called_at[0]}; jitted in a library's file, {self.defined_at}"
        return self.defined_at

    @property
    def traced_large(self) -> bool:
        """The jaxpr JAX lowered had :data:`LARGE_TRACE_EQUATIONS` equations or more, and
        :data:`EQUATIONS_PER_INSTRUCTION` or more per instruction XLA kept of it: a program built
        far larger than what it computes (jax#520). Sizes only: the seconds are shown, not
        judged."""
        return bool(self.xla_instructions) and bool(self.jaxpr_equations) and (
            self.jaxpr_equations >= LARGE_TRACE_EQUATIONS
            and self.jaxpr_equations >= EQUATIONS_PER_INSTRUCTION * self.xla_instructions)

    @property
    def recompiled(self) -> bool:
        """Compiled more than once in the block, or once for a change JAX named against a compile
        before the block (a structure restored as a list where it was a tuple: ferminet#105);
        one compile for a new shape, after the block has begun, is what a fix such as padding
        leaves: not a recompile. For the eager and unexplained groups: one of their names
        compiled more than once."""
        if self.cause in (EAGER, UNEXPLAINED):
            return self.most_of_one > 1
        if self.cause == "new shapes" and self.ahead_of_time == self.compiles:
            return False  # compiled ahead of time, one program per shape asked for
        return self.compiles > 1 or (self.compiles == 1 and self.cause not in (
            "first compile", "new shapes"))

    @property
    def diagnosis(self) -> str:
        """The cause and the fix in a sentence or two: what ``CompileLog.diagnosis`` and
        ``%%memory`` say of each function compiled again."""
        where = f" ({self.place})" if self.place else ""
        listed = ", ".join(self.changed)
        if self.cause == EAGER:
            text = (f"{self.compiles} one-operation programs were compiled outside jit "
                    f"({listed}): a jnp call outside jit is compiled for each new shape too; "
                    "inside a jitted function it is part of one program.")
            if any(c.split(" ×")[0] == "stage" for c in self.changed):
                # jax 0.10.2 and 0.11.2: a jit(stage) per new shape (none on 0.8.0), none for
                # jax.device_put (a new user's trial, graphs of many sizes)
                text += (" stage is jnp.asarray or jnp.array of a NumPy array: JAX copies it "
                         "to the device through a small program of its own, one per new "
                         "shape. Pass the NumPy array to the jitted function as it is (jit "
                         "copies it), or jax.device_put(x), which compiles nothing.")
            if any(c.split(" ×")[0] in ("append", "concatenate") and not c.endswith(" ×1")
                   for c in self.changed):
                text += (" append or concatenate compiled again: an array grown at each pass "
                         "outside jit is a new length, a new program and a copy of all of it "
                         "every time (kazewong/flowMC#31, a loss history: 15.4 s against 1.3 s "
                         "in a trial). Make it its final size once, jnp.zeros(n), and write "
                         "each value with .at[i].set(v), or keep a Python list and stack it "
                         "once at the end.")
            others = [n for n in self.same_types_again if n not in _LOOPS and n != "stage"]
            if shaped := [n for n in others if n in _SHAPE_MAKERS]:
                text += (f" {' and '.join(shaped)} compiled again with the same argument "
                         "types: the program bakes in the shape it makes, so jnp.zeros, "
                         "jnp.ones, jnp.full or jnp.arange outside jit is one program per new "
                         "size (a few sizes, a few small compiles; made inside the jitted "
                         "step, they are part of its program).")
                others = [n for n in others if n not in _SHAPE_MAKERS]
            if others:
                text += (f" {' and '.join(others)} compiled again with the same argument "
                         "types: what changed is a value each program bakes in (x ** n with an "
                         "integer n makes one integer_pow per n, as Adam's bias correction "
                         "outside jit made one per step, optax#328; an axis; an index). Inside "
                         "jit it is one program; a power of a float exponent "
                         "(x ** n.astype(jnp.float32)) takes n as an argument.")
            if loops := [n for n in self.same_types_again if n in _LOOPS]:
                text += (f" {' and '.join(loops)} compiled again with the same argument types: a "
                         "lax.while_loop, lax.scan or lax.cond outside jit compiles its body "
                         "with it, and a body made anew at each call (a closure over that "
                         "call's arrays) is a new program every time, each kept in JAX's "
                         "caches, so host memory grows (jax-ml/jax#9714). "
                         + _loop_fix(self.loop_callers, loops))
                if "cond" in loops:
                    text += (" For a lax.cond or lax.switch, define its branches once, not as "
                             "lambdas made at each call over that call's arrays, and pass the "
                             "arrays as its operands: lax.switch(i, [branch0, branch1], x) "
                             "compiles once (jax-ml/jax#5210).")
            return text
        if self.cause == UNEXPLAINED:
            text = (f"{self.compiles} compiles JAX did not explain ({listed}): JAX explains jit "
                    "calls traced on this thread from your own files; a pmap, a library's "
                    "function, another thread, a jax.grad or jax.vmap of a jitted function "
                    "(compiled under its name), or a function compiled before the block for a "
                    "new placement compile without a word.")
            if self.trace_seconds == 0 and not self.passed_anew and not any(
                    c.startswith("jit(") for c in self.changed):
                # no trace at all: a trace JAX had, compiled again (vllm-project/tpu-inference
                # #176: a warm-up's arrays made with jnp, the served ones jax.device_put)
                text += (" None of them traced anything anew (0.00 s of tracing here): JAX "
                         "compiled a trace it already had. Where it was traced before the block "
                         "without a compile (jax.eval_shape, .lower(), jax.make_jaxpr), these "
                         "are its first compiles: nothing to fix. Where the function ran "
                         "before the block (a warm-up), it was called there with arguments "
                         "placed otherwise: committed by jax.device_put or not, on another "
                         "device, or with another sharding. Put the warm-up's arguments the "
                         "way these calls put them (vllm-project/tpu-inference#176), and watch "
                         "both in one block to see which argument changed.")
            for name, fn, at in self.passed_anew:
                what = "a lambda written there" if fn == "lambda" else f"`{fn}`"
                text += (f" {name} compiled again from {at}, whose {what} is a new function "
                         "at each call: a library's jit that takes a function as a static "
                         "argument compares it by identity, so each new one compiles again "
                         "and stays in its cache, host memory growing (jax-ml/jax#17232: "
                         "odeint of a vector field made in a loop). Define the function once, "
                         "outside the loop, and pass what changes as arguments (odeint's "
                         "*args).")
            if jitted := [c.split(" ×")[0] for c in self.changed if c.startswith("jit(")]:
                text += (f" {' and '.join(jitted)}: a jax.jit, made outside JAX, of a function "
                         "in JAX's own files (jax.jit(functools.partial(jax.lax.top_k, k=8)), "
                         "jax-ml/jax#19653), whose misses JAX does not explain: each compile is "
                         "one program, inside jit, not an operation run outside it.")
            return text
        if self.cause == "function made anew":
            # the line that called it, which the jax.jit making it anew runs before (not the
            # jax.jit's own line: track-mjx#45's jit(env.step) two lines up, a new user's trial)
            at = (f", called at {self.called_at[0]}" if self.called_at
                  and "called at" not in where else "")
            head = f"`{self.function}`{where} was jitted anew {self.compiles} times{at}"
        elif self.cause == "new placement":
            head = (f"`{self.function}`{where} compiled {self.compiles} times, "
                    f"{'; '.join(self.changed)}: JAX reused its trace and compiled the program "
                    "again for arguments placed differently (committed to a device or not, on "
                    "another device, or with another sharding)")
        elif self.cause == "caches cleared":
            head = (f"`{self.function}`{where} compiled {self.compiles} times, each recompile "
                    f"after {' or '.join(self.changed) or 'jax.clear_caches()'}")
        elif self.cause == "first compile" and self.compiles > 1:
            # each a function JAX had never seen, with one name and line, all alive at once
            return (f"`{self.function}`{where} compiled {self.compiles} times, each the first "
                    "compile of another function object defined there, "
                    f"{self.compile_seconds:.2f} s of compiling: {self.fix}."
                    f"{self._constants_again()}")
        else:
            changed = f" ({'; '.join(self.changed[:3])})" if self.changed else ""
            times = (f"{self.compiles} times" if self.compiles != 1 else
                     "again (it had compiled before this block)")
            head = f"`{self.function}`{where} compiled {times}, for {self.cause}{changed}"
        said = f" JAX says: {self.jax_says}" if self.cause == "other" and self.jax_says else ""
        if self.cause == "function made anew" and self.library and self.called_at:
            # the jit may be the library's own, made at each call over the values it is given
            # (pyro-ppl/numpyro#1347's MCMC.run, a new user's trial): no loop of the user's
            # to move it out of
            said += (f" `{self.function}` is a library's function ({self.defined_at}): where "
                     "your code makes that jax.jit, make it once; where the library jits it "
                     f"anew at each of your calls ({self.called_at[0]}), closed over the values "
                     "you pass, use its option to pass them as traced arguments, or pass the "
                     "same values (numpyro's MCMC: jit_model_args=True, pyro-ppl/numpyro#1347).")
        if self.cache_loads and self.cache_loads == self.compiles and self.fix in (
                FIXES["new shapes"], BUCKETED_FIX):  # (another fix stands: a review)
            return (f"{head}, each program loaded from the persistent compilation cache, "
                    f"{self.compile_seconds:.2f} s in all: the cache pays for these, and each "
                    "is a program of its own (one per shape, per value): nothing to fix unless "
                    "they are many (PlasmaControl/DESC#1402).")
        loads = (f" ({self.cache_loads} of them loaded from the persistent compilation cache)"
                 if self.cache_loads else "")
        return (f"{head}, {self.compile_seconds:.2f} s of compiling{loads}: {self.fix}."
                f"{said}{self._constants_again()}")

    def _constants_again(self) -> str:
        """For a function compiled again whose programs hold arrays it closes over: each
        compile bakes in a copy, kept with its program (jax-ml/jax#6905: jax.jit(partial(apply,
        params)) and new input shapes). The host holds more than the constants' bytes for each
        (jax-ml/jax#6997 in a new user's miniature: 8 MiB closed over, 6 new batch sizes;
        measured again with MALLOC_MMAP_THRESHOLD_=65536 on the 2-core VM, each program held
        11.9 MiB of host memory on jax 0.8.0, 26.6 on 0.10.2, 17.5 on 0.12.0.1, against 3.8,
        2.6 and 0.1 with the array passed as an argument; jax.clear_caches() gave it back)."""
        each, total = self.constants_each, self.constant_bytes
        if not each or not total or each < HEAVY_CONSTANT_BYTES or self.compiles < 2:
            return ""
        return (f" Each of these compiles also bakes in {format_bytes(each)} of arrays "
                f"`{self.function}` closes over as constants, a copy per program "
                f"({format_bytes(total)} in its programs here, kept as long as JAX keeps "
                "them; on the host each program held up to 3 times its constants' bytes, "
                "measured on the CPU): pass them as arguments (jax.jit(f)(params, x), not "
                "jax.jit(partial(f, params)) or a closure over params), and the programs hold "
                "none (jax-ml/jax#6905).")


def _loop_fix(callers: tuple[tuple[str, str, str], ...], loops: list[str]) -> str:
    """The fix for ``loops`` compiled outside jit again and again, naming the user's code that
    called them where the kit saw it (flowMC#133), with cg's own example where cg called them;
    for a scan or while loop, why a body with __eq__ compiles again (jax#14743)."""
    if any(via == "cg" for _, _, via in callers):
        return ("Jit the function that calls it, made once (its sizes static: "
                "jax.jit(cg, static_argnames='maxiter')), and it compiles once.")
    # jax 0.8.0 and 0.10.2: a new callable object with __eq__ and __hash__ compiled 3 times in 3
    # calls, each object dropped after its call; 0 while an equal one was alive; the same object,
    # or the caller jitted, 0
    identity = (" Outside jit JAX keeps the program only while the body object lives, so a "
                "body made anew at each call compiles again, even a callable class with __eq__ "
                "and __hash__ (jax-ml/jax#14743): make it once and pass the same object."
                if {"scan", "while"} & set(loops) else "")  # (cond: its branches, below)
    named = [(name, at) for name, at, _ in callers if name and at]
    if not named:
        return ("Jit the function that calls it, made once (an argument that sets a size, such "
                "as a step count, in static_argnames), and it compiles once." + identity)
    name, at = named[0]
    if any(via == "vmap" for n, _, via in callers if n == name):
        return (f"`{name}` ({at}) runs under jax.vmap, which batches but does not compile: a "
                "vmapped function called outside jit runs its operations one by one and "
                "compiles its loops again at each call. Jit the vmapped function, made once: "
                f"jax.jit(jax.vmap({name}, ...)), not jax.vmap(jax.jit({name})), which "
                "compiles once but batches in Python again at every call (20 times slower "
                "in a trial; google-deepmind/mujoco#1516)." + identity)
    if any(via == "loop" for n, _, via in callers if n == name):
        return (f"Jit the work `{name}` does at each pass of its Python loop ({at}), once: a "
                "function of one step (the call at that line and what it reads), jax.jit-ed "
                "outside the loop and called in it, compiles once. Jitting "
                f"`{name}` whole would unroll its loop, one copy of the step per pass, and "
                "compile again for each count (pasteurlabs/mosaic#19: an optax L-BFGS loop "
                "driven from Python)." + identity)
    if name == "<module>":  # called at a module's or a cell's top level
        return (f"Call it from a function jitted once, not at the top level ({at}), and it "
                "compiles once." + identity)
    return (f"Jit `{name}`, the function that calls it ({at}), once (an argument that sets a "
            f"size, such as a step count, in static_argnames: jax.jit({name}, "
            "static_argnames=...)), and it compiles once." + identity)


class CompileLog(Display):
    """What a :func:`watch` block compiled. Filled when the block ends."""

    def __init__(self) -> None:
        self.functions: tuple[FunctionCompiles, ...] = ()
        self.misses: tuple[CacheMiss, ...] = ()
        self.seconds = 0.0  # the block's wall time
        #: the seconds JAX spent tracing functions to jaxprs (the outermost traces: a trace
        #: inside another is in its seconds) and lowering them to MLIR, in the user's code
        self.trace_seconds = 0.0
        self.lowering_seconds = 0.0
        #: compiles the kit made itself inside the block (preflight_step pricing a step): not
        #: the user's program compiling, so left out of ``functions`` and ``compiles``
        self.kit_compiles = 0
        #: of ``compiles``, the programs loaded from JAX's persistent compilation cache (on disk)
        #: rather than compiled by XLA
        self.cache_loads = 0
        self.load_seconds = 0.0  # of compile_seconds, the loading from that cache
        self.longest_compile = 0.0  # the seconds of the longest single compile in the block
        #: jax.disable_jit was on when the block began (JAX_DISABLE_JIT): every jitted function
        #: ran operation by operation
        self.jit_disabled = False
        #: JAX's persistent compilation cache directory, "" where none is set
        self.cache_dir = ""
        #: with a cache folder set: the programs JAX wrote to it, and those it did not, by its
        #: reason ("quicker than jax_persistent_cache_min_compile_time_secs", "uses host
        #: callbacks", "smaller than jax_persistent_cache_min_entry_size_bytes", ...)
        self.cache_written = 0
        self.cache_skipped: tuple[tuple[str, int], ...] = ()
        #: the programs compiled in the block for operations outside jit that take
        #: :data:`MANY_OPERANDS` arguments or more: (the operation, its arguments)
        self.many_operands: tuple[tuple[str, int], ...] = ()
        self.finished = False

    @property
    def compiles(self) -> int:
        return sum(f.compiles for f in self.functions)

    @property
    def compile_seconds(self) -> float:
        return sum(f.compile_seconds for f in self.functions)

    @property
    def recompiled(self) -> tuple[FunctionCompiles, ...]:
        """The functions that compiled again, most compiles first; eager operations and the
        compiles JAX did not explain come last."""
        return tuple(f for f in self.functions if f.recompiled)

    def function(self, name: str) -> FunctionCompiles:
        """The entry of the function called ``name`` (``"eager operations"`` for jnp calls
        made outside jit, ``"compiles JAX did not explain"`` for the rest)."""
        for f in self.functions:
            if f.function == name:
                return f
        known = ", ".join(f.function for f in self.functions) or "none"
        raise BadInputError(f"no function {name!r} compiled in this block; compiled: {known}")

    @property
    def diagnosis(self) -> str:
        """The cause and the fix, one or two sentences per function that compiled again."""
        if not self.finished:
            return "the block has not ended yet"
        notes = []
        if self.jit_disabled and any(f.cause == EAGER for f in self.functions):
            notes.append(
                "jax.disable_jit is on (jax.config.update('jax_disable_jit', True), "
                "JAX_DISABLE_JIT or `with jax.disable_jit()`): every jitted function, a "
                "library's too (an optimizer's update), runs operation by operation, each "
                "operation compiled on its own, and one that bakes in a value that changes "
                "compiles at every step (jax-ml/jax#19654). Keep it to the code you debug.")
        baked = [f for f in self.functions if f.constant_bytes
                 and f.constant_bytes >= HEAVY_CONSTANT_BYTES]
        if self.compiled_heavily and baked:
            notes.append(
                f"XLA compiling took {self.compile_seconds:.2f} s of the block's "
                f"{self.seconds:.2f} s, and "
                + "; ".join(f"`{f.function}`" + (f" ({f.place})" if f.place else "")
                            + f"'s program holds {format_bytes(f.constant_bytes)} of constants"
                            for f in baked)
                + ": arrays the function closes over, not passed as arguments, are baked into "
                "the program as constants, which XLA compiles with (slowly, and in memory: "
                "jax-ml/jax#14080) and keeps a copy of with each program. Pass them as "
                "arguments (jax.jit(lambda data, key: ...)(data, key)); a persistent cache would "
                "only store them too.")
        split = [s for f in self.functions if f.cause == EAGER
                 for n, s in f.eager_seconds if n == "split" and s >= SPLIT_SECONDS]
        if split and not self.many_operands:
            notes.append(
                f"jnp.split or jnp.array_split outside jit compiled a program with one slice "
                f"per piece ({split[0]:.2f} s of compiling): its compile grows with the number "
                "of pieces, and another "
                "count of pieces (a dataset of another size) compiles again. To cut an epoch's "
                "indices into batches on the host, np.array_split does it with no compile "
                "(jax-ml/jax#9445).")
        if self.many_operands:
            name, n = max(self.many_operands, key=lambda m: m[1])
            notes.append(
                f"`{name}` outside jit compiled a program of {n:,} arguments: jnp.{name} of a "
                f"Python list of {n:,} arrays makes each one an operand (from jax 0.10; 0.8.0 "
                "joins them in pieces), and XLA's compile time grows with their number (a list "
                "of another length compiles again). Read such a list to the host at once, "
                "np.stack(jax.device_get(xs)), or keep per-step values there as they come "
                "(markean/aimz#268: a history of per-step losses; 2,000 scalars: 1.7 s through "
                "jnp.stack, 0.04 s so).")
        elif self.compiled_heavily and not baked and not split:
            notes.append(
                f"XLA compiling took {self.compile_seconds:.2f} s of the block's "
                f"{self.seconds:.2f} s, and nothing compiled twice: a new process compiles all "
                "of it again. If this program starts often (a script, a restarted kernel), "
                "jax.config.update('jax_compilation_cache_dir', '<a folder>') keeps compiled "
                "programs on disk, and the next process loads them (numpyro#1249); it keeps "
                "only those that took jax_persistent_cache_min_compile_time_secs or more to "
                f"compile (1 s by default; the longest here took {self.longest_compile:.2f} s), "
                "so lower that too if they are short.")
        if self.cache_dir and self.cache_skipped and not self.cache_written:
            notes.append(self._not_cached())
        for f in self.functions:
            spent = f.compile_seconds + f.trace_seconds + f.lowering_seconds
            # (tracing counts too: a loop whose copies XLA drops, their values unused, still
            # costs JAX a trace of each, jax-ml/jax#4436: 1.38 s traced, 0.02 s compiled)
            if f.unrolled_line and spent >= UNROLLED_SECONDS:
                where = f" ({f.defined_at})" if f.defined_at else ""
                alike = f.unrolled_alike >= jaxpr_loops.LOOP_REPEATS
                head = (f"`{f.function}`{where} was traced to {f.jaxpr_equations:,} jaxpr "
                        f"equations, {f.unrolled_equations:,} of them from one line "
                        f"({f.unrolled_line}), one of them {f.unrolled_repeats} times over")
                if f.unrolled_kind == "scalars":  # a list of numbers: no loop to rewrite
                    notes.insert(0, f"{head} ({_seconds_spent(f)}): "
                                 + jaxpr_loops.SCALARS_FIX.format(f.unrolled_scalars))
                    continue
                unalike = (jaxpr_loops.SLICED_LOOP_FIX if f.unrolled_kind == "sliced"
                           else jaxpr_loops.UNALIKE_LOOP_FIX)
                notes.insert(0, (
                    head
                    + ("" if alike else
                       f", its operand shapes changing between iterations (at most "
                       f"{f.unrolled_alike} alike)")
                    + ": a Python loop inside the jitted function is unrolled, one copy of its "
                    "body per iteration, and JAX traces and XLA compiles every copy "
                    f"({_seconds_spent(f)} here). "
                    + ("jax.lax.scan or jax.lax.fori_loop compile the body once (jax-ml/jax#352: "
                       "an RNN of 300 steps, 21.5 s to its first result, 1.0 s with lax.scan)."
                       + (jaxpr_loops.LOOKUPS_FIX if f.unrolled_gathers else "")
                       + jaxpr_loops.PARTIAL_UNROLL if alike else
                       unalike[0].upper() + unalike[1:])))
            if f.traced_large:
                where = f" ({f.defined_at})" if f.defined_at else ""
                notes.append(
                    f"`{f.function}`{where} was traced to {f.jaxpr_equations:,} jaxpr equations, "
                    f"of which XLA kept {f.xla_instructions} instructions ("
                    f"{f.trace_seconds + f.lowering_seconds:.2f} s to trace and lower, XLA "
                    f"{f.compile_seconds:.2f} s to compile): {LARGE_TRACE_FIX}.")
        if not self.recompiled:
            return "\n".join([f"No function compiled more than once in this block: "
                              f"{self.compiles} compile(s).", *notes])
        return "\n".join([*notes, *(f.diagnosis for f in self.recompiled), _CACHED])

    @property
    def compiled_heavily(self) -> bool:
        """Nothing compiled twice, no persistent cache set, and XLA's compiling took
        :data:`HEAVY_COMPILE_SECONDS` or more, :data:`HEAVY_COMPILE_SHARE` of the block or
        more: a new process pays it again."""
        return (not self.recompiled and not self.cache_dir
                and self.compile_seconds - self.load_seconds >= HEAVY_COMPILE_SECONDS
                and self.compile_seconds >= HEAVY_COMPILE_SHARE * self.seconds)

    def _not_cached(self) -> str:
        """Why nothing compiled in the block reached the persistent cache, in JAX's reasons
        (jax-ml/jax#21908: a folder set, and left empty)."""
        why = "; ".join(f"{n} {reason}" for reason, n in self.cache_skipped)
        reasons = {r for r, _ in self.cache_skipped}
        if reasons <= {"not process 0", "no cache"}:
            return (f"Nothing compiled in this block was written to the persistent cache in "
                    f"{self.cache_dir} ({why}): "
                    + ("only process 0 of a job writes it, so this is as JAX means it here"
                       if "not process 0" in reasons else
                       "JAX's cache was not initialized when these compiled") + ".")
        fixes = []
        if any(r.startswith("quicker") for r, _ in self.cache_skipped):
            fixes.append("jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)")
        if any(r.startswith("smaller") for r, _ in self.cache_skipped):
            fixes.append("jax.config.update('jax_persistent_cache_min_entry_size_bytes', -1)")
        callbacks = any(r == "uses host callbacks" for r, _ in self.cache_skipped)
        return (f"Nothing compiled in this block was written to the persistent cache in "
                f"{self.cache_dir} ({why}): JAX writes a program only if it took "
                "jax_persistent_cache_min_compile_time_secs (1 s by default) or more to compile "
                "and is at least jax_persistent_cache_min_entry_size_bytes."
                + (f" To keep short programs too: {' and '.join(fixes)}." if fixes else "")
                + (" A program with a host callback (jax.debug.print, jax.pure_callback, "
                   "breakpoint) is never written." if callbacks else ""))

    def to_dict(self) -> dict:
        """Plain data: every function's entry and every cache miss JAX explained."""
        return {"compiles": self.compiles, "kit_compiles": self.kit_compiles,
                "compile_seconds": self.compile_seconds,
                "seconds": self.seconds, "trace_seconds": self.trace_seconds,
                "lowering_seconds": self.lowering_seconds,
                "functions": [f.to_dict() for f in self.functions],
                "misses": [m.to_dict() for m in self.misses], "diagnosis": self.diagnosis,
                "cache_loads": self.cache_loads, "load_seconds": self.load_seconds,
                "jit_disabled": self.jit_disabled, "cache_dir": self.cache_dir,
                "cache_written": self.cache_written,
                "cache_skipped": [list(kv) for kv in self.cache_skipped]}


class _Events(logging.Handler):
    """Keeps JAX's cache-miss explanations and the compile events in the order they came, with
    the thread each came from (a compile follows the miss that caused it, on its thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple] = []
        self.guard = threading.Lock()
        #: compiles the kit made itself (preflight_step pricing a step), left out of the log;
        #: JAX's explanation of a trace the kit made stays, for the user's compile of it
        self.own = 0
        self.loading: set[int] = set()  # threads whose next compile event is a cache load
        self.loads: list[float] = []  # the seconds of each program loaded from the cache
        #: per program compiled, what became of it in the persistent cache: "written", or why
        #: not (JAX says so only while a cache folder is set)
        self.writes: list[str] = []
        #: no handler of the user's would print a JAX record: Python's last resort would have
        #: (stderr, WARNING and up), and the kit's handler stops it, so the kit passes it on
        #: (jax_log_compiles's "Compiling ..." lines vanished inside the block: a trial)
        self.forward = False
        #: the loggers' effective levels before the kit lowered them: a record below its
        #: logger's is one the user would not have seen, and is not passed on (a review)
        self.levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        last = logging.lastResort
        floor = self.levels.get(record.name, self.levels.get("jax", logging.WARNING))
        if self.forward and last is not None and record.levelno >= max(
                logging.WARNING, last.level, floor) and _QUIET.filter(record):
            last.handle(record)
        try:
            message = record.getMessage()
            written = jaxcompat.parse_cache_write(message)
            parsed = None if written else jaxcompat.parse_cache_miss(message)
        except Exception:  # never break the user's program over a log line
            return
        if written is not None:
            if not own.active():
                with self.guard:
                    self.writes.append(written[0])
            return
        if parsed is not None and jaxcompat.traced_for_jax_transpose(sys._getframe(1)):
            return  # JAX's trace of a jit's backward pass (jax >= 0.11), not the user's
        if parsed is not None:  # (a trace the kit made: kept for a compile of the user's)
            called, defined = jaxcompat.cache_miss_files(message)
            # a function jitted in a library's file (eqx.filter_jit's wrapper, diffrax#466): JAX
            # names the library's lines; the user's is the first of theirs on this stack
            library = bool(defined) and not frames.is_user_file(defined)
            if called and not frames.is_user_file(called) and (at := _user_line()):
                parsed = {**parsed, "called_at": at}
            with self.guard:
                self.events.append(("miss", record.thread, CacheMiss(**parsed), own.active(),
                                    library))

    def lowered(self, record: logging.LogRecord) -> bool:
        """A filter on JAX's lowering logger, where each "Compiling ..." line is kept: what the
        next compile of that name lowers, on its thread. A DEBUG one, which the kit asked for,
        goes no further, so no handler prints it (one added during the block included); a
        WARNING one (jax_log_compiles) goes on as JAX sends it."""
        try:
            lowering = jaxcompat.parse_compiling(record.getMessage())
        except Exception:  # never break the user's program over a log line
            return True
        if lowering is None:
            return True
        if not own.active():  # the kit's own lowering: not the user's program
            frame = sys._getframe(1)
            equations = jaxcompat.lowered_equations(frame)
            loop = None
            if equations is not None and equations >= UNROLLED_EQUATIONS:
                try:  # the line a Python loop unrolled into the program, if one did
                    loop = jaxpr_loops.unrolled_line(jaxcompat.lowered_jaxpr(frame),
                                                UNROLLED_EQUATIONS)
                except Exception:  # never break the user's program over a diagnosis
                    loop = None
            with self.guard:
                self.events.append(("lowering", record.thread, *lowering, equations, loop))
        # (a WARNING one goes on only where the user's level let it: the kit lowered it)
        return record.levelno >= max(logging.WARNING,
                                     self.levels.get(record.name, logging.WARNING))

    def cleared(self, what: str = "jax.clear_caches()") -> None:
        """jax.clear_caches() or a jitted function's clear_cache() ("jit(f).clear_cache()")
        ran: a function seen before misses."""
        with self.guard:
            self.events.append(("clear", what))

    def compiled(self, event: str, seconds: float, **kwargs) -> None:
        if event == jaxcompat.CACHE_LOAD_EVENT:  # the compile event that follows is a load
            self.loading.add(threading.get_ident())
            return
        if event in (_TRACE_EVENT, _LOWER_EVENT):  # with when it ended, to tell nested traces
            if not own.active():
                with self.guard:
                    self.events.append(("trace" if event == _TRACE_EVENT else "to_mlir",
                                        threading.get_ident(), str(kwargs.get("fun_name", "")),
                                        seconds, time.perf_counter()))
            return
        if event != jaxcompat.COMPILE_EVENT:
            return
        name = str(kwargs.get("fun_name", ""))
        short = jaxcompat.compiled_function_name(name)
        caller = _loop_caller() if short in _LOOPS and not own.active() else None
        if caller is None and not own.active() and short not in _primitive_names():
            caller = _passed_functions()
        # a jit named like a primitive that JAX did not make (jax.jit(partial(lax.top_k, k=8))):
        # the user's, not an operation run outside jit (JAX explains no miss of either)
        users = (short in _primitive_names() and not own.active()
                 and jaxcompat.jit_made_by_jax(sys._getframe(1)) is False)
        # a jnp function JAX jits where it defines it (jnp.append, jnp.pad, jnp.mean), called
        # outside jit: an operation run on its own, as a primitive is, which JAX explains no
        # miss of (a new user's trial: flowMC#31's jnp.append filed as "not explained")
        jnps = (short not in _primitive_names() and not own.active()
                and jaxcompat.jit_made_by_jax_for_arrays(sys._getframe(1)))
        with self.guard:
            loaded = threading.get_ident() in self.loading
            self.loading.discard(threading.get_ident())
            if own.active():  # the kit's own compile (preflight_step): counted apart
                self.own += 1
            else:
                self.events.append(("compile", threading.get_ident(), name, seconds, caller,
                                    users, jaxcompat.ahead_of_time(sys._getframe(1)), jnps,
                                    loaded))
                if loaded:
                    self.loads.append(seconds)


def _user_line() -> str:
    """The line of the user's code running now on this thread ("train.py:12"), the innermost;
    "" where none is on the stack."""
    frame = sys._getframe(1)
    while frame is not None and not frames.is_user_frame(frame):
        frame = frame.f_back
    return frames.where(frame.f_code.co_filename, frame.f_lineno) if frame is not None else ""


def _loop_caller() -> tuple[str, str, str]:
    """(the user's function, its line, how: "cg" where jax.scipy.sparse.linalg.cg was between,
    "vmap" where the function runs under jax.vmap, "loop" where at a pass of its Python loop)
    that called the loop compiling now, read from this thread's stack; ("", "", "") where
    none."""
    frame, via = sys._getframe(1), ""
    while frame is not None and not frames.is_user_frame(frame):
        via = "cg" if frame.f_code.co_name == "cg" else via
        frame = frame.f_back
    if frame is None:
        return ("", "", via)
    # a comprehension or a lambda is not what to jit: the user's function around it is
    while frame.f_code.co_name.startswith("<") and frame.f_code.co_name != "<module>":
        outer = frame.f_back
        while outer is not None and not frames.is_user_frame(outer):
            outer = outer.f_back
        if outer is None:
            break
        frame = outer
    if jaxcompat.under_vmap(frame):  # batched, not compiled: the vmap is what to jit
        via = via or "vmap"
    elif frame.f_code.co_name != "<module>" and _in_python_loop(frame):
        via = via or "loop"
    return (frame.f_code.co_name, frames.where(frame.f_code.co_filename, frame.f_lineno), via)


def _passed_functions() -> tuple:
    """("passed", the user's line, ((name, id, code), ...)) for the Python functions the
    user's line running now names or writes as a lambda (looked up in its frame, nothing
    called): what a library's jit may take as static arguments."""
    import linecache
    import types

    frame = sys._getframe(2)
    while frame is not None and not frames.is_user_frame(frame):
        frame = frame.f_back
    if frame is None:
        return ("passed", "", ())
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    found = []
    for name in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", text)):
        value = frame.f_locals.get(name, frame.f_globals.get(name))
        if isinstance(value, types.FunctionType):
            found.append((name, id(value), value.__code__))
    if re.search(r"\blambda\b", text.split("#", 1)[0]):
        found.append(("lambda", -1, None))
    return ("passed", frames.where(frame.f_code.co_filename, frame.f_lineno), tuple(found))


def _in_python_loop(frame) -> bool:
    """The line ``frame`` runs is inside a Python for or while loop of its own function (read
    from its source; False where there is none to read)."""
    import ast
    import inspect
    import textwrap

    try:
        lines, start = inspect.getsourcelines(frame.f_code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return False
    line = frame.f_lineno - max(start, 1) + 1
    return any(isinstance(node, (ast.For, ast.While, ast.AsyncFor))
               and node.lineno < line <= (node.end_lineno or node.lineno)
               for node in ast.walk(tree))


class _Quiet(logging.Filter):
    """Keeps JAX's cache-miss lines out of the notebook's stderr while the kit collects them
    (they are kept, verbatim, in the log's ``misses``), and the lines on programs not written to
    the persistent cache, which JAX logs at WARNING only because the kit asked it to explain
    (they are counted in ``cache_skipped``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(jaxcompat.CACHE_MISS_PREFIX) or (
            record.levelno < logging.ERROR
            and message.startswith(jaxcompat.CACHE_EXPLAINED_PREFIXES)))


#: the one filter of cache-miss lines: it keeps no state, so every handler can share it
_QUIET = _Quiet()


class _Disabled(logging.Filter):
    """Keeps out of every other handler what ``logging.disable`` kept from being made: the kit
    lifts it while it watches, so that JAX's explanations reach the kit alone."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > self.level


def _every_handler(besides: logging.Handler) -> list[logging.Handler]:
    """Every handler a record could reach: the root's, every logger's, and logging's last
    resort (handlers added while the block runs are not seen)."""
    loggers = [logging.getLogger()] + [x for x in logging.Logger.manager.loggerDict.values()
                                       if isinstance(x, logging.Logger)]
    found = _handlers_of(loggers, besides)
    if logging.lastResort is not None and logging.lastResort not in found:
        found.append(logging.lastResort)
    return found


def _handlers_of(loggers: list[logging.Logger], besides: logging.Handler
                 ) -> list[logging.Handler]:
    """The handlers of ``loggers``, each once, ``besides`` left out."""
    return list({id(h): h for x in loggers for h in x.handlers if h is not besides}.values())


def _jax_handlers(besides: logging.Handler) -> list[logging.Handler]:
    """The handlers that would print a JAX log record: the root's and those of every logger
    named "jax" or "jax.*" (handlers added while the block runs are not seen)."""
    loggers = [logging.getLogger(), logging.getLogger("jax")] + [
        x for name, x in logging.Logger.manager.loggerDict.items()
        if name.startswith("jax.") and isinstance(x, logging.Logger)]
    return _handlers_of(loggers, besides)


@contextlib.contextmanager
def watch() -> Iterator[CompileLog]:
    """Record every compile the block makes and JAX's reason for each; the log is filled when
    the block ends. JAX's explanations are kept verbatim in the log's ``misses`` rather than
    printed as they come. Exceptions from the block propagate; JAX's setting, the logger and the
    listener are restored either way. JAX explains only this thread's cache misses (its setting
    is per thread); compiles on other threads are counted among those JAX did not explain.
    Under ``logging.disable(level)`` the kit lifts it for the block and keeps every other
    handler from what it would have silenced.
    """
    if not _active.acquire(blocking=False):
        raise InUseError("compiles.watch() is already active in this process (%%memory runs "
                         "one around its cell); nest the code inside the existing watch instead")
    try:
        log = CompileLog()
        events, quiet = _Events(), _QUIET
        logger = logging.getLogger("jax")
        lowering = logging.getLogger(jaxcompat.COMPILING_LOGGER)  # says what each compile lowers
        others = _jax_handlers(events)
        events.forward = not others
        events.levels = {"jax": logger.getEffectiveLevel(),
                         lowering.name: lowering.getEffectiveLevel()}
        level, lowering_level = logger.level, lowering.level
        t0 = time.perf_counter()
        loaded = _loaded()  # the programs loaded before: not the block's
        jax.monitoring.register_event_duration_secs_listener(events.compiled)
        clear_caches = jax.clear_caches
        set_here: list = []  # the loggers whose level the kit sets: only those go back
        log.jit_disabled = bool(jax.config.jax_disable_jit)  # (this thread's, as the user set)
        log.cache_dir = str(jax.config.jax_compilation_cache_dir or "")
        disabled = logging.root.manager.disable  # logging.disable(level): no record made
        gate = _Disabled(disabled)
        gated = _every_handler(events) if disabled >= logging.DEBUG else []

        @functools.wraps(clear_caches)
        def counted_clear_caches(*args, **kwargs):  # noted in the log, then JAX's own
            events.cleared()
            return clear_caches(*args, **kwargs)

        try:
            jax.clear_caches = counted_clear_caches
            logger.addHandler(events)
            lowering.addFilter(events.lowered)  # its DEBUG lines end with the kit
            for h in others:
                h.addFilter(quiet)
            for h in gated:  # what logging.disable silenced stays silent for the user
                h.addFilter(gate)
            if gated:
                logging.disable(logging.NOTSET)
            if logger.getEffectiveLevel() > logging.WARNING:  # JAX explains at WARNING
                logger.setLevel(logging.WARNING)
                set_here.append((logger, level, logging.WARNING))
            if lowering.getEffectiveLevel() > logging.DEBUG:  # and says what it lowers at DEBUG
                lowering.setLevel(logging.DEBUG)
                set_here.append((lowering, lowering_level, logging.DEBUG))
            with (jax.explain_cache_misses(True), jaxcompat.jit_cache_clears(events.cleared),
                  jaxcompat.static_values_explained()):
                yield log
        finally:
            try:
                jax.clear_caches = clear_caches
                for x, before, kit in set_here:
                    if x.level == kit:  # the kit's level: the user's before it comes back
                        x.setLevel(before)  # (one the user set in the block stays)
                lowering.removeFilter(events.lowered)
                logger.removeHandler(events)
                for h in others:
                    h.removeFilter(quiet)
                for h in gated:
                    h.removeFilter(gate)
                if gated and logging.root.manager.disable == logging.NOTSET:
                    logging.disable(disabled)  # (one the user set in the block stays)
                jaxcompat.unregister_duration_listener(events.compiled)
            finally:
                log.seconds = time.perf_counter() - t0
                log.misses = tuple(e[2] for e in events.events if e[0] == "miss" and not e[3])
                nested = _nested_traces(events.events)
                log.functions = _summarise(events.events, nested)
                log.trace_seconds = sum(e[3] for i, e in enumerate(events.events)
                                        if e[0] == "trace" and i not in nested)
                log.lowering_seconds = sum(e[3] for e in events.events if e[0] == "to_mlir")
                log.kit_compiles = events.own
                log.cache_loads, log.load_seconds = len(events.loads), sum(events.loads)
                log.cache_written = events.writes.count("written")
                log.cache_skipped = tuple(Counter(w for w in events.writes
                                                  if w != "written").most_common())
                log.longest_compile = max((e[3] for e in events.events if e[0] == "compile"),
                                          default=0.0)
                log.functions = _with_programs(log, loaded)
                log.many_operands = _many_operands(log.functions, loaded)
                log.finished = True
    finally:
        _active.release()


def _loaded() -> set[int] | None:
    """The ids of the compiled programs loaded now; None where JAX has started no backend (none
    loaded, and asking would start one) or does not say."""
    if not jaxcompat.backends_started():
        return None
    execs = jaxcompat.live_executables()
    return None if execs is None else {id(e) for e in execs}


def _with_programs(log: CompileLog, before: set[int] | None) -> tuple[FunctionCompiles, ...]:
    """``log.functions``, each read against its programs loaded since ``before`` where one of
    three questions needs them (the text of a large program takes time, so only then): the
    instructions XLA kept, where its jaxpr was large (a program built far larger than what XLA
    kept); the programs' parameter and result types, where it compiled again for new dtypes (a
    float it widened itself, fed back: the fix from :func:`compile_causes.fix_for`); the bytes
    of constants, where the block compiled heavily (arrays closed over, baked in)."""
    functions = log.functions
    mine = {id(f) for f in functions if f.cause not in (EAGER, UNEXPLAINED) and f.compiles}
    large = {id(f) for f in functions if id(f) in mine and f.jaxpr_equations
             and f.jaxpr_equations >= LARGE_TRACE_EQUATIONS}
    dtypes = {id(f) for f in functions if id(f) in mine and f.cause == "new dtypes"}
    heavy = log.compiled_heavily
    # compiled again: each program bakes in its own copy of the arrays closed over (jax#6905)
    again = {id(f) for f in functions if id(f) in mine and f.recompiled and f.compiles > 1}
    if not (large or dtypes or heavy or again):
        return functions
    try:
        execs = [e for e in jaxcompat.live_executables() or [] if id(e) not in (before or ())]
        modules = [e.hlo_modules()[0] for e in execs]
    except Exception:  # a jaxlib that does not say
        return functions
    texts: dict[int, str] = {}

    def programs(f: FunctionCompiles) -> list[str]:
        wanted = _squeezed(f"jit({f.function})")
        return [texts.setdefault(id(m), m.to_string()) for m in modules
                if _squeezed(m.name) == wanted]

    out = []
    for f in functions:
        key, constants = id(f), (heavy and id(f) in mine) or id(f) in again
        found = programs(f) if key in large | dtypes or constants else []
        if found and key in large:
            f = replace(f, xla_instructions=max(sum(" = " in line for line in t.splitlines())
                                                for t in found))
        if found and key in dtypes:
            misses = [m for m in log.misses if (m.function, m.defined_at) == (f.function,
                                                                               f.defined_at)]
            signatures = [s for t in found if (s := jaxcompat.entry_signature(t)) is not None]
            # only the types JAX named as new (one program text walked per type, not per
            # float result): the widened one is among them
            named = "".join(m.changed for m in misses).replace(" ", "")
            outputs = {r for _, returns in signatures for r in returns
                       if r.startswith(("f64[", "f32[")) and r in named}
            integers = {out: list(dict.fromkeys(
                frames.line(*at) for t in found
                for at in jaxcompat.integer_widenings(t, out.split("[")[0],
                                                      frames.is_user_file, out)))
                for out in outputs}
            fix = fix_for(misses, f.cause, programs=signatures, integer_lines=integers)
            # (a weak type a warm-up lowered without keeps its ahead-of-time fix)
            f = replace(f, fix=f.fix if fix == WEAK_FIX and f.fix in (AHEAD_WEAK_FIX,
                                                                        AHEAD_TYPED_FIX)
                        else fix or f.fix)
        if found and constants:
            each = [jaxcompat.constant_bytes(t) or 0 for t in found]
            f = replace(f, constant_bytes=sum(each), constants_each=max(each))
        out.append(f)
    return tuple(out)


#: the operations outside jit that take a Python list of arrays, each one an operand
_OF_LISTS = frozenset({"stack", "concatenate", "vstack", "hstack", "column_stack"})


def _many_operands(functions: Sequence[FunctionCompiles], before: set[int] | None
                   ) -> tuple[tuple[str, int], ...]:
    """Of the operations compiled outside jit in the block that take a list of arrays
    (:data:`_OF_LISTS`, in the eager group: never a user's own jitted function), those whose
    program takes :data:`MANY_OPERANDS` arguments or more, from the programs loaded
    since ``before``: (the operation, its arguments). Only their programs' first lines are
    read."""
    names = {_squeezed(f"jit({n})"): n for f in functions if f.cause == EAGER
             for c in f.changed if (n := c.rsplit(" ×", 1)[0]) in _OF_LISTS}
    if not names:
        return ()
    found = []
    try:
        for e in jaxcompat.live_executables() or []:
            if id(e) in (before or ()):
                continue
            module = e.hlo_modules()[0]
            name = names.get(_squeezed(module.name))
            if name is None:
                continue
            signature = jaxcompat.entry_signature(module.to_string())
            if signature is not None and len(signature[0]) >= MANY_OPERANDS:
                found.append((name, len(signature[0])))
    except Exception:  # a jaxlib that does not say
        return ()
    return tuple(found)


def _squeezed(name: str) -> str:
    """A program's name without what XLA and JAX change in it: "jit(<lambda>)" and XLA's
    "jit__lambda" are both "jitlambda"."""
    return re.sub(r"[\W_]", "", name)


def _nested_traces(events: list[tuple]) -> set[int]:
    """The indices of the trace events that ran inside a later one on their thread (jax 0.8.0
    reports each jnp function traced inside the user's): their seconds are in the outer's."""
    nested: set[int] = set()
    open_: dict[int, list[tuple[int, float]]] = {}  # per thread: (index, end) of outer ones
    for i, e in enumerate(events):
        if e[0] == "trace":
            _, thread, _, seconds, end = e
            outer = open_.setdefault(thread, [])
            while outer and outer[-1][1] > end - seconds:  # it ended after this one began
                nested.add(outer.pop()[0])
            outer.append((i, end))
    return nested


@functools.cache
def _primitive_names() -> frozenset[str]:
    """Names of JAX's primitives: what a jnp call outside jit compiles on its own."""
    from jax.extend import core

    return frozenset(p.name for p in vars(jax.lax).values() if isinstance(p, core.Primitive))


def _summarise(events: list[tuple], nested: set[int]) -> tuple[FunctionCompiles, ...]:
    """One entry per function (its name and the line it was defined on): each XLA compile is
    paired with the latest unpaired cache miss of a function of its name on its thread; misses
    left unpaired are traces that compiled nothing (a nested jit, jax.eval_shape). Compiles with
    no miss are eager operations (primitives) or compiles JAX did not explain. ``nested``: the
    trace events inside another (:func:`_nested_traces`), whose seconds are the outer's."""
    misses: dict[tuple[str, str], list[CacheMiss]] = {}
    seconds: dict[tuple[str, str], list[float]] = {}
    pending: dict[tuple[int, str], tuple[str, str]] = {}
    traced: dict[tuple[int, str], tuple[str, str]] = {}  # the latest function of a name
    placed: dict[tuple[str, str], list[str]] = {}  # its compiles without a trace: what changed
    lowerings: dict[tuple[int, str], tuple[str, str]] = {}  # the next compile's types, shardings
    lowered: dict[tuple[str, str], list[tuple[str, str]]] = {}  # each compile's, per function
    sizes: dict[tuple[int, str], int] = {}  # the next compile's jaxpr equations
    each_size: dict[tuple[str, str], list] = {}  # per function: each compile's, or None
    largest: dict[tuple[str, str], int] = {}  # per function: its largest jaxpr's equations
    loops: dict[tuple[int, str], tuple] = {}  # the next compile's unrolled line
    unrolled: dict[tuple[str, str], tuple] = {}  # per function: its largest jaxpr's
    unpaired: dict[str, list[float]] = {}
    eager_types: dict[str, list[str | None]] = {}  # per name compiled outside jit: its types
    kits: dict[tuple[int, str], list] = {}  # traces the kit made, unpaired: (miss, clears)
    clears: dict[tuple[str, str], list[int]] = {}  # per miss: the clears before it
    cleared_by: list[str] = []  # each clear, in order: "jax.clear_caches()", "jit(f).clear_cache()"
    cleared = 0
    primitives = _primitive_names()
    jnp_names: set[str] = set()  # jnp functions JAX jits itself, compiled outside jit
    logged = any(e[0] == "lowering" for e in events)  # JAX says what it lowers, in this JAX
    tracing: dict[tuple[int, str], list[float]] = {}  # [trace, lowering] s not yet compiled
    spent: dict = {}  # per function (or eager name): its compiles' [trace, lowering] seconds
    callers: dict[str, list[tuple[str, str, str]]] = {}  # per loop compiled outside jit
    libraries: set[tuple[str, str]] = set()  # functions jitted in a library's file
    warmed: dict[tuple[str, str], list[bool]] = {}  # per compile: asked for ahead of time
    cache_loads: dict[tuple[str, str], int] = {}  # per function: programs loaded from disk
    for i, event in enumerate(events):
        if event[0] in ("trace", "to_mlir"):
            _, thread, raw, s, _ = event
            if i not in nested:
                both = tracing.setdefault((thread, jaxcompat.compiled_function_name(raw)),
                                          [0.0, 0.0])
                both[event[0] == "to_mlir"] += s
        elif event[0] == "clear":
            cleared += 1
            cleared_by.append(event[1])
        elif event[0] == "lowering":
            _, thread, raw, types, shardings, size, loop = event
            lowerings[(thread, jaxcompat.compiled_function_name(raw))] = (types, shardings)
            if size is not None:
                sizes[(thread, jaxcompat.compiled_function_name(raw))] = size
            if loop is not None:
                loops[(thread, jaxcompat.compiled_function_name(raw))] = loop
        elif event[0] == "miss" and event[3]:  # the kit's trace: the user's if they compile it
            _, thread, m, _, _ = event
            kits.setdefault((thread, m.function), []).append((m, cleared))
        elif event[0] == "miss":
            _, thread, m, _, library = event
            key = (m.function, m.defined_at)
            if library:
                libraries.add(key)
            misses.setdefault(key, []).append(m)
            clears.setdefault(key, []).append(cleared)
            pending[(thread, m.function)] = traced[(thread, m.function)] = key
        else:
            _, thread, raw, s, caller, users, aot, jnps, from_cache = event
            name = jaxcompat.compiled_function_name(raw)
            took = tracing.pop((thread, name), [0.0, 0.0])
            key = pending.pop((thread, name), None)
            kit = kits.pop((thread, name), [])  # traced by the kit: only where one trace is
            if key is None and len(kit) == 1:  # pending (of several, which one is not known)
                ((m, at),) = kit
                key = traced[(thread, name)] = (m.function, m.defined_at)
                misses.setdefault(key, []).append(m)
                clears.setdefault(key, []).append(at)
            lowering = lowerings.pop((thread, name), None)
            size = sizes.pop((thread, name), None)
            loop = loops.pop((thread, name), None)
            again = traced.get((thread, name))
            if key is None and name not in primitives and seconds.get(again) and (
                    moved := _placement_change(lowering, lowered.get(again, []), logged)):
                # compiled before in the block with these types, and compiled again with no new
                # trace for other shardings of its arguments: committed or not, another device
                # (a jax.grad or jax.vmap of it also compiles with no miss: other types, or the
                # same shardings, so not this)
                seconds[again].append(s)
                placed.setdefault(again, []).append(moved)
                key = again
            elif key is None:
                name = f"jit({name})" if users else name  # (not a primitive's name, so not eager)
                if jnps:
                    jnp_names.add(name)
                unpaired.setdefault(name, []).append(s)
                eager_types.setdefault(name, []).append(lowering[0] if lowering else None)
                if caller is not None:
                    callers.setdefault(name, []).append(caller)
                key = name
            else:
                seconds.setdefault(key, []).append(s)
                warmed.setdefault(key, []).append(aot)
                cache_loads[key] = cache_loads.get(key, 0) + bool(from_cache)
                each_size.setdefault(key, []).append(size)
                if lowering is not None:
                    lowered.setdefault(key, []).append(lowering)
                if size is not None and size >= largest.get(key, 0):
                    largest[key] = size
                    if loop is not None:
                        unrolled[key] = loop
                    else:
                        unrolled.pop(key, None)
            total = spent.setdefault(key, [0.0, 0.0])
            total[0], total[1] = total[0] + took[0], total[1] + took[1]
    out = [_entry(key, mine, seconds.get(key, []), clears[key], placed.get(key, []), cleared_by,
                  [t for t, _ in lowered.get(key, [])], spent.get(key, [0.0, 0.0]),
                  library=key in libraries, equations=largest.get(key, NOT_AVAILABLE),
                  unrolled=unrolled.get(key), ahead=sum(warmed.get(key, [])),
                  ahead_first=bool(warmed.get(key)) and warmed[key][0]
                  and not all(warmed[key]), sizes=each_size.get(key, []),
                  cache_loads=cache_loads.get(key, 0))
           for key, mine in misses.items()
           if key[0] or seconds.get(key)]  # (JAX's own nameless inner jit, traced inside the
    # user's function and compiled with it, as jnp.einsum's: "never seen function: <unknown>")
    for label in (EAGER, UNEXPLAINED):
        names = {n: v for n, v in unpaired.items()
                 if (n in primitives or n in jnp_names) == (label == EAGER)}
        if names:
            counts = sorted(((n, len(v)) for n, v in names.items()), key=lambda kv: -kv[1])
            out.append(FunctionCompiles(
                function=label, defined_at="", compiles=sum(c for _, c in counts), traces=0,
                compile_seconds=sum(sum(v) for v in names.values()), cause=label,
                changed=tuple(f"{n} ×{c}" for n, c in counts[:6]), called_at=(),
                fix="move jnp calls inside the jitted function" if label == EAGER else "",
                jax_says="", most_of_one=counts[0][1],
                same_types_again=(repeated := tuple(n for n, _ in counts if label == EAGER
                                                    and _repeated(eager_types[n]))),
                trace_seconds=sum(spent[n][0] for n in names),
                lowering_seconds=sum(spent[n][1] for n in names),
                loop_callers=tuple(dict.fromkeys(c for n in repeated if n in _LOOPS
                                                 for c in callers.get(n, [])))[:3],
                passed_anew=() if label == EAGER else tuple(
                    hit for n, _ in counts
                    if (hit := _anew(n, callers.get(n, []), eager_types.get(n, [])))),
                eager_seconds=tuple(sorted(((n, sum(v)) for n, v in names.items()),
                                           key=lambda kv: -kv[1])) if label == EAGER else ()))
    return tuple(sorted(out, key=lambda f: (f.cause in (EAGER, UNEXPLAINED), -f.compiles,
                                            f.function)))


def _anew(name: str, seen: list[tuple], types: list) -> tuple[str, str, str] | None:
    """(``name``, the function, the line) where two or more compiles of ``name``, each for the
    same argument types (new shapes are their own cause: a review), came from one line of the
    user's that passed a function which was a new object each time, made by the same code (or
    a lambda written on that line); None otherwise."""
    passed = [c for c in seen if c and c[0] == "passed" and c[1]]
    if len(passed) < 2 or len({c[1] for c in passed}) != 1 or None in types or \
            len(set(types)) != 1:
        return None
    per: dict[str, set] = {}
    codes: dict[str, set] = {}
    for _, _, found in passed:
        for fn, ident, code in found:
            per.setdefault(fn, set()).add(ident)
            codes.setdefault(fn, set()).add(id(code))
    for fn, idents in per.items():
        if fn == "lambda" or (len(idents) == len(passed) and len(codes[fn]) == 1):
            return (name, fn, passed[0][1])
    return None


#: operations that carry a jaxpr of the user's: compiled outside jit, their body with them
_LOOPS = ("while", "scan", "cond")
#: operations whose program bakes in the shape they make from a scalar or nothing (jnp.zeros
#: is a broadcast_in_dim of 0, jnp.arange an iota): a new size, the same argument types
_SHAPE_MAKERS = ("broadcast_in_dim", "iota")


def _repeated(types: list[str | None]) -> bool:
    """Two compiles with the same argument types, where JAX said them (its lowering log); not
    for an operation of no argument (iota, a creation: its shape is what it bakes in)."""
    known = [t for t in types if t is not None and t.strip("()[], ")]
    return len(set(known)) < len(known)


def _placement_change(lowering: tuple[str, str] | None, before: list[tuple[str, str]],
                      logged: bool) -> str:
    """What changed when a function that compiled before compiles again with no cache miss:
    for the argument types of one of its earlier compiles with other shardings (committed or
    not), or, where JAX lowered nothing new (it logs each new lowering, and logged others in
    this block), the same program for other devices. "" otherwise (a jax.grad or jax.vmap of
    it lowers other types, or the same shardings): no new placement."""
    if lowering is None:
        return ("the same program compiled again for other devices (JAX lowered nothing new)"
                if logged and before else "")
    types, shardings = lowering
    earlier = [m for t, m in before if t == types]
    if not earlier or shardings in earlier:
        return ""
    now, then, leaves = (_items(shardings), _items(earlier[-1]), _items(types))
    if len(now) == len(then) and now:  # the leaves whose placement changed, each in a few words
        moved = [f"the arguments' leaf {i + 1} of {len(now)} (jax.tree.leaves order"
                 f"{f', {_array_type(leaves[i])}' if len(leaves) == len(now) else ''}): "
                 f"{_placed(a)}, before {_placed(b)}"
                 for i, (a, b) in enumerate(zip(now, then, strict=True)) if a != b]
        if moved:
            return "; ".join(moved[:3]) + (f"; and {len(moved) - 3} more" if len(moved) > 3
                                           else "")
    return f"argument shardings now {_shardings(shardings)}, before {_shardings(earlier[-1])}"


def _items(text: str) -> list[str]:
    """The items of JAX's printed tuple or list, "(A(x, y), B)": ["A(x, y)", "B"]."""
    text = text.strip()
    if text[:1] not in "([" or text[-1:] not in ")]":
        return []
    out, depth, start = [], 0, 1
    for i, ch in enumerate(text[1:-1], 1):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:-1].strip())
    return [o for o in out if o]


_SPEC = re.compile(r"spec=(P\(.*?\)|PartitionSpec\(.*?\))(?:, memory_kind|\)$)")


def _placed(item: str) -> str:
    """One argument's sharding as JAX prints it, in a few words: "split P('model',)",
    "replicated P()", "committed to cpu:0", "uncommitted"."""
    if (m := _SPEC.search(item)) and item.startswith("NamedSharding"):
        spec = "P(" + m.group(1).split("(", 1)[1]  # (PartitionSpec(...) on jax 0.8.0)
        return f"{'replicated' if spec == 'P()' else 'split'} {spec}"
    return _shardings(item)


def _array_type(item: str) -> str:
    """"ShapedArray(float32[1024])" as "float32[1024]"."""
    m = re.search(r"\((\w+\[[\d,]*\])", item)
    return m.group(1) if m else item[:40]


_ONE_DEVICE = re.compile(r"SingleDeviceSharding\(device=(\w+?)Device\(id=(\d+)\)[^()]*\)")


def _shardings(text: str) -> str:
    """JAX's "(UnspecifiedValue, SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=
    device))" in a few words: "(uncommitted, committed to cpu:0)"."""
    text = _ONE_DEVICE.sub(lambda m: f"committed to {m.group(1).lower()}:{m.group(2)}", text)
    return text.replace("UnspecifiedValue", "uncommitted")[:200]


#: the fix for one name and line compiled several times, each a function JAX had never seen:
#: two objects alive at once (jax.jit(foo.f) at two call sites on jax 0.12.0.1: jax-ml/jax#19570;
#: jax.jit(cost) beside jax.jit(jax.grad(cost)), two programs meant: scikit-robot#871)
SEVERAL_FIRST_FIX = (
    "JAX's cache is keyed by the function object. Where these are different functions "
    "(jax.jit(f) beside jax.jit(jax.grad(f)): two programs, each compiled once), nothing is "
    "to change; where one function was meant, jax.jit of a bound method (obj.method) or of a "
    "closure made again is a new one each time: jit it once and call that (in __init__, "
    "self.f = jax.jit(self.f); jax-ml/jax#19570)")


#: the fix where an argument's split changed between two calls of a step: where the state the
#: step returns is passed back, XLA chose its sharding (keras-team/keras-core#832: a replicated
#: bias and its optimizer moment came back split over 'model', the step compiled twice)
FED_BACK_FIX = (
    "where the argument is the step's own output passed back (state = step(state)), XLA "
    "chose that output's sharding: pin it in the step, jax.jit(step, out_shardings=...) with "
    "the shardings the state went in with, or jax.lax.with_sharding_constraint on what it "
    "returns, so it comes back as it went in (keras-team/keras-core#832: 2 compiles to 1, no "
    "copy); a jax.device_put before each call would copy it every step instead. Otherwise "
    "jax.device_put the arguments once, before the loop, the same way every call")


#: a call site that transforms what it calls from outside jit (jax.hessian(jf)(x))
_TRANSFORM_CALL = re.compile(r"\bjax\.(?:hessian|jacfwd|jacrev|jacobian|vmap|grad|value_and_grad|"
                             r"jvp|vjp|linearize)\(")
_MISS_AT = re.compile(r"CACHE MISS at (.+?):(\d+):\d+")
#: the fix for a jitted function transformed from outside jit: each transformation of it is a
#: program of its own (jax-ml/jax#7621: jax.hessian(jax.jit(f)), 29 compiles over the first
#: calls, the eager operations of the transformation among them; jax.jit(jax.hessian(f)) one)
TRANSFORMED_FIX = (
    "the call at {site} transforms a jitted function from outside jit ({code}): JAX traces "
    "and compiles the jitted function again for each transformation around it (here with "
    "tangents or a batch beside its own arguments: the shapes it was compiled for), and runs "
    "the transformation's own operations outside jit one by one, so the first calls compile "
    "several programs; later calls reuse them. Put jit outside the transformation, "
    "jax.jit(jax.hessian(f)), and one program does it all (jax-ml/jax#7621)")


def _transformed_outside(misses: Sequence[CacheMiss]) -> tuple[str, str] | None:
    """(the call site, its code) where every miss comes from a line that applies a JAX
    transformation to what it calls, outside jit (jax.hessian(jf)(x)); None otherwise."""
    import linecache

    sites = {(m.group(1), int(m.group(2))) for x in misses
             if (m := _MISS_AT.search(x.explanation))}
    if len(sites) != 1 or len(misses) < 2:
        return None
    ((file, line),) = sites
    code = linecache.getline(file, line).strip()
    if not _TRANSFORM_CALL.search(code) or "jit(" in code:
        return None
    return frames.where(file, line), code


#: JAX's words in a tracing-cache miss for a function object it has no cache for, and its id
_NEVER_SEEN = re.compile(r"never seen function:\s*\n?\s*\S+ id=(\d+)")


def _entry(key: tuple[str, str], mine: list[CacheMiss], seconds: list[float],
           clears: list[int] | None = None, placed: list[str] | None = None,
           cleared_by: list[str] | None = None, types: list[str] | None = None,
           spent: list[float] | None = None, *, library: bool = False,
           equations: int | NotAvailable = NOT_AVAILABLE,
           unrolled: tuple | None = None, ahead: int = 0,
           ahead_first: bool = False, sizes: Sequence[int | None] = (),
           cache_loads: int = 0) -> FunctionCompiles:
    # "made anew" needs a second function of this name and line in the block: JAX remembers
    # call sites for the whole process, so one miss alone may be another function's line
    causes = [m.cause for m in mine if m.cause != "first compile"
              and (m.cause != "function made anew" or len(mine) > 1)]
    ids = {m.group(1) for m in (_NEVER_SEEN.search(x.explanation) for x in mine) if m}
    if not causes and len(mine) > 1 and len(ids) == 1 and all(
            _NEVER_SEEN.search(m.explanation) for m in mine):
        # each call site's first call, yet one name, line and object id: a function object
        # made anew at each and freed in between (jax.jit(foo.f) at two call sites, a bound
        # method each time: jax-ml/jax#19570, where `self.f = self.f` compiles once). Two
        # functions alive at once (jax.jit(cost) and jax.jit(jax.grad(cost)), scikit-robot#871's
        # fix) have two ids: each a first compile
        causes = ["function made anew"] * (len(mine) - 1)
    placed = placed or []
    causes += ["new placement"] * len(placed)
    # a tie goes to what JAX says changed where the one "made anew" is the block's first miss:
    # the first call after f.clear_cache(), JAX having kept the call site from an earlier
    # block (numpyro#463); a "made anew" later in the block is a jit made anew in the loop
    first_only = [m for m in mine if m.cause == "function made anew"] == mine[:1]
    cause = (max(causes, key=lambda c: (causes.count(c),
                                        not (first_only and c == "function made anew"),
                                        -CAUSES.index(c))) if causes else "first compile")
    clearing: tuple[str, ...] = ()
    fresh = ()
    if cause == "function made anew" and len(ids) == len(mine) == len(sizes) > 1 and \
            None not in sizes and len(set(sizes)) == len(sizes):
        # each a function object of its own (JAX's ids), each a program of another size: not
        # one function made anew, whose programs are alike, but several that share a name and
        # line, as jax.jacfwd(B) and jax.jacfwd(jax.jacfwd(B)) share B's (uwplasma/vmex#374:
        # four derivatives jitted once each, "made anew", and a second pass compiled none)
        cause = "first compile"
    cleared = cause == "function made anew" and _cleared_between(mine, clears or [])
    if cause == "function made anew" and _each_new(types or [], len(seconds)):
        # each compile lowered argument types no earlier one had: making the function once
        # saves no compile, and keeps every shape's program alive with it (jax-ml/jax#7930);
        # nor would a clear between them, if any, have cost one (diffsky#244)
        cause, fresh = "new shapes", tuple(_short_types(t) for t in (types or []))
    elif cleared:
        cause = "caches cleared"  # JAX's "never seen" of a function object it had seen
        first, last = (clears or [0])[0], (clears or [0])[-1]
        clearing = tuple(dict.fromkeys((cleared_by or [])[first:last]))
    said = next((m.explanation for m in mine if m.cause in (cause, "function made anew")), "")
    return FunctionCompiles(
        function=key[0], defined_at=key[1], compiles=len(seconds), traces=len(mine),
        compile_seconds=sum(seconds), cause=cause,
        called_at=tuple(dict.fromkeys(m.called_at for m in mine if m.called_at))[:5],
        changed=(f"{len(placed)} of them with no new trace, for the same argument types",
                 *dict.fromkeys(placed)) if cause == "new placement" else
        clearing or fresh[:6] or what_changed(mine, cause),
        fix=TRANSFORMED_FIX.format(site=transformed[0], code=transformed[1])
        # (only where each compile had new types: a jit made anew inside the transformed
        # function compiles the same types every call, patrick-kidger/equinox#307)
        if cause == "new shapes" and (transformed := _transformed_outside(mine)) else
        SEVERAL_FIRST_FIX if cause == "first compile" and len(seconds) > 1 else
        # a leaf whose split changed between two calls: the step's own output passed back
        FED_BACK_FIX if cause == "new placement" and any(
            re.search(r": (split|replicated) P\(.*, before (split|replicated) P\(", m)
            for m in placed) else
        # (compiled ahead of time for other shardings: where no narrower fix applies, the
        # ShapeDtypeStructs it was lowered with, not a put before the loop: a review)
        AHEAD_SHARDING_FIX if cause == "new sharding" and ahead_first and fix_for(
            mine, cause, through_library=library) == FIXES["new sharding"] else
        (AHEAD_WEAK_FIX if weak_now(mine) else AHEAD_TYPED_FIX)
        if ahead_first and weak_now(mine) is not None and fix_for(
            mine, cause, through_library=library) == WEAK_FIX else
        fix_for(mine, cause, new_types_each_call=bool(fresh) and not cleared,
                through_library=library) + (CLEARED_NEW_SHAPES if fresh and cleared else ""),
        jax_says=" ".join(line.strip() for line in said.splitlines()[1:])[:300],
        trace_seconds=(spent or [0.0, 0.0])[0], lowering_seconds=(spent or [0.0, 0.0])[1],
        library=library, jaxpr_equations=equations, ahead_of_time=ahead,
        cache_loads=cache_loads,
        **({} if unrolled is None else {
            "unrolled_line": frames.line(*unrolled[0]), "unrolled_equations": unrolled[1],
            "unrolled_repeats": unrolled[3], "unrolled_gathers": unrolled[4],
            "unrolled_alike": unrolled[5], "unrolled_kind": unrolled[6],
            "unrolled_scalars": unrolled[7]}))


def _seconds_spent(f: FunctionCompiles) -> str:
    """ "7.83 s of compiling", with JAX's tracing and lowering where they took 0.1 s or more."""
    traced = f.trace_seconds + f.lowering_seconds
    return (f"{traced:.2f} s of tracing and lowering, {f.compile_seconds:.2f} s of compiling"
            if traced >= 0.1 else f"{f.compile_seconds:.2f} s of compiling")


def _each_new(types: list[str], compiles: int) -> bool:
    """Two or more compiles, each with argument types (JAX's lowering log) no earlier one had,
    weak types aside (a Python scalar's weak float32 is the same shape as a float32)."""
    shapes = {t.replace(", weak_type=True", "") for t in types}
    return compiles >= 2 and len(types) == compiles and len(shapes) == len(types)


_SHAPED = re.compile(r"ShapedArray\(([^()]*)\)")


def _short_types(types: str) -> str:
    """JAX's "(ShapedArray(float32[200,200]),)" as "float32[200,200]"."""
    found = _SHAPED.findall(types)
    return ", ".join(found)[:120] if found else types[:120]


_FUNCTION_ID = re.compile(r"\bid=(\d+)")


def _cleared_between(misses: list[CacheMiss], clears: list[int]) -> bool:
    """Each "never seen function" miss after the first names the same function object (JAX's
    ``id=``) as the one before it, with a jax.clear_caches() call in between: not a function
    made anew, but one whose cache was emptied (jax#19429). (An id alone can recur: Python
    gives a new function the address of one just freed.)"""
    seen = [(m.group(1), n) for x, n in zip(misses, clears, strict=True)
            if (m := _FUNCTION_ID.search(x.explanation))]
    pairs = zip(seen, seen[1:], strict=False)
    return len(seen) >= 2 and all(a == b and n < k for (a, n), (b, k) in pairs)
