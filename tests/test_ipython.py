"""%load_ext helpers: a cell's RESOURCE_EXHAUSTED explained while its arrays are alive, and
%%memory. A real OOM runs in a memory-capped child (the CPU stand-in), so this process lives."""

import linecache
import textwrap

import jax
import numpy as np
import pytest

from helpers.errors import BadInputError
from helpers.units import NOT_AVAILABLE
from tests.conftest import run_python

IPython = pytest.importorskip("IPython")


@pytest.fixture()
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("import jax, jax.numpy as jnp")
    ip.run_line_magic("load_ext", "helpers")
    yield ip
    ip.run_line_magic("unload_ext", "helpers")
    ip.reset()  # the shell is one per process: a later test must not meet this one's arrays


def test_the_extension_registers_and_unregisters(shell):
    from helpers._internal import jaxcompat

    assert shell.custom_exceptions == (jax.errors.JaxRuntimeError,
                                       *jaxcompat.sharding_error_types(), BufferError,
                                       AttributeError, TypeError, AssertionError,
                                       RuntimeError, IndexError)
    assert "memory" in shell.magics_manager.magics["cell"]
    shell.run_line_magic("unload_ext", "helpers")
    assert shell.custom_exceptions == () and "memory" not in shell.magics_manager.magics["cell"]
    shell.run_line_magic("load_ext", "helpers")


def test_an_oom_in_a_cell_is_explained_with_the_names_that_hold_memory(shell, capsys):
    shell.run_cell("big = jnp.ones((1024, 1024))")
    r = shell.run_cell("raise jax.errors.JaxRuntimeError("
                       "'RESOURCE_EXHAUSTED: Out of memory allocating 67108864 bytes.')")
    out = capsys.readouterr().out
    assert not r.success and "RESOURCE_EXHAUSTED" in out  # the usual traceback first
    assert "why this cell ran out of memory" in out and "asked for 64.00 MiB" in out
    assert "the variable 'big' in the notebook" in out and "`del big`" in out
    assert shell.run_cell("1 + 1").result == 2  # the kernel goes on


def test_jax_3125_block_until_ready_of_a_tuple_is_explained_under_its_traceback(shell, capsys):
    """jax-ml/jax#3125: a step returns (params, opt_state); timing it with
    ``.block_until_ready()`` on the tuple raises AttributeError. The hook names the fix,
    jax.block_until_ready, which waits for a whole pytree (run here); any other AttributeError
    passes with its traceback alone."""
    shell.run_cell("out = (jnp.ones(3), {'mu': jnp.ones(2)})")
    capsys.readouterr()
    r = shell.run_cell("out.block_until_ready()")
    said = capsys.readouterr().out
    assert not r.success and "AttributeError" in said  # the traceback first
    assert ("JAX Device Kit: why this wait failed: a tuple has no .block_until_ready(), only "
            "each jax.Array in it has: jax.block_until_ready(x) waits for every array") in said
    assert "jax-ml/jax#3125" in said
    fixed = shell.run_cell("jax.block_until_ready(out) is out")
    assert fixed.success and fixed.result is True  # the fix runs, and returns the tuple
    r = shell.run_cell("import numpy as np; np.ones(2).block_until_ready()")
    said = capsys.readouterr().out
    assert "a numpy.ndarray is no jax.Array" in said and "nothing to wait for" in said
    shell.run_cell("def step(x):\n    x * 2")  # no return
    shell.run_cell("step(jnp.ones(3)).block_until_ready()")
    said = capsys.readouterr().out
    assert "the value is None, so the function that made it returned nothing" in said
    assert "waits for every array" not in said
    shell.run_cell("class Interpolator: pass")
    shell.run_cell("Interpolator().block_until_ready()")
    said = capsys.readouterr().out
    assert "an object of class Interpolator has no .block_until_ready()" in said
    assert "where it is a registered pytree" in said and "computed already" not in said
    for other in ("(1, 2).no_such_attribute", "'text'.block_until_ready()"):
        r = shell.run_cell(other)
        said = capsys.readouterr().out
        assert not r.success and "AttributeError" in said and "JAX Device Kit" not in said
    # an AttributeError whose text cannot be made: the traceback, and the handler stays
    shell.run_cell("class Odd(AttributeError):\n    def __str__(self):\n        raise "
                   "RuntimeError('no text')")
    shell.run_cell("raise Odd()")
    said = capsys.readouterr().out
    assert "the kit could not explain this error: RuntimeError" in said
    assert AttributeError in shell.custom_exceptions  # not unregistered
    assert shell.run_cell("1 + 1").result == 2  # the kernel goes on


def test_jax_35090_a_trace_error_in_a_cell_is_explained_and_other_type_errors_pass(shell,
                                                                                     capsys):
    """A ConcretizationTypeError in a cell: the cause and the fix under its traceback (here a
    jitted helper's result, jax-ml/jax#35090); a TypeError of another kind passes alone."""
    shell.run_cell("import functools\n"
                   "@functools.partial(jax.jit, static_argnums=0)\n"
                   "def add1(i):\n    return i + 1\n"
                   "@functools.partial(jax.jit, static_argnums=0)\n"
                   "def ramp(k):\n    return jnp.arange(add1(k))\n")
    capsys.readouterr()
    r = shell.run_cell("ramp(5)")
    said = capsys.readouterr().out
    assert not r.success and "ConcretizationTypeError" in said  # the traceback first
    assert ("JAX Device Kit: why this did not trace: add1 is a jax.jit function: inside another "
            "trace its result is a traced value") in said
    r = shell.run_cell("len(5)")
    said = capsys.readouterr().out
    assert not r.success and "TypeError" in said and "JAX Device Kit" not in said
    assert shell.run_cell("1 + 1").result == 2  # the kernel goes on


def test_jax_24204_an_array_in_a_static_field_is_named_under_its_traceback(shell, capsys):
    """jax-ml/jax#24204: a dataclass with an array in a field marked static fails at the
    second call of a jit with a new instance ("checking equality of metadata fields"). The
    hook names the variable, the node and the array, and the fix, an ordinary field (run)."""
    shell.run_cell("import dataclasses\n"
                   "@jax.tree_util.register_dataclass\n@dataclasses.dataclass\n"
                   "class Foo:\n"
                   "    bar: jax.Array = dataclasses.field(metadata=dict(static=True))\n"
                   "jstep = jax.jit(lambda p: p)\njstep(Foo(bar=jnp.arange(4)))")
    capsys.readouterr()
    r = shell.run_cell("params = Foo(bar=jnp.arange(4))\njstep(params)")
    said = capsys.readouterr().out
    assert not r.success and "metadata fields" in said  # the traceback first
    assert ("JAX Device Kit: why this call failed: params keeps an array, int32[4], in the "
            "static part of its Foo.") in said
    assert "Make it an ordinary field" in said and "jax-ml/jax#24204" in said
    fixed = shell.run_cell("@jax.tree_util.register_dataclass\n@dataclasses.dataclass\n"
                           "class Foo:\n    bar: jax.Array\n"
                           "[int(jstep(Foo(bar=jnp.arange(4) + i)).bar[0]) for i in range(3)]")
    assert fixed.success and fixed.result == [0, 1, 2]  # the fix: traced, no error
    r = shell.run_cell("raise ValueError('something else')")
    assert "JAX Device Kit" not in capsys.readouterr().out  # other ValueErrors pass alone


def test_jax_9933_a_pmap_argument_without_a_leading_device_axis_is_explained(shell, capsys):
    """jax-ml/jax#9933: pmap over parameters not stacked one copy per device fails with an
    error that names no cause (a squeeze on jax 0.10.2 and 0.12.0.1, inconsistent sizes on
    0.8.0). The hook names the leading axis and both fixes, each run; a squeeze of the user's
    own passes alone."""
    shell.run_cell("n = jax.local_device_count()\nparams = jnp.ones((2,))\n"
                   "xs = jnp.ones((n, 2))\nf = jax.pmap(lambda p, x: (p * x).sum())")
    capsys.readouterr()
    r = shell.run_cell("f(params, xs)")
    said = capsys.readouterr().out
    assert not r.success and "ValueError" in said  # the traceback first
    assert ("JAX Device Kit: why this pmap failed: a jax.pmap maps every argument over its "
            "leading axis") in said and "jax-ml/jax#9933" in said
    whole = shell.run_cell("jax.pmap(lambda p, x: (p * x).sum(), in_axes=(None, 0))"
                           "(params, xs).shape == (n,)")
    stacked = shell.run_cell("f(jax.tree.map(lambda a: jnp.broadcast_to(a, "
                             "(jax.local_device_count(), *a.shape)), params), xs).shape == (n,)")
    assert whole.result is True and stacked.result is True  # both fixes run
    shell.run_cell("jnp.squeeze(jnp.ones((2, 3)), axis=0)")
    assert "JAX Device Kit" not in capsys.readouterr().out  # not a pmap's: passes alone
    shell.run_cell("jax.pmap(lambda x: jnp.squeeze(x, 0))(jnp.ones((n, 2, 3)))")
    assert "why this pmap failed" not in capsys.readouterr().out  # the user's own squeeze
    shell.run_cell("y = jax.pmap(lambda x: x * 2)(jnp.ones((n, 3)))\n"
                   "jax.pmap(lambda x: x.sum())(jax.device_put(y, jax.devices()[0]))")
    assert "why this pmap failed" not in capsys.readouterr().out  # committed, axis right


def test_diffusers_880_parameters_unreplicated_under_a_named_pmap_axis_are_not_told_to_pad(
        shell, capsys):
    """huggingface/diffusers#880 (a new user's trial): a pmap with an axis_name given its
    parameters unreplicated raised IndivisibleError over a mesh axis of that name, and the kit
    read it as a short batch: "pad it to 4", for a conv kernel. It names the pmap's leading
    axis now, with the replication that runs."""
    shell.run_cell("n = jax.local_device_count()\nw = jnp.ones((3, 3))\n"
                   "g = jax.pmap(lambda w, x: (x @ w).sum(), 'batch')")
    capsys.readouterr()
    r = shell.run_cell("g(w, jnp.ones((n, 5, 3)))")
    said = capsys.readouterr().out
    assert not r.success and "why this pmap failed: a jax.pmap maps every argument" in said, said
    assert "pad it to" not in said and "why this sharding failed" not in said
    fixed = shell.run_cell("g(jnp.broadcast_to(w, (n, 3, 3)), jnp.ones((n, 5, 3))).shape "
                           "== (n,)")
    assert fixed.result is True
    from helpers import devices
    try:
        shell.user_ns["g"](shell.user_ns["w"], np.ones((jax.local_device_count(), 5, 3)))
    except ValueError as e:
        assert devices.sharding_error_fix(e) == ""  # the pmap's, never "pad it"
    else:
        raise AssertionError("the unreplicated call ran")
    # a review: the user's own sharding error inside the mapped function is no pmap's
    from helpers import ipython as extension
    n = jax.local_device_count()
    mesh = jax.sharding.Mesh(jax.devices(), ("d",))

    def body(x):
        jax.device_put(np.ones(n + 1), jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec("d")))
        return x

    try:
        jax.pmap(body, axis_name="b")(np.ones((n, 3)))
    except ValueError as e:
        assert extension._pmap_leading_axis(e) == ""
        assert devices.sharding_error_fix(e).startswith(f"dimension 0 ({n + 1}) is split")
    else:
        raise AssertionError("the indivisible put ran")


