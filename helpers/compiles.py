"""What a block of code compiled, how often, and why it compiled again.

A jitted function compiles once per new *signature*: the shapes and dtypes of its array
arguments, the values of its static arguments, the structure of its pytrees, and the function
object itself. A loop that changes any of them compiles again every time. Each compile costs
seconds, and each compiled program stays in JAX's cache, in host memory, for as long as the
function lives: a "memory leak in a simple loop" that grows with every new shape.

JAX explains each of its own cache misses when ``jax_explain_cache_misses`` is on (it logs
"TRACING CACHE MISS ... because ..."), and counts each XLA compile through
:mod:`jax.monitoring`. :func:`watch` turns both on for a block, keeps JAX's explanations
verbatim, and sums them up per function: how many compiles, what changed between them, the
line that called it, and the fix, in a sentence.

>>> import jax, jax.numpy as jnp
>>> f = jax.jit(lambda x: x * 2)
>>> with watch() as log:
...     for n in (3, 4, 5):
...         _ = f(jnp.zeros(n))
>>> log.function("<lambda>").compiles, log.function("<lambda>").cause
(3, 'new shapes')
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import jax

from helpers._internal import jaxcompat
from helpers._internal.records import Display, Record
from helpers.errors import BadInputError, InUseError

__all__ = ["CacheMiss", "CompileLog", "FunctionCompiles", "watch"]

#: the causes, in the order the diagnosis ranks them when a function has several
CAUSES = ("function made anew", "new shapes", "new dtypes", "new static values",
          "new pytree structure", "other")
#: what to change, per cause; {f} is the function's name
FIXES = {
    "function made anew": "jit caches by the function object, and a function defined (or "
                          "jitted) inside a loop is a new object each time: define and jit it "
                          "once, outside the loop",
    "new shapes": "pad or bucket the inputs to a few fixed shapes (say, powers of two), so one "
                  "compiled program serves many",
    "new dtypes": "pass one dtype every call: cast inputs with .astype(), and mind that a Python "
                  "scalar is weakly typed while an array of the same value is not",
    "new static values": "a static argument compiles once per value: make it a traced "
                         "argument if it only feeds arithmetic, or keep its values few",
    "new pytree structure": "keep the pytree's structure the same every call (the same keys, "
                            "no leaf that is sometimes None)",
    "other": "read JAX's explanation below",
}
_EAGER = "eager operations"
_CACHED = ("Each compiled program stays cached, in host memory, while its function lives; "
           "jax.clear_caches() drops them all.")
_active = threading.Lock()  # one watch at a time per process: the config and logger are global


@dataclass(frozen=True)
class CacheMiss(Record):
    """One of JAX's own cache-miss explanations, parsed: which function, where it was called
    and defined, the cause, what changed, and JAX's words verbatim."""

    function: str
    called_at: str  # "train.py:42" ("" when JAX did not say)
    defined_at: str
    cause: str  # "first compile" or one of CAUSES
    changed: str  # e.g. "x: now f32[4], before f32[3]"
    argument: str  # for new shapes or dtypes: the argument ("x"), and its new type ("f32[4]")
    now: str
    explanation: str  # JAX's text


@dataclass(frozen=True)
class FunctionCompiles(Record):
    """One function's compiles in the block: how many, the seconds XLA spent, why it compiled
    again (``cause``: the most frequent of its cache misses' causes), what changed, where it
    was called, and the fix in a sentence."""

    function: str
    defined_at: str
    compiles: int
    compile_seconds: float
    cause: str  # "first compile" when it compiled once, _EAGER for one-op programs
    changed: tuple[str, ...]  # new shapes or dtypes per argument, else JAX's first differences
    called_at: tuple[str, ...]
    fix: str

    @property
    def recompiled(self) -> bool:
        return self.compiles > 1 or self.cause == "function made anew"


