"""Child process for helpers.allocation: start JAX on the GPU, allocate, report. Not for direct use.

Prints one JSON line, then holds its memory until a line arrives on stdin (so several children
can be measured side by side on one GPU).
"""

import json
import os
import sys

from helpers import gpu


def main() -> int:
    setting, array_bytes = sys.argv[1], int(sys.argv[2])
    report = {"setting": setting, "ok": False}
    try:
        import jax
        import jax.numpy as jnp

        if jax.default_backend() != "gpu":
            raise RuntimeError(f"JAX started on {jax.default_backend()!r}, not on a GPU")
        dev = jax.devices()[0]
        x = jnp.ones(array_bytes, jnp.uint8)
        x.block_until_ready()
        stats = dev.memory_stats() or {}
        report.update(
            ok=True, error=None, device_kind=dev.device_kind,
            bytes_in_use=stats.get("bytes_in_use"),
            peak_bytes_in_use=stats.get("peak_bytes_in_use"),
            bytes_limit=stats.get("bytes_limit"),
            bytes_reserved=stats.get("bytes_reserved", stats.get("pool_bytes")),
            driver_used_bytes=gpu.process_used_bytes(os.getpid()))
    except Exception as err:  # reported, not raised: the parent shows it
        report["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    print(json.dumps(report), flush=True)
    sys.stdin.readline()  # hold the memory until the parent says so
    return 0


if __name__ == "__main__":
    sys.exit(main())
