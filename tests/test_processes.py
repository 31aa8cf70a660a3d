"""Many processes: a JAX job of 2 local processes (helpers.processes.launch), what each sees, the
doctor and placement inside one, and nothing left running when a process fails or hangs."""

import hashlib

import numpy as np
import psutil
import pytest

from helpers import datasets, devices, feeding, processes
from helpers.errors import BadInputError, ChildProcessFailed


def _children_left(before: frozenset = frozenset()) -> list:
    """This process's children still running, other than those in ``before`` (pids)."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _children_now() -> frozenset:
    return frozenset(p.pid for p in psutil.Process().children(recursive=True))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.safetensors"
    datasets.write_tokens(path, 4_000_000, progress=False)
    return path


@pytest.fixture(scope="module")
def job(token_file):
    before = _children_now()
    found = processes.launch("helpers.processes:report",
                             processes.ReportRequest(token_file=str(token_file)), processes=2,
                             devices_per_process=2, timeout=120)
    assert found.ok, found.failures
    assert all(isinstance(a, processes.ProcessReport) for a in found.answers)  # its annotation
    assert not _children_left(before)  # the job's processes ended with it
    return found, list(found.answers)


def test_each_process_knows_its_index_and_its_own_devices(job):
    found, reports = job
    assert found.stand_in == processes.STAND_IN
    for i, r in enumerate(reports):
        v = r.view
        assert v.distributed and v.process_index == i and v.process_count == 2
        assert v.coordinator == found.coordinator
        assert len(v.local_devices) == 2 and len(v.devices) == 4
        assert set(v.local_devices) | set(v.other_devices) == set(v.devices)
        assert not set(v.local_devices) & set(v.other_devices)
    assert set(reports[0].view.local_devices).isdisjoint(reports[1].view.local_devices)


def test_a_global_array_is_read_only_where_its_shards_are(job):
    _, reports = job
    for i, r in enumerate(reports):
        p = r.placement
        assert p.shape == (8, 3) and len(p.shards) == 4
        mine = [s for s in p.shards if s.addressable]
        assert len(mine) == 2 and all(s.process_index == i for s in mine)
        assert p.local_bytes == p.device_bytes // 2 == 2 * 4 * 3 * 4 // 2
        assert "spans 2 processes" in p.explanation and "process_allgather" in p.explanation
        assert "not this one's" in str(p)
        assert r.read_error.startswith("RuntimeError") and "non-addressable" in r.read_error
        assert "shape=(8, 3)" in r.printed or "non-addressable" in r.printed  # never values
        assert r.default_device == r.view.local_devices[0]  # each process's own first device
        # a jit over it adds every process's rows: 100 * process + 0..11, for processes 0 and 1
        assert r.global_sum == sum(100 * q * 12 + sum(range(12)) for q in range(2))
        assert set(r.device_bytes) == set(r.view.local_devices)  # its own devices, no others


def test_default_device_of_another_process_gives_an_array_with_nothing_here(job):
    _, reports = job
    for r in reports:
        assert r.elsewhere.shards and not any(s.addressable for s in r.elsewhere.shards)
        assert "None of it is in this process" in r.elsewhere.explanation
        assert "addressable" in r.elsewhere_error  # a jit over it fails in this process


def test_each_process_gathers_only_its_rows_of_the_same_global_batch(job, token_file):
    _, reports = job
    request = processes.ReportRequest(token_file=str(token_file))
    assert [r.batch_rows for r in reports] == [(0, 8), (8, 16)]
    assert all(r.batch_bytes_here == 8 * request.seq_len * 2 for r in reports)
    # the global batch is the one a single process would make from the same seed
    tokens = datasets.open_tokens(token_file)
    starts = next(feeding.window_starts(len(tokens), request.batch_size, request.seq_len,
                                        seed=request.seed))
    one = np.ascontiguousarray(feeding.gather(tokens, starts, request.seq_len))
    expected = hashlib.sha256(one.tobytes()).hexdigest()  # the same bytes, in the same order
    assert [r.batch_digest for r in reports] == [expected, expected]
    # the mistake, measured: each process loading the whole file holds all of it
    for r in reports:
        assert r.whole_file_bytes == token_file.stat().st_size
        assert r.anon_growth_whole_file >= 0.9 * r.whole_file_bytes
        assert r.anon_growth_share < 0.1 * r.anon_growth_whole_file


def doctor_in_a_job():
    """Run in each process of a job by the test below: the doctor's report there."""
    from helpers import doctor

    report = doctor.diagnose()
    return {"view": report.processes, "text": str(report)}


def test_the_doctor_reports_the_job_it_is_called_from():
    found = processes.launch("tests.test_processes:doctor_in_a_job", processes=2, timeout=120)
    assert found.ok, found.failures
    views = [devices.ProcessView.from_dict(a["view"]) for a in found.answers]
    assert [v.process_index for v in views] == [0, 1]
    assert all(v.coordinator == found.coordinator and v.process_count == 2 for v in views)
    assert f"this is process 1 of 2, coordinator {found.coordinator}" in found.answers[1]["text"]
    assert "caller-differs" not in found.answers[1]["text"]  # a job's devices are no surprise



