"""Who holds memory: what keeps the largest live arrays alive.

:func:`largest` takes the ``n`` largest live JAX arrays (every backend) and, for each, what
refers to it, found with :func:`gc.get_referrers` one or two steps up: a variable in the
notebook (by name), IPython's output history (``Out``, ``_``, and its copies in
``user_ns_hidden``), a saved traceback (``sys.last_traceback``), a list or dict in the notebook
(with every other name of it: ``samples`` that is ``mcmc._states_flat['z']``), a closure, every
NumPy view of its buffer and every DLPack consumer of it (``np.from_dlpack``,
``torch.from_dlpack``: found by address, as nothing of theirs refers to the Array); and, further
up, an object's attribute a variable names, or a module's globals (a library's cache of
functions that close over the object). Each comes with how to let it go, and two arrays of one
CPU device with the same values in different shapes (a reshaped copy) are said to be one value
held twice. An array nothing
outside JAX refers to is counted as JAX's own (a pending computation, a jit's cache); the Arrays
JAX made over a sharded array's shards for a host read are that array's, not listed; the host
copy such a read leaves on an array is named with its fix, and the bytes only reference cycles
hold are in the header whatever ``n`` is. It also
counts the compiled programs JAX keeps loaded, and arrays of a backend JAX restarted. The search
is bounded in time and keeps no reference to any array once it returns.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from helpers._internal import frames, jaxcompat
from helpers._internal.jaxcompat import device_name
from helpers._internal.records import Display, Record
from helpers.errors import BadInputError
from helpers.units import NOT_AVAILABLE, NotAvailable

__all__ = ["HeldArray", "Holders", "largest"]


@dataclass(frozen=True)
class HeldArray(Record):
    """One live array and what keeps it alive: names in the notebook, IPython's output history,
    a saved traceback, a container or a closure (``held_by``), and how to let it go."""

    array: str  # "float32[1024, 1024] on cpu:0"
    nbytes: int
    held_by: tuple[str, ...]  # one line each; () when only JAX itself holds it
    fix: str
    #: bytes of the host copy JAX keeps on it since a read on the host made one (np.asarray,
    #: jax.device_get, print of a sharded array), for as long as it lives (jax-ml/jax#26216)
    host_copy: int = 0


@dataclass(frozen=True)
class Holders(Display):
    """Who holds device memory now: the largest live arrays and what keeps each alive, the
    compiled programs JAX keeps loaded, and bytes the user holds versus JAX alone."""

    arrays: tuple[HeldArray, ...]  # largest first
    live_arrays: int  # how many live arrays there are in all
    live_bytes: int  # of every live array, each buffer once (two Arrays over one buffer: once)
    user_bytes: int  # of the arrays looked at: held by something outside JAX
    jax_bytes: int  # of the arrays looked at: no reference outside JAX and the kit
    executables: int | NotAvailable  # compiled programs loaded
    #: their generated code; NOT_AVAILABLE where every one is the CPU backend's, which does
    #: not report it (XLA gives 0, jax 0.8.0 and 0.10.2), as ``StepPreflight.code_bytes``
    executable_code_bytes: int | NotAvailable
    seconds: float  # how long the search took
    complete: bool  # False: the time budget ran out before every array was looked at
    #: when there are very many tiny live arrays: how many, the most common kind, and the fix
    many_small: str = ""
    #: trees of arrays alike (the same keys, shapes and dtypes, different buffers) held under
    #: different names: (the names, the bytes of each), largest first (transformers#15766: a
    #: random init beside the loaded weights)
    alike: tuple[tuple[tuple[str, ...], int], ...] = ()
    #: (program name, how many loaded, the array constants they hold together) for the
    #: compiled programs JAX keeps that hold 1 MiB of constants or more, largest first: each
    #: compile of a function (a new static value, a new shape) keeps its own copy of an array
    #: it closes over or makes with NumPy (jax-ml/jax#10878)
    program_constants: tuple[tuple[str, int, int], ...] = ()
    #: of the arrays looked at: kept by a library's module-level state (a cache of functions
    #: that close over an object of the user's: numpyro's, pyro-ppl/numpyro#1115), not by a
    #: name of the user's nor by JAX alone
    library_bytes: int = 0
    #: arrays of a backend JAX restarted (JAX's private clear_backends(), jax-ml/jax#10828),
    #: which jax.live_arrays() no longer lists: how many, their bytes and what to do; ""
    restarted: str = ""
    #: of ``live_arrays``: Arrays JAX made over a sharded array's shards when it was read on the
    #: host (np.asarray, jax.device_get, str): views of its buffers, not counted in
    #: ``live_bytes`` nor listed, freed with it (jax-ml/jax#26216)
    shard_views: int = 0
    #: of every live array: the host copies JAX keeps on them since a read on the host
    host_copy_bytes: int = 0
    #: of every live array, looked at or not: held only by reference cycles nothing reaches,
    #: which Python's cycle collector frees at its next run (keras-team/keras#19110: which of
    #: arrays of one size ``n`` shows is chance); never in ``user_bytes``
    cycle_bytes: int = 0
    #: the host copies' sentence: how many, their bytes, why they stay, and the fix; ""
    host_copies: str = ""
    #: of ``executables``: the CPU backend's, whose generated code is not reported (not in
    #: ``executable_code_bytes``)
    cpu_executables: int = 0
    #: the programs one jitted function keeps, one per shape or static value it met, where they
    #: are many (:data:`MANY_PROGRAMS`): how many, its name and the fix; "" (jax-ml/jax#16778)
    many_programs: str = ""
    #: of the arrays looked at: held only by IPython, its output history (``Out``, ``_``:
    #: ``%reset -f out``) or its record of the last cell run (the next cell lets it go): not in
    #: ``user_bytes``, as no name of the user's holds them
    history_bytes: int = 0


def largest(n: int = 5, *, namespace: Mapping | None = None, seconds: float = 2.0) -> Holders:
    """What keeps the ``n`` largest live arrays alive, found with :func:`gc.get_referrers`
    (bounded by ``seconds``; no reference is kept afterwards). ``namespace``: where to find
    variable names, default the notebook's (``__main__``, IPython's ``user_ns``).

    >>> h = largest(2)
    >>> h.live_arrays >= len(h.arrays)
    True
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadInputError(f"n must be a positive int, got {n!r}")
    from helpers.memory import (  # imports JAX: when asked
        backend_restarted,
        live_arrays,
        live_bytes_by_device,
        shard_buffers,
        shard_views,
    )

    t0 = time.perf_counter()
    names = _namespaces(namespace)
    sharers = _sharers(names)  # names of arrays over memory: views, DLPack consumers
    garbage = _cyclic_garbage()  # before the kit holds anything: what no root reaches
    live = live_arrays()
    count, total = len(live), sum(live_bytes_by_device().values())  # each buffer once
    many_small = _many_small(live, count, total)
    sample = _commonest(live) if many_small else []
    views = shard_buffers(live) | {("id", i) for i in shard_views(live)}
    copies = [(c, a) for a in live if (c := jaxcompat.host_copy_bytes(a))]
    cycles = sum(_nbytes(a) for a in {id(a): a for a in live if id(a) in garbage}.values())
    arrays, n_views = _largest_arrays(live, n, views)
    del live  # a referrer of every array: gone before the search
    found, complete = [], True
    mine = {id(arrays), id(sample)}
    for group in arrays:
        mine.add(id(group))
    if sample:  # who holds the tiny ones: a sample of the commonest kind (flax#1406)
        lines = [_INDEX.sub("", line) for arr in sample  # the same holder, whatever index
                 for line in _held(arr, names, mine, garbage, t0 + seconds).held_by]
        sample.clear()
        if lines:
            line, seen = Counter(lines).most_common(1)[0]
            many_small = _many_small_held(many_small, line, seen, len(lines))
    try:
        for group in arrays:
            if time.perf_counter() - t0 > seconds:
                complete = False
                break
            shared = _group_sharing(group, names, sharers)
            found.append(_merge([_held(arr, names, mine, garbage, t0 + seconds, shared)
                                 for arr in group]))
            del shared
        # its own budget, as the trees alike have: a read of each pair's bytes, on the CPU
        found = _same_values(arrays[:len(found)], found, time.perf_counter() + seconds)
    finally:
        del arrays  # the search holds nothing once it returns
    if cycles or any(line.startswith(_CYCLE) for h in found for line in h.held_by):
        import gc

        gc.collect()  # its look kept the cycles' garbage a generation longer: free it now
    # its own budget: a walk of the notebook's names, cheap, which a search of a large heap
    # up from the arrays must not leave without time (a suite's heap did: transformers#15766)
    alike = _trees_alike(names, time.perf_counter() + seconds)
    execs = jaxcompat.live_executables()
    code: int | NotAvailable = NOT_AVAILABLE
    on_cpu = 0
    if execs is not None:
        try:  # the CPU backend gives 0 for every program: not reported, not 0 B
            on_cpu = sum(e.client.platform == "cpu" for e in execs)
            reported = [e for e in execs if e.client.platform != "cpu"]
            code = (sum(int(e.get_compiled_memory_stats().generated_code_size_in_bytes)
                        for e in reported) if reported or not execs else NOT_AVAILABLE)
        except Exception:
            code, on_cpu = NOT_AVAILABLE, 0
    names: dict[str, set] = {}
    constants = _program_constants(execs or [], t0 + 2 * seconds, names)
    many = _many_programs(names)
    # bytes whose holder the time budget left unfound are no one's here, not your code's
    cut_short = {id(h) for h in found if any(line.startswith(_CUT) for line in h.held_by)}
    cut = sum(h.nbytes for h in found if id(h) in cut_short)
    complete = complete and not cut
    user = sum(h.nbytes for h in found if id(h) not in cut_short
               and any(not line.startswith((_JIT_CACHE, _LIBRARY)) for line in h.held_by))
    library = sum(h.nbytes for h in found if h.held_by and all(
        line.startswith(_LIBRARY) for line in h.held_by))
    looked_cycles = sum(h.nbytes for h in found if h.held_by and all(
        line.startswith(_CYCLE) for line in h.held_by))
    user -= looked_cycles  # garbage a collection frees: not held by your code
    history = sum(h.nbytes for h in found if id(h) not in cut_short and h.held_by and all(
        line.startswith(_IPYTHONS) or _KEPT_IN_HISTORY in line for line in h.held_by))
    user -= history  # IPython's output history: no name of the user's holds it
    copied = sum(c for c, _ in copies)
    note = _host_copies_note(copies, found)
    del copies
    return Holders(tuple(found), count, total, user,
                   sum(h.nbytes for h in found) - user - library - cut - looked_cycles - history,
                   NOT_AVAILABLE if execs is None else len(execs), code,
                   time.perf_counter() - t0, complete, many_small, alike, constants, library,
                   backend_restarted(), n_views, copied, cycles, note, on_cpu, many, history)


