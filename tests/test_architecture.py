"""The package's shape: one module per question, layers that only import downwards, no import
cycle, no private import across modules, no module that only re-exports, one public import path
per name, one seam into JAX internals, one exception tree, one record base."""

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import helpers
from helpers import errors
from helpers._internal import records

PACKAGE = Path(helpers.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_name(p): p for p in MODULES}
PUBLIC = sorted(n for n in NAMES if "._" not in n.removeprefix("helpers.") and n != "helpers"
                and not n.startswith("helpers._"))
LEAVES = {"helpers.errors": set(), "helpers.units": {"helpers.errors"}}
RENDERERS = {"helpers.render", "helpers.plotting", "helpers.perfetto"}


def _imports(path: Path, *, runtime_only: bool = True) -> dict[str, set[str]]:
    """{module imported: names imported from it} for every kit module this file imports, at
    the top or inside a function (``TYPE_CHECKING`` blocks left out unless asked for)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for n in ast.walk(node)}
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("helpers."):
                    out.setdefault(a.name, set())
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("helpers"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in NAMES:  # from helpers import devices
                        out.setdefault(sub, set())
                    else:
                        out.setdefault(node.module, set()).add(a.name)
    return out


def import_graph(*, runtime_only: bool = True) -> dict[str, set[str]]:
    return {n: set(_imports(p, runtime_only=runtime_only)) - {n, "helpers"}
            for n, p in NAMES.items()}


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


def test_the_leaves_import_nothing_above_them():
    graph = import_graph()
    for leaf, allowed in LEAVES.items():
        assert graph[leaf] <= allowed, f"{leaf} imports {graph[leaf] - allowed}"


def test_internal_imports_only_errors_units_and_internal():
    for name, deps in import_graph().items():
        if name.startswith("helpers._internal"):
            bad = {d for d in deps if not d.startswith("helpers._internal")} - set(LEAVES)
            assert not bad, f"{name} imports {bad}: _internal may import only errors, units " \
                            "and other _internal modules"


def test_renderers_never_import_a_capture_module_at_run_time():
    allowed = {"helpers._internal.records", "helpers._internal.jaxcompat", *LEAVES}
    for name in RENDERERS:
        bad = import_graph()[name] - allowed
        assert not bad, f"{name} imports {bad} at run time (records are named, not imported)"


def test_no_private_name_is_imported_from_another_module():
    offenders = []
    for name, path in NAMES.items():
        for module, names in _imports(path, runtime_only=False).items():
            private = sorted(n for n in names if n.startswith("_") and n != "__version__")
            if private and module != name:
                offenders.append(f"{name} imports {private} from {module}")
    assert offenders == []


def test_no_module_only_re_exports():
    """A module that defines nothing of its own (a facade gluing halves back together)."""
    for name, path in NAMES.items():
        tree = ast.parse(path.read_text())
        defines = [n for n in tree.body if isinstance(
            n, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))
            and not (isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))]
        assert defines or not _imports(path), f"{name} only re-exports"


#: names a public module hands on from the internal seam, on purpose: their one public path
PUBLIC_FROM_INTERNAL = {"helpers.devices": {"device_name"},
                        "helpers.settings": {"ALLOCATOR_VARS", "backend_start_snapshot"}}


def test_each_public_name_has_one_public_home():
    homes: dict[int, list[str]] = {}
    handed_on = []
    for name in PUBLIC:
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", ()):
            obj = getattr(module, exported)
            if not isinstance(obj, (int, float, str, tuple)):  # constants may be equal
                homes.setdefault(id(obj), []).append(f"{name}.{exported}")
            where = getattr(obj, "__module__", name)
            if ((inspect.isclass(obj) or inspect.isfunction(obj)) and where != name
                    and exported not in PUBLIC_FROM_INTERNAL.get(name, ())):
                handed_on.append(f"{name}.{exported} (defined in {where})")
    doubles = [v for v in homes.values() if len(v) > 1]
    assert doubles == [], f"one object, several public names: {doubles}"
    assert handed_on == [], f"public names re-exported from elsewhere: {handed_on}"


def test_only_the_seam_reaches_into_jax_internals():
    pattern = re.compile(r"jax\._src|_src\.")
    seam = PACKAGE / "_internal" / "jaxcompat.py"
    offenders = [f"{p.name}:{i}" for p in MODULES if p != seam
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == [], "JAX internals outside helpers/_internal/jaxcompat.py: " + ", ".join(
        offenders)


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


def _public_records():
    for name in PUBLIC:
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", ()):
            obj = getattr(module, exported)
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
                yield f"{name}.{exported}", obj


def test_every_public_record_says_what_it_is():
    """Shift-Tab in a notebook shows the class docstring: dataclass's generated one (the
    signature) does not say what the record is."""
    missing = [n for n, cls in _public_records()
               if not cls.__doc__ or cls.__doc__.startswith(cls.__name__ + "(")]
    assert missing == [], f"public records without a docstring: {missing}"


def test_every_public_record_turns_into_json_in_one_place():
    hand_written = [n for n, cls in _public_records()
                    if "to_dict" in vars(cls) and n != "helpers.transfers.TransferLog"]
    assert hand_written == [], f"records with their own to_dict: {hand_written}"


def _display_classes():
    for name in PUBLIC:
        importlib.import_module(name)

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    return sorted(set(walk(records.Display)), key=lambda c: c.__name__)


def test_every_record_renders_through_the_one_mixin():
    classes = _display_classes()
    names = {c.__name__ for c in classes}
    assert {"DeviceReport", "Placement", "Preflight", "Reproduction", "MemorySnapshot",
            "TransferLog", "TokenFile", "StepPreflight", "StepMeasurement"} <= names
    for cls in classes:
        for method in ("__str__", "_repr_html_"):
            assert method not in vars(cls), f"{cls.__name__} hand-writes {method}"
        assert cls._repr_pretty_ is records.Display._repr_pretty_, cls.__name__
        assert records.render.__module__  # the registry is the one in records
        assert cls._renderer in NAMES, f"{cls.__name__} names a renderer that does not exist"


def test_renderers_are_found_for_every_record(tmp_path):
    import numpy as np

    from helpers import datasets, devices, memory, transfers

    tf = datasets.write_tokens(tmp_path / "t.safetensors", 100)
    with transfers.trace() as log:
        pass
    from IPython.lib.pretty import pretty

    for record in (tf, memory.snapshot(), devices.placement(np.zeros(2)), log):
        text = str(record)
        assert text and not text.startswith("<"), type(record).__name__
        assert pretty(record) == text, type(record).__name__  # what a notebook shows
        html = record._repr_html_()
        assert html is None or html.strip().startswith("<")


def test_the_map_lists_every_module():
    text = (PACKAGE / "README.md").read_text()
    missing = [n for n in NAMES if n != "helpers" and n != "helpers.__main__"
               and f"`{n.rsplit('.', 1)[-1]}`" not in text]
    assert missing == [], f"helpers/README.md does not list: {missing}"


def test_the_package_says_it_is_typed():
    assert (PACKAGE / "py.typed").exists()


@pytest.mark.parametrize("name", PUBLIC)
def test_public_functions_are_annotated(name):
    """Every parameter of a public function or method of a public module has a type."""
    module = importlib.import_module(name)
    missing = []
    for exported in getattr(module, "__all__", ()):
        obj = getattr(module, exported)
        members = [obj] if inspect.isfunction(obj) else [
            m for k, m in vars(obj).items() if inspect.isfunction(m) and not k.startswith("_")
        ] if inspect.isclass(obj) and obj.__module__ == name else []
        for fn in members:
            for p in inspect.signature(fn).parameters.values():
                if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty \
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    missing.append(f"{fn.__qualname__}({p.name})")
    assert missing == [], f"{name}: unannotated parameters: {missing}"


def test_the_cli_side_never_imports_jax():
    """The doctor's parent, the report renderers, the file tools and the errors load where
    `import jax` fails (JAX_NUM_CPU_DEVICES=abc), and never import JAX themselves."""
    from tests.conftest import run_python

    out = run_python(
        "import sys, tempfile, os\n"
        "from helpers import doctor, render, datasets, preflight, oom, errors, settings\n"
        "t = datasets.write_tokens(os.path.join(tempfile.mkdtemp(), 't.safetensors'), 10)\n"
        "print(t); print(settings.check_environment())\n"
        "print('jax' in sys.modules)\n", env={"JAX_NUM_CPU_DEVICES": "abc"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_hook_is_installed_before_the_first_jax_operation():
    """A notebook imports the kit, asks for simulated devices, then runs JAX: the kit's
    backend-start hook must already be in place (jax >= 0.10.2)."""
    from helpers._internal import jaxcompat
    from tests.conftest import run_python

    out = run_python("from helpers import devices, settings\n"
                     "devices.simulate_cpu_devices(2)\n"
                     "import jax; jax.numpy.zeros(1)\n"
                     "print(settings.backend_start_snapshot()[0])", env={"JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    has_hook = jaxcompat.INTERNALS["register_backend_initialization_hook"].expected(
        jaxcompat.jax_version_tuple())
    expected = "installed" if has_hook else "unavailable"
    assert out.stdout.split()[-1] == expected


def test_tests_that_need_the_card_to_themselves_run_before_any_other():
    """The H100 (2026-11-27, second lease): test_compiles' gpu test made arrays in the pytest
    process, whose pool (63.8 GB, 75% of the card) then stopped the two tests after it that
    start default JAX processes beside it. Those tests are marked beside_processes, and the
    session runs them first; every test that starts holders (_holding) carries the mark."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import inspect, pytest\n"
            "class Order:\n"
            "    def pytest_collection_finish(self, session):\n"
            "        for i in session.items:\n"
            "            holds = '_holding(' in inspect.getsource(i.function)\n"
            "            print('ITEM', int('beside_processes' in i.keywords), int(holds), "
            "i.nodeid)\n"
            "pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', '-m', 'gpu', "
            "'tests'], plugins=[Order()])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    items = [line.split(" ", 3)[1:] for line in out.stdout.splitlines()
             if line.startswith("ITEM ")]
    assert len(items) >= 10, out.stdout[-2000:] + out.stderr[-2000:]
    marks = [marked == "1" for marked, _, _ in items]
    first_unmarked = marks.index(False)
    assert any(marks) and not any(marks[first_unmarked:]), items  # the marked ones first
    holders = [nodeid for _, holds, nodeid in items if holds == "1"]
    assert len(holders) == 2 and all(marked == "1" for marked, holds, _ in items
                                     if holds == "1"), items
    assert any(nodeid.startswith("tests/test_compiles.py") for _, _, nodeid in
               items[first_unmarked:])  # an in-process gpu test, after them


def test_collecting_the_tests_starts_no_jax_backend():
    """A test module that makes an array when imported (a module-level jnp.full, a skipif that
    asks jax.devices()) starts JAX in the pytest process. On a GPU that process then holds 75%
    of the card, and the gpu tests that start JAX processes beside it measure what is left (the
    H100 run of 2026-11-27: a default child's pool was 20 GB, not 59 GB)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys, pytest\n"
            "class Watch:\n"
            "    first = None\n"
            "    def pytest_collectreport(self, report):\n"
            "        from helpers._internal import jaxcompat\n"
            "        if jaxcompat.backends_started() and Watch.first is None:\n"
            "            Watch.first = report.nodeid\n"
            "pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests'], "
            "plugins=[Watch()])\n"
            "print('STARTED BY', Watch.first)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert "STARTED BY None" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
