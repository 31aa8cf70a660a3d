"""The kit's one seam into JAX's private internals, and the backend-start hook.

Every access to ``jax._src``, to jaxlib's non-public helpers, or to a format JAX does not document
(the transfer guard's log lines) lives here, with why the kit needs it and the public alternative
where one exists; so do the differences between JAX versions. Tests check that every internal
still exists where expected (naming the JAX version when one moved) and that nothing else reaches
past this seam. Every function degrades instead of raising when JAX moved something.

The hook: jaxlib reads the ``XLA_PYTHON_CLIENT_*`` / ``XLA_CLIENT_MEM_FRACTION`` variables once,
when the GPU backend starts; a value changed later has no effect. :func:`ensure_hook` (called by
:func:`import_jax`, the one way a kit module imports JAX) records them at that moment, so
:mod:`helpers.settings` can tell a user that a change came too late.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import math
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from helpers._internal import frames

__all__ = ["ALLOCATOR_VARS", "BOOL_FALSE", "BOOL_TRUE", "CACHE_EXPLAINED_PREFIXES", "ahead_of_time",
           "CACHE_LOAD_EVENT", "CACHE_MISS_PREFIX",
           "CALLBACK_IMPLS", "COMPILE_EVENT", "COMPILING_LOGGER", "GUARD_LINE", "INTERNALS",
           "Internal", "InternalMoved", "PAIRED_SORT_SINCE", "PMAP_AXIS_PREFIXES", "STARTUP_VARS",
           "STATIC_VALUES_EXPLAINED", "TESTED_FLOOR",
           "aliased_parameters", "all_gather_shapes", "asarray_is_explicit", "backend_errors",
           "backend_factories", "backend_start_snapshot", "backends_running_unlocked",
           "backends_started", "cache_miss_files",
           "compiled_function_name", "computed_while_compiling", "config_global",
           "custom_vjp_fwd_caller", "deleted_argument_error", "device_name",
           "distributed_coordinator", "ensure_hook",
           "entry_values", "expand_platform_alias", "explicit_scopes_marked", "host_copy_bytes",
           "import_jax", "kept_callbacks", "under_vmap",
           "is_pmap_mesh", "jax_version", "jax_version_tuple", "jit_cache_clears",
           "jit_made_by_jax", "jit_made_by_jax_for_arrays", "live_executables", "lowered_aliases",
           "lowered_equations",
           "lowered_jaxpr",
           "memory_spaces_only",
           "on_backend_start",
           "outside_transforms", "paired_sorts", "parse_cache_miss", "parse_cache_write",
           "parse_compiling",
           "parse_guard_line", "running_callback", "running_callback_site", "scan_counts",
           "sharding_error_types", "sort_buffer_words", "sort_threads", "stable_sort_scratch",
           "static_values_explained",
           "traced_for_jax_transpose",
           "unregister_duration_listener", "verify", "weak_type_only", "while_carry_copies",
           "while_slice_copies", "weight_gradient_convolutions", "while_condition_all_reduces",
           "wraps_jaxpr",
           "x64_asked",
           "x64_at_start", "started_at", "started_importing", "hook_when_jax_imports",
           "YNN_FUSIONS_OFF", "while_carried", "ynn_fusion_intermediates"]

#: The lowest jax the kit supports and tests (pyproject's floor; .ci/run tests it too). On jax
#: 0.7 the CPU stand-in's OOM fails in NumPy before JAX's allocation, so the floor is 0.8.
TESTED_FLOOR = (0, 8, 0)


@dataclass(frozen=True)
class Internal:
    where: str  # "module:attribute"
    why: str  # one line: what the kit uses it for
    public: str  # the public alternative, or why there is none
    since: tuple[int, int, int] = TESTED_FLOOR  # first JAX version with it, within the range
    until: tuple[int, int, int] | None = None  # first JAX version without it again

    def expected(self, version: tuple[int, ...]) -> bool:  # should it exist in ``version``?
        return self.since <= version and (self.until is None or version < self.until)


INTERNALS: dict[str, Internal] = {
    "backend_errors": Internal(
        "jax._src.xla_bridge:_backend_errors",
        "the doctor lists backends JAX skipped quietly (e.g. tpu without libtpu), with the reason",
        "none: jax.extend.backend.backends() returns only the backends that started"),
    "backend_factories": Internal(
        "jax._src.xla_bridge:_backend_factories",
        "tell a misspelled JAX_PLATFORMS entry from a plugin that is installed but failed",
        "partly: importlib.metadata.entry_points(group='jax_plugins') lists plugins, not "
        "the built-in cpu/tpu factories"),
    "expand_platform_alias": Internal(
        "jax._src.xla_bridge:expand_platform_alias",
        "JAX_PLATFORMS=gpu means cuda or rocm: name the backend that was meant",
        "none documented"),
    "backends_are_initialized": Internal(
        "jax._src.xla_bridge:backends_are_initialized",
        "ask 'has JAX started its backends?' without starting them (starting the GPU backend "
        "would take 75% of the card)",
        "for jax_num_cpu_devices only: jax.config.update raises RuntimeError after start "
        "(helpers.devices.simulate_cpu_devices uses that)"),
    "backend_clients": Internal(
        "jax._src.xla_bridge:_backends",
        "tell, inside a fork handler, whether JAX's backends run, without taking JAX's "
        "_backend_lock (backends_are_initialized takes it; a fork must not wait on a lock, and "
        "one its own thread holds would never come free)",
        "none: backends_are_initialized takes the lock"),
    "register_backend_initialization_hook": Internal(
        "jax._src.xla_bridge:register_backend_initialization_hook",
        "record the allocator variables at the moment the GPU backend starts, to catch ones "
        "changed too late",
        "none (0.10.2 has it, 0.11.2 not: seen on an H100; the doctor then says it cannot tell)",
        since=(0, 10, 2), until=(0, 11, 0)),
    "explicit_device_put_scope": Internal(
        "jax._src.config:explicit_device_put_scope",
        "helpers.transfers marks jax.device_put's scope in the guard log, to tell explicit "
        "copies from implicit ones",
        "none: transfer_guard('log_explicit') logs both kinds with no marker"),
    "flat_callback": Internal(
        "jax._src.callback:_FlatCallback",
        "preflight reads the Python function a host callback runs (its callback_func) to tell "
        "one that calls JAX itself, which can hang the step (jax-ml/jax#24255)",
        "none: a callback equation's params hold only this wrapper"),
    "device_put": Internal(
        "jax._src.api:device_put",
        "helpers.transfers reads the x of the jax.device_put whose explicit scope opens (its "
        "frame's module and name), to tell a reshard of jax.Arrays from a put of host data",
        "none: the guard logs both as host-to-device copies"),
    "explicit_device_get_scope": Internal(
        "jax._src.config:explicit_device_get_scope",
        "the same for jax.device_get",
        "none"),
    "debug_callback_impl": Internal(
        "jax._src.debugging:debug_callback_impl",
        "helpers.transfers names the copy jax.debug.callback (and jax.debug.print) makes of "
        "its arguments on every call (it device_puts them to the CPU): a device_put inside "
        "this function is the callback's, not one the user wrote",
        "none: the transfer guard logs the copy as any explicit device_put"),
    "pure_callback_impl": Internal(
        "jax._src.callback:pure_callback_impl",
        "the same for jax.pure_callback",
        "none"),
    "io_callback_impl": Internal(
        "jax._src.callback:io_callback_impl",
        "the same for jax.experimental.io_callback",
        "none"),
    "pjit_call_impl_python": Internal(
        "jax._src.pjit:_pjit_call_impl_python",
        "helpers.transfers reads, from this frame's local 'jaxpr', the program a host callback "
        "runs in (on every call: host callbacks have effects, so JAX's C++ fast path is not "
        "taken), to tell a callback jax.vmap made per element from one in a loop body",
        "none: a running program's jaxpr is not public"),
    "saved_residuals": Internal(
        "jax._src.ad_checkpoint:saved_residuals",
        "list what a function's gradient keeps from the forward pass (shape, and where each "
        "came from), to size it and point at jax.checkpoint",
        "jax.ad_checkpoint.print_saved_residuals prints the same list and returns nothing"),
    "distributed_state": Internal(
        "jax._src.distributed:global_state",
        "name the coordinator address a process of a multi-process job joined (the doctor)",
        "none: jax.distributed has is_initialized() and no getter for the address"),
    "unregister_duration_listener": Internal(
        "jax._src.monitoring:_unregister_event_duration_listener_by_callback",
        "helpers.compiles stops counting compiles when its block ends",
        "jax.monitoring.unregister_event_duration_listener, in newer JAX (0.10.2 has it, 0.8.0 "
        "not)", until=(0, 10, 2)),
    "static_argument_box": Internal(
        "jax._src.tree_util:Static",
        "helpers.holders tells an object that only jit's caches keep, as a static argument, "
        "from one the user holds",
        "none: jit's caches are not public", since=(0, 10, 2), until=(0, 11, 0)),
    "static_argument_box_older": Internal(
        "jax._src.api_util:_HashableWithStrictTypeEquality",
        "the same on older JAX (0.8.0 boxes a static argument in this type)",
        "none"),
    "tracing_cache_key_diff": Internal(
        "jax._src.interpreters.partial_eval:diff_tracing_cache_keys",
        "helpers.compiles names the static argument whose new value made jit trace again: from "
        "jax 0.11 JAX's explanation compares two cache keys' pytree structure, debug info and "
        "types but not their static values, and says only 'cache miss explanation "
        "unavailable'; during the kit's block JAX calls the kit's wrapper of this function, "
        "which adds the static values that differ",
        "none: JAX_EXPLAIN_CACHE_MISSES writes a log line, and its cache keys are not public "
        "(0.10.2 has the function too and explains static values itself: the kit wraps it "
        "only where static_argument_leaf exists)", since=(0, 10, 2)),
    "static_argument_leaf": Internal(
        "jax._src.flattree:FTStatic",
        "how jax 0.11 keeps one static argument in a cache key (its ``val``; equal as jit "
        "compares it: by value where hashable, else by identity): helpers.compiles reads the "
        "values that differ, helpers.holders tells an object only jit's caches keep",
        "none", since=(0, 11, 0)),
    "trace_state_clean": Internal(
        "jax._src.core:trace_state_clean",
        "%%memory counts a line's calls into JAX outside any transformation: a call made while "
        "jit, vmap or grad trace the line is not an operation dispatched on its own",
        "none documented"),
    "jit_evict_fn": Internal(
        "jax._src.pjit:jit_evict_fn",
        "helpers.compiles notes each jitted function's clear_cache() during its block (JAX's "
        "cache-miss text cannot tell a cleared cache from a function made anew at a freed "
        "address): jit() sets this function as its class's clear_cache on every call",
        "none: jax.clear_caches() is public, a jitted function's clear_cache() has no hook"),
    "jit_cache_miss": Internal(
        "jax._src.pjit:_cpp_pjit",
        "helpers.compiles tells a jit the user made of a JAX function (jax.jit(functools."
        "partial(jax.lax.top_k, k=8))) from a primitive or jnp call run outside jit, all "
        "compiled as jit(top_k): the function under the jit is the `fun` of the cache_miss "
        "frame this function makes",
        "none: a compile event and JAX's lowering log name the program (jit(top_k)), not who "
        "jitted it, and JAX explains no miss of a function in its own files"),
    "lowering_to_hlo": Internal(
        "jax._src.interpreters.pxla:_cached_lowering_to_hlo",
        "helpers.compiles counts the equations of each jaxpr JAX lowers, to tell a program "
        "built far larger than what XLA kept (nested jax.jvp, jax-ml/jax#520) by sizes, not "
        "seconds: the `closed_jaxpr` of this function's frame, which logs the \"Compiling "
        "...\" line the kit reads",
        "none: the lowering log and jax.monitoring give a program's argument types and "
        "seconds, not its size"),
    "sharding_type_error": Internal(
        "jax._src.core:ShardingTypeError",
        "helpers.ipython explains a cell's sharding error under its traceback: JAX raises this "
        "class (no ValueError) for operands of mixed shardings on a mesh of Explicit axes",
        "none: jax.errors does not export it"),
    "flatten_fwd": Internal(
        "jax._src.custom_derivatives:_flatten_fwd",
        "helpers.preflight names residuals that a jax.custom_vjp fwd rule returned: in an "
        "equation's traceback the rule is the user's frame just under this function",
        "none: jax.ad_checkpoint.print_saved_residuals names the line, not the rule"),
    "array_host_copy": Internal(
        "jax._src.array:ArrayImpl",
        "helpers.holders names the host copy JAX keeps on an array once np.asarray, "
        "jax.device_get or print read it (its ``_npy_value``, kept as long as the array: "
        "jax-ml/jax#26216)",
        "none: no public API says whether an array keeps a host copy, or drops it"),
    "generate_pjrt_gpu_plugin_options": Internal(
        "jaxlib.xla_client:generate_pjrt_gpu_plugin_options",
        "the allocator options jaxlib would pass to the CUDA client for an environment, "
        "computed without a GPU",
        "none; the variable names themselves are documented (XLA_CLIENT_MEM_FRACTION, "
        "XLA_PYTHON_CLIENT_PREALLOCATE, XLA_PYTHON_CLIENT_ALLOCATOR)"),
}


class InternalMoved(RuntimeError):
    """A JAX internal the kit relies on is gone or changed in the installed version."""


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def jax_version_tuple() -> tuple[int, ...]:
    """The installed jax version as numbers, e.g. (0, 10, 2); () when not installed."""
    return tuple(int(p) for p in re.findall(r"\d+", _installed("jax") or "")[:3])


def jax_version() -> str:  # for messages
    return f"jax {_installed('jax')}, jaxlib {_installed('jaxlib')}"


def _import(module: str):
    """importlib.import_module, except that when importing JAX fails (``JAX_NUM_CPU_DEVICES=abc``
    raises inside ``import jax``) the half-imported modules are removed again, so the user's
    own ``import jax`` later raises JAX's real error, not "Config option ... already defined"."""
    before = set(sys.modules)
    try:
        return importlib.import_module(module)
    except BaseException:
        if "jax" in before:  # a working JAX was already imported: leave it alone
            raise
        for name in set(sys.modules) - before:
            if name.split(".")[0] == "jax":  # jaxlib: C extensions cannot load twice
                del sys.modules[name]
        raise