def _host_copies_note(copies: list, found: list[HeldArray]) -> str:
    """The sentence for the host copies JAX keeps on live arrays (``copies``: (bytes, array)):
    how many and their bytes, the largest one's holder where it was looked at, why they stay
    and how to read an array on the host without keeping one (jax-ml/jax#26216); "" if none."""
    if not copies:
        return ""
    from helpers.units import format_bytes

    nbytes, biggest = max(copies, key=lambda c: c[0])
    what = f"{biggest.dtype}{list(biggest.shape)}"
    held = next((h for h in found if h.host_copy == nbytes and h.array.startswith(what)
                 and h.held_by), None)
    whose = f"; the largest, {format_bytes(nbytes)}, on the {what} held by {held.held_by[0]}" \
        if held else ""
    n = len(copies)
    return (f"{n} live array{'s' if n > 1 else ''} keep{'' if n > 1 else 's'} "
            f"{format_bytes(sum(c for c, _ in copies))} of host memory in copies a read on the "
            f"host made (np.asarray, jax.device_get, print){whose}: JAX keeps "
            "such a copy on the array for as long as the array lives (jax-ml/jax#26216, "
            "marin-community/marin#8609). To read one without keeping a copy: on the CPU, shard "
            "by shard, np.asarray(s.data) for s in x.addressable_shards, each a view of its "
            "shard's buffer; else from a temporary copy, np.asarray(x.copy()), whose host copy "
            "goes with it (measured on the CPU, a 64 MiB array over 4 devices: 64 MiB kept "
            "after jax.device_get, 0 B after either). On a GPU a shard's read keeps its copy on "
            "the shard's Array, which the sharded array keeps, so there only the temporary "
            "copy does, for the array's bytes on the device while it lives (from jaxlib's "
            "xla/python/py_array.cc, not yet run on a GPU).")


def _same_values(groups: list[list], found: list[HeldArray], deadline: float
                 ) -> list[HeldArray]:
    """``found`` with a word on each pair of arrays of one CPU device that hold the same
    values in different shapes (a reshaped copy: numpyro's MCMC keeps ``_states`` and
    ``_states_flat``, the same samples twice, pyro-ppl/numpyro#1689), compared byte by byte
    until ``deadline``; an array of one value repeated (zeros) is no copy of anything. Off the
    CPU nothing is compared: reading a device's arrays would copy them or run a program
    there."""
    import itertools

    notes: dict[int, list[str]] = {}
    for i, j in itertools.combinations(range(len(found)), 2):
        if time.perf_counter() > deadline:
            break
        a, b = groups[i][0], groups[j][0]
        try:
            if (a.shape == b.shape or a.dtype != b.dtype or a.size != b.size or not a.size
                    or not _on_one_cpu(a) or a.devices() != b.devices()  # (a copy moved to
                    or not found[i].held_by or not found[j].held_by):  # another device: kept)
                continue
            same = _same_bytes(a, b)
        except Exception:  # deleted meanwhile, or a dtype without a buffer export
            continue
        if same:
            for k, other in ((i, j), (j, i)):
                who = found[other].held_by[0].split(": ")[0]
                notes.setdefault(k, []).append(
                    f"it holds the same values as the {found[other].array.split(' on ')[0]} "
                    f"held by {who}, reshaped: one value held twice on the device (as numpyro's "
                    "MCMC keeps _states and _states_flat, pyro-ppl/numpyro#1689), so one of the "
                    "two is enough")
    return [replace(h, fix="; ".join([h.fix, *notes[k]]) if h.fix else "; ".join(notes[k]))
            if k in notes else h for k, h in enumerate(found)]


def _on_one_cpu(a) -> bool:
    devices = a.devices()
    return len(devices) == 1 and next(iter(devices)).platform == "cpu"


def _same_bytes(a, b, chunk: int = 1 << 22) -> bool:
    """Whether two arrays of the CPU hold the same bytes, not all one value repeated: read in
    place through the buffer protocol, a chunk at a time (no copy, no program run)."""
    import numpy as np

    ma, mb = memoryview(a), memoryview(b)
    try:
        x, y = np.frombuffer(ma, np.uint8), np.frombuffer(mb, np.uint8)
        if not _chunks_equal(x, y, chunk):
            return False
        step = a.dtype.itemsize  # one value repeated: the bytes equal themselves shifted by one
        return not _chunks_equal(x[step:], x[:x.size - step], chunk)
    finally:
        x = y = None
        ma.release()
        mb.release()


def _chunks_equal(x, y, chunk: int) -> bool:
    import numpy as np

    return x.size == y.size and all(np.array_equal(x[k:k + chunk], y[k:k + chunk])
                                    for k in range(0, x.size, chunk))


def _program_constants(execs: list, deadline: float, names: dict | None = None
                       ) -> tuple[tuple[str, int, int], ...]:
    """(name, programs, constant bytes) per program name holding 1 MiB of array constants or
    more, read from each loaded program's optimized text until ``deadline``; ``names`` gets
    the signatures of the programs of each name read (``jaxcompat.entry_signature``, a set
    per name: programs of one name with different ones took other shapes)."""
    by_name: dict[str, list[int]] = {}
    for e in execs:
        if time.perf_counter() > deadline:
            break
        try:
            module = e.hlo_modules()[0]
            text = module.to_string()
            if names is not None:
                signature = jaxcompat.entry_signature(text)
                names.setdefault(module.name, set()).add(signature or id(e))
            found = jaxcompat.constant_bytes(text)
        except Exception:  # a program that does not say
            continue
        if found:
            by_name.setdefault(module.name, []).append(found)
    rows = [(name, len(v), sum(v)) for name, v in by_name.items() if sum(v) >= 2**20]
    return tuple(sorted(rows, key=lambda r: -r[2])[:3])


#: this many programs of one name loaded at once are "many" (jax-ml/jax#16778: one per shape)
MANY_PROGRAMS = 16


def _many_programs(names: dict) -> str:
    """A sentence where one jitted function keeps :data:`MANY_PROGRAMS` compiled programs or
    more loaded, each with another signature: each shape or static value it met compiled
    one, and JAX keeps each until the function is gone (jax-ml/jax#16778); "" otherwise. Not
    for JAX's own eager operations (their programs are named for a lax primitive, jnp.ones'
    jit_broadcast_in_dim, or a private helper, jnp.mean's jit__mean), nor for programs of one
    name with one signature (separate functions of the same name, an ensemble's members)."""
    jax = jaxcompat.import_jax()
    own = sorted(((name, len(signatures)) for name, signatures in names.items()
                  if not name.startswith("jit__")
                  and not hasattr(jax.lax, name.removeprefix("jit_"))),
                 key=lambda t: -t[1])
    if not own or own[0][1] < MANY_PROGRAMS:
        return ""
    name, n = own[0]
    function = name.removeprefix("jit_")
    return (f"{n} compiled programs of {name} are loaded: one for each shape (or static value) "
            f"{function} was called with, each kept with its code in host memory until the "
            "function is gone (JAX's caches keep up to 4,096 entries: jax/_src/pjit.py; on a "
            "GPU a program that uses CUDA graphs also holds device memory: jax-ml/jax#16778, "
            "from the thread, not yet run on a GPU). Pad or bucket its inputs to a few shapes "
            "(compiles.watch() lists them), or drop the programs with the jitted function's "
            "clear_cache() or jax.clear_caches().")


#: this many live arrays averaging under 1 KiB are "many tiny arrays" (jax-ml/jax#17432)
MANY_SMALL = 10_000


def _many_small(live: list, count: int, total: int) -> str:
    """A sentence when very many tiny arrays are alive: each costs the process memory beyond
    its bytes (a Python object and the runtime's record of its buffer), so they weigh far more
    than their sum; "" otherwise."""
    if count < MANY_SMALL or total >= count * 1024:
        return ""
    kinds = Counter(f"{a.dtype}{list(a.shape)}" for a in live)
    kind, n = kinds.most_common(1)[0]
    keys = (" (keys: keys = jax.random.split(key, n), not key, *keys = "
            "jax.random.split(key, n + 1))" if kind == "uint32[2]" or kind.startswith("key<")
            else "")
    return (f"{count:,} live arrays average {total / count:.0f} B each (the most common: {kind} "
            f"x{n:,}): each array costs the process memory beyond its bytes, so many tiny ones "
            f"weigh far more than their sum. Keep such values in one array and index it{keys}.")


_INDEX = re.compile(r"\[[^\]]*\]")  # "list 'metrics'[4]": the holder without its index


