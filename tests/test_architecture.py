"""The package's shape: no import cycles, one seam for JAX internals, one job per module,
one exception tree, one display mixin."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import helpers
from helpers import _display, errors

PACKAGE = Path(helpers.__file__).parent
MODULES = sorted(p for p in PACKAGE.glob("*.py"))
MAX_LINES = 300


def _imports(path: Path) -> set[str]:
    """Every helpers module this file imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("helpers.")}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "helpers":  # from helpers import devices, report
                out |= {f"helpers.{a.name}" for a in node.names
                        if (PACKAGE / f"{a.name}.py").exists()}
            elif node.module.startswith("helpers."):
                out.add(node.module)
    return out


def import_graph() -> dict[str, set[str]]:
    return {f"helpers.{p.stem}": _imports(p) for p in MODULES if p.stem != "__init__"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_helpers_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_seam_reaches_into_jax_internals():
    # the same pattern as `grep -rn "jax._src\|_src\." helpers/` (a regex: '.' is any character)
    pattern = re.compile(r"jax._src|_src\.")
    offenders = [f"{p.name}:{i}" for p in MODULES if p.name != "_jax_internals.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == [], "JAX internals outside helpers/_jax_internals.py: " + ", ".join(
        offenders)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_each_module_is_small(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.name} has {n} lines; split it by job (limit {MAX_LINES})"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_each_module_says_what_it_is_for(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and len(doc) > 30, f"{path.name} needs a module docstring"


def test_every_kit_error_is_one_tree_with_a_docstring():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ == errors.__name__]
    assert len(classes) >= 8
    for cls in classes:
        assert issubclass(cls, errors.KitError), cls
        assert cls.__doc__ and cls.__doc__.strip(), f"{cls.__name__} needs a one-line docstring"
    raised = set()
    for p in MODULES:
        raised |= set(re.findall(r"raise (\w+Error)\(", p.read_text()))
    builtin = {"ValueError", "TypeError", "RuntimeError", "OSError", "KeyError"}
    # TypeError stays for wrong Python types (a programming error) and KeyError for a lookup
    # by name that misses (MemorySnapshot.device, DeviceReport.backend), as in a dict
    assert raised & builtin <= {"TypeError", "KeyError"}, sorted(raised & builtin)


def _display_classes():
    from helpers import (  # noqa: F401  (import every module that defines a record)
        datasets,
        device_report,
        oom,
        placement,
        preflight,
        snapshots,
        transfers,
    )

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    return sorted(set(walk(_display.Display)), key=lambda c: c.__name__)


def test_every_record_renders_through_the_one_mixin():
    classes = _display_classes()
    names = {c.__name__ for c in classes}
    assert {"DeviceReport", "Placement", "Preflight", "Reproduction", "MemorySnapshot",
            "TransferLog", "TokenFile"} <= names
    for cls in classes:
        for method in ("__str__", "_repr_html_"):
            assert method not in vars(cls), f"{cls.__name__} hand-writes {method}"
        assert cls._repr_pretty_ is _display.Display._repr_pretty_, cls.__name__


def test_renderers_are_found_for_every_record(tmp_path):
    import numpy as np

    from helpers import datasets, memory, placement, transfers

    tf = datasets.write_tokens(tmp_path / "t.safetensors", 100)
    with transfers.trace() as log:
        pass
    from IPython.lib.pretty import pretty

    for record in (tf, memory.snapshot(), placement.placement(np.zeros(2)), log):
        text = str(record)
        assert text and not text.startswith("<"), type(record).__name__
        assert pretty(record) == text, type(record).__name__  # what a notebook shows
        html = record._repr_html_()
        assert html is None or html.strip().startswith("<")


def test_the_map_lists_every_module():
    text = (PACKAGE / "README.md").read_text()
    missing = [p.stem for p in MODULES if p.stem not in ("__init__", "__main__")
               and f"`{p.stem}`" not in text]
    assert missing == [], f"helpers/README.md does not list: {missing}"


def test_the_cli_side_never_imports_jax():
    """The doctor's parent, the report renderers, the file tools and the errors load where
    `import jax` fails (JAX_NUM_CPU_DEVICES=abc), and never import JAX themselves."""
    from tests.conftest import run_python

    out = run_python(
        "import sys, tempfile, os\n"
        "from helpers import doctor, report, render, datasets, preflight, oom, errors, settings\n"
        "t = datasets.write_tokens(os.path.join(tempfile.mkdtemp(), 't.safetensors'), 10)\n"
        "print(t); print(settings.check_environment())\n"
        "print('jax' in sys.modules)\n", env={"JAX_NUM_CPU_DEVICES": "abc"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_hook_is_installed_before_the_first_jax_operation():
    """A notebook imports the kit, asks for simulated devices, then runs JAX: the kit's
    backend-start hook must already be in place (jax >= 0.10.2)."""
    from helpers import _jax_internals
    from tests.conftest import run_python

    out = run_python("from helpers import devices, settings\n"
                     "devices.simulate_cpu_devices(2)\n"
                     "import jax; jax.numpy.zeros(1)\n"
                     "print(settings.backend_start_snapshot()[0])", env={"JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    has_hook = _jax_internals.INTERNALS["register_backend_initialization_hook"].expected(
        _jax_internals.jax_version_tuple())
    expected = "installed" if has_hook else "unavailable"
    assert out.stdout.split()[-1] == expected
