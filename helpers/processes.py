"""Many processes: one JAX job over several processes, and what each of them sees.

A program outgrows one process when it outgrows one host: ``jax.distributed.initialize()`` joins
one process per host (or per GPU) into one job. Each process then has its own devices
(``jax.local_devices()``) and sees every process's (``jax.devices()``); an array can span them
all, and each process holds, reads and writes only its own shards.

:func:`launch` starts the processes of one job on this machine: a **stand-in for hosts**. Each is
a local process, CPU only, with its own simulated CPU devices; they meet at a coordinator on
localhost, and collectives go through gloo over localhost where a cluster uses NCCL or the TPU
interconnect. Each runs one function named ``"module:function"`` (the kit's child protocol),
after ``jax.distributed.initialize``, and answers with plain data or a record. A process that
fails, or a job that hangs, ends the whole job: every process is killed and reaped, and the
:class:`Job` says what each one did (the caller's kernel keeps running).

:func:`report` is the function notebook 13 runs in each process: what that process sees
(:class:`ProcessReport`).

On a cluster the same program runs under the launcher's variables instead (SLURM, Kubernetes,
Cloud TPU): only the coordinator address and the process count change (docs/processes.md).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helpers import devices
from helpers._internal import child
from helpers._internal.records import Display, Record, from_dict, to_json_value
from helpers.devices import LAUNCH_VARS, Placement, ProcessView
from helpers.errors import BadInputError, ChildProcessFailed

__all__ = ["STAND_IN", "Job", "ProcessReport", "ReportRequest", "abort_in", "hang_in", "launch",
           "report"]

STAND_IN = ("stand-in for hosts: local CPU processes on this machine, each with its own "
            "simulated CPU devices, collectives through gloo over localhost")


@dataclass(frozen=True)
class Job(Display):
    """A job launched by :func:`launch`: each process's answer (the record the target's return
    annotation names, else plain data; None where it gave none) and, where it failed, how (its
    exit and the end of its stderr)."""

    target: str
    processes: int
    devices_per_process: int
    coordinator: str
    stand_in: str
    answers: tuple[Any, ...]
    failures: tuple[str, ...]  # "" for a process that answered
    seconds: float

    @property
    def ok(self) -> bool:
        """Every process answered."""
        return not any(self.failures)

    def answer(self, process: int) -> Any:
        """Process ``process``'s answer; ChildProcessFailed saying how it failed."""
        if self.failures[process]:
            raise ChildProcessFailed(f"process {process} of {self.target}: "
                                     f"{self.failures[process]}")
        return self.answers[process]


@dataclass(frozen=True)
class _Launch(Record):
    target: str
    request: Any
    coordinator: str
    processes: int
    process_id: int
    timeout: int


#: what process 0 says when the coordinator's port was taken before it could bind it (gRPC's
#: log line, then either JAX's error or a crash)
_PORT_TAKEN = ("Failed to add port to server", "Failed to start RPC server")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _device_count_flags(flags: str, n: int) -> str:
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={n}"])


