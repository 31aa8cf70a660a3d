"""What a step's program makes whole for a result that keeps little of it: the full logits over
a vocabulary for a per-token loss (apple/axlearn#1236), an attention score matrix for a softmax
(google/flax#2858), jnp.einsum's pairwise intermediate (jax-ml/jax#24915), a whole sort sliced
to its first k (openxla/xla#25487's NumPy habit). Each thread in miniature: the kit's words
name the cause and the fix, the fix is run and shrinks what XLA holds, and ordinary steps get
none of these notes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import example_steps, preflight, program_notes
from helpers._internal import (
    jaxpr_products,
)
from tests.conftest import chunked_causal_attention

MiB = 2**20


def _temps(f, *args) -> int:
    """XLA's temporaries for ``f`` compiled for ``args``."""
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


# --- apple/axlearn#1236: the full logits over the vocabulary ------------------------------------
T, D, V = 512, 64, 4096  # logits f32[512, 4096]: 8 MiB


def _loss_full(w, h, labels):
    logits = h @ w
    logz = jax.nn.logsumexp(logits, axis=-1)
    return jnp.mean(logz - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0])


def _loss_chunked(w, h, labels, chunk=128):
    """The thread's fix: the loss over chunks of tokens in a scan, the body checkpointed."""
    @jax.checkpoint
    def body(total, xs):
        hc, lc = xs
        logits = hc @ w
        logz = jax.nn.logsumexp(logits, axis=-1)
        return total + jnp.sum(logz - jnp.take_along_axis(logits, lc[:, None], axis=-1)[:, 0]), None
    total, _ = jax.lax.scan(body, 0.0, (h.reshape(-1, chunk, D), labels.reshape(-1, chunk)))
    return total / T


def test_axlearn_1236_full_logits_named_and_a_chunked_loss_shrinks_them():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    w = jax.random.normal(k1, (D, V)) * 0.05
    h = jax.random.normal(k2, (T, D))
    labels = jax.random.randint(k3, (T,), 0, V)
    step = jax.value_and_grad(_loss_full, argnums=(0, 1))
    r = preflight.preflight_step(step, w, h, labels)
    assert r.softmax_products[0][:4] == ("logits", "f32[512, 4096]", 8 * MiB, D)
    for words in ("f32[512, 4096] (8.00 MiB", "is the full logits over the vocabulary",
                  "4,096 for each of 512 tokens from 64 features",
                  "a loss that keeps one value per token",
                  "jax.lax.scan over chunks of tokens with jax.checkpoint on the body",
                  "apple/axlearn#1236", "64.01 -> 12.13 MiB"):
        assert words in r.advice
    # the fix, run: the same loss and gradient, XLA holds far less, and the note is quiet
    fixed = jax.value_and_grad(_loss_chunked, argnums=(0, 1))
    (a, ga), (b, gb) = step(w, h, labels), fixed(w, h, labels)
    assert abs(float(a) - float(b)) < 1e-4
    assert max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(ga, gb, strict=True)) < 1e-4
    before, after = _temps(step, w, h, labels), _temps(fixed, w, h, labels)
    assert after * 3 < before, (before, after)  # 16.01 -> 4.03 MiB (jax 0.10.2 and 0.8.0)
    r2 = preflight.preflight_step(fixed, w, h, labels)
    assert not r2.softmax_products and "full logits" not in r2.advice


def test_axlearn_1236_without_a_derivative_the_fix_needs_no_checkpoint():
    w, h = jnp.zeros((D, V)), jnp.zeros((T, D))
    r = preflight.preflight_step(lambda w, h: jnp.argmax(h @ w, axis=-1), w, h)
    assert r.softmax_products and "full logits over the vocabulary" in r.advice
    assert "jax.checkpoint" not in r.advice.split("full logits")[1].split("(apple")[0]


# --- google/flax#2858: the attention score matrix ----------------------------------------------
B, S, H, DH = 2, 512, 2, 32  # scores f32[2, 2, 512, 512]: 4 MiB


