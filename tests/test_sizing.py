"""sizing.largest_batch: the same answer as bisection over compiles, in a few compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import example_steps, preflight, sizing
from helpers.errors import BadInputError, CompileOutOfMemory, MeasurementFailed
from helpers.units import NOT_AVAILABLE

PARAMS, X1, Y1 = example_steps.mlp_sgd_step_args(scale=1, batch=1)
PARAMS = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), PARAMS)


def make(batch):
    return (PARAMS, jax.ShapeDtypeStruct((batch, X1.shape[1]), X1.dtype),
            jax.ShapeDtypeStruct((batch, Y1.shape[1]), Y1.dtype))


def need(batch):
    return preflight.preflight_step(example_steps.mlp_sgd_step, *make(batch)).needed_bytes


def test_needed_bytes_is_preflight_steps_need_from_one_compile(monkeypatch):
    compiles = []
    real = jax.stages.Lowered.compile

    def counting(self, *a, **kw):
        compiles.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", counting)
    for batch in (1, 64, 4096):
        jax.clear_caches()
        compiles.clear()
        plan = preflight.preflight_step(example_steps.mlp_sgd_step, *make(batch))
        assert len(compiles) == 2  # the step, and the step donated (its donation note checked)
        jax.clear_caches()
        compiles.clear()
        assert preflight.needed_bytes(example_steps.mlp_sgd_step, *make(batch)) == \
            plan.needed_bytes > 0
        assert len(compiles) == 1
    backend = []  # XLA's own compiles: reading the plan at the answer again is JAX's cached one
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_, **__: backend.append(event) if event.endswith("backend_compile_duration")
        and counting_backend else None)
    counting_backend = True
    jax.clear_caches()
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, 64 * 2**20)
    counting_backend = False  # (no unregistering on jax 0.8.0: the listener stays, muted)
    assert len(backend) == found.compiles  # one XLA compile for each batch priced


def bisection(budget, g=1):
    """The slow, sure way: double, then halve the gap, in multiples of g."""
    lo, hi = 0, g
    while need(hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > g:
        mid = (lo + hi) // 2 // g * g
        lo, hi = (mid, hi) if need(mid) <= budget else (lo, mid)
    return lo


@pytest.mark.parametrize("budget, g", [(int(460.8 * 2**20), 1), (2 * 2**30, 8),
                                       (64 * 2**20, 1), (23 * 2**20, 4), (23 * 2**20, 1),
                                       (30 * 2**20, 1), (40 * 2**20, 1)])
def test_the_same_answer_as_bisection(budget, g):
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, granularity=g,
                                 max_batch=1 << 20)
    assert found.batch == bisection(budget, g)
    assert found.batch % g == 0 and found.needed_bytes == need(found.batch) <= budget
    assert found.next_needed_bytes > budget


@pytest.mark.parametrize("budget", [int(460.8 * 2**20), 2 * 2**30])
def test_three_compiles_where_the_need_is_linear_in_the_batch(budget):
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, max_batch=1 << 20)
    assert found.compiles == 3 and not found.next_compiled
    assert "checked by a third" in str(found) and "no run" in str(found)
    sure = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, max_batch=1 << 20,
                                verify=True)
    assert sure.compiles == 4 and sure.next_compiled and sure.batch == found.batch
    assert sure.next_needed_bytes == need(found.batch + 1) > budget


def test_a_line_through_the_compiles_nearest_the_answer_where_xla_changes_its_plan():
    # the MLP's need grows by 21,504 B per example near batch 2,144 and by 22,528 far above it:
    # the line through the largest batch is off there, the line through the two nearest is not
    assert need(2200) - need(2199) != need(1 << 20) - need((1 << 20) - 1)
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, 64 * 2**20, max_batch=1 << 20)
    assert need(found.batch) <= 64 * 2**20 < need(found.batch + 1)
    assert found.compiles == 4 and "nearest the answer" in found.method
    assert found.bytes_per_example == need(2145) - need(2144)


def test_when_nothing_fits_or_everything_fits():
    none = sizing.largest_batch(example_steps.mlp_sgd_step, make, "10 MiB", max_batch=1 << 20)
    assert none.batch == 0 and none.next_needed_bytes > none.budget_bytes == 10 * 2**20
    assert "no batch fits" in str(none)
    asked = []
    every = sizing.largest_batch(example_steps.mlp_sgd_step,
                                 lambda b: (asked.append(b), make(b))[1], "64 GiB", max_batch=4096)
    assert every.batch == 4096 and every.compiles == 1 and asked == [4096]  # nothing above it
    assert every.next_needed_bytes is NOT_AVAILABLE and "max_batch" in str(every)


def test_bad_input_is_named():
    with pytest.raises(BadInputError, match="granularity"):
        sizing.largest_batch(example_steps.mlp_sgd_step, make, "1 GiB", granularity=0)
    with pytest.raises(ValueError):
        sizing.largest_batch(example_steps.mlp_sgd_step, make, "lots")
    with pytest.raises(BadInputError, match="tuple of the step's arguments"):
        sizing.largest_batch(example_steps.mlp_sgd_step, lambda b: None, "1 GiB")
    with pytest.raises(BadInputError, match="does not grow with the batch"):
        sizing.largest_batch(example_steps.mlp_sgd_step, lambda b: make(8), "19 MiB")


# --- the search itself, on needs of known shape (preflight replaced: no compile) --------------
def _search(monkeypatch, f, budget, **kw):
    monkeypatch.setattr(preflight, "needed_bytes",
                        lambda fn, b, **_: int(f(b)))
    return sizing.largest_batch(lambda b: b, lambda b: (b,), budget, **kw)


def _largest(f, budget, g, top):
    lo, hi = 0, top // g  # in multiples of g; the need grows with the batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if f(mid * g) <= budget else (lo, mid - 1)
    return lo * g


def test_a_bend_between_the_compiles_never_gives_a_wrong_answer(monkeypatch):
    import random

    def bent(b, k=3117):  # the need's slope doubles at batch k (XLA changing its plan)
        return 733068297 + 927144 * min(b, k) + 1854288 * max(0, b - k)

    found = _search(monkeypatch, bent, 3253596766)
    assert found.batch == _largest(bent, 3253596766, 1, 1 << 24) == 2718
    rng = random.Random(0)
    for _ in range(300):  # bends up or down, anywhere, any budget
        k, s = rng.randint(1, 5000), rng.randint(1, 10**6)
        s2 = s * rng.choice([0.3, 0.5, 0.9, 1.1, 2, 5])
        fixed, g = rng.randint(0, 10**9), rng.choice([1, 2, 8, 32])

        def f(b, k=k, s=s, s2=s2, fixed=fixed):
            return fixed + s * min(b, k) + s2 * max(0, b - k)

        budget = int(f(rng.randint(1, 20000))) + rng.randint(-3 * s, 3 * s)
        found = _search(monkeypatch, f, budget, granularity=g)
        assert found.batch == _largest(f, budget, g, 1 << 24), (k, s, s2, fixed, g, budget)


def test_a_padded_need_is_exact_at_its_padding_and_never_raises(monkeypatch):
    def padded(b):  # the batch padded to a multiple of 8 (as on a TPU): a staircase
        return 10**6 + 100 * (-(-b // 8) * 8)

    for budget in (1189575, 1080050):
        exact = _search(monkeypatch, padded, budget, granularity=8)
        assert exact.batch == _largest(padded, budget, 8, 1 << 24)
        rough = _search(monkeypatch, padded, budget)  # granularity 1: a line cannot follow it
        assert 0 < rough.batch <= _largest(padded, budget, 1, 1 << 24)  # never too large


# --- a step too large to compile, and a first compile near the answer ---------------------------
def test_the_first_compile_is_near_the_answer_where_the_arguments_alone_are_over(monkeypatch):
    compiled = []
    real = preflight.needed_bytes

    def recording(fn, *args, **kw):
        compiled.append(args[1].shape[0])
        return real(fn, *args, **kw)

    monkeypatch.setattr(preflight, "needed_bytes", recording)
    budget = int(460.8 * 2**20)
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget)  # max_batch 2**24
    monkeypatch.undo()
    assert found.batch == bisection(budget)
    # x and y alone are 2 KiB an example: over the budget from about 236,000 examples, so the
    # first compile is below twice that, not at 2**24 (a GPU cannot compile that one: the H100
    # ran out of memory in XLA's autotuner there)
    per_example = sizing._unplaced_bytes(make(2)) - sizing._unplaced_bytes(make(1))
    assert max(compiled) < 2 * budget / per_example < 2**24


class _TooLarge:
    """A step whose compile runs out of the device's memory above ``limit`` (what a GPU's
    autotuner does at a batch far beyond its memory; the CPU compiles anything)."""

    def __init__(self, f, limit):
        self.f, self.limit, self.asked = f, limit, []

    def __call__(self, fn, b, **_):
        self.asked.append(b)
        if b > self.limit:
            raise CompileOutOfMemory(f"RESOURCE_EXHAUSTED at batch {b}")
        return int(self.f(b))


def test_a_batch_too_large_to_compile_is_over_the_budget(monkeypatch):
    def f(b):
        return 10**6 + 1000 * b

    for limit, budget in [(5000, 3 * 10**6), (5000, 4_000_500), (5000, 6 * 10**6),
                          (5000, 10**9), (1 << 23, 10**9), (3, 1_003_500)]:
        step = _TooLarge(f, limit)
        monkeypatch.setattr(preflight, "needed_bytes", step)
        found = sizing.largest_batch(lambda b: b, lambda b: (b,), budget)
        best = min(_largest(f, budget, 1, 1 << 24), limit)
        assert found.batch == best, (limit, budget, found)
        assert found.needed_bytes == f(best) <= budget
        if best == limit:  # the batch above could not be compiled: no need is made up for it
            assert found.next_needed_bytes is NOT_AVAILABLE and "compile" in found.method
        else:
            assert found.next_needed_bytes > budget
        assert max(step.asked) == 1 << 24 and step.asked.count(1 << 24) == 1


class _Band(_TooLarge):
    """A step XLA cannot compile at batches in ``[lo, hi)`` only, below batches that compile (a
    GPU's autotuner can fail at one shape and not at a larger one)."""

    def __init__(self, f, lo, hi):
        super().__init__(f, 1 << 30)
        self.band = range(lo, hi)

    def __call__(self, fn, b, **kw):
        if b in self.band:
            self.asked.append(b)
            raise CompileOutOfMemory(f"RESOURCE_EXHAUSTED at batch {b}")
        return super().__call__(fn, b, **kw)


def test_a_batch_that_does_not_compile_below_one_that_did_is_over_the_budget(monkeypatch):
    def f(b):
        return 10**6 + 1000 * b

    budget = 4_000_500  # the need alone allows 3000
    for lo, hi, best in [(2500, 3600, 2499), (2999, 3001, 2998), (100, 200, 3000),
                         (1, 3600, 0)]:
        step = _Band(f, lo, hi)
        monkeypatch.setattr(preflight, "needed_bytes", step)
        if best == 0:
            with pytest.raises(CompileOutOfMemory, match="every batch it compiled was over"):
                sizing.largest_batch(lambda b: b, lambda b: (b,), budget)
            continue
        found = sizing.largest_batch(lambda b: b, lambda b: (b,), budget)
        assert found.batch == best, (lo, hi, found)
        assert found.needed_bytes == f(best) <= budget
        if best + 1 in step.band:  # the batch above could not be compiled: no need made up
            assert found.next_needed_bytes is NOT_AVAILABLE and "compile" in found.method
        assert len(step.asked) == len(set(step.asked))  # each batch tried once


def test_a_step_too_large_to_compile_at_any_batch_says_so(monkeypatch):
    monkeypatch.setattr(preflight, "needed_bytes", _TooLarge(lambda b: b, 0))
    with pytest.raises(CompileOutOfMemory, match="even at batch 1: the step does not fit"):
        sizing.largest_batch(lambda b: b, lambda b: (b,), 10**6)


def test_preflight_names_a_compile_that_ran_out_of_device_memory(monkeypatch):
    # the H100's words (2026-11-26 record, notebook 09), raised where XLA compiles
    said = ("RESOURCE_EXHAUSTED: Failed to get configs for: 5 out of 10 instructions. See logs "
            "for all failures. Example failure: Out of memory while trying to allocate "
            "128.02GiB with allocator GPU_0_bfc on device 0.")

    def compile_(self, *a, **kw):
        raise RuntimeError(said)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_)
    with pytest.raises(CompileOutOfMemory) as err:
        preflight.preflight_step(example_steps.mlp_sgd_step, *make(1 << 24))
    message = str(err.value)
    assert "cannot run with the memory free on this device" in message
    assert "Fix: price a smaller" in message
    assert "128.02GiB" in message and "float32[16777216, 256]" in message
    monkeypatch.setattr(jax.stages.Lowered, "compile", lambda self: 1 / 0)  # any other failure
    with pytest.raises(MeasurementFailed) as other:
        preflight.preflight_step(example_steps.mlp_sgd_step, *make(8))
    assert not isinstance(other.value, CompileOutOfMemory)


