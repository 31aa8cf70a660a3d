import pytest

from helpers import allocation, gpu, plotting


def test_plugin_options_read_like_jaxlib():
    assert allocation.plugin_options({})["options"]["allocator"] == "default"
    assert allocation.plugin_options(
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})["options"]["preallocate"] is False
    assert allocation.plugin_options(
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "FALSE"})["options"]["preallocate"] is True
    assert allocation.plugin_options(
        {"XLA_CLIENT_MEM_FRACTION": "0.3"})["options"]["memory_fraction"] == 0.3


def test_plugin_options_errors_come_back_as_data():
    both = allocation.plugin_options({"XLA_CLIENT_MEM_FRACTION": "0.5",
                                      "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    assert both["error"].startswith("ValueError: XLA_CLIENT_MEM_FRACTION is specified together")
    bad = allocation.plugin_options({"XLA_PYTHON_CLIENT_ALLOCATOR": "turbo"})
    assert "turbo" in bad["error"]


def test_plugin_options_ignore_the_parents_settings(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # would conflict if inherited
    assert "error" not in allocation.plugin_options({"XLA_CLIENT_MEM_FRACTION": "0.2"})


def test_measurements_need_a_gpu():
    if gpu.why_unavailable() is None:
        pytest.skip("a GPU is present")
    with pytest.raises(allocation.NoGpuError, match="needs an NVIDIA GPU"):
        allocation.measure()
    with pytest.raises(allocation.NoGpuError):
        allocation.measure_together()


def test_allocator_settings_plot():
    rows = [{"setting": "default", "ok": True, "total_bytes": 80 * 2**30,
             "driver_used_bytes": 60 * 2**30, "bytes_limit": 60 * 2**30,
             "bytes_in_use": 2**28},
            {"setting": "PREALLOCATE=false", "ok": False, "total_bytes": 80 * 2**30,
             "driver_used_bytes": None, "bytes_limit": None, "bytes_in_use": None}]
    fig = plotting.allocator_settings(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["default",
                                                            "PREALLOCATE=false (failed)"]
    assert ax.get_xlabel() == "GiB"
    with pytest.raises(ValueError):
        plotting.allocator_settings([])


@pytest.mark.gpu
def test_default_preallocates_and_false_does_not():
    d = allocation.measure("default")
    off = allocation.measure("PREALLOCATE=false")
    assert d.ok and off.ok, (d.error, off.error)
    assert 0.70 <= d.bytes_limit / d.total_bytes <= 0.76
    assert d.driver_used_bytes >= 0.70 * d.total_bytes
    assert off.driver_used_bytes < 0.25 * off.total_bytes