def test_flax_2120_a_pmap_over_a_state_with_a_scalar_leaf_is_explained(shell, capsys):
    """google/flax#2120: jax.pmap over a training state never replicated; its step counter is
    a scalar. JAX's words differ by version (0.8.0: "rank should be at least 1"; 0.10.2 and
    0.12.0.1 on several devices: an IndexError of pmap's own, "tuple index out of range") and
    the hook said nothing (a new user's trial). It names the scalar and the replicated state
    (marcvanzee's flax.jax_utils.replicate), which runs."""
    shell.run_cell("n = jax.local_device_count()\n"
                   "state = {'step': jnp.zeros((), jnp.int32), 'w': jnp.ones((8, 2))}\n"
                   "xs = jnp.ones((n, 3, 8))\n"
                   "f = jax.pmap(lambda s, x: (x @ s['w']).sum() + s['step'])")
    capsys.readouterr()
    r = shell.run_cell("f(state, xs)")
    said = capsys.readouterr().out
    assert not r.success and "JAX Device Kit: why this pmap failed" in said
    assert "a scalar, with no axis at all" in said and "google/flax#2120" in said
    fixed = shell.run_cell("f(jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), "
                           "state), xs).shape == (n,)")
    assert fixed.result is True  # the replicated state runs
    shell.run_cell("().__getitem__(0)")
    assert "JAX Device Kit" not in capsys.readouterr().out  # an IndexError of the user's


def test_sglang_jax_1017_and_dm_haiku_526_an_array_jax_refuses_is_explained(shell, capsys,
                                                                              tmp_path):
    """sgl-project/sglang-jax#1017: BF16 weights read with np.frombuffer are NumPy's void V2,
    and jax.device_put raises "Dtype |V2 is not a valid JAX array type"; the PR's fix is
    .view(ml_dtypes.bfloat16). google-deepmind/dm-haiku#526: parameters saved with np.savez
    come back as a 0-d object array, which a jit refuses ("Error interpreting argument",
    caused by the same TypeError); .item() gives the dict back. The hook said nothing (a new
    user's trial); both fixes run here."""
    import ml_dtypes

    w = (np.arange(64, dtype=np.float32) / 8).astype(ml_dtypes.bfloat16).reshape(8, 8)
    shell.user_ns.update(raw=w.tobytes(), path=str(tmp_path / "params.npz"), w=w)
    shell.run_cell("import numpy as np, ml_dtypes\nhost = np.frombuffer(raw, dtype='V2')")
    capsys.readouterr()
    assert not shell.run_cell("jax.device_put(host)").success
    said = capsys.readouterr().out
    assert "JAX Device Kit: why JAX refused this array" in said
    assert "x.view(ml_dtypes.bfloat16)" in said and "sgl-project/sglang-jax#1017" in said
    fixed = shell.run_cell("jax.device_put(host.view(ml_dtypes.bfloat16)).reshape(8, 8)")
    np.testing.assert_array_equal(np.asarray(fixed.result), w)
    shell.run_cell("np.savez(path, params={'w': np.ones((3, 2), np.float32)})\n"
                   "params = np.load(path, allow_pickle=True)['params']")
    capsys.readouterr()
    assert not shell.run_cell("jax.jit(lambda p: p['w'].sum())(params)").success
    said = capsys.readouterr().out
    assert "a 0-d NumPy object array" in said and "x.item()" in said
    assert "google-deepmind/dm-haiku#526" in said
    assert shell.run_cell("jax.jit(lambda p: p['w'].sum())(params.item())").result == 6.0
    shell.run_cell("jax.device_put(np.array([None, 1], dtype=object))")  # not 0-d: no .item()
    said = capsys.readouterr().out
    assert "a NumPy object array (one Python object per element)" in said
    assert "x.item()" not in said


def test_jax_1004_a_jit_refusing_another_frameworks_tensor_is_explained(shell, capsys,
                                                                         monkeypatch):
    """jax-ml/jax#1004: a torch.Tensor passed to jit raises "Error interpreting argument ...
    The problematic value is of type <class 'torch.Tensor'>", and the hook said nothing (a new
    user's trial). The class is found in its module and has __dlpack__: the hook names
    jnp.from_dlpack. A stand-in module and tensor here (PyTorch is not among the kit's
    packages); a NumPy object the jit refuses is not named so."""
    import sys
    import types

    from tests.test_user_reports import _Tensor

    module = types.ModuleType("tensorlib")
    module._Tensor = _Tensor
    monkeypatch.setitem(sys.modules, "tensorlib", module)
    shell.user_ns["x"] = _Tensor(np.ones((8, 4), np.float32))
    capsys.readouterr()
    assert not shell.run_cell("jax.jit(lambda b: b['x'].sum())({'x': x})").success
    said = capsys.readouterr().out
    assert "JAX Device Kit: why JAX refused this array: a tensorlib._Tensor" in said
    assert "jnp.from_dlpack(x)" in said
    assert shell.run_cell("float(jax.jit(lambda b: b['x'].sum())({'x': jnp.from_dlpack(x)}))"
                          ).result == 32.0
    shell.run_cell("jax.jit(lambda b: b)(object())")
    assert "JAX Device Kit" not in capsys.readouterr().out  # not a tensor: JAX's words alone


def test_jax_7437_a_write_into_a_numpy_view_of_a_jax_array_is_explained(shell, capsys):
    """jax-ml/jax#7437: `a += 5` on an array taken from JAX raised "output array is
    read-only" (then from __iter__, since fixed); np.asarray(x) and jax.device_get(x) still
    give read-only arrays, and the hook said nothing (a new user's trial). Now it names the
    view and np.array(x), which runs; a read-only array of the user's own is not named."""
    shell.run_cell("import numpy as np\nx = jnp.ones((4, 4))\n"
                   "a = np.asarray(x)\nimg = jax.device_get(x)")
    capsys.readouterr()
    assert not shell.run_cell("a += 5").success
    said = capsys.readouterr().out
    assert "JAX Device Kit: why this array cannot be written: a is a read-only NumPy" in said
    assert "np.array(x) makes a copy you can write" in said and "jax-ml/jax#7437" in said
    assert not shell.run_cell("img[0, 0] = 1.0").success
    assert "img is a read-only NumPy array" in capsys.readouterr().out
    assert shell.run_cell("b = np.array(x)\nb += 5\nfloat(b.sum())").result == 96.0
    shell.run_cell("mine = np.zeros(3)\nmine.flags.writeable = False\nmine[0] = 1.0")
    assert "JAX Device Kit" not in capsys.readouterr().out  # not JAX's: NumPy's words alone


#: what the H100 raised (jax 0.11.2, 2026-11-26), verbatim but the request
GPU_OOM = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate {} with allocator GPU_0_bfc "
           "on device 0. [executable_name='jit_broadcast_in_dim'] "
           "[tf-allocator-allocation-error='']")


@pytest.mark.parametrize("asked, expected", [("512.00MiB", 512 * 2**20),
                                             ("1.50GiB", 1536 * 2**20), ("256B", 256)])
def test_a_gpu_oom_names_the_request_and_the_program_that_asked(asked, expected):
    from helpers import oom

    report = oom.explain(jax.errors.JaxRuntimeError(GPU_OOM.format(asked)))
    assert report.requested_bytes == expected  # the BFC allocator's rounded, human form
    assert report.program == "jit_broadcast_in_dim"
    assert "asked by the compiled program 'jit_broadcast_in_dim'" in str(report)
    assert "waiting for its result raised" in str(report)  # why the traceback's line is later
    device_put = oom.explain(jax.errors.JaxRuntimeError(  # a copy in names no program
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB with allocator "
        "GPU_0_bfc on device 0. [tf-allocator-allocation-error='']"))
    assert device_put.requested_bytes == 2**30 and device_put.program == ""
    assert "asked by" not in str(device_put)
    odd = oom.explain(jax.errors.JaxRuntimeError(GPU_OOM.format("16.00EiB")))  # not read
    assert odd.requested_bytes is NOT_AVAILABLE and odd.program == "jit_broadcast_in_dim"


def test_an_oom_s_fix_names_ipython_s_output_history_as_its_holder_not_your_code():
    """A trial: an array only IPython's Out keeps was counted as "held by your code", and the
    post-mortem's fix said "Your code holds ... del what you no longer need"."""
    from helpers import oom

    x = jax.numpy.ones((1024, 1024)) + 1  # 4 MiB, shown in a cell
    error = jax.errors.JaxRuntimeError(GPU_OOM.format("256B"))
    (shown, *_) = oom.explain(error, namespace={"Out": {3: x}}).fixes
    assert shown.startswith("IPython holds 4.00 MiB"), shown
    assert oom.explain(error, namespace={"Out": {3: x}}).held.user_bytes == 0
    w = jax.numpy.ones((512, 1024)) + 2
    both = oom.explain(error, namespace={"Out": {3: x}, "w": w}).fixes
    assert both[0].startswith("Your code and IPython hold 6.00 MiB"), both


#: what jax#22626's cell raised (jax 0.4.30, an RTX card): cuDNN could not start
DNN_FAILED = ("FAILED_PRECONDITION: DNN library initialization failed. Look at the errors above "
              "for more details.")


def test_a_cuda_library_that_could_not_start_is_explained_in_the_cell(shell, capsys):
    """The error's text from the thread, on the CPU: the cause and the fixes are named; the
    card's numbers are not available here (a GPU is needed to read them)."""
    r = shell.run_cell(f"raise jax.errors.JaxRuntimeError({DNN_FAILED!r})")
    out = capsys.readouterr().out
    assert not r.success and "DNN library initialization failed" in out
    assert "why a CUDA library could not start" in out and "cuDNN could not start: FAILED" in out
    assert "XLA_CLIENT_MEM_FRACTION lower" in out and "Loaded runtime" in out
    assert "why this cell ran out of memory" not in out
    assert shell.run_cell("1 + 1").result == 2  # the kernel goes on


def test_min_dalle_22_jax_devices_gpu_on_a_gpu_machine_without_the_cuda_plugin(shell, capsys,
                                                                             monkeypatch):
    """kuprel/min-dalle#22: "No GPU/TPU found, falling back to CPU" on a machine with a GPU;
    the CPU-only jax was installed. `jax.devices('gpu')` raised JAX's bare "Unknown backend"
    with nothing under it (a new user's trial, nvidia-smi faked). It now names the missing
    plugin and the install; without a GPU it says none is visible. JAX's own error, run here."""
    from helpers import gpu

    monkeypatch.setattr(gpu, "gpus", lambda: (
        gpu.GpuInfo(0, "NVIDIA GeForce RTX 3090", "GPU-aaaa", 24 * 2**30, "550.1"),))
    monkeypatch.setattr(gpu, "cuda_plugins", dict)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for asked in ("jax.devices('gpu')", "jax.devices('cuda')"):
        r = shell.run_cell(asked)
        out = capsys.readouterr().out
        assert not r.success and "Unknown backend" in out
        assert "why JAX has no GPU here: an NVIDIA GPU is here but JAX has no CUDA backend " \
            "installed; pip install -U \"jax[cuda13]\"" in out
    monkeypatch.setattr(gpu, "gpus", lambda: ())
    shell.run_cell("jax.devices('gpu')")
    assert "no NVIDIA GPU is visible" in capsys.readouterr().out
    r = shell.run_cell("jax.devices('tpu')")  # another backend: JAX's words alone
    assert not r.success and "why JAX has no GPU" not in capsys.readouterr().out
    assert shell.run_cell("1 + 1").result == 2


