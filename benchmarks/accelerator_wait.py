"""An accelerator that never waits: a training loop fed by ``datasets.batches(prefetch=2)``
against the same loop on a batch already on the device, side by side with a nanoGPT-style
``get_batch`` (random starts, a Python list of slices, ``np.stack``, ``device_put``).

Goal (issue "Performance users feel", item 3): steps per second fed by the kit >= 0.98 of the
loop on a resident batch, for a step of >= 20 ms, on the CPU stand-in (and on a GPU when one is at
hand). Interleaved rounds, medians; each round runs the three loops for the same number of steps
on the same jitted step. Grain's random-access loader (the ``grain`` package) is measured too
where it is installed; here it is not, and the JSON says so.

    python benchmarks/accelerator_wait.py [--rounds 7] [--steps 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)  # the stand-in, used only without a GPU

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import median, write  # noqa: E402

from helpers import datasets, devices  # noqa: E402

GOAL, BATCH, SEQ = 0.98, 64, 1024


def _make_step(width: int, depth: int):
    @jax.jit
    def step(w, batch):  # stands for a training step: compute that reads the batch
        h = jnp.tanh(batch[:, :width].astype(jnp.float32) / 50257.0 @ w)
        for _ in range(depth):
            h = jnp.tanh(h @ w)
        return w + 1e-6 * h.mean()
    return step


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--depth", type=int, default=36, help="matmuls per step (sets its length)")
    args = p.parse_args(argv)
    acc = devices.roles().accelerator
    with tempfile.TemporaryDirectory(prefix="jdk-wait-") as folder:
        path = Path(folder) / "tokens.safetensors"
        datasets.write_tokens(path, size="256 MiB", progress=False)
        tokens = datasets.open_tokens(path)
        width = 1024
        step = _make_step(width, args.depth)
        w0 = jax.device_put(jnp.eye(width, dtype=jnp.float32), acc)
        resident = jax.device_put(np.asarray(tokens[:BATCH * SEQ]).reshape(BATCH, SEQ), acc)
        step(w0, resident).block_until_ready()
        t = time.perf_counter()
        for _ in range(5):
            step(w0, resident).block_until_ready()
        step_ms = (time.perf_counter() - t) / 5 * 1e3

        def on_device(n):
            w, t = w0, time.perf_counter()
            for _ in range(n):
                w = step(w, resident)
            w.block_until_ready()
            return n / (time.perf_counter() - t)

        def kit(n):
            w, t = w0, time.perf_counter()
            with datasets.batches(tokens, BATCH, SEQ, device=acc, prefetch=2, steps=n) as it:
                for b in it:
                    w = step(w, b)
            w.block_until_ready()
            return n / (time.perf_counter() - t)

        def nanogpt(n):  # get_batch as nanoGPT writes it, then device_put
            rng, w, t = np.random.default_rng(0), w0, time.perf_counter()
            for _ in range(n):
                ix = rng.integers(0, len(tokens) - SEQ, BATCH)
                batch = np.stack([tokens[i:i + SEQ] for i in ix]).astype(np.int64)
                w = step(w, jax.device_put(batch, acc))
            w.block_until_ready()
            return n / (time.perf_counter() - t)

        rates = {"on_device": [], "kit": [], "nanogpt": [], "on_device_again": []}
        for _ in range(args.rounds):  # resident, kit, nanoGPT, resident again (A/A control)
            for name, loop in (("on_device", on_device), ("kit", kit), ("nanogpt", nanogpt),
                               ("on_device_again", on_device)):
                rates[name].append(loop(args.steps))
    base = [(a * b) ** 0.5 for a, b in zip(rates["on_device"], rates["on_device_again"],
                                           strict=True)]
    ratios = {k: median([r / d for r, d in zip(rates[k], base, strict=True)])
              for k in ("kit", "nanogpt")}
    ratios["a_a_control"] = median([b / a for a, b in zip(rates["on_device"],
                                                          rates["on_device_again"], strict=True)])
    try:
        import grain  # noqa: F401
        grain_note = "installed, not yet measured here"
    except ImportError:
        grain_note = "not installed (pip install grain): not measured"
    payload = {
        "device": devices.device_name(acc), "stand_in": acc.platform == "cpu",
        "step_ms": step_ms, "batch": [BATCH, SEQ], "steps_per_run": args.steps,
        "rounds": args.rounds, "median_steps_per_s": {k: median(v) for k, v in rates.items()},
        "median_ratio_to_on_device": ratios, "grain": grain_note,
        "goal": {"ratio_at_least": GOAL, "step_ms_at_least": 20,
                 "met": ratios["kit"] >= GOAL and step_ms >= 20},
        "rates": rates,
    }
    out = write("accelerator_wait", payload)
    s = payload["median_steps_per_s"]
    print(f"step {step_ms:.1f} ms on {payload['device']}: on device {s['on_device']:.1f}/s, kit "
          f"{s['kit']:.1f}/s (x{ratios['kit']:.3f}), nanoGPT get_batch {s['nanogpt']:.1f}/s "
          f"(x{ratios['nanogpt']:.3f}); resident again x{ratios['a_a_control']:.3f}; "
          f"goal >= {GOAL}: "
          f"{'met' if payload['goal']['met'] else 'NOT met'}  -> {out}")
    return payload


if __name__ == "__main__":
    main()
