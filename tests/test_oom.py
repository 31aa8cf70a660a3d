import json
import struct

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import datasets, oom
from helpers import preflight as preflight_module
from helpers.unavailable import NOT_AVAILABLE
from tests.conftest import run_cli


def write_raw(path, header, data=b"", length=None):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokens.safetensors"
    datasets.write_tokens(path, 1 << 20)  # 2 MiB
    return path


def test_preflight_reports_tensors_target_and_verdict(tokens):
    r = oom.preflight(tokens)
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in r.tensors] == [
        ("tokens", "U16", (1 << 20,), 2 << 20)]
    assert r.total_bytes == 2 << 20 and r.device == "cpu:0" and r.verdict == "fits"
    assert "host" in r.free_source and r.free_bytes > r.total_bytes
    assert json.loads(json.dumps(r.to_dict()))["verdict"] == "fits"


def test_preflight_honours_default_device_context(tokens):
    with jax.default_device(jax.devices()[2]):
        r = oom.preflight(tokens)
    assert r.device == "cpu:2" and "jax.default_device" in r.device_reason
    assert oom.preflight(tokens, device="cpu").device == "cpu:0"


def test_will_not_fit_spells_out_the_fix(tokens, monkeypatch):
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda d: (1 << 20, "allocator: test"))
    r = oom.preflight(tokens)
    assert r.verdict == "will not fit" and not r.fits
    assert "jax.default_device(jax.devices('cpu')[0])" in r.advice
    monkeypatch.setattr(preflight_module, "_free_bytes", lambda d: (NOT_AVAILABLE, "no stats"))
    assert oom.preflight(tokens).verdict == "unknown"


def test_every_safetensors_dtype(tmp_path):
    header, offset = {}, 0
    for i, (dtype, bits) in enumerate(sorted(oom.DTYPE_BITS.items())):
        n = 8  # 8 elements: whole bytes for every bit width
        size = n * bits // 8
        header[f"t{i}_{dtype}"] = {"dtype": dtype, "shape": [2, 4],
                                   "data_offsets": [offset, offset + size]}
        offset += size
    path = write_raw(tmp_path / "all.safetensors", header, b"\0" * offset)
    parsed, _ = oom.read_header(path)
    assert {v["dtype"] for v in parsed.values()} == set(oom.DTYPE_BITS)
    for name, entry in parsed.items():
        a, b = entry["data_offsets"]
        assert b - a == 8 * oom.DTYPE_BITS[entry["dtype"]] // 8, name


def test_real_safetensors_file_with_many_dtypes(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    arrays = {"b": np.zeros(3, bool), "h": np.zeros((2, 2), np.float16),
              "q": np.zeros(5, np.int64), "u": np.zeros(7, np.uint8)}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    r = oom.preflight(tmp_path / "m.safetensors")
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
    with pytest.raises(oom.FileError, match=match) as info:
        oom.preflight(path)
    assert str(path) in str(info.value)


def test_unreadable_file(tmp_path, tokens):
    import os

    if os.geteuid() == 0:
        pytest.skip("root can read any file")
    p = tmp_path / "locked.safetensors"
    p.write_bytes(tokens.read_bytes())
    p.chmod(0)
    with pytest.raises(oom.FileError, match="cannot be read"):
        oom.preflight(p)


@pytest.mark.parametrize("device, err", [("tpu", ValueError), ("moon", ValueError),
                                         (3, TypeError)])
def test_bad_device(tokens, device, err):
    with pytest.raises(err):
        oom.preflight(tokens, device=device)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.text(max_size=10), _json_values | st.fixed_dictionaries({
    "dtype": st.sampled_from(sorted(oom.DTYPE_BITS)) | st.text(max_size=5),
    "shape": st.lists(st.integers(-3, 2**40), max_size=3) | _json_values,
    "data_offsets": st.lists(st.integers(-5, 2**40), max_size=3) | _json_values,
}), max_size=3), data=st.binary(max_size=64), cut=st.integers(0, 40))
def test_mutated_headers_only_raise_the_kits_errors(tmp_path, header, data, cut):
    raw = json.dumps(header).encode()
    raw = raw[:len(raw) - cut] if cut and cut < len(raw) else raw
    path = write_raw(tmp_path / "fuzz.safetensors", raw, data)
    try:
        r = oom.preflight(path)
    except oom.FileError as err:
        assert str(path) in str(err)
    else:
        assert r.total_bytes == sum(t.nbytes for t in r.tensors)


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
    with pytest.raises(oom.FileError, match="no such file"):
        oom.reproduce(tmp_path / "nope", mode="cpu")
    with pytest.raises(ValueError, match="larger than this machine"):
        oom.reproduce(small_file, mode="cpu", budget="100 TiB")
    with pytest.raises(ValueError, match="cannot read"):
        oom.reproduce(small_file, mode="cpu", budget="lots")
    with pytest.raises(ValueError, match="mode"):
        oom.reproduce(small_file, mode="quantum")
    no_tokens = write_raw(tmp_path / "w.safetensors",
                          {"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    with pytest.raises(oom.FileError, match="no tensor named 'tokens'"):
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
