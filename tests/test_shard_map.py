"""shard_map's sums, put to preflight_step: a psum of a value already the same on every device
(a wrong number) and a psum whose sum every device keeps whole (jax-ml/jax#839), on the 4
simulated CPU devices of conftest."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import preflight
from helpers._internal import (
    jaxpr_sharding,
)

MiB = 2**20

if not hasattr(jax, "shard_map"):  # (jax 0.8.0 has it, with check_vma)
    pytest.skip("this jax has no jax.shard_map", allow_module_level=True)


def _mesh():
    return jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))


def _loss(w, xb):
    return jnp.sum(jnp.tanh(xb @ w) ** 2)


def _varying(w):
    """w made varying over 'x' (jax.lax.pcast from jax 0.8.2 on, pvary before)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(w, "x", to="varying")
    return jax.lax.pvary(w, "x")


def _step(local, out_specs=None, check_vma=True):
    return jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("x")),
                                 out_specs=P() if out_specs is None else out_specs,
                                 check_vma=check_vma))


def _small():
    return jnp.ones((8, 4)) * 0.1, jnp.arange(16 * 8.0).reshape(16, 8) / 100


def _ratio(step, w, xb):
    return float(jnp.mean(step(w, xb) / jax.grad(_loss)(w, xb)))


def test_jax_839_psum_of_a_grad_under_check_vma_multiplies_it_by_the_axis_size():
    w, xb = _small()
    summed = _step(lambda w, xb: jax.lax.psum(jax.grad(_loss)(w, xb), "x"))
    assert _ratio(summed, w, xb) == pytest.approx(4.0)  # the pmap habit: 4x the gradient
    advice = preflight.preflight_step(summed, w, xb).advice
    assert "The psum at test_shard_map.py:" in advice
    assert ("sums a value that is already the same on every device of axis 'x' (under "
            "check_vma, jax.grad of a P() input is summed already): it multiplies it by the "
            "axis size (4x here). Drop the psum") in advice
    assert "jax-ml/jax#839" in advice
    # the fix, run: no psum, the true gradient, and no note
    dropped = _step(lambda w, xb: jax.grad(_loss)(w, xb))
    assert _ratio(dropped, w, xb) == pytest.approx(1.0)
    assert "sums a value that is already" not in preflight.preflight_step(dropped, w, xb).advice
    # without check_vma the same psum is the right one: 1.0x, and no note
    unchecked = _step(lambda w, xb: jax.lax.psum(jax.grad(_loss)(w, xb), "x"), check_vma=False)
    assert _ratio(unchecked, w, xb) == pytest.approx(1.0)
    assert jaxpr_sharding.psums_of_invariant(jax.make_jaxpr(unchecked)(w, xb)) == ()


def test_jax_839_psum_scatter_of_a_grad_under_check_vma_is_4x_too_and_the_fix_runs():
    w, xb = _small()
    scattered = _step(lambda w, xb: jax.lax.psum_scatter(
        jax.grad(_loss)(w, xb), "x", scatter_dimension=0, tiled=True), out_specs=P("x"))
    assert _ratio(scattered, w, xb) == pytest.approx(4.0)
    advice = preflight.preflight_step(scattered, w, xb).advice
    assert "The psum_scatter at test_shard_map.py:" in advice
    assert "already the same on every device of axis 'x'" in advice and "(4x here)" in advice
    assert "jax.lax.pcast(w, 'x', to='varying')" in advice and "then psum_scatter it" in advice
    # the fix, run: the gradient of w made varying is each device's own; its psum_scatter is
    # the true gradient, split
    fixed = _step(lambda w, xb: jax.lax.psum_scatter(
        jax.grad(_loss)(_varying(w), xb), "x", scatter_dimension=0, tiled=True),
        out_specs=P("x"))
    assert _ratio(fixed, w, xb) == pytest.approx(1.0)
    assert jaxpr_sharding.psums_of_invariant(jax.make_jaxpr(fixed)(w, xb)) == ()


def test_jax_839_psum_of_a_number_or_a_varying_value_is_not_flagged():
    w, xb = _small()
    step = _step(lambda w, xb: (w * jax.lax.psum(1, "x"), jax.lax.psum(xb.sum(), "x")))
    assert jaxpr_sharding.psums_of_invariant(jax.make_jaxpr(step)(w, xb)) == ()
    # a P() input summed by hand is one: 4x, named without the grad's words
    (found,) = jaxpr_sharding.psums_of_invariant(jax.make_jaxpr(
        _step(lambda w, xb: jax.lax.psum(w, "x")))(w, xb))
    assert found[0] == "psum" and found[2:] == (("x",), 4, False)


