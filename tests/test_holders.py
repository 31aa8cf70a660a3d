"""holders.largest: what keeps the largest live arrays alive, and how to let each go. Each case
also checks the fix it names really frees the array (a weak reference dies)."""

import dataclasses
import gc
import sys
import weakref

import jax
import jax.numpy as jnp
import pytest

from helpers import holders
from tests.conftest import run_python

MiB = 2**20


def big(mib: int):
    """An array larger than anything else the test session keeps (so it is among the largest)."""
    return jnp.zeros(mib * MiB // 4, jnp.float32) + mib


def _find(h, nbytes):
    (a,) = [a for a in h.arrays if a.nbytes == nbytes]
    return a


def test_a_variable_in_the_notebook_is_named_and_del_frees_it():
    ns = {"weights": big(96)}
    gone = weakref.ref(ns["weights"])
    a = _find(holders.largest(3, namespace=ns), 96 * MiB)
    assert a.held_by == ("the variable 'weights' in the notebook",)
    assert "`del weights`" in a.fix and a.array == "float32[25165824] on cpu:0"
    del ns["weights"]  # the fix
    gc.collect()
    assert gone() is None, "the search itself kept a reference"


def test_ipython_output_history_is_named():
    x = big(90)
    ns = {"Out": {12: x}, "_": x}
    x = None
    a = _find(holders.largest(3, namespace=ns), 90 * MiB)
    assert "IPython's output history: Out[12]" in a.held_by
    assert "IPython's last results: _" in a.held_by and "Out.clear()" in a.fix


def test_a_list_and_a_closure_in_the_notebook():
    def make():
        kept = big(84)

        def loss():
            return kept

        return loss

    ns = {"history": [big(88)], "loss": make()}
    h = holders.largest(4, namespace=ns)
    assert _find(h, 88 * MiB).held_by == ("list 'history'[0] in the notebook",)
    (closure,) = _find(h, 84 * MiB).held_by
    assert closure.startswith("a closure: the function") and "make.<locals>.loss" in closure


def test_a_saved_traceback_keeps_a_frame_and_its_locals():
    def step():
        activations = big(80)  # noqa: F841  (kept alive by the traceback only)
        raise RuntimeError("RESOURCE_EXHAUSTED (pretend)")

    saved = getattr(sys, "last_traceback", None)
    try:
        step()
    except RuntimeError:
        sys.last_traceback = sys.exc_info()[2]
    try:
        a = _find(holders.largest(3, namespace={}), 80 * MiB)
        (line,) = a.held_by
        assert "sys.last_traceback" in line and "step (" in line and "'activations'" in line
        assert "sys.last_traceback = None" in a.fix
    finally:
        sys.last_traceback = saved
    gc.collect()
    assert all(x.nbytes != 80 * MiB for x in holders.largest(3, namespace={}).arrays)


def _unaccounted(h) -> int:
    """The bytes of the arrays looked at that none of the header's parts counts: 0 when your
    code's, JAX's, a library's, the cycles' and the ones the time ran out on add up. (Other
    tests' garbage in reference cycles or a search cut short by a loaded machine may be among
    the largest arrays of a whole-suite run: each has its own part.)"""
    def only(prefix: str) -> int:
        return sum(a.nbytes for a in h.arrays
                   if a.held_by and all(line.startswith(prefix) for line in a.held_by))

    cut = sum(a.nbytes for a in h.arrays
              if any(line.startswith("not found before the time ran out") for line in a.held_by))
    return (sum(a.nbytes for a in h.arrays) - h.user_bytes - h.jax_bytes - h.library_bytes
            - h.history_bytes
            - only("a reference cycle nothing reaches") - cut)


def test_an_array_only_jax_holds_and_the_totals():
    ns = {"x": big(76)}
    # only the largest: another test's array, held where the search may run out of its time
    # on a loaded machine, would make `complete` a matter of timing
    h = holders.largest(1, namespace=ns)
    assert h.live_arrays >= 1 and h.live_bytes >= 76 * MiB
    assert _unaccounted(h) == 0
    assert h.complete and h.seconds >= 0 and isinstance(h.executables, int), str(h)
    text = str(h)
    assert "held by the variable 'x'" in text and "compiled programs loaded" in text


def test_the_search_is_bounded_in_time_and_checks_its_input():
    ns = {"x": big(4)}
    h = holders.largest(3, namespace=ns, seconds=0)
    assert not h.complete and h.arrays == () and "time budget ran out" in str(h)
    with pytest.raises(ValueError, match="positive int"):
        holders.largest(0)


class _Model:  # compares by identity, and holds an array
    def __init__(self, mib: int):
        self.table = big(mib)

    def __call__(self, x):
        return x * 2.0


@pytest.mark.parametrize("read", [False, True], ids=["as-made", "dict-read"])
def test_an_object_that_holds_an_array_is_named_by_its_variable_then_by_jit_s_caches(read):
    """jax#16226: an object passed as a static argument stays in jit's caches after `del`.
    Once something reads an object's ``__dict__`` (vars(), pickling), Python 3.11+ keeps its
    attributes in a dict, the array's referrer: the object is named all the same."""
    import jax

    apply = jax.jit(lambda x, model: model(x), static_argnums=1)
    ns = {"model": _Model(84)}
    if read:
        assert "table" in vars(ns["model"])
    apply(jnp.ones(3), ns["model"])
    a = _find(holders.largest(3, namespace=ns), 84 * MiB)
    assert a.held_by == ("a tests.test_holders._Model object, the variable 'model' in the "
                         "notebook",) and "`del model`" in a.fix
    gone = weakref.ref(ns.pop("model"))
    gc.collect()
    h = holders.largest(3, namespace=ns)
    a = _find(h, 84 * MiB)
    assert a.held_by == ("jit's caches, through a tests.test_holders._Model object passed as a "
                         "static argument",)
    assert "jax.clear_caches()" in a.fix and "pass them as traced arguments" in a.fix
    assert h.user_bytes < 84 * MiB <= h.jax_bytes  # not "held by your code"
    apply.clear_cache()
    del apply
    gc.collect()
    if not jax.__version__.startswith("0.8."):  # as the fix says: these do not let it go
        assert gone() is not None  # (measured on 0.10.2, 0.11.2 and 0.12.0.1; 0.8.0 frees it)
    jax.clear_caches()  # the fix
    gc.collect()
    assert gone() is None


def test_an_object_inside_another_jax_object_is_not_called_jit_s():
    """Only jit's own box for a static argument means jit's caches: a tree_util.Partial that
    the user holds is no cache, and clear_caches() would free nothing."""
    import jax

    ns = {"p": jax.tree_util.Partial(_Model(78))}
    a = _find(holders.largest(3, namespace=ns), 78 * MiB)
    assert not any(line.startswith("jit's caches") for line in a.held_by), a.held_by


_FAILED_STEP = """
import resource, sys
import jax, jax.numpy as jnp
import psutil
from helpers import holders, memory
params = jnp.ones((1024, 1024))

@jax.jit
def update(p, x):
    h = x @ p
    return jnp.einsum('bi,bj->bij', h[:, :256], h[:, :256]) * p[0, 0]  # 2 GiB out

x = jnp.ones((8192, 1024))
update.lower(params, x).compile()
vms = psutil.Process().memory_info().vms
resource.setrlimit(resource.RLIMIT_AS, (vms + 600 * 2**20, resource.RLIM_INFINITY))
try:
    out = update(params, x)  # dispatched: out is bound before the run fails
    out.block_until_ready()
except Exception as err:
    print('raised', 'Out of memory' in str(err))  # RESOURCE_EXHAUSTED (0.10), INTERNAL (0.8)
print('listed by jax', any(a.nbytes == 2**31 for a in jax.live_arrays()))
h = holders.largest(3)
print('holders', max(a.nbytes for a in h.arrays))
print('snapshot', memory.snapshot().device('cpu:0').bytes_in_use < 2**30)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="caps the address space")
def test_an_array_whose_computation_ran_out_of_memory_is_skipped_not_fatal():
    """jax#2023: after a CPU step runs out of memory, JAX still lists its output, whose buffer
    was never made; asking it for its address aborted the process (the kernel, under
    %load_ext helpers)."""
    from tests.conftest import run_python

    proc = run_python(_FAILED_STEP, env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"})
    assert proc.returncode == 0, proc.stderr[-1500:]
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["raised True", "listed by jax True"]
    assert int(lines[2].split()[1]) < 2**31  # the largest held array is a real one
    assert lines[3] == "snapshot True"  # the 2 GiB never made is not counted as in use


class _Dataset:  # keeps its arrays in a tuple attribute, as markean/aimz's ArrayDataset did
    def __init__(self, *arrays):
        self.arrays = tuple(arrays)


def test_a_tuple_inside_an_object_is_named_by_the_variable_and_the_attribute():
    """aimz#168: the whole dataset, jnp.asarray-ed into ds.arrays, was 'a container: tuple[0]
    not named in the notebook'; it is ds.arrays[0] of the variable ds."""
    ns = {"ds": _Dataset(big(40), big(1))}
    a = _find(holders.largest(3, namespace=ns), 40 * MiB)
    assert a.held_by == ("tuple ds.arrays[0]: a tests.test_holders._Dataset object, the "
                         "variable 'ds' in the notebook",)
    assert "`del ds` (or `ds.arrays = None`)" in a.fix


class _Node:  # two of them refer to each other: a reference cycle
    def __init__(self, mib: int):
        self.value, self.other = big(mib), None


def test_jax_725_an_array_only_a_reference_cycle_keeps_is_named_with_gc_collect():
    """Held by objects that only refer to each other: the kit used to say 'held by a Node
    object', with no fix, as if the user could reach it. Its look must not keep the cycle
    alive longer than Python would (it moved it a generation up): it frees it."""
    gc.collect()
    gc.disable()  # a stand-in for 'the cycle collector has not run yet'
    try:
        a, b = _Node(24), _Node(1)
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        h = holders.largest(3, namespace={})
        found = _find(h, 24 * MiB)
        assert found.held_by == ("a reference cycle nothing reaches "
                                 "(tests.test_holders._Node)",)
        assert "gc.collect()" in found.fix and "which freed it" in found.fix
        assert gone() is None  # freed by the kit, with the collector still off
    finally:
        gc.enable()
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)  # a user who keeps garbage on purpose
    gc.disable()  # (no automatic collection adding to it meanwhile)
    try:
        before = list(gc.garbage)
        holders.largest(1, namespace={})
        assert gc.garbage == before  # not the kit's to touch
    finally:
        gc.enable()
        gc.set_debug(flags)


