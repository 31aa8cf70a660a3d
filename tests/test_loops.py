"""What a loop holds: a buffer a loop carries and only writes, a value per step (its record),
and a carry XLA copies whole on every step."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import mlir

from helpers import compiled, preflight
from helpers._internal import (
    jaxpr_loops,
)

MiB = 2**20
D, MAX_STEPS = 1024, 4096


# --- equinox's maybe_set, in plain JAX ---------------------------------------------------------
# equinox (0.13.8) writes the buffers of its while_loop (diffrax's SaveAt(steps=True)) with its
# own primitive, maybe_set(pred, xs, x, i), lowered with mlir.lower_fun to a select and an
# .at[i].set: in the jaxpr it stays one equation named maybe_set, and the loop body returns its
# result through a copy. The same mechanism, without equinox:
def _maybe_set_impl(pred, xs, x, i):
    return [xs.at[i].set(jnp.where(pred, x, xs[i]))]


_maybe_set_p = core.Primitive("maybe_set")
_maybe_set_p.multiple_results = True
_maybe_set_p.def_impl(_maybe_set_impl)
_maybe_set_p.def_abstract_eval(lambda pred, xs, x, i: [xs])
mlir.register_lowering(_maybe_set_p, mlir.lower_fun(_maybe_set_impl, multiple_results=True))


def _maybe_set(pred, xs, x, i):
    [out] = _maybe_set_p.bind(pred, xs, x, i)
    return jnp.copy(out)  # equinox's body returns the buffer through a copy


def _solve(write, t1=3.0):
    """diffrax's loop in miniature: adaptive steps of dy/dt = -y until t1, each step's y saved
    into a buffer of MAX_STEPS rows (SaveAt(steps=True)); returns the rows and the steps taken."""
    def solve(y0):
        def cond(c):
            t, _, _, i, _ = c
            return (t < t1) & (i < MAX_STEPS)

        def body(c):
            t, y, dt, i, buf = c
            dt = jnp.minimum(dt, t1 - t)
            y = y - dt * y
            return t + dt, y, dt * 1.5, i + 1, write(buf, y, i)

        buf = jnp.full((MAX_STEPS, D), jnp.inf, y0.dtype)
        init = (jnp.float32(0), y0, jnp.float32(0.01), 0, buf)
        *_, n, buf = jax.lax.while_loop(cond, body, init)
        return buf, n
    return solve


def _solve_at(save_ts, t1=3.0):
    """SaveAt(ts=save_ts), the thread's fix: a buffer of len(ts) rows, a row written when a
    step passes the next save time."""
    def solve(y0):
        def cond(c):
            t, _, _, i, _, _ = c
            return (t < t1) & (i < MAX_STEPS)

        def body(c):
            t, y, dt, i, j, buf = c
            dt = jnp.minimum(dt, t1 - t)
            y, t = y - dt * y, t + dt
            hit = (j < len(save_ts)) & (t >= save_ts[jnp.minimum(j, len(save_ts) - 1)])
            buf = _maybe_set(hit, buf, y, jnp.minimum(j, len(save_ts) - 1))
            return t, y, dt * 1.5, i + 1, j + hit, buf

        init = (jnp.float32(0), y0, jnp.float32(0.01), 0, 0, jnp.zeros((len(save_ts), D)))
        return jax.lax.while_loop(cond, body, init)[-1]
    return solve


def test_diffrax_238_save_at_steps_written_by_equinox_maybe_set_is_named_with_save_at_ts():
    """patrick-kidger/diffrax#238: SaveAt(steps=True) returns max_steps (4096) rows, inf after
    the steps taken. The kit's loop note did not see equinox's maybe_set write at all (with
    real diffrax 0.7.2 it said nothing about the 16 MiB buffer)."""
    y0 = jnp.ones(D)
    steps = _solve(lambda buf, y, i: _maybe_set(True, buf, y, i))
    buf, n = jax.jit(steps)(y0)
    assert int(n) < 20 and buf.shape[0] == MAX_STEPS  # 13 steps taken, 4096 rows
    (loop, whole, step, dtype, nbytes, _, write, count, _), = [
        r for r in jaxpr_loops.loop_records(jax.make_jaxpr(steps)(y0)) if r[4] >= MiB]
    assert (loop, whole, step, write, count) == ("while", (MAX_STEPS, D), (D,), "maybe_set",
                                                 None)
    p = preflight.preflight_step(steps, y0)
    assert p.loop_records[0][:3] == ("float32[4096, 1024]", "float32[1024]", 16 * MiB)
    note = p.advice
    assert "4096 rows sized by its bound, not by the steps it takes" in note
    assert "SaveAt(ts=...)" in note and "max_steps" in note
    assert "patrick-kidger/diffrax#238" in note
    assert "memory the loop must have" not in note  # 13 of 4096 rows are written
    # the fix, run: save at 6 times, a buffer of 6 rows
    at = _solve_at(jnp.linspace(0.5, 3.0, 6))
    assert bool(jnp.isfinite(jax.jit(at)(y0)).all())
    fixed = preflight.preflight_step(at, y0)
    assert "diffrax#238" not in fixed.advice
    assert p.peak_bytes >= 16 * MiB and fixed.peak_bytes < 128 * 1024  # 16 MiB -> KiB


def test_diffrax_238_a_while_loop_buffer_is_sized_by_its_bound_not_each_of_its_steps():
    """The plain-JAX loop (buf.at[i].set(y)) was named, but as "a value of each of its 4096
    steps ... memory the loop must have" when the loop took 13 steps: 4096 is its bound."""
    y0 = jnp.ones(D)
    steps = _solve(lambda buf, y, i: buf.at[i].set(y))
    assert int(jax.jit(steps)(y0)[1]) < 20
    note = preflight.preflight_step(steps, y0).advice
    assert "sized by its bound, not by the steps it takes" in note
    assert "memory the loop must have" not in note
    assert "write only the steps you need" in note and "lower the bound" in note
    assert "diffrax#238" in note


