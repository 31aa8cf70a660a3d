import sys
import types

import pytest

from helpers import settings
from helpers._internal import jaxcompat
from tests.conftest import run_python


def codes(warnings):
    return {w.code for w in warnings}


def test_clean_environment_has_no_warnings():
    assert settings.check_environment({}) == ()


def test_both_fraction_names_is_an_error_jax_raises():
    ws = settings.check_environment(
        {"XLA_CLIENT_MEM_FRACTION": "0.5", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"})
    assert "both-mem-fractions" in codes(ws)
    w = next(w for w in ws if w.code == "both-mem-fractions")
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in w.fix


@pytest.mark.parametrize("value, code", [
    ("1.5", "mem-fraction-out-of-range"), ("0", "mem-fraction-out-of-range"),
    ("10", "mem-fraction-out-of-range"),  # jax-ml/jax#3077's value: ten, not a tenth
    ("-0.2", "mem-fraction-out-of-range"), ("half", "bad-mem-fraction"),
])
@pytest.mark.parametrize("name", ["XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"])
def test_fraction_outside_unit_interval(name, value, code):
    ws = settings.check_environment({name: value})
    assert codes(ws) == {code}
    assert name in ws[0].message


@pytest.mark.parametrize("value", ["0.5", "1", "0.1"])  # 0.75: setting-is-default, below
def test_valid_fraction_is_quiet(value):
    assert settings.check_environment({"XLA_CLIENT_MEM_FRACTION": value}) == ()


@pytest.mark.parametrize("value, warns", [
    ("false", False), ("False", False), ("0", False), ("true", False),
    ("FALSE", True), ("no", True), ("off", True),
])
def test_preallocate_values_jax_reads_as_true(value, warns):
    ws = settings.check_environment({"XLA_PYTHON_CLIENT_PREALLOCATE": value})
    assert ("preallocate-ambiguous" in codes(ws)) is warns


def test_unknown_allocator():
    ws = settings.check_environment({"XLA_PYTHON_CLIENT_ALLOCATOR": "malloc"})
    assert codes(ws) == {"bad-allocator"}
    assert settings.check_environment({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}) == ()


@pytest.mark.parametrize("value", ["", "-1"])
def test_cuda_visible_devices_hiding_everything(value):
    assert codes(settings.check_environment({"CUDA_VISIBLE_DEVICES": value})) == {"no-visible-gpu"}


def test_two_ways_of_setting_cpu_device_count():
    ws = settings.check_environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=8",
                                     "JAX_NUM_CPU_DEVICES": "4"})
    assert codes(ws) == {"two-cpu-device-counts"}


@pytest.mark.parametrize("value, code", [
    ("abc", "bad-cpu-device-count"), ("2.5", "bad-cpu-device-count"),
    ("", "bad-cpu-device-count"), ("0", "bad-cpu-device-count"),
    ("-2", "cpu-device-count-ignored"),
])
def test_cpu_device_count_that_is_not_a_positive_integer(value, code):
    ws = settings.check_environment({"JAX_NUM_CPU_DEVICES": value})
    assert codes(ws) == {code}
    assert "JAX_NUM_CPU_DEVICES" in ws[0].message


@pytest.mark.parametrize("value", ["1", "4", " 3", "-1"])  # -1 is JAX's own "not set"
def test_valid_cpu_device_count_is_quiet(value):
    assert settings.check_environment({"JAX_NUM_CPU_DEVICES": value}) == ()


@pytest.mark.parametrize("value, code, culprit", [
    ("xla_force_host_platform_device_count=4", "malformed-xla-flags", "file"),
    ("  ", "malformed-xla-flags", "file"),
    ("--xla_force_host_platform_device_count=4 -b", "malformed-xla-flags", "'-b'"),
    ("--xla_force_host_platform_device_count=4 xla_dump_to=/tmp/x", "xla-flags-ignored",
     "'xla_dump_to=/tmp/x'"),
    ("--xla_force_host_platform_device_count 4", "malformed-xla-flags", "after a space"),
    ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "xla-flags-ignored",
     "'intra_op_parallelism_threads=1'"),
])
def test_xla_flags_not_starting_with_two_dashes(value, code, culprit):
    ws = settings.check_environment({"XLA_FLAGS": value})
    assert codes(ws) == {code}
    assert culprit in ws[0].message


@pytest.mark.parametrize("value", [
    "", "--xla_force_host_platform_device_count=4",
    "  --xla_force_host_platform_device_count=4  --xla_dump_to=/tmp/x",
    "--xla_force_host_platform_device_count=4 --xla_dump_hlo_module_re='a -b'",  # quoted: one flag
])
def test_well_formed_xla_flags_are_quiet(value):
    assert settings.check_environment({"XLA_FLAGS": value}) == ()


def test_xla_flags_naming_a_flags_file_are_quiet(tmp_path):
    flags = tmp_path / "xla_flags.txt"  # XLA reads flags from a file when the value is not a flag
    flags.write_text("--xla_force_host_platform_device_count=2\n")
    assert settings.check_environment({"XLA_FLAGS": str(flags)}) == ()


# What each new warning claims, checked against JAX itself (each case in a fresh process).
COUNT = "--xla_force_host_platform_device_count"


@pytest.mark.parametrize("env, said", [
    ({"JAX_NUM_CPU_DEVICES": "abc"}, 'Invalid value "abc" for JAX flag jax_num_cpu_devices'),
    ({"JAX_NUM_CPU_DEVICES": "0"}, "Could not determine process_index for this process"),
    ({"XLA_FLAGS": "nonsense_flag"}, "to read flags for environment variable"),
    ({"XLA_FLAGS": f"{COUNT}=2 -b"}, "Unknown flag in XLA_FLAGS: -b"),
    ({"JAX_NUM_CPU_DEVICES": "-2"}, "devices: 1"),
    ({"XLA_FLAGS": f"{COUNT}=2 {COUNT[2:]}=3"}, "devices: 2"),  # the second is skipped
    ({"XLA_FLAGS": f"{COUNT} 2"}, f"Unknown flag in XLA_FLAGS: {COUNT}"),  # jax#1539's space
    # XLA stops at the first word without '-': the flags after it are never read
    ({"XLA_FLAGS": f"--xla_cpu_enable_fast_math=false stray {COUNT}=2"}, "devices: 1"),
    ({"XLA_FLAGS": f"--xla_cpu_enable_fast_math false {COUNT}=2"}, "devices: 1"),
    ({"XLA_FLAGS": f"{COUNT}=2 --xla_dump_max_hlo_modules -1"},
     "Unknown flags in XLA_FLAGS: --xla_dump_max_hlo_modules -1"),  # a value that is a flag
])
def test_new_warnings_say_what_jax_does(env, said):
    ws = settings.check_environment(env)
    assert len(ws) == 1
    child_env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": None, "JAX_NUM_CPU_DEVICES": None, **env}
    proc = run_python("import jax; print('devices:', len(jax.devices()))", env=child_env)
    if said.startswith("devices:"):  # JAX goes on quietly: the warning says so
        assert proc.returncode == 0 and said in proc.stdout, proc.stderr[-2000:]
        assert "without a warning" in ws[0].message
    else:  # JAX fails: the warning quotes the failure
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-2000:]
        assert said in ws[0].message