class CompileLog(Display):
    """What a :func:`watch` block compiled. Filled when the block ends."""

    def __init__(self) -> None:
        self.functions: tuple[FunctionCompiles, ...] = ()
        self.misses: tuple[CacheMiss, ...] = ()
        self.seconds = 0.0  # the block's wall time
        self.finished = False

    @property
    def compiles(self) -> int:
        return sum(f.compiles for f in self.functions)

    @property
    def compile_seconds(self) -> float:
        return sum(f.compile_seconds for f in self.functions)

    @property
    def recompiled(self) -> tuple[FunctionCompiles, ...]:
        """The functions that compiled more than once (or were made anew), most compiles first;
        one-op programs run outside jit come last."""
        return tuple(f for f in self.functions if f.recompiled)

    def function(self, name: str) -> FunctionCompiles:
        """The entry of the function called ``name`` (``"eager operations"`` for jnp calls
        made outside jit)."""
        for f in self.functions:
            if f.function == name:
                return f
        known = ", ".join(f.function for f in self.functions) or "none"
        raise BadInputError(f"no function {name!r} compiled in this block; compiled: {known}")

    @property
    def diagnosis(self) -> str:
        """The cause and the fix, one or two sentences per function that compiled again."""
        if not self.finished:
            return "the block has not ended yet"
        if not self.recompiled:
            return (f"No function compiled more than once: {self.compiles} compile(s), each a "
                    "first.")
        return "\n".join([*(_sentence(f) for f in self.recompiled), _CACHED])

    def to_dict(self) -> dict:
        """Plain data: every function's entry and every cache miss JAX explained."""
        return {"compiles": self.compiles, "compile_seconds": self.compile_seconds,
                "seconds": self.seconds, "functions": [f.to_dict() for f in self.functions],
                "misses": [m.to_dict() for m in self.misses], "diagnosis": self.diagnosis}


def _sentence(f: FunctionCompiles) -> str:
    where = f" ({f.defined_at})" if f.defined_at else ""
    if f.cause == _EAGER:
        return (f"{f.compiles} one-operation programs were compiled outside jit "
                f"({', '.join(f.changed)}): a jnp call outside jit is compiled for each new "
                "shape too; inside a jitted function it is part of one program.")
    if f.cause == "function made anew":
        at = f" at {f.called_at[0]}" if f.called_at else ""
        head = f"`{f.function}`{where} was jitted anew {f.compiles} times{at}"
    else:
        changed = f" ({'; '.join(f.changed[:3])})" if f.changed else ""
        head = f"`{f.function}`{where} compiled {f.compiles} times, for {f.cause}{changed}"
    return f"{head}, {f.compile_seconds:.2f} s of compiling: {FIXES[f.cause]}."


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.misses: list[CacheMiss] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            parsed = jaxcompat.parse_cache_miss(record.getMessage())
        except Exception:  # never break the user's program over a log line
            return
        if parsed is not None:
            self.misses.append(CacheMiss(**parsed))


