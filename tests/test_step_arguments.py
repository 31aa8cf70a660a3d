"""step_arguments: what a step's arguments cost and the notes preflight_step gives for them,
each checked against what JAX really does with the advice. Calls that may abort the process
run in child processes."""

import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import preflight
from helpers._internal.jaxcompat import jax_version_tuple
from tests.conftest import run_python

# marin-community/marin#8515: an optimizer state offloaded to pinned_host, brought into device
# memory inside the step; a step that jax 0.8.0 can run on the CPU too (no out_shardings to
# the host: XLA:CPU 0.8.0 has no annotate_device_placement for the host)
# the sharding the step moves the state in with: with a SingleDeviceSharding JAX does not know
# the outputs' memory kinds; with a NamedSharding (the thread's) it does
SINGLE = "jax.sharding.SingleDeviceSharding(jax.devices()[0])"
NAMED = "jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices()[:1], ('d',)), P())"
STEP = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    dev = DEV
    host = dev.with_memory_kind("pinned_host")

    def step(params, opt):
        o = jax.device_put(opt, dev)
        mu = 0.9 * o["mu"] + params * 0.01
        return params - mu, {"mu": mu, "count": o["count"] + 1}

    params = jnp.ones((512, 512))                       # as a notebook makes it: uncommitted
    opt = {"mu": jax.device_put(jnp.zeros((512, 512)), host),
           "count": jax.device_put(jnp.zeros((), jnp.int32), host)}