def test_other_jax_errors_are_shown_as_usual(shell, capsys):
    r = shell.run_cell("raise jax.errors.JaxRuntimeError('INVALID_ARGUMENT: not memory')")
    out = capsys.readouterr().out
    assert not r.success and "INVALID_ARGUMENT" in out and "ran out of memory" not in out


def test_percent_percent_memory_measures_the_cell(shell, capsys):
    cell = textwrap.dedent("""
        big = jax.device_put(jnp.zeros(2**20, jnp.float32), jax.devices()[0])  # 4 MiB
        small = jnp.asarray(__import__("numpy").ones(8, "float32"))
    """)
    c = shell.run_cell_magic("memory", "", cell)
    (dev0,) = [d for d in c.devices if d.device == "cpu:0"]
    assert dev0.after - dev0.before >= 4 * 2**20 and dev0.peak >= dev0.after
    assert not c.failed and any(r["direction"] == "host->device" for r in c.transfers)
    assert "cpu:0" in str(c) and "copies:" in str(c)
    assert f"{c.seconds:.2f} s with the kit watching (its line tracer" in str(c)  # jax#968
    # a live-arrays peak is sampled, and says so (apple/axlearn#293: a cast of a loaded tree
    # held both dtypes for less than a sample's interval, and the peak showed one)
    assert dev0.source == "live arrays" and not dev0.peak_exact
    assert "cpu:0" in str(c).split("is sampled every 10 ms")[0].splitlines()[-1]


def test_percent_percent_memory_takes_an_allocator_s_high_water_mark_where_it_rose():
    """A GPU allocator keeps its own high-water mark since the backend started: where it rose
    during the cell it is the cell's peak, exactly (a stand-in card's numbers: no GPU here)."""
    from helpers import ipython, memory

    def card(in_use: int, peak: int) -> memory.DeviceMemory:
        return memory.DeviceMemory("cuda:0", "gpu", in_use, peak, 80 * 2**30, "allocator")

    rose = ipython._cell_device(card(2**30, 5 * 2**30), card(2**30, 9 * 2**30), 3 * 2**30)
    assert rose.peak == 9 * 2**30 and rose.peak_exact  # a 9 GiB moment the samples missed
    flat = ipython._cell_device(card(2**30, 9 * 2**30), card(2**30, 9 * 2**30), 3 * 2**30)
    assert flat.peak == 3 * 2**30 and not flat.peak_exact  # an earlier, higher peak: sampled


def test_neuralgcm_197_jax_4474_802_percent_percent_memory_says_when_work_was_queued(
        shell, monkeypatch):
    """neuralgcm#197: an unroll returns at once and the first print of its result waits;
    jax#4474, jax#802: a timed cell that never waits for its result looks fast. A
    queued array is a stand-in here (whether a real one is still running is the scheduler's
    business): is_ready() False, as jax#928's test in test_memory.py makes it."""
    from helpers import memory
    from tests.test_memory import _Queued

    queued: list = []
    real = memory.live_arrays
    monkeypatch.setattr(memory, "live_arrays", lambda: real() + queued)
    shell.user_ns["queue"] = lambda: queued.extend(_Queued(jax.devices()[0]) for _ in range(3))
    c = shell.run_cell_magic("memory", "", "queue()")
    assert (c.pending_before, c.pending_after) == (0, 3)
    assert "3 arrays were still being computed when the cell ended" in str(c)
    assert "jax.block_until_ready(result)" in str(c) and "when the cell began" not in str(c)
    c = shell.run_cell_magic("memory", "", "queued_before = True")
    assert (c.pending_before, c.pending_after) == (3, 3)
    assert "3 arrays were still being computed when the cell began" in str(c)
    queued.clear()
    c = shell.run_cell_magic("memory", "", "x = 1")
    assert (c.pending_before, c.pending_after) == (0, 0) and "still being computed" not in str(c)


def test_jax_38518_a_profiler_trace_stopped_with_work_queued_gets_the_wait_before_the_stop(
        shell, monkeypatch, tmp_path):
    """jax-ml/jax#38518: a jax.profiler trace stopped while the profiled work is still queued
    lacks its device events (the PR: block before stop_trace). %%memory said "block at the end
    of the cell", which a trial ran: the trace still had none of them (0 dot or fusion events
    against 96 with the wait before the stop). Queued arrays are a stand-in here, as above; the
    trace itself is real (the CPU profiler), and the fix's cell leaves nothing queued."""
    from helpers import memory
    from tests.test_memory import _Queued

    queued: list = []
    real = memory.live_arrays
    monkeypatch.setattr(memory, "live_arrays", lambda: real() + queued)
    shell.user_ns.update(queue=lambda: queued.extend(_Queued(jax.devices()[0]) for _ in range(2)),
                         where=str(tmp_path))
    c = shell.run_cell_magic("memory", "", "jax.profiler.start_trace(where)\nqueue()\n"
                                           "jax.profiler.stop_trace()")
    assert c.pending_after == 2 and c.profiler_stop == "jax.profiler.stop_trace()"
    said = str(c)
    assert "before jax.profiler.stop_trace()" in said and "jax-ml/jax#38518" in said
    assert "at the end of the cell times it" not in said
    queued.clear()
    c = shell.run_cell_magic("memory", "", "with jax.profiler.trace(where):\n"
                                           "    y = jax.block_until_ready(jnp.ones(4) * 2)")
    assert c.profiler_stop.startswith("with jax.profiler.trace(") and c.pending_after == 0
    assert "profiler" not in str(c)  # waited inside the block: no word
    c = shell.run_cell_magic("memory", "", "queue()")  # no trace: the cell's timing advice
    assert "at the end of the cell times it" in str(c) and c.profiler_stop == ""
    # a review: work queued after the trace, and a stop in a comment, keep the timing advice
    c = shell.run_cell_magic("memory", "", "with jax.profiler.trace(where):\n"
                                           "    y = jnp.ones(4) * 2\nqueue()")
    assert c.profiler_stop == "" and "at the end of the cell times it" in str(c)
    c = shell.run_cell_magic("memory", "", "queue()  # jax.profiler.stop_trace() next cell")
    assert c.profiler_stop == ""


def test_percent_percent_memory_names_a_function_the_cell_compiled_again(shell):
    shell.run_cell("import numpy as np\nnorm = jax.jit(lambda x: (x * x).sum())")
    cell = "for n in (3, 4, 5):\n    norm(np.ones(n, np.float32))"
    c = shell.run_cell_magic("memory", "", cell)
    assert c.compiles >= 3 and len(c.recompiled) == 1
    assert "compiled 3 times, for new shapes" in c.recompiled[0] and "pad or bucket" in str(c)
    again = shell.run_cell_magic("memory", "", "norm(np.ones(3, np.float32))")  # cached
    assert again.compiles == 0 and again.recompiled == () and "compiles: 0" in str(again)


def test_jax_968_a_loop_of_tiny_operations_outside_jit_is_named_with_its_calls(shell):
    """jax#968: a Python loop of tiny jax.random calls runs far slower than NumPy: each
    operation outside jit is dispatched on its own. The counts are the tracer's, not times."""
    shell.run_cell("key = jax.random.key(0)\nstep = jax.jit(lambda x: x * 2)\n"
                   "keyed = jax.jit(lambda x, k: (x + jax.random.normal(k, x.shape), "
                   "jax.random.split(k)[0]))")
    loop = textwrap.dedent("""
        x = jnp.zeros(10)
        for i in range(200):
            key, sub = jax.random.split(key)
            x = x + jax.random.normal(sub, (10,))
    """)
    c = shell.run_cell_magic("memory", "", loop)
    lines = {line.split(": ", 1)[1]: (runs, calls) for line, runs, calls in c.eager_lines}
    assert set(lines) == {"key, sub = jax.random.split(key)",
                          "x = x + jax.random.normal(sub, (10,))"}
    assert all(runs == 200 and calls >= 2 * runs for runs, calls in lines.values())
    assert "ran 200 times and made" in str(c) and "jax.lax.fori_loop" in str(c)
    assert "jax.random.split(key, n)" in str(c)
    # the fix: the loop inside jit, one call; a jitted step called in a loop is one dispatch a
    # pass, a sum one more (float() reads, no operation), and a loop jit traces dispatches none
    fixed = textwrap.dedent("""
        def body(i, carry):
            key, x = carry
            key, sub = jax.random.split(key)
            return key, x + jax.random.normal(sub, (10,))
        key, x = jax.jit(lambda k: jax.lax.fori_loop(0, 200, body, (k, jnp.zeros(10))))(key)
        for i in range(200):
            x = step(x)
            total = float(x.sum())
        for i in range(200):  # a typed key's flatten runs in Python: no operation either
            x, key = keyed(x, key)
        @jax.jit
        def unrolled(x):
            for i in range(200):
                x = jnp.sin(x) + 1.0
            return x
        y = unrolled(x)
    """)
    c = shell.run_cell_magic("memory", "", fixed)
    assert c.eager_lines == () and "outside jit" not in str(c)


def test_percent_percent_memory_shows_copies_of_unlogged_size_as_unknown_not_as_the_total():
    from helpers.ipython import CellMemory

    row = {"direction": "host->device", "explicit": False, "count": 1000, "bytes": 8,
           "unknown_size": 998}  # jit's fast path logs no shape: most sizes are not known
    c = CellMemory((), 0, 0, 0, (row,), 0.1, False)
    assert "1000 host->device (implicit, 8 B + some not logged)" in str(c)
    c = CellMemory((), 0, 0, 0, ({**row, "bytes": 0, "unknown_size": 1000},), 0.1, False)
    assert "1000 host->device (implicit, bytes not logged)" in str(c)


