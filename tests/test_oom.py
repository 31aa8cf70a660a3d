import contextlib
import json

import jax
import pytest

from helpers import datasets, oom
from helpers.errors import FileError
from helpers.units import NOT_AVAILABLE
from tests.conftest import run_cli
from tests.test_preflight_file import write_raw


# --- reproduction (CPU stand-in; the GPU path runs for real in tests marked gpu) --------
@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("oom") / "tokens.safetensors"
    datasets.write_tokens(path, 32 << 20)  # 64 MiB
    return path


def test_stand_in_reproduces_jax_resource_exhausted(small_file):
    r = oom.reproduce(small_file, mode="cpu")
    assert r.stand_in and not r.ok and r.platform == "cpu (stand-in)"
    assert r.error_type == "jax.errors.JaxRuntimeError"
    assert r.error_message.startswith("RESOURCE_EXHAUSTED: Out of memory")
    assert r.requested_bytes == 64 << 20 and r.budget_bytes == 32 << 20
    assert r.exit_code == 3 and "STAND-IN" in str(r)


def test_stand_in_fix_succeeds_with_nothing_on_the_accelerator(small_file):
    r = oom.reproduce(small_file, mode="cpu", fixed=True)
    assert r.ok and r.landed_on == "cpu:1" and r.accelerator_bytes_added == 0
    assert r.exit_code == 0 and "default_device" in r.attempt