def _resolve(name: str):
    module, attr = INTERNALS[name].where.split(":")
    return getattr(_import(module), attr)


def verify(name: str):
    """Return the internal ``name``; raise InternalMoved naming the JAX version if it is gone."""
    if name not in INTERNALS:
        raise KeyError(f"{name!r} is not one of the kit's JAX internals ({', '.join(INTERNALS)})")
    try:
        return _resolve(name)
    except Exception as err:
        raise InternalMoved(
            f"{INTERNALS[name].where} is not available in {jax_version()} "
            f"({type(err).__name__}: {err}); the kit uses it to {INTERNALS[name].why}. "
            "Update helpers/_internal/jaxcompat.py for this JAX version.") from err


def _get(name: str, default=None):
    try:  # moved or absent in this JAX: the caller degrades
        return _resolve(name)
    except Exception:
        return default


#: how the mesh of jax.pmap's outputs names its axis, a name of JAX's own:
#: "_internal_pmap_axis_name" on jax 0.10.2, "<axis 0x...>" on 0.8.0 (tests/test_jaxcompat.py)
PMAP_AXIS_PREFIXES = ("_internal_pmap", "<axis ")


def sharding_error_types() -> tuple[type, ...]:
    """The exception classes a sharding error of JAX's comes as: ValueError (a dimension its
    sharding does not divide, a spec naming an axis that is not Auto) and, where this JAX has it,
    its ShardingTypeError (operands of mixed shardings on a mesh of Explicit axes)."""
    found = _get("sharding_type_error")
    return (ValueError, found) if isinstance(found, type) else (ValueError,)


def is_pmap_mesh(mesh: Any) -> bool:
    """Whether a mesh is jax.pmap's own (its outputs' sharding), not one the user made."""
    return any(str(a).startswith(PMAP_AXIS_PREFIXES) for a in getattr(mesh, "axis_names", ()))


@functools.cache
def custom_vjp_fwd_caller() -> str:
    """The name tracebacks give JAX's function that calls a ``jax.custom_vjp`` fwd rule
    ("_flatten_fwd" on jax 0.8.0 and 0.10.2, a ``lu.transformation`` partial of it); "" where
    this JAX has none (the kit then names no rule)."""
    wrapped = _get("flatten_fwd")
    inner = (wrapped.args[0] if isinstance(wrapped, functools.partial) and wrapped.args
             else wrapped)
    return getattr(inner, "__name__", "") or ""


def traced_for_jax_transpose(frame: Any) -> bool:
    """Whether the trace JAX explains now (a "TRACING CACHE MISS" logged on this thread, the
    stack from ``frame``) is of the backward pass JAX builds for a jit under jax.grad/jax.vjp
    (jax/_src/pjit.py, _transpose_jaxpr_fancy): from jax 0.11 traced through the explained
    cache (pe.trace_to_jaxpr), as "never seen function: f" with f's name and line; on 0.8.0
    and 0.10.2 traced uncached (trace_to_jaxpr_dynamic), unexplained, so never True there."""
    return _frame_running(frame, "_transpose_jaxpr_fancy", _pjit_file()) is not None


def _pjit_file() -> str | None:
    """The file of JAX's jit machinery (jax/_src/pjit.py: where INTERNALS["jit_cache_miss"]
    is defined); None where this JAX moved it."""
    made = _get("jit_cache_miss")
    return getattr(getattr(made, "__code__", None), "co_filename", None)


def _frame_running(frame: Any, name: str, filename: str | None) -> Any:
    """The innermost frame on the stack from ``frame`` that runs the function ``name`` of
    ``filename``; None where there is none (or no file is known)."""
    while filename and frame is not None:
        if frame.f_code.co_name == name and frame.f_code.co_filename == filename:
            return frame
        frame = frame.f_back
    return None


def jit_made_by_jax(frame: Any) -> bool | None:
    """Whether the jit compiling now on this thread (the innermost one on the stack from
    ``frame``) is one JAX made itself: a primitive run outside jit (JAX jits it alone) or a jnp
    function, jitted where it is defined. False where the jit wraps anything else (a
    functools.partial, the user's function, a public JAX function the user passed to
    jax.jit); None where no jit is running (an ahead-of-time compile) or this JAX moved it.
    Read from the `fun` of JAX's cache_miss frame (INTERNALS["jit_cache_miss"]); on jax 0.8.0
    and 0.10.2 alike."""
    where = _pjit_file()
    frame = _frame_running(frame, "cache_miss", where)
    if frame is None or "fun" not in frame.f_locals:
        return None
    fun = frame.f_locals["fun"]
    code = getattr(fun, "__code__", None)
    jax_dir = os.path.dirname(os.path.dirname(where))  # .../jax (where is .../jax/_src/pjit.py)
    if code is None or not code.co_filename.startswith(jax_dir + os.sep):
        return False
    # a public JAX function passed to jax.jit is its module's own; one JAX jitted where it is
    # defined is hidden behind its jit (jnp.exp), and a primitive's (dispatch's) has no name
    module = sys.modules.get(getattr(fun, "__module__", "") or "")
    return getattr(module, getattr(fun, "__name__", ""), None) is not fun


#: the modules of JAX's array functions that JAX jits where it defines them (jnp's, jax.nn's,
#: jax.random's): called outside jit each is one operation; not a library's jit that takes a
#: function (jax.experimental.ode's odeint: its own cause, jax-ml/jax#17232)
_ARRAY_FUNCTION_MODULES = ("jax._src.numpy", "jax._src.nn", "jax._src.random",
                           "jax._src.prng", "jax._src.scipy.special")


def jit_made_by_jax_for_arrays(frame: Any) -> bool:
    """The jit compiling now on this thread (see :func:`jit_made_by_jax`) is of an array
    function JAX jits where it defines it (jnp.append, jnp.mean, jax.nn.one_hot): called outside
    jit, one operation on its own; False for any other jit, none running, or where this JAX
    moved it."""
    if jit_made_by_jax(frame) is not True:
        return False
    frame = _frame_running(frame, "cache_miss", _pjit_file())
    fun = frame.f_locals.get("fun") if frame is not None else None
    return str(getattr(fun, "__module__", "") or "").startswith(_ARRAY_FUNCTION_MODULES)


def lowered_jaxpr(frame: Any) -> Any:
    """The closed jaxpr JAX is lowering now on this thread: the `closed_jaxpr` of the frame of
    INTERNALS["lowering_to_hlo"] on the stack from ``frame`` (the frame that logs the
    "Compiling ..." line); None where no such frame is on the stack or this JAX moved it. On jax
    0.8.0 and 0.10.2 alike."""
    if _get("lowering_to_hlo") is None:
        return None
    module, name = INTERNALS["lowering_to_hlo"].where.split(":")
    frame = _frame_running(frame, name, getattr(sys.modules.get(module), "__file__", None))
    closed = frame.f_locals.get("closed_jaxpr") if frame is not None else None
    return closed if hasattr(getattr(closed, "jaxpr", None), "eqns") else None


def lowered_equations(frame: Any) -> int | None:
    """The equations, those of nested jaxprs included, of the jaxpr JAX is lowering now on this
    thread (:func:`lowered_jaxpr`); None where it cannot be found."""
    closed = lowered_jaxpr(frame)
    if closed is None:
        return None
    count, stack, seen = 0, [closed.jaxpr], 0
    while stack and seen < 10_000_000:  # (a bound: the count is a size, not a walk to finish)
        inner = stack.pop()
        count += len(inner.eqns)
        for eqn in inner.eqns:
            for value in eqn.params.values():
                for v in value if isinstance(value, (tuple, list)) else (value,):
                    v = v.jaxpr if hasattr(v, "consts") and hasattr(v, "jaxpr") else v
                    if hasattr(v, "eqns"):
                        stack.append(v)
                        seen += len(v.eqns)
    return count


def outside_transforms() -> Callable[[], bool]:
    """A function that answers, each time it is called and cheaply, whether no transformation
    (jit, vmap, grad) is tracing on this thread: a JAX call then runs at once, dispatched on
    its own. Where this JAX moved the answer, one that always says True (every call counts)."""
    clean = _get("trace_state_clean")
    if not callable(clean):
        return lambda: True

    def outside() -> bool:
        try:
            return bool(clean())
        except Exception:  # changed under us: count the call
            return True

    return outside


def static_argument_boxes() -> tuple[type, ...]:
    """The types jit keeps a static argument in, in its caches (``FTStatic`` from jax 0.11,
    ``Static`` on 0.10.2, ``_HashableWithStrictTypeEquality`` on 0.8.0); () where this JAX has
    none of them."""
    found = (_get("static_argument_leaf"), _get("static_argument_box"),
             _get("static_argument_box_older"))
    return tuple(t for t in found if isinstance(t, type))


# --- backends -------------------------------------------------------------------------------
def backends_started() -> bool:
    """Has JAX started its backends in this process? Never starts them, and never imports jax
    when it is not imported yet (then nothing can have started). False when JAX moved the
    answer."""
    if "jax" not in sys.modules:
        return False
    fn = _get("backends_are_initialized")
    try:
        return bool(fn()) if fn is not None else False
    except Exception:
        return False


def backends_running_unlocked() -> bool:
    """:func:`backends_started` for a fork handler: reads JAX's dict of running backends
    without importing anything or taking JAX's lock (JAX's own fork handler takes none). False
    where JAX is not imported or moved the dict."""
    module, attr = INTERNALS["backend_clients"].where.split(":")
    try:
        return bool(getattr(sys.modules.get(module), attr, None))
    except Exception:
        return False


def distributed_coordinator() -> str | None:
    """The coordinator address this process joined with ``jax.distributed.initialize``; None
    when it joined none, or when JAX moved the answer."""
    state = _get("distributed_state")
    address = getattr(state, "coordinator_address", None)
    return str(address) if address else None


def backend_errors() -> dict[str, str]:
    """{platform: error} for backends JAX tried and skipped quietly; {} if unknown."""
    return dict(_get("backend_errors", None) or {})


def backend_factories() -> set[str]:
    """Platform names JAX knows how to start (built-in and plugins); falls back to the public
    plugin entry points plus 'cpu' when the private registry moved."""
    names = _get("backend_factories", None)
    if names is not None:
        return set(names)
    return {"cpu"} | {ep.name for ep in metadata.entry_points(group="jax_plugins")}


def expand_platform_alias(name: str) -> list[str]:
    """['cuda', 'rocm'] for 'gpu', [name] otherwise (or when JAX moved the helper)."""
    fn = _get("expand_platform_alias")
    try:
        return list(fn(name)) if fn is not None else [name]
    except Exception:
        return [name]


def on_backend_start(hook: Callable) -> str:
    """Call ``hook(client)`` when each backend starts. Returns "installed", "late" (backends
    already started: too late to see them start) or "unavailable" (JAX moved the hook)."""
    try:
        register = _resolve("register_backend_initialization_hook")
    except Exception:
        return "unavailable"
    if backends_started():
        return "late"
    register(hook)
    return "installed"


# --- version differences ------------------------------------------------------------------
#: Measured with the guard's log: before jax 0.10.1, ``jnp.asarray(numpy_array)`` copied inside
#: JAX's explicit device_put scope, so the kit calls it explicit; from 0.10.1 it is implicit
#: (like passing a NumPy array to a jitted function).
ASARRAY_EXPLICIT_BEFORE = (0, 10, 1)


def asarray_is_explicit() -> bool:
    """Whether this JAX counts ``jnp.asarray(numpy)``'s copy as explicit (see above)."""
    return jax_version_tuple() < ASARRAY_EXPLICIT_BEFORE


_SHORT_NAME = re.compile(r"[a-z]+:\d+")
_TFRT_NAME = re.compile(r"TFRT_([A-Za-z]+)_(\d+)")  # jax <= 0.9: str(CpuDevice) == "TFRT_CPU_0"
_REPR_NAME = re.compile(r"([A-Za-z]+?)(?:Device)?\(id=(\d+)\)")  # e.g. "CudaDevice(id=0)"


def device_name(device: Any) -> str:
    """The kit's name for a device, the same in every JAX version: "cpu:0", "cuda:1".
    ``str(device)`` is that from jax 0.10 on; jax 0.9 and older print "TFRT_CPU_0". A string
    is returned unchanged (names are accepted wherever devices are)."""
    if isinstance(device, str):
        return device
    text = str(device)
    if _SHORT_NAME.fullmatch(text):
        return text
    for pattern in (_TFRT_NAME, _REPR_NAME):
        m = pattern.fullmatch(text) or pattern.fullmatch(repr(device))
        if m:
            return f"{m.group(1).lower()}:{m.group(2)}"
    platform = device.platform
    if platform == "gpu":  # CUDA and ROCm devices both say "gpu"; their names say which
        version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
        platform = "rocm" if "rocm" in version else "cuda"
    return f"{platform}:{device.id}"


def live_executables() -> list | None:
    """The compiled programs JAX keeps loaded, on every backend (jaxlib's
    ``Client.live_executables()``: reachable through ``jax.extend.backend`` but not documented);
    None where this jaxlib has no such method."""
    try:
        from jax.extend.backend import backends

        return [e for client in backends().values() for e in client.live_executables()]
    except Exception:
        return None


@functools.cache
def _array_kind() -> type | None:
    """JAX's array class where it keeps a host copy in ``_npy_value``; None elsewhere."""
    kind = _get("array_host_copy")
    return kind if isinstance(kind, type) and hasattr(kind, "_npy_value") else None


