"""helpers.gpu: driver queries without JAX, CUDA_VISIBLE_DEVICES mapping, reasons and fixes."""

import pytest

from helpers import gpu

GPUS = (gpu.GpuInfo(0, "NVIDIA H100", "GPU-aaaa1111", 80 * 2**30, "580.1"),
        gpu.GpuInfo(1, "NVIDIA H100", "GPU-bbbb2222", 80 * 2**30, "580.1"))


@pytest.mark.parametrize("visible, jax_index, expected", [
    (None, 0, 0), (None, 1, 1), ("1", 0, 1), ("1,0", 1, 0), ("0", 1, None),
    ("-1", 0, None), ("GPU-bbbb", 0, 1), ("GPU-zzzz", 0, None)])
def test_physical_index_follows_cuda_visible_devices(visible, jax_index, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert gpu.physical_index(jax_index, environ=environ, found=GPUS) == expected


def test_nvidia_smi_rows_are_parsed(monkeypatch):
    monkeypatch.setattr(gpu, "_nvml", lambda: None)
    rows = {"--query-gpu=index,name,uuid,memory.total,driver_version":
            [["0", "NVIDIA GeForce RTX 3090", "GPU-cccc", "24576", "550.54"]],
            "--query-compute-apps=pid,used_memory": [["123", "18432"], ["456", "300"]]}
    monkeypatch.setattr(gpu, "_smi", lambda q: rows[q])
    (g,) = gpu.gpus()
    assert (g.name, g.total_bytes, g.driver) == ("NVIDIA GeForce RTX 3090", 24 * 2**30, "550.54")
    assert gpu.total_bytes(0) == 24 * 2**30
    assert gpu.process_used_bytes(123) == 18 * 2**30
    assert gpu.process_used_bytes(999) is None  # not listed: unknown, not zero


@pytest.mark.parametrize("environ, fragment", [
    ({"JAX_PLATFORMS": "cpu"}, "JAX_PLATFORMS='cpu' leaves the GPU out"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, "hides every GPU"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "hides every GPU"),
])
def test_why_unavailable_names_the_setting(environ, fragment):
    assert fragment in gpu.why_unavailable(environ=environ)


def test_why_unavailable_without_driver_or_plugin(monkeypatch):
    monkeypatch.setattr(gpu, "gpus", lambda: ())
    assert "no NVIDIA GPU is visible" in gpu.why_unavailable(environ={})
    monkeypatch.setattr(gpu, "gpus", lambda: GPUS)
    monkeypatch.setattr(gpu, "cuda_plugins", lambda: {})
    assert 'pip install -U "jax[cuda13]"' in gpu.why_unavailable(environ={})
    monkeypatch.setattr(gpu, "cuda_plugins", lambda: {"jax-cuda13-plugin": "0.11.2"})
    assert gpu.why_unavailable(environ={"JAX_PLATFORMS": "cuda,cpu"}) is None


def test_require_raises_with_reason(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    with pytest.raises(gpu.NoGpuError, match="the thing needs an NVIDIA GPU.*hides every GPU"):
        gpu.require("the thing")
