"""The largest batch that fits: bisection over compiles against sizing.largest_batch, side by side.

Goal (issue "Performance users feel", item 2): the same answer as the bisection (to its
granularity) in at most 3 compiles. Per budget, both run in one process, interleaved over rounds
(XLA's compile cache is cleared before each search, so every compile is paid); compiles and the
median wall time of each are recorded. The step is the kit's MLP SGD step
(``helpers.example_steps``), priced from shapes: nothing is allocated or run.

    python benchmarks/batch_search.py [--rounds 3] [--budgets "2 GiB,8 GiB"]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
from _common import median, write  # noqa: E402

from helpers import example_steps, preflight, sizing  # noqa: E402

BUDGETS = {"40 MiB": 40 * 2**20, "64 MiB": 64 * 2**20, "460.8 MiB": int(460.8 * 2**20),
           "2 GiB": 2 * 2**30, "8 GiB": 8 * 2**30}
MAX_BATCH = 1 << 20


def _step_args():
    params, x1, y1 = example_steps.mlp_sgd_step_args(scale=1, batch=1)
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)

    def make(batch):
        return (params, jax.ShapeDtypeStruct((batch, x1.shape[1]), x1.dtype),
                jax.ShapeDtypeStruct((batch, y1.shape[1]), y1.dtype))
    return make


def need(make, batch):
    return preflight.needed_bytes(example_steps.mlp_sgd_step, *make(batch))


def bisection(make, budget):
    """Double until it does not fit, then halve the gap: what notebook 09 does by hand."""
    compiles = 0

    def need(b):
        nonlocal compiles
        compiles += 1
        return preflight.needed_bytes(example_steps.mlp_sgd_step, *make(b))

    lo, hi = 0, 1
    while hi <= MAX_BATCH and need(hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= budget else (lo, mid)
    return lo, compiles


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budgets", metavar="NAMES",
                   help=f"only these budgets, comma-separated ({', '.join(BUDGETS)}): printed, "
                   "not recorded (a subset is not the benchmark's result)")
    args = p.parse_args(argv)
    chosen = BUDGETS
    if args.budgets:
        names = [n.strip() for n in args.budgets.split(",")]
        unknown = [n for n in names if n not in BUDGETS]
        if unknown:
            p.error(f"unknown budget(s) {unknown}; choose from {', '.join(BUDGETS)}")
        chosen = {n: BUDGETS[n] for n in names}
    make = _step_args()
    rows = {}
    for name, budget in chosen.items():
        times = {"bisection": [], "largest_batch": []}
        for _ in range(args.rounds):
            jax.clear_caches()
            t = time.perf_counter()
            exact, bisect_compiles = bisection(make, budget)
            times["bisection"].append(time.perf_counter() - t)
            jax.clear_caches()
            t = time.perf_counter()
            found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget,
                                         max_batch=MAX_BATCH)
            times["largest_batch"].append(time.perf_counter() - t)
        rows[name] = {"budget_bytes": budget, "bisection_batch": exact,
                      "bisection_compiles": bisect_compiles, "largest_batch": found.batch,
                      "largest_batch_compiles": found.compiles, "method": found.method,
                      "padded_to": found.padded_to, "unaligned_batch": found.unaligned_batch,
                      "same_answer": found.batch == exact,
                      "median_seconds": {k: median(v) for k, v in times.items()},
                      "seconds": times}
        print(f"{name:>10}: bisection {exact:,} in {bisect_compiles} compiles, largest_batch "
              f"{found.batch:,} in {found.compiles} ({found.method})", flush=True)  # kept if cut
        if found.batch != exact:  # which answer is the boundary: the need on both sides of each
            plans = {b: preflight.preflight_step(example_steps.mlp_sgd_step, *make(b))
                     for b in sorted({exact, exact + 1, found.batch, found.batch + 1})}
            rows[name]["needs_at_answers"] = {str(b): p.needed_bytes for b, p in plans.items()}
            print("            needs (target " + f"{budget:,} B): "
                  + ", ".join(f"{b:,}: {p.needed_bytes:,}" for b, p in plans.items()),
                  flush=True)
            for b, p in plans.items():  # where a jump between neighbours lives: the temporaries
                rows[name].setdefault("temporaries_at_answers", {})[str(b)] = {
                    "temp_bytes": p.temp_bytes, "largest": [
                        [t.op, t.dtype, list(t.shape), t.nbytes] for t in p.largest_temporaries]}
                print(f"            batch {b:,}: temporaries {p.temp_bytes:,} B, largest "
                      + "; ".join(f"{t.op} {t.dtype}{list(t.shape)} {t.nbytes:,}"
                                  for t in p.largest_temporaries), flush=True)
    met = all(r["same_answer"] and r["largest_batch_compiles"] <= 3 for r in rows.values())
    for r in rows.values():  # how the need grows at the answer: a line, a bend, a jump
        b = r["bisection_batch"]
        r["bytes_per_example_at_answer"] = need(make, b + 1) - need(make, b)
        r["bytes_per_example_far_above"] = need(make, MAX_BATCH) - need(make, MAX_BATCH - 1)
    payload = {"step": "helpers.example_steps.mlp_sgd_step (scale 1), from shapes",
               "rounds": args.rounds, "max_batch": MAX_BATCH,
               "goal": {"same_answer": True, "compiles_at_most": 3, "met": met,
                        "same_answer_everywhere": all(r["same_answer"] for r in rows.values())},
               "budgets": rows}
    path = write("batch_search", payload) if chosen is BUDGETS else "not recorded (--budgets)"
    for name, r in rows.items():
        s = r["median_seconds"]
        print(f"{name:>10} ({r['bytes_per_example_at_answer']:,} B/example at the answer, "
              f"{r['bytes_per_example_far_above']:,} far above): bisection "
              f"{r['bisection_batch']:,} in {r['bisection_compiles']} compiles, "
              f"{s['bisection']:.2f} s | largest_batch {r['largest_batch']:,} in "
              f"{r['largest_batch_compiles']} compiles, {s['largest_batch']:.2f} s")
    print(f"goal (same answer, <= 3 compiles, every budget): {'met' if met else 'NOT met'}"
          f"  -> {path}")
    return payload


if __name__ == "__main__":
    main()
