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


# --- which GPU is cuda:N: MIG instances, UUIDs, CUDA_DEVICE_ORDER (a fake NVML) ---------------
class _Mem:
    def __init__(self, total):
        self.total, self.used = total, 0


class FakeNvml:
    """Two GPUs on the PCI bus: an A100 with MIG on (two instances), then an older T4."""

    A100 = {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-a100aaaa", "total": 80 * 2**30,
            "mig": [("MIG-1111aaaa", 40 * 2**30, 1, 0), ("MIG-2222bbbb", 20 * 2**30, 2, 0)]}
    T4 = {"name": "Tesla T4", "uuid": "GPU-t4t4bbbb", "total": 16 * 2**30, "mig": None}

    def __init__(self):
        self.cards = [self.A100, self.T4]

    def nvmlSystemGetDriverVersion(self):
        return b"580.1"

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def _card(self, h):
        return self.cards[h[1]]

    def nvmlDeviceGetName(self, h):
        return self._card(h)["name"] if h[0] == "gpu" else "MIG"

    def nvmlDeviceGetUUID(self, h):
        return self._card(h)["uuid"] if h[0] == "gpu" else self._card(h)["mig"][h[2]][0]

    def nvmlDeviceGetMemoryInfo(self, h):
        card = self._card(h)
        return _Mem(card["total"] if h[0] == "gpu" else card["mig"][h[2]][1])

    def nvmlDeviceGetMigMode(self, h):
        if self._card(h)["mig"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= len(self._card(h)["mig"]):
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, m):
        return self._card(m)["mig"][m[2]][2]

    def nvmlDeviceGetComputeInstanceId(self, m):
        return self._card(m)["mig"][m[2]][3]


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.setattr(gpu, "_nvml", lambda: FakeNvml())


def test_mig_instances_are_found_through_nvml(nvml):
    a100, t4 = gpu.gpus()
    assert [m.uuid for m in a100.migs] == ["MIG-1111aaaa", "MIG-2222bbbb"] and t4.migs == ()


@pytest.mark.parametrize("spec, expected", [
    ("MIG-2222bbbb", [(0, "MIG-2222bbbb", 20 * 2**30, True)]),  # a MIG instance: its own size
    ("MIG-GPU-a100aaaa/1/0", [(0, "MIG-1111aaaa", 40 * 2**30, True)]),  # the older form
    ("GPU-t4t4,MIG-1111", [(1, "GPU-t4t4bbbb", 16 * 2**30, False),
                           (0, "MIG-1111aaaa", 40 * 2**30, True)]),  # UUID prefixes, in order
    ("1,nonsense,0", [(1, "GPU-t4t4bbbb", 16 * 2**30, False)]),  # CUDA stops at a bad entry
    ("", []),
])
def test_visible_gpus_follow_cuda_visible_devices(nvml, spec, expected):
    shown = gpu.visible(environ={"CUDA_VISIBLE_DEVICES": spec, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [(v.physical_index, v.uuid, v.total_bytes, v.mig) for v in shown] == expected
    assert [v.jax_index for v in shown] == list(range(len(expected)))


def test_mixed_models_without_pci_order_are_flagged_not_guessed(nvml):
    default = gpu.visible(environ={})
    assert all("CUDA_DEVICE_ORDER" in v.note for v in default)  # CUDA may put the fastest first
    assert all(v.note == "" for v in gpu.visible(environ={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    by_uuid = gpu.visible(environ={"CUDA_VISIBLE_DEVICES": "GPU-t4t4bbbb"})
    assert by_uuid[0].note == ""  # a UUID names one GPU whatever the order


def test_total_bytes_of_a_mig_instance_is_its_own(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1111aaaa")
    assert gpu.total_bytes(0) == 40 * 2**30 and gpu.total_bytes(1) is None


def test_a_measuring_child_preallocates_a_share_of_what_is_free(monkeypatch):
    monkeypatch.setattr(gpu, "total_bytes", lambda i=0: 80 * 2**30)
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: 60 * 2**30)  # a kernel's 75%
    pool = gpu.measuring_pool()
    assert pool["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"  # grown on demand over-counts
    assert pool["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1250"  # half of the 20 GiB free
    assert pool["XLA_CLIENT_MEM_FRACTION"] is None  # the parent's own cap is not inherited
    assert gpu.measuring_pool(share=0.125)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.0312"
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: 0)  # a free card: at most 75%
    assert gpu.measuring_pool(share=1.0)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.7500"
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: None)  # unknown: assume 75% held
    assert gpu.measuring_pool()["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1250"
    monkeypatch.setattr(gpu, "device_used_bytes", lambda i=0: 80 * 2**30 - 2**20)  # card full
    assert gpu.measuring_pool()["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.0050"  # the floor
    monkeypatch.setattr(gpu, "total_bytes", lambda i=0: None)
    assert gpu.measuring_pool() == {}  # no GPU: the child's CPU stand-in needs nothing
