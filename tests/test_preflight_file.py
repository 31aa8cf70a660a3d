"""preflight (will this safetensors file fit?) and the file format it reads: every dtype, every
way a file can be broken, and a fuzz of mutated headers."""

import json
import struct

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import datasets
from helpers import preflight as preflight_module
from helpers.errors import FileError
from helpers.units import NOT_AVAILABLE
from tests.conftest import run_cli


def write_raw(path, header, data=b"", length=None):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


BITS = {name: dtype.bits for name, dtype in datasets.DTYPES.items()}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokens.safetensors"
    datasets.write_tokens(path, 1 << 20)  # 2 MiB
    return path


def test_preflight_reports_tensors_target_and_verdict(tokens):
    r = preflight_module.preflight(tokens)
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in r.tensors] == [
        ("tokens", "U16", (1 << 20,), 2 << 20)]
    assert r.total_bytes == 2 << 20 and r.device == "cpu:0" and r.verdict == "fits"
    assert "host" in r.free_source and r.free_bytes > r.total_bytes
    assert json.loads(json.dumps(r.to_dict()))["verdict"] == "fits"


def test_preflight_honours_default_device_context(tokens):
    with jax.default_device(jax.devices()[2]):
        r = preflight_module.preflight(tokens)
    assert r.device == "cpu:2" and "jax.default_device" in r.device_reason
    assert preflight_module.preflight(tokens, device="cpu").device == "cpu:0"


def test_will_not_fit_spells_out_the_fix(tokens, monkeypatch):
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda d: (1 << 20, "allocator: test"))
    r = preflight_module.preflight(tokens)
    assert r.verdict == "will not fit" and not r.fits
    assert "jax.default_device(jax.devices('cpu')[0])" in r.advice
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda d: (NOT_AVAILABLE, "no stats"))
    assert preflight_module.preflight(tokens).verdict == "unknown"


def test_every_safetensors_dtype(tmp_path):
    header, offset = {}, 0
    for i, (dtype, bits) in enumerate(sorted(BITS.items())):
        n = 8  # 8 elements: whole bytes for every bit width
        size = n * bits // 8
        header[f"t{i}_{dtype}"] = {"dtype": dtype, "shape": [2, 4],
                                   "data_offsets": [offset, offset + size]}
        offset += size
    path = write_raw(tmp_path / "all.safetensors", header, b"\0" * offset)
    parsed, _ = datasets.read_header(path)
    assert {v["dtype"] for v in parsed.values()} == set(BITS)
    for name, entry in parsed.items():
        a, b = entry["data_offsets"]
        assert b - a == 8 * BITS[entry["dtype"]] // 8, name