def test_gemma_534_a_scan_buffer_of_one_row_a_step_is_still_memory_the_loop_must_have():
    """A scan has a step count: a buffer of one row per step holds a value of each step (the
    gemma#534 note unchanged); a buffer of more rows than steps is named as such."""
    def record(rows, length):
        def f(x):
            def body(buf, i):
                return buf.at[i].set(jnp.tanh(x * i)), None
            return jax.lax.scan(body, jnp.zeros((rows, 4096)), jnp.arange(length))[0]
        return f

    x = jnp.ones(4096)
    full = preflight.preflight_step(record(256, 256), x).advice
    assert "a value of each of its 256 steps" in full and "memory the loop must have" in full
    assert "sized by its bound" not in full
    spare = preflight.preflight_step(record(1024, 64), x).advice
    assert "1024 rows, of which its 64 steps write at most 64" in spare
    assert "memory the loop must have" not in spare

    def decode(buf, x):  # a buffer handed in, its first 192 rows a prompt's (review: not to shrink)
        return jax.lax.fori_loop(192, 256, lambda i, b: b.at[i].set(jnp.tanh(x * i)), buf)

    handed = preflight.preflight_step(decode, jnp.zeros((256, 4096)), x).advice
    assert "of which its 64 steps write 64: the others keep what the buffer held" in handed
    assert "Size the buffer by the steps" not in handed


# --- a carry XLA copies whole on every step ----------------------------------------------------
def _rows_in_carry(n):
    """jax-ml/jax#10197: each step writes a row into the carried buffer P."""
    def g(p0):
        P = jnp.concatenate([p0[None], jnp.zeros([n - 1, 10, 10])])

        def body(P, i):
            return P.at[i].set(jnp.sin(P[i - 1])), None
        return jnp.sum(jax.lax.scan(body, P, jnp.arange(1, n))[0][-1])
    return g


def _rows_as_ys(n):
    """The thread's fix: carry the last row, return the rows as the scan's output."""
    def g(p0):
        def body(prev, i):
            new = jnp.sin(prev)
            return new, new
        rows = jax.lax.scan(body, p0, jnp.arange(1, n))[1]
        return jnp.sum(jnp.concatenate([p0[None], rows])[-1])
    return g


def test_jax_10197_a_row_written_into_a_scan_carry_under_grad_is_copied_whole_each_step():
    """Under jax.grad, XLA copies the whole carried buffer on each step of the scan: quadratic
    in its length (measured by the kit on the CPU, n=4000: 677 ms, 3.1 ms with the rows as
    ys). The kit listed an unlabelled copy temporary and said nothing."""
    p0 = jnp.ones((10, 10))
    slow = compiled.compile_step(jax.grad(_rows_in_carry(2000)), p0).carry_copies()
    assert slow and slow[0][:5] == ("float32", (2000, 10, 10), 800_000, 2, 1999)
    assert slow[0][5] is True  # inside the derivative
    priced = preflight.preflight_step(jax.grad(_rows_in_carry(2000)), p0)
    note = priced.advice
    assert priced.carry_copies[0][:4] == ("float32[2000, 10, 10]", 800_000, 2, 1999)
    assert "XLA copies the loop's carried float32[2000, 10, 10] (781.25 KiB) whole" in note
    assert "each of its 1999 steps" in note and "jax-ml/jax#10197" in note
    assert note.index("return each step's row as the scan's output") < note.index("#17845")
    # the fix, run: the same gradient, no copy of a carried buffer
    fixed = compiled.compile_step(jax.grad(_rows_as_ys(2000)), p0)
    assert fixed.carry_copies() == ()
    assert "jax-ml/jax#10197" not in preflight.preflight_step(jax.grad(_rows_as_ys(2000)),
                                                              p0).advice
    assert jnp.allclose(jax.grad(_rows_as_ys(300))(p0), jax.grad(_rows_in_carry(300))(p0))
    # without the gradient the row is written in place: no copy, no note
    assert compiled.compile_step(_rows_in_carry(2000), p0).carry_copies() == ()


S = 64


def _slow_pop(carry, idx):
    """jax-ml/jax#17845: the value read before the write, returned after it."""
    value = carry[idx]
    carry = jax.lax.dynamic_update_slice(carry, jax.lax.dynamic_slice(carry, (idx + 1,), (S,)),
                                         (idx,))
    return carry, value


def _fast_pop(carry, idx):
    """patrick-kidger's fix (jax-ml/jax#17640): stash the value in a spare slot, read it after
    the writes."""
    carry = jax.lax.dynamic_update_slice(carry, jax.lax.dynamic_slice(carry, (idx,), (1,)),
                                         (carry.shape[0] - 1,))
    carry = jax.lax.dynamic_update_slice(carry, jax.lax.dynamic_slice(carry, (idx + 1,), (S,)),
                                         (idx,))
    return carry, carry[-1]


def _pops(pop):
    def f(carry):
        return jax.lax.scan(pop, carry, jnp.arange(2000) % 100)
    return f


def test_jax_17845_a_carry_read_before_its_write_is_copied_whole_each_step():
    """Reading carry[idx] before the write and returning it makes XLA copy the whole carry on
    every step (measured by the kit on the CPU, 2000 steps over 1e6 floats: 607 ms, 0.4 ms
    read after the writes). The kit said "donate carry", which leaves the copy."""
    x = jnp.zeros(100_000)
    p = preflight.preflight_step(_pops(_slow_pop), x)
    note = p.advice
    assert "XLA copies the loop's carried float32[100000] (390.62 KiB) whole" in note
    assert "each of its 2000 steps" in note and "jax-ml/jax#17845" in note
    assert note.index("read it after the writes") < note.index("#10197")
    assert "jax.lax.scan(pop, carry" in note  # the scan's own line
    fixed = preflight.preflight_step(_pops(_fast_pop), x)
    assert "jax-ml/jax#17845" not in fixed.advice
    xs = jnp.arange(5000.0)
    assert jnp.array_equal(jax.jit(_pops(_slow_pop))(xs)[1], jax.jit(_pops(_fast_pop))(xs)[1])