class _Trainer:
    def forward(self, params, x):
        import jax

        loss, self.pullback = jax.vjp(lambda p, x: jnp.tanh(x @ p).sum(), params, x)
        return loss


def test_jax_24053_what_the_function_jax_vjp_returns_keeps_is_named_by_its_holder():
    """The function jax.vjp returns keeps the forward pass's values; the kit used to stop at
    JAX's own object and say 'held by JAX alone... JAX frees it'."""
    trainer = _Trainer()
    trainer.forward(jnp.ones((256, 256)), big(16).reshape(-1, 256))
    h = holders.largest(4, namespace={"trainer": trainer})
    kept = [a for a in h.arrays if a.nbytes == 16 * MiB]
    assert kept and any("kept as trainer.pullback" in line for a in kept for line in a.held_by)
    assert "`trainer.pullback = None`" in " ".join(a.fix for a in kept)


def test_flax_1406_many_tiny_metrics_are_named_by_the_list_that_keeps_them():
    """Per-step metrics appended to a list stay on the device, 12,000 scalars: the kit counted
    them and offered the random-keys fix; now it names the list and what to do with it."""
    train_metrics = [{"loss": jnp.float32(i) + 0, "acc": jnp.float32(i) * 1,
                      "lr": jnp.float32(i) - 0} for i in range(4000)]
    # a budget the search never meets: 2 s (the default) took 0.8 s idle here and ran out
    # once under the full suite's load, which left the list unnamed
    h = holders.largest(1, namespace={"train_metrics": train_metrics}, seconds=60.0)
    assert "float32[] x12,000" in h.many_small
    assert "kept by the variable 'train_metrics'" in h.many_small
    assert "jax.device_get" in h.many_small and "jax.random.split" not in h.many_small


def test_a_search_up_never_names_a_holder_through_a_module_s_functions():
    """An array in a list a module keeps: above the module's globals are its functions, and a
    notebook that imported one of them does not hold the array (it was called 'kept by the
    variable cast', with `del cast` as the fix)."""
    import types

    mod = types.ModuleType("kit_test_holder_module")
    mod.kept = [big(20)]
    exec("def cast(x):\n    return x\n", mod.__dict__)  # its globals: the module's dict
    h = holders.largest(2, namespace={"cast": mod.cast})
    a = _find(h, 20 * MiB)
    assert not any("cast" in line for line in a.held_by) and "del cast" not in a.fix
    mod.kept.clear()  # (a module and its functions are a cycle: nothing left for later tests)


def test_many_tiny_arrays_in_one_list_are_counted_as_one_holder():
    """Each array sits at its own index of the list: the holder is the list, whatever the
    index (the count read '1 of 5' when all five were in it)."""
    gc.collect()  # arrays earlier tests left in cycles would lift the average
    losses = [jnp.float32(i) + 0 for i in range(12_000)]
    h = holders.largest(1, namespace={"losses": losses})
    assert "5 of 5 of the commonest kind looked at are held by list 'losses'" in h.many_small
    assert "jax.device_get" in h.many_small


def test_two_arrays_over_one_buffer_are_counted_once_as_the_snapshot_counts_them():
    import jax
    import numpy as np

    from helpers import memory

    host = np.ones((10, 2**20), np.float32)  # 40 MiB
    ns = {"a": jnp.asarray(host), "c": jax.device_put(host)}
    holders.largest(2, namespace=ns)  # asking buffers' addresses: JAX caches a second Array

    def buffer(x):
        return (x.devices().pop(), x.unsafe_buffer_pointer()) if len(x.devices()) == 1 else id(x)

    by_buffer = {buffer(x): x.nbytes for x in memory.live_arrays()}
    assert len(by_buffer) < len(memory.live_arrays())  # a twin, there to be counted twice
    h = holders.largest(2, namespace=ns)
    assert h.live_bytes == sum(by_buffer.values())  # each buffer once (it was counted twice)
    assert h.live_bytes == sum(memory.live_bytes_by_device().values())