def test_elegy_141_a_loop_that_reads_each_step_s_value_as_it_is_made_is_named(shell, monkeypatch):
    """elegy#141: printing each step's loss waits for that step, and the device idles until
    the host queues the next. Whether a real step is still running at the read is the
    scheduler's business, so the arrays' readiness is a stand-in here: every read finds its
    value still being computed; after it, nothing is (synced) or the next step is (read one
    step late, the thread's fix)."""
    array_type = type(jax.numpy.ones(1))
    monkeypatch.setattr(array_type, "is_ready", lambda self: False)
    later: list = []  # what is still computing after each read: nothing, or the next step
    monkeypatch.setattr(jax, "live_arrays", lambda *a: later)
    shell.run_cell("step = jax.jit(lambda w: (w * 0.5, (w * w).sum()))\nw = jnp.ones(8)")
    synced = "for i in range(20):\n    w, loss = step(w)\n    s = f'{loss}'\n"
    c = shell.run_cell_magic("memory", "", synced)
    ((line, runs, waited, looked),) = c.waited_lines
    assert line.endswith("s = f'{loss}'") and runs == waited == looked == 20
    every = ("for i in range(200):\n    w, loss = step(w)\n    if i % 10 == 0:\n"
             "        s = f'{loss}'\n")  # a log every 10 steps: the device is busy between
    assert shell.run_cell_magic("memory", "", every).waited_lines == ()
    item = "for i in range(20):\n    w, loss = step(w)\n    s = loss.item()\n"  # .item() reads
    assert len(shell.run_cell_magic("memory", "", item).waited_lines) == 1
    assert "the device idles until the host queues the next" in str(c)
    assert "poets-ai/elegy#141" in str(c)

    class Queued:  # the step queued after the read one, still computing
        def is_ready(self):
            return False

    later.append(Queued())
    c = shell.run_cell_magic("memory", "", synced)
    assert c.waited_lines == () and "elegy#141" not in str(c)


def test_needle_44_a_token_read_back_to_feed_the_next_step_is_told_to_stay_on_the_device(
        shell, monkeypatch):
    """cactus-compute/needle#44: a greedy decoding loop read each token back (int(argmax))
    to feed it to the next step, a device-to-host read per token; the fix runs the loop in
    one jitted lax.while_loop. The kit named the read but advised reading one step late,
    which a token the next step takes in cannot be (a new user's trial). It now says such a
    value needs no read: pass the array on, or loop inside jit. Readiness is a stand-in, as
    in elegy#141's test; the fix, the token passed on as an array, reads nothing."""
    array_type = type(jax.numpy.ones(1))
    monkeypatch.setattr(array_type, "is_ready", lambda self: False)
    monkeypatch.setattr(jax, "live_arrays", lambda *a: [])
    shell.run_cell("step = jax.jit(lambda w, t: w[t % 8] * w)\nw = jnp.linspace(0.0, 1.0, 8)")
    read = "tok = 0\nfor i in range(20):\n    tok = int(jnp.argmax(step(w, tok)))\n"
    c = shell.run_cell_magic("memory", "", read)
    ((line, runs, waited, looked),) = c.waited_lines
    assert line.endswith("tok = int(jnp.argmax(step(w, tok)))") and waited == looked == 20
    assert "pass the array itself to the next call" in str(c)
    assert "jax.lax.while_loop stopping on an end token" in str(c)
    assert "cactus-compute/needle#44" in str(c)
    kept = "tok = 0\nfor i in range(20):\n    tok = jnp.argmax(step(w, tok))\n"
    assert shell.run_cell_magic("memory", "", kept).waited_lines == ()


def test_jasmine_158_reads_through_device_get_and_np_asarray_each_step_are_named(shell,
                                                                                 monkeypatch):
    """p-doom/jasmine#158: a gap between training steps from reading each step's metrics with
    jax.device_get. The kit named float() and print, but not jax.device_get (JAX's Python
    function, not an array's method) nor np.asarray (a C++ read no Python call shows). Both
    are now named, on a dict of metrics too. Readiness is a stand-in, as in elegy#141's test:
    each read finds its value computing; read one step late, the next step is."""
    array_type = type(jax.numpy.ones(1))
    monkeypatch.setattr(array_type, "is_ready", lambda self: False)
    later: list = []
    monkeypatch.setattr(jax, "live_arrays", lambda *a: later)
    shell.run_cell("import numpy as np\n"
                   "step = jax.jit(lambda w: (w * 0.5, {'loss': (w * w).sum()}))\n"
                   "w = jnp.ones(8)")
    for read in ("m = jax.device_get(metrics)", "m = jax.device_get(metrics['loss'])",
                 "m = np.asarray(metrics['loss'])"):
        loop = f"for i in range(20):\n    w, metrics = step(w)\n    {read}\n"
        c = shell.run_cell_magic("memory", "", loop)
        ((line, runs, waited, looked),) = c.waited_lines
        assert line.endswith(read) and runs == waited == looked == 20, read
        assert "jax.device_get, np.asarray) waits for the last step queued" in str(c)
    host = ("x = np.ones(8)\nfor i in range(20):\n    w, metrics = step(w)\n"
            "    h = np.asarray(x)\n")
    assert shell.run_cell_magic("memory", "", host).waited_lines == ()  # NumPy data: no read

    class Queued:  # the fix: the next step queued before the read
        def is_ready(self):
            return False

    later.append(Queued())
    fixed = "for i in range(20):\n    w, metrics = step(w)\n    m = jax.device_get(metrics)\n"
    assert shell.run_cell_magic("memory", "", fixed).waited_lines == ()


def test_xlron_27_a_loop_reading_a_jax_table_back_each_pass_is_named_with_numpy(shell):
    """XLRON#27: a lookup table kept as a JAX array and compared with Python floats path by
    path: operations dispatched one by one, and a bool() read back each time; jitting the loop
    cannot trace the Python if, so the fix is the table as NumPy, once."""
    shell.run_cell(textwrap.dedent("""
        import numpy as np
        table = jnp.array([[4000., 1.], [2000., 2.], [1000., 3.], [500., 4.]])
        def efficiency(distance, table):
            for row in table:
                if distance <= row[0]:
                    return 1.0
            return 0.0
        distances = [float(d) for d in range(100, 5000, 40)]
    """))
    c = shell.run_cell_magic("memory", "", "out = [efficiency(d, table) for d in distances]")
    ((line, runs, calls),) = c.read_back_lines
    assert line.endswith("if distance <= row[0]:") and runs >= 100 and calls >= 2 * runs
    assert c.eager_lines == ()  # named once, with the fix that applies to it
    assert "np.asarray(table) once, before the loop" in str(c) and "XLRON#27" in str(c)
    fixed = shell.run_cell_magic("memory", "", "t = np.asarray(table)\n"
                                 "out = [efficiency(d, t) for d in distances]")
    assert fixed.read_back_lines == () == fixed.eager_lines


