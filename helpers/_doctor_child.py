"""Child process for the doctor: probe JAX in this fresh process and answer the report as one
JSON line (helpers._child). Not for direct use: ``python -m helpers doctor`` runs it."""

import sys


def main() -> int:
    import jax  # noqa: F401  first, so a failing import raises JAX's own error here

    from helpers import _child, devices

    _child.answer(devices.probe().to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