def callback_function(callback: Any) -> Any:
    """The Python function a host callback equation runs (``eqn.params["callback"]`` of a
    pure_callback or io_callback, JAX's ``_FlatCallback``: its ``callback_func``), as the user
    passed it; None where this JAX wraps it otherwise."""
    kind = _get("flat_callback")
    if not isinstance(kind, type) or not isinstance(callback, kind):
        return None
    return getattr(callback, "callback_func", None)


def host_copy_bytes(array: Any) -> int:
    """The bytes of the host copy JAX keeps on ``array`` since a read on the host made one
    (``np.asarray``, ``jax.device_get``, ``print``: ``jax/_src/array.py``'s ``_value`` keeps it
    in ``_npy_value`` where making it took a copy, for as long as the array lives:
    jax-ml/jax#26216); 0 where it keeps none, or this JAX keeps it elsewhere."""
    kind = _array_kind()
    if kind is None or not isinstance(array, kind):
        return 0
    try:
        value = array._npy_value
    except Exception:  # deleted meanwhile
        return 0
    return int(getattr(value, "nbytes", 0) or 0) if value is not None else 0


def listed_shards(array: Any) -> list:
    """The Shards of ``array`` where its ``addressable_shards`` was read already, else []: JAX
    keeps that list in the array's ``__dict__`` (``jax/_src/array.py``, jax 0.8.0 to
    0.12.0.1), each Shard over an Array of its own, which ``jax.live_arrays()`` then lists
    beside the array (a view of the shard's buffer). Reading the kept list makes nothing; reading
    ``addressable_shards`` where it was not kept would make those Arrays. [] for an array on one
    device (JAX keeps none) and where this JAX keeps it elsewhere."""
    try:
        shards = vars(array).get("addressable_shards")
    except TypeError:  # no __dict__
        return []
    return list(shards) if isinstance(shards, list) and len(shards) > 1 else []


# --- compiled programs: what the HLO text says that no public API does ---------------------
#: the entry layout on an optimized program's first line, and an XLA type in it ("f32[3,3]")
_ENTRY_LAYOUT = "entry_computation_layout={"
_XLA_TYPE = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


