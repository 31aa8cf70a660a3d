import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import devices, render
from helpers._internal.jaxcompat import device_name
from tests.conftest import N_SIMULATED, run_python


@pytest.fixture(scope="module")
def rep():
    return devices.probe()


def test_probe_lists_cpu_backend_with_simulated_devices(rep):
    assert "cpu" in rep.backend_names
    cpu = rep.backend("cpu")
    assert [d.id for d in cpu.devices] == list(range(N_SIMULATED))
    assert all(d.platform == "cpu" and d.process_index == 0 for d in cpu.devices)
    assert "device" in cpu.devices[0].memory_kinds
    assert cpu.is_default and rep.default_backend == "cpu"


def test_default_device_is_first_device_of_default_backend(rep):
    assert rep.default_device == device_name(jax.devices()[0]) == "cpu:0"
    assert rep.default_device_source == "first device of the default backend"


def test_probe_honours_default_device_context():
    target = jax.devices("cpu")[2]
    with jax.default_device(target):
        inside = devices.probe()
    assert inside.default_device == "cpu:2"
    assert "jax_default_device is set" in inside.default_device_source
    assert devices.probe().default_device == "cpu:0"


def test_cpu_memory_stats_use_the_sentinel(rep):
    stats = rep.backend("cpu").devices[0].memory_stats
    assert stats is devices.NOT_AVAILABLE
    assert not stats and str(stats) == "not available"
    assert rep.to_dict()["backends"][0]["devices"][0]["memory_stats"] is None


def test_versions_and_environment(rep):
    assert rep.versions["jax"] == jax.__version__
    assert set(rep.versions) >= {"python", "jax", "jaxlib", "numpy", "safetensors"}
    names = {e.name for e in rep.environment}
    assert {"JAX_PLATFORMS", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
            "CUDA_VISIBLE_DEVICES", "XLA_FLAGS"} <= names


def test_report_is_frozen(rep):
    with pytest.raises(AttributeError):
        rep.default_backend = "gpu"


def test_json_round_trip_and_stable_keys(rep):
    data = json.loads(rep.to_json())
    assert list(data) == ["schema", "default_backend", "default_device", "default_device_source",
                          "platforms_requested", "backends", "failed_backends", "environment",
                          "warnings", "versions", "plugins", "jax_environment_info", "processes"]
    again = devices.DeviceReport.from_dict(data)
    assert again.to_dict() == data


def test_from_dict_rejects_other_json():
    with pytest.raises(ValueError, match="not a doctor report"):
        devices.DeviceReport.from_dict({"schema": "something/else"})


def test_html_is_deterministic_and_escaped(rep):
    a, b = rep._repr_html_(), devices.probe()._repr_html_()
    assert a == b
    assert "<script" not in a and not re.search(r'id="', a)
    assert "cpu:3" in a and "not available" in a


def test_text_names_backends_and_warnings(rep):
    text = str(rep)
    assert "default backend: cpu" in text and "cpu:0" in text
    assert "Warnings" in text


def test_backend_lookup_error_names_known_backends(rep):
    with pytest.raises(KeyError, match="backends: cpu"):
        rep.backend("cuda")


# --- children: settings JAX reads only at start --------------------------------------------
def test_one_device_in_a_child():
    r = devices.probe_in_child({"JAX_NUM_CPU_DEVICES": "1", "JAX_PLATFORMS": "cpu"})
    assert [d.id for d in r.backend("cpu").devices] == [0]
    assert r.platforms_requested == "cpu"


def test_requested_cuda_without_gpu_is_reported_not_raised():
    r = devices.probe_in_child({"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": ""})
    assert r.backends == () and r.default_backend is None
    failed = {f.name: f for f in r.failed_backends}
    assert "cuda" in failed
    assert "JAX_PLATFORMS" in failed["cuda"].hint
    assert "no-visible-gpu" in {w.code for w in r.warnings}


def test_unknown_platform_is_named():
    r = devices.probe_in_child({"JAX_PLATFORMS": "bogus"})
    failed = {f.name: f for f in r.failed_backends}
    assert "bogus" in failed and "bogus" in failed["bogus"].error
    assert "known" in failed["bogus"].hint


