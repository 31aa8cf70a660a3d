"""A step's peak memory, measured while it runs: the other column of the truth table beside
:func:`helpers.preflight.preflight_step`'s prediction.

- On a GPU the allocator keeps a high-water mark (``peak_bytes_in_use``), so no peak between two
  samples is lost. It is the process's mark since the backend started, and JAX cannot reset it:
  a run only shows its peak if it goes above every earlier one. So on a GPU the **first** run is
  measured (a warm-up run would reach the same mark first and hide the measured one), and
  :func:`measure_example` measures in a fresh child process that compiles the step before its
  arguments are placed (compile-time autotuning allocates scratch from the same pool: without
  the arguments beside it, that scratch mostly stays below the run's own peak). Where it still
  goes above (a small step whose matrix products XLA autotunes), a second fresh process loads
  the compiled step from the first one's persistent compilation cache, and is not autotuned.
  Each child takes its pool whole at start, a share of the card's free memory
  (:func:`helpers.gpu.measuring_pool`): a pool grown on demand counts whole chunks as in use,
  and its peak over-counts (on an H100, 364.03 MiB for a 240.03 MiB step).
- On the CPU stand-in the kernel keeps one too: the RSS high-water mark (VmHWM), reset when
  :func:`helpers.memory.track` starts; it sees XLA's temporaries, which live arrays never do.
  The child runs with ``MALLOC_MMAP_THRESHOLD_`` set so that every large buffer is its own
  mapping, given back when freed: RSS then follows the buffers and not the C heap's reuse. It
  runs another step first: a process's first computation takes a further 9-15 MiB once,
  whichever step it is (the runtime's own set-up), and that is not the step's.

The step's peak counts its arguments, as XLA's estimate does: peak - (in use before - the bytes
of the arguments).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from helpers import gpu
from helpers._internal import child
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record
from helpers.compiled import CompiledStep, compile_step
from helpers.errors import BadInputError, ChildProcessFailed
from helpers.preflight import StepPreflight, preflight_step
from helpers.units import NOT_AVAILABLE, NotAvailable

if TYPE_CHECKING:
    import jax

__all__ = ["ALLOCATOR_PEAK", "HOST_PEAK", "MMAP_ENV", "StepMeasurement", "compilation_cache_env",
           "measure_example", "measure_step"]


ALLOCATOR_PEAK = "allocator: peak_bytes_in_use"
HOST_PEAK = "host RSS high-water mark (CPU stand-in)"
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # glibc: each buffer >= 64 KiB is an mmap
_CACHE_HIT = "/jax/compilation_cache/cache_hits"  # jax.monitoring's event per loaded executable


@dataclass(frozen=True)
class StepMeasurement(Display):
    """A step's peak memory, measured while it ran (allocator peak, or the host RSS
    high-water mark on the CPU stand-in)."""

    function: str
    device: str
    argument_bytes: int  # the arguments, already on the device before the run
    #: the step's peak, arguments included: the larger run's. On the CPU stand-in a first run
    #: that is also the process's first computation carries the runtime's once-per-process
    #: set-up (9-15 MiB; measure_example pays it beforehand)
    peak_bytes: int | NotAvailable
    source: str  # ALLOCATOR_PEAK or HOST_PEAK
    seconds: float  # the measured later run (the first run on a GPU)
    note: str
    first_run_peak_bytes: int | NotAvailable = NOT_AVAILABLE  # the first run's own peak
    later_run_peak_bytes: int | NotAvailable = NOT_AVAILABLE  # a later run's (CPU stand-in)


def _allocator(dev) -> dict | None:
    from helpers.memory import memory_stats

    stats = memory_stats(dev)
    return stats if stats and "peak_bytes_in_use" in stats else None


def measure_step(fn: Callable, *args, device: str | jax.Device | None = None,
                 donate_argnums: int | Sequence[int] = (),
                 static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (),
                 donate_argnames: str | Sequence[str] = (), **kwargs) -> StepMeasurement:
    """Run ``fn(*args, **kwargs)``, compiled as :func:`preflight_step` compiles it, and measure
    its peak on the device: the allocator's peak on a GPU (the first run, measured alone: a
    warm-up would reach the same high-water mark and hide it), the host RSS high-water mark on
    the CPU stand-in (the first run and a later one, each its own mark: ``peak_bytes`` is the
    larger). Every output is waited for, the updated state of a step that returns nothing
    (``nnx.jit``) included."""
    import jax

    c = compile_step(fn, *args, device=device, donate_argnums=donate_argnums,
                     static_argnums=static_argnums, static_argnames=static_argnames,
                     donate_argnames=donate_argnames, over_mesh=False, **kwargs)
    dev = c.device
    name = c.function
    dyn = c.dynamic(args, kwargs)  # the executable takes the non-static arguments only

    def placed():  # fresh copies each run: a donated argument is used up by the run
        out = jax.device_put(dyn, dev, may_alias=False)
        return jax.block_until_ready(out)

    a, k = placed()
    before = _allocator(dev)
    # the first run is measured everywhere: memory it takes once (the runtime's own set-up)
    # is memory the step needs. With an allocator it is the only run measured: its peak counter
    # cannot be reset. The host RSS mark is reset per block, so on the CPU stand-in a later run
    # is measured as well.
    arg_bytes = sum(x.nbytes for x in jax.tree.leaves((a, k)) if isinstance(x, jax.Array))
    first, seconds = _run_measured(c, a, k, dev, arg_bytes)
    after = _allocator(dev)
    later: int | NotAvailable = NOT_AVAILABLE
    if before is not None and after is not None:
        source = ALLOCATOR_PEAK
        if after["peak_bytes_in_use"] > before["peak_bytes_in_use"]:
            peak, note = (after["peak_bytes_in_use"] - before["bytes_in_use"] + arg_bytes, "")
        else:
            peak, note = NOT_AVAILABLE, (
                "hidden: this process reached a higher peak earlier (an earlier step, or "
                "compile-time autotuning) and the allocator's peak only rises; measure in a "
                "fresh process (measure_example)")
        first = peak
    else:
        source = HOST_PEAK
        a, k = placed()
        later, seconds = _run_measured(c, a, k, dev, arg_bytes)
        if later is NOT_AVAILABLE or first is NOT_AVAILABLE:
            peak, note = NOT_AVAILABLE, "this OS keeps no RSS high-water mark"
        else:
            peak = max(first, later)
            note = ("" if _mmap_threshold_set() else
                    "lower bound: the C heap may reuse freed memory without growing RSS "
                    f"(a fresh process with {MMAP_ENV} is exact: measure_example)")
    return StepMeasurement(name, device_name(dev), arg_bytes, peak, source, seconds, note,
                           first, later)


def _wait_for_run(out, *args) -> None:
    """Wait until a run has finished: its outputs, and its arguments too, since a step that
    returns nothing (nnx.jit) wrote its new state into them (donated ones are skipped)."""
    import jax

    jax.block_until_ready([x for x in jax.tree.leaves((out, args))
                           if not (isinstance(x, jax.Array) and x.is_deleted())])


def _run_measured(c: CompiledStep, a, k, dev, arg_bytes: int
                  ) -> tuple[int | NotAvailable, float]:
    """One run, waited for (every output, the updated state included), under a tracker: the
    host RSS high-water mark over it (NOT_AVAILABLE where the OS keeps none), and seconds."""
    import time

    from helpers.memory import track

    t0 = time.perf_counter()
    with track(interval=0.005, devices=[dev]) as trace:
        _wait_for_run(c.run(a, k), a, k)
    seconds = time.perf_counter() - t0
    if trace.host_peak is NOT_AVAILABLE:
        return NOT_AVAILABLE, seconds
    return trace.host_peak - trace.samples[0].host.rss + arg_bytes, seconds


def _mmap_threshold_set() -> bool:
    import os

    return os.environ.get("MALLOC_MMAP_THRESHOLD_") == MMAP_ENV["MALLOC_MMAP_THRESHOLD_"]


def measure_example(name: str, *, scale: int = 1, donate: bool = False, batch: int | None = None,
                    timeout: float = 300) -> tuple[StepPreflight, StepMeasurement]:
    """Prediction and measurement of one of :data:`helpers.example_steps.EXAMPLES`, in a
    fresh child process (so the allocator's peak and the RSS high-water mark are the step's
    own). ``donate`` donates the first argument; ``batch`` sets mlp_sgd_step's batch size.
    Where a GPU's peak was hidden by compile-time scratch, a second child measures it (see the
    module docstring), so the call can take up to twice ``timeout``."""
    from helpers.example_steps import EXAMPLES

    if name not in EXAMPLES:
        raise BadInputError(f"no example step {name!r}; choose one of {', '.join(EXAMPLES)}")
    if not isinstance(scale, int) or isinstance(scale, bool) or not 1 <= scale <= 16:
        raise BadInputError(f"scale must be an int from 1 to 16, got {scale!r}")
    if batch is not None and (name != "mlp_sgd_step" or not isinstance(batch, int)
                              or isinstance(batch, bool) or batch < 1):
        raise BadInputError(f"batch must be a positive int, and only mlp_sgd_step takes one; "
                            f"got {name!r} with batch={batch!r}")
    request = _ExampleRequest(name, scale, donate, batch)
    with tempfile.TemporaryDirectory(prefix="jax-device-kit-cache-") as cache:
        # on a GPU the child preallocates a share of the free memory, so the allocator's peak
        # counts each buffer exactly (gpu.measuring_pool says why)
        env = child.child_env({**MMAP_ENV, **gpu.measuring_pool(), **compilation_cache_env(cache)})
        first = _measure_in_child(request, env, timeout)
        if not _hidden(first.measurement):
            return first.preflight, first.measurement
        # the allocator's mark was already higher, most often from compile-time autotuning:
        # a second fresh process loads the compiled step from the first one's compilation
        # cache, so nothing is autotuned there and the step's run is the process's peak
        try:
            again = _measure_in_child(request, env, timeout)
        except ChildProcessFailed as err:
            return first.preflight, replace(first.measurement, note=(
                f"{first.measurement.note}. A second process that loaded the compiled step "
                f"from JAX's compilation cache failed too: {err}"))
    if _hidden(again.measurement):
        return first.preflight, replace(first.measurement, note=(
            f"{first.measurement.note}. A second process, which loaded the compiled step from "
            f"JAX's compilation cache ({again.cache_hits} hits), did not see it either"))
    how = (f"which loaded the compiled step from the first one's compilation cache "
           f"({again.cache_hits} hits), so it was not autotuned again" if again.cache_hits else
           "which found nothing in the first one's compilation cache and compiled the step "
           "again; this time the run went above the compile")
    return first.preflight, replace(again.measurement, note=(
        f"measured in a second fresh process, {how}: in the first, compile-time scratch "
        f"(autotuning) had gone above the step's own peak"))


def compilation_cache_env(folder: str) -> dict[str, str]:
    """The environment that gives a child process JAX's persistent compilation cache in
    ``folder``, keeping every executable however quick or small: a second process then loads the
    step instead of compiling (and, on a GPU, autotuning) it again."""
    return {"JAX_COMPILATION_CACHE_DIR": folder,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _hidden(measurement: StepMeasurement) -> bool:
    """The allocator's peak did not rise: an earlier, higher mark hides the step's."""
    return measurement.peak_bytes is NOT_AVAILABLE and measurement.source == ALLOCATOR_PEAK


def _measure_in_child(request: _ExampleRequest, env: dict, timeout: float) -> _ExampleAnswer:
    result = child.run(f"{__name__}:_measure_example_child", request, env=env, timeout=timeout)
    return result.answer(_ExampleAnswer, f"measuring {request.name} in a child process")


@dataclass(frozen=True)
class _ExampleRequest(Record):
    name: str
    scale: int
    donate: bool
    batch: int | None


@dataclass(frozen=True)
class _ExampleAnswer(Record):
    preflight: StepPreflight
    measurement: StepMeasurement
    cache_hits: int = 0  # executables loaded from the persistent compilation cache


def _measure_example_child(request: _ExampleRequest) -> _ExampleAnswer:
    """In the child of :func:`measure_example`: one example step, predicted and measured."""
    import jax
    import jax.monitoring

    from helpers.example_steps import EXAMPLES

    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == _CACHE_HIT else None)
    fn, make_args = EXAMPLES[request.name]
    device = jax.devices()[0]  # the default backend's first device: the GPU when there is one
    host_args = (make_args(request.scale) if request.batch is None
                 else make_args(request.scale, batch=request.batch))
    donated = (0,) if request.donate else ()
    # compiled first, from shapes only: any compile-time scratch comes and goes before the
    # arguments arrive, so it stays under the run's own peak (see the module docstring)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), host_args)
    predicted = preflight_step(fn, *shapes, device=device, donate_argnums=donated)
    args = jax.block_until_ready(jax.device_put(host_args, device))
    if device.platform == "cpu":
        setup = len(hits)
        _pay_process_setup(device)
        del hits[setup:]  # its compile is not the step's: only the step's hits are counted
    measured = measure_step(fn, *args, device=device, donate_argnums=donated)
    return _ExampleAnswer(predicted, measured, len(hits))


def _pay_process_setup(device) -> None:
    """Run another step once (the kit's MLP SGD step at scale 1, about 50 MiB at its peak). A
    process's first computation on the CPU backend takes a further 9-15 MiB, once, whichever
    step it is (the runtime's own set-up, about 5-6 MiB of it jaxlib's code paged in; measured
    by benchmarks/prediction_accuracy.py): paid here, the step measured next shows its own
    first run. Not on a GPU, where the allocator's peak mark would keep this step's peak and
    could hide a smaller one."""
    import jax

    from helpers.example_steps import EXAMPLES

    fn, make_args = EXAMPLES["mlp_sgd_step"]
    jax.block_until_ready(jax.jit(fn)(*jax.device_put(make_args(1), device)))
