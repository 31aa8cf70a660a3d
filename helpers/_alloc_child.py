"""Child process for helpers.allocation: start JAX on the GPU, allocate, report. Not for direct use.

Prints one JSON line, then holds its memory until a line arrives on stdin (so several children
can be measured side by side on one GPU).
"""

import os
import sys

from helpers import _child, gpu
from helpers.errors import NoGpuError


def _held(before: int | None) -> tuple[int | None, str]:
    """What the driver says this process holds: its per-process figure, or (where the driver
    cannot match our PID, as in some containers) the card's used memory minus ``before``."""
    mine = gpu.process_used_bytes(os.getpid())
    if mine is not None:
        return mine, "nvidia-smi: this process"
    now = gpu.device_used_bytes()
    if now is None or before is None:
        return None, "unknown"
    return now - before, "nvidia-smi: whole card, change since this process started"


def main() -> int:
    setting, array_bytes = sys.argv[1], int(sys.argv[2])
    report = {"setting": setting, "ok": False}
    before = gpu.device_used_bytes()  # before JAX starts in this process
    try:
        import jax
        import jax.numpy as jnp

        if jax.default_backend() != "gpu":
            raise NoGpuError(f"JAX started on {jax.default_backend()!r}, not on a GPU")
        dev = jax.devices()[0]
        report["device_kind"] = dev.device_kind
        x = jnp.ones(array_bytes, jnp.uint8)
        x.block_until_ready()
        stats = dev.memory_stats() or {}
        report.update(
            ok=True, error=None,
            bytes_in_use=stats.get("bytes_in_use"),
            peak_bytes_in_use=stats.get("peak_bytes_in_use"),
            bytes_limit=stats.get("bytes_limit"),
            bytes_reserved=stats.get("bytes_reserved"), pool_bytes=stats.get("pool_bytes"))
        report["driver_used_bytes"], report["driver_used_source"] = _held(before)
    except Exception as err:  # reported, not raised: the parent shows it
        report["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        try:  # what the allocator says after the failure (bytes_limit vs pool_bytes)
            stats = jax.devices()[0].memory_stats() or {}
            report.update(bytes_limit=stats.get("bytes_limit"),
                          bytes_in_use=stats.get("bytes_in_use"),
                          pool_bytes=stats.get("pool_bytes"))
            report["driver_used_bytes"], report["driver_used_source"] = _held(before)
        except Exception:
            pass
    _child.answer(report)
    sys.stdin.readline()  # hold the memory until the parent says so
    return 0


if __name__ == "__main__":
    sys.exit(main())
