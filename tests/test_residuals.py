"""preflight.residuals against users' threads: each thread in miniature, the kit's words for its
cause and fix, and the fix run against XLA's temporaries for the gradient (compiled, on the
CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import compiled, preflight
from helpers._internal import jaxcompat
from helpers.errors import BadInputError
from helpers.units import format_bytes
from tests.conftest import chunked_causal_attention

MiB = 2**20


def _temp(f, *args, argnums=0) -> int:
    """XLA's temporaries for jax.grad(f), compiled, not run."""
    step = jax.jit(jax.grad(f, argnums=argnums)).lower(*args).compile()
    return step.memory_analysis().temp_size_in_bytes


# --- jax-ml/jax#27748: a Python loop of scans, each body checkpointed -------------------------
_BLOCKS, _STEPS = 5, 20
def _x0():  # made when asked: importing the tests starts no backend (on a GPU, its pool)
    with jax.ensure_compile_time_eval():  # an array, also where asked inside a trace
        return jnp.ones((100, 100))


@jax.checkpoint
def _step(c, t):
    x, p = c
    a = jnp.sin(p * x)
    return (x + a + jnp.cos(p * a), p), None


def _blocks(p):  # the thread's comparison case: no outer remat
    c = (_x0(), p)
    for i in range(_BLOCKS):
        c, _ = lax.scan(_step, c, jnp.arange(i * _STEPS, (i + 1) * _STEPS))
    return jnp.sum(c[0])


def _blocks_twice(p):  # the kit's old advice, applied: jax.checkpoint around the whole body
    c = (_x0(), p)
    for i in range(_BLOCKS):
        c, _ = lax.scan(jax.checkpoint(_step), c, jnp.arange(i * _STEPS, (i + 1) * _STEPS))
    return jnp.sum(c[0])


def _remat_blocks(p):  # the thread's own: each block's scan under jax.remat too
    c = (_x0(), p)
    for i in range(_BLOCKS):
        idx = jnp.arange(i * _STEPS, (i + 1) * _STEPS)
        c, _ = jax.checkpoint(lambda c, idx=idx: lax.scan(_step, c, idx))(c)
    return jnp.sum(c[0])


def _outer_scan(p):  # the fix: one scan over the checkpointed blocks
    block = jax.checkpoint(lambda c, ix: (lax.scan(_step, c, ix)[0], None))
    idx = jnp.arange(_BLOCKS * _STEPS).reshape(_BLOCKS, _STEPS)
    return jnp.sum(lax.scan(block, (_x0(), p), idx)[0][0])


def test_jax_27748_scans_one_line_makes_in_a_python_loop_are_each_their_own():
    """The kit added up the 5 scans made at one line and said "Part of its body is under
    jax.checkpoint, yet each step keeps more than its carry" of bodies wholly checkpointed."""
    p = jnp.float32(0.8)
    r = preflight.residuals(_blocks, p)
    carry = 100 * 100 * 4 + 4
    assert r.saved_bytes == _BLOCKS * _STEPS * carry  # each step keeps its carry, no more
    for words in ("5 scans of 20 steps are made at test_residuals.py:",
                  f"the largest stacks {format_bytes(_STEPS * carry)}",
                  "Its body is under jax.checkpoint already, so each step keeps its carry",
                  "One lax.scan over the 5 blocks with jax.checkpoint on the block",
                  "jax-ml/jax#27748"):
        assert words in r.advice, words
    assert "Part of its body" not in r.advice and "around the whole body" not in r.advice
    # the old advice did nothing; the new one, run: XLA's temporaries fall about fourfold
    assert preflight.residuals(_blocks_twice, p).saved_bytes == r.saved_bytes
    before, after = _temp(_blocks, p), _temp(_outer_scan, p)
    assert 3 * after < before, (before, after)  # 4.01 -> 1.15 MiB (0.10.2); 3.93 -> 1.07
    assert np.allclose(jax.grad(_blocks)(p), jax.grad(_outer_scan)(p), rtol=1e-4)


