"""Test session setup: 4 simulated CPU devices (the kit's stand-in), set before JAX starts.

Cases that need other start-up settings (1 device, JAX_PLATFORMS=cuda, ...) run in child
processes, because JAX reads them once per process.
"""

import contextlib
import os
import subprocess
import sys

import jax
import pytest

from helpers._internal.child import child_env as _child_env

N_SIMULATED = 4
jax.config.update("jax_num_cpu_devices", N_SIMULATED)

# JupyterLab in Chromium: needs a system browser and Playwright, so `make test` leaves it out;
# `make test-browser` runs it (`pytest tests/browser`: a path named on the command line is
# collected even though it is listed here).
collect_ignore = ["browser"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def x64():
    """jax_enable_x64 on inside the block, and back to what it was after: the flag is the
    process's, and the tests that follow expect it as they found it."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def wait_until(condition, seconds: float = 30) -> bool:
    """Poll ``condition`` (a thread ending, a buffer freed: both asynchronous); True as soon as
    it holds. What a test asserts is the condition, not how long it took."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def run_python(code: str, env: dict | None = None, timeout: float = 120):
    """Run python code in a fresh process from the repo root; returns CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_child_env(env),
                          capture_output=True, text=True, timeout=timeout)


def run_cli(*args: str, env: dict | None = None, timeout: float = 120):
    """Run `python -m helpers ARGS` in a fresh process; returns CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "helpers", *args], cwd=REPO,
                          env=_child_env(env), capture_output=True, text=True, timeout=timeout)


def pytest_collection_modifyitems(config, items):
    # the tests that start JAX processes needing the card to themselves go first: a gpu test that
    # makes an array in the pytest process takes 75% of the card for the rest of the session (the
    # H100, 2026-11-27: test_compiles' gpu test did, and the two holder tests of test_oom after it
    # found a 63.8 GB pool); a stable sort keeps every other test in its order
    items.sort(key=lambda item: "beside_processes" not in item.keywords)
    has_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
    skip = pytest.mark.skip(reason="needs a GPU (JAX's default backend is not gpu)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)


def benchmark_module(name: str):
    """A module from benchmarks/ (not a package), imported by its path."""
    import importlib.util

    path = os.path.join(REPO, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chunked_causal_attention(q, k, v, block: int):
    """Memory-efficient causal attention, the fix two threads' tests run (google/flax#2858): a
    lax.map over blocks of ``block`` queries, each block checkpointed and attending to all the
    keys; q, k, v of shape [batch, sequence, heads, head_dim]."""
    import jax.numpy as jnp

    b, s, h, dh = q.shape
    qs = q.reshape(b, s // block, block, h, dh).swapaxes(0, 1)
    rows = jnp.arange(s).reshape(s // block, block)

    @jax.checkpoint
    def one(xs):
        qb, r = xs
        scores = jnp.einsum("bqhd,bkhd->bhqk", qb, k) / jnp.sqrt(dh)
        scores = jnp.where(r[None, None, :, None] >= jnp.arange(s)[None, None, None, :], scores,
                           -1e30)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)

    return jax.lax.map(one, (qs, rows)).swapaxes(0, 1).reshape(b, s, h, dh)
