import json
import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import memory
from helpers.errors import BadInputError
from helpers.units import format_bytes
from tests.conftest import N_SIMULATED, run_python


def tracker_threads():
    return [t for t in threading.enumerate() if t.name.startswith("helpers.memory.track")]


def test_snapshot_lists_every_device_and_host():
    snap = memory.snapshot()
    assert [d.device for d in snap.devices] == [f"cpu:{i}" for i in range(N_SIMULATED)]
    assert all(d.source == memory.LIVE_ARRAYS and d.limit_bytes is memory.NOT_AVAILABLE
               and d.peak_bytes is memory.NOT_AVAILABLE for d in snap.devices)
    h = snap.host
    assert h.rss > 0 and h.total >= h.available > 0 and h.vms >= h.rss
    if sys.platform == "linux":
        assert h.anon > 0 and h.file > 0 and h.anon + h.file == h.rss


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/status is Linux's")
def test_host_split_matches_the_kernels_own_rssanon():
    """psutil's rss - shared is RssAnon, and shared is RssFile + RssShmem (read right after)."""
    h = memory.snapshot().host
    with open("/proc/self/status") as f:
        kb = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)
              if k in ("RssAnon", "RssFile", "RssShmem")}
    tolerance = 8 * 2**20  # the two reads are a few allocations apart
    assert abs(h.anon - kb["RssAnon"]) < tolerance
    assert abs(h.file - (kb["RssFile"] + kb["RssShmem"])) < tolerance
    assert json.loads(json.dumps(memory.snapshot().to_dict()))["devices"][0]["limit_bytes"] is None


def test_snapshot_counts_live_array_bytes_per_device():
    before = memory.snapshot().device("cpu:2").bytes_in_use
    x = jax.device_put(np.ones((1000, 250), np.float32), jax.devices()[2])  # 1,000,000 B
    after = memory.snapshot().device("cpu:2").bytes_in_use
    assert after - before == x.nbytes == 1_000_000
    del x
    assert memory.snapshot().device("cpu:2").bytes_in_use == before


