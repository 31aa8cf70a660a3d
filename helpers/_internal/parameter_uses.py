"""What a static parameter does in its function's source: the one reading the kit makes of a
jitted function's own code when a Python int passed static compiles a program per value.

Whether such an int can be passed traced instead depends on what it does (jax-ml/jax#3345): a
count for arithmetic or a ``jax.lax.fori_loop`` can; one that sets a shape (``jnp.arange(k)``),
the length of a Python loop (``range(k)``), a Python ``if`` or an ``axis=`` cannot, and each
needs its own rewrite. :func:`use_of` reads the function's source (``linecache``: a file or a
notebook cell) and says which, with the first line that shows it; an int passed whole to a
function defined at the top of the same source is read there. Nothing is run.
"""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass

__all__ = ["KINDS", "ParameterUse", "parameter_of", "use_of"]

#: what a parameter does, the most constraining first: the kind reported is the first found
KINDS = ("loop", "branch", "shape", "axis", "window", "passed on", "arithmetic")

#: JAX (and NumPy) functions whose arguments set a shape: an int there must be known while
#: tracing. A method of an array of the same name counts (x.reshape(k, -1))
_SHAPE_CALLS = frozenset({
    "arange", "zeros", "ones", "full", "empty", "eye", "identity", "linspace", "logspace",
    "tri", "reshape", "broadcast_to", "tile", "repeat", "split", "array_split", "pad",
    "iota", "broadcast", "broadcasted_iota", "one_hot", "top_k", "normal", "uniform",
    "randint", "bernoulli", "truncated_normal", "bits", "gumbel", "categorical",
    "permutation", "choice", "dynamic_slice", "dynamic_slice_in_dim", "resize",
    "expand_dims"})
#: of those, the ones where only some arguments set the shape, by position: a dynamic slice's
#: start may be traced, its size not
_SHAPE_ARGS = {"dynamic_slice": (2,), "dynamic_slice_in_dim": (2,)}
#: random draws: their first argument is the key, the rest set the shape
_DRAWS = frozenset({"normal", "uniform", "randint", "bernoulli", "truncated_normal", "bits",
                    "gumbel", "categorical", "permutation", "choice"})
#: Python's own functions of ints, through which an int still sets what its caller sets
_INT_ARITHMETIC = frozenset({"int", "max", "min", "abs", "round", "len"})
#: keywords that set a shape wherever they are given
_SHAPE_KEYWORDS = frozenset({"shape", "length", "num", "size", "num_segments",
                             "total_repeat_length", "num_classes", "new_sizes", "slice_sizes",
                             "slice_size"})
_AXIS_KEYWORDS = frozenset({"axis", "axes", "dimension", "dimensions"})
#: the roots of calls whose use of an int the kit knows: JAX's and NumPy's own, and Python's
_KNOWN_ROOTS = frozenset({"jnp", "jax", "lax", "np", "numpy", "math", "random", "jr", "nn",
                          "int", "float", "abs", "min", "max", "len", "print", "str",
                          "isinstance"})
_DEFINED_AT = re.compile(r"defined at (.+?):(\d+)\b")
_POSITIONAL = re.compile(r"input path \[0\]\[(\d+)\]")
_KEYWORD = re.compile(r"input path \[1\]\['(\w+)'\]")


@dataclass(frozen=True)
class ParameterUse:
    """What ``name`` does in its function: ``kind``, one of :data:`KINDS`, first seen at
    ``lineno`` of ``filename``, whose text is ``code``."""

    name: str
    kind: str
    filename: str
    lineno: int
    code: str


def parameter_of(explanation: str) -> tuple[str, int, int | str] | None:
    """From one of JAX's cache-miss explanations of a new static value: (the file the function
    is defined in, its line, the static parameter's position or keyword), where JAX names the
    input path (jax 0.9 and later: "input path [0][1]", "input path [1]['k']"); the position
    is None where only the file and line are said. None where not even they are."""
    where = _DEFINED_AT.search(explanation)
    if where is None:
        return None
    filename, lineno = where.group(1), int(where.group(2))
    if (found := _POSITIONAL.search(explanation)) is not None:
        return filename, lineno, int(found.group(1))
    if (found := _KEYWORD.search(explanation)) is not None:
        return filename, lineno, found.group(1)
    return filename, lineno, None