def _attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def _attention_chunked(q, k, v, block=64):
    """Memory-efficient attention: a lax.map over blocks of queries, each checkpointed."""
    return chunked_causal_attention(q, k, v, block)


def _sum_squares(attention):
    return lambda q, k, v: jnp.sum(attention(q, k, v) ** 2)


def test_flax_2858_attention_scores_named_and_query_blocks_shrink_them():
    q, k, v = (jax.random.normal(key, (B, S, H, DH))
               for key in jax.random.split(jax.random.key(1), 3))
    step = jax.grad(_sum_squares(_attention), argnums=(0, 1, 2))
    r = preflight.preflight_step(step, q, k, v)
    assert r.softmax_products[0][:4] == ("attention", "f32[2, 2, 512, 512]", 4 * MiB, DH)
    for words in ("f32[2, 2, 512, 512] (4.00 MiB", "is the attention score matrix",
                  "512 queries x 512 keys per head", "made whole for the softmax over the keys",
                  "Chunk the queries: jax.lax.map, over blocks of queries, of a "
                  "jax.checkpoint-ed function that attends one block to all the keys",
                  "google/flax#2858", "130.06 -> 20.51 MiB",
                  "implementation='cudnn'", "not yet run on a GPU"):
        assert words in r.advice
    # the vmap is jax.nn.dot_product_attention's own (over one query group): not the user's
    assert "made under jax.vmap" not in r.advice
    forward = preflight.preflight_step(_attention, q, k, v).advice  # no derivative: no checkpoint
    assert "of a function that attends one block to all the keys" in forward
    fixed = jax.grad(_sum_squares(_attention_chunked), argnums=(0, 1, 2))
    diff = max(float(jnp.max(jnp.abs(a - b)))
               for a, b in zip(step(q, k, v), fixed(q, k, v), strict=True))
    assert diff < 1e-3
    before, after = _temps(step, q, k, v), _temps(fixed, q, k, v)
    assert after * 3 < before, (before, after)  # 16.26 -> 2.57 MiB (0.10.2), 16.51 -> 3.07 (0.8.0)
    r2 = preflight.preflight_step(fixed, q, k, v)
    assert not r2.softmax_products and "attention score matrix" not in r2.advice


def test_flax_5093_a_causal_mask_array_is_named_with_is_causal():
    """google/flax#5093: a causal layer built its mask as an array ([B, 1, T, T]) and passed it
    as mask=, which the PR replaced with is_causal (no T x T array; under cuDNN, no dense
    bias: JAX's source, not yet run on a GPU). The attention note said nothing of the mask (a
    trial). The fix it names, run: the same output; a call without mask= gets no word of it."""
    q, k, v = (jax.random.normal(key, (B, S, H, DH))
               for key in jax.random.split(jax.random.key(2), 3))
    causal = jnp.tril(jnp.ones((S, S), bool))[None, None]

    def masked(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, mask=causal)

    step = jax.grad(_sum_squares(masked), argnums=(0, 1, 2))
    advice = preflight.preflight_step(step, q, k, v).advice
    assert "attention score matrix" in advice and "pass is_causal=True instead" in advice
    assert "flax#5093" in advice and "combine_bias_and_mask" in advice
    np.testing.assert_allclose(masked(q, k, v), _attention(q, k, v), atol=1e-5)
    plain = preflight.preflight_step(jax.grad(_sum_squares(_attention), argnums=(0, 1, 2)),
                                     q, k, v).advice
    assert "attention score matrix" in plain and "is_causal=True instead" not in plain


# --- jax-ml/jax#24915: jnp.einsum's pairwise intermediate --------------------------------------
# 'ilj,jki->iljk': f32[64, 64, 64, 64], 64 MiB, from six 16 KiB operands (at n=48 XLA 0.8.0
# fuses the whole einsum into one loop and holds no such value: the kit says nothing there)
N = 64
SPEC = "ij,ik,il,jk,jl,kl->ij"


def _einsum_full(a, b, c, d, e, g):
    return jnp.einsum(SPEC, a, b, c, d, e, g)