def test_jax_839_psum_of_a_gradient_returned_whole_names_psum_scatter():
    D, H, B = 1024, 1024, 32  # f32[1024, 1024]: 4 MiB of gradient
    mesh = _mesh()
    w = jax.device_put(jnp.ones((D, H)) * 0.01, NamedSharding(mesh, P()))
    xb = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P("x", None)))

    def grad(w, xb):
        return jax.grad(lambda w: jnp.mean(jnp.tanh(xb @ w) ** 2))(w)

    summed = _step(lambda w, xb: jax.lax.psum(grad(w, xb), "x"), check_vma=False)
    p = preflight.preflight_step(summed, w, xb)
    assert p.output_bytes == 4 * MiB
    assert ("leaves the whole sum, 4.00 MiB, on each of the 4 devices of axis 'x' "
            "(out_specs=P())") in p.advice
    assert ("jax.lax.psum_scatter(..., scatter_dimension=0, tiled=True) with out_specs=P('x') "
            "keeps 1/4 on each: 4.00 MiB -> 1.00 MiB") in p.advice
    assert "jax-ml/jax#839" in p.advice and "jax-ml/jax#6992" in p.advice
    # the fix, run: a quarter of the output on each device, the same sum
    scattered = _step(lambda w, xb: jax.lax.psum_scatter(
        grad(w, xb), "x", scatter_dimension=0, tiled=True), out_specs=P("x"), check_vma=False)
    q = preflight.preflight_step(scattered, w, xb)
    assert q.output_bytes == 1 * MiB and "leaves the whole sum" not in q.advice
    assert jnp.allclose(scattered(w, xb), summed(w, xb))
    # under check_vma, the sum jax.grad makes itself of a P() input is not the user's psum
    own = _step(grad)
    assert "leaves the whole sum" not in preflight.preflight_step(own, w, xb).advice


def test_a_pure_callback_kept_in_a_shard_map_s_backward_pass_is_not_called_removed():
    """jax-ml/jax#21855's miniature (a new user's trial): shard_map over a custom_vjp whose
    forward and backward both call a pure_callback. Under jax.grad XLA removes the forward's
    (nothing reads it) and keeps the backward's, which ran 4 times a step; the kit said "never
    runs ... otherwise delete it". Inside shard_map XLA's metadata has no op_type, and the kept
    callback's line is the loss's, not its own: no line is named removed there."""
    import numpy as np

    calls = []

    def opaque(x):
        return jax.pure_callback(lambda a: calls.append(1) or np.asarray(a) * 1.0,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    @jax.custom_vjp
    def kernel(x):
        return opaque(x)

    kernel.defvjp(lambda x: (kernel(x), None), lambda _, g: (kernel(g),))
    f = jax.shard_map(kernel, mesh=_mesh(), in_specs=P("x"), out_specs=P("x"),
                      check_vma=False)
    step = jax.grad(lambda x: f(x).sum())
    x = jax.device_put(jnp.ones((8, 16)), NamedSharding(_mesh(), P("x")))
    jax.block_until_ready(jax.jit(step)(x))
    assert calls  # the backward's callback runs
    p = preflight.preflight_step(step, x)
    assert "never runs" not in p.advice, p.advice


def test_microbenchmarks_25_a_gather_returned_as_replicated_is_named_and_both_fixes_run():
    """AI-Hypercomputer/accelerator-microbenchmarks#25 (a new user's trial): all_gather inside
    shard_map with out_specs P(None, None) fails shard_map's replication check. The hook said
    nothing and preflight_step's error stopped at JAX's first line, which ends in a colon,
    dropping JAX's own explanation. Now both name it, and the fixes run: the axis kept in
    out_specs with no gather, and the gather JAX knows is the same on every device."""
    from helpers import devices
    from helpers.errors import BadInputError

    mesh, x = _mesh(), jnp.arange(64 * 8.0).reshape(64, 8)

    def gather(x, out_specs=None, body=None):
        out_specs = P(None, None) if out_specs is None else out_specs
        body = body or (lambda b: jax.lax.all_gather(b, "x", tiled=True))
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out_specs)(x)

    with pytest.raises(ValueError) as info:
        jax.jit(gather)(x)
    fix = devices.sharding_error_fix(info.value)
    assert fix.startswith("shard_map's out_specs leave out mesh axis 'x'"), fix
    with pytest.raises(BadInputError) as said:
        preflight.preflight_step(gather, x)
    assert "check_vma=False" in str(said.value) and "leave out mesh axis 'x'" in str(said.value)
    kept = jax.jit(lambda x: gather(x, P("x"), lambda b: b))(x)
    if hasattr(jax.lax, "all_gather_invariant"):
        assert "all_gather_invariant(x, 'x', tiled=True)" in fix

        def body(b):
            return jax.lax.all_gather_invariant(b, "x", tiled=True)
    else:
        assert "all_gather(x, 'x', tiled=True, to='invarying')" in fix

        def body(b):
            return jax.lax.all_gather(b, "x", tiled=True, to="invarying")
    invariant = jax.jit(lambda x: gather(x, body=body))(x)
    assert jnp.array_equal(kept, x) and jnp.array_equal(invariant, x)


