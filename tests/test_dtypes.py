"""Dtypes that widen or stay wide: a value jnp's promotion reads at a wider type (jax-ml/jax#1830
under x64, jax-ml/jax#7368 with bfloat16 parameters), float64 arguments under x64
(patrick-kidger/equinox#1154), and the CPU stand-in computing bfloat16 in float32 (what a
user's bfloat16 fix shows there). Each thread in miniature, the kit's words, and the fix run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import compiled, preflight
from helpers._internal import jaxprs

MiB = 2**20


# --- jax-ml/jax#1830: a NumPy float64 scalar under x64 ------------------------------------------
def _x64_step(sigma):
    """A float32 step whose loss divides the data by ``sigma`` (the thread's ``x / sigma``)."""

    def loss(params, x):
        h = jnp.tanh((x / sigma) @ params["w1"])
        return jnp.mean((h @ params["w2"] - x) ** 2)

    @jax.jit
    def step(params, x):
        g = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

    return step


def test_jax_1830_a_numpy_float64_scalar_under_x64_widening_a_float32_step_is_named():
    data = np.random.default_rng(0).normal(size=(256, 512))  # NumPy's default: float64
    sigma = np.std(data)  # a NumPy float64 scalar: strongly typed
    with jax.enable_x64(True):
        params = {"w1": jnp.zeros((512, 1024), jnp.float32),
                  "w2": jnp.zeros((1024, 512), jnp.float32)}
        x = jnp.asarray(data, jnp.float32)
        p = preflight.preflight_step(_x64_step(sigma), params, x)
        fixed = preflight.preflight_step(_x64_step(float(sigma)), params, x)
        cast = preflight.preflight_step(_x64_step(jnp.float32(sigma)), params, x)
        with jax.numpy_dtype_promotion("strict"), pytest.raises(Exception, match="romot"):
            jax.make_jaxpr(_x64_step(sigma))(params, x)
        jax.make_jaxpr(_x64_step(float(sigma)))(params, x)  # the fix passes the strict check
    what, dtype, to, nbytes, line = p.widened_values[0]
    assert (what, dtype, to, nbytes) == ("x (float32[256, 512])", "float32", "float64", MiB)
    assert "x / sigma" in line
    note = p.advice.split("x (float32[256, 512]) is read as float64 at ")[1]
    assert "x / sigma" in note[:120]  # the line, then the cause
    for words in ("a float64 constant", "NumPy float64 scalar", "jax-ml/jax#1830",
                  "float(sigma)", "jnp.float32(sigma)", "jax.numpy_dtype_promotion('strict')"):
        assert words in note, words
    # the fixes the note names, run: temporaries 9 -> 2 MiB, the peak 17.50 -> 10.50 MiB
    assert (p.temp_bytes, fixed.temp_bytes, cast.temp_bytes) == (9 * MiB, 2 * MiB, 2 * MiB)
    assert (round(p.peak_bytes / MiB, 2), round(fixed.peak_bytes / MiB, 2)) == (17.5, 10.5)
    assert fixed.widened_values == () and "is read as" not in fixed.advice


# --- jax-ml/jax#7368: bfloat16 parameters against a float32 batch --------------------------------
def _bf16_loss(params, batch):
    h = jax.nn.gelu(batch @ params["w1"])
    out = h @ params["w2"]
    return jnp.mean((out.astype(jnp.float32) - 1.0) ** 2)


@jax.jit
def _bf16_step(params, batch):
    loss, g = jax.value_and_grad(_bf16_loss)(params, batch)
    return loss, jax.tree.map(lambda p, g: p - 1e-2 * g, params, g)


def _bf16_params():
    k = jax.random.split(jax.random.key(0), 2)
    return {"w1": (jax.random.normal(k[0], (512, 2048)) * .02).astype(jnp.bfloat16),
            "w2": (jax.random.normal(k[1], (2048, 512)) * .02).astype(jnp.bfloat16)}


def test_jax_7368_bfloat16_parameters_read_as_float32_by_a_float32_batch_are_named():
    params = _bf16_params()
    batch = jax.random.normal(jax.random.key(1), (1024, 512), jnp.float32)  # the pipeline's
    p = preflight.preflight_step(_bf16_step, params, batch)
    assert p.widened_values[0][:4] == ("params['w1'] (bfloat16[512, 2048])", "bfloat16",
                                       "float32", 4 * MiB)
    note = p.advice.split("params['w1'] (bfloat16[512, 2048]) is read as float32 at ")[1]
    for words in ('batch @ params["w1"]', "with batch (float32)", "jax-ml/jax#7368",
                  "what jax.grad keeps of it, is float32", "batch.astype(jnp.bfloat16)",
                  "jax.numpy_dtype_promotion('strict')"):
        assert words in note, words
    assert "On the CPU, XLA computes" not in p.advice  # float32 here by the user's promotion
    # the fix, run: what jax.grad keeps goes 50 -> 26 MiB, and the strict mode finds the line
    fixed_batch = batch.astype(jnp.bfloat16)
    kept = [round(preflight.residuals(_bf16_loss, params, b).saved_bytes / MiB, 2)
            for b in (batch, fixed_batch)]
    assert kept == [50.0, 26.0]
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception, match="romot"):
            jax.make_jaxpr(_bf16_step)(params, batch)
        jax.make_jaxpr(_bf16_step)(params, fixed_batch)
    fixed = preflight.preflight_step(_bf16_step, params, fixed_batch)
    assert fixed.widened_values == () and "is read as" not in fixed.advice


