"""Feeding the accelerator: random (batch, seq_len) token windows, naive vs the kit vs the bound.

For each batch size (64 KiB … 64 MiB of uint16 tokens), interleaved for --rounds rounds in one
process, each variant moves --mib MiB of batches (at least 3 batches) to the accelerator:

- naive: per-window slices, np.stack, jax.device_put (the obvious loop);
- kit:   helpers.datasets.batches(..., prefetch=2) (vectorised gather, aligned buffer, prefetch);
- kit_no_prefetch: the same with prefetch=0 (gather and transfer one after the other);
- bound: on CPU one large host copy of the same number of bytes, from a random place in the
  file, into a fresh buffer (what producing any new batch costs at least); on a GPU one large
  device_put from pinned host memory.

Reports medians of GB/s and the median of the per-round ratio kit/bound. Goals: >= 50% of the
bound on CPU for batches >= 4 MiB; >= 80% of the pinned bound on GPU. Writes
benchmarks/results/feeding.json and .png, naming the machine.

    python benchmarks/feeding.py [--file-size 1GiB] [--rounds 5] [--mib 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write  # noqa: E402
from _feeding_variants import VARIANTS, time_variant  # noqa: E402

SIZES = [64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20]
SEQ_LEN = 1024


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file-size", default="1GiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mib", type=int, default=256, help="MiB moved per variant per round")
    args = p.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    import numpy as np

    from helpers import datasets, devices, machine, plotting
    from helpers.units import format_bytes

    roles = devices.roles()
    device = roles.accelerator
    variants = VARIANTS
    with tempfile.TemporaryDirectory(prefix="jdk-feed-") as tmp:
        path = Path(tmp) / "train.safetensors"
        datasets.write_tokens(path, size=args.file_size, progress=False)
        tokens = datasets.open_tokens(path)
        int(np.sum(tokens, dtype=np.uint64))  # read once: every variant starts page-cache warm
        rows = []
        for size in SIZES:
            batch = size // (2 * SEQ_LEN)
            n = max(3, args.mib * 2**20 // size)
            gbps = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in variants:
                    secs = time_variant(v, tokens, batch, SEQ_LEN, device=device, n=n, seed=r)
                    gbps[v].append(n * size / secs / 1e9)
            row = {"batch_bytes": size, "batch": batch, "seq_len": SEQ_LEN, "batches": n,
                   "gbps": {v: statistics.median(x) for v, x in gbps.items()},
                   "kit_over_bound": statistics.median(
                       k / b for k, b in zip(gbps["kit"], gbps["bound"], strict=True)),
                   "kit_over_naive": statistics.median(
                       k / b for k, b in zip(gbps["kit"], gbps["naive"], strict=True)),
                   "runs": gbps}
            rows.append(row)
            g = row["gbps"]
            print(f"{format_bytes(size):>10}: naive {g['naive']:6.2f}  kit {g['kit']:6.2f}  "
                  f"kit(no prefetch) {g['kit_no_prefetch']:6.2f}  bound {g['bound']:6.2f} GB/s"
                  f"  kit/bound {row['kit_over_bound']:.2f}  kit/naive {row['kit_over_naive']:.1f}")
    goal = 0.5 if roles.stand_in else 0.8
    judged = [r for r in rows if r["batch_bytes"] >= 4 * 2**20]
    payload = {
        "rounds": args.rounds, "file_bytes": int(tokens.nbytes), "stand_in": roles.stand_in,
        "device": str(device), "machine_name": machine.name(),
        "bound": ("one host copy from a random file offset into a fresh buffer" if roles.stand_in
                  else "one device_put from pinned host memory"),
        "goal": {"kit_over_bound_at_least": goal, "for_batches_from_bytes": 4 * 2**20,
                 "met": all(r["kit_over_bound"] >= goal for r in judged)},
        "rows": rows,
    }
    out = write("feeding", payload, fig=plotting.feeding(rows, title=(
        f"Feeding {device}" + (" (stand-in)" if roles.stand_in else ""))))
    print(f"goal kit/bound >= {goal:.0%} for batches >= 4 MiB: "
          f"{'met' if payload['goal']['met'] else 'NOT met'}  -> {out}")
    return payload


if __name__ == "__main__":
    main()
