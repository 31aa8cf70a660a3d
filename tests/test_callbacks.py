"""Host callbacks in a step's loops, read from its jaxpr: a callback that jax.grad moves out
of a scan (runs once, not once per step: jax-ml/jax#16637), and one that runs on every
iteration of a long loop (liesel-devs/liesel#282)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import io_callback

from helpers import preflight

calls = []


def count(*args):
    calls.append(len(args))


def body(x, _):  # the thread's body: the callback reads nothing the loop changes
    jax.debug.callback(count)
    return jnp.sin(x), None


def run(x):
    return lax.scan(body, x, xs=None, length=5)[0]


def body_reads_carry(x, _):  # the fix the thread gives: a data dependence on the carry
    jax.debug.callback(count, x)
    return jnp.sin(x), None


def run_fixed(x):
    return lax.scan(body_reads_carry, x, xs=None, length=5)[0]


def body_io(x, _):  # io_callback(ordered=True): moved out as well, so no fix
    io_callback(count, None, ordered=True)
    return jnp.sin(x), None


def run_io(x):
    return lax.scan(body_io, x, xs=None, length=5)[0]


def _calls(fn) -> int:
    calls.clear()
    jax.jit(fn)(jnp.float32(1.0)).block_until_ready()
    jax.effects_barrier()
    return len(calls)


def test_jax_16637_a_callback_moved_out_of_a_scan_under_grad_is_named_with_the_fix():
    """jax#16637: the callback runs 5 times in the forward pass, once under jax.grad (scan's
    partial evaluation moves it out of the loop); made to read the carry it runs 5 times."""
    assert _calls(run) == 5 and _calls(jax.grad(run)) == 1
    assert _calls(jax.grad(run_fixed)) == 5  # the fix the kit names
    assert _calls(jax.grad(run_io)) == 1  # io_callback(ordered=True) is no fix
    advice = preflight.preflight_step(jax.grad(run), jnp.float32(1.0)).advice
    assert "The jax.debug.callback at" in advice and "jax.debug.callback(count)" in advice
    assert "runs once, not once per step" in advice and "jax-ml/jax#16637" in advice
    assert "the carry, as jax.debug.callback(fn, x)" in advice
    assert "io_callback(ordered=True) is moved too" in advice
    io = preflight.preflight_step(jax.grad(run_io), jnp.float32(1.0)).advice
    assert "The io_callback at" in io and "runs once, not once per step" in io
    for fine in (run, jax.grad(run_fixed)):  # in the loop, where it was written: nothing said
        assert "16637" not in preflight.preflight_step(fine, jnp.float32(1.0)).advice


def test_liesel_282_a_callback_on_every_iteration_of_a_long_loop_is_named_with_a_gate():
    """liesel#282: a progress bar updated through jax.debug.callback on every iteration of a
    while_loop; gated by lax.cond to every 10th step it runs 5 times in 50, not 50."""

    def every(c):
        i, x = c
        jax.debug.callback(count, i)
        return i + 1, x - 0.01 * jnp.sin(x)

    def gated(c):
        i, x = c
        lax.cond(i % 10 == 0, lambda: jax.debug.callback(count, i), lambda: None)
        return i + 1, x - 0.01 * jnp.sin(x)

    def loop(body):
        return lambda x: lax.while_loop(lambda c: c[0] < 50, body, (0, x))[1]

    x = jnp.ones(8)
    counts = {}
    for name, b in (("every", every), ("gated", gated)):
        calls.clear()
        jax.jit(loop(b))(x).block_until_ready()
        jax.effects_barrier()
        counts[name] = len(calls)
    assert counts == {"every": 50, "gated": 5}
    advice = preflight.preflight_step(loop(every), x).advice
    assert "jax.debug.callback(count, i)" in advice and "lax.while_loop" in advice
    assert "no cond around it" in advice and "on every iteration" in advice
    assert "jax.lax.cond(i % k == 0, lambda: jax.debug.callback(fn, i)" in advice
    assert "liesel-devs/liesel#282" in advice
    assert "liesel" not in preflight.preflight_step(loop(gated), x).advice
    short = preflight.preflight_step(run, jnp.float32(1.0)).advice  # 5 steps: not worth a word
    assert "liesel" not in short


def test_a_debug_print_in_a_solvers_few_while_iterations_gets_no_progress_note():
    """A Newton solver's jax.debug.print of its error: a while_loop of a few iterations, for
    debugging, not a progress report (the review found liesel#282's note and its 20,000-step
    figures given to it)."""
    def newton(x):
        def body(c):
            y, err = c
            jax.debug.print("err {}", err)
            y = y - (y * y - x) / (2 * y)
            return y, jnp.abs(y * y - x)
        return jax.lax.while_loop(lambda c: c[1] > 1e-6, body, (x, jnp.abs(x * x - x)))[0]

    advice = preflight.preflight_step(newton, jnp.float32(2.0)).advice
    assert "liesel" not in advice and "every k steps" not in advice
