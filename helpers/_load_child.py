"""Child process for helpers.loading.measure: one load strategy, measured. Not for direct use.

Prints one JSON line with the measurement.
"""

import os
import sys
import time


def main() -> int:
    path, strategy = sys.argv[1], sys.argv[2]
    import jax

    jax.config.update("jax_num_cpu_devices", 2)  # stand-in roles when there is no GPU
    import numpy as np

    from helpers import _child, _jax_internals, devices, memory

    roles = devices.roles()
    acc = roles.accelerator
    jax.numpy.zeros(1).block_until_ready()
    start = memory.snapshot([acc])
    base_anon, base_file = start.host.anon or 0, start.host.file or 0
    t0 = time.perf_counter()
    with memory.track(interval=0.005, devices=[acc]) as trace:
        if strategy == "flax_ctx":
            from safetensors.flax import load_file

            with jax.default_device(roles.host):
                tokens = load_file(path)["tokens"]
            tokens.block_until_ready()
            after_load = memory.snapshot([acc]).devices[0].bytes_in_use
            checksum = int(jax.numpy.sum(tokens, dtype=jax.numpy.uint32))
            landed = ", ".join(_jax_internals.device_name(d) for d in tokens.devices())
        else:
            if strategy == "numpy_load":
                from safetensors.numpy import load_file

                tokens = load_file(path)["tokens"]
            elif strategy == "safe_open":
                from safetensors import safe_open

                with safe_open(path, framework="numpy") as f:
                    tokens = f.get_slice("tokens")[:]
            elif strategy == "memmap":
                from helpers.datasets import open_tokens

                tokens = open_tokens(path)
            else:
                raise SystemExit(f"unknown strategy {strategy!r}")
            after_load = memory.snapshot([acc]).devices[0].bytes_in_use
            checksum = int(np.sum(tokens, dtype=np.uint64) % 2**32)
            landed = "host (NumPy)"
    seconds = time.perf_counter() - t0
    anon = [a for a in trace.host_anon if isinstance(a, int)] or [base_anon]
    file = [f for f in trace.host_file if isinstance(f, int)] or [base_file]
    _child.answer({
        "strategy": strategy, "seconds": seconds,
        "peak_anon_bytes": max(anon) - base_anon, "peak_file_bytes": max(file) - base_file,
        "accelerator_bytes": after_load - start.devices[0].bytes_in_use,  # the load's own
        "file_bytes": os.path.getsize(path), "checksum": checksum,
        "landed_on": landed, "stand_in": roles.stand_in,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
