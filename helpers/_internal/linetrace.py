"""The kit's one line tracer: which line of the user's code is running, how often each ran, and
how often each called into JAX outside any transformation.

Python lets a thread have one tracer (``sys.settrace``), so the kit installs one and its users
share it: :func:`helpers.transfers.trace` marks its log with the running line, and ``%%memory``
(:mod:`helpers.ipython`) counts each line's runs and its calls into JAX, where a loop of tiny
operations outside ``jit`` pays JAX's dispatch for each (jax-ml/jax#968), and its reads, waits
(``block_until_ready``) and clock reads that meet work still being computed, which clock reads
pair up as a timer's start and end, and what ran between them. Nesting a second
:func:`follow` adds to the tracer already running; a tracer of another tool (a debugger,
coverage) is never displaced: then nothing is followed.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import numbers
import os
import re
import sys
import threading
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from helpers._internal import frames, jaxcompat

__all__ = ["MOST_LOOKS", "Followed", "follow"]

#: JAX functions that read an array's value back to Python: each waits for the array's work
_READS = frozenset({"__float__", "__int__", "__bool__", "__index__", "__complex__",
                    "__array__", "__repr__", "__str__", "__format__", "item", "_item",
                    "tolist", "_tolist"})

#: JAX functions that read an array back (``_READS``) or describe it, rather than start work
#: on it: a call to one is not an operation dispatched (float(loss) in a training loop is not
#: jax#968's cost); nor is a pytree's flatten or unflatten (a typed key's, which a jitted call
#: runs in Python)
_NOT_OPERATIONS = _READS | frozenset({
    "__len__", "__hash__", "__dlpack__",
    "block_until_ready", "is_ready", "copy_to_host_async", "is_deleted", "delete",
    "shape", "dtype", "ndim", "size", "nbytes", "itemsize", "sharding", "devices", "device",
    "weak_type", "aval", "committed", "is_fully_addressable", "is_fully_replicated",
    "addressable_shards", "format", "layout", "_value", "__del__"})

_OTHER, _USER, _JAX_CALL, _JAX_READ, _JAX_BLOCK, _JAX_GET = 0, 1, 2, 3, 4, 5
#: a line that reads an array back through NumPy, np.asarray(x) or np.array(x) (a C++ read, no
#: Python call for a line tracer to see: the line's text tells, and the name read, the group)
_NUMPY_READ = re.compile(r"\bnp\.(?:asarray|array)\(\s*([A-Za-z_]\w*)")
#: a line that waits on an array's method: x.block_until_ready() (a C++ method, which a line
#: tracer never sees called: the line's text tells). jax.block_until_ready(x) is JAX's Python
#: function, seen called
_BLOCKS = re.compile(r"(?<!\bjax)\.block_until_ready\(")
#: a line that reads the clock: time.time(), time.perf_counter(), time.monotonic() (or _ns)
_CLOCK = re.compile(r"\b(?:time\.)?(?:perf_counter|monotonic)(?:_ns)?\(|"
                    r"(?<![\w.])time\.time(?:_ns)?\(|(?<![\w.])time\(\)")
#: a line that tests a condition: a clock read there throttles (log every 10 s), times no step
_CONDITION = re.compile(r"\s*(?:if|elif|while)\b")
_PLAIN, _BLOCK_LINE, _CLOCK_LINE, _READ_LINE = 0, 1, 2, 3
#: per line, the reads that waited which the tracer follows to their return (each look lists
#: the live arrays)
MOST_LOOKS = 64
#: a generator's or coroutine's code: each resume is a "call" event, not a call into JAX
_RESUMED = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
#: a comprehension's own code (Python 3.11 and before; a generator expression on every version):
#: each item it runs is a line event of the line, not a run of it
_COMPREHENSIONS = frozenset({"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"})
#: Python 3.12 and later run a list, set or dict comprehension in its caller's frame (PEP 709):
#: its items are line events of the same line again, in the same frame
_INLINED = sys.version_info >= (3, 12)
#: a line with a comprehension in it, and a line that is a loop statement (whose passes on one
#: line are runs of it)
_COMPREHENSION = re.compile(r"\bfor\b.*\bin\b")
_LOOP_STATEMENT = re.compile(r"\s*(?:async\s+)?(?:for|while)\b")
#: a timer's end: the clock read, then minus the name its start was kept in
#: (``time.time() - start``)
_MINUS = re.compile(r"\)?\s*-\s*([A-Za-z_][\w.]*)")
#: a timer's start (or an end kept to be subtracted from): ``start = time.perf_counter()``
_KEPT = re.compile(r"\s*([A-Za-z_][\w.]*)\s*=\s*(?:time\.)?(?:time|perf_counter|monotonic)"
                   r"(?:_ns)?\(\)\s*$")
#: the public modules through which a call is an operation JAX dispatches (``jnp.dot(a, b)``;
#: a function imported bare is looked for by its own ``__module__``, jnp's are "jax.numpy")
_OPERATION_MODULES = ("jax.numpy", "jax.lax", "jax.random", "jax.nn", "jax.scipy", "jax.image")


@dataclass
class Followed:
    """What the tracer saw while it ran: per user line, keyed by (file, line number)."""

    runs: Counter = field(default_factory=Counter)  # times the line ran
    #: of ``runs``: those of a lambda written on the line, called from elsewhere (jax.tree.map
    #: applying it to each leaf: a new user's trial, NovaSky-AI/SkyRL#647's accumulation)
    lambda_runs: Counter = field(default_factory=Counter)
    #: calls from the line into JAX's Python code outside any transformation (not while jit,
    #: vmap or grad trace it), reads and descriptions of an array left out. Not dispatches:
    #: a jnp function JAX jits in C++ (jnp.sin) is dispatched with no Python call to count
    jax_calls: Counter = field(default_factory=Counter)
    #: reads of an array's value back to Python (float(), print, .item(), an if) that waited
    #: for the last work queued: the array was still being computed, and once read nothing
    #: was (the device idles until the host queues more). Looked at for the first
    #: ``MOST_LOOKS`` reads that waited, per line
    idle_reads: Counter = field(default_factory=Counter)
    #: every read of an array's value back to Python from the line, outside any transformation
    reads: Counter = field(default_factory=Counter)
    #: of those, the reads that waited which were followed to their return (``MOST_LOOKS``
    #: at most per line): ``idle_reads`` is out of these
    looked: Counter = field(default_factory=Counter)
    #: the function each line belongs to ((file, first line, name) of its code): the lines of
    #: one loop body are in one function, and its most-run line is the loop's passes
    function_of: dict = field(default_factory=dict)
    #: waits for arrays from the line, ``jax.block_until_ready(x)`` or ``x.block_until_ready()``,
    #: that found one still being computed (``MOST_LOOKS`` looked at, at most, per line)
    blocks: Counter = field(default_factory=Counter)
    #: of those, the waits after which nothing was being computed: the wait was for the last
    #: work queued, and the device idles until the host queues more (AI-Hypercomputer/maxtext
    #: #1956)
    idle_blocks: Counter = field(default_factory=Counter)
    #: runs of a line that reads the clock (time.time(), time.perf_counter()) looked at
    #: (``MOST_LOOKS`` at most per line), outside any transformation
    clock_reads: Counter = field(default_factory=Counter)
    #: of those, the runs that found an array still being computed (a timer's end: one its
    #: start did not find): the time read measures dispatch, not the work (p-doom/jasmine#43)
    clock_pending: Counter = field(default_factory=Counter)
    #: items a comprehension on the line ran (``[float(v) for v in out]``): not runs of the line
    #: (elegy-style counts read "ran 1,500 times" for 300 passes, jax-ml/jax#5605), but passes
    #: of a loop all the same
    items: Counter = field(default_factory=Counter)
    #: reads of one element of a jax.Array from the line (``x[i]``, an int per dimension),
    #: outside any transformation: each its own operation (jax-ml/jax#390)
    element_reads: Counter = field(default_factory=Counter)
    #: runs of a clock line looked at that started a timer which a later clock read of the same
    #: frame ended (``start = time.time()`` ... ``time.time() - start``)
    clock_starts: Counter = field(default_factory=Counter)
    #: of those, the starts that found an array still being computed where the timed lines
    #: waited (a block or a read) and the end found no other: the time includes the earlier
    #: work (jax-ml/jax#1219)
    early_starts: Counter = field(default_factory=Counter)
    #: per start line of ``early_starts``, the names of the frame's arrays still being
    #: computed when it read the clock (up to three)
    early_names: dict = field(default_factory=dict)
    #: clock lines of a timer whose start and end ran as often and a line between which ran
    #: again (an inner loop: a per-epoch time, jax-ml/jax#1797), per timer
    clock_loops: Counter = field(default_factory=Counter)
    #: waits of ``blocks`` that sat between two clock reads of their frame with no line run
    #: twice between them: a benchmark's waits (on its inputs, on its result), not a loop's
    timed_waits: Counter = field(default_factory=Counter)
    #: runs of a line between two clock reads of its frame that called a jitted function or a
    #: JAX operation and threw its result away, no wait after it (jax-ml/jax#1219)
    untimed_calls: Counter = field(default_factory=Counter)


class _Timers:
    """One frame's clock reads and what ran since: its timers' starts by name, lines run
    again, waits and results thrown away since the frame's last clock read."""

    __slots__ = ("started", "ran", "repeats", "at_last", "waits_seen", "waits", "dropped")

    def __init__(self) -> None:
        self.started: dict = {}  # name -> (key, pending, names, repeats, waits_seen) at start
        self.ran: set = set()  # line numbers run since the frame's last clock read, not it
        self.repeats = 0  # lines run again since a clock read, all told
        self.at_last = 0  # repeats at the frame's last clock read
        self.waits_seen = 0  # waits and reads that found work, all told
        self.waits: list = []  # block lines that found work since the last clock read
        self.dropped: list = []  # lines whose JAX call's result was thrown away since then