def test_reproduce_bad_input(tmp_path, small_file):
    with pytest.raises(FileError, match="no such file"):
        oom.reproduce(tmp_path / "nope", mode="cpu")
    with pytest.raises(ValueError, match="larger than this machine"):
        oom.reproduce(small_file, mode="cpu", budget="100 TiB")
    with pytest.raises(ValueError, match="cannot read"):
        oom.reproduce(small_file, mode="cpu", budget="lots")
    with pytest.raises(ValueError, match="mode"):
        oom.reproduce(small_file, mode="quantum")
    no_tokens = write_raw(tmp_path / "w.safetensors",
                          {"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    with pytest.raises(FileError, match="no tensor named 'tokens'"):
        oom.reproduce(no_tokens, mode="cpu")


@pytest.mark.gpu
def test_real_cuda_oom_and_fix(tmp_path):
    from helpers import gpu

    with pytest.raises(ValueError, match="cannot run out of memory"):  # 64 MiB: too small
        oom.reproduce(datasets.write_tokens(tmp_path / "s.safetensors", 32 << 20).path,
                      mode="gpu")
    n = int(0.02 * gpu.total_bytes()) // 2  # a file of 2% of the card: 4x the smallest pool
    path = datasets.write_tokens(tmp_path / "t.safetensors", n).path
    r = oom.reproduce(path, mode="gpu")
    assert not r.stand_in and not r.ok and "RESOURCE_EXHAUSTED" in r.error_message
    fix = oom.reproduce(path, mode="gpu", fixed=True)
    assert fix.ok and fix.accelerator_bytes_added == 0


# --- CLI ----------------------------------------------------------------------------------
def test_cli_make_tokens(tmp_path):
    out = run_cli("make-tokens", str(tmp_path / "t.safetensors"), "--tokens", "1000", "--quiet")
    assert out.returncode == 0 and "1,000 uint16 tokens" in out.stdout
    bad = run_cli("make-tokens", str(tmp_path / "u.safetensors"), "--size", "lots")
    assert bad.returncode == 2 and "cannot read 'lots'" in bad.stderr
    both = run_cli("make-tokens", str(tmp_path / "v.safetensors"))
    assert both.returncode == 2


def test_cli_reproduce_oom_json(small_file):
    out = run_cli("reproduce-oom", "--file", str(small_file), "--mode", "cpu", "--json")
    assert out.returncode == 0, out.stderr
    seed, fix = json.loads(out.stdout)
    assert not seed["ok"] and "RESOURCE_EXHAUSTED" in seed["error_message"] and fix["ok"]


@pytest.mark.skipif("jax.default_backend() != 'cpu'", reason="asserts the numbers a CPU lacks")
@pytest.mark.parametrize("text, library", [
    ("FAILED_PRECONDITION: DNN library initialization failed. Look at the errors above for "
     "more details.", "cuDNN"),  # jax#22626, jax#23145
    ("INTERNAL: CUBLAS_STATUS_NOT_INITIALIZED", "cuBLAS"),  # jax#7118
    ("failed to create cublas handle: CUBLAS_STATUS_ALLOC_FAILED", "cuBLAS"),  # acme#208
    ("cudaErrorMemoryAllocation : out of memory", "CUDA"),  # jax#17217
])
def test_a_cuda_library_that_could_not_start_is_told_from_an_oom(text, library):
    from helpers import oom

    error = RuntimeError(text)
    assert oom.is_library_failure(error) and not oom.is_out_of_memory(error)
    r = oom.explain_library_failure(error)
    assert r.library == library and r.error == text.splitlines()[0]
    assert r.free_bytes is NOT_AVAILABLE and r.pool_bytes is NOT_AVAILABLE  # the CPU: no card
    assert any("XLA_CLIENT_MEM_FRACTION lower" in f for f in r.fixes)
    assert "Loaded runtime" in r.fixes[-1]  # memory first: nothing says there was room
    pool = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9437184 "
                        "bytes. CUDA_ERROR_OUT_OF_MEMORY")
    assert oom.is_out_of_memory(pool) and not oom.is_library_failure(pool)
    assert not oom.is_library_failure(RuntimeError("INVALID_ARGUMENT: shapes differ"))


def test_two_copies_of_a_cuda_library_are_named(tmp_path):
    """jax#16901: cuDNN could not start because the one loaded was not jaxlib's version; the
    process's mapped files (a stand-in /proc/self/maps) show where each library came from."""
    from helpers import oom

    maps = tmp_path / "maps"
    site = "/venv/lib/python3.12/site-packages"
    maps.write_text(
        f"7f00-7f10 r-xp 00000000 08:01 11 {site}/torch/lib/libcudnn.so.9\n"
        f"7f10-7f20 r-xp 00000000 08:01 12 {site}/nvidia/cudnn/lib/libcudnn_ops.so.9\n"
        f"7f20-7f30 r-xp 00000000 08:01 13 {site}/nvidia/cublas/lib/libcublasLt.so.12\n"
        "7f30-7f40 r-xp 00000000 08:01 14 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f40-7f50 rw-p 00000000 00:00 0 \n")
    r = oom.explain_library_failure(RuntimeError("DNN library initialization failed"),
                                    maps=str(maps))
    assert r.loaded == (f"cublasLt: {site}/nvidia/cublas/lib", f"cudnn: {site}/nvidia/cudnn/lib",
                        f"cudnn: {site}/torch/lib")
    assert "loaded cudnn from more than one folder" in r.fixes[-1]
    assert "Import JAX before the package that brought the other copy" in r.fixes[-1]
    assert f"cudnn: {site}/torch/lib" in str(r)
    assert oom.explain_library_failure(RuntimeError("CUBLAS_STATUS_NOT_INITIALIZED"),
                                       maps=str(tmp_path / "none")).loaded == ()


def test_tensorflow_beside_jax_comes_first_and_room_on_the_card_puts_the_copy_first(
        monkeypatch):
    """The GPU faked: a stand-in TensorFlow that sees a GPU (flax#445), then a card with room
    to spare, where the library's copy is the likelier cause (jax#28752: 16.6 of 16.9 GB free)."""
    import sys
    from types import SimpleNamespace

    from helpers import gpu, memory, oom

    tf = SimpleNamespace(config=SimpleNamespace(
        get_visible_devices=lambda kind: ["GPU:0"],
        experimental=SimpleNamespace(get_memory_growth=lambda d: False)))
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    r = oom.explain_library_failure(RuntimeError("DNN library initialization failed"))
    assert r.fixes[0].startswith("right after `import tensorflow as tf`")
    assert "TensorFlow is imported in this process" in str(r)
    monkeypatch.delitem(sys.modules, "tensorflow")
    card = SimpleNamespace(platform="gpu", id=0, device_kind="H100")
    monkeypatch.setattr(jax, "devices", lambda *a: [card])
    monkeypatch.setattr(gpu, "total_bytes", lambda i=0: 16928342016)
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: 16928342016 - 16601251840)
    monkeypatch.setattr(gpu, "process_used_bytes", lambda pid: 16928342016 - 16601251840)
    monkeypatch.setattr(memory, "memory_stats", lambda d: {"bytes_limit": 12 * 2**30})
    roomy = oom.explain_library_failure(RuntimeError("DNN library initialization failed"))
    assert roomy.free_bytes == 16601251840 and roomy.pool_bytes == 12 * 2**30
    assert roomy.fixes[0].startswith("15.46 GiB of the card's 15.77 GiB is free, so memory may "
                                     "not be the cause")
    assert "(JAX's pool is 12.00 GiB of the card's 15.77 GiB)" in roomy.fixes[1]


