import itertools
import os
import time

import jax
import numpy as np
import pytest

from helpers import datasets, feeding, plotting
from tests.conftest import benchmark_module, wait_until


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("feed") / "train.safetensors"
    datasets.write_tokens(path, 300_000, progress=False)
    return datasets.open_tokens(path)


def test_gather_matches_slicing_and_naive(tokens):
    starts = np.array([0, 5, len(tokens) - 64, 12_345] * 100, dtype=np.int64)  # > one piece
    out = feeding.gather(tokens, starts, 64)
    assert out.shape == (400, 64) and out.dtype == np.uint16
    assert out.ctypes.data % 4096 == 0  # aligned, so the CPU client may alias it
    assert np.array_equal(out, feeding.naive_batch(tokens, starts, 64))
    assert np.array_equal(feeding.gather(tokens, starts, 64, parallel=False), out)
    assert np.array_equal(out[2], tokens[-64:])


def test_compiled_gather_aliases_the_memmap_and_matches(tokens):
    dev = jax.devices()[1]
    kernel = feeding.CompiledGather.build(tokens, dev)
    assert kernel is not None and kernel.alias.unsafe_buffer_pointer() % 64 == 0
    # zero-copy: the alias is the memmap's own bytes, a few tokens before tokens[0]
    assert kernel.alias.unsafe_buffer_pointer() + 2 * kernel.offset == tokens.ctypes.data
    starts = np.array([0, 5, len(tokens) - 64, 12_345], dtype=np.int64)
    out = kernel(starts, 64)
    assert out.devices() == {dev} and out.dtype == np.uint16
    assert np.array_equal(np.asarray(out), feeding.gather(tokens, starts, 64))
    raw = bytearray(4096)
    k = (2 - np.frombuffer(raw, np.uint8).ctypes.data) % 64  # a buffer starting 2 B past 64
    unaligned = np.frombuffer(memoryview(raw)[k:k + 2000], np.uint16)
    assert unaligned.ctypes.data % 64 == 2
    assert feeding.CompiledGather.build(unaligned, dev) is None  # no aligned start in it
    inside = np.frombuffer(raw, np.uint8)[k:k + 2000].view(np.uint16)  # same bytes, whole owner
    assert feeding.CompiledGather.build(inside, dev) is not None  # the owner has one before
    assert feeding.CompiledGather.build(np.zeros((4, 4), np.uint16), dev) is None  # not 1-D


@pytest.mark.parametrize("prefetch", [0, 2])
def test_both_kernels_give_the_same_batches(tokens, monkeypatch, prefetch):
    dev = jax.devices()[0]
    with feeding.Batches(tokens, 8, 64, device=dev, seed=3, steps=3, prefetch=prefetch) as it:
        compiled = [np.asarray(b) for b in it]
    assert it.kernel == "compiled" and it._compiled is None  # the alias is let go at the end
    monkeypatch.setattr(feeding, "COMPILED_MAX_BYTES", 8 * 64 * 2 - 1)  # one byte too small
    with feeding.Batches(tokens, 8, 64, device=dev, seed=3, steps=3, prefetch=prefetch) as it:
        numpy_made = [np.asarray(b) for b in it]
    assert it.kernel == "numpy"
    assert all(np.array_equal(a, b) for a, b in zip(compiled, numpy_made, strict=True))
    with feeding.Batches(np.array(tokens), 8, 64, device=dev, seed=3, steps=3) as it:
        assert [np.array_equal(np.asarray(b), a) for b, a in zip(it, compiled, strict=True)] \
            == [True] * 3  # an in-memory copy: same windows, whichever kernel it gets


def test_prefetch_makes_at_most_prefetch_batches_ahead(tokens):
    with feeding.Batches(tokens, 2, 8, prefetch=2, steps=50) as it:
        next(it)
        time.sleep(0.3)
        assert it._made == 1 + 2  # the one taken, and two ready
        assert len(list(it)) == 49


def test_window_starts_stay_inside_and_are_int64():
    it = feeding.window_starts(1000, 4096, 100, seed=3)
    s = np.concatenate([next(it) for _ in range(10)])
    assert s.dtype == np.int64 and s.min() >= 0 and s.max() <= 900
    assert s.max() == 900 and s.min() == 0  # both ends reachable in 40k draws of 901 values
    a = next(feeding.window_starts(10**6, 8, 16, seed=1))
    b = next(feeding.window_starts(10**6, 8, 16, seed=1))
    assert np.array_equal(a, b)


