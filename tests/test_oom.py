import json

import pytest

from helpers import datasets, oom
from helpers.errors import FileError
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