def test_jax_7368_intended_mixed_precision_and_casts_the_user_wrote_are_not_called_widening():
    """bfloat16 compute copies beside float32 master weights (the bfloat16 gradient added to
    them by promotion), an astype the user wrote before a float32 dot, and jnp.mean or
    jax.nn.softmax of bfloat16 (which sum in float32 on purpose): none is a widening."""
    k = jax.random.split(jax.random.key(0), 3)
    master = {"w1": jax.random.normal(k[0], (512, 2048)) * .02,
              "w2": jax.random.normal(k[1], (2048, 512)) * .02}
    batch = jax.random.normal(k[2], (1024, 512), jnp.bfloat16)

    def step(master, batch):
        params = jax.tree.map(lambda w: w.astype(jnp.bfloat16), master)
        g = jax.grad(_bf16_loss)(params, batch)
        return jax.tree.map(lambda m, g: m - 1e-2 * g, master, g)  # bf16 g promoted: intended

    def explicit(w, x):
        h = x.astype(jnp.float32) @ w  # the user's own cast
        return jax.nn.softmax(h.astype(jnp.bfloat16)).mean() + jnp.mean(x)

    for p in (preflight.preflight_step(step, master, batch),
              preflight.preflight_step(explicit, master["w1"], batch)):
        assert p.widened_values == () and "is read as" not in p.advice
    # the same jaxpr with the promotion made by an operator is one
    assert jaxprs.widened_inputs(jax.make_jaxpr(lambda w, x: x @ w)(master["w1"], batch))


# --- patrick-kidger/equinox#1154: float64 arguments under x64 -----------------------------------
def _linear(key, n_in, n_out, dtype):
    kw, kb = jax.random.split(key)
    lim = 1 / np.sqrt(n_in)
    return {"weight": jax.random.uniform(kw, (n_out, n_in), dtype, -lim, lim),
            "bias": jax.random.uniform(kb, (n_out,), dtype, -lim, lim)}


def _model_step(model, opt_state, x):
    def loss(model, x):
        h = x
        for i, layer in enumerate(model):
            h = h @ layer["weight"].T + layer["bias"]
            h = jnp.tanh(h) if i < 2 else h
        return jnp.mean((h - x) ** 2)

    g = jax.grad(loss)(model, x)
    mu = jax.tree.map(lambda m, g: .9 * m + .1 * g, opt_state["mu"], g)
    nu = jax.tree.map(lambda v, g: .999 * v + .001 * g * g, opt_state["nu"], g)
    model = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), model, mu, nu)
    return model, {"mu": mu, "nu": nu}


def _model(dtype):
    keys = jax.random.split(jax.random.key(0), 3)
    model = [_linear(keys[0], 64, 1024, dtype), _linear(keys[1], 1024, 1024, dtype),
             _linear(keys[2], 1024, 64, dtype)]
    state = {"mu": jax.tree.map(jnp.zeros_like, model),
             "nu": jax.tree.map(jnp.zeros_like, model)}
    x = jnp.asarray(np.random.default_rng(0).normal(size=(256, 64)), dtype)
    return model, state, x


