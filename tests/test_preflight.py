"""preflight_step (will this step fit?) and its truth test against a measured peak."""

import functools
import gc
import json
import re
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import allocation, compiled, devices, measure, preflight, program_notes
from helpers._internal import (
    frames,
    jaxcompat,
    jaxpr_loops,
    jaxpr_products,
    jaxpr_walk,
)
from helpers.errors import BadInputError, ChildProcessFailed
from helpers.example_steps import EXAMPLES, matmul_chain, mlp_sgd_step
from helpers.units import NOT_AVAILABLE, format_bytes

MiB = 2**20


def _sum(p):
    return (p.argument_bytes + p.output_bytes - p.alias_bytes + p.temp_bytes
            + p.constant_bytes)


def test_sizes_come_from_xla_and_add_up():
    x, w = EXAMPLES["matmul_chain"][1](1)
    p = preflight.preflight_step(matmul_chain, x, w)
    assert p.argument_bytes == x.nbytes + w.nbytes
    assert p.output_bytes == x.nbytes
    assert p.alias_bytes == 0 and p.donated == ()
    assert p.temp_bytes > 0  # the chain needs a second activation
    assert p.peak_bytes == _sum(p)
    assert p.resident_bytes == 0  # NumPy arguments are not on the device yet
    assert p.needed_bytes == p.peak_bytes
    assert p.device == "cpu:0" and p.verdict == "fits"


def test_nothing_runs_and_nothing_is_copied():
    calls = []

    def f(x):
        calls.append(1)  # runs once, while tracing
        return x * 2

    gc.collect()  # arrays an earlier test left in reference cycles would go mid-count
    before = len(jax.live_arrays())
    p = preflight.preflight_step(f, jax.ShapeDtypeStruct((1024, 1024), jnp.float32))
    assert calls == [1]
    assert len(jax.live_arrays()) == before  # no argument or output was materialised
    assert p.argument_bytes == 4 * MiB


def test_donation_aliases_the_update_and_resident_arguments_are_not_counted_twice():
    params = jnp.ones((512, 512))
    grads = jnp.ones((512, 512))
    update = lambda p, g: p - 0.1 * g  # noqa: E731
    plain = preflight.preflight_step(update, params, grads)
    donated = preflight.preflight_step(update, params, grads, donate_argnums=0)
    assert plain.alias_bytes == 0
    assert donated.alias_bytes == params.nbytes == donated.output_bytes
    assert donated.peak_bytes == plain.peak_bytes - params.nbytes
    assert plain.resident_bytes == 2 * params.nbytes  # already on cpu:0
    assert plain.needed_bytes == plain.peak_bytes - plain.resident_bytes
    assert not params.is_deleted()  # preflight never runs the donation


def test_a_jitted_function_and_keyword_arguments_work():
    f = jax.jit(lambda x, *, scale: x * scale)
    p = preflight.preflight_step(f, np.ones((256, 256), np.float32), scale=3.0)
    assert p.argument_bytes == 256 * 256 * 4 + 4  # the float keyword is traced: 4 bytes
    # donation asked for a function that is jitted already: wrapped again, honoured
    q = preflight.preflight_step(jax.jit(lambda a: a + 1), jnp.ones(1024),
                                      donate_argnums=0)
    assert q.alias_bytes == 4096


def test_a_huge_step_will_not_fit_and_says_what_to_try():
    big = jax.ShapeDtypeStruct((200_000, 200_000), jnp.float32)  # 149 GiB, never allocated
    p = preflight.preflight_step(lambda a: a + 1, big)
    assert p.verdict == "will not fit" and not p.fits
    assert "donate" in p.advice and "smaller batch" in p.advice


def test_unknown_without_free_memory(monkeypatch):
    monkeypatch.setattr(preflight, "_free_bytes", lambda dev: (NOT_AVAILABLE, "none"))
    p = preflight.preflight_step(lambda a: a + 1, jnp.ones(8))
    assert p.verdict == "unknown" and p.free_bytes is NOT_AVAILABLE
    assert json.loads(json.dumps(p.to_dict()))["free_bytes"] is None


def test_renders_as_text_html_and_json():
    p = preflight.preflight_step(matmul_chain, *EXAMPLES["matmul_chain"][1](1))
    text = str(p)
    assert "matmul_chain on cpu:0" in text and "verdict: FITS" in text
    assert "temporaries" in text and "<table>" in p._repr_html_()
    d = json.loads(json.dumps(p.to_dict()))
    assert d["peak_bytes"] == p.peak_bytes and d["donated"] == []


# --- bad input: a clear error, not an XLA traceback ------------------------------------------
def test_python_control_flow_on_a_tracer():
    def step(x):
        if x.sum() > 0:  # Python `if` on a traced value
            return x
        return -x

    with pytest.raises(BadInputError, match=r"step does not trace .*x.sum\(\) > 0.*jnp.where"):
        preflight.preflight_step(step, np.ones(3))


def test_arguments_of_the_wrong_shape():
    with pytest.raises(BadInputError, match=r"matmul_chain fails on these arguments "
                                            r"\(float32\[3, 4\], float32\[5, 5\]\).*dot_general"):
        preflight.preflight_step(matmul_chain, np.ones((3, 4), np.float32),
                                      np.ones((5, 5), np.float32))


def test_a_device_that_does_not_exist():
    with pytest.raises(BadInputError, match="no 'gpu' backend on this machine"):
        preflight.preflight_step(matmul_chain, np.ones((2, 2)), np.ones((2, 2)),
                                      device="gpu")
    with pytest.raises(BadInputError, match="device must be"):
        preflight.preflight_step(matmul_chain, np.ones((2, 2)), np.ones((2, 2)),
                                      device="npu")


@pytest.mark.parametrize("arg, kind", [(np.ones(4, np.float32), "ndarray"), (0.5, "float")])
def test_donating_something_that_is_not_an_array(arg, kind):
    with pytest.raises(BadInputError, match=f"argument 1 is donated but holds a {kind}"):
        preflight.preflight_step(lambda p, lr: p * lr, jnp.ones(4), arg,
                                      donate_argnums=1)


@pytest.mark.parametrize("nums", [5, (0, -1), "0"])
def test_donate_argnums_that_name_no_argument(nums):
    with pytest.raises(BadInputError, match="donate_argnums"):
        preflight.preflight_step(lambda p: p, jnp.ones(4), donate_argnums=nums)


def test_not_a_function():
    with pytest.raises(BadInputError, match="fn must be a function"):
        preflight.preflight_step(jnp.ones(3), jnp.ones(3))


# --- the truth test: prediction against a measured peak, in fresh children ----------------------
TOLERANCE = 0.10  # measured within 10% of the prediction, plus 8 MiB for the process' own noise


@pytest.mark.parametrize("name, scale", [("matmul_chain", 2), ("mlp_sgd_step", 2),
                                         ("scan_rnn", 1)])
def test_measured_peak_matches_the_prediction(name, scale):
    predicted, measured = measure.measure_example(name, scale=scale)
    assert measured.source == measure.HOST_PEAK  # the CPU stand-in in this suite
    assert measured.note == ""  # exact mode: the child ran with the mmap threshold set
    assert measured.argument_bytes == predicted.argument_bytes
    assert measured.peak_bytes == max(measured.first_run_peak_bytes,
                                      measured.later_run_peak_bytes)  # both came back
    # The prediction is of the step itself, which a later run shows. A first run may add the
    # runtime's one-time costs beyond the process set-up measure_example pays: on jax 0.8.0 on
    # an AMD EPYC VM, 32-34 MB for mlp_sgd_step at scale 2 (its later runs as on 0.10.2; not
    # seen on 0.10.2, nor on the Intel VM of earlier sessions). docs/limitations.md says so.
    later = measured.later_run_peak_bytes
    assert abs(later - predicted.peak_bytes) <= (
        TOLERANCE * predicted.peak_bytes + 8 * MiB), (predicted, measured)


def test_donation_lowers_the_measured_peak():
    plain = measure.measure_example("mlp_sgd_step", scale=2)
    donated = measure.measure_example("mlp_sgd_step", scale=2, donate=True)
    # every parameter is written in place (the output's tuple index table is not aliased)
    assert 0 < donated[0].output_bytes - donated[0].alias_bytes < 1024
    saved = plain[1].peak_bytes - donated[1].peak_bytes
    assert saved > 0.5 * donated[0].alias_bytes, (plain, donated)


def test_a_hidden_peak_is_measured_again_from_the_compilation_cache(monkeypatch):
    # On a GPU compile-time autotuning can reach above a small step's peak, and the allocator's
    # mark cannot be reset (the 2026-11-26 H100 run: matmul_chain). The CPU stand-in is never
    # hidden, so the first child's result is called hidden here to take the second path for real
    calls = []
    real = measure._hidden
    monkeypatch.setattr(measure, "_hidden", lambda m: bool(calls.append(m)) or len(calls) == 1
                        or real(m))
    predicted, measured = measure.measure_example("matmul_chain", scale=2)
    assert len(calls) == 2  # the first child's result, then the second's
    assert measured.source == measure.HOST_PEAK  # the CPU stand-in in this suite
    hits = re.search(r"compilation cache \((\d+) hits\)", measured.note)
    assert measured.note.startswith("measured in a second fresh process") and hits
    assert int(hits.group(1)) >= 1  # the step itself was loaded (its own compiles counted)
    assert abs(measured.later_run_peak_bytes - predicted.peak_bytes) <= (
        TOLERANCE * predicted.peak_bytes + 8 * MiB), (predicted, measured)


@pytest.mark.gpu
@pytest.mark.parametrize("name, scale", [("matmul_chain", 1), ("mlp_sgd_step", 2)])
def test_gpu_a_measuring_child_counts_the_step_exactly(name, scale):
    # the H100 probe (2026-11-26): children with a pool taken whole measured 48.00 and 240.03 MiB,
    # their predictions; grown on demand they had measured 76.00 and 364.03
    predicted, measured = measure.measure_example(name, scale=scale)
    assert measured.source == measure.ALLOCATOR_PEAK
    assert abs(measured.peak_bytes - predicted.peak_bytes) <= 0.01 * predicted.peak_bytes, (
        measured)


def test_a_failed_second_measurement_keeps_the_first_and_says_why(monkeypatch):
    hidden = measure.StepMeasurement("f", "cuda:0", 8, NOT_AVAILABLE, measure.ALLOCATOR_PEAK,
                                     0.1, "hidden: an earlier peak")
    answers = iter([measure._ExampleAnswer("the prediction", hidden)])

    def fake(request, env, timeout):
        assert env["JAX_COMPILATION_CACHE_DIR"]  # one cache folder for both children
        # on a GPU: a preallocated share of the free memory (exact counts, room for cuBLAS)
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1250"
        assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
        assert "XLA_CLIENT_MEM_FRACTION" not in env  # the parent's own cap is not inherited
        try:
            return next(answers)
        except StopIteration:
            raise ChildProcessFailed("the second child died") from None

    monkeypatch.setattr(measure, "_measure_in_child", fake)
    monkeypatch.setattr(measure.gpu, "total_bytes", lambda i=0: 80 * 2**30)  # a GPU, 75% held
    monkeypatch.setattr(measure.gpu, "device_used_bytes", lambda i=0: 60 * 2**30)
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.5")
    predicted, measured = measure.measure_example("matmul_chain")
    assert predicted == "the prediction" and measured.peak_bytes is NOT_AVAILABLE
    assert measured.note.startswith("hidden: an earlier peak. A second process")
    assert "the second child died" in measured.note


def test_in_process_measurement_on_the_stand_in_is_labelled():
    m = measure.measure_step(mlp_sgd_step, *EXAMPLES["mlp_sgd_step"][1](1))
    assert m.source == measure.HOST_PEAK and m.peak_bytes >= m.argument_bytes
    assert "lower bound" in m.note  # this process did not set the mmap threshold
    assert "measured peak" in str(m)


def _fake_allocator(monkeypatch, peaks):
    """measure_step against a fake GPU allocator: each read returns the next stats; count runs."""
    import dataclasses

    reads, runs = iter(peaks), []
    monkeypatch.setattr(measure, "_allocator", lambda dev: next(reads))
    real = measure.compile_step

    def counting(*a, **k):
        c = real(*a, **k)
        run = c.executable
        return dataclasses.replace(c, executable=lambda *x, **y: (runs.append(1), run(*x, **y))[1])

    monkeypatch.setattr(measure, "compile_step", counting)
    return runs


def test_with_an_allocator_the_first_run_is_measured(monkeypatch):
    # a warm-up would reach the same high-water mark first and hide the measured run
    runs = _fake_allocator(monkeypatch, [{"bytes_in_use": 1000, "peak_bytes_in_use": 5000},
                                         {"bytes_in_use": 1000, "peak_bytes_in_use": 9000}])
    m = measure.measure_step(mlp_sgd_step, *EXAMPLES["mlp_sgd_step"][1](1))
    assert len(runs) == 1 and m.source == measure.ALLOCATOR_PEAK
    assert m.peak_bytes == 9000 - 1000 + m.argument_bytes and m.note == ""
    assert m.first_run_peak_bytes == m.peak_bytes
    assert m.later_run_peak_bytes is measure.NOT_AVAILABLE  # its mark would hide a later run


def test_an_allocator_peak_that_did_not_rise_is_hidden_not_zero(monkeypatch):
    _fake_allocator(monkeypatch, [{"bytes_in_use": 1000, "peak_bytes_in_use": 9000},
                                  {"bytes_in_use": 1000, "peak_bytes_in_use": 9000}])
    m = measure.measure_step(mlp_sgd_step, *EXAMPLES["mlp_sgd_step"][1](1))
    assert m.peak_bytes is measure.NOT_AVAILABLE and m.note.startswith("hidden")


def test_on_the_host_the_first_run_and_a_later_run_are_each_measured(monkeypatch):
    runs = _fake_allocator(monkeypatch, [None, None])
    m = measure.measure_step(mlp_sgd_step, *EXAMPLES["mlp_sgd_step"][1](1))
    assert len(runs) == 2
    first, later = m.first_run_peak_bytes, m.later_run_peak_bytes
    assert isinstance(first, int) and isinstance(later, int) and m.peak_bytes == max(first, later)
    assert "first run" in str(m) and "a later run" in str(m)


def test_measure_example_rejects_bad_input():
    with pytest.raises(BadInputError, match="no example step 'nope'"):
        measure.measure_example("nope")
    with pytest.raises(BadInputError, match="scale"):
        measure.measure_example("scan_rnn", scale=0)


def test_a_failed_child_is_reported(monkeypatch):
    monkeypatch.setattr(measure.child, "run", lambda *a, **k:
                        measure.child.ChildResult(None, 1, "boom"))
    with pytest.raises(ChildProcessFailed, match="(?s)measuring scan_rnn.*boom"):
        measure.measure_example("scan_rnn")


# --- donation and arguments XLA drops --------------------------------------------------------
def test_donating_a_buffer_that_is_passed_twice_will_fail_and_counts_it_once():
    x = jnp.ones(100)
    both = jax.jit(lambda a, b: (a + 1, b + 1), donate_argnums=(0,))
    p = preflight.preflight_step(lambda a, b: (a + 1, b + 1), x, x, donate_argnums=(0,))
    assert p.verdict == "will fail" and not p.fits
    assert "argument 0 is donated" in p.advice and "argument 1" in p.advice
    assert "jnp.copy" in p.advice and "WILL FAIL" in str(p)
    assert p.resident_bytes == x.nbytes  # one buffer, counted once
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):  # what the kit predicts
        both(x, x)
    y = jnp.ones(100)
    assert preflight.preflight_step(lambda a, b: (a + 1, b + 1), y, jnp.copy(y),
                                    donate_argnums=(0,)).verdict == "fits"


def test_an_argument_xla_drops_is_named_and_not_subtracted():
    x, unused = jnp.ones(100), jnp.ones(100)
    p = preflight.preflight_step(lambda a, b: a * 2, x, unused)
    assert p.argument_bytes == x.nbytes and p.dropped_bytes == unused.nbytes
    assert p.resident_bytes == x.nbytes  # only what the executable takes
    assert p.needed_bytes == p.output_bytes == x.nbytes  # the output still needs room
    assert "never reads" in p.advice and "dropped" in str(p)


# --- where a step's memory goes: constants, donations, and a breakdown that adds up ----------
def test_a_closed_over_array_is_a_constant_counted_in_the_peak():
    big = jnp.arange(512 * 512, dtype=jnp.float32).reshape(512, 512)  # 1 MiB, closed over
    x = jnp.ones((512, 512))
    p = preflight.preflight_step(lambda a: a + big, x)
    assert p.constant_bytes == big.nbytes
    assert p.peak_bytes == _sum(p) == x.nbytes + p.output_bytes + big.nbytes + p.temp_bytes
    assert p.peak_bytes == p.xla_peak_bytes  # XLA's own peak counts the constant too (CPU)
    assert "closes over" in p.advice and "pass them as arguments" in p.advice
    passed = preflight.preflight_step(lambda a, b: a + b, x, big)  # the fix: an argument
    assert passed.constant_bytes == 0 and "closes over" not in passed.advice
    ones = jnp.ones((512, 512))  # one repeated value: XLA broadcasts a scalar, holds no copy
    splat = preflight.preflight_step(lambda a: a + ones, x)
    assert splat.constant_bytes == 0 and splat.xla_peak_bytes == x.nbytes + splat.output_bytes


@pytest.mark.parametrize("loop", ["fori_loop", "cond"])
def test_a_closed_over_array_that_xla_folds_away_is_not_counted(loop):
    """jax#11448: a loop or cond that only reduces a closed-over array; XLA computes the
    reduction while compiling and the program keeps a scalar, not the array."""
    data = jax.random.normal(jax.random.key(0), (256 * 1024,))  # 1 MiB, a jaxpr constant
    if loop == "cond":
        f = lambda p: jax.lax.cond(p, lambda: data.sum(), lambda: data.max())  # noqa: E731
    else:
        f = lambda p: jax.lax.fori_loop(0, 2, lambda i, c: c + data.sum(), 0.0)  # noqa: E731
    p = preflight.preflight_step(f, True)
    assert p.constant_bytes == 0 and "closes over" not in p.advice
    assert p.xla_peak_bytes < 1024  # XLA's own peak: the array is not in the program
    kept = preflight.preflight_step(lambda p: jax.lax.cond(p, lambda: data, lambda: -data), True)
    # returned whole: the program holds data, and -data, which XLA computed while compiling
    # (of data's shape, so counted as closed over: the bytes are what matter)
    assert (kept.constant_bytes, kept.folded_bytes) == (2 * data.nbytes, 0)


def test_each_donated_argument_says_whether_it_is_reused_and_why_not():
    x, n, z = jnp.ones(100), jnp.ones(50, jnp.int32), jnp.ones(100)
    p = preflight.preflight_step(lambda a, b, c: (a * 2, c.sum()), x, n, z,
                                 donate_argnums=(0, 1, 2))
    by = {d.argument: d for d in p.donations}
    assert by["0"].reused and by["0"].why == ""
    assert not by["1"].reused and "never reads" in by["1"].why
    assert not by["2"].reused and "already written into another" in by["2"].why
    assert p.alias_bytes == sum(d.nbytes for d in p.donations if d.reused)
    odd = preflight.preflight_step(lambda a: a.sum(), jnp.ones(8), donate_argnums=0)
    (d,) = odd.donations
    assert not d.reused and "no output is a float32[8]" in d.why
    assert "Donated but not reused" in odd.advice


def test_a_donated_shape_is_priced_like_the_array_it_stands_for():
    shape = jax.ShapeDtypeStruct((256, 4), jnp.float32)
    p = preflight.preflight_step(lambda a: a * 2, shape, donate_argnums=0)
    (d,) = p.donations
    assert d.reused and d.nbytes == 256 * 4 * 4 == p.alias_bytes


def test_a_donated_prng_key_is_priced_too():
    state = {"w": jnp.ones((256, 4)), "key": jax.random.key(0)}
    p = preflight.preflight_step(lambda s: {"w": s["w"] * 2, "key": s["key"]}, state,
                                 donate_argnums=0)
    assert sorted((d.argument, d.nbytes) for d in p.donations) == [
        ("0['key']", 8), ("0['w']", 4096)]
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    q = preflight.preflight_step(lambda s: {"w": s["w"] * 2, "key": s["key"]}, shapes,
                                 donate_argnums=0)
    assert [d.nbytes for d in q.donations] == [d.nbytes for d in p.donations]


def test_donations_inside_a_pytree_are_named_by_their_path():
    x, b = jnp.ones(100), jnp.ones(100)
    p = preflight.preflight_step(lambda d: {"w": d["w"] * 2}, {"w": x, "b": b},
                                 donate_argnums=0)
    assert {(d.argument, d.reused) for d in p.donations} == {("0['w']", True),
                                                             ("0['b']", False)}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_breakdown_adds_up_on_every_example(name):
    args = EXAMPLES[name][1](1)
    for donate in ((), (0,)):
        p = preflight.preflight_step(EXAMPLES[name][0], *jax.device_put(args),
                                     donate_argnums=donate)
        assert _sum(p) == p.peak_bytes and p.needed_bytes == max(p.peak_bytes - p.resident_bytes,
                                                                 0)


# --- a card you are not on --------------------------------------------------------------------
def test_a_step_judged_for_a_target_card():
    x = jnp.ones((1024, 1024))  # 4 MiB
    here = preflight.preflight_step(lambda a: a @ a, x)
    small = preflight.preflight_step(lambda a: a @ a, x, target=6 * MiB)
    assert small.needed_bytes == small.peak_bytes == here.peak_bytes  # nothing resident there
    assert small.resident_bytes == 0 and small.device == "6.00 MiB card"
    assert small.verdict == "will not fit" and "sized for the target, compiled here" in \
        small.free_source
    assert preflight.preflight_step(lambda a: a @ a, x, target="H100").verdict == "fits"


# --- what a gradient keeps for the backward pass ------------------------------------------------
def _scan_loss(remat: bool):
    def loss(w, x):
        def body(h, xi):
            return jnp.tanh(h @ w + xi), None

        h, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, jnp.zeros(64), x)
        return h.sum()

    return loss


def test_residuals_of_a_scan_grow_with_its_length_and_remat_shrinks_them():
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    short, long_ = (jax.ShapeDtypeStruct((n, 64), jnp.float32) for n in (50, 100))
    plain = preflight.residuals(_scan_loss(False), w, long_)
    assert plain.scan_lengths == (100,) and plain.scan_bytes == plain.saved_bytes > 0
    assert preflight.residuals(_scan_loss(False), w, short).saved_bytes * 2 == plain.saved_bytes
    remat = preflight.residuals(_scan_loss(True), w, long_)
    assert remat.saved_bytes < plain.saved_bytes  # what the advice says jax.checkpoint does
    assert "jax.checkpoint" in plain.advice and "test_preflight.py" in plain.residuals[0].source
    arguments = [r for r in plain.residuals if r.is_argument]
    assert arguments and all(r.source.startswith("from the argument") for r in arguments)
    assert "keeps" in str(plain)