def _commonest(live: list, most: int = 5) -> list:
    """A few arrays of the commonest kind (dtype and shape) among ``live``."""
    kinds = Counter((str(a.dtype), tuple(a.shape)) for a in live)
    (kind, _), = kinds.most_common(1)
    return [a for a in live if (str(a.dtype), tuple(a.shape)) == kind][-most:]


def _many_small_held(text: str, line: str, seen: int, looked: int) -> str:
    """The many-tiny-arrays sentence with who holds them, and, for values other than keys, the
    fix for values kept per step (flax#1406: metrics appended to a list every step)."""
    if line.startswith("JAX alone") or "nothing outside" in line:
        return text
    kept = any(w in line for w in ("list", "dict", "builtins."))  # appended, step by step
    fix = ("" if "jax.random.split" in text or not kept else
           " Values kept for every step (metrics appended to a list) each stay on the device: "
           "every few hundred steps, fetch them with jax.device_get, log them and start a new "
           "list, or keep a running sum on the device.")
    return (f"{text} {seen} of {looked} of the commonest kind looked at are held by {line}."
            f"{fix}")


def _merge(views: list[HeldArray]) -> HeldArray:
    """One buffer seen through several Arrays: what holds any of them holds the buffer."""
    held = tuple(dict.fromkeys(x for v in views for x in v.held_by))
    fixes: list[str] = []
    for fix in [v.fix for v in views if v.held_by] or [views[0].fix]:
        # one view's fix may hold another's whole ("`del x, t` ...; find and delete the NumPy
        # array made from it" beside "`del x, t` ...": said twice, a trial)
        if any(fix in f for f in fixes):
            continue
        fixes = [f for f in fixes if f not in fix] + [fix]
    return HeldArray(views[0].array, views[0].nbytes, held, "; ".join(fixes),
                     max(v.host_copy for v in views))


def _nbytes(a) -> int:
    try:
        return int(a.nbytes)
    except Exception:  # deleted meanwhile
        return 0


def _largest_arrays(live: list, n: int, views: set = frozenset()) -> tuple[list[list], int]:
    """The ``n`` largest buffers among ``live``, each as the list of live Arrays over it (JAX
    may keep its own Array over a buffer the user's variable holds), and how many Arrays are
    left out as views of a sharded array's shards (``views``: their (Device, address), from
    :func:`helpers.memory.shard_buffers`, and ("id", id) from
    :func:`helpers.memory.shard_views`). A buffer's address is asked for only where another
    single-device Array of its device, shape and dtype is alive (asking a committed Array makes
    JAX cache a second one over its buffer: one more live array per call that asked)."""
    groups: dict = {}
    n_views = 0
    kinds = Counter(_kind(a) for a in live if ("id", id(a)) not in views)
    view_devices = {d for d, _ in views if d != "id"}  # where a host read's view may be
    for a in sorted(live, key=_nbytes, reverse=True):
        if ("id", id(a)) in views:  # JAX's Array over a listed shard: known without asking
            n_views += 1
            continue
        try:
            kind = _kind(a)
            asked = kind is not None and (kinds[kind] > 1 or kind[0] in view_devices)
            key = (tuple(a.devices()), a.unsafe_buffer_pointer()) if asked else id(a)
        except Exception:
            key = id(a)
        if isinstance(key, tuple) and (key[0][0], key[1]) in views:
            n_views += 1  # the sharded array's own buffer: listed as that array
            continue
        if key in groups:
            groups[key].append(a)
            continue
        first = next(iter(groups.values()), None)
        if len(groups) == n or (first and _nbytes(a) * 1000 < _nbytes(first[0])):
            continue  # a thousandth of the largest is not where the memory went
        groups[key] = [a]
    return list(groups.values()), n_views


def _kind(a) -> tuple | None:
    """(device, shape, dtype) of a single-device Array; None for one over several devices or
    one deleted meanwhile."""
    try:
        devices = a.devices()
        return (next(iter(devices)), a.shape, str(a.dtype)) if len(devices) == 1 else None
    except Exception:
        return None


def _namespaces(namespace: Mapping | None) -> list[tuple[str, Mapping]]:
    """(label, dict) pairs where a name can hold an array: the notebook's namespace, and
    IPython's output history inside it."""
    import sys

    spaces = []
    ip = frames.ipython_shell()
    if namespace is not None:
        spaces.append(("", namespace))
    else:
        if ip is not None:
            spaces.append(("", ip.user_ns))
        main = sys.modules.get("__main__")
        if main is not None and all(d is not vars(main) for _, d in spaces):
            # a script's globals, outside IPython: named as the script's, not a notebook's
            spaces.append(("" if ip is not None else _SCRIPT, vars(main)))
    for _, ns in list(spaces):
        out = ns.get("Out")
        if isinstance(out, dict):
            spaces.append(("Out", out))
    hidden = getattr(ip, "user_ns_hidden", None)  # IPython's copies of _, __, ___ and _N
    if isinstance(hidden, dict) and any(ns is ip.user_ns for _, ns in spaces):
        spaces.append((_HIDDEN, hidden))
    return spaces


_HISTORY = {"_", "__", "___"}
#: the label of a script's own globals (``__main__`` outside IPython), where "" labels the
#: notebook's (IPython's ``user_ns``, or the namespace a caller gives)
_SCRIPT = "the script"


def _users(label: str) -> bool:
    """A namespace of the user's variables (the notebook's or a script's), not IPython's
    output history."""
    return label in ("", _SCRIPT)


def _place(label: str) -> str:
    """Where a namespace's variables live, in words: "the notebook" or "the script"."""
    return label or "the notebook"
_HIDDEN = "user_ns_hidden"  # IPython's namespace of names %who does not show
_VAGUE = "a container: "  # what a list, dict or tuple nobody names is called
_JIT_CACHE = "jit's caches"  # an array that only a static argument in those caches keeps
_LIBRARY = "a library's module-level state"  # what a library's module keeps (numpyro#1115)
#: the search up from an unnamed holder stopped at the time budget: whose it is is not known
_CUT = "not found before the time ran out"
#: how a line names IPython's output history as the only holder: IPython's own at its start (its
#: Out, its last results _, its record of the last cell), or a container only the history keeps
#: (a line with a name of the user's as well says it otherwise)
_IPYTHONS = "IPython's "
_KEPT_IN_HISTORY = ", kept in IPython's output history"
_FIX_OUT = ("IPython keeps every displayed result: `Out.clear()` and `del _` let it go, and "
            "ending a cell with `;` displays nothing")


def _fix_out(arr, names: list[tuple[str, Mapping]]) -> str:
    """How to let go of a result IPython keeps (ipython/ipython#12879). In IPython (9.18.1,
    checked with a 16 MiB array: 2 Arrays over it left after `Out.clear(); del _` or
    `%reset -f out`, 0 after the commands below): its display hook pushes ``_``, ``__``,
    ``___`` and ``_N`` into ``user_ns_hidden`` too, and ``%reset -f out`` empties Out, the
    ``_N`` and the hook's own ``_`` but leaves the hidden ``_``, ``__``, ``___``."""
    hidden = next((ns for label, ns in names if label == _HIDDEN), None)
    if hidden is None:  # no IPython: a namespace of the user's, where `del` does it
        return _FIX_OUT
    unders = [k for k in ("_", "__", "___") if hidden.get(k) is arr]
    pops = "; ".join(f"del get_ipython().user_ns_hidden[{k!r}]" for k in unders)  # (a .pop()
    # ending a cell would display the array: kept again)
    kept = (f", also as {', '.join(unders)} in get_ipython().user_ns_hidden, which "
            "`Out.clear()`, `del _` and `%reset -f out` leave" if unders else "")
    then = f", then `{pops}`" if pops else ""
    return (f"IPython keeps every displayed result{kept}: run `%reset -f out`{then}; ending a "
            "cell with `;` displays nothing")


