"""Problems JAX users reported in public threads, each reproduced in miniature and put to the kit
the way the user would have met it: the answer must name the thread's cause and its fix.
docs/user-reports.md is the table of them; a row marked "named" there has its test here (or, for
two processes, in tests/test_processes.py)."""

import functools
import gc
import inspect
import re
import sys
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import compiles, devices, errors, holders, memory, oom, preflight, settings, transfers
from helpers._internal import jaxcompat
from helpers.compile_causes import FUNCTION_FIX, INT_FIXES, INT_STATIC_FIX, WEAK_FIX
from helpers.units import format_bytes
from tests.conftest import x64

MiB = 2**20


def test_jax_10596_a_closed_over_array_is_a_constant_of_the_program():
    table = jax.random.normal(jax.random.key(0), (256 * 1024,))  # 1 MiB, global to the function
    # (not an arange: XLA turns a constant that counts up into an iota and holds nothing)

    def spectrum(x):
        return jnp.fft.rfft(x + table).real.sum()

    p = preflight.preflight_step(spectrum, jnp.ones(256 * 1024))
    assert p.constant_bytes == table.nbytes
    assert "baked into the compiled program as constants" in p.advice
    assert "pass them as arguments instead" in p.advice


def test_jax_11448_a_closed_over_array_a_loop_only_reduces_is_not_held():
    """The thread's leak was in JAX's cache (fixed); today XLA computes the loop's reduction
    of the closed-over array while compiling, the program holds a scalar, and the kit counts
    no constant (it reported the whole array before)."""
    data = jax.random.normal(jax.random.key(0), (1024 * 1024,))  # 4 MiB

    def g(p):
        return jax.lax.fori_loop(0, 2, lambda i, c: c + data.sum(), 0.0)

    p = preflight.preflight_step(g, True)
    assert p.constant_bytes == 0 and "closes over" not in p.advice
    def big():
        return sum(a.nbytes >= data.nbytes for a in jax.live_arrays())

    gc.collect()  # arrays an earlier test left in reference cycles would go mid-count
    before = big()
    for _ in range(3):  # and nothing is left alive after each function is gone
        jax.jit(lambda p: jax.lax.fori_loop(0, 2, lambda i, c: c + data.sum(), 0.0))(True)
    assert big() == before


def test_jax_3163_a_python_scalar_fed_back_compiles_twice_for_its_weak_type():
    """x = 0 starts a loop carry: weakly typed on the first call, the jitted output after it
    (np.int32 steps make the sum strong, as the thread's data did on jax 0.10.2)."""
    @jax.jit
    def my_fn(x, y):
        return x + y

    with compiles.watch() as log:
        x = 0
        for i in range(3):
            x = my_fn(x, np.int32(i))
    entry = log.function("my_fn")
    assert entry.compiles == 2 and entry.cause == "new dtypes"
    assert entry.fix == WEAK_FIX and "only the weak type changed" in log.diagnosis
    assert "np.int32(0)" in log.diagnosis


def test_jax_8409_a_vmapped_cond_runs_both_branches_and_the_fix_checkpoints_the_chunks():
    """vmap batches the cond's predicate: a select, both branches for every element; under
    jax.grad, lax.map(f, batch_size=k) alone made it worse (16 -> 40 MiB of temporaries,
    jax 0.10.2), lax.map(jax.checkpoint(f), batch_size=8) better (2 MiB)."""
    xs = jax.random.normal(jax.random.key(0), (64, 256))
    w = jax.random.normal(jax.random.key(1), (256, 256)) / 16

    def expensive(x, w):
        return jnp.tanh(x[:, None] * w).sum(0)  # a (256, 256) value per element

    def per_example(x, w):
        return jax.lax.cond(x[0] > 3.0, expensive, lambda x, w: x, x, w)

    def loss(w, xs):
        return jnp.sum(jax.vmap(per_example, (0, None))(xs, w))

    p = preflight.preflight_step(jax.grad(loss), w, xs)
    (t,) = [t for t in p.largest_temporaries if t.batched][:1]
    assert t.op == "select_n" and t.in_derivative and "lax.cond" in t.line
    assert "both branches run for every element" in p.advice
    assert "jax.lax.map(jax.checkpoint(f), xs, batch_size=k)" in p.advice
    assert "without batch_size" in p.advice


class _ArrayDataset:  # markean/aimz's: the arrays converted eagerly, kept as an attribute
    def __init__(self, *arrays):
        self.arrays = tuple(jnp.asarray(a) for a in arrays)


def test_aimz_168_a_dataset_converted_whole_is_found_by_its_line_bytes_and_holder():
    """The whole dataset went to the device at setup while the loader put each batch there
    anyway: the line and its bytes (the kit gave only a total), and who holds it (the kit
    stopped at 'a container: tuple[0]')."""
    x = np.ones((1 << 20, 8), np.float32)[:, 1:]  # 28 MiB, not 64-byte aligned: a copy
    with transfers.trace() as log:
        ds = _ArrayDataset(x)
    (row,) = [r for r in log.by_line() if "jnp.asarray(a)" in r["line"]]
    assert row["bytes"] == x.nbytes and format_bytes(x.nbytes) in str(log)
    h = holders.largest(1, namespace={"ds": ds})
    assert h.arrays[0].held_by[0].startswith("tuple ds.arrays[0]: a ")
    assert "`ds.arrays = None`" in h.arrays[0].fix


def test_jax_15924_a_committed_argument_compiles_the_step_again_and_is_named():
    """jax.device_put(x, sharding) commits x: the jitted step, first called with an
    uncommitted array of the same shape, compiles again, and JAX explains no cache miss (the
    kit used to say no function compiled more than once)."""
    @jax.jit
    def test(x):
        return x

    x = jnp.zeros((1,))
    with compiles.watch() as log:
        test(x)
        test(jax.device_put(np.zeros((1,)), x.sharding))  # committed to the same device
    entry = log.function("test")
    assert entry.compiles == 2 and entry.cause == "new placement"
    assert "No function compiled more than once" not in log.diagnosis
    assert "committed to a device or not" in log.diagnosis
    assert "put every call's arguments the same way" in log.diagnosis


def test_jax_3158_a_scan_that_returns_every_step_is_named():
    def simulate(x):
        def body(c, _):
            c = jnp.tanh(c @ c.T) * 0.5
            return c, c  # every step's state kept
        return jax.lax.scan(body, x, None, length=100)

    p = preflight.preflight_step(simulate, jnp.ones((256, 256)))
    assert p.scan_stacks[0].length == 100 and p.scan_stacks[0].nbytes == 100 * 256 * 256 * 4
    assert "keeps a value for each of its 100 steps, 25.00 MiB stacked" in p.advice
    assert "test_user_reports.py:" in p.advice and "Return less from the body" in p.advice


def test_jax_6040_a_device_put_inside_jit_that_does_nothing_is_named():
    cpu0, cpu1 = jax.devices()[:2]  # the session's simulated CPU devices (conftest)

    def f(x):
        return jax.device_put(x, cpu1) * 2  # the user meant: compute on cpu:1

    x = jnp.ones(1024)
    assert jax.jit(f)(x).devices() == {cpu0}  # what the thread saw: it stayed
    p = preflight.preflight_step(f, x)
    assert p.ignored_device_puts[0][0] == "cpu:1"
    assert "does nothing inside jit" in p.advice and "before the call" in p.advice


def test_jax_11036_which_donations_jax_and_xla_reuse():
    """The thread asked for a reshaped buffer to be reusable; JAX now offers a donated buffer to
    XLA for an output with as many elements, and XLA reuses it where the bytes match."""
    x = jnp.ones((10, 10, 10, 10))
    reshaped = preflight.preflight_step(lambda a: (a * 2).reshape(100, 100), x,
                                        donate_argnums=0)
    assert reshaped.donations[0].reused  # the thread's request, granted since
    halved = preflight.preflight_step(lambda a: a.astype(jnp.float16), x, donate_argnums=0)
    assert not halved.donations[0].reused and "bytes differ" in halved.donations[0].why
    with warnings.catch_warnings(record=True) as said:  # and JAX itself says nothing of it
        warnings.simplefilter("always")
        jax.jit(lambda a: a.astype(jnp.float16), donate_argnums=0)(jnp.ones((10, 10, 10, 10)))
    assert not [w for w in said if "donated" in str(w.message)]
    pair = preflight.preflight_step(lambda a, b: a + 1 + b.sum(), jnp.ones(100),
                                    jnp.ones(100, jnp.int32), donate_argnums=(0, 1))
    assert [d.reused for d in pair.donations] == [True, False]
    assert "already written into another donated argument" in pair.donations[1].why
    summed = preflight.preflight_step(lambda a: a.sum(), x, donate_argnums=0)
    assert not summed.donations[0].reused
    assert "nor has its 10,000 elements" in summed.donations[0].why
    assert "Donated but not reused" in summed.advice


def test_jax_3186_grad_of_scan_keeps_residuals_for_every_step():
    w = jnp.ones((64, 64)) / 64

    def loss(w, xs):
        h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros(64), xs)
        return h.sum()

    short = preflight.residuals(loss, w, jnp.ones((100, 64)))
    long = preflight.residuals(loss, w, jnp.ones((200, 64)))
    assert long.scan_bytes > 1.9 * short.scan_bytes  # grows with the scan's length
    assert "jax.checkpoint" in short.advice


def test_jax_1923_vmap_materialises_the_whole_batch_and_lax_map_is_named():
    keys, queries = jnp.ones((1024, 64)), jnp.ones((128, 64))

    def nearest(q):
        return jnp.sort((keys - q) ** 2, axis=0)[:8].sum()

    p = preflight.preflight_step(jax.vmap(nearest), queries)
    top = p.largest_temporaries[0]
    assert top.batched and top.nbytes == 128 * 1024 * 64 * 4 and "test_user_reports" in top.line
    assert "jax.lax.map(f, xs, batch_size=k) computes k elements" in p.advice
    assert not top.in_derivative and "jax.checkpoint(f)" not in p.advice  # no derivative here
    # and the fix does what the advice says: 16 at a time, 1/8 of the batch's 128
    fixed = preflight.preflight_step(lambda qs: jax.lax.map(nearest, qs, batch_size=16), queries)
    assert "jax.lax.map" not in fixed.advice
    # docs/user-reports.md quotes these: 32.25 MiB under vmap, 4.03 MiB with batch_size=16
    assert round(p.temp_bytes / MiB, 2) == 32.25 and round(fixed.temp_bytes / MiB, 2) == 4.03


def test_jax_5555_an_allocator_setting_changed_after_the_gpu_started(monkeypatch):
    """The GPU's start is faked as in test_settings (the variables JAX's start hook recorded):
    on the CPU the allocator variables do nothing, and the kit rightly says nothing of them."""
    from helpers._internal import jaxcompat

    monkeypatch.setattr(jaxcompat, "_hook_state", "installed")
    monkeypatch.setattr(jaxcompat, "_at_start",
                        {"cuda": {n: None for n in settings.ALLOCATOR_VARS}})
    (w,) = settings.check_environment({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                                      started_platforms=("cuda",))
    assert "after the cuda backend started, so not in effect" in w.message
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" in w.message and "first cell" in w.fix


def test_jax_2072_and_11923_a_compile_per_new_shape():
    total = jax.jit(lambda x: x.sum())
    with compiles.watch() as log:
        for n in range(10, 16):
            total(jnp.ones(n))
    (entry,) = log.recompiled[:1]
    assert entry.compiles == 6 and entry.cause == "new shapes"
    assert "pad or bucket" in log.diagnosis and "jax.clear_caches()" in log.diagnosis


def test_jax_1605_a_jit_made_inside_a_loop():
    with compiles.watch() as log:
        for _ in range(4):
            jax.jit(lambda v: v * 3)(jnp.ones(2))
    (entry,) = [f for f in log.functions if f.cause == "function made anew"]
    assert entry.compiles == 4 and "outside the loop" in log.diagnosis


def test_jax_1914_arguments_committed_to_two_devices():
    cpu0, cpu1 = jax.devices("cpu")[:2]
    a = jax.device_put(jnp.ones(3), cpu0)
    b = jax.device_put(jnp.ones(3), cpu1)
    text = str(devices.tree_placement((a, b)))
    assert "committed leaves sit on different devices" in text
    assert "incompatible devices" in text and "jax.device_put(tree, device)" in text
    with pytest.raises(ValueError, match="incompatible devices|[Dd]evice"):
        jax.jit(lambda x, y: x + y)(a, b)


def test_jax_18436_a_python_scalar_is_a_host_to_device_copy():
    x = jnp.ones(4)
    with transfers.trace() as log:
        (x + 0).block_until_ready()
    reasons = " ".join(r for row in log.by_line() for r in row["reasons"])
    assert log.count("host->device") >= 1 and "a Python number (or a 0-d NumPy array)" in reasons


def test_aimz_267_numpy_parameters_copied_every_call():
    params = {"w": np.ones(256, np.float32)}
    step = jax.jit(lambda p, x: (p["w"] * x).sum())
    x = jnp.ones(256)
    step(params, x)
    with transfers.trace() as log:
        for _ in range(3):
            step(params, x)
    assert log.count("host->device") == 3
    assert "copied on every call" in " ".join(log.by_line()[0]["reasons"])
    assert "NumPy" in str(devices.tree_placement(params))


def test_jax_14934_and_flax_2493_who_holds_the_array():
    class Module:  # a cache on an object, as Flax's _caches was
        def __init__(self):
            self._caches = {}

    module = Module()
    # sizes no other test's leftover array has (a 2 MiB one from test_loops was taken for it)
    module._caches["activations"] = jnp.zeros((1024, 515))  # about 2 MiB
    saved = {}
    try:
        def step():
            local = jnp.zeros((1024, 1031))  # about 4 MiB, a local of the failed call  # noqa: F841
            raise ValueError("step failed")

        step()
    except ValueError:
        saved["tb"] = sys.exc_info()[2]
    sys.last_traceback = saved.pop("tb")
    try:
        gc.collect()
        h = holders.largest(4)
        by_size = {a.nbytes: a for a in h.arrays}
        tb = by_size[1024 * 1031 * 4]
        assert any("traceback" in who for who in tb.held_by) and "last_traceback" in tb.fix
        cached = by_size[1024 * 515 * 4]
        assert cached.held_by and any("_caches" in who or "dict" in who
                                      for who in cached.held_by)
    finally:
        del sys.last_traceback
        gc.collect()  # the traceback's frames hold arrays in cycles: gone before the next test


def test_jax_13330_arrays_kept_after_inference_are_named():
    notebook = {"outputs": [jnp.ones((1024, 1024)) for _ in range(2)]}  # 4 MiB each, kept
    h = holders.largest(2, namespace=notebook)
    assert all(a.nbytes == 4 * MiB for a in h.arrays)
    assert all(any("'outputs'" in who for who in a.held_by) for a in h.arrays)
    del notebook, h
    gc.collect()  # nothing of this test left for the next one's count of live arrays


def test_jax_26946_a_dimension_no_mesh_axis_divides_is_named_when_replicated():
    from jax.sharding import NamedSharding, PartitionSpec

    n = len(jax.devices())
    kwargs = ({"axis_types": (jax.sharding.AxisType.Auto,)}
              if hasattr(jax.sharding, "AxisType") else {})
    mesh = jax.make_mesh((n,), ("data",), **kwargs)
    split = NamedSharding(mesh, PartitionSpec("data", None))
    step = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, split))
    y = step(jnp.ones((n + 1, 3)))  # one row more than the devices: the constraint cannot hold
    assert y.sharding.is_fully_replicated  # JAX's silent replication, as the thread reports
    said = devices.placement(y).explanation
    assert f"dimension 0 ({n + 1}) does not divide over mesh axis 'data' ({n})" in said
    assert f"pad dimension 0 to a multiple of {n}, e.g. {2 * n}" in said
    assert "with_sharding_constraint splits unevenly" in said
    even = devices.placement(step(jnp.ones((2 * n, 3))))  # divides: split, nothing to say
    assert "If you meant to split it" not in even.explanation and "Sharded" in even.explanation
    kept = devices.placement(jax.device_put(jnp.ones((2 * n, 3)), NamedSharding(
        mesh, PartitionSpec())))  # replicated on purpose, though it could be split
    assert "its sharding splits it over no axis" in kept.explanation
    small = devices.placement(jax.device_put(jnp.ones(1), NamedSharding(mesh, PartitionSpec())))
    assert "If you meant" not in small.explanation  # one element: nothing to split, no hint


def test_the_table_lists_every_report_tested_here():
    from pathlib import Path

    table = (Path(__file__).parents[1] / "docs" / "user-reports.md").read_text()
    tests = [n for n in globals()
             if n.startswith("test_") and any(p.isdigit() for p in n.split("_"))]
    tested = {p for name in tests for p in name.split("_") if p.isdigit()}
    for name in tests:
        numbers = [p for p in name.split("_") if p.isdigit()]
        assert numbers and all(f"#{n}]" in table for n in numbers), name
    # and the other way: every row the table calls named on the CPU has its test
    elsewhere = {"15162": "tests/test_processes.py", "1434": "tests/test_processes.py",
                 "8667": "tests/test_processes.py",
                 "44": "tests/test_ipython.py", "33": "tests/test_preflight.py",
                 "118": "tests/test_tree_placement.py",
                 "2259": "tests/test_residuals.py",
                 "594": "tests/test_sizing.py", "1083": "tests/test_preflight.py",
                 "1171": "the SkyRL#1083 test in tests/test_preflight.py",
                 "427": "jax#19250's test in tests/test_preflight.py; jax#427's in "
                        "tests/test_ipython.py",
                 "1062": "tests/test_compiles.py", "24204": "tests/test_ipython.py",
                 "11204": "tests/test_holders.py",
                 "16226": "tests/test_holders.py", "88": "tests/test_preflight.py",
                 "548": "tests/test_tree_placement.py",
                 "10": "tests/test_tree_placement.py", "2023": "tests/test_holders.py",
                 "19429": "tests/test_compiles.py",
                 "10320": "tests/test_settings.py", "576": "tests/test_transfers.py",
                 "475": "tests/test_preflight.py", "725": "tests/test_holders.py",
                 "24053": "tests/test_holders.py", "4329": "tests/test_compiles.py",
                 "142": "tests/test_compiles.py", "14882": "tests/test_memory.py",
                 "928": "tests/test_memory.py", "1406": "tests/test_holders.py",
                 "105": "tests/test_compiles.py", "197": "tests/test_ipython.py",
                 "968": "tests/test_ipython.py", "4474": "tests/test_ipython.py",
                 "802": "tests/test_ipython.py", "635": "tests/test_tree_placement.py",
                 "141": "tests/test_ipython.py", "27": "tests/test_ipython.py",
                 "18681": "tests/test_tree_placement.py", "445": "tests/test_settings.py",
                 "17217": "tests/test_oom.py", "7118": "tests/test_oom.py",
                 "16901": "tests/test_oom.py", "3140": "the orbax#3183 test here",
                 "2863": "the orbax#3183 test here", "26425": "tests/test_transfers.py",
                 "4310": "the H100 record", "133": "tests/test_compiles.py",
                 "14743": "tests/test_compiles.py", "520": "tests/test_compiles.py",
                 "19250": "tests/test_preflight.py", "823": "tests/test_preflight.py",
                 "787": "tests/test_preflight.py",
                 "2937": "tests/test_preflight.py", "9190": "tests/test_settings.py",
                 "1058": "tests/test_loops.py", "3125": "tests/test_ipython.py",
                 "320": "tests/test_step_arguments.py", "13": "tests/test_loops.py",
                 "792": "tests/test_compiles.py",
                 "81": "the elegy#141 test in tests/test_ipython.py",
                 "466": "tests/test_compiles.py", "282": "tests/test_transfers.py",
                 "1956": "tests/test_ipython.py", "5026": "tests/test_preflight.py",
                 "399": "tests/test_preflight_file.py", "839": "tests/test_shard_map.py",
                 "7159": "tests/test_preflight.py", "1286": "tests/test_devices.py",
                 "6350": "tests/test_trace_errors.py", "2201": "tests/test_holders.py",
                 "10082": "tests/test_holders.py", "675": "tests/test_constants.py",
                 "13789": "tests/test_settings.py", "322": "tests/test_settings.py",
                 "19": "tests/test_compiles.py (mosaic#19)", "8299": "tests/test_trace_errors.py",
                 "17232": "tests/test_compiles.py", "663": "tests/test_ipython.py",
                 "26586": "tests/test_shard_map.py", "12": "tests/test_tree_placement.py",
                 "284": "tests/test_compiles.py and tests/test_preflight.py (openpi#284)",
                 "4174": "tests/test_compiles.py",
                 "19327": "tests/test_ipython.py", "196": "tests/test_compiles.py",
                 "18237": "tests/test_ipython.py", "155": "tests/test_processes.py",
                 "28311": "tests/test_step_arguments.py", "7301": "tests/test_ipython.py",
                 "16788": "tests/test_devices.py", "5280": "tests/test_trace_errors.py",
                 "21994": "tests/test_trace_errors.py", "422": "tests/test_trace_errors.py",
                 "214": "tests/test_trace_errors.py", "1516": "tests/test_compiles.py",
                 "14": "tests/test_preflight.py (sbx#14)", "93": "tests/test_preflight.py",
                 "1347": "tests/test_compiles.py", "64": "tests/test_preflight.py (#65)",
                 "65": "tests/test_preflight.py", "1979": "tests/test_preflight.py",
                 "389": "tests/test_preflight.py", "31": "tests/test_compiles.py (flowMC#31)",
                 "4473": "tests/test_trace_errors.py", "15906": "tests/test_residuals.py",
                 "647": "tests/test_ipython.py", "52": "tests/test_compiles.py",
                 "149": "tests/test_transfers.py", "932": "tests/test_trace_errors.py",
                 "1655": "tests/test_preflight.py", "3801": "tests/test_preflight.py",
                 "924": "tests/test_preflight.py", "397": "tests/test_trace_errors.py",
                 "374": "tests/test_compiles.py", "880": "tests/test_ipython.py",
                 "877": "tests/test_tree_placement.py", "174": "tests/test_transfers.py",
                 "9445": "tests/test_compiles.py", "963": "tests/test_preflight.py",
                 "2069": "tests/test_devices.py", "25010": "tests/test_preflight.py",
                 "1852": "tests/test_preflight.py", "3103": "tests/test_preflight.py",
                 "5039": "tests/test_loops.py", "3865": "tests/test_loops.py",
                 "36": "tests/test_step_arguments.py",
                 "1249": "tests/test_loops.py", "2780": "tests/test_loops.py",
                 "20007": "tests/test_tree_placement.py", "16905": "tests/test_tree_placement.py",
                 "37830": "tests/test_transfers.py", "17863": "tests/test_devices.py",
                 "13956": "tests/test_step_arguments.py", "5461": "tests/test_step_arguments.py",
                 "9132": "tests/test_step_arguments.py", "1830": "tests/test_dtypes.py",
                 "7368": "tests/test_dtypes.py", "1154": "tests/test_dtypes.py",
                 "686": "tests/test_compiles.py", "14080": "tests/test_compiles.py",
                 "770": "tests/test_constants.py", "31292": "tests/test_constants.py",
                 "21045": "tests/test_constants.py", "26216": "tests/test_memory.py",
                 "8609": "the jax#26216 tests in tests/test_holders.py",
                 "19110": "tests/test_holders.py",
                 "271": "tests/test_ipython.py",
                 "163": "tests/test_preflight.py and tests/test_tree_placement.py",
                 "43": "tests/test_ipython.py",
                 "1988": "tests/test_ipython.py", "16637": "tests/test_callbacks.py",
                 "23869": "tests/test_preflight.py", "49131": "tests/test_preflight.py",
                 "8515": "tests/test_step_arguments.py", "12879": "tests/test_holders.py",
                 "11572": "tests/test_holders.py", "10828": "tests/test_memory.py",
                 "20022": "the jax#10828 test in tests/test_memory.py",
                 "1115": "tests/test_holders.py", "238": "tests/test_loops.py",
                 "10197": "tests/test_loops.py", "17845": "tests/test_loops.py",
                 "390": "tests/test_ipython.py",
                 "16679": "tests/test_constants.py", "6905": "tests/test_compiles.py",
                 "21634": "tests/test_tree_placement.py", "1689": "tests/test_holders.py",
                 "40789": "tests/test_devices.py", "4636": "tests/test_holders.py",
                 "1961": "tests/test_holders.py", "20418": "tests/test_transfers.py",
                 "636": "tests/test_preflight_file.py", "19004": "tests/test_settings.py",
                 "208": "the TensorFlow tests (acme#208) and the nemos#208 test in "
                 "tests/test_settings.py",
                 "158186": "tests/test_settings.py", "1219": "tests/test_ipython.py",
                 "1797": "tests/test_ipython.py", "316": "tests/test_callbacks.py",
                 "19314": "tests/test_callbacks.py", "2947": "tests/test_callbacks.py",
                 "26370": "tests/test_callbacks.py", "27748": "tests/test_residuals.py",
                 "2956": "tests/test_residuals.py", "19822": "tests/test_residuals.py",
                 "1236": "tests/test_program_shapes.py and tests/test_residuals.py",
                 "2858": "tests/test_program_shapes.py, tests/test_residuals.py",
                 "2051": "tests/test_residuals.py", "24915": "tests/test_program_shapes.py",
                 "25487": "tests/test_program_shapes.py", "24":
                 "tests/test_sparse_linalg.py and tests/test_preflight.py (tinygp#24)",
                 "166": "tests/test_sparse_linalg.py", "7856": "tests/test_sparse_linalg.py",
                 "891": "tests/test_compiles.py and tests/test_preflight.py",
                 "352": "tests/test_compiles.py", "35090": "tests/test_trace_errors.py",
                 "5208": "tests/test_trace_errors.py", "4712": "tests/test_compiles.py",
                 "2251": "the jax#4645 test here", "392": "the jax#21908 test here",
                 "442": "the jax#2777 tests here",
                 "59": "the jax#3158 test here",
                 "3597": "the numpyro#696 test here", "9933": "tests/test_ipython.py",
                 "2120": "tests/test_ipython.py", "17187": "tests/test_callbacks.py",
                 "1748": "tests/test_ipython.py", "7437": "tests/test_ipython.py",
                 "5172": "tests/test_step_arguments.py", "261": "tests/test_devices.py",
                 "6887": "tests/test_settings.py", "23208": "tests/test_settings.py",
                 "13148": "the en dash test in tests/test_settings.py",
                 "3077": "tests/test_settings.py", "244": "tests/test_compiles.py",
                 "16778": "tests/test_holders.py", "157": "tests/test_compiles.py",
                 "170": "tests/test_transfers.py", "158": "tests/test_ipython.py",
                 "24255": "tests/test_callbacks.py", "969": "the jax#5210 test here",
                 "17865": "the jax#21045 tests in tests/test_constants.py",
                 "7199": "tests/test_preflight.py",
                 "25": "tests/test_preflight.py (Olmax#25), tests/test_shard_map.py (its #25)",
                 "22": "tests/test_doctor.py and tests/test_ipython.py (min-dalle#22)",
                 "1539": "tests/test_settings.py", "19570": "tests/test_compiles.py",
                 "70": "tests/test_transfers.py (simplexity#70)",
                 "987": "tests/test_trace_errors.py", "18405": "tests/test_trace_errors.py",
                 "40722": "tests/test_trace_errors.py", "38518": "tests/test_ipython.py",
                 "8443": "tests/test_compiles.py", "23302": "tests/test_compiles.py",
                 "176": "tests/test_compiles.py (tpu-inference#176)",
                 "514": "tests/test_preflight.py", "1007": "tests/test_preflight.py",
                 "5093": "tests/test_program_shapes.py",
                 "37": "tests/test_loops.py (JAX-in-Cell#37)",
                 "6": "tests/test_loops.py (deepmd-jax#6)", "329": "tests/test_loops.py",
                 "3439": "tests/test_preflight.py"}
    for row in table.splitlines():
        if row.startswith("| [") and row.split("|")[-2].strip().startswith("named"):
            for n in re.findall(r"#(\d+)\]", row.split("|")[1]):
                assert n in tested or n in elsewhere, f"#{n} is called named but has no test"



def test_jax_25396_a_creation_with_device_is_built_on_the_default_device_first():
    elsewhere = jax.devices()[1]
    with transfers.trace() as log:
        jnp.full((1000,), 2.0, device=elsewhere).block_until_ready()
    (copy,) = log.select("device->device")
    assert copy.nbytes == 4000 and "jax.default_device(device)" in copy.reason


def test_jax_4385_a_memory_profile_sees_live_buffers_not_the_steps_temporaries(tmp_path):
    from helpers import memory_profile

    def step(x, w):
        hidden = jnp.tanh(x @ w)  # 16 MiB inside the step only
        return hidden @ w.T

    hidden_line = step.__code__.co_firstlineno + 1
    x, w = jnp.ones((2048, 512)), jnp.ones((512, 2048)) / 512
    p = preflight.preflight_step(step, x, w)
    kept = jax.jit(step)(x, w).block_until_ready()  # noqa: F841  (the output stays live)
    path = tmp_path / "memory.prof"
    jax.profiler.save_device_memory_profile(str(path))
    entries = memory_profile.read_memory_profile(path)
    at_hidden = [e for e in entries
                 if any(f.endswith("test_user_reports.py") and n == hidden_line
                        for _, f, n in e.frames)]
    assert at_hidden == []  # the profile never sees `hidden`: it lives only inside the step
    (top,) = p.largest_temporaries[:1]
    assert top.nbytes == 16 * MiB and "hidden = jnp.tanh" in top.line


def test_jax_2777_a_python_loop_inside_jit_is_unrolled():
    w = jnp.ones((64, 64)) / 64

    def unrolled(h):
        for _ in range(100):
            h = jnp.tanh(h @ w)
        return h

    def looped(h):
        return jax.lax.fori_loop(0, 100, lambda i, h: jnp.tanh(h @ w), h)

    h = jnp.ones((8, 64))
    p = preflight.preflight_step(unrolled, h)
    assert "a Python loop inside the jitted function is unrolled" in p.advice
    assert "199 of the compiled program's 200 operations" in p.advice  # as the docs quote
    assert "test_user_reports.py:" in p.advice and "jax.lax.fori_loop" in p.advice
    assert "unrolled" not in preflight.preflight_step(looped, h).advice


def test_jax_2777_a_static_loop_length_compiles_per_value_and_fori_loop_compiles_once():
    """jax-ml/jax#2777 through compiles.watch: sample(key, n) with n static and a Python loop
    of n steps compiled once per n, each longer. The kit names the loop's line and the fix,
    jax.lax.fori_loop with n traced, which compiles once; and that jax.grad cannot reverse it."""
    w = jnp.eye(8) * 0.5

    @functools.partial(jax.jit, static_argnums=1)
    def sample(h, n):
        for _ in range(n):
            h = jnp.tanh(h @ w)
        return h

    @jax.jit
    def fixed(h, n):
        return jax.lax.fori_loop(0, n, lambda i, h: jnp.tanh(h @ w), h)

    h = jnp.ones((2, 8))
    with compiles.watch() as log:
        unrolled = [sample(h, n) for n in range(1, 9)]
    entry = log.function("sample")
    assert entry.compiles == 8 and entry.cause == "new static values"
    line = inspect.getsourcelines(sample)[1] + 2
    assert f"`n` sets the length of a Python loop (test_user_reports.py:{line}: for _ in " \
        "range(n):)" in entry.fix and "jax.lax.fori_loop(0, n, body, carry)" in entry.fix
    assert entry.fix in log.diagnosis
    with compiles.watch() as once:
        looped = [fixed(h, n) for n in range(1, 9)]
    assert once.function("fixed").compiles == 1
    assert np.allclose(unrolled, looped, atol=1e-6)
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        jax.grad(lambda h, n: fixed(h, n).sum())(h, 3)  # as the fix says: not under grad


def test_quantecon_lecture_jax_95_a_static_iteration_count_is_a_loop_not_arithmetic():
    """QuantEcon/lecture-jax#95: power_iteration_sr(A, num_iterations, seed) jitted with both
    static; taken out of static_argnums, num_iterations raises TracerIntegerConversionError
    (its range()), while seed, which only feeds jax.random.key, does not. The kit tells the
    two apart in the function's source."""
    def power_iteration_sr(A, num_iterations=15, seed=1234):
        b_k = jax.random.normal(jax.random.key(seed), (A.shape[1],))
        sr = 0.0
        for _ in range(num_iterations):
            b_k1 = A @ b_k
            sr = jnp.linalg.norm(b_k1) / jnp.linalg.norm(b_k)
            b_k = b_k1 / jnp.linalg.norm(b_k1)
        return sr

    A = jnp.asarray(np.random.default_rng(0).random((16, 16)), jnp.float32)
    static = jax.jit(power_iteration_sr, static_argnums=(1, 2))
    with compiles.watch() as iterations:
        for n in (5, 10, 15):
            static(A, n, 1234)
    with compiles.watch() as seeds:
        for seed in (1, 2, 3):
            static(A, 15, seed)
    loop, arithmetic = (log.function("power_iteration_sr").fix for log in (iterations, seeds))
    if jaxcompat.jax_version_tuple() >= (0, 9):  # JAX names the argument's input path
        assert "`num_iterations` sets the length of a Python loop" in loop
        assert "`seed` only feeds arithmetic" in arithmetic
    else:  # 0.8.0 prints the static values alone, and no decorator says which: every case
        assert loop == arithmetic == INT_STATIC_FIX
    with pytest.raises(jax.errors.TracerIntegerConversionError):
        jax.jit(power_iteration_sr, static_argnums=2)(A, 10, 1234)
    with compiles.watch() as traced_seed:  # the seed traced: one compile for every seed
        for seed in (1, 2, 3):
            jax.jit(power_iteration_sr, static_argnums=1)(A, 15, seed)
    assert traced_seed.function("power_iteration_sr").compiles == 1