def test_jax_10197_an_ordinary_scan_and_threefry_rounds_get_no_carry_copy_note():
    """A scan whose carry the step rewrites whole (an RNN's state), a layer scan under grad (XLA
    copies its 1 MiB activations each step, but the step makes them anew), a KV cache, and
    the copies of XLA's own loop for jax.random's threefry rounds (5 steps, no loop of the
    user's) are no carry-copy note."""
    h = jnp.ones((512, 512))
    w = jnp.ones((512, 512)) / 512

    def rnn(h, w):
        return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), h, None, length=64)[0].sum()

    def layers(ws, x):
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)[0].sum()

    def draws(key):
        return jax.random.normal(key, (1024, 512)).sum()

    def decode(x):  # a KV cache: read, then a row written in place
        def body(i, cache):
            return cache.at[:, i].set(x * (cache * x[:, None]).sum())
        return jax.lax.fori_loop(0, 64, body, jnp.zeros((4, 64, 2048)))

    for fn, args in ((rnn, (h, w)), (jax.grad(rnn), (h, w)), (decode, (jnp.ones((4, 2048)),)),
                     (jax.grad(layers), (jnp.ones((32, 512, 512)) / 512, h)),
                     (draws, (jax.random.key(0),))):
        assert compiled.compile_step(fn, *args).carry_copies() == (), fn
        assert compiled.compile_step(fn, *args).carry_slice_copies() == (), fn
        assert "XLA copies the loop's carried" not in preflight.preflight_step(fn, *args).advice


# --- a KV cache in a decode loop ---------------------------------------------------------------
L, KV_S, KV_H, KV_D = 8, 512, 4, 64
def _kv_w():  # made when asked: importing the tests starts no backend (on a GPU, its pool)
    with jax.ensure_compile_time_eval():  # an array, also where asked inside a trace
        return jax.random.normal(jax.random.key(0), (L, KV_H * KV_D, KV_H * KV_D)) * 0.02


def _attend(x, k, v):
    att = jnp.einsum("hd,shd->hs", x.reshape(KV_H, KV_D), k)
    return jnp.einsum("hs,shd->hd", jax.nn.softmax(att, -1), v).reshape(KV_H * KV_D)


def _scan_cache_as_xs(cache, w, x, pos):
    """marin-community/levanter#1249: one cache stacked over layers, scanned with the layers
    as xs and given back updated as ys."""
    def layer(x, inp):
        wi, c = inp
        kv = (x @ wi).reshape(1, KV_H, KV_D)
        c = jax.lax.dynamic_update_slice(c, jnp.stack([kv, kv]), (0, pos, 0, 0))
        return jnp.tanh(_attend(x, c[0], c[1])), c
    x, cache = jax.lax.scan(layer, x, (w, cache))
    return cache, x


def _fori_cache_in_carry(cache, w, x, pos):
    """The fix: the whole cache in a fori_loop's carry, layer i's row written in place."""
    def layer(i, c):
        x, cache = c
        kv = (x @ w[i]).reshape(1, 1, 1, KV_H, KV_D)
        cache = jax.lax.dynamic_update_slice(cache, jnp.concatenate([kv, kv], 1),
                                             (i, 0, pos, 0, 0))
        k = jax.lax.dynamic_index_in_dim(cache, i, 0, keepdims=False)
        return jnp.tanh(_attend(x, k[0], k[1])), cache
    x, cache = jax.lax.fori_loop(0, L, layer, (x, cache))
    return cache, x


def _list_of_caches(caches, w, x, pos):
    """The maintainer's fix (List[Cache]): one cache per layer, each updated in place."""
    new = []
    for i in range(L):
        kv = (x @ w[i]).reshape(1, KV_H, KV_D)
        c = jax.lax.dynamic_update_slice(caches[i], jnp.stack([kv, kv]), (0, pos, 0, 0))
        x = jnp.tanh(_attend(x, c[0], c[1]))
        new.append(c)
    return tuple(new), x


def test_levanter_1249_a_kv_cache_scanned_as_xs_and_ys_is_told_to_carry_it_not_return_less():
    """A decode step scans over 8 stacked layers with the stacked cache (8 MiB here) as xs and
    its updated slices as ys: every call builds a new stacked cache to write one row per layer,
    donated or not. The kit said "Return less from the body (a sum, or the last value, belongs
    in the carry)", impossible for a cache. Its new note names the carry and the per-layer list
    (51 -> 10 ms per token at 32 MiB: the helper's timing on the CPU, not asserted)."""
    cache = jnp.zeros((L, 2, KV_S, KV_H, KV_D))
    x, pos = jnp.ones(KV_H * KV_D), jnp.int32(3)
    slow = preflight.preflight_step(jax.jit(_scan_cache_as_xs, donate_argnums=0), cache, _kv_w(),
                                    x, pos)
    (stack,) = slow.scan_stacks
    assert stack.updated_bytes == stack.nbytes == 8 * MiB and stack.copied_bytes == 0
    note = slow.advice
    assert "takes a float32[8, 2, 512, 4, 64] in as xs and gives it back as ys" in note
    assert "every call builds a new 8.00 MiB stacked array" in note
    assert "Carry the array instead" in note and "lax.dynamic_update_slice at (i, ...)" in note
    assert "list of per-layer arrays" in note and "marin-community/levanter#1249" in note
    assert "Return less from the body" not in note
    assert "jax.lax.scan(layer, x, (w, cache))" in note  # the scan's own line
    assert slow.temp_bytes >= 8 * MiB  # a new stack every call, though the cache is donated
    # the fixes, run: the same output; no stack, and XLA's temporaries a fraction of the cache
    carried = preflight.preflight_step(jax.jit(_fori_cache_in_carry, donate_argnums=0),
                                       cache, _kv_w(), x, pos)
    caches = tuple(jnp.zeros((2, KV_S, KV_H, KV_D)) for _ in range(L))
    listed = preflight.preflight_step(jax.jit(_list_of_caches, donate_argnums=0), caches,
                                      _kv_w(), x, pos)
    for fixed in (carried, listed):
        assert fixed.scan_stacks == () and "levanter#1249" not in fixed.advice
        assert fixed.carry_slice_copies == () and fixed.carry_copies == ()
    assert carried.temp_bytes < 2 * MiB and listed.temp_bytes < 4 * MiB  # from >= 8 MiB
    out = jax.jit(_scan_cache_as_xs)(cache, _kv_w(), x, pos)
    for fix, start in ((_fori_cache_in_carry, cache), (_list_of_caches, caches)):
        got = jax.jit(fix)(start, _kv_w(), x, pos)
        assert jnp.allclose(got[1], out[1], atol=1e-5)
        assert jnp.allclose(jnp.stack(got[0]) if isinstance(got[0], tuple) else got[0], out[0])