def _trees_alike(names: list[tuple[str, Mapping]], deadline: float, most: int = 3
                 ) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Trees of two or more arrays and 1 MiB or more, alike in keys, shapes and dtypes, held
    under different names of the notebook (a variable, a key of a dict it holds, an attribute
    of an object it holds: ``model.params``) over different buffers. A tree inside another
    named one deeper than that (an optimizer's ``mu``) is not looked at."""
    import jax

    groups: dict[tuple, list[tuple[str, set[int], int]]] = {}
    for label, ns in names:
        if not _users(label):  # IPython's output history: not a variable of the user's
            continue
        for name, value in list(ns.items()):
            if time.perf_counter() > deadline:
                break
            if name.startswith("_") or isinstance(value, (type, type(os))):
                continue
            for where, tree in _trees_under(name, value, jax):
                flat = _bounded_flatten(tree, jax, deadline)
                leaves = [(jax.tree_util.keystr(path), leaf) for path, leaf in flat
                          if isinstance(leaf, jax.Array) and not leaf.is_deleted()]
                if len(leaves) < 2:  # (a donated tree's arrays are deleted: no memory)
                    continue
                nbytes = sum(_nbytes(leaf) for _, leaf in leaves)
                if nbytes < 2**20:
                    continue
                key = tuple((path, leaf.shape, str(leaf.dtype)) for path, leaf in leaves)
                groups.setdefault(key, []).append((where, {id(x) for _, x in leaves}, nbytes))
    out = []
    for found in groups.values():
        names_alike: list[str] = []
        buffers: set[int] = set()
        for where, ids, _ in found:
            if not ids & buffers:  # the same arrays under two names are one tree, not two
                names_alike.append(where)
                buffers |= ids
        if len(names_alike) > 1 and not _numbered_siblings(names_alike):
            out.append((tuple(names_alike), found[0][2]))
    out.sort(key=lambda x: -x[1] * len(x[0]))
    kept: list[tuple[tuple[str, ...], int]] = []
    for names, nbytes in out:  # a part of trees already named alike says nothing more
        if not any(all(any(n.startswith(whole) and n[len(whole):len(whole) + 1] in "[."
                           for whole in bigger) for n in names) for bigger, _ in kept):
            kept.append((names, nbytes))
    return tuple(kept[:most])


_DIGITS = re.compile(r"\d+")


def _numbered_siblings(names: list[str]) -> bool:
    """Names one step into one tree that differ only in a number counting up from 0 or 1
    (model['layer0'] ... model['layer5'], model.block_1, model.block_2): a model's repeated
    blocks, alike by design, no leftover copy (a trial's six layers were told to `del` one)."""
    parts = [re.match(r"^(.*?)(\[[^\[\]]*\]|\.\w+)$", n) for n in names]
    if not (all(parts) and len({p.group(1) for p in parts}) == 1 and len(
            {_DIGITS.sub("#", p.group(2)) for p in parts}) == 1):
        return False
    numbers = [[int(d) for d in _DIGITS.findall(p.group(2))] for p in parts]
    if not all(len(n) == 1 for n in numbers):
        return False
    # a model's blocks count 0 (or 1) up, one at a time; checkpoints of steps 100, 200 and
    # 300 are leftovers all the same (a review)
    found = sorted(n[0] for n in numbers)
    return found[0] <= 1 and found == list(range(found[0], found[0] + len(found)))


class _TooBig(Exception):
    pass


#: a tree of more nodes than this is no parameter tree the kit compares (a token list, records)
_MOST_NODES = 20_000


def _bounded_flatten(tree: Any, jax: Any, deadline: float) -> list:
    """``tree_flatten_with_path``, given up ([]) past ``_MOST_NODES`` nodes or the deadline: a
    namespace can hold a list of millions of numbers, which a whole flatten would copy."""
    seen = [0]

    def is_leaf(node) -> bool:
        seen[0] += 1
        if seen[0] > _MOST_NODES or (seen[0] % 1000 == 0 and time.perf_counter() > deadline):
            raise _TooBig
        if isinstance(node, (list, tuple, dict)) and len(node) > _MOST_NODES:
            raise _TooBig
        return False

    try:
        return jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
    except Exception:  # too big, or a pytree node of the user's whose flatten fails
        return []


def _trees_under(name: str, value: Any, jax: Any) -> list[tuple[str, Any]]:
    """The value a name holds, and each dict value or attribute one step into it, named as the
    user would write them (``variables['params']``, ``model.params``)."""
    if isinstance(value, jax.Array):
        return []
    out = [(name, value)]
    if isinstance(value, dict):
        out += [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:100]
                if isinstance(k, str) and isinstance(v, (dict, list, tuple))]
    else:
        try:
            fields = dict(vars(value))
        except Exception:  # no __dict__ (a tuple, a number), or one that cannot be read
            fields = {}
        readable = ((_public(type(value), k), v) for k, v in list(fields.items())[:100])
        out += [(f"{name}.{k}", v) for k, v in readable
                if k and not isinstance(v, jax.Array) and not callable(v)]
    return out


def _public(kind: type, attribute: str) -> str:
    """The name a user reads an attribute by: itself, or for ``_params`` behind a ``params``
    property (a Hugging Face Flax model) the property's; "" for another private one."""
    if not attribute.startswith("_"):
        return attribute
    public = attribute.lstrip("_")
    return public if public and isinstance(getattr(kind, public, None), property) else ""


def _cyclic_garbage() -> frozenset[int]:
    """The ids of the objects only a reference cycle keeps (Python frees them at its next cycle
    collection): a collection that saves them instead of freeing them (gc.DEBUG_SAVEALL), then
    handed back as they were, still garbage. Their finalizers run, as a collection's would."""
    import gc

    flags, kept = gc.get_debug(), list(gc.garbage)
    if flags & gc.DEBUG_SAVEALL:  # the user keeps garbage on purpose: not the kit's to touch
        return frozenset()
    try:
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        gc.collect()
        return frozenset(id(o) for o in gc.garbage[len(kept):])
    finally:
        gc.set_debug(flags)
        gc.garbage[:] = kept  # the saved ones are garbage again, for the next collection


_CYCLE = "a reference cycle nothing reaches"
_CYCLE_FIX = ("nothing you can reach holds it: objects that refer to each other, and that "
              "nothing else refers to, keep it until Python's cycle collector next runs (gc."
              "collect(); the kit ran one once it had looked, which freed it). To free such "
              "arrays at once, break the cycle (a weakref.ref for the back reference), or call "
              ".delete() on the array")


def _held(arr, names: list[tuple[str, Mapping]], mine: set[int],
          garbage: frozenset[int] = frozenset(), deadline: float = float("inf"),
          shared: tuple = ((), (), "")) -> HeldArray:
    """What refers to ``arr``, one or two steps up, described for a person; ``shared``: what
    else holds its buffer, from :func:`_group_sharing` (a DLPack consumer refers to no
    Array of JAX's)."""
    import gc
    import sys
    import types

    here = sys._getframe()
    what = f"{arr.dtype}{list(arr.shape)} on " + ", ".join(device_name(d)
                                                          for d in arr.devices())
    held, fixes, vague = [], [], []
    tb_frames = _traceback_frames()
    refs = [r for r in gc.get_referrers(arr) if id(r) not in mine and r is not here
            and not (isinstance(r, types.FrameType) and _is_kit_frame(r))]
    if refs and all(id(r) in garbage for r in refs):  # jax-ml/jax#725
        kinds = ", ".join(dict.fromkeys(_type_name(r) for r in refs))
        del refs
        return HeldArray(what, _nbytes(arr), (f"{_CYCLE} ({kinds})",), _CYCLE_FIX,
                         jaxcompat.host_copy_bytes(arr))
    views, shares, together = shared
    unnamed = []  # JAX's objects and containers nobody names: looked above if nothing better
    for r in refs:
        line, fix = _describe(r, arr, names, tb_frames, mine | {id(refs)}, views, together,
                              deadline)
        if line:
            (vague if line.startswith(_VAGUE) else held).append((line, fix))
        if _is_jax_owned(r) or line.startswith(_VAGUE) or (
                not line and isinstance(r, (list, tuple, set, dict))):
            unnamed.append(r)  # (a container only JAX's objects hold: jax 0.11's VJP's list)
    del refs
    if shares:  # no referrer of the Array: they hold its buffer, not it (jax-ml/jax#4636)
        held.append((_shares_line(shares), together))
    for r in unnamed if not held else ():  # a JAX object the user keeps (what jax.vjp returns)
        if above := _named_above(r, names, mine | {id(unnamed)}, deadline=deadline):
            held.append(above)
            break
    if unnamed and not held and time.perf_counter() > deadline:  # not "your code": unknown
        held.append((f"{_CUT} (the search up from "
                     f"{vague[0][0].removeprefix(_VAGUE) if vague else 'a JAX object'} stopped "
                     "at the time budget)",
                     "holders.largest(seconds=60) looks further"))
    del unnamed
    for _line, fix in held or vague[:1]:  # a container nobody names, only if nothing better
        if fix and fix not in fixes:
            fixes.append(fix)
    held = [line for line, _ in held or vague[:1]]
    if not held:
        fixes.append("nothing outside JAX refers to it: JAX frees it when its own last "
                     "reference goes (a pending computation, a jit's cache of constants)")
    return HeldArray(what, _nbytes(arr), tuple(dict.fromkeys(held)), "; ".join(fixes),
                     jaxcompat.host_copy_bytes(arr))


def _named_above(obj, names: list[tuple[str, Mapping]], mine: set[int], depth: int = 22,
                 most: int = 500, scans: int = 40, deadline: float = float("inf")
                 ) -> tuple[str, str] | None:
    """(the line, the fix) for a JAX object or a container that keeps an array (jax.tree_util.
    Partial, the function jax.vjp returns), found by a bounded search up its referrers for a
    variable that names it, or an object's attribute a variable names (jax-ml/jax#24053); else
    for the modules whose globals keep it (a library's cache of functions that close over the
    object: numpyro's, pyro-ppl/numpyro#1115, ten steps up, and JAX's lru caches of what
    numpyro jitted, twenty steps up); None if none is found within
    ``depth`` steps, ``most`` objects and ``scans`` reads of the heap."""
    import gc
    import types

    seen: dict[int, object] = {id(obj): obj}
    below: dict[int, int] = {}  # id of an object -> id of the one it was found above
    #: id of what a module keeps -> (path, module, through, library, its clear() call): one
    #: module's
    #: name for it (the module that defines it, where another imported it too)
    roots: dict[int, tuple[str, str, str, bool, str]] = {}

    def down(node) -> list:
        chain = [node]
        while id(chain[-1]) in below:
            chain.append(seen[below[id(chain[-1])]])
        return chain

    def held_as(node, kept: str, action: str) -> tuple[str, str]:
        """The line and the fix for ``node``: named by the first JAX object on the way up to
        it, else by what holds the array; the word on jax.vjp only where there is such an
        object (a nested dict of parameters is none)."""
        chain = down(node)
        owned = next((x for x in reversed(chain) if _is_jax_owned(x)), None)
        return (f"a {_type_name(chain[-1] if owned is None else owned)}, {kept}",
                (_HELD_FIX if owned is None else _JAX_OBJECT_FIX).format(action))

    def done() -> tuple[str, str] | None:
        return _module_line(roots) if roots else None

    frontier = [obj]
    for _ in range(depth):
        ours = mine | {id(seen), id(frontier), id(below), id(roots)}
        nxt: list = []
        for node in frontier:
            scans -= 1  # each get_referrers reads the whole heap: a budget, and a deadline
            if scans < 0 or time.perf_counter() > deadline:
                return done()
            for r in gc.get_referrers(node):
                if id(r) in ours or id(r) in seen:
                    continue
                for _, ns in names:  # (the notebook's namespace has __spec__ and __name__ too)
                    if r is ns and (keys := _keys_holding(ns, node)):
                        return held_as(node, f"kept by the variable {keys[0]!r} in "
                                             f"{_name_in(ns, names)}", f"`del {keys[0]}`")
                if isinstance(r, dict) and "__spec__" in r and "__name__" in r:
                    if root := _module_root(r, down(node)):  # a module's globals keep it
                        kept, *named = root
                        if kept not in roots or named[1] == getattr(node, "__module__", ""):
                            roots[kept] = tuple(named)
                    continue  # above them are its functions, not holders
                if isinstance(r, (types.FrameType, type, types.ModuleType)):
                    continue
                if found := _named_attribute(r, node, names, ours | {id(nxt)}):
                    var, attr, holder, where = found
                    return held_as(node, f"kept as {var}.{attr} (a {_type_name(holder)} "
                                         f"object, the variable {var!r} in {where})",
                                   _set_none(var, holder, attr))
                seen[id(r)] = r
                below[id(r)] = id(node)
                nxt.append(r)
                if len(seen) > most:
                    return done()
        frontier = nxt
        if not frontier:
            return done()
    return done()