""")


def _state(dev: str = SINGLE):
    scope = {}
    exec(STEP.replace("DEV", dev), scope)
    return scope["step"], scope["params"], scope["opt"], scope["dev"], scope["host"]


def _run(donate: tuple, commit: bool, out_shardings: bool = False):
    """The step run in a child (an abort kills only the child): donated as asked, its
    arguments committed first or not, its outputs given their memory kinds or not."""
    return run_python(STEP.replace("DEV", SINGLE) + textwrap.dedent(f"""
        if {commit}:
            params = jax.device_put(params, jax.devices()[0])
        outs = (dev, {{"mu": host, "count": host}}) if {out_shardings} else None
        jstep = jax.jit(step, donate_argnums={donate}, out_shardings=outs)
        for _ in range(2):
            params, opt = jstep(params, opt)
            jax.block_until_ready((params, opt))
        print("ran 2 steps")
    """), timeout=120)


def _ran(p) -> bool:
    return p.returncode == 0 and "ran 2 steps" in p.stdout


def _aborted(p) -> bool:
    return p.returncode == -6 and (
        "PjRtBuffer's memory kind does not match sharding's memory kind" in p.stderr)


def test_marin_8515_no_donation_advised_for_a_state_in_pinned_host():
    """Before: "Donating opt and params ... lets XLA write the outputs into them". Donating the
    pinned_host state frees no device memory, and where an argument is not committed JAX pairs
    it with a device output: jax 0.10.2 aborts the process (measured below, in a child)."""
    step, params, opt, _, _ = _state()
    p = preflight.preflight_step(jax.jit(step), params, opt)
    assert "Donating params" in p.advice and "Donating opt" not in p.advice
    assert _ran(_run((0,), commit=False))  # the advice as it is now: runs as written
    old = _run((0, 1), commit=False)  # the advice as it was
    if jax_version_tuple() >= (0, 10):
        assert _aborted(old), old.stdout + old.stderr[-2000:]
    else:  # jax 0.8.0 pairs them across memory kinds and runs it
        assert _ran(old), old.stderr[-2000:]


@pytest.mark.skipif(jax_version_tuple() < (0, 10), reason="jax 0.8.0 runs it (the note is "
                    "given from 0.10: what was measured), and XLA:CPU 0.8.0 cannot run the "
                    "fix's out_shardings to pinned_host (annotate_device_placement)")
def test_marin_8515_a_donation_that_pairs_pinned_host_with_device_memory_is_named():
    step, params, opt, dev, host = _state()
    p = preflight.preflight_step(jax.jit(step, donate_argnums=(1,)), params, opt)
    assert ("Called as written, this step gives donated opt['mu'] (pinned_host) (and 1 more) "
            "to output[0], which is in device memory") in p.advice
    assert "aborts the whole process" in p.advice and "marin-community/marin#8515" in p.advice
    assert "Commit every argument (jax.device_put(x, sharding))" in p.advice
    assert "out_shardings, the state's with memory_kind='pinned_host'" in p.advice
    assert _aborted(_run((1,), commit=False))  # as written: the process dies
    assert _aborted(_run((1,), commit=True))  # committed, outputs' memory kinds unknown: dies
    assert _aborted(_run((1,), commit=False, out_shardings=True))  # out_shardings alone: dies
    assert _ran(_run((1,), commit=True, out_shardings=True))  # the fix: both
    committed = jax.device_put(params, jax.devices()[0])
    fixed = jax.jit(step, donate_argnums=(1,), out_shardings=(dev, {"mu": host, "count": host}))
    assert "Called as written" not in preflight.preflight_step(fixed, committed, opt).advice


@pytest.mark.skipif(jax_version_tuple() < (0, 10), reason="XLA:CPU in jax 0.8.0 cannot run a "
                    "step whose out_shardings name pinned_host (annotate_device_placement)")
def test_marin_8515_a_donated_pinned_host_state_not_reused_is_explained_by_its_memory_kind():
    """Before: "every int32[] output is already written into another donated argument", with
    no other int32 argument donated: the int32[] output is in device memory, the argument in
    pinned_host, and JAX pairs a donated buffer only with an output of its own memory kind
    where it knows them all (every argument committed, out_shardings given)."""
    step, params, opt, dev, host = _state()
    params = jax.device_put(params, jax.devices()[0])
    to_device = jax.jit(step, donate_argnums=(0, 1),
                        out_shardings=(dev, {"mu": dev, "count": dev}))
    p = preflight.preflight_step(to_device, params, opt)
    assert "already written into another donated argument" not in str(p)
    count = next(d for d in p.donations if d.argument == "1['count']")
    assert not count.reused
    assert count.why.startswith("the int32[] output left is in device memory and this "
                                "argument in pinned_host memory")
    assert "out_shardings with memory_kind='pinned_host'" in count.why
    assert "Called as written" not in p.advice  # nothing paired across memory kinds: it runs
    # the fix it names: the state returned where it came from; then both leaves are reused
    back = jax.jit(step, donate_argnums=(0, 1),
                   out_shardings=(dev, {"mu": host, "count": host}))
    fixed = preflight.preflight_step(back, params, opt)
    assert [d.reused for d in fixed.donations] == [True, True, True], str(fixed)
    assert _ran(_run((0, 1), commit=True, out_shardings=True))


@pytest.mark.skipif(jax_version_tuple() < (0, 10), reason="XLA:CPU in jax 0.8.0 cannot run a "
                    "step whose out_shardings name pinned_host (annotate_device_placement)")
def test_marin_8515_the_threads_offloaded_step_is_planned_as_jit_runs_it():
    """The thread's step returns its state to pinned_host (out_shardings). The kit compiled its
    arguments as shapes, which have no memory space: it planned the state in device memory and
    reported count "NOT reused" and a peak of 3 MiB where XLA's own is 2 MiB."""
    step, params, opt, dev, host = _state(NAMED)
    params = jax.device_put(params, jax.devices()[0])
    jstep = jax.jit(step, donate_argnums=(1,), out_shardings=(dev, {"mu": host, "count": host}))
    p = preflight.preflight_step(jstep, params, opt)
    assert [(d.argument, d.reused) for d in p.donations] == [
        ("1['count']", True), ("1['mu']", True)], str(p)
    assert p.donations[1].nbytes == 2**20
    real = jstep.lower(params, opt).compile().memory_analysis().peak_memory_in_bytes
    assert abs(p.peak_bytes - real) < 1024, (p.peak_bytes, real)


# jax-ml/jax#13956: h(x, x, x, x), one buffer passed as four arguments
def _h(x, y, z, w):
    for _ in range(3):
        x = x + y + z + w
    return x