def test_netket_783_a_forward_pass_over_every_connected_configuration_is_named_with_its_chunk():
    """netket/netket#783: expect() ran out of memory evaluating the wave function of every
    connected configuration in one forward pass; the maintainers' fix is a chunk size. On the
    CPU, XLA (jax 0.10 on) fuses the dot and all that follows it into one YNNPACK fusion whose
    values its plan does not count (temporaries 0 B), and the kit said nothing of them. It now
    says what XLA plans for them without the fusion, outside the peak (YNNPACK tiles some
    fusions and holds others whole), and names the chunk."""
    samples, spins, hidden = 128, 128, 512

    def logpsi(params, s):
        w, b = params
        return jnp.sum(jnp.log(jnp.cosh(s @ w + b)), axis=-1)

    def local_energy(params, s, sp):
        return -jnp.sum(jnp.exp(logpsi(params, sp) - logpsi(params, s)[:, None]), axis=-1)

    def chunked(params, s, sp, k=16):  # the fix: k samples at a time
        return jax.lax.map(lambda a: local_energy(params, a[0][None], a[1][None])[0], (s, sp),
                           batch_size=k)

    params = (jnp.zeros((spins, hidden)), jnp.zeros(hidden))
    s, sp = jnp.zeros((samples, spins)), jnp.zeros((samples, spins, spins))
    whole = preflight.preflight_step(local_energy, params, s, sp)
    values = samples * spins * hidden * 4  # one f32 value of the batched forward pass: 32 MiB
    fixed = preflight.preflight_step(chunked, params, s, sp)
    text = jax.jit(local_energy).lower(params, s, sp).compile().as_text()
    if jaxcompat.ynn_fusion_intermediates(text):  # jax 0.10 on: the fusion's values
        unfused = jax.jit(local_energy).lower(params, s, sp).compile(
            compiler_options=jaxcompat.YNN_FUSIONS_OFF).memory_analysis().temp_size_in_bytes
        assert whole.temp_bytes < values <= whole.fusion_bytes == unfused - whole.temp_bytes
        assert whole.peak_bytes - whole.argument_bytes < values  # not in the peak
        assert "fuses a dot with what follows it into a YNNPACK fusion, whose values XLA's " \
            "plan does not count" in whole.advice
        assert "jax.lax.map(f, xs, batch_size=k), a chunk size" in whole.advice
        assert "values inside a YNNPACK fusion" in str(whole)
        assert 4 * fixed.fusion_bytes < whole.fusion_bytes
    else:  # jax 0.8.0 makes no such fusion: its plan holds them as temporaries
        assert whole.fusion_bytes == 0 and whole.temp_bytes >= values
        assert 4 * fixed.temp_bytes < whole.temp_bytes
    assert np.allclose(jax.jit(local_energy)(params, s, sp), jax.jit(chunked)(params, s, sp))


def test_jax_5684_a_list_of_numbers_passed_to_jit_is_named_not_called_a_loop():
    """jax-ml/jax#5684: jit(f)(x, list(range(3000)), y) took seconds to compile, an array 0.03
    s; jakevdp: a list is a pytree, each of its ints an argument of its own. The kit called it
    a Python loop unrolled and advised lax.scan, in a function with no loop (a new user's
    trial); it now names the scalar arguments and the array."""
    def f(x, indices, y):
        return x.at[(indices,)].add(y)

    x, y, indices = jnp.ones(1000), jnp.ones(300), list(range(300))
    p = preflight.preflight_step(f, x, indices, y)
    assert "the step takes 300 scalar arguments" in p.advice
    assert "(here `indices`, 300 Python numbers: jnp.asarray(indices))" in p.advice
    assert "jax.lax.scan" not in p.advice and "Python loop inside" not in p.advice
    assert ("indices (300 Python numbers, a scalar argument each)", 1200) in p.argument_split
    assert sum(n for _, n in p.argument_split) == p.argument_bytes  # the split adds up
    fixed = preflight.preflight_step(f, x, jnp.asarray(indices), y)
    assert "scalar arguments" not in fixed.advice
    assert np.allclose(jax.jit(f)(x, indices, y), jax.jit(f)(x, jnp.asarray(indices), y))


def test_jax_2242_a_loop_that_slices_by_its_index_is_told_to_mask_not_to_stack_layers():
    """jax-ml/jax#2242: an LU factorization in nested Python loops compiled for ~29 s; shoyer:
    the loops are unrolled, use lax.fori_loop. Its slices U[k, k:n] shrink with k, and the kit
    said scan "cannot take them": stack the layers that share a shape (a new user's trial).
    It now names the slice by the loop's index and the mask that lets fori_loop run one body."""
    n = 10

    def lu(a):
        upper, lower = a, jnp.eye(n)
        for k in range(n - 1):
            for j in range(k + 1, n):
                lower = lower.at[j, k].set(upper[j, k] / upper[k, k])
                upper = upper.at[j, k:n].add(-lower[j, k] * upper[k, k:n])
        return lower, upper

    def lu_fori(a):  # the fix: whole rows, masked, one body
        cols = jnp.arange(n)

        def outer(k, lower_upper):
            def inner(j, lower_upper):
                lower, upper = lower_upper
                factor = upper[j, k] / upper[k, k]
                return (lower.at[j, k].set(factor),
                        upper.at[j].add(jnp.where(cols >= k, -factor * upper[k], 0.0)))
            return jax.lax.fori_loop(k + 1, n, inner, lower_upper)
        return jax.lax.fori_loop(0, n - 1, outer, (jnp.eye(n), a))

    a = jnp.asarray(np.random.default_rng(0).random((n, n)) + n * np.eye(n), jnp.float32)
    p = preflight.preflight_step(lu, a)
    assert "its iterations slice an array by the loop's index" in p.advice
    assert "jnp.where(jnp.arange(n) >= k, row, 0)" in p.advice and "jax-ml/jax#2242" in p.advice
    assert "layers of different widths" not in p.advice
    assert "unrolled" not in preflight.preflight_step(lu_fori, a).advice
    for got, want in zip(jax.jit(lu_fori)(a), jax.jit(lu)(a), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_uwplasma_vmex_328_jacrev_over_an_iterative_solve_is_named_by_its_carried_basis():
    """uwplasma/vmex#328: jit(jacrev(residual)) asked for 251 GB: jacrev vmaps the implicit
    solve's adjoint (a Krylov method) over every residual row, so its basis gains a row axis;
    the PR pulls back rows in chunks of the parameters' number. The kit said nothing of
    jacrev and advised rewriting the loop inside JAX's own gmres (a new user's trial): the
    basis is a loop's carry, not a temporary XLA lists. It now names jacrev by that carry."""
    from jax.scipy.sparse.linalg import gmres

    state, dof, rows, basis = 512, 8, 128, 20
    a0 = jnp.eye(state) * 4.0 + 0.01 * jax.random.normal(jax.random.key(0), (state, state))
    b0 = 0.01 * jax.random.normal(jax.random.key(1), (state, dof))
    c0 = 0.01 * jax.random.normal(jax.random.key(2), (rows, state))

    def residual_rows(p):
        u, _ = gmres(lambda v: a0 @ v, b0 @ p + 1.0, restart=basis, maxiter=1)
        return c0 @ u

    def chunked(p):  # the PR's fix: one vjp, rows pulled back a chunk at a time
        _, pull = jax.vjp(residual_rows, p)
        return jax.lax.map(lambda e: pull(e)[0], jnp.eye(rows), batch_size=dof)

    p = jnp.ones(dof)
    found = preflight.preflight_step(lambda p: jax.jacrev(residual_rows)(p), p)
    assert "jax.jacrev" in found.advice and f"all {rows} at once under vmap" in found.advice
    assert f"a loop's carry f32[{rows}, {state}, {basis + 1}]" in found.advice
    assert "jax.jacfwd makes the same Jacobian one column per input" in found.advice
    assert "read it after the writes" not in found.advice  # not the user's loop to rewrite
    for fix in (chunked, lambda p: jax.jacfwd(residual_rows)(p)):
        assert 4 * preflight.preflight_step(fix, p).temp_bytes < found.temp_bytes
    np.testing.assert_allclose(jax.jit(chunked)(p), jax.jacrev(residual_rows)(p), atol=1e-4)


def test_brainpy_539_a_half_precision_state_computed_in_float32_is_named_with_its_cast():
    """brainpy/BrainPy#539: variables switched to float16 left memory and speed the same; the
    maintainer: cast the parameters, coefficients and dt too, or float32 promotes the work
    back. The kit said only to donate the state (a new user's trial); it now names the
    promotion, the line and the cast."""
    n_neurons, steps = 1 << 19, 8

    def dv(v, g, p):
        return p["i"] - p["g_na"] * (v - p["e_na"]) * 0.01 - p["g_k"] * g ** 4 * (v - p["e_k"])

    def simulate(v, g, p, dt):
        def step(carry, _):
            v, g = carry
            v_new = v + dt * dv(v + 0.5 * dt * dv(v, g, p), g, p)
            g_new = g + dt * (0.01 * (1.0 - g) - 0.1 * g)
            return (v_new.astype(v.dtype), g_new.astype(g.dtype)), None  # stored as the state
        return jax.lax.scan(step, (v, g), None, length=steps)[0]

    def params(dtype):
        return {k: jnp.full(n_neurons, x, dtype) for k, x in
                (("g_na", 120.0), ("g_k", 36.0), ("e_na", 50.0), ("e_k", -77.0), ("i", 10.0))}

    v, g = jnp.full(n_neurons, -65.0, jnp.float16), jnp.full(n_neurons, 0.3, jnp.float16)
    report = preflight.preflight_step(simulate, v, g, params(jnp.float32), jnp.float32(0.01))
    (narrow, wide, shape, nbytes, line), *_ = report.half_round_trips
    assert (narrow, wide, shape, nbytes) == ("float16", "float32", (n_neurons,), 4 * n_neurons)
    assert "test_user_reports.py:" in line
    assert "are computed in float32" in report.advice and "brainpy/BrainPy#539" in report.advice
    fixed = preflight.preflight_step(simulate, v, g, params(jnp.float16),
                                     jnp.asarray(0.01, jnp.float16))
    assert fixed.half_round_trips == () and "BrainPy#539" not in fixed.advice
    assert fixed.argument_bytes < report.argument_bytes


def test_jax_md_137_the_forces_of_an_all_pairs_energy_name_the_pairs_and_the_neighbor_list():
    """jax-md/jax-md#137: 40k particles filled a V100; the user was calling the all-pairs
    energy, not the neighbor-list one. Under jax.grad (forces, as a simulation takes them)
    the kit listed the N x N x 2 value and said nothing (a new user's trial): the pairwise
    note was for steps without a derivative. It now names it, with the checkpointed chunk
    and the neighbor list."""
    n = 1500

    def pair_energy(r):
        dr = jnp.sqrt(jnp.sum((r[:, None, :] - r[None, :, :]) ** 2, axis=-1) + 1e-12)
        return 0.5 * jnp.sum(jnp.where(dr < 1.0, (1.0 - dr) ** 2, 0.0) * (1.0 - jnp.eye(n)))

    def chunked(r, k=125):  # the note's fix: rows a chunk at a time, checkpointed
        def row(x):
            d = jnp.sqrt(jnp.sum((x[None, :] - r) ** 2, axis=-1) + 1e-12)
            return jnp.sum(jnp.where((d < 1.0) & (d > 1e-5), (1.0 - d) ** 2, 0.0))
        return 0.5 * jnp.sum(jax.lax.map(jax.checkpoint(row), r, batch_size=k))

    r = jax.random.uniform(jax.random.key(0), (n, 2)) * 30.0
    forces = preflight.preflight_step(jax.grad(pair_energy), r)
    assert "a value over every pair of two inputs' rows" in forces.advice
    assert "jax.lax.map(jax.checkpoint(row), xs, batch_size=" in forces.advice
    assert "a neighbor list (jax_md.partition)" in forces.advice
    fixed = preflight.preflight_step(jax.grad(chunked), r)
    assert 8 * fixed.temp_bytes < forces.temp_bytes
    np.testing.assert_allclose(jax.grad(chunked)(r), jax.grad(pair_energy)(r), atol=1e-4)


def test_optax_472_the_optimizer_state_beside_the_parameters():
    """Each argument's bytes, and where the state holds copies of the parameters. The thread's
    MultiSteps figures need optax (the bench extra); the split and the copies do not."""
    params = {"w": jnp.ones((512, 512)), "b": jnp.ones(512)}
    adam_like = {"mu": jax.tree.map(jnp.zeros_like, params),
                 "nu": jax.tree.map(jnp.zeros_like, params), "count": jnp.zeros((), jnp.int32)}

    def step(params, opt_state, batch):
        return jax.tree.map(lambda p: p - batch.mean(), params), opt_state

    p = preflight.preflight_step(step, params, adam_like, jnp.ones(8))
    split = dict(p.argument_split)
    assert split["opt_state"] == 2 * split["params"] + 4 and "opt_state:" in str(p)
    assert [c.path for c in p.state_copies] == ["['mu']", "['nu']"]
    assert "opt_state holds 2 copies of params' shapes" in p.advice


def test_optax_472_multisteps_holds_one_more_copy_of_the_parameters():
    optax = pytest.importorskip("optax")  # the bench extra; the kit does not need it
    params = {"w": jnp.ones((512, 512)), "b": jnp.ones(512)}
    sizes, copies = {}, {}
    for name, opt in {"adam": optax.adam(1e-3), "multisteps": optax.MultiSteps(
            optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-3)), 4)}.items():
        state = opt.init(params)

        def update(params, opt_state, grads, opt=opt):
            u, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, u), opt_state

        p = preflight.preflight_step(update, params, state, params)
        sizes[name] = dict(p.argument_split)["opt_state"] / dict(p.argument_split)["params"]
        copies[name] = [c.path for c in p.state_copies]
    # docs/user-reports.md quotes these (optax 0.2.8): Adam 2.00x, MultiSteps(adam) 3.00x
    assert round(sizes["adam"], 2) == 2.0 and round(sizes["multisteps"], 2) == 3.0
    assert copies["adam"] == ["[0].mu", "[0].nu"]
    assert copies["multisteps"] == [".inner_opt_state[1][0].mu", ".inner_opt_state[1][0].nu",
                                    ".acc_grads"]  # the thread's state, as the docs name it


def test_flax_4848_undonated_state_is_named_with_the_bytes_at_stake():
    params = {"w1": jnp.ones((1024, 1024)), "w2": jnp.ones((1024, 1024))}  # 8 MiB
    x = jnp.ones((64, 1024))

    def sgd(params, x):
        g = jax.grad(lambda p: jnp.tanh(x @ p["w1"] @ p["w2"]).sum())(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)

    plain = preflight.preflight_step(sgd, params, x)
    donated = preflight.preflight_step(sgd, params, x, donate_argnums=0)
    assert "Nothing donated" not in donated.advice and donated.donations[0].reused
    # named with what XLA's plan of the donated step says: XLA:CPU's keeps temporaries instead
    # (16.75 -> 16.50 MiB; measured 16.8 -> 16.9), so the CPU stand-in says it saves nothing
    # here and leaves a GPU's plan to a run there
    drop = plain.peak_bytes - donated.peak_bytes
    assert "Nothing donated for params, yet 8.00 MiB of the outputs" in plain.advice
    if drop >= 2**20:
        assert f"{format_bytes(drop)} less at the peak" in plain.advice
    else:
        assert "for the CPU, its peak does not drop" in plain.advice
        assert "not yet run on a GPU" in plain.advice
    small = preflight.preflight_step(sgd, {"w1": jnp.ones((8, 8)), "w2": jnp.ones((8, 8))},
                                     jnp.ones((4, 8)))
    assert "Nothing donated" not in small.advice  # under 1 MiB: not worth a word


def test_diffrax_111_a_smaller_last_batch_compiles_once_more():
    step = jax.jit(lambda w, batch: (batch @ w).sum())
    w, data = jnp.ones((8, 4)), np.ones((10, 8), np.float32)
    with compiles.watch() as log:
        for start in range(0, 10, 4):  # batches of 4, 4 and the last 2
            step(w, data[start:start + 4])
    entry = log.function("<lambda>")
    assert entry.compiles == 2 and entry.cause == "new shapes"
    assert entry.changed == ("batch: f32[4,8], f32[2,8]",)
    assert "pad or bucket" in log.diagnosis  # 4 and 2: not buckets, a last batch cut short


def test_optax_1440_a_weakly_typed_state_compiles_a_second_time():
    @jax.jit
    def update(state, x):
        return {"avg": state["avg"] * 0.9 + x.mean()}  # returns a strongly typed float32

    state = {"avg": jnp.asarray(0.0)}  # no dtype: weakly typed
    with compiles.watch() as log:
        for _ in range(3):
            state = update(state, jnp.ones(4))
    entry = log.function("update")
    assert entry.compiles == 2 and entry.cause == "new dtypes"
    assert "weak_type" in entry.changed[0] and "weakly typed" in log.diagnosis


def test_jax_1491_memory_stats_is_none_on_the_cpu_and_the_kit_counts_live_arrays():
    assert jax.devices("cpu")[0].memory_stats() is None  # what the thread met
    kept = jnp.ones((1024, 1024))  # 4 MiB  # noqa: F841
    (cpu0,) = [d for d in memory.snapshot().devices if d.device == "cpu:0"]
    assert cpu0.source == "live arrays" and cpu0.bytes_in_use >= 4 * MiB


def test_jax_17432_very_many_tiny_arrays_are_named_with_the_fix():
    key = jax.random.key(0)
    key, *keys = jax.random.split(key, 12_001)  # the thread's pattern: 12,000 tiny arrays
    h = holders.largest(1)
    (kind, count), = re.findall(r"most common: (\S+) x([\d,]+)", h.many_small)
    assert kind == "uint32[2]" and int(count.replace(",", "")) >= 12_000  # a key's buffer
    assert "keys = jax.random.split(key, n)" in h.many_small and h.many_small in str(h)
    del keys
    assert holders.largest(1).many_small == ""  # one array of keys: nothing to say


class _Settings:  # no __eq__ or __hash__: compared by identity, as in the thread
    def __init__(self, scale):
        self.scale = scale


def test_jax_4274_equal_static_values_compared_by_identity_compile_every_call():
    step = jax.jit(lambda x, cfg: x * cfg.scale, static_argnums=1)
    with compiles.watch() as log:
        for _ in range(3):
            step(jnp.ones(4), _Settings(2.0))
    assert "compares by identity" in log.diagnosis and "frozen dataclass" in log.diagnosis


def test_optax_577_a_sweep_that_closes_over_the_rate_compiles_for_each_value():
    def make_step(lr):
        return jax.jit(lambda p: p - lr * p)  # the rate is closed over: a new function each

    with compiles.watch() as log:
        for lr in (0.1, 0.01, 0.001):
            make_step(lr)(jnp.ones(4))
    (f,) = [f for f in log.functions if f.recompiled]
    assert f.cause == "function made anew" and f.compiles == 3
    assert "pass that value as an argument instead" in f.fix
    assert "optax.inject_hyperparams" in f.fix
    step = jax.jit(lambda p, lr: p - lr * p)  # the fix: the rate as a traced argument
    with compiles.watch() as fixed:
        for lr in (0.1, 0.01, 0.001):
            step(jnp.ones(4), lr)
    assert not [f for f in fixed.functions if f.recompiled]


def test_optax_577_inject_hyperparams_compiles_the_sweep_once():
    optax = pytest.importorskip("optax")  # the bench extra; the kit does not need it
    params = {"w": jnp.ones((8, 8))}
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)

    @jax.jit
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    state = tx.init(params)
    with compiles.watch() as log:
        for lr in (1e-3, 3e-4, 1e-4):
            state.hyperparams["learning_rate"] = jnp.float32(lr)
            step(params, state, params)
    assert [f.compiles for f in log.functions if f.function == "step"] == [1]


def test_jax_17702_jnp_asarray_of_numpy_is_named_as_a_copy_and_device_put_as_the_way_round():
    x = np.ones(1000, np.float32)
    jnp.asarray(x)  # compiled outside the trace
    with transfers.trace() as log:
        jnp.asarray(x).block_until_ready()
    reason = " ".join(log.by_line()[0]["reasons"])
    if jaxcompat.asarray_is_explicit():  # jax < 0.10.1: asarray was a device_put
        assert reason.startswith("jax.device_put")
    else:
        assert "jnp.array or jnp.asarray of host data: a copy" in reason
        assert "jax.device_put(x) uses an array aligned to 64 bytes in place" in reason
        assert "jnp.array(np.array(x))" in reason  # jax#10662: a nested list


def test_jax_4667_a_pytree_of_many_arrays_is_named_by_its_count_not_as_a_loop():
    tree = {f"w{i}": jnp.ones((4 + i % 3,)) for i in range(200)}  # many arrays, several shapes

    def scaled(tree):
        return jax.tree.map(lambda leaf: jnp.tanh(leaf) * 2, tree)

    p = preflight.preflight_step(scaled, tree)
    assert "about as many as the 200 arrays of the arguments" in p.advice
    assert "jax.flatten_util.ravel_pytree" in p.advice and "fori_loop" not in p.advice
    from jax.flatten_util import ravel_pytree

    flat, _ = ravel_pytree(tree)  # the fix: one array
    assert "operations come from one line" not in preflight.preflight_step(
        lambda v: jnp.tanh(v) * 2, flat).advice


def test_jax_12789_21300_constants_xla_folds_while_compiling_are_in_the_peak():
    def build(x):
        return jnp.ones((100, 100, 100)).at[50, 50, 50].set(2.0) * x  # from no argument

    p = preflight.preflight_step(build, 1.0)
    assert p.folded_bytes == 100 ** 3 * 4 and p.peak_bytes == p.xla_peak_bytes
    assert "constants XLA computed while compiling" in p.advice
    assert "compiler_options={'xla_disable_hlo_passes': 'constant_folding'}" in p.advice


def test_jax_12792_fewer_residuals_need_not_lower_the_plan_and_the_kit_says_to_compare():
    """jax.checkpoint "does not work": the residuals drop, XLA's plan for the gradient may not
    (measured on the CPU, jax 0.8.0 and 0.10.2: 8 MiB of temporaries either way; on 0.11.2
    and 0.12.0.1 XLA's plan did fall, 8 -> 5 MiB: either way, only comparing the two says
    which)."""
    ws = [jnp.ones((256, 256)) / 256 for _ in range(4)]
    x = jnp.ones((1024, 256))

    def net(ws, x):
        for w in ws:
            x = jax.nn.relu(x @ w + 1)
        return x.sum()

    def per_layer(ws, x):
        for w in ws:
            x = jax.checkpoint(lambda w, x: jax.nn.relu(x @ w + 1))(w, x)
        return x.sum()

    plain, layered = preflight.residuals(net, ws, x), preflight.residuals(per_layer, ws, x)
    assert layered.saved_bytes < plain.saved_bytes  # checkpointing cut the residuals...
    temps = [preflight.preflight_step(jax.grad(f), ws, x).temp_bytes for f in (net, per_layer)]
    # ...and XLA's plan for the gradient stayed the same here (MiB; it fell on jax 0.11.2)
    mib = [t / 2**20 for t in temps]
    assert mib[1] <= mib[0] and mib == {"0.8.0": [8, 8], "0.10.2": [8, 8], "0.11.2": [8, 5],
                                        "0.12.0.1": [8, 5]}.get(jax.__version__, mib)
    assert "compare preflight_step(jax.grad(loss), ...) before and after" in plain.advice


def test_jax_9635_a_buffer_passed_donated_and_as_it_is_will_fail_with_xla_s_own_words():
    """batch = x; x = update(x, batch) with x donated: it hung once, JAX now raises; the kit
    quoted the donated-twice message, and went on to advise donating batch, the same buffer."""
    def update(x, batch):
        return x + batch

    x = jnp.zeros((1024, 1024))
    with pytest.raises(Exception, match="previously donated in the same call"):
        jax.jit(update, donate_argnums=0)(x, x)  # what the thread's loop meets now
    x = jnp.zeros((1024, 1024))
    p = preflight.preflight_step(update, x, x, donate_argnums=0)
    assert p.verdict == "will fail"
    assert "Attempt to use a buffer that was previously donated in the same call" in p.advice
    assert "Nothing donated for" not in p.advice and "donate it in one place only." in p.advice


def test_optax_1059_a_state_that_holds_one_buffer_twice_cannot_be_donated_and_both_are_named():
    """The schedule-free optimizer's state once held its parameters' array as ``z`` too."""
    w = jnp.ones((256, 256))
    state = {"params": {"w": w}, "z": w}

    def step(state):
        return {"params": {"w": state["params"]["w"] * 0.9}, "z": state["z"] * 0.9}

    with pytest.raises(Exception, match="donate the same buffer twice"):
        jax.jit(step, donate_argnums=0)({"params": {"w": w}, "z": w})  # what the thread saw
    p = preflight.preflight_step(step, state, donate_argnums=0)
    assert p.verdict == "will fail"
    assert ("argument 0['params']['w'] is donated and the same buffer is passed again as "
            "argument 0['z']") in p.advice


def test_jax_10662_jnp_array_of_a_nested_list_is_named_with_the_faster_way():
    rows = [[float(i + j) for j in range(8)] for i in range(4)]
    jnp.array(rows)  # compiled outside the trace
    with transfers.trace() as log:
        jnp.array(rows).block_until_ready()
    reasons = " ".join(r for row in log.by_line() for r in row["reasons"])
    assert "jnp.array(np.array(x))" in reasons  # a list is no device_put on any version


def test_jax_25842_debug_print_of_a_sharded_value_gathers_it_whole():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    x = jax.device_put(jnp.ones((2048, 256)),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))

    def step(x):
        y = jnp.tanh(x) * 2
        jax.debug.print("y={}", y)  # the whole of y, gathered to print it
        return y

    p = preflight.preflight_step(step, x)
    assert p.device == "cpu:0" and p.argument_bytes == x.nbytes // 4  # one device's share
    assert "f32[2048, 256] (2.00 MiB, test_user_reports.py:" in p.advice
    assert "a value gathered from its shards" in p.advice and "jax.debug.print" in p.advice

    def peek(x):
        y = jnp.tanh(x) * 2
        jax.debug.print("y[0, 0]={}", y[0, 0])  # the fix: a slice
        return y

    assert "gathered" not in preflight.preflight_step(peek, x).advice


def test_the_readme_and_the_table_count_the_same_threads():
    from pathlib import Path

    root = Path(__file__).parents[1]
    table = (root / "docs" / "user-reports.md").read_text()
    rows = [r for r in table.splitlines() if r.startswith("| [")]
    threads = sum(len(re.findall(r"#\d+\]", r.split("|")[1])) for r in rows)
    verdicts = [r.split("|")[-2].strip() for r in rows]
    named = sum(len(re.findall(r"#\d+\]", r.split("|")[1]))
                for r, v in zip(rows, verdicts, strict=True)
                if v.startswith("named") and not v.startswith(("named on the GPU",
                                                                "named with the GPU")))
    said = re.search(r"Of the (\d+) threads, (\d+) are named on the CPU", table)
    assert said and (int(said[1]), int(said[2])) == (threads, named)
    readme = (root / "README.md").read_text()
    assert f"{threads} problems JAX users reported" in readme
    assert f"{named} of them named on the CPU" in " ".join(readme.split())


def test_jaxmg_29_an_argument_donated_to_an_earlier_call_will_fail():
    """A buffer donated to the step before is passed again: the kit said FITS."""
    step = jax.jit(lambda s, x: s + x, donate_argnums=0)
    s, x = jnp.ones(1024), jnp.ones(1024)
    step(s, x)  # s is donated, and deleted
    p = preflight.preflight_step(step, s, x)
    assert p.verdict == "will fail" and p.advice.startswith("argument 0 was deleted")
    # what the call does, and the advice says: jax 0.8.0 and 0.10.2's C++ fast path hands the
    # deleted buffer to XLA (ValueError INVALID_ARGUMENT "... deleted or donated"); 0.11.2's
    # leaves the call to the Python path, whose check raises RuntimeError "Array has been
    # deleted with shape=float32[1024]" (both measured on the CPU)
    old = jaxcompat.jax_version_tuple() < (0, 11)
    said = "deleted or donated" if old else "Array has been deleted"
    with pytest.raises(ValueError if old else RuntimeError, match=said):
        step(s, x)
    assert said in p.advice and ("INVALID_ARGUMENT" in p.advice) == old


def test_jax_26000_a_creation_s_device_inside_jit_is_named_as_dropped():
    cpu0, cpu1, cpu2 = jax.devices()[:3]  # the session's simulated CPU devices (conftest)

    def make(n):
        return jnp.zeros(n, device=cpu1) + 1  # the user meant: make it on cpu:1

    step = jax.jit(make, static_argnums=0)
    assert step(8).devices() == {cpu0}  # what the thread saw: device= did nothing
    p = preflight.preflight_step(step, 8)
    ((said, line),) = p.dropped_device_keywords
    assert p.ignored_device_puts == () and said == "device=cpu1"
    assert "jnp.zeros(n, device=cpu1)" in line
    assert "device=cpu1 is dropped inside jit" in p.advice and "runs, cpu:0" in p.advice
    assert "does nothing inside jit" not in p.advice  # not the device_put note
    fixed = jax.jit(make, static_argnums=0,
                    out_shardings=jax.sharding.SingleDeviceSharding(cpu1))
    assert fixed(8).devices() == {cpu1}  # the fix the note gives

    def beside(n, x):
        return jnp.zeros(n, device=cpu1) + x  # runs where x is: cpu:2

    x = jax.device_put(1.0, cpu2)
    assert jax.jit(beside, static_argnums=0)(8, x).devices() == {cpu2}
    q = preflight.preflight_step(jax.jit(beside, static_argnums=0), 8, x)
    assert "runs, cpu:2" in q.advice

    def spread(n):  # a long call as black writes it: the keyword on a later line
        return jnp.zeros(
            (n,),
            dtype=jnp.float32,
            device=cpu1,
        ) + 1

    ((said, line),) = preflight.preflight_step(jax.jit(spread, static_argnums=0), 8
                                               ).dropped_device_keywords
    assert said == "device=cpu1" and line.endswith("return jnp.zeros(")

    def plain(n):
        return jnp.zeros(n) + 1  # device: a comment is not a keyword, device=cpu1

    assert preflight.preflight_step(jax.jit(plain, static_argnums=0), 8
                                    ).dropped_device_keywords == ()

    def honoured(x):
        return jnp.asarray(x, device=cpu1) * 2  # a constraint inside jit: it does move

    assert jax.jit(honoured)(jnp.ones(8)).devices() == {cpu1}
    device = "cpu"

    def not_a_keyword(x):
        return jnp.zeros(8, device=None) + (x * 2 if device == "gpu" else x + 1)

    for f in (honoured, not_a_keyword):
        p = preflight.preflight_step(f, jnp.ones(8))
        assert p.dropped_device_keywords == p.ignored_device_puts == (), f


@jax.tree_util.register_pytree_node_class
class _Model:
    """A stand-in for an Equinox module with a static field (Equinox is not a dependency):
    ``w`` is a child, ``table`` is metadata, as ``eqx.field(static=True)`` makes it."""

    def __init__(self, w, table):
        self.w, self.table = w, table

    def tree_flatten(self):
        return (self.w,), ("table", self.table)

    @classmethod
    def tree_unflatten(cls, metadata, children):
        return cls(children[0], metadata[1])


def test_equinox_746_an_array_in_a_static_field_is_named_before_the_call_that_fails():
    @jax.jit
    def step(model, x):
        return (model.w * x * model.table).sum()

    first = _Model(jnp.ones(3), np.arange(3.0))
    p = preflight.preflight_step(step, first, 1.0)  # before the call that fails
    assert p.static_arrays == (("model", "_Model", "float64[3] (24 B)"),)
    assert "model keeps an array, float64[3] (24 B), in the static part of its _Model" in p.advice
    assert "field marked static" in p.advice and "Make it an ordinary field" in p.advice
    step(first, 1.0)
    second = _Model(jnp.ones(3), np.arange(3.0))
    with pytest.raises(ValueError, match="arrays cannot be passed as metadata fields"):
        step(second, 2.0)  # what the thread saw, in JAX's words
    with pytest.raises(errors.BadInputError) as after:  # the kit's lowering meets it too
        preflight.preflight_step(step, second, 2.0)
    assert "An argument's _Model keeps an array, float64[3], in its static part" in str(
        after.value) and "make it an ordinary field" in str(after.value)
    with pytest.raises(errors.BadInputError) as other:  # an error of another kind: no hint
        preflight.preflight_step(lambda model, x: model.w.reshape(7), first, 1.0)
    assert "static part" not in str(other.value)
    scalar = preflight.preflight_step(lambda model, x: (model.w * x * model.table).sum(),
                                      _Model(jnp.ones(3), np.float32(2.0)), 1.0)
    assert scalar.static_arrays == () and "keeps an array" not in scalar.advice


