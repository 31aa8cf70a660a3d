"""The pprof reader for jax.profiler.save_device_memory_profile files."""

import gzip

import jax
import jax.numpy as jnp
import pytest

from helpers.errors import FileError
from helpers.memory_profile import read_memory_profile, top_entries


def make_the_big_one():
    return jnp.ones((1024, 1024, 3))  # 12 MiB


def test_reads_what_jax_writes_largest_first(tmp_path):
    big = make_the_big_one()
    small = jnp.arange(1000.0)
    path = tmp_path / "memory.prof"
    jax.profiler.save_device_memory_profile(str(path))
    entries = read_memory_profile(path)
    assert [e.bytes for e in entries] == sorted((e.bytes for e in entries), reverse=True)
    (first,) = top_entries(path, 1)
    assert first.bytes == big.nbytes and first.count == 1
    assert first.kind == "buffer" and first.device == "cpu:0"
    assert first.where().startswith("make_the_big_one (test_memory_profile.py:")
    assert any(e.bytes == small.nbytes and e.kind == "buffer" for e in entries)
    assert all(e.kind == "executable" for e in top_entries(path, 10, kind="executable"))


def test_a_missing_or_corrupt_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileError, match="cannot read it"):
        read_memory_profile(tmp_path / "nope.prof")
    bad = tmp_path / "bad.prof"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(FileError, match="not a gzipped pprof memory profile"):
        read_memory_profile(bad)
    worse = tmp_path / "worse.prof"
    worse.write_bytes(gzip.compress(b"\xff\xff\xff"))
    with pytest.raises(FileError, match="save_device_memory_profile"):
        read_memory_profile(worse)
