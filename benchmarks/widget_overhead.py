"""The live MemoryMonitor's cost to the code it watches: drawing in the kernel (before) against
sending numbers for the browser to draw (after).

Goal (issue "Meet users where they already look"): with the widget running, a loop of small
jitted operations is slowed by at most 2%. The loop is the worst case for a kernel-side widget:
on the CPU backend the dispatching thread holds the GIL nearly all the time, and the widget's
thread competes for it. Each round runs, interleaved in one process:

- plain, **png** (what MemoryMonitor did before: every refresh a ``memory.snapshot``, then a
  matplotlib timeline of the samples saved as PNG in the kernel), plain,
- **numbers** (MemoryMonitor now: every refresh a snapshot, sent as plain numbers; the browser
  draws), plain.

Each widget run is compared with the geometric mean of the plain runs on either side (drift
cancels), and the plain runs with each other (A/A: this machine's noise). Medians over rounds,
with 95% bootstrap intervals. Without a browser the widget's messages go nowhere, so this
measures the kernel's side, which is the side that slows your code.

    python benchmarks/widget_overhead.py [--rounds 15] [--seconds 1.5] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _common import median, write  # noqa: E402

from helpers import memory, plotting  # noqa: E402
from helpers.widgets import MemoryMonitor  # noqa: E402

GOAL = 1.02


@jax.jit
def _step(x):
    for _ in range(4):
        x = jnp.tanh(x @ x) * 0.5
    return x


def _run(x, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        x = _step(x)
    x.block_until_ready()
    return time.perf_counter() - t


class _PngRefresher:
    """The widget as it was: a thread that snapshots and draws a PNG timeline every refresh."""

    def __init__(self, interval: float):
        self.interval, self.samples, self.stop = interval, deque(maxlen=240), threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.stop.is_set():
            self.samples.append(memory.snapshot())
            if len(self.samples) >= 2:
                fig = plotting.memory_timeline(memory.samples_to_dict(self.samples), title="Live")
                fig.set_size_inches(6.4, 2.6)
                fig.savefig(io.BytesIO(), format="png", dpi=80)
            self.stop.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _ci95(values, resamples=2000):
    rng = random.Random(0)
    meds = sorted(median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--seconds", type=float, default=1.5, help="target seconds per run")
    p.add_argument("--interval", type=float, default=0.5, help="the widget's refresh interval")
    args = p.parse_args(argv)
    x = jnp.ones((256, 256), jnp.float32) * 0.01
    _run(x, 3)
    iters = max(3, round(args.seconds / (_run(x, 10) / 10)))
    ratios = {"png": [], "numbers": []}
    noise, refreshes = [], {"png": [], "numbers": []}
    for _ in range(args.rounds):
        p1 = _run(x, iters)
        with _PngRefresher(args.interval) as old:
            png = _run(x, iters)
        p2 = _run(x, iters)
        monitor = MemoryMonitor(interval=args.interval)
        monitor.start()
        numbers = _run(x, iters)
        monitor.close()
        p3 = _run(x, iters)
        ratios["png"].append(png / (p1 * p2) ** 0.5)
        ratios["numbers"].append(numbers / (p2 * p3) ** 0.5)
        noise.append(p3 / p1)
        refreshes["png"].append(len(old.samples))
        refreshes["numbers"].append(monitor.updates)
    result = {name: {"median_ratio": median(r), "ratio_ci95": _ci95(r), "ratios": r,
                     "median_refreshes_per_run": median(refreshes[name])}
              for name, r in ratios.items()}
    payload = {
        "workload": "a loop of small jitted ops (4 x 256x256 matmul + tanh per step)",
        "iterations_per_run": iters, "rounds": args.rounds, "interval_s": args.interval,
        "noise_median_ratio": median(noise), "noise_ci95": _ci95(noise),
        "goal": {"ratio_at_most": GOAL, "judged": "numbers",
                 "met": result["numbers"]["median_ratio"] <= GOAL},
        "variants": result,
    }
    path = write("widget_overhead", payload)
    for name, r in result.items():
        lo, hi = r["ratio_ci95"]
        print(f"{name:>8}: widget/plain {r['median_ratio']:.4f} (95% CI {lo:.3f}-{hi:.3f}), "
              f"{r['median_refreshes_per_run']:.0f} refreshes per run")
    nlo, nhi = payload["noise_ci95"]
    print(f"plain/plain {payload['noise_median_ratio']:.4f} (CI {nlo:.3f}-{nhi:.3f}); goal "
          f"<= {GOAL} with the widget running: "
          f"{'met' if payload['goal']['met'] else 'NOT met'}  -> {path}")
    return payload


if __name__ == "__main__":
    main()