def launch(target: str, request: Any = None, *, processes: int = 2,
           devices_per_process: int = 2, timeout: float = 120) -> Job:
    """Run ``target`` ("module:function", importable by a fresh Python) in each of
    ``processes`` local processes joined into one JAX job, each with ``devices_per_process``
    simulated CPU devices, and return what each answered (:class:`Job`). ``request`` (plain
    data or a record) is passed to every process (``None``: the target is called with no
    argument). The job is a stand-in for hosts
    (:data:`STAND_IN`). After ``timeout`` seconds, or as soon as one process fails, every
    process is killed; nothing is left running."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise BadInputError(f"target must be 'module:function', got {target!r}")
    for name, value, top in (("processes", processes, 16),
                             ("devices_per_process", devices_per_process, 64)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            raise BadInputError(f"{name} must be an int from 1 to {top}, got {value!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise BadInputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    env = child.child_env(
        {"JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": _device_count_flags(os.environ.get("XLA_FLAGS", ""), devices_per_process)},
        drop=LAUNCH_VARS)  # this machine's job, not the one this process may belong to
    wire = to_json_value(request)
    t0 = time.perf_counter()
    for _ in range(3):  # the free port found may be taken before process 0 binds it: retry
        coordinator = f"127.0.0.1:{_free_port()}"
        # joining gets its own, longer limit: a slow start is then "did not finish in time"
        # (the job's timeout), not a failure inside initialize() that would look like a culprit
        requests = [_Launch(target, wire, coordinator, processes, i, max(60, int(timeout)))
                    for i in range(processes)]
        results = child.run_group(f"{__name__}:_process_main", requests,
                                  envs=[env] * processes,
                                  timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        if not any(m in results[0].stderr for m in _PORT_TAKEN):
            break
    seconds = time.perf_counter() - t0
    # every process that finished answers {"answer": ...}, also for a target returning None
    failures = tuple("" if isinstance(r.data, dict) and "answer" in r.data and r.returncode == 0
                     else r.describe_failure() for r in results)
    # the process that failed by itself first; the ones run_group killed because of it
    culprit = next((i for i, r in enumerate(results)
                    if r.returncode not in (0, -signal.SIGKILL)), None)
    if culprit is not None:
        failures = tuple(f"killed when process {culprit} failed" if f and
                         results[i].returncode == -signal.SIGKILL else f
                         for i, f in enumerate(failures))
    kind = _answer_type(target)
    read = [_read_answer(r, f, kind) for r, f in zip(results, failures, strict=True)]
    answers, failures = tuple(a for a, _ in read), tuple(f for _, f in read)
    return Job(target, processes, devices_per_process, coordinator, STAND_IN, answers, failures,
               seconds)


def _read_answer(result, failure: str, kind: type | None) -> tuple[Any, str]:
    """One process's answer (the record ``kind``, when given) and its failure ("" if none)."""
    if failure:
        return None, failure
    data = result.data["answer"]
    if kind is None or data is None:
        return data, ""
    try:
        return from_dict(kind, data), ""
    except (TypeError, KeyError, ValueError) as err:
        return None, f"its answer is not a {kind.__name__} ({type(err).__name__}: {err})"


def _answer_type(target: str) -> type | None:
    """The record type ``target`` says it returns (its annotation), when this process can
    import it; None (answers stay plain data) otherwise."""
    import typing

    try:
        kind = typing.get_type_hints(child.resolve(target)).get("return")
    except Exception:
        return None
    return kind if isinstance(kind, type) and issubclass(kind, Record) else None


def _process_main(req: _Launch) -> Any:
    """In each process of :func:`launch`: join the job, run the target, leave the job."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(req.coordinator, req.processes, req.process_id,
                               cluster_detection_method="deactivate",
                               coordinator_bind_address=req.coordinator,  # this machine only
                               initialization_timeout=req.timeout)
    try:
        fn = child.resolve(req.target)
        # no request: the target is called with nothing (whatever it takes)
        out = fn() if req.request is None else child.call(fn, req.request)
    except SystemExit as done:
        if done.code not in (None, 0):
            _leave_now()
        out = None  # sys.exit(0): the target finished, with nothing to say
    except BaseException:
        _leave_now()
    jax.distributed.shutdown()
    return {"answer": to_json_value(out)}


def _leave_now() -> None:
    """End a process whose target failed, at once, traceback on stderr."""
    # not jax.distributed.shutdown() (also registered at exit): it waits for every other
    # process at a barrier, and they may be waiting for this one
    import sys
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)


def abort_in(process: int) -> None:
    """A stand-in for a process that dies: process ``process`` aborts, the others wait for
    it at a barrier (as processes of a job wait at a collective). Run it with :func:`launch`."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_index() == process:
        os.abort()
    multihost_utils.sync_global_devices("helpers.processes.abort_in")


