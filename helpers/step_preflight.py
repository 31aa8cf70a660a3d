"""Will this step fit? :func:`preflight_step` compiles a function for the device it would run
on, without running it and without moving any argument, and compares XLA's own memory
estimate (``compiled.memory_analysis()``) with what is free there now.

The free budget is computed as :func:`helpers.preflight.preflight` does for files: the
allocator's ``bytes_limit - bytes_in_use`` on a GPU (the pool cap), the host's available
memory on the CPU. What the step needs is XLA's peak minus the argument bytes that already
sit on that device (they are in use already).
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass

from helpers._display import Display
from helpers._jax_internals import device_name
from helpers.errors import BadInputError, MeasurementFailed
from helpers.preflight import _free_bytes, _jax, _target, judge
from helpers.unavailable import NOT_AVAILABLE, NotAvailable, to_json_value

__all__ = ["StepPreflight", "compile_step", "preflight_step"]

_TRACE_ERRORS = ("ConcretizationTypeError", "TracerBoolConversionError",
                 "TracerIntegerConversionError", "TracerArrayConversionError")


@dataclass(frozen=True)
class StepPreflight(Display):
    function: str
    device: str  # where it would run, e.g. "cuda:0", "cpu:0"
    device_reason: str
    argument_bytes: int  # XLA's memory_analysis(), per device
    output_bytes: int
    alias_bytes: int  # outputs written into donated arguments
    temp_bytes: int  # XLA's scratch buffers (activations, intermediates)
    code_bytes: int  # generated code (0 on the CPU backend)
    peak_bytes: int  # the kit's estimate: arguments + outputs - aliased + temporaries
    xla_peak_bytes: int | NotAvailable  # memory_analysis().peak_memory_in_bytes, as XLA says
    resident_bytes: int  # argument bytes already on that device (counted in in_use_bytes)
    needed_bytes: int  # peak_bytes - resident_bytes: what the step adds
    in_use_bytes: int | NotAvailable  # on that device now
    in_use_source: str  # "allocator" or "live arrays"
    free_bytes: int | NotAvailable
    free_source: str
    donated: tuple[int, ...]
    verdict: str  # "fits" | "will not fit" | "unknown"
    advice: str

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def to_dict(self) -> dict:
        return {k: to_json_value(v) if not isinstance(v, tuple) else list(v)
                for k, v in asdict(self).items()}


# --- arguments as shapes on the target device ----------------------------------------------
def _check_donation(args, donate_argnums) -> tuple[int, ...]:
    jax = _jax()
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    try:
        nums = tuple(sorted(set(donate_argnums)))
    except TypeError:
        raise BadInputError(f"donate_argnums must be an int or a tuple of ints, got "
                            f"{donate_argnums!r}") from None
    for i in nums:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(args):
            raise BadInputError(f"donate_argnums={donate_argnums!r}: {i!r} is not the "
                                f"position of one of the {len(args)} positional arguments")
        for leaf in jax.tree.leaves(args[i]):
            if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
                raise BadInputError(
                    f"argument {i} is donated but holds a {type(leaf).__name__}, not a "
                    f"jax.Array: only a buffer already on the device can be donated (a NumPy "
                    f"array or a Python number is copied for each call). Fix: "
                    f"`jax.device_put` it first, or drop {i} from donate_argnums")
    return nums


def _device_of_committed(args, jax):
    """The one device that committed array arguments pin the step to (jit runs there)."""
    found = {d for leaf in jax.tree.leaves(args) if isinstance(leaf, jax.Array)
             and getattr(leaf, "committed", False) for d in leaf.devices()}
    return next(iter(found)) if len(found) == 1 else None


def _specs(args, kwargs, device, jax):
    """Array leaves as ShapeDtypeStructs placed on ``device`` (nothing is copied); other
    leaves (Python numbers, None) are left as they are. Also: argument bytes already there."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    resident = 0

    def spec(leaf):
        nonlocal resident
        if isinstance(leaf, jax.Array):
            if not leaf.is_deleted() and set(leaf.devices()) == {device}:
                resident += leaf.nbytes
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):  # NumPy arrays and scalars
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    return jax.tree.map(spec, args), jax.tree.map(spec, kwargs), resident


def _user_frame(err: BaseException) -> str:
    """file:line of the deepest frame outside JAX and the kit: where the user's code failed."""
    where = ""
    for frame in traceback.extract_tb(err.__traceback__):
        path = frame.filename.replace("\\", "/")
        if "/jax/" not in path and "/helpers/" not in path and "/jaxlib/" not in path:
            name = path.rsplit("/", 1)[-1]  # a notebook cell's file is a temporary path
            where = f" (at {name}:{frame.lineno}: {(frame.line or '').strip()})"
    return where


