"""The OOM itself, reproduced without killing you.

:func:`reproduce` runs the story's load, ``safetensors.flax.load_file(path)["tokens"]``, in a
child process with a hard memory cap, then (with ``fixed=True``) runs it again with the fix, and
returns plain data. On a GPU the cap is the memory-fraction variable; without one, a labelled
CPU stand-in caps the child's address space. :func:`explain` reads your own RESOURCE_EXHAUSTED
while its arrays are still alive (the IPython extension, ``%load_ext helpers``, calls it when a
cell fails). Will a file fit before you load it:
:func:`helpers.preflight.preflight`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from helpers import devices, gpu
from helpers._internal import child, jaxcompat
from helpers._internal.child import Reply
from helpers._internal.jaxcompat import MIN_MEM_FRACTION, device_name
from helpers._internal.records import Display, Record
from helpers.datasets import read_header, write_tokens
from helpers.errors import (
    BadInputError,
    ChildProcessFailed,
    FileError,
    NoGpuError,
    PathError,
    SizeError,
)
from helpers.holders import Holders
from helpers.units import NOT_AVAILABLE, NotAvailable, format_bytes, parse_size

__all__ = ["CappedCell", "LibraryFailure", "OomReport", "Reproduction", "explain",
           "explain_library_failure", "is_library_failure", "is_out_of_memory", "reproduce",
           "run_cells_capped"]


# --- reproduction in a child process ------------------------------------------------------
@dataclass(frozen=True)
class Reproduction(Display):
    """The story's load run in a memory-capped child: what ran, under which cap, where the data
    landed or the error it raised (a stand-in is labelled ``stand_in``)."""

    attempt: str  # the code the child ran
    fixed: bool  # True for the run with the default_device fix
    stand_in: bool  # True: CPU stand-in (memory-capped child), not a real GPU
    platform: str  # "gpu" or "cpu (stand-in)"
    device: str  # where the data was going, e.g. "cuda:0" or "cpu:0"
    landed_on: str | None  # where it landed, if it loaded
    budget_bytes: int | None  # the cap the child ran under
    budget_how: str  # how the cap was applied
    requested_bytes: int  # size of the tensor the load needed
    ok: bool
    error_type: str | None  # e.g. "jax.errors.JaxRuntimeError"
    error_message: str | None
    accelerator_bytes_added: int | NotAvailable  # on the accelerator, after - before
    elapsed_s: float
    exit_code: int


# The memory-fraction variable the kit sets. jaxlib reads the documented XLA_CLIENT_MEM_FRACTION
# and still honours the older XLA_PYTHON_CLIENT_MEM_FRACTION (jaxlib/xla_client.py,
# generate_pjrt_gpu_plugin_options); setting both is an error, so the kit sets only this one.
_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"


def _gpu_mode_available() -> bool:
    """True when the GPU path can run, decided without starting JAX's GPU backend here
    (which would preallocate 75% of the card for this process) unless JAX already runs."""
    jax = sys.modules.get("jax")
    if jax is not None and jaxcompat.backends_started():
        return jax.default_backend() == "gpu"
    return gpu.why_unavailable() is None


def _cap_for(mode: str, requested: int, budget: str | int | None, total: int | None
             ) -> int | None:
    """The cap for the load (default: half of it), after checking the machine can run it.
    ``total``: the GPU's memory in gpu mode."""
    if mode == "gpu":
        cap = parse_size(budget) if budget is not None else (requested // 2 if total else None)
        if total and cap and cap >= total:
            raise BadInputError(f"budget {format_bytes(cap)} is larger than the GPU "
                             f"({format_bytes(total)}); pick one below it")
        return cap
    import psutil

    cap = parse_size(budget) if budget is not None else requested // 2
    machine = psutil.virtual_memory()
    if budget is not None and cap >= machine.total:
        raise BadInputError(f"budget {format_bytes(cap)} is larger than this machine's memory "
                         f"({format_bytes(machine.total)}); pick one below it")
    if 3 * requested + cap > machine.available:
        raise BadInputError(f"the stand-in needs about {format_bytes(3 * requested + cap)} "
                         f"free to reproduce a {format_bytes(requested)} load and "
                         f"{format_bytes(machine.available)} is available; use a smaller "
                         "--size (256MiB shows the same error)")
    return cap


def reproduce(path: str | os.PathLike | None = None, *, size: str | int = "256 MiB",
              fixed: bool = False, mode: str = "auto", budget: str | int | None = None,
              timeout: float = 300, workdir: str | os.PathLike | None = None) -> Reproduction:
    """Run ``safetensors.flax.load_file(path)["tokens"]`` in a child process under a memory
    cap, so the caller survives the OOM. With ``fixed=True`` the child wraps the load in
    ``with jax.default_device(<host device>):``.

    mode "auto": the real GPU when JAX here has one, else the CPU stand-in. "gpu": cap the
    child's GPU pool with the memory-fraction variable so the file does not fit. "cpu": the
    stand-in: the child (two simulated CPU devices; cpu:0 plays the accelerator) caps its own
    address space with ``resource.setrlimit`` so that JAX's device copy, and not the file read,
    is what fails; the fix run loads onto cpu:1 (host memory is not what the cap models).

    path: an existing token file; when None, one of ``size`` is written in ``workdir`` (a
    temporary folder by default) and reused.
    """
    if mode not in ("auto", "gpu", "cpu"):
        raise BadInputError(f"mode must be 'auto', 'gpu' or 'cpu', got {mode!r}")
    if mode == "auto":
        mode = "gpu" if _gpu_mode_available() else "cpu"
    elif mode == "gpu" and not _gpu_mode_available():
        gpu.require("reproduce-oom --mode gpu")  # raises NoGpuError: reason and fix
    total = gpu.total_bytes() if mode == "gpu" else None  # asked once, from the driver
    if path is None:
        n = parse_size(size) // 2
        requested = 2 * n
        _cap_for(mode, requested, budget, total)  # before writing a file that cannot be used
        folder = Path(workdir or tempfile.gettempdir()) / "jax-device-kit"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise PathError(f"cannot create {folder} for the token file: "
                            f"{err.strerror or err}; pass workdir= a writable folder") from None
        path = folder / f"tokens-{n}.safetensors"
        if not path.exists():
            write_tokens(path, n, progress=False)
    header, _ = read_header(path)  # validates the file, reads no data
    if "tokens" not in header:
        raise FileError(path, "has no tensor named 'tokens'",
                        "the reproduction loads the story's `tokens` tensor")
    start, end = header["tokens"]["data_offsets"]
    requested = end - start
    cap = _cap_for(mode, requested, budget, total)
    env = child.child_env({"PYTHONUNBUFFERED": "1"},
                          drop=("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"))
    child_budget = 0
    if mode == "gpu":
        fraction = max(MIN_MEM_FRACTION, min(0.9, cap / total)) if (total and cap) else 0.05
        if total and fraction * total >= requested:
            raise BadInputError(
                f"a {format_bytes(requested)} file fits in the smallest pool the kit sets on this "
                f"GPU ({MIN_MEM_FRACTION:.1%} of {format_bytes(total)}), so it cannot run out of "
                f"memory: use a file of at least {format_bytes(4 * MIN_MEM_FRACTION * total)} "
                "(--size)")
        var = _FRACTION_VAR
        env[var] = f"{fraction:.4f}"
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)  # default: preallocate the capped pool
        how = f"{var}={fraction:.4f} of {format_bytes(total)}"
        budget_bytes = int(fraction * total) if total else None
    else:
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = "2"
        child_budget = cap
        if fixed:
            how = ("stand-in: host memory not capped (the cap models the accelerator's "
                   "memory; the fix puts the data in host memory)")
            budget_bytes = None
        else:
            how = ("stand-in: RLIMIT_AS = address space after start-up + the file's read "
                   f"(2 x {format_bytes(requested)}) + {format_bytes(cap)} for the device copy")
            budget_bytes = cap
    t0 = time.perf_counter()
    result = child.run(f"{__name__}:_load_in_child",
                       _LoadRequest(str(path), mode, fixed, child_budget), env=env,
                       timeout=timeout)
    elapsed = time.perf_counter() - t0
    try:
        got = result.answer(_LoadAnswer, "the capped load")
    except ChildProcessFailed as err:  # died without an answer: that is the result
        got = _LoadAnswer(ok=False, device="?", attempt="?", error_type="ChildProcessFailed",
                          error_message=" | ".join(str(err).splitlines())[:500])
    return Reproduction(
        attempt=got.attempt, fixed=fixed, stand_in=(mode == "cpu"),
        platform="gpu" if mode == "gpu" else "cpu (stand-in)", device=got.device,
        landed_on=got.landed_on, budget_bytes=budget_bytes, budget_how=how,
        requested_bytes=requested, ok=got.ok, error_type=got.error_type,
        error_message=got.error_message, accelerator_bytes_added=got.accelerator_bytes_added,
        elapsed_s=elapsed, exit_code=result.returncode,
    )


