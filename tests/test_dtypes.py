"""Dtypes that widen or stay wide: a value jnp's promotion reads at a wider type (jax-ml/jax#1830
under x64, jax-ml/jax#7368 with bfloat16 parameters), float64 arguments under x64
(patrick-kidger/equinox#1154), and the CPU stand-in computing bfloat16 in float32 (what a
user's bfloat16 fix shows there). Each thread in miniature, the kit's words, and the fix run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import compiled, preflight
from helpers._internal import (
    jaxpr_values,
)

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
                  "make the constant that line reads float32", "jnp.float32(...) of it",
                  "float(...) of it", "jax.numpy_dtype_promotion('strict')"):
        assert words in note, words
    assert "sigma" not in note.split("Fix: ")[1]  # the fix names no name the kit cannot see
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
    # the fix, run: what jax.grad keeps goes 50 -> 26 MiB (jax 0.8.0 and 0.10.2: gelu's tanh
    # keeps tanh and 1 - tanh, six [1024, 2048] arrays); 42 -> 22 MiB where tanh's derivative
    # is one_minus_square(tanh), one array (jax 0.11.2: five); the strict mode finds the line
    fixed_batch = batch.astype(jnp.bfloat16)
    kept = [round(preflight.residuals(_bf16_loss, params, b).saved_bytes / MiB, 2)
            for b in (batch, fixed_batch)]
    assert kept == ([42.0, 22.0] if hasattr(jax.lax, "one_minus_square") else [50.0, 26.0])
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception, match="romot"):
            jax.make_jaxpr(_bf16_step)(params, batch)
        jax.make_jaxpr(_bf16_step)(params, fixed_batch)
    fixed = preflight.preflight_step(_bf16_step, params, fixed_batch)
    assert fixed.widened_values == () and "is read as" not in fixed.advice


def _labels_step(sizes=(256, 1024, 1024, 512)):
    """wd2 of the code review: a bfloat16 model's output against float32 labels in
    ``jnp.mean((out - y) ** 2)``, a float32 loss on purpose."""
    def forward(params, x):
        for layer in params[:-1]:
            x = jax.nn.relu(x @ layer["w"].astype(jnp.bfloat16))
        return x @ params[-1]["w"].astype(jnp.bfloat16)

    def loss(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    @jax.jit
    def step(params, x, y):
        value, g = jax.value_and_grad(loss)(params, x, y)
        return value, jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

    ks = jax.random.split(jax.random.key(0), len(sizes) - 1)
    params = [{"w": jax.random.normal(k, (a, b)) * .02}
              for k, a, b in zip(ks, sizes[:-1], sizes[1:], strict=True)]
    return forward, loss, step, params


def test_jax_7368_a_bfloat16_output_against_float32_labels_in_a_float32_loss_is_quiet():
    """No forward dot reads ``out`` widened by float32 labels; only the backward pass's
    weight-gradient dots do (through the loss's residual), and the walk stops there (its
    equations' name stack says transpose, jax 0.8.0 and 0.10.2). The old note's fix, labels
    made bfloat16, changes nothing it promised: temporaries 15.50 -> 15.50 MiB (jax 0.10.2;
    17.50 -> 17.50 MiB on 0.8.0; 12.50 -> 12.50 MiB on 0.11.2, whose XLA CPU runs the
    bfloat16 dots in bfloat16 YNNPACK fusions, where 0.10.2 first converted them to float32)."""
    forward, _, step, params = _labels_step()
    x = jnp.ones((512, 256), jnp.bfloat16)
    y, y16 = jnp.ones((512, 512)), jnp.ones((512, 512), jnp.bfloat16)
    p = preflight.preflight_step(step, params, x, y, donate_argnums=0)
    assert p.widened_values == () and "is read as" not in p.advice
    assert jaxpr_values.widened_inputs(jax.make_jaxpr(step)(params, x, y)) == ()
    followed = preflight.preflight_step(step, params, x, y16, donate_argnums=0)
    temps = round(p.temp_bytes / MiB, 2), round(followed.temp_bytes / MiB, 2)
    measured = {"0.8.0": 17.5, "0.10.2": 15.5, "0.11.2": 12.5, "0.12.0.1": 12.5}.get(
        jax.__version__, temps[0])  # (another version: the two equal, as the lesson says)
    assert temps == (measured, measured), (jax.__version__, temps)
    # the same widened output read by a forward dot is named still, under jax.grad too
    def dotted(params, x, y):
        return jnp.mean(((forward(params, x) - y) @ y) ** 2)

    assert jaxpr_values.widened_inputs(jax.make_jaxpr(jax.grad(dotted))(params, x, y))


def _bias_step(cast_bias: bool):
    """fp1 of the code review: bfloat16 activations plus a float32 bias that is an argument
    (``x @ w.astype(jnp.bfloat16) + b``); ``cast_bias``: the note's fix, b cast at the line."""
    def loss(params, x, y):
        for n, layer in enumerate(params):
            b = layer["b"].astype(jnp.bfloat16) if cast_bias else layer["b"]
            x = x @ layer["w"].astype(jnp.bfloat16) + b
            x = jax.nn.relu(x) if n < len(params) - 1 else x
        return jnp.mean((x - y) ** 2)

    @jax.jit
    def step(params, x, y):
        value, g = jax.value_and_grad(loss)(params, x, y)
        return value, jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

    return loss, step


def test_jax_7368_a_float32_bias_added_to_a_bfloat16_activation_names_the_bias():
    """The bias's broadcast comes after the widening's cast in the jaxpr: the kind (argument
    or constant) is decided after the walk, and the broadcast traced back to the bias. Fix
    run: what jax.grad keeps 8.25 -> 6.25 MiB (jax 0.10.2 and 0.8.0)."""
    sizes = (512, 1024, 1024, 256)
    ks = jax.random.split(jax.random.key(0), 3)
    params = [{"w": jax.random.normal(k, (a, b)) * .02, "b": jnp.zeros((b,))}
              for k, a, b in zip(ks, sizes[:-1], sizes[1:], strict=True)]
    x, y = jnp.ones((256, 512), jnp.bfloat16), jnp.ones((256, 256))
    loss, step = _bias_step(False)
    p = preflight.preflight_step(step, params, x, y)
    assert p.widened_values[0][1:4] == ("bfloat16", "float32", MiB)
    note = p.advice.split("is read as float32 at ")[1].split("raises at every line")[0]
    for words in ("with params[0]['b'] (float32)", "Fix: cast params[0]['b'] to bfloat16",
                  "params[0]['b'].astype(jnp.bfloat16)", "where that line reads it"):
        assert words in note, words
    assert "constant" not in note and "sigma" not in note
    fixed_loss, fixed_step = _bias_step(True)
    fixed = preflight.preflight_step(fixed_step, params, x, y)
    assert fixed.widened_values == () and "is read as" not in fixed.advice
    kept = [round(preflight.residuals(f, params, x, y).saved_bytes / MiB, 2)
            for f in (loss, fixed_loss)]
    assert kept == [8.25, 6.25]


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
    assert jaxpr_values.widened_inputs(jax.make_jaxpr(lambda w, x: x @ w)(master["w1"], batch))


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


def test_equinox_1154_a_float64_step_on_purpose_is_told_the_fix_is_only_if_float32_is_enough():
    """x64.py of the code review: a float64 heat-equation step, x64 turned on for exactly
    this. Nothing in the step tells it from equinox#1154's network (both float64 throughout),
    so the note states the fact and makes the fix conditional."""
    def heat(u, dt):
        lap = (jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1)
               + jnp.roll(u, -1, 1) - 4 * u)
        return u + dt * lap

    with jax.enable_x64(True):
        p = preflight.preflight_step(heat, jnp.zeros((512, 512)), 1e-3, donate_argnums=0)
    assert p.float64_argument_bytes == 2 * MiB
    note = p.advice.split("are float64, and jax_enable_x64 is on")[1]
    for words in ("If float32 is enough for them", "patrick-kidger/equinox#1154",
                  "if the step needs float64, this is its cost, not a mistake"):
        assert words in note, words
    assert "Where float32 is enough" not in note


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
                      "a GPU computes the dots in bfloat16",
                      "keeps values between fusions mostly in bfloat16",
                      "widened to float32 inside fusions, add and multiply too below Hopper",
                      "xla/service/gpu/gpu_float_support.cc", "not yet run on a GPU",
                      "residuals("):
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
    assert "a GPU computes float16 dots and convolutions in float16" in p.advice
    assert "a GPU keeps them at" not in p.advice


def test_jax_7368_a_checkpointed_loss_s_backward_pass_is_not_walked_for_widening():
    """Under jax.checkpoint the backward pass is one remat equation whose inner name stacks are
    relative: the widening walk went into it and reached the weight-gradient dots, naming a
    bfloat16 output against float32 labels (the fix it gave changed no byte). The remat of
    the backward pass is not walked (found by a review, wd3.py)."""
    bf = jnp.bfloat16
    params = {"w": jnp.full((2, 512, 512), 0.02)}

    def loss(params, x, y):
        for i in range(2):
            x = jax.nn.relu(x @ params["w"][i].astype(bf))
        return jnp.mean((x - y) ** 2)  # a float32 loss on purpose

    def step(params, x, y):
        g = jax.grad(lambda p: jax.checkpoint(loss)(p, x, y))(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

    x, y = jnp.ones((256, 512), bf), jnp.ones((256, 512))
    p = preflight.preflight_step(step, params, x, y)
    assert p.widened_values == () and "is read as float32" not in p.advice
    plain = preflight.preflight_step(  # the same loss without the checkpoint: quiet too
        lambda params, x, y: jax.grad(loss)(params, x, y), params, x, y)
    assert plain.widened_values == ()