def test_jax_13956_one_buffer_passed_four_times_is_counted_once_in_what_the_step_adds():
    x = jnp.ones((512, 512))  # 1 MiB
    p = preflight.preflight_step(_h, x, x, x, x)
    assert p.argument_bytes == 4 * x.nbytes  # XLA's own argument size counts each place
    assert p.xla_peak_bytes == 5 * x.nbytes  # and its peak too: kept as XLA's
    assert p.passed_again_bytes == 3 * x.nbytes
    assert p.peak_bytes == 2 * x.nbytes and p.needed_bytes == x.nbytes  # was 5 and 4 MiB
    assert "buffers passed again (XLA's arguments count each place):" in str(p)
    assert "the step adds:" in str(p) and "1.00 MiB" in str(p)
    a, b, c = (jnp.ones((512, 512)) for _ in range(3))  # four buffers, all already there
    apart = preflight.preflight_step(_h, x, a, b, c)
    assert apart.passed_again_bytes == 0 and apart.needed_bytes == x.nbytes  # the same output
    assert apart.peak_bytes == 5 * x.nbytes
    # what runs: the call holds x once and makes one output (live buffers, not time)
    before = jax.live_arrays()  # the arrays themselves: a freed one's id may be reused
    out = jax.jit(_h)(x, x, x, x).block_until_ready()
    made = [y for y in jax.live_arrays() if not any(y is b for b in before)]
    assert [y.nbytes for y in made] == [x.nbytes] and float(out[0, 0]) == 10.0


def test_jax_13956_no_donation_advised_for_an_argument_whose_buffer_is_passed_again():
    x = jnp.ones((512, 512))
    p = preflight.preflight_step(_h, x, x, x, x)
    assert "Nothing donated" not in p.advice
    with pytest.raises(Exception, match="previously donated in the same call"):
        mine = jnp.ones((512, 512))
        jax.jit(_h, donate_argnums=0)(mine, mine, mine, mine)  # the old advice, followed
    assert preflight.preflight_step(_h, x, x, x, x, donate_argnums=0).verdict == "will fail"
    # twice in one tree (a module and its clone): its tree is not advised either
    w = jnp.ones((512, 512))
    tree = preflight.preflight_step(lambda s: {"a": s["a"] * 2, "b": s["b"] * 3},
                                    {"a": w, "b": w})
    assert "Nothing donated" not in tree.advice
    # four buffers: x is advised, and donating it runs
    a, b, c = (jnp.ones((512, 512)) for _ in range(3))
    apart = preflight.preflight_step(_h, x, a, b, c)
    assert "Nothing donated for x," in apart.advice
    mine = jnp.ones((512, 512))
    assert float(jax.jit(_h, donate_argnums=0)(mine, a, b, c)[0, 0]) == 10.0
    assert mine.is_deleted()


def test_flax_5461_every_buffer_a_clone_shares_is_named_with_its_bytes():
    """nnx.clone(module) shares the module's arrays; the state of both, donated, fails on
    each (plain JAX: a dict holds the same arrays twice, as the clone's state does)."""
    kernel, bias = jnp.ones((512, 512)), jnp.ones((512,))
    state = {"linear": {"bias": bias, "kernel": kernel},
             "linear_copy": {"bias": bias, "kernel": kernel}}

    def update(s):
        return jax.tree.map(lambda v: v * 0.9, s)

    with pytest.raises(Exception, match="donate the same buffer twice"):
        jax.jit(update, donate_argnums=0)(
            {"linear": {"bias": bias, "kernel": kernel},
             "linear_copy": {"bias": bias, "kernel": kernel}})
    p = preflight.preflight_step(update, state, donate_argnums=0)
    assert p.verdict == "will fail"
    assert ("argument 0['linear']['bias'] is donated and the same buffer is passed again as "
            "argument 0['linear_copy']['bias'] (2.00 KiB); so is argument 0['linear']['kernel'] "
            "as argument 0['linear_copy']['kernel'] (1.00 MiB), 2 shared buffers and 1.00 MiB "
            "in all: the call fails") in p.advice
    many = {"a": {str(i): jnp.ones((4 + i,)) for i in range(6)}}
    many["b"] = dict(many["a"])
    more = preflight.preflight_step(update, many, donate_argnums=0)
    assert "and 2 more, 6 shared buffers and 156 B in all" in more.advice
    # the thread's fix: the clone holds copies (nnx.clone(m, arrays=True) copies with jnp.copy)
    fixed = {"linear": {"bias": bias, "kernel": kernel},
             "linear_copy": {"bias": jnp.copy(bias), "kernel": jnp.copy(kernel)}}
    assert preflight.preflight_step(update, fixed, donate_argnums=0).verdict == "fits"
    jax.block_until_ready(jax.jit(update, donate_argnums=0)(fixed))