# --- the child: the load itself, under the cap ------------------------------------------------
@dataclass(frozen=True)
class _LoadRequest(Record):
    path: str
    mode: str  # "gpu" or "cpu" (the stand-in)
    fixed: bool
    budget: int  # the stand-in's room for JAX's device copy


@dataclass(frozen=True)
class _LoadAnswer(Record):
    ok: bool
    device: str
    attempt: str
    landed_on: str | None = None
    accelerator_bytes_added: int | NotAvailable = NOT_AVAILABLE
    error_type: str | None = None
    error_message: str | None = None


def _vm_size() -> int:
    import psutil

    return int(psutil.Process().memory_info().vms)  # VmSize: the address space RLIMIT_AS caps


def _load_in_child(request: _LoadRequest) -> Reply:
    """In the child of :func:`reproduce`: the story's load, under the cap. Every failure is
    reported as data (never a hang); exit code 3 when the load failed."""
    a = request
    device, attempt = "?", "?"
    try:
        import jax
        from safetensors.flax import load_file

        from helpers import memory

        def in_use(d) -> int:
            return memory.snapshot([d]).devices[0].bytes_in_use

        if a.mode == "gpu" and jax.default_backend() != "gpu":  # never a false "real GPU" label
            raise NoGpuError(f"JAX started on {jax.default_backend()!r}, not on a GPU; "
                             "the GPU run cannot happen here")
        accelerator = jax.devices()[0]  # the default device: GPU, or cpu:0 in the stand-in
        host = jax.devices("cpu")[0] if a.mode == "gpu" else jax.devices("cpu")[1]
        device = device_name(host if a.fixed else accelerator)
        jax.numpy.zeros(1).block_until_ready()  # start the backend and its threads first
        before = in_use(accelerator)
        name = os.path.basename(a.path)
        attempt = (f"with jax.default_device({host!r}): load_file({name!r})['tokens']"
                   if a.fixed else f"load_file({name!r})['tokens']")
        if a.mode == "cpu" and not a.fixed:
            # Stand-in for a small accelerator: room for safetensors' read (the file map and
            # a NumPy copy, 2 x file) plus `budget` bytes; JAX's device copy needs the file
            # size again, so it is JAX's allocation that fails.
            cap = _vm_size() + 2 * os.path.getsize(a.path) + a.budget
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if a.fixed:
            with jax.default_device(host):
                tokens = load_file(a.path)["tokens"]
        else:
            tokens = load_file(a.path)["tokens"]
        tokens.block_until_ready()
        return Reply(_LoadAnswer(
            ok=True, device=device, attempt=attempt,
            landed_on=", ".join(device_name(d) for d in tokens.devices()),
            accelerator_bytes_added=in_use(accelerator) - before))
    except BaseException as err:  # report every failure as data; never a hang
        if not isinstance(err, Exception):
            traceback.print_exc()
        message = str(err).strip().splitlines()[0][:500] if str(err) else ""
        return Reply(_LoadAnswer(ok=False, device=device, attempt=attempt,
                                 error_type=f"{type(err).__module__}.{type(err).__name__}",
                                 error_message=message), exit_code=3)