def test_a_scan_s_final_carry_is_not_counted_as_stacked_over_its_length():
    """A carry is an "output of scan" in JAX's list too; it does not grow with the length (the
    kit called a 64x64 carry 'stacked over 64 steps')."""
    w = jnp.eye(64) * 0.5

    def loss(x):
        c, ys = jax.lax.scan(lambda c, _: (jnp.sin(c @ w), jnp.cos(c)), x, None, length=1000)
        return jnp.sum(c * x) + ys.sum()

    r = preflight.residuals(loss, jnp.ones((64, 64)))
    carries = [x for x in r.residuals if x.shape == (64, 64) and "scan" in x.source]
    assert carries and r.scan_lengths == (1000,)
    assert r.scan_bytes == sum(x.nbytes for x in r.residuals if x.shape[:1] == (1000,))
    assert "stacked over 1000 steps" in r.advice

    def loss64(x):  # a carry whose first dimension is the scan's length (the review's case)
        c, ys = jax.lax.scan(lambda c, _: (jnp.sin(c @ w), jnp.cos(c)), x, None, length=64)
        return jnp.sum(c * x) + ys.sum()

    r64 = preflight.residuals(loss64, jnp.ones((64, 64)))
    assert r64.scan_bytes == sum(x.nbytes for x in r64.residuals if x.shape[:1] == (64,)
                                 and len(x.shape) == 3)


def test_residuals_of_something_that_cannot_be_traced():
    with pytest.raises(BadInputError, match="could not be differentiated.*float32\\[3\\]"):
        preflight.residuals(lambda x: x.no_such_method(), jnp.ones(3))


# jax-ml/jax#19250: grad of a fori_loop of elementwise steps keeps one array per step, and
# jax.remat on the body "does not help": each step keeps as much as its carry already
_T, _D = 256, 1024  # 1 MiB stacked: 4 KiB a step


def _loop(remat: bool):
    def fn(x):
        body = lambda _, x: jnp.sin(x)  # noqa: E731 (the thread's own)
        return jax.lax.fori_loop(0, _T, jax.remat(body) if remat else body, x).sum()

    return fn


def _loop_in_chunks(x):  # the fix: a scan of 16 checkpointed chunks of 16 steps
    @jax.checkpoint
    def chunk(x, _):
        return jax.lax.fori_loop(0, 16, lambda _, x: jnp.sin(x), x), None

    return jax.lax.scan(chunk, x, None, length=_T // 16)[0].sum()


def test_jax_19250_a_loop_whose_steps_keep_their_carry_is_not_told_to_checkpoint_its_body():
    x = jnp.linspace(0.0, 1.0, _D)
    plain, remat = (preflight.residuals(_loop(r), x) for r in (False, True))
    assert plain.saved_bytes == remat.saved_bytes == _T * _D * 4  # remat changed nothing
    assert "no more than its carry" in plain.advice and "cannot shrink this" in plain.advice
    assert "under jax.checkpoint already" in remat.advice
    for r in (plain, remat):  # the advice that cannot work is gone; the one that does is named
        assert "If the scan's body is not wrapped" not in r.advice
        assert "jax.checkpoint-ed chunks of 16 steps" in r.advice
    chunked = preflight.residuals(_loop_in_chunks, x)  # and it works: 1 MiB -> 64 KiB
    assert chunked.saved_bytes * 16 == plain.saved_bytes
    assert "a jax.checkpoint-ed chunk of steps already" in chunked.advice
    assert np.allclose(jax.grad(_loop(False))(x), jax.grad(_loop_in_chunks)(x))
    for fn, said in ((_loop(False), "cannot shrink this"),
                     (_loop(True), "under jax.checkpoint already")):
        p = preflight.preflight_step(jax.grad(fn), x)
        assert p.scan_stacks[0].role == "forward" and said in p.advice
        assert "if it is not there yet" not in p.advice and "chunks of 16 steps" in p.advice
    assert preflight.preflight_step(jax.grad(_loop_in_chunks), x).temp_bytes * 4 < p.temp_bytes


# sgl-project/sglang-jax#823: a chunked linear attention whose jax.custom_vjp fwd rule returns
# every chunk's state as residuals: jax.checkpoint on the scan's body inside it drops nothing
_BT, _H, _K = 16, 4, 32


def _gla_scan(q, k, v, remat=False):
    def step(S, qkv):
        qc, kc, vc = qkv
        A = jnp.einsum("htk,hsk->hts", qc, kc) * jnp.tril(jnp.ones((_BT, _BT)))
        o = jnp.einsum("htk,hkv->htv", qc, S) + jnp.einsum("hts,hsv->htv", A, vc)
        return S + jnp.einsum("htk,htv->hkv", kc, vc), (o, S, A)

    return jax.lax.scan(jax.checkpoint(step) if remat else step, jnp.zeros((_H, _K, _K)),
                        (q, k, v))[1]


def _gla(saved: str):
    """The op with a fwd rule that returns all (the thread's), all from a checkpointed
    scan body (the kit's old advice), or only its inputs (the thread's fix)."""
    @jax.custom_vjp
    def gla(q, k, v):
        return _gla_scan(q, k, v)[0]

    def gla_fwd(q, k, v):
        o, states, a = _gla_scan(q, k, v, remat=saved == "remat")
        return o, (q, k, v) if saved == "inputs" else (q, k, v, states, a)

    def gla_bwd(res, do):  # recomputes from the inputs
        return jax.vjp(lambda q, k, v: _gla_scan(q, k, v)[0], *res[:3])[1](do)

    gla.defvjp(gla_fwd, gla_bwd)
    return lambda q, k, v: jnp.sum(gla(q, k, v) ** 2)


def test_sglang_jax_823_custom_vjp_residuals_are_named_with_the_fwd_rule_and_its_fix():
    q = k = v = jnp.ones((32, _H, _BT, _K))  # 32 chunks
    r = preflight.residuals(_gla("all"), q, k, v)
    assert r.saved_bytes == 896 * 1024
    assert "residuals the jax.custom_vjp fwd rule gla_fwd returns" in r.advice
    assert "cannot drop it" in r.advice and "Return fewer residuals from gla_fwd" in r.advice
    assert {x.fwd_rule for x in r.residuals if "scan" in x.source} == {"gla_fwd"}
    assert "If the scan's body is not wrapped" not in r.advice  # the advice that did nothing
    remat = preflight.residuals(_gla("remat"), q, k, v)
    assert remat.saved_bytes == r.saved_bytes and "gla_fwd" in remat.advice
    fixed = preflight.residuals(_gla("inputs"), q, k, v)  # the thread's fix: 896 -> 256 KiB
    assert fixed.saved_bytes == 256 * 1024 and not any(x.fwd_rule for x in fixed.residuals)
    assert np.allclose(jax.grad(_gla("all"))(q, k, v), jax.grad(_gla("inputs"))(q, k, v))
    q = k = v = jnp.ones((128, _H, _BT, _K))  # 128 chunks: 3.50 MiB stacked, a note of its own
    p = preflight.preflight_step(jax.grad(_gla("all")), q, k, v)
    assert p.scan_stacks[0].fwd_rule == "gla_fwd"
    assert "inside the jax.custom_vjp fwd rule gla_fwd" in p.advice
    assert "return fewer from gla_fwd" in p.advice and "names this scan's values" in p.advice
    assert "jax.checkpoint on the body" not in p.advice


# jax-ml/jax#787: a Hessian by jacfwd(jacrev(E)) of a pairwise-distance energy asks for far
# more memory than the Hessian: jacfwd pushes all 3N tangents through E at once
def _energy(conf):  # pairwise distances through a Gram matrix: a dot XLA keeps on 0.8 and 0.10
    sq = jnp.sum(conf**2, axis=1)
    return jnp.sum(jnp.sqrt(sq[:, None] + sq[None, :] - 2 * conf @ conf.T + 1e-6))


def _energy_thread(conf):  # the thread's: on jax 0.10.2 XLA's CPU plan fuses the basis away
    d = jnp.power(jnp.expand_dims(conf, 0) - jnp.expand_dims(conf, 1), 2)
    return jnp.sum(jnp.sqrt(jnp.sum(d, axis=-1) + 1e-6))


def _hessian_in_rows(x, energy=_energy):  # the fix the note gives, k = 8
    n = x.size
    return jax.lax.map(lambda v: jax.jvp(jax.grad(energy), (x,), (v,))[1],
                       jnp.eye(n).reshape(n, *x.shape), batch_size=8)


def test_jax_787_a_hessian_s_own_vmap_is_named_with_the_rows_at_a_time_fix():
    x = jnp.asarray(np.random.RandomState(0).rand(48, 3), jnp.float32)  # 144 tangents
    fix = "jax.lax.map(lambda v: jax.jvp(jax.grad(f), (x,), (v,))[1], jnp.eye(n)"
    for hess, who in ((jax.hessian(_energy), "jax.jacfwd"),
                      (jax.jacrev(jax.jacrev(_energy)), "jax.jacrev")):
        p = preflight.preflight_step(hess, x)
        assert f"made for all 144 basis vectors at once, under the vmap of {who}" in p.advice
        assert fix in p.advice and "n = 144" in p.advice
        assert "as the vectorized code would be" not in p.advice  # a vmap the user never wrote
    rows = preflight.preflight_step(_hessian_in_rows, x)
    assert rows.temp_bytes * 4 < p.temp_bytes and "basis vectors" not in rows.advice
    assert np.allclose(jax.jit(jax.hessian(_energy))(x).reshape(144, 144),
                       jax.jit(_hessian_in_rows)(x).reshape(144, 144), atol=1e-3)
    # the thread's own energy: named where XLA's plan keeps the basis (jax 0.8.0), silent where
    # it fuses it away (0.10.2: nothing to save), and never called a vmap of the user's
    thread = preflight.preflight_step(jax.jacfwd(jax.jacrev(_energy_thread)), x)
    assert "as the vectorized code would be" not in thread.advice
    kept = max(t.nbytes for t in thread.largest_temporaries)
    assert ("basis vectors at once" in thread.advice) == (kept >= 4 * 144 * 144 * 4)
    if kept >= 4 * 144 * 144 * 4:
        rows = preflight.preflight_step(lambda x: _hessian_in_rows(x, _energy_thread), x)
        assert rows.temp_bytes * 2 < thread.temp_bytes


# jax-ml/jax#2937: the Hessian of V at each of many points, multiplied by one vector per point;
# a Hessian-vector product (jvp of grad, the autodiff cookbook's hvp) never makes the Hessian
def _hessians_times_vectors(xs, ws):
    hs = jax.vmap(jax.hessian(_energy))(xs)  # LINE-HESSIANS
    return jnp.einsum("nij,nj->ni", hs.reshape(len(xs), 144, 144), ws.reshape(len(xs), 144))


def _hessians_times_vectors_and_kept(xs, ws):
    hs = jax.vmap(jax.hessian(_energy))(xs).reshape(len(xs), 144, 144)
    return jnp.einsum("nij,nj->ni", hs, ws.reshape(len(xs), 144)), hs


def _hvps(xs, ws):  # the fix the note gives
    return jax.vmap(lambda x, w: jax.jvp(jax.grad(_energy), (x,), (w,))[1])(xs, ws)


def test_jax_2937_a_hessian_made_only_to_multiply_a_vector_is_named_with_the_hvp():
    rng = np.random.RandomState(0)
    xs = jnp.asarray(rng.rand(16, 48, 3), jnp.float32)
    ws = jnp.asarray(rng.rand(16, 48, 3), jnp.float32)
    p = preflight.preflight_step(_hessians_times_vectors, xs, ws)
    assert p.jacobian_products and p.jacobian_products[0].kind == "hessian"
    said = p.advice
    assert "makes the whole Hessian (jax.hessian) at" in said and "LINE-HESSIANS" in said
    assert "float32[16, 144, 144]" in said and "einsum" in said  # the product's line
    assert "jax.jvp(jax.grad(f), (x,), (v,))[1] gives that product without it" in said
    assert "jax.vmap it over the points" in said
    assert "and to build it" in said  # the basis pushed through at once: jax#787's values
    # not the advice for a Hessian the user needs whole, nor chunks of the user's vmap
    assert "basis vectors" not in said and "as the vectorized code would be" not in said
    fixed = preflight.preflight_step(_hvps, xs, ws)
    assert fixed.temp_bytes * 4 < p.temp_bytes and not fixed.jacobian_products
    assert np.allclose(jax.jit(_hessians_times_vectors)(xs, ws),
                       jax.jit(_hvps)(xs, ws).reshape(16, 144), rtol=1e-3, atol=1e-2)
    # a Hessian kept whole, or multiplied by a matrix, is no Hessian-vector product
    whole = preflight.preflight_step(jax.vmap(jax.hessian(_energy)), xs)
    assert not whole.jacobian_products and "makes the whole Hessian" not in whole.advice
    also_kept = preflight.preflight_step(_hessians_times_vectors_and_kept, xs, ws)
    assert not also_kept.jacobian_products  # returned as well: needed whole
    by_matrix = preflight.preflight_step(
        lambda x, m: jax.hessian(_energy)(x).reshape(144, 144) @ m, xs[0], jnp.ones((144, 8)))
    assert not by_matrix.jacobian_products


def test_jax_2937_a_jacobian_times_a_vector_is_a_jvp_and_a_vector_times_it_a_vjp():
    w = jnp.asarray(np.random.RandomState(1).rand(4, 512), jnp.float32)

    def f(x):
        return jnp.tanh(x @ w).ravel()  # 8,192 outputs of 64 inputs

    x = jnp.ones((16, 4), jnp.float32)
    right = preflight.preflight_step(lambda x, v: jax.jacfwd(f)(x).reshape(8192, 64) @ v,
                                     x, jnp.ones(64))
    left = preflight.preflight_step(lambda x, u: u @ jax.jacrev(f)(x).reshape(8192, 64),
                                    x, jnp.ones(8192))
    assert right.jacobian_products or left.jacobian_products  # named on 0.8.0 to 0.12.0.1
    for p, mode, side in ((right, "forward", "right"), (left, "reverse", "left")):
        if not p.jacobian_products:  # XLA fused the Jacobian away: nothing held, nothing said
            assert "makes the whole Jacobian" not in p.advice
            continue
        assert (p.jacobian_products[0].kind, p.jacobian_products[0].side) == (mode, side)
    # J.T @ u is u @ J: a transpose swaps the sides, and the kit does not follow one (it said
    # "jax.jvp ... gives J @ v" here, the wrong product)
    transposed = preflight.preflight_step(
        lambda x, u: jax.jacrev(f)(x).reshape(8192, 64).T @ u, x, jnp.ones(8192))
    assert not transposed.jacobian_products and "J @ v" not in transposed.advice
    if right.jacobian_products:
        assert "jax.jvp(f, (x,), (v,))[1] gives J @ v without it" in right.advice
    if left.jacobian_products:
        assert "jax.vjp(f, x)[1](u)[0] gives u @ J without it" in left.advice
    # the two fixes give the same products
    v, u = jnp.ones(64), jnp.ones(8192)
    jvp = jax.jvp(f, (x,), (v.reshape(16, 4),))[1]
    vjp = jax.vjp(f, x)[1](u)[0]
    assert np.allclose(jvp, jax.jacfwd(f)(x).reshape(8192, 64) @ v, rtol=1e-4, atol=1e-3)
    assert np.allclose(vjp.ravel(), u @ jax.jacrev(f)(x).reshape(8192, 64), rtol=1e-4,
                       atol=1e-3)


# --- the largest temporaries, with the op and the user's line -----------------------------------
# The product is returned, not summed: XLA 0.11's CPU runs (...).sum() as one YNNPACK fusion
# (both dots, tanh and sin inside) with no temporaries in its plan (16 MiB on jax 0.8.0 and
# 0.10.2, 0 B on 0.11.2). Returned, it plans 8 MiB on all three.
def _two_layers(x, w):
    h = jnp.tanh(x @ w)  # LINE-H: an 8 MiB intermediate
    return jnp.sin(h @ w.T) * h


def test_the_largest_temporaries_name_the_op_and_the_line():
    import inspect

    x, w = jnp.ones((2048, 1024)), jnp.ones((1024, 1024))
    p = preflight.preflight_step(_two_layers, x, w)
    assert p.temp_bytes > 0 and p.largest_temporaries
    top = p.largest_temporaries[0]
    assert top.nbytes == 2048 * 1024 * 4 and top.shape == (2048, 1024) and top.dtype == "f32"
    source, first = inspect.getsourcelines(_two_layers)
    lines = {first + i for i, text in enumerate(source) if "h" in text.split("=")[0]
             or "sin" in text}
    numbers = {int(t.line.split(":")[1]) for t in p.largest_temporaries if t.line}
    assert numbers and numbers <= lines, (numbers, lines)  # lines inside _two_layers
    assert all(t.line.startswith("test_preflight.py:") for t in p.largest_temporaries if t.line)
    assert "a large one:" in str(p)


# --- static arguments, and donation the user's own jit declares ---------------------------------
def _repeat(x, n, *, mode="double"):
    for _ in range(n):  # a Python loop over a static count: fails to trace if n is traced
        x = x * 2 if mode == "double" else x + 1
    return x


def test_static_arguments_are_accepted_and_named_when_wrong():
    x = jnp.ones((256, 256))
    with pytest.raises(BadInputError, match="static_argnums"):
        preflight.preflight_step(_repeat, x, 3)  # n traced: the error names the fix
    p = preflight.preflight_step(_repeat, x, 3, static_argnums=1, mode="add",
                                 static_argnames="mode")
    assert p.output_bytes == x.nbytes and p.argument_bytes == x.nbytes  # n is no argument
    with pytest.raises(BadInputError, match="static_argnums=5"):
        preflight.preflight_step(_repeat, x, 3, static_argnums=5)
    with pytest.raises(BadInputError, match="static_argnames=.*'speed'"):
        preflight.preflight_step(_repeat, x, 3, static_argnums=1, static_argnames="speed")
    with pytest.raises(BadInputError, match="both static and donated"):
        preflight.preflight_step(_repeat, x, 3, static_argnums=1, donate_argnums=1)


def test_measure_step_runs_a_step_with_static_arguments():
    x = jnp.ones((512, 512))
    m = measure.measure_step(_repeat, x, 2, static_argnums=1, mode="add",
                             static_argnames="mode")
    assert m.argument_bytes == x.nbytes and m.peak_bytes >= x.nbytes


def test_donation_declared_by_the_users_own_jit_is_reported():
    step = jax.jit(lambda p, g: p - 0.1 * g, donate_argnums=0)
    p, g = jnp.ones(1000), jnp.ones(1000)
    found = preflight.preflight_step(step, p, g)
    assert found.donated == (0,) and found.alias_bytes == p.nbytes
    assert "donate the arguments" not in found.advice


def test_a_step_that_returns_nothing_is_not_a_silent_fits():
    state = {"w": jnp.ones((512, 512))}

    def step_in_place(s):  # updates a Python dict and returns nothing: JAX traces no work
        s["w"] = s["w"] * 2

    found = preflight.preflight_step(step_in_place, state)
    assert found.output_bytes == found.temp_bytes == 0
    assert "computes nothing" in found.advice and "computes nothing" in str(found)
    kept = preflight.preflight_step(lambda s: {"w": s["w"] * 2}, state)
    assert "computes nothing" not in kept.advice


def test_a_misspelled_option_is_named_not_passed_on_in_silence():
    with pytest.raises(BadInputError, match="did you mean the option 'static_argnums'"):
        preflight.preflight_step(_repeat, jnp.ones(8), 2, static_argnum=1)


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_the_cpu_runtime_copies_of_a_weight_gradient_convolution_are_counted():
    x, w = jnp.zeros((16, 28, 28, 32)), jnp.ones((3, 3, 32, 64)) * 0.01
    grad = preflight.preflight_step(lambda x, w: jax.grad(lambda w: (_conv(x, w) ** 2).sum())(w),
                                    x, w)
    dy = 16 * 28 * 28 * 64 * 4  # the output gradient, the convolution's other operand
    assert grad.runtime_bytes == x.nbytes + dy
    assert "beyond XLA's plan" in str(grad) and "weight gradient" in grad.advice
    forward = preflight.preflight_step(lambda x, w: _conv(x, w).sum(), x, w)
    assert forward.runtime_bytes == 0  # the forward convolution stays inside the plan


class _UpdatesInPlace:
    """A jit in the style of ``nnx.jit``: its compiled call writes the new state into the dict
    it was given and returns nothing."""

    def __init__(self, fn):
        self.jitted, self.written = jax.jit(fn), []

    def __call__(self, state):
        raise AssertionError("the kit runs the compiled step, not this")

    def lower(self, state):
        outer, lowered = self, self.jitted.lower(state)

        class Lowered:
            def __getattr__(self, name):
                return getattr(lowered, name)

            def compile(self):
                compiled = lowered.compile()

                class Compiled:
                    def __getattr__(self, name):
                        return getattr(compiled, name)

                    def __call__(self, state):
                        state.update(compiled(state))
                        outer.written.extend(state.values())

                return Compiled()

        return Lowered()


def test_a_step_that_returns_nothing_is_waited_for_through_its_updated_state(monkeypatch):
    step = _UpdatesInPlace(lambda s: {"w": jnp.tanh(s["w"] @ s["w"])})
    waited = []
    real = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready",  # what each call waited on, as it was then
                        lambda x: (waited.extend(map(id, jax.tree.leaves(x))), real(x))[1])
    m = measure.measure_step(step, {"w": jnp.ones((256, 256))})
    assert len(step.written) == 2  # the first run and a later one, each wrote its new state
    seen = set(waited)
    assert all(id(x) in seen for x in step.written), "a run was not waited for"
    assert m.later_run_peak_bytes >= m.argument_bytes


def test_donation_by_name_is_priced_like_donation_by_position():
    def update(params, grads):
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    p, g = {"w": jnp.ones((256, 256))}, {"w": jnp.ones((256, 256))}
    by_name = preflight.preflight_step(update, p, g, donate_argnames="params")
    by_position = preflight.preflight_step(update, p, g, donate_argnums=0)
    assert by_name.donated == by_position.donated == (0,)
    assert by_name.alias_bytes == by_position.alias_bytes == p["w"].nbytes
    m = measure.measure_step(update, p, g, donate_argnames=("params",))
    assert m.peak_bytes >= m.argument_bytes
    with pytest.raises(BadInputError, match="passed here as a keyword"):
        preflight.preflight_step(update, p, grads=g, donate_argnames="grads")
    with pytest.raises(BadInputError, match="not one of the 2 positional arguments"):
        preflight.preflight_step(update, p, g, donate_argnames="weights")
    with pytest.raises(BadInputError, match="did you mean the option 'donate_argnames'"):
        preflight.preflight_step(update, p, g, donate_argname="params")


def test_donation_by_name_never_lands_on_another_argument():
    def step(*xs, y=None):
        return sum(xs)

    x = jnp.ones(8)
    with pytest.raises(BadInputError, match="not one of the 2 positional arguments"):
        preflight.preflight_step(step, x, x, donate_argnames="y")  # not the second of *xs
    with pytest.raises(BadInputError, match="donate_argnums='0'"):  # checked, not dropped
        preflight.preflight_step(lambda p, g: p - g, x, x, donate_argnums="0",
                                 donate_argnames="p")


