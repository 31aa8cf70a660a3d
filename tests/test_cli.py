import json

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
