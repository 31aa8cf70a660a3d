"""How close preflight_step's prediction is to the measured peak, on training steps written the
way users write them (Flax NNX models and optax optimizers, in Flax's functional style:
``nnx.split`` the model, ``nnx.merge`` it inside a pure step), beside XLA's own
``peak_memory_in_bytes`` and a naive "parameters x 16 bytes" (weights, gradients, Adam's two
moments).

Goal (issue "Performance users feel", item 1): median error <= 5%, worst <= 10%, never more
than 5% low. Each step is measured in a fresh child process (its own peak; glibc told to give
every large buffer its own mapping, so the process's resident memory follows the buffers): the
first call, and a later one. On the CPU stand-in the peak is the process's RSS high-water mark.

Needs the ``bench`` extra (flax, optax): ``pip install -e ".[bench]"`` (``make bench`` does).

    python benchmarks/prediction_accuracy.py            # every step, each in a child
    python benchmarks/prediction_accuracy.py --one NAME # one step, here (what the child runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GOAL_MEDIAN, GOAL_WORST, GOAL_LOW = 0.05, 0.10, 0.05


def _cnn(batch: int):
    import jax
    import numpy as np
    import optax
    from flax import nnx

    class CNN(nnx.Module):  # the model of Flax's MNIST tutorial
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
            self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
            self.linear2 = nnx.Linear(256, 10, rngs=rngs)

        def __call__(self, x):
            x = nnx.avg_pool(nnx.relu(self.conv1(x)), window_shape=(2, 2), strides=(2, 2))
            x = nnx.avg_pool(nnx.relu(self.conv2(x)), window_shape=(2, 2), strides=(2, 2))
            x = x.reshape(x.shape[0], -1)
            return self.linear2(nnx.relu(self.linear1(x)))

    images = np.zeros((batch, 28, 28, 1), np.float32)
    labels = np.zeros((batch,), np.int32)
    return _with_adam(CNN(rngs=nnx.Rngs(0)), images, labels, jax, optax, nnx)


def _gpt(batch: int, layers: int = 4, d: int = 256, seq: int = 128, vocab: int = 8192):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(d, rngs=rngs), nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=4, in_features=d, decode=False,
                                               rngs=rngs)
            self.up, self.down = nnx.Linear(d, 4 * d, rngs=rngs), nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x):
            mask = nnx.make_causal_mask(jnp.ones(x.shape[:2]))
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class GPT(nnx.Module):  # a small GPT-style language model
        def __init__(self, rngs):
            self.embed = nnx.Embed(vocab, d, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.out = nnx.Linear(d, vocab, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.out(x)

    tokens = np.zeros((batch, seq), np.int32)
    return _with_adam(GPT(rngs=nnx.Rngs(0)), tokens, tokens, jax, optax, nnx)


def _with_adam(model, inputs, labels, jax, optax, nnx):
    graphdef, params = nnx.split(model)
    tx = optax.adamw(1e-3)
    opt_state = tx.init(params)

    def train_step(params, opt_state, inputs, labels):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(inputs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    n_params = sum(x.size for x in jax.tree.leaves(params))
    return train_step, (params, opt_state, inputs, labels), n_params


CORPUS = {
    "cnn_b32": (lambda: _cnn(32), ()),
    "cnn_b256": (lambda: _cnn(256), ()),
    "gpt4_b8": (lambda: _gpt(8), ()),
    "gpt4_b32": (lambda: _gpt(32), ()),
    "gpt4_b32_donated": (lambda: _gpt(32), (0, 1)),
}


def one(name: str) -> dict:
    """Predict and measure one corpus step in this process (run it in a fresh one)."""
    import jax

    from helpers import measure, preflight

    make, donate = CORPUS[name]
    step, args, n_params = make()
    dev = jax.devices()[0]
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    predicted = preflight.preflight_step(step, *shapes, device=dev, donate_argnums=donate)
    placed = jax.block_until_ready(jax.device_put(args, dev))
    measured = measure.measure_step(step, *placed, device=dev, donate_argnums=donate)
    return {"name": name, "predicted": predicted.peak_bytes, "xla_peak": predicted.xla_peak_bytes,
            "naive_16_per_param": 16 * n_params, "measured": measured.peak_bytes,
            "source": measured.source, "note": measured.note, "params": n_params}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", choices=sorted(CORPUS))
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return {}
    from _common import median, write

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    rows = []
    for name in CORPUS:
        out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                             text=True, env=env, timeout=600)
        if out.returncode != 0:
            rows.append({"name": name, "error": out.stderr.strip().splitlines()[-1:]})
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["error_ratio"] = row["predicted"] / row["measured"] - 1  # < 0: predicted low
        rows.append(row)
    ok = [r for r in rows if "error_ratio" in r]
    errors = [abs(r["error_ratio"]) for r in ok]
    low = [-r["error_ratio"] for r in ok if r["error_ratio"] < 0]
    payload = {
        "corpus": list(CORPUS), "rows": rows,
        "median_abs_error": median(errors) if errors else None,
        "worst_abs_error": max(errors) if errors else None,
        "worst_low": max(low) if low else 0.0,
        "goal": {"median_at_most": GOAL_MEDIAN, "worst_at_most": GOAL_WORST,
                 "low_at_most": GOAL_LOW,
                 "met": bool(ok) and len(ok) == len(rows) and median(errors) <= GOAL_MEDIAN
                 and max(errors) <= GOAL_WORST and (max(low) if low else 0) <= GOAL_LOW},
    }
    path = write("prediction_accuracy", payload)
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<18} FAILED: {r['error']}")
            continue
        mib = {k: r[k] / 2**20 for k in ("predicted", "measured", "xla_peak",
                                          "naive_16_per_param")}
        print(f"{r['name']:<18} predicted {mib['predicted']:8.1f} MiB, measured "
              f"{mib['measured']:8.1f} MiB ({r['error_ratio']:+.1%}); XLA's peak "
              f"{mib['xla_peak']:8.1f} MiB; params x 16 {mib['naive_16_per_param']:8.1f} MiB")
    print(f"goal (median <= 5%, worst <= 10%, never > 5% low): "
          f"{'met' if payload['goal']['met'] else 'NOT met'}  -> {path}")
    return payload


if __name__ == "__main__":
    main()
