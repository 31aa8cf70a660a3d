"""Child process for helpers.allocation.plugin_options: jaxlib's GPU options for this
environment, computed without a GPU. Not for direct use; answers one JSON line."""

import sys

from helpers import _child, _jax_internals


def main() -> int:
    try:
        generate = _jax_internals.verify("generate_pjrt_gpu_plugin_options")
        _child.answer({"options": dict(generate())})
    except Exception as err:  # e.g. both memory-fraction variables set: jaxlib's ValueError
        _child.answer({"error": f"{type(err).__name__}: {err}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