def test_no_batch_zero_and_no_second_try_at_a_batch_that_did_not_compile(monkeypatch):
    asked = []
    none = sizing.largest_batch(example_steps.mlp_sgd_step,
                                lambda b: (asked.append(b), make(b))[1], 1000)
    assert none.batch == 0 and 0 not in asked and "smallest batch does not fit" in none.method
    for limit, budget in [(1000, 10**9), (1 << 23, 10**9), (64, 1_003_500), (5000, 3 * 10**6)]:
        step = _TooLarge(lambda b: 10**6 + 1000 * b, limit)
        monkeypatch.setattr(preflight, "needed_bytes", step)
        sizing.largest_batch(lambda b: b, lambda b: (b,), budget)
        assert len(step.asked) == len(set(step.asked)), (limit, step.asked)  # each batch once


def test_an_argument_bound_that_does_not_hold_costs_no_huge_compile(monkeypatch):
    # make_args gives 1000 B an example that the step never reads (jit drops it): the bound says
    # over from batch 2,000, the step needs 10 B an example and fits up to 200,000
    asked = []

    def step(fn, x, **_):
        asked.append(x.shape[0])
        return 10 * x.shape[0]

    monkeypatch.setattr(preflight, "needed_bytes", step)
    found = sizing.largest_batch(lambda x: 0, lambda b: (jax.ShapeDtypeStruct((b, 250), "f4"),),
                                 2 * 10**6)
    assert found.batch == 200_000 and found.needed_bytes <= 2 * 10**6 < found.next_needed_bytes
    assert max(asked) <= 2 * found.batch  # doubled up to it, not halved down from 2**24


