import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from helpers import datasets
from helpers.errors import PathError


def test_round_trip_with_safetensors_itself(tmp_path):
    path = tmp_path / "t.safetensors"
    tf = datasets.write_tokens(path, 100_003, seed=1)
    tokens = load_file(str(path))["tokens"]
    assert tokens.dtype == np.uint16 and tokens.shape == (100_003,)
    assert tf.n_tokens == 100_003 and tf.nbytes == 200_006
    assert tf.file_bytes == path.stat().st_size == tf.header_bytes + tf.nbytes
    assert tf.header_bytes % 8 == 0  # data starts aligned
    with safe_open(str(path), "numpy") as f:
        assert f.keys() == ["tokens"] and f.get_slice("tokens").get_dtype() == "U16"


def test_tokens_look_like_gpt2_ids(tmp_path):
    path = tmp_path / "t.safetensors"
    datasets.write_tokens(path, 2_000_000)
    t = load_file(str(path))["tokens"]
    counts = np.bincount(t, minlength=datasets.GPT2_VOCAB)
    assert t.max() < datasets.GPT2_VOCAB
    assert (counts > 0).sum() > 30_000  # a long tail over the vocabulary
    assert counts.max() / t.size > 0.02  # a few ids are very common
    assert 0.0005 < counts[datasets.GPT2_EOT] / t.size < 0.002  # documents of ~1000 tokens


def test_token_frequencies_follow_zipf_1_1(tmp_path):
    """The distribution by a statistic: the slope of log frequency against log rank (ranks
    10-1000, where 4M tokens give thousands of counts each) is the generator's exponent."""
    path = tmp_path / "t.safetensors"
    datasets.write_tokens(path, 4_000_000, seed=5)
    counts = np.sort(np.bincount(load_file(str(path))["tokens"],
                                 minlength=datasets.GPT2_VOCAB))[::-1]
    ranks = np.arange(10, 1000)
    slope = np.polyfit(np.log(ranks + 1), np.log(counts[ranks]), 1)[0]
    assert -1.2 < slope < -1.0, slope


def test_deterministic_for_a_seed(tmp_path):
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    datasets.write_tokens(a, 50_000, seed=7)
    datasets.write_tokens(b, 50_000, seed=8)
    datasets.write_tokens(c, 50_000, seed=7)
    assert a.read_bytes() == c.read_bytes()
    assert a.read_bytes() != b.read_bytes()


def test_multi_chunk_file(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "CHUNK_TOKENS", 1000)
    path = tmp_path / "t.safetensors"
    datasets.write_tokens(path, 2_500, vocab_size=300)
    t = load_file(str(path))["tokens"]
    assert t.shape == (2_500,) and t.max() < 300
    assert not np.array_equal(t[:1000], t[1000:2000])  # chunks differ


def test_size_form_and_progress(tmp_path, capsys):
    tf = datasets.write_tokens(tmp_path / "t.safetensors", size="1 MiB", progress=True)
    assert tf.n_tokens == 2**19
    assert "writing t.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    ({"n_tokens": 0}, "positive"), ({"n_tokens": -5}, "positive"), ({"n_tokens": 2.5}, "positive"),
    ({"size": "lots"}, "cannot read 'lots'"), ({"size": "0 B"}, "greater than zero"),
    ({}, "exactly one"), ({"n_tokens": 10, "size": "1 MiB"}, "exactly one"),
    ({"n_tokens": 10, "vocab_size": 70_000}, "vocab_size"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        datasets.write_tokens(tmp_path / "t.safetensors", **kwargs)
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_bad_paths(tmp_path):
    with pytest.raises(PathError, match="is a directory"):
        datasets.write_tokens(tmp_path, 10)
    with pytest.raises(PathError, match="does not exist"):
        datasets.write_tokens(tmp_path / "missing" / "t.safetensors", 10)


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(datasets, "_chunk", boom)
    with pytest.raises(KeyboardInterrupt):
        datasets.write_tokens(tmp_path / "t.safetensors", 10)
    assert list(tmp_path.iterdir()) == []


def test_open_tokens_is_a_zero_copy_view_equal_to_the_load(tmp_path):
    path = tmp_path / "t.safetensors"
    datasets.write_tokens(path, 123_457, seed=3)
    mm = datasets.open_tokens(path)
    assert isinstance(mm, np.memmap) and mm.dtype == np.uint16 and mm.shape == (123_457,)
    assert not mm.flags.writeable
    np.testing.assert_array_equal(mm, load_file(str(path))["tokens"])


def test_open_tokens_other_tensors_and_errors(tmp_path):
    from safetensors.numpy import save_file

    from helpers.errors import FileError

    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.ones(4, np.float32)},
              str(path))
    np.testing.assert_array_equal(datasets.open_tokens(path, "a"), np.arange(6).reshape(2, 3))
    with pytest.raises(FileError, match="no tensor named 'tokens'"):
        datasets.open_tokens(path)
    truncated = tmp_path / "cut.safetensors"
    datasets.write_tokens(tmp_path / "full.safetensors", 1000)
    truncated.write_bytes((tmp_path / "full.safetensors").read_bytes()[:-10])
    with pytest.raises(FileError, match="past its end"):
        datasets.open_tokens(truncated)


def test_write_tokens_starts_writeback_of_every_chunk_as_it_goes(tmp_path, monkeypatch):
    calls = []
    real = datasets._writeback_starter()
    if sys.platform.startswith("linux"):  # sync_file_range exists and accepts a real range
        with open(tmp_path / "probe", "wb") as f:
            f.write(b"x" * 8192)
            f.flush()
            assert real(f.fileno(), 0, 8192) == 0

    def starter():
        return lambda fd, offset, nbytes: calls.append((offset, nbytes))

    monkeypatch.setattr(datasets, "_writeback_starter", starter)
    n = datasets.CHUNK_TOKENS * 2 + 1000  # three chunks, the last one short
    info = datasets.write_tokens(tmp_path / "t.safetensors", n, progress=False)
    assert [c[1] for c in calls] == [2 * datasets.CHUNK_TOKENS] * 2 + [2000]
    assert calls[0][0] == info.header_bytes  # from the first data byte ...
    assert all(a[0] + a[1] == b[0]  # ... contiguous ...
               for a, b in zip(calls, calls[1:], strict=False))
    assert calls[-1][0] + calls[-1][1] == info.file_bytes  # ... to the end of the file
