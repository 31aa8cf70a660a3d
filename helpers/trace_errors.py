"""Why a function does not trace: the cause and the fix of a ConcretizationTypeError (and its
kin: a traced value put to ``if``, ``int()`` or NumPy, a shape that is not concrete), read from
the error JAX raised and the user's line, never from a guess.

JAX says where the traced value came from in the error's text (jax/_src/interpreters/
partial_eval.py, ``_origin_msg``: "depends on the value of the argument n", or "became a
tracer due to JAX operations on these lines"); where it says neither, the user's failing line
may call a ``jax.jit`` function, whose result is traced inside another trace whatever its
arguments (jax-ml/jax#35090). ``preflight_step``'s error and ``%load_ext helpers`` say it.
"""

from __future__ import annotations

import ast
import builtins
import re

from helpers._internal import frames

__all__ = ["TRACE_ERRORS", "trace_error_fix"]

#: the errors of a traced value used where Python needs a concrete one (jax.errors)
TRACE_ERRORS = ("ConcretizationTypeError", "TracerBoolConversionError",
                "TracerIntegerConversionError", "TracerArrayConversionError")
#: what jnp says of a shape that holds a traced value (a TypeError, not one of TRACE_ERRORS)
_SHAPE_NOT_CONCRETE = "Shapes must be 1D sequences of concrete values"
_ARGUMENTS = re.compile(r"depends on the values? of the arguments? (.+?)\.(?:\n|$)")
_AROSE = re.compile(r"(?:It|The error) arose in (?:the )?(.+?)\.?(?:\n|$)")
_OPERATION = re.compile(r"operation (.+?)\n\s+from line (\S+)")
_JIT_NAME = re.compile(r"\b(?:pjit|jit)\[\s*name=(\w+)")
#: JAX's words where a segment_* function was given no num_segments under jit (jax/_src/ops/
#: scatter.py, _segment_update: it takes max(segment_ids) + 1, which needs the ids' values)
_SEGMENTS = "`num_segments` argument"
#: JAX's words where it names the argument a value was needed for ("The error arose for the
#: nse argument of bcoo_fromdense", jax/experimental/sparse)
_AROSE_FOR = re.compile(r"The error arose for the (\w+) argument of (\w+)")
#: JAX's words where jnp.nonzero (argwhere, flatnonzero, where with one argument: all named
#: jnp.nonzero) or jnp.unique has no size= under a transformation (jax/_src/numpy: its output
#: size is how many it finds); unique's are its own, before _AROSE_FOR's reading (a review)
_SIZE_ARGUMENT = re.compile(r"The size argument of (jnp\.\w+) must be statically specified"
                            r"|arose for the \w+ argument of (jnp\.\w+)\(\)\. To make .+ "
                            r"specify a concrete value for the size argument")
#: JAX's words where lax.scan's length is traced (jax/_src/lax/control_flow/loops.py)
_SCAN_LENGTH = "The `length` argument to `scan` expects a concrete `int` value"
#: a boolean mask as an index under jit (jax.errors.NonConcreteBooleanIndexError)
_BOOLEAN_INDEX = "NonConcreteBooleanIndexError"
#: a value batched by jax.vmap put to Python's if: JAX names the tracer's kind, BatchTracer
#: up to 0.11.2 and VmapTracer from 0.12
_BATCHED = ("BatchTracer", "VmapTracer")
#: vmap's error for axes of different sizes, and an argument path that starts at a list's item
#: ("axis 0 of argument models[0]['w'] of type float32[2,3]")
_VMAP_SIZES = "vmap got inconsistent sizes for array axes to be mapped"
_LIST_ITEM = re.compile(r"of argument (\w+)(\[\d+\])(\S+) of type")
#: a traced value kept past the transformation that made it, and used after it returned
_LEAKED = "UnexpectedTracerError"
#: JAX's words for a value traced by jax.checkpoint (remat) alone, and for its static_argnums
#: past the positional arguments of the call (jax 0.8.0 to 0.12.0.1)
_CHECKPOINT_TRACE = "for checkpoint / remat"
_CHECKPOINT_ARGNUMS = "argument to `jax.checkpoint`"
#: JAX's words (0.12.0.1) for a callback's sharding on a device the computation does not use;
#: 0.8.0 and 0.10.2 raise a bare tuple.index ValueError in _callback_op_sharding instead
_CALLBACK_DEVICE = "that is not in the device assignment"