def _module_root(module_globals: dict, chain: list
                 ) -> tuple[int, str, str, str, bool, str] | None:
    """(the id of the path's end; the path from the module down, as one would write it:
    ``numpyro.infer.mcmc._collect_and_postprocess._cache``; the module; the first object of a
    class on the way down to the array, named; whether the module is a library's, not the
    user's; the call that empties the path's end, "" if none) for a module whose globals keep
    ``chain[0]`` (``chain`` runs down to what holds the array); None for the kit's own
    modules, and for JAX's where no object but JAX's is on the way (a value JAX alone keeps).
    JAX's own count where they keep a library's object: numpyro's closures stay in
    JAX's ``api_util.donation_vector``, an lru_cache jax.clear_caches() leaves (numpyro
    0.22, jax 0.10.2)."""
    module = str(module_globals.get("__name__"))
    plain = ("builtins", "functools", "collections", "types")
    named = next((x for x in reversed(chain) if type(x).__module__ not in plain), None)
    if module.split(".")[0] == "helpers" or (module.split(".")[0] in ("jax", "jaxlib") and (
            named is None or _is_jax_owned(named))):
        return None  # the kit's own; JAX's own values (what JAX alone keeps: said elsewhere)
    path, holder, names_attributes = module, module_globals, True
    for x in chain:
        if names_attributes:  # the module's globals, or an object's __dict__
            keys = [k for k, v in holder.items() if v is x and isinstance(k, str)]
            if not keys:
                break
            path, holder, names_attributes = f"{path}.{keys[0]}", x, False
        elif getattr(holder, "__dict__", None) is x and not isinstance(holder, dict):
            holder, names_attributes = x, True  # an object, then its attributes' dict
        else:
            try:
                keys = [k for k, v in vars(holder).items() if v is x]
            except TypeError:
                break
            if not keys or isinstance(holder, dict):
                break
            path, holder = f"{path}.{keys[0]}", x
    through = "" if named is None else f", through a {_type_name(named)} object"
    file = module_globals.get("__file__")
    library = module.split(".")[0] in ("jax", "jaxlib") or (
        isinstance(file, str) and not frames.is_user_file(file))
    clear = next((f"{path}.{m}()" for m in ("clear", "cache_clear")  # a dict; an lru_cache
                  if not names_attributes and callable(getattr(holder, m, None))), "")
    return id(holder), path, module, through, library, clear


def _module_line(roots: dict[int, tuple[str, str, str, bool, str]]) -> tuple[str, str]:
    """The line and the fix for the modules whose globals keep an array (from
    :func:`_module_root`)."""
    found = list(roots.values())
    paths = [path for path, *_ in found]
    through = found[0][2]
    tops = list(dict.fromkeys(module.split(".")[0] for _, module, _, library, _ in found
                              if library))
    calls = [clear for *_, clear in found if clear]
    if calls and "jax" in tops:  # jit's caches too: numpyro's closures went only with both
        calls.insert(0, "jax.clear_caches()")  # (jax 0.10.2, numpyro 0.22)
    clears = " and ".join(f"`{call}`" for call in calls)
    these = "these references" if len(paths) > 1 else "this reference"
    clearing = (f"clearing {'them' if len(paths) > 1 else 'it'} ({clears}) drops {these}, and "
                "the array goes once nothing else keeps it" if clears else
                "the array goes once the module lets go of it")
    if tops:
        return (f"{_LIBRARY} ({', '.join(tops)}), not a variable of yours: {', '.join(paths)}"
                f"{through}",
                f"`del` of your own names frees nothing while {' and '.join(tops)} keep"
                f"{'s' if len(tops) == 1 else ''} it (a module-level cache, often of functions "
                f"that close over your object): {clearing} (restarting the process always "
                "frees it)")
    return (f"the module {found[0][1]}: {', '.join(paths)}{through}",
            f"{clearing} (`del` of a variable that names it frees nothing while the module "
            "keeps it)")


_JAX_OBJECT_FIX = ("{} when you are done: the object keeps the array for as long as it lives (the "
                   "function jax.vjp or jax.linearize returns keeps the forward pass's values "
                   "for the backward pass)")

_HELD_FIX = "{} when you are done: what it holds stays alive as long as it does"


def _is_kit_frame(frame) -> bool:
    return frame.f_code.co_filename.startswith(os.path.dirname(__file__))


def _traceback_frames() -> dict[int, tuple[str, bool]]:
    """id(frame) -> (the saved traceback that keeps it: ``sys.last_traceback``, or
    ``sys.last_exc.__traceback__`` (Python 3.12+), and whether it is that traceback's first
    frame)."""
    import sys

    out: dict[int, tuple[str, bool]] = {}
    for label in ("last_traceback", "last_exc"):
        tb = getattr(sys, label, None)
        if label == "last_exc":
            tb, label = getattr(tb, "__traceback__", None), "last_exc.__traceback__"
        first = True
        while tb is not None:
            out.setdefault(id(tb.tb_frame), (f"sys.{label}", first))
            tb, first = tb.tb_next, False
    # IPython's own copy (its InteractiveTB keeps the last traceback's innermost step, whose
    # frame reaches the caller frames above it), still there once sys.last_traceback is cleared
    tb = getattr(getattr(frames.ipython_shell(), "InteractiveTB", None), "tb", None)
    running = _running_frames()
    while tb is not None:
        frame = getattr(tb, "tb_frame", None)
        while frame is not None and id(frame) not in running:
            out.setdefault(id(frame), (_IPYTHON_TB, False))
            frame = frame.f_back
        tb = getattr(tb, "tb_next", None)
    return out


#: IPython's saved traceback, as the kit names it
_IPYTHON_TB = "IPython's copy of the last error's traceback, get_ipython().InteractiveTB.tb"


def _running_frames() -> set[int]:
    """The ids of the frames running now, on every thread."""
    import sys

    out: set[int] = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            out.add(id(frame))
            frame = frame.f_back
    return out


def _fix_traceback(saved: str, first: bool) -> str:
    """How to let go of a frame a saved traceback keeps. Outside IPython, dropping the saved
    traceback does it. IPython keeps the same traceback objects (its InteractiveTB, the last
    ExecutionResult's error: ipython/ipython#11572), so there ``sys.last_traceback = None``
    frees nothing (IPython 9.18.1, a 16 MiB local: still alive, 2 Arrays over it on jax 0.8.0);
    cutting the chain below its first frame, which is IPython's own, frees every frame below it
    wherever the chain is kept (0 left)."""
    if saved == _IPYTHON_TB:  # sys.last_traceback cleared already: IPython's copy keeps it
        return ("clear it: `get_ipython().InteractiveTB.tb = None` (sys.last_traceback no "
                "longer keeps these frames; IPython keeps its own reference to the last error's "
                "traceback, and those frames keep their locals)")
    if first or frames.ipython_shell() is None:
        return (f"clear it: `{saved} = None` (Python keeps the last error's frames and their "
                "locals)")
    return (f"clear it: `{saved}.tb_next = None` (IPython keeps the same traceback in "
            f"get_ipython().InteractiveTB and its last result, so `{saved} = None` alone frees "
            "nothing; cutting it below its first frame, IPython's own, lets the frames below "
            "and their locals go)")


def _home(names: list[tuple[str, Mapping]]) -> str:
    """Where the user's variables live, in words: "the script" where the only ones are a
    script's globals, else "the notebook"."""
    labels = [label for label, _ in names if _users(label)]
    return _SCRIPT if labels == [_SCRIPT] else "the notebook"


def _name_in(container, names: list[tuple[str, Mapping]]) -> str | None:
    for label, ns in names:
        if container is ns:
            return _place(label) if _users(label) else label
    return None


