"""JAX Device Kit: where did my array go, and why is my GPU out of memory?

Rooms (one module per question): ``devices`` (backends, devices, placement), ``settings``
(the environment variables that govern placement and allocation), ``report`` (text/HTML/JSON
rendering), ``units`` (bytes <-> "1.5 GiB"). The CLI is ``python -m helpers``.

Importing ``helpers`` does not start any JAX backend, so it is safe in a notebook's first cell
before ``jax.config.update("jax_num_cpu_devices", ...)``.
"""

__version__ = "0.1.0"