def test_the_argument_bound_counts_what_xla_takes():
    import numpy as np

    # float64 is taken as float32 without jax_enable_x64: a bound at 8 B would not be one
    assert sizing._unplaced_bytes((np.zeros((10, 10)), jax.ShapeDtypeStruct((5,), "int8"))) == \
        (400 if not jax.config.jax_enable_x64 else 800) + 5
    assert sizing._unplaced_bytes((jax.numpy.zeros(10), 3)) == 0  # an array on the device: resident


@pytest.mark.gpu
def test_gpu_the_default_search_compiles_and_answers_a_batch_that_fits():
    # the H100 (2026-11-26): the first compile at max_batch 2**24 ran out of memory in XLA's
    # autotuner ("Out of memory while trying to allocate 128.02GiB") and notebook 09 failed
    budget = int(460.8 * 2**20)
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, verify=True)
    assert 0 < found.batch < 1 << 20 and found.needed_bytes == need(found.batch) <= budget
    assert found.next_compiled and found.next_needed_bytes == need(found.batch + 1)  # verify
    with pytest.raises(CompileOutOfMemory, match="cannot run with the memory free"):
        need(1 << 24)  # the batch that did not compile there: now a named error


def test_a_next_batch_that_fits_too_is_said_not_hidden(monkeypatch):
    # a need that is not monotonic (the H100's, 2026-11-26: 129 examples needed more than twice
    # 128's): here batch 2,001 needs less than the line through its neighbours says
    def dip(b):
        return 10**6 + 100_000 * b - 200_000 * (b == 2001)

    budget = 201 * 10**6
    found = _search(monkeypatch, dip, budget, verify=True)
    assert found.batch == 2000 and found.next_compiled and found.next_needed_bytes < budget
    assert "the next batch fits too" in found.method and "not monotonic" in str(found)
    straight = _search(monkeypatch, lambda b: 10**6 + 100_000 * b, budget, verify=True)
    assert straight.batch == 2000 and "fits too" not in straight.method
    assert straight.next_needed_bytes > budget