def test_snapshot_counts_each_shard_on_its_device():
    mesh = jax.make_mesh((N_SIMULATED,), ("x",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    before = memory.snapshot()
    x = jax.device_put(np.zeros(N_SIMULATED * 1000, np.int32), spec)
    after = memory.snapshot()
    for d in before.devices:
        assert after.device(d.device).bytes_in_use - d.bytes_in_use == 4000
    del x


def test_snapshot_of_chosen_devices_and_bad_input():
    snap = memory.snapshot(jax.devices()[1])
    assert [d.device for d in snap.devices] == ["cpu:1"]
    with pytest.raises(TypeError, match="jax.Device"):
        memory.snapshot([0])
    with pytest.raises(KeyError, match="cpu:1"):
        snap.device("cuda:0")


def test_host_anonymous_memory_grows_with_a_numpy_array():
    import mmap

    if not hasattr(mmap, "MAP_ANONYMOUS"):
        pytest.skip("no anonymous private mapping on this OS")
    before = memory.snapshot().host
    # 64 MiB of fresh anonymous pages, touched (np.ones may reuse pages malloc kept from an
    # earlier test: seen once in a run of several test files, the reading unchanged)
    pages = mmap.mmap(-1, 64 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block = np.frombuffer(pages, np.uint8)
    block[:] = 1
    after = memory.snapshot().host
    if after.anon is memory.NOT_AVAILABLE:
        pytest.skip("no anonymous/file split on this OS")
    assert after.anon - before.anon > 48 * 2**20
    del block
    pages.close()


def test_track_samples_marks_and_series():
    with memory.track(interval=0.01) as trace:
        trace.mark("start")
        x = jax.device_put(np.ones(250_000, np.float32), jax.devices()[3])  # 1 MB
        x.block_until_ready()
        time.sleep(0.1)
        trace.mark("made")
        del x
        time.sleep(0.05)
    assert trace.finished
    assert len(trace.samples) >= 5  # start + end + at least a few at 100 Hz over 0.15 s
    assert list(trace.times) == sorted(trace.times)
    assert [m[1] for m in trace.marks] == ["start", "made"]
    assert trace.peak("cpu:3") - trace.device_bytes["cpu:3"][0] == 1_000_000
    assert trace.growth("cpu:3") == 0
    d = trace.to_dict()
    assert set(d) >= {"times", "devices", "limits", "sources", "host_anon", "host_file", "marks"}
    assert d["sources"]["cpu:0"] == memory.LIVE_ARRAYS
    with pytest.raises(KeyError, match="not tracked"):
        trace.peak("cuda:0")


def test_a_trace_prints_each_device_s_start_peak_and_end_and_the_host_s_high_water_mark():
    with memory.track(interval=60) as trace:
        x = jax.device_put(np.ones(250_000, np.float32), jax.devices()[3]).block_until_ready()
        trace.mark("made")
        del x
        assert "host RSS: read when the block ends" in str(trace)  # not the first sample, stale
    text = str(trace)
    row = next(r for r in text.splitlines() if r.startswith("cpu:3 "))
    start, peak, end = (format_bytes(v) for v in (trace.device_bytes["cpu:3"][0],
                                                  trace.peak("cpu:3"),
                                                  trace.device_bytes["cpu:3"][-1]))
    assert row.split()[:7] == ["cpu:3", *start.split(), *peak.split(), *end.split()]
    assert trace.peak("cpu:3") - trace.device_bytes["cpu:3"][0] == 1_000_000
    assert f"high-water mark over the block: {format_bytes(trace.host_peak)}" in text
    assert "s made" in text and "live arrays only" in text and "jax-ml/jax#8096" in text
    assert repr(trace).startswith("MemoryTrace(")  # the repr stays the short one


def test_mark_takes_a_sample_whatever_the_sampler_does():
    # a 60 s interval: the background thread never samples inside this block, so the only
    # device samples are the start, the mark and the end (host samples from the helper
    # process are merged in between); the mark's must show the array alive
    with memory.track(interval=60) as trace:
        x = jax.device_put(np.ones(250_000, np.float32), jax.devices()[3]).block_until_ready()
        trace.mark("made")
        del x
    assert list(trace.times) == sorted(trace.times)
    series = trace.device_bytes["cpu:3"]
    assert trace.peak("cpu:3") - series[0] == 1_000_000 and series[-1] == series[0]
    kept = len(trace.samples)
    trace.mark("after the block")  # no sample once finished
    assert len(trace.samples) == kept and len(trace.marks) == 2


def test_marks_do_not_inflate_the_sampling_rate():
    with memory.track(interval=0.5) as trace:
        for i in range(50):
            trace.mark(str(i))
    assert len(trace.marks) == 50
    # the thread took no sample in so short a block: the rate counts the start and the end
    # only (the 50 mark samples would make it about 51 per block)
    assert trace.achieved_hz_by_source["devices"] * trace.wall_s < 2


def test_a_mark_from_another_thread_after_the_end_adds_no_sample():
    with memory.track(interval=60) as trace:
        pass
    kept = len(trace.samples)
    worker = threading.Thread(target=trace.mark, args=("late",))
    worker.start()
    worker.join()
    assert len(trace.samples) == kept and [m[1] for m in trace.marks] == ["late"]


def test_track_thread_stops_and_exception_propagates():
    with pytest.raises(ZeroDivisionError):
        with memory.track(interval=0.01) as trace:
            assert tracker_threads()
            raise ZeroDivisionError("inside the block")
    assert tracker_threads() == []
    assert trace.finished and len(trace.samples) >= 2


def test_track_thread_gone_after_normal_exit():
    with memory.track(interval=0.01):
        jnp.ones(10).block_until_ready()
    assert tracker_threads() == []


@pytest.mark.parametrize("bad", [0, -1, 1000, "fast", True])
def test_track_rejects_bad_interval(bad):
    with pytest.raises(ValueError, match="interval"):
        with memory.track(interval=bad):
            pass
    assert tracker_threads() == []


def test_one_device_in_a_child():
    proc = run_python(
        "import jax, numpy as np\nfrom helpers import memory\n"
        "with memory.track(0.01) as t:\n    x = jax.numpy.ones(1000)\n    x.block_until_ready()\n"
        "print(t.device_names, t.peak('cpu:0'))",
        env={"JAX_NUM_CPU_DEVICES": "1", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "('cpu:0',) 4000"


@pytest.mark.gpu
def test_gpu_snapshot_uses_allocator_stats():
    # in a child: an array made in the pytest process takes its pool (75% of the card) for the
    # rest of the session, and the gpu tests that start JAX processes beside it then find the
    # card full (the H100, 2026-11-27: a third process got no CUDA context)
    code = ("import jax, jax.numpy as jnp\nfrom helpers import memory\n"
            "d = memory.snapshot(jax.devices()[0]).devices[0]\n"
            "assert d.source == memory.ALLOCATOR and d.limit_bytes and d.peak_bytes is not None\n"
            "x = jnp.ones((1024, 1024), jnp.float32).block_until_ready()\n"
            "now = memory.snapshot(jax.devices()[0]).devices[0].bytes_in_use\n"
            "assert now >= d.bytes_in_use + x.nbytes, (now, d.bytes_in_use)\nprint('ok')")
    proc = run_python(code)
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.gpu
def test_gpu_a_pool_grown_on_demand_counts_a_whole_chunk_and_says_so():
    # the H100 probe (2026-11-26): a 36 MiB array showed 64 MiB in use in a pool grown on demand
    code = ("import jax, jax.numpy as jnp\nfrom helpers import memory\n"
            "x = jnp.ones(36 * 2**18).block_until_ready()\n"
            "d = memory.snapshot(jax.devices()[0]).devices[0]\nprint(d.bytes_in_use)\n"
            "print(d.note)")
    proc = run_python(code, env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                 "XLA_CLIENT_MEM_FRACTION": None})
    assert proc.returncode == 0, proc.stderr
    in_use, note = proc.stdout.splitlines()[:2]
    assert int(in_use) >= 54 * 2**20 and "whole chunks" in note


def test_aliases_of_one_buffer_count_once():
    x = jax.device_put(np.ones(1000, np.float32), jax.devices()[1])
    before = memory.snapshot().device("cpu:1").bytes_in_use
    _ = [s.data for s in x.addressable_shards]  # makes JAX cache an alias Array
    assert memory.snapshot().device("cpu:1").bytes_in_use == before
    del x


def test_live_arrays_of_every_backend_are_counted():
    """jax.live_arrays() with no argument lists only the default backend's arrays; the kit
    asks every backend (on a GPU machine the host's CPU arrays were read as 0 B)."""
    seen = []
    real = jax.live_arrays

    def recording(platform=None):
        seen.append(platform)
        return real(platform) if platform else real()

    import unittest.mock

    with unittest.mock.patch.object(jax, "live_arrays", recording):
        memory.snapshot(jax.devices("cpu"))  # CPU keeps no stats: read from live arrays
    from jax.extend.backend import backends

    assert set(seen) == set(backends()) and None not in seen


def test_host_peak_sees_a_spike_between_two_samples():
    from helpers.memory import reset_host_peak
    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM and clear_refs are Linux's")
    assert reset_host_peak()
    size = 200 * 2**20
    with memory.track(interval=30) as trace:  # no sample between start and end
        spike = np.ones(size // 8)  # touched: resident
        del spike
    start = trace.samples[0].host.rss
    assert max(trace.host_rss) - start < size / 2  # the samples missed it...
    assert trace.host_peak - start > 0.9 * size  # ...the kernel's high-water mark did not
    assert trace.to_dict()["host_peak_rss"][-1] == trace.host_peak


def test_host_is_sampled_by_a_helper_process_while_this_process_holds_the_gil():
    if not sys.platform.startswith("linux"):
        pytest.skip("the helper reads /proc")
    data = np.random.default_rng(0).random(2_000_000).tolist()
    with memory.track(interval=0.01) as trace:
        trace.mark("sort")
        data.sort()  # one C call that holds the GIL all the way: no thread can sample
        trace.mark("sorted")
    (t0, _), (t1, _) = trace.marks
    # In the merged series a sample whose `devices` is a new tuple is one the thread (or a mark)
    # took; the others are the helper's. Around the sort the thread may get the GIL a time or
    # two (how often is the scheduler's business); during it, never.
    thread_times, helper_times, last = [], [], None
    for t, s in zip(trace.times, trace.samples, strict=True):
        (thread_times if s.devices is not last else helper_times).append(t)
        last = s.devices
    stops = sorted({t0, t1, *(t for t in thread_times if t0 < t < t1)})
    start, end = max(zip(stops, stops[1:], strict=False), key=lambda gap: gap[1] - gap[0])
    helper_in_gap = [t for t in helper_times if start < t < end]
    assert end - start > 0.5 * (t1 - t0)  # the thread stood still through most of the sort...
    assert len(helper_in_gap) >= 5  # ...while the helper went on sampling the host
    assert all(s.host.source == "helper process (/proc)" for s in trace.samples[1:])
    assert set(trace.achieved_hz_by_source) == {"devices", "host"}
    assert trace.achieved_hz == min(trace.achieved_hz_by_source.values())
    assert trace.to_dict()["achieved_hz_by_source"] == trace.achieved_hz_by_source


def test_without_the_helper_the_thread_samples_the_host(monkeypatch):
    from helpers._internal import host_sampler

    monkeypatch.setattr(host_sampler, "start", lambda *a, **k: None)  # e.g. no /proc
    with memory.track(interval=0.01) as trace:
        time.sleep(0.1)
    assert set(trace.achieved_hz_by_source) == {"devices and host"}
    assert all(s.host.source == "psutil" for s in trace.samples)


def test_the_helper_ends_with_the_block_and_reports_the_end():
    from helpers._internal import host_sampler

    sampler = host_sampler.start(0.01)
    if sampler is None:
        pytest.skip("no helper here")
    proc = sampler._proc
    time.sleep(0.05)
    samples = sampler.stop()
    assert proc.poll() is not None  # no process left behind
    assert sampler.cpu_s is not None and 0 <= sampler.cpu_s < 1  # its own sampling CPU time
    assert len(samples) >= 3 and samples[-1]["time"] >= samples[0]["time"]
    assert all(s["rss"] > 0 and s["peak_rss"] >= s["rss"] for s in samples)


def test_a_helper_whose_handle_is_dropped_ends_with_it():
    import gc

    from helpers._internal import host_sampler

    sampler = host_sampler.start(0.01)
    if sampler is None:
        pytest.skip("no helper here")
    proc = sampler._proc
    del sampler
    gc.collect()
    assert proc.poll() is not None  # not sampling on until this process ends


def test_track_reports_what_sampling_cost_in_cpu_time():
    with memory.track(interval=0.01) as trace:
        assert trace.sampling_cpu_share is None  # not known until the block ends
        t = time.perf_counter()
        while time.perf_counter() - t < 0.3:  # busy: the samplers compete for the CPU
            pass
    cpu = trace.sampler_cpu_s
    assert set(cpu) >= {"sampler thread"}
    assert cpu["sampler thread"] > 0
    assert all(0 <= v < trace.wall_s for v in cpu.values()), cpu
    assert 0.25 < trace.wall_s < 5
    share = trace.sampling_cpu_share
    assert share == sum(cpu.values()) / (trace.wall_s * (os.cpu_count() or 1))
    assert 0 < share < 0.25
    assert trace.to_dict()["sampler_cpu_s"] == cpu


def test_a_snapshot_leaves_jax_live_arrays_as_it_found_them():
    """Asking an array for its buffer address can make JAX cache a second Array over the same
    buffer, which a plain jax.live_arrays() sum would then count twice; the snapshot asks only
    where two arrays could share a buffer."""
    y = jax.device_put(jnp.arange(4096.0) + 1, jax.devices()[0])  # a device_put result
    count = len(jax.live_arrays("cpu"))
    memory.snapshot()
    assert len(jax.live_arrays("cpu")) == count
    y.unsafe_buffer_pointer()  # what the snapshot used to do to every array
    assert len(jax.live_arrays("cpu")) == count + 1  # the artefact this test guards against
    del y


def test_snapshot_takes_platform_and_device_names():
    cpus = jax.devices("cpu")
    assert [d.device for d in memory.snapshot("cpu").devices] == [f"cpu:{d.id}" for d in cpus]
    assert [d.device for d in memory.snapshot(["cpu:1", cpus[0]]).devices] == ["cpu:1", "cpu:0"]
    with pytest.raises(BadInputError, match="no device or platform 'moon'.*cpu:0"):
        memory.snapshot("moon")


def test_a_pool_grown_on_demand_is_said_to_count_whole_chunks(monkeypatch):
    # the H100's numbers (2026-11-26): a 36 MiB array in a pool grown on demand showed 64 MiB
    grown = {"bytes_in_use": 64 * 2**20, "peak_bytes_in_use": 64 * 2**20,
             "bytes_limit": 8108 * 2**20, "pool_bytes": 66 * 2**20}
    monkeypatch.setattr(memory, "memory_stats", lambda d: grown)
    monkeypatch.setattr(memory.jaxcompat, "backend_start_snapshot",  # jax 0.11: no record of
                        lambda: ("unavailable", {}))  # the start, so today's environment
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    snap = memory.snapshot("cpu:0")
    (d,) = snap.devices
    assert d.source == memory.ALLOCATOR and "whole chunks" in d.note
    assert "cpu:0: the pool grows on demand" in str(snap)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "FALSE")  # jaxlib: preallocation on
    assert memory.snapshot("cpu:0").devices[0].note == ""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")  # preallocated: each buffer exact,
    assert memory.snapshot("cpu:0").devices[0].note == ""  # even where the pool backed off
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    monkeypatch.setattr(memory, "memory_stats", lambda d: {**grown, "pool_bytes": 8108 * 2**20})
    assert memory.snapshot("cpu:0").devices[0].note == ""  # grown to its limit: not known
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")  # what the backend started with wins
    monkeypatch.setattr(memory, "memory_stats", lambda d: grown)
    monkeypatch.setattr(memory.jaxcompat, "backend_start_snapshot", lambda: (
        "installed", {"cpu": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}}))
    assert "whole chunks" in memory.snapshot("cpu:0").devices[0].note


def test_host_memory_jax_frees_while_the_snapshot_reads_is_said():
    """jax#14882: a NumPy array device_put copied stays in host memory after `del` until JAX's
    next garbage collection, which reading memory_stats() runs: the snapshot would show a clean
    process and say nothing (a helper's round). Now it says what was given back."""
    import gc

    gc.collect()
    gc.disable()  # no collection of the kit's own between the del and the snapshot
    try:
        x = np.ones(64 * 2**20 // 4 + 1, np.float32)[1:]  # 64 MiB, 4 bytes off: copied
        y = jax.device_put(x)
        y.block_until_ready()
        del x, y
        snap = memory.snapshot()
    finally:
        gc.enable()
    assert snap.released_bytes >= 48 * 2**20
    assert "was given back while the devices' memory was read" in str(snap)
    again = memory.snapshot()
    assert again.released_bytes == 0 and "given back" not in str(again)


class _Queued:  # an array whose computation has not finished: asking its address would wait
    def __init__(self, device):
        self.shape, self.dtype = (256, 256), np.dtype("float32")
        self.sharding = jax.sharding.SingleDeviceSharding(device)

    def is_deleted(self):
        return False

    def is_ready(self):
        return False

    def unsafe_buffer_pointer(self):
        raise AssertionError("asked a queued array for its address: that waits for it")


def test_arrays_still_being_computed_are_counted_without_waiting_and_named(monkeypatch):
    """jax#928: a loop that runs ahead of the device; the kit's own reading waited for the
    queue (asking an array for its address blocks until it is computed) and said nothing."""
    dev = jax.devices()[2]
    monkeypatch.setattr(memory, "live_arrays", lambda: [_Queued(dev) for _ in range(12)])
    (d,) = memory.snapshot([dev]).devices
    assert d.bytes_in_use == 12 * 256 * 256 * 4  # counted, never asked for an address
    assert d.note.startswith("12 of its arrays are still being computed")
    assert ".block_until_ready()" in d.note
    monkeypatch.setattr(memory, "live_arrays", lambda: [_Queued(dev) for _ in range(3)])
    assert memory.snapshot([dev]).devices[0].note == ""  # a few in flight: nothing to say


_RESTARTED = """
import gc
import jax, jax.numpy as jnp
from helpers import holders, memory
for met_before in (False, True):  # the kit never met the old backend; the kit met it
    x = jnp.ones((2048, 2048)) * 2  # 16 MiB the user still holds
    if met_before:
        memory.snapshot()
    jax._src.api.clear_backends()  # the old answers' call (jax.clear_backends until 0.4.36)
    gc.collect()
    print('jax lists', len(jax.live_arrays()))
    d = memory.snapshot().device('cpu:0')
    print('snapshot', d.bytes_in_use)
    print('note', d.note)
    real, memory.memory_stats = memory.memory_stats, lambda d: {'bytes_in_use': 0}
    print('allocator', memory.snapshot().device('cpu:0').note)  # a GPU's counters: a stand-in
    memory.memory_stats = real
    h = holders.largest(2)
    print('holders', h.live_bytes, h.arrays[0].held_by[0])
    print('restarted', h.restarted)
    del x, h, d  # the fix it names
    gc.collect()
    print('after del', memory.snapshot().device('cpu:0').bytes_in_use,
          repr(memory.backend_restarted()))
"""


def test_jax_10828_arrays_of_a_restarted_backend_are_counted_and_named():
    """jax-ml/jax#10828 (with jax#20022): after jax._src.api.clear_backends(), arrays made
    before are alive and hold their memory, but jax.live_arrays() no longer lists them: the
    kit said 0 live arrays, 0 B. It now counts them (the old client's, found by a weak
    reference, or once among Python's objects when the kit never met it), says why, and `del`
    frees them."""
    proc = run_python(_RESTARTED, env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"},
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 14, proc.stdout
    for jax_lists, snap, note, counters, held, restarted, after in (lines[:7], lines[7:]):
        assert jax_lists == "jax lists 0"  # what JAX says, and what the kit used to repeat
        assert snap == f"snapshot {16 * 2**20}"
        assert "belong" in note and "restarted" in note and "jax-ml/jax#10828" in note
        assert "jax.live_arrays() no longer lists" in note and "jax.clear_caches()" in note
        assert "16.00 MiB are in the count above" in note
        assert "may leave out its 16.00 MiB" in counters and "not yet run on a GPU" in counters
        assert held == f"holders {16 * 2**20} the variable 'x' in the script"  # (no IPython)
        assert restarted.startswith("restarted ") and "`del`" in restarted
        assert after == "after del 0 ''"


def test_jax_26216_a_host_read_of_a_sharded_array_counts_each_shard_once():
    """jax-ml/jax#26216: np.asarray (and jax.device_get, even str) of a sharded array makes JAX
    list single-device Arrays over the shards' own buffers; snapshot() counted them beside the
    array, twice the device bytes (32 MiB per device for 16). Each buffer counts once. jax
    0.12.0.1 makes no such Arrays: the count holds there too."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((N_SIMULATED,), ("x",))
    before = {d.device: d.bytes_in_use for d in memory.snapshot().devices}
    w = jax.device_put(jnp.ones((N_SIMULATED * 1024, 1024), jnp.float32),
                       NamedSharding(mesh, PartitionSpec("x")))  # 4 MiB per device
    listed = len(jax.live_arrays())
    for read in (np.asarray, jax.device_get, str):
        read(w)
        # JAX's views are there (jax 0.8.0 to 0.11.2); 0.12.0.1 makes none (measured)
        views = len(jax.live_arrays()) > listed
        assert len(memory.shard_buffers()) >= N_SIMULATED if views else \
            memory.shard_buffers() == set()
        grown = {d.device: d.bytes_in_use - before[d.device] for d in memory.snapshot().devices}
        assert grown == {f"cpu:{i}": 4 * 2**20 for i in range(N_SIMULATED)}, (read, grown)
    del w


def test_jax_26216_a_sharded_array_never_read_on_the_host_is_not_asked_for_its_shards():
    """jax-ml/jax#26216's fix made what it looks for: live_bytes_by_device() read shard.data of
    a sharded batch never read on the host, wherever the user's own per-device arrays had the
    shard's shape, which makes JAX cache an Array over each shard (live arrays 5 -> 13 in the
    review's repro; holders then called them a host read's views). Only an array that carries
    a host copy is asked; after a read its shards still count once."""
    import gc

    from jax.sharding import NamedSharding, PartitionSpec

    from helpers._internal import jaxcompat

    mesh = jax.make_mesh((N_SIMULATED,), ("x",))
    batch = jax.device_put(jnp.ones((N_SIMULATED * 256, 1024), jnp.float32),
                           NamedSharding(mesh, PartitionSpec("x")))  # 1 MiB per device
    acts = [jax.device_put(jnp.zeros((256, 1024), jnp.float32), d) for d in jax.devices()]
    jax.block_until_ready((batch, acts))
    gc.collect()
    n = len(jax.live_arrays())
    before = memory.live_bytes_by_device()
    assert memory.shard_buffers() == set()  # no views claimed: nothing read on the host
    assert memory.live_bytes_by_device() == before
    assert len(jax.live_arrays()) == n  # was n + 8: four Arrays over the shards, four twins
    assert jaxcompat.host_copy_bytes(batch) == 0
    np.asarray(batch)  # the read that makes JAX's views: still each buffer once
    assert len(memory.shard_buffers()) == N_SIMULATED
    assert memory.live_bytes_by_device() == before
    del batch, acts


def test_jax_26216_a_sharded_array_read_shard_by_shard_counts_each_shard_once():
    """Reading a sharded array shard by shard (``s.data for s in x.addressable_shards``, what
    holders advises to read without a host copy) makes JAX list an Array over each shard and
    keep the Shards on the array; the count took them for the user's own arrays and doubled
    (1 -> 2 MiB per device sharded, 4 -> 8 MiB replicated). Each buffer counts once, known by
    identity: the count and holders make no Array of their own, even beside per-device arrays
    of the shard's shape, and an array whose shards were never listed is still not asked."""
    import gc

    from jax.sharding import NamedSharding, PartitionSpec

    from helpers import holders

    mesh = jax.make_mesh((N_SIMULATED,), ("x",))
    acts = [jax.device_put(jnp.zeros((256, 1024), jnp.float32), d) for d in jax.devices()]
    never = jax.device_put(jnp.ones((N_SIMULATED * 256, 1024), jnp.float32),
                           NamedSharding(mesh, PartitionSpec("x")))
    jax.block_until_ready((acts, never))
    gc.collect()
    base = memory.live_bytes_by_device()
    for spec, per_device in ((PartitionSpec("x"), 2**20), (PartitionSpec(), 4 * 2**20)):
        x = jax.device_put(jnp.ones((N_SIMULATED * 256, 1024), jnp.float32),
                           NamedSharding(mesh, spec)).block_until_ready()
        before = memory.live_bytes_by_device()
        assert {d: before[d] - base[d] for d in before} == {d: per_device for d in before}
        assert memory.shard_views() == set()
        listed = len(jax.live_arrays())
        pieces = [np.asarray(s.data) for s in x.addressable_shards]
        n = len(jax.live_arrays())
        assert n == listed + N_SIMULATED  # JAX's Arrays over the shards are listed
        assert len(memory.shard_views()) == N_SIMULATED
        assert memory.live_bytes_by_device() == before, spec
        h = holders.largest(3, namespace={"x": x, "acts": acts, "never": never})
        assert h.shard_views == N_SIMULATED and "read on the host or shard by shard" in str(h)
        assert h.arrays[0].held_by == ("the variable 'x' in the notebook",)
        assert len(jax.live_arrays()) == n  # neither made one
        del pieces, x, h
        gc.collect()
    del acts, never


_JAX_8096 = """
import jax, jax.numpy as jnp
from helpers import memory
from helpers.units import format_bytes
x = jnp.ones((4096,), jnp.float32); y = jnp.ones((2048,), jnp.float32)
f = jax.jit(lambda x, y: jnp.sort(x[:, None] * jnp.sin(y)[None, :], axis=1)[:, -1].sum())
f(x, y).block_until_ready()  # compiled outside the block
with memory.track(interval=0.01) as trace:
    f(x, y).block_until_ready()
peak = trace.host_peak
print(trace.peak("cpu:0") - trace.device_bytes["cpu:0"][0],
      peak - trace.host_rss[0] if isinstance(peak, int) else -1)
"""


def test_jax_8096_track_s_cpu_device_peak_counts_live_arrays_and_host_peak_is_the_block_s():
    """jax-ml/jax#8096: a per-block peak per device. On the CPU the device series counts live
    arrays, so a sort's 32 MiB XLA temporary never shows there, however often it is sampled;
    the host high-water mark is the block's peak. peak()'s and host_peak's words say so."""
    out = run_python(_JAX_8096, env={"JAX_PLATFORMS": "cpu"})  # fresh: no freed pages reused
    assert out.returncode == 0, out.stderr[-2000:]
    device, host = (int(v) for v in out.stdout.split()[-2:])
    assert device < 2**20  # the 32 MiB temporary is in no device sample
    if host >= 0:  # Linux: the kernel's mark saw it
        assert host >= 16 * 2**20
    said = " ".join(memory.MemoryTrace.peak.__doc__.split())
    assert "XLA's temporaries" in said and "never appear" in said and "host_peak" in said
    assert "jax-ml/jax#8096" in said


def test_jax_26216_pricing_a_data_parallel_step_makes_no_shard_views():
    """Asking a sharded array for its buffer pointer (or reading ``s.data``) makes JAX cache
    an Array over each shard; preflight_step did so while pricing a data-parallel step, and
    the next count of live memory met those views as a host read's and counted each shard
    twice (found by a review: 8 -> 16 MiB per device)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import preflight

    mesh = jax.make_mesh((N_SIMULATED,), ("data",))
    w = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P()))
    b = jax.device_put(jnp.ones((N_SIMULATED * 256, 256)), NamedSharding(mesh, P("data")))
    jax.block_until_ready((w, b))
    before, count = memory.live_bytes_by_device(), len(jax.live_arrays())
    p = preflight.preflight_step(lambda w, b: jnp.sum((b @ w) ** 2), w, b)
    assert p.verdict == "fits"
    assert len(jax.live_arrays()) == count  # no Array made over a shard
    assert memory.live_bytes_by_device() == before
