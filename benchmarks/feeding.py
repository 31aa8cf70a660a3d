"""Feeding the accelerator: random (batch, seq_len) token windows, naive vs the kit vs the bound.

For each batch size (64 KiB … 64 MiB of uint16 tokens), interleaved for --rounds rounds in one
process, each variant moves --mib MiB of batches (at least 3 batches) to the accelerator:

- naive: per-window slices, np.stack, jax.device_put (the obvious loop);
- kit:   helpers.datasets.batches(..., prefetch=2): the compiled gather (XLA, one copy per byte)
  up to 16 MiB, the NumPy kernel above, prefetched;
- kit_no_prefetch: the same with prefetch=0 (gather and transfer one after the other);
- kit_numpy: the kit held to its NumPy kernel (fancy indexing on threads: the previous approach);
- bound: on CPU one large host copy of the same number of bytes, from a random place in the
  file, into a fresh buffer (what producing any new batch costs at least); on a GPU one large
  device_put from pinned host memory;
- bound_reused: on CPU the same copy into one reused buffer (a higher bar: no fresh pages).

Reports medians of GB/s and the medians of the per-round ratios kit/bound, kit/bound_reused and
kit/naive. Goal (issue "Performance", goal 1), on CPU: kit/bound >= 0.5 for batches of 4–64 MiB,
kit/naive >= 4 there, and kit/naive >= 1 at 64 KiB; on a GPU: kit/bound >= 0.8 for batches
>= 4 MiB. Writes benchmarks/results/feeding.json and .png, naming the machine and its load.

    python benchmarks/feeding.py [--file-size 1GiB] [--rounds 7] [--mib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write  # noqa: E402
from _feeding_variants import VARIANTS, time_variant  # noqa: E402

SIZES = [64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20]
SEQ_LEN = 1024


def c_ceiling(path: Path, tokens) -> dict:
    """feeding_ceiling.c, compiled here and run on the same file: the best a plain C memcpy
    gather of the same windows reaches against its own contiguous copy (4 and 16 MiB batches;
    at 64 MiB C's malloc maps fresh 4 KiB pages per batch, so its bound is not NumPy's)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return {"measured": False, "why": "no C compiler"}
    exe = path.with_name("ceiling")
    subprocess.run([cc, "-O2", "-pthread", "-o", str(exe),
                    str(Path(__file__).with_name("feeding_ceiling.c"))], check=True)
    proc = subprocess.run([str(exe), str(path), str(tokens.offset), "4", "16"], check=True,
                          capture_output=True, text=True)
    out = json.loads(proc.stdout)
    for r in out["rows"]:
        print(f"C ceiling {r['batch_bytes'] >> 20} MiB: bound {r['gbps']['bound']:.2f}, windows "
              f"on 1 / 2 threads {r['gbps']['windows_1_thread']:.2f} / "
              f"{r['gbps']['windows_2_threads']:.2f} GB/s: ratios "
              f"{r['windows_1_thread_over_bound']:.2f} / {r['windows_2_threads_over_bound']:.2f}")
    return {"measured": True, "compiler": cc, **out}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file-size", default="1GiB")
    p.add_argument("--rounds", type=int, default=7)
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
            time_variant("kit", tokens, batch, SEQ_LEN, device=device, n=1)  # compile, unclocked
            for r in range(args.rounds):
                for v in variants:
                    secs = time_variant(v, tokens, batch, SEQ_LEN, device=device, n=n, seed=r)
                    gbps[v].append(n * size / secs / 1e9)
            row = {"batch_bytes": size, "batch": batch, "seq_len": SEQ_LEN, "batches": n,
                   "gbps": {v: statistics.median(x) for v, x in gbps.items()},
                   **{f"kit_over_{other}": statistics.median(
                       k / b for k, b in zip(gbps["kit"], gbps[other], strict=True))
                      for other in ("bound", "bound_reused", "naive", "kit_numpy")},
                   "runs": gbps}
            rows.append(row)
            g = row["gbps"]
            print(f"{format_bytes(size):>10}: " + "  ".join(f"{v} {g[v]:.2f}" for v in variants)
                  + f" GB/s  kit/bound {row['kit_over_bound']:.2f}  kit/bound_reused "
                  f"{row['kit_over_bound_reused']:.2f}  kit/naive {row['kit_over_naive']:.1f}"
                  f"  kit/kit_numpy {row['kit_over_kit_numpy']:.2f}", flush=True)
        ceiling = c_ceiling(path, tokens) if roles.stand_in else None
    load = os.getloadavg()
    goal = 0.5 if roles.stand_in else 0.8
    judged = [r for r in rows if 4 * 2**20 <= r["batch_bytes"] <= 64 * 2**20]
    smallest = min(rows, key=lambda r: r["batch_bytes"])
    checks = {"kit_over_bound": all(r["kit_over_bound"] >= goal for r in judged)}
    if roles.stand_in:
        checks |= {"kit_over_naive_at_least_4": all(r["kit_over_naive"] >= 4 for r in judged),
                   "not_slower_than_naive_at_64KiB": smallest["kit_over_naive"] >= 1}
    payload = {
        "rounds": args.rounds, "file_bytes": int(tokens.nbytes), "stand_in": roles.stand_in,
        "device": str(device), "machine_name": machine.name(),
        "load_average_at_end": [round(x, 2) for x in load],
        "bound": ("one host copy from a random file offset into a fresh buffer" if roles.stand_in
                  else "one device_put from pinned host memory"),
        "goal": {"kit_over_bound_at_least": goal, "for_batches_from_bytes": 4 * 2**20,
                 "to_bytes": 64 * 2**20, "checks": checks, "met": all(checks.values())},
        "rows": rows,
        "c_ceiling": ceiling,
    }
    out = write("feeding", payload, fig=plotting.feeding_rates(rows, title=(
        f"Feeding {device}" + (" (stand-in)" if roles.stand_in else ""))))
    print(f"goal {checks}: {'met' if payload['goal']['met'] else 'NOT met'}; load {load}  -> {out}")
    return payload


if __name__ == "__main__":
    main()
