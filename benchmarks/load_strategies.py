"""Time and peak host memory of four ways to load a token file (see helpers.loading).

Each strategy runs in its own fresh child process; strategies are interleaved round-robin for
--repeats rounds, and the median per strategy is reported. Writes
benchmarks/results/load_strategies.json and .png, naming the machine.

    python benchmarks/load_strategies.py [--size 512MiB] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, write  # noqa: E402

from helpers import datasets, loading, plotting  # noqa: E402
from helpers.units import format_bytes  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="512MiB")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jdk-bench-") as tmp:
        path = Path(tmp) / "train.safetensors"
        datasets.write_tokens(path, size=args.size, progress=False)
        runs = loading.measure_all(path, repeats=args.repeats)
    by = {}
    for m in runs:
        by.setdefault(m.strategy, []).append(m)
    rows = []
    for name, ms in by.items():
        rows.append({
            "strategy": name, "description": ms[0].description,
            "seconds": median(m.seconds for m in ms),
            "peak_anon_bytes": int(median(m.peak_anon_bytes for m in ms)),
            "peak_file_bytes": int(median(m.peak_file_bytes for m in ms)),
            "accelerator_bytes": int(median(m.accelerator_bytes for m in ms)),
            "file_bytes": ms[0].file_bytes, "landed_on": ms[0].landed_on,
            "stand_in": ms[0].stand_in, "runs": len(ms),
        })
    checksums = {m.checksum for m in runs}
    flax, mm = by["flax_ctx"], by["memmap"]
    ratios = {
        "time_flax_over_memmap": median(
            a.seconds / b.seconds for a, b in zip(flax, mm, strict=True)),
        "peak_anon_flax_over_memmap_total": median(
            a.peak_anon_bytes / max(1, b.peak_anon_bytes + b.peak_file_bytes)
            for a, b in zip(flax, mm, strict=True)),
        "peak_anon_flax_over_file": median(a.peak_anon_bytes / a.file_bytes for a in flax),
    }
    payload = {"file_bytes": rows[0]["file_bytes"], "repeats": args.repeats,
               "same_checksum_everywhere": len(checksums) == 1, "medians": rows,
               "ratios": ratios, "runs": [m.to_dict() for m in runs]}
    out = write("load_strategies", payload, fig=plotting.load_strategies(rows))
    print(f"file {format_bytes(payload['file_bytes'])}, {args.repeats} interleaved rounds, "
          "medians:")
    for r in rows:
        print(f"  {r['strategy']:<11} {r['seconds']:7.3f} s  "
              f"anon +{format_bytes(r['peak_anon_bytes']):>11}  "
              f"file +{format_bytes(r['peak_file_bytes']):>11}  "
              f"accelerator +{format_bytes(r['accelerator_bytes'])}")
    print(f"flax/memmap: time x{ratios['time_flax_over_memmap']:.1f}, peak anonymous memory "
          f"{ratios['peak_anon_flax_over_file']:.1f}x the file.  -> {out}")
    return payload


if __name__ == "__main__":
    main()