def test_jax_215_jacrev_over_a_tall_jacobian_is_named_with_jacfwd():
    lm = np.random.RandomState(0).randn(10, 2).astype(np.float32)  # 20 inputs
    uvw = np.random.RandomState(1).randn(32, 3).astype(np.float32)  # the thread's 128, less
    freq = np.linspace(0.856e9, 0.856e9 * 2, 16).astype(np.float32)

    def fn(lm, uvw, frequency):  # the thread's function: 10 x 32 x 16 = 5,120 outputs
        el, m = lm[:, 0, None, None], lm[:, 1, None, None]
        n = jnp.sqrt(1.0 - el**2 - m**2) - 1.0
        u, v, w = uvw[None, :, 0, None], uvw[None, :, 1, None], uvw[None, :, 2, None]
        return (u * el + v * m + w * n) * frequency

    def step(lm, uvw, freq):
        return jax.jacrev(fn, 0)(lm, uvw, freq)

    p = preflight.preflight_step(step, lm, uvw, freq)
    (jac,) = p.jacobians
    assert (jac.mode, jac.outputs, jac.inputs) == ("reverse", 5120, 20)
    assert jac.basis_bytes == 5120 * 5120 * 4 and "jax.jacrev(fn, 0)(lm, uvw, freq)" in jac.line
    assert "one row per output of the function, all 5,120 at once under vmap" in p.advice
    assert "jax.jacfwd makes the same Jacobian one column per input (20 inputs here)" in p.advice
    rows = max((t for t in p.largest_temporaries if t.shape[0] == 5120), key=lambda t: t.nbytes)
    assert f"XLA's plan holds {rows.op} {rows.dtype}{list(rows.shape)}" in p.advice
    assert "lax.map" not in p.advice  # not the vmap note: its batch is jacrev's rows
    forward = preflight.preflight_step(
        lambda lm, uvw, freq: jax.jacfwd(fn, 0)(lm, uvw, freq), lm, uvw, freq)
    # the fix, as the kit's own sizes show it: 107 MiB to 401 KiB on jax 0.10.2 (whose plan
    # holds the 100 MiB identity), 6.8 MiB to 401 KiB on 0.8.0 (whose plan fuses it away)
    assert forward.peak_bytes * 10 < p.peak_bytes
    assert "needs far less" not in forward.advice
    assert [(j.mode, j.outputs, j.inputs) for j in forward.jacobians] == [("forward", 5120, 20)]


def test_jax_719_jacfwd_over_a_wide_jacobian_is_named_with_jacrev():
    idx = jnp.arange(10) * 400

    def gather_mmul(a, b):  # the thread's function: a scalar of 4,096 inputs
        return jnp.sum(jnp.matmul(a[idx], b))

    a, b = jnp.ones(4096), jnp.ones((10, 10))
    p = preflight.preflight_step(jax.jacfwd(gather_mmul), a, b)
    assert [(j.mode, j.outputs, j.inputs) for j in p.jacobians] == [("forward", 1, 4096)]
    assert "one column per input of the function, all 4,096 at once" in p.advice
    assert "jax.jacrev makes the same Jacobian one row per output (1 output here)" in p.advice
    reverse = preflight.preflight_step(jax.jacrev(gather_mmul), a, b)
    assert reverse.peak_bytes * 20 < p.peak_bytes and "needs far less" not in reverse.advice
    w = jnp.full((601, 600), 0.01)
    near = preflight.preflight_step(jax.jacrev(lambda x: jnp.tanh(w @ x)), jnp.ones(600))
    assert near.jacobians[0].outputs == 601 and "needs far less" not in near.advice  # ~square
    square = preflight.preflight_step(jax.hessian(lambda x: jnp.sum(jnp.tanh(x) ** 2)),
                                      jnp.ones(512))  # jacfwd of jacrev: nothing the long way
    assert [(j.mode, j.outputs, j.inputs) for j in square.jacobians] == [("forward", 512, 512)]
    assert "needs far less" not in square.advice


def test_jax_14447_jacfwd_of_a_deep_function_stays_named_where_no_one_tangent_is_a_quarter():
    """jax-ml/jax#14447: jacfwd runs out of memory where grad does not; mattjj: jacfwd pushes
    forward a whole basis of tangents, jax.jvp one. At 30 layers XLA's plan holds four
    tangents of the basis, none a quarter of the peak alone (24.9%), and the kit named only
    the unrolled loop, with a checkpoint for a backward pass the step does not have (a new
    user's trial). The tangents are counted together now."""
    n, depth = 1024, 30
    x, v = jnp.linspace(0.1, 1.0, n), jnp.ones(n) / n

    def f(x):
        for i in range(depth):
            x = jnp.sin(x) * 1.01 + 0.1 * jnp.cos(x * (i + 1))
        return jnp.sum(x ** 2)

    whole = preflight.preflight_step(jax.jacfwd(f), x)
    assert "one column per input of the function, all 1,024 at once" in whole.advice
    assert "jax.jacrev makes the same Jacobian one row per output" in whole.advice
    assert "put jax.checkpoint on the scan's body" not in whole.advice  # no backward pass
    reverse = preflight.preflight_step(jax.grad(f), x)
    assert reverse.peak_bytes * 20 < whole.peak_bytes
    assert jnp.allclose(jax.grad(f)(x), jax.jacfwd(f)(x), rtol=1e-4)
    product = preflight.preflight_step(lambda x, v: jax.jacfwd(f)(x) @ v, x, v)
    assert "jax.jvp(f, (x,), (v,))[1] gives J @ v without it" in product.advice
    one = preflight.preflight_step(lambda x, v: jax.jvp(f, (x,), (v,))[1], x, v)
    assert one.peak_bytes * 20 < product.peak_bytes and "without it" not in one.advice
    assert jnp.allclose(jax.jvp(f, (x,), (v,))[1], jax.jacfwd(f)(x) @ v, rtol=1e-4)


def test_jax_13762_a_pure_callback_whose_result_is_unused_is_named_as_removed():
    """jax-ml/jax#13762: a jax.pure_callback whose result nothing reads is still in the jaxpr,
    and never runs: XLA removes it as dead code (mattjj). The kit told the user it "runs
    Python outside XLA's plan" (a new user's trial). It now says it never runs, and names
    io_callback, which runs."""
    from jax.experimental import io_callback

    calls = []

    def log(v):
        calls.append(1)
        return v

    def unused(x):
        _ = jax.pure_callback(log, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return x * 2

    def used(x):
        return jax.pure_callback(log, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2

    def kept(x):
        io_callback(lambda v: calls.append(1), None, x)
        return x * 2

    x = jnp.ones(8)
    said = preflight.preflight_step(unused, x).advice
    assert "never runs" in said and "jax.experimental.io_callback" in said
    assert "runs Python outside XLA's plan" not in said
    jax.jit(unused)(x).block_until_ready()
    assert calls == []  # the thread's finding, run: the callback was never called
    other = preflight.preflight_step(used, x).advice
    assert "never runs" not in other and "runs Python outside XLA's plan" in other
    assert "never runs" not in preflight.preflight_step(kept, x).advice
    jax.jit(kept)(x).block_until_ready()
    jax.effects_barrier()
    assert len(calls) == 1  # the fix: io_callback runs


def test_big_vision_14_frozen_updates_multiplied_by_zero_are_named_with_set_to_zero():
    # optax.scale(0.0) over frozen parameters, as big_vision did before the pull request; a
    # plain-JAX stand-in (optax is not a dependency): the same literal 0.0 times each update
    params = {"frozen": [jnp.full((512, 512), 0.05) for _ in range(4)],
              "head": jnp.full((512, 10), 0.05)}
    x = jnp.ones((256, 512))

    def loss(p, x):
        for w in p["frozen"]:
            x = jax.nn.relu(x @ w)
        return (x @ p["head"]).sum()

    def step(p, x, zeros):
        g = jax.grad(loss)(p, x)
        update = {"frozen": [zeros(gi) for gi in g["frozen"]], "head": -1e-3 * g["head"]}
        return jax.tree.map(lambda a, b: a + b, p, update)

    scaled = preflight.preflight_step(lambda p, x: step(p, x, lambda gi: 0.0 * gi), params, x)
    assert [z[:2] for z in scaled.scaled_by_zero] == [("float32[512, 512]", 2**20)] * 4
    assert "4 arrays (4.00 MiB; the largest float32[512, 512], " in scaled.advice
    assert "optax.set_to_zero()" in scaled.advice
    assert "still computes those gradients" in scaled.advice
    fixed = preflight.preflight_step(lambda p, x: step(p, x, jnp.zeros_like), params, x)
    assert fixed.scaled_by_zero == () and "set_to_zero" not in fixed.advice
    assert fixed.temp_bytes < scaled.temp_bytes  # XLA drops the frozen gradients' work

    def no_decay(p, x):  # a weight decay of 0.0 times the argument: nothing computed for it
        return jax.tree.map(lambda w: w - 1e-3 * (0.0 * w), p)

    def counted(p, x):
        return jnp.arange(512 * 512).reshape(512, 512) * 0 + x.sum().astype(int)  # integers

    for f in (no_decay, counted):
        assert preflight.preflight_step(f, params, x).scaled_by_zero == (), f


def test_transformers_12534_float32_parameters_read_only_as_bfloat16_are_named_with_the_cast():
    # a Flax model's dtype=bfloat16 sets the computation's type, and its parameters stay
    # float32: a plain-JAX stand-in of its Dense layers (Flax casts each kernel with
    # jnp.asarray(kernel, dtype), a convert_element_type, as .astype does here)
    params = {"dense_0": {"kernel": jnp.full((1024, 1024), 0.01), "bias": jnp.zeros(1024)},
              "dense_1": {"kernel": jnp.full((1024, 1024), 0.01), "bias": jnp.zeros(1024)}}
    x = jnp.ones((8, 1024), jnp.bfloat16)

    def forward(params, x):
        for layer in ("dense_0", "dense_1"):
            p = params[layer]
            x = jax.nn.relu(x @ p["kernel"].astype(jnp.bfloat16) + p["bias"].astype(jnp.bfloat16))
        return x

    p = preflight.preflight_step(forward, params, x)
    assert [(n.argument, n.read_as) for n in p.narrowed_arguments][:2] == [
        ("params['dense_0']['kernel']", "bfloat16"), ("params['dense_1']['kernel']", "bfloat16")]
    assert len(p.narrowed_arguments) == 4 and "x @ p[\"kernel\"]" in p.narrowed_arguments[0].line
    assert "and 3 more argument arrays (8.01 MiB, float32) are read only as bfloat16" in p.advice
    assert "p.astype(jnp.bfloat16), params)" in p.advice and "model.to_bf16(params)" in p.advice
    assert "they take 4.00 MiB less" in p.advice
    # stored as bfloat16, as the fix says: nothing to name, and the arguments take half
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    fixed = preflight.preflight_step(forward, half, x)
    assert fixed.narrowed_arguments == () and "read only as" not in fixed.advice
    assert p.argument_bytes - fixed.argument_bytes == 4 * MiB + 2 * 1024 * 2


def test_transformers_12534_master_weights_and_full_width_reads_are_not_named():
    params = {"kernel": jnp.full((1024, 1024), 0.01), "bias": jnp.zeros(1024)}
    x = jnp.ones((8, 1024), jnp.bfloat16)

    def forward(params, x):
        return x @ params["kernel"].astype(jnp.bfloat16) + params["bias"].astype(jnp.bfloat16)

    def loss(params, x):
        return forward(params, x).astype(jnp.float32).sum()

    def step(params, x):  # mixed precision: float32 master weights, updated in float32
        g = jax.grad(loss)(params, x)
        return jax.tree.map(lambda w, d: w - 1e-3 * d, params, g)

    def wide(params, x):  # the kernel is also read as float32
        return forward(params, x).astype(jnp.float32) @ params["kernel"]

    assert [n.argument for n in preflight.preflight_step(jax.jit(forward), params, x)
            .narrowed_arguments] == ["params['kernel']", "params['bias']"]  # into an inner jit
    for f in (jax.grad(loss), step):  # an output of their shape and dtype: master weights
        assert preflight.preflight_step(f, params, x).narrowed_arguments == (), f
    assert [n.argument for n in preflight.preflight_step(wide, params, x)
            .narrowed_arguments] == ["params['bias']"]


def test_transformers_15766_a_random_init_beside_the_loaded_weights_is_named_as_two_copies():
    # a Hugging Face Flax model made from its config initializes random weights; loading the
    # pretrained ones makes a second tree alike. A stand-in model object that holds .params
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"encoder": {"kernel": jax.random.normal(k1, (512, 512)), "bias": jnp.zeros(512)},
                "head": jax.random.normal(k2, (512, 64))}

    class FlaxModel:
        def __init__(self, params):
            self.params = params

    model = FlaxModel(init(jax.random.key(0)))  # FlaxBertModel(config): a random init
    loaded = init(jax.random.key(1))  # the pretrained weights, read from a file
    ns = {"model": model, "loaded": loaded, "also_loaded": loaded,  # one tree, two names
          "opt_state": ({"mu": init(jax.random.key(2))},)}  # inside a tuple: not looked at
    h = holders.largest(2, namespace=ns)
    each = 4 * (512 * 512 + 512 + 512 * 64)
    assert h.alike == ((("model.params", "loaded"), each),)
    text = str(h)
    assert "model.params and loaded hold trees alike" in text
    assert f"{format_bytes(2 * each)} together" in text and "gradients, an EMA" in text
    assert "_do_init=False" in text and "`del` it" in text
    model.params = loaded  # the fix: the model holds the loaded tree, the random one is gone
    assert holders.largest(2, namespace=ns).alike == ()

    class PreTrained:  # transformers' FlaxPreTrainedModel: _params behind a params property
        def __init__(self, params):
            self._params = params

        @property
        def params(self):
            return self._params

    ns["model"] = PreTrained(init(jax.random.key(3)))
    assert holders.largest(2, namespace=ns).alike == ((("model.params", "loaded"), each),)
    donated = jax.jit(lambda p: jax.tree.map(lambda a: a + 1, p), donate_argnums=0)
    ns["model"] = PreTrained(donated(ns["model"].params))  # the old tree's arrays are deleted
    ns["old"] = loaded
    ns["loaded"] = donated(loaded)  # `old` holds only deleted arrays now: no memory
    assert all("old" not in names for names, _ in holders.largest(2, namespace=ns).alike)
    del ns["opt_state"], model
    gc.collect()


def test_jax_23316_a_frozen_parameter_s_zero_gradient_is_named_and_not_offered_for_donation():
    # LoRA: the frozen weight under stop_gradient, yet jax.grad returns a zero array its size
    params = {"frozen": jnp.full((1024, 1024), 0.01), "lora_a": jnp.full((1024, 8), 0.01),
              "lora_b": jnp.zeros((8, 1024))}
    x = jnp.ones((16, 1024))

    def loss(p, x):
        w = jax.lax.stop_gradient(p["frozen"]) + p["lora_a"] @ p["lora_b"]
        return jnp.tanh(x @ w).sum()

    grads = jax.grad(loss)(params, x)
    assert not grads["frozen"].any()  # what the thread saw: zeros, made all the same
    p = preflight.preflight_step(jax.grad(loss), params, x)
    assert p.zero_gradients == (("['frozen']", "float32[1024, 1024]", 4 * MiB),)
    assert "The output ['frozen'] (float32[1024, 1024], 4.00 MiB) is a gradient JAX knows to " \
           "be zero" in p.advice and "outside jax.grad's argnums" in p.advice
    # gradients have their parameters' shapes, and are no new value of them: not "donate"
    assert "Nothing donated" not in p.advice

    def split(trained, frozen, x):  # the fix: differentiate only what is trained
        return loss({**trained, "frozen": frozen}, x)

    trained = {k: v for k, v in params.items() if k != "frozen"}
    fixed = preflight.preflight_step(jax.grad(split), trained, params["frozen"], x)
    assert fixed.zero_gradients == () and fixed.output_bytes < p.output_bytes - 4 * MiB + 1

    def step(p, x):  # the gradients applied inside the step: no zero output is left
        return jax.tree.map(lambda w, g: w - 0.1 * g, p, jax.grad(loss)(p, x))

    def init(p, x):  # an optimizer's zeros are no gradient
        return jax.tree.map(jnp.zeros_like, p)

    for f in (step, init):
        assert preflight.preflight_step(f, params, x).zero_gradients == (), f
    assert "Nothing donated for p" in preflight.preflight_step(step, params, x).advice


def test_jax_9714_cg_outside_jit_compiles_its_loop_every_call_and_the_kit_says_why():
    """Host memory grew with every call of jax.scipy.sparse.linalg.cg outside jit: its while
    loop's body closes over each call's matrix, a new program every call (the thread: no growth
    with cg jitted, maxiter static)."""
    from jax.scipy.sparse.linalg import cg

    def system(i):
        a = jax.random.normal(jax.random.key(i), (32, 32))
        return a @ a.T + 32 * jnp.eye(32), jnp.ones(32)

    with compiles.watch() as log:
        for i in range(3):
            cg(*system(i), maxiter=20)[0].block_until_ready()
    (eager,) = [f for f in log.functions if f.cause == compiles.EAGER]
    assert "while" in eager.same_types_again  # (0.8.0: a convert to two dtypes too)
    assert "while compiled again with the same argument types" in log.diagnosis
    assert "jax.jit(cg, static_argnames='maxiter')" in log.diagnosis
    jitted = jax.jit(cg, static_argnames="maxiter")
    with compiles.watch() as fixed:
        for i in range(3):
            jitted(*system(i), maxiter=20)[0].block_until_ready()
    assert not any("while" in c for f in fixed.functions for c in f.changed)  # one program
    assert all(f.same_types_again == () for f in fixed.functions)

    def cond(c):
        return c[0] < 10

    def body(c):  # one body function, called again: JAX's cache serves it, nothing to say
        return c[0] + 1, c[1] * 2.0

    with compiles.watch() as same:
        for i in range(3):
            jax.lax.while_loop(cond, body, (0, jnp.ones(4) * i))
    assert all(f.same_types_again == () for f in same.functions)
    assert "compiled again with the same argument types" not in same.diagnosis


def test_optax_328_a_power_of_the_step_count_outside_jit_compiles_every_step():
    """Adam's bias correction outside jit: decay ** count, count a concrete integer, is an
    integer_pow with the exponent baked in: a new program every step (the kit said 'for each
    new shape', and no shape changed)."""
    def bias_correction(moment, decay, count):  # optax's _bias_correction before PR #329
        return moment / (1 - decay ** count)

    mu, count = jnp.ones(3), jnp.array(1, jnp.int32)
    bias_correction(mu, 0.9, count)
    with compiles.watch() as log:
        for _ in range(4):
            count = count + 1
            bias_correction(mu, 0.9, count)
    (eager,) = [f for f in log.functions if f.cause == compiles.EAGER]
    assert eager.same_types_again == ("integer_pow",)
    assert "integer_pow compiled again with the same argument types" in log.diagnosis
    assert "optax#328" in log.diagnosis and "x ** n.astype(jnp.float32)" in log.diagnosis
    for fixed in (jax.jit(bias_correction),  # the merged fix: jitted
                  lambda m, d, c: bias_correction(m, d, c.astype(jnp.float32))):
        fixed(mu, 0.9, count)
        with compiles.watch() as after:
            for _ in range(4):
                count = count + 1
                fixed(mu, 0.9, count)
        assert all(f.same_types_again == () for f in after.functions)
        assert "compiled again with the same argument types" not in after.diagnosis


def test_jax_19654_disable_jit_makes_a_library_s_jitted_update_compile_every_step():
    """Under jax_disable_jit an optimizer's jitted update runs operation by operation: its
    bias correction's integer_pow compiled at every step (the thread: 'does not disable jit
    for library functions, but does disable compilation caching')."""
    @jax.jit  # a library's update, jitted by the library
    def update(mu, count):
        return mu / (1 - 0.9 ** count), count + 1

    mu, count = jnp.ones(3), jnp.array(1, jnp.int32)
    with jax.disable_jit():
        with compiles.watch() as log:
            for _ in range(4):
                mu, count = update(mu, count)
    assert log.jit_disabled and "jax.disable_jit is on" in log.diagnosis
    assert "jax-ml/jax#19654" in log.diagnosis and "integer_pow" in log.diagnosis
    update(mu, count)
    with compiles.watch() as on:  # jit on: the update compiled once, before the block
        for _ in range(4):
            mu, count = update(mu, count)
    assert not on.jit_disabled and on.compiles == 0 and "disable_jit" not in on.diagnosis


def test_numpyro_1249_a_start_spent_compiling_names_the_persistent_cache(tmp_path):
    """Every run of the program waited seconds before sampling: compiling, paid again by each
    new process; JAX's persistent compilation cache keeps the programs on disk (the
    maintainer's answer). Run in fresh processes: the cache is process-wide. The thresholds are
    set to 0 so that no assert depends on how long a compile takes."""
    from tests.conftest import run_python

    code = """
import jax, jax.numpy as jnp
from helpers import compiles
compiles.HEAVY_COMPILE_SECONDS, compiles.HEAVY_COMPILE_SHARE = 0.0, 0.0
if {cache!r}:
    jax.config.update("jax_compilation_cache_dir", {cache!r})
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
with compiles.watch() as log:
    jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).block_until_ready()
print("LOADS", log.cache_loads)
print(log.diagnosis)
print(log)
"""
    cold = run_python(code.format(cache=""))
    assert cold.returncode == 0, cold.stderr
    assert "jax_compilation_cache_dir" in cold.stdout and "numpyro#1249" in cold.stdout
    assert "jax_persistent_cache_min_compile_time_secs" in cold.stdout  # 1 s by default
    cache = str(tmp_path / "jax-cache")
    first, second = (run_python(code.format(cache=cache)) for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "jax_compilation_cache_dir" not in first.stdout + second.stdout  # a cache is set
    assert "LOADS 0" in first.stdout and "LOADS 0" not in second.stdout  # loaded, not compiled
    assert "loaded from the persistent compilation cache" in second.stdout


def test_desc_1402_programs_loaded_from_the_cache_are_not_told_to_pad(tmp_path):
    """PlasmaControl/DESC#1402: each session compiled the objective again for each of a few
    resolutions; the maintainers' answer, the persistent cache. A trial was told "pad or
    bucket" (every small case 3.2x slower, still compiled each session), and in the second
    session, the three programs loaded from the cache in 0.20 s, "compiled 3 times ... pad or
    bucket" again. The new-shapes fix names the cache now, and loads are said as loads. Fresh
    processes: the cache is process-wide; the thresholds at 0, no assert on a duration."""
    from tests.conftest import run_python

    code = """
import jax, jax.numpy as jnp
from helpers import compiles
jax.config.update("jax_compilation_cache_dir", {cache!r})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
objective = jax.jit(lambda c: jnp.sum(jnp.sin(c) ** 2))
with compiles.watch() as log:
    for n in (25, 81, 169):  # three resolutions
        objective(jnp.ones(n)).block_until_ready()
(entry,) = [f for f in log.functions if f.function == "<lambda>"]
print("LOADS", entry.cache_loads, entry.compiles)
print(entry.diagnosis)
"""
    cache = str(tmp_path / "jax-cache")
    first, second = (run_python(code.format(cache=cache)) for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "LOADS 0 3" in first.stdout and "pad or bucket" in first.stdout
    assert "each shape is a problem of its own" in first.stdout and "DESC#1402" in first.stdout
    assert "LOADS 3 3" in second.stdout
    assert "each program loaded from the persistent compilation cache" in second.stdout
    assert "pad or bucket" not in second.stdout


def test_jax_21908_a_cache_folder_left_empty_is_explained_by_jaxs_thresholds(tmp_path):
    """The cache folder set as the docs say, and nothing written: JAX keeps only programs that
    took jax_persistent_cache_min_compile_time_secs (1 s) to compile (the thread's answer).
    JAX says so for each program while it explains cache misses, which watch() turns on; the
    kit hid those lines and said nothing. Fresh processes: the cache is process-wide."""
    from tests.conftest import run_python

    code = """
import os, jax, jax.numpy as jnp
from helpers import compiles
jax.config.update("jax_compilation_cache_dir", {cache!r})
if {fixed!r}:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
with compiles.watch() as log:
    jax.jit(lambda x, y: jnp.matmul(x, y))(jnp.ones((2, 2)), jnp.ones((2, 2)))
print("WRITTEN", log.cache_written, "FILES", len(os.listdir({cache!r})))
print(log.diagnosis)
"""
    empty = run_python(code.format(cache=str(tmp_path / "a"), fixed=False))
    assert empty.returncode == 0, empty.stderr
    assert "WRITTEN 0 FILES 0" in empty.stdout
    assert "Nothing compiled in this block was written to the persistent cache" in empty.stdout
    assert "quicker than jax_persistent_cache_min_compile_time_secs" in empty.stdout
    assert "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)" in empty.stdout
    assert "Not writing persistent cache entry" not in empty.stderr  # counted, not printed
    fixed = run_python(code.format(cache=str(tmp_path / "b"), fixed=True))  # the fix works
    assert fixed.returncode == 0, fixed.stderr
    written = int(fixed.stdout.split("WRITTEN ")[1].split()[0])
    assert written >= 1 and f"FILES {written}" in fixed.stdout
    assert "Nothing compiled" not in fixed.stdout


def test_jax_7930_a_function_made_anew_with_a_new_shape_each_call_is_called_new_shapes():
    """jit(f) made anew each pass, with a new shape each pass: "make it once" saves no compile
    and keeps every shape's program alive as long as f is (the kit gave that fix); the cause is
    the shapes. JAX keys its caches on f, not on the jit wrapper."""
    with compiles.watch() as anew:
        for n in range(8, 12):
            def f(x):
                return jnp.mean(x @ x.T)
            jax.jit(f)(np.ones((n, n), np.float32))
    fresh = anew.function("f")
    assert fresh.cause == "new shapes" and fresh.compiles == 4
    assert "making it once saves no compile" in fresh.fix and "Pad or bucket" in fresh.fix
    assert fresh.changed[0] == "float32[8,8]"
    assert "dropping the jitted wrapper frees nothing" in anew.diagnosis
    with compiles.watch() as same:  # made anew, the same shape: making it once is the fix
        for _ in range(3):
            def g(x):
                return jnp.mean(x @ x.T)
            jax.jit(g)(np.ones((8, 8), np.float32))
    assert same.function("g").cause == "function made anew"


def test_orbax_3183_an_array_committed_to_one_device_under_set_mesh_is_named():
    """Inside jax.set_mesh, any operation on an array committed to one device raises
    "incompatible devices" (orbax#3183, tpu-inference#3140, maxtext#2863: a mesh in plain device
    order too); tree_placement said "no problem for a jit over it", and oom.explain called the
    ValueError an out-of-memory error."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import oom

    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    t = jax.device_put(jnp.arange(64.0), jax.devices()[0])
    u = jnp.arange(64.0)  # uncommitted
    assert not devices.tree_placement({"t": t}).problems  # no mesh set: nothing to say
    with jax.set_mesh(mesh):
        with pytest.raises(ValueError, match="incompatible devices") as raised:
            t[:16]
        (problem,) = devices.tree_placement({"t": t}).problems
        said = devices.placement(t).explanation
        moved = devices.placement(u).explanation
        assert np.asarray(t)[:16].shape == (16,)  # the fixes the kit gives work
        assert jax.device_put(t, NamedSharding(mesh, P()))[:16].shape == (16,)
        copied = u * 2
    assert "committed to one device while jax.set_mesh has set a mesh" in problem
    assert "np.asarray" in problem and "outside the jax.set_mesh block" in problem
    assert "raises \"Received incompatible devices" in said and "np.asarray(x)" in said
    assert f"whole on each of the {len(jax.devices())} devices" in moved
    assert "P('x')" in moved  # the mesh's own axis
    assert len(copied.sharding.device_set) == len(jax.devices())  # as the note says
    with pytest.raises(errors.BadInputError, match="not an out-of-memory error .*tree_placement"):
        oom.explain(raised.value)


def test_maxtext_4405_a_scan_body_that_returns_its_layer_unchanged_is_named():
    """An NNX scan over layers returned nnx.state(layer), the read-only parameters too, so the
    scan stacked a copy of every parameter (the PR's analysis). The kit named the stack, with a
    sum-in-the-carry fix that does not apply. It shows under jax.checkpoint, as maxtext's
    layers are; without it JAX drops the copy itself."""
    layers, d = 8, 384  # 4.5 MiB of weights

    def decoder(params, x, checkpoint):
        def body(h, layer):
            return jnp.tanh(h @ layer["w"]), layer  # the layer's state, unchanged
        h, state = jax.lax.scan(jax.checkpoint(body) if checkpoint else body, x, params)
        return h.sum(), state  # NNX writes the returned state back into the module

    params = {"w": jnp.full((layers, d, d), 0.01)}
    x = jnp.ones((4, d))
    p = preflight.preflight_step(lambda p, x: decoder(p, x, True), params, x)
    (stack,) = p.scan_stacks
    assert stack.copied_bytes == stack.nbytes == params["w"].nbytes
    assert "the body returning its slice of what the scan reads, unchanged" in p.advice
    assert "nnx.Param" in p.advice and "a sum, or the last value" not in p.advice
    plain = preflight.preflight_step(lambda p, x: decoder(p, x, False), params, x)
    assert not plain.scan_stacks  # no checkpoint: JAX forwarded the slice, nothing stacked


def test_jax_15895_dropout_bits_exchanged_over_devices_are_named_though_they_are_small():
    """jax-ml/jax#15895: a data-parallel step with dropout ran slower on 2 GPUs than on 1 with
    jax_threefry_partitionable off (the thread's fix turns it on). The kit named the flag only
    where the random bits were a quarter of the peak; with larger parameters it said nothing
    though the program exchanged values at every step (a new user's trial: 24 all-gathers and
    48 collective-permutes counted by name, none with the flag on). Now the exchanges are
    counted and named."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def loss(params, key, x):
        for w in params:
            x = jnp.tanh(x @ w)
            key, sub = jax.random.split(key)
            x = jnp.where(jax.random.bernoulli(sub, 0.9, x.shape), x / 0.9, 0)
        return (x ** 2).mean()

    def step(params, key, x):
        return [w - 1e-3 * g for w, g in zip(params, jax.grad(loss)(params, key, x),
                                             strict=True)]

    params = jax.device_put([jnp.full((512, 512), 0.01) for _ in range(4)], rep)  # 4 MiB
    key, x = jax.device_put(jax.random.PRNGKey(0), rep), jax.device_put(jnp.ones((16, 8, 512)),
                                                                          split)
    fsdp = jax.device_put([jnp.full((512, 512), 0.01) for _ in range(3)], split)

    def sharded(w, x, key):  # FSDP's gathers of its weights, a scalar draw: not the flag's
        def loss(w):
            h = x.reshape(-1, 512)
            for v in w:
                h = jnp.tanh(h @ v)
            return jnp.mean(h ** 2) + 0.0 * jax.random.uniform(key, ())
        return [v - 0.1 * g for v, g in zip(w, jax.grad(loss)(w), strict=True)]

    jax.config.update("jax_threefry_partitionable", False)
    try:
        off = preflight.preflight_step(step, params, key, x)
        gathered = preflight.preflight_step(sharded, fsdp, x, key)
    finally:
        jax.config.update("jax_threefry_partitionable", True)
    assert "threefry_partitionable" not in gathered.advice  # (a review: it was named)
    on = preflight.preflight_step(step, params, key, x)
    assert "jax.config.update('jax_threefry_partitionable', True)" in off.advice
    assert "all-gathers and collective-permutes of random bits, exchanges run at every step" \
        in off.advice
    assert "jax-ml/jax#15895" in off.advice and "threefry_partitionable" not in on.advice
    from helpers import compiled

    assert " all-gather(" not in (compiled.compile_step(step, params, key, x).text or "")


def test_jax_21663_no_rbg_key_advised_for_a_draw_jax_vmap_makes_from_many_keys():
    """jax-ml/jax#21663: under jax.vmap an rbg key draws the whole batch from the batch's first
    key (documented in jax-ml/jax#22684), so the numbers depend on the batch. The kit's
    threefry note advised an rbg key for a per-example draw vmapped over split keys, and
    following it, example 3 in the batch no longer equalled example 3 alone (a new user's
    trial). Now the note says why rbg is no fix there and gives lax.map's chunks, run here:
    fewer temporaries, each example its own key's numbers."""
    def noisy(keys, x):
        return jax.vmap(lambda k, xi: xi + jax.random.normal(k, xi.shape))(keys, x)

    def chunked(keys, x):
        return jax.lax.map(lambda kx: kx[1] + jax.random.normal(kx[0], kx[1].shape),
                           (keys, x), batch_size=2)

    x = jnp.zeros((8, 512, 512))
    keys = jax.random.split(jax.random.key(0), 8)
    before = preflight.preflight_step(noisy, keys, x)
    assert "jax.vmap draws them from 8 keys at once" in before.advice
    assert "is no fix here" in before.advice and "jax-ml/jax#21663" in before.advice
    assert "impl='rbg')" not in before.advice and "batch_size=k" in before.advice
    after = preflight.preflight_step(chunked, keys, x)
    assert after.temp_bytes < before.temp_bytes
    np.testing.assert_array_equal(jax.jit(chunked)(keys, x), jax.jit(noisy)(keys, x))
    rbg = jax.random.split(jax.random.key(0, impl="rbg"), 8)  # the advice the kit gave
    alone = jax.jit(noisy)(rbg[3:4], x[3:4])[0]
    assert not np.allclose(jax.jit(noisy)(rbg, x)[3], alone)  # JAX's documented behaviour


def test_jax_20328_an_embedding_table_drawn_with_threefry_holds_its_bits_several_times():
    """Initializing a large table with the default generator (threefry2x32) takes several
    times the table while its bits are made; froystig (jax#13012, jax#17982): the default
    over-generates bits, and at scale jax_default_prng_impl=rbg is the way round."""
    def init(key):
        return jax.random.normal(key, (4096, 256), jnp.float32) * 0.02  # 4 MiB

    p = preflight.preflight_step(init, jax.random.key(0))
    assert "draws 4.00 MiB of random bits through threefry2x32" in p.advice
    assert "test_user_reports.py" in p.advice  # the user's line
    assert "jax.random.key(seed, impl='rbg')" in p.advice and "jax-ml/jax#17982" in p.advice
    rbg = preflight.preflight_step(init, jax.random.key(0, impl="rbg"))  # the fix
    assert "threefry2x32" not in rbg.advice and 4 * rbg.temp_bytes < p.temp_bytes
    assert "threefry2x32" in preflight.preflight_step(init, jax.random.PRNGKey(0)).advice


def test_jax_523_an_argument_passed_by_keyword_then_by_position_is_named():
    """f(x, 11.0) then f(x, foo_power=11.0) compiles again: jit does not match keywords to
    parameters (mattjj, jax#595). On jax 0.8.0 the kit said "new shapes: pad or bucket"."""
    @jax.jit
    def foo(x, foo_power=10.0):
        return x ** foo_power

    x = jnp.ones(4)
    with compiles.watch() as log:
        foo(x, 11.0)
        foo(x, foo_power=11.0)
        foo(x, 12.0)  # by position again: a cache hit
    f = log.function("foo")
    assert f.compiles == 2 and f.cause == "new pytree structure"
    assert f.changed == ("'foo_power' by keyword in one call, as many arguments by position "
                         "in another",)
    assert f.fix.startswith("jit keys its cache on how each argument is passed")
    assert "where the keyword and the positional argument are the same parameter" in f.fix
    with compiles.watch() as keys:  # a dict argument whose keys change: not this fix
        g = jax.jit(lambda d: sum(d.values()))
        g({"a": x})
        g({"a": x, "b": x})
    assert not keys.function("<lambda>").fix.startswith("jit keys its cache on how")


def test_skyrl_539_a_kv_cache_grown_one_token_per_step_is_named_with_preallocation():
    """A decode step whose cache grows by one token per call compiles at every length; the
    maintainers preallocated the cache and wrote into it. The kit advised powers of two, and
    listed jnp.einsum's own inner jit as a nameless function "made anew" (jax 0.10.2)."""
    @jax.jit
    def decode(x, cache):
        cache = jnp.concatenate([cache, x[:, None, :]], axis=1)
        scores = jnp.einsum("bd,btd->bt", x, cache)
        return jax.nn.softmax(scores, axis=-1) @ cache, cache

    x, cache = jnp.ones((2, 8)), jnp.zeros((2, 0, 8))
    with compiles.watch() as log:
        for _ in range(5):
            out, cache = decode(x, cache)
            x = out[:, 0]
    f = log.function("decode")
    assert f.cause == "new shapes" and f.compiles == 5
    assert "grows by one along a dimension" in f.fix and "dynamic_update_slice" in f.fix
    assert all(g.function for g in log.functions)  # no nameless row
    with compiles.watch() as sizes:  # shapes that do not grow by one: padding is the fix
        for n in (5, 11, 13):
            decode(jnp.ones((2, 8)), jnp.zeros((2, n, 8)))
    assert sizes.function("decode").fix.startswith("pad or bucket")


def test_jax_5210_a_switch_outside_jit_with_branches_made_anew_compiles_every_call():
    """lax.switch called outside jit with branch lambdas made at each call over that call's
    arrays: "we are repeatedly compiling cond primitive and never getting cache hits"
    (hawkinsp). The kit named it with a fix for cg; the fix for a switch is branches made once,
    the arrays passed as operands."""
    def anew(i, x, y):
        return jax.lax.switch(i, [lambda _: x, lambda _: y], None)

    def first(ops):
        return ops[0]

    def second(ops):
        return ops[1]

    x, y, i = jnp.ones(8), jnp.zeros(8), jnp.int32(1)
    with compiles.watch() as log:
        for _ in range(4):
            anew(i, x + 1, y)
    eager = log.function("eager operations")
    assert "cond" in eager.same_types_again
    assert "define its branches once" in eager.diagnosis and "jax-ml/jax#5210" in eager.diagnosis
    jax.lax.switch(i, [first, second], (x, y))  # the fix, compiled once before the block
    with compiles.watch() as fixed:
        for _ in range(4):
            jax.lax.switch(i, [first, second], (x + 1, y))
    assert not any(f.function == "eager operations" and "cond" in f.changed[0]
                   for f in fixed.functions)


def test_jax_10878_each_compile_for_a_new_static_value_keeps_its_own_constant():
    """A function with a static argument makes an array with NumPy inside: each new static
    value compiles a program holding its own copy of that array, kept in jit's cache. The kit
    counted the recompiles and called the loaded programs "generated code 0 B"; hawkinsp's
    jax#11064 made f.clear_cache() drop them."""
    from functools import partial

    table = np.random.default_rng(0).random(300_000).astype(np.float32)  # 1.14 MiB

    @partial(jax.jit, static_argnums=1)
    def f(x, n):
        return jnp.asarray(table) * x.sum() * n  # the table kept: it meets an argument

    x = jnp.ones(4)
    f.clear_cache()
    for n in (1, 2, 3):
        f(x, n)
    h = holders.largest(namespace={})
    (name, programs, nbytes), *_ = h.program_constants
    assert name == "jit_f" and programs == 3 and nbytes >= 3 * table.nbytes
    assert "3 programs named jit_f hold" in str(h) and "f.clear_cache()" in str(h)
    f.clear_cache()  # the thread's fix
    gc.collect()
    assert not any(r[0] == "jit_f" for r in holders.largest(namespace={}).program_constants)


def test_levanter_426_a_model_cast_whole_before_its_layer_loop_is_named():
    """Mixed precision cast the whole model to bfloat16, then looped over its layers: "we store
    a full bf16 copy of all the parameters" (dlwh); cast each layer inside the loop. The kit
    listed the copy among the temporaries with no cause."""
    params = {"w": jnp.full((16, 256, 256), 0.01)}  # 4 MiB of float32 layers
    x = jnp.ones((64, 256))

    def upfront(params, x):
        m = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x.astype(jnp.bfloat16), m["w"])
        return h.astype(jnp.float32).sum()

    def per_layer(params, x, checkpoint=False):
        def body(h, w):
            return jnp.tanh(h @ w.astype(jnp.bfloat16)), None
        body = jax.checkpoint(body) if checkpoint else body
        h, _ = jax.lax.scan(body, x.astype(jnp.bfloat16), params["w"])
        return h.astype(jnp.float32).sum()

    ahead = preflight.preflight_step(upfront, params, x)
    assert ahead.cast_before_scan[0][:2] == ("bfloat16[16, 256, 256]", 2 * MiB)
    assert "is cast to bfloat16 whole" in ahead.advice and "levanter#426" in ahead.advice
    inside = preflight.preflight_step(per_layer, params, x)  # the fix, forward
    assert not inside.cast_before_scan and inside.temp_bytes < ahead.temp_bytes
    grad = preflight.preflight_step(jax.grad(upfront), params, x)
    assert "also put the body under jax.checkpoint" in grad.advice
    fixed = preflight.preflight_step(jax.grad(lambda p, x: per_layer(p, x, True)), params, x)
    assert not fixed.cast_before_scan and fixed.temp_bytes < grad.temp_bytes


def test_marin_8480_a_state_initialized_then_restored_is_two_trees_alike():
    """A resume held the initialized state and the restored one together; the PR releases the
    initialized state before the restore."""
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"params": {"w": jax.random.normal(k1, (512, 512))},
                "opt": {"mu": jnp.zeros((512, 512)), "nu": jnp.zeros((512, 512))}}

    state = init(jax.random.key(0))
    restored = jax.tree.map(lambda x: x + 1, state)  # as a checkpoint's restore hands it back
    text = str(holders.largest(2, namespace={"state": state, "restored": restored}, seconds=30))
    assert "state and restored hold trees alike" in text
    assert "state['opt'] and" not in text  # a part of the two says nothing more
    assert "a state released before the restore (marin-community/marin#8480)" in text
    assert "jax.eval_shape(init, ...)" in text
    abstract = jax.eval_shape(init, jax.random.key(0))  # the other way: nothing is made
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))
    del state, restored
    gc.collect()


def test_equinox_673_layers_made_under_vmap_at_once_are_named_with_lax_map():
    """Out of memory at model creation: filter_vmap makes every layer's weights at once, in
    float32 (the maintainer's words). No one value was a quarter of the peak, so the kit said
    nothing; together, the values one line makes under vmap are."""
    layers, d = 16, 512

    def make_layer(k):
        return {"w1": jax.random.normal(k, (d, d)), "w2": jax.random.normal(k, (d, d))}

    def at_once(keys):
        return jax.tree.map(lambda a: a.astype(jnp.bfloat16), jax.vmap(make_layer)(keys))

    def by_layer(keys):  # the fix the note gives: one layer at a time
        return jax.lax.map(
            lambda k: jax.tree.map(lambda a: a.astype(jnp.bfloat16), make_layer(k)), keys)

    # on jax 0.8.0, an earlier eager jax.random.normal of the same shape (another test's) leaves
    # JAX's cached inner jaxpr with that caller's lines, and the kit then cannot see the vmap
    # as the user's (docs/limitations.md): start from JAX's caches cleared
    jax.clear_caches()
    keys = jax.random.split(jax.random.key(0), layers)
    p = preflight.preflight_step(at_once, keys)
    assert all(t.nbytes * 4 < p.peak_bytes for t in p.largest_temporaries)  # none alone
    assert "values from one line" in p.advice and "jax.lax.map(f, xs, batch_size=k)" in p.advice
    assert "make_layer" not in p.advice or "jax.random.normal(k, (d, d))" in p.advice
    fixed = preflight.preflight_step(by_layer, keys)
    assert fixed.peak_bytes * 2 < p.peak_bytes and "under jax.vmap" not in fixed.advice


def test_jax_9672_jit_of_a_bound_method_made_in_a_loop_compiles_every_call():
    class Model:
        def f(self, a):
            return a * 2 + 1

    x, a = Model(), jnp.ones(3)
    with compiles.watch() as log:
        for _ in range(3):
            jax.jit(x.f)(a)  # x.f is a new bound method at each access
    entry = log.function("f")
    assert entry.compiles == 3 and entry.cause == "function made anew"
    assert "bound method" in log.diagnosis and "make it once, outside the loop" in log.diagnosis
    f = jax.jit(x.f)  # the thread's fix: jit it once (in the constructor)
    with compiles.watch() as fixed:
        for _ in range(3):
            f(a)
    assert fixed.function("f").compiles == 1


def test_jax_14075_18263_an_array_made_whole_then_split_is_named_with_out_shardings():
    """device_put(jnp.zeros(n), sharding) over several devices failed at half of one device's
    memory: the whole array is made on one device and each piece copied from it (pschuh; the
    fix, jax#18263: make it inside jit with out_shardings)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    s = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))
    n = 1 << 18
    whole = jnp.zeros(n)
    with transfers.trace() as log:
        jax.device_put(whole, s)
        jnp.arange(n, device=s)
        jnp.zeros(n, device=s)
    reasons = {r["line"].split(": ", 1)[1]: " ".join(r["reasons"]) for r in log.by_line()}
    put = reasons["jax.device_put(whole, s)"]
    assert "whole on one device" in put and "jax-ml/jax#14075" in put and "out_shardings" in put
    assert put.startswith("jax.device_put to a sharding over several devices")
    made = reasons["jnp.arange(n, device=s)"]
    assert "made whole on the default device, then split" in made and "out_shardings" in made
    assert "jax.default_device" not in made  # it takes a device, not a sharding
    # jnp.zeros/ones/full/empty make one piece and copy it to each device (jax/_src/lax/lax.py,
    # full): no device holds the whole array; the kit said "made whole" until 2026-11-27
    filled = reasons["jnp.zeros(n, device=s)"]
    assert "piece made on the default device" in filled and "made whole" not in filled
    assert "no device holds the whole array" in filled and "out_shardings" in filled
    with transfers.trace() as fixed:
        out = jax.jit(lambda: jnp.zeros(n), out_shardings=s)()  # the fix: made in pieces
    assert not any("14075" in " ".join(r["reasons"]) for r in fixed.by_line())
    assert out.sharding == s and len(out.addressable_shards) == len(jax.devices())


def test_jax_24332_an_array_whole_on_one_device_where_a_mesh_is_in_use_is_named():
    """jnp.meshgrid of arrays made on one device returns its outputs whole there, while the
    user's program splits its arrays over a mesh; a maintainer's fix: a jit that names the
    outputs' sharding (out_shardings), as for any function of arrays."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("x",))
    xlin = jnp.linspace(0.0, 100.0, 64 * n)
    X, _ = jnp.meshgrid(xlin, xlin)
    alone = devices.placement(X).explanation
    assert "A mesh is in use" not in alone  # no mesh yet: one device is all the program uses
    params = jax.device_put(jnp.ones((2 * n, 3)), NamedSharding(mesh, P("x")))
    said = devices.placement(X).explanation
    assert f"A mesh is in use ({{'x': {n}}}, over which other live arrays are split" in said
    assert f"whole on cpu:0, all {X.nbytes:,} B on that one device" in said
    assert "jax.jit(make, out_shardings=NamedSharding(mesh, P(...)))" in said
    del params
    with jax.set_mesh(mesh):  # a mesh set for the program counts too
        assert "set by jax.set_mesh" in devices.placement(X).explanation
    X2, _ = jax.jit(jnp.meshgrid, out_shardings=NamedSharding(mesh, P("x")))(xlin, xlin)
    assert len(X2.sharding.device_set) == n  # the fix: made split, no device holds it whole
    assert devices.placement(X2).shards[0].shape == (64, 64 * n)
    assert "A mesh is in use" not in devices.placement(jnp.float32(1.0)).explanation
    del X2, _  # the fixed outputs, split over the mesh
    both = jax.device_put(jnp.ones((2 * n, 3)), NamedSharding(mesh, P()))  # replicated only
    assert "A mesh is in use" not in devices.placement(X).explanation
    split = jax.device_put(jnp.ones((2 * n, 3)), NamedSharding(mesh, P("x")))
    assert "A mesh is in use" not in devices.placement(jax.random.PRNGKey(0)).explanation
    assert "A mesh is in use" in devices.placement(X).explanation  # (2,) divides over no mesh
    del both, split


def test_keras_hub_779_a_closure_passed_as_a_static_argument_beside_another_is_named():
    """jax 0.8.0 lists every static value in its explanation ("<function ...>, 4"); the kit
    matched the whole list, missed the function and advised a traced argument for it."""
    import functools

    @functools.partial(jax.jit, static_argnums=(0, 2))
    def sample(next_fn, prompt, length):
        return jax.lax.fori_loop(0, length, lambda i, t: next_fn(t), prompt)

    def generate(params, prompt):
        def next_fn(t):  # made anew at every call, as keras-hub's sampler was
            return t + params
        return sample(next_fn, prompt, 4)

    generate(jnp.ones(4), jnp.zeros(4))
    with compiles.watch() as log:
        for _ in range(3):
            generate(jnp.ones(4), jnp.zeros(4))
    entry = log.function("sample")
    assert entry.compiles == 3 and entry.cause == "new static values"
    assert FUNCTION_FIX in log.diagnosis
    assert "make it a traced argument" not in log.diagnosis


def test_jax_12253_an_unpickled_array_is_put_where_the_tree_is_split_not_on_one_device():
    import pickle

    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4,), ("x",))
    w = jax.device_put(jnp.ones((64, 8)), NamedSharding(mesh, PartitionSpec("x")))
    loaded = pickle.loads(pickle.dumps(w))
    assert len(loaded.sharding.device_set) == 1  # pickle keeps no device or sharding
    (problem,) = devices.tree_placement({"loaded": loaded, "w": w}).problems
    assert "jax.device_put(tree, device) once" not in problem and "other.sharding" in problem
    step = jax.jit(lambda a, b: a + b)
    step(jax.device_put(loaded, w.sharding), w)  # the fix given works
    with pytest.raises(ValueError, match="incompatible devices"):  # the one it replaced did not
        step(jax.device_put(loaded, jax.devices()[0]), w)
    assert "NumPy and device_put that straight onto the sharding" in devices.placement(
        loaded).explanation