class _Quiet(logging.Filter):
    """Keeps JAX's cache-miss lines out of the notebook's stderr while the kit collects them
    (they are kept, verbatim, in the log's ``misses``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(jaxcompat.CACHE_MISS_PREFIX)


@contextlib.contextmanager
def watch() -> Iterator[CompileLog]:
    """Record every compile the block makes and JAX's reason for each; the log is filled when
    the block ends. JAX's explanations are kept verbatim in the log's ``misses`` rather than
    printed as they come. Exceptions from the block propagate; JAX's setting, the logger and the
    listener are restored either way. JAX explains only this thread's cache misses (its setting
    is per thread); compiles on other threads are counted as compiles of unexplained functions.
    """
    if not _active.acquire(blocking=False):
        raise InUseError("compiles.watch() is already active in this process; nest the code "
                         "inside the existing watch instead")
    log = CompileLog()
    collector, quiet = _Collector(), _Quiet()
    logger = logging.getLogger("jax")
    durations: list[tuple[str, float]] = []

    def on_duration(event: str, seconds: float, **kwargs) -> None:
        if event == jaxcompat.COMPILE_EVENT:
            durations.append((str(kwargs.get("fun_name", "")), seconds))

    t0 = time.perf_counter()
    others = [h for h in (*logging.getLogger().handlers, *logger.handlers)]
    level = logger.level
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        logger.addHandler(collector)
        for h in others:
            h.addFilter(quiet)
        if logger.getEffectiveLevel() > logging.WARNING:  # JAX explains at WARNING
            logger.setLevel(logging.WARNING)
        with jax.explain_cache_misses(True):
            yield log
    finally:
        try:
            logger.setLevel(level)
            logger.removeHandler(collector)
            for h in others:
                h.removeFilter(quiet)
            jaxcompat.unregister_duration_listener(on_duration)
        finally:
            log.seconds = time.perf_counter() - t0
            log.misses = tuple(collector.misses)
            log.functions = _summarise(durations, log.misses)
            log.finished = True
            _active.release()


def _changes(misses: list[CacheMiss], cause: str) -> tuple[str, ...]:
    """What changed: for new shapes or dtypes, each argument's new types in the order they came
    ("x: f32[5], f32[11], f32[13]"); otherwise JAX's first few differences."""
    if cause in ("new shapes", "new dtypes"):
        types: dict[str, list[str]] = {}
        for m in misses:
            if m.cause == cause and m.argument:
                types.setdefault(m.argument, [])
                if m.now not in types[m.argument]:
                    types[m.argument].append(m.now)
        return tuple(f"{arg}: {', '.join(new[:6])}{', …' if len(new) > 6 else ''}"
                     for arg, new in types.items())
    return tuple(dict.fromkeys(m.changed for m in misses if m.changed))[:5]


def _summarise(durations: list[tuple[str, float]], misses: tuple[CacheMiss, ...]
               ) -> tuple[FunctionCompiles, ...]:
    """One entry per function (its name and the line it was defined on): the cache misses JAX
    explained, joined by name with XLA's compile seconds from jax.monitoring (shared among
    functions of one name in proportion to their misses); the one-op programs JAX compiles for
    jnp calls outside jit, which JAX does not explain, are one entry."""
    functions: dict[tuple[str, str], list[CacheMiss]] = {}
    for m in misses:
        functions.setdefault((m.function, m.defined_at), []).append(m)
    explained = {name for name, _ in functions}
    seconds: dict[str, list[float]] = {}
    eager: dict[str, int] = {}
    for raw, s in durations:
        name = jaxcompat.compiled_function_name(raw)
        if name not in explained:  # a primitive dispatched outside jit
            eager[name] = eager.get(name, 0) + 1
            name = _EAGER
        seconds.setdefault(name, []).append(s)
    out = []
    for (name, defined), mine in functions.items():
        share = len(mine) / sum(len(v) for (n, _), v in functions.items() if n == name)
        compiled = seconds.get(name, [])
        again = [m.cause for m in mine if m.cause != "first compile"]
        cause = (max(again, key=lambda c: (again.count(c), -CAUSES.index(c))) if again
                 else "first compile")
        out.append(FunctionCompiles(
            function=name, defined_at=defined,
            compiles=max(len(mine), round(len(compiled) * share)),
            compile_seconds=sum(compiled) * share, cause=cause,
            changed=_changes(mine, cause),
            called_at=tuple(dict.fromkeys(m.called_at for m in mine if m.called_at))[:5],
            fix=FIXES.get(cause, "")))
    if eager:
        top = sorted(eager.items(), key=lambda kv: -kv[1])
        out.append(FunctionCompiles(
            function=_EAGER, defined_at="", compiles=sum(eager.values()),
            compile_seconds=sum(seconds[_EAGER]), cause=_EAGER,
            changed=tuple(f"{n} ×{c}" for n, c in top[:4]), called_at=(),
            fix="move jnp calls inside the jitted function"))
    return tuple(sorted(out, key=lambda f: (f.function == _EAGER, -f.compiles, f.function)))