def _shapes(args) -> str:
    jax = _jax()
    return ", ".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(a.shape)}"
                     if hasattr(a, "shape") else repr(a) for a in jax.tree.leaves(args))


def compile_step(fn, *args, device=None, donate_argnums=(), **kwargs):
    """``(compiled, device, why, resident_bytes, donated)``: ``fn`` compiled for the device it
    would run on, with its arguments as shapes there. Clear errors for the usual mistakes."""
    jax = _jax()
    if not callable(fn):
        raise BadInputError(f"fn must be a function (plain or jitted), got {fn!r}")
    donated = _check_donation(args, donate_argnums)
    if device is None and _device_of_committed((args, kwargs), jax) is not None:
        dev, why = _device_of_committed((args, kwargs), jax), "where its committed arguments live"
    else:
        dev, why = _target(device)
    arg_specs, kw_specs, resident = _specs(args, kwargs, dev, jax)
    jitted = fn if (hasattr(fn, "lower") and not donated) else jax.jit(fn, donate_argnums=donated)
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        lowered = jitted.lower(*arg_specs, **kw_specs)
    except Exception as err:
        kind = type(err).__name__
        first = (str(err).strip().splitlines() or [kind])[0].rstrip(".")
        if kind in _TRACE_ERRORS:
            raise BadInputError(
                f"{name} does not trace{_user_frame(err)}: Python control flow (if, while, "
                f"int(), bool()) on a traced value. {kind}: {first}. Fix: jnp.where or "
                f"jax.lax.cond/while_loop, or mark that argument static "
                f"(jax.jit(..., static_argnums=...))") from None
        raise BadInputError(f"{name} fails on these arguments ({_shapes((args, kwargs))})"
                            f"{_user_frame(err)}: {kind}: {first}") from None
    try:
        compiled = lowered.compile()
    except Exception as err:
        raise MeasurementFailed(f"XLA could not compile {name} for {device_name(dev)}: "
                                f"{type(err).__name__}: {str(err)[:300]}") from None
    return compiled, dev, why, resident, donated


def _analysis(compiled) -> dict:
    """XLA's sizes, and the kit's peak: every buffer the executable holds at once, at most
    (the temporaries are one block, allocated for the whole run)."""
    ma = compiled.memory_analysis()
    if ma is None:
        raise MeasurementFailed("this backend gives no memory analysis for compiled code")
    sizes = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in
             ("argument", "output", "alias", "temp", "generated_code")}
    sizes["peak"] = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
    xla_peak = getattr(ma, "peak_memory_in_bytes", None)
    sizes["xla_peak"] = NOT_AVAILABLE if xla_peak is None else int(xla_peak)
    return sizes


def _in_use(dev) -> tuple[int | NotAvailable, str]:
    from helpers.snapshots import _device_memory

    try:
        (mem,) = _device_memory([dev])
    except Exception:
        return NOT_AVAILABLE, "unknown"
    return mem.bytes_in_use, mem.source


def _verdict(needed: int, free, dev, donated) -> tuple[str, str]:
    tips = [] if donated else ["donate the arguments the step replaces (donate_argnums)"]
    tips += ["a smaller batch", "jax.checkpoint on the largest activations",
             "free arrays still held (notebook 08)"]
    return judge(needed, free, dev, fix="Try: " + "; ".join(tips),
                 unknown="this device reports no free memory")


def preflight_step(fn, *args, device=None, donate_argnums=(), **kwargs) -> StepPreflight:
    """XLA's memory estimate for ``fn(*args, **kwargs)`` on ``device`` (default: where jit
    would run it), what is in use and free there now, and a verdict. Nothing runs and no
    argument is copied: arrays (JAX, NumPy) or ``jax.ShapeDtypeStruct`` shapes all work."""
    compiled, dev, why, resident, donated = compile_step(
        fn, *args, device=device, donate_argnums=donate_argnums, **kwargs)
    a = _analysis(compiled)
    needed = max(a["peak"] - resident, 0)
    in_use, in_use_source = _in_use(dev)
    free, free_source = _free_bytes(dev)
    verdict, advice = _verdict(needed, free, dev, donated)
    return StepPreflight(
        function=getattr(fn, "__name__", type(fn).__name__), device=device_name(dev),
        device_reason=why, argument_bytes=a["argument"], output_bytes=a["output"],
        alias_bytes=a["alias"], temp_bytes=a["temp"], code_bytes=a["generated_code"],
        peak_bytes=a["peak"], xla_peak_bytes=a["xla_peak"], resident_bytes=resident,
        needed_bytes=needed, in_use_bytes=in_use, in_use_source=in_use_source,
        free_bytes=free, free_source=free_source, donated=donated, verdict=verdict,
        advice=advice)