def test_jax_platforms_set_after_import_is_flagged():
    # this test process imported jax with JAX_PLATFORMS unset (config value None)
    import jax

    assert jax.config.jax_platforms in (None, "")
    ws = settings.check_environment({"JAX_PLATFORMS": "cpu"})
    assert codes(ws) == {"platforms-set-after-import"}


def test_allocator_changed_after_gpu_start(monkeypatch):
    monkeypatch.setattr(jaxcompat, "_hook_state", "installed")
    monkeypatch.setattr(jaxcompat, "_at_start",
                        {"cuda": {n: None for n in settings.ALLOCATOR_VARS}})
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    ws = settings.check_environment(env, started_platforms=("cuda",))
    assert codes(ws) == {"allocator-set-after-start"}
    assert "XLA_PYTHON_CLIENT_PREALLOCATE: None -> 'false'" in ws[0].message
    # unchanged since start: quiet
    assert settings.check_environment({}, started_platforms=("cuda",)) == ()


def test_allocator_change_found_when_the_hook_filed_cuda_under_gpu(monkeypatch):
    """JAX's CUDA client says platform "gpu"; the backend is named "cuda" (devices.probe)."""
    monkeypatch.setattr(jaxcompat, "_hook_state", "installed")
    monkeypatch.setattr(jaxcompat, "_at_start",
                        {"gpu": {n: None for n in settings.ALLOCATOR_VARS}})
    ws = settings.check_environment({"XLA_CLIENT_MEM_FRACTION": "0.5"},
                                    started_platforms=("cuda",))
    assert codes(ws) == {"allocator-set-after-start"}


def test_allocator_unverifiable_without_a_hook_in_this_jax(monkeypatch):
    monkeypatch.setattr(jaxcompat, "_hook_state", "unavailable")
    monkeypatch.setattr(jaxcompat, "_at_start", {})
    monkeypatch.setattr(settings, "_running_allocator", lambda platform: None)  # none to read
    ws = settings.check_environment({}, started_platforms=("cuda",))
    assert codes(ws) == {"allocator-settings-unverified"} and "0.10.2" in ws[0].message


# The H100's numbers (docs/gpu-runs/2026-11-26-nvidia-h100-80gb-hbm3.md, allocation step): a
# card of 81,559 MiB by nvidia-smi; by default a 59.38 GiB limit taken whole at start; with
# PREALLOCATE=false the same limit and a 0.25 GiB pool
H100_TOTAL, H100_LIMIT = 81559 * 2**20, int(59.38 * 2**30)
PREALLOCATED = {"bytes_limit": H100_LIMIT, "pool_bytes": H100_LIMIT, "bytes_in_use": 2**20,
                "peak_bytes_in_use": 2**28}
GROWN = {**PREALLOCATED, "pool_bytes": 2**28}
ASYNC = {k: v for k, v in PREALLOCATED.items() if k != "pool_bytes"}  # cuda_async: no pool count


@pytest.mark.parametrize("env, stats, says", [
    ({"XLA_CLIENT_MEM_FRACTION": "0.5"}, PREALLOCATED, "74.6% of the card's 79.65 GiB, but "
     "XLA_CLIENT_MEM_FRACTION=0.5 asks for 50%"),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, PREALLOCATED, "took its whole limit"),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "PLATFORM"}, PREALLOCATED, "it started with a pool"),
    ({}, None, "keeps no statistics, as XLA_PYTHON_CLIENT_ALLOCATOR=platform does"),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, PREALLOCATED,
     "is the BFC pool (its statistics count pool bytes), but the environment now asks for "
     "cuda_async"),
    ({}, ASYNC, "is cuda_async (its statistics have no pool bytes)"),
])
def test_without_a_hook_the_allocators_own_numbers_name_a_late_setting(monkeypatch, env, stats,
                                                                      says):
    # jax 0.11 keeps no record of the variables at the backend's start (the H100 run): what the
    # running allocator shows it started with is compared with what the environment asks now
    monkeypatch.setattr(jaxcompat, "_hook_state", "unavailable")
    monkeypatch.setattr(jaxcompat, "_at_start", {})
    monkeypatch.setattr(settings, "_running_allocator", lambda platform: (stats, H100_TOTAL))
    ws = settings.check_environment(env, started_platforms=("cuda",))
    assert [w.code for w in ws] == ["allocator-set-after-start"], ws
    assert says in ws[0].message and "restart the kernel" in ws[0].fix


@pytest.mark.parametrize("env, stats", [
    ({}, PREALLOCATED), ({"XLA_CLIENT_MEM_FRACTION": "0.75"}, PREALLOCATED),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, GROWN),  # as set at the start: a grown pool
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, None),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, ASYNC),
    ({"XLA_CLIENT_MEM_FRACTION": "0.7"}, PREALLOCATED),  # within the slack: not named
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},  # a full pool once used heavily: not proof
     {**PREALLOCATED, "peak_bytes_in_use": H100_LIMIT // 2}),
])
def test_without_a_hook_settings_the_allocator_shows_are_quiet(monkeypatch, env, stats):
    monkeypatch.setattr(jaxcompat, "_hook_state", "unavailable")
    monkeypatch.setattr(jaxcompat, "_at_start", {})
    monkeypatch.setattr(settings, "_running_allocator", lambda platform: (stats, H100_TOTAL))
    ws = settings.check_environment(env, started_platforms=("cuda",))
    assert not {w.code for w in ws} & {"allocator-set-after-start",
                                       "allocator-settings-unverified"}, ws