def test_jax_9132_a_cache_written_a_row_per_call_without_donation_is_copied_whole_each_call():
    def decode_step(cache, kv, pos):
        return cache.at[:, pos].set(kv)  # one token's K and V

    cache, kv, pos = jnp.zeros((2, 1024, 8, 64)), jnp.ones((2, 8, 64)), jnp.int32(5)  # 4 MiB
    p = preflight.preflight_step(decode_step, cache, kv, pos)
    assert p.copied_to_update == (("cache", cache.nbytes),)
    assert ("Donating cache (donate_argnums" in p.advice and "It costs time too: to write a "
            "slice into cache (.at[...].set, dynamic_update_slice, a scatter) the step copies "
            "all 4.00 MiB of it first, on every call, where donated it writes in place"
            in p.advice and "jax-ml/jax#9132" in p.advice)
    # a scatter into one leaf of a state: named by its path
    def scatter_step(state, rows, v):
        return {"c": state["c"].at[rows].add(v), "n": state["n"] + 1}

    state = {"c": jnp.zeros((2048, 512)), "n": jnp.zeros(())}
    s = preflight.preflight_step(scatter_step, state, jnp.array([1, 5]), jnp.ones((2, 512)))
    assert s.copied_to_update == (("state['c']", 4 * 2**20),)
    assert "to write a slice into state['c']" in s.advice
    # an output made anew is no copy to update: the donation note says nothing of time
    plain = preflight.preflight_step(lambda c: c * 2, cache)
    assert plain.copied_to_update == () and "Nothing donated for c," in plain.advice
    assert "costs time" not in plain.advice
    # the fix, run: donated, no copy is planned and the output is written in the input's buffer
    donated = preflight.preflight_step(decode_step, cache, kv, pos, donate_argnums=0)
    assert donated.copied_to_update == () and donated.donations[0].reused
    mine = jnp.zeros((2, 1024, 8, 64))
    where = mine.unsafe_buffer_pointer()
    out = jax.jit(decode_step, donate_argnums=0)(mine, kv, pos).block_until_ready()
    assert out.unsafe_buffer_pointer() == where and float(out[1, 5, 0, 0]) == 1.0


def test_jax_18617_two_device_puts_of_one_numpy_array_are_not_said_to_fail():
    """On the CPU, jax.device_put of a 64-byte-aligned NumPy array adopts its memory, so two
    puts of it are two Arrays over one pointer. The kit said the donated call fails ("the
    same buffer is passed again"), but XLA sees two buffers: the call runs, and donates
    nothing into NumPy's memory (jax-ml/jax#18617). Two Arrays over one JAX buffer
    (jax.device_put of an array to the device it is on) do fail, and nothing public tells
    the two apart: the kit says both, and a copy fixes either."""
    def f(p, q):
        return p + 1, q * 2

    room = np.zeros(2**18 + 16, np.float32)
    start = (-room.ctypes.data % 64) // 4
    host = room[start:start + 2**18].reshape(512, 512)  # 1 MiB, 64-byte aligned
    a, b = jax.device_put(host), jax.device_put(host)
    assert a is not b and a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer()
    assert a.unsafe_buffer_pointer() == host.ctypes.data  # both adopted NumPy's memory
    p = preflight.preflight_step(f, a, b, donate_argnums=0)
    # not "fits": the same words fit a pair that fails (below); not "will fail": this one runs
    assert p.verdict == "unknown" and "the same buffer is passed again" not in p.advice
    assert ("argument 0 is donated, and argument 1 is another array over the same memory "
            "(1.00 MiB)") in p.advice, p.advice
    assert "it runs and donates nothing" in p.advice and "jax-ml/jax#18617" in p.advice
    assert "pass a copy (jnp.copy(x))" in p.advice
    out = jax.jit(f, donate_argnums=0)(a, b)  # what runs: no failure
    assert float(out[1][0, 0]) == 0.0 and out[0].unsafe_buffer_pointer() != host.ctypes.data
    # two Arrays over one JAX buffer: the same words, and the call fails
    x = jnp.zeros((512, 512))
    y = jax.device_put(x, x.devices().pop())
    assert y is not x and y.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    same = preflight.preflight_step(f, x, y, donate_argnums=0)
    assert "another array over the same memory" in same.advice and same.verdict == "unknown"
    with pytest.raises(Exception, match="previously donated in the same call"):
        jax.jit(f, donate_argnums=0)(x, y)
    # the fix, run: a copy where it is not the donated one
    x = jnp.zeros((512, 512))
    fixed = preflight.preflight_step(f, x, jnp.copy(x), donate_argnums=0)
    assert "same memory" not in fixed.advice and fixed.verdict == "fits"
    jax.block_until_ready(jax.jit(f, donate_argnums=0)(x, jnp.copy(x)))
    assert x.is_deleted()
    # one Array passed twice is still a sure failure
    z = jnp.zeros((512, 512))
    assert preflight.preflight_step(f, z, z, donate_argnums=0).verdict == "will fail"


