import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import transfers
from helpers._internal import jaxcompat
from helpers.transfers import D2D, D2H, H2D
from helpers.units import NOT_AVAILABLE
from tests.conftest import run_python


def test_jit_with_two_numpy_inputs_is_two_implicit_host_to_device():
    f = jax.jit(lambda a, b: a * b)
    a, b = np.ones((4, 5), np.float32), np.ones((4, 5), np.float32)
    f(a, b).block_until_ready()  # compile outside the trace
    with transfers.trace() as log:
        f(a, b).block_until_ready()
    assert log.count() == 2 and log.count(H2D, explicit=False) == 2
    assert all(t.source == "host" for t in log)


def test_every_call_copies_again():
    f = jax.jit(lambda a: a + 1)
    a = np.ones(8, np.float32)
    f(a)
    with transfers.trace() as log:
        for _ in range(3):
            f(a).block_until_ready()
    assert log.count(H2D) == 3


def test_uncommitted_array_moves_to_committed_device():
    committed = jax.device_put(np.ones(6, np.float32), jax.devices()[2])
    uncommitted = jnp.zeros(6, jnp.float32).block_until_ready()  # on cpu:0, uncommitted
    g = jax.jit(lambda x, y: x + y)
    with transfers.trace() as log:
        out = g(uncommitted, committed).block_until_ready()
    assert log.count(D2D) == 1
    (t,) = log.select(D2D)
    assert (t.source, t.destination, t.shape, t.dtype, t.nbytes, t.explicit) == (
        "cpu:0", "cpu:2", (6,), "float32", 24, False)
    assert out.devices() == {jax.devices()[2]}


def test_explicit_device_put_is_marked_explicit_with_size():
    with transfers.trace() as log:
        jax.device_put(np.zeros((3, 5), np.int16), jax.devices()[1]).block_until_ready()
        x = jnp.zeros(4).block_until_ready()
        jax.device_put(x, jax.devices()[3]).block_until_ready()
    h2d = log.select(H2D, explicit=True)
    assert [(t.shape, t.nbytes, t.destination) for t in h2d] == [((3, 5), 30, "cpu:1")]
    d2d = log.select(D2D, explicit=True)
    assert [(t.nbytes, t.destination) for t in d2d] == [(16, "cpu:3")]
    assert log.bytes(explicit=True) == 46


def test_jnp_array_of_numpy_is_implicit_host_to_device():
    with transfers.trace() as log:
        jnp.array(np.arange(10, dtype=np.uint16)).block_until_ready()
    (t,) = log.select(H2D)
    assert (t.explicit, t.shape, t.dtype, t.nbytes, t.destination) == (
        False, (10,), "uint16", 20, "cpu:0")


def test_no_transfers_in_pure_device_code():
    x = jnp.ones(100).block_until_ready()
    f = jax.jit(lambda v: v * v)
    f(x)
    with transfers.trace() as log:
        f(x).block_until_ready()
    assert len(log) == 0 and str(log) == "no transfers"


def test_summary_table_and_renderings():
    with transfers.trace() as log:
        jax.device_put(np.ones(4, np.float32), jax.devices()[1])
        jnp.asarray(np.ones(2, np.float32))
    rows = log.summary()
    expected = ([(H2D, True, 2, 24)] if jaxcompat.asarray_is_explicit()  # jax < 0.10.1
                else [(H2D, True, 1, 16), (H2D, False, 1, 8)])
    assert [(r["direction"], r["explicit"], r["count"], r["bytes"]) for r in rows] == expected
    assert "explicit" in str(log) and "<table>" in log._repr_html_()
    assert log.to_dict()["summary"] == rows


def test_stderr_restored_and_exception_propagates():
    fd_target = os.readlink("/proc/self/fd/2") if os.path.exists("/proc/self/fd/2") else None
    with pytest.raises(KeyError):
        with transfers.trace() as log:
            jnp.asarray(np.ones(3))
            raise KeyError("boom")
    assert log.finished and log.count(H2D) == 1
    if fd_target is not None:
        assert os.readlink("/proc/self/fd/2") == fd_target
    with transfers.trace() as again:  # usable again: the lock was released
        pass
    assert len(again) == 0


def test_nested_trace_is_refused_clearly():
    with transfers.trace():
        with pytest.raises(RuntimeError, match="already active"):
            with transfers.trace():
                pass


def test_other_stderr_lines_pass_through():
    code = ("import sys, numpy as np, jax.numpy as jnp\nfrom helpers import transfers\n"
            "with transfers.trace() as log:\n"
            "    sys.stderr.write('my own warning\\n')\n    jnp.asarray(np.ones(3))\n"
            "print(log.count())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"
    assert "my own warning" in proc.stderr and "guard_lib" not in proc.stderr


@pytest.mark.parametrize("line, expect", [
    ("W1121 10:23:48.1 4777 guard_lib.cc:125] host-to-device transfer: ",
     (H2D, None, NOT_AVAILABLE, "host", None)),
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(bfloat16[2,3]), "
     "dst_sharding=SingleDeviceSharding(device=CudaDevice(id=0), memory_kind=device)",
     (H2D, (2, 3), 12, "host", "cuda:0")),
    ("W1 guard_lib.cc:140] device-to-device transfer: aval=ShapedArray(float32[6]), "
     "sharding=SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device), "
     "dst_sharding=SingleDeviceSharding(device=CudaDevice(id=1), memory_kind=device)",
     (D2D, (6,), 24, "cpu:0", "cuda:1")),
    ("W1 guard_lib.cc:150] device-to-host transfer: aval=ShapedArray(uint16[], weak_type=True), "
     "sharding=SingleDeviceSharding(device=CudaDevice(id=0), memory_kind=device)",
     (D2H, (), 2, "cuda:0", "host")),
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(weird7[3])",
     (H2D, (3,), NOT_AVAILABLE, "host", None)),
    # a destination split over a mesh (one line per device): the bytes are each device's piece
    ("W1 guard_lib.cc:140] device-to-device transfer: aval=ShapedArray(float32[64,16]), "
     "dst_sharding=NamedSharding(mesh=Mesh('d': 2, 'm': 2, axis_types=(Auto, Auto)), "
     "spec=P('d',), memory_kind=device)", (D2D, (64, 16), 32 * 16 * 4, None, None)),
    ("W1 guard_lib.cc:140] device-to-device transfer: aval=ShapedArray(float32[64,16]), "
     "dst_sharding=NamedSharding(mesh=Mesh('d': 2, 'm': 2, axis_types=(Auto, Auto)), "
     "spec=PartitionSpec(None, ('d', 'm')), memory_kind=device)",
     (D2D, (64, 16), 64 * 4 * 4, None, None)),  # jax 0.8's wording, two axes on one dim
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(int8[8]), "
     "dst_sharding=NamedSharding(mesh=Mesh('d': 4), spec=P(), memory_kind=device)",
     (H2D, (8,), 8, "host", None)),  # replicated: each device gets the whole
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(int8[8]), "
     "dst_sharding=NamedSharding(mesh=Mesh('d': 4), spec=P(P.UNCONSTRAINED,), "
     "memory_kind=device)", (H2D, (8,), 8, "host", None)),  # unreadable: the whole, not a guess
    # XLA's tiles, as a pmap (0.8.0) or a jit of one logs its destination: counted 4x before
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(float32[4,256,1024]), "
     "dst_sharding=GSPMDSharding({devices=[4,1,1]<=[4]}, memory_kind=device)",
     (H2D, (4, 256, 1024), 256 * 1024 * 4, "host", None)),
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(float32[8,6]), "
     "dst_sharding=GSPMDSharding({devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}, "
     "memory_kind=device)", (H2D, (8, 6), 4 * 6 * 4, "host", None)),
    ("W1 guard_lib.cc:125] host-to-device transfer: aval=ShapedArray(float32[8,6]), "
     "dst_sharding=GSPMDSharding({devices=[2,1,2]<=[4] last_tile_dims={manual}}, "
     "memory_kind=device)", (H2D, (8, 6), 8 * 6 * 4, "host", None)),  # not read: the whole
])
def test_parser(line, expect):
    (t,), other = transfers.parse_guard_output(line + "\nunrelated line\n", marked=False)
    assert (t.direction, t.shape, t.nbytes, t.source, t.destination) == expect
    assert t.explicit is None and other == ["unrelated line"]