def test_jax_27748_blocks_checkpointed_in_a_python_loop_are_told_to_scan_over_them():
    """jax.remat around each block: 195 KiB kept, yet XLA's plan holds 4.69 MiB; the kit said
    "jax.checkpoint on the largest layer", which the blocks are already."""
    p = jnp.float32(0.8)
    r = preflight.residuals(_remat_blocks, p)
    temp = _temp(_remat_blocks, p)
    for words in ("jax.checkpoint is applied 5 times at test_residuals.py:",
                  f"the gradient keeps only {format_bytes(r.saved_bytes)}",
                  f"holds {format_bytes(temp)} of temporaries",
                  "one lax.scan over their stacked parameters or inputs",
                  "jax-ml/jax#19822, #27748"):
        assert words in r.advice, words
    assert "on the largest layer" not in r.advice
    assert 3 * _temp(_outer_scan, p) < temp  # the fix, run: 4.69 -> 1.15 MiB (1.07 on 0.8.0)


def test_jax_27748_a_stacked_rnn_s_layers_each_keep_their_carry():
    """3 layers, each a scan over a checkpointed cell, in a Python loop: each step of each
    keeps its carry (the kit said "Part of its body ... more than its carry")."""
    t, b, h = 64, 8, 32

    def loss(ws, xs):
        for w in ws:
            cell = jax.checkpoint(lambda c, x, w=w: (jnp.tanh(c @ w + x),) * 2)
            _, xs = lax.scan(cell, jnp.zeros((b, h)), xs)
        return jnp.sum(xs[-1])

    r = preflight.residuals(loss, [jnp.eye(h) * 0.5] * 3, jnp.ones((t, b, h)))
    assert "3 scans of 64 steps are made at" in r.advice
    assert "Its body is under jax.checkpoint already" in r.advice
    assert "Part of its body" not in r.advice
    assert "One lax.scan over the 3 blocks" not in r.advice  # layers, not blocks of one scan


# --- jax-ml/jax#2956: a fori_loop bound that is traced --------------------------------------
def _fori_loss(x, n):
    return jnp.sum(lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * x, x))


def test_jax_2956_a_python_int_bound_is_passed_as_jax_grad_passes_it():
    """residuals traced the bound 10 too, so it read a while_loop jax.grad(loss)(x, 10) never
    makes and said "keeps 0 B"."""
    x = jnp.ones(256)
    r = preflight.residuals(_fori_loss, x, 10)
    listed = jaxcompat.verify("saved_residuals")(lambda x: _fori_loss(x, 10), x)  # JAX's
    kept = sum(a.size * a.dtype.itemsize for a, s in listed if "argument" not in s)
    assert r.saved_bytes == kept == 2 * 10 * 256 * 4  # 20 KiB, as JAX lists it
    assert "stacked over 10 steps" in r.advice and "while_loop" not in r.advice


def test_jax_2956_a_traced_bound_is_named_with_what_jax_grad_raises_and_the_fix():
    x = jnp.ones(256)
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work") as real:
        jax.jit(jax.grad(_fori_loss))(x, 10)  # what jax.grad raises, the bound a jit argument
    with pytest.raises(BadInputError) as said:
        preflight.residuals(_fori_loss, x, jnp.int32(10))
    for words in ("jax.grad(_fori_loss) cannot go back through the lax.while_loop at "
                  "test_residuals.py:", "a lax.fori_loop whose bounds are traced is one",
                  str(real.value).splitlines()[0], "the argument n", "static_argnums",
                  "lax.scan with a fixed length", "jax-ml/jax#2956"):
        assert words in str(said.value), words
    # the fix, run: the bound static, the same gradient as eager jax.grad with a Python int
    fixed = jax.jit(jax.grad(_fori_loss), static_argnums=1)(x, 10)
    assert np.allclose(fixed, jax.grad(_fori_loss)(x, 10))


def test_mujoco_2259_a_convergence_loop_s_tolerance_is_no_bound_to_make_static():
    """google-deepmind/mujoco#2259: jax.grad through a solver's while_loop until convergence.
    The kit read the tolerance the loop's condition compares with as the loop's bound and
    advised passing it as a static Python int, after which jax.grad raised the same (a new
    user's trial). A float the condition reads is no bound: the fix named is the PR's
    (mujoco#3264), a scan of a largest count whose steps after convergence keep the carry,
    run here: the gradient goes through it."""
    def solve(x, tol):
        def body(c):
            y, i = c
            return 0.5 * (y + x / y), i + 1

        y, _ = lax.while_loop(lambda c: (jnp.abs(c[0] * c[0] - x).max() > tol) & (c[1] < 50),
                              body, (x, 0))
        return jnp.sum(y)

    x, tol = jnp.linspace(1.0, 4.0, 256), jnp.float32(1e-4)
    with pytest.raises(BadInputError) as said:
        preflight.residuals(solve, x, tol)
    assert "pass tol as a Python int" not in str(said.value) and "static_argnums" not in str(
        said.value)
    assert "jnp.where(done, carry, step(carry))" in str(said.value)
    assert "google-deepmind/mujoco#3264" in str(said.value)

    def fixed(x, tol):  # the fix named: 50 steps at most, each after convergence a no-op
        def step(y, _):
            done = jnp.abs(y * y - x).max() <= tol
            return jnp.where(done, y, 0.5 * (y + x / y)), None

        return jnp.sum(lax.scan(step, x, None, length=50)[0])

    grad = jax.grad(fixed)(x, tol)
    np.testing.assert_allclose(grad, 0.5 / jnp.sqrt(x), rtol=1e-3)