# --- your own OOM, explained ----------------------------------------------------------------
_REQUEST = (re.compile(r"allocat\w*\s+(\d+)\s*bytes", re.I), re.compile(r"\((\d+)B\)"),
            # a GPU's BFC allocator, in tsl's human-readable form (rounded to 2 decimals):
            # "Out of memory while trying to allocate 512.00MiB with allocator GPU_0_bfc"
            re.compile(r"allocate\s+(\d+(?:\.\d+)?(?:[KMGT]i)?B)\b"))
_PROGRAM = re.compile(r"executable_name='([^']+)'")  # the compiled program that asked (jax 0.11)


@dataclass(frozen=True)
class OomReport(Display):
    """A RESOURCE_EXHAUSTED error explained: what was asked, what the pool had, what holds the
    memory and where it was made, another process on the card, and the likely fixes, ranked."""

    error: str  # the error's first line
    device: str
    requested_bytes: int | NotAvailable  # parsed from the error's text
    limit_bytes: int | NotAvailable  # the allocator's pool cap (memory_stats); on the CPU
    #: stand-in, the room its address-space cap leaves
    in_use_bytes: int | NotAvailable
    largest_free_block_bytes: int | NotAvailable
    other_processes_bytes: int | NotAvailable  # what the driver says others hold on the card
    held: Holders  # the largest live arrays and what keeps each alive
    made_at: tuple[str, ...]  # the largest buffers and the line that made each (device profile)
    fixes: tuple[str, ...]  # most likely first
    stand_in: bool  # the CPU backend: no pool, so the numbers are the stand-in's
    #: the compiled program whose run asked, where the error names it (``executable_name``;
    #: "" where it does not): the traceback's line may be a later one that waited for a result
    program: str = ""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is XLA's out-of-memory error (RESOURCE_EXHAUSTED)."""
    return "RESOURCE_EXHAUSTED" in str(error)


