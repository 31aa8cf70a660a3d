"""What a loop holds: a buffer a loop carries and only writes, a value per step (its record),
and a carry XLA copies whole on every step."""

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import mlir

from helpers import preflight
from helpers._internal import jaxprs

MiB = 2**20
D, MAX_STEPS = 1024, 4096


# --- equinox's maybe_set, in plain JAX ---------------------------------------------------------
# equinox (0.13.8) writes the buffers of its while_loop (diffrax's SaveAt(steps=True)) with its
# own primitive, maybe_set(pred, xs, x, i), lowered with mlir.lower_fun to a select and an
# .at[i].set: in the jaxpr it stays one equation named maybe_set, and the loop body returns its
# result through a copy. The same mechanism, without equinox:
def _maybe_set_impl(pred, xs, x, i):
    return [xs.at[i].set(jnp.where(pred, x, xs[i]))]


_maybe_set_p = core.Primitive("maybe_set")
_maybe_set_p.multiple_results = True
_maybe_set_p.def_impl(_maybe_set_impl)
_maybe_set_p.def_abstract_eval(lambda pred, xs, x, i: [xs])
mlir.register_lowering(_maybe_set_p, mlir.lower_fun(_maybe_set_impl, multiple_results=True))


def _maybe_set(pred, xs, x, i):
    [out] = _maybe_set_p.bind(pred, xs, x, i)
    return jnp.copy(out)  # equinox's body returns the buffer through a copy


def _solve(write, t1=3.0):
    """diffrax's loop in miniature: adaptive steps of dy/dt = -y until t1, each step's y saved
    into a buffer of MAX_STEPS rows (SaveAt(steps=True)); returns the rows and the steps taken."""
    def solve(y0):
        def cond(c):
            t, _, _, i, _ = c
            return (t < t1) & (i < MAX_STEPS)

        def body(c):
            t, y, dt, i, buf = c
            dt = jnp.minimum(dt, t1 - t)
            y = y - dt * y
            return t + dt, y, dt * 1.5, i + 1, write(buf, y, i)

        buf = jnp.full((MAX_STEPS, D), jnp.inf, y0.dtype)
        init = (jnp.float32(0), y0, jnp.float32(0.01), 0, buf)
        *_, n, buf = jax.lax.while_loop(cond, body, init)
        return buf, n
    return solve


def _solve_at(save_ts, t1=3.0):
    """SaveAt(ts=save_ts), the thread's fix: a buffer of len(ts) rows, a row written when a
    step passes the next save time."""
    def solve(y0):
        def cond(c):
            t, _, _, i, _, _ = c
            return (t < t1) & (i < MAX_STEPS)

        def body(c):
            t, y, dt, i, j, buf = c
            dt = jnp.minimum(dt, t1 - t)
            y, t = y - dt * y, t + dt
            hit = (j < len(save_ts)) & (t >= save_ts[jnp.minimum(j, len(save_ts) - 1)])
            buf = _maybe_set(hit, buf, y, jnp.minimum(j, len(save_ts) - 1))
            return t, y, dt * 1.5, i + 1, j + hit, buf

        init = (jnp.float32(0), y0, jnp.float32(0.01), 0, 0, jnp.zeros((len(save_ts), D)))
        return jax.lax.while_loop(cond, body, init)[-1]
    return solve


def test_diffrax_238_save_at_steps_written_by_equinox_maybe_set_is_named_with_save_at_ts():
    """patrick-kidger/diffrax#238: SaveAt(steps=True) returns max_steps (4096) rows, inf after
    the steps taken. The kit's loop note did not see equinox's maybe_set write at all (with
    real diffrax 0.7.2 it said nothing about the 16 MiB buffer)."""
    y0 = jnp.ones(D)
    steps = _solve(lambda buf, y, i: _maybe_set(True, buf, y, i))
    buf, n = jax.jit(steps)(y0)
    assert int(n) < 20 and buf.shape[0] == MAX_STEPS  # 13 steps taken, 4096 rows
    (loop, whole, step, dtype, nbytes, _, write, count), = [
        r for r in jaxprs.loop_records(jax.make_jaxpr(steps)(y0)) if r[4] >= MiB]
    assert (loop, whole, step, write, count) == ("while", (MAX_STEPS, D), (D,), "maybe_set",
                                                 None)
    p = preflight.preflight_step(steps, y0)
    assert p.loop_records[0][:3] == ("float32[4096, 1024]", "float32[1024]", 16 * MiB)
    note = p.advice
    assert "4096 rows sized by its bound, not by the steps it takes" in note
    assert "SaveAt(ts=...)" in note and "max_steps" in note
    assert "patrick-kidger/diffrax#238" in note
    assert "memory the loop must have" not in note  # 13 of 4096 rows are written
    # the fix, run: save at 6 times, a buffer of 6 rows
    at = _solve_at(jnp.linspace(0.5, 3.0, 6))
    assert bool(jnp.isfinite(jax.jit(at)(y0)).all())
    fixed = preflight.preflight_step(at, y0)
    assert "diffrax#238" not in fixed.advice
    assert p.peak_bytes >= 16 * MiB and fixed.peak_bytes < 128 * 1024  # 16 MiB -> KiB


def test_diffrax_238_a_while_loop_buffer_is_sized_by_its_bound_not_each_of_its_steps():
    """The plain-JAX loop (buf.at[i].set(y)) was named, but as "a value of each of its 4096
    steps ... memory the loop must have" when the loop took 13 steps: 4096 is its bound."""
    y0 = jnp.ones(D)
    steps = _solve(lambda buf, y, i: buf.at[i].set(y))
    assert int(jax.jit(steps)(y0)[1]) < 20
    note = preflight.preflight_step(steps, y0).advice
    assert "sized by its bound, not by the steps it takes" in note
    assert "memory the loop must have" not in note
    assert "write only the steps you need" in note and "lower the bound" in note
    assert "diffrax#238" in note


def test_gemma_534_a_scan_buffer_of_one_row_a_step_is_still_memory_the_loop_must_have():
    """A scan has a step count: a buffer of one row per step holds a value of each step (the
    gemma#534 note unchanged); a buffer of more rows than steps is named as such."""
    def record(rows, length):
        def f(x):
            def body(buf, i):
                return buf.at[i].set(jnp.tanh(x * i)), None
            return jax.lax.scan(body, jnp.zeros((rows, 4096)), jnp.arange(length))[0]
        return f

    x = jnp.ones(4096)
    full = preflight.preflight_step(record(256, 256), x).advice
    assert "a value of each of its 256 steps" in full and "memory the loop must have" in full
    assert "sized by its bound" not in full
    spare = preflight.preflight_step(record(1024, 64), x).advice
    assert "1024 rows, of which its 64 steps write at most 64" in spare
    assert "memory the loop must have" not in spare
