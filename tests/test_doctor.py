"""`python -m helpers doctor` exits 0 with a report under any environment: JAX failing to
import, XLA aborting the process over XLA_FLAGS, a probe that hangs. Each case found by trying it
on JAX 0.10.2; the child's own words are quoted in the report."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import run_cli


def doctor(env, *args):
    out = run_cli("doctor", *args, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return out.stdout


CASES = [
    # env, words the report must contain (XLA's or Python's line, then the hint)
    ({"XLA_FLAGS": "--nonsense_flag"},
     ["Unknown flag in XLA_FLAGS: --nonsense_flag", "does not know the flag --nonsense_flag"]),
    ({"XLA_FLAGS": "nonsense"},
     ['Could not open file "nonsense"', "does not start with '--'"]),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=abc"},
     ["Couldn't interpret value abc", "gives xla_force_host_platform_device_count the value abc"]),
    ({"JAX_NUM_CPU_DEVICES": "abc"},
     ['Invalid value "abc" for JAX flag jax_num_cpu_devices', "JAX_NUM_CPU_DEVICES='abc'",
      "bad-cpu-device-count"]),
    ({"JAX_ENABLE_X64": "maybe"},
     ["invalid truth value 'maybe'", "JAX_ENABLE_X64='maybe' is not a value JAX accepts"]),
    ({"JAX_TRANSFER_GUARD": "bogus"},
     ['Invalid value "bogus" for JAX flag jax_transfer_guard', "JAX_TRANSFER_GUARD='bogus'"]),
    ({"JAX_NUM_CPU_DEVICES": "0"},
     ["Unable to initialize backend 'cpu'", "bad-cpu-device-count"]),
    ({"JAX_PLATFORMS": "bogus"},
     ["Backend 'bogus' is not in the list of known backends", "fix the spelling"]),
    ({"JAX_PLATFORMS": ","}, ["JAX_PLATFORMS has an empty entry"]),
    ({"JAX_DEFAULT_DEVICE": "bogus"},
     ["jax.default_device must be passed either a Device", "JAX_DEFAULT_DEVICE='bogus'"]),
    ({"JAX_DEFAULT_PRNG_IMPL": "bogus"}, ["JAX_DEFAULT_PRNG_IMPL='bogus'"]),
]


IDS = ["{}={}".format(*next(iter(env.items()))) for env, _ in CASES]


@pytest.fixture(scope="module")
def reports():
    """Every case's report, two doctors at a time (each is a parent and a child process)."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(IDS, pool.map(lambda c: doctor({"JAX_PLATFORMS": "cpu", **c[0]}), CASES),
                        strict=True))


@pytest.mark.parametrize("case,words", [(i, w) for i, (_, w) in zip(IDS, CASES, strict=True)],
                         ids=IDS)
def test_doctor_reports_instead_of_crashing(reports, case, words):
    text = reports[case]
    for w in words:
        assert w in text, f"{w!r} missing from:\n{text}"


def fake_jax(tmp_path, body):
    """A stand-in `jax` package placed first on PYTHONPATH (a broken install, simulated)."""
    pkg = tmp_path / "jax"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    return {"PYTHONPATH": str(tmp_path)}


def test_doctor_when_jax_cannot_be_imported(tmp_path):
    env = fake_jax(tmp_path, "raise ImportError('simulated: jaxlib is missing')\n")
    text = doctor(env)
    assert "simulated: jaxlib is missing" in text and "pip install -U jax" in text
    assert "Environment (placement and allocation)" in text  # the rest of the report is there


def test_doctor_when_the_probe_hangs(tmp_path):
    env = fake_jax(tmp_path, "import time\ntime.sleep(60)\n")
    text = doctor(env, "--timeout", "3")
    assert "did not finish in time and was killed" in text


def test_doctor_json_when_jax_fails():
    out = doctor({"JAX_NUM_CPU_DEVICES": "abc"}, "--json")
    data = json.loads(out)
    assert data["backends"] == [] and data["default_backend"] is None
    assert "jax_num_cpu_devices" in data["failed_backends"][0]["error"]


def test_the_doctor_says_when_its_child_differs_from_the_caller():
    """This test process started JAX with 4 CPU devices (conftest); a fresh child started
    without that setting has 1. The report must not pass the child's view off as ours."""
    import jax

    from helpers import doctor

    here = len(jax.devices("cpu"))
    r = doctor.diagnose({"JAX_NUM_CPU_DEVICES": None, "JAX_PLATFORMS": "cpu"})
    (w,) = [w for w in r.warnings if w.code == "caller-differs"]
    assert "it has 1 cpu device;" in w.message and f"has {here} cpu devices" in w.message
    assert "devices.probe()" in w.fix
    same = doctor.diagnose({"JAX_NUM_CPU_DEVICES": str(here), "JAX_PLATFORMS": "cpu"})
    assert "caller-differs" not in {w.code for w in same.warnings}


