import json

import pytest

from helpers import gpu
from tests.conftest import run_cli


def test_doctor_json_parses_and_lists_cpu():
    proc = run_cli("doctor", "--json", env={"JAX_NUM_CPU_DEVICES": "2"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # only JSON on stdout
    cpu = next(b for b in data["backends"] if b["name"] == "cpu")
    assert [d["id"] for d in cpu["devices"]] == [0, 1]
    assert data["default_device"] == "cpu:0"


def test_doctor_text():
    proc = run_cli("doctor")
    assert proc.returncode == 0, proc.stderr
    assert "default backend: cpu" in proc.stdout and "Environment" in proc.stdout


def test_doctor_with_unavailable_cuda_names_the_failure():
    proc = run_cli("doctor", env={"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "Backends that did not start" in proc.stdout and "cuda" in proc.stdout
    assert "no-visible-gpu" in proc.stdout


def test_doctor_warns_about_conflicting_fractions():
    proc = run_cli("doctor", "--json", env={"XLA_CLIENT_MEM_FRACTION": "0.5",
                                            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    assert proc.returncode == 0
    assert "both-mem-fractions" in {w["code"] for w in json.loads(proc.stdout)["warnings"]}


def test_no_command_prints_usage_and_exits_2():
    proc = run_cli()
    assert proc.returncode == 2 and "doctor" in proc.stderr


def test_unknown_command_exits_2():
    proc = run_cli("nonsense")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


BAD_INPUTS = {
    "size too big for the machine": ["reproduce-oom", "--size", "100TiB"],
    "size not a size": ["reproduce-oom", "--size", "lots"],
    "missing file": ["reproduce-oom", "--file", "/nonexistent/tokens.safetensors"],
    "directory as file": ["reproduce-oom", "--file", "/"],
    "zero budget": ["reproduce-oom", "--size", "1MiB", "--budget", "0"],
    "budget past the machine": ["reproduce-oom", "--size", "1MiB", "--budget", "1PiB"],
    "make-tokens into a missing folder": ["make-tokens", "/nonexistent/x.safetensors",
                                          "--size", "1MiB"],
    "make-tokens bigger than the disk": ["make-tokens", "{tmp}/x.safetensors", "--size",
                                         "100PiB"],
    "make-tokens both sizes": ["make-tokens", "{tmp}/x.safetensors", "--size", "1MiB",
                               "--tokens", "5"],
    "preflight not safetensors": ["preflight", "{tmp}/not.safetensors"],
    "preflight --json on a missing file": ["preflight", "/nonexistent", "--json"],
    "preflight a name too long": ["preflight", "{tmp}/" + "x" * 300],
    "make-tokens a name too long": ["make-tokens", "{tmp}/" + "x" * 300, "--size", "1MiB"],
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(name, tmp_path):
    (tmp_path / "not.safetensors").write_text("hello, not a safetensors file")
    args = [a.replace("{tmp}", str(tmp_path)) for a in BAD_INPUTS[name]]
    proc = run_cli(*args, env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: ")
    assert not list(tmp_path.glob("jax-device-kit/*"))  # nothing written for a failing run


def test_gpu_mode_without_a_gpu_exits_2_before_any_child(tmp_path):
    if gpu.why_unavailable() is None:
        pytest.skip("a GPU is present")
    proc = run_cli("reproduce-oom", "--mode", "gpu", "--size", "1MiB",
                   env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "needs an NVIDIA GPU with JAX's CUDA backend" in proc.stderr
    assert "real GPU" not in proc.stdout  # never a false label
    assert not (tmp_path / "jax-device-kit").exists()  # no token file, so no child ran


def test_gpu_mode_names_jax_platforms_when_it_excludes_the_gpu(tmp_path):
    proc = run_cli("reproduce-oom", "--mode", "gpu", "--size", "1MiB",
                   env={"JAX_PLATFORMS": "cpu", "TMPDIR": str(tmp_path)})
    assert proc.returncode == 2
    assert "JAX_PLATFORMS='cpu' leaves the GPU out" in proc.stderr


def test_preflight_where_jax_cannot_start_is_one_line(tmp_path):
    from helpers import datasets

    path = datasets.write_tokens(tmp_path / "t.safetensors", 100).path
    proc = run_cli("preflight", path, env={"JAX_NUM_CPU_DEVICES": "abc"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "JAX cannot start here" in proc.stderr and "helpers doctor" in proc.stderr


def test_make_tokens_needs_no_jax(tmp_path):
    proc = run_cli("make-tokens", str(tmp_path / "t.safetensors"), "--tokens", "100",
                   env={"JAX_NUM_CPU_DEVICES": "abc"})  # `import jax` would raise
    assert proc.returncode == 0, proc.stderr
    assert "100 uint16 tokens" in proc.stdout


@pytest.mark.parametrize("value", ["nan", "0", "-3", "soon"])
def test_doctor_timeout_must_be_positive_seconds(value):
    proc = run_cli("doctor", "--timeout", value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is not a positive number of seconds" in proc.stderr