def test_levanter_1249_a_scan_that_returns_other_ys_keeps_the_return_less_note():
    """A scan whose ys are values of its own (not its xs updated) keeps the old advice."""
    def f(x, w):
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), jnp.tanh(h @ wi)), x, w)[1]
    note = preflight.preflight_step(f, jnp.ones((512, 512)), jnp.ones((16, 512, 512))).advice
    assert "Return less from the body" in note and "levanter#1249" not in note


def test_levanter_1249_ys_computed_from_the_xs_slice_are_not_rows_written_into_it():
    """A reread's finding: the write primitives were named _UPDATES, and a later _UPDATES of
    the same module (every elementwise update, for updated_inputs) replaced them, so a body
    returning ``x * 2.0`` of its xs slice was told "gives it back as ys with rows written ...
    Carry the array instead" (the KV-cache note). Only writes count now."""
    def f(xs):
        return jax.lax.scan(lambda c, x: (c + x.sum(), x * 2.0), 0.0, xs)
    xs = jnp.ones((16, 512, 256))
    pre = preflight.preflight_step(f, xs)
    (stack,) = pre.scan_stacks
    assert stack.updated_bytes == 0 and stack.nbytes == 8 * MiB
    assert "levanter#1249" not in pre.advice and "Return less from the body" in pre.advice


B, STEPS = 1, 64


def _kv_layer(x, cache, i, pos, stack):
    """keras-team/keras-hub#2780's update: the layer's K and V sliced out of one cache
    [B, layers, 2, S, H, D], a row written into each, then stacked back (stack=True); stack=False
    writes the row into the cache and reads K and V after (PR #2781's shape)."""
    kv = (x @ _kv_w()[i]).reshape(B, 1, KV_H, KV_D)
    if stack:
        cur = cache[:, i]
        k = jax.lax.dynamic_update_slice(cur[:, 0], kv, (0, pos, 0, 0))
        v = jax.lax.dynamic_update_slice(cur[:, 1], kv, (0, pos, 0, 0))
        cache = jax.lax.dynamic_update_slice(cache, jnp.stack((k, v), axis=1)[:, None],
                                             (0, i, 0, 0, 0, 0))
    else:
        cache = jax.lax.dynamic_update_slice(cache, kv[:, None, None], (0, i, 0, pos, 0, 0))
        cache = jax.lax.dynamic_update_slice(cache, kv[:, None, None], (0, i, 1, pos, 0, 0))
        k, v = cache[:, i, 0], cache[:, i, 1]
    return jnp.tanh(_attend(x[0], k[0], v[0]))[None], cache


def _generate_one_cache(stack, layers=4):
    def generate(cache, x):
        def body(c):
            pos, x, cache = c
            for i in range(layers):
                x, cache = _kv_layer(x, cache, i, pos, stack)
            return pos + 1, x, cache
        return jax.lax.while_loop(lambda c: c[0] < STEPS, body, (0, x, cache))[1:]
    return generate


def _generate_kv_buffers(ks, vs, x, layers=4):
    """The fix: one K and one V buffer per layer, each updated in place, no stack."""
    def body(c):
        pos, x, ks, vs = c
        ks, vs = list(ks), list(vs)
        for i in range(layers):
            kv = (x @ _kv_w()[i]).reshape(B, 1, KV_H, KV_D)
            ks[i] = jax.lax.dynamic_update_slice(ks[i], kv, (0, pos, 0, 0))
            vs[i] = jax.lax.dynamic_update_slice(vs[i], kv, (0, pos, 0, 0))
            x = jnp.tanh(_attend(x[0], ks[i][0], vs[i][0]))[None]
        return pos + 1, x, tuple(ks), tuple(vs)
    return jax.lax.while_loop(lambda c: c[0] < STEPS, body, (0, x, tuple(ks), tuple(vs)))[1:]


def test_keras_hub_2780_a_kv_cache_sliced_and_stacked_back_each_step_is_named():
    """keras-team/keras-hub#2780: per layer, the decode loop slices K and V out of the one
    cache, writes a row into each and stacks them back (jnp.stack): XLA copies both slices and
    concatenates them on every step (8 copies of 512 KiB and 4 concatenates of 1 MiB a step
    here), 2x the time of separate K and V buffers (187 -> 93 ms at S=2048 on the CPU, the
    helper's timing, not asserted). The kit said only "Nothing donated for cache"."""
    cache, x = jnp.zeros((B, 4, 2, KV_S, KV_H, KV_D)), jnp.ones((B, KV_H * KV_D))
    slow = compiled.compile_step(_generate_one_cache(True), cache, x).carry_slice_copies()
    (dtype, shape, nbytes, copies, joins, moved, steps, line, _), = slow
    assert (dtype, shape, nbytes, steps) == ("float32", (1, 4, 2, 512, 4, 64), 4 * MiB, STEPS)
    assert (copies, joins, moved) == (8, 4, 8 * MiB)  # 8 x 512 KiB copied, 4 x 1 MiB joined
    assert "jax.lax.while_loop" in line
    p = preflight.preflight_step(_generate_one_cache(True), cache, x)
    assert p.carry_slice_copies == (("float32[1, 4, 2, 512, 4, 64]", 4 * MiB, 8, 4, 8 * MiB,
                                     STEPS, line),)
    note = p.advice
    assert ("updates its carried float32[1, 4, 2, 512, 4, 64] (4.00 MiB) in place, yet XLA "
            "copies slices of it and concatenates them back on each of its 64 steps (8 copies, "
            "4 concatenates; 8.00 MiB moved a step, 512.00 MiB a call) to write a row" in note)
    assert "separate buffers in the carry" in note and "lax.dynamic_update_slice" in note
    assert "keras-team/keras-hub#2780" in note
    if jax.__version_info__ >= (0, 10):  # 0.8.0's program records the loop's line for it
        assert "jnp.stack((k, v), axis=1)" in note
    # the fix, run: the same tokens, no slice copied nor concatenated
    ks = tuple(jnp.zeros((B, KV_S, KV_H, KV_D)) for _ in range(4))
    fixed = preflight.preflight_step(_generate_kv_buffers, ks, ks, x)
    assert fixed.carry_slice_copies == () and "keras-hub#2780" not in fixed.advice
    assert compiled.compile_step(_generate_one_cache(False), cache, x).carry_slice_copies() == ()
    want = jax.jit(_generate_one_cache(True))(cache, x)[0]
    assert jnp.allclose(jax.jit(_generate_kv_buffers)(ks, ks, x)[0], want, atol=1e-5)
    assert jnp.allclose(jax.jit(_generate_one_cache(False))(cache, x)[0], want, atol=1e-5)


