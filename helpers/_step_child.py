"""Child process for helpers.step_measure.measure_example: one example step, predicted and
measured in a fresh process. Not for direct use.

argv: name scale donate(0/1) [batch]. Prints one JSON line: {"preflight": ..., "measurement": ...}.
"""

import sys


def main() -> int:
    name, scale, donate = sys.argv[1], int(sys.argv[2]), bool(int(sys.argv[3]))
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else None
    import jax

    from helpers import _child
    from helpers.example_steps import EXAMPLES
    from helpers.step_measure import measure_step
    from helpers.step_preflight import preflight_step

    fn, make_args = EXAMPLES[name]
    device = jax.devices()[0]  # the default backend's first device: the GPU when there is one
    host_args = make_args(scale) if batch is None else make_args(scale, batch=batch)
    args = jax.block_until_ready(jax.device_put(host_args, device))
    donated = (0,) if donate else ()
    prediction = preflight_step(fn, *args, device=device, donate_argnums=donated)
    measurement = measure_step(fn, *args, device=device, donate_argnums=donated)
    _child.answer({"preflight": prediction.to_dict(), "measurement": measurement.to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