def _describe(ref, arr, names, tb_frames, mine, views: tuple[_Sharer, ...] = (),
              together: str = "", deadline: float = float("inf")) -> tuple[str, str]:
    """One line for one referrer, and its fix ("", "") when it is the kit's own; ``views``:
    the NumPy views of its buffer the notebook names, ``together``: the fix that lets go of
    them and the array together ("" where nothing shares its buffer)."""
    import gc
    import types

    for label, ns in names:
        if ref is ns:
            keys = [k for k, v in ns.items() if v is arr]
            if label == "Out":
                return (f"IPython's output history: Out[{', '.join(map(str, keys))}]",
                        _fix_out(arr, names))
            history = [k for k in keys if k in _HISTORY or (k.startswith("_") and
                                                           k[1:].isdigit())]
            if label == _HIDDEN:
                return (f"IPython's hidden copies of its last results: get_ipython()."
                        f"user_ns_hidden[{', '.join(map(repr, history or keys))}]",
                        _fix_out(arr, names))
            plain = [k for k in keys if k not in history]
            if plain:
                return (f"the variable{'s' if len(plain) > 1 else ''} "
                        f"{', '.join(map(repr, plain))} in {_place(label)}",
                        together or f"`del {', '.join(plain)}` (or assign None) when you are "
                        "done")
            return (f"IPython's last results: {', '.join(history)}", _fix_out(arr, names))
    if _is_display_hook(ref):
        return (f"IPython's output history: its display hook's "
                f"{', '.join(_attributes_holding(ref, arr, ('_', '__', '___'))) or 'result'}",
                _fix_out(arr, names))
    if isinstance(ref, types.FrameType):
        where = f"{ref.f_code.co_name} ({frames.where(ref.f_code.co_filename, ref.f_lineno)})"
        local = [k for k, v in ref.f_locals.items() if v is arr]
        if id(ref) in tb_frames:
            saved, first = tb_frames[id(ref)]
            return (f"a saved traceback ({saved}), in JAX's own frames"
                    if not frames.is_user_frame(ref) else
                    f"a saved traceback ({saved}): the frame of {where}, local "
                    f"{', '.join(map(repr, local)) or 'value'}", _fix_traceback(saved, first))
        if id(ref) not in _running_frames():  # returned or raised: something keeps its frame
            return (f"the frame of {where}, which is no longer running, local "
                    f"{', '.join(map(repr, local)) or 'value'}: kept by a saved traceback or "
                    "exception", "find and drop the exception or traceback that keeps it (an "
                    "`except ... as err` stored somewhere, a logged error)")
        return (f"a running function's local {', '.join(map(repr, local)) or 'value'} in "
                f"{where}", "")
    if isinstance(ref, (list, tuple, set, dict)):
        owners = [o for o in gc.get_referrers(ref) if id(o) not in mine]
        if isinstance(ref, dict) and (obj := _instance_of(ref, owners)) is not None:
            # an object's attributes, once something read its __dict__ (Python 3.11+ makes
            # that dict only then; before, the object itself refers to the array)
            return _describe(obj, arr, names, tb_frames, mine | {id(owners)}, views,
                             together, deadline)
        inside = _index_of(ref, arr)
        if isinstance(ref, tuple) and any(isinstance(o, types.FunctionType) for o in owners) \
                and not any(o is ns for o in owners for _, ns in names):
            return ("a function's default arguments", "")
        if places := _places(ref, owners, names, mine | {id(owners)}):
            return _container_line(type(ref).__name__, inside, places)
        if owners and all(_is_jax_owned(o) for o in owners):
            return ("", "")
        return (f"{_VAGUE}{type(ref).__name__}{inside} not named in {_home(names)}",
                "find and clear the container that holds it")
    if type(ref).__name__ == "managedbuffer":  # a buffer protocol export: a NumPy view of it
        if views:  # every one: `del x, a1` left the buffer to a2 (jax-ml/jax#1961)
            many = len(views) > 1
            return (f"{'NumPy views' if many else 'a NumPy view'} of it, the variable"
                    f"{'s' if many else ''} {', '.join(repr(v.name) for v in views)} in "
                    f"{views[0].where} (np.asarray of a CPU array shares its buffer)", together)
        return ("a NumPy view of it (np.asarray of a CPU array shares its buffer), not named "
                f"in {_home(names)}", "find and delete the NumPy array made from it")
    if type(ref).__name__ == "cell":
        fns = [o for t in gc.get_referrers(ref) if isinstance(t, tuple)
               for o in gc.get_referrers(t) if isinstance(o, types.FunctionType)]
        name = fns[0].__qualname__ if fns else "a function"
        return (f"a closure: the function {name}",
                f"delete or redefine {name} (a closed-over array also becomes a constant of "
                "any jit of it)")
    if isinstance(ref, BaseException):
        return (f"an exception object ({type(ref).__name__}) refers to it", "")
    if _is_jax_owned(ref):
        return ("", "")
    return _object_holder(ref, arr, names, mine, deadline)


def _places(ref, owners: list, names: list[tuple[str, Mapping]], mine: set[int]) -> list[dict]:
    """Every name that reaches the container ``ref`` in one or two steps: a variable, an
    attribute of an object a variable names (aimz#168: ``ds.arrays``), or a key of a container
    that one of those holds (numpyro's ``samples`` is the very dict ``mcmc._states_flat['z']``:
    pyro-ppl/numpyro#1115). Each as a dict: ``var`` (the variable), ``path`` (how to write
    it), ``obj`` (the object of an attribute, else None), ``where`` and ``action`` (what lets it
    go). Variables first."""
    import gc

    found: list[dict] = []
    deeper = []
    for o in owners:
        if _name_in(o, names) is not None:
            found += _variables(o, ref, "", names)
            continue
        if hit := _named_attribute(o, ref, names, mine):
            var, attr, obj, where = hit
            found.append({"var": var, "path": f"{var}.{attr}", "obj": obj, "where": where,
                          "action": _set_none(var, obj, attr), "attr": attr})
        elif isinstance(o, (dict, list, tuple)) and len(deeper) < 4:
            deeper.append(o)
    if not found:  # nothing names it at all: the caller searches further up
        return []
    ours = mine | {id(deeper), id(found)}
    for o in deeper:  # is the container also inside another one that something names?
        index = _index_of(o, ref)
        for oo in gc.get_referrers(o):
            if id(oo) in ours:
                continue
            if _name_in(oo, names) is not None:
                found += _variables(oo, o, index, names)
            elif hit := _named_attribute(oo, o, names, ours):
                var, attr, obj, where = hit
                found.append({"var": var, "path": f"{var}.{attr}{index}", "obj": obj,
                              "where": where, "action": _set_none(var, obj, attr),
                              "attr": attr})
    found.sort(key=lambda p: p["obj"] is not None)  # variables first
    return list({p["path"]: p for p in found}.values())


def _variables(ns: Mapping, value, index: str, names: list[tuple[str, Mapping]]
               ) -> list[dict]:
    """The places (as :func:`_places` gives them) where names of ``ns`` hold ``value``; a
    result IPython displayed (a dict of arrays, jupyter/notebook#2201) is kept in its history,
    as ``Out[3]``, ``_3`` and the hidden ``__``, which ``del`` in the notebook does not reach:
    ``%reset -f out`` clears Out and the ``_N``, and the hidden ``_``, ``__``, ``___`` need
    their own ``del`` (see :func:`_fix_out`)."""
    where = _name_in(ns, names)
    label = next((lb for lb, n in names if n is ns), "")
    out = []
    for k in _keys_holding(ns, value):
        numbered = isinstance(k, str) and k[:1] == "_" and k[1:].isdigit()
        if label == "Out":
            path, action = f"Out[{k}]", "`%reset -f out`"
        elif label == _HIDDEN and k in _HISTORY:
            path = f"get_ipython().user_ns_hidden[{k!r}]"
            action = f"`del {path}`"
        elif (label == _HIDDEN and numbered) or (_users(label) and label != _SCRIPT and (
                k in _HISTORY or numbered) and _ipythons(ns, k, value, names)):
            path, action = k, "`%reset -f out`"
        else:
            out.append({"var": k, "path": f"{k}{index}", "obj": None, "where": where,
                        "action": f"`del {k}`"})
            continue
        out.append({"var": k, "path": f"{path}{index}", "obj": None, "where": where,
                    "action": action, "history": True})
    return out


def _container_line(kind: str, inside: str, places: list[dict]) -> tuple[str, str]:
    """The line and the fix for a container that names reach (from :func:`_places`): with one
    name, letting that go frees it; with several, every one must go (pyro-ppl/numpyro#1115:
    `del samples` freed nothing while mcmc._states_flat['z'] was the same dict)."""
    def said(p: dict, alone: bool) -> str:
        if p.get("history"):
            return f"{p['path']}{inside if alone else ''} (IPython's output history)"
        if p["obj"] is None:
            return f"{p['path']!r}{inside} in {p['where']}" if alone else \
                f"{p['path']} (the variable {p['var']!r} in {p['where']})"
        return (f"{p['path']}{inside}: a {_type_name(p['obj'])} object, the variable "
                f"{p['var']!r} in {p['where']}" if alone else
                f"{p['path']} (a {_type_name(p['obj'])} object, the variable {p['var']!r} in "
                f"{p['where']})")

    places = sorted(places, key=lambda p: bool(p.get("history")))  # the user's names first
    first, others = places[0], places[1:]
    if all(p.get("history") for p in places):  # `%reset -f out` first, then the hidden ones
        steps = sorted(dict.fromkeys(p["action"] for p in places),
                       key=lambda a: not a.startswith("`%reset"))
        also = f", also as {', '.join(p['path'] for p in others)}" if others else ""
        return (f"{kind} {first['path']}{inside}{_KEPT_IN_HISTORY}{also}",
                f"IPython keeps every displayed result: run {steps[0]}"
                f"{''.join(f', then {a}' for a in steps[1:])}; ending a cell with `;` "
                "displays nothing")
    line = f"{kind} {said(first, True)}"
    if not others:
        if first["obj"] is None:
            return line, f"remove it from {first['var']} (or `del {first['var']}`)"
        return line, _attribute_fix(first["var"], first["obj"], first.get("attr", ""),
                                    first["action"])
    also = ", ".join(said(p, False) for p in others)
    actions = " and ".join(sorted(dict.fromkeys(p["action"] for p in places), key=lambda a: (
        a.startswith("`del get_ipython()"), a.startswith("`%reset"))))  # IPython's history last
    return (f"{line}; the same {kind} is also {also}",
            f"{first['action']} alone frees nothing, the same {kind} is also "
            f"{', '.join(p['path'] for p in others)}: {actions} when you are done")