def test_maxtext_3192_a_tree_replicated_over_simulated_cpu_devices_costs_host_ram_per_copy():
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4,), ("x",))
    restored = {f"layer{i}": jax.device_put(jnp.ones((256, 256)),  # 256 KiB, replicated
                                            NamedSharding(mesh, PartitionSpec()))
                for i in range(2)}
    t = devices.tree_placement(restored)
    assert [leaf.local_bytes for leaf in t.leaves] == [4 * 256 * 1024] * 2
    (problem,) = t.problems
    assert "share this process's RAM" in problem and f"{2 * 3 * 256 * 1024:,} B" in problem
    assert "held 4 times over" in problem
    assert "one CPU device" in problem and "split" in problem
    split = {k: jax.device_put(v, NamedSharding(mesh, PartitionSpec("x")))
             for k, v in restored.items()}
    assert devices.tree_placement(split).problems == ()  # the fix: one copy of each byte


@pytest.mark.skipif(jaxcompat.jax_version_tuple() < (0, 10),
                    reason="XLA:CPU in jax 0.8.0 aborted this 4-device step's collectives in "
                    "the full suite on a 2-core machine (CI)")
def test_keras_core_832_a_state_that_comes_back_split_otherwise_is_pinned_in_the_step():
    """keras-team/keras-core#832: a training state that leaves the jitted step with other
    shardings than it came in with compiles the step again (qlzh727's fix: a sharding
    constraint on the state; keras#21559: out_shardings). The kit said to jax.device_put the
    arguments before the loop, which they already were, and which copies them every step if
    done each call (a new user's trial). It now names the leaves whose split changed and pins
    the output; its count of copies per leaf is each leaf's."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    put = {"w": NamedSharding(mesh, P(None, "model")), "b": NamedSharding(mesh, P()),
           "v": NamedSharding(mesh, P()), "step": NamedSharding(mesh, P())}
    start = jax.device_put({"w": jnp.ones((512, 1024)), "b": jnp.zeros(1024),
                            "v": jnp.zeros(1024), "step": jnp.zeros((), jnp.int32)}, put)
    x = jax.device_put(jnp.ones((256, 512)), NamedSharding(mesh, P("data", None)))

    def step(s, x):
        g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2))(
            {"w": s["w"], "b": s["b"]})
        v = 0.9 * s["v"] + g["b"] ** 2
        return {"w": s["w"] - 0.1 * g["w"], "b": s["b"] - 0.1 * g["b"] / (jnp.sqrt(v) + 1e-8),
                "v": v, "step": s["step"] + 1}

    def run(jitted):
        state = start
        with compiles.watch() as log:
            for _ in range(3):
                state = jitted(state, x)
            jax.block_until_ready(state)
        return log, state

    log, state = run(jax.jit(step))
    if state["b"].sharding.spec == P():  # (this XLA kept the bias as it came: nothing to see)
        pytest.skip("XLA returned the state as it came in")
    (f,) = [f for f in log.functions if f.function == "step"]
    assert f.compiles == 2 and f.cause == "new placement"
    said = str(log)
    assert "(jax.tree.leaves order, float32[1024]): split P('model',), before replicated P()" \
        in said
    assert "out_shardings" in said and "with_sharding_constraint" in said
    fixed, kept = run(jax.jit(lambda s, x: jax.lax.with_sharding_constraint(step(s, x), put)))
    assert [g.compiles for g in fixed.functions if g.function == "<lambda>"] == [1]
    assert kept["b"].sharding.spec == P()
    (problem,) = devices.tree_placement(state).problems
    assert "held twice to 4 times over" in problem  # ['w'], ['b'], ['v'] twice, ['step'] 4


def test_equinox_688_parameters_never_put_on_the_mesh_beside_a_split_batch():
    """patrick-kidger/equinox#688: a batch split over the devices, the model's parameters never
    put on the mesh ("it seems to work"); the fix (equinox#691) replicates them once. The kit
    called the parameters a batch to split (shaped like no committed leaf), and after the fix
    advised splitting them to save host RAM. It now names them state, copied at each call they
    are passed to and once in a loop that feeds the outputs back, with the replication fix,
    and calls the replicated copies beside a split batch the stand-in's cost. Each measured."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    params = {"w1": jnp.ones((512, 512)) * 0.01, "w2": jnp.ones((512, 512)) * 0.01}  # 1 MiB each
    batch = jax.device_put(np.ones((64, 512), np.float32),
                           NamedSharding(mesh, PartitionSpec("batch")))

    @jax.jit
    def step(p, x):
        g = jax.grad(lambda p: jnp.mean((x @ p["w1"] @ p["w2"] - x) ** 2))(p)
        return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g)

    (problem,) = devices.tree_placement({"params": params, "batch": batch}).problems
    assert problem.startswith("2 leaves (['params']['w1'], ['params']['w2']) are uncommitted")
    assert "at each call they are passed to" in problem and "copies them once" in problem
    assert "data-parallel" not in problem
    # replication first: the batch's sharding would split them as it splits the batch
    assert "once, replicated: jax.device_put(leaf, NamedSharding(other.sharding.mesh, P()))" \
        in problem and "other.sharding itself would split them" in problem
    rl = {"params": {"w": jax.device_put(jnp.ones((512, 512)), NamedSharding(
        mesh, PartitionSpec()))}, "batch": {k: jnp.ones((64, 8)) for k in ("states", "rewards")}}
    said = devices.tree_placement(rl).problems[0]  # (a review: "states" was taken for state)
    assert "['batch']['rewards'], ['batch']['states']) are uncommitted on one device" in said
    assert "as a batch is" in said

    def copies(p, feed_back):
        jax.block_until_ready(step(p, batch))  # compiled outside the count
        with transfers.trace() as log:
            for _ in range(3):
                out = step(p, batch)
                p = out if feed_back else p
            jax.block_until_ready(out)
        return log.count("device->device")

    assert copies(params, feed_back=False) == 3 * 2 * 4  # each call, each leaf, each device
    assert 0 < copies(params, feed_back=True) <= 2 * 4  # the first call only
    fixed = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    assert copies(fixed, feed_back=False) == 0  # the fix named: none
    (cost,) = devices.tree_placement({"params": fixed, "batch": batch}).problems
    assert "beside ['batch'], split over them" in cost and "a cost of the stand-in" in cost
    assert "split the leaves" not in cost


def test_flax_5110_jax_19656_a_tree_restored_in_its_saved_layout_beside_another_mesh():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    four = np.array(jax.devices()[:4])
    saved, now = Mesh(four.reshape(4, 1), ("a", "b")), Mesh(four.reshape(2, 2), ("a", "b"))
    want = NamedSharding(now, PartitionSpec("a", "b"))

    def init():
        return {"w": jax.lax.with_sharding_constraint(jnp.ones((64, 64)), want)}

    # jax#19656: eval_shape gives a restore target no sharding; with out_shardings it has one
    assert jax.eval_shape(jax.jit(init))["w"].sharding is None
    assert jax.eval_shape(jax.jit(init, out_shardings={"w": want}))["w"].sharding == want
    batch = jax.device_put(jnp.ones((64, 64)), want)
    restored = {"w": jax.device_put(jnp.ones((64, 64)), NamedSharding(saved, PartitionSpec("a")))}
    (problem,) = devices.tree_placement(restored).problems  # flax#5110: the saved layout
    assert "{'a': 4, 'b': 1}" in problem and "{'a': 2, 'b': 2}" in problem
    assert "out_shardings" in problem and "ShapeDtypeStruct" in problem
    fixed = {"w": jax.device_put(restored["w"], want)}
    assert devices.tree_placement(fixed).problems == ()
    # a model over a 2-D mesh beside data over a 1-D mesh of other axes is a design: no note
    del restored
    data = jax.device_put(jnp.ones((64, 8)), NamedSharding(Mesh(four, ("batch",)),
                                                          PartitionSpec("batch")))
    assert devices.tree_placement({"data": data}).problems == ()
    del batch


def test_tpu_inference_1989_weights_loaded_onto_the_default_device_then_sharded():
    import tempfile

    from jax.sharding import NamedSharding, PartitionSpec
    from safetensors.flax import load_file
    from safetensors.numpy import save_file

    s = NamedSharding(jax.make_mesh((4,), ("x",)), PartitionSpec("x"))
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/w.safetensors"
        save_file({"w": np.ones((256, 64), np.float32)}, path)
        loaded = load_file(path)["w"]  # a jnp array, whole on the default device
        with transfers.trace() as log:
            jax.device_put(loaded, s)
        (put,) = [" ".join(r["reasons"]) for r in log.by_line()]
        assert "whole on one device" in put and "put host data (NumPy) straight onto" in put
        from safetensors.numpy import load_file as load_numpy

        with transfers.trace() as fixed:  # the PR's fix: NumPy onto the sharding
            jax.device_put(load_numpy(path)["w"], s)
        assert all(r["direction"] == "host->device" for r in fixed.summary())


def test_jaxpi_4_a_restored_state_of_numpy_leaves_is_named_with_device_put():
    """flax.serialization.from_bytes returns NumPy leaves ("'numpy.ndarray' object has no
    attribute 'sharding'"); the maintainer's fix made them JAX arrays."""
    restored = {"params": {"w": np.ones((512, 512), np.float32)}, "step": np.int32(3)}
    (problem,) = devices.tree_placement(restored).problems
    assert "NumPy" in problem and "jax.device_put(tree) once" in problem
    assert devices.tree_placement(jax.device_put(restored)).problems == ()


def test_sglang_jax_65_a_kv_cache_not_donated_is_copied_every_decode_step():
    def decode(params, cache, tok, pos):
        k = jax.lax.dynamic_update_slice(cache["k"], (tok @ params)[:, None, :], (0, pos, 0))
        return k.sum(), {"k": k, "v": cache["v"] + 0}

    params, tok = jnp.ones((32, 32)), jnp.ones((4, 32))
    cache = {"k": jnp.zeros((4, 2048, 32)), "v": jnp.zeros((4, 2048, 32))}  # 1 MiB each
    kept = preflight.preflight_step(decode, params, cache, tok, 3)
    assert "Nothing donated for cache" in kept.advice
    donated = preflight.preflight_step(decode, params, cache, tok, 3, donate_argnums=1)
    assert all(d.reused for d in donated.donations)
    assert kept.peak_bytes - donated.peak_bytes >= 2 * MiB  # the copy the thread removed


def test_jax_5071_jit_of_a_gradient_closing_over_an_array_holds_its_own_copy():
    a = jax.random.normal(jax.random.key(1), (1024, 256))  # 1 MiB, closed over

    def fn(x):
        return jnp.sum((a @ x) ** 2)

    p = preflight.preflight_step(jax.value_and_grad(fn), jnp.ones(256))
    assert p.constant_bytes - p.folded_bytes >= a.nbytes
    assert "pass them as arguments instead" in p.advice
    passed = preflight.preflight_step(jax.value_and_grad(lambda x, a: jnp.sum((a @ x) ** 2)),
                                      jnp.ones(256), a)
    assert passed.constant_bytes < a.nbytes  # the fix: an argument, no copy in the program


def test_gemma_534_a_sampler_that_keeps_every_step_s_logits_is_named_with_top_k():
    steps, vocab = 64, 2048
    w = jax.random.normal(jax.random.key(0), (vocab, 16))

    def sampler(keep):
        def sample(w, key):
            def body(s):
                i = s["step"]
                logits = w[s["tokens"][:, i]] @ w.T  # [4, vocab]
                nxt = jax.random.categorical(jax.random.fold_in(key, i), logits)
                s = dict(s, step=i + 1, tokens=s["tokens"].at[:, i + 1].set(nxt))
                if keep == "all":  # the sampler's state kept every step's logits
                    return dict(s, logits=s["logits"].at[:, i].set(logits))
                top, ids = jax.lax.top_k(logits, 8)  # the PR's fix: the top-k only
                return dict(s, top=s["top"].at[:, i].set(top), ids=s["ids"].at[:, i].set(ids))

            s = {"step": jnp.int32(0), "tokens": jnp.zeros((4, steps + 1), jnp.int32)}
            s.update({"logits": jnp.zeros((4, steps, vocab))} if keep == "all" else
                     {"top": jnp.zeros((4, steps, 8)), "ids": jnp.zeros((4, steps, 8), jnp.int32)})
            return jax.lax.while_loop(lambda s: s["step"] < steps, body, s)
        return sample

    full = preflight.preflight_step(sampler("all"), w, jax.random.key(1))
    (record, *_), = full.loop_records
    assert record == "float32[4, 64, 2048]" and "top-k logits" in full.advice
    assert "gemma#534" in full.advice and "each of its 64 steps" in full.advice
    top = preflight.preflight_step(sampler("top"), w, jax.random.key(1))
    assert "gemma#534" not in top.advice
    assert full.peak_bytes - top.peak_bytes >= 1.5 * MiB  # the 2 MiB buffer, gone


def test_numpyro_463_a_weakly_typed_initial_state_after_clear_cache_is_no_new_shape():
    """Python scalars in the initial state are weakly typed, the state the step returns is
    not: a second compile. After f.clear_cache() JAX also says "seen another function defined
    on the same line", and the kit called it new shapes with a pad-or-bucket fix."""
    from typing import NamedTuple

    class State(NamedTuple):
        i: object
        z: object
        step_size: object

    @jax.jit
    def body(s):
        return State(s.i + 1, s.z * 0.99, s.step_size * jnp.float32(0.99))

    def run(s):
        for _ in range(3):
            s = body(s)

    with compiles.watch():
        run(State(0, jnp.ones(16), 1.0))
    body.clear_cache()
    with compiles.watch() as log:
        run(State(0, jnp.ones(16), 1.0))  # Python scalars: weakly typed
    entry = log.function("body")
    assert entry.cause == "new dtypes" and "only the weak type changed" in log.diagnosis
    assert "Pad or bucket" not in log.diagnosis
    body.clear_cache()
    with compiles.watch() as typed:  # the kit's fix: the dtype from the start
        run(State(np.int32(0), jnp.ones(16), np.float32(1.0)))
    assert typed.function("body").compiles == 1


def test_marin_3668_a_train_state_that_returns_its_parameters_twice_is_named():
    """With EMA off, the step wrote ema_params=params: one value, two outputs, written twice.
    And donating the init state, whose ema_params IS params, was called "will fail": jit drops
    the unread ema_params, and the call runs (jax 0.8.0 and 0.10.2)."""
    p = {"w1": jnp.ones((512, 512)), "w2": jnp.ones((512, 512))}  # 2 MiB

    def step(s, x):
        g = jax.grad(lambda q: jnp.sum((x @ q["w1"] @ q["w2"]) ** 2))(s["params"])
        new = jax.tree.map(lambda a, b: a - 0.1 * b, s["params"], g)
        return {"params": new, "ema_params": new}

    def fixed(s, x):  # the PR's fix: no ema_params when EMA is off
        g = jax.grad(lambda q: jnp.sum((x @ q["w1"] @ q["w2"]) ** 2))(s["params"])
        return {"params": jax.tree.map(lambda a, b: a - 0.1 * b, s["params"], g)}

    x = jnp.ones((8, 512))
    twice = preflight.preflight_step(step, {"params": p, "ema_params": p}, x, donate_argnums=0)
    assert sum(r[2] for r in twice.repeated_outputs) == 2 * MiB
    assert "are the same value" in twice.advice and "marin#3668" in twice.advice
    assert twice.verdict != "will fail"  # the unread ema_params is dropped, not donated twice
    assert "Donated but not reused" not in twice.advice  # its buffer is params', donated
    assert "Not counted" not in twice.advice
    once = preflight.preflight_step(fixed, {"params": p}, x)
    ran = jax.tree.map(jnp.copy, p)
    jax.jit(step, donate_argnums=0)({"params": ran, "ema_params": ran}, x)  # and it runs
    assert once.repeated_outputs == () and twice.output_bytes - once.output_bytes >= 2 * MiB