#: JAX's words on the H100 (2026-11-27 record, the gpu tests) for a third default process
#: beside two that held their pools: the driver's log said "Failed to create stream executor
#: for device CUDA:0: : CUDA_ERROR_OUT_OF_MEMORY: out of memory"; the error, only this
_NO_CONTEXT = ("Unable to initialize backend 'cuda': INTERNAL: no supported devices found for "
               "platform CUDA (you may need to uninstall the failing plugin package, or set "
               "JAX_PLATFORMS=cpu to skip this backend.)")


def test_a_cuda_backend_that_could_not_start_on_a_full_card_is_explained(monkeypatch):
    """The GPU faked (the driver's numbers): the error names no memory, the card says it is
    full; with room on the card, memory is not blamed and doctor is the next step."""

    from helpers import gpu, oom

    error = RuntimeError(_NO_CONTEXT)
    assert oom.is_library_failure(error) and not oom.is_out_of_memory(error)
    with pytest.raises(Exception, match="explain_library_failure"):
        oom.explain(error)  # not a RESOURCE_EXHAUSTED: pointed to the right explanation

    def no_backend(*a):  # JAX's backends start once a process: the kit must not ask again
        raise AssertionError("jax.devices() called")

    monkeypatch.setattr(jax, "devices", no_backend)
    total = 85520809984  # the H100's, by the driver
    monkeypatch.setattr(gpu, "total_bytes", lambda i=0: total)
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: total - 300 * 2**20)
    full = oom.explain_library_failure(error)
    assert full.library == "JAX's CUDA backend" and full.device == ""
    assert full.free_bytes == 300 * 2**20 and full.other_processes_bytes == total - 300 * 2**20
    assert full.fixes[0].startswith("Other processes hold 79.35 GiB of the card's 79.65 GiB "
                                    "(300.00 MiB free), too little for JAX even to create its "
                                    "CUDA context")
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in full.fixes[0]
    assert "restart the kernel" in full.fixes[0] and "doctor" in full.fixes[1]
    assert str(full).startswith("JAX's CUDA backend could not start: Unable to initialize")
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: 2**30)
    roomy = oom.explain_library_failure(error)
    assert roomy.fixes[0].startswith("78.65 GiB of the card's 79.65 GiB is free, so memory is "
                                     "not the cause: `python -m helpers doctor`")
    monkeypatch.setattr(gpu, "total_bytes", lambda i=0: None)
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: None)
    blind = oom.explain_library_failure(error)  # no driver answered: nothing blamed
    assert blind.fixes[0].startswith("The driver gave no numbers here: `python -m helpers "
                                     "doctor`")


