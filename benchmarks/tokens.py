"""make-tokens against the disk: does writing a synthetic token file run at disk speed?

Goal (issue 17): ``datasets.write_tokens`` (what ``python -m helpers make-tokens`` runs) writes
at >= 80% of this machine's sequential write speed, measured side by side: a dd-like write of the
same number of bytes, in the same chunk size, to the same folder (``open``, ``write`` in 8 MiB
pieces from one ready buffer, ``fsync``, ``close``: like ``dd bs=8M conv=fsync``). Both are timed
until the data is on the disk (make-tokens' file is fsynced after it returns): without that,
a write "finishes" in the page cache at memory speed or at disk speed depending on how many
dirty pages the OS already holds, and the ratio measures the OS, not the kit. Rounds alternate
dd-like and make-tokens; the reported ratio is the median of the per-round ratios. Also
reported: generating the tokens with no file at all, the ceiling a faster disk could not lift.

    python benchmarks/tokens.py [--size 512MiB] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, write  # noqa: E402

GOAL = 0.80


def dd_like(path: Path, nbytes: int, chunk: int) -> float:
    buf = memoryview(bytes(chunk))
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(buf[:min(chunk, left)])
            left -= chunk
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t


def make_tokens(path: Path, nbytes: int) -> float:
    from helpers import datasets

    t = time.perf_counter()
    datasets.write_tokens(path, nbytes // 2, progress=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def generate_only(nbytes: int) -> float:
    import numpy as np

    from helpers import datasets

    t = time.perf_counter()
    for _ in datasets._chunks(nbytes // 2, datasets.GPT2_VOCAB, 0, _table(np, datasets)):
        pass
    return time.perf_counter() - t


def _table(np, datasets):
    perm = np.random.default_rng([0, 0xC0FFEE]).permutation(datasets.GPT2_VOCAB)
    return perm.astype(np.uint16)[datasets._rank_table(datasets.GPT2_VOCAB)]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="512MiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=None, help="folder to write in (default: a temporary one)")
    args = p.parse_args(argv)

    from helpers import datasets
    from helpers.units import parse_size

    nbytes = parse_size(args.size)
    runs = {"dd_like": [], "make_tokens": [], "generate_only": []}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="jdk-tokens-", dir=args.dir) as tmp:
        folder = Path(tmp)
        for r in range(args.rounds):
            order = ("dd_like", "make_tokens") if r % 2 == 0 else ("make_tokens", "dd_like")
            secs = {}
            for which in order:
                target = folder / f"{which}.bin"
                secs[which] = (dd_like(target, nbytes, 2 * datasets.CHUNK_TOKENS)
                               if which == "dd_like" else make_tokens(target, nbytes))
                os.unlink(target)
            secs["generate_only"] = generate_only(nbytes)
            for k, v in secs.items():
                runs[k].append(nbytes / v / 1e9)
            ratios.append(secs["dd_like"] / secs["make_tokens"])
            print(f"round {r}: dd-like {runs['dd_like'][-1]:.2f} GB/s, make-tokens "
                  f"{runs['make_tokens'][-1]:.2f} GB/s, generate only "
                  f"{runs['generate_only'][-1]:.2f} GB/s, ratio {ratios[-1]:.2f}")
    ratio = median(ratios)
    payload = {
        "bytes": nbytes, "rounds": args.rounds, "chunk_bytes": 2 * datasets.CHUNK_TOKENS,
        "gbps_median": {k: median(v) for k, v in runs.items()}, "runs_gbps": runs,
        "ratio_make_tokens_over_dd": ratio, "ratios": ratios,
        "bound": "dd-like write of the same bytes, same chunk size, same folder, fsync at the end",
        "goal": {"ratio_at_least": GOAL, "met": ratio >= GOAL},
    }
    out = write("tokens", payload)
    print(f"make-tokens / dd-like = {ratio:.2f} (goal >= {GOAL:.0%}: "
          f"{'met' if ratio >= GOAL else 'NOT met'}) -> {out}")
    return payload


if __name__ == "__main__":
    main()