RNN_B, RNN_T, RNN_D = 64, 64, 1024


def _rnn_into_buffer(out, xs, w):
    """An RNN that writes each step's state into a carried output buffer and feeds
    concatenate([x, h]) to its cell: no KV cache, no slice of the buffer copied."""
    def body(i, c):
        out, h = c
        h = jnp.tanh(jnp.concatenate([xs[i], h[:, RNN_D // 2:]], -1) @ w)
        return jax.lax.dynamic_update_slice(out, h[None], (i, 0, 0)), h
    return jax.lax.fori_loop(0, RNN_T, body, (out, jnp.zeros((RNN_B, RNN_D))))


def _window_reader(hist, w):
    """A reader that carries a history buffer, writes row i in place and mixes its state with
    the mean of a 16-row window of the buffer through a concatenate."""
    def body(i, c):
        hist, h = c
        win = jax.lax.dynamic_slice(hist, (jnp.maximum(i - 16, 0), 0, 0), (16, RNN_B, RNN_D))
        ctx = win.mean(0)
        h = jnp.tanh(jnp.concatenate([h[:, :RNN_D // 2], ctx[:, RNN_D // 2:]], -1) @ w)
        return jax.lax.dynamic_update_slice(hist, h[None], (i, 0, 0)), h
    return jax.lax.fori_loop(0, RNN_T, body, (hist, jnp.zeros((RNN_B, RNN_D))))


def test_keras_hub_2780_an_rnn_writing_into_a_carried_buffer_is_no_kv_cache_note():
    """The keras-hub#2780 note matched copies and concatenates to the carried buffer by dtype
    and shape only: an RNN writing h into a carried f32[64, 64, 1024] output buffer with
    concatenate([x, h[:, D//2:]]) (0 slices of the buffer copied, 1 concatenate of 256 KiB a
    step, of x and h) was told "XLA copies slices of it and concatenates them back ... Keep
    each layer's K and V as separate buffers". A copy's operand and a concatenate's operands
    must now come from the carried buffer itself (followed back through slices, bitcasts,
    copies, in-place updates and fusion parameters); the code review's sl.py, both loops."""
    w = jnp.ones((RNN_D, RNN_D)) * 0.01
    buf = jnp.zeros((RNN_T, RNN_B, RNN_D))
    for fn, args in ((_rnn_into_buffer, (buf, jnp.ones((RNN_T, RNN_B, RNN_D // 2)), w)),
                     (_window_reader, (buf, w))):
        c = compiled.compile_step(jax.jit(fn, donate_argnums=0), *args)
        assert "concatenate(" in c.text, fn  # the concatenate is there, in the loop's body
        assert c.carry_slice_copies() == (), fn
        note = preflight.preflight_step(jax.jit(fn, donate_argnums=0), *args).advice
        assert "keras-hub#2780" not in note and "slices of it" not in note, fn
    # the buffer is the RNN's states, one row a step, written in place
    xs = jnp.ones((RNN_T, RNN_B, RNN_D // 2))
    out, h = jax.jit(_rnn_into_buffer)(buf, xs, w)
    assert jnp.allclose(out[-1], h) and not jnp.allclose(out[0], out[1])


def _zero13_loss(p, x):
    h = x
    for i in range(6):
        h = jnp.tanh(h @ p[f"w{i}"]) + h
    return jnp.mean(h ** 2)


def _zero13_pyloop(p, batch):
    """fattorib/ZeRO-transformer#13: gradient accumulation over 32 microbatches by a Python
    loop inside the jitted train_step (unrolled)."""
    mb, acc = batch.reshape(32, -1, 128), jax.tree.map(jnp.zeros_like, p)
    for k in range(32):
        acc = jax.tree.map(jnp.add, acc, jax.grad(_zero13_loss)(p, mb[k]))
    return jax.tree.map(lambda q, a: q - 1e-3 * a / 32, p, acc)


def _zero13_scan(p, batch):
    """The thread's fix: jax.lax.scan over the microbatches, the gradient sum its carry."""
    acc, _ = jax.lax.scan(lambda a, x: (jax.tree.map(jnp.add, a, jax.grad(_zero13_loss)(p, x)),
                                        None),
                          jax.tree.map(jnp.zeros_like, p), batch.reshape(32, -1, 128))
    return jax.tree.map(lambda q, a: q - 1e-3 * a / 32, p, acc)


def test_zero_transformer_13_unrolled_values_never_said_to_exceed_the_temporaries():
    """The note said "XLA's plan holds 218 of them (12.10 MiB of 3.25 MiB of temporaries)":
    values summed past the whole are not alive at once (XLA reuses their buffers)."""
    p = {f"w{i}": jnp.full((128, 128), 0.01) for i in range(6)}
    batch = jnp.ones((8 * 32, 128))
    r = preflight.preflight_step(jax.jit(_zero13_pyloop), p, batch)
    assert "is unrolled" in r.advice and "jax.lax.scan" in r.advice
    # the microbatch loop's line, not only the layers' (the thread's fix is a scan over it)
    assert "in a function called 32 times from test_loops.py:" in r.advice
    assert "for k in range(32)" not in r.advice and "jax.grad(_zero13_loss)(p, mb[k])" in r.advice
    assert "jax.lax.scan over that outer loop" in r.advice

    def only_a_loop(h):  # a function that is one loop alone, called once: nothing outer
        for _ in range(40):
            h = jnp.tanh(h @ p["w0"])
        return h

    once = preflight.preflight_step(jax.jit(lambda h: only_a_loop(h) * 2), batch)
    assert "is unrolled" in once.advice and "in a function called" not in once.advice
    c = compiled.compile_step(jax.jit(_zero13_pyloop), p, batch)
    line = [t for t in c.temporaries(4 * compiled.UNROLLED_AT) if t.line and t.line in r.advice]
    assert sum(t.nbytes for t in line) > r.temp_bytes  # the sum the old note printed
    assert "alive at once" not in r.advice
    # the thread's fix, run: the scan's program has a fraction of the operations, same result
    s = compiled.compile_step(jax.jit(_zero13_scan), p, batch)
    assert 4 * len(s.values) < len(c.values)
    assert "is unrolled" not in preflight.preflight_step(jax.jit(_zero13_scan), p, batch).advice
    got, want = jax.jit(_zero13_scan)(p, batch), jax.jit(_zero13_pyloop)(p, batch)
    assert all(np.allclose(got[k], want[k], rtol=1e-5) for k in p)


def _maxtext_5039_step(k: int, acc_dtype):
    """AI-Hypercomputer/maxtext#5039: gradient accumulation by a lax.scan over k microbatches
    of 8 rows, its carry (the gradient sum) allocated in ``acc_dtype``."""
    def loss(p, x):
        h = x
        for i in range(4):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def step(p, batch):
        def body(acc, x):
            g = jax.grad(loss)(p, x)
            return jax.tree.map(lambda a, g: a + g.astype(acc_dtype), acc, g), None
        acc0 = jax.tree.map(lambda q: jnp.zeros(q.shape, acc_dtype), p)
        acc, _ = jax.lax.scan(body, acc0, batch.reshape(k, -1, 512))
        return jax.tree.map(lambda q, a: q - (1e-3 * a / k).astype(q.dtype), p, acc)
    return step


def test_maxtext_5039_a_float32_accumulator_beside_bfloat16_parameters_is_named():
    p = {f"w{i}": jnp.full((512, 512), 0.01, jnp.bfloat16) for i in range(4)}  # 2 MiB
    batch = jnp.ones((8 * 4, 512), jnp.bfloat16)
    wide = preflight.preflight_step(
        jax.jit(_maxtext_5039_step(4, jnp.float32), donate_argnums=0), p, batch)
    assert ("carries 4.00 MiB of float32 with the shapes of 4 bfloat16 arguments (2.00 MiB): a "
            "gradient accumulator in float32, 2x the bytes") in wide.advice
    assert "jnp.zeros_like" in wide.advice and "AI-Hypercomputer/maxtext#5039" in wide.advice
    assert "test_loops.py" in wide.advice.split("carries 4.00 MiB")[0][-300:]  # its line
    # the fix, run: the carry in the parameters' dtype holds 2 MiB fewer temporaries
    narrow = preflight.preflight_step(
        jax.jit(_maxtext_5039_step(4, jnp.bfloat16), donate_argnums=0), p, batch)
    assert "gradient accumulator" not in narrow.advice
    assert wide.temp_bytes - narrow.temp_bytes >= 2 * 2**20 - 2**16  # 9.18 -> 7.18 MiB
    # quiet where the parameters are float32 (the accumulator is their own dtype)
    p32 = jax.tree.map(lambda q: q.astype(jnp.float32), p)
    same = preflight.preflight_step(
        jax.jit(_maxtext_5039_step(4, jnp.float32), donate_argnums=0), p32, batch)
    assert "gradient accumulator" not in same.advice
    # one microbatch: XLA folds the scan away, a float32 carry costs nothing (4.03 MiB both)
    one = [preflight.preflight_step(jax.jit(_maxtext_5039_step(1, dt), donate_argnums=0), p,
                                    batch[:8]) for dt in (jnp.float32, jnp.bfloat16)]
    assert one[0].temp_bytes == one[1].temp_bytes
    assert "gradient accumulator" not in one[0].advice


def _jax_3865_net(p, xc):
    h = jnp.tanh(xc @ p["w1"])
    return jnp.sum(jnp.tanh(h @ p["w2"]) ** 2)


def test_jax_3865_a_lax_map_under_grad_keeps_every_chunks_activations_and_remat_is_named():
    """jax-ml/jax#3865: the forward pass chunked with lax.map to save memory, grad taken
    outside it, still ran out of memory: JAX keeps every chunk's activations for the backward
    pass; wrap the mapped function in jax.remat (shoyer, jax-ml/jax#19614)."""
    p = {"w1": jnp.full((256, 1024), 0.01), "w2": jnp.full((1024, 256), 0.01)}
    x = jnp.ones((4096, 256))

    def loss(p, x):
        return jnp.sum(jax.lax.map(lambda xc: _jax_3865_net(p, xc), x.reshape(8, -1, 256)))

    def loss_remat(p, x):
        return jnp.sum(jax.lax.map(jax.checkpoint(lambda xc: _jax_3865_net(p, xc)),
                                   x.reshape(8, -1, 256)))

    kept = preflight.residuals(loss, p, x)
    assert "stacked over 8 steps" in str(kept) and "jax.checkpoint on the body" in str(kept)
    before = preflight.preflight_step(jax.jit(jax.grad(loss)), p, x)
    # the forward scan stacks each tanh's output and 1 - it on jax 0.8.0 and 0.10.2 (44 MiB);
    # 0.11.2's tanh JVP keeps one_minus_square(y) instead, and the second tanh's output is no
    # longer a residual (40 MiB; measured from each version's jaxpr and advice)
    kept = "44.00" if jax.__version_info__ < (0, 11) else "40.00"
    assert f"keeps a value for each of its 8 steps, {kept} MiB" in before.advice
    assert "jax.checkpoint on the body" in before.advice
    # the fix, run: the peak falls from 58 MiB (54 on 0.11.2) to 14 MiB, the gradient the same
    after = preflight.preflight_step(jax.jit(jax.grad(loss_remat)), p, x)
    assert 3 * after.peak_bytes < before.peak_bytes
    assert "keeps a value for each" not in after.advice
    g, h = jax.jit(jax.grad(loss))(p, x), jax.jit(jax.grad(loss_remat))(p, x)
    assert all(np.allclose(g[k], h[k], rtol=1e-5) for k in p)


# --- NovaSky-AI/SkyRL#1058: a decode scan that runs on after every row stopped -----------------
# A lax.scan of max_new_tokens steps whose carry keeps each row's "stopped" flag: once every row
# has stopped, the remaining steps compute tokens jnp.where throws away. The pull request's fix,
# a while_loop whose condition reads the flags, stops at the last row's stop token.
EOS, PAD = 1, 0


def _token(h, i, stopped):
    nxt = jnp.where(i >= 4 + jnp.arange(8), EOS, jnp.argmax(h, -1) + 2)  # row r stops at 4 + r
    return jnp.where(stopped, PAD, nxt)


def _decode(w, h0, n=256):
    def step(carry, i):
        h, stopped = carry
        h = jnp.tanh(h @ w)
        nxt = _token(h, i, stopped)
        return (h, stopped | (nxt == EOS)), nxt  # LINE-STOPPED

    _, tokens = jax.lax.scan(step, (h0, jnp.zeros(8, bool)), jnp.arange(n))  # LINE-SCAN
    return tokens.T


def _decode_until_stopped(w, h0, n=256):  # the fix the note gives
    def body(c):
        i, h, stopped, tokens = c
        h = jnp.tanh(h @ w)
        nxt = _token(h, i, stopped)
        return i + 1, h, stopped | (nxt == EOS), tokens.at[:, i].set(nxt)

    return jax.lax.while_loop(lambda c: (c[0] < n) & ~jnp.all(c[2]), body,
                              (0, h0, jnp.zeros(8, bool), jnp.full((8, n), PAD)))[3]


def test_skyrl_1058_a_scan_that_runs_on_after_every_row_stopped_is_named_with_the_while_loop():
    w = jnp.asarray(np.random.RandomState(0).randn(64, 64) / 8, jnp.float32)
    h0 = jnp.asarray(np.random.RandomState(1).randn(8, 64), jnp.float32)
    p = preflight.preflight_step(_decode, w, h0)
    ((length, flag, scan_line, flag_line),) = p.stopped_scans
    assert (length, flag) == (256, "bool[8]")
    assert "LINE-SCAN" in scan_line and "LINE-STOPPED" in flag_line
    said = p.advice
    assert "runs all 256 of its steps, though its carry keeps a flag, bool[8]" in said
    assert "LINE-STOPPED" in said and "LINE-SCAN" in said
    assert "jax.lax.while_loop whose condition is (i < n) & ~jnp.all(flag)" in said
    assert "buf.at[:, i].set(out)" in said
    # the fix: the same tokens, and nothing to say
    fixed = preflight.preflight_step(_decode_until_stopped, w, h0)
    assert not fixed.stopped_scans and "runs all" not in fixed.advice
    assert (np.asarray(jax.jit(_decode)(w, h0)) ==
            np.asarray(jax.jit(_decode_until_stopped)(w, h0))).all()
    # a flag the body never reads gates nothing; a flag that turns off again is no stop flag
    def counted(w, h0):
        def step(c, i):
            h, seen = c
            h = jnp.tanh(h @ w)
            return (h, seen | (jnp.argmax(h, -1) == EOS)), h[:, 0]
        return jax.lax.scan(step, (h0, jnp.zeros(8, bool)), jnp.arange(64))

    def toggled(w, h0):
        def step(c, i):
            h, on = c
            h = jnp.where(on[:, None], h, jnp.tanh(h @ w))
            return (h, ~on), h[:, 0]
        return jax.lax.scan(step, (h0, jnp.zeros(8, bool)), jnp.arange(64))

    def summed(w, h0):  # read, but only counted: stopping early would change the output
        def step(c, i):
            h, seen = c
            h = jnp.tanh(h @ w)
            seen = seen | (jnp.argmax(h, -1) == EOS)
            return (h, seen), jnp.sum(seen)
        return jax.lax.scan(step, (h0, jnp.zeros(8, bool)), jnp.arange(64))

    def rollout_loss(w, h0):  # under jax.grad a while_loop has no gradient: no such advice
        def step(c, i):
            h, done = c
            h = jnp.where(done[:, None], h, jnp.tanh(h @ w))
            return (h, done | (jnp.argmax(h, -1) == EOS)), jnp.where(done, 0.0, h[:, 0])
        return jax.lax.scan(step, (h0, jnp.zeros(8, bool)), jnp.arange(64))[1].sum()

    for silent in (counted, toggled, summed):
        assert not compiled.compile_step(silent, w, h0).stopped_scans(), silent.__name__
    assert compiled.compile_step(rollout_loss, w, h0).stopped_scans()  # forward: named
    assert not compiled.compile_step(jax.grad(rollout_loss), w, h0).stopped_scans()


def test_updated_inputs_reads_each_value_once_in_a_deep_unrolled_gradient():
    """A value read twice (sin(x) and cos(x) of one x), layer after layer, was walked once per
    path: 2**layers times (preflight_step of jax.grad of a 20-layer function took 89 s on the
    2-core VM, 30 layers did not end; a new user's trial of jax-ml/jax#14447). Each value is
    answered once now: the walk's calls grow with the equations, not the paths."""
    from helpers._internal import jaxpr_values

    def f(x):
        for i in range(40):
            x = jnp.sin(x) * 1.01 + 0.1 * jnp.cos(x * (i + 1))
        return jnp.sum(x ** 2)

    closed = jax.make_jaxpr(lambda x: (x - 0.1 * jax.grad(f)(x), jax.grad(f)(x)))(jnp.ones(8))
    calls = []
    real = jaxpr_values.called_jaxpr

    def counted(eqn):
        calls.append(1)
        return real(eqn)

    jaxpr_values.called_jaxpr = counted
    try:
        found = jaxpr_values.updated_inputs(closed)
    finally:
        jaxpr_values.called_jaxpr = real
    assert found == [frozenset({0}), frozenset()]  # x - lr * g is x's; the gradient is no one's
    assert len(calls) <= 4 * len(closed.jaxpr.eqns)


def test_jax_in_cell_37_deepmd_6_a_history_is_kept_every_k_steps_or_moved_to_the_host():
    """uwplasma/JAX-in-Cell#37: a simulation's scan returned every step's state and ran out of
    memory; the PR keeps every k-th (snapshots). SparkyTruck/deepmd-jax#6: a whole trajectory
    that is the result is run in chunks, each saved to the host. The note said only "return
    less from the body" (a trial). Both fixes it now names, run: the same snapshots, the same
    trajectory, and a stack k times smaller."""
    def step(x):
        return jnp.tanh(x @ x.T) * 0.5 + 0.1

    def history(x):
        return jax.lax.scan(lambda c, _: (step(c), step(c)), x, None, length=60)

    x = jnp.eye(96) * 0.3
    p = preflight.preflight_step(history, x)
    assert "keep every k-th step" in p.advice and "JAX-in-Cell#37" in p.advice
    assert "deepmd-jax#6" in p.advice

    def snapshots(x, k=10):  # the note's first fix: an outer scan, k steps in a fori_loop
        def between(c, _):
            c = jax.lax.fori_loop(0, k - 1, lambda i, s: step(s), c)
            c = step(c)
            return c, c
        return jax.lax.scan(between, x, None, length=60 // k)

    _, every = jax.jit(history)(x)
    _, kept = jax.jit(snapshots)(x)
    np.testing.assert_allclose(kept, every[9::10], rtol=1e-5, atol=1e-6)
    small = preflight.preflight_step(snapshots, x)
    assert small.output_bytes * 5 < p.output_bytes
    chunks, c = [], x  # the second: chunks from a Python loop, each moved to the host
    run = jax.jit(lambda c: jax.lax.scan(lambda c, _: (step(c), step(c)), c, None, length=20))
    for _ in range(3):
        c, ys = run(c)
        chunks.append(jax.device_get(ys))
    np.testing.assert_allclose(np.concatenate(chunks), every, rtol=1e-5, atol=1e-6)


def test_quantecon_329_shocks_drawn_whole_before_a_scan_are_drawn_per_step_instead():
    """QuantEcon/lecture-python.myst#329: a Kesten process drew three (T, M) matrices of shocks
    and scanned over them: out of memory on a 10 GB card. The maintainers drew each period's
    shocks inside the loop. preflight_step listed the three draws with no cause, and its first
    suggestion, donation, saved 3.81 MiB of 14.91 GiB (a trial). The fix it names, run: a key
    per step, the draws no longer in the program's peak; the same distribution."""
    t_steps, m = 200, 4000

    def whole(key, s):
        k1, k2 = jax.random.split(key)
        a = -0.5 + 0.1 * jax.random.normal(k1, (t_steps, s.shape[0]))
        e = 0.5 * jax.random.normal(k2, (t_steps, s.shape[0]))

        def update(s, ae):
            a, e = ae
            s = jnp.where(s < 1.0, jnp.exp(e), jnp.exp(a) * s + 1.0)
            return s, None
        return jax.lax.scan(update, s, (a, e))[0]

    def per_step(key, s):
        def update(s, t):
            k1, k2 = jax.random.split(jax.random.fold_in(key, t))
            a = -0.5 + 0.1 * jax.random.normal(k1, (m,))
            e = 0.5 * jax.random.normal(k2, (m,))
            return jnp.where(s < 1.0, jnp.exp(e), jnp.exp(a) * s + 1.0), None
        return jax.lax.scan(update, s, jnp.arange(t_steps))[0]

    key, s0 = jax.random.key(0), jnp.ones(m)
    p = preflight.preflight_step(whole, key, s0)
    assert [d[1] for d in p.scan_draws] == [t_steps * m * 4] * 2
    assert "jax.random.fold_in(key, t)" in p.advice and "lecture-python.myst#329" in p.advice
    fixed = preflight.preflight_step(per_step, key, s0)
    assert fixed.scan_draws == () and "#329" not in fixed.advice
    assert fixed.peak_bytes * 4 < p.peak_bytes
    a, b = np.asarray(whole(key, s0)), np.asarray(per_step(key, s0))
    assert abs(np.log(a).mean() - np.log(b).mean()) < 0.05  # the same process, other draws
    # at the thread's scale, compiled only: donating s (1 MiB of a 401 MiB need) is no tip (a
    # trial: listed first, 3.81 MiB of 14.91 GiB), though its own note still names it
    big = preflight.preflight_step(whole, key, jax.ShapeDtypeStruct((2**18,), jnp.float32),
                                   target="64 MiB")
    assert big.verdict == "will not fit" and "Try:" in big.advice
    assert "donate the arguments the step replaces" not in big.advice
    xs = jax.random.normal(key, (t_steps, m))  # drawn outside, an argument: not the step's
    scanned = preflight.preflight_step(
        lambda x, s: jax.lax.scan(lambda c, r: (c + r, None), s, x)[0], xs, s0)
    assert scanned.scan_draws == ()


def test_draws_a_jitted_layer_makes_and_uses_are_no_draws_before_the_scan_and_tokens_pass():
    """Two reviews of the #329 rule: an RNN scanned over a jitted encoder's output, which
    applies dropout, was told to draw it inside the body (the encoder's jaxpr draws, its
    output is no draw); and a step that makes a token (mpi4jax's create_token) made
    preflight_step raise (a token has no shape)."""
    @jax.jit
    def encoder(w, x, key):
        keep = jax.random.bernoulli(key, 0.9, x.shape)
        return jnp.tanh(jnp.where(keep, x / 0.9, 0.0) @ w)

    def step(w, u, x, key):
        h = encoder(w, x, key)
        s, _ = jax.lax.scan(lambda s, h_t: (jnp.tanh(s @ u + h_t), None), jnp.zeros((16, 64)), h)
        return jnp.sum(s)

    args = (jnp.ones((8, 64)) * 0.01, jnp.ones((64, 64)) * 0.01, jnp.ones((128, 16, 8)),
            jax.random.key(0))
    assert preflight.preflight_step(step, *args).scan_draws == ()

    def with_token(x):
        return jnp.sin(x) * 2.0, jax.lax.create_token()

    assert preflight.preflight_step(with_token, jnp.ones((256, 256))).verdict == "fits"