def hang_in(process: int) -> None:
    """A stand-in for a process that hangs: process ``process`` sleeps for ten minutes, the
    others wait for it at a barrier. Run it with :func:`launch` and a short ``timeout``."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_index() == process:
        time.sleep(600)
    multihost_utils.sync_global_devices("helpers.processes.hang_in")


# --- what notebook 13 asks each process -----------------------------------------------------
@dataclass(frozen=True)
class ReportRequest(Record):
    """What :func:`report` does in each process: the rows of the global array each process
    contributes, and the token file to feed from (None: no data loading)."""

    rows_per_process: int = 4
    columns: int = 3
    token_file: str | None = None
    batch_size: int = 16
    seq_len: int = 64
    seed: int = 0


@dataclass(frozen=True)
class ProcessReport(Display):
    """What one process of a job sees: itself in the job, a global array (its shards, and what
    reading it here does), an array made under ``jax.default_device`` of another process's
    device, the memory on its own devices, and the bytes it loads to feed a global batch."""

    view: ProcessView
    doctor_line: str  # the line the doctor's report gives this process in its job
    default_device: str  # where jnp.ones lands here without jax.default_device
    placement: Placement  # the global array, every process's rows
    printed: str  # print() of the global array, here: its shape only (or the error, jax < 0.10)
    read_error: str  # np.asarray of the global array, here
    global_sum: float  # a jit over the global array: every process's rows
    elsewhere: Placement  # jnp.ones under jax.default_device(another process's device)
    elsewhere_error: str  # a jit over it
    device_bytes: Mapping[str, int]  # memory.snapshot: this process's devices only
    batch_rows: tuple[int, int]  # the rows of each global batch this process gathers
    batch_bytes_here: int  # bytes this process gathers per batch
    batch_digest: str  # sha256 of the first global batch's bytes, gathered into every process
    whole_file_bytes: int  # the mistake: bytes one process holds after loading the whole file
    anon_growth_whole_file: int  # its own host memory (RssAnon), measured, for that load
    anon_growth_share: int  # the same for its share of 4 batches


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


def report(request: ReportRequest) -> ProcessReport:
    """In one process of a job (run it with :func:`launch`): what this process sees. Each
    process contributes ``rows_per_process`` rows of value ``100 * process + row`` to one global
    array over every process's devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import datasets, memory

    view = devices.process_view()
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    rows = NamedSharding(mesh, P("data"))
    me, n = jax.process_index(), jax.process_count()
    local = (100 * me + np.arange(request.rows_per_process * request.columns, dtype=np.float32)
             .reshape(request.rows_per_process, request.columns))
    g = jax.make_array_from_process_local_data(rows, local)
    try:
        np.asarray(g)
        read_error = ""
    except Exception as err:
        read_error = _first_line(err)
    try:  # jax 0.10 prints the shape only; older versions raise as np.asarray does
        printed = str(g)
    except Exception as err:
        printed = _first_line(err)
    total = float(jax.jit(jnp.sum)(g))  # replicated over every device: readable everywhere
    default = devices.device_name(next(iter(jnp.ones(()).devices())))
    other = next(d for d in jax.devices() if d.process_index != me) if n > 1 else jax.devices()[0]
    with jax.default_device(other):
        far = jnp.ones((4,), jnp.float32)
    try:
        jax.jit(jnp.sum)(far).block_until_ready()
        far_error = ""
    except Exception as err:
        far_error = _first_line(err)
    snap = memory.snapshot()
    batch_rows, here, digest = (0, 0), 0, ""
    grow_whole = grow_share = whole = 0
    if request.token_file:
        from jax.experimental import multihost_utils

        def anon() -> int:  # this process's own memory (a memmapped file's pages are shared)
            host = memory.snapshot([]).host
            return host.anon if isinstance(host.anon, int) else host.rss

        def feed_on(steps: int, seed: int):
            return datasets.batches(request.token_file, request.batch_size, request.seq_len,
                                    sharding=rows, prefetch=0, steps=steps, seed=seed)

        with feed_on(1, request.seed + 1) as warm:  # the feeding code's own first use
            list(warm)
        before = anon()
        with feed_on(4, request.seed) as feed:
            first = None
            for batch in feed:
                first = batch if first is None else first
            batch_rows = feed.rows
            grow_share = anon() - before
            whole_batch = np.ascontiguousarray(multihost_utils.process_allgather(first,
                                                                                  tiled=True))
            digest = hashlib.sha256(whole_batch.tobytes()).hexdigest()
            here = (batch_rows[1] - batch_rows[0]) * request.seq_len * feed.tokens.itemsize
        before = anon()
        everything = np.fromfile(request.token_file, dtype=np.uint8)  # every process, all of it
        whole, grow_whole = int(everything.nbytes), anon() - before
        del everything
    doctor_line = next((line.strip() for line in str(devices.probe()).splitlines()
                        if line.startswith("processes:")), "")
    return ProcessReport(view, doctor_line, default, devices.placement(g), printed, read_error,
                         total,
                         devices.placement(far), far_error,
                         {d.device: d.bytes_in_use for d in snap.devices}, batch_rows, here,
                         digest, whole, grow_whole, grow_share)