def test_coulombgas_2_a_matrix_stacked_on_one_device_for_pmap_is_named_with_pmap_s_fix():
    n = jax.device_count()
    fisher = jnp.eye(256) * 2.0
    step = jax.pmap(lambda f, g: f @ g)
    g = jnp.ones((n, 256))
    out = step(jnp.broadcast_to(fisher, (n, 256, 256)), g)  # the thread's replicate helper
    stacked = jnp.broadcast_to(fisher, (n, 256, 256))  # n copies, all on one device
    note = devices.placement(stacked).explanation
    assert "jax.pmap is in use" in note and "_internal_pmap" not in note and "<axis" not in note
    assert "jax.pmap(lambda _: make())" in note and "in_axes=None" in note
    other = jnp.ones((n + 1, 128))  # a pmap would refuse it: no pmap note for it
    assert "jax.pmap is in use" not in devices.placement(other).explanation
    made = jax.pmap(lambda _: jnp.zeros((256, 256)))(jnp.zeros(n))  # the thread's fix
    assert len({s.device for s in made.addressable_shards}) == n
    whole = jax.pmap(lambda f, g: f @ g, in_axes=(None, 0))(fisher, g)  # one copy per call
    np.testing.assert_allclose(whole, out)


def test_jax_15956_a_pure_callback_on_split_data_is_run_per_device_under_shard_map():
    """A jax.pure_callback takes its operand whole: split data is gathered to one device first.
    The fix the PR documents: call it under shard_map, each device on its own part. Priced
    only (preflight compiles, nothing runs)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    x = jax.device_put(jnp.ones((1024, 1024)), NamedSharding(mesh, PartitionSpec("d")))

    def host(a):
        return np.tanh(np.asarray(a))

    def whole(x):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2) + 1

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # jax 0.8.0 keeps it under experimental
        from jax.experimental.shard_map import shard_map

    def each(b):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(b.shape, b.dtype), b * 2)

    def per_device(x):
        d = PartitionSpec("d")
        return shard_map(each, mesh=mesh, in_specs=d, out_specs=d)(x) + 1

    gathered = preflight.preflight_step(whole, x)
    assert "a value gathered from its shards" in gathered.advice
    assert "under shard_map" in gathered.advice and "jax-ml/jax#15956" in gathered.advice
    split = preflight.preflight_step(per_device, x)
    assert "gathered from its shards" not in split.advice
    assert split.peak_bytes * 2 < gathered.peak_bytes  # 9 MiB to 3 MiB a device on the CPU


def test_axol_173_a_class_made_anew_in_a_static_field_is_named_as_compared_by_identity():
    import dataclasses

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Robot:
        q0: jax.Array
        var_type: type = dataclasses.field(metadata={"static": True})

    def from_urdf():
        return Robot(jnp.zeros(7), type("JointVar", (), {"dim": 7}))  # a new class each call

    @jax.jit
    def solve(robot, target):
        return jnp.sum((robot.q0 - target) ** 2) * robot.var_type.dim

    with compiles.watch() as log:
        for _ in range(3):
            solve(from_urdf(), jnp.ones(7))
    entry = log.function("solve")
    assert entry.cause == "new pytree structure" and entry.compiles == 3
    assert "prints the same now and before" in log.diagnosis and "JointVar" in log.diagnosis
    assert "no leaf that is sometimes None" not in log.diagnosis  # the fix that did not apply
    robot = from_urdf()  # the PR's fix: build it once and share it
    with compiles.watch() as fixed:
        for _ in range(3):
            solve(robot, jnp.ones(7))
    assert fixed.function("solve").compiles == 1


def test_desc_1963_pylcm_341_under_x64_weak_floats_and_int64_indices_compile_again():
    """Under jax_enable_x64 (a child process: the setting is process-wide), a Python float
    stored where a jnp.float64 later goes (DESC#1963), and int64 indices from jnp.argmax beside
    int32 codes (pylcm#341), each compile the step again; the kit names both causes."""
    import subprocess

    code = """
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from helpers import compiles

@jax.jit
def compute(w, x):
    return w * jnp.sum(x ** 2)

values = jnp.sin(jnp.arange(64.0))

@jax.jit
def lookup(i):
    return values[i]

x = jnp.linspace(0, 1, 100)
with compiles.watch() as log:
    compute(2.0, x)  # a Python float: weakly typed float64
    compute(jnp.float64(2.0), x)  # a strong float64 later
    lookup(jnp.arange(8, dtype=jnp.int32))
    lookup(jnp.argmax(values[None, :] * x[:8, None], axis=1))  # int64 under x64
print(log.function("compute").cause, "|", "weak type" in log.diagnosis)
print(log.function("lookup").cause, "|", "i64" in log.diagnosis or "int64" in log.diagnosis)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[-2] == "new dtypes | True" and out[-1] == "new dtypes | True"


def test_jax_29679_a_split_array_closed_over_is_a_whole_constant_on_each_device():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    s = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), PartitionSpec("d"))
    table = jax.device_put(jax.random.normal(jax.random.key(0), (1024, 256)), s)  # 1 MiB

    def step(x):
        return (x * table).sum()  # closed over: a constant of the program, whole

    x = jax.device_put(jnp.ones((1024, 256)), s)
    p = preflight.preflight_step(step, x)
    assert p.constant_bytes >= table.nbytes and "pass them as arguments instead" in p.advice
    passed = preflight.preflight_step(lambda x, t: (x * t).sum(), x, table)  # the fix
    assert passed.constant_bytes < table.nbytes and passed.peak_bytes < p.peak_bytes


def test_desc_1051_numpy_arrays_passed_to_a_jitted_function_are_copied_every_call():
    f = jax.jit(lambda a, b: (a * b).sum())
    a, b = np.ones((256, 256), np.float32), np.ones((256, 256), np.float32)
    f(a, b)
    with transfers.trace() as log:
        for _ in range(3):
            f(a, b)
    reasons = " ".join(r for row in log.by_line() for r in row["reasons"])
    assert "copied on every call" in reasons
    a2, b2 = jax.device_put(a), jax.device_put(b)  # the fix: on the device once
    with transfers.trace() as fixed:
        for _ in range(3):
            f(a2, b2)
    assert not fixed.by_line()


def test_jax_19500_jnp_array_of_a_flat_list_is_named_with_the_faster_way_too():
    values = [float(i) for i in range(1000)]  # flat: as slow as a nested list
    jnp.array(values)
    with transfers.trace() as log:
        jnp.array(values).block_until_ready()
    reasons = " ".join(r for row in log.by_line() for r in row["reasons"])
    assert "a Python list, flat or nested" in reasons and "jnp.array(np.array(x))" in reasons
    np.testing.assert_array_equal(jnp.array(np.array(values)), jnp.array(values))


def test_jax_13632_a_slice_of_a_split_array_taken_outside_jit_comes_back_replicated():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    x = jax.device_put(jnp.ones((1024, 64)),
                       NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), PartitionSpec("d")))
    eager = x[:1000]
    assert eager.sharding.is_fully_replicated  # what the thread met
    assert "taken outside jit, comes back replicated" in devices.placement(eager).explanation
    inside = jax.jit(lambda a: a[:1000])(x)  # the fix: the slice inside jit stays split
    assert not inside.sharding.is_fully_replicated


def test_jax_8470_pmap_drops_a_donation_passed_by_keyword():
    """jax.pmap donates positional arguments only; jax.jit keeps a donation passed by keyword.
    The kit's plan for the keyword call aliased nothing and said nothing of why."""
    def double(x):
        return x * 2

    step = jax.pmap(double, donate_argnums=0)
    x = jnp.ones((jax.device_count(), 256, 256))  # 256 KiB on each device
    by_keyword = preflight.preflight_step(step, x=x)
    assert by_keyword.alias_bytes == 0
    if "x" not in inspect.signature(step).parameters:
        pytest.skip("this JAX's pmap hides the function's signature (jax 0.8.0): no position "
                    "to move x to, and the kit says nothing")
    assert "x passed by keyword" in by_keyword.advice and "jax-ml/jax#8470" in by_keyword.advice
    assert "pass x by position" in by_keyword.advice
    assert f"writes {format_bytes(x.nbytes // jax.device_count())}" in by_keyword.advice
    by_position = preflight.preflight_step(step, x)  # the fix it names
    assert by_position.alias_bytes == x.nbytes // jax.device_count()
    assert "passed by keyword" not in by_position.advice
    split = step(jnp.ones_like(x))  # what the plans say, seen: an array already over pmap's devices
    step(x=split)
    assert not split.is_deleted()  # by keyword: kept
    step(split)
    assert split.is_deleted()  # by position: donated
    jitted = jax.jit(double, donate_argnums=0)  # jit keeps it: no note
    assert "passed by keyword" not in preflight.preflight_step(jitted, x=x).advice


def test_marin_8911_a_step_counter_made_off_the_mesh_compiles_the_step_twice():
    """The train state's counter was made without the mesh, and the step returns it replicated
    over the mesh: the second step compiles again (mcwitt's fix: make it replicated on the
    mesh). The kit's first fix, device_put(leaf, other.sharding), raises for a scalar beside
    2-D leaves; it now names the replicated sharding where the ranks differ."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    w = jax.jit(lambda: jnp.zeros((64, 16)), out_shardings=NamedSharding(mesh, P("data")))()
    state = {"w": w, "step": jnp.zeros((), jnp.int32)}
    train_step = jax.jit(lambda st: {"w": st["w"] * 0.9, "step": st["step"] + 1})
    with compiles.watch() as log:
        for _ in range(3):
            state = train_step(state)
    assert log.function("<lambda>").compiles == 2
    assert log.function("<lambda>").cause == "new sharding"
    state = {"w": w, "step": jnp.zeros((), jnp.int32)}
    (problem,) = devices.tree_placement(state).problems
    assert "NamedSharding(other.sharding.mesh, P())" in problem and "another rank" in problem
    with pytest.raises(ValueError):  # the fix it no longer gives first
        jax.device_put(state["step"], w.sharding)
    state["step"] = jax.device_put(state["step"], NamedSharding(w.sharding.mesh, P()))
    assert devices.tree_placement(state).problems == ()
    train_step = jax.jit(lambda st: {"w": st["w"] * 0.9, "step": st["step"] + 1})
    with compiles.watch() as log:
        for _ in range(3):
            state = train_step(state)
    assert log.function("<lambda>").compiles == 1


def test_openpi_437_jax_27808_a_batch_its_sharding_does_not_divide_is_named():
    """A data-parallel run died on device_put of the epoch's last batch, 19 rows over 4 devices
    (jax#27808: yashk2810 found JAX's message hard to read). The fix: a multiple of 4."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    s = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("batch",)), P("batch"))
    batch = np.zeros((19, 10, 32), np.float32)
    with pytest.raises(Exception) as raised:
        jax.device_put(batch, s)
    with pytest.raises(errors.BadInputError, match="not an out-of-memory error") as refused:
        oom.explain(raised.value)
    for said in (devices.sharding_error_fix(raised.value), str(refused.value)):
        assert "dimension 0 (19) is split into 4 pieces" in said and "pad it to 20" in said
    with pytest.raises(errors.BadInputError) as priced:
        preflight.preflight_step(jax.jit(lambda x: x * 2, in_shardings=s), batch)
    assert "multiple of 4" in str(priced.value)
    fixed = jax.device_put(batch[:16], s)  # the fix: a multiple of 4
    assert {x.data.shape for x in fixed.addressable_shards} == {(4, 10, 32)}


def test_tpu_inference_1917_a_mesh_of_explicit_axes_after_an_upgrade_is_named():
    """From jax 0.9 jax.make_mesh makes Explicit axes, where with_sharding_constraint on them
    raises; the fix (kyuyeunk): axis_types=Auto, or jax.sharding.reshard."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("data", "model"))
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P(None, "data")))

    def layer(h):
        return jax.lax.with_sharding_constraint(h * 2, NamedSharding(mesh, P("data", None)))

    try:
        jax.jit(layer)(x)
    except Exception as err:
        said = devices.sharding_error_fix(err)
    else:
        pytest.skip("this JAX's make_mesh makes Auto axes (jax 0.8.0): nothing raises")
    assert "Explicit" in said and "jax.sharding.reshard" in said and "AxisType.Auto" in said
    with pytest.raises(errors.BadInputError, match="AxisType.Auto"):
        preflight.preflight_step(layer, x)
    auto = jax.make_mesh((2, 2), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)  # the fix it names
    on_auto = jax.device_put(x, NamedSharding(auto, P()))
    y = jax.jit(lambda h: jax.lax.with_sharding_constraint(
        h * 2, NamedSharding(auto, P("data", None))))(on_auto)
    assert {s.data.shape for s in y.addressable_shards} == {(4, 8)}  # split by rows
    z = jax.jit(lambda h: jax.sharding.reshard(h * 2, NamedSharding(mesh, P("data", None))))
    assert {s.data.shape for s in z(x).addressable_shards} == {(4, 8)}  # the other fix


def test_axlearn_993_a_minibatch_sliced_from_a_split_batch_is_gathered_whole():
    """Gradient accumulation that cut each minibatch as a contiguous slice of a batch split over
    devices: XLA all-gathers the whole batch onto every device. The PR's fix (apoorvtintin, on
    apghml's review): reshape(minibatch, steps, ...) and swapaxes, so each step takes part of
    every device's share."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    split = NamedSharding(mesh, P("data", None))
    w = jax.device_put(np.full((512, 64), 0.01, np.float32), NamedSharding(mesh, P()))
    x = jax.device_put(np.ones((1024, 512), np.float32), split)  # 2 MiB, 512 KiB a device
    steps, size = 4, 256

    def loss(w, mb):
        return jnp.mean(jnp.tanh(mb @ w) ** 2)

    @jax.jit
    def sliced(w, x):
        def body(g, i):
            mb = jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=0)
            mb = jax.lax.with_sharding_constraint(mb, split)
            return g + jax.grad(loss)(w, mb), None
        return jax.lax.scan(body, jnp.zeros_like(w), jnp.arange(steps))[0]

    @jax.jit
    def reshaped(w, x):  # the fix it names
        def body(g, mb):
            return g + jax.grad(loss)(w, jax.lax.with_sharding_constraint(mb, split)), None
        xs = jnp.swapaxes(x.reshape(size, steps, 512), 0, 1)
        return jax.lax.scan(body, jnp.zeros_like(w), xs)[0]

    before = preflight.preflight_step(sliced, w, x)
    assert "gathered from its shards onto each device" in before.advice
    assert "dynamic_slice f32[1024, 512] (2.00 MiB" in before.advice
    assert "apple/axlearn#993" in before.advice and "swapaxes" in before.advice
    after = preflight.preflight_step(reshaped, w, x)
    assert "gathered" not in after.advice and after.peak_bytes < before.peak_bytes - 2**20
    np.testing.assert_allclose(sliced(w, x), reshaped(w, x), rtol=1e-5)


def test_sglang_jax_1017_bytes_read_for_bf16_weights_are_named_not_advised_a_device_put():
    """sgl-project/sglang-jax#1017: BF16 weights read with np.frombuffer are raw bytes (V2).
    devices.placement and tree_placement called them NumPy copied on every call and advised
    jax.device_put, which raises (a new user's trial). Now the bytes are named with the PR's
    .view(ml_dtypes.bfloat16), and a real bfloat16 array (ml_dtypes' dtype, also of NumPy's
    kind "V") is not."""
    import ml_dtypes

    w = (np.arange(64, dtype=np.float32) / 8).astype(ml_dtypes.bfloat16).reshape(8, 8)
    host = np.frombuffer(w.tobytes(), dtype="V2").reshape(8, 8)
    with pytest.raises(TypeError, match="is not a valid JAX array type"):
        jax.device_put(host)
    said = devices.placement(host).explanation
    assert "raw bytes" in said and "x.view(ml_dtypes.bfloat16)" in said
    assert "sgl-project/sglang-jax#1017" in said and "copies it" not in said
    (problem,) = devices.tree_placement({"experts.0.w1": host}).problems
    assert "x.view(ml_dtypes.bfloat16)" in problem and "device_put(tree) once" not in problem
    np.testing.assert_array_equal(np.asarray(jax.device_put(host.view(ml_dtypes.bfloat16))), w)
    assert "raw bytes" not in devices.placement(w).explanation  # bfloat16 itself: JAX takes it
    # other dtypes JAX refuses (a review: they were advised jax.device_put, which raises)
    for other, fix in ((np.array(["2020-01-01"], "datetime64[D]"), "x.astype('int64')"),
                       (np.ones(3, np.longdouble), "x.astype(np.float64)"),
                       (np.zeros(2, [("a", "f4"), ("b", "i4")]), "x.dtype.names")):
        with pytest.raises(TypeError, match="is not a valid JAX array type"):
            jax.device_put(other)
        assert fix in devices.placement(other).explanation
        (problem,) = devices.tree_placement({"x": other}).problems
        assert fix in problem and "device_put(tree) once" not in problem


class _Tensor:
    """A stand-in for torch.Tensor (PyTorch is not among the kit's packages): the DLPack
    protocol over a NumPy array, with a torch-like dtype NumPy cannot read. The kit tells
    another framework's tensor by its __dlpack__; a trial checked the same with torch 2.13."""

    __module__ = "tensorlib"

    def __init__(self, a):
        self._a, self.shape, self.dtype, self.nbytes = a, a.shape, "tensorlib.float32", a.nbytes

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_jax_1004_another_frameworks_tensor_in_a_batch_is_named_with_dlpack_not_no_problem():
    """jax-ml/jax#1004: a PyTorch DataLoader's batches passed to a jitted step raise "Error
    interpreting argument ... of type <class 'torch.Tensor'>"; the docs' fix (jax#17929)
    collates to NumPy. tree_placement said "no problem" and 0 B for torch leaves, and
    preflight_step blamed a pytree's __init__ (a new user's trial with torch 2.13). Now the
    tensor is named with jnp.from_dlpack, which runs (a stand-in tensor here)."""
    x = _Tensor(np.ones((8, 4), np.float32))
    with pytest.raises(TypeError, match="Error interpreting argument"):
        jax.jit(lambda b: b["x"].sum())({"x": x})
    tree = devices.tree_placement({"x": x})
    (problem,) = tree.problems
    assert "is a tensorlib._Tensor, another framework's tensor" in problem
    assert "jnp.from_dlpack(x)" in problem and "(128 B)" in problem
    assert "another framework" in str(tree) and "Python value" not in str(tree)
    with pytest.raises(errors.BadInputError, match=r"args\[0\]\['x'\] is a tensorlib._Tensor"):
        preflight.preflight_step(lambda b: b["x"].sum(), {"x": x})
    assert float(jax.jit(lambda b: b["x"].sum())({"x": jnp.from_dlpack(x)})) == 32.0


def test_dm_haiku_526_params_loaded_back_from_savez_as_an_object_are_named_with_item():
    """google-deepmind/dm-haiku#526: parameters saved with jnp.savez(path, params=params) load
    back as a 0-d object array, which JAX refuses; tree_placement advised jax.device_put(tree)
    once, which raises (a new user's trial). Now .item() is named, which runs."""
    import io

    buffer = io.BytesIO()
    np.savez(buffer, params={"linear": {"w": np.ones((8, 2), np.float32)}})
    buffer.seek(0)
    params = np.load(buffer, allow_pickle=True)["params"]
    (problem,) = devices.tree_placement(params).problems
    assert "a 0-d NumPy object array" in problem and "x.item()" in problem
    assert "google-deepmind/dm-haiku#526" in problem and "device_put(tree)" not in problem
    assert float(jax.jit(lambda p: p["linear"]["w"].sum())(params.item())) == 16.0


def test_levanter_639_a_split_parameter_replicated_to_be_saved_is_named_with_a_host_read():
    """marin-community/levanter#639: to save a parameter split over devices, the code
    replicated it (jax.jit(identity, out_shardings=NamedSharding(mesh, P()))) and then took
    np.array: every device held all of it, and a TPU ran out of memory. preflight_step said
    FITS with no word of the replication, and at the thread's scale advised running on the
    host or lax.map, which raised or changed nothing (a new user's trial). Now the replicated
    output is named with np.asarray of the split array, the same values; a state replicated in
    and out (data parallelism) is not named."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("fsdp",))
    w = jax.device_put(jnp.arange(1024 * 512, dtype=jnp.float32).reshape(1024, 512),
                       NamedSharding(mesh, P("fsdp", None)))  # 2 MiB, 512 KiB a device
    to_replicated = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))
    said = preflight.preflight_step(to_replicated, w).advice
    assert "The output float32[1024, 512] (2.00 MiB) is replicated: each of the 4 devices" in said
    assert "a new value of x, which came in split over them" in said
    assert "np.asarray(x) or jax.device_get(x)" in said
    assert "marin-community/levanter#639" in said
    np.testing.assert_array_equal(np.asarray(w), np.asarray(to_replicated(w)))
    big = jax.ShapeDtypeStruct((65536, 131072), jnp.float32, sharding=w.sharding)  # 32 GiB
    at_scale = preflight.preflight_step(to_replicated, big, target="A100 40GB")
    assert at_scale.verdict == "will not fit" and "levanter#639" in at_scale.advice
    assert "jax.devices('cpu')[0]" not in at_scale.advice  # (that step raises: other devices)
    params = jax.device_put(jnp.ones((512, 512)), NamedSharding(mesh, P()))  # replicated in
    x = jax.device_put(jnp.ones((64, 512)), NamedSharding(mesh, P("fsdp", None)))
    step = jax.jit(lambda p, x: p - 0.1 * jax.grad(lambda p: jnp.mean((x @ p) ** 2))(p))
    assert "levanter#639" not in preflight.preflight_step(step, params, x).advice
    # a tensor-parallel layer returns its activations replicated, of a weight's shape: not a
    # new value of the weight (a review: it was named, with out_shardings=x.sharding)
    x = jax.device_put(jnp.ones((1024, 1024)), NamedSharding(mesh, P()))
    w1 = jax.device_put(jnp.full((1024, 1024), 0.01), NamedSharding(mesh, P(None, "fsdp")))
    w2 = jax.device_put(jnp.full((1024, 1024), 0.01), NamedSharding(mesh, P("fsdp", None)))
    tp = jax.jit(lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2)
    assert "levanter#639" not in preflight.preflight_step(tp, x, w1, w2).advice


def test_jax_23052_rows_written_at_a_slice_of_a_split_array_are_named_as_gathered_whole():
    """jax-ml/jax#23052: x.at[0:3].set(u) on an array split by rows over devices all-gathers
    the whole array onto each device (the reporter found an index array does not; jax 0.8.0,
    0.10.2 and 0.12.0.1 alike on 4 simulated devices). The kit advised donation only (a new
    user's trial). Now the gathered whole is named with the index-array and
    dynamic_update_slice fixes, both run here: no gather, the same values."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    split = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("x",)), P("x", None))
    x = jax.device_put(jnp.arange(1024 * 512, dtype=jnp.float32).reshape(1024, 512), split)
    u = jnp.ones((3, 512))
    sliced = jax.jit(lambda x, u: x.at[1000:1003].set(u), out_shardings=split)
    indexed = jax.jit(lambda x, u: x.at[jnp.arange(1000, 1003)].set(u), out_shardings=split)
    written = jax.jit(lambda x, u: jax.lax.dynamic_update_slice(x, u, (1000, 0)),
                      out_shardings=split)
    before = preflight.preflight_step(sliced, x, u)
    assert "f32[1024, 512] (2.00 MiB" in before.advice
    assert "gathered from its shards onto each device" in before.advice
    assert "x.at[jnp.arange(a, b)].set(u)" in before.advice
    assert "jax.lax.dynamic_update_slice(x, u, start), start one index per dimension" \
        in before.advice
    assert "x.at[:, jnp.arange(a, b)].set(u) for columns" in before.advice  # (a review)
    cols = jax.device_put(x.T, NamedSharding(split.mesh, P(None, "x")))  # split by columns
    col_write = jax.jit(lambda x, u: x.at[:, 100:103].set(u.T), out_shardings=cols.sharding)
    col_fixed = jax.jit(lambda x, u: x.at[:, jnp.arange(100, 103)].set(u.T),
                        out_shardings=cols.sharding)
    assert "jax-ml/jax#23052" in preflight.preflight_step(col_write, cols, u).advice
    assert "gathered" not in preflight.preflight_step(col_fixed, cols, u).advice
    np.testing.assert_array_equal(col_fixed(cols, u), col_write(cols, u))
    assert "jax-ml/jax#23052" in before.advice
    for fixed in (indexed, written):
        after = preflight.preflight_step(fixed, x, u)
        assert "gathered" not in after.advice and after.peak_bytes < before.peak_bytes - 2**20
        np.testing.assert_array_equal(fixed(x, u), sliced(x, u))
    added = jax.jit(lambda x, u: x.at[1000:1003].add(u), out_shardings=split)
    assert "jax-ml/jax#23052" in preflight.preflight_step(added, x, u).advice
    one_row = jax.jit(lambda x, u: x.at[5].set(u[0]), out_shardings=split)  # XLA splits it
    assert "gathered" not in preflight.preflight_step(one_row, x, u).advice


def test_pylcm_391_an_array_indexed_by_a_vmapped_element_is_gathered_whole_not_vmap_s():
    """OpenSourceEconomics/pylcm#391: a kernel vmapped over types split over devices reads
    V[t] from a V passed unmapped; XLA all-gathers the whole V onto each device, and device 0
    ran out of memory. The kit called it "made under jax.vmap ... jax.lax.map(f, xs,
    batch_size=k)" (a new user's trial), which keeps the gather. Now the whole is named with
    the PR's fix: V mapped with the types (in_axes=(0, 0)), run here."""
    import re

    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("t",))
    rows = 1 << 18  # V: 4 MiB, 1 MiB a device
    V = jax.device_put(np.arange(4 * rows, dtype=np.float32).reshape(4, rows),
                       NamedSharding(mesh, P("t", None)))
    types = jax.device_put(np.arange(4), NamedSharding(mesh, P("t")))
    grid = np.linspace(0.0, 1.0, rows).astype(np.float32)
    idx = np.clip((grid * 0.7 * rows).astype(np.int32), 0, rows - 1)

    def unmapped(types, V):
        return jax.vmap(lambda t: grid + V[t][idx])(types)

    def mapped(types, V):  # the PR's fix
        return jax.vmap(lambda t, v_t: grid + v_t[idx], in_axes=(0, 0))(types, V)

    def chunked(types, V):  # what the kit advised before
        return jax.lax.map(lambda t: grid + V[t][idx], types, batch_size=2)

    before = preflight.preflight_step(unmapped, types, V)
    note = before.advice
    assert "A value of f32[4, 262144] (4.00 MiB, test_user_reports.py:" in note, note
    assert "gathered from its shards onto each device" in note
    assert "in_axes=(0, 0)" in note and "OpenSourceEconomics/pylcm#391" in note
    assert "made under jax.vmap for every element" not in note, note
    assert "keeps the gather" in note
    text = jax.jit(unmapped).lower(types, V).compile().as_text()
    assert re.search(r"all-gather\(", text)  # the whole V, on each device
    after = preflight.preflight_step(mapped, types, V)
    assert "gathered" not in after.advice and after.temp_bytes < before.temp_bytes - 2**20
    assert not re.search(r"all-gather\(", jax.jit(mapped).lower(types, V).compile().as_text())
    assert preflight.preflight_step(chunked, types, V).temp_bytes >= before.temp_bytes
    np.testing.assert_array_equal(jax.jit(unmapped)(types, V), jax.jit(mapped)(types, V))


def test_jax_4645_a_jit_defined_inside_a_method_is_named_as_made_anew_each_call():
    """jax-ml/jax#4645 (and jax#2251's "local" variant): an @jax.jit function defined inside
    the method that calls it is a new function object each call, so it compiles every time.
    The kit names it and the fix the maintainers gave: make it once (here: 6 compiles -> 1)."""
    class Agent:
        def __init__(self):
            self.params = jnp.ones((16, 4))

        def act(self, obs):
            @jax.jit
            def _act(params, obs):
                return jnp.argmax(obs @ params)
            return _act(self.params, obs)

    class Fixed(Agent):
        def __init__(self):
            super().__init__()
            self._act = jax.jit(lambda params, obs: jnp.argmax(obs @ params))

        def act(self, obs):
            return self._act(self.params, obs)

    obs = jnp.ones((1, 16))
    with compiles.watch() as log:
        agent = Agent()
        for _ in range(6):
            agent.act(obs).block_until_ready()
    entry = log.function("_act")
    assert (entry.compiles, entry.cause) == (6, "function made anew")
    assert "jit caches by the function object" in log.diagnosis
    assert "make it once, outside the loop" in log.diagnosis
    with compiles.watch() as fixed:
        agent = Fixed()
        for _ in range(6):
            agent.act(obs).block_until_ready()
    assert fixed.compiles == 1


def test_pymc_5656_vmap_of_vmap_is_chunked_and_the_fix_s_own_stack_is_not_told_to_chunk():
    """pymc-devs/pymc#5656: posterior draws post-processed with vmap(vmap(f)) over chains and
    draws ran out of memory; PR #5664 made it vmap(lax.map(f)). The kit names the first with
    lax.map; on the fix it still said "made under jax.vmap ... batch_size=k" of lax.map's own
    stacked result, the step's output, which chunks cannot shrink (a new user's trial: the
    peak rose with batch_size=10 and 50). That note is gone there now; the stack note stays."""
    C, S, N, D, H = 4, 250, 1000, 8, 64
    X = jax.random.normal(jax.random.PRNGKey(0), (N, D))
    y = jax.random.normal(jax.random.PRNGKey(1), (N,))

    def loglik(theta):
        h = jnp.tanh(X @ theta[: D * H].reshape(D, H))
        return -0.5 * (y - h @ theta[D * H:]) ** 2

    samples = jax.ShapeDtypeStruct((C, S, D * H + H), jnp.float32)
    before = preflight.preflight_step(jax.vmap(jax.vmap(loglik)), samples)
    assert "made under jax.vmap for every element" in before.advice
    assert "jax.lax.map(f, xs, batch_size=k)" in before.advice
    after = preflight.preflight_step(jax.vmap(lambda s: jax.lax.map(loglik, s)), samples)
    assert "made under jax.vmap for every element" not in after.advice, after.advice
    assert "keeps a value for each of its 250 steps" in after.advice
    assert after.peak_bytes * 10 < before.peak_bytes
    chunked = preflight.preflight_step(
        jax.vmap(lambda s: jax.lax.map(loglik, s, batch_size=10)), samples)
    assert chunked.peak_bytes > after.peak_bytes  # the old advice, followed: no smaller


def test_blackjax_667_a_warmup_scan_that_saves_every_steps_state_is_named():
    """window_adaptation's scan saved (state, info, adaptation state) for every warmup step, so
    memory grew with num_steps; the reporter's fix saves nothing per step (get_filter_adapt_
    info_fn). Measured by the helper: 31.40 MiB -> 149 KiB at 500 steps of 4096 floats."""
    dim, steps = 2048, 256

    def warmup(key, x0, save_all=True):
        def one_step(carry, k):
            x, scale = carry
            new = x + scale * jax.random.normal(k, x.shape)
            scale = 0.9 * scale + 0.1 * new ** 2
            return (new, scale), ((new, scale) if save_all else None)
        return jax.lax.scan(one_step, (x0, jnp.ones_like(x0)), jax.random.split(key, steps))

    key, x0 = jax.random.key(0), jnp.zeros(dim)
    before = preflight.preflight_step(warmup, key, x0)
    (stack,) = [s for s in before.scan_stacks if s.length == steps]
    assert stack.nbytes == 2 * steps * dim * 4  # every step's state and scale, kept
    assert f"keeps a value for each of its {steps} steps" in before.advice
    assert "Return less from the body" in before.advice
    after = preflight.preflight_step(lambda k, x: warmup(k, x, save_all=False), key, x0)
    assert after.peak_bytes < before.peak_bytes - stack.nbytes // 2


def test_optax_1171_a_line_search_compiled_again_each_update_is_named_twice():
    """scale_by_backtracking_linesearch: an un-jitted update made its while_loop's body anew
    on each call (a compile each update), and init's weakly typed scalars made a jitted update
    compile twice (PR #1175 gave them their dtype)."""
    def value_fn(p):
        return jnp.sum((p - 3.0) ** 2)

    def update(grad, best, params):  # best: the state's value, jnp.array(jnp.inf) in init
        value = value_fn(params)

        def cond_fn(c):  # made anew on every call
            return (value_fn(params - c[0] * grad) > value) & (c[1] < 15)

        lr, _ = jax.lax.while_loop(cond_fn, lambda c: (c[0] * 0.5, c[1] + 1), (1.0, 0))
        return -lr * grad, jnp.minimum(best, value_fn(params - lr * grad))

    def run(upd, best):
        params = jnp.zeros(64)
        for _ in range(4):
            u, best = upd(jax.grad(value_fn)(params), best, params)
            params = params + u

    run(update, jnp.array(jnp.inf))  # the eager operations' first compiles
    with compiles.watch() as eager:
        run(update, jnp.array(jnp.inf))
    (group,) = [f for f in eager.functions if f.cause == compiles.EAGER]
    assert "while" in group.same_types_again and "Jit `update`" in group.diagnosis
    with compiles.watch() as weak:
        run(jax.jit(update), jnp.array(jnp.inf))  # init's weakly typed scalar, before #1175
    assert weak.function("update").compiles == 2
    assert weak.function("update").fix == WEAK_FIX
    jax.clear_caches()
    with compiles.watch() as fixed:
        run(jax.jit(update), jnp.array(jnp.inf, jnp.float32))  # the PR's fix
    assert fixed.function("update").compiles == 1


def test_jax_md_161_a_neighbour_list_sized_anew_each_step_compiles_per_capacity():
    """Calling allocate() every step sizes the neighbour list from the data: the jitted step
    meets a new idx shape whenever the largest occupancy changes (sschoenholz: allocate once
    with spare capacity, update inside the step, re-allocate only on overflow)."""
    step = jax.jit(lambda pos, idx: pos + jnp.take(pos, idx, axis=0).sum(1))
    pos = jnp.ones((64, 2))
    with compiles.watch() as log:
        for capacity in (5, 7, 6, 8):  # allocate(): each step's own capacity
            step(pos, jnp.zeros((64, capacity), jnp.int32))
    entry = log.function("<lambda>")
    assert entry.compiles == 4 and entry.cause == "new shapes"
    assert "pad or bucket the inputs to a few fixed shapes" in entry.fix
    with compiles.watch() as fixed:
        for _ in range(4):  # one capacity with room (1.5x the largest), re-allocated on overflow
            step(pos, jnp.zeros((64, 12), jnp.int32))
    assert fixed.function("<lambda>").compiles == 1


def test_jax_23457_a_closed_over_embedding_table_is_a_constant_of_the_program():
    """Indexing an embedding table the jitted function closes over: the table is baked into
    the program (the helper measured 2.4 copies held while the program lives; the kit says one,
    XLA's constant), and passing it as an argument holds none."""
    table = jax.random.normal(jax.random.key(1), (4096, 256))  # 4 MiB

    def embed(ids):
        return table[ids].sum()

    p = preflight.preflight_step(embed, jnp.arange(32))
    assert p.constant_bytes == table.nbytes
    assert "pass them as arguments instead" in p.advice
    fixed = preflight.preflight_step(lambda t, ids: t[ids].sum(), table, jnp.arange(32))
    assert fixed.constant_bytes < 2**10


def test_jax_34041_indexing_an_array_in_pinned_host_memory_is_named_with_the_copy():
    """a[0] on an array in pinned_host raised on jax 0.8.0 (gather's operands in two memory
    spaces; works on 0.10.2). placement names the memory and the copy that lets it compute."""
    d0 = jax.devices()[0]
    if "pinned_host" not in {m.kind for m in d0.addressable_memories()}:
        pytest.skip("this backend has no pinned_host memory")
    mesh = jax.sharding.Mesh(np.full((), d0), axis_names=())  # the thread's sharding
    s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind="pinned_host")
    a = jax.device_put(jnp.zeros((64, 64)), s)
    if jaxcompat.jax_version_tuple() < (0, 10):  # the thread's error: gather's memory spaces
        with pytest.raises(ValueError, match="memory_space"):
            a[0]
    said = devices.placement(a).explanation
    assert "pinned_host" in said and "with_memory_kind('device')" in said
    on_device = jax.device_put(a, a.sharding.with_memory_kind("device"))  # the fix it names
    assert on_device[0].shape == (64,) and on_device.sharding.memory_kind == "device"


def test_jax_23358_an_at_update_with_an_index_vmap_batches_copies_the_array_per_element():
    """.at[i].set(7).sum() under vmap over i ran out of memory: scatter's batching rule copies
    the whole x for every i. Computed without the updated array it needs nothing; lax.map with
    a batch size shrinks it too (16 MiB -> 1 MiB, the helper's measure)."""
    x = jnp.zeros(1024)

    def run(xs):
        return jax.vmap(lambda i: x.at[i].set(7.0).sum())(xs)

    def fixed(xs):  # the fix it names
        return jax.vmap(lambda i: x.sum() - x[i] + 7.0)(xs)

    ids = jnp.arange(1024)
    p = preflight.preflight_step(run, ids)
    assert "An .at[...] update whose index jax.vmap batches copies the whole array" in p.advice
    assert "x.sum() - x[i] + v" in p.advice and "jax-ml/jax#23358" in p.advice
    assert max(t.nbytes for t in p.largest_temporaries) >= 1024 * 1024 * 4  # x per element
    after = preflight.preflight_step(fixed, ids)
    assert "jax.vmap" not in after.advice and after.peak_bytes < p.peak_bytes // 8
    np.testing.assert_allclose(run(ids), fixed(ids))


def test_xla_35719_an_unrolled_loops_values_alive_at_once_are_named():
    """A Python loop inside jit, each iteration making a large index array used once by
    bincount, ran out of memory on XLA:CPU: its plan holds every iteration's values at once
    (the reporter; the issue is open). A scan over the iterations holds one iteration's."""
    k, m, n = 16, 6, 65536
    data = jnp.asarray(np.random.default_rng(0).integers(0, k, size=(m, n), dtype=np.uint8))

    @jax.jit
    def counts(data):
        out = []
        for x in data:
            for y in data:
                idx = x.astype(jnp.int32) * k + y.astype(jnp.int32)
                out.append(jnp.bincount(idx, length=k * k))
        return jnp.stack(out)

    @jax.jit
    def scanned(data):  # the fix it names: one iteration's values at a time
        def body(_, i):
            x, y = data[i // m].astype(jnp.int32), data[i % m].astype(jnp.int32)
            return None, jnp.bincount(x * k + y, length=k * k)
        return jax.lax.scan(body, None, jnp.arange(m * m))[1]

    before = preflight.preflight_step(counts, data)
    assert "is unrolled" in before.advice
    assert "This line's values are alive at once" in before.advice
    assert "openxla/xla#35719" in before.advice
    after = preflight.preflight_step(scanned, data)
    assert "alive at once" not in after.advice and 4 * after.temp_bytes < before.temp_bytes
    assert bool((counts(data) == scanned(data)).all())


def test_jax_30015_index_arrays_stacked_for_a_gather_are_named_with_lax_gather():
    """The gradient of x[tuple(columns of idx)] took 2-4x the forward pass: JAX stacks the
    index arrays into one int32 array for its gather, which the gradient's scatter keeps. The
    fix it names, lax.gather given the (N, 3) array, measured by the helper: 16 -> 4 MiB."""
    from jax import lax

    def loss(x, idx):
        return jnp.sum(x[tuple(jnp.split(idx, 3, axis=-1))][..., 0] * 2.5)

    def fixed(x, idx):
        dims = lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0, 1, 2),
                                          start_index_map=(0, 1, 2))
        return jnp.sum(lax.gather(x, idx, dims, slice_sizes=(1, 1, 1)) * 2.5)

    x = jax.random.normal(jax.random.key(0), (32, 32, 32))
    idx = jax.random.randint(jax.random.key(1), (1 << 18, 3), 0, 32)
    p = preflight.preflight_step(jax.grad(loss), x, idx)
    assert "is indices: indexing with 3 index arrays makes JAX stack them" in p.advice
    assert "jax.lax.gather" in p.advice and "jax-ml/jax#30015" in p.advice
    after = preflight.preflight_step(jax.grad(fixed), x, idx)
    assert "is indices" not in after.advice and after.temp_bytes < p.temp_bytes // 2
    np.testing.assert_allclose(jax.grad(loss)(x, idx), jax.grad(fixed)(x, idx), rtol=1e-5)