def test_real_safetensors_file_with_many_dtypes(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    arrays = {"b": np.zeros(3, bool), "h": np.zeros((2, 2), np.float16),
              "q": np.zeros(5, np.int64), "u": np.zeros(7, np.uint8)}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    r = preflight_module.preflight(tmp_path / "m.safetensors")
    assert {t.name: (t.dtype, t.nbytes) for t in r.tensors} == {
        "b": ("BOOL", 3), "h": ("F16", 8), "q": ("I64", 40), "u": ("U8", 7)}
    assert r.total_bytes == 58


def put(path, content: bytes):
    path.write_bytes(content)
    return path


BAD = {
    "missing file": (lambda p: p / "nope.safetensors", "no such file"),
    "a directory": (lambda p: p, "is a directory"),
    "an empty file": (lambda p: put(p / "e", b""), "is empty"),
    "fewer than 8 bytes": (lambda p: put(p / "s", b"abc"), "only 3 bytes"),
    "header longer than file": (
        lambda p: write_raw(p / "h", {"a": 1}, length=10_000), "runs past the end"),
    "header not JSON": (lambda p: write_raw(p / "j", b"{not json"), "not valid JSON"),
    "header not an object": (lambda p: write_raw(p / "o", [1, 2]), "not an object"),
    "offsets past the end": (lambda p: write_raw(
        p / "x", {"t": {"dtype": "U16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 4),
        "past its end"),
    "offsets do not match shape x dtype": (lambda p: write_raw(
        p / "m", {"t": {"dtype": "U16", "shape": [4], "data_offsets": [0, 6]}}, b"\0" * 8),
        "needs 8"),
    "unknown dtype": (lambda p: write_raw(
        p / "d", {"t": {"dtype": "U17", "shape": [1], "data_offsets": [0, 2]}}, b"\0" * 2),
        "unknown dtype 'U17'"),
    "missing fields": (lambda p: write_raw(p / "f", {"t": {"dtype": "U8"}}), "lacks"),
    "overlapping tensors": (lambda p: write_raw(p / "ov", {
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6), "overlap"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_get_clear_errors(tmp_path, case):
    make, match = BAD[case]
    path = make(tmp_path)
    with pytest.raises(FileError, match=match) as info:
        preflight_module.preflight(path)
    assert str(path) in str(info.value)


def test_unreadable_file(tmp_path, tokens):
    import os

    if os.geteuid() == 0:
        pytest.skip("root can read any file")
    p = tmp_path / "locked.safetensors"
    p.write_bytes(tokens.read_bytes())
    p.chmod(0)
    with pytest.raises(FileError, match="cannot be read"):
        preflight_module.preflight(p)


@pytest.mark.parametrize("device, err", [("tpu", ValueError), ("moon", ValueError),
                                         (3, TypeError)])
def test_bad_device(tokens, device, err):
    with pytest.raises(err):
        preflight_module.preflight(tokens, device=device)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.text(max_size=10), _json_values | st.fixed_dictionaries({
    "dtype": st.sampled_from(sorted(BITS)) | st.text(max_size=5),
    "shape": st.lists(st.integers(-3, 2**40), max_size=3) | _json_values,
    "data_offsets": st.lists(st.integers(-5, 2**40), max_size=3) | _json_values,
}), max_size=3), data=st.binary(max_size=64), cut=st.integers(0, 40))
def test_mutated_headers_only_raise_the_kits_errors(tmp_path, header, data, cut):
    raw = json.dumps(header).encode()
    raw = raw[:len(raw) - cut] if cut and cut < len(raw) else raw
    path = write_raw(tmp_path / "fuzz.safetensors", raw, data)
    try:
        r = preflight_module.preflight(path)
    except FileError as err:
        assert str(path) in str(err)
    else:
        assert r.total_bytes == sum(t.nbytes for t in r.tensors)


def test_cli_preflight_exit_codes(tokens, tmp_path):
    ok = run_cli("preflight", str(tokens), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["verdict"] == "fits"
    # a sparse file whose header claims 64 GiB: more than this machine has free
    big = tmp_path / "big.safetensors"
    n = 32 << 30
    write_raw(big, {"tokens": {"dtype": "U16", "shape": [n], "data_offsets": [0, 2 * n]}})
    with open(big, "r+b") as f:
        f.truncate(big.stat().st_size + 2 * n)
    wont = run_cli("preflight", str(big))
    assert wont.returncode == 1 and "WILL NOT FIT" in wont.stdout
    assert "jax.default_device" in wont.stdout
    bad = run_cli("preflight", str(tmp_path / "nope"))
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_a_file_judged_for_a_target_card(tokens):
    from helpers import allocation

    shared = allocation.target("2 MiB", processes=2)  # XLA rounds a pool up to 2 MiB
    r = preflight_module.preflight(tokens, target=shared)
    assert r.verdict == "will not fit" and r.device == "2.00 MiB card" and r.free_bytes == 0
    assert preflight_module.preflight(tokens, target="RTX 3090").verdict == "fits"
    cli = run_cli("preflight", str(tokens), "--target", "2MiB", "--processes", "2")
    assert cli.returncode == 1 and "WILL NOT FIT" in cli.stdout
    bad = run_cli("preflight", str(tokens), "--target", "moon")
    assert bad.returncode == 2 and "no card 'moon'" in bad.stderr


def test_a_file_that_fits_but_whose_jax_load_may_not_says_so(tmp_path, monkeypatch):
    """safetensors#399: on the CPU the data may fit while safetensors.flax's load, at up to
    about four times the file (4.1x for a token file in the kit's load benchmark), does not."""
    path = tmp_path / "t.safetensors"
    datasets.write_tokens(path, 2**20)  # uint16: 2 MiB of data
    total = 2**21
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda dev: (3 * total, "test"))
    p = preflight_module.preflight(path, device="cpu")
    assert p.verdict == "fits" and "a load through JAX may not" in p.advice
    assert "safetensors.numpy.load_file" in p.advice
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda dev: (8 * total, "test"))
    assert "through JAX" not in preflight_module.preflight(path, device="cpu").advice
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda dev: (total // 2, "test"))
    short = preflight_module.preflight(path, device="cpu")
    assert short.verdict == "will not fit" and "safetensors.numpy.load_file" in short.advice
    # the Flax load's peak as measured, not as a rule: 4.1x a token file, less for float32s
    assert "up to about four times the file" in short.advice
    assert "4.1x for a token file" in short.advice and "1.5-1.8x" in short.advice


def test_safetensors_636_load_one_tensor_at_a_time_not_load_file_then_device_put(tmp_path,
                                                                                  monkeypatch):
    """safetensors/safetensors#636: a load into JAX goes through NumPy, first into host memory,
    then another copy. preflight's advice said "load with safetensors.numpy.load_file (about
    1x) ... and jax.device_put it in batches", which peaked at about 2x: +131 MiB (jax 0.10.2)
    and +133 MiB (0.8.0) of anonymous memory for a 64 MiB file of four float32 tensors, against
    +101 and +84 MiB read and put one tensor at a time (fresh children, sampled every 2 ms)."""
    import gc
    import weakref

    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "model.safetensors"
    save_file({f"w{i}": np.full((512, 1024), i, np.float32) for i in range(4)}, str(path))
    total = 4 * 2**21
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda dev: (3 * total, "test"))
    p = preflight_module.preflight(path, device="cpu")
    assert p.verdict == "fits" and "a load through JAX may not" in p.advice
    assert "Read and put one tensor at a time" in p.advice, p.advice
    assert "safetensors.safe_open(path, framework='numpy')" in p.advice
    assert "jax.device_put(f.get_tensor(name))" in p.advice and "1.3-1.6x" in p.advice
    assert "safetensors.numpy.load_file, then jax.device_put, peaked at about 2x" in p.advice
    assert "about 1x" not in p.advice and "safetensors/safetensors#636" in p.advice
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda dev: (total // 2, "test"))
    short = preflight_module.preflight(path, device="cpu")
    assert short.verdict == "will not fit" and "one tensor at a time" in short.advice
    assert "f.get_tensor(name)" in short.advice and "about 2x the file" in short.advice
    # the cause, run: load_file's whole NumPy copy is alive while JAX copies each tensor that
    # is not 64-byte aligned (the CPU backend uses an aligned one in place)
    host = load_file(str(path))
    put = {k: jax.device_put(v) for k, v in host.items()}
    jax.block_until_ready(put)
    unaligned = {k for k, v in host.items() if v.ctypes.data % 64}
    assert unaligned and all(put[k].unsafe_buffer_pointer() != host[k].ctypes.data
                             for k in unaligned)  # two copies of each at once
    del host, put
    # the fix, run: each NumPy tensor is gone once put, unless JAX uses it in place
    kept, params = [], {}
    with safe_open(str(path), framework="numpy") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            kept.append((name, weakref.ref(t), t.ctypes.data))
            params[name] = jax.device_put(t)
            del t
    jax.block_until_ready(params)
    gc.collect()
    assert all(ref() is None or params[name].unsafe_buffer_pointer() == at
               for name, ref, at in kept)
    assert all(np.array_equal(np.asarray(params[f"w{i}"]), np.full((512, 1024), i)) for i in
               range(4))