def _set_none(var: str, obj: Any, attr: str) -> str:
    """What lets ``obj.attr`` go: `var.attr = None`; for an object that refuses assignment (a
    frozen dataclass, as flax.struct's and equinox's are, raises FrozenInstanceError), a copy
    without it: `var = var.replace(attr=None)` where the class has ``replace`` (flax.struct),
    `var = dataclasses.replace(var, attr=None)` for a frozen dataclass whose own __init__ takes
    the field, else `del var`."""
    import dataclasses

    kind = type(obj)
    frozen = dataclasses.is_dataclass(kind) and getattr(
        getattr(kind, "__dataclass_params__", None), "frozen", False)
    if not frozen and getattr(kind, "__setattr__", object.__setattr__) is object.__setattr__:
        return f"`{var}.{attr} = None`"
    if callable(getattr(kind, "replace", None)) and attr.isidentifier():
        return f"`{var} = {var}.replace({attr}=None)`"
    init = getattr(getattr(kind, "__init__", None), "__code__", None)
    if frozen and attr.isidentifier() and init is not None and init.co_filename == "<string>" \
            and any(f.name == attr and f.init for f in dataclasses.fields(kind)):
        return f"`{var} = dataclasses.replace({var}, {attr}=None)`"  # (the generated __init__)
    return f"`del {var}`"


def _attribute_fix(var: str, obj: Any, attr: str, action: str) -> str:
    """The fix for an array an object's attribute keeps: `del var`, or the attribute set to
    None; the attribute first where the object keeps more (pyro-ppl/numpyro#1689: `del mcmc`
    would lose its post_warmup_state too)."""
    try:
        rest = [k for k in vars(obj) if k != attr and isinstance(k, str)]
    except TypeError:  # no __dict__
        rest = []
    more = ", ".join(rest[:4]) + (", ..." if len(rest) > 4 else "")
    if action == f"`del {var}`":  # (an object that takes no assignment: :func:`_set_none`)
        return (f"`del {var}` when you are done (it takes no assignment" +
                (f"; with it goes the rest of {var}: {more})" if rest else ")"))
    if not rest:
        return f"`del {var}` (or {action}) when you are done"
    return (f"{action} when you are done (`del {var}` frees it too, and with it the rest of "
            f"{var}: {more})")


@dataclass(frozen=True)
class _Sharer:
    """A name in the notebook of an array over memory, found by :func:`_sharers`: where its
    data starts and its bytes, host memory or a device's, the id of the jax.Array its base is
    a memoryview of (np.asarray of a CPU array) else 0, whether it came through DLPack, and
    whether it is a NumPy array over memory NumPy allocated (its chain of bases ends in an
    array that owns its data: never over a JAX buffer)."""

    name: str
    where: str
    address: int
    nbytes: int
    on_host: bool
    view_of: int = 0
    dlpack: bool = False
    numpy_own: bool = False


#: of the notebook's names, this many are looked at for arrays over a JAX buffer
_MOST_SHARERS = 10_000


def _sharers(names: list[tuple[str, Mapping]]) -> tuple[_Sharer, ...]:
    """The notebook's names of arrays over memory that a jax.Array's buffer may be: NumPy
    arrays (np.asarray of a CPU array: a view; np.from_dlpack of one: a DLPack consumer), a
    torch tensor (``data_ptr()``), an array of another library that takes DLPack and gives
    its address by ``__array_interface__`` or ``__cuda_array_interface__``. Addresses and
    sizes only: no reference is kept."""
    import numpy as np

    out = []
    for label, ns in names:
        if not _users(label):  # IPython's output history: no variable of the user's
            continue
        where = _place(label)
        for name, value in list(ns.items())[:_MOST_SHARERS]:
            if not isinstance(name, str) or name.startswith("_") or _is_jax_owned(value):
                continue
            try:
                found = _over_memory(value, np)
            except Exception:  # an object that does not say where its data is
                continue
            if found is not None:
                out.append(_Sharer(name, where, *found))
    return tuple(out)


def _over_memory(value: Any, np: Any) -> tuple[int, int, bool, int, bool, bool] | None:
    """(address, bytes, on the host, id of the jax.Array its base is a memoryview of else 0,
    made by DLPack, a NumPy array over NumPy's own memory) of an array over memory, None for
    anything else. Only protocol attributes are read (an ordinary attribute of an object may
    run code to be read)."""
    kind = type(value)
    if isinstance(value, np.ndarray):
        base = value
        for _ in range(8):  # a view of a view: follow the chain of bases
            if not isinstance(base, np.ndarray):
                break
            base = base.base
        view_of = id(base.obj) if isinstance(base, memoryview) and _is_jax_owned(
            base.obj) else 0
        return (int(value.__array_interface__["data"][0]), int(value.nbytes), True, view_of,
                type(base).__name__ == "PyCapsule", base is None)
    if callable(getattr(kind, "data_ptr", None)) and hasattr(kind, "__dlpack__"):  # torch
        # (made by DLPack or by torch.from_numpy of a NumPy view: it does not say which)
        device = getattr(getattr(value, "device", None), "type", "cpu")
        return (int(value.data_ptr()), int(value.nbytes), device == "cpu", 0, False, False)
    if not hasattr(kind, "__dlpack__"):  # (PIL's __array_interface__ copies the image out)
        return None
    for attribute, on_host in (("__cuda_array_interface__", False),
                               ("__array_interface__", True)):
        if hasattr(kind, attribute):
            face = getattr(value, attribute)
            if not isinstance(face.get("data"), tuple):  # no address: its bytes, or nothing
                return None
            nbytes = np.dtype(face["typestr"]).itemsize * int(np.prod(face["shape"]))
            return int(face["data"][0]), nbytes, on_host, 0, True, False
    return None


def _group_sharing(group: list, names: list[tuple[str, Mapping]],
                   sharers: tuple[_Sharer, ...]
                   ) -> tuple[tuple[_Sharer, ...], tuple[_Sharer, ...], str]:
    """(the NumPy views, the other arrays, the fix that lets them all go) among ``sharers``
    whose memory is the buffer of the Arrays of ``group``: a view by its base, a memoryview
    of one of them; any other by its address, inside the buffer's bytes on the same side
    (host or device). The buffer's address is asked for only where one may match: a sharer
    that is not a NumPy array over NumPy's own memory (asking an Array jax.device_put made
    makes JAX cache a second Array over its buffer, which jax.live_arrays() then lists; the
    kit's own counts take each buffer once)."""
    ids = {id(a) for a in group}
    views = tuple(s for s in sharers if s.view_of in ids)
    inside: list[_Sharer] = []
    try:
        devices = group[0].devices()
        on_host = len(devices) == 1 and next(iter(devices)).platform == "cpu"
        others = [s for s in sharers if s.view_of not in ids and s.on_host == on_host
                  and not s.numpy_own]
        if len(devices) == 1 and others:
            start, nbytes = group[0].unsafe_buffer_pointer(), _nbytes(group[0])
            inside = [s for s in others if start <= s.address < start + max(nbytes, 1)]
    except Exception:  # deleted meanwhile, or no address to give
        pass
    views += tuple(s for s in inside if s.view_of)  # np.asarray of another Array over it
    shares = tuple(s for s in inside if not s.view_of)
    variables = [v for a in group for v in _user_variables(a, names)]
    return views, shares, _fix_together(list(dict.fromkeys(variables)), views, shares)


def _shares_line(shares: tuple[_Sharer, ...]) -> str:
    """The line for arrays of other libraries (or NumPy's, through DLPack) over the buffer."""
    many = len(shares) > 1
    what = ("DLPack consumers" if many else "a DLPack consumer") if all(
        s.dlpack for s in shares) else ("arrays" if many else "an array")
    return (f"{what} of its buffer, the variable{'s' if many else ''} "
            f"{', '.join(repr(s.name) for s in shares)} in {shares[0].where} "
            "(np.from_dlpack of a jax.Array shares its buffer, and keeps it after the jax.Array "
            "is deleted; torch.from_dlpack does the same, jax-ml/jax#4636, seen with torch "
            "2.13 on a CPU in a trial, not in the kit's tests; a GPU's consumers not yet run "
            "on a GPU)")


def _fix_together(variables: list[str], views: tuple[_Sharer, ...],
                  shares: tuple[_Sharer, ...]) -> str:
    """The fix that lets a buffer go when NumPy views or other arrays share it: every name
    goes (jax-ml/jax#1961: `del x, a1` left it to a2; jax-ml/jax#4636: `del w` left it to a
    DLPack consumer); "" where nothing shares it."""
    if not views and not shares:
        return ""
    every = ", ".join(dict.fromkeys([*variables, *(s.name for s in views + shares)]))
    x = variables[0] if variables else "x"
    said = []
    if views:
        many = len(views) > 1
        said.append(f"{_listed([v.name for v in views])} "
                    f"{'are NumPy views' if many else 'is a NumPy view'} of its buffer, "
                    f"np.asarray of a CPU array (np.array({x}) instead makes a copy that holds "
                    "nothing of JAX's; jax-ml/jax#1961)")
    if shares:
        many = len(shares) > 1
        said.append(f"{_listed([s.name for s in shares])} share{'' if many else 's'} its "
                    f"buffer, which stays while {'they live' if many else 'it lives'}, even "
                    f"after {x + '.delete()' if variables else 'the jax.Array is deleted'} "
                    "(jax-ml/jax#4636)")
    alone = f"`del {', '.join(variables)}` alone frees nothing: " if variables else ""
    return f"`del {every}` when you are done; {alone}{'; '.join(said)}"


