"""Every JAX internal the kit uses, checked against the installed JAX: when one moves, the
failure names the JAX version and what the kit used it for (helpers/jaxcompat.py)."""

import contextlib
import json

import jax
import numpy as np
import pytest

from helpers import transfers
from helpers._internal import jaxcompat as internals
from tests.conftest import run_python


@pytest.mark.parametrize("name", sorted(internals.INTERNALS))
def test_internal_still_exists(name):
    internal = internals.INTERNALS[name]
    if not internal.expected(internals.jax_version_tuple()):
        # known to be absent in this (supported) version: the kit must degrade
        with pytest.raises(internals.InternalMoved, match=f"jax {jax.__version__}"):
            internals.verify(name)
        return
    assert internals.verify(name) is not None  # raises InternalMoved naming the JAX version


def test_the_hook_degrades_where_jax_has_none():
    from helpers._internal import jaxcompat

    state, _ = jaxcompat.backend_start_snapshot()
    has_hook = internals.INTERNALS["register_backend_initialization_hook"].expected(
        internals.jax_version_tuple())
    assert state == ("installed" if has_hook else "unavailable")


def test_a_moved_internal_names_the_jax_version(monkeypatch):
    monkeypatch.setitem(internals.INTERNALS, "gone", internals.Internal(
        "jax._src.xla_bridge:_no_such_thing", "test the message", "none"))
    with pytest.raises(internals.InternalMoved) as info:
        internals.verify("gone")
    text = str(info.value)
    assert f"jax {jax.__version__}" in text and "_no_such_thing" in text
    assert "test the message" in text


def test_every_internal_says_why_and_what_is_public():
    for name, internal in internals.INTERNALS.items():
        assert ":" in internal.where and internal.why and internal.public, name


