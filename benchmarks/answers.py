"""Answers come fast: the doctor against JAX's own environment report, and preflight of the
story's 19 GiB file from its header.

Goal (issue "Performance users feel", item 5):
- ``python -m helpers doctor`` within 1.5x the wall time of
  ``python -c "import jax; jax.print_environment_info()"`` (both fresh processes, interleaved
  rounds, medians); the doctor's report carries that text, so it can never be faster;
- ``preflight.preflight`` of a 19.09 GiB safetensors file in <= 50 ms: a sparse file of the
  story's size (10,248,871,837 uint16 tokens) whose header is real; the first call in a fresh
  process (imports and JAX's start included) and warm calls are both recorded, the warm median is
  judged, and the CLI's wall time is recorded beside them.

    python benchmarks/answers.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, write  # noqa: E402

from helpers import datasets  # noqa: E402

STORY_TOKENS = 10_248_871_837
GOAL_DOCTOR, GOAL_PREFLIGHT_S = 1.5, 0.050


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - t


def _story_file(folder: str) -> str:
    path = os.path.join(folder, "story.safetensors")
    head = datasets.encode_header({"tokens": {"dtype": "U16", "shape": [STORY_TOKENS],
                                              "data_offsets": [0, 2 * STORY_TOKENS]}})
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + 2 * STORY_TOKENS)  # sparse: 19.09 GiB long, a few KiB on disk
    return path


_IN_PROCESS = """
import json, sys, time
t = time.perf_counter()
from helpers import preflight
r = preflight.preflight(sys.argv[1])
first = time.perf_counter() - t
warm = []
for _ in range(21):
    t = time.perf_counter(); preflight.preflight(sys.argv[1]); warm.append(time.perf_counter() - t)
print(json.dumps({"first_s": first, "warm_s": sorted(warm)[10], "bytes": r.total_bytes}))
"""


def main(argv=None) -> dict:
    import json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    py = sys.executable
    doctor, envinfo, cli = [], [], []
    with tempfile.TemporaryDirectory(prefix="jdk-answers-") as folder:
        path = _story_file(folder)
        for _ in range(args.rounds):
            envinfo.append(_wall([py, "-c", "import jax; jax.print_environment_info()"]))
            doctor.append(_wall([py, "-m", "helpers", "doctor"]))
            cli.append(_wall([py, "-m", "helpers", "preflight", path, "--device", "cpu"]))
        out = subprocess.run([py, "-c", _IN_PROCESS, path], check=True, capture_output=True,
                             text=True, timeout=300)
    inproc = json.loads(out.stdout.strip().splitlines()[-1])
    ratio = median([d / e for d, e in zip(doctor, envinfo, strict=True)])
    payload = {
        "rounds": args.rounds,
        "doctor": {"median_s": median(doctor), "print_environment_info_median_s": median(envinfo),
                   "median_ratio": ratio, "goal_ratio_at_most": GOAL_DOCTOR,
                   "met": ratio <= GOAL_DOCTOR},
        "preflight": {"file_bytes": inproc["bytes"], "first_call_s": inproc["first_s"],
                      "warm_median_s": inproc["warm_s"], "cli_median_wall_s": median(cli),
                      "goal_s_at_most": GOAL_PREFLIGHT_S,
                      "met": inproc["warm_s"] <= GOAL_PREFLIGHT_S},
    }
    payload["goal"] = {"met": payload["doctor"]["met"] and payload["preflight"]["met"]}
    path = write("answers", payload)
    d, f = payload["doctor"], payload["preflight"]
    print(f"doctor {d['median_s']:.2f} s vs print_environment_info "
          f"{d['print_environment_info_median_s']:.2f} s: x{d['median_ratio']:.2f} "
          f"(goal <= {GOAL_DOCTOR}: {'met' if d['met'] else 'NOT met'})")
    print(f"preflight of {f['file_bytes'] / 2**30:.2f} GiB: warm "
          f"{f['warm_median_s'] * 1e3:.2f} ms, first call {f['first_call_s'] * 1e3:.0f} ms, "
          f"CLI {f['cli_median_wall_s']:.2f} s (goal <= {GOAL_PREFLIGHT_S * 1e3:.0f} ms: "
          f"{'met' if f['met'] else 'NOT met'})  -> {path}")
    return payload


if __name__ == "__main__":
    main()