#: the second process: JAX's defaults, a convolution (cuDNN) and a matmul (cuBLAS), and what
#: the kit says of whatever fails
_SECOND = """
import jax, jax.numpy as jnp
from helpers import oom
try:
    x = jnp.ones((8, 3, 64, 64))
    jax.lax.conv(x, jnp.ones((16, 3, 3, 3)), (1, 1), "SAME").block_until_ready()
    (jnp.ones((512, 512)) @ jnp.ones((512, 512))).block_until_ready()
    print("NO ERROR")
except Exception as err:
    r = oom.explain_library_failure(err) if oom.is_library_failure(err) else oom.explain(err)
    print(type(r).__name__)
    print(r)
"""


@contextlib.contextmanager
def _holding(n: int):
    """``n`` JAX processes with the default settings, each holding its pool (75% of the card at
    its start, or what the driver still gives), until the block ends."""
    import subprocess
    import sys

    from helpers._internal.child import child_env
    from tests.conftest import REPO

    if jax.default_backend() == "gpu":  # this process's own pool would take the card first
        pool = (jax.devices()[0].memory_stats() or {}).get("pool_bytes", 0)
        assert pool < 2**30, (f"the pytest process holds a {pool:,} B pool: a test before this "
                              "one made an array here; make it in a child process, or mark this "
                              "test beside_processes (those run first)")
    holders = []
    try:
        for _ in range(n):
            holders.append(subprocess.Popen(
                [sys.executable, "-c", "import sys, jax.numpy as jnp; x = jnp.ones(2**20); "
                 "x.block_until_ready(); print('ready', flush=True); sys.stdin.read()"],
                cwd=REPO, env=child_env(None), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True))
            assert holders[-1].stdout.readline().strip() == "ready"  # its pool is taken
        yield
    finally:
        for h in holders:
            h.stdin.close()
            h.wait(timeout=60)


@pytest.mark.gpu
@pytest.mark.beside_processes
def test_gpu_a_third_default_process_gets_no_cuda_context_and_is_explained():
    """The H100 (2026-11-27): beside two default JAX processes, a third could not create its
    CUDA context, and JAX said only "no supported devices found for platform CUDA"."""
    from tests.conftest import run_python

    with _holding(2):
        out = run_python("import jax.numpy as jnp\nfrom helpers import oom\ntry:\n"
                         "    jnp.ones(4).block_until_ready()\n    print('NO ERROR')\n"
                         "except Exception as err:\n    assert oom.is_library_failure(err), err\n"
                         "    print(oom.explain_library_failure(err))\n", timeout=300)
    print(out.stdout[-3000:], out.stderr[-3000:])  # the record keeps what the card said
    assert out.stdout.startswith("JAX's CUDA backend could not start"), out.stdout + out.stderr
    assert "too little for JAX even to create its CUDA context" in out.stdout
    assert "CUDA_ERROR_OUT_OF_MEMORY" in out.stderr  # the driver's word, in JAX's log


@pytest.mark.gpu
@pytest.mark.beside_processes
def test_a_second_default_process_starves_a_cuda_library_and_is_explained():
    """jax#17217: a JAX process beside another that holds its default 75% takes most of what
    is left for its pool, and cuDNN or cuBLAS may find too little to start. Written from the
    threads, not yet run on a GPU: if the second process raises nothing, this fails, and the
    record says what the card did instead."""
    from tests.conftest import run_python

    with _holding(1):
        out = run_python(_SECOND, timeout=300)
    print(out.stdout[-3000:], out.stderr[-3000:])  # the record keeps what the card said
    assert "NO ERROR" not in out.stdout, "the second process started cuDNN and cuBLAS"
    kind = out.stdout.split("\n", 1)[0].strip()
    assert kind in ("LibraryFailure", "OomReport"), out.stdout + out.stderr
    if kind == "LibraryFailure":
        assert "Other processes hold" in out.stdout and "XLA_CLIENT_MEM_FRACTION" in out.stdout
