"""Why a function does not trace: trace_errors.trace_error_fix reads JAX's error and the user's
line, and each fix it names is run here and traces."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import preflight, trace_errors
from helpers.errors import BadInputError


def _error(fn, *args) -> BaseException:
    with pytest.raises(TypeError) as info:  # JAX's trace errors are TypeErrors
        fn(*args)
    return info.value


@functools.partial(jax.jit, static_argnums=0)
def add1(i):
    return i + 1


@functools.partial(jax.jit, static_argnums=0)
def arange_of_add1(k):
    return jnp.arange(add1(k))


def test_jax_35090_a_jit_helper_s_result_is_named_not_control_flow():
    """jax-ml/jax#35090: a static k passed through a jitted helper add1 comes back traced, and
    jnp.arange(add1(k)) fails. The kit said "Python control flow (if, while, int(), bool()) on
    a traced value ... or mark that argument static", where there is no control flow and k is
    static already (a new user's trial). JAX's error names no argument; the failing line calls
    a jax.jit function, found by looking its name up in that frame."""
    fix = trace_errors.trace_error_fix(_error(arange_of_add1, 5))
    assert fix.startswith("add1 is a jax.jit function: inside another trace its result is a "
                          "traced value, even where its own arguments are static"), fix
    assert "(jnp.arange argument 'stop')" in fix and "add1.__wrapped__" in fix
    assert "jax-ml/jax#35090" in fix and "control flow" not in fix
    with pytest.raises(BadInputError) as info:
        preflight.preflight_step(arange_of_add1, 5, static_argnums=0)
    said = str(info.value)
    assert "Why: add1 is a jax.jit function" in said and "control flow" not in said
    assert "mark that argument static" not in said

    @functools.partial(jax.jit, static_argnums=0)
    def fixed(k):
        return jnp.arange(add1.__wrapped__(k))
    assert fixed(5).shape == (6,)  # the fix traces


def test_jax_5208_a_size_made_with_jnp_from_python_numbers_is_named_with_its_line():
    """jax-ml/jax#5208: a grid's size computed with jnp from Python numbers inside jit is a
    traced value, and jnp.linspace(..., num) fails; the function has no argument at all, yet
    the kit said "mark that argument static". JAX's error lists the operations and their
    lines; the fix is Python or NumPy."""
    t0, tf, dt = 0.0, 1.0, 0.1

    @jax.jit
    def grid():
        steps = jnp.ceil((tf - t0) / dt).astype(int)
        return jnp.linspace(t0, tf, steps + 1)

    fix = trace_errors.trace_error_fix(_error(grid))
    assert fix.startswith("the value is made by JAX operations on Python numbers (at "
                          "test_trace_errors.py:"), fix
    assert "Compute it with Python or NumPy" in fix and "static" not in fix

    @jax.jit
    def fixed():
        steps = int(np.ceil((tf - t0) / dt))
        return jnp.linspace(t0, tf, steps + 1)
    assert fixed().shape == (11,)


def test_a_python_if_on_an_argument_names_it_and_its_static_name():
    @jax.jit
    def clip(x, limit):
        if limit > 0:
            return jnp.minimum(x, limit)
        return x

    fix = trace_errors.trace_error_fix(_error(clip, jnp.ones(3), 1.0))
    assert fix.startswith("the value depends on 'limit', which jit traces, and Python's if, "
                          "while or bool() needs it concrete"), fix
    assert "static_argnames=('limit',)" in fix and "jnp.where" in fix
    assert jax.jit(clip.__wrapped__, static_argnames=("limit",))(jnp.ones(3), 0.5)[0] == 0.5


def test_a_python_if_on_an_array_is_not_told_to_make_the_array_static():
    """An array cannot be static (it is not hashable): the fix is jnp.where or lax.cond."""
    @jax.jit
    def step(x):
        if x.sum() > 0:
            return x
        return -x

    fix = trace_errors.trace_error_fix(_error(step, jnp.ones(3)))
    assert "'x' is float32[3], an array: it cannot be made static" in fix, fix
    assert "static_argnames" not in fix and "jnp.where" in fix
    with pytest.raises(ValueError, match="hashable"):  # why: JAX refuses it as static
        jax.jit(step.__wrapped__, static_argnums=0)(jnp.ones(3))


def test_a_shape_from_an_argument_names_the_argument_and_what_needed_it():
    @jax.jit
    def ramp(n):
        return jnp.arange(n)

    fix = trace_errors.trace_error_fix(_error(ramp, 5))
    assert fix.startswith("the value depends on 'n', which jit traces, and it sets a shape "
                          "(jnp.arange argument 'stop')"), fix
    assert "static_argnames=('n',)" in fix
    assert jax.jit(ramp.__wrapped__, static_argnames=("n",))(5).shape == (5,)

    @jax.jit
    def zeros(x, n):
        return jnp.zeros((n, 3)) + x

    fix = trace_errors.trace_error_fix(_error(zeros, 1.0, 3))  # a plain TypeError from jnp
    assert fix.startswith("the value depends on 'n', which jit traces, and it sets a shape"), fix


def test_a_size_made_from_an_array_s_values_gets_a_fixed_bound():
    """jax.nn.one_hot(x, x.max() + 1): the size comes from an array's values, which no static
    argument can carry; the fix is a number for num_classes (or a size= bound)."""
    @jax.jit
    def encode(x):
        return jax.nn.one_hot(x, x.max() + 1)

    fix = trace_errors.trace_error_fix(_error(encode, jnp.arange(3)))
    assert "'x' is int32[3], an array: it cannot be made static" in fix, fix
    assert "a shape is made from its values" in fix and "Compute the size outside jit" in fix
    assert jax.jit(lambda x: jax.nn.one_hot(x, 3))(jnp.arange(3)).shape == (3, 3)


def test_int_of_an_argument_and_numpy_of_an_argument_get_their_own_fixes():
    @jax.jit
    def pick(x, i):
        return [1.0, 2.0, 3.0][i] * x

    fix = trace_errors.trace_error_fix(_error(pick, 1.0, 1))
    assert "int() or an index into a Python list" in fix and "static_argnames=('i',)" in fix

    @jax.jit
    def sine(x):
        return np.sin(x)

    fix = trace_errors.trace_error_fix(_error(sine, 1.0))
    assert "NumPy (np.asarray, np.* or a library built on it) needs its value" in fix, fix
    assert "Use jnp's function instead" in fix and "static" not in fix


def test_two_arguments_are_both_named_and_other_errors_get_nothing():
    @jax.jit
    def pick(x, y):
        if x + y > 0:
            return x
        return y

    fix = trace_errors.trace_error_fix(_error(pick, 1.0, 2.0))
    assert "depends on 'x' and 'y'" in fix and "static_argnames=('x', 'y')" in fix
    assert "mark them static" in fix
    assert trace_errors.trace_error_fix(TypeError("unsupported operand")) == ""
    assert trace_errors.trace_error_fix(ValueError("Shapes must be 1D sequences")) == ""


def test_jax_6350_segment_sum_without_num_segments_is_named_and_its_fix_traces():
    """jax-ml/jax#6350: jax.jit(jax.ops.segment_sum)(data, ids) fails, since with no
    num_segments JAX takes max(ids) + 1. The kit advised static_argnames=('segment_ids',),
    which raises for an array (unhashable), the dead end the user met in the thread (a new
    user's trial). JAX's own words name the argument; the fix, a static num_segments, runs."""
    data, ids = np.arange(12).reshape(3, 4), np.array([0, 0, 1])
    fix = trace_errors.trace_error_fix(_error(jax.jit(jax.ops.segment_sum), data, ids))
    assert "given no num_segments" in fix and "segment ids' largest value" in fix, fix
    assert "static_argnames=('num_segments',)" in fix and "segment_ids'" not in fix
    fixed = jax.jit(jax.ops.segment_sum, static_argnames=("num_segments",))
    np.testing.assert_array_equal(fixed(data, ids, num_segments=2),
                                  jax.ops.segment_sum(data, ids))


def test_a_value_needed_from_an_array_is_not_told_to_make_the_array_static():
    """A concrete value computed from an array argument (jnp.split at traced indices): the kit
    said "Mark it static", which raises for an array. The traced function's frame is read
    (a library's too, as in jax.jit(jax.ops.segment_sum)) to see that it is an array."""
    def split(x, idx):
        return jnp.split(x, idx)

    fix = trace_errors.trace_error_fix(_error(jax.jit(split), jnp.arange(10.0),
                                              jnp.array([2, 5])))
    assert "'idx' is int32[2], an array: it cannot be made static" in fix, fix
    assert "static_argnames=('idx'" not in fix and "static Python value" in fix
    fixed = jax.jit(split, static_argnames=("idx",))  # the fix: a tuple, static
    assert [p.shape for p in fixed(jnp.arange(10.0), idx=(2, 5))] == [(2,), (3,), (5,)]


def test_jax_8299_bcoo_fromdense_under_jit_and_vmap_is_named_with_nse():
    """jax-ml/jax#8299 (a new user's trial): BCOO.fromdense(A) inside jit or vmap fails, since
    nse is counted from the data. JAX's message names nse; the kit's answer was generic under
    jit and nothing under vmap (no argument named: a BatchTracer). nse= runs under both."""
    from jax.experimental import sparse

    A = jnp.eye(4)
    for transform in (jax.jit, jax.vmap):
        fn = transform(sparse.BCOO.fromdense)
        arg = A if transform is jax.jit else A[None]
        fix = trace_errors.trace_error_fix(_error(fn, arg))
        assert fix.startswith("bcoo_fromdense needs its nse argument as a Python value"), fix
        assert "BCOO.fromdense(A, nse=k)" in fix
    assert jax.jit(lambda a: sparse.BCOO.fromdense(a, nse=4))(A).todense().sum() == 4
    assert jax.vmap(lambda a: sparse.BCOO.fromdense(a, nse=4))(A[None]).nse == 4


def test_a_num_segments_or_nse_passed_traced_names_the_user_s_own_argument():
    """A review: JAX's words name `num_segments` (and nse) also where the user passed one,
    traced; the kit then said "given no num_segments" with static_argnames=('num_segments',),
    where the argument to make static is the user's own `n` (JAX says so), which runs."""
    from jax.experimental import sparse

    def f(data, ids, n):
        return jax.ops.segment_sum(data, ids, num_segments=n)

    def g(a, k):
        return sparse.BCOO.fromdense(a, nse=k).todense()

    data, ids = jnp.ones(3), jnp.array([0, 0, 1])
    fix = trace_errors.trace_error_fix(_error(jax.jit(f), data, ids, 2))
    assert "static_argnames=('n',)" in fix and "given no num_segments" not in fix, fix
    fix = trace_errors.trace_error_fix(_error(jax.jit(g), jnp.eye(3), 3))
    assert "static_argnames=('k',)" in fix and "left out" not in fix, fix
    assert jax.jit(f, static_argnames="n")(data, ids, n=2).shape == (2,)
    assert jax.jit(g, static_argnames="k")(jnp.eye(3), k=3).shape == (3, 3)


def test_jax_5280_nonzero_under_jit_is_named_with_size_and_its_fix_traces():
    """jax-ml/jax#5280 (a new user's trial, the real edges of a padded graph): the kit said
    "compute that value outside jit and pass it in as a static Python value", which compiles
    once per count (12 compiles for 12 batches). JAX's words name jnp.nonzero's size=."""
    def edges(mask):
        return jnp.nonzero(mask)[0]

    mask = jnp.array([True, False, True, True])
    fix = trace_errors.trace_error_fix(_error(jax.jit(edges), mask))
    assert fix.startswith("jnp.nonzero returns as many elements as it finds"), fix
    assert "size=k, fill_value=" in fix and "static" not in fix and "5280" in fix
    fixed = jax.jit(lambda m: jnp.nonzero(m, size=4, fill_value=-1)[0])(mask)
    assert fixed.tolist() == [0, 2, 3, -1]


def test_jax_21994_a_boolean_mask_as_an_index_under_jit_is_named_and_its_fix_traces():
    """jax-ml/jax#21994 (a new user's trial, padding nodes zeroed and a readout over the real
    ones): NonConcreteBooleanIndexError got nothing from the kit. Each form gets its select."""
    nodes, mask = jnp.arange(12.0).reshape(4, 3), jnp.array([True, False, True, True])
    with pytest.raises(IndexError) as zeroed:
        jax.jit(lambda x, m: x.at[~m].set(0.0))(nodes, mask)
    fix = trace_errors.trace_error_fix(zeroed.value)
    assert "jnp.where(mask, v, x) instead of x.at[mask].set(v)" in fix and "21994" in fix, fix
    assert "mask[:, None] where it picks rows of x" in fix  # a review: (4,) against (4, 3)
    with pytest.raises(IndexError) as added:
        jax.jit(lambda x, m: x.at[m].add(1.0))(nodes, mask)
    fix = trace_errors.trace_error_fix(added.value)  # a review: not the set's, which overwrites
    assert "jnp.where(mask, x + v, x) instead of x.at[mask].add(v)" in fix, fix
    with pytest.raises(IndexError) as got:  # a second review: a read, not an update
        jax.jit(lambda x, m: x.at[m].get())(nodes, mask)
    assert "x.at[:].get(v)" not in trace_errors.trace_error_fix(got.value)
    with pytest.raises(IndexError) as nested:  # a mask with brackets of its own
        jax.jit(lambda x, m: x.at[m[:, 0]].add(1.0))(nodes, jnp.stack([mask, mask], 1))
    assert "x.at[mask].add(v)" in trace_errors.trace_error_fix(nested.value)
    rows = jax.jit(lambda x, m: jnp.where(m[:, None], x + 1.0, x))(nodes, mask)
    assert rows.tolist() == np.where(np.asarray(mask)[:, None], nodes + 1, nodes).tolist()
    with pytest.raises(IndexError) as read:
        jax.jit(lambda x, m: x[m].mean(0))(nodes, mask)
    fix = trace_errors.trace_error_fix(read.value)
    assert "jnp.where(mask, x, 0).sum() / mask.sum()" in fix, fix
    readout = jax.jit(lambda x, m: jnp.where(m[:, None], x, 0).sum(0) / m.sum())(nodes, mask)
    assert np.allclose(readout, nodes[np.array(mask)].mean(0))
    zero = jax.jit(lambda x, m: jnp.where(m[:, None], x, 0.0))(nodes, mask)
    assert zero[1].tolist() == [0.0, 0.0, 0.0]


def test_jnp_unique_under_jit_is_named_with_its_size_not_as_an_argument_to_pass():
    """A review: jnp.unique's words ("arose for the first argument of jnp.unique()") were read
    as an argument to pass yourself ("Pass first= yourself"); its fix is size=, which traces."""
    fix = trace_errors.trace_error_fix(_error(jax.jit(jnp.unique), jnp.array([3, 1, 3])))
    assert fix.startswith("jnp.unique returns as many elements as it finds"), fix
    assert "first=" not in fix
    assert jax.jit(lambda x: jnp.unique(x, size=3, fill_value=0))(
        jnp.array([3, 1, 3])).tolist() == [1, 3, 0]


def test_an_if_on_a_value_vmap_batches_is_named_with_a_select():
    """A new user's trial (jaxopt#422's call): an `if` under jax.vmap raised and the kit said
    nothing (JAX names no argument there, only a BatchTracer)."""
    def f(x):
        if x > 0:
            return x
        return -x

    fix = trace_errors.trace_error_fix(_error(jax.vmap(f), jnp.array([1.0, -2.0])))
    assert fix.startswith("under jax.vmap the value is batched, one per element"), fix
    assert "jnp.where(cond, a, b)" in fix and "test_trace_errors.py:" in fix
    assert jax.vmap(lambda x: jnp.where(x > 0, x, -x))(jnp.array([1.0, -2.0])).tolist() == [
        1.0, 2.0]


_LIBRARY = '''
import numpy as np
import jax.numpy as jnp


def bisect(f, lower, upper, check_bracket=True, **kwargs):
    if check_bracket:
        sign = jnp.sign(f(lower, **kwargs)) * jnp.sign(f(upper, **kwargs))
        if sign == 0:
            raise ValueError("a root at an end of the bracket")
    for _ in range(30):
        mid = (lower + upper) / 2
        go_left = jnp.sign(f(mid, **kwargs)) == jnp.sign(f(upper, **kwargs))
        lower, upper = jnp.where(go_left, lower, mid), jnp.where(go_left, mid, upper)
    return (lower + upper) / 2


def minimize(fun, x0):
    return np.asarray(x0, np.float64) * 0.0 + fun(x0)
'''


@pytest.fixture
def fakeopt(tmp_path, monkeypatch):
    """A library installed in a site-packages folder, as the trials' copy of jaxopt was."""
    # a venv's layout, where the standard library's folder (platstdlib) holds site-packages
    # too: a review found every installed package read as the standard library there
    stdlib = tmp_path / "lib" / "python3"
    folder = stdlib / "site-packages" / "fakeopt"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(_LIBRARY)
    from helpers._internal import frames

    monkeypatch.setattr(frames, "_STANDARD", (*frames._STANDARD, str(stdlib)))
    monkeypatch.syspath_prepend(str(stdlib / "site-packages"))
    import importlib

    yield importlib.import_module("fakeopt")
    import sys

    sys.modules.pop("fakeopt", None)


def test_jaxopt_422_and_214_a_library_s_check_and_numpy_code_are_named_as_the_library_s(
        fakeopt):
    """google/jaxopt#422: Bisection's bracket check (a Python `if` of its own) under vmap got
    nothing, and under jit "mark it static", which fails again (the library computes the
    value from it with jnp). google/jaxopt#214: a function that runs jaxopt's SciPy wrapper
    under jit (np.asarray inside the library) got nothing. Each names the library's line and
    the thread's fix, which runs: check_bracket=False, and the call outside jit."""
    def F(x, factor):
        return factor * x ** 3 - x - 2

    def root(factor):
        return fakeopt.bisect(F, 1.0, 2.0, factor=factor)

    for call, factor in ((jax.vmap(root), jnp.array([2.0, 2.0])), (jax.jit(root), 2.0)):
        fix = trace_errors.trace_error_fix(_error(call, factor))
        assert fix.startswith("the code that needs a concrete value is fakeopt's, not yours "
                              "(at __init__.py:9: if sign == 0:)"), fix
        assert "check_bracket=False" in fix and "422" in fix
    with pytest.raises(TypeError):  # the static the kit had named: the library's if again
        jax.jit(root, static_argnames="factor")(2.0)
    fixed = jax.vmap(lambda c: fakeopt.bisect(F, 1.0, 2.0, check_bracket=False, factor=c))
    assert np.allclose(F(fixed(jnp.array([2.0, 1.0])), jnp.array([2.0, 1.0])), 0, atol=1e-5)

    @jax.jit
    def fit():  # no argument: JAX names none, only the library's np.asarray
        return fakeopt.minimize(lambda x: (x ** 2).sum(), jnp.ones(3))

    fix = trace_errors.trace_error_fix(_error(fit))
    assert fix.startswith("fakeopt converts the value to NumPy (at __init__.py:19:"), fix
    assert "Call it outside jit" in fix and "jaxopt#214" in fix
    assert fakeopt.minimize(lambda x: (x ** 2).sum(), jnp.ones(3)).tolist() == [3.0] * 3


def test_numpy_on_a_value_made_inside_jit_is_not_told_to_use_numpy():
    """A trial: a jitted function of no argument that passed jnp's result to np.asarray was
    told "compute it with Python or NumPy", the call that had failed."""
    @jax.jit
    def total():
        return np.asarray(jnp.ones(3) * 2).sum()

    fix = trace_errors.trace_error_fix(_error(total))
    assert fix.startswith("NumPy (np.asarray, np.* or a library built on it) needs a concrete "
                          "value"), fix
    assert "Compute it with Python or NumPy" not in fix and "Use jnp's function" in fix


def test_jax_4473_a_traced_scan_length_is_named_with_a_masked_maximum_that_traces():
    """jax-ml/jax#4473 (a new user's trial): length=time/dt under jit. The kit said "mark them
    static", and compiles.watch then said a static argument compiles once per value: a circle.
    It names scan's length and the masked fixed maximum, which compiles once and
    differentiates."""
    def roll(x, time, dt):
        n = jnp.divide(time, dt).astype(int)
        return jax.lax.scan(lambda c, _: (c * 0.9, c), x, None, length=n)[0]

    fix = trace_errors.trace_error_fix(_error(jax.jit(roll), 1.0, 1.0, 0.1))
    assert fix.startswith("lax.scan's length must be a Python int while tracing"), fix
    assert "'time' and 'dt'" in fix and "jnp.where(i < n, step(c), c)" in fix and "4473" in fix

    @jax.jit
    def masked(x, time, dt):
        n = jnp.divide(time, dt).astype(int)
        return jax.lax.scan(lambda c, i: (jnp.where(i < n, c * 0.9, c), None), x,
                            jnp.arange(64))[0]

    assert np.isclose(masked(1.0, 1.0, 0.1), 0.9 ** 10, rtol=1e-5)
    assert np.isclose(masked(1.0, 2.0, 0.1), 0.9 ** 20, rtol=1e-5)  # another n: no compile
    assert np.isclose(jax.grad(masked)(1.0, 1.0, 0.1), 0.9 ** 10, rtol=1e-5)


class _State(NamedTuple):  # a TrainState's shape, the rate a leaf
    params: jax.Array
    lr: jax.Array


def test_optax_932_a_learning_rate_batched_by_vmap_kept_in_a_closure_is_named_with_leaves():
    """google-deepmind/optax#932 (a new user's trial): train states made under jax.vmap, one
    learning rate each, whose tx (optax.adam(lr), in the state's static part) closed over the
    batched rate: UnexpectedTracerError at the next step, and the kit said nothing. It names
    the leak and the thread's fix, the rate as a leaf, which runs: one update per rate."""
    made = []

    def create(p, lr):
        made.append(lambda g: p - lr * g)  # the optimizer closes over the batched rate
        return p

    lrs = jnp.array([0.1, 0.2, 0.3])
    jax.vmap(create)(jnp.ones((3, 2)), lrs)
    with pytest.raises(jax.errors.UnexpectedTracerError) as info:
        made[0](jnp.ones(2))
    fix = trace_errors.trace_error_fix(info.value)
    assert fix.startswith("a value batched by jax.vmap (one per element) was kept past the "
                          "vmap"), fix
    assert "and then used at test_trace_errors.py:" in fix and "optax.inject_hyperparams" in fix
    assert "google-deepmind/optax#932" in fix

    states = jax.vmap(lambda p, lr: _State(p, lr))(jnp.ones((3, 2)), lrs)  # the rate a leaf
    step = jax.jit(jax.vmap(lambda s, g: s._replace(params=s.params - s.lr * g),
                            in_axes=(0, None)))
    after = step(states, jnp.ones(2))
    np.testing.assert_allclose(after.params[:, 0], 1 - np.array([0.1, 0.2, 0.3]), rtol=1e-6)


def test_a_value_kept_from_inside_jit_and_used_after_is_named_with_return_it():
    """The jit kind of the same error: a traced value appended to a list inside jit, used
    later. Its line, "return it", and jax.checking_leaks to find where it was kept."""
    kept = []

    @jax.jit
    def f(x):
        kept.append(x * 2)
        return x

    f(1.0)
    with pytest.raises(jax.errors.UnexpectedTracerError) as info:
        kept[0] + 1
    fix = trace_errors.trace_error_fix(info.value)
    assert fix.startswith("a value traced inside jax.jit (or grad) was kept after"), fix
    assert "Return it from the function instead" in fix and "jax.checking_leaks()" in fix


def _apply(model, x):
    return jnp.tanh(x @ model["w"] + model["b"])


def test_equinox_397_vmap_over_a_list_of_models_is_named_with_their_leaves_stacked():
    """patrick-kidger/equinox#397 (a new user's trial): an ensemble kept as a Python list of
    alike models, vmapped over: "vmap got inconsistent sizes", and the kit said nothing. It
    names the list and the thread's fix, which runs: one output per model."""
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    models = [{"w": jax.random.normal(k, (3, 4)), "b": jnp.zeros(4)} for k in keys]
    xs = jnp.ones((5, 3))
    with pytest.raises(ValueError) as info:
        jax.vmap(_apply)(models, xs)
    fix = trace_errors.trace_error_fix(info.value)
    assert fix.startswith("vmap maps an axis of every array leaf, and `model` is a list"), fix
    assert "jax.tree.map(lambda *a: jnp.stack(a), *model)" in fix and "equinox#397" in fix
    with pytest.raises(BadInputError, match="Why: vmap maps an axis of every array leaf"):
        preflight.preflight_step(jax.vmap(_apply), models, xs)
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *models)
    out = jax.vmap(_apply)(stacked, xs)
    assert out.shape == (5, 4)
    np.testing.assert_allclose(out[2], _apply(models[2], xs[2]), rtol=1e-6)
    other = ValueError("vmap got inconsistent sizes for array axes to be mapped:\n  * one axis "
                       "had size 8: axis 0 of argument x of type float32[8,2]")
    assert trace_errors.trace_error_fix(other) == ""  # no list: nothing said
    # a review: a list of arrays batched right beside a wrong-sized argument, one item of a
    # batched list the wrong size, a dict keyed by ints: no stacking advice for any
    for fn, args in ((lambda fs, y: fs[0] * y, ([jnp.ones((8, 3))] * 2, jnp.ones(4))),
                     (lambda fs: fs[0], ([jnp.ones((8, 3))] * 2 + [jnp.ones((4, 3))],)),
                     (lambda p: p[0], ({0: jnp.ones(8), 1: jnp.ones(4)},))):
        with pytest.raises(ValueError) as info:
            jax.vmap(fn)(*args)
        assert trace_errors.trace_error_fix(info.value) == "", info.value


def test_openpi_987_a_flag_jax_checkpoint_traces_is_named_by_its_position():
    """Physical-Intelligence/openpi#987: a remat'd block's `deterministic` flag raised
    TracerBoolConversionError, its static_argnums naming the argument before. The kit said
    "which jit traces" (there was no jit) and static_argnames=('deterministic',), which
    jax.checkpoint ignores (a trial: the error stayed). Now jax.checkpoint, and the position."""
    def block(x, a, deterministic):
        if not deterministic:
            x = x * 0.5
        return x * a

    wrong = jax.checkpoint(block, static_argnums=(1,))  # the thread's: one off
    err = _error(jax.grad(lambda x: wrong(x, 2.0, False).sum()), jnp.ones(3))
    fix = trace_errors.trace_error_fix(err)
    assert "which jax.checkpoint traces" in fix and "jit traces" not in fix
    assert "static_argnums=(2,)" in fix and "openpi#987" in fix
    assert "static_argnames=(" not in fix
    if "static_argnames" in str(__import__("inspect").signature(jax.checkpoint)):
        ignored = jax.checkpoint(block, static_argnames=("deterministic",))  # what it said
        with pytest.raises(jax.errors.TracerBoolConversionError):
            jax.grad(lambda x: ignored(x, 2.0, False).sum())(jnp.ones(3))
    right = jax.checkpoint(block, static_argnums=(2,))  # the fix it gives, run
    np.testing.assert_allclose(jax.grad(lambda x: right(x, 2.0, False).sum())(jnp.ones(3)),
                               np.full(3, 1.0))


def test_jax_18405_a_static_argument_passed_by_keyword_to_jax_checkpoint_is_named():
    """jax-ml/jax#18405: jax.checkpoint(f, static_argnums=1) called as f(5, flag=False)
    raised a ValueError about len(args); the kit said nothing, and preflight_step printed
    the call as (5, False), hiding the keyword. Now: pass it by position; and flag=False."""
    def f(x, flag):
        return x + 1 if flag else x * 2

    g = jax.checkpoint(f, static_argnums=(1,))
    with pytest.raises(ValueError) as info:
        jax.jit(lambda x: g(x, flag=False))(jnp.float32(5))
    err = info.value
    fix = trace_errors.trace_error_fix(err)
    assert "passed by keyword" in fix and "jax-ml/jax#18405" in fix
    assert float(jax.jit(lambda x: g(x, False))(jnp.float32(5))) == 10.0  # by position: runs
    with pytest.raises(BadInputError, match="passed by keyword"):
        preflight.preflight_step(lambda x, flag: g(x, flag=flag), jnp.float32(5), flag=False)
    from helpers import compiled  # the arguments as passed, keywords by name
    assert compiled.describe_arguments(((jnp.float32(5),), {"flag": False})) == \
        "float32[], flag=False"
    assert compiled.describe_arguments(((), {"mask": None})) == "mask=None"  # (a review)
    with pytest.raises(ValueError) as other:  # another ValueError: no word
        jnp.split(jnp.ones(3), 2)
    assert trace_errors.trace_error_fix(other.value) == ""


def test_jax_40722_a_callback_s_sharding_on_a_device_the_jit_does_not_use_is_named():
    """jax-ml/jax#40722: pure_callback(..., sharding=SingleDeviceSharding(cpu)) in a jit on
    another device raised a bare "tuple.index(x): x not in tuple" (jax 0.8.0, 0.10.2), and the
    kit said nothing (a trial). The fix it names, run: sharding= left out."""
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    other = jax.devices()[1]

    def f(x):
        return jax.pure_callback(lambda v: v * 2.0, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                 sharding=jax.sharding.SingleDeviceSharding(other))

    with pytest.raises(ValueError) as info:
        jax.jit(f)(jax.device_put(jnp.ones(3), jax.devices()[0]))
    fix = trace_errors.trace_error_fix(info.value)
    assert "Leave sharding= out" in fix and "jax-ml/jax#40722" in fix

    def g(x):
        return jax.pure_callback(lambda v: v * 2.0, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    np.testing.assert_allclose(jax.jit(g)(jnp.ones(3)), np.full(3, 2.0))


def test_a_checkpoint_inside_a_jit_names_the_jit_s_static_argument_too():
    """A review: jax.checkpoint(body)(x, deterministic) inside a jitted loss that takes the
    flag: the kit said "(not jit)" and static_argnums on the checkpoint alone, which followed
    still raised. Now the jit too; a flag the outer function passes as a constant, not."""
    def body(x, deterministic):
        return x * 2 if deterministic else jnp.sin(x)

    @jax.jit
    def loss(x, deterministic):
        return jax.checkpoint(body)(x, deterministic).sum()

    err = _error(loss, jnp.ones(3), True)
    fix = trace_errors.trace_error_fix(err)
    assert "The function around it, loss, is traced too" in fix and "(not jit)" not in fix

    @functools.partial(jax.jit, static_argnames="deterministic")
    def fixed(x, deterministic):
        return jax.checkpoint(body, static_argnums=(1,))(x, deterministic).sum()

    assert float(fixed(jnp.ones(3), True)) == 6.0  # both static: it runs
    err = _error(jax.grad(lambda x: jax.checkpoint(body)(x, True).sum()), jnp.ones(3))
    assert "The function around it" not in trace_errors.trace_error_fix(err)


def test_a_checkpointed_method_s_flag_is_numbered_for_jax_checkpoint_and_for_nn_remat():
    """A review: for jax.checkpoint(self.apply) the kit gave the position counting self,
    (2,), which jax.checkpoint (not given self) rejects; (1,) runs. Both numbers now."""
    class Block:
        def apply(self, x, deterministic):
            return x if deterministic else jnp.sin(x)

    block = Block()
    err = _error(lambda x: jax.checkpoint(block.apply)(x, True), jnp.ones(3))
    fix = trace_errors.trace_error_fix(err)
    assert "static_argnums=(1,) for jax.checkpoint(self.apply)" in fix
    assert "(2,) for flax's nn.remat" in fix
    np.testing.assert_allclose(
        jax.checkpoint(block.apply, static_argnums=(1,))(jnp.ones(3), True), np.ones(3))