def _function_at(filename: str, lineno: int) -> tuple[ast.Module, ast.AST] | None:
    """The file's source parsed, and the function defined at ``lineno`` in it (its ``def``,
    its first decorator's line, as Python's ``co_firstlineno`` says, or a lambda's line), or
    None."""
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    found = [node for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
             and lineno in (node.lineno, *(d.lineno for d in getattr(node, "decorator_list",
                                                                       ())))]
    return (tree, found[0]) if len(found) == 1 else None


def _static_from_decorator(node: ast.AST, names: list[str]) -> list[str]:
    """The parameters a ``jax.jit`` decorator of ``node`` marks static, in their order
    (``static_argnums`` as literal ints, ``static_argnames`` as literal names); [] where it
    does not say."""
    static: set[str] = set()
    for decorator in getattr(node, "decorator_list", ()):
        for call in (n for n in ast.walk(decorator) if isinstance(n, ast.Call)):
            for keyword in call.keywords:
                try:
                    value = ast.literal_eval(keyword.value)
                except ValueError:
                    continue
                values = value if isinstance(value, (tuple, list)) else (value,)
                if keyword.arg == "static_argnums":
                    static |= {names[i] for i in values
                               if isinstance(i, int) and -len(names) <= i < len(names)}
                elif keyword.arg == "static_argnames":
                    static |= {n for n in values if n in names}
    return [n for n in names if n in static]


def use_of(filename: str, lineno: int, parameter: int | str | None) -> ParameterUse | None:
    """What the parameter at ``parameter`` (a position, a keyword, or None for the one its
    ``jax.jit`` decorator marks static) of the function defined at ``filename:lineno`` does
    there: the first of :data:`KINDS` its uses show, and the line. None where the source, the
    function or the parameter cannot be found."""
    found = _function_at(filename, lineno)
    if found is None:
        return None
    tree, node = found
    if parameter is None:
        static = _static_from_decorator(node, [a.arg for a in (*node.args.posonlyargs,
                                                               *node.args.args)])
        name = static[0] if len(static) == 1 else None
    else:
        name = _parameter(node, parameter)
    if name is None:
        return None
    defined: dict[str, ast.AST | None] = {}  # the functions at the top of the source, by name
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined[top.name] = top if top.name not in defined else None  # (twice: unknown)
    kinds = _kinds_in(defined, node, name, depth=0)
    for kind in KINDS:
        if kind in kinds:
            at = kinds[kind]
            return ParameterUse(name=name, kind=kind, filename=filename, lineno=at,
                                code=linecache.getline(filename, at).strip())
    return None


def _parameter(node: ast.AST, where: int | str) -> str | None:
    """The name of the parameter of the function ``node`` at a position or keyword, or None
    where it has none there."""
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if isinstance(where, int):
        return names[where] if 0 <= where < len(names) else None
    return where if where in names or where in [a.arg for a in node.args.kwonlyargs] else None


def _kinds_in(defined: dict[str, ast.AST | None], node: ast.AST, name: str,
              depth: int) -> dict[str, int]:
    """Each kind of use of the parameter ``name`` in the function ``node``, with the first line
    showing it; where it is passed whole to one of the functions ``defined`` at the top of the
    same source (``return run(x, k)``), what it does there, three calls deep at most."""
    body = node.body if isinstance(node.body, list) else [node.body]
    kinds, passed = _kinds_of(body, name)
    for callee, where, lineno in passed:
        target = defined.get(callee)
        inner = _parameter(target, where) if target is not None and depth < 3 else None
        found = (_kinds_in(defined, target, inner, depth + 1) if inner is not None
                 else {"passed on": lineno})  # a function of another source: not known
        for kind, at in found.items():
            kinds.setdefault(kind, at)
    return kinds