def entry_signature(hlo_text: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the parameters' types, the results' types) of an optimized program, from the entry
    layout on its text's first line ("(f32[1024,1024]{1,0}, f64[])->f64[1024,1024]{1,0}"), as
    "f32[1024,1024]"; None where the line does not say (XLA's text format, not an API)."""
    head = hlo_text.split("\n", 1)[0]
    at = head.find(_ENTRY_LAYOUT)
    if at < 0:
        return None
    begin = end = at + len(_ENTRY_LAYOUT)
    depth = 1
    while end < len(head) and depth:
        depth += {"{": 1, "}": -1}.get(head[end], 0)
        end += 1
    layout = head[begin:end - 1]
    takes, arrow, returns = layout.partition("->")
    if not arrow:
        return None
    return tuple(f"{t}[{d}]" for t, d in _XLA_TYPE.findall(takes)), tuple(
        f"{t}[{d}]" for t, d in _XLA_TYPE.findall(returns))


#: The alias table in the first line of an executable's HLO text (``compiled.as_text()``), e.g.
#: "input_output_alias={ {0}: (0, {}, may-alias), {1}: (2, {}, must-alias) }": which parameter
#: each output is written into. XLA's text format, not a documented API: tests check it still
#: parses (the public ``memory_analysis().alias_size_in_bytes`` gives only the total).
_ALIAS_TABLE = re.compile(r"input_output_alias=\{(.*?)\}\s*,\s*\w+=")
_ALIAS_ENTRY = re.compile(r"\{[\d,\s]*\}\s*:\s*\(\s*(\d+)\s*,")


def aliased_parameters(hlo_text: str) -> set[int] | None:
    """The parameter numbers whose buffers an executable writes an output into (donation that
    XLA used): ``set()`` when none; None when the text has no readable alias table and says
    nothing else either (then the kit cannot tell)."""
    head = hlo_text.split("\n", 1)[0]
    m = _ALIAS_TABLE.search(head)
    if m is None:
        return set() if head.startswith("HloModule") else None
    return {int(n) for n in _ALIAS_ENTRY.findall(m.group(1))}


#: Bytes per element of XLA's primitive types, as its HLO text names them.
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
              "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
              "f8e4m3fn": 1, "f8e5m2": 1}
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+) = (\w+)\[([\d,]*)\]\S*\s+(\w[\w-]*)\(")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')  # (HLO escapes quotes: s.params[\'w1\'])


def _unescaped(text: str) -> str:
    """HLO's text of a string as written: its escapes (\\' and \\" quotes, and octal bytes
    of UTF-8, \\303\\251 for é) read back; the text as it is where it does not decode."""
    if "\\" not in text:
        return text
    try:
        import codecs

        return codecs.escape_decode(text.encode("utf-8"))[0].decode("utf-8", "replace")
    except Exception:  # an escape Python reads otherwise: leave it
        return text


#: an instruction with several results: "%custom-call.1 = (f32[2048,2048]{1,0}, s8[33554432]{0})
#: custom-call(...)" (a GPU's cuBLAS call and its workspace; a multi-output fusion)
_TUPLE_HEAD = re.compile(r"^\s*(ROOT\s+)?%(\S+) = \(")
_OPCODE = re.compile(r"\s+(\w[\w-]*)\(")
#: the opcodes whose several results are buffers of their own (a while loop's are its state, an
#: argument's buffer among them; a tuple's and a parameter's are other values)
_OWN_RESULTS = ("custom-call", "fusion")
_ELEMENT = re.compile(r"(\w+)\[([\d,]*)\]")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_SOURCE = re.compile(r'source_file="([^"]*)" source_line=(\d+)')


def _tables(lines: list[str]) -> tuple[dict, dict, dict]:
    """The module's FileNames, FileLocations and StackFrames tables (XLA's text format)."""
    files, locations, frames_ = {}, {}, {}
    section = None
    for line in lines:
        head = line.strip()
        if head in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = head
            continue
        if not head or head.startswith(("%", "ENTRY", "HloModule", "}", "ROOT")):
            section = None if not head or not head[0].isdigit() else section
            continue
        if section == "FileNames" and (m := re.match(r'(\d+) "(.*)"', head)):
            files[int(m.group(1))] = m.group(2)
        elif section == "FileLocations" and (m := re.match(
                r"(\d+) \{file_name_id=(\d+) function_name_id=\d+ line=(\d+)", head)):
            locations[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
        elif section == "StackFrames" and (m := re.match(
                r"(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)", head)):
            frames_[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
    return files, locations, frames_


def _source(meta: str, tables: tuple[dict, dict, dict],
            is_user: Callable[[str], bool]) -> tuple[str, int] | None:
    """(file, line) of the innermost user frame that made an instruction, where XLA kept it."""
    m = _SOURCE.search(meta)
    if m:
        return m.group(1), int(m.group(2))
    m = _FRAME_ID.search(meta)
    files, locations, stack = tables
    frame, seen = int(m.group(1)) if m else 0, set()
    while frame in stack and frame not in seen:
        seen.add(frame)
        location, parent = stack[frame]
        file_id, line = locations.get(location, (0, 0))
        if file_id in files and is_user(files[file_id]):
            return files[file_id], line
        frame = parent
    return None


#: the compiler option that stops XLA:CPU making YNNPACK fusions (xla/debug_options_flags.cc;
#: jax 0.10 and 0.12 take it, 0.8.0 has no YNNPACK fusions and refuses it): its plan then holds
#: as temporaries the values a fusion keeps inside itself
YNN_FUSIONS_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}
_YNN_FUSION = re.compile(r'^\s*(?:ROOT\s+)?%\S+ = (\w+)\[([\d,]*)\]\S* fusion\(.*calls=%([\w.\-]+)'
                         r'.*"kind":"__ynn_fusion"')
#: opcodes inside a fusion that make no value of their own (a view, a parameter, a constant)
_NO_VALUE = frozenset({"parameter", "bitcast", "broadcast", "constant", "iota",
                       "get-tuple-element", "tuple"})


def ynn_fusion_intermediates(hlo_text: str) -> list[tuple[int, int, bool]]:
    """(the largest value made inside it, its own result's bytes, whether it holds a dot or a
    convolution) of each YNNPACK fusion
    (``"kind":"__ynn_fusion"``, XLA:CPU from jax 0.10) in an optimized CPU program that makes a
    value larger than its result: XLA's buffer plan counts a fusion's result, not what it makes
    inside (netket/netket#783's dot, cosh, log and sum: ``temp_size_in_bytes`` 0, a run 321 MiB
    over its arguments, jax 0.10.2). Largest first; [] where there is none."""
    computations = _hlo_computations(hlo_text)
    out = []
    for line in hlo_text.splitlines():
        m = _YNN_FUSION.match(line)
        if not m or m.group(3) not in computations:
            continue
        result = math.prod(int(d) for d in m.group(2).split(",") if d) * _HLO_BYTES.get(
            m.group(1), 4)
        made = [i for i in map(_INSTRUCTION.match, computations[m.group(3)])
                if i and not i.group(1) and i.group(5) not in _NO_VALUE]
        inside = [math.prod(int(d) for d in i.group(4).split(",") if d) * _HLO_BYTES.get(
            i.group(3), 4) for i in made]
        if inside and max(inside) > result:
            out.append((max(inside), result,
                        any(i.group(5) in ("dot", "convolution") for i in made)))
    return sorted(out, reverse=True)


_CONV = re.compile(r"convolution\(%(\S+?), %(\S+?)\).*window=\{size=([\dx]+)[^}]*\}.*"
                   r"dim_labels=(\w+)_(\w+)->(\w+)")


def array_constants(hlo_text: str) -> list[tuple[str, tuple[int, ...], int]] | None:
    """(XLA's type name, shape, bytes) of each array constant an optimized executable keeps
    (every ``constant`` instruction with a dimension, in every computation); scalars are left
    out. None where the text is not XLA's (then the kit cannot tell). A constant XLA folded
    away (a reduction of a closed-over array, computed while compiling) is not there. XLA's
    text format is not an API: tests check it still parses."""
    if not hlo_text.startswith("HloModule"):
        return None
    out = []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m and m.group(5) == "constant" and m.group(4):
            shape = tuple(int(d) for d in m.group(4).split(","))
            out.append((m.group(3), shape, math.prod(shape) * _HLO_BYTES.get(m.group(3), 4)))
    return out


#: what moves or repeats values and computes none (a fusion is judged by what it calls)
_MOVES_ONLY = {"constant", "parameter", "broadcast", "copy", "copy-start", "copy-done", "bitcast",
               "reshape", "transpose", "tuple", "get-tuple-element", "fusion"}
_ANY_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%\S+ = (\([^)]*\)|\S+)\s+(\w[\w-]*)\(")


def computed_while_compiling(hlo_text: str) -> bool | None:
    """The optimized program takes no parameter and only copies or broadcasts constants: XLA
    computed its whole result while compiling, and a call copies it out (jax-ml/jax#13956: a
    jitted loop over closed-over arrays compiles to ``broadcast(constant 601)``). None where the
    text is not XLA's. XLA's text format is not an API: tests check it still parses."""
    if not hlo_text.startswith("HloModule"):
        return None
    if "entry_computation_layout={()->" not in hlo_text.split("\n", 1)[0]:
        return False
    ops = {m.group(2) for line in hlo_text.splitlines()
           if (m := _ANY_INSTRUCTION.match(line))}
    return bool(ops) and ops <= _MOVES_ONLY


_OP_TYPE = re.compile(r'op_type="(\w+)"')
#: where XLA's metadata has no op_type (a callback inside shard_map: jax 0.10.2), JAX's
#: primitive is the last part of op_name ("jit(f)/transpose(jvp())/shard_map/pure_callback")
_OP_NAME_LAST = re.compile(r'op_name="[^"]*?/?(\w+)"')


_WHILE_CONDITION = re.compile(r"\bwhile\(.*?\bcondition=%?([\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")


def while_condition_all_reduces(hlo_text: str) -> int | None:
    """How many while loops of an optimized, partitioned program all-reduce their stop test
    across devices at every iteration (the condition computation holds an all-reduce: a
    while_loop vmapped over a batch split over devices, jax-ml/jax#26586); None where the text
    is not XLA's. XLA's text format is not an API: tests check it still parses."""
    if not hlo_text.startswith("HloModule"):
        return None
    reduces: set[str] = set()
    current = None
    conditions = []
    for line in hlo_text.splitlines():
        if (m := _COMPUTATION.match(line)) and not line.startswith(" "):
            current = m.group(1)
            continue
        if current is not None and re.search(r"= pred\[\] all-reduce\(", line):
            reduces.add(current)  # (an OR of a batched stop test; a sum's is f32: a review)
        if (w := _WHILE_CONDITION.search(line)) and " while(" in line:
            conditions.append(w.group(1))
    return sum(1 for c in conditions if c in reduces)


def kept_callbacks(hlo_text: str, is_user: Callable[[str], bool]
                   ) -> list[tuple[str, tuple[str, int] | None]] | None:
    """(JAX's primitive: "pure_callback", "io_callback", "debug_callback", ..., the user's
    (file, line) where the text records it) of each host callback an optimized program still
    calls: XLA removes a jax.pure_callback whose result nothing reads, as dead code
    (jax-ml/jax#13762), and keeps the others (custom calls with a side effect). None where the
    text is not XLA's. XLA's text format is not an API: tests check it still parses."""
    if not hlo_text.startswith("HloModule"):
        return None
    lines = hlo_text.splitlines()
    tables = _tables(lines)
    out = []
    for line in lines:
        if " custom-call(" not in line or "callback" not in line:
            continue
        m = _OP_TYPE.search(line) or _OP_NAME_LAST.search(line)
        if m and m.group(1).endswith(("callback", "debug_print")):
            meta = line[line.find("metadata={"):]
            out.append((m.group(1), _source(meta, tables, is_user)))
    return out


def constant_bytes(hlo_text: str) -> int | None:
    """The bytes of :func:`array_constants`; None where the text is not XLA's."""
    found = array_constants(hlo_text)
    return None if found is None else sum(n for _, _, n in found)


def weight_gradient_convolutions(hlo_text: str) -> list[int]:
    """For each convolution in an optimized executable whose window spans its input's whole
    spatial extent (how XLA writes a weight gradient), the bytes of its two operands. The CPU
    runtime copies both outside XLA's buffer plan (measured, jax 0.10.2: the extra peak is their
    sum within 0-10%). XLA's text format is not an API: tests check it still parses."""
    shapes: dict[str, tuple[str, list[int]]] = {}  # names are unique within a computation
    out = []
    for line in hlo_text.splitlines():
        if line.rstrip().endswith("{"):  # a new computation: its own names
            shapes = {}
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        dims = [int(d) for d in m.group(4).split(",") if d]
        shapes[m.group(2)] = (m.group(3), dims)
        c = _CONV.search(line)
        if not c or c.group(1) not in shapes or c.group(2) not in shapes:
            continue
        (lhs_type, lhs), (rhs_type, rhs) = shapes[c.group(1)], shapes[c.group(2)]
        window = [int(w) for w in c.group(3).split("x")]
        labels = c.group(4)
        spatial = [lhs[labels.index(str(i))] for i in range(len(window))
                   if str(i) in labels]
        if len(spatial) == len(window) and window == spatial and math.prod(window) > 1:
            out.append(math.prod(lhs) * _HLO_BYTES.get(lhs_type, 4)
                       + math.prod(rhs) * _HLO_BYTES.get(rhs_type, 4))
    return out


#: XLA:CPU's SortThunk moves the elements of a sort of several arrays through a value of 16
#: bytes per array (kMaxElementSize: a complex128), whatever their type
_SORT_VALUE_BYTES = 16
_SORT_DIMENSION = re.compile(r"\bdimensions=\{(\d+)\}")
#: From jax 0.11 (xla/backends/cpu/runtime/sort_lib.cc, measured on 0.11.2, taken to hold from
#: 0.11.0; 0.10.2 has neither):
#: a sort of two arrays of 1, 2, 4 or 8 byte elements moves them as std::pair<Key, Value> of
#: unsigned stand-ins, whose size is twice the wider (a key-value sort), where the sorted
#: dimension is the innermost or at most 65,536 long; a strided slice is gathered into two
#: arrays of its own first (on the stack up to 1,024 elements). SortThunk sorts the slices in
#: parallel on the intra-op pool, in tasks of max(1, 32768 // n) slices.
PAIRED_SORT_SINCE = (0, 11, 0)
_PAIRED_WIDTHS = (1, 2, 4, 8)
_PAIRED_STRIDED_MAX = 65536
_PAIRED_ON_STACK = 1024
_SORT_GRAIN = 32768


def paired_sorts(version: tuple[int, ...] | None = None) -> bool:
    """Whether XLA:CPU in this JAX (or ``version``) sorts two arrays as pairs (see above)."""
    return (jax_version_tuple() if version is None else version) >= PAIRED_SORT_SINCE


def sort_threads() -> int:
    """The CPUs this process may run on: the size of XLA:CPU's intra-op pool."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def stable_sort_scratch(hlo_text: str, threads: int | None = None,
                        version: tuple[int, ...] | None = None
                        ) -> list[tuple[int, int, int, bool]]:
    """(bytes, arrays sorted together, elements along the sorted dimension, paired) of the
    scratch each stable ``sort`` of two or more arrays in an optimized CPU executable takes
    outside XLA's buffer plan. From XLA's source, xla/backends/cpu/runtime/sort_thunk.cc: SortThunk
    hands std::stable_sort an iterator over all k arrays whose value type holds 16 bytes per
    array, and std::stable_sort allocates a buffer of one value per element of the slice it
    sorts (one row at a time: a sort along the last axis of [rows, n] takes 16 * k * n).
    Measured, jax 0.8.0 and 0.10.2: 16 B x k x n within 0.3% for k = 2 and 3 at n = 1,510,441.
    From jax 0.11 (``version``, the installed one by default) two arrays of 1 to 8 byte
    elements are sorted as pairs (``paired``: n x twice the wider element; measured on 0.11.2,
    n = 2**21: 8 B for int32 with int32 or int8, 16 B for complex64 with int32), and slices
    are sorted in parallel: up to ``threads`` (:func:`sort_threads` by default) + 1 at once, the
    caller's thread among them (measured on 0.11.2, 8 rows of 262,144: 3 slices' scratch with 2
    CPUs, 2 with 1; it varies run to run), so the bytes are those of the most at once. The
    layout is taken as XLA's default (the last dimension innermost). XLA's text format is not an
    API: tests check it still parses."""
    paired_since = paired_sorts(version)
    threads = sort_threads() if threads is None else threads
    out = []
    for line in hlo_text.splitlines():
        if "is_stable=true" not in line:
            continue
        found = _tuple_results(line)
        dim = _SORT_DIMENSION.search(line)
        if found is None or found[2] != "sort" or len(found[3]) < 2 or dim is None:
            continue
        dims = [int(d) for d in found[3][0][1].split(",") if d]
        d = int(dim.group(1))
        if d >= len(dims):
            continue
        k, n = len(found[3]), dims[d]
        if not paired_since:
            out.append((_SORT_VALUE_BYTES * k * n, k, n, False))
            continue
        inner = math.prod(dims[d + 1:])
        widths = [_HLO_BYTES.get(t) for t, _ in found[3]]
        paired = (k == 2 and all(w in _PAIRED_WIDTHS for w in widths)
                  and (inner == 1 or n <= _PAIRED_STRIDED_MAX))
        if paired:
            gathered = n * sum(widths) if inner > 1 and n > _PAIRED_ON_STACK else 0
            per_slice = n * 2 * max(widths) + gathered
        else:
            per_slice = _SORT_VALUE_BYTES * k * n
        slices = math.prod(dims) // max(n, 1)
        grain = max(1, _SORT_GRAIN // max(n, 1))
        at_once = 1 if slices <= grain else min(-(-slices // grain), threads + 1)
        out.append((per_slice * at_once, k, n, paired))
    return out


def sort_buffer_words(paired: bool) -> str:
    """How XLA:CPU's stable sort of several arrays holds them (:func:`stable_sort_scratch`),
    with the source file, for a note (no parentheses: notes put it in theirs)."""
    if paired:
        return ("a buffer of one (key, value) pair per element, of twice the wider element's "
                "bytes, xla/backends/cpu/runtime/sort_lib.cc from jax 0.11; 16 bytes per array "
                "per element before it, and for three arrays or more")
    where = "sort_lib.cc" if paired_sorts() else "sort_thunk.cc"  # (the code moved in 0.11)
    return f"a buffer of 16 bytes per array per element, xla/backends/cpu/runtime/{where}"


def _tuple_results(line: str) -> tuple[str | None, str, str, list[tuple[str, str]]] | None:
    """(ROOT, name, opcode, [(dtype, dims), ...]) of an instruction with a tuple of results;
    the tuple's parentheses balanced (a TPU layout has its own: "{1,0:T(8,128)}")."""
    m = _TUPLE_HEAD.match(line)
    if not m:
        return None
    depth, i = 1, m.end()
    while i < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        i += 1
    op = _OPCODE.match(line, i)
    if depth or not op:
        return None
    return m.group(1), m.group(2), op.group(1), _ELEMENT.findall(line[m.end():i - 1])


def lowered_aliases(text: str) -> tuple[list[tuple[int, str, str, str]], int]:
    """From a lowered program's text (``Lowered.as_text()``, StableHLO): (for each argument
    JAX aliases to an output, its position, its memory kind, the output as JAX names it
    ("output['mu']", else "output 3"), the output's memory kind; "device" where unsaid), and
    the number of arguments. JAX writes the pairs as ``tf.aliasing_output`` and the kinds as
    ``mhlo.memory_kind`` (jax 0.8.0 and 0.10.2; not an API: marin-community/marin#8515's tests
    check it still parses). ([], 0) where the text has no main function."""
    head = next((line for line in text.splitlines() if "func.func public @main(" in line), "")
    if ") -> (" not in head:
        return [], 0
    ins, outs = head.split("@main(", 1)[1].split(") -> (", 1)
    ins = re.split(r", (?=%arg\d+: )", ins)
    outs = re.split(r", (?=tensor<)", outs)

    def kind(attributes: str) -> str:
        found = re.search(r'mhlo\.memory_kind = "([a-z_]+)"', attributes)
        return found.group(1) if found else "device"

    pairs = []
    for i, arg in enumerate(ins):
        if not (alias := re.search(r"tf\.aliasing_output = (\d+)", arg)):
            continue
        j = int(alias.group(1))
        out = outs[j] if j < len(outs) else ""
        where = re.search(r'jax\.result_info = "result([^"]*)"', out)
        pairs.append((i, kind(arg), f"output{where.group(1) if where else f' {j}'}", kind(out)))
    return pairs, len(ins)


#: an all-gather in XLA's optimized program, and the shape it makes: "%all-gather.3 =
#: f32[256,512]{1,0} all-gather(...)" (an async one: all-gather-start, its result a tuple)
_ALL_GATHER = re.compile(r"= \(?[a-z0-9]+\[[\d,]*\][^ ]*?,? ?(\w+)\[([\d,]*)\][^ ]* "
                         r"all-gather(?:-start)?\(|= (\w+)\[([\d,]*)\][^ ]* all-gather\(")


def all_gather_shapes(text: str) -> set[tuple[int, ...]]:
    """The shapes the all-gathers of an optimized HLO program make (XLA's text format is not
    an API: the apple/axlearn#993 test checks it still parses, jax 0.8.0 and 0.10.2)."""
    out = set()
    for m in _ALL_GATHER.finditer(text):
        dims = m.group(2) if m.group(2) is not None else m.group(4)
        out.add(tuple(int(d) for d in dims.split(",") if d))
    return out


_WHILE_BODY = re.compile(r"\bwhile\(.*\bbody=%([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_HLO_ARRAY = re.compile(r"\b(pred|[fsu]\d+|bf16|c64|c128|f8\w*)\[([\d,]*)\]")
_CALLED = re.compile(r"\bcalls=%([\w.\-]+)")
#: the operations XLA runs in place on a buffer: a row written, not the whole made anew
_IN_PLACE = ("dynamic-update-slice", "scatter")


_PARAMETER = re.compile(r"^\s*(?:ROOT\s+)?%(\S+) = .* parameter\((\d+)\)")
_COPY_OF = re.compile(r"\bcopy\(%([^,)\s]+)\)")
_OPERANDS = re.compile(r"%([\w.\-]+)")
_ENTRY = re.compile(r"^ENTRY %([\w.\-]+)", re.MULTILINE)


def updated_parameter_copies(text: str) -> list[tuple[int, int]]:
    """(the entry parameter's number, bytes) of each parameter of an optimized HLO program that
    its entry computation copies whole (a ``copy`` of the parameter itself) into a value an
    operation that runs in place then updates (a ``dynamic-update-slice`` or a ``scatter``, or
    a fusion whose root is one): the copy XLA makes of an argument that is not donated, whose
    buffer must stay as it was, so each call copies all of it to change a slice
    (jax-ml/jax#9132; read on the CPU, jax 0.8.0 and 0.10.2; on a GPU from XLA's copy
    insertion, xla/service/copy_insertion.cc, not yet run on a GPU). XLA's text format is not
    an API: tests check it still parses."""
    computations = _hlo_computations(text)
    entry = _ENTRY.search(text)
    params, copies, out = {}, {}, []
    for line in computations.get(entry.group(1), ()) if entry else ():
        if p := _PARAMETER.match(line):
            params[p.group(1)] = int(p.group(2))
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        opcode = m.group(5)
        if opcode == "copy" and (of := _COPY_OF.search(line)) and of.group(1) in params:
            size = math.prod(int(d) for d in m.group(4).split(",") if d)
            copies[m.group(2)] = (params[of.group(1)], size * _HLO_BYTES.get(m.group(3), 4))
            continue
        if _made_by(computations, line, opcode) in _IN_PLACE:
            operands = line.split(f" {opcode}(", 1)[-1]
            out += [copies.pop(name) for name in _OPERANDS.findall(operands)
                    if name in copies]
    return sorted(out, key=lambda x: -x[1])


def while_carry_copies(text: str, least: int) -> list[tuple[str, tuple[int, ...], int, int,
                                                       int | None, str]]:
    """(dtype, shape, bytes, copies a step, the loop's known trip count or None, the loop's
    op_name) of each carried value of ``least`` bytes or more that the body of a ``while`` in
    an optimized HLO program copies whole and then updates in place: a ``copy`` instruction
    (not one inside a fusion) whose result has the shape of an element of the body's parameter,
    in a body where a value of that shape is made by a ``dynamic-update-slice`` or a
    ``scatter`` (or a fusion whose root is one). A carry the step makes anew (a layer's
    activations) is not one. XLA's text format is not an API: tests check it still parses
    (jax 0.8.0 and 0.10.2, the CPU)."""
    computations = _hlo_computations(text)
    out = []
    for body, trips, op in _while_bodies(computations):
        carried, updated, copies = set(), set(), Counter()
        for inner in body:
            if " parameter(0)" in inner:
                carried = _carried_shapes(inner)
            elif i := _INSTRUCTION.match(inner):
                made, opcode = _shape_of(i.group(3), i.group(4)), i.group(5)
                if opcode == "copy":
                    copies[made] += 1
                if _made_by(computations, inner, opcode) in _IN_PLACE:
                    updated.add(made)
        for (dtype, dims), n in copies.items():
            size = math.prod(dims) * _HLO_BYTES.get(dtype, 4)
            if (dtype, dims) in carried & updated and size >= least:
                out.append((dtype, dims, size, n, trips, op))
    return sorted(out, key=lambda r: -r[2] * r[3])


def while_carried(text: str) -> list[tuple[str, tuple[int, ...], int]]:
    """(dtype, shape, bytes) of each value a ``while`` of an optimized HLO program carries (the
    elements of its body's parameter), largest first, each once: buffers XLA holds for the
    whole loop, which its list of the top-level values made does not show (a Krylov solver's
    basis; uwplasma/vmex#328)."""
    found = set()
    for body, _, _ in _while_bodies(_hlo_computations(text)):
        for inner in body:
            if " parameter(0)" in inner:
                found |= _carried_shapes(inner)
    return sorted(((dtype, dims, math.prod(dims) * _HLO_BYTES.get(dtype, 4))
                   for dtype, dims in found), key=lambda r: -r[2])


def _hlo_computations(text: str) -> dict[str, list[str]]:
    """Each computation of an HLO program's text, by name: its instructions' lines."""
    computations: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith(("%", "ENTRY %")) and line.rstrip().endswith("{"):
            name = line.removeprefix("ENTRY ")[1:].split(" ", 1)[0]
            computations[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            computations[name].append(line)
    return computations


def _while_bodies(computations: dict[str, list[str]]
                  ) -> Iterator[tuple[list[str], int | None, str]]:
    """(the body's lines, its known trip count or None, the while's op_name) of each
    ``while`` in the program."""
    for lines in computations.values():
        for line in lines:
            if (m := _WHILE_BODY.search(line)) and m.group(1) in computations:
                trips, op = _TRIP_COUNT.search(line), _OP_NAME.search(line)
                yield (computations[m.group(1)], int(trips.group(1)) if trips else None,
                       op.group(1) if op else "")


def _shape_of(dtype: str, dims: str) -> tuple[str, tuple[int, ...]]:
    return dtype, tuple(int(x) for x in dims.split(",") if x)


def _carried_shapes(parameter: str) -> set[tuple[str, tuple[int, ...]]]:
    """The (dtype, shape) of each element of a while body's parameter (its carry)."""
    head = parameter.split(" parameter(0)", 1)[0].split(" = ", 1)[-1]
    return {_shape_of(*a) for a in _HLO_ARRAY.findall(head)}


def _made_by(computations: dict[str, list[str]], line: str, opcode: str) -> str:
    """The opcode that makes an instruction's value: a fusion's root's, else its own."""
    called = _CALLED.search(line) if opcode == "fusion" else None
    if called is None:
        return opcode
    roots = [m.group(5) for inner in computations.get(called.group(1), ())
             if inner.lstrip().startswith("ROOT") and (m := _INSTRUCTION.match(inner))]
    return roots[0] if roots else ""


def _slice_shape(dims: tuple[int, ...], whole: tuple[int, ...]) -> bool:
    """Whether ``dims`` is the shape of a part of an array of shape ``whole``: fewer elements,
    and its dimensions other than 1 are some of the whole's, in order (a layer's K of a cache
    [1, 4, 2, 512, 4, 64] is [1, 1, 512, 4, 64])."""
    if not 0 < math.prod(dims) < math.prod(whole):
        return False
    rest = iter(d for d in whole if d != 1)
    return all(any(d == w for w in rest) for d in dims if d != 1)


#: what a slice of an array is made by (a fusion's root), before a copy of it
_SLICES = ("slice", "dynamic-slice", "bitcast")
#: what hands on its first operand, or a slice of it: a buffer followed back through these is
#: still the buffer (a dynamic-update-slice's or a scatter's first operand is the one it writes)
_PASSES = ("slice", "dynamic-slice", "bitcast", "copy", "dynamic-update-slice", "scatter")


def _operand_names(line: str, opcode: str) -> list[str]:
    """The names of an instruction's operands, in order."""
    return _OPERANDS.findall(line.split(f" {opcode}(", 1)[-1].split(")", 1)[0])


def _named(lines: list[str]) -> dict[str, re.Match]:
    """A computation's instructions of one array result, by name."""
    return {i.group(2): i for line in lines if (i := _INSTRUCTION.match(line))}


def _made_from(named_of: dict[str, dict[str, re.Match]], scopes: list[tuple[dict, list[str]]],
               name: str) -> re.Match | None:
    """The instruction a value comes from, followed back through the first operand of each
    of _PASSES, into a fusion to its root and out of a fusion's parameter to the fusion's
    operand (``named_of``: each computation's instructions by name; ``scopes``: the
    computations the value is in, outermost first, each with the operands of the fusion that
    calls it); None where the text does not say."""
    scopes = list(scopes)
    for _ in range(100_000):  # an HLO program is acyclic: the walk ends
        named, operands = scopes[-1]
        i = named.get(name)
        if i is None:
            return None
        opcode = i.group(5)
        if opcode in _PASSES and (first := _operand_names(i.string, opcode)):
            name = first[0]
        elif opcode == "parameter" and len(scopes) > 1:
            k = int(i.string.split(" parameter(", 1)[1].split(")", 1)[0])
            scopes.pop()
            if k >= len(operands):
                return None
            name = operands[k]
        elif (opcode == "fusion" and (called := _CALLED.search(i.string))
              and called.group(1) in named_of):
            inner = named_of[called.group(1)]
            roots = [root for root, r in inner.items() if r.group(1)]
            if not roots:
                return None
            scopes.append((inner, _operand_names(i.string, opcode)))
            name = roots[0]
        else:
            return i
    return None


def _element_of(made: re.Match | None, parameter: str | None
                ) -> tuple[str, tuple[int, ...]] | None:
    """The (dtype, shape) of the element of a while body's parameter an instruction reads
    (a ``get-tuple-element`` of it), else None."""
    if made is None or made.group(5) != "get-tuple-element":
        return None
    if _operand_names(made.string, "get-tuple-element") != [parameter]:
        return None
    return _shape_of(made.group(3), made.group(4))


def while_slice_copies(text: str, least: int, is_user: Callable[[str], bool]
                       ) -> list[tuple[str, tuple[int, ...], int, int, int, int, int | None,
                                       str, tuple[str, int] | None]]:
    """(dtype, the carried value's shape, its bytes, the copies of slices of it a step, the
    concatenates a step, the bytes those copy or make a step, the loop's known trip count or
    None, the loop's op_name, the user's (file, line) of the first concatenate where XLA kept
    it) of each carried value of ``least`` bytes or more that the body of a ``while`` updates
    in place (a ``dynamic-update-slice`` or ``scatter`` of its shape) while it also copies
    slices of it (a ``copy`` of a ``slice``, ``dynamic-slice`` or ``bitcast``, or of a fusion
    whose root is one) or concatenates slices of it (at the top of the body or inside a fusion
    it calls), ``least`` bytes or more a step in all: a KV cache whose layer's K and V are
    sliced out, updated and stacked back to write one row (keras-team/keras-hub#2780). Each
    copy's operand and every operand of a concatenate must come from the body parameter's
    element of the carried shape, followed back through slices, bitcasts, copies, the buffer
    an in-place update writes and a fusion's parameters (_made_from): an RNN that writes its
    state into a carried output buffer and concatenates [x, h] is not one. XLA's text format
    is not an API: tests check it still parses (jax 0.8.0 and 0.10.2, the CPU)."""
    computations = _hlo_computations(text)
    tables = _tables(text.splitlines())
    out = []
    named_of = {name: _named(lines) for name, lines in computations.items()}
    for body, trips, op in _while_bodies(computations):
        named = _named(body)
        scope = [(named, [])]
        carried, updated, param = set(), set(), None
        # (kind, shape, line, where each operand comes from)
        made: list[tuple[str, tuple[str, tuple[int, ...]], str, list[re.Match | None]]] = []
        for line in body:
            if " parameter(0)" in line:
                carried = _carried_shapes(line)
                param = _line_name(line)
            if not (i := _INSTRUCTION.match(line)):
                continue
            shape, opcode = _shape_of(i.group(3), i.group(4)), i.group(5)
            if _made_by(computations, line, opcode) in _IN_PLACE:
                updated.add(shape)
            if opcode == "copy":
                source = _operand_names(line, opcode)
                of = named.get(source[0]) if source else None
                if of is not None and _made_by(computations, of.string, of.group(5)) in _SLICES:
                    made.append(("copy", shape, line,
                                 [_made_from(named_of, scope, source[0])]))
            elif opcode == "concatenate":
                made.append(("concatenate", shape, line,
                             [_made_from(named_of, scope, name)
                              for name in _operand_names(line, opcode)]))
            elif called := _CALLED.search(line) if opcode == "fusion" else None:
                fused = [*scope, (named_of.get(called.group(1), {}),
                                  _operand_names(line, opcode))]
                made += [("concatenate", _shape_of(c.group(3), c.group(4)), c.string,
                          [_made_from(named_of, fused, name)
                           for name in _operand_names(c.string, "concatenate")])
                         for c in fused[-1][0].values() if c.group(5) == "concatenate"]
        for dtype, whole in sorted(carried & updated):
            size = math.prod(whole) * _HLO_BYTES.get(dtype, 4)
            mine = [(kind, dims, line) for kind, (t, dims), line, ends in made
                    if t == dtype and _slice_shape(dims, whole) and ends
                    and all(_element_of(end, param) == (dtype, whole) for end in ends)]
            moved = sum(math.prod(dims) * _HLO_BYTES.get(dtype, 4) for _, dims, _ in mine)
            if size < least or moved < least:
                continue
            joins = [line for kind, _, line in mine if kind == "concatenate"]
            out.append((dtype, whole, size, len(mine) - len(joins), len(joins), moved, trips,
                        op, _source(joins[0], tables, is_user) if joins else None))
    return sorted(out, key=lambda r: -r[5])


#: XLA's mark on a collective its SPMD partitioner inserted (seen from jax 0.11.2's XLA; 0.10.2's
#: text has none)
_SPMD_GENERATED = 'is_spmd_generated="true"'


def _line_name(line: str) -> str:
    return line.split(" = ", 1)[0].strip().removeprefix("ROOT ").lstrip("%")


def _needed_by(computations: dict[str, list[str]], lines: list[str], name: str,
               depth: int = 0) -> str | None:
    """The line of the first instruction that reads the value ``name`` and carries XLA's
    op_name, followed through instructions without one and through a tuple into the body of
    the ``while`` it starts (the body's get-tuple-element of the same index); None where none
    is found. What an all-gather XLA's partitioner inserted was made for: from jax 0.11.2's
    XLA such a gather carries its operand's metadata (the value gathered, or none for an
    argument) where 0.10.2's carried that of the instruction that needed it whole (a
    jax.debug.print, a dynamic_slice: measured on the CPU, jax-ml/jax#25842, apple/axlearn#993)."""
    reads = re.compile(rf"%{re.escape(name)}(?![\w.\-])")
    for line in lines:
        if " = " not in line or not reads.search(line.split(" = ", 1)[1]) or depth > 8:
            continue
        if _OP_NAME.search(line):
            return line
        user, tupled = _line_name(line), _tuple_results(line)
        if tupled is None or tupled[2] != "tuple":
            if found := _needed_by(computations, lines, user, depth + 1):
                return found
            continue
        places = [i for i, op in enumerate(_operand_names(line, "tuple")) if op == name]
        loop = re.compile(rf"\bwhile\(%{re.escape(user)}\)")
        for other in lines if places else ():  # (the name matched outside the operands: none)
            if loop.search(other) and (m := _WHILE_BODY.search(other)) \
                    and (body := computations.get(m.group(1))):
                param = next((_line_name(b) for b in body if " parameter(0)" in b), None)
                for index in places:
                    element = next((_line_name(b) for b in body if param and re.search(
                        rf"get-tuple-element\(%{re.escape(param)}\), index={index}\b", b)),
                        None)
                    if element and (found := _needed_by(computations, body, element,
                                                        depth + 1)):
                        return found
    return None


def entry_values(hlo_text: str, is_user: Callable[[str], bool]) -> list[dict]:
    """The values an optimized executable materializes between its top-level instructions
    (its candidates for temporary buffers), largest first: name, dtype, shape, bytes, XLA's
    op_name, and the user's (file, line) where the program text records it. Parameters and
    the result are left out. XLA's text format is not an API: tests check it still parses."""
    lines = hlo_text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("ENTRY"))
    except StopIteration:
        return []
    tables = _tables(lines)
    computations = _hlo_computations(hlo_text)
    entry = _ENTRY.search(hlo_text)
    entry = entry.group(1) if entry else ""
    out = []
    skip = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        m = _INSTRUCTION.match(line)
        if m:
            root, name, opcode = m.group(1), m.group(2), m.group(5)
            results = [(m.group(3), m.group(4))]
        elif t := _tuple_results(line):  # several results, each a buffer of its own
            root, name, opcode, results = t
            if opcode not in _OWN_RESULTS:
                continue
        else:
            continue
        if root or opcode in skip:
            continue
        if opcode == "all-gather" and _SPMD_GENERATED in line:  # named by what needed it
            line = _needed_by(computations, computations.get(entry, []), name) or line
        op = _OP_NAME.search(line)
        op = _unescaped(op.group(1)) if op else opcode
        target = _TARGET.search(line)
        for i, (dtype, shape) in enumerate(results):
            size = _HLO_BYTES.get(dtype)
            if size is None:
                continue
            dims = tuple(int(d) for d in shape.split(",") if d)
            # a cuBLAS call's last result, s8, is its workspace (xla/service/gpu/transforms/
            # gemm_rewriter.cc adds it): scratch for the library, not a value of the step
            workspace = (len(results) > 1 and i == len(results) - 1 and dtype == "s8"
                         and target is not None and "cublas" in target.group(1))
            out.append({"name": name if len(results) == 1 else f"{name}[{i}]", "dtype": dtype,
                        "shape": dims, "nbytes": math.prod(dims) * size,
                        "op": f"{op} (cuBLAS workspace)" if workspace else op,
                        "source": _source(line, tables, is_user)})
    return sorted(out, key=lambda v: -v["nbytes"])


_OPERANDS = re.compile(r"%([\w.\-]+)")


_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations|true_computation|"
                    r"false_computation)=\{?([%\w.\-, ]+)\}?")


def _reaching(hlo_text: str, lines: list[str], computations: dict[str, list[str]],
              output: str) -> set[str]:
    """The names of the instructions whose values reach an element of the entry's ROOT of type
    ``output`` ("f64[1024]"), walking back through operands; a called computation (a fusion's,
    a loop's body) counts whole once its caller is reached."""
    defined = {}
    for line in lines:
        if (m := _INSTRUCTION.match(line)) or (m := _TUPLE_HEAD.match(line)):
            defined[m.group(2)] = line
    entry = _ENTRY.search(hlo_text)
    entry = computations.get(entry.group(1) if entry else "", [])
    root = next((line for line in entry if line.lstrip().startswith("ROOT")), "")
    m = _INSTRUCTION.match(root)
    if m and f"{m.group(3)}[{m.group(4)}]" == output:
        todo = [m.group(2)]
    else:
        todo = [n for n in _OPERANDS.findall(root.split("(", 2)[-1]) if (i := _INSTRUCTION.match(
            defined.get(n, ""))) and f"{i.group(3)}[{i.group(4)}]" == output]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defined:
            continue
        seen.add(name)
        line = defined[name]
        head = _INSTRUCTION.match(line) or _TUPLE_HEAD.match(line)
        args = line[head.end():].split("), ", 1)[0] if head else ""
        todo.extend(_OPERANDS.findall(args))
        for called in _CALLS.findall(line):
            for comp in re.findall(r"[\w.\-]+", called):
                todo.extend(m.group(2) for c in computations.get(comp, [])
                            if (m := _INSTRUCTION.match(c) or _TUPLE_HEAD.match(c)))
    return seen


def integer_widenings(hlo_text: str, wide: str, is_user: Callable[[str], bool],
                      output: str | None = None) -> list[tuple[str, int]]:
    """The user's (file, line) of each ``convert`` in an optimized program that makes ``wide``
    (an XLA element type: "f64") from an integer (s32, u8, ...), in the program's order, each
    once: an integer array meeting a Python float makes jnp's default float there, float64
    under x64 (google-deepmind/optax#1051: ``0.9 ** (count + 1)`` of an int32 step count).
    ``output`` ("f64[1024]"): only converts whose values reach a result of that type (a metric's
    mean of integer labels, returned beside, is not the state's cause: a review). XLA's text
    format is not an API: tests check it still parses."""
    lines = hlo_text.splitlines()
    tables = _tables(lines)
    types = {m.group(2): m.group(3) for line in lines if (m := _INSTRUCTION.match(line))}
    reach = (None if output is None else
             _reaching(hlo_text, lines, _hlo_computations(hlo_text), output))
    out: list[tuple[str, int]] = []
    for line in lines:
        m = _INSTRUCTION.match(line)
        if not m or m.group(3) != wide or m.group(5) != "convert":
            continue
        if reach is not None and m.group(2) not in reach:
            continue
        args = line[m.end():].split(")", 1)[0]
        operand = next(iter(_OPERANDS.findall(args)), "")
        if types.get(operand, "")[:1] in ("s", "u"):  # s32, u8, ...: XLA's integer types
            where = _source(line, tables, is_user)
            if where is not None and where not in out:
                out.append(where)
    return out


# --- compiles: JAX's cache-miss explanations and its compile events ------------------------
#: jax.monitoring's event for one XLA compile; its ``fun_name`` is "jit(f)" (0.8.0 and 0.10.2)
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: recorded only when a program is loaded from the persistent compilation cache, inside the
#: COMPILE_EVENT that then follows on the thread (jax/_src/compiler.py, compile_or_get_cached;
#: 0.8.0 and 0.10.2 alike)
CACHE_LOAD_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"
#: how each of JAX's explanations starts when ``jax_explain_cache_misses`` is on
CACHE_MISS_PREFIX = "TRACING CACHE MISS"
#: what JAX says of each program it writes, or does not write, to the persistent compilation
#: cache: at WARNING while jax_explain_cache_misses is on and a cache folder is set, else at
#: DEBUG (jax/_src/compiler.py and compilation_cache.py; 0.8.0 and 0.10.2 alike). The reasons,
#: keyed as CompileLog.cache_skipped keys them
_CACHE_WRITES = (
    ("written", re.compile(r"^Writing (\S+) to persistent compilation cache")),
    ("quicker than jax_persistent_cache_min_compile_time_secs",
     re.compile(r"^Not writing persistent cache entry for '([^']*)' because it took <")),
    ("uses host callbacks",
     re.compile(r"^Not writing persistent cache entry for '([^']*)' because it uses host")),
    ("smaller than jax_persistent_cache_min_entry_size_bytes",
     re.compile(r"^Not writing persistent cache entry with key .* since its size()")),
    ("not process 0", re.compile(r"^Not writing persistent cache entry since process_id()")),
    ("no cache", re.compile(r"^Not writing persistent cache entry with key .* since cache is "
                            r"disabled()")),
)
#: the other lines JAX logs at WARNING about the persistent cache only because
#: jax_explain_cache_misses is on (which compiles.watch turns on): kept from the user's stderr
CACHE_EXPLAINED_PREFIXES = ("Not writing persistent cache entry", "PERSISTENT COMPILATION CACHE "
                            "MISS", "Writing ")


def parse_cache_write(message: str) -> tuple[str, str] | None:
    """("written", program) or (why it was not written, program or "") for one of JAX's lines
    on writing the persistent compilation cache; None for any other line."""
    for outcome, pattern in _CACHE_WRITES:
        m = pattern.match(message)
        if m:
            return outcome, m.group(1)
    return None


#: the logger that says, at DEBUG (WARNING with jax_log_compiles), what each compile lowers:
#: "Compiling jit(f) with global shapes and types (ShapedArray(float32[3]),). Argument
#: mapping: (UnspecifiedValue,)." (jax/_src/interpreters/pxla.py; 0.8.0 and 0.10.2 alike)
COMPILING_LOGGER = "jax._src.interpreters.pxla"
_COMPILING = re.compile(r"^Compiling (\S+) with global shapes and types (.*)\. "
                        r"Argument mapping: (.*)\.$", re.S)


def parse_compiling(text: str) -> tuple[str, str, str] | None:
    """(the function's name as jax.monitoring gives it, e.g. "jit(f)"; the argument types;
    their shardings) of one "Compiling ..." log line; None for any other line."""
    m = _COMPILING.match(text)
    return (m.group(1), m.group(2), m.group(3)) if m else None

_MISS_AT = re.compile(r"^TRACING CACHE MISS at (.+?):(\d+)(?::\d+)? \(")
_NEVER_SEEN = re.compile(r"never seen function:\s*\n\s*(\S+) id=\d+ defined at (.+?):(\d+)")
_SEEN_FOR = re.compile(r"\bfor (\S+) defined at (.+?):(\d+)")
_URL = re.compile(r"https?://\S+")  # 0.10.2 glues a link to the end of a type change
_TYPE_CHANGE = re.compile(r"\* at (.+?), now (.+?) and before (.+?)$", re.M)
#: "f32[4, 8]" of "f32[4, 8]{weak_type=True}": the dtype, its memory space where not the device's
#: ("i32<host>[]": JAX's str_short_aval, 0.8.0 and 0.10.2 alike), the dimensions, each with the
#: axes it is split over on a mesh of Explicit axes (f32[8@x,4])
_BASE_TYPE = re.compile(r"^(\w+)(<\w+>)?\[((?:\d+(?:@(?:\w+|\([\w,\s]*\)))?|[,\s])*)\]")
_STATIC_NEW = re.compile(  # 0.10: the "before" value runs to the Static's own closing bracket
    r"Static\(val=(.*?)\) and before .*?Static\(val=(.*)\)(?:, so |\s*$)")  # (0.11: the kit's)
_STATIC_OLD = re.compile(  # 0.8 (keywords: "now {m: 3} and before {m: 1}")
    r"different value of static (?:args|kwargs):\s*now (.*?) and before (.*)")
_SETTING = re.compile(r"\* (\w+) differs: now (.*?) and before (.*)$", re.M)  # 0.10
_SETTING_AT = re.compile(r"\[(\d+)\]: now (.*?) and before (.*)$", re.M)  # 0.8: a position
#: "* at input path [0][0], now <class 'M'> with pytree metadata (0.5,) and before ... (1.25,),
#: so the pytree node metadata does not match": the place and all of "now ..." (its commas too)
_PYTREE_CHANGE = re.compile(r"\* at (.+?), now (.+?)(?:, so |$)", re.M)
_KEYS = re.compile(r"symmetric difference of key sets: (\{.*?\})")


def weak_type_only(now: str, before: str) -> bool:
    """Two types that differ only in their weak type ("i32[]{weak_type=False}", "i32[]{...
    True}")."""
    a, b = _BASE_TYPE.match(now.strip()), _BASE_TYPE.match(before.strip())
    return bool(a and b and a.groups() == b.groups() and "weak_type" in now + before)


def memory_spaces_only(now: str, before: str) -> tuple[str, str] | None:
    """The memory spaces ("host", "device") of two types that differ only in theirs
    ("i32<host>[]" against "i32[]": a memory kind of the sharding, pinned_host against device);
    None where anything else differs too, or nothing does."""
    now, before = now.strip(), before.strip()
    a, b = _BASE_TYPE.match(now), _BASE_TYPE.match(before)
    if not (a and b) or a.group(2) == b.group(2) or (a.group(1), a.group(3), now[a.end():]) != (
            b.group(1), b.group(3), before[b.end():]):
        return None
    return ((a.group(2) or "<device>")[1:-1], (b.group(2) or "<device>")[1:-1])


def _type_change(now: str, before: str) -> str:
    """ "new shapes", "new dtypes" or "new sharding" (its memory kind too: "i32<host>[]") for
    one argument's change of type."""
    a, b = _BASE_TYPE.match(now), _BASE_TYPE.match(before)
    if not (a and b):
        return "new dtypes"
    if a.group(1) != b.group(1) or weak_type_only(now, before):
        return "new dtypes"
    same = _SPLIT_OVER.sub("", a.group(3)) == _SPLIT_OVER.sub("", b.group(3))
    return "new sharding" if same else "new shapes"  # (f32[8@x] against f32[8]: split anew)


def unregister_duration_listener(callback: Callable) -> None:
    """Stop a jax.monitoring duration listener (public in newer JAX, private in 0.8)."""
    public = getattr(_import("jax.monitoring"), "unregister_event_duration_listener", None)
    (public or verify("unregister_duration_listener"))(callback)


@contextlib.contextmanager
def jit_cache_clears(note: Callable[[str], None]) -> Iterator[bool]:
    """While the block runs, ``note("jit(f).clear_cache()")`` is called at each jitted
    function's ``clear_cache()``, before JAX's own; yields False (and notes nothing) where this
    JAX has no ``jit_evict_fn``.
    jit() sets the class's ``clear_cache`` from the module's function on every call, so both
    are replaced, and both put back."""
    evict = _get("jit_evict_fn")
    if evict is None:
        yield False
        return
    pjit = _import("jax._src.pjit")
    cls = type(_import("jax").jit(_same))

    def counted(self, *args, **kwargs):
        note(f"jit({getattr(self, '__name__', 'f')}).clear_cache()")
        return evict(self, *args, **kwargs)

    pjit.jit_evict_fn = cls.clear_cache = counted
    try:
        yield True
    finally:
        pjit.jit_evict_fn = cls.clear_cache = evict


def _same(x):
    return x


#: the first line of the kit's explanation of new static values on jax 0.11 and later (its
#: lines below it are worded as jax 0.10.2's, which :func:`parse_cache_miss` reads)
STATIC_VALUES_EXPLAINED = ("different static values (added by helpers.compiles: this JAX's "
                           "explanation leaves them out):")


@contextlib.contextmanager
def static_values_explained() -> Iterator[bool]:
    """While the block runs, JAX's explanation of a tracing cache miss names the static
    arguments whose values differ from the closest earlier call's, where JAX would say only
    "cache miss explanation unavailable" (jax 0.11 and later: its cache keys hold each static
    argument in a FlatTree leaf whose pytree structure is a plain leaf, so comparing the keys'
    structures finds nothing). Yields False, and changes nothing, on a JAX without that key."""
    diff, static = _get("tracing_cache_key_diff"), _get("static_argument_leaf")
    if diff is None or not isinstance(static, type):
        yield False
        return
    module = _import("jax._src.interpreters.partial_eval")

    def explained(new_key, old_key):
        found = diff(new_key, old_key)
        if found[0] < 4:  # JAX explained it (a setting, the structure, the types)
            return found
        try:  # (a key of another form, a value whose repr raises: JAX's own words stand)
            changed = _static_differences(new_key[1][0], old_key[1][0], static, "")
            lines = [f"  * at input path {path}, now Static(val={_short_repr(now)}) and before "
                     f"Static(val={_short_repr(before)}), so jit traces anew"
                     for path, now, before in changed]
        except Exception:
            return found
        if not changed:
            return found
        return (1, len(changed), "\n".join([STATIC_VALUES_EXPLAINED, *lines]))

    module.diff_tracing_cache_keys = explained
    try:
        yield True
    finally:
        module.diff_tracing_cache_keys = diff


def _short_repr(value: Any) -> str:
    """repr(value), cut to 300 characters (a static value can be a whole model)."""
    import reprlib

    r = reprlib.Repr()
    r.maxother = r.maxstring = 300
    return r.repr(value)


def _static_differences(new, old, static: type, path: str) -> list[tuple[str, Any, Any]]:
    """(input path, value now, value before) of each static argument that differs between two
    of jax 0.11's argument FlatTrees, found the way jit compares them (FTStatic's ==); paths as
    jax 0.10.2 wrote them ("[0][1]": the second positional argument; "[1]['n']": keyword n)."""
    if isinstance(new, static) and isinstance(old, static):
        return [] if new == old else [(path, new.val, old.val)]
    a, b = _flat_tree_parts(new), _flat_tree_parts(old)
    if a is None or b is None or [k for k, _ in a] != [k for k, _ in b]:
        return []
    return [d for (key, x), (_, y) in zip(a, b, strict=True) for d in
            _static_differences(x, y, static, path + key)]


def _flat_tree_parts(tree) -> list[tuple[str, Any]] | None:
    """The parts of a jax 0.11 FlatTree tuple (``elts``) or dict (``keys``, ``_vals``), each
    with its place ("[1]", "['n']"); None for any other node."""
    if isinstance(getattr(tree, "elts", None), tuple):
        return [(f"[{i}]", part) for i, part in enumerate(tree.elts)]
    keys, parts = getattr(tree, "keys", None), getattr(tree, "_vals", None)
    if isinstance(keys, tuple) and isinstance(parts, tuple):
        return [(f"[{k!r}]", part) for k, part in zip(keys, parts, strict=False)]
    return None


def scan_counts(params: Mapping) -> tuple[int, int]:
    """A ``scan`` equation's numbers of constants and of carried values (its inputs are the
    constants, then the carry, then the xs; its outputs the carry, then the ys). Up to jax 0.10
    they are the params ``num_consts`` and ``num_carry``; from jax 0.11 the params hold
    ``ft_in``, a FlatTree of (constants, carry, xs), whose parts JAX itself counts with len()
    (jax-ml/jax commit 08958bd, "Use FlatTree to structure scan arguments"; first seen failing
    on the H100 with jax 0.11.2, 2026-11-27)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = (len(part) for part in params["ft_in"].unpack())
    return consts, carry


def deleted_argument_error() -> str:
    """What this JAX raises when a jitted function is passed an array already deleted (donated
    to an earlier call, or .delete()). Measured on the CPU (flatironinstitute/jaxmg#29): jax
    0.8.0 and 0.10.2 raise RuntimeError "Array has been deleted" from a function not run
    before, but a jitted call already run hands the buffer to XLA from its C++ fast path and
    fails there (ValueError, INVALID_ARGUMENT); jax 0.11.2's fast path leaves that call to the
    Python path, whose check raises the RuntimeError too."""
    if jax_version_tuple() >= (0, 11):  # (measured on 0.11.2 and 0.12.0.1, on the CPU)
        return ('RuntimeError "Array has been deleted", measured on the CPU, not yet run on a '
                'GPU')
    return ('RuntimeError "Array has been deleted", or, from a jitted call it has run before, '
            'INVALID_ARGUMENT "Buffer has been deleted or donated"')


def wraps_jaxpr(jaxpr: Any) -> bool:
    """``jaxpr`` is a ClosedJaxpr wrapping an open Jaxpr (its ``.jaxpr``), as up to jax 0.10.
    From jax 0.11 the two are one class (jax.extend.core.ClosedJaxpr is Jaxpr, which holds its
    ``consts``) and ``.jaxpr`` returns the jaxpr itself: a reader that unwraps until no
    ClosedJaxpr is left never stops (measured on jax 0.11.2; 0.10.2 and 0.8.0 keep two
    classes)."""
    from jax.extend import core

    return core.ClosedJaxpr is not core.Jaxpr and isinstance(jaxpr, core.ClosedJaxpr)


def compiled_function_name(fun_name: str) -> str:
    """ "f" from a compile event's "jit(f)" (nested names such as "jit(jit(f))" unwrap too)."""
    while fun_name.startswith("jit(") and fun_name.endswith(")"):
        fun_name = fun_name[4:-1]
    return fun_name


def _where(filename: str, lineno: str) -> str:
    return frames.where(filename, int(lineno))


#: the same arguments passed by keyword in one call and by position in another (jax#523):
#: 0.8.0 "key with different number of args and kwargs, but same total number. now 1 args and
#: kwargs with keys ['p'] before 1 args and kwargs with keys []"; 0.10.2 "at input path [0],
#: now tuple of length 1 and before tuple of length 2 ... at input path [1], ... dict ...
#: symmetric difference of key sets: {'p'}"
_KWARGS_08 = re.compile(r"different number of args and kwargs, but same total number\.\s*now "
                        r"\d+ args and kwargs with keys (\[[^\]]*\])\s*before \d+ args and "
                        r"kwargs with keys (\[[^\]]*\])")
_KWARGS_010 = re.compile(r"at input path \[0\], now tuple of length (\d+) and before tuple of "
                         r"length (\d+).*?at input path \[1\], now <class 'dict'>.*?key sets: "
                         r"(\{[^}]*\})", re.S)


def _keyword_moved(clean: str) -> str:
    """ "'p' by keyword in one call, one more argument by position in another" where JAX's
    miss says so (both wordings); "" otherwise. JAX's text does not say which parameter the
    positional argument was: it may be another one than the keyword's."""
    if m := _KWARGS_08.search(clean):
        now, before = (set(ast.literal_eval(g)) for g in m.groups())
        keys = sorted(now ^ before)
    elif m := _KWARGS_010.search(clean):
        keys = sorted(ast.literal_eval(m.group(3)))
    else:
        return ""
    return (f"{', '.join(map(repr, keys))} by keyword in one call, as many arguments by position "
            "in another")


def cache_miss_files(text: str) -> tuple[str, str]:
    """The files, as JAX wrote them, of one "TRACING CACHE MISS" explanation's call site and of
    the function's definition ("" where it does not say): what
    :func:`parse_cache_miss` shortens to "file.py:12", for telling the user's from a
    library's."""
    at = _MISS_AT.match(text)
    if not at:
        return "", ""
    clean = _URL.sub("", text)
    seen = _NEVER_SEEN.search(clean) or _SEEN_FOR.search(clean)
    return at.group(1), seen.group(2) if seen else ""


def parse_cache_miss(text: str) -> Mapping | None:
    """One of JAX's "TRACING CACHE MISS" explanations as fields (None for any other line): the
    function, where it was called and defined, the cause (the kit's words for JAX's), what
    changed (``new_types``: each argument's new type, for new shapes, dtypes or shardings;
    ``before_types``: the earlier compile's each was compared with), and the text. Read on
    JAX 0.8.0 and 0.10.2, whose wordings differ."""
    at = _MISS_AT.match(text)
    if not at:
        return None
    clean = _URL.sub("", text)
    called = _where(at.group(1), at.group(2))
    seen = _NEVER_SEEN.search(clean) or _SEEN_FOR.search(clean)
    function, defined = (seen.group(1), _where(seen.group(2), seen.group(3))) if seen else (
        "", "")
    changed, cause, new_types, before_types = "", "other", (), ()
    if "never seen function" in clean:
        cause = "function made anew" if "same line" in clean else "first compile"
    elif "racing context" in clean:  # "Tracing context doesn't match" / "different tracing..."
        cause = "a changed setting"
        changed = "; ".join([f"{n}: now {a}, before {b}" for n, a, b in _SETTING.findall(clean)]
                            or [f"setting {i} of config.trace_context(): now {a}, before {b}"
                                for i, a, b in _SETTING_AT.findall(clean)])
    elif m := (_STATIC_NEW.search(clean) or _STATIC_OLD.search(clean)):
        cause, changed = "new static values", f"now {m.group(1)}, before {m.group(2).strip()}"
    elif moved := _keyword_moved(clean):  # (0.8.0 words it so; 0.10.2 as a new pytree)
        cause, changed = "new pytree structure", moved
    elif "different input types" in clean and (types := _TYPE_CHANGE.findall(clean)):
        kinds = [_type_change(now.strip(), before.strip()) for _, now, before in types]
        cause = kinds[0]
        new_types = tuple(f"{name}: {now.strip()}" for (name, now, _), kind
                          in zip(types, kinds, strict=True) if kind == cause)
        before_types = tuple(f"{name}: {before.strip()}" for (name, _, before), kind
                             in zip(types, kinds, strict=True) if kind == cause)
        # the change shown: one of the cause's kind, a real dtype change before a weak type's
        ours = [t for t, kind in zip(types, kinds, strict=True) if kind == cause]
        name, now, before = next((t for t in ours if not weak_type_only(t[1], t[2])), ours[0])
        changed = f"{name}: now {now.strip()}, before {before.strip()}"
    elif "different input pytree" in clean:
        cause = "new pytree structure"
        keys = _KEYS.search(clean)
        where = _PYTREE_CHANGE.search(clean)
        changed = (f"keys added or removed: {keys.group(1)}" if keys else
                   f"{where.group(1)}: now {where.group(2)}" if where else "")
    return {"function": function, "called_at": called, "defined_at": defined, "cause": cause,
            "changed": changed, "new_types": new_types, "explanation": text,
            "before_types": before_types}


# --- transfers: the guard's log and the explicit-transfer scopes ----------------------------
#: A transfer-guard log line as JAX 0.8-0.10 write it (C++ log on fd 2), e.g.
#: "host-to-device transfer: aval=ShapedArray(float32[3]), dst_sharding=SingleDeviceSharding(
#: device=CpuDevice(id=0), ...)". Not a documented format: tests check it still parses.
GUARD_LINE = re.compile(r"(host-to-device|device-to-device|device-to-host) transfer:(.*)$")
#: an aval's dtype and dimensions; a mesh of Explicit axes (jax.make_mesh's default from jax 0.9)
#: writes the axes each dimension is split over after it: float32[8@x,4@y,6], float32[8@(x,y)]
_AVAL = re.compile(r"aval=ShapedArray\((\w+)\[((?:\d+(?:@(?:\w+|\([\w,\s]*\)))?|[,\s])*)\]")
_SPLIT_OVER = re.compile(r"@(?:\w+|\([\w,\s]*\))")
_SRC = re.compile(r"(?<!dst_)sharding=\w+\(device=(\w+?)Device\(id=(\d+)\)")
_DST = re.compile(r"dst_sharding=\w+\(device=(\w+?)Device\(id=(\d+)\)")
_DIRECTIONS = {"host-to-device": "host->device", "device-to-device": "device->device",
               "device-to-host": "device->host"}
#: a destination split over a mesh: "dst_sharding=NamedSharding(mesh=Mesh('d': 4, axis_types=
#: (Auto,)), spec=P('d',), memory_kind=device)" (0.10; 0.8 writes PartitionSpec('d',)). JAX
#: logs one such line per device, each with the whole array's aval: the piece is the shard.
_DST_MESH = re.compile(r"dst_sharding=NamedSharding\(mesh=Mesh\(([^)]*?)"
                       r"(?:, axis_types=\([^)]*\))?\), spec=(?:P|PartitionSpec)\((.*?)\)"
                       r"(?=, memory_kind=|\)\s*$)")
_MESH_AXIS = re.compile(r"'([^']+)': (\d+)")


#: a destination in XLA's own notation, as a pmap's (0.8.0) or a jit of one logs it:
#: "dst_sharding=GSPMDSharding({devices=[4,1,1]<=[4]}, memory_kind=device)", the tiles per
#: dimension, then how devices fill them (an iota "<=[4]" or a list "0,2,1,3")
_DST_TILES = re.compile(r"dst_sharding=GSPMDSharding\(\{devices=\[([\d,]+)\]"
                        r"(?:<=\[[\d,]+\](?:T\([\d,]+\))?|[\d,]+)([^}]*)\}")


def _tiled_shape(rest: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Each device's piece where the destination is a GSPMDSharding of tiles; None where it is
    not one or cannot be read (subgroups other than a replicated last dimension)."""
    m = _DST_TILES.search(rest)
    if m is None:
        return None
    tiles, extra = [int(n) for n in m.group(1).split(",")], m.group(2)
    if "last_tile_dim_replicate" in extra and len(tiles) == len(shape) + 1:
        tiles = tiles[:-1]
    elif extra.strip(" ,"):
        return None
    if len(tiles) != len(shape):
        return None
    return tuple(-(-n // t) for n, t in zip(shape, tiles, strict=True))


def _shard_shape(rest: str, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Each device's piece of an array of ``shape`` whose destination is a NamedSharding or a
    GSPMDSharding of tiles the line spells out; None where it is not one or cannot be read."""
    if shape is None:
        return None
    m = _DST_MESH.search(rest)
    if m is None:
        return _tiled_shape(rest, shape)
    sizes = {name: int(n) for name, n in _MESH_AXIS.findall(m.group(1))}
    try:
        spec = ast.literal_eval(f"[{m.group(2)}]")
    except (ValueError, SyntaxError):  # an entry such as P.UNCONSTRAINED
        return None
    if len(spec) > len(shape):
        return None
    piece = list(shape)
    for i, entry in enumerate(spec):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        if not all(a in sizes for a in axes):
            return None
        piece[i] = -(-shape[i] // math.prod(sizes[a] for a in axes))
    return tuple(piece)


def _device_name(match) -> str | None:
    return f"{match.group(1).lower()}:{match.group(2)}" if match else None


def parse_guard_line(line: str) -> Mapping | None:
    """The fields of one guard log line, or None when the line is not one: direction, dtype,
    shape (None when not logged), the piece of it the line moves where the destination is split
    over a mesh (``shard_shape``, else None), source and destination device names (None when
    not logged), and the raw text from the direction on."""
    m = GUARD_LINE.search(line)
    if not m:
        return None
    rest = m.group(2)
    aval = _AVAL.search(rest)
    shape = dtype = None
    if aval:
        dtype = aval.group(1)
        dims = _SPLIT_OVER.sub("", aval.group(2))
        shape = tuple(int(x) for x in dims.replace(" ", "").split(",") if x)
    return {"direction": _DIRECTIONS[m.group(1)], "dtype": dtype, "shape": shape,
            "shard_shape": _shard_shape(rest, shape),
            "source": _device_name(_SRC.search(rest)),
            "destination": _device_name(_DST.search(rest)), "raw": line[m.start():].strip()}


#: JAX's host callbacks, each by the internal that runs it on every call and device_puts the
#: call's arguments to the CPU first (jax/_src/debugging.py, jax/_src/callback.py: 0.8.0 and
#: 0.10.2 alike), and the name the user wrote
CALLBACK_IMPLS = {"debug_callback_impl": "jax.debug.callback",
                  "pure_callback_impl": "jax.pure_callback",
                  "io_callback_impl": "io_callback"}


@functools.cache
def _callback_codes() -> dict:
    codes = {}
    for name, public in CALLBACK_IMPLS.items():
        try:
            codes[verify(name).__code__] = public
        except Exception:  # moved: its copies are named as any device_put's
            pass
    return codes


def running_callback(most: int = 8) -> str | None:
    """The host callback ("jax.debug.callback", "jax.pure_callback", "io_callback") whose
    copy of its arguments is being made, when one of JAX's callback internals is among the
    ``most`` innermost frames of this thread; else None."""
    codes = _callback_codes()
    frame = sys._getframe(1)
    for _ in range(most):
        if frame is None:
            return None
        if frame.f_code in codes:
            return codes[frame.f_code]
        frame = frame.f_back
    return None


def running_callback_site(most: int = 32) -> tuple[str, Any, Any] | None:
    """(the host callback's name as :func:`running_callback` gives it, its function: the
    ``callback`` local of JAX's callback internal, the same object as its equation's
    ``callback`` parameter, and the closed jaxpr of the jitted program it runs in, or None
    where no frame of ``_pjit_call_impl_python`` is among the ``most`` innermost) of the host
    callback running on this thread; None where none is (jax 0.8.0 and 0.10.2 alike)."""
    codes = _callback_codes()
    program = getattr(_get("pjit_call_impl_python"), "__code__", None)
    frame, found = sys._getframe(1), None
    for _ in range(most):
        if frame is None:
            break
        if found is None and frame.f_code in codes:
            found = (codes[frame.f_code], frame.f_locals.get("callback"))
        elif found is not None and frame.f_code is program:
            return (*found, frame.f_locals.get("jaxpr"))
        frame = frame.f_back
    return None if found is None else (*found, None)


def put_of_arrays(most: int = 4) -> bool:
    """Whether the jax.device_put among the ``most`` innermost frames of this thread was given
    jax.Arrays only (a copy or a reshard of arrays already on devices), no host data: read from
    its ``x`` (jax/_src/api.py's device_put, jax 0.8.0 to 0.12.0.1). False where none is."""
    frame = sys._getframe(1)
    for _ in range(most):
        if frame is None:
            return False
        if frame.f_code.co_name == "device_put" and frame.f_globals.get(
                "__name__") == "jax._src.api":
            import jax

            leaves = jax.tree_util.tree_leaves(frame.f_locals.get("x"))
            return bool(leaves) and all(isinstance(leaf, jax.Array) for leaf in leaves)
        frame = frame.f_back
    return False


@contextlib.contextmanager
def explicit_scopes_marked(write: Callable[[str], None], begin: str, end: str,
                           of_arrays: str = "", guard: str | None = None) -> Iterator[bool]:
    """While active, JAX's explicit device_put/device_get scopes call ``write(begin)`` on entry
    (``begin`` followed by the callback's name where a host callback copies its arguments:
    :func:`running_callback`; then ``of_arrays`` where a jax.device_put was given jax.Arrays:
    :func:`put_of_arrays`) and ``write(end)`` on exit. Yields False (and marks nothing) when
    JAX moved the scopes.

    ``guard``: the transfer-guard level a host callback's copy runs under where its thread has
    none set. XLA runs a callback on a thread of its own where it runs the program on several
    devices (seen with jax 0.10.2: threads "Dummy-2" to "Dummy-4"), and ``jax.transfer_guard``
    sets the level of the thread that entered it only, so that copy went unlogged."""
    import jax

    def unguarded() -> bool:  # no level set on this thread, nor process-wide
        return all(getattr(jax.config, f"jax_transfer_guard_{d}", None) is None
                   for d in ("host_to_device", "device_to_device", "device_to_host"))
    try:
        config = _import("jax._src.config")
        originals = {name: getattr(config, name) for name in
                     ("explicit_device_put_scope", "explicit_device_get_scope")}
    except Exception:
        yield False
        return

    def wrap(original):
        @contextlib.contextmanager
        def scope(*args, **kwargs):
            callback = running_callback()
            level = guard if callback and guard and unguarded() else None
            write(begin + (callback or "")
                  + (of_arrays if of_arrays and put_of_arrays() else ""))
            try:
                with jax.transfer_guard(level) if level else contextlib.nullcontext(), \
                        original(*args, **kwargs):
                    yield
            finally:
                write(end)
        return scope

    for name, original in originals.items():
        setattr(config, name, wrap(original))
    try:
        yield True
    finally:
        for name, original in originals.items():
            setattr(config, name, original)


# --- what the allocator variables were when each backend started --------------------------
#: Read by jaxlib when the GPU backend starts; changing them later has no effect.
ALLOCATOR_VARS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)
#: the XLA_PYTHON_CLIENT_PREALLOCATE values that turn preallocation off: exactly what jaxlib
#: compares against (any other value, "FALSE" included, leaves it on)
PREALLOCATE_OFF = ("false", "False", "0")
#: the GPU pool's fraction of the card when no variable sets one (XLA's GpuAllocatorConfig)
DEFAULT_MEM_FRACTION = 0.75
#: the smallest pool fraction the kit sets for a child: JAX's own start-up needs room in it
MIN_MEM_FRACTION = 0.005

# Filled by a JAX backend-initialisation hook installed when helpers is imported before any
# backend starts. If helpers came later, we cannot know, and say so.
_lock = threading.Lock()
_at_start: dict[str, dict[str, str | None]] = {}
_hook_state = "not installed"
_x64_seen: list[bool] = []  # jax_enable_x64 when the first backend started, as the hook saw it
_started_at: list[str] = []  # the first backend's start: the line outside JAX that caused it
_started_importing: list[bool] = []  # whether that line ran inside an import (a module's body)


#: What the hook records when a backend starts: the allocator variables, and the other
#: variables read once at start (XLA's flags, the number of CPU devices).
STARTUP_VARS = (*ALLOCATOR_VARS, "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")


def _on_backend_start(client) -> None:  # called by JAX with the new client
    snapshot = {name: os.environ.get(name) for name in STARTUP_VARS}
    try:
        x64 = bool(sys.modules["jax"].config.jax_enable_x64)
    except Exception:  # pragma: no cover - a JAX without the option
        x64 = None
    at, importing = "", False
    try:  # the innermost frame outside JAX, jaxlib and the kit: a user's line or a library's
        frame = sys._getframe(1)
        while frame is not None and _jax_or_kit(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            at = frames.line(frame.f_code.co_filename, frame.f_lineno)
        outer = frame
        while outer is not None and not importing:  # Python's import machinery outside it
            importing = outer.f_code.co_filename.startswith("<frozen importlib")
            outer = outer.f_back
    except Exception:  # pragma: no cover - never break JAX's start over a line
        at = ""
    with _lock:
        _at_start.setdefault(str(client.platform), snapshot)
        if x64 is not None and not _x64_seen:
            _x64_seen.append(x64)
        if at and not _started_at:
            _started_at.append(at)
            _started_importing.append(importing)


_KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the helpers package


def _jax_or_kit(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return any(p in ("jax", "jaxlib", "jax_plugins") for p in parts) or \
        os.path.abspath(path).startswith(_KIT + os.sep) or path.startswith("<frozen")


def started_at() -> str:
    """The line outside JAX and the kit whose JAX operation started this process's first
    backend ("fakelib.py:4: jax.devices()"), as the backend-start hook saw it; "" where it saw
    none (helpers imported late, or a JAX without the hook)."""
    ensure_hook()
    with _lock:
        return _started_at[0] if _started_at else ""


def started_importing() -> bool:
    """Whether the line :func:`started_at` names ran inside an import (a module's body, or a
    default argument made as its function was defined: huggingface/diffusers#1794)."""
    ensure_hook()
    with _lock:
        return bool(_started_importing and _started_importing[0])


def ensure_hook() -> None:
    """Install the hook once, if JAX is imported (never importing it: the doctor's parent and
    the CLI must work where ``import jax`` fails). Every kit module that imports JAX calls
    this right after, so the hook is in place before the user's first JAX operation."""
    global _hook_state
    with _lock:
        if _hook_state == "not installed" and "jax" in sys.modules:
            _hook_state = on_backend_start(_on_backend_start)


class _WhenJaxImports:
    """A finder on ``sys.meta_path`` that runs :func:`ensure_hook` as soon as ``jax`` has been
    imported, by whoever imports it: a library imported after ``from helpers import
    settings`` whose import starts a backend (huggingface/diffusers#1794: a scheduler's
    default argument, ``key=jax.random.PRNGKey(0)``, started JAX's GPU backend, 75% of the
    card, in a PyTorch program) is then seen, where the kit's own modules import JAX only
    when first asked. It finds nothing itself: it asks the finders after it for jax's spec
    and wraps that spec's ``exec_module``; it leaves ``sys.meta_path`` once jax's module has
    run, not before: a library asks ``importlib.util.find_spec("jax")`` before it imports
    it (diffusers' and transformers' availability checks), a spec never loaded (a review)."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module) -> None:
            run(module)
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)  # jax is imported: nothing more to wait for
            try:
                ensure_hook()
                settle_trace_context()
            except Exception:  # never break the user's import of jax
                pass

        try:
            loader.exec_module = exec_module
        except Exception:  # a loader that takes no attribute: JAX imports as it would
            pass
        return spec


def hook_when_jax_imports() -> None:
    """Install the backend-start hook now if JAX is imported, else as soon as it is (a finder
    on ``sys.meta_path``, :class:`_WhenJaxImports`). ``import helpers`` calls it."""
    if "jax" in sys.modules:
        ensure_hook()
        settle_trace_context()
    elif not any(isinstance(f, _WhenJaxImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenJaxImports())


def settle_trace_context() -> None:
    """Import ``jax.extend`` now, which the kit's tools import later: on jax 0.12 it imports
    Pallas, whose two settings join every jit's tracing context, so a function traced before
    that import traced again at its first call after it, and ``compiles.watch`` (which
    imports it at the block's end) blamed "a changed setting" for a function warmed up
    before the block (a new user's trial, jax 0.12.0.1: 51 context values, then 53). Done
    as soon as JAX is imported, no trace of the user's comes before it. Never raises."""
    try:
        importlib.import_module("jax.extend")
    except Exception:  # an old or partial JAX: the kit imports what it finds later
        pass


def backend_start_snapshot() -> tuple[str, dict[str, dict[str, str | None]]]:
    """(state, {platform: {var: value at backend start}}).

    state is "installed" (values are exact), "late" (helpers was imported after JAX started
    its backends, values unknown), "unavailable" (this JAX has no hook: before 0.10.2) or
    "not installed" (JAX is not imported).
    """
    ensure_hook()
    with _lock:
        return _hook_state, {k: dict(v) for k, v in _at_start.items()}


def x64_at_start() -> bool | None:
    """Whether 64-bit types (jax_enable_x64) were on when this process's first JAX backend
    started, before any array could be made, as the backend-start hook saw it; None where the
    hook saw no start (helpers imported late, or a JAX without the hook: before 0.10.2, and
    from 0.11, where the kit cannot tell and preflight's x64 note says "may")."""
    ensure_hook()
    with _lock:
        return _x64_seen[0] if _x64_seen else None


#: JAX's bool_env (jax/_src/config.py): the words it reads as true and as false; any other
#: value raises at import
BOOL_TRUE = ("y", "yes", "t", "true", "on", "1")
BOOL_FALSE = ("n", "no", "f", "false", "off", "0")


def ahead_of_time(frame: Any) -> bool:
    """The compile running under ``frame`` was asked for ahead of time, by a Lowered's
    ``compile()`` (jax.jit(f).lower(x).compile(): jax/_src/stages.py), not by a call."""
    import os

    tail = os.path.join("jax", "_src", "stages.py")
    while frame is not None:
        code = frame.f_code
        if code.co_name == "compile" and code.co_filename.endswith(tail):
            return True
        frame = frame.f_back
    return False


def under_vmap(frame: Any) -> bool:
    """A function jax.vmap made runs on the stack from ``frame`` outward (its wrapper, vmap_f in
    the file of jax.vmap itself, jax/_src/api.py on jax 0.8.0 to 0.11.2): the user's code under
    it is batched, and compiled only where a jit is outside it too."""
    import inspect

    import jax

    vmap = inspect.unwrap(jax.vmap)  # under JAX's traceback-filtering wrapper
    where = getattr(getattr(vmap, "__code__", None), "co_filename", None)
    return _frame_running(frame, "vmap_f", where) is not None


def config_global(name: str, default: Any = None) -> Any:
    """A JAX config option's process-wide value, not one a ``with jax.<option>(...)`` block
    (the kit's own ``jax.explain_cache_misses(True)`` among them) sets for this thread
    (jax/_src/config.py: each option's holder's ``get_global``); ``jax.config.values`` where
    this JAX has no holder."""
    import jax

    holder = getattr(jax.config, "_value_holders", {}).get(name)
    try:
        return holder.get_global() if holder is not None else jax.config.values.get(
            name, default)
    except Exception:  # a holder of another kind
        return jax.config.values.get(name, default)


def x64_asked(env: Mapping[str, str]) -> bool:
    """Whether ``env``'s JAX_ENABLE_X64 asks for 64-bit types, as JAX's bool_env reads it."""
    return env.get("JAX_ENABLE_X64", "").strip().lower() in BOOL_TRUE


def import_jax():
    """``import jax`` for a kit module that imports it late (inside a function), with the hook
    in place before the caller's first JAX operation can start a backend."""
    import jax

    ensure_hook()
    return jax


ensure_hook()