def test_jax_2956_a_while_loop_the_gradient_does_not_cross_is_no_error():
    def loss(x):  # the loop counts integers only; the gradient never goes back through it
        n = lax.while_loop(lambda i: i < 5, lambda i: i + 1, 0)
        return jnp.sum(jnp.sin(x) * n)

    r = preflight.residuals(loss, jnp.ones(256))  # cos(x), and the count: no error
    assert r.saved_bytes == 256 * 4 + 4 and "while_loop" not in r.advice


# --- apple/axlearn#1236 and google/flax#2858: a product reduced over a wide axis -------------
_T, _D, _V = 256, 64, 2048


def _logits_loss(w, h, labels):
    logits = h @ w
    tgt = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)


def _logits_in_chunks(w, h, labels, k=16):  # the fix: token chunks, each checkpointed
    @jax.checkpoint
    def body(acc, xs):
        hc, lc = xs
        logits = hc @ w
        tgt = jnp.take_along_axis(logits, lc[:, None], axis=-1)[:, 0]
        return acc + jnp.sum(jax.nn.logsumexp(logits, axis=-1) - tgt), None

    return lax.scan(body, 0.0, (h.reshape(-1, k, _D), labels.reshape(-1, k)))[0] / _T


def test_apple_axlearn_1236_full_vocabulary_logits_are_told_to_go_in_token_chunks():
    """The kit advised "jax.checkpoint on the largest layer (or dots_with_no_batch_dims_saveable)",
    which left XLA's temporaries where they were (or raised them: 64 -> 96 MiB in the report's
    value_and_grad)."""
    w = jax.random.normal(jax.random.key(0), (_D, _V)) * 0.1
    h = jax.random.normal(jax.random.key(1), (_T, _D))
    labels = jnp.arange(_T) % _V
    r = preflight.residuals(_logits_loss, w, h, labels)
    for words in ("float32[256, 2048], a product over 2048 columns against a contracted size "
                  "of 64 (test_residuals.py:", "jax.nn.logsumexp(logits, axis=-1)",
                  "full-vocabulary logits under a logsumexp",
                  f"holds {format_bytes(_temp(_logits_loss, w, h, labels))} of "
                  "temporaries", "a lax.scan (or lax.map) over 16 chunks of 16 of the 256 rows "
                  "of h", "jax.checkpoint on the chunk's body", "apple/axlearn#1236"):
        assert words in r.advice, words
    assert "on the largest layer" not in r.advice
    # measured: checkpoint and the policy leave the plan as it was; the chunks cut it
    both = (0, 1)
    plain = _temp(_logits_loss, w, h, labels, argnums=both)
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    for f in (jax.checkpoint(_logits_loss), jax.checkpoint(_logits_loss, policy=policy)):
        assert _temp(f, w, h, labels, argnums=both) >= 0.9 * plain
    chunked = _temp(_logits_in_chunks, w, h, labels, argnums=both)
    assert 4 * chunked < plain, (plain, chunked)  # 4.00 -> 0.63 MiB, jax 0.8.0 and 0.10.2
    g, c = (jax.grad(f, argnums=both)(w, h, labels) for f in (_logits_loss, _logits_in_chunks))
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(g, c, strict=True))


_B, _S, _H, _DH = 1, 256, 2, 32


def _attention(q, k, v):
    return jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=True) ** 2)


def _attention_in_chunks(q, k, v, qc=32):  # the fix: query chunks, each checkpointed
    return jnp.sum(chunked_causal_attention(q, k, v, qc) ** 2)