def test_a_nested_dict_of_parameters_is_named_by_its_variable_in_the_notebook():
    # a Flax parameter tree is a dict of dicts; a script's or IPython's namespace has __spec__
    # and __name__ as a module's globals do, and the search up took it for one (no name)
    ns = {"__name__": "__main__", "__spec__": None,
          "params": {"dense_0": {"kernel": big(40)}}}
    (h,) = holders.largest(1, namespace=ns).arrays
    assert h.held_by == ("a builtins.dict, kept by the variable 'params' in the notebook",)
    assert h.fix.startswith("`del params` when you are done") and "jax.vjp" not in h.fix


def test_trees_alike_give_up_on_a_huge_container_rather_than_flatten_it():
    """A namespace can hold a list of millions of numbers (a token list): the trees-alike pass
    must not copy it whole (it took 24 s and 3 GiB for 10 million)."""
    import time

    import jax

    from helpers import holders as h

    deadline = time.perf_counter() + 60
    assert h._bounded_flatten(list(range(h._MOST_NODES + 1)), jax, deadline) == []
    assert h._bounded_flatten([[0] * 1000] * 100, jax, deadline) == []  # many nodes in all
    assert len(h._bounded_flatten({"a": [1, 2], "b": 3}, jax, deadline)) == 3


def test_a_numpy_view_of_a_cpu_array_is_named_by_its_variable():
    """np.asarray of a CPU array shares its buffer: after `del x` the view keeps it (the kit
    said 'a builtins.managedbuffer object'; found putting jax#4486 to the kit)."""
    import numpy as np

    ns = {"x": big(8)}
    ns["view"] = np.asarray(ns["x"])[:, None]  # a view of the view: its base chain still leads
    del ns["x"]
    gc.collect()
    a = _find(holders.largest(3, namespace=ns), 8 * MiB)
    assert a.held_by == ("a NumPy view of it, the variable 'view' in the notebook (np.asarray "
                         "of a CPU array shares its buffer)",)
    assert "`del view`" in a.fix
    ns.clear()


_SHELL = """
import gc, re
import jax
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
def cell(src):
    ip.run_cell(src, store_history=True)
def live():  # Arrays over the 16 MiB buffer (on jax 0.8.0 a second one over the same buffer)
    gc.collect()
    return sum(1 for a in jax.live_arrays() if a.size == 2048 * 2048)
def fix():
    from helpers import holders
    h = holders.largest(1)
    (a,) = [a for a in h.arrays if a.nbytes == 16 * 2**20]
    print('BYTES', h.user_bytes, h.history_bytes, str(h).splitlines()[0])
    print('HELD', ' | '.join(a.held_by))
    print('FIX', a.fix)
    return a.fix
cell("import jax, jax.numpy as jnp")
"""

_OUT_HISTORY = _SHELL + """
for shown_before in (0, 1):  # the array is then IPython's _, then its __
    cell("x = jnp.ones((2048, 2048))")
    cell("x")  # displayed: Out[n], _n, _
    if shown_before:
        cell("1")  # one more result: x is now __
    cell("del x")
    said = fix()
    cell("Out.clear()")
    cell("del _" if not shown_before else "del __")
    print('after Out.clear() and del', live())
    cell("%reset -f out")
    print('after %reset -f out', live())
    fix()  # what holds it now
    pops = re.findall(r"del get_ipython\\(\\)\\.user_ns_hidden\\['_+'\\]", said)
    cell("; ".join(pops))
    print('after the kit fix', pops, live())
"""


def test_ipython_12879_a_displayed_array_is_let_go_by_reset_out_and_user_ns_hidden():
    """ipython/ipython#12879: an array shown as a cell's result stays alive after `del`. The
    kit said `Out.clear()` and `del _` (or `%reset -f out`) let it go: in IPython 9.18.1 they
    leave 2 Arrays over the 16 MiB buffer, since the display hook pushes _, __, ___ and _N
    into user_ns_hidden too; its next answer was `exit._ip = None` (that dict is
    user_ns_hidden). Now it names user_ns_hidden and the fix that leaves 0."""
    from tests.conftest import run_python

    proc = run_python(_OUT_HISTORY, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("HELD", "FIX", "after"))]
    assert len(lines) == 14, proc.stdout[-3000:]
    for (held, said, cleared, reset, held_after, _, fixed), under in zip(  # noqa: B905
            (lines[:7], lines[7:]), ("_", "__")):
        assert f"user_ns_hidden['{under}'" in held and "Out[" in held
        assert "`%reset -f out`" in said and f"del get_ipython().user_ns_hidden['{under}']" in said
        assert not cleared.endswith(" 0") and not reset.endswith(" 0")  # the old fixes
        assert f"user_ns_hidden['{under}']" in held_after and "exit._ip" not in held_after
        assert fixed.endswith(" 0"), fixed  # the kit's fix frees it


_DICT_SHOWN = _SHELL + """
cell("params = {'w': jnp.ones((2048, 2048)), 'b': jnp.zeros(8)}")
cell("params")  # displayed: Out[n], _n, the hidden _
cell("1")
cell("2")  # the dict is now the hidden ___ (three results on)
cell("ip2 = get_ipython()")  # a variable that reaches the display hook
cell("del params")
said = fix()
steps = re.findall(r"`([^`]+)`", said.split(';')[0])
for step in steps:
    cell(step)
print('after the kit fix', steps, live())
"""