def check_process_in_a_job():
    """Run in each process of a job by the test below: check_process's codes and its text."""
    import jax

    from helpers import settings

    jax.numpy.ones(2).block_until_ready()
    check = settings.check_process()
    return {"codes": [w.code for w in check.warnings], "text": str(check)}


def test_check_process_in_a_job_counts_this_process_s_cpu_devices():
    """A new user's trial: in every process of a jax.distributed job (the kit's own
    processes.launch too) check_process warned "asks for 2 CPU devices, but this process's
    CPU backend started with 4", counting every process's devices, and its fix changed
    nothing; its header said "cpu (4 devices)"."""
    found = processes.launch("tests.test_processes:check_process_in_a_job", processes=2,
                             devices_per_process=2, timeout=120)
    assert found.ok, found.failures
    for answer in found.answers:
        assert "cpu-devices-set-after-start" not in answer["codes"], answer["text"]
        assert "this process: cpu (2 devices)" in answer["text"], answer["text"]


def put_different_values():
    """Run in each process of a job by the test below: a NumPy array that differs by process
    put onto a sharding over every process, then the same put of one value everywhere."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import ipython

    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    try:
        jax.device_put(np.full(8, jax.process_index(), np.int32), NamedSharding(mesh, P()))
        said = ""
    except AssertionError as err:
        said = str(err)
    fixed = jax.device_put(np.zeros(8, np.int32), NamedSharding(mesh, P()))
    return {"said": said, "named": ipython._NOT_THE_SAME in said,
            "fixed": bool(fixed.is_fully_replicated)}


def test_sglang_jax_155_a_value_that_differs_by_process_is_named_by_jax_s_words():
    """sgl-project/sglang-jax#155 (a new user's trial): np.empty's leftover bytes differ by
    process, and a put onto a sharding over every process raises; the hook said nothing.
    JAX's words here are the ones the hook reads; one value everywhere (np.zeros) puts."""
    found = processes.launch("tests.test_processes:put_different_values", processes=2,
                             timeout=120)
    assert found.ok, found.failures
    for answer in found.answers:
        assert answer["named"] and answer["fixed"], answer

def params_on_the_first_device():
    """Run in each process of a job by the test below: a library's parameters made on its
    default device, jax.devices()[0] (pytorch/xla#8667), and then on jax.local_devices()[0]."""
    import jax
    import jax.numpy as jnp

    from helpers import devices

    def init(device):
        with jax.default_device(device):
            return {"w": jnp.ones((64, 64)), "b": jnp.zeros(64)}

    said = devices.tree_placement(init(jax.devices()[0])).problems
    mine = init(jax.local_devices()[0])
    return {"said": said, "fixed": devices.tree_placement(mine).problems,
            "sum": float(jax.jit(lambda p: p["w"].sum())(mine))}


def test_pytorch_xla_8667_a_tree_on_process_0_s_device_is_named_in_the_other_process():
    """pytorch/xla#8667 (a new user's trial): tree_placement said "no problem" in process 1
    of a tree a library made on jax.devices()[0], process 0's device, which that process can
    neither read nor compute with. The fix it names, jax.local_devices()[0], computes."""
    found = processes.launch("tests.test_processes:params_on_the_first_device", processes=2,
                             timeout=120)
    assert found.ok, found.failures
    first, second = found.answers
    assert not any("another process" in p for p in first["said"]), first  # its own device
    (note,) = [p for p in second["said"] if "another process" in p]
    assert note.startswith("2 leaves (['b'], ['w']) are wholly on another process's devices")
    assert "jax.local_devices()[0]" in note, note
    assert not second["fixed"] and second["sum"] == 64 * 64, second