def test_window_starts_bad_input():
    with pytest.raises(ValueError, match="longer than the token array"):
        feeding.window_starts(10, 1, 11)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        feeding.window_starts(10, 1, 0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        feeding.window_starts(10, -2, 4)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_shapes_devices_and_determinism(tokens, prefetch):
    dev = jax.devices()[1]
    with datasets.batches(tokens, 4, 32, device=dev, prefetch=prefetch, seed=7, steps=5) as it:
        got = list(it)
        starts = list(it.starts_used)
    assert len(got) == 5 and all(b.shape == (4, 32) and b.dtype == np.uint16 for b in got)
    assert all(b.devices() == {dev} and b.committed for b in got)
    for b, s in zip(got, starts, strict=True):
        assert np.array_equal(np.asarray(b), feeding.naive_batch(tokens, s, 32))
    with datasets.batches(tokens, 4, 32, device=dev, prefetch=2 - prefetch, seed=7, steps=5) as it:
        again = list(it)
    assert all(np.array_equal(a, b) for a, b in zip(got, again, strict=True))  # seed decides
    with datasets.batches(tokens, 4, 32, device=dev, seed=8, steps=1) as it:
        assert not np.array_equal(next(it), got[0])


def test_batches_convert_on_device_and_pinned(tokens):
    dev = jax.devices()[0]
    with datasets.batches(tokens, 2, 16, device=dev, steps=2, dtype="int32", pinned=True) as it:
        b = next(it)
    assert b.dtype == np.int32 and b.devices() == {dev}
    assert np.array_equal(np.asarray(b), feeding.naive_batch(tokens, it.starts_used[0], 16))


def test_batches_records_overlapping_timeline(tokens):
    with datasets.batches(tokens, 64, 256, prefetch=2, steps=6) as it:
        list(it)
    kinds = [k for k, _, _ in it.timeline]
    assert kinds.count("gather") == 6 and kinds.count("transfer") == 6
    assert all(t0 <= t1 for _, t0, t1 in it.timeline)


def test_batches_endless_and_close_stops_thread(tokens):
    it = datasets.batches(tokens, 2, 8, prefetch=2)
    assert len(list(itertools.islice(it, 10))) == 10
    it.close()
    assert not it._thread.is_alive()


def test_endless_batches_keep_only_the_newest_history(tokens):
    keep = feeding.Batches.HISTORY
    total = keep + 37
    before = []  # perf_counter before each batch: with prefetch=0 it is made inside next()
    with feeding.Batches(tokens, 2, 8, prefetch=0, seed=5) as it:
        for _ in range(total):
            before.append(time.perf_counter())
            next(it)
    assert len(it.starts_used) == keep and len(it.timeline) == 2 * keep
    drawn = feeding.window_starts(len(tokens), 2, 8, seed=5)
    newest = [next(drawn) for _ in range(total)][-keep:]
    assert all(np.array_equal(a, b) for a, b in zip(it.starts_used, newest, strict=True))
    timeline = list(it.timeline)
    assert [k for k, _, _ in timeline] == ["gather", "transfer"] * keep
    oldest_kept = total - keep  # the first `total - keep` batches were dropped
    assert before[oldest_kept] <= timeline[0][1] < before[oldest_kept + 1]
    assert timeline[-1][1] >= before[-1]


def test_batches_with_steps_keep_every_batch(tokens, monkeypatch):
    monkeypatch.setattr(feeding.Batches, "HISTORY", 3)
    with feeding.Batches(tokens, 2, 8, prefetch=2, steps=7) as it:
        list(it)
    assert isinstance(it.timeline, list) and isinstance(it.starts_used, list)
    assert len(it.starts_used) == 7 and len(it.timeline) == 14
    assert it.timeline[:2][0][0] == "gather"  # lists: slicing still works


def test_batches_from_path_and_bad_input(tmp_path, tokens):
    path = tmp_path / "t.safetensors"
    datasets.write_tokens(path, 1000, progress=False)
    with datasets.batches(path, 2, 8, steps=1) as it:
        assert next(it).shape == (2, 8)
    with pytest.raises(ValueError, match="prefetch"):
        datasets.batches(tokens, 2, 8, prefetch=-1)
    with pytest.raises(ValueError, match="1-D"):
        datasets.batches(np.zeros((3, 3), np.uint16), 2, 2)
    with pytest.raises(ValueError, match="longer than the token array"):
        datasets.batches(path, 2, 2000)


def test_errors_in_the_producer_reach_the_consumer(tokens):
    it = datasets.batches(tokens, 2, 8, prefetch=2, steps=3, dtype="not-a-dtype")
    with pytest.raises(TypeError):
        list(it)
    it.close()


def test_int64_starts_beyond_2_31_on_a_large_sparse_file(tmp_path):
    """A 4.3 GB sparse token file: window starts past 2**31 are reached, and read right."""
    n = 2**31 + 2**20
    path = tmp_path / "sparse.safetensors"
    header = datasets._header(n)
    with open(path, "wb") as f:
        f.write(header)
        f.seek(len(header) + 2 * n - 2)
        f.write(np.array([777], np.uint16).tobytes())  # the very last token
    tokens = datasets.open_tokens(path)
    assert len(tokens) == n
    starts = np.array([n - 8, 2**31 + 5, 3], np.int64)
    out = feeding.gather(tokens, starts, 8)
    assert out[0, -1] == 777 and not out[1:].any()
    with datasets.batches(tokens, 256, 8, steps=4, seed=0) as it:
        list(it)
    used = np.concatenate(it.starts_used)
    assert used.dtype == np.int64 and used.max() > 2**31 and used.max() <= n - 8


def test_feeding_plot():
    rows = [{"batch_bytes": 2**s, "gbps": {"naive": 0.5, "kit": 2.0, "bound": 4.0}}
            for s in (16, 20, 26)]
    fig = plotting.feeding_rates(rows)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["naive", "kit",
                                                                            "bound"]
    with pytest.raises(ValueError):
        plotting.feeding_rates([])
    assert os.path.exists(plotting.STYLE)


def test_pipeline_timeline_plot():
    fig = plotting.pipeline_timeline({"a": [("gather", 0.0, 0.01), ("step", 0.01, 0.02)],
                                      "b": [("transfer", 1.0, 1.5)]})
    assert len(fig.axes) == 2
    assert len(fig.axes[0].collections) == 3  # one bar collection per stage
    with pytest.raises(ValueError):
        plotting.pipeline_timeline({})


def test_benchmark_time_variant_runs_every_variant(tokens):
    bench = benchmark_module("_feeding_variants")
    assert bench.VARIANTS == ("naive", "kit", "kit_no_prefetch", "kit_numpy", "bound",
                              "bound_reused")
    for v in bench.VARIANTS:
        secs = bench.time_variant(v, tokens, 4, 64, device=jax.devices()[0], n=2, seed=1)
        assert secs > 0, v
    with pytest.raises(ValueError, match="unknown variant"):
        bench.time_variant("telepathy", tokens, 4, 64, device=jax.devices()[0], n=1)


def test_snapshot_does_not_count_the_token_files_alias_as_device_bytes(tmp_path):
    from helpers import memory

    path = tmp_path / "big.safetensors"
    datasets.write_tokens(path, 4 * 2**20, progress=False)  # 8 MiB, far more than a batch
    dev = jax.devices()[0]

    def used():
        return memory.snapshot([dev]).device(dev).bytes_in_use

    before = used()
    with datasets.batches(str(path), 4, 64, device=dev, steps=2, prefetch=0) as it:
        assert it.kernel == "compiled"  # the alias exists and jax.live_arrays() lists it
        assert any(a.nbytes >= 8 * 2**20 for a in jax.live_arrays("cpu"))
        batch = next(it)
        during = used()
    assert during - before < 2**20, (before, during)  # the batch (512 B) and nothing like 8 MiB
    del batch


# --- lifecycles: the prefetch thread stops with its iterator ---------------------------------
def batch_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "helpers-batches"]