def test_backends_started_never_starts_or_imports_jax():
    out = run_python(
        "import sys; from helpers._internal import jaxcompat as i; "
        "a = i.backends_started(); b = 'jax' in sys.modules; "
        "import jax; c = i.backends_started(); jax.devices(); d = i.backends_started(); "
        "print(a, b, c, d)", env={"JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False", "True"]


def test_a_failed_jax_import_is_not_masked_by_the_kit():
    """JAX_NUM_CPU_DEVICES=abc makes `import jax` raise; after the kit tried (and failed) to
    import JAX, the user's own `import jax` must raise JAX's real error again."""
    out = run_python("import helpers.devices\nimport jax", env={"JAX_NUM_CPU_DEVICES": "abc"})
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert 'Invalid value "abc" for JAX flag jax_num_cpu_devices' in last, last


_GUARD_PROBE = """
import json, os, sys, tempfile
import jax, numpy as np
jax.config.update("jax_num_cpu_devices", 2)
sys.stderr.flush()
saved = os.dup(2)
with tempfile.TemporaryFile("w+b") as f:
    os.dup2(f.fileno(), 2)
    with jax.transfer_guard("log_explicit"):
        a = jax.device_put(np.ones((2, 3), np.float32))
        b = jax.jit(lambda x: x + 1)(np.ones(5, np.int32))
        c = jax.device_put(a, jax.devices()[1])
        jax.block_until_ready((a, b, c))
    os.dup2(saved, 2)
    f.seek(0)
    print(json.dumps(f.read().decode().splitlines()))
"""


def test_the_transfer_guard_log_still_parses():
    out = run_python(_GUARD_PROBE)
    assert out.returncode == 0, out.stderr
    lines = json.loads(out.stdout.strip().splitlines()[-1])
    parsed = [f for f in map(internals.parse_guard_line, lines) if f]
    where = f"jax {jax.__version__}; raw lines: {lines}"
    directions = [f["direction"] for f in parsed]
    assert directions.count("host->device") >= 2, where
    assert "device->device" in directions, where
    shaped = [f for f in parsed if f["shape"] == (2, 3)]
    assert shaped and shaped[0]["dtype"] == "float32", where
    d2d = next(f for f in parsed if f["direction"] == "device->device")
    assert d2d["destination"] == "cpu:1", where


def test_trace_reports_unknown_explicitness_when_the_markers_do_not_show(monkeypatch):
    @contextlib.contextmanager
    def silent(write, begin, end, of_arrays="", guard=None):  # installed, never called by JAX
        yield True

    monkeypatch.setattr(internals, "explicit_scopes_marked", silent)
    monkeypatch.setattr(transfers, "_markers_verified", False)  # probe again, as a new process
    with transfers.trace() as log:
        jax.device_put(np.ones(4, np.float32), jax.devices()[1]).block_until_ready()
    assert not log.explicit_marked
    assert log.count() >= 1 and {t.explicit for t in log} == {None}  # unknown, not implicit


def test_trace_marks_explicit_transfers_when_the_markers_work():
    with transfers.trace() as log:
        jax.device_put(np.ones(4, np.float32), jax.devices()[1]).block_until_ready()
    assert log.explicit_marked
    assert log.count(explicit=True) == 1 and log.count(explicit=False) == 0


def test_the_alias_table_of_a_compiled_program_still_parses():
    """XLA's HLO text is not an API: this fails, naming the JAX version, when it changes."""
    import jax.numpy as jnp

    f = jax.jit(lambda a, b: (a * 2, b + 1), donate_argnums=(0, 1))
    text = f.lower(jnp.ones(4), jnp.ones(3)).compile().as_text()
    assert internals.aliased_parameters(text) == {0, 1}, (jax.__version__, text[:300])
    plain = jax.jit(lambda a: a * 2).lower(jnp.ones(4)).compile().as_text()
    assert internals.aliased_parameters(plain) == set()
    assert internals.aliased_parameters("not HLO") is None


def test_the_program_text_still_names_values_and_their_lines():
    """XLA's HLO text (the ENTRY computation, op_name, stack frames) is not an API: this fails,
    naming the JAX version, when it changes."""
    import jax.numpy as jnp

    from helpers._internal import frames

    def f(x, w):
        return jnp.tanh(x @ w).sum(axis=0) * jnp.sin(x @ w).sum(axis=0)

    text = jax.jit(f).lower(jnp.ones((512, 256)), jnp.ones((256, 256))).compile().as_text()
    values = internals.entry_values(text, frames.is_user_file)
    assert values and values[0]["nbytes"] >= 512 * 256 * 4, (jax.__version__, text[:400])
    assert any(v["source"] and v["source"][0].endswith("test_jaxcompat.py") for v in values), (
        jax.__version__, values)
    assert internals.entry_values("not HLO", frames.is_user_file) == []


def test_constants_kept_by_the_optimized_program_are_read_from_its_text():
    table = jax.random.normal(jax.random.key(0), (1000,))  # an arange would become an iota
    text = jax.jit(lambda x: x + table).lower(table).compile().as_text()
    assert internals.constant_bytes(text) == table.nbytes, text[:400]
    folded = jax.jit(lambda x: x + table.sum()).lower(table).compile().as_text()
    assert internals.constant_bytes(folded) == 0  # a scalar is left out
    assert internals.constant_bytes("not HLO") is None


def test_weight_gradient_convolutions_are_found_in_the_program_text():
    """XLA's HLO text is not an API: this fails when a weight-gradient convolution no longer
    reads as one (window over the input's whole spatial extent)."""
    import jax
    import jax.numpy as jnp

    from helpers._internal import jaxcompat

    x, w = jnp.zeros((8, 14, 14, 4)), jnp.ones((3, 3, 4, 8))

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    grad = jax.jit(lambda x, w: jax.grad(lambda w: conv(x, w).sum())(w))
    text = grad.lower(x, w).compile().as_text()
    assert jaxcompat.weight_gradient_convolutions(text) == [x.nbytes + 8 * 14 * 14 * 8 * 4]
    assert jaxcompat.weight_gradient_convolutions("not HLO") == []


def test_a_gpu_programs_cublas_workspace_and_multi_output_fusions_are_values():
    """A GPU's optimized program keeps a cuBLAS call's workspace as the call's last result, and
    a fusion may have several results: each is a buffer. The text below is in the form XLA's own
    GPU tests write (xla/service/gpu/transforms/gemm_rewriter.cc adds the workspace; 32 MiB on
    Hopper, xla/service/gpu/matmul_utils.h); the kit has not yet read it from a GPU compile."""
    from helpers._internal import frames

    text = """HloModule jit_step, entry_computation_layout={(f32[129,256]{1,0})->f32[256,2048]{1,0}}

ENTRY %main.1 (x.1: f32[129,256], w.1: f32[256,2048]) -> f32[256,2048] {
  %x.1 = f32[129,256]{1,0} parameter(0)
  %w.1 = f32[256,2048]{1,0} parameter(1)
  %custom-call.1 = (f32[129,2048]{1,0}, s8[33554432]{0}) custom-call(f32[129,256]{1,0} %x.1, f32[256,2048]{1,0} %w.1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/dot_general"}
  %get-tuple-element.1 = f32[129,2048]{1,0} get-tuple-element((f32[129,2048]{1,0}, s8[33554432]{0}) %custom-call.1), index=0
  %fusion.2 = (f32[129,2048]{1,0}, f32[2048]{0}) fusion(f32[129,2048]{1,0} %get-tuple-element.1), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(step)/tanh"}
  %fusion.4 = (f32[8,128]{1,0:T(8,128)S(1)}, f32[128]{0:T(128)}) fusion(f32[129,256]{1,0} %x.1), kind=kLoop, calls=%fused_computation.4
  %while.5 = (s32[], f32[129,256]{1,0}) while((s32[], f32[129,256]{1,0}) %tuple.3), condition=%cond.1, body=%body.1
  ROOT %fusion.3 = f32[256,2048]{1,0} fusion(f32[129,256]{1,0} %x.1, (f32[129,2048]{1,0}, f32[2048]{0}) %fusion.2), kind=kLoop, calls=%fused_computation.3
}
"""  # noqa: E501 (XLA writes one instruction a line)
    values = internals.entry_values(text, frames.is_user_file)
    by = {v["name"]: v for v in values}
    assert values[0]["name"] == "custom-call.1[1]" and values[0]["nbytes"] == 32 * 2**20
    assert values[0]["op"] == "jit(step)/dot_general (cuBLAS workspace)"
    assert by["custom-call.1[0]"]["shape"] == (129, 2048) and "workspace" not in \
        by["custom-call.1[0]"]["op"]
    assert by["fusion.2[0]"]["nbytes"] == 129 * 2048 * 4 and by["fusion.2[1]"]["shape"] == (2048,)
    assert "fusion.3" not in by and "get-tuple-element.1" not in by  # the result; a view
    assert by["fusion.4[0]"]["shape"] == (8, 128)  # a layout with parentheses of its own (TPU)
    assert not [n for n in by if n.startswith("while")]  # a loop's state holds its inputs


def test_an_all_gather_the_partitioner_inserted_is_named_by_what_needed_it():
    """From jax 0.11.2's XLA an all-gather its SPMD partitioner inserts is marked
    is_spmd_generated and carries its operand's metadata (none for an argument), where 0.10.2's
    carried that of the instruction that needed the value whole. The text below is 0.11.2's
    CPU program for apple/axlearn#993 (trimmed): the gather, hoisted out of the loop, is named
    by the body's dynamic_slice that reads it; a gather for a print by the print's tuple."""
    from helpers._internal import frames

    text = """HloModule jit_sliced, is_scheduled=true, num_partitions=4

%body.1 (wide.param.5: (s32[], f32[1024,512])) -> (s32[], f32[1024,512]) {
  %wide.param.5 = (s32[], f32[1024,512]{1,0}) parameter(0)
  %get-tuple-element.102 = f32[1024,512]{1,0} get-tuple-element(%wide.param.5), index=1
  %get-tuple-element.92 = s32[] get-tuple-element(%wide.param.5), index=0
  %add_dynamic-slice_fusion = f32[64,512]{1,0} fusion(%get-tuple-element.102, %get-tuple-element.92), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(sliced)/while/body/eval_jaxpr/dynamic_slice" stack_frame_id=12}
  ROOT %tuple.16 = (s32[], f32[1024,512]{1,0}) tuple(%get-tuple-element.92, %get-tuple-element.102)
}

ENTRY %main.3_spmd (param.2: f32[256,512], param.3: f32[256,512]) -> f32[512,64] {
  %param.2 = f32[256,512]{1,0} parameter(1), sharding={mesh['data'=4], [{'data'}, {}]}, metadata={op_name="x"}
  %param.3 = f32[256,512]{1,0} parameter(0), sharding={mesh['data'=4], [{'data'}, {}]}, metadata={op_name="y"}
  %copy.8 = s32[] copy(%constant.8.clone)
  %all-gather.1 = f32[1024,512]{1,0} all-gather(%param.2), channel_id=1, replica_groups=mesh['data'=4] {'data'}, dimensions={0}, use_global_device_ids=true, frontend_attributes={is_spmd_generated="true"}
  %all-gather.10 = f32[1024,512]{1,0} all-gather(%param.3), channel_id=2, replica_groups=mesh['data'=4] {'data'}, dimensions={0}, use_global_device_ids=true, frontend_attributes={is_spmd_generated="true"}, metadata={op_name="jit(sliced)/mul" stack_frame_id=5}
  %tuple.2 = (f32[1024,512]{1,0}) tuple(%all-gather.10), metadata={op_name="jit(sliced)/debug_print" stack_frame_id=6}
  %tuple.14 = (s32[], f32[1024,512]{1,0}) tuple(%copy.8, %all-gather.1)
  %while.11 = (s32[], f32[1024,512]{1,0}) while(%tuple.14), condition=%cond.1, body=%body.1, metadata={op_name="jit(sliced)/while" stack_frame_id=8}
  ROOT %get-tuple-element.26 = f32[1024,512]{1,0} get-tuple-element(%while.11), index=1
}
"""  # noqa: E501 (XLA writes one instruction a line)
    by = {v["name"]: v["op"] for v in internals.entry_values(text, frames.is_user_file)}
    assert by["all-gather.1"] == "jit(sliced)/while/body/eval_jaxpr/dynamic_slice"
    assert by["all-gather.10"] == "jit(sliced)/debug_print"
    # without XLA's mark (0.10.2's text) a gather keeps its own metadata
    plain = internals.entry_values(text.replace(', frontend_attributes={is_spmd_generated="true"}',
                                                ""), frames.is_user_file)
    assert {v["name"]: v["op"] for v in plain}["all-gather.10"] == "jit(sliced)/mul"


def test_a_step_without_its_prints_is_a_jaxpr_on_every_jax():
    """jax 0.11 made ClosedJaxpr and Jaxpr one class (``.jaxpr`` returns the jaxpr itself):
    the kit's copy of a step without its prints recursed without end there (jax-ml/jax#26370's
    test found it on jax 0.11.2)."""
    import jax.numpy as jnp
    from jax.extend import core

    from helpers._internal import (
        jaxpr_callbacks,
    )

    def f(x):
        jax.debug.print("x = {}", x)
        return jnp.sin(x) * 2

    stripped = jaxpr_callbacks.without_prints(jax.make_jaxpr(f)(jnp.ones(3)))
    assert [e.primitive.name for e in stripped.jaxpr.eqns] == ["sin", "mul"]
    assert core.jaxpr_as_fun(stripped)(jnp.ones(3))[0].shape == (3,)
    assert internals.wraps_jaxpr(jax.make_jaxpr(f)(jnp.ones(3))) == (
        core.ClosedJaxpr is not core.Jaxpr)


def test_pmap_s_own_mesh_is_told_from_a_user_s():
    """jax.pmap's outputs are split over a mesh of JAX's own, whose axis name changed between
    versions: the kit must still tell it from a mesh the user made."""
    from jax.sharding import Mesh

    out = jax.pmap(lambda x: x * 2)(np.ones((jax.local_device_count(), 4), np.float32))
    assert internals.is_pmap_mesh(out.sharding.mesh)
    assert not internals.is_pmap_mesh(Mesh(np.array(jax.devices()), ("x",)))


def test_scan_counts_reads_both_forms_of_a_scan_equation():
    """Up to jax 0.10 a scan equation says num_consts and num_carry; from 0.11 it holds ft_in,
    a FlatTree of (constants, carry, xs) whose parts JAX counts with len() (the H100 run of
    2026-11-27, jax 0.11.2, failed with KeyError: 'num_consts' before this)."""
    import jax.numpy as jnp
    from jax import lax

    from helpers._internal import jaxcompat

    w = jnp.ones(3)

    def f(c0, xs):
        return lax.scan(lambda c, x: ((c[0] * w + x, c[1] + 1.0), c[0]), c0, xs)

    eqn = next(e for e in jax.make_jaxpr(f)((jnp.ones(3), jnp.ones(2)), jnp.ones((5, 3))).eqns
               if e.primitive.name == "scan")
    assert jaxcompat.scan_counts(eqn.params) == (1, 2)  # w closed over; a carry of two arrays

    class Part:  # jax 0.11's FlatTree part: a length
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    class FlatTree:
        def unpack(self):
            return Part(3), Part(2), Part(4)

    assert jaxcompat.scan_counts({"ft_in": FlatTree(), "length": 5}) == (3, 2)


def test_a_new_static_value_is_explained_on_every_jax(caplog):
    """jax 0.11 and later explain a static argument's new value as only "cache miss
    explanation unavailable" (its cache keys keep static values in FlatTree leaves whose
    structure is a plain leaf); the kit's wrapper adds the values, in jax 0.10.2's words, so
    compiles.watch says "new static values" on every JAX (it said "other" on 0.11.2)."""
    import logging
    from functools import partial

    import jax.numpy as jnp

    from helpers._internal import jaxcompat

    @partial(jax.jit, static_argnums=1, static_argnames="m")
    def f(x, n, m=1):
        return x * n * m

    x = jnp.ones(3)
    with caplog.at_level(logging.WARNING), jax.explain_cache_misses(True), \
            jaxcompat.static_values_explained() as wrapped:
        f(x, 1, m=1)
        f(x, 2, m=1)
        f(x, 2, m=3)
    assert wrapped == (jaxcompat.jax_version_tuple() >= (0, 11, 0))
    misses = [jaxcompat.parse_cache_miss(r.getMessage()) for r in caplog.records]
    found = [(m["cause"], m["changed"]) for m in misses if m and m["cause"] != "first compile"]
    assert found[0] == ("new static values", "now 2, before 1")
    assert found[1][0] == "new static values" and found[1][1] in (
        "now 3, before 1", "now {m: 3}, before {m: 1}")  # (jax 0.8.0 words keywords so)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert (jaxcompat.STATIC_VALUES_EXPLAINED in text) == wrapped


def test_a_value_named_by_a_quoted_path_is_read_without_hlo_s_escapes():
    """XLA escapes quotes in op_name ("s.params[\\'w1\\']"): a new user's trial saw the escapes
    in preflight_step's "a large output" row. The name is read as the path was written."""
    from helpers._internal import frames

    text = r"""HloModule jit_step

ENTRY %main.1 (param.1: f32[8,256,512]) -> f32[256,4096] {
  %param.1 = f32[8,256,512]{2,1,0} parameter(0), metadata={op_name="s"}
  %copy.1 = f32[256,4096]{1,0} copy(%param.1), metadata={op_name="s.params[\'w1\']"}
  %copy.2 = f32[256,4096]{1,0} copy(%param.1), metadata={op_name="jit(f)/say \"hi\""}
  ROOT %tuple.1 = (f32[256,4096]{1,0}, f32[256,4096]{1,0}) tuple(%copy.1, %copy.2)
}
"""
    by = {v["name"]: v["op"] for v in internals.entry_values(text, frames.is_user_file)}
    assert by["copy.1"] == "s.params['w1']" and by["copy.2"] == 'jit(f)/say "hi"', by


def test_a_value_named_in_utf_8_is_read_back_from_hlo_s_octal_escapes():
    """A review: HLO writes a non-ASCII name's UTF-8 bytes as octal escapes (a named_scope
    'énergie' as \\303\\251nergie); the first unescaping read it as '303251nergie'."""
    from helpers._internal import frames

    text = r"""HloModule jit_step

ENTRY %main.1 (param.1: f32[64]) -> (f32[64], f32[64]) {
  %param.1 = f32[64]{0} parameter(0), metadata={op_name="x"}
  %mul.1 = f32[64]{0} multiply(%param.1, %param.1), metadata={op_name="jit(step)/\303\251nergie/mul"}
  %copy.1 = f32[64]{0} copy(%param.1), metadata={op_name="s.params[\'\317\203\']"}
  ROOT %tuple.1 = (f32[64]{0}, f32[64]{0}) tuple(%mul.1, %copy.1)
}
"""  # noqa: E501 (XLA writes one instruction a line)
    by = {v["name"]: v["op"] for v in internals.entry_values(text, frames.is_user_file)}
    assert by["mul.1"] == "jit(step)/énergie/mul" and by["copy.1"] == "s.params['σ']", by