def test_jax_14642_14821_18249_bcoo_products_making_far_more_than_the_product_are_named():
    """BCOO @ dense gathers a row of the dense operand per stored element (jakevdp: blocks of
    columns, or cuSPARSE on a GPU); BCOO @ BCOO at 20% fill pairs every stored element of one
    with every one of the other (jakevdp: dense at that fill; sparse pays at about 1%)."""
    from jax.experimental import sparse

    n, nse, p = 4096, 40_000, 32
    rng = np.random.default_rng(0)
    idx = jnp.asarray(rng.integers(0, n, (nse, 2)).astype(np.int32))
    vals = jnp.asarray(rng.normal(size=nse).astype(np.float32))
    target = jnp.asarray(rng.normal(size=(n, p)).astype(np.float32))

    def product(vals, idx, target):
        return (sparse.BCOO((vals, idx), shape=(n, n)) @ target).sum()

    def blocks(vals, idx, target, k=4):  # the fix it names
        m = sparse.BCOO((vals, idx), shape=(n, n))
        return jax.lax.map(lambda b: m @ b, target.reshape(n, p // k, k).transpose(1, 0, 2)).sum()

    said = preflight.preflight_step(product, vals, idx, target)
    assert f"for each of the matrix's {nse:,} stored elements" in said.advice
    assert "blocks of k columns" in said.advice and "jax-ml/jax#14642" in said.advice
    after = preflight.preflight_step(blocks, vals, idx, target)
    assert "BCOO @ dense" not in after.advice and after.peak_bytes < said.peak_bytes
    np.testing.assert_allclose(product(vals, idx, target), blocks(vals, idx, target), rtol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random_bcoo asks for float64
        a = sparse.random_bcoo(jax.random.key(42), shape=(32, 128), nse=0.2)
        b = sparse.random_bcoo(jax.random.key(43), shape=(32, 128), nse=0.2)
    pair = preflight.preflight_step(lambda a, b: a @ b.T, a, b)
    assert f"{a.nse * b.nse:,} pairs, where the dense product has 1,024" in pair.advice
    assert "a.todense() @ b.todense()" in pair.advice and "jax-ml/jax#14821" in pair.advice
    dense = preflight.preflight_step(lambda a, b: a.todense() @ b.todense().T, a, b)
    assert 8 * dense.peak_bytes < pair.peak_bytes
    np.testing.assert_allclose((a @ b.T).todense(), a.todense() @ b.todense().T, rtol=1e-4)


def test_jax_10007_arrays_kept_by_the_list_live_arrays_returned_are_named():
    """Live buffers grew by one per iteration of a loop that listed them: the list from the
    previous jax.live_arrays() call (and the loop variable) kept every earlier array (jax#9714,
    YouJiacheng: del them)."""
    jax.clear_caches()
    gc.collect()
    ns = {}
    for _ in range(4):
        ns["A"] = jnp.ones(512 * 1024)  # 2 MiB, made anew each pass
        gc.collect()
        ns["bs"] = jax.live_arrays()
        for b in ns["bs"]:
            ns["b"] = b
    said = str(holders.largest(5, namespace=ns))
    assert "'bs'" in said and "del bs" in said
    kept = sum(a.nbytes == 2 * MiB for a in jax.live_arrays())
    assert kept >= 4  # every pass's A, kept by the lists
    del ns["bs"], ns["b"], b  # the fix it names
    gc.collect()
    assert sum(a.nbytes == 2 * MiB for a in jax.live_arrays()) <= kept - 2


# --- 2026-11-27, second round: threads on dtypes, checkpoints, decoding, feeding, tools and
# model libraries that the kit already named when they were put to it

def test_flax_2384_3945_parameters_read_only_in_bfloat16_name_param_dtype():
    """nn.Dense(dtype=bfloat16) computes in bfloat16 and keeps float32 parameters: dtype= is the
    computation's type, param_dtype= the parameters' (jheek in flax#1374; flax#1739)."""
    def apply(params, x):
        for i in range(3):
            x = x @ params[i].astype(jnp.bfloat16)  # what Dense(dtype=bfloat16) does
        return x

    params = [jnp.full((1024, 1024), 0.01) for _ in range(3)]
    x = jnp.ones((64, 1024), jnp.bfloat16)
    p = preflight.preflight_step(apply, params, x)
    assert "param_dtype" in p.advice and "read only as bfloat16" in p.advice
    assert f"take {format_bytes(3 * 2 * MiB)} less" in p.advice
    fixed = preflight.preflight_step(apply, [w.astype(jnp.bfloat16) for w in params], x)
    assert "param_dtype" not in fixed.advice
    assert p.argument_bytes - fixed.argument_bytes == 3 * 2 * MiB


# An Adam step by hand (optax is not a dependency): two layers, 4 MiB of parameters, mu kept in
# the dtype its state was made with
_ADAM_SHAPES = {"a": (1024, 512), "b": (512, 1024)}


def _adam_step(params, state, x):
    g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["a"] @ p["b"]) ** 2))(params)
    mu = jax.tree.map(lambda m, g: (0.9 * m + 0.1 * g).astype(m.dtype), state["mu"], g)
    nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, state["nu"], g)
    new = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, mu, nu)
    return new, {"mu": mu, "nu": nu}


def _adam_arguments(mu_dtype):
    """(params, state, x) for :func:`_adam_step`, its mu in ``mu_dtype``."""
    params = {k: jnp.ones(s) for k, s in _ADAM_SHAPES.items()}
    state = {"mu": {k: jnp.zeros(s, mu_dtype) for k, s in _ADAM_SHAPES.items()},
             "nu": {k: jnp.zeros(s) for k, s in _ADAM_SHAPES.items()}}
    return params, state, jnp.ones((64, 1024))


def test_optax_173_adam_s_moments_name_mu_dtype():
    """Adam keeps mu and nu, each as many numbers as the parameters; the request became
    optax.adam(mu_dtype=...) (optax#176)."""
    p = preflight.preflight_step(_adam_step, *_adam_arguments(jnp.float32), donate_argnums=(0, 1))
    assert "state holds 2 copies of params' shapes" in p.advice and "mu_dtype" in p.advice
    fixed = preflight.preflight_step(_adam_step, *_adam_arguments(jnp.bfloat16),
                                     donate_argnums=(0, 1))
    assert p.argument_bytes - fixed.argument_bytes == 2 * MiB  # mu at half its bytes


def test_maxtext_606_adam_keeps_twelve_bytes_per_parameter_and_the_step_says_so():
    """"Adam needs 20 bytes per parameter: how does a 7B model fit?" The answer in the thread:
    12 (float32 parameters, mu and nu); the kit says it per number of the parameters, kept
    between steps, and at the step's peak. Half-width moments keep fewer."""
    numbers = 2 * 1024 * 512
    p = preflight.preflight_step(_adam_step, *_adam_arguments(jnp.float32), donate_argnums=(0, 1))
    assert all(c.of_elements == numbers for c in p.state_copies)
    assert ("Kept from step to step: 12 bytes per parameter (per number in params: 4 for "
            "params, 8 for these copies)") in p.advice
    assert f"{p.peak_bytes / numbers:.3g} at this step's peak" in p.advice
    assert p.peak_bytes / numbers > 12  # the gradients and the batch come on top
    assert "N parameters need N x 12 bytes before a step runs" in p.advice
    half = preflight.preflight_step(_adam_step, *_adam_arguments(jnp.bfloat16),
                                    donate_argnums=(0, 1))
    assert "10 bytes per parameter (per number in params: 4 for params, 6 for these copies)" in (
        half.advice)


# --- five threads put to the kit as a new user would, 2026-11-27 ---------------------------------
class _SolverState(NamedTuple):
    iter_num: jax.Array
    stepsize: jax.Array
    error: jax.Array


@jax.jit
def _solver_update(params, state):
    g = 2 * params
    step = state.stepsize * 0.5
    return params - step * g, _SolverState(state.iter_num + 1, jnp.asarray(step, jnp.float32),
                                           jnp.linalg.norm(g).astype(jnp.float32))


def test_jax_3345_a_static_length_compiles_per_value_and_the_fix_is_a_mask():
    """jax-ml/jax#3345: K in jnp.arange(K) under jit must be static, "but then this recompiles
    for each different value of K". Traced, jnp.arange(K) fails, so "make it traced" alone is
    no fix: one length for the largest K and a mask compiles once (a new user's trial)."""
    @functools.partial(jax.jit, static_argnums=0)
    def truncated(k, x):
        n = jnp.arange(k)
        return jnp.sum(x ** n / (n + 1.0))

    @jax.jit
    def masked(k, x, k_max=64):
        n = jnp.arange(k_max)
        return jnp.sum(jnp.where(n < k, x ** n / (n + 1.0), 0.0))

    ks = [3, 7, 10, 7, 21, 5, 33, 12]
    with compiles.watch() as log:
        static = [truncated(k, 0.5) for k in ks]
    entry = log.function("truncated")
    assert entry.compiles == len(set(ks)) and entry.cause == "new static values"
    line = inspect.getsourcelines(truncated)[1] + 2  # n = jnp.arange(k)
    assert entry.fix == INT_FIXES["shape"].format(
        name="k", at=f"test_user_reports.py:{line}", code="n = jnp.arange(k)")
    assert "mask past k" in log.diagnosis and entry.fix != INT_STATIC_FIX
    with pytest.raises(jax.errors.ConcretizationTypeError):  # why traced alone is no fix
        jax.jit(lambda k, x: jnp.sum(x ** jnp.arange(k)))(3, 0.5)
    with compiles.watch() as fixed:
        mask = [masked(k, 0.5) for k in ks]
    assert fixed.function("masked").compiles == 1
    assert np.allclose(static, mask)


def test_jax_1832_a_jit_of_a_grad_made_in_the_timing_loop_compiles_every_time():
    """jax-ml/jax#1832: %timeit jit(grad(f))(x) was slow every run; mattjj: a jit made inside
    the timed statement compiles each time, make it once outside (a new user's trial)."""
    def func_jax(x):
        return jnp.sum(jnp.tanh(x) ** 2)

    x = jnp.ones(100)
    with compiles.watch() as log:
        for _ in range(5):
            jax.jit(jax.grad(func_jax))(x).block_until_ready()
    entry = log.function("func_jax")
    assert entry.compiles == 5 and entry.cause == "function made anew"
    assert "jax.grad(f) made on every iteration" in entry.fix
    assert "make it once, outside the loop" in log.diagnosis
    with compiles.watch() as fixed:
        step = jax.jit(jax.grad(func_jax))
        for _ in range(5):
            step(x).block_until_ready()
    assert fixed.function("func_jax").compiles == 1


def test_jax_817_a_new_length_per_player_compiles_again_and_padding_is_named():
    """jax-ml/jax#817: a jitted Glicko update took 20 s against numba's 121 ms; jekbradbury:
    "the vast majority of time" is recompiling for new argument shapes (each player has their
    own number of opponents). Padded to a few lengths it compiles once per length."""
    @jax.jit
    def update(mu, mu_j, score):
        e = 1 / (1 + jnp.exp(-(mu - mu_j)))
        return mu + jnp.sum(score - e)

    rng = np.random.default_rng(0)
    lengths = [29, 33, 17, 29, 41, 12, 33, 8]
    with compiles.watch() as log:
        for n in lengths:
            update(0.0, jnp.asarray(rng.normal(size=n), jnp.float32),
                   jnp.asarray(rng.integers(0, 2, n), jnp.float32))
    entry = log.function("update")
    assert entry.compiles == len(set(lengths)) and entry.cause == "new shapes"
    assert "pad or bucket the inputs to a few fixed shapes" in entry.fix
    assert "mu_j: f32[29], f32[33], f32[17], f32[41]" in str(log)  # each length, by argument


def test_jax_957_a_sample_made_on_the_default_device_then_put_on_the_cpu():
    """jax-ml/jax#957: jax.device_put(jax.random.bernoulli(key, ...), cpu) samples on the
    default device and copies the result; mattjj: computation follows data, put the key on the
    CPU first. Two simulated CPU devices stand in: cpu:0 plays the default accelerator, cpu:1
    the host's CPU."""
    default, cpu = jax.devices()[:2]
    key = jax.random.key(0)
    with transfers.trace() as log:
        jax.device_put(jax.random.bernoulli(key, 0.5, (1_000_000,)), cpu).block_until_ready()
    rows = [row for row in log.by_line() if "bernoulli" in row["line"]]
    said = " ".join(r for row in rows for r in row["reasons"])
    assert "computed in its own argument" in said and "jax.device_put(key, device)" in said
    assert "jax.default_device(device)" in said
    with transfers.trace() as fixed:  # the key on the CPU first: the sample is made there
        sample = jax.random.bernoulli(jax.device_put(key, cpu), 0.5, (1_000_000,))
        sample.block_until_ready()
    assert sample.devices() == {cpu} and default not in sample.devices()
    moved = " ".join(r for row in fixed.by_line() for r in row["reasons"])
    assert "computed in its own argument" not in moved  # the key, put as it is: a plain copy
    assert sum(row["bytes"] for row in fixed.by_line()) < 64  # the key alone, not the sample
    assert sum(row["bytes"] for row in rows) > 900_000


def _mosaic_ls_body(state, *, fn, direction):  # a library's while body, parameterized
    t, x, _ = state
    t = t * 0.5
    return (t, x, fn(x + t * direction))


def test_mosaic_15_a_while_body_made_anew_outside_jit_compiles_at_every_step():
    """pasteurlabs/mosaic#15: a zoom line search driven from a Python loop outside jit builds a
    new functools.partial body for lax.while_loop at each call, so the loop compiled at every
    step until the CPU ran out of memory compiling; the fix (their PR #19): jit the update."""
    def loss(x):
        return jnp.sum((x - 3.0) ** 2)

    def linesearch(fn, x, direction):
        body = functools.partial(_mosaic_ls_body, fn=fn, direction=direction)
        cond = lambda st: (st[2] > fn(st[1]) - 1e-3) & (st[0] > 1e-4)  # noqa: E731
        return jax.lax.while_loop(cond, body, (jnp.float32(1.0), x, fn(x + direction)))[0]

    def update(x):
        g = jax.grad(loss)(x)
        return x - linesearch(loss, x, -g) * g

    x = jnp.zeros(8)
    with compiles.watch() as log:
        for _ in range(8):
            x = update(x)
    eager = log.function("eager operations")
    assert "while" in eager.same_types_again and "while ×8" in eager.changed
    assert "a body made anew at each call" in log.diagnosis
    assert "Jit `linesearch`, the function that calls it" in log.diagnosis
    step, x = jax.jit(update), jnp.zeros(8)
    with compiles.watch() as fixed:
        for _ in range(8):
            x = step(x)
    assert fixed.compiles == 1


def test_desc_1191_jitted_closures_made_anew_each_iteration_compile_each_time():
    """PlasmaControl/DESC#1191: each outer iteration returns new @jax.jit closures over that
    iteration's arrays, so each compiles again with the same shapes; the fix (their PR #1043):
    a class whose jitted method takes the arrays as data, so one compile serves them all."""
    def factorize(z, xp):
        @jax.jit
        def project(x):
            return z.T @ (x - xp)
        return project

    @jax.tree_util.register_pytree_node_class
    class Project:
        def __init__(self, z, xp):
            self.z, self.xp = z, xp

        def tree_flatten(self):
            return (self.z, self.xp), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

        @jax.jit
        def __call__(self, x):
            return self.z.T @ (x - self.xp)

    z0, x = jnp.ones((60, 24)), jnp.ones(60)
    with compiles.watch() as log:
        for it in range(5):
            factorize(z0 + it, z0[:, 0] * it)(x).block_until_ready()
    assert "`project`" in log.diagnosis and "was jitted anew 5 times" in log.diagnosis
    assert "pass that value as an argument instead" in log.diagnosis
    with compiles.watch() as fixed:
        for it in range(5):
            Project(z0 + it, z0[:, 0] * it)(x).block_until_ready()
    assert fixed.function("__call__").compiles == 1


def test_jax_1630_a_jit_of_a_grad_made_anew_bakes_in_the_params_it_closes_over():
    """jax-ml/jax#1630: jit(grad(loss)) made anew for each run, loss a linearized model that
    closes over the initial parameters: memory grows run after run. Each compile bakes the
    closed-over parameters in as constants; made once, with them as an argument, it compiles
    once."""
    k1, k2 = jax.random.split(jax.random.key(0))
    params0 = [(jax.random.normal(k1, (200, 1000)) * 0.01, jnp.zeros(1000)),
               (jax.random.normal(k2, (1000, 10)) * 0.01, jnp.zeros(10))]

    def predict(params, x):
        (w1, b1), (w2, b2) = params
        return jnp.maximum(x @ w1 + b1, 0) @ w2 + b2

    def lossf(params, x, y, around):
        delta = jax.tree.map(lambda a, b: a - b, params, around)
        out, proj = jax.jvp(lambda p: predict(p, x), (around,), (delta,))
        return 0.5 * jnp.mean((out + proj - y) ** 2)

    x, y = jnp.ones((50, 200)), jnp.ones((50, 10))
    with compiles.watch() as log:
        for _ in range(4):
            gradf = jax.jit(jax.grad(lambda p, x, y: lossf(p, x, y, params0)))
            jax.block_until_ready(gradf(params0, x, y))
    entry = log.function("<lambda>")
    assert entry.compiles == 4 and entry.cause == "function made anew"
    assert entry.constants_each >= 200 * 1000 * 4  # the closed-over w1, baked into each
    assert "closes over as constants" in log.diagnosis and "as arguments" in log.diagnosis
    gradf = jax.jit(jax.grad(lossf))  # the fix: made once, the parameters an argument
    with compiles.watch() as fixed:
        for _ in range(4):
            jax.block_until_ready(gradf(params0, x, y, params0))
    assert fixed.function("lossf").compiles == 1


def test_jaxopt_451_a_weakly_typed_solver_state_compiles_update_again():
    """google/jaxopt#451: init_state makes its scalars from Python numbers (weakly typed),
    update returns them typed, so the second update compiles again (mblondel: give them their
    dtypes, as jaxopt#106 did)."""
    params = jnp.ones((20, 3), jnp.float32)
    with compiles.watch() as log:
        state = _SolverState(jnp.asarray(0), jnp.asarray(1.0), jnp.asarray(jnp.inf))
        for _ in range(4):
            params, state = _solver_update(params, state)
    f = log.function("_solver_update")
    assert f.compiles == 2 and "only the weak type changed" in log.diagnosis
    assert "Give it its dtype from the start" in log.diagnosis and "state.stepsize" in str(log)
    assert "_solver_update" in str(log) and ": new dtypes (the weak type only)" in str(log)
    with compiles.watch() as fixed:  # the fix: typed from the start
        state = _SolverState(jnp.asarray(0, jnp.int32), jnp.asarray(1.0, jnp.float32),
                             jnp.asarray(jnp.inf, jnp.float32))
        for _ in range(4):
            params, state = _solver_update(params, state)
    assert fixed.function("_solver_update").compiles <= 1


def test_scikit_robot_871_functions_jitted_anew_in_every_solve_are_named():
    """iory/scikit-robot#871: each solve() builds closures over the robot's arrays and jits
    them anew, so every solve compiles again and the programs pile up (the maintainer: build
    them once, pass the data as arguments)."""
    def build(fk):
        def cost(q):
            return jnp.sum((jnp.cumsum(q) * fk["axes"] - fk["target"]) ** 2)
        return jax.jit(cost), jax.jit(jax.grad(cost))

    def solve(fk, q):
        cost, grad = build(fk)
        for _ in range(5):
            q = q - 0.01 * grad(q)
        return cost(q)

    fk = {"axes": jnp.linspace(0.1, 1.0, 29), "target": jnp.ones(29)}
    with compiles.watch() as log:
        for _ in range(3):
            solve(fk, jnp.zeros(29))
    said = log.diagnosis
    assert "was jitted anew 6 times, called at test_user_reports.py:" in said, said
    assert "make it once, outside the loop" in said
    assert "pass that value as an argument instead" in said

    def cost(q, fk):  # the fix: made once, the data an argument
        return jnp.sum((jnp.cumsum(q) * fk["axes"] - fk["target"]) ** 2)

    once, grad_once = jax.jit(cost), jax.jit(jax.grad(cost))
    with compiles.watch() as fixed:
        for _ in range(3):
            q = jnp.zeros(29)
            for _ in range(5):
                q = q - 0.01 * grad_once(q, fk)
            once(q, fk)
    assert "jitted anew" not in fixed.diagnosis and fixed.compiles <= 2


def test_ripple_4_a_new_frequency_grid_length_compiles_again_and_padding_is_advised():
    """tedwards2412/ripple#4: a jitted waveform compiles for every new length of the frequency
    grid. The kit's fix, padding to a few fixed lengths, now says to pad with values the
    function accepts: zeros here would meet f ** (-5 / 3)."""
    @jax.jit
    def gen_polar(f, theta):
        phase = 2 * jnp.pi * f * theta[0] + theta[1] * f ** (-5 / 3)
        amp = theta[2] * f ** (-7 / 6)
        return amp * jnp.cos(phase), amp * jnp.sin(phase)

    theta = jnp.array([0.1, 0.2, 1.0])
    grids = [jnp.linspace(20.0, 1024.0, n) for n in (100, 137, 160, 211, 250)]
    with compiles.watch() as log:
        for f in grids:
            gen_polar(f, theta)
    said = log.diagnosis
    assert "compiled 5 times, for new shapes" in said and "pad or bucket" in said
    assert "repeat the edge value" in said and "make inf or NaN" in said
    assert not jnp.isfinite(gen_polar(jnp.zeros(4), theta)[0]).any()  # why not zeros
    padded = [jnp.pad(f, (0, 256 - len(f)), mode="edge") for f in grids]  # the fix
    with compiles.watch() as fixed:
        out = [gen_polar(f, theta)[0][:len(g)] for f, g in zip(padded, grids, strict=True)]
    assert fixed.function("gen_polar").compiles <= 1
    assert all(np.allclose(o, gen_polar(g, theta)[0], rtol=1e-5)
               for o, g in zip(out, grids, strict=True))


def test_jax_2851_an_output_larger_than_the_card_is_named_with_the_host_as_the_fix():
    """jax-ml/jax#2851: a result of a GPU pipeline feeds an outer product that fits in host
    memory but not on the card (gnecula: run that step on the CPU device). The outputs alone
    are more than the card's room: no smaller batch or freed array helps."""
    v = jax.ShapeDtypeStruct((120_000,), jnp.float32)
    p = preflight.preflight_step(lambda v: jnp.outer(v, v), v, target="RTX 3090")
    assert p.verdict == "will not fit"
    assert "Its outputs alone, 53.64 GiB (float32[120000, 120000]), are more than the " in p.advice
    assert "jax.devices('cpu')[0]" in p.advice and "jax-ml/jax#2851" in p.advice
    reduced = preflight.preflight_step(lambda v: (jnp.outer(v, v) ** 2).sum(), v,
                                       target="RTX 3090")  # made and reduced inside the step
    assert "Its outputs alone" not in reduced.advice


def _mujoco_1431_buffer_init(replay_size: int):
    def init(key):  # brax's replay queue: one row of 443 floats for every transition it keeps
        return {"data": jnp.zeros((replay_size, 443), jnp.float32), "key": key}
    return init


def test_mujoco_1431_a_buffer_sized_in_the_code_is_named_not_a_smaller_batch():
    """google-deepmind/mujoco#1431 (a new user's trial): brax's SAC sized its replay buffer by
    num_timesteps (30M rows, 49.5 GiB) when max_replay_size was not given. The kit led with "a
    smaller batch", which the user had tried (batch_size=32), and the host or lax.map over
    blocks, for a buffer that must exist whole. No dimension of it comes from an argument: the
    size is a number in the code, and the fix, a smaller one, fits."""
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    p = preflight.preflight_step(_mujoco_1431_buffer_init(30_000_000), key, target="RTX 4090")
    assert p.verdict == "will not fit"
    assert "takes none of its dimensions from the step's arguments" in p.advice, p.advice
    assert "test_user_reports.py:" in p.advice and "jnp.zeros((replay_size, 443)" in p.advice
    assert "a smaller batch" not in p.advice and "lax.map" not in p.advice
    assert "mujoco#1431" in p.advice
    fixed = preflight.preflight_step(_mujoco_1431_buffer_init(1_000_000), key, target="RTX 4090")
    assert fixed.verdict == "fits"


def _jax_21377_kernel(x, y, which):
    return jnp.prod(1 + which * jnp.exp(-(x - y) ** 2))


def _jax_21377_activation(X, which, yb):
    pairs = jax.vmap(jax.vmap(_jax_21377_kernel, in_axes=(0, None, None)),
                     in_axes=(None, 0, None))(X, X, which)
    return jnp.dot(yb, pairs @ yb)


def test_jax_21377_nested_vmaps_over_a_kernel_are_named_with_lax_map():
    """jax-ml/jax#21377: nested vmaps of a kernel function build an (N, N, d) intermediate for
    every row of the outer batch; froystig (jax#11319): jax.lax.map with a batch_size. The kit
    names lax.map; the largest value it lists, the exp over every pair, is the same for every
    element of the batch (XLA computes it once), so it does not shrink as the note says."""
    k0, k1, k2 = jax.random.split(jax.random.key(0), 3)
    X = jax.random.normal(k0, (200, 30))
    active = jax.random.randint(k1, (30, 30), 0, 2).astype(jnp.float32)
    y = jax.random.normal(k2, (30, 200))
    batched = jax.vmap(_jax_21377_activation, in_axes=(None, 0, 0))
    p = preflight.preflight_step(batched, X, active, y)
    assert "are made under jax.vmap for every element of the batch at once" in p.advice
    assert "jax.lax.map(f, xs, batch_size=k)" in p.advice

    def mapped(X, active, y):  # the fix, five rows of the batch at a time
        return jax.lax.map(lambda a: _jax_21377_activation(X, *a), (active, y), batch_size=5)

    fixed = preflight.preflight_step(mapped, X, active, y)
    assert fixed.peak_bytes < p.peak_bytes
    assert np.allclose(jax.jit(batched)(X, active, y), jax.jit(mapped)(X, active, y),
                       rtol=1e-4)
    # the batch (30) is also the kernel's width (30): the exp, the same for every element, is
    # read as batched; with a width of 24 the largest named is the product, which is batched
    assert "exp f32[200, 200, 30]" in p.advice.split(":")[0]
    narrower = preflight.preflight_step(batched, X[:, :24], active[:, :24], y)
    assert narrower.advice.startswith("The largest value, reduce_prod f32[30, 200, 200]")