def _einsum_rows(a, b, c, d, e, g):
    """The note's fix: a lax.map over chunks of the output's rows i."""
    return jax.lax.map(lambda r: jnp.einsum("j,k,l,jk,jl,kl->j", *r, d, e, g), (a, b, c),
                       batch_size=8)


def test_jax_24915_einsum_intermediate_named_and_row_chunks_shrink_it():
    xs = [jax.random.normal(key, (N, N)) for key in jax.random.split(jax.random.key(2), 6)]
    r = preflight.preflight_step(_einsum_full, *xs)
    assert r.einsum_intermediates[0][:4] == (SPEC, "f32[64, 64, 64, 64]", N**4 * 4,
                                             "ilj,jki->iljk")
    for words in (f"jnp.einsum('{SPEC}')", "makes f32[64, 64, 64, 64] (64.00 MiB)",
                  "4,096x the largest of its operands and its result",
                  "contracts two operands at a time along opt_einsum's path",
                  "its step 'ilj,jki->iljk' makes it", "jnp.einsum_path",
                  "Map over its output index i in chunks",
                  "jnp.einsum('j,k,l,jk,jl,kl->j', *r, *others)",
                  "(the 1st, 2nd, 3rd operands, which carry i), batch_size=k",
                  "jax-ml/jax#24915", "1.00 GiB -> 1.50 MiB"):
        assert words in r.advice
    # the fix the note spells out, run: the same result, and XLA holds far less
    a, b = jax.jit(_einsum_full)(*xs), jax.jit(_einsum_rows)(*xs)
    assert float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a))) < 1e-4
    before, after = _temps(_einsum_full, *xs), _temps(_einsum_rows, *xs)
    assert after * 10 < before, (before, after)  # 64.02 -> 0.38 MiB (0.10.2), 64.00 -> 0.50 (0.8.0)
    assert not preflight.preflight_step(_einsum_rows, *xs).einsum_intermediates


def test_jax_24915_the_row_fix_moves_an_index_that_is_not_first():
    fix = program_notes.einsum_note("ij,kj,lj->jk", (4, 4, 4), "f32", 64, 16, "", "")
    assert "output index j" in fix
    assert "jnp.einsum('i,k,l->k', *r, *others)" in fix
    assert "each with j moved to the front (jnp.moveaxis)" in fix
    assert "then jnp.moveaxis(out, 0, 0)" not in fix
    spec = jaxpr_products.einsum_step(SPEC, [(N, N)] * 6, N**4)
    assert spec == "ilj,jki->iljk"
    assert jaxpr_products.einsum_step(SPEC, [(N, N)] * 5, N**4) == ""  # shapes that do not fit


# --- openxla/xla#25487: a whole sort sliced to its first k -------------------------------------
NS, K = 1 << 18, 16


def test_xla_25487_argsort_then_slice_named_and_top_k_gives_the_same_indices():
    x = jax.random.normal(jax.random.key(3), (NS,))

    def smallest(x):
        return jnp.argsort(x)[:K]

    r = preflight.preflight_step(smallest, x)
    assert r.sliced_sorts[0][:4] == ("argsort", "float32[262144]", NS, K)
    for words in ("jnp.argsort at", "sorts all 262,144 elements of float32[262144]",
                  "keeps only the indices of the smallest 16",
                  "jax.lax.top_k(-x, 16)[1] gives the same indices, in the same order, "
                  "without sorting the rest", "32.00 -> 16.00 MiB", "openxla/xla#25487",
                  "topk_specializer.cc, not yet run on a GPU"):
        assert words in r.advice

    def fixed(x):
        return jax.lax.top_k(-x, K)[1]

    assert bool(jnp.all(jax.jit(fixed)(x) == jax.jit(smallest)(x)))
    before, after = _temps(smallest, x), _temps(fixed, x)
    assert after < before, (before, after)  # 2.00 -> 1.00 MiB (jax 0.10.2 and 0.8.0)
    assert not preflight.preflight_step(fixed, x).sliced_sorts


