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

from _common import write  # noqa: E402

from helpers import datasets, loading, plotting, render  # noqa: E402
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
    rows = loading.medians(runs)
    checksums = {m.checksum for m in runs}
    ratios = loading.ratios(runs)
    payload = {"file_bytes": rows[0]["file_bytes"], "repeats": args.repeats,
               "same_checksum_everywhere": len(checksums) == 1, "medians": rows,
               "ratios": ratios, "runs": [m.to_dict() for m in runs]}
    out = write("load_strategies", payload, fig=plotting.load_strategy_costs(rows))
    print(f"file {format_bytes(payload['file_bytes'])}, {args.repeats} interleaved rounds, "
          "medians:")
    print(render.load_table(rows))
    print(f"flax/memmap: time x{ratios['time_flax_ctx_over_memmap']:.1f}, peak anonymous memory "
          f"{ratios['peak_anon_flax_ctx_over_file']:.1f}x the file.  -> {out}")
    return payload


if __name__ == "__main__":
    main()