def test_google_flax_2858_attention_scores_are_told_to_go_in_query_chunks():
    q, k, v = (jax.random.normal(jax.random.key(i), (_B, _S, _H, _DH)) for i in range(3))
    r = preflight.residuals(_attention, q, k, v)
    for words in ("a product over 256 columns against a contracted size of 32",
                  "attention scores under a softmax", "of the 256 rows of q",
                  "google/flax#2858"):
        assert words in r.advice, words
    assert "on the largest layer" not in r.advice
    three = (0, 1, 2)
    plain = _temp(_attention, q, k, v, argnums=three)
    assert _temp(jax.checkpoint(_attention), q, k, v, argnums=three) >= 0.9 * plain
    chunked = _temp(_attention_in_chunks, q, k, v, argnums=three)
    assert 3 * chunked < plain, (plain, chunked)  # 2.06 -> 0.52 MiB (0.46 on jax 0.8.0)
    g = jax.grad(_attention, argnums=three)(q, k, v)
    c = jax.grad(_attention_in_chunks, argnums=three)(q, k, v)
    assert all(np.allclose(a, b, atol=1e-3, rtol=1e-3) for a, b in zip(g, c, strict=True))


# --- jax-ml/jax#19822: jax.checkpoint around the whole loss, or each layer in a Python loop ---
_LAYERS, _N = 10, 512


def _layer(key, x):
    m = jax.random.normal(key, (x.shape[0], x.shape[0]))
    return jax.nn.relu(jnp.dot(m, x) + 1)


@jax.jit
def foobar(x):
    key = jax.random.PRNGKey(0)
    for _ in range(_LAYERS):
        key, sub = jax.random.split(key)
        x = _layer(sub, x)
    return x.sum()


@jax.jit
def _per_layer(x):
    key = jax.random.PRNGKey(0)
    for _ in range(_LAYERS):
        key, sub = jax.random.split(key)
        x = jax.checkpoint(_layer)(sub, x)
    return x.sum()


@jax.jit
def _scanned(x):  # the fix: a lax.scan over the checkpointed layers
    key, keys = jax.random.PRNGKey(0), []
    for _ in range(_LAYERS):  # the same keys as foobar's
        key, sub = jax.random.split(key)
        keys.append(sub)
    return lax.scan(lambda x, k: (jax.checkpoint(_layer)(k, x), None), x, jnp.stack(keys))[0].sum()


def test_jax_19822_checkpoint_around_the_whole_loss_is_said_to_keep_the_peak():
    """The kit said "keeps 0 B" and nothing else, while XLA's plan did not move."""
    x = jnp.ones(_N)
    whole = jax.checkpoint(foobar)
    r = preflight.residuals(whole, x)
    temp = _temp(whole, x)
    assert r.saved_bytes == 0
    for words in ("jax.checkpoint wraps the whole of foobar",
                  "the backward pass recomputes the whole function at once",
                  f"holds {format_bytes(temp)} of temporaries",
                  "inside a lax.scan over the layers", "jax-ml/jax#19822"):
        assert words in r.advice, words
    assert temp == _temp(foobar, x)  # the peak stayed: 13.02 MiB (41.02 on jax 0.8.0)
    assert 2 * _temp(_scanned, x) < temp  # the fix, run: 6.02 MiB on both
    g, fixed = jax.grad(foobar)(x), jax.grad(_scanned)(x)  # the same layers: the same gradient
    assert np.allclose(g, fixed, rtol=1e-3, atol=1e-5 * float(jnp.abs(g).max()))


def _one_layer(x):  # one checkpointed layer alone: what a scan over them recomputes at a time
    return jax.checkpoint(_layer)(jax.random.PRNGKey(0), x).sum()