def test_a_step_that_places_values_on_several_devices_is_sized_there_or_refused_clearly():
    """A sharding inside the step: sized over the devices it names, one device's share (it
    was refused before); asked for one device, it is refused with the way to XLA's sizes."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    split = NamedSharding(mesh, P("data"))

    def spread(x):
        return jax.lax.with_sharding_constraint(x * 2, split)

    p = preflight.preflight_step(spread, jnp.ones(8))
    assert "the first of the 2 devices its own shardings" in p.device_reason
    assert p.output_bytes == 8 * 4 // 2  # one device's half
    with pytest.raises(BadInputError, match="Sized here on one device, as asked") as err:
        preflight.preflight_step(spread, jnp.ones(8), device="cpu")
    assert "memory_analysis()" in str(err.value)
    # committed to one device against the sharding inside: the real call fails too, and says so
    committed = jax.device_put(jnp.ones(8), jax.devices()[3])
    with pytest.raises(ValueError):
        jax.jit(spread)(committed)
    with pytest.raises(BadInputError, match="The call itself fails so") as err:
        preflight.preflight_step(spread, committed)
    assert "jax.device_put(x, sharding)" in str(err.value)


def test_measure_step_of_a_jit_that_declares_shardings_is_refused_clearly():
    """measure_step runs a step whole on one device; a jit whose in_shardings span several
    cannot be, and says so rather than crashing inside JAX (a reviewer's finding)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    step = jax.jit(lambda x: x * 2, in_shardings=NamedSharding(mesh, P("d")))
    with pytest.raises(BadInputError, match="fails on these arguments"):
        measure.measure_step(step, np.ones((64, 4), np.float32))


def _adam_like(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return ({"count": jnp.zeros((), jnp.int32), "mu": zeros, "nu": dict(zeros)}, ())


def _keep(params, opt_state, grads):
    return jax.tree.map(lambda p, g: p - g, params, grads), opt_state


def test_the_copies_of_the_parameters_inside_an_optimizer_state_are_named_where_they_are():
    params = {"w": jnp.ones((512, 512)), "b": jnp.ones(512)}
    grads = jax.tree.map(jnp.ones_like, params)
    p = preflight.preflight_step(_keep, params, _adam_like(params), grads)
    each = 512 * 512 * 4 + 512 * 4
    assert [(c.holder, c.path, c.of, c.nbytes, c.of_nbytes) for c in p.state_copies] == [
        ("opt_state", "[0]['mu']", "params", each, each),
        ("opt_state", "[0]['nu']", "params", each, each)]  # grads: a copy as a whole, not state
    assert ("opt_state holds 2 copies of params' shapes (opt_state[0]['mu'], "
            "opt_state[0]['nu']: 2.00 MiB, 2.00x params)") in p.advice
    assert "mu_dtype" in p.advice and "accumulator_dtype" in p.advice
    row = next(line for line in str(p).splitlines() if "copies of the shapes" in line)
    assert "opt_state: copies of the shapes of params" in row and "[0]['nu'] 1.00 MiB" in row


def test_a_copy_is_named_by_the_field_that_holds_it_and_counted_at_its_own_dtype():
    params = {"w": jnp.ones((1024, 512)), "b": jnp.ones(512)}
    state = {"trace": {"inner": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.bfloat16),
                                             params)}}
    p = preflight.preflight_step(lambda params, s: (params, s), params, state)
    size = 1024 * 512 * 4 + 512 * 4
    assert [(c.path, c.nbytes, c.of_nbytes) for c in p.state_copies] == [
        ("['trace']['inner']", size // 2, size)]
    assert "holds 1 copy of params' shapes" in p.advice and "0.50x params" in p.advice


def test_a_shape_that_recurs_by_chance_is_no_copy():
    """The kit's MLP step: its labels y have the shape of params['w2'] (a single array's shape
    can recur by chance), and a tree with other keys is no copy either."""
    params = {"w1": jnp.ones((512, 1024)), "w2": jnp.ones((1024, 256))}
    y = jnp.ones((1024, 256))  # 1 MiB, w2's shape
    p = preflight.preflight_step(lambda params, y: (params, y), params, y)
    assert p.state_copies == () and "copy of" not in p.advice
    renamed = {"a": jnp.zeros((512, 1024)), "b": jnp.zeros((1024, 256))}
    q = preflight.preflight_step(lambda params, s: (params, s), params, {"m": renamed})
    assert q.state_copies == ()
    same = preflight.preflight_step(lambda params, s: (params, s), params,
                                    {"m": jax.tree.map(jnp.zeros_like, params)})
    assert [c.path for c in same.state_copies] == ["['m']"]  # the control: keys alike


@pytest.mark.parametrize("case", ["small", "other shapes", "no state"])
def test_no_copies_are_named_where_there_are_none(case):
    n = 64 if case == "small" else 512  # 64x64 float32: 16 KiB, under the 1 MiB worth a word
    params = {"w": jnp.ones((n, n)), "b": jnp.ones(n)}
    state = (_adam_like(params) if case != "other shapes" else
             ({"mu": {"w": jnp.zeros((n, n)), "b": jnp.zeros(n + 1)}}, ()))
    if case == "no state":
        state = ((), ())
    p = preflight.preflight_step(_keep, params, state, params)
    assert p.state_copies == () and "copies of" not in p.advice and "copy of" not in p.advice


def _history(x):
    def body(c, _):
        c = jnp.tanh(c @ c.T) * 0.5
        return c, c  # every step's state kept
    return jax.lax.scan(body, x, None, length=64)


def test_a_lax_map_s_stack_is_named_as_its_result_not_as_a_body_returning_too_much():
    keys = jax.random.split(jax.random.key(0), 16)
    p = preflight.preflight_step(
        lambda keys: jax.lax.map(lambda k: jax.random.normal(k, (512, 512)), keys), keys)
    (t,) = p.scan_stacks
    assert not t.has_carry and t.nbytes == 16 * 2**20 and _history_has_carry()
    assert "A jax.lax.map (a scan without a carry)" in p.advice
    assert "in a lax.scan's carry instead" in p.advice and "Return less from the body" \
        not in p.advice
    # juanitorduz/numpyro_forecast#65 (a new user's trial): draws kept for the host are moved
    # there chunk by chunk; the kit had called the stack memory the step must have
    assert "move each chunk's result to the host" in p.advice and "#65" in p.advice
    draw = jax.jit(lambda keys: jax.lax.map(lambda k: jax.random.normal(k, (512, 512)), keys))
    chunks = np.concatenate([np.asarray(draw(keys[i:i + 4])) for i in range(0, 16, 4)])
    assert np.array_equal(chunks, np.asarray(draw(keys)))  # the same draws, 4 at a time
    one = preflight.preflight_step(draw, keys[:4])
    assert 4 * one.output_bytes == p.output_bytes and one.peak_bytes < p.peak_bytes


def _history_has_carry() -> bool:
    (t,) = preflight.preflight_step(_history, jnp.ones((128, 128))).scan_stacks
    return t.has_carry


def test_what_a_scan_stacks_over_its_length_is_named_with_its_line():
    x = jnp.ones((128, 128))  # 64 KiB a step, 4 MiB over 64 steps
    p = preflight.preflight_step(_history, x)
    (t,) = p.scan_stacks
    assert (t.length, t.nbytes, t.outputs, t.shape, t.role) == (
        64, 64 * x.nbytes, 1, (64, 128, 128), "")
    assert "test_preflight.py:" in t.line and "jax.lax.scan(body, x, None" in t.line
    assert "keeps a value for each of its 64 steps, 4.00 MiB stacked" in p.advice
    assert "Return less from the body" in p.advice and "jax.grad" not in p.advice
    last = preflight.preflight_step(lambda x: _history(x)[0], x)  # the stack is not returned
    assert last.scan_stacks == () and "lax.scan" not in last.advice
    xs = jnp.ones((1000, 1000))  # an argument with the dropped stack's shape

    def summed(xs):
        return jax.lax.scan(lambda c, x: (c + jnp.tanh(x).sum(), jnp.tanh(x)), 0.0, xs)[0]

    dropped = preflight.preflight_step(summed, xs)
    assert dropped.scan_stacks == () and "lax.scan" not in dropped.advice


def test_a_gradient_s_forward_scan_is_named_with_the_checkpoint_fix():
    def loss(w, xs):
        def body(c, x):
            return jnp.tanh(c @ w + x), None  # returns nothing: the stack is the residuals
        return jax.lax.scan(body, jnp.zeros((64, 128)), xs)[0].sum()

    w, xs = jnp.ones((128, 128)), jnp.ones((64, 64, 128))
    p = preflight.preflight_step(jax.grad(loss), w, xs)
    assert p.scan_stacks[0].role == "forward" and p.scan_stacks[0].length == 64
    assert "it runs under a derivative" in p.advice and "jax.checkpoint on the body" in p.advice
    small = preflight.preflight_step(jax.grad(loss), w, xs[:4])  # 4 steps: under 1 MiB
    assert small.scan_stacks == () and "lax.scan" not in small.advice


def test_a_device_put_to_another_device_inside_jit_is_named_as_doing_nothing():
    """jax#6040: inside jit a device_put to a Device is ignored; to a sharding it is not."""
    cpu0, cpu1 = jax.devices()[:2]  # the session's simulated CPU devices (conftest)
    x = jnp.ones(1024)

    def moved(x):
        return jax.device_put(x * 2, cpu1) + 1

    assert jax.jit(moved)(x).devices() == {cpu0}  # JAX itself: the value did not move
    p = preflight.preflight_step(moved, x)
    ((where, line),) = p.ignored_device_puts
    assert where == "cpu:1" and "test_preflight.py:" in line and "device_put(x * 2" in line
    assert "jax.device_put(..., cpu:1)" in p.advice and "does nothing inside jit" in p.advice
    assert "runs on cpu:0" in p.advice and "SingleDeviceSharding" in p.advice
    assert p.device == "cpu:0"  # the record names where the step runs, not the device_put's
    sharded = jax.sharding.SingleDeviceSharding(cpu1)
    assert jax.jit(lambda x: jax.device_put(x * 2, sharded))(x).devices() == {cpu1}  # the fix
    in_host = jax.sharding.SingleDeviceSharding(cpu0, memory_kind="pinned_host")
    for kept in (lambda x: jax.device_put(x, cpu0), lambda x: jax.device_put(x, in_host)):
        q = preflight.preflight_step(kept, x)  # where it runs, or another memory: not named
        assert q.ignored_device_puts == () and "does nothing inside jit" not in q.advice


class _FakeGpu:  # a stand-in default device: this machine has no GPU
    platform = "gpu"

    def __str__(self):
        return "cuda:0"


def test_a_step_pinned_to_the_cpu_by_committed_arguments_is_named(monkeypatch):
    """emfdavid/insitubatch#88: a batch committed to the host runs the step there, silently."""
    batch = jax.device_put(jnp.ones((64, 64)), jax.devices("cpu")[1])  # committed to the CPU
    assert preflight.preflight_step(lambda b: b * 2, batch).advice.find("runs on cpu:1") == -1
    monkeypatch.setattr(devices, "default_device", lambda: _FakeGpu())
    p = preflight.preflight_step(lambda b: b * 2, batch)
    assert p.device == "cpu:1" and "where its committed arguments live" in p.device_reason
    assert "This step runs on cpu:1, not on the default device cuda:0" in p.advice
    assert "If cuda:0 was meant, jax.device_put the arguments there" in p.advice
    assert "A loader that yields arrays committed to the CPU" in p.advice
    asked = preflight.preflight_step(lambda b: b * 2, batch, device=jax.devices("cpu")[1])
    assert "not on the default device" not in asked.advice  # the user chose it


@pytest.mark.gpu
def test_gpu_a_closed_over_array_stays_a_constant_and_a_scan_stack_is_seen():
    """The program-text checks behind constant_bytes and scan_stacks, on a GPU's program: a
    kept constant reads as one (notebook 12's 4 MiB on the H100 before the check), a folded
    one does not, and a returned scan stack is found."""
    table = jax.random.normal(jax.random.key(0), (1024, 1024))  # 4 MiB
    x = jnp.ones((1024, 1024))
    assert preflight.preflight_step(lambda a: a + table, x).constant_bytes == table.nbytes
    folded = preflight.preflight_step(lambda p: jax.lax.fori_loop(
        0, 2, lambda i, c: c + table.sum(), 0.0), True)
    assert folded.constant_bytes == 0
    assert preflight.preflight_step(_history, jnp.ones((128, 128))).scan_stacks[0].length == 64


def test_copies_inside_one_argument_are_found_and_identical_layers_are_not():
    """A Flax TrainState holds params and opt_state in one argument; two layers of one shape
    side by side are no copy of each other, and a part of a copy is not named again."""
    from typing import NamedTuple

    class TrainState(NamedTuple):
        step: jax.Array
        params: dict
        opt_state: tuple

    def layer():
        return {"w": jnp.ones((512, 512)), "b": jnp.ones(512)}

    params = {"l1": layer(), "l2": layer()}
    zeros = jax.tree.map(jnp.zeros_like, params)
    adam = ({"count": jnp.zeros((), jnp.int32), "mu": zeros, "nu": dict(zeros)},)
    state = TrainState(jnp.zeros((), jnp.int32), params, adam)
    p = preflight.preflight_step(lambda s, batch: s, state, jnp.ones(8))
    assert [(c.holder, c.path, c.of) for c in p.state_copies] == [
        ("s", ".opt_state[0]['mu']", "s.params"), ("s", ".opt_state[0]['nu']", "s.params")]
    assert "s holds 2 copies of s.params' shapes" in p.advice
    apart = preflight.preflight_step(lambda params, opt_state: params, params, adam)
    assert [c.path for c in apart.state_copies] == ["[0]['mu']", "[0]['nu']"]
    assert preflight.preflight_step(lambda params: params, params).state_copies == ()


def test_a_static_argument_goes_in_as_its_value_and_an_unhashable_one_is_refused():
    """flax#2410: a PRNG key marked static; a NumPy scalar is a good static value."""
    def tiled(x, n):
        return jnp.tile(x, n).sum()

    n = np.int64(4)  # hashable: jit takes it, and so must the kit (not as a shape)
    assert jax.jit(tiled, static_argnums=1)(jnp.ones(3), n) == 12.0
    assert preflight.preflight_step(tiled, jnp.ones(3), n, static_argnums=1).output_bytes == 4
    by_name = preflight.preflight_step(tiled, jnp.ones(3), n=n, static_argnames="n")
    assert by_name.output_bytes == 4
    key = jax.random.key(0)
    with pytest.raises(BadInputError, match="static argument 1 .* cannot be hashed"):
        preflight.preflight_step(lambda s, k: s * 2, jnp.ones(3), key, static_argnums=1)


def test_a_step_over_sharded_arguments_is_sized_per_device():
    """jax#25842's step: arguments split over a mesh are priced as one device's share, as
    jit's own memory_analysis does, unless a device is asked for."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    split = jax.device_put(jnp.ones((4096, 256)),
                           jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    w = jnp.ones((256, 256))  # uncommitted: jit copies it to each device

    def layer(x, w):
        return jnp.tanh(x) @ w

    p = preflight.preflight_step(layer, split, w)
    ma = jax.jit(layer).lower(split, w).compile().memory_analysis()
    assert (p.argument_bytes, p.output_bytes, p.temp_bytes) == (
        ma.argument_size_in_bytes, ma.output_size_in_bytes, ma.temp_size_in_bytes)
    assert p.argument_bytes == split.nbytes // 4 + w.nbytes and p.device == "cpu:0"
    assert "the first of the 4 devices its arguments are placed over" in p.device_reason
    assert p.resident_bytes == split.nbytes // 4  # its shard; w is not yet placed as taken
    y = jnp.ones((4096, 256))  # uncommitted, whole on cpu:0: jit splits it first
    added = preflight.preflight_step(lambda x, y: x + y, split, y)
    assert added.resident_bytes == split.nbytes // 4 and added.needed_bytes > 0
    assert preflight.preflight_step(lambda x: x * 2, split,
                                    device=jax.devices()[1]).resident_bytes == 0  # whole there
    from helpers import measure

    assert measure.measure_step(lambda x: x * 2, split).device == "cpu:0"  # run whole, on one
    assert p.spread_arguments == (("x", 4),) and "Priced whole" not in p.advice
    whole = preflight.preflight_step(layer, split, w, device=jax.devices()[0])
    assert whole.argument_bytes == split.nbytes + w.nbytes
    assert "Priced whole on cpu:0, as asked: arguments are sharded (x over 4 devices)" in (
        whole.advice)
    replicated = jax.device_put(jnp.ones(4), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))  # whole on each device: no share to speak of
    assert preflight.preflight_step(lambda x: x * 2, replicated).spread_arguments == ()


def test_constants_xla_computes_while_compiling_are_counted_and_named():
    """jax#12789, jax#21300: a value made inside jit from no argument is folded into the
    program; the kit's peak counts it as XLA's own peak does, and says how to avoid it."""
    def filled(x):
        return jnp.ones((64, 64, 64)).at[0, 0, 0].set(2.0) * x  # 1 MiB, folded by XLA

    p = preflight.preflight_step(filled, 1.0)
    assert p.constant_bytes == p.folded_bytes == 64 ** 3 * 4
    assert p.peak_bytes == p.xla_peak_bytes  # XLA counts the folded constant too (CPU)
    assert "constants XLA computed while compiling" in p.advice and "closes over" not in p.advice
    assert "'xla_disable_hlo_passes': 'constant_folding'" in p.advice
    unfolded = jax.jit(filled).lower(1.0).compile(
        compiler_options={"xla_disable_hlo_passes": "constant_folding"})  # the fix works
    assert jaxcompat.constant_bytes(unfolded.as_text()) == 0


def test_a_closed_over_constant_xla_keeps_twice_is_still_called_closed_over():
    table = jax.random.normal(jax.random.key(1), (256, 1024))  # 1 MiB

    def twice(x):
        return jax.lax.fori_loop(0, 3, lambda i, c: c + table, x) + table

    p = preflight.preflight_step(twice, jnp.ones((256, 1024)))
    assert p.constant_bytes == 2 * table.nbytes and p.folded_bytes == 0
    assert "closes over" in p.advice and "computed while compiling" not in p.advice


def test_donation_and_gathers_over_a_mesh_are_judged_by_sharding_too():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    rows, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    x = jax.device_put(jnp.ones((2048, 1024)), rows)  # 8 MiB, 2 MiB a device
    same = preflight.preflight_step(lambda x: x * 2, x)
    assert "Nothing donated for x, yet 2.00 MiB" in same.advice  # each device's share

    def replicate(x):
        return jax.lax.with_sharding_constraint(x * 2, whole)

    assert "Nothing donated" not in preflight.preflight_step(replicate, x).advice
    (d,) = preflight.preflight_step(replicate, x, donate_argnums=0).donations
    assert not d.reused and "sharding" in d.why and "another donated argument" not in d.why
    w = jax.device_put(jnp.ones((1024, 1024)), rows)  # FSDP: its gather is by design

    def layer(w, x):
        return jnp.tanh(x @ w) @ w.T

    assert "gathered from its shards" not in preflight.preflight_step(layer, w, x).advice
    unread = preflight.preflight_step(lambda x, w: x * 2, x, w)  # w is never read
    assert unread.dropped_bytes == w.nbytes // 4  # what stays on each device


def test_a_jit_that_declares_its_shardings_is_priced_where_they_place_it():
    """jax.jit(f, in_shardings=...) or out_shardings=... over a mesh, called with arrays
    nothing commits (NumPy, an uncommitted array, shapes): a real call runs, and the kit used
    to refuse it ("incompatible devices", "does not match the sharding"). It is now sized
    as one device's share of the mesh the step's own shardings name (levanter#475, jax#576)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    split = NamedSharding(mesh, P("d"))
    step = jax.jit(lambda x: (x * 2).sum(axis=1), in_shardings=split)
    for x in (np.ones((4096, 64), np.float32), jnp.ones((4096, 64)),
              jax.ShapeDtypeStruct((4096, 64), jnp.float32)):
        p = preflight.preflight_step(step, x)
        assert p.argument_bytes == 4096 * 64 * 4 // 4, type(x)  # one device's quarter
        assert "its own shardings" in p.device_reason and p.device == "cpu:0"
    init = jax.jit(lambda key: jax.random.normal(key, (256, 4096)),
                   out_shardings=NamedSharding(mesh, P(None, "d")))
    q = preflight.preflight_step(init, jax.random.PRNGKey(0))
    assert q.output_bytes == 256 * 4096 * 4 // 4
    assert "4 devices" in q.device_reason
    with pytest.raises(BadInputError, match="fails on these arguments"):  # asked: one device
        preflight.preflight_step(step, jax.device_put(np.ones((4096, 64), np.float32),
                                                      jax.devices()[1]), device="cpu")


def test_xlas_own_peak_below_the_temporaries_is_said_to_leave_them_out():
    """On the CPU, memory_analysis().peak_memory_in_bytes can be far below the temporaries
    (levanter#475's init: 4 MiB against 12 MiB); the row says so. A value of a few bytes is
    not listed as "a large one"."""
    import dataclasses

    from helpers.compiled import Temporary

    p = preflight.preflight_step(lambda x: jnp.tanh(x) * 2, jnp.ones((64, 64)))
    small, big = Temporary("copy", "u32", (4,), 16, ""), Temporary("add", "f32", (512,), 2048, "")
    low = dataclasses.replace(p, xla_peak_bytes=4096, temp_bytes=12 * 2**20,
                              largest_temporaries=(big, small))
    assert "less than the temporaries alone" in str(low)
    assert "a large one: add f32[512]" in str(low) and "copy u32[4]" not in str(low)
    high = dataclasses.replace(low, xla_peak_bytes=13 * 2**20)
    assert "less than the temporaries alone" not in str(high)
    # a value larger than all the temporaries is written as an output (jax#824's gradient)
    out = dataclasses.replace(low, temp_bytes=1024)
    assert "a large output: add f32[512]" in str(out) and "a large one" not in str(out)
    lines = str(out).splitlines()  # under the outputs, not under the smaller temporaries (a trial)
    at = next(i for i, x in enumerate(lines) if "a large output" in x)
    assert lines[at - 1].lstrip().startswith("outputs:"), lines[at - 1]


def test_random_numbers_drawn_whole_on_each_device_name_the_partitionable_flag():
    """levanter#475: an init jitted with out_shardings still made every device draw the whole
    array's random bits while jax_threefry_partitionable was off (the thread's fix)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
    init = jax.jit(lambda key: jax.random.normal(key, (1024, 1024)),
                   out_shardings=NamedSharding(mesh, P(None, "model")))
    assert jax.config.jax_threefry_partitionable  # JAX's default
    on = preflight.preflight_step(init, jax.random.PRNGKey(0))
    assert "jax_threefry_partitionable" not in on.advice
    scale = jax.jit(lambda key, x: x * jax.random.normal(key, (8,)).sum(),  # a small draw
                    out_shardings=NamedSharding(mesh, P(None, "model")))
    jax.config.update("jax_threefry_partitionable", False)
    try:
        off = preflight.preflight_step(init, jax.random.PRNGKey(0))
        small = preflight.preflight_step(scale, jax.random.PRNGKey(0), jnp.ones((256, 1024)))
    finally:
        jax.config.update("jax_threefry_partitionable", True)
    assert "jax_threefry_partitionable" not in small.advice  # 32 B of bits: nothing to say
    assert off.temp_bytes > 2 * on.temp_bytes  # the whole array's bits on each device
    assert "jax.config.update('jax_threefry_partitionable', True)" in off.advice


def test_a_where_on_a_line_that_calls_a_function_named_second_is_no_cond():
    """The cond note reads the line for a call of cond, not for the letters (second()): a
    vmapped jnp.where is a select too, and its branches are not 'both run' by a cond."""
    import dataclasses

    from helpers.compiled import Temporary

    p = preflight.preflight_step(jax.vmap(lambda x: jnp.tanh(jnp.outer(x, x)).sum()),
                                 jnp.ones((64, 256)))
    t = Temporary("select_n", "f32", (64, 256, 256), 16 * 2**20,
                  "cell, line 3: h = jnp.where(x > 0, second(x), x)", batched=True)
    note = program_notes.batched_note(t)
    assert "lax.cond" not in note and "jax.lax.map(f, xs, batch_size=k)" in note
    cond = dataclasses.replace(t, line="cell, line 3: return jax.lax.cond(p, f, g, x)",
                               in_derivative=True)
    note = program_notes.batched_note(cond)
    assert "both branches run" in note and "jax.lax.map(jax.checkpoint(f), xs) under" in note
    assert p.verdict == "fits"


def _temp_bytes(fn, *args) -> int:
    """XLA's temporaries for fn on these arguments (memory_analysis)."""
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_flax_1852_per_example_gradients_averaged_get_the_scan_that_sums_chunks():
    """google/flax#1852: vmap(grad) stacks one gradient per example, then the step averages
    them. lax.map(f, xs, batch_size=k) would stack f's outputs all the same (the kit advised it:
    274 -> 290 MB); a scan that adds each chunk's sum into its carry keeps one chunk."""
    b, d, k = 64, 256, 8
    w = jnp.ones((d, d)) * 0.01
    xs = jnp.linspace(-1.0, 1.0, b * d).reshape(b, d)

    def clipped(w, x):  # DP-SGD: each example's gradient clipped to norm 1
        g = jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)
        return g * jnp.minimum(1.0, 1.0 / jnp.sqrt(jnp.sum(g**2)))

    def step(w, xs):  # per-example gradients, averaged
        return jax.vmap(clipped, in_axes=(None, 0))(w, xs).mean(0)

    def mapped(w, xs):  # what the kit used to advise
        return jax.lax.map(lambda x: clipped(w, x), xs, batch_size=k).mean(0)

    def summed(w, xs):  # the fix it names: the chunk's sum into the carry
        def body(acc, chunk):
            return acc + jax.vmap(clipped, in_axes=(None, 0))(w, chunk).sum(0), None
        return jax.lax.scan(body, jnp.zeros_like(w), xs.reshape(b // k, k, d))[0] / b

    p = preflight.preflight_step(step, w, xs)
    assert "the step then sums the vmap's outputs over the batch" in p.advice
    assert "jax.lax.scan over xs.reshape(n // k, k, ...)" in p.advice
    assert "added to the carry" in p.advice and "google/flax#1852" in p.advice
    assert "such values shrink in proportion" not in p.advice
    before, stacked, after = (_temp_bytes(f, w, xs) for f in (step, mapped, summed))
    assert before >= b * d * d * 4 and stacked * 10 >= before * 9  # lax.map: no better
    assert after * 3 <= before  # 16 MiB -> 4 MiB (0.10.2): a chunk of 8 and the carry
    np.testing.assert_allclose(summed(w, xs), step(w, xs), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mapped(w, xs), step(w, xs), rtol=1e-4, atol=1e-6)


def test_flax_1852_a_sum_inside_the_vmap_keeps_the_lax_map_fix():
    """A value reduced inside the vmapped function (jax-ml/jax#11319's per-point sum) is no
    per-example output summed afterwards: lax.map with a batch size shrinks it, as said. A
    logsumexp, whose max and sum both read the value: XLA 0.11's CPU runs a plain
    jnp.exp(jnp.sin(grid * q)).sum() as one YNNPACK fusion with no temporaries in its plan
    (32 MiB on jax 0.8.0 and 0.10.2, 0 B on 0.11.2); this one keeps 32 MiB on all three."""
    grid = jnp.linspace(0.0, 1.0, 1024 * 16).reshape(1024, 16)

    def step(pts):
        return jax.vmap(lambda q: jax.nn.logsumexp(jnp.sin(grid * q)))(pts)

    p = preflight.preflight_step(step, jnp.linspace(0.0, 1.0, 512))
    assert p.temp_bytes >= 32 * MiB
    assert "jax.lax.map(f, xs, batch_size=k) computes k elements at a time" in p.advice
    assert "jax.lax.scan over xs.reshape" not in p.advice


def test_jax_3103_a_vmapped_cond_broadcasting_its_constant_is_named_with_lax_map():
    """jax-ml/jax#3103 with #7159: a vmapped lax.cond with a batched predicate is a select,
    both branches run, and the closed-over W is broadcast to the batch (the largest value is
    that broadcast, not a select_n). lax.map(f, xs) without batch_size runs only the branch
    taken (the helper's run: 1.08 GB -> 0.27 MB)."""
    w = jnp.ones((128, 128)) * 0.001

    def expensive(x):
        for _ in range(5):
            x = jnp.tanh(w @ x)
        return x.sum()

    def f(x):
        return jax.lax.cond(x[0] > 0, expensive, lambda x: 0.0, x)

    xs = jnp.linspace(-1.0, 1.0, 1024 * 128).reshape(1024, 128)
    p = preflight.preflight_step(lambda xs: jax.vmap(f)(xs), xs)
    assert "A lax.cond whose predicate jax.vmap batches becomes a select" in p.advice
    assert "arrays the branches close over included, are broadcast" in p.advice
    assert "without batch_size, jax.lax.map keeps the predicate unbatched" in p.advice
    assert "jax.lax.map(f, xs, batch_size=k)" in p.advice and "jax-ml/jax#3103" in p.advice
    before = _temp_bytes(lambda xs: jax.vmap(f)(xs), xs)
    after = _temp_bytes(lambda xs: jax.lax.map(f, xs), xs)
    assert before >= 1024 * 128 * 128 * 4 and after * 64 <= before
    np.testing.assert_allclose(jax.lax.map(f, xs), jax.vmap(f)(xs), rtol=1e-5, atol=1e-6)


def test_jax_3103_a_cond_whose_predicate_vmap_leaves_alone_is_no_select():
    """A cond on a line whose predicate is not batched stays a cond under vmap (the jaxpr keeps
    it): its batched values are not 'both branches run'."""
    import dataclasses

    from helpers.compiled import Temporary

    t = Temporary("dot_general", "f32", (64, 256, 256), 16 * 2**20,
                  "cell, line 3: return jax.lax.cond(flag, lambda x: w @ x, g, x)", batched=True)
    assert "both branches run" in program_notes.batched_note(t)
    kept = program_notes.batched_note(t, kept_cond=True)
    assert "both branches run" not in kept and "batch_size=k" in kept
    assert "both branches run" not in program_notes.batched_note(
        dataclasses.replace(t, line="cell, line 3: h = second(x)"))


def test_jax_7199_a_rare_costly_branch_of_a_vmapped_cond_is_named_with_lax_map():
    """jax-ml/jax#7199: a cond under vmap, its costly branch taken by one element in 256, ran
    for all of them. The largest value is made inside the branch, on a line that calls no
    cond, so the select note was missed (a new user's trial). It now names the cond's line
    and lax.map(f, xs) without batch_size, which runs only the branch taken (the helper's run:
    16.1 MiB -> 0.06 MiB). A cond whose predicate vmap leaves alone gets no such note."""
    def expensive(x):
        m = jnp.tanh(jnp.outer(x, x))
        return m @ x

    def f(x):
        return jax.lax.cond(jnp.linalg.norm(x) > 10.0, expensive, lambda x: x * 2.0, x)

    xs = (jnp.ones((256, 128)) * 0.05).at[3].multiply(100.0)
    p = preflight.preflight_step(jax.vmap(f), xs)
    assert "It is made in a branch of the lax.cond at" in p.advice
    assert "jax.lax.cond(jnp.linalg.norm(x) > 10.0" in p.advice
    assert "jax.lax.map(f, xs) without batch_size keeps the predicate unbatched" in p.advice
    assert "sequential_vmap" in p.advice and "jax-ml/jax#7199" in p.advice
    before = _temp_bytes(jax.vmap(f), xs)
    after = _temp_bytes(lambda xs: jax.lax.map(f, xs), xs)
    seq = _temp_bytes(jax.vmap(jax.custom_batching.sequential_vmap(f)), xs)
    assert before >= 256 * 128 * 128 * 4 and after * 64 <= before and seq * 64 <= before
    np.testing.assert_allclose(jax.lax.map(f, xs), jax.vmap(f)(xs), rtol=1e-5, atol=1e-5)
    flag = jnp.array(True)  # a predicate vmap does not batch: the cond stays, no select

    def g(x):
        return jax.lax.cond(flag, expensive, lambda x: x * 2.0, x)

    kept = preflight.preflight_step(jax.vmap(g), xs)
    assert "a branch of the lax.cond" not in kept.advice
    from helpers._internal import jaxpr_products

    def features(x):  # the cond's operand, made after the predicate on the cond's line
        return jnp.tanh(jnp.outer(x, x)).sum(0)

    def h(x):
        return jax.lax.cond(jnp.linalg.norm(x) > 10.0, expensive, lambda x: x * 2.0, features(x))

    found = jaxpr_products.selected_branches(jax.jit(jax.vmap(h)).trace(xs).jaxpr)
    assert any("m = jnp.tanh(jnp.outer(x, x))" in line for line in found)
    assert not any("sum(0)" in line for line in found)  # an operand, not a branch (a review)

    def stopped(x):  # the operand through a stop_gradient of its own: guards nest two deep
        return jax.lax.cond(jnp.linalg.norm(x) > 10.0, expensive, lambda x: x * 2.0,
                            jax.lax.stop_gradient(features(x)))

    found = jaxpr_products.selected_branches(jax.jit(jax.vmap(stopped)).trace(xs).jaxpr)
    assert found and not any("sum(0)" in line for line in found)


def test_olmax_25_a_python_loop_over_chunks_under_grad_is_named_with_a_checkpointed_scan():
    """HomebrewML/Olmax#25: a cross-entropy computed over chunks of the logits in a Python
    loop, to save memory, saved little under jax.grad ("Jax parallelises for loops like this";
    use lax.scan). The kit listed three chunk values and said nothing (a new user's trial).
    It now names the unrolled loop and lax.scan with jax.checkpoint, run here: the gradient
    is the same and the temporaries a quarter or less. A loop without a derivative, no note."""
    n, d, v, k = 512, 64, 4096, 64
    w = jnp.ones((d, v)) * 0.01
    x = jnp.linspace(-1.0, 1.0, n * d).reshape(n, d)
    labels = jnp.arange(n) % v

    def loop(w, x, labels):
        total = 0.0
        for i in range(0, n, k):
            logits = x[i:i + k] @ w
            total += jnp.sum(jax.nn.one_hot(labels[i:i + k], v) * jax.nn.log_softmax(logits))
        return -total / n

    def chunk(w, xc, lc):
        lp = jax.nn.log_softmax(xc @ w)
        return jnp.sum(jnp.take_along_axis(lp, lc[:, None], -1))

    def scanned(w, x, labels):
        body = jax.checkpoint(chunk)
        total, _ = jax.lax.scan(lambda c, xs: (c + body(w, *xs), None), 0.0,
                                (x.reshape(n // k, k, d), labels.reshape(n // k, k)))
        return -total / n

    p = preflight.preflight_step(jax.grad(loop), w, x, labels)
    assert "is made by a line that ran 8 times in this program: a Python loop" in p.advice
    assert "jax.lax.scan over the iterations" in p.advice and "jax.checkpoint" in p.advice
    assert "HomebrewML/Olmax#25" in p.advice
    # (jax 0.8.0 makes 16 of one equation in this loop of 8, two per call: all alike)
    assert "operand shapes changing" not in p.advice
    before = _temp_bytes(jax.grad(loop), w, x, labels)
    after = _temp_bytes(jax.grad(scanned), w, x, labels)
    assert after * 4 <= before
    np.testing.assert_allclose(jax.grad(scanned)(w, x, labels), jax.grad(loop)(w, x, labels),
                               rtol=1e-4, atol=1e-7)
    forward = preflight.preflight_step(loop, w, x, labels)
    assert "a Python loop, which jit unrolls" not in forward.advice
    # a loop over layers cuts no input into chunks: there a checkpointed scan raised XLA's
    # plan (14 -> 20 MiB for 6 layers of 512, jax 0.10.2), so no such note
    layers = [jnp.ones((256, 256)) * 0.01 for _ in range(6)]

    def mlp(ws, h):
        for w_ in ws:
            h = jnp.tanh(h @ w_)
        return h.sum()

    deep = preflight.preflight_step(jax.grad(mlp), layers, jnp.ones((1024, 256)))
    assert "a Python loop, which jit unrolls" not in deep.advice
    # nor a loop over the rows of a stack, layers' weights W[i] or an RNN's time steps x[t]: one
    # row each, no chunk (the note fired on these; a review measured its fix raising the plan)
    stacked = jnp.ones((8, 256, 256)) * 0.01

    def stack_mlp(w, h):
        for i in range(w.shape[0]):
            h = jnp.tanh(h @ w[i])
        return h.sum()

    def rnn(w, xs):
        h = jnp.zeros((xs.shape[1], w.shape[0]))
        for t in range(xs.shape[0]):
            h = jnp.tanh(h @ w + xs[t])
        return h.sum()

    for step, args in ((stack_mlp, (stacked, jnp.ones((1024, 256)))),
                       (rnn, (layers[0], jnp.ones((16, 512, 256))))):
        assert jaxpr_loops.chunked_inputs(jax.jit(jax.grad(step)).trace(*args).jaxpr) == 0
        assert "a Python loop, which jit unrolls" not in \
            preflight.preflight_step(jax.grad(step), *args).advice
    assert jaxpr_loops.chunked_inputs(jax.jit(jax.grad(loop)).trace(w, x, labels).jaxpr) == 8


def test_jax_23358_a_constant_index_with_a_batched_value_names_the_update_value():
    """jax-ml/jax#23358's variant k: x.at[9].set(i) under vmap over i. The index is a constant
    and the update value is batched: the note said 'whose index jax.vmap batches'. The
    scatter's batching dimensions say which; the fix (x.sum() - x[9] + v) runs with no
    temporaries and the same values."""
    from helpers._internal import (
        jaxpr_products,
    )

    x = jnp.zeros(2048)

    def run(vs):
        return jax.vmap(lambda v: x.at[9].set(v).sum())(vs)

    def by_index(ids):
        return jax.vmap(lambda i: x.at[i].set(7.0).sum())(ids)

    def fixed(vs):
        return jax.vmap(lambda v: x.sum() - x[9] + v)(vs)

    vs, ids = jnp.linspace(0.0, 1.0, 2048), jnp.arange(2048)
    assert set(jaxpr_products.scatters_batched(jax.jit(run).trace(vs).jaxpr).values()) == {
        "update value"}
    assert set(jaxpr_products.scatters_batched(
        jax.jit(by_index).trace(ids).jaxpr).values()) == {"index"}
    p = preflight.preflight_step(run, vs)
    if max(t.nbytes for t in p.largest_temporaries) >= 2048 * 2048 * 4:  # 0.8.0 fuses it
        assert "An .at[...] update whose update value jax.vmap batches" in p.advice
    assert "whose index jax.vmap batches" not in p.advice
    assert _temp_bytes(fixed, vs) == 0
    np.testing.assert_allclose(fixed(vs), run(vs))


class _FilterJit:
    """A stand-in for eqx.filter_jit: its own lower() takes anything that is not an array as
    static, so a ShapeDtypeStruct reaches the function as a Python object and fails there;
    its Lowered wraps JAX's (``.lowered``), as equinox's does."""

    def __init__(self, fn):
        self.fn = fn

    def lower(self, *args):
        import types

        if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(args)):
            raise TypeError("unsupported operand type(s) for -: 'ShapeDtypeStruct' and 'ArrayImpl'")
        return types.SimpleNamespace(lowered=jax.jit(self.fn).lower(*args))

    def __call__(self, *args):
        return jax.jit(self.fn)(*args)


def test_a_wrapper_s_own_lower_that_takes_no_shapes_is_given_the_arrays():
    """equinox#746's thread: preflight_step failed on every eqx.filter_jit step, blaming the
    user's function ('fails on these arguments ... ShapeDtypeStruct'). Lowering with the
    arrays themselves copies and runs nothing."""
    step = _FilterJit(lambda w, x: jnp.tanh(x @ w).sum())
    w, x = jnp.ones((256, 256)), jnp.ones((512, 256))
    p = preflight.preflight_step(step, w, x)
    assert p.argument_bytes == w.nbytes + x.nbytes and p.verdict == "fits"
    assert "own lower()" in p.device_reason and "given the arrays themselves" in p.device_reason
    with pytest.raises(BadInputError, match="whose own lower\\(\\) takes no shapes"):
        measure.measure_step(step, w, x)  # measure runs jax.jit's executable: it says how


def test_a_bfloat16_value_multiplied_by_zero_is_listed_as_a_float32_one_is():
    # bfloat16 is no floating type to NumPy's issubdtype: the kit asks JAX's
    w = jnp.full((256, 256), 0.5, jnp.bfloat16)

    def step(w, x):
        return w + 0.0 * jnp.tanh(w @ x)

    for dtype in (jnp.bfloat16, jnp.float32):
        c = preflight.preflight_step(step, w.astype(dtype), jnp.ones((256, 256), dtype))
        assert [z[0] for z in c.scaled_by_zero] == [f"{jnp.dtype(dtype).name}[256, 256]"], dtype


def test_a_device_put_to_a_split_sharding_inside_jit_on_an_auto_mesh_is_named_as_not_split():
    """On a Mesh(...) of Auto axes, jax.device_put(x, NamedSharding(mesh, P('x'))) inside jit
    lowers no sharding: the value comes back whole on every device (found by a helper putting
    sharding threads to the kit)."""
    from jax.sharding import AxisType, Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    s = NamedSharding(mesh, P("x"))
    x = jnp.ones(64)

    def put(x):
        return jax.device_put(x * 2, s)

    assert jax.jit(put)(x).sharding.is_fully_replicated  # what the note says
    p = preflight.preflight_step(put, x)
    ((spec, line),) = p.unsplit_sharding_puts
    assert spec in ("P('x',)", "PartitionSpec('x',)") and "jax.device_put(x * 2, s)" in line
    assert "does not split the value" in p.advice and "with_sharding_constraint" in p.advice

    def constrained(x):  # the fix the note gives
        return jax.lax.with_sharding_constraint(x * 2, s)

    assert not jax.jit(constrained)(x).sharding.is_fully_replicated
    assert preflight.preflight_step(constrained, x).unsplit_sharding_puts == ()
    split_in = jax.device_put(x, s)  # already split: the program returns it split (checked)
    assert not jax.jit(put)(split_in).sharding.is_fully_replicated
    assert preflight.preflight_step(put, split_in).unsplit_sharding_puts == ()
    explicit = NamedSharding(jax.make_mesh((len(jax.devices()),), ("x",),
                                           axis_types=(AxisType.Explicit,)), P("x"))
    for fine in (lambda x: jax.device_put(x * 2, explicit),
                 lambda x: jax.device_put(x * 2, NamedSharding(mesh, P()))):
        assert preflight.preflight_step(fine, x).unsplit_sharding_puts == ()


def test_an_array_passed_as_two_arguments_is_named_as_the_same_arrays_in_the_split():
    x = jnp.ones((256, 256))
    p = preflight.preflight_step(lambda a, b: a + b, x, x)
    assert p.argument_split == (("a", x.nbytes), ("b (the same arrays as a)", 0))
    assert p.argument_bytes == 2 * x.nbytes  # XLA's size counts the buffer once per argument
    assert "b (the same arrays as a)" in str(p)
    scalar = preflight.preflight_step(lambda a, s: a * s, x, 2.0)
    # no array, nothing shared; a Python number is a scalar argument of its own (f32: 4 B)
    assert scalar.argument_split == (("a", x.nbytes), ("s", 4))


def test_gradients_of_scanned_layers_are_gradients_and_a_scan_s_carry_is_no_narrowed_input():
    """A review found both: output kinds followed a scan into its body, where the name stack
    no longer says transpose (so 'donate the parameters' came back for scanned layers), and a
    float32 carry read in the body through a cast was called a narrowed input, whose fix
    (store it as bfloat16) breaks the scan's carry types."""
    w = jnp.full((8, 256, 256), 0.01)
    x = jnp.ones((16, 256))

    def loss(w, x):
        h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
        return h.sum()

    p = preflight.preflight_step(jax.grad(loss), w, x)
    assert [kind for _, _, kind in compiled.compile_step(jax.grad(loss), w, x).outputs()] \
        == ["gradient"]
    assert "Nothing donated" not in p.advice

    def rnn(h0, xs):
        def body(h, x):
            h = jnp.tanh(h.astype(jnp.bfloat16) @ x).astype(jnp.float32)
            return h, None
        return jax.lax.scan(body, h0, xs)[0]

    r = preflight.preflight_step(rnn, jnp.ones((512, 512)), jnp.ones((4, 512, 512), jnp.bfloat16))
    assert r.narrowed_arguments == ()

    def scanned(w, x):  # stacked float32 layers, each read as bfloat16: still named
        def body(h, wi):
            return jnp.tanh(h @ wi.astype(jnp.bfloat16)), None
        return jax.lax.scan(body, x, w)[0]

    s = preflight.preflight_step(scanned, w, x.astype(jnp.bfloat16))
    assert [(n.argument, n.read_as) for n in s.narrowed_arguments] == [("w", "bfloat16")]


def test_a_narrowed_batch_gets_the_data_note_and_a_narrowed_weight_the_parameter_note():
    """By the argument's name where it says: a dict batch is data, a single matrix w is a
    parameter (a review found the parameter advice, model.to_bf16(batch), for a batch)."""
    batch = {"image": jnp.ones((2048, 1024))}
    w = jnp.ones((1024, 2048))  # each 8 MiB: well over an eighth of the peak on 0.8.0 too

    def forward(w, batch):
        return (batch["image"].astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).sum()

    p = preflight.preflight_step(forward, w, batch)
    data = p.advice.split("batch['image'] (8.00 MiB, float32) is read only as bfloat16")[1]
    assert data.split(". ")[0].count("made or loaded as bfloat16") == 1
    assert "model.to_bf16(batch)" not in p.advice
    assert "w (8.00 MiB, float32) is read only as bfloat16" in p.advice
    assert "master weights" in p.advice


def test_a_buffer_a_loop_reads_back_is_no_record_of_its_steps():
    """A KV cache is written a row per step too, but the body reads it: memory the loop needs,
    not a record kept for later (the gemma#534 note stays out)."""
    def decode(x):
        def body(i, cache):
            seen = (cache * x[:, None]).sum()  # attention reads the cache
            return cache.at[:, i].set(x * seen)
        return jax.lax.fori_loop(0, 64, body, jnp.zeros((4, 64, 2048)))

    p = preflight.preflight_step(decode, jnp.ones((4, 2048)))
    assert p.loop_records == () and "gemma#534" not in p.advice


def test_a_small_jacobian_beside_the_user_s_own_vmap_does_not_rename_that_vmap():
    """The basis note (jax#787) is for values traced inside jax.jacfwd or jax.jacrev: a 2x2
    Jacobian elsewhere in the step, whose 2 divides the user's batch of 256, is no cause."""
    def step(w, xs, theta):
        h = jax.vmap(lambda x: jnp.tanh(w @ x))(xs)  # the user's own vmap
        jac = jax.jacfwd(lambda t: jnp.stack([jnp.sin(t[0]) * t[1], t[0] ** 2]))(theta)
        return (h @ h.T).sum() + jac.sum()

    p = preflight.preflight_step(step, jnp.ones((1024, 1024)) * 1e-3, jnp.ones((256, 1024)),
                                 jnp.ones(2))
    assert "basis vectors" not in p.advice and "under jax.vmap" in p.advice


def test_the_chunk_recipe_divides_the_loop_or_names_the_steps_left_over():
    assert program_notes.chunk_size(256) == 16 and program_notes.chunk_size(300) in (15, 20)
    assert "reshape(20, 15" in program_notes.chunks_fix(300) or "reshape(15, 20" in (
        program_notes.chunks_fix(300))
    assert "on their own" not in program_notes.chunks_fix(300)  # 300 steps divide: none left
    prime = program_notes.chunks_fix(257)  # a prime: 16 chunks of 16, then one step
    assert "xs[:256].reshape(16, 16" in prime and "Then run the last step" in prime


def test_a_body_only_partly_checkpointed_is_told_to_checkpoint_the_whole_body():
    w = jnp.eye(256) * 0.5

    def loss(x):
        def body(c, _):
            h = jax.checkpoint(lambda c: jnp.tanh(c @ w))(c)  # only the first half
            return jnp.tanh(jnp.sin(h) * jnp.cos(h) @ w), None
        return jax.lax.scan(body, x, None, length=256)[0].sum()

    r = preflight.residuals(loss, jnp.ones((4, 256)))
    assert "Part of its body is under jax.checkpoint" in r.advice
    assert "around the whole body" in r.advice and "already" not in r.advice


def test_a_checkpointed_layer_with_a_scan_of_its_own_is_no_chunk_of_the_outer_loop():
    def loss(ws, x):
        def layer(h, w):  # a layer that runs an RNN over the sequence: its own inner scan
            return jax.lax.scan(lambda c, xt: (jnp.tanh(c @ w + xt),) * 2,
                                jnp.zeros((4, 64)), h)[1], None
        return jax.lax.scan(jax.checkpoint(layer), x, ws)[0].sum()

    r = preflight.residuals(loss, jnp.ones((64, 64, 64)) * 0.01, jnp.ones((16, 4, 64)))
    assert "chunk of steps already" not in r.advice
    assert "under jax.checkpoint already" in r.advice


def test_each_argument_s_bytes_add_up_to_xla_s_share_of_one_device_over_a_mesh():
    """Over a mesh XLA's argument size is one device's share; the split by argument counted
    whole arrays beneath it and added up to four times as much."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    s = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), PartitionSpec("d"))
    y, table = (jax.device_put(jnp.ones((1024, 256)), s) for _ in range(2))
    p = preflight.preflight_step(lambda y, table: (y * table).sum(), y, table)
    assert sum(b for _, b in p.argument_split) == p.argument_bytes == 2 * y.nbytes // 4
    whole = preflight.preflight_step(lambda y, table: (y * table).sum(), y, table,
                                     device=jax.devices()[0])
    assert sum(b for _, b in whole.argument_split) == 2 * y.nbytes  # priced whole, as asked


# --- residuals a jax.checkpoint policy offloads to host memory -----------------------------------
def _offload_block(saved, offloaded):
    """jax-ml/jax#20015's block: two named activations of float32[256, 128] (128 KiB each)."""
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved, names_which_can_be_offloaded=offloaded,
        offload_src="device", offload_dst="pinned_host")

    def block(w, x):
        h = checkpoint_name(jnp.sin(x @ w), "x")
        h = checkpoint_name(jnp.sin(h @ w), "y")
        return jnp.sin(h @ w)

    return lambda w, x: jnp.sum(jax.checkpoint(block, policy=policy)(w, x))


def test_jax_20015_residuals_offloaded_by_a_policy_are_counted_in_host_memory():
    """JAX lists offloaded residuals as float32<host>[...]; the kit counted them as kept on the
    device, ranked offloading worse than saving (256 KiB against 128 KiB) and advised the
    jax.checkpoint the user had written."""
    w, x = jnp.ones((128, 128)) * 0.01, jnp.ones((256, 128))
    act = 256 * 128 * 4
    off = preflight.residuals(_offload_block([], ["x", "y"]), w, x)
    saved = preflight.residuals(_offload_block(["x"], []), w, x)
    assert (off.saved_bytes, off.offloaded_bytes, off.offloaded_to) == (0, 2 * act, "pinned_host")
    assert (saved.saved_bytes, saved.offloaded_bytes) == (act, 0)
    assert off.saved_bytes < saved.saved_bytes  # the ranking the device sees
    assert [r.memory for r in off.residuals if not r.is_argument] == ["pinned_host"] * 2
    assert off.advice.startswith("256.00 KiB kept in pinned_host (offloaded by your policy: "
                                 "'x', 'y'), 0 B in device memory.")
    assert "jax.checkpoint on the largest layer" not in off.advice
    assert "in pinned_host (offloaded by your policy)" in str(off)
    assert "[offloaded to pinned_host]" in str(off) and "in pinned_host" not in str(saved)
    # the fact the kit reads is JAX's own: the aval's memory space is Host
    listed = jaxcompat.verify("saved_residuals")(_offload_block([], ["x", "y"]), w, x)
    assert sum("<host>" in str(a) for a, _ in listed) == 2
    # the CPU drops the placement when it compiles: offloading both is saving both there, and
    # no saving shows (the note says so). 720,896 B of temporaries for both on jax 0.8.0 and
    # 0.10.2, as for saving 'x' alone; 851,968 on 0.11.2, whose XLA plans saving one (786,432)
    # apart from saving two
    temps = {jax.jit(jax.grad(_offload_block(s, o))).lower(w, x).compile()
             .memory_analysis().temp_size_in_bytes
             for s, o in (([], ["x", "y"]), (["x", "y"], []))}
    assert len(temps) == 1 and "CPU show no saving" in off.advice
    assert np.allclose(jax.grad(_offload_block([], ["x", "y"]))(w, x),
                       jax.grad(_offload_block([], []))(w, x))


# jax-ml/jax#23869: offloading a name on a scanned block's OUTPUT offloads nothing
_L, _B, _W = 8, 256, 128  # 8 layers, 128 KiB activations: the stacked carry is 1 MiB


def _layers(offloaded, name_input=False):
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=offloaded,
        offload_src="device", offload_dst="pinned_host")

    def block(x, w):
        if name_input:  # the fix: name the layer's input inside the checkpointed body
            x = checkpoint_name(x, "layer_input")
        h = checkpoint_name(jnp.maximum(x @ w, 0.0), "hidden")
        return checkpoint_name(x + h @ w, "residual"), None

    def loss(ws, x):
        return jnp.sum(jax.lax.scan(jax.remat(block, policy=policy), x, ws)[0])

    return loss


def test_jax_23869_offloading_a_scanned_block_s_output_names_the_carry_and_the_fix():
    ws, x = jnp.ones((_L, _W, _W)) * 1e-3, jnp.ones((_B, _W))
    stack = _L * _B * _W * 4
    thread = preflight.residuals(_layers(["residual"]), ws, x)
    assert (thread.saved_bytes, thread.offloaded_bytes) == (stack, 0)  # nothing offloaded
    for words in ("1.00 MiB of the 1.00 MiB kept in device memory is the carry of the "
                  "lax.scan (test_preflight.py:", f"stacked over its {_L} steps",
                  "float32[8, 256, 128]", "which JAX keeps whatever the policy says",
                  "your policy offloads 'residual', the body's output",
                  "nothing is offloaded for it (jax-ml/jax#23869)",
                  "x = checkpoint_name(x, 'layer_input')", "goes to pinned_host"):
        assert words in thread.advice, words
    hidden = preflight.residuals(_layers(["hidden"]), ws, x)  # 1 MiB offloaded, 1 MiB left
    assert (hidden.saved_bytes, hidden.offloaded_bytes) == (stack, stack)
    assert "jax-ml/jax#23869" in hidden.advice and "'residual'" not in hidden.advice
    assert hidden.advice.startswith("1.00 MiB kept in pinned_host (offloaded by your policy: "
                                    "'hidden'), 1.00 MiB in device memory.")
    plain = preflight.residuals(_layers([]), ws, x)  # no offload policy: the chunk advice
    assert "#23869" not in plain.advice and "chunks of" in plain.advice
    # the fix, run: the stacked carry goes to host memory, the gradient is the same
    for offloaded in (["layer_input"], ["layer_input", "hidden"]):
        fixed = preflight.residuals(_layers(offloaded, name_input=True), ws, x)
        assert fixed.saved_bytes == 0 and "#23869" not in fixed.advice
        assert [(r.shape, r.memory) for r in fixed.residuals if not r.is_argument][0] == \
            ((_L, _B, _W), "pinned_host")
        assert np.allclose(jax.grad(_layers(offloaded, name_input=True))(ws, x),
                           jax.grad(_layers([]))(ws, x))


# openxla/xla#49131: sum over j of f(x_i, y_j), written as a broadcast then a reduction
_P = 512  # M = N = 512: one float32[512, 512, 3] is 3 MiB


def _nbody(x, y, m):
    r = x[:, None, :] - y[None, :, :]
    d = jnp.sqrt((r ** 2).sum(-1) + 1e-3)
    return (m[None, :, None] * r / d[..., None] ** 3).sum(1)


def _nbody_loss(x, y, m):
    return _nbody(x, y, m).sum()


def _nbody_in_chunks(x, y, m):  # the fix the kit names: 32 checkpointed chunks of 16 of y
    def body(acc, c):
        return acc + jax.checkpoint(_nbody)(x, *c), None
    chunks = (y.reshape(32, 16, 3), m.reshape(32, 16))
    return jax.lax.scan(body, jnp.zeros_like(x), chunks)[0].sum()


def _rbf_loss(x, y, w):
    return (w[None, :] * jnp.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / 2)).sum()


def _temp(fn, *args):
    return jax.jit(jax.grad(fn)).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_xla_49131_a_pairwise_broadcast_then_reduced_is_told_to_sum_over_chunks():
    """The kit advised "jax.checkpoint on the largest layer", which raised XLA's temporaries
    for the gradient (192 -> 240 MiB at M = N = 2048 on jax 0.10.2). Where XLA fuses the pairs
    away (jax 0.12.0.1 on the CPU: 0 B of temporaries, 13 MiB listed), the note says nothing
    needs changing, as for the RBF kernel below."""
    x, y = (jax.random.normal(jax.random.PRNGKey(i), (_P, 3)) for i in (0, 1))
    m = jnp.ones(_P)
    r = preflight.residuals(_nbody_loss, x, y, m)
    plain = _temp(_nbody_loss, x, y, m)
    head = ("values over every pair of two inputs' rows (the largest float32[512, 512, 3])",
            "made by broadcasting them against each other (test_preflight.py:",
            "reduced over 512 (test_preflight.py:", ".sum(1)", "openxla/xla#49131")
    if 2 * plain < r.saved_bytes:  # jax 0.12.0.1's XLA:CPU fuses the whole gradient (0 B)
        for words in (*head, f"XLA's compiled jax.grad(_nbody_loss) holds only "
                      f"{format_bytes(plain)} of temporaries", "nothing needs changing"):
            assert words in r.advice, words
        assert "lax.scan" not in r.advice
        return
    for words in (*head, f"XLA's compiled jax.grad(_nbody_loss) holds {plain / MiB:.2f} MiB",
                  "jax.checkpoint around it keeps none of them",
                  "a lax.scan over 32 chunks of 16 of y (the reduced axis)",
                  "y.reshape(32, 16, ...)"):
        assert words in r.advice, words
    assert "on the largest layer" not in r.advice
    # measured: a bare jax.checkpoint does not shrink it; the chunks do, with the same gradient
    whole = _temp(lambda x, y, m: jax.checkpoint(_nbody)(x, y, m).sum(), x, y, m)
    chunked = _temp(_nbody_in_chunks, x, y, m)
    assert whole > 0.8 * plain and chunked * 20 < plain, (plain, whole, chunked)
    assert np.allclose(jax.grad(_nbody_loss)(x, y, m), jax.grad(_nbody_in_chunks)(x, y, m),
                       rtol=1e-3, atol=1e-2)
    assert "broadcasting" not in preflight.residuals(_nbody_in_chunks, x, y, m).advice
    # the input along the reduced axis is named by the reduction, not by its position
    flipped = preflight.residuals(lambda y, x, m: _nbody(x, y, m).sum(), y, x, m)
    assert "16 of y (the reduced axis)" in flipped.advice
    over_i = jax.make_jaxpr(lambda x, y: jnp.exp(-((x[:, None] - y[None]) ** 2).sum(-1))
                            .sum(0) @ m)(x, y)  # reduced over i: x runs along it
    assert [(f[3], f[6], f[7]) for f in jaxpr_products.pairwise_reductions(over_i)] == [(0, 0, 0)]


def test_xla_49131_an_rbf_gradient_xla_fuses_away_is_not_told_to_change():
    """The RBF kernel's gradient: JAX lists 4 MiB of residuals; XLA's compiled gradient holds
    none of it on jax 0.10.2 (the kit said "keeps 64 MiB" at 2048 and advised jax.checkpoint),
    all of it on 0.8.0. The note follows what XLA compiled."""
    x, y = (jax.random.normal(jax.random.PRNGKey(i), (_P, 3)) for i in (0, 1))
    w = jnp.ones(_P)
    r = preflight.residuals(_rbf_loss, x, y, w)
    temp = _temp(_rbf_loss, x, y, w)
    assert "broadcasting them against each other" in r.advice
    assert "on the largest layer" not in r.advice
    if 2 * temp < r.saved_bytes:  # jax 0.10.2 on the CPU: 0 B
        assert f"holds only {format_bytes(temp)} of temporaries" in r.advice
        assert "nothing needs changing" in r.advice and "chunks" not in r.advice
    else:  # jax 0.8.0: the chunks
        assert "a lax.scan over 32 chunks of 16 of y" in r.advice


def test_a_one_sided_broadcast_is_no_pairwise_product():
    """A bias or a row maximum broadcast against an activation keeps the general advice."""
    def loss(w, x):
        h = x @ w + jnp.ones(w.shape[1])
        return jnp.sum(jnp.exp(h - jnp.max(h, axis=1, keepdims=True)))

    r = preflight.residuals(loss, jnp.ones((256, 256)) * 0.01, jnp.ones((512, 256)))
    assert "broadcasting" not in r.advice and "jax.checkpoint on the largest layer" in r.advice


def test_a_one_hot_made_against_arange_is_no_pairwise_product_of_inputs():
    """labels[:, None] == jnp.arange(V)[None, :] broadcasts an input against a range made
    inside: no second input to take in chunks (the review found "every pair of two inputs'
    rows" said of it, with chunks of a placeholder 'ys')."""
    vocab = 8192

    def loss(params, x, labels):
        logits = jnp.tanh(x @ params["w1"]) @ params["w2"]
        onehot = (labels[:, None] == jnp.arange(vocab)[None, :]).astype(jnp.float32)
        return -(onehot * jax.nn.log_softmax(logits)).sum(-1).mean()

    params = {"w1": jnp.ones((64, 64)) * 0.01, "w2": jnp.ones((64, vocab)) * 0.01}
    r = preflight.residuals(loss, params, jnp.ones((256, 64)), jnp.zeros(256, jnp.int32))
    assert "every pair" not in r.advice and "broadcasting them against each other" not in r.advice


def test_a_layer_norm_s_row_scale_is_no_pairwise_product_of_inputs():
    """rsqrt(var)[n, 1] * scale[d] is an outer product, but no larger than the x[n, d] it
    scales: a trial's bfloat16 LayerNorm (google/flax#612) was told "38.00 MiB ... values over
    every pair of two inputs' rows" and to scan over chunks of the scale, which LayerNorm,
    needing whole rows, cannot take. An N-body sum stays named (the test above)."""
    bf = jnp.bfloat16

    def layer_norm(x, scale, bias):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jax.lax.square(x), axis=-1, keepdims=True) - jax.lax.square(mean)
        return (x - mean) * (jax.lax.rsqrt(var + 1e-6) * scale) + bias

    def loss(params, x):
        for p in params:
            x = x + jax.nn.gelu(layer_norm(x, p["s"], p["b"]) @ p["w"])
        return jnp.mean(x.astype(jnp.float32) ** 2)

    params = [{"w": jnp.ones((512, 512), bf) * 0.01, "s": jnp.ones(512, bf),
               "b": jnp.zeros(512, bf)} for _ in range(3)]
    r = preflight.residuals(loss, params, jnp.ones((256, 512), bf))
    assert "every pair" not in r.advice and "the reduced axis" not in r.advice, r.advice
    emb = jnp.ones((1000, 512), bf)  # x made inside the step, an embedding's rows (a review)
    r = preflight.residuals(lambda p, e, t: loss(p, e[t]), params, emb,
                            jnp.arange(256) % 1000)
    assert "every pair" not in r.advice, r.advice


class _Module:
    """A stand-in for a Flax NNX module: a mutable object whose arrays are also its pytree's
    leaves (as nnx modules are in flax 0.12)."""

    def __init__(self, **arrays):
        vars(self).update(arrays)


jax.tree_util.register_pytree_node(
    _Module, lambda m: ([vars(m)[k] for k in sorted(vars(m))], tuple(sorted(vars(m)))),
    lambda names, leaves: _Module(**dict(zip(names, leaves, strict=True))))


class _NnxJit:
    """A stand-in for ``nnx.jit`` (flax/nnx/transforms/compilation.py): the step changes its
    modules in place; the wrapper jits a pure function that takes their state and returns it
    updated beside the step's own outputs, and writes it back into the modules after the call.
    Its Lowered keeps JAX's as ``.lowered``, as Flax's does, and it keeps the step's signature
    (``__wrapped__``), as Flax's does: the kit names the arguments by it."""

    def __init__(self, fn, donate_argnums=(), static_argnames=()):
        functools.update_wrapper(self, fn)
        self.jitted_fn = jax.jit(lambda *args, **kw: (args, fn(*args, **kw)),
                                 donate_argnums=donate_argnums, static_argnames=static_argnames)

    def lower(self, *args, **kwargs):
        import types

        return types.SimpleNamespace(lowered=self.jitted_fn.lower(*args, **kwargs))

    def __call__(self, *args, **kwargs):
        new, out = self.jitted_fn(*args, **kwargs)
        for old, updated in zip(args, new, strict=True):
            if isinstance(old, _Module):
                vars(old).update(vars(updated))
        return out


def _nnx_train_step(model, opt, x, scale=1.0):
    """SGD with momentum on a two-layer model, written as an nnx step: it updates in place.
    ``scale``: a Python float for the loss, static under the wrapper."""
    def loss(w1, w2):
        return scale * jnp.mean((jnp.tanh(x @ w1) @ w2) ** 2)

    grads = jax.grad(loss, argnums=(0, 1))(model.w1, model.w2)
    opt.m1, opt.m2 = 0.9 * opt.m1 + grads[0], 0.9 * opt.m2 + grads[1]
    model.w1, model.w2 = model.w1 - 0.1 * opt.m1, model.w2 - 0.1 * opt.m2
    return loss(model.w1, model.w2)


def test_flax_5026_an_nnx_jit_step_s_state_is_read_through_its_wrapper():
    """google/flax#5026: an nnx.jit train step held the state twice; the fix is to donate it
    (nnx.jit(step, donate_argnums=...)). The kit read no outputs through the wrapper (no
    donation note), called every donated leaf "NOT reused: unknown: ... no alias table" though
    XLA aliased them all, and with its own donate_argnums priced jax.jit(nnx_step), whose
    program drops the updated state and the work that made it."""
    def state():
        return (_Module(w1=jnp.ones((256, 512)), w2=jnp.ones((512, 256))),
                _Module(m1=jnp.zeros((256, 512)), m2=jnp.zeros((512, 256))), jnp.ones((64, 256)))

    model, opt, x = state()
    nbytes = 4 * 256 * 512 * 4  # the four state arrays, each 512 KiB
    p = preflight.preflight_step(_NnxJit(_nnx_train_step), model, opt, x)
    assert p.output_bytes >= nbytes  # the updated state comes back through the wrapper
    # named by the step's own signature, and the donation declared on the wrapper, as the
    # kit refuses to put one around it (below)
    assert "Donating model and opt (declared on the wrapper itself: nnx.jit(step, " \
           "donate_argnums=...))" in p.advice, p.advice
    assert "preflight_step on the step so declared shows its plan" in p.advice
    assert "args[0]" not in p.advice and "preflight_step with the donation" not in p.advice
    donated = _NnxJit(_nnx_train_step, donate_argnums=(0, 1))
    d = preflight.preflight_step(donated, model, opt, x)
    assert len(d.donations) == 4 and all(a.reused for a in d.donations), d.donations
    assert "no alias table" not in str(d) and d.alias_bytes == nbytes
    assert "Nothing donated" not in d.advice  # the note's fix, followed on the wrapper
    with pytest.raises(BadInputError, match=r"returns 6 arrays where jax.jit around it returns "
                       r"1.*the donation asked here.*Declare them on the wrapper itself "
                       r"\(nnx.jit\(step, donate_argnums=...\)\).*without donate_argnums"):
        preflight.preflight_step(_NnxJit(_nnx_train_step), model, opt, x, donate_argnums=(0, 1))
    # the same with static arguments declared to the kit: it would put a jax.jit around the
    # wrapper to make them static, and price a step that updates nothing (4 bytes out)
    static = _NnxJit(_nnx_train_step, static_argnames="scale")
    with pytest.raises(BadInputError, match=r"returns 6 arrays where jax.jit around it returns "
                       r"1.*the static arguments asked here.*nnx.jit\(step, "
                       r"static_argnames=...\).*without static_argnames"):
        preflight.preflight_step(static, model, opt, x, scale=2.0, static_argnames="scale")
    assert jax.jit(static, static_argnames="scale").lower(
        model, opt, x, scale=2.0).compile().memory_analysis().output_size_in_bytes == 4
    # the fix, run: the wrapper's own static argument, nothing asked of the kit
    s = preflight.preflight_step(static, model, opt, x, scale=2.0)
    assert s.output_bytes >= nbytes and "Donating model and opt" in s.advice, s.advice
    # what the kit refuses to price: jax.jit around the wrapper leaves the modules as they were
    model2, opt2, x2 = state()
    with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
        jax.jit(_NnxJit(_nnx_train_step), donate_argnums=(0, 1))(model2, opt2, x2)
    assert float(model2.w2[0, 0]) == 1.0 and not model2.w2.is_deleted()  # JAX's own warning too
    # the fix, run: the wrapper's own donation trains the model and gives up the old buffers
    old = model.w2
    donated(model, opt, x)
    assert old.is_deleted() and float(model.w2[0, 0]) != 1.0



class _State:
    """A stand-in for Flax 0.12's NodeStates: the modules' state as the program inside nnx.jit
    takes it, another pytree type over the same leaves."""

    def __init__(self, leaves):
        self.leaves = tuple(leaves)


jax.tree_util.register_pytree_node(_State, lambda s: (s.leaves, None),
                                   lambda _, leaves: _State(leaves))


class _NnxJitOfState(_NnxJit):
    """``_NnxJit`` whose program takes each module's state as a ``_State``, as Flax 0.12's
    does (flax/nnx/transforms/compilation.py splits the modules before the inner jit)."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)

        def pure(*args):
            modules = [_Module(**dict(zip(sorted(vars(m)), a.leaves, strict=True)))
                       if isinstance(a, _State) else a for m, a in zip(self._given, args,
                                                                       strict=True)]
            return [_State(jax.tree.leaves(m)) if isinstance(m, _Module) else None
                    for m in modules], fn(*modules)

        self.jitted_fn = jax.jit(pure)

    def _split(self, args):
        self._given = args
        return [_State(jax.tree.leaves(a)) if isinstance(a, _Module) else a for a in args]

    def lower(self, *args):
        import types

        return types.SimpleNamespace(lowered=self.jitted_fn.lower(*self._split(args)))


def test_an_nnx_jit_step_whose_program_takes_the_modules_state_is_measured():
    """The H100 run of 2026-11-27 (jax 0.11.2; Flax 0.12.12 on the CPU too): measuring an
    nnx.jit step failed with "Function compiled with input pytree does not match ... seen
    NodeStates but now given Optimizer": the program inside nnx.jit takes the modules' state,
    the kit called it with the modules. The same leaves go in, as the program takes them."""
    model = _Module(w1=jnp.ones((256, 512)), w2=jnp.ones((512, 256)))
    opt = _Module(m1=jnp.zeros((256, 512)), m2=jnp.zeros((512, 256)))
    step = _NnxJitOfState(_nnx_train_step)
    m = measure.measure_step(step, model, opt, jnp.ones((64, 256)))
    state = 4 * 256 * 512 * 4  # four arrays of 512 KiB
    assert m.argument_bytes == state + 64 * 256 * 4 and m.peak_bytes >= state

def _jax25010_fsdp(remat: str):
    """jax-ml/jax#25010 in miniature: FSDP by hand, each layer all-gathers its weight shard
    inside shard_map; ``remat`` is "", "checkpoint" or "policy" (the gather named and left out
    of a save_only_these_names policy)."""
    from jax.sharding import PartitionSpec as P

    n = 4
    mesh = jax.make_mesh((n,), ("fsdp",), devices=jax.devices()[:n],
                         axis_types=(jax.sharding.AxisType.Auto,))

    def layer(w_shard, h):
        w = jax.lax.all_gather(w_shard, "fsdp", tiled=True)  # the whole weight
        if remat == "policy":
            from jax.ad_checkpoint import checkpoint_name

            w = checkpoint_name(w, "gathered")
        return jnp.tanh(h @ w)

    if remat == "checkpoint":
        layer = jax.checkpoint(layer)
    elif remat == "policy":
        layer = jax.checkpoint(
            layer, policy=jax.checkpoint_policies.save_only_these_names("not_gathered"))

    def local_loss(ws, x):
        h = x
        for w in ws:
            h = layer(w, h)
        return jax.lax.pmean(jnp.mean(h ** 2), "fsdp")

    spec = [P("fsdp", None)] * 2
    loss = jax.jit(jax.shard_map(local_loss, mesh=mesh, in_specs=(spec, P("fsdp", None)),
                                 out_specs=P(), check_vma=False))
    ws = [jnp.full((256, 256), 0.01)] * 2
    return loss, ws, jnp.ones((64, 256))


@pytest.mark.skipif("len(jax.devices()) < 4", reason="needs 4 simulated devices")
def test_jax_25010_shard_map_residuals_said_per_device_with_the_gather_and_its_fix():
    """jax-ml/jax#25010: JAX lists a shard_map body's residuals stacked over the mesh
    (float32[1024, 256] for 4 devices' gathered float32[256, 256]) and the kit summed them as
    if one device kept them all. It now says each device's share and shape, names the
    all_gather's line and the checkpoint that drops the gathered copies (checked: 2.31 MiB
    summed, 592 KiB each, 2.25 and 576 KiB on jax 0.11.2, down to 128 KiB summed, 32 KiB
    each, with either fix)."""
    r = preflight.residuals(*_jax25010_fsdp(""))
    gathered = [x for x in r.residuals if x.gathered_at]
    assert [(x.shape, x.devices, x.device_shape) for x in gathered] == \
        [((1024, 256), 4, (256, 256))] * 2
    # 2 gathered weights and 5 activations, each stacked over 4 devices; 4 from jax 0.11,
    # whose tanh derivative is g * one_minus_square(y) where 0.10.2's was (g + g * y) * (1 - y):
    # the last layer's tanh keeps 1 - y**2 alone, not y and 1 - y (2.31 -> 2.25 MiB summed)
    activations = 5 if jaxcompat.jax_version_tuple() < (0, 11) else 4
    assert r.saved_bytes == 2 * 1024 * 256 * 4 + activations * 64 * 256 * 4
    assert r.device_bytes == r.saved_bytes // 4 and r.devices == 4
    text = str(r)
    assert f"summed over the 4 devices a shard_map splits it over: each device keeps " \
           f"{format_bytes(r.device_bytes)}" in text
    assert "float32[1024, 256] = 4 x float32[256, 256], 256.00 KiB on each device" in text
    assert r.advice.startswith(f"512.00 KiB of the {format_bytes(r.device_bytes)} each "
                               "device keeps are whole arrays that the all_gather at "
                               "test_preflight.py:")
    assert "jax.checkpoint" in r.advice and "only the shard is kept" in r.advice
    for fix in ("checkpoint", "policy"):  # the fix, run: the gathered copies are gone
        after = preflight.residuals(*_jax25010_fsdp(fix))
        assert not any(x.gathered_at for x in after.residuals)
        assert (after.saved_bytes, after.device_bytes) == (131_072, 32_768)
        assert "all_gather" not in after.advice


def _attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def test_flax_2858_jax_s_own_vmap_in_dot_product_attention_is_not_called_the_user_s():
    """google/flax#2858: jax.nn.dot_product_attention's [B, H, T, S] values under jax.grad were
    said to be "made under jax.vmap for every element of the batch", with lax.map(jax.checkpoint
    (f), batch_size=k) as the fix: the user wrote no vmap. The vmap is JAX's own, over the
    query groups (one here: the shapes' leading 1). A vmap of the user's around the same
    attention is still found by batched_by_line; preflight_step's advice gives the attention
    note for that line instead."""
    import dataclasses

    q = jnp.zeros((2, 256, 4, 64))
    step = jax.grad(lambda q, k, v: jnp.sum(_attention(q, k, v) ** 2), argnums=(0, 1, 2))
    p = preflight.preflight_step(step, q, q, q)
    # no vmap note (other notes may name lax.map for their own values: the attention's query
    # blocks, a pairwise value's rows)
    assert "under jax.vmap for every element" not in p.advice
    assert "such values shrink in proportion" not in p.advice
    top = p.largest_temporaries[0]  # the score matrix is still listed, with its line
    assert top.shape[-2:] == (256, 256) and "dot_product_attention" in top.line
    # what the kit said before: the same values, read without the jaxpr, are "batched"
    c = compiled.compile_step(step, q, q, q)
    peak = c.sizes()["peak"]
    assert program_notes.batched_by_line(dataclasses.replace(c, jaxpr=None), peak)
    assert program_notes.batched_by_line(c, peak) == []
    # the user's own vmap (per example) around the same attention: batched_by_line keeps it
    # (preflight_step's advice gives the attention note for that line instead, google/flax#2858)
    mine = jax.grad(lambda q, k, v: jnp.sum(jax.vmap(
        lambda a, b, c: _attention(a[None], b[None], c[None])[0])(q, k, v) ** 2),
        argnums=(0, 1, 2))
    c = compiled.compile_step(mine, q, q, q)
    assert program_notes.batched_by_line(c, c.sizes()["peak"])
    assert "attention score matrix" in preflight.preflight_step(mine, q, q, q).advice


def test_flax_2858_a_vmap_of_one_element_gets_no_advice_to_compute_it_in_chunks():
    """A jax.vmap of axis size 1 makes nothing "for every element of the batch at once": chunks
    of k elements would shrink nothing. The same vmap over 4 elements keeps the note."""
    def each(x):
        y = jnp.tanh(jnp.outer(x, x))  # 16 MiB for each element
        return y @ x + y.T @ x

    def step(xs):
        return jax.vmap(each)(xs)

    one, four = jnp.ones((1, 2048)) * 1e-3, jnp.ones((4, 2048)) * 1e-3
    assert "under jax.vmap" in preflight.preflight_step(step, four).advice
    p = preflight.preflight_step(step, one)
    assert p.temp_bytes >= 16 * MiB  # the 2048 x 2048 value is made
    # no vmap note (other notes may name lax.map for their own values: the attention's query
    # blocks, a pairwise value's rows)
    assert "under jax.vmap for every element" not in p.advice
    assert "such values shrink in proportion" not in p.advice


_L891, _Q891 = 20, 21


def _energy_loop(h, J, seq):
    """jax-ml/jax#891 in miniature: one lookup per position in a Python loop inside jit."""
    e = 0.0
    for r in range(_L891):
        e = e + h[r, seq[r]]
        e = e + jnp.sum(J[r, jnp.arange(_L891), seq[r], seq])
    return e


def _energy_gather(h, J, seq):
    """hawkinsp's fix: one gather with index arrays."""
    r = jnp.arange(_L891)
    return jnp.sum(h[r, seq]) + jnp.sum(J[r[:, None], r[None, :], seq[:, None], seq[None, :]])


def _loss891(energy):
    return jax.grad(lambda h, J, seqs: jnp.mean(jax.vmap(energy, in_axes=(None, None, 0))(
        h, J, seqs)), argnums=(0, 1))


def _args891():
    key = jax.random.key(0)
    h = jax.random.normal(key, (_L891, _Q891))
    J = jax.random.normal(jax.random.fold_in(key, 1), (_L891, _L891, _Q891, _Q891))
    seqs = jax.random.randint(jax.random.fold_in(key, 2), (6, _L891), 0, _Q891)
    return h, J, seqs


def test_jax_891_a_gradient_summed_over_the_batch_is_not_said_to_be_made_under_vmap():
    """jax-ml/jax#891: the gradient of J, f32[L, L, q, q], summed over the batch of 6 by
    jax.grad of a vmap with in_axes=None, was "made under jax.vmap for every element of the
    batch at once" with lax.map(jax.checkpoint(f), batch_size=k) as the fix, which left it
    4.21 MiB. It has no dimension of the batch: no note now."""
    import dataclasses

    args = _args891()
    c = compiled.compile_step(_loss891(_energy_loop), *args)
    peak = c.sizes()["peak"]
    (said,) = [t for t in c.temporaries(16)  # what it said: XLA's op_name has the vmap
               if t.batched and t.shape == (_L891, _L891, _Q891, _Q891)]
    assert program_notes.batched_by_line(c, peak) == []
    assert program_notes.batched_by_line(dataclasses.replace(c, jaxpr=None), peak) == [] or \
        said.nbytes <= c.sizes()["temp"]  # (an output now, which no chunking shrinks either)
    assert jaxpr_products.vmapped_lines(c.jaxpr)[said.line][0] == (frozenset({6}),)
    assert "under jax.vmap" not in preflight.preflight_step(_loss891(_energy_loop),
                                                            *args).advice


def test_jax_891_a_python_loop_of_lookups_xla_fused_is_named_by_its_jaxpr_equations():
    """jax-ml/jax#891: 50 lookups in a Python loop inside jit compiled for 16.6 s, one gather
    for 0.68 s (jax 0.10.2, CPU), and the unrolled-loop note said nothing: XLA fused the loop's
    copies into 51 operations, fewer than UNROLLED_AT. The note counts the jaxpr's equations
    per line now and names the single gather (here: 20 lookups)."""
    args = _args891()
    c = compiled.compile_step(_loss891(_energy_loop), *args)
    line = "J[r, jnp.arange(_L891), seq[r], seq]"
    xla = sum(1 for v in c.values if v["source"] and line in frames.line(*v["source"]))
    assert xla < compiled.UNROLLED_AT  # the old count: silent
    p = preflight.preflight_step(_loss891(_energy_loop), *args)
    assert "jaxpr equations come from one line" in p.advice and line in p.advice
    assert "a Python loop inside the jitted function is unrolled" in p.advice
    assert "one gather for all iterations with index arrays" in p.advice
    assert "jax-ml/jax#891" in p.advice and "jax.lax.scan(..., unroll=k)" in p.advice
    assert "fused them into 0 of" not in p.advice  # (a new user's trial: "none of its" now)
    _, n, total, repeats, gathers, *_ = jaxpr_loops.unrolled_line(c.jaxpr, compiled.UNROLLED_AT)
    assert n >= 10 * xla and repeats >= _L891 and gathers
    # the fix, run: one gather, the same gradients, a program a fraction of the size
    fixed = compiled.compile_step(_loss891(_energy_gather), *args)
    assert 10 * len(list(e for j, _ in jaxpr_walk.walk(fixed.jaxpr) for e in j.eqns)) < total
    assert "unrolled" not in preflight.preflight_step(_loss891(_energy_gather), *args).advice
    for a, b in zip(jax.jit(_loss891(_energy_loop))(*args),
                    jax.jit(_loss891(_energy_gather))(*args), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_mamba_minimal_jax_1_associative_scan_is_no_python_loop(monkeypatch):
    """radarFudan/mamba-minimal-jax#1: 97 of the gradient's 109 operations came from the line
    calling jax.lax.associative_scan (L=1024), and the kit said "a Python loop inside the
    jitted function is unrolled": there is none, it is associative_scan's recursion of log2 L
    levels inside JAX. Its equations are left out now. In miniature (L=16: 32 operations from
    the line) with the threshold lowered to 16 so that the old rule fires; a Python loop at
    that threshold is still named."""
    import dataclasses

    def binop(a, b):
        (a1, b1), (a2, b2) = a, b
        return a1 * a2, a2 * b1 + b2

    def ssm(dA, dBu):
        _, xs = jax.lax.associative_scan(binop, (dA, dBu))
        return jnp.sum(xs ** 2)

    monkeypatch.setattr(compiled, "UNROLLED_AT", 16)
    dA = jnp.full((16, 4, 4), 0.9)
    c = compiled.compile_step(jax.value_and_grad(ssm, argnums=(0, 1)), dA, dA)
    assert "Python loop" in dataclasses.replace(c, jaxpr=None).unrolled()  # the old words
    assert c.unrolled() == ""
    made = jaxpr_loops.line_repeats(c.jaxpr)
    scan_line = next(v for k, v in made.items() if "associative_scan(binop" in frames.line(*k))
    assert scan_line[0] == 0 and scan_line[1] > 0  # all its equations: JAX's own loop code

    def looped(h):
        for _ in range(20):
            h = jnp.tanh(h * 0.5)
        return h

    assert "Python loop" in compiled.compile_step(looped, jnp.ones(8)).unrolled()


def test_jax_520_nested_jvp_is_no_python_loop_for_the_unrolled_note():
    """A derivative makes several equations from one call (nested jax.jvp of one line, order
    3: 27 of one mul); they are not a loop's iterations."""
    def f(t):
        return 0.3 * jnp.sin(t) * t ** 10

    g = f
    for _ in range(3):
        g = (lambda h: (lambda v: jax.jvp(h, (v,), (jnp.ones_like(v),))[1]))(g)
    x = jnp.linspace(0.5, 1.5, 64)
    assert jaxpr_loops.unrolled_line(jax.make_jaxpr(g)(x), 64) is None
    assert "unrolled" not in compiled.compile_step(g, x).unrolled()


class _Adapt(NamedTuple):
    step_size: jax.Array
    inverse_mass_matrix: jax.Array  # (D, D) with dense_mass=True
    mass_matrix_sqrt: jax.Array


class _HMC(NamedTuple):
    i: jax.Array
    z: jax.Array
    z_grad: jax.Array
    potential_energy: jax.Array
    rng_key: jax.Array
    adapt_state: _Adapt


_D539, _N539 = 16, 512


def _hmc_step(state):
    key, sub = jax.random.split(state.rng_key)
    z = state.z - 0.01 * state.z_grad + 0.01 * (state.adapt_state.mass_matrix_sqrt
                                                 @ jax.random.normal(sub, (_D539,)))
    return state._replace(i=state.i + 1, z=z, z_grad=z, potential_energy=0.5 * z @ z,
                          rng_key=key)


def _fori_collect(init, transform=lambda s: s, batch_size=None):
    """numpyro 0.2's fori_collect: a fori_loop writes ravel_pytree(transform(state)) into a
    row of a preallocated collection at each step, then unravels the rows with jax.vmap
    (``batch_size``: lax.map in chunks instead, the advice the kit gave)."""
    from jax.flatten_util import ravel_pytree

    flat, unravel = ravel_pytree(transform(init))

    def step(i, carry):
        state, coll = carry
        state = _hmc_step(state)
        return state, coll.at[i].set(ravel_pytree(transform(state))[0])

    _, coll = jax.lax.fori_loop(0, _N539, step, (init, jnp.zeros((_N539,) + flat.shape)))
    if batch_size:
        return jax.lax.map(unravel, coll, batch_size=batch_size)
    return jax.vmap(unravel)(coll)


def test_numpyro_539_unravelled_rows_get_no_lax_map_advice_and_the_unchanged_carry_is_named():
    """pyro-ppl/numpyro#539: fori_collect kept the whole HMC state for every sample, the dense
    mass matrix included (the same in every row). The kit advised jax.lax.map(f, xs,
    batch_size=k) for the rows jax.vmap(unravel) cuts back into the state's leaves: run, it
    changes nothing (they are the step's outputs). That advice is gone; the note names the
    values the loop carries unchanged and collecting only what changes (transform=lambda s:
    s.z, the thread's fix), run here."""
    import dataclasses

    init = _HMC(jnp.array(0), jnp.ones(_D539), jnp.ones(_D539), jnp.array(0.0),
                jax.random.key_data(jax.random.key(0)),
                _Adapt(jnp.array(0.1), jnp.eye(_D539), jnp.eye(_D539)))
    c = compiled.compile_step(_fori_collect, init)
    peak = c.sizes()["peak"]
    assert program_notes.batched_by_line(dataclasses.replace(c, jaxpr=None), peak)  # before
    assert program_notes.batched_by_line(c, peak) == []
    p = preflight.preflight_step(_fori_collect, init)
    assert "under jax.vmap" not in p.advice and "batch_size=k" not in p.advice
    row = 1 + 2 * _D539 + 1 + 2 + 1 + 2 * _D539 * _D539
    unchanged = 1 + 2 * _D539 * _D539  # step_size and the two D x D matrices
    assert f"{unchanged:,} of each row's {row:,} values" in p.advice
    assert "transform=lambda state: state.z" in p.advice and "numpyro#539" in p.advice
    # the advice it gave, run: lax.map in chunks leaves XLA's peak as it was
    ma = [jax.jit(f).lower(init).compile().memory_analysis() for f in (
        _fori_collect, functools.partial(_fori_collect, batch_size=64))]
    assert ma[1].temp_size_in_bytes + ma[1].output_size_in_bytes >= 0.99 * (
        ma[0].temp_size_in_bytes + ma[0].output_size_in_bytes)
    # the fix, run: collect z alone; the buffer shrinks by the row's share that changes
    z_only = preflight.preflight_step(functools.partial(_fori_collect,
                                                        transform=lambda s: s.z), init)
    assert z_only.peak_bytes * 20 < p.peak_bytes and "numpyro#539" not in z_only.advice
    assert p.loop_records[0][2] == _N539 * row * 4


def test_jax_2777_a_loop_over_layers_of_different_widths_is_not_told_lax_scan():
    """A review of jax-ml/jax#2777's note: a Python loop over layers that each have a width of
    their own was given "jax.lax.fori_loop or jax.lax.scan compile the body once"; a scan runs
    one body over one shape. The note says the iterations differ in shape (the repeated
    equation never recurs with the same operand shapes) and names stacking alike layers."""
    widths = [64] + [64 + 4 * i for i in range(1, 41)]

    def grow(x):
        h = x
        for a, b in zip(widths[:-1], widths[1:], strict=False):
            h = jnp.tanh(h @ jnp.full((a, b), 0.01) + 0.1)
        return h

    note = compiled.compile_step(grow, jnp.ones((8, 64))).unrolled()
    assert "h = jnp.tanh(h @ jnp.full((a, b), 0.01) + 0.1)" in note
    assert ("40 times over, its operand shapes changing between iterations (at most 1 "
            "alike)") in note
    assert "arrays of different shapes" in note and "compile the body once" not in note
    assert "stack the layers that share a shape into one array" in note


def test_a_ynnpack_fusion_without_a_dot_is_not_called_one():
    """The note on values a YNNPACK fusion keeps out of XLA's plan said "a dot with what
    follows it" of a fusion of elementwise work and a sum (a new user's trial)."""
    from helpers._internal import jaxcompat

    def log_cosh_rows(x, b):
        return jnp.sum(jnp.log(jnp.cosh(x + b)), axis=-1)

    x, b = jnp.ones((4096, 512)), jnp.ones(512)  # 8 MiB values, none of them a dot's
    text = jax.jit(log_cosh_rows).lower(x, b).compile().as_text()
    found = jaxcompat.ynn_fusion_intermediates(text)
    p = preflight.preflight_step(log_cosh_rows, x, b)
    if not found or p.fusion_bytes == 0:  # jax 0.8.0 makes no YNNPACK fusion; XLA plans all
        assert p.fusion_bytes == 0 and "YNNPACK" not in p.advice
        return
    assert not any(dot for _, _, dot in found)
    assert "fuses elementwise work and the reduction after it into a YNNPACK fusion" in p.advice
    assert "a dot with what follows it" not in p.advice


def test_the_arguments_row_names_donated_positions_as_arguments_not_bytes():
    """A new user's trial read "arguments: 48.50 MiB (donated: 0)" as nothing donated: the
    row names the positions as arguments now."""
    def step(p, x):
        return p - 0.1 * x.sum() * p

    p = preflight.preflight_step(step, jnp.ones((256, 256)), jnp.ones(8), donate_argnums=0)
    (row,) = [line for line in str(p).splitlines() if line.lstrip().startswith("arguments:")]
    assert row.endswith("(donated: argument 0)"), row


def test_skyrl_1083_a_checkpoint_around_a_whole_scan_is_named_with_the_body_checkpointed():
    """NovaSky-AI/SkyRL#1083 and apple/axlearn#1171: jax.checkpoint (with or without a policy)
    around a whole lax.scan over layers, where the fix checkpoints the scan's body. Recomputed
    for the backward pass, the scan keeps what it needs from every step at once; the kit said
    "Return less from the body" of a body that returns nothing (a new user's trial). It now
    names the checkpoint around the scan and the body's, run here on each form."""
    n, b, d, h = 8, 128, 128, 512
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (n, d, h)) * 0.02,
              "w2": jax.random.normal(k2, (n, h, d)) * 0.02}
    x = jnp.ones((b, d))
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def body(x, p):
        h_ = jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w1"].T @ p["w1"])
        return x + h_ @ p["w2"], None

    def loss(wrap_scan, wrap_body):
        def scan(p, x):
            return jax.lax.scan(wrap_body(body), x, p)[0]
        return lambda p, x: jnp.sum(wrap_scan(scan)(p, x) ** 2)

    def plain(f):
        return f

    with_policy = functools.partial(jax.checkpoint, policy=policy)
    forms = {"around": loss(jax.checkpoint, plain), "body": loss(plain, jax.checkpoint),
             "around, policy": loss(with_policy, plain), "body, policy": loss(plain, with_policy),
             "both, policy": loss(with_policy, with_policy)}
    temp = {k: _temp_bytes(jax.grad(f), params, x) for k, f in forms.items()}
    said = {k: preflight.preflight_step(jax.grad(f), params, x).advice for k, f in forms.items()}
    for k in ("around", "around, policy"):
        assert "a jax.checkpoint around the whole scan recomputes it" in said[k]
        assert "jax.lax.scan(jax.checkpoint(body), ...)" in said[k]
        assert "NovaSky-AI/SkyRL#1083" in said[k]
    for k, advice in said.items():
        assert "Return less from the body" not in advice, k
        if not k.startswith("around"):
            assert "around the whole scan" not in advice, k
    # an eval scan beside the gradient's, not differentiated: no residuals, no derivative said
    def train_and_eval(p, x, xe):
        g = jax.grad(forms["body"])(p, x)
        _, hs = jax.lax.scan(jax.checkpoint(lambda c, q: (jnp.tanh(c @ q["w1"]) @ q["w2"],) * 2),
                             xe, p)
        return g, hs

    (evaled,) = [t for t in preflight.preflight_step(
        train_and_eval, params, x, jnp.ones((4 * b, d))).scan_stacks if t.shape == (n, 4 * b, d)]
    assert evaled.role == ""  # (a review: it was said to run under a derivative)
    assert temp["body"] * 4 <= temp["around"]  # 12.69 -> 2.00 MiB (jax 0.10.2)
    assert temp["body, policy"] * 2 <= temp["around, policy"]  # 16.63 -> 6.69 MiB
    np.testing.assert_allclose(jax.grad(forms["body"])(params, x)["w1"],
                               jax.grad(forms["around"])(params, x)["w1"], rtol=1e-4, atol=1e-6)


def test_jax_14056_a_layer_loop_told_to_scan_under_grad_is_told_to_checkpoint_the_body():
    """jax-ml/jax#14056 (nn.scan=False): a Python loop over layers held as a list. The kit's
    compile note advised stacking them and jax.lax.scan; under jax.grad, a scan without
    jax.checkpoint on its body kept every layer's values at once and XLA's plan grew about 8
    times on the CPU (a new user's trial). The note now says to checkpoint the body, run here:
    the checkpointed scan plans no more than the loop."""
    n, b, d, h = 16, 128, 128, 512
    keys = jax.random.split(jax.random.key(0), 2 * n)
    layers = [{"w1": jax.random.normal(keys[2 * i], (d, h)) * 0.02,
               "w2": jax.random.normal(keys[2 * i + 1], (h, d)) * 0.02} for i in range(n)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    x = jnp.ones((b, d))

    def layer(x, p):
        return x + jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w1"].T @ p["w1"]) @ p["w2"]

    def loop(ps, x):
        for p in ps:
            x = layer(x, p)
        return jnp.sum(x ** 2)

    def scanned(body):
        return lambda ps, x: jnp.sum(jax.lax.scan(body, x, ps)[0] ** 2)

    def step(c, p):
        return layer(c, p), None

    advice = preflight.preflight_step(jax.grad(loop), layers, x).advice
    assert "jax.lax.scan" in advice  # (the unrolled-loop note, or the many-arrays one)
    assert "put jax.checkpoint on the scan's body" in advice and "jax-ml/jax#14056" in advice
    unrolled = _temp_bytes(jax.grad(loop), layers, x)
    bare = _temp_bytes(jax.grad(scanned(step)), stacked, x)
    checkpointed = _temp_bytes(jax.grad(scanned(jax.checkpoint(step))), stacked, x)
    assert checkpointed <= unrolled < bare  # 2.50 <= 2.75 < 23.69 MiB (jax 0.10.2)
    forward = preflight.preflight_step(loop, layers, x).advice
    assert "put jax.checkpoint on the scan's body" not in forward

    def beside(ps, x):  # a gradient of its own, and the loop outside it: no checkpoint said
        return jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w1"]) ** 2))(ps[0]), loop(ps, x)

    assert "put jax.checkpoint on the scan's body" not in preflight.preflight_step(
        beside, layers, x).advice


def test_jax_llm_examples_33_an_argument_most_of_the_peak_is_named_first_when_it_will_not_fit():
    """jax-ml/jax-llm-examples#33: a KV cache preallocated for max_seq_len; the maintainer's
    fix, a shorter max_seq_len. The kit's "will not fit" tips never named the cache, 94% of
    the arguments, and added that the outputs alone exceeded the free memory (to compute on
    the host), though the cache's output is written into it, donated (a new user's trial).
    The cache is named first now, and the shorter cache fits."""
    layers, b, h, d, e = 2, 4, 4, 64, 256
    w = {"qkv": jnp.ones((layers, e, 3 * h * d)) * 0.02, "o": jnp.ones((layers, h * d, e)) * 0.02}

    @functools.partial(jax.jit, donate_argnums=1)
    def decode(w, kv, x, pos):
        for i in range(layers):
            q, k, v = (t.reshape(b, 1, h, d) for t in jnp.split(x @ w["qkv"][i], 3, -1))
            kv = jax.lax.dynamic_update_slice(kv, jnp.stack([k, v])[None], (i, 0, 0, pos, 0, 0))
            s = jnp.einsum("bqhd,bshd->bhqs", q, kv[i, 0]) / 8.0
            s = jnp.where(jnp.arange(kv.shape[3]) <= pos, s, -1e30)
            x = x + jnp.einsum("bhqs,bshd->bqhd", jax.nn.softmax(s, -1), kv[i, 1]).reshape(
                b, 1, h * d) @ w["o"][i]
        return kv, x

    def cache(length):
        return jax.ShapeDtypeStruct((layers, 2, b, length, h, d), jnp.float32)

    x, pos = jnp.ones((b, 1, e)), jnp.int32(3)
    long = preflight.preflight_step(decode, w, cache(2048), x, pos, target="40MiB")
    assert long.verdict == "will not fit"
    assert "Try: a smaller kv (32.00 MiB" in long.advice and "shorter maximum length" in long.advice
    assert "Its outputs alone" not in long.advice  # the cache's output is the donated cache
    assert preflight.preflight_step(decode, w, cache(512), x, pos, target="40MiB").verdict == \
        "fits"


def _sbx_mlp(p, x):
    return jax.nn.relu(x @ p["w1"]) @ p["w2"]


def _sbx_train(steps, data, qf, actor):
    for i in range(steps):  # sbx 0.7.0's _train: one update per gradient step, unrolled
        def window(x, i=i):
            return x[16 * i:16 * (i + 1)]  # one width, a new start: not a shape that changes
        obs, act = window(data["obs"]), window(data["act"])
        gq = jax.grad(_sbx_critic_loss)(qf, obs, act)
        qf = jax.tree.map(lambda p, g: p - 3e-4 * g, qf, gq)
        ga = jax.grad(_sbx_actor_loss)(actor, qf, obs)
        actor = jax.tree.map(lambda p, g: p - 3e-4 * g, actor, ga)
    return qf, actor


def _sbx_critic_loss(q, obs, act):
    return jnp.mean(_sbx_mlp(q, jnp.concatenate([obs, act], 1)) ** 2)


def _sbx_actor_loss(a, qf, obs):
    return -jnp.mean(_sbx_mlp(qf, jnp.concatenate([obs, jnp.tanh(_sbx_mlp(a, obs))], 1)))


def test_sbx_14_a_loop_of_updates_each_with_its_own_grad_is_not_told_to_checkpoint():
    """araffin/sbx#14 (a new user's trial): a Python loop of gradient steps inside jit, each
    with its own jax.grad, over fixed-width windows of the batch. The unrolled loop is named
    with fori_loop (the PR's fix); but the kit also said the windows were "a shape that changes
    with k", and that the backward pass needs each iteration's values, with a jax.checkpoint
    that changed nothing. Neither is said now; a loop under one grad still gets it (jax#14056,
    Olmax#25)."""
    data = {"obs": jnp.ones((16 * 12, 8)), "act": jnp.ones((16 * 12, 2))}
    qf = {"w1": jnp.ones((10, 32)) * 0.1, "w2": jnp.ones((32, 1)) * 0.1}
    actor = {"w1": jnp.ones((8, 32)) * 0.1, "w2": jnp.ones((32, 2)) * 0.1}
    p = preflight.preflight_step(functools.partial(_sbx_train, 12), data, qf, actor)
    advice = " ".join([p.advice, *p.notes]) if hasattr(p, "notes") else p.advice
    assert "unrolled" in advice and "fori_loop" in advice, advice
    assert "a shape that changes with k" not in advice, advice
    from helpers._internal import jaxpr_loops  # windows of one width over two arrays

    train = functools.partial(_sbx_train, 12)
    assert jaxpr_loops.sliced_lines(jax.make_jaxpr(train)(data, qf, actor)) == set()
    assert "put jax.checkpoint on the scan's body" not in advice
    assert "Under the derivative the backward pass needs each iteration's values" not in advice


def _optimistix_residual(y, a):
    return y - 0.1 * jnp.tanh(a * y) + 0.05 * (jnp.roll(y, 1, axis=0) + jnp.roll(y, -1, axis=0)) - 1


def _optimistix_newton(dense: bool):
    def newton(y0, a):
        def body(carry):
            y, i = carry
            f = _optimistix_residual(y, a)
            if dense:  # optimistix's default Newton: the whole Jacobian, LU-solved
                J = jax.jacfwd(_optimistix_residual)(y, a).reshape(y.size, y.size)
                dy = jnp.linalg.solve(J, -f.reshape(-1)).reshape(y.shape)
            else:  # the thread's fix, matrix-free: J only through jvp
                dy, _ = jax.scipy.sparse.linalg.gmres(
                    lambda v: jax.jvp(lambda z: _optimistix_residual(z, a), (y,), (v,))[1], -f,
                    tol=1e-8)
            return y + dy, i + 1
        return jax.lax.while_loop(lambda c: c[1] < 8, body, (y0, 0))[0]
    return newton


def test_optimistix_93_a_jacobian_made_only_for_a_linear_solve_is_named_with_a_krylov_solve():
    """patrick-kidger/optimistix#93 (a new user's trial): Newton's dense solve made the whole
    Jacobian of a [1000, 1, 1000, 3, 2] field (77 TB); the kit listed the values and said "a
    smaller batch; jax.checkpoint", neither of which applies (checkpoint tried: unchanged). It
    names the Jacobian made only for the solve now, and the matrix-free fix, which needs a
    fraction of the memory and finds the same root."""
    y0, a = jnp.zeros((12, 1, 12, 3, 2)), jnp.float32(2.0)
    p = preflight.preflight_step(_optimistix_newton(True), y0, a)
    (mode, what, nbytes, line, solve_line), = p.jacobian_solves
    assert (mode, what, nbytes) == ("forward", "float32[864, 864]", 864 * 864 * 4)
    assert "jax.jacfwd(_optimistix_residual)" in line and "jnp.linalg.solve(J" in solve_line
    assert "only to solve one linear system with it" in p.advice and "optimistix#93" in p.advice
    assert "jax.jvp(f, (y,), (v,))[1]" in p.advice
    fixed = preflight.preflight_step(_optimistix_newton(False), y0, a)
    assert fixed.jacobian_solves == () and 4 * fixed.peak_bytes < p.peak_bytes
    root = jax.jit(_optimistix_newton(True))(y0, a)
    assert np.allclose(jax.jit(_optimistix_newton(False))(y0, a), root, atol=1e-4)
    assert np.allclose(_optimistix_residual(root, a), 0, atol=1e-5)


def _messages(x, src, dst):  # message passing: a row of x for every edge, summed into dst
    return jnp.zeros_like(x).at[dst].add(x[src])


def _messages_in_chunks(x, src, dst):
    def body(total, edges):
        s, d = edges
        return total.at[d].add(x[s]), None
    return jax.lax.scan(body, jnp.zeros_like(x), (src.reshape(-1, 2048), dst.reshape(-1, 2048)))[0]


def test_jax_1979_a_gather_of_a_row_per_edge_summed_back_is_named_with_chunks_of_edges():
    """jax-ml/jax#1979 (a new user's trial, a graph network's messages): x[src] with 16 edges a
    node made a value 16 times the node table, which the kit listed with its line and no
    cause or fix. It names the value per edge and the chunked scan, which gives the same sums
    from a fraction of the memory."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(1024, 32)), jnp.float32)
    src, dst = (jnp.asarray(rng.integers(0, 1024, 16384), jnp.int32) for _ in range(2))
    p = preflight.preflight_step(_messages, x, src, dst)
    table, what, nbytes, line, per_edge = p.edge_gather
    assert (table, what, nbytes) == ("float32[1024, 32]", "float32[16384, 32]", 2 * 2**20)
    assert "x[src]" in line and "one row per edge" in p.advice and "jax-ml/jax#1979" in p.advice
    fixed = preflight.preflight_step(_messages_in_chunks, x, src, dst)
    assert fixed.edge_gather is None and 2 * fixed.peak_bytes < p.peak_bytes
    np.testing.assert_allclose(jax.jit(_messages_in_chunks)(x, src, dst),
                               jax.jit(_messages)(x, src, dst), rtol=1e-4, atol=1e-4)
    few = preflight.preflight_step(_messages, x, src[:2048], dst[:2048])  # 2 edges a node
    assert few.edge_gather is None
    # an embedding's gradient scatter-adds a row per token: no sum the user wrote
    embed = preflight.preflight_step(jax.grad(lambda table, ids: (table[ids] ** 2).sum()), x, src)
    assert embed.edge_gather is None


def _rbf(a, b):
    return jnp.exp(-0.5 * jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, -1))


def _gp_variance(X, Xs, full: bool):
    L = jnp.linalg.cholesky(_rbf(X, X) + 1e-3 * jnp.eye(X.shape[0]))
    v = jax.scipy.linalg.solve_triangular(L, _rbf(X, Xs), lower=True)
    return 1.0 - (jnp.diag(v.T @ v) if full else jnp.sum(v * v, axis=0))


def test_gpjax_389_a_product_made_only_for_its_diagonal_is_named_with_an_einsum():
    """thomaspinder/GPJax#389 (a new user's trial): a predictive variance as the diagonal of the
    full m x m covariance; the kit listed the m x m value and, past the card, "a smaller batch".
    It names the product made for its diagonal and the sum that makes none, which gives the
    same variances."""
    X, Xs = jnp.linspace(0, 1, 128)[:, None], jnp.linspace(0, 1, 2048)[:, None]
    p = preflight.preflight_step(functools.partial(_gp_variance, full=True), X, Xs)
    (what, nbytes, line, at), = p.diagonal_products
    assert (what, nbytes) == ("float32[2048, 2048]", 2048 * 2048 * 4) and "v.T @ v" in line
    assert "only for its diagonal" in p.advice and "jnp.sum(A * A, axis=0)" in p.advice
    assert "GPJax#389" in p.advice
    fixed = preflight.preflight_step(functools.partial(_gp_variance, full=False), X, Xs)
    assert fixed.diagonal_products == () and 2 * fixed.peak_bytes < p.peak_bytes
    np.testing.assert_allclose(jax.jit(_gp_variance, static_argnums=2)(X, Xs, False),
                               jax.jit(_gp_variance, static_argnums=2)(X, Xs, True), atol=1e-4)


def _gp_sample(x, y, key):
    K = _rbf(x, x) + 1e-5 * jnp.eye(x.shape[0])  # a value over every pair of rows...
    L = jnp.linalg.cholesky(K)  # ...factored whole
    return L @ jax.random.normal(key, (x.shape[0],), x.dtype) + y.mean()


def test_tinygp_24_a_kernel_matrix_factored_whole_gets_no_row_chunks_and_x64_is_explained():
    """dfm/tinygp#24 and #48 (a new user's trial): the kit told a GP's kernel matrix, which a
    Cholesky factors whole, to be made "a chunk of rows at a time" with lax.map (tried: the
    step's temporaries unchanged), and offered float32 for a step whose Cholesky is why x64 is
    on (in float32 the trial's sample was all NaN)."""
    with jax.enable_x64(True):
        x = jnp.linspace(0, 10, 1024, dtype=jnp.float64)[:, None]
        y = jnp.ones(2**18, jnp.float64)  # the observations: 2 MiB of float64 arguments
        p = preflight.preflight_step(_gp_sample, x, y, jax.random.key(0))
    assert "jax.lax.map(row" not in p.advice and "a chunk of" not in p.advice, p.advice
    assert "This step factors a matrix" in p.advice and "tinygp#24" in p.advice, p.advice
    # (a pairwise value reduced, factored by nothing, is still named: the jax#7856 tests)


def _newton_one(y, a):  # one point's Newton step: a 3 x 3 Jacobian, solved
    J = jax.jacfwd(lambda z: z ** 3 + a * z - 1.0)(y)
    return y - jnp.linalg.solve(J, y ** 3 + a * y - 1.0)


def _laplace(theta):  # a Laplace approximation's covariance: the inverse Hessian itself
    return jnp.linalg.inv(jax.hessian(lambda t: jnp.sum(jnp.log1p(jnp.exp(t)) + t ** 2))(theta))


def _rollout_buffer(obs):  # sized from the batch: 64 steps of its rows, two of its widths
    n, d = obs.shape
    return {"buf": jnp.zeros((64 * n, 2 * d)), "obs": obs}


def _maml(w, x):  # MAML: the outer gradient differentiates through every inner step
    def inner(w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def adapted(w):
        for _ in range(24):
            w = w - 0.01 * jax.grad(inner)(w)
        return inner(w)
    return jax.grad(adapted)(w)


def _fixed_split(w, data):
    for i in range(48):  # one update per minibatch, obs and act split off one array
        obs, act = data[i, :, :8], data[i, :, 8:]
        w = w - 0.1 * (obs.T @ (obs @ w - act))
    return w


def test_a_review_s_false_positives_of_the_day_s_notes_stay_quiet():
    """A review of the day's notes confirmed each of these with a script: a vmapped batch of
    small Newton solves told "no smaller batch shrinks it" (one does); an inverse Hessian that
    is the result told to solve matrix-free; a buffer sized from the batch's shape called "a
    number in the code"; MAML's inner grads under an outer one read as a grad per iteration,
    which dropped the checkpoint advice; a fixed split of each iteration's array called "a
    shape that changes with k"."""
    from helpers._internal import jaxpr_loops

    batched = preflight.preflight_step(jax.vmap(_newton_one, in_axes=(0, None)),
                                       jnp.ones((2048, 3)), 2.0)
    assert batched.jacobian_solves == () and "only to solve one linear system" not in \
        batched.advice
    assert preflight.preflight_step(_laplace, jnp.zeros(256)).jacobian_solves == ()
    obs = jax.ShapeDtypeStruct((1024, 256), jnp.float32)
    c = compiled.compile_step(_rollout_buffer, obs)
    assert program_notes.sized_in_code(c.outputs(), c.temporaries(), ((obs,), {})) == ""
    p = preflight.preflight_step(_maml, jnp.ones((64, 64)) * 0.01, jnp.ones((128, 64)))
    assert "put jax.checkpoint on the scan's body" in p.advice, p.advice
    split = jax.make_jaxpr(_fixed_split)(jnp.zeros((8, 2)), jnp.ones((48, 16, 10)))
    assert jaxpr_loops.sliced_lines(split) == set()


def _prefix_sums(x):
    return jnp.stack([x[:k].sum() for k in range(1, 33)])  # slices that grow with k


def _init_buffer(key, w):  # a replay buffer sized in code, beside a 64-wide layer
    return {"data": jnp.zeros((30_000_000, 443), jnp.float32), "w": w * 1.0, "key": key}


def _penalized_critic_loss(q, obs, act):  # a gradient penalty: a derivative inside the loss
    x = jnp.concatenate([obs, act], 1)
    penalty = jnp.mean(jax.grad(lambda z: _sbx_mlp(q, z).sum())(x) ** 2)
    return jnp.mean(_sbx_mlp(q, x) ** 2) + penalty


def test_a_second_review_s_cases_of_the_day_s_notes(monkeypatch):
    """A second review, each case confirmed by its script: a buffer of 30,000,000 rows beside a
    64-wide layer counted as "a multiple of an argument's dimension" (the mujoco#1431 note
    lost); a loop of updates whose loss takes a derivative itself read as one derivative over
    the loop (the sbx#14 fix undone); slices that grow with k called a fixed split when made
    twice (two calls, or under jax.jvp); the superdiagonal jnp.diag(M, k=1) given the main
    diagonal's einsum."""
    from helpers._internal import jaxpr_loops

    key, w = jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((64, 64), jnp.float32)
    p = preflight.preflight_step(_init_buffer, key, w, target="RTX 4090")
    assert "takes none of its dimensions from the step's arguments" in p.advice, p.advice
    monkeypatch.setattr(sys.modules[__name__], "_sbx_critic_loss", _penalized_critic_loss)
    data = {"obs": jnp.ones((16 * 12, 8)), "act": jnp.ones((16 * 12, 2))}
    qf = {"w1": jnp.ones((10, 32)) * 0.1, "w2": jnp.ones((32, 1)) * 0.1}
    actor = {"w1": jnp.ones((8, 32)) * 0.1, "w2": jnp.ones((32, 2)) * 0.1}
    gp = preflight.preflight_step(functools.partial(_sbx_train, 12), data, qf, actor)
    assert "fori_loop" in gp.advice and "put jax.checkpoint on the scan's body" not in gp.advice
    x = jnp.ones(32)
    for f, args in ((lambda x, y: _prefix_sums(x) + _prefix_sums(y), (x, x)),
                    (lambda x: jax.jvp(_prefix_sums, (x,), (x,)), (x,))):
        assert jaxpr_loops.sliced_lines(jax.make_jaxpr(f)(*args)), f
    X, Y = jnp.ones((2048, 16)), jnp.ones((16, 2048))
    assert preflight.preflight_step(lambda X, Y: jnp.diag(X @ Y, k=1), X, Y
                                    ).diagonal_products == ()


# --- a whole Hessian made only for its diagonal, and jacfwd of jacfwd -------------------------
def _logpsi(w, x):  # a small network of all the coordinates at once
    return jnp.tanh(jnp.tanh(x @ w["w1"]) @ w["w2"]) @ w["w3"]


def _laplacians_whole(w, xs):  # netket's kinetic energy before #1655: the diagonal of a Hessian
    def one(x):
        return jnp.sum(jnp.diag(jax.jacfwd(jax.jacrev(lambda y: _logpsi(w, y)))(x)))
    return jax.vmap(one)(xs)


def _laplacians_one_tangent_at_a_time(w, xs):  # the thread's fix: one HVP per coordinate
    def one(x):
        g = jax.grad(lambda y: _logpsi(w, y))
        def body(i, acc):
            return acc + jax.jvp(g, (x,), (jnp.zeros_like(x).at[i].set(1.0),))[1][i]
        return jax.lax.fori_loop(0, x.shape[0], body, 0.0)
    return jax.vmap(one)(xs)


def test_netket_1655_a_hessian_made_only_for_its_diagonal_is_named_with_one_tangent_at_a_time():
    """netket/netket#1655 (a new user's trial, a Laplacian of log psi under vmap over samples):
    the kit blamed only the user's vmap ("jax.lax.map(f, xs, batch_size=k)"), which left the
    step growing with the coordinates. It names the Hessian kept for its diagonal now, and the
    thread's fix, which needs a fraction of the temporaries and gives the same Laplacians."""
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    w = {"w1": jax.random.normal(k[0], (48, 128)) / 7, "w2": jax.random.normal(k[1], (128, 128))
         / 11, "w3": jax.random.normal(k[2], (128,)) / 11}
    xs = jax.random.normal(k[3], (64, 48))
    p = preflight.preflight_step(_laplacians_whole, w, xs)
    (mode, what, nbytes, line, at), = p.jacobian_diagonals
    assert (mode, what, nbytes) == ("forward", "float32[64, 48, 48]", 64 * 48 * 48 * 4)
    assert "jnp.diag(jax.jacfwd(jax.jacrev(" in line
    assert "The step makes the whole Hessian at" in p.advice and "a batch of 64" in p.advice
    assert "only to keep its diagonal" in p.advice and "n = 48" in p.advice
    assert "jax.lax.fori_loop over i adding jax.jvp(jax.grad(f)" in p.advice
    assert "netket/netket#1655" in p.advice and "jax.lax.map(f, xs" not in p.advice
    fixed = preflight.preflight_step(_laplacians_one_tangent_at_a_time, w, xs)
    assert fixed.jacobian_diagonals == ()
    assert 4 * fixed.largest_temporaries[0].nbytes < p.largest_temporaries[0].nbytes
    assert 2 * fixed.temp_bytes < p.temp_bytes
    np.testing.assert_allclose(jax.jit(_laplacians_one_tangent_at_a_time)(w, xs),
                               jax.jit(_laplacians_whole)(w, xs), rtol=1e-4, atol=1e-4)


def _u_points(w, t):  # a network applied to each collocation point, all at once
    h = jnp.tanh(t[:, None] @ w["w1"])
    return (jnp.tanh(h @ w["w2"]) @ w["w3"])[:, 0]


def _residual_hessian_diagonal(w, t):  # jax#3801: u_tt as the diagonal of the whole Hessian
    u_tt = jnp.diag(jax.hessian(lambda s: jnp.sum(_u_points(w, s)))(t))
    return jnp.mean((u_tt + 400.0 * _u_points(w, t)) ** 2)


def _residual_per_point(w, t):  # the thread's fix: vmap of grad of grad of one point's u
    def one(s):
        return _u_points(w, s[None])[0]
    u_tt = jax.vmap(jax.grad(jax.grad(one)))(t)
    return jnp.mean((u_tt + 400.0 * _u_points(w, t)) ** 2)


def test_jax_3801_a_pinn_s_second_derivatives_from_a_whole_hessian_are_named_with_vmap_of_grad():
    """jax-ml/jax#3801 (a new user's trial, a PINN's u_tt as jnp.diag(jax.hessian(...))): the
    kit advised HVPs over the basis in chunks, which the trial ran: 611 to 437 MiB. The thread's
    fix, vmap of grad of grad of one point, is named now; run: the same loss and gradient from
    a fraction of the temporaries."""
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    w = {"w1": jax.random.normal(k[0], (1, 16)), "w2": jax.random.normal(k[1], (16, 16)) / 4,
         "w3": jax.random.normal(k[2], (16, 1)) / 4}
    t = jnp.linspace(0.0, 1.0, 256)
    p = preflight.preflight_step(jax.grad(_residual_hessian_diagonal), w, t)
    (mode, what, nbytes, line, at), = p.jacobian_diagonals
    assert (mode, what) == ("forward", "float32[256, 256]") and "jax.hessian(" in line
    assert "jax.vmap(jax.grad(jax.grad(u_point)))" in p.advice and "jax-ml/jax#3801" in p.advice
    assert "basis vectors at once, under the vmap of" not in p.advice  # (the fix is above)
    fixed = preflight.preflight_step(jax.grad(_residual_per_point), w, t)
    assert fixed.jacobian_diagonals == () and 8 * fixed.temp_bytes < p.temp_bytes
    np.testing.assert_allclose(jax.jit(_residual_per_point)(w, t),
                               jax.jit(_residual_hessian_diagonal)(w, t), rtol=1e-4)


def _lagrangian(x, lam, a):
    return jnp.sum((x - 1.0) ** 2) + lam @ (jnp.sin(a @ x) - x[:lam.shape[0]] ** 3)


def test_discopt_924_jacfwd_of_jacfwd_is_named_as_pairs_of_tangents_with_forward_over_reverse():
    """jkitchin/discopt#924 (a new user's trial): jax.jacfwd(jax.jacfwd(L)) made an m x n x n
    value, which the kit blamed on "a vmap", with jax.lax.map(f, xs, ...) advice for a step that
    has no xs (WRONG). It names the n x n pairs of tangents and forward-over-reverse now; run:
    the same Hessian from a fraction of the temporaries."""
    n, m = 96, 90
    k = jax.random.split(jax.random.PRNGKey(2), 3)
    a = jax.random.normal(k[0], (m, n)) / 10
    x, lam = jax.random.normal(k[1], (n,)), jax.random.normal(k[2], (m,))
    def fwd_fwd(x, lam, a):
        return jax.jacfwd(jax.jacfwd(_lagrangian))(x, lam, a)
    p = preflight.preflight_step(fwd_fwd, x, lam, a)
    assert f"{n * n:,} = {n} x {n} pairs of basis vectors at once" in p.advice, p.advice
    assert "jax.jacfwd(jax.grad(f))" in p.advice and "discopt#924" in p.advice
    assert "under jax.vmap for every element of the batch" not in p.advice
    def fwd_rev(x, lam, a):
        return jax.jacfwd(jax.grad(_lagrangian))(x, lam, a)
    fixed = preflight.preflight_step(fwd_rev, x, lam, a)
    assert "pairs of basis vectors" not in fixed.advice and 8 * fixed.temp_bytes < p.temp_bytes
    np.testing.assert_allclose(jax.jit(fwd_rev)(x, lam, a), jax.jit(fwd_fwd)(x, lam, a),
                               rtol=1e-3, atol=1e-3)


def test_openpi_284_a_step_short_of_the_pool_only_is_told_the_fraction_that_fits():
    """Physical-Intelligence/openpi#284 (a new user's trial): a LoRA step 0.92 GiB short of a
    24 GB card's pool (0.75 of it, XLA's default) was told a smaller batch and the like, never
    the pool's share, the thread's fix (XLA_PYTHON_CLIENT_MEM_FRACTION=0.9). The fraction that
    fits is named now, and the target so set fits; a step larger than the card gets none."""
    step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum(0))
    w = jax.ShapeDtypeStruct((2048, 2048), jnp.float32)  # 16 MiB
    x = jax.ShapeDtypeStruct((4096, 2048), jnp.float32)  # 32 MiB
    need = preflight.preflight_step(step, w, x, target=2**30).needed_bytes  # (by JAX version)
    card = int(need / 0.82)  # the step needs 0.82 of the card: more than the pool's 0.75
    p = preflight.preflight_step(step, w, x, target=card)
    assert p.verdict == "will not fit" and 0.75 * card < p.needed_bytes < 0.9 * card, p
    found = re.search(r"XLA_CLIENT_MEM_FRACTION=(0\.\d+) \(never beside", p.advice)
    assert found and "openpi#284" in p.advice and "it takes 0.75 of " in p.advice
    fixed = preflight.preflight_step(step, w, x, target=allocation.target(
        card, fraction=float(found.group(1))))
    assert fixed.verdict == "fits", fixed
    big = preflight.preflight_step(step, w, x, target=int(need / 0.97))  # over 0.95 of it
    assert big.verdict == "will not fit" and "XLA_CLIENT_MEM_FRACTION" not in big.advice


def _top_p(logits, key, p=0.9):  # keras-hub#963's sampler: the whole vocabulary sorted
    probs = jax.nn.softmax(logits, -1)
    order = jnp.argsort(-probs, axis=-1)
    sorted_p = jnp.take_along_axis(probs, order, -1)
    keep = (jnp.cumsum(sorted_p, -1) - sorted_p) < p
    choice = jax.random.categorical(key, jnp.where(keep, jnp.log(sorted_p), -jnp.inf), -1)
    return jnp.take_along_axis(order, choice[:, None], -1)[:, 0]


def _top_p_of_top_k(logits, key, p=0.9, k=64):  # the k largest first (as PR #980)
    top, index = jax.lax.top_k(jax.nn.softmax(logits, -1), k)  # (over the whole vocabulary)
    keep = (jnp.cumsum(top, -1) - top) < p
    choice = jax.random.categorical(key, jnp.where(keep, jnp.log(top), -jnp.inf), -1)
    return jnp.take_along_axis(index, choice[:, None], -1)[:, 0]


def test_keras_hub_963_a_whole_sort_for_a_top_p_cutoff_is_named_with_top_k_first():
    """keras-team/keras-hub#963 (a new user's trial): a top-p sampler sorted the whole
    vocabulary each step; the kit listed the sort only as memory (an rbg key, an unstable
    sort: the trial ran them, 130 to 115 ms). It names the sort for a cumulative cutoff now,
    and the thread's fix, which samples the same token where the nucleus lies in the k."""
    logits = jax.random.normal(jax.random.key(1), (8, 50304)) * 8  # a nucleus of a few tokens
    key = jax.random.key(2)
    p = preflight.preflight_step(_top_p, logits, key)
    (what, n, line, at), = p.cumulative_cutoffs
    assert (what, n) == ("float32[8, 50304]", 50304) and "jnp.argsort(-probs" in line
    assert "jnp.cumsum(sorted_p" in at
    assert "for a cutoff by cumulative mass" in p.advice and "jax.lax.top_k(probs, k)" in p.advice
    assert "keras-hub#963" in p.advice
    assert preflight.preflight_step(_top_p_of_top_k, logits, key).cumulative_cutoffs == ()
    probs = np.asarray(jax.nn.softmax(logits, -1))
    for q in probs:  # the same nucleus, row by row
        order = np.argsort(-q)
        whole = set(order[(np.cumsum(q[order]) - q[order]) < 0.9])
        top = order[:64]
        assert whole == set(top[(np.cumsum(q[top]) - q[top]) < 0.9]) and len(whole) < 64


def test_review_a_diagonal_by_trace_a_jacobian_a_gradient_s_hessian_and_a_small_n():
    """A review of the diagonal note: jnp.trace of a Hessian (a Laplacian written the usual
    way) was missed; a Jacobian of a vector function was told jax.grad(f), which raises for it;
    jacfwd of a gradient made on another line was called a Jacobian; a 3 x 3 Hessian got the
    note. Each, run."""
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    w = {"w1": jax.random.normal(k[0], (48, 128)) / 7, "w2": jax.random.normal(k[1], (128, 128))
         / 11, "w3": jax.random.normal(k[2], (128,)) / 11}
    xs = jax.random.normal(jax.random.key(4), (64, 48))

    def laplacian_by_trace(w, xs):
        return jax.vmap(lambda x: jnp.trace(jax.hessian(lambda y: _logpsi(w, y))(x)))(xs)

    p = preflight.preflight_step(laplacian_by_trace, w, xs)
    assert p.jacobian_diagonals and "The step makes the whole Hessian" in p.advice, p.advice
    assert "jax.lax.map(f, xs" not in p.advice

    def vector_f(x):
        return jnp.tanh(x @ w["w2"][:48, :48])

    def jacobian_diagonal(xs):
        return jax.vmap(lambda x: jnp.diag(jax.jacfwd(vector_f)(x)))(xs)

    p = preflight.preflight_step(jacobian_diagonal, xs)
    assert "The step makes the whole Jacobian" in p.advice, p.advice
    assert "jax.jvp(f, (x,), (e_i,))[1][i]" in p.advice and "jax.grad(f)" not in p.advice
    x0 = xs[0]
    column = [jax.jvp(vector_f, (x0,), (jnp.zeros(48).at[i].set(1.0),))[1][i] for i in (0, 7)]
    np.testing.assert_allclose(column, jnp.diag(jax.jacfwd(vector_f)(x0))[jnp.array([0, 7])],
                               rtol=1e-5)  # the advice runs, and gives the diagonal

    def hessian_of_a_gradient(w, xs):
        g = jax.grad(lambda y: _logpsi(w, y))
        return jax.vmap(lambda x: jnp.diag(jax.jacfwd(g)(x)))(xs)

    p = preflight.preflight_step(hessian_of_a_gradient, w, xs)
    assert "The step makes the whole Hessian" in p.advice, p.advice

    def small(xs):  # a 3-D Laplacian: 3 x 3 Hessians, nothing worth computing alone
        return jax.vmap(lambda x: jnp.diag(jax.hessian(lambda y: jnp.sum(jnp.sin(y) ** 2))(x)))(xs)

    assert preflight.preflight_step(small, jnp.ones((4096, 3))).jacobian_diagonals == ()


def test_a_note_that_drops_the_generic_tips_keeps_the_pool_fraction():
    """A review: where a note names the fix (a Jacobian for a solve or for its diagonal) the
    generic tips were dropped, and the pool's fraction with them, though it may be the one
    that fits the step."""
    pool = "a larger share (XLA_CLIENT_MEM_FRACTION=0.85)"
    advice = f"needs 9 GiB, 8 GiB free on X. Try: {pool}; a smaller batch"
    assert preflight._only_pool_tip(advice, pool) == f"needs 9 GiB, 8 GiB free on X. Try: {pool}."
    assert preflight._only_pool_tip(advice, "") == "needs 9 GiB, 8 GiB free on X."


def test_skyrl_514_k_and_v_repeated_up_to_the_query_heads_are_named_with_native_gqa():
    """NovaSky-AI/SkyRL#514: grouped-query attention made K and V as wide as the query heads
    with jnp.repeat ("blow up the K and V matrices"); jax.nn.dot_product_attention takes them
    with fewer heads (the PR). preflight_step listed the two repeats, 89% of the peak, with no
    word, and under a budget advised a smaller batch, which did not fit (a trial). The fix it
    names, run: the same output, without the copies; its einsum form too."""
    b, s, hq, hkv, d = 2, 512, 32, 4, 64

    def attend_repeat(q, k, v):
        k = jnp.repeat(k, hq // hkv, axis=2)
        v = jnp.repeat(v, hq // hkv, axis=2)
        return jax.nn.dot_product_attention(q, k, v)

    def attend_native(q, k, v):
        return jax.nn.dot_product_attention(q, k, v)

    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, 4, hq, d))
    k, v = (jax.random.normal(kk, (b, s, hkv, d)) for kk in keys[1:])
    p = preflight.preflight_step(attend_repeat, q, k, v)
    assert [r[2] for r in p.repeated_operands] == [8, 8]
    assert p.repeated_operands[0][1] == b * s * hq * d * 4  # 8 MiB each, 8x the cache
    assert "jax.nn.dot_product_attention(q, k, v) takes K and V with fewer heads" in p.advice
    assert "SkyRL#514" in p.advice
    fixed = preflight.preflight_step(attend_native, q, k, v)
    assert fixed.repeated_operands == () and "SkyRL#514" not in fixed.advice
    np.testing.assert_allclose(attend_native(q, k, v), attend_repeat(q, k, v), atol=1e-5)
    grouped = q.reshape(b, 4, hkv, hq // hkv, d)  # the einsum form the note gives
    scores = jnp.einsum("btkgd,bskd->bkgts", grouped, k)
    wide = jnp.einsum("bthd,bshd->bhts", q, jnp.repeat(k, hq // hkv, axis=2))
    np.testing.assert_allclose(scores.reshape(b, hq, 4, s), wide, rtol=1e-5, atol=1e-4)
    def repeat_kv(x, n):  # Llama's form: a size-1 axis broadcast, then merged (a review)
        b_, s_, h_, d_ = x.shape
        return jnp.broadcast_to(x[:, :, :, None, :], (b_, s_, h_, n, d_)).reshape(
            b_, s_, h_ * n, d_)

    llama = preflight.preflight_step(
        lambda q, k, v: jax.nn.dot_product_attention(q, repeat_kv(k, 8), repeat_kv(v, 8)),
        q, k, v)
    assert [r[2] for r in llama.repeated_operands] == [8, 8]
    tiled = preflight.preflight_step(  # jnp.tile's copies are another layout: no word
        lambda q, k: jnp.einsum("bthd,bshd->bhts", q, jnp.tile(k, (1, 1, hq // hkv, 1))), q, k)
    assert tiled.repeated_operands == ()


def test_a_vmapped_update_written_into_a_donated_cache_gets_no_chunking_advice():
    """apple/axlearn#1068's fix (a vmapped dynamic_update_slice into the KV cache, donated):
    32 B of temporaries, yet "3 values ... made under jax.vmap ... jax.lax.map(f, xs,
    batch_size=k)" of its outputs, which a trial ran: the peak rose from 8 to 18 MiB. An
    output is no value chunks shrink."""
    upd = jax.vmap(lambda c, u, t: jax.lax.dynamic_update_slice_in_dim(c, u, t, axis=0))

    def extend(ck, cv, k, v, t):
        return upd(ck, k, t), upd(cv, v, t)

    cache = jax.ShapeDtypeStruct((2, 2048, 4, 32), jnp.float32)
    step = jax.ShapeDtypeStruct((2, 2048, 4, 32), jnp.float32)
    t = jax.ShapeDtypeStruct((2,), jnp.int32)
    p = preflight.preflight_step(extend, cache, cache, step, step, t, donate_argnums=(0, 1))
    assert p.temp_bytes < 2**20 and "made under jax.vmap" not in p.advice, p.advice
    assert "jax.lax.map(f, xs" not in p.advice


def test_blackjax_1007_a_diagonal_matrix_made_for_a_product_is_named_with_a_row_scale():
    """blackjax-devs/blackjax#1007: Pathfinder's L-BFGS made N x N matrices with jnp.diag(alpha)
    @ Z under a vmap, and ran out of memory at 200k parameters; PR #1008 scaled the rows
    (alpha[:, None] * Z). The kit blamed the vmap and advised lax.map, which at batch_size=1
    still held the matrices (a trial). The fix it names, run: the same product, no matrix."""
    n, k = 512, 6

    def body(alpha, z, g):
        return jnp.diag(jnp.sqrt(alpha)) @ z, jnp.diag(alpha) @ g

    def fixed(alpha, z, g):
        return jnp.sqrt(alpha)[:, None] * z, alpha * g

    keys = jax.random.split(jax.random.key(0), 3)
    alpha = jax.random.uniform(keys[0], (8, n)) + 0.5
    z, g = jax.random.normal(keys[1], (8, n, k)), jax.random.normal(keys[2], (8, n))
    p = preflight.preflight_step(jax.vmap(body), alpha, z, g)
    assert len(p.diagonal_matrices) == 2 and p.diagonal_matrices[0][1] == 8 * n * n * 4
    assert "v[:, None] * M gives the same without the matrix" in p.advice
    assert "jnp.diag(v) @ g of a vector g is v * g" in p.advice  # (a review: not v[:, None])
    assert "The batch is not the cause" in p.advice
    one = preflight.preflight_step(lambda a, v: jnp.diag(a) @ v, alpha[0], g[0] + 1.0)
    said = one.advice
    if one.diagonal_matrices:  # one matrix, no batch: no word of one, nor of rows
        assert "v * g" in said and "v[:, None]" not in said and "The batch" not in said
    assert "blackjax#1007" in p.advice and "made under jax.vmap" not in p.advice
    after = preflight.preflight_step(jax.vmap(fixed), alpha, z, g)
    assert after.diagonal_matrices == () and after.temp_bytes * 8 < p.temp_bytes
    for a, b in zip(jax.vmap(body)(alpha, z, g), jax.vmap(fixed)(alpha, z, g), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    diagonal = preflight.preflight_step(lambda m: jnp.diag(m) * 2.0, jnp.ones((n, n)))
    assert diagonal.diagonal_matrices == ()  # jnp.diag of a matrix reads its diagonal


def test_tpu_inference_3439_weights_quantized_in_one_call_are_named_with_a_layer_per_call():
    """vllm-project/tpu-inference#3439: a whole model quantized to int8 in one jit with its
    weights donated ran out of memory: no int8 output can take a float buffer, so every
    original stayed beside its copy (the PR: a submodule per call). The kit wrote one "NOT
    reused" sentence per weight, twice over, and advised a smaller batch (a trial). One
    sentence now, with the PR's fix, run: a layer per call peaks far lower."""
    def quantize(params):
        def q(w):
            scale = jnp.max(jnp.abs(w)) / 127.0
            return (jnp.round(w / scale).astype(jnp.int8), scale)
        return jax.tree.map(q, params)

    w = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    model = {f"layers_{i}": {"wq": w, "wo": w} for i in range(4)}
    p = preflight.preflight_step(quantize, model, donate_argnums=0)
    assert p.advice.count("Donated but not reused") == 1
    assert "and 5 more (8.00 MiB)" in p.advice and "tpu-inference#3439" in p.advice
    layer = preflight.preflight_step(quantize, model["layers_0"], donate_argnums=0)
    assert "tpu-inference#3439" not in layer.advice  # one layer per call: the fix itself
    assert layer.peak_bytes * 3 < p.peak_bytes