def test_a_batch_split_over_a_mesh_is_sized_per_device():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    rows = NamedSharding(mesh, P("d"))

    def make(b):
        return (jax.ShapeDtypeStruct((b, 256), jnp.float32, sharding=rows),)

    r = sizing.largest_batch(lambda x: jnp.tanh(x) * 2, make, "8 MiB", granularity=4)
    # each device holds a quarter of the batch in and out: 16,384 rows need 4 + 4 MiB there
    assert r.batch == 16384 and r.compiles <= 4


def _pads_to_32(w, x):
    """A step that pads its batch to a multiple of 32 itself: on the CPU, the plan XLA's GPU
    compiler makes for a batch that is not a multiple of 32 (its split-K pads a matmul's
    contracting dimension, the batch in a weight gradient)."""
    xp = jnp.pad(x, ((0, -x.shape[0] % 32), (0, 0)))
    return jax.grad(lambda w: jnp.tanh(xp @ w).sum())(w)


def _pad_args(batch):
    return (jax.ShapeDtypeStruct((512, 512), "float32"),
            jax.ShapeDtypeStruct((batch, 512), "float32"))


@pytest.mark.parametrize("budget", [8_400_000, 12_000_000, 30_000_000])
def test_a_batch_padded_in_the_plan_is_searched_again_in_multiples_of_the_padding(budget):
    """The H100 (2026-11-27): at 2 GiB the search answered 61,077, where the plan held the batch
    padded to 61,088; a multiple of 32 needs no such copy, and 92,896 fit. Here the first
    search's answer (or the batch above it) is padded, and the answer is the largest multiple
    of 32 that fits: compiled on both sides."""
    found = sizing.largest_batch(_pads_to_32, _pad_args, budget)
    need = lambda b: preflight.needed_bytes(_pads_to_32, *_pad_args(b))  # noqa: E731
    assert found.padded_to == 32 and found.batch % 32 == 0 and found.granularity == 32
    assert found.unaligned_batch < found.batch  # (a multiple too, where the batch above is padded)
    assert need(found.batch) <= budget < need(found.batch + 32)
    assert "padded up to a multiple of 32 (" in found.method  # (the value's name: XLA's op)
    assert (f"{found.batch:,} (a multiple of 32) fits, more than the first answer "
            f"{found.unaligned_batch:,}") in found.method


