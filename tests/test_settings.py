import pytest

from helpers import settings


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
    ("-0.2", "mem-fraction-out-of-range"), ("half", "bad-mem-fraction"),
])
@pytest.mark.parametrize("name", ["XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"])
def test_fraction_outside_unit_interval(name, value, code):
    ws = settings.check_environment({name: value})
    assert codes(ws) == {code}
    assert name in ws[0].message


@pytest.mark.parametrize("value", ["0.75", "1", "0.1"])
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


def test_jax_platforms_set_after_import_is_flagged():
    # this test process imported jax with JAX_PLATFORMS unset (config value None)
    import jax

    assert jax.config.jax_platforms in (None, "")
    ws = settings.check_environment({"JAX_PLATFORMS": "cpu"})
    assert codes(ws) == {"platforms-set-after-import"}


def test_allocator_changed_after_gpu_start(monkeypatch):
    monkeypatch.setattr(settings, "_hook_state", "installed")
    monkeypatch.setattr(settings, "_at_start", {"cuda": {n: None for n in settings.ALLOCATOR_VARS}})
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    ws = settings.check_environment(env, started_platforms=("cpu", "cuda"))
    assert codes(ws) == {"allocator-set-after-start"}
    assert "XLA_PYTHON_CLIENT_PREALLOCATE: None -> 'false'" in ws[0].message
    # unchanged since start: quiet
    assert settings.check_environment({}, started_platforms=("cuda",)) == ()


def test_allocator_unverifiable_when_helpers_came_late(monkeypatch):
    monkeypatch.setattr(settings, "_hook_state", "late")
    monkeypatch.setattr(settings, "_at_start", {})
    ws = settings.check_environment({}, started_platforms=("cuda",))
    assert codes(ws) == {"allocator-settings-unverified"}


def test_hook_recorded_the_cpu_backend_start():
    # conftest imports jax before helpers but starts no backend, so the hook is installed
    import jax

    jax.devices()
    state, snaps = settings.backend_start_snapshot()
    assert state == "installed"
    assert "cpu" in snaps and set(snaps["cpu"]) == set(settings.ALLOCATOR_VARS)


def test_read_environment_lists_every_variable():
    env = settings.read_environment({"XLA_FLAGS": "--foo"})
    names = [e.name for e in env]
    assert names == list(settings.VARIABLES)
    assert dict((e.name, e.value) for e in env)["XLA_FLAGS"] == "--foo"