def test_select_rejects_unknown_direction():
    with pytest.raises(ValueError, match="direction"):
        transfers.TransferLog().count("sideways")


# --- which line made a copy, and why ---------------------------------------------------------
def _helper_that_copies(v):
    return jnp.asarray(v) * 2  # a NumPy array into a JAX operation


def test_each_copy_names_the_users_line_and_a_reason():
    import sys

    if sys.gettrace() is not None:
        pytest.skip("a tracer (coverage, a debugger) runs: the kit leaves lines unknown")
    f = jax.jit(lambda a, b: a + b)
    x = np.ones(3, np.float32)
    f(x, x)  # compiled first, so the calls take the fast path
    with transfers.trace() as log:
        f(x, x)
        jax.device_put(x)
        _helper_that_copies(np.ones(5, np.float32))
        jnp.arange(10)[3]
    by = {r["line"].split(": ", 1)[-1]: r for r in log.by_line()}
    assert by["f(x, x)"]["count"] == 2 and "jitted call" in by["f(x, x)"]["reasons"][0]
    (put,) = by["jax.device_put(x)"]["reasons"]
    assert put.startswith("jax.device_put (on the CPU backend an array aligned to 64 bytes")
    inner = by["return jnp.asarray(v) * 2  # a NumPy array into a JAX operation"]
    expected = ("jax.device_put" if jaxcompat.asarray_is_explicit()  # jax < 0.10.1
                else "jnp.array or jnp.asarray of host data: a copy")
    assert expected in inner["reasons"][0]  # the innermost line of user code
    (index,) = by["jnp.arange(10)[3]"]["reasons"]
    assert index.startswith("an index or slice bound") and "Inside jax.jit" in index
    assert all(r["line"].startswith("test_transfers.py:") for r in log.by_line())
    assert "made by:" in str(log) and "<th>why</th>" in log._repr_html_()


def test_slicing_outside_jit_copies_its_start_indices_and_inside_jit_nothing():
    """jax#26425: a[1:, :10] of an array on the device trips transfer_guard('disallow'); the
    kit said "a Python int used as an index", as if the user's int were at fault."""
    a = jnp.ones((16, 16))
    sliced = jax.jit(lambda a: a[1:, :10])
    sliced(a)  # compiled before the block
    with transfers.trace() as log:
        a[1:, :10]
    (row,) = log.by_line()
    assert row["count"] == 2 and row["reasons"][0].startswith("an index or slice bound")
    assert "for every dimension of the array" in row["reasons"][0]
    b = jnp.ones((16, 8))
    with transfers.trace() as one:  # one dimension sliced: a start index for each of two
        b[1:3]
    assert one.count("host->device") == 2
    with transfers.trace() as inside:  # the fix the kit gives
        sliced(a)
    assert inside.count() == 0


def test_a_copy_after_user_code_returned_names_the_calling_line():
    import sys

    if sys.gettrace() is not None:
        pytest.skip("a tracer (coverage, a debugger) runs: the kit leaves lines unknown")

    def body(a, b):
        return a + b  # traced on the first call, then returns before the arguments are copied

    f = jax.jit(body)
    x = np.ones(7, np.float32)
    with transfers.trace() as log:
        f(x, x)  # the call that copies
    lines = {r["line"].split(": ", 1)[-1] for r in log.by_line()}
    assert lines == {"f(x, x)  # the call that copies"}, lines


def test_lines_can_be_left_out_and_the_tracer_is_restored():
    import sys

    before = sys.gettrace()
    with transfers.trace(lines=False) as log:
        jax.device_put(np.ones(2))
    assert [t.line for t in log] == [""] and "made by" not in str(log)
    with transfers.trace() as log:
        jax.device_put(np.ones(2))
    assert sys.gettrace() is before


def test_a_creation_with_device_is_made_on_the_default_device_first():
    """jax-ml/jax#25396: jnp.zeros(n, device=d) builds the array on the default device, then
    copies it to d (jax 0.8.0 and 0.10.2); under jax.default_device(d) it is made on d."""
    elsewhere = jax.devices()[1]
    with transfers.trace() as log:
        made = jnp.zeros(1000, device=elsewhere)
        made.block_until_ready()
    (copy,) = log.select("device->device")
    assert made.devices() == {elsewhere} and copy.nbytes == 4000
    assert "made whole on the default device" in copy.reason and "default_device" in copy.reason
    with transfers.trace() as log, jax.default_device(elsewhere):
        jnp.zeros(1000).block_until_ready()
    assert log.count("device->device") == 0
    for make in (lambda: jnp.arange(1000, device=elsewhere),  # these copy explicitly
                 lambda: jnp.eye(30, device=elsewhere)):
        with transfers.trace() as log:
            make().block_until_ready()
        (copy,) = log.select("device->device")
        assert "made whole on the default device" in copy.reason