def test_probe_in_child_reports_child_failure():
    with pytest.raises(RuntimeError, match="the child doctor: the child process exited"):
        devices.probe_in_child({"PYTHONPATH": "/nonexistent", "PYTHONSAFEPATH": "1",
                                "PYTHONNOUSERSITE": "1", "JAX_PLATFORMS": "cpu",
                                "PYTHONHOME": "/nonexistent"}, timeout=60)


# --- roles and simulated devices -----------------------------------------------------------
def test_roles_stand_in_on_cpu():
    r = devices.roles()
    assert r.stand_in
    assert r.accelerator == jax.devices()[0] and r.host == jax.devices("cpu")[1]
    assert "STAND-IN" in r.describe()


def test_simulate_cpu_devices_after_start():
    assert devices.simulate_cpu_devices(2) == N_SIMULATED  # enough already: no-op
    with pytest.raises(devices.JaxAlreadyStartedError, match="Restart the kernel"):
        devices.simulate_cpu_devices(N_SIMULATED + 4)
    assert len(jax.devices()) == N_SIMULATED  # nothing lost
    with pytest.raises(ValueError):
        devices.simulate_cpu_devices(0)


def test_roles_with_one_cpu_device_says_how_to_fix():
    proc = run_python(
        "import jax; from helpers import devices\n"
        "try:\n    devices.roles()\n"
        "except devices.JaxAlreadyStartedError as e:\n    print('RAISED', e)\n",
        env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "RAISED" in proc.stdout and "simulate_cpu_devices" in proc.stdout


def test_simulate_cpu_devices_before_start_in_child():
    proc = run_python("from helpers import devices; n = devices.simulate_cpu_devices(3)\n"
                      "import jax; print(n, len(jax.devices('cpu')))",
                      env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": None})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", "3"]


# --- placement -----------------------------------------------------------------------------
def test_placement_uncommitted():
    p = devices.placement(jnp.arange(8, dtype=jnp.uint16))
    assert p.committed is False and p.devices == ("cpu:0",) and p.nbytes == 16
    assert p.memory_kind == "device"
    assert p.explanation.startswith("uncommitted") and "will move it there" in p.explanation


def test_placement_committed():
    x = jax.device_put(np.ones((2, 3), np.float32), jax.devices()[3])
    p = devices.placement(x)
    assert p.committed is True and p.devices == ("cpu:3",) and p.nbytes == 24
    assert p.explanation.startswith("committed to cpu:3")


def test_placement_under_default_device_context_is_uncommitted_on_that_device():
    with jax.default_device(jax.devices()[1]):
        x = jnp.zeros(4)
    p = devices.placement(x)
    assert p.devices == ("cpu:1",) and p.committed is False


def test_placement_sharded_over_several_devices():
    mesh = jax.make_mesh((N_SIMULATED,), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    x = jax.device_put(np.arange(8.0), sharding)
    p = devices.placement(x)
    assert len(p.devices) == N_SIMULATED and f"{N_SIMULATED} devices" in p.explanation


def test_placement_numpy():
    p = devices.placement(np.zeros(10, np.uint16))
    assert p.kind == "numpy.ndarray" and p.committed is None and p.devices == ()
    assert "every time" in p.explanation and "cpu:0" in p.explanation


def test_placement_renders():
    p = devices.placement(jnp.ones(3))
    assert "uncommitted" in str(p) and "<table>" in p._repr_html_()
    assert render.placement_html(p) == render.placement_html(p)


def test_placement_bad_inputs():
    with pytest.raises(TypeError, match="got list"):
        devices.placement([1, 2, 3])
    x = jnp.ones(3)
    x.delete()
    with pytest.raises(ValueError, match="deleted"):
        devices.placement(x)


def test_an_uncommitted_array_off_the_default_device_is_said_to_be_copied_by_any_operation():
    """An array made under jax.default_device(cpu:1), used after the block: the copy that
    gilesthomas.com's "JAX: commitment issues" ran into (reproduced here)."""
    import jax.numpy as jnp

    from helpers import transfers

    cpu0, cpu1 = jax.devices()[:2]
    with jax.default_device(cpu1):
        array = jnp.ones((256, 64))
    assert not array.committed and array.devices() == {cpu1}
    meaning = devices.placement(array).explanation
    assert "not the default device now (cpu:0)" in meaning and "copies it whole" in meaning
    with transfers.trace() as log:
        first = array[0].block_until_ready()  # outside the block: JAX moves it first
    assert first.devices() == {cpu0} and log.count("device->device") >= 1
    with jax.default_device(cpu1):  # inside the block it is where it belongs
        assert "not the default device" not in devices.placement(array).explanation


def test_transformers_17863_the_last_short_batch_is_padded_to_the_full_batch_for_one_compile():
    """transformers#17863: 1002 examples in batches of 64 leave a last batch of 42, which 4
    devices do not divide. The kit said "pad it to 44": that avoids the error, but 44 rows are
    a new shape and the step compiles again; padded to 64 (and masked) it compiles once."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))
    data = np.ones((1002, 8), np.float32)
    with pytest.raises(Exception) as raised:
        jax.device_put(data[960:], rows)  # the last batch, 42 rows
    said = devices.sharding_error_fix(raised.value)
    assert "dimension 0 (42) is split into 4 pieces" in said
    assert "pad it to the full batch size and mask the padding" in said
    assert "compiles once (huggingface/transformers#17863)" in said
    assert "if you pad it to 44, the smallest multiple, the step compiles again" in said

    def epoch(pad_to):
        step = jax.jit(lambda x, m: (x.sum(1) * m).sum())
        seen = 0.0
        for start in range(0, 1002, 64):
            x = data[start:start + 64]
            m = np.ones(len(x), np.float32)
            if len(x) < 64:
                x = np.pad(x, ((0, pad_to - len(x)), (0, 0)))
                m = np.pad(m, (0, pad_to - len(m)))
            seen += float(step(jax.device_put(x, rows), jax.device_put(m, rows)))
        return step._cache_size(), seen

    assert epoch(64) == (1, 1002 * 8)  # the fix it names: one compile, every example counted
    assert epoch(44) == (2, 1002 * 8)  # the smallest multiple: a second compile


def test_an_at_update_whose_operand_and_updates_are_split_differently_gets_its_out_sharding():
    """A new user's trial of jax-ml/jax#23052's row update on jax 0.10.2, whose jax.make_mesh
    makes Explicit axes: `a.at[idx].set(vals)` raises "Use .at[...].set(out_sharding=)" and the
    kit said nothing. Now the operand's and the updates' specs are read from JAX's types and
    the operand's is offered as out_sharding, checked here: the update runs, split as the
    array was, with no collective in the program."""
    import re

    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 1), ("x", "y"))
    a = jax.device_put(jnp.zeros((64, 64)), NamedSharding(mesh, P("x", "y")))
    idx, vals = jnp.arange(0, 64, 3), jnp.ones((22, 64))
    try:
        jax.jit(lambda a, i, v: a.at[i].set(v))(a, idx, vals)
    except Exception as err:  # ShardingTypeError
        said = devices.sharding_error_fix(err)
    else:  # jax 0.8.0: make_mesh's axes are Auto and XLA chooses
        return
    assert said.startswith("on a mesh of Explicit axes the result of an .at[...] update takes "
                           "its sharding from its operands, and here they disagree: the array "
                           "updated is split P('x', 'y'), the updates P(None, 'y')"), said
    assert "x.at[i].set(v, out_sharding=P('x', 'y'))" in said and "AxisType.Auto" in said
    fixed = jax.jit(lambda a, i, v: a.at[i].set(v, out_sharding=P("x", "y")))
    with jax.set_mesh(mesh):
        out = fixed(a, idx, vals)
        text = fixed.lower(a, idx, vals).compile().as_text()
    assert out.sharding.spec == P("x", "y") and float(out.sum()) == 22 * 64
    assert not re.search(r"all-gather|all-reduce|all-to-all|collective-permute", text)


def test_sglang_jax_1286_shard_map_on_explicit_axes_does_not_move_its_inputs():
    """sgl-project/sglang-jax#1286: shard_map code that ran on jax 0.8 failed on 0.9, where
    jax.make_mesh makes Explicit axes and shard_map checks that an argument already has the
    sharding its in_spec names. The kit said nothing; now it names the cause and both fixes,
    checked here: the argument put on P('x') first, or a mesh of Auto axes."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import errors, oom

    mesh = jax.make_mesh((4,), ("x",))
    step = jax.jit(jax.shard_map(lambda v: v * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = jnp.ones((1024, 256))
    try:
        step(x)
    except ValueError as err:
        said = devices.sharding_error_fix(err)
        with pytest.raises(errors.BadInputError) as refused:
            oom.explain(err)
    else:  # jax 0.8.0: make_mesh's axes are Auto and shard_map moves the argument
        assert {s.data.shape for s in step(x).addressable_shards} == {(256, 256)}
        return
    assert "in_spec P('x', None) is not the sharding the argument float32[1024,256] has " \
           "(P(None, None))" in said and "sgl-project/sglang-jax#1286" in said
    assert "no longer moves its inputs" in said and "Explicit" in said
    assert "jax.device_put(x, NamedSharding(mesh, P('x', None)))" in said
    assert "jax.sharding.reshard" in said and "AxisType.Auto" in said
    assert "A sharding error: " + said in str(refused.value)
    for fixed in (jax.device_put(x, NamedSharding(mesh, P("x", None))),  # the fixes it names
                  jax.sharding.reshard(x, NamedSharding(mesh, P("x", None)))):
        assert {s.data.shape for s in step(fixed).addressable_shards} == {(256, 256)}
    auto = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    on_auto = jax.jit(jax.shard_map(lambda v: v * 2, mesh=auto, in_specs=P("x"),
                                    out_specs=P("x")))(x)
    assert {s.data.shape for s in on_auto.addressable_shards} == {(256, 256)}

    ran, out = _under_load_ext("step(x)", step=step, x=x)  # said under the traceback
    assert not ran and f"why this sharding failed: {said}" in out


def _under_load_ext(cell: str, **names) -> tuple[bool, str]:
    """(whether the cell succeeded, what it printed) for ``cell`` run in IPython with
    ``%load_ext helpers`` and ``names`` in its namespace; the shell unloaded and reset after."""
    from contextlib import redirect_stdout
    from io import StringIO

    IPython = pytest.importorskip("IPython")
    shell = IPython.core.interactiveshell.InteractiveShell.instance()
    shell.user_ns.update(names)
    shell.run_line_magic("load_ext", "helpers")
    try:
        with redirect_stdout(StringIO()) as out:
            r = shell.run_cell(cell)
    finally:
        shell.run_line_magic("unload_ext", "helpers")
        shell.reset()
    return r.success, out.getvalue()


def test_openpi_261_jit_s_incompatible_devices_names_the_committed_argument_and_the_fix():
    """Physical-Intelligence/openpi#261: "Received incompatible devices for jitted computation"
    from an image batch committed to device 0 beside parameters split over the mesh; the kit
    said nothing under the cell's traceback. It now names which argument sits where and the
    two fixes (the batch replicated on the mesh, or left uncommitted), each run here; two
    arguments committed to two single devices get their own sentence."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    kernel = jax.device_put(jnp.ones((8, 4), jnp.float32), NamedSharding(mesh, P(None, "fsdp")))
    host = np.ones((2, 8), np.float32)
    img = jax.device_put(host, jax.devices()[0])

    @jax.jit
    def embed(img, kernel):
        return img @ kernel

    with pytest.raises(ValueError, match="incompatible devices") as raised:
        embed(img, kernel)
    said = devices.sharding_error_fix(raised.value)
    assert "img (float32[2,8]) is committed to device 0 alone" in said
    assert "kernel (float32[8,4]) is split over devices [0, 1]" in said
    assert "jax.device_put(x, NamedSharding(mesh, P()))" in said and "uncommitted" in said
    want = host @ np.ones((8, 4), np.float32)
    for fixed in (jax.device_put(img, NamedSharding(mesh, P())), jnp.asarray(host)):
        np.testing.assert_array_equal(np.asarray(embed(fixed, kernel)), want)

    other = jax.device_put(np.ones((8, 4), np.float32), jax.devices()[1])
    with pytest.raises(ValueError, match="incompatible devices") as apart:
        embed(img, other)
    two = devices.sharding_error_fix(apart.value)
    assert "img (float32[2,8]) is on devices [0] and kernel (float32[8,4]) on devices [1]" in two
    np.testing.assert_array_equal(np.asarray(embed(jax.device_put(img, other.sharding), other)),
                                  want)
    assert devices.sharding_error_fix(ValueError("Received incompatible devices")) == ""

    ran, out = _under_load_ext("embed(img, kernel)", embed=embed, img=img, kernel=kernel)
    assert not ran and f"why this sharding failed: {said}" in out


def test_transformer_engine_2069_a_sharding_constraint_inside_shard_map_meets_manual_axes():
    """NVIDIA/TransformerEngine#2069: with_sharding_constraint inside shard_map, on a
    NamedSharding of the outer mesh, failed with "Axes mentioned in `manual_axis_type` (0.8:
    `vma`) field of ShapedArray should be of type `Manual`" (before 0.8: "contains a manual
    axes"). Inside shard_map its axes are Manual. The fixes it names, run here: delete the
    constraint, or a bare P(...) on the axes outside axis_names; a bare P naming a Manual axis
    is named too, not as a mesh of Explicit axes."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import errors, oom

    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jnp.ones((64, 32))
    both = P(("data", "tensor"), None)

    def run(constrain, spec=both, **kw):
        body = lambda v: constrain(v) * 2  # noqa: E731
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, **kw))(x)

    with pytest.raises(ValueError) as raised:  # the thread's step, in miniature
        run(lambda v: jax.lax.with_sharding_constraint(
            v, NamedSharding(mesh, P(("data", "tensor"), None))))
    said = devices.sharding_error_fix(raised.value)
    assert "inside shard_map the mesh axes it splits over" in said and "are Manual" in said
    assert "a sharding made on the outer mesh" in said and "calls them Auto" in said
    assert "NVIDIA/TransformerEngine#2069" in said and "Delete the constraint" in said
    assert "bare PartitionSpec" in said and "Explicit" not in said
    with pytest.raises(errors.BadInputError) as refused:
        oom.explain(raised.value)
    assert "A sharding error: " + said in str(refused.value)
    assert run(lambda v: v).shape == (64, 32)  # the fix: the constraint deleted
    with pytest.raises(ValueError, match="should be of type `Manual`"):  # dropping the axes
        run(lambda v: jax.lax.with_sharding_constraint(  # is not enough on the outer mesh
            v, NamedSharding(mesh, P(None, "tensor"))), P("data", None), axis_names={"data"})
    kept = run(lambda v: jax.lax.with_sharding_constraint(v, P(None, "tensor")),
               P("data", None), axis_names={"data"})  # the other fix: a bare P, no Manual axis
    assert kept.shape == (64, 32)

    try:  # a bare P naming the Manual axis: jax 0.10.2's "can only refer to Auto axes"
        run(lambda v: jax.lax.with_sharding_constraint(v, P("data", None)), P("data", None),
            axis_names={"data"})
    except ValueError as err:
        bare = devices.sharding_error_fix(err)
        assert "(P('data', None)) names 'data', which shard_map made Manual" in bare
        assert "Drop those axes from the PartitionSpec" in bare and "Explicit" not in bare
    except AssertionError:  # jax 0.8.0 asserts inside JAX, with no message to read
        pass
    older = ("pspec PartitionSpec(('data', 'fsdp', 'tensor'),) contains a manual axes "
             "frozenset({'data', 'fsdp', 'tensor'}) of mesh which is not allowed.")  # before 0.8
    assert "names 'data', 'fsdp', 'tensor', which shard_map made Manual" in \
        devices.sharding_error_fix(older)


def test_jax_40789_a_numpy_array_on_the_cpu_is_used_in_place_when_aligned_else_copied(
        monkeypatch):
    """jax-ml/jax#40789 (a helper's side finding): placement said of np.asarray(x) that JAX
    "copies it to the default device (cpu:0) every time you pass it"; the CPU client uses a
    C-contiguous array aligned to 64 bytes in place (five jitted calls on a 64 MiB view added
    0 MiB, one 4 bytes off 64 MiB, jax 0.8.0 and 0.10.2). Now it says which, and why; the
    copy claim stays for a GPU, from the source read."""
    from helpers import feeding, transfers
    from helpers.transfers import H2D

    x = jnp.ones((256, 256), jnp.float32)
    host = np.asarray(x)  # the thread's array: a view of x's aligned buffer, read-only
    said = devices.placement(host).explanation
    assert said.startswith("a NumPy array in host memory, C-contiguous and aligned to 64 bytes: "
                           "the default device (cpu:0) is the CPU, which uses it in place, "
                           "with no copy, each time you pass it"), said
    assert "jax-ml/jax#40789" in said and "On a GPU it would be copied every time" in said
    assert jax.device_put(host).unsafe_buffer_pointer() == host.ctypes.data  # in place

    raw = np.ones(256 * 256 + 32, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + 1  # 4 bytes past a multiple of 64
    off = raw[start:start + 256 * 256].reshape(256, 256)
    wide = feeding.aligned_empty((256, 256), np.float64)  # aligned: narrowed all the same
    wide[...] = 1.0
    for arr, why in ((off, "at an address 4 bytes past a multiple of 64 (NumPy promises only "
                           "16-byte alignment)"),
                     (np.asarray(x).T, "not C-contiguous (a transposed, Fortran-ordered or "
                                       "strided view)"),
                     (wide, "float64, which JAX narrows to 32 bits (jax_enable_x64 is off)")):
        said = devices.placement(arr).explanation
        assert f"but this one is {why}, so JAX copies it every time you pass it" in said, said
        assert said.endswith("jax.device_put(x) once, and pass the result: one copy")
        assert jax.device_put(arr).unsafe_buffer_pointer() != arr.ctypes.data  # copied
    f = jax.jit(lambda a: a[0, 0] + a[-1, -1])
    put = jax.device_put(off)  # the fix it names: one copy, then none at each call
    f(off).block_until_ready()
    f(put).block_until_ready()
    with transfers.trace(lines=False) as log:
        f(off).block_until_ready()
    assert log.count(H2D) == 1  # the NumPy array: copied again at this call
    with transfers.trace(lines=False) as log:
        f(put).block_until_ready()
    assert log.count(H2D) == 0

    class _Gpu:  # a default device that is no CPU (none here to run): the source's claim
        platform = "gpu"

        def __str__(self):
            return "cuda:0"

    from jax.extend import backend

    monkeypatch.setattr(backend, "get_default_device", lambda: _Gpu())
    said = devices.placement(host).explanation
    assert said.startswith("a NumPy array in host memory: JAX copies it to the default device "
                           "(cuda:0) every time you pass it"), said
    assert "xla/pjrt/common_pjrt_client.h" in said and "not yet run on a GPU" in said


def test_jax_40789_what_jnp_asarray_does_with_an_aligned_array_is_said_per_version():
    """A review of jax-ml/jax#40789's note: it said an aligned NumPy array is used in place
    "each time you pass it to a JAX operation", but jnp.asarray copies it on jax 0.10.2 (a
    write after it is not seen), while jax.device_put shares it (on 0.8.0 both share)."""
    from helpers import feeding

    host = feeding.aligned_empty((256, 256), np.float32)
    host[...] = 1.0
    put, made = jax.device_put(host), jnp.asarray(host)
    host[0, 0] = 7.0
    assert float(put[0, 0]) == 7.0  # device_put shares it on both versions
    copies = float(made[0, 0]) == 1.0
    said = devices.placement(host).explanation
    assert "and jax.device_put(x) shares it, so writing into it changes what JAX reads" in said
    if copies:
        assert (f"jnp.asarray(x), though, copies it on this JAX ({jax.__version__}; jax 0.8.0 "
                "shares it), so a write after jnp.asarray is not seen") in said, said
    else:
        assert (f"jnp.asarray(x) shares it too on this JAX ({jax.__version__}; jax 0.10.2 "
                "copies it)") in said, said
    assert (jax.__version__, copies) in {("0.10.2", True), ("0.8.0", False)} or \
        jax.__version__ not in ("0.10.2", "0.8.0")  # what was measured on each


def test_jax_40789_jnp_from_dlpack_of_a_read_only_array_is_explained_under_its_traceback(
        capsys):
    """jax-ml/jax#40789: jnp.from_dlpack(np.asarray(x)) raises BufferError "Cannot export
    readonly array ..." (jax 0.8.0 to 0.11.2, NumPy 2; 0.12.0.1 converts it): %load_ext added
    nothing and
    oom.explain refused it. Now the hook names the cause (an unversioned DLPack capsule has no
    read-only flag) and the fixes, both run here: jax.device_put shares the buffer on the CPU,
    and the jax.Array itself converts."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "helpers")
    try:
        ip.run_cell("import numpy as np, jax, jax.numpy as jnp\n"
                    "x = jnp.arange(1024.0)\n"
                    "host = np.asarray(x)")
        capsys.readouterr()
        r = ip.run_cell("jnp.from_dlpack(host)")
        out = capsys.readouterr().out
        if r.success:  # jax 0.12.0.1 converts it (measured): nothing to explain
            assert "JAX Device Kit" not in out
        else:
            assert "Cannot export readonly array" in out  # the traceback first
            assert "JAX Device Kit: why this conversion failed: jnp.from_dlpack asks NumPy for " \
                   "an old-style DLPack capsule (it passes no max_version), which cannot mark " \
                   "an array read-only" in out
            assert "jax-ml/jax#40789" in out and "Use jax.device_put(a) instead" in out
            assert "or pass the jax.Array itself" in out
        measured = {"0.8.0": False, "0.10.2": False, "0.11.2": False, "0.12.0.1": True}
        assert r.success == measured.get(jax.__version__, r.success)
        put = ip.run_cell("jax.device_put(host).unsafe_buffer_pointer() == "
                          "x.unsafe_buffer_pointer()").result
        itself = ip.run_cell("jnp.from_dlpack(x).unsafe_buffer_pointer() == "
                             "x.unsafe_buffer_pointer()").result
        assert put is True and itself is True  # both fixes: no copy on the CPU
        r = ip.run_cell("raise BufferError('another buffer error')")
        out = capsys.readouterr().out
        assert not r.success and "another buffer error" in out and "JAX Device Kit" not in out
    finally:
        ip.run_line_magic("unload_ext", "helpers")
        ip.reset()


def test_jax_16788_gpus_narrowed_by_slurm_detection_are_named_with_local_device_ids():
    """jax-ml/jax#16788 (a new user's trial, SLURM's variables set by hand on the CPU): with
    one task per node and two GPUs each, initialize() with no arguments set
    jax_cuda_visible_devices to SLURM_LOCALID alone (0); process_view said nothing. The
    config option is what JAX sets from local_device_ids; the note reads it."""
    import jax

    from helpers import devices

    saved = jax.config.values.get("jax_cuda_visible_devices", "all")
    try:
        jax.config.update("jax_cuda_visible_devices", "0")
        said = devices._gpus_narrowed({"CUDA_VISIBLE_DEVICES": "0,1"})
        assert "left this process GPU 0 (jax_cuda_visible_devices) of the 2" in said, said
        assert "local_device_ids=range(2)" in said and "JAX_LOCAL_DEVICE_IDS=0,1" in said
        assert devices._gpus_narrowed({"SLURM_GPUS_PER_TASK": "4"}).count("range(4)") == 1
        assert devices._gpus_narrowed({"CUDA_VISIBLE_DEVICES": "0"}) == ""  # one GPU given
        jax.config.update("jax_cuda_visible_devices", "0,1")  # the fix's setting
        assert devices._gpus_narrowed({"CUDA_VISIBLE_DEVICES": "0,1"}) == ""
    finally:
        jax.config.update("jax_cuda_visible_devices", saved)
    assert devices._gpus_narrowed({"CUDA_VISIBLE_DEVICES": "0,1"}) == ""  # "all"