def test_jax_19822_the_general_advice_says_what_checkpoint_did_in_a_loop_and_in_a_scan():
    """The kit's general advice, followed layer by layer in the Python loop, raised XLA's
    temporaries (13.02 -> 14.02 MiB on jax 0.10.2); now it says so, and what worked. jax
    0.11.2's XLA schedules the same ten recomputations one after another (the same 19
    float32[512, 512] fusions, in another order): 4.02 MiB, one layer alone 4.00, the scan
    6.02; the kit then says a scan has nothing to take."""
    x = jnp.ones(_N)
    plain = preflight.residuals(foobar, x)
    for words in ("jax.checkpoint on the largest layer keeps only its inputs",
                  "fewer residuals need not mean a lower peak",
                  "on each layer of a Python loop it did not fall",
                  "in a lax.scan over the jax.checkpoint-ed layers it did",
                  "compare preflight_step(jax.grad(loss), ...) before and after"):
        assert words in plain.advice, words
    assert "dots_with_no_batch_dims_saveable" not in plain.advice
    before, loop, scan, one = (_temp(f, x) for f in (foobar, _per_layer, _scanned, _one_layer))
    assert 2 * scan < before, (before, scan)
    together = jaxcompat.jax_version_tuple() < (0, 11)
    if together:  # 13.02 -> 14.02 MiB on 0.10.2 (41.02 -> 41.02 on 0.8.0), one layer 4.00
        assert loop >= before and loop >= 2 * one, (before, loop, one)
    else:  # one at a time: 13.02 -> 4.02, under twice one layer's 4.00 and under the scan's
        assert loop < 2 * one and loop < scan, (before, loop, scan, one)
    layered = preflight.residuals(_per_layer, x)  # and the loop of checkpoints, asked itself
    for words in (f"jax.checkpoint is applied {_LAYERS} times at test_residuals.py:",
                  f"holds {format_bytes(loop)} of temporaries",
                  (f"one of them alone: {format_bytes(one)}" if together
                   else f"one of them alone holds ({format_bytes(one)})")):
        assert words in layered.advice, words
    scan_advice = "one lax.scan over their stacked parameters or inputs"
    assert (scan_advice in layered.advice) == together
    assert ("XLA recomputes them one at a time" in layered.advice) == (not together)


# --- google/flax#2051: a one-hot XLA recomputes inside its fusions ---------------------------
_ROWS, _CLASSES = 512, 2048


def _one_hot_loss(logits, labels):
    onehot = jax.nn.one_hot(labels, _CLASSES)
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))


def _integer_loss(logits, labels):
    lp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], axis=-1))


def test_google_flax_2051_a_one_hot_xla_fuses_away_is_said_to_cost_nothing():
    """The kit listed the one-hot as 4 MiB kept (64 MiB in the thread's sizes) and advised
    jax.checkpoint; XLA's compiled gradient holds no buffer of it."""
    logits, labels = jnp.zeros((_ROWS, _CLASSES)), jnp.zeros(_ROWS, jnp.int32)
    r = preflight.residuals(_one_hot_loss, logits, labels)
    temp = _temp(_one_hot_loss, logits, labels)
    for words in ("4.00 MiB of the 8.00 MiB kept (the largest, float32[512, 2048], output of "
                  "jitted function '_one_hot'", "is made from integers alone",
                  f"({format_bytes(temp)} of temporaries) holds no buffer of it",
                  "costs no memory and needs no change", "google/flax#2051",
                  "4.00 MiB is kept between the forward and backward pass"):
        assert words in r.advice, words
    # what XLA compiled: nothing made inside _one_hot, and no more than with integer labels
    step = compiled.compile_step(jax.grad(_one_hot_loss), logits, labels)
    assert not [v for v in step.values if "jit(_one_hot)" in v["op"]]
    assert temp <= _temp(_integer_loss, logits, labels) + 64 * 1024  # 4.00 vs 4.01 (0.25 vs 4.13)
    assert "integers alone" not in preflight.residuals(_integer_loss, logits, labels).advice


def _carried_buffer_loss(xs):  # jax#15906: each step written into a buffer the scan carries
    def body(state, _):
        i, ys = state
        new = jax.lax.dynamic_update_index_in_dim(ys, xs[i] * jnp.sqrt(i + 1.0), i, axis=0)
        return (i + 1, jnp.where(i > -10, new, ys)), None
    (_, ys), _ = jax.lax.scan(body, (0, jnp.zeros_like(xs)), None, length=xs.shape[0])
    return jnp.sum(jnp.sin(ys))


def test_jax_15906_a_few_bytes_of_scan_steps_beside_a_large_carry_get_no_chunk_advice():
    """jax-ml/jax#15906 (a new user's trial): 1.27 KiB of scan outputs beside a 250 KiB carried
    buffer got "a lax.scan over jax.checkpoint-ed chunks", and the trial's predicted peak rose
    following it (1.96 -> 2.44 MiB). The scan's steps are too little of what is kept for
    chunks to save anything; preflight_step names the carried buffer (its carry-copy note)."""
    r = preflight.residuals(_carried_buffer_loss, jnp.ones((100, 10, 64)))
    assert 0 < r.scan_bytes * 4 < r.saved_bytes
    assert "checkpoint-ed chunks" not in r.advice and "are scan outputs" not in r.advice
    assert "preflight_step(jax.grad(loss)" in r.advice, r.advice