def test_the_h100s_sawtooth_gives_the_largest_multiple_of_32(monkeypatch):
    """A model of the H100's need at 2 GiB (2026-11-27 record): a batch that is not a multiple
    of 32 needs 771,540,008 B + 22,528 B per example (61,077 fits, 61,078 does not), a multiple
    of 32 about 23,115 B per example (92,896 fits, 92,928 does not). Its plan, as the record's:
    at a batch b that is not a multiple of 32, copies of the batch rounded up to 32 and to 8
    beside f32[b, 2048]; at a multiple of 32, f32[b, 2048] alone."""
    import types

    def need(b):
        return 23_115 * b if b % 32 == 0 else 771_540_008 + 22_528 * b

    def plan(fn, b, **_):  # the plan's values at batch b (largest first, as XLA's)
        up = [-(-b // m) * m for m in (32, 8)] if b % 32 else []
        return types.SimpleNamespace(values=[
            {"op": "fusion", "dtype": "f32", "shape": (n, 2048)} for n in up if n != b] + [
            {"op": "dot_general", "dtype": "f32", "shape": (b, 2048)}])

    monkeypatch.setattr(sizing.compiled, "compile_step", plan)
    found = _search(monkeypatch, need, 2 * 2**30, max_batch=1 << 20)
    assert found.batch == 92_896 and found.padded_to == 32 and found.unaligned_batch < 92_896
    assert found.needed_bytes == need(92_896) and found.next_needed_bytes == need(92_928)
    assert found.granularity == 32 and "a multiple of 32) fits, more than the first" in found.method
    import random

    rng = random.Random(1)
    for _ in range(60):  # any budget: the largest multiple of 32 under the aligned line
        budget = rng.randint(2 * 10**9, 10**10)
        got = _search(monkeypatch, need, budget, max_batch=1 << 20)
        assert got.batch == budget // 23_115 // 32 * 32, (budget, got)
    straight = _search(monkeypatch, lambda b: 771_540_008 + 22_528 * b, 2 * 2**30,
                       max_batch=1 << 20)  # padded, but no multiple of 32 needs less
    assert straight.batch == 61_077 and straight.padded_to == 32
    assert straight.method.endswith("no larger batch fits")
    monkeypatch.setattr(sizing.compiled, "compile_step", lambda fn, b, **_: types.SimpleNamespace(
        values=[{"op": "dot_general", "dtype": "f32", "shape": (b, 2048)}]))
    plain = _search(monkeypatch, need, 2 * 2**30, max_batch=1 << 20)  # no padding seen
    assert plain.padded_to == 1 and plain.unaligned_batch == 0


def test_a_model_width_near_the_batch_is_no_padding():
    """Weights closed over (not in the arguments) of width 2048 at batch 2000: 2048 is 2000
    rounded up to 64, but no value of the plan has the batch where the 2048 is."""
    w = jnp.ones((512, 2048))
    x = jax.ShapeDtypeStruct((2000, 512), "float32")
    assert sizing._padding(lambda x: jnp.tanh(x @ w), (x,), 2000, None, ()) == (1, "")
    mlp = (example_steps.mlp_sgd_step, make(1025), 1025, None, ())
    assert sizing._padding(*mlp) == (1, "")  # f32[2048, 256]: w2's 2,048, beside y's [1025, 256]
    padded = sizing._padding(_pads_to_32, _pad_args(2017), 2017, None, ())
    assert padded == (32, "pad f32[2048, 512]")  # 2,017 rounded up to 32 (and not to 16)


def test_a_failed_second_search_keeps_the_first_answer(monkeypatch):
    import types

    monkeypatch.setattr(sizing.compiled, "compile_step", lambda fn, b, **_: types.SimpleNamespace(
        values=[{"op": "pad", "dtype": "f32", "shape": (-(-b // 32) * 32, 8)},
                {"op": "x", "dtype": "f32", "shape": (b, 8)}]))
    real = sizing._search
    calls = []

    def second_fails(*a, granularity=1, **k):
        calls.append(granularity)
        if granularity > 1:
            raise CompileOutOfMemory("XLA ran out of the device's memory compiling it")
        return real(*a, granularity=granularity, **k)

    monkeypatch.setattr(sizing, "_search", second_fails)
    monkeypatch.setattr(preflight, "needed_bytes", lambda fn, b, **_: 1000 * b)
    found = sizing.largest_batch(lambda b: b, lambda b: (b,), 1_000_001)
    assert found.batch == 1000 and calls == [1, 32]  # 1,000 rounded up to 1,024: by 32


def test_a_typed_prng_key_given_as_a_shape_is_sized_as_a_real_key():
    """A new user's trial (NovaSky-AI/SkyRL#594's sampling, batched): largest_batch raised
    "canonicalize_dtype called on extended dtype key<fry>" for a jax.ShapeDtypeStruct of a
    typed key, which preflight_step takes. The key is 8 bytes, as a real key's."""
    def sample(x, key):
        return x + jax.random.normal(key, x.shape)

    key = jax.random.key(0)

    def shapes(b):
        return jax.ShapeDtypeStruct((b,), jnp.float32), jax.ShapeDtypeStruct((), key.dtype)

    as_shape = sizing.largest_batch(sample, shapes, "1MiB")
    as_key = sizing.largest_batch(sample, lambda b: (shapes(b)[0], key), "1MiB")
    assert as_shape.batch == as_key.batch > 0
