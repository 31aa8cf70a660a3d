"""Child process for helpers.oom.reproduce: the story's load, under a cap. Not for direct use.

Answers one JSON line (helpers._child). Run as `python -m helpers._oom_child`, in a fresh process.
"""

import argparse
import os
import resource
import sys
import traceback

from helpers import _child
from helpers._jax_internals import device_name
from helpers.errors import NoGpuError


def _vm_size() -> int:
    import psutil

    return int(psutil.Process().memory_info().vms)  # VmSize: the address space RLIMIT_AS caps


def _bytes_in_use(device) -> int:
    from helpers import memory

    return memory.snapshot([device]).devices[0].bytes_in_use


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--mode", choices=["gpu", "cpu"], required=True)
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--budget", type=int, default=0)
    a = p.parse_args()
    result = {"ok": False}
    try:
        import jax
        from safetensors.flax import load_file

        if a.mode == "gpu" and jax.default_backend() != "gpu":  # never a false "real GPU" label
            raise NoGpuError(f"JAX started on {jax.default_backend()!r}, not on a GPU; "
                               "the GPU run cannot happen here")
        accelerator = jax.devices()[0]  # the default device: GPU, or cpu:0 in the stand-in
        host = jax.devices("cpu")[0] if a.mode == "gpu" else jax.devices("cpu")[1]
        result["device"] = device_name(host if a.fixed else accelerator)
        jax.numpy.zeros(1).block_until_ready()  # start the backend and its threads first
        before = _bytes_in_use(accelerator)
        if a.fixed:
            result["attempt"] = (f"with jax.default_device({host!r}): "
                                 f"load_file({os.path.basename(a.path)!r})['tokens']")
        else:
            result["attempt"] = f"load_file({os.path.basename(a.path)!r})['tokens']"
        if a.mode == "cpu" and not a.fixed:
            # Stand-in for a small accelerator: room for safetensors' read (the file map and
            # a NumPy copy, 2 x file) plus `budget` bytes; JAX's device copy needs the file
            # size again, so it is JAX's allocation that fails.
            size = os.path.getsize(a.path)
            cap = _vm_size() + 2 * size + a.budget
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if a.fixed:
            with jax.default_device(host):
                tokens = load_file(a.path)["tokens"]
        else:
            tokens = load_file(a.path)["tokens"]
        tokens.block_until_ready()
        result.update(ok=True, landed_on=", ".join(device_name(d) for d in tokens.devices()),
                      accelerator_bytes_added=_bytes_in_use(accelerator) - before,
                      error_type=None, error_message=None)
    except BaseException as err:  # report every failure as data; never a hang
        result.update(ok=False, error_type=f"{type(err).__module__}.{type(err).__name__}",
                      error_message=str(err).strip().splitlines()[0][:500] if str(err) else "",
                      landed_on=None, accelerator_bytes_added=None)
        if not isinstance(err, Exception):
            traceback.print_exc()
    _child.answer(result)
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
