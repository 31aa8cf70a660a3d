"""The kit inside IPython and Jupyter: ``%load_ext helpers``.

- **Your own OOM, explained**: when a cell raises XLA's RESOURCE_EXHAUSTED, the usual traceback
  is followed by :func:`helpers.oom.explain`'s answer, read while the arrays are still alive:
  the request, the pool, who holds the largest arrays (by name), where they were made, and the
  likely fixes, ranked; a sharding error, a CUDA library that could not start, and
  ``jnp.from_dlpack`` of a read-only NumPy array, each with its cause and fix. Other errors are
  shown as usual.
- ``%%memory``: runs the cell and shows, per device and for the host, the bytes before, after
  and at the peak, the copies the cell made, and its compiles, with the cause and the fix for
  any function it compiled more than once, and any line of a Python loop that dispatches JAX
  operations one by one, reads a jax.Array one element at a time, waits for each step, or
  times a step by its dispatch, with earlier work, or with its result thrown away
  (:class:`CellMemory`).
- ``%timeit`` of a jitted call that nothing waits for: a note with the fix, before it runs.

``%unload_ext helpers`` takes them away again.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from helpers._internal import frames
from helpers._internal.records import Display, Record
from helpers.units import NotAvailable

__all__ = ["EAGER_RUNS", "TIMED_RUNS", "TIMEIT_NOTE", "WAITED_RUNS", "CellDevice", "CellMemory",
           "load", "unload"]


@dataclass(frozen=True)
class CellDevice(Record):
    """One device's bytes in use around a cell: before, after, and the highest sampled."""

    device: str
    before: int
    after: int
    peak: int  # the allocator's high-water mark where it rose in the cell, else the highest sample
    source: str  # "allocator" or "live arrays"
    #: the peak is the allocator's own high-water mark (it rose during the cell: exact), not a
    #: sample every 10 ms, which misses an array made and dropped between two samples
    peak_exact: bool = False


@dataclass(frozen=True)
class CellMemory(Display):
    """What one cell did to memory (``%%memory``): per device and for the host, before, after
    and peak, the copies it made (the transfer guard's log, summed), and its compiles
    (:func:`helpers.compiles.watch`: how many, and a sentence per function compiled again)."""

    devices: tuple[CellDevice, ...]
    host_before: int
    host_after: int
    host_peak: int | NotAvailable  # the kernel's RSS high-water mark over the cell (Linux)
    transfers: tuple[Mapping[str, Any], ...]  # TransferLog.summary() rows
    seconds: float  # the cell's wall time, with the kit's line tracer on (slower Python code)
    failed: bool  # the cell raised
    compiles: int = 0  # XLA compiles during the cell
    recompiled: tuple[str, ...] = ()  # the cause and the fix, per function compiled again
    #: live arrays still being computed (asynchronous dispatch) when the cell began, and when
    #: it ended: work queued before it, and work it queued and did not wait for
    pending_before: int = 0
    pending_after: int = 0
    #: (line, times it ran, its calls into JAX outside jit) of each line that ran, or ran a
    #: comprehension's items, ``EAGER_RUNS`` times or more and called JAX twice or more each
    #: time, most calls first: operations dispatched one by one from a Python loop
    #: (jax-ml/jax#968)
    eager_lines: tuple[tuple[str, int, int], ...] = ()
    #: (line, times it ran, its reads that waited for the last work queued, the reads that
    #: waited which were looked at) of each line that ran ``WAITED_RUNS`` times or more, on
    #: half of its loop's passes or more, and did so on half of the reads looked at: a loop
    #: that waits for each step before queuing the next (poets-ai/elegy#141)
    waited_lines: tuple[tuple[str, int, int, int], ...] = ()
    #: (line, times it ran, its reads back to Python) of each line of ``eager_lines`` that also
    #: reads a JAX value back on every run (bool(), float(), a Python if): jit cannot trace it,
    #: so the fix is NumPy for what the loop only reads (micdoh/XLRON#27)
    read_back_lines: tuple[tuple[str, int, int], ...] = ()
    #: how often the devices were sampled: a sampled peak misses what lived between two samples
    sample_seconds: float = 0.01
    #: (callback, copies, why) per host callback whose copies of its arguments are among the
    #: copies: JAX device_puts them on every call (liesel-devs/liesel#282)
    callback_copies: tuple[tuple[str, int, str], ...] = ()
    #: (line, times it ran, its waits that found a value still being computed and left nothing
    #: computing, the waits that found one) of each line that waits with block_until_ready as
    #: ``waited_lines`` read: a loop that blocks on each step keeps JAX from queuing the next
    #: (AI-Hypercomputer/maxtext#1956)
    blocked_lines: tuple[tuple[str, int, int, int], ...] = ()
    #: (line, times it ran, the runs that found an array still being computed, the runs looked
    #: at) of each line that reads the clock (time.time(), time.perf_counter()) in a loop, on
    #: half of its runs looked at while JAX work was still being computed, a timer's start
    #: left out (``timer_starts_early`` reads those): it times the dispatch, not the work
    #: (p-doom/jasmine#43)
    timed_lines: tuple[tuple[str, int, int, int], ...] = ()
    #: (function, where it is defined, seconds of JAX's tracing and lowering and XLA's
    #: compiling) of each function the cell compiled for the first time: the call that did it
    #: took those seconds more than the later ones (Physical-Intelligence/openpi#271)
    first_compiles: tuple[tuple[str, str, float], ...] = ()
    #: the cell reads the clock (a line of time.time() or time.perf_counter(), %timeit) or a
    #: first call took ``SLOW_FIRST_CALL`` seconds or more to compile: only then does the text
    #: name ``first_compiles`` with the fix, time the calls after the first (a cell that only
    #: calls a function once gets a compile, and needs no advice on timing it)
    first_call_timed: bool = False
    #: (function, where it is defined, seconds, why) of each function compiled again in a cell
    #: that reads the clock: its compile is inside the time measured (a warm-up with other
    #: static values: QuantEcon/lecture-python.myst#663)
    compiled_again_timed: tuple[tuple[str, str, float, str], ...] = ()
    #: (line, times it ran, the timed runs it started while an array was still being computed,
    #: with a wait before the timer's end and no array at the end still being computed that
    #: the start did not find, the timed runs looked at, the names of those arrays, ", "-joined)
    #: of each timer's start (``t0 = time.time()``, ended by ``time.time() - t0``) that did so
    #: as ``timed_lines`` read: the wait inside waited for the earlier work too, so the time is
    #: too long (jax-ml/jax#1219)
    timer_starts_early: tuple[tuple[str, int, int, int, str], ...] = ()
    #: (line, times it ran, the runs between two clock reads of its frame that threw away the
    #: result of a jitted function or JAX operation, nothing waiting after it, the call's text)
    #: of each line that did so on half of its runs or more: the time read after it measures
    #: the dispatch (jax-ml/jax#1219)
    untimed_calls: tuple[tuple[str, int, int, str], ...] = ()
    #: the lines of ``timed_lines`` whose timer brackets a loop of the same function, start and
    #: end run as often: a per-epoch time, named however few its runs against the inner loop's
    #: passes (jax-ml/jax#1797)
    timed_loops: tuple[str, ...] = ()
    #: (line, times it ran, its reads of one element of a jax.Array, x[i]) of each line that
    #: read ``EAGER_RUNS`` elements or more and is not in ``eager_lines`` or
    #: ``read_back_lines``: each read is its own operation (jax-ml/jax#390)
    element_lines: tuple[tuple[str, int, int], ...] = ()
    #: (line, times it ran, the name it rebinds, that array's bytes after the cell) of each
    #: line that ran twice or more and rebinds a name to an ``.at[...]`` update of itself
    #: (``param = param.at[e].set(w)``), the array 1 MiB or more: outside jit each run copies
    #: the whole array to write a part of it, old and new alive together
    #: (vllm-project/tpu-inference#1748)
    rebuilt_lines: tuple[tuple[str, int, str, int], ...] = ()
    #: the cell's first line that stops a jax.profiler trace (stop_trace(), or the end of a
    #: ``with jax.profiler.trace(...)`` block), "" where none: work still queued when the trace
    #: stops is not in it (jax-ml/jax#38518)
    profiler_stop: str = ""