def test_notebook_2201_a_displayed_dict_of_arrays_is_let_go_by_the_history_fix():
    """jupyter/notebook#2201 (a new user's trial, in a real kernel): a dict of arrays shown as
    a cell's result and then deleted. The kit said "held by dict '__'['w'] in user_ns_hidden
    ... `del __` and `del _3` and `del 3`": `del 3` is a SyntaxError, and the other two
    reach the notebook's names, not IPython's history. Now the dict's places are named as the
    history they are, and the fix run step by step frees it; the display hook reached through
    a variable (ip = get_ipython()) is IPython's history too, not a copy kept by an object
    (keras-core#888's sentence)."""
    from tests.conftest import run_python

    proc = run_python(_DICT_SHOWN, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    held = next(x for x in proc.stdout.splitlines() if x.startswith("HELD"))
    said = next(x for x in proc.stdout.splitlines() if x.startswith("FIX"))
    after = next(x for x in proc.stdout.splitlines() if x.startswith("after"))
    assert "Out[" in held and "IPython's output history" in held, held
    assert "(the variable" not in held and "del 3" not in said, said
    assert said.startswith("FIX IPython keeps every displayed result: run `%reset -f out`")
    assert "keras-core#888" not in said
    assert after.endswith(" 0"), proc.stdout[-3000:]  # the kit's fix frees it
    # and its summary (a trial): history's bytes, not "held by your code"
    _, user, history, first = next(x for x in proc.stdout.splitlines()
                                   if x.startswith("BYTES")).split(" ", 3)
    assert int(user) == 0 and int(history) == 16 * MiB, first
    assert "0 B by JAX alone" in first, first
    assert "0 B held by your code" in first, first
    assert "16.00 MiB by IPython alone (its output history" in first, first


_NO_CACHE = _SHELL.replace("InteractiveShell.instance()",
                           "InteractiveShell.instance(cache_size=0)") + """
cell("jnp.ones((2048, 2048))")
said = fix()
cell("1")
print('after the next cell', live())
"""


def test_a_result_shown_with_the_output_cache_off_is_named_as_the_last_cell_s_record():
    """With InteractiveShell.cache_size = 0 (a new user's trial: the fix scipp#2737 gives) a
    shown array stays alive through the next cell, held by IPython's ExecutionResult: the kit
    said "held by a IPython.core.interactiveshell.ExecutionResult object", no path, no fix."""
    from tests.conftest import run_python

    proc = run_python(_NO_CACHE, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    held = next(x for x in proc.stdout.splitlines() if x.startswith("HELD"))
    said = next(x for x in proc.stdout.splitlines() if x.startswith("FIX"))
    assert "get_ipython().last_execution_result.result" in held, held
    assert "lets go when the next cell has run" in said
    assert proc.stdout.strip().endswith("after the next cell 0"), proc.stdout[-2000:]


_KERNEL_HOOK = _SHELL + """
from IPython.core.displayhook import DisplayHook
# ipykernel's hook is a subclass of IPython's with a name of its own (ZMQShellDisplayHook)
ip.displayhook.__class__ = type("ZMQShellDisplayHook", (type(ip.displayhook),), {})
cell("ip = get_ipython()")  # the trial's variable: it reaches the hook as ip.displayhook
cell("x = jnp.ones((2048, 2048))")
cell("x")
cell("del x")
said = fix()
"""


def test_ipython_10082_a_kernel_s_display_hook_is_named_as_output_history():
    """ipython/ipython#10082 (a new user's trial, in a Jupyter kernel): the array shown and
    deleted was also "held by a ipykernel.displayhook.ZMQShellDisplayHook object, reached as
    ip.displayhook._", with keras-core#888's sentence on an object that keeps an array a loop
    replaced. ipykernel's hook is a subclass of IPython's DisplayHook: it is output history."""
    from tests.conftest import run_python

    proc = run_python(_KERNEL_HOOK, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    held = next(x for x in proc.stdout.splitlines() if x.startswith("HELD"))
    said = next(x for x in proc.stdout.splitlines() if x.startswith("FIX"))
    assert "ZMQShellDisplayHook object" not in held and "display hook's _" in held, held
    assert "keras-core#888" not in said and "`%reset -f out`" in said, said


_OWN_UNDERSCORE = _SHELL + """
cell("def train():\\n    return 1.0, {'w': jnp.ones((2048, 2048))}")
cell("loss, _ = train()")  # the user's own _, never displayed
fix()
"""


def test_a_user_s_own_underscore_variable_is_not_called_output_history():
    """A review: `loss, _ = train()` made the kit say "kept in IPython's output history" and
    `%reset -f out`, which frees it only by overwriting the user's `_` (and wipes Out). IPython's
    history is where its display hook holds the same object; else `del _`."""
    from tests.conftest import run_python

    proc = run_python(_OWN_UNDERSCORE, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    held = next(x for x in proc.stdout.splitlines() if x.startswith("HELD"))
    said = next(x for x in proc.stdout.splitlines() if x.startswith("FIX"))
    assert "output history" not in held and "in the notebook" in held, held
    assert "`del _`" in said and "%reset" not in said, said
    _, user, history, _ = next(x for x in proc.stdout.splitlines()
                               if x.startswith("BYTES")).split(" ", 3)
    assert int(user) == 16 * MiB and int(history) == 0, proc.stdout[-2000:]


_SAVED_TRACEBACK = _SHELL + """
cell("def train():\\n    big = jnp.ones((2048, 2048))\\n    raise RuntimeError('diverged')")
cell("train()")
print('after the error', live())
cell("import sys; sys.last_traceback = sys.last_value = None")
print('after sys.last_traceback = None', live())
cell("train()")  # again: IPython now keeps this one
said = fix()
(step,) = re.findall(r"`(sys\\.last_traceback\\.tb_next = None)`", said)
cell(step)
print('after the kit fix', live())
"""


def test_ipython_11572_a_saved_traceback_in_ipython_is_cut_below_its_first_frame():
    """ipython/ipython#11572: after an exception in a cell, the failing function's locals stay
    alive. The kit said `sys.last_traceback = None`, which in IPython frees nothing (its
    InteractiveTB and last ExecutionResult keep the same traceback); cutting the traceback
    below its first frame, IPython's own, frees it. (Outside IPython the plain fix stays:
    test_a_saved_traceback_keeps_a_frame_and_its_locals.)"""
    from tests.conftest import run_python

    proc = run_python(_SAVED_TRACEBACK, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = {x.split(" ")[0]: x for x in proc.stdout.splitlines()
           if x.startswith(("HELD", "FIX"))}
    counts = [x for x in proc.stdout.splitlines() if x.startswith("after")]
    assert not counts[0].endswith(" 0") and not counts[1].endswith(" 0"), counts  # old fix
    assert "a saved traceback (sys.last_traceback)" in out["HELD"] and "'big'" in out["HELD"]
    assert "InteractiveTB" in out["FIX"]
    assert counts[2] == "after the kit fix 0", counts


class _Sampler:  # numpyro's MCMC: get_samples() returns the very dict it keeps in _states_flat
    def __init__(self, mib: int):
        self._states_flat = {"z": {"x": big(mib)}}

    def get_samples(self) -> dict:
        return self._states_flat["z"]


def test_numpyro_1115_every_name_of_a_shared_container_is_named_and_must_go():
    """pyro-ppl/numpyro#1115: `samples = mcmc.get_samples()` is the very dict
    `mcmc._states_flat['z']`; the kit said `del samples`, which freed nothing (checked with
    numpyro 0.22: both 15.26 MiB arrays still alive). Now it names both and says both go."""
    mcmc = _Sampler(36)
    ns = {"mcmc": mcmc, "samples": mcmc.get_samples()}
    gone = weakref.ref(mcmc._states_flat["z"]["x"])
    del mcmc
    a = _find(holders.largest(3, namespace=ns), 36 * MiB)
    assert a.held_by == ("dict 'samples'['x'] in the notebook; the same dict is also "
                         "mcmc._states_flat['z'] (a tests.test_holders._Sampler object, the "
                         "variable 'mcmc' in the notebook)",)
    assert a.fix.startswith("`del samples` alone frees nothing, the same dict is also "
                            "mcmc._states_flat['z']: `del samples` and "
                            "`mcmc._states_flat = None`"), a.fix
    del ns["samples"]  # the kit's old fix
    gc.collect()
    assert gone() is not None
    ns["mcmc"]._states_flat = None  # and the rest of the new one
    gc.collect()
    assert gone() is None


#: numpyro's mechanism (numpyro.util.cached_by, MCMC._get_cached_fns), as a library would have
#: it: a module function keeps a cache of functions, and one of them closes over the sampler
_SAMPLER_LIBRARY = """
from collections import OrderedDict
from functools import partial


def cached_by(outer, *keys):
    outer._cache = getattr(outer, "_cache", OrderedDict())

    def wrapped(fn):
        outer._cache[(*keys, fn.__name__)] = fn
        return fn
    return wrapped


def collect(postprocess):
    @cached_by(collect, postprocess)
    def collect_and_postprocess(x):
        return postprocess(x)
    return collect_and_postprocess


class Sampler:
    def run(self, states):
        self._states = states

        def _postprocess_fn(x):
            return self
        collect(partial(_postprocess_fn))
"""


def test_numpyro_1115_an_object_a_library_s_module_cache_keeps_is_not_called_yours():
    """pyro-ppl/numpyro#1115: once the MCMC object left the user's code, its samples stayed
    alive through numpyro's module-level caches of functions that close over it; the kit said
    'held by your code ... a container: dict['x'] not named'. Now it names the module's
    cache, counts the bytes apart, and clearing that cache frees the array."""
    import os
    import sysconfig
    import types

    lib = types.ModuleType("kit_test_sampler_lib")  # a module installed as a package would be
    lib.__file__ = os.path.join(sysconfig.get_paths()["purelib"], "kit_test_sampler_lib.py")
    exec(compile(_SAMPLER_LIBRARY, lib.__file__, "exec"), lib.__dict__)

    def run():
        sampler = lib.Sampler()
        sampler.run({"z": {"x": big(44)}})
        return weakref.ref(sampler)

    gone = run()
    gc.collect()
    assert gone() is not None
    h = holders.largest(3, namespace={}, seconds=60)  # (a suite's heap is large: no cut)
    assert h.complete
    a = _find(h, 44 * MiB)
    assert a.held_by == ("a library's module-level state (kit_test_sampler_lib), not a variable "
                         "of yours: kit_test_sampler_lib.collect._cache, through a "
                         "kit_test_sampler_lib.Sampler object",), a.held_by
    assert "`del` of your own names frees nothing" in a.fix
    assert "`kit_test_sampler_lib.collect._cache.clear()`" in a.fix
    assert h.library_bytes >= 44 * MiB and "by a library's module-level state" in str(h)
    assert h.user_bytes + h.jax_bytes + h.library_bytes + h.history_bytes == sum(
        x.nbytes for x in h.arrays)
    lib.collect._cache.clear()  # the fix it names
    gc.collect()
    assert gone() is None


def test_a_search_cut_short_by_the_time_budget_is_nobody_s_bytes_not_your_code(monkeypatch):
    """On a large heap the search up from an unnamed holder can run out of time: the array was
    then counted as held by your code (the review: a library's cache called yours). It is now
    named as not found, and the block as not complete. A clock that moves a second a reading
    stands in for the large heap (no assertion on real time)."""
    import types

    ticks = iter(range(10**6))
    monkeypatch.setattr(holders, "time", types.SimpleNamespace(
        perf_counter=lambda: float(next(ticks))))
    lib = types.ModuleType("kit_test_cut_lib")
    lib.cache = [[{"x": jnp.ones((1024, 1024))}]]  # 4 MiB a module keeps, deep in containers
    sys.modules["kit_test_cut_lib"] = lib
    try:
        h = holders.largest(1, namespace={}, seconds=2.5)  # spent inside the search up
        a = _find(h, 4 * MiB)
        assert not h.complete and a.held_by[0].startswith("not found before the time ran out")
        assert h.user_bytes == 0 and "seconds=60" in a.fix
    finally:
        del sys.modules["kit_test_cut_lib"]


_OTT_423 = _SHELL + """
cell("def solve_bad():\\n    K = jnp.ones((2048, 2048))\\n    raise RuntimeError('shapes')")
cell("solve_bad()")
cell("import sys; sys.last_traceback = sys.last_value = sys.last_type = None\\n"
     "if hasattr(sys, 'last_exc'): sys.last_exc = None")
print('after the partial clear', live())
said = fix()
(step,) = re.findall(r"`(get_ipython\\(\\)\\.InteractiveTB\\.tb = None)`", said)
cell(step)
print('after the kit fix', live())
"""


def test_ott_423_a_frame_ipython_keeps_after_sys_last_traceback_is_cleared_is_no_running_one():
    """ott-jax/ott#423: memory 'dead' after an error until a restart. After the user cleared
    sys.last_traceback, the kit called the failing function's local "held by a running
    function's local 'K'", though nothing ran: IPython's InteractiveTB keeps the traceback.
    Named as that, with the fix that frees it (run here: the array goes)."""
    from tests.conftest import run_python

    proc = run_python(_OTT_423, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = {x.split(" ")[0]: x for x in proc.stdout.splitlines()
           if x.startswith(("HELD", "FIX"))}
    counts = [x for x in proc.stdout.splitlines() if x.startswith("after")]
    assert not counts[0].endswith(" 0"), counts  # sys.last_traceback = None freed nothing
    assert "running function" not in out["HELD"] and "'K'" in out["HELD"]
    assert "get_ipython().InteractiveTB.tb" in out["HELD"]
    assert counts[1] == "after the kit fix 0", counts


def test_jax_26216_a_host_read_of_a_sharded_array_lists_no_shard_views_and_names_its_host_copy():
    """jax-ml/jax#26216: after np.asarray / jax.device_get of a sharded array, JAX lists
    single-device Arrays over its shards' own buffers: the kit counted twice the device bytes
    and called each shard "held by JAX alone". And the host copy JAX keeps on the array for as
    long as it lives was not named; its fix (read shard by shard, or from a temporary copy) is
    run here: no copy kept."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from helpers._internal import jaxcompat

    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    sharded = NamedSharding(mesh, PartitionSpec("x"))

    def params():
        return {"w": jax.device_put(jnp.ones((4096, 1152), jnp.float32), sharded)}  # 18 MiB

    gc.collect()
    base = sum(memory_bytes().values())
    state = params()
    listed = len(jax.live_arrays())
    np.asarray(state["w"])  # the checkpoint's read (jax.device_get does the same)
    # JAX made an Array over each shard (jax 0.8.0 to 0.11.2; 0.12.0.1 makes none: measured)
    views = len(jax.live_arrays()) > listed
    assert jaxcompat.host_copy_bytes(state["w"]) == 18 * MiB
    assert sum(memory_bytes().values()) - base == 18 * MiB  # was 36 MiB: each shard twice
    h = holders.largest(3, namespace={"state": state})
    assert h.live_bytes - base == 18 * MiB
    # JAX's views, left out of the list
    assert h.shard_views >= len(jax.devices()) if views else h.shard_views == 0
    shard = 18 * MiB // len(jax.devices())
    assert not [a for a in h.arrays if a.nbytes == shard], h.arrays
    (w,) = [a for a in h.arrays if a.nbytes == 18 * MiB]
    assert w.held_by == ("dict 'state'['w'] in the notebook",) and w.host_copy == 18 * MiB
    assert h.host_copy_bytes >= 18 * MiB
    text = str(h)
    assert ("JAX's views of a sharded array's shards" in text) == views
    assert "held by JAX alone" not in text.split("compiled programs")[0]
    assert "jax-ml/jax#26216" in h.host_copies and "18.00 MiB host copy" in text
    assert "np.asarray(s.data) for s in x.addressable_shards" in h.host_copies
    assert "np.asarray(x.copy())" in h.host_copies
    # the fixes, run: read shard by shard, or from a temporary copy: no copy kept
    for read in (lambda x: np.concatenate([np.asarray(s.data) for s in x.addressable_shards]),
                 lambda x: np.asarray(x.copy())):
        fresh = params()
        assert read(fresh["w"]).shape == (4096, 1152)
        assert jaxcompat.host_copy_bytes(fresh["w"]) == 0
        del fresh
    del state


def test_jax_26216_holders_makes_no_arrays_of_a_sharded_array_never_read_and_claims_no_views():
    """jax-ml/jax#26216's fix, reviewed: with a P("x") batch never read on the host beside the
    user's per-device arrays of its shard's shape, one count made 8 arrays and holders said "13
    live arrays (4 of them JAX's views of a sharded array's shards, made when it was read on the
    host ...)" where there were 5; and holders' own address reads added one Array per
    per-device array on every call. Now nothing is made and no views are claimed."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    batch = jax.device_put(jnp.ones((len(jax.devices()) * 256, 1024), jnp.float32),
                           NamedSharding(mesh, PartitionSpec("x")))
    acts = [jax.device_put(jnp.zeros((256, 1024), jnp.float32), d) for d in jax.devices()]
    jax.block_until_ready((batch, acts))
    gc.collect()
    n = len(jax.live_arrays())
    for _ in range(2):
        h = holders.largest(2, namespace={"batch": batch, "acts": acts})
        assert h.shard_views == 0 and "JAX's views" not in str(h)
        assert h.live_arrays == n and len(jax.live_arrays()) == n  # was 13 after one call, for 5
    assert h.arrays[0].held_by == ("the variable 'batch' in the notebook",)
    del batch, acts


def memory_bytes() -> dict:
    from helpers import memory

    return memory.live_bytes_by_device()


def test_keras_19110_bytes_only_reference_cycles_hold_are_in_the_header_whatever_n():
    """keras-team/keras#19110: load_weights left the old weights in reference cycles. Among
    arrays of one size, which ones largest(n) shows is chance, so the cycle could fall outside
    largest(3), and the header counted cycle garbage as 'held by your code'. The header now
    says the cycles' bytes for every n; the fix (a weak back reference) leaves none."""
    gc.collect()
    gc.disable()  # a stand-in for 'the cycle collector has not run yet'
    try:
        kept = [big(21) for _ in range(3)]  # the new weights, the same size as the old
        for _ in range(2):
            a, b = _Node(21), _Node(1)
            a.other, b.other = b, a  # the variable refers back to its layer
        del a, b
        for n in (1, 3, 8):
            h = holders.largest(n, namespace={"kept": kept})
            assert h.cycle_bytes >= 2 * 21 * MiB, (n, h.cycle_bytes)
            assert "held only by reference cycles" in str(h).splitlines()[0]
            looked = sum(x.nbytes for x in h.arrays if x.held_by
                         and all(line.startswith("a reference cycle") for line in x.held_by))
            assert _unaccounted(h) == 0  # the cycles' bytes are not your code's
            assert h.user_bytes <= sum(x.nbytes for x in h.arrays) - looked
            gc.disable()  # (the kit's collection freed them: make them again for the next n)
            for _ in range(2):
                a, b = _Node(21), _Node(1)
                a.other, b.other = b, a
            del a, b
        gc.collect()
        for _ in range(2):  # the fix: the back reference is weak, no cycle
            a, b = _Node(21), _Node(1)
            a.other, b.other = weakref.ref(b), a
        del a, b
        h = holders.largest(3, namespace={"kept": kept})
        assert h.cycle_bytes == 0 and "reference cycles" not in str(h).splitlines()[0]
    finally:
        gc.enable()


def test_jax_18954_programs_on_the_cpu_print_no_generated_code_0_b():
    """jax-ml/jax#18954 (a helper's side note): the CPU backend gives 0 bytes of generated code
    for every program; preflight_step says it does not report it, and holders printed
    "compiled programs loaded: N (generated code 0 B)" as if measured. Now the same words."""
    import dataclasses

    import jax

    from helpers.units import NOT_AVAILABLE

    f = jax.jit(lambda x: jnp.tanh(x) * 2)
    f(jnp.ones(8)).block_until_ready()
    stats = f.lower(jnp.ones(8)).compile().memory_analysis()
    assert stats.generated_code_size_in_bytes == 0  # what the CPU backend says
    h = holders.largest(1, namespace={})
    assert h.executables >= 1 and h.cpu_executables == h.executables
    assert h.executable_code_bytes is NOT_AVAILABLE and h.to_dict()["executable_code_bytes"] is None
    (row,) = [line for line in str(h).splitlines() if line.startswith("compiled programs")]
    assert row.endswith("(generated code not reported by the CPU backend: XLA gives 0)"), row
    assert "0 B" not in row
    again = type(h).from_dict(h.to_dict())
    assert again.executable_code_bytes is NOT_AVAILABLE
    assert again.cpu_executables == h.cpu_executables
    # a GPU's programs beside the CPU's: theirs counted, the CPU's said to be left out
    mixed = dataclasses.replace(h, executables=3, cpu_executables=1, executable_code_bytes=4096)
    assert "compiled programs loaded: 3 (generated code 4.00 KiB; the CPU backend's 1 not " \
           "reported)" in str(mixed)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc's RssAnon")
def test_jax_4636_a_dlpack_consumer_of_an_array_is_named_and_must_go_too():
    """jax-ml/jax#4636 (export by DLPack consumed the buffer in 2020; now it is shared): `t =
    np.from_dlpack(w)` (torch.from_dlpack in the thread) refers to no Array of JAX's, so the
    kit said `del w` alone, which freed nothing: after `w.delete(); del w` 64 MiB stayed (the
    helper's run: +74 MiB anonymous) and only `del t` freed it. It is found by its address
    in the buffer now, and the fix names both."""
    import numpy as np

    ns = {"w": big(48)}
    ns["t"] = np.from_dlpack(ns["w"])
    a = _find(holders.largest(3, namespace=ns), 48 * MiB)
    assert any(h.startswith("a DLPack consumer of its buffer, the variable 't' in the notebook "
                            "(np.from_dlpack of a jax.Array shares its buffer, and keeps it "
                            "after the jax.Array is deleted;") for h in a.held_by)
    assert "the variable 'w' in the notebook" in a.held_by
    assert a.fix.startswith("`del w, t` when you are done; `del w` alone frees nothing: 't' "
                            "shares its buffer, which stays while it lives, even after "
                            "w.delete() (jax-ml/jax#4636)"), a.fix
    # the fixes, run in a fresh process: there RSS moves with this buffer alone (in the suite
    # a jax 0.8.0 run's RSS did not fall at `del t`, whatever the heap held before)
    out = run_python(
        "import gc, jax.numpy as jnp, numpy as np\n"
        "def rss():\n"
        "    with open('/proc/self/status') as f:\n"
        "        return next(int(l.split()[1]) * 1024 for l in f if l.startswith('RssAnon'))\n"
        "w = jnp.zeros(48 * 2**20 // 4, jnp.float32) + 48\n"
        "t = np.from_dlpack(w)\n"
        "w.delete(); del w; gc.collect()  # the old fix: the Array is gone, its buffer is not\n"
        "assert float(t[0]) == 48.0 and t.nbytes == 48 * 2**20\n"
        "before = rss()\n"
        "del t; gc.collect()  # the rest of the fix\n"
        "print(before - rss())\n")
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 40 * MiB  # the buffer went with the consumer


def test_jax_1961_every_numpy_view_of_an_array_is_named_and_all_must_go():
    """jax-ml/jax#1961: two np.asarray views of one CPU array; the kit named the first only
    ("`del x`; `del a1`"), and after `del x, a1` the 64 MiB stayed, held by a2 (the helper's
    run: 141 MiB anonymous until `del a2`, 77 after). Every view is named now."""
    import numpy as np

    ns = {"x": big(44)}
    ns["a1"], ns["a2"] = np.asarray(ns["x"]), np.asarray(ns["x"])
    gone = weakref.ref(ns["x"])
    a = _find(holders.largest(3, namespace=ns), 44 * MiB)
    assert set(a.held_by) == {"the variable 'x' in the notebook", "NumPy views of it, the "
                              "variables 'a1', 'a2' in the notebook (np.asarray of a CPU array "
                              "shares its buffer)"}
    assert a.fix.startswith("`del x, a1, a2` when you are done; `del x` alone frees nothing: "
                            "'a1' and 'a2' are NumPy views of its buffer"), a.fix
    assert "np.array(x) instead makes a copy" in a.fix and "jax-ml/jax#1961" in a.fix
    del ns["x"], ns["a1"]  # the old fix
    gc.collect()
    assert gone() is not None  # a2 keeps it
    (a,) = [h for h in holders.largest(3, namespace=ns).arrays if h.nbytes == 44 * MiB]
    assert a.fix.startswith("`del a2` when you are done; 'a2' is a NumPy view"), a.fix
    del ns["a2"]  # the rest of the new one
    gc.collect()
    assert gone() is None


class _Batches:  # numpyro's MCMC after a run: the samples twice, and the state to go on from
    def run(self, key, chains: int, n: int, d: int):
        import jax

        states = jax.random.normal(key, (chains, n, d))
        self._states = {"z": states}
        self._states_flat = {"z": states.reshape(chains * n, d)}  # a copy: JAX makes no views
        self.post_warmup_state = states[:, -1]


def test_numpyro_1689_a_reshaped_copy_is_one_value_held_twice_and_its_attribute_goes_first():
    """pyro-ppl/numpyro#1689: MCMC keeps the last batch twice on the device, `_states` and
    `_states_flat` (a reshaped copy), so batch 2 needed more than batch 1 (8.2 against 24.6 MB
    in the helper's stand-in). The kit named both with `del mcmc (or mcmc._states_flat =
    None)`; `del mcmc` would lose its post_warmup_state, so the attribute leads now, and the
    two are said to hold the same values. Zeros of two shapes, and a same-shaped array of
    the same values, are no reshaped copy."""
    import jax

    mcmc = _Batches()
    mcmc.run(jax.random.PRNGKey(0), 2, 1024, 2048)  # 16 MiB each
    r = jax.random.normal(jax.random.PRNGKey(1), (512, 4096))
    ns = {"mcmc": mcmc, "zeros_a": jnp.zeros((1024, 4096)), "zeros_b": jnp.zeros((4096, 1024)),
          "r": r, "r_copy": r + 0.0}
    del r
    gone = weakref.ref(mcmc._states_flat["z"])
    del mcmc
    h = holders.largest(6, namespace=ns)
    by = {a.array: a for a in h.arrays}
    flat, states = by["float32[2048, 2048] on cpu:0"], by["float32[2, 1024, 2048] on cpu:0"]
    assert flat.held_by == ("dict mcmc._states_flat['z']: a tests.test_holders._Batches object, "
                            "the variable 'mcmc' in the notebook",)
    assert flat.fix.startswith("`mcmc._states_flat = None` when you are done (`del mcmc` frees "
                               "it too, and with it the rest of mcmc: _states, "
                               "post_warmup_state)"), flat.fix
    assert ("it holds the same values as the float32[2, 1024, 2048] held by dict "
            "mcmc._states['z'], reshaped: one value held twice on the device") in flat.fix
    assert "pyro-ppl/numpyro#1689" in flat.fix and "one of the two is enough" in flat.fix
    assert "the same values as the float32[2048, 2048] held by dict mcmc._states_flat['z']" \
        in states.fix
    assert len(h.arrays) == 6  # the zeros and the same-shaped copy were looked at: not said
    assert not any("same values" in a.fix for a in h.arrays if a not in (flat, states)), h
    ns["mcmc"]._states_flat = None  # the fix it leads with
    gc.collect()
    assert gone() is None and ns["mcmc"].post_warmup_state.shape == (2, 2048)  # state kept
    ns.clear()
    sampler = _Batches()  # an array an attribute holds itself, beside more state
    sampler.last_samples, sampler.num_samples = big(20), 1000
    ns = {"sampler": sampler}
    gone = weakref.ref(sampler.last_samples)
    del sampler
    a = _find(holders.largest(3, namespace=ns), 20 * MiB)
    assert a.fix == ("`sampler.last_samples = None` when you are done (`del sampler` frees it "
                     "too, and with it the rest of sampler: num_samples)"), a.fix
    ns["sampler"].last_samples = None
    gc.collect()
    assert gone() is None and ns["sampler"].num_samples == 1000


@dataclasses.dataclass(frozen=True)
class _FrozenState:  # a train state as flax.struct and equinox make them: assignment raises
    params: object
    opt: object
    step: int = 0


@dataclasses.dataclass(frozen=True)
class _ReplaceableState:  # flax.struct.PyTreeNode's way: a replace method
    params: object
    step: int = 0

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


class _Locked:  # overrides __setattr__ to refuse assignment, no replace
    def __init__(self, w):
        object.__setattr__(self, "w", w)
        object.__setattr__(self, "n", 1)

    def __setattr__(self, name, value):
        raise AttributeError("locked")


def test_numpyro_1689_a_frozen_state_gets_a_replaced_copy_not_an_assignment():
    """A review's repro of numpyro#1689's attribute fix: for a frozen dataclass TrainState the
    kit led with `state.params = None`, which raises FrozenInstanceError. It leads with a copy
    without the array now (dataclasses.replace, or the class's own replace), else `del`."""
    ns = {"state": _FrozenState(big(23), jnp.zeros(4))}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ns["state"].params = None  # the old fix
    gone = weakref.ref(ns["state"].params)
    a = _find(holders.largest(3, namespace=ns), 23 * MiB)
    assert a.fix.startswith("`state = dataclasses.replace(state, params=None)` when you are "
                            "done (`del state` frees it too, and with it the rest of state: "
                            "opt, step)"), a.fix
    exec("import dataclasses\nstate = dataclasses.replace(state, params=None)", ns)  # the fix
    gc.collect()
    assert gone() is None and ns["state"].opt.shape == (4,)  # the rest kept
    ns = {"s": _ReplaceableState(big(22))}
    gone = weakref.ref(ns["s"].params)
    a = _find(holders.largest(3, namespace=ns), 22 * MiB)
    assert "`s = s.replace(params=None)`" in a.fix and "s.params = None" not in a.fix, a.fix
    exec("s = s.replace(params=None)", ns)
    gc.collect()
    assert gone() is None
    ns = {"locked": _Locked(big(21))}
    gone = weakref.ref(ns["locked"].w)
    a = _find(holders.largest(3, namespace=ns), 21 * MiB)
    assert a.fix == ("`del locked` when you are done (it takes no assignment; with it goes the "
                     "rest of locked: n)"), a.fix
    del ns["locked"]
    gc.collect()
    assert gone() is None


def test_jax_4636_looking_for_sharers_leaves_the_live_array_count_as_it_was():
    """A review's repro: holders.largest() asked a committed Array for its buffer's address
    whenever a NumPy array was in the namespace, and JAX then caches a second Array over the
    buffer: jax.live_arrays() went from 1 to 2 for one array. NumPy arrays over NumPy's own
    memory (np.ones, a slice of one) cannot be over a JAX buffer: no address is asked."""
    import jax
    import numpy as np

    w = jax.device_put(big(16), jax.devices()[0])
    assert w.committed
    ns = {"w": w, "a": np.ones(100), "v": np.ones(200)[::2]}
    del w
    before = len(jax.live_arrays())
    a = _find(holders.largest(3, namespace=ns), 16 * MiB)
    assert len(jax.live_arrays()) == before  # it was before + 1
    assert a.held_by == ("the variable 'w' in the notebook",)
    probe = jax.device_put(jnp.zeros(4), jax.devices()[0])
    n = len(jax.live_arrays())
    probe.unsafe_buffer_pointer()  # the cause, still so on this JAX
    assert len(jax.live_arrays()) == n + 1


_SCRIPT_HOLDS = """
import jax.numpy as jnp
import numpy as np
from helpers import holders
weights = jnp.ones(4 * 2**20)  # 16 MiB, a global of this script
history = [jnp.zeros(3 * 2**20)]
h = holders.largest(2)
for a in h.arrays:
    print(a.held_by[0])
"""


def test_a_script_s_globals_are_named_as_the_script_s_not_a_notebook_s():
    """Outside IPython the variables holders.largest finds are a script's globals (__main__):
    the kit said "in the notebook" for them (a review's finding)."""
    proc = run_python(_SCRIPT_HOLDS, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["the variable 'weights' in the script",
                                        "list 'history'[0] in the script"]


def test_jax_16778_one_function_s_many_compiled_programs_are_named_with_the_fix():
    """jax-ml/jax#16778: a jitted function called with a new shape at every iteration keeps one
    compiled program per shape. holders said "compiled programs loaded: 60" and nothing more.
    It now names the function and the fix; the fix it names (clear_cache) leaves none, and
    fewer than MANY_PROGRAMS get no sentence, nor do JAX's own eager operations (jnp.ones
    compiles jit_broadcast_in_dim per shape)."""
    import jax

    def add_pairs(a, b):
        return a @ b + a

    add_jit = jax.jit(add_pairs)
    jax.clear_caches()
    for i in range(2, 2 + holders.MANY_PROGRAMS):
        a = jnp.ones((i, i))
        add_jit(a, a)
    h = holders.largest(1)
    assert h.many_programs.startswith(
        f"{holders.MANY_PROGRAMS} compiled programs of jit_add_pairs are loaded")
    assert "Pad or bucket" in h.many_programs and "clear_cache()" in h.many_programs
    assert f"! {h.many_programs}" in str(h)
    add_jit.clear_cache()  # the fix it names
    assert holders.largest(1).many_programs == ""
    for i in range(2, 5):  # a few shapes: ordinary
        add_jit(jnp.ones((i, i)), jnp.ones((i, i)))
    assert holders.largest(1).many_programs == ""
    # (found by a review) an ensemble's members, each its own jit of one shape, and eager
    # jnp.mean over many lengths (JAX's own jit__mean): neither is one function's shapes
    members = [jax.jit(add_pairs) for _ in range(holders.MANY_PROGRAMS)]
    for member in members:
        member(jnp.ones((3, 3)), jnp.ones((3, 3)))
    for i in range(2, 2 + holders.MANY_PROGRAMS):
        jnp.mean(jnp.arange(float(i)))
    assert holders.largest(1).many_programs == ""
    jax.clear_caches()


def test_a_fix_one_view_holds_whole_is_said_once():
    """A buffer seen through two Arrays (x, and the one np.asarray made of it) got two fixes,
    one holding the other whole, and the `del` sentence was printed twice (a trial with
    torch.from_numpy(np.asarray(x)); np.from_dlpack of the view does the same)."""
    done = run_python("import numpy as np, jax.numpy as jnp\n"
                      "from helpers import holders\n"
                      "x = jnp.ones((1024, 1024))\n"
                      "t_naive = np.from_dlpack(np.asarray(x))\n"
                      "t_dl = np.from_dlpack(x)\n"
                      "print('FIX', holders.largest(1).arrays[0].fix)")
    assert done.returncode == 0, done.stderr
    fix = done.stdout.split("FIX ", 1)[1]
    assert fix.count("`del x, t_naive, t_dl` when you are done") == 1, fix


def test_a_model_s_numbered_layers_are_no_trees_alike_but_two_variables_are():
    """A trial restored a model of six identical layers: holders said model['layer0'] ...
    model['layer5'] "hold trees alike" and to `del` a leftover copy, of a model's own blocks.
    Siblings that differ only in a number are repeated blocks; two variables stay named."""
    def layer(key):
        return {"w": jax.random.normal(key, (512, 512)), "b": jnp.zeros(512)}

    keys = jax.random.split(jax.random.key(0), 8)
    model = {f"layer{i}": layer(keys[i]) for i in range(4)}
    assert holders.largest(2, namespace={"model": model}).alike == ()
    blocks = type("Model", (), {})()
    blocks.block_1, blocks.block_2 = layer(keys[4]), layer(keys[5])
    assert holders.largest(2, namespace={"net": blocks}).alike == ()
    ns = {"params": layer(keys[6]), "restored": layer(keys[7])}  # a leftover: still named
    (found,) = holders.largest(2, namespace=ns).alike
    assert found[0] == ("params", "restored")
    apart = {"state": {"params": layer(keys[6]), "init_params": layer(keys[7])}}
    assert holders.largest(2, namespace=apart).alike  # siblings not numbered: named
    ckpts = {"ckpts": {f"step_{n}": layer(keys[i]) for i, n in enumerate((100, 200, 300))}}
    assert holders.largest(2, namespace=ckpts).alike  # steps, not blocks (a review): named