class _Tracer:
    def __init__(self) -> None:
        self.seen = Followed()
        self.on_line: list[Callable] = []
        self.kinds: dict = {}  # code object -> its kind
        self.texts: dict = {}  # (file, line) -> _PLAIN, _BLOCK_LINE or _CLOCK_LINE
        self.block_open = None  # (frame, key) of a x.block_until_ready() line that waited
        self.read_open = None  # (frame, key) of an np.asarray(x) line that found x computing
        self.read_looks: Counter = Counter()  # (file, line) -> its runs looked at
        self.timers: dict = {}  # frame -> _Timers, from its first clock read to its return
        self.roles: dict = {}  # (file, line) of a clock line -> (name kept, name subtracted)
        self.discards: dict = {}  # (file, line) -> the dotted name an expression calls, or ()
        self.comprehends: dict = {}  # (file, line) -> a comprehension, not a loop statement
        self.last_line: dict = {}  # frame -> its last line number (Python 3.12 and later)
        import jax

        self.jax_dir = os.path.dirname(jax.__file__) + os.sep
        self.clean = jaxcompat.outside_transforms()

    def kind(self, frame) -> int:
        """_USER, _JAX_READ (JAX reading a value back), _JAX_CALL (JAX's other Python code
        that starts work), or _OTHER: once per code object."""
        code = frame.f_code
        kind = self.kinds.get(code)
        if kind is None:
            kind = self.kinds[code] = (
                _USER if frames.is_user_frame(frame) else
                _JAX_READ if code.co_filename.startswith(self.jax_dir)
                and code.co_name in _READS else
                _JAX_BLOCK if code.co_filename.startswith(self.jax_dir)
                and code.co_name == "block_until_ready" else
                _JAX_GET if code.co_filename.startswith(self.jax_dir)
                and code.co_name == "device_get" else
                _JAX_CALL if code.co_filename.startswith(self.jax_dir)
                and code.co_name not in _NOT_OPERATIONS and "flatten" not in code.co_name
                and not code.co_flags & _RESUMED else _OTHER)
        return kind

    def mark(self, frame) -> None:
        for on_line in self.on_line:
            on_line(frame)

    def text(self, key) -> int:
        """What the line's text says it does: wait on an array's method, read the clock, or
        neither. Once per line."""
        kind = self.texts.get(key)
        if kind is None:
            source = linecache.getline(*key).split("#")[0]
            kind = self.texts[key] = (
                _BLOCK_LINE if _BLOCKS.search(source) else
                _CLOCK_LINE if _CLOCK.search(source) and not _CONDITION.match(source) else
                _READ_LINE if _NUMPY_READ.search(source) else
                _PLAIN)
        return kind

    def looks(self, frame, key) -> None:
        """At the start of a line that waits on an array's method or reads the clock: is an
        array still being computed? (the first ``MOST_LOOKS`` runs, outside transformations)"""
        kind = self.text(key)
        if kind == _PLAIN or not self.clean():
            return
        seen = self.seen
        if kind == _BLOCK_LINE and seen.blocks[key] < MOST_LOOKS and _pending():
            seen.blocks[key] += 1
            self.block_open = (frame, key)
            self.waited(frame, key)
        elif kind == _READ_LINE and self.read_looks[key] < MOST_LOOKS:
            self.read_looks[key] += 1  # looked at, waiting or not: a loader's line runs often
            source = linecache.getline(*key).split("#")[0]
            names = _NUMPY_READ.findall(source)
            if any(_computing_in(frame, name) for name in names):
                seen.reads[key] += 1
                seen.looked[key] += 1
                self.read_open = (frame, key)
                self.waited(frame, key, block=False)
        elif kind == _CLOCK_LINE:
            computing = None  # not looked at: a timer's start or end of unknown state
            if seen.clock_reads[key] < MOST_LOOKS:
                seen.clock_reads[key] += 1
                computing = _computing()
            self.clocked(frame, key, computing)

    def clocked(self, frame, key, computing: list | None) -> None:
        """A clock read at ``key``, which found ``computing`` still being computed (None: not
        looked at): it ends what ran since the frame's last one (waits there were a
        benchmark's, results thrown away were timed), ends the timer whose start it subtracts,
        and starts the one it keeps. A timer's end counts as finding work only for arrays its
        start did not find (one waited for in between can read as not ready for milliseconds
        more under the transfer guard, jax 0.8.0 and 0.10.2 on a CPU)."""
        seen, timers = self.seen, self.timers.get(frame)
        if timers is None:
            timers = self.timers[frame] = _Timers()
        else:
            if timers.repeats == timers.at_last:  # no line ran twice: no loop between
                for wait in timers.waits:
                    seen.timed_waits[wait] += 1
            for dropped in timers.dropped:
                seen.untimed_calls[dropped] += 1
        kept, subtracted = self.role(key)
        pending = None if computing is None else bool(computing)
        if subtracted in timers.started:
            start, found, names, repeats, waits_seen = timers.started[subtracted]
            if found is not None and computing is not None:
                pending = any(all(a is not r() for r in found) for a in computing)
                seen.clock_starts[start] += 1
                if found and not pending and timers.waits_seen > waits_seen:
                    seen.early_starts[start] += 1
                    seen.early_names.setdefault(start, names)
            if timers.repeats > repeats and seen.runs[start] == seen.runs[key]:
                seen.clock_loops[start] += 1
                seen.clock_loops[key] += 1
        if computing is not None:
            seen.clock_pending[key] += bool(pending)
        if kept:
            timers.started[kept] = (
                key, None if computing is None else [weakref.ref(a) for a in computing],
                _pending_names(frame, computing) if computing else (), timers.repeats,
                timers.waits_seen)
        timers.ran, timers.at_last = set(), timers.repeats  # the read itself is no repeat
        timers.waits, timers.dropped = [], []

    def role(self, key) -> tuple[str, str]:
        """(the name a clock line keeps its read in, the name of the start it subtracts),
        each "" where none: ``t0 = time.time()`` keeps t0; ``dt = time.time() - t0``, or
        ``t1 = time.time()`` where the file reads ``t1 - t0``, subtracts t0. Once per line."""
        role = self.roles.get(key)
        if role is None:
            source = linecache.getline(*key).split("#")[0]
            kept = m.group(1) if (m := _KEPT.match(source)) else ""
            subtracted = next((m.group(1) for c in _CLOCK.finditer(source)
                               if (m := _MINUS.match(source, c.end()))), "")
            if kept and not subtracted:  # an end kept first: t1 = time.time(); t1 - t0
                text = "".join(linecache.getlines(key[0]))
                subtracted = next((m.group(1) for m in re.finditer(
                    rf"(?<![\w.]){re.escape(kept)}\s*-\s*([A-Za-z_][\w.]*)", text)
                    if m.group(1) != kept), "")
            role = self.roles[key] = (kept, subtracted)
        return role

    def waited(self, frame, key, block: bool = True) -> None:
        """A wait with block_until_ready (or a read, ``block`` False) in ``frame`` found work
        still being computed: the timer running there waited for it. A result thrown away
        before it is no longer said to be untimed: what the wait covered is not known."""
        while frame.f_code.co_name in _COMPREHENSIONS and frame.f_back is not None:
            frame = frame.f_back  # [float(v) for v in out] waits for its caller's timer
        timers = self.timers.get(frame)
        if timers is not None:
            timers.waits_seen += 1
            timers.dropped.clear()
            if block:
                timers.waits.append(key)

    def ran(self, frame, key) -> None:
        """A line of a frame that has read the clock: a line run again since (a loop), or a
        call into JAX whose result the line throws away."""
        timers = self.timers.get(frame)
        if timers is None:
            return
        if key[1] in timers.ran:
            timers.repeats += 1
        else:
            timers.ran.add(key[1])
        name = self.discarded(key)
        if name and self.clean() and _dispatches(frame, name):
            timers.dropped.append(key)

    def discarded(self, key) -> tuple[str, ...]:
        """The dotted name (``("jnp", "dot")``) a line calls as a whole expression statement,
        its result thrown away (``f(a, b)``); () for any other line. Once per line."""
        name = self.discards.get(key)
        if name is None:
            name = ()
            try:
                (statement,) = ast.parse(linecache.getline(*key).strip()).body
            except (SyntaxError, ValueError):
                statement = None
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                func, parts = statement.value.func, []
                while isinstance(func, ast.Attribute):
                    parts.insert(0, func.attr)
                    func = func.value
                if isinstance(func, ast.Name):
                    name = (func.id, *parts)
            self.discards[key] = name
        return name

    def item(self, frame, key) -> bool:
        """Is this line event an item of a comprehension on the line, not a run of it? A
        comprehension's own frame (Python 3.11; a generator expression), or, from Python 3.12,
        the same line again in the same frame on a line with a comprehension that is not a
        loop statement."""
        if frame.f_code.co_name in _COMPREHENSIONS:
            return True
        if not _INLINED:
            return False
        again, self.last_line[frame] = self.last_line.get(frame) == key[1], key[1]
        if not again:
            return False
        comprehends = self.comprehends.get(key)
        if comprehends is None:
            source = linecache.getline(*key).split("#")[0]
            comprehends = self.comprehends[key] = bool(
                _COMPREHENSION.search(source) and not _LOOP_STATEMENT.match(source))
        return comprehends

    def settle(self, frame) -> None:
        """The line of ``frame`` that waited on an array's method has ended: was anything
        left computing? Nothing: it waited for the last work queued."""
        if self.block_open is not None and self.block_open[0] is frame:
            key, self.block_open = self.block_open[1], None
            if _pending() is False:
                self.seen.idle_blocks[key] += 1
        if self.read_open is not None and self.read_open[0] is frame:
            key, self.read_open = self.read_open[1], None
            if _pending() is False:
                self.seen.idle_reads[key] += 1

    def local(self, frame, event, arg):
        if event == "line":
            self.settle(frame)
            key = (frame.f_code.co_filename, frame.f_lineno)
            if self.item(frame, key):
                self.seen.items[key] += 1
            else:
                self.seen.runs[key] += 1
                if frame.f_code.co_name == "<lambda>":
                    self.seen.lambda_runs[key] += 1
            if key not in self.seen.function_of:
                code, outer = frame.f_code, frame
                while code.co_name in _COMPREHENSIONS and outer.f_back is not None:
                    outer = outer.f_back  # a comprehension's lines are its caller's
                    code = outer.f_code
                self.seen.function_of[key] = (code.co_filename, code.co_firstlineno,
                                              code.co_name)
            self.mark(frame)
            self.ran(frame, key)
            self.looks(frame, key)
        elif event == "return":
            self.settle(frame)  # back to the innermost user frame still running: its line again
            # (a jitted function traced, or a callback of the user's, has returned: what follows
            # belongs to the line that called into JAX, not to the last line that ran)
            self.timers.pop(frame, None)
            self.last_line.pop(frame, None)
            back = frame.f_back
            while back is not None and self.kind(back) != _USER:
                back = back.f_back
            if back is not None:
                self.mark(back)
        return self.local

    def calls(self, frame, event, arg):
        if event != "call":
            return None
        kind = self.kind(frame)
        if kind == _USER:
            return self.local
        if kind == _OTHER or (key := self._called_from(frame)) is None:
            return None
        if kind == _JAX_CALL:
            self.seen.jax_calls[key] += 1
            if frame.f_code.co_name == "__getitem__" and _element(frame):
                self.seen.element_reads[key] += 1
        elif kind == _JAX_BLOCK and self.seen.blocks[key] < MOST_LOOKS:
            if _first_argument_computing(frame):  # jax.block_until_ready(x)
                self.seen.blocks[key] += 1
                self.waited(frame.f_back, key)
                return self._after_read(key, self.seen.idle_blocks)
        elif kind == _JAX_GET and self.seen.looked[key] < MOST_LOOKS:
            self.seen.reads[key] += 1
            if _first_argument_computing(frame):  # jax.device_get(x)
                self.seen.looked[key] += 1
                self.waited(frame.f_back, key, block=False)
                return self._after_read(key, self.seen.idle_reads)
        elif kind == _JAX_READ:
            self.seen.reads[key] += 1
            if self.seen.looked[key] < MOST_LOOKS:
                try:  # (is_ready never waits; at a "call" event f_locals holds the arguments)
                    waits = not frame.f_locals["self"].is_ready()
                except Exception:  # no array there, or one deleted
                    waits = False
                if waits:
                    self.seen.looked[key] += 1
                    self.waited(frame.f_back, key, block=False)
                    return self._after_read(key, self.seen.idle_reads)
        return None

    def _called_from(self, frame) -> tuple[str, int] | None:
        """The user's line (file, line) that called JAX's ``frame`` itself, outside any
        transformation; None where a library or JAX called it, or inside one."""
        back = frame.f_back
        if back is None or self.kind(back) != _USER or not self.clean():
            return None
        return back.f_code.co_filename, back.f_lineno

    def _after_read(self, key, idle: Counter):
        """A tracer for a read (or a wait) that waited: when it returns, was anything left
        computing? Nothing: it waited for the last work queued, and the device now idles
        (counted in ``idle``)."""
        def local(frame, event, arg):
            if event == "return" and _pending() is False:
                idle[key] += 1
            return local
        return local


