"""JAX Device Kit: where did my array go, and why is my GPU out of memory?

One module per question (the map, with every module in one line: ``helpers/README.md``):
``devices`` and ``placement`` (backends, devices, where an array sits), ``doctor`` (the report
that never crashes), ``settings`` (the environment variables), ``memory`` (bytes now and over
time), ``transfers`` (the copies a block made), ``preflight`` and ``oom`` (will it fit; the OOM
reproduced), ``datasets``, ``feeding`` and ``loading`` (the token file), ``allocation`` and
``gpu`` (the GPU allocator and driver), ``report``, ``render`` and ``plotting`` (text, HTML,
figures), ``errors`` (one exception tree, ``KitError``). Capture returns plain records;
rendering is separate. The CLI is ``python -m helpers``.

Importing ``helpers`` does not start any JAX backend, so it is safe in a notebook's first cell
before ``jax.config.update("jax_num_cpu_devices", ...)``.
"""

__version__ = "0.1.0"