@pytest.mark.parametrize("f, end, kept", [
    (lambda x: jnp.argsort(x)[-K:], "largest", "indices"),
    (lambda x: jnp.argsort(x, descending=True)[:K], "largest", "indices"),
    (lambda x: jnp.argsort(x)[::-1][:K], "largest", "indices"),
    (lambda x: jnp.sort(x)[:K], "smallest", "values"),
    (lambda x: jax.vmap(lambda r: jnp.argsort(r)[:K])(x.reshape(4, -1)), "smallest", "indices"),
])
def test_xla_25487_each_end_and_form_of_the_slice_is_read(f, end, kept):
    found = jaxpr_products.sliced_sorts(jax.make_jaxpr(f)(jnp.zeros(NS)))
    assert [(s[3], s[4], s[5]) for s in found] == [(K, end, kept)]


@pytest.mark.parametrize("f", [
    lambda x: jnp.sort(x),  # all of it returned
    lambda x: jnp.median(x),  # a slice in the middle
    lambda x: x[jnp.argsort(x)],  # a whole permutation
    lambda x: jnp.argsort(x)[: NS // 4],  # a quarter: not k << n
])
def test_xla_25487_a_sort_used_whole_gets_no_note(f):
    assert jaxpr_products.sliced_sorts(jax.make_jaxpr(f)(jnp.zeros(NS))) == ()


def test_xla_25487_largest_k_note_says_the_order():
    note = program_notes.sliced_sort_note((NS,), "float32", NS, K, "largest", "indices",
                                          "argsort", "")
    assert "jax.lax.top_k(x, 16)[1]" in note and "largest first" in note


def test_xla_25487_ties_at_the_largest_end_are_said_to_keep_other_indices():
    """A review of the note: at the largest end, "gives the same indices" was false where
    values tie. argsort's slice keeps the highest indices among equal values, top_k the lowest
    (8 x 32,768 ones, k=50: [32718 32719 ...] against [0 1 ...]). The note says so; where the
    values differ the two agree."""
    x = jnp.ones((8, 32768))
    r = preflight.preflight_step(lambda x: jnp.argsort(x, axis=-1)[:, -50:], x)
    assert r.sliced_sorts[0][:4] == ("argsort", "float32[8, 32768]", 32768, 50)
    for words in ("jax.lax.top_k(x, 50)[1] gives the same indices where the values differ",
                  "among equal values top_k takes the lowest indices and the sort's slice the "
                  "highest"):
        assert words in r.advice
    sliced, top = np.asarray(jnp.argsort(x, axis=-1)[0, -50:]), np.asarray(
        jax.lax.top_k(x, 50)[1][0])
    assert list(sliced[:3]) == [32718, 32719, 32720] and list(top[:3]) == [0, 1, 2]
    distinct = jax.random.permutation(jax.random.key(0), 32768).astype(jnp.float32)
    assert bool(jnp.all(jnp.argsort(distinct)[-50:][::-1] == jax.lax.top_k(distinct, 50)[1]))
    # the smallest end: top_k(-x) takes the lowest indices first, as a stable sort does
    assert bool(jnp.all(jnp.argsort(x[0])[:50] == jax.lax.top_k(-x[0], 50)[1]))


@pytest.mark.parametrize("dtype", ["uint32", "int32"])
def test_xla_25487_integers_are_flipped_with_invert_not_negated(dtype):
    """A review of the note: for jnp.sort(u)[:10] on uint32 it gave -jax.lax.top_k(-x, 10)[0],
    which gives 1..10 where the sort gives 0..9: negating an unsigned int wraps around (and
    -x of int32's minimum is itself). ~x reverses the order of any integer without wrapping."""
    u = jnp.arange(1 << 20, dtype=dtype)[::-1]
    if dtype == "int32":
        u = u.at[5].set(jnp.iinfo(jnp.int32).min).at[9].set(jnp.iinfo(jnp.int32).min)
    r = preflight.preflight_step(lambda u: jnp.sort(u)[:10], u)
    assert "~jax.lax.top_k(~x, 10)[0] gives the same values, in the same order" in r.advice
    assert "-jax.lax.top_k(-x" not in r.advice
    want = np.asarray(jnp.sort(u)[:10])
    np.testing.assert_array_equal(np.asarray(~jax.lax.top_k(~u, 10)[0]), want)  # the fix, run
    assert not np.array_equal(np.asarray(-jax.lax.top_k(-u, 10)[0]), want)  # the old words
    idx = jax.lax.top_k(~u, 10)[1]  # the indices too: the same as argsort's, ties included
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(jnp.argsort(u)[:10]))