def _listed(items: list[str]) -> str:
    """'a', 'b' and 'c'."""
    quoted = [repr(i) for i in items]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def _user_variables(arr: Any, names: list[tuple[str, Mapping]]) -> list[str]:
    """The notebook's variables bound to ``arr`` (not IPython's history names)."""
    out: list[str] = []
    for label, ns in names:
        if _users(label):
            out += [k for k in _keys_holding(ns, arr) if isinstance(k, str)
                    and k not in _HISTORY and not (k.startswith("_") and k[1:].isdigit())]
    return out


def _instance_of(attributes: dict, owners: list) -> Any:
    """The object whose ``__dict__`` is ``attributes``, among its referrers; None if none."""
    import types

    return next((o for o in owners if not isinstance(o, (type, types.ModuleType,
                                                         types.FrameType, dict))
                 and getattr(o, "__dict__", None) is attributes), None)


def _object_holder(obj, arr, names, mine, deadline: float = float("inf")) -> tuple[str, str]:
    """An object that holds the array (a model, a config): named by the variable that holds
    it, or as jit's: a static argument stays in jit's caches after the user lets it go."""
    import gc
    import types

    if _is_display_hook(obj):  # reached as ip.displayhook: IPython's history, not a copy
        return (f"IPython's output history: its display hook's "
                f"{', '.join(_attributes_holding(obj, arr, ('_', '__', '___'))) or 'result'}",
                _fix_out(arr, names))
    if type(obj).__name__ == "ExecutionResult" and type(obj).__module__.startswith("IPython"):
        return ("IPython's record of the last cell run: get_ipython().last_execution_result."
                "result (kept where the output cache is off, InteractiveShell.cache_size = 0)",
                "it lets go when the next cell has run; ending the cell with `;` keeps nothing")
    kind = f"a {_type_name(obj)} object"
    owners = [o for o in gc.get_referrers(obj)
              if id(o) not in mine and not isinstance(o, types.FrameType)]
    try:
        attrs = _keys_holding(vars(obj), arr)
    except TypeError:  # no __dict__
        attrs = []
    for _, ns in names:
        if any(o is ns for o in owners) and (keys := _keys_holding(ns, obj)):
            return (f"{kind}, the variable {keys[0]!r} in {_name_in(ns, names)}",
                    _attribute_fix(keys[0], obj, attrs[0], _set_none(keys[0], obj, attrs[0]))
                    if attrs and isinstance(attrs[0], str) else
                    f"`del {keys[0]}` (or drop its array attribute) when you are done")
    boxes = jaxcompat.static_argument_boxes()
    if boxes and owners and all(isinstance(o, boxes) for o in owners):
        return (f"{_JIT_CACHE}, through {kind} passed as a static argument",
                "jax.clear_caches() lets it go now (measured on jax 0.8.0 to 0.12.0.1; from "
                "0.10.2, deleting the jitted function and its clear_cache() do not); keep "
                "arrays out of static arguments: pass them as traced arguments instead")
    if found := _path_to(obj, names, mine | {id(owners)}, deadline=deadline):
        del owners
        path, ns = found
        named = [k for k in attrs if isinstance(k, str)]
        held = f"{path}.{named[0]}" if named else path
        return (f"{kind}, reached as {held} from {_name_in(ns, names)}",
                (_set_none(path, obj, named[0]) if named else f"`del {held}`")
                + " once you hold a newer copy elsewhere: "
                "an object that keeps an array your loop has replaced keeps one more copy of "
                "it (keras-team/keras-core#888: each variable kept its old value beside the "
                "state the trainer updated, a third copy of the model)")
    return (kind, "")


def _path_to(obj, names: list[tuple[str, Mapping]], mine: set[int], depth: int = 4,
             scans: int = 12, deadline: float = float("inf")) -> tuple[str, Mapping] | None:
    """(the expression that reaches ``obj`` from a variable of the user's, e.g.
    ``model.trainable_variables[0]``, and the namespace of that variable) through lists,
    tuples, dicts and objects' attributes, at most ``depth`` steps up and ``scans`` reads of
    the heap (each get_referrers reads the whole heap), and not past ``deadline``; None where
    no variable is found."""
    import gc
    import types

    nodes, tails = [obj], [""]  # (two lists: a tuple of the two would refer to the node)
    seen = {id(obj)}
    for _ in range(depth):
        above, above_tails = [], []
        ours = mine | {id(nodes), id(tails), id(above), id(above_tails), id(seen)}
        for n in range(len(nodes)):
            scans -= 1
            if scans < 0 or time.perf_counter() > deadline:
                return None
            for r in gc.get_referrers(nodes[n]):
                if id(r) in ours or id(r) in seen or \
                        isinstance(r, (types.FrameType, type, types.ModuleType)):
                    continue
                for label, ns in names:
                    if r is ns and _users(label) and (keys := [
                            k for k in _keys_holding(ns, nodes[n]) if isinstance(k, str)
                            and not k.startswith("_") and k not in ("In", "Out")]):
                        return f"{keys[0]}{tails[n]}", ns
                if isinstance(r, dict) and "__name__" in r and "__spec__" in r:
                    continue  # a module's globals other than the user's: not a path of theirs
                if isinstance(r, (list, tuple, dict)):
                    step, holder = _index_of(r, nodes[n]), r
                    if isinstance(r, dict):  # an object's __dict__? one more read of the heap
                        scans -= 1
                        if scans < 0 or time.perf_counter() > deadline:
                            return None
                        if (owner := _instance_of(r, gc.get_referrers(r))) is not None:
                            keys = [k for k in _keys_holding(r, nodes[n]) if isinstance(k, str)]
                            step, holder = (f".{keys[0]}" if keys else ""), owner
                elif getattr(r, "__dict__", None) is not None:
                    keys = [k for k in _keys_holding(vars(r), nodes[n]) if isinstance(k, str)]
                    step, holder = (f".{keys[0]}" if keys else ""), r
                else:
                    continue
                if step and id(holder) not in seen:
                    seen.update({id(r), id(holder)})
                    above.append(holder)
                    above_tails.append(step + tails[n])
        nodes, tails = above, above_tails
        if not nodes:
            return None
    return None


def _attribute_holding(owner, value, mine) -> tuple[Any, str]:
    """(the object, the attribute's name) where ``owner`` is an object whose attribute is
    ``value``, or the ``__dict__`` of one; (None, "") otherwise."""
    import gc
    import types

    if isinstance(owner, dict):  # an instance's __dict__: the object is one of its referrers
        owner = _instance_of(owner, [o for o in gc.get_referrers(owner) if id(o) not in mine])
    if owner is None or isinstance(owner, (type, types.ModuleType, types.FrameType)):
        return None, ""
    try:
        attrs = [k for k, v in vars(owner).items() if v is value]
    except TypeError:  # no __dict__
        return None, ""
    return (owner, attrs[0]) if attrs else (None, "")


def _named_attribute(owner, value, names: list[tuple[str, Mapping]], mine: set[int]
                     ) -> tuple[str, str, Any, str] | None:
    """(the variable, the attribute, the object, where the variable is) where ``owner`` is an
    object, or its ``__dict__``, whose attribute is ``value`` and a variable names the object;
    None otherwise."""
    obj, attr = _attribute_holding(owner, value, mine)
    for _, ns in names if obj is not None else ():
        if keys := _keys_holding(ns, obj):
            return keys[0], attr, obj, _name_in(ns, names)
    return None


def _attributes_holding(obj, value, attributes: tuple[str, ...]) -> list[str]:
    """Those of ``attributes`` of ``obj`` that are ``value``. (A function of its own, as
    :func:`_keys_holding` is.)"""
    return [k for k in attributes if getattr(obj, k, None) is value]


def _type_name(obj) -> str:
    """An object's type as module.qualname, e.g. "__main__.Trainer"."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _ipythons(ns: Mapping, key: str, value, names: list[tuple[str, Mapping]]) -> bool:
    """The notebook's ``_``, ``__``, ``___`` or ``_N`` bound to ``value`` is IPython's output
    history, not a variable of the user's (``loss, _ = train()``: a review): its display hook
    holds the same object under that name, or Out (or the hidden namespace) under that
    number."""
    import sys

    mod = sys.modules.get("IPython")
    ip = mod.get_ipython() if mod is not None else None
    hook = getattr(ip, "displayhook", None)
    if key in _HISTORY:
        return hook is not None and getattr(hook, key, None) is value
    hidden = next((n for lb, n in names if lb == _HIDDEN), {})
    out = ns.get("Out")
    return (isinstance(out, dict) and out.get(int(key[1:])) is value) or \
        hidden.get(key) is value


def _is_display_hook(obj) -> bool:
    """IPython's display hook (ipykernel's ZMQShellDisplayHook in Jupyter is one), which keeps
    the last results as ``_``, ``__``, ``___``."""
    import sys

    mod = sys.modules.get("IPython.core.displayhook")
    return mod is not None and isinstance(obj, mod.DisplayHook)


def _keys_holding(ns: Mapping, value) -> list:
    """The names in ``ns`` bound to ``value``. (A function of its own: a comprehension that
    named ``value`` inside the kit's search would hold it in a closure cell, one more referrer
    the search would then find.)"""
    return [k for k, v in ns.items() if v is value]


def _index_of(container, arr) -> str:
    if isinstance(container, dict):
        keys = [k for k, v in container.items() if v is arr]
        return f"[{keys[0]!r}]" if keys else ""
    if isinstance(container, (list, tuple)):
        return next((f"[{i}]" for i, v in enumerate(container) if v is arr), "")
    return ""


def _is_jax_owned(obj) -> bool:
    module = type(obj).__module__ or ""
    return module.split(".")[0] in ("jax", "jaxlib", "helpers")
