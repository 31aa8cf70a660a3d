import pytest

from helpers import datasets, loading, plotting


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
    fig = plotting.load_strategies(list(runs.values()))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(runs)
    with pytest.raises(ValueError):
        plotting.load_strategies([])


def test_bad_inputs(tmp_path, token_path):
    from helpers.oom import FileError

    with pytest.raises(ValueError, match="unknown strategy"):
        loading.measure(token_path, "telepathy")
    with pytest.raises(FileError, match="no such file"):
        loading.measure(tmp_path / "nope", "memmap")