def _element(frame) -> bool:
    """At the call of a jax.Array's ``__getitem__``: does it read one element (an int for each
    dimension, ``x[i]`` of a vector)?"""
    try:
        arguments = frame.f_locals
        index, ndim = arguments["idx"], arguments["self"].ndim
    except Exception:  # not the array's own __getitem__
        return False
    index = index if isinstance(index, tuple) else (index,)
    return len(index) == ndim > 0 and all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in index)


def _dispatches(frame, name: tuple[str, ...]) -> bool:
    """Does ``name``, read in ``frame`` (through modules only), call a jitted function or an
    operation of jax.numpy, jax.lax, jax.random, jax.nn or jax.scipy?"""
    if not name:
        return False
    root, *parts = name
    scope = frame.f_locals
    obj = scope[root] if root in scope else frame.f_globals.get(root)
    module = ""
    for part in parts:
        if not isinstance(obj, types.ModuleType):
            return False  # an attribute of an object may run code to be read: not looked at
        module, obj = obj.__name__, getattr(obj, part, None)
    if isinstance(obj, types.ModuleType) or not callable(obj):
        return False
    if hasattr(type(obj), "lower") and hasattr(type(obj), "clear_cache"):  # jax.jit's
        return True
    module = module or getattr(obj, "__module__", None) or ""
    return module.startswith(_OPERATION_MODULES)