def _profiler_stop(cell: str) -> str:
    """The cell's last statement where it stops a jax.profiler trace (a stop_trace() call, or a
    ``with jax.profiler.trace(...)`` block), as written; "" otherwise: work queued after the
    stop is not the trace's (a review), nor is a comment (jax-ml/jax#38518)."""
    import ast

    try:
        body = ast.parse(cell).body
    except SyntaxError:
        return ""
    if not body:
        return ""
    last = body[-1]
    calls = ([last.value] if isinstance(last, ast.Expr) else
             [item.context_expr for item in last.items] if isinstance(last, ast.With) else [])
    for call in calls:
        func = call.func if isinstance(call, ast.Call) else None
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("stop_trace", "trace") and (name == "stop_trace" or "profiler" in (
                ast.get_source_segment(cell, func) or "")):
            text = ast.get_source_segment(cell, last) or ""
            return text.splitlines()[0].strip() if text else ""
    return ""


#: how often ``%%memory`` samples the devices (and the host, where /proc has no sampler of it)
SAMPLE_SECONDS = 0.01
#: a line that runs this many times in a cell, calling JAX outside jit twice or more each time,
#: is a Python loop of operations dispatched one by one
EAGER_RUNS = 100
#: a line that runs this many times, waiting on half of them for a value still being computed,
#: is a loop that keeps the host from queuing work ahead
WAITED_RUNS = 10
#: a line that reads the clock this many times, every time while JAX work was still being
#: computed, times the dispatch, however few the runs (Physical-Intelligence/openpi#271: four
#: timed calls, each found work still being computed)
TIMED_RUNS = 3
#: a first call that spent this many seconds tracing, lowering and compiling is slow enough to
#: be noticed with no clock read: %%memory names it with the fix (Physical-Intelligence/openpi
#: #271: 'inference takes over 10 seconds')
SLOW_FIRST_CALL = 1.0
#: a cell's text that reads the clock, where the line tracer followed nothing
_CLOCK_TEXT = re.compile(r"perf_counter|monotonic|(?<![\w.])time\.time|^[ \t]*%%?timeit\b",
                         re.M)


def load(ip: Any) -> None:
    """Register the OOM explanation and ``%%memory`` with an IPython shell."""
    import jax
    from IPython.core.magic import Magics, cell_magic, magics_class

    from helpers._internal import jaxcompat

    jaxcompat.ensure_hook()  # before the notebook's first JAX operation starts a backend
    ip.set_custom_exc((jax.errors.JaxRuntimeError, *jaxcompat.sharding_error_types(),
                       BufferError, AttributeError, TypeError, AssertionError, RuntimeError,
                       IndexError),  # (pmap's own over a scalar leaf: google/flax#2120)
                      _on_jax_error)

    @magics_class
    class MemoryMagics(Magics):
        @cell_magic
        def memory(self, line: str, cell: str) -> CellMemory:
            """%%memory: the cell's device and host bytes before, after and at the peak, the
            copies it made, and its compiles (each function compiled again, with the fix)."""
            return _run_measured(self.shell, cell)

    ip.register_magics(MemoryMagics)
    ip.events.register("pre_run_cell", _before_cell)


def unload(ip: Any) -> None:
    """Take the handler, the magic and the %timeit check away again."""
    ip.set_custom_exc((), None)
    ip.magics_manager.magics["cell"].pop("memory", None)
    try:
        ip.events.unregister("pre_run_cell", _before_cell)
    except ValueError:  # not registered
        pass


#: ``%timeit`` (or ``%%timeit``) and what it times, with IPython's own options in front
_TIMEIT = re.compile(r"^[ \t]*%%?timeit\b(.*)$", re.M)
_TIMEIT_OPTIONS = re.compile(r"^(?:\s*-(?:[nrp]\s*\S+|[tcqo]))*\s*")
#: the timeit module's timeit or repeat, of a lambda (its body read by _lambda_body) or a
#: statement in quotes
_TIMEIT_MODULE = re.compile(
    r"\b(?P<fn>timeit\.(?:timeit|repeat))\(\s*(?:lambda\s*:\s*(?P<call>)"
    r"|(?P<q>[\"'])(?P<stmt>[^\"']+)(?P=q))")