def explain(error: BaseException, *, namespace: Mapping | None = None) -> OomReport:
    """Why this RESOURCE_EXHAUSTED happened, read while the arrays are still alive: the request
    (from the error), the pool (``memory_stats``), who holds the largest arrays
    (:func:`helpers.holders.largest`), where the largest buffers were made
    (``jax.profiler.device_memory_profile``), other processes on the card, ranked fixes.
    BadInputError for an error that is not RESOURCE_EXHAUSTED, with where to look instead.

    >>> report = explain(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 64 bytes."))
    >>> report.requested_bytes
    64
    """
    import jax

    from helpers import holders, memory, memory_profile

    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if not is_out_of_memory(error):
        raise BadInputError(
            f"not an out-of-memory error (no RESOURCE_EXHAUSTED in it): {first[:200]}. "
            + ("oom.explain_library_failure(error) explains a CUDA library that could not "
               "start" if is_library_failure(error) else
               "For 'incompatible devices', devices.tree_placement(arguments) names the leaves "
               "on other devices" if "incompatible devices" in text else
               "A sharding error: " + fix if (fix := devices.sharding_error_fix(text)) else
               "oom.explain reads RESOURCE_EXHAUSTED errors only"))
    requested: int | NotAvailable = NOT_AVAILABLE
    for pattern in _REQUEST:
        m = pattern.search(text)
        if m:
            try:
                requested = parse_size(m.group(1))
            except SizeError:  # a size the kit does not read: the request stays unknown
                pass
            break
    named = _PROGRAM.search(text)
    dev = jax.devices()[0]
    stats = memory.memory_stats(dev) or {}

    def stat(key: str) -> int | NotAvailable:
        return int(stats[key]) if key in stats else NOT_AVAILABLE

    held = holders.largest(5, namespace=namespace)
    limit, in_use = stat("bytes_limit"), stat("bytes_in_use")
    room = _stand_in_room() if dev.platform == "cpu" else NOT_AVAILABLE
    if isinstance(room, int):  # the stand-in: its cap plays the pool; live arrays are in use
        in_use = held.live_bytes
        limit = room + in_use
    try:
        top = memory_profile.top_entries(jax.profiler.device_memory_profile(), 3)
        made = tuple(f"{format_bytes(e.bytes)} on {e.device}: {e.where()}" for e in top
                     if e.bytes * 1000 >= top[0].bytes)
    except Exception:  # a backend without a memory profile
        made = ()
    others = _other_processes(dev)
    report = OomReport(first, device_name(dev), requested, limit, in_use,
                       stat("largest_free_block_bytes"), others, held, made, (),
                       dev.platform == "cpu", named.group(1) if named else "")
    return dataclasses.replace(report, fixes=_fixes(report))