def _computing_in(frame, name: str) -> bool:
    """Is the value ``name`` names in ``frame`` (a local, else a global) a jax.Array, or a
    pytree holding one, still being computed? (is_ready never waits)"""
    scope = frame.f_locals
    value = scope[name] if name in scope else frame.f_globals.get(name)
    if value is None or isinstance(value, (int, float, str, bytes)) or (
            isinstance(value, (list, tuple)) and len(value) > 64):  # host rows, not metrics
        return False
    return _tree_computing(value)


def _first_argument_computing(frame) -> bool:
    """At the call of JAX's function of a pytree (jax.block_until_ready, jax.device_get): is an
    array in its first parameter still being computed? (at a "call" event f_locals holds the
    arguments)"""
    try:
        first = frame.f_locals[frame.f_code.co_varnames[0]]
    except Exception:  # not a function with a parameter
        return False
    return _tree_computing(first)


def _tree_computing(value) -> bool:
    """Is an array among ``value``'s pytree leaves still being computed? False where one was
    deleted or JAX cannot flatten the value."""
    try:
        import jax

        return any(not a.is_ready() for a in jax.tree.leaves(value) if hasattr(a, "is_ready"))
    except Exception:  # an array deleted, or a value JAX cannot flatten
        return False


def _pending_names(frame, computing: list) -> tuple[str, ...]:
    """The names in ``frame`` (up to three) of the arrays in ``computing``: those one reading
    found still being computed. (Asking each array again raced with the work: one that became
    ready in between lost its name, and a timer's start was named by none.)"""
    ids = {id(a) for a in computing}
    return tuple(sorted(name for name, value in list(frame.f_locals.items())
                        if not name.startswith("_") and id(value) in ids)[:3])