def test_jax_8933_an_array_made_for_another_device_is_made_on_the_default_one_first():
    """jnp.zeros(n, device=host) is made whole on the default device and copied: the user's
    host-sized array passed through the accelerator (two CPU devices stand in for both)."""
    host = jax.devices()[1]
    n = 1 << 20
    jnp.zeros(n, device=host).block_until_ready()  # compiled before the trace
    with transfers.trace() as log:
        x = jnp.zeros(n, device=host)
    assert x.devices() == {host}
    reasons = " ".join(r for row in log.by_line() for r in row["reasons"])
    assert "made whole on the default device" in reasons and "jax.default_device" in reasons
    with jax.default_device(host):
        jnp.zeros(n).block_until_ready()
    with transfers.trace() as fixed, jax.default_device(host):  # the fix the kit names
        y = jnp.zeros(n)
    assert y.devices() == {host} and fixed.count("device->device") == 0


def test_equinox_307_a_loss_jitted_inside_the_training_function_is_made_anew():
    """eqx.filter_jit on a loss defined inside train(): each call makes and compiles a new
    function (slow, then a crash); jit it once, outside."""
    def train(w, x):
        @jax.jit
        def loss(w, x):
            return jnp.mean((x @ w) ** 2)
        return jax.value_and_grad(loss)(w, x)

    w, x = jnp.ones((4, 2)), jnp.ones((16, 4))
    with compiles.watch() as log:
        for _ in range(4):
            train(w, x)
    (entry,) = [f for f in log.functions if f.cause == "function made anew"]
    assert entry.compiles == 4 and "outside the loop" in log.diagnosis
    once = jax.jit(jax.value_and_grad(lambda w, x: jnp.mean((x @ w) ** 2)))
    with compiles.watch() as fixed:
        for _ in range(4):
            once(w, x)
    assert fixed.compiles == 1


def test_keras_21712_a_weight_loaded_whole_on_one_device_then_split():
    """Keras loaded each weight onto one device and then sharded it, so the largest weight
    needed a whole device (the PR's fix: assign straight into the sharded variable)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    s = NamedSharding(Mesh(np.array(jax.devices()), ("model",)), P(None, "model"))
    weights = {k: np.ones((512, 1024), np.float32) for k in "abc"}
    with transfers.trace() as log:
        placed = {k: jax.device_put(jnp.asarray(v), s) for k, v in weights.items()}
    reasons = " ".join(r for row in log.by_line() for r in row["reasons"])
    assert "whole on one device" in reasons and "jax-ml/jax#14075" in reasons
    assert "put host data (NumPy) straight onto the sharding" in reasons
    with transfers.trace() as fixed:
        straight = {k: jax.device_put(v, s) for k, v in weights.items()}
    assert fixed.count("device->device") == 0 and fixed.count("host->device") > 0
    assert all(a.sharding == s for a in (*placed.values(), *straight.values()))


def test_ott_423_a_failed_solve_s_arrays_are_held_by_the_saved_traceback():
    """Memory looked dead after a failed Sinkhorn run until the kernel restarted: the saved
    traceback keeps the failed frame's locals."""
    def solve_bad(x):
        kernel = jnp.exp(-((x[:, None] - x[None, :]) ** 2))  # noqa: F841 (the traceback keeps it)
        raise FloatingPointError("the solver diverged")

    saved = getattr(sys, "last_traceback", None)
    try:
        solve_bad(jnp.linspace(0, 1, 2048))
    except FloatingPointError:
        sys.last_traceback = sys.exc_info()[2]
    try:
        h = holders.largest(3, namespace={})
        (kept,) = [a for a in h.arrays if a.nbytes == 2048 * 2048 * 4]
        assert any("sys.last_traceback" in w and "'kernel'" in w for w in kept.held_by)
        assert "sys.last_traceback = None" in kept.fix
        sys.last_traceback = None  # the kit's fix (IPython's own copy: tests/test_holders.py)
        gc.collect()
        assert all(a.nbytes != 2048 * 2048 * 4 for a in holders.largest(3, namespace={}).arrays)
    finally:
        sys.last_traceback = saved


def test_jasmine_16_a_sampler_whose_sequence_grows_compiles_every_token():
    """The sampler recompiled each step as the token sequence grew by one: pad to the full
    length and mask (p-doom/jafar#60)."""
    emb = jnp.ones((64, 8))

    @jax.jit
    def logits(tokens):
        return (emb[tokens].sum(1) @ emb.T)

    toks = jnp.array([[1, 2, 3]])
    with compiles.watch() as log:
        for _ in range(6):
            toks = jnp.concatenate([toks, jnp.argmax(logits(toks), -1)[:, None]], axis=1)
    entry = log.function("logits")
    assert entry.compiles == 6 and entry.cause == "new shapes"
    assert "grows by one along a dimension" in entry.fix
    assert "dynamic_update_slice" in entry.fix and "mask" in entry.fix

    @jax.jit
    def padded_logits(tokens, n):  # the fix: one length, positions past n masked out
        keep = (jnp.arange(tokens.shape[1]) < n)[None, :, None]
        return (jnp.where(keep, emb[tokens], 0).sum(1) @ emb.T)

    buf = jnp.zeros((1, 9), jnp.int32).at[:, :3].set(jnp.array([[1, 2, 3]]))
    with compiles.watch() as fixed:
        for n in range(3, 9):
            buf = buf.at[:, n].set(jnp.argmax(padded_logits(buf, n), -1))
    assert fixed.function("padded_logits").compiles == 1
    assert (buf[:, 3:9] == toks[:, 3:9]).all()


def test_diffusers_1096_a_static_guidance_scale_compiles_for_each_value():
    """The Flax pipeline recompiled whenever guidance_scale changed: it was static; pass it as
    an array (pcuenca)."""
    from functools import partial

    @partial(jax.jit, static_argnums=1)
    def sample(latents, guidance_scale):
        return latents * (1 + guidance_scale)

    lat = jnp.ones((4, 64))
    with compiles.watch() as log:
        for g in (7.5, 8.0, 6.5):
            sample(lat, g)
    entry = log.function("sample")
    assert entry.compiles == 3 and entry.cause == "new static values"
    assert "now 6.5" in str(log) and "traced argument" in entry.fix
    traced = jax.jit(lambda latents, g: latents * (1 + g))
    with compiles.watch() as fixed:
        for g in (7.5, 8.0, 6.5):
            traced(lat, jnp.float32(g))
    assert fixed.compiles == 1


def test_jax_ai_stack_243_a_generate_step_run_op_by_op_is_named_and_jit_is_the_fix():
    """The tutorial's generate_step ran outside jit, one operation at a time; the merged fix
    jits it with the tokens padded to maxlen and the position passed in."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("import jax, jax.numpy as jnp\nfrom helpers.ipython import EAGER_RUNS")
    ip.run_line_magic("load_ext", "helpers")
    try:
        ip.run_cell("w = jnp.full((32, 32), 0.01)\n"
                    "def generate_step(tokens):\n"
                    "    x = jnp.array(tokens + [0] * (128 - len(tokens)))\n"
                    "    h = jax.nn.one_hot(x, 32) @ w\n"
                    "    return jnp.argmax(h[len(tokens) - 1])\n"
                    "step_jit = jax.jit(lambda padded, i: jnp.argmax((jax.nn.one_hot(padded, 32)"
                    " @ w)[i]))")
        eager = ip.run_cell_magic("memory", "", "gen = [1]\nfor _ in range(EAGER_RUNS):\n"
                                  "    gen.append(int(generate_step(gen)))\n")
        assert eager.eager_lines and "dispatched one by one" in str(eager)
        assert "Jit the loop's body" in str(eager)
        fixed = ip.run_cell_magic("memory", "", "gen2 = [1]\nfor _ in range(EAGER_RUNS):\n"
                                  "    padded = jnp.array(gen2 + [0] * (128 - len(gen2)))\n"
                                  "    gen2.append(int(step_jit(padded, len(gen2) - 1)))\n")
        assert fixed.eager_lines == ()  # one jitted call a token: nothing dispatched op by op
        assert ip.user_ns["gen"] == ip.user_ns["gen2"]
    finally:
        ip.run_line_magic("unload_ext", "helpers")
        ip.reset()


def test_numpyro_1802_a_collection_updated_without_donation_is_copied_whole_at_each_sample():
    """pyro-ppl/numpyro#1802: with a progress bar, fori_collect writes each sample into its
    collection in a jitted body called once per sample, without donate_argnums: every call copies
    the whole collection first (the PR's fix: donate it)."""
    n, d = 1024, 1024

    def body(state, collection, idx):
        z = state * 0.99 + 0.01
        return z, jax.lax.dynamic_update_slice(collection, z[None], (idx, 0)), idx + 1

    args = (jnp.ones(d), jnp.zeros((n, d)), jnp.array(0))
    r = preflight.preflight_step(body, *args)
    assert r.copied_to_update == (("collection", n * d * 4),)
    assert "Donating collection" in r.advice and "copies all 4.00 MiB of it first" in r.advice
    donated = preflight.preflight_step(jax.jit(body, donate_argnums=(0, 1)), *args)
    assert "collection" not in dict(donated.copied_to_update)  # the fix: written in place
    assert r.peak_bytes - donated.peak_bytes >= 4 * MiB - 64 * 1024


def test_jax_2139_a_checkpointed_scan_body_is_told_to_scan_over_checkpointed_chunks():
    """jax-ml/jax#2139: checkpointing a long scan's body still keeps one carry per step;
    shoyer's answer, a scan over checkpointed chunks (nested_checkpoint_scan), keeps one per
    chunk. The fix the kit names is run: 4 MiB -> 128 KiB."""
    n, b, d = 1024, 16, 64  # a carry of 4 KiB; 1,024 of them are 4 MiB

    def step(c, w):
        return jnp.tanh(c @ w), None

    def body_checkpointed(c0, w):
        c, _ = jax.lax.scan(jax.checkpoint(lambda c, _: step(c, w)), c0, None, length=n)
        return jnp.sum(c)

    def chunked(c0, w):  # the fix as the kit writes it: 32 chunks of 32 steps
        chunk = jax.checkpoint(lambda c, _: jax.lax.scan(lambda c, _: step(c, w), c, None,
                                                         length=32))
        c, _ = jax.lax.scan(chunk, c0, None, length=n // 32)
        return jnp.sum(c)

    c0, w = jnp.ones((b, d)), jnp.eye(d) * 0.5
    r = preflight.residuals(body_checkpointed, c0, w)
    assert r.saved_bytes == 4 * MiB and "under jax.checkpoint already" in r.advice
    assert "chunks of 32 steps keeps one carry per chunk, 32 in all" in r.advice
    fixed = preflight.residuals(chunked, c0, w)
    assert fixed.saved_bytes == 128 * 1024
    assert jnp.allclose(jax.grad(chunked, 1)(c0, w), jax.grad(body_checkpointed, 1)(c0, w))


# equinox.filter_jit as the kit meets it, for a machine without equinox: a wrapper object of
# equinox._jit whose donate= (default "none") donates every argument ("all") or all but the
# first ("all-except-first"), whose function is __wrapped__ (its name, __name__), and whose own
# lower() takes no shapes (equinox 0.13.8's _jit.py: donate_first, donate_rest, __wrapped__)
_EQUINOX = '''
import jax

class _JitWrapper:
    def __init__(self, fn, donate):
        self.__wrapped__, self.__name__, self.donate_first = fn, fn.__name__, donate == "all"
        self.donate_rest = donate in ("all", "all-except-first")

    def _jit(self, count):
        first = (0,) if self.donate_first else ()
        return jax.jit(self.__wrapped__, donate_argnums=first + (
            tuple(range(1, count)) if self.donate_rest else ()))

    def lower(self, *args):
        if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args)):
            raise TypeError("a ShapeDtypeStruct is no array to this wrapper")
        return self._jit(len(args)).lower(*args)

    def __call__(self, *args):
        return self._jit(len(args))(*args)

def filter_jit(fn, *, donate="none"):
    return _JitWrapper(fn, donate)
'''


def test_spd_971_an_equinox_filter_jit_that_donates_nothing_is_named_with_donate(monkeypatch):
    """goodfire-ai/spd#971: eqx.filter_jit steps kept the old model and Adam state beside the
    new at every step; the fix, donate='all' or 'all-except-first'. The kit said nothing: it
    cannot add a donation to another library's wrapper. It now asks the wrapper with each
    donate= and names the drops (with equinox 0.13.8 itself, jax 0.10.2: an Adam step of an
    eqx.nn.MLP planned at 12.16 MiB, 2.45 MiB less with 'all-except-first', 4.45 with 'all').
    Here equinox is a stand-in module with its API (no equinox in the test environment)."""
    import types

    equinox = types.ModuleType("equinox")
    exec(compile(_EQUINOX, "equinox/_jit.py", "exec"), equinox.__dict__)
    equinox._JitWrapper.__module__ = "equinox._jit"
    monkeypatch.setitem(sys.modules, "equinox", equinox)

    def step(model, opt_state, x):  # SGD with momentum: the state is as large as the model
        g = jax.grad(lambda m: jnp.mean(jnp.tanh(x @ m["w"]) ** 2))(model)
        mom = jax.tree.map(lambda v, d: 0.9 * v + d, opt_state, g)
        return jax.tree.map(lambda p, v: p - 0.01 * v, model, mom), mom

    model = {"w": jnp.ones((1024, 1024))}
    opt_state = {"w": jnp.zeros((1024, 1024))}
    x = jnp.ones((64, 1024))
    r = preflight.preflight_step(equinox.filter_jit(step), model, opt_state, x)
    assert "Nothing donated: step is an equinox.filter_jit" in r.advice
    drops = dict(re.findall(r"donate='([\w-]+)', [^:]+: ([\d.]+ [KM]iB) less", r.advice))
    assert set(drops) == {"all-except-first", "all"}, r.advice
    assert "goodfire-ai/spd#971" in r.advice and "deleted by the call" in r.advice
    for mode in drops:  # the fix as the note writes it: the peak drops by what it says
        fixed = preflight.preflight_step(equinox.filter_jit(step, donate=mode), model,
                                         opt_state, x)
        assert format_bytes(r.peak_bytes - fixed.peak_bytes) == drops[mode]
        assert r.peak_bytes - fixed.peak_bytes >= 2**20 and "Nothing donated" not in fixed.advice
    plain = preflight.preflight_step(jax.jit(step), model, opt_state, x)  # jax.jit: as before
    assert "equinox" not in plain.advice and "Nothing donated for model, opt_state" in plain.advice


def test_keras_core_888_an_object_s_stale_array_is_named_by_its_path_and_let_go():
    """keras-team/keras-core#888: the trainer kept each variable's old value beside the state
    it trained, a third copy of the model; the fix, drop those values during fit. The kit said
    "held by a __main__.Variable object", no path and no fix. It now walks up to the user's
    variable (model.trainable_variables[i].value) and says to let go of it; followed, the
    live bytes drop by the four stale arrays."""

    class Variable:  # a KerasVariable in miniature
        def __init__(self, value):
            self.value = value

    class Model:
        def __init__(self):
            self.trainable_variables = [Variable(jnp.full((1024, 2048), float(i)))
                                        for i in range(4)]

    gc.collect()  # another test's garbage: not in the counts below
    ns = {"model": Model()}
    ns["state"] = [v.value + 1.0 for v in ns["model"].trainable_variables]  # the trained copy
    h = holders.largest(8, namespace=ns, seconds=60)  # 8 MiB each: the largest live
    stale = [a for a in h.arrays if any("Variable object" in line for line in a.held_by)]
    assert len(stale) == 4
    paths = {re.search(r"reached as (\S+) from", a.held_by[0]).group(1) for a in stale}
    assert paths == {f"model.trainable_variables[{i}].value" for i in range(4)}
    assert all("= None`" in a.fix and "keras-core#888" in a.fix for a in stale)
    before = memory.live_bytes_by_device()
    for v in ns["model"].trainable_variables:  # the fix, as the kit writes it
        v.value = None
    gc.collect()
    after = memory.live_bytes_by_device()
    assert sum(before.values()) - sum(after.values()) == 4 * 1024 * 2048 * 4


def test_jax_2651_a_host_array_put_onto_a_sharding_is_told_to_read_it_in_pieces(tmp_path):
    """jax-ml/jax#2651: an array larger than the host's memory, which the devices hold
    together, cannot be put from a whole host array; the answer since (hawkinsp), build it a
    piece at a time. The kit said "jax.device_put". It now says the host array is whole first
    and names jax.make_array_from_callback over the stored data; followed with a memmap, the
    callback reads one quarter of the rows per device and the array is the same."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    s = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("x",)), P("x"))
    host = np.arange(512 * 256, dtype=np.float32).reshape(512, 256)
    with transfers.trace() as log:
        whole = jax.device_put(host, s)
    (reason,) = {t.reason for t in log}
    assert "whole in host memory first" in reason and "jax-ml/jax#2651" in reason
    assert "jax.make_array_from_callback(shape, sharding, lambda index: source[index])" in reason
    path = tmp_path / "x.npy"
    np.save(path, host)
    source = np.load(path, mmap_mode="r")  # the fix, as the reason writes it
    read = []

    def piece(index):
        read.append(source[index].shape)
        return source[index]

    built = jax.make_array_from_callback(source.shape, s, piece)
    assert read == [(128, 256)] * 4  # one piece per device, none the whole
    assert built.sharding == s and np.array_equal(np.asarray(built), np.asarray(whole))


class _Box:  # jax-ml/jax#9024's custom pytree: hashed and compared by identity
    def __init__(self, data):
        self.data = data


jax.tree_util.register_pytree_node(_Box, lambda b: ((b.data,), None), lambda _, d: _Box(*d))


def test_jax_9024_a_static_pytree_of_arrays_is_named_not_refused_and_passed_traced():
    """jax-ml/jax#9024: a registered pytree passed as a static argument, its array changed in
    place, gave a stale result. preflight_step refused the user's own jit ("fails on these
    arguments ... ShapeDtypeStruct"), and compiles.watch advised equality by value for one made
    anew at each call, which compiles once per value. Both now say to pass it traced; followed,
    the result is fresh and it compiles once."""
    static = jax.jit(lambda b: b.data * 2, static_argnums=0)
    box = _Box(jnp.arange(4))
    p = preflight.preflight_step(static, box)
    assert "argument 0 (b), a _Box holding int32[4] is static in this jit" in p.advice
    assert "stale results" in p.advice and "jax-ml/jax#9024" in p.advice
    static(box)
    box.data = jnp.arange(4) + 1  # changed in place: the static jit does not see it
    assert static(box).tolist() == [0, 2, 4, 6]  # stale: the thread's bug
    with compiles.watch() as log:
        for i in range(3):
            static(_Box(jnp.arange(4) + i))
    (f,) = [f for f in log.functions if f.compiles > 1]
    assert "make it no static argument at all" in f.fix and "jax-ml/jax#9024" in f.fix
    traced = jax.jit(lambda b: b.data * 2)  # the fix
    with compiles.watch() as fixed:
        outs = [traced(_Box(jnp.arange(4) + i)).tolist() for i in range(3)]
    assert outs == [[2 * (j + i) for j in range(4)] for i in range(3)]
    assert [f.compiles for f in fixed.functions if f.compiles] == [1]


def test_transformers_14864_iterating_over_a_jax_index_array_is_named_with_np_asarray():
    """huggingface/transformers#14864: a data loader indexed its dataset with slices of a
    jax.random.permutation, and the dataset walked each index; np.asarray of the permutation,
    once, fixed it. The kit said "an argument of a jitted call" for the walk and the slice. It
    now names the iteration over a jax.Array and the slice's bounds; followed, no copies."""

    def rows(key):  # a dataset's __getitem__ in miniature: it walks the key
        return [int(i) for i in key]

    def batches(perm, steps=4, size=256):  # (JAX slices it in chunks of 100)
        for s in range(steps):
            sel = perm[s * size:(s + 1) * size]
            yield rows(sel)

    perm = jax.random.permutation(jax.random.PRNGKey(0), 1024)
    list(batches(perm))  # the first slices compile
    with transfers.trace() as log:
        got = list(batches(perm))
    by = {r["line"].split(": ", 1)[1]: " ".join(r["reasons"]) for r in log.by_line()}
    walk = by["return [int(i) for i in key]"]
    assert walk.startswith("iterating over key in Python (for i in key), if it is a jax.Array")
    assert "np.asarray(x)" in walk and "huggingface/transformers#14864" in walk
    assert by["sel = perm[s * size:(s + 1) * size]"].startswith("an index or slice bound")
    with transfers.trace() as fixed:  # the fix: the permutation as NumPy, once
        again = list(batches(np.asarray(perm)))
    assert fixed.count() == 0 and again == got
    double = jax.jit(lambda x: x * 2)
    host = [np.ones(3, np.float32) for _ in range(3)]
    double(host[0])
    with transfers.trace() as jitted:  # a walk over a list, each item a jitted call's: not it
        [double(x) for x in host]
    assert jitted.count() == 3 and all(
        r["reasons"][0].startswith("an argument of a jitted call") for r in jitted.by_line())
    arrs, preds, targets = [jnp.ones(3)] * 3, jnp.ones(1000), np.ones(1000, np.float32)
    err = preds[:1000] - targets  # (each line run once before: its compile's copies left out)
    ys = [a * 2.0 for a in arrs]
    with transfers.trace() as other:  # a number times each item, a NumPy operand: not them
        ys = [a * 2.0 for a in arrs]
        err = preds[:1000] - targets
    assert other.count() and not any(r["reasons"][0].startswith(("iterating over", "an index"))
                                     for r in other.by_line()), (ys, err)


def test_jax_4885_a_reshard_by_device_put_through_the_host_is_named_with_a_jit():
    """jax-ml/jax#4885: jax.device_put of a sharded array to another sharding went through the
    host. It still does where the new pieces are none of the array's (jax/_src/array.py's
    slow path reads x._value and keeps it): the guard logs copies from the host, and the kit
    gave NumPy advice ("jax.device_put", a buffer to refill). It now names the round trip and
    a jit with out_shardings, which the test runs: no copy logged, the same array."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    x = jax.device_put(np.arange(512 * 512, dtype=np.float32).reshape(512, 512),
                       NamedSharding(mesh, P("d")))
    s = NamedSharding(mesh, P(None, "d"))
    assert jaxcompat.host_copy_bytes(x) == 0
    with transfers.trace() as log:
        y = jax.device_put(x, s)
    puts = [t for t in log if t.direction == "host->device"]
    assert len(puts) == 4 and all(t.reason.startswith(
        "jax.device_put of a jax.Array to a placement whose pieces it does not hold") and
        "jax-ml/jax#4885" in t.reason and "refill" not in t.reason for t in puts)
    assert jaxcompat.host_copy_bytes(x) == x.nbytes  # the whole array, kept on the host
    host = np.asarray(x)
    with transfers.trace() as from_numpy:  # host data put so: named as host data still
        jax.device_put(host, s)
    assert all("jax.Array" not in t.reason for t in from_numpy)
    with transfers.trace() as mixed:  # host data beside an array: named as host data
        jax.device_put({"batch": host, "step": jnp.ones((4, 4))}, s)
    assert not any("jax.Array to a placement" in t.reason for t in mixed)
    with transfers.trace() as fixed:  # the fix the reason names
        z = jax.jit(lambda a: a, out_shardings=s)(x)
    assert fixed.count() == 0 and z.sharding == s and np.array_equal(z, y)


def test_numpyro_696_a_pmap_output_put_on_one_device_is_named_as_refused_by_pmap():
    """pyro-ppl/numpyro#696 (jax-ml/jax#3597): jax.device_put of a pmap's output gathers it
    onto one device; passed on to another pmap it was copied apart again. Committed so, a pmap
    now refuses it, and the kit said it "is split over its devices at each call", as for an
    uncommitted array. It now says the pmap refuses it, and to pass the output as it is (run:
    no copy)."""
    step = jax.pmap(lambda k: jax.random.normal(k, (256, 64)))
    states = step(jax.random.split(jax.random.PRNGKey(0), jax.local_device_count()))
    mean = jax.pmap(lambda x: x.mean())
    gathered = jax.device_put(states, jax.devices()[0])
    said = devices.placement(gathered).explanation
    assert "committed there" in said and "a pmap refuses it" in said
    assert "pyro-ppl/numpyro#696" in said and "split over its devices at each call" not in said
    with pytest.raises(ValueError, match="does not match the sharding|incompatible devices"):
        mean(gathered)
    loose = devices.placement(jnp.asarray(np.asarray(states))).explanation  # not committed
    assert "split over its devices at each call" in loose and "refuses" not in loose
    with transfers.trace() as log:  # the fix: the output as it is
        out = mean(states)
    assert log.count() == 0 and out.shape == (jax.local_device_count(),)


def test_jasmine_123_a_numpy_batch_widened_by_numpy_s_own_division_is_named_as_such():
    """p-doom/jasmine#123: video.astype(bf16) / 255.0 in NumPy is float32 (NumPy's rule for
    bfloat16 and a Python float), so the bfloat16 model ran in float32. The kit named the
    promotion and the cast, but not why the batch was float32, and warned that casting before
    the step loses a parameter's master copy (a new user's trial). Now a NumPy argument is
    named as data made on the host, with NumPy's division; the PR's jnp division runs in
    bfloat16 and is not named."""
    import ml_dtypes

    def forward(w, videos):
        x = videos.reshape(-1, 48)
        for _ in range(3):
            x = x + jnp.tanh(x.astype(jnp.bfloat16) @ w)
        return x

    w = jnp.full((48, 48), 0.01, jnp.bfloat16)
    video = np.random.default_rng(0).integers(0, 255, (16, 1024, 48), dtype=np.uint8)
    before = video.astype(ml_dtypes.bfloat16) / 255.0
    assert isinstance(before, np.ndarray) and before.dtype == np.float32  # NumPy's rule
    said = preflight.preflight_step(forward, w, before).advice
    assert "videos came as a NumPy float32 array, made on the host" in said
    assert "NumPy computes a bfloat16 array divided by a Python float" in said
    assert "p-doom/jasmine#123" in said and "master copy" not in said
    after = (jnp.asarray(video, jnp.float32) / 255.0).astype(jnp.bfloat16)  # the PR's fix
    assert forward(w, after).dtype == jnp.bfloat16
    assert "jasmine#123" not in preflight.preflight_step(forward, w, after).advice
    batch = jnp.asarray(before)  # a jax.Array: the cast-where-read fix, as before
    assert "master copy" in preflight.preflight_step(forward, w, batch).advice


def test_tunix_1880_bfloat16_moments_promoted_by_float32_gradients_are_cast_back():
    """google/tunix#1880: Adam moments kept in bfloat16 beside float32 parameters came back
    float32 after optax's update (b1 * mu + (1 - b1) * g, g float32), and the step compiled
    again. compiles.watch named optax's bias correction of the integer count, whose value
    reaches only the parameters, and its cast there left 2 compiles (a new user's trial with
    optax 0.2.8). Now the promotion is named with the PR's fix, the state cast back to the
    dtypes it came in, run here: 1 compile, the moments bfloat16."""
    def step_of(cast_back):
        @jax.jit
        def step(params, state, x):
            g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"]) ** 2))(params)
            mu = 0.9 * state["mu"] + 0.1 * g["w"]  # bfloat16 meets float32
            count = state["count"] + 1
            mu_hat = mu / (1 - 0.9 ** count)  # an integer meets a Python float
            new = {"mu": mu, "count": count}
            if cast_back:
                new = jax.tree.map(lambda n, o: n.astype(o.dtype), new, state)
            return {"w": params["w"] - 1e-3 * mu_hat}, new
        return step

    def train(cast_back):
        p = {"w": jnp.full((64, 64), 0.01, jnp.float32)}  # (typed: not weak)
        s = {"mu": jnp.zeros((64, 64), jnp.bfloat16), "count": jnp.zeros((), jnp.int32)}
        step = step_of(cast_back)
        with compiles.watch() as log:
            for _ in range(3):
                p, s = step(p, s, jnp.ones((8, 64)))
        return log.function("step"), s

    entry, state = train(cast_back=False)
    assert (entry.compiles, entry.cause, state["mu"].dtype) == (2, "new dtypes", jnp.float32)
    assert "jnp promotes a bfloat16 value with a float32 one" in entry.fix
    assert "new.astype(old.dtype)" in entry.fix and "google/tunix#1880" in entry.fix
    assert "an integer array meets" not in entry.fix and "count.astype" not in entry.fix
    fixed, kept = train(cast_back=True)
    assert fixed.compiles == 1 and kept["mu"].dtype == jnp.bfloat16


def test_optax_1051_an_integer_count_meeting_a_python_float_widens_the_state_under_x64():
    """google-deepmind/optax#1051: under x64, prodigy's float32 state came back float64 (its
    bias correction, 0.9 ** (count + 1) of an int32 count, is jnp's default float there), and
    the update compiled again. A new user's miniature got the NumPy-scalar cause of jax#1830
    and its fix, jnp.float32(lr), which left 2 compiles and a float64 state. The kit now names
    the line where the program makes float64 from the integer, and the fix (optax's: cast
    there), run: 1 compile, the state float32."""
    beta1, lr = 0.9, 1.0

    def update_of(fixed):
        @jax.jit
        def update(grads, state):
            count = state["count"].astype(jnp.float32) if fixed else state["count"]
            bc = 1 / (1 - beta1 ** (count + 1))  # the line the kit names
            grad_sum = 0.99 * state["grad_sum"] + lr * bc * grads
            return dict(state, grad_sum=grad_sum, count=state["count"] + 1)
        return update

    def train(fixed):
        state = {"grad_sum": jnp.zeros(1024, jnp.float32), "count": jnp.zeros((), jnp.int32)}
        grads = jnp.full(1024, 0.01, jnp.float32)
        update = update_of(fixed)
        with compiles.watch() as log:
            for _ in range(3):
                state = update(grads, state)
        return log.function("update"), state

    with x64():
        entry, state = train(fixed=False)
        fixed, kept = train(fixed=True)
    assert (entry.compiles, entry.cause, state["grad_sum"].dtype) == (2, "new dtypes",
                                                                      jnp.float64)
    assert "the step widens its own output" in entry.fix
    assert "bc = 1 / (1 - beta1 ** (count + 1))" in entry.fix
    assert "an integer array meets a Python float" in entry.fix
    assert "count.astype(jnp.float32)" in entry.fix and "google-deepmind/optax#1051" in entry.fix
    assert "np.linspace" not in entry.fix  # jax#1830's NumPy scalar is not this one's cause
    assert (fixed.compiles, kept["grad_sum"].dtype) == (1, jnp.float32)  # the fix named


def test_jax_4827_adam_s_two_bias_corrections_are_fixed_by_one_cast_of_the_step():
    """jax-ml/jax#4827: under x64 Adam turned float32 parameters float64 (b1 ** (i + 1) and
    b2 ** (i + 1) of an integer step). XLA makes one conversion of i for both lines and names
    the first; a trial cast there, still had 3 compiles, and was then told the second line.
    The fix says so now, and casting the step once where it enters, run: 1 compile, float32."""
    b1, b2 = 0.9, 0.999

    def update_of(cast):
        @jax.jit
        def update(i, state):
            x, m, v = state
            if cast:
                i = i.astype(jnp.float32)  # the fix named: once, where it enters
            g = 2 * x
            m = 0.1 * g + b1 * m
            v = 0.001 * g * g + b2 * v
            mhat = m / (1 - b1 ** (i + 1))
            vhat = v / (1 - b2 ** (i + 1))
            return x - 1e-3 * mhat / (jnp.sqrt(vhat) + 1e-8), m, v
        return update

    def train(cast):
        x = jnp.ones((64, 64), jnp.float32)
        state, update = (x, jnp.zeros_like(x), jnp.zeros_like(x)), update_of(cast)
        with compiles.watch() as log:
            for i in np.arange(3):  # NumPy's int64 step, as the thread's counter
                state = update(i, state)
        return log.function("update"), state

    with x64():
        entry, state = train(cast=False)
        fixed, kept = train(cast=True)
    assert entry.compiles >= 2 and state[0].dtype == jnp.float64
    assert "cast the integer once where it enters the step" in entry.fix
    assert "jax-ml/jax#4827" in entry.fix
    assert fixed.compiles == 1 and kept[0].dtype == jnp.float32


def test_sglang_jax_241_a_random_init_beside_the_loaded_weights_is_named_with_eval_shape():
    """sgl-project/sglang-jax#241: a model built with random weights, then its checkpoint
    loaded: both alive at once, twice the weights at the peak. The maintainer's fix: build the
    shapes only (jax.ShapeDtypeStruct, jax.eval_shape) and load into them. The kit names the
    two alike trees and that fix; run: the peak halves."""
    from safetensors.numpy import load, save

    shapes = {f"layer{i}.kernel": (512, 512) for i in range(4)}  # 4 MiB
    blob = save({k: np.full(s, 0.5, np.float32) for k, s in shapes.items()})

    def init():
        keys = jax.random.split(jax.random.key(0), len(shapes))
        return {k: jax.random.normal(key, s)
                for key, (k, s) in zip(keys, shapes.items(), strict=True)}

    def live():
        return sum(memory.live_bytes_by_device().values())

    start = live()
    params = init()  # the random init, made when the model is built
    weights = {k: jax.device_put(v) for k, v in load(blob).items()}
    peak = live() - start
    said = str(holders.largest(8, namespace={"params": params, "weights": weights}))
    assert "params and weights hold trees alike" in said
    assert "jax.eval_shape" in said
    del params, weights
    abstract = jax.eval_shape(init)  # the fix: shapes only, then load into them
    weights = {k: jax.device_put(v) for k, v in load(blob).items()}
    assert {k: v.shape for k, v in abstract.items()} == {k: v.shape for k, v in weights.items()}
    assert live() - start == peak // 2 == 4 * 2**20


def test_whisper_jax_7_float32_parameters_read_as_float16_are_named_with_to_fp16():
    """sanchit-gandhi/whisper-jax#7: a model computing in float16 took far more of the card
    than expected; its parameters were float32 (a Flax module's dtype= sets the computation's
    type), and the maintainer's fix was model.to_fp16(params). The kit names the parameters
    read only as float16 and that fix; run: the arguments halve."""
    params = {f"layer{i}": {"kernel": jnp.full((512, 512), 0.01), "bias": jnp.zeros(512)}
              for i in range(3)}

    def forward(params, x):
        h = x.astype(jnp.float16)
        for i in range(3):
            p = params[f"layer{i}"]
            h = jnp.tanh(h @ p["kernel"].astype(jnp.float16) + p["bias"].astype(jnp.float16))
        return h

    x = jnp.ones((8, 512), jnp.float16)
    report = preflight.preflight_step(forward, params, x)
    said = report.advice
    assert "are read only as float16" in said and "model.to_fp16(params)" in said
    assert "param_dtype" in said
    half = jax.tree.map(lambda p: p.astype(jnp.float16), params)  # the fix named
    fixed = preflight.preflight_step(forward, half, x)
    assert fixed.argument_bytes * 2 - x.nbytes == report.argument_bytes
    assert "read only as float16" not in fixed.advice


def test_jaxonloader_7_a_dataset_put_whole_on_the_device_by_its_loader_is_named():
    """Artur-Galstyan/jaxonloader#7, "Don't load data into GPU!": the loader converted the
    whole dataset with jnp.asarray when built and sliced batches from it on the device; the
    maintainer's fix keeps NumPy and moves each batch's rows as it is used. The trace names
    the conversion, its bytes and that fix; run: one batch on the device instead of all."""
    data = np.ones((4096, 1024), np.float32)  # 16 MiB

    class Loader:
        def __init__(self, data, on_device=True):
            self.data = jnp.asarray(data) if on_device else data

        def __iter__(self):
            for i in range(0, len(self.data), 64):
                yield jnp.asarray(self.data[i:i + 64])

    step = jax.jit(lambda w, x: w - 1e-3 * (x.T @ (x @ w)))

    def run(on_device):
        w = jnp.zeros((1024, 4))
        start = sum(memory.live_bytes_by_device().values())
        with transfers.trace() as log:
            loader = Loader(data, on_device)
            for n, batch in enumerate(loader):
                w = step(w, batch)
                if n == 3:
                    break
            held = sum(memory.live_bytes_by_device().values()) - start
            jax.block_until_ready(w)
        return log, held

    log, held = run(on_device=True)
    (row,) = [r for r in log.by_line() if "self.data = jnp.asarray(data)" in r["line"]]
    assert row["bytes"] == data.nbytes
    assert "keep it as NumPy and put each batch on the device as it is used" in " ".join(
        row["reasons"]) or jaxcompat.asarray_is_explicit()  # (0.8.0: a put, aliased)
    _, fixed = run(on_device=False)  # the fix named
    assert held >= data.nbytes and fixed < 2**20


def test_jax_6997_params_closed_over_are_baked_into_each_batch_size_s_program():
    """jax-ml/jax#6997: do a jitted function's 1 GB of params get copied for each batch size it
    compiles for? Passed as an argument, no: the programs hold none. Closed over, each program
    holds its own copy (host memory up to 3 times their bytes per program, measured in a
    miniature: see compiles' _constants_again). The kit names the copies and the fix; run: the
    fixed programs hold no constants."""
    params = jax.random.normal(jax.random.key(0), (512, 4096))  # 8 MiB (not a splat XLA folds)

    closed = jax.jit(lambda x: jnp.tanh(x @ params).sum())
    passed = jax.jit(lambda p, x: jnp.tanh(x @ p).sum())
    with compiles.watch() as log:
        for b in (2, 4, 8):
            closed(jnp.ones((b, 512)))
    with compiles.watch() as fixed:
        for b in (2, 4, 8):
            passed(params, jnp.ones((b, 512)))
    said = log.diagnosis
    assert "bakes in 8.00 MiB of arrays `<lambda>` closes over as constants" in said
    assert "up to 3 times its constants' bytes" in said and "pass them as arguments" in said
    assert "closes over as constants" not in fixed.diagnosis
    assert fixed.function("<lambda>").compiles == 3  # a program per batch size still


def test_jax_3412_a_snapshot_that_shares_the_donated_buffers_is_named_with_a_real_copy():
    """jax-ml/jax#3412: a copy taken before a donating call was deleted by it (jnp.array's copy
    did not copy then). Today `best = params` and jnp.asarray(p) are still the same buffer.
    tree_placement said only "use the outputs of the call", which are the updated parameters,
    not the snapshot; it now names the shared buffers and jnp.copy, run."""
    step = jax.jit(lambda p: jax.tree.map(lambda a: a * 0.8, p), donate_argnums=0)
    for snapshot in (lambda p: p, lambda p: jax.tree.map(jnp.asarray, p)):
        params = {"w": jnp.full((256, 256), 5.0)}
        best = snapshot(params)
        params = step(params)
        (said,) = devices.tree_placement(best).problems
        assert "is deleted (donated to a jit" in said and "jax-ml/jax#3412" in said
        assert "jax.tree.map(jnp.copy, params) before the donating call" in said
    params = {"w": jnp.full((256, 256), 5.0)}
    best = jax.tree.map(jnp.copy, params)  # the fix named
    params = step(params)
    assert devices.tree_placement(best).problems == ()
    assert float(best["w"].sum()) == 5.0 * 256 * 256


def test_jax_9237_a_donated_batch_no_output_takes_is_named_with_leaving_it_out():
    """jax-ml/jax#9237: "Some donated buffers were not usable" for a batch donated with the
    state. The kit named why (no output of its shape or size) and not the fix, which a new
    user ran: donate the state alone, the warning gone and XLA's aliased bytes the same."""
    def train_step(params, images):
        return params - 1e-3 * jnp.mean(images) * params

    params, images = jnp.ones((64, 64)), jnp.ones((185, 16, 16, 3))
    both = preflight.preflight_step(train_step, params, images, donate_argnums=(0, 1))
    assert "NOT reused: no output is a float32[185, 16, 16, 3]" in str(both)
    assert "leave it out of donate_argnums" in str(both) and "jax-ml/jax#9237" in str(both)
    state = preflight.preflight_step(train_step, params, images, donate_argnums=0)  # the fix
    assert state.alias_bytes == both.alias_bytes == params.nbytes
    assert "leave it out of donate_argnums" not in str(state)