def _raised_in(err: BaseException, function: str) -> bool:
    """The error's innermost frame is JAX's function of that name."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == function


def _arguments(text: str) -> list[str]:
    found = _ARGUMENTS.search(text)
    if not found:
        return []
    return [a.strip() for a in re.split(r",\s*(?:and\s+)?|\s+and\s+", found.group(1)) if a]


def _user_frame(err: BaseException):
    """The traceback entry of the function JAX was tracing ("while tracing the function f at
    ..."), else the deepest of the user's code (a live frame: its names can be looked up), or
    None."""
    traced = re.search(r"tracing the function (\w+) at ", str(err))
    tb, found, named = err.__traceback__, None, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if frames.is_user_file(code.co_filename):
            found = tb
            if traced and code.co_name == traced.group(1):
                named = tb
        tb = tb.tb_next
    return named or found


def _traced_frame(err: BaseException):
    """The traceback entry of the function JAX was tracing ("while tracing the function f at
    file:line"), the user's or a library's (jax.jit(jax.ops.segment_sum)), or None."""
    traced = re.search(r"tracing the function (\w+) at (.+?):(\d+)", str(err))
    tb = err.__traceback__
    while traced and tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == traced.group(1) and code.co_filename == traced.group(2):
            return tb
        tb = tb.tb_next
    return None


def _jitted_calls(tb) -> list[str]:
    """The names on the user's failing line that call a function of jax.jit's (looked up in
    that frame's names, nothing called)."""
    import linecache

    frame = tb.tb_frame
    text = linecache.getline(frame.f_code.co_filename, tb.tb_lineno).strip()
    try:
        tree = ast.parse(text.removeprefix("return ").removesuffix(":") or "None")
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        path, f = [], node.func
        while isinstance(f, ast.Attribute):
            path.insert(0, f.attr)
            f = f.value
        if not isinstance(f, ast.Name):
            continue
        missing = object()
        obj = frame.f_locals.get(f.id, frame.f_globals.get(f.id, getattr(builtins, f.id, missing)))
        for attr in path:
            obj = getattr(obj, attr, missing) if obj is not missing else missing
        if obj is not missing and type(obj).__name__ == "PjitFunction":  # jax.jit's own
            out.append(".".join([f.id, *path]))
    return out


def trace_error_fix(err: BaseException) -> str:
    """The cause and the fix, in a sentence or two, of an error JAX raised because a traced value
    was used where Python needs a concrete one ("" for any other error): which argument it
    depends on and what needed it (an ``if``, ``int()``, a shape), the JAX operations that made
    it from Python numbers, or a ``jax.jit`` function called on the failing line."""
    kind, text = type(err).__name__, str(err)
    shape = kind == "TypeError" and _SHAPE_NOT_CONCRETE in text
    if kind == _BOOLEAN_INDEX:
        return _boolean_index_fix(err)
    if kind == _LEAKED:
        return _leaked_fix(err)
    if kind == "ValueError" and _VMAP_SIZES in text and (name := _list_of_trees(text)):
        return (f"vmap maps an axis of every array leaf, and `{name}` is a list, tuple or dict "
                f"of trees whose leaves disagree in that axis within one item: it maps inside "
                f"each item's arrays, never across the items. "
                f"Where its items are alike (an ensemble's models), stack them into one tree "
                f"whose leaves have a leading axis of len({name}): jax.tree.map(lambda *a: "
                f"jnp.stack(a), *{name}), and vmap over that "
                f"(patrick-kidger/equinox#397); where the same list serves every element (one "
                f"model's layers), give `{name}` in_axes=None")
    if kind == "ValueError" and _CHECKPOINT_ARGNUMS in text and "len(args)" in text:
        return ("jax.checkpoint's static_argnums counts only the positional arguments of the "
                "call, and this call passed fewer than the position it names: an argument "
                "marked static was passed by keyword (f(x, flag=False)). Pass it by position, "
                "f(x, False) (jax-ml/jax#18405); jax.checkpoint's static_argnames does not "
                "help: where it exists (jax 0.10.2, 0.12.0.1) the argument is traced all the "
                "same")
    if kind == "ValueError" and (_CALLBACK_DEVICE in text or (
            "not in tuple" in text and _raised_in(err, "_callback_op_sharding"))):
        return ("the callback's sharding= names a device the jitted computation does not run "
                "on: a pure_callback's or io_callback's sharding must be one of its devices. "
                "Leave sharding= out (the callback runs in Python on the host either way), or "
                "name one of the step's own devices (jax-ml/jax#40722; before jax 0.12 JAX "
                "says only 'tuple.index(x): x not in tuple')")
    if kind not in TRACE_ERRORS and not shape:
        return ""
    if found := _SIZE_ARGUMENT.search(text):
        fn = found.group(1) or found.group(2)
        return (f"{fn} returns as many elements as it finds, so its output's size depends on "
                f"traced values (under jit or vmap). Give it a fixed size: "
                f"{fn}(..., size=k, fill_value=...) with k a Python int (the padded count, an "
                f"upper bound), and mask the padding it fills; or keep the whole array and "
                f"select with jnp.where(mask, x, 0) "
                f"(jax-ml/jax#5280)")
    if _SCAN_LENGTH in text:
        names = _arguments(text)
        which = f" (it depends on {' and '.join(map(repr, names))})" if names else ""
        return ("lax.scan's length must be a Python int while tracing, and this one is traced"
                f"{which}. Static, it compiles once per length; for many lengths, scan a fixed "
                "maximum and leave the steps past the traced n unchanged: jax.lax.scan(lambda "
                "c, i: (jnp.where(i < n, step(c), c), ...), c, jnp.arange(max_steps)) (a pytree "
                "carry: jax.tree.map(lambda a, b: jnp.where(i < n, a, b), step(c), c)), one "
                "compile, and it differentiates (a jax.lax.while_loop also takes a traced n, "
                "but not reverse-mode jax.grad; jax-ml/jax#4473)")
    arose = _AROSE.search(text)
    needed = f" ({arose.group(1).strip()})" if arose else ""
    names = _arguments(text)
    tb = _user_frame(err)
    frame = (_traced_frame(err) or tb) if names else None
    arrays = _arrays(frame, names) if frame is not None else {}
    # JAX's words name a library's own argument (num_segments, nse) that was left out and so
    # computed from an array; where the user's own non-array argument is what it depends on
    # (num_segments=n passed, n traced), the fix is that argument, static (a review)
    library_own = not names or set(names) <= set(arrays) or (
        frame is not None and not frames.is_user_file(frame.tb_frame.f_code.co_filename))
    if _SEGMENTS in text and library_own:
        return ("jax.ops.segment_sum (or another segment_* function) was given no "
                "num_segments, so it takes the count from the segment ids' largest value, "
                "which jit traces: the result's size must be known while tracing. Pass "
                "num_segments= a Python int (static where it is an argument of the jitted "
                "function: static_argnames=('num_segments',)); the ids stay traced "
                "(jax-ml/jax#6350)")
    if library_own and (found := _AROSE_FOR.search(text)):  # JAX names what needs a value
        arg, fn = found.groups()
        bound = (" (for nse, an upper bound on the elements stored: BCOO.fromdense(A, "
                 "nse=k), jax-ml/jax#8299)" if arg == "nse" else "")
        return (f"{fn} needs its {arg} argument as a Python value, and left out it is computed "
                f"from a traced array (under jit or vmap). Pass {arg}= yourself, a Python "
                f"int{bound}, static where it comes from an argument of the jitted function "
                f"(static_argnames=('{arg}',))")
    if library := _library_line(err):  # the if or the NumPy call is a library's, not yours
        return _library_fix(kind, library, [n for n in names if n not in arrays])
    if kind == "TracerBoolConversionError" and any(b in text for b in _BATCHED) and not names:
        at = f" (at {frames.where(tb.tb_frame.f_code.co_filename, tb.tb_lineno)})" if tb else ""
        return ("under jax.vmap the value is batched, one per element, and Python's if, while "
                f"or bool() needs one{at}. Use jnp.where(cond, a, b) or jax.lax.cond (which "
                "vmap turns into a select of both branches), or jax.lax.while_loop")
    if names and _CHECKPOINT_TRACE in text and not arrays:
        return _checkpoint_fix(names, frame, _enclosing_trace(err, frame, names))
    if names:
        return _argument_fix(kind, names, needed, shape or bool(arose), arrays)
    operations = _OPERATION.findall(text)
    jitted = [n for op, _ in operations for n in _JIT_NAME.findall(op)]
    if not jitted and tb is not None:
        jitted = _jitted_calls(tb)
    if jitted:
        name = jitted[0]
        return (f"{name} is a jax.jit function: inside another trace its result is a traced "
                f"value, even where its own arguments are static, and here a concrete one is "
                f"needed{needed}. Compute this value in plain Python (call "
                f"{name}.__wrapped__, or do not jit so small a helper: jax-ml/jax#35090)")
    if operations:
        lines = sorted({frames.where(f, int(n)) if n else f
                        for f, n in (_split_line(at) for _, at in operations)})
        if kind == "TracerArrayConversionError":
            return (f"NumPy (np.asarray, np.* or a library built on it) needs a concrete value, "
                    f"and inside jit the JAX operations that make this one (at "
                    f"{', '.join(lines)}) give a traced value, even of constants. Use jnp's "
                    f"function instead, or run the NumPy code outside jit (jax.pure_callback "
                    f"where it must be inside)")
        return (f"the value is made by JAX operations on Python numbers (at "
                f"{', '.join(lines)}), and inside jit each one gives a traced value, even of "
                f"constants; here a concrete one is needed{needed}. Compute it with Python or "
                f"NumPy (max(a, b), np.maximum, math.prod) so it stays a number")
    return ""


def _enclosing_trace(err: BaseException, frame: object, names: list[str]) -> str:
    """The name of a user's function, outside the traced one, whose frame holds one of
    ``names`` as a traced value: an enclosing jax.jit (or grad) traces it too (a review:
    jax.checkpoint inside a jitted loss, its flag the loss's argument); "" where none."""
    from jax.core import Tracer

    tb = err.__traceback__
    while tb is not None and tb is not frame:
        code = tb.tb_frame.f_code
        if frames.is_user_file(code.co_filename) and any(
                isinstance(tb.tb_frame.f_locals.get(n), Tracer) for n in names):
            return code.co_name
        tb = tb.tb_next
    return ""


def _checkpoint_fix(names: list[str], frame: object, enclosing: str = "") -> str:
    """A value jax.checkpoint traces used where Python needs it concrete (openpi#987: a
    `deterministic` flag): the position to mark static, from the traced function's
    signature, where the kit had said "jit" and static_argnames, which jax.checkpoint ignores
    (jax 0.10.2 and 0.12.0.1 accept it and still trace the argument; 0.8.0 has none)."""
    which = " and ".join(f"'{n}'" for n in names)
    code = frame.tb_frame.f_code if frame is not None else None
    params = list(code.co_varnames[:code.co_argcount]) if code is not None else []
    at = [params.index(n) for n in names if n in params]
    where = ""
    if at and len(at) == len(names):
        def argnums(positions: list[int]) -> str:
            return ", ".join(map(str, positions)) + ("," if len(positions) == 1 else "")

        if params[:1] == ["self"]:  # a method: jax.checkpoint(self.f) is given no self
            where = (f": static_argnums=({argnums([i - 1 for i in at])}) for "
                     f"jax.checkpoint(self.{code.co_name}), which is not given self; "
                     f"({argnums(at)}) for flax's nn.remat, which counts self")
        else:
            where = (f": static_argnums=({argnums(at)}), {which} being argument "
                     f"{' and '.join(map(str, at))} of {code.co_name}, counting from 0")
    outer = (f" The function around it, {enclosing}, is traced too (a jax.jit or grad): mark "
             f"the value static there as well (static_argnames on that jit), so that it "
             f"reaches jax.checkpoint as a Python value." if enclosing else "")
    return (f"the value depends on {which}, which jax.checkpoint traces"
            f"{'' if enclosing else ' (not jit)'}, and Python "
            f"needs it concrete. Mark it static by position{where}, and pass it by position at "
            "the call (static_argnums counts positional arguments only, jax-ml/jax#18405). "
            "Where static_argnums is set already, it names another position "
            "(Physical-Intelligence/openpi#987's named the argument before). jax.checkpoint's "
            "static_argnames does not help: where it exists (jax 0.10.2, 0.12.0.1) the "
            "argument is traced all the same. Or use jnp.where or jax.lax.cond on the traced "
            f"value.{outer}").rstrip(".")


def _list_of_trees(text: str) -> str:
    """The argument of a vmap's size error that is a list (tuple, int-keyed dict) of trees:
    two of the error's examples name leaves of one item, `model[0]['b']` and `model[0]['w']`,
    in different groups of sizes (equinox#397: each model's own leaves disagree in axis 0).
    "" where the items are arrays batched right beside another argument of the wrong size, or
    one item of a batched list is the wrong size (a review: both got the stacking advice)."""
    seen: dict[tuple[str, str], set[str]] = {}
    for name, item, rest in _LIST_ITEM.findall(text):
        seen.setdefault((name, item), set()).add(rest)
    return next((name for (name, _), rests in seen.items() if len(rests) > 1), "")


def _leaked_fix(err: BaseException) -> str:
    """A traced value kept past the jit or vmap that made it (UnexpectedTracerError): where it
    was used, and the fix for its kind. A vmap's (a BatchTracer, VmapTracer from 0.12) is
    google-deepmind/optax#932's: a TrainState made under vmap whose static tx, optax.adam(lr),
    closed over the batched learning rate; the fix keeps per-element values as array leaves
    (optax.inject_hyperparams)."""
    tb = _user_frame(err)
    at = f" at {frames.where(tb.tb_frame.f_code.co_filename, tb.tb_lineno)}" if tb else ""
    if any(b in str(err) for b in _BATCHED):
        return ("a value batched by jax.vmap (one per element) was kept past the vmap that "
                "made it, somewhere vmap does not return as an array: a closure, a global, or a "
                "pytree's static part, such as a flax TrainState's tx (optax.adam(lr) closes "
                f"over lr), and then used{at}. Pass each element's values as array leaves "
                "instead: for a learning rate per model, make the optimizer once outside the "
                "vmap, optax.inject_hyperparams(optax.adam)(learning_rate=1.0), init it inside, "
                "and set each state's hyperparams['learning_rate'] to its rate "
                "(google-deepmind/optax#932)")
    return ("a value traced inside jax.jit (or grad) was kept after the function returned: "
            "saved to a global, an attribute (self.x = ...), a list or a closure, and then "
            f"used{at}. Return it from the function instead; to find where it was kept, run "
            "the call once under `with jax.checking_leaks():`")


def _boolean_index_fix(err: BaseException) -> str:
    """A boolean mask used as an index under jit: the user's line, and the fix of its form
    (x.at[mask].set(v), or x[mask] read)."""
    tb = _user_frame(err)
    code = frames.line(tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb else ""
    at = f" (at {frames.where(tb.tb_frame.f_code.co_filename, tb.tb_lineno)})" if tb else ""
    update = re.search(r"\.at\[.*\]\.(\w+)\(", code)  # (a mask with brackets of its own)
    how = update.group(1) if update else ""
    if how == "set":
        fix = "jnp.where(mask, v, x) instead of x.at[mask].set(v)"
    elif how == "add":  # (a set's fix would overwrite: a review)
        fix = "jnp.where(mask, x + v, x) instead of x.at[mask].add(v)"
    elif how in ("mul", "divide", "power", "min", "max"):
        fix = f"jnp.where(mask, x.at[:].{how}(v), x) instead of x.at[mask].{how}(v)"
    else:  # a read (x[mask], x.at[mask].get())
        fix = ("jnp.where(mask, x, 0) keeps every element, and a mean over the picked ones is "
               "jnp.where(mask, x, 0).sum() / mask.sum()")
    fix += " (mask[:, None] where it picks rows of x)"
    return (f"a boolean mask as an index picks as many elements as it holds True, a number that "
            f"depends on values jit traces{at}: shapes must be known while tracing. Keep the "
            f"shape and select: {fix}; where you need the elements themselves, "
            f"jnp.nonzero(mask, size=k) with a bound k (jax-ml/jax#21994)")


def _library_line(err: BaseException) -> tuple[str, str] | None:
    """(package, "file:line: code") of the deepest traceback entry above JAX, NumPy and the
    standard library, where it is an installed package's: the if or the np.asarray that needs
    the value is there, not in the user's code. None otherwise."""
    tb, last = err.__traceback__, None
    while tb is not None:
        if not frames.is_underneath(tb.tb_frame.f_code.co_filename):
            last = tb
        tb = tb.tb_next
    if last is None:
        return None
    name = last.tb_frame.f_code.co_filename
    package = "" if frames.is_user_file(name) else frames.package(name)
    return (package, frames.line(name, last.tb_lineno)) if package else None


def _library_fix(kind: str, library: tuple[str, str], scalars: list[str]) -> str:
    """The fix where the code that needs a concrete value is a library's (``scalars``: the
    arguments JAX names that are not arrays, which could be static)."""
    package, at = library
    if kind == "TracerArrayConversionError":
        return (f"{package} converts the value to NumPy (at {at}), which needs a concrete one: "
                f"it runs NumPy or SciPy code, which jit cannot trace. Call it outside jit, or "
                f"wrap that call in jax.pure_callback where it must run inside "
                f"(google/jaxopt#214)" + (
                    "; for SciPy's own functions, jax.scipy has many (jax.scipy.linalg.expm)"
                    if package == "scipy" else ""))
    static = (f" Marking {' and '.join(map(repr, scalars))} static (static_argnames=("
              f"{', '.join(map(repr, scalars))},)) helps only where the library reads it as it "
              f"is; where it computes with it first, the result is traced inside jit all the "
              f"same." if scalars else " Marking an argument static does not help where the "
              "library computes the value itself.")
    return (f"the code that needs a concrete value is {package}'s, not yours (at {at}): under "
            f"jit or vmap it cannot run.{static} Turn that check off where the library has an "
            f"option for it (jaxopt's Bisection: check_bracket=False, google/jaxopt#422), or "
            f"call it outside jit and vmap")


def _arrays(tb, names: list[str]) -> dict[str, str]:
    """The arguments among ``names`` that are arrays of one dimension or more in the traced
    function's frame, each with its type ("int32[3]"): no static argument can be one."""
    out = {}
    for n in names:
        v = tb.tb_frame.f_locals.get(n)
        shape = getattr(v, "shape", None)
        if shape:  # () and None: a scalar or no array
            out[n] = f"{getattr(v, 'dtype', '')}{list(shape)}"
    return out


def _argument_fix(kind: str, names: list[str], needed: str, shape: bool,
                  arrays: dict[str, str]) -> str:
    """The cause and the fix where JAX names the arguments the value depends on."""
    which = " and ".join(f"'{n}'" for n in names)
    them = "them" if len(names) > 1 else "it"
    static = (f"static_argnames=({', '.join(repr(n) for n in names)}"
              f"{',' if len(names) == 1 else ''}): one compile per value")
    cause = f"the value depends on {which}, which jit traces"
    if arrays:  # an array cannot be static: the size or the decision must not come from it
        typed = ", ".join(f"'{n}' is {t}" for n, t in arrays.items())
        cause += f" ({typed}, an array: it cannot be made static)"
        if shape:
            return (f"{cause}, and a shape is made from its values{needed}: shapes must be "
                    f"known while tracing. Compute the size outside jit and pass it in as a "
                    f"static int, or give a fixed bound (the size= of jnp.nonzero, jnp.unique "
                    f"and the like; jax.nn.one_hot(x, num_classes) with a number)")
        if kind == "TracerBoolConversionError":
            return (f"{cause}, and Python's if, while or bool() needs its value. Use "
                    f"jnp.where or jax.lax.cond/while_loop")
        if kind == "TracerIntegerConversionError":
            return (f"{cause}, and int() or an index into a Python list needs its value. "
                    f"Index the array itself (x[i], jax.lax.dynamic_slice)")
        if kind == "ConcretizationTypeError":
            return (f"{cause}, and the call here needs a value computed from it{needed}. "
                    f"Compute that value outside jit and pass it in as a static Python value "
                    f"(an int, a tuple), or give the call a fixed one")
    if shape:
        return (f"{cause}, and it sets a shape{needed}: shapes must be known while tracing. "
                f"Mark {them} static ({static}), or keep one size and mask the rest")
    if kind == "TracerBoolConversionError":
        return (f"{cause}, and Python's if, while or bool() needs {them} concrete. Use "
                f"jnp.where or jax.lax.cond/while_loop, or mark {them} static ({static})")
    if kind == "TracerIntegerConversionError":
        return (f"{cause}, and int() or an index into a Python list needs {them} concrete. "
                f"Index the array itself (x[i], jax.lax.dynamic_slice), or mark {them} static "
                f"({static})")
    if kind == "TracerArrayConversionError":
        return (f"{cause}, and NumPy (np.asarray, np.* or a library built on it) needs its "
                f"value. Use jnp's function instead, or jax.pure_callback for code that must "
                f"run on the host")
    return (f"{cause}, and the call here needs {them} concrete{needed}. Mark {them} static "
            f"({static}), or compute with {them} in JAX instead of Python")


def _split_line(at: str) -> tuple[str, str]:
    """("file", "line") of JAX's "file:line:column" or "file:line" ("" where none)."""
    parts = at.split(":")
    while len(parts) > 2 and parts[-1].isdigit() and parts[-2].isdigit():
        parts.pop()  # the column
    if len(parts) > 1 and parts[-1].isdigit():
        return ":".join(parts[:-1]), parts[-1]
    return at, ""