def _pending() -> bool | None:
    """Is any live array still being computed? None where that cannot be told (an array
    deleted meanwhile)."""
    try:
        import jax

        return any(not a.is_ready() for a in jax.live_arrays())
    except Exception:
        return None


def _computing() -> list | None:
    """The live arrays still being computed; None where that cannot be told."""
    try:
        import jax

        return [a for a in jax.live_arrays() if not a.is_ready()]
    except Exception:
        return None


_local = threading.local()  # .tracer: the one running on this thread, if the kit's


@contextlib.contextmanager
def follow(on_line: Callable | None = None) -> Iterator[Followed | None]:
    """Follow the user's code on this thread while the block runs: ``on_line(frame)`` is
    called as each user line starts (and again when a call into a library returns to it).
    Yields what was seen, filled as the block runs (shared with an enclosing ``follow``); None
    while another tool's tracer is installed (nothing is followed then)."""
    running = getattr(_local, "tracer", None)
    if running is not None and sys.gettrace() == running.calls:
        if on_line is not None:
            running.on_line.append(on_line)
        try:
            yield running.seen
        finally:
            if on_line is not None:
                running.on_line.remove(on_line)
        return
    if sys.gettrace() is not None:
        yield None
        return
    tracer = _Tracer()
    if on_line is not None:
        tracer.on_line.append(on_line)
    caller = sys._getframe(1)
    while caller is not None and not frames.is_user_frame(caller):
        caller = caller.f_back  # the user's frame that runs it: traced from now on
    _local.tracer = tracer
    sys.settrace(tracer.calls)
    if caller is not None:
        caller.f_trace_lines = True
        caller.f_trace = tracer.local
    try:
        yield tracer.seen
    finally:
        sys.settrace(None)
        _local.tracer = None
        if caller is not None:
            caller.f_trace = None