def test_an_unclosed_iterator_that_is_dropped_stops_its_thread(tokens):
    import gc
    import weakref

    before = len(batch_threads())
    it = datasets.batches(tokens, 4, 16, prefetch=2)  # endless, never closed
    next(it)
    assert len(batch_threads()) == before + 1
    gone = weakref.ref(it)
    del it
    # the producer holds the iterator only while it makes a batch: gone once that one is made
    assert wait_until(lambda: gc.collect() is not None and gone() is None), \
        "the prefetch thread keeps the iterator alive"
    assert wait_until(lambda: len(batch_threads()) == before), batch_threads()


def test_rebinding_the_name_as_a_rerun_cell_does_leaves_one_thread(tokens):
    before = len(batch_threads())
    for _ in range(5):  # `it = datasets.batches(...)` in a cell run five times
        it = datasets.batches(tokens, 4, 16, prefetch=2)
        next(it)
    assert wait_until(lambda: len(batch_threads()) == before + 1), batch_threads()
    it.close()
    assert len(batch_threads()) == before


def test_a_waiting_producer_does_not_poll(tokens):
    """Once its slots are full the producer sleeps on a semaphore: it makes no batch and takes
    no CPU until the consumer takes one (the old loop woke 20 times a second)."""
    import threading

    with datasets.batches(tokens, 4, 16, prefetch=2) as it:
        next(it)
        assert wait_until(lambda: it._queue.qsize() >= 2)
        (thread,) = [t for t in batch_threads() if t is it._thread]
        made = it._made
        before = time.thread_time()  # this thread's, as a control the test can read
        wakeups = []
        orig = it._slots.acquire

        def spy(*a, **k):
            wakeups.append(threading.current_thread().name)
            return orig(*a, **k)

        it._slots.acquire = spy  # a producer polling with a timeout would call it again
        time.sleep(0.5)
        assert it._made == made and wakeups == [] and thread.is_alive()
        assert time.thread_time() - before < 0.5