# --- the bug report JAX asks for -----------------------------------------------------------------
def test_json_carries_jax_print_environment_info():
    data = json.loads(doctor({}, "--json"))
    info = data["jax_environment_info"]
    assert info.startswith("jax:") and "jaxlib:" in info and "process_count" in info


def test_bug_report_is_markdown_with_no_secret_in_it():
    secret = "tok_abcdef1234567"
    out = doctor({"MY_API_TOKEN": secret, "CUDA_VISIBLE_DEVICES": secret}, "--bug-report")
    assert out.startswith("### System info") and "```text\njax:" in out
    assert "<details>" in out and "JAX Device Kit - doctor" in out  # the report, folded
    assert secret not in out
    assert re.search(r"CUDA_VISIBLE_DEVICES\s+'<redacted>'", out)
    assert "node='<host>'" in out  # the host name in JAX's uname line


def test_bug_report_removes_home_paths_user_and_host(monkeypatch):
    import dataclasses
    import platform

    from helpers import devices
    from helpers import doctor as doctor_module
    from helpers.settings import EnvVar

    monkeypatch.setattr(platform, "node", lambda: "alices-laptop")
    report = dataclasses.replace(
        devices.probe(),
        environment=(EnvVar("XLA_FLAGS", "--xla_dump_to=/home/alice/dumps", "flags"),),
        jax_environment_info="jax: 9\nplatform: uname(node='alices-laptop') in /Users/bob/x")
    env = {"HOME": "/home/alice", "USER": "alice", "HF_TOKEN": "hf_secretvalue"}
    text = doctor_module.bug_report(report, environ=env)
    for private in ("/home/alice", "alice", "alices-laptop", "/Users/bob"):
        assert private not in text, private
    assert "--xla_dump_to=~/dumps" in text and "node='<host>'" in text and "in ~/x" in text


def test_versions_name_the_jax_libraries_installed_and_leave_out_the_rest(monkeypatch):
    """A record says which Flax compiled the step (the GPU run of 2026-11-27 could not); a
    library not installed is left out, where jax and the kit's own packages say so."""
    from importlib import metadata

    from helpers import devices

    real = metadata.version

    def version(dist):
        if dist == "flax":
            return "0.12.12"
        if dist in ("optax", "equinox", "grain", "safetensors"):
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(devices.md, "version", version)
    found, _ = devices.versions()
    assert found["flax"] == "0.12.12" and "optax" not in found and "grain" not in found
    assert found["safetensors"] == "not installed" and found["jax"] == real("jax")


def test_min_dalle_22_the_doctor_names_a_gpu_that_jax_has_no_plugin_for(monkeypatch):
    """kuprel/min-dalle#22: the driver lists a GPU, the CPU-only jax runs on the CPU. The
    doctor said "plugins: none ... Warnings: none" (a new user's trial); it now warns with
    the install. Not where JAX_PLATFORMS leaves the GPU out, a plugin is installed, or no GPU
    is listed. (The driver's list is faked here; the probe is a real child process.)"""
    from helpers import doctor, gpu

    monkeypatch.setattr(gpu, "gpus", lambda: (
        gpu.GpuInfo(0, "NVIDIA GeForce RTX 3090", "GPU-aaaa", 24 * 2**30, "550.1"),))
    monkeypatch.setattr(gpu, "cuda_plugins", dict)
    r = doctor.diagnose({"JAX_PLATFORMS": None})
    (w,) = [w for w in r.warnings if w.code == "gpu-without-jax-backend"]
    assert "NVIDIA GeForce RTX 3090" in w.message and "falls back to the CPU" in w.message
    assert w.fix.startswith('pip install -U "jax[cuda13]"')
    assert "! [gpu-without-jax-backend]" in str(r)  # as `python -m helpers doctor` prints it
    assert not [w for w in doctor.diagnose({"JAX_PLATFORMS": "cpu"}).warnings
                if w.code == "gpu-without-jax-backend"]
    monkeypatch.setattr(gpu, "cuda_plugins", lambda: {"jax-cuda13-plugin": "0.10.2"})
    assert not [w for w in doctor.diagnose({"JAX_PLATFORMS": None}).warnings
                if w.code == "gpu-without-jax-backend"]