def _kinds_of(body: list[ast.stmt], name: str
              ) -> tuple[dict[str, int], list[tuple[str, int | str, int]]]:
    """Each kind of use of ``name`` in ``body``, with the first line showing it; and where it
    is passed whole to a function called by its name, (that name, the position or keyword, the
    line) of each."""
    uses = [n for stmt in body for n in ast.walk(stmt)
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    passed: list[tuple[str, int | str, int]] = []
    if not uses:
        return {}, passed
    kind_of: dict[int, str] = {}
    handed: set[int] = set()  # the uses passed whole to a function called by its name

    def mark(tree: ast.AST | None, kind: str) -> None:
        for n in _outside_calls(tree):
            if isinstance(n, ast.Name) and n.id == name and KINDS.index(kind) < KINDS.index(
                    kind_of.get(id(n), "arithmetic")):
                kind_of[id(n)] = kind

    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, (ast.If, ast.While, ast.IfExp, ast.Assert)):
                mark(n.test, "branch")
            elif isinstance(n, ast.comprehension):
                for condition in n.ifs:
                    mark(condition, "branch")
            elif isinstance(n, ast.Slice):
                window = _fixed_window(n, name)  # x[i:i + k]: i sets where, not how long
                for part in (n.lower, n.upper, n.step):
                    mark(part, "window" if window and part is not n.step else "shape")
            elif isinstance(n, ast.Call):
                called = _called(n.func)
                for keyword in n.keywords:
                    if keyword.arg in _SHAPE_KEYWORDS:
                        mark(keyword.value, "shape")
                    elif keyword.arg in _AXIS_KEYWORDS:
                        mark(keyword.value, "axis")
                if called == "range":
                    for arg in n.args:
                        mark(arg, "loop")
                elif called in _SHAPE_CALLS:
                    for at, arg in enumerate(n.args):  # (a draw's key: no)
                        if (at in _SHAPE_ARGS[called] if called in _SHAPE_ARGS
                                else at >= (called in _DRAWS)):
                            mark(arg, "shape")
                elif not _known(n.func):
                    for where, arg in (*enumerate(n.args),
                                       *((k.arg, k.value) for k in n.keywords)):
                        if (isinstance(arg, ast.Name) and arg.id == name and where is not None
                                and isinstance(n.func, ast.Name)):
                            passed.append((called, where, n.lineno))  # read in the callee
                            handed.add(id(arg))
                        else:  # inside an expression, or to a callee not known by name
                            mark(arg, "passed on")
    found: dict[str, int] = {}
    for use in uses:
        if id(use) in handed and id(use) not in kind_of:  # its use is the callee's
            continue
        found.setdefault(kind_of.get(id(use), "arithmetic"), use.lineno)
    return found, passed


def _fixed_window(part: ast.Slice, name: str) -> bool:
    """``x[i:i + k]`` (or ``x[i:k + i]``) with no step, ``k`` free of ``name``: a slice whose
    length does not change with ``name``, only where it starts (patrick-kidger/equinox#704's
    ``COS[offset:offset + 1]``)."""
    upper, lower = part.upper, part.lower
    if lower is None or part.step is not None or not isinstance(upper, ast.BinOp) or \
            not isinstance(upper.op, ast.Add):
        return False
    for same, other in ((upper.left, upper.right), (upper.right, upper.left)):
        if ast.dump(same) == ast.dump(lower) and not any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(other)):
            return True
    return False


def _outside_calls(tree: ast.AST | None) -> list[ast.AST]:
    """The nodes of ``tree`` outside any call within it, but for Python's own arithmetic on
    ints (``int(k * 2)``, ``max(k, 1)``): a name inside another call is that call's argument,
    and its use is read there (jax.random.key(seed) inside a draw's arguments sets no shape)."""
    found, todo = [], [tree] if tree is not None else []
    while todo:
        node = todo.pop()
        found.append(node)
        if node is not tree and isinstance(node, ast.Call) and _called(
                node.func) not in _INT_ARITHMETIC:
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _called(func: ast.expr) -> str:
    """The name a call calls: ``range``, ``jnp.arange`` -> "arange", ``x.reshape`` ->
    "reshape"."""
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else "")


def _known(func: ast.expr) -> bool:
    """A call whose use of an int the kit knows: a JAX, NumPy, ``math`` or Python builtin one
    (``jnp.sum``, ``jax.lax.fori_loop``, ``int``), or a method of a value (``x.sum``)."""
    root = func
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name):
        return root.id in _KNOWN_ROOTS or isinstance(func, ast.Attribute)
    return isinstance(func, ast.Attribute)
