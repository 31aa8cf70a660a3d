"""How much does memory.track(interval=0.01) slow a compute-bound JAX loop? Goal: <= 2% at 100 Hz.

Interleaved runs in one process: plain, tracked, tracked, plain, ... (the order alternates so
drift and warm-up hit both sides alike). Reported per workload: the median of per-pair ratios
tracked/plain, each side's median time, and the sampling rate the tracker actually achieved.

Two compute-bound workloads, because the sampler thread needs the GIL:
- "large ops": a few big matmuls per run. JAX dispatches asynchronously and waits without
  the GIL, so the sampler runs at its full rate.
- "small ops": many ~ms-sized computations in a tight Python loop. On the CPU backend the
  dispatching thread keeps the GIL most of the time, and the sampler gets far fewer samples
  than asked for; its overhead is then measured at the rate it achieved.

    python benchmarks/sampler_overhead.py [--pairs 31] [--seconds 0.25]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _common import median, write  # noqa: E402

from helpers import memory  # noqa: E402

GOAL = 1.02
WORKLOADS = {"large ops": 1536, "small ops": 256}  # square matrix size per step


def _make_step():
    @jax.jit
    def step(x):
        for _ in range(4):
            x = jnp.tanh(x @ x) * 0.5
        return x
    return step


def _run(step, x, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        x = step(x)
    x.block_until_ready()
    return time.perf_counter() - t


def _calibrate(step, x, seconds: float) -> int:
    step(x).block_until_ready()
    per = _run(step, x, 3) / 3
    return max(3, round(seconds / per))


def measure(size: int, pairs: int, seconds: float, interval: float) -> dict:
    step = _make_step()
    x = jnp.ones((size, size), jnp.float32) * 0.01
    iters = _calibrate(step, x, seconds)
    plain, tracked, ratios, rates = [], [], [], []
    for i in range(pairs):
        pair = {}
        for which in (("plain", "tracked") if i % 2 == 0 else ("tracked", "plain")):
            if which == "plain":
                pair["plain"] = _run(step, x, iters)
            else:
                with memory.track(interval=interval) as trace:
                    pair["tracked"] = _run(step, x, iters)
                rates.append(trace.achieved_hz)
        plain.append(pair["plain"])
        tracked.append(pair["tracked"])
        ratios.append(pair["tracked"] / pair["plain"])
    return {
        "matrix": size, "iterations_per_run": iters, "pairs": pairs,
        "median_plain_s": median(plain), "median_tracked_s": median(tracked),
        "median_ratio": median(ratios), "median_achieved_hz": median(rates),
        "ratios": ratios,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=31)
    p.add_argument("--seconds", type=float, default=0.25, help="target seconds per run")
    p.add_argument("--interval", type=float, default=0.01)
    args = p.parse_args(argv)
    results = {name: measure(size, args.pairs, args.seconds, args.interval)
               for name, size in WORKLOADS.items()}
    at_rate = results["large ops"]
    payload = {
        "interval_s": args.interval, "requested_hz": 1 / args.interval, "goal_ratio": GOAL,
        "workloads": results,
        "meets_goal_at_full_rate": at_rate["median_ratio"] <= GOAL
        and at_rate["median_achieved_hz"] >= 0.8 / args.interval,
    }
    path = write("sampler_overhead", payload)
    for name, r in results.items():
        print(f"{name:>9}: median ratio tracked/plain {r['median_ratio']:.4f} "
              f"({r['median_plain_s']:.3f} s vs {r['median_tracked_s']:.3f} s, "
              f"{args.pairs} interleaved pairs); sampler achieved "
              f"{r['median_achieved_hz']:.0f} Hz of {1 / args.interval:.0f} requested")
    print(f"goal <= {GOAL} at full rate: "
          f"{'met' if payload['meets_goal_at_full_rate'] else 'NOT met'}.  -> {path}")
    return payload


if __name__ == "__main__":
    main()