def test_a_mig_instance_or_an_uncertain_order_gives_no_card_size_to_judge_by(monkeypatch):
    # bytes_limit is a share of what CUDA sees: a MIG instance, not its card, and on mixed
    # models maybe not nvidia-smi's GPU 0; without a size known to be cuda:0's, nothing is judged
    from helpers import gpu

    monkeypatch.setattr(settings, "backends_started", lambda: True)
    monkeypatch.setattr("jax.devices", lambda platform: [type("D", (), {
        "memory_stats": lambda self: PREALLOCATED})()])
    card = gpu.GpuInfo(0, "NVIDIA A100 80GB", "GPU-aaaa", H100_TOTAL, "580",
                       migs=(gpu.MigInfo("MIG-bbbb", 10 * 2**30, 1, 0),))
    monkeypatch.setattr(gpu, "gpus", lambda: (card,))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert settings._running_allocator("cuda") is None  # the card, but CUDA sees an instance
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-bbbb")
    assert settings._running_allocator("cuda") == (PREALLOCATED, 10 * 2**30)  # its own size


def test_another_processs_environment_skips_this_processs_rules():
    import jax  # imported: JAX_PLATFORMS below differs from what it read

    assert jax.config.jax_platforms != "tpu"
    env = {"JAX_PLATFORMS": "tpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "no"}
    assert "platforms-set-after-import" in codes(settings.check_environment(env))
    assert codes(settings.check_environment(env, this_process=False)) == {
        "preallocate-ambiguous"}


def test_allocator_unverifiable_when_helpers_came_late(monkeypatch):
    monkeypatch.setattr(jaxcompat, "_hook_state", "late")
    monkeypatch.setattr(jaxcompat, "_at_start", {})
    monkeypatch.setattr(settings, "_running_allocator", lambda platform: None)
    ws = settings.check_environment({}, started_platforms=("cuda",))
    assert codes(ws) == {"allocator-settings-unverified"}


def test_hook_recorded_the_cpu_backend_start():
    # conftest imports jax before helpers but starts no backend, so the hook is installed
    import jax

    jax.devices()
    state, snaps = settings.backend_start_snapshot()
    if not jaxcompat.INTERNALS["register_backend_initialization_hook"].expected(
            jaxcompat.jax_version_tuple()):
        pytest.skip("this JAX has no backend-start hook (added in 0.10.2): the state is "
                    "'unavailable', checked in test_jaxcompat")
    assert state == "installed"
    assert "cpu" in snaps and set(snaps["cpu"]) == set(jaxcompat.STARTUP_VARS)
    assert set(settings.ALLOCATOR_VARS) < set(jaxcompat.STARTUP_VARS)


def test_read_environment_lists_every_variable():
    env = settings.read_environment({"XLA_FLAGS": "--foo"})
    names = [e.name for e in env]
    assert names == list(settings.VARIABLES)
    assert dict((e.name, e.value) for e in env)["XLA_FLAGS"] == "--foo"


# --- XLA_FLAGS as XLA reads it (xla/parse_flags_from_env.h: a first '-' means flags) ---------
def test_a_one_dash_flag_is_an_unknown_flag_not_a_file_name():
    (w,) = settings.check_environment({"XLA_FLAGS": "-bad"}, this_process=False)
    assert w.code == "malformed-xla-flags"
    assert "Unknown flag in XLA_FLAGS: -bad" in w.message and "file" not in w.message


def test_a_value_without_a_dash_is_read_as_a_file_name():
    (w,) = settings.check_environment({"XLA_FLAGS": "nonsense"}, this_process=False)
    assert "name of a file" in w.message and "Could not open file" in w.message


def test_an_en_dash_is_named_with_its_code_point_and_retyped():
    env = {"XLA_FLAGS": "\u2013\u2013xla_force_host_platform_device_count=8"}
    ws = {w.code: w for w in settings.check_environment(env, this_process=False)}
    assert "U+2013 EN DASH" in ws["non-ascii-xla-flags"].message
    assert "'--xla_force_host_platform_device_count=8'" in ws["non-ascii-xla-flags"].fix
    assert "malformed-xla-flags" in ws  # XLA would look for a file of that name


def test_the_doctor_quotes_the_same_error_as_xla():
    """The report's own warning and XLA's line (from the child) say the same thing."""
    from helpers import doctor

    r = doctor.diagnose({"XLA_FLAGS": "-bad"})
    (failed,) = r.failed_backends
    (warning,) = [w for w in r.warnings if w.code == "malformed-xla-flags"]
    assert "Unknown flag in XLA_FLAGS: -bad" in failed.error
    assert "Unknown flag in XLA_FLAGS: -bad" in warning.message


# --- the running process (settings.check_process) ------------------------------------------
def test_a_setting_equal_to_jaxs_default_has_no_effect():
    env = {"XLA_CLIENT_MEM_FRACTION": ".75", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    (w,) = settings.check_environment(env, this_process=False)
    assert w.code == "setting-is-default" and "no effect" in w.message
    assert "XLA_CLIENT_MEM_FRACTION=.75" in w.message and "PREALLOCATE=true" in w.message
    assert settings.check_environment({"XLA_CLIENT_MEM_FRACTION": "0.5"},
                                      this_process=False) == ()


def test_assigning_jax_default_device_is_named_and_moves_nothing(monkeypatch):
    import jax
    import jax.numpy as jnp

    monkeypatch.setattr(jax, "default_device", jax.devices()[2])  # the mistake, undone after
    c = settings.check_process()
    assert "default-device-assigned" in codes(c.warnings)
    assert jnp.ones(3).devices() == {jax.devices()[0]}  # what the warning says: nothing moved
    assert "with jax.default_device(device):" in str(c)


def test_a_cpu_device_count_set_after_start(monkeypatch):
    import jax

    have = len(jax.devices("cpu"))
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", str(have + 4))
    c = settings.check_process()
    (w,) = [w for w in c.warnings if w.code == "cpu-devices-set-after-start"]
    assert f"started with {have}" in w.message and c.devices["cpu"] == have
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", str(have))
    assert "cpu-devices-set-after-start" not in codes(settings.check_process().warnings)


_JAX_23208 = """
import jax
from helpers import settings
try:
    jax.numpy.ones(3)
except AssertionError as err:
    print("bare" if not str(err) else "worded")
(w,) = [w for w in settings.check_process().warnings if w.code == "cuda-alone-without-gpu"]
print(w.message, "|", w.fix)
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "helpers")
shell.run_cell("import jax; jax.devices()")
"""


def test_jax_23208_jax_platforms_cuda_alone_where_no_gpu_is_visible_fails_bare():
    """jax-ml/jax#23208's setting: JAX_PLATFORMS=cuda on a machine where no NVIDIA GPU is
    visible (a CPU node, a container without --gpus). JAX skips 'cuda' and fails with a bare
    AssertionError; check_process() said "no known mistake" and %load_ext nothing. Both now
    name it, and the fix it gives, JAX_PLATFORMS=cuda,cpu, starts the CPU backend."""
    import os

    from tests.conftest import run_python

    if any(os.path.exists(f) for f in settings._NVIDIA_DEVICE_FILES):
        pytest.skip("an NVIDIA GPU is visible here: JAX starts cuda or says why not")
    pytest.importorskip("IPython")
    out = run_python(_JAX_23208, env={"JAX_PLATFORMS": "cuda"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == "bare"
    assert "JAX_PLATFORMS='cuda' asks for the CUDA backend alone" in out.stdout
    assert "bare AssertionError" in out.stdout and "JAX_PLATFORMS=cuda,cpu" in out.stdout
    assert "JAX Device Kit: why JAX could not start: JAX_PLATFORMS='cuda'" in out.stdout
    fixed = run_python("import jax; print(jax.default_backend())",
                       env={"JAX_PLATFORMS": "cuda,cpu"})
    assert fixed.returncode == 0 and fixed.stdout.split()[-1] == "cpu", fixed.stderr[-2000:]
    for fine in ("cuda,cpu", "cpu", ""):  # another process's: the environment alone
        assert settings.check_environment({"JAX_PLATFORMS": fine}, this_process=False) == ()


_JAX_6887 = """
import os
os.environ.pop("XLA_FLAGS", None); os.environ.pop("JAX_NUM_CPU_DEVICES", None)
import jax
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"  # after import: read
print(len(jax.devices("cpu")))
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=5"  # after start: not
from helpers import settings
(w,) = [w for w in settings.check_process().warnings if w.code == "cpu-devices-set-after-start"]
print(len(jax.devices("cpu")), w.message)
"""


def test_jax_6887_xla_flags_count_is_read_when_the_backend_starts_not_at_import(monkeypatch):
    """jax-ml/jax#6887: XLA_FLAGS' device count set after the backend started has no effect.
    The kit said JAX reads it "at `import jax`"; set after the import but before the first
    operation it still counts (3 devices), so the warning says when it is read: the backend's
    start for XLA_FLAGS, the import for JAX_NUM_CPU_DEVICES (whose count, set after the
    import, is ignored: checked on jax 0.8.0, 0.10.2 and 0.12.0.1)."""
    from tests.conftest import run_python

    out = run_python(_JAX_6887, env={"JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first == "3" and second.startswith("3 ")
    assert "asks for 5 CPU devices" in second and "started with 3" in second
    assert "XLA_FLAGS once, when the CPU backend starts" in second and "import jax" not in second
    import jax

    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", str(len(jax.devices("cpu")) + 1))
    (w,) = [w for w in settings.check_process().warnings
            if w.code == "cpu-devices-set-after-start"]
    assert "JAX_NUM_CPU_DEVICES once, at `import jax`" in w.message


def test_xla_flags_changed_after_start_in_a_real_process():
    from tests.conftest import run_python

    out = run_python(
        "import os, jax\nfrom helpers import settings\njax.numpy.ones(1)\n"
        "print(sorted(w.code for w in settings.check_process().warnings))\n"
        "os.environ['XLA_FLAGS'] = '--xla_cpu_enable_fast_math=false'\n"
        "print(sorted(w.code for w in settings.check_process().warnings))\n"
        "print(settings.check_process().hook)", env={"XLA_FLAGS": None, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    before, after, hook = out.stdout.strip().splitlines()[-3:]
    assert "xla-flags-set-after-start" not in before
    if hook == "installed":  # jax 0.10.2-0.10.x: the hook saw the start
        assert "xla-flags-set-after-start" in after
    else:
        assert hook == "unavailable"


def test_a_gpu_backend_that_holds_no_array_is_named():
    import jax.numpy as jnp

    kept = jnp.ones(3)  # every live array is on the CPU here
    ws = settings.check_environment({}, started_platforms=("cpu", "cuda"))
    (w,) = [w for w in ws if w.code == "gpu-backend-unused"]
    assert "JAX_PLATFORMS=cpu" in w.fix and kept.devices()


def test_check_process_before_jax_starts():
    from tests.conftest import run_python

    out = run_python("import sys\nfrom helpers import settings\nc = settings.check_process()\n"
                     "print(c.platforms, 'jax' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["()", "False"]


def test_once_the_backends_run_jax_platforms_is_judged_against_them():
    """jax#10320: with the backends running, the ones that run are the truth: the variable
    as it was, a change to it, and jax.config.update after the start."""
    import jax

    jax.devices()  # started
    running = tuple(b for b in ("cpu",))
    assert codes(settings.check_environment({"JAX_PLATFORMS": "cpu"},
                                            started_platforms=running)) == set()
    ws = settings.check_environment({"JAX_PLATFORMS": "cuda"}, started_platforms=running)
    (w,) = [w for w in ws if w.code == "platforms-set-after-import"]
    assert "the backends running are cpu" in w.message


def test_a_config_update_of_jax_platforms_after_the_start_is_named():
    code = ("import jax, jax.numpy as jnp\nfrom helpers import settings\njnp.zeros(3)\n"
            "jax.config.update('jax_platforms', 'cpu,cuda')\n"
            "print(sorted(w.code for w in settings.check_process().warnings))")
    proc = run_python(code, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "platforms-updated-after-start" in proc.stdout
    assert "platforms-set-after-import" not in proc.stdout  # JAX_PLATFORMS=cpu is what runs


def test_cuda_visible_devices_emptied_after_the_gpu_started_is_too_late():
    """juliuskunze/jaxnet#6: set it before JAX starts; afterwards it changes nothing."""
    (before,) = settings.check_environment({"CUDA_VISIBLE_DEVICES": ""})
    assert "JAX runs on the CPU" in before.message and "JAX_PLATFORMS=cpu" in before.fix
    (after,) = [w for w in settings.check_environment(
        {"CUDA_VISIBLE_DEVICES": ""}, started_platforms=("cpu", "cuda"))
        if w.code == "no-visible-gpu"]  # the GPU backend's start faked: this VM has none
    assert "already started" in after.message and "no effect" in after.message


def test_jax_enable_x64_set_after_import_is_named():
    code = ("import os, jax, jax.numpy as jnp\nfrom helpers import settings\n"
            "os.environ['JAX_ENABLE_X64'] = '1'  # too late\n"
            "print(jnp.ones(2, jnp.float64).dtype)\n"
            "print(sorted(w.code for w in settings.check_process().warnings))\n"
            "jax.config.update('jax_enable_x64', True)  # the fix that works after import\n"
            "print(jnp.ones(2, jnp.float64).dtype)\n"
            "print(sorted(w.code for w in settings.check_process().warnings))")
    proc = run_python(code, env={"JAX_ENABLE_X64": None})
    assert proc.returncode == 0, proc.stderr[-1500:]
    before, codes_before, after, codes_after = proc.stdout.splitlines()[:4]
    assert before == "float32" and "x64-set-after-import" in codes_before
    assert after == "float64" and "x64-set-after-import" not in codes_after


def _fake_tensorflow(gpus: int, growth: bool = False):
    """A stand-in for TensorFlow's module: the two config calls the rule makes, nothing else
    (TensorFlow is not a dependency of the kit, and this machine has no GPU)."""
    from types import SimpleNamespace

    found = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(gpus)]
    return SimpleNamespace(config=SimpleNamespace(
        get_visible_devices=lambda kind: found if kind == "GPU" else [],
        experimental=SimpleNamespace(get_memory_growth=lambda d: growth)))


def _fake_torch(started: bool, reserved: int):
    from types import SimpleNamespace

    return SimpleNamespace(cuda=SimpleNamespace(
        is_initialized=lambda: started, device_count=lambda: 1,
        memory_reserved=lambda i: reserved))


def test_tensorflow_that_sees_the_gpu_is_named_with_its_fix(monkeypatch):
    """flax#445 (and google-deepmind/acme#208's tf.data pipeline): TensorFlow in the same process
    takes most of the GPU at its first operation; the fix is to hide the GPU from it (the GPU
    faked: a stand-in module)."""
    monkeypatch.setitem(sys.modules, "tensorflow", _fake_tensorflow(1))
    (w,) = [w for w in settings.check_environment({}) if w.code == "tensorflow-sees-the-gpu"]
    assert "sees 1 GPU(s)" in w.message and "DNN library initialization failed" in w.message
    assert "tf.config.set_visible_devices([], 'GPU')" in w.fix
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in w.fix
    for quiet, env in ((_fake_tensorflow(0), {}), (_fake_tensorflow(1, growth=True), {}),
                       (_fake_tensorflow(1), {"TF_FORCE_GPU_ALLOW_GROWTH": "true"})):
        monkeypatch.setitem(sys.modules, "tensorflow", quiet)  # hidden, or growing on demand
        assert not [w for w in settings.check_environment(env)
                    if w.code == "tensorflow-sees-the-gpu"]
    monkeypatch.setitem(sys.modules, "tensorflow", object())  # a module without tf.config
    assert not [w for w in settings.check_environment({}) if "tensorflow" in w.code]
    monkeypatch.setitem(sys.modules, "tensorflow", _fake_tensorflow(1))
    assert not [w for w in settings.check_environment({}, this_process=False)
                if "tensorflow" in w.code]  # another process's environment: not this one's


def test_pytorch_that_started_cuda_is_named_with_what_it_holds(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(True, 3 * 2**30))
    (w,) = [w for w in settings.check_environment({}) if w.code == "pytorch-holds-the-gpu"]
    assert "holds 3.00 GiB (torch.cuda.memory_reserved)" in w.message
    assert "torch.cuda.empty_cache()" in w.fix
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False, 0))  # torch on the CPU only
    assert not [w for w in settings.check_environment({}) if w.code == "pytorch-holds-the-gpu"]


def test_nixpkgs_158186_tensorflow_growing_beside_jax_still_needs_jax_s_share_lowered(
        monkeypatch):
    """NixOS/nixpkgs#158186: the JAX+TFDS example needed both TF_FORCE_GPU_ALLOW_GROWTH=true
    and XLA_PYTHON_CLIENT_MEM_FRACTION=.7, "setting only one ... is not sufficient" (jax#9454).
    With growth on, check_process said nothing of TensorFlow (the GPU faked: a stand-in
    module)."""
    from helpers import allocation

    for tf, env in ((_fake_tensorflow(1), {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}),
                    (_fake_tensorflow(1, growth=True), {})):
        monkeypatch.setitem(sys.modules, "tensorflow", tf)
        found = [w for w in settings.check_environment(env) if "tensorflow" in w.code]
        (w,) = found
        assert w.code == "tensorflow-grows-beside-jax"
        assert "with memory growth on" in w.message and "CUDA context" in w.message
        assert "JAX's pool takes 75% of the card" in w.message
        assert "growth alone is not enough" in w.message and "nixpkgs#158186" in w.message
        assert "not yet run on a GPU" in w.message
        assert "XLA_PYTHON_CLIENT_MEM_FRACTION=.7" in w.fix
        assert "tf.config.set_visible_devices([], 'GPU')" in w.fix
        # the fix: JAX's share lowered (or its pool not taken up front) leaves the rule quiet
        for fixed in ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".7"}, {"XLA_CLIENT_MEM_FRACTION": "0.5"},
                      {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}):
            assert not [w for w in settings.check_environment({**env, **fixed})
                        if "tensorflow" in w.code]
        assert [w for w in settings.check_environment(
            {**env, "XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}) if "tensorflow" in w.code]
    # what the fix leaves TensorFlow on an 80 GB card, by XLA's rules (not run on a GPU)
    card = 80 * 10**9
    default = allocation.predict({}, card).upfront_bytes
    lowered = allocation.predict({"memory_fraction": 0.7}, card).upfront_bytes
    assert round((card - default) / 10**9) == 20 and round((card - lowered) / 10**9) == 24
    # the warning for TensorFlow without growth names both halves of the thread's fix
    monkeypatch.setitem(sys.modules, "tensorflow", _fake_tensorflow(1))
    (w,) = [w for w in settings.check_environment({}) if "tensorflow" in w.code]
    assert w.code == "tensorflow-sees-the-gpu"
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in w.fix and "XLA_PYTHON_CLIENT_MEM_FRACTION" in w.fix
    monkeypatch.setitem(sys.modules, "tensorflow", _fake_tensorflow(0, growth=True))  # hidden
    assert not [w for w in settings.check_environment({}) if "tensorflow" in w.code]


#: jax-ml/jax#19004's error, as JAX kept it for the skipped backend (jax 0.4's version check,
#: jax/_src/xla_bridge.py), and the later plugin's wording of the same check
#: (jax_plugins/cuda/__init__.py)
_CUDNN_OLDER = ("Found cuDNN version 8500, but JAX was built against version 8600, which is "
                "newer. The copy of cuDNN that is installed must be at least as new as the "
                "version against which JAX was built.")
_CUDNN_OUTDATED = ("Unable to use CUDA because of the following issues with CUDA components:\n"
                   "Outdated cuDNN installation found.\nVersion JAX was built against: 91000\n"
                   "Minimum supported: 910\nInstalled version: 90100\nThe local installation "
                   "version must be no lower than 910.")


def test_jax_19004_a_cudnn_older_than_jaxlib_s_with_torch_imported_first_is_named(monkeypatch):
    """jax-ml/jax#19004 (and #18032): `import torch` before JAX's first operation, then "CUDA
    backend failed to initialize: Found cuDNN version 8500, but JAX was built against version
    8600", and JAX quietly runs on the CPU. devices.probe called the skipped backend "harmless
    unless you expected this backend". A stand-in, as no GPU is here: the thread's text as
    JAX's record of the skipped backend, and a torch module; not run on a GPU."""
    from helpers import devices

    def cuda_hint(error: str) -> str:
        monkeypatch.setattr(jaxcompat, "backend_errors", lambda: {"cuda": error})
        (cuda,) = [f for f in devices.probe().failed_backends if f.name == "cuda"]
        return cuda.hint

    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False, 0))  # imported, CUDA unused
    hint = cuda_hint(_CUDNN_OLDER)
    assert "harmless" not in hint
    assert "JAX did not start its cuda backend, so no GPU is used" in hint
    assert "the cuDNN found (8500) is older than the one jaxlib was built against (8600)" in hint
    assert "torch is imported in this process" in hint and "older copy of cuDNN" in hint
    assert "Start JAX before importing torch (jax.devices() first)" in hint
    assert "install versions that agree" in hint and "jax-ml/jax#19004" in hint
    assert "not yet run on a GPU" in hint
    assert "(90100) is older than the one jaxlib was built against (91000)" in cuda_hint(
        _CUDNN_OUTDATED)
    monkeypatch.setitem(sys.modules, "tensorflow", _fake_tensorflow(0))
    assert "torch and tensorflow is imported" in cuda_hint(_CUDNN_OLDER)
    # no framework imported: the older library is still the cause, and no word of torch
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delitem(sys.modules, "tensorflow")
    alone = cuda_hint(_CUDNN_OLDER)
    assert "is older than" in alone and "torch" not in alone and "harmless" not in alone
    assert 'pip install -U "jax[cuda12]"' in alone
    # another skip keeps its words
    assert "harmless unless you expected this backend" in cuda_hint(
        "no CUDA-capable device is detected")


# jax-ml/jax#9190: a PyTorch DataLoader's worker processes, forked from a process running JAX,
# hang. The kit counts each os.fork() after JAX started, by the line that made it, and names
# the fix; a fork before JAX started, and a subprocess (no fork handlers), are not counted.
_FORKS = """
import multiprocessing, os, subprocess, sys
import helpers  # alone: the fork handler is in place from here on
records = sys.modules['helpers._internal.forks']
pid = os.fork()  # LINE-EARLY: before JAX started
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
import jax.numpy as jnp
jnp.ones(3).block_until_ready()
subprocess.run([sys.executable, '-c', 'pass'], check=True)
print('BEFORE', records.forks_after_start())
ctx = multiprocessing.get_context('fork')
workers = [ctx.Process(target=int) for _ in range(2)]  # two workers, as a DataLoader's
for p in workers:
    p.start()  # LINE-START
for p in workers:
    p.join()
pid = os.fork()  # LINE-FORK
if pid == 0:  # the child's record starts empty: its parent's forks are not its own
    os._exit(0 if not records.forks_after_start() else 3)
print('CHILD', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
from helpers import settings
(w,) = [w for w in settings.check_process().warnings if w.code == 'forked-after-jax-started']
print('MESSAGE', w.message)
print('FIX', w.fix)
"""


def test_jax_9190_a_fork_after_jax_started_is_named_with_its_line_and_the_fix():
    proc = run_python(_FORKS, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "BEFORE {}" in out  # neither the fork before JAX started nor the subprocess
    assert "CHILD 0" in out
    message = out.split("MESSAGE", 1)[1]
    assert "called os.fork() 3 time(s) after JAX started its backends" in message
    def line(marker):  # the script's lines, as the kit names code run by python -c
        return "<string>:" + str(1 + _FORKS.splitlines().index(
            next(t for t in _FORKS.splitlines() if marker in t)))

    assert f"(2 from {line('LINE-START')}; 1 from {line('LINE-FORK')})" in message
    assert line("LINE-EARLY") not in message
    assert "copies JAX's locks but not its threads" in message
    assert "multiprocessing.get_context('spawn')" in message
    assert "multiprocessing_context='spawn'" in message and "NumPy" in message


def test_the_fork_handler_takes_no_lock_of_jax_s():
    """The fork handler runs inside os.fork: it must not wait on JAX's _backend_lock, which
    backends_are_initialized takes (a fork on a thread that holds it would never return). The
    test looks inside JAX; the kit reads the backends without the lock."""
    proc = run_python(
        "import os, helpers, jax.numpy as jnp\n"
        "jnp.ones(2).block_until_ready()\n"
        "from jax._src import xla_bridge  # the test looks inside; the kit does not\n"
        "with xla_bridge._backend_lock:  # held by the forking thread itself\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('FORKS', sum(helpers._internal.forks.forks_after_start().values()))",
        env={"JAX_PLATFORMS": "cpu"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "FORKS 1" in proc.stdout  # counted, without the lock


def test_jax_1539_a_true_false_flag_given_its_value_after_a_space_is_set_true(tmp_path):
    """jax-ml/jax#1539 (#743's snippet): flags written with a space before the value. XLA
    reads '--flag' alone, so '--xla_dump_hlo_as_proto false' dumps protos, as '=false' does
    not; the warning says so and joins them with '='. A word that names no XLA flag is told
    to go, not to take '--' (which aborts: the doctor's second advice had contradicted the
    first), with the thread's way to fewer CPU threads."""
    def protos(flags: str) -> int:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_dump_to={out} {flags}"}
        proc = run_python("import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3))",
                          env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return len(list(out.glob("*.pb")))

    assert protos("--xla_dump_hlo_as_proto false") > 0 == protos("--xla_dump_hlo_as_proto=false")
    (w,) = settings.check_environment({"XLA_FLAGS": "--xla_dump_hlo_as_proto false"})
    assert "a true/false flag is set to true" in w.message
    assert w.fix == "join each flag to its value with '=': --xla_dump_hlo_as_proto=false"
    (w,) = settings.check_environment(
        {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"})
    assert "remove 'intra_op_parallelism_threads=1'" in w.fix and "taskset" in w.fix
    assert not w.fix.startswith("start")
    proc = run_python("import jax; jax.devices()", env={
        "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--intra_op_parallelism_threads=1"})
    assert "Unknown flag in XLA_FLAGS: --intra_op_parallelism_threads=1" in proc.stderr
    (w,) = settings.check_environment({"XLA_FLAGS": "--xla_dump_hlo_as_text xla_dump_to=/tmp/x"})
    assert w.fix.startswith("start 'xla_dump_to=/tmp/x' with '--'")


_STRAY_WORD = """
import jax
print(len(jax.devices("cpu")))
from helpers import settings
for w in settings.check_process().warnings:
    print(w.code, "|", w.message, "|", w.fix)
"""


def test_jax_1539_a_stray_word_in_xla_flags_hides_every_flag_after_it():
    """A review of jax-ml/jax#1539's fix: XLA stops reading XLA_FLAGS at the first word that
    does not start with '-' (its parser gives up there), so a flag after a stray word or a
    value given after a space is never read. The kit said only that word was skipped, and the
    doctor then blamed the lost device count on a late setting, with a restart that cannot
    help. It now names the flags never read, and the restart advice is gone."""
    for flags in (f"--xla_cpu_enable_fast_math=false stray {COUNT}=2",
                  f"--xla_cpu_enable_fast_math false {COUNT}=2"):
        out = run_python(_STRAY_WORD, env={"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags,
                                           "JAX_NUM_CPU_DEVICES": None})
        assert out.returncode == 0, out.stderr[-2000:]
        lines = out.stdout.strip().splitlines()
        assert lines[0] == "1"  # the count after the stray word: never read
        said = [line for line in lines[1:] if "XLA_FLAGS" in line]
        assert len(said) == 1 and f"{COUNT}=2 after it" in said[0], lines
        assert not any(line.startswith("cpu-devices-set-after-start") for line in lines)
    fixed = run_python(_STRAY_WORD, env={
        "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": None,
        "XLA_FLAGS": f"--xla_cpu_enable_fast_math=false {COUNT}=2"})  # the word removed
    assert fixed.returncode == 0 and fixed.stdout.split()[0] == "2", fixed.stderr[-2000:]
    # a flag after the stray word is never read: it cannot abort (a review: it was said to)
    (w,) = settings.check_environment({"XLA_FLAGS": f"--a=1 stray {COUNT} 2"})
    assert w.code == "xla-flags-ignored" and "abort" not in w.message
    # a backslash before a space: XLA stops at the word after it, where shlex sees one value
    (w,) = settings.check_environment({"XLA_FLAGS": f"--xla_dump_to=/tmp/a\\ b {COUNT}=2"})
    assert "'b'" in w.message and f"{COUNT}=2 after it" in w.message
    assert "quote the value" in w.fix and "remove 'b'" not in w.fix
    # a flag inside an unterminated quoted value is read as that value: no late-count blame
    quoted = run_python(_STRAY_WORD, env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": None,
                                          "XLA_FLAGS": f'--xla_dump_to="/tmp/kit-x {COUNT}=2'})
    assert quoted.returncode == 0 and quoted.stdout.split()[0] == "1", quoted.stderr[-2000:]
    assert "cpu-devices-set-after-start" not in quoted.stdout
    (w,) = settings.check_environment({"XLA_FLAGS": "--xla_dump_to='/tmp/a b' --x 'c d'"})
    assert w.fix.endswith("--x='c d'")  # a value with a space, quoted as the shell needs
    assert settings.check_environment({"XLA_FLAGS": "--xla_dump_to='/tmp/a b'"}) == ()


def test_nemos_208_fraction_and_preallocate_beside_the_platform_allocator_are_named_moot():
    """flatironinstitute/nemos#208: the advice set PREALLOCATE=false, MEM_FRACTION=0.5 and
    ALLOCATOR=platform together; beside the platform allocator the first two do nothing
    (XLA's allocator options say so; the kit's own pool model, allocation.predict, agrees:
    no pool, no cap). check_environment said "no warnings" (a new user's trial)."""
    from helpers import allocation

    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
           "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    (w,) = settings.check_environment(env, this_process=False)
    assert w.code == "moot-beside-platform-allocator"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 and XLA_PYTHON_CLIENT_PREALLOCATE=false" \
        in w.message and "not yet run on a GPU" in w.message
    p = allocation.predict({"allocator": "platform", "memory_fraction": 0.5,
                            "preallocate": False}, 80 * 2**30)
    assert p.cap_bytes is None and p.upfront_bytes == 0  # the model: no cap, nothing taken
    assert settings.check_environment({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
                                      this_process=False) == ()
    bfc = dict(env, XLA_PYTHON_CLIENT_ALLOCATOR="bfc")
    assert "moot-beside-platform-allocator" not in codes(
        settings.check_environment(bfc, this_process=False))


def test_jaxsim_322_a_cache_folder_set_in_os_environ_after_import_is_named(tmp_path):
    """gbionics/jaxsim#322's variant (a new user's trial): JAX_COMPILATION_CACHE_DIR put in
    os.environ after `import jax` does nothing (JAX reads each JAX_ variable of a config
    option once, at import), and check_process said "no known mistake". The fix it names,
    jax.config.update, is run: the folder fills, and the warning goes."""
    import os

    import jax
    import jax.numpy as jnp

    from helpers import settings

    folder = str(tmp_path / "cache")
    env = {"JAX_COMPILATION_CACHE_DIR": folder, "JAX_DEBUG_NANS": "t"}
    (late, nans) = [w for w in settings.check_environment(env)
                    if w.code == "jax-variable-after-import"]
    assert late.message.startswith(f"JAX_COMPILATION_CACHE_DIR is {folder!r} now, but "
                                   "jax.config.jax_compilation_cache_dir is"), late.message
    assert f"jax.config.update('jax_compilation_cache_dir', {folder!r})" in late.fix
    assert "jax.config.update('jax_debug_nans', True)" in nans.fix  # bool_env's "t"
    saved = {k: jax.config.values[k] for k in ("jax_compilation_cache_dir",
                                               "jax_persistent_cache_min_compile_time_secs",
                                               "jax_persistent_cache_min_entry_size_bytes")}
    try:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.jit(lambda x: x * 3.0 + 2.0)(jnp.arange(7.0)).block_until_ready()
        assert os.listdir(folder)  # the cache is written
        assert not [w for w in settings.check_environment({"JAX_COMPILATION_CACHE_DIR": folder})
                    if w.code == "jax-variable-after-import"]
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
    same = {"JAX_DEBUG_NANS": "0", "JAX_ENABLE_X64": ""}  # the values in effect: nothing
    assert not [w for w in settings.check_environment(same)
                if w.code == "jax-variable-after-import"]


def test_jax_13789_debug_nans_left_on_is_named_with_the_switch_off():
    """jax-ml/jax#13789 (a new user's trial): JAX_DEBUG_NANS left on after a NaN hunt slows
    training without a word; check_process and the doctor said "no known mistake". With it on
    a jitted call's outputs are read back for the check (jax/_src/dispatch.py)."""
    import jax
    import jax.numpy as jnp

    from helpers import settings

    step = jax.jit(lambda w: jnp.tanh(w @ w) @ w)
    w = jnp.ones((512, 512)) / 512
    try:
        jax.config.update("jax_debug_nans", True)
        (on,) = [x for x in settings.check_environment({}) if x.code == "debug-nans-on"]
        assert "a call waits for its result" in on.message and "13789" in on.message
        assert on.fix.startswith("jax.config.update('jax_debug_nans', False)")
        assert not bool(jnp.isnan(step(w)).any())  # the step runs under it (its cost is
        # JAX's source, jax/_src/dispatch.py's check of each output: not timed here)
    finally:
        jax.config.update("jax_debug_nans", False)
    assert not [x for x in settings.check_environment({}) if x.code.startswith("debug-")]
    try:
        jax.config.update("jax_disable_jit", True)
        assert [x for x in settings.check_environment({}) if x.code == "jit-disabled"]
    finally:
        jax.config.update("jax_disable_jit", False)
    assert not [x for x in settings.check_environment({}) if x.code == "jit-disabled"]


def test_a_config_option_held_by_a_with_block_is_not_called_set_after_import():
    """A review: inside compiles.watch() (the kit's own jax.explain_cache_misses(True) block)
    JAX_EXPLAIN_CACHE_MISSES=0 was called "set after import"; the option's value for the
    process is what counts, not a block's. The transfer guards, which JAX_TRANSFER_GUARD sets
    together and the kit's trace holds, are left out."""
    import jax

    from helpers import compiles, settings

    with compiles.watch():
        assert jax.config.jax_explain_cache_misses  # the kit's block holds it on
        assert not [w for w in settings.check_environment({"JAX_EXPLAIN_CACHE_MISSES": "0"})
                    if w.code == "jax-variable-after-import"]
    both = {"JAX_TRANSFER_GUARD": "disallow", "JAX_TRANSFER_GUARD_HOST_TO_DEVICE": "log"}
    assert not [w for w in settings.check_environment(both)
                if w.code == "jax-variable-after-import"]


# huggingface/diffusers#1794: a library's default argument, key=jax.random.PRNGKey(0), started
# JAX's backend at import (on a GPU its pool, 75% of the card, in a PyTorch program). With the
# kit imported first and JAX not yet, the kit's hook was never installed ("hook late").
_STARTED_BY_AN_IMPORT = """
import os, sys, tempfile
from helpers import settings  # the kit first; JAX not imported yet
folder = tempfile.mkdtemp()
with open(os.path.join(folder, 'scheduler_lib.py'), 'w') as f:
    f.write('import jax\\n'
            'def step(x, key=jax.random.PRNGKey(0)):  # made as the module is imported\\n'
            '    return x\\n')
sys.path.insert(0, folder)
import importlib.util
assert importlib.util.find_spec('jax') is not None  # a library's availability check first
import scheduler_lib
c = settings.check_process()
print('FINDER', any(type(f).__name__ == '_WhenJaxImports' for f in sys.meta_path))
print('HOOK', c.hook)
print('AT', c.started_at)
print('IMPORTING', c.started_importing)
print(c)
"""


def test_diffusers_1794_a_backend_started_by_an_import_is_seen_and_named_with_its_line():
    if not jaxcompat.INTERNALS["register_backend_initialization_hook"].expected(
            jaxcompat.jax_version_tuple()):
        pytest.skip("this JAX has no backend-start hook (0.10.x only): the state is "
                    "'unavailable', checked in test_jaxcompat")
    proc = run_python(_STARTED_BY_AN_IMPORT, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "HOOK installed" in out, out
    assert "AT scheduler_lib.py:2: def step(x, key=jax.random.PRNGKey(0))" in out, out
    assert "IMPORTING True" in out and "FINDER False" in out  # (it left once jax was in)
    assert "started by: scheduler_lib.py:2:" in out and "while a module was being imported" in out


def test_a_gpu_backend_started_by_an_import_is_a_mistake_unless_jax_s_share_is_lowered(
        monkeypatch):
    """The GPU half of diffusers#1794 (from the thread, not yet run on a GPU): the rule reads
    the hook's record and the platforms started, as check_process passes them."""
    monkeypatch.setattr(settings, "started_importing", lambda: True)
    monkeypatch.setattr(settings, "started_at", lambda: "scheduling.py:7: key=PRNGKey(0)")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert not [w for w in settings.check_environment({}, started_platforms=("cuda", "cpu"))
                if w.code == "gpu-started-by-an-import"]  # JAX alone: the pool it would take
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # a PyTorch program
    (w,) = [w for w in settings.check_environment({}, started_platforms=("cuda", "cpu"))
            if w.code == "gpu-started-by-an-import"]
    assert "beside torch" in w.message
    assert "scheduling.py:7" in w.message and "75% of the card" in w.message
    assert "diffusers#1794" in w.message and "JAX_PLATFORMS=cpu before that import" in w.fix
    lowered = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert not [w for w in settings.check_environment(lowered, started_platforms=("cuda",))
                if w.code == "gpu-started-by-an-import"]
    assert not [w for w in settings.check_environment({}, started_platforms=("cpu",))
                if w.code == "gpu-started-by-an-import"]
    monkeypatch.setattr(settings, "started_importing", lambda: False)
    assert not [w for w in settings.check_environment({}, started_platforms=("cuda",))
                if w.code == "gpu-started-by-an-import"]
