"""The kit's one line tracer: which line of the user's code is running, how often each ran, and
how often each called into JAX outside any transformation.

Python lets a thread have one tracer (``sys.settrace``), so the kit installs one and its users
share it: :func:`helpers.transfers.trace` marks its log with the running line, and ``%%memory``
(:mod:`helpers.ipython`) counts each line's runs and its calls into JAX, where a loop of tiny
operations outside ``jit`` pays JAX's dispatch for each (jax-ml/jax#968), and its reads, waits
(``block_until_ready``) and clock reads that meet work still being computed. Nesting a second
:func:`follow` adds to the tracer already running; a tracer of another tool (a debugger,
coverage) is never displaced: then nothing is followed.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import re
import sys
import threading
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

_OTHER, _USER, _JAX_CALL, _JAX_READ, _JAX_BLOCK = 0, 1, 2, 3, 4
#: a line that waits on an array's method: x.block_until_ready() (a C++ method, which a line
#: tracer never sees called: the line's text tells). jax.block_until_ready(x) is JAX's Python
#: function, seen called
_BLOCKS = re.compile(r"(?<!\bjax)\.block_until_ready\(")
#: a line that reads the clock: time.time(), time.perf_counter(), time.monotonic() (or _ns)
_CLOCK = re.compile(r"\b(?:time\.)?(?:perf_counter|monotonic)(?:_ns)?\(|"
                    r"(?<![\w.])time\.time(?:_ns)?\(|(?<![\w.])time\(\)")
#: a line that tests a condition: a clock read there throttles (log every 10 s), times no step
_CONDITION = re.compile(r"\s*(?:if|elif|while)\b")
_PLAIN, _BLOCK_LINE, _CLOCK_LINE = 0, 1, 2
#: per line, the reads that waited which the tracer follows to their return (each look lists
#: the live arrays)
MOST_LOOKS = 64
#: a generator's or coroutine's code: each resume is a "call" event, not a call into JAX
_RESUMED = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


@dataclass
class Followed:
    """What the tracer saw while it ran: per user line, keyed by (file, line number)."""

    runs: Counter = field(default_factory=Counter)  # times the line ran
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
    #: of those, the runs that found an array still being computed: the time read measures
    #: dispatch, not the work (p-doom/jasmine#43)
    clock_pending: Counter = field(default_factory=Counter)


class _Tracer:
    def __init__(self) -> None:
        self.seen = Followed()
        self.on_line: list[Callable] = []
        self.kinds: dict = {}  # code object -> its kind
        self.texts: dict = {}  # (file, line) -> _PLAIN, _BLOCK_LINE or _CLOCK_LINE
        self.block_open = None  # (frame, key) of a x.block_until_ready() line that waited
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
        elif kind == _CLOCK_LINE and seen.clock_reads[key] < MOST_LOOKS:
            seen.clock_reads[key] += 1
            seen.clock_pending[key] += bool(_pending())

    def settle(self, frame) -> None:
        """The line of ``frame`` that waited on an array's method has ended: was anything
        left computing? Nothing: it waited for the last work queued."""
        if self.block_open is not None and self.block_open[0] is frame:
            key, self.block_open = self.block_open[1], None
            if _pending() is False:
                self.seen.idle_blocks[key] += 1

    def local(self, frame, event, arg):
        if event == "line":
            self.settle(frame)
            key = (frame.f_code.co_filename, frame.f_lineno)
            self.seen.runs[key] += 1
            if key not in self.seen.function_of:
                code = frame.f_code
                self.seen.function_of[key] = (code.co_filename, code.co_firstlineno,
                                              code.co_name)
            self.mark(frame)
            self.looks(frame, key)
        elif event == "return":
            self.settle(frame)  # back to the innermost user frame still running: its line again
            # (a jitted function traced, or a callback of the user's, has returned: what follows
            # belongs to the line that called into JAX, not to the last line that ran)
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
        elif kind == _JAX_BLOCK and self.seen.blocks[key] < MOST_LOOKS:
            try:  # jax.block_until_ready(x): its first parameter, a pytree
                import jax

                first = frame.f_locals[frame.f_code.co_varnames[0]]
                waits = any(not a.is_ready() for a in jax.tree.leaves(first)
                            if hasattr(a, "is_ready"))
            except Exception:  # not JAX's function of a pytree, or an array deleted
                waits = False
            if waits:
                self.seen.blocks[key] += 1
                return self._after_read(key, self.seen.idle_blocks)
        elif kind == _JAX_READ:
            self.seen.reads[key] += 1
            if self.seen.looked[key] < MOST_LOOKS:
                try:  # (is_ready never waits; at a "call" event f_locals holds the arguments)
                    waits = not frame.f_locals["self"].is_ready()
                except Exception:  # no array there, or one deleted
                    waits = False
                if waits:
                    self.seen.looked[key] += 1
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


def _pending() -> bool | None:
    """Is any live array still being computed? None where that cannot be told (an array
    deleted meanwhile)."""
    try:
        import jax

        return any(not a.is_ready() for a in jax.live_arrays())
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
