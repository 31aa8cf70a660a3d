import pytest

from helpers import datasets, loading, plotting, render


@pytest.fixture(scope="module")
def token_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("load") / "train.safetensors"
    datasets.write_tokens(path, size="32 MiB", progress=False)
    return path


@pytest.fixture(scope="module")
def runs(token_path):
    return {m.strategy: m for m in loading.measure_all(token_path)}


def test_every_strategy_reads_the_same_tokens(runs):
    assert set(runs) == set(loading.STRATEGIES)
    assert len({m.checksum for m in runs.values()}) == 1


def test_nothing_lands_on_the_accelerator(runs):
    assert all(m.accelerator_bytes == 0 for m in runs.values())
    assert runs["flax_ctx"].landed_on == "cpu:1"  # stand-in host device
    assert runs["memmap"].landed_on == "host (NumPy)"


def test_memory_kinds_differ_as_documented(runs):
    size = runs["memmap"].file_bytes
    # full loads allocate at least the file in anonymous memory; the memmap allocates ~none
    for name in ("flax_ctx", "numpy_load", "safe_open"):
        assert runs[name].peak_anon_bytes >= 0.9 * size, name
    assert runs["memmap"].peak_anon_bytes < 0.2 * size
    assert runs["memmap"].peak_file_bytes >= 0.9 * size  # its pages are file-backed


def test_plot(runs):
    fig = plotting.load_strategy_costs(list(runs.values()))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(runs)
    with pytest.raises(ValueError):
        plotting.load_strategy_costs([])


def test_bad_inputs(tmp_path, token_path):
    from helpers.errors import FileError

    with pytest.raises(ValueError, match="unknown strategy"):
        loading.measure(token_path, "telepathy")
    with pytest.raises(FileError, match="no such file"):
        loading.measure(tmp_path / "nope", "memmap")


def _fake(strategy, seconds, anon, file_bytes=100, **kw):
    return {"strategy": strategy, "description": strategy, "seconds": seconds,
            "peak_anon_bytes": anon, "peak_file_bytes": kw.get("file", 0),
            "accelerator_bytes": 0, "file_bytes": file_bytes, "checksum": 1,
            "landed_on": "host (NumPy)", "stand_in": True}


def test_medians_and_ratios_are_per_strategy_medians():
    runs = [_fake("flax_ctx", 10, 400), _fake("memmap", 1, 1),
            _fake("flax_ctx", 30, 200), _fake("memmap", 2, 3),
            _fake("flax_ctx", 20, 300), _fake("memmap", 4, 2)]
    rows = loading.medians(runs)
    assert [r["strategy"] for r in rows] == ["flax_ctx", "memmap"]
    assert rows[0]["seconds"] == 20 and rows[0]["peak_anon_bytes"] == 300 and rows[0]["runs"] == 3
    assert rows[1]["seconds"] == 2 and rows[1]["peak_anon_bytes"] == 2
    r = loading.ratios(runs)
    assert r["time_flax_ctx_over_memmap"] == 10  # pairs: 10/1, 15, 5 -> median 10
    assert r["peak_anon_flax_ctx_over_file"] == 3.0
    text = render.load_table(rows)
    assert text.splitlines()[1].split()[:2] == ["flax_ctx", "20.00"]
    with pytest.raises(ValueError, match="same number"):
        loading.ratios(runs[:3])
    with pytest.raises(ValueError, match="no measurements"):
        loading.medians([])


def test_machine_is_named():
    from helpers import machine

    info = machine.describe()
    assert info["cores"] >= 1 and info["memory_bytes"] > 0
    assert machine.name(info).startswith("CPU only: ") == (info["backend"] == "cpu")
    gpu = dict(info, backend="gpu", device_kind="NVIDIA H100 80GB HBM3")
    assert machine.name(gpu).startswith("NVIDIA H100 80GB HBM3 (gpu) on ")