def test_crazyflow_110_jax_12627_a_donated_leaf_passed_again_will_fail_and_a_copy_runs():
    """learnsyslab/crazyflow#110: a simulation state whose leaves alias each other (pos_prev
    made as pos, or jnp.asarray(pos)) cannot be donated; jax-ml/jax#12627: a target network
    set to the donated params. The kit says "will fail", names both places and a copy; run:
    JAX raises, and with jnp.copy the step runs."""
    def sim_step(data):
        pos = 2 * data["pos"] - data["pos_prev"]
        return {"pos": pos, "pos_prev": data["pos"]}

    pos = jnp.zeros((1024, 3))
    step = jax.jit(sim_step, donate_argnums=0)
    for aliased in ({"pos": pos, "pos_prev": pos}, {"pos": pos, "pos_prev": jnp.asarray(pos)}):
        said = str(preflight.preflight_step(sim_step, aliased, donate_argnums=0))
        assert "WILL FAIL" in said.upper() and "argument 0['pos']" in said
        assert "jnp.copy" in said
        with pytest.raises(Exception, match="donate the same buffer twice|donated"):
            jax.block_until_ready(step(aliased))
    fixed = {"pos": pos, "pos_prev": jnp.copy(pos)}  # the fix named
    assert "WILL FAIL" not in str(preflight.preflight_step(sim_step, fixed,
                                                           donate_argnums=0)).upper()
    jax.block_until_ready(step(fixed))

    def update(state, target):  # jax#12627: the target kept is the donated params
        return {"w": state["w"] - 1e-3 * (state["w"] - target["w"])}

    state = {"w": jnp.ones((512, 512))}
    said = str(preflight.preflight_step(update, state, {"w": state["w"]}, donate_argnums=0))
    assert "WILL FAIL" in said.upper() and "argument 1['w']" in said and "jnp.copy" in said


def test_flashbax_6_a_replay_buffer_add_not_donated_copies_the_whole_buffer():
    """instadeepai/flashbax#6: jit(buffer.add) doubled CPU memory at each call; donation (which
    the CPU honours now) is the fix. The kit names the state not donated and the slice written
    into a copy of the whole buffer; run with the donation: the output takes the buffer."""
    def add(state, batch):
        i = state["i"]
        return {"data": jax.lax.dynamic_update_slice(state["data"], batch, (i, 0)), "i": i + 1}

    state = {"data": jnp.zeros((8192, 1024)), "i": jnp.int32(0)}  # 32 MiB
    batch = jnp.ones((1, 1024))
    said = str(preflight.preflight_step(add, state, batch))
    assert "Nothing donated for state" in said and "copies all 32.00 MiB of it first" in said
    donated = preflight.preflight_step(add, state, batch, donate_argnums=0)
    assert donated.alias_bytes >= state["data"].nbytes  # the fix named: written in place
    before = state["data"].unsafe_buffer_pointer()
    out = jax.jit(add, donate_argnums=0)(state, batch)
    assert out["data"].unsafe_buffer_pointer() == before


def test_aimz_268_a_stack_of_per_step_loss_scalars_is_named_with_device_get():
    """markean/aimz#268: each step's loss kept as a device scalar in a list, then made an
    array. `holders` named the list; a new user's `jnp.stack` of 5,000 of them compiled for 6 s
    and `compiles.watch` advised a persistent cache, where the cause is one operand per scalar.
    It names that now (jax 0.10 on: 0.8.0 joins them in pieces), and the fix compiles nothing."""
    loss = jax.jit(lambda x: (x * 2).sum())
    losses = [loss(jnp.full(4, float(i))) for i in range(1200)]
    with compiles.watch() as log:
        history = jnp.stack(losses)
    if log.functions and log.functions[0].changed == ("stack ×1",):  # one program for all
        assert log.many_operands == (("stack", 1200),)
        said = log.diagnosis
        assert "compiled a program of 1,200 arguments" in said and "markean/aimz#268" in said
        assert "np.stack(jax.device_get(xs))" in said and "jax_compilation_cache_dir" not in said
    with compiles.watch() as fixed:  # the fix named
        kept = np.stack(jax.device_get(losses))
    assert fixed.compiles == 0 and fixed.many_operands == ()
    np.testing.assert_array_equal(kept, np.asarray(history))


_DSPS_108 = """
import jax, jax.numpy as jnp, numpy as np
TABLE = jnp.linspace(5.5, 10.35, 1000)  # a library's module-level table, made at its import
jax.config.update("jax_enable_x64", {late})
from helpers import preflight, settings

def weighted(x):
    return jnp.interp(x, TABLE, TABLE / 3.0)

x = jnp.linspace(6.0, 10.0, 7, dtype=jnp.float64)
err = np.max(np.abs(np.asarray(weighted(x)) - np.asarray(x) / 3.0) / (np.asarray(x) / 3.0))
print("table", TABLE.dtype, "error %.1e" % err)
print("ADVICE", preflight.preflight_step(weighted, x).advice)
"""


def test_dsps_108_x64_turned_on_after_a_library_made_its_arrays_is_named():
    """ArgonneCPAC/dsps#108: jax_enable_x64 set below the library's import; its module-level
    arrays stayed float32 inside a float64 computation. The kit said "no known mistake" and
    nothing in preflight_step (a new user's trial); its x64 fix, a config update, changed
    nothing for arrays already made. preflight_step now names the float32 array widened in
    the float64 program, and the fix, run: x64 on first (a fresh process each)."""
    from tests.conftest import run_python

    env = {"JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": None}
    late = run_python(_DSPS_108.format(late=True), env=env)
    assert late.returncode == 0, late.stderr[-2000:]
    assert "table float32" in late.stdout
    advice = late.stdout.split("ADVICE", 1)[1]
    assert "1 closed-over float32 array (float32[1000]) is widened to float64" in advice
    assert "ArgonneCPAC/dsps#108" in advice and "right after `import jax`" in advice
    assert "Arrays made before jax_enable_x64 was turned on are float32" in advice  # (a guess:
    # helpers came after the table, so the kit did not see x64 off at the start)
    first = _DSPS_108.format(late=True).replace(
        'jnp.linspace(5.5, 10.35, 1000)  #', 'jnp.linspace(5.5, 10.35, 1000) if jax.config.update('
        '"jax_enable_x64", True) is None else None  #')
    fixed = run_python(first, env=env)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "table float64" in fixed.stdout and "narrower float" not in fixed.stdout
    errors_ = [float(out.stdout.split("error ")[1].split()[0]) for out in (late, fixed)]
    assert errors_[0] > 1e-9 > 1e-12 > errors_[1]
    assert not jax.config.jax_enable_x64  # here: the variable set after JAX read it
    (w,) = [w for w in settings.check_environment({"JAX_ENABLE_X64": "1"})
            if w.code == "x64-set-after-import"]
    assert "call it before importing such a library" in w.fix
    # helpers imported first: where JAX has the backend-start hook, the kit saw x64 off then
    early = run_python(_DSPS_108.format(late=True).replace(
        "TABLE =", "from helpers import preflight\nTABLE ="), env=env)
    assert early.returncode == 0, early.stderr[-2000:]
    seen = "first JAX backend started with x64 off" in early.stdout
    assert seen == jaxcompat.INTERNALS["register_backend_initialization_hook"].expected(
        jaxcompat.jax_version_tuple())  # (a JAX with the hook)
    assert "1 closed-over float32 array (float32[1000])" in early.stdout


_X64_FROM_START = """
import jax, jax.numpy as jnp, numpy as np
from helpers import preflight
from helpers._internal import jaxpr_values
F32 = jnp.linspace(5.5, 10.35, 1000, dtype=jnp.float32)  # float32 on purpose
NP32 = np.linspace(5.5, 10.35, 1000, dtype=np.float32)  # a NumPy constant
F16 = jnp.linspace(5.5, 10.35, 1000, dtype=jnp.float16)  # x64 makes no float16

def f(x):
    return jnp.interp(x, F32, F32 / 3.0) + (x[:, None] * NP32).sum(1) + (x[:, None] * F16).sum(1)

x = jnp.linspace(6.0, 10.0, 7)
print("LISTED", [k for k, _, _ in jaxpr_values.narrow_constants_widened(jax.jit(f).trace(x).jaxpr)])
print("ADVICE", preflight.preflight_step(f, x).advice)
"""


def test_dsps_108_float32_arrays_made_with_x64_on_from_the_start_are_not_named():
    """A review of dsps#108's note: with x64 on from the start it named a jnp.float32 table
    made so on purpose, a NumPy float32 constant and a float16 one, "made before x64 was on",
    which none of them was. Only float32 jax.Arrays are listed now, and none where x64 was on
    when JAX started (the backend-start hook saw it; before jax 0.10.2, JAX_ENABLE_X64 at
    import says it)."""
    from tests.conftest import run_python

    out = run_python(_X64_FROM_START, env={"JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LISTED ['float32[1000]']" in out.stdout  # not the NumPy one, nor float16
    assert "widened to float64" not in out.stdout.split("ADVICE", 1)[1]


def test_pysages_82_replicas_on_one_gpu_each_preallocating_are_named_with_the_fix():
    """SSAGESLabs/PySAGES#82: several replicas, each a JAX process on one GPU, each taking
    75% at its first allocation: the second runs out. Fix (PySAGES#83): PREALLOCATE=false. A
    new user's trial found it named; the budget is the kit's model of XLA's pool (jaxlib's
    options, as the H100 record measured for two default processes), asked of a card that is
    not here: nothing ran on a GPU. The CUDA contexts are said to be left out."""
    from helpers import allocation

    def step(x, w):
        return jnp.tanh(x @ w) @ w.T

    x = jax.ShapeDtypeStruct((300_000, 4096), jnp.float32)  # 4.58 GiB; about 14 GiB at peak
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
    two = allocation.target("A100 40GB", processes=2)
    assert two.budget_bytes == 10 * 2**30
    assert "set XLA_PYTHON_CLIENT_PREALLOCATE=false" in two.note and "below 0.50" in two.note
    assert "CUDA context" in two.note
    assert preflight.preflight_step(step, x, w, target=two).verdict == "will not fit"
    fixed = allocation.target("A100 40GB", processes=2, preallocate=False)
    assert preflight.preflight_step(step, x, w, target=fixed).verdict == "fits"


def test_keras_20005_log_probabilities_made_whole_to_take_one_per_row_are_named():
    """keras-team/keras#20005: a sparse cross-entropy over many classes took several times the
    logits' memory (the labels one-hot encoded; the fix computes from the integer labels). On
    jax 0.10.2's CPU the one-hot fuses away and jax.nn.log_softmax's whole output is the cost,
    with take_along_axis as well (32 MiB of temporaries both); logsumexp minus the label's
    logit makes none. The kit said nothing (a new user's trial); it now names the
    log-probabilities and that fix, run here: the same loss, forward and gradient. Soft labels
    read every log-probability: no note."""
    v = 8192
    x = jnp.linspace(-3.0, 3.0, 4 * 256 * v).reshape(4, 256, v)  # 32 MiB of logits
    y = (jnp.arange(4 * 256) * 7 % v).reshape(4, 256)

    def one_hot(x, y):
        return -jnp.mean(jnp.sum(jax.nn.one_hot(y, v) * jax.nn.log_softmax(x, -1), -1))

    def taken(x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x, -1), y[..., None], -1))

    def fixed(x, y):
        return jnp.mean(jax.nn.logsumexp(x, -1) - jnp.take_along_axis(x, y[..., None], -1)[..., 0])

    def temp(f):
        return jax.jit(f).lower(x, y).compile().memory_analysis().temp_size_in_bytes

    from helpers._internal.jaxcompat import jax_version_tuple

    # the kit compiles both ways for the shape and names the fix only where XLA plans a
    # quarter or less for it: jax 0.10.2 and 0.12.0.1, not 0.8.0 (33 MiB both ways)
    helps = temp(fixed) * 4 <= temp(taken)
    assert helps == (jax_version_tuple() >= (0, 10))
    named = 0
    for f, how in ((one_hot, "a one-hot"), (taken, "take_along_axis")):
        for step in (f, jax.grad(f)):
            advice = preflight.preflight_step(step, x, y).advice
            said = "jax.nn.log_softmax makes the whole log-probabilities, float32[4, 256, 8192]" \
                in advice and f"(through {how})" in advice and "keras-team/keras#20005" in advice
            # and where XLA's plan holds them
            assert said == (helps and 2 * temp(step) >= 32 * 2**20)
            named += said
        if helps:
            assert temp(fixed) * 100 <= temp(f)
    assert named == (4 if helps else 0)
    np.testing.assert_allclose(fixed(x, y), one_hot(x, y), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(fixed)(x, y), jax.grad(taken)(x, y), atol=1e-9)
    soft = jax.nn.softmax(x[..., ::-1], -1)
    advice = preflight.preflight_step(
        lambda x, p: -jnp.mean(jnp.sum(p * jax.nn.log_softmax(x, -1), -1)), x, soft).advice
    assert "log-probabilities" not in advice
    # over another axis, or several values per row: the fix named would not fit (a review: for
    # axis=1 it raised a broadcasting error), so neither is listed
    from helpers._internal import jaxpr_values

    def by_axis_1(x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x, axis=1), y[:, None, :], 1))

    def five_per_row(x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x, -1), y, -1))

    for f, args in ((by_axis_1, (x, jnp.zeros((4, v), jnp.int32))),
                    (five_per_row, (x, jnp.stack([y] * 5, -1))), (taken, (x, y))):
        listed = jaxpr_values.picked_log_probabilities(jax.jit(jax.grad(f)).trace(*args).jaxpr)
        assert bool(listed) == (f is taken)


def test_jax_14619_a_pytree_rebuilt_through_init_gets_a_clear_error_and_the_fix():
    """jax-ml/jax#14619: a registered class whose unflatten calls __init__, which transforms
    its input (theta // 2): jit changes the answer. preflight_step crashed with a TypeError
    from inside the kit's stand-ins (a new user's trial); it now raises BadInputError naming
    the unflatten and the fix from JAX's docs, run here: the same answer with and without jit,
    and preflight_step sizes it."""
    class A:
        def __init__(self, theta):
            self.theta = theta // 2

    jax.tree_util.register_pytree_node(A, lambda a: ((a.theta,), None), lambda _, ch: A(*ch))

    def solve(a):
        return a.theta * 1.0

    a = A(jnp.float32(4.0))
    assert float(solve(a)) == 2.0 and float(jax.jit(solve)(a)) == 1.0  # the thread's bug
    with pytest.raises(errors.BadInputError, match="object.__new__") as e:
        preflight.preflight_step(solve, a)
    assert "jax-ml/jax#14619" in str(e.value) and isinstance(e.value, ValueError)

    class B(A):
        pass

    def unflatten(_, ch):
        b = object.__new__(B)
        b.theta = ch[0]
        return b

    jax.tree_util.register_pytree_node(B, lambda b: ((b.theta,), None), unflatten)
    b = B(jnp.float32(4.0))
    assert float(solve(b)) == float(jax.jit(solve)(b)) == 2.0  # the fix named
    assert preflight.preflight_step(solve, b).verdict == "fits"


def test_equinox_704_a_static_offset_that_starts_a_fixed_slice_is_traced_with_dynamic_slice():
    """patrick-kidger/equinox#704: a KV-cached decode step whose position is a Python int,
    static, compiled at every token. The kit said the int "sets a shape" and advised rounding
    it up to powers of two, which changed the outputs (a new user's trial: max |diff| 0.73):
    COS[offset:offset + 1] is one row wherever it starts. It now says so, and the thread's fix
    (offset traced, jax.lax.dynamic_slice_in_dim) compiles once with the same outputs."""
    cos = jnp.cos(jnp.arange(64.0)[:, None] * jnp.linspace(0.1, 1.0, 16)[None])

    @functools.partial(jax.jit, static_argnames="offset")
    def decode(cache, q, offset):
        c = cos[offset:offset + 1]
        cache = cache.at[offset].set(q[0] * c[0])
        return cache, (cache * c).sum(-1)

    @jax.jit
    def fixed(cache, q, offset):
        c = jax.lax.dynamic_slice_in_dim(cos, offset, 1)
        cache = jax.lax.dynamic_update_slice_in_dim(cache, q * c, offset, 0)
        return cache, (cache * c).sum(-1)

    def run(step, as_offset):
        cache, outs = jnp.zeros((64, 16)), []
        for pos in range(6):
            cache, out = step(cache, jnp.full((1, 16), pos + 1.0), as_offset(pos))
            outs.append(out)
        return jnp.stack(outs)

    with compiles.watch() as log:
        before = run(decode, int)
    entry = log.function("decode")
    assert entry.compiles == 6
    assert entry.fix.startswith("`offset` sets where a slice of fixed length starts")
    assert "jax.lax.dynamic_slice_in_dim(x, offset, length, axis=" in entry.fix
    assert "wherever the whole window fits" in entry.fix
    assert "patrick-kidger/equinox#704" in entry.fix and "powers of two" not in entry.fix
    with compiles.watch() as log:
        after = run(fixed, jnp.int32)
    assert log.function("fixed").compiles == 1
    np.testing.assert_array_equal(after, before)


def test_dejax_2_a_buffer_copied_whole_at_each_insert_is_told_to_donate():
    """hr0nix/dejax#2: each insert into a replay buffer rewrote the whole buffer; the
    maintainer's fix donates the buffer state. A new user's trial found it named: the step
    copies the storage to write one row, and donated the peak drops by the storage."""
    n, d = 65536, 64  # 16 MiB of storage

    def add(buf, item):
        return {"storage": buf["storage"].at[buf["ptr"]].set(item), "ptr": (buf["ptr"] + 1) % n}

    buf, item = {"storage": jnp.zeros((n, d)), "ptr": jnp.int32(0)}, jnp.ones(d)
    p = preflight.preflight_step(add, buf, item)
    assert "Nothing donated for buf" in p.advice and "Donating buf" in p.advice
    donated = preflight.preflight_step(add, buf, item, donate_argnums=0)
    assert p.peak_bytes - donated.peak_bytes >= n * d * 4


def test_jax_9023_a_static_self_hashed_by_identity_is_named_and_the_bound_method_sized():
    """jax-ml/jax#9023: a method jitted with self static gave the old result after self.fn was
    reassigned: the object hashes by identity, so jit reuses its first trace, and JAX logs
    nothing. A new user's trial: compiles.watch saw one compile and preflight_step(t.wrapper,
    x) blamed the array ("Non-hashable static arguments", as JAX's own t.wrapper.lower(x)
    does). preflight_step now takes the bound method as jit calls it, and names the static
    object and the fix; a function passed static instead gives the new result. A pytree
    object, or one with __hash__ of its own, gets no such note."""
    class Test:
        @functools.partial(jax.jit, static_argnums=(0,))
        def wrapper(self, x):
            return self.fn(x)

    t, x = Test(), jnp.ones(4)
    t.fn = lambda v: v + 1
    first = float(t.wrapper(x)[0])
    t.fn = lambda v: v + 2
    assert float(t.wrapper(x)[0]) == first == 2.0  # stale, as the thread reports
    p = preflight.preflight_step(t.wrapper, x)
    assert "self, a Test object, is a static argument" in p.advice
    assert "jax-ml/jax#9023" in p.advice and "a function static" in p.advice
    assert preflight.preflight_step(t.wrapper, x, donate_argnums=0).donated == (1,)  # x

    @functools.partial(jax.jit, static_argnums=0)
    def apply(fn, x):  # the fix named: the function passed static, a new one a new program
        return fn(x)

    assert float(apply(lambda v: v + 1, x)[0]) == 2.0 and float(apply(lambda v: v + 2, x)[0]) == 3.0

    @jax.tree_util.register_pytree_node_class
    class Tree:
        def __init__(self, w):
            self.w = w

        def tree_flatten(self):
            return (self.w,), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    class Hashed:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            return isinstance(other, Hashed)

    assert "is a static argument" not in preflight.preflight_step(
        lambda t, x: t.w * x, Tree(jnp.ones(4)), x).advice
    assert "is a static argument" not in preflight.preflight_step(
        lambda h, x: x * 2, Hashed(), x, static_argnums=0).advice


def test_jax_7621_a_jitted_function_transformed_from_outside_is_told_to_jit_the_transform():
    """jax-ml/jax#7621: jax.hessian(jf)(x) in a loop, jf = jax.jit(f). JAX's fix (#7626)
    stopped the endless recompiles; the first calls still compile the jitted function once per
    transformation around it. The kit said its shapes "changed at every call" and that it was
    "made anew", advising padding (a new user's trial): x never changed, jf was made once. It
    now names the transformation from outside jit, and the fix, run: jax.jit(jax.hessian(f))
    compiles one program."""
    def f(x):
        return jnp.square(x).mean()

    jf = jax.jit(f)
    x = jnp.ones((8, 4))
    with compiles.watch() as log:
        for _ in range(3):
            hessian = jax.hessian(jf)(x)
    entry = log.function("f")
    if entry.compiles >= 2:  # jax 0.10.2 and 0.12.0.1 (0.8.0 compiled f once here)
        assert entry.fix.startswith("the call at test_user_reports.py:") and \
            "jax.jit(jax.hessian(f))" in entry.fix and "jax-ml/jax#7621" in entry.fix
        assert "Pad or bucket" not in entry.fix and "made anew here" not in entry.fix
    jitted = jax.jit(jax.hessian(f))
    with compiles.watch() as log:
        for _ in range(3):
            once = jitted(x)
    assert log.compiles == 1
    np.testing.assert_allclose(once, hessian, rtol=1e-6)


def test_dsps_108_a_closed_over_typed_key_is_no_float_to_widen():
    """The x64 note's reader of closed-over arrays took np.dtype of each, which raises for a
    typed PRNG key (key<fry>): preflight_step crashed on a step closing over a key (the full
    suite caught it). A key is read past; a float32 table beside it still is listed."""
    from helpers._internal import jaxpr_values

    key, table = jax.random.key(0), jnp.linspace(0.0, 1.0, 1000, dtype=jnp.float32)
    p = preflight.preflight_step(lambda: jax.random.normal(key, (1024,)))
    assert p.verdict == "fits"
    closed = jax.jit(lambda x: x * table + jax.random.normal(key, (1000,))).trace(
        jnp.ones(1000)).jaxpr
    assert jaxpr_values.narrow_constants_widened(closed) == ()  # no float64 here: nothing


def test_maxdiffusion_484_restored_moments_go_on_their_parameters_sharding_not_replicated():
    """AI-Hypercomputer/maxdiffusion#484: a restored optimizer state "had no device sharding
    applied" (the PR put it on the trainer's state shardings). Uncommitted Adam moments beside
    the split parameters they mirror were told "replicated: NamedSharding(mesh, P())" (a
    trial): 4x a split moment's bytes on each of 4 devices, which the kit then called "as
    data parallelism places them". Now each goes on its like's sharding, the count alone
    replicated; committed to one device, the same."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4,), ("fsdp",))
    split = NamedSharding(mesh, P("fsdp"))
    params = {"w1": jax.device_put(jnp.ones((256, 64)), split),
              "w2": jax.device_put(jnp.ones((256, 64)), split)}
    saved = {"count": np.zeros((), np.int32),
             "mu": {k: np.zeros((256, 64), np.float32) for k in params},
             "nu": {k: np.zeros((256, 64), np.float32) for k in params}}
    restored = {"params": params, "opt_state": jax.tree.map(jnp.asarray, saved)}
    (problem,) = devices.tree_placement(restored).problems
    assert "4 leaves (['opt_state']['mu']['w1']" in problem and "maxdiffusion#484" in problem
    assert "jax.device_put(leaf, other.sharding)" in problem and "step counter" in problem
    committed = {"params": params, "opt_state": jax.device_put(saved, jax.devices()[0])}
    (apart,) = devices.tree_placement(committed).problems
    assert "incompatible devices" in apart and "jax.device_put(leaf, other.sharding)" in apart
    # the fix, run: each moment on its parameter's sharding, the count replicated
    fixed = {"params": params, "opt_state": {
        "count": jax.device_put(saved["count"], NamedSharding(mesh, P())),
        "mu": jax.tree.map(lambda s, p: jax.device_put(s, p.sharding), saved["mu"], params),
        "nu": jax.tree.map(lambda s, p: jax.device_put(s, p.sharding), saved["nu"], params)}}
    assert devices.tree_placement(fixed).problems == ()
    half = {"params": params, "opt_state": {  # moments kept in bfloat16 (a review)
        "count": jnp.zeros((), jnp.int32),
        "mu": {k: jnp.zeros((256, 64), jnp.bfloat16) for k in params}}}
    (low,) = devices.tree_placement(half).problems
    assert "2 leaves (['opt_state']['mu']['w1'], ['opt_state']['mu']['w2'])" in low
    mu = fixed["opt_state"]["mu"]["w1"]
    assert mu.addressable_shards[0].data.nbytes == mu.nbytes // 4  # a quarter on each device


def test_jax_8499_a_bfloat16_array_np_save_wrote_comes_back_as_bytes_and_jnp_load_reads_it(
        tmp_path):
    """jax-ml/jax#8499 (discussion #8494): bfloat16 parameters saved with np.save came back
    from np.load as |V2, which JAX refuses; the PR taught jnp.load to read them back. The
    kit's note was worded for np.frombuffer and a safetensors header (a trial); it names
    np.save and jnp.load now. The fix it names, run: the same values."""
    import ml_dtypes

    w = (np.arange(16, dtype=np.float32) / 4).astype(ml_dtypes.bfloat16)
    path = tmp_path / "w.npy"
    np.save(path, w)
    back = np.load(path)
    assert back.dtype.kind == "V" and back.dtype.itemsize == 2 and back.dtype.names is None
    said = devices.placement(back).explanation
    assert "np.load of a bfloat16 array that np.save wrote" in said
    assert "jnp.load reads it back as bfloat16" in said and "jax-ml/jax#8499" in said
    loaded = jnp.load(path)
    assert loaded.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(loaded), w)