_GROWTH = """
import sys, numpy as np, jax, jax.numpy as jnp
def peak():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])
def at(n, offset):  # n float32s starting `offset` bytes past a 64-byte boundary
    buf = np.empty(n * 4 + 128, np.uint8)
    o = (-buf.ctypes.data) % 64 + offset
    return buf[o:o + n * 4].view(np.float32)
f = jax.jit(lambda a: a[0] + 1)
for offset in (0, 4):
    x = at(2**24, offset); x[...] = 1.0  # 64 MiB, touched
    f(at(2**24, offset)).block_until_ready()  # compiled at this shape; its copy freed
    shared = jax.device_put(x).unsafe_buffer_pointer() == x.ctypes.data
    open('/proc/self/clear_refs', 'w').write('5')
    before = peak()
    f(x).block_until_ready()
    print(offset, shared, (peak() - before) * 1024 / x.nbytes)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc's peak RSS")
def test_on_the_cpu_an_aligned_numpy_array_is_used_in_place_and_an_unaligned_one_copied():
    """What the reasons say of the CPU backend (jax-ml/jax#17702): a jitted call and
    jax.device_put use a NumPy array aligned to 64 bytes in place; one 4 bytes off is copied."""
    from tests.conftest import run_python

    proc = run_python(_GROWTH, env={"MALLOC_MMAP_THRESHOLD_": "65536", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    (a_off, a_shared, a_grew), (u_off, u_shared, u_grew) = rows
    assert a_shared == "True" and float(a_grew) < 0.2  # aligned: no copy of 64 MiB
    assert u_shared == "False" and float(u_grew) > 0.5  # 4 bytes off: a copy (0.8-2.0x seen)


def test_an_array_split_over_a_jits_in_shardings_counts_each_devices_piece():
    """jax#576's pattern today: a batch made whole on one device, then split by the step's
    in_shardings. JAX logs one line per device with the whole shape; each moves a quarter."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    step = jax.jit(lambda x: (x * 2).sum(axis=1), in_shardings=NamedSharding(mesh, P("d")))
    x = jnp.ones((64, 16))  # whole, on the default device
    with transfers.trace() as log:
        step(x).block_until_ready()
    moved = log.select(D2D)
    assert len(moved) == 4 and all(t.shard_shape == (16, 16) for t in moved)
    assert sum(t.nbytes for t in moved) == x.nbytes  # not four times the array
    assert "jax.device_put(x, sharding)" in moved[0].reason


def test_python_s_own_stderr_shows_at_once_inside_a_trace_not_when_it_ends():
    """A block that never ends (a forked worker hung: jax#9190) must not take JAX's warning
    with it: the trace captures fd 2 for the guard's lines, and Python's writes go around it.
    A stand-in for the hang: the process is killed inside the block."""
    from tests.conftest import run_python

    done = run_python(
        "import os, signal, sys, warnings\n"
        "import jax.numpy as jnp\n"
        "from helpers import transfers\n"
        "with transfers.trace():\n"
        "    jnp.ones(3) + 1\n"
        "    warnings.warn('os.fork() was called')\n"
        "    sys.stderr.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    assert done.returncode == -9 and "os.fork() was called" in done.stderr
    after = run_python(  # a handler made inside the block (logging.basicConfig, a progress bar)
        "import logging, sys\n"  # keeps the stream it found: it must still write afterwards
        "from helpers import transfers\n"
        "with transfers.trace():\n"
        "    logging.basicConfig()\n"
        "logging.getLogger('train').warning('step 1 done')\n")
    assert after.returncode == 0 and "step 1 done" in after.stderr
    assert "Logging error" not in after.stderr


def test_copies_onto_a_mesh_of_explicit_axes_keep_their_bytes_and_a_callbacks_pieces_are_named():
    """jax.make_mesh's axes are Explicit from jax 0.9: the guard writes each dimension's axes
    after it (float32[256@x,16]), which the kit did not parse, so every copy onto such a mesh
    lost its bytes and was called "an argument of a jitted call". make_array_from_callback with
    NumPy pieces, the way to put host data over a mesh, was called "copied each time it is
    passed" (sharding threads of 2026-11-27)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    host = np.ones((256, 16), np.float32)
    meshes = [Mesh(np.array(jax.devices()[:4]), ("x",)), jax.make_mesh((4,), ("x",))]
    for mesh in meshes:
        s = NamedSharding(mesh, P("x", None))
        with transfers.trace() as log:
            jax.device_put(host, s).block_until_ready()
            jax.make_array_from_callback(host.shape, s, lambda i: host[i]).block_until_ready()
        rows = {r["line"].split(": ", 1)[1]: r for r in log.by_line()}
        assert all(t.nbytes == host.nbytes // 4 for t in log.select(H2D)), log.transfers
        made = " ".join(rows["jax.make_array_from_callback(host.shape, s, lambda i: host[i])"
                             ".block_until_ready()"]["reasons"])
        assert "piece of the array copied to it once" in made and "each time" not in made
    assert jaxcompat.parse_guard_line(
        "host-to-device transfer: aval=ShapedArray(float32[8@(x,y),4@z,6]), dst_sharding=x"
    )["shape"] == (8, 4, 6)


def test_the_stream_onto_the_real_stderr_warns_of_nothing_at_exit():
    """trace() keeps one stream onto the real stderr for Python's writes while fd 2 is
    captured; `python -W always` printed "ResourceWarning: unclosed file" at exit (a trial).
    The stream is made with closefd=False: it never closes fd 2's duplicate, and warns of
    nothing."""
    import warnings

    warnings.simplefilter("ignore")  # (only the child's warnings are read)
    done = run_python("import warnings\nwarnings.simplefilter('always')\n"
                      "from helpers import transfers\nimport jax.numpy as jnp\n"
                      "x = jnp.ones(3)\nwith transfers.trace() as log:\n    y = x + 1\n"
                      "print('traced', log.count('host->device') >= 0)")
    assert done.returncode == 0 and "traced True" in done.stdout, done.stderr
    assert "unclosed file" not in done.stderr
    # a logging handler made inside the block keeps the stream: an atexit function registered
    # before the kit's still logs through it (closing it at exit lost the line: a review)
    logged = run_python("import atexit, logging\nlog = logging.getLogger('train')\n"
                        "atexit.register(lambda: log.warning('checkpoint saved'))\n"
                        "from helpers import transfers\nimport jax.numpy as jnp\n"
                        "x = jnp.ones(3)\nwith transfers.trace():\n"
                        "    logging.basicConfig(level=logging.INFO)\n    y = x + 1\n")
    assert "WARNING:train:checkpoint saved" in logged.stderr, logged.stderr
    assert "Logging error" not in logged.stderr


def test_a_callbacks_copy_made_on_xlas_own_thread_is_seen():
    """A jax.pure_callback in a program over 4 devices runs on a thread of XLA's ("Dummy-3"),
    where the block's jax.transfer_guard, set for the caller's thread only, does not reach: the
    trace saw no copy, or saw it only where XLA happened to use the caller's thread (a trial).
    The kit now sets the guard on that thread for the callback's copy, and only there (where
    no level is set for it or for the process)."""
    import threading

    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    threads = []

    def host(x):
        threads.append(threading.current_thread())
        return np.sin(np.asarray(x))

    f = jax.jit(jax.vmap(lambda x: jax.pure_callback(
        host, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="broadcast_all")))
    xs = jax.device_put(jnp.ones((8, 1000)), NamedSharding(jax.make_mesh((4,), ("d",)), P("d")))
    f(xs).block_until_ready()
    for _ in range(3):
        threads.clear()
        with transfers.trace() as log:
            f(xs).block_until_ready()
        made = [t for t in log if t.made_by == "jax.pure_callback"]
        assert [t.nbytes for t in made] == [xs.nbytes], (threads, log.transfers)
    assert threads and threads[0] is not threading.main_thread()  # the case itself
    assert jax.config.jax_transfer_guard_host_to_device is None  # nothing left set


def test_liesel_282_a_debug_callbacks_copies_are_named_as_its_own_and_gating_it_cuts_them():
    """liesel#282: a progress bar updated by jax.debug.callback on every iteration of a
    compiled loop. JAX device_puts each call's arguments to the CPU (debug_callback_impl), and
    the kit called those copies "jax.device_put" at a line that has none. Gated by lax.cond to
    every 10th step, the callback runs, and copies, 5 times instead of 50."""
    calls = []

    def update(i):
        calls.append(int(i))

    def every(c):
        i, x = c
        jax.debug.callback(update, i)
        return i + 1, x - 0.01 * jnp.sin(x)

    def gated(c):  # the fix the kit names
        i, x = c
        jax.lax.cond(i % 10 == 0, lambda: jax.debug.callback(update, i), lambda: None)
        return i + 1, x - 0.01 * jnp.sin(x)

    x = jnp.ones(16)
    logs = {}
    for name, body in (("every", every), ("gated", gated)):
        f = jax.jit(lambda x, body=body: jax.lax.while_loop(lambda c: c[0] < 50, body,
                                                            (0, x))[1])
        f(x).block_until_ready()
        jax.effects_barrier()
        calls.clear()
        with transfers.trace() as log:
            f(x).block_until_ready()
            jax.effects_barrier()
        logs[name] = (log, len(calls))
    log, n = logs["every"]
    made = [t for t in log if t.made_by == "jax.debug.callback"]
    assert n == 50 and len(made) == 50 and all(t.explicit for t in made)
    (row,) = log.by_line()
    assert row["count"] == 50 and row["line"].endswith("f(x).block_until_ready()")
    (why,) = row["reasons"]
    assert "jax.device_put" not in why
    assert "the copy jax.debug.callback (or jax.debug.print, which calls it) makes" in why
    assert "not a device_put of yours" in why and "jax.lax.cond(i % k == 0" in why
    assert "liesel-devs/liesel#282" in why and "the copy jax.debug.callback" in str(log)
    log, n = logs["gated"]
    assert n == 5 and sum(t.made_by == "jax.debug.callback" for t in log) == 5
    with transfers.trace() as log:  # the user's own device_put is still called so
        jax.device_put(np.ones(3, np.float32)).block_until_ready()
    assert [(t.made_by, t.reason.split(" (")[0]) for t in log] == [("", "jax.device_put")]


def test_jax_37830_a_refilled_numpy_buffer_changes_the_array_put_and_np_copy_keeps_it():
    """jax#37830: a loader refills one NumPy buffer after each device_put; on the CPU the put
    array shares an aligned buffer (and copies an unaligned one after the call returns: 5 to 8
    of 8 runs corrupted in the datafeed helper's runs, jax 0.8.0 and 0.10.2), so batches
    already queued change. may_alias=False did not help there; np.copy did (0 of 8)."""
    from helpers import feeding

    buf = feeding.aligned_empty((64, 64), np.float32)
    buf[...] = 1.0
    with transfers.trace() as log:
        x = jax.device_put(buf)
    (put,) = log.select("host->device")
    assert put.reason.startswith("jax.device_put (on the CPU backend an array aligned")
    assert "refilling that NumPy buffer after the put can change the array put" in put.reason
    assert "jax-ml/jax#37830; may_alias=False did not prevent it" in put.reason
    assert "jax.device_put(np.copy(buf))" in put.reason
    y = jax.device_put(buf, may_alias=False)
    z = jax.device_put(np.copy(buf))  # the fix it names
    buf[...] = 42.0  # the loader's next batch
    assert float(x.mean()) == 42.0 and float(y.mean()) == 42.0  # what the kit says
    assert float(z.mean()) == 1.0
    with transfers.trace() as log:
        converted = jnp.array(buf)
    reason = log.by_line()[0]["reasons"][0]
    assert "np.copy" in reason and "jax-ml/jax#37830" in reason  # either version's reason
    converted.block_until_ready()
    buf[...] = 7.0  # refilled after block_until_ready: the copy is kept
    assert float(converted.mean()) == 42.0


def test_keras_20007_yield_jnp_asarray_is_named_as_a_conversion():
    """keras#20007's data adapter yields jnp.asarray(batch): the kit's line pattern took no
    `yield`, and the copy was called "an argument of a jitted call"."""
    import sys

    if sys.gettrace() is not None:
        pytest.skip("a tracer (coverage, a debugger) runs: the kit leaves lines unknown")
    host = [np.ones((32, 8), np.float32) for _ in range(2)]

    def batches():
        for b in host:
            yield jnp.asarray(b)

    with transfers.trace() as log:
        out = list(batches())
    by = {r["line"].split(": ", 1)[-1]: r for r in log.by_line()}
    (reason,) = by["yield jnp.asarray(b)"]["reasons"]
    expected = ("jax.device_put" if jaxcompat.asarray_is_explicit()  # jax < 0.10.1
                else "jnp.array or jnp.asarray of host data: a copy")
    assert reason.startswith(expected) and "jitted call" not in reason
    assert [float(b.sum()) for b in out] == [256.0, 256.0]


def test_flax_948_numpy_pieces_fed_to_a_pmap_are_not_told_to_be_put_once():
    """flax#948's fixed loop feeds NumPy to the pmap, a new batch each step. The kit said
    "jax.device_put it once": followed each step, the batch lands whole on cpu:0 and is split
    from there, 2.42 against 1.12 ms a step (datafeed helper, jax 0.10.2 CPU)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    step = jax.pmap(lambda x: (x * 2.0).sum())
    host = np.ones((4, 16, 16), np.float32)
    step(host).block_until_ready()
    with transfers.trace() as log:
        step(host).block_until_ready()
    reasons = {t.reason for t in log}
    assert log.count("host->device") == 4 and len(reasons) == 1
    (reason,) = reasons
    assert reason.startswith("each device's piece of a NumPy array copied to it from the host")
    assert "the one copy a batch new each step needs" in reason and "google/flax#948" in reason
    assert "jax.device_put it once" not in reason
    with transfers.trace() as put_first:  # the old advice: whole on cpu:0, split from there
        step(jax.device_put(host)).block_until_ready()
    assert put_first.count("device->device") >= 3
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    kept = jax.device_put(host, NamedSharding(mesh, P("d")))  # passed again: put once so
    step(kept).block_until_ready()
    with transfers.trace() as again:
        step(kept).block_until_ready()
    assert again.count() == 0


def test_jax_20418_jnp_load_with_mmap_mode_is_named_with_the_memmap_fix(tmp_path):
    """jax-ml/jax#20418: jnp.load(path, mmap_mode='r+') to stay within memory; the result is a
    jax.Array with no flush(), and on jax 0.10.2 and 0.12 the whole file is copied into memory
    (a 64 MiB file: +65 MiB anonymous in the helper's run; 0 on 0.8.0). The copy is checked
    by a write to the file that the array does not see (an RSS count was not reliable: CI's
    allocator reused the first load's freed pages). The kit said "an argument of
    a jitted call" (0.10.2) or "jax.device_put" (0.8.0). Now the line is named with the cause
    and hawkinsp's fix, which is run here: the memmap, put in place, written back through."""
    if sys.gettrace() is not None:
        pytest.skip("a tracer (coverage, a debugger) runs: the kit leaves lines unknown")
    path = str(tmp_path / "params.npy")
    np.save(path, np.ones((2048, 4096), np.float32))  # 32 MiB
    jnp.zeros(1).block_until_ready()
    with transfers.trace() as log:
        p = jnp.load(path, mmap_mode="r+")
    (row,) = log.by_line()
    assert row["line"].endswith('p = jnp.load(path, mmap_mode="r+")'), row
    (reason,) = row["reasons"]
    assert reason.startswith("jnp.load(..., mmap_mode=...) returns a jax.Array, not a memmap")
    assert "on jax 0.10.2 and 0.12.0 copies the whole file into memory" in reason
    assert "jax-ml/jax#20418" in reason and "jax.device_put(m)" in reason
    assert "m[...] = np.asarray(new); m.flush()" in reason
    assert not hasattr(p, "flush")
    p.block_until_ready()
    w = np.load(path, mmap_mode="r+")  # a write to the file, through a second mapping
    w[0, 0] = 5.0
    w.flush()
    del w
    if jax.__version__.startswith("0.8."):
        assert float(p[0, 0]) == 5.0  # the mapping, used in place
    else:
        assert float(p[0, 0]) == 1.0  # the whole file, copied: the write is not seen
    del p
    m = np.load(path, mmap_mode="r+")  # the fix
    pj = jax.device_put(m)
    assert pj.unsafe_buffer_pointer() == m.ctypes.data  # the mapping, used in place
    m[...] = np.asarray(pj * 2)
    m.flush()
    del m, pj
    assert float(np.load(path)[0, 1]) == 2.0  # written back to the file


def test_pylcm_316_a_callback_in_a_scan_gets_the_loop_fix_and_no_vmap_paragraph():
    """A review of OpenSourceEconomics/pylcm#316's words in transfers: every host callback's
    copy was told "and under jax.vmap once per element ... call it once, outside the vmap",
    a jax.debug.callback in a lax.scan with no vmap included, ahead of the loop's fix. The
    paragraph is there only where the program the callback runs in has it under jax.vmap
    (read from its jaxpr: a name stack with vmap(, or the loop vmap made of an io_callback)."""
    from jax.experimental import io_callback

    def body(c, x):
        jax.debug.callback(lambda v: None, c)
        return c + x, None

    def io_body(c, x):
        io_callback(lambda v: None, None, c)
        return c + x, None

    xs = jnp.ones((5, 4))
    reasons = {}
    for name, f in (
            ("scan", jax.jit(lambda xs: jax.lax.scan(body, jnp.zeros(4), xs)[0])),
            ("vmap", jax.jit(jax.vmap(lambda c: body(c, c)[0]))),
            ("io scan", jax.jit(lambda xs: jax.lax.scan(io_body, jnp.zeros(4), xs)[0])),
            ("io vmap", jax.jit(jax.vmap(lambda c: io_body(c, c)[0])))):
        f(xs).block_until_ready()
        jax.effects_barrier()
        with transfers.trace() as log:
            f(xs).block_until_ready()
            jax.effects_barrier()
        made = [t for t in log if t.made_by]
        assert len(made) == 5, name  # one copy a call: 5 iterations, or 5 elements
        reasons[name] = {t.reason for t in made}
    (scan,) = reasons["scan"]
    assert "under jax.vmap" not in scan and "outside the vmap" not in scan
    assert "in a loop body it runs, and copies, on every iteration. To report progress, call " \
        "it every k steps: jax.lax.cond(i % k == 0" in scan
    (io_scan,) = reasons["io scan"]
    assert "under jax.vmap" not in io_scan and "jax.lax.cond(i % k == 0" in io_scan
    for name in ("vmap", "io vmap"):
        (why,) = reasons[name]
        assert "under jax.vmap once per element" in why and "outside the vmap" in why
        assert "OpenSourceEconomics/pylcm#316" in why


def test_an_uncommitted_array_off_the_default_device_is_named_though_the_guard_logs_no_copy():
    """The blog post "JAX: commitment issues" (gilesthomas.com, 2026-06): an array made under
    ``jax.default_device(cpu)`` stays uncommitted, so a lookup into it after the block runs on
    the default device and first copies the whole array there. JAX's transfer guard logs no
    such copy, and the trace showed only the index scalars, the same before and after the fix.
    (The guard logs it at the operation's first call only: later calls take jit's fast path.)
    The log now names the array, where it is, and the fix; committed, the note goes."""
    there = jax.devices()[1]
    with jax.default_device(there):
        table = jnp.ones((256, 1024), jnp.float32).block_until_ready()  # 1 MiB, uncommitted
    assert not table.committed and table.devices() == {there}
    with transfers.trace() as first:
        table[2].block_until_ready()
    assert [t.nbytes for t in first.select(D2D)] == [2**20]  # the first call logs the copy
    with transfers.trace() as log:
        row = table[3].block_until_ready()
    assert row.devices() == {jax.devices()[0]}  # it ran on the default device: a whole copy
    assert log.count(D2D) == 0  # which jit's fast path makes unlogged
    (note,) = log.unlogged
    assert "float32[256, 1024], 1.00 MiB on cpu:1; the default is cpu:0" in note
    assert "jax.device_put(x, jax.devices('cpu')[1])" in note and note in str(log)
    import weakref

    with jax.default_device(there):
        gone = jnp.zeros((512, 1024), jnp.float32).block_until_ready()  # 2 MiB, the largest
    ref = weakref.ref(gone)
    with transfers.trace() as dropped:
        del gone  # freed in the block, as without the trace
        assert ref() is None
    (kept,) = dropped.unlogged
    assert kept.startswith("1 uncommitted array") and "float32[256, 1024]" in kept
    table = jax.device_put(table, there)  # the fix it names
    with transfers.trace() as log:
        row = table[3].block_until_ready()
    assert row.devices() == {there} and log.unlogged == ()  # runs where the array is


def test_aimz_170_a_dataset_converted_whole_up_front_is_named_with_keeping_it_numpy():
    """markean/aimz#170: ArrayDataset(to_jax=True) converted every array with jnp.asarray at
    construction, which "doubles memory usage"; the fix (#171) keeps NumPy and puts each batch
    as it is loaded. The trace called the conversion "the one copy a batch new each step
    needs" (the line, a generator, was not read as a conversion). It now names the up-front
    conversion and the fix; the copy is real (its own buffer), and the fix holds one batch."""
    from helpers import memory

    X = np.ones((2 * 2**20, 4), np.float32)  # 32 MiB
    y = np.zeros(2 * 2**20, np.float32)  # 8 MiB
    with transfers.trace() as log:
        arrays = tuple(jnp.asarray(a) for a in (X, y))
        jax.block_until_ready(arrays)
    (row,) = log.by_line()
    said = " ".join(row["reasons"])
    old = jaxcompat.asarray_is_explicit()  # jax < 0.10.1: asarray was a device_put
    assert ("jax.device_put" if old else "jnp.array or jnp.asarray of host data") in said
    assert "batch new each step" not in said and "markean/aimz#170" in said
    assert "keep it as NumPy and put each batch on the device as it is used" in said
    if not old:  # a copy, so held twice (0.8.0 on the CPU may alias an aligned array)
        assert arrays[0].unsafe_buffer_pointer() != X.ctypes.data
    before = sum(memory.live_bytes_by_device().values())
    del arrays
    freed = before - sum(memory.live_bytes_by_device().values())
    assert freed == X.nbytes + y.nbytes
    for i in range(0, len(X), 2**18):  # the fix: one batch on the device at a time
        batch = jax.device_put(X[i:i + 2**18])
        assert sum(memory.live_bytes_by_device().values()) <= before - freed + batch.nbytes


def test_a_conversion_on_jnp_asarrays_fast_path_is_sized_from_the_array_it_names():
    """After its first call, jnp.asarray's own jit copies host data with no shape in JAX's log
    (jax 0.10.2, 0.12.0.1): a new user's trace of `y = jnp.asarray(x)` (the loading of Stack
    Overflow 79387724, "Serialization in JAX") showed "?" bytes and, for a 32 MiB array, no
    word of the data held twice. The line names the array, so its size is read as the line
    starts; a value the line computes is not guessed."""
    host = np.ones((2 * 2**20, 4), np.float64)  # 64 MiB of float64: JAX makes 32 of float32
    with transfers.trace():  # each has run for this shape under the guard: its fast path next
        jax.block_until_ready((jnp.asarray(host), jnp.array(host)))

    def load():
        return np.ones((2 * 2**20, 4), np.float64)

    put = jaxcompat.asarray_is_explicit()  # jax < 0.10.1: asarray was a put, with a shape
    for convert in ("asarray", "array"):
        with transfers.trace() as log:
            if convert == "asarray":
                y = jnp.asarray(host)
            else:
                y = jnp.array(host)
            z = jnp.asarray(load())
            jax.block_until_ready((y, z))
        rows = {"named" if "(host)" in r["line"] else "computed": r for r in log.by_line()}
        named, computed = rows["named"], rows["computed"]
        assert named["bytes"] == y.nbytes == 32 * 2**20
        if not put:  # jax >= 0.10.1: a copy, held twice
            assert "keep it as NumPy and put each batch" in " ".join(named["reasons"])
        (of_host,) = [t for t in log if "(host)" in t.line]
        (of_load,) = [t for t in log if "load()" in t.line]
        if not (convert == "asarray" and put):
            assert of_host.raw == "host-to-device transfer:"  # JAX gave no shape
        if not put:
            assert of_load.raw == "host-to-device transfer:"
            assert computed["bytes"] == 0  # a value the line computes: not guessed
        del y, z


def test_only_a_line_that_is_one_conversion_of_a_name_is_sized_and_no_user_code_runs():
    """A review of the sizing above: a conditional, a tuple of two and a dtype= were sized from
    the first name (8 MiB said for a 256 KiB copy), and an object's own __getattr__ ran (and
    raised) when its name had no __dict__. Such lines are not sized, and nothing is run."""
    from helpers.transfers import _CONVERTS_NAME

    assert _CONVERTS_NAME.search("y = jnp.asarray(x)").group(1) == "x"
    assert _CONVERTS_NAME.search("return jnp.array(self.data)").group(1) == "self.data"
    for line in ("y = jnp.asarray(x) if use_x else jnp.asarray(w)",
                 "a, b = jnp.asarray(x), jnp.asarray(z)", "y = jnp.asarray(w, dtype=jnp.bfloat16)",
                 "ys = [jnp.asarray(b) for b in batches]"):
        assert _CONVERTS_NAME.search(line) is None, line

    class Slotted:
        __slots__ = ("data",)

        def __getattr__(self, name):
            raise KeyError(name)

    holder = Slotted()
    holder.data = np.ones((64, 64), np.float32)
    with transfers.trace():
        y = jnp.array(holder.data)
    assert y.shape == (64, 64)


# --- reads back to the host on the CPU, which JAX never logs (QuEraComputing/tsim#149) -------
def test_tsim_149_numpy_joining_a_list_of_cpu_arrays_is_named_with_the_join_on_the_device():
    """A new user's trial: np.concatenate of a list of device results printed "no transfers" on
    the CPU (a read there lends host memory and JAX logs nothing), and the user took it as
    free; on a GPU each array is a copy of its own. The line, the count and the bytes now, and
    the thread's fix, run: one read of one array, the same values."""
    batches = [jnp.full((100, 8), float(i)) for i in range(12)]
    jax.block_until_ready(batches)
    with transfers.trace() as log:
        result = np.concatenate(batches)
    assert len(log) == 0  # JAX logged nothing, as before
    ((line, row),) = log.cpu_reads.items()
    assert "np.concatenate(batches)" in line
    assert row == {"runs": 1, "arrays": 12, "bytes": 12 * 100 * 8 * 4}
    (note,) = log.unlogged
    assert note.startswith("12 reads of arrays back to the host (37.50 KiB)"), note
    assert "Join them on the device first (jnp.concatenate" in note and "tsim#149" in note
    assert str(log).startswith("no transfers\n! 12 reads")
    assert log.to_dict()["cpu_reads"] == log.cpu_reads

    with transfers.trace() as fixed:
        joined = jnp.concatenate(batches)
        again = np.asarray(joined)
    assert [r["arrays"] for r in fixed.cpu_reads.values()] == [1]
    (note,) = fixed.unlogged
    assert note.startswith("1 read of an array back to the host (37.50 KiB) at ") and \
        "Join" not in note, note
    np.testing.assert_array_equal(again, result)


def test_a_read_in_a_loop_counts_each_array_once_and_a_new_one_each_step():
    """JAX copies an array back once (the host copy is kept): the same value read in a loop
    is one read; a new loss each step is one read a step, with the every-n-steps advice."""
    loss = jnp.float32(2.0)
    with transfers.trace() as log:
        for _ in range(4):
            value = float(loss)
    assert [r["arrays"] for r in log.cpu_reads.values()] == [1] and value == 2.0
    losses = [jnp.float32(i) for i in range(5)]
    with transfers.trace() as log:
        for step_loss in losses:
            print(step_loss.item(), end=" ")
    ((line, row),) = log.cpu_reads.items()
    assert row["runs"] == 5 and row["arrays"] == 5 and "step_loss.item()" in line
    assert "over 5 runs of the line" in log.unlogged[0]
    assert "read them every n steps" in log.unlogged[0]


def test_no_read_note_for_device_code_numpy_data_or_untraced_lines():
    """Nothing read, a NumPy array read, or lines=False: no note (no guess from a name)."""
    host = np.ones(4)
    x = jnp.ones(4)
    with transfers.trace() as log:
        np.asarray(host)
        y = (x * 2).block_until_ready()
    with transfers.trace(lines=False) as quiet:
        np.asarray(y)
    assert log.cpu_reads == {} and log.unlogged == () and quiet.unlogged == ()


def test_several_reads_back_from_one_line_on_a_gpu_get_the_join_advice():
    """On a GPU the guard logs each array read back (jaxlib keeps the host copy, so once an
    array): a line that logged several gets tsim#149's fix in its reasons. The log lines are a
    GPU's, as test_parser has them: from the thread, not yet run on a GPU."""
    line = ("W1 guard_lib.cc:150] device-to-host transfer: aval=ShapedArray(float32[100,8]), "
            "sharding=SingleDeviceSharding(device=CudaDevice(id=0), memory_kind=device)")
    marker = transfers._LINE + "run.py:7: out = np.concatenate(results)>>"
    text = "\n".join([marker, *[line] * 3, transfers._LINE + "run.py:8: print(x)>>", line])
    found, _ = transfers.parse_guard_output(text + "\n", marked=False)
    log = transfers.TransferLog()
    log._transfers = tuple(found)
    rows = {r["line"]: r for r in log.by_line()}
    joined = rows["run.py:7: out = np.concatenate(results)"]
    assert joined["count"] == 3 and any(
        r.startswith("3 arrays read back one copy at a time: join them") for r in joined["reasons"])
    assert not any("join them" in r for r in rows["run.py:8: print(x)"]["reasons"])


def test_simplexity_70_a_read_that_feeds_a_torch_tensor_is_named_with_dlpack():
    """Astera-org/simplexity#70: jax_to_torch fell back to torch.from_numpy(np.asarray(x))
    .to("cuda") (jax.dlpack.to_dlpack is gone), device to host to device for every batch. The
    kit told the line "join them on the device first, then read once" (a trial: 8 reads to 2,
    the same 4 MiB through the host). Now DLPack, which shares the buffer (PR #71). torch is
    not installed here: a stand-in object names the call, and NumPy's own DLPack import shows
    the hand-over shares the buffer on the CPU. The GPU row: from the thread, not yet run."""
    import types

    torch = types.SimpleNamespace(  # a stand-in: torch is not installed
        from_numpy=lambda a: types.SimpleNamespace(to=lambda device: a))
    batches = [jnp.full((64, 8), float(i)) for i in range(4)]
    jax.block_until_ready(batches)
    with transfers.trace() as log:
        for x in batches:
            torch.from_numpy(np.asarray(x)).to("cuda")
    (note,) = log.unlogged
    assert "torch.from_dlpack(x)" in note and "simplexity#70" in note and "Join" not in note
    assert not hasattr(jax.dlpack, "to_dlpack")  # the thread's call, gone: pass the array
    shared = np.from_dlpack(batches[1])  # a DLPack consumer takes the jax.Array itself
    assert shared.__array_interface__["data"][0] == \
        batches[1].unsafe_buffer_pointer()  # the same buffer: no copy
    line = ("W1 guard_lib.cc:150] device-to-host transfer: aval=ShapedArray(float32[64,8]), "
            "sharding=SingleDeviceSharding(device=CudaDevice(id=0), memory_kind=device)")
    marker = transfers._LINE + "run.py:9: t = torch.from_numpy(np.asarray(x)).cuda()>>"
    found, _ = transfers.parse_guard_output("\n".join([marker, line, line]) + "\n",
                                            marked=False)
    gpu = transfers.TransferLog()
    gpu._transfers = tuple(found)
    (row,) = gpu.by_line()
    assert any("torch.from_dlpack(x)" in r for r in row["reasons"])
    assert not any("join them" in r for r in row["reasons"])
    for kept in ("torch.save(torch.tensor(np.asarray(w)), path)",  # kept on the host: a
                 "writer.add_scalar('loss', torch.tensor(float(loss)), i)"):  # review
        assert not transfers._HANDED_OVER.search(kept), kept
    with transfers.trace() as plain:  # a read that feeds NumPy alone keeps the join advice
        np.concatenate(batches)
    assert "Join them" in plain.unlogged[0] and "dlpack" not in plain.unlogged[0]


class _EpochLoader:  # aimz#279's loader: each epoch's order made on the device, read back
    def __init__(self, key, n):
        self.key, self.n = key, n

    def __iter__(self):
        self.key, sub = jax.random.split(self.key)
        perm = jax.random.permutation(sub, self.n)
        perm = np.asarray(perm)
        rows = np.ones((self.n, 16), np.float32)
        for i in range(0, self.n, 256):
            yield rows[perm[i:i + 256]]


def test_a_read_at_one_line_each_epoch_counts_each_epoch_s_array():
    """Each epoch's permutation, made on the device and read back at one line (markean/aimz
    #279's loader, in a new user's trial): counted once for three epochs, the freed array's id
    reused by the next. Three reads now."""
    step = jax.jit(lambda w, x: w + jnp.sum(x))
    loader, w = _EpochLoader(jax.random.PRNGKey(0), 4096), jnp.float32(0)
    with transfers.trace() as log:
        for _ in range(3):
            for batch in loader:
                w = step(w, batch)
    ((line, row),) = log.cpu_reads.items()
    assert "perm = np.asarray(perm)" in line and row == {"runs": 3, "arrays": 3,
                                                          "bytes": 3 * 4096 * 4}, row


def _pad_batch(x, rows):  # aimz#174's pad_array: jnp.pad of a NumPy batch, every batch
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def test_aimz_174_jnp_pad_of_numpy_batches_is_named_with_numpy_s_pad():
    """markean/aimz#174 (a new user's trial): jnp.pad of each NumPy batch was described as "an
    argument of a jitted call", a jit the user never wrote. It names jnp.pad and the thread's
    fix, np.pad and one put, which gives the same batches."""
    batches = [np.ones((8, 4), np.float32) * i for i in range(6)]
    for b in batches[:2]:
        _pad_batch(b, 8)  # warm: later calls take jit's fast path, as in a loader's loop
    with transfers.trace() as log:
        padded = [_pad_batch(b, 8) for b in batches]
    rows = [r for r in log.by_line() if "jnp.pad(x" in r["line"]]
    assert rows and any("passed to jnp.pad, which JAX runs as a jitted function of its own"
                        in reason for reason in rows[0]["reasons"]), log.by_line()
    assert any("np.pad, and put the result once" in r and "aimz#174" in r
               for r in rows[0]["reasons"])
    fixed = [jax.device_put(np.pad(b, ((0, 0), (0, 0)))) for b in batches]
    for a, b in zip(padded, fixed, strict=True):
        np.testing.assert_array_equal(a, b)
    assert transfers._jnp_functions("y = step(params, jnp.ones(3))") == []  # a call of yours
    assert transfers._jnp_functions("return jnp.asarray(x)") == []  # named on its own
    # a review: a number passed (it is what is copied), two jnp calls, a creation: none named;
    # a dotted function keeps its whole name, and NumPy's is offered only where it exists
    for line in ("y = jnp.maximum(x, 1.0)", "y = jnp.where(x > 3.0, x, 0.0)",
                 "loss = jnp.sum(jnp.arange(100.0) * i)", "z = [jnp.ones(10) for _ in k]"):
        assert transfers._jnp_functions(line) == [], line
    assert transfers._jnp_functions("n = jnp.linalg.norm(v)") == ["linalg.norm"]
    assert transfers._numpy_has("linalg.norm") and not transfers._numpy_has("norm")


def test_an_element_read_in_a_comprehension_is_named_as_its_indices_not_a_jit_argument():
    """A new user's trial: `later = [float(b[0, 0]) for b in batches]` was told "an argument of
    a jitted call: a NumPy array or a Python number", with no jitted call on the line: the
    copies are JAX's start indices for the element read."""
    batches = [jnp.full((4, 4), float(i)) for i in range(3)]
    jax.block_until_ready(batches)
    with transfers.trace() as log:
        later = [float(b[0, 0]) for b in batches]
    assert later == [0.0, 1.0, 2.0]
    rows = [r for r in log.by_line() if "float(b[0, 0])" in r["line"]]
    reasons = " ".join(x for r in rows for x in r["reasons"])
    assert rows and "an index or slice bound" in reasons, log.by_line()
    assert "an argument of a jitted call" not in reasons
    # a review: a jit stored in a dict, a NumPy index array, a comment: not an element's read
    for line in ('x.py:15: out = steps["train"](b)', "x.py:17: picked = table[ix]",
                 "x.py:3: y = f(x[0])  # see float(z[1])"):
        assert not transfers._reason("host->device", False, None, None, line).startswith(
            "an index or slice bound"), line