def put_whole_and_in_pieces():
    """Run in each process of a job by the test below: one host array put onto a sharding over
    every process, by jax.device_put and by jax.make_array_from_callback, each traced."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import transfers

    s = NamedSharding(jax.make_mesh((jax.device_count(),), ("x",)), P("x"))
    host = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)
    with transfers.trace() as put:
        whole = jax.device_put(host, s)
    with transfers.trace() as converted:  # the thread's own line
        jax.device_put(jax.numpy.asarray(host), s)
    with transfers.trace() as pieces:  # the fix the kit names
        built = jax.make_array_from_callback(host.shape, s, lambda index: host[index])
    same = all(np.array_equal(np.asarray(a.data), np.asarray(b.data)) for a, b in
               zip(whole.addressable_shards, built.addressable_shards, strict=True))
    return {"put": put.to_dict(), "converted": converted.to_dict(),
            "pieces": pieces.to_dict(), "same": same,
            "piece_bytes": sum(sh.data.nbytes for sh in built.addressable_shards)}


def test_sglang_jax_1434_a_put_onto_every_process_names_its_check_and_the_callback_fix():
    """sgl-project/sglang-jax#1434: jax.device_put of a host array onto a sharding over every
    process ran out of memory. Before it puts the value, JAX checks that each process passed
    the same one (multihost_utils.assert_equal, an all-gather: jax/_src/dispatch.py), copying
    the whole array to each local device. The kit said "jax.device_put"; it now names the
    check and jax.make_array_from_callback, which copies only this process's pieces (run
    here: 10 MiB against 2 MiB per process for a 4 MiB array, on jax 0.8.0 and 0.10.2)."""
    found = processes.launch("tests.test_processes:put_whole_and_in_pieces", processes=2,
                             timeout=120)
    assert found.ok, found.failures
    for answer in found.answers:
        put = answer["put"]["transfers"]
        checks = [t for t in put if "multihost_utils.assert_equal" in t["reason"]]
        assert [t["nbytes"] for t in checks] == [4 * 2**20] * 2  # whole, to each local device
        assert all("jax.make_array_from_callback" in t["reason"] and "sglang-jax#1434"
                   in t["reason"] for t in checks)
        converted = answer["converted"]["transfers"]  # jnp.asarray first: checked the same
        assert [t["nbytes"] for t in converted if "assert_equal" in t["reason"]] == [4 * 2**20] * 2
        fixed = answer["pieces"]["transfers"]
        assert not any("assert_equal" in t["reason"] for t in fixed) and answer["same"]
        assert sum(t["nbytes"] for t in fixed) == answer["piece_bytes"] == 2 * 2**20
        assert sum(t["nbytes"] for t in put) - sum(t["nbytes"] for t in checks) == 2 * 2**20


def fails_in_process_one():
    import jax

    if jax.process_index() == 1:
        raise ValueError("process one cannot go on")
    import time

    time.sleep(120)  # process 0 would wait for process 1 without end


def hangs():
    import time

    time.sleep(120)


def test_a_process_that_fails_ends_the_job_and_says_which():
    before = _children_now()
    found = processes.launch("tests.test_processes:fails_in_process_one", timeout=100)
    assert not found.ok and "process one cannot go on" in found.failures[1]
    assert found.failures[0].startswith("killed when process 1 failed")
    with pytest.raises(ChildProcessFailed, match="process 1"):
        found.answer(1)
    assert not _children_left(before)


def test_a_process_that_aborts_ends_the_job_the_others_waiting_for_it_are_killed():
    before = _children_now()
    found = processes.launch("helpers.processes:abort_in", 1, timeout=100)
    assert "SIGABRT" in found.failures[1]
    assert found.failures[0] == "killed when process 1 failed"
    assert not _children_left(before)
    hung = processes.launch("helpers.processes:hang_in", 1, timeout=10)
    assert all("did not finish in time" in f for f in hung.failures)
    assert not _children_left(before)


def returns_nothing():
    return None


def exits_cleanly():
    import sys

    sys.exit(0)


def answers_the_wrong_thing() -> processes.ProcessReport:
    return {"not": "a report"}


def test_a_target_that_returns_nothing_or_exits_zero_has_answered():
    for target in ("returns_nothing", "exits_cleanly"):
        found = processes.launch(f"tests.test_processes:{target}", timeout=100)
        assert found.ok and found.answers == (None, None), found.failures


def test_an_answer_that_is_not_the_promised_record_is_a_failure_not_a_crash():
    found = processes.launch("tests.test_processes:answers_the_wrong_thing", timeout=100)
    assert not found.ok and all("not a ProcessReport" in f for f in found.failures)


def test_a_job_that_hangs_is_killed_at_its_timeout():
    before = _children_now()
    found = processes.launch("tests.test_processes:hangs", timeout=8)
    assert not found.ok and all("did not finish in time" in f for f in found.failures)
    assert not _children_left(before)


@pytest.mark.parametrize("kwargs, match", [
    ({"target": "no_colon"}, "module:function"),
    ({"processes": 0}, "processes"),
    ({"devices_per_process": 0}, "devices_per_process"),
    ({"timeout": -1}, "timeout")])
def test_bad_input_is_named(kwargs, match):
    args = {"target": "tests.test_processes:hangs", **kwargs}
    target = args.pop("target")
    with pytest.raises(BadInputError, match=match):
        processes.launch(target, **args)


def test_a_process_launched_as_one_of_many_that_never_joined_is_told(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "4")
    view = devices.process_view()
    assert not view.distributed and view.process_count == 1
    assert "SLURM_NTASKS=4" in view.note and "jax.distributed.initialize()" in view.note
    assert view.launch_environment["SLURM_NTASKS"] == "4"


def test_a_coordinator_port_taken_before_it_is_bound_is_tried_again(monkeypatch):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    ports = iter([port])  # the first port found is taken meanwhile
    real = processes._free_port
    monkeypatch.setattr(processes, "_free_port", lambda: next(ports, None) or real())
    try:
        found = processes.launch("tests.test_processes:returns_nothing", timeout=100)
    finally:
        taken.close()
    assert found.ok, found.failures
    assert found.coordinator != f"127.0.0.1:{port}"  # another port, found on the second try