def _lambda_body(text: str) -> str:
    """A lambda's body from its first character: up to the comma or closing bracket at its
    own depth (``f1(w, a).sum().item()`` whole, not ``f1(w, a)``: a review)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return text[:i]
            depth -= 1
        elif ch == "," and depth == 0:
            return text[:i]
    return text
#: what the kit says under a cell that times a jitted call which does not wait (jax#1988)
TIMEIT_NOTE = (
    "JAX Device Kit: %timeit {statement}: {name} is a jitted function, and a jitted call "
    "returns before its work is done (asynchronous dispatch), so %timeit times the dispatch "
    "and its later runs wait behind the work queued by earlier ones (jax-ml/jax#1988). Time "
    "{fixed} instead: it waits for the result.")


#: what the kit says under a cell that times a function that is not jitted and makes two or
#: more jnp or jax calls (jax-ml/jax#427: sum_logistic at N=10, 15x NumPy's time; a trial:
#: 79.5 us against 4.5 us, 12.7 us jitted and blocked)
EAGER_TIMEIT_NOTE = (
    "JAX Device Kit: %timeit {statement}: {name} is not jitted, so each of its {n} jnp or jax "
    "calls is dispatched on its own, a fixed cost of microseconds each that on small arrays "
    "is far more than the arithmetic (jax-ml/jax#427). jax.jit({name}) makes them one "
    "program: time the jitted call after a first call that compiles it, with "
    ".block_until_ready() on its result.")


def _before_cell(info: Any = None) -> None:
    """Before a cell runs: the checks of its text that need no running (each never raises)."""
    _timeit_unblocked(info)
    _printed_whole(info)


#: elements from which a whole array's text is worth a word (NumPy's text of one element is
#: about ten characters, and building it costs hundreds of bytes an element: jax-ml/jax#7301)
PRINTED_WHOLE_ELEMENTS = 100_000


def _printed_whole(info: Any = None) -> None:
    """Where the cell prints an array, or shows it as its result, whole: NumPy summarizes
    (``...``) only dimensions longer than 2 x edgeitems, so an array of many short dimensions
    ([2] * 18) is written out element by element, and its text costs far more memory than the
    array (jax-ml/jax#7301: a 1 MiB array took 125.6 MiB of host memory to print, in a
    trial). Names it with the fix before the cell runs."""
    import ast

    import numpy as np

    try:
        cell = getattr(info, "raw_cell", "") or ""
        if not cell.strip() or cell.lstrip().startswith("%"):
            return
        tree = ast.parse(cell)
        names = [n.args[0].id for n in _run_here(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id == "print" and n.args
                 and isinstance(n.args[0], ast.Name)]
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Name) and \
                not cell.rstrip().endswith(";"):
            names.append(last.value.id)
        namespace = getattr(frames.ipython_shell(), "user_ns", {})
        edge = int(np.get_printoptions()["edgeitems"])
        for name in dict.fromkeys(names):
            x = namespace.get(name)
            shape = getattr(x, "shape", None)
            if not isinstance(shape, tuple) or not hasattr(x, "dtype") or \
                    math.prod(shape) < max(PRINTED_WHOLE_ELEMENTS,
                                           np.get_printoptions()["threshold"]) or \
                    any(d > 2 * edge for d in shape):
                continue
            print(f"JAX Device Kit: printing {name} ({x.dtype}{list(shape)}, "
                  f"{math.prod(shape):,} elements) writes every element: NumPy summarizes "
                  f"only dimensions longer than 2 x edgeitems ({2 * edge}), and none of "
                  f"{name}'s is, so its text is millions of characters and NumPy takes "
                  "hundreds of bytes an element to build it (jax-ml/jax#7301: a 1 MiB array "
                  f"of 18 dimensions took 125.6 MiB). Print a slice, or "
                  f"{name}.reshape(-1, {shape[-1]}) first, which NumPy summarizes.")
            return
    except Exception:  # the note must never stop a cell
        return


def _run_here(tree: Any) -> list:
    """The nodes of a cell's syntax tree that run when the cell runs: not the bodies of the
    functions, lambdas and classes it only defines (a review)."""
    import ast

    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        stack += [c for c in ast.iter_child_nodes(node) if not isinstance(
            c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))]
    return out


def _timeit_unblocked(info: Any = None) -> None:
    """Before a cell runs: where it times, with %timeit or %%timeit, one statement whose
    outermost call is a jitted function (or ``x = f(...)``) and nothing waits for the result
    (no block_until_ready), say so with the fix. Never raises."""
    try:
        cell = getattr(info, "raw_cell", "") or ""
        if "timeit" not in cell:
            return
        namespace = getattr(frames.ipython_shell(), "user_ns", {})
        for m in _TIMEIT.finditer(cell):
            statement = _TIMEIT_OPTIONS.sub("", m.group(1), count=1).strip()
            if not statement and cell[m.start():].lstrip().startswith("%%"):
                body = [x for x in cell[m.end():].strip().splitlines() if x.strip()]
                statement = body[0].strip() if len(body) == 1 else ""
            name, call = _jitted_call(statement, namespace)
            if name and "block_until_ready" not in cell:
                print(TIMEIT_NOTE.format(statement=statement, name=name,
                                         fixed=f"{call}.block_until_ready()"))
                return
            name, calls = _eager_call(statement, namespace)
            if name:
                print(EAGER_TIMEIT_NOTE.format(statement=statement, name=name, n=calls))
                return
        if "block_until_ready" in cell:
            return
        for m in _TIMEIT_MODULE.finditer(cell):  # the timeit module's (jax-ml/jax#19327)
            statement = (_lambda_body(cell[m.end("call"):]) if m.group("call") is not None
                         else m.group("stmt") or "").strip()
            name, call = _jitted_call(statement, namespace)
            if name:
                print(TIMEIT_NOTE.format(statement=statement, name=name,
                                         fixed=f"{call}.block_until_ready()")
                      .replace("%timeit " + statement, f"{m.group('fn')} of {statement}", 1)
                      .replace("%timeit", m.group("fn")))
                return
    except Exception:  # the note must never stop a cell
        return


def _outer_call(statement: str) -> Any:
    """The outermost call of a one-statement ``statement``, ``f(x)`` or ``y = f(x)``, as an
    ast.Call; None for anything else."""
    import ast

    try:
        body = ast.parse(statement).body
    except SyntaxError:
        return None
    if len(body) != 1 or not isinstance(body[0], (ast.Expr, ast.Assign)) or \
            not isinstance(body[0].value, ast.Call):
        return None
    return body[0].value


def _jitted_call(statement: str, namespace: Mapping) -> tuple[str, str]:
    """(the name of the jitted function that ``statement`` calls outermost: ``f(x)``,
    ``y = f(x)``, ``mod.f(x)`` through modules only; the call's text) or ("", "") for anything
    else."""
    import ast
    import types

    call = _outer_call(statement)
    if call is None:
        return "", ""
    parts, func = [], call.func
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in namespace:
        return "", ""
    obj = namespace[func.id]
    for part in parts:
        if not isinstance(obj, types.ModuleType):
            return "", ""  # an attribute of an object may run code to be read: not looked at
        obj = getattr(obj, part, None)
    if not (callable(obj) and hasattr(obj, "lower") and hasattr(obj, "clear_cache")):
        return "", ""
    return ".".join([func.id, *parts]), ast.get_source_segment(statement, call) or statement


def _eager_call(statement: str, namespace: Mapping) -> tuple[str, int]:
    """(the name of the plain Python function ``statement`` calls outermost, a function of the
    notebook's that is not jitted; the jnp or jax calls its source makes) where those are two
    or more, else ("", 0): each is an operation dispatched on its own (jax-ml/jax#427)."""
    import ast
    import inspect
    import textwrap
    import types

    call = _outer_call(statement)
    if call is None:
        return "", 0
    if isinstance(call.func, ast.Attribute) and call.func.attr == "block_until_ready" and \
            isinstance(call.func.value, ast.Call):  # f(x).block_until_ready(): still f's
        call = call.func.value
    if not isinstance(call.func, ast.Name):
        return "", 0
    fn = namespace.get(call.func.id)
    if not isinstance(fn, types.FunctionType) or hasattr(fn, "lower"):
        return "", 0
    inner = fn  # (a jit behind a functools.wraps decorator is jitted: a review)
    while (inner := getattr(inner, "__wrapped__", None)) is not None:
        if hasattr(inner, "lower"):
            return "", 0
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return "", 0
    ops = ("jax.numpy", "jax.nn", "jax.lax", "jax.scipy")
    calls = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        chain, head = [], node.func
        while isinstance(head, ast.Attribute):
            chain.insert(0, head.attr)
            head = head.value
        module = fn.__globals__.get(head.id) if isinstance(head, ast.Name) else None
        name = module.__name__ if isinstance(module, types.ModuleType) else ""
        # an operation of jnp, jax.nn, jax.lax or jax.scipy (not jax.device_put, a put)
        calls += name.startswith(ops) or (name == "jax" and len(chain) >= 2 and
                                          f"jax.{chain[0]}" in ops)
    return (call.func.id, calls) if calls >= 2 else ("", 0)


def _on_jax_error(shell, etype, value, tb, tb_offset=None) -> None:
    """IPython's custom exception handler: the usual traceback (shown, and kept in
    ``sys.last_traceback`` as IPython always does), then, for RESOURCE_EXHAUSTED, a CUDA
    library that could not start or a sharding error (a dimension its sharding does not
    divide, shardings mixed on a mesh of Explicit axes, an argument not on its shard_map
    in_spec, a sharding inside shard_map that meets its Manual axes), NumPy's refusal to
    export a read-only array to jnp.from_dlpack, an array in a pytree's static field
    (jax-ml/jax#24204), a pmap argument without a leading device axis (jax-ml/jax#9933), or
    ``.block_until_ready()`` asked of what is no jax.Array (a tuple of them: jax-ml/jax#3125),
    or a traced value used where Python needs a concrete one
    (:func:`helpers.trace_errors.trace_error_fix`), or the bare AssertionError of JAX_PLATFORMS=cuda
    where no NVIDIA GPU is visible, or an array used after its donation (jax-ml/jax#3412),
    the explanation; any other error passes
    with its traceback alone. Never raises (IPython would unregister it)."""
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    try:  # an error whose str() raises, say, must not unregister the handler
        _explain(shell, value)
    except Exception as err:
        print(f"(the kit could not explain this error: {type(err).__name__})")
    return None


#: JAX's error for an Array used after its buffer was donated or deleted (0.8.0 to 0.12.0.1)
_DELETED = "Array has been deleted"
#: XLA's words when x.block_until_ready() meets such a buffer (a JaxRuntimeError)
_DONATED_BUFFER = "called on deleted or donated buffer"


#: JAX's error for jax.devices("gpu") or jax.devices("cuda") with no GPU backend started
#: ("Unknown backend: 'gpu' requested, but no platforms ...", "Unknown backend cuda. ...")
_UNKNOWN_GPU = re.compile(r"^Unknown backend:? '?(gpu|cuda)\b")

#: the longest list, tuple or dict of the namespace whose leaves _deleted_fix looks at
_WALKED = 256


def _deleted_fix(namespace: dict) -> str:
    """The cause and fix for "Array has been deleted", with the notebook's names that hold a
    deleted array now (top-level names and the leaves of the pytrees they hold, five at most):
    a snapshot made as ``best = params`` or ``jnp.asarray(p)`` is the same buffers as what was
    donated (jax-ml/jax#3412)."""
    import jax

    held = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or len(held) >= 5:
            continue
        try:  # (a long list or table is not walked: a per-step history, a dataset's rows)
            if isinstance(value, (list, tuple, dict)) and len(value) > _WALKED:
                continue
            leaves = jax.tree_util.tree_leaves_with_path(value)
        except Exception:  # an object JAX cannot flatten
            continue
        for path, leaf in leaves:
            if isinstance(leaf, jax.Array) and leaf.is_deleted():
                held.append(name + jax.tree_util.keystr(path))
                break
    where = f" Deleted now: {', '.join(held)}." if held else ""
    return ("an array used after its buffer was donated to a jitted call (donate_argnums) or "
            "deleted (.delete()). The donated buffer became the call's output, and every name "
            "for it went with it: a snapshot kept as best = params or jnp.asarray(p) is the "
            "same buffers. Use the call's outputs, or keep a real copy made before the call: "
            f"jax.tree.map(jnp.copy, params) (jax-ml/jax#3412).{where}")


def _explain(shell, value: BaseException) -> None:
    """What :func:`_on_jax_error` adds under the traceback, if anything."""
    from helpers import devices, oom, trace_errors

    if isinstance(value, AssertionError):  # a user's own assert: JAX's bare one alone
        if why := _no_backend(value):
            print(f"JAX Device Kit: why JAX could not start: {why}")
        elif _NOT_THE_SAME in str(value):
            print(f"JAX Device Kit: why this put failed: {_DIFFERS_BY_PROCESS}")
        return None
    if isinstance(value, RuntimeError) and _INITIALIZE_LATE in str(value):
        print(f"JAX Device Kit: why initialize failed: {_initialize_late()}")
        return None
    if isinstance(value, RuntimeError) and _NON_ADDRESSABLE in str(value):
        print(f"JAX Device Kit: why this read failed: {_READ_ELSEWHERE}")
        return None
    if _CLOSED_NON_ADDRESSABLE in str(value):
        print(f"JAX Device Kit: why this jit failed: {_PASS_GLOBAL}")
        return None
    if oom.is_out_of_memory(value):
        explain, head = (lambda: oom.explain(value, namespace=shell.user_ns),
                         "why this cell ran out of memory")
    elif oom.is_library_failure(value):
        explain, head = (lambda: oom.explain_library_failure(value),
                         "why a CUDA library could not start")
    elif isinstance(value, RuntimeError) and (str(value).startswith(_DELETED)
                                              or _DONATED_BUFFER in str(value)):
        print(f"JAX Device Kit: why this array is gone: {_deleted_fix(shell.user_ns)}")
        return None
    elif isinstance(value, RuntimeError) and _UNKNOWN_GPU.search(str(value)):
        from helpers import gpu

        why = gpu.why_unavailable() or ("JAX's CUDA backend is installed but did not start: "
                                        "`python -m helpers doctor` shows its error")
        print(f"JAX Device Kit: why JAX has no GPU here: {why}")
        return None
    elif why := _pmap_leading_axis(value):
        print(f"JAX Device Kit: why this pmap failed: {why}")
        return None
    elif isinstance(value, ValueError) and (why := _read_only(value)):
        print(f"JAX Device Kit: why this array cannot be written: {why}")
        return None
    elif isinstance(value, ValueError) and _METADATA in str(value):
        print(f"JAX Device Kit: why this call failed: {_metadata_array_fix(value)}")
        return None
    elif isinstance(value, TypeError) and (why := _refused_dtype(value) or _foreign(value)):
        print(f"JAX Device Kit: why JAX refused this array: {why}")
        return None
    elif fix := _quietly(devices.sharding_error_fix, value):  # other ValueErrors pass
        print(f"JAX Device Kit: why this sharding failed: {fix}")
        return None
    elif fix := _quietly(trace_errors.trace_error_fix, value):  # other TypeErrors pass
        print(f"JAX Device Kit: why this did not trace: {fix}")
        return None
    elif isinstance(value, BufferError) and _READONLY_EXPORT in str(value):
        print(f"JAX Device Kit: why this conversion failed: {_READONLY_DLPACK}")
        return None
    elif isinstance(value, AttributeError) and (why := _not_an_array(value)):
        print(f"JAX Device Kit: why this wait failed: {why}")
        return None
    else:
        return None
    try:
        report = explain()
    except Exception as err:  # the explanation must never hide the error itself
        print(f"(the kit could not explain this error: {type(err).__name__}: {err})")
        return None
    from IPython.display import display

    print(f"JAX Device Kit: {head}")
    display(report)
    return None


#: JAX's words where a value put onto a sharding over every process of a job differs by process
_NOT_THE_SAME = "passed to device_put is not the same on each process"
_DIFFERS_BY_PROCESS = (
    "a jax.device_put onto a sharding over every process of the job checks that each process "
    "passed the same value, and these differ: a buffer from np.empty (its leftover bytes), an "
    "unseeded random draw, or each process's own data. Fill it the same everywhere (np.zeros, "
    "a seeded draw), or build the global array from each process's own piece with "
    "jax.make_array_from_process_local_data(sharding, local) (sgl-project/sglang-jax#155; "
    "np.copy of the buffer changes nothing).")
#: JAX's words where jax.distributed.initialize() comes after a backend started
_INITIALIZE_LATE = "jax.distributed.initialize() must be called before any JAX calls"
#: JAX's words where this process reads an array whose shards are partly other processes'
_NON_ADDRESSABLE = "Fetching value for `jax.Array` that spans non-addressable"
#: JAX's words where a jitted function closes over such an array
_CLOSED_NON_ADDRESSABLE = "Closing over jax.Array that spans non-addressable"
_PASS_GLOBAL = (
    "the jitted function closes over an array split over several processes' devices, which "
    "jit cannot bake into its program: pass it as an argument of the jitted function instead, "
    "as JAX's message says (jit takes a global array as an argument in every process).")
_READ_ELSEWHERE = (
    "this array is split over several processes' devices, and a process can read only the "
    "shards on its own (x.addressable_shards). Gather it onto every process first, "
    "jax.experimental.multihost_utils.process_allgather(x), or read this process's shards; "
    "an array meant for this process alone belongs on jax.local_devices(), not "
    "jax.devices()[0], which may be another process's (pytorch/xla#8667).")


def _initialize_late() -> str:
    """The cause and the fix of jax.distributed.initialize() called after a backend started,
    with the line that started it where the kit's hook saw it."""
    from helpers._internal import jaxcompat

    at = jaxcompat.started_at()
    by = (f", started by {at}," if at else
          " (jax.devices(), an operation, or a library that calls one as it is imported),")
    return ("a JAX backend had already started in this process" + by + " and "
            "jax.distributed.initialize() must come before it: call it first, above that "
            "line or import, then restart the kernel, since a backend once started stays "
            "(jax-ml/jax#18237).")


def _no_backend(value: AssertionError) -> str:
    """The cause and the fix of the bare AssertionError JAX's backends() raises where
    JAX_PLATFORMS asks for CUDA alone and no NVIDIA GPU is visible (jax-ml/jax#23208's
    setting); "" for any other assertion."""
    code = _innermost_code(value)
    if code is None or not code.co_filename.endswith("xla_bridge.py"):
        return ""
    from helpers import settings

    found = [w for w in settings.check_environment(this_process=False)
             if w.code == "cuda-alone-without-gpu"]
    return f"{found[0].message} Fix: {found[0].fix}." if found else ""


#: what a jax.pmap says of an argument whose leading axis is not the number of its devices,
#: by JAX's version (each run on 4 CPU devices): 0.8.0 "pmap got inconsistent sizes", 0.10.2 and
#: 0.12.0.1 a squeeze of that axis, or a sharding over the pmap's own axis it does not divide
_PMAP_AXIS = re.compile(r"pmap got inconsistent sizes for array axes|cannot select an axis to "
                        r"squeeze out|_internal_pmap_axis_name.*is partitioned \d+ times", re.S)
#: the same for a scalar leaf (a TrainState's step counter, google/flax#2120): 0.8.0 "pmap was
#: requested to map its argument along axis 0, which implies that its rank should be at least
#: 1", 0.10.2 a sharding over the pmap's own axis "only valid for values of rank at least 1" on
#: one device, and an IndexError of pmap's own _mapped_axis_size on several (0.12.0.1 too)
_PMAP_SCALAR = re.compile(r"its rank should be at least 1, but is only 0|_internal_pmap_axis_name"
                          r".*only valid for values of rank at least 1", re.S)


def _pmap_leading_axis(value: BaseException) -> str:
    """The cause and the fix of a jax.pmap given an argument without a leading axis of one
    slice per device (parameters not stacked: jax-ml/jax#9933); "" for any other error, and for
    a squeeze that did not fail inside a pmap."""
    from helpers._internal import frames

    scalar = (isinstance(value, ValueError) and _PMAP_SCALAR.search(str(value)) is not None
              or isinstance(value, IndexError) and _raised_in(value, "_mapped_axis_size"))
    # a pmap given an axis_name splits over a mesh axis of that name (jax 0.10.2 onward):
    # JAX's IndivisibleError then names no pmap, but pmap's own wrapper raised it
    # (huggingface/diffusers#880 in a new user's trial: parameters passed unreplicated were
    # told to pad a conv kernel to a multiple of the devices)
    named_axis = isinstance(value, ValueError) and "is partitioned" in str(value) and \
        frames.raised_by(value, "jax/_src/pmap.py")
    if not scalar and not named_axis and (not isinstance(value, ValueError)
                                          or not _PMAP_AXIS.search(str(value))):
        return ""
    if "squeeze" in str(value):  # also jnp.squeeze's own: only where the pmap's own call
        # raised it, no frame of the user's after its last (a squeeze inside the mapped
        # function has the user's frames after it)
        if not frames.raised_by(value, ("jax/_src/pmap.py", "jax/_src/shard_map.py")):
            return ""
    return ("a jax.pmap maps every argument over its leading axis, one slice per device "
            "(jax.local_device_count() of them), and an argument whose leading axis is not "
            "that count fails: here as JAX's version words it. Parameters not stacked one copy "
            "per device are the usual one (jax-ml/jax#9933). Pass such an argument whole to "
            "every device, jax.pmap(f, in_axes=(None, 0)) (None for it: copied to each device "
            "at every call), or stack it once, jax.tree.map(lambda a: jnp.broadcast_to(a, "
            "(jax.local_device_count(), *a.shape)), params), and pass that at every call."
            + (" Here a leaf is a scalar, with no axis at all (a training state's step "
               "counter): stack the whole state so, as flax.jax_utils.replicate(state) does "
               "(google/flax#2120)." if scalar else ""))


def _raised_in(value: BaseException, function: str) -> bool:
    """Whether the innermost frame of ``value``'s traceback is JAX's ``function``."""
    code = _innermost_code(value)
    return code is not None and code.co_name == function and "jax" in code.co_filename


def _innermost_code(value: BaseException) -> types.CodeType | None:
    """The code of the innermost frame of ``value``'s traceback: where it was raised."""
    tb = _innermost(value)
    return None if tb is None else tb.tb_frame.f_code


def _innermost(value: BaseException) -> types.TracebackType | None:
    """The innermost entry of ``value``'s traceback (its frame and line): where it was
    raised."""
    tb = value.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


#: what JAX says of a NumPy array of a dtype it has no type for (jax 0.8.0 to 0.12.0.1); under
#: jit or jnp.asarray, the cause of its "Error interpreting argument ..."
_REFUSED = re.compile(r"^Dtype (\S+) is not a valid JAX array type")


def _refused_dtype(value: BaseException) -> str:
    """Why JAX refused a NumPy array, where ``value`` or an error it was raised from says
    "Dtype |V2 is not a valid JAX array type" (placement_notes.unsupported_dtype_note), the
    array's shape read from the frames that raised it where one holds it; else ""."""
    import numpy as np

    from helpers import placement_notes

    seen = 0
    while value is not None and seen < 8:  # the error and those it was raised from
        if m := _REFUSED.match(str(value)):
            shape, tb = (), value.__traceback__
            while tb is not None:  # the innermost frame holding an array of that dtype
                for v in tb.tb_frame.f_locals.values():
                    if isinstance(v, np.ndarray) and str(v.dtype) == m.group(1):
                        shape = v.shape
                tb = tb.tb_next
            return placement_notes.unsupported_dtype_note(m.group(1), shape)
        value, seen = value.__cause__ or value.__context__, seen + 1
    return ""


#: NumPy's words for a write into a read-only array (an in-place operator, an assignment)
_READ_ONLY = ("output array is read-only", "assignment destination is read-only")
#: the name a failing line writes into: x += 1, x[0] = 1, x[:, 1] *= 2
_WRITTEN = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:[-+*/%@&|^]|//|\*\*)?=")


def _read_only(value: ValueError) -> str:
    """Why a NumPy array the failing line writes into is read-only, where it is one that
    np.asarray or jax.device_get made of a jax.Array (its buffer JAX's: a memoryview or a
    capsule under it; jax-ml/jax#7437); "" else."""
    import linecache

    import numpy as np

    if str(value) not in _READ_ONLY:
        return ""
    tb = _innermost(value)
    if tb is None:
        return ""
    frame = tb.tb_frame
    m = _WRITTEN.match(linecache.getline(frame.f_code.co_filename, tb.tb_lineno))
    x = frame.f_locals.get(m.group(1)) if m else None
    if not isinstance(x, np.ndarray) or x.flags.writeable or not (
            isinstance(x.base, memoryview) or type(x.base).__name__ == "PyCapsule"):
        return ""
    return (f"{m.group(1)} is a read-only NumPy array over a jax.Array's values: np.asarray(x) "
            "and jax.device_get(x) give one (on a CPU device, JAX's own memory, which JAX "
            "never lets change; jax-ml/jax#7437). np.array(x) makes a copy you can write.")


#: what jit says of an argument it cannot take as an array (jax 0.8.0 to 0.12.0.1)
_FOREIGN = re.compile(r"as an abstract array\. The problematic value is of type "
                      r"<class '([\w.]+)\.(\w+)'>")


def _foreign(value: BaseException) -> str:
    """Why jit refused another framework's tensor (a torch.Tensor: its class, found in its
    module, has ``__dlpack__``), where ``value`` names its class; else ""."""
    import sys

    from helpers import placement_notes

    m = _FOREIGN.search(str(value))
    kind = getattr(sys.modules.get(m.group(1)), m.group(2), None) if m else None
    if kind is None or not hasattr(kind, "__dlpack__") or m.group(1).split(".")[0] in (
            "numpy", "jax", "jaxlib"):
        return ""
    return placement_notes.foreign_tensor_fix(placement_notes.foreign_kind(kind))


#: what JAX says when a pytree's static part (its metadata) holds an array it cannot compare
_METADATA = "checking equality of metadata fields of pytree"


def _metadata_array_fix(value: ValueError) -> str:
    """The cause and the fix of jit's failed comparison of a pytree's static part: an array
    kept in a field marked static (jax-ml/jax#24204), named where a variable of the failing
    line's frame holds it (the argument, its node type, the array)."""
    from helpers import compiled
    from helpers._internal import frames

    found, tb, cells = "", value.__traceback__, []
    while tb is not None:  # the user's frames, innermost first: the call that failed
        code = tb.tb_frame.f_code.co_filename
        if frames.is_user_frame(tb.tb_frame) or code.startswith("<"):
            cells.insert(0, tb.tb_frame)
        tb = tb.tb_next
    for name, held in (item for frame in cells for item in list(frame.f_locals.items())):
        if name.startswith("_") or name in ("In", "Out"):  # IPython's history: not the call's
            continue
        try:
            kept = compiled.metadata_arrays(held)
        except Exception:  # a local that is no pytree the kit can read
            continue
        if kept:
            node, a = kept[0]
            found = (f"{name} keeps an array, {a.dtype}{list(a.shape)}, in the static part of "
                     f"its {node}. ")
            break
    del cells
    return (found + "A field marked static (dataclasses.field(metadata=dict(static=True)), "
            "flax.struct.field(pytree_node=False), an Equinox static field) is part of the "
            "pytree's metadata, which jit compares with == to find its compiled program again: "
            "for a new array of more than one element that comparison raises (for a JAX "
            "scalar too, inside another jit), and an array there is baked into the program as "
            "a constant. Make it an ordinary field, a child of the pytree, so jit traces it "
            "(jax-ml/jax#24204); where it sets a shape or a slice bound, which must stay "
            "static, keep it a Python int (int(x)), and run jax.clear_caches() once, since the "
            "cache keeps the entry keyed on the array (jax-ml/jax#28311).")


#: what NumPy says when asked for an old-style DLPack capsule of a read-only array
_READONLY_EXPORT = "Cannot export readonly array"
#: the cause and the fix of jnp.from_dlpack(a) of a read-only NumPy array (jax-ml/jax#40789):
#: jax/_src/dlpack.py calls ``__dlpack__(stream=...)`` with no ``max_version`` (jax 0.8.0 and
#: 0.10.2), so NumPy 2 gives the unversioned capsule, which has no read-only flag, and
#: refuses; both fixes checked on jax 0.8.0 and 0.10.2 (np.asarray of a CPU jax.Array: the
#: put shares its buffer)
_READONLY_DLPACK = (
    "jnp.from_dlpack asks NumPy for an old-style DLPack capsule (it passes no max_version), "
    "which cannot mark an array read-only, so NumPy refuses a read-only array: np.asarray of a "
    "jax.Array, a pandas column (jax-ml/jax#40789). Use jax.device_put(a) instead (no copy on "
    "the CPU where a is C-contiguous and aligned to 64 bytes, as np.asarray of a CPU jax.Array "
    "is), or pass the jax.Array itself.")


#: "'tuple' object has no attribute 'block_until_ready'": the type's name
_NO_WAIT = re.compile(r"^'([\w.]+)' object has no attribute 'block_until_ready'")


def _not_an_array(value: AttributeError) -> str:
    """The cause and the fix of ``.block_until_ready()`` called on what is not a jax.Array: a
    tuple, list or dict of arrays (a step's output with its state, jax-ml/jax#3125), which
    ``jax.block_until_ready`` waits for whole; None (a function with no ``return``); a NumPy
    array or a Python number, computed already; another class, which it waits for only where
    it is a registered pytree. "" for any other AttributeError, and for text."""
    found = _NO_WAIT.match(str(value))
    if not found:
        return ""
    kind = found.group(1)
    if kind == "NoneType":
        return ("the value is None, so the function that made it returned nothing (a missing "
                "return?): there is no array to wait for.")
    if kind in ("tuple", "list", "dict"):
        return (f"a {kind} has no .block_until_ready(), only each jax.Array in it has: "
                "jax.block_until_ready(x) waits for every array in a tuple, list, dict or any "
                "pytree, and returns it (jax-ml/jax#3125). Time a step with "
                "jax.block_until_ready(step(state, batch)), so that the time includes its work.")
    if kind.startswith("numpy.") or kind in ("int", "float", "bool", "complex"):
        return (f"a {kind} is no jax.Array: a NumPy or Python value is computed already, with "
                "nothing to wait for. jax.block_until_ready(x) takes it too, and returns it.")
    if kind in ("str", "bytes"):
        return ""
    return (f"an object of class {kind} has no .block_until_ready(): jax.block_until_ready(x) "
            "waits for every jax.Array in it where it is a registered pytree (a flax.struct "
            "dataclass, an Equinox Module, a NamedTuple), and returns it; an object of another "
            "class it returns without waiting.")


def _quietly(fix: Callable[[BaseException], str], value: BaseException) -> str:
    """``fix(value)`` (``devices.sharding_error_fix``, ``trace_errors.trace_error_fix``) for the
    cell's error; "" where reading it fails (the handler must never raise)."""
    try:
        return fix(value)
    except Exception:
        return ""


def _run_measured(shell, cell: str) -> CellMemory:
    import time

    from helpers import compiles, memory, transfers
    from helpers._internal import linetrace

    before = memory.snapshot()
    queued = memory.still_computing()
    t0 = time.perf_counter()
    with linetrace.follow() as followed, transfers.trace() as log, \
            memory.track(interval=SAMPLE_SECONDS) as trace, compiles.watch() as compiled:
        # a cell ending in ";" displays nothing (IPython reads that from the outer cell, the
        # magic's call): run it silent, so its value is not shown, the kit's record still is
        with _numbered_as_outer_cell(shell):
            result = shell.run_cell(cell, silent=_quiet(cell))
        left = memory.still_computing()  # at once: the kit's own wind-down takes time too
    after = memory.snapshot()
    rows = tuple(_cell_device(d, after.device(d.device), trace.peak(d.device))
                 for d in before.devices)
    peak = trace.host_peak  # the kernel's high-water mark; never shown below "after"
    if isinstance(peak, int):
        peak = max(peak, after.host.rss)
    return CellMemory(rows, before.host.rss, after.host.rss, peak,
                      tuple(log.summary()), time.perf_counter() - t0,
                      not result.success, compiled.compiles,
                      tuple(f.diagnosis for f in compiled.recompiled), queued, left,
                      *_loop_lines(followed), SAMPLE_SECONDS, _callback_copies(log),
                      *_waiting_lines(followed), *_first_compiles(compiled, followed, cell),
                      **_timers(followed), element_lines=_element_lines(followed),
                      compiled_again_timed=_compiled_again_timed(compiled, followed, cell),
                      rebuilt_lines=_rebuilt_lines(followed, shell.user_ns),
                      profiler_stop=_profiler_stop(cell))


@contextlib.contextmanager
def _numbered_as_outer_cell(shell) -> Iterator[None]:
    """Name the cell's body by the outer cell's number. IPython 9 counts a cell before it runs
    it (execution_count is already the next one), and the magic's run_cell names its code by
    that count: the kit's lines and IPython's own traceback said "Cell In[3]" in the cell shown
    as [2] (a new user's trial, IPython 9.18.1). The outer cell's number is its code's name,
    from the magic's call on the stack; only the name changes (IPython's compiler's ``cache``,
    wrapped while the body runs), never the count its display reads; IPython 8, which counts
    after, is unchanged."""
    outer = None
    frame = sys._getframe(2)
    while frame is not None:  # the outermost cell on the stack: the one the user ran (a
        try:  # helper defined in an earlier cell may call the magic; a review)
            named = shell.compile.format_code_name(frame.f_code.co_filename)
        except Exception:  # an IPython without the method
            break
        if named and (found := re.fullmatch(r"In\[(\d+)\]", str(named[1]))):
            outer = int(found.group(1))
        frame = frame.f_back
    compiler = shell.compile
    cache = getattr(compiler, "cache", None)
    if outer is None or outer == shell.execution_count or cache is None:
        yield
        return
    own = vars(compiler).get("cache")  # another tool's wrapper, put back as it was

    def named_as_outer(transformed_code, number=0, raw_code=None):
        return cache(transformed_code, outer, raw_code)

    compiler.cache = named_as_outer
    try:
        yield
    finally:
        if own is not None:
            compiler.cache = own
        else:
            with contextlib.suppress(AttributeError):
                del compiler.cache  # the class's own again


def _compiled_again_timed(compiled: Any, followed: Any, cell: str
                          ) -> tuple[tuple[str, str, float, str], ...]:
    """(function, where, seconds, cause) of each function compiled again in a cell that reads
    the clock (its compile is in the time measured), the slowest first."""
    from helpers import compiles

    clock = (any(followed.clock_reads.values()) or bool(_TIMEIT.search(cell))
             if followed is not None else bool(_CLOCK_TEXT.search(cell)))
    if not clock:
        return ()
    lines = cell.splitlines()
    first = next((i for i, x in enumerate(lines) if _CLOCK_TEXT.search(x)), len(lines))
    warmed = "\n".join(lines[:first])  # a call above the first clock read: a warm-up (a review)
    rows = [(f.function, f.place, f.compile_seconds + f.trace_seconds + f.lowering_seconds,
             f.cause) for f in compiled.functions if f.compiles
            and f.cause not in ("first compile", compiles.EAGER, compiles.UNEXPLAINED)
            and not re.search(rf"\b{re.escape(f.function)}\s*\(", warmed)]
    return tuple(sorted(rows, key=lambda r: -r[2])[:3])


def _quiet(cell: str) -> bool:
    """The cell ends in ";" (a comment after it aside): IPython then displays no value. Read
    by IPython's own test where it has one (a "#" inside a string is no comment: a review)."""
    from IPython.core.displayhook import DisplayHook

    ends = getattr(DisplayHook, "semicolon_at_end_of_expression", None)
    if ends is not None:
        try:
            return bool(ends(cell))
        except Exception:  # a cell IPython's tokenizer cannot read: its own error follows
            return False
    lines = [x for x in cell.rstrip().splitlines() if x.strip()]
    return bool(lines) and lines[-1].split("#", 1)[0].rstrip().endswith(";")


def _first_compiles(compiled: Any, followed: Any = None, cell: str = ""
                    ) -> tuple[tuple[tuple[str, str, float], ...], bool]:
    """(function, where defined, seconds of tracing, lowering and compiling) of each function
    compiled once in the cell for its first time, the slowest first; and whether the cell
    reads the clock (the line tracer's clock lines, %timeit; the cell's text where nothing was
    followed) or the slowest took ``SLOW_FIRST_CALL`` seconds or more."""
    rows = [(f.function, f.place, f.compile_seconds + f.trace_seconds + f.lowering_seconds)
            for f in compiled.functions if f.cause == "first compile" and f.compiles == 1]
    rows = tuple(sorted(rows, key=lambda r: -r[2])[:3])
    if followed is not None:
        clock = any(followed.clock_reads.values()) or bool(_TIMEIT.search(cell))
    else:
        clock = bool(_CLOCK_TEXT.search(cell))
    return rows, bool(rows) and (clock or rows[0][2] >= SLOW_FIRST_CALL)


def _callback_copies(log: Any) -> tuple[tuple[str, int, str], ...]:
    """(callback, copies, why) per host callback that copied its arguments, most first."""
    made: dict = {}
    for t in log:
        if t.made_by:
            n, _ = made.get(t.made_by, (0, ""))
            made[t.made_by] = (n + 1, t.reason)
    return tuple((name, n, why) for name, (n, why) in sorted(made.items(),
                                                               key=lambda m: -m[1][0]))


def _cell_device(before: Any, after: Any, sampled: int) -> CellDevice:
    """One device's row: where the allocator's high-water mark (``peak_bytes_in_use``, kept
    since the backend started) rose during the cell, the cell's peak is that mark, exactly;
    otherwise the highest sample, which can miss an array made and dropped between two
    (apple/axlearn#293: a tree cast on the device held both dtypes for less than a sample)."""
    rose = (isinstance(after.peak_bytes, int) and isinstance(before.peak_bytes, int)
            and after.peak_bytes > before.peak_bytes)
    peak = after.peak_bytes if rose else max(sampled, before.bytes_in_use)
    return CellDevice(before.device, before.bytes_in_use, after.bytes_in_use, peak,
                      before.source, peak_exact=rose)


def _loop_lines(followed: Any) -> tuple[tuple, tuple, tuple]:
    """(eager_lines, waited_lines, read_back_lines): the eager lines that also read a value
    back on every run are read-back lines instead. All () where another tool's tracer left
    nothing followed."""
    if followed is None:
        return (), (), ()
    eager = _eager(followed)
    reading = {where for where, n in followed.reads.items() if n >= followed.runs[where] > 0}
    return (_named([e for e in eager if e[0] not in reading]),
            _waited_lines(followed, followed.idle_reads, followed.looked),
            _named([e for e in eager if e[0] in reading]))


def _waiting_lines(followed: Any) -> tuple[tuple, tuple]:
    """(blocked_lines, timed_lines), as ``waited_lines`` for the waits with block_until_ready
    (a benchmark's waits left out: between two clock reads on half of them or more, no loop
    between) and for the lines that read the clock (a timer's start left out: its state at
    the start is ``timer_starts_early``'s; a timer around a loop named whatever its runs
    against the loop's passes). Both () where nothing was followed."""
    if followed is None:
        return (), ()
    idle = {where: n for where, n in followed.idle_blocks.items()
            if 2 * followed.timed_waits[where] < followed.blocks[where]}
    pending = {where: n for where, n in followed.clock_pending.items()
               if 2 * followed.clock_starts[where] < followed.clock_reads[where]}
    return (_waited_lines(followed, idle, followed.blocks),
            _waited_lines(followed, pending, followed.clock_reads, every_from=TIMED_RUNS,
                          loops=followed.clock_loops))


def _timers(followed: Any) -> dict:
    """CellMemory's ``timer_starts_early``, ``untimed_calls`` and ``timed_loops``; none where
    nothing was followed."""
    if followed is None:
        return {}
    early = _waited_lines(followed, followed.early_starts, followed.clock_starts,
                          every_from=TIMED_RUNS, loops=followed.clock_loops)
    names = {frames.line(*where): ", ".join(followed.early_names.get(where, ()))
             for where in followed.early_starts}
    untimed = _named([(where, followed.runs[where], n, _statement(where))
                      for where, n in followed.untimed_calls.items()
                      if 2 * n >= followed.runs[where] > 0])
    _, timed = _waiting_lines(followed)
    loops = {frames.line(*where) for where, n in followed.clock_loops.items()
             if 2 * n >= followed.runs[where]}
    return {"timer_starts_early": tuple((*row, names.get(row[0], "")) for row in early),
            "untimed_calls": untimed,
            "timed_loops": tuple(row[0] for row in timed if row[0] in loops)}


def _statement(where: tuple[str, int]) -> str:
    """The line's code, stripped of its comment where one follows."""
    import linecache

    return linecache.getline(*where).split("  #")[0].strip()


def _element_lines(followed: Any) -> tuple[tuple[str, int, int], ...]:
    """(line, times it ran, its element reads) of the lines that read ``EAGER_RUNS`` single
    elements of a jax.Array or more, those ``eager_lines`` and ``read_back_lines`` name left
    out (their fixes cover them); () where nothing was followed."""
    if followed is None:
        return ()
    eager = {where for where, *_ in _eager(followed)}
    return _named([(where, followed.runs[where], n)
                   for where, n in followed.element_reads.items()
                   if n >= EAGER_RUNS and where not in eager])


#: a line that rebinds a name (x, params['w'], m.w) to an .at[...] update of itself:
#: x = x.at[i].set(v) (.add, ...)
_REBUILT = re.compile(r"^([A-Za-z_][\w.]*(?:\[[^\]=]+\])*)\s*=\s*(.+?)\.at\[")


def _rebuilt_lines(followed: Any, namespace: Mapping) -> tuple[tuple[str, int, str, int], ...]:
    """``CellMemory.rebuilt_lines``: the lines of the cell's own code (not a function's: its
    names are not the notebook's, a review) run twice or more that rebind a name, a dict's
    entry or an attribute to an ``.at[...]`` update of itself, where it holds a jax.Array of
    1 MiB or more after the cell; () where nothing was followed."""
    import jax

    if followed is None:
        return ()
    out = []
    for where, runs in followed.runs.items():
        if runs < 2 or followed.function_of.get(where, ("", 0, ""))[2] != "<module>":
            continue
        m = _REBUILT.match(_statement(where))
        if not m or m.group(1).replace(" ", "") != m.group(2).replace(" ", ""):
            continue
        value = _resolved(m.group(1), namespace)
        if isinstance(value, jax.Array) and value.nbytes >= 2**20:
            out.append((frames.line(*where), runs, m.group(1), int(value.nbytes)))
    return tuple(sorted(out, key=lambda r: -r[1] * r[3])[:3])


def _resolved(target: str, namespace: Mapping) -> Any:
    """The value ``target`` (a name, a dict's entry by a constant key, an attribute: x,
    params['w'], m.w) holds in ``namespace``, read without running code (no property, no
    __getitem__ but a dict's); None where it cannot be read so."""
    import ast
    import inspect

    try:
        node = ast.parse(target, mode="eval").body
    except SyntaxError:
        return None

    def value(n: ast.AST) -> Any:
        if isinstance(n, ast.Name):
            return namespace.get(n.id)
        if isinstance(n, ast.Attribute):
            owner = value(n.value)
            found = inspect.getattr_static(owner, n.attr, None) if owner is not None else None
            return None if callable(getattr(found, "__get__", None)) else found
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            owner = value(n.value)
            return owner.get(n.slice.value) if isinstance(owner, dict) else None
        return None

    return value(node)


def _named(rows: list, most: int = 3) -> tuple:
    """The ``most`` rows with the most calls (their third field, first the line's key), each
    with its line of code in place of its key."""
    from helpers._internal import frames

    return tuple((frames.line(*where), *rest)
                 for where, *rest in sorted(rows, key=lambda h: -h[2])[:most])


def _waited_lines(followed: Any, found: Any, looked: Any, every_from: int | None = None,
                  loops: Any = None) -> tuple[tuple[str, int, int, int], ...]:
    """The lines that ran ``WAITED_RUNS`` times or more, on half of their loop's passes or
    more (a line read every 100 steps is not one; a line of ``loops``, a timer around an inner
    loop on half of its runs, whatever its runs), and on half of the runs ``looked`` at were
    ``found`` (a read back of a value still being computed after which nothing was, say); with
    ``every_from``, also a line that ran that many times or more and was ``found`` on every
    run, each looked at."""
    passes: dict = {}  # per function: its most-run line's runs, the loop's passes
    for where, runs in followed.runs.items():
        f = followed.function_of.get(where)
        passes[f] = max(passes.get(f, 0), runs)

    def enough(where, n) -> bool:
        runs = followed.runs[where]
        return runs >= WAITED_RUNS or (every_from is not None and runs >= every_from
                                       and n == looked[where] == runs)

    def often(where) -> bool:
        runs = followed.runs[where]
        return (2 * runs >= passes.get(followed.function_of.get(where), 0)
                or (loops is not None and 2 * loops[where] >= runs > 0))

    return _named([(where, followed.runs[where], n, looked[where])
                   for where, n in found.items()
                   if n and enough(where, n) and often(where) and 2 * n >= looked[where]])


def _eager(followed: Any) -> list[tuple[tuple[str, int], int, int]]:
    """(key, runs, calls) of the lines that ran, or ran a comprehension's items,
    ``EAGER_RUNS`` times or more and called into JAX outside jit twice or more each time."""
    passes = {where: followed.runs[where] + followed.items[where]
              for where in followed.jax_calls}
    # a lambda on the line that a library applies to each leaf (jax.tree.map): its runs are
    # the leaves, one operation each, and the line's own runs are what it does per pass
    own = {where: passes[where] - followed.lambda_runs[where] for where in followed.jax_calls}
    return [(where, own[where] if followed.lambda_runs[where] else followed.runs[where], calls)
            for where, calls in followed.jax_calls.items()
            if passes[where] >= EAGER_RUNS and (calls >= 2 * passes[where] or (
                followed.lambda_runs[where] and calls >= 2 * max(own[where], 1)))]