def _solve(y0, limit):
    n, _ = jax.lax.while_loop(lambda s: s[1] < limit, lambda s: (s[0] + 1, s[1] + 0.01),
                              (0, y0))
    return n


def test_jax_26586_a_vmapped_while_loop_over_a_split_batch_is_named_with_shard_map():
    """jax-ml/jax#26586 (a new user's trial): a while_loop vmapped over a batch split across
    devices all-reduces its stop test at every iteration, and each device runs until the
    slowest element anywhere stops; the kit said FITS and nothing more. Now it is named, and
    the fix, shard_map(vmap(f)), runs: the same results, no all-reduce, no note."""
    import numpy as np

    mesh = _mesh()
    split = NamedSharding(mesh, P("x"))
    y0 = jax.device_put(jnp.zeros(16), split)
    limit = np.full(16, 0.05, np.float32)
    limit[0] = 2.0
    limit = jax.device_put(jnp.asarray(limit), split)
    p = preflight.preflight_step(jax.vmap(_solve), y0, limit)
    assert "The lax.while_loop (test_shard_map.py:" in p.advice, p.advice
    assert "jax.shard_map over the batch's axis" in p.advice and "26586" in p.advice
    fixed = jax.shard_map(jax.vmap(_solve), mesh=mesh, in_specs=(P("x"), P("x")),
                          out_specs=P("x"))
    assert jnp.array_equal(jax.jit(fixed)(y0, limit), jax.jit(jax.vmap(_solve))(y0, limit))
    assert "all-reduce(" not in jax.jit(fixed).lower(y0, limit).compile().as_text()
    assert "26586" not in preflight.preflight_step(fixed, y0, limit).advice
    one = preflight.preflight_step(jax.vmap(_solve), jnp.zeros(16), jnp.full(16, 0.05))
    assert "26586" not in one.advice  # one device: no exchange, no note


def test_a_forgotten_psum_under_replicated_out_specs_is_named_first_and_its_fix_runs():
    """A review: the commonest cause of shard_map's replication error is a sum of each
    device's piece with no psum. The kit blamed an all_gather and offered check_vma=False,
    which then returned one device's partial sum; on a 2-D mesh JAX names the axes as
    "{data,model}" and the kit made up an axis 'i'. Now psum comes first, with the axes."""
    from helpers import devices

    mesh, x = _mesh(), jnp.arange(64.0).reshape(8, 8)

    def total(body):
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P())

    with pytest.raises(ValueError) as info:
        jax.jit(total(lambda b: (b ** 2).sum()))(x)
    fix = devices.sharding_error_fix(info.value)
    assert "jax.lax.psum(x, 'x')" in fix and "check_vma=False then gives a wrong result" in fix
    fixed = jax.jit(total(lambda b: jax.lax.psum((b ** 2).sum(), "x")))(x)
    assert float(fixed) == float((x ** 2).sum())
    two = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    with pytest.raises(ValueError) as info:
        jax.jit(jax.shard_map(lambda b: (b ** 2).sum(), mesh=two,
                              in_specs=P("data", "model"), out_specs=P()))(x)
    fix = devices.sharding_error_fix(info.value)
    assert "mesh axes 'data', 'model'" in fix and "psum(x, ('data', 'model'))" in fix, fix
    assert "'i'" not in fix


def test_jax_26586_a_convergence_loop_over_a_split_array_is_no_batched_loop():
    """A review: a plain while_loop whose stop test sums a split array (an f32 all-reduce)
    beside a vmapped loop over a batch that is not split drew the note on the vmapped one."""
    split = NamedSharding(_mesh(), P("x"))

    def step(x, y0, limit):
        def body(c):
            return (c[0] * 0.5, c[1] + 1)
        done, _ = jax.lax.while_loop(lambda c: jnp.sum(c[0]) > 1e-3, body, (x, 0))
        return done, jax.vmap(_solve)(y0, limit)

    x = jax.device_put(jnp.ones(16), split)
    p = preflight.preflight_step(step, x, jnp.zeros(16), jnp.full(16, 0.05))
    assert "26586" not in p.advice, p.advice