def _stand_in_room() -> int | NotAvailable:
    """On the CPU stand-in, the room the address-space cap (RLIMIT_AS) leaves this process:
    what plays the GPU's pool limit. NOT_AVAILABLE without a cap."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return NOT_AVAILABLE
    return max(0, soft - _vm_size())


def _other_processes(dev) -> int | NotAvailable:
    if dev.platform != "gpu":
        return NOT_AVAILABLE
    total = gpu.device_used_bytes()
    mine = gpu.process_used_bytes(os.getpid())
    if total is None or mine is None:
        return NOT_AVAILABLE
    return max(total - mine, 0)


def _fixes(r: OomReport) -> tuple[str, ...]:
    """The likely fixes, most likely first, each with its numbers."""
    fixes = []
    req, limit, used = r.requested_bytes, r.limit_bytes, r.in_use_bytes
    if isinstance(req, int) and isinstance(limit, int) and req > limit:
        head = (f"The request alone ({format_bytes(req)}) is larger than all the room there "
                f"is ({format_bytes(limit)}), so freeing arrays cannot help: ")
        if r.device.startswith(("cuda", "rocm", "gpu")):
            fixes.append(head + "keep the data in host memory (with "
                         "jax.default_device(jax.devices('cpu')[0]): or a NumPy memmap) and "
                         "move it in batches, make the batch smaller "
                         "(helpers.preflight.preflight_step sizes it before it runs), or raise "
                         "XLA_CLIENT_MEM_FRACTION before JAX starts.")
        else:  # on the CPU the room is the process's memory: no pool, no fraction
            fixes.append(head + "make the batch smaller (helpers.preflight.preflight_step "
                         "sizes it before it runs), or keep the data in a NumPy memmap and "
                         "compute on it in batches.")
    too_big = bool(fixes)
    kept = r.held.user_bytes + r.held.history_bytes
    if kept and not too_big:
        names = [a.held_by[0] for a in r.held.arrays if a.held_by][:3]
        who = ("Your code holds" if not r.held.history_bytes else "IPython holds"
               if not r.held.user_bytes else "Your code and IPython hold")
        fixes.append(f"{who} {format_bytes(kept)} in the largest arrays "
                     f"({'; '.join(names)}): let go of what you no longer need (the list "
                     "above says how for each).")
    free_in_all = limit - used if isinstance(limit, int) and isinstance(used, int) else None
    block = r.largest_free_block_bytes
    if (isinstance(req, int) and isinstance(free_in_all, int) and isinstance(block, int)
            and block < req <= free_in_all):
        fixes.append(f"{format_bytes(free_in_all)} are free in all but the largest free block "
                     f"is {format_bytes(block)}: the pool is fragmented. Allocate the large "
                     "arrays first, or try XLA_PYTHON_CLIENT_ALLOCATOR=platform.")
    if isinstance(r.other_processes_bytes, int) and r.other_processes_bytes > 0:
        fixes.append(f"Other processes hold {format_bytes(r.other_processes_bytes)} on this "
                     "card: each JAX process takes 75% at its first allocation unless "
                     "XLA_PYTHON_CLIENT_PREALLOCATE=false (set it in every one of them).")
    fixes.append("In a training step: donate the arguments the step replaces "
                 "(jax.jit(step, donate_argnums=...)), and wrap the largest activations in "
                 "jax.checkpoint; helpers.preflight.preflight_step shows where its memory goes.")
    return tuple(fixes)


# --- a cell that runs out of memory, in a capped child with the extension loaded ---------------
# --- a CUDA library that could not start -------------------------------------------------
#: what a CUDA library that could not start says (cuDNN, cuBLAS, cuSOLVER, cuFFT), and the
#: driver refusing memory outside JAX's pool: most often too little of the card was left
#: outside the pools, else a copy of the library other than jaxlib's was loaded first (JAX's
#: FAQ, "Why do some CUDA libraries fail to load/initialize?"; jax#17217, jax#7118, flax#445)
_LIBRARY_FAILURE = re.compile(
    r"(?P<cuDNN>DNN library initialization failed|Could not create cudnn handle|"
    r"CUDNN_STATUS_(?:NOT_INITIALIZED|INTERNAL_ERROR|ALLOC_FAILED))|"
    r"(?P<cuBLAS>CUBLAS_STATUS_(?:NOT_INITIALIZED|ALLOC_FAILED)|failed to create cublas handle)|"
    r"(?P<cuSOLVER>CUSOLVER_STATUS_(?:NOT_INITIALIZED|ALLOC_FAILED))|(?P<cuFFT>CUFFT_ALLOC_FAILED)|"
    r"(?P<CUDA>cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY)|"
    r"(?P<backend>no supported devices found for platform CUDA)")
#: the name each group of _LIBRARY_FAILURE is told by, where it is not the group's own. JAX's
#: CUDA backend: on the H100 (2026-11-27 record, the gpu tests) a third JAX process beside two
#: that held their pools could not create its CUDA context (the driver's log:
#: "Failed to create stream executor for device CUDA:0: CUDA_ERROR_OUT_OF_MEMORY"), and JAX
#: raised only "Unable to initialize backend 'cuda': INTERNAL: no supported devices found for
#: platform CUDA", which names no memory
_LIBRARY_NAMES = {"backend": "JAX's CUDA backend"}
#: the CUDA libraries whose loaded copies the explanation lists, by file name
_CUDA_LIBRARY_FILE = re.compile(r"^lib(cudnn|cublas|cublasLt|cusolver|cufft|cusparse|cudart|nccl)"
                                r"(?:_\w+)?\.so[.\d]*$")
#: a card with this share of its memory free when asked: memory may not be the cause
_ROOMY = 0.25


@dataclass(frozen=True)
class LibraryFailure(Display):
    """A CUDA library that could not start, explained: the card's memory outside JAX's pool and
    who holds it (other processes, TensorFlow or PyTorch in this one), the copies of the CUDA
    libraries this process loaded, and the likely fixes, ranked. The numbers are read when
    asked, after the failure."""

    error: str  # the error's first line
    #: "cuDNN", "cuBLAS", "cuSOLVER", "cuFFT", "CUDA" (the driver's memory) or "JAX's CUDA
    #: backend" (no CUDA device could be started at all)
    library: str
    device: str  # "" where JAX could not say, or its first device is not a GPU
    total_bytes: int | NotAvailable  # the card's, by the driver
    free_bytes: int | NotAvailable  # free on the card when asked, by the driver
    pool_bytes: int | NotAvailable  # JAX's pool on it (its allocator's bytes_limit)
    other_processes_bytes: int | NotAvailable
    #: (what, fix) for each other GPU framework in this process (settings' rules)
    beside: tuple[tuple[str, str], ...]
    loaded: tuple[str, ...]  # "cudnn: <folder>" for each CUDA library folder loaded
    fixes: tuple[str, ...]  # most likely first


def is_library_failure(error: BaseException) -> bool:
    """Whether ``error`` says a CUDA library could not start (cuDNN's "DNN library
    initialization failed", cuBLAS's CUBLAS_STATUS_NOT_INITIALIZED...) or the driver refused
    memory outside JAX's pool; an out-of-memory error of the pool itself is not one."""
    return not is_out_of_memory(error) and bool(_LIBRARY_FAILURE.search(str(error)))


def _loaded_cuda_libraries(maps: str = "/proc/self/maps") -> tuple[str, ...]:
    """Each CUDA library this process has loaded, with the folder its file came from, from
    the kernel's list of the process's mapped files (Linux; () elsewhere)."""
    try:
        text = Path(maps).read_text(errors="surrogateescape")  # (a path need not be UTF-8)
    except OSError:
        return ()
    found = set()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path
        path = fields[5].strip() if len(fields) == 6 else ""
        m = _CUDA_LIBRARY_FILE.match(os.path.basename(path))
        if m:
            found.add(f"{m.group(1)}: {os.path.dirname(path)}")
    return tuple(sorted(found))


def explain_library_failure(error: BaseException, *,
                            maps: str = "/proc/self/maps") -> LibraryFailure:
    """Why a CUDA library could not start: the card's memory now (the driver's numbers),
    JAX's pool, other processes and other GPU frameworks in this one
    (:func:`helpers.settings.check_process`'s rules), and where this process loaded its CUDA
    libraries from; ranked fixes. Reads; changes nothing. JAX's CUDA backend that could not
    start on a full card ("no supported devices found for platform CUDA") was met and named on
    the H100 (2026-11-27 record); the libraries' own failures are written from JAX's FAQ and
    the threads named in ``docs/user-reports.md``, not yet met on a GPU.

    >>> r = explain_library_failure(RuntimeError("DNN library initialization failed"))
    >>> r.library
    'cuDNN'
    """
    from helpers import memory, settings

    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    m = _LIBRARY_FAILURE.search(text)
    library = _LIBRARY_NAMES.get(m.lastgroup, m.lastgroup) if m else "CUDA"
    backend = m is not None and m.lastgroup == "backend"
    dev = None
    if not backend:  # (JAX's backends start once a process: asking again starts none)
        try:
            import jax

            dev = jax.devices()[0]
        except Exception:  # the backend itself may not have started
            pass
    on_gpu = dev is not None and dev.platform == "gpu"
    # no CUDA backend: the driver's numbers (nvidia-smi) are all there is, and every byte in
    # use on the card is another process's (this one has no context there)
    total = gpu.total_bytes() if on_gpu or backend else None
    used = gpu.device_used_bytes() if on_gpu or backend else None
    stats = (memory.memory_stats(dev) or {}) if on_gpu else {}
    pool = int(stats["bytes_limit"]) if "bytes_limit" in stats else NOT_AVAILABLE
    beside = tuple((w.message, f"{w.fix}.") for w in settings.check_environment()
                   if w.code in ("tensorflow-sees-the-gpu", "pytorch-holds-the-gpu"))
    others = (_other_processes(dev) if dev is not None else
              used if backend and used is not None else NOT_AVAILABLE)
    report = LibraryFailure(
        first, library, device_name(dev) if on_gpu else "",
        total if total else NOT_AVAILABLE,
        total - used if total and used is not None and used <= total else NOT_AVAILABLE,
        pool, others, beside, _loaded_cuda_libraries(maps), ())
    return dataclasses.replace(report, fixes=_library_fixes(report))


def _library_fixes(r: LibraryFailure) -> tuple[str, ...]:
    """The likely fixes for a library that could not start, most likely first."""
    if r.library == _LIBRARY_NAMES["backend"]:
        return _backend_fixes(r)
    room = [fix for _, fix in r.beside]
    if isinstance(r.other_processes_bytes, int) and r.other_processes_bytes > 0:
        room.append(f"Other processes hold {format_bytes(r.other_processes_bytes)} on this card: "
                    "give each JAX process a share (XLA_CLIENT_MEM_FRACTION) or "
                    "XLA_PYTHON_CLIENT_PREALLOCATE=false in every one of them.")
    pool = (f" (JAX's pool is {format_bytes(r.pool_bytes)} of the card's "
            f"{format_bytes(r.total_bytes)})" if isinstance(r.pool_bytes, int)
            and isinstance(r.total_bytes, int) else "")
    room.append(f"Leave {r.library} room outside JAX's pool{pool}: set "
                "XLA_CLIENT_MEM_FRACTION lower (0.6, say) or XLA_PYTHON_CLIENT_PREALLOCATE=false "
                "before JAX starts (restart the kernel; JAX's FAQ, \"Why do some CUDA libraries "
                "fail to load/initialize?\").")
    twice = sorted({line.split(":", 1)[0] for line in r.loaded
                    if sum(x.split(":", 1)[0] == line.split(":", 1)[0] for x in r.loaded) > 1})
    log = ("the start fails the same way, and JAX's log (stderr) says \"Loaded runtime ... but "
           "source was compiled with ...\"")
    agree = ("install versions that agree (reinstall JAX with the CUDA extra you use, e.g. "
             "pip install -U \"jax[cuda12]\")")
    if twice:
        version = (f"This process loaded {', '.join(twice)} from more than one folder (listed "
                   f"above): if the copy in use is not the version jaxlib was built for, {log}. "
                   "Import JAX before the package that brought the other copy (PyTorch, "
                   f"TensorFlow), or {agree}.")
    else:
        where = " (its folder is listed above)" if r.loaded else ""
        version = (f"If the {r.library} library this process loaded{where} is not the version "
                   f"jaxlib was built for, {log}: {agree}, and import JAX before a package "
                   "that brings its own copy (PyTorch, TensorFlow).")
    roomy = (isinstance(r.free_bytes, int) and isinstance(r.total_bytes, int)
             and r.free_bytes >= _ROOMY * r.total_bytes and not r.beside)
    if roomy:  # memory was there when asked: the library's copy comes first
        return (f"{format_bytes(r.free_bytes)} of the card's {format_bytes(r.total_bytes)} is "
                "free, so memory may not be the cause. " + version, *room)
    return (*room, version)


def _backend_fixes(r: LibraryFailure) -> tuple[str, ...]:
    """JAX's CUDA backend did not start: a card other processes have filled first, where the
    driver says so; else what ``doctor`` reads (driver, plugin, CUDA_VISIBLE_DEVICES)."""
    again = ("Then restart the kernel or process: JAX starts its backends once per process "
             "(jax/_src/xla_bridge.py), and one that failed is not tried again.")
    doctor = ("`python -m helpers doctor` says why JAX sees no GPU here: no driver, a CUDA "
              "plugin that does not match it, or CUDA_VISIBLE_DEVICES.")
    full = (isinstance(r.free_bytes, int) and isinstance(r.total_bytes, int)
            and r.free_bytes < _ROOMY * r.total_bytes)
    if not full:
        known = (f"{format_bytes(r.free_bytes)} of the card's {format_bytes(r.total_bytes)} is "
                 "free, so memory is not the cause: " if isinstance(r.free_bytes, int) else
                 "The driver gave no numbers here: ")
        return (known + doctor + " " + again,
                "If another process filled the card since: JAX's log (stderr) then says "
                "\"Failed to create stream executor ... CUDA_ERROR_OUT_OF_MEMORY\" just above "
                "the error.")
    held = format_bytes(r.other_processes_bytes) if isinstance(r.other_processes_bytes, int) \
        else "most of it"
    return (f"Other processes hold {held} of the card's {format_bytes(r.total_bytes)} "
            f"({format_bytes(r.free_bytes)} free), too little for JAX even to create its CUDA "
            "context (JAX's log, stderr, says \"Failed to create stream executor ... "
            "CUDA_ERROR_OUT_OF_MEMORY\" just above the error). Each JAX process takes 75% of "
            "the card at its start: set XLA_PYTHON_CLIENT_PREALLOCATE=false, or a share with "
            "XLA_CLIENT_MEM_FRACTION, in every process that shares the card, or stop the one "
            "that holds it (nvidia-smi lists them). " + again, doctor)


@dataclass(frozen=True)
class CappedCell(Display):
    """What an IPython shell with ``%load_ext helpers`` printed when it ran cells under a
    memory cap in a child process (a labelled stand-in on the CPU)."""

    cells: tuple[str, ...]
    output: str  # everything the shell printed: tracebacks and the kit's explanations
    failed: tuple[bool, ...]  # per cell: did it raise
    stand_in: bool
    cap: str  # how the cap was applied


@dataclass(frozen=True)
class _CellsRequest(Record):
    cells: tuple[str, ...]
    cap_bytes: int  # CPU stand-in: room above the child's address space after start-up
    mode: str  # "gpu" or "cpu"


@dataclass(frozen=True)
class _CellsAnswer(Record):
    output: str
    failed: tuple[bool, ...]


def run_cells_capped(*cells: str, budget: str | int = "1 GiB", timeout: float = 300
                     ) -> CappedCell:
    """Run ``cells`` in a fresh IPython shell (``%load_ext helpers`` loaded) in a child
    process whose memory is capped, and return what it printed: a real RESOURCE_EXHAUSTED and
    the kit's explanation of it, while this kernel stays safe. On a GPU the cap is the pool
    (XLA_CLIENT_MEM_FRACTION about ``budget``, at least 0.5% of the card: a smaller budget is
    refused); without one, a labelled CPU stand-in caps the child's address space ``budget``
    above what it uses once JAX has started."""
    if not cells:
        raise BadInputError("give at least one cell to run")
    cap = parse_size(budget)
    mode = "gpu" if _gpu_mode_available() else "cpu"
    env = child.child_env({"PYTHONUNBUFFERED": "1"},
                          drop=("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"))
    if mode == "gpu":
        total = gpu.total_bytes() or cap * 4
        if cap < MIN_MEM_FRACTION * total:  # raised quietly, the cells would not run out of memory
            raise BadInputError(
                f"a budget of {format_bytes(cap)} is below the smallest pool the kit sets on this "
                f"GPU ({MIN_MEM_FRACTION:.1%} of {format_bytes(total)}, "
                f"{format_bytes(MIN_MEM_FRACTION * total)}; JAX's own start-up needs room in "
                "the pool): ask for at least that, and size the cells' arrays to it")
        fraction = min(0.9, cap / total)
        env["XLA_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
        how = (f"XLA_CLIENT_MEM_FRACTION={env['XLA_CLIENT_MEM_FRACTION']} of "
               f"{format_bytes(total)}, about {format_bytes(fraction * total)}")
    else:
        env["JAX_PLATFORMS"] = "cpu"
        how = (f"stand-in: RLIMIT_AS = the child's address space after start-up + "
               f"{format_bytes(cap)}")
    result = child.run(f"{__name__}:_cells_child", _CellsRequest(tuple(cells), cap, mode),
                       env=env, timeout=timeout)
    got = result.answer(_CellsAnswer, "the capped IPython shell")
    return CappedCell(tuple(cells), got.output, got.failed, mode == "cpu", how)


def _cells_child(request: _CellsRequest) -> _CellsAnswer:
    """In the child of :func:`run_cells_capped`: an IPython shell, the extension, the cap."""
    import contextlib
    import io

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")
    out = io.StringIO()
    failed = []
    with contextlib.redirect_stdout(out):
        shell.run_line_magic("xmode", "minimal")  # the error itself, not JAX's frames
        shell.run_cell("import jax, jax.numpy as jnp\njnp.zeros(1).block_until_ready();",
                       store_history=True)
        shell.run_line_magic("load_ext", "helpers")
        if request.mode == "cpu":
            cap = _vm_size() + request.cap_bytes
            resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
        for cell in request.cells:
            failed.append(not shell.run_cell(cell, store_history=True).success)
    text = out.getvalue().replace("Exception reporting mode: Minimal\n", "")
    return _CellsAnswer(text, tuple(failed))
