"""Three small steps whose peak memory the kit predicts and then measures (notebook 09, the
truth test in tests/test_preflight.py, and ``make gpu-check``).

Each lives here, not in a notebook, so that a fresh child process can import it by name and
measure it alone (:func:`helpers.measure.measure_example`). Each ``*_args(scale)``
returns NumPy arguments (the caller puts them where it wants); ``scale`` grows every array, and
``mlp_sgd_step_args`` also takes a ``batch`` size (notebook 09 sizes a batch with it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["EXAMPLES", "matmul_chain", "mlp_sgd_step", "scan_rnn"]


def matmul_chain(x: jax.Array, w: jax.Array) -> jax.Array:
    """Four matmuls in a row: each result feeds the next, so XLA needs two activations."""
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return x


def matmul_chain_args(scale: int = 1):
    n = 1024 * scale
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, n), np.float32),
            rng.standard_normal((n, n), np.float32) / np.float32(np.sqrt(n)))


def mlp_sgd_step(params: dict, x: jax.Array, y: jax.Array) -> tuple[dict, jax.Array]:
    """One training step of a two-layer MLP: loss, gradients, and a plain SGD update."""
    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def mlp_sgd_step_args(scale: int = 1, batch: int | None = None):
    d, hidden, out = 1024 * scale, 2048 * scale, 256
    batch = 2048 * scale if batch is None else batch
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((d, hidden), np.float32) / np.float32(np.sqrt(d)),
              "b1": np.zeros(hidden, np.float32),
              "w2": rng.standard_normal((hidden, out), np.float32) / np.float32(np.sqrt(hidden))}
    return (params, rng.standard_normal((batch, d), np.float32),
            rng.standard_normal((batch, out), np.float32))


def scan_rnn(h: jax.Array, xs: jax.Array) -> jax.Array:
    """A recurrent scan that keeps every step's state: the stacked outputs dominate."""
    def body(h, x):
        h = jnp.tanh(h + x)
        return h, h
    return jax.lax.scan(body, h, xs)


def scan_rnn_args(scale: int = 1):
    rng = np.random.default_rng(0)
    return (np.zeros((1024 * scale, 512), np.float32),
            rng.standard_normal((64, 1024 * scale, 512), np.float32))


EXAMPLES = {
    "matmul_chain": (matmul_chain, matmul_chain_args),
    "mlp_sgd_step": (mlp_sgd_step, mlp_sgd_step_args),
    "scan_rnn": (scan_rnn, scan_rnn_args),
}