def _optax_320_step(p, s, x):
    """A MultiSteps-like step (optax#320): gradients summed into an accumulator s["acc"]; x, a
    batch of 512 rows, happens to have a weight's shape and dtype."""
    g = jax.grad(lambda p: jnp.mean(jnp.tanh(jnp.tanh(x @ p["w0"]) @ p["w1"]) ** 2))(p)
    acc = jax.tree.map(jnp.add, s["acc"], g)
    return jax.tree.map(lambda w, a: w - 1e-3 * a, p, acc), {"acc": acc}


def test_optax_320_no_donation_advised_for_a_batch_when_every_output_is_already_aliased():
    p = {f"w{i}": jnp.full((512, 512), 0.01) for i in range(2)}  # 1 MiB each
    s = {"acc": jax.tree.map(jnp.zeros_like, p)}
    x = jnp.ones((512, 512))
    r = preflight.preflight_step(jax.jit(_optax_320_step, donate_argnums=(0, 1)), p, s, x)
    assert "Nothing donated" not in r.advice  # was "Nothing donated for x, yet 1.00 MiB ..."
    # the old advice, followed: JAX cannot use x's buffer, and XLA's peak does not move
    peaks = {}
    for don in ((0, 1), (0, 1, 2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = jax.jit(_optax_320_step, donate_argnums=don).lower(p, s, x).compile()
        peaks[don] = c.memory_analysis().peak_memory_in_bytes
        assert any("donated buffers were not usable" in str(w.message) for w in caught) == (
            len(don) == 3)
    assert peaks[(0, 1)] == peaks[(0, 1, 2)]
    # still named where an output has no donated argument to go to, p and s not donated, with
    # what XLA's plan of the step so donated says (XLA:CPU's does not drop: 9.00 -> 9.00 MiB,
    # measured 10.96 -> 11.01 MiB; it keeps temporaries instead)
    plain = preflight.preflight_step(jax.jit(_optax_320_step), p, s, x)
    followed = preflight.preflight_step(jax.jit(_optax_320_step, donate_argnums=(0, 1)), p, s, x)
    assert "Nothing donated for s, p," in plain.advice or "Nothing donated for p, s," in (
        plain.advice)
    assert ("for the CPU, its peak does not drop" in plain.advice) == (
        plain.peak_bytes - followed.peak_bytes < 2**20)


def test_optax_320_multisteps_accumulates_over_calls_and_splits_no_batch():
    """google-deepmind/optax#320: gradient accumulation with optax.MultiSteps, fed k times the
    batch at each call, ran out of memory as that batch would: MultiSteps adds up the gradients
    of k calls and splits nothing. Where the state holds MultiSteps' acc_grads (a stand-in with
    its field names: optax is not a dependency; checked by hand with optax 0.2.8, whose
    MultiStepsState names it acc_grads), the note says so."""
    p = {f"w{i}": jnp.full((512, 512), 0.01) for i in range(2)}  # 2 MiB

    def step(p, s, x):
        g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w0"] @ p["w1"])))(p)
        acc = jax.tree.map(jnp.add, s["acc_grads"], g)
        return p, {"acc_grads": acc, "mini_step": s["mini_step"] + 1}

    state = {"acc_grads": jax.tree.map(jnp.zeros_like, p), "mini_step": jnp.zeros((), jnp.int32)}
    r = preflight.preflight_step(step, p, state, jnp.ones((64, 512)))
    assert "optax.MultiSteps adds up the gradients of k calls" in r.advice
    assert "give each call one microbatch" in r.advice and "optax#320" in r.advice
    other = {"acc": state["acc_grads"], "mini_step": state["mini_step"]}
    plain = preflight.preflight_step(lambda p, s, x: step(p, {"acc_grads": s["acc"],
                                                              "mini_step": s["mini_step"]}, x),
                                     p, other, jnp.ones((64, 512)))
    assert "holds 1 copy of p" in plain.advice and "MultiSteps adds up" not in plain.advice


def test_easylm_36_a_gradient_accumulator_is_named_as_one_more_copy_of_the_parameters():
    """young-geng/EasyLM#36: accumulate_gradient_steps=2 ran out of memory where 1 fit: the
    accumulator is a second buffer the size of the parameters (the maintainer)."""
    p = {f"w{i}": jnp.full((512, 512), 0.01) for i in range(4)}  # 4 MiB
    zeros = lambda: jax.tree.map(jnp.zeros_like, p)  # noqa: E731

    def step(p, s, x):
        g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w0"] @ p["w1"] @ p["w2"] @ p["w3"])))(p)
        acc = jax.tree.map(jnp.add, s["acc"], g)
        mu = jax.tree.map(lambda m, a: 0.9 * m + 0.1 * a, s["mu"], acc)
        return jax.tree.map(lambda w, m: w - 1e-3 * m, p, mu), {"acc": acc, "mu": mu}

    x = jnp.ones((64, 512))
    r = preflight.preflight_step(jax.jit(step), p, {"acc": zeros(), "mu": zeros()}, x)
    assert "s holds 2 copies of p's shapes (s['acc'], s['mu']: 8.00 MiB, 2.00x p)" in r.advice
    assert "gradient accumulator" in r.advice and "accumulator_dtype" in r.advice
    assert "Nothing donated for s, p" in r.advice or "Nothing donated for p, s" in r.advice
    # the fixes, run: donated, the peak falls 24.13 -> 14.63 MiB; an accumulator in bfloat16
    # holds 2 MiB less
    donated = preflight.preflight_step(jax.jit(step, donate_argnums=(0, 1)), p,
                                       {"acc": zeros(), "mu": zeros()}, x)
    assert r.peak_bytes - donated.peak_bytes >= 9 * 2**20
    narrow = {"acc": jax.tree.map(lambda a: a.astype(jnp.bfloat16), zeros()), "mu": zeros()}
    half = preflight.preflight_step(jax.jit(step, donate_argnums=(0, 1)), p, narrow, x)
    assert donated.argument_bytes - half.argument_bytes == 2 * 2**20


def test_an_accumulation_step_is_advised_to_donate_the_accumulator_not_the_parameters():
    """acc + grad(loss)(p, x): the outputs have both p's and acc's shapes, and the kit advised
    donating p, the first of the two, which the caller still needs after the call. The outputs
    are a new acc (reached from it through the add), so acc is the one advised."""
    import jax
    import jax.numpy as jnp

    from helpers import preflight

    p = {"w": jnp.ones((1024, 1024)), "b": jnp.ones(1024)}
    acc = jax.tree.map(jnp.zeros_like, p)
    x = jnp.ones((64, 1024))

    def loss(p, x):
        return jnp.mean((x @ p["w"] + p["b"]) ** 2)

    def accum(p, acc, x):
        return jax.tree.map(jnp.add, acc, jax.grad(loss)(p, x))

    from helpers import compiled, step_arguments

    def chosen(fn, *args):  # the argument the kit would advise, before it checks the peak
        c = compiled.compile_step(fn, *args)
        return step_arguments.donation_would_save(c, fn, args, {})[0]

    plain = preflight.preflight_step(jax.jit(accum), p, acc, x)
    assert chosen(jax.jit(accum), p, acc, x) == ["acc"] and "Donating p" not in plain.advice
    donated = preflight.preflight_step(jax.jit(accum, donate_argnums=1), p, acc, x)
    assert donated.alias_bytes >= 4 * 2**20  # the advice followed: XLA writes into acc
    # said with what XLA's plan of the donated step gives (XLA:CPU's keeps a temporary of
    # acc's size instead: 12.51 -> 12.51 MiB, measured 12.98 -> 12.95 MiB)
    drop = plain.peak_bytes - donated.peak_bytes
    assert "Donating acc" in plain.advice
    assert ("for the CPU, its peak does not drop" in plain.advice) == (drop < 2**20)
    update = jax.jit(lambda p, x: jax.tree.map(lambda a, g: a - 0.1 * g, p,
                                               jax.grad(loss)(p, x)))
    sgd = preflight.preflight_step(update, p, x)
    assert chosen(update, p, x) == ["p"]  # an update of p: p is the one
    drop = sgd.peak_bytes - preflight.preflight_step(update, p, x, donate_argnums=0).peak_bytes
    assert "Donating p" in sgd.advice
    assert ("for the CPU, its peak does not drop" in sgd.advice) == (drop < 2**20)


def test_a_donation_that_saves_most_of_a_small_state_is_called_a_saving():
    """A review's case: a 1 MiB state whose donated plan drops by 1016 KiB was told "here it
    saves no memory" (the rule was a fixed 1 MiB). Half of what the outputs could take is
    enough now; and a card given as the target is not spoken for by the CPU's plan."""
    from helpers import step_arguments

    assert step_arguments.donation_pays(1016 * 1024, 2**20)
    assert not step_arguments.donation_pays(0, 2**20)
    assert not step_arguments.donation_pays(100 * 1024, 8 * 2**20)
    assert step_arguments.donation_pays(2**20, 64 * 2**20)
    said = step_arguments.donation_note(["s"], 2**20, drop=1016 * 1024, on_cpu=True)
    assert "1016.00 KiB less at the peak" in said and "does not drop" not in said
    none = step_arguments.donation_note(["s"], 8 * 2**20, drop=0, on_cpu=True)
    assert "one call of this step for the CPU, its peak does not drop" in none
    assert "In a loop that feeds the outputs back" in none
    card = step_arguments.donation_note(["s"], 8 * 2**20, drop=0, on_cpu=True,
                                        target="H100 80GB")
    assert "the CPU's plan cannot speak for H100 80GB's" in card and "In a loop" not in card
    p = {"w": jnp.ones((1024, 1024)), "b": jnp.ones(1024)}
    acc, x = jax.tree.map(jnp.zeros_like, p), jnp.ones((64, 1024))

    def accum(p, acc, x):
        return jax.tree.map(jnp.add, acc, jax.grad(
            lambda p: jnp.mean((x @ p["w"] + p["b"]) ** 2))(p))

    plain = preflight.preflight_step(jax.jit(accum), p, acc, x)
    for_card = preflight.preflight_step(jax.jit(accum), p, acc, x, target="H100 80GB")
    if "does not drop" in plain.advice:  # XLA:CPU's plan (jax 0.8.0 and 0.10.2 here)
        assert "the CPU's plan cannot speak for H100 80GB's" in for_card.advice
        assert "In a loop" in plain.advice and "cannot speak" not in plain.advice


def test_flax_5172_moments_of_replicated_parameters_are_named_and_split_with_out_shardings():
    """google/flax#5172: the optimizer state takes its parameters' sharding, so the Adam moments
    of an embedding replicated on purpose are whole on every device too. The kit said "(these
    are one device's bytes: it is split over devices already)" of a state 97% replicated (a new
    user's trial). It names the replicated bytes now and the fix (flax#5231's opt_sharding),
    run here: the moments split, out_shardings keeping every output's, a lower peak per
    device."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    whole, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("d", None))
    params = {"embed": jax.device_put(jnp.ones((2048, 1024)), whole),
              "w": jax.device_put(jnp.ones((1024, 256)), rows)}

    def state(where):
        return {k: jax.tree.map(lambda p: jax.device_put(jnp.zeros(p.shape), where(p)), params)
                for k in ("mu", "nu")}

    def loss(p, x):
        return jnp.sum((x @ p["embed"]) @ p["w"])

    def step(p, s, x):
        g = jax.grad(loss)(p, x)
        mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, s["mu"], g)
        nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, s["nu"], g)
        p = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, mu, nu)
        return p, {"mu": mu, "nu": nu}

    batch = jax.device_put(jnp.ones((64, 2048)), rows)
    follow = state(lambda p: p.sharding)
    before = preflight.preflight_step(jax.jit(step), params, follow, batch)
    copies = before.state_copies
    assert {c.path for c in copies} == {"['mu']", "['nu']"}, copies
    assert all(c.replicated_bytes == 8 * 2**20 and c.nbytes == 8.25 * 2**20 for c in copies)
    assert "of which 16.00 MiB are whole on every device" in before.advice, before.advice
    assert "opt_sharding" in before.advice and "google/flax#5172" in before.advice
    assert "it is split over devices already" not in before.advice
    split = state(lambda p: rows)
    kept = jax.jit(step, out_shardings=(jax.tree.map(lambda p: p.sharding, params),
                                        jax.tree.map(lambda x: x.sharding, split)))
    after = preflight.preflight_step(kept, params, split, batch)
    assert after.peak_bytes < 0.9 * before.peak_bytes
    assert "whole on every device, as the parts" not in after.advice
    p2, s2 = kept(params, split, batch)
    assert p2["embed"].sharding.is_fully_replicated  # the parameters stay as they were
    assert s2["mu"]["embed"].sharding.spec == P("d", None)
    # without out_shardings XLA chooses: here it hands the replicated parameters back split
    loose, _ = jax.jit(step)(params, split, batch)
    assert not loose["embed"].sharding.is_fully_replicated


def test_a_float64_numpy_argument_is_counted_as_the_float32_array_jax_makes():
    """A new user's trial: `arguments: 5.50 MiB` above `mask: 8.00 MiB (84%)`: the row took
    NumPy's float64 bytes, the total XLA's float32 array (x64 off)."""
    mask = np.ones((1024, 1024))  # float64: 8 MiB in NumPy, 4 MiB as JAX's float32
    q = jnp.ones((256, 1024))  # 1 MiB
    p = preflight.preflight_step(lambda q, mask: q @ mask, q, mask)
    split = dict(p.argument_split)
    assert split == {"mask": 4 * 2**20, "q": 2**20}, split
    assert sum(split.values()) == p.argument_bytes


def test_jax_28311_a_jax_scalar_in_static_metadata_is_named_with_a_python_int():
    """jax-ml/jax#28311 (a new user's trial): a JAX scalar, jnp.array(3), kept in a pytree's
    meta_fields and used as a slice bound: inside another jit its == comparison fails (on jax
    0.10.2 an error, in 2025 a hang). preflight_step said FITS: only arrays of more than one
    element were looked for. The fix for a slice bound is a Python int, which runs; a data
    field (the general fix) cannot be one ("Slice entries must be static integers")."""
    import dataclasses

    @dataclasses.dataclass
    class Indexer:
        index: int

    jax.tree_util.register_dataclass(Indexer, data_fields=[], meta_fields=["index"])

    @jax.jit
    def slice_it(x, indexer):
        return x[:indexer.index]

    p = preflight.preflight_step(slice_it, jnp.arange(30), Indexer(jnp.array(3)))
    assert "keeps an array, int32[]" in p.advice, p.advice
    assert "keep it a Python int (int(x))" in p.advice and "jax-ml/jax#28311" in p.advice
    jax.clear_caches()  # the fix, both halves: the cache keeps the entry keyed on the array
    assert slice_it(jnp.arange(30), Indexer(3)).tolist() == [0, 1, 2]  # (0.8.0 raises without)