def test_a_real_oom_in_a_capped_child_is_explained_and_the_shell_lives():
    """CPU stand-in: RLIMIT_AS caps the child's address space, so XLA's own allocation fails
    with RESOURCE_EXHAUSTED, as the CUDA allocator's does on a GPU."""
    code = textwrap.dedent("""
        import resource, psutil
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_cell("import jax, jax.numpy as jnp; jnp.zeros(1).block_until_ready()")
        ip.run_line_magic("load_ext", "helpers")
        ip.run_cell("keep = jnp.ones(2**22)")
        cap = psutil.Process().memory_info().vms + 256 * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        r = ip.run_cell("huge = jnp.ones(2**31, jnp.uint8)")
        print("FAILED" if not r.success else "RAN")
        print("NEXT", ip.run_cell("1 + 1").result)
    """)
    out = run_python(code, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert "RESOURCE_EXHAUSTED" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert "why this cell ran out of memory" in out.stdout
    assert "asked for 2.00 GiB" in out.stdout and "the variable 'keep'" in out.stdout
    assert "FAILED" in out.stdout and "NEXT 2" in out.stdout


def test_run_cells_capped_shows_a_real_oom_explained_in_a_child():
    from helpers import oom

    r = oom.run_cells_capped("keep = jnp.ones(2**22)", "huge = jnp.ones(2**31, jnp.uint8)",
                             "print('after', 1 + 1)")
    assert r.failed == (False, True, False) and r.stand_in and "RLIMIT_AS" in r.cap
    assert "RESOURCE_EXHAUSTED" in r.output and "asked for 2.00 GiB" in r.output
    assert "the variable 'keep'" in r.output and "after 2" in r.output
    fixes = r.output.split("most likely first:")[1]  # 2 GiB under a 1 GiB cap: no del helps
    assert fixes.strip().startswith("1. The request alone (2.00 GiB) is larger than all")
    assert "Your code holds" not in fixes
    assert "XLA_CLIENT_MEM_FRACTION" not in fixes  # a GPU setting: no use on the CPU
    assert "make the batch smaller" in fixes
    assert str(r).startswith("[STAND-IN (CPU, memory-capped child)")


def test_run_cells_capped_on_a_gpu_refuses_a_budget_below_its_smallest_pool(monkeypatch):
    # On an H100 (2026-11-26) a 256 MiB budget was raised quietly to the 0.5% floor (407.8 MiB),
    # and the cells meant to run out of memory did not: now it is refused, and said why
    from helpers import oom

    monkeypatch.setattr(oom, "_gpu_mode_available", lambda: True)
    monkeypatch.setattr(oom.gpu, "total_bytes", lambda: 80 * 2**30)
    with pytest.raises(BadInputError, match=r"256.00 MiB is below the smallest pool .*409.60 MiB"):
        oom.run_cells_capped("x = 1", budget="256 MiB")
    asked = {}

    def fake_run(target, request, *, env, timeout):
        asked.update(env)
        raise RuntimeError("stop before a child starts")

    monkeypatch.setattr(oom.child, "run", fake_run)
    with pytest.raises(RuntimeError, match="stop before"):
        oom.run_cells_capped("x = 1")  # the default, 1 GiB: 1.25% of this card
    assert asked["XLA_CLIENT_MEM_FRACTION"] == "0.0125"


def test_a_cells_line_is_named_as_ipythons_tracebacks_name_it(shell):
    result = shell.run_cell("import sys\nfrom helpers._internal import frames\n"
                            "here = frames.where(sys._getframe().f_code.co_filename, 3)")
    assert result.success
    assert shell.user_ns["here"] == f"Cell In[{result.execution_count}], line 3"


_STEP = textwrap.dedent("""
    import time
    W = jax.random.normal(jax.random.key(0), (512, 512))
    x = jax.random.normal(jax.random.key(1), (256, 512))
    @jax.jit
    def train_step(w, x):
        def loss(w):
            h = x
            for _ in range(4):
                h = jnp.tanh(h @ w)
            return (h ** 2).mean()
        l, g = jax.value_and_grad(loss)(w)
        return w - 1e-3 * g, l
    w, l = train_step(W, x); jax.block_until_ready(w)
""")


def test_maxtext_1956_a_loop_that_blocks_on_each_step_is_named_and_blocking_once_is_not(shell):
    """maxtext#1956: jax.block_until_ready after every train step, added to time each step,
    kept JAX from queuing the next (on a CPU 32.9 ms per step against 21.2 ms blocked once,
    jax 0.10.2). Each wait found the step still being computed, and after it nothing was. A
    real step (milliseconds): the line after a dispatch finds it still running."""
    shell.run_cell(_STEP)
    for wait in ("jax.block_until_ready(w)", "w.block_until_ready()"):
        # the step's other output dropped at once: a loss still computing after the wait
        # made the count depend on how soon it finished (the rule is: nothing left computing)
        c = shell.run_cell_magic("memory", "", "w = W\nfor step in range(20):\n"
                                 f"    w = train_step(w, x)[0]\n    {wait}\n")
        ((line, runs, idle, looked),) = c.blocked_lines
        assert line.endswith(wait) and runs == 20 and looked >= 10 and 2 * idle >= looked
        assert c.waited_lines == () == c.timed_lines
        text = str(c)
        assert "blocked on a value still being computed" in text
        assert "AI-Hypercomputer/maxtext#1956" in text
        assert "time k steps and block once after them, then divide by k" in text.lower()
    once = shell.run_cell_magic("memory", "", "w = W\nt0 = time.perf_counter()\n"
                                "for step in range(20):\n    w, m = train_step(w, x)\n"
                                "jax.block_until_ready(w)\nper_step = "
                                "(time.perf_counter() - t0) / 20\n")  # the fix
    assert once.blocked_lines == () == once.timed_lines and "maxtext" not in str(once)


def test_jasmine_43_a_timer_read_while_the_step_is_still_computed_is_named(shell):
    """jasmine#43: time.time() around the train_step call logs the dispatch (0.08 ms on a
    CPU), not the step (19.0 ms, 60 steps timed and blocked once; jax 0.10.2)."""
    shell.run_cell(_STEP)
    c = shell.run_cell_magic("memory", "", textwrap.dedent("""
        w = W
        for step in range(20):
            start_time = time.time()
            w, loss = train_step(w, x)
            elapsed_ms = (time.time() - start_time) * 1000
        jax.block_until_ready(w)
    """))
    timed = {line.split(": ", 1)[1]: (runs, pending, looked)
             for line, runs, pending, looked in c.timed_lines}
    runs, pending, looked = timed["elapsed_ms = (time.time() - start_time) * 1000"]
    assert runs == looked == 20 and 2 * pending >= looked
    throttled = shell.run_cell_magic("memory", "", textwrap.dedent("""
        w, last = W, time.time()
        for step in range(20):
            w, loss = train_step(w, x)
            if time.time() - last > 10:
                last = time.time()
    """))  # a log every 10 s times no step: not named
    assert throttled.timed_lines == ()
    text = str(c)
    assert "measures its dispatch, not the step" in text and "p-doom/jasmine#43" in text
    assert "Time k steps and block once, jax.block_until_ready(out), then divide by k" in text
    fixed = shell.run_cell_magic("memory", "", textwrap.dedent("""
        w = W
        t0 = time.perf_counter()
        for step in range(20):
            w, loss = train_step(w, x)
        jax.block_until_ready(w)
        step_ms = (time.perf_counter() - t0) / 20 * 1000
    """))
    assert fixed.timed_lines == () and "jasmine" not in str(fixed)


#: jax-ml/jax#1219's loop in miniature: a jitted multiply timed and waited for, then the untimed
#: update of its input; ``bump`` is heavier than ``a + 1`` so that it is surely still being
#: computed when the next timer starts (tens of ms on a CPU against microseconds of Python)
_TIMED = textwrap.dedent("""
    import time
    f = jax.jit(jnp.multiply)
    bump = jax.jit(lambda a: jax.lax.fori_loop(0, 20, lambda i, a: jnp.tanh(a @ a), a))
    a = jnp.ones((256, 256)) / 256; b = jnp.ones((256, 256))
    jax.block_until_ready((f(a, b), bump(a)))
""")


def test_jax_1219_a_timer_started_while_earlier_work_runs_is_named_too_long_not_dispatch(shell):
    """jax-ml/jax#1219, script 2: each timed call waits for its result, then `a = a + 1` runs
    untimed and is still being computed when the next timer starts, so the timed call waits
    for it too. The kit called that start 'measures its dispatch, not the step' (false: the
    time is too long) and told the waits to leave the loop (maxtext#1956), which would bring
    the error back. Measured on a CPU, jax 0.10.2, medians of 30 (jax1219 scripts, no kit):
    6.7-12.8 ms a call timed so, 1.8-3.1 ms with jax.block_until_ready(a) first, the fix."""
    shell.run_cell(_TIMED)
    user = textwrap.dedent("""
        times = []
        for _ in range(10):
            start = time.time()
            res = f(a, b)
            res.block_until_ready()
            times.append(time.time() - start)
            a = bump(a)
    """)
    c = shell.run_cell_magic("memory", "", user)
    ((line, runs, early, looked, names),) = c.timer_starts_early
    assert line.endswith("start = time.time()") and runs == 10 and 2 * early >= looked >= 9
    assert names == "a"  # the array the timer started beside, by its name
    assert c.timed_lines == () == c.blocked_lines  # no dispatch claim, no "leave the block out"
    text = str(c)
    assert "each time is too long, not too short" in text and "jax-ml/jax#1219" in text
    assert "jax.block_until_ready(a) before the timer starts" in text
    assert "measures its dispatch" not in text and "maxtext" not in text
    fixed = user.replace("    start = time.time()",
                         "    jax.block_until_ready(a)\n    start = time.time()")
    c = shell.run_cell_magic("memory", "", fixed)  # the fix: a correct benchmark, said nothing of
    assert c.timer_starts_early == () == c.timed_lines == c.blocked_lines
    assert "maxtext" not in str(c) and "jax-ml/jax#1219" not in str(c)
    stamps = shell.run_cell_magic("memory", "", "ts = []\nfor _ in range(10):\n"
                                  "    a = bump(a)\n    a.block_until_ready()\n"
                                  "    ts.append(time.perf_counter())\n")
    assert stamps.blocked_lines == ()  # a time stamp per step needs its wait: not maxtext#1956


def test_jax_1219_a_timed_call_whose_result_is_thrown_away_is_named_with_the_fix(shell):
    """jax-ml/jax#1219, script 1: `f(a, b)` timed, its result thrown away, so nothing waits for
    it and nothing is left for a clock read to find still being computed: the kit said nothing.
    On a CPU, jax 0.10.2, medians of 30: 0.005 ms timed so, 2.1-3.7 ms with the result waited
    for (jax.block_until_ready(f(a, b)), the fix). The counts are the tracer's, no times."""
    shell.run_cell(_TIMED)
    user = textwrap.dedent("""
        times = []
        for _ in range(5):
            start = time.time()
            f(a, b)
            times.append(time.time() - start)
    """)
    c = shell.run_cell_magic("memory", "", user)
    ((line, runs, thrown, call),) = c.untimed_calls
    assert line.endswith("f(a, b)") and runs == thrown == 5 and call == "f(a, b)"
    text = str(c)
    assert "measures its dispatch alone" in text and "jax-ml/jax#1219" in text
    assert "Wait for the result before reading the clock: jax.block_until_ready(f(a, b))" in text
    ops = shell.run_cell_magic("memory", "", user.replace("f(a, b)", "jnp.dot(a, b)"))
    assert [row[3] for row in ops.untimed_calls] == ["jnp.dot(a, b)"]  # a jnp operation too
    for fine in ("jax.block_until_ready(f(a, b))",  # the fix
                 "out = f(a, b)",  # kept: a clock read finds it still being computed
                 "jax.block_until_ready(a)"):  # a wait, no operation
        c = shell.run_cell_magic("memory", "", user.replace("f(a, b)", fine))
        assert c.untimed_calls == () and "thrown away" not in str(c), fine


def test_jax_1797_a_timer_around_an_inner_loop_of_steps_is_named_however_few_its_runs(shell):
    """jax-ml/jax#1797: per-epoch times of jitted steps never waited for. The clock line ran
    once an epoch against the inner loop's passes, and the rule for clock reads throttled by an
    if (fewer than half of the loop's passes) dropped it. A timer whose start and end bracket a
    loop is named; one read every k steps is still not. Measured on a CPU, jax 0.10.2 (no kit):
    epochs 1 and 2 took 0.0003 and 0.0001 s, the rest 0.04-0.14 s; waited for before the clock
    (the fix) every epoch took 0.09-0.18 s."""
    shell.run_cell(_STEP)
    user = textwrap.dedent("""
        w, ts = W, []
        for epoch in range(10):
            t = time.time()
            for _ in range(3):
                w, l = train_step(w, x)
            ts.append(time.time() - t)
    """)
    c = shell.run_cell_magic("memory", "", user)
    ((line, runs, pending, looked),) = c.timed_lines  # the start, t = time.time(), is no end
    assert line.endswith("ts.append(time.time() - t)") and runs == looked == 10
    assert 2 * pending >= looked and c.timed_loops == (line,)
    text = str(c)
    assert "a timer around a loop of steps" in text and "jax-ml/jax#1797" in text
    assert "Wait for all of the loop's last results before reading the clock" in text
    throttled = shell.run_cell_magic("memory", "", textwrap.dedent("""
        w, ts, t0 = W, [], time.time()
        for i in range(30):
            w, l = train_step(w, x)
            if i % 3 == 2:
                ts.append(time.time() - t0)
    """))  # a read every 3 steps of one timer: still not named
    assert throttled.timed_lines == () == throttled.timed_loops
    fixed = shell.run_cell_magic("memory", "", user.replace(
        "    ts.append(", "    jax.block_until_ready((w, l))\n    ts.append("))
    assert fixed.timed_lines == () and "jax-ml/jax#1797" not in str(fixed)


def test_jax_5605_a_comprehension_s_items_are_not_runs_of_its_line(shell):
    """jax-ml/jax#5605's loop, float() of each of three outputs in a comprehension: the line ran
    once a pass, but the tracer counted each item (and the comprehension's start) as a run:
    'ran 1,500 times' for 300 passes. A comprehension that dispatches twice an item is still a
    loop of operations dispatched one by one."""
    from helpers._internal import linetrace

    shell.run_cell("loss = jax.jit(lambda w: (w.sum(), (w * w).sum(), w.max()))\nw = jnp.ones(8)")
    cell = ("hist = []\nfor _ in range(30):\n    out = loss(w)\n"
            "    hist.append([float(v) for v in out])\n")
    with linetrace.follow() as seen:
        shell.run_cell(cell)
    (key,) = [k for k in seen.runs if k[1] == 4 and "hist.append" in linecache.getline(*k)]
    assert seen.runs[key] == 30 and seen.reads[key] == 90 and seen.items[key] >= 90
    c = shell.run_cell_magic("memory", "", "ys = [jnp.sum(w * i) + 1 for i in range(120)]")
    ((line, runs, calls),) = c.eager_lines
    assert line.endswith("ys = [jnp.sum(w * i) + 1 for i in range(120)]") and runs == 1
    assert calls >= 2 * 120 and "ran 1 time and made" in str(c)


def test_skyrl_647_tree_map_lambdas_dispatched_leaf_by_leaf_in_a_loop_are_named(shell):
    """NovaSky-AI/SkyRL#647 (a new user's trial, gradient accumulation): each adapter's
    gradients sliced and added leaf by leaf with jax.tree.map outside jit. The note on
    operations dispatched one by one fired for a plain loop, not for the same work in tree.map
    lambdas (one call a leaf, so never "twice a run"). The lambdas' runs are the leaves now, the
    line's own runs its passes; jitted, the accumulation dispatches once a pass."""
    shell.run_cell("x = jnp.ones((8, 16, 16))\ntree = {str(i): x for i in range(24)}\n"
                   "acc = {str(i): jnp.zeros((16, 16)) for i in range(24)}")
    c = shell.run_cell_magic("memory", "", "for i in range(8):\n"
                             "    g = jax.tree.map(lambda t: t[i], tree)\n"
                             "    acc = jax.tree.map(lambda a, b: a + b, acc, g)\n")
    rows = {line.split(": ", 1)[1]: (runs, calls) for line, runs, calls in c.eager_lines}
    assert rows["g = jax.tree.map(lambda t: t[i], tree)"][0] == 8, rows
    assert rows["acc = jax.tree.map(lambda a, b: a + b, acc, g)"][1] >= 8 * 24, rows
    shell.run_cell("add = jax.jit(lambda acc, tree, i: jax.tree.map(lambda a, t: a + t[i], acc,"
                   " tree))\nacc = add(acc, tree, 0)")
    fixed = shell.run_cell_magic("memory", "", "for i in range(8):\n"
                                 "    acc = add(acc, tree, i)\n")
    assert fixed.eager_lines == ()


def test_tpu_inference_1748_an_array_rebuilt_at_each_write_outside_jit_is_named(shell):
    """vllm-project/tpu-inference#1748: loading experts one by one with
    param = param.at[e].set(w) outside jit copies the whole stacked parameter at each write,
    old and new alive together; the PR stacks on the host and puts once. %%memory counted the
    copies in and said nothing of the writes (a new user's trial). Now the line is named with
    both fixes, run here: the same values, and the donated jitted write keeps one buffer."""
    shell.run_cell("import numpy as np\nE = 8\n"
                   "hf = [np.full((256, 256), e, np.float32) for e in range(E)]\n"
                   "param = jnp.zeros((E, 256, 256), jnp.float32)")  # 2 MiB
    c = shell.run_cell_magic("memory", "", "for e in range(E):\n"
                             "    param = param.at[e].set(jnp.asarray(hf[e]))\n")
    ((line, runs, name, nbytes),) = c.rebuilt_lines
    assert line.endswith("param = param.at[e].set(jnp.asarray(hf[e]))")
    assert (runs, name, nbytes) == (8, "param", 8 * 256 * 256 * 4)
    text = str(c)
    assert "each run made a new param (2.00 MiB) to write a part of it" in text
    assert "vllm-project/tpu-inference#1748" in text and "donate_argnums=0" in text
    fixed = shell.run_cell_magic("memory", "", "stacked = jax.device_put(np.stack(hf))")
    assert fixed.rebuilt_lines == () and "tpu-inference#1748" not in str(fixed)
    shell.run_cell("write = jax.jit(lambda x, v, i: x.at[i].set(v), donate_argnums=0)\n"
                   "donated = jnp.zeros((E, 256, 256), jnp.float32)\n"
                   "where = donated.unsafe_buffer_pointer()\n"
                   "for e in range(E):\n"
                   "    donated = write(donated, hf[e], e)\n")
    ns = shell.user_ns
    np.testing.assert_array_equal(np.asarray(ns["param"]), np.asarray(ns["stacked"]))
    np.testing.assert_array_equal(np.asarray(ns["donated"]), np.asarray(ns["stacked"]))
    assert ns["donated"].unsafe_buffer_pointer() == ns["where"]  # written in place
    once = shell.run_cell_magic("memory", "", "param = param.at[0].set(0.0)")
    assert once.rebuilt_lines == ()  # one write: no loop to change
    # a dict's entry and an attribute too; a function's own local not (a review: a 64 B local
    # was named with the size of a notebook variable of its name)
    shell.run_cell("params = {'w': param}\nclass M: pass\nm = M()\nm.w = param\n"
                   "def smooth(v):\n    param = jnp.zeros(16)\n    for i in range(16):\n"
                   "        param = param.at[i].set(v[i])\n    return param")
    entry = shell.run_cell_magic("memory", "", "for e in range(E):\n"
                                 "    params['w'] = params['w'].at[e].set(hf[e])\n")
    assert [r[2] for r in entry.rebuilt_lines] == ["params['w']"]
    attribute = shell.run_cell_magic("memory", "", "for e in range(E):\n"
                                     "    m.w = m.w.at[e].set(hf[e])\n")
    assert [r[2] for r in attribute.rebuilt_lines] == ["m.w"]
    local = shell.run_cell_magic("memory", "", "y = smooth(jnp.arange(16.0))")
    assert local.rebuilt_lines == ()


def test_jax_390_a_jax_array_read_one_element_at_a_time_is_named_with_numpy(shell):
    """jax-ml/jax#390: plt.plot([x[i] for i in range(1000)]) is far slower than np.asarray(x)
    first: each x[i] is its own operation. %%memory named only lines with two JAX calls or more
    a pass. On a CPU, jax 0.10.2 (interop jax390 scripts, no kit): 1,000 reads took 0.08-0.18 s,
    0.0001-0.0006 s through np.asarray(x) once (the fix, the same values)."""
    import numpy as np

    shell.run_cell("import numpy as np\nx = jnp.sin(jnp.arange(1000.0))")
    c = shell.run_cell_magic("memory", "", "ys = [x[i] for i in range(1000)]")
    ((line, runs, reads),) = c.element_lines
    assert line.endswith("ys = [x[i] for i in range(1000)]") and runs == 1 and reads == 1000
    text = str(c)
    assert "Each x[i] of a jax.Array is its own dispatched operation" in text
    assert "jax-ml/jax#390" in text and "xn = np.asarray(x), and index xn" in text
    loop = shell.run_cell_magic("memory", "", "zs = []\nfor i in range(1000):\n"
                                "    zs.append(float(x[i]))\n")
    ((line, runs, reads),) = loop.element_lines
    assert line.endswith("zs.append(float(x[i]))") and runs == reads == 1000
    fixed = shell.run_cell_magic("memory", "", "xn = np.asarray(x)\n"
                                 "ns = [xn[i] for i in range(1000)]")
    assert fixed.element_lines == () and "jax-ml/jax#390" not in str(fixed)
    ns = shell.user_ns
    assert np.array_equal(np.array(ns["ys"]), ns["ns"]) and ns["zs"] == list(ns["ns"])
    slices = shell.run_cell_magic("memory", "", "bs = [x[i:i + 10] for i in range(0, 1000, 5)]")
    assert slices.element_lines == ()  # slices of a device array are no element reads
    few = shell.run_cell_magic("memory", "", "ws = [x[i] for i in range(10)]")
    assert few.element_lines == ()  # ten reads: under the 100 that make a line worth a word


def test_liesel_282_percent_percent_memory_names_a_callbacks_copies(shell):
    """liesel#282: a jax.debug.callback on every iteration of a compiled loop; each call copies
    its arguments (JAX device_puts them), which %%memory counted as the user's copies."""
    shell.run_cell(textwrap.dedent("""
        def update(i):
            pass
        def body(c):
            i, x = c
            jax.debug.callback(update, i)
            return i + 1, x - 0.01 * jnp.sin(x)
        f = jax.jit(lambda x: jax.lax.while_loop(lambda c: c[0] < 30, body, (0, x))[1])
        x = jnp.ones(8)
        f(x).block_until_ready(); jax.effects_barrier()
    """))
    c = shell.run_cell_magic("memory", "", "f(x).block_until_ready()\njax.effects_barrier()\n")
    ((name, n, why),) = c.callback_copies
    assert (name, n) == ("jax.debug.callback", 30)
    assert "30 of them: the copy jax.debug.callback (or jax.debug.print" in str(c)
    assert "liesel-devs/liesel#282" in why


def test_a_user_s_own_assertion_gets_no_explanation_whatever_its_words(shell, capsys):
    """AssertionError is handled for JAX's bare one (JAX_PLATFORMS=cuda with no GPU visible:
    jax-ml/jax#23208's setting, tested in tests/test_settings.py); a user's assert that merely
    mentions RESOURCE_EXHAUSTED got the out-of-memory report (found by a review)."""
    r = shell.run_cell("log = 'RESOURCE_EXHAUSTED: Out of memory'\n"
                       "assert 'RESOURCE_EXHAUSTED' not in log, log")
    out = capsys.readouterr().out
    assert not r.success and "AssertionError" in out and "JAX Device Kit" not in out
    assert shell.run_cell("1 + 1").result == 2


def test_jax_1988_timeit_of_a_jitted_call_that_does_not_wait_is_named_with_the_fix(shell,
                                                                                  capsys):
    """jax#1988: %timeit of a jitted call times its dispatch (0.80 ms, then 4.2 ms once work
    queued up, on a CPU); .block_until_ready() waits for the result. The kit reads the cell's
    text: only a statement whose outermost call is a jitted function, with nothing waiting."""
    shell.run_cell("import numpy as np\nfoo_jit = jax.jit(lambda x: jnp.tanh(x @ x))\n"
                   "a = np.ones((8, 8), np.float32)")
    capsys.readouterr()
    shell.run_cell("for i in range(2):\n    %timeit -n2 -r1 -q foo_jit(a)\n")
    said = capsys.readouterr().out
    assert "%timeit foo_jit(a): foo_jit is a jitted function" in said
    assert "%timeit times the dispatch" in said and "jax-ml/jax#1988" in said
    assert "Time foo_jit(a).block_until_ready() instead" in said
    shell.run_cell("%%timeit -n 2 -r 1 -q\ny = foo_jit(a)\n")
    assert "Time foo_jit(a).block_until_ready() instead" in capsys.readouterr().out
    for fine in ("%timeit -n2 -r1 -q foo_jit(a).block_until_ready()",  # the fix
                 "%timeit -n2 -r1 -q float(foo_jit(a)[0, 0])",  # a read back waits too
                 "%timeit -n2 -r1 -q np.tanh(a)",  # not JAX
                 "foo_jit(a)"):  # not timed
        shell.run_cell(fine)
        assert "JAX Device Kit" not in capsys.readouterr().out, fine
    shell.run_line_magic("unload_ext", "helpers")
    shell.run_cell("%timeit -n2 -r1 -q foo_jit(a)")
    assert "JAX Device Kit" not in capsys.readouterr().out
    shell.run_line_magic("load_ext", "helpers")  # as the fixture expects to find it


def test_jax_427_timeit_of_a_function_not_jitted_names_each_operation_s_dispatch(shell, capsys):
    """jax-ml/jax#427: the quickstart's sum_logistic is 15x slower with jax.numpy than NumPy at
    N=10 (mattjj: a fixed dispatch cost per operation; jit it). %timeit of it under the kit
    said nothing: the check read jitted calls only (a trial: 79.5 us against 4.5 us, 12.7 us
    jitted). The fix it names, run: the same value, jitted."""
    shell.run_cell("import numpy as np\n"
                   "def sum_logistic(x):\n    return jnp.sum(1.0 / (1.0 + jnp.exp(-x)))\n"
                   "def one_op(x):\n    return jnp.sum(x)\n"
                   "def numpy_only(x):\n    return np.sum(1.0 / (1.0 + np.exp(-x)))\n"
                   "def put(x):\n    return jax.block_until_ready(jax.device_put(x))\n"
                   "x = jnp.arange(10.0)")
    capsys.readouterr()
    shell.run_cell("%timeit -n2 -r1 -q sum_logistic(x)")
    said = capsys.readouterr().out
    assert "sum_logistic is not jitted, so each of its 2 jnp or jax calls" in said
    assert "jax-ml/jax#427" in said and "jax.jit(sum_logistic)" in said
    shell.run_cell("%timeit -n2 -r1 -q sum_logistic(x).block_until_ready()")
    assert "is not jitted" in capsys.readouterr().out  # a wait does not make it one program
    for fine in ("%timeit -n2 -r1 -q one_op(x)",  # one operation: one dispatch either way
                 "%timeit -n2 -r1 -q numpy_only(np.ones(10))",  # not JAX
                 "%timeit -n2 -r1 -q put(np.ones(10))",  # puts, no operation
                 "%timeit -n2 -r1 -q jax.jit(sum_logistic)(x).block_until_ready()"):
        shell.run_cell(fine)
        assert "JAX Device Kit" not in capsys.readouterr().out, fine
    shell.run_cell("import functools\ndef logged(f):\n    @functools.wraps(f)\n"
                   "    def inner(*a):\n        return f(*a)\n    return inner\n"
                   "wrapped = logged(jax.jit(sum_logistic))")
    capsys.readouterr()
    shell.run_cell("%timeit -n2 -r1 -q wrapped(x)")  # a jit behind a decorator (a review)
    assert "is not jitted" not in capsys.readouterr().out
    shell.run_cell("fast = jax.jit(sum_logistic)")
    assert float(shell.user_ns["fast"](shell.user_ns["x"])) == pytest.approx(
        float(shell.user_ns["sum_logistic"](shell.user_ns["x"])), rel=1e-6)


def test_openpi_437_a_sharding_error_in_a_cell_is_explained_under_its_traceback(shell, capsys):
    """The epoch's last batch, 19 rows over 4 devices: JAX's ValueError, then the kit's cause
    and fix under the traceback; any other ValueError shows its traceback alone."""
    r = shell.run_cell(
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "import numpy as np\n"
        "s = NamedSharding(Mesh(np.array(jax.devices()[:4]), ('b',)), P('b'))\n"
        "jax.device_put(np.zeros((19, 3), np.float32), s)")
    out = capsys.readouterr().out
    assert not r.success and "why this sharding failed" in out
    assert "dimension 0 (19) is split into 4 pieces" in out and "pad it to 20" in out
    r = shell.run_cell("raise ValueError('not a sharding')")
    out = capsys.readouterr().out
    assert not r.success and "not a sharding" in out and "JAX Device Kit" not in out
    assert shell.run_cell("1 + 1").result == 2  # the kernel goes on


def test_jax_8096_a_live_arrays_row_says_xla_temporaries_never_appear_there(shell):
    """jax-ml/jax#8096: two versions of a layer, one with a sort's 32 MiB XLA temporary. The
    cpu:0 row was the same for both, and the note blamed 10 ms sampling, though hundreds of
    samples covered the temporary's life: temporaries are never live arrays. The note says
    so, and points at the host high-water mark, which saw it."""
    shell.run_cell(textwrap.dedent("""
        x = jnp.ones((4096,), jnp.float32); y = jnp.ones((2048,), jnp.float32)
        f = jax.jit(lambda x, y: jnp.sort(x[:, None] * jnp.sin(y)[None, :], axis=1)[:, -1].sum())
        f(x, y).block_until_ready()
    """))
    c = shell.run_cell_magic("memory", "", "f(x, y).block_until_ready()")
    (dev0,) = [d for d in c.devices if d.device == "cpu:0"]
    assert dev0.peak - dev0.before < 2**20  # the temporary is in no device row
    text = str(c)
    assert "The rows of cpu:0, cpu:1, cpu:2, cpu:3 count live arrays only" in text
    assert "XLA's temporaries inside a call are not live arrays and never appear there" in text
    assert "the host RSS high-water mark is this cell's peak" in text
    # how much the host mark rose depends on what the process freed before (reused pages):
    # tests/test_memory.py measures it in a fresh process; here, the words for a rise
    from dataclasses import replace

    rose = replace(c, host_before=200 * 2**20, host_peak=264 * 2**20)
    assert "this cell's peak (here 64.00 MiB above the cell's start)" in str(rose)


def test_openpi_271_the_first_call_is_tied_to_its_compile(shell):
    """Physical-Intelligence/openpi#271: 'inference takes over 10 seconds'. The first call of a
    jitted policy compiles; %%memory said 'compiles: 1' without tying it to the slow first
    call. In a cell that times its calls it now names the function, the seconds, and the fix
    (time the calls after the first, run here: the first call is the slowest): a second cell
    that calls it again compiles nothing and says nothing of it."""
    shell.run_cell("import time\ninfer = jax.jit(lambda w, x: jnp.tanh(x @ w))\n"
                   "W = jnp.ones((64, 64)); obs = jnp.ones((8, 64)); ts = []")
    c = shell.run_cell_magic("memory", "", "for i in range(4):\n    t0 = time.perf_counter()\n"
                             "    a = infer(W, obs).block_until_ready()\n"
                             "    ts.append(time.perf_counter() - t0)\n")
    ((function, where, seconds),) = c.first_compiles
    assert function == "<lambda>" and "line 2" in where and seconds > 0 and c.first_call_timed
    text = str(c)
    assert "the first call of <lambda>" in text and f"{seconds:.2f} s" in text
    assert "Physical-Intelligence/openpi#271" in text and "time the calls after the first" in text
    ts = shell.user_ns["ts"]
    assert ts[0] > max(ts[1:]), ts  # the fix: the calls after the first reuse the program
    again = shell.run_cell_magic("memory", "", "a = infer(W, obs)")
    assert again.first_compiles == () and "the first call" not in str(again)


def test_openpi_271_a_cell_that_reads_no_clock_gets_no_timing_advice_for_a_quick_compile(shell):
    """Physical-Intelligence/openpi#271's note, reviewed: it appeared under every cell that
    compiled, `y = f(x)` too, which times nothing ('time the calls after the first' for 0.04 s
    of compiling). A cell that reads no clock keeps the compile's seconds in the record and
    says 'compiles: 1 (each function once)' alone; a first call of SLOW_FIRST_CALL seconds or
    more, which the user notices with no clock, is still named (a stand-in's seconds)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from helpers import ipython

    shell.run_cell("f = jax.jit(lambda x: (x @ x).sum()); x = jnp.ones((128, 128))")
    c = shell.run_cell_magic("memory", "", "y = f(x)\nprint(float(y))")
    ((function, _, seconds),) = c.first_compiles
    assert function == "<lambda>" and 0 < seconds < ipython.SLOW_FIRST_CALL
    assert not c.first_call_timed
    text = str(c)
    assert "compiles: 1 (each function once)" in text
    assert "the first call of" not in text and "time the calls after the first" not in text
    slow = SimpleNamespace(functions=[SimpleNamespace(
        function="policy", place="Cell In[3], line 1", cause="first compile", compiles=1,
        compile_seconds=ipython.SLOW_FIRST_CALL, trace_seconds=0.5, lowering_seconds=0.0)])
    followed = SimpleNamespace(clock_reads={})
    rows, named = ipython._first_compiles(slow, followed, "y = policy(x)")
    assert named and rows[0][2] == ipython.SLOW_FIRST_CALL + 0.5
    assert "time the calls after the first" in str(replace(c, first_compiles=rows,
                                                           first_call_timed=named))
    quick = SimpleNamespace(functions=[SimpleNamespace(**{**vars(slow.functions[0]),
                                                          "compile_seconds": 0.01})])
    assert ipython._first_compiles(quick, followed, "y = policy(x)")[1] is False
    assert ipython._first_compiles(quick, None, "%timeit policy(x)")[1] is True  # no tracer


def test_openpi_271_a_clock_line_every_run_of_which_found_work_pending_is_named_below_ten():
    """Physical-Intelligence/openpi#271: four timed calls, each print of the time read while the
    call's work was still being computed; the clock note needed 10 runs (WAITED_RUNS). A line
    every run of which found pending work is named from TIMED_RUNS runs; one that found it on
    some runs only still needs WAITED_RUNS. (A stand-in of the line tracer's counts: whether
    real work is still pending is the scheduler's business.)"""
    from collections import Counter

    from helpers import ipython
    from helpers._internal.linetrace import Followed

    printed, started = ("<cell>", 4), ("<cell>", 2)
    followed = Followed(
        runs=Counter({printed: 4, started: 4, ("<cell>", 3): 4}),
        function_of={printed: "<module>", started: "<module>", ("<cell>", 3): "<module>"},
        clock_pending=Counter({printed: 4, started: 3}),
        clock_reads=Counter({printed: 4, started: 4}))
    _, timed = ipython._waiting_lines(followed)
    assert [(runs, pending, looked) for _, runs, pending, looked in timed] == [(4, 4, 4)]
    followed.runs = {printed: ipython.TIMED_RUNS - 1, started: 2, ("<cell>", 3): 2}
    followed.clock_pending = followed.clock_reads = {printed: ipython.TIMED_RUNS - 1}
    assert ipython._waiting_lines(followed) == ((), ())  # fewer runs: not named


def test_jax_3412_an_array_used_after_its_donation_is_explained_with_a_real_copy(shell, capsys):
    """jax-ml/jax#3412: a snapshot kept before a donating call shares its buffers and is gone
    after it. The cell's "Array has been deleted" got nothing from the kit; it now names the
    donation, the snapshot's name, and the copy to keep (run: the copy survives). A
    RuntimeError of the user's own passes alone."""
    shell.run_cell("step = jax.jit(lambda p: {'w': p['w'] * 0.8}, donate_argnums=0)\n"
                   "params = {'w': jnp.full((64, 64), 5.0)}\nbest = params\n"
                   "params = step(params)")
    capsys.readouterr()
    r = shell.run_cell("float(best['w'].sum())")
    said = capsys.readouterr().out
    assert not r.success and "Array has been deleted" in said  # the traceback first
    assert "JAX Device Kit: why this array is gone: an array used after its buffer was donated" \
        in said and "jax-ml/jax#3412" in said
    assert "Deleted now: best['w']" in said and "jax.tree.map(jnp.copy, params)" in said
    fixed = shell.run_cell("params = {'w': jnp.full((64, 64), 5.0)}\n"
                           "best = jax.tree.map(jnp.copy, params)\nparams = step(params)\n"
                           "float(best['w'].sum())")
    assert fixed.result == 5.0 * 64 * 64  # the fix named
    shell.run_cell("x = jnp.ones(8)\nf = jax.jit(lambda a: a * 2, donate_argnums=0)\ny = f(x)")
    capsys.readouterr()
    shell.run_cell("x.block_until_ready()")  # XLA's words for it, a JaxRuntimeError
    assert "why this array is gone" in capsys.readouterr().out
    shell.run_cell("raise RuntimeError('my own')")
    assert "JAX Device Kit" not in capsys.readouterr().out


def test_load_ext_first_sees_the_backends_start():
    """The README's order, %load_ext helpers in the first cell, imported JAX without the kit's
    start hook, so check_process() said "unknown (hook late)" and missed settings changed
    after the start (a new user's trial). The extension installs it now (a fresh process:
    this one's backends started long ago)."""
    proc = run_python(
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "sh.run_cell('%load_ext helpers')\n"
        "sh.run_cell('import jax; jax.devices()')\n"
        "from helpers import settings\n"
        "print('HOOK', settings.check_process().hook)\n", env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    hook = proc.stdout.split("HOOK ", 1)[1].split()[0]
    assert hook in ("installed", "unavailable") and hook != "late"  # (unavailable: jax < 0.10.2)


def test_a_memory_cell_ending_in_a_semicolon_displays_no_value(shell, capsys):
    """A new user's trial: `%%memory` over `jnp.ones(4);` still displayed the Array (IPython
    reads the ";" from the outer cell, the magic's call), then the kit's record: a large array
    would be printed whole. Now the cell runs silent; the record is still returned."""
    shell.run_cell("x = None", store_history=True)
    capsys.readouterr()
    quiet = shell.run_cell("%%memory\nmarker = jnp.arange(4.0) + 17.5;  # a comment\n",
                           store_history=True)
    shell.run_cell("%%memory\njnp.arange(4.0) + 17.5;\n", store_history=True)
    shell.run_cell('%%memory\n(jnp.arange(4.0) + 17.5, "run #3");\n', store_history=True)
    out = capsys.readouterr().out
    assert "17.5" not in out and "copies:" in out, out  # the record, not the value
    assert quiet.success and float(shell.user_ns["marker"][0]) == 17.5
    shell.run_cell("%%memory\njnp.arange(4.0) + 17.5\n", store_history=True)
    assert "17.5" in capsys.readouterr().out  # without ";" it shows, as IPython does


def test_quantecon_663_a_timed_cell_that_compiles_again_says_the_time_includes_it(
        shell, capsys):
    """QuantEcon/lecture-python.myst#663 (a new user's trial): a benchmark warmed up with one
    static value and timed with another compiles inside the timed cell. The kit named the
    recompile and a fix for a different problem (mask past num_reps), never that the measured
    time includes the compile; the thread's fix, warming up with the timed arguments, runs."""
    shell.run_cell("import time, functools\n"
                   "@functools.partial(jax.jit, static_argnums=1)\n"
                   "def mean_stop(key, num_reps):\n"
                   "    return jax.random.uniform(key, (num_reps,)).mean()\n"
                   "mean_stop(jax.random.key(0), 100).block_until_ready()")
    timed = ("%%memory\nts = []\nfor i in range(3):\n    t0 = time.perf_counter()\n"
             "    mean_stop(jax.random.key(i), {n}).block_until_ready()\n"
             "    ts.append(time.perf_counter() - t0)\n")
    capsys.readouterr()
    shell.run_cell(timed.format(n=2000))
    out = capsys.readouterr().out
    assert "mean_stop (Cell In[" in out and "compiled again in this cell (new static " \
        "values)" in out and "inside the time the cell measures" in out, out
    shell.run_cell("mean_stop(jax.random.key(0), 3000).block_until_ready()")  # the warm-up
    capsys.readouterr()
    shell.run_cell(timed.format(n=3000))
    assert "compiled again in this cell" not in capsys.readouterr().out
    shell.run_cell("%%memory\nmean_stop(jax.random.key(0), 4000)")  # no clock: no note
    assert "compiled again in this cell" not in capsys.readouterr().out
    warmed = timed.format(n=5000).replace(  # the fix inside the cell, above the clock
        "ts = []", "mean_stop(jax.random.key(0), 5000).block_until_ready()\nts = []")
    shell.run_cell(warmed)
    assert "compiled again in this cell" not in capsys.readouterr().out


def test_jax_19327_the_timeit_module_timing_a_jitted_call_is_named_with_the_fix(shell,
                                                                                capsys):
    """jax-ml/jax#19327 (a new user's trial): timeit.repeat(lambda: f1(w, a), ...) ranked two
    jitted calls wrongly, timing their dispatch (8.1 us against 5.3 ms once blocked); the kit
    said nothing, its line tracer skipping the standard library's frames. The cell's text
    names it now, for a lambda and for a statement in quotes; the fix, blocked, is quiet."""
    shell.run_cell("import timeit\nf1 = jax.jit(lambda w, a: w @ a)\n"
                   "w = jnp.ones((64, 64)); a = jnp.ones((64, 64))")
    capsys.readouterr()
    shell.run_cell("ts = timeit.repeat(lambda: f1(w, a), number=1, repeat=3)")
    said = capsys.readouterr().out
    assert "timeit.repeat of f1(w, a): f1 is a jitted function" in said, said
    assert "Time f1(w, a).block_until_ready() instead" in said and "jax-ml/jax#1988" in said
    shell.run_cell("t = timeit.timeit('f1(w, a)', globals=globals(), number=2)")
    assert "timeit.timeit of f1(w, a)" in capsys.readouterr().out
    shell.run_cell("ts = timeit.repeat(lambda: f1(w, a).block_until_ready(), number=1, "
                   "repeat=3)")
    assert "JAX Device Kit" not in capsys.readouterr().out
    shell.run_cell("t = timeit.timeit(lambda: f1(w, a).sum().item(), number=2)")  # it waits
    assert "JAX Device Kit" not in capsys.readouterr().out


_INIT_LATE = """
import sys
from IPython.core.interactiveshell import InteractiveShell
sys.path.insert(0, {folder!r})
ip = InteractiveShell.instance()
ip.run_cell("%load_ext helpers")
ip.run_cell("import jax\\nimport lib_with_devices")  # a library asks for devices at import
ip.run_cell("jax.distributed.initialize('127.0.0.1:1', num_processes=2, process_id=0)")
from helpers._internal import jaxcompat
print("STATE", jaxcompat.backend_start_snapshot()[0])
"""


def test_jax_18237_initialize_after_a_library_started_the_backend_is_named(tmp_path):
    """jax-ml/jax#18237 (a new user's trial): jax.distributed.initialize() raised "must be
    called before any JAX calls" where an imported library had called jax.devices(); the hook
    said nothing. Now it names the cause, and the library's line where the kit's backend-start
    hook saw it (jax 0.10.2: the hook JAX has there)."""
    from tests.conftest import run_python

    (tmp_path / "lib_with_devices.py").write_text("import jax\n\nDEVICES = jax.devices()\n")
    proc = run_python(_INIT_LATE.format(folder=str(tmp_path)), env={"JAX_PLATFORMS": "cpu"},
                      timeout=120)
    assert "must be called before any JAX calls" in proc.stdout + proc.stderr
    said = next(x for x in proc.stdout.splitlines() if "why initialize failed" in x)
    assert "jax.distributed.initialize() must come before it" in said and "18237" in said
    if "STATE installed" in proc.stdout:  # the hook saw this one start (jax 0.10.2)
        assert "started by lib_with_devices.py:3: DEVICES = jax.devices()" in said, said
    else:
        assert "a library that calls one as it is imported" in said, said


def test_sglang_jax_155_and_pytorch_xla_8667_multi_process_errors_are_explained(shell, capsys):
    """Two errors of a jax.distributed job (new users' trials), JAX's words as
    test_processes runs them: a put of a value that differs by process, and a read of an array
    split over other processes' devices."""
    shell.run_cell('raise AssertionError("<class numpy.ndarray> passed to device_put is not '
                   'the same on each process. Make sure you are passing the same value")')
    said = capsys.readouterr().out
    assert "why this put failed" in said and "np.empty" in said and "sglang-jax#155" in said
    shell.run_cell("raise RuntimeError('Fetching value for `jax.Array` that spans "
                   "non-addressable (non process local) devices is not possible.')")
    said = capsys.readouterr().out
    assert "process_allgather(x)" in said and "jax.local_devices()" in said, said
    shell.run_cell("raise RuntimeError('Closing over jax.Array that spans non-addressable "
                   "(non process local) devices is not allowed. Please pass such arrays as "
                   "arguments to the function.')")
    said = capsys.readouterr().out
    assert "pass it as an argument of the jitted function" in said, said
    assert "process_allgather" not in said


def test_jax_7301_printing_an_array_of_many_short_dimensions_is_named_before_it_runs(
        shell, capsys):
    """jax-ml/jax#7301 (a new user's trial): print() of a [2] * 25 array got the kernel
    killed: NumPy summarizes only dimensions longer than 2 x edgeitems, so it writes every
    element; %%memory measured the peak (+125.6 MiB for 1 MiB) and named no cause. The note
    comes before the cell runs; the fix it names, a reshape, prints a summary."""
    shell.run_cell("arr = jnp.zeros([2] * 17)\nsmall = jnp.zeros((512, 512))")
    capsys.readouterr()
    shell.run_cell("print(small)")  # summarized by NumPy: no note
    assert "JAX Device Kit" not in capsys.readouterr().out
    shell.run_cell("print(arr.shape)")
    assert "JAX Device Kit" not in capsys.readouterr().out
    shell.run_cell("def show():\n    print(arr)")  # only defined, not run (a review)
    assert "JAX Device Kit" not in capsys.readouterr().out
    shell.run_cell("y = 1\nprint(arr)")
    out = capsys.readouterr().out
    assert "printing arr (float32[2, 2, 2" in out and "131,072 elements" in out, out[:500]
    assert "arr.reshape(-1, 2) first" in out and "jax-ml/jax#7301" in out
    assert len(str(np.asarray(shell.user_ns["arr"]).reshape(-1, 2))) < 2_000  # the fix
    assert len(str(np.asarray(shell.user_ns["arr"]))) > 500_000  # what it names


def test_a_memory_cell_s_lines_are_named_by_the_cell_s_own_number(shell, capsys):
    """IPython 9 counts a cell before it runs it, and %%memory's inner run_cell named the body
    by that count: "Cell In[3], line 4" in the cell shown as [2] (a new user's trial, IPython
    9.18.1). The body's code is named by the outer cell's number now, and the next cell's
    number is unchanged."""
    shell.run_cell("import sys", store_history=True)
    outer = shell.run_cell("%%memory\nname = sys._getframe().f_code.co_filename\n"
                           "label = get_ipython().compile.format_code_name(name)[1]",
                           store_history=True)
    assert outer.success
    assert shell.user_ns["label"] == f"In[{outer.execution_count}]", (
        shell.user_ns["label"], outer.execution_count)
    after = shell.run_cell("1", store_history=True)
    assert after.execution_count == outer.execution_count + 1
    assert "cache" not in vars(shell.compile)  # the compiler's own method again
    # a review: a helper defined in an earlier cell that runs the magic names the body after
    # the cell that called it; another tool's wrapper of the compiler's cache is put back
    shell.run_cell("def measured(body):\n    get_ipython().run_cell_magic('memory', '', body)",
                   store_history=True)
    wrapped = shell.compile.cache
    shell.compile.cache = lambda *a, **k: wrapped(*a, **k)
    mine = shell.compile.cache
    try:
        called = shell.run_cell("measured('import sys\\nname = sys._getframe().f_code."
                                "co_filename\\nlabel = get_ipython().compile."
                                "format_code_name(name)[1]')", store_history=True)
        assert called.success and shell.user_ns["label"] == f"In[{called.execution_count}]"
        assert shell.compile.cache is mine
    finally:
        del shell.compile.cache