def test_equinox_1154_a_network_made_float64_by_x64_is_named_with_the_dtype_fix():
    with jax.enable_x64(True):
        default = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32  # equinox's default
        p = preflight.preflight_step(_model_step, *_model(default))
        fixed = preflight.preflight_step(_model_step, *_model(jnp.float32))  # the thread's fix
        small = preflight.preflight_step(  # a float64 scalar beside float32 weights: quiet
            lambda m, s: jax.tree.map(lambda w: w * s, m), _model(jnp.float32)[0],
            jnp.float64(0.5))
    assert p.float64_argument_bytes == p.argument_bytes > 27 * MiB
    note = p.advice.split(f"{p.argument_bytes / MiB:.2f} MiB of the step's arguments (100%) "
                          "are float64, and jax_enable_x64 is on")[1]
    for words in ("made without a dtype", "eqx.nn.Linear", "dtype=jnp.float32",
                  "patrick-kidger/equinox#1154", "x64 off"):
        assert words in note, words
    # the fix, run: arguments 27.17 -> 13.59 MiB
    assert (round(p.argument_bytes / MiB, 2), round(fixed.argument_bytes / MiB, 2)) == (
        27.17, 13.59)
    assert fixed.float64_argument_bytes == 0 and "jax_enable_x64 is on" not in fixed.advice
    assert small.float64_argument_bytes == 8 and "jax_enable_x64 is on" not in small.advice
    quiet = preflight.preflight_step(_model_step, *_model(jnp.float32))  # x64 off
    assert quiet.float64_argument_bytes == 0 and "jax_enable_x64" not in quiet.advice


# --- the CPU stand-in computes bfloat16 in float32 (finding X of the precision threads) ---------
def test_jax_7368_on_the_cpu_a_bfloat16_step_s_temporaries_are_float32_sized_and_say_so():
    """XLA:CPU computes bfloat16 arithmetic in float32 (openxla/xla cpu_compiler.cc's
    FloatNormalization): the same step's temporaries do not halve in bfloat16 on the CPU
    (36.00 MiB against 34.00 MiB in float32, jax 0.10.2), and its program computes the dot in
    float32. The kit labels it and keeps XLA's sizes; on a GPU the values stay bfloat16 (from
    XLA's source, not yet run on a GPU)."""
    params = _bf16_params()
    batch = jax.random.normal(jax.random.key(1), (1024, 512), jnp.bfloat16)  # the user's fix
    wide = jax.tree.map(lambda a: a.astype(jnp.float32), (params, batch))
    p = preflight.preflight_step(_bf16_step, params, batch)
    f32 = preflight.preflight_step(_bf16_step, *wide)
    on_h100 = preflight.preflight_step(_bf16_step, params, batch, target="H100")
    c = compiled.compile_step(_bf16_step, params, batch)
    assert p.temp_bytes > 0.9 * f32.temp_bytes  # not half: the mechanism, measured
    assert "f32[1024,2048]" in c.text and "dot(" in c.text
    assert p.temp_bytes == c.sizes()["temp"] == on_h100.temp_bytes  # sizes kept as XLA's
    assert p.cpu_float32_values > 0 and f32.cpu_float32_values == 0
    for advice in (p.advice, on_h100.advice):
        note = advice.split("On the CPU, XLA computes bfloat16 arithmetic in float32")[1]
        for words in ("xla/service/cpu/cpu_compiler.cc", "these temporaries are float32-sized",
                      "a GPU keeps them at bfloat16", "not yet run on a GPU", "residuals("):
            assert words in note, words
    assert "On the CPU" not in f32.advice


def test_jax_7431_on_the_cpu_a_float16_dot_is_computed_in_float32_and_says_so():
    """jax#7462 (for jax-ml/jax#7431) computes float16 dots on the CPU in float32: XLA's
    ChangeOpDataType(F16, F32) in cpu_compiler.cc. A 1000x1000 float16 dot holds a float32
    value of its result's shape."""
    a = jnp.ones((1000, 1000), jnp.float16)
    p = preflight.preflight_step(lambda a, b: jnp.tanh(a @ b), a, a)
    assert p.largest_temporaries[0].dtype == "f32"
    assert "On the CPU, XLA computes float16 dots and convolutions in float32" in p.advice
    assert "a GPU keeps them at float16" in p.advice