# --- a CLIP loss's similarity matrix is no logits over a vocabulary ----------------------------
B_CLIP, D_CLIP = 1024, 64


def _clip_loss(w, img, txt):
    a, b = img @ w, txt @ w
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    b = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
    logits = a @ b.T * 10.0
    lab = jnp.arange(B_CLIP)
    return -(jnp.mean(jax.nn.log_softmax(logits, -1)[lab, lab])
             + jnp.mean(jax.nn.log_softmax(logits.T, -1)[lab, lab])) / 2


def test_axlearn_1236_a_clip_similarity_matrix_is_not_called_logits_over_a_vocabulary():
    """A review of apple/axlearn#1236's note: a CLIP loss's f32[2048, 2048] similarity matrix
    (two projected batches, softmaxed along rows and along columns) was called "the full logits
    over the vocabulary", with a chunk-of-tokens fix that cannot compute
    log_softmax(logits.T). The note is given only where one operand of the product is the
    step's argument (a weight) and nothing reduces it along another axis: none here, and none
    for a weight's product softmaxed along both axes; apple/axlearn#1236's h @ w keeps it."""
    w, img, txt = jnp.eye(D_CLIP), jnp.ones((B_CLIP, D_CLIP)), jnp.ones((B_CLIP, D_CLIP))
    step = jax.jit(lambda w, i, t: w - 1e-3 * jax.grad(_clip_loss)(w, i, t))
    r = preflight.preflight_step(step, w, img, txt)
    assert not any(k == "logits" for k, *_ in r.softmax_products)
    assert "full logits" not in r.advice and "over the vocabulary" not in r.advice

    def both_ways(w, h):  # a weight's product, softmaxed along its rows and its columns
        logits = h @ w
        return jnp.sum(jax.nn.log_softmax(logits, -1)) + jnp.sum(jax.nn.log_softmax(logits.T))

    h, wv = jnp.ones((T, D)), jnp.ones((D, V))
    assert jaxpr_products.softmax_products(jax.make_jaxpr(both_ways)(wv, h)) == ()
    one_way = jaxpr_products.softmax_products(jax.make_jaxpr(
        lambda w, h: jnp.sum(jax.nn.log_softmax(h @ w, -1)))(wv, h))
    assert [(s[0], s[1]) for s in one_way] == [("logits", (T, V))]


# --- ordinary steps stay quiet ------------------------------------------------------------------
def _classifier_step(params, x, y):
    """An MLP classifier's SGD step with a softmax cross-entropy over 10 classes."""
    def loss(p):
        logits = jnp.tanh(x @ p["w1"]) @ p["w2"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _shapes(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)


@pytest.mark.parametrize("name", ["matmul_chain", "mlp_sgd_step", "scan_rnn", "classifier"])
def test_ordinary_steps_get_no_note_of_these(name):
    if name == "classifier":
        fn = _classifier_step
        args = ({"w1": np.zeros((784, 512), np.float32), "w2": np.zeros((512, 10), np.float32)},
                np.zeros((1024, 784), np.float32), np.zeros(1024, np.int32))
    else:
        fn, make = example_steps.EXAMPLES[name]
        args = make(1)
    r = preflight.preflight_step(fn, *_shapes(args))
    assert (r.softmax_products, r.einsum_intermediates, r.sliced_sorts) == ((), (), ())
    for words in ("full logits", "attention score matrix", "opt_einsum", "jax.lax.top_k"):
        assert words not in r.advice
